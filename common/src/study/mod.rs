//! The study: what every party agrees on before any data is touched, validated, and
//! the ciphertext layout all parties derive from it.
//!
//! `spec` holds the spec and its checks, `classes`, `projection`, `norm_bins` and
//! `marginals` the optional parts a spec may carry, `layout` the ciphertext layout derived
//! from a validated spec.

mod classes;
mod layout;
mod marginals;
mod norm_bins;
mod projection;
mod spec;

pub use classes::{ClassCovariance, ClassSpec};
pub use layout::{
    BlockShape, LayoutPlan, LayoutSize, MaskChain, StudyLayout, DEFAULT_MAX_CIPHERTEXTS,
    LAYOUT_VERSION,
};
pub use marginals::{
    MarginalCounts, Marginals, GRID_MAX_EXP, GRID_MIN_EXP, MAX_PER_OCTAVE, STANDARD_PER_OCTAVE,
};
pub use norm_bins::{NormBins, MAX_NORM_BINS, STANDARD_NORM_BINS};
pub use projection::Projection;
pub use spec::{
    check_no_terminal_controls, is_terminal_control, SpecDraft, StudySpec, MAX_CLASSES,
    MAX_ID_BYTES,
};

use crate::dp::DpError;
use crate::encoding::EncodingError;
use crate::paillier::PaillierError;

/// Smallest statistical hiding parameter of the mask b (bits).
pub const MIN_KAPPA: u32 = 40;
/// Default fractional bits of the fixed-point encoding.
pub const DEFAULT_FRAC_BITS: u32 = 20;
/// Largest pooled row count a study may declare (keeps exponents short).
pub const MAX_ROWS_LIMIT: u64 = 1 << 40;

/// Why a study specification is refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Empty or inconsistent schema.
    #[error("invalid schema: {0}")]
    Schema(String),
    /// A parameter outside its range.
    #[error("invalid parameter `{name}`: {reason}")]
    Parameter {
        /// Parameter name.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Privacy parameters.
    #[error(transparent)]
    Privacy(#[from] DpError),
    /// Key problems.
    #[error(transparent)]
    Key(#[from] PaillierError),
    /// The study does not fit the plaintext space.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
}

pub(super) fn param(name: &'static str, reason: impl Into<String>) -> SpecError {
    SpecError::Parameter {
        name,
        reason: reason.into(),
    }
}
