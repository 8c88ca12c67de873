//! What a study spends: its released blocks' parts of the request, how they
//! compose, and how a request is split between two studies.

use serde::{Deserialize, Serialize};

use super::{epsilon_for, matrix_share, Centering, DpError, Part, PrivacyRequest};

/// What one released block of a study spends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetPart {
    /// The block and what it serves.
    pub part: String,
    /// epsilon of this block alone (at `delta` for the Gaussian mechanisms).
    pub epsilon: f64,
    /// delta of this block alone.
    pub delta: f64,
    /// zCDP rho of this block (zCDP-accounted Gaussian only).
    pub rho: Option<f64>,
}

/// The privacy a study spends, block by block, and composed. The default is the
/// ledger of a study that released nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetLedger {
    /// One entry per released block; everything derived later (PCA, synthetic data)
    /// is post-processing and spends nothing.
    pub parts: Vec<BudgetPart>,
    /// epsilon of the whole release: zCDP composition (rho adds) for `gaussian`,
    /// basic composition otherwise.
    pub epsilon: f64,
    /// delta of the whole release.
    pub delta: f64,
    /// Total zCDP rho (zCDP-accounted Gaussian only).
    pub rho: Option<f64>,
}

/// The budget ledger of a study: how `req` is split between the released blocks and
/// what the parts compose to (never more than asked; a test checks it).
pub fn budget_ledger(req: &PrivacyRequest, classes: bool) -> BudgetLedger {
    let names: Vec<(&str, f64)> = match req.centering {
        Centering::Mask => vec![("centered scatter N S (PCA, covariance)", 1.0)],
        Centering::DpMean if classes => {
            let share = matrix_share(req.mechanism, true);
            vec![
                ("second moments R or R_c (PCA, class covariances)", share),
                (
                    "class sums and counts (class means, proportions)",
                    1.0 - share,
                ),
            ]
        }
        Centering::DpMean => {
            let share = matrix_share(req.mechanism, false);
            vec![
                ("second moments R (PCA, covariance)", share),
                ("sum v (DP mean)", 1.0 - share),
            ]
        }
    };
    let count = names.len();
    let parts: Vec<BudgetPart> = names
        .iter()
        .map(|&(part, share)| {
            let spend = req.mechanism.spend(
                Part {
                    share,
                    parts: count,
                },
                req,
            );
            BudgetPart {
                part: part.into(),
                epsilon: spend.epsilon,
                delta: spend.delta,
                rho: spend.rho,
            }
        })
        .collect();
    compose(parts)
}

/// What released blocks compose to: zCDP when every part is accounted in rho (rho
/// adds, converted once at the parts' delta), basic composition otherwise (epsilon
/// and delta add).
fn compose(parts: Vec<BudgetPart>) -> BudgetLedger {
    let rhos: Option<Vec<f64>> = parts.iter().map(|p| p.rho).collect();
    match rhos {
        Some(rhos) if !rhos.is_empty() => {
            let rho: f64 = rhos.iter().sum();
            let delta = parts.iter().map(|p| p.delta).fold(0.0, f64::max);
            BudgetLedger {
                epsilon: epsilon_for(rho, delta),
                delta,
                rho: Some(rho),
                parts,
            }
        }
        _ => BudgetLedger {
            epsilon: parts.iter().map(|p| p.epsilon).sum(),
            delta: parts.iter().map(|p| p.delta).sum(),
            rho: None,
            parts,
        },
    }
}

/// Splits a request into two studies that compose to exactly it: `share` of the
/// zCDP rho and the rest (Gaussian, both at the request's delta, which the composed
/// rho meets); `share` of epsilon and of delta and the rest (basic composition, for
/// the others).
pub fn split_request(
    req: &PrivacyRequest,
    share: f64,
) -> Result<(PrivacyRequest, PrivacyRequest), DpError> {
    if !(share > 0.0 && share < 1.0) {
        return Err(DpError::BadShare(share));
    }
    let part = |s: f64| {
        let (epsilon, delta) = req.mechanism.split(req, s);
        PrivacyRequest::new(req.mechanism, req.centering, epsilon, delta)
    };
    Ok((part(share)?, part(1.0 - share)?))
}

/// The ledger of a marginal histogram study: its one released block, the
/// per-feature histograms, spends the whole request.
pub fn marginal_budget_ledger(req: &PrivacyRequest) -> BudgetLedger {
    let spend = req.mechanism.spend(Part::WHOLE, req);
    compose(vec![BudgetPart {
        part: "per-feature histograms (sums v)".into(),
        epsilon: spend.epsilon,
        delta: spend.delta,
        rho: spend.rho,
    }])
}

impl BudgetLedger {
    /// The ledger of two studies run one after the other on the same rows: the parts
    /// of both (named with their study), composed as [`budget_ledger`] composes
    /// parts (rho adds for `gaussian`; epsilon and delta add otherwise).
    pub fn then(self, first_name: &str, next: BudgetLedger, next_name: &str) -> BudgetLedger {
        Self::of_studies(vec![(first_name, self), (next_name, next)])
    }

    /// The ledger of studies run one after the other on the same rows, in order:
    /// every study's parts, each named with its study, composed as
    /// [`BudgetLedger::then`] composes two.
    pub fn of_studies(studies: Vec<(&str, BudgetLedger)>) -> BudgetLedger {
        compose(
            studies
                .into_iter()
                .flat_map(|(study, ledger)| {
                    ledger.parts.into_iter().map(move |p| BudgetPart {
                        part: format!("{study}: {}", p.part),
                        ..p
                    })
                })
                .collect(),
        )
    }
}
