//! Choosing bounds privately against public bounds, on the bundled tables: for
//! each preprocessing, the variance the private components capture of the exact
//! ones on the same preprocessing, and the score of a model trained on the
//! synthetic rows (mapped back to the input's units) on real held-out rows.
//!
//! Preprocessings (`--preps`): `public` is the table's bounds file
//! (`data/NAME.bounds.csv`), as a user who knows them runs today; `private-P`
//! chooses every feature's range, center and scale from a marginal histogram
//! release at P bins per octave (`user local` without `--bounds`), spending
//! `--bounds-share` of the budget. Each is run with every row bound of
//! `--row-bounds`: `qQ` chooses C as the DP Q quantile of the rows' norms,
//! spending `--quantile-share` (`user local`'s default is q0.9); `cC` fixes C
//! (`--row-norm-bound C`). The study gets the rest.
//!
//! Every release runs centrally on the pooled integer share (`central_release`),
//! which the protocol's tests prove equal, bit for bit, to what the user opens
//! from the distributed release with the same noise. Repetition r of every
//! preprocessing starts from the same seed, so the paired table tells a gap
//! from the spread between repetitions.

mod prep;
mod study;
mod tables;

use std::path::PathBuf;

use clap::Parser;
use dpca_bench::workspace_root;
use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
use dpca_common::synth::Task;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::Serialize;

use prep::{choose, Prep, RowBound, Shares};
use study::{run_study, score};
use tables::{load, Table};

/// Public bounds against bounds chosen privately.
#[derive(Parser, Debug)]
#[command(name = "preprocessing", about)]
struct Args {
    /// Bundled tables.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "optdigits,letter,diamonds,movement_libras"
    )]
    tables: Vec<String>,
    /// Preprocessings: public, private-P (P bins per octave).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "public,private-1,private-2,private-4"
    )]
    preps: Vec<String>,
    /// Row-norm bounds: qQ (the DP Q quantile of the norms), cC (C fixed).
    #[arg(long, value_delimiter = ',', default_value = "q0.9")]
    row_bounds: Vec<String>,
    /// Epsilons (delta 1/N^1.1).
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,2")]
    epsilons: Vec<f64>,
    /// Repetitions per setting.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Components kept.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Share of the request the marginal histograms spend (private only).
    #[arg(long, default_value_t = 0.05)]
    bounds_share: f64,
    /// Share of the request the row-norm histogram spends.
    #[arg(long, default_value_t = 0.05)]
    quantile_share: f64,
    /// Seed of the split and of the repetitions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// JSON output (default target/bench-preprocessing/preprocessing.json).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One setting's repetitions.
#[derive(Serialize)]
struct Cell {
    table: String,
    metric: &'static str,
    prep: String,
    epsilon: f64,
    real: f64,
    captured: Vec<f64>,
    score: Vec<f64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let preps: Vec<Prep> = args
        .preps
        .iter()
        .map(|p| Prep::parse(p))
        .collect::<anyhow::Result<_>>()?;
    let row_bounds: Vec<RowBound> = args
        .row_bounds
        .iter()
        .map(|r| RowBound::parse(r))
        .collect::<anyhow::Result<_>>()?;
    let shares = Shares {
        bounds: args.bounds_share,
        quantile: args.quantile_share,
    };
    let mut cells = Vec::new();
    for name in &args.tables {
        let table = load(name, args.k, args.seed)?;
        let real = score(&table, &table.train, &table.train_y)?;
        eprintln!(
            "{name}: {} train / {} test rows, M = {}, real {} {real:.4}",
            table.train.len(),
            table.test.len(),
            table.dim(),
            metric(table.task)
        );
        let settings = preps
            .iter()
            .flat_map(|&p| row_bounds.iter().map(move |&r| (p, r)));
        for &epsilon in &args.epsilons {
            for setting in settings.clone() {
                let cell = run_cell(&args, &table, (setting, epsilon), shares, real)?;
                eprintln!(
                    "  eps {epsilon} {}: captured {:.4}, {} {:.4}",
                    cell.prep,
                    mean(&cell.captured),
                    cell.metric,
                    mean(&cell.score)
                );
                cells.push(cell);
            }
        }
    }
    print_table(&cells);
    print_paired(&cells);
    write_json(&args, &cells)
}

/// `--reps` studies of `table` under `prep` at `epsilon`; repetition r draws from
/// the same seed under every preprocessing.
fn run_cell(
    args: &Args,
    table: &Table,
    ((prep, row_bound), epsilon): ((Prep, RowBound), f64),
    shares: Shares,
    real: f64,
) -> anyhow::Result<Cell> {
    let delta = (table.train.len() as f64).powf(-1.1);
    let req = PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::DpMean, epsilon, delta)?;
    let (mut captured, mut scores) = (Vec::new(), Vec::new());
    for rep in 0..args.reps {
        let seed = args.seed ^ (epsilon.to_bits().rotate_left(17)) ^ (rep as u64) << 40;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let chosen = choose(table, (prep, row_bound), &req, shares, &mut rng)?;
        let outcome = run_study(table, &chosen, &mut rng)?;
        captured.push(outcome.captured);
        scores.push(outcome.score);
    }
    Ok(Cell {
        table: table.name.clone(),
        metric: metric(table.task),
        prep: format!("{} {}", prep.name(), row_bound.name()),
        epsilon,
        real,
        captured,
        score: scores,
    })
}

fn metric(task: Task) -> &'static str {
    match task {
        Task::Regress | Task::Cluster => "RMSE",
        Task::Classify => "accuracy",
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

fn sd(xs: &[f64]) -> f64 {
    let m = mean(xs);
    let n = xs.len() as f64;
    (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt()
}

/// Mean and sd per setting; the score also as a ratio to the real rows' (for
/// RMSE, real over synthetic, so that 1 is as good as real for both).
fn print_table(cells: &[Cell]) {
    println!("\n| table | epsilon | preprocessing | captured variance | synthetic-trained score | of real |");
    println!("|---|---|---|---|---|---|");
    for c in cells {
        let ratio = match c.metric {
            "RMSE" => c.real / mean(&c.score),
            _ => mean(&c.score) / c.real,
        };
        println!(
            "| {} | {} | {} | {:.3} +- {:.3} | {} {:.4} +- {:.4} | {ratio:.3} |",
            c.table,
            c.epsilon,
            c.prep,
            mean(&c.captured),
            sd(&c.captured),
            c.metric,
            mean(&c.score),
            sd(&c.score)
        );
    }
}

/// Every other preprocessing against the first (`--preps` and `--row-bounds`
/// first), repetition by repetition (same seeds): the score's difference, signed
/// so that positive is better than the first; mean +- standard error.
fn print_paired(cells: &[Cell]) {
    let Some(first) = cells.first().map(|c| c.prep.clone()) else {
        return;
    };
    println!("\nPaired against {first} (positive: better; mean +- standard error)");
    println!("| table | epsilon | preprocessing | score difference | ahead |");
    println!("|---|---|---|---|---|");
    for public in cells.iter().filter(|c| c.prep == first) {
        let sign = if public.metric == "RMSE" { -1.0 } else { 1.0 };
        for c in cells
            .iter()
            .filter(|c| c.table == public.table && c.epsilon == public.epsilon && c.prep != first)
        {
            let d: Vec<f64> = c
                .score
                .iter()
                .zip(&public.score)
                .map(|(a, b)| sign * (a - b))
                .collect();
            let ahead = d.iter().filter(|x| **x > 0.0).count();
            println!(
                "| {} | {} | {} | {:+.4} +- {:.4} | {ahead} of {} |",
                c.table,
                c.epsilon,
                c.prep,
                mean(&d),
                sd(&d) / (d.len() as f64).sqrt(),
                d.len()
            );
        }
    }
}

fn write_json(args: &Args, cells: &[Cell]) -> anyhow::Result<()> {
    let json = args
        .json
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/bench-preprocessing/preprocessing.json"));
    if let Some(dir) = json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&json, serde_json::to_string_pretty(cells)? + "\n")?;
    println!("JSON in {}", json.display());
    Ok(())
}
