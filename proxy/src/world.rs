//! Time and randomness as the proxy reads them: the system's in production,
//! injected through [`crate::ProxyConfig`] so that tests can set the clock by hand
//! and replay the randomness of a run from a seed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::OsRng;
use rand::{CryptoRng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Wall-clock time, in milliseconds since the Unix epoch: what study deadlines are
/// written in.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now.
    fn now_ms(&self) -> u64;
}

/// The system's clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        dpca_shell::clock::now_unix_ms().unwrap_or(0)
    }
}

/// A clock that moves only when told to (tests: a deadline passes at once).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn at(now_ms: u64) -> Self {
        Self(AtomicU64::new(now_ms))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A cryptographically secure generator, as a trait object.
pub trait SecureRng: RngCore + CryptoRng + Send {}

impl<R: RngCore + CryptoRng + Send> SecureRng for R {}

/// Where the proxy's randomness comes from: study ids, the mask, the noise and
/// the re-randomization of the release.
pub trait Entropy: Send + Sync + std::fmt::Debug {
    /// A generator for one draw (a study id, one release).
    fn rng(&self) -> Box<dyn SecureRng>;
}

/// The operating system's generator.
#[derive(Debug, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    /// ChaCha20 keyed with 256 bits from the operating system: one
    /// system call per draw instead of one per value. A release's noise is hundreds
    /// of thousands of exact samples, each taking several uniform values, and
    /// reading each from the system took a third of the proxy's time in a
    /// `dp-mean` study at M = 1000.
    fn rng(&self) -> Box<dyn SecureRng> {
        let mut key = [0u8; 32];
        OsRng.fill_bytes(&mut key);
        Box::new(ChaCha20Rng::from_seed(key))
    }
}

/// Replayable randomness for tests: draw i is ChaCha20 keyed with the seed and i,
/// so two proxies given the same seed and the same calls draw the same values.
/// Never for a real study: whoever knows the seed knows the noise.
#[derive(Debug)]
pub struct SeededEntropy {
    seed: u64,
    draws: AtomicU64,
}

impl SeededEntropy {
    /// Randomness replayed from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            draws: AtomicU64::new(0),
        }
    }
}

impl Entropy for SeededEntropy {
    fn rng(&self) -> Box<dyn SecureRng> {
        let draw = self.draws.fetch_add(1, Ordering::SeqCst);
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(&draw.to_le_bytes());
        Box::new(ChaCha20Rng::from_seed(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_entropy_replays_its_draws_and_differs_between_draws() {
        let (a, b) = (SeededEntropy::new(7), SeededEntropy::new(7));
        let draw = |e: &SeededEntropy| e.rng().next_u64();
        let (a1, a2) = (draw(&a), draw(&a));
        assert_eq!((a1, a2), (draw(&b), draw(&b)));
        assert_ne!(a1, a2);
        assert_ne!(a1, draw(&SeededEntropy::new(8)));
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::at(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now_ms(), 3_000);
    }
}
