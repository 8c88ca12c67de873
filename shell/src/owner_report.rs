//! What an owner program reports when it is done: one JSON line on standard
//! output, which the owner prints and `user local` reads for each of its owners.

use serde::{Deserialize, Serialize};

use crate::usage::Usage;

/// What the owner did, printed as one JSON line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OwnerReport {
    /// Owner identity.
    pub owner_id: String,
    /// Rows contributed.
    pub rows: u64,
    /// Rows the row-norm clip shortened.
    pub clipped_rows: usize,
    /// Ciphertexts sent.
    pub ciphertexts: usize,
    /// Ciphertext bytes sent.
    pub bytes: usize,
    /// False when the proxy had already counted this very contribution (a retry).
    pub newly_counted: bool,
    /// Whether the study was a preparatory histogram (of the row norms, or of
    /// each feature's values), which a study of the same owners follows (read from
    /// the spec the owner encrypted for).
    #[serde(default)]
    pub histogram: bool,
    /// Wall seconds spent encrypting, over every attempt.
    pub seconds_encrypt: f64,
    /// Wall seconds from the first attempt's start to the proxy's
    /// acknowledgement, the attempts before it and the pauses between them
    /// included.
    pub seconds_total: f64,
    /// Attempts made: more than one where the proxy could not be reached or the
    /// connection broke, and the owner tried again.
    #[serde(default)]
    pub attempts: u32,
    /// Times the share was encrypted: once, however many attempts, unless the
    /// data file or the study's spec changed between them.
    #[serde(default)]
    pub encryptions: u32,
    /// CPU time and peak memory of this owner's process, where `/proc` tells.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// This data set's budget at the proxy after this contribution: epsilon and
    /// delta spent over all studies, and the cap in force.
    #[serde(default)]
    pub budget: Option<BudgetReport>,
    /// This data set's budget in the owner's own ledger after this contribution
    /// (`owner --ledger`), where it keeps one: over every study charged to it, at
    /// every proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<BudgetReport>,
}

/// An owner's budget as the proxy (or the owner's ledger) keeps it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct BudgetReport {
    /// Epsilon spent over all studies.
    pub spent_epsilon: f64,
    /// Delta spent over all studies.
    pub spent_delta: f64,
    /// The cap's epsilon.
    pub cap_epsilon: f64,
    /// The cap's delta.
    pub cap_delta: f64,
}

impl From<&dpca_common::owner_budget::OwnerBudget> for BudgetReport {
    fn from(b: &dpca_common::owner_budget::OwnerBudget) -> Self {
        Self {
            spent_epsilon: b.spent_epsilon,
            spent_delta: b.spent_delta,
            cap_epsilon: b.cap_epsilon,
            cap_delta: b.cap_delta,
        }
    }
}
