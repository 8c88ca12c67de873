//! The user's output files and the printed summary.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use dpca_common::dp::BudgetLedger;
use dpca_common::linalg::Pca;
use dpca_common::study::{StudyLayout, StudySpec};
use dpca_shell::usage::Usage;

use crate::figures::{escape, Chart, Mark, Series};
use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

/// Wall times of one study, in seconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Seconds {
    /// Slowest owner, start to acknowledgement.
    pub owner: f64,
    /// The user's wait for the study to seal, after the owners were started or
    /// invited: at a remote proxy, for owners who may come hours later.
    #[serde(default)]
    pub seal: f64,
    /// The proxy's release computation (mask, noise, re-randomization).
    pub proxy: f64,
    /// The user's work: fetching, decryption and eigen-decomposition (key
    /// generation and the waits for the seal and the release excluded).
    pub user: f64,
    /// Key generation.
    pub keygen: f64,
    /// Whole run.
    pub total: f64,
}

/// The key of a study and the layout of its ciphertexts, as `study.json`
/// reports them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Encryption {
    /// Paillier modulus bits.
    pub key_bits: u64,
    /// SHA-256 fingerprint of the public key.
    pub key_fingerprint: String,
    /// Ciphertexts each owner sends.
    pub ciphertexts_per_owner: usize,
    /// Ciphertext bytes each owner sends.
    pub bytes_per_owner: usize,
    /// Ciphertexts of the release.
    pub release_ciphertexts: usize,
    /// Values packed per ciphertext.
    #[serde(default)]
    pub slots: usize,
    /// Bits per packed value.
    #[serde(default)]
    pub slot_width: u64,
    /// Values packed per ciphertext of the vector block.
    #[serde(default)]
    pub vector_slots: usize,
    /// Bits per packed value of the vector block.
    #[serde(default)]
    pub vector_slot_width: u64,
    /// Bits of the mask b (`mask` centering).
    #[serde(default)]
    pub mask_bits: u64,
}

impl Encryption {
    /// What `spec` and its `layout` say.
    pub fn of(spec: &StudySpec, layout: &StudyLayout) -> Self {
        let pk = &spec.public_key;
        Self {
            key_bits: pk.bits(),
            key_fingerprint: pk.fingerprint(),
            ciphertexts_per_owner: layout.owner_ciphertexts(),
            bytes_per_owner: layout.owner_ciphertexts() * pk.ciphertext_bytes(),
            release_ciphertexts: layout.release_ciphertexts(),
            slots: layout.budget.slots,
            slot_width: layout.budget.slot_width,
            vector_slots: layout.vector_budget.slots,
            vector_slot_width: layout.vector_budget.slot_width,
            mask_bits: layout.mask_bits,
        }
    }
}

/// A warning of a study, as study.json lists it: a stable `kind` that a caller
/// (the Python package) can word in its own terms, and the command line's text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// What it warns of: `bounds_from_data`, `classes_from_data`, `rows_clipped`.
    pub kind: String,
    /// The command line's wording.
    pub text: String,
}

impl Notice {
    /// A warning of `kind` worded `text`.
    pub fn new(kind: &str, text: impl Into<String>) -> Self {
        Self {
            kind: kind.to_string(),
            text: text.into(),
        }
    }
}

/// `study.json`: what was asked, what was spent and what it cost.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StudyReport {
    /// Study id at the proxy.
    pub study_id: String,
    /// Feature names.
    pub features: Vec<String>,
    /// Public bounds per feature.
    pub bounds: Vec<[f64; 2]>,
    /// Whether the bounds were read off the data (an insecure flag asked for it).
    pub bounds_from_data: bool,
    /// How the bounds were chosen privately, where no bounds file gave them:
    /// every feature's range, center and scale (`bounds` is center -/+ scale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds_choice: Option<crate::bounds::BoundsChoice>,
    /// Row L2 norm bound C in normalized units.
    pub row_norm_bound: f64,
    /// Fixed-point fractional bits.
    pub frac_bits: u32,
    /// Mechanism name.
    pub mechanism: String,
    /// Centering mode.
    pub centering: String,
    /// epsilon of this study's release alone; `budget.epsilon` is all that was
    /// spent (with the row-norm histogram that chose C, where one did).
    pub epsilon: f64,
    /// delta spent.
    pub delta: f64,
    /// zCDP rho, for the Gaussian mechanism.
    pub rho: Option<f64>,
    /// Noise standard deviation per entry of S in normalized units.
    pub sigma: f64,
    /// The DP mean in normalized units (`dp-mean` centering; post-processing of
    /// the release, like S'): what the components are centered on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<Vec<f64>>,
    /// The noise floor of S'/N: about the largest eigenvalue the release's noise
    /// alone would give (`NoiseMechanism::noise_edge` over N). Public, like sigma.
    #[serde(default)]
    pub noise_floor: f64,
    /// Components whose eigenvalue stands above the noise floor.
    #[serde(default)]
    pub components_above_noise: usize,
    /// When the outputs were written (RFC 3339, UTC).
    #[serde(default)]
    pub written_at: String,
    /// Noise scale on the integer grid (decimal).
    pub noise_scale_grid: String,
    /// True only for the test-only noise-free path.
    pub noise_free_for_testing: bool,
    /// Pooled rows N.
    pub n_rows: u64,
    /// Features M.
    pub n_features: usize,
    /// Owners counted.
    pub n_owners: usize,
    /// Invited owners whose contribution did not arrive.
    #[serde(default)]
    pub owners_missing: Vec<String>,
    /// Components written.
    pub k: usize,
    /// The key and the study's encrypted layout (at the top level of the JSON).
    #[serde(flatten)]
    pub encryption: Encryption,
    /// Rows shortened by the row-norm clip, over all owners; `None` where the
    /// user cannot know it (a study at a remote proxy: each owner's report says
    /// its own, and a count of them would reveal the data).
    pub clipped_rows: Option<usize>,
    /// The rows each owner reported, in owner order, where the user ran the
    /// owners (a local study); `None` at a remote proxy, for the same reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_rows: Option<Vec<u64>>,
    /// Whether the noisy scatter was projected onto the PSD cone.
    pub psd_repair: bool,
    /// Whether the study ran in the slow baseline mode.
    pub baseline: bool,
    /// PCA-Gauss synthetic rows written to `synthetic.csv` (0: none). They are
    /// post-processing of S' and the DP mean, so they spend no budget beyond
    /// `epsilon`, `delta` above.
    #[serde(default)]
    pub synthetic_rows: usize,
    /// Wall times.
    pub seconds: Seconds,
    /// CPU time and peak memory per role, where `/proc` tells.
    #[serde(default)]
    pub usage: RoleUsage,
    /// What the synthetic data is for: cluster, regress or classify.
    #[serde(default)]
    pub task: String,
    /// Class labels of a classification study.
    #[serde(default)]
    pub classes: Vec<String>,
    /// shared or per-class (classification only).
    #[serde(default)]
    pub class_covariance: Option<String>,
    /// How synthesis read the covariance: denoised or paper (with synthetic rows).
    #[serde(default)]
    pub covariance_fit: Option<String>,
    /// Noisy class counts as released (classification only).
    #[serde(default)]
    pub class_counts: Option<Vec<f64>>,
    /// Where the components came from: the private release, or a public file
    /// (Pub-PCA, no budget spent on them).
    #[serde(default)]
    pub pca_source: String,
    /// How C was chosen, where no --row-norm-bound gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_norm_choice: Option<RowNormChoice>,
    /// The budget spent per released block, and composed.
    pub budget: BudgetLedger,
    /// Whom the noise guards against, and at what epsilon ([`Trust`]).
    #[serde(default)]
    pub trust: Trust,
    /// What the run warned of (also printed, and on report.html).
    #[serde(default)]
    pub warnings: Vec<Notice>,
}

/// CPU time and peak memory of each role's process in one study.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RoleUsage {
    /// Each owner process, in owner order.
    pub owners: Vec<Option<Usage>>,
    /// The proxy process over its whole life (ingest and release).
    pub proxy: Option<Usage>,
    /// The user: CPU of the collect, decrypt and eigen-decomposition step only (key
    /// generation excluded); peak memory of the whole `user` process.
    pub user: Option<Usage>,
}

/// Every file a study writes into its output folder.
pub const OUTPUT_FILES: [&str; 6] = [
    "components.csv",
    "eigenvalues.csv",
    "scatter.csv",
    "study.json",
    "report.html",
    "synthetic.csv",
];

/// Makes `dir` ready for a study's outputs before anything is spent: created if
/// missing, checked writable (a file is written there and removed), and the
/// outputs of an earlier run removed, so a folder never mixes two studies (an
/// old synthetic.csv beside new components). A study whose outputs could not be
/// written would have spent the owners' budget for nothing.
pub fn prepare_out_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output folder {} (--out)", dir.display()))?;
    let probe = dir.join(".dpca-write-check");
    std::fs::write(&probe, b"").with_context(|| {
        format!(
            "cannot write in the output folder {} (--out)",
            dir.display()
        )
    })?;
    std::fs::remove_file(&probe).with_context(|| format!("cannot remove {}", probe.display()))?;
    for name in OUTPUT_FILES {
        let old = dir.join(name);
        match std::fs::remove_file(&old) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e)
                    .with_context(|| format!("cannot remove the earlier {}", old.display()))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Writes `components.csv`, `eigenvalues.csv`, `scatter.csv` and `study.json`.
pub fn write_outputs(
    dir: &Path,
    (features, pca, scatter): (&[String], &Pca, &DMatrix<f64>),
    report: &StudyReport,
    synthetic: Option<&crate::study_page::SyntheticView>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let k = pca.components.ncols();
    let mut w = csv_writer(&dir.join("components.csv"))?;
    let mut header = vec!["feature".to_string()];
    header.extend((1..=k).map(|i| format!("PC{i}")));
    w.write_record(&header)?;
    // A regression study's components span the features only, not the label.
    for (i, f) in features.iter().take(pca.components.nrows()).enumerate() {
        let mut rec = vec![f.clone()];
        rec.extend((0..k).map(|j| pca.components[(i, j)].to_string()));
        w.write_record(&rec)?;
    }
    w.flush()?;

    let mut w = csv_writer(&dir.join("eigenvalues.csv"))?;
    w.write_record(["component", "eigenvalue", "explained_variance_ratio"])?;
    for (i, (ev, r)) in pca.eigenvalues.iter().zip(&pca.explained_ratio).enumerate() {
        w.write_record([(i + 1).to_string(), ev.to_string(), r.to_string()])?;
    }
    w.flush()?;

    let mut w = csv_writer(&dir.join("scatter.csv"))?;
    w.write_record(features)?;
    for i in 0..scatter.nrows() {
        w.write_record((0..scatter.ncols()).map(|j| scatter[(i, j)].to_string()))?;
    }
    w.flush()?;

    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(dir.join("study.json"), json + "\n")
        .with_context(|| format!("cannot write {}", dir.display()))?;
    std::fs::write(
        dir.join("report.html"),
        crate::study_page::study_page(report, pca, synthetic),
    )
    .with_context(|| format!("cannot write {}", dir.join("report.html").display()))?;
    Ok(())
}

/// A self-contained HTML page (no scripts, no external files).
pub(crate) fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;max-width:700px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse}}td,th{{padding:2px 10px;border-bottom:1px solid #ddd;\
         text-align:left}}</style></head><body><h1>{t}</h1>\n{body}</body></html>\n",
        t = escape(title)
    )
}

pub(crate) fn table_rows(rows: &[(&str, String)]) -> String {
    let mut s = String::from("<table>");
    for (k, v) in rows {
        let _ = write!(s, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
    }
    s + "</table>\n"
}

/// One study of a privacy sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepPoint {
    /// The study's epsilon.
    pub epsilon: f64,
    /// tr(V_k' S V_k) / tr(U_k' S U_k): the share of the top-k variance of the
    /// exact scatter S that the private components V_k capture.
    pub captured_variance: f64,
    /// Noise sd per entry of S.
    pub sigma: f64,
    /// The study's output folder.
    pub out: String,
}

/// The report of a privacy sweep, written as `sweep.html`: the captured variance
/// against epsilon, and what the sweep spent.
pub fn sweep_page(points: &[SweepPoint], k: usize) -> String {
    let chart = Chart {
        title: format!("Captured variance of the top {k} components against epsilon"),
        x_label: "epsilon (log scale)".into(),
        y_label: "captured variance".into(),
        series: vec![Series {
            name: format!("k = {k}"),
            points: points
                .iter()
                .map(|p| (p.epsilon, p.captured_variance))
                .collect(),
            mark: Mark::Line,
        }],
        y_range: Some((0.0, 1.0)),
        log_x: true,
        marker: None,
    };
    let mut rows = String::from(
        "<table><tr><th>epsilon</th><th>captured variance</th><th>noise sd</th>\
         <th>outputs</th></tr>",
    );
    for p in points {
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{:.4}</td><td>{:.4e}</td><td>{}</td></tr>",
            p.epsilon,
            p.captured_variance,
            p.sigma,
            escape(&p.out)
        );
    }
    rows.push_str("</table>\n");
    let total: f64 = points.iter().map(|p| p.epsilon).sum();
    let body = format!(
        "<p>One study per epsilon on the same rows; each is scored against the exact \
         scatter S of the rows as the study preprocessed them, which only a run that \
         holds every row (a local simulation) can compute. The studies' budgets add up: \
         this sweep spent epsilon {total} on these rows. Use it on public data or a \
         stand-in to choose epsilon, then run the real study once.</p>\n{}\n{rows}",
        chart.svg()
    );
    page("Private PCA: privacy sweep", &body)
}

/// Writes `synthetic.csv`: the input's header (features, then the label column) and
/// the rows as CSV cells.
pub fn write_synthetic(dir: &Path, header: &[String], rows: &[Vec<String>]) -> anyhow::Result<()> {
    let mut w = csv_writer(&dir.join("synthetic.csv"))?;
    w.write_record(header)?;
    for row in rows {
        w.write_record(row)?;
    }
    w.flush()?;
    Ok(())
}

fn csv_writer(path: &Path) -> anyhow::Result<csv::Writer<std::fs::File>> {
    csv::Writer::from_path(path).with_context(|| format!("cannot create {}", path.display()))
}

/// The top-k eigenvalues as printed after a study: each one's share and the
/// cumulative share, and whether it stands above the noise floor (`floor`, an
/// eigenvalue of S'/N noise alone would reach); negative eigenvalues as they are.
pub fn variance_table(pca: &Pca, k: usize, floor: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>9}  {:>12}  {:>10}  {:>10}  vs noise",
        "component", "eigenvalue", "explained", "cumulative"
    );
    let mut cum = 0.0;
    for i in 0..k.min(pca.eigenvalues.len()) {
        cum += pca.explained_ratio[i];
        let _ = writeln!(
            out,
            "{:>9}  {:>12.4}  {:>9.2}%  {:>9.2}%  {}",
            format!("PC{}", i + 1),
            pca.eigenvalues[i],
            100.0 * pca.explained_ratio[i],
            100.0 * cum,
            if pca.eigenvalues[i] > floor {
                "above"
            } else {
                "within noise"
            }
        );
    }
    let above = above_noise(pca, floor);
    let _ = writeln!(
        out,
        "noise floor {floor:.4} (the largest eigenvalue noise alone would give): {}",
        match above {
            0 => "no component stands above it; these components are noise".to_string(),
            n if n < k => format!("only the first {n} of these {k} stand above it"),
            n => format!("all {k} stand above it ({n} in all)"),
        }
    );
    out
}

/// How many eigenvalues stand above `floor`.
pub fn above_noise(pca: &Pca, floor: f64) -> usize {
    pca.eigenvalues.iter().filter(|&&e| e > floor).count()
}

/// How the row-norm bound was chosen, for study.json.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RowNormChoice {
    /// The quantile asked for.
    pub quantile: f64,
    /// The chosen C (an upper bin edge).
    pub chosen: f64,
    /// Lower edges of the bins.
    pub edges: Vec<f64>,
    /// Noisy counts per bin (post-processing of the histogram study).
    pub counts: Vec<f64>,
    /// Privacy of the histogram study alone.
    pub epsilon: f64,
    /// Its delta.
    pub delta: f64,
    /// Its proxy study id.
    pub study_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key and layout facts stay at the top level of `study.json`, where
    /// readers of earlier files look for them, and a file written before the
    /// later of them (slots, mask bits) still reads.
    #[test]
    fn study_json_keeps_its_keys() {
        let report = StudyReport {
            encryption: Encryption {
                key_bits: 2048,
                ciphertexts_per_owner: 95,
                mask_bits: 40,
                ..Default::default()
            },
            ..Default::default()
        };
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["key_bits"], 2048);
        assert_eq!(json["ciphertexts_per_owner"], 95);
        assert_eq!(json["mask_bits"], 40);
        assert!(json.get("encryption").is_none(), "{json}");
        let mut older = json.clone();
        let fields = older.as_object_mut().expect("an object");
        for later in [
            "slots",
            "slot_width",
            "vector_slots",
            "vector_slot_width",
            "mask_bits",
        ] {
            fields.remove(later);
        }
        let read: StudyReport = serde_json::from_value(older).expect("an older file reads");
        assert_eq!(read.encryption.ciphertexts_per_owner, 95);
        assert_eq!(read.encryption.mask_bits, 0);
    }

    #[test]
    fn the_sweep_page_adds_up_what_the_sweep_spent() {
        let pts: Vec<SweepPoint> = [0.5, 1.0, 2.0]
            .iter()
            .map(|&e| SweepPoint {
                epsilon: e,
                captured_variance: e / 2.0,
                sigma: 1.0 / e,
                out: format!("out/epsilon-{e}"),
            })
            .collect();
        let html = sweep_page(&pts, 10);
        assert!(html.contains("spent epsilon 3.5"));
        assert_eq!(html.matches("<circle").count(), 3);
        assert!(html.contains("out/epsilon-0.5"));
    }
}

/// Whom a run's noise guards against: who drew it, and the epsilon (at the
/// run's delta) against the user alone, against the user with up to
/// `colluding_owners` owners, and against the proxy working with the user
/// (docs/PRIVACY.md, "Noise from the owners").
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Trust {
    /// Who drew the noise.
    pub noise_from: NoiseFrom,
    /// epsilon against the user alone, the proxy following the protocol and every
    /// owner's share in: each study sealed with `min_owners` at the fewest.
    pub epsilon_against_user: f64,
    /// epsilon against the user and `colluding_owners` owners together, the proxy
    /// aggregating as it should (whether or not it adds noise of its own).
    pub epsilon_against_user_and_owners: f64,
    /// epsilon of each owner's rows against the proxy working with the user.
    /// Unmasked, they decrypt its contribution alone, with only its own noise
    /// share on it; masked, they read only the sum the holder unmasks, as the
    /// user alone does. `None` where the proxy drew the noise: the contribution
    /// then carries none.
    pub epsilon_against_proxy_and_user: Option<f64>,
    /// The owners the study allows to work with the user (t).
    pub colluding_owners: u32,
    /// Whether the owners masked their contributions, with a mask holder
    /// (docs/PRIVACY.md, "Masked contributions").
    #[serde(default)]
    pub masked: bool,
}

/// Who drew a run's noise.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NoiseFrom {
    /// The proxy (`mask`, and mechanisms that do not split over owners).
    #[default]
    Proxy,
    /// Each owner a share ([`dpca_common::dp::distributed`]).
    Owners,
    /// Nobody: the noise-free test mode.
    None,
}

impl Trust {
    /// The guarantees of a run spending `budget` on studies of `spec`'s cohort
    /// and noise. Where the owners add the noise each share is sized for
    /// h = min_owners - t honest owners, so rho scales by h / min_owners against
    /// the user alone, stays the budget's against the user with t owners, and is
    /// h times the budget's for one share alone.
    pub fn of(spec: &StudySpec, budget: &BudgetLedger, noise_free: bool) -> Self {
        let (t, m) = (spec.colluding_owners, spec.min_owners.max(1));
        if noise_free {
            return Self {
                noise_from: NoiseFrom::None,
                epsilon_against_user: f64::INFINITY,
                epsilon_against_user_and_owners: f64::INFINITY,
                epsilon_against_proxy_and_user: None,
                colluding_owners: t,
                masked: false,
            };
        }
        if !spec.owners_add_noise() {
            return Self {
                noise_from: NoiseFrom::Proxy,
                epsilon_against_user: budget.epsilon,
                epsilon_against_user_and_owners: budget.epsilon,
                epsilon_against_proxy_and_user: None,
                colluding_owners: t,
                masked: false,
            };
        }
        let h = dpca_common::dp::distributed::honest_shares(m, t);
        let scaled = |shares_calibrated: u32, present: u32| match budget.rho {
            Some(rho) => dpca_common::dp::epsilon_for(
                rho * f64::from(shares_calibrated) / f64::from(present),
                budget.delta,
            ),
            None => f64::INFINITY,
        };
        let against_user = scaled(h, m).min(budget.epsilon);
        let masked = spec.mask_holder.is_some();
        let pair = match masked {
            true => against_user,
            false => scaled(h, 1).max(budget.epsilon),
        };
        Self {
            noise_from: NoiseFrom::Owners,
            epsilon_against_user: against_user,
            epsilon_against_user_and_owners: budget.epsilon,
            epsilon_against_proxy_and_user: Some(pair),
            colluding_owners: t,
            masked,
        }
    }

    /// One line for a summary: who drew the noise and the guarantees.
    pub fn line(&self) -> String {
        match (self.noise_from, self.epsilon_against_proxy_and_user) {
            (NoiseFrom::None, _) => "no noise drawn (the noise-free test mode): no privacy".into(),
            (NoiseFrom::Owners, Some(pair)) => format!(
                "noise drawn by the owners: epsilon {:.4} against the user alone, {:.4} against \
                 the user with {}, {:.4} for each owner against the proxy working with the user \
                 ({})",
                self.epsilon_against_user,
                self.epsilon_against_user_and_owners,
                dpca_shell::text::count(self.colluding_owners, "owner"),
                pair,
                match self.masked {
                    true => "contributions masked: they read only sums the mask holder unmasks",
                    false => "they decrypt its contribution, with its own noise share alone",
                },
            ),
            (NoiseFrom::Owners | NoiseFrom::Proxy, _) => format!(
                "noise drawn by the proxy: epsilon {:.4} against the user, none against the \
                 proxy working with the user",
                self.epsilon_against_user
            ),
        }
    }
}

#[cfg(test)]
mod trust_tests {
    use super::*;
    use dpca_common::dp::{budget_ledger, epsilon_for};
    use dpca_common::study::SpecDraft;

    /// Three owners, t = 1: h = 2 shares carry the study's noise. Against the
    /// user alone rho is 2/3 of the budget's; with one owner, the budget's; for
    /// one owner's contribution read by the proxy and the user, twice it.
    #[test]
    fn the_guarantees_scale_with_the_shares_each_faces() {
        let key = dpca_common::testing::test_key();
        let spec = SpecDraft {
            min_owners: 3,
            quorum: 3,
            colluding_owners: 1,
            ..dpca_common::testing::test_draft(key.public(), 4)
        }
        .validate()
        .expect("spec");
        let budget = budget_ledger(&spec.privacy, false);
        let rho = budget.rho.expect("zCDP");
        let trust = Trust::of(&spec, &budget, false);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert_eq!(trust.noise_from, NoiseFrom::Owners);
        assert!(close(
            trust.epsilon_against_user,
            epsilon_for(rho * 2.0 / 3.0, budget.delta)
        ));
        assert!(close(trust.epsilon_against_user_and_owners, budget.epsilon));
        let pair = trust
            .epsilon_against_proxy_and_user
            .expect("owners' shares");
        assert!(close(pair, epsilon_for(2.0 * rho, budget.delta)), "{pair}");
        assert!(!trust.masked);
        // Masked, the pair reads only the sums the holder unmasks.
        let masked = SpecDraft {
            mask_holder: Some("https://holder:50052".into()),
            ..spec.to_draft()
        }
        .validate()
        .expect("masked spec");
        let trust = Trust::of(&masked, &budget, false);
        assert!(trust.masked);
        assert_eq!(
            trust.epsilon_against_proxy_and_user,
            Some(trust.epsilon_against_user)
        );
    }
}
