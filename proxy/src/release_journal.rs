//! The release journal: the id of every study this proxy has released, one per
//! line, each appended and synced before its release is stored or served
//! (`<state>.released` beside the state file, unless `--release-journal` puts it
//! elsewhere).
//!
//! The state file remembers a release, but a copy of it taken before the
//! release holds the study sealed, or still collecting. Put back (an operator
//! restoring a backup), it would let the study's user ask for the release
//! again and get a second draw of noise on the same sums for the owners' one
//! charge: the mean of two halves the noise's variance. The journal is kept
//! apart and never put back, so a study it names is never released again,
//! whatever the state file says of it ([`crate::service`] restores such a study
//! aborted). It holds study ids only: nothing in it bears on any value.
//!
//! Written before the state file, so a crash between the two leaves a study
//! journaled and not released: it is refused as if released (closed rather than
//! open; its user opens a new study). A line cut short by a crash in its append
//! is cut off when the journal is opened: its release was never stored.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// Why the journal cannot be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// It could not be read, written or synced.
    #[error("release journal {}: {source}", path.display())]
    Io {
        /// The journal file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A line is no study id: the file is damaged, or not a journal. Refused
    /// rather than skipped, since a study it no longer names could be released
    /// again.
    #[error("release journal {}: line {line} is not a study id: mend or move the file (never start it afresh while the state file may be an older copy)", path.display())]
    Damaged {
        /// The journal file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
    },
}

/// The journal, open for appending, and the ids it holds.
#[derive(Debug)]
pub struct ReleaseJournal {
    path: PathBuf,
    /// The file, appended to under this lock; and every id it holds.
    state: Mutex<(File, HashSet<String>)>,
}

impl ReleaseJournal {
    /// The journal at `path`, created (empty, its folder synced) if there is none.
    pub fn open(path: &Path) -> Result<Self, JournalError> {
        let io = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        let mut text = Vec::new();
        file.read_to_end(&mut text).map_err(io)?;
        let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if whole < text.len() {
            // A torn last append: its release was never stored.
            file.set_len(whole as u64).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        if !existed {
            sync_folder(path).map_err(io)?;
        }
        let ids = ids_of(&text[..whole]).map_err(|line| JournalError::Damaged {
            path: path.to_path_buf(),
            line,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            state: Mutex::new((file, ids)),
        })
    }

    /// Whether study `id` was released (or journaled for its release).
    pub fn holds(&self, id: &str) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.1.contains(id)
    }

    /// Appends study `id` and syncs it, unless it is there already.
    pub fn record(&self, id: &str) -> Result<(), JournalError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.1.contains(id) {
            return Ok(());
        }
        let (file, ids) = &mut *state;
        let line = format!("{id}\n");
        file.write_all(line.as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|source| JournalError::Io {
                path: self.path.clone(),
                source,
            })?;
        ids.insert(id.to_string());
        Ok(())
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The journal that goes with the state file at `state`, unless put elsewhere.
pub fn beside(state: &Path) -> PathBuf {
    let mut name = state.as_os_str().to_owned();
    name.push(".released");
    PathBuf::from(name)
}

/// The ids of whole lines, or the number of the first line that is no id.
fn ids_of(text: &[u8]) -> Result<HashSet<String>, usize> {
    let mut ids = HashSet::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let id = std::str::from_utf8(line).map_err(|_| i + 1)?;
        if !is_study_id(id) {
            return Err(i + 1);
        }
        ids.insert(id.to_string());
    }
    Ok(ids)
}

/// What a study id may be, as the proxy makes and the spec checks them.
fn is_study_id(id: &str) -> bool {
    id.len() <= dpca_common::study::MAX_ID_BYTES
        && id.bytes().all(|b| b.is_ascii_graphic())
        && !id.is_empty()
}

/// Syncs the folder holding `path`, so a file just created there survives a crash.
fn sync_folder(path: &Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_id_is_held_after_a_reopen_and_recorded_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb.released");
        let journal = ReleaseJournal::open(&path).expect("created");
        assert!(!journal.holds("s1"));
        journal.record("s1").expect("recorded");
        journal.record("s1").expect("again");
        assert!(journal.holds("s1"));
        drop(journal);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "s1\n");
        let journal = ReleaseJournal::open(&path).expect("reopened");
        assert!(journal.holds("s1") && !journal.holds("s2"));
    }

    /// A crash in an append leaves part of a line: cut off (that release was
    /// never stored), and the next append starts a line of its own.
    #[test]
    fn a_torn_last_line_is_cut_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        std::fs::write(&path, "s1\ns2\ns3-cut").expect("write");
        let journal = ReleaseJournal::open(&path).expect("opened");
        assert!(journal.holds("s2") && !journal.holds("s3-cut"));
        journal.record("s4").expect("recorded");
        drop(journal);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "s1\ns2\ns4\n"
        );
    }

    /// A line that is no id is refused by its number, never skipped: the study
    /// it named could be released again.
    #[test]
    fn a_damaged_journal_is_refused_naming_the_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        std::fs::write(&path, b"s1\n\xff\xfe\ns2 with spaces\n").expect("write");
        let err = ReleaseJournal::open(&path).expect_err("damaged");
        assert!(
            matches!(err, JournalError::Damaged { line: 2, .. }),
            "{err}"
        );
        std::fs::write(&path, b"s1\ns2 with spaces\n").expect("write");
        let err = ReleaseJournal::open(&path).expect_err("damaged");
        assert!(
            matches!(err, JournalError::Damaged { line: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn the_journal_goes_beside_its_state_file() {
        assert_eq!(
            beside(Path::new("/var/lib/dpca/proxy.redb")),
            PathBuf::from("/var/lib/dpca/proxy.redb.released")
        );
    }
}
