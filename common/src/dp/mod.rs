//! Differential privacy: mechanisms, their sensitivities, calibration and exact
//! sampling of symmetric noise on the fixed-point grid.
//!
//! # Neighbor relation
//! Bounded DP, as in DPDP-PCA: two pooled tables are neighbors when they have the
//! same number of rows N (public) and differ in one row, replaced by another. Every
//! encoded row obeys ||x~||_2 <= Cq = floor(C 2^f) exactly (see `encoding`).
//!
//! # What is released
//! - `mask` centering (the paper's): the user learns N S~ + E' where
//!   S~ = R~ - v~ v~^T / N is the centered scatter on the grid (N S~ is an integer
//!   matrix) and E' is symmetric integer noise; v is hidden by a uniform mask. The
//!   noise is calibrated to the sensitivity of N S~ and sampled at that scale, never
//!   as N times a smaller sample: N E would make T - v' v'^T = -v v^T (mod N) and
//!   hand the user v v^T mod N in clear (see docs/PRIVACY.md).
//! - `dp-mean` centering: the user learns R~ + E_R and v~ + e_v, with the budget
//!   split between them (90% to R, which carries most of the signal).
//!
//! # Layout
//! - [`mechanism`]: what a noise mechanism is ([`NoiseMechanism`]) and the handle
//!   studies name one by ([`Mechanism`]); one file per mechanism, each opening
//!   with its privacy contract, listed in [`MECHANISMS`] below.
//! - `sensitivity`: the released blocks' sensitivities, with their derivations.
//! - `noise`: the noise plan of a study and exact sampling on the grid
//!   ([`sampler`]).
//! - `budget`: what a study spends, block by block, and splitting a request.
//! - [`distributed`]: the noise owners add themselves, split over them.
//! - `request`: the validated request; `zcdp`: conversions to (epsilon, delta).
//!
//! Adding a mechanism is one file implementing [`NoiseMechanism`] plus its `mod`
//! line and its entry in [`MECHANISMS`]; the frozen plans
//! (`dp/frozen_plans.txt`) then ask for its lines.

mod budget;
pub mod distributed;
pub mod mechanism;
mod noise;
mod request;
pub mod sampler;
mod sensitivity;
mod zcdp;

mod gaussian;
mod gaussian_classic;
mod laplace;
mod wishart;

pub use budget::{budget_ledger, marginal_budget_ledger, split_request, BudgetLedger, BudgetPart};
pub use mechanism::{Block, Mechanism, NoiseMechanism, Part, Shape, Spend};
#[cfg(test)]
pub(crate) use noise::ceil_big;
pub use noise::{
    matrix_share, plan_marginal_noise, plan_noise, plan_noise_blocks, NoisePlan, NoiseScale,
    CLASS_MATRIX_SHARE, DP_MEAN_MATRIX_SHARE, LAPLACE_CLASS_MATRIX_SHARE, OVERFLOWED_SCALE_BITS,
};
pub use request::{Centering, DpError, PrivacyRequest};
pub use sensitivity::Sensitivity;
pub use zcdp::{classic_factor, epsilon_for, rho_for, zcdp_delta};

/// Every mechanism a study may name, in the order help texts list them; the
/// first is the default.
pub static MECHANISMS: &[Mechanism] = &[
    Mechanism::GAUSSIAN,
    Mechanism::GAUSSIAN_CLASSIC,
    Mechanism::LAPLACE,
    Mechanism::WISHART_UNPROVEN,
];

#[cfg(test)]
mod tests;
