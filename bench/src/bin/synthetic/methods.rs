//! The methods compared: how each turns releases into axes and synthetic rows.

use crate::experiment::*;
use crate::scoring::*;
use crate::tables::*;
use anyhow::{bail, Context};
use dpca_common::data::normalize_row;
use dpca_common::dp::{NoisePlan, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::linalg::{centered_scatter, pca, pca_in_span};
use dpca_common::protocol::{ClassRows, Opened, Share};
use dpca_common::study::BlockShape;
use dpca_common::synth::{
    task_projection, to_original_units, CovarianceFit, FitKind, NoiseLevel, Synthesizer, Task,
};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rand_distr::StandardNormal;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Method {
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
    pub(crate) const SYNTHESIZED: [Method; 6] = [
        Method::PcaGauss,
        Method::PcaGauss2,
        Method::PcaGauss2K,
        Method::PubPca,
        Method::FullGauss,
        Method::RandomProj,
    ];

    pub(crate) fn name(&self) -> &'static str {
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
pub(crate) fn random_axes(m: usize, k: usize, rng: &mut ChaCha20Rng) -> DMatrix<f64> {
    let g = DMatrix::from_fn(m, k, |_, _| rng.sample::<f64, _>(StandardNormal));
    g.qr().q()
}

/// Synthetic training rows (normalized, preprocessed) and their class indices.
pub(crate) fn synthesize(
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

/// Features of the PCA (the study's columns, the label excluded in regression).
pub(crate) fn pca_dim(e: &Experiment) -> usize {
    e.bounds.len() - usize::from(e.task == Task::Regress)
}

/// Top-k components of the features block of an opened release.
pub(crate) fn components(opened: &Opened, n: u64, m: usize, k: usize) -> DMatrix<f64> {
    let cov = &opened.scatter / n as f64;
    pca(&cov.view((0, 0), (m, m)).into_owned(), k).components
}

/// Top-k components inside the span of `w` of a projected release.
pub(crate) fn components_in_span(
    opened: &Opened,
    n: u64,
    w: &DMatrix<f64>,
    k: usize,
) -> DMatrix<f64> {
    let m = w.nrows();
    let cov = (&opened.scatter / n as f64)
        .view((0, 0), (m, m))
        .into_owned();
    pca_in_span(&cov, Some(w), k).components
}

/// How the methods read the covariance from a release.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FitChoice {
    /// The reading for every method but full-gauss.
    pub(crate) kind: FitKind,
    /// Denoise full-gauss too (it is the paper's MODIPS comparison without).
    pub(crate) denoise_full_gauss: bool,
}

impl FitChoice {
    /// The reading of `method`'s release, whose scatter carries `noise`.
    pub(crate) fn of(&self, method: Method, noise: Option<NoiseLevel>) -> CovarianceFit {
        if method == Method::FullGauss && !self.denoise_full_gauss {
            return CovarianceFit::Paper;
        }
        self.kind.with(noise)
    }
}

/// One repetition of a method: its release(s), axes and synthetic rows, scored.
fn one_rep(
    rep: &Rep,
    method: Method,
    fit: FitChoice,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<f64> {
    let got = match method {
        Method::PcaGauss => rep.pca_gauss(rng),
        Method::FullGauss => rep.full_gauss(rng),
        Method::PubPca => rep.pub_pca(rng),
        Method::PcaGauss2 => rep.pca_gauss_2(rng)?,
        Method::RandomProj => rep.random_proj(rng),
        Method::PcaGauss2K => rep.pca_gauss_2k(rng)?,
        Method::Real => bail!("the real baseline is not synthesized"),
    };
    let fit = fit.of(method, got.noise);
    let (rows, ys) = synthesize(rep.e, &got.opened, got.n, &got.axes, fit, rng)?;
    score(rep.e, &rows, &ys, rng)
}

/// What one repetition of a method synthesizes from: the release it reads, the
/// axes its rows are drawn on, the row count it divides by, and its scatter's
/// noise level.
struct Released {
    opened: Opened,
    axes: DMatrix<f64>,
    n: u64,
    noise: Option<NoiseLevel>,
}

/// A method's study: the experiment, k, the budget and the pooled share.
pub(crate) struct Rep<'a> {
    pub(crate) e: &'a Experiment,
    pub(crate) k: usize,
    pub(crate) req: &'a PrivacyRequest,
    pub(crate) fixed: &'a FixedPoint,
    pub(crate) per_class: bool,
    pub(crate) pooled: &'a Share,
    pub(crate) shape: &'a BlockShape,
}

impl Rep<'_> {
    /// The noise level of a release's scatter block, from its plan.
    fn level(&self, plan: &NoisePlan, shape: &BlockShape) -> Option<NoiseLevel> {
        NoiseLevel::of(plan, self.fixed, shape.matrix_dim)
    }

    /// A release of the whole table at `req`.
    fn plain_release(&self, req: &PrivacyRequest, rng: &mut ChaCha20Rng) -> (Opened, NoisePlan) {
        release(self.pooled, self.shape, None, req, self.fixed, rng)
    }

    /// A study of `e`'s rows projected on `w`, at `req`: its share, shape and
    /// release.
    fn projected(
        &self,
        e: &Experiment,
        w: &DMatrix<f64>,
        req: &PrivacyRequest,
        rng: &mut ChaCha20Rng,
    ) -> (Share, BlockShape, Opened, NoisePlan) {
        let (share, shape, projection) = pooled_share(e, self.fixed, self.per_class, Some(w));
        let (opened, plan) = release(&share, &shape, projection.as_ref(), req, self.fixed, rng);
        (share, shape, opened, plan)
    }

    fn pca_gauss(&self, rng: &mut ChaCha20Rng) -> Released {
        let (opened, plan) = self.plain_release(self.req, rng);
        let axes = components(&opened, self.pooled.n, pca_dim(self.e), self.k);
        Released {
            opened,
            axes,
            n: self.pooled.n,
            noise: self.level(&plan, self.shape),
        }
    }

    fn full_gauss(&self, rng: &mut ChaCha20Rng) -> Released {
        let (opened, plan) = self.plain_release(self.req, rng);
        let m = pca_dim(self.e);
        Released {
            opened,
            axes: DMatrix::identity(m, m),
            n: self.pooled.n,
            noise: self.level(&plan, self.shape),
        }
    }

    /// The paper's Pub-PCA: a disjoint public part of the training rows gives the
    /// axes; the study runs on the rest, projected, with the whole budget.
    fn pub_pca(&self, rng: &mut ChaCha20Rng) -> Released {
        let (e, m) = (self.e, pca_dim(self.e));
        let cut = (e.train.len() as f64 * PUBLIC_SHARE).round() as usize;
        let public: Vec<Vec<f64>> = e.train[..cut].iter().map(|r| r[..m].to_vec()).collect();
        let w = pca(&(centered_scatter(&public) / cut as f64), self.k).components;
        let private = Experiment {
            train: e.train[cut..].to_vec(),
            train_y: e
                .train_y
                .get(cut..)
                .map(<[usize]>::to_vec)
                .unwrap_or_default(),
            ..e.clone()
        };
        let (share, pshape, opened, plan) = self.projected(&private, &w, self.req, rng);
        Released {
            axes: components_in_span(&opened, share.n, &w, self.k),
            opened,
            n: share.n,
            noise: self.level(&plan, &pshape),
        }
    }

    /// Round 1: a plain study at half the budget for the axes; round 2: R on them.
    fn pca_gauss_2(&self, rng: &mut ChaCha20Rng) -> anyhow::Result<Released> {
        let half = halves(self.req)?;
        let (first, _) = self.plain_release(&half, rng);
        let w = components(&first, self.pooled.n, pca_dim(self.e), self.k);
        let (share, pshape, opened, plan) = self.projected(self.e, &w, &half, rng);
        Ok(Released {
            axes: components_in_span(&opened, share.n, &w, self.k),
            opened,
            n: self.pooled.n,
            noise: self.level(&plan, &pshape),
        })
    }

    /// Random axes are public: the whole budget goes to R on them. The Blocki
    /// adaptation releases only projected data, so the class deviations from the
    /// global mean are kept in the random span too.
    fn random_proj(&self, rng: &mut ChaCha20Rng) -> Released {
        let w = random_axes(pca_dim(self.e), self.k, rng);
        let (_, pshape, mut opened, plan) = self.projected(self.e, &w, self.req, rng);
        if let (Some(stats), Some(mu)) = (opened.classes.as_mut(), opened.mean.as_ref()) {
            let p = &w * w.transpose();
            for mc in &mut stats.means {
                *mc = mu + &p * (&*mc - mu);
            }
        }
        Released {
            opened,
            axes: w,
            n: self.pooled.n,
            noise: self.level(&plan, &pshape),
        }
    }

    /// Round 1 as pca-gauss-2; round 2 releases only k-dimensional sums and
    /// scatters of W^T x; the global mean's part outside the span comes from
    /// round 1.
    fn pca_gauss_2k(&self, rng: &mut ChaCha20Rng) -> anyhow::Result<Released> {
        let (e, fixed) = (self.e, self.fixed);
        let half = halves(self.req)?;
        let (first, _) = self.plain_release(&half, rng);
        let w = components(&first, self.pooled.n, pca_dim(e), self.k);
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
            per_class_matrix: self.per_class,
            count_scale: fixed.norm_bound_int(),
        };
        let share = Share::from_split_rows(&rows, &rows, kk, (e.classes > 0).then_some(&cls));
        let kshape = BlockShape::new(kk, e.classes, self.per_class, fixed.norm_bound_int());
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
        Ok(Released {
            axes: components_in_span(&opened, share.n, &w, self.k),
            opened,
            n: self.pooled.n,
            noise: self.level(&plan, &kshape),
        })
    }
}

/// `reps` repetitions of `method` on `rep`'s study, the r-th seeded from
/// `base_seed + r`.
pub(crate) fn run_method(
    rep: &Rep,
    method: Method,
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
            one_rep(rep, method, fit, &mut rng)
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let (mean, sd) = summarize(&values);
    Ok(Cell {
        experiment: rep.e.name.clone(),
        metric: metric(rep.e.task),
        method,
        epsilon: Some(rep.req.epsilon),
        k: if method == Method::FullGauss {
            pca_dim(rep.e)
        } else {
            rep.k
        },
        reps,
        mean,
        sd,
        values,
    })
}
