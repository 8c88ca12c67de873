//! The owner's own record of what its data set has spent (`owner --ledger FILE`).
//!
//! The proxy keeps each owner's budget across studies (`dpca_common::owner_budget`), but
//! a proxy whose state is lost, reset or replaced forgets it, and a user could then
//! run study after study on the same rows. An owner given a ledger charges each
//! study to it, by the same rule and the same cap, before the first byte of its
//! upload is sent, and refuses a study that would pass the cap whatever the proxy
//! says. A study stays charged even if the proxy then refuses it or the upload
//! breaks: the ledger counts every study the rows may have entered. A retry of a
//! study already charged is not charged again.
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

/// The ledger as stored.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    format: u32,
    cap_epsilon: f64,
    cap_delta: f64,
    spent_epsilon: f64,
    spent_delta: f64,
    /// The studies charged, each as `key fingerprint/study id`.
    studies: Vec<String>,
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
        let current = file.read(charged_before)?;
        let study = format!("{}/{study_id}", key_fingerprint.trim().to_lowercase());
        let next = charge(owner, current.as_ref(), cap, &study, cost).map_err(|source| {
            LedgerError::Refused {
                path: file.0.clone(),
                source,
            }
        })?;
        if current.is_none() {
            tracing::warn!(ledger = %file.0.display(), "starting a new budget ledger");
        }
        if current.as_ref() != Some(&next) {
            file.write(&next)?;
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

    /// The budget stored, `None` if there is no ledger yet. A ledger missing
    /// beside the lock an earlier charge left was moved or deleted: refused, as
    /// starting afresh would reset what was spent.
    fn read(&self, charged_before: bool) -> Result<Option<OwnerBudget>, LedgerError> {
        let unreadable = |reason: String| LedgerError::Unreadable {
            path: self.0.clone(),
            reason,
        };
        let text = match std::fs::read_to_string(&self.0) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && charged_before => {
                return Err(unreadable(format!(
                    "it is gone, but the lock file {} an earlier charge left is there; \
                     remove that only if no study was ever charged here",
                    sibling(&self.0, "lock").display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io(e)),
        };
        let stored: Stored = serde_json::from_str(&text).map_err(|e| unreadable(e.to_string()))?;
        if stored.format != FORMAT {
            return Err(unreadable(format!("format {}", stored.format)));
        }
        OwnerBudget {
            cap_epsilon: stored.cap_epsilon,
            cap_delta: stored.cap_delta,
            spent_epsilon: stored.spent_epsilon,
            spent_delta: stored.spent_delta,
            studies: stored.studies,
        }
        .checked()
        .map(Some)
        .map_err(unreadable)
    }

    /// Replaces the ledger with `budget`: written beside it and synced, renamed
    /// over it, and its folder synced.
    fn write(&self, budget: &OwnerBudget) -> Result<(), LedgerError> {
        let stored = Stored {
            format: FORMAT,
            cap_epsilon: budget.cap_epsilon,
            cap_delta: budget.cap_delta,
            spent_epsilon: budget.spent_epsilon,
            spent_delta: budget.spent_delta,
            studies: budget.studies.clone(),
        };
        let json = serde_json::to_string_pretty(&stored).map_err(|e| self.io(e.into()))?;
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
        for bad in [
            good.replace("\"spent_epsilon\": 1.0", "\"spent_epsilon\": -1.0"),
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
