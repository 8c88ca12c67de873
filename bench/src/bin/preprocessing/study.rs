//! The study on the chosen preprocessing, released centrally, and what it is
//! worth: the variance its components capture against the exact ones on the
//! same preprocessing, and the score of a model trained on its synthetic rows.

use anyhow::Context;
use dpca_common::dp::{plan_noise_blocks, Centering};
use dpca_common::encoding::FixedPoint;
use dpca_common::linalg::{captured_variance, centered_scatter, pca};
use dpca_common::protocol::{central_release, ClassRows, ReleaseSecrets, Share};
use dpca_common::study::{BlockShape, DEFAULT_FRAC_BITS};
use dpca_common::synth::{to_original_units, FitKind, NoiseLevel, Synthesizer, Task};
use linfa::prelude::*;
use linfa_elasticnet::ElasticNet;
use linfa_logistic::MultiLogisticRegression;
use nalgebra::DMatrix;
use ndarray::{Array1, Array2};
use rand_chacha::ChaCha20Rng;

use crate::prep::{normalized, Chosen};
use crate::tables::Table;

/// What one study was worth.
pub(crate) struct Outcome {
    /// tr(V^T S V) / tr(U^T S U) on the exact scatter S of the preprocessed rows.
    pub(crate) captured: f64,
    /// The synthetic-trained model's accuracy (classification) or RMSE
    /// (regression) on the real held-out rows.
    pub(crate) score: f64,
}

/// The study of `table`'s training rows under `chosen`, released once centrally.
pub(crate) fn run_study(
    table: &Table,
    chosen: &Chosen,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<Outcome> {
    let fixed = FixedPoint {
        frac_bits: DEFAULT_FRAC_BITS,
        row_norm_bound: chosen.c,
    };
    let rows = normalized(&table.train, &chosen.bounds, chosen.c);
    let (dim, classes, cq) = (table.dim(), table.classes, fixed.norm_bound_int());
    let encoded: Vec<Vec<i64>> = rows.iter().map(|x| fixed.encode_row(x)).collect();
    let class_rows = ClassRows {
        labels: &table.train_y,
        classes,
        per_class_matrix: false,
        count_scale: cq,
    };
    let share = Share::from_split_rows(
        &encoded,
        &encoded,
        dim,
        (classes > 0).then_some(&class_rows),
    );
    let shape = BlockShape::new(dim, classes, false, cq);
    let plan = plan_noise_blocks(&chosen.study, dim, dim, cq, share.n, classes > 0);
    let secrets = ReleaseSecrets {
        mask: Vec::new(),
        matrix_noise: plan.matrix.sample_upper(dim, rng),
        vector_noise: plan
            .vector
            .as_ref()
            .map(|v| v.sample_vector(shape.vector_len(), rng))
            .unwrap_or_default(),
    };
    let opened = central_release(
        &share,
        &shape,
        Centering::DpMean,
        None,
        &secrets,
        fixed.frac_bits,
    );
    let p = table.pca_dim();
    let block = |s: &DMatrix<f64>| s.view((0, 0), (p, p)).into_owned();
    let components = pca(&block(&(&opened.scatter / share.n as f64)), table.k).components;
    let captured = captured_variance(&block(&centered_scatter(&rows)), &components);
    let fit = FitKind::Denoised.with(NoiseLevel::of(&plan, &fixed, dim));
    let model = Synthesizer::new(
        table.task,
        &opened,
        &opened.scatter,
        share.n,
        &components,
        fit,
    )?;
    let (synthetic, ys): (Vec<Vec<f64>>, Vec<Option<usize>>) = (0..table.train.len())
        .map(|_| {
            let (class, x) = model.sample(rng);
            let raw = to_original_units(&x, &chosen.bounds, chosen.c);
            let kept = raw
                .iter()
                .zip(&chosen.ranges)
                .map(|(&v, &(lo, hi))| v.clamp(lo.min(hi), hi.max(lo)))
                .collect();
            (kept, class)
        })
        .unzip();
    let ys: Vec<usize> = ys.into_iter().flatten().collect();
    Ok(Outcome {
        captured,
        score: score(table, &synthetic, &ys)?,
    })
}

/// Each feature's center and half-width in the table's public bounds: the one
/// space every model is trained in, whatever preprocessing made its rows (an
/// affine map, not a clip: values beyond the bounds stay beyond +-1). The real
/// rows' own spread would not do: a column almost constant in them (a border
/// pixel) would magnify any synthetic value there a hundredfold.
/// Rows are further scaled by 1 / sqrt(M) into about the unit ball, where
/// the learners' line searches hold with their default steps.
fn standardizer(table: &Table, cols: usize) -> Vec<(f64, f64)> {
    let ball = (cols.max(1) as f64).sqrt();
    table.public_bounds[..cols]
        .iter()
        .map(|&(lo, hi)| {
            let half = if hi > lo { (hi - lo) / 2.0 } else { 1.0 };
            ((lo + hi) / 2.0, half * ball)
        })
        .collect()
}

/// `rows`' first `cols` columns, standardized by `by`.
fn standardized(rows: &[Vec<f64>], by: &[(f64, f64)]) -> Array2<f64> {
    Array2::from_shape_fn((rows.len(), by.len()), |(i, j)| {
        (rows[i][j] - by[j].0) / by[j].1
    })
}

/// A model trained on `rows` (with `ys` in a classification), in input units,
/// scored on the real held-out rows: accuracy, or the label's RMSE.
pub(crate) fn score(table: &Table, rows: &[Vec<f64>], ys: &[usize]) -> anyhow::Result<f64> {
    let features = table.pca_dim();
    let by = standardizer(table, features);
    let (x, tx) = (standardized(rows, &by), standardized(&table.test, &by));
    match table.task {
        Task::Classify => {
            let model = MultiLogisticRegression::default()
                .max_iterations(200)
                .fit(&Dataset::new(x, Array1::from(ys.to_vec())))
                .context("logistic regression")?;
            let pred = model.predict(&tx);
            let hits = pred
                .iter()
                .zip(&table.test_y)
                .filter(|(a, b)| a == b)
                .count();
            Ok(hits as f64 / table.test.len() as f64)
        }
        Task::Regress | Task::Cluster => {
            let y = Array1::from_iter(rows.iter().map(|r| r[features]));
            let model = ElasticNet::ridge()
                .penalty(1e-4)
                .fit(&Dataset::new(x, y))
                .context("ridge regression")?;
            let pred: Array1<f64> = model.predict(&tx);
            let se: f64 = pred
                .iter()
                .zip(&table.test)
                .map(|(p, r)| (p - r[features]).powi(2))
                .sum();
            Ok((se / table.test.len() as f64).sqrt())
        }
    }
}
