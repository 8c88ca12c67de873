//! Utility of PCA-Gauss synthetic data against real data: the structure of the
//! PCA-Gauss paper's Tables II-IV on the bundled data sets.
//!
//! For each task a model is trained on synthetic rows and scored on a real held-out
//! split (80/20, seeded):
//! - cluster (optdigits, Algorithm 1): k-means with 10 clusters (best of 3 runs)
//!   fitted on the rows,
//!   silhouette of the real test rows under its assignment;
//! - classify (optdigits, letter, Algorithm 3): multinomial logistic regression,
//!   accuracy on the real test rows;
//! - regress (diamonds, Algorithm 2): ridge regression, RMSE of price on the real
//!   test rows.
//!
//! Methods, all from the same private release of the study (`dp-mean` centering):
//! - `real`: the model trained on the real training rows (no privacy);
//! - `pca-gauss`: one study; the top-k private components of its scatter, and the
//!   moments from the same release (this system, one round);
//! - `pca-gauss-2`: two studies, half the budget each (zCDP rho halves for the
//!   Gaussian, epsilon halves for Laplace): the first for the components, the
//!   second releasing R of the rows projected onto them (`--components-from`): the
//!   paper's independent PCA source, where the Laplace noise of R shrinks from
//!   (M + 1) to (k + 1) in L1 sensitivity;
//! - `pca-gauss-2k`: as `pca-gauss-2`, but the second round releases only
//!   k-dimensional sums and scatters of W^T x (the paper's PCA-induced class means,
//!   whose Laplace sensitivity also shrinks with k), the global mean's part outside
//!   the span taken from round 1. The protocol does not offer this second round (its
//!   projected studies keep M-dimensional sums); it is evaluated here, centrally, to
//!   look for the paper's Lap-PCA gain;
//! - `pub-pca`: the paper's Pub-PCA source: a disjoint public tenth of the training
//!   rows gives the axes; the study runs projected on the rest with the whole budget
//!   (`user local --pca-from`);
//! - `full-gauss`: no dimension reduction, all M axes (the paper's MODIPS
//!   comparison: a Gaussian fitted to the noisy moments);
//! - `random-proj`: k random orthonormal axes, public, so the whole budget goes to
//!   one projected study on them (the paper's adaptation of Blocki et al.); its
//!   synthetic data lives in the random span, class deviations included.
//!
//! Besides the mean and sd per method, a last table pairs each method with
//! full-gauss repetition by repetition (the same seeds), which is what tells a gap
//! from noise when the two read the same release.
//!
//! `--row-norm-quantile Q` chooses C per epsilon from a central row-norm histogram
//! release (as `user local --row-norm-quantile`), which spends
//! `--quantile-budget-share` of the budget; the methods get the rest.
//!
//! The release runs centrally on the pooled integer share (`central_release`), which
//! the protocol's tests prove equal, bit for bit, to what the user opens from the
//! distributed release with the same noise. Rows are sampled exactly as `user local
//! --synthetic` samples them, then put through the study's public preprocessing.

mod experiment;
mod methods;
mod scoring;
mod tables;

use experiment::*;
use methods::*;
use scoring::*;
use tables::*;

use dpca_bench::workspace_root;
use std::path::PathBuf;

use anyhow::bail;
use clap::Parser;
use dpca_common::dp::{split_request, Centering, Mechanism, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::protocol::Share;
use dpca_common::study::{BlockShape, DEFAULT_FRAC_BITS};
use dpca_common::synth::{FitKind, Task};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// PCA-Gauss synthetic data against real data and two baselines.
#[derive(Parser, Debug)]
#[command(name = "synthetic", about)]
struct Args {
    /// Experiments: cluster-optdigits, classify-optdigits, classify-letter,
    /// regress-diamonds.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cluster-optdigits,classify-optdigits,classify-letter,regress-diamonds"
    )]
    experiments: Vec<String>,
    /// Epsilons.
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,2")]
    epsilons: Vec<f64>,
    /// Repetitions per setting (fresh noise and fresh samples each).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Mechanism (gaussian or laplace).
    #[arg(long, default_value = "gaussian")]
    mechanism: String,
    /// Classification: shared or per-class covariance.
    #[arg(long, default_value = "shared")]
    class_covariance: String,
    /// How the PCA methods read the covariance from the release: `denoised`
    /// (eigenvalues shrunk for the known noise, isotropic residual outside the
    /// components) or `paper` (as released, nothing outside the span).
    #[arg(long, default_value = "denoised")]
    covariance: String,
    /// Denoise full-gauss too (by default it is the paper's MODIPS comparison: the
    /// noisy covariance, negative eigenvalues clipped).
    #[arg(long)]
    denoise_full_gauss: bool,
    /// Components k per experiment, in the order of --experiments (default: 20 for
    /// optdigits, 10 for letter, 7 of 9 for diamonds).
    #[arg(long, value_delimiter = ',')]
    k: Vec<usize>,
    /// Also sweep k at the --sweep-epsilon for pca-gauss (utility against k).
    #[arg(long, value_delimiter = ',')]
    ks: Vec<usize>,
    /// epsilon of the k sweep.
    #[arg(long, default_value_t = 1.0)]
    sweep_epsilon: f64,
    /// Row-norm bound C of the normalized rows (each feature mapped to [-1, 1]).
    #[arg(long, default_value_t = 1.0)]
    row_norm_bound: f64,
    /// Choose C per epsilon as this DP quantile of the training rows' norms: a
    /// row-norm histogram release spending --quantile-budget-share of the budget, as
    /// `user local --row-norm-quantile` runs it; the methods get the rest.
    #[arg(long, value_name = "Q")]
    row_norm_quantile: Option<f64>,
    /// Share of the budget the row-norm histogram spends.
    #[arg(long, default_value_t = 0.05)]
    quantile_budget_share: f64,
    /// Methods to run (default all): pca-gauss, pca-gauss-2, pca-gauss-2k, pub-pca,
    /// full-gauss, random-proj.
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,
    /// Seed of the split, the noise and the samples.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// JSON output (default target/bench-synthetic/synthetic-bench.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Score mode: the output folder of `user local --synthetic ... --task classify`;
    /// trains logistic regression on its synthetic.csv and on --train, scores both
    /// on --test after the study's public preprocessing (bounds and row-norm bound
    /// from its study.json).
    #[arg(long, value_name = "DIR")]
    score_study: Option<PathBuf>,
    /// Score mode: the real training rows the study ran on.
    #[arg(long, requires = "score_study")]
    train: Option<PathBuf>,
    /// Score mode: the real held-out rows.
    #[arg(long, requires = "score_study")]
    test: Option<PathBuf>,
    /// Score mode: the label column.
    #[arg(long, default_value = "label")]
    label: String,
}

/// The method and fitting choices every experiment shares, checked once.
struct Settings {
    mechanism: Mechanism,
    per_class: bool,
    fit: FitChoice,
}

impl Settings {
    fn of(args: &Args) -> anyhow::Result<Self> {
        let mechanism = Mechanism::parse(&args.mechanism)?;
        let known: Vec<&str> = Method::SYNTHESIZED.iter().map(Method::name).collect();
        if let Some(bad) = args.methods.iter().find(|m| !known.contains(&m.as_str())) {
            bail!(
                "unknown method `{bad}` (expected one of {})",
                known.join(", ")
            );
        }
        let per_class = match args.class_covariance.as_str() {
            "shared" => false,
            "per-class" => true,
            other => bail!("--class-covariance must be shared or per-class, got `{other}`"),
        };
        Ok(Self {
            mechanism,
            per_class,
            fit: FitChoice {
                kind: FitKind::parse(&args.covariance)?,
                denoise_full_gauss: args.denoise_full_gauss,
            },
        })
    }

    /// `--reps` repetitions of one method on `at`, logged under `label`.
    fn cell(&self, args: &Args, at: &Loaded, run: MethodRun, label: &str) -> anyhow::Result<Cell> {
        let rep = Rep {
            e: &at.e,
            k: run.k,
            req: run.req,
            fixed: &at.fixed,
            per_class: self.per_class,
            pooled: &at.pooled,
            shape: &at.shape,
        };
        let cell = run_method(&rep, run.method, self.fit, args.reps, run.base_seed)?;
        eprintln!(
            "  {label}: {} {:.4} +- {:.4}",
            run.method.name(),
            cell.mean,
            cell.sd
        );
        Ok(cell)
    }

    /// The methods among `candidates` that `--methods` asks for (all without it).
    fn chosen<'a>(
        args: &'a Args,
        candidates: impl IntoIterator<Item = Method> + 'a,
    ) -> impl Iterator<Item = Method> + 'a {
        candidates
            .into_iter()
            .filter(|m| args.methods.is_empty() || args.methods.iter().any(|a| a == m.name()))
    }
}

/// One method's cell: at `k` components, at `req`, its repetitions seeded from
/// `base_seed`.
struct MethodRun<'a> {
    method: Method,
    k: usize,
    req: &'a PrivacyRequest,
    base_seed: u64,
}

/// One experiment, at the C it was loaded with, and its pooled share.
struct Loaded {
    e: Experiment,
    fixed: FixedPoint,
    pooled: Share,
    shape: BlockShape,
}

impl Loaded {
    fn new(e: Experiment, per_class: bool) -> Self {
        let fixed = FixedPoint {
            frac_bits: DEFAULT_FRAC_BITS,
            row_norm_bound: e.c,
        };
        let (pooled, shape, _) = pooled_share(&e, &fixed, per_class, None);
        Self {
            e,
            fixed,
            pooled,
            shape,
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.score_study {
        return score_study(&args, dir);
    }
    let settings = Settings::of(&args)?;
    let mut cells = Vec::new();
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    for (i, name) in args.experiments.iter().enumerate() {
        let e = load(name, args.k.get(i).copied(), args.seed, args.row_norm_bound)?;
        let loaded = Loaded::new(e, settings.per_class);
        let delta = (loaded.pooled.n as f64).powf(-1.1);
        let e = &loaded.e;
        eprintln!(
            "{name}: {} train / {} test rows, M = {}, k = {}, {} classes, delta = 1/N^1.1",
            e.train.len(),
            e.test.len(),
            e.bounds.len(),
            e.k,
            e.classes
        );
        cells.push(real_cell(&args, e, &mut rng)?);
        cells.extend(epsilon_cells(&args, &settings, &loaded, delta, &mut rng)?);
        cells.extend(k_sweep_cells(&args, &settings, &loaded, delta, &mut rng)?);
    }
    print_tables(&cells, &args);
    print_paired(&cells);
    write_json(&args, &cells)
}

/// The real rows' score: once for the deterministic learners, reps times for
/// k-means.
fn real_cell(args: &Args, e: &Experiment, rng: &mut ChaCha20Rng) -> anyhow::Result<Cell> {
    let real_reps = if e.task == Task::Cluster {
        args.reps
    } else {
        1
    };
    let real: Vec<f64> = (0..real_reps)
        .map(|_| score(e, &e.train, &e.train_y, rng))
        .collect::<anyhow::Result<_>>()?;
    let (mean, sd) = summarize(&real);
    Ok(Cell {
        experiment: e.name.clone(),
        metric: metric(e.task),
        method: Method::Real,
        epsilon: None,
        k: e.bounds.len(),
        reps: real_reps,
        mean,
        sd,
        values: real,
    })
}

/// Every synthesizing method at every epsilon. With a DP row-norm quantile, the
/// experiment is reloaded with its C and the methods get the rest of the budget.
fn epsilon_cells(
    args: &Args,
    settings: &Settings,
    loaded: &Loaded,
    delta: f64,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<Vec<Cell>> {
    // The unclipped rows the row-norm histogram counts, loaded once.
    let wide = match args.row_norm_quantile {
        Some(_) => Some(load(
            &loaded.e.name,
            Some(loaded.e.k),
            args.seed,
            f64::INFINITY,
        )?),
        None => None,
    };
    let mut cells = Vec::new();
    for &eps in &args.epsilons {
        let req = PrivacyRequest::new(settings.mechanism, Centering::DpMean, eps, delta)?;
        let chosen = match (args.row_norm_quantile, &wide) {
            (Some(q), Some(wide)) => {
                let (h, main) = split_request(&req, args.quantile_budget_share)?;
                let c = dp_row_norm(wide, q, &h, rng)?;
                eprintln!("  eps {eps}: C = {c:.4} (the {q} quantile of the norms)");
                Some((Loaded::new(wide.clipped(c), settings.per_class), main))
            }
            _ => None,
        };
        let (at, req) = match &chosen {
            Some((at, main)) => (at, main),
            None => (loaded, &req),
        };
        let base_seed: u64 = rng.gen();
        for method in Settings::chosen(args, Method::SYNTHESIZED) {
            let run = MethodRun {
                method,
                k: at.e.k,
                req,
                base_seed,
            };
            cells.push(settings.cell(args, at, run, &format!("eps {eps}"))?);
        }
    }
    Ok(cells)
}

/// The PCA methods against k, at `--sweep-epsilon`.
fn k_sweep_cells(
    args: &Args,
    settings: &Settings,
    loaded: &Loaded,
    delta: f64,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<Vec<Cell>> {
    let e = &loaded.e;
    let features = pca_dim(e);
    let pca_methods = [
        Method::PcaGauss,
        Method::PcaGauss2,
        Method::PcaGauss2K,
        Method::PubPca,
    ];
    let mut cells = Vec::new();
    for &k in args.ks.iter().filter(|&&k| k >= 1 && k <= features) {
        let req = PrivacyRequest::new(
            settings.mechanism,
            Centering::DpMean,
            args.sweep_epsilon,
            delta,
        )?;
        let base_seed: u64 = rng.gen();
        for method in Settings::chosen(args, pca_methods) {
            let run = MethodRun {
                method,
                k,
                req: &req,
                base_seed,
            };
            let cell = settings.cell(args, loaded, run, &format!("k {k}"))?;
            cells.push(Cell {
                experiment: format!("{} (k sweep)", e.name),
                ..cell
            });
        }
    }
    Ok(cells)
}

/// The cells as JSON, where `--json` says or under the target folder.
fn write_json(args: &Args, cells: &[Cell]) -> anyhow::Result<()> {
    let json = args
        .json
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/bench-synthetic/synthetic-bench.json"));
    if let Some(dir) = json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&json, serde_json::to_string_pretty(cells)? + "\n")?;
    println!("JSON in {}", json.display());
    Ok(())
}
