//! Choosing every feature's bounds privately: a marginal histogram study run
//! first on the same owners, whose noisy counts give each feature's range,
//! center and scale ([`dpca_common::scaling`]).

use anyhow::Context;
use dpca_common::dp::{BudgetLedger, PrivacyRequest};
use dpca_common::paillier::SecretKey;
use dpca_common::scaling::{choose_scales, Scaling};
use dpca_common::study::{Marginals, StudySpec};
use dpca_proto::v1::proxy_client::ProxyClient;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::cohort::Cohort;
use crate::session::{collect_marginals, open_study, OpenedStudy};

/// How the bounds were chosen, as study.json reports it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BoundsChoice {
    /// The marginal study's id at the proxy.
    pub study_id: String,
    /// epsilon of the marginal study alone.
    pub epsilon: f64,
    /// delta of the marginal study alone.
    pub delta: f64,
    /// Bins per octave of its grid.
    pub per_octave: u32,
    /// Every feature's range, center and scale (in the features' order), the
    /// threshold the counts were read at and the noisy row count.
    pub scaling: Scaling,
}

impl BoundsChoice {
    /// The bounds the study maps to [-1, 1]: each feature's center plus or
    /// minus its scale.
    pub fn bounds(&self) -> Vec<(f64, f64)> {
        self.scaling.features.iter().map(|f| f.bounds()).collect()
    }

    /// Where each feature's values were found, which synthetic values are kept in.
    pub fn ranges(&self) -> Vec<(f64, f64)> {
        self.scaling.features.iter().map(|f| (f.lo, f.hi)).collect()
    }

    /// Features whose own histogram stood too little above the noise, which
    /// took the pooled range.
    pub fn pooled(&self) -> usize {
        self.scaling.features.iter().filter(|f| f.pooled).count()
    }
}

/// Runs the marginal histogram study of `spec`'s data with request `req` and
/// returns every feature's bounds, with what the study spent. `total_epsilon`
/// is the run's whole budget, for the message.
pub(crate) async fn choose_bounds(
    cohort: &impl Cohort,
    client: &mut ProxyClient<Channel>,
    sk: &SecretKey,
    spec: &StudySpec,
    req: PrivacyRequest,
    noise_free_for_testing: bool,
    total_epsilon: f64,
) -> anyhow::Result<(BoundsChoice, BudgetLedger)> {
    let grid = Marginals::standard();
    let spec_m = spec
        .marginal_histograms(grid.clone(), req)
        .context("marginal histogram study spec")?;
    let id = open_study(client, &spec_m, noise_free_for_testing, cohort.transport()).await?;
    eprintln!(
        "marginal histogram study {id} opened to choose the bounds (epsilon {:.4} of {total_epsilon})",
        req.epsilon
    );
    cohort
        .contribute(&id, &sk.public().fingerprint(), &spec_m)
        .await?;
    let study = OpenedStudy {
        noise_free_for_testing,
        ..OpenedStudy::new(&id, &spec_m)
    };
    let (counts, noise) = collect_marginals(client, cohort.transport(), sk, study).await?;
    let unit = Marginals::unit(spec_m.dim(), &spec_m.fixed) as f64;
    let scaling = choose_scales(&grid, &counts, &noise, unit);
    let choice = BoundsChoice {
        study_id: id,
        epsilon: req.epsilon,
        delta: req.delta,
        per_octave: grid.per_octave,
        scaling,
    };
    eprintln!(
        "bounds chosen privately for {} features (a count of {:.0} rows; {} took the pooled range)",
        choice.scaling.features.len(),
        choice.scaling.rows,
        choice.pooled()
    );
    Ok((choice, spec_m.budget_ledger()))
}
