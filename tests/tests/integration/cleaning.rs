//! `user clean` on real rows (diamonds): every cleaned vector moves the desired
//! predictor's output by exactly epsilon (checked from the written files, not from
//! what the command reports), labels pass through untouched, the exact null-space
//! variant leaves the prediction alone, and an impossible epsilon names the line.

use std::path::Path;
use std::process::Command;

use dpca_tests::{bin, describe, run, workspace_root};

fn read(path: &Path) -> (Vec<String>, Vec<Vec<f64>>) {
    let mut r = csv::Reader::from_path(path).expect("csv");
    let header = r
        .headers()
        .expect("header")
        .iter()
        .map(String::from)
        .collect();
    let rows = r
        .records()
        .map(|rec| {
            rec.expect("record")
                .iter()
                .map(|c| c.parse::<f64>().expect("number"))
                .collect()
        })
        .collect();
    (header, rows)
}

fn write(path: &Path, header: &[String], rows: &[Vec<f64>]) {
    let mut w = csv::Writer::from_path(path).expect("create");
    w.write_record(header).expect("header");
    for r in rows {
        w.write_record(r.iter().map(|v| v.to_string()))
            .expect("row");
    }
    w.flush().expect("flush");
}

/// Diamonds' first 3000 rows to train on and the next 100 to clean, with a
/// desired predictor that reads carat + 0.5 depth.
struct Cleaning {
    dir: tempfile::TempDir,
    header: Vec<String>,
    rows: Vec<Vec<f64>>,
}

impl Cleaning {
    fn new() -> Self {
        let (header, rows) = read(&workspace_root().join("data/diamonds.csv"));
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Self { dir, header, rows };
        write(&c.path("train.csv"), &c.header, &c.rows[..3000]);
        write(&c.path("vectors.csv"), &c.header, c.vectors());
        std::fs::write(
            c.path("predictor.csv"),
            "feature,value\ncarat,1\ndepth,0.5\ntable,0\nx,0\ny,0\nz,0\n",
        )
        .expect("predictor");
        c
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// The vectors to clean, as written.
    fn vectors(&self) -> &[Vec<f64>] {
        &self.rows[3000..3100]
    }

    /// `user clean` with `extra` into `out`.
    fn clean(&self, extra: &[&str], out: &str) -> std::process::Output {
        let mut cmd = Command::new(bin("user"));
        cmd.arg("clean")
            .arg("--train")
            .arg(self.path("train.csv"))
            .arg("--vectors")
            .arg(self.path("vectors.csv"))
            .arg("--predictor")
            .arg(self.path("predictor.csv"))
            .args(["--desired", "price", "--confidential", "cut,color,clarity"])
            .arg("--out")
            .arg(self.path(out))
            .args(extra);
        run(&mut cmd)
    }

    /// The cleaned vectors `out` holds, after checking the run succeeded.
    fn cleaned(&self, o: &std::process::Output, out: &str) -> Vec<Vec<f64>> {
        assert!(o.status.success(), "{}", describe(o));
        let (header, cleaned) = read(&self.path(&format!("{out}/cleaned.csv")));
        assert_eq!(header, self.header);
        assert_eq!(cleaned.len(), self.vectors().len());
        cleaned
    }

    fn col(&self, name: &str) -> usize {
        self.header.iter().position(|h| h == name).expect("column")
    }

    /// The desired predictor's output on `r`.
    fn output(&self, r: &[f64]) -> f64 {
        r[self.col("carat")] + 0.5 * r[self.col("depth")]
    }

    /// The squared move of the desired prediction from each vector to its
    /// cleaned version.
    fn moves(&self, cleaned: &[Vec<f64>]) -> Vec<f64> {
        cleaned
            .iter()
            .zip(self.vectors())
            .map(|(c, x)| (self.output(c) - self.output(x)).powi(2))
            .collect()
    }
}

#[test]
fn cleaned_vectors_move_the_desired_prediction_by_exactly_epsilon() {
    let c = Cleaning::new();
    let cleaned = c.cleaned(&c.clean(&["--epsilon", "1e-6"], "eps"), "eps");
    for (i, moved) in c.moves(&cleaned).into_iter().enumerate() {
        assert!(
            (moved - 1e-6).abs() < 1e-12,
            "vector {i}: e_utility {moved}"
        );
    }
    for (i, (cleaned, x)) in cleaned.iter().zip(c.vectors()).enumerate() {
        for label in ["price", "cut", "color", "clarity"] {
            let col = c.col(label);
            assert_eq!(cleaned[col], x[col], "vector {i}: {label} changed");
        }
    }
    let metrics = std::fs::read_to_string(c.path("eps/metrics.csv")).expect("metrics");
    assert_eq!(metrics.lines().count(), 101);
    let first: Vec<&str> = metrics.lines().nth(1).expect("row").split(',').collect();
    assert_eq!(first[0], "2", "line numbers of the vectors file");
    assert!(first[4] == "true" || first[4] == "false", "{metrics}");
}

#[test]
fn the_exact_null_space_variant_leaves_the_prediction_alone() {
    let c = Cleaning::new();
    let cleaned = c.cleaned(&c.clean(&["--exact-null-space"], "null"), "null");
    assert!(c.moves(&cleaned).iter().all(|m| m.sqrt() < 1e-9));
    let changed = cleaned
        .iter()
        .zip(c.vectors())
        .filter(|(a, x)| a != x)
        .count();
    assert!(
        changed > 90,
        "the null space was removed from {changed} vectors only"
    );
}

/// At 0.01 some vectors sit too close to the mean: refused by line, nothing
/// written; with --at-most they are cleaned completely, below epsilon.
#[test]
fn an_impossible_epsilon_names_the_line_unless_at_most_is_asked() {
    let c = Cleaning::new();
    let o = c.clean(&["--epsilon", "0.01"], "big");
    assert!(!o.status.success(), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("vectors.csv: line ") && err.contains("exceeds"),
        "{err}"
    );
    assert!(err.contains("--at-most"), "{err}");
    assert!(
        !c.path("big/cleaned.csv").exists(),
        "nothing is written on failure"
    );
    let cleaned = c.cleaned(&c.clean(&["--epsilon", "0.01", "--at-most"], "big"), "big");
    let moves = c.moves(&cleaned);
    assert!(moves.iter().all(|m| *m <= 0.01 + 1e-9), "{moves:?}");
    let exact = moves.iter().filter(|m| (*m - 0.01).abs() < 1e-9).count();
    assert!(
        (50..100).contains(&exact),
        "{exact} of 100 at exactly epsilon"
    );
}
