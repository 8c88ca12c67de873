//! A data set as a study sees it: its rows split, bounds, C, and the central
//! release that stands for the distributed one.

use dpca_bench::workspace_root;

use anyhow::{bail, Context};
use dpca_common::data::{clip_to_norm, normalize_row, read_bounds, read_csv, Table};
use dpca_common::dp::{plan_noise_blocks, split_request, Centering, NoisePlan, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::protocol::{central_release, ClassRows, Opened, ReleaseSecrets, Share};
use dpca_common::study::{BlockShape, NormBins, Projection, DEFAULT_FRAC_BITS};
use dpca_common::synth::{task_projection, Task};
use nalgebra::DMatrix;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// One experiment: a data set, its public bounds and the task.
#[derive(Clone)]
pub(crate) struct Experiment {
    pub(crate) name: String,
    pub(crate) task: Task,
    pub(crate) k: usize,
    /// Training rows, normalized (label column last for regression).
    pub(crate) train: Vec<Vec<f64>>,
    /// Test rows, normalized the same way.
    pub(crate) test: Vec<Vec<f64>>,
    /// Class index per row (classification).
    pub(crate) train_y: Vec<usize>,
    pub(crate) test_y: Vec<usize>,
    pub(crate) classes: usize,
    /// Bounds of the study's columns (label last for regression).
    pub(crate) bounds: Vec<(f64, f64)>,
    /// Row-norm bound C of the normalized rows.
    pub(crate) c: f64,
}

impl Experiment {
    /// The same rows clipped to row norm `c` (from an experiment loaded unclipped).
    pub(crate) fn clipped(&self, c: f64) -> Experiment {
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
pub(crate) const PUBLIC_SHARE: f64 = 0.1;

pub(crate) fn load(name: &str, k: Option<usize>, seed: u64, c: f64) -> anyhow::Result<Experiment> {
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
pub(crate) fn pooled_share(
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
pub(crate) fn dp_row_norm(
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
pub(crate) fn release(
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
pub(crate) fn halves(req: &PrivacyRequest) -> anyhow::Result<PrivacyRequest> {
    Ok(split_request(req, 0.5)?.0)
}
