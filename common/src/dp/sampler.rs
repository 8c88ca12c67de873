//! Exact samplers on the integer grid (Canonne, Kamath, Steinke 2020, "The Discrete
//! Gaussian for Differential Privacy", Algorithms 1-3).
//!
//! Every probability is a ratio of big integers and every coin is drawn from the
//! caller's cryptographic RNG, so no floating-point value ever touches the noise:
//! float samplers leak through their rounding (Mironov 2012 and the diffprivlib,
//! smartnoise and opacus breaks since).
//!
//! Known limitation: the running time of a rejection sampler depends on the sample.
//! The proxy samples the noise once per study, in the transition that seals it, and
//! the user sees only the total time of that transition over all M(M+1)/2 entries,
//! which is dominated by the homomorphic work; a constant-time sampler is future work.

use num_bigint::{BigInt, BigUint, Sign};
use num_integer::Integer;
use num_traits::{One, Zero};
use rand::{CryptoRng, RngCore};

use crate::arith::random_below;

/// A nonnegative rational num / den with den > 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ratio {
    /// Numerator.
    pub num: BigUint,
    /// Denominator, nonzero.
    pub den: BigUint,
}

impl Ratio {
    /// num / den; den must be nonzero.
    pub fn new(num: BigUint, den: BigUint) -> Self {
        debug_assert!(!den.is_zero());
        Self { num, den }
    }

    /// An integer as a ratio.
    pub fn integer(v: BigUint) -> Self {
        Self::new(v, BigUint::one())
    }
}

/// Bernoulli(num / den), num <= den.
pub fn bernoulli<R: RngCore + CryptoRng>(p: &Ratio, rng: &mut R) -> bool {
    random_below(&p.den, rng) < p.num
}

/// Bernoulli(exp(-gamma)) for a rational gamma >= 0 (CKS20 Algorithm 1).
pub fn bernoulli_exp<R: RngCore + CryptoRng>(gamma: &Ratio, rng: &mut R) -> bool {
    let (whole, rem) = gamma.num.div_rem(&gamma.den);
    // exp(-gamma) = exp(-1)^floor(gamma) * exp(-frac(gamma)); stop at the first 0.
    let one = Ratio::integer(BigUint::one());
    let mut k = BigUint::zero();
    while k < whole {
        if !bernoulli_exp_unit(&one, rng) {
            return false;
        }
        k += 1u32;
    }
    bernoulli_exp_unit(&Ratio::new(rem, gamma.den.clone()), rng)
}

/// Bernoulli(exp(-gamma)) for gamma in [0, 1]: count K until Bernoulli(gamma / K)
/// fails; the parity of K is the answer.
fn bernoulli_exp_unit<R: RngCore + CryptoRng>(gamma: &Ratio, rng: &mut R) -> bool {
    let mut k = BigUint::one();
    loop {
        let p = Ratio::new(gamma.num.clone(), &gamma.den * &k);
        if !bernoulli(&p, rng) {
            break;
        }
        k += 1u32;
    }
    k.is_odd()
}

/// One sample of the discrete Laplace distribution on Z with P(x) proportional to
/// exp(-|x| / t), for an integer scale t >= 1 (CKS20 Algorithm 2 with s = 1).
pub fn discrete_laplace<R: RngCore + CryptoRng>(t: &BigUint, rng: &mut R) -> BigInt {
    let e1 = Ratio::integer(BigUint::one());
    loop {
        let u = random_below(t, rng);
        if !bernoulli_exp(&Ratio::new(u.clone(), t.clone()), rng) {
            continue;
        }
        let mut v = BigUint::zero();
        while bernoulli_exp(&e1, rng) {
            v += 1u32;
        }
        let x = u + t * v;
        let negative = rng.next_u32() & 1 == 1;
        if negative && x.is_zero() {
            continue;
        }
        let sign = if negative { Sign::Minus } else { Sign::Plus };
        return BigInt::from_biguint(sign, x);
    }
}

/// One sample of the discrete Gaussian on Z with P(x) proportional to
/// exp(-x^2 / (2 sigma^2)), for a rational sigma^2 > 0 (CKS20 Algorithm 3).
pub fn discrete_gaussian<R: RngCore + CryptoRng>(sigma2: &Ratio, rng: &mut R) -> BigInt {
    // t = floor(sigma) + 1, from the integer square root of sigma^2 rounded down.
    let floor_sigma = (&sigma2.num / &sigma2.den).sqrt();
    let t = floor_sigma + 1u32;
    let a = BigInt::from(sigma2.num.clone());
    let b = BigInt::from(sigma2.den.clone());
    let tb = BigInt::from(t.clone());
    loop {
        let y = discrete_laplace(&t, rng);
        // gamma = (|y| - sigma^2 / t)^2 / (2 sigma^2) = (|y| b t - a)^2 / (2 a b t^2)
        let ay = BigInt::from(y.magnitude().clone());
        let diff = &ay * &b * &tb - &a;
        let num = (&diff * &diff).magnitude().clone();
        let den = (BigInt::from(2u32) * &a * &b * &tb * &tb)
            .magnitude()
            .clone();
        if bernoulli_exp(&Ratio::new(num, den), rng) {
            return y;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn to_f64(v: &BigInt) -> f64 {
        use num_traits::ToPrimitive;
        v.to_f64().unwrap_or(f64::NAN)
    }

    /// Goodness of fit: empirical frequencies of a small-sigma discrete Gaussian
    /// against its exact pmf, chi-square over the central cells.
    #[test]
    fn discrete_gaussian_matches_pmf() {
        let mut rng = ChaCha20Rng::seed_from_u64(42);
        let sigma2 = Ratio::new(BigUint::from(9u32), BigUint::from(4u32)); // sigma = 1.5
        let n = 20_000usize;
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..n {
            let y = discrete_gaussian(&sigma2, &mut rng);
            *counts.entry(to_f64(&y) as i64).or_insert(0usize) += 1;
        }
        let s2 = 2.25f64;
        let z: f64 = (-40..=40)
            .map(|x: i64| (-(x * x) as f64 / (2.0 * s2)).exp())
            .sum();
        let mut chi2 = 0.0;
        for x in -4i64..=4 {
            let p = (-(x * x) as f64 / (2.0 * s2)).exp() / z;
            let expected = p * n as f64;
            let observed = *counts.get(&x).unwrap_or(&0) as f64;
            chi2 += (observed - expected).powi(2) / expected;
        }
        // 9 cells: the 99.9% quantile of chi-square(8) is 26.1.
        assert!(chi2 < 26.1, "chi2 = {chi2}");
    }

    #[test]
    fn discrete_laplace_matches_pmf() {
        let mut rng = ChaCha20Rng::seed_from_u64(43);
        let t = BigUint::from(2u32);
        let n = 20_000usize;
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..n {
            let y = discrete_laplace(&t, &mut rng);
            *counts.entry(to_f64(&y) as i64).or_insert(0usize) += 1;
        }
        let q = (-0.5f64).exp();
        let z = (1.0 + q) / (1.0 - q);
        let mut chi2 = 0.0;
        for x in -5i64..=5 {
            let expected = q.powi(x.abs() as i32) / z * n as f64;
            let observed = *counts.get(&x).unwrap_or(&0) as f64;
            chi2 += (observed - expected).powi(2) / expected;
        }
        // 11 cells: the 99.9% quantile of chi-square(10) is 29.6.
        assert!(chi2 < 29.6, "chi2 = {chi2}");
    }

    /// Huge scales (as the N-scaled grid needs) keep the right spread.
    #[test]
    fn large_sigma_has_right_variance() {
        let mut rng = ChaCha20Rng::seed_from_u64(44);
        let sigma = BigUint::one() << 60usize;
        let sigma2 = Ratio::integer(&sigma * &sigma);
        let n = 4000;
        let s = to_f64(&BigInt::from(sigma));
        let var: f64 = (0..n)
            .map(|_| {
                let y = to_f64(&discrete_gaussian(&sigma2, &mut rng)) / s;
                y * y
            })
            .sum::<f64>()
            / n as f64;
        // Standard error of the variance estimate is about sqrt(2/n) = 0.022.
        assert!((var - 1.0).abs() < 0.1, "variance ratio {var}");
    }

    #[test]
    fn bernoulli_exp_frequency() {
        let mut rng = ChaCha20Rng::seed_from_u64(45);
        let gamma = Ratio::new(BigUint::from(3u32), BigUint::from(2u32));
        let n = 40_000;
        let hits = (0..n).filter(|_| bernoulli_exp(&gamma, &mut rng)).count();
        let p = (-1.5f64).exp();
        let se = (p * (1.0 - p) / n as f64).sqrt();
        assert!(((hits as f64 / n as f64) - p).abs() < 5.0 * se);
    }
}
