//! Arithmetic modulo one fixed odd modulus (n^2, or p^2 and q^2 in decryption):
//! where every role spends its time. With feature `gmp` (on by default) it runs on
//! the system's GMP through `rug` (`mpz_mul`, `mpz_powm`, and `mpz_powm_sec` where
//! the exponent is secret); without it, on num-bigint, for platforms without GMP.
//! Both engines give the same values (a property test checks them against each
//! other); [`ModRing::num_bigint`] keeps the pure engine reachable in a GMP build,
//! so the benches measure both in one run.
//!
//! Values cross this interface as `BigUint`, or as [`Elem`]s held in the engine.
//! Converting costs a copy of the limbs and an allocation per operand, which at
//! these sizes is as much as a third of a multiplication in a loop that streams
//! through memory: the proxy's fold keeps its aggregate as `Elem`s and reads what
//! owners send straight into them ([`ModRing::elem_from_be_bytes`]).
//!
//! Also here, below every module that draws numbers: [`random_below`], the
//! uniform integers that keys, masks and the exact samplers are drawn from, and
//! [`random_seed`], the seeds of the generators parallel draws run on.

use num_bigint::BigUint;
use num_traits::{One, Zero};
use rand::{CryptoRng, RngCore};

/// A residue held in its ring's engine, converted once: a table of values that
/// many products read (the randomizer's fixed-base windows) and the proxy's
/// running aggregate pay no conversion per use.
#[derive(Clone)]
pub struct Elem(ElemRepr);

impl Elem {
    /// The value as a `BigUint` (a copy).
    pub fn to_big(&self) -> BigUint {
        match &self.0 {
            ElemRepr::NumBigint(x) => x.clone(),
            #[cfg(feature = "gmp")]
            ElemRepr::Gmp(x) => gmp::to_big(x),
        }
    }
}

impl PartialEq for Elem {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (ElemRepr::NumBigint(a), ElemRepr::NumBigint(b)) => a == b,
            #[cfg(feature = "gmp")]
            (ElemRepr::Gmp(a), ElemRepr::Gmp(b)) => a == b,
            #[cfg(feature = "gmp")]
            _ => self.to_big() == other.to_big(),
        }
    }
}

impl Eq for Elem {}

impl std::fmt::Debug for Elem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Elem({:x})", self.to_big())
    }
}

#[derive(Clone)]
enum ElemRepr {
    NumBigint(BigUint),
    #[cfg(feature = "gmp")]
    Gmp(rug::Integer),
}

/// Integers modulo `m`, on the fastest engine this build has.
#[derive(Clone)]
pub struct ModRing {
    m: BigUint,
    engine: Engine,
}

#[derive(Clone)]
enum Engine {
    NumBigint,
    #[cfg(feature = "gmp")]
    Gmp(rug::Integer),
}

impl PartialEq for ModRing {
    fn eq(&self, other: &Self) -> bool {
        self.m == other.m
    }
}

impl Eq for ModRing {}

impl std::fmt::Debug for ModRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ModRing {{ bits: {}, engine: {} }}",
            self.m.bits(),
            self.engine()
        )
    }
}

impl ModRing {
    /// The integers modulo `m` on GMP where this build has it.
    pub fn new(m: BigUint) -> Self {
        #[cfg(feature = "gmp")]
        {
            let g = gmp::from_big(&m);
            Self {
                m,
                engine: Engine::Gmp(g),
            }
        }
        #[cfg(not(feature = "gmp"))]
        Self::num_bigint(m)
    }

    /// The integers modulo `m` on num-bigint, whatever the build.
    pub fn num_bigint(m: BigUint) -> Self {
        Self {
            m,
            engine: Engine::NumBigint,
        }
    }

    /// The modulus.
    pub fn modulus(&self) -> &BigUint {
        &self.m
    }

    /// Which engine computes: `gmp` or `num-bigint`.
    pub fn engine(&self) -> &'static str {
        match self.engine {
            Engine::NumBigint => "num-bigint",
            #[cfg(feature = "gmp")]
            Engine::Gmp(_) => "gmp",
        }
    }

    /// a b mod m.
    pub fn mul(&self, a: &BigUint, b: &BigUint) -> BigUint {
        match &self.engine {
            Engine::NumBigint => (a * b) % &self.m,
            #[cfg(feature = "gmp")]
            Engine::Gmp(m) => gmp::mul(a, b, m),
        }
    }

    /// `x` held in this ring's engine.
    pub fn elem(&self, x: &BigUint) -> Elem {
        match &self.engine {
            Engine::NumBigint => Elem(ElemRepr::NumBigint(x.clone())),
            #[cfg(feature = "gmp")]
            Engine::Gmp(_) => Elem(ElemRepr::Gmp(gmp::from_big(x))),
        }
    }

    /// The product of `factors` mod m (1 for none), converted out once; the
    /// factors need not be reduced.
    pub fn product<'a>(&self, factors: impl IntoIterator<Item = &'a Elem>) -> BigUint {
        match &self.engine {
            Engine::NumBigint => factors
                .into_iter()
                .fold(BigUint::one() % &self.m, |acc, f| {
                    let f = match &f.0 {
                        ElemRepr::NumBigint(x) => std::borrow::Cow::Borrowed(x),
                        #[cfg(feature = "gmp")]
                        ElemRepr::Gmp(x) => std::borrow::Cow::Owned(gmp::to_big(x)),
                    };
                    (acc * f.as_ref()) % &self.m
                }),
            #[cfg(feature = "gmp")]
            Engine::Gmp(m) => gmp::product(factors.into_iter().map(|f| &f.0), m),
        }
    }

    /// A big-endian number held in this ring's engine, read in one pass (not
    /// reduced: [`ModRing::is_residue`] says whether it is below m).
    pub fn elem_from_be_bytes(&self, bytes: &[u8]) -> Elem {
        match &self.engine {
            Engine::NumBigint => Elem(ElemRepr::NumBigint(BigUint::from_bytes_be(bytes))),
            #[cfg(feature = "gmp")]
            Engine::Gmp(_) => Elem(ElemRepr::Gmp(gmp::from_be_bytes(bytes))),
        }
    }

    /// `x` as big-endian bytes, left-padded with zeros to `width` (or longer if
    /// `x` needs more).
    pub fn to_be_bytes(&self, x: &Elem, width: usize) -> Vec<u8> {
        match &x.0 {
            ElemRepr::NumBigint(v) => {
                let raw = v.to_bytes_be();
                let mut out = vec![0u8; width.saturating_sub(raw.len())];
                out.extend_from_slice(&raw);
                out
            }
            #[cfg(feature = "gmp")]
            ElemRepr::Gmp(v) => gmp::to_be_bytes(v, width),
        }
    }

    /// Whether m divides x.
    pub fn divides(&self, x: &Elem) -> bool {
        match (&self.engine, &x.0) {
            #[cfg(feature = "gmp")]
            (Engine::Gmp(m), ElemRepr::Gmp(v)) => v.is_divisible(m),
            _ => (x.to_big() % &self.m).is_zero(),
        }
    }

    /// Whether 0 < x < m.
    pub fn is_residue(&self, x: &Elem) -> bool {
        match (&self.engine, &x.0) {
            (_, ElemRepr::NumBigint(v)) => !v.is_zero() && v < &self.m,
            #[cfg(feature = "gmp")]
            (Engine::Gmp(m), ElemRepr::Gmp(v)) => *v > 0 && v < m,
            #[cfg(feature = "gmp")]
            (Engine::NumBigint, ElemRepr::Gmp(v)) => {
                let v = gmp::to_big(v);
                !v.is_zero() && v < self.m
            }
        }
    }

    /// a b mod m, on elements held in the engine: no conversion.
    pub fn mul_elem(&self, a: &Elem, b: &Elem) -> Elem {
        match (&self.engine, &a.0, &b.0) {
            #[cfg(feature = "gmp")]
            (Engine::Gmp(m), ElemRepr::Gmp(x), ElemRepr::Gmp(y)) => {
                Elem(ElemRepr::Gmp(gmp::mul_mod(x, y, m)))
            }
            _ => self.elem(&self.mul(&a.to_big(), &b.to_big())),
        }
    }

    /// base^exp mod m, in time that may depend on `exp` (a public exponent).
    pub fn pow(&self, base: &BigUint, exp: &BigUint) -> BigUint {
        match &self.engine {
            Engine::NumBigint => base.modpow(exp, &self.m),
            #[cfg(feature = "gmp")]
            Engine::Gmp(m) => gmp::pow(base, exp, m).unwrap_or_else(|| base.modpow(exp, &self.m)),
        }
    }

    /// base^exp mod m for a secret exponent (decryption's p - 1, q - 1, lambda).
    /// On GMP this is `mpz_powm_sec`, whose time and memory accesses do not
    /// depend on the exponent's bits or the base; num-bigint has no such
    /// routine, so without GMP it is [`ModRing::pow`].
    pub fn pow_secret(&self, base: &BigUint, exp: &BigUint) -> BigUint {
        if exp.is_zero() {
            return BigUint::one() % &self.m;
        }
        match &self.engine {
            Engine::NumBigint => base.modpow(exp, &self.m),
            #[cfg(feature = "gmp")]
            Engine::Gmp(m) => {
                gmp::pow_secret(base, exp, m).unwrap_or_else(|| base.modpow(exp, &self.m))
            }
        }
    }
}

/// 32 bytes of `rng`: the seed of a generator that runs on its own (a thread's
/// share of draws, a candidate prime, a re-randomization), so that parallel work
/// stays a function of `rng`.
pub fn random_seed<R: RngCore + CryptoRng>(rng: &mut R) -> [u8; 32] {
    let mut seed = [0u8; 32];
    rng.fill_bytes(&mut seed);
    seed
}

/// Uniform integer in [0, bound) by rejection sampling on the bit length.
pub fn random_below<R: RngCore + CryptoRng>(bound: &BigUint, rng: &mut R) -> BigUint {
    let bits = bound.bits();
    if bits == 0 {
        return BigUint::zero();
    }
    let bytes = bits.div_ceil(8) as usize;
    let excess = (bytes as u64) * 8 - bits;
    let mut buf = vec![0u8; bytes];
    loop {
        rng.fill_bytes(&mut buf);
        buf[0] &= 0xffu8 >> excess;
        let x = BigUint::from_bytes_be(&buf);
        if &x < bound {
            return x;
        }
    }
}

#[cfg(feature = "gmp")]
mod gmp {
    use num_bigint::BigUint;
    use rug::integer::Order;
    use rug::{Assign, Integer};

    pub(super) fn from_big(x: &BigUint) -> Integer {
        Integer::from_digits(&x.to_u64_digits(), Order::Lsf)
    }

    /// Big-endian bytes read a 64-bit word at a time (GMP's byte-wise import is
    /// five times slower).
    pub(super) fn from_be_bytes(bytes: &[u8]) -> Integer {
        let (head, body) = bytes.split_at(bytes.len() % 8);
        let mut words = Vec::with_capacity(bytes.len() / 8 + 1);
        let mut first = [0u8; 8];
        first[8 - head.len()..].copy_from_slice(head);
        words.push(u64::from_be_bytes(first));
        for chunk in body.chunks_exact(8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            words.push(u64::from_be_bytes(w));
        }
        Integer::from_digits(&words, Order::Msf)
    }

    /// Big-endian bytes, left-padded to `width`, written a word at a time.
    pub(super) fn to_be_bytes(x: &Integer, width: usize) -> Vec<u8> {
        let words = x.to_digits::<u64>(Order::Msf);
        let raw: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        let significant = &raw[raw.iter().take_while(|&&b| b == 0).count()..];
        let mut out = vec![0u8; width.saturating_sub(significant.len())];
        out.extend_from_slice(significant);
        out
    }

    /// Read as GMP holds its limbs (64-bit words, least significant first), then
    /// split: GMP exports words narrower than its limbs a byte at a time, which
    /// made this conversion a seventh of a multiplication mod n^2 at 2048 bits.
    pub(super) fn to_big(x: &Integer) -> BigUint {
        let words = x.to_digits::<u64>(Order::Lsf);
        BigUint::new(
            words
                .iter()
                .flat_map(|&w| [w as u32, (w >> 32) as u32])
                .collect(),
        )
    }

    pub(super) fn product<'a>(
        factors: impl Iterator<Item = &'a super::ElemRepr>,
        m: &Integer,
    ) -> BigUint {
        let mut acc = Integer::from(1) % m;
        let mut reduced = Integer::new();
        for f in factors {
            match f {
                // Reduced first when larger than m (a ciphertext taken mod n): two
                // short divisions cost less than one long one.
                super::ElemRepr::Gmp(x) if x.significant_bits() > m.significant_bits() => {
                    reduced.assign(x % m);
                    acc *= &reduced;
                }
                super::ElemRepr::Gmp(x) => acc *= x,
                super::ElemRepr::NumBigint(x) => acc *= from_big(x),
            }
            acc %= m;
        }
        to_big(&acc)
    }

    std::thread_local! {
        /// The product before its reduction, twice the modulus's width: one buffer
        /// per thread, so a multiplication allocates only its result.
        static PRODUCT: std::cell::RefCell<Integer> = const { std::cell::RefCell::new(Integer::new()) };
    }

    /// x y mod m. The result is allocated at the modulus's width: reduced in place,
    /// the product's buffer kept twice that, so an aggregate of such results held
    /// twice the memory (and folded about 5% slower).
    pub(super) fn mul_mod(x: &Integer, y: &Integer, m: &Integer) -> Integer {
        PRODUCT.with(|p| {
            let mut p = p.borrow_mut();
            p.assign(x * y);
            Integer::from(&*p % m)
        })
    }

    pub(super) fn mul(a: &BigUint, b: &BigUint, m: &Integer) -> BigUint {
        let mut p = from_big(a);
        p *= from_big(b);
        p %= m;
        to_big(&p)
    }

    /// `None` only for a negative exponent or a base without an inverse, neither
    /// of which a `BigUint` exponent can ask for.
    pub(super) fn pow(base: &BigUint, exp: &BigUint, m: &Integer) -> Option<BigUint> {
        from_big(base)
            .pow_mod(&from_big(exp), m)
            .ok()
            .map(|r| to_big(&r))
    }

    /// `mpz_powm_sec` needs an odd modulus and a positive exponent; `None` if
    /// either is not so (every modulus here is odd: n^2, p^2, q^2).
    pub(super) fn pow_secret(base: &BigUint, exp: &BigUint, m: &Integer) -> Option<BigUint> {
        let e = from_big(exp);
        if m.is_even() || e <= 0 {
            return None;
        }
        let r = Integer::from(from_big(base).secure_pow_mod_ref(&e, m));
        Some(to_big(&r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn big(bytes: &[u8]) -> BigUint {
        BigUint::from_bytes_be(bytes)
    }

    /// Known answers: 3^200 mod (2^127 - 1) and a product mod a small odd modulus.
    #[test]
    fn known_answers() {
        let m = (BigUint::one() << 127u32) - BigUint::one();
        let ring = ModRing::new(m.clone());
        // 2^127 = 1 mod m, so 2^(127 k + r) = 2^r.
        let two = BigUint::from(2u32);
        assert_eq!(
            ring.pow(&two, &BigUint::from(127u32 * 5 + 3)),
            BigUint::from(8u32)
        );
        assert_eq!(
            ring.pow_secret(&two, &BigUint::from(127u32 * 9 + 10)),
            BigUint::from(1024u32)
        );
        let small = ModRing::new(BigUint::from(1_000_003u32));
        assert_eq!(
            small.mul(&BigUint::from(999_999u32), &BigUint::from(123_456u32)),
            BigUint::from(999_999u64 * 123_456 % 1_000_003)
        );
        assert_eq!(small.pow_secret(&two, &BigUint::zero()), BigUint::one());
    }

    proptest! {
        /// The engine this build runs agrees with num-bigint on every operation.
        #[test]
        fn engines_agree(
            m in prop::collection::vec(any::<u8>(), 1..80),
            a in prop::collection::vec(any::<u8>(), 0..100),
            b in prop::collection::vec(any::<u8>(), 0..100),
            e in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            // An odd modulus above 1, as every modulus here is.
            let m = big(&m) * 2u32 + 3u32;
            let (a, b, e) = (big(&a), big(&b), big(&e));
            let fast = ModRing::new(m.clone());
            let pure = ModRing::num_bigint(m);
            prop_assert_eq!(fast.mul(&a, &b), pure.mul(&a, &b));
            prop_assert_eq!(fast.pow(&a, &e), pure.pow(&a, &e));
            prop_assert_eq!(fast.pow_secret(&a, &e), pure.pow_secret(&a, &e));
            let elems = [fast.elem(&a), fast.elem(&b), fast.elem(&e)];
            let expected = pure.mul(&pure.mul(&a, &b), &e);
            prop_assert_eq!(fast.product(&elems), expected);
            prop_assert_eq!(fast.product([]), BigUint::one() % pure.modulus());
            // Unreduced factors (a ciphertext below n^2 taken mod n), read from bytes.
            let big_a = &a * &a * &b + &e;
            let want = (&big_a % pure.modulus()) * (&b % pure.modulus()) % pure.modulus();
            for ring in [&fast, &pure] {
                let read = ring.elem_from_be_bytes(&big_a.to_bytes_be());
                prop_assert_eq!(read.to_big(), big_a.clone());
                prop_assert_eq!(ring.product([&read, &ring.elem(&b)]), want.clone());
                let width = big_a.to_bytes_be().len() + 3;
                let mut padded = vec![0u8; 3];
                padded.extend_from_slice(&big_a.to_bytes_be());
                prop_assert_eq!(ring.to_be_bytes(&read, width), padded);
                prop_assert_eq!(ring.divides(&read), (&big_a % ring.modulus()).is_zero());
                prop_assert!(ring.divides(&ring.elem(&(&b * ring.modulus()))));
                prop_assert_eq!(
                    ring.is_residue(&read),
                    !big_a.is_zero() && &big_a < ring.modulus()
                );
            }
            let (x, y) = (fast.elem(&(&a % pure.modulus())), fast.elem(&(&b % pure.modulus())));
            prop_assert_eq!(fast.mul_elem(&x, &y).to_big(), pure.mul(&a, &b));
        }
    }
}
