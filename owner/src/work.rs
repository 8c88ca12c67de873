//! How much encryption an owner does for one study, whatever the proxy's spec
//! asks. The layout, and so the owner's work, follows from fields the proxy
//! serves: a hostile proxy could ask the paper's baseline layout (one value per
//! ciphertext, each encrypted with a full r^n: 501,501 of them at M = 1000, one
//! to three hours of one core at 2048 bits), or shrink the packing with extreme
//! but valid parameters (tens of times the honest ciphertexts, and their
//! upload). The owner refuses such a study before it parses its table.

use dpca_common::study::{StudyLayout, DEFAULT_MAX_CIPHERTEXTS};

/// The most encryption work an owner takes on for one study.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCap {
    /// Ciphertexts in its contribution (`--max-ciphertexts`; by default the
    /// proxy's default cap on a contribution, [`DEFAULT_MAX_CIPHERTEXTS`]).
    pub max_ciphertexts: usize,
    /// Whether it encrypts the paper's way when a study asks (`--allow-baseline`):
    /// a speed comparison, never needed for a result.
    pub allow_baseline: bool,
}

impl Default for WorkCap {
    fn default() -> Self {
        Self {
            max_ciphertexts: DEFAULT_MAX_CIPHERTEXTS,
            allow_baseline: false,
        }
    }
}

/// A study that asks more work of the owner than its cap allows.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkRefused {
    /// The baseline layout, not allowed.
    #[error(
        "study `{study}` asks for the paper's baseline encryption (one value per \
         ciphertext, each with a full r^n: hours of CPU at large M); refusing to encrypt \
         for it unless you pass --allow-baseline"
    )]
    Baseline {
        /// The study.
        study: String,
    },
    /// More ciphertexts than the cap.
    #[error(
        "study `{study}` asks for {count} ciphertexts from this owner; refusing to encrypt \
         more than {max} (--max-ciphertexts)"
    )]
    Ciphertexts {
        /// The study.
        study: String,
        /// Ciphertexts its layout asks of the owner.
        count: usize,
        /// The cap.
        max: usize,
    },
}

impl WorkCap {
    /// Refuses a study whose `layout` asks more than the cap.
    pub fn check(&self, study: &str, layout: &StudyLayout) -> Result<(), WorkRefused> {
        if layout.baseline && !self.allow_baseline {
            return Err(WorkRefused::Baseline {
                study: study.to_string(),
            });
        }
        let count = layout.owner_ciphertexts();
        if count > self.max_ciphertexts {
            return Err(WorkRefused::Ciphertexts {
                study: study.to_string(),
                count,
                max: self.max_ciphertexts,
            });
        }
        Ok(())
    }
}
