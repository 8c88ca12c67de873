//! `user clean`: null-space cleaning of feature vectors before they are released
//! to a predictor (`dpca_common::cleaning`), from CSV files.
//!
//! Features are centered by the training rows' means (and, with `--bounds`, first
//! mapped to [-1, 1] as a study maps them, so a study's components.csv applies as
//! the predictor). Cleaning then moves a vector towards the training mean in the
//! directions the desired predictor sees least. The confidential predictor is
//! fitted on the training rows by least squares, with an intercept.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use dpca_common::cleaning::{
    complete_privacy, least_squares, Cleaned, Cleaner, CleaningError, NULL_TOL,
};
use dpca_common::data::{read_bounds, read_csv, Table};
use nalgebra::{DMatrix, DVector, RowDVector};

/// What `user clean` is given.
#[derive(Clone, Debug)]
pub struct CleanOptions {
    /// Training rows: features, the confidential label columns and, without a
    /// predictor file, the desired ones.
    pub train: PathBuf,
    /// Desired label columns (fit A_d on them when no predictor file is given; left
    /// out of the features either way).
    pub desired: Vec<String>,
    /// Confidential label columns.
    pub confidential: Vec<String>,
    /// The desired predictor's first linear stage: CSV `feature,OUT1,...` (a
    /// study's components.csv has this shape).
    pub predictor: Option<PathBuf>,
    /// Public bounds: map features to [-1, 1] first (as a study does).
    pub bounds: Option<PathBuf>,
    /// The vectors to clean (the training file's feature columns, labels optional).
    pub vectors: PathBuf,
    /// e_utility per vector; `None` is the exact null-space variant.
    pub epsilon: Option<f64>,
    /// A vector whose every component costs less than epsilon loses them all
    /// (its e_utility is then below epsilon) instead of stopping the run.
    pub at_most: bool,
    /// Output folder.
    pub out: PathBuf,
}

/// Means over the cleaned vectors.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CleanSummary {
    /// Vectors cleaned.
    pub vectors: usize,
    /// Mean |A_d^T (x - x~)|^2.
    pub e_utility: f64,
    /// Mean |A_c^T (x - x~)|^2.
    pub e_privacy: f64,
    /// Share of vectors whose confidential labels are predicted worse from x~
    /// than from the mean vector (when the vectors file carries those labels).
    pub complete_privacy: Option<f64>,
}

fn open_table(path: &Path) -> anyhow::Result<Table> {
    let name = path.display().to_string();
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {name}"))?;
    Ok(read_csv(f, &name, None)?)
}

/// The columns `names` of `t`, as a matrix; each must exist.
fn columns(t: &Table, names: &[String], file: &Path) -> anyhow::Result<DMatrix<f64>> {
    let idx = names
        .iter()
        .map(|n| {
            t.features
                .iter()
                .position(|f| f == n)
                .with_context(|| format!("{}: no column `{n}`", file.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(DMatrix::from_fn(t.rows.len(), idx.len(), |i, j| {
        t.rows[i][idx[j]]
    }))
}

/// Reads a predictor file `feature,OUT1,...`: one row per feature, every feature
/// exactly once, in any order.
fn read_predictor(path: &Path, features: &[String]) -> anyhow::Result<DMatrix<f64>> {
    let name = path.display().to_string();
    let mut rdr = csv::Reader::from_path(path).with_context(|| format!("cannot open {name}"))?;
    let outputs = rdr.headers()?.len().saturating_sub(1);
    if outputs == 0 {
        bail!("{name}: no output columns after `feature`");
    }
    let mut a = DMatrix::from_element(features.len(), outputs, f64::NAN);
    let mut seen = vec![false; features.len()];
    for (line, rec) in rdr.records().enumerate() {
        let rec = rec.with_context(|| format!("{name}: line {}", line + 2))?;
        let f = rec.get(0).unwrap_or_default().trim();
        let i = features
            .iter()
            .position(|x| x == f)
            .with_context(|| format!("{name}: line {}: `{f}` is not a feature", line + 2))?;
        if std::mem::replace(&mut seen[i], true) {
            bail!("{name}: feature `{f}` appears twice");
        }
        for j in 0..outputs {
            let cell = rec.get(j + 1).unwrap_or_default().trim();
            a[(i, j)] = cell
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .with_context(|| format!("{name}: line {}: `{cell}` is not a number", line + 2))?;
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        bail!("{name}: no row for feature `{}`", features[i]);
    }
    Ok(a)
}

/// Maps features to [-1, 1] by the bounds (no row-norm clip: a released vector is
/// cleaned as it is).
fn normalize(x: &mut DMatrix<f64>, bounds: &[(f64, f64)]) {
    for (j, &(lo, hi)) in bounds.iter().enumerate() {
        x.column_mut(j).apply(|v| {
            *v = if hi > lo {
                2.0 * (*v - lo) / (hi - lo) - 1.0
            } else {
                0.0
            }
        });
    }
}

fn denormalize(x: &mut DMatrix<f64>, bounds: &[(f64, f64)]) {
    for (j, &(lo, hi)) in bounds.iter().enumerate() {
        x.column_mut(j).apply(|v| {
            *v = if hi > lo {
                (*v + 1.0) / 2.0 * (hi - lo) + lo
            } else {
                lo
            }
        });
    }
}

/// Cleans the vectors file, writes `OUT/cleaned.csv` (the vectors file with its
/// feature cells cleaned, in its units) and `OUT/metrics.csv`, and returns the
/// means. Every vector is cleaned before anything is written.
pub fn run(o: &CleanOptions) -> anyhow::Result<CleanSummary> {
    if o.confidential.is_empty() {
        bail!("--confidential names no column");
    }
    let fitted = fit(o)?;
    let vec_table = open_table(&o.vectors)?;
    let (cleaned, metrics) = clean_vectors(o, &fitted, &vec_table)?;
    std::fs::create_dir_all(&o.out)
        .with_context(|| format!("cannot create {}", o.out.display()))?;
    write_cleaned(
        &o.out.join("cleaned.csv"),
        &vec_table,
        &fitted.features,
        &cleaned,
    )?;
    write_metrics(&o.out.join("metrics.csv"), &metrics)?;
    let n = metrics.len().max(1) as f64;
    let cps: Vec<bool> = metrics.iter().filter_map(|m| m.3).collect();
    Ok(CleanSummary {
        vectors: metrics.len(),
        e_utility: metrics.iter().map(|m| m.1).sum::<f64>() / n,
        e_privacy: metrics.iter().map(|m| m.2).sum::<f64>() / n,
        complete_privacy: (!cps.is_empty())
            .then(|| cps.iter().filter(|&&c| c).count() as f64 / cps.len() as f64),
    })
}

/// What the training table gives: the feature columns, their bounds, the means
/// the vectors are centered with, the confidential predictor and the cleaner.
struct Fitted {
    features: Vec<String>,
    bounds: Option<Vec<(f64, f64)>>,
    mean_x: RowDVector<f64>,
    mean_c: RowDVector<f64>,
    a_c: DMatrix<f64>,
    cleaner: Cleaner,
}

/// Fits the confidential predictor (and the desired one, unless given) on the
/// training table, centered and normalized as the vectors will be.
fn fit(o: &CleanOptions) -> anyhow::Result<Fitted> {
    let train = open_table(&o.train)?;
    let labels: Vec<&String> = o.desired.iter().chain(&o.confidential).collect();
    let features: Vec<String> = train
        .features
        .iter()
        .filter(|f| !labels.contains(f))
        .cloned()
        .collect();
    if features.is_empty() {
        bail!(
            "{}: no feature columns besides the labels",
            o.train.display()
        );
    }
    let bounds = match &o.bounds {
        Some(p) => {
            let f =
                std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            Some(read_bounds(f, &features).with_context(|| p.display().to_string())?)
        }
        None => None,
    };
    let mut x_tr = columns(&train, &features, &o.train)?;
    if let Some(b) = &bounds {
        normalize(&mut x_tr, b);
    }
    let (x_tr, mean_x) = center(x_tr);
    let (yc_tr, mean_c) = center(columns(&train, &o.confidential, &o.train)?);
    let a_c = least_squares(&x_tr, &yc_tr).context("fitting the confidential predictor")?;
    let a_d = match &o.predictor {
        Some(p) => read_predictor(p, &features)?,
        None if o.desired.is_empty() => {
            bail!("give the desired predictor (--predictor) or its labels (--desired)")
        }
        None => {
            let (yd, _) = center(columns(&train, &o.desired, &o.train)?);
            least_squares(&x_tr, &yd).context("fitting the desired predictor")?
        }
    };
    let cleaner = Cleaner::new(&a_d, &a_c)?;
    Ok(Fitted {
        features,
        bounds,
        mean_x,
        mean_c,
        a_c,
        cleaner,
    })
}

/// `y` less its column means, and the means.
fn center(y: DMatrix<f64>) -> (DMatrix<f64>, RowDVector<f64>) {
    let m = y.row_mean();
    let c = DMatrix::from_fn(y.nrows(), y.ncols(), |i, j| y[(i, j)] - m[j]);
    (c, m)
}

/// Per vector: how much was removed, e_utility, e_privacy, and complete privacy
/// where the vectors file carries the confidential labels.
type VectorMetrics = (usize, f64, f64, Option<bool>);

/// Cleans every vector of `table` (in its file's units; returned in them).
fn clean_vectors(
    o: &CleanOptions,
    fitted: &Fitted,
    table: &Table,
) -> anyhow::Result<(DMatrix<f64>, Vec<VectorMetrics>)> {
    let mean_x = &fitted.mean_x;
    let mut x = columns(table, &fitted.features, &o.vectors)?;
    if let Some(b) = &fitted.bounds {
        normalize(&mut x, b);
    }
    for i in 0..x.nrows() {
        for j in 0..x.ncols() {
            x[(i, j)] -= mean_x[j];
        }
    }
    let y_c = columns(table, &o.confidential, &o.vectors).ok();
    let mut cleaned = x.clone();
    let mut metrics = Vec::with_capacity(x.nrows());
    for i in 0..x.nrows() {
        let row: DVector<f64> = x.row(i).transpose();
        let got = clean_one(o, &fitted.cleaner, &row)
            // Data row i sits on line i + 2 (the header is line 1).
            .with_context(|| format!("{}: line {}", o.vectors.display(), i + 2))?;
        let cp = y_c.as_ref().map(|y| {
            let truth = y.row(i).transpose() - fitted.mean_c.transpose();
            complete_privacy(&(fitted.a_c.transpose() * &got.x), &truth)
        });
        metrics.push((got.removed, got.e_utility, got.e_privacy, cp));
        cleaned.set_row(i, &got.x.transpose());
    }
    // Back to the vectors file's units.
    for i in 0..cleaned.nrows() {
        for j in 0..cleaned.ncols() {
            cleaned[(i, j)] += mean_x[j];
        }
    }
    if let Some(b) = &fitted.bounds {
        denormalize(&mut cleaned, b);
    }
    Ok((cleaned, metrics))
}

/// One vector cleaned by `--epsilon` (completely with `--at-most` where epsilon is
/// more than it holds), or onto the null space.
fn clean_one(o: &CleanOptions, cleaner: &Cleaner, row: &DVector<f64>) -> anyhow::Result<Cleaned> {
    match o.epsilon {
        Some(e) => match cleaner.clean(row, e) {
            Err(CleaningError::EpsilonTooLarge { .. }) if o.at_most => Ok(cleaner.clean_all(row)?),
            Err(e @ CleaningError::EpsilonTooLarge { .. }) => Err(e)
                .context("lower --epsilon, or pass --at-most to clean such vectors completely"),
            other => Ok(other?),
        },
        None => Ok(cleaner.clean_null_space(row, NULL_TOL)?),
    }
}

/// The vectors file with its feature columns cleaned, every other column as read.
fn write_cleaned(
    path: &Path,
    table: &Table,
    features: &[String],
    cleaned: &DMatrix<f64>,
) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    w.write_record(&table.features)?;
    for (i, row) in table.rows.iter().enumerate() {
        let rec: Vec<String> = table
            .features
            .iter()
            .enumerate()
            .map(|(c, name)| match features.iter().position(|f| f == name) {
                Some(j) => cleaned[(i, j)].to_string(),
                None => row[c].to_string(),
            })
            .collect();
        w.write_record(&rec)?;
    }
    Ok(w.flush()?)
}

fn write_metrics(path: &Path, metrics: &[VectorMetrics]) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    w.write_record([
        "line",
        "removed",
        "e_utility",
        "e_privacy",
        "complete_privacy",
    ])?;
    for (i, (removed, eu, ep, cp)) in metrics.iter().enumerate() {
        w.write_record([
            (i + 2).to_string(),
            removed.to_string(),
            eu.to_string(),
            ep.to_string(),
            cp.map(|c| c.to_string()).unwrap_or_default(),
        ])?;
    }
    Ok(w.flush()?)
}
