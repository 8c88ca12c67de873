//! A privacy request as a study states it: mechanism, centering, epsilon and
//! delta, validated together.

use serde::{Deserialize, Serialize};

use super::Mechanism;

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
    #[error("unknown mechanism `{name}` (expected one of {known})")]
    UnknownMechanism {
        /// The name given.
        name: String,
        /// The registered names.
        known: String,
    },
    /// Unknown centering name.
    #[error("unknown centering `{0}` (expected mask or dp-mean)")]
    UnknownCentering(String),
    /// A budget share outside (0, 1).
    #[error("a share of the budget must be strictly between 0 and 1, got {0}")]
    BadShare(f64),
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
        mechanism.check(epsilon, delta)?;
        Ok(Self {
            mechanism,
            centering,
            epsilon,
            delta,
        })
    }
}
