//! Symmetric eigen-decomposition, PCA outputs and utility measures.
//!
//! The eigen-decomposition is faer's blocked, multi-threaded self-adjoint solver:
//! a study's M may run to thousands, where an unblocked one-thread solver (nalgebra's
//! `SymmetricEigen`) takes minutes (`cargo run --release -p dpca-bench --bin eigen`
//! measures both).

use faer::Side;
use nalgebra::DMatrix;

/// Principal components of a (noisy) scatter matrix.
#[derive(Clone, Debug)]
pub struct Pca {
    /// M x k matrix whose columns are unit eigenvectors, largest eigenvalue first.
    pub components: DMatrix<f64>,
    /// All eigenvalues, descending.
    pub eigenvalues: Vec<f64>,
    /// eigenvalue / (sum of the positive eigenvalues), descending.
    pub explained_ratio: Vec<f64>,
}

/// Eigenvalues (descending) and matching unit eigenvectors (columns) of a symmetric
/// matrix; only its lower triangle is read. A matrix with a non-finite entry, where
/// the solver cannot converge, yields NaN eigenpairs rather than a panic.
pub fn eigh_desc(s: &DMatrix<f64>) -> (Vec<f64>, DMatrix<f64>) {
    let m = s.nrows().min(s.ncols());
    let a = faer::Mat::<f64>::from_fn(m, m, |i, j| s[(i, j)]);
    let Ok(eig) = a.self_adjoint_eigen(Side::Lower) else {
        return (vec![f64::NAN; m], DMatrix::from_element(m, m, f64::NAN));
    };
    let (values, vectors) = (eig.S().column_vector(), eig.U());
    // faer returns ascending order.
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    let desc = order.iter().map(|&i| values[i]).collect();
    let vecs = DMatrix::from_fn(m, m, |r, c| vectors[(r, order[c])]);
    (desc, vecs)
}

/// The smallest eigenvalue of a symmetric matrix (lower triangle read), without
/// its eigenvector: NaN where the solver cannot converge, 0 for an empty one.
pub fn smallest_eigenvalue(s: &DMatrix<f64>) -> f64 {
    let m = s.nrows().min(s.ncols());
    let a = faer::Mat::<f64>::from_fn(m, m, |i, j| s[(i, j)]);
    match a.self_adjoint_eigenvalues(Side::Lower) {
        // faer returns ascending order.
        Ok(values) => values.first().copied().unwrap_or(0.0),
        Err(_) => f64::NAN,
    }
}

/// Top-k PCA of the covariance `cov` inside the span of the orthonormal columns of
/// `span`, in the full coordinates: a projected study knows the variance inside
/// the span only. Plain [`pca`] without a span.
pub fn pca_in_span(cov: &DMatrix<f64>, span: Option<&DMatrix<f64>>, k: usize) -> Pca {
    match span {
        Some(w) => {
            let inner = pca(&(w.transpose() * cov * w), k);
            Pca {
                components: w * &inner.components,
                ..inner
            }
        }
        None => pca(cov, k),
    }
}

/// Top-k principal components of a symmetric matrix. Each component's sign is fixed
/// so that its largest-magnitude entry is positive, for reproducible outputs.
pub fn pca(s: &DMatrix<f64>, k: usize) -> Pca {
    let (values, vectors) = eigh_desc(s);
    let k = k.min(values.len());
    let mut components = vectors.columns(0, k).into_owned();
    for mut col in components.column_iter_mut() {
        let (idx, _) = col.iter().enumerate().fold((0, 0.0f64), |acc, (i, &x)| {
            if x.abs() > acc.1 {
                (i, x.abs())
            } else {
                acc
            }
        });
        if col[idx] < 0.0 {
            col.neg_mut();
        }
    }
    let positive: f64 = values.iter().filter(|&&v| v > 0.0).sum();
    let explained_ratio = values
        .iter()
        .map(|&v| if positive > 0.0 { v / positive } else { 0.0 })
        .collect();
    Pca {
        components,
        eigenvalues: values,
        explained_ratio,
    }
}

/// Projection onto the PSD cone: negative eigenvalues clipped to zero. Pure
/// post-processing of the released matrix, so it costs no privacy.
pub fn psd_repair(s: &DMatrix<f64>) -> DMatrix<f64> {
    let (values, vectors) = eigh_desc(s);
    let clipped = nalgebra::DVector::from_iterator(values.len(), values.iter().map(|v| v.max(0.0)));
    &vectors * DMatrix::from_diagonal(&clipped) * vectors.transpose()
}

/// Centered scatter sum (x - mean)(x - mean)^T of rows, in f64 (plaintext reference).
pub fn centered_scatter(rows: &[Vec<f64>]) -> DMatrix<f64> {
    let m = rows.first().map(|r| r.len()).unwrap_or(0);
    let x = DMatrix::from_fn(rows.len(), m, |i, j| rows[i][j]);
    let mean = x.row_mean();
    let centered = DMatrix::from_fn(rows.len(), m, |i, j| x[(i, j)] - mean[j]);
    centered.transpose() * centered
}

/// Captured variance tr(V^T S V) / tr(U^T S U) of components V against the true top-k
/// eigenvectors U of the true scatter S (1 is perfect).
pub fn captured_variance(s_true: &DMatrix<f64>, v: &DMatrix<f64>) -> f64 {
    let k = v.ncols();
    let (values, _) = eigh_desc(s_true);
    let best: f64 = values.iter().take(k).sum();
    let got = (v.transpose() * s_true * v).trace();
    if best > 0.0 {
        got / best
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pca_recovers_known_axes() {
        let s = DMatrix::from_row_slice(3, 3, &[4.0, 0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 1.0]);
        let p = pca(&s, 2);
        assert_eq!(p.eigenvalues, vec![9.0, 4.0, 1.0]);
        assert!((p.components[(1, 0)] - 1.0).abs() < 1e-12);
        assert!((p.components[(0, 1)] - 1.0).abs() < 1e-12);
        assert!((p.explained_ratio[0] - 9.0 / 14.0).abs() < 1e-12);
        assert!((captured_variance(&s, &p.components) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn psd_repair_clips_negative_eigenvalues() {
        let s = DMatrix::from_row_slice(2, 2, &[1.0, 2.0, 2.0, 1.0]); // eigenvalues 3, -1
        let r = psd_repair(&s);
        let (values, _) = eigh_desc(&r);
        assert!((values[0] - 3.0).abs() < 1e-9 && values[1].abs() < 1e-9);
    }

    #[test]
    fn agrees_with_nalgebra_on_random_symmetric_matrices() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        for m in [1usize, 2, 17, 80] {
            let a = DMatrix::from_fn(m, m, |_, _| rng.gen_range(-1.0..1.0));
            let s = &a + a.transpose();
            let (values, vectors) = eigh_desc(&s);
            let mut reference: Vec<f64> = nalgebra::SymmetricEigen::new(s.clone())
                .eigenvalues
                .iter()
                .copied()
                .collect();
            reference.sort_by(|a, b| b.total_cmp(a));
            for (x, y) in values.iter().zip(&reference) {
                assert!((x - y).abs() < 1e-9, "m {m}: {x} vs {y}");
            }
            // S V = V diag(values), V orthonormal.
            let lambda = DMatrix::from_diagonal(&nalgebra::DVector::from_vec(values.clone()));
            assert!((&s * &vectors - &vectors * lambda).amax() < 1e-9, "m {m}");
            let gram = vectors.transpose() * &vectors;
            assert!((gram - DMatrix::identity(m, m)).amax() < 1e-9, "m {m}");
        }
    }

    #[test]
    fn non_finite_input_gives_nan_not_panic() {
        let s = DMatrix::from_row_slice(2, 2, &[1.0, f64::NAN, f64::NAN, 1.0]);
        let (values, _) = eigh_desc(&s);
        assert!(values.iter().any(|v| v.is_nan()));
    }

    #[test]
    fn scatter_matches_definition() {
        let rows = vec![vec![1.0, 2.0], vec![3.0, 6.0]];
        let s = centered_scatter(&rows);
        // mean (2, 4); deviations (-1,-2), (1,2)
        assert_eq!(s, DMatrix::from_row_slice(2, 2, &[2.0, 4.0, 4.0, 8.0]));
    }
}
