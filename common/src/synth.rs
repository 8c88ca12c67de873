//! PCA-Gauss synthetic data (the PCA-Gauss paper's Algorithm 1):
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
//!
//! How the covariance is read from the noisy scatter is a choice ([`CovarianceFit`]):
//! the paper's reduced covariance as released, or a denoised one that undoes the
//! upward bias the symmetric noise gives the top eigenvalues and puts the variance
//! the k components leave out back as an isotropic residual (probabilistic PCA).
//! Both use only the release and the public noise level.

use nalgebra::{DMatrix, DVector};
use rand::Rng;
use rand_distr::StandardNormal;

use crate::data::normalize_row;
use crate::dp::{NoisePlan, NoiseScale};
use crate::encoding::FixedPoint;
use crate::linalg::eigh_desc;
use crate::protocol::{ClassStats, Opened};

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
            other => Err(SynthError::UnknownName(format!(
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
    /// A name on the command line that names no choice.
    #[error("{0}")]
    UnknownName(String),
    /// Synthesis needs a DP estimate of the mean.
    #[error(
        "synthetic data needs a differentially private mean, which the `mask` centering \
         does not release (its mean is masked); run the study with `--centering dp-mean`"
    )]
    NoMean,
    /// Classification synthesis needs the class statistics of a classification
    /// study.
    #[error("the release carries no class statistics")]
    NoClasses,
}

/// The noise the study added to the released scatter, public from its noise plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseLevel {
    /// Standard deviation of one entry of the symmetric noise matrix, in the
    /// normalized units of the scatter (before dividing by a row count).
    pub entry_sd: f64,
    /// Dimension of that noise matrix: the study's M in a plain study, the rank of
    /// the projection in a projected one (whose scatter says nothing outside the
    /// span).
    pub dim: usize,
}

impl NoiseLevel {
    /// The noise level of a released scatter block of dimension `dim` under `plan`,
    /// in the normalized units of [`FixedPoint`]'s
    /// grid. `None` for the Wishart mechanism: its noise is not centred (its mean is
    /// a multiple of I), so nothing denoises it this way.
    pub fn of(plan: &NoisePlan, fixed: &FixedPoint, dim: usize) -> Option<Self> {
        match plan.matrix {
            NoiseScale::Wishart { .. } => None,
            _ => Some(Self {
                entry_sd: plan.matrix.std_dev() / fixed.scale().powi(2),
                dim,
            }),
        }
    }
}

/// How a model's covariance is read from the released scatter. Either way it is
/// post-processing of the release and the public noise level.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CovarianceFit {
    /// The paper's: W^T S' W / N as released, negative eigenvalues clipped to 0, no
    /// variance outside the span of the k components.
    Paper,
    /// Denoised. A symmetric noise matrix with entry sd sigma (after dividing by N)
    /// spreads its spectrum over [-2 sigma sqrt(d), 2 sigma sqrt(d)] and lifts a
    /// signal eigenvalue lambda above sigma sqrt(d) to about lambda + d sigma^2 /
    /// lambda (the spiked Wigner model); the top eigenvalues of S' are therefore too
    /// large, by more the closer they sit to the noise. Each reduced eigenvalue l
    /// above the edge 2 sigma sqrt(d) is mapped back to (l + sqrt(l^2 - 4 d sigma^2))
    /// / 2, one at or below the edge (indistinguishable from noise) to 0. The trace
    /// of S' / N is unbiased (the noise has mean 0), so what it holds beyond the
    /// kept eigenvalues is spread evenly over the remaining directions as a residual
    /// variance r: the kept axes get max(lambda, r), and in a plain study every
    /// direction outside the components' span gets r (probabilistic PCA's
    /// isotropic residual). A projected study's scatter knows nothing outside its
    /// span, so there the residual stays inside it.
    Denoised(NoiseLevel),
}

/// The user's choice of [`CovarianceFit`], before the release says its noise level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FitKind {
    /// [`CovarianceFit::Paper`].
    Paper,
    /// [`CovarianceFit::Denoised`].
    Denoised,
}

impl CovarianceFit {
    /// The CLI name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Paper => FitKind::Paper,
            Self::Denoised(_) => FitKind::Denoised,
        }
        .name()
    }
}

impl FitKind {
    /// Parses the CLI name.
    pub fn parse(name: &str) -> Result<Self, SynthError> {
        match name {
            "paper" => Ok(Self::Paper),
            "denoised" => Ok(Self::Denoised),
            other => Err(SynthError::UnknownName(format!(
                "unknown covariance fit `{other}` (expected denoised or paper)"
            ))),
        }
    }

    /// The CLI name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Paper => "paper",
            Self::Denoised => "denoised",
        }
    }

    /// The fit for a release with this noise level; the paper's where the noise
    /// cannot be denoised (see [`NoiseLevel::of`]).
    pub fn with(self, noise: Option<NoiseLevel>) -> CovarianceFit {
        match (self, noise) {
            (Self::Denoised, Some(noise)) => CovarianceFit::Denoised(noise),
            _ => CovarianceFit::Paper,
        }
    }
}

/// The Gaussian model PCA-Gauss samples from, in normalized units: x = W y + mu + e
/// with y ~ N(0, diag(variances)) in the eigenbasis of W^T S' W / N and e an
/// isotropic residual of sd `residual` outside the span of W.
#[derive(Clone, Debug)]
pub struct GaussModel {
    /// M x k map from the reduced space (already rotated to diagonalize the
    /// reduced covariance).
    pub map: DMatrix<f64>,
    /// Variances along the k reduced axes, none negative.
    pub variances: Vec<f64>,
    /// The mean in normalized units.
    pub mean: DVector<f64>,
    /// Standard deviation of the residual in every direction outside the span of
    /// `map` (0 for [`CovarianceFit::Paper`]).
    pub residual: f64,
}

impl GaussModel {
    /// Builds the model from S' (normalized units, M x M), the row count N, the top-k
    /// components (M x k, orthonormal columns), a mean and the way to read the
    /// covariance. The reduced covariance W^T S' W / N may be indefinite (noise);
    /// its negative eigenvalues are clipped, which is post-processing.
    pub fn new(
        scatter: &DMatrix<f64>,
        n_rows: u64,
        components: &DMatrix<f64>,
        mean: &DVector<f64>,
        fit: CovarianceFit,
    ) -> Result<Self, SynthError> {
        Self::with_divisor(scatter, n_rows as f64, components, mean, fit)
    }

    /// As [`GaussModel::new`], with the scatter divided by `divisor` (a noisy class
    /// count, say) instead of N.
    pub fn with_divisor(
        scatter: &DMatrix<f64>,
        divisor: f64,
        components: &DMatrix<f64>,
        mean: &DVector<f64>,
        fit: CovarianceFit,
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
        let (variances, residual) = match fit {
            CovarianceFit::Paper => (values.into_iter().map(|v| v.max(0.0)).collect(), 0.0),
            CovarianceFit::Denoised(noise) => {
                denoise(&values, scatter.trace() / divisor, m, noise, divisor)?
            }
        };
        Ok(Self {
            map: components * vectors,
            variances,
            mean: mean.clone(),
            residual,
        })
    }

    /// The model's total variance: its trace over all M directions.
    pub fn total_variance(&self) -> f64 {
        let outside = self.map.nrows().saturating_sub(self.variances.len()) as f64;
        self.variances.iter().sum::<f64>() + outside * self.residual.powi(2)
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
        let mut x = &self.map * y + &self.mean;
        if self.residual > 0.0 {
            // z minus its part in the span: isotropic in the complement.
            let z = DVector::from_iterator(
                self.map.nrows(),
                (0..self.map.nrows()).map(|_| rng.sample::<f64, _>(StandardNormal)),
            );
            let inside = &self.map * (self.map.transpose() * &z);
            x += (z - inside) * self.residual;
        }
        x
    }
}

/// The denoised variances of [`CovarianceFit::Denoised`]: `values` are the reduced
/// eigenvalues (descending) of S' / divisor, `total` the trace of S' / divisor, `m`
/// the model's dimension. Returns the k variances and the residual sd outside the
/// span.
fn denoise(
    values: &[f64],
    total: f64,
    m: usize,
    noise: NoiseLevel,
    divisor: f64,
) -> Result<(Vec<f64>, f64), SynthError> {
    if !(noise.entry_sd.is_finite() && noise.entry_sd >= 0.0) || noise.dim == 0 || noise.dim > m {
        return Err(SynthError::Shape(format!(
            "noise level of sd {} on a {}-dimensional noise matrix for a {m}-dimensional \
             scatter",
            noise.entry_sd, noise.dim
        )));
    }
    let sigma = noise.entry_sd / divisor;
    let edge2 = 4.0 * noise.dim as f64 * sigma * sigma;
    let lifted: Vec<f64> = values
        .iter()
        .map(|&l| {
            if l > 0.0 && l * l > edge2 {
                (l + (l * l - edge2).sqrt()) / 2.0
            } else {
                0.0
            }
        })
        .collect();
    // The residual r is the trace's remainder over the directions not kept. A kept
    // eigenvalue below r is no signal above the residual: it joins the rest, the
    // smallest first (each such move lowers r to between the two), until every kept
    // eigenvalue is at least r. The model's total variance is then the trace. The
    // kept ones are a prefix, `lifted` being descending.
    let residual = |live: usize| {
        let rest = noise.dim.saturating_sub(live);
        if rest == 0 {
            0.0
        } else {
            ((total - lifted[..live].iter().sum::<f64>()) / rest as f64).max(0.0)
        }
    };
    let mut live = lifted.iter().take_while(|&&v| v > 0.0).count();
    let mut r = residual(live);
    while live > 0 && lifted[live - 1] < r {
        live -= 1;
        r = residual(live);
    }
    let variances = lifted.iter().map(|&v| v.max(r)).collect();
    // A projected study's scatter says nothing outside its span.
    let outside = if noise.dim == m { r.sqrt() } else { 0.0 };
    Ok((variances, outside))
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
        fit: CovarianceFit,
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
                let base = GaussModel::new(shared, n_rows, components, &means[0], fit)?;
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
                .map(|((s, m), &c)| GaussModel::with_divisor(s, c.max(1.0), components, m, fit))
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

/// The model a task's synthetic rows are drawn from, built from one release: a
/// [`GaussMixture`] for classification, one [`GaussModel`] otherwise (through the
/// components augmented by the label axis for regression).
#[derive(Clone, Debug)]
pub enum Synthesizer {
    /// Algorithm 3.
    Classes(GaussMixture),
    /// Algorithms 1 and 2.
    Single(GaussModel),
}

impl Synthesizer {
    /// Builds the task's model from the release (its DP mean and class statistics),
    /// the scatter to read (S' as released, or repaired), the row count N and the
    /// top-k components of the features.
    pub fn new(
        task: Task,
        opened: &Opened,
        scatter: &DMatrix<f64>,
        n_rows: u64,
        components: &DMatrix<f64>,
        fit: CovarianceFit,
    ) -> Result<Self, SynthError> {
        let mean = opened.mean.as_ref().ok_or(SynthError::NoMean)?;
        Ok(match task {
            Task::Classify => {
                let stats = opened.classes.as_ref().ok_or(SynthError::NoClasses)?;
                Self::Classes(GaussMixture::new(stats, n_rows, components, fit)?)
            }
            Task::Regress => Self::Single(GaussModel::new(
                scatter,
                n_rows,
                &augment_with_label(components),
                mean,
                fit,
            )?),
            Task::Cluster => Self::Single(GaussModel::new(scatter, n_rows, components, mean, fit)?),
        })
    }

    /// One row in normalized units, with its class index in a classification.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> (Option<usize>, DVector<f64>) {
        match self {
            Self::Classes(mix) => {
                let (c, x) = mix.sample(rng);
                (Some(c), x)
            }
            Self::Single(model) => (None, model.sample(rng)),
        }
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
        let model = GaussModel::new(&s, n, &w, &mu, CovarianceFit::Paper).expect("model");
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
    fn denoised_residual_fills_the_directions_outside_the_span() {
        // S / N = diag(4, 1, 0.25) without noise: the third axis, outside the span of
        // k = 2, gets the trace's remainder 0.25 as residual variance.
        let s = DMatrix::from_diagonal(&DVector::from_vec(vec![40.0, 10.0, 2.5]));
        let w = DMatrix::from_columns(&[
            DVector::from_vec(vec![1.0, 0.0, 0.0]),
            DVector::from_vec(vec![0.0, 1.0, 0.0]),
        ]);
        let fit = CovarianceFit::Denoised(NoiseLevel {
            entry_sd: 0.0,
            dim: 3,
        });
        let model = GaussModel::new(&s, 10, &w, &DVector::zeros(3), fit).expect("model");
        assert!((model.residual - 0.5).abs() < 1e-12, "{}", model.residual);
        assert!((model.total_variance() - 5.25).abs() < 1e-12);
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let draws: Vec<DVector<f64>> = (0..20_000).map(|_| model.sample(&mut rng)).collect();
        let var = |i: usize| draws.iter().map(|d| d[i] * d[i]).sum::<f64>() / 20_000.0;
        assert!((var(0) - 4.0).abs() < 0.15);
        assert!((var(2) - 0.25).abs() < 0.01, "{}", var(2));
        // A projected study (noise on the span only) has no residual outside it.
        let projected = CovarianceFit::Denoised(NoiseLevel {
            entry_sd: 0.0,
            dim: 2,
        });
        let s2 = DMatrix::from_diagonal(&DVector::from_vec(vec![40.0, 10.0, 0.0]));
        let model = GaussModel::new(&s2, 10, &w, &DVector::zeros(3), projected).expect("model");
        assert_eq!(model.residual, 0.0);
        assert_eq!(model.variances, vec![4.0, 1.0]);
    }

    /// A symmetric matrix of iid N(0, sd^2) entries (upper triangle mirrored), as the
    /// study's noise.
    fn symmetric_noise(m: usize, sd: f64, rng: &mut ChaCha20Rng) -> DMatrix<f64> {
        let mut e = DMatrix::zeros(m, m);
        for i in 0..m {
            for j in i..m {
                let z: f64 = rand::Rng::sample(rng, StandardNormal);
                e[(i, j)] = z * sd;
                e[(j, i)] = z * sd;
            }
        }
        e
    }

    /// The model's M x M covariance.
    fn model_covariance(model: &GaussModel) -> DMatrix<f64> {
        let m = model.map.nrows();
        let d = DMatrix::from_diagonal(&DVector::from_vec(model.variances.clone()));
        let inside = &model.map * model.map.transpose();
        &model.map * d * model.map.transpose()
            + (DMatrix::identity(m, m) - inside) * model.residual.powi(2)
    }

    #[test]
    fn denoised_covariance_is_closer_to_the_truth_than_the_papers() {
        // Three spikes over a flat residual of 0.01 in M = 60; noise of entry sd 0.03
        // puts the bulk edge at 2 * 0.03 * sqrt(60) = 0.46, just below the weakest
        // spike's noisy eigenvalue (about 0.3 + 60 * 0.03^2 / 0.3 = 0.48).
        let m = 60;
        let mut diag = vec![0.01; m];
        diag[..3].copy_from_slice(&[1.0, 0.6, 0.3]);
        let truth = DMatrix::from_diagonal(&DVector::from_vec(diag));
        let sd = 0.03;
        let fit = CovarianceFit::Denoised(NoiseLevel {
            entry_sd: sd,
            dim: m,
        });
        let mut tops = (0.0, 0.0);
        for seed in 0..5 {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let released = &truth + symmetric_noise(m, sd, &mut rng);
            let w = {
                let (_, v) = eigh_desc(&released);
                v.columns(0, 3).into_owned()
            };
            let mean = DVector::zeros(m);
            let paper =
                GaussModel::new(&released, 1, &w, &mean, CovarianceFit::Paper).expect("paper");
            let denoised = GaussModel::new(&released, 1, &w, &mean, fit).expect("denoised");
            let err = |g: &GaussModel| (model_covariance(g) - &truth).norm();
            assert!(
                err(&denoised) < 0.9 * err(&paper),
                "seed {seed}: denoised {} against paper {}",
                err(&denoised),
                err(&paper)
            );
            tops.0 += paper.variances[0] / 5.0;
            tops.1 += denoised.variances[0] / 5.0;
            // The residual is the trace's remainder: 0.01 give or take the noise on the
            // trace (sd 0.03 sqrt(60) / 57 = 0.004).
            assert!(
                (denoised.residual.powi(2) - 0.01).abs() < 0.008,
                "seed {seed}"
            );
            assert!((denoised.total_variance() - released.trace()).abs() < 1e-9);
        }
        // The top eigenvalue is lifted by about 60 * 0.03^2 / 1 = 0.054 on average;
        // denoised, it is back near 1.
        assert!(tops.0 > 1.03, "{tops:?}");
        assert!((tops.1 - 1.0).abs() < 0.02, "{tops:?}");
    }

    #[test]
    fn noise_level_is_read_off_the_plan_in_normalized_units() {
        let fixed = FixedPoint {
            frac_bits: 10,
            row_norm_bound: 1.0,
        };
        let plan = |matrix| NoisePlan {
            matrix,
            vector: None,
            rho: None,
            epsilon: 1.0,
            delta: 0.0,
        };
        // sigma = 3 on a grid of 2^10 per unit: 3 / 2^20 in scatter units.
        let gaussian = plan(NoiseScale::Gaussian {
            sigma: num_bigint::BigUint::from(3u32),
        });
        let level = NoiseLevel::of(&gaussian, &fixed, 5).expect("gaussian");
        assert_eq!(level.dim, 5);
        assert!((level.entry_sd - 3.0 / 1024.0 / 1024.0).abs() < 1e-18);
        let wishart = plan(NoiseScale::Wishart {
            sigma_z2: num_bigint::BigUint::from(1u32),
            cols: 6,
        });
        assert_eq!(NoiseLevel::of(&wishart, &fixed, 5), None);
        assert_eq!(FitKind::Denoised.with(None), CovarianceFit::Paper);
        assert_eq!(
            FitKind::Denoised.with(Some(level)),
            CovarianceFit::Denoised(level)
        );
    }

    #[test]
    fn indefinite_reduced_covariance_is_clipped() {
        let s = DMatrix::from_row_slice(2, 2, &[1.0, 2.0, 2.0, 1.0]); // eigenvalues 3, -1
        let w = DMatrix::identity(2, 2);
        let model =
            GaussModel::new(&s, 1, &w, &DVector::zeros(2), CovarianceFit::Paper).expect("model");
        assert_eq!(model.variances.len(), 2);
        assert!((model.variances[0] - 3.0).abs() < 1e-12);
        assert_eq!(model.variances[1], 0.0);
    }

    #[test]
    fn refuses_mismatched_shapes() {
        let s = DMatrix::identity(3, 3);
        let w = DMatrix::identity(2, 2);
        assert!(matches!(
            GaussModel::new(&s, 5, &w, &DVector::zeros(3), CovarianceFit::Paper),
            Err(SynthError::Shape(_))
        ));
        assert!(GaussModel::new(
            &s,
            0,
            &DMatrix::identity(3, 1),
            &DVector::zeros(3),
            CovarianceFit::Paper
        )
        .is_err());
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
        let mix = GaussMixture::new(&stats, 100, &w, CovarianceFit::Paper).expect("mixture");
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
            GaussMixture::new(&bad, 100, &w, CovarianceFit::Paper),
            Err(SynthError::Shape(_))
        ));
    }

    proptest! {
        #[test]
        fn denoised_model_keeps_the_released_trace(
            seed in 0u64..1000,
            m in 2usize..12,
            k_frac in 0.0f64..1.0,
            sd in 0.0f64..0.5,
            divisor in 1.0f64..50.0,
        ) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let a = DMatrix::from_fn(m, m, |_, _| -> f64 {
                rand::Rng::sample(&mut rng, StandardNormal)
            });
            let s = &a * a.transpose() + symmetric_noise(m, sd, &mut rng);
            let k = 1 + ((m - 1) as f64 * k_frac) as usize;
            let w = eigh_desc(&s).1.columns(0, k).into_owned();
            let fit = CovarianceFit::Denoised(NoiseLevel { entry_sd: sd, dim: m });
            let model = GaussModel::with_divisor(&s, divisor, &w, &DVector::zeros(m), fit)
                .expect("model");
            let paper = GaussModel::with_divisor(
                &s, divisor, &w, &DVector::zeros(m), CovarianceFit::Paper,
            ).expect("paper");
            prop_assert!(model.residual >= 0.0);
            prop_assert!(model.variances.iter().all(|&v| v >= 0.0));
            // Shrinkage never raises a kept eigenvalue above the released one, except
            // to the residual floor.
            for (d, p) in model.variances.iter().zip(&paper.variances) {
                prop_assert!(*d <= p.max(model.residual.powi(2)) + 1e-12);
            }
            // Whenever the released trace covers the kept variances, the model's total
            // variance is exactly the released trace.
            let trace = s.trace() / divisor;
            if model.residual > 0.0 {
                prop_assert!((model.total_variance() - trace).abs() < 1e-9 * (1.0 + trace.abs()));
            }
        }

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
