//! The `user` program's command line: its subcommands and flags, and the options
//! of a study they set, with the defaults that depend on one another and the
//! bundled demo's policy. `main.rs` only parses and dispatches.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use dpca_common::dp::{Centering, Mechanism};
use dpca_common::paillier::DEFAULT_KEY_BITS;
use dpca_common::study::ClassCovariance;
use dpca_common::synth::{FitKind, Task};
use dpca_shell::tls::{Role, TransportArgs};

use crate::local::{LocalOptions, Remote};

/// Principal components of data pooled across owners who never reveal their rows.
#[derive(Parser, Debug)]
#[command(name = "user", version, about)]
pub struct Cli {
    /// TOML file of settings: flag names as keys, a table per subcommand;
    /// environment variables and flags override it.
    #[arg(long, global = true, env = "DPCA_CONFIG", value_name = "TOML")]
    pub config: Option<PathBuf>,
    /// Logging flags.
    #[command(flatten)]
    pub log: dpca_shell::logging::LogArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Generate a Paillier key pair (secret key file readable by its owner only).
    Keygen {
        /// Modulus bits, 2048 to 8192.
        #[arg(long, default_value_t = DEFAULT_KEY_BITS)]
        key_bits: u64,
        /// Secret key file to create.
        #[arg(long)]
        secret: PathBuf,
        /// Public key file to create (hex of n).
        #[arg(long)]
        public: PathBuf,
    },
    /// Create a development CA and certificates for the proxy, the user and each
    /// owner (mutual TLS). For trials and the local demo only: a deployment's CA is
    /// run by the proxy's operator, and each party keeps its own key.
    DevCerts(DevCertsArgs),
    /// Split a CSV table into contiguous slices of nearly equal size, one per
    /// owner (owner-01, owner-02, ...), each with the input's header: for trials
    /// and simulations.
    Split {
        /// The table to split (header row).
        #[arg(long)]
        data: PathBuf,
        /// Number of slices.
        #[arg(long)]
        owners: usize,
        /// Folder to write OWNER.csv into, or OWNER/rows.csv with --per-party-dirs.
        #[arg(long)]
        out: PathBuf,
        /// Write each slice into its owner's folder as rows.csv.
        #[arg(long)]
        per_party_dirs: bool,
        /// Succeed without writing when every slice is there already.
        #[arg(long)]
        keep_existing: bool,
    },
    /// Clean feature vectors before releasing them to a predictor: remove the
    /// components its linear first stage sees least and a linear predictor of the
    /// confidential labels sees most, until the desired prediction moves by exactly
    /// --epsilon (squared); writes OUT/cleaned.csv and OUT/metrics.csv. Not
    /// differential privacy: it defeats one linear adversary (docs/PRIVACY.md).
    Clean(Box<CleanArgs>),
    /// Run a study at a proxy that runs elsewhere: open it, write the invitation
    /// (study id and key fingerprint) for the owners, wait until it seals, then
    /// decrypt and write the outputs as `local` does. The key is made for the study
    /// and never leaves this process.
    Study(Box<RemoteArgs>),
    /// Run a whole study on this machine: a proxy and several owner processes on
    /// loopback, the table split among them; print the explained variance and write
    /// components.csv, eigenvalues.csv, scatter.csv, study.json, report.html and,
    /// with --synthetic, synthetic.csv.
    Local(Box<LocalArgs>),
}

/// What a study computes and releases, wherever its proxy and owners run.
#[derive(clap::Args, Debug)]
pub struct StudyArgs {
    /// Principal components to write.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// Privacy parameter epsilon (> 0).
    // Negative numbers are taken as values, so that the study's own check names
    // what is wrong with them, not the parser.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub epsilon: f64,
    /// Privacy parameter delta in (0, 1) (default 1/N^1.1; for a study at a
    /// remote proxy N is --max-rows).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: Option<f64>,
    /// The noise mechanism (each one's privacy contract: docs/PRIVACY.md).
    /// gaussian-classic needs epsilon < 1; wishart-unproven has no privacy proof
    /// and every owner must accept it by name.
    #[arg(long, default_value = "gaussian", value_parser = mechanism_names())]
    pub mechanism: String,
    /// dp-mean (default) or mask. `dp-mean` adds DP noise to the sums and releases a
    /// DP mean; its privacy holds whatever other owners send. `mask` is the paper's
    /// centering, with about 2.8x more noise: its proof needs every owner's rows in
    /// the norm ball (nobody can check that under encryption, so one dishonest owner
    /// working with the user breaks it), and the user learns each owner's row count
    /// (it decrypts N only as the product of the owners' signed counts). Owners
    /// refuse a mask study unless they pass `--accept-risk mask-centering`.
    #[arg(long)]
    pub centering: Option<String>,
    /// Owners that may work with the proxy and the user (t, default 0). In a
    /// `dp-mean` study under the gaussian mechanism each owner adds a share of
    /// the noise, sized so that the owners beyond t, at the fewest the study
    /// seals with (--min-owners), carry all of it: epsilon then holds against
    /// the user with t owners, and is smaller against the user alone (the
    /// proxy working with the user reads each owner's contribution with its own
    /// share of noise alone; study.json states all three). Each extra t adds
    /// noise: variance times min_owners / (min_owners - t) with every owner
    /// present.
    #[arg(long, default_value_t = 0)]
    pub colluding_owners: u32,
    /// Label column to exclude from the features.
    #[arg(long)]
    pub label: Option<String>,
    /// Public bounds: CSV `feature,lo,hi` (`*` for all others), known before any
    /// row is seen. Without it every feature's range, center and scale are chosen
    /// privately: a marginal histogram study runs first on the same owners and
    /// spends --bounds-budget-share of the budget.
    #[arg(long)]
    pub bounds: Option<PathBuf>,
    /// INSECURE: without --bounds, read each feature's bounds off the data (min
    /// and max) instead of choosing them privately. It leaks the data's extremes;
    /// a local run only.
    #[arg(long, conflicts_with = "bounds")]
    pub insecure_bounds_from_data: bool,
    /// Share of epsilon (of zCDP rho for the gaussian mechanism) the marginal
    /// histograms that choose the bounds spend, when no --bounds is given.
    #[arg(long, default_value_t = 0.05)]
    pub bounds_budget_share: f64,
    /// Row L2 norm bound C in normalized units. Without it C is chosen privately
    /// (--row-norm-quantile 0.9).
    #[arg(long, allow_negative_numbers = true)]
    pub row_norm_bound: Option<f64>,
    /// Choose the row-norm bound C as this quantile of the rows' norms (default
    /// 0.9 when no --row-norm-bound is given): a row-norm histogram study runs
    /// first on the same owners and spends --quantile-budget-share of the budget.
    /// At a remote proxy the invited owners take part in every study (an owner
    /// that contributed to a preparatory histogram waits for the next invitation).
    #[arg(long, value_name = "Q", conflicts_with = "row_norm_bound")]
    pub row_norm_quantile: Option<f64>,
    /// Share of epsilon (of zCDP rho for the gaussian mechanism) the row-norm
    /// histogram spends; the study gets what the preparatory studies leave, and
    /// study.json the composed total.
    #[arg(long, default_value_t = 0.05)]
    pub quantile_budget_share: f64,
    /// Paillier modulus bits, 2048 to 8192.
    #[arg(long, default_value_t = DEFAULT_KEY_BITS)]
    pub key_bits: u64,
    /// Project the noisy scatter onto the PSD cone before the eigen-decomposition.
    #[arg(long)]
    pub psd_repair: bool,
    /// Output folder.
    #[arg(long, default_value = "out")]
    pub out: PathBuf,
    /// Also write ROWS rows of differentially private synthetic data to
    /// OUT/synthetic.csv (PCA-Gauss on the top-k components: post-processing, no extra
    /// budget). Needs a DP mean: not with `--centering mask`.
    #[arg(long, value_name = "ROWS")]
    pub synthetic: Option<usize>,
    /// What the synthetic data is for: cluster (features only), regress (the numeric
    /// label drawn jointly with the features) or classify (a Gaussian per class:
    /// class means, proportions and covariances released by the study).
    /// Default: classify with --label and --synthetic (a labelled synthetic
    /// table) and for the bundled demo; cluster otherwise.
    #[arg(long)]
    pub task: Option<String>,
    /// Classification: `shared` within-class covariance (one noisy scatter, LDA-style)
    /// or `per-class` (the paper's; noisy with small classes).
    #[arg(long, default_value = "shared")]
    pub class_covariance: String,
    /// Classification: the label's values, comma separated. Public, fixed before
    /// any row is seen: they are published in the study and in every synthetic
    /// row. Required for `study`; `local` reads them off the data with a warning
    /// (demo only), except for the bundled data set's digits.
    #[arg(long, value_delimiter = ',')]
    pub classes: Vec<String>,
    /// How synthesis reads the covariance from the release: `denoised` (the top
    /// eigenvalues shrunk back by the bias the public noise level gives them, and
    /// the variance the k components leave out spread evenly outside them) or
    /// `paper` (as released, nothing outside the span of the components). Both are
    /// post-processing: no budget.
    #[arg(long, default_value = "denoised")]
    pub covariance_fit: String,
    /// Pub-PCA: take k axes from the PCA of this public CSV (same columns); owners
    /// then release R of their rows projected onto them (the second round of
    /// PCA-Gauss: far less Laplace noise for k much below M). Needs dp-mean.
    #[arg(long, value_name = "CSV")]
    pub pca_from: Option<PathBuf>,
    /// As --pca-from, with the axes read from components.csv of an earlier study
    /// (DP PCA as the independent source; its budget was spent by that study).
    #[arg(long, value_name = "CSV")]
    pub components_from: Option<PathBuf>,
}

/// `user dev-certs`'s flags.
#[derive(clap::Args, Debug)]
pub struct DevCertsArgs {
    /// Folder to write ca.pem, ca.key, proxy.pem/.key, USER.pem/.key and
    /// OWNER.pem/.key into; existing files are never overwritten.
    #[arg(long)]
    pub out: PathBuf,
    /// The proxy's host names or IP addresses (its certificate is valid for
    /// these only).
    #[arg(long, value_delimiter = ',', default_value = "localhost,127.0.0.1")]
    pub proxy_hosts: Vec<String>,
    /// The data users' names, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "user")]
    pub users: Vec<String>,
    /// Owner names (each becomes that owner's id at the proxy), comma separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "owner_count")]
    pub owners: Vec<String>,
    /// Or this many owners named owner-01, owner-02, ...
    #[arg(long)]
    pub owner_count: Option<usize>,
    /// One folder per party (proxy/, USER/, OWNER/) holding ca.pem and that
    /// party's certificate and key only, to hand over whole; the CA key stays
    /// in OUT.
    #[arg(long)]
    pub per_party_dirs: bool,
    /// Succeed without writing when every file is there already (a rerun of a
    /// setup step); a partial set is still refused.
    #[arg(long)]
    pub keep_existing: bool,
}

impl DevCertsArgs {
    /// The owners named, or `owner-01` .. for `--owner-count`.
    pub fn owner_names(&self) -> Vec<String> {
        match self.owner_count {
            Some(n) => (1..=n).map(crate::local::owner_name).collect(),
            None => self.owners.clone(),
        }
    }
}

/// `user clean`'s flags.
#[derive(clap::Args, Debug)]
pub struct CleanArgs {
    /// Training rows (CSV with a header): features and label columns.
    #[arg(long)]
    train: PathBuf,
    /// Confidential label columns of the training rows, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    confidential: Vec<String>,
    /// Desired label columns, comma separated: left out of the features, and
    /// the desired predictor is fitted on them when --predictor is not given.
    #[arg(long, value_delimiter = ',')]
    desired: Vec<String>,
    /// The desired predictor's linear first stage: CSV `feature,OUT1,...`, one
    /// row per feature (a study's components.csv, with --bounds).
    #[arg(long)]
    predictor: Option<PathBuf>,
    /// Public bounds `feature,lo,hi`: map the features to [-1, 1] first, as a
    /// study does (for a study's components as the predictor).
    #[arg(long)]
    bounds: Option<PathBuf>,
    /// The vectors to clean: the training file's feature columns (labels, if
    /// present, are copied and score complete privacy).
    #[arg(long)]
    vectors: PathBuf,
    /// e_utility per vector (> 0).
    #[arg(long, required_unless_present = "exact_null_space")]
    epsilon: Option<f64>,
    /// Remove only what the desired predictor cannot see (e_utility 0).
    #[arg(long, conflicts_with = "epsilon")]
    exact_null_space: bool,
    /// A vector whose every component costs less than --epsilon loses them all
    /// (e_utility below epsilon) instead of stopping the run with an error.
    #[arg(long, requires = "epsilon")]
    at_most: bool,
    /// Output folder.
    #[arg(long, default_value = "cleaned")]
    out: PathBuf,
}

impl CleanArgs {
    /// What the cleaning is asked to do.
    pub fn options(self) -> crate::clean::CleanOptions {
        crate::clean::CleanOptions {
            train: self.train,
            desired: self.desired,
            confidential: self.confidential,
            predictor: self.predictor,
            bounds: self.bounds,
            vectors: self.vectors,
            epsilon: if self.exact_null_space {
                None
            } else {
                self.epsilon
            },
            at_most: self.at_most,
            out: self.out,
        }
    }
}

/// `user local`'s own flags.
#[derive(clap::Args, Debug)]
pub struct LocalArgs {
    /// Input CSV with a header row (default: the bundled optdigits, bounds 0..16).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Owner processes to split the rows among.
    #[arg(long, default_value_t = 10)]
    pub owners: usize,
    /// Rows of each owner's slice, comma separated, in the table's order (they must
    /// add up to its rows); their count is the number of owners. Default: equal
    /// slices.
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "owners",
        value_name = "ROWS"
    )]
    pub slice_rows: Vec<usize>,
    /// Do not build proxy and owner first (use the binaries next to this one).
    #[arg(long)]
    pub no_build: bool,
    /// Speed baseline (the paper's way): one value per ciphertext, textbook r^n
    /// randomness, no CRT, one thread per role. Same results, much slower.
    #[arg(long)]
    pub baseline: bool,
    /// INSECURE: run the proxy and owners on plaintext gRPC (by default the run
    /// makes a throwaway CA and uses mutual TLS, as a deployment does).
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// Privacy sweep: run the study once per epsilon (comma separated; each spends
    /// its own budget on the same rows), score each by the variance its components
    /// capture of the exact scatter, and write OUT/sweep.csv and OUT/sweep.html
    /// (the captured variance against epsilon). For choosing epsilon on data you
    /// may spend it on, such as a public stand-in.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "EPSILONS",
        conflicts_with = "epsilon"
    )]
    pub sweep: Vec<f64>,
    /// TEST ONLY: noise-free release (the proxy is started in its test mode).
    #[arg(long, hide = true)]
    pub noise_free_for_testing: bool,
    /// TEST ONLY: the run's proxy draws none of its own noise (a proxy that
    /// skips it), to show what the owners' noise alone gives.
    #[arg(long, hide = true)]
    pub test_proxy_skips_noise: bool,
    /// TEST ONLY: the run's first owner adds no noise share, to show what the
    /// others' shares alone give.
    #[arg(long, hide = true)]
    pub test_owner_adds_no_noise: bool,
    /// What the study computes and releases.
    #[command(flatten)]
    pub study: StudyArgs,
}

/// `user study`'s own flags.
#[derive(clap::Args, Debug)]
pub struct RemoteArgs {
    /// The proxy's URL (as for `owner` and `proxy status`).
    #[arg(
        long,
        default_value = "https://localhost:50051",
        env = "DPCA_PROXY_URL"
    )]
    pub proxy: String,
    /// A CSV whose header row is the table's: the features in the owners' order
    /// (and the --label column). Only the header is read: the user never sees rows.
    #[arg(long, value_name = "CSV")]
    pub schema: PathBuf,
    /// The owners invited, by the names in their certificates, comma separated;
    /// the proxy refuses anyone else.
    #[arg(long, value_delimiter = ',', required = true)]
    pub owners: Vec<String>,
    /// The study seals once this many owners have contributed (default: all).
    #[arg(long)]
    pub quorum: Option<u32>,
    /// At the deadline the study seals if at least this many have (default: the
    /// quorum), else it is aborted.
    #[arg(long)]
    pub min_owners: Option<u32>,
    /// Minutes from now until the deadline.
    #[arg(long, default_value_t = 60)]
    pub deadline_minutes: u64,
    /// A public upper bound on the pooled rows N (sets the fixed-point ranges, and
    /// delta's default).
    #[arg(long)]
    pub max_rows: u64,
    /// Write the owners' invitation (TOML: study, key-fingerprint) to this file;
    /// `owner --invitation FILE` reads it. Without it, the study id and the
    /// fingerprint are printed only.
    #[arg(long, value_name = "TOML")]
    pub invitation: Option<PathBuf>,
    /// The URL of the study's mask holder: a second proxy, run by an operator
    /// other than --proxy's, that keeps each owner's mask seed, so that neither
    /// proxy, with this user, reads one owner's contribution (docs/PRIVACY.md,
    /// "Masked contributions"). Only where the owners add the noise (`dp-mean`,
    /// gaussian). Without it the proxy with the user reads each contribution.
    #[arg(long, value_name = "URL")]
    pub mask_holder: Option<String>,
    /// The user's certificate.
    #[command(flatten)]
    pub transport: TransportArgs,
    /// What the study computes and releases.
    #[command(flatten)]
    pub study: StudyArgs,
}

/// Rows of the bundled optdigits table: the demo writes as many synthetic rows.
pub const BUNDLED_ROWS: usize = 5620;

/// The quantile of the row norms taken as C when no --row-norm-bound is given.
pub const DEFAULT_NORM_QUANTILE: f64 = 0.9;

impl LocalArgs {
    /// The options of `user local`, and the sweep's epsilons (empty: one study).
    /// The bundled demo (no --data) shows the whole product: components and
    /// labelled synthetic rows, one per real row (unless asked for `mask`, which
    /// releases no mean to synthesize with).
    pub fn options(self) -> anyhow::Result<(LocalOptions, Vec<f64>)> {
        let a = self;
        let demo = a.data.is_none() && a.study.centering.as_deref() != Some("mask");
        let opts = LocalOptions {
            data: a.data,
            owners: match a.slice_rows.len() {
                0 => a.owners,
                n => n,
            },
            noise_free_for_testing: a.noise_free_for_testing,
            test_proxy_skips_noise: a.test_proxy_skips_noise,
            test_owner_adds_no_noise: a.test_owner_adds_no_noise,
            no_build: a.no_build,
            programs: None,
            slice_rows: a.slice_rows,
            baseline: a.baseline,
            insecure_plaintext: a.insecure_plaintext,
            remote: None,
            ..study_options(a.study, demo)?
        };
        Ok((opts, a.sweep))
    }
}

impl RemoteArgs {
    /// The options of `user study`: the same study at a running proxy, its owners
    /// invited.
    pub fn options(self) -> anyhow::Result<LocalOptions> {
        let a = self;
        let transport = a.transport.transport(Role::User)?;
        let quorum = a.quorum.unwrap_or(a.owners.len() as u32);
        Ok(LocalOptions {
            data: Some(a.schema),
            owners: a.owners.len(),
            remote: Some(Remote {
                proxy: a.proxy,
                transport,
                owners: a.owners,
                quorum,
                min_owners: a.min_owners.unwrap_or(quorum),
                deadline: std::time::Duration::from_secs(a.deadline_minutes * 60),
                max_rows: a.max_rows,
                invitation: a.invitation,
                mask_holder: a.mask_holder,
            }),
            ..study_options(a.study, false)?
        })
    }
}

/// The registered mechanisms' names, which `--mechanism` accepts and its help lists.
pub fn mechanism_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(Mechanism::all().iter().map(|m| m.name()))
}

/// The options a study's flags set, with the defaults that depend on one another
/// (task, centering, synthetic rows); `demo` is the bundled demo of `local`.
pub fn study_options(a: StudyArgs, demo: bool) -> anyhow::Result<LocalOptions> {
    // A labelled synthetic table is what --label with --synthetic asks for.
    let task = match &a.task {
        Some(t) => Task::parse(t)?,
        None if demo || (a.label.is_some() && a.synthetic.is_some()) => Task::Classify,
        None => Task::Cluster,
    };
    let synthetic = a.synthetic.or(demo.then_some(BUNDLED_ROWS));
    let centering = match &a.centering {
        Some(c) => Centering::parse(c)?,
        None => Centering::DpMean,
    };
    if let Some(c) = a.row_norm_bound.filter(|c| !(c.is_finite() && *c > 0.0)) {
        anyhow::bail!("--row-norm-bound must be a positive finite number, got {c}");
    }
    Ok(LocalOptions {
        data: None,
        owners: 0,
        k: a.k,
        epsilon: a.epsilon,
        delta: a.delta,
        mechanism: Mechanism::parse(&a.mechanism)?,
        centering,
        label: a.label,
        bounds: a.bounds,
        row_norm_bound: a.row_norm_bound.unwrap_or(1.0),
        key_bits: a.key_bits,
        psd_repair: a.psd_repair,
        out: a.out,
        noise_free_for_testing: false,
        test_proxy_skips_noise: false,
        test_owner_adds_no_noise: false,
        colluding_owners: a.colluding_owners,
        no_build: false,
        programs: None,
        slice_rows: Vec::new(),
        baseline: false,
        synthetic,
        task,
        class_covariance: ClassCovariance::parse(&a.class_covariance)?,
        classes: a.classes,
        covariance_fit: FitKind::parse(&a.covariance_fit)?,
        pca_from: a.pca_from,
        components_from: a.components_from,
        row_norm_quantile: match a.row_norm_bound {
            Some(_) => None,
            None => Some(a.row_norm_quantile.unwrap_or(DEFAULT_NORM_QUANTILE)),
        },
        quantile_budget_share: a.quantile_budget_share,
        bounds_budget_share: a.bounds_budget_share,
        insecure_bounds_from_data: a.insecure_bounds_from_data,
        insecure_plaintext: false,
        remote: None,
        print_warnings: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn centering_of(args: &[&str]) -> Centering {
        let cli = Cli::try_parse_from(args).expect("flags");
        let Cmd::Local(a) = cli.command else {
            panic!("not a local study")
        };
        study_options(a.study, false).expect("options").centering
    }

    /// `mask` is private only while every owner is honest, so it is never chosen
    /// for the user: the default is `dp-mean`, `mask` is asked for by name.
    #[test]
    fn the_default_centering_is_dp_mean_and_mask_is_asked_for_by_name() {
        let base = ["user", "local", "--data", "rows.csv"];
        assert_eq!(centering_of(&base), Centering::DpMean);
        let masked = [&base[..], &["--centering", "mask"]].concat();
        assert_eq!(centering_of(&masked), Centering::Mask);
    }

    /// A first try on one's own table, with no tuning: C is chosen privately
    /// unless given, and a label with synthetic rows asks for a labelled
    /// synthetic table (classify), where a label alone keeps clustering.
    #[test]
    fn a_first_try_gets_private_defaults_and_a_labelled_synthetic_table() {
        let options = |extra: &[&str]| {
            let args = [&["user", "local", "--data", "rows.csv"][..], extra].concat();
            let cli = Cli::try_parse_from(args).expect("flags");
            let Cmd::Local(a) = cli.command else {
                panic!("not a local study")
            };
            a.options().expect("options").0
        };
        let first = options(&["--label", "y", "--synthetic", "100"]);
        assert_eq!(first.task, Task::Classify);
        assert_eq!(first.row_norm_quantile, Some(DEFAULT_NORM_QUANTILE));
        assert!(first.bounds.is_none() && !first.insecure_bounds_from_data);
        assert_eq!(options(&["--label", "y"]).task, Task::Cluster);
        let given = options(&["--row-norm-bound", "2"]);
        assert_eq!((given.row_norm_quantile, given.row_norm_bound), (None, 2.0));
        let asked = options(&["--row-norm-quantile", "0.8"]);
        assert_eq!(asked.row_norm_quantile, Some(0.8));
        assert_eq!(
            options(&["--task", "cluster", "--label", "y", "--synthetic", "9"]).task,
            Task::Cluster
        );
    }

    /// A negative privacy parameter or row-norm bound reaches the study's own
    /// check, which names the flag and the value, instead of the parser's
    /// "unexpected argument".
    #[test]
    fn negative_numbers_are_refused_by_name_not_by_the_parser() {
        let options = |flag: &str, value: &str| {
            let cli = Cli::try_parse_from(["user", "local", flag, value])
                .unwrap_or_else(|e| panic!("{flag} {value}: parser refused: {e}"));
            let Cmd::Local(a) = cli.command else {
                panic!("not a local study")
            };
            a.options().map(|_| ())
        };
        let err = options("--row-norm-bound", "-2").expect_err("negative C");
        assert!(err.to_string().contains("--row-norm-bound"), "{err}");
        // Parsed as values; the privacy request refuses them when the study plans.
        for flag in ["--epsilon", "--delta"] {
            let cli = Cli::try_parse_from(["user", "local", flag, "-1"]);
            assert!(cli.is_ok(), "{flag} -1: {:?}", cli.err());
        }
    }
}
