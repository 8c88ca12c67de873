//! The row-norm histogram study that chooses the row-norm bound C.

use super::{param, SpecDraft, SpecError};
use crate::dp::Centering;

/// A row-norm histogram study: instead of its rows, each owner sends one-hot rows
/// that mark the bin of each row's L2 norm (after the public bounds, before any
/// clipping), so the release is a DP histogram of the norms from which the user picks
/// the row-norm bound C of the real study (a DP quantile).
///
/// The study's own features are the bins, with bounds [-1, 1] (the identity
/// normalization) and C = 1: a one-hot row has norm exactly 1, so the ordinary
/// `dp-mean` sensitivities of a unit-norm study cover it, and replacing one data row
/// replaces one one-hot row. Bin b counts the norms in \[edges\[b\], edges\[b + 1\]); the
/// last bin is open above.
#[derive(Clone, Debug, PartialEq)]
pub struct NormBins {
    /// The data columns the owners read (the real study's features).
    pub features: Vec<String>,
    /// Their public bounds.
    pub bounds: Vec<(f64, f64)>,
    /// Lower edges of the bins, starting at 0, strictly increasing.
    pub edges: Vec<f64>,
}

/// Most bins a row-norm histogram may have.
pub const MAX_NORM_BINS: usize = 64;

/// The largest norm a normalized row of `m` values can have (each at -1 or 1).
fn max_norm(m: usize) -> f64 {
    (m as f64).sqrt()
}

/// Bins of the standard row-norm histogram ([`NormBins::standard`]).
pub const STANDARD_NORM_BINS: usize = MAX_NORM_BINS;

impl NormBins {
    /// The histogram `user local --row-norm-quantile` runs: [`STANDARD_NORM_BINS`]
    /// geometric bins from sqrt(M) / 64 up to sqrt(M), about 7% apart, so the
    /// chosen C is at most that far above the quantile (norms tend to bunch: on
    /// optdigits 80% of them lie within 9% of each other).
    pub fn standard(features: Vec<String>, bounds: Vec<(f64, f64)>) -> Self {
        let lo = max_norm(features.len()) / 64.0;
        Self::geometric(features, bounds, lo, STANDARD_NORM_BINS)
    }

    /// Geometric bins from `lo` up to the largest norm possible, sqrt(M) (every
    /// value at a bound), with a first bin [0, lo).
    pub fn geometric(features: Vec<String>, bounds: Vec<(f64, f64)>, lo: f64, bins: usize) -> Self {
        let top = max_norm(features.len());
        let ratio = (top / lo).powf(1.0 / (bins.saturating_sub(2).max(1)) as f64);
        let mut edges = vec![0.0];
        edges.extend((0..bins.saturating_sub(1)).map(|i| lo * ratio.powi(i as i32)));
        Self {
            features,
            bounds,
            edges,
        }
    }

    /// The bin names, which are the histogram study's features.
    pub fn bin_names(&self) -> Vec<String> {
        self.edges
            .iter()
            .enumerate()
            .map(|(i, lo)| match self.edges.get(i + 1) {
                Some(hi) => format!("norm [{lo:.4}, {hi:.4})"),
                None => format!("norm >= {lo:.4}"),
            })
            .collect()
    }

    /// The bin of a norm.
    pub fn bin_of(&self, norm: f64) -> usize {
        self.edges.iter().rposition(|&e| norm >= e).unwrap_or(0)
    }

    /// The one-hot row an owner sends for a data row: 1 in the bin of its norm after
    /// the public bounds (unclipped), 0 elsewhere.
    pub fn one_hot(&self, row: &[f64]) -> Vec<f64> {
        let (x, _) = crate::data::normalize_row(row, &self.bounds, f64::INFINITY);
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut out = vec![0.0; self.edges.len()];
        out[self.bin_of(norm)] = 1.0;
        out
    }

    /// The q-quantile of the norms from noisy counts (negative counts taken as 0):
    /// the upper edge of the first bin where the cumulative count reaches q of the
    /// total, sqrt(M) for the open last bin. Rounding up to an edge clips at most
    /// the share 1 - q of the rows, up to the noise.
    pub fn quantile(&self, counts: &[f64], q: f64) -> f64 {
        let top = max_norm(self.features.len());
        let clipped: Vec<f64> = counts.iter().map(|c| c.max(0.0)).collect();
        let total: f64 = clipped.iter().sum();
        if total <= 0.0 {
            return top;
        }
        let mut acc = 0.0;
        for (b, c) in clipped.iter().enumerate() {
            acc += c;
            if acc >= q * total {
                return self.edges.get(b + 1).copied().unwrap_or(top);
            }
        }
        top
    }

    pub(super) fn validate(&self, spec: &SpecDraft) -> Result<(), SpecError> {
        let b = self.edges.len();
        if !(2..=MAX_NORM_BINS).contains(&b) {
            return Err(param(
                "norm_bins",
                format!("needs 2..={MAX_NORM_BINS} bins, got {b}"),
            ));
        }
        if self.edges[0] != 0.0
            || self
                .edges
                .windows(2)
                .any(|w| !(w[1].is_finite() && w[1] > w[0]))
        {
            return Err(param(
                "norm_bins",
                "edges must start at 0 and increase strictly",
            ));
        }
        if self.features.is_empty() || self.bounds.len() != self.features.len() {
            return Err(param(
                "norm_bins",
                format!(
                    "{} data features but {} bounds",
                    self.features.len(),
                    self.bounds.len()
                ),
            ));
        }
        // An infinite bound made every row's norm NaN, counted silently in the
        // first bin.
        super::spec::check_intervals(&self.features, &self.bounds)
            .map_err(|e| param("norm_bins", e))?;
        if spec.features != self.bin_names()
            || spec.bounds.iter().any(|&b| b != (-1.0, 1.0))
            || spec.fixed.row_norm_bound != 1.0
        {
            return Err(param(
                "norm_bins",
                "a histogram study's features must be its bins, with bounds [-1, 1] and C = 1",
            ));
        }
        if spec.privacy.centering != Centering::DpMean
            || spec.classes.is_some()
            || spec.projection.is_some()
            || !spec.privacy.mechanism.proven()
        {
            return Err(param(
                "norm_bins",
                "a histogram study is a plain `dp-mean` study (gaussian or laplace): no classes, no projection",
            ));
        }
        Ok(())
    }
}
