//! Sensitivities of the released blocks, in grid units.
//!
//! # Derivations (grid units; step by step in docs/PRIVACY.md)
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
//! # Marginal histogram studies
//! Each row is sent as M + 1 marks of one integer unit a = floor(Cq / sqrt(M + 1)):
//! one in the bin of each feature's value, one in the row count
//! ([`crate::study::Marginals`]). Replacing row x by x' leaves the count as it is
//! and, for each feature, either leaves its bin or moves one unit from one bin to
//! another: the change has at most 2M entries, each of magnitude a. So
//! Delta_2 <= sqrt(2 M) a < sqrt(2) Cq and Delta_1 <= 2 M a < 2 sqrt(M) Cq: the
//! vector block's bounds of an unlabelled study, but for its L2, which is sqrt(2)
//! Cq instead of 2 Cq (half the variance), since no entry moves by more than a.
//!
//! So a classification study costs exactly the privacy of an unlabelled `dp-mean`
//! study, with Delta_1 of the vector block raised to 2 (sqrt(M) + 1) Cq. Disjoint
//! classes are not "parallel composition" for free: the sensitivities above are what
//! accounts for the row that moves. The Wishart mechanism is refused with classes (its
//! trace argument would need |x|^2 + |x'|^2).

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

    /// (Delta_2, Delta_1) of a marginal histogram study's vector block for rows of
    /// `dim` features and integer bound `cq` (see the module docs).
    pub fn marginals(cq: u64, dim: usize) -> (f64, f64) {
        let c = cq as f64;
        (2f64.sqrt() * c, 2.0 * (dim as f64).sqrt() * c)
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
