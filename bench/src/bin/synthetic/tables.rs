//! The printed tables: mean and spread per method, and the paired differences.

use crate::methods::*;
use crate::Args;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Cell {
    pub(crate) experiment: String,
    pub(crate) metric: &'static str,
    pub(crate) method: Method,
    pub(crate) epsilon: Option<f64>,
    pub(crate) k: usize,
    pub(crate) reps: usize,
    pub(crate) mean: f64,
    pub(crate) sd: f64,
    /// The repetitions' scores in seed order, so two methods can be paired.
    pub(crate) values: Vec<f64>,
}

pub(crate) fn summarize(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// Each reduced method against full-gauss, repetition by repetition. Repetition r of
/// every method starts from the same seed, so the spread between repetitions, which
/// is larger than the gap between the methods, cancels out of the difference; what is
/// left says whether a gap is more than noise.
pub(crate) fn print_paired(cells: &[Cell]) {
    let full: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.method == Method::FullGauss && !c.experiment.ends_with("(k sweep)"))
        .collect();
    if full.is_empty() {
        return;
    }
    println!(
        "\nPaired against full-gauss: the difference per repetition, signed so that \
         positive means better than full-gauss; mean +- standard error; repetitions ahead"
    );
    println!("| experiment | epsilon | method | difference | ahead |");
    println!("|---|---|---|---|---|");
    for f in full {
        // A lower RMSE is better.
        let sign = if f.metric == "RMSE" { -1.0 } else { 1.0 };
        for c in cells.iter().filter(|c| {
            c.experiment == f.experiment
                && c.epsilon == f.epsilon
                && !matches!(c.method, Method::Real | Method::FullGauss)
                && c.values.len() == f.values.len()
        }) {
            let d: Vec<f64> = c
                .values
                .iter()
                .zip(&f.values)
                .map(|(a, b)| sign * (a - b))
                .collect();
            let (mean, sd) = summarize(&d);
            let se = sd / (d.len() as f64).sqrt();
            let ahead = d.iter().filter(|&&x| x > 0.0).count();
            println!(
                "| {} | {} | {} | {mean:+.4} +- {se:.4} | {ahead}/{} |",
                f.experiment,
                f.epsilon.map_or("-".to_string(), |e| e.to_string()),
                c.method.name(),
                d.len()
            );
        }
    }
}

pub(crate) fn print_tables(cells: &[Cell], args: &Args) {
    println!(
        "mechanism {}, {} class covariance, {} covariance fit{}, {} repetitions; mean +- sd; in brackets the ratio to real",
        args.mechanism,
        args.class_covariance,
        args.covariance,
        if args.denoise_full_gauss { " (full-gauss too)" } else { "" },
        args.reps
    );
    let mut experiments: Vec<&str> = Vec::new();
    for c in cells {
        if !experiments.contains(&c.experiment.as_str()) {
            experiments.push(&c.experiment);
        }
    }
    for exp in experiments {
        let rows: Vec<&Cell> = cells.iter().filter(|c| c.experiment == exp).collect();
        let Some(first) = rows.first() else { continue };
        let real = cells
            .iter()
            .find(|c| c.method == Method::Real && exp.starts_with(c.experiment.as_str()))
            .map(|c| c.mean);
        println!("\n{exp} ({})", first.metric);
        println!(
            "| method | epsilon | k | {} | ratio to real |",
            first.metric
        );
        println!("|---|---|---|---|---|");
        for c in rows {
            let eps = c.epsilon.map_or("-".to_string(), |e| e.to_string());
            let ratio = real.map_or("-".to_string(), |r| format!("{:.2}", c.mean / r));
            println!(
                "| {} | {eps} | {} | {:.4} +- {:.4} | {ratio} |",
                c.method.name(),
                c.k,
                c.mean,
                c.sd
            );
        }
    }
}
