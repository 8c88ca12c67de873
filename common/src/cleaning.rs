//! Null-space cleaning: privacy of a feature vector at prediction time (Xu, Shah,
//! Cao, Maung, Schweitzer, "Enhancing the Privacy of Predictors"; docs/CLEANING.md).
//!
//! A predictor of the desired labels starts with a known linear map
//! y_d = A_d^T x. A linear predictor of the confidential labels, y_c = A_c^T x, is
//! fitted by least squares. Cleaning removes components of x in the directions of
//! the generalized eigenproblem B_d v = gamma B_c v (B = A A^T), smallest gamma
//! first: those move the desired prediction least per unit they move the
//! confidential one. It stops when e_utility = |A_d^T (x - x~)|^2 equals the
//! requested epsilon exactly, the last component removed in part (the paper's
//! Algorithm 1 and Theorem 1).
//!
//! This is not differential privacy: it protects against one known linear
//! adversary and, with less margin, against one that re-trains on cleaned data (the
//! paper's attack), and promises nothing about others.
//!
//! # The solver
//! B_c has rank at most N_c, so it is singular whenever there are more features
//! than confidential labels, which is the usual case. Instead of B_c^-1 B_d, the
//! pencil is solved on B = B_d + B_c:
//! - whiten the range of B (eigenvalues above a relative tolerance);
//! - take the eigenvectors of W^T B_d W, with theta = lambda_d / (lambda_d + lambda_c)
//!   in [0, 1], so gamma = theta / (1 - theta) is in the same order;
//! - directions in the null space of B move neither prediction (theta = 0). They
//!   are removed first, at no cost. That is also the exact null-space variant's
//!   choice.
//!
//! Each direction is then scaled to unit length: a_i = v_i^T x is the coefficient
//! the paper removes. The directions stay B_d- and B_c-orthogonal, which is all
//! Theorem 1 needs.

use nalgebra::{DMatrix, DVector};

use crate::linalg::eigh_desc;

/// Why a cleaning problem cannot be solved.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CleaningError {
    /// No features at all.
    #[error("no features: the predictors have no rows")]
    NoFeatures,
    /// Matrices of incompatible shapes.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A non-finite input.
    #[error("{0} holds a value that is not a finite number")]
    NotFinite(&'static str),
    /// A_c is zero: no linear predictor of the confidential labels to clean against.
    #[error(
        "the confidential predictor A_c is zero (B_c = 0): the confidential labels are \
         not linearly predictable from these features, so there is nothing to clean against"
    )]
    NoConfidentialSignal,
    /// A_d is zero: the desired predictor ignores the features.
    #[error("the desired predictor A_d is zero (B_d = 0): it ignores the features")]
    NoDesiredSignal,
    /// epsilon is not positive.
    #[error(
        "epsilon must be > 0, got {0} (the exact null-space variant removes only what costs nothing)"
    )]
    Epsilon(f64),
    /// Removing every component still costs less than epsilon.
    #[error(
        "epsilon {epsilon} exceeds what removing every component costs this vector ({total}): \
         e_utility cannot reach it"
    )]
    EpsilonTooLarge {
        /// The epsilon asked for.
        epsilon: f64,
        /// The e_utility of removing every component.
        total: f64,
    },
    /// Least squares on a table without enough rows.
    #[error("least squares: {0}")]
    LeastSquares(String),
}

/// The directions of a cleaning problem, ordered by increasing gamma.
#[derive(Clone, Debug)]
pub struct Cleaner {
    /// n x n, unit columns v_1 .. v_n.
    pub directions: DMatrix<f64>,
    /// lambda_i^d = v_i^T B_d v_i.
    pub lambda_d: Vec<f64>,
    /// lambda_i^c = v_i^T B_c v_i.
    pub lambda_c: Vec<f64>,
    /// theta_i = lambda_d / (lambda_d + lambda_c) in [0, 1] (0 where both vanish):
    /// gamma_i = theta_i / (1 - theta_i), in the same order.
    pub theta: Vec<f64>,
}

/// A cleaned vector and what cleaning it cost and bought.
#[derive(Clone, Debug)]
pub struct Cleaned {
    /// The cleaned feature vector x~.
    pub x: DVector<f64>,
    /// Components removed (the last one maybe in part).
    pub removed: usize,
    /// The fraction alpha of the last component removed (1 when whole).
    pub alpha_last: f64,
    /// |A_d^T (x - x~)|^2 by Theorem 1's sum (equals epsilon).
    pub e_utility: f64,
    /// |A_c^T (x - x~)|^2 by the same sum.
    pub e_privacy: f64,
}

/// Relative tolerance below which an eigenvalue of B = B_d + B_c counts as zero.
const RANK_TOL: f64 = 1e-10;

fn check_finite(m: &DMatrix<f64>, what: &'static str) -> Result<(), CleaningError> {
    if m.iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(CleaningError::NotFinite(what))
    }
}

impl Cleaner {
    /// Solves the generalized eigenproblem of `a_d` (n x N_d) and `a_c` (n x N_c).
    pub fn new(a_d: &DMatrix<f64>, a_c: &DMatrix<f64>) -> Result<Self, CleaningError> {
        let n = a_d.nrows();
        if n == 0 {
            return Err(CleaningError::NoFeatures);
        }
        if a_c.nrows() != n {
            return Err(CleaningError::Shape(format!(
                "A_d has {n} feature rows, A_c {}",
                a_c.nrows()
            )));
        }
        check_finite(a_d, "A_d")?;
        check_finite(a_c, "A_c")?;
        let b_d = a_d * a_d.transpose();
        let b_c = a_c * a_c.transpose();
        let scale = |b: &DMatrix<f64>| b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        if scale(&b_c) == 0.0 {
            return Err(CleaningError::NoConfidentialSignal);
        }
        if scale(&b_d) == 0.0 {
            return Err(CleaningError::NoDesiredSignal);
        }
        let b = &b_d + &b_c;
        let (values, q) = eigh_desc(&b);
        let top = values.first().copied().unwrap_or(0.0);
        let r = values.iter().take_while(|&&l| l > RANK_TOL * top).count();
        // Whitened range of B: W^T B W = I.
        let w = DMatrix::from_fn(n, r, |i, j| q[(i, j)] / values[j].sqrt());
        let c = w.transpose() * &b_d * &w;
        let c = (&c + c.transpose()) * 0.5;
        let (thetas, u) = eigh_desc(&c);
        // (direction, theta): the common null space first, free to remove and
        // gaining nothing on A_c either (its theta is 0/0, taken as 0, not read off
        // rounding noise); then the range in ascending theta.
        let mut dirs: Vec<(DVector<f64>, f64)> = Vec::with_capacity(n);
        for j in r..n {
            dirs.push((q.column(j).into_owned(), 0.0));
        }
        let range = &w * &u;
        for j in (0..r).rev() {
            dirs.push((range.column(j).into_owned(), thetas[j].clamp(0.0, 1.0)));
        }
        let mut directions = DMatrix::zeros(n, n);
        let (mut lambda_d, mut lambda_c, mut theta) = (vec![], vec![], vec![]);
        for (j, (v, t)) in dirs.iter().enumerate() {
            let v = v / v.norm();
            lambda_d.push((a_d.transpose() * &v).norm_squared());
            lambda_c.push((a_c.transpose() * &v).norm_squared());
            theta.push(*t);
            directions.set_column(j, &v);
        }
        Ok(Self {
            directions,
            lambda_d,
            lambda_c,
            theta,
        })
    }

    /// The number of features, if `x` has that many.
    fn check_len(&self, x: &DVector<f64>) -> Result<usize, CleaningError> {
        let n = self.directions.nrows();
        if x.len() != n {
            return Err(CleaningError::Shape(format!(
                "the vector has {} features, the predictor {n}",
                x.len()
            )));
        }
        Ok(n)
    }

    /// Cleans `x` until e_utility = `epsilon` exactly (the paper's Algorithm 1).
    pub fn clean(&self, x: &DVector<f64>, epsilon: f64) -> Result<Cleaned, CleaningError> {
        let n = self.check_len(x)?;
        if !x.iter().all(|v| v.is_finite()) {
            return Err(CleaningError::NotFinite("the feature vector"));
        }
        if !(epsilon > 0.0 && epsilon.is_finite()) {
            return Err(CleaningError::Epsilon(epsilon));
        }
        let a: Vec<f64> = (0..n).map(|i| self.directions.column(i).dot(x)).collect();
        let delta: Vec<f64> = (0..n).map(|i| self.lambda_d[i] * a[i] * a[i]).collect();
        let total: f64 = delta.iter().sum();
        // t: the most components whose whole removal stays below epsilon.
        let mut sum = 0.0;
        let mut t = 0;
        while t < n && sum + delta[t] < epsilon {
            sum += delta[t];
            t += 1;
        }
        if t == n {
            return Err(CleaningError::EpsilonTooLarge { epsilon, total });
        }
        // delta[t] > 0: sum + delta[t] >= epsilon > sum.
        let alpha = ((epsilon - sum) / delta[t]).sqrt();
        let mut out = x.clone();
        let mut e_privacy = 0.0;
        for i in 0..=t {
            let f = if i == t { alpha } else { 1.0 };
            out.axpy(-f * a[i], &self.directions.column(i), 1.0);
            e_privacy += self.lambda_c[i] * f * f * a[i] * a[i];
        }
        Ok(Cleaned {
            x: out,
            removed: t + 1,
            alpha_last: alpha,
            e_utility: sum + alpha * alpha * delta[t],
            e_privacy,
        })
    }

    /// Removes every component (what [`Cleaner::clean`] refuses to go past): the
    /// most a vector can be cleaned, at e_utility = the sum of all its deltas.
    pub fn clean_all(&self, x: &DVector<f64>) -> Result<Cleaned, CleaningError> {
        self.remove_where(x, |_| true)
    }

    /// Removes the components `keep_out(i)` selects, whole.
    fn remove_where(
        &self,
        x: &DVector<f64>,
        keep_out: impl Fn(usize) -> bool,
    ) -> Result<Cleaned, CleaningError> {
        let n = self.check_len(x)?;
        let mut out = x.clone();
        let (mut removed, mut e_utility, mut e_privacy) = (0, 0.0, 0.0);
        for i in (0..n).filter(|&i| keep_out(i)) {
            let a = self.directions.column(i).dot(x);
            out.axpy(-a, &self.directions.column(i), 1.0);
            e_utility += self.lambda_d[i] * a * a;
            e_privacy += self.lambda_c[i] * a * a;
            removed += 1;
        }
        Ok(Cleaned {
            x: out,
            removed,
            alpha_last: 1.0,
            e_utility,
            e_privacy,
        })
    }

    /// The exact null-space variant: removes every direction the desired predictor
    /// does not see (lambda_d below `tol` times the largest), at no cost in utility.
    pub fn clean_null_space(&self, x: &DVector<f64>, tol: f64) -> Result<Cleaned, CleaningError> {
        let top = self.lambda_d.iter().fold(0.0f64, |m, &l| m.max(l));
        self.remove_where(x, |i| self.lambda_d[i] <= tol * top)
    }
}

/// Each row of `x` cleaned to `epsilon` (`None`: the exact null-space variant). A
/// row whose every component costs less than epsilon loses them all; the second
/// value counts those rows.
pub fn clean_rows(
    cleaner: &Cleaner,
    x: &DMatrix<f64>,
    epsilon: Option<f64>,
) -> Result<(DMatrix<f64>, usize), CleaningError> {
    let mut out = x.clone();
    let mut below = 0;
    for i in 0..x.nrows() {
        let row = x.row(i).transpose();
        let cleaned = match epsilon {
            None => cleaner.clean_null_space(&row, NULL_TOL)?,
            Some(e) => match cleaner.clean(&row, e) {
                Err(CleaningError::EpsilonTooLarge { .. }) => {
                    below += 1;
                    cleaner.clean_all(&row)?
                }
                other => other?,
            },
        };
        out.set_row(i, &cleaned.x.transpose());
    }
    Ok((out, below))
}

/// lambda_d below this share of the largest counts as the desired predictor's
/// null space.
pub const NULL_TOL: f64 = 1e-9;

/// Complete privacy for one vector: the confidential prediction from the cleaned
/// vector errs more than the mean vector's (centered coordinates: the mean vector
/// predicts 0).
pub fn complete_privacy(prediction: &DVector<f64>, truth: &DVector<f64>) -> bool {
    (prediction - truth).norm_squared() > truth.norm_squared()
}

/// Means over a set of cleaned vectors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scores {
    /// Mean |A_d^T (x - x~)|^2.
    pub e_utility: f64,
    /// Mean |f_c^T x~ - A_c^T x|^2: how far the confidential prediction moved from
    /// what the raw vector gives.
    pub e_privacy: f64,
    /// Share of vectors with [`complete_privacy`].
    pub complete_privacy: f64,
}

/// Scores cleaned rows (`cleaned`, from the rows of `x`; centered features) when
/// the adversary predicts with `f_c`: A_c itself, or what [`attack`] re-fits. `y_c`
/// holds the true confidential labels, centered.
pub fn score(
    a_d: &DMatrix<f64>,
    a_c: &DMatrix<f64>,
    f_c: &DMatrix<f64>,
    x: &DMatrix<f64>,
    cleaned: &DMatrix<f64>,
    y_c: &DMatrix<f64>,
) -> Scores {
    let n = x.nrows().max(1) as f64;
    let pred = cleaned * f_c;
    let cp = (0..x.nrows())
        .filter(|&i| complete_privacy(&pred.row(i).transpose(), &y_c.row(i).transpose()))
        .count();
    Scores {
        e_utility: ((x - cleaned) * a_d).norm_squared() / n,
        e_privacy: (&pred - x * a_c).norm_squared() / n,
        complete_privacy: cp as f64 / n,
    }
}

/// The paper's attack: the adversary knows the cleaner, cleans the training rows
/// the same way and re-fits its predictor of the confidential labels on them.
pub fn attack(
    cleaner: &Cleaner,
    x_train: &DMatrix<f64>,
    y_c_train: &DMatrix<f64>,
    epsilon: Option<f64>,
) -> Result<DMatrix<f64>, CleaningError> {
    let (cleaned, _) = clean_rows(cleaner, x_train, epsilon)?;
    least_squares(&cleaned, y_c_train)
}

/// Unit Laplace noise, one value per cell (the comparison of the paper's Figure 3).
pub fn laplace_noise(rng: &mut impl rand::Rng, rows: usize, cols: usize) -> DMatrix<f64> {
    DMatrix::from_fn(rows, cols, |_, _| {
        let u: f64 = rng.gen_range(-0.5..0.5);
        -u.signum() * (1.0 - 2.0 * u.abs()).ln()
    })
}

/// The scale b at which `unit_noise` * b moves the desired prediction by `epsilon`
/// on average over its rows: the Laplace mechanism tuned to the same e_utility
/// (exactly, for this draw: e_utility grows as b^2).
pub fn laplace_scale(
    a_d: &DMatrix<f64>,
    unit_noise: &DMatrix<f64>,
    epsilon: f64,
) -> Result<f64, CleaningError> {
    if !(epsilon > 0.0 && epsilon.is_finite()) {
        return Err(CleaningError::Epsilon(epsilon));
    }
    let unit = (unit_noise * a_d).norm_squared() / unit_noise.nrows().max(1) as f64;
    if unit <= 0.0 {
        return Err(CleaningError::NoDesiredSignal);
    }
    Ok((epsilon / unit).sqrt())
}

/// The least-squares map A (n x k) with y ~ A^T x for the rows of `x` (rows x n)
/// and `y` (rows x k), minimum-norm where x is rank deficient. No intercept: center
/// both first for an affine fit.
pub fn least_squares(x: &DMatrix<f64>, y: &DMatrix<f64>) -> Result<DMatrix<f64>, CleaningError> {
    if x.nrows() != y.nrows() {
        return Err(CleaningError::Shape(format!(
            "{} rows of features, {} of labels",
            x.nrows(),
            y.nrows()
        )));
    }
    if x.nrows() == 0 || x.ncols() == 0 {
        return Err(CleaningError::LeastSquares("no rows or no features".into()));
    }
    check_finite(x, "the training features")?;
    check_finite(y, "the training labels")?;
    let svd = x.clone().svd(true, true);
    let top = svd.singular_values.max();
    svd.solve(y, RANK_TOL.sqrt() * top.max(f64::MIN_POSITIVE))
        .map_err(|e| CleaningError::LeastSquares(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The paper's toy: y_d = x1 - x2, y_c = x1 + 2 x2, three rows.
    fn toy() -> (DMatrix<f64>, DMatrix<f64>, DMatrix<f64>) {
        let x = DMatrix::from_row_slice(3, 2, &[3.0, 1.0, 4.0, 2.0, 5.0, 1.0]);
        let a_d = DMatrix::from_column_slice(2, 1, &[1.0, -1.0]);
        let y_c = DMatrix::from_column_slice(3, 1, &[5.0, 8.0, 7.0]);
        (x, a_d, y_c)
    }

    #[test]
    fn the_papers_toy_example_is_cleaned_as_the_paper_shows() {
        let (x, a_d, y_c) = toy();
        let a_c = least_squares(&x, &y_c).expect("fit");
        assert!((a_c[(0, 0)] - 1.0).abs() < 1e-9 && (a_c[(1, 0)] - 2.0).abs() < 1e-9);
        let cleaner = Cleaner::new(&a_d, &a_c).expect("cleaner");
        let expect = [[1.0, -1.0], [1.0, -1.0], [2.0, -2.0]];
        for (i, want) in expect.iter().enumerate() {
            let row = x.row(i).transpose();
            let got = cleaner.clean_null_space(&row, 1e-9).expect("clean");
            assert!(
                (got.x[0] - want[0]).abs() < 1e-9 && (got.x[1] - want[1]).abs() < 1e-9,
                "row {i}: {:?}",
                got.x
            );
            assert_eq!(got.removed, 1);
            assert!(got.e_utility < 1e-18, "the desired prediction is unchanged");
        }
        // Rows 1 and 2 now look the same, with y_c 5 and 8: y_c is lost.
        // Algorithm 1 removes the free direction first, then part of the next.
        let got = cleaner.clean(&x.row(0).transpose(), 0.5).expect("clean");
        assert_eq!(got.removed, 2);
        assert!((got.e_utility - 0.5).abs() < 1e-12);
        let moved = (a_d.transpose() * (x.row(0).transpose() - &got.x)).norm_squared();
        assert!((moved - 0.5).abs() < 1e-12, "{moved}");
    }

    #[test]
    fn degenerate_problems_are_refused_by_name() {
        let a_d = DMatrix::from_column_slice(2, 1, &[1.0, -1.0]);
        let zero = DMatrix::zeros(2, 1);
        assert_eq!(
            Cleaner::new(&a_d, &zero).err(),
            Some(CleaningError::NoConfidentialSignal)
        );
        assert_eq!(
            Cleaner::new(&zero, &a_d).err(),
            Some(CleaningError::NoDesiredSignal)
        );
        assert_eq!(
            Cleaner::new(&DMatrix::zeros(0, 1), &DMatrix::zeros(0, 1)).err(),
            Some(CleaningError::NoFeatures)
        );
        let mut bad = a_d.clone();
        bad[(0, 0)] = f64::NAN;
        assert_eq!(
            Cleaner::new(&bad, &a_d).err(),
            Some(CleaningError::NotFinite("A_d"))
        );
        let c = Cleaner::new(&a_d, &DMatrix::from_column_slice(2, 1, &[1.0, 2.0])).expect("ok");
        let x = DVector::from_vec(vec![3.0, 1.0]);
        // Removing everything moves y_d by (3 - 1)^2 = 4 at most... along these axes.
        let err = c.clean(&x, 1e6).expect_err("too large");
        assert!(
            matches!(err, CleaningError::EpsilonTooLarge { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("1000000"), "{err}");
        assert_eq!(c.clean(&x, 0.0).err(), Some(CleaningError::Epsilon(0.0)));
        assert!(matches!(
            c.clean(&DVector::zeros(3), 0.1),
            Err(CleaningError::Shape(_))
        ));
        // Past the total, clean_all is the most there is, at e_utility = the total.
        let all = c.clean_all(&x).expect("all");
        assert_eq!(all.removed, 2);
        let moved = (a_d.transpose() * (&x - &all.x)).norm_squared();
        assert!(
            (moved - all.e_utility).abs() < 1e-9,
            "{moved} vs {}",
            all.e_utility
        );
        // A zero vector has nothing to remove: any epsilon is too large.
        assert!(matches!(
            c.clean(&DVector::zeros(2), 0.1),
            Err(CleaningError::EpsilonTooLarge { total, .. }) if total == 0.0
        ));
    }

    #[test]
    fn scores_of_the_toy_example_show_the_lost_label() {
        let (x, a_d, y_c) = toy();
        let a_c = least_squares(&x, &y_c).expect("fit");
        let cleaner = Cleaner::new(&a_d, &a_c).expect("cleaner");
        let (cleaned, below) = clean_rows(&cleaner, &x, None).expect("clean");
        assert_eq!(below, 0);
        let s = score(&a_d, &a_c, &a_c, &x, &cleaned, &y_c);
        assert!(s.e_utility < 1e-18);
        // Removing (1,1)/sqrt2 moves y_c = x1 + 2 x2 by 3 a / sqrt2 with a = (x1 +
        // x2) / sqrt2: by 6, 9 and 9, squared 36, 81, 81.
        assert!(
            (s.e_privacy - (36.0 + 81.0 + 81.0) / 3.0).abs() < 1e-9,
            "{s:?}"
        );
        // Predictions -1, -1, -2 against 5, 8, 7: all worse than predicting 0.
        assert_eq!(s.complete_privacy, 1.0);
        // The attacker re-fits on the cleaned rows: y_c is no function of them.
        let f = attack(&cleaner, &x, &y_c, None).expect("attack");
        let s = score(&a_d, &a_c, &f, &x, &cleaned, &y_c);
        assert!(s.e_privacy > 1.0, "{s:?}");
    }

    #[test]
    fn laplace_noise_is_scaled_to_the_same_e_utility() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let noise = laplace_noise(&mut rng, 500, 3);
        let a_d = DMatrix::from_column_slice(3, 1, &[1.0, -2.0, 0.5]);
        let b = laplace_scale(&a_d, &noise, 0.01).expect("scale");
        let moved = (&noise * b * &a_d).norm_squared() / 500.0;
        assert!((moved - 0.01).abs() < 1e-12, "{moved}");
        // Unit Laplace: variance 2.
        let var = noise.iter().map(|v| v * v).sum::<f64>() / 1500.0;
        assert!((var - 2.0).abs() < 0.3, "{var}");
        assert_eq!(
            laplace_scale(&DMatrix::zeros(3, 1), &noise, 0.01).err(),
            Some(CleaningError::NoDesiredSignal)
        );
    }

    fn matrix(rows: usize, cols: usize) -> impl Strategy<Value = DMatrix<f64>> {
        proptest::collection::vec(-3.0f64..3.0, rows * cols)
            .prop_map(move |v| DMatrix::from_vec(rows, cols, v))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Theorem 1 on random problems, B_c singular (N_c < n) included:
        /// |A_d^T (x - x~)|^2 equals epsilon, and the direct e_privacy matches the sum.
        #[test]
        fn e_utility_equals_epsilon(
            (n, nd, nc) in (2usize..9, 1usize..4, 1usize..4),
            seed in proptest::collection::vec(-3.0f64..3.0, 200),
            frac in 0.01f64..0.99,
        ) {
            let take = |k: usize, off: usize| DMatrix::from_fn(n, k, |i, j| seed[(off + i * k + j) % 200]
                + 0.01 * (i as f64 + 1.0) * (j as f64 + 2.0).sin());
            let a_d = take(nd, 0);
            let a_c = take(nc, 70);
            let x = DVector::from_fn(n, |i, _| seed[(150 + i) % 200] + 0.5);
            let cleaner = Cleaner::new(&a_d, &a_c).expect("cleaner");
            let total: f64 = (0..n).map(|i| {
                let a = cleaner.directions.column(i).dot(&x);
                cleaner.lambda_d[i] * a * a
            }).sum();
            prop_assume!(total > 1e-6);
            let epsilon = frac * total;
            let got = cleaner.clean(&x, epsilon).expect("clean");
            let moved = (a_d.transpose() * (&x - &got.x)).norm_squared();
            prop_assert!((moved - epsilon).abs() <= 1e-9 * epsilon.max(1.0), "{} vs {}", moved, epsilon);
            let moved_c = (a_c.transpose() * (&x - &got.x)).norm_squared();
            prop_assert!((moved_c - got.e_privacy).abs() <= 1e-8 * got.e_privacy.max(1.0));
            // Directions in increasing gamma.
            prop_assert!(cleaner.theta.windows(2).all(|w| w[0] <= w[1] + 1e-9));
        }

        #[test]
        fn least_squares_recovers_an_exact_linear_map(a in matrix(3, 2), x in matrix(12, 3)) {
            let y = &x * &a;
            prop_assume!(x.clone().svd(false, false).singular_values.min() > 1e-3);
            let fit = least_squares(&x, &y).expect("fit");
            prop_assert!((fit - a).amax() < 1e-6);
        }
    }
}
