//! An owner's share (R, v, N) as exact integers, and its packed plaintexts.

use nalgebra::DMatrix;
use num_bigint::{BigInt, BigUint};

use super::ProtocolError;
use crate::data::normalize_row;
use crate::dp::distributed::OwnerNoise;
use crate::encoding::{EncodingError, FixedPoint, SlotBudget, TriangleLayout};
use crate::paillier::PublicKey;
use crate::study::{Projection, StudyLayout};

/// An owner's exact integer share: the matrix blocks (upper triangles of R~, or of
/// every R~_c), the vector block (v~, or the class sums then Cq N_c) and N.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    /// Upper triangles of sum x x^T, row-major, i <= j; one per matrix block, in
    /// block order.
    pub r_upper: Vec<i128>,
    /// The vector block: sum x, or per class sum x then Cq times the class count.
    pub v: Vec<i128>,
    /// Row count.
    pub n: u64,
}

/// How rows are split into classes for a classification share.
#[derive(Clone, Copy, Debug)]
pub struct ClassRows<'a> {
    /// Class index of every row (each below `classes`).
    pub labels: &'a [usize],
    /// Number of classes G.
    pub classes: usize,
    /// One R~_c per class (else one total R~).
    pub per_class_matrix: bool,
    /// Grid value of one counted row (Cq).
    pub count_scale: u64,
}

/// Rows per matrix product in [`gram_upper`]: enough for the product to run at
/// full speed, few enough that a chunk of 1000 features and its transpose take
/// 16 MB (the k x k product another 8 MB, 32 MB at the default 2000 features).
const GRAM_CHUNK: usize = 1024;

/// Adds the upper triangle of sum_y y y^T over `rows` to `r`, exactly.
///
/// Every product of two values is an integer of magnitude at most max^2, and every
/// partial sum over a chunk of rows at most rows * max^2; while that is at most
/// 2^53 all of them are exact in f64, whatever the order of the additions (and
/// fused multiply-adds). So each chunk's Gram matrix is one f64 matrix product,
/// exact, and the chunks are summed in i128. Values too wide for that (max^2
/// above 2^53 / 64) take the i128 loop.
fn gram_upper(r: &mut [i128], rows: &[&[i64]], k: usize) {
    let max = rows
        .iter()
        .flat_map(|y| y.iter())
        .map(|v| v.unsigned_abs())
        .max()
        .unwrap_or(0);
    let square = u128::from(max) * u128::from(max);
    let exact_rows = (1u128 << 53).checked_div(square).unwrap_or(u128::MAX);
    if exact_rows < 64 {
        rows.iter().for_each(|y| accumulate_upper(r, y));
        return;
    }
    let chunk = exact_rows.min(GRAM_CHUNK as u128) as usize;
    for part in rows.chunks(chunk) {
        let x = DMatrix::from_fn(part.len(), k, |i, j| part[i][j] as f64);
        let gram = x.transpose() * &x;
        let mut idx = 0;
        for i in 0..k {
            for j in i..k {
                r[idx] += gram[(i, j)] as i128;
                idx += 1;
            }
        }
    }
}

/// Adds the upper triangle of y y^T to `r` in i128.
fn accumulate_upper(r: &mut [i128], y: &[i64]) {
    let dim = y.len();
    let mut idx = 0;
    for i in 0..dim {
        let yi = y[i] as i128;
        for &yj in &y[i..dim] {
            r[idx] += yi * yj as i128;
            idx += 1;
        }
    }
}

impl Share {
    /// Computes the share of encoded rows exactly in i128.
    pub fn from_rows(rows: &[Vec<i64>], dim: usize) -> Self {
        Self::from_split_rows(rows, rows, dim, None)
    }

    /// The general share: R from `matrix_rows` (the rows, or their projections),
    /// the vector block from `rows`, split by class when `classes` is given.
    pub fn from_split_rows(
        matrix_rows: &[Vec<i64>],
        rows: &[Vec<i64>],
        dim: usize,
        classes: Option<&ClassRows<'_>>,
    ) -> Self {
        let k = matrix_rows.first().map_or(dim, Vec::len);
        let tri = k * (k + 1) / 2;
        let (g, blocks) = match classes {
            Some(c) => (c.classes, if c.per_class_matrix { c.classes } else { 1 }),
            None => (0, 1),
        };
        let mut r_upper = vec![0i128; blocks * tri];
        let mut v = vec![0i128; if g == 0 { dim } else { g * (dim + 1) }];
        let mut block_rows: Vec<Vec<&[i64]>> = vec![Vec::new(); blocks];
        for (i, (y, x)) in matrix_rows.iter().zip(rows).enumerate() {
            let (block, class) = match classes {
                Some(c) => {
                    let class = c.labels[i];
                    v[g * dim + class] += c.count_scale as i128;
                    (if c.per_class_matrix { class } else { 0 }, class)
                }
                None => (0, 0),
            };
            block_rows[block].push(y);
            for (vi, &xi) in v[class * dim..(class + 1) * dim].iter_mut().zip(x) {
                *vi += xi as i128;
            }
        }
        for (block, ys) in block_rows.iter().enumerate() {
            gram_upper(&mut r_upper[block * tri..(block + 1) * tri], ys, k);
        }
        Self {
            r_upper,
            v,
            n: rows.len() as u64,
        }
    }

    /// Computes a classification share of encoded rows. `classes.labels` has one
    /// entry per row; the caller maps labels to indices (and refuses unknown ones).
    pub fn from_class_rows(rows: &[Vec<i64>], dim: usize, classes: &ClassRows<'_>) -> Self {
        Self::from_split_rows(rows, rows, dim, Some(classes))
    }

    /// The public preprocessing and the share of raw rows, in one step: each row is
    /// clipped to the bounds, mapped to [-1, 1], clipped to the row-norm bound and
    /// encoded exactly. Returns the share and how many rows the norm clip changed.
    pub fn from_raw_rows(
        rows: &[Vec<f64>],
        bounds: &[(f64, f64)],
        fixed: &FixedPoint,
        classes: Option<&ClassRows<'_>>,
        projection: Option<&Projection>,
    ) -> (Self, usize) {
        let mut clipped = 0;
        let normalized: Vec<Vec<f64>> = rows
            .iter()
            .map(|r| {
                let (x, c) = normalize_row(r, bounds, fixed.row_norm_bound);
                clipped += usize::from(c);
                x
            })
            .collect();
        let encoded: Vec<Vec<i64>> = normalized.iter().map(|x| fixed.encode_row(x)).collect();
        let share = match projection {
            Some(p) => {
                let projected: Vec<Vec<i64>> = normalized
                    .iter()
                    .map(|x| fixed.encode_row(&p.apply(x, fixed.row_norm_bound)))
                    .collect();
                Self::from_split_rows(&projected, &encoded, bounds.len(), classes)
            }
            None => Self::from_split_rows(&encoded, &encoded, bounds.len(), classes),
        };
        (share, clipped)
    }

    /// Sum of shares (the pooled share, for plaintext reference computations).
    /// `None` for no shares, or shares of different layouts.
    pub fn sum(shares: &[Share]) -> Option<Share> {
        let (first, rest) = shares.split_first()?;
        let mut acc = first.clone();
        for s in rest {
            acc.merge(s).ok()?;
        }
        Some(acc)
    }

    /// Adds `other`, the share of more rows of the same study, to this one: the
    /// share of a table is the merge of its batches' shares, in any grouping
    /// and order, to the bit (integer sums). Refused for a share of another
    /// layout.
    pub fn merge(&mut self, other: &Share) -> Result<(), ProtocolError> {
        if other.r_upper.len() != self.r_upper.len() || other.v.len() != self.v.len() {
            return Err(ProtocolError::Count {
                expected: self.r_upper.len() + self.v.len(),
                got: other.r_upper.len() + other.v.len(),
            });
        }
        self.r_upper
            .iter_mut()
            .zip(&other.r_upper)
            .for_each(|(a, b)| *a += b);
        self.v.iter_mut().zip(&other.v).for_each(|(a, b)| *a += b);
        self.n += other.n;
        Ok(())
    }

    /// The plaintext residues an owner encrypts, in layout order: packed segments of
    /// every matrix block, the vector block (packed or one value each), then N.
    pub fn plaintexts(
        &self,
        layout: &StudyLayout,
        pk: &PublicKey,
    ) -> Result<Vec<BigUint>, ProtocolError> {
        self.noised_plaintexts(layout, pk, None)
    }

    /// [`Share::plaintexts`] with the owner's share of the study's noise added
    /// to every released entry (`noise`: the matrix blocks' upper triangles, then
    /// the vector block, as [`OwnerNoise::sample`] draws them), where the owners
    /// add the noise ([`crate::dp::distributed`]).
    pub fn noised_plaintexts(
        &self,
        layout: &StudyLayout,
        pk: &PublicKey,
        noise: Option<&ShareNoise>,
    ) -> Result<Vec<BigUint>, ProtocolError> {
        if let Some(noise) = noise {
            return self.plaintexts_with(layout, pk, noise);
        }
        let tri = layout.triangle.total();
        if self.r_upper.len() != layout.matrix_blocks * tri || self.v.len() != layout.vector_len {
            return Err(ProtocolError::Count {
                expected: layout.matrix_blocks * tri + layout.vector_len,
                got: self.r_upper.len() + self.v.len(),
            });
        }
        let mut out = Vec::with_capacity(layout.owner_ciphertexts());
        pack_matrix(layout, pk, &self.r_upper, SlotBudget::pack_i128, &mut out)?;
        if layout.vector_packed {
            pack_vector(layout, pk, &self.v, SlotBudget::pack_i128, &mut out)?;
        } else {
            for &vi in &self.v {
                out.push(pk.encode_signed(&BigInt::from(vi))?);
            }
        }
        out.push(BigUint::from(self.n));
        Ok(out)
    }

    /// The plaintexts with `noise` added, in big integers (noise and values
    /// together may pass i128). Only a packed vector block is noised by owners
    /// (`dp-mean`).
    fn plaintexts_with(
        &self,
        layout: &StudyLayout,
        pk: &PublicKey,
        noise: &ShareNoise,
    ) -> Result<Vec<BigUint>, ProtocolError> {
        let tri = layout.triangle.total();
        let matrix_len = layout.matrix_blocks * tri;
        if self.r_upper.len() != matrix_len
            || self.v.len() != layout.vector_len
            || noise.matrix.len() != matrix_len
            || noise.vector.len() != layout.vector_len
            || !layout.vector_packed
        {
            return Err(ProtocolError::Count {
                expected: 2 * (matrix_len + layout.vector_len),
                got: self.r_upper.len() + self.v.len() + noise.matrix.len() + noise.vector.len(),
            });
        }
        let noised = |values: &[i128], noise: &[BigInt]| -> Vec<BigInt> {
            values
                .iter()
                .zip(noise)
                .map(|(&x, e)| BigInt::from(x) + e)
                .collect()
        };
        let mut out = Vec::with_capacity(layout.owner_ciphertexts());
        let r = noised(&self.r_upper, &noise.matrix);
        pack_matrix(layout, pk, &r, SlotBudget::pack, &mut out)?;
        let v = noised(&self.v, &noise.vector);
        pack_vector(layout, pk, &v, SlotBudget::pack, &mut out)?;
        out.push(BigUint::from(self.n));
        Ok(out)
    }
}

/// Appends the packed segments of every matrix block of `r` (upper triangles,
/// block after block), each packed by `pack` in the matrix slots.
fn pack_matrix<T>(
    layout: &StudyLayout,
    pk: &PublicKey,
    r: &[T],
    pack: impl Fn(&SlotBudget, &[T]) -> Result<BigInt, EncodingError>,
    out: &mut Vec<BigUint>,
) -> Result<(), ProtocolError> {
    let dim = layout.triangle.dim;
    for block in r.chunks(layout.triangle.total().max(1)) {
        for seg in &layout.triangle.segments {
            let start = TriangleLayout::upper_index(dim, seg.row, seg.col);
            let packed = pack(&layout.budget, &block[start..start + seg.len])?;
            out.push(pk.encode_signed(&packed)?);
        }
    }
    Ok(())
}

/// Appends the packed segments of the vector block `v`, each packed by `pack` in
/// the vector's slots.
fn pack_vector<T>(
    layout: &StudyLayout,
    pk: &PublicKey,
    v: &[T],
    pack: impl Fn(&SlotBudget, &[T]) -> Result<BigInt, EncodingError>,
    out: &mut Vec<BigUint>,
) -> Result<(), ProtocolError> {
    for &(start, len) in &layout.vector {
        let packed = pack(&layout.vector_budget, &v[start..start + len])?;
        out.push(pk.encode_signed(&packed)?);
    }
    Ok(())
}

/// One owner's draw of its share of the study's noise: the matrix blocks' upper
/// triangles (row-major, block after block), then the vector block.
#[derive(Clone, Debug)]
pub struct ShareNoise {
    /// Noise on the matrix blocks' upper triangles.
    pub matrix: Vec<BigInt>,
    /// Noise on the vector block.
    pub vector: Vec<BigInt>,
}

impl ShareNoise {
    /// Draws the share for `layout` from `noise`; `None` for a draw beyond the
    /// tail the slots hold (probability below 2^-1000).
    pub fn draw<R: rand::RngCore + rand::CryptoRng>(
        noise: &OwnerNoise,
        layout: &StudyLayout,
        rng: &mut R,
    ) -> Option<Self> {
        let matrix = layout.matrix_blocks * layout.triangle.total();
        let (matrix, vector) = noise.sample(matrix, layout.vector_len, rng)?;
        Some(Self { matrix, vector })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(rows: &[Vec<i64>], k: usize) -> Vec<i128> {
        let mut r = vec![0i128; k * (k + 1) / 2];
        rows.iter().for_each(|y| accumulate_upper(&mut r, y));
        r
    }

    proptest! {
        /// The f64 matrix products equal the i128 sums to the bit (above 5
        /// features the product is matrixmultiply's), at the widest values each
        /// path takes: chunks of 1024 rows at 2^20 (f = 20, C = 1),
        /// of 128 rows at 2^23, and the i128 loop beyond; every value may sit at
        /// the extreme, where a rounding would show first.
        #[test]
        fn gram_matrices_are_exact(
            bits in prop::sample::select(vec![20u32, 23, 24, 30]),
            n in 1usize..1300,
            k in 1usize..12,
            seed in any::<u64>(),
        ) {
            let max = (1i64 << bits) - 1;
            let mut state = seed | 1;
            let mut next = || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let rows: Vec<Vec<i64>> = (0..n)
                .map(|_| {
                    (0..k)
                        .map(|_| match next() % 4 {
                            0 => max,
                            1 => -max,
                            _ => (next() % (2 * max as u64 + 1)) as i64 - max,
                        })
                        .collect()
                })
                .collect();
            let views: Vec<&[i64]> = rows.iter().map(Vec::as_slice).collect();
            let mut got = vec![0i128; k * (k + 1) / 2];
            gram_upper(&mut got, &views, k);
            prop_assert_eq!(got, reference(&rows, k));
        }

        /// Any split of a table into batches, each batch's share merged in any
        /// order, is the share of the whole table, to the bit, classes or not;
        /// and the clipped rows add up.
        #[test]
        fn the_merge_of_any_split_is_the_share_of_the_whole(
            rows in prop::collection::vec(prop::collection::vec(-3.0f64..3.0, 4), 1..60),
            cuts in prop::collection::vec(0usize..60, 0..6),
            order in any::<u64>(),
            with_classes: bool,
        ) {
            let bounds = vec![(-2.0, 2.0); 4];
            let fixed = crate::encoding::FixedPoint { frac_bits: 16, row_norm_bound: 1.0 };
            let labels: Vec<usize> = (0..rows.len()).map(|i| i % 3).collect();
            let classes_of = |range: std::ops::Range<usize>| ClassRows {
                labels: &labels[range],
                classes: 3,
                per_class_matrix: true,
                count_scale: 1 << 16,
            };
            let share_of = |range: std::ops::Range<usize>| {
                let classes = with_classes.then(|| classes_of(range.clone()));
                Share::from_raw_rows(&rows[range], &bounds, &fixed, classes.as_ref(), None)
            };
            let (whole, clipped) = share_of(0..rows.len());
            let mut edges: Vec<usize> = cuts.iter().map(|c| c % rows.len()).collect();
            edges.extend([0, rows.len()]);
            edges.sort_unstable();
            edges.dedup();
            let mut parts: Vec<(Share, usize)> =
                edges.windows(2).map(|w| share_of(w[0]..w[1])).collect();
            // A rotation of the parts: any order merges alike.
            let turn = (order % parts.len() as u64) as usize;
            parts.rotate_left(turn);
            let mut merged = parts[0].0.clone();
            let mut clipped_sum = parts[0].1;
            for (part, c) in &parts[1..] {
                merged.merge(part).expect("same layout");
                clipped_sum += c;
            }
            prop_assert_eq!(merged, whole);
            prop_assert_eq!(clipped_sum, clipped);
        }
    }

    #[test]
    fn a_share_of_another_layout_is_not_merged() {
        let mut a = Share {
            r_upper: vec![1, 2, 3],
            v: vec![1, 2],
            n: 1,
        };
        let b = Share {
            r_upper: vec![1],
            v: vec![1],
            n: 1,
        };
        assert!(a.merge(&b).is_err());
        assert_eq!(a.n, 1, "nothing merged");
    }
}
