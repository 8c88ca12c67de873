//! The `proxy` program's command line: its flags, and `main`, which the `proxy`
//! binary and the Python package's role runner both call.

use crate::limits;
use anyhow::Context;
use clap::Parser;
use dpca_shell::tls::{Role, TlsError, TransportArgs};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Aggregates encrypted scatter shares, masks and noises them for the data user.
#[derive(Parser, Debug)]
#[command(name = "proxy", version, about, args_conflicts_with_subcommands = true)]
struct Args {
    /// TOML file of settings: flag names as keys, a table per subcommand;
    /// environment variables and flags override it.
    #[arg(long, global = true, env = "DPCA_CONFIG", value_name = "TOML")]
    config: Option<PathBuf>,
    #[command(flatten)]
    log: dpca_shell::logging::LogArgs,
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:50051", env = "DPCA_PROXY_LISTEN")]
    listen: String,
    /// TEST ONLY: honor requests for a noise-free release (exact scatter to the user).
    /// Never enable in a deployment.
    #[arg(long, hide = true)]
    allow_noise_free_for_testing: bool,
    /// TEST ONLY: draw none of the proxy's own noise (a deviating proxy), to show
    /// that the owners' noise alone stays in the release. Never enable in a
    /// deployment.
    #[arg(long, hide = true)]
    test_skips_noise: bool,
    /// Contributions read at the same time; more owners wait their turn (for a
    /// slot reserved for them, not with their upload open past 250 ms), so memory
    /// does not grow with the number of owners.
    #[arg(long, default_value_t = crate::DEFAULT_MAX_CONCURRENT_UPLOADS as u16,
          value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_uploads: u16,
    #[command(flatten)]
    limits: LimitArgs,
    /// State database (created if missing): studies, the owners counted and the
    /// running aggregates survive a restart. One proxy per file.
    #[arg(long, default_value = "dpca-proxy.redb", env = "DPCA_PROXY_STATE")]
    state: PathBuf,
    /// The release journal: every study released, so that none is released again
    /// from a state file put back from an older copy. Keep it apart from the
    /// state file's backups and never put it back (default: the state file's
    /// path with `.released` added).
    #[arg(long, env = "DPCA_PROXY_RELEASE_JOURNAL", value_name = "FILE")]
    release_journal: Option<PathBuf>,
    /// Replace the release journal the state file was served with, named here
    /// as the refusal names it, by the journal found, or a new one if there is
    /// none. Only if no study released since the state file's copy was taken can
    /// be in it: a journal that forgets a release lets it be released twice.
    /// Naming the journal makes it act once: the file then records another.
    #[arg(long, env = "DPCA_PROXY_NEW_RELEASE_JOURNAL", value_name = "NAME")]
    new_release_journal: Option<String>,
    /// Serve metrics in Prometheus text format at http://ADDR/metrics (off by
    /// default; counts and timings only, no study content). A bare PORT binds
    /// 127.0.0.1: the page times each release, which is for operators only.
    #[arg(long, env = "DPCA_METRICS_LISTEN", value_name = "ADDR",
          value_parser = crate::metrics_page::parse_listen)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Also answer `proxy status` (and nothing else) on ADDR, from a thread of its
    /// own, so it answers promptly while hundreds of owners connect at once. Bind
    /// it where only operators reach (off by default).
    #[arg(long, env = "DPCA_OPERATOR_LISTEN", value_name = "ADDR")]
    operator_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    transport: TransportArgs,
}

/// What one study may ask of the proxy, and how long a connection may wait.
#[derive(clap::Args, Debug)]
struct LimitArgs {
    /// Largest study spec accepted (bytes, as encoded).
    #[arg(long, default_value_t = limits::DEFAULT_MAX_SPEC_BYTES)]
    max_spec_bytes: usize,
    /// Most features (M) of a study.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_FEATURES)]
    max_features: usize,
    /// Largest Paillier modulus of a study (bits).
    #[arg(long, default_value_t = limits::DEFAULT_MAX_KEY_BITS)]
    max_key_bits: u64,
    /// Most ciphertexts of one contribution, and of one release.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_CIPHERTEXTS)]
    max_ciphertexts: usize,
    /// Seconds a connection may take to finish its TLS handshake.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    handshake_timeout: u64,
    /// Seconds an upload may send nothing before it is dropped (nothing counted).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    upload_idle_timeout: u64,
    /// Slowest upload accepted (KiB/s): a contribution must arrive within the idle
    /// timeout plus its size over this rate, or it is dropped (nothing counted).
    #[arg(long, default_value_t = limits::DEFAULT_MIN_UPLOAD_RATE / 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    min_upload_rate: u64,
    /// Studies open (collecting or sealed) at once, over all users.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_OPEN_STUDIES)]
    max_open_studies: usize,
    /// Studies open at once by one user.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_OPEN_STUDIES_PER_USER)]
    max_open_studies_per_user: usize,
    /// Ended studies (released or aborted) kept per user: when a user opens a
    /// study, its older ended ones are dropped, with their results.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_ENDED_STUDIES_PER_USER as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_ended_studies_per_user: u64,
}

impl LimitArgs {
    fn limits(&self) -> limits::Limits {
        limits::Limits {
            max_spec_bytes: self.max_spec_bytes,
            max_features: self.max_features,
            max_key_bits: self.max_key_bits,
            max_ciphertexts: self.max_ciphertexts,
            handshake_timeout: Duration::from_secs(self.handshake_timeout),
            upload_idle_timeout: Duration::from_secs(self.upload_idle_timeout),
            min_upload_rate: self.min_upload_rate.saturating_mul(1024),
            max_open_studies: self.max_open_studies,
            max_open_studies_per_user: self.max_open_studies_per_user,
            max_ended_studies_per_user: usize::try_from(self.max_ended_studies_per_user)
                .unwrap_or(usize::MAX),
        }
    }
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Show a running proxy's studies (state, owners in and missing, deadline,
    /// budget) and, for the operator, each owner's spent budget. Use the
    /// operator's certificate (`operator.pem` of `user dev-certs`) to see
    /// everything, a user's to see its own studies.
    Status {
        /// The proxy's URL.
        #[arg(
            long,
            default_value = "https://localhost:50051",
            env = "DPCA_PROXY_URL"
        )]
        proxy: String,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        transport: TransportArgs,
    },
    /// Print a running proxy's metrics page (what `--metrics-listen` serves),
    /// for hosts with no HTTP client, such as the proxy's own container.
    Metrics {
        /// The page's address: ADDR:PORT, or a bare PORT on 127.0.0.1.
        #[arg(long, default_value = "127.0.0.1:9100", value_name = "ADDR",
              value_parser = crate::metrics_page::parse_listen)]
        from: std::net::SocketAddr,
    },
}

/// Runs the program on `args` (its name first), on a runtime of its own.
pub fn main(args: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    let args: Args = dpca_shell::config::parse_from(args)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    dpca_shell::logging::init(&args.log);
    match args.command {
        Some(Cmd::Status {
            ref proxy,
            json,
            ref transport,
        }) => status(proxy, json, transport).await,
        Some(Cmd::Metrics { from }) => {
            // Whatever answers at the address may not be the proxy.
            let page = crate::metrics_page::fetch(from).await?;
            for line in page.lines() {
                println!("{}", dpca_shell::text::printable(line));
            }
            Ok(())
        }
        None => serve(args).await,
    }
}

/// `proxy status`: one running proxy's studies, printed.
async fn status(proxy: &str, json: bool, transport: &TransportArgs) -> anyhow::Result<()> {
    // The operator's certificate says `dpca-proxy`; a user's `dpca-user`.
    let transport = transport
        .transport_as(&[Role::Proxy, Role::User])
        .map_err(|e| match e {
            // The flags themselves (one missing, the revocation list): as they are.
            TlsError::Flags(_) => anyhow::Error::new(e),
            e => anyhow::Error::new(e)
                .context("proxy status needs the operator's certificate or a user's"),
        })?;
    let status = crate::status::fetch(proxy, &transport).await?;
    if json {
        // Field names as in the protocol's StudySummary and OwnerBudgetSummary.
        // serde_json escapes the C0 controls only.
        let line = serde_json::to_string(&status)?;
        println!("{}", dpca_shell::text::json_printable(&line));
    } else {
        let now = dpca_shell::clock::now_unix_ms().unwrap_or(0);
        print!("{}", crate::status::render(&status, now));
    }
    Ok(())
}

/// Open descriptors the proxy asks for: more than both listeners hold at most
/// (`ConnectionCaps::most_held`), with room for the state file, the metrics
/// listener and the runtime's own. Many systems start a process with a soft
/// limit of 1024, under what the main listener alone may hold.
pub const DESCRIPTORS_NEEDED: u64 = 4096;

/// Raises the soft limit on open descriptors to [`DESCRIPTORS_NEEDED`] where
/// the hard limit allows, and warns where it stays below: past it the listener
/// can accept nothing until a connection closes.
fn raise_descriptor_limit() {
    match rlimit::increase_nofile_limit(DESCRIPTORS_NEEDED) {
        Ok(limit) if limit >= DESCRIPTORS_NEEDED => {
            tracing::debug!(limit, "open descriptors");
        }
        Ok(limit) => tracing::warn!(
            limit,
            needed = DESCRIPTORS_NEEDED,
            "the limit on open descriptors is below what the listeners may hold: \
             raise the hard limit (ulimit -Hn, LimitNOFILE)"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot raise the limit on open descriptors"),
    }
}

/// The proxy itself: listens, then serves until interrupted.
async fn serve(args: Args) -> anyhow::Result<()> {
    if args.allow_noise_free_for_testing {
        tracing::warn!("noise-free releases are ENABLED: test use only");
    }
    if args.test_skips_noise {
        tracing::warn!("the proxy draws NONE of its own noise: test use only");
    }
    let transport = args.transport.transport(Role::Proxy).context("transport")?;
    raise_descriptor_limit();
    if let Some(addr) = args.metrics_listen {
        let listener = crate::metrics_page::bind(addr)
            .with_context(|| format!("cannot listen on {addr} (--metrics-listen)"))?;
        let handle = crate::metrics::install()?;
        tokio::spawn(crate::metrics_page::serve(listener, handle));
        tracing::info!(%addr, "metrics at /metrics");
    }
    // Checked before "listening" is printed: whoever waits for that line takes
    // the proxy for up.
    check_state_folder(&args.state)?;
    let (listener, addr) = crate::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let operator = match args.operator_listen {
        Some(at) => Some(
            crate::listen(at, crate::operator::OPERATOR_LISTEN_BACKLOG)
                .with_context(|| format!("cannot listen on {at} (--operator-listen)"))?,
        ),
        None => None,
    };
    println!("listening on {addr}");
    if let Some(l) = &operator {
        // On the log, not stdout: whoever reads "listening on" may read no further.
        let at = l.local_addr().context("operator address")?;
        tracing::info!(%at, "operator listener: status only");
    }
    std::io::stdout().flush().context("stdout")?;
    let config = crate::ProxyConfig {
        transport,
        state: Some(args.state),
        release_journal: args.release_journal,
        replace_release_journal: args.new_release_journal,
        allow_noise_free_for_testing: args.allow_noise_free_for_testing,
        test_skips_noise: args.test_skips_noise,
        max_concurrent_uploads: usize::from(args.max_concurrent_uploads),
        limits: args.limits.limits(),
        clock: std::sync::Arc::new(crate::world::SystemClock),
        entropy: std::sync::Arc::new(crate::world::OsEntropy),
    };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    crate::run(config, listener, operator, shutdown).await
}

/// The state file's folder must exist: the proxy creates the file, not folders.
fn check_state_folder(state: &std::path::Path) -> anyhow::Result<()> {
    let folder = match state.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => return Ok(()),
    };
    if !folder.is_dir() {
        anyhow::bail!(
            "--state {}: the folder {} does not exist (the proxy creates its state file, \
             not the folder; make it first)",
            state.display(),
            folder.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit asked for covers both listeners and the status lane full, with
    /// room to spare.
    #[test]
    fn the_descriptors_asked_for_cover_both_listeners() {
        let listeners = crate::listener::ConnectionCaps::MAIN.most_held()
            + crate::operator::CAPS.most_held()
            + crate::operator::LANE_CAPS.most_held();
        assert!(
            listeners + 256 <= DESCRIPTORS_NEEDED as usize,
            "{listeners} descriptors for the listeners"
        );
    }
}
