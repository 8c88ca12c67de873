//! The lifecycle of one study as an explicit state machine with pure transitions.
//!
//! ```text
//! Collecting --quorum reached / deadline with >= min owners--> Sealed
//! Collecting --deadline with < min owners--> Aborted
//! Sealed --user asks for the release--> Released   (noise and mask sampled here, once)
//!          (`mask`: with an opening of E[N], verified before any noise is planned)
//! ```
//!
//! The gRPC layer loads a study, applies one transition, and replies. The release is
//! computed once and kept: every fetch re-serves the same ciphertexts, so a retry or
//! a repeated fetch cannot be used to average the noise away.

use std::collections::BTreeMap;
use std::sync::Arc;

use dpca_common::arith::Elem;
use dpca_common::dp::{Centering, NoisePlan};
use dpca_common::paillier::{Ciphertext, Opening, PublicKey};
use dpca_common::protocol::{release, ProtocolError, ReleaseSecrets};
use dpca_common::randomizer::{Randomizer, Randomness};
use dpca_common::study::{StudyLayout, StudySpec};
use num_bigint::BigUint;
use num_traits::One;
use rand::{CryptoRng, RngCore};
use rayon::prelude::*;

/// Why a transition was refused. Carries ids, never data.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// Contributions are accepted only while collecting.
    #[error("study {study} is {phase}{why}: contributions are closed")]
    Closed {
        /// Study id.
        study: String,
        /// Current phase.
        phase: &'static str,
        /// Why it ended, for an aborted study (` (deadline passed ...)`), else empty.
        why: String,
    },
    /// A second, different contribution from the same owner.
    #[error("owner `{owner}` already contributed to study {study}")]
    DuplicateOwner {
        /// Study id.
        study: String,
        /// Owner id.
        owner: String,
    },
    /// Wrong number of ciphertexts.
    #[error("contribution has {got} ciphertexts, study {study} expects {expected}")]
    WrongCount {
        /// Study id.
        study: String,
        /// Expected count.
        expected: usize,
        /// Received count.
        got: usize,
    },
    /// The transition does not apply in this phase.
    #[error("study {study} is {phase}: {action} is not possible")]
    WrongPhase {
        /// Study id.
        study: String,
        /// Current phase.
        phase: &'static str,
        /// The attempted action.
        action: &'static str,
    },
    /// The owner is not on the study's list of invited owners.
    #[error("owner `{owner}` is not invited to study {study}")]
    NotInvited {
        /// Study id.
        study: String,
        /// Owner id.
        owner: String,
    },
    /// The revealed N is not plausible.
    #[error("revealed row count {n} is outside [{min}, {max}] for study {study}")]
    ImplausibleCount {
        /// Study id.
        study: String,
        /// Revealed value.
        n: u64,
        /// Lower bound (one row per contributing owner).
        min: u64,
        /// Upper bound (max_rows).
        max: u64,
    },
    /// A `mask` study's noise is calibrated to N: its release needs N, proven.
    #[error(
        "study {study} calibrates its noise to N (`mask` centering): the release needs \
         the opening of E[N]"
    )]
    CountNeeded {
        /// Study id.
        study: String,
    },
    /// N was offered for a study whose noise does not depend on it.
    #[error(
        "study {study} does not calibrate its noise to N (`dp-mean` centering): N is \
         not to be revealed"
    )]
    CountNotNeeded {
        /// Study id.
        study: String,
    },
    /// The opening does not prove that `E[N]` holds the N given: the user's word
    /// alone would set the noise.
    #[error(
        "the opening of E[N] for study {study} does not verify: E[N] does not hold the \
         {n} rows claimed"
    )]
    BadOpening {
        /// Study id.
        study: String,
        /// The row count claimed.
        n: u64,
    },
    /// The release computation failed.
    #[error("release of study {study} failed: {source}")]
    Release {
        /// Study id.
        study: String,
        /// Cause.
        source: ProtocolError,
    },
}

/// The released aggregate, as served to the user.
#[derive(Clone, Debug)]
pub struct Released {
    /// The pooled row count the noise was calibrated to, proven by the user's
    /// opening of `E[N]` (`mask`); `None` where N was never revealed (`dp-mean`).
    pub n_rows: Option<u64>,
    /// The noise plan actually used.
    pub plan: NoisePlan,
    /// Released ciphertexts in layout order.
    pub ciphertexts: Vec<Ciphertext>,
    /// Owners whose contributions are in the aggregate.
    pub owners: Vec<String>,
}

/// Phase of a study.
#[derive(Clone, Debug)]
pub enum Phase {
    /// Accepting contributions.
    Collecting,
    /// Contributions closed; waiting for the user to reveal N.
    Sealed,
    /// The noised, masked aggregate is ready.
    Released(Arc<Released>),
    /// Ended without a result.
    Aborted(String),
}

impl Phase {
    /// Short name for messages and status.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Collecting => "collecting",
            Self::Sealed => "sealed",
            Self::Released(_) => "released",
            Self::Aborted(_) => "aborted",
        }
    }
}

/// Owner ids a status answer, or an abort's reason, names of a set of owners:
/// an invitation list may hold thousands of ids of up to 256 bytes, which would
/// size every status answer (past the 4 MiB a client decodes) and every reason.
pub const NAMES_LISTED: usize = 16;

/// The first [`NAMES_LISTED`] ids of a set of owners, and how many it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The first ids, in order.
    pub names: Vec<String>,
    /// Ids in the set.
    pub count: usize,
}

impl Listed {
    fn of<'a>(ids: impl Iterator<Item = &'a String>) -> Self {
        let mut names = Vec::new();
        let mut count = 0;
        for id in ids {
            if names.len() < NAMES_LISTED {
                names.push(id.clone());
            }
            count += 1;
        }
        Self { names, count }
    }
}

impl std::fmt::Display for Listed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.names.join(", "))?;
        match self.count - self.names.len() {
            0 => Ok(()),
            more => write!(f, " and {more} more"),
        }
    }
}

/// What a contribution did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContributionOutcome {
    /// Counted now.
    Counted,
    /// The same contribution had already been counted (idempotent retry).
    AlreadyCounted,
}

/// An owner's `E[N_i]` as it signed it (`mask` over TLS): what the user checks
/// before it decrypts `E[N]` (`dpca_shell::signed_count`).
#[derive(Clone, Debug, PartialEq)]
pub struct SignedCount {
    /// `E[N_i]`, the bytes the owner sent.
    pub ciphertext: Vec<u8>,
    /// The owner's signature over (study, ciphertext).
    pub signature: Vec<u8>,
    /// The certificate (DER) the owner presented.
    pub certificate: Vec<u8>,
}

/// Whether the proxy draws its own noise for a release ([`Study::compute_release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnNoise {
    /// As the spec plans it ([`StudySpec::proxy_plan`]).
    Drawn,
    /// None at all, and reported as none: the test-only switch
    /// (`--test-skips-noise`) of a proxy that deviates, to show what the owners'
    /// noise alone gives.
    SkippedForTesting,
}

/// One study: its spec, running aggregate and phase.
#[derive(Clone, Debug)]
pub struct Study {
    /// Study id.
    pub id: String,
    /// The validated spec.
    pub spec: StudySpec,
    /// The layout derived from the spec.
    pub layout: StudyLayout,
    /// Test-only: release without noise (the proxy refuses it unless started with
    /// its explicit test flag).
    pub noise_free: bool,
    /// The user who opened the study, as its certificate names it (`None` on the
    /// insecure plaintext transport); only this user may use the study's result.
    pub opened_by: Option<String>,
    /// Owner id -> contribution id of each counted contribution. Shared, as the
    /// aggregate is: of the copies a contribution makes (the one its transition
    /// is tried on, the view, the store's), only the transition's copies the
    /// map, once per contribution rather than three times, for hundreds of owners.
    contributors: Arc<BTreeMap<String, String>>,
    /// Running ciphertext product of all counted contributions, held in the key's
    /// ring (no conversion per multiplication). Its size is the layout's, whatever
    /// the number of owners; once released, only E[N]. Shared, so a copy of the
    /// study (the service's view for `status`, the copy a transition is tried on)
    /// costs no copy of the aggregate.
    aggregate: Arc<Vec<Elem>>,
    /// Current phase.
    pub phase: Phase,
    /// Owner id -> its signed E[N_i], for the owners counted (`mask` over TLS);
    /// shared as the contributors are.
    signed_counts: Arc<BTreeMap<String, SignedCount>>,
}

impl Study {
    /// A new study in `Collecting`.
    pub fn new(id: String, spec: StudySpec, layout: StudyLayout, noise_free: bool) -> Self {
        let aggregate = Arc::new(Self::identity_aggregate(&spec.public_key, &layout));
        Self {
            id,
            spec,
            layout,
            noise_free,
            opened_by: None,
            contributors: Arc::default(),
            aggregate,
            phase: Phase::Collecting,
            signed_counts: Arc::default(),
        }
    }

    /// The aggregate of no contribution: the identity ciphertext 1 = E[0; r = 1]
    /// at every position (it is never sent as such).
    pub fn identity_aggregate(pk: &PublicKey, layout: &StudyLayout) -> Vec<Elem> {
        vec![pk.ring().elem(&BigUint::one()); layout.owner_ciphertexts()]
    }

    /// A study as its durable record describes it; refuses a record whose
    /// aggregate or release does not fit the spec's layout.
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        id: String,
        spec: StudySpec,
        layout: StudyLayout,
        noise_free: bool,
        opened_by: Option<String>,
        contributors: BTreeMap<String, String>,
        aggregate: Vec<Elem>,
        phase: Phase,
    ) -> Result<Self, String> {
        // A released study keeps only E[N] of its aggregate, an aborted one none
        // (what a build before kept of one is not read: `store::rebuild_aggregate`).
        let expected = match phase {
            Phase::Released(_) => 1,
            Phase::Collecting | Phase::Sealed => layout.owner_ciphertexts(),
            Phase::Aborted(_) => 0,
        };
        if aggregate.len() != expected {
            return Err(format!(
                "aggregate of {} ciphertexts, the layout has {expected}",
                aggregate.len()
            ));
        }
        if let Phase::Released(r) = &phase {
            if r.ciphertexts.len() != layout.release_ciphertexts() {
                return Err(format!(
                    "release of {} ciphertexts, the layout has {}",
                    r.ciphertexts.len(),
                    layout.release_ciphertexts()
                ));
            }
        }
        if matches!(phase, Phase::Sealed | Phase::Released(_)) && contributors.is_empty() {
            return Err("sealed with no contributions".into());
        }
        Ok(Self {
            id,
            spec,
            layout,
            noise_free,
            opened_by,
            contributors: Arc::new(contributors),
            aggregate: Arc::new(aggregate),
            phase,
            signed_counts: Arc::default(),
        })
    }

    /// Keeps a counted owner's signed `E[N_i]` for the user to check at the seal.
    pub fn keep_signed_count(&mut self, owner: &str, count: SignedCount) -> Result<(), String> {
        if !self.contributors.contains_key(owner) {
            return Err(format!("owner `{owner}` is not counted in this study"));
        }
        Arc::make_mut(&mut self.signed_counts).insert(owner.to_string(), count);
        Ok(())
    }

    /// Owner id -> signed `E[N_i]` of the owners counted (`mask` over TLS).
    pub fn signed_counts(&self) -> &BTreeMap<String, SignedCount> {
        &self.signed_counts
    }

    /// Owner id -> contribution id of every counted contribution.
    pub fn contributors(&self) -> &BTreeMap<String, String> {
        &self.contributors
    }

    /// The running aggregate, one ciphertext per layout position.
    pub fn aggregate(&self) -> &[Elem] {
        &self.aggregate
    }

    /// The noise plan of this study's release for `n_rows` (`None`: not revealed).
    pub fn noise_plan(&self, n_rows: Option<u64>) -> NoisePlan {
        self.spec.proxy_plan(n_rows, self.noise_free)
    }

    /// How many owners are counted so far.
    pub fn owners_counted(&self) -> usize {
        self.contributors.len()
    }

    /// Owners counted so far.
    pub fn owners_in(&self) -> Vec<String> {
        self.contributors.keys().cloned().collect()
    }

    /// Invited owners not counted (empty when the study invites any owner).
    pub fn owners_missing(&self) -> Vec<String> {
        self.missing().cloned().collect()
    }

    /// [`Study::owners_in`] as the status lists them: the first [`NAMES_LISTED`],
    /// and how many there are.
    pub fn owners_in_listed(&self) -> Listed {
        Listed::of(self.contributors.keys())
    }

    /// [`Study::owners_missing`] as the status lists them.
    pub fn owners_missing_listed(&self) -> Listed {
        Listed::of(self.missing())
    }

    fn missing(&self) -> impl Iterator<Item = &String> {
        self.spec
            .expected_owners
            .iter()
            .filter(|o| !self.contributors.contains_key(*o))
    }

    /// The encrypted pooled row count (last aggregate ciphertext).
    pub fn encrypted_count(&self) -> Option<Ciphertext> {
        self.aggregate.last().map(|c| Ciphertext(c.to_big()))
    }

    /// Checks whether an owner may contribute, before its stream is read.
    pub fn check_can_contribute(
        &self,
        owner: &str,
        contribution_id: &str,
    ) -> Result<Option<ContributionOutcome>, StudyError> {
        if !self.spec.invites(owner) {
            return Err(StudyError::NotInvited {
                study: self.id.clone(),
                owner: owner.to_string(),
            });
        }
        if let Some(existing) = self.contributors.get(owner) {
            return if existing == contribution_id {
                Ok(Some(ContributionOutcome::AlreadyCounted))
            } else {
                Err(StudyError::DuplicateOwner {
                    study: self.id.clone(),
                    owner: owner.to_string(),
                })
            };
        }
        if !matches!(self.phase, Phase::Collecting) {
            return Err(StudyError::Closed {
                study: self.id.clone(),
                phase: self.phase.name(),
                why: match &self.phase {
                    Phase::Aborted(reason) => format!(" ({reason})"),
                    _ => String::new(),
                },
            });
        }
        Ok(None)
    }

    /// Adds a complete, validated contribution. Seals the study when the quorum is
    /// reached. Nothing changes on error.
    pub fn contribute(
        &mut self,
        owner: &str,
        contribution_id: &str,
        cts: &[Elem],
        mul: impl Fn(&Elem, &Elem) -> Elem + Sync,
    ) -> Result<ContributionOutcome, StudyError> {
        if let Some(outcome) = self.check_can_contribute(owner, contribution_id)? {
            return Ok(outcome);
        }
        if cts.len() != self.aggregate.len() {
            return Err(StudyError::WrongCount {
                study: self.id.clone(),
                expected: self.aggregate.len(),
                got: cts.len(),
            });
        }
        let folded = if self.layout.baseline {
            // The paper's way runs on one thread.
            self.aggregate
                .iter()
                .zip(cts)
                .map(|(a, c)| mul(a, c))
                .collect()
        } else {
            // Positions are independent: one fold uses every core.
            self.aggregate
                .par_iter()
                .zip(cts.par_iter())
                .map(|(a, c)| mul(a, c))
                .collect()
        };
        self.aggregate = Arc::new(folded);
        Arc::make_mut(&mut self.contributors)
            .insert(owner.to_string(), contribution_id.to_string());
        if self.contributors.len() >= self.spec.quorum as usize {
            self.phase = Phase::Sealed;
        }
        Ok(ContributionOutcome::Counted)
    }

    /// Whether the deadline has passed at `now_ms` on a study still collecting:
    /// [`Study::tick`] would then seal or abort it.
    pub fn deadline_due(&self, now_ms: u64) -> bool {
        matches!(self.phase, Phase::Collecting) && now_ms >= self.spec.deadline_unix_ms
    }

    fn has_quorum(&self) -> bool {
        self.contributors.len() >= self.spec.min_owners as usize
    }

    /// What the deadline does at `now_ms`, if it is due: seal (`true`, with at
    /// least `min_owners`) or abort (`false`). One decision for [`Study::tick`]
    /// and the reads that say what it would leave.
    fn deadline_seals(&self, now_ms: u64) -> Option<bool> {
        self.deadline_due(now_ms).then(|| self.has_quorum())
    }

    /// The name of the phase [`Study::tick`] at `now_ms` would leave, read without
    /// a copy.
    pub fn phase_name_at(&self, now_ms: u64) -> &'static str {
        match self.deadline_seals(now_ms) {
            Some(true) => Phase::Sealed.name(),
            Some(false) => Phase::Aborted(String::new()).name(),
            None => self.phase.name(),
        }
    }

    /// Whether the study is collecting or sealed once its deadline is applied at
    /// `now_ms` (what [`Study::tick`] would leave), read without a copy.
    pub fn open_at(&self, now_ms: u64) -> bool {
        match self.phase {
            Phase::Collecting => self.deadline_seals(now_ms) != Some(false),
            Phase::Sealed => true,
            Phase::Released(_) | Phase::Aborted(_) => false,
        }
    }

    /// Applies the deadline: seal with at least `min_owners`, abort otherwise.
    pub fn tick(&mut self, now_ms: u64) {
        match self.deadline_seals(now_ms) {
            Some(true) => self.phase = Phase::Sealed,
            Some(false) => {
                let missing = self.owners_missing_listed();
                self.abort(format!(
                    "deadline passed with {} of at least {} owners{}",
                    self.contributors.len(),
                    self.spec.min_owners,
                    if missing.count == 0 {
                        String::new()
                    } else {
                        format!("; missing: {missing}")
                    }
                ));
            }
            None => {}
        }
    }

    /// Aborts the study for good, for `reason`. Nothing will be released: the
    /// exact sums of the owners in (one owner's own share, if one alone came)
    /// are kept neither here nor in the state file the abort is stored to.
    pub fn abort(&mut self, reason: String) {
        self.phase = Phase::Aborted(reason);
        self.aggregate = Arc::default();
    }

    /// Checks a request for the release and returns the N its noise is to be
    /// calibrated to. Under `mask` the noise scales with N, so N is taken only with
    /// an opening that verifies against the aggregate `E[N]` (the user's word alone
    /// could shrink the noise N-fold), and it must be plausible: one row per counted
    /// owner at least, max_rows at most. Under `dp-mean` nothing depends on N and
    /// an opening is refused, so N never leaves the user.
    pub fn check_release(&self, opening: Option<&Opening>) -> Result<Option<u64>, StudyError> {
        if !matches!(self.phase, Phase::Sealed) {
            return Err(StudyError::WrongPhase {
                study: self.id.clone(),
                phase: self.phase.name(),
                action: "releasing",
            });
        }
        let study = self.id.clone();
        let opening = match (self.spec.privacy.centering, opening) {
            (Centering::DpMean, None) => return Ok(None),
            (Centering::DpMean, Some(_)) => return Err(StudyError::CountNotNeeded { study }),
            (Centering::Mask, None) => return Err(StudyError::CountNeeded { study }),
            (Centering::Mask, Some(o)) => o,
        };
        let n = u64::try_from(&opening.plaintext).unwrap_or(u64::MAX);
        let proven = self
            .encrypted_count()
            .is_some_and(|c| self.spec.public_key.verify_opening(&c, opening));
        if !proven {
            return Err(StudyError::BadOpening { study, n });
        }
        let min = (self.contributors.len() as u64).max(1);
        if n < min || n > self.spec.max_rows {
            return Err(StudyError::ImplausibleCount {
                study,
                n,
                min,
                max: self.spec.max_rows,
            });
        }
        Ok(Some(n))
    }

    /// Sealed -> Released: checks the request, plans and samples the noise and mask
    /// once and computes the release. This is the only place noise is sampled.
    pub fn release<R: RngCore + CryptoRng>(
        &mut self,
        opening: Option<&Opening>,
        rng: &mut R,
    ) -> Result<(), StudyError> {
        let n_rows = self.check_release(opening)?;
        let released = self.compute_release(n_rows, OwnNoise::Drawn, rng)?;
        self.commit_release(released)
    }

    /// The release computation for the N [`Study::check_release`] returned, without
    /// changing state (callers run it off the async runtime, then commit with
    /// [`Study::commit_release`]).
    pub fn compute_release<R: RngCore + CryptoRng>(
        &self,
        n_rows: Option<u64>,
        own_noise: OwnNoise,
        rng: &mut R,
    ) -> Result<Released, StudyError> {
        let spec = &self.spec;
        let plan = match own_noise {
            OwnNoise::Drawn => self.noise_plan(n_rows),
            OwnNoise::SkippedForTesting => spec.proxy_plan(n_rows, true),
        };
        let err = |source| StudyError::Release {
            study: self.id.clone(),
            source,
        };
        if spec.privacy.centering == Centering::Mask && n_rows.is_none() {
            return Err(StudyError::CountNeeded {
                study: self.id.clone(),
            });
        }
        let secrets = ReleaseSecrets::sample(&self.layout, spec.privacy.centering, &plan, rng)
            .map_err(err)?;
        let table;
        let randomness = if self.layout.baseline {
            Randomness::Textbook(&spec.public_key)
        } else {
            table = Randomizer::new(
                &spec.public_key,
                Randomizer::window_for(self.layout.release_ciphertexts()),
                rng,
            );
            Randomness::FixedBase(&table)
        };
        // Converted once: the release's exponentiations take the aggregate as it is.
        let aggregate: Vec<Ciphertext> = self
            .aggregate
            .iter()
            .map(|c| Ciphertext(c.to_big()))
            .collect();
        let ciphertexts = release(
            &self.layout,
            spec.privacy.centering,
            &aggregate,
            n_rows.unwrap_or(0),
            &secrets,
            randomness,
            rng,
        )
        .map_err(err)?;
        Ok(Released {
            n_rows,
            plan,
            ciphertexts,
            owners: self.owners_in(),
        })
    }

    /// Commits a computed release if the study is still sealed (a concurrent request
    /// may have released it first: that release stands).
    pub fn commit_release(&mut self, released: Released) -> Result<(), StudyError> {
        if !matches!(self.phase, Phase::Sealed) {
            return Err(StudyError::WrongPhase {
                study: self.id.clone(),
                phase: self.phase.name(),
                action: "releasing",
            });
        }
        self.phase = Phase::Released(Arc::new(released));
        // The exact aggregate is not needed past the noised release: only E[N] is
        // kept (a user's retried AwaitSeal reads it), so whoever later holds the
        // state file and the user's key cannot read the exact R and v.
        let count = self.aggregate.last().cloned();
        self.aggregate = Arc::new(count.into_iter().collect());
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
    use dpca_common::encoding::FixedPoint;
    use dpca_common::paillier::SecretKey;
    use dpca_common::study::SpecDraft;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    pub(crate) fn key() -> &'static SecretKey {
        dpca_common::testing::test_key()
    }

    pub(crate) fn study(quorum: u32, min_owners: u32) -> Study {
        study_with(Centering::Mask, quorum, min_owners)
    }

    pub(crate) fn study_with(centering: Centering, quorum: u32, min_owners: u32) -> Study {
        let spec = SpecDraft {
            features: vec!["a".into(), "b".into()],
            bounds: vec![(0.0, 1.0); 2],
            fixed: FixedPoint {
                frac_bits: 10,
                row_norm_bound: 1.0,
            },
            max_rows: 100,
            privacy: PrivacyRequest::new(Mechanism::GAUSSIAN, centering, 1.0, 1e-5).expect("ok"),
            min_owners,
            quorum,
            deadline_unix_ms: 1_000,
            ..dpca_common::testing::test_draft(key().public(), 2)
        }
        .validate()
        .expect("the test study's spec");
        let layout = StudyLayout::new(&spec).expect("layout");
        Study::new("s1".into(), spec, layout, false)
    }

    /// Ciphertext "multiplication" as integer addition, so aggregates are countable.
    fn fake_cts(study: &Study, value: u64) -> Vec<Elem> {
        let v = key().public().ring().elem(&BigUint::from(value));
        vec![v; study.layout.owner_ciphertexts()]
    }
    fn add(a: &Elem, b: &Elem) -> Elem {
        key().public().ring().elem(&(a.to_big() + b.to_big()))
    }

    #[derive(Clone, Debug)]
    enum Event {
        Submit(u8, u8),
        Tick(u64),
    }

    proptest! {
        /// Over any sequence of submissions, retries, duplicates and deadline ticks:
        /// each owner is counted at most once, the aggregate is exactly the sum of the
        /// counted contributions, and nothing is counted after the study closes.
        #[test]
        fn each_owner_counted_at_most_once(events in proptest::collection::vec(
            prop_oneof![
                (0u8..5, 0u8..2).prop_map(|(o, c)| Event::Submit(o, c)),
                (0u64..2_000).prop_map(Event::Tick),
            ], 1..40))
        {
            let mut s = study(4, 2);
            let mut counted: BTreeMap<String, u8> = BTreeMap::new();
            for e in events {
                let before = s.phase.name();
                match e {
                    Event::Submit(o, c) => {
                        let owner = format!("o{o}");
                        let value = 1 + 10 * o as u64 + c as u64;
                        let res = s.contribute(&owner, &format!("c{c}"), &fake_cts(&s, value), add);
                        match (&res, counted.get(&owner)) {
                            (Ok(ContributionOutcome::Counted), None) => {
                                prop_assert_eq!(before, "collecting");
                                counted.insert(owner, c);
                            }
                            (Ok(ContributionOutcome::AlreadyCounted), Some(&prev)) => prop_assert_eq!(prev, c),
                            (Err(StudyError::DuplicateOwner { .. }), Some(&prev)) => prop_assert_ne!(prev, c),
                            (Err(StudyError::Closed { .. }), None) => prop_assert_ne!(before, "collecting"),
                            other => prop_assert!(false, "unexpected {:?}", other),
                        }
                    }
                    Event::Tick(t) => s.tick(t),
                }
                let expected: u64 = 1 + counted.iter().map(|(o, &c)| {
                    1 + 10 * o[1..].parse::<u64>().unwrap_or(0) + c as u64
                }).sum::<u64>();
                match &s.phase {
                    Phase::Aborted(_) => prop_assert!(s.aggregate.is_empty(), "an aborted study's sums kept"),
                    _ => prop_assert_eq!(s.aggregate[0].to_big(), BigUint::from(expected)),
                }
                prop_assert!(s.owners_in().len() <= 4);
                if s.owners_in().len() == 4 { prop_assert_eq!(s.phase.name(), "sealed"); }
            }
        }
    }

    /// `open_at` says, without applying the deadline, what `tick` leaves.
    #[test]
    fn deadline_seals_with_minimum_or_aborts() {
        let mut s = study(5, 2);
        s.contribute("a", "1", &fake_cts(&s, 1), add)
            .expect("counted");
        assert!(s.open_at(999) && !s.open_at(1_000), "one of two owners");
        s.tick(999);
        assert_eq!(s.phase.name(), "collecting");
        s.tick(1_000);
        assert_eq!(s.phase.name(), "aborted");
        assert!(!s.open_at(0));
        // `a`'s share alone, which nothing will release, is not kept.
        assert!(s.aggregate.is_empty(), "the one owner's ciphertexts kept");

        let mut s = study(5, 2);
        s.contribute("a", "1", &fake_cts(&s, 1), add)
            .expect("counted");
        s.contribute("b", "1", &fake_cts(&s, 1), add)
            .expect("counted");
        assert!(
            s.open_at(1_000),
            "two of two owners: sealed at the deadline"
        );
        s.tick(1_000);
        assert_eq!(s.phase.name(), "sealed");
        assert!(s.open_at(u64::MAX));
        let late = s.contribute("c", "1", &fake_cts(&s, 1), add);
        assert!(matches!(late, Err(StudyError::Closed { .. })));
    }

    /// A study with an invitation list counts no one else, whatever it sends;
    /// an invited owner is counted.
    #[test]
    fn an_owner_not_invited_is_refused_and_nothing_counted() {
        let mut s = study(1, 1);
        let mut draft = s.spec.to_draft();
        draft.expected_owners = vec!["a".into()];
        s.spec = draft.validate().expect("a spec inviting a");
        assert!(matches!(
            s.check_can_contribute("b", "1"),
            Err(StudyError::NotInvited { .. })
        ));
        let res = s.contribute("b", "1", &fake_cts(&s, 3), add);
        assert!(matches!(res, Err(StudyError::NotInvited { .. })), "{res:?}");
        assert!(s.owners_in().is_empty());
        s.contribute("a", "1", &fake_cts(&s, 3), add)
            .expect("an invited owner");
        assert_eq!(s.owners_in(), ["a"]);
    }

    #[test]
    fn wrong_count_changes_nothing() {
        let mut s = study(2, 1);
        let res = s.contribute("a", "1", &fake_cts(&s, 3)[..1], add);
        assert!(matches!(res, Err(StudyError::WrongCount { .. })));
        assert!(s.owners_in().is_empty());
        assert_eq!(s.aggregate[0].to_big(), BigUint::one());
    }

    /// A transition tried on a copy leaves the original as it was, and copies
    /// that were not changed share the owners' map instead of each holding one
    /// (the view and the store's copy of every contribution).
    #[test]
    fn copies_share_the_owners_until_one_changes() {
        let mut s = study(3, 1);
        s.contribute("a", "1", &fake_cts(&s, 1), add)
            .expect("counted");
        let (mut next, view) = (s.clone(), s.clone());
        assert!(Arc::ptr_eq(&s.contributors, &view.contributors));
        next.contribute("b", "1", &fake_cts(&next, 1), add)
            .expect("counted");
        assert_eq!(next.owners_in(), ["a", "b"]);
        assert_eq!(s.owners_in(), ["a"], "the original was changed");
        assert_eq!(view.owners_in(), ["a"], "the view was changed");
        assert!(!Arc::ptr_eq(&s.contributors, &next.contributors));
    }

    /// Every owner's ciphertexts encrypt `value`, so N is owners x value.
    fn contribute_value(s: &mut Study, owner: &str, value: u32, rng: &mut ChaCha20Rng) {
        let pk = key().public().clone();
        let cts: Vec<Elem> = (0..s.layout.owner_ciphertexts())
            .map(|_| {
                pk.ring()
                    .elem(&pk.encrypt(&BigUint::from(value), rng).expect("enc").0)
            })
            .collect();
        s.contribute(owner, "1", &cts, |x, y| pk.ring().mul_elem(x, y))
            .expect("counted");
    }

    fn opening(s: &Study) -> Opening {
        key()
            .open(&s.encrypted_count().expect("aggregate"))
            .expect("open")
    }

    #[test]
    fn a_mask_release_needs_a_proven_plausible_count_and_happens_once() {
        let mut s = study(2, 1);
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        assert!(matches!(
            s.release(None, &mut rng),
            Err(StudyError::WrongPhase { .. })
        ));
        contribute_value(&mut s, "a", 1, &mut rng);
        contribute_value(&mut s, "b", 1, &mut rng);
        assert_eq!(s.phase.name(), "sealed");
        let honest = opening(&s);
        assert_eq!(honest.plaintext, BigUint::from(2u32));
        assert!(matches!(
            s.release(None, &mut rng),
            Err(StudyError::CountNeeded { .. })
        ));
        // A user that claims fewer rows, with or without a made-up root, is refused:
        // its word alone would shrink the noise.
        for lie in [
            Opening {
                plaintext: BigUint::from(1u32),
                root: honest.root.clone(),
            },
            Opening {
                plaintext: BigUint::from(3u32),
                root: BigUint::from(12345u32),
            },
        ] {
            assert!(matches!(
                s.release(Some(&lie), &mut rng),
                Err(StudyError::BadOpening { .. })
            ));
            assert_eq!(s.phase.name(), "sealed");
        }
        let count = s.encrypted_count();
        s.release(Some(&honest), &mut rng).expect("release");
        // The exact aggregate is gone; E[N] stays for a retried AwaitSeal.
        assert_eq!(s.aggregate().len(), 1);
        assert_eq!(s.encrypted_count(), count);
        let first = match &s.phase {
            Phase::Released(r) => {
                assert_eq!(r.n_rows, Some(2));
                r.ciphertexts.clone()
            }
            _ => Vec::new(),
        };
        assert!(!first.is_empty());
        // A second request is refused and the release is unchanged.
        assert!(matches!(
            s.release(Some(&honest), &mut rng),
            Err(StudyError::WrongPhase { .. })
        ));
        match &s.phase {
            Phase::Released(r) => assert_eq!(r.ciphertexts, first),
            other => panic!("phase {}", other.name()),
        }
    }

    #[test]
    fn a_proven_count_must_still_be_plausible() {
        // Owners who encrypt 60 rows each make N = 120 > max_rows = 100.
        let mut s = study(2, 1);
        let mut rng = ChaCha20Rng::seed_from_u64(10);
        contribute_value(&mut s, "a", 60, &mut rng);
        contribute_value(&mut s, "b", 60, &mut rng);
        let proven = opening(&s);
        assert!(matches!(
            s.release(Some(&proven), &mut rng),
            Err(StudyError::ImplausibleCount { n: 120, .. })
        ));
    }

    #[test]
    fn a_dp_mean_release_takes_no_count() {
        let mut s = study_with(Centering::DpMean, 1, 1);
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        contribute_value(&mut s, "a", 3, &mut rng);
        let offered = opening(&s);
        assert!(matches!(
            s.release(Some(&offered), &mut rng),
            Err(StudyError::CountNotNeeded { .. })
        ));
        s.release(None, &mut rng).expect("release");
        match &s.phase {
            Phase::Released(r) => assert_eq!(r.n_rows, None),
            other => panic!("phase {}", other.name()),
        }
        // The plan it used cannot have read N: it is the plan for any N.
        assert_eq!(
            format!("{:?}", s.noise_plan(None)),
            format!("{:?}", s.noise_plan(Some(s.spec.max_rows)))
        );
    }
}
