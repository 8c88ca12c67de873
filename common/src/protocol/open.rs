//! The user's opening of a release: decryption, unpacking, and S' = S + E.

use nalgebra::{DMatrix, DVector};
use num_bigint::{BigInt, BigUint};
use num_traits::Zero;
use rayon::prelude::*;

use super::{to_f64, ProtocolError};
use crate::dp::{Centering, NoisePlan};
use crate::encoding::FixedPoint;
use crate::paillier::{Ciphertext, SecretKey};
use crate::study::{BlockShape, NormBins, Projection, StudyLayout};

/// What the user reconstructs from a release.
#[derive(Clone, Debug)]
pub struct Opened {
    /// The released matrix blocks on the grid as exact integers, full symmetric:
    /// N S~ + E' (`mask`, after the user's T - v' v'^T), R~ + E_R (`dp-mean`), or
    /// R~_c + E_c per class.
    pub matrix_grid: Vec<Vec<Vec<BigInt>>>,
    /// The released vector block on the grid: v + b (`mask`) or v + e_v (`dp-mean`;
    /// class sums then scaled counts in a classification study).
    pub vector_grid: Vec<BigInt>,
    /// S' = S + E in normalized units (f64): the total centered scatter.
    pub scatter: DMatrix<f64>,
    /// The noisy mean in normalized units (`dp-mean` only).
    pub mean: Option<DVector<f64>>,
    /// Class statistics of a classification study.
    pub classes: Option<ClassStats>,
}

impl Opened {
    /// Noisy bin counts of a histogram study (`bins`), from its release: the sums v' and the
    /// diagonal of R' both count the rows per bin (a one-hot row adds 1 to each),
    /// with independent noise, so they are averaged with inverse-variance weights.
    /// Post-processing only.
    pub fn bin_counts(&self, bins: &NormBins, plan: &NoisePlan, fixed: &FixedPoint) -> Vec<f64> {
        let cq = fixed.norm_bound_int() as f64;
        let var_r = (plan.matrix.std_dev() / (cq * cq)).powi(2);
        let var_v = plan
            .vector
            .as_ref()
            .map_or(f64::INFINITY, |v| (v.std_dev() / cq).powi(2));
        let grid = self.matrix_grid.first();
        (0..bins.edges.len())
            .map(|b| {
                let from_v = self.vector_grid.get(b).map_or(0.0, |x| to_f64(x) / cq);
                let Some(r) = grid.and_then(|g| g.get(b)).and_then(|row| row.get(b)) else {
                    return from_v;
                };
                let from_r = to_f64(r) / (cq * cq);
                if var_r == 0.0 || var_v == 0.0 {
                    // Noise-free test release: both are exact.
                    return from_v;
                }
                (from_r / var_r + from_v / var_v) / (1.0 / var_r + 1.0 / var_v)
            })
            .collect()
    }
}

/// The noisy class statistics of a classification study, in normalized units. All
/// are post-processing of the release.
#[derive(Clone, Debug)]
pub struct ClassStats {
    /// Noisy class counts (may be below 1 or negative).
    pub counts: Vec<f64>,
    /// Class means v'_c / max(N'_c, 1).
    pub means: Vec<DVector<f64>>,
    /// Within-class centered scatters: one shared R' - sum_c v'_c v'_c^T / N'_c, or
    /// R'_c - v'_c v'_c^T / N'_c per class.
    pub scatters: Vec<DMatrix<f64>>,
}

impl ClassStats {
    /// Class proportions from the noisy counts, negative counts taken as zero; uniform
    /// when every count is.
    pub fn proportions(&self) -> Vec<f64> {
        let clipped: Vec<f64> = self.counts.iter().map(|c| c.max(0.0)).collect();
        let total: f64 = clipped.iter().sum();
        if total > 0.0 {
            clipped.iter().map(|c| c / total).collect()
        } else {
            vec![1.0 / self.counts.len().max(1) as f64; self.counts.len()]
        }
    }
}

/// Decrypts a release and forms S' = S + E in normalized units.
pub fn open_release(
    sk: &SecretKey,
    layout: &StudyLayout,
    centering: Centering,
    projection: Option<&Projection>,
    cts: &[Ciphertext],
    n_rows: u64,
    frac_bits: u32,
) -> Result<Opened, ProtocolError> {
    open_release_unmasked(
        sk,
        layout,
        centering,
        projection,
        (cts, None),
        n_rows,
        frac_bits,
    )
}

/// [`open_release`] of a release of masked contributions: `masks`, the counted
/// owners' mask sum ([`crate::secagg::held_mask_sum`], one value per plaintext
/// an owner sends), is taken off the decrypted plaintexts before they are
/// unpacked; its last value, N's, is not the release's.
pub fn open_release_unmasked(
    sk: &SecretKey,
    layout: &StudyLayout,
    centering: Centering,
    projection: Option<&Projection>,
    (cts, masks): (&[Ciphertext], Option<&[BigUint]>),
    n_rows: u64,
    frac_bits: u32,
) -> Result<Opened, ProtocolError> {
    if cts.len() != layout.release_ciphertexts() {
        return Err(ProtocolError::Count {
            expected: layout.release_ciphertexts(),
            got: cts.len(),
        });
    }
    let mut plains: Vec<BigUint> = if layout.baseline {
        cts.iter().map(|c| sk.decrypt_textbook(c)).collect()
    } else {
        cts.par_iter().map(|c| sk.decrypt(c)).collect()
    };
    if let Some(masks) = masks {
        let released = masks.get(..plains.len()).unwrap_or(masks);
        crate::secagg::remove_mask_sum(&mut plains, released, sk.public().n())?;
    }
    let (matrix, vector) = plains.split_at(layout.matrix_ciphertexts());
    let mut vec = Vec::with_capacity(layout.vector_len);
    for (&(_, len), p) in layout.vector.iter().zip(vector) {
        vec.extend(layout.vector_budget.unpack(&sk.to_signed(p.clone()), len)?);
    }
    let v_prime = (centering == Centering::Mask).then_some(&vec[..]);
    let blocks = matrix_blocks(sk, layout, matrix, v_prime)?;
    Ok(from_grid(
        &layout.shape(),
        centering,
        projection,
        blocks,
        vec,
        n_rows,
        frac_bits,
    ))
}

/// Unpacks the matrix blocks from their plaintexts, full symmetric. With `v_prime`
/// (`mask`), each segment's plaintext is T_seg, whose entries overflow their slots;
/// v' v'^T is subtracted from it mod n first, which leaves N S~ + E' in every slot.
fn matrix_blocks(
    sk: &SecretKey,
    layout: &StudyLayout,
    plains: &[BigUint],
    v_prime: Option<&[BigInt]>,
) -> Result<Vec<Vec<Vec<BigInt>>>, ProtocolError> {
    let n = sk.public().n();
    let dim = layout.triangle.dim;
    let segs = layout.triangle.len();
    let mut blocks = Vec::with_capacity(layout.matrix_blocks);
    for block in plains.chunks(segs.max(1)) {
        let mut t = vec![vec![BigInt::zero(); dim]; dim];
        for (seg, p) in layout.triangle.segments.iter().zip(block) {
            let centered = match v_prime {
                Some(v) => {
                    let vv: Vec<BigInt> = (0..seg.len)
                        .map(|k| &v[seg.row] * &v[seg.col + k])
                        .collect();
                    (p + n - layout.budget.pack_residue(&vv, n)) % n
                }
                None => p.clone(),
            };
            let vals = layout.budget.unpack(&sk.to_signed(centered), seg.len)?;
            for (k, val) in vals.into_iter().enumerate() {
                let j = seg.col + k;
                t[j][seg.row] = val.clone();
                t[seg.row][j] = val;
            }
        }
        blocks.push(t);
    }
    Ok(blocks)
}

/// Forms S' from the released integers: the full matrix blocks (`mask`: N S~ + E',
/// the user's T - v' v'^T; `dp-mean`: R~ + E_R, or R~_c + E_c per class) and the
/// vector block.
pub(super) fn from_grid(
    layout: &BlockShape,
    centering: Centering,
    projection: Option<&Projection>,
    blocks: Vec<Vec<Vec<BigInt>>>,
    vec: Vec<BigInt>,
    n_rows: u64,
    frac_bits: u32,
) -> Opened {
    if layout.matrix_dim == 0 {
        // A marginal histogram study releases counts alone: no scatter, no mean.
        return Opened {
            matrix_grid: blocks,
            vector_grid: vec,
            scatter: DMatrix::zeros(0, 0),
            mean: None,
            classes: None,
        };
    }
    let units = Units::new(layout, projection, n_rows, frac_bits);
    let (matrix_grid, scatter, mean, classes) = match centering {
        Centering::Mask => {
            let ns = blocks.into_iter().next().unwrap_or_default();
            let s = DMatrix::from_fn(units.dim, units.dim, |i, j| {
                to_f64(&ns[i][j]) / (units.n * units.scale_2)
            });
            (vec![ns], s, None, None)
        }
        Centering::DpMean => {
            let rs: Vec<DMatrix<f64>> = blocks.iter().map(|t| units.matrix(t)).collect();
            let r_total = rs
                .iter()
                .fold(DMatrix::zeros(units.k, units.k), |acc, r| acc + r);
            let sums = units.class_sums(&vec, layout.classes);
            let v = sums
                .iter()
                .fold(DVector::zeros(units.dim), |acc, s| acc + s);
            // S' = R' - v' v'^T / N, in normalized units.
            let vk = units.down(&v);
            let s = units.up(&r_total - &vk * vk.transpose() / units.n);
            let classes =
                (layout.classes > 0).then(|| units.class_stats(layout, &vec, &rs, &r_total, sums));
            (blocks, s, Some(v / units.n), classes)
        }
    };
    Opened {
        matrix_grid,
        vector_grid: vec,
        scatter,
        mean,
        classes,
    }
}

/// How released integers read in normalized units: the fixed-point scales, N, and
/// a projected study's axes (its R lives on the k axes: sums are projected down to
/// meet it, and scatters lifted back as W S W^T, rank k, M x M).
struct Units {
    dim: usize,
    k: usize,
    scale_1: f64,
    scale_2: f64,
    n: f64,
    axes: Option<DMatrix<f64>>,
}

impl Units {
    fn new(
        layout: &BlockShape,
        projection: Option<&Projection>,
        n_rows: u64,
        frac_bits: u32,
    ) -> Self {
        let (dim, k) = (layout.dim, layout.matrix_dim);
        let scale_1 = f64::from(frac_bits).exp2();
        Self {
            dim,
            k,
            scale_1,
            scale_2: scale_1 * scale_1,
            n: n_rows as f64,
            axes: projection.map(|p| DMatrix::from_fn(k, dim, |i, j| p.axes[i][j])),
        }
    }

    fn matrix(&self, t: &[Vec<BigInt>]) -> DMatrix<f64> {
        DMatrix::from_fn(self.k, self.k, |i, j| to_f64(&t[i][j]) / self.scale_2)
    }

    fn down(&self, v: &DVector<f64>) -> DVector<f64> {
        match &self.axes {
            Some(p) => p * v,
            None => v.clone(),
        }
    }

    fn up(&self, s: DMatrix<f64>) -> DMatrix<f64> {
        match &self.axes {
            Some(p) => p.transpose() * s * p,
            None => s,
        }
    }

    /// The sums v'_c of each of `classes` classes (the one total v' without).
    fn class_sums(&self, vec: &[BigInt], classes: usize) -> Vec<DVector<f64>> {
        let sum = |c: usize| {
            DVector::from_fn(self.dim, |i, _| {
                to_f64(&vec[c * self.dim + i]) / self.scale_1
            })
        };
        (0..classes.max(1)).map(sum).collect()
    }

    /// Counts, means and within-class scatters: one per class where the release
    /// has a matrix per class, else one shared.
    fn class_stats(
        &self,
        layout: &BlockShape,
        vec: &[BigInt],
        rs: &[DMatrix<f64>],
        r_total: &DMatrix<f64>,
        sums: Vec<DVector<f64>>,
    ) -> ClassStats {
        let g = layout.classes;
        let counts: Vec<f64> = (0..g)
            .map(|c| to_f64(&vec[g * self.dim + c]) / layout.count_scale as f64)
            .collect();
        // A noisy count below one would blow the mean up: divide by at least 1.
        let means: Vec<DVector<f64>> = sums
            .iter()
            .zip(&counts)
            .map(|(s, &nc)| s / nc.max(1.0))
            .collect();
        let outer = |s: &DVector<f64>, m: &DVector<f64>| self.down(s) * self.down(m).transpose();
        let scatters = if rs.len() == g {
            rs.iter()
                .zip(&sums)
                .zip(&means)
                .map(|((r, s), m)| self.up(r - outer(s, m)))
                .collect()
        } else {
            let between = sums
                .iter()
                .zip(&means)
                .fold(DMatrix::zeros(self.k, self.k), |acc, (s, m)| {
                    acc + outer(s, m)
                });
            vec![self.up(r_total - between)]
        };
        ClassStats {
            counts,
            means,
            scatters,
        }
    }
}
