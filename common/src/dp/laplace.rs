//! `laplace`: the discrete Laplace mechanism (Lap-PCA).
//!
//! # Privacy contract
//! - **Neighbor relation**: bounded DP, one row replaced, N public (`dp` module docs).
//! - **Sensitivity used**: the block's L1 sensitivity Delta_1 (of the upper
//!   triangle, for a matrix; `sensitivity`).
//! - **Guarantee**: iid discrete Laplace of scale t = Delta_1 / (share epsilon) on
//!   every released entry of an integer query is (share epsilon, 0)-DP; the blocks
//!   compose (basic composition) to (epsilon, 0).
//! - **Citation**: CKS20, Section 2 (discrete Laplace); PCA-Gauss (Lap-PCA).
//! - **docs/PRIVACY.md**: "Mechanisms and calibration".

use super::noise::ceil_big;
use super::{Block, Mechanism, NoiseMechanism, NoiseScale, Part, PrivacyRequest, Spend};

/// The discrete Laplace mechanism.
pub struct Laplace;

impl Mechanism {
    /// `laplace`, pure epsilon-DP.
    pub const LAPLACE: Mechanism = Mechanism::new(&Laplace);
}

/// Scale t of a block spending `share` of epsilon; Wishart's vector block is
/// released this way too.
pub(super) fn laplace_scale(block: &Block, part: Part, req: &PrivacyRequest) -> NoiseScale {
    NoiseScale::Laplace {
        t: ceil_big(block.l1 / (part.share * req.epsilon)),
    }
}

/// What a Laplace scale spends on `block`: Delta_1 / t.
pub(super) fn laplace_spend(block: &Block, scale: &NoiseScale) -> Option<Spend> {
    let NoiseScale::Laplace { .. } = scale else {
        return None;
    };
    Some(Spend {
        epsilon: block.l1 / num_traits::ToPrimitive::to_f64(&scale.grid_parameter())?,
        delta: 0.0,
        rho: None,
    })
}

/// A pure mechanism's part: its share of epsilon, no delta.
pub(super) fn pure_spend(part: Part, req: &PrivacyRequest) -> Spend {
    Spend {
        epsilon: part.share * req.epsilon,
        delta: 0.0,
        rho: None,
    }
}

impl NoiseMechanism for Laplace {
    fn name(&self) -> &'static str {
        "laplace"
    }

    fn uses_delta(&self) -> bool {
        false
    }

    /// Its L1 sensitivity grows with M for the matrix, (M + 1) C^2, but with
    /// sqrt(M) for the class sums, so the class means get more of the budget
    /// ([`super::LAPLACE_CLASS_MATRIX_SHARE`] says how it was chosen).
    fn class_matrix_share(&self) -> f64 {
        super::LAPLACE_CLASS_MATRIX_SHARE
    }

    fn calibrate(&self, block: &Block, part: Part, req: &PrivacyRequest) -> NoiseScale {
        laplace_scale(block, part, req)
    }

    fn spend(&self, part: Part, req: &PrivacyRequest) -> Spend {
        pure_spend(part, req)
    }

    fn split(&self, req: &PrivacyRequest, share: f64) -> (f64, f64) {
        (share * req.epsilon, req.delta)
    }

    fn noise_edge(&self, entry_sd: f64, dim: usize) -> f64 {
        // Independent zero-mean entries: the spectrum of the noise matrix is
        // Wigner's semicircle, whose edge is 2 sd sqrt(dim).
        2.0 * entry_sd * (dim as f64).sqrt()
    }

    fn spent_by(
        &self,
        block: &Block,
        scale: &NoiseScale,
        _part: Part,
        _req: &PrivacyRequest,
    ) -> Option<Spend> {
        laplace_spend(block, scale)
    }
}
