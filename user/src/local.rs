//! `user local` and `user study`: one study, from options to written outputs.
//! A local run starts the proxy and every owner as separate programs talking
//! gRPC over loopback; a study at a remote proxy invites owners that run
//! elsewhere. Both are the same steps over a cohort (`cohort::Cohort`): plan
//! (`plan`, no I/O), key, open (with the row-norm histogram first, `row_norm`),
//! contributions, collection (`session`), analysis (`analysis`), report.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use dpca_common::data::{read_csv, read_schema};
use dpca_common::dp::{BudgetLedger, Centering, Mechanism};
use dpca_common::paillier::SecretKey;
use dpca_common::study::{ClassCovariance, SpecDraft, StudyLayout, StudySpec};
use dpca_common::synth::{task_projection, FitKind, Task};
use dpca_shell::owner_report::OwnerReport;
use dpca_shell::text::count;
use dpca_shell::tls::Transport;
use dpca_shell::usage::Usage;
use nalgebra::DMatrix;
use rand::rngs::OsRng;

use crate::analysis::{analyze, in_input_order, Analysis, OutputUnits};
use crate::axes::load_axes;
use crate::bounds::{choose_bounds, BoundsChoice};
use crate::cohort::{Cohort, InvitedCohort, LocalCohort};
use crate::plan::{Inputs, StudyPlan};
use crate::report::{
    variance_table, write_outputs, write_synthetic, Encryption, Notice, RoleUsage, RowNormChoice,
    Seconds, StudyReport,
};
use crate::row_norm::choose_row_norm;
use crate::session::{collect, open_study, Collected, OpenedStudy};

pub use crate::slicing::{equal_slices, owner_name, split_rows, SliceLayout};
pub use crate::sweep::sweep;

/// The bundled real data set `local` uses when no `--data` is given.
pub fn bundled_data() -> PathBuf {
    crate::programs::workspace_root()
        .join("data")
        .join("optdigits.csv")
}

/// The public bounds of the bundled data set (pixel counts 0..16).
pub fn bundled_bounds() -> PathBuf {
    crate::programs::workspace_root()
        .join("data")
        .join("optdigits.bounds.csv")
}

/// Options of a local study.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Input CSV; `None` means the bundled optdigits.
    pub data: Option<PathBuf>,
    /// Number of owner processes.
    pub owners: usize,
    /// Components to write.
    pub k: usize,
    /// epsilon.
    pub epsilon: f64,
    /// delta; `None` means 1/N^1.1.
    pub delta: Option<f64>,
    /// Mechanism.
    pub mechanism: Mechanism,
    /// Centering mode.
    pub centering: Centering,
    /// Label column to exclude.
    pub label: Option<String>,
    /// Bounds file; `None` chooses them privately (a marginal histogram study),
    /// except for the bundled data set whose public bounds ship with it.
    pub bounds: Option<PathBuf>,
    /// INSECURE: with no bounds file, read the bounds off the data.
    pub insecure_bounds_from_data: bool,
    /// Share of the budget the marginal histograms that choose the bounds spend.
    pub bounds_budget_share: f64,
    /// Row L2 norm bound C in normalized units.
    pub row_norm_bound: f64,
    /// Paillier modulus bits.
    pub key_bits: u64,
    /// Project S' onto the PSD cone before the eigen-decomposition.
    pub psd_repair: bool,
    /// Output folder.
    pub out: PathBuf,
    /// TEST ONLY: ask the proxy (started in test mode) for a noise-free release.
    pub noise_free_for_testing: bool,
    /// TEST ONLY: start the run's proxy drawing none of its own noise
    /// (`--test-skips-noise`), as a proxy that skips it would.
    pub test_proxy_skips_noise: bool,
    /// TEST ONLY: the run's first owner adds no noise share
    /// (`owner --test-adds-no-noise`), as an owner working with the user would.
    pub test_owner_adds_no_noise: bool,
    /// Owners that may work with the proxy and the user (t): each owner's noise
    /// share is calibrated for `min_owners - t` honest owners.
    pub colluding_owners: u32,
    /// Skip `cargo build` of the sibling binaries.
    pub no_build: bool,
    /// Rows of each owner's slice, in the table's order (empty: equal slices of
    /// `owners`); their count is `owners`.
    pub slice_rows: Vec<usize>,
    /// The proxy and owner programs to start; `None` finds them next to this
    /// program.
    pub programs: Option<crate::programs::Programs>,
    /// The paper's way, for speed comparisons: one value per ciphertext, textbook
    /// randomness, no CRT, one thread per role.
    pub baseline: bool,
    /// Rows of PCA-Gauss synthetic data to write (needs `dp-mean`).
    pub synthetic: Option<usize>,
    /// What the synthetic data is for: decides what the study releases.
    pub task: Task,
    /// Shared or per-class covariances (classification only).
    pub class_covariance: ClassCovariance,
    /// The public class labels (classification); empty reads them off the data,
    /// which only a local demo may do.
    pub classes: Vec<String>,
    /// How synthesis reads the covariance from the release: denoised or the paper's.
    pub covariance_fit: FitKind,
    /// Pub-PCA: take the axes from the PCA of this public CSV (same features); the
    /// study then releases R of the rows projected onto them (the second round).
    pub pca_from: Option<PathBuf>,
    /// Take the axes from `components.csv` of an earlier study (DP PCA as the
    /// independent source); the study releases R of the projected rows.
    pub components_from: Option<PathBuf>,
    /// Choose C as this DP quantile of the rows' norms, from a row-norm histogram
    /// study run first on the same owners (replaces `row_norm_bound`).
    pub row_norm_quantile: Option<f64>,
    /// Share of the budget the histogram study spends (the rest goes to the study).
    pub quantile_budget_share: f64,
    /// Run without TLS (otherwise a throwaway development CA and certificates for
    /// the proxy, the user and every owner are made for the run and deleted after).
    pub insecure_plaintext: bool,
    /// A study at a proxy that runs elsewhere (`user study`): nothing is started
    /// here, `data` is only the schema (its header), and the owners are invited.
    pub remote: Option<Remote>,
    /// Print the warnings to standard error as they arise (the command line);
    /// the Python package raises them as its own from study.json instead.
    pub print_warnings: bool,
}

/// A study at a running proxy, with owners the user only invites.
#[derive(Clone, Debug)]
pub struct Remote {
    /// The proxy's URL.
    pub proxy: String,
    /// The user's certificate (or plaintext, asked for by name).
    pub transport: Transport,
    /// The owners invited, by certificate name.
    pub owners: Vec<String>,
    /// Owners whose contributions seal the study.
    pub quorum: u32,
    /// Owners enough to seal at the deadline.
    pub min_owners: u32,
    /// Time from opening to the deadline.
    pub deadline: Duration,
    /// Public upper bound on the pooled rows.
    pub max_rows: u64,
    /// Where to write the owners' invitation.
    pub invitation: Option<PathBuf>,
    /// The URL of the mask holder, a proxy of another operator that keeps the
    /// owners' mask seeds (`None`: contributions are not masked).
    pub mask_holder: Option<String>,
}

/// The input table, its label column and its bounds file: as given, or the
/// bundled optdigits with its label and public bounds.
pub(crate) fn input_files(opts: &LocalOptions) -> (PathBuf, Option<String>, Option<PathBuf>) {
    match &opts.data {
        Some(d) => (d.clone(), opts.label.clone(), opts.bounds.clone()),
        None => (
            bundled_data(),
            Some(opts.label.clone().unwrap_or_else(|| "label".into())),
            Some(opts.bounds.clone().unwrap_or_else(bundled_bounds)),
        ),
    }
}

/// Reads what the plan needs: the input (its header alone for a remote study,
/// whose user sees no rows) and the bounds file.
fn read_inputs(opts: &LocalOptions) -> anyhow::Result<Inputs> {
    let (data, label, bounds_path) = input_files(opts);
    let name = data.display().to_string();
    let file = std::fs::File::open(&data).with_context(|| format!("cannot open {name}"))?;
    let table = match opts.remote {
        Some(_) => read_schema(file, &name, label.as_deref())?,
        None => read_csv(file, &name, label.as_deref())?,
    };
    let bounds = match bounds_path {
        Some(p) => {
            let bytes = std::fs::read(&p)
                .with_context(|| format!("cannot open bounds file {}", p.display()))?;
            Some((p, bytes))
        }
        None => None,
    };
    Ok(Inputs {
        table,
        name,
        label,
        bounds,
    })
}

/// Runs a whole study and returns its report.
pub async fn run(opts: &LocalOptions) -> anyhow::Result<StudyReport> {
    let plan = StudyPlan::new(opts, read_inputs(opts)?)?;
    // Before any study is opened: nothing is spent on outputs that cannot land.
    crate::report::prepare_out_dir(&opts.out)?;
    if opts.print_warnings {
        for warning in &plan.warnings {
            eprintln!("WARNING: {}", warning.text);
        }
    }
    // Read before the key: a bad axes file should not cost a keygen.
    let axes = load_axes(
        opts,
        &plan,
        plan.input_label.as_deref(),
        (&plan.bounds, opts.row_norm_bound),
    )?;
    match &opts.remote {
        Some(remote) => {
            let (e, d) = plan.budget_cap;
            eprintln!(
                "each invited owner's budget is charged epsilon {e:.4}, delta {d:.3e} by this \
                 run's studies (their epsilons and deltas added, as owners' budgets add them): \
                 their --budget-cap must leave that much"
            );
            let started = Instant::now();
            let cohort = InvitedCohort::new(remote.clone())?;
            conduct(opts, &plan, axes, &cohort, started).await
        }
        None => {
            // Built after the inputs are checked and before the clock starts: a
            // build is not the study (study.json's total).
            let programs = match &opts.programs {
                Some(p) => p.clone(),
                None => crate::programs::sibling_binaries(opts.no_build)?,
            };
            let started = Instant::now();
            let cohort = LocalCohort::start(opts, &plan, programs).await?;
            conduct(opts, &plan, axes, &cohort, started).await
        }
    }
}

/// A study opened at the proxy, with what was decided on the way.
struct Prepared {
    spec: StudySpec,
    layout: StudyLayout,
    study_id: String,
    axes: Option<DMatrix<f64>>,
    bounds_choice: Option<BoundsChoice>,
    row_norm_choice: Option<RowNormChoice>,
    /// What the preparatory studies spent, by name, in the order they ran.
    spent_before: Vec<(&'static str, BudgetLedger)>,
}

impl Prepared {
    /// What the run spends: the preparatory studies', then the study's, composed.
    fn budget(&self) -> BudgetLedger {
        if self.spent_before.is_empty() {
            return self.spec.budget_ledger();
        }
        let mut studies: Vec<(&str, BudgetLedger)> = self
            .spent_before
            .iter()
            .map(|(name, ledger)| (*name, ledger.clone()))
            .collect();
        studies.push(("study", self.spec.budget_ledger()));
        BudgetLedger::of_studies(studies)
    }

    /// Where synthetic values are kept: the ranges the marginal study found, or
    /// the bounds.
    fn synthetic_ranges(&self) -> Vec<(f64, f64)> {
        match &self.bounds_choice {
            Some(choice) => choice.ranges(),
            None => self.spec.bounds.clone(),
        }
    }
}

/// What one run measured and spent, beside the release.
struct RunFacts {
    owners: Vec<OwnerReport>,
    budget: BudgetLedger,
    seconds: Seconds,
    usage: RoleUsage,
}

/// Where the user's part (collect, decrypt, analyze) began, to measure it from.
struct UserStart {
    at: Instant,
    usage: Option<Usage>,
}

impl UserStart {
    /// Now, before the user waits for the seal.
    fn now() -> Self {
        Self {
            at: Instant::now(),
            usage: Usage::of_self(),
        }
    }

    /// Each role's seconds (the slowest owner's), beside the key's generation
    /// and the whole run's since `started`.
    fn seconds(
        &self,
        owners: &[OwnerReport],
        got: &Collected,
        keygen: f64,
        started: Instant,
    ) -> Seconds {
        Seconds {
            owner: owners.iter().map(|r| r.seconds_total).fold(0.0, f64::max),
            seal: got.seconds_seal,
            proxy: got.seconds_proxy,
            // The waits for the owners and for the proxy's release are theirs.
            user: self.at.elapsed().as_secs_f64() - got.seconds_seal - got.seconds_proxy,
            keygen,
            total: started.elapsed().as_secs_f64(),
        }
    }

    /// Each role's CPU and peak memory; the user's CPU since this start.
    fn usage(&self, owners: &[OwnerReport], proxy: Option<Usage>) -> RoleUsage {
        RoleUsage {
            owners: owners.iter().map(|r| r.usage).collect(),
            proxy,
            user: Usage::of_self().map(|after| Usage {
                cpu_seconds: after.cpu_seconds - self.usage.map_or(0.0, |b| b.cpu_seconds),
                peak_rss_bytes: after.peak_rss_bytes,
            }),
        }
    }
}

/// The study's steps after the plan, over `cohort`.
async fn conduct(
    opts: &LocalOptions,
    plan: &StudyPlan,
    axes: Option<DMatrix<f64>>,
    cohort: &impl Cohort,
    started: Instant,
) -> anyhow::Result<StudyReport> {
    eprintln!("generating a {}-bit Paillier key...", opts.key_bits);
    let t = Instant::now();
    let bits = opts.key_bits;
    let sk = tokio::task::spawn_blocking(move || SecretKey::generate(bits, &mut OsRng))
        .await
        .context("key generation task")??;
    let keygen = t.elapsed().as_secs_f64();
    let mut client = dpca_shell::client::connect(cohort.url(), cohort.transport()).await?;
    let prep = prepare(opts, plan, axes, cohort, &mut client, &sk).await?;
    // From here on C is the one chosen, if the histogram chose it.
    let opts = &LocalOptions {
        row_norm_bound: prep.spec.fixed.row_norm_bound,
        ..opts.clone()
    };
    let fingerprint = sk.public().fingerprint();
    let owners = cohort
        .contribute(&prep.study_id, &fingerprint, &prep.spec)
        .await?;
    let user_start = UserStart::now();
    let study = OpenedStudy {
        noise_free_for_testing: opts.noise_free_for_testing,
        ..OpenedStudy::new(&prep.study_id, &prep.spec)
    };
    let got = collect(&mut client, cohort.transport(), &sk, study).await?;
    let ranges = prep.synthetic_ranges();
    let units = OutputUnits {
        bounds: &prep.spec.bounds,
        ranges: &ranges,
        c: prep.spec.fixed.row_norm_bound,
    };
    let an = analyze(opts, plan, &prep.spec, (prep.axes.as_ref(), &units), &got)?;
    let run = RunFacts {
        seconds: user_start.seconds(&owners, &got, keygen, started),
        usage: user_start.usage(&owners, cohort.proxy_usage()),
        owners,
        budget: prep.budget(),
    };
    let mut report = study_report(opts, plan, &prep, &got, &an, &run);
    if let Some(w) = crate::study_page::clipping_warning(&report) {
        report.warnings.push(Notice::new("rows_clipped", w));
    }
    write_results(opts, plan, &an, &report)?;
    print_summary(opts, &report, &an);
    Ok(report)
}

/// Opens the study: the marginal histograms first where the bounds are chosen
/// privately, the row-norm histogram where C is, then the study with its final
/// bounds, C and axes.
async fn prepare(
    opts: &LocalOptions,
    plan: &StudyPlan,
    axes: Option<DMatrix<f64>>,
    cohort: &impl Cohort,
    client: &mut dpca_proto::v1::proxy_client::ProxyClient<tonic::transport::Channel>,
    sk: &SecretKey,
) -> anyhow::Result<Prepared> {
    let now_ms = dpca_shell::clock::now_unix_ms()?;
    // Refused before any preparatory study runs, should the study itself be invalid.
    let mut draft = plan.draft(sk.public(), now_ms, opts.row_norm_bound, opts.baseline);
    // Masks hide each contribution where the owners add the noise; elsewhere
    // the proxy must read what it noises. A holder asked for by name is never
    // dropped unsaid.
    match (cohort.mask_holder(), draft.owners_add_noise()) {
        (Some(holder), true) => draft.mask_holder = Some(holder.to_owned()),
        (Some(holder), false) if opts.remote.is_some() => bail!(
            "--mask-holder {holder}: masked contributions need a study whose owners add the \
             noise (`dp-mean` centering with the gaussian mechanism)"
        ),
        (Some(_) | None, _) => {}
    }
    let mut spec = draft.validate()?;
    let mut spent_before = Vec::new();
    let bounds_choice = match plan.marginals {
        None => None,
        Some(req) => {
            let (choice, spent) = choose_bounds(
                cohort,
                client,
                sk,
                &spec,
                req,
                opts.noise_free_for_testing,
                opts.epsilon,
            )
            .await?;
            spent_before.push(("marginal histograms", spent));
            spec = SpecDraft {
                bounds: choice.bounds(),
                ..spec.to_draft()
            }
            .validate()?;
            Some(choice)
        }
    };
    let row_norm_choice = match plan.histogram {
        None => None,
        Some(h) => {
            let (choice, spent) = choose_row_norm(
                cohort,
                client,
                sk,
                &spec,
                h,
                opts.noise_free_for_testing,
                opts.epsilon,
            )
            .await?;
            spent_before.push(("row-norm histogram", spent));
            Some(choice)
        }
    };
    let mut draft = spec.to_draft();
    let mut axes = axes;
    if let Some(choice) = &row_norm_choice {
        draft.fixed.row_norm_bound = choice.chosen;
    }
    // Pub-PCA preprocesses the public rows with the bounds and C: read again
    // with the chosen ones.
    if opts.pca_from.is_some() && (row_norm_choice.is_some() || bounds_choice.is_some()) {
        let preprocessing = (&draft.bounds[..], draft.fixed.row_norm_bound);
        axes = load_axes(opts, plan, plan.input_label.as_deref(), preprocessing)?;
    }
    // The owners project onto the axes (and keep the label axis in a regression).
    draft.projection = axes.as_ref().map(|w| task_projection(opts.task, w));
    let spec = draft.validate()?;
    let layout = StudyLayout::new(&spec)?;
    let study_id = open_study(
        client,
        &spec,
        opts.noise_free_for_testing,
        cohort.transport(),
    )
    .await?;
    eprintln!(
        "study {study_id} opened; key fingerprint {}",
        sk.public().fingerprint()
    );
    Ok(Prepared {
        spec,
        layout,
        study_id,
        axes,
        bounds_choice,
        row_norm_choice,
        spent_before,
    })
}

/// The noise floor of S'/N: the mechanism's noise edge at the release's noise
/// level, over N.
fn noise_floor(spec: &StudySpec, got: &Collected, an: &Analysis) -> f64 {
    let dim = an.pca.eigenvalues.len();
    spec.privacy.mechanism.noise_edge(got.noise_scale, dim) / got.n_rows.max(1) as f64
}

/// Now, as RFC 3339 in UTC.
fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Where the components came from, as the report says it.
fn pca_source(opts: &LocalOptions) -> String {
    match (&opts.pca_from, &opts.components_from) {
        (Some(p), _) => format!("Pub-PCA of {}; R released on its axes", p.display()),
        (_, Some(p)) => format!("components of {}; R released on them", p.display()),
        _ => "private release".into(),
    }
}

/// The study's report: its facts, the release's, and what the run measured.
fn study_report(
    opts: &LocalOptions,
    plan: &StudyPlan,
    prep: &Prepared,
    got: &Collected,
    an: &Analysis,
    run: &RunFacts,
) -> StudyReport {
    let (spec, layout) = (&prep.spec, &prep.layout);
    let floor = noise_floor(spec, got, an);
    // The owners' reports reach the user only when it ran them (local).
    let ran_owners = opts.remote.is_none();
    let classes = spec.classes.as_ref();
    StudyReport {
        study_id: prep.study_id.clone(),
        features: plan.table.features.clone(),
        bounds: spec.bounds.iter().map(|&(lo, hi)| [lo, hi]).collect(),
        bounds_from_data: plan.bounds_from_data,
        bounds_choice: prep.bounds_choice.clone(),
        row_norm_bound: opts.row_norm_bound,
        frac_bits: spec.fixed.frac_bits,
        mechanism: spec.privacy.mechanism.name().into(),
        centering: spec.privacy.centering.name().into(),
        epsilon: an.noise.epsilon,
        delta: an.noise.delta,
        rho: an.noise.rho,
        sigma: got.noise_scale,
        mean: got.opened.mean.as_ref().map(|m| m.as_slice().to_vec()),
        noise_floor: floor,
        components_above_noise: crate::report::above_noise(&an.pca, floor),
        written_at: now_rfc3339(),
        noise_scale_grid: got.noise_scale_grid.clone(),
        noise_free_for_testing: opts.noise_free_for_testing,
        n_rows: got.n_rows,
        n_features: plan.table.features.len(),
        n_owners: got.owners_in.len(),
        owners_missing: got.owners_missing.clone(),
        k: opts.k,
        encryption: Encryption::of(spec, layout),
        clipped_rows: ran_owners.then(|| run.owners.iter().map(|r| r.clipped_rows).sum()),
        owner_rows: ran_owners.then(|| run.owners.iter().map(|r| r.rows).collect()),
        psd_repair: opts.psd_repair,
        baseline: opts.baseline,
        synthetic_rows: opts.synthetic.unwrap_or(0),
        task: opts.task.name().into(),
        classes: classes.map(|c| c.labels.clone()).unwrap_or_default(),
        class_covariance: classes.map(|c| c.covariance.name().into()),
        covariance_fit: opts.synthetic.map(|_| an.fit.name().into()),
        class_counts: got.opened.classes.as_ref().map(|c| c.counts.clone()),
        pca_source: pca_source(opts),
        row_norm_choice: prep.row_norm_choice.clone(),
        budget: run.budget.clone(),
        trust: crate::report::Trust::of(spec, &run.budget, opts.noise_free_for_testing),
        warnings: plan.warnings.clone(),
        seconds: run.seconds.clone(),
        usage: run.usage.clone(),
    }
}

/// Writes the components, the report and the synthetic rows (in the input's
/// column order, the label where it was).
fn write_results(
    opts: &LocalOptions,
    plan: &StudyPlan,
    an: &Analysis,
    report: &StudyReport,
) -> anyhow::Result<()> {
    let table = &plan.table;
    let release = (&table.features[..], &an.pca, &an.scatter);
    write_outputs(&opts.out, release, report, an.synthetic_view.as_ref())?;
    if let Some(rows) = &an.synthetic {
        let mut drawn = table.features.clone();
        if let Some((l, _)) = &table.label {
            drawn.push(l.clone());
        }
        let rows = in_input_order(&table.columns, &drawn, rows)?;
        write_synthetic(&opts.out, &table.columns, &rows)?;
        println!(
            "{} synthetic rows in {}",
            rows.len(),
            opts.out.join("synthetic.csv").display()
        );
    }
    Ok(())
}

/// What the preparatory studies chose and spent, for the summary: empty when
/// the bounds and C were given.
fn preparation_text(report: &StudyReport) -> String {
    let mut parts = Vec::new();
    if let Some(b) = &report.bounds_choice {
        parts.push(format!(
            "the marginal histograms that chose the bounds alone {:.4}",
            b.epsilon
        ));
    }
    if let Some(c) = &report.row_norm_choice {
        parts.push(format!(
            "the row-norm histogram that chose C = {:.4} alone {:.4}",
            c.chosen, c.epsilon
        ));
    }
    match (parts.is_empty(), report.budget.rho.is_some()) {
        (true, _) => String::new(),
        (false, true) => format!(" in all, composed under zCDP; {}", parts.join(", ")),
        (false, false) => format!(" in all; {}", parts.join(", ")),
    }
}

/// The run's summary on standard output.
fn print_summary(opts: &LocalOptions, report: &StudyReport, an: &Analysis) {
    println!(
        "{}, {}, {}; {} (epsilon {:.4}{}; delta {:.3e}), centering {}; noise sd {:.3e} per entry of S",
        count(report.n_rows, "row"),
        count(report.n_features as u64, "feature"),
        count(report.n_owners as u64, "owner"),
        report.mechanism,
        report.budget.epsilon,
        preparation_text(report),
        report.budget.delta,
        report.centering,
        report.sigma
    );
    println!("{}", report.trust.line());
    if let Some(b) = &report.bounds_choice {
        println!(
            "bounds chosen privately: each feature's range, center and scale are in study.json \
             and report.html ({} of {} features took the pooled range)",
            b.pooled(),
            report.n_features
        );
    }
    print!("{}", variance_table(&an.pca, opts.k, report.noise_floor));
    for w in report.warnings.iter().filter(|w| w.kind == "rows_clipped") {
        if opts.print_warnings {
            eprintln!("WARNING: {}", w.text);
        }
    }
    // A remote user times no owner (they ran elsewhere), but waits for them: the seal.
    let owner_time = match opts.remote {
        Some(_) => format!("seal {:.1}s, ", report.seconds.seal),
        None => format!("owner {:.1}s, ", report.seconds.owner),
    };
    println!(
        "outputs in {} (report.html shows them); times: {owner_time}proxy {:.1}s, user {:.1}s, \
         total {:.1}s",
        opts.out.display(),
        report.seconds.proxy,
        report.seconds.user,
        report.seconds.total
    );
}
