//! `user local`: a whole study on one machine with real processes. The proxy and
//! every owner run as separate programs talking gRPC over loopback; this module only
//! splits the table, starts them, plays the data user and writes the outputs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use dpca_common::data::normalize_row;
use dpca_common::data::{read_bounds, read_csv, read_schema, Table};
use dpca_common::dp::{split_request, Centering, Mechanism, NoisePlan, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::linalg::{captured_variance, centered_scatter, pca, psd_repair, Pca};
use dpca_common::paillier::{SecretKey, MIN_KEY_BITS};
use dpca_common::protocol::Opened;
use dpca_common::risk::Risk;
use dpca_common::study::{
    ClassCovariance, ClassSpec, StudyLayout, StudySpec, DEFAULT_FRAC_BITS, MIN_KAPPA,
};
use dpca_common::synth::{
    task_projection, to_original_units, CovarianceFit, FitKind, NoiseLevel, SynthError,
    Synthesizer, Task,
};
use indicatif::{ProgressBar, ProgressStyle};
use nalgebra::{DMatrix, DVector};
use rand::rngs::OsRng;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use dpca_proto::invitation::Invitation;
use dpca_proto::owner_report::OwnerReport;
use dpca_proto::tls::{write_dev_pki, DevPki, Role, TlsFiles, Transport};
use dpca_proto::usage::Usage;

use crate::report::{
    sweep_page, variance_table, write_outputs, write_synthetic, RoleUsage, RowNormChoice, Seconds,
    StudyReport, SweepPoint,
};
use crate::session::{collect, open_study};

/// The bundled real data set `local` uses when no `--data` is given.
pub fn bundled_data() -> PathBuf {
    workspace_root().join("data").join("optdigits.csv")
}

/// The public bounds of the bundled data set (pixel counts 0..16).
pub fn bundled_bounds() -> PathBuf {
    workspace_root().join("data").join("optdigits.bounds.csv")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
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
    /// Bounds file; `None` reads bounds off the data (demo only), except for the
    /// bundled data set whose public bounds ship with it.
    pub bounds: Option<PathBuf>,
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
    /// Skip `cargo build` of the sibling binaries.
    pub no_build: bool,
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
}

/// The input table, its label column and its bounds file: as given, or the
/// bundled optdigits with its label and public bounds.
fn input_files(opts: &LocalOptions) -> (PathBuf, Option<String>, Option<PathBuf>) {
    match &opts.data {
        Some(d) => (d.clone(), opts.label.clone(), opts.bounds.clone()),
        None => (
            bundled_data(),
            Some(opts.label.clone().unwrap_or_else(|| "label".into())),
            Some(opts.bounds.clone().unwrap_or_else(bundled_bounds)),
        ),
    }
}

/// The labels of the bundled data set: its ten digits, public.
const BUNDLED_CLASSES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

/// The class labels of a classification study. They are published in the spec
/// and carried by the synthetic rows, so they must be public: declared
/// (`--classes`, or the bundled data set's digits). Read off the data only in a
/// local demo, with a warning: the set of labels present is itself a fact about
/// the rows (a rare diagnosis that occurs, say).
fn class_labels(opts: &LocalOptions, table: &Table) -> anyhow::Result<Vec<String>> {
    if !opts.classes.is_empty() {
        return Ok(opts.classes.clone());
    }
    if opts.data.is_none() {
        return Ok(BUNDLED_CLASSES.iter().map(|c| c.to_string()).collect());
    }
    if opts.remote.is_some() {
        bail!("--task classify at a remote proxy needs the class labels: pass --classes");
    }
    eprintln!(
        "WARNING: no --classes given: the class labels are read off the data. This is for \
         demos only; the labels present are published in the study and in every synthetic \
         row. Real class labels are public knowledge fixed before any data is seen."
    );
    let mut labels = table.distinct_labels().unwrap_or_default();
    labels.sort_by(|a, b| natural_order(a, b));
    Ok(labels)
}

/// Kills a child process when dropped, so no proxy or owner outlives a failed run.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

/// Runs a whole study locally and returns its report.
pub async fn run(opts: &LocalOptions) -> anyhow::Result<StudyReport> {
    let started = Instant::now();
    if opts.key_bits < MIN_KEY_BITS {
        bail!(
            "--key-bits {} is below the {MIN_KEY_BITS}-bit minimum",
            opts.key_bits
        );
    }
    let (data, label, bounds_path) = input_files(opts);
    let name = data.display().to_string();
    let file = std::fs::File::open(&data).with_context(|| format!("cannot open {name}"))?;
    let input = match opts.remote {
        // The user of a remote study sees the header only.
        Some(_) => read_schema(file, &name, label.as_deref())?,
        None => read_csv(file, &name, label.as_deref())?,
    };
    if opts.task != Task::Cluster && label.is_none() {
        bail!(
            "--task {} needs the label column: pass --label",
            opts.task.name()
        );
    }
    let pca_dim = input.features.len();
    if opts.k == 0 || opts.k > pca_dim {
        bail!(
            "--k must be between 1 and the {pca_dim} features of {name}, got {}",
            opts.k
        );
    }
    // Regression (Algorithm 2): the label is one more column of the study, so owners
    // send it as a feature and no separate label.
    let (table, owner_label) = match opts.task {
        Task::Regress => (input.with_label_as_feature(&name)?, None),
        _ => (input, label.clone()),
    };
    let classes = match opts.task {
        Task::Classify => Some(ClassSpec {
            labels: class_labels(opts, &table)?,
            covariance: opts.class_covariance,
        }),
        Task::Cluster | Task::Regress => None,
    };
    // A remote user sees no rows: N is bounded by the public --max-rows.
    let n = match &opts.remote {
        Some(r) => usize::try_from(r.max_rows).context("--max-rows")?,
        None => table.rows.len(),
    };
    if opts.remote.is_none() && (opts.owners == 0 || opts.owners > n) {
        bail!(
            "--owners must be between 1 and the {n} rows of {name}, got {}",
            opts.owners
        );
    }
    let dim = table.features.len();
    let (bounds, bounds_from_data) = match &bounds_path {
        Some(p) => {
            let f = std::fs::File::open(p)
                .with_context(|| format!("cannot open bounds file {}", p.display()))?;
            (
                read_bounds(f, &table.features).with_context(|| format!("{}", p.display()))?,
                false,
            )
        }
        None if opts.remote.is_some() => {
            bail!("a study at a remote proxy needs public bounds: pass --bounds")
        }
        None => {
            eprintln!(
                "WARNING: no --bounds given: bounds are read off the data. This is for demos only; \
                 it leaks the data's extremes. Real bounds are public knowledge fixed before any data is seen."
            );
            (table.bounds_from_data(), true)
        }
    };
    if (opts.synthetic.is_some() || opts.task == Task::Classify)
        && opts.centering == Centering::Mask
    {
        // Refused before any work: the study would release no mean to uncenter with.
        return Err(SynthError::NoMean.into());
    }
    if opts.synthetic == Some(0) {
        bail!("--synthetic must be at least 1 row");
    }
    // Pub-PCA preprocesses the public rows with C: recomputed if C is chosen later.
    let load_axes = |c: f64| -> anyhow::Result<Option<DMatrix<f64>>> {
        Ok(match (&opts.pca_from, &opts.components_from) {
            (Some(_), Some(_)) => {
                bail!("--pca-from and --components-from are two sources of the same axes: give one")
            }
            (Some(path), None) => Some(
                public_components(
                    path,
                    label.as_deref(),
                    &table.features[..pca_dim],
                    &bounds[..pca_dim],
                    c,
                    opts.k,
                )?
                .components,
            ),
            (None, Some(path)) => Some(read_components(path, &table.features[..pca_dim], opts.k)?),
            (None, None) => None,
        })
    };
    let mut axes = load_axes(opts.row_norm_bound)?;
    if axes.is_some() && opts.centering == Centering::Mask {
        bail!("a projected study (--pca-from, --components-from) needs --centering dp-mean");
    }
    let delta = opts.delta.unwrap_or_else(|| (n as f64).powf(-1.1));
    let privacy = PrivacyRequest::new(opts.mechanism, opts.centering, opts.epsilon, delta)?;
    let (privacy, histogram_request) = match opts.row_norm_quantile {
        None => (privacy, None),
        Some(q) => {
            if opts.remote.is_some() {
                bail!(
                    "--row-norm-quantile runs two studies on the same owners: local runs only; \
                     give --row-norm-bound"
                );
            }
            if !(q > 0.0 && q < 1.0) {
                bail!("--row-norm-quantile must be strictly between 0 and 1, got {q}");
            }
            if !opts.mechanism.proven() {
                bail!("--row-norm-quantile needs the gaussian or laplace mechanism");
            }
            let (h, main) = split_request(&privacy, opts.quantile_budget_share)
                .context("--quantile-budget-share")?;
            // The histogram is always a `dp-mean` study: it has nothing to mask.
            let h = PrivacyRequest::new(h.mechanism, Centering::DpMean, h.epsilon, h.delta)?;
            (main, Some((q, h)))
        }
    };

    // Each owner's cap is what this run spends on its rows: the studies' epsilons
    // and deltas added (the proxy charges each study's guarantee).
    let budget_cap = match &histogram_request {
        Some((_, h)) => (h.epsilon + privacy.epsilon, h.delta + privacy.delta),
        None => (privacy.epsilon, privacy.delta),
    };
    let owner_files = match opts.remote {
        Some(_) => Vec::new(),
        None => split_rows(
            &table,
            opts.owners,
            &opts.out.join("owners"),
            SliceLayout::default(),
        )?,
    };

    // An invitation left from an earlier study must not send owners there.
    if let Some(path) = opts.remote.as_ref().and_then(|r| r.invitation.as_ref()) {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", path.display()))
            }
            _ => {}
        }
    }
    // Found (or built) before the key: a missing binary should not cost a keygen.
    let (proxy_bin, owner_bin) = match opts.remote {
        Some(_) => Default::default(),
        None => sibling_binaries(opts.no_build)?,
    };
    eprintln!("generating a {}-bit Paillier key...", opts.key_bits);
    let t = Instant::now();
    let sk = tokio::task::spawn_blocking({
        let bits = opts.key_bits;
        move || SecretKey::generate(bits, &mut OsRng)
    })
    .await
    .context("key generation task")??;
    let keygen = t.elapsed().as_secs_f64();
    let pk = sk.public().clone();

    // Mutual TLS even on loopback: the run exercises what a deployment runs. The CA
    // and the proxy's state live only as long as this run.
    let pki_dir = tempfile::Builder::new()
        .prefix("dpca-local-tls-")
        .tempdir()
        .context("cannot create a folder for the run's certificates")?;
    let pki = if opts.insecure_plaintext || opts.remote.is_some() {
        None
    } else {
        let owners: Vec<String> = (1..=opts.owners).map(owner_name).collect();
        let hosts = ["localhost".to_string(), "127.0.0.1".to_string()];
        Some(write_dev_pki(
            pki_dir.path(),
            &hosts,
            &["user".to_string()],
            &owners,
        )?)
    };
    let transport = match (&pki, &opts.remote) {
        (_, Some(r)) => r.transport.clone(),
        (Some(p), None) => Transport::Tls(std::sync::Arc::new(
            p.files("user")
                .context("no user certificate")?
                .load(Role::User)?,
        )),
        (None, None) => Transport::InsecurePlaintext,
    };
    let (proxy, url) = match &opts.remote {
        Some(r) => (None, r.proxy.clone()),
        None => {
            let (p, url) =
                start_proxy(&proxy_bin, pki.as_ref(), pki_dir.path(), opts, &transport).await?;
            (Some(p), url)
        }
    };
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)?;
    // Who the study waits for, and how long: the invited owners of a remote study,
    // or this run's own, all of them within the hour.
    let (max_rows, min_owners, quorum, deadline, expected_owners) = match &opts.remote {
        Some(r) => (
            r.max_rows,
            r.min_owners,
            r.quorum,
            r.deadline,
            r.owners.clone(),
        ),
        None => (
            (n as u64).next_power_of_two().max(2),
            opts.owners as u32,
            opts.owners as u32,
            Duration::from_secs(3600),
            (1..=opts.owners).map(owner_name).collect(),
        ),
    };
    let mut client = dpca_proto::client::connect(&url, &transport).await?;
    let fingerprint = pk.fingerprint();
    let mut spec = StudySpec {
        features: table.features.clone(),
        bounds: bounds.clone(),
        fixed: FixedPoint {
            frac_bits: DEFAULT_FRAC_BITS,
            row_norm_bound: opts.row_norm_bound,
        },
        max_rows,
        privacy,
        min_owners,
        quorum,
        deadline_unix_ms: now_ms + deadline.as_millis() as u64,
        kappa: MIN_KAPPA,
        public_key: pk.clone(),
        baseline: opts.baseline,
        classes,
        projection: None,
        norm_bins: None,
        expected_owners,
    };
    // Refused before the histogram study runs, should the study itself be invalid.
    spec.validate()?;
    let (row_norm_choice, histogram_budget) = match &histogram_request {
        None => (None, None),
        Some((q, h)) => {
            let spec_h = spec.norm_histogram(*h);
            let bins = spec_h
                .norm_bins
                .clone()
                .context("a histogram study has bins")?;
            let hid = open_study(&mut client, &spec_h, opts.noise_free_for_testing).await?;
            eprintln!(
                "row-norm histogram study {hid} opened (epsilon {:.4} of {})",
                h.epsilon, opts.epsilon
            );
            run_owners(
                &owner_bin,
                pki.as_ref(),
                &url,
                &hid,
                &fingerprint,
                &owner_files,
                owner_label.as_deref(),
                budget_cap,
                &Risk::of(&spec_h, opts.noise_free_for_testing),
            )
            .await?;
            let got = collect(&mut client, &transport, &sk, &spec_h, &hid).await?;
            let counts = bins.counts(&got.opened, &spec_h.noise_plan(got.n_rows), &spec_h.fixed);
            let chosen = bins.quantile(&counts, *q);
            eprintln!("row-norm bound C = {chosen:.4}: the {q} quantile of the row norms");
            let choice = RowNormChoice {
                quantile: *q,
                chosen,
                edges: bins.edges.clone(),
                counts,
                epsilon: h.epsilon,
                delta: h.delta,
                study_id: hid,
            };
            (Some(choice), Some(spec_h.budget_ledger()))
        }
    };
    let opts = &LocalOptions {
        row_norm_bound: row_norm_choice
            .as_ref()
            .map_or(opts.row_norm_bound, |c| c.chosen),
        ..opts.clone()
    };
    if row_norm_choice.is_some() && opts.pca_from.is_some() {
        axes = load_axes(opts.row_norm_bound)?;
    }
    spec.fixed.row_norm_bound = opts.row_norm_bound;
    // The owners project onto the axes (and keep the label axis in a regression).
    spec.projection = axes.as_ref().map(|w| task_projection(opts.task, w));
    spec.validate()?;
    let layout = StudyLayout::new(&spec)?;
    let study_id = open_study(&mut client, &spec, opts.noise_free_for_testing).await?;
    eprintln!("study {study_id} opened; key fingerprint {fingerprint}");

    let owner_reports = match &opts.remote {
        Some(r) => {
            invite(r, &study_id, &fingerprint, &spec)?;
            Vec::new()
        }
        None => {
            run_owners(
                &owner_bin,
                pki.as_ref(),
                &url,
                &study_id,
                &fingerprint,
                &owner_files,
                owner_label.as_deref(),
                budget_cap,
                // A local run is every party at once: its owners accept what its
                // user chose, by name.
                &Risk::of(&spec, opts.noise_free_for_testing),
            )
            .await?
        }
    };
    let slowest_owner = owner_reports
        .iter()
        .map(|r| r.seconds_total)
        .fold(0.0, f64::max);
    let clipped: usize = owner_reports.iter().map(|r| r.clipped_rows).sum();

    let t_user = Instant::now();
    let usage_before = Usage::of_self();
    let got = collect(&mut client, &transport, &sk, &spec, &study_id).await?;
    let scatter = if opts.psd_repair {
        psd_repair(&got.opened.scatter)
    } else {
        got.opened.scatter.clone()
    };
    let cov = &scatter / got.n_rows as f64;
    // Regression: PCA on the features block only; the label is kept whole.
    let cov_x = cov.view((0, 0), (pca_dim, pca_dim)).into_owned();
    let result = match &axes {
        // A projected study knows the variance inside the span only: PCA there.
        Some(w) => {
            let inner = pca(&(w.transpose() * &cov_x * w), opts.k);
            Pca {
                components: w * &inner.components,
                ..inner
            }
        }
        None => pca(&cov_x, opts.k),
    };
    let plan = spec.noise_plan(got.n_rows);
    let fit = covariance_fit(opts, &spec, &plan);
    // The denoised fit reads the noise around the released trace: it gets S' as
    // released, since --psd-repair's clipped negative eigenvalues raise the trace.
    // The repair keeps the eigenvectors, so the components fit either.
    let synth_scatter = match fit {
        CovarianceFit::Denoised(_) => &got.opened.scatter,
        CovarianceFit::Paper => &scatter,
    };
    let synthetic = match opts.synthetic {
        Some(rows) => Some(synthesize(
            opts,
            &got.opened,
            synth_scatter,
            got.n_rows,
            &result.components,
            &bounds,
            spec.classes.as_ref(),
            rows,
            fit,
        )?),
        None => None,
    };
    let seconds_user = t_user.elapsed().as_secs_f64() - got.seconds_proxy;
    let usage = RoleUsage {
        owners: owner_reports.iter().map(|r| r.usage).collect(),
        proxy: proxy
            .as_ref()
            .and_then(|p| p.0.id())
            .and_then(Usage::of_pid),
        user: Usage::of_self().map(|after| Usage {
            cpu_seconds: after.cpu_seconds - usage_before.map_or(0.0, |b| b.cpu_seconds),
            peak_rss_bytes: after.peak_rss_bytes,
        }),
    };
    drop(proxy);

    let budget = match histogram_budget {
        Some(hist) => hist.then("row-norm histogram", spec.budget_ledger(), "study"),
        None => spec.budget_ledger(),
    };
    let report = StudyReport {
        study_id,
        features: table.features.clone(),
        bounds: bounds.iter().map(|&(lo, hi)| [lo, hi]).collect(),
        bounds_from_data,
        row_norm_bound: opts.row_norm_bound,
        frac_bits: spec.fixed.frac_bits,
        mechanism: spec.privacy.mechanism.name().into(),
        centering: spec.privacy.centering.name().into(),
        epsilon: plan.epsilon,
        delta: plan.delta,
        rho: plan.rho,
        sigma: got.noise_scale,
        noise_scale_grid: got.noise_scale_grid.clone(),
        noise_free_for_testing: opts.noise_free_for_testing,
        n_rows: got.n_rows,
        n_features: dim,
        n_owners: got.owners_in.len(),
        owners_missing: got.owners_missing.clone(),
        k: opts.k,
        key_bits: pk.bits(),
        key_fingerprint: fingerprint,
        ciphertexts_per_owner: layout.owner_ciphertexts(),
        bytes_per_owner: layout.owner_ciphertexts() * pk.ciphertext_bytes(),
        release_ciphertexts: layout.release_ciphertexts(),
        slots: layout.budget.slots,
        slot_width: layout.budget.slot_width,
        mask_bits: layout.mask_bits,
        clipped_rows: clipped,
        psd_repair: opts.psd_repair,
        baseline: opts.baseline,
        synthetic_rows: opts.synthetic.unwrap_or(0),
        task: opts.task.name().into(),
        classes: spec
            .classes
            .as_ref()
            .map(|c| c.labels.clone())
            .unwrap_or_default(),
        class_covariance: spec.classes.as_ref().map(|c| c.covariance.name().into()),
        covariance_fit: opts.synthetic.map(|_| fit.name().into()),
        class_counts: got.opened.classes.as_ref().map(|c| c.counts.clone()),
        pca_source: match (&opts.pca_from, &opts.components_from) {
            (Some(p), _) => format!("Pub-PCA of {}; R released on its axes", p.display()),
            (_, Some(p)) => format!("components of {}; R released on them", p.display()),
            _ => "private release".into(),
        },
        row_norm_choice,
        budget,
        seconds: Seconds {
            owner: slowest_owner,
            proxy: got.seconds_proxy,
            user: seconds_user,
            keygen,
            total: started.elapsed().as_secs_f64(),
        },
        usage,
    };
    write_outputs(&opts.out, &table.features, &result, &scatter, &report)?;
    if let Some(rows) = &synthetic {
        let mut drawn = table.features.clone();
        if let Some((l, _)) = &table.label {
            drawn.push(l.clone());
        }
        // synthetic.csv follows the input's column order, the label where it was.
        let rows = in_input_order(&table.columns, &drawn, rows)?;
        write_synthetic(&opts.out, &table.columns, &rows)?;
        println!(
            "{} synthetic rows in {}",
            rows.len(),
            opts.out.join("synthetic.csv").display()
        );
    }
    let histogram = report
        .row_norm_choice
        .as_ref()
        .map(|c| {
            format!(
                " in all; the histogram that chose C = {:.4} alone {:.4}",
                c.chosen, c.epsilon
            )
        })
        .unwrap_or_default();
    println!(
        "{} rows, {} features, {} owners; {} (epsilon {:.4}{histogram}; delta {:.3e}), centering {}; noise sd {:.3e} per entry of S",
        report.n_rows,
        dim,
        report.n_owners,
        report.mechanism,
        report.budget.epsilon,
        report.budget.delta,
        report.centering,
        report.sigma
    );
    print!("{}", variance_table(&result, opts.k));
    // A remote user times only its own side: the owners ran elsewhere.
    let owner_time = match opts.remote {
        Some(_) => String::new(),
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
    Ok(report)
}

/// Starts the run's proxy on a free loopback port; returns it and its URL.
async fn start_proxy(
    proxy_bin: &Path,
    pki: Option<&DevPki>,
    state_dir: &Path,
    opts: &LocalOptions,
    transport: &Transport,
) -> anyhow::Result<(Guard, String)> {
    let mut proxy_cmd = Command::new(proxy_bin);
    // The run sets every flag itself; a config file meant for `user` is not theirs.
    proxy_cmd.env_remove("DPCA_CONFIG");
    proxy_cmd.args(["--listen", "127.0.0.1:0"]);
    // The run's studies live as long as the run.
    proxy_cmd.arg("--state").arg(state_dir.join("proxy.redb"));
    transport_flags(&mut proxy_cmd, pki.map(|p| &p.proxy));
    if opts.noise_free_for_testing {
        proxy_cmd.arg("--allow-noise-free-for-testing");
    }
    let mut proxy = Guard(
        proxy_cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", proxy_bin.display()))?,
    );
    let addr = read_listen_line(&mut proxy.0).await?;
    let url = format!("{}://{addr}", transport.scheme());
    eprintln!("proxy listening on {addr}");
    Ok((proxy, url))
}

/// Reorders synthetic records drawn in the `drawn` column order (the study's
/// features, the label last) into the input's column order.
fn in_input_order(
    input: &[String],
    drawn: &[String],
    rows: &[Vec<String>],
) -> anyhow::Result<Vec<Vec<String>>> {
    let order = input
        .iter()
        .map(|h| drawn.iter().position(|d| d == h))
        .collect::<Option<Vec<usize>>>()
        .filter(|o| o.len() == drawn.len())
        .with_context(|| {
            format!("the input's columns {input:?} are not the synthesized ones {drawn:?}")
        })?;
    rows.iter()
        .map(|r| {
            order
                .iter()
                .map(|&i| r.get(i).cloned())
                .collect::<Option<Vec<String>>>()
                .with_context(|| format!("a synthetic record of {} cells for {drawn:?}", r.len()))
        })
        .collect()
}

/// The name of the `i`-th owner (from 1) of a local run (and of `user dev-certs
/// --owner-count`).
pub fn owner_name(i: usize) -> String {
    format!("owner-{i:02}")
}

/// Points a program at its certificate, or runs it on plaintext.
fn transport_flags(cmd: &mut Command, files: Option<&TlsFiles>) {
    match files {
        Some(f) => {
            cmd.args(f.args());
        }
        None => {
            cmd.arg("--insecure-plaintext");
        }
    }
}

/// A privacy sweep: the study once per epsilon (outputs in `OUT/epsilon-E/`), each
/// scored by the variance its components capture of the exact scatter of the rows
/// as that study preprocessed them; writes `OUT/sweep.csv` and `OUT/sweep.html`.
/// Only a local run, which holds every row, can score; the budgets add up.
pub async fn sweep(opts: &LocalOptions, epsilons: &[f64]) -> anyhow::Result<Vec<SweepPoint>> {
    if opts.remote.is_some() || opts.task == Task::Regress {
        bail!("--sweep scores a local study of the features: not with a remote proxy or --task regress");
    }
    if epsilons.is_empty() {
        bail!("--sweep needs at least one epsilon");
    }
    let (data, label, _) = input_files(opts);
    let name = data.display().to_string();
    let file = std::fs::File::open(&data).with_context(|| format!("cannot open {name}"))?;
    let table = read_csv(file, &name, label.as_deref())?;
    let m = table.features.len();
    let mut points = Vec::with_capacity(epsilons.len());
    for &epsilon in epsilons {
        let o = LocalOptions {
            epsilon,
            out: opts.out.join(format!("epsilon-{epsilon}")),
            ..opts.clone()
        };
        eprintln!("== sweep: epsilon {epsilon}");
        let report = run(&o).await?;
        let bounds: Vec<(f64, f64)> = report.bounds.iter().map(|b| (b[0], b[1])).collect();
        let rows: Vec<Vec<f64>> = table
            .rows
            .iter()
            .map(|r| normalize_row(r, &bounds[..m], report.row_norm_bound).0)
            .collect();
        let s_true = centered_scatter(&rows);
        let v = read_components(&o.out.join("components.csv"), &table.features, opts.k)?;
        points.push(SweepPoint {
            epsilon,
            captured_variance: captured_variance(&s_true, &v),
            sigma: report.sigma,
            out: o.out.display().to_string(),
        });
    }
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    let csv_path = opts.out.join("sweep.csv");
    let mut w = csv::Writer::from_path(&csv_path)
        .with_context(|| format!("cannot create {}", csv_path.display()))?;
    w.write_record(["epsilon", "captured_variance", "sigma", "out"])?;
    for p in &points {
        w.write_record([
            p.epsilon.to_string(),
            p.captured_variance.to_string(),
            p.sigma.to_string(),
            p.out.clone(),
        ])?;
    }
    w.flush()?;
    std::fs::write(opts.out.join("sweep.html"), sweep_page(&points, opts.k))
        .with_context(|| format!("cannot write {}", opts.out.join("sweep.html").display()))?;
    println!("epsilon  captured variance (k = {})", opts.k);
    for p in &points {
        println!("{:>7}  {:.4}", p.epsilon, p.captured_variance);
    }
    println!(
        "sweep in {} (sweep.csv, sweep.html); the studies spent epsilon {} on these rows in all",
        opts.out.display(),
        epsilons.iter().sum::<f64>()
    );
    Ok(points)
}

/// Hands the owners of a remote study their invitation: written to the file asked
/// for (atomically, so an owner waiting for it never reads half), and printed.
fn invite(r: &Remote, study_id: &str, fingerprint: &str, spec: &StudySpec) -> anyhow::Result<()> {
    let inv = Invitation {
        study: study_id.to_string(),
        key_fingerprint: fingerprint.to_string(),
    };
    if let Some(path) = &r.invitation {
        inv.write(path)?;
        eprintln!("invitation written to {}", path.display());
    }
    eprintln!(
        "invite the owners {} to study {study_id} (key fingerprint {fingerprint}); it seals \
         at {} contributions, or at its deadline with at least {}",
        r.owners.join(", "),
        spec.quorum,
        spec.min_owners
    );
    Ok(())
}

/// Starts one owner process per file for `study_id` and waits for all of them,
/// returning their reports; the first failure names its owner.
#[allow(clippy::too_many_arguments)]
async fn run_owners(
    owner_bin: &Path,
    pki: Option<&DevPki>,
    url: &str,
    study_id: &str,
    fingerprint: &str,
    owner_files: &[PathBuf],
    owner_label: Option<&str>,
    budget_cap: (f64, f64),
    risks: &[Risk],
) -> anyhow::Result<Vec<OwnerReport>> {
    let bar = ProgressBar::new(owner_files.len() as u64);
    if let Ok(style) =
        ProgressStyle::with_template("owners {bar:30} {pos}/{len} contributed ({elapsed})")
    {
        bar.set_style(style);
    }
    let mut tasks = Vec::new();
    for (i, file) in owner_files.iter().enumerate() {
        let mut cmd = Command::new(owner_bin);
        cmd.env_remove("DPCA_CONFIG");
        let name = owner_name(i + 1);
        let files = match pki {
            Some(p) => Some(
                p.files(&name)
                    .with_context(|| format!("no certificate for {name}"))?,
            ),
            None => None,
        };
        transport_flags(&mut cmd, files);
        cmd.args(["--proxy", url, "--study", study_id, "--owner-id", &name])
            .arg("--data")
            .arg(file)
            .args(["--key-fingerprint", fingerprint, "--quiet"])
            .arg("--budget-cap")
            .arg(format!("{},{}", budget_cap.0, budget_cap.1));
        if let Some(l) = owner_label {
            cmd.args(["--label", l]);
        }
        for r in risks {
            cmd.args(["--accept-risk", r.name()]);
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", owner_bin.display()))?;
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            let out = child.wait_with_output().await;
            bar.inc(1);
            out
        }));
    }
    let mut owner_reports = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let out = task.await.context("owner task")?.context("owner process")?;
        if !out.status.success() {
            bail!(
                "{} failed ({}): {}",
                owner_name(i + 1),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let line = String::from_utf8_lossy(&out.stdout);
        let report: OwnerReport = serde_json::from_str(line.trim()).with_context(|| {
            format!("{} printed an unreadable report: {line}", owner_name(i + 1))
        })?;
        owner_reports.push(report);
    }
    bar.finish_and_clear();
    Ok(owner_reports)
}

/// How synthesis reads the covariance: the user's choice with the release's noise
/// level, computed from the public spec (not taken from the proxy's word); the
/// paper's way for a Wishart release ([`NoiseLevel::of`]).
fn covariance_fit(opts: &LocalOptions, spec: &StudySpec, plan: &NoisePlan) -> CovarianceFit {
    let mut noise = NoiseLevel::of(plan, &spec.fixed, spec.matrix_dim());
    // A noise-free test release has no noise to undo, whatever the spec plans.
    if let (true, Some(n)) = (opts.noise_free_for_testing, noise.as_mut()) {
        n.entry_sd = 0.0;
    }
    opts.covariance_fit.with(noise)
}

/// Draws `rows` synthetic rows for the task, in the input's units, as CSV cells in
/// the order of the study's features (the label last).
#[allow(clippy::too_many_arguments)]
fn synthesize(
    opts: &LocalOptions,
    opened: &Opened,
    scatter: &DMatrix<f64>,
    n_rows: u64,
    components: &DMatrix<f64>,
    bounds: &[(f64, f64)],
    classes: Option<&ClassSpec>,
    rows: usize,
    fit: CovarianceFit,
) -> anyhow::Result<Vec<Vec<String>>> {
    let mut rng = OsRng;
    let cells = |x: &DVector<f64>| -> Vec<String> {
        to_original_units(x, bounds, opts.row_norm_bound)
            .iter()
            .map(f64::to_string)
            .collect()
    };
    let labels = match (opts.task, classes) {
        (Task::Classify, None) => return Err(SynthError::NoClasses.into()),
        (_, spec) => spec.map(|c| &c.labels),
    };
    let model = Synthesizer::new(opts.task, opened, scatter, n_rows, components, fit)?;
    // Unsupervised synthesis does not model the label: its column is left empty.
    let empty_label = opts.task == Task::Cluster && (opts.label.is_some() || opts.data.is_none());
    Ok((0..rows)
        .map(|_| {
            let (class, x) = model.sample(&mut rng);
            let mut rec = cells(&x);
            match (class, labels) {
                (Some(c), Some(labels)) => rec.push(labels[c].clone()),
                _ if empty_label => rec.push(String::new()),
                _ => {}
            }
            rec
        })
        .collect())
}

/// Orders labels as numbers when both are, else as text (so 2 < 10).
fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x.total_cmp(&y),
        _ => a.cmp(b),
    }
}

/// Pub-PCA: the top-k components of a public table with the study's features,
/// preprocessed as the study's rows are. Spends no budget of the study.
fn public_components(
    path: &Path,
    label: Option<&str>,
    features: &[String],
    bounds: &[(f64, f64)],
    c: f64,
    k: usize,
) -> anyhow::Result<Pca> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {name}"))?;
    let table = read_csv(file, &name, label)?;
    table.check_schema(features, &name)?;
    let rows: Vec<Vec<f64>> = table
        .rows
        .iter()
        .map(|r| normalize_row(r, bounds, c).0)
        .collect();
    let cov = centered_scatter(&rows) / rows.len() as f64;
    Ok(pca(&cov, k))
}

/// Reads the first `k` components of an earlier study's `components.csv` (rows:
/// features in the study's order; columns PC1, PC2, ...).
fn read_components(path: &Path, features: &[String], k: usize) -> anyhow::Result<DMatrix<f64>> {
    let name = path.display().to_string();
    let mut rdr = csv::Reader::from_path(path).with_context(|| format!("cannot open {name}"))?;
    let cols = rdr.headers().with_context(|| name.clone())?.len();
    if cols < k + 1 {
        bail!(
            "{name}: {} components, --k asks for {k}",
            cols.saturating_sub(1)
        );
    }
    let mut w = DMatrix::zeros(features.len(), k);
    let mut seen = 0;
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.with_context(|| format!("{name}, row {}", i + 1))?;
        match features.get(i) {
            Some(f) if rec.get(0) == Some(f.as_str()) => {}
            _ => bail!(
                "{name}, row {}: feature `{}` where the study has `{}`",
                i + 1,
                rec.get(0).unwrap_or(""),
                features.get(i).map_or("nothing", String::as_str)
            ),
        }
        for j in 0..k {
            let cell = rec.get(j + 1).unwrap_or("");
            w[(i, j)] = cell
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .with_context(|| {
                    format!(
                        "{name}, row {}, PC{}: `{cell}` is not a number",
                        i + 1,
                        j + 1
                    )
                })?;
        }
        seen += 1;
    }
    if seen != features.len() {
        bail!(
            "{name}: {seen} feature rows, the study has {}",
            features.len()
        );
    }
    Ok(w)
}

/// Where [`split_rows`] writes the slices.
#[derive(Clone, Copy, Debug, Default)]
pub struct SliceLayout {
    /// `DIR/OWNER/rows.csv` (a folder per owner) instead of `DIR/OWNER.csv`.
    pub per_party: bool,
    /// When every slice exists already, keep them and write nothing.
    pub keep_existing: bool,
}

/// Writes each owner's slice (contiguous, sizes differing by at most one row) with
/// the input's header, label column included; returns the files in owner order.
pub fn split_rows(
    table: &Table,
    owners: usize,
    dir: &Path,
    layout: SliceLayout,
) -> anyhow::Result<Vec<PathBuf>> {
    let n = table.rows.len();
    if owners == 0 || owners > n {
        bail!("cannot split {n} rows among {owners} owners");
    }
    let paths: Vec<PathBuf> = (1..=owners)
        .map(|i| match layout.per_party {
            true => dir.join(owner_name(i)).join("rows.csv"),
            false => dir.join(format!("{}.csv", owner_name(i))),
        })
        .collect();
    if layout.keep_existing && paths.iter().all(|p| p.exists()) {
        return Ok(paths);
    }
    let mut start = 0;
    for (i, path) in paths.iter().enumerate() {
        let len = n / owners + usize::from(i < n % owners);
        let parent = path.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let mut w = csv::Writer::from_path(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut header = table.features.clone();
        if let Some((l, _)) = &table.label {
            header.push(l.clone());
        }
        w.write_record(&header)?;
        for r in start..start + len {
            let mut rec: Vec<String> = table.rows[r].iter().map(|x| x.to_string()).collect();
            if let Some((_, cells)) = &table.label {
                rec.push(cells[r].clone());
            }
            w.write_record(&rec)?;
        }
        w.flush()?;
        start += len;
    }
    Ok(paths)
}

async fn read_listen_line(child: &mut Child) -> anyhow::Result<String> {
    let stdout = child.stdout.take().context("proxy stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("proxy did not start within 30 s")??
        .context("proxy exited before listening")?;
    line.strip_prefix("listening on ")
        .map(str::to_string)
        .with_context(|| format!("unexpected proxy output `{line}`"))
}

/// Builds the named workspace packages' binaries into `dir` (a `target/<profile>`
/// folder) with that folder's profile.
pub fn build_programs(dir: &Path, packages: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    // Variables cargo sets for the running crate (under `cargo test` or `cargo run`)
    // must not reach the nested build: build scripts that watch them (ring's watches
    // CARGO_MANIFEST_DIR) would rebuild, and the next ordinary build would again.
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_PKG_")
            || matches!(
                key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
            )
        {
            cmd.env_remove(key);
        }
    }
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .arg("--bins");
    for p in packages {
        cmd.args(["-p", p]);
    }
    match dir.file_name().and_then(|s| s.to_str()) {
        Some("release") => {
            cmd.arg("--release");
        }
        Some("debug") | None => {}
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    let status = cmd
        .status()
        .with_context(|| format!("cannot run cargo to build {}", packages.join(", ")))?;
    if !status.success() {
        bail!("building {} failed ({status})", packages.join(", "));
    }
    Ok(())
}

/// Finds the `proxy` and `owner` programs next to this one, building them first when
/// running from the source tree (so a fresh clone works with one `cargo run`).
fn sibling_binaries(no_build: bool) -> anyhow::Result<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().context("cannot locate the running program")?;
    let dir = exe
        .parent()
        .context("program has no parent directory")?
        .to_path_buf();
    if !no_build && workspace_root().join("Cargo.toml").exists() {
        build_programs(&dir, &["proxy", "owner"])?;
    }
    let proxy = dir.join(format!("proxy{}", std::env::consts::EXE_SUFFIX));
    let owner = dir.join(format!("owner{}", std::env::consts::EXE_SUFFIX));
    for p in [&proxy, &owner] {
        if !p.exists() {
            bail!(
                "{} not found; build it with `cargo build --release`",
                p.display()
            );
        }
    }
    Ok((proxy, owner))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn synthetic_records_follow_the_input_column_order() {
        let input = strings(&["a", "label", "b"]);
        let drawn = strings(&["a", "b", "label"]);
        let rows = vec![strings(&["1", "2", "x"]), strings(&["3", "4", "y"])];
        let out = in_input_order(&input, &drawn, &rows).expect("same columns");
        assert_eq!(
            out,
            vec![strings(&["1", "x", "2"]), strings(&["3", "y", "4"])]
        );
        let err = in_input_order(&strings(&["a", "c"]), &strings(&["a", "b"]), &rows)
            .expect_err("column c was not drawn");
        assert!(err.to_string().contains("\"c\""), "{err}");
    }
}
