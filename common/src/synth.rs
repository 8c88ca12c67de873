//! PCA-Gauss synthetic data (the PCA-Gauss paper's Algorithm 1, DESIGN section 7):
//! from the released scatter S' and its top-k components W_k, draw
//! y ~ N(0, W_k^T S' W_k / N) in k dimensions and map x = W_k y + mu back through the
//! public normalization. Everything here is post-processing of what the study
//! released (S', and a DP mean mu), so it spends no privacy budget of its own.
//!
//! - Regression (Algorithm 2): the label is the last column of the study; PCA acts
//!   on the features block only and [y; label] is drawn jointly, through the
//!   components augmented by the label axis ([`augment_with_label`]).
//! - Classification (Algorithm 3): a Gaussian mixture ([`GaussMixture`]) with the
//!   noisy class proportions, the DP class means and either one shared within-class
//!   covariance or one per class, each reduced to the k components.

use nalgebra::{DMatrix, DVector};
use rand::Rng;
use rand_distr::StandardNormal;

use crate::data::normalize_row;
use crate::linalg::eigh_desc;
use crate::protocol::ClassStats;

/// What the synthetic data is for, which decides what the study releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// Algorithm 1: features only.
    Cluster,
    /// Algorithm 2: a numeric label drawn jointly with the features.
    Regress,
    /// Algorithm 3: a class label, per-class means and covariances.
    Classify,
}

impl Task {
    /// Parses the CLI name.
    pub fn parse(name: &str) -> Result<Self, SynthError> {
        match name {
            "cluster" => Ok(Self::Cluster),
            "regress" => Ok(Self::Regress),
            "classify" => Ok(Self::Classify),
            other => Err(SynthError::Shape(format!(
                "unknown task `{other}` (expected cluster, regress or classify)"
            ))),
        }
    }

    /// The CLI name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Cluster => "cluster",
            Self::Regress => "regress",
            Self::Classify => "classify",
        }
    }
}

/// Why synthesis is refused.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// Shapes that do not fit together.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// Synthesis needs a DP estimate of the mean.
    #[error(
        "synthetic data needs a differentially private mean, which the `mask` centering \
         does not release (its mean is masked); run the study with `--centering dp-mean`"
    )]
    NoMean,
}

/// The Gaussian model PCA-Gauss samples from, in normalized units: x = W y + mu with
/// y ~ N(0, diag(variances)) in the eigenbasis of W^T S' W / N.
#[derive(Clone, Debug)]
pub struct GaussModel {
    /// M x k map from the reduced space (already rotated to diagonalize the
    /// reduced covariance).
    pub map: DMatrix<f64>,
    /// Variances along the k reduced axes, negative ones clipped to 0.
    pub variances: Vec<f64>,
    /// The mean in normalized units.
    pub mean: DVector<f64>,
}

impl GaussModel {
    /// Builds the model from S' (normalized units, M x M), the row count N, the top-k
    /// components (M x k, orthonormal columns) and a mean. The reduced covariance
    /// W^T S' W / N may be indefinite (noise); its negative eigenvalues are clipped,
    /// which is post-processing.
    pub fn new(
        scatter: &DMatrix<f64>,
        n_rows: u64,
        components: &DMatrix<f64>,
        mean: &DVector<f64>,
    ) -> Result<Self, SynthError> {
        Self::with_divisor(scatter, n_rows as f64, components, mean)
    }

    /// As [`GaussModel::new`], with the scatter divided by `divisor` (a noisy class
    /// count, say) instead of N.
    pub fn with_divisor(
        scatter: &DMatrix<f64>,
        divisor: f64,
        components: &DMatrix<f64>,
        mean: &DVector<f64>,
    ) -> Result<Self, SynthError> {
        let m = scatter.nrows();
        if scatter.ncols() != m || components.nrows() != m || mean.len() != m {
            return Err(SynthError::Shape(format!(
                "scatter {}x{}, components {}x{}, mean {}",
                scatter.nrows(),
                scatter.ncols(),
                components.nrows(),
                components.ncols(),
                mean.len()
            )));
        }
        if !(divisor.is_finite() && divisor > 0.0) {
            return Err(SynthError::Shape(format!(
                "the row count dividing the scatter must be positive, got {divisor}"
            )));
        }
        let reduced = components.transpose() * scatter * components / divisor;
        let sym = (&reduced + reduced.transpose()) * 0.5;
        let (values, vectors) = eigh_desc(&sym);
        Ok(Self {
            map: components * vectors,
            variances: values.into_iter().map(|v| v.max(0.0)).collect(),
            mean: mean.clone(),
        })
    }

    /// One sample in normalized units.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> DVector<f64> {
        let y = DVector::from_iterator(
            self.variances.len(),
            self.variances.iter().map(|v| {
                let z: f64 = rng.sample(StandardNormal);
                z * v.sqrt()
            }),
        );
        &self.map * y + &self.mean
    }
}

/// The components of Algorithm 2: the top-k components of the features block
/// (M x k) extended by the label axis to (M + 1) x (k + 1), so the label is kept
/// whole and drawn jointly with the reduced features.
pub fn augment_with_label(components: &DMatrix<f64>) -> DMatrix<f64> {
    let (m, k) = components.shape();
    let mut a = DMatrix::zeros(m + 1, k + 1);
    a.view_mut((0, 0), (m, k)).copy_from(components);
    a[(m, k)] = 1.0;
    a
}

/// The public axes a projected study sends to the owners: the columns of `w` (M x k),
/// with the label axis added in a regression study, whose label is a column.
pub fn task_projection(task: Task, w: &DMatrix<f64>) -> crate::study::Projection {
    let w = if task == Task::Regress {
        augment_with_label(w)
    } else {
        w.clone()
    };
    crate::study::Projection {
        axes: w
            .column_iter()
            .map(|c| c.iter().copied().collect())
            .collect(),
    }
}

/// A Gaussian mixture over classes (Algorithm 3), in normalized units.
#[derive(Clone, Debug)]
pub struct GaussMixture {
    /// Cumulative class probabilities, the last one 1.
    cumulative: Vec<f64>,
    /// One model per class: its mean, and the shared or its own covariance.
    pub models: Vec<GaussModel>,
}

impl GaussMixture {
    /// Builds the mixture from the released class statistics, the pooled row count
    /// N and the top-k components W. A shared within-class scatter is divided by N; a
    /// class's own scatter by its noisy count (at least 1).
    ///
    /// Class c is centered at its DP mean mu_c, kept whole: the study released it in
    /// all M dimensions, so using it costs nothing, and the features that separate
    /// the classes need not lie in the span of noisy components (projecting the class
    /// deviations onto that span cost about 20 points of accuracy on optdigits at
    /// epsilon 1 with the Laplace mechanism). The covariances live in the span.
    pub fn new(
        stats: &ClassStats,
        n_rows: u64,
        components: &DMatrix<f64>,
    ) -> Result<Self, SynthError> {
        let g = stats.means.len();
        if g == 0 || stats.counts.len() != g {
            return Err(SynthError::Shape(format!(
                "{} class means and {} counts",
                g,
                stats.counts.len()
            )));
        }
        if let Some(m) = stats.means.iter().find(|m| m.len() != components.nrows()) {
            return Err(SynthError::Shape(format!(
                "class mean of {} values for {} features",
                m.len(),
                components.nrows()
            )));
        }
        let means = &stats.means;
        let models = match stats.scatters.as_slice() {
            [shared] => {
                let base = GaussModel::new(shared, n_rows, components, &means[0])?;
                means
                    .iter()
                    .map(|m| GaussModel {
                        mean: m.clone(),
                        ..base.clone()
                    })
                    .collect()
            }
            own if own.len() == g => own
                .iter()
                .zip(means)
                .zip(&stats.counts)
                .map(|((s, m), &c)| GaussModel::with_divisor(s, c.max(1.0), components, m))
                .collect::<Result<Vec<_>, _>>()?,
            other => {
                return Err(SynthError::Shape(format!(
                    "{} class scatters for {g} classes",
                    other.len()
                )))
            }
        };
        let mut acc = 0.0;
        let mut cumulative: Vec<f64> = stats
            .proportions()
            .iter()
            .map(|p| {
                acc += p;
                acc
            })
            .collect();
        if let Some(last) = cumulative.last_mut() {
            *last = 1.0;
        }
        Ok(Self { cumulative, models })
    }

    /// One labelled sample: the class index and the row in normalized units.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> (usize, DVector<f64>) {
        let u: f64 = rng.gen();
        let c = self
            .cumulative
            .iter()
            .position(|&p| u < p)
            .unwrap_or(self.cumulative.len() - 1);
        (c, self.models[c].sample(rng))
    }
}

/// Maps a normalized row back to the input's units: the inverse of the affine map of
/// [`normalize_row`], after the same public preprocessing the real rows went
/// through (row-norm clip to `c`, each value inside [-1, 1]), so synthetic rows look
/// like the preprocessed real rows.
pub fn to_original_units(x: &DVector<f64>, bounds: &[(f64, f64)], c: f64) -> Vec<f64> {
    let norm = x.norm();
    let scale = if norm > c { c / norm } else { 1.0 };
    x.iter()
        .zip(bounds)
        .map(|(&v, &(lo, hi))| {
            let u = (v * scale).clamp(-1.0, 1.0);
            lo + (u + 1.0) * (hi - lo) / 2.0
        })
        .collect()
}

/// The preprocessing of a raw row as the study saw it, for comparing synthetic rows
/// with real ones in the same units.
pub fn preprocessed(row: &[f64], bounds: &[(f64, f64)], c: f64) -> Vec<f64> {
    let (x, _) = normalize_row(row, bounds, c);
    to_original_units(&DVector::from_vec(x), bounds, c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn samples_have_the_model_covariance_and_mean() {
        // S / N = diag(4, 1, 0.25); k = 2 keeps the first two axes.
        let n = 10u64;
        let s = DMatrix::from_diagonal(&DVector::from_vec(vec![40.0, 10.0, 2.5]));
        let w = DMatrix::from_columns(&[
            DVector::from_vec(vec![1.0, 0.0, 0.0]),
            DVector::from_vec(vec![0.0, 1.0, 0.0]),
        ]);
        let mu = DVector::from_vec(vec![0.1, -0.2, 0.3]);
        let model = GaussModel::new(&s, n, &w, &mu).expect("model");
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let draws: Vec<DVector<f64>> = (0..20_000).map(|_| model.sample(&mut rng)).collect();
        let count = draws.len() as f64;
        let mean = draws.iter().fold(DVector::zeros(3), |a, d| a + d) / count;
        assert!((&mean - &mu).amax() < 0.05, "{mean}");
        let cov = draws.iter().fold(DMatrix::zeros(3, 3), |a, d| {
            a + (d - &mean) * (d - &mean).transpose()
        }) / count;
        assert!((cov[(0, 0)] - 4.0).abs() < 0.15, "{cov}");
        assert!((cov[(1, 1)] - 1.0).abs() < 0.05, "{cov}");
        // The third axis is outside the span: no variance at all.
        assert!(cov[(2, 2)].abs() < 1e-20, "{cov}");
        assert!(cov[(0, 1)].abs() < 0.1, "{cov}");
    }

    #[test]
    fn indefinite_reduced_covariance_is_clipped() {
        let s = DMatrix::from_row_slice(2, 2, &[1.0, 2.0, 2.0, 1.0]); // eigenvalues 3, -1
        let w = DMatrix::identity(2, 2);
        let model = GaussModel::new(&s, 1, &w, &DVector::zeros(2)).expect("model");
        assert_eq!(model.variances.len(), 2);
        assert!((model.variances[0] - 3.0).abs() < 1e-12);
        assert_eq!(model.variances[1], 0.0);
    }

    #[test]
    fn refuses_mismatched_shapes() {
        let s = DMatrix::identity(3, 3);
        let w = DMatrix::identity(2, 2);
        assert!(matches!(
            GaussModel::new(&s, 5, &w, &DVector::zeros(3)),
            Err(SynthError::Shape(_))
        ));
        assert!(GaussModel::new(&s, 0, &DMatrix::identity(3, 1), &DVector::zeros(3)).is_err());
    }

    #[test]
    fn mixture_keeps_class_means_outside_the_span() {
        // Two classes that differ only along axis 2, which the one component (axis 0)
        // does not span; proportions 0.25 / 0.75 from the noisy counts.
        let stats = ClassStats {
            counts: vec![25.0, 75.0],
            means: vec![
                DVector::from_vec(vec![0.0, 0.1, 0.5]),
                DVector::from_vec(vec![0.0, 0.1, -0.5]),
            ],
            scatters: vec![DMatrix::from_diagonal(&DVector::from_vec(vec![
                100.0, 50.0, 50.0,
            ]))],
        };
        let w = DMatrix::from_column_slice(3, 1, &[1.0, 0.0, 0.0]);
        let mix = GaussMixture::new(&stats, 100, &w).expect("mixture");
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let mut sums = [DVector::zeros(3), DVector::zeros(3)];
        let mut counts = [0usize; 2];
        for _ in 0..8000 {
            let (c, x) = mix.sample(&mut rng);
            sums[c] += x;
            counts[c] += 1;
        }
        let share = counts[0] as f64 / 8000.0;
        assert!((share - 0.25).abs() < 0.02, "{counts:?}");
        for c in 0..2 {
            let mean = &sums[c] / counts[c] as f64;
            assert!((&mean - &stats.means[c]).amax() < 0.05, "class {c}: {mean}");
        }
        let bad = ClassStats {
            means: vec![DVector::zeros(2), DVector::zeros(2)],
            ..stats
        };
        assert!(matches!(
            GaussMixture::new(&bad, 100, &w),
            Err(SynthError::Shape(_))
        ));
    }

    proptest! {
        #[test]
        fn original_units_invert_the_normalization(
            row in proptest::collection::vec(0.0f64..16.0, 1..10),
            c in 0.1f64..4.0,
        ) {
            let bounds = vec![(0.0, 16.0); row.len()];
            let once = preprocessed(&row, &bounds, c);
            // Preprocessing is idempotent: a preprocessed row is its own image.
            let twice = preprocessed(&once, &bounds, c);
            for (a, b) in once.iter().zip(&twice) {
                prop_assert!((a - b).abs() < 1e-9);
                prop_assert!((0.0..=16.0).contains(a));
            }
            // Rows inside the norm ball come back unchanged.
            let (x, clipped) = normalize_row(&row, &bounds, c);
            if !clipped {
                let back = to_original_units(&DVector::from_vec(x), &bounds, c);
                for (a, b) in back.iter().zip(&row) {
                    prop_assert!((a - b).abs() < 1e-9);
                }
            }
        }
    }
}
