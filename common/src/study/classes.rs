//! The classes of a classification study.

use super::{param, SpecError};

/// How a classification study releases the class covariances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassCovariance {
    /// One within-class scatter shared by all classes (LDA-style): the total R~ is
    /// released once, so the noise is that of an unlabelled study.
    Shared,
    /// The paper's Algorithm 3: one R~_c per class, each with the full noise. With
    /// many small classes the per-class covariances drown in it.
    PerClass,
}

impl ClassCovariance {
    /// Parses the CLI/wire name.
    pub fn parse(name: &str) -> Result<Self, SpecError> {
        match name {
            "shared" => Ok(Self::Shared),
            "per-class" => Ok(Self::PerClass),
            other => Err(param(
                "class_covariance",
                format!("unknown value `{other}` (expected shared or per-class)"),
            )),
        }
    }

    /// The CLI/wire name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::PerClass => "per-class",
        }
    }
}

/// The classes of a classification study (PCA-Gauss Algorithm 3). Owners send, per
/// class c, the sum v~_c of its rows and its count scaled to Cq N_c; and either the
/// total R~ (shared covariance) or one R~_c per class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassSpec {
    /// Class labels (public), in the order of the released blocks.
    pub labels: Vec<String>,
    /// Shared or per-class covariance.
    pub covariance: ClassCovariance,
}
