//! Public axes a projected study's rows are projected onto.

/// Public axes the owners project their rows onto before forming R (the second
/// round of PCA-Gauss: Pub-PCA, or the components of an earlier study). The sums v
/// stay M-dimensional, so the mean is not lost outside the span.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    /// k orthonormal rows of M values: W^T.
    pub axes: Vec<Vec<f64>>,
}

impl Projection {
    /// Number of axes k.
    pub fn rank(&self) -> usize {
        self.axes.len()
    }

    /// W^T x, scaled back to norm `c` should rounding have pushed it past.
    pub fn apply(&self, x: &[f64], c: f64) -> Vec<f64> {
        let mut y: Vec<f64> = self
            .axes
            .iter()
            .map(|w| w.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect();
        crate::data::clip_to_norm(&mut y, c);
        y
    }
}
