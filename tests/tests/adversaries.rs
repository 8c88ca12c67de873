//! The parties the protocol guards against, each deviating as it would if it paid,
//! against the real programs: every deviation is refused with a clear error, nothing
//! is released on its word, and the honest parties lose nothing.
//! docs/PRIVACY.md keeps the threat model these tests stand behind.

use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
use dpca_common::paillier::Ciphertext;
use dpca_proto::v1;
use dpca_tests::{describe, fixture, fixture_with, rt};
use num_bigint::BigUint;
use sha2::{Digest, Sha256};

/// A study of the paper's `mask` centering, which owners must accept by name.
fn mask_fixture() -> dpca_tests::StudyFixture {
    fixture_with(|spec| {
        spec.privacy =
            PrivacyRequest::new(Mechanism::Gaussian, Centering::Mask, 1.0, 1e-5).expect("privacy")
    })
}

/// Waits for the study to seal and returns its E[N] as the proxy sent it.
async fn sealed_count(
    f: &dpca_tests::StudyFixture,
    user: &mut v1::proxy_client::ProxyClient<tonic::transport::Channel>,
) -> (v1::SealedStudy, Ciphertext) {
    let sealed = user
        .await_seal(v1::AwaitSealRequest {
            study_id: f.study.clone(),
        })
        .await
        .expect("sealed")
        .into_inner();
    let ct =
        f.sk.public()
            .ciphertext_from_bytes(&sealed.encrypted_count, 0)
            .expect("valid E[N]");
    (sealed, ct)
}

/// A `mask` study's noise scales with N. A user that reports N' = the number of
/// owners would get the noise of a 2-row table on 60 rows; the proxy now takes N
/// only with an opening of E[N] that verifies, and the honest release follows.
#[test]
fn a_user_that_reports_fewer_rows_is_refused_and_nothing_is_released() {
    let f = mask_fixture();
    for (id, skip) in [("hospital-a", 0), ("hospital-b", 30)] {
        let data = f.good_file(&format!("{id}.csv"), 30, skip);
        let o = f.owner_accepting(id, &data, &["mask-centering"]);
        assert!(o.status.success(), "{}", describe(&o));
    }
    rt().block_on(async {
        let mut user = f.client("user").await;
        let (sealed, ct) = sealed_count(&f, &mut user).await;
        assert!(sealed.needs_count, "a mask study needs N");
        let honest = f.sk.open(&ct).expect("open");
        assert_eq!(honest.plaintext, BigUint::from(60u32));
        let claims = [
            // N' = owners, no proof at all.
            (2, Vec::new()),
            // N' = owners, with the root of the true N.
            (2, honest.root.to_bytes_be()),
            // N' = owners, with a made-up root.
            (2, BigUint::from(987_654_321u64).to_bytes_be()),
        ];
        for (n_rows, root) in claims {
            let err = user
                .release(v1::ReleaseRequest {
                    study_id: f.study.clone(),
                    count: Some(v1::CountOpening { n_rows, root }),
                })
                .await
                .expect_err("a made-up N was accepted");
            assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
            assert!(
                err.message().contains("does not verify"),
                "{}",
                err.message()
            );
        }
        let err = user
            .release(v1::ReleaseRequest {
                study_id: f.study.clone(),
                count: None,
            })
            .await
            .expect_err("a mask release without N");
        assert!(
            err.message().contains("needs the opening"),
            "{}",
            err.message()
        );
        // Nothing was released on the user's word.
        let err = f.fetch_refused(&mut user).await;
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        // The honest user still gets its release, calibrated to the true N.
        let collected = dpca_user::session::collect(&mut user, &f.sk, &f.spec, &f.study)
            .await
            .expect("honest release");
        assert_eq!(collected.n_rows, 60);
        assert_eq!(collected.owners_in.len(), 2);
    });
}

/// The proxy stores every contribution id. An unkeyed hash of (study, owner, file)
/// let it test guesses of an owner's rows offline; the id is now keyed with a secret
/// only the owner holds, so the proxy's best guess (the very file) does not match.
#[test]
fn a_curious_proxy_cannot_test_guesses_of_an_owners_rows_against_its_contribution_id() {
    let mut f = fixture();
    let file = f.good_file("one-row.csv", 1, 0);
    let o = f.owner("hospital-a", &file);
    assert!(o.status.success(), "{}", describe(&o));
    // A retry with the same file is still recognised (the id is stable).
    let again = f.owner("hospital-a", &file);
    assert!(again.status.success(), "{}", describe(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("\"newly_counted\":false"));
    // What the proxy holds, read from its state file once it has stopped.
    f.proxy.proc.0.kill().expect("stop the proxy");
    f.proxy.proc.0.wait().expect("reap the proxy");
    let store = dpca_proxy::store::Store::open(&f.proxy.state).expect("state");
    let studies = store.load_all().expect("records");
    let stored = studies[0].contributors()["hospital-a"].clone();
    // The guess: exactly the owner's file, hashed the way the old id was.
    let bytes = std::fs::read(&file).expect("file");
    let mut guess = Sha256::new();
    for part in [f.study.as_bytes(), b"hospital-a", &bytes] {
        guess.update((part.len() as u64).to_be_bytes());
        guess.update(part);
    }
    assert_ne!(
        stored,
        hex::encode(guess.finalize()),
        "the id is a hash of the rows"
    );
    assert_eq!(stored.len(), 64, "{stored}");
}

/// One dishonest owner working with the user breaks `mask` centering for everyone
/// (an encrypted v far outside the ball cannot be seen by the proxy), so an owner
/// takes part in a mask study only if it accepts that by name, and is told why;
/// a refused owner sends nothing.
#[test]
fn owners_refuse_a_mask_study_unless_they_accept_it_by_name() {
    let f = mask_fixture();
    let data = f.good_file("a.csv", 20, 0);
    let o = f.owner("hospital-a", &data);
    assert!(
        !o.status.success(),
        "joined a mask study unasked: {}",
        describe(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--accept-risk mask-centering"), "{err}");
    assert!(err.contains("norm ball"), "{err}");
    assert_eq!(f.owners_in(), 0, "a refused owner was counted");
    let o = f.owner_accepting("hospital-a", &data, &["mask-centering"]);
    assert!(o.status.success(), "{}", describe(&o));
    assert_eq!(f.owners_in(), 1);
    // The default study needs no such word.
    let d = fixture();
    let o = d.owner("hospital-a", &d.good_file("a.csv", 20, 0));
    assert!(o.status.success(), "{}", describe(&o));
}
