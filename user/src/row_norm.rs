//! Choosing the row bound C privately: a row-norm histogram study run first on
//! the same owners, whose noisy counts give a quantile of the rows' norms.

use anyhow::Context;
use dpca_common::dp::{BudgetLedger, PrivacyRequest};
use dpca_common::paillier::SecretKey;
use dpca_common::study::StudySpec;
use dpca_proto::v1::proxy_client::ProxyClient;
use tonic::transport::Channel;

use crate::cohort::Cohort;
use crate::report::RowNormChoice;
use crate::session::{collect_bins, open_study, OpenedStudy};

/// Runs the histogram study of `spec`'s rows with request `h` and returns C as
/// the `q` quantile of the rows' norms, with what the histogram spent.
/// `total_epsilon` is the run's whole budget, for the message.
pub(crate) async fn choose_row_norm(
    cohort: &impl Cohort,
    client: &mut ProxyClient<Channel>,
    sk: &SecretKey,
    spec: &StudySpec,
    (q, h): (f64, PrivacyRequest),
    noise_free_for_testing: bool,
    total_epsilon: f64,
) -> anyhow::Result<(RowNormChoice, BudgetLedger)> {
    let spec_h = spec.norm_histogram(h).context("study spec")?;
    let bins = spec_h
        .norm_bins
        .clone()
        .context("a histogram study has bins")?;
    let hid = open_study(client, &spec_h, noise_free_for_testing, cohort.transport()).await?;
    eprintln!(
        "row-norm histogram study {hid} opened (epsilon {:.4} of {total_epsilon})",
        h.epsilon
    );
    cohort
        .contribute(&hid, &sk.public().fingerprint(), &spec_h)
        .await?;
    let histogram = OpenedStudy {
        noise_free_for_testing,
        ..OpenedStudy::new(&hid, &spec_h)
    };
    let counts = collect_bins(client, cohort.transport(), sk, histogram).await?;
    let chosen = bins.quantile(&counts, q);
    eprintln!("row-norm bound C = {chosen:.4}: the {q} quantile of the row norms");
    let choice = RowNormChoice {
        quantile: q,
        chosen,
        edges: bins.edges.clone(),
        counts,
        epsilon: h.epsilon,
        delta: h.delta,
        study_id: hid,
    };
    Ok((choice, spec_h.budget_ledger()))
}
