//! Exactness and masking invariants of the release, with real encryption.

use super::plausible::Implausible;
use super::*;
use crate::dp::Centering;
use crate::dp::{Mechanism, NoiseScale, PrivacyRequest};
use crate::encoding::FixedPoint;
use crate::encoding::TriangleLayout;
use crate::paillier::{Ciphertext, SecretKey};
use crate::randomizer::Randomizer;
use crate::randomizer::Randomness;
use crate::study::StudyLayout;
use crate::study::{ClassCovariance, ClassSpec, Projection, SpecDraft, StudySpec};
use num_bigint::BigInt;
use num_traits::Zero;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn key() -> &'static SecretKey {
    crate::testing::test_key()
}

fn draft(dim: usize, centering: Centering, mechanism: Mechanism) -> SpecDraft {
    SpecDraft {
        privacy: PrivacyRequest::new(mechanism, centering, 1.0, 1e-6).expect("valid"),
        ..crate::testing::test_draft(key().public(), dim)
    }
}

fn spec(dim: usize, centering: Centering, mechanism: Mechanism) -> StudySpec {
    draft(dim, centering, mechanism).validate().expect("valid")
}

fn class_draft(dim: usize, mechanism: Mechanism, covariance: ClassCovariance) -> SpecDraft {
    SpecDraft {
        classes: Some(ClassSpec {
            labels: vec!["a".into(), "b".into(), "c".into()],
            covariance,
        }),
        ..draft(dim, Centering::DpMean, mechanism)
    }
}

fn class_spec(dim: usize, mechanism: Mechanism, covariance: ClassCovariance) -> StudySpec {
    class_draft(dim, mechanism, covariance)
        .validate()
        .expect("valid")
}

fn random_rows(rng: &mut ChaCha20Rng, n: usize, dim: usize, fp: &FixedPoint) -> Vec<Vec<i64>> {
    (0..n)
        .map(|_| {
            let row: Vec<f64> = (0..dim).map(|_| rng.gen_range(-0.5..0.5)).collect();
            let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            let row: Vec<f64> = if norm > 1.0 {
                row.iter().map(|x| x / norm).collect()
            } else {
                row
            };
            fp.encode_row(&row)
        })
        .collect()
}

/// Runs a whole study in memory: owners encrypt, the aggregate is the ciphertext
/// product, the proxy releases, the user opens.
fn run(
    spec: &StudySpec,
    noise: Option<NoiseScale>,
    seed: u64,
) -> (Share, ReleaseSecrets, Opened, Vec<Ciphertext>) {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let pk = key().public();
    let layout = StudyLayout::new(spec).expect("layout");
    let dim = spec.dim();
    let shares: Vec<Share> = [7usize, 5, 9]
        .iter()
        .map(|&n| {
            let rows = random_rows(&mut rng, n, dim, &spec.fixed);
            let matrix_rows: Vec<Vec<i64>> = match &spec.projection {
                Some(p) => rows
                    .iter()
                    .map(|x| {
                        let real: Vec<f64> =
                            x.iter().map(|&v| v as f64 / spec.fixed.scale()).collect();
                        spec.fixed.encode_row(&p.apply(&real, 1.0))
                    })
                    .collect(),
                None => rows.clone(),
            };
            let labels: Vec<usize> = (0..n)
                .map(|_| rng.gen_range(0..layout.classes.max(1)))
                .collect();
            let classes = ClassRows {
                labels: &labels,
                classes: layout.classes,
                per_class_matrix: layout.matrix_blocks > 1,
                count_scale: layout.count_scale,
            };
            Share::from_split_rows(
                &matrix_rows,
                &rows,
                dim,
                (layout.classes > 0).then_some(&classes),
            )
        })
        .collect();
    let mut agg: Option<Vec<Ciphertext>> = None;
    for s in &shares {
        let cts: Vec<Ciphertext> = s
            .plaintexts(&layout, pk)
            .expect("plaintexts")
            .iter()
            .map(|m| pk.encrypt(m, &mut rng).expect("encrypt"))
            .collect();
        assert_eq!(cts.len(), layout.owner_ciphertexts());
        agg = Some(match agg {
            None => cts,
            Some(a) => a.iter().zip(&cts).map(|(x, y)| pk.add(x, y)).collect(),
        });
    }
    let agg = agg.expect("owners");
    let pooled = Share::sum(&shares).expect("pooled");
    let mut plan = spec.noise_plan(pooled.n);
    if let Some(n) = noise {
        plan.matrix = n.clone();
        plan.vector = plan.vector.map(|_| n);
    }
    let secrets =
        ReleaseSecrets::sample(&layout, spec.privacy.centering, &plan, &mut rng).expect("secrets");
    let released = release(
        &layout,
        spec.privacy.centering,
        &agg,
        pooled.n,
        &secrets,
        Randomness::FixedBase(&Randomizer::new(pk, 4, &mut rng)),
        &mut rng,
    )
    .expect("release");
    let opened = open_release(
        key(),
        &layout,
        spec.privacy.centering,
        spec.projection.as_ref(),
        &released,
        pooled.n,
        spec.fixed.frac_bits,
    )
    .expect("open");
    (pooled, secrets, opened, released)
}

fn r_full(share: &Share, dim: usize) -> Vec<Vec<BigInt>> {
    let mut r = vec![vec![BigInt::zero(); dim]; dim];
    for i in 0..dim {
        for j in i..dim {
            let v = BigInt::from(share.r_upper[TriangleLayout::upper_index(dim, i, j)]);
            r[i][j] = v.clone();
            r[j][i] = v;
        }
    }
    r
}

fn noise_full(upper: &[BigInt], dim: usize) -> Vec<Vec<BigInt>> {
    let mut e = vec![vec![BigInt::zero(); dim]; dim];
    for i in 0..dim {
        for j in i..dim {
            let v = upper[TriangleLayout::upper_index(dim, i, j)].clone();
            e[i][j] = v.clone();
            e[j][i] = v;
        }
    }
    e
}

/// Everything the user decrypts satisfies T - v' v'^T = N S~ + E' exactly, where
/// N S~ = N R - v v^T comes from the plaintext shares; and v' differs from v.
#[test]
fn masking_invariant_holds_exactly() {
    let dim = 7;
    let spec = spec(dim, Centering::Mask, Mechanism::GAUSSIAN);
    let (pooled, secrets, opened, _) = run(&spec, None, 1);
    let n = BigInt::from(pooled.n);
    let r = r_full(&pooled, dim);
    let e = noise_full(&secrets.matrix_noise, dim);
    for i in 0..dim {
        for j in 0..dim {
            let ns = &n * &r[i][j] - BigInt::from(pooled.v[i]) * BigInt::from(pooled.v[j]);
            assert_eq!(
                opened.matrix_grid[0][i][j],
                ns + &e[i][j],
                "entry ({i}, {j})"
            );
        }
        let v_masked = BigInt::from(pooled.v[i]) + BigInt::from(secrets.mask[i].clone());
        assert_eq!(opened.vector_grid[i], v_masked);
        assert_ne!(
            opened.vector_grid[i],
            BigInt::from(pooled.v[i]),
            "v' must differ from v"
        );
    }
    // The noise was real: not all zero.
    assert!(secrets.matrix_noise.iter().any(|x| !x.is_zero()));
}

/// What the user decrypts in `mask` centering is exactly the packed residue of
/// T = N R + v b^T + b v^T + b b^T + E' per segment, so a function of T alone (T is
/// N S~ + E' plus v' v'^T); and T's entries are wider than the slots they are
/// packed in (b b^T alone has about twice the mask's bits), which only the user's
/// subtraction of v' v'^T before unpacking makes decodable.
#[test]
fn mask_plaintexts_are_packed_t_wider_than_its_slots() {
    let dim = 6;
    let spec = spec(dim, Centering::Mask, Mechanism::GAUSSIAN);
    let layout = StudyLayout::new(&spec).expect("layout");
    assert!(
        layout.budget.slot_width < 2 * layout.mask_bits,
        "slots of {} bits, mask of {} bits",
        layout.budget.slot_width,
        layout.mask_bits
    );
    let (pooled, secrets, _, released) = run(&spec, None, 11);
    let n = BigInt::from(pooled.n);
    let r = r_full(&pooled, dim);
    let e = noise_full(&secrets.matrix_noise, dim);
    let v: Vec<BigInt> = pooled.v.iter().map(|&x| BigInt::from(x)).collect();
    let b: Vec<BigInt> = secrets
        .mask
        .iter()
        .map(|x| BigInt::from(x.clone()))
        .collect();
    let t = |i: usize, j: usize| {
        &n * &r[i][j] + &v[i] * &b[j] + &b[i] * &v[j] + &b[i] * &b[j] + &e[i][j]
    };
    let modulus = key().public().n();
    let mut widest = 0;
    for (seg, c) in layout.triangle.segments.iter().zip(&released) {
        let entries: Vec<BigInt> = (0..seg.len).map(|k| t(seg.row, seg.col + k)).collect();
        widest = widest.max(entries.iter().map(|x| x.bits()).max().unwrap_or(0));
        assert_eq!(
            key().decrypt(c),
            layout.budget.pack_residue(&entries, modulus),
            "segment ({}, {})",
            seg.row,
            seg.col
        );
    }
    assert!(
        widest >= layout.budget.slot_width,
        "T fitted its slots: {widest} bits"
    );
}

/// With the noise forced to zero, the decrypted S' equals the pooled S to
/// fixed-point precision.
#[test]
fn noise_free_release_is_exact() {
    let dim = 9;
    let spec = spec(dim, Centering::Mask, Mechanism::GAUSSIAN);
    let (pooled, _, opened, _) = run(&spec, Some(NoiseScale::None), 2);
    let scale = f64::from(spec.fixed.frac_bits).exp2();
    let n = pooled.n as f64;
    let r = r_full(&pooled, dim);
    for i in 0..dim {
        for j in 0..dim {
            let rij = to_f64(&r[i][j]) / (scale * scale);
            let s = rij - (pooled.v[i] as f64 / scale) * (pooled.v[j] as f64 / scale) / n;
            assert!(
                (opened.scatter[(i, j)] - s).abs() < 1e-9,
                "({i},{j}) {} vs {s}",
                opened.scatter[(i, j)]
            );
        }
    }
}

/// dp-mean: the user gets R + E_R and v + e_v exactly.
#[test]
fn dp_mean_release_is_r_plus_noise() {
    let dim = 6;
    for mechanism in [
        Mechanism::GAUSSIAN,
        Mechanism::LAPLACE,
        Mechanism::WISHART_UNPROVEN,
    ] {
        let spec = spec(dim, Centering::DpMean, mechanism);
        let (pooled, secrets, opened, _) = run(&spec, None, 3);
        let r = r_full(&pooled, dim);
        let e = noise_full(&secrets.matrix_noise, dim);
        for i in 0..dim {
            for j in 0..dim {
                assert_eq!(opened.matrix_grid[0][i][j], &r[i][j] + &e[i][j]);
            }
            assert_eq!(
                opened.vector_grid[i],
                BigInt::from(pooled.v[i]) + &secrets.vector_noise[i]
            );
        }
        assert!(opened.mean.is_some());
    }
}

/// Laplace and Wishart in mask mode keep the invariant too.
#[test]
fn mask_invariant_for_other_mechanisms() {
    let dim = 5;
    for mechanism in [Mechanism::LAPLACE, Mechanism::WISHART_UNPROVEN] {
        let spec = spec(dim, Centering::Mask, mechanism);
        let (pooled, secrets, opened, released) = run(&spec, None, 4);
        let n = BigInt::from(pooled.n);
        let r = r_full(&pooled, dim);
        let e = noise_full(&secrets.matrix_noise, dim);
        for i in 0..dim {
            for j in 0..dim {
                let ns = &n * &r[i][j] - BigInt::from(pooled.v[i]) * BigInt::from(pooled.v[j]);
                assert_eq!(opened.matrix_grid[0][i][j], ns + &e[i][j]);
            }
        }
        // Every released ciphertext is a valid group element.
        let pk = key().public();
        for (k, c) in released.iter().enumerate() {
            let unit = num_traits::One::is_one(&num_integer::Integer::gcd(&c.0, pk.n()));
            assert!(unit, "ciphertext {k} is not a unit");
            pk.ciphertext_from_bytes(&pk.ciphertext_to_bytes(c), k)
                .expect("valid ciphertext");
        }
    }
}

/// The distributed protocol loses nothing against a trusted curator: with the same
/// noise, the opened release equals the central mechanism's output bit for bit.
#[test]
fn distributed_release_equals_central_mechanism() {
    for (k, centering) in [Centering::Mask, Centering::DpMean].into_iter().enumerate() {
        for (m, mech) in [Mechanism::GAUSSIAN, Mechanism::LAPLACE]
            .into_iter()
            .enumerate()
        {
            for baseline in [false, true] {
                let spec = SpecDraft {
                    baseline,
                    ..draft(6, centering, mech)
                }
                .validate()
                .expect("valid");
                let (pooled, secrets, opened, released) = run(&spec, None, 40 + (2 * k + m) as u64);
                if baseline {
                    // One value per ciphertext: the triangle, then v.
                    assert_eq!(released.len(), 21 + 6, "{centering:?} {mech:?}");
                }
                let layout = StudyLayout::new(&spec).expect("layout");
                let central = central_release(
                    &pooled,
                    &layout.shape(),
                    centering,
                    None,
                    &secrets,
                    spec.fixed.frac_bits,
                );
                let what = format!("{centering:?} {mech:?} baseline={baseline}");
                assert_eq!(central.matrix_grid, opened.matrix_grid, "{what}");
                assert_eq!(central.scatter, opened.scatter, "{what}");
                assert_eq!(central.mean, opened.mean, "{what}");
            }
        }
    }
}

/// Classification studies: the distributed release equals the central mechanism bit
/// for bit, in both covariance modes, with noise.
#[test]
fn class_release_equals_central_mechanism() {
    for (k, covariance) in [ClassCovariance::Shared, ClassCovariance::PerClass]
        .into_iter()
        .enumerate()
    {
        let spec = class_spec(5, Mechanism::GAUSSIAN, covariance);
        let layout = StudyLayout::new(&spec).expect("layout");
        let (pooled, secrets, opened, released) = run(&spec, None, 60 + k as u64);
        assert_eq!(released.len(), layout.release_ciphertexts());
        let central = central_release(
            &pooled,
            &layout.shape(),
            Centering::DpMean,
            None,
            &secrets,
            spec.fixed.frac_bits,
        );
        assert_eq!(central.matrix_grid, opened.matrix_grid, "{covariance:?}");
        assert_eq!(central.vector_grid, opened.vector_grid, "{covariance:?}");
        assert_eq!(central.scatter, opened.scatter, "{covariance:?}");
        let (a, b) = (
            central.classes.expect("classes"),
            opened.classes.expect("classes"),
        );
        assert_eq!(a.counts, b.counts);
        assert_eq!(a.means, b.means);
        assert_eq!(a.scatters, b.scatters);
    }
}

/// Without noise a classification release opens to the exact class counts, means
/// and within-class scatters, and the class blocks add up to the unlabelled study's.
#[test]
fn noise_free_class_release_is_exact() {
    for covariance in [ClassCovariance::Shared, ClassCovariance::PerClass] {
        let spec = class_spec(4, Mechanism::GAUSSIAN, covariance);
        let layout = StudyLayout::new(&spec).expect("layout");
        let (pooled, _, opened, _) = run(&spec, Some(NoiseScale::None), 70);
        let (g, dim) = (3, 4);
        let stats = opened.classes.expect("classes");
        let cq = layout.count_scale as i128;
        let counts: Vec<i128> = (0..g).map(|c| pooled.v[g * dim + c] / cq).collect();
        assert_eq!(counts.iter().sum::<i128>(), pooled.n as i128);
        for c in 0..g {
            assert_eq!(stats.counts[c], counts[c] as f64, "count of class {c}");
            assert_eq!(pooled.v[g * dim + c] % cq, 0);
        }
        assert_eq!(
            stats.scatters.len(),
            if covariance == ClassCovariance::Shared {
                1
            } else {
                g
            }
        );
        // Within-class scatters add up to the total minus the between-class part.
        let scale = f64::from(spec.fixed.frac_bits).exp2();
        let mean = opened.mean.expect("mean");
        let within = stats
            .scatters
            .iter()
            .fold(nalgebra::DMatrix::zeros(dim, dim), |acc, s| acc + s);
        let between = (0..g).fold(nalgebra::DMatrix::zeros(dim, dim), |acc, c| {
            let d = &stats.means[c] - &mean;
            acc + &d * d.transpose() * stats.counts[c]
        });
        let diff = (&within + between - &opened.scatter).abs().max();
        assert!(diff < 1e-9, "within + between differs from total by {diff}");
        // The mean of each class is its sum over its count.
        for c in 0..g {
            let sum = nalgebra::DVector::from_fn(dim, |i, _| pooled.v[c * dim + i] as f64 / scale);
            let want = sum / stats.counts[c].max(1.0);
            assert!((&stats.means[c] - want).abs().max() < 1e-12);
        }
    }
}

/// Two orthonormal axes in 5 dimensions (rotated, not coordinate axes).
fn two_axes() -> Projection {
    let a = 1.0 / 2f64.sqrt();
    Projection {
        axes: vec![vec![a, a, 0.0, 0.0, 0.0], vec![0.0, 0.0, 0.6, 0.8, 0.0]],
    }
}

/// Projected studies (the second round): distributed equals central bit for bit,
/// with classes; and without noise the opened scatter is W (W^T S W) W^T.
#[test]
fn projected_release_equals_central_and_lifts_the_projected_scatter() {
    for covariance in [ClassCovariance::PerClass, ClassCovariance::Shared] {
        let spec = SpecDraft {
            projection: Some(two_axes()),
            ..class_draft(5, Mechanism::LAPLACE, covariance)
        }
        .validate()
        .expect("valid projected spec");
        let layout = StudyLayout::new(&spec).expect("layout");
        assert_eq!(layout.triangle.dim, 2);
        assert_eq!(layout.vector_len, 3 * 6);
        let (pooled, secrets, opened, _) = run(&spec, None, 80);
        let central = central_release(
            &pooled,
            &layout.shape(),
            Centering::DpMean,
            spec.projection.as_ref(),
            &secrets,
            spec.fixed.frac_bits,
        );
        assert_eq!(central.matrix_grid, opened.matrix_grid);
        assert_eq!(central.scatter, opened.scatter);
        assert_eq!(central.mean, opened.mean);
        let stats = opened.classes.expect("classes");
        assert!(stats.scatters.iter().all(|s| s.shape() == (5, 5)));
    }
    let spec = SpecDraft {
        projection: Some(two_axes()),
        ..class_draft(5, Mechanism::LAPLACE, ClassCovariance::Shared)
    }
    .validate()
    .expect("valid");
    let plain = SpecDraft {
        classes: None,
        ..spec.to_draft()
    }
    .validate()
    .expect("valid");
    let (pooled, _, opened, _) = run(&plain, Some(NoiseScale::None), 81);
    // The unprojected scatter of the same rows, from the vector block and R of the
    // full rows (rebuilt from the shares' sums is not possible: compare in the span).
    let w = nalgebra::DMatrix::from_fn(2, 5, |i, j| two_axes().axes[i][j]);
    let s = &opened.scatter;
    // Lifted: symmetric, rank 2, and W S W^T recovers it.
    let back = w.transpose() * (&w * s * w.transpose()) * &w;
    assert!((&back - s).abs().max() < 1e-12);
    let mean = opened.mean.expect("mean");
    let v = nalgebra::DVector::from_fn(5, |i, _| pooled.v[i] as f64 / spec.fixed.scale());
    assert!((&mean - v / pooled.n as f64).abs().max() < 1e-12);
    assert!(s.trace() > 0.0);
}

#[test]
fn projections_that_are_not_orthonormal_or_need_the_mask_are_refused() {
    let mut spec = draft(5, Centering::DpMean, Mechanism::GAUSSIAN);
    spec.projection = Some(Projection {
        axes: vec![vec![1.0, 1.0, 0.0, 0.0, 0.0]],
    });
    let err = spec
        .clone()
        .validate()
        .expect_err("norm sqrt 2")
        .to_string();
    assert!(err.contains("orthonormal"), "{err}");
    spec.projection = Some(two_axes());
    spec.privacy.centering = Centering::Mask;
    let err = spec.validate().expect_err("mask").to_string();
    assert!(err.contains("dp-mean"), "{err}");
}

fn histogram_draft(bins: &crate::study::NormBins, mechanism: Mechanism) -> SpecDraft {
    let b = bins.edges.len();
    SpecDraft {
        features: bins.bin_names(),
        bounds: vec![(-1.0, 1.0); b],
        norm_bins: Some(bins.clone()),
        ..draft(b, Centering::DpMean, mechanism)
    }
}

/// A row-norm histogram study releases the bin counts (exactly without noise, within
/// the noise otherwise), and the quantile read off them brackets the true one.
#[test]
fn norm_histogram_release_counts_the_bins() {
    let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let bins = crate::study::NormBins::geometric(names, vec![(0.0, 10.0); 3], 0.2, 10);
    let b = bins.edges.len();
    let mut rng = ChaCha20Rng::seed_from_u64(21);
    let rows: Vec<Vec<f64>> = (0..400)
        .map(|_| (0..3).map(|_| rng.gen_range(0.0..10.0)).collect())
        .collect();
    let norm = |r: &[f64]| {
        let (x, _) = crate::data::normalize_row(r, &bins.bounds, f64::INFINITY);
        x.iter().map(|v| v * v).sum::<f64>().sqrt()
    };
    let mut exact = vec![0.0; b];
    for r in &rows {
        exact[bins.bin_of(norm(r))] += 1.0;
    }
    for mechanism in [Mechanism::GAUSSIAN, Mechanism::LAPLACE] {
        let spec = histogram_draft(&bins, mechanism)
            .validate()
            .expect("a valid histogram study");
        let shape = StudyLayout::new(&spec).expect("layout").shape();
        let hot: Vec<Vec<f64>> = rows.iter().map(|r| bins.one_hot(r)).collect();
        let (pooled, clipped) = Share::from_raw_rows(&hot, &spec.bounds, &spec.fixed, None, None);
        assert_eq!(clipped, 0);
        let plan = spec.noise_plan(pooled.n);
        let tri = b * (b + 1) / 2;
        let quiet = ReleaseSecrets {
            mask: Vec::new(),
            matrix_noise: vec![BigInt::zero(); tri],
            vector_noise: vec![BigInt::zero(); b],
        };
        let release = |secrets: &ReleaseSecrets| {
            central_release(
                &pooled,
                &shape,
                Centering::DpMean,
                None,
                secrets,
                spec.fixed.frac_bits,
            )
        };
        let counts = release(&quiet).bin_counts(&bins, &plan, &spec.fixed);
        for (got, want) in counts.iter().zip(&exact) {
            assert!((got - want).abs() < 1e-9, "{counts:?} vs {exact:?}");
        }
        for q in [0.1, 0.5, 0.9] {
            let c = bins.quantile(&counts, q);
            let below = rows.iter().filter(|r| norm(r) < c).count() as f64 / rows.len() as f64;
            assert!(below >= q, "q {q}: {below} of the norms below {c}");
            let edge = bins
                .edges
                .iter()
                .rposition(|&e| e < c)
                .expect("an edge below");
            let under = rows.iter().filter(|r| norm(r) < bins.edges[edge]).count() as f64;
            assert!(
                under / (rows.len() as f64) < q,
                "q {q}: the bin below already holds it"
            );
        }
        let noisy = ReleaseSecrets {
            mask: Vec::new(),
            matrix_noise: plan.matrix.sample_upper(b, &mut rng),
            vector_noise: plan
                .vector
                .as_ref()
                .expect("dp-mean noise on v")
                .sample_vector(b, &mut rng),
        };
        let counts = release(&noisy).bin_counts(&bins, &plan, &spec.fixed);
        let cq = spec.fixed.norm_bound_int() as f64;
        let sd = plan.vector.as_ref().map_or(0.0, |v| v.std_dev() / cq);
        for (got, want) in counts.iter().zip(&exact) {
            assert!((got - want).abs() < 6.0 * sd, "{got} vs {want}, sd {sd}");
        }
    }
}

#[test]
fn histogram_specs_that_do_not_describe_their_bins_are_refused() {
    let names: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
    let bins = crate::study::NormBins::geometric(names, vec![(0.0, 1.0); 2], 0.1, 6);
    let good = histogram_draft(&bins, Mechanism::GAUSSIAN);
    good.clone().validate().expect("valid");
    let mut bad_edges = bins.clone();
    bad_edges.edges.swap(2, 3);
    let mut unbounded = bins.clone();
    unbounded.bounds[1] = (0.0, f64::INFINITY);
    let mut escaping = bins.clone();
    escaping.features[0] = "a\x1b[2J".into();
    let cases = [
        SpecDraft {
            features: (0..6).map(|i| format!("f{i}")).collect(),
            ..good.clone()
        },
        SpecDraft {
            norm_bins: Some(bad_edges.clone()),
            features: bad_edges.bin_names(),
            ..good.clone()
        },
        SpecDraft {
            fixed: FixedPoint {
                frac_bits: 16,
                row_norm_bound: 2.0,
            },
            ..good.clone()
        },
        SpecDraft {
            norm_bins: Some(unbounded),
            ..good.clone()
        },
        SpecDraft {
            norm_bins: Some(escaping),
            ..good.clone()
        },
        SpecDraft {
            privacy: PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::Mask, 1.0, 1e-6)
                .expect("valid"),
            ..good.clone()
        },
    ];
    for (i, spec) in cases.into_iter().enumerate() {
        let err = spec.validate().expect_err("refused");
        assert!(err.to_string().contains("norm_bins"), "case {i}: {err}");
    }
}

#[test]
fn invited_owner_lists_are_checked() {
    let mut s = draft(3, Centering::DpMean, Mechanism::GAUSSIAN);
    s.quorum = 2;
    s.expected_owners = vec!["a".into(), "b".into()];
    assert!(s.clone().validate().is_ok());
    s.expected_owners = vec!["a".into(), "a".into()];
    let err = s.clone().validate().expect_err("duplicate").to_string();
    assert!(err.contains("duplicate owner id `a`"), "{err}");
    // An owner the proxy would refuse to hear from cannot be invited.
    s.expected_owners = vec!["a".into(), "b".repeat(crate::study::MAX_ID_BYTES + 1)];
    let err = s.clone().validate().expect_err("long id").to_string();
    assert!(err.contains("an owner id of 257 bytes"), "{err}");
    s.expected_owners = vec!["a".into()];
    let err = s.validate().expect_err("quorum").to_string();
    assert!(err.contains("more than the 1 owners invited"), "{err}");
}

/// Names and ids are shown on other parties' terminals (an owner's refusal, the
/// operator's status table): a feature name or invited owner carrying an escape
/// sequence, a carriage return or a bidirectional override is refused, named
/// escaped; names in other scripts are kept.
#[test]
fn names_that_could_drive_a_terminal_are_refused() {
    let mut s = draft(3, Centering::DpMean, Mechanism::GAUSSIAN);
    s.features[0] = "Größe (cm) 身長 \u{200f}גובה".into();
    assert!(s.clone().validate().is_ok());
    // Refused, naming `what` and `param`, and told escaped.
    let refused = |s: &SpecDraft, what: &str, param: &str| {
        let err = s.clone().validate().expect_err(what).to_string();
        assert!(err.contains(what) && err.contains(param), "{err}");
        assert!(
            !err.chars().any(crate::study::is_terminal_control),
            "{err:?}"
        );
    };
    for bad in ["x\x1b[2J", "x\r", "x\u{9b}1m", "x\u{202e}"] {
        s.features[1] = bad.into();
        refused(&s, "feature name", "control character");
    }
    s.features[1] = "f1".into();
    s.quorum = 2;
    s.expected_owners = vec!["a".into(), "b\x1b]0;owned\x07".into()];
    let err = s.clone().validate().expect_err("hostile id").to_string();
    assert!(
        err.contains("expected_owners") && err.contains("owner id"),
        "{err}"
    );
    // Class labels, which owners and the user's report show, likewise.
    s.quorum = 1;
    s.expected_owners.clear();
    let classes = |labels: &[&str]| crate::study::ClassSpec {
        labels: labels.iter().map(|l| l.to_string()).collect(),
        covariance: crate::study::ClassCovariance::Shared,
    };
    s.classes = Some(classes(&["benign", "malin \u{200f}ממאיר"]));
    assert!(s.clone().validate().is_ok());
    s.classes = Some(classes(&["benign", "malignant\x1b[8m"]));
    refused(&s, "class label", "classes");
}

/// A noise scale beyond u128 used to be cut to u128::MAX without a word: less noise
/// than the accounting charged for. It is now exact at any size (and the layout
/// widens its slots for it), and a scale that overflows f64 refuses the spec.
#[test]
fn noise_scales_are_never_cut_and_overflowing_ones_are_refused() {
    let tiny = |epsilon: f64| SpecDraft {
        privacy: PrivacyRequest::new(Mechanism::LAPLACE, Centering::DpMean, epsilon, 1e-6)
            .expect("valid"),
        ..draft(3, Centering::DpMean, Mechanism::LAPLACE)
    };
    let huge = tiny(1e-40)
        .validate()
        .expect("a representable scale is accepted");
    let t = huge.noise_plan(huge.max_rows).matrix.grid_parameter();
    assert!(t.bits() > 128, "the scale was cut to {t}");
    let layout = crate::study::StudyLayout::new(&huge).expect("layout");
    assert!(
        layout.budget.slot_width > t.bits(),
        "the slots hold the noise"
    );
    let err = tiny(1e-300).validate().expect_err("an overflowing scale");
    assert!(err.to_string().contains("epsilon"), "{err}");
    for bad in [f64::NAN, f64::INFINITY] {
        assert!(crate::dp::ceil_big(bad).bits() >= crate::dp::OVERFLOWED_SCALE_BITS);
    }
}

/// A marginal histogram study through the whole protocol (owners encrypt their
/// bins, the proxy folds and releases, the user opens): the release is its
/// vector block alone, equal bit for bit to the central mechanism's with the same
/// noise, and without noise it reads back every feature's exact counts.
#[test]
fn marginal_release_equals_central_and_counts_every_value() {
    let grid = crate::study::Marginals { per_octave: 2 };
    let mut rng = ChaCha20Rng::seed_from_u64(58);
    let m = 3;
    let tables: Vec<Vec<Vec<f64>>> = [6usize, 4, 9]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| vec![rng.gen_range(-5.0..40.0), 0.0, rng.gen_range(1e-3..1e9)])
                .collect()
        })
        .collect();
    for (mechanism, noise) in [
        (Mechanism::GAUSSIAN, None),
        (Mechanism::GAUSSIAN, Some(())),
        (Mechanism::LAPLACE, Some(())),
    ] {
        let spec = spec(m, Centering::DpMean, mechanism)
            .marginal_histograms(grid.clone(), draft(m, Centering::DpMean, mechanism).privacy)
            .expect("a valid marginal study");
        let layout = StudyLayout::new(&spec).expect("layout");
        assert_eq!(
            (layout.matrix_ciphertexts(), layout.vector_len),
            (0, grid.width(m))
        );
        let pk = key().public();
        let shares: Vec<Share> = tables
            .iter()
            .map(|t| grid.share(t, m, &spec.fixed))
            .collect();
        let mut agg: Option<Vec<Ciphertext>> = None;
        for s in &shares {
            let cts: Vec<Ciphertext> = s
                .plaintexts(&layout, pk)
                .expect("plaintexts")
                .iter()
                .map(|p| pk.encrypt(p, &mut rng).expect("encrypt"))
                .collect();
            assert_eq!(cts.len(), layout.owner_ciphertexts());
            agg = Some(match agg {
                None => cts,
                Some(a) => a.iter().zip(&cts).map(|(x, y)| pk.add(x, y)).collect(),
            });
        }
        let pooled = Share::sum(&shares).expect("pooled");
        let mut plan = spec.noise_plan(pooled.n);
        if noise.is_none() {
            plan.matrix = NoiseScale::None;
            plan.vector = Some(NoiseScale::None);
        }
        let secrets =
            ReleaseSecrets::sample(&layout, Centering::DpMean, &plan, &mut rng).expect("secrets");
        let released = release(
            &layout,
            Centering::DpMean,
            &agg.expect("owners"),
            pooled.n,
            &secrets,
            Randomness::FixedBase(&Randomizer::new(pk, 4, &mut rng)),
            &mut rng,
        )
        .expect("release");
        let opened = open_release(
            key(),
            &layout,
            Centering::DpMean,
            None,
            &released,
            pooled.n,
            spec.fixed.frac_bits,
        )
        .expect("open");
        let central = central_release(
            &pooled,
            &layout.shape(),
            Centering::DpMean,
            None,
            &secrets,
            spec.fixed.frac_bits,
        );
        assert_eq!(central.vector_grid, opened.vector_grid, "{mechanism:?}");
        assert!(opened.matrix_grid.iter().all(Vec::is_empty) && opened.mean.is_none());
        if noise.is_none() {
            let counts = grid.counts(&opened.vector_grid, m, &spec.fixed);
            assert_eq!(counts.rows, 19.0);
            assert_eq!(counts.features[1][grid.zero_bin()], 19.0);
            for (j, c) in counts.features.iter().enumerate() {
                let mut want = vec![0.0; grid.bins()];
                for row in tables.iter().flatten() {
                    want[grid.bin_of(row[j])] += 1.0;
                }
                assert_eq!(c, &want, "feature {j}");
            }
        }
    }
}

/// A study at the bundled data's shape (64 features, 5620 rows, in `classes`
/// classes if any), its honest pooled share of rows in the ball, and its layout.
fn checked_study(
    (centering, mechanism): (Centering, Mechanism),
    classes: usize,
    rng: &mut ChaCha20Rng,
) -> (StudySpec, StudyLayout, Share) {
    let (m, n) = (64, 5620);
    let spec = SpecDraft {
        max_rows: 8192,
        fixed: FixedPoint {
            frac_bits: 20,
            row_norm_bound: 4.0,
        },
        privacy: PrivacyRequest::new(mechanism, centering, 1.0, 7.5e-5).expect("valid"),
        classes: (classes > 0).then(|| ClassSpec {
            labels: (0..classes).map(|c| c.to_string()).collect(),
            covariance: ClassCovariance::Shared,
        }),
        ..draft(m, centering, mechanism)
    }
    .validate()
    .expect("valid");
    let layout = StudyLayout::new(&spec).expect("layout");
    // Rows like normalized digits: a class's own pattern plus noise, some clipped.
    let rows: Vec<Vec<i64>> = (0..n)
        .map(|i| {
            let c = i % classes.max(1);
            let row: Vec<f64> = (0..m)
                .map(|j| ((j * (c + 1)) % 7) as f64 / 7.0 + rng.gen_range(-0.6..0.6) - 0.4)
                .collect();
            let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            let row: Vec<f64> = row.iter().map(|x| x * (4.0 / norm).min(1.0)).collect();
            spec.fixed.encode_row(&row)
        })
        .collect();
    let labels: Vec<usize> = (0..n).map(|i| i % classes.max(1)).collect();
    let class_rows = ClassRows {
        labels: &labels,
        classes,
        per_class_matrix: false,
        count_scale: spec.fixed.norm_bound_int(),
    };
    let pooled = Share::from_split_rows(&rows, &rows, m, (classes > 0).then_some(&class_rows));
    (spec, layout, pooled)
}

/// The pooled share's release with fresh noise, as the user opens it.
fn checked_release(
    spec: &StudySpec,
    layout: &StudyLayout,
    pooled: &Share,
    rng: &mut ChaCha20Rng,
) -> Result<(), Implausible> {
    let centering = spec.privacy.centering;
    let plan = spec.noise_plan(pooled.n);
    let secrets = ReleaseSecrets::sample(layout, centering, &plan, rng).expect("secrets");
    let shape = layout.shape();
    let opened = central_release(
        pooled,
        &shape,
        centering,
        None,
        &secrets,
        spec.fixed.frac_bits,
    );
    check_release(
        &opened,
        (&shape, centering),
        &plan,
        pooled.n,
        spec.fixed.frac_bits,
    )
}

/// Honest releases pass the checks: 1,000 noisy releases at the bundled data's
/// shape with ten classes (the demo's study), 200 without classes and 200 in
/// `mask` centering, and 50 each of the Laplace and Wishart mechanisms, with no
/// false alarm (each fails with probability at most FALSE_ALARM, 1e-9).
#[test]
fn honest_releases_pass_the_checks() {
    let mut rng = ChaCha20Rng::seed_from_u64(58);
    let (gauss, dp_mean) = (Mechanism::GAUSSIAN, Centering::DpMean);
    for (centering, mechanism, classes, releases) in [
        (dp_mean, gauss, 10, 1000),
        (dp_mean, gauss, 0, 200),
        (Centering::Mask, gauss, 0, 200),
        (dp_mean, Mechanism::LAPLACE, 10, 50),
        (dp_mean, Mechanism::WISHART_UNPROVEN, 0, 50),
    ] {
        let (spec, layout, pooled) = checked_study((centering, mechanism), classes, &mut rng);
        for r in 0..releases {
            if let Err(e) = checked_release(&spec, &layout, &pooled, &mut rng) {
                panic!("{centering:?}, {classes} classes, release {r}: a false alarm: {e}");
            }
        }
    }
}

/// A share no honest rows give is refused, with what it fails: the audit's
/// probe (K Cq^2 added to R[0][0], N kept), a scatter made indefinite, sums and
/// counts past what N rows allow.
#[test]
fn poisoned_releases_fail_the_checks() {
    let mut rng = ChaCha20Rng::seed_from_u64(59);
    let (spec, layout, honest) =
        checked_study((Centering::DpMean, Mechanism::GAUSSIAN), 10, &mut rng);
    let cq = spec.fixed.norm_bound_int() as i128;
    let (m, g) = (64, 10);
    let poisoned = |what: &str, edit: &dyn Fn(&mut Share)| {
        let mut share = honest.clone();
        edit(&mut share);
        let mut rng = ChaCha20Rng::seed_from_u64(60);
        match checked_release(&spec, &layout, &share, &mut rng) {
            Err(e) => e,
            Ok(()) => panic!("{what}: a poisoned release passed"),
        }
    };
    let probe = poisoned("probe", &|s| s.r_upper[0] += 16_000 * cq * cq);
    assert!(matches!(probe, Implausible::Trace { .. }), "{probe}");
    // Variance moved from feature 0 to feature 1: the trace is unchanged, the
    // centered scatter is not positive semidefinite.
    let indefinite = poisoned("indefinite", &|s| {
        let idx = |i| crate::encoding::TriangleLayout::upper_index(m, i, i);
        s.r_upper[idx(0)] -= 10_000 * cq * cq;
        s.r_upper[idx(1)] += 10_000 * cq * cq;
    });
    assert!(
        matches!(indefinite, Implausible::Eigenvalue { .. }),
        "{indefinite}"
    );
    let count = poisoned("count", &|s| s.v[g * m + 3] += 20_000 * cq);
    assert!(
        matches!(count, Implausible::ClassCount { class: 3, .. }),
        "{count}"
    );
    let total = poisoned("total", &|s| {
        s.v[g * m] += 500 * cq;
        s.v[g * m + 1] += 500 * cq;
    });
    assert!(matches!(total, Implausible::ClassTotal { .. }), "{total}");
    let sum = poisoned("class sum", &|s| s.v[2 * m] += 5_000 * cq);
    assert!(
        matches!(sum, Implausible::ClassSum { class: 2, .. }),
        "{sum}"
    );
    // The probe under the other mechanisms, whose margins are wider.
    for mechanism in [Mechanism::LAPLACE, Mechanism::WISHART_UNPROVEN] {
        let (spec, layout, honest) = checked_study((Centering::DpMean, mechanism), 0, &mut rng);
        let mut share = honest.clone();
        share.r_upper[0] += 16_000 * cq * cq;
        let err = checked_release(&spec, &layout, &share, &mut rng).expect_err("the probe");
        assert!(
            matches!(err, Implausible::Trace { .. }),
            "{mechanism:?}: {err}"
        );
    }
    // Without classes, the sum itself.
    let (spec, layout, honest) =
        checked_study((Centering::DpMean, Mechanism::GAUSSIAN), 0, &mut rng);
    let mut share = honest.clone();
    share.v[0] += 10_000 * cq;
    let err = checked_release(&spec, &layout, &share, &mut rng).expect_err("a long sum");
    assert!(matches!(err, Implausible::Sum { .. }), "{err}");
}
