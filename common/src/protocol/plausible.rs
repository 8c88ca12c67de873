//! The user's check that an opened release is one honest rows could give.
//!
//! The proxy can check only that a ciphertext is in the group; an owner can
//! encrypt any share. Honest encoded rows obey ||x~|| <= Cq, so whatever they
//! sum to obeys, exactly on the grid:
//! - trace(R~) = sum ||x~||^2 lies in [0, N Cq^2] (in every block together);
//! - ||v~|| <= N Cq, and in a classification study ||v~_c|| <= N_c Cq with
//!   N_c in [0, N] summing to N;
//! - the centered scatter S~ = R~ - v~ v~^T / N is positive semidefinite (of
//!   a projected study, up to the rounding of each projected row on the grid).
//!
//! The release adds noise, so each check allows a margin the noise passes with
//! probability at most its share of [`FALSE_ALARM`], from the noise the spec
//! plans (which the user computes itself), by tail bounds that hold for the
//! discrete Gaussian (sub-Gaussian with parameter sigma, CKS20) and the
//! discrete Laplace (P(|X| >= k) <= 2 e^(-k/t)):
//! - a sum of K Gaussian entries exceeds sigma sqrt(K) sqrt(2 ln(1/p)) with
//!   probability at most p; a sum of discrete Laplace entries, by Chernoff's
//!   bound on its moment generating function;
//! - a noise vector of K Gaussian entries is longer than sigma sqrt(K +
//!   2 sqrt(K ln(1/p)) + 2 ln(1/p)) with probability at most p (the chi-square
//!   tail of Laurent and Massart, which the sub-Gaussian's moment generating
//!   function gives); of K Laplace entries, longer than sqrt(K) times one
//!   entry's two-sided bound at p / K;
//! - a symmetric noise matrix of dimension k has spectral norm above
//!   4 sigma sqrt(k ln 9 + ln(2/p)) with probability at most p (a quarter-net of
//!   the sphere has at most 9^k points, and x^T E x is sub-Gaussian with
//!   variance proxy 2 sigma^2 for a unit x); Laplace noise is bounded through its
//!   Frobenius norm, and Wishart noise is positive semidefinite, its trace a
//!   sum of squares of Gaussian draws with the chi-square tail.
//!
//! An honest study fails any check with probability at most [`FALSE_ALARM`]
//! (a union bound over the checks; `protocol::tests` draws 1,000 releases at the
//! bundled data's shape). The checks bound the total, not each share: an owner
//! can still move the release anywhere within them, adding as if it held rows
//! of its choosing or taking away from the honest rows' scatter and sums, as
//! long as the total stays one some N rows in the ball could give
//! (docs/PRIVACY.md, "Checks of a release").

use num_traits::ToPrimitive;

use super::{to_f64, Opened};
use crate::dp::{Centering, NoisePlan, NoiseScale};
use crate::study::BlockShape;

/// The chance that an honest release fails any of the checks.
pub const FALSE_ALARM: f64 = 1e-9;

/// What a release fails: a value no honest rows can give, beyond the noise's
/// margin. Grid units (one row's norm is Cq).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Implausible {
    /// The second moments' trace is outside [0, N Cq^2] by more than the noise.
    #[error("the released second moments have trace {got:.4e} on the grid, outside what {rows} rows in the norm ball can give, [{lo:.4e}, {hi:.4e}] with the noise's margin: an owner sent a share of rows outside the ball")]
    Trace {
        /// The trace released.
        got: f64,
        /// The least an honest release may show.
        lo: f64,
        /// The most.
        hi: f64,
        /// N.
        rows: u64,
    },
    /// The sum is longer than N rows of norm Cq and the noise.
    #[error("the released sum has norm {got:.4e} on the grid, more than {rows} rows in the norm ball and the noise can give, {bound:.4e}: an owner sent a share of rows outside the ball")]
    Sum {
        /// The norm released.
        got: f64,
        /// The most an honest release may show.
        bound: f64,
        /// N.
        rows: u64,
    },
    /// A class count outside [0, N], or counts that do not add up to N.
    #[error("the released count of class {class} is {got:.1}, outside [{lo:.1}, {hi:.1}] (0 to N = {rows} with the noise's margin): an owner sent counts no rows give")]
    ClassCount {
        /// The class's index.
        class: usize,
        /// The count released.
        got: f64,
        /// Least honest count.
        lo: f64,
        /// Most honest count.
        hi: f64,
        /// N.
        rows: u64,
    },
    /// The class counts do not add up to N.
    #[error("the released class counts add up to {got:.1}, not N = {rows} within the noise's margin {margin:.1}: an owner sent counts no rows give")]
    ClassTotal {
        /// Their sum.
        got: f64,
        /// The margin.
        margin: f64,
        /// N.
        rows: u64,
    },
    /// A class sum longer than its count of rows allows.
    #[error("the released sum of class {class} has norm {got:.4e} on the grid, more than its count of rows in the norm ball and the noise can give, {bound:.4e}: an owner sent a share of rows outside the ball")]
    ClassSum {
        /// The class's index.
        class: usize,
        /// The norm released.
        got: f64,
        /// The most an honest release may show.
        bound: f64,
    },
    /// The centered scatter has an eigenvalue below what the noise reaches.
    #[error("the released centered scatter has an eigenvalue of {got:.4e} (normalized units), below -{bound:.4e}, the most the noise can take a positive semidefinite scatter below 0: an owner sent a scatter no rows can give")]
    Eigenvalue {
        /// The smallest eigenvalue.
        got: f64,
        /// The margin below 0.
        bound: f64,
    },
}

/// A bound on the sum of `count` entries of `scale`, on one side, exceeded with
/// probability at most `p` (for Wishart noise: the sum of `count` diagonal
/// entries).
fn sum_bound(scale: &NoiseScale, count: usize, p: f64) -> f64 {
    let k = count.max(1) as f64;
    let x = (1.0 / p).ln();
    match scale {
        NoiseScale::Gaussian { sigma } => {
            sigma.to_f64().unwrap_or(f64::INFINITY) * k.sqrt() * (2.0 * x).sqrt()
        }
        // A diagonal entry of Z Z^T is a sum of `cols` squares of draws that are
        // sub-Gaussian with parameter sigma_z: the chi-square tail holds.
        NoiseScale::Wishart { sigma_z2, cols } => {
            let sigma2 = sigma_z2.to_f64().unwrap_or(f64::INFINITY);
            squares_bound(sigma2, k * *cols as f64, x)
        }
        NoiseScale::Laplace { t } => laplace_sum_bound(t.to_f64().unwrap_or(f64::INFINITY), k, x),
        NoiseScale::None => 0.0,
    }
}

/// A bound on a sum of `draws` squares of draws sub-Gaussian with parameter
/// sqrt(`sigma2`), exceeded with probability at most e^-x: E e^(l X^2) <=
/// (1 - 2 l sigma^2)^(-1/2) as for a Gaussian, so the chi-square tail of Laurent
/// and Massart (2000, Lemma 1) holds: sigma^2 (D + 2 sqrt(D x) + 2 x).
fn squares_bound(sigma2: f64, draws: f64, x: f64) -> f64 {
    sigma2 * (draws + 2.0 * (draws * x).sqrt() + 2.0 * x)
}

/// A bound on a sum of `k` discrete Laplace draws of scale `t`, exceeded with
/// probability at most e^-x, by Chernoff's bound: P(S >= a) <= M(l)^k e^(-l a)
/// with the draw's moment generating function M(l) = (1 - q)^2 / ((1 - q e^l)
/// (1 - q e^-l)), q = e^(-1/t), for l = c / t, the best c of a grid in (0, 1).
fn laplace_sum_bound(t: f64, k: f64, x: f64) -> f64 {
    // ln(1 - e^a) for a < 0, exact for the tiny |a| of large scales.
    let ln_one_less = |a: f64| (-a.exp_m1()).ln();
    (1..20)
        .map(|i| {
            let c = f64::from(i) / 20.0;
            let ln_m = 2.0 * ln_one_less(-1.0 / t)
                - ln_one_less((c - 1.0) / t)
                - ln_one_less(-(c + 1.0) / t);
            t * (k * ln_m + x) / c
        })
        .fold(f64::INFINITY, f64::min)
}

/// A bound on the norm of a noise vector of `count` entries, each the sum of
/// `summed` draws of `scale`, exceeded with probability at most `p`: for
/// Gaussian noise the chi-square tail of its squared norm ([`squares_bound`]),
/// for the others `count` entries each within its two-sided bound.
fn norm_bound(scale: &NoiseScale, count: usize, summed: usize, p: f64) -> f64 {
    match scale {
        NoiseScale::Gaussian { sigma } => {
            let sigma2 = sigma.to_f64().unwrap_or(f64::INFINITY).powi(2) * summed.max(1) as f64;
            squares_bound(sigma2, count.max(1) as f64, (1.0 / p).ln()).sqrt()
        }
        NoiseScale::Laplace { .. } => {
            let per_entry = 2 * count.max(1);
            (count as f64).sqrt() * sum_bound(scale, summed, p / per_entry as f64)
        }
        // Wishart noise is on the matrix alone (`dp-mean` sums get Laplace's).
        NoiseScale::Wishart { .. } => f64::INFINITY,
        NoiseScale::None => 0.0,
    }
}

/// A bound on the spectral norm of the sum of `summed` symmetric noise matrices
/// of dimension `k` drawn from `scale`, exceeded with probability at most `p`:
/// 0 below zero for Wishart noise, which is positive semidefinite.
fn spectral_bound(scale: &NoiseScale, k: usize, summed: usize, p: f64) -> f64 {
    let kf = k as f64;
    match scale {
        NoiseScale::Gaussian { sigma } => {
            let s = sigma.to_f64().unwrap_or(f64::INFINITY) * (summed.max(1) as f64).sqrt();
            4.0 * s * (kf * 9f64.ln() + (2.0 / p).ln()).sqrt()
        }
        NoiseScale::Wishart { .. } | NoiseScale::None => 0.0,
        NoiseScale::Laplace { .. } => {
            let entries = k * (k + 1) / 2;
            // The Frobenius norm bounds the spectral norm.
            kf * sum_bound(scale, summed, p / (2 * entries.max(1)) as f64)
        }
    }
}

/// How the release reads in numbers the checks need.
struct Figures<'a> {
    opened: &'a Opened,
    shape: &'a BlockShape,
    plan: &'a NoisePlan,
    n: f64,
    rows: u64,
    cq: f64,
    p: f64,
}

/// Checks `opened`, the release of a study of `shape` with `centering` whose
/// noise is `plan`, opened with N = `n_rows` and `frac_bits` fractional bits.
pub fn check_release(
    opened: &Opened,
    (shape, centering): (&BlockShape, Centering),
    plan: &NoisePlan,
    n_rows: u64,
    frac_bits: u32,
) -> Result<(), Implausible> {
    let checks = 4 + 3 * shape.classes;
    let f = Figures {
        opened,
        shape,
        plan,
        n: n_rows as f64,
        rows: n_rows,
        cq: shape.count_scale as f64,
        p: FALSE_ALARM / checks as f64,
    };
    f.trace(centering)?;
    if centering == Centering::DpMean {
        match shape.classes {
            0 => f.sum()?,
            g => f.classes(g)?,
        }
    }
    f.eigenvalue(centering, frac_bits)
}

impl Figures<'_> {
    /// The vector block's noise (`dp-mean` only).
    fn vector_noise(&self) -> &NoiseScale {
        self.plan.vector.as_ref().unwrap_or(&self.plan.matrix)
    }

    /// trace(R~) in [0, N Cq^2] (`dp-mean`), or trace(N S~) in [0, N^2 Cq^2]
    /// (`mask`), with the noise of every diagonal entry released.
    fn trace(&self, centering: Centering) -> Result<(), Implausible> {
        let got: f64 = self
            .opened
            .matrix_grid
            .iter()
            .flat_map(|t| (0..t.len()).map(move |i| to_f64(&t[i][i])))
            .sum();
        let diagonal = self.shape.matrix_blocks * self.shape.matrix_dim;
        let margin = sum_bound(&self.plan.matrix, diagonal, self.p / 2.0);
        let most = match centering {
            Centering::DpMean => self.n * self.cq * self.cq,
            Centering::Mask => self.n * self.n * self.cq * self.cq,
        };
        let (lo, hi) = (-margin, most + margin);
        if (lo..=hi).contains(&got) {
            return Ok(());
        }
        Err(Implausible::Trace {
            got,
            lo,
            hi,
            rows: self.rows,
        })
    }

    /// ||v~|| <= N Cq, with the noise of the M sums.
    fn sum(&self) -> Result<(), Implausible> {
        let got = norm(&self.opened.vector_grid[..self.shape.dim]);
        let bound = self.n * self.cq + norm_bound(self.vector_noise(), self.shape.dim, 1, self.p);
        if got <= bound {
            return Ok(());
        }
        Err(Implausible::Sum {
            got,
            bound,
            rows: self.rows,
        })
    }

    /// Each class's count in [0, N], their total N, and each class's sum no
    /// longer than its count of rows allows.
    fn classes(&self, g: usize) -> Result<(), Implausible> {
        let dim = self.shape.dim;
        let vec = &self.opened.vector_grid;
        let noise = self.vector_noise();
        let one = noise.exceedance(self.p / 2.0) / self.cq;
        let counts: Vec<f64> = (0..g)
            .map(|c| to_f64(&vec[g * dim + c]) / self.cq)
            .collect();
        for (class, &got) in counts.iter().enumerate() {
            let (lo, hi) = (-one, self.n + one);
            if !(lo..=hi).contains(&got) {
                return Err(Implausible::ClassCount {
                    class,
                    got,
                    lo,
                    hi,
                    rows: self.rows,
                });
            }
        }
        let total: f64 = counts.iter().sum();
        let margin = sum_bound(noise, g, self.p / 2.0) / self.cq;
        if (total - self.n).abs() > margin {
            return Err(Implausible::ClassTotal {
                got: total,
                margin,
                rows: self.rows,
            });
        }
        self.class_sums(&counts, one)
    }

    /// Each class's sum no longer than (its count, with its margin) rows of
    /// norm Cq and the noise.
    fn class_sums(&self, counts: &[f64], one: f64) -> Result<(), Implausible> {
        let dim = self.shape.dim;
        let noise = norm_bound(self.vector_noise(), dim, 1, self.p);
        for (class, &count) in counts.iter().enumerate() {
            let got = norm(&self.opened.vector_grid[class * dim..(class + 1) * dim]);
            let rows = (count + one).clamp(0.0, self.n);
            let bound = rows * self.cq + noise;
            if got > bound {
                return Err(Implausible::ClassSum { class, got, bound });
            }
        }
        Ok(())
    }

    /// The centered scatter's smallest eigenvalue no further below 0 than the
    /// noise of the matrix blocks, and (`dp-mean`) of the sums it is centered
    /// with, can take it.
    fn eigenvalue(&self, centering: Centering, frac_bits: u32) -> Result<(), Implausible> {
        let s = &self.opened.scatter;
        if s.nrows() == 0 {
            return Ok(());
        }
        let got = crate::linalg::smallest_eigenvalue(s);
        let blocks = self.shape.matrix_blocks;
        let matrix = spectral_bound(&self.plan.matrix, self.shape.matrix_dim, blocks, self.p);
        let grid = f64::from(frac_bits).exp2();
        let bound = match centering {
            // N S~ + E', read as S' = that / (N 2^2f).
            Centering::Mask => matrix / (self.n * grid * grid),
            Centering::DpMean => (matrix + self.centering_error()) / (grid * grid),
        };
        // Rounding in f64, relative to the scatter's size, and a projected
        // study's rounding on the grid.
        let slack = 1e-9 * s.iter().fold(0.0f64, |a, v| a.max(v.abs())) * s.nrows() as f64
            + self.projection_rounding() / (grid * grid);
        if got >= -(bound + slack) {
            return Ok(());
        }
        Err(Implausible::Eigenvalue { got, bound })
    }

    /// How far below 0 a projected study's scatter may be on the grid with no
    /// noise: its R sums the projected rows y = trunc(W x 2^f), its sums the
    /// rows x~ = trunc(x 2^f), so each y is within r = sqrt(k) + sqrt(M) + 2 of
    /// W x~ (truncation, and a step or two toward the ball), and R is within
    /// N (2 Cq r + r^2) in spectral norm of the sum of (W x~)(W x~)^T, whose
    /// centered scatter is positive semidefinite. 0 for other studies.
    fn projection_rounding(&self) -> f64 {
        if self.shape.matrix_dim == self.shape.dim {
            return 0.0;
        }
        let r = (self.shape.matrix_dim as f64).sqrt() + (self.shape.dim as f64).sqrt() + 2.0;
        self.n * (2.0 * self.cq * r + r * r)
    }

    /// How far below 0 centering with the noisy sum v' = v + e can take the
    /// scatter, on the grid: R - v' v'^T / N = S - (v e^T + e v^T + e e^T) / N,
    /// whose rank-two part has smallest eigenvalue v.e - ||v|| ||e||, so the
    /// whole is at least -(||v|| (||e|| + |v.e| / ||v||) + ||e||^2) / N. The
    /// honest ||v|| is at most N Cq, and at most ||v'|| + ||e||; e is drawn
    /// independently of v, so its component along v is one entry's worth.
    fn centering_error(&self) -> f64 {
        let summed = self.shape.classes.max(1);
        let noise = self.vector_noise();
        let dim = self.shape.dim;
        let e = norm_bound(noise, dim, summed, self.p / 3.0);
        let along = sum_bound(noise, summed, self.p / 6.0);
        let released = norm(&total_sum(
            &self.opened.vector_grid,
            dim,
            self.shape.classes,
        ));
        let v = (self.n * self.cq).min(released + e);
        (v * (e + along) + e * e) / self.n.max(1.0)
    }
}

/// The total sum released: the one sum, or the class sums added.
fn total_sum(vec: &[num_bigint::BigInt], dim: usize, classes: usize) -> Vec<num_bigint::BigInt> {
    (0..dim)
        .map(|i| (0..classes.max(1)).map(|c| &vec[c * dim + i]).sum())
        .collect()
}

/// The Euclidean norm of released integers.
fn norm(values: &[num_bigint::BigInt]) -> f64 {
    values.iter().map(|v| to_f64(v).powi(2)).sum::<f64>().sqrt()
}
