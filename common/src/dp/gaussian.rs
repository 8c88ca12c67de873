//! `gaussian`, the default: the discrete Gaussian, accounted in zCDP.
//!
//! # Privacy contract
//! - **Neighbor relation**: bounded DP, one row replaced, N public (`dp` module docs).
//! - **Sensitivity used**: the block's L2 sensitivity Delta_2 (`sensitivity`).
//! - **Guarantee**: the multivariate discrete Gaussian of variance sigma^2 per
//!   entry is rho-zCDP with rho = Delta_2^2 / (2 sigma^2); a block given `share`
//!   of the request gets sigma = Delta_2 / sqrt(2 share rho), so the blocks' rhos
//!   add up to rho, the largest value whose exact conversion gives
//!   (epsilon, delta)-DP. Valid for every epsilon; rounding sigma up only adds
//!   noise.
//! - **Citation**: Canonne, Kamath and Steinke, "The Discrete Gaussian for
//!   Differential Privacy" (CKS20), Theorem 14 and Corollary 13.
//! - **docs/PRIVACY.md**: "Mechanisms and calibration".

use super::noise::ceil_big;
use super::{epsilon_for, rho_for};
use super::{Block, Mechanism, NoiseMechanism, NoiseScale, Part, PrivacyRequest, Spend};

/// The discrete Gaussian mechanism, accounted in zCDP.
pub struct Gaussian;

impl Mechanism {
    /// `gaussian`, the default.
    pub const GAUSSIAN: Mechanism = Mechanism::new(&Gaussian);
}

impl NoiseMechanism for Gaussian {
    fn name(&self) -> &'static str {
        "gaussian"
    }

    fn uses_delta(&self) -> bool {
        true
    }

    fn splits_over_owners(&self) -> bool {
        true
    }

    fn rho(&self, req: &PrivacyRequest) -> Option<f64> {
        Some(rho_for(req.epsilon, req.delta))
    }

    fn calibrate(&self, block: &Block, part: Part, req: &PrivacyRequest) -> NoiseScale {
        let rho = rho_for(req.epsilon, req.delta);
        NoiseScale::Gaussian {
            sigma: ceil_big(block.l2 / (2.0 * part.share * rho).sqrt()),
        }
    }

    fn spend(&self, part: Part, req: &PrivacyRequest) -> Spend {
        let rho = part.share * rho_for(req.epsilon, req.delta);
        Spend {
            epsilon: epsilon_for(rho, req.delta),
            delta: req.delta,
            rho: Some(rho),
        }
    }

    fn split(&self, req: &PrivacyRequest, share: f64) -> (f64, f64) {
        (
            epsilon_for(share * rho_for(req.epsilon, req.delta), req.delta),
            req.delta,
        )
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
        req: &PrivacyRequest,
    ) -> Option<Spend> {
        let NoiseScale::Gaussian { .. } = scale else {
            return None;
        };
        let sigma = scale.std_dev();
        let rho = block.l2 * block.l2 / (2.0 * sigma * sigma);
        Some(Spend {
            epsilon: epsilon_for(rho, req.delta),
            delta: req.delta,
            rho: Some(rho),
        })
    }
}
