//! The public axes of a projected study (the second round of PCA-Gauss): the
//! PCA of a public table (Pub-PCA) or the components of an earlier study.

use std::path::Path;

use anyhow::{bail, Context};
use dpca_common::data::{normalize_row, read_csv};
use dpca_common::linalg::{centered_scatter, pca, Pca};
use nalgebra::DMatrix;

use crate::local::LocalOptions;
use crate::plan::StudyPlan;

/// The axes the options ask for, if any, for `bounds` and row bound `c` (Pub-PCA
/// preprocesses the public rows with them, so they are read again once the
/// bounds or C are chosen).
pub(crate) fn load_axes(
    opts: &LocalOptions,
    plan: &StudyPlan,
    label: Option<&str>,
    (bounds, c): (&[(f64, f64)], f64),
) -> anyhow::Result<Option<DMatrix<f64>>> {
    let features = &plan.table.features[..plan.pca_dim];
    Ok(match (&opts.pca_from, &opts.components_from) {
        (Some(path), _) => Some(
            public_components(path, label, features, &bounds[..plan.pca_dim], c, opts.k)?
                .components,
        ),
        (None, Some(path)) => Some(read_components(path, features, opts.k)?),
        (None, None) => None,
    })
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
/// features in the study's order; columns PC1, PC2, ...), refusing a file whose
/// feature rows are not `features` or that has fewer than `k` components.
pub fn read_components(path: &Path, features: &[String], k: usize) -> anyhow::Result<DMatrix<f64>> {
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
