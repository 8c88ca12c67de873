//! Random primes for Paillier keys, found on every core of the pool.
//!
//! Each candidate is drawn uniformly from the numbers of its size with the two top
//! bits set (independent draws, not an incremental search, so every prime of the
//! range is as likely as any other), sieved by trial division by the odd primes
//! below [`SIEVE_BOUND`], and tested by Miller-Rabin with [`MR_ROUNDS`] random
//! bases (error at most 4^-40 for any odd number; far less for a random one).
//!
//! A key's generation is one serial step of a study, before any owner can
//! encrypt. It ran on one core and took about an eighth of a 3072-bit `mask`
//! study at M = 64 and a quarter of a `dp-mean` one (docs/BENCHMARKS.md). So the
//! candidates are tested a batch at a time on the pool, and the surviving one's
//! remaining rounds spread over the pool too. The caller's RNG keys one generator
//! (32 bytes of it per prime); that generator gives each candidate, in order, the
//! seed its number and its bases come from, and the first prime in draw order
//! wins: the prime depends on the caller's RNG alone, not on the number of
//! threads. The exponentiations of Miller-Rabin go through
//! [`ModRing::pow_secret`]: the kept candidate's are exponentiations by a number
//! that gives away the prime.

use num_bigint::BigUint;
use num_traits::One;
use rand::{CryptoRng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use std::sync::OnceLock;

use crate::arith::{random_below, random_seed, ModRing};

/// Miller-Rabin rounds of a prime that is kept.
pub const MR_ROUNDS: usize = 40;

/// Trial division is by the odd primes below this. Measured at 1536 bits: a
/// candidate's residues cost a few microseconds, well under a percent of a
/// Miller-Rabin round (1.6 ms), and sieving to 2^12 rather than 2^8 leaves two
/// thirds as many candidates to test (Mertens: the survivors fall as
/// 1 / ln(bound)).
pub const SIEVE_BOUND: u32 = 1 << 12;

/// Candidates drawn per thread of the pool before they are tested together.
const BATCH_PER_THREAD: usize = 16;

/// Candidates drawn at most before they are tested together.
const MAX_BATCH: usize = 128;

/// The odd primes below [`SIEVE_BOUND`], grouped so that each group's product fits
/// in 64 bits: a candidate is reduced once per group, in single-word arithmetic.
struct Sieve {
    groups: Vec<(u64, Vec<u32>)>,
}

impl Sieve {
    fn get() -> &'static Sieve {
        static SIEVE: OnceLock<Sieve> = OnceLock::new();
        SIEVE.get_or_init(|| Sieve::new(SIEVE_BOUND))
    }

    fn new(bound: u32) -> Self {
        let mut groups: Vec<(u64, Vec<u32>)> = Vec::new();
        for p in odd_primes_below(bound) {
            match groups.last_mut() {
                Some((product, members)) if product.checked_mul(p as u64).is_some() => {
                    *product *= p as u64;
                    members.push(p);
                }
                _ => groups.push((p as u64, vec![p])),
            }
        }
        Self { groups }
    }

    /// Whether some sieve prime divides `n`, a number of at least
    /// [`SIEVE_BOUND`] (so not a sieve prime itself).
    fn has_small_factor(&self, n: &BigUint) -> bool {
        let digits = n.to_u64_digits();
        self.groups.iter().any(|(product, members)| {
            let r = digits.iter().rev().fold(0u64, |r, &d| {
                ((((r as u128) << 64) | d as u128) % *product as u128) as u64
            });
            members.iter().any(|&p| r % p as u64 == 0)
        })
    }
}

/// The odd primes below `bound`, by the sieve of Eratosthenes.
fn odd_primes_below(bound: u32) -> Vec<u32> {
    let mut composite = vec![false; bound as usize];
    let mut primes = Vec::new();
    for i in 3..bound as usize {
        if composite[i] || i % 2 == 0 {
            continue;
        }
        primes.push(i as u32);
        for j in (i * i..bound as usize).step_by(i) {
            composite[j] = true;
        }
    }
    primes
}

/// One odd number under test and the RNG its Miller-Rabin bases come from.
struct Candidate {
    n: BigUint,
    bases: ChaCha20Rng,
}

impl Candidate {
    /// The candidate of `seed`: `bits` random bits, the two top ones and the
    /// lowest set.
    fn draw(bits: u64, seed: [u8; 32]) -> Self {
        let mut rng = ChaCha20Rng::from_seed(seed);
        let top = BigUint::from(3u32) << (bits - 2);
        let n = random_below(&(BigUint::one() << bits), &mut rng) | top | BigUint::one();
        Self { n, bases: rng }
    }

    /// The next `count` bases, uniform in [2, n - 2].
    fn bases(&mut self, count: usize) -> Vec<BigUint> {
        let span = &self.n - 3u32;
        (0..count)
            .map(|_| random_below(&span, &mut self.bases) + 2u32)
            .collect()
    }
}

/// Whether odd `n` > 3 passes Miller-Rabin to every base of `bases`, tested on
/// the pool.
fn passes_all(n: &BigUint, bases: &[BigUint]) -> bool {
    let ring = ModRing::new(n.clone());
    let n_minus_1 = n - 1u32;
    let s = n_minus_1.trailing_zeros().unwrap_or(0);
    let d = &n_minus_1 >> s;
    bases.par_iter().all(|a| {
        let mut x = ring.pow_secret(a, &d);
        if x.is_one() || x == n_minus_1 {
            return true;
        }
        (1..s).any(|_| {
            x = ring.mul(&x, &x);
            x == n_minus_1
        })
    })
}

/// Miller-Rabin with `rounds` random bases (at least one) after trial division;
/// error probability at most 4^-rounds.
pub fn is_probable_prime<R: RngCore + CryptoRng>(n: &BigUint, rounds: usize, rng: &mut R) -> bool {
    if n < &BigUint::from(SIEVE_BOUND) {
        let n = small(n);
        return n == 2 || Sieve::get().groups.iter().any(|(_, m)| m.contains(&n));
    }
    if !n.bit(0) || Sieve::get().has_small_factor(n) {
        return false;
    }
    let span = n - 3u32;
    let bases: Vec<BigUint> = (0..rounds.max(1))
        .map(|_| random_below(&span, rng) + 2u32)
        .collect();
    passes_all(n, &bases)
}

/// `n`, known to be below [`SIEVE_BOUND`], as a word.
fn small(n: &BigUint) -> u32 {
    n.iter_u32_digits().next().unwrap_or(0)
}

/// A random prime of exactly `bits` bits (at least 16) with its two top bits set,
/// so that the product of two such primes has exactly twice as many bits.
pub fn random_prime<R: RngCore + CryptoRng>(bits: u64, rng: &mut R) -> BigUint {
    assert!(
        bits >= 16,
        "a prime of {bits} bits is below the sieve's reach"
    );
    // The caller's RNG gives one seed, whatever the batches: what it gives next
    // (the key's other prime) does not depend on the pool either.
    let mut seeds = ChaCha20Rng::from_seed(random_seed(rng));
    // Capped: a 1024-bit prime takes about 355 draws, and a batch is tested whole.
    let batch = (BATCH_PER_THREAD * rayon::current_num_threads()).min(MAX_BATCH);
    let sieve = Sieve::get();
    loop {
        let drawn: Vec<[u8; 32]> = (0..batch).map(|_| random_seed(&mut seeds)).collect();
        // Sieve and first round for the whole batch on the pool, in draw order.
        let survivors: Vec<Candidate> = drawn
            .into_par_iter()
            .map(|seed| Candidate::draw(bits, seed))
            .filter(|c| !sieve.has_small_factor(&c.n))
            .filter_map(|mut c| {
                let first = c.bases(1);
                passes_all(&c.n, &first).then_some(c)
            })
            .collect();
        for mut c in survivors {
            let rest = c.bases(MR_ROUNDS - 1);
            if passes_all(&c.n, &rest) {
                return c.n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand_chacha::ChaCha20Rng;

    /// Trial division the slow way, for the sieve to be checked against.
    fn is_prime_slowly(n: u64) -> bool {
        n >= 2
            && (2..)
                .take_while(|d| d * d <= n)
                .all(|d| !n.is_multiple_of(d))
    }

    #[test]
    fn the_sieve_holds_the_odd_primes_below_its_bound() {
        let primes = odd_primes_below(SIEVE_BOUND);
        let expected: Vec<u32> = (3..SIEVE_BOUND)
            .filter(|&n| is_prime_slowly(n as u64))
            .collect();
        assert_eq!(primes, expected);
        let grouped: Vec<u32> = Sieve::get()
            .groups
            .iter()
            .flat_map(|(_, m)| m.clone())
            .collect();
        assert_eq!(grouped, expected);
        for (product, members) in &Sieve::get().groups {
            assert_eq!(*product, members.iter().map(|&p| p as u64).product::<u64>());
        }
    }

    proptest! {
        /// The sieve finds a small factor exactly when trial division does, on
        /// numbers of 2 to 16 words, with a known small factor and as drawn.
        #[test]
        fn sieve_agrees_with_trial_division(
            words in proptest::collection::vec(any::<u64>(), 2..=16),
            k in any::<usize>(),
        ) {
            let n = BigUint::from_slice(
                &words.iter().flat_map(|w| [*w as u32, (w >> 32) as u32]).collect::<Vec<_>>(),
            ) | (BigUint::one() << 64u32);
            let primes = odd_primes_below(SIEVE_BOUND);
            let p = primes[k % primes.len()];
            prop_assert!(Sieve::get().has_small_factor(&(&n * p)));
            let expected = primes.iter().any(|&q| (&n % q) == BigUint::from(0u32));
            prop_assert_eq!(Sieve::get().has_small_factor(&n), expected);
        }
    }

    /// The prime is the first prime among the candidates in draw order: each an
    /// independent uniform draw (no search from a random start, which would
    /// favour primes after long gaps), whatever the batches.
    #[test]
    fn the_prime_is_the_first_prime_drawn() {
        for s in 0..20u64 {
            let mut seeds = ChaCha20Rng::from_seed(random_seed(&mut ChaCha20Rng::seed_from_u64(s)));
            let first = std::iter::repeat_with(|| Candidate::draw(16, random_seed(&mut seeds)).n)
                .find(|n| is_prime_slowly(n.iter_u64_digits().next().unwrap_or(0)))
                .expect("a prime");
            assert_eq!(random_prime(16, &mut ChaCha20Rng::seed_from_u64(s)), first);
        }
    }

    #[test]
    fn known_primes_and_composites() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        // 2^127 - 1 and 2^521 - 1 are Mersenne primes. Their product and
        // 2^128 + 1 (= 59649589127497217 * 5704689200685129054721) have no factor
        // the sieve sees: Miller-Rabin must find them out.
        let m127 = (BigUint::one() << 127u32) - 1u32;
        let m521 = (BigUint::one() << 521u32) - 1u32;
        assert!(is_probable_prime(&m127, 20, &mut rng));
        assert!(is_probable_prime(&m521, 20, &mut rng));
        let fermat7 = (BigUint::one() << 128u32) + 1u32;
        for composite in [&m127 * &m521, fermat7] {
            assert!(!Sieve::get().has_small_factor(&composite));
            assert!(!is_probable_prime(&composite, 20, &mut rng));
        }
        // The smallest strong pseudoprime to the bases 2, 3, 5 and 7 (151 * 751 *
        // 28351): the sieve finds it out.
        assert!(!is_probable_prime(
            &BigUint::from(3_215_031_751u64),
            20,
            &mut rng
        ));
        for n in [2u32, 3, 5, 4093] {
            assert!(is_probable_prime(&BigUint::from(n), 1, &mut rng), "{n}");
        }
        for n in [0u32, 1, 4, 9, 4095] {
            assert!(!is_probable_prime(&BigUint::from(n), 1, &mut rng), "{n}");
        }
    }

    #[test]
    fn random_primes_have_their_size_and_do_not_depend_on_the_pool() {
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| random_prime(256, &mut ChaCha20Rng::seed_from_u64(9)))
        };
        let p = on(1);
        assert_eq!(p.bits(), 256);
        assert!(p.bit(254), "the second bit from the top is set");
        assert!(is_probable_prime(
            &p,
            40,
            &mut ChaCha20Rng::seed_from_u64(2)
        ));
        assert_eq!(on(3), p, "the prime depends on the seed, not the pool");
    }
}
