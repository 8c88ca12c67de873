//! Connections that break between a real owner and a real proxy: a relay on
//! loopback passes the bytes through and cuts a connection where a network would.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};

use dpca_tests::{describe, fixture, submit};

/// Copies `from` to `to` until either side ends or more than `limit` bytes have
/// gone through (at most one read of 16 KiB past it), then closes both ways of
/// both.
fn pipe(mut from: TcpStream, mut to: TcpStream, limit: usize) {
    let mut buf = [0u8; 16 * 1024];
    let mut passed = 0;
    while passed <= limit {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                passed += n;
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// A relay to `to` on a free loopback port. Its first connection is cut once
/// more than `cut_after` bytes have gone from the client to `to`; every later one
/// passes through whole.
fn breaking_relay(to: SocketAddr, cut_after: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
    let at = listener.local_addr().expect("the relay's address");
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().enumerate() {
            let (Ok(client), Ok(server)) = (conn, TcpStream::connect(to)) else {
                continue;
            };
            let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
                continue;
            };
            let limit = if i == 0 { cut_after } else { usize::MAX };
            std::thread::spawn(move || pipe(client, server, limit));
            std::thread::spawn(move || pipe(server2, client2, usize::MAX));
        }
    });
    at
}

/// An upload cut mid-stream is retried with the ciphertexts already made: the
/// owner encrypts its share once, however many attempts it takes. Before, each
/// retry encrypted the share again (5-8 s at M = 1000 and 3072 bits).
#[test]
fn a_broken_upload_is_retried_without_encrypting_again() {
    let f = fixture();
    let proxy: SocketAddr = f
        .url
        .trim_start_matches("https://")
        .parse()
        .expect("the proxy's address");
    // The handshake and the spec's fetch send a few KiB, the upload 47 KiB of
    // ciphertexts (94 at 2048 bits), so the cut falls in the upload (checked
    // below: the relay passes at most one read past `cut`).
    let cut = 8 * 1024;
    let relay = breaking_relay(proxy, cut);
    let data = f.good_file("broken.csv", 40, 0);
    let mut cmd = f.owner_cmd("hospital-a");
    cmd.args(["--owner-id", "hospital-a", "--retry-for", "60"]);
    let out = submit(
        cmd,
        &format!("https://{relay}"),
        &f.study,
        &f.fingerprint,
        &data,
    );
    assert!(out.status.success(), "{}", describe(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report");
    assert!(
        report["bytes"].as_u64() > Some(cut as u64 + 16 * 1024),
        "{report}"
    );
    // The warning of the retry names the upload, not the connection or the fetch.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("proxy refused the contribution"),
        "{stderr}"
    );
    // Two attempts, or a third where the retry came before the proxy had seen
    // the first upload end (it then refuses a second upload of the same owner).
    assert!(report["attempts"].as_u64() >= Some(2), "{report}");
    assert_eq!(report["encryptions"], 1, "{report}");
    assert_eq!(report["newly_counted"], true, "{report}");
    assert_eq!(f.owners_in(), 1);
}
