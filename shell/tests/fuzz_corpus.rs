//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same entry
//! points the cargo-fuzz targets call, so every input a fuzzer kept, and every
//! crash it found, is checked by the ordinary test run. A panic fails the test.

use std::path::PathBuf;

use dpca_proto::convert::spec_from_wire;
use dpca_proto::v1;
use dpca_shell::fuzzing::TARGETS;
use prost::Message;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("corpus entry").path();
            let bytes = std::fs::read(&path).expect("corpus file");
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn fuzz_corpus_replays() {
    for (target, run) in TARGETS {
        let files = corpus(target);
        assert!(!files.is_empty(), "no corpus for {target}");
        for (path, bytes) in files {
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(outcome.is_ok(), "{target} panicked on {}", path.display());
        }
    }
}

/// The hand-made seeds are valid messages, so fuzzing starts deep in the validators
/// rather than at the protobuf decoder.
#[test]
fn seed_specs_are_valid_studies() {
    for name in ["plain", "classes", "projection", "histogram", "marginals"] {
        let (_, bytes) = corpus("open_study")
            .into_iter()
            .find(|(p, _)| p.ends_with(name))
            .unwrap_or_else(|| panic!("seed {name} missing"));
        let req = v1::OpenStudyRequest::decode(bytes.as_slice()).expect("decodes");
        let spec = req.spec.expect("has a spec");
        if let Err(e) = spec_from_wire(&spec) {
            panic!("seed {name} refused: {e}");
        }
    }
}

/// The certificate seeds are what `user dev-certs` writes, read as the proxy reads
/// them; the state seeds are records of each phase.
#[test]
fn certificate_and_state_seeds_decode() {
    for (name, role) in [
        ("user", dpca_shell::tls::Role::User),
        ("owner-01", dpca_shell::tls::Role::Owner),
        ("proxy", dpca_shell::tls::Role::Proxy),
    ] {
        let (_, der) = corpus("peer_certificate")
            .into_iter()
            .find(|(p, _)| p.ends_with(name))
            .unwrap_or_else(|| panic!("seed {name} missing"));
        let peer = dpca_shell::tls::peer_of(&der).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((peer.role, peer.name.as_str()), (role, name));
    }
    for name in ["collecting", "released", "aborted"] {
        let (_, bytes) = corpus("stored_study")
            .into_iter()
            .find(|(p, _)| p.ends_with(name))
            .unwrap_or_else(|| panic!("seed {name} missing"));
        let rec = v1::StoredStudy::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(rec.phase, name);
        let spec = rec.spec.expect("has a spec");
        spec_from_wire(&spec).unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
}

/// The ClientHello seeds are OpenSSL's (`s_client -alpn ...`), not our client's:
/// another TLS stack's hello asking for the status lane is read as asking, and
/// one that does not, or is cut short, is not.
#[test]
fn client_hello_seeds_are_read_for_their_lane() {
    use dpca_shell::tls::lane::{hello_lane, Hello};
    for (name, lane) in [
        ("openssl-status", Hello::Status),
        ("openssl-h2", Hello::Other),
        ("openssl-no-alpn", Hello::Other),
        ("openssl-status-cut", Hello::Incomplete),
    ] {
        let (_, bytes) = corpus("client_hello")
            .into_iter()
            .find(|(p, _)| p.ends_with(name))
            .unwrap_or_else(|| panic!("seed {name} missing"));
        assert_eq!(hello_lane(&bytes), lane, "{name}");
    }
}
