//! Study properties that weaken the protection of an owner's rows below the
//! default (`dp-mean` centering, a proven mechanism, noise). An owner takes part in
//! a study that has one only if it accepts it by name (`owner --accept-risk NAME`),
//! so no operator or user can lower an owner's protection without its word.
//! docs/PRIVACY.md ("Threat model") says what each one trusts.

use crate::dp::Centering;
use crate::study::StudySpec;

/// One property of a study that an owner must accept by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Risk {
    /// The paper's `mask` centering: its sensitivity proof holds only while every
    /// owner's rows lie in the norm ball, which nobody can check under encryption,
    /// and its noise is calibrated to N.
    MaskCentering,
    /// The Wishart mechanism, whose privacy is not proven.
    WishartUnproven,
    /// A test-mode release without noise: the user reads the exact aggregate.
    NoiseFree,
}

/// A name that is no risk.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown risk `{0}`: expected one of mask-centering, wishart-unproven, noise-free")]
pub struct UnknownRisk(pub String);

impl Risk {
    /// Every risk, in the order they are reported.
    pub const ALL: [Risk; 3] = [Risk::MaskCentering, Risk::WishartUnproven, Risk::NoiseFree];

    /// The name an owner accepts it by.
    pub fn name(self) -> &'static str {
        match self {
            Risk::MaskCentering => "mask-centering",
            Risk::WishartUnproven => "wishart-unproven",
            Risk::NoiseFree => "noise-free",
        }
    }

    /// Parses [`Risk::name`].
    pub fn parse(name: &str) -> Result<Self, UnknownRisk> {
        Self::ALL
            .into_iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| UnknownRisk(name.to_string()))
    }

    /// What accepting it means, for the owner's refusal.
    pub fn trust(self) -> &'static str {
        match self {
            Risk::MaskCentering => {
                "uses `mask` centering: private only if every other owner keeps its rows \
                 in the norm ball, and the user learns each owner's row count (it checks \
                 the owners' signed counts before it decrypts N)"
            }
            Risk::WishartUnproven => "uses the Wishart mechanism, whose privacy is not proven",
            Risk::NoiseFree => "releases the aggregate without noise (test mode)",
        }
    }

    /// The risks a study carries; `noise_free` is the proxy's test-mode flag.
    pub fn of(spec: &StudySpec, noise_free: bool) -> Vec<Risk> {
        Self::ALL
            .into_iter()
            .filter(|r| match r {
                Risk::MaskCentering => spec.privacy.centering == Centering::Mask,
                Risk::WishartUnproven => !spec.privacy.mechanism.proven(),
                Risk::NoiseFree => noise_free,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_typos_are_refused() {
        for r in Risk::ALL {
            assert_eq!(Risk::parse(r.name()), Ok(r));
        }
        assert_eq!(
            Risk::parse("mask"),
            Err(UnknownRisk("mask".into())),
            "a risk is accepted by its full name only"
        );
    }
}
