//! The three computations of a study, as pure functions: an owner's share and its
//! plaintexts, the proxy's masked and noised release (DESIGN section 4), and the
//! user's reconstruction of S + E.
//!
//! Release in `mask` centering, per packed segment (row i, columns j..j+len):
//!
//! ```text
//! T = N R + v b^T + b v^T + b b^T + E'        v' = v + b
//! E[T_seg] = E[R_seg]^N * E[v_seg]^(b_i) * prod_t E[v_i 2^(t w)]^(b_(j+t)) * (1 + P n) * r^n
//! ```
//!
//! with P the packed plaintext b_i b_(j+t) + E'_(i,j+t), and E[v_k 2^(t w)] the
//! shifted ciphertexts precomputed once per k by squarings. The user computes
//! T - v' v'^T = N R - v v^T + E' = N S~ + E', in which the masks cancel exactly:
//! nothing the user decrypts depends on b beyond v' = v + b.

use nalgebra::{DMatrix, DVector};
use num_bigint::{BigInt, BigUint, Sign};
use num_traits::{One, ToPrimitive, Zero};
use rand::rngs::StdRng;
use rand::{CryptoRng, RngCore, SeedableRng};
use rayon::prelude::*;

use crate::data::normalize_row;
use crate::dp::{Centering, NoisePlan};
use crate::encoding::{EncodingError, FixedPoint, TriangleLayout};
use crate::paillier::{random_below, Ciphertext, PaillierError, PowerTable, PublicKey, SecretKey};
use crate::randomizer::Randomness;
use crate::study::{BlockShape, NormBins, Projection, StudyLayout};

/// Errors of the protocol computations.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// Encoding or slot overflow.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
    /// Key or ciphertext problem.
    #[error(transparent)]
    Paillier(#[from] PaillierError),
    /// A ciphertext vector of the wrong length.
    #[error("expected {expected} ciphertexts, got {got}")]
    Count {
        /// Expected.
        expected: usize,
        /// Received.
        got: usize,
    },
    /// A sampled noise value beyond the tail bound the slots were sized for.
    #[error("noise sample beyond the proven tail bound (probability below 2^-1000)")]
    NoiseTail,
}

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
                let packed = layout.budget.pack_i128(&self.v[start..start + len])?;
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

/// The proxy's per-study secrets, sampled once when the study is noised and kept
/// (a retry must re-serve the same release, or the user could average noise away).
#[derive(Clone, Debug)]
pub struct ReleaseSecrets {
    /// Mask b (`mask` centering), else empty.
    pub mask: Vec<BigUint>,
    /// Upper triangle of the matrix noise, row-major.
    pub matrix_noise: Vec<BigInt>,
    /// Vector noise (`dp-mean`), else empty.
    pub vector_noise: Vec<BigInt>,
}

impl ReleaseSecrets {
    /// Samples the mask and the noise of a study.
    pub fn sample<R: RngCore + CryptoRng>(
        layout: &StudyLayout,
        centering: Centering,
        plan: &NoisePlan,
        rng: &mut R,
    ) -> Result<Self, ProtocolError> {
        let dim = layout.triangle.dim;
        let mut matrix_noise = Vec::with_capacity(layout.matrix_blocks * layout.triangle.total());
        for _ in 0..layout.matrix_blocks {
            matrix_noise.extend(plan.matrix.sample_upper(dim, rng));
        }
        let tail = plan.matrix.tail_bound();
        if matrix_noise.iter().any(|e| e.magnitude() > &tail) {
            return Err(ProtocolError::NoiseTail);
        }
        let (mask, vector_noise) = match centering {
            Centering::Mask => {
                let bound = BigUint::one() << layout.mask_bits as usize;
                (
                    (0..layout.vector_len)
                        .map(|_| random_below(&bound, rng))
                        .collect(),
                    Vec::new(),
                )
            }
            Centering::DpMean => {
                let noise = match &plan.vector {
                    Some(v) => {
                        let noise = v.sample_vector(layout.vector_len, rng);
                        let tail = v.tail_bound();
                        if noise.iter().any(|e| e.magnitude() > &tail) {
                            return Err(ProtocolError::NoiseTail);
                        }
                        noise
                    }
                    None => vec![BigInt::zero(); layout.vector_len],
                };
                (Vec::new(), noise)
            }
        };
        Ok(Self {
            mask,
            matrix_noise,
            vector_noise,
        })
    }
}

/// E[v_k 2^(t w)] for t < slots: only squarings, computed once per k.
fn shifted(pk: &PublicKey, v: &Ciphertext, slots: usize, width: u64) -> Vec<Ciphertext> {
    let mut out = Vec::with_capacity(slots);
    let mut cur = v.clone();
    let step = BigUint::one() << width as usize;
    for t in 0..slots {
        if t > 0 {
            cur = pk.scale(&cur, &step);
        }
        out.push(cur.clone());
    }
    out
}

/// Computes the released ciphertexts from the aggregate of all owners' contributions
/// (`agg`, in owner layout order), the pooled count N and the study's secrets.
/// Every output is re-randomized with fresh short-exponent randomness from
/// `randomizer`, its exponents drawn from `seed_rng`.
pub fn release<R: RngCore + CryptoRng>(
    layout: &StudyLayout,
    centering: Centering,
    agg: &[Ciphertext],
    n_rows: u64,
    secrets: &ReleaseSecrets,
    randomizer: Randomness<'_>,
    seed_rng: &mut R,
) -> Result<Vec<Ciphertext>, ProtocolError> {
    let pk = randomizer.public_key();
    if agg.len() != layout.owner_ciphertexts() {
        return Err(ProtocolError::Count {
            expected: layout.owner_ciphertexts(),
            got: agg.len(),
        });
    }
    // One fresh randomizer per output, drawn up front from the caller's RNG so the
    // parallel part stays deterministic given the RNG.
    let total = layout.release_ciphertexts();
    let seeds: Vec<[u8; 32]> = (0..total)
        .map(|_| {
            let mut s = [0u8; 32];
            seed_rng.fill_bytes(&mut s);
            s
        })
        .collect();
    let rerandomize = |c: Ciphertext, seed: &[u8; 32]| {
        let mut rng = StdRng::from_seed(*seed);
        randomizer.rerandomize(&c, &mut rng)
    };
    let out = match centering {
        Centering::Mask => release_masked(layout, pk, agg, n_rows, secrets)?,
        Centering::DpMean => release_noised(layout, pk, agg, secrets)?,
    };
    Ok(out
        .into_par_iter()
        .zip(seeds.par_iter())
        .map(|(c, seed)| rerandomize(c, seed))
        .collect())
}

/// `dp-mean`: every packed segment of the matrix blocks and of the vector block plus
/// its packed noise. Owners sent the vector block packed, so no exponentiation.
fn release_noised(
    layout: &StudyLayout,
    pk: &PublicKey,
    agg: &[Ciphertext],
    secrets: &ReleaseSecrets,
) -> Result<Vec<Ciphertext>, ProtocolError> {
    let dim = layout.triangle.dim;
    let segs = layout.triangle.len();
    let tri = layout.triangle.total();
    let matrix = (0..layout.matrix_ciphertexts()).into_par_iter().map(|k| {
        let (block, seg) = (k / segs, &layout.triangle.segments[k % segs]);
        let start = block * tri + TriangleLayout::upper_index(dim, seg.row, seg.col);
        let packed = layout
            .budget
            .pack(&secrets.matrix_noise[start..start + seg.len])?;
        Ok(pk.add_plain(&agg[k], &pk.encode_signed(&packed)?))
    });
    let base = layout.matrix_ciphertexts();
    let vector = layout
        .vector
        .par_iter()
        .enumerate()
        .map(|(k, &(start, len))| {
            let packed = layout
                .budget
                .pack(&secrets.vector_noise[start..start + len])?;
            Ok(pk.add_plain(&agg[base + k], &pk.encode_signed(&packed)?))
        });
    matrix.chain(vector).collect()
}

/// `mask`: T = N R + v b^T + b v^T + b b^T + E' per packed segment, and v' = v + b
/// packed from the owners' unpacked v.
fn release_masked(
    layout: &StudyLayout,
    pk: &PublicKey,
    agg: &[Ciphertext],
    n_rows: u64,
    secrets: &ReleaseSecrets,
) -> Result<Vec<Ciphertext>, ProtocolError> {
    let dim = layout.triangle.dim;
    let slots = layout.budget.slots;
    let width = layout.budget.slot_width;
    let r_cts = &agg[..layout.triangle.len()];
    let v_cts = &agg[layout.triangle.len()..layout.triangle.len() + dim];
    let table: Vec<Vec<Ciphertext>> = v_cts
        .par_iter()
        .map(|v| shifted(pk, v, slots, width))
        .collect();
    let n_big = BigUint::from(n_rows);
    let b = &secrets.mask;

    // Segments are laid out row by row; each row's segments share the row bases
    // E[v_i 2^(t w)] of the mask term, so their power tables are built once per row.
    let mut rows: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (s_idx, seg) in layout.triangle.segments.iter().enumerate() {
        match rows.last_mut() {
            Some((row, range)) if *row == seg.row => range.end = s_idx + 1,
            _ => rows.push((seg.row, s_idx..s_idx + 1)),
        }
    }
    let window = layout.mask_window();
    let segment = |s_idx: usize, row_tables: &[PowerTable]| -> Result<Ciphertext, ProtocolError> {
        let seg = &layout.triangle.segments[s_idx];
        let start = TriangleLayout::upper_index(dim, seg.row, seg.col);
        let noise = &secrets.matrix_noise[start..start + seg.len];
        let i = seg.row;
        // E[N R_seg]
        let mut c = pk.scale(&r_cts[s_idx], &n_big);
        // E[v_seg]^(b_i): v_seg assembled from the shifted table.
        let mut v_seg = table[seg.col][0].clone();
        for t in 1..seg.len {
            v_seg = pk.add(&v_seg, &table[seg.col + t][t]);
        }
        if layout.baseline {
            // The paper's way: one exponentiation per term.
            c = pk.add(&c, &pk.scale(&v_seg, &b[i]));
            for t in 0..seg.len {
                c = pk.add(&c, &pk.scale(&table[i][t], &b[seg.col + t]));
            }
        } else {
            // E[v_seg]^(b_i) * prod_t E[v_i 2^(t w)]^(b_(j+t)): one simultaneous
            // exponentiation over short exponents.
            let v_table = pk.power_table(&v_seg, window);
            let mut terms = vec![(&v_table, &b[i])];
            terms.extend((0..seg.len).map(|t| (&row_tables[t], &b[seg.col + t])));
            c = pk.add(&c, &pk.multi_scale_tables(&terms));
        }
        // b_i b_j + E'_ij in clear.
        let plain: Vec<BigInt> = (0..seg.len)
            .map(|t| BigInt::from(&b[i] * &b[seg.col + t]) + &noise[t])
            .collect();
        let packed = layout.budget.pack(&plain)?;
        Ok(pk.add_plain(&c, &pk.encode_signed(&packed)?))
    };
    let per_row: Vec<Vec<Result<Ciphertext, ProtocolError>>> = rows
        .par_iter()
        .map(|(row, range)| {
            let row_tables: Vec<PowerTable> = if layout.baseline {
                Vec::new()
            } else {
                let longest = range
                    .clone()
                    .map(|s| layout.triangle.segments[s].len)
                    .max()
                    .unwrap_or(0);
                table[*row][..longest]
                    .iter()
                    .map(|c| pk.power_table(c, window))
                    .collect()
            };
            // Rows near the top hold many segments: spread them over the cores too.
            range
                .clone()
                .into_par_iter()
                .map(|s_idx| segment(s_idx, &row_tables))
                .collect()
        })
        .collect();
    let vecs: Vec<Result<Ciphertext, ProtocolError>> = layout
        .vector
        .par_iter()
        .map(|&(start, len)| {
            let mut c = table[start][0].clone();
            for t in 1..len {
                c = pk.add(&c, &table[start + t][t]);
            }
            let plain: Vec<BigInt> = b[start..start + len]
                .iter()
                .map(|b| BigInt::from(b.clone()))
                .collect();
            let packed = layout.budget.pack(&plain)?;
            Ok(pk.add_plain(&c, &pk.encode_signed(&packed)?))
        })
        .collect();
    per_row.into_iter().flatten().chain(vecs).collect()
}

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
    if cts.len() != layout.release_ciphertexts() {
        return Err(ProtocolError::Count {
            expected: layout.release_ciphertexts(),
            got: cts.len(),
        });
    }
    let dim = layout.triangle.dim;
    let plains: Vec<BigInt> = if layout.baseline {
        cts.iter()
            .map(|c| sk.to_signed(sk.decrypt_textbook(c)))
            .collect()
    } else {
        cts.par_iter().map(|c| sk.decrypt_signed(c)).collect()
    };
    let segs = layout.triangle.len();
    let mut blocks = Vec::with_capacity(layout.matrix_blocks);
    for block in plains[..layout.matrix_ciphertexts()].chunks(segs.max(1)) {
        let mut t = vec![vec![BigInt::zero(); dim]; dim];
        for (seg, p) in layout.triangle.segments.iter().zip(block) {
            let vals = layout.budget.unpack(p, seg.len)?;
            for (k, val) in vals.into_iter().enumerate() {
                let j = seg.col + k;
                t[j][seg.row] = val.clone();
                t[seg.row][j] = val;
            }
        }
        blocks.push(t);
    }
    let mut vec = Vec::with_capacity(layout.vector_len);
    for (&(_, len), p) in layout
        .vector
        .iter()
        .zip(&plains[layout.matrix_ciphertexts()..])
    {
        vec.extend(layout.budget.unpack(p, len)?);
    }
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

/// Forms S' from the released integers: the full matrix blocks (`mask`: the masked
/// N-scaled T; `dp-mean`: R~ + E_R, or R~_c + E_c per class) and the vector block.
fn from_grid(
    layout: &BlockShape,
    centering: Centering,
    projection: Option<&Projection>,
    blocks: Vec<Vec<Vec<BigInt>>>,
    vec: Vec<BigInt>,
    n_rows: u64,
    frac_bits: u32,
) -> Opened {
    let dim = layout.dim;
    let k = layout.matrix_dim;
    let scale_1 = f64::from(frac_bits).exp2();
    let scale_2 = scale_1 * scale_1;
    let n = n_rows as f64;
    let to_matrix = |t: &[Vec<BigInt>]| DMatrix::from_fn(k, k, |i, j| to_f64(&t[i][j]) / scale_2);
    // A projected study's R lives on the k axes: sums are projected down to meet
    // it, and scatters lifted back as W S W^T (rank k, M x M).
    let axes = projection.map(|p| DMatrix::from_fn(k, dim, |i, j| p.axes[i][j]));
    let down = |v: &DVector<f64>| match &axes {
        Some(p) => p * v,
        None => v.clone(),
    };
    let up = |s: DMatrix<f64>| match &axes {
        Some(p) => p.transpose() * s * p,
        None => s,
    };
    let (matrix_grid, scatter, mean, classes) = match centering {
        Centering::Mask => {
            // T - v' v'^T = N S~ + E': the masks cancel exactly.
            let mut ns = blocks.into_iter().next().unwrap_or_default();
            for i in 0..dim {
                for j in 0..dim {
                    ns[i][j] -= &vec[i] * &vec[j];
                }
            }
            let s = DMatrix::from_fn(dim, dim, |i, j| to_f64(&ns[i][j]) / (n * scale_2));
            (vec![ns], s, None, None)
        }
        Centering::DpMean => {
            let rs: Vec<DMatrix<f64>> = blocks.iter().map(|t| to_matrix(t)).collect();
            let r_total = rs.iter().fold(DMatrix::zeros(k, k), |acc, r| acc + r);
            let g = layout.classes;
            let sums: Vec<DVector<f64>> = if g == 0 {
                vec![DVector::from_fn(dim, |i, _| to_f64(&vec[i]) / scale_1)]
            } else {
                (0..g)
                    .map(|c| DVector::from_fn(dim, |i, _| to_f64(&vec[c * dim + i]) / scale_1))
                    .collect()
            };
            let v = sums.iter().fold(DVector::zeros(dim), |acc, s| acc + s);
            // S' = R' - v' v'^T / N, in normalized units.
            let vk = down(&v);
            let s = up(&r_total - &vk * vk.transpose() / n);
            let classes = (g > 0).then(|| {
                let counts: Vec<f64> = (0..g)
                    .map(|c| to_f64(&vec[g * dim + c]) / layout.count_scale as f64)
                    .collect();
                // A noisy count below one would blow the mean up: divide by at least 1.
                let means: Vec<DVector<f64>> = sums
                    .iter()
                    .zip(&counts)
                    .map(|(s, &nc)| s / nc.max(1.0))
                    .collect();
                let scatters = if rs.len() == g {
                    rs.iter()
                        .zip(&sums)
                        .zip(&means)
                        .map(|((r, s), m)| up(r - down(s) * down(m).transpose()))
                        .collect()
                } else {
                    let between = sums
                        .iter()
                        .zip(&means)
                        .fold(DMatrix::zeros(k, k), |acc, (s, m)| {
                            acc + down(s) * down(m).transpose()
                        });
                    vec![up(&r_total - between)]
                };
                ClassStats {
                    counts,
                    means,
                    scatters,
                }
            });
            (blocks, s, Some(v / n), classes)
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

/// The same mechanism run centrally on the pooled plaintext share, with the same
/// secrets: what a trusted curator holding every row would release. The distributed
/// protocol opens to exactly this (a test checks equality), so it loses nothing.
/// In `mask` mode the mask cancels, so only the noise of `secrets` matters.
pub fn central_release(
    pooled: &Share,
    layout: &BlockShape,
    centering: Centering,
    projection: Option<&Projection>,
    secrets: &ReleaseSecrets,
    frac_bits: u32,
) -> Opened {
    let dim = layout.matrix_dim;
    let tri = dim * (dim + 1) / 2;
    let n = BigInt::from(pooled.n);
    let blocks = (0..layout.matrix_blocks)
        .map(|block| {
            let mut t = vec![vec![BigInt::zero(); dim]; dim];
            for i in 0..dim {
                for j in i..dim {
                    let idx = block * tri + TriangleLayout::upper_index(dim, i, j);
                    let r = BigInt::from(pooled.r_upper[idx]);
                    let e = &secrets.matrix_noise[idx];
                    let val = match centering {
                        // With the mask b = 0 the released T is N R + E and v' = v;
                        // `from_grid` subtracts v v^T as the user subtracts v' v'^T.
                        Centering::Mask => &n * r + e,
                        Centering::DpMean => r + e,
                    };
                    t[i][j] = val.clone();
                    t[j][i] = val;
                }
            }
            t
        })
        .collect();
    let vec: Vec<BigInt> = match centering {
        Centering::Mask => pooled.v.iter().map(|&x| BigInt::from(x)).collect(),
        Centering::DpMean => pooled
            .v
            .iter()
            .zip(&secrets.vector_noise)
            .map(|(&x, e)| BigInt::from(x) + e)
            .collect(),
    };
    from_grid(
        layout, centering, projection, blocks, vec, pooled.n, frac_bits,
    )
}

/// Lossy view of a big integer as f64 (values here are far below f64's range).
pub fn to_f64(v: &BigInt) -> f64 {
    v.to_f64().unwrap_or(match v.sign() {
        Sign::Minus => f64::NEG_INFINITY,
        _ => f64::INFINITY,
    })
}

#[cfg(test)]
mod tests;
