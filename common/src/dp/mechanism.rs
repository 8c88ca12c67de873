//! What a noise mechanism is: how it calibrates one released block to its
//! sensitivity and a part of the budget, what that part spends, how it splits a
//! budget, and what it supports. Each mechanism is one type in its own file
//! (`gaussian`, `gaussian_classic`, `laplace`, `wishart`), opening with its
//! privacy contract; studies name it through the [`Mechanism`] handle, and the
//! registry in `dp/mod.rs` lists them all.

use super::{DpError, NoiseScale, PrivacyRequest};

/// One released block as a mechanism sees it: its sensitivities in grid units
/// (already multiplied by N where the released query is N S~) and its shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Block {
    /// L2 sensitivity (Frobenius, for a matrix).
    pub l2: f64,
    /// L1 sensitivity (of the upper triangle, for a matrix).
    pub l1: f64,
    /// Trace sensitivity (a matrix only; 0 for a vector).
    pub trace: f64,
    /// What is released.
    pub shape: Shape,
}

/// The shape of a released block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// The upper triangle of a symmetric `dim` x `dim` matrix.
    Matrix {
        /// Rows (and columns) of the matrix.
        dim: usize,
    },
    /// A vector of independent entries.
    Vector,
}

/// The part of a request one block spends: `share` of the budget, as one of
/// `parts` blocks that compose to the whole request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Part {
    /// Share of the budget, in (0, 1].
    pub share: f64,
    /// How many blocks share the request.
    pub parts: usize,
}

impl Part {
    /// The whole request, spent by a single block.
    pub const WHOLE: Part = Part {
        share: 1.0,
        parts: 1,
    };
}

/// What a block spends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spend {
    /// epsilon of the block alone (at `delta`).
    pub epsilon: f64,
    /// delta of the block alone.
    pub delta: f64,
    /// zCDP rho of the block, for a mechanism accounted in zCDP.
    pub rho: Option<f64>,
}

/// A noise mechanism. Implementations state their privacy contract where they are
/// defined: neighbor relation, the sensitivity they use, the guarantee, the
/// citation and the docs/PRIVACY.md section. The property test
/// `dp::tests::no_mechanism_spends_more_than_its_part` checks every registered
/// mechanism's calibration against [`NoiseMechanism::spent_by`].
pub trait NoiseMechanism: Send + Sync {
    /// The CLI and wire name.
    fn name(&self) -> &'static str;

    /// Whether the mechanism spends delta (false: pure epsilon-DP).
    fn uses_delta(&self) -> bool;

    /// Refuses an epsilon or delta the mechanism's analysis does not cover (both
    /// are already checked to be in range).
    fn check(&self, _epsilon: f64, _delta: f64) -> Result<(), DpError> {
        Ok(())
    }

    /// Whether its privacy has a proof. An unproven mechanism is never a default,
    /// every owner must accept it by name, and it is refused where a study needs
    /// more than its plain analysis (classes, histograms).
    fn proven(&self) -> bool {
        true
    }

    /// Whether it has the sensitivities of a classification study, where a row
    /// may change class.
    fn supports_classes(&self) -> bool {
        true
    }

    /// Whether owners can each add a share of its noise that sums to it
    /// ([`super::distributed`]); the proxy draws the noise of the others.
    fn splits_over_owners(&self) -> bool {
        false
    }

    /// The share of the budget the matrix gets in a classification study.
    fn class_matrix_share(&self) -> f64 {
        super::CLASS_MATRIX_SHARE
    }

    /// The zCDP rho a whole request spends, for a mechanism accounted in zCDP.
    fn rho(&self, _req: &PrivacyRequest) -> Option<f64> {
        None
    }

    /// The noise of `block` when it spends `part` of `req`: never less than the
    /// mechanism's guarantee needs for that part.
    fn calibrate(&self, block: &Block, part: Part, req: &PrivacyRequest) -> NoiseScale;

    /// What `part` of `req` spends, as the budget ledger writes it down.
    fn spend(&self, part: Part, req: &PrivacyRequest) -> Spend;

    /// The (epsilon, delta) of a request for `share` of `req`, such that it and
    /// the request for the rest compose to `req`.
    fn split(&self, req: &PrivacyRequest, share: f64) -> (f64, f64);

    /// About the largest eigenvalue the noise alone gives a `dim` x `dim`
    /// scatter whose entries have standard deviation `entry_sd`: the noise floor
    /// a signal's eigenvalue must stand above to be told from noise. Public
    /// (it depends on the noise level only), so drawing it spends nothing.
    fn noise_edge(&self, entry_sd: f64, dim: usize) -> f64;

    /// What noise `scale` on `block` spends by the mechanism's theorem, at the
    /// delta of `part`: the inverse of [`NoiseMechanism::calibrate`]. `None` when
    /// the scale is not one this mechanism samples. Tests search with it for a
    /// calibration that spends more than its part.
    fn spent_by(
        &self,
        block: &Block,
        scale: &NoiseScale,
        part: Part,
        req: &PrivacyRequest,
    ) -> Option<Spend>;
}

/// A mechanism as a study names it: a handle on one registered
/// [`NoiseMechanism`], compared by name.
#[derive(Clone, Copy)]
pub struct Mechanism(&'static dyn NoiseMechanism);

impl Mechanism {
    /// The handle of a mechanism (for its registry entry and its constant).
    pub const fn new(mechanism: &'static dyn NoiseMechanism) -> Self {
        Self(mechanism)
    }

    /// Every registered mechanism, in the order of the registry.
    pub fn all() -> &'static [Mechanism] {
        super::MECHANISMS
    }

    /// Parses the CLI/wire name.
    pub fn parse(name: &str) -> Result<Self, DpError> {
        Self::all()
            .iter()
            .find(|m| m.name() == name)
            .copied()
            .ok_or_else(|| DpError::UnknownMechanism {
                name: name.to_string(),
                known: Self::all()
                    .iter()
                    .map(|m| m.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

impl std::ops::Deref for Mechanism {
    type Target = dyn NoiseMechanism;

    fn deref(&self) -> &Self::Target {
        self.0
    }
}

impl PartialEq for Mechanism {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Mechanism {}

impl std::fmt::Debug for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
