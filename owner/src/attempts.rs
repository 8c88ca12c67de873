//! What an owner's run keeps across its attempts: the contribution encrypted on
//! one, so that a retry after a broken upload or a restarting proxy sends the
//! same ciphertexts instead of encrypting again (5-8 s at M = 1000 and 3072
//! bits). The same ciphertexts sent again tell the proxy nothing it could not
//! have kept from the first upload; fresh ones would be a second encryption of
//! the same share, which tells it no more either.
//!
//! A kept contribution is reused only for the same contribution id (which hashes
//! the study, the owner and the data file's bytes): a data file changed between
//! attempts is encrypted afresh. The spec is the run's first: a proxy serves a
//! study's stored spec unchanged across restarts, so one that differs on a later
//! attempt (compared in its wire form re-encoded from the validated spec, so
//! exactly what the encryption read) ends the run. Encrypting again for it would
//! let a proxy that answers each upload as an outage and changes a field have
//! the owner encrypt (and, under `mask`, sign a count) over and over, and send
//! contributions of the same rows under two specs to one study.

use std::sync::{Arc, Mutex, PoisonError};

use dpca_proto::v1;

/// A contribution ready to upload, with what the owner's report says of it.
#[derive(Clone, Debug)]
pub(crate) struct Encrypted {
    /// The upload's chunks, header and count signature included.
    pub chunks: Arc<Vec<v1::ContributionChunk>>,
    /// Rows in the share.
    pub rows: u64,
    /// Rows the row-norm clip shortened.
    pub clipped_rows: usize,
}

impl Encrypted {
    /// Ciphertexts in the chunks.
    pub fn ciphertexts(&self) -> usize {
        self.chunks.iter().map(|c| c.ciphertexts.len()).sum()
    }
}

/// The proxy served the study with another spec than the one this run
/// encrypted for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the proxy served the study with another spec than on an earlier attempt of this run, \
     which encrypted for the first: refusing to encrypt again (a restarted proxy serves \
     the stored spec unchanged, so this one's state changed or it deviates)"
)]
pub(crate) struct SpecChanged;

/// What the contribution was encrypted for.
struct Kept {
    contribution_id: String,
    spec: v1::StudySpec,
    /// Whether the proxy said the study was noise-free (the owner then added no
    /// noise share): a later answer that it is not must not reuse this one.
    noise_free: bool,
    encrypted: Encrypted,
}

/// The attempts of one run so far.
#[derive(Default)]
struct State {
    tally: Tally,
    kept: Option<Kept>,
}

/// A run's attempts, shared by them in turn (each attempt is a future the retry
/// loop makes anew, so their state sits behind a lock no attempt holds across an
/// await).
#[derive(Default)]
pub(crate) struct Attempts(Mutex<State>);

/// How a run went, for its report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Tally {
    /// Attempts begun.
    pub attempts: u32,
    /// Times the share was encrypted.
    pub encryptions: u32,
    /// Wall seconds spent encrypting, over every attempt.
    pub seconds_encrypting: f64,
}

impl Attempts {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned state is still whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts an attempt begun.
    pub fn begin(&self) {
        self.state().tally.attempts += 1;
    }

    /// The contribution kept from an earlier attempt if it was encrypted for
    /// `contribution_id`; refused if it was encrypted for another spec than
    /// `spec`, or with another noise-free flag than `noise_free`.
    pub fn kept_for(
        &self,
        contribution_id: &str,
        (spec, noise_free): (&v1::StudySpec, bool),
    ) -> Result<Option<Encrypted>, SpecChanged> {
        let state = self.state();
        let Some(kept) = state.kept.as_ref() else {
            return Ok(None);
        };
        if &kept.spec != spec || kept.noise_free != noise_free {
            return Err(SpecChanged);
        }
        Ok((kept.contribution_id == contribution_id).then(|| kept.encrypted.clone()))
    }

    /// Counts an encryption of `seconds`, and keeps what it made, `encrypted` for
    /// `contribution_id` and `spec`, for the attempts that follow.
    pub fn record_encryption(
        &self,
        contribution_id: String,
        (spec, noise_free): (v1::StudySpec, bool),
        encrypted: Encrypted,
        seconds: f64,
    ) {
        let mut state = self.state();
        state.tally.encryptions += 1;
        state.tally.seconds_encrypting += seconds;
        state.kept = Some(Kept {
            contribution_id,
            spec,
            noise_free,
            encrypted,
        });
    }

    /// The run so far.
    pub fn tally(&self) -> Tally {
        self.state().tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encrypted(rows: u64) -> Encrypted {
        Encrypted {
            chunks: Arc::new(vec![v1::ContributionChunk::default()]),
            rows,
            clipped_rows: 0,
        }
    }

    fn spec(deadline_unix_ms: u64) -> v1::StudySpec {
        v1::StudySpec {
            deadline_unix_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_contribution_is_reused_only_for_its_id_and_its_spec() {
        let attempts = Attempts::default();
        assert_eq!(
            attempts
                .kept_for("id", (&spec(1), false))
                .map(|k| k.is_some()),
            Ok(false)
        );
        attempts.record_encryption("id".into(), (spec(1), false), encrypted(7), 2.0);
        let again = attempts
            .kept_for("id", (&spec(1), false))
            .expect("same spec")
            .expect("kept");
        assert_eq!(again.rows, 7);
        // The same chunks, not a copy of them.
        let first = attempts
            .kept_for("id", (&spec(1), false))
            .expect("same spec")
            .expect("kept");
        assert!(Arc::ptr_eq(&first.chunks, &again.chunks));
        // Another data file (another id) is encrypted afresh.
        let other = attempts
            .kept_for("other", (&spec(1), false))
            .expect("same spec");
        assert!(other.is_none());
    }

    /// A proxy that answers each upload as an outage and changes the spec (here
    /// its deadline by a millisecond) had the owner encrypt again on every attempt.
    #[test]
    fn a_spec_changed_between_attempts_ends_the_run() {
        let attempts = Attempts::default();
        attempts.record_encryption("id".into(), (spec(1), false), encrypted(7), 2.0);
        assert_eq!(
            attempts
                .kept_for("id", (&spec(2), false))
                .map(|k| k.is_some()),
            Err(SpecChanged)
        );
        assert_eq!(
            attempts
                .kept_for("other", (&spec(2), false))
                .map(|k| k.is_some()),
            Err(SpecChanged)
        );
    }

    #[test]
    fn the_count_adds_up_attempts_and_encryptions() {
        let attempts = Attempts::default();
        attempts.begin();
        attempts.record_encryption("id".into(), (spec(1), false), encrypted(1), 2.0);
        attempts.begin();
        attempts.begin();
        attempts.record_encryption("other".into(), (spec(1), false), encrypted(1), 3.0);
        assert_eq!(
            attempts.tally(),
            Tally {
                attempts: 3,
                encryptions: 2,
                seconds_encrypting: 5.0,
            }
        );
        // The last encryption replaced the first.
        let kept = |id| {
            attempts
                .kept_for(id, (&spec(1), false))
                .map(|k| k.is_some())
        };
        assert_eq!((kept("id"), kept("other")), (Ok(false), Ok(true)));
    }

    /// An encryption made while the proxy said the study was noise-free (no
    /// noise share added) is not reused once it says the study is not.
    #[test]
    fn a_noise_free_encryption_is_not_reused_for_a_noised_study() {
        let attempts = Attempts::default();
        attempts.record_encryption("id".into(), (spec(1), true), encrypted(7), 2.0);
        assert!(attempts.kept_for("id", (&spec(1), false)).is_err());
        assert!(matches!(
            attempts.kept_for("id", (&spec(1), true)),
            Ok(Some(_))
        ));
    }
}
