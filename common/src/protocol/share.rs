//! An owner's share (R, v, N) as exact integers, and its packed plaintexts.

use num_bigint::{BigInt, BigUint};

use super::ProtocolError;
use crate::data::normalize_row;
use crate::encoding::{FixedPoint, TriangleLayout};
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

/// Adds the upper triangle of y y^T to `r` and x to `v`, exactly (y = x, or the
/// projected row of a projected study).
fn accumulate(r: &mut [i128], v: &mut [i128], y: &[i64], x: &[i64]) {
    let dim = y.len();
    let mut idx = 0;
    for i in 0..dim {
        let yi = y[i] as i128;
        for &yj in &y[i..dim] {
            r[idx] += yi * yj as i128;
            idx += 1;
        }
    }
    for (vi, &xi) in v.iter_mut().zip(x) {
        *vi += xi as i128;
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
        for (i, (y, x)) in matrix_rows.iter().zip(rows).enumerate() {
            let (block, class) = match classes {
                Some(c) => {
                    let class = c.labels[i];
                    v[g * dim + class] += c.count_scale as i128;
                    (if c.per_class_matrix { class } else { 0 }, class)
                }
                None => (0, 0),
            };
            accumulate(
                &mut r_upper[block * tri..(block + 1) * tri],
                &mut v[class * dim..(class + 1) * dim],
                y,
                x,
            );
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
    pub fn sum(shares: &[Share]) -> Option<Share> {
        let first = shares.first()?;
        let mut acc = first.clone();
        for s in &shares[1..] {
            acc.r_upper
                .iter_mut()
                .zip(&s.r_upper)
                .for_each(|(a, b)| *a += b);
            acc.v.iter_mut().zip(&s.v).for_each(|(a, b)| *a += b);
            acc.n += s.n;
        }
        Some(acc)
    }

    /// The plaintext residues an owner encrypts, in layout order: packed segments of
    /// every matrix block, the vector block (packed or one value each), then N.
    pub fn plaintexts(
        &self,
        layout: &StudyLayout,
        pk: &PublicKey,
    ) -> Result<Vec<BigUint>, ProtocolError> {
        let tri = layout.triangle.total();
        if self.r_upper.len() != layout.matrix_blocks * tri || self.v.len() != layout.vector_len {
            return Err(ProtocolError::Count {
                expected: layout.matrix_blocks * tri + layout.vector_len,
                got: self.r_upper.len() + self.v.len(),
            });
        }
        let dim = layout.triangle.dim;
        let mut out = Vec::with_capacity(layout.owner_ciphertexts());
        for block in self.r_upper.chunks(tri) {
            for seg in &layout.triangle.segments {
                let start = TriangleLayout::upper_index(dim, seg.row, seg.col);
                let packed = layout.budget.pack_i128(&block[start..start + seg.len])?;
                out.push(pk.encode_signed(&packed)?);
            }
        }
        if layout.vector_packed {
            for &(start, len) in &layout.vector {
                let packed = layout
                    .vector_budget
                    .pack_i128(&self.v[start..start + len])?;
                out.push(pk.encode_signed(&packed)?);
            }
        } else {
            for &vi in &self.v {
                out.push(pk.encode_signed(&BigInt::from(vi))?);
            }
        }
        out.push(BigUint::from(self.n));
        Ok(out)
    }
}
