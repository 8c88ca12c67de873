//! Arithmetic modulo one fixed odd modulus (n^2, or p^2 and q^2 in decryption):
//! where every role spends its time. With feature `gmp` (on by default) it runs on
//! the system's GMP through `rug` (`mpz_mul`, `mpz_powm`, and `mpz_powm_sec` where
//! the exponent is secret); without it, on num-bigint, for platforms without GMP.
//! Both engines give the same values (a property test checks them against each
//! other); [`ModRing::num_bigint`] keeps the pure engine reachable in a GMP build,
//! so the benches measure both in one run.
//!
//! Values cross this interface as `BigUint`. Converting costs a copy of the limbs
//! per operand, which is small beside a multiplication of this size but not
//! nothing: callers with long chains of operations on one value (the proxy's fold)
//! are the next to keep GMP integers across calls.

use num_bigint::BigUint;
use num_traits::{One, Zero};

/// A residue held in its ring's engine, converted once: a table of values that
/// many products read (the randomizer's fixed-base windows) pays no conversion
/// per use.
#[derive(Clone)]
pub struct Elem(ElemRepr);

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

    /// The product of `factors` mod m (1 for none), converted out once.
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

    /// The product of `values` mod m (1 for none); the values need not be reduced.
    pub fn product_of<'a>(&self, values: impl IntoIterator<Item = &'a BigUint>) -> BigUint {
        match &self.engine {
            Engine::NumBigint => values.into_iter().fold(BigUint::one() % &self.m, |acc, v| {
                (acc * (v % &self.m)) % &self.m
            }),
            #[cfg(feature = "gmp")]
            Engine::Gmp(m) => gmp::product_of(values, m),
        }
    }

    /// Whether gcd(x, m) = 1.
    pub fn is_unit(&self, x: &BigUint) -> bool {
        match &self.engine {
            Engine::NumBigint => num_integer::Integer::gcd(x, &self.m).is_one(),
            #[cfg(feature = "gmp")]
            Engine::Gmp(m) => gmp::from_big(x).gcd(m) == 1,
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

#[cfg(feature = "gmp")]
mod gmp {
    use num_bigint::BigUint;
    use rug::integer::Order;
    use rug::Integer;

    pub(super) fn from_big(x: &BigUint) -> Integer {
        Integer::from_digits(&x.to_u64_digits(), Order::Lsf)
    }

    pub(super) fn to_big(x: &Integer) -> BigUint {
        BigUint::new(x.to_digits::<u32>(Order::Lsf))
    }

    pub(super) fn product<'a>(
        factors: impl Iterator<Item = &'a super::ElemRepr>,
        m: &Integer,
    ) -> BigUint {
        let mut acc = Integer::from(1) % m;
        for f in factors {
            match f {
                super::ElemRepr::Gmp(x) => acc *= x,
                super::ElemRepr::NumBigint(x) => acc *= from_big(x),
            }
            acc %= m;
        }
        to_big(&acc)
    }

    pub(super) fn product_of<'a>(
        values: impl IntoIterator<Item = &'a BigUint>,
        m: &Integer,
    ) -> BigUint {
        let mut acc = Integer::from(1) % m;
        for v in values {
            acc *= from_big(v);
            acc %= m;
        }
        to_big(&acc)
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
            // Unreduced values (a ciphertext below n^2 taken mod n).
            let big_a = &a * &a * &b + &e;
            let want = (&big_a % pure.modulus()) * (&b % pure.modulus()) % pure.modulus();
            prop_assert_eq!(fast.product_of([&big_a, &b]), want.clone());
            prop_assert_eq!(pure.product_of([&big_a, &b]), want);
            prop_assert_eq!(fast.is_unit(&a), pure.is_unit(&a));
            // m > 1 divides a m: never a unit.
            prop_assert!(!fast.is_unit(&(&a * pure.modulus())));
        }
    }
}
