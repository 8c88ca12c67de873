//! Masked contributions against the real programs (`dpca_common::secagg`): a
//! proxy that keeps every contribution as it arrives decrypts each, with the
//! user's key, to values uniform mod n; the holder's one sum takes the masks
//! off the aggregate of the owners counted, and no other; an owner that drops
//! after depositing its seed leaves the study releasing.

use std::sync::{Arc, Mutex};

use dpca_common::paillier::SecretKey;
use dpca_proto::convert::spec_to_wire;
use dpca_proto::v1;
use dpca_tests::{describe, masked_fixture_with, rt, submit, StudyFixture};
use num_bigint::BigUint;
use num_traits::ToPrimitive;
use tonic::{Request, Response, Status, Streaming};

/// The uploads a [`Keeper`] kept, each whole, in the order they came.
type Kept = Arc<Mutex<Vec<(String, Vec<v1::ContributionChunk>)>>>;

/// An aggregating proxy that deviates by keeping every contribution as it
/// arrives: it serves the study's spec and answers each upload as counted.
struct Keeper {
    study: String,
    spec: v1::StudySpec,
    kept: Kept,
}

type Answer<T> = Result<Response<T>, Status>;
type Never<T> = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl v1::proxy_server::Proxy for Keeper {
    async fn get_study(&self, _: Request<v1::GetStudyRequest>) -> Answer<v1::StudyInfo> {
        Ok(Response::new(v1::StudyInfo {
            study_id: self.study.clone(),
            spec: Some(self.spec.clone()),
            state: "collecting".into(),
            ..Default::default()
        }))
    }
    async fn contribute(
        &self,
        req: Request<Streaming<v1::ContributionChunk>>,
    ) -> Answer<v1::ContributeResponse> {
        let mut stream = req.into_inner();
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.message().await? {
            chunks.push(chunk);
        }
        let owner = chunks
            .first()
            .map(|c| c.owner_id.clone())
            .unwrap_or_default();
        let mut kept = self.kept.lock().expect("kept");
        kept.push((owner, chunks));
        Ok(Response::new(v1::ContributeResponse {
            newly_counted: true,
            owners_in: kept.len() as u32,
            ..Default::default()
        }))
    }
    async fn open_study(&self, _: Request<v1::OpenStudyRequest>) -> Answer<v1::OpenStudyResponse> {
        Err(Status::unimplemented("a keeper"))
    }
    async fn reserve_upload(
        &self,
        _: Request<v1::ReserveUploadRequest>,
    ) -> Answer<v1::ReserveUploadResponse> {
        Err(Status::unimplemented("a keeper"))
    }
    async fn await_seal(&self, _: Request<v1::AwaitSealRequest>) -> Answer<v1::SealedStudy> {
        Err(Status::unimplemented("a keeper"))
    }
    async fn release(&self, _: Request<v1::ReleaseRequest>) -> Answer<v1::ReleaseResponse> {
        Err(Status::unimplemented("a keeper"))
    }
    type FetchResultStream = Never<v1::ResultChunk>;
    async fn fetch_result(
        &self,
        _: Request<v1::FetchResultRequest>,
    ) -> Answer<Self::FetchResultStream> {
        Err(Status::unimplemented("a keeper"))
    }
    async fn status(&self, _: Request<v1::StatusRequest>) -> Answer<v1::ProxyStatus> {
        Err(Status::unimplemented("a keeper"))
    }
    async fn hold_masks(&self, _: Request<v1::HoldMasksRequest>) -> Answer<v1::HoldMasksResponse> {
        Err(Status::unimplemented("a keeper"))
    }
    async fn deposit_seed(
        &self,
        _: Request<v1::DepositSeedRequest>,
    ) -> Answer<v1::DepositSeedResponse> {
        Err(Status::unimplemented("a keeper"))
    }
    type FetchMaskSumStream = Never<v1::MaskSumChunk>;
    async fn fetch_mask_sum(
        &self,
        _: Request<v1::FetchMaskSumRequest>,
    ) -> Answer<Self::FetchMaskSumStream> {
        Err(Status::unimplemented("a keeper"))
    }
}

/// Serves a [`Keeper`] of `f`'s study on a loopback port, with the proxy's
/// certificate of `f`'s PKI (so owners reach it as they would the proxy);
/// returns its URL and what it keeps.
fn start_keeper(f: &StudyFixture) -> (String, Kept) {
    let kept = Kept::default();
    let keeper = Keeper {
        study: f.study.clone(),
        spec: spec_to_wire(&f.spec),
        kept: Arc::clone(&kept),
    };
    let files = &f.proxy.pki.proxy;
    let read = |p: &std::path::Path| std::fs::read(p).expect("test PKI file");
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            read(&files.cert),
            read(&files.key),
        ))
        .client_ca_root(tonic::transport::Certificate::from_pem(read(&files.ca)));
    // A thread and runtime of its own: it serves while the test waits on owners.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("address"))
                .expect("the test waits");
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let served = tonic::transport::Server::builder()
                .tls_config(tls)
                .expect("TLS")
                .add_service(v1::proxy_server::ProxyServer::new(keeper))
                .serve_with_incoming(incoming)
                .await;
            served.expect("the keeper serves");
        });
    });
    let addr = rx.recv().expect("the keeper listens");
    (format!("https://{addr}"), kept)
}

/// Runs owner `id` on `rows` optdigits rows from `skip` on, for `f`'s study at
/// `url`, with the spec's digest pinned.
fn run_owner(f: &StudyFixture, url: &str, id: &str, (rows, skip): (usize, usize)) {
    let data = f.good_file(&format!("{id}-{skip}.csv"), rows, skip);
    let digest = dpca_shell::invitation::spec_digest(&f.spec);
    let mut cmd = f.owner_cmd(id);
    cmd.args(["--owner-id", id, "--spec-digest", &digest]);
    let out = submit(cmd, url, &f.study, &f.fingerprint, &data);
    assert!(out.status.success(), "{id}: {}", describe(&out));
}

/// Every plaintext of one kept upload, decrypted with the user's key.
fn decrypted(sk: &SecretKey, chunks: &[v1::ContributionChunk]) -> Vec<BigUint> {
    let pk = sk.public();
    let bytes: Vec<Vec<u8>> = chunks.iter().flat_map(|c| c.ciphertexts.clone()).collect();
    pk.ciphertexts_from_bytes(&bytes, 0)
        .expect("ciphertexts")
        .iter()
        .map(|c| sk.decrypt(c))
        .collect()
}

/// The Kolmogorov-Smirnov distance between `values / n` and the uniform law
/// on [0, 1).
fn ks_uniform(values: &[BigUint], n: &BigUint) -> f64 {
    let scale = n.bits().saturating_sub(52);
    let top = (n >> scale).to_f64().expect("52 bits");
    let mut u: Vec<f64> = values
        .iter()
        .map(|v| (v >> scale).to_f64().expect("52 bits") / top)
        .collect();
    u.sort_by(f64::total_cmp);
    let m = u.len() as f64;
    u.iter()
        .enumerate()
        .map(|(i, x)| (x - i as f64 / m).abs().max(((i + 1) as f64 / m - x).abs()))
        .fold(0.0, f64::max)
}

/// Pearson's correlation of `a / n` and `b / n`.
fn correlation(a: &[BigUint], b: &[BigUint], n: &BigUint) -> f64 {
    let scale = n.bits().saturating_sub(52);
    let f = |v: &[BigUint]| -> Vec<f64> {
        v.iter()
            .map(|x| (x >> scale).to_f64().expect("52 bits"))
            .collect()
    };
    let (x, y) = (f(a), f(b));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (mx, my) = (mean(&x), mean(&y));
    let cov: f64 = x.iter().zip(&y).map(|(p, q)| (p - mx) * (q - my)).sum();
    let var = |v: &[f64], m: f64| v.iter().map(|p| (p - m) * (p - m)).sum::<f64>();
    cov / (var(&x, mx) * var(&y, my)).sqrt()
}

/// Three owners (a and b with the same 30 rows, c with 30 others) send their
/// masked contributions to a proxy that keeps each as it arrives. Decrypted
/// with the user's key, every contribution's values are uniform mod n
/// (Kolmogorov-Smirnov at a level of 1e-6), a and b's identical shares give
/// uncorrelated values, and no row count can be read off any. The aggregate
/// less the holder's sum of the three owners' masks holds the 90 rows exactly
/// (and is far from uniform: the masks were what made each look so); a second
/// sum, of two of them, is refused.
#[test]
fn a_proxy_keeping_each_masked_contribution_decrypts_it_to_values_uniform_mod_n() {
    let f = masked_fixture_with(|s| {
        s.quorum = 3;
        s.min_owners = 2;
    });
    let (keeper, kept) = start_keeper(&f);
    for (id, skip) in [("hospital-a", 0), ("hospital-b", 0), ("c", 30)] {
        run_owner(&f, &keeper, id, (30, skip));
    }
    let kept = kept.lock().expect("kept").clone();
    assert_eq!(kept.len(), 3, "three uploads kept");
    let n = f.sk.public().n().clone();
    let values: Vec<Vec<BigUint>> = kept.iter().map(|(_, c)| decrypted(&f.sk, c)).collect();
    let all: Vec<BigUint> = values.concat();
    // P(D > t) <= 2 exp(-2 m t^2) for m uniform values: t at a level of 1e-6.
    let bound = |m: usize| ((2.0f64 / 1e-6).ln() / (2.0 * m as f64)).sqrt();
    let d = ks_uniform(&all, &n);
    println!(
        "KS distance of {} masked values: {d:.4} (bound {:.4})",
        all.len(),
        bound(all.len())
    );
    assert!(
        d < bound(all.len()),
        "masked values are not uniform: D = {d}"
    );
    for (owner, v) in kept.iter().map(|(o, _)| o).zip(&values) {
        let rows = v.last().expect("N's plaintext");
        assert!(
            rows > &BigUint::from(f.spec.max_rows),
            "{owner}'s row count is readable"
        );
    }
    let r = correlation(&values[0], &values[1], &n);
    println!("correlation of two identical shares, masked: {r:.3}");
    assert!(
        r.abs() < 0.5,
        "identical shares give correlated values: {r}"
    );

    let owners: Vec<String> = kept.iter().map(|(o, _)| o.clone()).collect();
    let mut aggregate = vec![BigUint::default(); values[0].len()];
    for v in &values {
        for (a, x) in aggregate.iter_mut().zip(v) {
            *a = (&*a + x) % &n;
        }
    }
    let transport = f.proxy.transport("user");
    let sum = rt()
        .block_on(dpca_user::masks::fetch_mask_sum(
            &f.spec, &f.study, &owners, &transport,
        ))
        .expect("the holder sums the three")
        .expect("the study is masked");
    dpca_common::secagg::remove_mask_sum(&mut aggregate, &sum, &n).expect("fits");
    assert_eq!(
        aggregate.last(),
        Some(&BigUint::from(90u8)),
        "N of the three"
    );
    let d = ks_uniform(&aggregate, &n);
    assert!(
        d > 0.5,
        "the unmasked aggregate looks uniform too (D = {d}): no masks were seen"
    );

    let two = owners[..2].to_vec();
    let err = rt()
        .block_on(dpca_user::masks::fetch_mask_sum(
            &f.spec, &f.study, &two, &transport,
        ))
        .expect_err("a second sum, of a set less one owner");
    assert!(format!("{err:#}").contains("summed once"), "{err:#}");
}

/// Three owners invited, two needed: all three deposit their seeds with the
/// holder, the third never uploads (it drops after its seed). At the deadline
/// the proxy seals with two, the holder sums those two's masks, and the user
/// opens a release of their 60 rows that passes every plausibility check.
#[test]
fn an_owner_that_drops_after_its_seed_leaves_the_study_releasing() {
    let deadline = dpca_shell::clock::now_unix_ms().expect("clock") + 25_000;
    let f = masked_fixture_with(|s| {
        s.quorum = 3;
        s.min_owners = 2;
        s.deadline_unix_ms = deadline;
    });
    run_owner(&f, &f.url, "hospital-a", (30, 0));
    run_owner(&f, &f.url, "hospital-b", (30, 30));
    let holder = f
        .holder
        .as_ref()
        .map(|(_, url)| url.clone())
        .expect("a holder");
    let digest = dpca_shell::invitation::spec_digest(&f.spec);
    rt().block_on(async {
        let mut c = dpca_shell::client::connect(&holder, &f.proxy.transport("c"))
            .await
            .expect("connect to the holder");
        c.deposit_seed(v1::DepositSeedRequest {
            study_id: f.study.clone(),
            owner_id: "c".into(),
            contribution_id: "dropped".into(),
            spec_digest: digest,
            seed: vec![7; 32],
        })
        .await
        .expect("the seed is held");
    });
    let collected = rt().block_on(async {
        let mut user = f.client("user").await;
        let study = dpca_user::session::OpenedStudy::new(&f.study, &f.spec);
        dpca_user::session::collect(&mut user, &f.proxy.transport("user"), &f.sk, study).await
    });
    let collected = collected.expect("the two owners' release opens");
    assert_eq!(collected.n_rows, 60);
    assert_eq!(collected.owners_in.len(), 2);
}
