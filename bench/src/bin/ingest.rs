//! How fast, and in how much memory, an owner turns its table into its share:
//! the streamed way the owner reads (`dpca_owner::prepare_share`, a batch of
//! rows at a time) against the table read whole, then shared (`read_csv` and
//! `Share::from_raw_rows`, as the owner read before), on one generated table
//! (optdigits rows, jittered), in one run. Each way runs in a process of its own,
//! so each peak resident memory is its own. Prints a table.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use dpca_common::data::read_csv;
use dpca_common::protocol::Share;
use dpca_common::study::{SpecDraft, StudyLayout, StudySpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Share throughput and memory.
#[derive(Parser, Debug)]
#[command(name = "ingest", about)]
struct Args {
    /// Row counts of the generated tables (64 features each).
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    rows: Vec<usize>,
    /// Working folder for the generated tables.
    #[arg(long, default_value = "target/bench-ingest")]
    out: PathBuf,
    /// Internal: share one table one way in this process and print its figures.
    #[arg(long, hide = true, num_args = 2, value_names = ["WAY", "CSV"])]
    child: Option<Vec<String>>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(child) = &args.child {
        return run_child(&child[0], Path::new(&child[1]));
    }
    std::fs::create_dir_all(&args.out)?;
    let base = read_csv(
        std::fs::File::open(dpca_user::local::bundled_data())?,
        "optdigits.csv",
        Some("label"),
    )?;
    println!("| rows | MB of CSV | way | rows/s | peak MiB | rows/s, of whole | peak, of whole |");
    println!("|---|---|---|---|---|---|---|");
    for &n in &args.rows {
        let path = args.out.join(format!("jittered-{n}.csv"));
        write_jittered(&base.rows, n, &path)?;
        let mb = std::fs::metadata(&path)?.len() as f64 / 1e6;
        let whole = child(&path, "whole")?;
        let streamed = child(&path, "streamed")?;
        for (way, (rate, peak)) in [("whole", whole), ("streamed", streamed)] {
            println!(
                "| {n} | {mb:.0} | {way} | {rate:.0} | {peak:.0} | {:.2} | {:.3} |",
                rate / whole.0,
                peak / whole.1
            );
        }
    }
    Ok(())
}

/// Runs this program on `path` one `way`; returns its rows/s and peak MiB.
fn child(path: &Path, way: &str) -> anyhow::Result<(f64, f64)> {
    let out = Command::new(std::env::current_exe()?)
        .arg("--child")
        .arg(way)
        .arg(path)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{way}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut it = text.split_whitespace().map(str::parse::<f64>);
    let rate = it.next().context("rate")??;
    let peak = it.next().context("peak")??;
    Ok((rate, peak))
}

/// Shares the table at `path` one way; prints rows/s and peak resident MiB.
fn run_child(way: &str, path: &Path) -> anyhow::Result<()> {
    let spec = spec()?;
    let layout = StudyLayout::new(&spec)?;
    let t = Instant::now();
    let rows = match way {
        "streamed" => {
            let file = std::io::BufReader::with_capacity(1 << 16, std::fs::File::open(path)?);
            dpca_owner::prepare_share(&spec, &layout, file, "t.csv", Some("label"), None)?.rows
        }
        "whole" => {
            let bytes = std::fs::read(path)?;
            let table = read_csv(bytes.as_slice(), "t.csv", Some("label"))?;
            let (share, _) =
                Share::from_raw_rows(&table.rows, &spec.bounds, &spec.fixed, None, None);
            share.plaintexts(&layout, &spec.public_key)?;
            table.rows.len() as u64
        }
        other => anyhow::bail!("no way {other}"),
    };
    let rate = rows as f64 / t.elapsed().as_secs_f64();
    let peak = dpca_shell::usage::Usage::of_self().map_or(0.0, |u| u.peak_rss_bytes as f64);
    println!("{rate} {}", peak / (1 << 20) as f64);
    Ok(())
}

/// A study of optdigits' 64 features, bounds 0..16, C = 8.
fn spec() -> anyhow::Result<StudySpec> {
    let pk = dpca_common::testing::test_key().public().clone();
    let base = dpca_common::testing::test_draft(&pk, 64);
    Ok(SpecDraft {
        bounds: vec![(0.0, 16.0); 64],
        max_rows: 1 << 26,
        fixed: dpca_common::encoding::FixedPoint {
            row_norm_bound: 8.0,
            ..base.fixed
        },
        ..base
    }
    .validate()?)
}

/// `n` rows of `base` in turn, each value jittered by up to 0.5, with a label.
fn write_jittered(base: &[Vec<f64>], n: usize, path: &Path) -> anyhow::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let mut rng = ChaCha20Rng::seed_from_u64(60);
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    let header: Vec<String> = (0..64).map(|i| format!("f{i}")).collect();
    writeln!(w, "{},label", header.join(","))?;
    for i in 0..n {
        let row = &base[i % base.len()];
        for v in row {
            write!(w, "{:.2},", (v + rng.gen_range(-0.5..0.5)).clamp(0.0, 16.0))?;
        }
        writeln!(w, "{}", i % 10)?;
    }
    Ok(())
}
