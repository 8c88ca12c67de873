//! Fixed-point encoding of rows and slot packing of Paillier plaintexts.
//!
//! Rows arrive normalized to [-1, 1] per feature and clipped to L2 norm C. Each value
//! is truncated toward zero to an integer of `frac_bits` fractional bits; truncation
//! never increases a magnitude, so the integer row x~ keeps ||x~|| <= C 2^f, which an
//! exact integer check then enforces against the integer bound `Cq = floor(C 2^f)`.
//! The DP sensitivity is derived from `Cq` (see `dp`), so rounding cannot break it.
//!
//! A plaintext of |n| bits carries `slots` signed values of `slot_width` bits each:
//! P = sum_t s_t 2^(t w) (mod n). All protocol arithmetic is linear in P, so after any
//! sequence of additions and scalings the plaintext still equals sum_t S_t 2^(t w) for
//! the final slot values S_t, as long as each final S_t lies in (-2^(w-1), 2^(w-1)) and
//! the whole sum stays below n/2. [`SlotBudget`] proves this from the study's public
//! bounds before anything is encrypted, and a study that cannot fit is refused.

use num_bigint::{BigInt, BigUint, Sign};
use num_integer::Integer;
use num_traits::{One, Zero};

/// Errors of encoding and packing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodingError {
    /// The slot width needed by the study's bounds leaves no slot in a plaintext.
    #[error("a slot needs {needed} bits but the plaintext has only {available}: lower max_rows, frac_bits or kappa, or use a larger key")]
    SlotTooWide {
        /// Bits one slot needs.
        needed: u64,
        /// Usable plaintext bits.
        available: u64,
    },
    /// A value does not fit its slot: the proof of the slot width was violated.
    #[error("value of {bits} bits does not fit a slot of {width} bits (slot {slot})")]
    SlotOverflow {
        /// Bits of the value.
        bits: u64,
        /// The slot width.
        width: u64,
        /// Slot index in the packed plaintext.
        slot: usize,
    },
    /// A row's integer norm exceeds the bound after encoding.
    #[error("fixed-point row norm exceeds the bound")]
    NormExceeded,
}

/// Fixed-point parameters shared by every party of a study.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FixedPoint {
    /// Fractional bits f.
    pub frac_bits: u32,
    /// Row L2 norm bound C in normalized units.
    pub row_norm_bound: f64,
}

impl FixedPoint {
    /// The integer norm bound Cq = floor(C 2^f) every encoded row obeys exactly.
    pub fn norm_bound_int(&self) -> u64 {
        (self.row_norm_bound * self.scale()).floor() as u64
    }

    /// 2^f as a float.
    pub fn scale(&self) -> f64 {
        (self.frac_bits as f64).exp2()
    }

    /// Encodes a row already normalized and clipped to ||x|| <= C: each value truncated
    /// toward zero, then the exact integer norm enforced against Cq by shrinking the
    /// largest entries (float rounding in the clip can overshoot by an ulp).
    pub fn encode_row(&self, row: &[f64]) -> Vec<i64> {
        let scale = self.scale();
        let mut out: Vec<i64> = row.iter().map(|&x| (x * scale).trunc() as i64).collect();
        let cq = self.norm_bound_int() as i128;
        let bound = cq * cq;
        loop {
            let norm2: i128 = out.iter().map(|&v| (v as i128) * (v as i128)).sum();
            if norm2 <= bound {
                return out;
            }
            // Move the largest magnitude one step toward zero; terminates because the
            // norm strictly decreases.
            let (idx, _) = out
                .iter()
                .enumerate()
                .max_by_key(|(_, v)| v.unsigned_abs())
                .unwrap_or((0, &0));
            out[idx] -= out[idx].signum();
        }
    }
}

/// The widths that packing needs, proven from the study's public bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotBudget {
    /// Bits per slot, sign included.
    pub slot_width: u64,
    /// Slots per plaintext.
    pub slots: usize,
}

impl SlotBudget {
    /// Chooses the slot width for final slot values bounded by `max_abs` in magnitude,
    /// for a modulus of `key_bits` bits. One bit for the sign, one of margin.
    pub fn for_bound(max_abs: &BigUint, key_bits: u64) -> Result<Self, EncodingError> {
        let slot_width = max_abs.bits() + 2;
        // Keep the packed value below n/2 so signed decoding is unambiguous.
        let available = key_bits.saturating_sub(2);
        let slots = (available / slot_width) as usize;
        if slots == 0 {
            return Err(EncodingError::SlotTooWide {
                needed: slot_width,
                available,
            });
        }
        Ok(Self { slot_width, slots })
    }

    /// Packs signed values into one integer sum_t v_t 2^(t w), checking each fits.
    pub fn pack(&self, values: &[BigInt]) -> Result<BigInt, EncodingError> {
        debug_assert!(values.len() <= self.slots);
        let limit = self.slot_width - 1;
        let mut acc = BigInt::zero();
        for (t, v) in values.iter().enumerate().rev() {
            if v.magnitude().bits() >= limit {
                return Err(EncodingError::SlotOverflow {
                    bits: v.magnitude().bits(),
                    width: self.slot_width,
                    slot: t,
                });
            }
            acc <<= self.slot_width as usize;
            acc += v;
        }
        Ok(acc)
    }

    /// Packs values of any size as the residue (sum_t v_t 2^(t w)) mod n, checking
    /// nothing. Packing is linear mod n, so a value too wide for its slot may enter
    /// a sum as long as it cancels before the sum is decoded: only the final slot
    /// values must fit (`mask` centering's b b^T, added by the proxy and taken off
    /// again, as v' v'^T, by the user).
    pub fn pack_residue(&self, values: &[BigInt], n: &BigUint) -> BigUint {
        let mut acc = BigInt::zero();
        for v in values.iter().rev() {
            acc <<= self.slot_width as usize;
            acc += v;
        }
        let n = BigInt::from_biguint(Sign::Plus, n.clone());
        acc.mod_floor(&n).magnitude().clone()
    }

    /// Packs small integers (owners' shares) without allocation-heavy conversions.
    pub fn pack_i128(&self, values: &[i128]) -> Result<BigInt, EncodingError> {
        let big: Vec<BigInt> = values.iter().map(|&v| BigInt::from(v)).collect();
        self.pack(&big)
    }

    /// Unpacks `count` signed slots from a decrypted plaintext given as a signed
    /// integer (the residue mapped to (-n/2, n/2)). Adding the offset sum_t 2^(w-1)
    /// 2^(t w) turns every slot nonnegative, so the digits can be read off directly.
    pub fn unpack(&self, packed: &BigInt, count: usize) -> Result<Vec<BigInt>, EncodingError> {
        let w = self.slot_width as usize;
        let half = BigInt::one() << (w - 1);
        let mut offset = BigInt::zero();
        for _ in 0..count {
            offset <<= w;
            offset += &half;
        }
        let shifted = packed + &offset;
        if shifted.sign() == Sign::Minus || shifted.bits() > (w * count) as u64 {
            return Err(EncodingError::SlotOverflow {
                bits: shifted.bits(),
                width: self.slot_width,
                slot: count,
            });
        }
        let mut mag = shifted.magnitude().clone();
        let mask = (BigUint::one() << w) - BigUint::one();
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let digit = BigInt::from_biguint(Sign::Plus, &mag & &mask);
            out.push(digit - &half);
            mag >>= w;
        }
        Ok(out)
    }
}

/// The order in which the upper triangle of an M x M symmetric matrix is packed:
/// row segments (i, j..j+len) with j >= i, at most `slots` entries each. Owners, the
/// proxy and the user all derive the same layout from (M, slots).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriangleLayout {
    /// Matrix dimension M.
    pub dim: usize,
    /// Segments in packing order.
    pub segments: Vec<Segment>,
}

/// One packed row segment of the upper triangle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Row index i.
    pub row: usize,
    /// First column j (j >= i).
    pub col: usize,
    /// Number of entries (i, j), (i, j+1), ...
    pub len: usize,
}

impl TriangleLayout {
    /// Segments row by row, each row's columns i..M cut into pieces of `slots`.
    pub fn new(dim: usize, slots: usize) -> Self {
        let mut segments = Vec::new();
        for row in 0..dim {
            let mut col = row;
            while col < dim {
                let len = slots.min(dim - col);
                segments.push(Segment { row, col, len });
                col += len;
            }
        }
        Self { dim, segments }
    }

    /// The segments [`TriangleLayout::new`] cuts, counted without cutting them,
    /// in time linear in `dim` and no memory: a party checks the size a spec asks
    /// for against its caps before it allocates dim^2 / 2 segments for it.
    pub fn count(dim: usize, slots: usize) -> usize {
        let slots = slots.max(1);
        (1..=dim)
            .map(|len| len.div_ceil(slots))
            .fold(0, usize::saturating_add)
    }

    /// Number of packed plaintexts.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Entries of the upper triangle, M (M + 1) / 2.
    pub fn total(&self) -> usize {
        self.dim * (self.dim + 1) / 2
    }

    /// True for a 0 x 0 matrix.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Index of entry (i, j), i <= j, in a row-major upper-triangle vector.
    pub fn upper_index(dim: usize, i: usize, j: usize) -> usize {
        debug_assert!(i <= j && j < dim);
        i * dim - i * (i + 1) / 2 + j
    }
}

/// Segments of a length-M vector, `slots` entries each.
pub fn vector_segments(dim: usize, slots: usize) -> Vec<(usize, usize)> {
    (0..dim)
        .step_by(slots.max(1))
        .map(|start| (start, slots.min(dim - start)))
        .collect()
}

/// The parts concatenated, each after its length as a big-endian u64: an
/// unambiguous input for a hash, a MAC or a signature (("ab", "c") and ("a", "bc")
/// differ).
pub fn length_prefixed(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| 8 + p.len()).sum());
    length_prefixed_into(parts, |b| out.extend_from_slice(b));
    out
}

/// As [`length_prefixed`], fed piece by piece to `sink` (a hasher or a MAC), so a
/// large part is never copied.
pub fn length_prefixed_into(parts: &[&[u8]], mut sink: impl FnMut(&[u8])) {
    for part in parts {
        sink(&(part.len() as u64).to_be_bytes());
        sink(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The packing layout is part of the protocol: owners, proxy and user of
    /// different builds must agree on it to the bit. These vectors were computed
    /// independently (sum_t v_t 2^(t w) by hand); a change of slot width, slot
    /// order or segment order fails here before it fails between parties.
    #[test]
    fn packing_layout_is_frozen() {
        let budget = SlotBudget::for_bound(&((BigUint::one() << 40) - 1u8), 2048).expect("fits");
        assert_eq!(
            budget,
            SlotBudget {
                slot_width: 42,
                slots: 48
            }
        );
        let values: Vec<BigInt> = [1i64, -2, 3, -(1 << 39)].map(BigInt::from).to_vec();
        let packed = budget.pack(&values).expect("fits");
        let frozen: BigInt = "-46768052394588893382517856618481715135585548500991"
            .parse()
            .expect("a number");
        assert_eq!(packed, frozen);
        assert_eq!(budget.unpack(&frozen, 4).expect("unpacks"), values);

        let segments: Vec<(usize, usize, usize)> = TriangleLayout::new(4, 3)
            .segments
            .iter()
            .map(|s| (s.row, s.col, s.len))
            .collect();
        assert_eq!(
            segments,
            [(0, 0, 3), (0, 3, 1), (1, 1, 3), (2, 2, 2), (3, 3, 1)]
        );
        assert_eq!(vector_segments(7, 3), [(0, 3), (3, 3), (6, 1)]);
        assert_eq!(TriangleLayout::upper_index(4, 2, 3), 8);
    }

    #[test]
    fn layout_covers_upper_triangle_once() {
        for dim in [1usize, 2, 7, 64] {
            for slots in [1usize, 3, 18, 100] {
                let layout = TriangleLayout::new(dim, slots);
                let mut seen = vec![0u32; dim * (dim + 1) / 2];
                for s in &layout.segments {
                    assert!(s.len >= 1 && s.len <= slots);
                    for t in 0..s.len {
                        seen[TriangleLayout::upper_index(dim, s.row, s.col + t)] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "dim {dim} slots {slots}");
                assert_eq!(TriangleLayout::count(dim, slots), layout.len());
            }
        }
        assert_eq!(TriangleLayout::count(0, 5), 0);
    }

    #[test]
    fn refuses_study_that_cannot_fit() {
        let huge = BigUint::one() << 3000usize;
        assert!(matches!(
            SlotBudget::for_bound(&huge, 2048),
            Err(EncodingError::SlotTooWide { .. })
        ));
    }

    #[test]
    fn pack_rejects_overflowing_slot() {
        let budget = SlotBudget::for_bound(&BigUint::from(1000u32), 2048).expect("fits");
        let too_big = BigInt::from(1) << (budget.slot_width as usize);
        assert!(budget.pack(&[too_big]).is_err());
    }

    proptest! {
        #[test]
        fn encoded_rows_respect_integer_norm(
            row in proptest::collection::vec(-1.0f64..1.0, 1..40),
            c in 0.1f64..2.0,
            f in 4u32..24,
        ) {
            // Clip as the owner does, then encode.
            let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            let clipped: Vec<f64> = if norm > c { row.iter().map(|x| x * c / norm).collect() } else { row.clone() };
            let fp = FixedPoint { frac_bits: f, row_norm_bound: c };
            let enc = fp.encode_row(&clipped);
            let cq = fp.norm_bound_int() as i128;
            let n2: i128 = enc.iter().map(|&v| (v as i128) * (v as i128)).sum();
            prop_assert!(n2 <= cq * cq);
            // Encoding never grows a magnitude nor flips a sign.
            for (e, x) in enc.iter().zip(&clipped) {
                prop_assert!((*e as f64).abs() <= (x * fp.scale()).abs() + 1e-9);
                prop_assert!(*e == 0 || (*e > 0) == (*x > 0.0));
            }
        }

        #[test]
        fn pack_unpack_round_trip(
            values in proptest::collection::vec(any::<i64>(), 1..12),
            extra_bits in 0u64..40,
        ) {
            let max = values.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
            let bound = BigUint::from(max) << extra_bits as usize;
            let budget = SlotBudget::for_bound(&bound, 2048).expect("fits");
            let chunk = &values[..values.len().min(budget.slots)];
            let big: Vec<BigInt> = chunk.iter().map(|&v| BigInt::from(v)).collect();
            let packed = budget.pack(&big).expect("pack");
            prop_assert_eq!(budget.unpack(&packed, chunk.len()).expect("unpack"), big);
        }

        #[test]
        fn packing_is_linear(
            a in proptest::collection::vec(-1_000_000i64..1_000_000, 5),
            b in proptest::collection::vec(-1_000_000i64..1_000_000, 5),
            k in 0i64..1000,
        ) {
            let bound = BigUint::from(2_000_000_000_000u64);
            let budget = SlotBudget::for_bound(&bound, 2048).expect("fits");
            let pa = budget.pack(&a.iter().map(|&v| BigInt::from(v)).collect::<Vec<_>>()).expect("pack");
            let pb = budget.pack(&b.iter().map(|&v| BigInt::from(v)).collect::<Vec<_>>()).expect("pack");
            let combined = pa * k + pb;
            let expect: Vec<BigInt> = a.iter().zip(&b).map(|(x, y)| BigInt::from(x * k + y)).collect();
            prop_assert_eq!(budget.unpack(&combined, 5).expect("unpack"), expect);
        }
    }

    proptest! {
        /// Terms far wider than a slot, packed mod n, may be summed if they cancel:
        /// the decoded sum is the sum of the narrow parts.
        #[test]
        fn wide_terms_that_cancel_decode_exactly(
            narrow in proptest::collection::vec(-1_000_000i64..1_000_000, 1..20),
            wide_bits in 60usize..400,
            seed in any::<u64>(),
        ) {
            let n: BigUint = (BigUint::one() << 1023usize) + 1159u32;
            let budget = SlotBudget::for_bound(&BigUint::from(1_000_000u32), n.bits()).expect("fits");
            let narrow = &narrow[..narrow.len().min(budget.slots)];
            let wide: Vec<BigInt> = (0..narrow.len() as u64)
                .map(|t| (BigInt::from(seed ^ t.wrapping_mul(0x9e37_79b9)) << wide_bits) - 7 * t)
                .collect();
            let with: Vec<BigInt> = narrow.iter().zip(&wide).map(|(a, w)| w + a).collect();
            let sum = (budget.pack_residue(&with, &n) + &n - budget.pack_residue(&wide, &n)) % &n;
            let signed = if sum > (&n >> 1usize) {
                -BigInt::from(&n - &sum)
            } else {
                BigInt::from(sum)
            };
            let want: Vec<BigInt> = narrow.iter().map(|&v| BigInt::from(v)).collect();
            prop_assert_eq!(budget.unpack(&signed, narrow.len()).expect("unpack"), want);
        }
    }

    #[test]
    fn length_prefixed_parts_do_not_run_into_each_other() {
        let ab_c = length_prefixed(&[b"ab", b"c"]);
        assert_ne!(ab_c, length_prefixed(&[b"a", b"bc"]));
        assert_eq!(&ab_c[..8], &2u64.to_be_bytes());
        let mut fed = Vec::new();
        length_prefixed_into(&[b"ab", b"c"], |b| fed.extend_from_slice(b));
        assert_eq!(fed, ab_c);
    }
}
