//! Exponentiation of a few bases by long exponents known in the clear, when every
//! base is raised many times: the `mask` release's E\[v_i\]^(B_seg), one base per
//! row of the matrix and one exponent per packed segment of that row.
//!
//! A base a is read through its radix powers a^(2^(r k)), k = 0, 1, ..., taken off
//! one chain of squarings that the caller shares among all of a's exponents (and,
//! in the release, with the shifted ciphertexts E[v 2^(t w)], which lie on the same
//! chain). A product prod_t a_t^(e_t) is then Yao's method (1976; Brickell, Gordon,
//! McCurley and Wilson's fixed-base form, EUROCRYPT 1992): write every e_t in radix
//! 2^r, and for d = 2^r - 1 down to 1 multiply into a running A every radix power
//! whose digit is d, then A into the result, so that a radix power of digit d enters
//! the result d times. Its cost is one multiplication per nonzero digit plus about
//! 2^r, and no squaring. A full segment of M = 1000 at 3072 bits (B_seg of 3042
//! bits, b_i of 74) costs about 570 multiplications in radix 2^7, and v_seg's own
//! radix powers 70 squarings; the windowed simultaneous exponentiation it replaced
//! took about 760 operations and its share of the row's power tables about 110.

use num_bigint::BigUint;
use num_traits::{One, Zero};

use crate::arith::Elem;
use crate::paillier::{Ciphertext, PublicKey};

/// Widest radix [`radix_for`] picks: its final pass costs 2^r multiplications.
pub const MAX_RADIX_BITS: usize = 10;

/// The radix powers a^(2^(r k)) of one base, for k below `powers.len()`: they read
/// any exponent below 2^(r powers.len()).
#[derive(Clone, Debug)]
pub struct RadixPowers {
    radix_bits: usize,
    powers: Vec<Elem>,
}

impl RadixPowers {
    /// Radix powers taken off a chain of squarings (see [`squarings`]): `chain[k]`
    /// must be a^(2^(r k)).
    pub fn from_chain(radix_bits: usize, chain: Vec<Elem>) -> Self {
        Self {
            radix_bits,
            powers: chain,
        }
    }

    /// The radix powers of a base held in the key's ring, for exponents of up to
    /// `bits` bits.
    pub fn new(pk: &PublicKey, a: Elem, radix_bits: usize, bits: u64) -> Self {
        let digits = digits_of(bits, radix_bits);
        let chain = squarings(pk, a, &[(radix_bits as u64, digits)]);
        Self::from_chain(radix_bits, chain.into_iter().next().unwrap_or_default())
    }

    /// The radix, in bits: a product's other terms must have the same.
    pub fn radix_bits(&self) -> usize {
        self.radix_bits
    }

    /// Bits of the largest exponent these powers read.
    pub fn bits(&self) -> u64 {
        (self.powers.len() * self.radix_bits) as u64
    }
}

/// The radix minimizing Yao's multiplications for `digits_bits` bits of exponent
/// in all: one per digit and 2^r for the final pass.
pub fn radix_for(digits_bits: u64) -> usize {
    (1..=MAX_RADIX_BITS)
        .min_by_key(|&r| digits_bits.div_ceil(r as u64) + (1u64 << r))
        .unwrap_or(6)
}

/// How many radix-2^r digits an exponent of `bits` bits has (at least one).
pub fn digits_of(bits: u64, radix_bits: usize) -> usize {
    (bits.div_ceil(radix_bits.max(1) as u64) as usize).max(1)
}

/// sum_t values\[t\] 2^(t width): the mask's B_seg = sum_t b_(j+t) 2^(t w). A value
/// may be wider than its slot, and then carries into the next.
pub fn shifted_sum<'a>(values: impl IntoIterator<Item = &'a BigUint>, width: usize) -> BigUint {
    values
        .into_iter()
        .enumerate()
        .fold(BigUint::zero(), |acc, (t, x)| acc + (x << (t * width)))
}

/// For every (spacing s, count c) asked: a^(2^(s k)) for k below c, all off one
/// chain of squarings held in the key's ring, as long as the farthest power asked.
pub fn squarings(pk: &PublicKey, a: Elem, spaced: &[(u64, usize)]) -> Vec<Vec<Elem>> {
    let ring = pk.ring();
    let last = spaced
        .iter()
        .map(|&(s, c)| c.saturating_sub(1) as u64 * s)
        .max()
        .unwrap_or(0);
    let mut out: Vec<Vec<Elem>> = spaced.iter().map(|&(_, c)| Vec::with_capacity(c)).collect();
    let mut cur = a;
    for e in 0..=last {
        if e > 0 {
            cur = ring.mul_elem(&cur, &cur);
        }
        for (powers, &(s, c)) in out.iter_mut().zip(spaced) {
            if powers.len() < c && e % s.max(1) == 0 {
                powers.push(cur.clone());
            }
        }
    }
    out
}

/// A product [`product`] refuses: computed anyway, each would give a wrong value
/// without a sign of it (or, for a radix out of range, a table of 2^r entries).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RadixError {
    /// An exponent too long for the radix powers it was paired with: its high
    /// digits would be left out.
    #[error("an exponent of {exponent_bits} bits on radix powers that read {reads} bits")]
    ExponentTooLong {
        /// Bits of the exponent.
        exponent_bits: u64,
        /// Bits its radix powers read.
        reads: u64,
    },
    /// Radix powers of two radixes in one product: one set's digits would be
    /// read in the other's radix.
    #[error("radix powers of radix 2^{other} in a product of radix 2^{first}")]
    MixedRadix {
        /// The first term's radix, in bits.
        first: usize,
        /// Another term's.
        other: usize,
    },
    /// A radix of 0 bits or wider than [`MAX_RADIX_BITS`].
    #[error("a radix of {0} bits, outside 1..={MAX_RADIX_BITS}")]
    RadixOutOfRange(usize),
}

/// prod_t a_t^(e_t) by Yao's method over every term's radix powers (all of one
/// radix). An empty product, or one whose exponents are all zero, is E\[0\] = 1.
pub fn product(
    pk: &PublicKey,
    terms: &[(&RadixPowers, &BigUint)],
) -> Result<Ciphertext, RadixError> {
    let Some(r) = terms.first().map(|(p, _)| p.radix_bits) else {
        return Ok(Ciphertext(BigUint::one()));
    };
    if !(1..=MAX_RADIX_BITS).contains(&r) {
        return Err(RadixError::RadixOutOfRange(r));
    }
    // by_digit[d]: every radix power whose digit is d.
    let mut by_digit: Vec<Vec<&Elem>> = vec![Vec::new(); 1 << r];
    for (powers, e) in terms {
        if powers.radix_bits != r {
            return Err(RadixError::MixedRadix {
                first: r,
                other: powers.radix_bits,
            });
        }
        if e.bits() > powers.bits() {
            return Err(RadixError::ExponentTooLong {
                exponent_bits: e.bits(),
                reads: powers.bits(),
            });
        }
        for (k, p) in powers.powers.iter().enumerate() {
            let d = (0..r).fold(0usize, |d, b| {
                d | (usize::from(e.bit((k * r + b) as u64)) << b)
            });
            by_digit[d].push(p);
        }
    }
    let ring = pk.ring();
    let times = |acc: Option<Elem>, x: &Elem| match acc {
        None => x.clone(),
        Some(a) => ring.mul_elem(&a, x),
    };
    let (mut running, mut result): (Option<Elem>, Option<Elem>) = (None, None);
    for group in by_digit.iter().skip(1).rev() {
        for p in group {
            running = Some(times(running, p));
        }
        if let Some(a) = &running {
            result = Some(times(result, a));
        }
    }
    Ok(Ciphertext(result.map_or_else(BigUint::one, |x| x.to_big())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paillier::random_below;
    use crate::testing::test_key;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Yao's product equals the product of plain exponentiations, for every
        /// radix, term count and exponent length (zero and one-digit exponents too).
        #[test]
        fn product_equals_exponentiations(
            seed in any::<u64>(),
            radix in 1usize..=8,
            lens in proptest::collection::vec(0u64..300, 0..5),
        ) {
            let pk = test_key().public().clone();
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let bases: Vec<Ciphertext> = lens
                .iter()
                .map(|_| Ciphertext(random_below(pk.n_squared(), &mut rng)))
                .collect();
            let exps: Vec<BigUint> = lens
                .iter()
                .map(|&b| random_below(&(BigUint::one() << b as usize), &mut rng))
                .collect();
            let powers: Vec<RadixPowers> = bases
                .iter()
                .zip(&lens)
                .map(|(c, &b)| RadixPowers::new(&pk, pk.ring().elem(&c.0), radix, b))
                .collect();
            let terms: Vec<(&RadixPowers, &BigUint)> = powers.iter().zip(&exps).collect();
            let want = bases.iter().zip(&exps).fold(BigUint::one(), |acc, (c, e)| {
                acc * c.0.modpow(e, pk.n_squared()) % pk.n_squared()
            });
            prop_assert_eq!(product(&pk, &terms).map(|c| c.0), Ok(want));
        }
    }

    #[test]
    fn products_that_would_be_wrong_are_refused() {
        let pk = test_key().public().clone();
        let base = || pk.ring().elem(&BigUint::from(7u8));
        let (four, two) = (
            RadixPowers::new(&pk, base(), 4, 8),
            RadixPowers::new(&pk, base(), 2, 8),
        );
        let (long, short) = (BigUint::one() << 8usize, BigUint::from(3u8));
        let refused = |terms: &[(&RadixPowers, &BigUint)]| product(&pk, terms).map(|c| c.0);
        assert_eq!(
            refused(&[(&four, &long)]),
            Err(RadixError::ExponentTooLong {
                exponent_bits: 9,
                reads: 8
            })
        );
        assert_eq!(
            refused(&[(&four, &short), (&two, &short)]),
            Err(RadixError::MixedRadix { first: 4, other: 2 })
        );
        let wide = RadixPowers::from_chain(MAX_RADIX_BITS + 1, vec![base()]);
        assert_eq!(
            refused(&[(&wide, &short)]),
            Err(RadixError::RadixOutOfRange(MAX_RADIX_BITS + 1))
        );
    }

    #[test]
    fn squarings_reach_each_asked_power() {
        let pk = test_key().public().clone();
        let a = BigUint::from(12345u32);
        let got = squarings(&pk, pk.ring().elem(&a), &[(3, 4), (5, 2), (7, 0)]);
        let power = |e: u64| {
            pk.ring()
                .elem(&a.modpow(&(BigUint::one() << e as usize), pk.n_squared()))
        };
        let want = vec![
            vec![power(0), power(3), power(6), power(9)],
            vec![power(0), power(5)],
            Vec::new(),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_shifted_sum_carries_a_value_wider_than_its_slot_into_the_next() {
        let w = 8;
        let wide = BigUint::from(0x1ffu16); // 9 bits in an 8-bit slot
        let values = [wide.clone(), BigUint::from(3u8), wide];
        // 0x1ff + 3 * 2^8 + 0x1ff * 2^16, the top bit of each wide value landing
        // on the next slot's lowest.
        assert_eq!(shifted_sum(&values, w), BigUint::from(0x01ff_04ffu32));
        assert_eq!(shifted_sum(&[], w), BigUint::zero());
    }

    #[test]
    fn the_radix_balances_digits_and_the_final_pass() {
        // 3041 bits: 507 + 64 at radix 2^6 against 435 + 128 at 2^7.
        assert_eq!(radix_for(3041), 7);
        assert_eq!(radix_for(2100), 6);
        assert_eq!(radix_for(1), 1);
    }
}
