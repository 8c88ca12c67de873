//! Property tests searching for violations of the sensitivities the mechanisms use,
//! on the exact integer queries the protocol releases.

use super::*;
use crate::encoding::FixedPoint;
use num_bigint::{BigInt, BigUint};
use num_traits::{ToPrimitive, Zero};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

const FP: FixedPoint = FixedPoint {
    frac_bits: 10,
    row_norm_bound: 1.0,
};

/// Released statistics of a table of encoded rows, exactly.
struct Released {
    /// N S~ = N R~ - v v^T, full matrix.
    ns: Vec<Vec<i128>>,
    r: Vec<Vec<i128>>,
    v: Vec<i128>,
}

fn released(rows: &[Vec<i64>]) -> Released {
    let m = rows[0].len();
    let n = rows.len() as i128;
    let mut r = vec![vec![0i128; m]; m];
    let mut v = vec![0i128; m];
    for x in rows {
        for i in 0..m {
            v[i] += x[i] as i128;
            for j in 0..m {
                r[i][j] += x[i] as i128 * x[j] as i128;
            }
        }
    }
    let ns = (0..m)
        .map(|i| (0..m).map(|j| n * r[i][j] - v[i] * v[j]).collect())
        .collect();
    Released { ns, r, v }
}

fn clip_encode(row: &[f64]) -> Vec<i64> {
    let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
    let c = FP.row_norm_bound;
    let clipped: Vec<f64> = if norm > c {
        row.iter().map(|x| x * c / norm).collect()
    } else {
        row.to_vec()
    };
    FP.encode_row(&clipped)
}

fn check_pair(a: &[Vec<i64>], b: &[Vec<i64>]) -> Result<(), TestCaseError> {
    let m = a[0].len();
    let n = a.len() as f64;
    let sens = Sensitivity::new(FP.norm_bound_int(), m);
    let (ra, rb) = (released(a), released(b));
    let (mut f2, mut l1, mut tr) = (0f64, 0f64, 0f64);
    let (mut rf2, mut rl1, mut rtr) = (0f64, 0f64, 0f64);
    for i in 0..m {
        for j in 0..m {
            let d = (ra.ns[i][j] - rb.ns[i][j]) as f64;
            let dr = (ra.r[i][j] - rb.r[i][j]) as f64;
            f2 += d * d;
            rf2 += dr * dr;
            if j >= i {
                l1 += d.abs();
                rl1 += dr.abs();
            }
        }
        tr += (ra.ns[i][i] - rb.ns[i][i]) as f64;
        rtr += (ra.r[i][i] - rb.r[i][i]) as f64;
    }
    let dv: Vec<f64> = (0..m).map(|i| (ra.v[i] - rb.v[i]) as f64).collect();
    let v2 = dv.iter().map(|x| x * x).sum::<f64>().sqrt();
    let v1 = dv.iter().map(|x| x.abs()).sum::<f64>();
    let tol = 1.0 + 1e-9;
    prop_assert!(
        f2.sqrt() <= n * sens.s_l2 * tol,
        "S L2 {} > {}",
        f2.sqrt(),
        n * sens.s_l2
    );
    prop_assert!(l1 <= n * sens.s_l1 * tol, "S L1 {} > {}", l1, n * sens.s_l1);
    prop_assert!(
        tr.abs() <= n * sens.s_trace * tol,
        "S trace {} > {}",
        tr,
        n * sens.s_trace
    );
    prop_assert!(rf2.sqrt() <= sens.r_l2 * tol);
    prop_assert!(rl1 <= sens.r_l1 * tol);
    prop_assert!(rtr.abs() <= sens.r_trace * tol);
    prop_assert!(v2 <= sens.v_l2 * tol);
    prop_assert!(v1 <= sens.v_l1 * tol);
    Ok(())
}

fn row_strategy(m: usize) -> impl Strategy<Value = Vec<f64>> {
    proptest::collection::vec(-1.5f64..1.5, m)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random neighbor pairs: replace row 0 of a random table.
    #[test]
    fn random_neighbors_respect_sensitivity(
        (rows, replacement) in (1usize..6, 2usize..7).prop_flat_map(|(m, n)| {
            (proptest::collection::vec(row_strategy(m), n), row_strategy(m))
        })
    ) {
        let a: Vec<Vec<i64>> = rows.iter().map(|r| clip_encode(r)).collect();
        let mut b = a.clone();
        b[0] = clip_encode(&replacement);
        check_pair(&a, &b)?;
    }

    /// Adversarial pairs: all other rows equal to a point m on the sphere, the
    /// replaced row and its replacement at angles around -m and m (the numerically
    /// worst cases sit there).
    #[test]
    fn adversarial_neighbors_respect_sensitivity(
        m_dir in row_strategy(3),
        x_dir in row_strategy(3),
        xp_dir in row_strategy(3),
        mix in 0.0f64..1.0,
        n in 2usize..40,
    ) {
        let unit = |v: &[f64]| {
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
            v.iter().map(|x| x / norm).collect::<Vec<f64>>()
        };
        let mu = unit(&m_dir);
        let x: Vec<f64> = unit(&mu.iter().zip(unit(&x_dir)).map(|(a, b)| -a * (1.0 - mix) + b * mix).collect::<Vec<_>>());
        let xp: Vec<f64> = unit(&mu.iter().zip(unit(&xp_dir)).map(|(a, b)| a * (1.0 - mix) + b * mix).collect::<Vec<_>>());
        let mut a: Vec<Vec<i64>> = vec![clip_encode(&mu); n];
        let mut b = a.clone();
        a[0] = clip_encode(&x);
        b[0] = clip_encode(&xp);
        check_pair(&a, &b)?;
    }

    /// The lemma behind Delta_2(S) = 4 C^2, in real arithmetic and any dimension:
    /// for x, x', mu in the unit ball, |p|^2 |q|^2 + (p.q)^2 <= 32 with p = x' - x,
    /// q = x + x' - 2 mu. Points are drawn on or near the sphere, where the maximum is.
    #[test]
    fn centered_scatter_lemma_holds(
        (x, xp, mu) in (1usize..6).prop_flat_map(|m| (row_strategy(m), row_strategy(m), row_strategy(m))),
        radii in (0.8f64..1.0, 0.8f64..1.0, 0.8f64..1.0),
    ) {
        let to_ball = |v: &[f64], r: f64| {
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
            v.iter().map(|x| x * r / norm).collect::<Vec<f64>>()
        };
        let (x, xp, mu) = (to_ball(&x, radii.0), to_ball(&xp, radii.1), to_ball(&mu, radii.2));
        let p: Vec<f64> = xp.iter().zip(&x).map(|(a, b)| a - b).collect();
        let q: Vec<f64> = xp.iter().zip(&x).zip(&mu).map(|((a, b), m)| a + b - 2.0 * m).collect();
        let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(a, b)| a * b).sum::<f64>();
        let value = dot(&p, &p) * dot(&q, &q) + dot(&p, &q).powi(2);
        prop_assert!(value <= 32.0 * (1.0 + 1e-12), "{value} > 32");
    }

    /// The zCDP calibration meets the requested delta and is at least as tight as
    /// the standard conversion eps = rho + 2 sqrt(rho ln(1/delta)).
    #[test]
    fn zcdp_calibration_is_sound(eps in 0.05f64..8.0, log_delta in -12.0f64..-2.0) {
        let delta = 10f64.powf(log_delta);
        let rho = rho_for(eps, delta);
        prop_assert!(rho > 0.0);
        prop_assert!(zcdp_delta(rho, eps) <= delta * (1.0 + 1e-9));
        let standard = {
            // Largest rho with rho + 2 sqrt(rho L) <= eps: sqrt(rho) = sqrt(L + eps) - sqrt(L).
            let l = (1.0 / delta).ln();
            ((l + eps).sqrt() - l.sqrt()).powi(2)
        };
        prop_assert!(rho >= standard * (1.0 - 1e-6));
    }
}

/// The S bound is tight: x' = -x = mu on the sphere moves N S~ by 4 Cq^2 (N - 1) up
/// to rounding, so no smaller constant is valid.
#[test]
fn s_sensitivity_is_attained() {
    let cq = FP.norm_bound_int() as f64;
    let n = 50usize;
    let mu = clip_encode(&[1.0, 0.0, 0.0]);
    let minus = clip_encode(&[-1.0, 0.0, 0.0]);
    let mut a = vec![mu.clone(); n];
    let b = a.clone();
    a[0] = minus;
    let (ra, rb) = (released(&a), released(&b));
    let f2: f64 = (0..3)
        .flat_map(|i| (0..3).map(move |j| (i, j)))
        .map(|(i, j)| ((ra.ns[i][j] - rb.ns[i][j]) as f64).powi(2))
        .sum();
    let bound = n as f64 * Sensitivity::new(cq as u64, 3).s_l2;
    assert!(f2.sqrt() <= bound);
    assert!(
        f2.sqrt() >= bound * (n as f64 - 1.0) / n as f64 * 0.999,
        "{} vs {bound}",
        f2.sqrt()
    );
}

#[test]
fn classic_calibration_refuses_large_epsilon() {
    assert_eq!(
        PrivacyRequest::new(Mechanism::GAUSSIAN_CLASSIC, Centering::Mask, 1.0, 1e-5).err(),
        Some(DpError::ClassicNeedsSmallEpsilon(1.0))
    );
    assert!(PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::Mask, 0.0, 1e-5).is_err());
    assert!(PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::Mask, 1.0, 0.0).is_err());
    assert!(PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::Mask, 1.0, 1.0).is_err());
    assert!(PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::Mask, f64::NAN, 0.1).is_err());
}

/// The planned sigma, converted back, spends no more than was asked.
#[test]
fn gaussian_plan_spends_at_most_the_budget() {
    for (centering, classes) in [
        (Centering::Mask, false),
        (Centering::DpMean, false),
        (Centering::DpMean, true),
    ] {
        let req = PrivacyRequest::new(Mechanism::GAUSSIAN, centering, 1.0, 1e-5).expect("valid");
        let cq = FP.norm_bound_int();
        let plan = plan_noise(&req, 10, cq, 1000, classes);
        let sens = if classes {
            Sensitivity::with_classes(cq, 10)
        } else {
            Sensitivity::new(cq, 10)
        };
        let sigma = plan.matrix.std_dev();
        let spent = match (centering, &plan.vector) {
            (Centering::Mask, _) => (1000.0 * sens.s_l2).powi(2) / (2.0 * sigma * sigma),
            (Centering::DpMean, Some(v)) => {
                sens.r_l2.powi(2) / (2.0 * sigma * sigma)
                    + sens.v_l2.powi(2) / (2.0 * v.std_dev().powi(2))
            }
            _ => f64::INFINITY,
        };
        assert!(
            zcdp_delta(spent, 1.0) <= 1e-5 * (1.0 + 1e-6),
            "{centering:?}"
        );
    }
}

/// The Laplace plan spends no more than was asked, block by block as the ledger
/// writes it down: a ledger with the wrong split would misstate the spend of the
/// class means even when the total is right.
#[test]
fn laplace_plan_spends_what_the_ledger_says() {
    let cq = FP.norm_bound_int();
    for classes in [false, true] {
        for epsilon in [0.5, 1.0, 2.0] {
            let req = PrivacyRequest::new(Mechanism::LAPLACE, Centering::DpMean, epsilon, 1e-6)
                .expect("valid");
            let plan = plan_noise(&req, 10, cq, 1000, classes);
            let sens = if classes {
                Sensitivity::with_classes(cq, 10)
            } else {
                Sensitivity::new(cq, 10)
            };
            let t = |scale: &NoiseScale| scale.grid_parameter().to_f64().unwrap_or(0.0);
            let Some(vector) = &plan.vector else {
                panic!("dp-mean plans a vector block")
            };
            let spent = [sens.r_l1 / t(&plan.matrix), sens.v_l1 / t(vector)];
            let ledger = budget_ledger(&req, classes);
            let what = format!("classes={classes} eps={epsilon}: {spent:?} {ledger:?}");
            assert!(spent[0] + spent[1] <= epsilon * (1.0 + 1e-9), "{what}");
            for (s, part) in spent.iter().zip(&ledger.parts) {
                // t is rounded up to the grid, so a block spends at most its part.
                assert!(*s <= part.epsilon * (1.0 + 1e-9), "{what}");
                assert!(*s >= part.epsilon * 0.99, "{what}");
            }
            let share = matrix_share(Mechanism::LAPLACE, classes);
            assert!(
                (ledger.parts[0].epsilon - share * epsilon).abs() < 1e-12,
                "{what}"
            );
        }
    }
}

#[test]
fn sampled_noise_has_planned_scale() {
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    let scale = NoiseScale::Gaussian {
        sigma: BigUint::from(1u64 << 40),
    };
    let upper = scale.sample_upper(20, &mut rng);
    assert_eq!(upper.len(), 210);
    let s = scale.std_dev();
    let var = upper
        .iter()
        .map(|e| (e.to_f64().unwrap_or(0.0) / s).powi(2))
        .sum::<f64>()
        / 210.0;
    assert!((var - 1.0).abs() < 0.35, "variance ratio {var}");
    assert!(upper.iter().all(|e| e.magnitude() < &scale.tail_bound()));
}

/// The draws run on the pool a seed's run at a time: each run is ChaCha20 keyed
/// by the next seed the caller's RNG gives, the last, short run too, and the
/// sample is the same on any number of threads.
#[test]
fn noise_drawn_on_the_pool_comes_from_the_callers_rng() {
    let t = BigUint::from(1u64 << 30);
    let scale = NoiseScale::Laplace { t: t.clone() };
    let count = 2 * 4096 + 5;
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        pool.install(|| scale.sample_vector(count, &mut ChaCha20Rng::seed_from_u64(8)))
    };
    let one = on(1);
    let mut caller = ChaCha20Rng::seed_from_u64(8);
    let expected: Vec<BigInt> = [4096, 4096, 5]
        .iter()
        .flat_map(|&len| {
            let mut seed = [0u8; 32];
            rand::RngCore::fill_bytes(&mut caller, &mut seed);
            let mut run = ChaCha20Rng::from_seed(seed);
            (0..len)
                .map(|_| super::sampler::discrete_laplace(&t, &mut run))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(one, expected);
    assert_eq!(on(3), one);
}

/// Wishart's Z is dim x cols iid draws, whatever cols is (none: no noise).
#[test]
fn wishart_noise_reads_its_columns() {
    let scale = |cols| NoiseScale::Wishart {
        sigma_z2: BigUint::from(100u32),
        cols,
    };
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    assert!(scale(0)
        .sample_upper(3, &mut rng)
        .iter()
        .all(|e| e.is_zero()));
    let upper = scale(7).sample_upper(3, &mut rng);
    assert_eq!(upper.len(), 6);
    assert!(upper.iter().any(|e| !e.is_zero()));
}

#[test]
fn wishart_noise_is_positive_semidefinite_on_diagonal() {
    let mut rng = ChaCha20Rng::seed_from_u64(4);
    let scale = NoiseScale::Wishart {
        sigma_z2: BigUint::from(100u32),
        cols: 5,
    };
    let upper = scale.sample_upper(4, &mut rng);
    for i in 0..4 {
        let idx = crate::encoding::TriangleLayout::upper_index(4, i, i);
        assert!(upper[idx] >= BigInt::zero());
    }
}

/// The ledger's parts compose to no more than was asked, for every mechanism and
/// centering, with and without classes.
#[test]
fn split_requests_compose_to_the_request() {
    for mechanism in [
        Mechanism::GAUSSIAN,
        Mechanism::GAUSSIAN_CLASSIC,
        Mechanism::LAPLACE,
    ] {
        for share in [0.05, 0.1, 0.5] {
            let req = PrivacyRequest::new(mechanism, Centering::DpMean, 0.8, 1e-6).expect("valid");
            let (a, b) = split_request(&req, share).expect("split");
            let whole = budget_ledger(&a, false).then("first", budget_ledger(&b, false), "second");
            let what = format!("{mechanism:?} share {share}: {whole:?}");
            assert!((whole.epsilon - 0.8).abs() < 1e-6, "{what}");
            assert!(whole.delta <= 1e-6 * (1.0 + 1e-9), "{what}");
            assert_eq!(whole.parts.len(), 4, "{what}");
            assert!(whole.parts[0].part.starts_with("first: "), "{what}");
            // The small study spends less than the large one.
            assert!(a.epsilon < b.epsilon || share == 0.5, "{what}");
        }
    }
    for bad in [0.0, 1.0, -0.1, f64::NAN] {
        let req =
            PrivacyRequest::new(Mechanism::LAPLACE, Centering::DpMean, 1.0, 1e-6).expect("valid");
        assert!(matches!(
            split_request(&req, bad),
            Err(DpError::BadShare(_))
        ));
    }
}

#[test]
fn budget_ledger_composes_within_the_request() {
    for mechanism in [
        Mechanism::GAUSSIAN,
        Mechanism::GAUSSIAN_CLASSIC,
        Mechanism::LAPLACE,
    ] {
        for (centering, classes) in [
            (Centering::Mask, false),
            (Centering::DpMean, false),
            (Centering::DpMean, true),
        ] {
            for epsilon in [0.5, 0.9] {
                let req = PrivacyRequest::new(mechanism, centering, epsilon, 1e-6).expect("valid");
                let ledger = budget_ledger(&req, classes);
                let what = format!("{mechanism:?} {centering:?} classes={classes} eps={epsilon}");
                assert!(
                    ledger.epsilon <= epsilon * (1.0 + 1e-9),
                    "{what}: {ledger:?}"
                );
                assert!(ledger.delta <= 1e-6 * (1.0 + 1e-9), "{what}: {ledger:?}");
                let parts = if centering == Centering::Mask { 1 } else { 2 };
                assert_eq!(ledger.parts.len(), parts, "{what}");
                // Every part spends something, and no part alone exceeds the whole.
                for p in &ledger.parts {
                    assert!(p.epsilon > 0.0 && p.epsilon <= ledger.epsilon * (1.0 + 1e-9));
                }
                if mechanism == Mechanism::GAUSSIAN {
                    // zCDP: the composed epsilon is the requested one, not less.
                    assert!(ledger.epsilon >= epsilon * 0.999, "{what}: {ledger:?}");
                }
            }
        }
    }
}

/// Exact class blocks of a labelled table: stacked class sums then Cq-scaled counts,
/// and stacked R_c upper triangles.
fn class_blocks(rows: &[Vec<i64>], labels: &[usize], g: usize) -> (Vec<i128>, Vec<i128>) {
    let m = rows[0].len();
    let cq = FP.norm_bound_int() as i128;
    let mut v = vec![0i128; g * (m + 1)];
    let mut r = vec![0i128; g * m * m];
    for (x, &c) in rows.iter().zip(labels) {
        for i in 0..m {
            v[c * m + i] += x[i] as i128;
            for j in i..m {
                r[c * m * m + i * m + j] += x[i] as i128 * x[j] as i128;
            }
        }
        v[g * m + c] += cq;
    }
    (v, r)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Classification studies: replacing one row, possibly by a row of another class,
    /// moves the stacked class sums and counts and the stacked R_c by no more than
    /// the sensitivities the plan uses.
    #[test]
    fn class_neighbors_respect_sensitivity(
        (rows, labels, replacement, new_label) in (1usize..6, 2usize..7, 2usize..5)
            .prop_flat_map(|(m, n, g)| (
                proptest::collection::vec(row_strategy(m), n),
                proptest::collection::vec(0..g, n),
                row_strategy(m),
                0..g,
            ))
    ) {
        let g = labels.iter().copied().max().unwrap_or(0).max(new_label) + 1;
        let m = rows[0].len();
        let a: Vec<Vec<i64>> = rows.iter().map(|r| clip_encode(r)).collect();
        let mut b = a.clone();
        b[0] = clip_encode(&replacement);
        let mut lb = labels.clone();
        lb[0] = new_label;
        let (va, ra) = class_blocks(&a, &labels, g);
        let (vb, rb) = class_blocks(&b, &lb, g);
        let sens = Sensitivity::with_classes(FP.norm_bound_int(), m);
        let dv: Vec<f64> = va.iter().zip(&vb).map(|(x, y)| (x - y) as f64).collect();
        let dr: Vec<f64> = ra.iter().zip(&rb).map(|(x, y)| (x - y) as f64).collect();
        let tol = 1.0 + 1e-9;
        let v2 = dv.iter().map(|x| x * x).sum::<f64>().sqrt();
        let v1 = dv.iter().map(|x| x.abs()).sum::<f64>();
        let r2 = dr.iter().map(|x| x * x).sum::<f64>().sqrt();
        let r1 = dr.iter().map(|x| x.abs()).sum::<f64>();
        prop_assert!(v2 <= sens.v_l2 * tol, "class vector L2 {} > {}", v2, sens.v_l2);
        prop_assert!(v1 <= sens.v_l1 * tol, "class vector L1 {} > {}", v1, sens.v_l1);
        prop_assert!(r2 <= sens.r_l2 * tol, "stacked R_c L2 {} > {}", r2, sens.r_l2);
        prop_assert!(r1 <= sens.r_l1 * tol, "stacked R_c L1 {} > {}", r1, sens.r_l1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Projected studies: R of the rows projected onto k orthonormal axes (then
    /// re-clipped and encoded as the owners do) and the sums of the full rows move
    /// by no more than `Sensitivity::for_blocks(cq, k, M)` under replace-one.
    #[test]
    fn projected_neighbors_respect_sensitivity(
        (rows, replacement, basis, k) in (2usize..6, 2usize..6).prop_flat_map(|(m, n)| (
            proptest::collection::vec(row_strategy(m), n),
            row_strategy(m),
            proptest::collection::vec(proptest::collection::vec(-1.0f64..1.0, m), m),
            1..=m,
        ))
    ) {
        let m = rows[0].len();
        // Orthonormal axes from the random basis (Gram-Schmidt through QR).
        let b = nalgebra::DMatrix::from_fn(m, m, |i, j| basis[j][i] + if i == j { 3.0 } else { 0.0 });
        let q = b.qr().q();
        let proj = crate::study::Projection {
            axes: (0..k).map(|j| q.column(j).iter().copied().collect()).collect(),
        };
        let clip = |r: &[f64]| -> Vec<f64> {
            let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm > 1.0 { r.iter().map(|x| x / norm).collect() } else { r.to_vec() }
        };
        let full_a: Vec<Vec<f64>> = rows.iter().map(|r| clip(r)).collect();
        let mut full_b = full_a.clone();
        full_b[0] = clip(&replacement);
        let share = |full: &[Vec<f64>]| {
            let x: Vec<Vec<i64>> = full.iter().map(|r| FP.encode_row(r)).collect();
            let y: Vec<Vec<i64>> = full.iter().map(|r| FP.encode_row(&proj.apply(r, 1.0))).collect();
            crate::protocol::Share::from_split_rows(&y, &x, m, None)
        };
        let (sa, sb) = (share(&full_a), share(&full_b));
        let sens = Sensitivity::for_blocks(FP.norm_bound_int(), k, m, false);
        let d = |a: &[i128], b: &[i128]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| (x - y) as f64).collect() };
        let (dr, dv) = (d(&sa.r_upper, &sb.r_upper), d(&sa.v, &sb.v));
        let l2 = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let l1 = |v: &[f64]| v.iter().map(|x| x.abs()).sum::<f64>();
        let tol = 1.0 + 1e-9;
        prop_assert_eq!(sa.r_upper.len(), k * (k + 1) / 2);
        prop_assert!(l2(&dr) <= sens.r_l2 * tol, "R L2 {} > {}", l2(&dr), sens.r_l2);
        prop_assert!(l1(&dr) <= sens.r_l1 * tol, "R L1 {} > {}", l1(&dr), sens.r_l1);
        prop_assert!(l2(&dv) <= sens.v_l2 * tol);
        prop_assert!(l1(&dv) <= sens.v_l1 * tol);
    }

    /// Row-norm histogram studies: each data row becomes the one-hot row of its
    /// norm's bin, so replace-one moves the bin study's shares by no more than the
    /// unit-norm sensitivities of a B-dimensional `dp-mean` study, which is what the
    /// proxy calibrates to.
    #[test]
    fn norm_histogram_neighbors_respect_sensitivity(
        (rows, replacement, bins) in (1usize..6, 1usize..6).prop_flat_map(|(m, n)| (
            proptest::collection::vec(proptest::collection::vec(-50.0f64..50.0, m), n),
            proptest::collection::vec(-50.0f64..50.0, m),
            2usize..12,
        ))
    ) {
        let m = rows[0].len();
        let features: Vec<String> = (0..m).map(|i| format!("x{i}")).collect();
        let nb = crate::study::NormBins::geometric(features, vec![(-10.0, 10.0); m], 0.05, bins);
        let b = nb.edges.len();
        prop_assert_eq!(b, bins);
        let share = |data: &[Vec<f64>]| {
            let hot: Vec<Vec<f64>> = data.iter().map(|r| nb.one_hot(r)).collect();
            crate::protocol::Share::from_raw_rows(&hot, &vec![(-1.0, 1.0); b], &FP, None, None)
        };
        let mut other = rows.clone();
        other[0] = replacement;
        let ((sa, ca), (sb, cb)) = (share(&rows), share(&other));
        // One-hot rows have norm exactly C: never clipped, each counted once.
        prop_assert_eq!(ca + cb, 0);
        let cq = FP.norm_bound_int() as i128;
        prop_assert_eq!(sa.v.iter().sum::<i128>(), rows.len() as i128 * cq);
        let sens = Sensitivity::new(FP.norm_bound_int(), b);
        let d = |a: &[i128], b: &[i128]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| (x - y) as f64).collect() };
        let (dr, dv) = (d(&sa.r_upper, &sb.r_upper), d(&sa.v, &sb.v));
        let l2 = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let l1 = |v: &[f64]| v.iter().map(|x| x.abs()).sum::<f64>();
        let tol = 1.0 + 1e-9;
        prop_assert!(l2(&dr) <= sens.r_l2 * tol, "R L2 {} > {}", l2(&dr), sens.r_l2);
        prop_assert!(l1(&dr) <= sens.r_l1 * tol, "R L1 {} > {}", l1(&dr), sens.r_l1);
        prop_assert!(l2(&dv) <= sens.v_l2 * tol);
        prop_assert!(l1(&dv) <= sens.v_l1 * tol);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Marginal histogram studies: replacing one row, by any other (values at the
    /// grid's far ends, at zero, or moving every feature's bin), moves the shares
    /// by no more than [`Sensitivity::marginals`], the bounds the plan calibrates
    /// to; and a row alone stays in the ball of radius Cq.
    #[test]
    fn marginal_neighbors_respect_sensitivity(
        (rows, replacement, per_octave, frac_bits) in (1usize..40, 1usize..5).prop_flat_map(|(m, n)| (
            proptest::collection::vec(proptest::collection::vec(marginal_value(), m), n),
            proptest::collection::vec(marginal_value(), m),
            1u32..=crate::study::MAX_PER_OCTAVE,
            prop_oneof![Just(10u32), Just(20), 1u32..=30],
        ))
    ) {
        let m = rows[0].len();
        let grid = crate::study::Marginals { per_octave };
        let fp = FixedPoint { frac_bits, row_norm_bound: 1.0 };
        let mut other = rows.clone();
        other[0] = replacement;
        let (sa, sb) = (grid.share(&rows, m, &fp), grid.share(&other, m, &fp));
        let single = grid.share(&rows[..1], m, &fp);
        // Every value lands in its own feature's block, once, and the row once in
        // the count: a bin past a block's end would move another feature's.
        let unit = i128::from(crate::study::Marginals::unit(m, &fp));
        let n = rows.len() as i128;
        let bins = grid.bins();
        for row in rows.iter().chain(&other) {
            prop_assert!(row.iter().all(|&x| grid.bin_of(x) < bins));
        }
        for j in 0..m {
            prop_assert_eq!(sa.v[j * bins..(j + 1) * bins].iter().sum::<i128>(), n * unit);
        }
        prop_assert_eq!(sa.v[m * bins], n * unit);
        let cq = fp.norm_bound_int() as f64;
        let norm = single.v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        prop_assert!(norm <= cq, "a row's norm {norm} > Cq {cq}");
        let d: Vec<f64> = sa.v.iter().zip(&sb.v).map(|(x, y)| (x - y) as f64).collect();
        let l2 = d.iter().map(|x| x * x).sum::<f64>().sqrt();
        let l1 = d.iter().map(|x| x.abs()).sum::<f64>();
        let (s2, s1) = Sensitivity::marginals(fp.norm_bound_int(), m);
        let tol = 1.0 + 1e-9;
        prop_assert!(l2 <= s2 * tol, "L2 {l2} > {s2}");
        prop_assert!(l1 <= s1 * tol, "L1 {l1} > {s1}");
        prop_assert!(sa.r_upper.is_empty() && sb.r_upper.is_empty());
    }
}

/// Values for the marginal study's property test: any finite value, weighted
/// toward the grid's edges, zero and powers of two.
fn marginal_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        proptest::num::f64::POSITIVE
            | proptest::num::f64::NEGATIVE
            | proptest::num::f64::NORMAL
            | proptest::num::f64::SUBNORMAL
            | proptest::num::f64::ZERO,
        Just(16.0),
        Just(-1.0),
        Just(f64::MAX),
        Just(f64::MIN),
        (-70i32..70).prop_map(|e| 2f64.powi(e)),
        -1e3f64..1e3,
    ]
}

/// One line per (mechanism, centering, classes, request): the noise plan, the
/// ledger and a split, every float by its bits.
fn frozen_plan_lines() -> Vec<String> {
    let cq = FP.norm_bound_int();
    let mut lines = Vec::new();
    for mechanism in Mechanism::all() {
        for (centering, classes) in [
            (Centering::Mask, false),
            (Centering::DpMean, false),
            (Centering::DpMean, true),
        ] {
            for (eps, delta) in [(0.5, 1e-6), (0.9, 1e-5)] {
                let req = PrivacyRequest::new(*mechanism, centering, eps, delta).expect("valid");
                let plan = plan_noise_blocks(&req, 7, 12, cq, 1234, classes);
                let ledger = budget_ledger(&req, classes);
                let (a, b) = split_request(&req, 0.3).expect("split");
                let parts: Vec<_> = ledger
                    .parts
                    .iter()
                    .map(|p| {
                        (
                            p.epsilon.to_bits(),
                            p.delta.to_bits(),
                            p.rho.map(f64::to_bits),
                        )
                    })
                    .collect();
                lines.push(format!(
                    "{:?} {:?} {classes} {eps} {delta} | {:?} | {:?} | {:?} {} {} | {parts:?} {} {} | {} {} {} {}",
                    mechanism.name(),
                    centering.name(),
                    plan.matrix,
                    plan.vector,
                    plan.rho.map(f64::to_bits),
                    plan.epsilon.to_bits(),
                    plan.delta.to_bits(),
                    ledger.epsilon.to_bits(),
                    ledger.delta.to_bits(),
                    a.epsilon.to_bits(),
                    a.delta.to_bits(),
                    b.epsilon.to_bits(),
                    b.delta.to_bits(),
                ));
            }
        }
    }
    lines.extend(frozen_marginal_lines());
    lines
}

/// One line per proven mechanism and request of a marginal histogram study: its
/// plan and its ledger, every float by its bits.
fn frozen_marginal_lines() -> Vec<String> {
    let cq = FP.norm_bound_int();
    let mut lines = Vec::new();
    for mechanism in Mechanism::all().iter().filter(|m| m.proven()) {
        for (eps, delta) in [(0.05, 1e-6), (0.9, 1e-5)] {
            let req =
                PrivacyRequest::new(*mechanism, Centering::DpMean, eps, delta).expect("valid");
            let plan = plan_marginal_noise(&req, cq, 12);
            let ledger = marginal_budget_ledger(&req);
            lines.push(format!(
                "marginals {:?} {eps} {delta} | {:?} | {:?} | {:?} {} {} | {} {} {:?}",
                mechanism.name(),
                plan.matrix,
                plan.vector,
                plan.rho.map(f64::to_bits),
                plan.epsilon.to_bits(),
                plan.delta.to_bits(),
                ledger.epsilon.to_bits(),
                ledger.delta.to_bits(),
                ledger.rho.map(f64::to_bits),
            ));
        }
    }
    lines
}

/// Calibration, accounting and splitting are frozen to the bit: a refactoring of
/// the mechanisms that changed one scale, one ledger entry or one split would be
/// a change of what studies release. A deliberate change rewrites the file (the
/// test prints `frozen_plan_lines()` when `DPCA_PRINT_FROZEN_PLANS` is set; say
/// why in the commit).
#[test]
fn noise_plans_ledgers_and_splits_are_frozen() {
    let frozen: Vec<&str> = include_str!("frozen_plans.txt").lines().collect();
    let now = frozen_plan_lines();
    if std::env::var_os("DPCA_PRINT_FROZEN_PLANS").is_some() {
        println!("{}", now.join("\n"));
    }
    assert_eq!(now.len(), frozen.len(), "a mechanism was added or removed");
    for (now, frozen) in now.iter().zip(frozen) {
        assert_eq!(now, frozen);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Every registered mechanism, on random blocks, budgets and parts: the noise it
    /// calibrates spends, by its own theorem, no more than the part the ledger
    /// charges for it. A mechanism whose calibration read the wrong sensitivity, the
    /// whole budget instead of its share, or a delta it does not charge would fail.
    #[test]
    fn no_mechanism_spends_more_than_its_part(
        which in 0..MECHANISMS.len(),
        epsilon in 0.01f64..0.99,
        log_delta in -12f64..-3.0,
        share in 0.01f64..=1.0,
        parts in 1usize..4,
        (l2, l1, trace) in (1.0f64..1e12, 1.0f64..1e12, 1.0f64..1e12),
        dim in 1usize..50,
        vector in proptest::bool::ANY,
    ) {
        let mechanism = MECHANISMS[which];
        let req = PrivacyRequest::new(mechanism, Centering::DpMean, epsilon, 10f64.powf(log_delta))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let block = if vector {
            Block { l2, l1, trace: 0.0, shape: Shape::Vector }
        } else {
            Block { l2, l1, trace, shape: Shape::Matrix { dim } }
        };
        let part = Part { share, parts };
        let scale = mechanism.calibrate(&block, part, &req);
        let spent = mechanism.spent_by(&block, &scale, part, &req);
        prop_assert!(spent.is_some(), "{mechanism} calibrated {scale:?}, which it does not sample");
        let (spent, charged) = (spent.unwrap_or(Spend { epsilon: f64::INFINITY, delta: 1.0, rho: None }), mechanism.spend(part, &req));
        let what = format!("{mechanism} {block:?} {part:?}: spends {spent:?}, charged {charged:?}");
        prop_assert!(spent.epsilon <= charged.epsilon * (1.0 + 1e-9), "{}", what);
        prop_assert!(spent.delta <= charged.delta * (1.0 + 1e-12), "{}", what);
        if let (Some(s), Some(c)) = (spent.rho, charged.rho) {
            prop_assert!(s <= c * (1.0 + 1e-9), "{}", what);
        }
    }
}

#[test]
fn mechanisms_are_found_by_their_names_and_an_unknown_name_lists_them() {
    for (i, m) in Mechanism::all().iter().enumerate() {
        assert_eq!(Mechanism::parse(m.name()), Ok(*m));
        assert!(Mechanism::all()[..i].iter().all(|o| o.name() != m.name()));
    }
    assert_eq!(
        Mechanism::all()[0],
        Mechanism::GAUSSIAN,
        "the default comes first"
    );
    let Err(err) = Mechanism::parse("gauss") else {
        panic!("an unknown name was accepted")
    };
    let err = err.to_string();
    assert!(err.contains("`gauss`"), "{err}");
    assert!(
        Mechanism::all().iter().all(|m| err.contains(m.name())),
        "{err}"
    );
}

/// Each mechanism's noise floor is where the largest eigenvalue of its sampled
/// noise lands: a 64 x 64 noise matrix of each kind, its top eigenvalue within
/// 15% of `noise_edge` at the matrix's entry standard deviation.
#[test]
fn the_noise_floor_is_the_top_eigenvalue_of_noise_alone() {
    let dim = 64;
    let cases = [
        (
            Mechanism::parse("gaussian"),
            NoiseScale::Gaussian {
                sigma: BigUint::from(1000u32),
            },
        ),
        (
            Mechanism::parse("gaussian-classic"),
            NoiseScale::Gaussian {
                sigma: BigUint::from(1000u32),
            },
        ),
        (
            Mechanism::parse("laplace"),
            NoiseScale::Laplace {
                t: BigUint::from(1000u32),
            },
        ),
        (
            Mechanism::parse("wishart-unproven"),
            NoiseScale::Wishart {
                sigma_z2: BigUint::from(1000u32),
                cols: dim + 1,
            },
        ),
    ];
    assert_eq!(
        cases.len(),
        Mechanism::all().len(),
        "a mechanism without a case here"
    );
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    for (mechanism, scale) in cases {
        let mechanism = mechanism.expect("registered");
        let upper = scale.sample_upper(dim, &mut rng);
        let mut m = nalgebra::DMatrix::<f64>::zeros(dim, dim);
        let mut it = upper.iter();
        for i in 0..dim {
            for j in i..dim {
                let v = it.next().expect("entry").to_f64().expect("finite");
                m[(i, j)] = v;
                m[(j, i)] = v;
            }
        }
        let top = m.symmetric_eigenvalues().max();
        let edge = mechanism.noise_edge(scale.std_dev(), dim);
        assert!(
            (top / edge - 1.0).abs() < 0.15,
            "{mechanism}: top eigenvalue {top:.4e}, floor {edge:.4e}"
        );
    }
}
