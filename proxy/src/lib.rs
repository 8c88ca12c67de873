//! The proxy: a gRPC server holding studies. It aggregates owners' ciphertexts as they
//! arrive, at most [`ProxyConfig::max_concurrent_uploads`] at a time (so memory is
//! bounded by the layout and that limit, not by the number of owners), validates every
//! ciphertext, counts one contribution per owner, and, once the user reveals N, masks v
//! and adds the symmetric noise (the `study` state machine), serving the same release
//! to every fetch.
//!
//! Transport is mutual TLS: every caller is known by its certificate and may only do
//! what its role allows ([`access`]). Every transition is stored in a redb database
//! before it is acknowledged ([`store`]), so a restart loses no acknowledged
//! contribution and serves the same release.

pub mod access;
pub mod cell;
pub mod cli;
pub mod door;
pub mod gate;
pub mod group_commit;
pub mod handshake_queue;
pub mod holder;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod metrics_page;
pub mod operator;
pub(crate) mod per_key;
pub mod refusal;
pub mod release_journal;
pub mod service;
pub mod sources;
pub mod status;
pub mod store;
pub mod study;
pub mod upload_slots;
pub mod world;

use std::net::SocketAddr;

use dpca_shell::tls::Transport;
use tokio::net::TcpListener;

/// Proxy configuration.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Mutual TLS with the proxy's certificate, or (asked for by name) plaintext.
    pub transport: Transport,
    /// The state database (studies survive restarts); `None` keeps them in memory.
    pub state: Option<std::path::PathBuf>,
    /// The release journal ([`release_journal`]), kept with a state database:
    /// `None` puts it beside the database ([`release_journal::beside`]).
    pub release_journal: Option<std::path::PathBuf>,
    /// The name of the journal the state file records, to be replaced by the
    /// journal found, or a new one if there is none (`--new-release-journal`):
    /// once that is done the file records another name, and this no longer
    /// matches it.
    pub replace_release_journal: Option<String>,
    /// Accept studies that ask for a noise-free release. Test-only: a noise-free
    /// release hands the user the exact scatter.
    pub allow_noise_free_for_testing: bool,
    /// Test-only: draw none of the proxy's own noise for any study (and report
    /// none), as a proxy that skips it would; the owners' noise stays.
    pub test_skips_noise: bool,
    /// Contributions read at the same time. Each holds one owner's ciphertexts until
    /// it is complete and counted; a further upload waits a moment
    /// (`upload_slots::PATIENCE`), then is refused and its owner waits its turn in
    /// `ReserveUpload`, holding nothing unread, so memory does not grow with the
    /// number of owners.
    pub max_concurrent_uploads: usize,
    /// What one study may ask of the proxy, and how long a connection may wait.
    pub limits: limits::Limits,
    /// The wall clock deadlines are read on ([`world::SystemClock`] but in tests).
    pub clock: std::sync::Arc<dyn world::Clock>,
    /// The randomness of study ids and releases ([`world::OsEntropy`] but in tests).
    pub entropy: std::sync::Arc<dyn world::Entropy>,
}

/// Default of [`ProxyConfig::max_concurrent_uploads`]: enough to keep every core
/// validating while more streams arrive.
pub const DEFAULT_MAX_CONCURRENT_UPLOADS: usize = 8;

/// How often an idle connection is pinged, and how long the answer may take.
pub(crate) const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Calls open at once on one connection.
const MAX_STREAMS_PER_CONNECTION: u32 = 16;

/// The headers of one call (bytes, as HTTP/2 counts them).
const MAX_HEADER_LIST_BYTES: u32 = 8 * 1024;

/// HTTP/2 flow-control window per stream and per connection (bytes): the
/// protocol's initial 65,535. A connection may send that much before any window
/// update whatever the settings say (the connection's window starts there and
/// only grows), so a smaller setting bounded nothing a hostile client holds, and
/// had the proxy send honest uploads a window update every 8 KiB: with 16 KiB it
/// spent about a tenth more CPU at M = 1000.
const WINDOW_BYTES: u32 = 65_535;

/// Serves the proxy on `listener` until `shutdown` resolves, and `status` alone
/// on `operator` if given ([`operator`]: a thread and runtime of its own).
pub async fn run(
    config: ProxyConfig,
    listener: TcpListener,
    operator: Option<std::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let acceptor = match &config.transport {
        Transport::Tls(tls) => Some(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(
            tls.rustls_server_config()?,
        ))),
        Transport::InsecurePlaintext => None,
    };
    let handshake_timeout = config.limits.handshake_timeout;
    let max_request_bytes = config.limits.max_request_bytes();
    // One gate for every connection: its count of openings in flight is the
    // proxy's.
    let gate = gate::Gate::new(config.limits.clone(), acceptor.is_some());
    let svc = service::ProxyService::new(config)?;
    svc.spawn_deadline_ticker();
    let server = dpca_proto::v1::proxy_server::ProxyServer::new(svc.clone())
        .max_decoding_message_size(max_request_bytes)
        .max_encoding_message_size(dpca_proto::convert::MAX_MESSAGE_BYTES);
    // The gate runs inside the count, so a call it refuses is counted too.
    let router = hardened_server()
        .layer(tower::layer::layer_fn(metrics::CountCalls))
        .layer(tower::layer::layer_fn(move |s| {
            gate::Screened::new(s, gate.clone())
        }))
        .add_service(server);
    let Some(acceptor) = acceptor else {
        // Stopped when this returns.
        let _operator = operator
            .map(|l| operator::spawn(svc, None, Some(l), None, handshake_timeout))
            .transpose()?;
        let incoming = listener::capped(listener, listener::MAX_CONNECTIONS);
        router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        return Ok(());
    };
    let (incoming, door, _threads) =
        tls_incoming(listener, operator, svc, acceptor, handshake_timeout)?;
    let (shutdown, asked) = noted(shutdown);
    let serve = router.serve_with_incoming_shutdown(incoming, shutdown);
    unless_the_door_dies(serve, door, asked).await
}

/// `shutdown`, and a flag set once it has come.
fn noted(
    shutdown: impl std::future::Future<Output = ()>,
) -> (
    impl std::future::Future<Output = ()>,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asked_to_stop = std::sync::Arc::clone(&asked);
    let noted = async move {
        shutdown.await;
        asked_to_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    (noted, asked)
}

/// What `serve` returns, unless the main port's door ends first without the
/// proxy having been `asked` to stop: its thread died, and the proxy then stops
/// with an error at once (the server would wait for every open call first), so
/// that a supervisor restarts it. Asked to stop, the door ends first.
async fn unless_the_door_dies(
    serve: impl std::future::Future<Output = Result<(), tonic::transport::Error>>,
    door: tokio::sync::oneshot::Receiver<()>,
    asked: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    tokio::pin!(serve);
    tokio::select! {
        served = &mut serve => served?,
        _ = door => match asked.load(std::sync::atomic::Ordering::SeqCst) {
            true => serve.await?,
            false => anyhow::bail!("the main port's door stopped: no connection can be accepted"),
        },
    }
    Ok(())
}

/// The main port's TLS connections, with the end of its door's thread and the
/// operator's threads, which serve its status lane (and `operator`'s listener
/// if given) and stop when dropped. The port's door runs on a thread of its own
/// and sends a `status` call that asks for the lane to the lane's thread; every
/// other connection comes back to this runtime for its handshake (client
/// certificates required and checked against the CA), under the listener's
/// caps and timeout, before it takes a slot: a connection without a certificate
/// never reaches the service.
fn tls_incoming(
    listener: TcpListener,
    operator: Option<std::net::TcpListener>,
    svc: service::ProxyService,
    acceptor: tokio_rustls::TlsAcceptor,
    handshake_timeout: std::time::Duration,
) -> anyhow::Result<(
    listener::TlsConnections,
    tokio::sync::oneshot::Receiver<()>,
    Vec<operator::OperatorListener>,
)> {
    let (arrivals, to_handshake) = tokio::sync::mpsc::unbounded_channel();
    let (to_lane, lane) = operator::status_lane();
    let lanes = door::Lanes {
        main: arrivals,
        status: Some(to_lane),
    };
    let caps = listener::ConnectionCaps::MAIN;
    let door = door::spawn(listener.into_std()?, caps, handshake_timeout, lanes)?;
    // The lane and the operator's listener each on a thread of its own: a flood
    // of the lane, which anyone who reaches the main port may ask for, does not
    // take the operator's port's thread.
    let t = handshake_timeout;
    let mut threads = vec![operator::spawn(
        svc.clone(),
        Some(lane),
        None,
        Some(acceptor.clone()),
        t,
    )?];
    if let Some(listener) = operator {
        threads.push(operator::spawn(
            svc,
            None,
            Some(listener),
            Some(acceptor.clone()),
            t,
        )?);
    }
    let to_handshake = tokio_stream::wrappers::UnboundedReceiverStream::new(to_handshake);
    let incoming = listener::capped_tls(to_handshake, caps, acceptor, handshake_timeout);
    Ok((incoming, door, threads))
}

/// Runs the future `work` makes on a current-thread runtime of its own, on a new
/// thread named `name`. The runtime is built on that thread, not the caller's
/// (a runtime dropped on an async task, as one would be if the thread could not
/// start, panics), and dropped there with every task on it before the thread
/// ends: a handle on the service a task held is let go by then.
pub(crate) fn on_own_thread<F>(
    name: String,
    work: impl FnOnce() -> F + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: std::future::Future<Output = ()>,
{
    let thread = name.clone();
    std::thread::Builder::new().name(name).spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        match runtime {
            Ok(runtime) => runtime.block_on(work()),
            Err(e) => tracing::error!(error = %e, %thread, "no runtime for this thread"),
        }
    })
}

/// The HTTP/2 settings of every listener: what one connection may hold of the
/// proxy (streams, buffered bytes) is bounded, and a vanished peer is found.
pub(crate) fn hardened_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        // The protocol's initial windows (see `WINDOW_BYTES`): what a stream
        // left unread parks is bounded by how long it is left so (an upload
        // waiting for a slot: `upload_slots::PATIENCE`), not by the window, since
        // each buffered frame can keep a read buffer far larger than itself.
        .initial_stream_window_size(WINDOW_BYTES)
        .initial_connection_window_size(WINDOW_BYTES)
        // A peer that vanished (no FIN: a cut cable, a killed VM) is found by pings
        // and its connection slot freed (TCP keepalive is set on each accepted
        // socket, `listener::accept`).
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        // Bounds the calls one connection can have waiting on the proxy.
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        // ... and what each keeps of its headers (hyper's default is 16 KiB; a
        // party's calls carry a path, a content type and a timeout).
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_BYTES))
}

/// Binds a listener (port 0 picks a free port) and returns it with its address.
pub async fn bind(addr: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let mut last = None;
    for at in tokio::net::lookup_host(addr).await? {
        match listen(at, LISTEN_BACKLOG) {
            Ok(std) => {
                let listener = TcpListener::from_std(std)?;
                let local = listener.local_addr()?;
                return Ok((listener, local));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| anyhow::anyhow!("`{addr}` names no address"), Into::into))
}

/// Connections the kernel holds for the main listener before it accepts them
/// (capped by the system's `net.core.somaxconn`). The listener accepts no faster
/// than it has handshake places, so a burst of owners past those places waits
/// here, holding no descriptor and no memory of the proxy process; at the usual
/// default of 128 the kernel dropped the last connection attempts of a burst of
/// 400, which came back only a second later. Each one waiting may hold what its
/// client sent before it was accepted (up to a TCP window) in the kernel, hence
/// no more than a burst of hundreds needs.
pub const LISTEN_BACKLOG: i32 = 1024;

/// A listening socket on `addr` holding up to `backlog` connections not yet
/// accepted, non-blocking, as the runtime takes it. An IPv6 address serves IPv4
/// clients too where it can (`[::]`), whatever the host's default
/// (`net.ipv6.bindv6only`), so one `--listen [::]:port` means the same on every
/// host; they arrive as mapped addresses, each still a source of its own
/// ([`sources`]).
pub fn listen(addr: SocketAddr, backlog: i32) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    // A restarted proxy binds its port again while the old connections linger
    // (as the runtime's own bind does; on Windows the option would let another
    // process take the port).
    #[cfg(not(windows))]
    socket.set_reuse_address(true)?;
    // A host with no dual-stack sockets (OpenBSD) refuses the option; the
    // listener then serves IPv6 only, as it would there anyway.
    if addr.is_ipv6() && socket.set_only_v6(false).is_err() {
        tracing::warn!(%addr, "this host has no dual-stack sockets: IPv6 clients only");
    }
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A door whose thread died stops the proxy with an error at once, though
    /// the server would go on (here: forever); a door that ended because the
    /// proxy was asked to stop lets the server finish.
    #[tokio::test]
    async fn a_dead_door_stops_the_proxy_at_once_unless_it_was_asked_to() {
        let forever = std::future::pending::<Result<(), tonic::transport::Error>>();
        let (died, door) = tokio::sync::oneshot::channel::<()>();
        drop(died);
        let asked = Arc::new(AtomicBool::new(false));
        let stopped = unless_the_door_dies(forever, door, asked);
        let stopped = tokio::time::timeout(std::time::Duration::from_secs(5), stopped).await;
        let err = stopped.expect("stopped at once").expect_err("an error");
        assert!(err.to_string().contains("door stopped"), "{err}");
        let (ended, door) = tokio::sync::oneshot::channel::<()>();
        drop(ended);
        let finishing = async { Ok(()) };
        let asked = Arc::new(AtomicBool::new(true));
        let served = unless_the_door_dies(finishing, door, asked).await;
        assert!(served.is_ok(), "{served:?}");
    }
}
