//! What the user derives from a release, all post-processing: the components
//! (inside the public span of a projected study), how synthesis reads the
//! covariance, and the synthetic rows in the input's columns.

use anyhow::Context;
use dpca_common::dp::NoisePlan;
use dpca_common::linalg::{pca_in_span, psd_repair, Pca};
use dpca_common::protocol::Opened;
use dpca_common::study::{ClassSpec, StudySpec};
use dpca_common::synth::{
    to_original_units, CovarianceFit, NoiseLevel, SynthError, Synthesizer, Task,
};
use nalgebra::{DMatrix, DVector};
use rand::rngs::{OsRng, StdRng};
use rand::SeedableRng;

use crate::local::LocalOptions;
use crate::plan::StudyPlan;
use crate::session::Collected;
use crate::study_page::SyntheticView;

/// What the user derived from one release.
pub(crate) struct Analysis {
    /// The scatter as analysed (PSD-repaired if asked).
    pub scatter: DMatrix<f64>,
    /// The top-k components of the features.
    pub pca: Pca,
    /// The noise the release carries, from the public spec.
    pub noise: NoisePlan,
    /// How synthesis read the covariance.
    pub fit: CovarianceFit,
    /// Synthetic rows as CSV cells (the study's features, the label last).
    pub synthetic: Option<Vec<Vec<String>>>,
    /// The first of them on the first two components, for the report's figure.
    pub synthetic_view: Option<SyntheticView>,
}

/// How synthetic rows are written in the input's units: mapped back through the
/// study's bounds after its row-norm clip to C, each value then kept in the
/// range its feature's values were found in.
pub(crate) struct OutputUnits<'a> {
    /// The study's bounds, mapped to [-1, 1].
    pub bounds: &'a [(f64, f64)],
    /// Per feature, where its values lie: the marginal study's ranges, or the
    /// bounds.
    pub ranges: &'a [(f64, f64)],
    /// The row-norm bound C.
    pub c: f64,
}

impl OutputUnits<'_> {
    /// A normalized row in the input's units.
    fn row(&self, x: &DVector<f64>) -> Vec<f64> {
        to_original_units(x, self.bounds, self.c)
            .into_iter()
            .zip(self.ranges)
            .map(|(v, &(lo, hi))| v.clamp(lo.min(hi), hi.max(lo)))
            .collect()
    }
}

/// The components (inside the span of `axes` for a projected study) and, if asked
/// for, the synthetic rows in `units`, from the release `got`.
pub(crate) fn analyze(
    opts: &LocalOptions,
    plan: &StudyPlan,
    spec: &StudySpec,
    (axes, units): (Option<&DMatrix<f64>>, &OutputUnits<'_>),
    got: &Collected,
) -> anyhow::Result<Analysis> {
    let scatter = if opts.psd_repair {
        psd_repair(&got.opened.scatter)
    } else {
        got.opened.scatter.clone()
    };
    let cov = &scatter / got.n_rows as f64;
    // Regression: PCA on the features block only; the label is kept whole.
    let cov_x = cov.view((0, 0), (plan.pca_dim, plan.pca_dim)).into_owned();
    let pca = pca_in_span(&cov_x, axes, opts.k);
    let noise = spec.release_plan(Some(got.n_rows), false, got.owners_in.len());
    let fit = covariance_fit(opts, spec, &noise);
    // The denoised fit reads the noise around the released trace: it gets S' as
    // released, since --psd-repair's clipped negative eigenvalues raise the trace.
    // The repair keeps the eigenvectors, so the components fit either.
    let synth_scatter = match fit {
        CovarianceFit::Denoised(_) => &got.opened.scatter,
        CovarianceFit::Paper => &scatter,
    };
    let drawn = match opts.synthetic {
        Some(rows) => Some(synthesize(
            opts,
            &got.opened,
            synth_scatter,
            got.n_rows,
            &pca.components,
            units,
            spec.classes.as_ref(),
            rows,
            fit,
        )?),
        None => None,
    };
    let (synthetic, synthetic_view) = match drawn {
        Some((rows, view)) => (Some(rows), Some(view)),
        None => (None, None),
    };
    Ok(Analysis {
        scatter,
        pca,
        noise,
        fit,
        synthetic,
        synthetic_view,
    })
}

/// Synthetic rows the report's figure shows at most.
const VIEW_POINTS: usize = 1000;

/// The first two principal coordinates of a normalized row, about the DP mean.
fn coordinates(
    x: &DVector<f64>,
    mean: Option<&DVector<f64>>,
    components: &DMatrix<f64>,
) -> (f64, f64) {
    let p = components.nrows();
    let at = |j: usize| {
        if j >= components.ncols() {
            return 0.0;
        }
        (0..p)
            .map(|i| (x[i] - mean.map_or(0.0, |m| m[i])) * components[(i, j)])
            .sum()
    };
    (at(0), at(1))
}

/// How synthesis reads the covariance: the user's choice with the release's noise
/// level, computed from the public spec (not taken from the proxy's word); the
/// paper's way for a Wishart release ([`NoiseLevel::of`]).
pub(crate) fn covariance_fit(
    opts: &LocalOptions,
    spec: &StudySpec,
    plan: &NoisePlan,
) -> CovarianceFit {
    let mut noise = NoiseLevel::of(plan, &spec.fixed, spec.matrix_dim());
    // A noise-free test release has no noise to undo, whatever the spec plans.
    if let (true, Some(n)) = (opts.noise_free_for_testing, noise.as_mut()) {
        n.entry_sd = 0.0;
    }
    opts.covariance_fit.with(noise)
}

/// Draws `rows` synthetic rows for the task, in the input's units, as CSV cells in
/// the order of the study's features (the label last), and the first of them on
/// the first two components.
#[allow(clippy::too_many_arguments)]
pub(crate) fn synthesize(
    opts: &LocalOptions,
    opened: &Opened,
    scatter: &DMatrix<f64>,
    n_rows: u64,
    components: &DMatrix<f64>,
    units: &OutputUnits<'_>,
    classes: Option<&ClassSpec>,
    rows: usize,
    fit: CovarianceFit,
) -> anyhow::Result<(Vec<Vec<String>>, SyntheticView)> {
    // Keyed once from the system: synthesis draws (k + M) normals per row, and one
    // system call each would be most of its time.
    let mut rng = StdRng::from_rng(OsRng).context("cannot seed the synthesis generator")?;
    let cells =
        |x: &DVector<f64>| -> Vec<String> { units.row(x).iter().map(f64::to_string).collect() };
    let labels = match (opts.task, classes) {
        (Task::Classify, None) => return Err(SynthError::NoClasses.into()),
        (_, spec) => spec.map(|c| &c.labels),
    };
    let model = Synthesizer::new(opts.task, opened, scatter, n_rows, components, fit)?;
    // Unsupervised synthesis does not model the label: its column is left empty.
    let empty_label = opts.task == Task::Cluster && (opts.label.is_some() || opts.data.is_none());
    let mut view = SyntheticView {
        points: Vec::new(),
        labels: labels.cloned().unwrap_or_default(),
    };
    let rows = (0..rows)
        .map(|i| {
            let (class, x) = model.sample(&mut rng);
            if i < VIEW_POINTS {
                let (a, b) = coordinates(&x, opened.mean.as_ref(), components);
                view.points.push((class, a, b));
            }
            let mut rec = cells(&x);
            match (class, labels) {
                (Some(c), Some(labels)) => rec.push(labels[c].clone()),
                _ if empty_label => rec.push(String::new()),
                _ => {}
            }
            rec
        })
        .collect();
    Ok((rows, view))
}

/// Reorders synthetic records drawn in the `drawn` column order (the study's
/// features, the label last) into the input's column order.
pub(crate) fn in_input_order(
    input: &[String],
    drawn: &[String],
    rows: &[Vec<String>],
) -> anyhow::Result<Vec<Vec<String>>> {
    let order = input
        .iter()
        .map(|h| drawn.iter().position(|d| d == h))
        .collect::<Option<Vec<usize>>>()
        .filter(|o| o.len() == drawn.len())
        .with_context(|| {
            format!("the input's columns {input:?} are not the synthesized ones {drawn:?}")
        })?;
    rows.iter()
        .map(|r| {
            order
                .iter()
                .map(|&i| r.get(i).cloned())
                .collect::<Option<Vec<String>>>()
                .with_context(|| format!("a synthetic record of {} cells for {drawn:?}", r.len()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn synthetic_records_follow_the_input_column_order() {
        let input = strings(&["a", "label", "b"]);
        let drawn = strings(&["a", "b", "label"]);
        let rows = vec![strings(&["1", "2", "x"]), strings(&["3", "4", "y"])];
        let out = in_input_order(&input, &drawn, &rows).expect("same columns");
        assert_eq!(
            out,
            vec![strings(&["1", "x", "2"]), strings(&["3", "y", "4"])]
        );
        let err = in_input_order(&strings(&["a", "c"]), &strings(&["a", "b"]), &rows)
            .expect_err("column c was not drawn");
        assert!(err.to_string().contains("\"c\""), "{err}");
    }
}
