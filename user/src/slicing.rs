//! Splitting a table among owners: the slices `user local` hands its owner
//! processes and `user split` writes for a simulation.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use dpca_common::data::Table;

/// The name of the `i`-th owner (from 1) of a local run (and of `user dev-certs
/// --owner-count`).
pub fn owner_name(i: usize) -> String {
    format!("owner-{i:02}")
}

/// Where [`split_rows`] writes the slices.
#[derive(Clone, Copy, Debug, Default)]
pub struct SliceLayout {
    /// `DIR/OWNER/rows.csv` (a folder per owner) instead of `DIR/OWNER.csv`.
    pub per_party: bool,
    /// When every slice exists already, keep them and write nothing.
    pub keep_existing: bool,
}

/// The sizes of `owners` contiguous slices of `n` rows, differing by at most one.
pub fn equal_slices(n: usize, owners: usize) -> anyhow::Result<Vec<usize>> {
    if owners == 0 || owners > n {
        bail!("cannot split {n} rows among {owners} owners");
    }
    Ok((0..owners)
        .map(|i| n / owners + usize::from(i < n % owners))
        .collect())
}

/// Writes each owner's slice (contiguous, of the `sizes` given, which add up to the
/// table's rows) with the input's header, label column included; returns the files
/// in owner order.
pub fn split_rows(
    table: &Table,
    sizes: &[usize],
    dir: &Path,
    layout: SliceLayout,
) -> anyhow::Result<Vec<PathBuf>> {
    let n = table.rows.len();
    let total = sizes.iter().try_fold(0usize, |sum, &r| sum.checked_add(r));
    if total != Some(n) || sizes.contains(&0) {
        bail!("cannot split {n} rows into slices of {sizes:?}");
    }
    let paths: Vec<PathBuf> = (1..=sizes.len())
        .map(|i| match layout.per_party {
            true => dir.join(owner_name(i)).join("rows.csv"),
            false => dir.join(format!("{}.csv", owner_name(i))),
        })
        .collect();
    if layout.keep_existing && paths.iter().all(|p| p.exists()) {
        return Ok(paths);
    }
    let mut start = 0;
    for (path, &len) in paths.iter().zip(sizes) {
        let parent = path.parent().unwrap_or(dir);
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let mut w = csv::Writer::from_path(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut header = table.features.clone();
        if let Some((l, _)) = &table.label {
            header.push(l.clone());
        }
        w.write_record(&header)?;
        for r in start..start + len {
            let mut rec: Vec<String> = table.rows[r].iter().map(|x| x.to_string()).collect();
            if let Some((_, cells)) = &table.label {
                rec.push(cells[r].clone());
            }
            w.write_record(&rec)?;
        }
        w.flush()?;
        start += len;
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpca_common::data::read_csv;

    /// Each owner's file holds its own slice: the sizes asked for, in order.
    #[test]
    fn slices_of_the_sizes_given_hold_those_rows_in_order() {
        let csv = "a,b\n1,2\n3,4\n5,6\n7,8\n";
        let table = read_csv(csv.as_bytes(), "t.csv", None).expect("table");
        let dir = tempfile::tempdir().expect("dir");
        let files = split_rows(&table, &[1, 3], dir.path(), SliceLayout::default()).expect("split");
        let read = |p: &PathBuf| std::fs::read_to_string(p).expect("slice");
        assert_eq!(read(&files[0]), "a,b\n1,2\n");
        assert_eq!(read(&files[1]), "a,b\n3,4\n5,6\n7,8\n");
        assert_eq!(equal_slices(10, 3).expect("sizes"), [4, 3, 3]);
        assert!(split_rows(&table, &[1, 2], dir.path(), SliceLayout::default()).is_err());
        assert!(split_rows(&table, &[usize::MAX, 5], dir.path(), SliceLayout::default()).is_err());
    }
}
