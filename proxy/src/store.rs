//! The proxy's durable state: one redb database file holding one record per study
//! (spec, who opened it, the owners counted with their contribution ids, the running
//! aggregate, the phase and the release).
//!
//! Every transition is written in one transaction and committed with
//! `Durability::Immediate` (fsync) *before* the service answers, so an acknowledged
//! contribution survives a SIGKILL at any moment, and the contributors and the
//! aggregate are written together, so a contribution is never counted twice: after
//! a restart its retry is recognised by its contribution id. A release is stored
//! before it is served, so a restart serves the same noise rather than fresh noise
//! (which would let the user average two releases). Deadline transitions are not
//! stored: they follow from the stored contributors and the spec's deadline, and
//! are re-applied on load.
//!
//! redb locks the file: a second proxy on the same state refuses to start.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use dpca_common::dp::Centering;
use dpca_common::study::StudyLayout;
use dpca_proto::convert::{spec_from_wire, spec_to_wire};
use dpca_proto::v1;
use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::budget::OwnerBudget;
use crate::study::{release_plan, Phase, Released, SignedCount, Study};

/// Study id -> encoded [`v1::StoredStudy`].
const STUDIES: TableDefinition<&str, &[u8]> = TableDefinition::new("studies");

/// Owner id -> encoded [`v1::StoredBudget`].
const BUDGETS: TableDefinition<&str, &[u8]> = TableDefinition::new("budgets");

/// The record format this proxy writes and reads.
const FORMAT: u32 = 1;

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
}

/// The open state database.
pub struct Store {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens `path`, creating an empty database if it does not exist.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(|e| db_error(path, e))?;
        let store = Self {
            db,
            path: path.to_path_buf(),
        };
        // Create the table up front so reads of a fresh file find it.
        let txn = store.db.begin_write().map_err(|e| store.err(e))?;
        txn.open_table(STUDIES).map_err(|e| store.err(e))?;
        txn.open_table(BUDGETS).map_err(|e| store.err(e))?;
        txn.commit().map_err(|e| store.err(e))?;
        Ok(store)
    }

    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_error(&self.path, e)
    }

    /// Writes `study`'s record and, in the same transaction, an owner's budget,
    /// and waits until both are on disk: a contribution and its charge are stored
    /// together or not at all.
    pub fn save_with_budget(
        &self,
        study: &Study,
        budget: Option<(&str, &OwnerBudget)>,
    ) -> Result<(), StoreError> {
        let bytes = to_record(study).encode_to_vec();
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut table = txn.open_table(STUDIES).map_err(|e| self.err(e))?;
            table
                .insert(study.id.as_str(), bytes.as_slice())
                .map_err(|e| self.err(e))?;
        }
        if let Some((owner, b)) = budget {
            let rec = budget_to_record(b).encode_to_vec();
            let mut table = txn.open_table(BUDGETS).map_err(|e| self.err(e))?;
            table
                .insert(owner, rec.as_slice())
                .map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// Every owner's stored budget.
    pub fn load_budgets(&self) -> Result<HashMap<String, OwnerBudget>, StoreError> {
        Ok(self
            .read_table(BUDGETS, |_, bytes| {
                v1::StoredBudget::decode(bytes)
                    .map(budget_from_record)
                    .map_err(|e| format!("undecodable budget record: {e}"))
            })?
            .into_iter()
            .collect())
    }

    /// Every stored study, validated as on first arrival.
    pub fn load_all(&self) -> Result<Vec<Study>, StoreError> {
        Ok(self
            .read_table(STUDIES, from_record)?
            .into_iter()
            .map(|(_, study)| study)
            .collect())
    }

    /// Every entry of `def`, decoded by `decode(key, bytes)`; the first record that
    /// does not decode stops the load, named by its key.
    fn read_table<T>(
        &self,
        def: TableDefinition<&str, &[u8]>,
        decode: impl Fn(&str, &[u8]) -> Result<T, String>,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(def).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.err(e))? {
            let (key, value) = entry.map_err(|e| self.err(e))?;
            let key = key.value().to_string();
            let item = decode(&key, value.value()).map_err(|reason| StoreError::Record {
                path: self.path.clone(),
                key: key.clone(),
                reason,
            })?;
            out.push((key, item));
        }
        Ok(out)
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

fn budget_from_record(rec: v1::StoredBudget) -> OwnerBudget {
    OwnerBudget {
        cap_epsilon: rec.cap_epsilon,
        cap_delta: rec.cap_delta,
        spent_epsilon: rec.spent_epsilon,
        spent_delta: rec.spent_delta,
        studies: rec.studies,
    }
}

/// The durable record of a study.
pub fn to_record(study: &Study) -> v1::StoredStudy {
    let pk = &study.spec.public_key;
    let bytes = |cts: &[dpca_common::paillier::Ciphertext]| {
        cts.iter().map(|c| pk.ciphertext_to_bytes(c)).collect()
    };
    let mut rec = v1::StoredStudy {
        format: FORMAT,
        study_id: study.id.clone(),
        spec: Some(spec_to_wire(&study.spec)),
        noise_free: study.noise_free,
        opened_by: study.opened_by.clone().unwrap_or_default(),
        contributors: study
            .contributors()
            .iter()
            .map(|(o, c)| v1::StoredContributor {
                owner_id: o.clone(),
                contribution_id: c.clone(),
                count: study
                    .signed_counts()
                    .get(o)
                    .map(|sc| signed_count_to_wire(o, sc)),
            })
            .collect(),
        aggregate: bytes(study.aggregate()),
        phase: study.phase.name().to_string(),
        ..Default::default()
    };
    match &study.phase {
        Phase::Aborted(reason) => rec.abort_reason = reason.clone(),
        Phase::Released(r) => {
            rec.released_n_rows = r.n_rows.unwrap_or(0);
            rec.released = bytes(&r.ciphertexts);
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

/// A study from its record, checked as the wire edge checks what arrives: the spec
/// is validated, every ciphertext is in Z*_(n^2), sizes fit the layout.
pub fn from_record(key: &str, bytes: &[u8]) -> Result<Study, String> {
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
    let spec = spec_from_wire(wire).map_err(|e| format!("spec: {e}"))?;
    let layout = StudyLayout::new(&spec).map_err(|e| format!("layout: {e}"))?;
    let pk = spec.public_key.clone();
    let aggregate = pk
        .ciphertexts_from_bytes(&rec.aggregate, 0)
        .map_err(|e| format!("aggregate: {e}"))?;
    let mut contributors = BTreeMap::new();
    for c in &rec.contributors {
        if contributors
            .insert(c.owner_id.clone(), c.contribution_id.clone())
            .is_some()
        {
            return Err(format!("owner `{}` stored twice", c.owner_id));
        }
    }
    let phase = match rec.phase.as_str() {
        "collecting" => Phase::Collecting,
        "sealed" => Phase::Sealed,
        "aborted" => Phase::Aborted(rec.abort_reason.clone()),
        "released" => {
            let ciphertexts = pk
                .ciphertexts_from_bytes(&rec.released, 0)
                .map_err(|e| format!("release: {e}"))?;
            // N is stored exactly where the noise was calibrated to it (`mask`).
            // (Records written before N stayed with the user hold it for `dp-mean`
            // too: nothing of that release depends on it, so it is dropped.)
            let n_rows = match spec.privacy.centering {
                Centering::Mask if rec.released_n_rows > 0 => Some(rec.released_n_rows),
                Centering::Mask => return Err("a mask release without its N".into()),
                Centering::DpMean => None,
            };
            Phase::Released(Box::new(Released {
                n_rows,
                // A function of the spec and N: recomputed, not stored.
                plan: release_plan(&spec, rec.noise_free, n_rows),
                ciphertexts,
                owners: contributors.keys().cloned().collect(),
            }))
        }
        other => return Err(format!("unknown phase `{other}`")),
    };
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
    for c in &rec.contributors {
        if let Some(sc) = &c.count {
            study.keep_signed_count(&c.owner_id, signed_count_from_wire(sc))?;
        }
    }
    Ok(study)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::tests::{key, study};
    use dpca_common::paillier::Ciphertext;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn contribution(s: &Study, seed: u64) -> Vec<Ciphertext> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let pk = key().public();
        (0..s.layout.owner_ciphertexts())
            .map(|i| {
                pk.encrypt(&num_bigint::BigUint::from(i as u64 + seed), &mut rng)
                    .expect("encrypt")
            })
            .collect()
    }

    #[test]
    fn a_reopened_store_holds_every_transition_it_acknowledged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let pk = key().public().clone();
        let mut s = study(2, 2);
        s.opened_by = Some("alice".into());
        let (stored, released) = {
            let store = Store::open(&path).expect("open");
            // A second proxy on the same file is refused while this one runs.
            let err = Store::open(&path).expect_err("second open");
            assert!(err.to_string().contains("state.redb"), "{err}");
            store.save_with_budget(&s, None).expect("save opened");
            for (owner, seed) in [("a", 1), ("b", 2)] {
                let cts = contribution(&s, seed);
                s.contribute(owner, owner, &cts, |x, y| pk.add(x, y))
                    .expect("contribute");
                let signed = SignedCount {
                    ciphertext: pk.ciphertext_to_bytes(&cts[cts.len() - 1]),
                    signature: vec![seed as u8; 70],
                    certificate: vec![seed as u8 + 1; 300],
                };
                s.keep_signed_count(owner, signed).expect("counted owner");
                let b = crate::budget::charge(owner, None, (2.0, 1e-4), "s1", (1.0, 1e-5))
                    .expect("charge");
                store
                    .save_with_budget(&s, Some((owner, &b)))
                    .expect("save contribution");
            }
            let mut rng = ChaCha20Rng::seed_from_u64(9);
            let released = s.compute_release(Some(10), &mut rng).expect("release");
            s.commit_release(released.clone()).expect("commit");
            store.save_with_budget(&s, None).expect("save release");
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
    }

    #[test]
    fn records_that_do_not_fit_their_spec_are_refused_by_name() {
        let s = study(2, 2);
        let good = to_record(&s);
        assert!(from_record("s1", &good.encode_to_vec()).is_ok());
        let mut short = good.clone();
        short.aggregate.pop();
        let err = from_record("s1", &short.encode_to_vec()).expect_err("short aggregate");
        assert!(err.contains("aggregate"), "{err}");
        let mut phase = good.clone();
        phase.phase = "finished".into();
        let err = from_record("s1", &phase.encode_to_vec()).expect_err("phase");
        assert!(err.contains("finished"), "{err}");
        let err = from_record("s2", &good.encode_to_vec()).expect_err("key");
        assert!(err.contains("s1"), "{err}");
        let mut bad_ct = good.clone();
        bad_ct.aggregate[0] = vec![0u8; bad_ct.aggregate[0].len()];
        assert!(from_record("s1", &bad_ct.encode_to_vec()).is_err());
        let mut format = good;
        format.format = 2;
        assert!(from_record("s1", &format.encode_to_vec()).is_err());
        assert!(from_record("s1", b"\xff\xff not a record").is_err());
    }
}
