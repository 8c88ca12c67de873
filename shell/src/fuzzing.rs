//! Entry points for fuzzing the decoders of untrusted bytes: one function per
//! cargo-fuzz target in `fuzz/`, also replayed over the committed corpus by the
//! test `fuzz_corpus_replays` so that every finding stays fixed. Each function must
//! return (accept or refuse the input) and never panic, whatever the bytes.

use std::sync::OnceLock;

use dpca_common::data::{read_bounds, read_csv, read_schema};
use dpca_common::paillier::PublicKey;
use num_bigint::BigUint;
use prost::Message;

use dpca_proto::convert::spec_from_wire;
use dpca_proto::v1;

/// A fixed 2048-bit odd modulus: range and coprimality checks of ciphertexts need a
/// key, not a secret. (2^2047 + 2^1024 + 1, odd, 2048 bits.)
fn fuzz_key() -> &'static PublicKey {
    static KEY: OnceLock<PublicKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let n = (BigUint::from(1u8) << 2047usize) + (BigUint::from(1u8) << 1024usize) + 1u8;
        PublicKey::from_modulus(n).expect("an odd 2048-bit modulus is accepted")
    })
}

/// The proxy's `OpenStudy` edge: a request decoded and its spec fully validated.
pub fn open_study(data: &[u8]) {
    if let Ok(req) = v1::OpenStudyRequest::decode(data) {
        if let Some(spec) = req.spec {
            let _ = spec_from_wire(&spec);
        }
    }
}

/// The owner's `GetStudy` edge: a study description from the proxy.
pub fn study_info(data: &[u8]) {
    if let Ok(info) = v1::StudyInfo::decode(data) {
        if let Some(spec) = info.spec {
            let _ = spec_from_wire(&spec);
        }
    }
}

/// The proxy's `Contribute` edge: a chunk decoded and its ciphertexts validated
/// (range and membership in Z*_(n^2)).
pub fn contribution_chunk(data: &[u8]) {
    if let Ok(chunk) = v1::ContributionChunk::decode(data) {
        let _ = fuzz_key().ciphertexts_from_bytes(&chunk.ciphertexts, 0);
    }
}

/// The user's `FetchResult` edge: a result chunk from the proxy.
pub fn result_chunk(data: &[u8]) {
    if let Ok(chunk) = v1::ResultChunk::decode(data) {
        let _ = fuzz_key().ciphertexts_from_bytes(&chunk.ciphertexts, 0);
    }
}

/// An owner's data file and a bounds file: CSV text of any shape.
pub fn csv_files(data: &[u8]) {
    if let Ok(table) = read_csv(data, "fuzz.csv", Some("label")) {
        let _ = table.class_indices(&["0".to_string(), "1".to_string()], "fuzz.csv");
        let _ = table.bounds_from_data();
    }
    let _ = read_bounds(data, &["a".to_string(), "b".to_string()]);
    let _ = read_schema(data, "fuzz.csv", Some("label"));
}

/// An owner's invitation file (`owner --invitation`): TOML from the data user,
/// parsed and validated.
pub fn invitation(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(inv) =
            crate::invitation::Invitation::parse(text, std::path::Path::new("fuzz.toml"))
        {
            // What validates must read back as itself.
            let again =
                crate::invitation::Invitation::parse(&inv.to_toml(), std::path::Path::new("again"));
            assert_eq!(again.ok(), Some(inv));
        }
    }
}

/// The proxy's view of a peer: the role and name read off a certificate's DER
/// (after rustls has checked its chain, but the subject is parsed here).
pub fn peer_certificate(data: &[u8]) {
    let _ = crate::tls::peer_of(data);
}

/// Records of the proxy's state database: a study record decoded, its spec
/// validated and its release checked, as `dpca_proxy::store` does before the layout
/// checks; a contributor row decoded; a stored slice of ciphertexts split and checked.
pub fn stored_study(data: &[u8]) {
    if let Ok(rec) = v1::StoredStudy::decode(data) {
        if let Some(spec) = rec.spec {
            let _ = spec_from_wire(&spec);
        }
        let _ = fuzz_key().ciphertexts_from_bytes(&rec.released, 0);
    }
    let _ = v1::StoredContributor::decode(data);
    let key = fuzz_key();
    let _ = key.ciphertexts_from_bytes(&data.chunks(key.ciphertext_bytes()).collect::<Vec<_>>(), 0);
}

/// The messages of masked contributions, at each edge that reads them: the
/// holder's `HoldMasks` (a spec validated), `DepositSeed` (a seed of 32 bytes),
/// `FetchMaskSum` and its stored record (spec validated, seeds of 32 bytes);
/// the user's `MaskSumChunk` (each value below n).
pub fn mask_messages(data: &[u8]) {
    if let Ok(req) = v1::HoldMasksRequest::decode(data) {
        if let Some(spec) = req.spec {
            let _ = spec_from_wire(&spec);
        }
    }
    if let Ok(req) = v1::DepositSeedRequest::decode(data) {
        let _ = <[u8; 32]>::try_from(req.seed.as_slice());
    }
    let _ = v1::FetchMaskSumRequest::decode(data);
    if let Ok(rec) = v1::StoredHeldStudy::decode(data) {
        // As the holder reads its records: the spec as stored.
        if let Some(spec) = rec.spec {
            let _ = dpca_proto::convert::stored_spec_from_wire(&spec);
        }
        for s in rec.seeds {
            let _ = <[u8; 32]>::try_from(s.seed.as_slice());
        }
    }
    if let Ok(chunk) = v1::MaskSumChunk::decode(data) {
        let n = fuzz_key().n();
        let _ = chunk.sums.iter().all(|v| &BigUint::from_bytes_be(v) < n);
    }
}

/// The proxy's door on its main port: the first bytes of a connection, read for
/// the lane their ClientHello asks for, before any handshake. The door decides on
/// a peek, which may hold more than the first record: once decided, what came
/// after must not change the answer.
pub fn client_hello(data: &[u8]) {
    use crate::tls::lane::{hello_lane, Hello};
    let lane = hello_lane(data);
    if lane != Hello::Incomplete {
        let mut more = data.to_vec();
        more.extend_from_slice(&[0x16, 0x03, 0x01, 0xff, 0xff]);
        assert_eq!(
            hello_lane(&more),
            lane,
            "bytes after the first record changed the lane"
        );
    }
}

/// A fuzz target: its name (the folder of its corpus) and its entry point.
pub type Target = (&'static str, fn(&[u8]));

/// Every target by name, for the corpus replay.
pub const TARGETS: [Target; 10] = [
    ("open_study", open_study),
    ("study_info", study_info),
    ("contribution_chunk", contribution_chunk),
    ("result_chunk", result_chunk),
    ("invitation", invitation),
    ("csv_files", csv_files),
    ("peer_certificate", peer_certificate),
    ("stored_study", stored_study),
    ("client_hello", client_hello),
    ("mask_messages", mask_messages),
];
