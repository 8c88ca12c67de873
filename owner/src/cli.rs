//! The `owner` program's command line: its flags; `main`, which the `owner`
//! binary and the Python package's role runner call; and [`Invocation`], through
//! which the Python package's `Owner` contributes a data frame held in memory.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use dpca_common::risk::Risk;
use dpca_common::study::DEFAULT_MAX_CIPHERTEXTS;
use dpca_shell::owner_report::OwnerReport;
use dpca_shell::tls::{Role, TransportArgs};

use crate::OwnerData;

/// Encrypts this owner's scatter share under the data user's key and streams it to
/// the proxy. Prints one JSON line with what was sent.
#[derive(Parser, Debug)]
#[command(name = "owner", version, about)]
struct Args {
    /// TOML file of settings: flag names as keys, a table per subcommand;
    /// environment variables and flags override it.
    #[arg(long, global = true, env = "DPCA_CONFIG", value_name = "TOML")]
    config: Option<PathBuf>,
    #[command(flatten)]
    log: dpca_shell::logging::LogArgs,
    /// Proxy URL (https, or http with --insecure-plaintext).
    #[arg(
        long,
        default_value = "https://localhost:50051",
        env = "DPCA_PROXY_URL"
    )]
    proxy: String,
    /// Study to contribute to.
    #[arg(long, env = "DPCA_STUDY", required_unless_present = "invitation")]
    study: Option<String>,
    /// Read the study and the key fingerprint from this invitation file, written by
    /// the data user (`user study --invitation`); waits up to --retry-for seconds
    /// for it to appear.
    #[arg(long, env = "DPCA_INVITATION", value_name = "TOML",
          conflicts_with_all = ["study", "key_fingerprint"])]
    invitation: Option<PathBuf>,
    /// This owner's CSV file (header row, numeric feature columns).
    #[arg(long, env = "DPCA_DATA")]
    data: PathBuf,
    /// This owner's identity at the proxy. On TLS it is the name in the owner's
    /// certificate (the default); required with --insecure-plaintext.
    #[arg(long, env = "DPCA_OWNER_ID")]
    owner_id: Option<String>,
    /// SHA-256 fingerprint of the data user's public key, obtained out of band. The
    /// owner refuses to encrypt for any other key.
    #[arg(
        long,
        env = "DPCA_KEY_FINGERPRINT",
        required_unless_present = "invitation"
    )]
    key_fingerprint: Option<String>,
    /// SHA-256 of the study's spec as the user opened it (`user study` prints it
    /// and writes it into the invitation). The owner refuses a spec the proxy
    /// serves of another digest: where the owners add the noise, the spec sizes
    /// each owner's share.
    #[arg(long, env = "DPCA_SPEC_DIGEST", conflicts_with = "invitation")]
    spec_digest: Option<String>,
    /// The URL of the mask holder this owner's operator trusts not to work
    /// with the proxy: a study naming another holder, or none, is refused.
    /// Without it the holder the study names (the user's choice, in the
    /// invitation's spec) is taken, but never the proxy itself.
    #[arg(long, env = "DPCA_MASK_HOLDER")]
    mask_holder: Option<String>,
    /// TEST ONLY: add no noise share (an owner working with the proxy and the
    /// user), to show what the other owners' shares alone give. Never enable in
    /// a deployment.
    #[arg(long, hide = true)]
    test_adds_no_noise: bool,
    /// Label column to exclude from the features.
    #[arg(long)]
    label: Option<String>,
    /// Do not draw a progress bar.
    #[arg(long)]
    quiet: bool,
    /// Seconds to keep retrying while the proxy cannot be reached (restarting, or
    /// the connection broke); the proxy counts a retried contribution once.
    #[arg(long, default_value_t = 60.0, env = "DPCA_RETRY_FOR")]
    retry_for: f64,
    /// This data set's privacy budget over all studies, EPSILON,DELTA (e.g.
    /// `2,1e-5`): the proxy refuses a study that would take the spent total past
    /// it. Lowering it later is allowed, raising it is not.
    #[arg(long, env = "DPCA_BUDGET_CAP", value_name = "EPSILON,DELTA",
          value_parser = parse_cap)]
    budget_cap: (f64, f64),
    /// Keep this data set's own ledger of the studies it entered in FILE (JSON,
    /// created by the first study): each study is charged to it against
    /// --budget-cap before anything is sent, and one that would pass the cap is
    /// refused whatever the proxy says, so a proxy that lost or reset its state
    /// cannot let a user spend the budget again. Use one ledger per data set.
    #[arg(long, env = "DPCA_LEDGER", value_name = "FILE")]
    ledger: Option<PathBuf>,
    /// Take part in a study that protects this data less than the default, named
    /// (repeat for several): `mask-centering` (the paper's centering: private only
    /// if every other owner keeps its rows in the norm ball and the proxy forwards
    /// the true E[N]), `wishart-unproven` (a mechanism without a privacy proof),
    /// `noise-free` (a test-mode release without noise). Without it such a study
    /// is refused before the data is read.
    #[arg(long = "accept-risk", value_name = "NAME", value_parser = |s: &str| Risk::parse(s).map_err(|e| e.to_string()))]
    accept_risk: Vec<Risk>,
    /// The most ciphertexts this owner encrypts for one study: a study whose spec
    /// asks more (extreme parameters shrink the packing) is refused before the
    /// data is read. The default is the proxy's default cap on a contribution.
    #[arg(long, default_value_t = DEFAULT_MAX_CIPHERTEXTS)]
    max_ciphertexts: usize,
    /// Encrypt the paper's way (one value per ciphertext, each with a full r^n:
    /// hours of CPU at large M) when a study asks for it, as a speed comparison
    /// does; without it such a study is refused before the data is read.
    #[arg(long)]
    allow_baseline: bool,
    #[command(flatten)]
    transport: TransportArgs,
}

fn parse_cap(s: &str) -> Result<(f64, f64), String> {
    let (e, d) = s
        .split_once(',')
        .ok_or_else(|| format!("`{s}`: give EPSILON,DELTA, e.g. 2,1e-5"))?;
    let num = |x: &str, what: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| format!("`{s}`: {what} `{x}` is not a number"))
    };
    Ok((num(e, "epsilon")?, num(d, "delta")?))
}

/// Runs the program on `args` (its name first), on a runtime of its own: takes
/// part in the study and prints its report as one JSON line.
pub fn main(args: Vec<OsString>) -> anyhow::Result<()> {
    let args: Args = dpca_shell::config::parse_from(args)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?
        .block_on(async {
            let done = Invocation(args).contribute(None).await?;
            for w in &done.warnings {
                eprintln!("WARNING: {w}");
            }
            println!("{}", serde_json::to_string(&done.report)?);
            Ok(())
        })
}

/// What a contribution reports, and what the owner should be told about it.
#[derive(Debug)]
pub struct Contribution {
    /// The report the program prints.
    pub report: OwnerReport,
    /// Warnings for the owner: rows clipped, a budget cap above the one held.
    pub warnings: Vec<String>,
}

/// An `owner` command line, parsed.
#[derive(Debug)]
pub struct Invocation(Args);

impl Invocation {
    /// Parses `args` (the program's name first) as they are: a host passes every
    /// setting itself, so no config file (`--config`, `DPCA_CONFIG`) is read. A
    /// command line the program cannot take, or `--help`, is clap's error, to show.
    pub fn parse(args: Vec<OsString>) -> Result<Self, clap::Error> {
        Args::try_parse_from(args).map(Self)
    }

    /// Takes part in the study and returns the report and the warnings it gives
    /// rise to (the program prints them; a host shows them its own way). `rows`: the table as CSV
    /// bytes held in memory (a host's data frame, never written to disk), which
    /// `--data` then only names in messages; `None` reads the `--data` file.
    pub async fn contribute(self, rows: Option<Vec<u8>>) -> anyhow::Result<Contribution> {
        let args = self.0;
        dpca_shell::logging::init(&args.log);
        let transport = args.transport.transport(Role::Owner).context("transport")?;
        let owner_id = crate::owner_id(args.owner_id.as_deref(), &transport)?;
        let retry_for = std::time::Duration::try_from_secs_f64(args.retry_for)
            .context("--retry-for must be a number of seconds, 0 or more")?;
        let data = match rows {
            Some(bytes) => OwnerData::Csv {
                name: args.data.display().to_string(),
                bytes,
            },
            None => OwnerData::File(args.data),
        };
        let cfg = crate::OwnerConfig {
            proxy: args.proxy,
            transport,
            study_id: args.study.unwrap_or_default(),
            data,
            owner_id,
            key_fingerprint: args.key_fingerprint.unwrap_or_default(),
            spec_digest: args.spec_digest,
            mask_holder: args.mask_holder,
            label: args.label,
            progress: !args.quiet,
            budget_cap: args.budget_cap,
            retry_for,
            accepted_risks: args.accept_risk,
            work: crate::work::WorkCap {
                max_ciphertexts: args.max_ciphertexts,
                allow_baseline: args.allow_baseline,
            },
            ledger: args.ledger.map(crate::ledger::Ledger::at),
            noise_source: if args.test_adds_no_noise {
                tracing::warn!("this owner adds NO noise share: test use only");
                crate::NoiseSource::NoneForTesting
            } else {
                crate::NoiseSource::Derived
            },
        };
        let report = match &args.invitation {
            Some(path) => crate::run_invited(&cfg, path).await?,
            None => crate::run(&cfg).await?,
        };
        let cap = report
            .budget
            .as_ref()
            .and_then(|b| cap_warning(args.budget_cap, b));
        let warnings = clipping_warning(report.clipped_rows, report.rows)
            .into_iter()
            .chain(cap)
            .collect();
        Ok(Contribution { report, warnings })
    }
}

/// What the owner is told when the study's row-norm bound shortened some of its
/// rows: only it can know (the user sees no rows, and a count would reveal them).
fn clipping_warning(clipped: usize, rows: u64) -> Option<String> {
    let how_many = match clipped as u64 {
        0 => return None,
        c if c == rows => format!("all {c} rows"),
        c => format!("{c} of {rows} rows"),
    };
    Some(format!(
        "{how_many} were longer than the study's row-norm bound and were scaled down to \
         it (clipped): the study sees them shortened. If that is many, the bound is \
         small for this data; a study can choose it privately (--row-norm-quantile)."
    ))
}

/// What the owner is told when it asked for a higher cap than the proxy holds for
/// its data set: the proxy keeps the lower one (a cap is lowered, never raised).
fn cap_warning(asked: (f64, f64), held: &crate::BudgetReport) -> Option<String> {
    (asked.0 > held.cap_epsilon || asked.1 > held.cap_delta).then(|| {
        format!(
            "--budget-cap {},{} is above the cap the proxy holds for this data set \
             ({},{}), which stays: a cap can be lowered, never raised",
            asked.0, asked.1, held.cap_epsilon, held.cap_delta
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner hears of its clipped rows, and of a cap it asked for that the
    /// proxy does not take.
    #[test]
    fn clipping_and_a_refused_higher_cap_are_said() {
        assert_eq!(clipping_warning(0, 10), None);
        let all = clipping_warning(10, 10).expect("all clipped");
        assert!(all.starts_with("all 10 rows were longer"), "{all}");
        let some = clipping_warning(3, 10).expect("some clipped");
        assert!(some.starts_with("3 of 10 rows"), "{some}");
        let held = crate::BudgetReport {
            spent_epsilon: 1.0,
            spent_delta: 1e-6,
            cap_epsilon: 2.0,
            cap_delta: 1e-5,
        };
        assert_eq!(cap_warning((2.0, 1e-5), &held), None);
        assert_eq!(
            cap_warning((1.0, 1e-6), &held),
            None,
            "a lower cap is taken"
        );
        let w = cap_warning((3.0, 1e-5), &held).expect("a higher cap");
        assert!(
            w.contains("--budget-cap 3,0.00001") && w.contains("never raised"),
            "{w}"
        );
    }
}
