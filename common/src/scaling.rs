//! Each feature's range, center and scale, read off the release of a marginal
//! histogram study ([`crate::study::Marginals`]). Post-processing: it spends
//! nothing beyond that study.
//!
//! A bin holds values when its noisy count passes a threshold noise alone
//! passes with probability [`FALSE_ALARM`] over the whole release (a union
//! bound over every bin of every feature). A feature's range runs from its
//! lowest such bin to its highest (ApproxBounds' rule, Wilson et al., "Differentially
//! Private SQL with Bounded User Contribution", PETS 2020); its center is the
//! median of the counts in those bins; its scale the half-width of the box about
//! the center that holds the range, each rounded onto a public grid (the scale up
//! to a power of 2^(1/4), the center to a sixteenth of the octave below it), so
//! that what the bounds the next studies carry can say of a release is which
//! grid step it took. Where a feature's own bins hold less than
//! [`COVER`] of the rows (too few rows for its histogram to stand above the
//! noise), the bins found in the pooled histogram of all features are added: a
//! table of like columns (pixels, coordinates, expressions) still gets a range.

use serde::{Deserialize, Serialize};

use crate::dp::NoiseScale;
use crate::study::{MarginalCounts, Marginals};

/// The chance that noise alone marks any bin of a release as holding values.
pub const FALSE_ALARM: f64 = 0.05;

/// The share of the rows a feature's own marked bins must hold for its range to
/// be read off them alone.
pub const COVER: f64 = 0.9;

/// What a marginal release says of one feature, in the input's units.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureScale {
    /// The lower end of the range values were found in (the lowest marked bin's
    /// lower edge; 0 for the zero bin).
    pub lo: f64,
    /// The upper end (the highest marked bin's upper edge).
    pub hi: f64,
    /// The median of the marked bins' counts, linear inside its bin, rounded to
    /// a sixteenth of the octave below the scale.
    pub center: f64,
    /// The half-width of the box about `center` that holds [lo, hi], rounded up
    /// to a power of 2^(1/4).
    pub scale: f64,
    /// Whether the pooled histogram's bins were added to the feature's own.
    pub pooled: bool,
}

impl FeatureScale {
    /// The box the study maps to [-1, 1]: [center - scale, center + scale].
    pub fn bounds(&self) -> (f64, f64) {
        (self.center - self.scale, self.center + self.scale)
    }
}

/// Every feature's scale, with the threshold they were read at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scaling {
    /// One per feature, in column order.
    pub features: Vec<FeatureScale>,
    /// The count a bin had to pass to be read as holding values.
    pub threshold: f64,
    /// The noisy count of rows.
    pub rows: f64,
}

/// The count a noisy bin passes with probability at most `p` when it holds no
/// value: `noise`'s one-sided exceedance, in units of `unit` grid steps.
fn threshold(noise: &NoiseScale, unit: f64, p: f64) -> f64 {
    noise.exceedance(p) / unit.max(1.0)
}

/// The share of a feature's values its scale may leave beyond the box, in each
/// tail: 0, the box holds its whole range.
pub const TAIL: f64 = 0.0;

/// Reads each feature's scale off `counts`, a release of `grid` whose every
/// count carries `noise` (grid units; `unit` grid units a count).
pub fn choose_scales(
    grid: &Marginals,
    counts: &MarginalCounts,
    noise: &NoiseScale,
    unit: f64,
) -> Scaling {
    choose_scales_with(grid, counts, (noise, unit), TAIL)
}

/// As [`choose_scales`], with the box about the median holding the `tail` and
/// 1 - `tail` quantiles of the marked counts instead of their whole range (the
/// range where that leaves no width).
pub fn choose_scales_with(
    grid: &Marginals,
    counts: &MarginalCounts,
    (noise, unit): (&NoiseScale, f64),
    tail: f64,
) -> Scaling {
    let m = counts.features.len();
    let bins = grid.bins();
    let tests = (m * bins).max(1) as f64;
    let own = threshold(noise, unit, FALSE_ALARM / tests);
    let pooled = pooled_bins(grid, counts, noise, unit);
    let features = counts
        .features
        .iter()
        .map(|c| {
            let mut marked: Vec<usize> = (0..bins).filter(|&b| c[b] > own).collect();
            let held: f64 = marked.iter().map(|&b| c[b]).sum();
            let few = held < COVER * counts.rows;
            if few {
                marked.extend(&pooled);
                marked.sort_unstable();
                marked.dedup();
            }
            feature_scale(grid, c, &marked, (few, tail))
        })
        .collect();
    Scaling {
        features,
        threshold: own,
        rows: counts.rows,
    }
}

/// The bins the pooled histogram (every feature's counts added, with sqrt(M)
/// times the noise) marks at the release's false-alarm rate; the fullest bin
/// when none passes.
fn pooled_bins(
    grid: &Marginals,
    counts: &MarginalCounts,
    noise: &NoiseScale,
    unit: f64,
) -> Vec<usize> {
    let bins = grid.bins();
    let m = counts.features.len().max(1) as f64;
    let sum: Vec<f64> = (0..bins)
        .map(|b| counts.features.iter().map(|c| c[b]).sum())
        .collect();
    let bar = m.sqrt() * threshold(noise, unit, FALSE_ALARM / bins as f64);
    let marked: Vec<usize> = (0..bins).filter(|&b| sum[b] > bar).collect();
    if !marked.is_empty() {
        return marked;
    }
    let fullest = (0..bins).max_by(|&a, &b| sum[a].total_cmp(&sum[b]));
    fullest.into_iter().collect()
}

/// The range, median and scale of one feature's `counts` over the `marked`
/// bins (in increasing order), the scale reaching the `tail` quantiles.
fn feature_scale(
    grid: &Marginals,
    counts: &[f64],
    marked: &[usize],
    (pooled, tail): (bool, f64),
) -> FeatureScale {
    let (Some(&first), Some(&last)) = (marked.first(), marked.last()) else {
        return FeatureScale {
            lo: 0.0,
            hi: 0.0,
            center: 0.0,
            scale: 0.0,
            pooled,
        };
    };
    let (lo, hi) = (grid.bin_range(first).0, grid.bin_range(last).1);
    let at = |q: f64| quantile(grid, counts, marked, q).map(|v| v.clamp(lo, hi));
    let median = at(0.5).unwrap_or((lo + hi) / 2.0);
    let whole = |c: f64| (hi - c).max(c - lo);
    let tails = match (tail > 0.0, at(tail), at(1.0 - tail)) {
        (true, Some(a), Some(b)) => Some((b - median).max(median - a)),
        _ => None,
    };
    let raw = tails.filter(|t| *t > 0.0).unwrap_or(whole(median));
    let center = on_center_grid(median, raw).clamp(lo, hi);
    let needed = match tails.filter(|t| *t > 0.0) {
        Some(t) => t + (center - median).abs(),
        None => whole(center),
    };
    FeatureScale {
        lo,
        hi,
        center,
        scale: on_scale_grid(needed),
        pooled,
    }
}

/// Steps per octave of the public grid a scale is rounded up to.
pub const SCALE_STEPS_PER_OCTAVE: i32 = 4;

/// Steps a center moves on within the octave below its scale.
pub const CENTER_STEPS_PER_OCTAVE: f64 = 16.0;

/// The smallest 2^(k / 4) at least `needed` (0 for 0): scales lie on a public
/// grid, so what a feature's scale says of a release is which step it took.
fn on_scale_grid(needed: f64) -> f64 {
    if !(needed > 0.0 && needed.is_finite()) {
        return needed.max(0.0);
    }
    let steps = f64::from(SCALE_STEPS_PER_OCTAVE);
    let mut k = (needed.log2() * steps).ceil();
    while (k / steps).exp2() < needed {
        k += 1.0;
    }
    while ((k - 1.0) / steps).exp2() >= needed {
        k -= 1.0;
    }
    (k / steps).exp2()
}

/// `center` rounded to a multiple of a sixteenth of the octave below `scale`
/// (itself unchanged where the scale is 0): centers lie on a public grid too,
/// fine beside the box they center.
fn on_center_grid(center: f64, scale: f64) -> f64 {
    if !(scale > 0.0 && scale.is_finite()) {
        return center;
    }
    let step = scale.log2().floor().exp2() / CENTER_STEPS_PER_OCTAVE;
    (center / step).round() * step
}

/// Where the marked bins' counts (negative ones read as 0) reach `q` of their
/// sum, linear inside the bin it falls in; `None` when they hold nothing.
fn quantile(grid: &Marginals, counts: &[f64], marked: &[usize], q: f64) -> Option<f64> {
    let held = |b: usize| counts[b].max(0.0);
    let total: f64 = marked.iter().map(|&b| held(b)).sum();
    if total <= 0.0 {
        return None;
    }
    let mut below = 0.0;
    for &b in marked {
        let here = held(b);
        if here > 0.0 && below + here >= q * total {
            let (lo, hi) = grid.bin_range(b);
            return Some(lo + (q * total - below) / here * (hi - lo));
        }
        below += here;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use num_bigint::BigUint;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    /// Exact counts of `rows` on `grid`, as a noise-free release reads.
    fn exact(grid: &Marginals, rows: &[Vec<f64>]) -> MarginalCounts {
        let m = rows[0].len();
        let mut features = vec![vec![0.0; grid.bins()]; m];
        for row in rows {
            for (j, &x) in row.iter().enumerate() {
                features[j][grid.bin_of(x)] += 1.0;
            }
        }
        MarginalCounts {
            features,
            rows: rows.len() as f64,
        }
    }

    /// Without noise, the range is the bins of the smallest and largest values,
    /// the median falls in the median's bin, and a sparse column is centered at 0.
    #[test]
    fn exact_counts_give_the_datas_range_and_median() {
        let grid = Marginals { per_octave: 1 };
        let rows: Vec<Vec<f64>> = (0..100)
            .map(|i| {
                let sparse = if i % 10 == 0 { 12.0 } else { 0.0 };
                vec![f64::from(i) + 1.0, sparse, -3.0 - f64::from(i % 3)]
            })
            .collect();
        let s = choose_scales(&grid, &exact(&grid, &rows), &NoiseScale::None, 1.0);
        let f = &s.features;
        assert_eq!((f[0].lo, f[0].hi), (0.5, 128.0));
        assert!((32.0..=64.0).contains(&f[0].center), "{f:?}");
        assert_eq!((f[1].lo, f[1].hi, f[1].center), (0.0, 16.0, 0.0));
        assert_eq!(f[1].bounds(), (-16.0, 16.0));
        assert_eq!((f[2].lo, f[2].hi), (-8.0, -2.0));
        assert!(f.iter().all(|x| !x.pooled));
        for x in f {
            let (lo, hi) = x.bounds();
            assert!(lo <= x.lo && x.hi <= hi, "{x:?}");
        }
    }

    /// Noise alone marks a bin at most at the stated rate: over many releases of
    /// a table whose values all lie in one bin, no feature's range ever reaches
    /// beyond it (expected false alarms per release at most FALSE_ALARM).
    #[test]
    fn noise_alone_rarely_widens_a_range() {
        let grid = Marginals { per_octave: 1 };
        let sigma = 50.0;
        let noise = NoiseScale::Gaussian {
            sigma: BigUint::from(50u32),
        };
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let normal = rand_distr::Normal::new(0.0, sigma).expect("sd");
        let (m, releases) = (8, 200);
        let mut widened = 0;
        for _ in 0..releases {
            let features = (0..m)
                .map(|_| {
                    (0..grid.bins())
                        .map(|b| {
                            let held = if b == grid.bin_of(3.0) { 10_000.0 } else { 0.0 };
                            held + rng.sample(normal)
                        })
                        .collect()
                })
                .collect();
            let counts = MarginalCounts {
                features,
                rows: 10_000.0,
            };
            let s = choose_scales(&grid, &counts, &noise, 1.0);
            widened += s
                .features
                .iter()
                .filter(|f| (f.lo, f.hi) != (2.0, 4.0))
                .count();
        }
        // At most FALSE_ALARM per release in expectation; 10 over 200 releases
        // would be that rate exactly, and the bound is loose.
        assert!(
            widened <= 10,
            "{widened} ranges widened in {releases} releases"
        );
    }

    /// Whatever the counts, every scale is a power of 2^(1/4), every center a
    /// multiple of a sixteenth of the octave below its scale or an end of the
    /// range, and the box holds the range.
    #[test]
    fn bounds_lie_on_the_public_grid() {
        let grid = Marginals { per_octave: 1 };
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        for _ in 0..200 {
            let m = rng.gen_range(1..6);
            let features = (0..m)
                .map(|_| {
                    (0..grid.bins())
                        .map(|_| {
                            if rng.gen_bool(0.05) {
                                rng.gen_range(0.0..1e4)
                            } else {
                                0.0
                            }
                        })
                        .collect()
                })
                .collect();
            let counts = MarginalCounts {
                features,
                rows: 1e4,
            };
            let s = choose_scales(&grid, &counts, &NoiseScale::None, 1.0);
            for f in &s.features {
                if f.scale == 0.0 {
                    continue;
                }
                let k = f.scale.log2() * f64::from(SCALE_STEPS_PER_OCTAVE);
                assert!(
                    (k - k.round()).abs() < 1e-9,
                    "scale {} off the grid",
                    f.scale
                );
                let step = f.scale.log2().floor().exp2() / CENTER_STEPS_PER_OCTAVE;
                let on = |c: f64, step: f64| ((c / step) - (c / step).round()).abs() < 1e-6;
                // The center's step is read off the unrounded scale's octave:
                // that or the next lower one.
                assert!(
                    on(f.center, step)
                        || on(f.center, step / 2.0)
                        || f.center == f.lo
                        || f.center == f.hi,
                    "center {} off the grid ({f:?})",
                    f.center
                );
                let (lo, hi) = f.bounds();
                assert!(lo <= f.lo && f.hi <= hi, "{f:?}");
            }
        }
    }

    /// A feature whose own bins hold too few rows takes the pooled bins.
    #[test]
    fn a_feature_lost_in_the_noise_takes_the_pooled_range() {
        let grid = Marginals { per_octave: 1 };
        let noise = NoiseScale::Gaussian {
            sigma: BigUint::from(40u32),
        };
        let m = 30;
        let mut features = vec![vec![0.0; grid.bins()]; m];
        for c in features.iter_mut() {
            c[grid.bin_of(0.7)] = 60.0;
            c[grid.bin_of(0.3)] = 40.0;
        }
        let counts = MarginalCounts {
            features,
            rows: 100.0,
        };
        let s = choose_scales(&grid, &counts, &noise, 1.0);
        assert!(s.features.iter().all(|f| f.pooled));
        assert!(
            s.features.iter().all(|f| (f.lo, f.hi) == (0.25, 1.0)),
            "{:?}",
            s.features[0]
        );
    }
}
