//! Models trained on synthetic or real rows, scored on real held-out rows.

use std::path::Path;

use crate::experiment::*;
use crate::Args;
use anyhow::{bail, Context};
use dpca_common::data::{normalize_row, read_csv, Table};
use dpca_common::synth::Task;
use linfa::metrics::SilhouetteScore;
use linfa::prelude::*;
use linfa_clustering::KMeans;
use linfa_elasticnet::ElasticNet;
use linfa_logistic::MultiLogisticRegression;
use ndarray::{Array1, Array2};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// Score mode: real-trained against synthetic-trained accuracy of a finished study.
pub(crate) fn score_study(args: &Args, dir: &Path) -> anyhow::Result<()> {
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

pub(crate) fn to_array(rows: &[Vec<f64>], cols: usize) -> Array2<f64> {
    Array2::from_shape_fn((rows.len(), cols), |(i, j)| rows[i][j])
}

/// Trains on `rows` (with `ys` for classification) and scores on the real test split.
pub(crate) fn score(
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

pub(crate) fn metric(task: Task) -> &'static str {
    match task {
        Task::Cluster => "silhouette",
        Task::Classify => "accuracy",
        Task::Regress => "RMSE",
    }
}
