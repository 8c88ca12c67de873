//! Cheap encryption randomness: short exponents on a fixed base with a window table
//! (the Damgård–Jurik–Nielsen variant of Paillier).
//!
//! Textbook Paillier spends a full exponentiation r^n mod n^2 (an |n|-bit exponent)
//! on every encryption. Here a party picks once a random x in Z*_n, sets
//! h = -x^2 mod n and the fixed base h_s = h^n mod n^2, and precomputes
//! table\[i\]\[d\] = h_s^(d 2^(w i)) for every w-bit window i of a [`EXPONENT_BITS`]-bit
//! exponent. The randomizer of one encryption is h_s^a for a fresh uniform
//! a < 2^[`EXPONENT_BITS`]: one table lookup and one multiplication mod n^2 per
//! window, 56 multiplications with 8-bit windows instead of about 1.2 |n|.
//!
//! # Security
//! h_s^a is an n-th residue, so 1 + m n times it decrypts to m like any Paillier
//! ciphertext. Semantic security needs h_s^a to be indistinguishable from a uniform
//! n-th residue. Damgård, Jurik and Nielsen (2010, "A generalization of Paillier's
//! public-key system with applications to electronic voting", section 4.2) show this
//! holds under the decisional composite residuosity assumption plus the assumption
//! that a short exponent on h hides like a full one; with h = -x^2 for random x, h
//! generates (with overwhelming probability) the large cyclic subgroup of Jacobi
//! symbol 1, whose order is unknown without the factors of n. The best known attacks
//! on a short exponent of t bits cost about 2^(t/2) group operations (Pollard's
//! lambda), so a 448-bit exponent gives 224-bit security, above the 112/128 bits of
//! 2048/3072-bit moduli. The base is the encrypting party's own (derived from its
//! OS randomness, never sent), so no party can choose another's randomness.

use num_bigint::BigUint;
use num_traits::One;
use rand::{CryptoRng, RngCore};
use rayon::prelude::*;

use crate::arith::Elem;
use crate::paillier::{random_unit, Ciphertext, PaillierError, PublicKey};

/// Bits of the short exponent a.
pub const EXPONENT_BITS: usize = 448;

/// A fixed-base window table for h_s^a mod n^2.
pub struct Randomizer {
    pk: PublicKey,
    window_bits: usize,
    /// table[i][d] = h_s^(d 2^(w i)), d in 0..2^w, held in the key's engine.
    table: Vec<Vec<Elem>>,
}

impl std::fmt::Debug for Randomizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The base is secret to its owner; print only its shape.
        write!(
            f,
            "Randomizer {{ key_bits: {}, window_bits: {}, windows: {} }}",
            self.pk.bits(),
            self.window_bits,
            self.table.len()
        )
    }
}

impl Randomizer {
    /// Default window width: 8 bits (about 7 MB of table at 2048 bits, 11 MB at 3072).
    pub const DEFAULT_WINDOW_BITS: usize = 8;

    /// The window width minimizing the multiplications of building the table and
    /// then drawing `count` randomizers: windows (2^w + count) with
    /// windows = EXPONENT_BITS / w. Few encryptions favor small tables.
    pub fn window_for(count: usize) -> usize {
        (1..=Self::DEFAULT_WINDOW_BITS)
            .min_by_key(|&w| EXPONENT_BITS.div_ceil(w) * ((1usize << w) + count))
            .unwrap_or(Self::DEFAULT_WINDOW_BITS)
    }

    /// Draws a fresh base h_s = (-x^2)^n mod n^2 and builds its table.
    pub fn new<R: RngCore + CryptoRng>(pk: &PublicKey, window_bits: usize, rng: &mut R) -> Self {
        let x = random_unit(pk.n(), rng);
        let h = pk.n() - (&x * &x) % pk.n();
        let base = pk.ring().pow(&h, pk.n());
        Self::from_base(pk, &base, window_bits)
    }

    /// Builds the table of a given base (tests use fixed bases).
    pub fn from_base(pk: &PublicKey, base: &BigUint, window_bits: usize) -> Self {
        let w = window_bits.clamp(1, 16);
        let windows = EXPONENT_BITS.div_ceil(w);
        let (n2, ring) = (pk.n_squared(), pk.ring());
        // g_i = base^(2^(w i)), by repeated squaring. Every step stays in the key's
        // engine: a round trip through `BigUint` per multiplication made the build
        // 16-31% slower.
        let mut gens = Vec::with_capacity(windows);
        let mut g = ring.elem(&(base % n2));
        for _ in 1..windows {
            let next = (1..w).fold(ring.mul_elem(&g, &g), |x, _| ring.mul_elem(&x, &x));
            gens.push(std::mem::replace(&mut g, next));
        }
        gens.push(g);
        let one = ring.elem(&BigUint::one());
        let table = gens
            .par_iter()
            .map(|g| {
                let mut row = Vec::with_capacity(1 << w);
                row.push(one.clone());
                for d in 1..(1usize << w) {
                    row.push(ring.mul_elem(&row[d - 1], g));
                }
                row
            })
            .collect();
        Self {
            pk: pk.clone(),
            window_bits: w,
            table,
        }
    }

    /// h_s^a mod n^2 for an exponent a < 2^EXPONENT_BITS (higher bits are ignored).
    pub fn power(&self, a: &BigUint) -> BigUint {
        let w = self.window_bits;
        let digits = self.table.iter().enumerate().filter_map(|(i, row)| {
            let mut d = 0usize;
            for b in 0..w {
                if a.bit((i * w + b) as u64) {
                    d |= 1 << b;
                }
            }
            (d != 0).then(|| &row[d])
        });
        self.pk.ring().product(digits)
    }

    /// A fresh randomizer h_s^a with a uniform a < 2^EXPONENT_BITS.
    pub fn mask<R: RngCore + CryptoRng>(&self, rng: &mut R) -> BigUint {
        let mut bytes = [0u8; EXPONENT_BITS / 8];
        rng.fill_bytes(&mut bytes);
        self.power(&BigUint::from_bytes_le(&bytes))
    }

    /// Encrypts residue m with fresh short-exponent randomness.
    pub fn encrypt<R: RngCore + CryptoRng>(
        &self,
        m: &BigUint,
        rng: &mut R,
    ) -> Result<Ciphertext, PaillierError> {
        self.pk.encrypt_with_mask(m, &self.mask(rng))
    }

    /// Multiplies by a fresh encryption of zero.
    pub fn rerandomize<R: RngCore + CryptoRng>(&self, c: &Ciphertext, rng: &mut R) -> Ciphertext {
        Ciphertext(self.pk.ring().mul(&c.0, &self.mask(rng)))
    }

    /// The key this table belongs to.
    pub fn public_key(&self) -> &PublicKey {
        &self.pk
    }
}

/// Where the randomness of re-randomization comes from.
#[derive(Clone, Copy, Debug)]
pub enum Randomness<'a> {
    /// Short exponents on a fixed base (the product).
    FixedBase(&'a Randomizer),
    /// Textbook r^n (the baseline).
    Textbook(&'a PublicKey),
}

impl Randomness<'_> {
    /// The key.
    pub fn public_key(&self) -> &PublicKey {
        match self {
            Self::FixedBase(r) => r.public_key(),
            Self::Textbook(pk) => pk,
        }
    }

    /// Multiplies by a fresh encryption of zero.
    pub fn rerandomize<R: RngCore + CryptoRng>(&self, c: &Ciphertext, rng: &mut R) -> Ciphertext {
        match self {
            Self::FixedBase(r) => r.rerandomize(c, rng),
            Self::Textbook(pk) => pk.rerandomize(c, rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paillier::SecretKey;
    use num_bigint::BigInt;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;
    use std::sync::OnceLock;

    fn key() -> &'static SecretKey {
        static KEY: OnceLock<SecretKey> = OnceLock::new();
        KEY.get_or_init(|| {
            SecretKey::generate(2048, &mut ChaCha20Rng::seed_from_u64(5)).expect("keygen")
        })
    }

    /// One table per window width up to 8, built once.
    fn table(w: usize) -> &'static Randomizer {
        static TABLES: [OnceLock<Randomizer>; 9] = [const { OnceLock::new() }; 9];
        TABLES[w]
            .get_or_init(|| Randomizer::new(key().public(), w, &mut ChaCha20Rng::seed_from_u64(6)))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// The table computes exactly base^a, for every window width: one bit, the
        /// widths owners get (`window_for`), and widths that leave a last window short.
        #[test]
        fn power_equals_modpow(bytes in proptest::collection::vec(any::<u8>(), 0..(EXPONENT_BITS / 8)), w in 1usize..=8) {
            let t = table(w);
            let pk = key().public();
            let a = BigUint::from_bytes_le(&bytes);
            let base = t.power(&BigUint::one());
            prop_assert_eq!(t.power(&a), base.modpow(&a, pk.n_squared()));
        }

        /// Encryption and re-randomization with short exponents decrypt correctly.
        #[test]
        fn round_trip(v in any::<i64>(), seed in any::<u64>()) {
            let sk = key();
            let pk = sk.public();
            let t = table(8);
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let c = t.encrypt(&pk.encode_signed(&BigInt::from(v)).expect("fits"), &mut rng).expect("enc");
            prop_assert_eq!(sk.decrypt_signed(&c), BigInt::from(v));
            let r = t.rerandomize(&c, &mut rng);
            prop_assert_ne!(&r, &c);
            prop_assert_eq!(sk.decrypt_signed(&r), BigInt::from(v));
            prop_assert!(pk.ciphertext_from_bytes(&pk.ciphertext_to_bytes(&r), 0).is_ok());
        }
    }

    #[test]
    fn window_grows_with_the_work() {
        assert!(Randomizer::window_for(1) <= 3);
        assert!(Randomizer::window_for(200) < Randomizer::window_for(100_000));
        assert_eq!(
            Randomizer::window_for(1_000_000),
            Randomizer::DEFAULT_WINDOW_BITS
        );
    }

    /// The base is an n-th residue: decrypting a bare randomizer gives 0.
    #[test]
    fn masks_encrypt_zero() {
        let t = table(8);
        let m = t.mask(&mut ChaCha20Rng::seed_from_u64(9));
        assert_eq!(key().decrypt(&Ciphertext(m)), BigUint::from(0u8));
    }
}
