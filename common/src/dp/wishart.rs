//! `wishart-unproven`: Wishart noise E = Z Z^T (Imtiaz and Sarwate's SN). NOT
//! proven private.
//!
//! # Privacy contract (as claimed, and why it does not hold)
//! - **Neighbor relation**: bounded DP, one row replaced, N public (`dp` module docs).
//! - **Sensitivity used**: the trace sensitivity of the matrix block (`sensitivity`);
//!   a vector block (`dp-mean`) gets discrete Laplace noise on its L1 sensitivity,
//!   as in `laplace`.
//! - **Claimed guarantee**: Z of M + 1 columns of iid discrete Gaussians of
//!   variance Delta_tr / (2 share epsilon) makes the density ratio at most
//!   exp(share epsilon). The argument needs Y - A' inside the Wishart support for
//!   every neighbor A', which fails when A - A' has a negative eigenvalue (as
//!   dS = a a^T - b b^T does); diffprivlib removed its Wishart PCA for this
//!   reason. So: never a default, every owner must accept it by name
//!   (`Risk::WishartUnproven`), and refused for classes and histograms.
//! - **Citation**: Imtiaz and Sarwate, "Symmetric Matrix Perturbation for
//!   Differentially-Private Principal Component Analysis" (ICASSP 2016).
//! - **docs/PRIVACY.md**: "Mechanisms and calibration".

use super::laplace::{laplace_scale, laplace_spend, pure_spend};
use super::noise::ceil_big;
use super::{Block, Mechanism, NoiseMechanism, NoiseScale, Part, PrivacyRequest, Shape, Spend};

/// The Wishart mechanism, whose privacy is not proven.
pub struct WishartUnproven;

impl Mechanism {
    /// `wishart-unproven`, opt-in only.
    pub const WISHART_UNPROVEN: Mechanism = Mechanism::new(&WishartUnproven);
}

impl NoiseMechanism for WishartUnproven {
    fn name(&self) -> &'static str {
        "wishart-unproven"
    }

    fn uses_delta(&self) -> bool {
        false
    }

    fn proven(&self) -> bool {
        false
    }

    /// Its trace argument would need |x|^2 + |x'|^2 when a row changes class.
    fn supports_classes(&self) -> bool {
        false
    }

    fn calibrate(&self, block: &Block, part: Part, req: &PrivacyRequest) -> NoiseScale {
        match block.shape {
            Shape::Matrix { dim } => NoiseScale::Wishart {
                sigma_z2: ceil_big(block.trace / (2.0 * part.share * req.epsilon)),
                cols: dim + 1,
            },
            Shape::Vector => laplace_scale(block, part, req),
        }
    }

    fn spend(&self, part: Part, req: &PrivacyRequest) -> Spend {
        pure_spend(part, req)
    }

    fn split(&self, req: &PrivacyRequest, share: f64) -> (f64, f64) {
        (share * req.epsilon, req.delta)
    }

    fn noise_edge(&self, entry_sd: f64, dim: usize) -> f64 {
        // Z Z^T with Z of dim + 1 columns: Marchenko-Pastur's upper edge
        // sigma_z^2 (sqrt(cols) + sqrt(dim))^2, with entry_sd = sigma_z^2 sqrt(cols).
        let cols = (dim + 1) as f64;
        entry_sd / cols.sqrt() * (cols.sqrt() + (dim as f64).sqrt()).powi(2)
    }

    fn spent_by(
        &self,
        block: &Block,
        scale: &NoiseScale,
        _part: Part,
        _req: &PrivacyRequest,
    ) -> Option<Spend> {
        match (block.shape, scale) {
            (Shape::Matrix { .. }, NoiseScale::Wishart { .. }) => Some(Spend {
                epsilon: block.trace
                    / (2.0 * num_traits::ToPrimitive::to_f64(&scale.grid_parameter())?),
                delta: 0.0,
                rho: None,
            }),
            (Shape::Vector, _) => laplace_spend(block, scale),
            (Shape::Matrix { .. }, _) => None,
        }
    }
}
