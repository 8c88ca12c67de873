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

#[test]
fn cleaned_vectors_move_the_desired_prediction_by_exactly_epsilon() {
    let (header, rows) = read(&workspace_root().join("data/diamonds.csv"));
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |n: &str| dir.path().join(n);
    write(&p("train.csv"), &header, &rows[..3000]);
    write(&p("vectors.csv"), &header, &rows[3000..3100]);
    // The desired predictor reads carat + 0.5 depth.
    std::fs::write(
        p("predictor.csv"),
        "feature,value\ncarat,1\ndepth,0.5\ntable,0\nx,0\ny,0\nz,0\n",
    )
    .expect("predictor");
    let clean = |extra: &[&str], out: &str| {
        let mut cmd = Command::new(bin("user"));
        cmd.arg("clean")
            .arg("--train")
            .arg(p("train.csv"))
            .arg("--vectors")
            .arg(p("vectors.csv"))
            .arg("--predictor")
            .arg(p("predictor.csv"))
            .args(["--desired", "price", "--confidential", "cut,color,clarity"])
            .arg("--out")
            .arg(p(out))
            .args(extra);
        run(&mut cmd)
    };
    let col = |name: &str| header.iter().position(|h| h == name).expect("column");
    let output = |r: &[f64]| r[col("carat")] + 0.5 * r[col("depth")];

    let o = clean(&["--epsilon", "1e-6"], "eps");
    assert!(o.status.success(), "{}", describe(&o));
    let (h, cleaned) = read(&p("eps/cleaned.csv"));
    assert_eq!(h, header);
    assert_eq!(cleaned.len(), 100);
    for (i, (c, x)) in cleaned.iter().zip(&rows[3000..3100]).enumerate() {
        let moved = (output(c) - output(x)).powi(2);
        assert!(
            (moved - 1e-6).abs() < 1e-12,
            "vector {i}: e_utility {moved}"
        );
        for label in ["price", "cut", "color", "clarity"] {
            assert_eq!(c[col(label)], x[col(label)], "vector {i}: {label} changed");
        }
    }
    let metrics = std::fs::read_to_string(p("eps/metrics.csv")).expect("metrics");
    assert_eq!(metrics.lines().count(), 101);
    let first: Vec<&str> = metrics.lines().nth(1).expect("row").split(',').collect();
    assert_eq!(first[0], "2", "line numbers of the vectors file");
    assert!(first[4] == "true" || first[4] == "false", "{metrics}");

    let o = clean(&["--exact-null-space"], "null");
    assert!(o.status.success(), "{}", describe(&o));
    let (_, cleaned) = read(&p("null/cleaned.csv"));
    let mut changed = 0;
    for (c, x) in cleaned.iter().zip(&rows[3000..3100]) {
        assert!((output(c) - output(x)).abs() < 1e-9);
        changed += usize::from(c != x);
    }
    assert!(
        changed > 90,
        "the null space was removed from {changed} vectors only"
    );

    // At 0.01 some vectors sit too close to the mean: refused by line, nothing
    // written; with --at-most they are cleaned completely, below epsilon.
    let o = clean(&["--epsilon", "0.01"], "big");
    assert!(!o.status.success(), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("vectors.csv: line ") && err.contains("exceeds"),
        "{err}"
    );
    assert!(err.contains("--at-most"), "{err}");
    assert!(
        !p("big/cleaned.csv").exists(),
        "nothing is written on failure"
    );
    let o = clean(&["--epsilon", "0.01", "--at-most"], "big");
    assert!(o.status.success(), "{}", describe(&o));
    let (_, cleaned) = read(&p("big/cleaned.csv"));
    let mut exact = 0;
    for (c, x) in cleaned.iter().zip(&rows[3000..3100]) {
        let moved = (output(c) - output(x)).powi(2);
        assert!(moved <= 0.01 + 1e-9, "{moved}");
        exact += usize::from((moved - 0.01).abs() < 1e-9);
    }
    assert!(
        (50..100).contains(&exact),
        "{exact} of 100 at exactly epsilon"
    );
}
