//! A study at a proxy the user does not start: `user study` opens it and writes the
//! invitation, owners started before it exists wait for it, and the study seals at
//! its quorum with the missing owner named; the wait for the seal is not the
//! user's time.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use dpca_tests::{
    bin, describe, optdigits, start_proxy, workspace_root, write_slice, Proc, TestProxy,
};

/// A proxy the user does not start, and a folder holding the table's header (all
/// the user knows), the owners' slices and the invitation they share.
struct Remote {
    proxy: TestProxy,
    dir: tempfile::TempDir,
    header: Vec<String>,
}

impl Remote {
    fn new() -> Self {
        let remote = Self {
            proxy: start_proxy(false),
            dir: tempfile::tempdir().expect("tempdir"),
            header: {
                let mut header = optdigits().features;
                header.push("label".into());
                header
            },
        };
        std::fs::write(remote.path("schema.csv"), remote.header.join(",") + "\n").expect("schema");
        remote
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn invitation(&self) -> PathBuf {
        self.path("invitation.toml")
    }

    /// Owner `name` on the slice `file`, following the invitation.
    fn owner(&self, name: &str, file: &str, retry_for: &str) -> Command {
        let mut cmd = Command::new(bin("owner"));
        cmd.args([
            "--proxy",
            &self.proxy.url,
            "--quiet",
            "--budget-cap",
            "2,1e-5",
        ])
        .arg("--invitation")
        .arg(self.invitation())
        .arg("--data")
        .arg(self.path(file))
        .args(["--label", "label", "--retry-for", retry_for])
        .args(self.proxy.tls_args(name))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        cmd
    }

    /// Owners `a` and `b` on `a.csv` and `b.csv`, started now.
    fn owners_a_b(&self) -> [Proc; 2] {
        [("a", "a.csv"), ("b", "b.csv")].map(|(name, file)| {
            self.owner(name, file, "120")
                .spawn()
                .map(Proc)
                .expect("start owner")
        })
    }

    /// `user study` on the header, writing the invitation and its outputs to
    /// `out`, with optdigits' public bounds and the study's own flags `args` (and
    /// C = 1 unless they choose it).
    fn user(&self, out: &Path, args: &[&str]) -> Command {
        let chooses_c = args
            .iter()
            .any(|a| *a == "--row-norm-quantile" || *a == "--row-norm-bound");
        let c: &[&str] = if chooses_c {
            &[]
        } else {
            &["--row-norm-bound", "1"]
        };
        let mut user = self.user_choosing_bounds(out, &[c, args].concat());
        user.arg("--bounds")
            .arg(workspace_root().join("data/optdigits.bounds.csv"));
        user
    }

    /// `user study` as a first try: no bounds file, so they are chosen privately,
    /// and only the study's own flags `args`.
    fn user_choosing_bounds(&self, out: &Path, args: &[&str]) -> Command {
        let mut user = Command::new(bin("user"));
        user.arg("study")
            .args(["--proxy", &self.proxy.url])
            .arg("--schema")
            .arg(self.path("schema.csv"))
            .args(["--label", "label"])
            .args(args)
            .arg("--invitation")
            .arg(self.invitation())
            .arg("--out")
            .arg(out)
            .args(self.proxy.tls_args("user"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        user
    }

    /// `study.json` in the output folder `out`.
    fn study_json(&self, out: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(self.path(out).join("study.json")).expect("study.json");
        serde_json::from_str(&text).expect("study.json parses")
    }
}

/// What every study of these tests asks, beside its owners and its own flags:
/// a small 2048-bit study that runs in seconds.
const SMALL_STUDY: [&str; 8] = [
    "--max-rows",
    "1024",
    "--k",
    "3",
    "--key-bits",
    "2048",
    "--delta",
    "1e-6",
];

/// `flags` and [`SMALL_STUDY`]'s.
fn small_study<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    [flags, &SMALL_STUDY[..]].concat()
}

/// An owner's run ended counted, every row of its slice clipped (at C = 1 every
/// optdigits row is longer than the bound), and it was told so.
fn assert_counted_with_every_row_clipped(owner: Proc) {
    let out = take_output(owner);
    assert!(out.status.success(), "owner: {}", describe(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("owner report");
    assert_eq!(report["newly_counted"], true, "{report}");
    let rows = report["rows"].as_u64().expect("rows");
    assert_eq!(report["clipped_rows"], rows, "{report}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("WARNING: all {rows} rows were longer")),
        "{stderr}"
    );
}

/// The first study's outputs: sealed at its quorum with the missing owner named,
/// announced in the invitation, its components and synthetic rows written.
fn assert_first_study_written(r: &Remote) -> serde_json::Value {
    let study = r.study_json("out");
    assert_eq!(study["n_rows"], 700, "{study}");
    assert_eq!(study["n_owners"], 2);
    assert_eq!(study["owners_missing"], serde_json::json!(["hospital-a"]));
    let inv = std::fs::read_to_string(r.invitation()).expect("invitation");
    assert!(
        inv.contains(study["study_id"].as_str().expect("study id")),
        "{inv}"
    );
    assert!(inv.contains(study["key_fingerprint"].as_str().expect("fingerprint")));
    let components = std::fs::read_to_string(r.path("out/components.csv")).expect("components");
    assert_eq!(
        components.lines().next(),
        Some("feature,PC1,PC2,PC3"),
        "{components}"
    );
    let synthetic = std::fs::read_to_string(r.path("out/synthetic.csv")).expect("synthetic");
    assert_eq!(synthetic.lines().next(), Some(r.header.join(",").as_str()));
    assert_eq!(synthetic.lines().count(), 51);
    study
}

#[test]
fn user_study_invites_owners_who_wait_for_the_invitation() {
    let r = Remote::new();
    let table = optdigits();
    write_slice(&table, 0, 300, &r.path("a.csv"));
    write_slice(&table, 300, 400, &r.path("b.csv"));
    // A stale invitation must not send the owners to another study.
    std::fs::write(
        r.invitation(),
        format!(
            "study = \"old\"\nkey-fingerprint = \"{}\"\n",
            "0".repeat(64)
        ),
    )
    .expect("stale invitation");
    let user_cmd = |out: &str| {
        r.user(
            &r.path(out),
            &small_study(&[
                "--owners",
                "a,b,hospital-a",
                "--quorum",
                "2",
                "--centering",
                "dp-mean",
                "--synthetic",
                "50",
                "--task",
                "cluster",
            ]),
        )
    };
    let user = Proc(user_cmd("out").spawn().expect("start user"));
    r.owners_a_b()
        .into_iter()
        .for_each(assert_counted_with_every_row_clipped);
    let out = take_output(user);
    assert!(out.status.success(), "user: {}", describe(&out));
    let study = assert_first_study_written(&r);

    // The owner who came late finds the study sealed (after waiting a little for
    // a newer invitation), and is told so.
    let out = r
        .owner("hospital-a", "a.csv", "2")
        .output()
        .expect("late owner");
    assert!(!out.status.success(), "late owner: {}", describe(&out));

    // A second study on the same invitation file, as a rerun of a deployment
    // does: owners started before the user rewrites it find the first study
    // sealed (and themselves counted in it) and wait for the new one, rather
    // than answering "already counted" and leaving the new study without them.
    let owners = r.owners_a_b();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let user = Proc(user_cmd("out2").spawn().expect("start the second user"));
    owners
        .into_iter()
        .for_each(assert_counted_with_every_row_clipped);
    let out = take_output(user);
    assert!(out.status.success(), "second user: {}", describe(&out));
    let second = r.study_json("out2");
    assert_eq!(second["n_owners"], 2, "{second}");
    assert_ne!(second["study_id"], study["study_id"]);
}

/// `user study --row-norm-quantile`: a row-norm histogram study chooses C, then
/// the study runs with it, both at a proxy the user does not start; the invited
/// owners, each started once, take part in both.
#[test]
fn a_remote_study_chooses_its_row_norm_bound_privately() {
    let r = Remote::new();
    let table = optdigits();
    write_slice(&table, 0, 300, &r.path("a.csv"));
    write_slice(&table, 300, 600, &r.path("b.csv"));
    let owners = r.owners_a_b();
    let args = small_study(&["--owners", "a,b", "--row-norm-quantile", "0.9"]);
    let user = Proc(r.user(&r.path("out"), &args).spawn().expect("start user"));
    let reports: Vec<serde_json::Value> = owners
        .into_iter()
        .map(|o| {
            let out = take_output(o);
            assert!(out.status.success(), "owner: {}", describe(&out));
            serde_json::from_slice(&out.stdout).expect("owner report")
        })
        .collect();
    let out = take_output(user);
    assert!(out.status.success(), "user: {}", describe(&out));
    let study = r.study_json("out");
    assert_eq!(study["n_owners"], 2, "{study}");
    let chosen = study["row_norm_choice"]["chosen"]
        .as_f64()
        .expect("C chosen");
    assert!(
        chosen > 1.0,
        "C = {chosen}: optdigits rows are longer than 1"
    );
    assert!((study["budget"]["epsilon"].as_f64().expect("budget") - 1.0).abs() < 1e-9);
    // Each owner was counted in the study, and charged for both studies: the
    // proxy adds up their epsilons (basic composition, never less than the
    // user's ledger composes to).
    let study_epsilon = study["epsilon"].as_f64().expect("epsilon");
    for report in reports {
        assert_eq!(report["newly_counted"], true, "{report}");
        let spent = report["budget"]["spent_epsilon"].as_f64().expect("spent");
        assert!(
            spent > study_epsilon + 1e-9,
            "only one study charged: {report}"
        );
    }
}

/// `user study` as a first try, with no bounds file and no C: the invited
/// owners, each started once, take part in the marginal histograms that choose
/// the bounds, the row-norm histogram that chooses C, and the study; study.json
/// composes the three and each owner is charged for all three.
#[test]
fn a_remote_first_try_chooses_bounds_and_c_privately() {
    let r = Remote::new();
    let table = optdigits();
    write_slice(&table, 0, 300, &r.path("a.csv"));
    write_slice(&table, 300, 600, &r.path("b.csv"));
    let owners = r.owners_a_b();
    let args = small_study(&["--owners", "a,b"]);
    let user = Proc(
        r.user_choosing_bounds(&r.path("out"), &args)
            .spawn()
            .expect("start user"),
    );
    let reports: Vec<serde_json::Value> = owners
        .into_iter()
        .map(|o| {
            let out = take_output(o);
            assert!(out.status.success(), "owner: {}", describe(&out));
            serde_json::from_slice(&out.stdout).expect("owner report")
        })
        .collect();
    let out = take_output(user);
    assert!(out.status.success(), "user: {}", describe(&out));
    let study = r.study_json("out");
    assert_eq!(study["n_owners"], 2, "{study}");
    let chosen = study["bounds_choice"]["scaling"]["features"]
        .as_array()
        .expect("the bounds chosen");
    assert_eq!(chosen.len(), 64);
    assert!(study["row_norm_choice"]["chosen"].as_f64().is_some());
    let parts = study["budget"]["parts"].as_array().expect("parts");
    assert_eq!(parts.len(), 5, "{parts:?}");
    assert!((study["budget"]["epsilon"].as_f64().expect("budget") - 1.0).abs() < 1e-9);
    let study_epsilon = study["epsilon"].as_f64().expect("epsilon");
    for report in reports {
        assert_eq!(report["newly_counted"], true, "{report}");
        let spent = report["budget"]["spent_epsilon"].as_f64().expect("spent");
        // Three studies charged, each with a share of the request.
        assert!(
            spent > study_epsilon + 0.3,
            "not every study charged: {report}"
        );
    }
}

/// An output folder that cannot be written is found before the study is opened:
/// nothing is asked of the owners (in the compose quickstart, the owners had spent
/// epsilon 1 of their cap before the user died writing its first output).
#[test]
fn an_output_folder_that_cannot_be_written_stops_the_user_before_the_study_opens() {
    let r = Remote::new();
    // A file where the folder should be: no user, root included, can write in it.
    let out = r.path("taken");
    std::fs::write(&out, "not a folder").expect("file");
    let args = small_study(&["--owners", "a,b", "--quorum", "2"]);
    let run = r.user(&out, &args).output().expect("user");
    assert!(!run.status.success(), "{}", describe(&run));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("output folder") && stderr.contains("--out"),
        "{stderr}"
    );
    let status = dpca_tests::rt().block_on(async {
        let mut c = dpca_shell::client::connect(&r.proxy.url, &r.proxy.transport("user"))
            .await
            .expect("connect");
        c.status(dpca_proto::v1::StatusRequest::default())
            .await
            .expect("status")
            .into_inner()
    });
    assert!(status.studies.is_empty(), "a study was opened: {status:?}");
    assert!(!r.invitation().exists());
}

/// The user's seconds in `study.json` are its own work: owners who come late
/// lengthen the wait for the seal, reported as such (it was counted as the
/// user's time: at a remote proxy, hours of it).
#[test]
fn owners_who_come_late_lengthen_the_seal_not_the_users_seconds() {
    let r = Remote::new();
    let table = optdigits();
    write_slice(&table, 0, 300, &r.path("a.csv"));
    write_slice(&table, 300, 400, &r.path("b.csv"));
    let args = small_study(&["--owners", "a,b", "--quorum", "2", "--centering", "dp-mean"]);
    let user = Proc(r.user(&r.path("out"), &args).spawn().expect("start user"));
    let late = 5.0;
    std::thread::sleep(std::time::Duration::from_secs_f64(late));
    for o in r.owners_a_b() {
        let out = take_output(o);
        assert!(out.status.success(), "owner: {}", describe(&out));
    }
    let out = take_output(user);
    assert!(out.status.success(), "user: {}", describe(&out));
    let seconds = &r.study_json("out")["seconds"];
    let of = |part: &str| seconds[part].as_f64().unwrap_or(f64::NAN);
    // The study was open within a second or two (a 2048-bit key), so most of
    // the owners' lateness is the seal's; the user's own work is well under it.
    assert!(of("user") < late / 2.0, "{seconds}");
    assert!(of("seal") > late / 2.0, "{seconds}");
}

/// Waits for a child and collects its output.
fn take_output(mut p: Proc) -> std::process::Output {
    let child = std::mem::replace(
        &mut p.0,
        Command::new("true").spawn().expect("placeholder process"),
    );
    child.wait_with_output().expect("wait")
}
