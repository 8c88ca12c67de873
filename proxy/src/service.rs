//! The gRPC shell around the study state machine: each handler validates at the
//! edge, loads the study, applies one transition and replies.

mod holding;

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dpca_common::arith::Elem;
use dpca_common::dp::Centering;
use dpca_common::owner_budget::{charge, OwnerBudget};
use dpca_common::paillier::{Opening, PublicKey};
use dpca_common::study::{check_no_terminal_controls, StudyLayout, LAYOUT_VERSION, MAX_ID_BYTES};
use dpca_proto::convert::{spec_from_wire, spec_to_wire, CIPHERTEXTS_PER_CHUNK};
use dpca_proto::v1;
use dpca_shell::signed_count;
use dpca_shell::signed_count::signing_identity;
use rand::RngCore;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use dpca_shell::tls::{Peer, Transport};

use crate::access::{permit, Action};
use crate::cell::{Locked, StudyCell};
use crate::limits::HeldStudy;
use crate::per_key::{Held, PerKey};
use crate::refusal::Refusal;
use crate::release_journal::ReleaseJournal;
use crate::store::{signed_count_to_wire, Announced, Loaded, Store, StoreError, Ticket};
use crate::study::{ContributionOutcome, Phase, Released, SignedCount, Study};
use crate::upload_slots::{Slot, SlotError, UploadSlots};
use crate::ProxyConfig;

/// How often deadlines are checked and how often a waiting user re-checks.
const POLL: Duration = Duration::from_millis(50);

/// One study, locked on its own, with its view (`crate::cell`).
type SharedStudy = Arc<StudyCell>;

/// What a contribution's answer reports: counted or a retry, the owners counted
/// now, and the owner's budget.
type FoldOutcome = (ContributionOutcome, usize, Option<OwnerBudget>);

/// A study just put in the table under its lock, and the ended studies taken out
/// for it ([`ProxyService::reserve`]).
struct Reserved {
    opened: Locked,
    dropped: Vec<(SharedStudy, Locked)>,
}

/// A study as the limits on what a user holds see it, its deadline applied at
/// `now_ms`.
fn held_study(s: &Study, now_ms: u64) -> HeldStudy {
    HeldStudy {
        id: s.id.clone(),
        opened_by: s.opened_by.clone(),
        open: s.open_at(now_ms),
        deadline_unix_ms: s.spec.deadline_unix_ms,
    }
}

/// The proxy's gRPC service.
#[derive(Clone)]
pub struct ProxyService {
    config: ProxyConfig,
    /// Study id -> study. The table's lock is held only to find or insert a study.
    studies: Arc<Mutex<HashMap<String, SharedStudy>>>,
    /// At most `max_concurrent_uploads` contributions are read at once; an
    /// upload that finds none free within `upload_slots::PATIENCE` is refused, and
    /// its owner reserves one.
    uploads: UploadSlots,
    /// Owners with an upload in progress: one slot per owner, so no certificate
    /// holder can take every slot.
    uploading: PerKey<String>,
    /// Studies whose release is being computed: one computation per study at a
    /// time. Held by the task that checks, computes and stores it, not by the
    /// call: a caller that drops its call stops none of that work.
    releasing: PerKey<String>,
    store: Option<Arc<Store>>,
    /// Owner id -> privacy budget. Locked after `studies` when both are held.
    budgets: Arc<Mutex<HashMap<String, OwnerBudget>>>,
    /// Studies this proxy's settings aborted at startup ([`not_served_here`]),
    /// never stored so: a proxy restarted with other settings serves them again.
    held_back: Arc<HashSet<String>>,
    /// Study id -> why this build cannot read its stored record: kept as stored
    /// (a build that reads it serves it again), and refused by name meanwhile.
    unreadable: Arc<HashMap<String, String>>,
    /// Every study released, kept with the state file (none without one): a
    /// study it names is never released again.
    journal: Option<Arc<ReleaseJournal>>,
    /// The studies whose mask seeds this proxy holds for another
    /// ([`crate::holder`]).
    held: holding::HeldTable,
}

/// The studies a proxy restores from its state file at startup.
#[derive(Default)]
struct Restored {
    studies: HashMap<String, SharedStudy>,
    /// Those this proxy's settings abort ([`not_served_here`]).
    held_back: HashSet<String>,
    /// Study id -> why this build cannot read its record.
    unreadable: HashMap<String, String>,
    /// Those the journal names as released though the file holds them
    /// unreleased: aborted, to be stored so.
    released_before: Vec<Study>,
}

impl Restored {
    /// What `loaded` restores under `config`: each study ticked to now, aborted
    /// unstored if this proxy does not serve it or `journal` says it was
    /// released though the state file holds it unreleased, and each record it
    /// cannot read named in the log, kept as stored and not served. A release
    /// the journal misses (stored by a build before it) is journaled.
    fn from(
        loaded: Loaded,
        config: &ProxyConfig,
        journal: &ReleaseJournal,
    ) -> Result<Self, StoreError> {
        let mut restored = Self::default();
        for mut study in loaded.studies {
            study.tick(config.clock.now_ms());
            if matches!(study.phase, Phase::Released(_)) {
                journal.record(&study.id)?;
            }
            if let Some(reason) = released_before(&study, journal) {
                // For good (the journal is never put back): stored so, its sums
                // and any contribution stored one by one dropped from the file.
                study.abort(reason);
                restored.released_before.push(study.clone());
            } else if let Some(reason) = not_served_here(&study, config) {
                study.phase = Phase::Aborted(reason);
                restored.held_back.insert(study.id.clone());
            }
            tracing::info!(
                study = %study.id,
                phase = study.phase.name(),
                owners_in = study.owners_in().len(),
                "study restored"
            );
            restored
                .studies
                .insert(study.id.clone(), StudyCell::new(study));
        }
        for (id, reason) in loaded.unreadable {
            tracing::error!(
                study = %id,
                %reason,
                "study record unreadable by this build: kept as stored, not served"
            );
            restored.unreadable.insert(id, reason);
        }
        Ok(restored)
    }
}

/// The release journal of the state file `store` (at `path`), checked against
/// the name the file records, which is then the journal's.
fn open_journal(
    store: &Store,
    path: &std::path::Path,
    config: &ProxyConfig,
) -> Result<ReleaseJournal, StoreError> {
    let at = config
        .release_journal
        .clone()
        .unwrap_or_else(|| crate::release_journal::beside(path));
    let recorded = store.release_journal()?;
    // Not the injected entropy: a name is no draw a test replays.
    let mut fresh = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut fresh);
    let expected = crate::release_journal::Expected {
        name: recorded.as_deref(),
        replace: config.replace_release_journal.as_deref(),
        fresh_name: hex::encode(fresh),
    };
    let journal = ReleaseJournal::open(&at, expected)?;
    // Not on a state file's first start (a throwaway one's, as `user local`
    // runs): a file served before is one a backup may hold.
    if recorded.is_some() {
        warn_if_beside(&at, path);
    }
    match recorded.as_deref() {
        Some(was) if was == journal.name() => {}
        Some(was) => {
            store.set_release_journal(journal.name())?;
            tracing::warn!(journal = %at.display(), name = journal.name(), was, "the state file is now served with this release journal, in place of the one it was");
        }
        None => {
            store.set_release_journal(journal.name())?;
            tracing::info!(journal = %at.display(), name = journal.name(), "release journal");
        }
    }
    Ok(journal)
}

/// Warns if the release journal at `journal` is on the filesystem of the state
/// file at `state`: a snapshot of that filesystem put back whole puts the
/// journal back with the state, and a study released since could be released
/// again.
fn warn_if_beside(journal: &std::path::Path, state: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let device = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if device(journal).is_some() && device(journal) == device(state) {
        tracing::warn!(
            journal = %journal.display(),
            "the release journal is on the state file's filesystem: a snapshot of it put back whole would put the journal back too; put it elsewhere with --release-journal (docs/DEPLOYING.md)"
        );
    }
}

/// Why a study the journal names as released, but the state file holds
/// unreleased, is not served: the file was put back from a copy taken before the
/// release, and a second release would draw the noise on the same sums again.
fn released_before(study: &Study, journal: &ReleaseJournal) -> Option<String> {
    let unreleased = !matches!(study.phase, Phase::Released(_) | Phase::Aborted(_));
    (unreleased && journal.holds(&study.id)).then(|| {
        format!(
            "released before (release journal {}), but the state file holds it {}: \
             it was put back from an older copy. Not released again: a second \
             release would draw the noise on the same sums again; open a new study",
            journal.path().display(),
            study.phase.name()
        )
    })
}

/// Why this proxy does not serve a restored study, if it does not: one opened
/// noise-free by a proxy in test mode (its release, if any, holds no noise), or
/// one stored under larger limits than this proxy's.
fn not_served_here(study: &Study, config: &ProxyConfig) -> Option<String> {
    if study.noise_free && !config.allow_noise_free_for_testing {
        return Some("opened noise-free in test mode; this proxy is not in test mode".into());
    }
    config
        .limits
        .check_layout(study.layout.size())
        .err()
        .map(|e| e.to_string())
}

impl ProxyService {
    /// A service holding the studies of `config.state` (none without a state file).
    pub fn new(config: ProxyConfig) -> Result<Self, StoreError> {
        let (store, budgets, restored, journal) = match &config.state {
            Some(path) => {
                let store = Store::open(path)?;
                let budgets = store.load_budgets()?;
                let journal = open_journal(&store, path, &config)?;
                let restored = Restored::from(store.load_readable()?, &config, &journal)?;
                for study in &restored.released_before {
                    store.save_study(study)?;
                }
                (
                    Some(Arc::new(store)),
                    budgets,
                    restored,
                    Some(Arc::new(journal)),
                )
            }
            None => (None, HashMap::new(), Restored::default(), None),
        };
        let held = match &store {
            Some(store) => holding::load_held(store)?,
            None => holding::HeldTable::default(),
        };
        Ok(Self {
            held,
            uploads: UploadSlots::new(config.max_concurrent_uploads, crate::upload_slots::LEASE),
            config,
            studies: Arc::new(Mutex::new(restored.studies)),
            uploading: PerKey::default(),
            releasing: PerKey::default(),
            store,
            budgets: Arc::new(Mutex::new(budgets)),
            held_back: Arc::new(restored.held_back),
            unreadable: Arc::new(restored.unreadable),
            journal,
        })
    }

    fn lock_budgets(&self) -> Result<MutexGuard<'_, HashMap<String, OwnerBudget>>, Refusal> {
        self.budgets
            .lock()
            .map_err(|_| Refusal::Internal("budget table poisoned".into()))
    }

    fn budget_of(&self, owner: &str) -> Result<Option<OwnerBudget>, Refusal> {
        Ok(self.lock_budgets()?.get(owner).cloned())
    }

    /// Counts a read and validated contribution and charges the owner's budget:
    /// both on a copy, queued for the state file in one write, then made current.
    /// The answer waits, with no lock held, until that write (or, for a retry,
    /// every write before it) is on disk, so contributions arriving meanwhile are
    /// folded and share the next commit. Runs on a blocking thread.
    async fn commit_contribution(
        &self,
        upload: Upload,
        cts: Vec<Elem>,
        announced: Option<Announced>,
    ) -> Result<FoldOutcome, Refusal> {
        let guard = self.lock_study(&upload.study_id).await?;
        let svc = self.clone();
        blocking(move || {
            let (out, ticket, folded) = svc.fold(guard, &upload, cts, announced)?;
            if out.0 == ContributionOutcome::Counted {
                crate::metrics::fold(folded);
            }
            svc.await_stored(&upload.study_id, ticket)?;
            Ok(out)
        })
        .await
    }

    /// The fold under the study's lock (and the charge under the budgets' lock):
    /// the outcome, the ticket of the queued write, and the time the fold took.
    fn fold(
        &self,
        mut study: Locked,
        up: &Upload,
        cts: Vec<Elem>,
        announced: Option<Announced>,
    ) -> Result<(FoldOutcome, Option<Ticket>, std::time::Duration), Refusal> {
        study.tick(self.config.clock.now_ms());
        let mut next = study.clone();
        let pk = next.spec.public_key.clone();
        let started = std::time::Instant::now();
        let outcome = next.contribute(&up.owner, &up.cid, &cts, |a, b| pk.ring().mul_elem(a, b))?;
        let folded = started.elapsed();
        let mut budgets = self.lock_budgets()?;
        let charged = match outcome {
            ContributionOutcome::Counted => {
                let cost = (next.spec.privacy.epsilon, next.spec.privacy.delta);
                Some(
                    charge(
                        &up.owner,
                        budgets.get(&up.owner),
                        up.cap,
                        &up.study_id,
                        cost,
                    )
                    .map_err(Refusal::from)?,
                )
            }
            ContributionOutcome::AlreadyCounted => None,
        };
        if let (ContributionOutcome::Counted, Some(count)) = (outcome, &up.count) {
            next.keep_signed_count(&up.owner, count.clone())
                .map_err(Refusal::Internal)?;
        }
        let ticket = match outcome {
            // Submitted under both locks: the file sees the transitions in the
            // order memory does.
            ContributionOutcome::Counted => {
                self.submit_contribution(announced, &next, &up.owner, cts, charged.as_ref())?
            }
            ContributionOutcome::AlreadyCounted => None,
        };
        let owners_in = next.owners_in().len();
        study.set(next);
        if let Some(b) = charged {
            budgets.insert(up.owner.clone(), b);
        }
        let budget = budgets.get(&up.owner).cloned();
        Ok(((outcome, owners_in, budget), ticket, folded))
    }

    /// Queues a counted contribution with its owner's charged budget, to be
    /// written in one transaction.
    fn submit_contribution(
        &self,
        announced: Option<Announced>,
        study: &Study,
        owner: &str,
        cts: Vec<Elem>,
        budget: Option<&OwnerBudget>,
    ) -> Result<Option<Ticket>, Refusal> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        store
            .submit_contribution(
                announced,
                study.clone(),
                owner.to_string(),
                cts,
                budget.cloned(),
            )
            .map(Some)
            .map_err(|e| not_stored(&study.id, e))
    }

    /// Waits until the ticket's write is on disk; without a ticket (a retry
    /// answered "already counted"), until every write before now is, so the
    /// answer never speaks of a contribution the file may still lose.
    fn await_stored(&self, study_id: &str, ticket: Option<Ticket>) -> Result<(), Refusal> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        match ticket {
            Some(t) => store.wait(t),
            None => store.barrier(),
        }
        .map_err(|e| not_stored(study_id, e))
    }

    /// Writes a study's record; an error means the transition did not happen.
    fn persist(&self, study: &Study) -> Result<(), Refusal> {
        match &self.store {
            Some(store) => store
                .save_study(study)
                .map_err(|e| not_stored(&study.id, e)),
            None => Ok(()),
        }
    }

    /// Applies a transition to a copy of the study, stores the copy, and only then
    /// makes it the study: what the caller is told has happened is on disk. Runs on
    /// a blocking thread: the copy and the write grow with the study.
    async fn update_study<T: Send + 'static>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Study) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        let mut study = self.lock_study(id).await?;
        let svc = self.clone();
        blocking(move || {
            study.tick(svc.config.clock.now_ms());
            let mut next = study.clone();
            let out = f(&mut next)?;
            svc.persist(&next)?;
            study.set(next);
            Ok(out)
        })
        .await
    }

    /// Checks study `id`'s release against the user's `count` opening, computes
    /// it and stores it (before it can be served: a restart serves this release
    /// again).
    async fn check_compute_and_store(
        &self,
        id: &str,
        count: Option<v1::CountOpening>,
    ) -> Result<(), Refusal> {
        // Checked on a copy, off the lock of all studies: the opening costs a full
        // exponentiation, and `commit_release` re-checks the phase under the lock.
        let snapshot = self.with_study(id, |s| Ok(s.clone())).await?;
        let opening = count
            .as_ref()
            .map(|o| opening_from_wire(&snapshot.spec.public_key, o))
            .transpose()?;
        let (snapshot, n_rows) = blocking(move || {
            let n_rows = snapshot.check_release(opening.as_ref())?;
            Ok((snapshot, n_rows))
        })
        .await?;
        self.check_not_journaled(id)?;
        let started = std::time::Instant::now();
        let released = self.compute_release(snapshot, n_rows).await?;
        self.journal_release(id).await?;
        self.update_study(id, move |s| Ok(s.commit_release(released)?))
            .await?;
        let seconds = started.elapsed().as_secs_f64();
        crate::metrics::release(seconds);
        tracing::info!(study = %id, seconds, "release computed");
        Ok(())
    }

    /// Refuses the release of study `id` if the journal holds it: released
    /// before (or journaled for a release a crash kept from the state file).
    fn check_not_journaled(&self, id: &str) -> Result<(), Refusal> {
        match &self.journal {
            Some(j) if j.holds(id) => Err(Refusal::WrongPhase(format!(
                "study {id} was released before (release journal {}): not released again",
                j.path().display()
            ))),
            _ => Ok(()),
        }
    }

    /// Journals the release of study `id`, synced, before it is stored: from
    /// then on no state file, however old, has it released again.
    async fn journal_release(&self, id: &str) -> Result<(), Refusal> {
        let Some(journal) = self.journal.clone() else {
            return Ok(());
        };
        let id = id.to_string();
        blocking(move || {
            journal
                .record(&id)
                .map_err(|e| Refusal::Internal(format!("study {id} not released: {e}")))
        })
        .await
    }

    /// The release of `snapshot` (checked for release) with `n_rows`, computed
    /// off the runtime: on every core, or on one for the baseline, the paper's
    /// way.
    async fn compute_release(
        &self,
        snapshot: Study,
        n_rows: Option<u64>,
    ) -> Result<crate::study::Released, Refusal> {
        let entropy = std::sync::Arc::clone(&self.config.entropy);
        let own_noise = if self.config.test_skips_noise {
            crate::study::OwnNoise::SkippedForTesting
        } else {
            crate::study::OwnNoise::Drawn
        };
        blocking(move || {
            let mut rng = entropy.rng();
            let baseline = snapshot.layout.baseline;
            let mut compute = move || snapshot.compute_release(n_rows, own_noise, &mut rng);
            let released = if baseline {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .map_err(|e| Refusal::Internal(format!("thread pool: {e}")))?
                    .install(compute)
            } else {
                compute()
            };
            released.map_err(Refusal::from)
        })
        .await
    }

    fn table(&self) -> Result<MutexGuard<'_, HashMap<String, SharedStudy>>, Refusal> {
        self.studies
            .lock()
            .map_err(|_| Refusal::Internal("study table poisoned".into()))
    }

    /// Counts the studies open now (collecting or sealed, read off their views)
    /// and, within the limits, puts `study` among them, all under the table's
    /// lock: opens sent at once cannot all pass one count. Returns it under its
    /// lock, which the caller holds until its record is stored (and removes it
    /// again if it cannot be), with the opener's ended studies past those it may
    /// keep, taken out of the table and held under their locks for the caller to
    /// drop from the store (one busy now, or still holding contributions stored
    /// one by one, is left for the opener's next study).
    fn reserve(&self, study: &Study) -> Result<Reserved, Refusal> {
        let now = self.config.clock.now_ms();
        let mut table = self.table()?;
        // A new study never takes an id held, or kept for a record set aside
        // (its rows would join the new study's at the next restart).
        if table.contains_key(&study.id) || self.unreadable.contains_key(&study.id) {
            return Err(Refusal::Internal(format!(
                "study id `{}` is taken; open the study again",
                study.id
            )));
        }
        let held: Vec<HeldStudy> = table
            .values()
            .map(|cell| cell.peek(|s| held_study(s, now)))
            .collect();
        let (limits, user) = (&self.config.limits, study.opened_by.as_deref());
        limits
            .check_open(&held, user)
            .map_err(|e| Refusal::OverLimit(e.to_string()))?;
        let cell = StudyCell::new(study.clone());
        let opened = cell
            .try_lock()
            .ok_or_else(|| Refusal::Internal("a new study's cell is held".into()))?;
        let dropped = self.take_ended(&mut table, &held, user, now);
        table.insert(study.id.clone(), cell);
        Ok(Reserved { opened, dropped })
    }

    /// Takes out of `table` the ended studies of `user` past those it may keep,
    /// each under its lock and ended as the locked study shows it: the view they
    /// were chosen by may be a moment old (a fold may since have counted the owner
    /// that makes its quorum). One busy now, or whose contributions stored one by
    /// one are not yet in its stored aggregate, is left for the user's next open.
    fn take_ended(
        &self,
        table: &mut HashMap<String, SharedStudy>,
        held: &[HeldStudy],
        user: Option<&str>,
        now_ms: u64,
    ) -> Vec<(SharedStudy, Locked)> {
        let mut taken = Vec::new();
        for id in self.config.limits.ended_to_drop(held, user) {
            let Some(cell) = table.get(&id).cloned() else {
                continue;
            };
            let Some(mut s) = cell.try_lock() else {
                continue;
            };
            s.tick(now_ms);
            if s.open_at(now_ms) || self.holds_pending(&s) {
                continue;
            }
            table.remove(&id);
            taken.push((cell, s));
        }
        taken
    }

    /// Deletes the studies `reserve` took out of the table for study `opening`
    /// from the state file, durably once the new study's record is.
    fn forget(&self, opening: &str, dropped: &[(SharedStudy, Locked)]) -> Result<(), Refusal> {
        let (Some(store), false) = (&self.store, dropped.is_empty()) else {
            return Ok(());
        };
        for (_, s) in dropped {
            tracing::info!(study = %s.id, phase = s.phase.name(), "ended study dropped: its user opened another past those it may keep");
        }
        store
            .drop_studies(dropped.iter().map(|(_, s)| s.id.clone()).collect())
            .map_err(|e| not_stored(opening, e))
    }

    /// Every study, to visit one at a time (the table is not held meanwhile).
    fn all_studies(&self) -> Result<Vec<SharedStudy>, Refusal> {
        Ok(self.table()?.values().cloned().collect())
    }

    async fn lock_study(&self, id: &str) -> Result<Locked, Refusal> {
        Ok(self.cell(id)?.lock().await)
    }

    /// Study `id`'s cell, found under the table's lock.
    fn cell(&self, id: &str) -> Result<SharedStudy, Refusal> {
        if let Some(cell) = self.table()?.get(id) {
            return Ok(Arc::clone(cell));
        }
        Err(match self.unreadable.get(id) {
            Some(reason) => Refusal::Unavailable(format!(
                "study `{id}`: this proxy cannot read its stored record ({reason}); the record \
                 is kept as it is, for a build that reads it"
            )),
            None => Refusal::UnknownStudy(id.to_string()),
        })
    }

    /// Applies deadlines in the background. A study busy with a fold or a release
    /// is left for the next round (every call ticks the study it uses anyway).
    pub fn spawn_deadline_ticker(&self) {
        let svc = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(POLL).await;
                let Ok(all) = svc.all_studies() else {
                    return;
                };
                let now = svc.config.clock.now_ms();
                let mut phases = Vec::with_capacity(all.len());
                let mut closed = Vec::new();
                for shared in all {
                    if let Some(mut s) = shared.try_lock() {
                        s.tick(now);
                        phases.push(s.phase.name());
                        if svc.transition_unstored(&s, now) {
                            closed.push(s.id.clone());
                        }
                    }
                }
                let unreadable =
                    std::iter::repeat_n(crate::status::UNREADABLE, svc.unreadable.len());
                crate::metrics::phases(phases.into_iter().chain(unreadable));
                // A stopped store writes nothing until a restart.
                if svc.store.as_ref().is_some_and(|st| st.stopped()) {
                    continue;
                }
                for id in closed {
                    svc.store_deadline_transition(&id).await;
                }
            }
        });
    }

    /// Whether `s` has left collecting by its deadline (passed at `now_ms`) while
    /// the state file still says it collects, or holds some of its contributions
    /// one by one: a deadline's seal or abort is made in memory and not stored by
    /// itself. (An
    /// abort decided at startup, of a noise-free study on a proxy out of test mode
    /// or of one past lowered limits, is not the deadline's: it stays unstored, so
    /// a restart as before serves the study again.)
    fn transition_unstored(&self, s: &Study, now_ms: u64) -> bool {
        if self.held_back.contains(&s.id) {
            return false;
        }
        let by_deadline = s.spec.deadline_unix_ms <= now_ms;
        self.holds_pending(s)
            || by_deadline
                && !matches!(s.phase, Phase::Collecting)
                && self
                    .store
                    .as_ref()
                    .is_some_and(|st| st.stored_collecting(&s.id))
    }

    /// Whether `s` has left collecting while the state file still holds some of
    /// its contributions one by one.
    fn holds_pending(&self, s: &Study) -> bool {
        !matches!(s.phase, Phase::Collecting)
            && self.store.as_ref().is_some_and(|st| st.has_pending(&s.id))
    }

    /// Stores a study that its deadline sealed or aborted: a restart whose clock
    /// reads before the deadline (a clock stepped back, a machine moved) would
    /// otherwise reopen it, after the user was told it sealed, and count more
    /// owners; and its contributions kept one by one are multiplied into the
    /// stored aggregate and deleted, so no single owner's ciphertexts stay in the
    /// file of a study nobody will finish.
    async fn store_deadline_transition(&self, id: &str) {
        if let Err(e) = self.update_study(id, |_| Ok(())).await {
            tracing::warn!(study = %id, error = %Status::from(e).message(), "deadline transition not stored");
        }
    }

    /// Takes this owner's upload slot (none on plaintext), released when the
    /// returned guard is dropped: one upload per owner at a time.
    fn owner_slot(&self, owner: Option<&str>) -> Result<Option<Held<String>>, Refusal> {
        let Some(name) = owner else {
            return Ok(None);
        };
        self.uploading
            .take(name.to_string(), 1)
            .map(Some)
            .ok_or_else(|| {
                // Unavailable, which owners retry: the earlier upload may be one whose
                // connection died and whose slot frees when it times out.
                Refusal::Unavailable(format!(
                    "owner `{name}` already has an upload in progress; one at a time"
                ))
            })
    }

    /// The upload slot for `owner`'s upload: the one kept for it (`ReserveUpload`)
    /// or one free within `upload_slots::PATIENCE`. None is refused then, asking
    /// the owner to reserve one: an upload left waiting longer would hold its
    /// unread frames (`crate::upload_slots`).
    async fn upload_slot(&self, kept: Option<Slot>) -> Result<Slot, Refusal> {
        if let Some(slot) = kept {
            return Ok(slot);
        }
        let taken = self
            .uploads
            .take_within(crate::upload_slots::PATIENCE)
            .await;
        taken.map_err(|e| match e {
            SlotError::AllHeld(_) => {
                crate::metrics::upload_without_slot();
                Refusal::NoUploadSlot(format!(
                    "{e}: reserve one (ReserveUpload) and send the contribution again"
                ))
            }
            SlotError::Closed => Refusal::Unavailable(e.to_string()),
        })
    }

    /// The caller as its certificate names it; `None` on plaintext.
    /// A spec a user sent (`OpenStudy`, `HoldMasks`), checked within the
    /// limits before anything is built from it, its deadline ahead, and the
    /// plan of its layout, counted before it is built: past the limits, a
    /// layout is never cut.
    fn checked_spec(
        &self,
        wire: Option<v1::StudySpec>,
    ) -> Result<
        (
            dpca_common::study::StudySpec,
            dpca_common::study::LayoutPlan,
        ),
        Refusal,
    > {
        let wire = wire.ok_or_else(|| Refusal::Invalid("missing study spec".into()))?;
        let limits = &self.config.limits;
        limits
            .check_wire(&wire)
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        let spec = spec_from_wire(&wire).map_err(|e| Refusal::Invalid(e.to_string()))?;
        if spec.deadline_unix_ms <= self.config.clock.now_ms() {
            return Err(Refusal::Invalid("study deadline is in the past".into()));
        }
        let plan = StudyLayout::plan(&spec).map_err(|e| Refusal::Invalid(e.to_string()))?;
        limits
            .check_layout(plan.size())
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        Ok((spec, plan))
    }

    fn caller<T>(&self, req: &Request<T>) -> Result<Option<Peer>, Refusal> {
        let tls = !matches!(self.config.transport, Transport::InsecurePlaintext);
        crate::gate::caller_of(req.extensions(), tls)
    }

    /// Refuses `action` unless the caller may do it.
    fn authorize(peer: Option<&Peer>, action: Action<'_>) -> Result<(), Refusal> {
        permit(peer, action).map_err(Refusal::Denied)
    }

    /// Refuses unless the caller is the user who opened study `id`.
    async fn authorize_user(&self, peer: Option<&Peer>, id: &str) -> Result<(), Refusal> {
        // Who opened a study never changes: read without waiting for a fold or a
        // release's write that holds its lock, so that a call refused for being
        // a repeat is refused at once.
        let opened_by = self.read_study(id, |s| Ok(s.opened_by.clone())).await?;
        Self::authorize(
            peer,
            Action::UseStudy {
                opened_by: opened_by.as_deref(),
            },
        )
    }

    /// `f` of study `id` as of its last transition, without waiting for a fold
    /// or a release that holds its lock; `None` where the study's deadline has
    /// passed and not yet been applied (the caller then asks the study itself).
    /// An answer from the view is one the study gave: a transition since may
    /// change it, and whatever acts on it is checked again under the lock.
    fn peek_study<T>(
        &self,
        id: &str,
        f: impl FnOnce(&Study) -> Result<T, Refusal>,
    ) -> Result<Option<T>, Refusal> {
        let now = self.config.clock.now_ms();
        self.cell(id)?
            .peek(|s| (!s.deadline_due(now)).then(|| f(s)).transpose())
    }

    /// `f` of study `id` as of its last transition where that is its state now
    /// ([`ProxyService::peek_study`]), or else under its lock: an upload's stream
    /// is not left unread behind a fold of its study (but for a study whose
    /// deadline passed during a fold, until that fold and its write end and the
    /// deadline ticker applies it).
    async fn read_study<T>(
        &self,
        id: &str,
        f: impl Fn(&Study) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        match self.peek_study(id, &f)? {
            Some(answer) => Ok(answer),
            None => self.with_study(id, |s| f(s)).await,
        }
    }

    /// Runs a short `f` on the study under its lock (on the runtime: keep it cheap).
    async fn with_study<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Study) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        let mut study = self.lock_study(id).await?;
        study.tick(self.config.clock.now_ms());
        f(&mut study)
    }

    /// The owner's signed E[N_i] (the last ciphertext of its stream), verified as
    /// the user will verify it: a count the user would refuse is refused now, so
    /// one owner cannot spoil the study for the others.
    fn signed_count(
        &self,
        up: &Upload,
        pk: &PublicKey,
        cts: &[Elem],
        signature: Vec<u8>,
        leaf: Option<Vec<u8>>,
    ) -> Result<SignedCount, Refusal> {
        let Transport::Tls(tls) = &self.config.transport else {
            return Err(Refusal::Internal(
                "signed counts are asked for on TLS only".into(),
            ));
        };
        let certificate =
            leaf.ok_or_else(|| Refusal::Unauthenticated("no client certificate".into()))?;
        let count = cts
            .last()
            .ok_or_else(|| Refusal::Invalid("a contribution without E[N_i]".into()))?;
        let ciphertext = pk.elem_to_bytes(count);
        if signature.is_empty() {
            return Err(Refusal::Invalid(format!(
                "a mask study needs owner `{}` to sign its row count (count_signature)",
                up.owner
            )));
        }
        let claim = signed_count::CountClaim {
            owner: &up.owner,
            study_id: &up.study_id,
            key_fingerprint: &pk.fingerprint(),
            ciphertext: &ciphertext,
        };
        signed_count::verify_count(tls.ca_pem(), &certificate, claim, &signature)
            .map_err(|e| Refusal::Denied(e.to_string()))?;
        Ok(SignedCount {
            ciphertext,
            signature,
            certificate,
        })
    }

    /// One upload: its caller authorized, its owner's slot held throughout
    /// ([`ProxyService::read_and_count`] reads, checks, folds and stores it).
    async fn contribute_upload(
        &self,
        req: Request<Streaming<v1::ContributionChunk>>,
    ) -> Result<Response<v1::ContributeResponse>, Status> {
        let peer = self.caller(&req)?;
        let leaf = req
            .peer_certs()
            .and_then(|certs| certs.first().map(|c| c.to_vec()));
        // Authorized before a slot is taken: only an owner uploads, under its own
        // name, one upload at a time (checked again against the header, in
        // `read_and_count`).
        if let Some(p) = &peer {
            Self::authorize(Some(p), Action::Contribute { owner_id: &p.name })?;
        }
        let _owner_slot = self.owner_slot(peer.as_ref().map(|p| p.name.as_str()))?;
        let answer = self.read_and_count(peer, leaf, req.into_inner()).await;
        if let Err(status) = &answer {
            if rests_on_state(status) {
                // A refusal read off the studies or budgets may rest on a
                // transition still on its way to disk (the study sealed by another
                // owner's contribution): told only once that is durable, or, if it
                // never will be, told to retry. The owner's slot is held meanwhile:
                // one owner waits on one thread at most.
                self.settled("").await?;
            }
        }
        answer
    }

    /// Waits for an upload slot and keeps it for the caller's next upload, for
    /// an owner whose upload found every slot held. The request was read whole
    /// before this runs, so the wait holds no unread frame; the owner's own slot
    /// is held while it waits (one upload or wait per owner). Nothing is kept,
    /// nor waited for, where the study's state would refuse the upload (unknown,
    /// closed, counted already, the owner not invited): the next upload is then
    /// answered from its first chunk, as the state decides once it is durable
    /// (the owner's budget, too, is checked then).
    async fn reserve_slot(
        &self,
        peer: Option<Peer>,
        req: v1::ReserveUploadRequest,
    ) -> Result<v1::ReserveUploadResponse, Refusal> {
        Self::authorize(
            peer.as_ref(),
            Action::Contribute {
                owner_id: &req.owner_id,
            },
        )?;
        let _owner_slot = self.owner_slot(peer.as_ref().map(|p| p.name.as_str()))?;
        // Whole seconds, rounded down but at least one while a slot is kept (so
        // up to a second over in its last second); the owner's client reads none
        // of it, sending its upload at once.
        let seconds = |d: Duration| u32::try_from(d.as_secs().max(1)).unwrap_or(u32::MAX);
        if let Some(left) = self.uploads.kept_for(&req.owner_id) {
            return Ok(v1::ReserveUploadResponse {
                lease_seconds: seconds(left),
            });
        }
        let to_read = self
            .read_study(&req.study_id, |s| {
                Ok(s.check_can_contribute(&req.owner_id, &req.contribution_id))
            })
            .await;
        if !matches!(to_read, Ok(Ok(None))) {
            return Ok(v1::ReserveUploadResponse { lease_seconds: 0 });
        }
        let slot = self
            .uploads
            .wait()
            .await
            .map_err(|e| Refusal::Unavailable(e.to_string()))?;
        self.uploads.keep(req.owner_id, slot);
        Ok(v1::ReserveUploadResponse {
            lease_seconds: seconds(self.uploads.lease()),
        })
    }

    /// The upload of an authorized caller holding its owner's slot: header,
    /// admission, first chunk, then one of the proxy's slots for the rest, the
    /// fold and the durable write.
    async fn read_and_count(
        &self,
        peer: Option<Peer>,
        leaf: Option<Vec<u8>>,
        stream: Streaming<v1::ContributionChunk>,
    ) -> Result<Response<v1::ContributeResponse>, Status> {
        let mut stream = IdleLimited::new(stream, self.config.limits.upload_idle_timeout);
        let first = stream
            .next()
            .await?
            .ok_or_else(|| Refusal::Invalid("empty contribution stream".into()))?;
        let mut upload = upload_header(&first)?;
        Self::authorize(
            peer.as_ref(),
            Action::Contribute {
                owner_id: &upload.owner,
            },
        )?;
        // Taken out now, so that the slot goes back however the upload ends.
        let kept = self.uploads.claim(&upload.owner);
        check_packing(&first)?;
        let (pk, expected, signed) = match self.admit(&upload).await? {
            Admission::Read {
                pk,
                expected,
                signed,
            } => (pk, expected, signed),
            Admission::AlreadyCounted(response) => return Ok(Response::new(response)),
        };
        // The decoded message is dropped here: the chunk is kept as its ciphertexts,
        // parsed and checked.
        let (cts, signature) = first_chunk(first, &pk, expected, &upload.owner)?;
        // Taken only by an upload that is to be read: a retry answered from memory,
        // or a refusal, is not sent to reserve a slot it does not need.
        let _slot = self.upload_slot(kept).await?;
        stream.allow(
            self.config
                .limits
                .upload_allowance(expected * pk.ciphertext_bytes()),
        );
        let cts = read_rest(&mut stream, cts, &pk, expected, &upload.owner).await?;
        let bytes = cts.len() * pk.ciphertext_bytes();
        if signed {
            upload.count = Some(self.signed_count(&upload, &pk, &cts, signature, leaf)?);
        }
        // Read and checked: a commit starting now may wait a little for it.
        let announced = self.store.as_ref().map(Store::announce);
        // Acknowledged only once stored, with its charge.
        let (outcome, owners_in, budget) = self
            .commit_contribution(upload.clone(), cts, announced)
            .await?;
        crate::metrics::contribution(outcome == ContributionOutcome::Counted, bytes);
        tracing::info!(study = %upload.study_id, owner = %upload.owner, owners_in, "contribution counted");
        Ok(Response::new(contribute_response(
            outcome == ContributionOutcome::Counted,
            owners_in,
            budget.as_ref(),
        )))
    }

    /// Waits until every write submitted so far is durable: an answer read from
    /// memory then speaks only of what the file holds. Refused once the store has
    /// stopped (a failed commit).
    async fn settled(&self, study_id: &str) -> Result<(), Refusal> {
        match &self.store {
            None => return Ok(()),
            // Nothing on its way to disk: no thread needed to wait for it.
            Some(store) if store.settled_now() => return Ok(()),
            Some(_) => {}
        }
        let (svc, id) = (self.clone(), study_id.to_string());
        blocking(move || svc.await_stored(&id, None)).await
    }

    /// Refuses early, before the stream is read, a contribution that cannot count
    /// or whose owner's budget cannot pay for the study; answers a retry of one
    /// already counted at once. Read off the study's view where it can be, so an
    /// upload does not wait, its stream unread, behind a fold of its study: the
    /// fold checks the contribution again under the study's lock.
    async fn admit(&self, up: &Upload) -> Result<Admission, Refusal> {
        let (outcome, pk, expected, owners_in, cost, centering) = self
            .read_study(&up.study_id, |s| {
                Ok((
                    s.check_can_contribute(&up.owner, &up.cid)?,
                    s.spec.public_key.clone(),
                    s.layout.owner_ciphertexts(),
                    s.owners_in().len(),
                    (s.spec.privacy.epsilon, s.spec.privacy.delta),
                    s.spec.privacy.centering,
                ))
            })
            .await?;
        // The budget table's lock may be held by a fold charging a budget: wait
        // for it on a blocking thread, not on the runtime.
        let current = {
            let (svc, owner) = (self.clone(), up.owner.clone());
            blocking(move || svc.budget_of(&owner)).await?
        };
        if outcome == Some(ContributionOutcome::AlreadyCounted) {
            // Counted in memory; answered only once that is on disk too.
            self.settled(&up.study_id).await?;
            return Ok(Admission::AlreadyCounted(contribute_response(
                false,
                owners_in,
                current.as_ref(),
            )));
        }
        charge(&up.owner, current.as_ref(), up.cap, &up.study_id, cost).map_err(Refusal::from)?;
        let signed = signing_identity(centering, &self.config.transport).is_some();
        Ok(Admission::Read {
            pk,
            expected,
            signed,
        })
    }
}

/// Whether a contribution's ciphertexts are to be read.
enum Admission {
    /// Read this many, under this key.
    Read {
        pk: PublicKey,
        expected: usize,
        /// The owner must sign its E[N_i] (`mask` over TLS).
        signed: bool,
    },
    /// A retry of a contribution already counted: this is the answer.
    AlreadyCounted(v1::ContributeResponse),
}

/// The longest count signature an upload may carry: an owner's ECDSA or RSA
/// signature is far shorter.
const MAX_SIGNATURE_BYTES: usize = 4096;

/// What an upload's first chunk says it is: its owner and contribution ids
/// present, every id short.
fn upload_header(first: &v1::ContributionChunk) -> Result<Upload, Refusal> {
    if first.owner_id.is_empty() || first.contribution_id.is_empty() {
        return Err(Refusal::Invalid(
            "owner_id and contribution_id are required".into(),
        ));
    }
    for (what, id) in [
        ("study_id", &first.study_id),
        ("owner_id", &first.owner_id),
        ("contribution_id", &first.contribution_id),
    ] {
        if id.len() > MAX_ID_BYTES {
            return Err(Refusal::Invalid(format!(
                "{what} is {} bytes; at most {MAX_ID_BYTES}",
                id.len()
            )));
        }
        // Ids are shown: in the operator's status table and the user's report.
        check_no_terminal_controls(what, id).map_err(Refusal::Invalid)?;
    }
    Ok(Upload {
        study_id: first.study_id.clone(),
        owner: first.owner_id.clone(),
        cid: first.contribution_id.clone(),
        cap: (first.cap_epsilon, first.cap_delta),
        count: None,
    })
}

/// Refuses a first chunk packed in another layout than this build reads, or
/// carrying more ciphertexts, or a longer signature, than any chunk does: checked
/// before the upload waits for the study's lock, so what was decoded stays about
/// what was received.
fn check_packing(first: &v1::ContributionChunk) -> Result<(), Refusal> {
    if first.layout != LAYOUT_VERSION {
        return Err(Refusal::Invalid(format!(
            "contribution packed with ciphertext layout {}, study {} uses layout {LAYOUT_VERSION}: the owner needs a build of the study's layout",
            first.layout.max(1),
            first.study_id
        )));
    }
    if first.ciphertexts.len() > CIPHERTEXTS_PER_CHUNK {
        return Err(Refusal::Invalid(format!(
            "a chunk of {} ciphertexts; every chunk carries at most {CIPHERTEXTS_PER_CHUNK}; \
             nothing was counted",
            first.ciphertexts.len()
        )));
    }
    if first.count_signature.len() > MAX_SIGNATURE_BYTES {
        return Err(Refusal::Invalid(format!(
            "a count signature of {} bytes; at most {MAX_SIGNATURE_BYTES}",
            first.count_signature.len()
        )));
    }
    Ok(())
}

/// The first chunk of a contribution of `expected` ciphertexts (its packing
/// checked by [`check_packing`]), checked as [`take_chunk`] checks every chunk,
/// with the count signature it carries.
fn first_chunk(
    first: v1::ContributionChunk,
    pk: &PublicKey,
    expected: usize,
    owner: &str,
) -> Result<(Vec<Elem>, Vec<u8>), Refusal> {
    if first.total_ciphertexts as usize != expected {
        return Err(Refusal::Invalid(format!(
            "contribution announces {} ciphertexts, study {} expects {expected}",
            first.total_ciphertexts, first.study_id
        )));
    }
    let mut cts = Vec::new();
    take_chunk(&mut cts, &first.ciphertexts, pk, expected, owner)?;
    Ok((cts, first.count_signature))
}

/// Parses and validates one chunk's ciphertexts onto `cts`: every chunk carries
/// [`CIPHERTEXTS_PER_CHUNK`], the last the rest, so an upload makes progress with
/// every chunk or is refused; none past `expected`.
fn take_chunk(
    cts: &mut Vec<Elem>,
    chunk: &[Vec<u8>],
    pk: &PublicKey,
    expected: usize,
    owner: &str,
) -> Result<(), Refusal> {
    if cts.len() + chunk.len() > expected {
        return Err(Refusal::Invalid(format!(
            "more than {expected} ciphertexts"
        )));
    }
    let want = CIPHERTEXTS_PER_CHUNK.min(expected - cts.len());
    let parsed = pk
        .elems_from_bytes(chunk, cts.len())
        .map_err(|e| Refusal::Invalid(format!("owner `{owner}`: {e}")))?;
    if parsed.len() != want {
        return Err(Refusal::Invalid(format!(
            "a chunk of {} ciphertexts after {}; every chunk carries \
             {CIPHERTEXTS_PER_CHUNK}, the last the rest ({want} here); nothing was counted",
            parsed.len(),
            cts.len()
        )));
    }
    cts.extend(parsed);
    Ok(())
}

/// Reads the rest of a contribution of `expected` ciphertexts onto `cts` (its
/// first chunk), each chunk checked by [`take_chunk`]; refuses fewer.
async fn read_rest(
    stream: &mut IdleLimited,
    mut cts: Vec<Elem>,
    pk: &PublicKey,
    expected: usize,
    owner: &str,
) -> Result<Vec<Elem>, Refusal> {
    cts.reserve_exact(expected - cts.len());
    while let Some(chunk) = stream.next().await? {
        take_chunk(&mut cts, &chunk.ciphertexts, pk, expected, owner)?;
    }
    if cts.len() != expected {
        return Err(Refusal::Invalid(format!(
            "stream ended after {} of {expected} ciphertexts; nothing was counted",
            cts.len()
        )));
    }
    Ok(cts)
}

/// An upload stream that may neither sit idle nor drag: a sender that stalls longer
/// than the idle limit between two chunks, or takes longer than its allowance for
/// the whole upload, loses its upload (nothing is counted) and its slot.
struct IdleLimited {
    inner: Streaming<v1::ContributionChunk>,
    idle: Duration,
    /// When the allowance for the whole upload runs out (none until admitted).
    until: Option<tokio::time::Instant>,
}

impl IdleLimited {
    fn new(inner: Streaming<v1::ContributionChunk>, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            until: None,
        }
    }

    /// From now on the whole upload must end within `allowance`.
    fn allow(&mut self, allowance: Duration) {
        self.until = Some(tokio::time::Instant::now() + allowance);
    }

    async fn next(&mut self) -> Result<Option<v1::ContributionChunk>, Refusal> {
        let idle_until = tokio::time::Instant::now() + self.idle;
        let until = self.until.map_or(idle_until, |u| u.min(idle_until));
        match tokio::time::timeout_at(until, self.inner.message()).await {
            Ok(message) => message.map_err(Refusal::Stream),
            Err(_) if Some(until) == self.until => Err(Refusal::TooSlow(
                "the upload took longer than its allowance (--min-upload-rate); it was \
                 dropped and nothing was counted"
                    .into(),
            )),
            Err(_) => Err(Refusal::TooSlow(format!(
                "the upload sent nothing for {} s; it was dropped and nothing was counted",
                self.idle.as_secs_f64()
            ))),
        }
    }
}

/// What a contribution's first chunk says it is.
#[derive(Clone)]
struct Upload {
    study_id: String,
    owner: String,
    cid: String,
    cap: (f64, f64),
    /// Its signed E[N_i], once verified (`mask` over TLS).
    count: Option<SignedCount>,
}

/// A study as `status` shows it at `now_ms`: counts, the first names of the
/// owners in and missing, deadline, mechanism, epsilon and delta, no data.
fn study_summary(s: &Study, now_ms: u64) -> v1::StudySummary {
    let (owners_in, missing) = (s.owners_in_listed(), s.owners_missing_listed());
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    v1::StudySummary {
        study_id: s.id.clone(),
        state: s.phase_name_at(now_ms).to_string(),
        owners_in_count: count(owners_in.count),
        owners_in: owners_in.names,
        owners_missing_count: count(missing.count),
        owners_missing: missing.names,
        min_owners: s.spec.min_owners,
        quorum: s.spec.quorum,
        deadline_unix_ms: s.spec.deadline_unix_ms,
        mechanism: s.spec.privacy.mechanism.name().to_string(),
        epsilon: s.spec.privacy.epsilon,
        delta: s.spec.privacy.delta,
        opened_by: s.opened_by.clone().unwrap_or_default(),
    }
}

/// Whether `s` is sealed (or released since), or why it never will be.
fn seal_reached(s: &Study, id: &str) -> Result<bool, Refusal> {
    match &s.phase {
        Phase::Collecting => Ok(false),
        Phase::Aborted(reason) => Err(Refusal::WrongPhase(format!("study {id} aborted: {reason}"))),
        Phase::Sealed | Phase::Released(_) => Ok(true),
    }
}

/// What the user is told of a sealed study: E[N], the owners in and missing, and
/// (`mask`) the owners' signed counts.
fn sealed_answer(s: &Study) -> Result<v1::SealedStudy, Refusal> {
    if !seal_reached(s, &s.id)? {
        return Err(Refusal::Internal("a sealed study found collecting".into()));
    }
    let count = s
        .encrypted_count()
        .ok_or_else(|| Refusal::Internal("empty aggregate".into()))?;
    // As aggregated, not re-randomized: the user's opening is checked against
    // this very ciphertext, and the key holder could strip any re-randomization
    // anyway.
    Ok(v1::SealedStudy {
        encrypted_count: s.spec.public_key.ciphertext_to_bytes(&count),
        owners_in: s.owners_in(),
        owners_missing: s.owners_missing(),
        needs_count: s.spec.privacy.centering == Centering::Mask,
        counts: s
            .signed_counts()
            .iter()
            .map(|(owner, c)| signed_count_to_wire(owner, c))
            .collect(),
    })
}

/// An owner's budget as `status` shows it.
fn budget_summary(owner: &str, b: &OwnerBudget) -> v1::OwnerBudgetSummary {
    v1::OwnerBudgetSummary {
        owner_id: owner.to_string(),
        spent_epsilon: b.spent_epsilon,
        spent_delta: b.spent_delta,
        cap_epsilon: b.cap_epsilon,
        cap_delta: b.cap_delta,
        studies: b.studies.len() as u32,
    }
}

/// Whether an upload's refusal was read off the studies or the budgets (a phase,
/// a duplicate, a budget, an unknown study), which a write still on its way to
/// disk may have changed; a refusal of the request itself (its certificate, its
/// bytes, its pace) rests on nothing stored and is answered at once.
fn rests_on_state(status: &Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists | tonic::Code::NotFound
    )
}

fn not_stored(study_id: &str, e: StoreError) -> Refusal {
    // The details (the state file's path, the database's error) are the
    // operator's: they go to the log, not to the caller.
    tracing::error!(study = %study_id, error = %e, "state not stored");
    Refusal::Unavailable(
        "the proxy could not store the study; nothing changed (its operator's log says why)".into(),
    )
}

/// Runs CPU- or disk-bound work off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Refusal::Internal(format!("worker task failed: {e}")))?
}

/// The user's opening of E[N] as the domain type; a root that does not even parse
/// as a residue is refused like any opening that does not verify.
fn opening_from_wire(pk: &PublicKey, o: &v1::CountOpening) -> Result<Opening, Refusal> {
    if o.root.len() > pk.ciphertext_bytes() {
        return Err(Refusal::Invalid(
            "the root of the count opening is too long".into(),
        ));
    }
    Ok(Opening {
        plaintext: num_bigint::BigUint::from(o.n_rows),
        root: num_bigint::BigUint::from_bytes_be(&o.root),
    })
}

fn contribute_response(
    newly_counted: bool,
    owners_in: usize,
    budget: Option<&OwnerBudget>,
) -> v1::ContributeResponse {
    let mut r = v1::ContributeResponse {
        newly_counted,
        owners_in: owners_in as u32,
        ..Default::default()
    };
    if let Some(b) = budget {
        r.spent_epsilon = b.spent_epsilon;
        r.spent_delta = b.spent_delta;
        r.cap_epsilon = b.cap_epsilon;
        r.cap_delta = b.cap_delta;
    }
    r
}

type ResultStream = Pin<Box<dyn Stream<Item = Result<v1::ResultChunk, Status>> + Send>>;

#[tonic::async_trait]
impl v1::proxy_server::Proxy for ProxyService {
    async fn open_study(
        &self,
        req: Request<v1::OpenStudyRequest>,
    ) -> Result<Response<v1::OpenStudyResponse>, Status> {
        let peer = self.caller(&req)?;
        Self::authorize(peer.as_ref(), Action::OpenStudy)?;
        let req = req.into_inner();
        if req.noise_free_for_testing && !self.config.allow_noise_free_for_testing {
            return Err(Refusal::Denied(
                "noise-free releases are refused: this proxy was not started in test mode".into(),
            )
            .into());
        }
        let (spec, plan) = self.checked_spec(req.spec)?;
        let layout = plan.cut();
        let mut id_bytes = [0u8; 16];
        self.config.entropy.rng().fill_bytes(&mut id_bytes);
        let id = hex::encode(id_bytes);
        let (features, quorum) = (spec.dim(), spec.quorum);
        let mut study = Study::new(id.clone(), spec, layout, req.noise_free_for_testing);
        study.opened_by = peer.map(|p| p.name);
        // Held until stored: no call reaches the study before its record is queued.
        // The write, the removal if it fails and the release all run on the
        // blocking thread, which finishes even if the caller goes away.
        let Reserved { opened, dropped } = self.reserve(&study)?;
        let (svc, key) = (self.clone(), id.clone());
        blocking(move || {
            let stored = svc
                .forget(&key, &dropped)
                .and_then(|()| svc.persist(&study));
            if stored.is_err() {
                // Not stored: not opened, and nothing dropped.
                let mut table = svc.table()?;
                table.remove(&key);
                for (cell, s) in &dropped {
                    table.insert(s.id.clone(), Arc::clone(cell));
                }
            }
            drop((opened, dropped));
            stored
        })
        .await?;
        crate::metrics::study_opened();
        tracing::info!(study = %id, features, quorum, "study opened");
        Ok(Response::new(v1::OpenStudyResponse { study_id: id }))
    }

    async fn get_study(
        &self,
        req: Request<v1::GetStudyRequest>,
    ) -> Result<Response<v1::StudyInfo>, Status> {
        Self::authorize(self.caller(&req)?.as_ref(), Action::ReadSpec)?;
        let id = req.into_inner().study_id;
        let mut info = self
            .with_study(&id, |s| {
                Ok(v1::StudyInfo {
                    study_id: s.id.clone(),
                    spec: None,
                    state: s.phase.name().to_string(),
                    owners_in: u32::try_from(s.owners_counted()).unwrap_or(u32::MAX),
                    noise_free: s.noise_free,
                })
            })
            .await?;
        self.settled(&id).await?;
        // A spec never changes once its study is open: encoded only now, so that
        // calls waiting for the disk hold none of it (each up to the spec's
        // bound), and only then does the answer take its place (`gate`).
        info.spec = Some(self.read_study(&id, |s| Ok(spec_to_wire(&s.spec))).await?);
        Ok(Response::new(info))
    }

    async fn contribute(
        &self,
        req: Request<Streaming<v1::ContributionChunk>>,
    ) -> Result<Response<v1::ContributeResponse>, Status> {
        self.contribute_upload(req).await
    }

    async fn reserve_upload(
        &self,
        req: Request<v1::ReserveUploadRequest>,
    ) -> Result<Response<v1::ReserveUploadResponse>, Status> {
        let peer = self.caller(&req)?;
        let answer = self.reserve_slot(peer, req.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn await_seal(
        &self,
        req: Request<v1::AwaitSealRequest>,
    ) -> Result<Response<v1::SealedStudy>, Status> {
        let peer = self.caller(&req)?;
        let id = req.into_inner().study_id;
        self.authorize_user(peer.as_ref(), &id).await?;
        loop {
            let sealed = self.with_study(&id, |s| seal_reached(s, &id)).await?;
            if sealed {
                // The contribution that sealed it may still be on its way to disk,
                // and a seal by the deadline is stored by the ticker, which may not
                // have come to it yet: stored here first, so the user hears only of
                // a seal a restart keeps.
                self.settled(&id).await?;
                let now = self.config.clock.now_ms();
                if self
                    .read_study(&id, |s| Ok(self.transition_unstored(s, now)))
                    .await?
                {
                    self.update_study(&id, |_| Ok(())).await?;
                }
                // Built only now: a sealed study's owners and counts no longer
                // change, and a call waiting for the disk holds none of them.
                let answer = self.read_study(&id, sealed_answer).await?;
                return Ok(Response::new(answer));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn release(
        &self,
        req: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let peer = self.caller(&req)?;
        let req = req.into_inner();
        let id = req.study_id;
        self.authorize_user(peer.as_ref(), &id).await?;
        // A second computation of the same release would only be thrown away at
        // `commit_release`, after minutes of every core at M = 1000.
        let computing = self.releasing.take(id.clone(), 1).ok_or_else(|| {
            Refusal::Unavailable(format!(
                "the release of study `{id}` is being computed: fetch the result once it is stored"
            ))
        })?;
        // One task checks, computes and stores the release, holding the slot
        // until it is done, and spawned before this call next waits: a caller that
        // goes away cancels none of it (minutes of every core at M = 1000), and a
        // request the slot refused meanwhile fetches the stored result.
        let svc = self.clone();
        tokio::spawn(async move {
            let _computing = computing;
            let done = svc.check_compute_and_store(&id, req.count).await;
            if let Err(e) = &done {
                tracing::warn!(study = %id, error = %e, "release not stored");
            }
            done
        })
        .await
        .map_err(|e| Refusal::Internal(format!("the release's task: {e}")))??;
        Ok(Response::new(v1::ReleaseResponse {}))
    }

    async fn status(
        &self,
        req: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::ProxyStatus>, Status> {
        let peer = self.caller(&req)?;
        Self::authorize(peer.as_ref(), Action::Status)?;
        if self.store.as_ref().is_some_and(|st| st.stopped()) {
            // What memory holds may be more than the file does: not shown as true.
            return Err(Refusal::Unavailable(
                "the proxy could not store its state and must be restarted (its operator's \
                 log says why)"
                    .into(),
            )
            .into());
        }
        // A user sees the studies it opened; the operator (or plaintext) sees all.
        let only = peer
            .as_ref()
            .filter(|p| p.role == dpca_shell::tls::Role::User)
            .map(|p| p.name.clone());
        let now = self.config.clock.now_ms();
        let mut studies = Vec::new();
        // From the studies' views, read in place: a status never waits behind a
        // fold, nor copies a spec.
        let shown = |s: &Study| only.is_none() || s.opened_by == only;
        for shared in self.all_studies()? {
            if let Some(summary) = shared.peek(|s| shown(s).then(|| study_summary(s, now))) {
                studies.push(summary);
            }
        }
        if only.is_none() {
            // Set aside at startup, listed (last) for the operator; its log says why.
            studies.extend(self.unreadable.keys().map(|id| v1::StudySummary {
                study_id: id.clone(),
                state: crate::status::UNREADABLE.into(),
                ..Default::default()
            }));
        }
        studies.sort_by_key(|s| std::cmp::Reverse(s.deadline_unix_ms));
        let mut budgets: Vec<v1::OwnerBudgetSummary> = if only.is_none() {
            let svc = self.clone();
            blocking(move || Ok(svc.lock_budgets()?.clone()))
                .await?
                .iter()
                .map(|(owner, b)| budget_summary(owner, b))
                .collect()
        } else {
            Vec::new()
        };
        budgets.sort_by(|a, b| a.owner_id.cmp(&b.owner_id));
        Ok(Response::new(v1::ProxyStatus { studies, budgets }))
    }

    type FetchResultStream = ResultStream;
    type FetchMaskSumStream = holding::MaskSumStream;

    async fn hold_masks(
        &self,
        req: Request<v1::HoldMasksRequest>,
    ) -> Result<Response<v1::HoldMasksResponse>, Status> {
        self.hold_masks_call(req).await
    }

    async fn deposit_seed(
        &self,
        req: Request<v1::DepositSeedRequest>,
    ) -> Result<Response<v1::DepositSeedResponse>, Status> {
        self.deposit_seed_call(req).await
    }

    async fn fetch_mask_sum(
        &self,
        req: Request<v1::FetchMaskSumRequest>,
    ) -> Result<Response<Self::FetchMaskSumStream>, Status> {
        self.fetch_mask_sum_call(req).await
    }

    async fn fetch_result(
        &self,
        req: Request<v1::FetchResultRequest>,
    ) -> Result<Response<ResultStream>, Status> {
        let peer = self.caller(&req)?;
        let id = req.into_inner().study_id;
        self.authorize_user(peer.as_ref(), &id).await?;
        let (released, pk, header) = self
            .with_study(&id, |s| {
                let Phase::Released(r) = &s.phase else {
                    return Err(Refusal::WrongPhase(format!(
                        "study {id} is {}: no result yet",
                        s.phase.name()
                    )));
                };
                Ok((
                    Arc::clone(r),
                    s.spec.public_key.clone(),
                    result_header(s, r),
                ))
            })
            .await?;
        // Each chunk is encoded when its caller reads it: a stream holds the
        // release it shares with the study, not a copy of it, however slowly (or
        // never) it is read.
        let total = released.ciphertexts.len();
        let starts = (0..total).step_by(CIPHERTEXTS_PER_CHUNK);
        let stream = tokio_stream::iter(starts).map(move |start| {
            let end = total.min(start + CIPHERTEXTS_PER_CHUNK);
            let part = released.ciphertexts.get(start..end).unwrap_or_default();
            let ciphertexts = part.iter().map(|c| pk.ciphertext_to_bytes(c)).collect();
            let chunk = match start {
                0 => header.clone(),
                _ => v1::ResultChunk::default(),
            };
            Ok(v1::ResultChunk {
                ciphertexts,
                ..chunk
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// What the first chunk of study `s`'s result `r` says besides its ciphertexts.
fn result_header(s: &Study, r: &Released) -> v1::ResultChunk {
    v1::ResultChunk {
        n_rows: r.n_rows.unwrap_or(0),
        noise_scale_grid: r.plan.matrix.grid_parameter().to_string(),
        noise_scale: s.spec.noise_sd_per_entry(&r.plan, r.n_rows),
        n_owners: r.owners.len() as u32,
        total_ciphertexts: r.ciphertexts.len() as u32,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::tests::study;
    use dpca_common::study::SpecDraft;

    /// Checked before the upload takes a slot (or is refused for want of one):
    /// what is held meanwhile is its parsed first chunk, not whatever its first
    /// message could hold (a megabyte of empty entries decodes to about 24 MiB).
    #[test]
    fn a_first_chunk_is_checked_before_its_upload_takes_a_slot() {
        fn invalid<T>(r: Result<T, Refusal>) -> String {
            match r {
                Err(Refusal::Invalid(m)) => m,
                Err(other) => panic!("refused as {other:?}"),
                Ok(_) => panic!("accepted"),
            }
        }
        let sk = dpca_common::testing::test_key();
        let pk = sk.public().clone();
        let ct = pk.ciphertext_to_bytes(
            &pk.encrypt(&num_bigint::BigUint::from(7u8), &mut rand::rngs::OsRng)
                .expect("encrypt"),
        );
        let header = v1::ContributionChunk {
            study_id: "s".repeat(MAX_ID_BYTES),
            owner_id: "a".into(),
            contribution_id: "c".repeat(MAX_ID_BYTES),
            layout: LAYOUT_VERSION,
            total_ciphertexts: 100,
            ciphertexts: vec![ct; CIPHERTEXTS_PER_CHUNK],
            count_signature: vec![1; MAX_SIGNATURE_BYTES],
            ..Default::default()
        };
        // The longest ids and signature, and a full first chunk, pass.
        assert!(upload_header(&header).is_ok());
        assert!(check_packing(&header).is_ok());
        let (cts, signature) = first_chunk(header.clone(), &pk, 100, "a").expect("a first chunk");
        assert_eq!(
            (cts.len(), signature.len()),
            (CIPHERTEXTS_PER_CHUNK, MAX_SIGNATURE_BYTES)
        );
        let long = v1::ContributionChunk {
            contribution_id: "c".repeat(MAX_ID_BYTES + 1),
            ..header.clone()
        };
        assert!(invalid(upload_header(&long)).contains("contribution_id is 257 bytes"));
        // Ids are shown in the status table: none that could drive a terminal.
        let escaping = v1::ContributionChunk {
            owner_id: "a\x1b]0;counted\x07".into(),
            ..header.clone()
        };
        assert!(invalid(upload_header(&escaping)).contains("owner_id \"a\\u{1b}]0;counted"));
        // A megabyte of empty entries is refused off the header, before the study
        // is looked at; no more than a chunk's, each entry is checked.
        for (entries, says) in [(10_000, "at most 64"), (CIPHERTEXTS_PER_CHUNK, "zero")] {
            let empties = v1::ContributionChunk {
                ciphertexts: vec![Vec::new(); entries],
                ..header.clone()
            };
            let refused =
                check_packing(&empties).and_then(|()| first_chunk(empties, &pk, 100, "a"));
            assert!(invalid(refused).contains(says), "{entries} empty entries");
        }
        assert!(invalid(first_chunk(header.clone(), &pk, 99, "a")).contains("announces 100"));
        let signed = v1::ContributionChunk {
            count_signature: vec![0; MAX_SIGNATURE_BYTES + 1],
            ..header
        };
        assert!(invalid(check_packing(&signed)).contains("count signature"));
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn config(state: &std::path::Path, test_mode: bool) -> ProxyConfig {
        ProxyConfig {
            transport: Transport::InsecurePlaintext,
            state: Some(state.to_path_buf()),
            release_journal: None,
            replace_release_journal: None,
            allow_noise_free_for_testing: test_mode,
            test_skips_noise: false,
            max_concurrent_uploads: 1,
            limits: crate::limits::Limits::default(),
            clock: std::sync::Arc::new(crate::world::SystemClock),
            entropy: std::sync::Arc::new(crate::world::OsEntropy),
        }
    }

    /// Stores the test study `s1` (quorum 2, minimum 1) with this deadline at `path`,
    /// as a proxy that held it would have.
    fn store_study(path: &std::path::Path, deadline_unix_ms: u64, noise_free: bool) {
        let mut s = study(2, 1);
        s.noise_free = noise_free;
        s.spec = SpecDraft {
            deadline_unix_ms,
            ..s.spec.to_draft()
        }
        .validate()
        .expect("spec");
        Store::open(path)
            .expect("store")
            .save_study(&s)
            .expect("save");
    }

    #[test]
    fn a_noise_free_study_is_not_served_by_a_proxy_restarted_out_of_test_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        store_study(&path, u64::MAX, true);
        assert_eq!(
            phase_of(&ProxyService::new(config(&path, true)).expect("test mode")),
            "collecting"
        );
        assert_eq!(
            phase_of(&ProxyService::new(config(&path, false)).expect("normal")),
            "aborted"
        );
    }

    /// A study whose stored record this build cannot read (here one that is no
    /// record, and one with a contributor row that is none) no longer stops the
    /// proxy from starting, and so from serving every other study: it is refused
    /// by name with why, and its record is left as it was for a build that
    /// reads it.
    #[test]
    fn a_study_whose_record_cannot_be_read_is_refused_by_name_and_the_others_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        store_study(&path, u64::MAX, false);
        let garbage = b"\xff\xff not a record".to_vec();
        {
            let store = Store::open(&path).expect("store");
            store.put_raw_record("s2", &garbage);
            // A study whose record reads but one of whose rows does not.
            let mut s3 = study(2, 1);
            s3.id = "s3".into();
            store.save_study(&s3).expect("save");
            store.put_raw_contributor_row("s3", "a", &garbage);
        }
        let svc = ProxyService::new(config(&path, false)).expect("starts");
        let ticking = two_threads();
        ticking.block_on(async { svc.spawn_deadline_ticker() });
        assert_eq!(phase_of(&svc), "collecting");
        for id in ["s2", "s3"] {
            let err = rt()
                .block_on(svc.with_study(id, |_| Ok(())))
                .expect_err("not served");
            let status = Status::from(err);
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(
                status.message().contains(&format!("`{id}`"))
                    && status.message().contains("cannot read"),
                "{status:?}"
            );
        }
        // The operator's status lists them (plaintext here: the operator's view).
        use v1::proxy_server::Proxy;
        let listed = rt()
            .block_on(svc.status(Request::new(v1::StatusRequest {})))
            .expect("status")
            .into_inner();
        let state_of = |id: &str| {
            let s = listed.studies.iter().find(|s| s.study_id == id);
            s.map(|s| s.state.clone())
        };
        assert_eq!(state_of("s1").as_deref(), Some("collecting"));
        for id in ["s2", "s3"] {
            assert_eq!(state_of(id).as_deref(), Some("unreadable"), "{id}");
        }
        // The ticker's rounds leave the record set aside as it was.
        std::thread::sleep(POLL * 3);
        drop(ticking);
        drop(svc);
        let store = Store::open(&path).expect("reopen");
        assert_eq!(store.raw_record("s2"), Some(garbage));
    }

    /// A new study never takes the id of a record set aside: its rows would join
    /// the new study's at the next restart, and its record would be overwritten.
    /// (Drawn again here from the same seed, as a replayed simulation would.)
    #[test]
    fn a_new_study_never_takes_the_id_of_a_record_set_aside() {
        use crate::world::{Clock, Entropy, SeededEntropy};
        use v1::proxy_server::Proxy;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let mut first = [0u8; 16];
        SeededEntropy::new(7).rng().fill_bytes(&mut first);
        let taken = hex::encode(first);
        let garbage = b"\xff\xff not a record".to_vec();
        Store::open(&path)
            .expect("store")
            .put_raw_record(&taken, &garbage);
        let svc = ProxyService::new(ProxyConfig {
            entropy: Arc::new(SeededEntropy::new(7)),
            ..config(&path, false)
        })
        .expect("starts");
        let spec = SpecDraft {
            deadline_unix_ms: crate::world::SystemClock.now_ms() + 3_600_000,
            ..study(2, 1).spec.to_draft()
        }
        .validate()
        .expect("spec");
        let request = Request::new(v1::OpenStudyRequest {
            spec: Some(spec_to_wire(&spec)),
            noise_free_for_testing: false,
        });
        let err = rt()
            .block_on(svc.open_study(request))
            .expect_err("the id is kept");
        assert!(err.message().contains("taken"), "{err:?}");
        drop(svc);
        let store = Store::open(&path).expect("reopen");
        assert_eq!(store.raw_record(&taken), Some(garbage));
    }

    /// A call on a study the proxy does not hold is refused as not found, naming
    /// the study once.
    #[test]
    fn an_unknown_study_is_refused_naming_it_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc =
            ProxyService::new(config(&dir.path().join("state.redb"), false)).expect("service");
        let err = rt()
            .block_on(svc.with_study("nope", |_| Ok(())))
            .expect_err("an unknown study");
        let status = Status::from(err);
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert_eq!(status.message(), "unknown study `nope`");
    }

    /// A service on a manual clock at 10 s, holding `s1` with its deadline at 70 s.
    fn on_manual_clock() -> (
        tempfile::TempDir,
        Arc<crate::world::ManualClock>,
        ProxyService,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        store_study(&path, 70_000, false);
        let clock = Arc::new(crate::world::ManualClock::at(10_000));
        let svc = ProxyService::new(ProxyConfig {
            clock: Arc::clone(&clock) as Arc<dyn crate::world::Clock>,
            ..config(&path, false)
        })
        .expect("service");
        (dir, clock, svc)
    }

    /// Deadlines are read on the injected clock: a study is aborted the moment
    /// the clock passes its deadline with no owner in, without a real wait.
    #[test]
    fn a_deadline_passes_on_the_injected_clock_without_a_real_wait() {
        let (_dir, clock, svc) = on_manual_clock();
        let phase = || phase_of(&svc);
        assert_eq!(phase(), "collecting");
        clock.advance(Duration::from_secs(59));
        assert_eq!(phase(), "collecting");
        clock.advance(Duration::from_secs(2));
        assert_eq!(phase(), "aborted");
    }

    /// A state file in a new folder holding `s1` with its deadline at 70 s,
    /// sealing at 2 owners and needing 1, with owner `a` in and its contribution in
    /// the stored aggregate (a checkpoint at every contribution): nothing of it is
    /// stored one by one.
    fn stored_with_one_owner_checkpointed(
        noise_free: bool,
    ) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        use rand::SeedableRng;
        let mut s = crate::study::tests::study_with(Centering::DpMean, 2, 1);
        s.noise_free = noise_free;
        s.spec = SpecDraft {
            deadline_unix_ms: 70_000,
            ..s.spec.to_draft()
        }
        .validate()
        .expect("spec");
        let store = Store::open_with(&path, 1).expect("store");
        store.save_study(&s).expect("save");
        let pk = s.spec.public_key.clone();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        let cts: Vec<Elem> = (0..s.layout.owner_ciphertexts())
            .map(|_| {
                pk.ring()
                    .elem(&pk.encrypt(&1u8.into(), &mut rng).expect("enc").0)
            })
            .collect();
        s.contribute("a", "c", &cts, |x, y| pk.ring().mul_elem(x, y))
            .expect("counted");
        let ticket = store
            .submit_contribution(None, s, "a".into(), cts, None)
            .expect("submitted");
        store.wait(ticket).expect("stored");
        assert!(!store.has_pending("s1"));
        (dir, path)
    }

    /// A service on the state file at `path`, on a manual clock at 10 s.
    fn at_ten_seconds(path: &std::path::Path) -> (Arc<crate::world::ManualClock>, ProxyService) {
        let clock = Arc::new(crate::world::ManualClock::at(10_000));
        let svc = ProxyService::new(ProxyConfig {
            clock: Arc::clone(&clock) as Arc<dyn crate::world::Clock>,
            ..config(path, false)
        })
        .expect("service");
        (clock, svc)
    }

    /// `s1`'s phase on a proxy restarted on the state file at `path` with its
    /// clock at 10 s, before the deadline (a clock stepped back, a machine moved).
    fn phase_after_a_restart_before_the_deadline(path: &std::path::Path) -> &'static str {
        phase_of(&at_ten_seconds(path).1)
    }

    /// The studies of the state file at `path`, opened again and loaded.
    fn reloaded(path: &std::path::Path) -> Vec<Study> {
        Store::open(path).expect("reopen").load_all().expect("load")
    }

    /// `s1`'s phase on `svc`.
    fn phase_of(svc: &ProxyService) -> &'static str {
        rt().block_on(svc.with_study("s1", |s| Ok(s.phase.name())))
            .expect("study")
    }

    /// A seal by the deadline was made in memory and stored only where some
    /// contribution was still stored one by one: the user was told the study
    /// sealed, and a restart whose clock read before the deadline reopened it
    /// to more owners. Now the seal is stored before the user hears of it.
    #[test]
    fn a_seal_by_the_deadline_is_stored_before_the_user_hears_of_it() {
        use v1::proxy_server::Proxy;
        let (_dir, path) = stored_with_one_owner_checkpointed(false);
        let (clock, svc) = at_ten_seconds(&path);
        clock.advance(Duration::from_secs(61));
        let sealed = rt()
            .block_on(svc.await_seal(Request::new(v1::AwaitSealRequest {
                study_id: "s1".into(),
            })))
            .expect("sealed");
        assert_eq!(sealed.into_inner().owners_in, vec!["a".to_string()]);
        drop(svc);
        assert_eq!(phase_after_a_restart_before_the_deadline(&path), "sealed");
    }

    /// An abort this proxy's settings decide at startup (here: a noise-free study
    /// on a proxy out of test mode) is not stored, though the deadline has passed
    /// and the ticker runs: a proxy restarted in test mode serves the study again
    /// (sealed by its deadline), as before.
    #[test]
    fn an_abort_decided_at_startup_is_not_stored() {
        let (_dir, path) = stored_with_one_owner_checkpointed(true);
        let at = |test_mode: bool| {
            ProxyService::new(ProxyConfig {
                clock: Arc::new(crate::world::ManualClock::at(100_000)),
                ..config(&path, test_mode)
            })
            .expect("service")
        };
        let normal = at(false);
        assert_eq!(phase_of(&normal), "aborted");
        rt().block_on(async {
            normal.spawn_deadline_ticker();
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
        drop(normal);
        assert_eq!(phase_of(&at(true)), "sealed");
    }

    /// The deadline ticker stores every transition the deadline makes, not only
    /// those of studies holding contributions stored one by one.
    #[test]
    fn the_ticker_stores_a_deadline_transition() {
        let (_dir, path) = stored_with_one_owner_checkpointed(false);
        let (clock, svc) = at_ten_seconds(&path);
        rt().block_on(async {
            svc.spawn_deadline_ticker();
            clock.advance(Duration::from_secs(61));
            for _ in 0..100 {
                let store = svc.store.as_ref().expect("store");
                if !store.stored_collecting("s1") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        drop(svc);
        assert_eq!(phase_after_a_restart_before_the_deadline(&path), "sealed");
    }

    /// `status` reads the studies' views: it answers while a study is held by a
    /// fold or a release (which at M = 1000 take seconds), and shows the deadline.
    #[test]
    fn status_answers_while_a_study_is_busy() {
        let (_dir, clock, svc) = on_manual_clock();
        async fn state(svc: &ProxyService) -> String {
            use v1::proxy_server::Proxy;
            let call = svc.status(Request::new(v1::StatusRequest::default()));
            let status = tokio::time::timeout(Duration::from_secs(5), call)
                .await
                .expect("status waited for the busy study")
                .expect("status");
            status.into_inner().studies[0].state.clone()
        }
        rt().block_on(async {
            let _busy = svc.lock_study("s1").await.expect("lock");
            assert_eq!(state(&svc).await, "collecting");
            clock.advance(Duration::from_secs(60));
            assert_eq!(
                state(&svc).await,
                "aborted",
                "the deadline, applied to the view"
            );
        });
    }

    /// An upload's admission reads the study's view: a fold holding the study's
    /// lock (here the test holds it) does not keep it waiting, its stream unread.
    /// Past the deadline, not yet applied, it asks the study itself, and is
    /// refused as the study then decides; once applied, the view says so too.
    #[test]
    fn an_upload_is_admitted_without_waiting_behind_a_fold() {
        let (_dir, clock, svc) = on_manual_clock();
        let up = Upload {
            study_id: "s1".into(),
            owner: "a".into(),
            cid: "c".into(),
            cap: (10.0, 1e-3),
            count: None,
        };
        rt().block_on(async {
            let busy = svc.lock_study("s1").await.expect("lock");
            let admitted = tokio::time::timeout(Duration::from_secs(5), svc.admit(&up))
                .await
                .expect("the admission waited for the study's lock");
            assert!(matches!(admitted, Ok(Admission::Read { .. })));
            clock.advance(Duration::from_secs(60));
            let late = tokio::time::timeout(Duration::from_millis(300), svc.admit(&up)).await;
            assert!(late.is_err(), "admitted off a view past its deadline");
            drop(busy);
            let refused = svc
                .admit(&up)
                .await
                .err()
                .expect("admitted past the deadline");
            assert!(refused.to_string().contains("deadline passed"), "{refused}");
            // Applied, to the view too: read off it again, whoever holds the lock.
            let _busy = svc.lock_study("s1").await.expect("lock");
            let again = tokio::time::timeout(Duration::from_secs(5), svc.admit(&up))
                .await
                .expect("the admission waited for the lock of a study its deadline closed");
            assert!(again.is_err(), "admitted to a closed study");
        });
    }

    /// A study its deadline closes keeps no owner's ciphertexts one by one: the
    /// deadline ticker stores the transition, which multiplies the contributions
    /// stored on their own into the stored aggregate and deletes them.
    #[test]
    fn a_deadline_folds_away_the_contributions_stored_one_by_one() {
        use dpca_common::arith::Elem;
        use rand::SeedableRng;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let mut s = study(2, 1);
        s.spec = SpecDraft {
            deadline_unix_ms: 70_000,
            ..s.spec.to_draft()
        }
        .validate()
        .expect("spec");
        let pk = s.spec.public_key.clone();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
        let cts: Vec<Elem> = (0..s.layout.owner_ciphertexts())
            .map(|i| {
                let c = pk.encrypt(&(i as u64).into(), &mut rng).expect("enc");
                pk.ring().elem(&c.0)
            })
            .collect();
        {
            let store = Store::open(&path).expect("store");
            store.save_study(&s).expect("save");
            s.contribute("a", "a", &cts, |x, y| pk.ring().mul_elem(x, y))
                .expect("contribute");
            store
                .save_contribution(&s, "a", &cts, None)
                .expect("save contribution");
            assert!(
                store.has_pending("s1"),
                "one owner's ciphertexts on their own"
            );
        }
        let clock = Arc::new(crate::world::ManualClock::at(10_000));
        let svc = ProxyService::new(ProxyConfig {
            clock: Arc::clone(&clock) as Arc<dyn crate::world::Clock>,
            ..config(&path, false)
        })
        .expect("service");
        let store = svc.store.clone().expect("a store");
        rt().block_on(async {
            svc.spawn_deadline_ticker();
            clock.advance(Duration::from_secs(61));
            for _ in 0..100 {
                tokio::time::sleep(POLL).await;
                if !store.has_pending("s1") {
                    break;
                }
            }
        });
        assert!(!store.has_pending("s1"), "ciphertexts left one by one");
        drop((svc, store));
        let loaded = reloaded(&path);
        assert_eq!(loaded[0].phase.name(), "sealed");
        assert_eq!(loaded[0].aggregate(), s.aggregate());
    }

    /// Opens sent at once cannot all pass the count of open studies: the count
    /// and the insertion are one step. The writes are held back until every call
    /// has been counted, as a slow disk would.
    #[test]
    // The held lock is the point: the opens' writes wait on it on other threads.
    #[allow(clippy::await_holding_lock)]
    fn opens_sent_at_once_do_not_pass_the_open_study_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc = ProxyService::new(ProxyConfig {
            limits: crate::limits::Limits {
                max_open_studies: 2,
                ..crate::limits::Limits::default()
            },
            ..config(&dir.path().join("state.redb"), false)
        })
        .expect("service");
        let s = study(2, 1);
        let spec = SpecDraft {
            deadline_unix_ms: crate::world::Clock::now_ms(&crate::world::SystemClock) + 3_600_000,
            ..s.spec.to_draft()
        }
        .validate()
        .expect("spec");
        let wire = spec_to_wire(&spec);
        let store = svc.store.clone().expect("a store");
        let opened = rt().block_on(async {
            let held = store.hold_writes();
            let mut calls = tokio::task::JoinSet::new();
            for _ in 0..6 {
                let (svc, wire) = (svc.clone(), wire.clone());
                calls.spawn(async move {
                    use v1::proxy_server::Proxy;
                    svc.open_study(Request::new(v1::OpenStudyRequest {
                        spec: Some(wire),
                        noise_free_for_testing: false,
                    }))
                    .await
                    .is_ok()
                });
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
            calls.join_all().await.into_iter().filter(|ok| *ok).count()
        });
        assert_eq!(opened, 2, "opened past the limit of 2");
    }

    /// A user that opens study after study, each ending at once, holds no more
    /// than its newest ended ones (here 2) beside the one it opens, in memory and
    /// in the state file: before, every ended study stayed in both for good.
    #[test]
    fn a_user_keeps_only_its_newest_ended_studies() {
        use v1::proxy_server::Proxy;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let clock = Arc::new(crate::world::ManualClock::at(10_000));
        let config = ProxyConfig {
            clock: Arc::clone(&clock) as Arc<dyn crate::world::Clock>,
            limits: crate::limits::Limits {
                max_ended_studies_per_user: 2,
                ..crate::limits::Limits::default()
            },
            ..config(&path, false)
        };
        let svc = ProxyService::new(config.clone()).expect("service");
        // A spec whose deadline is a second past the clock's now.
        let spec_at = |clock: &dyn crate::world::Clock| {
            SpecDraft {
                deadline_unix_ms: clock.now_ms() + 1_000,
                ..study(2, 1).spec.to_draft()
            }
            .validate()
            .expect("spec")
        };
        let mut opened = Vec::new();
        for _ in 0..6 {
            let request = Request::new(v1::OpenStudyRequest {
                spec: Some(spec_to_wire(&spec_at(&*clock))),
                noise_free_for_testing: false,
            });
            let id = rt().block_on(svc.open_study(request)).expect("opened");
            opened.push(id.into_inner().study_id);
            // Its deadline passes with no owner in: aborted.
            clock.advance(Duration::from_secs(2));
        }
        let held = |svc: &ProxyService| {
            let mut ids: Vec<String> = svc.table().expect("table").keys().cloned().collect();
            ids.sort();
            ids
        };
        // The sixth study's open kept the newest two ended before it.
        let mut kept = opened[3..].to_vec();
        kept.sort();
        assert_eq!(held(&svc), kept, "in memory");
        let status = rt()
            .block_on(svc.status(Request::new(v1::StatusRequest::default())))
            .expect("status");
        assert_eq!(status.into_inner().studies.len(), 3, "in status");
        // A study busy at the open (here its lock held) is left for the next.
        clock.advance(Duration::from_secs(2));
        let busy = rt().block_on(svc.lock_study(&opened[3])).expect("lock");
        let request = Request::new(v1::OpenStudyRequest {
            spec: Some(spec_to_wire(&spec_at(&*clock))),
            noise_free_for_testing: false,
        });
        let id = rt().block_on(svc.open_study(request)).expect("opened");
        drop(busy);
        let mut kept = opened[3..].to_vec();
        kept.push(id.into_inner().study_id);
        kept.sort();
        assert_eq!(held(&svc), kept, "the busy one kept");
        drop(svc);
        let restarted = ProxyService::new(config).expect("restarted");
        assert_eq!(held(&restarted), kept, "in the state file");
    }

    /// A user's invitation lists sized every status answer: six studies inviting
    /// 3,000 ids of 250 bytes each passed the 4 MiB a client decodes, shutting the
    /// operator's `status` out while the user held them, and each status copied
    /// every list. The answer now names the first owners and counts the rest, and
    /// so does a deadline's abort.
    #[test]
    fn an_invitation_list_of_thousands_does_not_size_the_status() {
        use crate::study::NAMES_LISTED;
        use crate::world::Clock;
        use prost::Message;
        use v1::proxy_server::Proxy;
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(crate::world::ManualClock::at(10_000));
        let svc = ProxyService::new(ProxyConfig {
            clock: Arc::clone(&clock) as Arc<dyn crate::world::Clock>,
            ..config(&dir.path().join("state.redb"), false)
        })
        .expect("service");
        let invited: Vec<String> = (0..3000).map(|i| format!("{i:0>250}")).collect();
        let spec = SpecDraft {
            expected_owners: invited.clone(),
            deadline_unix_ms: clock.now_ms() + 1_000,
            ..study(2, 1).spec.to_draft()
        }
        .validate()
        .expect("spec");
        for _ in 0..6 {
            let request = Request::new(v1::OpenStudyRequest {
                spec: Some(spec_to_wire(&spec)),
                noise_free_for_testing: false,
            });
            rt().block_on(svc.open_study(request)).expect("opened");
        }
        let status = |svc: &ProxyService| {
            rt().block_on(svc.status(Request::new(v1::StatusRequest::default())))
                .expect("status")
                .into_inner()
        };
        let before = status(&svc);
        assert!(
            before.encoded_len() < 64 << 10,
            "a status of {} bytes",
            before.encoded_len()
        );
        assert_eq!(before.studies.len(), 6);
        for s in &before.studies {
            assert_eq!(
                (s.state.as_str(), s.owners_missing_count),
                ("collecting", 3000)
            );
            assert_eq!(s.owners_missing, invited[..NAMES_LISTED]);
        }
        // Past the deadline with no owner in: each aborts, its reason naming the
        // first missing owners and counting the rest.
        clock.advance(Duration::from_secs(2));
        let after = status(&svc);
        assert!(after.studies.iter().all(|s| s.state == "aborted"));
        for cell in svc.table().expect("table").values() {
            let Phase::Aborted(reason) = cell.view(clock.now_ms()).phase else {
                panic!("not aborted");
            };
            assert!(reason.len() < 8 << 10, "a reason of {} bytes", reason.len());
            assert!(reason.ends_with(" and 2984 more"), "{reason}");
        }
    }

    /// One computation of a study's release at a time: a `Release` that comes
    /// while another of the same study is under way (here held up at the write
    /// that stores it) is refused at once instead of computing the release
    /// again; a user that sent many at once made the proxy compute each (minutes
    /// of every core at M = 1000) only to throw all but one away when storing it.
    #[test]
    // The held lock is the point: the first release's write waits on it.
    #[allow(clippy::await_holding_lock)]
    fn a_release_being_computed_is_not_computed_again() {
        use v1::proxy_server::Proxy;
        fn request() -> Request<v1::ReleaseRequest> {
            Request::new(v1::ReleaseRequest {
                study_id: "s1".into(),
                count: None,
            })
        }
        let (_dir, svc) = sealed_dp_mean(2);
        let store = svc.store.clone().expect("a store");
        let s1 = "s1".to_string();
        let refused = two_threads().block_on(async {
            let writes = store.hold_writes();
            let first = tokio::spawn({
                let svc = svc.clone();
                async move { svc.release(request()).await }
            });
            releasing(&svc, 1).await;
            // The first now stores its release under the study's lock, held up
            // at the write: a second call that waited for that lock (to read who
            // may call) would wait as long.
            storing_under_lock(&svc).await;
            // Bounded: a second computation would wait for the held write too.
            let second = tokio::time::timeout(Duration::from_secs(5), svc.release(request()));
            let refused = second.await.expect("answered at once");
            drop(writes);
            first.await.expect("task").expect("the first release");
            refused.expect_err("computed a second time")
        });
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        assert!(refused.message().contains("being computed"), "{refused:?}");
        assert_eq!(phase_of(&svc), "released");
        assert_eq!(svc.releasing.held(&s1), 0, "the slot was given back");
    }

    /// `s1` released by `svc`, the call's refusal if it is refused.
    fn release_s1(svc: &ProxyService) -> Result<(), Status> {
        use v1::proxy_server::Proxy;
        let request = Request::new(v1::ReleaseRequest {
            study_id: "s1".into(),
            count: None,
        });
        rt().block_on(svc.release(request)).map(|_| ())
    }

    /// A state file put back from a copy taken while the study was sealed (an
    /// operator restoring a backup): the restarted proxy must not release the
    /// study again, which would be a second draw of noise on the same sums for
    /// the owners' one charge. The release journal beside the file is not put
    /// back with it.
    #[test]
    fn a_study_released_before_its_state_file_was_put_back_is_not_released_again() {
        let (dir, svc) = sealed_dp_mean(2);
        drop(svc);
        let path = dir.path().join("state.redb");
        let sealed = dir.path().join("sealed.redb");
        std::fs::copy(&path, &sealed).expect("copy");
        let svc = ProxyService::new(config(&path, false)).expect("restarts");
        release_s1(&svc).expect("released");
        drop(svc);
        std::fs::copy(&sealed, &path).expect("put back");
        let svc = ProxyService::new(config(&path, false)).expect("restarts");
        let refused = release_s1(&svc).expect_err("released again");
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(refused.message().contains("aborted"), "{refused:?}");
        // The user waiting for the seal is told why.
        use v1::proxy_server::Proxy;
        let waiting = Request::new(v1::AwaitSealRequest {
            study_id: "s1".into(),
        });
        let why = rt().block_on(svc.await_seal(waiting)).expect_err("sealed");
        assert!(why.message().contains("released before"), "{why:?}");
    }

    /// The same with a copy taken while the study still collected: the uploads
    /// after it are lost, and those sent again (in other ciphertexts) would make
    /// an aggregate of the same sums whose release is a second draw.
    #[test]
    fn a_study_released_after_a_copy_taken_while_it_collected_is_not_served_again() {
        let (dir, svc, cts) = collecting_with_features(Centering::DpMean, 2, 2);
        let commit = |svc: &ProxyService, owner: &str| {
            let counted = svc.commit_contribution(upload(owner), cts.clone(), None);
            two_threads().block_on(counted).expect("counted");
        };
        commit(&svc, "a");
        drop(svc);
        let path = dir.path().join("state.redb");
        let collecting = dir.path().join("collecting.redb");
        std::fs::copy(&path, &collecting).expect("copy");
        let svc = ProxyService::new(config(&path, false)).expect("restarts");
        commit(&svc, "b");
        release_s1(&svc).expect("released");
        drop(svc);
        std::fs::copy(&collecting, &path).expect("put back");
        let svc = ProxyService::new(config(&path, false)).expect("restarts");
        assert_eq!(phase_of(&svc), "aborted");
        let again = svc.commit_contribution(upload("b"), cts.clone(), None);
        let refused = two_threads().block_on(again).expect_err("counted again");
        assert!(refused.to_string().contains("released before"), "{refused}");
        // The abort is stored for good: `a`'s ciphertexts, stored one by one in
        // the copy, and the sums are gone from the file.
        let store = svc.store.clone().expect("a store");
        assert!(
            !store.has_pending("s1"),
            "an owner's ciphertexts left one by one"
        );
        drop((svc, store));
        let loaded = reloaded(&path);
        assert_eq!(loaded[0].phase.name(), "aborted");
        assert!(loaded[0].aggregate().is_empty(), "the sums kept");
    }

    /// A state file served with a release journal that is gone (deleted, moved,
    /// a volume not mounted) does not start the proxy: a journal started afresh
    /// would forget every release. `--new-release-journal` starts one anyway.
    #[test]
    fn a_proxy_whose_release_journal_is_gone_does_not_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        drop(ProxyService::new(config(&path, false)).expect("starts"));
        let journal = crate::release_journal::beside(&path);
        std::fs::remove_file(&journal).expect("the journal is there");
        let Err(err) = ProxyService::new(config(&path, false)) else {
            panic!("started with its journal gone");
        };
        assert!(err.to_string().contains("is missing"), "{err}");
        assert!(!journal.exists(), "started afresh");
        let name = |err: StoreError| match err {
            StoreError::Journal(crate::release_journal::JournalError::Missing {
                expected, ..
            }) => expected,
            other => panic!("{other}"),
        };
        let recorded = name(err);
        let replacing = |name: &str| ProxyConfig {
            replace_release_journal: Some(name.to_string()),
            ..config(&path, false)
        };
        let Err(err) = ProxyService::new(replacing("another")) else {
            panic!("replaced a journal the file does not record");
        };
        assert!(err.to_string().contains("another"), "{err}");
        drop(ProxyService::new(replacing(&recorded)).expect("a new journal, asked for"));
        drop(ProxyService::new(config(&path, false)).expect("and served with since"));
        // The flag acts once: left set, it no longer names the recorded journal.
        std::fs::remove_file(&journal).expect("the new journal is there");
        let Err(err) = ProxyService::new(replacing(&recorded)) else {
            panic!("the flag acted twice");
        };
        assert!(err.to_string().contains(&recorded), "{err}");
    }

    /// A release journaled whose write to the state file failed is not computed
    /// again, in this process or after a restart: closed rather than open.
    #[test]
    fn a_release_journaled_but_not_stored_is_not_computed_again() {
        let (dir, svc) = sealed_dp_mean(2);
        svc.store.as_ref().expect("a store").fail_next_commit();
        release_s1(&svc).expect_err("not stored");
        let refused = release_s1(&svc).expect_err("computed again");
        assert!(refused.message().contains("released before"), "{refused:?}");
        drop(svc);
        let svc =
            ProxyService::new(config(&dir.path().join("state.redb"), false)).expect("restarts");
        assert_eq!(phase_of(&svc), "aborted");
    }

    /// A release whose caller goes away while it is computed or stored is still
    /// stored, and its slot held until then: before, the computed release (minutes
    /// of every core at M = 1000) was thrown away with the call, its slot freed.
    #[test]
    // The held lock is the point: the release's write waits on it.
    #[allow(clippy::await_holding_lock)]
    fn a_release_whose_caller_goes_away_is_still_stored() {
        use v1::proxy_server::Proxy;
        let (_dir, svc) = sealed_dp_mean(2);
        let store = svc.store.clone().expect("a store");
        let s1 = "s1".to_string();
        two_threads().block_on(async {
            let writes = store.hold_writes();
            let caller = tokio::spawn({
                let svc = svc.clone();
                async move {
                    svc.release(Request::new(v1::ReleaseRequest {
                        study_id: "s1".into(),
                        count: None,
                    }))
                    .await
                }
            });
            releasing(&svc, 1).await;
            caller.abort();
            assert!(
                caller.await.is_err_and(|e| e.is_cancelled()),
                "the call went on"
            );
            assert_eq!(svc.releasing.held(&s1), 1, "the slot went with the call");
            drop(writes);
            releasing(&svc, 0).await;
        });
        assert_eq!(phase_of(&svc), "released");
        assert_eq!(svc.releasing.held(&s1), 0, "the slot was given back");
    }

    /// A service holding `s1` under `dp-mean`, sealed with two owners.
    fn sealed_dp_mean(features: usize) -> (tempfile::TempDir, ProxyService) {
        let (dir, svc, cts) = collecting_with_features(Centering::DpMean, 2, features);
        two_threads().block_on(async {
            for owner in ["a", "b"] {
                let counted = svc.commit_contribution(upload(owner), cts.clone(), None);
                counted.await.expect("counted");
            }
        });
        (dir, svc)
    }

    /// A `FetchResult` stream shares the stored release and encodes each chunk
    /// as it is read: before, each stream held the whole release encoded until
    /// its caller read it, so a user that opened its 128 streams and read none
    /// held 128 copies (about 2.6 GB at M = 1000 and 3072 bits).
    #[test]
    fn a_result_stream_holds_the_release_it_shares_not_a_copy() {
        use v1::proxy_server::Proxy;
        // Enough features for a release of several chunks.
        let (_dir, svc) = sealed_dp_mean(140);
        let runtime = two_threads();
        let release = Request::new(v1::ReleaseRequest {
            study_id: "s1".into(),
            count: None,
        });
        runtime.block_on(svc.release(release)).expect("released");
        let stored = || {
            let held = rt().block_on(svc.with_study("s1", |s| match &s.phase {
                Phase::Released(r) => Ok((Arc::clone(r), s.spec.public_key.clone())),
                other => panic!("phase {}", other.name()),
            }));
            held.expect("study")
        };
        let shared = || Arc::strong_count(&stored().0) - 2;
        let before = shared();
        let fetch = || {
            let req = Request::new(v1::FetchResultRequest {
                study_id: "s1".into(),
            });
            runtime.block_on(svc.fetch_result(req)).expect("fetch")
        };
        let unread: Vec<_> = (0..3).map(|_| fetch()).collect();
        assert_eq!(
            shared(),
            before + 3,
            "each unread stream shares the release"
        );
        // Read whole, a stream gives every ciphertext in order, in full chunks
        // but the last, the header on its first chunk only.
        let chunks: Vec<_> = runtime.block_on(fetch().into_inner().collect::<Vec<_>>());
        let chunks: Vec<v1::ResultChunk> = chunks.into_iter().map(|c| c.expect("chunk")).collect();
        let (release, pk) = stored();
        let total = release.ciphertexts.len();
        assert!(
            total > 2 * CIPHERTEXTS_PER_CHUNK,
            "{total}: three chunks at least"
        );
        assert_eq!(chunks.len(), total.div_ceil(CIPHERTEXTS_PER_CHUNK));
        assert_eq!(chunks[0].total_ciphertexts as usize, total);
        assert_eq!(chunks[0].n_owners, 2);
        assert!(chunks[1..]
            .iter()
            .all(|c| c.total_ciphertexts == 0 && c.n_owners == 0));
        let sent: Vec<&Vec<u8>> = chunks.iter().flat_map(|c| &c.ciphertexts).collect();
        let want: Vec<Vec<u8>> = release
            .ciphertexts
            .iter()
            .map(|c| pk.ciphertext_to_bytes(c))
            .collect();
        assert!(sent.iter().zip(&want).all(|(a, b)| *a == b) && sent.len() == total);
        drop((release, unread));
        assert_eq!(shared(), before);
    }

    /// A service holding the test study `s1` (quorum 8, so it keeps collecting),
    /// and fresh ciphertexts of a contribution to it.
    fn collecting_with_contribution() -> (tempfile::TempDir, ProxyService, Vec<Elem>) {
        collecting_with_quorum(8)
    }

    /// As [`collecting_with_contribution`], sealing at `quorum` owners.
    fn collecting_with_quorum(quorum: u32) -> (tempfile::TempDir, ProxyService, Vec<Elem>) {
        collecting_with_features(Centering::Mask, quorum, 2)
    }

    /// As [`collecting_with_quorum`], under `centering`, of `features` features.
    fn collecting_with_features(
        centering: Centering,
        quorum: u32,
        features: usize,
    ) -> (tempfile::TempDir, ProxyService, Vec<Elem>) {
        use rand::SeedableRng;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let mut s = crate::study::tests::study_with(centering, quorum, 1);
        let draft = s.spec.to_draft();
        s.spec = SpecDraft {
            deadline_unix_ms: u64::MAX,
            features: (0..features).map(|i| format!("f{i}")).collect(),
            bounds: vec![draft.bounds[0]; features],
            ..draft
        }
        .validate()
        .expect("spec");
        s.layout = StudyLayout::new(&s.spec).expect("layout");
        Store::open(&path)
            .expect("store")
            .save_study(&s)
            .expect("save");
        let pk = s.spec.public_key.clone();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let cts = (0..s.layout.owner_ciphertexts())
            .map(|i| {
                let c = pk.encrypt(&(i as u64).into(), &mut rng).expect("enc");
                pk.ring().elem(&c.0)
            })
            .collect();
        let svc = ProxyService::new(ProxyConfig {
            max_concurrent_uploads: 16,
            ..config(&path, false)
        })
        .expect("service");
        (dir, svc, cts)
    }

    fn upload(owner: &str) -> Upload {
        Upload {
            study_id: "s1".into(),
            owner: owner.into(),
            cid: format!("cid-{owner}"),
            cap: (10.0, 1e-3),
            count: None,
        }
    }

    /// Contributions that arrive while a commit is on its way to disk are
    /// folded meanwhile and written together by the next commit, each owner
    /// once; none waits for a commit of its own.
    #[test]
    // The held lock is the point: the writes queue behind it on other threads.
    #[allow(clippy::await_holding_lock)]
    fn contributions_arriving_during_a_commit_share_the_next_one() {
        let (dir, svc, cts) = collecting_with_contribution();
        let store = svc.store.clone().expect("a store");
        let before = store.commits();
        let owners: Vec<String> = (0..6).map(|i| format!("o{i}")).collect();
        let results = two_threads().block_on(async {
            let held = store.hold_writes();
            let mut calls = tokio::task::JoinSet::new();
            for o in &owners {
                let (svc, up, cts) = (svc.clone(), upload(o), cts.clone());
                calls.spawn(async move { svc.commit_contribution(up, cts, None).await });
            }
            // Every fold is done (the view counts them) while the first commit
            // is still held.
            folded(&svc, 6).await;
            drop(held);
            calls.join_all().await
        });
        for r in results {
            assert_eq!(r.expect("counted").0, ContributionOutcome::Counted);
        }
        let commits = store.commits() - before;
        assert!(commits <= 2, "{commits} commits for 6 contributions");
        drop((svc, store));
        let loaded = Store::open(&dir.path().join("state.redb"))
            .expect("reopen")
            .load_all()
            .expect("load");
        let mut counted = loaded[0].owners_in();
        counted.sort();
        assert_eq!(counted, owners);
    }

    /// A contribution whose commit failed was folded in memory already: the
    /// proxy then answers no call that changes or reports a stored state, not
    /// even the retry it would otherwise call "already counted", until a
    /// restart reloads the file, which does not hold it.
    #[test]
    fn after_a_failed_commit_nothing_is_acknowledged_until_a_restart() {
        let (dir, svc, cts) = collecting_with_contribution();
        let store = svc.store.clone().expect("a store");
        store.fail_next_commit();
        let rt = rt();
        let first = rt.block_on(svc.commit_contribution(upload("a"), cts.clone(), None));
        assert!(matches!(first, Err(Refusal::Unavailable(_))), "{first:?}");
        let retry = rt.block_on(svc.commit_contribution(upload("a"), cts.clone(), None));
        assert!(
            matches!(retry, Err(Refusal::Unavailable(_))),
            "a retry acknowledged a contribution not on disk: {retry:?}"
        );
        let admitted = rt.block_on(svc.admit(&upload("a")));
        assert!(
            matches!(admitted, Err(Refusal::Unavailable(_))),
            "a retry answered \"already counted\" at admission: {}",
            admitted.is_ok()
        );
        let other = rt.block_on(svc.commit_contribution(upload("b"), cts.clone(), None));
        assert!(matches!(other, Err(Refusal::Unavailable(_))), "{other:?}");
        drop((svc, store));
        let restarted =
            ProxyService::new(config(&dir.path().join("state.redb"), false)).expect("restart");
        let again = rt
            .block_on(restarted.commit_contribution(upload("a"), cts, None))
            .expect("stored after the restart");
        assert_eq!(again.0, ContributionOutcome::Counted);
        let spent = restarted
            .budget_of("a")
            .expect("budgets")
            .expect("a's budget");
        assert_eq!(spent.studies, vec!["s1".to_string()], "charged once");
    }

    fn two_threads() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// Waits (5 s at most) until `held` computations of `s1`'s release hold its
    /// slot.
    async fn releasing(svc: &ProxyService, held: usize) {
        for _ in 0..500 {
            if svc.releasing.held(&"s1".to_string()) == held {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `s1`'s lock has been held for 100 ms on end (a transition
    /// under it, held up at its write; a short read under it would not last).
    async fn storing_under_lock(svc: &ProxyService) {
        let cell = svc.cell("s1").expect("s1");
        let mut held_for = 0;
        for _ in 0..1000 {
            held_for = match cell.try_lock() {
                Some(_) => 0,
                None => held_for + 1,
            };
            if held_for == 10 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the study's lock was never held on end");
    }

    /// Waits until `s1`'s view counts `owners` owners (the fold is done).
    async fn folded(svc: &ProxyService, owners: usize) {
        for _ in 0..500 {
            if svc.studies.lock().expect("table")["s1"]
                .view(0)
                .owners_in()
                .len()
                == owners
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never folded");
    }

    /// Owner `a`'s contribution to `s1` (sealing at `quorum`), folded, with its
    /// commit held and bound to fail; then `answer`, started once the fold is
    /// done. Returns whether `answer` had finished after `patience` while the
    /// commit was still held, the contribution's outcome, and `answer`'s.
    // The held lock is the point: the commit waits on it on another thread.
    #[allow(clippy::await_holding_lock)]
    fn behind_a_failing_commit<T, F>(
        quorum: u32,
        patience: Duration,
        answer: impl FnOnce(ProxyService) -> F,
    ) -> (bool, Result<FoldOutcome, Refusal>, T)
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + Send + 'static,
    {
        let (_dir, svc, cts) = collecting_with_quorum(quorum);
        let store = svc.store.clone().expect("a store");
        store.fail_next_commit();
        two_threads().block_on(async {
            let held = store.hold_writes();
            let first = tokio::spawn({
                let svc = svc.clone();
                async move { svc.commit_contribution(upload("a"), cts, None).await }
            });
            folded(&svc, 1).await;
            let second = tokio::spawn(answer(svc.clone()));
            tokio::time::sleep(patience).await;
            let early = second.is_finished();
            drop(held);
            let first = first.await.expect("task");
            (early, first, second.await.expect("task"))
        })
    }

    /// A retry that memory calls "already counted" is answered only once the
    /// commit that holds the first upload is durable: here that commit fails,
    /// so the retry is told to come back, not that it was counted.
    #[test]
    fn a_retry_is_answered_only_once_the_commit_before_it_is_durable() {
        let patience = Duration::from_millis(200);
        let (early, first, retry) = behind_a_failing_commit(8, patience, |svc| async move {
            svc.admit(&upload("a")).await.map(|_| ())
        });
        assert!(
            !early,
            "the retry was answered while the commit it rests on was in flight"
        );
        assert!(matches!(first, Err(Refusal::Unavailable(_))), "{first:?}");
        assert!(matches!(retry, Err(Refusal::Unavailable(_))), "{retry:?}");
    }

    /// The seal a contribution makes in memory is announced to the user only once
    /// that contribution is durable; if its commit fails, the user is told to
    /// come back, not handed a sealed set a restart would not have.
    #[test]
    fn a_seal_is_announced_only_once_the_contribution_that_made_it_is_durable() {
        use v1::proxy_server::Proxy;
        let patience = Duration::from_millis(300);
        let (early, first, seal) = behind_a_failing_commit(1, patience, |svc| async move {
            let req = Request::new(v1::AwaitSealRequest {
                study_id: "s1".into(),
            });
            svc.await_seal(req).await.map(|_| ())
        });
        assert!(
            !early,
            "the seal was announced while the contribution that made it was in flight"
        );
        assert!(first.is_err());
        let seal = seal.expect_err("a seal not on disk");
        assert_eq!(seal.code(), tonic::Code::Unavailable, "{seal:?}");
    }

    /// Only a refusal read off the studies or budgets waits for the writes before
    /// it; one of the request itself (its certificate, bytes, pace, a second
    /// upload at once) is answered at once, so refusals cannot be used to make
    /// the proxy wait on its disk.
    #[test]
    fn only_refusals_read_off_the_state_wait_for_the_disk() {
        for (status, waits) in [
            (Status::failed_precondition("closed"), true),
            (Status::already_exists("twice"), true),
            (Status::not_found("unknown study"), true),
            (Status::invalid_argument("bad ciphertext"), false),
            (Status::permission_denied("not invited"), false),
            (Status::unauthenticated("no certificate"), false),
            (Status::unavailable("one upload at a time"), false),
            (Status::deadline_exceeded("too slow"), false),
            (Status::resource_exhausted("over a limit"), false),
        ] {
            assert_eq!(rests_on_state(&status), waits, "{status:?}");
        }
    }
}
