//! The bundled tables as the bench reads them: raw rows split 80/20, the
//! label, the public bounds of the comparison, and the real rows' score.

use anyhow::{bail, Context};
use dpca_bench::data_dir;
use dpca_common::data::{read_bounds, read_csv};
use dpca_common::synth::Task;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// One bundled table, split, in its input units.
pub(crate) struct Table {
    pub(crate) name: String,
    pub(crate) task: Task,
    /// Training rows (a regression's label last, as a feature).
    pub(crate) train: Vec<Vec<f64>>,
    pub(crate) test: Vec<Vec<f64>>,
    /// Class index per row (classification).
    pub(crate) train_y: Vec<usize>,
    pub(crate) test_y: Vec<usize>,
    pub(crate) classes: usize,
    /// The public bounds shipped with the table (`data/NAME.bounds.csv`).
    pub(crate) public_bounds: Vec<(f64, f64)>,
    /// Components the study keeps.
    pub(crate) k: usize,
}

impl Table {
    /// Features of the study (a regression's label included).
    pub(crate) fn dim(&self) -> usize {
        self.public_bounds.len()
    }

    /// Features the PCA runs on (a regression's label excluded).
    pub(crate) fn pca_dim(&self) -> usize {
        self.dim() - usize::from(self.task == Task::Regress)
    }
}

/// The task and label column of a bundled table.
fn task_of(name: &str) -> anyhow::Result<(Task, &'static str)> {
    Ok(match name {
        "optdigits" | "letter" | "movement_libras" => (Task::Classify, "label"),
        "diamonds" => (Task::Regress, "price"),
        other => bail!("unknown table `{other}` (optdigits, letter, diamonds, movement_libras)"),
    })
}

/// Reads `name` from `data/`, split 80/20 by `seed`, keeping `k` components.
pub(crate) fn load(name: &str, k: usize, seed: u64) -> anyhow::Result<Table> {
    let (task, label) = task_of(name)?;
    let path = data_dir().join(format!("{name}.csv"));
    let shown = path.display().to_string();
    let input = read_csv(
        std::fs::File::open(&path).with_context(|| shown.clone())?,
        &shown,
        Some(label),
    )?;
    let (table, labels) = match task {
        Task::Regress => (input.with_label_as_feature(&shown)?, Vec::new()),
        _ => {
            let mut classes = input.distinct_labels().unwrap_or_default();
            classes.sort();
            let idx = input.class_indices(&classes, &shown)?;
            (input, idx)
        }
    };
    let bounds_path = data_dir().join(format!("{name}.bounds.csv"));
    let public_bounds = read_bounds(
        std::fs::File::open(&bounds_path).with_context(|| bounds_path.display().to_string())?,
        &table.features,
    )?;
    let mut order: Vec<usize> = (0..table.rows.len()).collect();
    order.shuffle(&mut ChaCha20Rng::seed_from_u64(seed));
    let (train, test) = order.split_at(order.len() * 4 / 5);
    let rows = |part: &[usize]| part.iter().map(|&i| table.rows[i].clone()).collect();
    let ys = |part: &[usize]| {
        part.iter()
            .filter_map(|&i| labels.get(i).copied())
            .collect()
    };
    let pca_dim = table.features.len() - usize::from(task == Task::Regress);
    Ok(Table {
        name: name.to_string(),
        task,
        train: rows(train),
        test: rows(test),
        train_y: ys(train),
        test_y: ys(test),
        classes: labels.iter().copied().max().map_or(0, |m| m + 1),
        public_bounds,
        k: k.min(pca_dim),
    })
}
