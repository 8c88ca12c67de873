//! The noise of a study: the distribution of each released block on the integer
//! grid, calibrated by the study's mechanism, and exact sampling from it.

use num_bigint::{BigInt, BigUint};
use num_traits::{FromPrimitive, ToPrimitive, Zero};
use rand::{CryptoRng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;

use crate::arith::random_seed;

use super::sampler::{discrete_gaussian, discrete_laplace, Ratio};
use super::{Block, Centering, Mechanism, Part, PrivacyRequest, Sensitivity, Shape};

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

    /// A magnitude that one draw exceeds on a given side with probability at
    /// most `p`, grid units: sigma sqrt(2 ln(1/p)) for the Gaussian (the discrete
    /// Gaussian is sub-Gaussian with parameter sigma, CKS20 Proposition 19, so
    /// Chernoff's bound holds), t ln(1/p) for the Laplace (P(X >= k) <= e^(-k/t)
    /// for the discrete Laplace), 0 without noise; infinite for Wishart, whose
    /// entries this bound does not cover.
    pub fn exceedance(&self, p: f64) -> f64 {
        let log = (1.0 / p.clamp(f64::MIN_POSITIVE, 1.0)).ln();
        match self {
            Self::Gaussian { sigma } => {
                sigma.to_f64().unwrap_or(f64::INFINITY) * (2.0 * log).sqrt()
            }
            Self::Laplace { t } => t.to_f64().unwrap_or(f64::INFINITY) * log,
            Self::Wishart { .. } => f64::INFINITY,
            Self::None => 0.0,
        }
    }

    /// Samples the upper triangle (row-major, i <= j) of a symmetric dim x dim noise
    /// matrix. Gaussian and Laplace entries are iid; Wishart entries are those of Z Z^T.
    /// The draws run on the pool (`iid`): which values come out depends on `rng`
    /// alone, not on the number of threads.
    pub fn sample_upper<R: RngCore + CryptoRng>(&self, dim: usize, rng: &mut R) -> Vec<BigInt> {
        let count = dim * (dim + 1) / 2;
        match self {
            Self::Gaussian { .. } | Self::Laplace { .. } | Self::None => {
                self.sample_vector(count, rng)
            }
            Self::Wishart { cols: 0, .. } => vec![BigInt::zero(); count],
            Self::Wishart { sigma_z2, cols } => {
                let s2 = Ratio::integer(sigma_z2.clone());
                let flat = iid(dim * cols, rng, |r| discrete_gaussian(&s2, r));
                let z: Vec<&[BigInt]> = flat.chunks(*cols).collect();
                let mut out = Vec::with_capacity(count);
                for i in 0..dim {
                    for j in i..dim {
                        out.push(z[i].iter().zip(z[j]).map(|(a, b)| a * b).sum());
                    }
                }
                out
            }
        }
    }

    /// Samples a vector of iid entries (Gaussian or Laplace; zeros for the others),
    /// on the pool as [`NoiseScale::sample_upper`].
    pub fn sample_vector<R: RngCore + CryptoRng>(&self, dim: usize, rng: &mut R) -> Vec<BigInt> {
        match self {
            Self::Gaussian { sigma } => {
                let s2 = Ratio::integer(sigma * sigma);
                iid(dim, rng, |r| discrete_gaussian(&s2, r))
            }
            Self::Laplace { t } => iid(dim, rng, |r| discrete_laplace(t, r)),
            Self::Wishart { .. } | Self::None => vec![BigInt::zero(); dim],
        }
    }
}

/// Draws that one seed's generator makes when iid noise is sampled on the pool.
const DRAWS_PER_SEED: usize = 4096;

/// `count` iid draws of `draw`, on every core: at M = 1000 the release's 500,500
/// exact draws took 3 s of one core while the other waited. Each run of
/// [`DRAWS_PER_SEED`] draws comes from its own generator (ChaCha20),
/// keyed by a seed drawn in order from `rng`, and the runs are put back in order:
/// the values depend on `rng` alone. The samplers are exact for any uniform bits,
/// so the distribution, and every privacy contract stated on it, is unchanged.
pub(crate) fn iid<R, F>(count: usize, rng: &mut R, draw: F) -> Vec<BigInt>
where
    R: RngCore + CryptoRng,
    F: Fn(&mut ChaCha20Rng) -> BigInt + Sync,
{
    let seeds: Vec<[u8; 32]> = (0..count.div_ceil(DRAWS_PER_SEED))
        .map(|_| random_seed(rng))
        .collect();
    seeds
        .par_iter()
        .enumerate()
        .flat_map_iter(|(k, seed)| {
            let mut run = ChaCha20Rng::from_seed(*seed);
            let len = DRAWS_PER_SEED.min(count - k * DRAWS_PER_SEED);
            (0..len).map(|_| draw(&mut run)).collect::<Vec<_>>()
        })
        .collect()
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
/// block of `vector_dim` (a projected study, `dp-mean` only). The centering says
/// which blocks are released and with which sensitivities; the mechanism
/// calibrates each to its part of the budget.
pub fn plan_noise_blocks(
    req: &PrivacyRequest,
    matrix_dim: usize,
    vector_dim: usize,
    cq: u64,
    n_rows: u64,
    classes: bool,
) -> NoisePlan {
    let sens = Sensitivity::for_blocks(cq, matrix_dim, vector_dim, classes);
    let mechanism = req.mechanism;
    let matrix = Shape::Matrix { dim: matrix_dim };
    let (matrix, vector) = match req.centering {
        Centering::Mask => {
            // The released integer query is N S~: every sensitivity scales by N.
            let n = n_rows as f64;
            let block = Block {
                l2: n * sens.s_l2,
                l1: n * sens.s_l1,
                trace: n * sens.s_trace,
                shape: matrix,
            };
            (mechanism.calibrate(&block, Part::WHOLE, req), None)
        }
        Centering::DpMean => {
            let share = matrix_share(mechanism, classes);
            let r = Block {
                l2: sens.r_l2,
                l1: sens.r_l1,
                trace: sens.r_trace,
                shape: matrix,
            };
            let v = Block {
                l2: sens.v_l2,
                l1: sens.v_l1,
                trace: 0.0,
                shape: Shape::Vector,
            };
            let part = |share| Part { share, parts: 2 };
            (
                mechanism.calibrate(&r, part(share), req),
                Some(mechanism.calibrate(&v, part(1.0 - share), req)),
            )
        }
    };
    NoisePlan {
        matrix,
        vector,
        rho: mechanism.rho(req),
        epsilon: req.epsilon,
        delta: if mechanism.uses_delta() {
            req.delta
        } else {
            0.0
        },
    }
}

/// The noise of a marginal histogram study ([`crate::study::Marginals`]) of
/// `data_dim` features at integer bound `cq`: its vector block, the only one it
/// releases, spends the whole request at the sensitivities of
/// [`Sensitivity::marginals`]. Its empty matrix block is planned at the same
/// scale, so the one scale a release reports is the one drawn.
pub fn plan_marginal_noise(req: &PrivacyRequest, cq: u64, data_dim: usize) -> NoisePlan {
    let (l2, l1) = Sensitivity::marginals(cq, data_dim);
    let block = Block {
        l2,
        l1,
        trace: 0.0,
        shape: Shape::Vector,
    };
    let vector = req.mechanism.calibrate(&block, Part::WHOLE, req);
    NoisePlan {
        matrix: vector.clone(),
        vector: Some(vector),
        rho: req.mechanism.rho(req),
        epsilon: req.epsilon,
        delta: if req.mechanism.uses_delta() {
            req.delta
        } else {
            0.0
        },
    }
}

/// The share of the budget the matrix block gets in `dp-mean` centering.
pub fn matrix_share(mechanism: Mechanism, classes: bool) -> f64 {
    if classes {
        mechanism.class_matrix_share()
    } else {
        DP_MEAN_MATRIX_SHARE
    }
}
