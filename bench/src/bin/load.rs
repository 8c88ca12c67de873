//! Load on one proxy: many owners submitting at once over loopback, each on its own
//! mutual-TLS connection with its own certificate, to the real `proxy` program with
//! its state database. One contribution of scenario 1 (optdigits, M = 64, ten rows)
//! is encrypted once and sent by every owner under its own id, so the run measures
//! the proxy (validation, aggregation, durable commits), not the owners' encryption.
//!
//! Prints, per owner count: wall time until every owner was acknowledged,
//! contributions and megabytes per second, the proxy's peak memory and CPU time,
//! refusals, and the study's state; then the proxy's peak memory at the largest
//! count over the smallest (flat memory: close to 1).

use dpca_bench::{built_programs, program, workspace_root};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Parser;
use dpca_common::data::read_csv;
use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::paillier::SecretKey;
use dpca_common::protocol::Share;
use dpca_common::study::{SpecDraft, StudyLayout, DEFAULT_FRAC_BITS};
use dpca_proto::convert::{spec_to_wire, CIPHERTEXTS_PER_CHUNK};
use dpca_proto::v1;
use dpca_shell::client::{connect, transient, with_retries, ConnectError};
use dpca_shell::tls::{write_dev_pki, Role, Transport};
use dpca_shell::usage::Usage;
use rand::rngs::OsRng;

/// How long an owner keeps coming back while the proxy asks it to.
const RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(120);

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
    /// Owner counts, one fresh proxy each.
    #[arg(long, value_delimiter = ',', default_value = "50,200")]
    owners: Vec<usize>,
    /// Paillier modulus bits.
    #[arg(long, default_value_t = 2048)]
    key_bits: u64,
}

/// One run's figures.
struct Row {
    owners: usize,
    wall: f64,
    bytes: usize,
    proxy: Usage,
    refused: usize,
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
) -> anyhow::Result<(ProxyProc, String)> {
    let mut child = ProxyProc(
        Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--state"])
            .arg(state)
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

async fn run(proxy_bin: &Path, owners: usize, bits: u64, root: &Path) -> anyhow::Result<Row> {
    let dir = tempfile::tempdir()?;
    let names: Vec<String> = (1..=owners).map(|i| format!("owner-{i:03}")).collect();
    let pki = write_dev_pki(
        &dir.path().join("pki"),
        &["127.0.0.1".to_string()],
        &["user".to_string()],
        &names,
    )?;
    let (proxy, addr) = start_proxy(proxy_bin, &pki, &dir.path().join("proxy.redb"))?;
    let url = format!("https://{addr}");
    let user = Transport::Tls(Arc::new(
        pki.files("user").context("user files")?.load(Role::User)?,
    ));

    let path = root.join("data/optdigits.csv");
    let table = read_csv(std::fs::File::open(&path)?, "optdigits.csv", Some("label"))?;
    let sk = SecretKey::generate(bits, &mut OsRng)?;
    let pk = sk.public().clone();
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let spec = SpecDraft {
        bounds: vec![(0.0, 16.0); table.features.len()],
        features: table.features.clone(),
        fixed: FixedPoint {
            frac_bits: DEFAULT_FRAC_BITS,
            row_norm_bound: 1.0,
        },
        max_rows: 1 << 16,
        privacy: PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::DpMean, 1.0, 1e-5)?,
        min_owners: owners as u32,
        quorum: owners as u32,
        deadline_unix_ms: now + 3_600_000,
        ..dpca_common::testing::test_draft(&pk, 0)
    }
    .validate()?;
    let layout = StudyLayout::new(&spec)?;
    let mut client = connect(&url, &user).await?;
    let study = client
        .open_study(v1::OpenStudyRequest {
            spec: Some(spec_to_wire(&spec)),
            noise_free_for_testing: false,
        })
        .await
        .map_err(|s| anyhow::anyhow!("open study: {}", s.message()))?
        .into_inner()
        .study_id;

    let (share, _) = Share::from_raw_rows(&table.rows[..10], &spec.bounds, &spec.fixed, None, None);
    let cts: Vec<Vec<u8>> = share
        .plaintexts(&layout, &pk)?
        .iter()
        .map(|m| Ok(pk.ciphertext_to_bytes(&pk.encrypt(m, &mut OsRng)?)))
        .collect::<anyhow::Result<_>>()?;
    let cts = Arc::new(cts);
    let bytes_each: usize = cts.iter().map(Vec::len).sum();

    // Every owner's TLS files are read before the clock starts.
    let transports = names
        .iter()
        .map(|n| {
            Ok(Transport::Tls(Arc::new(
                pki.files(n).context("owner files")?.load(Role::Owner)?,
            )))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let start = Instant::now();
    let tasks: Vec<_> = names
        .iter()
        .zip(transports)
        .map(|(name, transport)| {
            let (url, study, cts, name) =
                (url.clone(), study.clone(), Arc::clone(&cts), name.clone());
            tokio::spawn(async move {
                let chunks: Vec<v1::ContributionChunk> = cts
                    .chunks(CIPHERTEXTS_PER_CHUNK)
                    .enumerate()
                    .map(|(i, part)| {
                        let mut m = v1::ContributionChunk {
                            ciphertexts: part.to_vec(),
                            ..Default::default()
                        };
                        if i == 0 {
                            m.study_id = study.clone();
                            m.owner_id = name.clone();
                            m.contribution_id = format!("load-{name}");
                            m.total_ciphertexts = cts.len() as u32;
                            m.cap_epsilon = 1.0;
                            m.cap_delta = 1e-5;
                        }
                        m
                    })
                    .collect();
                // As an owner does: the proxy takes a few handshakes per address at
                // once and asks the rest to come back; only a refusal is final.
                let attempt = || async {
                    let mut c = connect(&url, &transport).await.map_err(Attempt::Connect)?;
                    c.contribute(tokio_stream::iter(chunks.clone()))
                        .await
                        .map(|r| r.into_inner().newly_counted)
                        .map_err(Attempt::Call)
                };
                with_retries(RETRY_FOR, Attempt::transient, attempt)
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut refused = 0;
    for t in tasks {
        match t.await? {
            Ok(true) => {}
            Ok(false) => refused += 1,
            Err(e) => {
                eprintln!("refused: {e}");
                refused += 1;
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let proxy_usage = Usage::of_pid(proxy.0.id()).context("proxy usage from /proc")?;
    let info = client
        .get_study(v1::GetStudyRequest { study_id: study })
        .await
        .map_err(|s| anyhow::anyhow!("get study: {}", s.message()))?
        .into_inner();
    drop(proxy);
    Ok(Row {
        owners,
        wall,
        bytes: bytes_each * owners,
        proxy: proxy_usage,
        refused,
        state: info.state,
        owners_in: info.owners_in,
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.owners.is_empty() {
        bail!("--owners needs at least one count");
    }
    let root = workspace_root();
    let proxy_bin = program(&built_programs(&["proxy"])?, "proxy");
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    for &owners in &args.owners {
        eprintln!("== {owners} owners at once, {} bits", args.key_bits);
        rows.push(rt.block_on(run(&proxy_bin, owners, args.key_bits, &root))?);
        // Let the sockets of the last run close before the next.
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "\n| owners at once | wall s | contributions/s | MB/s in | proxy peak MiB | proxy CPU s | refused | state | owners in |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    for r in &rows {
        println!(
            "| {} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {} | {} |",
            r.owners,
            r.wall,
            r.owners as f64 / r.wall,
            r.bytes as f64 / 1e6 / r.wall,
            mib(r.proxy.peak_rss_bytes),
            r.proxy.cpu_seconds,
            r.refused,
            r.state,
            r.owners_in
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        println!(
            "\nproxy peak memory, {} owners over {}: {:.2}",
            last.owners,
            first.owners,
            last.proxy.peak_rss_bytes as f64 / first.proxy.peak_rss_bytes.max(1) as f64
        );
    }
    let bad = rows
        .iter()
        .filter(|r| r.refused > 0 || r.owners_in as usize != r.owners)
        .count();
    if bad > 0 {
        bail!("{bad} runs had refusals or lost owners");
    }
    Ok(())
}
