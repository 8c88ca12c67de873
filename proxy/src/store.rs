//! The proxy's durable state: one redb database file. A study is a record (spec,
//! who opened it, phase, release), one row per counted owner (its contribution id
//! and signed count), and its aggregate: the running product as of the last
//! checkpoint, plus the ciphertexts of the contributions counted since, each kept
//! as it arrived until the next checkpoint multiplies it in.
//!
//! Every transition is written in one transaction and committed with
//! `Durability::Immediate` (fsync) *before* the service answers, so an acknowledged
//! contribution survives a SIGKILL at any moment. Writes go through a group commit
//! ([`crate::group_commit`]): those submitted while a commit is on its way to disk
//! share the next one, in the order submitted, so redb's fixed cost per commit
//! (tens of KB of pages and an fsync) is paid once per batch, not per owner; after
//! a failed commit nothing more is written until a restart. A contribution's row, its
//! ciphertexts and its owner's budget are written together, and a checkpoint writes
//! the aggregate, marks the owners it holds and deletes their ciphertexts together,
//! so after a restart each counted owner is in the aggregate exactly once and its
//! retry is recognised by its contribution id.
//!
//! What one contribution writes stays near its own size, whatever the number of
//! owners: its ciphertexts, or, every [`CHECKPOINT_EVERY`]th time (and when the
//! study leaves collecting), the aggregate in their place, which is the same size;
//! never the whole study. Values are cut into slices just under 16 KiB, because
//! redb gives a value larger than a page a power-of-two run of pages: one value of
//! a whole contribution would cost up to twice its size, and a slice of 16 KiB
//! leaves at most one partly filled run per contribution, of at most 16 KiB.
//!
//! A release is stored before it is served, so a restart serves the same noise
//! rather than fresh noise (which would let the user average two releases).
//! Deadline transitions follow from the stored contributors and the spec's
//! deadline and are re-applied on load; they are stored only where a study its
//! deadline closed still has contributions stored one by one (the service's
//! deadline ticker does it), so those are multiplied into its aggregate and
//! deleted: single owners' ciphertexts stay in the file only while a study
//! collects, at most [`CHECKPOINT_EVERY`] less one of them. (Deleted values
//! stay in pages redb has freed until it reuses them, as old aggregates did.)
//!
//! An ended study is deleted whole, record and rows, once its user has opened
//! enough newer ones ([`Store::drop_studies`]; the rule is `Limits::ended_to_drop`).
//!
//! redb locks the file: a second proxy on the same state refuses to start.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dpca_common::arith::Elem;
use dpca_common::dp::Centering;
use dpca_common::owner_budget::OwnerBudget;
use dpca_common::paillier::PublicKey;
use dpca_common::study::{StudyLayout, StudySpec, LAYOUT_VERSION};
use dpca_proto::convert::{spec_to_wire, stored_spec_from_wire};
use dpca_proto::v1;
use prost::Message;
use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

pub use crate::group_commit::Ticket;
use crate::group_commit::{GroupCommit, Stopped};
use crate::study::{Phase, Released, SignedCount, Study};

/// Study id -> encoded [`v1::StoredStudy`], rewritten when the phase changes and
/// at each checkpoint.
const STUDIES: TableDefinition<&str, &[u8]> = TableDefinition::new("studies");

/// (study, owner) -> encoded [`v1::StoredContributor`], one per counted owner.
const CONTRIBUTORS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("contributors");

/// (study, owner, slice) -> ciphertexts of a contribution not yet in the checkpoint.
const PENDING: TableDefinition<(&str, &str, u32), &[u8]> = TableDefinition::new("pending");

/// (study, slice) -> the aggregate as of the study's last checkpoint.
const AGGREGATES: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("aggregates");

/// Owner id -> encoded [`v1::StoredBudget`].
const BUDGETS: TableDefinition<&str, &[u8]> = TableDefinition::new("budgets");
/// What the file records of how it is served: the name of its release journal
/// under [`RELEASE_JOURNAL`].
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

/// Study id -> `StoredHeldStudy`: the studies whose mask seeds this proxy
/// holds for another ([`crate::holder`]).
const HELD: TableDefinition<&str, &[u8]> = TableDefinition::new("held");
/// [`META`]'s key of the release journal's name ([`crate::release_journal`]).
const RELEASE_JOURNAL: &str = "release_journal";

/// The record format this proxy writes and reads.
const FORMAT: u32 = 2;

/// Contributions of a collecting study stored on their own before a checkpoint
/// multiplies them into the stored aggregate: a restart re-multiplies at most this
/// many less one, and the disk holds at most this many contributions per study.
pub const CHECKPOINT_EVERY: usize = 8;

/// How long a commit waits for contributions being read when it starts: the
/// most an acknowledgment is delayed so that uploads arriving together share
/// a commit (each commit costs redb tens of KB of pages besides the values).
pub const COMMIT_LINGER: std::time::Duration = std::time::Duration::from_millis(5);

/// Largest stored value: with its key and the page header it fits 16 KiB of pages.
const SLICE_BYTES: usize = 16 * 1024 - 256;

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed (I/O, locked by another proxy, corrupt file).
    #[error("state database {}: {source}", path.display())]
    Database {
        /// The database file.
        path: PathBuf,
        /// redb's error.
        source: Box<redb::Error>,
    },
    /// A stored record does not decode into a valid study (or budget).
    #[error("state database {}: `{key}`: {reason}", path.display())]
    Record {
        /// The database file.
        path: PathBuf,
        /// The record's key (a study id or an owner id).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The release journal kept beside the database could not be opened or
    /// written.
    #[error(transparent)]
    Journal(#[from] crate::release_journal::JournalError),
    /// An earlier commit failed: nothing more is written until a restart reloads
    /// the file (what memory holds may rest on the write that failed).
    #[error("state database {}: {cause}", path.display())]
    Stopped {
        /// The database file.
        path: PathBuf,
        /// The first failure.
        cause: Stopped,
    },
}

/// Study id -> owners whose ciphertexts are stored but not in the checkpoint.
type PendingMap = HashMap<String, BTreeSet<String>>;

/// One write, applied in the order submitted.
enum Write {
    /// A study's record after a transition other than a contribution.
    Study(Study),
    /// A counted contribution and its owner's charged budget.
    Contribution {
        study: Study,
        owner: String,
        cts: Vec<Elem>,
        budget: Option<OwnerBudget>,
    },
    /// Ended studies dropped whole ([`Store::drop_studies`]).
    Drop(Vec<String>),
    /// A held study's record, whole ([`Store::save_held`]).
    Held(String, Vec<u8>),
    /// Held studies dropped ([`Store::drop_held`]).
    DropHeld(Vec<String>),
    /// Nothing: done once everything before it is durable.
    Barrier,
}

/// A contribution on its way: see [`Store::announce`].
pub struct Announced {
    store: Arc<Store>,
    submitted: bool,
}

impl Drop for Announced {
    fn drop(&mut self) {
        if !self.submitted {
            self.store.queue.withdraw();
        }
    }
}

/// The open state database.
pub struct Store {
    db: Database,
    path: PathBuf,
    checkpoint_every: usize,
    /// As of the last commit.
    pending: Mutex<PendingMap>,
    /// The studies whose stored record says collecting, as of the last commit
    /// (and of loading): a deadline's seal or abort, made in memory by the
    /// clock, is not stored until something writes the record.
    collecting: Mutex<BTreeSet<String>>,
    queue: GroupCommit<Write>,
    commits: AtomicU64,
    #[cfg(test)]
    fail_next_commit: std::sync::atomic::AtomicBool,
    #[cfg(test)]
    write_gate: Mutex<()>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens `path`, creating an empty database if it does not exist.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, CHECKPOINT_EVERY)
    }

    /// [`Store::open`] with a checkpoint every `checkpoint_every` contributions.
    pub fn open_with(path: &Path, checkpoint_every: usize) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(|e| db_error(path, e))?;
        let store = Self {
            db,
            path: path.to_path_buf(),
            checkpoint_every: checkpoint_every.max(1),
            pending: Mutex::default(),
            collecting: Mutex::default(),
            queue: GroupCommit::new(COMMIT_LINGER),
            commits: AtomicU64::new(0),
            #[cfg(test)]
            fail_next_commit: Default::default(),
            #[cfg(test)]
            write_gate: Mutex::default(),
        };
        // Create the tables up front so reads of a fresh file find them.
        let txn = store.db.begin_write().map_err(|e| store.err(e))?;
        txn.open_table(STUDIES).map_err(|e| store.err(e))?;
        txn.open_table(CONTRIBUTORS).map_err(|e| store.err(e))?;
        txn.open_table(PENDING).map_err(|e| store.err(e))?;
        txn.open_table(AGGREGATES).map_err(|e| store.err(e))?;
        txn.open_table(BUDGETS).map_err(|e| store.err(e))?;
        txn.open_table(META).map_err(|e| store.err(e))?;
        txn.open_table(HELD).map_err(|e| store.err(e))?;
        txn.commit().map_err(|e| store.err(e))?;
        store.migrate_format_1()?;
        let pending = store.read_pending_owners()?;
        *lock(&store.pending) = pending;
        Ok(store)
    }

    /// Moves the contributors and aggregate of every format-1 record (one record
    /// per study, rewritten whole at each contribution) into rows of their own,
    /// in one transaction: a proxy upgraded mid-study carries on, and the owners'
    /// budgets, stored alike in both formats, are kept. The moved ciphertexts are
    /// checked when the study is loaded, as any stored ones.
    fn migrate_format_1(&self) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        let mut moved = 0;
        {
            let mut studies = txn.open_table(STUDIES).map_err(|e| self.err(e))?;
            let mut old = Vec::new();
            for entry in studies.iter().map_err(|e| self.err(e))? {
                let (key, value) = entry.map_err(|e| self.err(e))?;
                // A record this build cannot read is left as it is: loading
                // names it and serves the other studies (`load_readable`).
                if let Some(moving) = format_1_width(value.value()) {
                    old.push((key.value().to_string(), moving));
                }
            }
            let mut rows = txn.open_table(CONTRIBUTORS).map_err(|e| self.err(e))?;
            let mut aggregates = txn.open_table(AGGREGATES).map_err(|e| self.err(e))?;
            for (key, (mut rec, width)) in old {
                for row in std::mem::take(&mut rec.legacy_contributors) {
                    let bytes = row.encode_to_vec();
                    rows.insert((key.as_str(), row.owner_id.as_str()), bytes.as_slice())
                        .map_err(|e| self.err(e))?;
                }
                let aggregate = std::mem::take(&mut rec.legacy_aggregate);
                let per_slice = (SLICE_BYTES / width).max(1);
                for (i, part) in aggregate.chunks(per_slice).enumerate() {
                    let mut slice = Vec::with_capacity(part.len() * width);
                    for c in part {
                        // Fixed width, as format 1 wrote them (left-padded if not;
                        // one too long is refused when the study is loaded).
                        slice.resize(slice.len() + width.saturating_sub(c.len()), 0);
                        slice.extend_from_slice(c);
                    }
                    aggregates
                        .insert((key.as_str(), i as u32), slice.as_slice())
                        .map_err(|e| self.err(e))?;
                }
                rec.format = FORMAT;
                let bytes = rec.encode_to_vec();
                studies
                    .insert(key.as_str(), bytes.as_slice())
                    .map_err(|e| self.err(e))?;
                moved += 1;
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        if moved > 0 {
            tracing::info!(studies = moved, "state records moved to format {FORMAT}");
        }
        Ok(())
    }

    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_error(&self.path, e)
    }

    /// The error of a stored record under `key` that does not decode.
    pub fn record_error(&self, key: &str, reason: String) -> StoreError {
        StoreError::Record {
            path: self.path.clone(),
            key: key.to_string(),
            reason,
        }
    }

    /// Writes `study`'s record after a transition other than a contribution
    /// (opened, released, or found sealed or aborted by its deadline with
    /// contributions still stored one by one) and waits until it is on disk, with
    /// every write submitted before it. Past collecting, it also checkpoints the
    /// aggregate, deleting those: no contribution can follow.
    pub fn save_study(&self, study: &Study) -> Result<(), StoreError> {
        // Its caller holds the study's lock: an upload of that study could not
        // submit while the commit lingered for it.
        let ticket = self.submit(Write::Study(study.clone()))?;
        self.wait_with(ticket, false)
    }

    /// Stores a counted contribution and waits until it is on disk: see
    /// [`Store::submit_contribution`].
    pub fn save_contribution(
        &self,
        study: &Study,
        owner: &str,
        cts: &[Elem],
        budget: Option<&OwnerBudget>,
    ) -> Result<(), StoreError> {
        let budget = budget.cloned();
        let ticket =
            self.submit_contribution(None, study.clone(), owner.to_string(), cts.to_vec(), budget)?;
        self.wait(ticket)
    }

    /// Queues a counted contribution: `study` as it is with `owner` counted (its
    /// aggregate multiplied by `cts`), and the owner's charged budget, to be
    /// written in one transaction after every write submitted before it. It is
    /// durable once [`Store::wait`] returns for the ticket; a contribution and its
    /// charge are stored together or not at all.
    /// `announced`, if given, is the announcement of this write.
    pub fn submit_contribution(
        &self,
        announced: Option<Announced>,
        study: Study,
        owner: String,
        cts: Vec<Elem>,
        budget: Option<OwnerBudget>,
    ) -> Result<Ticket, StoreError> {
        let write = Write::Contribution {
            study,
            owner,
            cts,
            budget,
        };
        match announced {
            Some(mut a) => {
                a.submitted = true;
                self.queue.submit_announced(write)
            }
            None => self.queue.submit(write),
        }
        .map_err(|s| self.stopped_error(s))
    }

    /// Announces a contribution being read, which a commit starting meanwhile
    /// lingers for (up to [`COMMIT_LINGER`]); dropping the announcement
    /// unsubmitted withdraws it.
    pub fn announce(self: &Arc<Self>) -> Announced {
        self.queue.announce();
        Announced {
            store: Arc::clone(self),
            submitted: false,
        }
    }

    /// Waits until the ticket's write is on disk, committing it (with whatever
    /// else is queued) if no other caller is committing now.
    pub fn wait(&self, ticket: Ticket) -> Result<(), StoreError> {
        self.wait_with(ticket, true)
    }

    fn wait_with(&self, ticket: Ticket, linger: bool) -> Result<(), StoreError> {
        let commit = |jobs| self.write_batch(jobs).map_err(|e| e.to_string());
        match linger {
            true => self.queue.wait(ticket, commit),
            false => self.queue.wait_now(ticket, commit),
        }
        .map_err(|s| self.stopped_error(s))
    }

    /// Queues the deletion of studies `ids`, whole: each record, its owners' rows,
    /// its aggregate and any contribution stored on its own. Durable with the next
    /// write waited for; a study whose deletion a crash loses is loaded again and
    /// can be dropped again.
    pub fn drop_studies(&self, ids: Vec<String>) -> Result<(), StoreError> {
        self.submit(Write::Drop(ids)).map(drop)
    }

    /// Writes a held study's `record` (a `StoredHeldStudy`) and waits until it
    /// is on disk, with every write submitted before it.
    pub fn save_held(&self, id: &str, record: Vec<u8>) -> Result<(), StoreError> {
        let ticket = self.submit(Write::Held(id.to_string(), record))?;
        self.wait_with(ticket, false)
    }

    /// Queues the deletion of held studies `ids` (durable with the next write
    /// waited for).
    pub fn drop_held(&self, ids: Vec<String>) -> Result<(), StoreError> {
        self.submit(Write::DropHeld(ids)).map(drop)
    }

    /// Every held study's record, by id.
    pub fn load_held(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(HELD).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            out.push((key.value().to_string(), value.value().to_vec()));
        }
        Ok(out)
    }

    /// Waits until every write submitted so far is on disk: what a caller was
    /// shown in memory (a contribution already counted) is then also durable.
    pub fn barrier(&self) -> Result<(), StoreError> {
        let ticket = self.submit(Write::Barrier)?;
        self.wait_with(ticket, false)
    }

    /// Whether every write submitted so far is durable (and none failed).
    pub fn settled_now(&self) -> bool {
        self.queue.settled_now()
    }

    /// Whether a commit has failed: nothing more is written until a restart.
    pub fn stopped(&self) -> bool {
        self.queue.stopped()
    }

    /// Commits made so far (each holds one or more writes).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    fn submit(&self, write: Write) -> Result<Ticket, StoreError> {
        self.queue.submit(write).map_err(|s| self.stopped_error(s))
    }

    fn stopped_error(&self, cause: Stopped) -> StoreError {
        StoreError::Stopped {
            path: self.path.clone(),
            cause,
        }
    }

    /// Writes `jobs` in their order in one transaction and commits it; the
    /// pending map follows only once the commit succeeded.
    fn write_batch(&self, jobs: Vec<Write>) -> Result<(), StoreError> {
        if jobs.iter().all(|j| matches!(j, Write::Barrier)) {
            return Ok(());
        }
        #[cfg(test)]
        let _gate = self.write_gate.lock();
        let started = std::time::Instant::now();
        // Only a commit's leader changes the map, one at a time: a copy now, put
        // back once committed, keeps `has_pending` from waiting on the fsync.
        let mut next = lock(&self.pending).clone();
        let mut collecting = lock(&self.collecting).clone();
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        for job in &jobs {
            stored_phases(job, &mut collecting);
            match job {
                Write::Study(study) => self.put_study(&txn, study, &mut next)?,
                Write::Contribution {
                    study,
                    owner,
                    cts,
                    budget,
                } => self.put_contribution(&txn, study, owner, cts, budget.as_ref(), &mut next)?,
                Write::Drop(ids) => {
                    for id in ids {
                        self.delete_study(&txn, id, &mut next)?;
                    }
                }
                Write::Held(id, record) => {
                    let mut table = txn.open_table(HELD).map_err(|e| self.err(e))?;
                    table
                        .insert(id.as_str(), record.as_slice())
                        .map_err(|e| self.err(e))?;
                }
                Write::DropHeld(ids) => {
                    let mut table = txn.open_table(HELD).map_err(|e| self.err(e))?;
                    for id in ids {
                        table.remove(id.as_str()).map_err(|e| self.err(e))?;
                    }
                }
                Write::Barrier => {}
            }
        }
        #[cfg(test)]
        if self.fail_next_commit.swap(false, Ordering::SeqCst) {
            return Err(self.err(redb::Error::Io(std::io::Error::other("injected failure"))));
        }
        txn.commit().map_err(|e| self.err(e))?;
        *lock(&self.pending) = next;
        *lock(&self.collecting) = collecting;
        self.commits.fetch_add(1, Ordering::Relaxed);
        crate::metrics::store_commit(jobs.len(), started.elapsed());
        Ok(())
    }

    fn put_study(
        &self,
        txn: &WriteTransaction,
        study: &Study,
        pending: &mut PendingMap,
    ) -> Result<(), StoreError> {
        self.write_record(txn, study)?;
        if !matches!(study.phase, Phase::Collecting) {
            let waiting = pending.remove(&study.id).unwrap_or_default();
            self.write_checkpoint(txn, study, &waiting)?;
        }
        Ok(())
    }

    fn put_contribution(
        &self,
        txn: &WriteTransaction,
        study: &Study,
        owner: &str,
        cts: &[Elem],
        budget: Option<&OwnerBudget>,
        pending: &mut PendingMap,
    ) -> Result<(), StoreError> {
        let id = study.id.as_str();
        let waiting = pending.get(id).map_or(0, BTreeSet::len);
        let checkpoint =
            waiting + 1 >= self.checkpoint_every || !matches!(study.phase, Phase::Collecting);
        {
            let mut rows = txn.open_table(CONTRIBUTORS).map_err(|e| self.err(e))?;
            let row = contributor_row(study, owner, !checkpoint).encode_to_vec();
            rows.insert((id, owner), row.as_slice())
                .map_err(|e| self.err(e))?;
        }
        if checkpoint {
            self.write_record(txn, study)?;
            let waiting = pending.remove(id).unwrap_or_default();
            self.write_checkpoint(txn, study, &waiting)?;
        } else {
            let mut table = txn.open_table(PENDING).map_err(|e| self.err(e))?;
            for (i, slice) in slices(&study.spec.public_key, cts).iter().enumerate() {
                table
                    .insert((id, owner, i as u32), slice.as_slice())
                    .map_err(|e| self.err(e))?;
            }
            pending
                .entry(id.to_string())
                .or_default()
                .insert(owner.to_string());
        }
        if let Some(b) = budget {
            let rec = budget_to_record(b).encode_to_vec();
            let mut table = txn.open_table(BUDGETS).map_err(|e| self.err(e))?;
            table
                .insert(owner, rec.as_slice())
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Holds every commit back while the guard lives (a commit takes this lock
    /// first): lets a test line writes up behind a slow commit.
    #[cfg(test)]
    pub(crate) fn hold_writes(&self) -> MutexGuard<'_, ()> {
        self.write_gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes the next commit fail as a full disk would.
    #[cfg(test)]
    pub(crate) fn fail_next_commit(&self) {
        self.fail_next_commit.store(true, Ordering::SeqCst);
    }

    /// Whether study `id`'s stored record says it collects (as of the last commit).
    pub fn stored_collecting(&self, id: &str) -> bool {
        lock(&self.collecting).contains(id)
    }

    /// Whether some contributions of study `id` are stored one by one, not yet in
    /// its stored aggregate.
    pub fn has_pending(&self, id: &str) -> bool {
        lock(&self.pending).get(id).is_some_and(|w| !w.is_empty())
    }

    fn write_record(&self, txn: &WriteTransaction, study: &Study) -> Result<(), StoreError> {
        let bytes = to_record(study).encode_to_vec();
        let mut table = txn.open_table(STUDIES).map_err(|e| self.err(e))?;
        table
            .insert(study.id.as_str(), bytes.as_slice())
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Replaces the stored aggregate by `study`'s, which holds the `waiting`
    /// owners' contributions: their rows are marked folded and their ciphertexts
    /// deleted, in the caller's transaction.
    fn write_checkpoint(
        &self,
        txn: &WriteTransaction,
        study: &Study,
        waiting: &BTreeSet<String>,
    ) -> Result<(), StoreError> {
        let id = study.id.as_str();
        let mut aggregates = txn.open_table(AGGREGATES).map_err(|e| self.err(e))?;
        aggregates
            .retain_in((id, 0)..=(id, u32::MAX), |_, _| false)
            .map_err(|e| self.err(e))?;
        for (i, slice) in slices(&study.spec.public_key, study.aggregate())
            .iter()
            .enumerate()
        {
            aggregates
                .insert((id, i as u32), slice.as_slice())
                .map_err(|e| self.err(e))?;
        }
        let mut pending = txn.open_table(PENDING).map_err(|e| self.err(e))?;
        let mut rows = txn.open_table(CONTRIBUTORS).map_err(|e| self.err(e))?;
        for owner in waiting {
            let o = owner.as_str();
            pending
                .retain_in((id, o, 0)..=(id, o, u32::MAX), |_, _| false)
                .map_err(|e| self.err(e))?;
            let row = contributor_row(study, owner, false).encode_to_vec();
            rows.insert((id, o), row.as_slice())
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Deletes study `id`'s record and rows in the caller's transaction.
    fn delete_study(
        &self,
        txn: &WriteTransaction,
        id: &str,
        pending: &mut PendingMap,
    ) -> Result<(), StoreError> {
        let mut studies = txn.open_table(STUDIES).map_err(|e| self.err(e))?;
        studies.remove(id).map_err(|e| self.err(e))?;
        let mut rows = txn.open_table(CONTRIBUTORS).map_err(|e| self.err(e))?;
        let mut owners = Vec::new();
        for entry in rows.range((id, "")..).map_err(|e| self.err(e))? {
            let (key, _) = entry.map_err(|e| self.err(e))?;
            match key.value() {
                (study, owner) if study == id => owners.push(owner.to_string()),
                _ => break,
            }
        }
        let mut waiting = txn.open_table(PENDING).map_err(|e| self.err(e))?;
        for owner in &owners {
            let o = owner.as_str();
            rows.remove((id, o)).map_err(|e| self.err(e))?;
            waiting
                .retain_in((id, o, 0)..=(id, o, u32::MAX), |_, _| false)
                .map_err(|e| self.err(e))?;
        }
        let mut aggregates = txn.open_table(AGGREGATES).map_err(|e| self.err(e))?;
        aggregates
            .retain_in((id, 0)..=(id, u32::MAX), |_, _| false)
            .map_err(|e| self.err(e))?;
        pending.remove(id);
        Ok(())
    }

    /// The name of the release journal this file was last served with, if it
    /// was ever served with one.
    pub fn release_journal(&self) -> Result<Option<String>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(META).map_err(|e| self.err(e))?;
        let name = table.get(RELEASE_JOURNAL).map_err(|e| self.err(e))?;
        Ok(name.map(|n| n.value().to_string()))
    }

    /// Records that this file is served with the release journal `name`
    /// (at startup, before any other write).
    pub fn set_release_journal(&self, name: &str) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut table = txn.open_table(META).map_err(|e| self.err(e))?;
            table
                .insert(RELEASE_JOURNAL, name)
                .map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// Every owner's stored budget.
    pub fn load_budgets(&self) -> Result<HashMap<String, OwnerBudget>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(BUDGETS).map_err(|e| self.err(e))?;
        let mut out = HashMap::new();
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            let key = key.value().to_string();
            let rec = v1::StoredBudget::decode(value.value())
                .map_err(|e| self.record_error(&key, format!("undecodable budget record: {e}")))?;
            let budget = budget_from_record(rec).map_err(|e| self.record_error(&key, e))?;
            out.insert(key, budget);
        }
        Ok(out)
    }

    /// Every stored study, validated as on first arrival, its aggregate rebuilt
    /// from the checkpoint and the contributions stored since; the first record
    /// this build cannot read is an error.
    pub fn load_all(&self) -> Result<Vec<Study>, StoreError> {
        let loaded = self.load_readable()?;
        match loaded.unreadable.into_iter().next() {
            Some((key, reason)) => Err(self.record_error(&key, reason)),
            None => Ok(loaded.studies),
        }
    }

    /// [`Store::load_all`], with each study record this build cannot read (an
    /// undecodable or invalid record or row, a newer format) set aside rather
    /// than failing the whole load: one such study need not keep the proxy from
    /// serving every other. Nothing of a record set aside is changed or removed.
    /// A failure of the database itself is still an error.
    pub fn load_readable(&self) -> Result<Loaded, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(STUDIES).map_err(|e| self.err(e))?;
        let mut loaded = Loaded::default();
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            let key = key.value().to_string();
            let study = self.read_parts(&txn, &key).and_then(|parts| {
                from_record(&key, value.value(), parts).map_err(|r| self.record_error(&key, r))
            });
            let study = match study {
                Ok(study) => study,
                Err(StoreError::Record { reason, .. }) => {
                    loaded.unreadable.push((key, reason));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if matches!(study.phase, Phase::Collecting) {
                lock(&self.collecting).insert(key);
            }
            loaded.studies.push(study);
        }
        Ok(loaded)
    }

    /// Writes `bytes` as study `key`'s record, as it is: a record this build
    /// cannot read, for the tests of what loading makes of one.
    #[cfg(test)]
    pub(crate) fn put_raw_record(&self, key: &str, bytes: &[u8]) {
        let txn = self.db.begin_write().expect("write");
        txn.open_table(STUDIES)
            .expect("studies")
            .insert(key, bytes)
            .expect("record");
        txn.commit().expect("commit");
    }

    /// Writes `bytes` as owner `owner`'s contributor row of study `study`, as it
    /// is: a row this build cannot read, for the tests.
    #[cfg(test)]
    pub(crate) fn put_raw_contributor_row(&self, study: &str, owner: &str, bytes: &[u8]) {
        let txn = self.db.begin_write().expect("write");
        txn.open_table(CONTRIBUTORS)
            .expect("contributors")
            .insert((study, owner), bytes)
            .expect("row");
        txn.commit().expect("commit");
    }

    /// Study `key`'s record as stored, for the tests.
    #[cfg(test)]
    pub(crate) fn raw_record(&self, key: &str) -> Option<Vec<u8>> {
        let txn = self.db.begin_read().expect("read");
        let table = txn.open_table(STUDIES).expect("studies");
        let value = table.get(key).expect("get");
        value.map(|v| v.value().to_vec())
    }

    /// A study's rows besides its record, as stored.
    fn read_parts(&self, txn: &ReadTransaction, id: &str) -> Result<StoredParts, StoreError> {
        let rows = txn.open_table(CONTRIBUTORS).map_err(|e| self.err(e))?;
        let mut contributors = Vec::new();
        for entry in rows.range((id, "")..).map_err(|e| self.err(e))? {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            if key.value().0 != id {
                break;
            }
            let row = v1::StoredContributor::decode(value.value())
                .map_err(|e| self.record_error(id, format!("undecodable contributor row: {e}")))?;
            contributors.push(row);
        }
        let aggregates = txn.open_table(AGGREGATES).map_err(|e| self.err(e))?;
        let mut checkpoint = Vec::new();
        for entry in aggregates
            .range((id, 0)..=(id, u32::MAX))
            .map_err(|e| self.err(e))?
        {
            checkpoint.extend_from_slice(entry.map_err(|e| self.err(e))?.1.value());
        }
        let table = txn.open_table(PENDING).map_err(|e| self.err(e))?;
        let mut pending = BTreeMap::new();
        for row in contributors.iter().filter(|r| r.pending) {
            let o = row.owner_id.as_str();
            let mut bytes = Vec::new();
            for entry in table
                .range((id, o, 0)..=(id, o, u32::MAX))
                .map_err(|e| self.err(e))?
            {
                bytes.extend_from_slice(entry.map_err(|e| self.err(e))?.1.value());
            }
            pending.insert(row.owner_id.clone(), bytes);
        }
        Ok(StoredParts {
            contributors,
            checkpoint,
            pending,
        })
    }

    /// Study id -> owners whose rows say their ciphertexts are pending.
    fn read_pending_owners(&self) -> Result<HashMap<String, BTreeSet<String>>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let rows = txn.open_table(CONTRIBUTORS).map_err(|e| self.err(e))?;
        let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
        for entry in rows.iter().map_err(|e| self.err(e))? {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            let (study, owner) = key.value();
            // A row this build cannot read: loading sets its study aside
            // (`load_readable`), which is then never written to.
            let Ok(row) = v1::StoredContributor::decode(value.value()) else {
                continue;
            };
            if row.pending {
                out.entry(study.to_string())
                    .or_default()
                    .insert(owner.to_string());
            }
        }
        Ok(out)
    }
}

/// `set` (studies stored as collecting) once `job` is committed: a contribution
/// written while the study collects leaves its record collecting (a record not
/// rewritten was, since phases only move on), any other write stores the
/// study's phase, and a dropped study is no longer stored.
fn stored_phases(job: &Write, set: &mut BTreeSet<String>) {
    let study = match job {
        Write::Study(study) | Write::Contribution { study, .. } => study,
        Write::Drop(ids) => {
            for id in ids {
                set.remove(id);
            }
            return;
        }
        Write::Held(..) | Write::DropHeld(_) | Write::Barrier => return,
    };
    match study.phase {
        Phase::Collecting => set.insert(study.id.clone()),
        Phase::Sealed | Phase::Released(_) | Phase::Aborted(_) => set.remove(&study.id),
    };
}

/// `mutex`'s value; a panic elsewhere while it was held leaves it as the last
/// commit left it (it changes only after a commit), so it is still true.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A format-1 record to move, with its ciphertexts' width: `None` for a record
/// of another format, or one this build cannot read (undecodable, with no spec
/// or no valid key), which is left as stored.
fn format_1_width(bytes: &[u8]) -> Option<(v1::StoredStudy, usize)> {
    let rec = v1::StoredStudy::decode(bytes).ok()?;
    if rec.format != 1 {
        return None;
    }
    // The key alone: a format-1 spec is of an older layout, which loading then
    // turns into an aborted study.
    let width = PublicKey::from_bytes(&rec.spec.as_ref()?.public_key)
        .ok()?
        .ciphertext_bytes();
    Some((rec, width))
}

/// What [`Store::load_readable`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The studies this build reads.
    pub studies: Vec<Study>,
    /// Each study record it cannot read, by key, with why: left as stored.
    pub unreadable: Vec<(String, String)>,
}

/// A study's stored rows besides its record: what [`from_record`] rebuilds it from.
#[derive(Debug, Default)]
pub struct StoredParts {
    /// One row per counted owner.
    pub contributors: Vec<v1::StoredContributor>,
    /// The checkpointed aggregate, its slices concatenated (empty before the first).
    pub checkpoint: Vec<u8>,
    /// Owner -> its pending contribution, slices concatenated.
    pub pending: BTreeMap<String, Vec<u8>>,
}

/// `cts` as fixed-width bytes, cut into values of at most [`SLICE_BYTES`].
fn slices(pk: &PublicKey, cts: &[Elem]) -> Vec<Vec<u8>> {
    let width = pk.ciphertext_bytes();
    let per_slice = (SLICE_BYTES / width).max(1);
    cts.chunks(per_slice)
        .map(|part| {
            let mut bytes = Vec::with_capacity(part.len() * width);
            for c in part {
                bytes.extend_from_slice(&pk.elem_to_bytes(c));
            }
            bytes
        })
        .collect()
}

/// Ciphertexts stored by [`slices`], each checked to be in Z*_(n^2).
fn from_slices(pk: &PublicKey, bytes: &[u8], what: &str) -> Result<Vec<Elem>, String> {
    let width = pk.ciphertext_bytes();
    if !bytes.len().is_multiple_of(width) {
        return Err(format!(
            "{what}: {} bytes, not a whole number of {width}-byte ciphertexts",
            bytes.len()
        ));
    }
    let each: Vec<&[u8]> = bytes.chunks(width).collect();
    pk.elems_from_bytes(&each, 0)
        .map_err(|e| format!("{what}: {e}"))
}

fn contributor_row(study: &Study, owner: &str, pending: bool) -> v1::StoredContributor {
    v1::StoredContributor {
        owner_id: owner.to_string(),
        contribution_id: study.contributors().get(owner).cloned().unwrap_or_default(),
        count: study
            .signed_counts()
            .get(owner)
            .map(|sc| signed_count_to_wire(owner, sc)),
        pending,
    }
}

fn db_error(path: &Path, e: impl Into<redb::Error>) -> StoreError {
    StoreError::Database {
        path: path.to_path_buf(),
        source: Box::new(e.into()),
    }
}

fn budget_to_record(b: &OwnerBudget) -> v1::StoredBudget {
    v1::StoredBudget {
        cap_epsilon: b.cap_epsilon,
        cap_delta: b.cap_delta,
        spent_epsilon: b.spent_epsilon,
        spent_delta: b.spent_delta,
        studies: b.studies.clone(),
    }
}

/// An owner's stored budget, each figure checked (`OwnerBudget::checked`).
fn budget_from_record(rec: v1::StoredBudget) -> Result<OwnerBudget, String> {
    OwnerBudget {
        cap_epsilon: rec.cap_epsilon,
        cap_delta: rec.cap_delta,
        spent_epsilon: rec.spent_epsilon,
        spent_delta: rec.spent_delta,
        studies: rec.studies,
    }
    .checked()
}

/// The durable record of a study (its rows and aggregate are stored on their own).
pub fn to_record(study: &Study) -> v1::StoredStudy {
    let pk = &study.spec.public_key;
    let mut rec = v1::StoredStudy {
        format: FORMAT,
        study_id: study.id.clone(),
        spec: Some(spec_to_wire(&study.spec)),
        noise_free: study.noise_free,
        opened_by: study.opened_by.clone().unwrap_or_default(),
        phase: study.phase.name().to_string(),
        ..Default::default()
    };
    match &study.phase {
        Phase::Aborted(reason) => rec.abort_reason = reason.clone(),
        Phase::Released(r) => {
            rec.released_n_rows = r.n_rows.unwrap_or(0);
            rec.released = r
                .ciphertexts
                .iter()
                .map(|c| pk.ciphertext_to_bytes(c))
                .collect();
        }
        Phase::Collecting | Phase::Sealed => {}
    }
    rec
}

/// An owner's signed count as the record and `SealedStudy` carry it.
pub fn signed_count_to_wire(owner: &str, c: &SignedCount) -> v1::SignedCount {
    v1::SignedCount {
        owner_id: owner.to_string(),
        encrypted_count: c.ciphertext.clone(),
        signature: c.signature.clone(),
        certificate: c.certificate.clone(),
    }
}

fn signed_count_from_wire(c: &v1::SignedCount) -> SignedCount {
    SignedCount {
        ciphertext: c.encrypted_count.clone(),
        signature: c.signature.clone(),
        certificate: c.certificate.clone(),
    }
}

/// A study from its record and rows, checked as the wire edge checks what arrives:
/// the spec is validated, every ciphertext is in Z*_(n^2), sizes fit the layout,
/// and every counted owner is in the aggregate exactly once (folded at a checkpoint
/// or pending, never both).
pub fn from_record(key: &str, bytes: &[u8], parts: StoredParts) -> Result<Study, String> {
    let rec = v1::StoredStudy::decode(bytes).map_err(|e| format!("undecodable record: {e}"))?;
    if rec.format != FORMAT {
        return Err(format!(
            "record format {} (this proxy reads {FORMAT})",
            rec.format
        ));
    }
    if rec.study_id != key {
        return Err(format!("record names study `{}`", rec.study_id));
    }
    let wire = rec.spec.as_ref().ok_or("record without a spec")?;
    let mut contributors = BTreeMap::new();
    for c in &parts.contributors {
        if contributors
            .insert(c.owner_id.clone(), c.contribution_id.clone())
            .is_some()
        {
            return Err(format!("owner `{}` stored twice", c.owner_id));
        }
    }
    if wire.layout.max(1) != LAYOUT_VERSION {
        return of_older_layout(&rec, wire, contributors);
    }
    let spec = stored_spec_from_wire(wire).map_err(|e| format!("spec: {e}"))?;
    let layout = StudyLayout::new(&spec).map_err(|e| format!("layout: {e}"))?;
    let phase = phase_from_record(&rec, &spec, &contributors)?;
    let aggregate = rebuild_aggregate(&spec, &layout, &phase, &parts)?;
    let opened_by = (!rec.opened_by.is_empty()).then(|| rec.opened_by.clone());
    let mut study = Study::restore(
        rec.study_id,
        spec,
        layout,
        rec.noise_free,
        opened_by,
        contributors,
        aggregate,
        phase,
    )?;
    for c in &parts.contributors {
        if let Some(sc) = &c.count {
            study.keep_signed_count(&c.owner_id, signed_count_from_wire(sc))?;
        }
    }
    Ok(study)
}

/// A study opened by a build of another ciphertext layout: none of its stored
/// ciphertexts can be read at the right offsets, so it is loaded aborted (its
/// owners still listed, so none is counted twice) and the proxy starts with every
/// other study going on. Its ciphertexts stay on disk, unread.
fn of_older_layout(
    rec: &v1::StoredStudy,
    wire: &v1::StudySpec,
    contributors: BTreeMap<String, String>,
) -> Result<Study, String> {
    let current = v1::StudySpec {
        layout: LAYOUT_VERSION,
        ..wire.clone()
    };
    let spec = stored_spec_from_wire(&current).map_err(|e| format!("spec: {e}"))?;
    let layout = StudyLayout::new(&spec).map_err(|e| format!("layout: {e}"))?;
    let reason = match rec.phase.as_str() {
        "aborted" => restored_reason(&rec.abort_reason),
        _ => format!(
            "opened by a build of ciphertext layout {}, which this proxy (layout {LAYOUT_VERSION}) cannot read: open the study again",
            wire.layout.max(1)
        ),
    };
    Study::restore(
        rec.study_id.clone(),
        spec,
        layout,
        rec.noise_free,
        (!rec.opened_by.is_empty()).then(|| rec.opened_by.clone()),
        contributors,
        Vec::new(),
        Phase::Aborted(reason),
    )
}

/// The most of an abort's reason a restored study keeps, in bytes.
const MAX_RESTORED_REASON_BYTES: usize = 4096;

/// An abort's reason as a restored study keeps it. A build before the reason
/// named its first missing owners alone (`study::NAMES_LISTED`) wrote every one
/// into it, megabytes for a study inviting thousands, and refusals send the
/// reason back to whoever calls on the study.
fn restored_reason(reason: &str) -> String {
    if reason.len() <= MAX_RESTORED_REASON_BYTES {
        return reason.to_string();
    }
    let mut end = MAX_RESTORED_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{} ... ({} bytes more, cut when the study was restored)",
        &reason[..end],
        reason.len() - end
    )
}

fn phase_from_record(
    rec: &v1::StoredStudy,
    spec: &StudySpec,
    contributors: &BTreeMap<String, String>,
) -> Result<Phase, String> {
    Ok(match rec.phase.as_str() {
        "collecting" => Phase::Collecting,
        "sealed" => Phase::Sealed,
        "aborted" => Phase::Aborted(restored_reason(&rec.abort_reason)),
        "released" => {
            let ciphertexts = spec
                .public_key
                .ciphertexts_from_bytes(&rec.released, 0)
                .map_err(|e| format!("release: {e}"))?;
            // N is stored exactly where the noise was calibrated to it (`mask`).
            let n_rows = match spec.privacy.centering {
                Centering::Mask if rec.released_n_rows > 0 => Some(rec.released_n_rows),
                Centering::Mask => return Err("a mask release without its N".into()),
                Centering::DpMean => None,
            };
            Phase::Released(Arc::new(Released {
                n_rows,
                // A function of the spec and N: recomputed, not stored.
                plan: spec.proxy_plan(n_rows, rec.noise_free),
                ciphertexts,
                owners: contributors.keys().cloned().collect(),
            }))
        }
        other => return Err(format!("unknown phase `{other}`")),
    })
}

/// The aggregate: the checkpoint (the identity before the first) times every
/// pending contribution. Pending ciphertexts exist exactly for the rows that say
/// so, and a study past collecting has none (it checkpointed when it left).
fn rebuild_aggregate(
    spec: &StudySpec,
    layout: &StudyLayout,
    phase: &Phase,
    parts: &StoredParts,
) -> Result<Vec<Elem>, String> {
    let pk = &spec.public_key;
    if matches!(phase, Phase::Aborted(_)) {
        // Kept by no aborted study ([`Study::tick`]), nor read of one stored
        // whole by a build before.
        return Ok(Vec::new());
    }
    let folded = parts.contributors.iter().filter(|c| !c.pending).count();
    let mut aggregate = if parts.checkpoint.is_empty() {
        if folded > 0 {
            return Err(format!("{folded} owners folded but no stored aggregate"));
        }
        Study::identity_aggregate(pk, layout)
    } else {
        from_slices(pk, &parts.checkpoint, "aggregate")?
    };
    let waiting: Vec<&str> = parts
        .contributors
        .iter()
        .filter(|c| c.pending)
        .map(|c| c.owner_id.as_str())
        .collect();
    if !waiting.is_empty() && !matches!(phase, Phase::Collecting) {
        return Err(format!(
            "{} pending contributions past collecting",
            waiting.len()
        ));
    }
    for (owner, bytes) in &parts.pending {
        let cts = from_slices(pk, bytes, &format!("pending contribution of `{owner}`"))?;
        if cts.len() != aggregate.len() {
            return Err(format!(
                "pending contribution of `{owner}`: {} ciphertexts, the aggregate has {}",
                cts.len(),
                aggregate.len()
            ));
        }
        for (acc, c) in aggregate.iter_mut().zip(&cts) {
            *acc = pk.ring().mul_elem(acc, c);
        }
    }
    Ok(aggregate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::tests::{key, study};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn contribution(s: &Study, seed: u64) -> Vec<Elem> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let pk = key().public();
        (0..s.layout.owner_ciphertexts())
            .map(|i| {
                let c = pk
                    .encrypt(&num_bigint::BigUint::from(i as u64 + seed), &mut rng)
                    .expect("encrypt");
                pk.ring().elem(&c.0)
            })
            .collect()
    }

    /// Counts `owner` in `s` and stores it as the service does.
    fn count(store: &Store, s: &mut Study, owner: &str, seed: u64) {
        let pk = key().public().clone();
        let cts = contribution(s, seed);
        s.contribute(owner, owner, &cts, |x, y| pk.ring().mul_elem(x, y))
            .expect("contribute");
        let signed = SignedCount {
            ciphertext: pk.elem_to_bytes(&cts[cts.len() - 1]),
            signature: vec![seed as u8; 70],
            certificate: vec![seed as u8 + 1; 300],
        };
        s.keep_signed_count(owner, signed).expect("counted owner");
        let b = dpca_common::owner_budget::charge(owner, None, (2.0, 1e-4), &s.id, (1.0, 1e-5))
            .expect("charge");
        store
            .save_contribution(s, owner, &cts, Some(&b))
            .expect("save contribution");
    }

    fn pending_rows(path: &Path) -> usize {
        let store = Store::open(path).expect("open");
        let txn = store.db.begin_read().expect("read");
        let table = txn.open_table(PENDING).expect("pending");
        table.iter().expect("iter").count()
    }

    /// Rows stored under study `id`, in each table: record, owners' rows, pending
    /// contributions' slices, checkpointed aggregate's slices.
    fn rows_of(store: &Store, id: &str) -> [usize; 4] {
        let txn = store.db.begin_read().expect("read");
        // The rows of `table` whose key's study id (`study` of the key `k`) is `id`.
        macro_rules! rows {
            ($table:expr, |$k:ident| $study:expr) => {
                txn.open_table($table)
                    .expect("table")
                    .iter()
                    .expect("iter")
                    .filter(|e| {
                        let $k = e.as_ref().expect("row").0.value();
                        $study == id
                    })
                    .count()
            };
        }
        [
            rows!(STUDIES, |k| k),
            rows!(CONTRIBUTORS, |k| k.0),
            rows!(PENDING, |k| k.0),
            rows!(AGGREGATES, |k| k.0),
        ]
    }

    /// A study its deadline aborts keeps no aggregate in the state file: with one
    /// owner in, it would be that owner's own share, unnoised, for whoever holds
    /// the file and the user's key. One a build before stored whole loads
    /// without it.
    #[test]
    fn an_aborted_study_keeps_no_aggregate_in_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let store = Store::open_with(&path, 1).expect("open");
        let mut s = study(2, 2);
        store.save_study(&s).expect("save");
        count(&store, &mut s, "a", 1);
        let mut whole = s.clone();
        whole.phase = Phase::Aborted("stored whole by a build before".into());
        store.save_study(&whole).expect("save");
        assert!(rows_of(&store, "s1")[3] > 0, "the old way keeps it");
        let loaded = store.load_all().expect("load");
        assert!(loaded[0].aggregate().is_empty(), "read of a record before");
        s.tick(s.spec.deadline_unix_ms);
        assert_eq!(s.phase.name(), "aborted");
        store.save_study(&s).expect("save");
        assert_eq!(rows_of(&store, "s1"), [1, 1, 0, 0]);
        let loaded = store.load_all().expect("load");
        assert_eq!(loaded[0].phase.name(), "aborted");
        assert!(loaded[0].aggregate().is_empty());
    }

    /// A dropped study leaves no row in any table, and a study whose id it
    /// begins keeps all of its own.
    #[test]
    fn a_dropped_study_leaves_nothing_behind_and_touches_no_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let store = Store::open_with(&path, 2).expect("open");
        // Collecting after three owners: two checkpointed, one stored on its own.
        let mut s = study(4, 1);
        let mut longer = study(4, 1);
        longer.id = format!("{}x", s.id);
        store.save_study(&s).expect("save");
        store.save_study(&longer).expect("save");
        for (owner, seed) in [("a", 1), ("b", 2), ("c", 3)] {
            count(&store, &mut s, owner, seed);
            count(&store, &mut longer, owner, seed + 10);
        }
        let before = rows_of(&store, &longer.id);
        assert_eq!(
            rows_of(&store, &s.id).map(|n| n > 0),
            [true; 4],
            "every table holds s1"
        );
        store.drop_studies(vec![s.id.clone()]).expect("drop");
        store.barrier().expect("durable");
        assert_eq!(rows_of(&store, &s.id), [0; 4]);
        assert_eq!(rows_of(&store, &longer.id), before);
        assert!(!store.has_pending(&s.id));
        assert!(
            store.has_pending(&longer.id),
            "another study's pending owners"
        );
        drop(store);
        let loaded = Store::open(&path)
            .expect("reopen")
            .load_all()
            .expect("load");
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].id, longer.id);
        assert_eq!(loaded[0].aggregate(), longer.aggregate());
    }

    #[test]
    fn a_reopened_store_holds_every_transition_it_acknowledged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let mut s = study(2, 2);
        s.opened_by = Some("alice".into());
        let (stored, released) = {
            let store = Store::open(&path).expect("open");
            // A second proxy on the same file is refused while this one runs.
            let err = Store::open(&path).expect_err("second open");
            assert!(err.to_string().contains("state.redb"), "{err}");
            store.save_study(&s).expect("save opened");
            count(&store, &mut s, "a", 1);
            count(&store, &mut s, "b", 2);
            let mut rng = ChaCha20Rng::seed_from_u64(9);
            let released = s
                .compute_release(Some(10), crate::study::OwnNoise::Drawn, &mut rng)
                .expect("release");
            s.commit_release(released.clone()).expect("commit");
            store.save_study(&s).expect("save release");
            (s.clone(), released)
        };
        let store = Store::open(&path).expect("reopen");
        let budgets = store.load_budgets().expect("budgets");
        assert_eq!(budgets.len(), 2);
        assert_eq!(budgets["a"].spent_epsilon, 1.0);
        assert_eq!(budgets["b"].studies, vec!["s1".to_string()]);
        let loaded = store.load_all().expect("load");
        assert_eq!(loaded.len(), 1);
        let l = &loaded[0];
        assert_eq!(l.id, stored.id);
        assert_eq!(l.opened_by.as_deref(), Some("alice"));
        assert_eq!(l.contributors(), stored.contributors());
        assert_eq!(l.signed_counts(), stored.signed_counts());
        assert_eq!(l.signed_counts().len(), 2, "the owners' signed counts");
        assert_eq!(l.aggregate(), stored.aggregate());
        let Phase::Released(r) = &l.phase else {
            panic!("phase {} after reload", l.phase.name());
        };
        assert_eq!(r.ciphertexts, released.ciphertexts, "a different release");
        assert_eq!(r.n_rows, Some(10));
        assert_eq!(r.plan.matrix.std_dev(), released.plan.matrix.std_dev());
        assert_eq!(r.owners, vec!["a".to_string(), "b".to_string()]);
        drop(store);
        assert_eq!(
            pending_rows(&path),
            0,
            "a released study keeps no contribution"
        );
    }

    /// Whatever the checkpoint interval, with the file reopened before and after
    /// every contribution, the reloaded aggregate holds every acknowledged
    /// contribution exactly once, and the disk holds fewer than a checkpoint's
    /// worth of contributions. (Kills in the middle of a commit are the crash
    /// test's; restarts among several owners and deadlines, the simulation's.)
    #[test]
    fn each_acknowledged_owner_is_in_the_reloaded_aggregate_exactly_once() {
        for every in 1..=4 {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("state.redb");
            let mut s = study(7, 1);
            Store::open_with(&path, every)
                .expect("open")
                .save_study(&s)
                .expect("save opened");
            for (i, owner) in ["a", "b", "c", "d", "e", "f", "g"].iter().enumerate() {
                let store = Store::open_with(&path, every).expect("reopen");
                let loaded = store.load_all().expect("load");
                assert_eq!(
                    loaded[0].aggregate(),
                    s.aggregate(),
                    "every {every}, before {owner}"
                );
                assert_eq!(loaded[0].contributors(), s.contributors());
                count(&store, &mut s, owner, i as u64 + 1);
                drop(store);
                let slices_each = slices(key().public(), s.aggregate()).len();
                let waiting = pending_rows(&path) / slices_each;
                assert!(
                    waiting < every,
                    "every {every}: {waiting} contributions pending"
                );
            }
            let loaded = Store::open_with(&path, every)
                .expect("reopen")
                .load_all()
                .expect("load");
            assert_eq!(loaded[0].phase.name(), "sealed");
            assert_eq!(
                loaded[0].aggregate(),
                s.aggregate(),
                "every {every}, at the end"
            );
            assert_eq!(
                pending_rows(&path),
                0,
                "sealed: everything in the checkpoint"
            );
        }
    }

    #[test]
    fn stored_values_fit_16_kib_and_read_back() {
        let pk = key().public();
        let s = study(2, 2);
        let cts = contribution(&s, 3);
        let many: Vec<Elem> = cts.iter().cycle().take(300).cloned().collect();
        let cut = slices(pk, &many);
        assert!(cut.len() > 1, "300 ciphertexts in one value");
        assert!(cut.iter().all(|v| v.len() <= SLICE_BYTES));
        let joined: Vec<u8> = cut.concat();
        assert_eq!(from_slices(pk, &joined, "x").expect("read back"), many);
        let err = from_slices(pk, &joined[1..], "aggregate").expect_err("cut short");
        assert!(err.contains("aggregate"), "{err}");
    }

    /// A study stored by a build of another ciphertext layout loads aborted, its
    /// owner kept, instead of having its ciphertexts read at the wrong offsets or
    /// stopping the proxy; an aborted one keeps its own reason.
    /// A study of three owners with owner `a` counted, and `a`'s ciphertexts.
    fn with_owner_a() -> (Study, Vec<Elem>) {
        let pk = key().public().clone();
        let mut s = study(3, 3);
        let cts = contribution(&s, 1);
        s.contribute("a", "a", &cts, |x, y| pk.ring().mul_elem(x, y))
            .expect("contribute");
        (s, cts)
    }

    /// `s`'s stored parts with owner `a`'s contribution in the stored aggregate.
    fn a_folded(s: &Study) -> StoredParts {
        StoredParts {
            contributors: vec![contributor_row(s, "a", false)],
            checkpoint: slices(key().public(), s.aggregate()).concat(),
            ..Default::default()
        }
    }

    #[test]
    fn studies_of_another_layout_load_aborted() {
        let (s, _) = with_owner_a();
        let parts = || a_folded(&s);
        let mut rec = to_record(&s);
        if let Some(spec) = rec.spec.as_mut() {
            spec.layout = 0;
        }
        for (phase, reason) in [("collecting", None), ("aborted", Some("deadline"))] {
            rec.phase = phase.into();
            rec.abort_reason = reason.unwrap_or_default().into();
            let l = from_record("s1", &rec.encode_to_vec(), parts()).expect("loads");
            let Phase::Aborted(why) = &l.phase else {
                panic!("{phase}: loaded {}", l.phase.name());
            };
            match reason {
                Some(r) => assert_eq!(why, r),
                None => assert!(why.contains("ciphertext layout 1"), "{why}"),
            }
            assert_eq!(l.contributors(), s.contributors());
        }
    }

    /// An abort's reason stored by a build that listed every missing owner in it
    /// (megabytes for a study inviting thousands, sent back in refusals) is cut
    /// when restored, at a character's boundary, saying how much was cut; a
    /// short one is kept whole.
    #[test]
    fn a_long_abort_reason_is_cut_when_restored() {
        let (s, _) = with_owner_a();
        let mut rec = to_record(&s);
        rec.phase = "aborted".into();
        let missing: Vec<String> = (0..3000).map(|i| format!("é{i:0>248}")).collect();
        let long = format!("deadline passed; missing: {}", missing.join(", "));
        for (reason, cut) in [(long.as_str(), true), ("deadline passed", false)] {
            rec.abort_reason = reason.into();
            let l = from_record("s1", &rec.encode_to_vec(), a_folded(&s)).expect("loads");
            let Phase::Aborted(why) = &l.phase else {
                panic!("loaded {}", l.phase.name());
            };
            if cut {
                assert!(why.len() < 8 << 10, "a reason of {} bytes", why.len());
                assert!(why.starts_with("deadline passed; missing: é"), "{why}");
                assert!(why.ends_with("cut when the study was restored)"), "{why}");
            } else {
                assert_eq!(why, reason);
            }
        }
    }

    /// A study whose feature name a build before the terminal-control check took
    /// in is still restored (owners refuse its spec when served it): refusing it
    /// would stop the proxy, and every other study, at startup.
    #[test]
    fn a_stored_study_with_a_name_new_specs_refuse_is_restored() {
        let (s, _) = with_owner_a();
        let mut rec = to_record(&s);
        if let Some(spec) = rec.spec.as_mut() {
            spec.features[0] = "a\x1b[2J".into();
            assert!(dpca_proto::convert::spec_from_wire(spec).is_err());
        }
        let l = from_record("s1", &rec.encode_to_vec(), a_folded(&s)).expect("restored");
        assert_eq!(l.phase.name(), "collecting");
        assert_eq!(l.spec.features[0], "a\x1b[2J");
        assert_eq!(l.contributors(), s.contributors());
    }

    /// A record of a later format and one that is no record are set aside,
    /// named and left as stored; the study beside them loads.
    #[test]
    fn a_record_this_build_cannot_read_is_set_aside_and_the_others_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("state.redb")).expect("store");
        let (s, _) = with_owner_a();
        store.save_study(&s).expect("save");
        let mut newer = to_record(&s);
        newer.study_id = "s2".into();
        newer.format = FORMAT + 1;
        store.put_raw_record("s2", &newer.encode_to_vec());
        store.put_raw_record("s3", b"\xff\xff not a record");
        let loaded = store.load_readable().expect("the database reads");
        let ids: Vec<_> = loaded.studies.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["s1"]);
        let set_aside: Vec<_> = loaded.unreadable.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(set_aside, ["s2", "s3"]);
        assert!(
            loaded.unreadable[0].1.contains("format"),
            "{:?}",
            loaded.unreadable
        );
        // The strict load still refuses, naming the first.
        let err = store
            .load_all()
            .expect_err("an unreadable record")
            .to_string();
        assert!(err.contains("`s2`"), "{err}");
        assert_eq!(store.raw_record("s2"), Some(newer.encode_to_vec()));
    }

    #[test]
    fn records_that_do_not_fit_their_spec_are_refused_by_name() {
        let pk = key().public().clone();
        let (s, cts) = with_owner_a();
        let good = to_record(&s).encode_to_vec();
        let row = |pending| contributor_row(&s, "a", pending);
        let folded = || a_folded(&s);
        let pending = || StoredParts {
            contributors: vec![row(true)],
            pending: [("a".to_string(), slices(&pk, &cts).concat())].into(),
            ..Default::default()
        };
        for parts in [folded(), pending()] {
            let l = from_record("s1", &good, parts).expect("a good record");
            assert_eq!(l.aggregate(), s.aggregate());
        }
        let mut short = folded();
        short
            .checkpoint
            .truncate(short.checkpoint.len() - pk.ciphertext_bytes());
        let err = from_record("s1", &good, short).expect_err("short aggregate");
        assert!(err.contains("aggregate"), "{err}");
        let mut lost = folded();
        lost.checkpoint.clear();
        let err = from_record("s1", &good, lost).expect_err("no aggregate");
        assert!(err.contains("no stored aggregate"), "{err}");
        let mut twice = folded();
        twice.contributors.push(row(true));
        let err = from_record("s1", &good, twice).expect_err("owner twice");
        assert!(err.contains("twice"), "{err}");
        let mut bad_ct = pending();
        if let Some(bytes) = bad_ct.pending.get_mut("a") {
            bytes[..pk.ciphertext_bytes()].fill(0);
        }
        let err = from_record("s1", &good, bad_ct).expect_err("zero ciphertext");
        assert!(err.contains("`a`"), "{err}");
        let mut sealed = to_record(&s);
        sealed.phase = "sealed".into();
        let err = from_record("s1", &sealed.encode_to_vec(), pending()).expect_err("sealed");
        assert!(err.contains("past collecting"), "{err}");
        let mut phase = to_record(&s);
        phase.phase = "finished".into();
        let err = from_record("s1", &phase.encode_to_vec(), folded()).expect_err("phase");
        assert!(err.contains("finished"), "{err}");
        let err = from_record("s2", &good, folded()).expect_err("key");
        assert!(err.contains("s1"), "{err}");
        let mut format = to_record(&s);
        format.format = 1;
        let err = from_record("s1", &format.encode_to_vec(), folded()).expect_err("format");
        assert!(err.contains("format 1"), "{err}");
        assert!(from_record("s1", b"\xff\xff not a record", folded()).is_err());
    }

    /// A stored budget spent NaN passed every later charge (no comparison with
    /// NaN is true): the owner's cap was never enforced again. It is refused on
    /// loading, naming the owner, as is any figure `charge` would not keep.
    #[test]
    fn a_budget_record_with_a_figure_charge_would_not_keep_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let budget = dpca_common::owner_budget::charge("a", None, (2.0, 1e-4), "s1", (1.0, 1e-5))
            .expect("charge");
        let bad = [
            OwnerBudget {
                spent_epsilon: f64::NAN,
                ..budget.clone()
            },
            OwnerBudget {
                spent_delta: -1e-5,
                ..budget.clone()
            },
            OwnerBudget {
                cap_epsilon: f64::INFINITY,
                ..budget.clone()
            },
            OwnerBudget {
                cap_delta: 1.0,
                ..budget.clone()
            },
        ];
        let put = |b: &OwnerBudget| {
            let store = Store::open(&path).expect("open");
            let txn = store.db.begin_write().expect("write");
            {
                let mut budgets = txn.open_table(BUDGETS).expect("budgets");
                budgets
                    .insert("a", budget_to_record(b).encode_to_vec().as_slice())
                    .expect("budget");
            }
            txn.commit().expect("commit");
        };
        for (i, b) in bad.iter().enumerate() {
            put(b);
            let err = Store::open(&path)
                .expect("open")
                .load_budgets()
                .expect_err("a corrupt budget was loaded");
            assert!(
                matches!(&err, StoreError::Record { key, .. } if key == "a"),
                "budget {i}: {err}"
            );
        }
        put(&budget);
        let loaded = Store::open(&path)
            .expect("open")
            .load_budgets()
            .expect("a sound budget");
        assert_eq!(loaded["a"].spent_epsilon, 1.0);
    }

    /// A file written by a format-1 proxy (one record per study holding its
    /// contributors and aggregate) is moved to rows when opened: the study and
    /// the owners' budgets carry on.
    #[test]
    fn a_format_1_file_is_moved_to_rows_keeping_studies_and_budgets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let pk = key().public().clone();
        let mut s = study(3, 3);
        let cts = contribution(&s, 1);
        s.contribute("a", "a", &cts, |x, y| pk.ring().mul_elem(x, y))
            .expect("contribute");
        let mut rec = to_record(&s);
        rec.format = 1;
        rec.legacy_contributors = vec![contributor_row(&s, "a", false)];
        rec.legacy_aggregate = s.aggregate().iter().map(|c| pk.elem_to_bytes(c)).collect();
        // A format-1 file predates layout versions: its specs are of layout 1.
        let mut older = rec.clone();
        older.study_id = "s2".into();
        if let Some(spec) = older.spec.as_mut() {
            spec.layout = 0;
        }
        let budget = dpca_common::owner_budget::charge("a", None, (2.0, 1e-4), "s1", (1.0, 1e-5))
            .expect("charge");
        {
            let db = Database::create(&path).expect("db");
            let txn = db.begin_write().expect("write");
            {
                let mut studies = txn.open_table(STUDIES).expect("studies");
                studies
                    .insert("s1", rec.encode_to_vec().as_slice())
                    .expect("record");
                studies
                    .insert("s2", older.encode_to_vec().as_slice())
                    .expect("record");
                let mut budgets = txn.open_table(BUDGETS).expect("budgets");
                budgets
                    .insert("a", budget_to_record(&budget).encode_to_vec().as_slice())
                    .expect("budget");
            }
            txn.commit().expect("commit");
        }
        let store = Store::open(&path).expect("open a format-1 file");
        let loaded = store.load_all().expect("load");
        assert_eq!(loaded[0].contributors(), s.contributors());
        assert_eq!(loaded[0].aggregate(), s.aggregate());
        assert_eq!(loaded[1].phase.name(), "aborted");
        assert_eq!(loaded[1].contributors(), s.contributors());
        assert_eq!(
            store.load_budgets().expect("budgets")["a"].spent_epsilon,
            1.0
        );
        // Moved once: a second open finds format 2 only.
        drop(store);
        let again = Store::open(&path)
            .expect("reopen")
            .load_all()
            .expect("load");
        assert_eq!(again[0].aggregate(), s.aggregate());
    }
}
