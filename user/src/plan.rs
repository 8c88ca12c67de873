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
use crate::report::Notice;
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
    /// Public bounds of every feature: from the bounds file or read off the data;
    /// placeholders [-1, 1] where a marginal histogram study chooses them.
    pub bounds: Vec<(f64, f64)>,
    /// Whether the bounds were read off the data (an insecure flag asked for it).
    pub bounds_from_data: bool,
    /// The marginal histogram study that chooses every feature's bounds, run
    /// first, with its request; `None` when a bounds file gives them.
    pub marginals: Option<PrivacyRequest>,
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
    pub warnings: Vec<Notice>,
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
    /// Owners that may work with the proxy and the user (t).
    pub colluding_owners: u32,
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
        // A local run holds the rows: a label outside the classes is refused here,
        // naming the user's own file and line, before any key is made.
        if let (Some(classes), None) = (&classes, &opts.remote) {
            table
                .class_indices(&classes.labels, &name)
                .context("the classes (--classes) must name every label of the table")?;
        }
        let n = pooled_rows(opts, &table, &name)?;
        let bounds = plan_bounds(opts, &table, bounds, &mut warnings)?;
        let delta = opts.delta.unwrap_or_else(|| (n as f64).powf(-1.1));
        let privacy = PrivacyRequest::new(opts.mechanism, opts.centering, opts.epsilon, delta)?;
        let split = split_for_preparation(opts, privacy, bounds.private)?;
        // Each owner's cap is what this run spends on its rows: the studies'
        // epsilons and deltas added (the proxy charges each study's guarantee).
        let budget_cap = split
            .requests()
            .fold((0.0, 0.0), |(e, d), r| (e + r.epsilon, d + r.delta));
        Ok(Self {
            cohort: cohort_shape(opts, n),
            table,
            input_label: label,
            owner_label,
            pca_dim,
            bounds: bounds.bounds,
            bounds_from_data: bounds.from_data,
            marginals: split.marginals,
            classes,
            privacy: split.study,
            histogram: split.histogram,
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
            colluding_owners: self.cohort.colluding_owners,
            // Named once the run knows its holder (`local::prepare`).
            mask_holder: None,
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

/// Where a study's bounds come from.
struct PlannedBounds {
    /// Every feature's bounds ([-1, 1] placeholders where chosen privately).
    bounds: Vec<(f64, f64)>,
    /// Read off the data, as an insecure flag asked.
    from_data: bool,
    /// Chosen by a marginal histogram study run first.
    private: bool,
}

/// The bounds: from the bounds file; read off the data where the insecure flag
/// asks (a local run only); else chosen privately by a marginal histogram study.
fn plan_bounds(
    opts: &LocalOptions,
    table: &Table,
    file: Option<(PathBuf, Vec<u8>)>,
    warnings: &mut Vec<Notice>,
) -> anyhow::Result<PlannedBounds> {
    let planned = |bounds, from_data, private| PlannedBounds {
        bounds,
        from_data,
        private,
    };
    match file {
        Some((path, bytes)) => {
            let bounds = read_bounds(bytes.as_slice(), &table.features)
                .with_context(|| path.display().to_string())?;
            Ok(planned(bounds, false, false))
        }
        None if opts.insecure_bounds_from_data && opts.remote.is_some() => {
            bail!("--insecure-bounds-from-data reads the rows, which a study at a remote proxy does not have")
        }
        None if opts.insecure_bounds_from_data => {
            warnings.push(Notice::new(
                "bounds_from_data",
                "--insecure-bounds-from-data: bounds are read off the data. This leaks \
                 the data's extremes and is not private; leave the flag out to choose \
                 them privately.",
            ));
            Ok(planned(table.bounds_from_data(), true, false))
        }
        None => Ok(planned(
            vec![(-1.0, 1.0); table.features.len()],
            false,
            true,
        )),
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
    warnings: &mut Vec<Notice>,
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
    warnings.push(Notice::new(
        "classes_from_data",
        "no --classes given: the class labels are read off the data. This is for demos \
         only; the labels present are published in the study and in every synthetic row. \
         Real class labels are public knowledge fixed before any data is seen.",
    ));
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

/// A request split among the studies of a run: the marginal histograms that
/// choose the bounds, the row-norm histogram that chooses C (with its quantile),
/// and the study itself; they compose to what was asked.
pub struct Split {
    /// The marginal histogram study's request, where it runs.
    pub marginals: Option<PrivacyRequest>,
    /// The row-norm histogram's quantile and request, where it runs.
    pub histogram: Option<(f64, PrivacyRequest)>,
    /// The study's own request: what is left.
    pub study: PrivacyRequest,
}

impl Split {
    /// Every study's request, in the order they run.
    pub fn requests(&self) -> impl Iterator<Item = &PrivacyRequest> {
        self.marginals
            .iter()
            .chain(self.histogram.iter().map(|(_, h)| h))
            .chain(std::iter::once(&self.study))
    }
}

/// Splits `privacy` for the studies that run before the study: the marginal
/// histograms where bounds are chosen privately (`--bounds-budget-share`), the
/// row-norm histogram where C is (`--quantile-budget-share`). Both shares are
/// of the whole request; both preparatory studies are `dp-mean`, with nothing
/// to mask.
fn split_for_preparation(
    opts: &LocalOptions,
    privacy: PrivacyRequest,
    private_bounds: bool,
) -> anyhow::Result<Split> {
    let quantile = opts.row_norm_quantile;
    if let Some(q) = quantile.filter(|q| !(*q > 0.0 && *q < 1.0)) {
        bail!("--row-norm-quantile must be strictly between 0 and 1, got {q}");
    }
    if (private_bounds || quantile.is_some()) && !opts.mechanism.proven() {
        bail!(
            "the {} mechanism cannot choose bounds or C privately: pass --bounds and \
             --row-norm-bound, or use the gaussian or laplace mechanism",
            opts.mechanism.name()
        );
    }
    let dp_mean =
        |r: PrivacyRequest| PrivacyRequest::new(r.mechanism, Centering::DpMean, r.epsilon, r.delta);
    let mut rest = privacy;
    let mut taken = 0.0;
    let mut take = |share: f64, flag: &str| -> anyhow::Result<PrivacyRequest> {
        if !(share > 0.0 && share + taken < 1.0) {
            bail!("{flag} must be above 0, and the shares below 1 together; got {share}");
        }
        let (part, left) = split_request(&rest, share / (1.0 - taken)).context(flag.to_string())?;
        rest = left;
        taken += share;
        Ok(dp_mean(part)?)
    };
    let marginals = match private_bounds {
        true => Some(take(opts.bounds_budget_share, "--bounds-budget-share")?),
        false => None,
    };
    let histogram = match quantile {
        Some(q) => Some((
            q,
            take(opts.quantile_budget_share, "--quantile-budget-share")?,
        )),
        None => None,
    };
    Ok(Split {
        marginals,
        histogram,
        study: rest,
    })
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
            colluding_owners: opts.colluding_owners,
        },
        None => CohortShape {
            max_rows: (n as u64).next_power_of_two().max(2),
            min_owners: opts.owners as u32,
            quorum: opts.owners as u32,
            deadline: Duration::from_secs(3600),
            expected_owners: (1..=opts.owners).map(owner_name).collect(),
            colluding_owners: opts.colluding_owners,
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
            test_proxy_skips_noise: false,
            test_owner_adds_no_noise: false,
            colluding_owners: 0,
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
            bounds_budget_share: 0.05,
            insecure_bounds_from_data: false,
            insecure_plaintext: false,
            remote: None,
            print_warnings: false,
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
            mask_holder: None,
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
                "cannot choose bounds or C privately: pass --bounds and --row-norm-bound",
            ),
            (
                Box::new(|o| {
                    o.bounds = None;
                    o.mechanism = Mechanism::WISHART_UNPROVEN
                }),
                "cannot choose bounds or C privately",
            ),
            (
                Box::new(|o| {
                    o.bounds = None;
                    o.row_norm_quantile = Some(0.9);
                    o.bounds_budget_share = 0.5;
                    o.quantile_budget_share = 0.5
                }),
                "the shares below 1 together",
            ),
            (
                Box::new(|o| {
                    o.bounds = None;
                    o.insecure_bounds_from_data = true;
                    o.remote = Some(remote())
                }),
                "--insecure-bounds-from-data reads the rows",
            ),
            (
                Box::new(|o| {
                    o.task = Task::Classify;
                    o.classes = vec!["1".into(), "2".into()]
                }),
                "table.csv, line 5: label `10` is not one of the study's classes",
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

    /// Without a bounds file the bounds are chosen privately: a marginal
    /// histogram study takes its share, the bounds are placeholders until it
    /// runs, nothing is read off the data and nothing warns of it.
    #[test]
    fn without_a_bounds_file_the_bounds_are_chosen_privately() {
        let mut opts = options();
        opts.bounds = None;
        opts.row_norm_quantile = Some(0.9);
        opts.mechanism = Mechanism::LAPLACE;
        let p = plan(&opts).expect("plans");
        assert!(
            !p.bounds_from_data && p.warnings.is_empty(),
            "{:?}",
            p.warnings
        );
        assert_eq!(p.bounds, [(-1.0, 1.0); 3]);
        let m = p.marginals.expect("a marginal histogram study");
        let (_, h) = p.histogram.expect("a histogram study");
        // Each preparatory study's share is of the whole request.
        assert!((m.epsilon - 0.05).abs() < 1e-12 && (h.epsilon - 0.1).abs() < 1e-12);
        assert!((p.privacy.epsilon - 0.85).abs() < 1e-12);
        assert!((p.budget_cap.0 - 1.0).abs() < 1e-12);
        assert_eq!(m.centering, Centering::DpMean);
        // A remote study chooses them privately too.
        opts.remote = Some(remote());
        assert!(plan(&opts).expect("plans").marginals.is_some());
    }

    #[test]
    fn what_an_insecure_flag_reads_off_the_data_is_planned_with_a_warning() {
        let mut opts = options();
        opts.bounds = None;
        opts.insecure_bounds_from_data = true;
        opts.task = Task::Classify;
        let p = plan(&opts).expect("plans");
        assert!(p.bounds_from_data && p.marginals.is_none());
        assert_eq!(p.bounds, [(0.0, 3.0), (0.0, 2.0), (0.0, 3.0)]);
        let labels = p.classes.as_ref().map(|c| c.labels.clone());
        // In natural order: 2 before 10.
        assert_eq!(labels, Some(vec!["1".into(), "2".into(), "10".into()]));
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
        assert!(p.warnings.iter().any(
            |w| w.kind == "bounds_from_data" && w.text.contains("bounds are read off the data")
        ));
        assert!(p
            .warnings
            .iter()
            .any(|w| w.kind == "classes_from_data"
                && w.text.contains("labels are read off the data")));
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
