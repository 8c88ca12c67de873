//! The study: what every party agrees on before any data is touched, validated, and
//! the ciphertext layout all parties derive from it.

use num_bigint::BigUint;
use num_traits::One;

use crate::dp::{plan_noise, Centering, DpError, PrivacyRequest};
use crate::encoding::{vector_segments, EncodingError, FixedPoint, SlotBudget, TriangleLayout};
use crate::paillier::{PaillierError, PowerTable, PublicKey};

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

fn param(name: &'static str, reason: impl Into<String>) -> SpecError {
    SpecError::Parameter {
        name,
        reason: reason.into(),
    }
}

/// A validated study specification.
#[derive(Clone, Debug)]
pub struct StudySpec {
    /// Feature names, in column order.
    pub features: Vec<String>,
    /// Public per-feature bounds [lo, hi].
    pub bounds: Vec<(f64, f64)>,
    /// Fixed-point parameters (row norm bound C and fractional bits).
    pub fixed: FixedPoint,
    /// Upper bound on the pooled row count N (public; sizes the slots).
    pub max_rows: u64,
    /// Mechanism, centering, epsilon, delta.
    pub privacy: PrivacyRequest,
    /// Fewest owners with which the study may complete at its deadline.
    pub min_owners: u32,
    /// Owners after which the study seals at once.
    pub quorum: u32,
    /// Deadline, milliseconds since the Unix epoch.
    pub deadline_unix_ms: u64,
    /// Statistical hiding parameter of the mask (bits).
    pub kappa: u32,
    /// The data user's Paillier public key.
    pub public_key: PublicKey,
    /// The paper's way, for side-by-side speed measurements: one value per
    /// ciphertext, textbook r^n randomness, no CRT, one thread.
    pub baseline: bool,
}

impl StudySpec {
    /// Checks every field; the layout must also fit the key.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.features.is_empty() {
            return Err(SpecError::Schema("no features".into()));
        }
        if self.bounds.len() != self.features.len() {
            return Err(SpecError::Schema(format!(
                "{} features but {} bounds",
                self.features.len(),
                self.bounds.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for name in &self.features {
            if name.is_empty() || !seen.insert(name.as_str()) {
                return Err(SpecError::Schema(format!(
                    "empty or duplicate feature name `{name}`"
                )));
            }
        }
        for (name, &(lo, hi)) in self.features.iter().zip(&self.bounds) {
            if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
                return Err(SpecError::Schema(format!(
                    "bounds of `{name}` must be finite with lo <= hi, got [{lo}, {hi}]"
                )));
            }
        }
        let c = self.fixed.row_norm_bound;
        if !(c.is_finite() && c > 0.0 && c <= 1e6) {
            return Err(param(
                "row_norm_bound",
                format!("must be in (0, 1e6], got {c}"),
            ));
        }
        if !(1..=30).contains(&self.fixed.frac_bits) {
            return Err(param(
                "frac_bits",
                format!("must be in 1..=30, got {}", self.fixed.frac_bits),
            ));
        }
        if self.fixed.norm_bound_int() == 0 {
            return Err(param("row_norm_bound", "C 2^f rounds to zero"));
        }
        if self.max_rows == 0 || self.max_rows > MAX_ROWS_LIMIT {
            return Err(param(
                "max_rows",
                format!("must be in 1..={MAX_ROWS_LIMIT}, got {}", self.max_rows),
            ));
        }
        if self.kappa < MIN_KAPPA || self.kappa > 256 {
            return Err(param(
                "kappa",
                format!("must be in {MIN_KAPPA}..=256, got {}", self.kappa),
            ));
        }
        if self.min_owners == 0 || self.min_owners > self.quorum {
            return Err(param(
                "min_owners",
                format!(
                    "must be in 1..=quorum ({}), got {}",
                    self.quorum, self.min_owners
                ),
            ));
        }
        // Re-validates epsilon/delta/mechanism combinations.
        PrivacyRequest::new(
            self.privacy.mechanism,
            self.privacy.centering,
            self.privacy.epsilon,
            self.privacy.delta,
        )?;
        StudyLayout::new(self)?;
        Ok(())
    }

    /// Number of features M.
    pub fn dim(&self) -> usize {
        self.features.len()
    }
}

/// The ciphertext layout of a study, derived identically by every party.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StudyLayout {
    /// Slot width and slots per plaintext.
    pub budget: SlotBudget,
    /// Packed upper-triangle segments.
    pub triangle: TriangleLayout,
    /// Packed segments of the released vector (start, len).
    pub vector: Vec<(usize, usize)>,
    /// Bits of the mask b: b is uniform in [0, 2^mask_bits).
    pub mask_bits: u64,
    /// The paper's way (see [`StudySpec::baseline`]).
    pub baseline: bool,
}

impl StudyLayout {
    /// Proves the slot width from the study's public bounds (N_max, Cq, kappa and the
    /// noise tail at N_max) and cuts the triangle into segments.
    pub fn new(spec: &StudySpec) -> Result<Self, SpecError> {
        let m = spec.dim();
        let cq = BigUint::from(spec.fixed.norm_bound_int());
        let n = BigUint::from(spec.max_rows);
        let plan = plan_noise(&spec.privacy, m, spec.fixed.norm_bound_int(), spec.max_rows);
        let v_max = &n * &cq;
        // 2^vbits >= 2 max|v|, so v + b hides v up to statistical distance 2^-kappa.
        let mask_bits = (&v_max << 1usize).bits() + spec.kappa as u64;
        let (t_bound, v_bound) = match spec.privacy.centering {
            Centering::Mask => {
                let b = BigUint::one() << mask_bits as usize;
                let t = &n * &n * &cq * &cq
                    + (&v_max << 1usize) * &b
                    + &b * &b
                    + plan.matrix.tail_bound();
                (t, &v_max + &b)
            }
            Centering::DpMean => {
                let t = &n * &cq * &cq + plan.matrix.tail_bound();
                let tail_v = plan
                    .vector
                    .as_ref()
                    .map(|v| v.tail_bound())
                    .unwrap_or_default();
                (t, &v_max + tail_v)
            }
        };
        let mut budget = SlotBudget::for_bound(&t_bound.max(v_bound), spec.public_key.bits())?;
        if spec.baseline {
            budget.slots = 1;
        }
        let triangle = TriangleLayout::new(m, budget.slots);
        let vector = vector_segments(m, budget.slots);
        Ok(Self {
            budget,
            triangle,
            vector,
            mask_bits,
            baseline: spec.baseline,
        })
    }

    /// Ciphertexts one owner sends: packed R segments, v unpacked, then N.
    pub fn owner_ciphertexts(&self) -> usize {
        self.triangle.len() + self.triangle.dim + 1
    }

    /// Window of the power tables in the proxy's mask term: each row's shifted bases
    /// serve every segment of that row, about (segments / M) uses each.
    pub fn mask_window(&self) -> usize {
        let uses = self.triangle.len().div_ceil(self.triangle.dim.max(1));
        PowerTable::window_for(self.mask_bits, uses)
    }

    /// Ciphertexts the proxy releases: packed T segments, then packed v'.
    pub fn release_ciphertexts(&self) -> usize {
        self.triangle.len() + self.vector.len()
    }
}
