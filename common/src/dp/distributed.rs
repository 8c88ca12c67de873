//! Noise the owners add: each owner draws an integer share of the study's noise
//! before it encrypts, so that the sum over owners carries it and no single party
//! (the proxy neither) has to be trusted to draw it.
//!
//! # Privacy contract
//! - **Neighbor relation**: the study's (`dp` module docs): one row replaced.
//! - **Sensitivity used**: each block's L2 sensitivity Delta_2 (`sensitivity`), as
//!   the [`super::Mechanism::GAUSSIAN`] plan calibrates it.
//! - **Guarantee**: h honest owners each add iid discrete Gaussians N_Z(0, s^2)
//!   to every released entry of a block of d entries. Their sum Z makes x + Z
//!   rho_h-zCDP with rho_h = eps_h^2 / 2,
//!   eps_h = min{ sqrt(Delta_2^2 / (h s^2) + tau d / 2), Delta_2 / (sqrt(h) s) + tau sqrt(d) },
//!   tau = 10 sum_{k=1}^{h-1} exp(-2 pi^2 s^2 k / (k + 1)) ([`ddg_rho`]). Shares
//!   added by anyone else (owners working with the adversary, the proxy) are
//!   independent of the honest shares, so they are post-processing and cost
//!   nothing. Each share is s^2 = max(ceil(sigma^2 / h_min), [`MIN_SHARE_VARIANCE`])
//!   for the block's planned sigma and h_min = min_owners - t
//!   ([`OwnerNoise::for_plan`]): with h >= h_min honest shares h s^2 >= sigma^2,
//!   so the first term is at most the block's planned 2 rho, and s^2 >= 100 makes
//!   tau d / 4 below 10^-420 d h, far under the 10^-9 relative pad every
//!   calibration rounds up by ([`super::noise`]). So the honest shares alone
//!   give the study's planned rho, and h shares give rho h_min / h.
//! - **Citation**: Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian
//!   Mechanism for Federated Learning with Secure Aggregation" (ICML 2021), the
//!   privacy of the sum of independent discrete Gaussians; the property test
//!   `dp::distributed::tests::the_bound_holds_for_exact_divergences` computes the
//!   Renyi divergences of such sums exactly and searches for a violation.
//! - **docs/PRIVACY.md**: "Noise from the owners".

use num_bigint::{BigInt, BigUint};
use rand::{CryptoRng, RngCore};

use super::noise::iid;
use super::sampler::{discrete_gaussian, Ratio};
use super::{NoisePlan, NoiseScale};

/// The least variance of one owner's share, grid units: it keeps the bound's tau
/// term below every rounding the calibrations allow for.
pub const MIN_SHARE_VARIANCE: u32 = 100;

/// The variance of one owner's noise share on each released block, for a study
/// whose owners add the noise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerNoise {
    /// s^2 of each entry of the matrix blocks, grid units.
    pub matrix_s2: BigUint,
    /// s^2 of each entry of the vector block.
    pub vector_s2: BigUint,
    /// The honest shares the variances are calibrated for, h_min = min_owners - t.
    pub honest_shares: u32,
}

/// The fewest honest shares a study is calibrated for: `min_owners - colluding`,
/// at least 1 (the spec refuses `colluding >= min_owners`).
pub fn honest_shares(min_owners: u32, colluding: u32) -> u32 {
    min_owners.saturating_sub(colluding).max(1)
}

impl OwnerNoise {
    /// Splits a Gaussian plan (sum variance sigma^2 per entry) over `honest`
    /// shares; `None` for a plan of another family.
    pub fn for_plan(plan: &NoisePlan, honest: u32) -> Option<Self> {
        let share = |scale: &NoiseScale| match scale {
            NoiseScale::Gaussian { sigma } => Some(share_variance(sigma, honest)),
            NoiseScale::Laplace { .. } | NoiseScale::Wishart { .. } | NoiseScale::None => None,
        };
        let matrix_s2 = share(&plan.matrix)?;
        let vector_s2 = match &plan.vector {
            Some(v) => share(v)?,
            None => matrix_s2.clone(),
        };
        Some(Self {
            matrix_s2,
            vector_s2,
            honest_shares: honest,
        })
    }

    /// One owner's share: `matrix` entries at the matrix variance, `vector` at the
    /// vector's, each within [`NoiseScale::tail_bound`] of its share (a draw
    /// beyond, probability below 2^-1000, is `None`).
    pub fn sample<R: RngCore + CryptoRng>(
        &self,
        matrix: usize,
        vector: usize,
        rng: &mut R,
    ) -> Option<(Vec<BigInt>, Vec<BigInt>)> {
        let draw = |s2: &BigUint, count: usize, rng: &mut R| {
            let ratio = Ratio::integer(s2.clone());
            let tail = share_scale(s2).tail_bound();
            let out = iid(count, rng, |r| discrete_gaussian(&ratio, r));
            out.iter().all(|e| e.magnitude() <= &tail).then_some(out)
        };
        let m = draw(&self.matrix_s2, matrix, rng)?;
        let v = draw(&self.vector_s2, vector, rng)?;
        Some((m, v))
    }

    /// The noise of the sum of `owners` shares as a plan: sub-Gaussian scales
    /// ceil(sqrt(owners s^2)) (a discrete Gaussian of variance s^2 is
    /// sub-Gaussian with parameter s, CKS20 Proposition 19, and independent
    /// sub-Gaussians add in squares), for tails, margins and noise floors.
    pub fn sum_plan(&self, base: &NoisePlan, owners: usize) -> NoisePlan {
        let sum = |s2: &BigUint| NoiseScale::Gaussian {
            sigma: ceil_sqrt(&(s2 * BigUint::from(owners.max(1)))),
        };
        NoisePlan {
            matrix: sum(&self.matrix_s2),
            vector: base.vector.as_ref().map(|_| sum(&self.vector_s2)),
            ..base.clone()
        }
    }
}

/// The sub-Gaussian scale of one share of variance `s2`.
fn share_scale(s2: &BigUint) -> NoiseScale {
    NoiseScale::Gaussian {
        sigma: ceil_sqrt(s2),
    }
}

/// max(ceil(sigma^2 / honest), [`MIN_SHARE_VARIANCE`]).
fn share_variance(sigma: &BigUint, honest: u32) -> BigUint {
    let h = BigUint::from(honest.max(1));
    let s2 = (sigma * sigma + &h - 1u32) / h;
    s2.max(BigUint::from(MIN_SHARE_VARIANCE))
}

/// ceil(sqrt(x)).
fn ceil_sqrt(x: &BigUint) -> BigUint {
    let r = x.sqrt();
    if &(&r * &r) < x {
        r + 1u32
    } else {
        r
    }
}

/// The zCDP rho of the sum of `h` iid discrete Gaussian shares of variance `s2`
/// each on a block of `dim` entries with L2 sensitivity `l2` (the contract's
/// eps_h^2 / 2).
pub fn ddg_rho(l2: f64, h: u32, s2: f64, dim: usize) -> f64 {
    let tau: f64 = (1..h)
        .map(|k| {
            let k = f64::from(k);
            (-2.0 * std::f64::consts::PI.powi(2) * s2 * k / (k + 1.0)).exp()
        })
        .sum::<f64>()
        * 10.0;
    let d = dim as f64;
    let hs2 = f64::from(h) * s2;
    let first = (l2 * l2 / hs2 + tau * d / 2.0).sqrt();
    let second = l2 / hs2.sqrt() + tau * d.sqrt();
    let eps = first.min(second);
    eps * eps / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use num_traits::ToPrimitive;
    use proptest::prelude::*;

    /// ln of the pmf of N_Z(0, s2) on [-half, half], normalized there.
    fn discrete_gaussian_log_pmf(s2: f64, half: i64) -> Vec<f64> {
        let w: Vec<f64> = (-half..=half)
            .map(|x| -(x * x) as f64 / (2.0 * s2))
            .collect();
        let total = log_sum_exp(w.iter().copied());
        w.into_iter().map(|p| p - total).collect()
    }

    fn log_sum_exp(xs: impl Iterator<Item = f64> + Clone) -> f64 {
        let max = xs.clone().fold(f64::NEG_INFINITY, f64::max);
        max + xs.map(|x| (x - max).exp()).sum::<f64>().ln()
    }

    /// The ln pmf of the sum of two independent variables given by theirs.
    fn convolve(a: &[f64], b: &[f64]) -> Vec<f64> {
        (0..a.len() + b.len() - 1)
            .map(|k| {
                let lo = k.saturating_sub(b.len() - 1);
                let hi = k.min(a.len() - 1);
                log_sum_exp((lo..=hi).map(|i| a[i] + b[k - i]))
            })
            .collect()
    }

    /// D_alpha(P || P shifted by `shift`) from P's ln pmf, in logs throughout:
    /// the divergence's mass sits (alpha - 1) shift below the mean, where the pmf
    /// underflows f64. The support is wide enough that what it leaves out does not
    /// show.
    fn renyi_shifted(lp: &[f64], shift: usize, alpha: f64) -> f64 {
        let terms = (shift..lp.len()).map(|x| alpha * lp[x] + (1.0 - alpha) * lp[x - shift]);
        log_sum_exp(terms) / (alpha - 1.0)
    }

    proptest! {
        /// The contract's bound on the sum of h discrete Gaussians, searched for
        /// a violation with exact Renyi divergences in one dimension, at small
        /// variances where tau is not negligible.
        #[test]
        fn the_bound_holds_for_exact_divergences(
            h in 1u32..5,
            s2_tenths in 3u32..40,
            shift in 1usize..4,
            alpha in prop::sample::select(vec![1.5f64, 2.0, 4.0, 8.0, 16.0]),
        ) {
            let s2 = f64::from(s2_tenths) / 10.0;
            // Wide enough to hold the divergence's mass, (alpha - 1) shift from 0.
            let half = (30.0 * s2.sqrt()).ceil() as i64 + 16 * shift as i64 + 8;
            let one = discrete_gaussian_log_pmf(s2, half);
            let mut sum = one.clone();
            for _ in 1..h {
                sum = convolve(&sum, &one);
            }
            let got = renyi_shifted(&sum, shift, alpha);
            let bound = alpha * ddg_rho(shift as f64, h, s2, 1);
            prop_assert!(got <= bound * (1.0 + 1e-9) + 1e-12, "D = {got} > {bound}");
        }

        /// The shares' calibration: h_min shares carry at least the planned
        /// variance, and the bound is then the planned rho to within the pad.
        #[test]
        fn calibrated_shares_give_the_planned_rho(
            sigma in 10u64..1u64 << 40,
            min_owners in 1u32..50,
            colluding in 0u32..50,
        ) {
            prop_assume!(colluding < min_owners);
            let h = honest_shares(min_owners, colluding);
            let s2 = share_variance(&BigUint::from(sigma), h);
            let sigma2 = BigUint::from(sigma) * sigma;
            prop_assert!(&s2 * BigUint::from(h) >= sigma2);
            let l2 = 1000.0;
            let planned = l2 * l2 / (2.0 * (sigma as f64).powi(2));
            let got = ddg_rho(l2, h, s2.to_f64().unwrap_or(f64::INFINITY), 500_000);
            prop_assert!(got <= planned * (1.0 + 1e-9), "{got} > {planned}");
        }
    }

    #[test]
    fn a_share_sum_plan_adds_in_squares() {
        let plan = NoisePlan {
            matrix: NoiseScale::Gaussian {
                sigma: BigUint::from(1000u32),
            },
            vector: Some(NoiseScale::Gaussian {
                sigma: BigUint::from(300u32),
            }),
            rho: Some(0.1),
            epsilon: 1.0,
            delta: 1e-6,
        };
        let shares = OwnerNoise::for_plan(&plan, 4).expect("gaussian");
        assert_eq!(shares.matrix_s2, BigUint::from(250_000u32));
        assert_eq!(shares.vector_s2, BigUint::from(22_500u32));
        let four = shares.sum_plan(&plan, 4);
        assert_eq!(four.matrix, plan.matrix);
        assert_eq!(four.vector, plan.vector);
        let nine = shares.sum_plan(&plan, 9);
        assert_eq!(nine.matrix.grid_parameter(), BigUint::from(1500u32));
    }
}
