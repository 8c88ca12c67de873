//! Differential privacy: mechanisms, their sensitivities, calibration and exact
//! sampling of symmetric noise on the fixed-point grid.
//!
//! # Neighbor relation
//! Bounded DP, as in DPDP-PCA: two pooled tables are neighbors when they have the
//! same number of rows N (public) and differ in one row, replaced by another. Every
//! encoded row obeys ||x~||_2 <= Cq = floor(C 2^f) exactly (see `encoding`).
//!
//! # What is released
//! - `mask` centering (the paper's): the user learns N S~ + E' where
//!   S~ = R~ - v~ v~^T / N is the centered scatter on the grid (N S~ is an integer
//!   matrix) and E' is symmetric integer noise; v is hidden by a uniform mask. The
//!   noise is calibrated to the sensitivity of N S~ and sampled at that scale, never
//!   as N times a smaller sample: N E would make T - v' v'^T = -v v^T (mod N) and
//!   hand the user v v^T mod N in clear (see docs/PRIVACY.md).
//! - `dp-mean` centering: the user learns R~ + E_R and v~ + e_v, with the budget
//!   split between them (90% to R, which carries most of the signal).
//!
//! # Sensitivities (grid units, derivations in docs/PRIVACY.md)
//! Replacing row x by x' with mu_o the mean of the other N - 1 rows,
//! dS = ((N-1)/N) (a a^T - b b^T), a = x' - mu_o, b = x - mu_o, and
//! ||a a^T - b b^T||_F^2 = (|p|^2 |q|^2 + (p.q)^2) / 2 with p = a - b = x' - x and
//! q = a + b = x + x' - 2 mu_o (expand (p q^T + q p^T) / 2). Every point lies in the
//! ball of radius Cq (mu_o as an average), so with Cq = 1 after scaling:
//! |p|^2 |q|^2 + (p.q)^2 <= 32, hence Delta_2(S) = 4 Cq^2 (N - 1) / N < 4 Cq^2, and
//! the bound is attained in the limit (x' = -x = mu_o on the sphere). The proof,
//! step by step in docs/PRIVACY.md: split s = x + x' and mu_o along and across p
//! (sigma, tau; m1, m2 with m1^2 + m2^2 <= 1); |x|, |x'| <= 1 give
//! (sigma + rho)^2 + tau^2 <= 4 with rho = |p|; the quantity is at most
//! rho^2 (2 (sigma + 2 m1)^2 + (tau + 2 m2)^2); 4 tau m2 <= tau^2 + 4 m2^2 turns it
//! into rho^2 (16 - 2 rho^2 + 4 sigma (2 - rho)) <= 2 (rho (4 - rho))^2 <= 32.
//! The released upper triangle has L2 norm at most ||dS||_F.
//! - L1 of the upper triangle of S: 4 (M + 1) Cq^2 (each rank-one term a a^T has
//!   upper-triangle L1 norm <= (M + 1) |a|^2 / 2 and |a| <= 2 Cq).
//! - trace of S (Wishart): |tr dS| <= |a|^2 and |b|^2 <= 4 Cq^2.
//! - R: Delta_2 = sqrt(2) Cq^2, Delta_1 = (M + 1) Cq^2, trace Cq^2.
//! - v: Delta_2 = 2 Cq, Delta_1 = 2 sqrt(M) Cq.
//!
//! # Classification studies (PCA-Gauss Algorithm 3)
//! Rows carry a class; the released blocks are the class sums v~_c, the scaled counts
//! Cq N_c, and either the total R~ (shared covariance) or every R~_c. The replace-one
//! neighbor may change the row's class, from c to c'. Then:
//! - stacked class sums and scaled counts change by (-x in block c, +x' in block c',
//!   -Cq and +Cq in the counts): squared L2 norm |x|^2 + |x'|^2 + 2 Cq^2 <= 4 Cq^2,
//!   the same 2 Cq as v (within one class the change is x' - x, again <= 2 Cq and the
//!   counts do not move). L1: |x|_1 + |x'|_1 + 2 Cq <= 2 (sqrt(M) + 1) Cq.
//! - stacked R~_c change by -x x^T in block c and +x' x'^T in block c': squared
//!   Frobenius norm |x|^4 + |x'|^4 <= 2 Cq^4, the same sqrt(2) Cq^2 as R~ (upper
//!   triangles: no more). L1 of the upper triangles: (M + 1)(|x|^2 + |x'|^2) / 2
//!   <= (M + 1) Cq^2, as for R~. The total R~ does not see the class at all.
//!
//! # Projected studies (the second round of PCA-Gauss)
//! With k public orthonormal axes W (Pub-PCA, or the components of an earlier
//! study), owners release R of the projected rows W^T x beside the sums of the full
//! rows. Since |W^T x| <= |x| <= Cq (re-clipped before encoding), every bound above
//! holds with M replaced by k for the matrix block: Delta_1 of R becomes (k + 1) Cq^2
//! instead of (M + 1) Cq^2, the Laplace mechanism's gain the paper calls quadratic
//! (its noise spreads over k (k + 1) / 2 entries instead of M (M + 1) / 2). The
//! Gaussian's Delta_2 does not depend on the dimension.
//!
//! So a classification study costs exactly the privacy of an unlabelled `dp-mean`
//! study, with Delta_1 of the vector block raised to 2 (sqrt(M) + 1) Cq. Disjoint
//! classes are not "parallel composition" for free: the sensitivities above are what
//! accounts for the row that moves. The Wishart mechanism is refused with classes (its
//! trace argument would need |x|^2 + |x'|^2).

pub mod sampler;

use num_bigint::{BigInt, BigUint};
use num_traits::{FromPrimitive, ToPrimitive, Zero};
use rand::{CryptoRng, RngCore};
use serde::{Deserialize, Serialize};

use sampler::{discrete_gaussian, discrete_laplace, Ratio};

/// Share of the budget given to R in `dp-mean` centering (the rest goes to v).
pub const DP_MEAN_MATRIX_SHARE: f64 = 0.9;

/// Share of the budget given to the matrix in a classification study under the
/// Gaussian mechanisms: the class means carry the classes apart, so they get more
/// than the global mean does.
pub const CLASS_MATRIX_SHARE: f64 = 0.5;

/// Share of the budget given to the matrix in a classification study under the
/// Laplace mechanism. Its L1 sensitivity grows with M for the matrix, (M + 1) C^2,
/// but with sqrt(M) for the class sums, so at a given budget the matrix is much the
/// noisier of the two and the class means, which carry the classes apart, buy more
/// accuracy per unit of budget. Chosen from {0.1, 0.25, 0.5} with the synthetic
/// bench on optdigits and letter (README, "Synthetic data"; pca-gauss accuracy at
/// epsilon 0.5, 1, 2): 0.5 was the worst in 4 of the 6 settings; 0.1 the best at
/// epsilon 0.5 but the worst on letter at 1 and 2, whose 16-dimensional covariance
/// is worth its budget; 0.25 was within 0.045 of the best everywhere.
pub const LAPLACE_CLASS_MATRIX_SHARE: f64 = 0.25;

/// Errors of privacy parameters.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DpError {
    /// epsilon must be positive and finite.
    #[error("epsilon must be a positive finite number, got {0}")]
    BadEpsilon(f64),
    /// delta must be in (0, 1) (or 0 for the pure mechanisms).
    #[error("delta must be in (0, 1), got {0}")]
    BadDelta(f64),
    /// The classic Gaussian calibration holds only for epsilon < 1.
    #[error("the classic Analyze-Gauss calibration is valid only for epsilon < 1 (got {0}); use the default `gaussian` (zCDP) calibration")]
    ClassicNeedsSmallEpsilon(f64),
    /// Unknown mechanism name.
    #[error("unknown mechanism `{0}` (expected gaussian, gaussian-classic, laplace or wishart-unproven)")]
    UnknownMechanism(String),
    /// Unknown centering name.
    #[error("unknown centering `{0}` (expected mask or dp-mean)")]
    UnknownCentering(String),
    /// A budget share outside (0, 1).
    #[error("a share of the budget must be strictly between 0 and 1, got {0}")]
    BadShare(f64),
}

/// The noise mechanism the proxy adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mechanism {
    /// Discrete Gaussian calibrated through zCDP (CKS20): rho = Delta^2 / (2 sigma^2),
    /// converted to (epsilon, delta) exactly by CKS20 Corollary 13. Valid for every
    /// epsilon. The default.
    Gaussian,
    /// Discrete Gaussian with the classic Analyze-Gauss calibration
    /// sigma = Delta sqrt(2 ln(1.25 / delta)) / epsilon, valid for epsilon < 1 only
    /// (and never below the zCDP sigma, whose proof covers the discrete sampler).
    GaussianClassic,
    /// Discrete Laplace on the upper triangle (Lap-PCA): (epsilon, 0)-DP.
    Laplace,
    /// Wishart noise E = Z Z^T (Imtiaz & Sarwate SN). NOT proven private: its proof
    /// needs Y - A' inside the Wishart support for every neighbor A', which fails when
    /// A - A' has a negative eigenvalue (why diffprivlib removed it). Opt-in only.
    WishartUnproven,
}

impl Mechanism {
    /// Every mechanism, in the order of the registry.
    pub fn all() -> &'static [Mechanism] {
        &[
            Self::Gaussian,
            Self::GaussianClassic,
            Self::Laplace,
            Self::WishartUnproven,
        ]
    }

    /// Parses the CLI/wire name.
    pub fn parse(name: &str) -> Result<Self, DpError> {
        match name {
            "gaussian" => Ok(Self::Gaussian),
            "gaussian-classic" => Ok(Self::GaussianClassic),
            "laplace" => Ok(Self::Laplace),
            "wishart-unproven" => Ok(Self::WishartUnproven),
            other => Err(DpError::UnknownMechanism(other.to_string())),
        }
    }

    /// The CLI/wire name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Gaussian => "gaussian",
            Self::GaussianClassic => "gaussian-classic",
            Self::Laplace => "laplace",
            Self::WishartUnproven => "wishart-unproven",
        }
    }

    /// Whether the mechanism uses delta.
    pub fn uses_delta(&self) -> bool {
        matches!(self, Self::Gaussian | Self::GaussianClassic)
    }
}

/// How v is kept from the user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Centering {
    /// The paper's: v masked by a uniform b, noise on the centered scatter.
    Mask,
    /// v released with its own DP noise, R with symmetric noise.
    DpMean,
}

impl Centering {
    /// Parses the CLI/wire name.
    pub fn parse(name: &str) -> Result<Self, DpError> {
        match name {
            "mask" => Ok(Self::Mask),
            "dp-mean" => Ok(Self::DpMean),
            other => Err(DpError::UnknownCentering(other.to_string())),
        }
    }

    /// The CLI/wire name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Mask => "mask",
            Self::DpMean => "dp-mean",
        }
    }
}

/// A validated privacy request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrivacyRequest {
    /// Mechanism.
    pub mechanism: Mechanism,
    /// Centering mode.
    pub centering: Centering,
    /// Target epsilon.
    pub epsilon: f64,
    /// Target delta (ignored by the pure mechanisms).
    pub delta: f64,
}

impl PrivacyRequest {
    /// Validates epsilon and delta for the mechanism.
    pub fn new(
        mechanism: Mechanism,
        centering: Centering,
        epsilon: f64,
        delta: f64,
    ) -> Result<Self, DpError> {
        if !(epsilon.is_finite() && epsilon > 0.0) {
            return Err(DpError::BadEpsilon(epsilon));
        }
        if !(delta > 0.0 && delta < 1.0) {
            return Err(DpError::BadDelta(delta));
        }
        if mechanism == Mechanism::GaussianClassic && epsilon >= 1.0 {
            return Err(DpError::ClassicNeedsSmallEpsilon(epsilon));
        }
        Ok(Self {
            mechanism,
            centering,
            epsilon,
            delta,
        })
    }
}

/// Sensitivities of the released statistics, in grid units, for one row bound Cq and
/// dimension M. See the module docs for the derivations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sensitivity {
    /// L2 (Frobenius) sensitivity of the centered scatter S~.
    pub s_l2: f64,
    /// L1 sensitivity of the upper triangle of S~.
    pub s_l1: f64,
    /// Trace sensitivity of S~.
    pub s_trace: f64,
    /// L2 sensitivity of R~.
    pub r_l2: f64,
    /// L1 sensitivity of the upper triangle of R~.
    pub r_l1: f64,
    /// Trace sensitivity of R~.
    pub r_trace: f64,
    /// L2 sensitivity of v~.
    pub v_l2: f64,
    /// L1 sensitivity of v~ (of the class block, in a classification study).
    pub v_l1: f64,
}

impl Sensitivity {
    /// Sensitivities of a classification study's blocks (see the module docs): only
    /// the vector block's L1 grows, by the two moved counts.
    pub fn with_classes(cq: u64, dim: usize) -> Self {
        Self::for_blocks(cq, dim, dim, true)
    }

    /// Sensitivities when the matrix block has `matrix_dim` dimensions and the vector
    /// block `vector_dim` (a projected study: R of the rows projected onto k public
    /// axes, which keep |W^T x| <= Cq, beside the sums of the M-dimensional rows).
    pub fn for_blocks(cq: u64, matrix_dim: usize, vector_dim: usize, classes: bool) -> Self {
        let matrix = Self::new(cq, matrix_dim);
        let vector = Self::new(cq, vector_dim);
        let moved_counts = if classes { 2.0 * cq as f64 } else { 0.0 };
        Self {
            v_l2: vector.v_l2,
            v_l1: vector.v_l1 + moved_counts,
            ..matrix
        }
    }

    /// Sensitivities for rows of integer norm at most `cq` in `dim` dimensions.
    pub fn new(cq: u64, dim: usize) -> Self {
        let c = cq as f64;
        let c2 = c * c;
        let m = dim as f64;
        Self {
            s_l2: 4.0 * c2,
            s_l1: 4.0 * (m + 1.0) * c2,
            s_trace: 4.0 * c2,
            r_l2: 2f64.sqrt() * c2,
            r_l1: (m + 1.0) * c2,
            r_trace: c2,
            v_l2: 2.0 * c,
            v_l1: 2.0 * m.sqrt() * c,
        }
    }
}

/// Noise distribution of one released block, on the integer grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoiseScale {
    /// Discrete Gaussian with sigma^2 = sigma^2 (integer sigma).
    Gaussian {
        /// sigma in grid units.
        sigma: BigUint,
    },
    /// Discrete Laplace with scale t.
    Laplace {
        /// Scale in grid units.
        t: BigUint,
    },
    /// Wishart: E = Z Z^T with Z of `cols` columns of iid discrete Gaussians.
    Wishart {
        /// Variance of each entry of Z, grid units (sigma_z^2, an integer).
        sigma_z2: BigUint,
        /// Columns of Z (M + 1).
        cols: usize,
    },
    /// No noise: test-only path, refused by the proxy unless explicitly enabled.
    None,
}

impl NoiseScale {
    /// A magnitude no sample will exceed except with probability below 2^-1000
    /// (Gaussian: 2^10 sigma; Laplace: 2^10 t; Wishart: (M+1) (2^6 sigma_z)^2).
    pub fn tail_bound(&self) -> BigUint {
        match self {
            Self::Gaussian { sigma } => sigma << 10usize,
            Self::Laplace { t } => t << 10usize,
            Self::Wishart { sigma_z2, cols } => (sigma_z2 << 12usize) * BigUint::from(*cols as u64),
            Self::None => BigUint::zero(),
        }
    }

    /// The mechanism's own parameter on the grid, exactly: sigma (Gaussian), t
    /// (Laplace), sigma_z^2 (Wishart), 0 (none).
    pub fn grid_parameter(&self) -> BigUint {
        match self {
            Self::Gaussian { sigma } => sigma.clone(),
            Self::Laplace { t } => t.clone(),
            Self::Wishart { sigma_z2, .. } => sigma_z2.clone(),
            Self::None => BigUint::zero(),
        }
    }

    /// Standard deviation of one entry, grid units, as f64 (for reports).
    pub fn std_dev(&self) -> f64 {
        match self {
            Self::Gaussian { sigma } => sigma.to_f64().unwrap_or(f64::INFINITY),
            Self::Laplace { t } => 2f64.sqrt() * t.to_f64().unwrap_or(f64::INFINITY),
            Self::Wishart { sigma_z2, cols } => {
                // Off-diagonal entries of Z Z^T have variance cols * sigma_z^4.
                sigma_z2.to_f64().unwrap_or(f64::INFINITY) * (*cols as f64).sqrt()
            }
            Self::None => 0.0,
        }
    }

    /// Samples the upper triangle (row-major, i <= j) of a symmetric dim x dim noise
    /// matrix. Gaussian and Laplace entries are iid; Wishart entries are those of Z Z^T.
    pub fn sample_upper<R: RngCore + CryptoRng>(&self, dim: usize, rng: &mut R) -> Vec<BigInt> {
        let count = dim * (dim + 1) / 2;
        match self {
            Self::Gaussian { sigma } => {
                let s2 = Ratio::integer(sigma * sigma);
                (0..count).map(|_| discrete_gaussian(&s2, rng)).collect()
            }
            Self::Laplace { t } => (0..count).map(|_| discrete_laplace(t, rng)).collect(),
            Self::Wishart { sigma_z2, cols } => {
                let s2 = Ratio::integer(sigma_z2.clone());
                let z: Vec<Vec<BigInt>> = (0..dim)
                    .map(|_| (0..*cols).map(|_| discrete_gaussian(&s2, rng)).collect())
                    .collect();
                let mut out = Vec::with_capacity(count);
                for i in 0..dim {
                    for j in i..dim {
                        out.push(z[i].iter().zip(&z[j]).map(|(a, b)| a * b).sum());
                    }
                }
                out
            }
            Self::None => vec![BigInt::zero(); count],
        }
    }

    /// Samples a vector of iid entries (Gaussian or Laplace).
    pub fn sample_vector<R: RngCore + CryptoRng>(&self, dim: usize, rng: &mut R) -> Vec<BigInt> {
        match self {
            Self::Gaussian { sigma } => {
                let s2 = Ratio::integer(sigma * sigma);
                (0..dim).map(|_| discrete_gaussian(&s2, rng)).collect()
            }
            Self::Laplace { t } => (0..dim).map(|_| discrete_laplace(t, rng)).collect(),
            Self::Wishart { .. } | Self::None => vec![BigInt::zero(); dim],
        }
    }
}

/// The noise of one study: for the matrix block and, in `dp-mean`, the vector block.
#[derive(Clone, Debug, PartialEq)]
pub struct NoisePlan {
    /// Noise on the released matrix (N S~ in `mask`, R~ in `dp-mean`).
    pub matrix: NoiseScale,
    /// Noise on v~ (`dp-mean` only).
    pub vector: Option<NoiseScale>,
    /// zCDP rho spent, when the mechanism is accounted in zCDP.
    pub rho: Option<f64>,
    /// epsilon spent.
    pub epsilon: f64,
    /// delta spent (0 for pure mechanisms).
    pub delta: f64,
}

/// A scale of at least 2^this is a calibration that overflowed f64: every finite
/// f64 is below 2^1024.
pub const OVERFLOWED_SCALE_BITS: u64 = 1025;

/// Rounds a positive scale up to an integer, exactly at any magnitude; rounding up
/// only adds noise. The tiny relative pad absorbs the f64 rounding of the
/// calibration arithmetic. A scale that overflowed f64 (or is NaN) becomes 2^1024,
/// more noise than any finite scale, which [`NoisePlan::overflowed`] reports and
/// the study spec refuses: never less noise than the accounting charges for.
pub(crate) fn ceil_big(x: f64) -> BigUint {
    let overflowed = || BigUint::from(1u8) << (OVERFLOWED_SCALE_BITS - 1);
    if x.is_nan() {
        // `max` below would turn NaN into 1: the least noise, never that.
        return overflowed();
    }
    let padded = x * (1.0 + 1e-9);
    BigUint::from_f64(padded.ceil().max(1.0)).unwrap_or_else(overflowed)
}

impl NoisePlan {
    /// Whether a scale of the plan overflowed f64 in its calibration (the request
    /// cannot be met with numbers this code represents: refuse it).
    pub fn overflowed(&self) -> bool {
        std::iter::once(&self.matrix)
            .chain(self.vector.as_ref())
            .any(|s| s.grid_parameter().bits() >= OVERFLOWED_SCALE_BITS)
    }
}

/// Plans the noise of a study whose pooled table has `n_rows` rows, in `dim`
/// dimensions with integer row bound `cq`; `classes` for a classification study
/// (`dp-mean` only, never Wishart: [`crate::study::StudySpec`] refuses the rest).
pub fn plan_noise(
    req: &PrivacyRequest,
    dim: usize,
    cq: u64,
    n_rows: u64,
    classes: bool,
) -> NoisePlan {
    plan_noise_blocks(req, dim, dim, cq, n_rows, classes)
}

/// As [`plan_noise`], for a matrix block of `matrix_dim` dimensions beside a vector
/// block of `vector_dim` (a projected study, `dp-mean` only).
pub fn plan_noise_blocks(
    req: &PrivacyRequest,
    matrix_dim: usize,
    vector_dim: usize,
    cq: u64,
    n_rows: u64,
    classes: bool,
) -> NoisePlan {
    let dim = matrix_dim;
    let sens = Sensitivity::for_blocks(cq, matrix_dim, vector_dim, classes);
    let n = n_rows as f64;
    match req.centering {
        Centering::Mask => {
            // The released integer query is N S~: every sensitivity scales by N.
            let (matrix, rho, delta) = match req.mechanism {
                Mechanism::Gaussian => {
                    let rho = rho_for(req.epsilon, req.delta);
                    let sigma = n * sens.s_l2 / (2.0 * rho).sqrt();
                    (
                        NoiseScale::Gaussian {
                            sigma: ceil_big(sigma),
                        },
                        Some(rho),
                        req.delta,
                    )
                }
                Mechanism::GaussianClassic => {
                    // Analyze-Gauss is proven for the continuous Gaussian; never going
                    // below the zCDP sigma keeps the discrete sampler covered by CKS20.
                    let tight = 1.0 / (2.0 * rho_for(req.epsilon, req.delta)).sqrt();
                    let sigma = n * sens.s_l2 * classic_factor(req.epsilon, req.delta).max(tight);
                    (
                        NoiseScale::Gaussian {
                            sigma: ceil_big(sigma),
                        },
                        None,
                        req.delta,
                    )
                }
                Mechanism::Laplace => {
                    let t = n * sens.s_l1 / req.epsilon;
                    (NoiseScale::Laplace { t: ceil_big(t) }, None, 0.0)
                }
                Mechanism::WishartUnproven => {
                    // Density ratio exp(eps_w |tr dY|) with Sigma = Delta_tr / (2 eps) I
                    // for Y = N S~: Delta_tr scales by N; Z entries have that variance.
                    let var = n * sens.s_trace / (2.0 * req.epsilon);
                    (
                        NoiseScale::Wishart {
                            sigma_z2: ceil_big(var),
                            cols: dim + 1,
                        },
                        None,
                        0.0,
                    )
                }
            };
            NoisePlan {
                matrix,
                vector: None,
                rho,
                epsilon: req.epsilon,
                delta,
            }
        }
        Centering::DpMean => {
            let share = matrix_share(req.mechanism, classes);
            match req.mechanism {
                Mechanism::Gaussian => {
                    let rho = rho_for(req.epsilon, req.delta);
                    let sigma_r = sens.r_l2 / (2.0 * share * rho).sqrt();
                    let sigma_v = sens.v_l2 / (2.0 * (1.0 - share) * rho).sqrt();
                    NoisePlan {
                        matrix: NoiseScale::Gaussian {
                            sigma: ceil_big(sigma_r),
                        },
                        vector: Some(NoiseScale::Gaussian {
                            sigma: ceil_big(sigma_v),
                        }),
                        rho: Some(rho),
                        epsilon: req.epsilon,
                        delta: req.delta,
                    }
                }
                Mechanism::GaussianClassic => {
                    // Basic composition: (share eps, delta/2) + ((1-share) eps, delta/2),
                    // never below the zCDP split's sigmas (see the `mask` case).
                    let rho = rho_for(req.epsilon, req.delta);
                    let sigma_r = sens.r_l2
                        * classic_factor(share * req.epsilon, req.delta / 2.0)
                            .max(1.0 / (2.0 * share * rho).sqrt());
                    let sigma_v = sens.v_l2
                        * classic_factor((1.0 - share) * req.epsilon, req.delta / 2.0)
                            .max(1.0 / (2.0 * (1.0 - share) * rho).sqrt());
                    NoisePlan {
                        matrix: NoiseScale::Gaussian {
                            sigma: ceil_big(sigma_r),
                        },
                        vector: Some(NoiseScale::Gaussian {
                            sigma: ceil_big(sigma_v),
                        }),
                        rho: None,
                        epsilon: req.epsilon,
                        delta: req.delta,
                    }
                }
                Mechanism::Laplace => NoisePlan {
                    matrix: NoiseScale::Laplace {
                        t: ceil_big(sens.r_l1 / (share * req.epsilon)),
                    },
                    vector: Some(NoiseScale::Laplace {
                        t: ceil_big(sens.v_l1 / ((1.0 - share) * req.epsilon)),
                    }),
                    rho: None,
                    epsilon: req.epsilon,
                    delta: 0.0,
                },
                Mechanism::WishartUnproven => NoisePlan {
                    matrix: NoiseScale::Wishart {
                        sigma_z2: ceil_big(sens.r_trace / (2.0 * share * req.epsilon)),
                        cols: dim + 1,
                    },
                    vector: Some(NoiseScale::Laplace {
                        t: ceil_big(sens.v_l1 / ((1.0 - share) * req.epsilon)),
                    }),
                    rho: None,
                    epsilon: req.epsilon,
                    delta: 0.0,
                },
            }
        }
    }
}

/// The share of the budget the matrix block gets in `dp-mean` centering.
pub fn matrix_share(mechanism: Mechanism, classes: bool) -> f64 {
    match (classes, mechanism) {
        (false, _) => DP_MEAN_MATRIX_SHARE,
        (true, Mechanism::Laplace) => LAPLACE_CLASS_MATRIX_SHARE,
        (true, _) => CLASS_MATRIX_SHARE,
    }
}

/// What one released block of a study spends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetPart {
    /// The block and what it serves.
    pub part: String,
    /// epsilon of this block alone (at `delta` for the Gaussian mechanisms).
    pub epsilon: f64,
    /// delta of this block alone.
    pub delta: f64,
    /// zCDP rho of this block (zCDP-accounted Gaussian only).
    pub rho: Option<f64>,
}

/// The privacy a study spends, block by block, and composed. The default is the
/// ledger of a study that released nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetLedger {
    /// One entry per released block; everything derived later (PCA, synthetic data)
    /// is post-processing and spends nothing.
    pub parts: Vec<BudgetPart>,
    /// epsilon of the whole release: zCDP composition (rho adds) for `gaussian`,
    /// basic composition otherwise.
    pub epsilon: f64,
    /// delta of the whole release.
    pub delta: f64,
    /// Total zCDP rho (zCDP-accounted Gaussian only).
    pub rho: Option<f64>,
}

/// The smallest epsilon at which a rho-zCDP mechanism is (epsilon, delta)-DP.
pub fn epsilon_for(rho: f64, delta: f64) -> f64 {
    let (mut lo, mut hi) = (
        0.0f64,
        2.0 * rho + 4.0 * (rho * (1.0 / delta).ln()).sqrt() + 1.0,
    );
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if zcdp_delta(rho, mid) <= delta {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The budget ledger of a study: how `req` is split between the released blocks and
/// what the parts compose to (never more than asked; a test checks it).
pub fn budget_ledger(req: &PrivacyRequest, classes: bool) -> BudgetLedger {
    let names: Vec<(&str, f64)> = match req.centering {
        Centering::Mask => vec![("centered scatter N S (PCA, covariance)", 1.0)],
        Centering::DpMean if classes => {
            let share = matrix_share(req.mechanism, true);
            vec![
                ("second moments R or R_c (PCA, class covariances)", share),
                (
                    "class sums and counts (class means, proportions)",
                    1.0 - share,
                ),
            ]
        }
        Centering::DpMean => {
            let share = matrix_share(req.mechanism, false);
            vec![
                ("second moments R (PCA, covariance)", share),
                ("sum v (DP mean)", 1.0 - share),
            ]
        }
    };
    let split_delta = req.delta / names.len() as f64;
    let parts: Vec<BudgetPart> = names
        .iter()
        .map(|&(part, share)| match req.mechanism {
            Mechanism::Gaussian => {
                let rho = share * rho_for(req.epsilon, req.delta);
                BudgetPart {
                    part: part.into(),
                    epsilon: epsilon_for(rho, req.delta),
                    delta: req.delta,
                    rho: Some(rho),
                }
            }
            Mechanism::GaussianClassic => BudgetPart {
                part: part.into(),
                epsilon: share * req.epsilon,
                delta: split_delta,
                rho: None,
            },
            Mechanism::Laplace | Mechanism::WishartUnproven => BudgetPart {
                part: part.into(),
                epsilon: share * req.epsilon,
                delta: 0.0,
                rho: None,
            },
        })
        .collect();
    compose(parts)
}

/// What released blocks compose to: zCDP when every part is accounted in rho (rho
/// adds, converted once at the parts' delta), basic composition otherwise (epsilon
/// and delta add).
fn compose(parts: Vec<BudgetPart>) -> BudgetLedger {
    let rhos: Option<Vec<f64>> = parts.iter().map(|p| p.rho).collect();
    match rhos {
        Some(rhos) if !rhos.is_empty() => {
            let rho: f64 = rhos.iter().sum();
            let delta = parts.iter().map(|p| p.delta).fold(0.0, f64::max);
            BudgetLedger {
                epsilon: epsilon_for(rho, delta),
                delta,
                rho: Some(rho),
                parts,
            }
        }
        _ => BudgetLedger {
            epsilon: parts.iter().map(|p| p.epsilon).sum(),
            delta: parts.iter().map(|p| p.delta).sum(),
            rho: None,
            parts,
        },
    }
}

/// Splits a request into two studies that compose to exactly it: `share` of the
/// zCDP rho and the rest (Gaussian, both at the request's delta, which the composed
/// rho meets); `share` of epsilon and of delta and the rest (basic composition, for
/// the others).
pub fn split_request(
    req: &PrivacyRequest,
    share: f64,
) -> Result<(PrivacyRequest, PrivacyRequest), DpError> {
    if !(share > 0.0 && share < 1.0) {
        return Err(DpError::BadShare(share));
    }
    let part = |s: f64| match req.mechanism {
        Mechanism::Gaussian => PrivacyRequest::new(
            req.mechanism,
            req.centering,
            epsilon_for(s * rho_for(req.epsilon, req.delta), req.delta),
            req.delta,
        ),
        Mechanism::GaussianClassic => {
            PrivacyRequest::new(req.mechanism, req.centering, s * req.epsilon, s * req.delta)
        }
        _ => PrivacyRequest::new(req.mechanism, req.centering, s * req.epsilon, req.delta),
    };
    Ok((part(share)?, part(1.0 - share)?))
}

impl BudgetLedger {
    /// The ledger of two studies run one after the other on the same rows: the parts
    /// of both (named with their study), composed as [`budget_ledger`] composes
    /// parts (rho adds for `gaussian`; epsilon and delta add otherwise).
    pub fn then(self, first_name: &str, next: BudgetLedger, next_name: &str) -> BudgetLedger {
        let name = |study: &str, p: BudgetPart| BudgetPart {
            part: format!("{study}: {}", p.part),
            ..p
        };
        compose(
            self.parts
                .into_iter()
                .map(|p| name(first_name, p))
                .chain(next.parts.into_iter().map(|p| name(next_name, p)))
                .collect(),
        )
    }
}

/// sqrt(2 ln(1.25 / delta)) / epsilon: the Analyze-Gauss factor (epsilon < 1).
pub fn classic_factor(epsilon: f64, delta: f64) -> f64 {
    (2.0 * (1.25 / delta).ln()).sqrt() / epsilon
}

/// delta of a rho-zCDP mechanism at epsilon (CKS20 Corollary 13):
/// inf over alpha > 1 of exp((alpha - 1)(alpha rho - eps)) / alpha * (1 - 1/alpha)^(alpha - 1).
pub fn zcdp_delta(rho: f64, epsilon: f64) -> f64 {
    let log_delta = |alpha: f64| {
        (alpha - 1.0) * (alpha * rho - epsilon) - alpha.ln()
            + (alpha - 1.0) * (1.0 - 1.0 / alpha).ln()
    };
    // The objective is unimodal in alpha; golden-section search on log(alpha - 1).
    let (mut lo, mut hi) = ((1e-9f64).ln(), (1e6f64).ln());
    let phi = 0.5 * (5f64.sqrt() - 1.0);
    let f = |t: f64| log_delta(1.0 + t.exp());
    for _ in 0..200 {
        let a = hi - phi * (hi - lo);
        let b = lo + phi * (hi - lo);
        if f(a) < f(b) {
            hi = b;
        } else {
            lo = a;
        }
    }
    f(0.5 * (lo + hi)).exp().min(1.0)
}

/// The largest rho whose zCDP guarantee implies (epsilon, delta)-DP.
pub fn rho_for(epsilon: f64, delta: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, epsilon.max(1.0) * 4.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if zcdp_delta(mid, epsilon) <= delta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests;
