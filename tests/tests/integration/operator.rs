//! The operator's instruments on a real proxy process: Prometheus metrics count
//! every call by method and status code (refusals included), and logs come out as
//! one JSON object per line when asked.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use dpca_shell::tls::{DevPki, TlsFiles};

use dpca_tests::{
    bin, describe, dev_pki, free_port, optdigits, run, sample, scrape, tls_args, write_slice, Proc,
};

/// A proxy logging JSON lines at `info` and serving metrics on `port`, its state
/// in `dir`; returns it and its URL.
fn start_instrumented_proxy(pki: &DevPki, dir: &Path, port: u16) -> (Proc, String) {
    let mut cmd = instrumented_proxy(Command::new(bin("proxy")), pki, dir, port);
    start(cmd.stderr(Stdio::piped()))
}

/// `cmd` (the proxy program, or a wrapper running it) with the flags of an
/// instrumented proxy: JSON lines at `info`, metrics on `port`, state in `dir`.
fn instrumented_proxy(mut cmd: Command, pki: &DevPki, dir: &Path, port: u16) -> Command {
    cmd.args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
        .arg("--state")
        .arg(dir.join("proxy.redb"))
        .args(tls_args(&pki.proxy))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped());
    cmd
}

/// Starts `cmd` and waits for the proxy's "listening" line; returns it and
/// its URL.
fn start(cmd: &mut Command) -> (Proc, String) {
    let mut proxy = Proc(cmd.spawn().expect("start proxy"));
    let mut line = String::new();
    BufReader::new(proxy.0.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listening line");
    let url = format!(
        "https://{}",
        line.trim().strip_prefix("listening on ").expect("address")
    );
    (proxy, url)
}

/// Calls the metrics must count: an owner asking for a study that does not
/// exist (NOT_FOUND, 5), an owner whose certificate another CA issued (refused in
/// the handshake: a connection the main listener let go), and the operator's
/// status (OK, 0).
fn make_counted_calls(pki: &DevPki, dir: &Path, url: &str) {
    let data = dir.join("a.csv");
    write_slice(&optdigits(), 0, 10, &data);
    let owner_asks = |files: &TlsFiles| {
        run(Command::new(bin("owner"))
            .args(["--proxy", url, "--study", "nope", "--retry-for", "0"])
            .args([
                "--key-fingerprint",
                &"ab".repeat(32),
                "--budget-cap",
                "1,1e-5",
            ])
            .arg("--data")
            .arg(&data)
            .args(["--label", "label", "--quiet"])
            .args(tls_args(files)))
    };
    let out = owner_asks(pki.files("a").expect("owner a"));
    assert!(!out.status.success(), "{}", describe(&out));
    let (foreign, _foreign_dir) = dev_pki();
    let out = owner_asks(&TlsFiles {
        ca: pki.proxy.ca.clone(),
        ..foreign.files("a").expect("foreign owner a").clone()
    });
    assert!(!out.status.success(), "{}", describe(&out));
    let out = run(Command::new(bin("proxy"))
        .args(["status", "--proxy", url])
        .args(tls_args(&pki.operator)));
    assert!(out.status.success(), "{}", describe(&out));
}

/// Stops the proxy and reads its log: every line must be a JSON object.
fn json_log(mut proxy: Proc) -> (String, Vec<serde_json::Value>) {
    let _ = proxy.0.kill();
    let mut log = String::new();
    proxy
        .0
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut log)
        .expect("log");
    let lines = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (log, lines)
}

#[test]
fn metrics_count_refusals_and_logs_are_json_lines() {
    let (pki, dir) = dev_pki();
    let port = free_port();
    let (proxy, url) = start_instrumented_proxy(&pki, dir.path(), port);
    make_counted_calls(&pki, dir.path(), &url);
    let metrics = scrape(port);
    for expected in [
        r#"dpca_rpc_total{rpc="GetStudy",code="5"} 1"#,
        r#"dpca_rpc_total{rpc="Status",code="0"} 1"#,
    ] {
        assert!(metrics.contains(expected), "no `{expected}` in:\n{metrics}");
    }
    // At least once: the client's channel may connect again within the one call.
    let refused = sample(
        &metrics,
        r#"dpca_connections_refused_total{listener="main",reason="handshake"}"#,
    );
    assert!(
        refused.is_some_and(|n| n >= 1.0),
        "the refused handshake is not counted:\n{metrics}"
    );
    assert!(
        !metrics.contains("owner=") && !metrics.contains("\"a\""),
        "owner names are not metric labels:\n{metrics}"
    );
    let (log, lines) = json_log(proxy);
    assert!(
        lines
            .iter()
            .any(|v| v["message"] == "metrics at /metrics" && v["level"] == "INFO"),
        "{log}"
    );
}

/// A state file in a folder that does not exist stops the proxy before it says
/// "listening" (whoever waits for that line would take it for up), naming the
/// flag and the folder.
#[test]
fn a_missing_state_folder_is_refused_before_listening() {
    let (pki, dir) = dev_pki();
    let state = dir.path().join("no-such-folder").join("proxy.redb");
    let out = run(Command::new(bin("proxy"))
        .args(["--listen", "127.0.0.1:0", "--state"])
        .arg(&state)
        .args(tls_args(&pki.proxy)));
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening"),
        "{}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--state") && stderr.contains("does not exist"),
        "{stderr}"
    );
}

/// What the open descriptors of process `pid` are.
#[cfg(target_os = "linux")]
fn descriptors(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the proxy's descriptors")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|target| target.display().to_string())
        .collect()
}

/// Opens `count` connections to `port` at once, each given `patience` to be
/// taken by the kernel, and keeps those that were.
#[cfg(target_os = "linux")]
fn idle_connections(port: u16, count: usize, patience: Duration) -> Vec<tokio::net::TcpStream> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let connects: Vec<_> = (0..count)
            .map(|_| {
                tokio::spawn(tokio::time::timeout(
                    patience,
                    tokio::net::TcpStream::connect(("127.0.0.1", port)),
                ))
            })
            .collect();
        let mut open = Vec::new();
        for c in connects {
            if let Ok(Ok(Ok(stream))) = c.await {
                open.push(stream);
            }
        }
        open
    })
}

/// The audit's probe of the metrics port: a proxy under a limit of 256
/// descriptors, 600 idle connections to its metrics port. The page takes at
/// most its few connections (the rest wait in, or are refused by, the kernel),
/// so the proxy keeps its descriptors, answers `status`, logs next to nothing,
/// and serves the page again once the flood is gone.
#[cfg(target_os = "linux")]
#[test]
fn a_flood_of_idle_connections_to_the_metrics_port_leaves_the_proxy_serving() {
    use dpca_proxy::metrics_page::{HEADER_TIMEOUT, MAX_METRICS_CONNECTIONS};
    let (pki, dir) = dev_pki();
    let port = free_port();
    let mut limited = Command::new("prlimit");
    limited.args(["--nofile=256:256", "--"]).arg(bin("proxy"));
    let log_path = dir.path().join("proxy.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut cmd = instrumented_proxy(limited, &pki, dir.path(), port);
    let (proxy, url) = start(cmd.stderr(log));
    let pid = proxy.0.id();
    std::thread::sleep(Duration::from_secs(1));
    let before = descriptors(pid);
    let flood = idle_connections(port, 600, Duration::from_secs(2));
    // Past the header timeout the first idle ones are closed and others taken.
    std::thread::sleep(HEADER_TIMEOUT + Duration::from_secs(1));
    let held = descriptors(pid);
    assert!(
        held.len() <= before.len() + MAX_METRICS_CONNECTIONS,
        "the proxy holds {held:?}, {before:?} before {} idle connections",
        flood.len()
    );
    let started = std::time::Instant::now();
    let out = run(Command::new(bin("proxy"))
        .args(["status", "--proxy", &url])
        .args(tls_args(&pki.operator)));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "status took {:?}",
        started.elapsed()
    );
    drop(flood);
    std::thread::sleep(Duration::from_millis(500));
    let page = run(Command::new(bin("proxy")).args(["metrics", "--from", &port.to_string()]));
    assert!(page.status.success(), "{}", describe(&page));
    assert!(
        String::from_utf8_lossy(&page.stdout).contains(r#"dpca_rpc_total{rpc="Status",code="0"}"#),
        "{}",
        describe(&page)
    );
    drop(proxy);
    let logged = std::fs::metadata(&log_path).expect("log").len();
    assert!(logged < 1 << 20, "the proxy logged {logged} bytes");
}
