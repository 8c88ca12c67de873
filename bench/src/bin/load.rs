//! Load on one proxy: many owners submitting at once over loopback, each on its own
//! mutual-TLS connection with its own certificate and its own source address (as
//! real owners have), to the real `proxy` program with its state database. One
//! contribution of M random features is encrypted once and sent by every owner
//! under its own id, so the run measures the proxy (validation, aggregation,
//! durable commits), not the owners' encryption. Meanwhile the user polls the
//! proxy's status, as an operator watching the study would: on fresh connections
//! to the main listener (asking for its status lane, as `proxy status` does) and
//! to the operator listener (`--operator-listen`), and on one connection kept
//! open.
//!
//! Prints, per run (M features x owners): wall time until every owner was
//! acknowledged, contributions per second (and the rate the proxy's own CPU time
//! allows on every core: here the owners' side runs on the same cores), ciphertexts
//! folded per second per core
//! and that rate's distance from the floor (cores over GMP's multiplication mod
//! n^2, measured in this run), and the least distance these cores allow (the
//! arithmetic no proxy may skip and the owners' side's CPU, measured in this
//! run, shared out on every core); the same distance for the fold alone, in memory
//! with nothing else running (what these cores give a fold before any network,
//! validation or storage), and the CPU the owners' side took of the same cores;
//! bytes the proxy wrote to its disk per contribution
//! over the contribution's size, the writes each commit held, its peak memory,
//! the status call's latency, and the upload slots the owners reserved.

use dpca_bench::{built_programs, program, raw_gmp_mulmod, time};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::paillier::{PublicKey, SecretKey};
use dpca_common::protocol::Share;
use dpca_common::randomizer::Randomizer;
use dpca_common::study::{SpecDraft, StudyLayout, StudySpec, DEFAULT_FRAC_BITS};
use dpca_proto::convert::{spec_to_wire, CIPHERTEXTS_PER_CHUNK};
use dpca_proto::v1;
use dpca_shell::client::{
    connect, connect_for_status, connect_from, transient, with_retries, ConnectError,
};
use dpca_shell::tls::{write_dev_pki, DevPki, Role, Transport};
use dpca_shell::upload::contribute_in_turn;
use dpca_shell::usage::Usage;
use rand::rngs::OsRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// How long an owner keeps coming back while the proxy asks it to.
const RETRY_FOR: Duration = Duration::from_secs(600);

/// How often the user asks for the proxy's status during a run.
const STATUS_EVERY: Duration = Duration::from_millis(50);
/// Why one attempt of an owner failed.
#[derive(Debug)]
enum Attempt {
    Connect(ConnectError),
    Call(tonic::Status),
}

impl Attempt {
    fn transient(&self) -> bool {
        match self {
            Attempt::Connect(e) => e.transient(),
            Attempt::Call(s) => transient(s),
        }
    }
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attempt::Connect(e) => write!(f, "{e}"),
            Attempt::Call(s) => write!(f, "{}", s.message()),
        }
    }
}

/// Many owners at once against one proxy.
#[derive(Parser, Debug)]
#[command(name = "load", about)]
struct Args {
    /// Runs, each `MxOWNERS` (features x owners at once), one fresh proxy each.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64x20,64x100,64x400,256x20,256x100,1000x20"
    )]
    runs: Vec<String>,
    /// Paillier modulus bits.
    #[arg(long, default_value_t = 2048)]
    key_bits: u64,
    /// The proxy program to load, instead of the workspace's (built first): to
    /// compare two builds of it in turn on the same machine.
    #[arg(long)]
    proxy_program: Option<std::path::PathBuf>,
}

/// One run's plan.
#[derive(Clone, Copy, Debug)]
struct Plan {
    features: usize,
    owners: usize,
}

fn parse_plan(text: &str) -> anyhow::Result<Plan> {
    let (m, o) = text
        .split_once('x')
        .with_context(|| format!("run `{text}`: expected FEATURESxOWNERS, as 64x20"))?;
    let plan = Plan {
        features: m
            .parse()
            .with_context(|| format!("run `{text}`: features"))?,
        owners: o.parse().with_context(|| format!("run `{text}`: owners"))?,
    };
    if plan.features < 2 || plan.owners == 0 || plan.owners > 60_000 {
        bail!("run `{text}`: at least 2 features and 1 to 60000 owners");
    }
    Ok(plan)
}

/// One run's figures.
struct Row {
    plan: Plan,
    ciphertexts: usize,
    contribution_bytes: usize,
    wall: f64,
    written: u64,
    /// The proxy's CPU seconds during the load.
    cpu: f64,
    /// Seconds the proxy spent folding and committing the state file.
    fold: f64,
    /// The fold alone, in memory, on every core: seconds per ciphertext per core
    /// over GMP's multiplication measured beside it.
    bare_fold: f64,
    /// The same for the check of every ciphertext as the proxy reads it
    /// (`PublicKey::elems_from_bytes`), on every core.
    bare_check: f64,
    /// GMP's multiplication as measured beside the bare fold and check, seconds.
    bare_mul: f64,
    /// This program's CPU seconds during the load: the owners' TLS and framing,
    /// and the status polls, on the cores the proxy runs on.
    owners_cpu: f64,
    store: f64,
    /// Writes per commit of the state file (queued writes share a commit).
    writes_per_commit: f64,
    proxy: Usage,
    /// `proxy status` latencies: fresh connections, and one kept open.
    status_ms: Polls,
    /// On fresh connections to the operator listener.
    operator_ms: Polls,
    kept_ms: Polls,
    refused: usize,
    /// Connections the owners made in all (one each, when none was turned away).
    attempts: usize,
    /// Upload slots the owners reserved (the proxy's metrics): one for each
    /// upload that found every slot taken for `upload_slots::PATIENCE`.
    reservations: f64,
    /// Connections the proxy's main listener let go before serving them (its
    /// metrics: the owners', the status polls' and any other).
    let_go: f64,
    state: String,
    owners_in: u32,
}

/// Kills the proxy when the run ends, whatever happened.
struct ProxyProc(Child);

impl Drop for ProxyProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_proxy(
    bin: &Path,
    pki: &dpca_shell::tls::DevPki,
    state: &Path,
    metrics: SocketAddr,
    operator: SocketAddr,
) -> anyhow::Result<(ProxyProc, String)> {
    let mut child = ProxyProc(
        Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--state"])
            .arg(state)
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .arg("--operator-listen")
            .arg(operator.to_string())
            .args(pki.proxy.args())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?,
    );
    let stdout = child.0.stdout.take().context("proxy stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected proxy output `{line}`"))?
        .to_string();
    Ok((child, addr))
}

/// The study of a run: M features in [0, 1], every owner needed.
fn load_spec(pk: &PublicKey, plan: Plan) -> anyhow::Result<StudySpec> {
    let now = dpca_shell::clock::now_unix_ms()?;
    Ok(SpecDraft {
        features: (0..plan.features).map(|j| format!("x{j}")).collect(),
        bounds: vec![(0.0, 1.0); plan.features],
        fixed: FixedPoint {
            frac_bits: DEFAULT_FRAC_BITS,
            row_norm_bound: 1.0,
        },
        max_rows: 1 << 16,
        privacy: PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::DpMean, 1.0, 1e-5)?,
        min_owners: plan.owners as u32,
        quorum: plan.owners as u32,
        deadline_unix_ms: now + 3_600_000,
        ..dpca_common::testing::test_draft(pk, 0)
    }
    .validate()?)
}

/// One owner's contribution (ten random rows), encrypted once on every core.
fn encrypted_contribution(spec: &StudySpec) -> anyhow::Result<Vec<Vec<u8>>> {
    let layout = StudyLayout::new(spec)?;
    let pk = &spec.public_key;
    let mut rng = rand_chacha::ChaCha20Rng::from_entropy();
    let rows: Vec<Vec<f64>> = (0..10)
        .map(|_| (0..spec.dim()).map(|_| rng.gen::<f64>()).collect())
        .collect();
    let (share, _) = Share::from_raw_rows(&rows, &spec.bounds, &spec.fixed, None, None);
    let plaintexts = share.plaintexts(&layout, pk)?;
    // Short-exponent masks from a fixed base, as owners encrypt.
    let masks = Randomizer::new(pk, Randomizer::window_for(plaintexts.len()), &mut OsRng);
    plaintexts
        .par_iter()
        .map(|m| Ok(pk.ciphertext_to_bytes(&masks.encrypt(m, &mut OsRng)?)))
        .collect()
}

/// The stream an owner sends: the header in the first chunk.
fn owner_chunks(study: &str, owner: &str, cts: &[Vec<u8>]) -> Vec<v1::ContributionChunk> {
    cts.chunks(CIPHERTEXTS_PER_CHUNK)
        .enumerate()
        .map(|(i, part)| {
            let mut m = v1::ContributionChunk {
                ciphertexts: part.to_vec(),
                ..Default::default()
            };
            if i == 0 {
                m.study_id = study.to_string();
                m.owner_id = owner.to_string();
                m.contribution_id = format!("load-{owner}");
                m.total_ciphertexts = cts.len() as u32;
                m.layout = dpca_common::study::LAYOUT_VERSION;
                m.cap_epsilon = 1.0;
                m.cap_delta = 1e-5;
            }
            m
        })
        .collect()
}

/// Owner `i`'s own loopback address (127.0.1.1, 127.0.1.2, ...): the proxy takes
/// a few handshakes per address at once, as it should from one real party.
fn owner_address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        127,
        0,
        1 + (i / 250) as u8,
        (i % 250) as u8 + 1,
    ))
}

/// Sends one owner's contribution as an owner does, in its turn for an upload
/// slot and coming back while the proxy asks it to: whether it was counted now,
/// or why it failed.
async fn send(
    url: String,
    transport: Transport,
    local: IpAddr,
    chunks: Vec<v1::ContributionChunk>,
    attempts: Arc<std::sync::atomic::AtomicUsize>,
) -> Result<bool, String> {
    let chunks = Arc::new(chunks);
    let attempt = || async {
        attempts.fetch_add(1, Ordering::Relaxed);
        let mut c = connect_from(&url, &transport, Some(local))
            .await
            .map_err(Attempt::Connect)?;
        contribute_in_turn(&mut c, Arc::clone(&chunks))
            .await
            .map(|r| r.newly_counted)
            .map_err(|refused| Attempt::Call(refused.status().clone()))
    };
    with_retries(RETRY_FOR, Attempt::transient, attempt)
        .await
        .map_err(|e| e.to_string())
}

/// `proxy status` over and over until `done`, on a fresh connection each time as
/// the `proxy status` command makes one (`fresh`), or on one kept open (the
/// service's own answer, without the handshake): the milliseconds of each call
/// answered, and the number of calls refused (a fresh connection the proxy's
/// handshake caps turned away).
async fn poll_status(
    url: String,
    user: Transport,
    fresh: bool,
    done: Arc<AtomicBool>,
) -> anyhow::Result<Polls> {
    let mut polls = Polls::default();
    let mut kept = connect(&url, &user).await?;
    while !done.load(Ordering::Relaxed) {
        let t = Instant::now();
        let client = if fresh {
            // As `proxy status` connects: asking for the status lane.
            connect_for_status(&url, &user).await.ok()
        } else {
            Some(kept.clone())
        };
        let answered = match client {
            Some(mut c) => c.status(v1::StatusRequest::default()).await.is_ok(),
            None => false,
        };
        if answered {
            polls.ms.push(t.elapsed().as_secs_f64() * 1e3);
        } else {
            polls.refused += 1;
        }
        tokio::time::sleep(STATUS_EVERY).await;
    }
    kept.status(v1::StatusRequest::default()).await.ok();
    Ok(polls)
}

/// `proxy status` calls during one run.
#[derive(Default)]
struct Polls {
    /// Milliseconds of each call answered.
    ms: Vec<f64>,
    /// Calls not answered.
    refused: usize,
}

impl Polls {
    /// The table's cell: median / max ms (calls answered, refused).
    fn cell(&self) -> String {
        let (median, max) = median_max(&self.ms);
        format!(
            "{median:.1} / {max:.1} ({}, {})",
            self.ms.len(),
            self.refused
        )
    }
}

/// A free loopback port for the proxy's metrics (taken and let go: the proxy
/// binds it a moment later).
fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The proxy's `/metrics` page, read once per run.
fn metrics_page(metrics: SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(metrics)?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut page = String::new();
    conn.read_to_string(&mut page)?;
    Ok(page)
}

/// The counter `name` on the metrics `page`.
fn scrape(page: &str, name: &str) -> anyhow::Result<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("{name} on the metrics page"))
}

/// The sum of every series on the metrics `page` whose line starts with `prefix`
/// (a name and the start of its labels).
fn scrape_sum(page: &str, prefix: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, v| sum + v)
}

/// Bytes a process has caused to be written to storage (`/proc/PID/io`).
fn written_bytes(pid: u32) -> anyhow::Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).context("/proc/PID/io")?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .context("write_bytes in /proc/PID/io")
}

/// The proxy, its PKI and the study of one run, ready for the owners.
struct Setup {
    _dir: tempfile::TempDir,
    pki: DevPki,
    names: Vec<String>,
    proxy: ProxyProc,
    metrics: SocketAddr,
    url: String,
    /// The operator listener's URL (`status` only).
    operator_url: String,
    user: Transport,
    study: String,
    cts: Arc<Vec<Vec<u8>>>,
    pk: PublicKey,
}

/// What one owner sends, and its TLS files read: made before a run's clock
/// starts, as the contribution is encrypted before it, so that the run measures
/// the proxy, not the owners' preparation on the same cores.
struct OwnerLoad {
    transport: Transport,
    chunks: Vec<v1::ContributionChunk>,
}

/// Every owner's load for the run `s`.
fn owner_loads(s: &Setup) -> anyhow::Result<Vec<OwnerLoad>> {
    s.names
        .iter()
        .map(|n| {
            Ok(OwnerLoad {
                transport: Transport::Tls(Arc::new(
                    s.pki.files(n).context("owner files")?.load(Role::Owner)?,
                )),
                chunks: owner_chunks(&s.study, n, &s.cts),
            })
        })
        .collect()
}

async fn set_up(proxy_bin: &Path, plan: Plan, bits: u64) -> anyhow::Result<Setup> {
    let dir = tempfile::tempdir()?;
    let names: Vec<String> = (1..=plan.owners).map(|i| format!("owner-{i:05}")).collect();
    let pki = write_dev_pki(
        &dir.path().join("pki"),
        &["127.0.0.1".to_string()],
        &["user".to_string()],
        &names,
    )?;
    let (metrics, operator) = (free_port()?, free_port()?);
    let state = dir.path().join("proxy.redb");
    let (proxy, addr) = start_proxy(proxy_bin, &pki, &state, metrics, operator)?;
    let url = format!("https://{addr}");
    let operator_url = format!("https://{operator}");
    let user = Transport::Tls(Arc::new(
        pki.files("user").context("user files")?.load(Role::User)?,
    ));
    let sk = SecretKey::generate(bits, &mut OsRng)?;
    let spec = load_spec(sk.public(), plan)?;
    let study = connect(&url, &user)
        .await?
        .open_study(v1::OpenStudyRequest {
            spec: Some(spec_to_wire(&spec)),
            noise_free_for_testing: false,
        })
        .await
        .map_err(|s| anyhow::anyhow!("open study: {}", s.message()))?
        .into_inner()
        .study_id;
    let cts = Arc::new(encrypted_contribution(&spec)?);
    Ok(Setup {
        _dir: dir,
        pki,
        names,
        proxy,
        metrics,
        url,
        operator_url,
        user,
        study,
        cts,
        pk: sk.public().clone(),
    })
}

/// Every owner at once, each from its own address; the refusals, counted.
async fn send_all(s: &Setup, owners: Vec<OwnerLoad>) -> anyhow::Result<(usize, usize)> {
    let attempts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = owners
        .into_iter()
        .enumerate()
        .map(|(i, owner)| {
            let attempts = Arc::clone(&attempts);
            tokio::spawn(send(
                s.url.clone(),
                owner.transport,
                owner_address(i),
                owner.chunks,
                attempts,
            ))
        })
        .collect();
    let mut refused = 0;
    for t in tasks {
        match t.await? {
            Ok(true) => {}
            Ok(false) => {
                eprintln!("refused: counted before");
                refused += 1;
            }
            Err(e) => {
                eprintln!("refused: {e}");
                refused += 1;
            }
        }
    }
    Ok((refused, attempts.load(Ordering::Relaxed)))
}

async fn run(proxy_bin: &Path, plan: Plan, bits: u64) -> anyhow::Result<Row> {
    let s = set_up(proxy_bin, plan, bits).await?;
    let pid = s.proxy.0.id();
    let written_before = written_bytes(pid)?;
    let cpu_before = Usage::of_pid(pid)
        .context("proxy usage from /proc")?
        .cpu_seconds;
    let owners = owner_loads(&s)?;
    let pollers = Pollers::start(&s);
    let own_cpu = || Usage::of_self().map_or(f64::NAN, |u| u.cpu_seconds);
    let owners_before = own_cpu();
    let start = Instant::now();
    let (refused, attempts) = send_all(&s, owners).await?;
    let wall = start.elapsed().as_secs_f64();
    let owners_cpu = own_cpu() - owners_before;
    let [status_ms, operator_ms, kept_ms] = pollers.finish()?;
    let written = written_bytes(pid)? - written_before;
    let proxy = Usage::of_pid(pid).context("proxy usage from /proc")?;
    let cpu = proxy.cpu_seconds - cpu_before;
    let page = metrics_page(s.metrics)?;
    let (bare_fold, bare_check, bare_mul) = bare_fold_and_check(&s.pk, &s.cts)?;
    let info = connect(&s.url, &s.user)
        .await?
        .get_study(v1::GetStudyRequest {
            study_id: s.study.clone(),
        })
        .await
        .map_err(|e| anyhow::anyhow!("get study: {}", e.message()))?
        .into_inner();
    Ok(Row {
        plan,
        ciphertexts: s.cts.len(),
        contribution_bytes: s.cts.iter().map(Vec::len).sum(),
        wall,
        written,
        cpu,
        fold: scrape(&page, "dpca_fold_microseconds_total")? / 1e6,
        bare_fold,
        bare_check,
        bare_mul,
        owners_cpu,
        store: scrape(&page, "dpca_store_microseconds_total")? / 1e6,
        writes_per_commit: scrape(&page, "dpca_store_writes_total")?
            / scrape(&page, "dpca_store_commits_total")?,
        proxy,
        status_ms,
        operator_ms,
        kept_ms,
        refused,
        attempts,
        reservations: scrape_sum(&page, r#"dpca_rpc_total{rpc="ReserveUpload""#),
        let_go: scrape_sum(&page, r#"dpca_connections_refused_total{listener="main""#),
        state: info.state,
        owners_in: info.owners_in,
    })
}

/// The `status` pollers of a run: on fresh connections to the main port and to
/// the operator listener, and on one connection kept open to the main port.
struct Pollers {
    done: Arc<AtomicBool>,
    threads: [std::thread::JoinHandle<anyhow::Result<Polls>>; 3],
}

impl Pollers {
    fn start(s: &Setup) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        // Each poller on a thread and runtime of its own, as the `proxy status`
        // command is a process of its own: its latency is the proxy's, not the wait
        // behind this program's owners for its runtime.
        let poll = |url: &str, fresh| {
            let (url, user, done) = (url.to_string(), s.user.clone(), Arc::clone(&done));
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(poll_status(url, user, fresh, done))
            })
        };
        let threads = [
            poll(&s.url, true),
            poll(&s.operator_url, true),
            poll(&s.url, false),
        ];
        Self { done, threads }
    }

    /// Stops the pollers: their latencies, in the order they were started.
    fn finish(self) -> anyhow::Result<[Polls; 3]> {
        self.done.store(true, Ordering::Relaxed);
        let [fresh, operator, kept] = self.threads.map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("status poller panicked"))?
        });
        Ok([fresh?, operator?, kept?])
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let plans = args
        .runs
        .iter()
        .map(|r| parse_plan(r))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if plans.is_empty() {
        bail!("--runs needs at least one run");
    }
    let proxy_bin = match &args.proxy_program {
        Some(path) => path.clone(),
        None => program(&built_programs(&["proxy"])?, "proxy"),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pk = SecretKey::generate(args.key_bits, &mut OsRng)?
        .public()
        .clone();
    let mul = raw_gmp_mulmod(&pk, &mut OsRng);
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    for plan in plans {
        eprintln!(
            "== M = {}, {} owners at once, {} bits",
            plan.features, plan.owners, args.key_bits
        );
        rows.push(rt.block_on(run(&proxy_bin, plan, args.key_bits))?);
        // Let the sockets of the last run close before the next.
        std::thread::sleep(Duration::from_millis(200));
    }
    print_table(&rows, cores, mul, args.key_bits);
    let bad = rows
        .iter()
        .filter(|r| r.refused > 0 || r.owners_in as usize != r.plan.owners)
        .count();
    if bad > 0 {
        bail!("{bad} runs had refusals or lost owners");
    }
    Ok(())
}

/// Seconds per ciphertext per core of folding one contribution of `cts` into an
/// aggregate as `Study::contribute` does (positions in parallel on every core), in
/// memory with nothing else running: what this machine's cores give the fold
/// before any network, validation or storage (the fastest of five), over GMP's
/// multiplication measured in turn with it (this machine's speed drifts between
/// a run's start and its end). Then the same for reading and checking the
/// ciphertexts as the proxy does before it folds them (on every core, one batch
/// of a chunk's size per task): the part of a contribution's arithmetic that is
/// not the fold's. Last, the multiplication's time, seconds.
fn bare_fold_and_check(pk: &PublicKey, cts: &[Vec<u8>]) -> anyhow::Result<(f64, f64, f64)> {
    let ring = pk.ring();
    let elems = pk.elems_from_bytes(cts, 0)?;
    let aggregate = elems.clone();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fold = || -> Vec<_> {
        aggregate
            .par_iter()
            .zip(elems.par_iter())
            .map(|(a, c)| ring.mul_elem(a, c))
            .collect()
    };
    let check = || -> usize {
        cts.par_chunks(CIPHERTEXTS_PER_CHUNK)
            .map(|chunk| pk.elems_from_bytes(chunk, 0).map_or(0, |e| e.len()))
            .sum()
    };
    if check() != cts.len() {
        bail!("a ciphertext of the load failed the proxy's check");
    }
    let (mut folded, mut checked, mut mul) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        folded = folded.min(time(1, fold));
        checked = checked.min(time(1, check));
        mul = mul.min(raw_gmp_mulmod(pk, &mut OsRng));
    }
    let per = |seconds: f64| seconds * cores as f64 / cts.len() as f64 / mul;
    Ok((per(folded), per(checked), mul))
}

/// The least `floor / folded` a run could show on these cores: the cores' time
/// per ciphertext (over the multiplication `mul`) can be no less than the
/// arithmetic no proxy may skip (the bare fold and the check, each on every
/// core) and this program's own CPU (the owners' TLS and framing, the status
/// polls) on the same cores. Above 1.5, the target is out of reach of any proxy
/// here, however little TLS, HTTP/2 and the state file cost it.
fn least_floor_ratio(r: &Row, total: f64, mul: f64) -> f64 {
    (r.bare_fold + r.bare_check) * r.bare_mul / mul + r.owners_cpu / (total * mul)
}

/// Median and largest of `ms`.
fn median_max(ms: &[f64]) -> (f64, f64) {
    let mut ms = ms.to_vec();
    ms.sort_by(f64::total_cmp);
    let median = ms.get(ms.len() / 2).copied().unwrap_or(f64::NAN);
    (median, ms.last().copied().unwrap_or(f64::NAN))
}

fn print_table(rows: &[Row], cores: usize, mul: f64, bits: u64) {
    println!(
        "\n{cores} cores; GMP multiplication mod n^2 at {bits} bits: {:.2} us, so the \
         fold's floor is {:.0} ciphertexts/s per core",
        mul * 1e6,
        1.0 / mul
    );
    println!(
        "\n| M | owners | ciphertexts each | wall s | contributions/s | contributions/s the proxy's CPU allows | folded/s per core | \
         floor / folded | least floor / folded these cores allow | fold s | floor / fold | floor / bare fold | bare check / mul | store s | writes per commit | proxy CPU s | \
         proxy CPU per ciphertext / mul | owners' CPU s | written / contributed | proxy peak MiB | \
         status ms, fresh connection (status lane): median / max (calls answered, refused) | status ms, \
         fresh connection to the operator listener: median / max (answered, refused) | \
         status ms, open connection: median / max (answered, refused) | refused | connections per owner | \
         reservations per owner | connections the proxy let go | state (owners in) |"
    );
    println!("|{}", "---|".repeat(28));
    for r in rows {
        let owners = r.plan.owners as f64;
        let total = owners * r.ciphertexts as f64;
        let per_core = |seconds: f64| total / seconds / cores as f64;
        println!(
            "| {} | {} | {} | {:.2} | {:.1} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {} | {} | {} | {} | {:.2} | {:.2} | {:.0} | {} ({}) |",
            r.plan.features,
            r.plan.owners,
            r.ciphertexts,
            r.wall,
            owners / r.wall,
            // The owners share the cores with the proxy here; elsewhere they would not.
            cores as f64 * owners / r.cpu,
            per_core(r.wall),
            (1.0 / mul) / per_core(r.wall),
            least_floor_ratio(r, total, mul),
            r.fold,
            (1.0 / mul) / per_core(r.fold),
            r.bare_fold,
            r.bare_check,
            r.store,
            r.writes_per_commit,
            r.cpu,
            r.cpu / (mul * total),
            r.owners_cpu,
            r.written as f64 / (owners * r.contribution_bytes as f64),
            r.proxy.peak_rss_bytes as f64 / (1024.0 * 1024.0),
            r.status_ms.cell(),
            r.operator_ms.cell(),
            r.kept_ms.cell(),
            r.refused,
            r.attempts as f64 / owners,
            r.reservations / owners,
            r.let_go,
            r.state,
            r.owners_in
        );
    }
}
