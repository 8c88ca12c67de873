//! What one caller may make the proxy hold (pure).
//!
//! A study's spec is sent by a user and fixes everything the proxy will allocate for
//! it: the number of ciphertexts of each contribution and of the release, their size
//! (the key), and the record stored on every transition. Unchecked, one OpenStudy of
//! half a megabyte asks for millions of ciphertexts and a record of gigabytes, which
//! the proxy would also reload after a restart. These limits are checked at the edge,
//! before anything is built from the spec, and an operator can set each of them.

use std::time::Duration;

use dpca_common::study::LayoutSize;
use dpca_proto::v1;
use prost::Message;

use crate::access::Method;

/// Bounds on what a study may ask of the proxy and how long a connection may wait.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Encoded size of a study spec (bytes): names, bounds, classes, projection,
    /// invited owners.
    pub max_spec_bytes: usize,
    /// Features (M) of a study.
    pub max_features: usize,
    /// Paillier modulus size (bits): every ciphertext is twice this.
    pub max_key_bits: u64,
    /// Ciphertexts of one contribution, and of one release.
    pub max_ciphertexts: usize,
    /// A connection that has not finished its TLS handshake by then is closed.
    pub handshake_timeout: Duration,
    /// An upload that sends nothing for this long is dropped and its slot freed.
    pub upload_idle_timeout: Duration,
    /// Studies open (collecting or sealed) at once, over all users: each holds an
    /// aggregate in memory and a record on disk.
    pub max_open_studies: usize,
    /// Studies open at once by one user.
    pub max_open_studies_per_user: usize,
    /// Ended studies (released or aborted) kept per user: when a user opens a
    /// study, its ended ones past its newest this many are dropped, from memory
    /// and the state file. Ended studies count against no other limit, so without
    /// this a user that opens study after study, each ending at once, grows both
    /// without bound.
    pub max_ended_studies_per_user: usize,
    /// Slowest upload accepted (bytes per second): a contribution of B bytes must
    /// arrive within the idle timeout plus B over this rate, so no sender keeps
    /// a slot by trickling.
    pub min_upload_rate: u64,
}

/// Default [`Limits::max_open_studies`]: with the other defaults, at most a few
/// GiB of aggregates at 4096 bits.
pub const DEFAULT_MAX_OPEN_STUDIES: usize = 64;
/// Default [`Limits::max_open_studies_per_user`].
pub const DEFAULT_MAX_OPEN_STUDIES_PER_USER: usize = 8;

/// Default [`Limits::max_ended_studies_per_user`]: a user reads its result in
/// the run that opened the study (its key lives in that run only), so these serve
/// the status history, and twice the open studies a user may hold is ample.
pub const DEFAULT_MAX_ENDED_STUDIES_PER_USER: usize = 16;

/// Default [`Limits::min_upload_rate`]: 64 KiB/s, a contribution of M = 1000 at
/// 3072 bits (9.9 MB) in about two and a half minutes.
pub const DEFAULT_MIN_UPLOAD_RATE: u64 = 64 * 1024;

/// Default [`Limits::max_spec_bytes`]: a spec of a few thousand features with a
/// projection fits in it.
pub const DEFAULT_MAX_SPEC_BYTES: usize = 1 << 20;
/// Default [`Limits::max_features`]: twice the largest table benchmarked (M = 1000).
pub const DEFAULT_MAX_FEATURES: usize = 2000;
/// Default [`Limits::max_key_bits`]: above the 3072 bits recommended for new keys.
pub const DEFAULT_MAX_KEY_BITS: u64 = 4096;
/// Default [`Limits::max_ciphertexts`], the owners' default too.
pub use dpca_common::study::DEFAULT_MAX_CIPHERTEXTS;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_spec_bytes: DEFAULT_MAX_SPEC_BYTES,
            max_features: DEFAULT_MAX_FEATURES,
            max_key_bits: DEFAULT_MAX_KEY_BITS,
            max_ciphertexts: DEFAULT_MAX_CIPHERTEXTS,
            handshake_timeout: Duration::from_secs(10),
            upload_idle_timeout: Duration::from_secs(60),
            min_upload_rate: DEFAULT_MIN_UPLOAD_RATE,
            max_open_studies: DEFAULT_MAX_OPEN_STUDIES,
            max_open_studies_per_user: DEFAULT_MAX_OPEN_STUDIES_PER_USER,
            max_ended_studies_per_user: DEFAULT_MAX_ENDED_STUDIES_PER_USER,
        }
    }
}

/// A study refused because it asks for more than the proxy's limits allow.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// The spec's encoding is too large.
    #[error(
        "the study spec is {bytes} bytes; this proxy accepts at most {max} (--max-spec-bytes)"
    )]
    Spec {
        /// Its encoded size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Too many features.
    #[error(
        "the study has {features} features; this proxy accepts at most {max} (--max-features)"
    )]
    Features {
        /// Features asked for.
        features: usize,
        /// The limit.
        max: usize,
    },
    /// The key is too large.
    #[error(
        "the study's Paillier key has {bits} bits; this proxy accepts at most {max} (--max-key-bits)"
    )]
    Key {
        /// Bits of the modulus as sent (its byte length times 8).
        bits: u64,
        /// The limit.
        max: u64,
    },
    /// Too many studies open, in all or by this user.
    #[error(
        "{open} studies are open{}; this proxy holds at most {max} (--max-open-studies{})",
        by.as_ref().map(|u| format!(" by `{u}`")).unwrap_or_default(),
        if by.is_some() { "-per-user" } else { "" }
    )]
    Studies {
        /// Studies open now.
        open: usize,
        /// The limit.
        max: usize,
        /// The user, when the per-user limit refused.
        by: Option<String>,
    },
    /// A contribution or the release would hold too many ciphertexts.
    #[error(
        "the study's {what} would hold {count} ciphertexts; this proxy accepts at most {max} \
         (--max-ciphertexts)"
    )]
    Ciphertexts {
        /// "contributions" or "release".
        what: &'static str,
        /// Ciphertexts it would hold.
        count: usize,
        /// The limit.
        max: usize,
    },
}

/// A study as the limits on what a user holds see it.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldStudy {
    /// Its id.
    pub id: String,
    /// The user who opened it (`None`: plaintext).
    pub opened_by: Option<String>,
    /// Collecting or sealed, its deadline applied; otherwise ended.
    pub open: bool,
    /// Its deadline, which orders a user's ended studies, oldest first.
    pub deadline_unix_ms: u64,
}

/// Room in a request beyond its spec or its ciphertexts: ids, a signature, a
/// public key, the protobuf framing.
const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;

/// The 5 bytes gRPC puts before each message: a flag, then the message's length
/// (4 bytes, big-endian).
pub(crate) const GRPC_FRAME_BYTES: usize = 5;

/// The largest request of a call that carries a study id and nothing else
/// (`GetStudy`, `AwaitSeal`, `FetchResult`; `Status` carries nothing), or three
/// ids (`ReserveUpload`): ids of at most `study::MAX_ID_BYTES` and their framing,
/// with room to spare.
pub const SMALL_REQUEST_BYTES: usize = 1024;

impl Limits {
    /// The largest request message the proxy decodes: a spec at the spec limit or a
    /// chunk of ciphertexts at the key limit, with room for the rest. tonic decodes
    /// a unary request whole before the handler can authorize its caller, so this,
    /// not the protocol's 4 MiB, bounds what one stalled call pins in memory; the
    /// gate holds every call but a user's `OpenStudy` and an owner's upload far
    /// below it ([`Limits::request_cap`]).
    pub fn max_request_bytes(&self) -> usize {
        let ciphertext_bytes = usize::try_from(self.max_key_bits / 4).unwrap_or(usize::MAX);
        let chunk = ciphertext_bytes.saturating_mul(dpca_proto::convert::CIPHERTEXTS_PER_CHUNK);
        self.max_spec_bytes
            .max(chunk)
            .saturating_add(REQUEST_OVERHEAD_BYTES)
            .min(dpca_proto::convert::MAX_MESSAGE_BYTES)
    }

    /// The largest request body (its gRPC framing included) a call of `method`
    /// may send, which the gate (`gate::Gate`) checks as the body arrives, before
    /// the handler decodes it: a spec for `OpenStudy`, an id for the calls that
    /// name a study, and an id with the opening of `E[N]` (N and a root below n)
    /// for `Release`. `None` for an upload, whose chunks tonic bounds one by one
    /// at [`Limits::max_request_bytes`] and whose whole its time allowance bounds
    /// ([`Limits::upload_allowance`]).
    pub fn request_cap(&self, method: Method) -> Option<usize> {
        let key_bytes = usize::try_from(self.max_key_bits / 8).unwrap_or(usize::MAX);
        match method {
            // A spec; or the owners a spec could name.
            Method::OpenStudy | Method::HoldMasks | Method::FetchMaskSum => {
                Some(self.max_request_bytes().saturating_add(GRPC_FRAME_BYTES))
            }
            Method::GetStudy
            | Method::AwaitSeal
            | Method::FetchResult
            | Method::Status
            | Method::ReserveUpload
            | Method::DepositSeed => Some(SMALL_REQUEST_BYTES),
            Method::Release => Some(SMALL_REQUEST_BYTES.saturating_add(key_bytes)),
            Method::Contribute => None,
        }
    }

    /// Checks a spec as it arrived, before anything (the key's tables, the layout)
    /// is built from it.
    pub fn check_wire(&self, spec: &v1::StudySpec) -> Result<(), LimitError> {
        let bytes = spec.encoded_len();
        if bytes > self.max_spec_bytes {
            return Err(LimitError::Spec {
                bytes,
                max: self.max_spec_bytes,
            });
        }
        if spec.features.len() > self.max_features {
            return Err(LimitError::Features {
                features: spec.features.len(),
                max: self.max_features,
            });
        }
        // Leading zero bytes would only understate the size: they count too.
        let bits = spec.public_key.len() as u64 * 8;
        if bits > self.max_key_bits {
            return Err(LimitError::Key {
                bits,
                max: self.max_key_bits,
            });
        }
        Ok(())
    }

    /// Checks that one more study, opened by `user`, fits beside the open ones of
    /// `held` (ended ones count against no limit here: [`Limits::ended_to_drop`]).
    pub fn check_open(&self, held: &[HeldStudy], user: Option<&str>) -> Result<(), LimitError> {
        let open = held.iter().filter(|s| s.open);
        let all = open.clone().count();
        if all >= self.max_open_studies {
            return Err(LimitError::Studies {
                open: all,
                max: self.max_open_studies,
                by: None,
            });
        }
        let mine = open.filter(|s| s.opened_by.as_deref() == user).count();
        if mine >= self.max_open_studies_per_user {
            return Err(LimitError::Studies {
                open: mine,
                max: self.max_open_studies_per_user,
                by: Some(user.unwrap_or("plaintext").to_string()),
            });
        }
        Ok(())
    }

    /// The ended studies of `user` to drop as it opens another: all but its newest
    /// [`Limits::max_ended_studies_per_user`] (by deadline, then id, so the choice
    /// does not depend on the order `held` lists them in).
    pub fn ended_to_drop(&self, held: &[HeldStudy], user: Option<&str>) -> Vec<String> {
        let mut ended: Vec<&HeldStudy> = held
            .iter()
            .filter(|s| !s.open && s.opened_by.as_deref() == user)
            .collect();
        ended.sort_by(|a, b| (b.deadline_unix_ms, &b.id).cmp(&(a.deadline_unix_ms, &a.id)));
        ended
            .into_iter()
            .skip(self.max_ended_studies_per_user)
            .map(|s| s.id.clone())
            .collect()
    }

    /// How long an upload of `bytes` may take once admitted.
    pub fn upload_allowance(&self, bytes: usize) -> Duration {
        let rate = self.min_upload_rate.max(1) as f64;
        self.upload_idle_timeout + Duration::from_secs_f64(bytes as f64 / rate)
    }

    /// Checks what the study's layout will make the proxy hold.
    pub fn check_layout(&self, layout: LayoutSize) -> Result<(), LimitError> {
        for (what, count) in [
            ("contributions", layout.owner_ciphertexts),
            ("release", layout.release_ciphertexts),
        ] {
            if count > self.max_ciphertexts {
                return Err(LimitError::Ciphertexts {
                    what,
                    count,
                    max: self.max_ciphertexts,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_bounded_by_what_a_study_may_send_not_by_the_protocols_limit() {
        let limits = Limits::default();
        let bound = limits.max_request_bytes();
        // A spec at its limit and a chunk of 4096-bit ciphertexts fit...
        assert!(bound >= limits.max_spec_bytes + 1024);
        assert!(bound >= 64 * 1024 + 1024);
        // ...and a quarter of the protocol's 4 MiB is all a stalled call can pin.
        assert!(
            bound <= dpca_proto::convert::MAX_MESSAGE_BYTES / 3,
            "{bound}"
        );
        let large = Limits {
            max_spec_bytes: 64 << 20,
            ..Limits::default()
        };
        assert_eq!(
            large.max_request_bytes(),
            dpca_proto::convert::MAX_MESSAGE_BYTES
        );
    }

    /// Each method's cap holds the largest request an honest party sends: an
    /// id at its longest, the opening of E[N] under the largest key allowed, a
    /// spec at its limit.
    #[test]
    fn every_methods_cap_holds_its_largest_honest_request() {
        let limits = Limits::default();
        let id = "x".repeat(dpca_common::study::MAX_ID_BYTES);
        let framed = |len: usize| len + GRPC_FRAME_BYTES;
        let study = v1::GetStudyRequest {
            study_id: id.clone(),
        };
        let reserve = v1::ReserveUploadRequest {
            study_id: id.clone(),
            owner_id: id.clone(),
            contribution_id: id.clone(),
        };
        let deposit = v1::DepositSeedRequest {
            study_id: id.clone(),
            owner_id: id.clone(),
            contribution_id: id.clone(),
            spec_digest: "f".repeat(64),
            seed: vec![0xff; 32],
        };
        let release = v1::ReleaseRequest {
            study_id: id.clone(),
            count: Some(v1::CountOpening {
                n_rows: u64::MAX,
                root: vec![0xff; (limits.max_key_bits / 8) as usize],
            }),
        };
        for method in Method::ALL {
            let largest = match method {
                Method::GetStudy | Method::AwaitSeal | Method::FetchResult => {
                    framed(study.encoded_len())
                }
                Method::Status => framed(v1::StatusRequest {}.encoded_len()),
                Method::ReserveUpload => framed(reserve.encoded_len()),
                Method::DepositSeed => framed(deposit.encoded_len()),
                Method::Release => framed(release.encoded_len()),
                // A spec at its limit, with its field's tag and length (and the
                // study id beside it).
                Method::OpenStudy | Method::HoldMasks => {
                    framed(limits.max_spec_bytes + 16 + study.encoded_len())
                }
                // The owners a spec at its limit could name.
                Method::FetchMaskSum => framed(limits.max_spec_bytes + study.encoded_len()),
                Method::Contribute => {
                    assert_eq!(limits.request_cap(method), None, "an upload is a stream");
                    continue;
                }
            };
            let cap = limits.request_cap(method).expect("a unary call's cap");
            assert!(largest <= cap, "{method:?}: {largest} > {cap}");
        }
    }

    fn wire(features: usize, key_bytes: usize) -> v1::StudySpec {
        v1::StudySpec {
            features: (0..features).map(|i| format!("f{i}")).collect(),
            public_key: vec![0xff; key_bytes],
            ..Default::default()
        }
    }

    #[test]
    fn each_limit_refuses_one_past_it_and_names_its_flag() {
        let limits = Limits {
            max_features: 10,
            max_key_bits: 2048,
            max_spec_bytes: 400,
            ..Limits::default()
        };
        assert_eq!(limits.check_wire(&wire(10, 256)), Ok(()));
        let err = limits.check_wire(&wire(11, 256)).expect_err("11 features");
        assert!(err.to_string().contains("--max-features"), "{err}");
        let err = limits.check_wire(&wire(10, 257)).expect_err("2056 bits");
        assert_eq!(
            err,
            LimitError::Key {
                bits: 2056,
                max: 2048
            }
        );
        let mut big = wire(10, 256);
        big.expected_owners = vec!["x".repeat(200)];
        let err = limits.check_wire(&big).expect_err("too long");
        assert!(err.to_string().contains("--max-spec-bytes"), "{err}");
    }

    #[test]
    fn open_studies_are_capped_in_all_and_per_user() {
        let limits = Limits {
            max_open_studies: 3,
            max_open_studies_per_user: 2,
            ..Limits::default()
        };
        let open = |v: &[&str]| v.iter().map(|u| held(u, true, 0)).collect::<Vec<_>>();
        assert_eq!(limits.check_open(&open(&["a"]), Some("a")), Ok(()));
        let mut with_ended = open(&["a"]);
        with_ended.extend((1..9).map(|d| held("a", false, d)));
        assert_eq!(limits.check_open(&with_ended, Some("a")), Ok(()), "ended");
        let err = limits
            .check_open(&open(&["a", "a"]), Some("a"))
            .expect_err("a's third");
        assert!(
            err.to_string().contains("--max-open-studies-per-user"),
            "{err}"
        );
        assert_eq!(limits.check_open(&open(&["a", "a"]), Some("b")), Ok(()));
        let err = limits
            .check_open(&open(&["a", "a", "b"]), Some("c"))
            .expect_err("fourth");
        assert!(err.to_string().contains("(--max-open-studies)"), "{err}");
    }

    fn held(user: &str, open: bool, deadline_unix_ms: u64) -> HeldStudy {
        HeldStudy {
            id: format!("{user}-{deadline_unix_ms}-{open}"),
            opened_by: Some(user.to_string()),
            open,
            deadline_unix_ms,
        }
    }

    #[test]
    fn a_user_keeps_its_newest_ended_studies_and_no_one_elses_are_touched() {
        let limits = Limits {
            max_ended_studies_per_user: 2,
            ..Limits::default()
        };
        let mut studies: Vec<HeldStudy> = [5, 1, 9, 3].map(|d| held("a", false, d)).to_vec();
        studies.extend([held("a", true, 0), held("b", false, 0), held("b", false, 1)]);
        studies.push(HeldStudy {
            opened_by: None,
            ..held("plain", false, 0)
        });
        let mut dropped = limits.ended_to_drop(&studies, Some("a"));
        dropped.sort();
        assert_eq!(dropped, ["a-1-false", "a-3-false"]);
        studies.reverse();
        let mut again = limits.ended_to_drop(&studies, Some("a"));
        again.sort();
        assert_eq!(again, dropped, "the order listed does not matter");
        assert!(limits.ended_to_drop(&studies, Some("b")).is_empty());
        assert!(limits.ended_to_drop(&studies, None).is_empty());
        let one = Limits {
            max_ended_studies_per_user: 1,
            ..limits
        };
        assert_eq!(one.ended_to_drop(&studies, Some("b")), ["b-0-false"]);
    }
}
