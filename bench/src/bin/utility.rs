//! Utility of the private PCA against epsilon: captured variance
//! tr(V_k^T S V_k) / tr(U_k^T S U_k) on a real table, for both centering modes.
//!
//! The repetitions run the mechanism centrally on the pooled integer share
//! (`central_release`), which the protocol's tests prove equal, bit for bit, to what
//! the user opens from the distributed release with the same noise. With
//! `--distributed-reps R` the table also shows R whole studies through the real
//! programs (proxy, owners and user as processes over gRPC) per setting at epsilon 1.

use dpca_bench::workspace_root;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use clap::Parser;
use dpca_common::data::{normalize_row, read_bounds, read_csv};
use dpca_common::dp::{plan_noise, Centering, Mechanism, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::linalg::{captured_variance, centered_scatter, pca};
use dpca_common::protocol::{central_release, ReleaseSecrets, Share};
use dpca_common::study::BlockShape;
use dpca_common::study::DEFAULT_FRAC_BITS;
use dpca_user::read_components;
use nalgebra::DMatrix;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::Serialize;

/// Captured variance of the private PCA against epsilon.
#[derive(Parser, Debug)]
#[command(name = "utility", about)]
struct Args {
    /// Input CSV (default: the bundled optdigits with its public bounds 0..16).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Bounds file (required with --data).
    #[arg(long)]
    bounds: Option<PathBuf>,
    /// Label column to exclude.
    #[arg(long, default_value = "label")]
    label: String,
    /// Components.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Repetitions of the central mechanism per setting.
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Epsilons to sweep (1e6 is added as the near-noise-free check).
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,2")]
    epsilons: Vec<f64>,
    /// Mechanism.
    #[arg(long, default_value = "gaussian")]
    mechanism: String,
    /// Whole studies through the real programs per centering at epsilon 1 (10 owners,
    /// 2048-bit keys).
    #[arg(long, default_value_t = 0)]
    distributed_reps: usize,
    /// Seed of the central repetitions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the table as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Row {
    centering: String,
    epsilon: f64,
    how: String,
    reps: usize,
    mean: f64,
    sd: f64,
    min: f64,
}

fn summarize(centering: &str, epsilon: f64, how: &str, xs: &[f64]) -> Row {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    Row {
        centering: centering.into(),
        epsilon,
        how: how.into(),
        reps: xs.len(),
        mean,
        sd,
        min: xs.iter().copied().fold(f64::INFINITY, f64::min),
    }
}

/// The table the bench reads: optdigits unless `--data` and `--bounds` name
/// another.
struct Input {
    name: String,
    table: dpca_common::data::Table,
    bounds: Vec<(f64, f64)>,
    /// The files read, which the whole studies are given too.
    data_path: PathBuf,
    bounds_path: PathBuf,
}

impl Input {
    fn read(args: &Args) -> anyhow::Result<Self> {
        let root = workspace_root();
        let (data, bounds_path) = match (&args.data, &args.bounds) {
            (Some(d), Some(b)) => (d.clone(), b.clone()),
            (None, _) => (
                root.join("data/optdigits.csv"),
                root.join("data/optdigits.bounds.csv"),
            ),
            (Some(_), None) => {
                bail!("--data needs --bounds (public bounds, not read off the data)")
            }
        };
        let name = data.display().to_string();
        let table = read_csv(
            std::fs::File::open(&data).with_context(|| name.clone())?,
            &name,
            Some(&args.label),
        )?;
        let bounds = read_bounds(
            std::fs::File::open(&bounds_path)
                .with_context(|| format!("cannot open {}", bounds_path.display()))?,
            &table.features,
        )?;
        Ok(Self {
            name,
            table,
            bounds,
            data_path: data,
            bounds_path,
        })
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let input = Input::read(&args)?;
    let (name, table, bounds) = (&input.name, &input.table, &input.bounds);
    let fixed = FixedPoint {
        frac_bits: DEFAULT_FRAC_BITS,
        row_norm_bound: 1.0,
    };
    let (dim, n) = (table.features.len(), table.rows.len());
    let delta = (n as f64).powf(-1.1);
    let (pooled, clipped) = Share::from_raw_rows(&table.rows, bounds, &fixed, None, None);
    let normalized: Vec<Vec<f64>> = table
        .rows
        .iter()
        .map(|r| normalize_row(r, bounds, fixed.row_norm_bound).0)
        .collect();
    let s_true = centered_scatter(&normalized);
    let mechanism = Mechanism::parse(&args.mechanism)?;
    println!(
        "{name}: N = {n}, M = {dim}, k = {}, delta = 1/N^1.1 = {delta:.3e}, {} ({} of {n} rows norm-clipped), {} reps",
        args.k,
        mechanism.name(),
        clipped,
        args.reps
    );
    let central = Central {
        pooled: &pooled,
        fixed: &fixed,
        s_true: &s_true,
        mechanism,
        delta,
    };
    let mut rows = Vec::new();
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let mut epsilons = args.epsilons.clone();
    epsilons.push(1e6);
    for centering in [Centering::Mask, Centering::DpMean] {
        for &eps in &epsilons {
            let caps = central.captures(&args, centering, eps, &mut rng)?;
            rows.push(summarize(centering.name(), eps, "central", &caps));
        }
        if args.distributed_reps > 0 {
            let caps = distributed(&args, &input, centering, &s_true)?;
            rows.push(summarize(centering.name(), 1.0, "distributed", &caps));
        }
    }
    print_rows(&rows);
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("{}", p.display()))?;
    }
    Ok(())
}

/// The mechanism on the pooled share, as the distributed release computes it.
struct Central<'a> {
    pooled: &'a Share,
    fixed: &'a FixedPoint,
    s_true: &'a DMatrix<f64>,
    mechanism: Mechanism,
    delta: f64,
}

impl Central<'_> {
    /// The captured variance of `--reps` releases at `eps`.
    fn captures(
        &self,
        args: &Args,
        centering: Centering,
        eps: f64,
        rng: &mut ChaCha20Rng,
    ) -> anyhow::Result<Vec<f64>> {
        let dim = self.s_true.nrows();
        let (n, bound) = (self.pooled.n, self.fixed.norm_bound_int());
        let req = PrivacyRequest::new(self.mechanism, centering, eps, self.delta)?;
        let plan = plan_noise(&req, dim, bound, n, false);
        let mut caps = Vec::with_capacity(args.reps);
        for _ in 0..args.reps {
            let secrets = ReleaseSecrets {
                mask: Vec::new(),
                matrix_noise: plan.matrix.sample_upper(dim, rng),
                vector_noise: plan
                    .vector
                    .as_ref()
                    .map(|v| v.sample_vector(dim, rng))
                    .unwrap_or_default(),
            };
            let opened = central_release(
                self.pooled,
                &BlockShape::new(dim, 0, false, bound),
                centering,
                None,
                &secrets,
                self.fixed.frac_bits,
            );
            caps.push(captured_variance(
                self.s_true,
                &pca(&opened.scatter, args.k).components,
            ));
        }
        Ok(caps)
    }
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:>9}  {:>9}  {:>11}  {:>4}  {:>8}  {:>7}  {:>7}",
        "centering", "epsilon", "how", "reps", "captured", "sd", "min"
    );
    for r in rows {
        println!(
            "{:>9}  {:>9}  {:>11}  {:>4}  {:>8.4}  {:>7.4}  {:>7.4}",
            r.centering, r.epsilon, r.how, r.reps, r.mean, r.sd, r.min
        );
    }
}

/// One `user local` study at epsilon 1, its outputs in `out`.
fn run_local(
    user: &Path,
    args: &Args,
    input: &Input,
    centering: Centering,
    out: &Path,
) -> anyhow::Result<()> {
    let o = Command::new(user)
        .arg("local")
        // The table and bounds the central runs read, whatever the user's default.
        .arg("--data")
        .arg(&input.data_path)
        .arg("--bounds")
        .arg(&input.bounds_path)
        .args(["--label", &args.label])
        .args([
            "--no-build",
            "--owners",
            "10",
            "--epsilon",
            "1",
            "--key-bits",
            "2048",
            // The paper's C and no synthesis, as the central runs it is compared to.
            "--row-norm-bound",
            "1",
            "--task",
            "cluster",
        ])
        .args([
            "--k",
            &args.k.to_string(),
            "--centering",
            centering.name(),
            "--mechanism",
            &args.mechanism,
        ])
        .arg("--out")
        .arg(out)
        .output()?;
    if !o.status.success() {
        bail!("user local failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}

/// Whole studies through the real programs, at epsilon 1.
fn distributed(
    args: &Args,
    input: &Input,
    centering: Centering,
    s_true: &DMatrix<f64>,
) -> anyhow::Result<Vec<f64>> {
    let exe = std::env::current_exe()?;
    let user = exe.parent().context("bench has no folder")?.join("user");
    if !user.exists() {
        bail!(
            "{} not found: build it first (`cargo build --release --bins`)",
            user.display()
        );
    }
    let dir = std::env::temp_dir().join(format!("dpca-utility-{}", std::process::id()));
    let mut caps = Vec::new();
    for rep in 0..args.distributed_reps {
        let out = dir.join(format!("{}-{rep}", centering.name()));
        run_local(&user, args, input, centering, &out)?;
        let v = read_components(&out.join("components.csv"), &input.table.features, args.k)?;
        caps.push(captured_variance(s_true, &v));
        eprintln!(
            "distributed {} rep {rep}: {:.4}",
            centering.name(),
            caps[caps.len() - 1]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(caps)
}
