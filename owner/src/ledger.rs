//! The owner's own record of what its data set has spent (`owner --ledger FILE`).
//!
//! The proxy keeps each owner's budget across studies (`dpca_common::owner_budget`), but
//! a proxy whose state is lost, reset or replaced forgets it, and a user could then
//! run study after study on the same rows. An owner given a ledger charges each
//! study to it, by the same rule and the same cap, before the first byte of its
//! upload is sent, and refuses a study that would pass the cap whatever the proxy
//! says. A study stays charged even if the proxy then refuses it or the upload
//! breaks: the ledger counts every study the rows may have entered. A retry of a
//! study already charged is not charged again; each study is kept with what it
//! cost, and one served again at a higher cost (a proxy reusing a study's id under
//! a larger epsilon) is refused.
//!
//! The file is JSON, replaced whole (written beside it, synced, renamed) so a crash
//! leaves the old ledger or the new, never a torn one; runs sharing a ledger take
//! turns on a lock file beside it. A ledger that cannot be read, or holds a figure
//! a charge never writes, is refused, never started afresh: that would reset what
//! was spent.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use dpca_common::owner_budget::{charge, BudgetError, OwnerBudget};

/// The ledger file's format, stored in it.
const FORMAT: u32 = 1;

/// A ledger file, read and charged by [`Ledger::charge`].
#[derive(Clone, Debug)]
pub struct Ledger(PathBuf);

/// The ledger as stored: the cap and every study charged, with its cost. What
/// was spent is their sum, so the file cannot hold a total its studies do not
/// add up to.
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
    epsilon: f64,
    delta: f64,
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
            if !(c.epsilon.is_finite() && c.epsilon >= 0.0 && c.delta.is_finite() && c.delta >= 0.0)
            {
                return Err(format!(
                    "study {:?} charged ({}, {})",
                    c.study, c.epsilon, c.delta
                ));
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

    /// The ledger after `next` (the budget `charge` returned), which charged
    /// `study` at `cost` if it was not charged before.
    fn after(&self, next: &OwnerBudget, study: &str, cost: (f64, f64)) -> Stored {
        let mut studies = self.studies.clone();
        if !studies.iter().any(|c| c.study == study) {
            studies.push(Charged {
                study: study.to_string(),
                epsilon: cost.0,
                delta: cost.1,
            });
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
    /// A study charged before is served again at a higher cost.
    #[error("ledger {path}: study {study} was charged epsilon {charged_epsilon}, delta {charged_delta:e}, and is now served at epsilon {epsilon}, delta {delta:e}: the proxy reuses a study's id for another study; refusing it")]
    CostRaised {
        /// The file.
        path: PathBuf,
        /// The study (`key fingerprint/study id`).
        study: String,
        /// What it was charged.
        charged_epsilon: f64,
        /// What it was charged.
        charged_delta: f64,
        /// What it is served at now.
        epsilon: f64,
        /// What it is served at now.
        delta: f64,
    },
}

impl Ledger {
    /// The ledger kept at `path` (created by the first charge).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// Charges `owner`'s study `study_id` under the key `key_fingerprint` its cost
    /// (epsilon, delta) against `cap`, and stores the result before returning it;
    /// refused, with nothing stored, if it would pass the cap.
    pub fn charge(
        &self,
        owner: &str,
        key_fingerprint: &str,
        study_id: &str,
        cap: (f64, f64),
        cost: (f64, f64),
    ) -> Result<OwnerBudget, LedgerError> {
        let file = LedgerFile(self.resolved()?);
        let (_turn, charged_before) = file.lock()?;
        let stored = file.read(charged_before)?;
        let study = format!("{}/{study_id}", key_fingerprint.trim().to_lowercase());
        let current = match &stored {
            Some(s) => Some(file.checked(s)?),
            None => None,
        };
        if let Some(before) = stored
            .iter()
            .flat_map(|s| &s.studies)
            .find(|c| c.study == study)
        {
            file.check_cost(before, cost)?;
        }
        let next = charge(owner, current.as_ref(), cap, &study, cost).map_err(|source| {
            LedgerError::Refused {
                path: file.0.clone(),
                source,
            }
        })?;
        let empty = Stored {
            format: FORMAT,
            cap_epsilon: cap.0,
            cap_delta: cap.1,
            studies: Vec::new(),
        };
        let after = stored.as_ref().unwrap_or(&empty).after(&next, &study, cost);
        if stored.is_none() {
            tracing::warn!(ledger = %file.0.display(), "starting a new budget ledger");
        }
        if stored.as_ref() != Some(&after) {
            file.write(&after)?;
        }
        Ok(next)
    }

    /// The ledger's path with its folder made absolute and links resolved, and
    /// the file itself followed if it is a link: one ledger has one lock file
    /// however it is spelled, its folder is known to sync (a bare file name's is
    /// the working folder), and a link to it is written through, not replaced.
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
        let name = self.0.file_name().ok_or_else(|| LedgerError::Unreadable {
            path: self.0.clone(),
            reason: "the path names no file".into(),
        })?;
        let dir = self.0.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = std::fs::canonicalize(dir.unwrap_or(Path::new("."))).map_err(io)?;
        Ok(dir.join(name))
    }
}

/// A ledger at its resolved path (`Ledger::resolved`).
struct LedgerFile(PathBuf);

impl LedgerFile {
    /// The lock file beside the ledger, held exclusively until dropped, and
    /// whether it was there before (left by an earlier charge). Not the ledger
    /// itself: it is replaced by a rename, and a lock on the file renamed over
    /// would not exclude a run that opened the new one.
    fn lock(&self) -> Result<(File, bool), LedgerError> {
        let path = sibling(&self.0, "lock");
        let existed = path.exists();
        let io = |source| LedgerError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        file.lock().map_err(io)?;
        Ok((file, existed))
    }

    /// The ledger stored, `None` if there is none yet. A ledger missing beside
    /// the lock an earlier charge left was moved or deleted: refused, as starting
    /// afresh would reset what was spent.
    fn read(&self, charged_before: bool) -> Result<Option<Stored>, LedgerError> {
        let text = match std::fs::read_to_string(&self.0) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && charged_before => {
                return Err(self.unreadable(format!(
                    "it is gone, but the lock file {} an earlier charge left is there; \
                     remove that only if no study was ever charged here",
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

    /// The budget `stored` adds up to, or why it is not a ledger.
    fn checked(&self, stored: &Stored) -> Result<OwnerBudget, LedgerError> {
        stored.budget().map_err(|reason| self.unreadable(reason))
    }

    /// Refuses a study charged `before` that is served again at more than
    /// `cost` = (epsilon, delta): an honest proxy serves a study's spec unchanged.
    fn check_cost(&self, before: &Charged, cost: (f64, f64)) -> Result<(), LedgerError> {
        if cost.0 <= before.epsilon && cost.1 <= before.delta {
            return Ok(());
        }
        Err(LedgerError::CostRaised {
            path: self.0.clone(),
            study: before.study.clone(),
            charged_epsilon: before.epsilon,
            charged_delta: before.delta,
            epsilon: cost.0,
            delta: cost.1,
        })
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

    const CAP: (f64, f64) = (1.5, 1e-4);

    #[test]
    fn a_study_is_charged_once_and_one_past_the_cap_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = Ledger::at(dir.path().join("ledger.json"));
        let b = ledger
            .charge("a", "AB12", "s1", CAP, (1.0, 1e-5))
            .expect("first");
        assert_eq!(b.studies, ["ab12/s1"]);
        // A retry, read back from the file, costs nothing.
        let again = Ledger::at(dir.path().join("ledger.json"))
            .charge("a", "ab12", "s1", CAP, (1.0, 1e-5))
            .expect("retry");
        assert_eq!(again, b);
        // The same study id under another key is another study.
        let err = ledger
            .charge("a", "cd34", "s1", CAP, (1.0, 1e-5))
            .expect_err("past the cap");
        assert!(matches!(err, LedgerError::Refused { .. }), "{err}");
        assert!(err.to_string().contains("exhausted"), "{err}");
        let stored = stored(&dir.path().join("ledger.json"));
        assert_eq!(stored, b, "a refused study changed the ledger");
    }

    #[test]
    fn a_ledger_with_a_figure_no_charge_writes_is_refused_not_reset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.json");
        let ledger = Ledger::at(&path);
        ledger
            .charge("a", "ab", "s1", CAP, (1.0, 1e-5))
            .expect("first");
        let good = std::fs::read_to_string(&path).expect("read");
        let mut twice = LedgerFile(path.clone())
            .read(false)
            .expect("read")
            .expect("a ledger");
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
                .charge("a", "ab", "s2", CAP, (0.1, 0.0))
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
        let charged: Vec<bool> = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..4)
                .map(|i| {
                    let ledger = Ledger::at(&path);
                    scope.spawn(move || {
                        ledger
                            .charge("a", "ab", &format!("s{i}"), (2.5, 1e-4), (1.0, 0.0))
                            .is_ok()
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

    /// The ledger at `path`, read back.
    fn stored(path: &Path) -> OwnerBudget {
        LedgerFile(path.to_path_buf())
            .read(false)
            .expect("read")
            .expect("a ledger")
            .budget()
            .expect("a budget")
    }

    /// A proxy reusing a study's id for a study of a larger epsilon or delta does
    /// not have it taken for a retry: it is refused, and the ledger unchanged. The
    /// same study served at its cost or less is the retry it looks like.
    #[test]
    fn a_study_served_again_at_a_higher_cost_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.json");
        let ledger = Ledger::at(&path);
        let b = ledger
            .charge("a", "ab", "s1", CAP, (0.5, 1e-6))
            .expect("first");
        for raised in [(0.6, 1e-6), (0.5, 1e-5)] {
            let err = ledger
                .charge("a", "ab", "s1", CAP, raised)
                .expect_err("a higher cost");
            assert!(matches!(err, LedgerError::CostRaised { .. }), "{err}");
        }
        assert_eq!(stored(&path), b);
        let again = ledger
            .charge("a", "ab", "s1", CAP, (0.4, 1e-6))
            .expect("at less");
        assert_eq!(again, b);
    }

    /// A ledger reached through a link is written through it; one gone from
    /// beside the lock an earlier charge left is refused, not started afresh.
    #[test]
    fn a_ledger_is_found_however_it_is_named_and_never_silently_lost() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real.json");
        Ledger::at(&real)
            .charge("a", "ab", "s1", CAP, (0.5, 0.0))
            .expect("first");
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        Ledger::at(&link)
            .charge("a", "ab", "s2", CAP, (0.5, 0.0))
            .expect("through the link");
        assert!(std::fs::symlink_metadata(&link).expect("link").is_symlink());
        assert_eq!(stored(&real).studies, ["ab/s1", "ab/s2"]);
        std::fs::remove_file(&real).expect("remove");
        let err = Ledger::at(&real)
            .charge("a", "ab", "s3", CAP, (0.5, 0.0))
            .expect_err("a ledger gone");
        assert!(matches!(err, LedgerError::Unreadable { .. }), "{err}");
        assert!(err.to_string().contains("real.json.lock"), "{err}");
        assert!(!real.exists(), "a fresh ledger was started");
    }
}
