//! The proxy's release: the mask and noise sampled once, and the masked, noised,
//! re-randomized ciphertexts computed from the aggregate.

use num_bigint::{BigInt, BigUint};
use num_traits::{One, Zero};
use rand::rngs::StdRng;
use rand::{CryptoRng, RngCore, SeedableRng};
use rayon::prelude::*;

use super::ProtocolError;
use crate::dp::{Centering, NoisePlan};
use crate::encoding::TriangleLayout;
use crate::paillier::{random_below, Ciphertext, PowerTable, PublicKey};
use crate::randomizer::Randomness;
use crate::study::StudyLayout;

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
                .vector_budget
                .pack(&secrets.vector_noise[start..start + len])?;
            Ok(pk.add_plain(&agg[base + k], &pk.encode_signed(&packed)?))
        });
    matrix.chain(vector).collect()
}

/// `mask`: T = N R + v b^T + b v^T + b b^T + E' per packed segment, and v' = v + b
/// packed from the owners' unpacked v. T's entries are wider than the matrix slots;
/// the packed residues are still exact mod n, and the user decodes them only after
/// subtracting v' v'^T, which leaves N S~ + E' in every slot.
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
        Ok(pk.add_plain(&c, &layout.budget.pack_residue(&plain, pk.n())))
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
    // v' in the vector block's own slots, by Horner's rule on the owners' E[v_k].
    let step = BigUint::one() << layout.vector_budget.slot_width as usize;
    let vecs: Vec<Result<Ciphertext, ProtocolError>> = layout
        .vector
        .par_iter()
        .map(|&(start, len)| {
            let mut c = v_cts[start + len - 1].clone();
            for k in (start..start + len - 1).rev() {
                c = pk.add(&pk.scale(&c, &step), &v_cts[k]);
            }
            let plain: Vec<BigInt> = b[start..start + len]
                .iter()
                .map(|b| BigInt::from(b.clone()))
                .collect();
            let packed = layout.vector_budget.pack(&plain)?;
            Ok(pk.add_plain(&c, &pk.encode_signed(&packed)?))
        })
        .collect();
    per_row.into_iter().flatten().chain(vecs).collect()
}
