//! From a study's options to its plan, without I/O: every check that refuses a
//! study before anything runs (no key drawn, no process started, nothing sent),
//! the table as the study sees it, its bounds, the privacy request and how it is
//! split, and who the study waits for. `user local` and `user study` share it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use dpca_common::data::{read_bounds, Table};
use dpca_common::dp::{split_request, Centering, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::paillier::{PublicKey, MIN_KEY_BITS};
use dpca_common::study::{ClassSpec, SpecDraft, DEFAULT_FRAC_BITS, MIN_KAPPA};
use dpca_common::synth::{SynthError, Task};

use crate::local::LocalOptions;
use crate::slicing::owner_name;

/// What the study reads before it is planned: the input table (the header only
/// for a remote study), its name and label column, and the bounds file's bytes.
pub struct Inputs {
    /// The input as read (rows, or the schema alone).
    pub table: Table,
    /// The input's name for messages (its path).
    pub name: String,
    /// The label column, if any.
    pub label: Option<String>,
    /// The bounds file, as its path and its bytes.
    pub bounds: Option<(PathBuf, Vec<u8>)>,
}

/// A study planned: everything decided before the key is drawn.
pub struct StudyPlan {
    /// The study's table: the input, with the label as one more feature in a
    /// regression.
    pub table: Table,
    /// The input's label column (read apart from the features of any table the
    /// study reads, a public one included).
    pub input_label: Option<String>,
    /// The label column the owners keep apart (none in a regression).
    pub owner_label: Option<String>,
    /// Features the PCA runs on (a regression's label column excluded).
    pub pca_dim: usize,
    /// Public bounds of every feature.
    pub bounds: Vec<(f64, f64)>,
    /// Whether the bounds were read off the data (demo only).
    pub bounds_from_data: bool,
    /// The classes of a classification study.
    pub classes: Option<ClassSpec>,
    /// The study's own request (what is left after the histogram's share).
    pub privacy: PrivacyRequest,
    /// The row-norm histogram run first: the quantile and its request.
    pub histogram: Option<(f64, PrivacyRequest)>,
    /// Each owner's cap: what this run spends on its rows in all.
    pub budget_cap: (f64, f64),
    /// Who the study waits for, and how long.
    pub cohort: CohortShape,
    /// Warnings for the user: what a demo reads off the data.
    pub warnings: Vec<String>,
}

/// Who a study waits for: the public bound on the pooled rows, the owners that
/// seal it, and the owners invited.
pub struct CohortShape {
    /// Public upper bound on N.
    pub max_rows: u64,
    /// Owners enough to seal at the deadline.
    pub min_owners: u32,
    /// Owners whose contributions seal the study.
    pub quorum: u32,
    /// From opening to the deadline.
    pub deadline: Duration,
    /// The owners invited, by certificate name.
    pub expected_owners: Vec<String>,
}

/// Refuses a task without the label it needs, and a `--k` the table's `pca_dim`
/// features cannot give.
fn check_task_and_k(
    opts: &LocalOptions,
    has_label: bool,
    pca_dim: usize,
    name: &str,
) -> anyhow::Result<()> {
    if opts.task != Task::Cluster && !has_label {
        bail!(
            "--task {} needs the label column: pass --label",
            opts.task.name()
        );
    }
    if opts.k == 0 || opts.k > pca_dim {
        bail!(
            "--k must be between 1 and the {pca_dim} features of {name}, got {}",
            opts.k
        );
    }
    Ok(())
}

/// The labels of the bundled data set: its ten digits, public.
const BUNDLED_CLASSES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

impl StudyPlan {
    /// Plans the study `opts` asks for on `inputs`, or says what is wrong.
    pub fn new(opts: &LocalOptions, inputs: Inputs) -> anyhow::Result<Self> {
        check_options(opts)?;
        let Inputs {
            table: input,
            name,
            label,
            bounds,
        } = inputs;
        let pca_dim = input.features.len();
        check_task_and_k(opts, label.is_some(), pca_dim, &name)?;
        let mut warnings = Vec::new();
        // Regression (Algorithm 2): the label is one more column of the study, so
        // owners send it as a feature and no separate label.
        let (table, owner_label) = match opts.task {
            Task::Regress => (input.with_label_as_feature(&name)?, None),
            _ => (input, label.clone()),
        };
        let classes = match opts.task {
            Task::Classify => Some(ClassSpec {
                labels: class_labels(opts, &table, &mut warnings)?,
                covariance: opts.class_covariance,
            }),
            Task::Cluster | Task::Regress => None,
        };
        let n = pooled_rows(opts, &table, &name)?;
        let (bounds, bounds_from_data) = plan_bounds(opts, &table, bounds, &mut warnings)?;
        let delta = opts.delta.unwrap_or_else(|| (n as f64).powf(-1.1));
        let privacy = PrivacyRequest::new(opts.mechanism, opts.centering, opts.epsilon, delta)?;
        let (privacy, histogram) = split_for_histogram(opts, privacy)?;
        // Each owner's cap is what this run spends on its rows: the studies'
        // epsilons and deltas added (the proxy charges each study's guarantee).
        let budget_cap = match &histogram {
            Some((_, h)) => (h.epsilon + privacy.epsilon, h.delta + privacy.delta),
            None => (privacy.epsilon, privacy.delta),
        };
        Ok(Self {
            cohort: cohort_shape(opts, n),
            table,
            input_label: label,
            owner_label,
            pca_dim,
            bounds,
            bounds_from_data,
            classes,
            privacy,
            histogram,
            budget_cap,
            warnings,
        })
    }

    /// The study's spec for the user's key, opened at `now_ms`, with row bound `c`
    /// (a draft: the caller validates it).
    pub fn draft(&self, pk: &PublicKey, now_ms: u64, c: f64, baseline: bool) -> SpecDraft {
        SpecDraft {
            features: self.table.features.clone(),
            bounds: self.bounds.clone(),
            fixed: FixedPoint {
                frac_bits: DEFAULT_FRAC_BITS,
                row_norm_bound: c,
            },
            max_rows: self.cohort.max_rows,
            privacy: self.privacy,
            min_owners: self.cohort.min_owners,
            quorum: self.cohort.quorum,
            deadline_unix_ms: now_ms + self.cohort.deadline.as_millis() as u64,
            kappa: MIN_KAPPA,
            public_key: pk.clone(),
            baseline,
            classes: self.classes.clone(),
            projection: None,
            norm_bins: None,
            marginals: None,
            expected_owners: self.cohort.expected_owners.clone(),
        }
    }
}

/// The checks on the options alone.
fn check_options(opts: &LocalOptions) -> anyhow::Result<()> {
    if opts.key_bits < MIN_KEY_BITS {
        bail!(
            "--key-bits {} is below the {MIN_KEY_BITS}-bit minimum",
            opts.key_bits
        );
    }
    if (opts.synthetic.is_some() || opts.task == Task::Classify)
        && opts.centering == Centering::Mask
    {
        // The study would release no mean to uncenter with.
        return Err(SynthError::NoMean.into());
    }
    if opts.synthetic == Some(0) {
        bail!("--synthetic must be at least 1 row");
    }
    if opts.pca_from.is_some() && opts.components_from.is_some() {
        bail!("--pca-from and --components-from are two sources of the same axes: give one");
    }
    if (opts.pca_from.is_some() || opts.components_from.is_some())
        && opts.centering == Centering::Mask
    {
        bail!("a projected study (--pca-from, --components-from) needs --centering dp-mean");
    }
    Ok(())
}

/// N as the study knows it: the rows of a local run, the public `--max-rows` of a
/// remote one (its user sees no rows).
fn pooled_rows(opts: &LocalOptions, table: &Table, name: &str) -> anyhow::Result<usize> {
    if let Some(r) = &opts.remote {
        return usize::try_from(r.max_rows).context("--max-rows");
    }
    let n = table.rows.len();
    if opts.owners == 0 || opts.owners > n {
        bail!(
            "--owners must be between 1 and the {n} rows of {name}, got {}",
            opts.owners
        );
    }
    if !opts.slice_rows.is_empty() {
        if opts.slice_rows.len() != opts.owners {
            bail!(
                "--slice-rows gives {} slices for {} owners",
                opts.slice_rows.len(),
                opts.owners
            );
        }
        if let Some(i) = opts.slice_rows.iter().position(|&r| r == 0) {
            bail!("--slice-rows: the slice of owner {} is empty", i + 1);
        }
        let total = opts
            .slice_rows
            .iter()
            .try_fold(0usize, |sum, &r| sum.checked_add(r));
        if total != Some(n) {
            let total = total.map_or("more".to_string(), |t| t.to_string());
            bail!("--slice-rows add up to {total} rows, but {name} has {n}");
        }
    }
    Ok(n)
}

/// The public bounds: from the bounds file, or read off the data in a local demo.
fn plan_bounds(
    opts: &LocalOptions,
    table: &Table,
    file: Option<(PathBuf, Vec<u8>)>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(Vec<(f64, f64)>, bool)> {
    match file {
        Some((path, bytes)) => Ok((
            read_bounds(bytes.as_slice(), &table.features)
                .with_context(|| format!("{}", path.display()))?,
            false,
        )),
        None if opts.remote.is_some() => {
            bail!("a study at a remote proxy needs public bounds: pass --bounds")
        }
        None => {
            warnings.push(
                "no --bounds given: bounds are read off the data. This is for demos only; it \
                 leaks the data's extremes. Real bounds are public knowledge fixed before any \
                 data is seen."
                    .into(),
            );
            Ok((table.bounds_from_data(), true))
        }
    }
}

/// The class labels of a classification study. They are published in the spec
/// and carried by the synthetic rows, so they must be public: declared
/// (`--classes`, or the bundled data set's digits). Read off the data only in a
/// local demo, with a warning: the set of labels present is itself a fact about
/// the rows (a rare diagnosis that occurs, say).
fn class_labels(
    opts: &LocalOptions,
    table: &Table,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Vec<String>> {
    if !opts.classes.is_empty() {
        return Ok(opts.classes.clone());
    }
    if opts.data.is_none() {
        return Ok(BUNDLED_CLASSES.iter().map(|c| c.to_string()).collect());
    }
    if opts.remote.is_some() {
        bail!("--task classify at a remote proxy needs the class labels: pass --classes");
    }
    warnings.push(
        "no --classes given: the class labels are read off the data. This is for demos \
         only; the labels present are published in the study and in every synthetic row. \
         Real class labels are public knowledge fixed before any data is seen."
            .into(),
    );
    let mut labels = table.distinct_labels().unwrap_or_default();
    labels.sort_by(|a, b| natural_order(a, b));
    Ok(labels)
}

/// Orders labels as numbers when both are, else as text (so 2 < 10).
fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x.total_cmp(&y),
        _ => a.cmp(b),
    }
}

/// The study's request and, with `--row-norm-quantile`, the histogram study's
/// share of it (the two compose to what was asked).
fn split_for_histogram(
    opts: &LocalOptions,
    privacy: PrivacyRequest,
) -> anyhow::Result<(PrivacyRequest, Option<(f64, PrivacyRequest)>)> {
    let Some(q) = opts.row_norm_quantile else {
        return Ok((privacy, None));
    };
    if !(q > 0.0 && q < 1.0) {
        bail!("--row-norm-quantile must be strictly between 0 and 1, got {q}");
    }
    if !opts.mechanism.proven() {
        bail!("--row-norm-quantile needs the gaussian or laplace mechanism");
    }
    let (h, main) =
        split_request(&privacy, opts.quantile_budget_share).context("--quantile-budget-share")?;
    // The histogram is always a `dp-mean` study: it has nothing to mask.
    let h = PrivacyRequest::new(h.mechanism, Centering::DpMean, h.epsilon, h.delta)?;
    Ok((main, Some((q, h))))
}

/// Who the study waits for: the invited owners of a remote study, or this run's
/// own, all of them within the hour.
fn cohort_shape(opts: &LocalOptions, n: usize) -> CohortShape {
    match &opts.remote {
        Some(r) => CohortShape {
            max_rows: r.max_rows,
            min_owners: r.min_owners,
            quorum: r.quorum,
            deadline: r.deadline,
            expected_owners: r.owners.clone(),
        },
        None => CohortShape {
            max_rows: (n as u64).next_power_of_two().max(2),
            min_owners: opts.owners as u32,
            quorum: opts.owners as u32,
            deadline: Duration::from_secs(3600),
            expected_owners: (1..=opts.owners).map(owner_name).collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::Remote;
    use dpca_common::data::read_csv;
    use dpca_common::dp::Mechanism;
    use dpca_common::study::ClassCovariance;
    use dpca_common::synth::FitKind;
    use dpca_shell::tls::Transport;

    const CSV: &str = "a,b,c,label\n0,1,2,1\n1,0,3,2\n2,2,1,1\n3,1,0,10\n";
    const BOUNDS: &str = "feature,lower,upper\na,0,4\nb,0,4\nc,0,4\n";

    /// A local clustering study of [`CSV`] by two owners, public bounds given.
    fn options() -> LocalOptions {
        LocalOptions {
            data: Some("table.csv".into()),
            owners: 2,
            k: 2,
            epsilon: 1.0,
            delta: None,
            mechanism: Mechanism::GAUSSIAN,
            centering: Centering::DpMean,
            label: Some("label".into()),
            bounds: Some("bounds.csv".into()),
            row_norm_bound: 1.0,
            key_bits: 2048,
            psd_repair: false,
            out: "out".into(),
            noise_free_for_testing: false,
            no_build: true,
            programs: None,
            slice_rows: Vec::new(),
            baseline: false,
            synthetic: None,
            task: Task::Cluster,
            class_covariance: ClassCovariance::Shared,
            classes: Vec::new(),
            covariance_fit: FitKind::Denoised,
            pca_from: None,
            components_from: None,
            row_norm_quantile: None,
            quantile_budget_share: 0.1,
            insecure_plaintext: false,
            remote: None,
        }
    }

    fn remote() -> Remote {
        Remote {
            proxy: "https://proxy:50051".into(),
            transport: Transport::InsecurePlaintext,
            owners: vec!["a".into(), "b".into(), "c".into()],
            quorum: 3,
            min_owners: 2,
            deadline: Duration::from_secs(600),
            max_rows: 5000,
            invitation: None,
        }
    }

    fn inputs(opts: &LocalOptions) -> Inputs {
        let table = read_csv(CSV.as_bytes(), "table.csv", opts.label.as_deref()).expect("csv");
        Inputs {
            table,
            name: "table.csv".into(),
            label: opts.label.clone(),
            bounds: opts
                .bounds
                .as_ref()
                .map(|p| (p.clone(), BOUNDS.as_bytes().to_vec())),
        }
    }

    fn plan(opts: &LocalOptions) -> anyhow::Result<StudyPlan> {
        StudyPlan::new(opts, inputs(opts))
    }

    /// A change to [`options`].
    type Edit = Box<dyn FnOnce(&mut LocalOptions)>;

    fn refusal(edit: impl FnOnce(&mut LocalOptions)) -> String {
        let mut opts = options();
        edit(&mut opts);
        match plan(&opts) {
            Ok(_) => panic!("planned although it should be refused"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_valid_local_study_is_planned_with_its_owners_and_public_bounds() {
        let p = plan(&options()).expect("plans");
        assert_eq!(p.table.features, ["a", "b", "c"]);
        assert_eq!(p.bounds, [(0.0, 4.0); 3]);
        assert!(!p.bounds_from_data && p.warnings.is_empty());
        assert_eq!(p.cohort.expected_owners, ["owner-01", "owner-02"]);
        assert_eq!((p.cohort.quorum, p.cohort.min_owners), (2, 2));
        // N = 4 rows: the public bound is the next power of two, delta 1/N^1.1.
        assert_eq!(p.cohort.max_rows, 4);
        assert!((p.privacy.delta - 4f64.powf(-1.1)).abs() < 1e-15);
        assert_eq!(p.budget_cap, (p.privacy.epsilon, p.privacy.delta));
    }

    #[test]
    fn a_remote_study_waits_for_its_invited_owners_and_max_rows() {
        let mut opts = options();
        opts.remote = Some(remote());
        let p = plan(&opts).expect("plans");
        assert_eq!(p.cohort.expected_owners, ["a", "b", "c"]);
        assert_eq!((p.cohort.quorum, p.cohort.min_owners), (3, 2));
        assert_eq!(p.cohort.max_rows, 5000);
        assert!((p.privacy.delta - 5000f64.powf(-1.1)).abs() < 1e-18);
    }

    #[test]
    fn studies_that_cannot_run_are_refused_before_anything_runs() {
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|o| o.key_bits = 1024), "2048-bit minimum"),
            (Box::new(|o| o.k = 0), "--k must be between 1 and the 3"),
            (Box::new(|o| o.k = 4), "--k must be between 1 and the 3"),
            (
                Box::new(|o| o.owners = 0),
                "--owners must be between 1 and the 4",
            ),
            (
                Box::new(|o| o.owners = 5),
                "--owners must be between 1 and the 4",
            ),
            (
                Box::new(|o| o.slice_rows = vec![1, 2]),
                "--slice-rows add up to 3 rows, but",
            ),
            (
                Box::new(|o| o.slice_rows = vec![4]),
                "--slice-rows gives 1 slices for 2 owners",
            ),
            (
                Box::new(|o| o.slice_rows = vec![4, 0]),
                "--slice-rows: the slice of owner 2 is empty",
            ),
            (
                Box::new(|o| o.slice_rows = vec![usize::MAX, 5]),
                "--slice-rows add up to more rows, but",
            ),
            (
                Box::new(|o| {
                    o.task = Task::Classify;
                    o.label = None
                }),
                "needs the label column",
            ),
            (
                Box::new(|o| {
                    o.synthetic = Some(10);
                    o.centering = Centering::Mask
                }),
                "mean",
            ),
            (
                Box::new(|o| o.synthetic = Some(0)),
                "--synthetic must be at least 1",
            ),
            (
                Box::new(|o| {
                    o.pca_from = Some("p.csv".into());
                    o.components_from = Some("c.csv".into())
                }),
                "two sources of the same axes",
            ),
            (
                Box::new(|o| {
                    o.pca_from = Some("p.csv".into());
                    o.centering = Centering::Mask
                }),
                "needs --centering dp-mean",
            ),
            (Box::new(|o| o.epsilon = 0.0), "epsilon"),
            (Box::new(|o| o.delta = Some(1.5)), "delta"),
            (
                Box::new(|o| o.row_norm_quantile = Some(1.0)),
                "strictly between 0 and 1",
            ),
            (
                Box::new(|o| {
                    o.row_norm_quantile = Some(0.9);
                    o.mechanism = Mechanism::WISHART_UNPROVEN
                }),
                "needs the gaussian or laplace mechanism",
            ),
            (
                Box::new(|o| {
                    o.row_norm_quantile = Some(0.9);
                    o.quantile_budget_share = 1.0
                }),
                "--quantile-budget-share",
            ),
            (
                Box::new(|o| {
                    o.remote = Some(remote());
                    o.bounds = None
                }),
                "needs public bounds",
            ),
            (
                Box::new(|o| {
                    o.remote = Some(remote());
                    o.task = Task::Classify
                }),
                "needs the class labels",
            ),
        ];
        for (i, (edit, says)) in cases.into_iter().enumerate() {
            let err = refusal(edit);
            assert!(
                err.contains(says),
                "case {i}: `{err}` does not say `{says}`"
            );
        }
    }

    #[test]
    fn what_a_demo_reads_off_the_data_is_planned_with_a_warning() {
        let mut opts = options();
        opts.bounds = None;
        opts.task = Task::Classify;
        let p = plan(&opts).expect("plans");
        assert!(p.bounds_from_data);
        assert_eq!(p.bounds, [(0.0, 3.0), (0.0, 2.0), (0.0, 3.0)]);
        let labels = p.classes.as_ref().map(|c| c.labels.clone());
        // In natural order: 2 before 10.
        assert_eq!(labels, Some(vec!["1".into(), "2".into(), "10".into()]));
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
        assert!(p
            .warnings
            .iter()
            .any(|w| w.contains("bounds are read off the data")));
        assert!(p
            .warnings
            .iter()
            .any(|w| w.contains("labels are read off the data")));
    }

    #[test]
    fn a_histogram_study_takes_its_share_and_the_owners_cap_covers_both() {
        let mut opts = options();
        opts.row_norm_quantile = Some(0.9);
        opts.mechanism = Mechanism::LAPLACE;
        let p = plan(&opts).expect("plans");
        let (q, h) = p.histogram.expect("a histogram study");
        assert_eq!(q, 0.9);
        assert_eq!(h.centering, Centering::DpMean);
        assert!((h.epsilon - 0.1).abs() < 1e-12 && (p.privacy.epsilon - 0.9).abs() < 1e-12);
        assert!((p.budget_cap.0 - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_regression_sends_its_label_as_a_feature() {
        let mut opts = options();
        opts.task = Task::Regress;
        opts.label = Some("c".into());
        let csv = "a,b,c\n0,1,2\n1,0,3\n2,2,1\n";
        let mut inputs = inputs(&opts);
        inputs.table = read_csv(csv.as_bytes(), "t.csv", Some("c")).expect("csv");
        inputs.bounds = Some(("b.csv".into(), BOUNDS.as_bytes().to_vec()));
        opts.k = 2;
        let p = StudyPlan::new(&opts, inputs).expect("plans");
        assert_eq!(p.pca_dim, 2);
        assert_eq!(p.table.features, ["a", "b", "c"]);
        assert_eq!(p.owner_label, None);
        assert_eq!(p.input_label.as_deref(), Some("c"));
    }
}
