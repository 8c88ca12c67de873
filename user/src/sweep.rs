//! A privacy sweep: the same local study at several epsilons, each scored by
//! the variance its components capture of the rows' exact scatter.

use anyhow::{bail, Context};
use dpca_common::data::{normalize_row, read_csv};
use dpca_common::linalg::{captured_variance, centered_scatter};
use dpca_common::synth::Task;

use crate::axes::read_components;
use crate::local::{input_files, run, LocalOptions};
use crate::report::{sweep_page, SweepPoint};

/// A privacy sweep: the study once per epsilon (outputs in `OUT/epsilon-E/`), each
/// scored by the variance its components capture of the exact scatter of the rows
/// as that study preprocessed them; writes `OUT/sweep.csv` and `OUT/sweep.html`.
/// Only a local run, which holds every row, can score; the budgets add up.
pub async fn sweep(opts: &LocalOptions, epsilons: &[f64]) -> anyhow::Result<Vec<SweepPoint>> {
    if opts.remote.is_some() || opts.task == Task::Regress {
        bail!("--sweep scores a local study of the features: not with a remote proxy or --task regress");
    }
    if epsilons.is_empty() {
        bail!("--sweep needs at least one epsilon");
    }
    let (data, label, _) = input_files(opts);
    let name = data.display().to_string();
    let file = std::fs::File::open(&data).with_context(|| format!("cannot open {name}"))?;
    let table = read_csv(file, &name, label.as_deref())?;
    let m = table.features.len();
    let mut points = Vec::with_capacity(epsilons.len());
    for &epsilon in epsilons {
        let o = LocalOptions {
            epsilon,
            out: opts.out.join(format!("epsilon-{epsilon}")),
            ..opts.clone()
        };
        eprintln!("== sweep: epsilon {epsilon}");
        let report = run(&o).await?;
        let bounds: Vec<(f64, f64)> = report.bounds.iter().map(|b| (b[0], b[1])).collect();
        let rows: Vec<Vec<f64>> = table
            .rows
            .iter()
            .map(|r| normalize_row(r, &bounds[..m], report.row_norm_bound).0)
            .collect();
        let s_true = centered_scatter(&rows);
        let v = read_components(&o.out.join("components.csv"), &table.features, opts.k)?;
        points.push(SweepPoint {
            epsilon,
            captured_variance: captured_variance(&s_true, &v),
            sigma: report.sigma,
            out: o.out.display().to_string(),
        });
    }
    write_sweep(opts, &points)?;
    println!("epsilon  captured variance (k = {})", opts.k);
    for p in &points {
        println!("{:>7}  {:.4}", p.epsilon, p.captured_variance);
    }
    println!(
        "sweep in {} (sweep.csv, sweep.html); the studies spent epsilon {} on these rows in all",
        opts.out.display(),
        epsilons.iter().sum::<f64>()
    );
    Ok(points)
}

/// `OUT/sweep.csv` and `OUT/sweep.html`.
fn write_sweep(opts: &LocalOptions, points: &[SweepPoint]) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    let csv_path = opts.out.join("sweep.csv");
    let mut w = csv::Writer::from_path(&csv_path)
        .with_context(|| format!("cannot create {}", csv_path.display()))?;
    w.write_record(["epsilon", "captured_variance", "sigma", "out"])?;
    for p in points {
        w.write_record([
            p.epsilon.to_string(),
            p.captured_variance.to_string(),
            p.sigma.to_string(),
            p.out.clone(),
        ])?;
    }
    w.flush()?;
    std::fs::write(opts.out.join("sweep.html"), sweep_page(points, opts.k))
        .with_context(|| format!("cannot write {}", opts.out.join("sweep.html").display()))?;
    Ok(())
}
