//! The metrics page's own listener (`proxy --metrics-listen ADDR`): HTTP/1.1,
//! `GET /metrics` only, under caps like every other listener's, so a client of
//! it cannot take the proxy's descriptors, a core or its log.
//!
//! - At most [`MAX_METRICS_CONNECTIONS`] connections are open at once; while
//!   they are, the listener accepts nothing, and further connections wait in
//!   the kernel's backlog of [`METRICS_BACKLOG`], holding no descriptor of the
//!   proxy's (past it the kernel refuses them).
//! - A connection has [`HEADER_TIMEOUT`] to send its request's head and
//!   [`CONNECTION_TIMEOUT`] in all, then is closed: one request a connection.
//! - Failed accepts pause and are logged as the other listeners' are
//!   ([`crate::door::accept`]).
//!
//! A bare port binds the loopback address: the page times each release
//! (`dpca_release_seconds`), which is for operators only (docs/PRIVACY.md).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Connections the metrics page serves at once (a scraper needs one).
pub const MAX_METRICS_CONNECTIONS: usize = 4;

/// The metrics listener's backlog: connections past it are refused by the
/// kernel, not held.
pub const METRICS_BACKLOG: i32 = 16;

/// Time a connection has to send its request's head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// Time a connection is kept in all, its answer written included.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the histograms' windows are drained, as the exporter's own
/// listener did.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The most of an answer `proxy metrics` reads (pages are kilobytes).
const MAX_PAGE_BYTES: u64 = 64 << 20;

/// The page's path.
pub const PATH: &str = "/metrics";

/// `--metrics-listen`'s value: `ADDR:PORT`, or a bare `PORT` on the loopback
/// address.
pub fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = value.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    value.parse().map_err(|_| {
        format!("{value:?} is neither a port nor an ADDR:PORT (such as 127.0.0.1:9100)")
    })
}

/// Binds `addr` for the page; call inside the runtime, before the proxy says it
/// listens.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::from_std(crate::listen(addr, METRICS_BACKLOG)?)
}

/// Serves the page of `handle` on `listener` until the runtime ends, and keeps
/// its histograms drained.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_EVERY).await;
            upkeep.run_upkeep();
        }
    });
    let slots = Arc::new(Semaphore::new(MAX_METRICS_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (io, _) = crate::door::accept(&listener).await;
        let handle = handle.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, answer(io, handle)).await;
        });
    }
}

/// One connection: one request read within [`HEADER_TIMEOUT`], one answer.
async fn answer(io: TcpStream, handle: PrometheusHandle) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let page = page(&req, &handle);
        async move { Ok::<_, std::convert::Infallible>(page) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "a metrics connection ended early");
    }
}

/// The answer to `req`: the page, or what is wrong with the request.
fn page(req: &Request<Incoming>, handle: &PrometheusHandle) -> Response<String> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, PATH) => (StatusCode::OK, handle.render()),
        (_, PATH) => (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_owned()),
        _ => (StatusCode::NOT_FOUND, format!("the page is {PATH}\n")),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// What went wrong fetching the page (`proxy metrics`).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No connection, or it broke.
    #[error("cannot read the metrics page at http://{addr}{PATH}: {source}")]
    Io {
        /// The page's address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// No whole answer in time.
    #[error(
        "the metrics page at http://{addr}{PATH} did not answer within {CONNECTION_TIMEOUT:?}"
    )]
    Timeout {
        /// The page's address.
        addr: SocketAddr,
    },
    /// An answer other than the page.
    #[error("the metrics page at http://{addr}{PATH} answered {status:?}")]
    Status {
        /// The page's address.
        addr: SocketAddr,
        /// The answer's first line.
        status: String,
    },
}

/// Reads the page at `addr` (`proxy metrics`: the image has no HTTP client,
/// and in compose the page is on the proxy's loopback only).
pub async fn fetch(addr: SocketAddr) -> Result<String, FetchError> {
    let io = |source| FetchError::Io { addr, source };
    let read = async {
        let mut s = TcpStream::connect(addr).await.map_err(io)?;
        let request = format!("GET {PATH} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).await.map_err(io)?;
        let mut answer = String::new();
        s.take(MAX_PAGE_BYTES)
            .read_to_string(&mut answer)
            .await
            .map_err(io)?;
        Ok(answer)
    };
    let answer = tokio::time::timeout(CONNECTION_TIMEOUT, read)
        .await
        .map_err(|_| FetchError::Timeout { addr })??;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(FetchError::Status {
            addr,
            status: status.to_owned(),
        });
    }
    Ok(body.to_owned())
}
