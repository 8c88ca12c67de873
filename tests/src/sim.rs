//! An in-process simulation of one study, in the style of Janus's: the real proxy
//! ([`dpca_proxy::run`] on an ephemeral loopback port, mutual TLS, its redb store),
//! real owners ([`dpca_owner::run`]) and the real user session
//! ([`dpca_user::session`]), driven one [`Op`] at a time. The proxy reads a clock
//! that moves only when told and randomness replayed from a seed, so a deadline
//! passes at once and the release's noise can be recomputed. After every step the
//! proxy is checked against a [`Model`] of what it must have done:
//!
//! - the study's phase and the owners counted (each at most once, retries included)
//!   are the model's, as the proxy reports them;
//! - each owner's spent budget is the study's epsilon if it was counted, else zero;
//! - the release is served byte for byte the same across restarts;
//! - the decrypted release equals the central mechanism run on the pooled rows of
//!   the owners counted, with the secrets replayed from the proxy's seed.
//!
//! A restart drops the proxy's whole runtime between two operations (its tasks,
//! connections and open database go with it) and starts a new one on the same
//! state file: what a process restart does at a quiet moment. Kills in the middle
//! of an upload are the process-level crash test's job.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
use dpca_common::protocol::{
    central_release, open_release, Opened, ReleaseSecrets, Share, ShareNoise,
};
use dpca_common::risk::Risk;
use dpca_common::study::{SpecDraft, StudyLayout, StudySpec};
use dpca_owner::{NoiseSource, OwnerConfig, OwnerData};
use dpca_proto::v1;
use dpca_proto::v1::proxy_client::ProxyClient;
use dpca_proxy::world::{Clock, Entropy, ManualClock, SeededEntropy, SystemClock};
use dpca_proxy::ProxyConfig;
use dpca_shell::tls::{DevPki, Role, Transport};
use dpca_user::session::OpenedStudy;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use tonic::transport::Channel;

/// The seed of owner `owner`'s noise share in the simulation of `seed`.
fn owner_seed(seed: u64, owner: usize) -> [u8; 32] {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s[8..16].copy_from_slice(&(owner as u64).to_le_bytes());
    s
}

/// `acc += add`, entry by entry.
fn add_into(acc: &mut [num_bigint::BigInt], add: &[num_bigint::BigInt]) {
    assert_eq!(acc.len(), add.len(), "noise of the layout's length");
    acc.iter_mut().zip(add).for_each(|(a, b)| *a += b);
}

/// The owners of a simulated study: the first [`INVITED`] are invited, the last is not.
pub const OWNERS: [&str; 4] = ["sim-1", "sim-2", "sim-3", "sim-outsider"];

/// Owners the study invites.
pub const INVITED: usize = 3;

/// Owners that seal the study at once.
const QUORUM: u32 = 3;

/// Owners that seal it at its deadline (fewer abort it).
const MIN_OWNERS: u32 = 2;

/// The deadline, from the moment the study is opened.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Features of the simulated table.
const DIM: usize = 3;

/// The study's epsilon and delta, which each counted owner spends.
const EPSILON: f64 = 1.0;
const DELTA: f64 = 1e-6;

/// One step of a simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Owner `owner` sends its table (`variant` 0) or another one (`variant` 1):
    /// the same table again is a retry, another is a second contribution.
    Contribute {
        /// Index into [`OWNERS`].
        owner: usize,
        /// Which of the owner's two tables.
        variant: usize,
    },
    /// The clock moves forward.
    Advance {
        /// By this many seconds.
        seconds: u64,
    },
    /// The proxy stops and starts again on its state file.
    Restart,
    /// The user asks for the release and decrypts it.
    Reveal,
    /// The user fetches the release again.
    Fetch,
}

/// A study's phase as the proxy names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Taking contributions.
    Collecting,
    /// Closed to contributions, waiting for the user.
    Sealed,
    /// Noised and served.
    Released,
    /// Closed with nothing to release.
    Aborted,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Collecting => "collecting",
            Phase::Sealed => "sealed",
            Phase::Released => "released",
            Phase::Aborted => "aborted",
        }
    }
}

/// What the proxy must answer a contribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Counted,
    AlreadyCounted,
    /// Refused, for a reason whose text holds this.
    Refused(&'static str),
}

/// What the proxy must have done so far.
#[derive(Clone, Debug)]
pub struct Model {
    /// The phase the study must be in.
    pub phase: Phase,
    /// Each counted owner and the table it was counted with.
    pub counted: std::collections::BTreeMap<usize, usize>,
    /// Milliseconds since the study was opened.
    pub elapsed_ms: u64,
}

impl Model {
    fn new() -> Self {
        Self {
            phase: Phase::Collecting,
            counted: Default::default(),
            elapsed_ms: 0,
        }
    }

    fn contribute(&mut self, owner: usize, variant: usize) -> Expect {
        if owner >= INVITED {
            // Refused by the owner itself, which sees the invitation list in the
            // spec (the proxy's own refusal: `study::tests`).
            return Expect::Refused("other owners, not `sim-outsider`");
        }
        match self.counted.get(&owner) {
            Some(&v) if v == variant => return Expect::AlreadyCounted,
            Some(_) => return Expect::Refused("already contributed"),
            None => {}
        }
        match self.phase {
            Phase::Collecting => {}
            // The refusal gives the reason.
            Phase::Aborted => return Expect::Refused("deadline passed with"),
            Phase::Sealed | Phase::Released => return Expect::Refused("contributions are closed"),
        }
        self.counted.insert(owner, variant);
        if self.counted.len() >= QUORUM as usize {
            self.phase = Phase::Sealed;
        }
        Expect::Counted
    }

    fn advance(&mut self, by: Duration) {
        self.elapsed_ms += by.as_millis() as u64;
        if self.phase == Phase::Collecting && self.elapsed_ms >= DEADLINE.as_millis() as u64 {
            self.phase = if self.counted.len() >= MIN_OWNERS as usize {
                Phase::Sealed
            } else {
                Phase::Aborted
            };
        }
    }
}

/// The certificates of every simulated party, made once per test process.
fn pki() -> &'static DevPki {
    static PKI: OnceLock<(DevPki, tempfile::TempDir)> = OnceLock::new();
    let (pki, _dir) = PKI.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let pki = dpca_shell::tls::write_dev_pki(
            dir.path(),
            &strings(&["127.0.0.1"]),
            &strings(&["sim-user"]),
            &strings(&OWNERS),
        )
        .expect("development PKI");
        (pki, dir)
    });
    pki
}

/// The transport of the simulated user or owner `name`.
fn transport(name: &str, role: Role) -> Transport {
    let files = pki().files(name).expect("a simulated party's certificate");
    Transport::Tls(Arc::new(files.load(role).expect("certificate loads")))
}

/// A proxy incarnation: its own runtime, so that a restart drops every task,
/// connection and database handle it had.
struct Running {
    rt: tokio::runtime::Runtime,
    url: String,
}

/// One simulated study and everything around it.
pub struct Sim {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    seed: u64,
    entropy: Arc<SeededEntropy>,
    proxy: Option<Running>,
    rt: tokio::runtime::Runtime,
    spec: StudySpec,
    study: String,
    /// Each owner's two tables, as rows and as the files it reads.
    tables: Vec<[Vec<Vec<f64>>; 2]>,
    files: Vec<[PathBuf; 2]>,
    /// The release as fetched right after the user decrypted it, and checked.
    release: Option<Vec<v1::ResultChunk>>,
    /// The model the proxy is checked against.
    pub model: Model,
}

/// Seeds of the proxy's randomness: one per simulation in this process, so no two
/// studies share an id (the user remembers each study's decrypted count by id).
static SEEDS: AtomicU64 = AtomicU64::new(1);

impl Sim {
    /// Starts a proxy and opens a study of `centering`, with each owner's two
    /// `tables` (rows of `DIM` values in [-1, 1]).
    pub fn new(centering: Centering, tables: Vec<[Vec<Vec<f64>>; 2]>) -> Self {
        assert_eq!(tables.len(), OWNERS.len(), "one pair of tables per owner");
        let dir = tempfile::tempdir().expect("tempdir");
        let files = write_tables(&dir, &tables);
        let now = SystemClock.now_ms();
        let seed = SEEDS.fetch_add(1, Ordering::SeqCst);
        let key = dpca_common::testing::test_key();
        let spec = SpecDraft {
            privacy: PrivacyRequest::new(Mechanism::GAUSSIAN, centering, EPSILON, DELTA)
                .expect("request"),
            min_owners: MIN_OWNERS,
            quorum: QUORUM,
            deadline_unix_ms: now + DEADLINE.as_millis() as u64,
            expected_owners: OWNERS[..INVITED].iter().map(|s| s.to_string()).collect(),
            ..dpca_common::testing::test_draft(key.public(), DIM)
        }
        .validate()
        .expect("the simulated study's spec");
        let mut sim = Self {
            dir,
            clock: Arc::new(ManualClock::at(now)),
            seed,
            entropy: Arc::new(SeededEntropy::new(seed)),
            proxy: None,
            rt: runtime(),
            spec,
            study: String::new(),
            tables,
            files,
            release: None,
            model: Model::new(),
        };
        sim.start();
        let spec = sim.spec.clone();
        sim.study = sim.rt.block_on(async {
            let mut user = sim.client("sim-user", Role::User).await;
            let transport = transport("sim-user", Role::User);
            dpca_user::session::open_study(&mut user, &spec, false, &transport)
                .await
                .expect("open the study")
        });
        sim.check();
        sim
    }

    /// Applies `op` to the proxy and the model, then checks the proxy against the model.
    pub fn apply(&mut self, op: Op) {
        match op {
            Op::Contribute { owner, variant } => self.contribute(owner, variant),
            Op::Advance { seconds } => {
                let by = Duration::from_secs(seconds);
                self.clock.advance(by);
                self.model.advance(by);
            }
            Op::Restart => {
                self.stop();
                self.start();
            }
            Op::Reveal => self.reveal(),
            Op::Fetch => self.fetch(),
        }
        self.check();
    }

    fn start(&mut self) {
        let rt = runtime();
        let (listener, addr) = rt.block_on(dpca_proxy::bind("127.0.0.1:0")).expect("bind");
        let config = ProxyConfig {
            transport: Transport::Tls(Arc::new(
                pki().proxy.load(Role::Proxy).expect("proxy certificate"),
            )),
            state: Some(self.dir.path().join("proxy.redb")),
            release_journal: None,
            replace_release_journal: None,
            allow_noise_free_for_testing: false,
            test_skips_noise: false,
            max_concurrent_uploads: dpca_proxy::DEFAULT_MAX_CONCURRENT_UPLOADS,
            limits: Default::default(),
            clock: Arc::clone(&self.clock) as Arc<dyn Clock>,
            entropy: Arc::clone(&self.entropy) as Arc<dyn Entropy>,
        };
        let served = rt.spawn(dpca_proxy::run(
            config,
            listener,
            None,
            std::future::pending(),
        ));
        self.proxy = Some(Running {
            rt,
            url: format!("https://{addr}"),
        });
        // Serving starts with opening the state file: a failure shows here.
        if served.is_finished() {
            let proxy = self.proxy.take().expect("just started");
            match proxy.rt.block_on(served) {
                Ok(Err(e)) => panic!("the proxy did not start: {e:#}"),
                other => panic!("the proxy stopped at once: {other:?}"),
            }
        }
    }

    fn stop(&mut self) {
        if let Some(proxy) = self.proxy.take() {
            proxy.rt.shutdown_timeout(Duration::from_secs(10));
        }
    }

    fn url(&self) -> String {
        self.proxy.as_ref().expect("the proxy is up").url.clone()
    }

    async fn client(&self, name: &str, role: Role) -> ProxyClient<Channel> {
        dpca_shell::client::connect(&self.url(), &transport(name, role))
            .await
            .expect("connect")
    }

    fn contribute(&mut self, owner: usize, variant: usize) {
        let cfg = OwnerConfig {
            proxy: self.url(),
            transport: transport(OWNERS[owner], Role::Owner),
            study_id: self.study.clone(),
            data: OwnerData::File(self.files[owner][variant].clone()),
            owner_id: OWNERS[owner].to_string(),
            key_fingerprint: self.spec.public_key.fingerprint(),
            label: None,
            progress: false,
            retry_for: Duration::ZERO,
            budget_cap: (2.0 * EPSILON, 1e-5),
            accepted_risks: vec![Risk::MaskCentering],
            work: dpca_owner::work::WorkCap::default(),
            ledger: None,
            spec_digest: Some(dpca_shell::invitation::spec_digest(&self.spec)),
            noise_source: NoiseSource::Seeded(owner_seed(self.seed, owner)),
            mask_holder: None,
        };
        let got = self.rt.block_on(dpca_owner::run(&cfg));
        let what = format!("{} sending table {variant}", OWNERS[owner]);
        let rows = self.tables[owner][variant].len() as u64;
        match (self.model.contribute(owner, variant), got) {
            (Expect::Counted, Ok(r)) => {
                assert!(r.newly_counted, "{what}: not newly counted");
                assert_eq!(r.rows, rows, "{what}: rows reported");
            }
            (Expect::AlreadyCounted, Ok(r)) => assert!(!r.newly_counted, "{what}: counted twice"),
            (Expect::Refused(why), Err(e)) => {
                let e = format!("{e:#}");
                assert!(e.contains(why), "{what}: refused for `{e}`, not `{why}`");
                // A refusal is final: the owner did not take it for an outage to
                // wait out (the code the proxy chose tells it which).
                assert!(!e.contains("gave up after"), "{what}: retried `{e}`");
            }
            (expected, got) => panic!("{what}: expected {expected:?}, got {got:?}"),
        }
    }

    fn reveal(&mut self) {
        let (spec, study) = (self.spec.clone(), self.study.clone());
        let sk = dpca_common::testing::test_key();
        let user = transport("sim-user", Role::User);
        let outcome = self.rt.block_on(async {
            let mut c = self.client("sim-user", Role::User).await;
            if self.model.phase == Phase::Collecting {
                // The user's session would wait for the seal; the proxy must
                // refuse a release asked for before it.
                let req = v1::ReleaseRequest {
                    study_id: study.clone(),
                    count: None,
                };
                let refused = c.release(req).await.expect_err("released while collecting");
                assert_eq!(
                    refused.code(),
                    tonic::Code::FailedPrecondition,
                    "{refused:?}"
                );
                return None;
            }
            Some(
                dpca_user::session::collect(&mut c, &user, sk, OpenedStudy::new(&study, &spec))
                    .await,
            )
        });
        match (self.model.phase, outcome) {
            (Phase::Collecting, None) => {}
            (Phase::Sealed, Some(Ok(collected))) => {
                self.model.phase = Phase::Released;
                assert_eq!(collected.owners_in, self.counted_names(), "owners in");
                assert_eq!(
                    collected.owners_missing,
                    self.missing_names(),
                    "owners missing"
                );
                self.assert_central(&collected.opened);
                // What every later fetch must equal is this release, opened again.
                let served = self.rt.block_on(async {
                    let mut c = self.client("sim-user", Role::User).await;
                    fetch_raw(&mut c, &self.study).await.expect("fetch")
                });
                self.assert_central(&self.open(&served, collected.n_rows));
                self.release = Some(served);
            }
            (Phase::Released | Phase::Aborted, Some(Err(e))) => {
                let e = format!("{e:#}");
                let why = ["not possible", "aborted"];
                assert!(why.iter().any(|w| e.contains(w)), "refused for `{e}`");
            }
            (phase, got) => panic!("reveal while {phase:?}: got {got:?}"),
        }
    }

    /// A served release, decrypted and opened as the user does.
    fn open(&self, served: &[v1::ResultChunk], n_rows: u64) -> Opened {
        let pk = &self.spec.public_key;
        let bytes: Vec<Vec<u8>> = served.iter().flat_map(|c| c.ciphertexts.clone()).collect();
        let cts = pk.ciphertexts_from_bytes(&bytes, 0).expect("ciphertexts");
        let layout = StudyLayout::new(&self.spec).expect("layout");
        open_release(
            dpca_common::testing::test_key(),
            &layout,
            self.spec.privacy.centering,
            None,
            &cts,
            n_rows,
            self.spec.fixed.frac_bits,
        )
        .expect("the release opens")
    }

    /// The decrypted release is the central mechanism on the pooled rows of the
    /// owners counted, with the noise the proxy's seed gives its one release.
    fn assert_central(&self, opened: &Opened) {
        let shares: Vec<Share> = self
            .model
            .counted
            .iter()
            .map(|(&owner, &variant)| {
                let rows = &self.tables[owner][variant];
                Share::from_raw_rows(rows, &self.spec.bounds, &self.spec.fixed, None, None).0
            })
            .collect();
        let pooled = Share::sum(&shares).expect("at least one owner counted");
        let mask = self.spec.privacy.centering == Centering::Mask;
        let plan = self.spec.proxy_plan(mask.then_some(pooled.n), false);
        let layout = StudyLayout::new(&self.spec).expect("layout");
        // Draw 0 named the study; draw 1 is the release's.
        let replay = SeededEntropy::new(self.seed);
        drop(replay.rng());
        let mut secrets = ReleaseSecrets::sample(
            &layout,
            self.spec.privacy.centering,
            &plan,
            &mut replay.rng(),
        )
        .expect("secrets");
        // The owners' shares of the noise, where they add it, drawn again.
        if let Some(noise) = self.spec.owner_noise() {
            for &owner in self.model.counted.keys() {
                let mut rng = ChaCha20Rng::from_seed(owner_seed(self.seed, owner));
                let share = ShareNoise::draw(&noise, &layout, &mut rng).expect("a share");
                add_into(&mut secrets.matrix_noise, &share.matrix);
                add_into(&mut secrets.vector_noise, &share.vector);
            }
        }
        let central = central_release(
            &pooled,
            &layout.shape(),
            self.spec.privacy.centering,
            None,
            &secrets,
            self.spec.fixed.frac_bits,
        );
        assert_eq!(opened.matrix_grid, central.matrix_grid, "released matrix");
        assert_eq!(opened.scatter, central.scatter, "released scatter");
        assert_eq!(opened.mean, central.mean, "released mean");
        if !mask {
            // Under `mask` the vector holds v + b and the mask cancels only in S.
            assert_eq!(opened.vector_grid, central.vector_grid, "released vector");
        }
    }

    fn fetch(&mut self) {
        let got = self.rt.block_on(async {
            let mut c = self.client("sim-user", Role::User).await;
            fetch_raw(&mut c, &self.study).await
        });
        match (self.model.phase, got) {
            (Phase::Released, Ok(served)) => {
                let first = self.release.as_ref().expect("kept at the reveal");
                assert!(&served == first, "the release changed");
            }
            (Phase::Released, Err(e)) => panic!("fetch of a released study refused: {e:?}"),
            (_, Ok(_)) => panic!("a release was served while {:?}", self.model.phase),
            (_, Err(e)) => assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}"),
        }
    }

    /// The proxy's view (study phase, owners counted, budgets spent), as its
    /// operator reads it, against the model's.
    fn check(&mut self) {
        let status = self.rt.block_on(async {
            // The proxy's operator: a `dpca-proxy` client certificate.
            let operator = pki()
                .operator
                .load(Role::Proxy)
                .expect("operator certificate");
            let mut op =
                dpca_shell::client::connect(&self.url(), &Transport::Tls(Arc::new(operator)))
                    .await
                    .expect("connect");
            op.status(v1::StatusRequest {})
                .await
                .expect("status")
                .into_inner()
        });
        let [study] = status.studies.as_slice() else {
            panic!("one study expected: {:?}", status.studies);
        };
        assert_eq!(study.state, self.model.phase.name(), "phase");
        assert_eq!(study.owners_in, self.counted_names(), "owners counted");
        assert_eq!(study.owners_missing, self.missing_names(), "owners missing");
        for (i, owner) in OWNERS.iter().enumerate() {
            let spent = status
                .budgets
                .iter()
                .find(|b| b.owner_id == *owner)
                .map_or((0.0, 0.0, 0), |b| {
                    (b.spent_epsilon, b.spent_delta, b.studies)
                });
            let expected = if self.model.counted.contains_key(&i) {
                (EPSILON, DELTA, 1)
            } else {
                (0.0, 0.0, 0)
            };
            assert_eq!(spent, expected, "budget spent by {owner}, and its studies");
        }
        if self.model.phase == Phase::Released {
            self.fetch();
        }
    }

    fn missing_names(&self) -> Vec<String> {
        (0..INVITED)
            .filter(|i| !self.model.counted.contains_key(i))
            .map(|i| OWNERS[i].to_string())
            .collect()
    }

    fn counted_names(&self) -> Vec<String> {
        self.model
            .counted
            .keys()
            .map(|&i| OWNERS[i].to_string())
            .collect()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.stop();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn write_tables(dir: &tempfile::TempDir, tables: &[[Vec<Vec<f64>>; 2]]) -> Vec<[PathBuf; 2]> {
    let header: Vec<String> = (0..DIM).map(|i| format!("f{i}")).collect();
    let write = |name: String, rows: &[Vec<f64>]| {
        let path = dir.path().join(name);
        let mut text = header.join(",") + "\n";
        for row in rows {
            let cells: Vec<String> = row.iter().map(f64::to_string).collect();
            text += &(cells.join(",") + "\n");
        }
        std::fs::write(&path, text).expect("write a table");
        path
    };
    tables
        .iter()
        .enumerate()
        .map(|(i, [a, b])| {
            [
                write(format!("{i}-0.csv"), a),
                write(format!("{i}-1.csv"), b),
            ]
        })
        .collect()
}

/// The release as served: every chunk, its header included.
pub async fn fetch_raw(
    client: &mut ProxyClient<Channel>,
    study: &str,
) -> Result<Vec<v1::ResultChunk>, tonic::Status> {
    let mut stream = client
        .fetch_result(v1::FetchResultRequest {
            study_id: study.to_string(),
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.push(chunk);
    }
    Ok(out)
}
