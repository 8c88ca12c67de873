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

use dpca_bench::workspace_root;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use dpca_common::data::{clip_to_norm, normalize_row, read_bounds, read_csv, Table};
use dpca_common::dp::{
    plan_noise_blocks, split_request, Centering, Mechanism, NoisePlan, PrivacyRequest,
};
use dpca_common::encoding::FixedPoint;
use dpca_common::linalg::{centered_scatter, pca, pca_in_span};
use dpca_common::protocol::{central_release, ClassRows, Opened, ReleaseSecrets, Share};
use dpca_common::study::{BlockShape, NormBins, Projection, DEFAULT_FRAC_BITS};
use dpca_common::synth::{
    task_projection, to_original_units, CovarianceFit, FitKind, NoiseLevel, Synthesizer, Task,
};
use linfa::metrics::SilhouetteScore;
use linfa::prelude::*;
use linfa_clustering::KMeans;
use linfa_elasticnet::ElasticNet;
use linfa_logistic::MultiLogisticRegression;
use nalgebra::{DMatrix, DVector};
use ndarray::{Array1, Array2};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rand_distr::StandardNormal;
use serde::Serialize;

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

/// Score mode: real-trained against synthetic-trained accuracy of a finished study.
fn score_study(args: &Args, dir: &Path) -> anyhow::Result<()> {
    let (Some(train), Some(test)) = (&args.train, &args.test) else {
        bail!("--score-study needs --train and --test");
    };
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("study.json")).context("study.json")?,
    )?;
    let bounds: Vec<(f64, f64)> = json["bounds"]
        .as_array()
        .context("study.json has no bounds")?
        .iter()
        .map(|b| (b[0].as_f64().unwrap_or(0.0), b[1].as_f64().unwrap_or(0.0)))
        .collect();
    let c = json["row_norm_bound"]
        .as_f64()
        .context("no row_norm_bound")?;
    let read = |p: &Path| -> anyhow::Result<Table> {
        let name = p.display().to_string();
        Ok(read_csv(
            std::fs::File::open(p).with_context(|| name.clone())?,
            &name,
            Some(&args.label),
        )?)
    };
    let (syn, tr, te) = (read(&dir.join("synthetic.csv"))?, read(train)?, read(test)?);
    let mut classes = tr.distinct_labels().unwrap_or_default();
    classes.sort();
    let prep = |t: &Table| -> anyhow::Result<(Vec<Vec<f64>>, Vec<usize>)> {
        let rows = t
            .rows
            .iter()
            .map(|r| normalize_row(r, &bounds, c).0)
            .collect();
        Ok((rows, t.class_indices(&classes, "table")?))
    };
    let ((sx, sy), (rx, ry), (tx, ty)) = (prep(&syn)?, prep(&tr)?, prep(&te)?);
    let e = Experiment {
        name: dir.display().to_string(),
        task: Task::Classify,
        k: 0,
        train: rx.clone(),
        test: tx,
        train_y: ry.clone(),
        test_y: ty,
        classes: classes.len(),
        bounds,
        c,
    };
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let real = score(&e, &rx, &ry, &mut rng)?;
    let synth = score(&e, &sx, &sy, &mut rng)?;
    println!(
        "logistic regression accuracy on {}: real-trained {real:.4}, synthetic-trained {synth:.4}, ratio {:.2}",
        test.display(),
        synth / real
    );
    Ok(())
}

/// One experiment: a data set, its public bounds and the task.
#[derive(Clone)]
struct Experiment {
    name: String,
    task: Task,
    k: usize,
    /// Training rows, normalized (label column last for regression).
    train: Vec<Vec<f64>>,
    /// Test rows, normalized the same way.
    test: Vec<Vec<f64>>,
    /// Class index per row (classification).
    train_y: Vec<usize>,
    test_y: Vec<usize>,
    classes: usize,
    /// Bounds of the study's columns (label last for regression).
    bounds: Vec<(f64, f64)>,
    /// Row-norm bound C of the normalized rows.
    c: f64,
}

impl Experiment {
    /// The same rows clipped to row norm `c` (from an experiment loaded unclipped).
    fn clipped(&self, c: f64) -> Experiment {
        let clip = |rows: &[Vec<f64>]| -> Vec<Vec<f64>> {
            rows.iter()
                .map(|r| {
                    let mut r = r.clone();
                    clip_to_norm(&mut r, c);
                    r
                })
                .collect()
        };
        Experiment {
            train: clip(&self.train),
            test: clip(&self.test),
            c,
            ..self.clone()
        }
    }
}

/// Share of the training rows set aside as public for Pub-PCA.
const PUBLIC_SHARE: f64 = 0.1;

fn load(name: &str, k: Option<usize>, seed: u64, c: f64) -> anyhow::Result<Experiment> {
    let (task, file, default_k): (Task, &str, usize) = match name {
        "cluster-optdigits" => (Task::Cluster, "optdigits", 20),
        "classify-optdigits" => (Task::Classify, "optdigits", 20),
        "classify-letter" => (Task::Classify, "letter", 10),
        "regress-diamonds" => (Task::Regress, "diamonds", 7),
        other => bail!("unknown experiment `{other}`"),
    };
    let root = workspace_root().join("data");
    let path = root.join(format!("{file}.csv"));
    let label = if file == "diamonds" { "price" } else { "label" };
    let shown = path.display().to_string();
    let input = read_csv(
        std::fs::File::open(&path).with_context(|| shown.clone())?,
        &shown,
        Some(label),
    )?;
    let (table, labels): (Table, Vec<usize>) = match task {
        Task::Regress => (input.with_label_as_feature(&shown)?, Vec::new()),
        _ => {
            let mut classes = input.distinct_labels().unwrap_or_default();
            classes.sort();
            let idx = input.class_indices(&classes, &shown)?;
            (input, idx)
        }
    };
    let bounds_path = root.join(format!("{file}.bounds.csv"));
    let bounds = read_bounds(std::fs::File::open(&bounds_path)?, &table.features)?;
    let classes = if task == Task::Classify {
        labels.iter().copied().max().map_or(0, |m| m + 1)
    } else {
        0
    };
    let mut order: Vec<usize> = (0..table.rows.len()).collect();
    order.shuffle(&mut ChaCha20Rng::seed_from_u64(seed));
    let cut = order.len() * 4 / 5;
    let norm = |i: &usize| normalize_row(&table.rows[*i], &bounds, c).0;
    let lab = |i: &usize| labels.get(*i).copied().unwrap_or(0);
    Ok(Experiment {
        name: name.to_string(),
        task,
        k: k.unwrap_or(default_k)
            .clamp(1, table.features.len() - usize::from(task == Task::Regress)),
        train: order[..cut].iter().map(norm).collect(),
        test: order[cut..].iter().map(norm).collect(),
        train_y: if labels.is_empty() {
            Vec::new()
        } else {
            order[..cut].iter().map(lab).collect()
        },
        test_y: if labels.is_empty() {
            Vec::new()
        } else {
            order[cut..].iter().map(lab).collect()
        },
        classes,
        bounds,
        c,
    })
}

/// The study's pooled share of the training rows, projected onto `axes` (M x k,
/// label axis added for regression) when given, and its block shape.
fn pooled_share(
    e: &Experiment,
    fixed: &FixedPoint,
    per_class: bool,
    axes: Option<&DMatrix<f64>>,
) -> (Share, BlockShape, Option<Projection>) {
    let dim = e.bounds.len();
    let encoded: Vec<Vec<i64>> = e.train.iter().map(|x| fixed.encode_row(x)).collect();
    let cq = fixed.norm_bound_int();
    let projection = axes.map(|w| task_projection(e.task, w));
    let matrix_rows: Vec<Vec<i64>> = match &projection {
        Some(p) => e
            .train
            .iter()
            .map(|x| fixed.encode_row(&p.apply(x, e.c)))
            .collect(),
        None => encoded.clone(),
    };
    let classes = e.classes;
    let rows = ClassRows {
        labels: &e.train_y,
        classes,
        per_class_matrix: per_class,
        count_scale: cq,
    };
    let share = Share::from_split_rows(&matrix_rows, &encoded, dim, (classes > 0).then_some(&rows));
    let k = projection.as_ref().map_or(dim, Projection::rank);
    let shape = BlockShape::new(dim, classes, per_class, cq).projected(k);
    (share, shape, projection)
}

/// C chosen as the q-quantile of the training rows' norms from a central row-norm
/// histogram release with `req` (the split-off share of the budget); `wide` is the
/// experiment loaded without a row-norm clip.
fn dp_row_norm(
    wide: &Experiment,
    q: f64,
    req: &PrivacyRequest,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<f64> {
    let m = wide.bounds.len();
    // The rows are normalized already: the bins read them through identity bounds.
    let bins = NormBins::standard(
        (0..m).map(|i| format!("x{i}")).collect(),
        vec![(-1.0, 1.0); m],
    );
    let b = bins.edges.len();
    let hot: Vec<Vec<f64>> = wide.train.iter().map(|r| bins.one_hot(r)).collect();
    let fixed = FixedPoint {
        frac_bits: DEFAULT_FRAC_BITS,
        row_norm_bound: 1.0,
    };
    let (share, _) = Share::from_raw_rows(&hot, &vec![(-1.0, 1.0); b], &fixed, None, None);
    let shape = BlockShape::new(b, 0, false, fixed.norm_bound_int());
    let (opened, plan) = release(&share, &shape, None, req, &fixed, rng);
    Ok(bins.quantile(&opened.bin_counts(&bins, &plan, &fixed), q))
}

/// One release of the study with fresh noise, and the plan the noise followed.
fn release(
    pooled: &Share,
    shape: &BlockShape,
    projection: Option<&Projection>,
    req: &PrivacyRequest,
    fixed: &FixedPoint,
    rng: &mut ChaCha20Rng,
) -> (Opened, NoisePlan) {
    let plan = plan_noise_blocks(
        req,
        shape.matrix_dim,
        shape.dim,
        fixed.norm_bound_int(),
        pooled.n,
        shape.classes > 0,
    );
    let mut matrix_noise = Vec::new();
    for _ in 0..shape.matrix_blocks {
        matrix_noise.extend(plan.matrix.sample_upper(shape.matrix_dim, rng));
    }
    let secrets = ReleaseSecrets {
        mask: Vec::new(),
        matrix_noise,
        vector_noise: plan
            .vector
            .as_ref()
            .map(|v| v.sample_vector(shape.vector_len(), rng))
            .unwrap_or_default(),
    };
    let opened = central_release(
        pooled,
        shape,
        Centering::DpMean,
        projection,
        &secrets,
        fixed.frac_bits,
    );
    (opened, plan)
}

/// The two requests of a study split in two rounds of equal privacy: half the zCDP
/// rho each (Gaussian), half the epsilon each (pure mechanisms). They compose to
/// exactly `req`.
fn halves(req: &PrivacyRequest) -> anyhow::Result<PrivacyRequest> {
    Ok(split_request(req, 0.5)?.0)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
enum Method {
    #[serde(rename = "real")]
    Real,
    #[serde(rename = "pca-gauss")]
    PcaGauss,
    #[serde(rename = "pca-gauss-2")]
    PcaGauss2,
    #[serde(rename = "full-gauss")]
    FullGauss,
    #[serde(rename = "random-proj")]
    RandomProj,
    #[serde(rename = "pca-gauss-2k")]
    PcaGauss2K,
    #[serde(rename = "pub-pca")]
    PubPca,
}

impl Method {
    /// Every method that synthesizes rows, in table order.
    const SYNTHESIZED: [Method; 6] = [
        Method::PcaGauss,
        Method::PcaGauss2,
        Method::PcaGauss2K,
        Method::PubPca,
        Method::FullGauss,
        Method::RandomProj,
    ];

    fn name(&self) -> &'static str {
        match self {
            Self::Real => "real",
            Self::PcaGauss => "pca-gauss",
            Self::PcaGauss2 => "pca-gauss-2",
            Self::FullGauss => "full-gauss",
            Self::RandomProj => "random-proj",
            Self::PcaGauss2K => "pca-gauss-2k",
            Self::PubPca => "pub-pca",
        }
    }
}

/// k random orthonormal columns in `m` dimensions.
fn random_axes(m: usize, k: usize, rng: &mut ChaCha20Rng) -> DMatrix<f64> {
    let g = DMatrix::from_fn(m, k, |_, _| rng.sample::<f64, _>(StandardNormal));
    g.qr().q()
}

/// Synthetic training rows (normalized, preprocessed) and their class indices.
fn synthesize(
    e: &Experiment,
    opened: &Opened,
    n_rows: u64,
    axes: &DMatrix<f64>,
    fit: CovarianceFit,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<(Vec<Vec<f64>>, Vec<usize>)> {
    let count = e.train.len();
    let finish =
        |x: &DVector<f64>| normalize_row(&to_original_units(x, &e.bounds, e.c), &e.bounds, e.c).0;
    let model = Synthesizer::new(e.task, opened, &opened.scatter, n_rows, axes, fit)?;
    let (rows, classes): (Vec<_>, Vec<Option<usize>>) = (0..count)
        .map(|_| {
            let (c, x) = model.sample(rng);
            (finish(&x), c)
        })
        .unzip();
    // Class indices in a classification, none otherwise.
    Ok((rows, classes.into_iter().flatten().collect()))
}

fn to_array(rows: &[Vec<f64>], cols: usize) -> Array2<f64> {
    Array2::from_shape_fn((rows.len(), cols), |(i, j)| rows[i][j])
}

/// Trains on `rows` (with `ys` for classification) and scores on the real test split.
fn score(
    e: &Experiment,
    rows: &[Vec<f64>],
    ys: &[usize],
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<f64> {
    let m = e.bounds.len();
    match e.task {
        Task::Classify => {
            // The learner sees rows in the unit ball whatever C is, so one set of
            // hyperparameters serves every row-norm bound.
            let x = to_array(rows, m) / e.c;
            let model = MultiLogisticRegression::default()
                .max_iterations(200)
                .fit(&Dataset::new(x, Array1::from(ys.to_vec())))?;
            let pred = model.predict(&(to_array(&e.test, m) / e.c));
            let hits = pred.iter().zip(&e.test_y).filter(|(a, b)| a == b).count();
            Ok(hits as f64 / e.test.len() as f64)
        }
        Task::Regress => {
            let f = m - 1;
            let x = Array2::from_shape_fn((rows.len(), f), |(i, j)| rows[i][j]);
            let y = Array1::from_iter(rows.iter().map(|r| r[f]));
            let model = ElasticNet::ridge().penalty(1e-4).fit(&Dataset::new(x, y))?;
            let tx = Array2::from_shape_fn((e.test.len(), f), |(i, j)| e.test[i][j]);
            let pred: Array1<f64> = model.predict(&tx);
            // Back to price units through the public bounds of the label column.
            let (lo, hi) = e.bounds[f];
            let unit = |u: f64| lo + (u + 1.0) * (hi - lo) / 2.0;
            let se: f64 = pred
                .iter()
                .zip(&e.test)
                .map(|(p, r)| (unit(*p) - unit(r[f])).powi(2))
                .sum();
            Ok((se / e.test.len() as f64).sqrt())
        }
        Task::Cluster => {
            let x = to_array(rows, m);
            let model = KMeans::params_with_rng(10, rng.clone())
                .n_runs(3)
                .max_n_iterations(100)
                .tolerance(1e-4)
                .fit(&DatasetBase::from(x))?;
            let tx = to_array(&e.test, m);
            let assigned: Array1<usize> = model.predict(&tx);
            Ok(Dataset::new(tx, assigned).silhouette_score()?)
        }
    }
}

#[derive(Clone, Debug, Serialize)]
struct Cell {
    experiment: String,
    metric: &'static str,
    method: Method,
    epsilon: Option<f64>,
    k: usize,
    reps: usize,
    mean: f64,
    sd: f64,
    /// The repetitions' scores in seed order, so two methods can be paired.
    values: Vec<f64>,
}

fn summarize(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

fn metric(task: Task) -> &'static str {
    match task {
        Task::Cluster => "silhouette",
        Task::Classify => "accuracy",
        Task::Regress => "RMSE",
    }
}

/// Features of the PCA (the study's columns, the label excluded in regression).
fn pca_dim(e: &Experiment) -> usize {
    e.bounds.len() - usize::from(e.task == Task::Regress)
}

/// Top-k components of the features block of an opened release.
fn components(opened: &Opened, n: u64, m: usize, k: usize) -> DMatrix<f64> {
    let cov = &opened.scatter / n as f64;
    pca(&cov.view((0, 0), (m, m)).into_owned(), k).components
}

/// Top-k components inside the span of `w` of a projected release.
fn components_in_span(opened: &Opened, n: u64, w: &DMatrix<f64>, k: usize) -> DMatrix<f64> {
    let m = w.nrows();
    let cov = (&opened.scatter / n as f64)
        .view((0, 0), (m, m))
        .into_owned();
    pca_in_span(&cov, Some(w), k).components
}

/// How the methods read the covariance from a release.
#[derive(Clone, Copy, Debug)]
struct FitChoice {
    /// The reading for every method but full-gauss.
    kind: FitKind,
    /// Denoise full-gauss too (it is the paper's MODIPS comparison without).
    denoise_full_gauss: bool,
}

impl FitChoice {
    /// The reading of `method`'s release, whose scatter carries `noise`.
    fn of(&self, method: Method, noise: Option<NoiseLevel>) -> CovarianceFit {
        if method == Method::FullGauss && !self.denoise_full_gauss {
            return CovarianceFit::Paper;
        }
        self.kind.with(noise)
    }
}

/// One repetition of a method: its release(s), axes and synthetic rows, scored.
#[allow(clippy::too_many_arguments)]
fn one_rep(
    e: &Experiment,
    method: Method,
    k: usize,
    req: &PrivacyRequest,
    fixed: &FixedPoint,
    per_class: bool,
    plain: &(Share, BlockShape),
    fit: FitChoice,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<f64> {
    let m = pca_dim(e);
    let (pooled, shape) = plain;
    let n = pooled.n;
    // The noise level of a release's scatter block, from its plan.
    let level =
        |plan: &NoisePlan, shape: &BlockShape| NoiseLevel::of(plan, fixed, shape.matrix_dim);
    let (opened, axes, n, noise) = match method {
        Method::PcaGauss => {
            let (opened, plan) = release(pooled, shape, None, req, fixed, rng);
            let w = components(&opened, pooled.n, m, k);
            (opened, w, n, level(&plan, shape))
        }
        Method::FullGauss => {
            let (opened, plan) = release(pooled, shape, None, req, fixed, rng);
            (opened, DMatrix::identity(m, m), n, level(&plan, shape))
        }
        Method::PubPca => {
            // The paper's Pub-PCA: a disjoint public part of the training rows gives
            // the axes; the study runs on the rest, projected, with the whole budget.
            let cut = (e.train.len() as f64 * PUBLIC_SHARE).round() as usize;
            let public: Vec<Vec<f64>> = e.train[..cut].iter().map(|r| r[..m].to_vec()).collect();
            let w = pca(&(centered_scatter(&public) / cut as f64), k).components;
            let private = Experiment {
                train: e.train[cut..].to_vec(),
                train_y: e
                    .train_y
                    .get(cut..)
                    .map(<[usize]>::to_vec)
                    .unwrap_or_default(),
                ..e.clone()
            };
            let (share, pshape, projection) = pooled_share(&private, fixed, per_class, Some(&w));
            let (opened, plan) = release(&share, &pshape, projection.as_ref(), req, fixed, rng);
            let axes = components_in_span(&opened, share.n, &w, k);
            (opened, axes, share.n, level(&plan, &pshape))
        }
        Method::PcaGauss2 => {
            // Round 1: a plain study for the axes; round 2: R on them.
            let half = halves(req)?;
            let (first, _) = release(pooled, shape, None, &half, fixed, rng);
            let w = components(&first, pooled.n, m, k);
            let (share, pshape, projection) = pooled_share(e, fixed, per_class, Some(&w));
            let (opened, plan) = release(&share, &pshape, projection.as_ref(), &half, fixed, rng);
            let axes = components_in_span(&opened, share.n, &w, k);
            (opened, axes, n, level(&plan, &pshape))
        }
        Method::RandomProj => {
            // Random axes are public: the whole budget goes to R on them. The Blocki
            // adaptation releases only projected data, so the class deviations from
            // the global mean are kept in the random span too.
            let w = random_axes(m, k, rng);
            let (share, pshape, projection) = pooled_share(e, fixed, per_class, Some(&w));
            let (mut opened, plan) = release(&share, &pshape, projection.as_ref(), req, fixed, rng);
            if let (Some(stats), Some(mu)) = (opened.classes.as_mut(), opened.mean.as_ref()) {
                let p = &w * w.transpose();
                for mc in &mut stats.means {
                    *mc = mu + &p * (&*mc - mu);
                }
            }
            (opened, w, n, level(&plan, &pshape))
        }
        Method::PcaGauss2K => {
            // Round 1 as pca-gauss-2; round 2 releases only k-dimensional sums and
            // scatters of W^T x; the global mean's part outside the span comes from
            // round 1.
            let half = halves(req)?;
            let (first, _) = release(pooled, shape, None, &half, fixed, rng);
            let w = components(&first, pooled.n, m, k);
            let mu1 = first.mean.clone().context("no mean")?;
            let projection = task_projection(e.task, &w);
            let kk = projection.rank();
            let rows: Vec<Vec<i64>> = e
                .train
                .iter()
                .map(|x| fixed.encode_row(&projection.apply(x, e.c)))
                .collect();
            let cls = ClassRows {
                labels: &e.train_y,
                classes: e.classes,
                per_class_matrix: per_class,
                count_scale: fixed.norm_bound_int(),
            };
            let share = Share::from_split_rows(&rows, &rows, kk, (e.classes > 0).then_some(&cls));
            let kshape = BlockShape::new(kk, e.classes, per_class, fixed.norm_bound_int());
            let (mut opened, plan) = release(&share, &kshape, None, &half, fixed, rng);
            let wk = DMatrix::from_fn(mu1.len(), kk, |i, j| projection.axes[j][i]);
            let outside = &mu1 - &wk * (wk.transpose() * &mu1);
            let lift_m = |v: &DVector<f64>| &wk * v + &outside;
            let lift_s = |s: &DMatrix<f64>| &wk * s * wk.transpose();
            opened.scatter = &wk * &opened.scatter * wk.transpose();
            opened.mean = opened.mean.as_ref().map(lift_m);
            if let Some(st) = opened.classes.as_mut() {
                st.means = st.means.iter().map(lift_m).collect();
                st.scatters = st.scatters.iter().map(lift_s).collect();
            }
            let axes = components_in_span(&opened, share.n, &w, k);
            (opened, axes, n, level(&plan, &kshape))
        }
        Method::Real => bail!("the real baseline is not synthesized"),
    };
    let (rows, ys) = synthesize(e, &opened, n, &axes, fit.of(method, noise), rng)?;
    score(e, &rows, &ys, rng)
}

#[allow(clippy::too_many_arguments)]
fn run_method(
    e: &Experiment,
    method: Method,
    k: usize,
    req: &PrivacyRequest,
    fixed: &FixedPoint,
    per_class: bool,
    plain: &(Share, BlockShape),
    fit: FitChoice,
    reps: usize,
    base_seed: u64,
) -> anyhow::Result<Cell> {
    // Repetition r of every method starts from the same seed, so the methods that
    // read one release of the same study (pca-gauss, full-gauss) read the same noise
    // and differ only in what they do with it.
    let values = (0..reps)
        .map(|r| {
            let mut rng = ChaCha20Rng::seed_from_u64(base_seed.wrapping_add(r as u64));
            one_rep(e, method, k, req, fixed, per_class, plain, fit, &mut rng)
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let (mean, sd) = summarize(&values);
    Ok(Cell {
        experiment: e.name.clone(),
        metric: metric(e.task),
        method,
        epsilon: Some(req.epsilon),
        k: if method == Method::FullGauss {
            pca_dim(e)
        } else {
            k
        },
        reps,
        mean,
        sd,
        values,
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.score_study {
        return score_study(&args, dir);
    }
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
    let fit = FitChoice {
        kind: FitKind::parse(&args.covariance)?,
        denoise_full_gauss: args.denoise_full_gauss,
    };
    let mut cells = Vec::new();
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    for (i, name) in args.experiments.iter().enumerate() {
        let e = load(name, args.k.get(i).copied(), args.seed, args.row_norm_bound)?;
        let fixed = FixedPoint {
            frac_bits: DEFAULT_FRAC_BITS,
            row_norm_bound: e.c,
        };
        let (pooled, shape, _) = pooled_share(&e, &fixed, per_class, None);
        let delta = (pooled.n as f64).powf(-1.1);
        let plain = (pooled, shape);
        eprintln!(
            "{name}: {} train / {} test rows, M = {}, k = {}, {} classes, delta = 1/N^1.1",
            e.train.len(),
            e.test.len(),
            e.bounds.len(),
            e.k,
            e.classes
        );
        // Real rows: once for the deterministic learners, reps times for k-means.
        let real_reps = if e.task == Task::Cluster {
            args.reps
        } else {
            1
        };
        let real: Vec<f64> = (0..real_reps)
            .map(|_| score(&e, &e.train, &e.train_y, &mut rng))
            .collect::<anyhow::Result<_>>()?;
        let (mean, sd) = summarize(&real);
        cells.push(Cell {
            experiment: e.name.clone(),
            metric: metric(e.task),
            method: Method::Real,
            epsilon: None,
            k: e.bounds.len(),
            reps: real_reps,
            mean,
            sd,
            values: real,
        });
        // The unclipped rows the row-norm histogram counts, loaded once.
        let wide = match args.row_norm_quantile {
            Some(_) => Some(load(name, Some(e.k), args.seed, f64::INFINITY)?),
            None => None,
        };
        for &eps in &args.epsilons {
            let req = PrivacyRequest::new(mechanism, Centering::DpMean, eps, delta)?;
            // With a DP row-norm quantile, the experiment is reloaded with its C and
            // the methods get the rest of the budget.
            let chosen = match (args.row_norm_quantile, &wide) {
                (Some(q), Some(wide)) => {
                    let (h, main) = split_request(&req, args.quantile_budget_share)?;
                    let c = dp_row_norm(wide, q, &h, &mut rng)?;
                    let e = wide.clipped(c);
                    let fixed = FixedPoint {
                        frac_bits: DEFAULT_FRAC_BITS,
                        row_norm_bound: c,
                    };
                    let (pooled, shape, _) = pooled_share(&e, &fixed, per_class, None);
                    eprintln!("  eps {eps}: C = {c:.4} (the {q} quantile of the norms)");
                    Some((e, fixed, (pooled, shape), main))
                }
                _ => None,
            };
            let (e, fixed, plain, req) = match &chosen {
                Some((e, fixed, plain, main)) => (e, fixed, plain, main),
                None => (&e, &fixed, &plain, &req),
            };
            let base_seed: u64 = rng.gen();
            for method in Method::SYNTHESIZED
                .into_iter()
                .filter(|m| args.methods.is_empty() || args.methods.iter().any(|a| a == m.name()))
            {
                let cell = run_method(
                    e, method, e.k, req, fixed, per_class, plain, fit, args.reps, base_seed,
                )?;
                eprintln!(
                    "  eps {eps}: {} {:.4} +- {:.4}",
                    method.name(),
                    cell.mean,
                    cell.sd
                );
                cells.push(cell);
            }
        }
        let features = pca_dim(&e);
        for &k in args.ks.iter().filter(|&&k| k >= 1 && k <= features) {
            let req = PrivacyRequest::new(mechanism, Centering::DpMean, args.sweep_epsilon, delta)?;
            let base_seed: u64 = rng.gen();
            for method in [
                Method::PcaGauss,
                Method::PcaGauss2,
                Method::PcaGauss2K,
                Method::PubPca,
            ]
            .into_iter()
            .filter(|m| args.methods.is_empty() || args.methods.iter().any(|a| a == m.name()))
            {
                let cell = run_method(
                    &e, method, k, &req, &fixed, per_class, &plain, fit, args.reps, base_seed,
                )?;
                eprintln!(
                    "  k {k}: {} {:.4} +- {:.4}",
                    method.name(),
                    cell.mean,
                    cell.sd
                );
                cells.push(Cell {
                    experiment: format!("{} (k sweep)", e.name),
                    ..cell
                });
            }
        }
    }
    print_tables(&cells, &args);
    print_paired(&cells);
    let json = args
        .json
        .unwrap_or_else(|| workspace_root().join("target/bench-synthetic/synthetic-bench.json"));
    if let Some(dir) = json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&json, serde_json::to_string_pretty(&cells)? + "\n")?;
    println!("JSON in {}", json.display());
    Ok(())
}

/// Each reduced method against full-gauss, repetition by repetition. Repetition r of
/// every method starts from the same seed, so the spread between repetitions, which
/// is larger than the gap between the methods, cancels out of the difference; what is
/// left says whether a gap is more than noise.
fn print_paired(cells: &[Cell]) {
    let full: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.method == Method::FullGauss && !c.experiment.ends_with("(k sweep)"))
        .collect();
    if full.is_empty() {
        return;
    }
    println!(
        "\nPaired against full-gauss: the difference per repetition, signed so that \
         positive means better than full-gauss; mean +- standard error; repetitions ahead"
    );
    println!("| experiment | epsilon | method | difference | ahead |");
    println!("|---|---|---|---|---|");
    for f in full {
        // A lower RMSE is better.
        let sign = if f.metric == "RMSE" { -1.0 } else { 1.0 };
        for c in cells.iter().filter(|c| {
            c.experiment == f.experiment
                && c.epsilon == f.epsilon
                && !matches!(c.method, Method::Real | Method::FullGauss)
                && c.values.len() == f.values.len()
        }) {
            let d: Vec<f64> = c
                .values
                .iter()
                .zip(&f.values)
                .map(|(a, b)| sign * (a - b))
                .collect();
            let (mean, sd) = summarize(&d);
            let se = sd / (d.len() as f64).sqrt();
            let ahead = d.iter().filter(|&&x| x > 0.0).count();
            println!(
                "| {} | {} | {} | {mean:+.4} +- {se:.4} | {ahead}/{} |",
                f.experiment,
                f.epsilon.map_or("-".to_string(), |e| e.to_string()),
                c.method.name(),
                d.len()
            );
        }
    }
}

fn print_tables(cells: &[Cell], args: &Args) {
    println!(
        "mechanism {}, {} class covariance, {} covariance fit{}, {} repetitions; mean +- sd; in brackets the ratio to real",
        args.mechanism,
        args.class_covariance,
        args.covariance,
        if args.denoise_full_gauss { " (full-gauss too)" } else { "" },
        args.reps
    );
    let mut experiments: Vec<&str> = Vec::new();
    for c in cells {
        if !experiments.contains(&c.experiment.as_str()) {
            experiments.push(&c.experiment);
        }
    }
    for exp in experiments {
        let rows: Vec<&Cell> = cells.iter().filter(|c| c.experiment == exp).collect();
        let Some(first) = rows.first() else { continue };
        let real = cells
            .iter()
            .find(|c| c.method == Method::Real && exp.starts_with(c.experiment.as_str()))
            .map(|c| c.mean);
        println!("\n{exp} ({})", first.metric);
        println!(
            "| method | epsilon | k | {} | ratio to real |",
            first.metric
        );
        println!("|---|---|---|---|---|");
        for c in rows {
            let eps = c.epsilon.map_or("-".to_string(), |e| e.to_string());
            let ratio = real.map_or("-".to_string(), |r| format!("{:.2}", c.mean / r));
            println!(
                "| {} | {eps} | {} | {:.4} +- {:.4} | {ratio} |",
                c.method.name(),
                c.k,
                c.mean,
                c.sd
            );
        }
    }
}
