//! `gaussian-classic`: the discrete Gaussian with the Analyze-Gauss calibration.
//!
//! # Privacy contract
//! - **Neighbor relation**: bounded DP, one row replaced, N public (`dp` module docs).
//! - **Sensitivity used**: the block's L2 sensitivity Delta_2 (`sensitivity`).
//! - **Guarantee**: a block given `share` of the request, as one of `parts`
//!   blocks, gets sigma = Delta_2 sqrt(2 ln(1.25 / delta')) / (share epsilon) with
//!   delta' = delta / parts: (share epsilon, delta')-DP, and the blocks compose
//!   (basic composition) to (epsilon, delta). The analysis holds for epsilon < 1
//!   only, so larger epsilons are refused. It is for the continuous Gaussian: sigma
//!   is never set below the zCDP sigma of the `gaussian` mechanism for the same
//!   part, whose proof covers the discrete sampler.
//! - **Citation**: Dwork and Roth, "The Algorithmic Foundations of Differential
//!   Privacy", Theorem A.1; CKS20 for the discrete sampler.
//! - **docs/PRIVACY.md**: "Mechanisms and calibration".

use super::noise::ceil_big;
use super::{classic_factor, rho_for};
use super::{Block, DpError, Mechanism, NoiseMechanism, NoiseScale, Part, PrivacyRequest, Spend};

/// The discrete Gaussian with the classic Analyze-Gauss calibration.
pub struct GaussianClassic;

impl Mechanism {
    /// `gaussian-classic`, for epsilon < 1.
    pub const GAUSSIAN_CLASSIC: Mechanism = Mechanism::new(&GaussianClassic);
}

impl NoiseMechanism for GaussianClassic {
    fn name(&self) -> &'static str {
        "gaussian-classic"
    }

    fn uses_delta(&self) -> bool {
        true
    }

    fn check(&self, epsilon: f64, _delta: f64) -> Result<(), DpError> {
        if epsilon >= 1.0 {
            return Err(DpError::ClassicNeedsSmallEpsilon(epsilon));
        }
        Ok(())
    }

    fn calibrate(&self, block: &Block, part: Part, req: &PrivacyRequest) -> NoiseScale {
        let rho = rho_for(req.epsilon, req.delta);
        let factor = classic_factor(part.share * req.epsilon, req.delta / part.parts as f64)
            .max(1.0 / (2.0 * part.share * rho).sqrt());
        NoiseScale::Gaussian {
            sigma: ceil_big(block.l2 * factor),
        }
    }

    fn spend(&self, part: Part, req: &PrivacyRequest) -> Spend {
        Spend {
            epsilon: part.share * req.epsilon,
            delta: req.delta / part.parts as f64,
            rho: None,
        }
    }

    fn split(&self, req: &PrivacyRequest, share: f64) -> (f64, f64) {
        (share * req.epsilon, share * req.delta)
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
        part: Part,
        req: &PrivacyRequest,
    ) -> Option<Spend> {
        let NoiseScale::Gaussian { .. } = scale else {
            return None;
        };
        let delta = req.delta / part.parts as f64;
        Some(Spend {
            epsilon: block.l2 * classic_factor(1.0, delta) / scale.std_dev(),
            delta,
            rho: None,
        })
    }
}
