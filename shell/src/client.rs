//! Connecting to the proxy with the protocol's limits, over mutual TLS unless
//! plaintext was asked for.

use rand::SeedableRng;
use tonic::transport::Channel;

use crate::tls::Transport;
use dpca_proto::convert::MAX_MESSAGE_BYTES;
use dpca_proto::v1::proxy_client::ProxyClient;

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL does not parse or does not fit the transport.
    #[error("invalid proxy URL `{url}`: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// Nothing answered, or the connection broke: worth trying again.
    #[error("cannot connect to proxy at {url}: {reason}")]
    Connect {
        /// The URL given.
        url: String,
        /// Transport message.
        reason: String,
    },
    /// The TLS handshake failed: one side refused the other's certificate. Trying
    /// again changes nothing.
    #[error("cannot connect to proxy at {url}: {reason}")]
    Tls {
        /// The URL given.
        url: String,
        /// Transport message.
        reason: String,
    },
}

impl ConnectError {
    /// Whether connecting again may succeed: the proxy was not reachable, as
    /// opposed to a bad URL or a refused certificate.
    pub fn transient(&self) -> bool {
        match self {
            ConnectError::Connect { .. } => true,
            ConnectError::Url { .. } | ConnectError::Tls { .. } => false,
        }
    }
}

/// Whether a TLS failure is among `e` and its sources: a certificate this side
/// refused, or an alert the other side sent. The TLS layer reports both as an
/// `io::Error` of kind `InvalidData` (on a call the library's own error is kept
/// only as text by the time it reaches here); a connection that broke or was
/// refused has another kind.
pub fn tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    in_chain(e, &|err| {
        err.is::<tokio_rustls::rustls::Error>()
            || err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData)
    })
}

/// Whether `found` holds for `e` or one of its sources, an `io::Error`'s inner
/// error included: where the TLS library's error is kept (connecting), it is
/// inside an `io::Error`, whose own `source` skips it.
fn in_chain(
    e: &(dyn std::error::Error + 'static),
    found: &dyn Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|inner| in_chain(inner, found));
        if found(err) || inner {
            return true;
        }
        next = err.source();
    }
    false
}

/// The error and its sources on one line: tonic's own message alone says only
/// "transport error", the cause (refused, bad certificate) is in the chain.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !msg.contains(&part) {
            msg.push_str(": ");
            msg.push_str(&part);
        }
        source = s.source();
    }
    msg
}

/// A refusal's message. When the call never reached the proxy's handlers the
/// message is only "transport error" and the cause sits in the source chain; with
/// TLS a refused client certificate shows there only as a closed connection, so
/// the message says what to check.
pub fn status_message(status: &tonic::Status) -> String {
    use std::error::Error as _;
    if !matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    ) {
        return status.message().to_string();
    }
    // A status with no transport error under it is the proxy's own answer (or a
    // call that had none in time): no certificate is in question.
    let Some(source) = status.source() else {
        return status.message().to_string();
    };
    let cause = {
        let chain = error_chain(source);
        if chain.starts_with(status.message()) {
            chain
        } else {
            format!("{}: {chain}", status.message())
        }
    };
    format!(
        "{cause} (the connection failed; if the proxy refused this party's certificate, \
         check that the proxy's CA issued it, for this role, and that it is still valid)"
    )
}

/// Whether a failed call may succeed if made again: the proxy could not be reached
/// or the connection broke. A refused certificate (a TLS alert) is not this.
pub fn transient(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    ) && !status.source().is_some_and(tls_failure)
}

/// Runs `attempt` until it succeeds, fails with an error `retry` does not accept,
/// or the next pause would end more than `patience` after the first failure;
/// pauses follow [`Backoff`]. Each retried error is logged. The owner's upload and
/// the user's wait for the seal retry this way while the proxy restarts. Counted
/// from the first failure, not the first attempt: a wait for the seal that ran for
/// an hour and then lost its proxy still gets its patience.
pub async fn with_retries<T, E, F, Fut>(
    patience: std::time::Duration,
    retry: impl Fn(&E) -> bool,
    mut attempt: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut first_failure = None;
    let mut pauses = Backoff::new(rand::rngs::StdRng::from_entropy());
    loop {
        let pause = pauses.next_pause();
        match attempt().await {
            Err(e) if retry(&e) => {
                let since = *first_failure.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() + pause > patience {
                    return Err(e);
                }
                tracing::warn!(error = %e, "proxy unreachable; trying again");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

/// The pauses between attempts: the ceiling doubles from 100 ms to 5 s, and each
/// pause is drawn uniformly from the upper half of its ceiling. Without the draw,
/// the parties a proxy turned away at one moment (hundreds of owners closed when
/// its queue was full, or when it restarted) came back at one moment, every time.
pub struct Backoff<R> {
    ceiling: std::time::Duration,
    rng: R,
}

/// The first ceiling of [`Backoff`].
const FIRST_CEILING: std::time::Duration = std::time::Duration::from_millis(100);
/// The highest ceiling of [`Backoff`].
const MAX_CEILING: std::time::Duration = std::time::Duration::from_secs(5);

impl<R: rand::Rng> Backoff<R> {
    /// Pauses drawn with `rng` (seeded in tests).
    pub fn new(rng: R) -> Self {
        Self {
            ceiling: FIRST_CEILING,
            rng,
        }
    }

    /// The next pause, in [ceiling / 2, ceiling]; the ceiling then doubles, up to
    /// 5 s.
    pub fn next_pause(&mut self) -> std::time::Duration {
        let ceiling = self.ceiling;
        self.ceiling = (ceiling * 2).min(MAX_CEILING);
        ceiling.mul_f64(0.5 + 0.5 * self.rng.gen::<f64>())
    }
}

/// How long a connection may take to come up (TCP, then TLS): a proxy that
/// accepts a connection and never answers counts as unreachable after it, and
/// the attempt is retried as an outage is. Longer than the proxy makes an honest
/// party wait behind a flood: its listen backlog (1024) and the queue at its
/// door (1024) over its handshake places (256), plus one, times its handshake
/// timeout (10 s) and a second's linger for each refused handshake, is 99 s.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// How long a short call (a study's spec, the status) waits for its answer: see
/// [`answered`].
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `call`'s answer, or, if none comes within [`CALL_TIMEOUT`], an `Unavailable`
/// status naming `what`, which callers retry as an outage: a proxy whose
/// connection takes the request and never answers does not hold the caller
/// forever. Only for calls whose answer does not wait on other parties (not an
/// upload, not the wait for a seal).
pub async fn answered<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::unavailable(format!(
                "{what}: no answer from the proxy within {} s",
                CALL_TIMEOUT.as_secs()
            )))
        })
}

/// Connects to the proxy at `url` with the protocol's message size limits: `https`
/// with this party's certificate on TLS, `http` only on the insecure transport.
pub async fn connect(
    url: &str,
    transport: &Transport,
) -> Result<ProxyClient<Channel>, ConnectError> {
    connect_from(url, transport, None).await
}

/// [`connect`] from a chosen local address (`None`: the system's choice). A load
/// test gives each simulated party its own loopback address, as real parties have
/// their own, so the proxy's per-source limits see them apart.
pub async fn connect_from(
    url: &str,
    transport: &Transport,
    local: Option<std::net::IpAddr>,
) -> Result<ProxyClient<Channel>, ConnectError> {
    Ok(client(
        channel(url, transport, local, &[], CONNECT_TIMEOUT).await?,
    ))
}

/// [`connect`] for a `status` call: on TLS the connection offers the status
/// lane's hint ([`crate::tls::lane`]), so the proxy's main port hands it to a
/// lane of its own rather than queueing its handshake behind every owner's.
pub async fn connect_for_status(
    url: &str,
    transport: &Transport,
) -> Result<ProxyClient<Channel>, ConnectError> {
    let lane = [crate::tls::lane::STATUS_LANE_ALPN];
    Ok(client(
        channel(url, transport, None, &lane, CONNECT_TIMEOUT).await?,
    ))
}

/// A channel to the proxy at `url`, connected within `timeout`, from `local`
/// if given. On TLS the handshake is rustls's, run here rather than by tonic:
/// the proxy's certificate is checked against the CA's revocation list too,
/// when the party was given one, and `extra_alpn` is offered after HTTP/2; a
/// server that does not agree on HTTP/2 is refused before anything is sent. The
/// TCP connection is hyper's, as tonic makes it (each of the host's addresses
/// tried in turn within the timeout, IPv6 and IPv4 raced).
pub async fn channel(
    url: &str,
    transport: &Transport,
    local: Option<std::net::IpAddr>,
    extra_alpn: &[&[u8]],
    timeout: std::time::Duration,
) -> Result<Channel, ConnectError> {
    let endpoint = endpoint(url, transport)?.connect_timeout(timeout);
    let Transport::Tls(tls) = transport else {
        let endpoint = endpoint.local_address(local);
        return connected(url, endpoint.connect(), timeout).await;
    };
    let origin = endpoint.uri().clone();
    // An IPv6 host comes bracketed in a URL, and bare in a certificate.
    let host = origin.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| bad_url(url, format!("`{host}` is no host name: {e}")))?;
    let config = tls
        .rustls_client_config(extra_alpn)
        .map_err(|e| bad_url(url, e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.set_local_address(local);
    tcp.set_connect_timeout(Some(timeout));
    // The connector below runs the TLS (to the URL's host, whatever tonic
    // asks); tonic refuses an `https` URL it is not to run TLS for itself, so
    // it is handed the `http` one and told the real origin for its requests.
    let inner = format!("http://{}", &url["https://".len()..]);
    let endpoint = Channel::from_shared(inner)
        .map_err(|e| bad_url(url, e.to_string()))?
        .origin(origin)
        .connect_timeout(timeout);
    let connector = tower::service_fn(move |uri: tonic::codegen::http::Uri| {
        let (tls, name, tcp) = (tls.clone(), name.clone(), tcp.clone());
        async move {
            use tower::ServiceExt as _;
            let tcp = tcp.oneshot(uri).await.map_err(std::io::Error::other)?;
            let tls = tls.connect(name, tcp.into_inner()).await?;
            // Sent nothing yet: a server that did not agree on HTTP/2 is no proxy
            // (tonic's own TLS refused it too).
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the server did not agree on HTTP/2 in the TLS handshake (ALPN): \
                     not a proxy",
                ));
            }
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    connected(url, endpoint.connect_with_connector(connector), timeout).await
}

/// The endpoint of `url`, which must fit `transport` (`https` on TLS, `http` on
/// plaintext), not yet connected.
fn endpoint(url: &str, transport: &Transport) -> Result<tonic::transport::Endpoint, ConnectError> {
    let scheme = transport.scheme();
    if !url.starts_with(&format!("{scheme}://")) {
        return Err(bad_url(
            url,
            match transport {
                Transport::Tls(_) => "TLS is on: the URL must start with https://".into(),
                Transport::InsecurePlaintext => {
                    "--insecure-plaintext: the URL must start with http://".into()
                }
            },
        ));
    }
    Channel::from_shared(url.to_string()).map_err(|e| bad_url(url, e.to_string()))
}

fn bad_url(url: &str, reason: String) -> ConnectError {
    ConnectError::Url {
        url: url.to_string(),
        reason,
    }
}

/// A client of the proxy on `channel`, with the protocol's message size limits.
fn client(channel: Channel) -> ProxyClient<Channel> {
    ProxyClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// The channel `connecting` makes, within `timeout` (when the connection breaks
/// later and the channel reconnects, the new connection, TCP and TLS, is held
/// to the endpoint's connect timeout, `timeout` too).
async fn connected(
    url: &str,
    connecting: impl std::future::Future<Output = Result<Channel, tonic::transport::Error>>,
    timeout: std::time::Duration,
) -> Result<Channel, ConnectError> {
    let Ok(connected) = tokio::time::timeout(timeout, connecting).await else {
        return Err(ConnectError::Connect {
            url: url.to_string(),
            reason: format!("no connection within {} s", timeout.as_secs()),
        });
    };
    connected.map_err(|e| {
        let (url, reason) = (url.to_string(), error_chain(&e));
        if tls_failure(&e) {
            ConnectError::Tls { url, reason }
        } else if closed_in_handshake(&e) {
            ConnectError::Connect {
                url,
                reason: format!("{reason}: {CLOSED_IN_HANDSHAKE}"),
            }
        } else if timed_out(&e) {
            // The endpoint's own timeout, which ends a connection a moment before
            // the one above would.
            ConnectError::Connect {
                url,
                reason: format!("no connection within {} s", timeout.as_secs()),
            }
        } else {
            ConnectError::Connect { url, reason }
        }
    })
}

/// What a connection closed by the proxy in the middle of its TLS handshake
/// most likely means, and what to do about it.
pub const CLOSED_IN_HANDSHAKE: &str = "the proxy closed the connection during the TLS \
     handshake: it may be at its cap of connections for this address (or for \
     all), or busy with other handshakes; try again in a moment. An operator's \
     `proxy status` has places of its own on the operator listener (the proxy's \
     --operator-listen address), which no owner can take";

/// Whether the peer closed the connection before the TLS handshake was done
/// (an `io::Error` of kind `UnexpectedEof`, as rustls reports a handshake the
/// other side ended).
fn closed_in_handshake(e: &(dyn std::error::Error + 'static)) -> bool {
    in_chain(e, &|err| {
        err.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof)
    })
}

/// Whether a timeout is among `e` and its sources (an `io::Error` of kind
/// `TimedOut`, as a connect timeout ends a connection with).
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    in_chain(e, &|err| {
        err.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use std::time::Duration;

    /// An attempt that ran longer than the patience and then failed (a wait for
    /// the seal that lost its proxy late) is still tried again: the patience
    /// counts from the first failure. Before, it counted from the first attempt,
    /// and the error was returned at once.
    #[tokio::test]
    async fn the_patience_counts_from_the_first_failure() {
        let patience = Duration::from_millis(400);
        let mut attempts = 0;
        let outcome = with_retries(
            patience,
            |_: &String| true,
            || {
                attempts += 1;
                let first = attempts == 1;
                async move {
                    if first {
                        tokio::time::sleep(patience * 2).await;
                        Err("the proxy went away".to_string())
                    } else {
                        Ok(attempts)
                    }
                }
            },
        )
        .await;
        assert_eq!(outcome, Ok(2));
        // A failure that lasts is still given up on after the patience.
        let started = std::time::Instant::now();
        let outcome: Result<(), String> =
            with_retries(patience, |_| true, || async { Err("down".to_string()) }).await;
        assert_eq!(outcome, Err("down".to_string()));
        assert!(started.elapsed() <= patience + Duration::from_secs(1));
    }

    /// A port that takes the connection and never answers: the TLS handshake
    /// would wait forever (before, it did); the connection gives up in time and
    /// says so, as an outage to retry.
    /// A TLS server of the parties' CA that does not agree on HTTP/2 is no proxy:
    /// the connection is refused after the handshake, before anything is sent,
    /// as a failure not worth retrying.
    #[tokio::test]
    async fn a_server_without_http2_is_refused_before_anything_is_sent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let pki =
            crate::tls::write_dev_pki(dir.path(), &names(&["127.0.0.1"]), &[], &names(&["a"]))
                .expect("PKI");
        let proxy = pki
            .proxy
            .load(crate::tls::Role::Proxy)
            .expect("proxy files");
        let mut config = proxy.rustls_server_config().expect("server config");
        config.alpn_protocols.clear();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let at = listener.local_addr().expect("addr");
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let mut tls = acceptor.accept(tcp).await.expect("handshake");
            let mut got = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut tls, &mut got).await;
            got
        });
        let owner = pki.files("a").expect("files");
        let owner = std::sync::Arc::new(owner.load(crate::tls::Role::Owner).expect("load"));
        let url = format!("https://{at}");
        let transport = Transport::Tls(owner);
        let err = channel(&url, &transport, None, &[], Duration::from_secs(10))
            .await
            .expect_err("a server without HTTP/2 was taken for a proxy");
        assert!(!err.transient(), "{err}");
        assert!(err.to_string().contains("HTTP/2"), "{err}");
        let got = tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("the client closed")
            .expect("server task");
        assert!(
            got.is_empty(),
            "sent {} bytes to a server without HTTP/2",
            got.len()
        );
    }

    /// A server on loopback that hands each connection to `each`, in a task
    /// of its own; its address.
    async fn loopback_server<F, Fut>(each: F) -> std::net::SocketAddr
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let at = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(each(conn));
            }
        });
        at
    }

    /// A proxy that reads a client's hello and closes the connection (as it
    /// does past its per-source cap) is named as such, with what to do, not as
    /// a bare "tls handshake eof".
    #[tokio::test]
    async fn a_connection_closed_in_the_handshake_says_what_may_have_happened() {
        let at = loopback_server(|mut conn| async move {
            let mut hello = [0u8; 512];
            let _ = tokio::io::AsyncReadExt::read(&mut conn, &mut hello).await;
        })
        .await;
        let dir = tempfile::tempdir().expect("tempdir");
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let pki =
            crate::tls::write_dev_pki(dir.path(), &names(&["127.0.0.1"]), &[], &[]).expect("PKI");
        // The operator's certificate (role proxy), as `proxy status` presents it.
        let tls = std::sync::Arc::new(pki.operator.load(crate::tls::Role::Proxy).expect("load"));
        let err = connect(&format!("https://{at}"), &Transport::Tls(tls))
            .await
            .expect_err("a closed handshake");
        let text = err.to_string();
        assert!(
            text.contains("closed the connection during the TLS handshake")
                && text.contains("--operator-listen"),
            "{text}"
        );
        assert!(err.transient(), "worth trying again: {text}");
    }

    #[tokio::test]
    async fn a_connection_to_a_port_that_never_answers_gives_up_in_time() {
        // Each connection held open, never answered.
        let at = loopback_server(|conn| async move {
            let _held = conn;
            std::future::pending::<()>().await;
        })
        .await;
        let dir = tempfile::tempdir().expect("tempdir");
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let pki =
            crate::tls::write_dev_pki(dir.path(), &names(&["127.0.0.1"]), &[], &names(&["a"]))
                .expect("PKI");
        let files = pki.files("a").expect("files");
        let tls = std::sync::Arc::new(files.load(crate::tls::Role::Owner).expect("load"));
        let url = format!("https://{at}");
        let second = Duration::from_secs(1);
        let transport = Transport::Tls(tls);
        let attempt = channel(&url, &transport, None, &[], second);
        let outcome = tokio::time::timeout(Duration::from_secs(20), attempt)
            .await
            .expect("still connecting after 20 s");
        let err = outcome.expect_err("connected to a port that never answers");
        assert!(err.transient(), "{err}");
        assert!(
            err.to_string().contains("no connection within 1 s"),
            "{err}"
        );
    }

    #[test]
    fn pauses_stay_in_the_upper_half_of_a_doubling_ceiling() {
        let mut pauses = Backoff::new(StdRng::seed_from_u64(7));
        let mut ceiling = FIRST_CEILING;
        for _ in 0..12 {
            let pause = pauses.next_pause();
            assert!(
                pause >= ceiling / 2 && pause <= ceiling,
                "{pause:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
            ceiling = (ceiling * 2).min(MAX_CEILING);
        }
    }

    #[test]
    fn parties_turned_away_together_come_back_apart() {
        // 200 owners closed at the same moment: their third attempts, after
        // pauses under ceilings of 100 and 200 ms, spread over 150-300 ms, not
        // onto one instant.
        let mut thirds: Vec<Duration> = (0..200)
            .map(|seed| {
                let mut pauses = Backoff::new(StdRng::seed_from_u64(seed));
                pauses.next_pause() + pauses.next_pause()
            })
            .collect();
        thirds.sort();
        thirds.dedup();
        assert!(
            thirds.len() > 190,
            "only {} distinct retry times",
            thirds.len()
        );
        let spread = thirds[thirds.len() - 1] - thirds[0];
        assert!(
            spread > Duration::from_millis(100),
            "retries within {spread:?}"
        );
    }
}
