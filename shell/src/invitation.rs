//! The invitation a data user hands each owner out of band: the study to join and
//! the fingerprint of the key to encrypt for. An owner that reads it from a file
//! (`owner --invitation`) still checks the study's key against the fingerprint, so a
//! forged invitation can at worst point the owner at a study it then refuses or at
//! a key whose holder wrote the invitation.
//!
//! The file is TOML with the owner's flag names as keys:
//!
//! ```toml
//! study = "3f2a..."
//! key-fingerprint = "9c1e..."
//! spec-digest = "5b0d..."
//! ```
//!
//! The spec digest ([`spec_digest`]) pins the whole spec the user opened: where
//! the owners add the noise, the spec sizes each owner's share, and a proxy that
//! served owners another (a larger `min_owners`) would shrink it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why an invitation could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum InvitationError {
    /// Reading or writing the file failed.
    #[error("invitation {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not an invitation.
    #[error("invitation {}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Which study to join, and for which key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Invitation {
    /// The study's id at the proxy.
    pub study: String,
    /// SHA-256 fingerprint (64 hex digits) of the data user's public key.
    pub key_fingerprint: String,
    /// SHA-256 (64 hex digits) of the study's spec as the user opened it
    /// ([`spec_digest`]); an invitation written before it existed has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_digest: Option<String>,
}

/// SHA-256 of `spec` as the wire carries it, in hex: what an invitation pins and
/// an owner's ledger records. Both sides encode with the same layout version.
pub fn spec_digest(spec: &dpca_common::study::StudySpec) -> String {
    use prost::Message;
    let wire = dpca_proto::convert::spec_to_wire(spec).encode_to_vec();
    let digest = ring::digest::digest(&ring::digest::SHA256, &wire);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A SHA-256 in hex: 64 hex digits.
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// A study id's shape: 1 to 128 letters, digits, `-` and `_`. The proxy draws
/// them so; a user checks the id the proxy gives a new study before it prints or
/// writes it anywhere, and an owner the id an invitation names.
pub fn check_study_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match ok {
        true => Ok(()),
        false => Err(format!("{id:?} is not a study id")),
    }
}

impl Invitation {
    /// Checks the fields' shapes: a study id of letters, digits, `-` and `_`, and a
    /// fingerprint of 64 hex digits.
    pub fn validate(&self) -> Result<(), String> {
        check_study_id(&self.study)?;
        if !is_sha256_hex(&self.key_fingerprint) {
            return Err(format!(
                "`{}` is not a key fingerprint (64 hex digits)",
                self.key_fingerprint
            ));
        }
        if let Some(d) = self.spec_digest.as_ref().filter(|d| !is_sha256_hex(d)) {
            return Err(format!("`{d}` is not a spec digest (64 hex digits)"));
        }
        Ok(())
    }

    /// The invitation as TOML.
    pub fn to_toml(&self) -> String {
        let digest = match &self.spec_digest {
            Some(d) => format!("spec-digest = \"{d}\"\n"),
            None => String::new(),
        };
        format!(
            "# An invitation to a private PCA study (owner --invitation FILE).\n\
             study = \"{}\"\nkey-fingerprint = \"{}\"\n{digest}",
            self.study, self.key_fingerprint
        )
    }

    /// Parses and validates an invitation; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, InvitationError> {
        let invalid = |reason: String| InvitationError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let inv: Invitation = toml::from_str(text).map_err(|e| invalid(e.message().into()))?;
        inv.validate().map_err(invalid)?;
        Ok(inv)
    }

    /// Writes the invitation so that a reader never sees half of it: to a temporary
    /// file beside `path`, then renamed over it.
    pub fn write(&self, path: &Path) -> Result<(), InvitationError> {
        self.validate().map_err(|reason| InvitationError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        let io = |source| InvitationError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".partial");
        std::fs::write(&tmp, self.to_toml()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads the invitation at `path`.
    pub fn read(path: &Path) -> Result<Self, InvitationError> {
        let text = std::fs::read_to_string(path).map_err(|source| InvitationError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn an_invitation_reads_back_as_written(
            study in "[A-Za-z0-9_-]{1,64}",
            fp in "[0-9a-f]{64}",
            digest in proptest::option::of("[0-9a-f]{64}"),
        ) {
            let inv = Invitation { study, key_fingerprint: fp, spec_digest: digest };
            let back = Invitation::parse(&inv.to_toml(), Path::new("inv.toml"));
            prop_assert_eq!(back.ok(), Some(inv));
        }
    }

    #[test]
    fn a_bad_invitation_names_the_file_and_what_is_wrong() {
        let p = Path::new("inv.toml");
        let fp = "ab".repeat(32);
        let cases = [
            (
                format!("study = \"a b\"\nkey-fingerprint = \"{fp}\""),
                "a b",
            ),
            ("study = \"s\"\nkey-fingerprint = \"xyz\"".into(), "xyz"),
            (
                format!("study = \"s\"\nkey-fingerprint = \"{fp}\"\nextra = 1"),
                "extra",
            ),
            ("study = \"s\"".into(), "key-fingerprint"),
            ("not toml".into(), "inv.toml"),
            (
                format!("study = \"s\\u001b[2J\"\nkey-fingerprint = \"{fp}\""),
                "\"s\\u{1b}[2J\" is not a study id",
            ),
        ];
        for (text, needle) in cases {
            let err = Invitation::parse(&text, p).expect_err(&text).to_string();
            assert!(err.contains("inv.toml") && err.contains(needle), "{err}");
        }
    }

    #[test]
    fn a_written_invitation_replaces_the_old_one_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("invitation.toml");
        let fp = "cd".repeat(32);
        for study in ["first", "second"] {
            let inv = Invitation {
                study: study.into(),
                key_fingerprint: fp.clone(),
                spec_digest: Some("ef".repeat(32)),
            };
            inv.write(&path).expect("write");
            assert_eq!(Invitation::read(&path).expect("read"), inv);
        }
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    }
}
