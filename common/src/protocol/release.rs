//! The proxy's release: the mask and noise sampled once, and the masked, noised,
//! re-randomized ciphertexts computed from the aggregate.

use num_bigint::{BigInt, BigUint};
use num_traits::{One, Zero};
use rand::{CryptoRng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;

use super::ProtocolError;
use crate::arith::{random_seed, Elem};
use crate::dp::{Centering, NoisePlan};
use crate::encoding::{Segment, TriangleLayout};
use crate::paillier::{random_below, Ciphertext, PublicKey};
use crate::radix::{self, RadixPowers};
use crate::randomizer::Randomness;
use crate::study::{MaskChain, StudyLayout};

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

/// A ciphertext held in the key's ring, where the mask term's chains square it.
fn in_ring(pk: &PublicKey, c: &Ciphertext) -> Elem {
    pk.ring().elem(&(&c.0 % pk.n_squared()))
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
    let seeds: Vec<[u8; 32]> = (0..total).map(|_| random_seed(seed_rng)).collect();
    let rerandomize = |c: Ciphertext, seed: &[u8; 32]| {
        let mut rng = ChaCha20Rng::from_seed(*seed);
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
    let r_cts = &agg[..layout.triangle.len()];
    let v_cts = &agg[layout.triangle.len()..layout.triangle.len() + dim];
    let b = &secrets.mask;
    let mask_terms = if layout.baseline {
        mask_terms_baseline(layout, pk, v_cts, b)
    } else {
        mask_terms(layout, pk, v_cts, b)?
    };
    let n_big = BigUint::from(n_rows);
    let matrix = layout
        .triangle
        .segments
        .par_iter()
        .zip(r_cts.par_iter().zip(mask_terms.par_iter()))
        .map(|(seg, (r, mask_term))| {
            let start = TriangleLayout::upper_index(dim, seg.row, seg.col);
            let noise = &secrets.matrix_noise[start..start + seg.len];
            // b_i b_j + E'_ij in clear.
            let plain: Vec<BigInt> = (0..seg.len)
                .map(|t| BigInt::from(&b[seg.row] * &b[seg.col + t]) + &noise[t])
                .collect();
            let c = pk.add(&pk.scale(r, &n_big), mask_term);
            Ok(pk.add_plain(&c, &layout.budget.pack_residue(&plain, pk.n())))
        });
    matrix.chain(masked_vector(layout, pk, v_cts, b)).collect()
}

/// v' in the vector block's own slots, by Horner's rule on the owners' E[v_k].
fn masked_vector<'a>(
    layout: &'a StudyLayout,
    pk: &'a PublicKey,
    v_cts: &'a [Ciphertext],
    b: &'a [BigUint],
) -> impl IndexedParallelIterator<Item = Result<Ciphertext, ProtocolError>> + 'a {
    let step = BigUint::one() << layout.vector_budget.slot_width as usize;
    layout.vector.par_iter().map(move |&(start, len)| {
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
}

/// The mask term of every matrix segment (row i, columns j..j+len), in segment
/// order: E[v_seg]^(b_i) * E[v_i]^(B_seg), with v_seg = sum_t v_(j+t) 2^(t w) and
/// B_seg = sum_t b_(j+t) 2^(t w), that is E[sum_t (b_i v_(j+t) + v_i b_(j+t)) 2^(t w)].
///
/// One chain of squarings per column k gives both what v_seg is assembled from
/// (E[v_k 2^(t w)]) and the radix powers of E[v_k] that every B_seg of row k is
/// read through ([`radix::product`]). Rows go from the last up, a chunk at a time:
/// a row's segments read the shifts of the columns at and right of it, all on
/// chains already run, and only the chunk's radix powers are held: about
/// |n^2| |n| / (8 r) bytes a row, 8 rows a thread (5 MiB on two threads at
/// M = 1000 and 3072 bits, where all rows' would be over 300 MB).
fn mask_terms(
    layout: &StudyLayout,
    pk: &PublicKey,
    v_cts: &[Ciphertext],
    b: &[BigUint],
) -> Result<Vec<Ciphertext>, ProtocolError> {
    let triangle = &layout.triangle;
    let first_segment = first_segments(triangle);
    let chunk = rows_a_chunk();
    let mut shifts: Vec<Vec<Elem>> = vec![Vec::new(); triangle.dim];
    let mut chunks = Vec::new();
    let mut hi = triangle.dim;
    while hi > 0 {
        let lo = hi.saturating_sub(chunk);
        let chains: Vec<(Vec<Elem>, RadixPowers)> = (lo..hi)
            .into_par_iter()
            .map(|k| column_chain(pk, &v_cts[k], layout.mask_chain(k)))
            .collect();
        let mut row_powers = Vec::with_capacity(hi - lo);
        for (k, (shifted, powers)) in (lo..hi).zip(chains) {
            shifts[k] = shifted;
            row_powers.push(powers);
        }
        let terms: Vec<Result<Ciphertext, ProtocolError>> = (first_segment[lo]..first_segment[hi])
            .into_par_iter()
            .map(|s| {
                let seg = &triangle.segments[s];
                segment_mask_term(layout, pk, seg, &shifts, &row_powers[seg.row - lo], b)
            })
            .collect();
        chunks.push(terms);
        hi = lo;
    }
    chunks.into_iter().rev().flatten().collect()
}

/// Rows whose chains run together: enough to keep every thread of the pool busy.
fn rows_a_chunk() -> usize {
    (8 * rayon::current_num_threads()).max(8)
}

/// Index of each row's first segment, and the segment count last.
fn first_segments(triangle: &TriangleLayout) -> Vec<usize> {
    let mut first = vec![triangle.len(); triangle.dim + 1];
    for (s, seg) in triangle.segments.iter().enumerate().rev() {
        first[seg.row] = s;
    }
    first
}

/// Column k's shifts E[v_k 2^(t w)] and E[v_k]'s radix powers, off one chain.
fn column_chain(pk: &PublicKey, v: &Ciphertext, chain: MaskChain) -> (Vec<Elem>, RadixPowers) {
    let a = in_ring(pk, v);
    let spaced = [
        (chain.width, chain.shifts),
        (chain.radix as u64, chain.digits),
    ];
    let mut powers = radix::squarings(pk, a, &spaced).into_iter();
    let shifted = powers.next().unwrap_or_default();
    let radix_powers = RadixPowers::from_chain(chain.radix, powers.next().unwrap_or_default());
    (shifted, radix_powers)
}

/// E[v_seg]^(b_i) * E[v_i]^(B_seg) for one segment: one Yao product over the
/// digits of B_seg on row i's radix powers and of b_i on v_seg's.
fn segment_mask_term(
    layout: &StudyLayout,
    pk: &PublicKey,
    seg: &Segment,
    shifts: &[Vec<Elem>],
    row_powers: &RadixPowers,
    b: &[BigUint],
) -> Result<Ciphertext, ProtocolError> {
    let ring = pk.ring();
    let width = layout.budget.slot_width as usize;
    let mut v_seg = shifts[seg.col][0].clone();
    for t in 1..seg.len {
        v_seg = ring.mul_elem(&v_seg, &shifts[seg.col + t][t]);
    }
    let v_powers = RadixPowers::new(pk, v_seg, row_powers.radix_bits(), layout.mask_bits);
    let b_seg = radix::shifted_sum(&b[seg.col..seg.col + seg.len], width);
    Ok(radix::product(
        pk,
        &[(row_powers, &b_seg), (&v_powers, &b[seg.row])],
    )?)
}

/// The paper's way, the baseline's: E[v_seg]^(b_i) and each E[v_i 2^(t w)]^(b_(j+t))
/// one exponentiation apiece, on shifts of every column by squarings.
fn mask_terms_baseline(
    layout: &StudyLayout,
    pk: &PublicKey,
    v_cts: &[Ciphertext],
    b: &[BigUint],
) -> Vec<Ciphertext> {
    let spaced = [(layout.budget.slot_width, layout.budget.slots)];
    let table: Vec<Vec<Ciphertext>> = v_cts
        .par_iter()
        .map(|v| {
            let shifts = radix::squarings(pk, in_ring(pk, v), &spaced);
            shifts
                .into_iter()
                .flatten()
                .map(|e| Ciphertext(e.to_big()))
                .collect()
        })
        .collect();
    layout
        .triangle
        .segments
        .par_iter()
        .map(|seg| {
            let mut v_seg = table[seg.col][0].clone();
            for t in 1..seg.len {
                v_seg = pk.add(&v_seg, &table[seg.col + t][t]);
            }
            let mut c = pk.scale(&v_seg, &b[seg.row]);
            for t in 0..seg.len {
                c = pk.add(&c, &pk.scale(&table[seg.row][t], &b[seg.col + t]));
            }
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{test_key, test_spec};
    use rand_chacha::ChaCha20Rng;

    /// Several segments to a row and several chunks of rows (M = 40, 3 slots, on a
    /// pool of two threads): every segment's mask term decrypts to
    /// sum_t (b_i v_(j+t) + v_i b_(j+t)) 2^(t w) mod n, and equals the baseline's.
    #[test]
    fn mask_terms_decrypt_to_the_masked_segment() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool of two threads");
        pool.install(mask_terms_decrypt_on_this_pool);
    }

    /// The test spec's layout at `dim` features cut into segments of 3 slots.
    fn three_slot_layout(pk: &PublicKey, dim: usize) -> StudyLayout {
        let mut layout = StudyLayout::new(&test_spec(pk, dim)).expect("layout");
        layout.budget.slots = 3;
        layout.triangle = TriangleLayout::new(dim, 3);
        layout
    }

    fn mask_terms_decrypt_on_this_pool() {
        let sk = test_key();
        let pk = sk.public();
        let dim = 40;
        let mut layout = three_slot_layout(pk, dim);
        layout.mask_bits = 74;
        let mut rng = ChaCha20Rng::seed_from_u64(40);
        let v: Vec<BigUint> = (0..dim)
            .map(|_| random_below(&BigUint::from(1u64 << 40), &mut rng))
            .collect();
        let b: Vec<BigUint> = (0..dim)
            .map(|_| random_below(&(BigUint::one() << 74usize), &mut rng))
            .collect();
        let v_cts: Vec<Ciphertext> = v
            .iter()
            .map(|x| pk.encrypt(x, &mut rng).expect("encrypts"))
            .collect();
        let fast = mask_terms(&layout, pk, &v_cts, &b).expect("mask terms");
        assert_eq!(fast, mask_terms_baseline(&layout, pk, &v_cts, &b));
        let w = layout.budget.slot_width as usize;
        assert!(layout.triangle.len() > 2 * dim, "rows of several segments");
        assert!(dim > 2 * rows_a_chunk(), "several chunks of rows");
        for (seg, c) in layout.triangle.segments.iter().zip(&fast) {
            let want = (0..seg.len).fold(BigUint::zero(), |acc, t| {
                let (i, k) = (seg.row, seg.col + t);
                acc + ((&b[i] * &v[k] + &v[i] * &b[k]) << (t * w))
            }) % pk.n();
            assert_eq!(sk.decrypt(c), want, "segment {seg:?}");
        }
    }

    /// B_seg with every mask at its largest carries past the last mask's top bit
    /// (masks are wider than slots); the layout's bound and the release's radix
    /// powers cover it.
    #[test]
    fn the_widest_b_seg_fits_its_radix_powers() {
        let sk = test_key();
        let pk = sk.public();
        let dim = 6;
        let mut layout = three_slot_layout(pk, dim);
        layout.mask_bits = layout.budget.slot_width + 5;
        let w = layout.budget.slot_width as usize;
        let top = (BigUint::one() << layout.mask_bits as usize) - 1u8;
        for len in 1..=3 {
            let widest = radix::shifted_sum(vec![&top; len], w);
            assert!(widest.bits() <= layout.mask_exponent_bits(len), "len {len}");
        }
        let b = vec![top; dim];
        let v_cts: Vec<Ciphertext> = (0..dim)
            .map(|k| Ciphertext(BigUint::from(k as u64 + 2)))
            .collect();
        let fast = mask_terms(&layout, pk, &v_cts, &b).expect("every B_seg is read");
        assert_eq!(fast, mask_terms_baseline(&layout, pk, &v_cts, &b));
    }
}
