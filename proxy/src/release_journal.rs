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
//! Its first line names it (`dpca release journal <id>`), and the state file
//! records the name of the journal it was served with
//! ([`crate::store::Store::release_journal`]): a journal that is gone (deleted,
//! moved, a volume not mounted, a path changed) or another journal is refused at
//! startup rather than started afresh, which would forget every release. Only
//! `--new-release-journal NAME`, naming the journal the file records, starts one
//! anyway, once.
//!
//! Written before the state file, so a crash between the two leaves a study
//! journaled and not released: it is refused as if released (closed rather than
//! open; its user opens a new study). Nothing is ever cut from it: a last line
//! with no newline (an append a crash or a full disk cut short, or a hand edit)
//! is read as an id like any other, and the next append starts a line of its
//! own. After a failed append the journal takes no more until a restart reads
//! it again, so no id is ever appended to a fragment.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// What the first line of a journal says, before its name.
const HEADER: &str = "dpca release journal ";

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
    /// A line is no study id, or the first no journal's name: the file is
    /// damaged, or not a journal. Refused rather than skipped, since a study it
    /// no longer names could be released again.
    #[error("release journal {}: line {line} is {what}: mend the file (nothing it names may be dropped), or point --release-journal at the right one", path.display())]
    Damaged {
        /// The journal file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        what: &'static str,
    },
    /// The state file was served with a journal that is not there.
    #[error("release journal {} is missing, but the state file was served with journal {expected}: a journal started afresh would forget every release, and a state file put back from an older copy could have a study released twice. Put the journal back (a copy of its newest), or start a new one with --new-release-journal {expected} only if no study released since that copy can be in the state file", path.display())]
    Missing {
        /// Where it should be.
        path: PathBuf,
        /// The name the state file records.
        expected: String,
    },
    /// The state file was served with another journal than this one.
    #[error("release journal {} is journal {found}, but the state file was served with journal {expected}: point --release-journal at that one, or adopt this one with --new-release-journal {expected} only if it holds every study released", path.display())]
    Other {
        /// The journal file.
        path: PathBuf,
        /// Its name.
        found: String,
        /// The name the state file records.
        expected: String,
    },
    /// `--new-release-journal` names another journal than the state file records.
    #[error("--new-release-journal names journal {asked}, but the state file was served with journal {recorded}: name the journal it records, so that the flag replaces that one only")]
    NotRecorded {
        /// The name given.
        asked: String,
        /// The name the state file records.
        recorded: String,
    },
    /// An append failed earlier: the journal takes no more until a restart.
    #[error("release journal {}: an earlier append failed ({cause}); nothing is released until the proxy is restarted", path.display())]
    Stopped {
        /// The journal file.
        path: PathBuf,
        /// The first failure.
        #[source]
        cause: std::io::Error,
    },
}

/// The journal, open for appending, and the ids it holds.
#[derive(Debug)]
pub struct ReleaseJournal {
    path: PathBuf,
    name: String,
    state: Mutex<Appending>,
}

#[derive(Debug)]
struct Appending {
    file: File,
    ids: HashSet<String>,
    /// Whether the file ends in the middle of a line.
    mid_line: bool,
    /// The first append that failed, after which none is made.
    failed: Option<std::io::ErrorKind>,
}

/// How the journal is to be opened against the state file's record of it.
pub struct Expected<'a> {
    /// The name the state file records, `None` for a state file never served
    /// with one (new, or from a build before the journal).
    pub name: Option<&'a str>,
    /// The name of the journal the state file records, to be replaced by the
    /// journal found, or a new one if there is none (`--new-release-journal`);
    /// refused if the file records another.
    pub replace: Option<&'a str>,
    /// The name a journal created now gets.
    pub fresh_name: String,
}

impl ReleaseJournal {
    /// The journal at `path`, checked against what the state file records of it;
    /// created (its folder synced) only if the state file records none or
    /// `expected.replace` names the journal it records.
    pub fn open(path: &Path, expected: Expected<'_>) -> Result<Self, JournalError> {
        if let (Some(asked), Some(recorded)) = (expected.replace, expected.name) {
            if asked != recorded {
                return Err(JournalError::NotRecorded {
                    asked: asked.to_string(),
                    recorded: recorded.to_string(),
                });
            }
        }
        let io = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        let exists = found(path, &expected)?;
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        if !exists {
            file.write_all(format!("{HEADER}{}\n", expected.fresh_name).as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(io)?;
        }
        // Every open: a creation a crash interrupted before the folder was synced.
        sync_folder(path).map_err(io)?;
        // Read from the start (appends go to the end whatever the position).
        let mut text = Vec::new();
        file.rewind()
            .and_then(|()| file.read_to_end(&mut text))
            .map_err(io)?;
        let (name, ids) = parse(&text).map_err(|(line, what)| JournalError::Damaged {
            path: path.to_path_buf(),
            line,
            what,
        })?;
        match expected.name {
            Some(want) if want != name && expected.replace.is_none() => Err(JournalError::Other {
                path: path.to_path_buf(),
                found: name,
                expected: want.to_string(),
            }),
            _ => Ok(Self {
                path: path.to_path_buf(),
                name,
                state: Mutex::new(Appending {
                    file,
                    ids,
                    mid_line: text.last().is_some_and(|&b| b != b'\n'),
                    failed: None,
                }),
            }),
        }
    }

    /// Its name, which the state file records.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether study `id` was released (or journaled for its release).
    pub fn holds(&self, id: &str) -> bool {
        self.lock().ids.contains(id)
    }

    /// Appends study `id` and syncs it, unless it is there already.
    pub fn record(&self, id: &str) -> Result<(), JournalError> {
        let mut a = self.lock();
        if a.ids.contains(id) {
            return Ok(());
        }
        if let Some(kind) = a.failed {
            return Err(JournalError::Stopped {
                path: self.path.clone(),
                cause: kind.into(),
            });
        }
        debug_assert!(is_study_id(id), "study id {id:?}");
        let line = format!("{}{id}\n", if a.mid_line { "\n" } else { "" });
        let written = a
            .file
            .write_all(line.as_bytes())
            .and_then(|()| a.file.sync_data());
        if let Err(source) = written {
            a.failed = Some(source.kind());
            return Err(JournalError::Io {
                path: self.path.clone(),
                source,
            });
        }
        a.mid_line = false;
        a.ids.insert(id.to_string());
        Ok(())
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Appending> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether a journal is at `path` to be read: if not, refused when the state
/// file records one it does not ask to replace. An empty file is one whose
/// creation a crash cut short before its first line: none, unless the state
/// file records a journal.
fn found(path: &Path, expected: &Expected<'_>) -> Result<bool, JournalError> {
    let exists = match std::fs::metadata(path) {
        Ok(m) => m.len() > 0 || (expected.name.is_some() && expected.replace.is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(source) => {
            return Err(JournalError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    match (exists, expected.name, expected.replace) {
        (false, Some(name), None) => Err(JournalError::Missing {
            path: path.to_path_buf(),
            expected: name.to_string(),
        }),
        _ => Ok(exists),
    }
}

/// The journal that goes with the state file at `state`, unless put elsewhere.
pub fn beside(state: &Path) -> PathBuf {
    let mut name = state.as_os_str().to_owned();
    name.push(".released");
    PathBuf::from(name)
}

/// The journal's name and ids, or the first line that is wrong and how.
fn parse(text: &[u8]) -> Result<(String, HashSet<String>), (usize, &'static str)> {
    let mut lines = text.split(|&b| b == b'\n');
    let name = lines
        .next()
        .and_then(|l| std::str::from_utf8(l).ok())
        .and_then(|l| l.strip_prefix(HEADER))
        .filter(|n| is_study_id(n))
        .ok_or((1, "not `dpca release journal NAME`"))?;
    let mut ids = HashSet::new();
    for (i, line) in lines.enumerate() {
        if line.is_empty() {
            continue;
        }
        let id = std::str::from_utf8(line).ok().filter(|id| is_study_id(id));
        ids.insert(id.ok_or((i + 2, "not a study id"))?.to_string());
    }
    Ok((name.to_string(), ids))
}

/// What a study id may be, as the proxy makes and the spec checks them.
fn is_study_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= dpca_common::study::MAX_ID_BYTES
        && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Syncs the folder holding `path`, so a file created there survives a crash.
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

    fn new(name: Option<&str>) -> Expected<'_> {
        Expected {
            name,
            replace: None,
            fresh_name: "j1".into(),
        }
    }

    #[test]
    fn a_recorded_id_is_held_after_a_reopen_and_recorded_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb.released");
        let journal = ReleaseJournal::open(&path, new(None)).expect("created");
        assert_eq!(journal.name(), "j1");
        assert!(!journal.holds("s1"));
        journal.record("s1").expect("recorded");
        journal.record("s1").expect("again");
        assert!(journal.holds("s1"));
        drop(journal);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, "dpca release journal j1\ns1\n");
        let journal = ReleaseJournal::open(&path, new(Some("j1"))).expect("reopened");
        assert!(journal.holds("s1") && !journal.holds("s2"));
    }

    /// A last line with no newline (an append cut short, a hand edit) is kept as
    /// an id, never cut off, and the next append starts a line of its own.
    #[test]
    fn a_last_line_without_its_newline_is_kept_and_the_next_starts_anew() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        std::fs::write(&path, "dpca release journal j1\ns1\ns2").expect("write");
        let journal = ReleaseJournal::open(&path, new(Some("j1"))).expect("opened");
        assert!(journal.holds("s1") && journal.holds("s2"));
        journal.record("s3").expect("recorded");
        drop(journal);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, "dpca release journal j1\ns1\ns2\ns3\n");
    }

    /// A line that is no id is refused by its number, never skipped: the study
    /// it named could be released again. Nothing is written to the file.
    #[test]
    fn a_damaged_journal_is_refused_naming_the_line_and_left_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        for (body, line) in [
            (&b"dpca release journal j1\ns1\n\xff\xfe\n"[..], 3),
            (b"dpca release journal j1\ns2 with spaces", 2),
            (b"s1\ns2\n", 1),
        ] {
            std::fs::write(&path, body).expect("write");
            let err = ReleaseJournal::open(&path, new(Some("j1"))).expect_err("damaged");
            assert!(
                matches!(err, JournalError::Damaged { line: l, .. } if l == line),
                "{err}"
            );
            assert!(err.to_string().contains(&format!("line {line}")), "{err}");
            assert_eq!(std::fs::read(&path).expect("read"), body, "changed");
        }
    }

    /// A journal the state file was served with and that is gone, or another
    /// journal, is refused rather than started afresh, unless adopted.
    #[test]
    fn a_missing_or_other_journal_is_refused_unless_adopted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        let err = ReleaseJournal::open(&path, new(Some("j0"))).expect_err("missing");
        assert!(matches!(err, JournalError::Missing { .. }), "{err}");
        assert!(!path.exists(), "created all the same");
        ReleaseJournal::open(&path, new(None)).expect("created");
        let err = ReleaseJournal::open(&path, new(Some("j0"))).expect_err("another");
        assert!(matches!(err, JournalError::Other { .. }), "{err}");
        let adopted = Expected {
            replace: Some("j0"),
            ..new(Some("j0"))
        };
        let journal = ReleaseJournal::open(&path, adopted).expect("adopted");
        assert_eq!(journal.name(), "j1");
    }

    /// A journal whose creation a crash cut short before its first line was on
    /// disk is empty: taken as new while the state file records none.
    #[test]
    fn an_empty_journal_nothing_records_is_taken_as_new() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j");
        std::fs::write(&path, "").expect("write");
        let journal = ReleaseJournal::open(&path, new(None)).expect("taken as new");
        assert_eq!(journal.name(), "j1");
        drop(journal);
        std::fs::write(&path, "").expect("write");
        let err = ReleaseJournal::open(&path, new(Some("j1"))).expect_err("recorded");
        assert!(
            matches!(err, JournalError::Damaged { line: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_journal_goes_beside_its_state_file() {
        assert_eq!(
            beside(Path::new("/var/lib/dpca/proxy.redb")),
            PathBuf::from("/var/lib/dpca/proxy.redb.released")
        );
    }
}
