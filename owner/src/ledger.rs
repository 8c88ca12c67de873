//! The owner's own record of what its data set has spent (`owner --ledger FILE`).
//!
//! The proxy keeps each owner's budget across studies (`dpca_common::owner_budget`),
//! but a proxy whose state is lost, reset or replaced forgets it, and a user could
//! then run study after study on the same rows. An owner given a ledger charges
//! each study to it, by the same rule and the same cap, before the first byte of
//! its upload is sent, and refuses a study that would pass the cap whatever the
//! proxy says. A study stays charged even if the proxy then refuses it or the
//! upload breaks: the ledger counts every study the rows may have entered. A retry
//! of a study already charged is not charged again; each study is kept with the
//! digest of its spec and what it cost, and one served again under the same id
//! with another spec (a reused id passed off as a retry) is refused.
//!
//! The file is JSON, replaced whole (written beside it, synced, renamed) so a crash
//! leaves the old ledger or the new, never a torn one; runs sharing a ledger take
//! turns on a lock file beside it, which also records that a ledger was written. A
//! ledger that cannot be read, holds a figure a charge never writes, or is gone
//! from beside a lock that records one (or from behind a link) is refused, never
//! started afresh: that would reset what was spent.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

use dpca_common::owner_budget::{charge, BudgetError, OwnerBudget};
use dpca_common::study::StudySpec;

/// The ledger file's format, stored in it.
const FORMAT: u32 = 1;

/// What the lock file holds once a ledger was written beside it.
const WRITTEN: &[u8] = b"a budget ledger was written beside this lock file\n";

/// A ledger file, read and charged by [`Ledger::charge`].
#[derive(Clone, Debug)]
pub struct Ledger(PathBuf);

/// The ledger as stored: the cap and every study charged. What was spent is their
/// sum, so the file cannot hold a total its studies do not add up to.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    format: u32,
    cap_epsilon: f64,
    cap_delta: f64,
    studies: Vec<Charged>,
}

/// One study charged.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Charged {
    /// `key fingerprint/study id`.
    study: String,
    /// SHA-256 of the spec it was charged for, as sent on the wire.
    spec_sha256: String,
    epsilon: f64,
    delta: f64,
}

impl Charged {
    /// `spec`, served as study `study_id` under the key `key_fingerprint`.
    fn of(key_fingerprint: &str, study_id: &str, spec: &StudySpec) -> Self {
        Self {
            study: format!("{}/{study_id}", key_fingerprint.trim().to_lowercase()),
            spec_sha256: dpca_shell::invitation::spec_digest(spec),
            epsilon: spec.privacy.epsilon,
            delta: spec.privacy.delta,
        }
    }
}

impl Stored {
    /// The budget the studies add up to, each figure checked as a charge keeps
    /// it, and no study twice.
    fn budget(&self) -> Result<OwnerBudget, String> {
        let mut seen = std::collections::HashSet::new();
        for c in &self.studies {
            if !seen.insert(c.study.as_str()) {
                return Err(format!("study {:?} charged twice", c.study));
            }
            let figures = [c.epsilon, c.delta];
            if !figures.iter().all(|x| x.is_finite() && *x >= 0.0) {
                return Err(format!("study {:?} charged {figures:?}", c.study));
            }
        }
        OwnerBudget {
            cap_epsilon: self.cap_epsilon,
            cap_delta: self.cap_delta,
            spent_epsilon: self.studies.iter().map(|c| c.epsilon).sum(),
            spent_delta: self.studies.iter().map(|c| c.delta).sum(),
            studies: self.studies.iter().map(|c| c.study.clone()).collect(),
        }
        .checked()
    }

    /// The ledger `before` (none yet: `None`) becomes after `next`, the budget
    /// `charge` returned, which charged `study` if it was not charged before.
    fn after(before: Option<&Stored>, next: &OwnerBudget, study: &Charged) -> Stored {
        let mut studies = before.map(|s| s.studies.clone()).unwrap_or_default();
        if !studies.iter().any(|c| c.study == study.study) {
            studies.push(study.clone());
        }
        Stored {
            format: FORMAT,
            cap_epsilon: next.cap_epsilon,
            cap_delta: next.cap_delta,
            studies,
        }
    }
}

/// Why the ledger refused a study, or could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The ledger or its lock could not be read or written.
    #[error("ledger {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The file is not a ledger this program keeps.
    #[error("ledger {path} is not a ledger this program keeps ({reason}): mend or move it; it is never started afresh, which would reset what was spent")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The study would take the spent total past the cap, or the cap is invalid.
    #[error("ledger {path}: {source}")]
    Refused {
        /// The file.
        path: PathBuf,
        /// The budget's refusal.
        source: BudgetError,
    },
    /// A study charged before is served again with another spec.
    #[error("ledger {path}: study {study} was charged for another spec (epsilon {charged_epsilon}, delta {charged_delta:e}) than the one it is served with now: the proxy reuses a study's id for another study; refusing it")]
    SpecChanged {
        /// The file.
        path: PathBuf,
        /// The study (`key fingerprint/study id`).
        study: String,
        /// What it was charged.
        charged_epsilon: f64,
        /// What it was charged.
        charged_delta: f64,
    },
}

impl Ledger {
    /// The ledger kept at `path` (created by the first charge).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// Charges `owner`'s study `study_id`, served with `spec` under the key
    /// `key_fingerprint`, its epsilon and delta against `cap`, and stores the
    /// result before returning it; refused, with nothing stored, if it would pass
    /// the cap or the study was charged for another spec.
    pub fn charge(
        &self,
        owner: &str,
        key_fingerprint: &str,
        study_id: &str,
        spec: &StudySpec,
        cap: (f64, f64),
    ) -> Result<OwnerBudget, LedgerError> {
        let file = LedgerFile(self.resolved()?);
        let mut turn = file.lock()?;
        let stored = file.read(&turn)?;
        let study = Charged::of(key_fingerprint, study_id, spec);
        let current = match &stored {
            Some(s) => Some(file.checked(s, &study)?),
            None => None,
        };
        let cost = (study.epsilon, study.delta);
        let next = charge(owner, current.as_ref(), cap, &study.study, cost).map_err(|source| {
            LedgerError::Refused {
                path: file.0.clone(),
                source,
            }
        })?;
        if stored.is_none() {
            tracing::warn!(ledger = %file.0.display(), "starting a new budget ledger");
        }
        let after = Stored::after(stored.as_ref(), &next, &study);
        if stored.as_ref() != Some(&after) {
            file.write(&after)?;
        }
        file.mark_written(&mut turn)?;
        Ok(next)
    }

    /// The ledger's path with its folder made absolute and links resolved, and
    /// the file itself followed if it is a link: one ledger has one lock file
    /// however it is spelled, its folder is known to sync (a bare file name's is
    /// the working folder), and a link to it is written through, not replaced. A
    /// link to nothing (an unmounted volume, a moved file) is refused.
    fn resolved(&self) -> Result<PathBuf, LedgerError> {
        let io = |source| LedgerError::Io {
            path: self.0.clone(),
            source,
        };
        match std::fs::canonicalize(&self.0) {
            Ok(path) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let unreadable = |reason: &str| LedgerError::Unreadable {
            path: self.0.clone(),
            reason: reason.into(),
        };
        if std::fs::symlink_metadata(&self.0).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(unreadable("it is a link to nothing"));
        }
        let name = self
            .0
            .file_name()
            .ok_or_else(|| unreadable("the path names no file"))?;
        let dir = self.0.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = std::fs::canonicalize(dir.unwrap_or(Path::new("."))).map_err(io)?;
        Ok(dir.join(name))
    }
}

/// A ledger at its resolved path (`Ledger::resolved`).
struct LedgerFile(PathBuf);

/// A run's turn at the ledger: its lock file, held exclusively until dropped, and
/// whether it records that a ledger was written.
struct Turn {
    lock: File,
    written: bool,
}

impl LedgerFile {
    /// The lock file beside the ledger, locked. Not the ledger itself: it is
    /// replaced by a rename, and a lock on the file renamed over would not exclude
    /// a run that opened the new one.
    fn lock(&self) -> Result<Turn, LedgerError> {
        let path = sibling(&self.0, "lock");
        let io = |source| LedgerError::Io {
            path: path.clone(),
            source,
        };
        let mut lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io)?;
        lock.lock().map_err(io)?;
        let mut held = Vec::new();
        lock.read_to_end(&mut held).map_err(io)?;
        let written = held.starts_with(WRITTEN);
        Ok(Turn { lock, written })
    }

    /// Records in the lock file, once, that a ledger stands beside it.
    fn mark_written(&self, turn: &mut Turn) -> Result<(), LedgerError> {
        if turn.written {
            return Ok(());
        }
        let lock = &mut turn.lock;
        lock.rewind()
            .and_then(|()| lock.write_all(WRITTEN))
            .and_then(|()| lock.sync_all())
            .map_err(|source| LedgerError::Io {
                path: sibling(&self.0, "lock"),
                source,
            })?;
        turn.written = true;
        Ok(())
    }

    /// The ledger stored, `None` if there is none yet. A ledger missing beside a
    /// lock that records one was moved or deleted: refused, as starting afresh
    /// would reset what was spent.
    fn read(&self, turn: &Turn) -> Result<Option<Stored>, LedgerError> {
        let text = match std::fs::read_to_string(&self.0) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && turn.written => {
                return Err(self.unreadable(format!(
                    "it is gone, but its lock file {} records that it was written",
                    sibling(&self.0, "lock").display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io(e)),
        };
        let stored: Stored =
            serde_json::from_str(&text).map_err(|e| self.unreadable(e.to_string()))?;
        if stored.format != FORMAT {
            return Err(self.unreadable(format!("format {}", stored.format)));
        }
        Ok(Some(stored))
    }

    /// The budget `stored` adds up to, or why it is not a ledger; refused if it
    /// charged `study` for another spec: an honest proxy serves a study's spec
    /// unchanged.
    fn checked(&self, stored: &Stored, study: &Charged) -> Result<OwnerBudget, LedgerError> {
        let budget = stored.budget().map_err(|reason| self.unreadable(reason))?;
        match stored.studies.iter().find(|c| c.study == study.study) {
            Some(before) if before.spec_sha256 != study.spec_sha256 => {
                Err(LedgerError::SpecChanged {
                    path: self.0.clone(),
                    study: before.study.clone(),
                    charged_epsilon: before.epsilon,
                    charged_delta: before.delta,
                })
            }
            _ => Ok(budget),
        }
    }

    /// Replaces the ledger with `stored`: written beside it and synced, renamed
    /// over it, and its folder synced.
    fn write(&self, stored: &Stored) -> Result<(), LedgerError> {
        let json = serde_json::to_string_pretty(stored).map_err(|e| self.io(e.into()))?;
        let next = sibling(&self.0, "next");
        let mut file = File::create(&next).map_err(|e| self.io(e))?;
        file.write_all(json.as_bytes())
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&next, &self.0))
            .map_err(|e| self.io(e))?;
        // A resolved path always has its folder.
        if let Some(dir) = self.0.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    fn unreadable(&self, reason: String) -> LedgerError {
        LedgerError::Unreadable {
            path: self.0.clone(),
            reason,
        }
    }

    fn io(&self, source: std::io::Error) -> LedgerError {
        LedgerError::Io {
            path: self.0.clone(),
            source,
        }
    }
}

/// `path` with `.suffix` added to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
    use dpca_common::study::SpecDraft;

    const CAP: (f64, f64) = (1.5, 1e-4);

    /// The test study at `epsilon` (delta 1e-6).
    fn spec(epsilon: f64) -> StudySpec {
        let key = dpca_common::testing::test_key();
        SpecDraft {
            privacy: PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::DpMean, epsilon, 1e-6)
                .expect("a privacy request"),
            ..dpca_common::testing::test_draft(key.public(), 2)
        }
        .validate()
        .expect("the test spec")
    }

    /// The ledger at `path`, read back.
    fn stored(path: &Path) -> OwnerBudget {
        let file = LedgerFile(path.to_path_buf());
        let turn = file.lock().expect("lock");
        let stored = file.read(&turn).expect("read").expect("a ledger");
        stored.budget().expect("a budget")
    }

    #[test]
    fn a_study_is_charged_once_and_one_past_the_cap_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.json");
        let (ledger, one) = (Ledger::at(&path), spec(1.0));
        let b = ledger.charge("a", "AB12", "s1", &one, CAP).expect("first");
        assert_eq!(
            (b.spent_epsilon, b.studies.clone()),
            (1.0, vec!["ab12/s1".into()])
        );
        // A retry, read back from the file, costs nothing.
        let again = Ledger::at(&path)
            .charge("a", "ab12", "s1", &one, CAP)
            .expect("retry");
        assert_eq!(again, b);
        // The same study id under another key is another study.
        let err = ledger
            .charge("a", "cd34", "s1", &one, CAP)
            .expect_err("past the cap");
        assert!(matches!(err, LedgerError::Refused { .. }), "{err}");
        assert!(err.to_string().contains("exhausted"), "{err}");
        assert_eq!(stored(&path), b, "a refused study changed the ledger");
    }

    /// A first charge refused (a study above the cap) leaves no ledger, and no
    /// lock that would later read as a ledger gone.
    #[test]
    fn a_refused_first_charge_leaves_the_ledger_to_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = Ledger::at(dir.path().join("ledger.json"));
        let err = ledger
            .charge("a", "ab", "s1", &spec(1.0), (0.5, 1e-4))
            .expect_err("above the cap");
        assert!(matches!(err, LedgerError::Refused { .. }), "{err}");
        ledger
            .charge("a", "ab", "s2", &spec(0.4), (0.5, 1e-4))
            .expect("a study within the cap");
    }

    /// A proxy reusing a study's id for another spec, at any cost, does not have
    /// it taken for a retry: it is refused, and the ledger unchanged.
    #[test]
    fn a_study_served_again_with_another_spec_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.json");
        let ledger = Ledger::at(&path);
        let b = ledger
            .charge("a", "ab", "s1", &spec(0.5), CAP)
            .expect("first");
        for other in [spec(0.6), spec(0.4)] {
            let err = ledger
                .charge("a", "ab", "s1", &other, CAP)
                .expect_err("another spec");
            assert!(matches!(err, LedgerError::SpecChanged { .. }), "{err}");
        }
        assert_eq!(stored(&path), b);
    }

    #[test]
    fn a_ledger_with_a_figure_no_charge_writes_is_refused_not_reset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.json");
        let ledger = Ledger::at(&path);
        ledger
            .charge("a", "ab", "s1", &spec(1.0), CAP)
            .expect("first");
        let good = std::fs::read_to_string(&path).expect("read");
        let mut twice: Stored = serde_json::from_str(&good).expect("a ledger");
        twice.studies.push(twice.studies[0].clone());
        for bad in [
            good.replace("\"epsilon\": 1.0", "\"epsilon\": -1.0"),
            serde_json::to_string(&twice).expect("json"),
            good.replace("\"format\": 1", "\"format\": 2"),
            good.replace("\"studies\"", "\"extra\": 0, \"studies\""),
            good[..good.len() / 2].to_string(),
            String::new(),
        ] {
            assert_ne!(bad, good, "the corruption must change the file");
            std::fs::write(&path, &bad).expect("write");
            let err = ledger
                .charge("a", "ab", "s2", &spec(0.1), CAP)
                .expect_err(&bad);
            assert!(matches!(err, LedgerError::Unreadable { .. }), "{err}");
            assert_eq!(std::fs::read_to_string(&path).expect("read"), bad);
        }
    }

    /// Runs sharing a ledger take turns: of four studies charged at once, each
    /// costing 1 against a cap of 2.5, exactly two are charged, and the ledger
    /// holds both.
    #[test]
    fn concurrent_charges_never_spend_past_the_cap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.json");
        let one = spec(1.0);
        let charged: Vec<bool> = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..4)
                .map(|i| {
                    let (ledger, one) = (Ledger::at(&path), &one);
                    scope.spawn(move || {
                        let study = format!("s{i}");
                        ledger.charge("a", "ab", &study, one, (2.5, 1e-4)).is_ok()
                    })
                })
                .collect();
            runs.into_iter()
                .map(|r| r.join().expect("no panic"))
                .collect()
        });
        assert_eq!(charged.iter().filter(|&&c| c).count(), 2, "{charged:?}");
        let stored = stored(&path);
        assert_eq!((stored.spent_epsilon, stored.studies.len()), (2.0, 2));
    }

    /// A ledger reached through a link is written through it; one gone from
    /// behind its link, or from beside the lock that records it, is refused, not
    /// started afresh.
    #[test]
    fn a_ledger_is_found_however_it_is_named_and_never_silently_lost() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real.json");
        let half = spec(0.5);
        Ledger::at(&real)
            .charge("a", "ab", "s1", &half, CAP)
            .expect("first");
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        Ledger::at(&link)
            .charge("a", "ab", "s2", &half, CAP)
            .expect("through the link");
        assert!(std::fs::symlink_metadata(&link).expect("link").is_symlink());
        assert_eq!(stored(&real).studies, ["ab/s1", "ab/s2"]);
        std::fs::remove_file(&real).expect("remove");
        for path in [&real, &link] {
            let err = Ledger::at(path)
                .charge("a", "ab", "s3", &half, CAP)
                .expect_err("a ledger gone");
            assert!(matches!(err, LedgerError::Unreadable { .. }), "{err}");
        }
        assert!(!real.exists(), "a fresh ledger was started");
        assert!(std::fs::symlink_metadata(&link).expect("link").is_symlink());
    }
}
