//! The proxy under SIGKILL: killed at random moments of a study with 20 owner
//! processes and restarted on the same port and state database, 20 times. No
//! acknowledged contribution is lost, none is counted twice, the result equals the
//! pooled plaintext scatter exactly (noise-free test mode, so "the same result" is
//! checkable), and a release is served identically across restarts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dpca_common::data::Table;
use dpca_common::linalg::centered_scatter;
use dpca_common::paillier::SecretKey;
use dpca_common::study::{SpecDraft, StudySpec};
use dpca_shell::tls::{write_dev_pki, DevPki, Role, Transport};
use dpca_tests::sim::fetch_raw;
use dpca_tests::{
    bin, describe, optdigits, optdigits_draft, preprocess, spawn_proxy, tls_args, try_spawn_proxy,
    write_slice, Proc,
};
use dpca_user::session::Collected;
use rand::rngs::OsRng;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const OWNERS: usize = 20;
const ROWS_PER_OWNER: usize = 10;
const KILLS: usize = 20;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Kills the proxy with SIGKILL and starts it again on the same address and state.
fn kill_and_restart(proxy: &mut Proc, pki: &dpca_shell::tls::DevPki, state: &Path, addr: &str) {
    proxy.0.kill().expect("SIGKILL the proxy");
    proxy.0.wait().expect("reap the proxy");
    // The port is free once the process is gone; give the kernel a moment if not.
    for attempt in 0.. {
        if let Some((p, got)) = try_spawn_proxy(pki, state, addr, true) {
            assert_eq!(got, addr);
            *proxy = p;
            return;
        }
        assert!(attempt < 50, "proxy did not come back on {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The proxy under test, killed and restarted in place, and the kills so far.
struct Crashing {
    pki: DevPki,
    state: PathBuf,
    proxy: Proc,
    addr: String,
    kills: usize,
}

impl Crashing {
    /// A proxy on a fresh PKI for `owners` and a user, its state in `dir`.
    fn start(dir: &Path, owners: &[String]) -> Self {
        let pki = write_dev_pki(
            &dir.join("pki"),
            &["127.0.0.1".to_string()],
            &["user".to_string()],
            owners,
        )
        .expect("pki");
        let state = dir.join("proxy.redb");
        let (proxy, addr) = spawn_proxy(&pki, &state, "127.0.0.1:0", true);
        Self {
            pki,
            state,
            proxy,
            addr,
            kills: 0,
        }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn kill(&mut self) {
        kill_and_restart(&mut self.proxy, &self.pki, &self.state, &self.addr);
        self.kills += 1;
    }

    /// The owner programs, one per slice in `files`, started on `study`.
    fn start_owners(
        &self,
        names: &[String],
        files: &[PathBuf],
        study: &str,
        sk: &SecretKey,
    ) -> Vec<Child> {
        let url = self.url();
        names
            .iter()
            .zip(files)
            .map(|(name, file)| {
                Command::new(bin("owner"))
                    .args(tls_args(self.pki.files(name).expect("owner files")))
                    .args(["--proxy", &url, "--study", study, "--retry-for", "300"])
                    .args(["--budget-cap", "1,1e-5"])
                    // The study is noise-free (test mode), so its rows can be checked.
                    .args(["--accept-risk", "noise-free"])
                    .arg("--data")
                    .arg(file)
                    .args(["--key-fingerprint", &sk.public().fingerprint()])
                    .args(["--label", "label", "--quiet"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start owner")
            })
            .collect()
    }

    /// Kills at random moments while `owners` encrypt and upload (at most all
    /// but the last four kills: fewer if they finish first), then waits for
    /// them; returns how many were told they were newly counted.
    fn kill_while_uploading(&mut self, mut owners: Vec<Child>) -> usize {
        let mut rng = ChaCha8Rng::seed_from_u64(20);
        let started = Instant::now();
        while self.kills < KILLS - 4 {
            std::thread::sleep(Duration::from_millis(rng.gen_range(20..400)));
            let running = owners
                .iter_mut()
                .map(|o| o.try_wait())
                .filter(|w| matches!(w, Ok(None)))
                .count();
            if running == 0 {
                break;
            }
            self.kill();
        }
        let mut counted = 0;
        for o in owners {
            let out = o.wait_with_output().expect("owner output");
            assert!(out.status.success(), "owner failed: {}", describe(&out));
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report");
            counted += usize::from(report["newly_counted"] == true);
            // A retry after a kill sends the ciphertexts the owner already made.
            assert_eq!(report["encryptions"], 1, "{report}");
        }
        eprintln!(
            "{} kills while {OWNERS} owners uploaded ({:.1} s)",
            self.kills,
            started.elapsed().as_secs_f64()
        );
        counted
    }

    /// The rest of the kills, between the user's steps and across fetches:
    /// the study collected, and its release fetched again after every restart,
    /// each time the same.
    fn collect_through_kills(
        &mut self,
        user: &Transport,
        sk: &SecretKey,
        spec: &StudySpec,
        study: &str,
    ) -> Collected {
        let url = self.url();
        if self.kills < KILLS {
            self.kill();
        }
        let (collected, first) = rt().block_on(async {
            let mut c = dpca_shell::client::connect(&url, user)
                .await
                .expect("connect");
            let opened = dpca_user::session::OpenedStudy {
                noise_free_for_testing: true,
                ..dpca_user::session::OpenedStudy::new(study, spec)
            };
            let collected = dpca_user::session::collect(&mut c, user, sk, opened)
                .await
                .expect("collect after restarts");
            (collected, fetch_raw(&mut c, study).await.expect("fetch"))
        });
        while self.kills < KILLS {
            self.kill();
            let again = rt().block_on(async {
                let mut c = dpca_shell::client::connect(&url, user)
                    .await
                    .expect("connect");
                fetch_raw(&mut c, study).await.expect("fetch after restart")
            });
            assert!(again == first, "the release changed across a restart");
        }
        collected
    }
}

/// The owners' slices of `table`, one file each in `dir`.
fn owner_slices(dir: &Path, names: &[String], table: &Table) -> Vec<PathBuf> {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let path = dir.join(format!("{name}.csv"));
            write_slice(table, i * ROWS_PER_OWNER, ROWS_PER_OWNER, &path);
            path
        })
        .collect()
}

#[test]
fn proxy_killed_twenty_times_loses_nothing_and_counts_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let names: Vec<String> = (1..=OWNERS).map(|i| format!("owner-{i:02}")).collect();
    let mut crashing = Crashing::start(dir.path(), &names);
    let user = Transport::Tls(std::sync::Arc::new(
        crashing
            .pki
            .files("user")
            .expect("user")
            .load(Role::User)
            .expect("user cert"),
    ));
    let table = optdigits();
    let files = owner_slices(dir.path(), &names, &table);
    let n = OWNERS * ROWS_PER_OWNER;
    let sk = SecretKey::generate(2048, &mut OsRng).expect("keygen");
    let spec = SpecDraft {
        min_owners: OWNERS as u32,
        quorum: OWNERS as u32,
        expected_owners: names.clone(),
        ..optdigits_draft(sk.public())
    }
    .validate()
    .expect("the crash study's spec");
    let study = rt().block_on(async {
        let mut c = dpca_shell::client::connect(&crashing.url(), &user)
            .await
            .expect("connect");
        dpca_user::session::open_study(&mut c, &spec, true, &user)
            .await
            .expect("open study")
    });
    let owners = crashing.start_owners(&names, &files, &study, &sk);
    let counted = crashing.kill_while_uploading(owners);
    // An acknowledgement crossed by a kill is retried and answered "already
    // counted": every owner was counted once, whoever was told so.
    assert!(counted <= OWNERS);
    let collected = crashing.collect_through_kills(&user, &sk, &spec, &study);
    assert_eq!(collected.n_rows, n as u64, "rows lost or counted twice");
    assert_eq!(collected.owners_in, names, "owners lost or counted twice");
    assert!(collected.owners_missing.is_empty());
    let (_, q) = preprocess(&table.rows[..n], &spec.bounds, &spec.fixed);
    let exact = centered_scatter(&q);
    let err = (&collected.opened.scatter - &exact).amax();
    assert!(
        err <= 1e-9 * exact.amax(),
        "after {KILLS} kills |S' - S| = {err}"
    );
}
