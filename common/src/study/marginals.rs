//! The marginal histogram study that chooses each feature's center and scale.

use num_bigint::BigInt;

use super::{param, SpecDraft, SpecError};
use crate::dp::Centering;
use crate::encoding::FixedPoint;
use crate::protocol::Share;

/// The grid's smallest magnitude: values with |x| at most 2^this fall in the
/// zero bin.
pub const GRID_MIN_EXP: i32 = -32;
/// The grid's largest magnitude: values beyond 2^this fall in the outermost
/// bins (their edge is where the study would clip them).
pub const GRID_MAX_EXP: i32 = 64;
/// Most bins per octave a marginal study may ask for.
pub const MAX_PER_OCTAVE: u32 = 8;
/// The bins per octave `user local` and `user study` ask for: chosen by the
/// preprocessing bench (docs/BENCHMARKS.md, "Choosing bounds privately").
pub const STANDARD_PER_OCTAVE: u32 = 1;

/// Octaves of the grid on each side of zero.
const OCTAVES: usize = (GRID_MAX_EXP - GRID_MIN_EXP) as usize;

/// A marginal histogram study: instead of its rows, each owner sends, for every
/// row, the bin of each feature's value on a public signed logarithmic grid (as
/// Google's ApproxBounds bins values), and a 1 that counts the row. The release
/// is one noisy histogram per feature, from which the user takes each feature's
/// range, center and scale ([`crate::scaling`]) before any other study reads the
/// rows.
///
/// The grid is the same for every feature and for any data: a zero bin for
/// |x| <= 2^[`GRID_MIN_EXP`], then `per_octave` bins per octave up to
/// 2^[`GRID_MAX_EXP`] on each side, closed toward zero's far side: a positive bin
/// holds (e, e'], so a count 16 or an indicator 1 is the top of its bin, not the
/// bottom of the next. Values beyond the grid fall in its outermost bins.
///
/// Each of the M + 1 ones a row sends is encoded as the same integer `unit`,
/// floor(Cq / sqrt(M + 1)), so an encoded row has norm at most Cq exactly; the
/// study's own features are the data columns, with bounds [-1, 1] and C = 1, and
/// it releases its vector block alone (no scatter). Its sensitivity
/// ([`crate::dp::Sensitivity::marginals`]): replacing a row moves at most one
/// unit per feature from one bin to another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marginals {
    /// Bins per octave on each side of zero, 1 to [`MAX_PER_OCTAVE`].
    pub per_octave: u32,
}

impl Marginals {
    /// The standard grid ([`STANDARD_PER_OCTAVE`]).
    pub fn standard() -> Self {
        Self {
            per_octave: STANDARD_PER_OCTAVE,
        }
    }

    /// Bins on each side of the zero bin.
    fn side(&self) -> usize {
        OCTAVES * self.per_octave as usize
    }

    /// Bins per feature: both sides and the zero bin.
    pub fn bins(&self) -> usize {
        2 * self.side() + 1
    }

    /// The zero bin's index; bins below it hold negative values, above it
    /// positive ones, in the order of the values.
    pub fn zero_bin(&self) -> usize {
        self.side()
    }

    /// Values in the released vector of a study of `m` features: each feature's
    /// bins in turn, then the row count.
    pub fn width(&self, m: usize) -> usize {
        m.saturating_mul(self.bins()).saturating_add(1)
    }

    /// The magnitude that bounds bins `l` and `l + 1` of a side: 2^(min + l / p).
    pub fn magnitude_edge(&self, l: usize) -> f64 {
        let p = f64::from(self.per_octave);
        ((f64::from(GRID_MIN_EXP) * p + l as f64) / p).exp2()
    }

    /// The bin of a magnitude above 2^min on one side: `l` with |x| in
    /// (edge(l), edge(l + 1)], the last bin taking everything beyond. The
    /// logarithm's guess is checked against the same edges the user reads, so
    /// the owner's bin and the user's reading of it agree at any value.
    fn magnitude_bin(&self, a: f64) -> usize {
        let last = self.side() - 1;
        let guess =
            ((a.log2() - f64::from(GRID_MIN_EXP)) * f64::from(self.per_octave)).ceil() - 1.0;
        let mut l = guess.clamp(0.0, last as f64) as usize;
        while l > 0 && a <= self.magnitude_edge(l) {
            l -= 1;
        }
        while l < last && a > self.magnitude_edge(l + 1) {
            l += 1;
        }
        l
    }

    /// The bin of a value (finite, as every table's values are checked to be).
    pub fn bin_of(&self, x: f64) -> usize {
        let a = x.abs();
        if a <= self.magnitude_edge(0) || a.is_nan() {
            return self.zero_bin();
        }
        let l = self.magnitude_bin(a);
        if x > 0.0 {
            self.zero_bin() + 1 + l
        } else {
            self.zero_bin() - 1 - l
        }
    }

    /// The values bin `b` holds, as (lo, hi): (e, e'] above zero, [-e', -e)
    /// below it, and the zero bin read as the single value 0. The outermost bins
    /// also hold the values beyond the grid, which the study clips to their edge.
    pub fn bin_range(&self, b: usize) -> (f64, f64) {
        let z = self.zero_bin();
        match b.cmp(&z) {
            std::cmp::Ordering::Equal => (0.0, 0.0),
            std::cmp::Ordering::Greater => {
                let l = b - z - 1;
                (self.magnitude_edge(l), self.magnitude_edge(l + 1))
            }
            std::cmp::Ordering::Less => {
                let l = z - 1 - b;
                (-self.magnitude_edge(l + 1), -self.magnitude_edge(l))
            }
        }
    }

    /// The integer every one of a row's M + 1 marks is encoded as:
    /// floor(Cq / sqrt(M + 1)), exactly, so that (M + 1) unit^2 <= Cq^2.
    pub fn unit(m: usize, fixed: &FixedPoint) -> u64 {
        let cq = u128::from(fixed.norm_bound_int());
        let k = m as u128 + 1;
        let fits = |a: u128| {
            a.checked_mul(a)
                .and_then(|s| s.checked_mul(k))
                .is_some_and(|s| s <= cq * cq)
        };
        let mut a = (cq as f64 / (k as f64).sqrt()).floor() as u128;
        while a > 0 && !fits(a) {
            a -= 1;
        }
        while fits(a + 1) {
            a += 1;
        }
        a as u64
    }

    /// An owner's exact share of its rows (each of `m` values): every value's
    /// bin and the row's count, `unit` each; no scatter.
    pub fn share(&self, rows: &[Vec<f64>], m: usize, fixed: &FixedPoint) -> Share {
        let unit = i128::from(Self::unit(m, fixed));
        let bins = self.bins();
        let mut v = vec![0i128; self.width(m)];
        for row in rows {
            for (j, &x) in row.iter().enumerate().take(m) {
                v[j * bins + self.bin_of(x)] += unit;
            }
            v[m * bins] += unit;
        }
        Share {
            r_upper: Vec::new(),
            v,
            n: rows.len() as u64,
        }
    }

    /// The noisy counts of a release's vector block (`vector_grid`, in grid
    /// units), per feature and bin, and the noisy row count. Post-processing only.
    pub fn counts(&self, vector_grid: &[BigInt], m: usize, fixed: &FixedPoint) -> MarginalCounts {
        let unit = Self::unit(m, fixed).max(1) as f64;
        let read = |x: &BigInt| crate::protocol::to_f64(x) / unit;
        let bins = self.bins();
        MarginalCounts {
            features: (0..m)
                .map(|j| {
                    (0..bins)
                        .map(|b| vector_grid.get(j * bins + b).map_or(0.0, read))
                        .collect()
                })
                .collect(),
            rows: vector_grid.get(m * bins).map_or(0.0, read),
        }
    }

    pub(super) fn validate(&self, spec: &SpecDraft) -> Result<(), SpecError> {
        if !(1..=MAX_PER_OCTAVE).contains(&self.per_octave) {
            return Err(param(
                "marginals",
                format!(
                    "needs 1..={MAX_PER_OCTAVE} bins per octave, got {}",
                    self.per_octave
                ),
            ));
        }
        if spec.bounds.iter().any(|&b| b != (-1.0, 1.0)) || spec.fixed.row_norm_bound != 1.0 {
            return Err(param(
                "marginals",
                "a marginal histogram study reads its columns on its own grid: bounds [-1, 1] and C = 1",
            ));
        }
        if Self::unit(spec.features.len(), &spec.fixed) == 0 {
            return Err(param(
                "marginals",
                "too many features for the fixed-point scale",
            ));
        }
        if spec.privacy.centering != Centering::DpMean
            || spec.classes.is_some()
            || spec.projection.is_some()
            || spec.norm_bins.is_some()
            || !spec.privacy.mechanism.proven()
        {
            return Err(param(
                "marginals",
                "a marginal histogram study is a plain `dp-mean` study (gaussian or laplace): no classes, projection or norm bins",
            ));
        }
        Ok(())
    }
}

/// A marginal study's release read as counts: noisy, possibly negative.
#[derive(Clone, Debug, PartialEq)]
pub struct MarginalCounts {
    /// Per feature, the noisy count of every bin of the grid.
    pub features: Vec<Vec<f64>>,
    /// The noisy count of rows.
    pub rows: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bins follow the values, powers of two are the top of their bin, and the
    /// ranges the user reads hold the values the owner binned.
    #[test]
    fn values_fall_in_the_bin_whose_range_holds_them() {
        for per_octave in 1..=MAX_PER_OCTAVE {
            let g = Marginals { per_octave };
            let mut last = 0;
            let values = [
                -1e30, -3.5, -1.0, -0.7, -1e-12, 0.0, 1e-12, 0.3, 1.0, 1.5, 2.0, 15.0, 16.0, 16.5,
                1e5, 1e300,
            ];
            for &x in &values {
                let b = g.bin_of(x);
                assert!(b < g.bins());
                assert!(b >= last, "{x}: bin {b} below {last}");
                last = b;
                let (lo, hi) = g.bin_range(b);
                let outermost = b == 0 || b == g.bins() - 1;
                if b == g.zero_bin() {
                    assert!(x.abs() <= g.magnitude_edge(0), "{x}");
                } else if !outermost {
                    assert!(
                        (x > 0.0 && lo < x && x <= hi) || (x < 0.0 && lo <= x && x < hi),
                        "{x} in bin {b} = ({lo}, {hi}] at {per_octave} per octave"
                    );
                }
            }
        }
        let octaves = Marginals { per_octave: 1 };
        assert_eq!(octaves.bin_range(octaves.bin_of(16.0)), (8.0, 16.0));
        assert_eq!(octaves.bin_range(octaves.bin_of(1.0)), (0.5, 1.0));
        assert_eq!(octaves.bin_range(octaves.bin_of(-1.0)), (-1.0, -0.5));
        assert_eq!(octaves.bin_of(0.0), octaves.zero_bin());
    }

    /// Every encoded row has norm at most Cq, and the unit is the largest that
    /// keeps it so.
    #[test]
    fn an_encoded_row_stays_in_the_ball() {
        for frac_bits in [1, 8, 20, 30] {
            let fixed = FixedPoint {
                frac_bits,
                row_norm_bound: 1.0,
            };
            let cq = u128::from(fixed.norm_bound_int());
            for m in [1usize, 2, 3, 15, 63, 64, 1000, 99_999] {
                let a = u128::from(Marginals::unit(m, &fixed));
                let k = m as u128 + 1;
                assert!(a * a * k <= cq * cq, "m {m} f {frac_bits}");
                assert!((a + 1) * (a + 1) * k > cq * cq, "m {m} f {frac_bits}");
            }
        }
    }

    /// The share counts each value once in its feature's bin, and each row once.
    #[test]
    fn a_share_counts_every_value_in_its_bin() {
        let g = Marginals::standard();
        let fixed = FixedPoint {
            frac_bits: 20,
            row_norm_bound: 1.0,
        };
        let rows = vec![vec![0.0, 16.0], vec![0.0, -3.0], vec![5.0, 16.0]];
        let share = g.share(&rows, 2, &fixed);
        let unit = i128::from(Marginals::unit(2, &fixed));
        let bins = g.bins();
        assert_eq!(share.v.len(), g.width(2));
        assert_eq!(share.v[g.zero_bin()], 2 * unit);
        assert_eq!(share.v[g.bin_of(5.0)], unit);
        assert_eq!(share.v[bins + g.bin_of(16.0)], 2 * unit);
        assert_eq!(share.v[bins + g.bin_of(-3.0)], unit);
        assert_eq!(share.v[2 * bins], 3 * unit);
        assert_eq!(share.v.iter().sum::<i128>(), 9 * unit);
        let grid: Vec<BigInt> = share.v.iter().map(|&x| BigInt::from(x)).collect();
        let counts = g.counts(&grid, 2, &fixed);
        assert_eq!(counts.rows, 3.0);
        assert_eq!(counts.features[1][g.bin_of(16.0)], 2.0);
    }
}
