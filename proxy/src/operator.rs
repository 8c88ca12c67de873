//! The operator's threads: `status` only, each on an async runtime of its own,
//! with its own connection slots, served on the operator's listener
//! (`proxy --operator-listen ADDR`) and, on TLS, on the main port's status lane.
//!
//! On the main runtime a `status` call would take its turn with the owners: its
//! TLS handshake waits behind theirs for the runtime's threads and for the
//! handshake places, which a flood of handshakes (anyone who can reach the port,
//! or hundreds of owners connecting in the same instant) fills. Here it shares
//! neither: the operating system gives this thread its share of the cores
//! whatever the main runtime is doing. On the main port a call asks for the lane
//! in its ClientHello ([`dpca_shell::tls::lane`]; `proxy status` does), and the
//! port's door ([`crate::door`], on a thread of its own) sends it to the lane's
//! thread, to its handshakes ([`LANE_CAPS`]: places and slots of their own, so a
//! flood of connections asking for the lane, which anyone may ask, takes no
//! handshake place, slot or thread from the owners or from the operator's
//! listener; while the lane's handshake places are held a call takes its turn on
//! the main lane). The service is the same one
//! (the same studies and the same access rules: the operator sees everything, a
//! user its own studies, an owner nothing); every other method is refused, so
//! neither the lane nor this port adds a way in. A connection here is bounded as
//! on the main port (streams, flow-control windows, keepalive), decodes no
//! request over 1 KiB, and one party holds at most 2 of 8 connections; a party
//! that may not read the status (an owner) is closed right after the handshake.
//! Two slots are kept for operators: users share the other six (and a user's
//! connection that finds them held is closed at once rather than queueing), so
//! user certificates that hold connections here idle cannot lock the operator
//! out. Bind the operator's listener where only operators reach (an admin
//! network, or loopback on a host only operators use): its handshake places,
//! like the main port's and the lane's, are open to anyone who reaches it, and
//! on loopback every client comes from one address, whose 8 places one local
//! process can fill. Over plaintext (tests only) no party is known, so nothing
//! is kept, and the main port has no lane.

use std::time::Duration;

use tokio::sync::oneshot;
use tonic::body::Body as TonicBody;
use tonic::Status;

use crate::access::Method;
use crate::gate::{Passed, Screened, Screening};
use crate::metrics::CountCalls;
use crate::service::ProxyService;

/// Connections the operator listener serves at once.
pub const MAX_OPERATOR_CONNECTIONS: usize = 8;
/// ... and for one party (certificate name): no one party holds them all.
pub const MAX_OPERATOR_CONNECTIONS_PER_PARTY: usize = 2;
/// ... of them kept for operators (certificates of the proxy's role): as many as
/// one operator may hold. Users, who may read their own studies' status here too,
/// share the rest, so however many user certificates reach this port, they cannot
/// lock the operator out.
pub const OPERATOR_RESERVED_CONNECTIONS: usize = MAX_OPERATOR_CONNECTIONS_PER_PARTY;
/// Connections the kernel holds for this listener before it accepts them: it
/// serves a few operators, not a burst of owners.
pub const OPERATOR_LISTEN_BACKLOG: i32 = 64;
/// Authenticated connections waiting here for a slot, as many as before the main
/// listener's [`crate::listener::MAX_WAITING`] grew for bursts of owners: only
/// operators ever wait here (others are closed when the slots they may take are
/// held), so this port needs no more.
pub const OPERATOR_WAITING: usize = 256;

/// The operator listener's caps on its TLS connections.
pub const CAPS: crate::listener::ConnectionCaps = crate::listener::ConnectionCaps {
    name: "operator",
    connections: MAX_OPERATOR_CONNECTIONS,
    per_party: MAX_OPERATOR_CONNECTIONS_PER_PARTY,
    // Only a party that may read the status holds a connection here: an owner's
    // is closed before it takes a slot.
    admits: |p| crate::access::permit(Some(p), crate::access::Action::Status).is_ok(),
    reserved: OPERATOR_RESERVED_CONNECTIONS,
    reserved_for: |p| p.role == dpca_shell::tls::Role::Proxy,
    reserved_per_party: MAX_OPERATOR_CONNECTIONS_PER_PARTY,
    when_full: crate::listener::WhenFull::Close,
    door_places: crate::listener::MAX_HANDSHAKES,
    handshakes: crate::listener::MAX_HANDSHAKES,
    waiting: OPERATOR_WAITING,
};

/// Largest request decoded: a status request is empty.
const MAX_REQUEST_BYTES: usize = crate::limits::SMALL_REQUEST_BYTES;

/// A running operator's thread; dropping it stops it, and returns once the
/// thread has let go of the service (and with it the state file, which a proxy
/// started again in the same process opens anew).
pub struct OperatorListener {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for OperatorListener {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The thread stops at once (its connections are dropped, not drained).
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The main port's status lane, as its thread serves it: the connections the
/// port's door ([`crate::door`]) found asking for it, and the lane's handshake
/// places, which the door reads too.
pub struct StatusLane {
    /// The calls queued for their handshakes.
    arrivals: tokio::sync::mpsc::Receiver<crate::door::Arrival>,
    places: crate::listener::Places,
}

/// A new status lane: the end the main port's door sends to (it reads the lane's
/// places) and the end its thread serves ([`spawn`]), [`LANE_CAPS`]'s handshake
/// places and a queue of [`LANE_QUEUE`] (and one more on its way into it: the
/// queue watches what it holds for a client's close, `handshake_queue`, so it
/// takes calls off the channel at once).
pub fn status_lane() -> (crate::door::StatusLane, StatusLane) {
    let (queue, arrivals) = tokio::sync::mpsc::channel(1);
    let places = crate::listener::Places::new(LANE_CAPS.handshakes);
    let door = crate::door::StatusLane {
        queue,
        places: places.clone(),
    };
    (door, StatusLane { arrivals, places })
}

/// Starts an operator's thread, with its own runtime: `svc`'s `status` on the
/// main port's status lane if given, and on `listener` if given, with mutual TLS
/// through `acceptor` (plaintext without one, as the main listener, and then no
/// lane).
pub fn spawn(
    svc: ProxyService,
    lane: Option<StatusLane>,
    listener: Option<std::net::TcpListener>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    handshake_timeout: Duration,
) -> anyhow::Result<OperatorListener> {
    if let Some(l) = &listener {
        l.set_nonblocking(true)?;
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let front = Front {
        lane,
        listener,
        acceptor,
        handshake_timeout,
    };
    let name = match front.lane {
        Some(_) => "status-lane",
        None => "operator-listener",
    };
    let thread = crate::on_own_thread(name.into(), move || async move {
        let served = tokio::select! {
            served = serve(svc, front) => served,
            _ = stopped => Ok(()),
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "operator listener stopped");
        }
    })?;
    Ok(OperatorListener {
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// What [`spawn`] was given to serve.
struct Front {
    lane: Option<StatusLane>,
    listener: Option<std::net::TcpListener>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    handshake_timeout: Duration,
}

async fn serve(svc: ProxyService, front: Front) -> anyhow::Result<()> {
    // The main listener's bounds on a connection, and a status request (empty)
    // is all that is decoded.
    let server = dpca_proto::v1::proxy_server::ProxyServer::new(svc)
        .max_decoding_message_size(MAX_REQUEST_BYTES);
    let router = crate::hardened_server()
        .layer(tower::layer::layer_fn(CountCalls))
        .layer(tower::layer::layer_fn(|s| Screened::new(s, OnlyStatus)))
        .add_service(server);
    let Some(acceptor) = front.acceptor else {
        let Some(listener) = front.listener else {
            return Ok(());
        };
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let incoming = crate::listener::capped(listener, MAX_OPERATOR_CONNECTIONS);
        router.serve_with_incoming(incoming).await?;
        return Ok(());
    };
    let timeout = front.handshake_timeout;
    let mut incoming = tokio_stream::StreamMap::<&str, crate::listener::TlsConnections>::new();
    if let Some(lane) = front.lane {
        let arrivals = tokio_stream::wrappers::ReceiverStream::new(lane.arrivals);
        let (places, acceptor) = (lane.places, acceptor.clone());
        let lane = crate::listener::capped_tls_on(
            arrivals, LANE_CAPS, places, LANE_QUEUE, acceptor, timeout,
        );
        incoming.insert("lane", lane);
    }
    if let Some(listener) = front.listener {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let own = crate::listener::tls_listener(listener, CAPS, acceptor, timeout);
        incoming.insert("operator", own);
    }
    let incoming = tokio_stream::StreamExt::map(incoming, |(_, conn)| conn);
    router.serve_with_incoming(incoming).await?;
    Ok(())
}

/// Connections the status lane holds queued for its handshakes (and one more on
/// its way in); past them, or while none of its handshake places is free, a
/// call takes its turn on the main lane, as it did before there was a lane.
pub const LANE_QUEUE: usize = 16;

/// The status lane's caps: the operator listener's, on places of its own, so that
/// a flood of connections that ask for the lane on the main port (anyone may ask)
/// takes nothing from the operator's own port, nor from the owners.
pub const LANE_CAPS: crate::listener::ConnectionCaps = crate::listener::ConnectionCaps {
    name: "status_lane",
    door_places: LANE_HANDSHAKES,
    handshakes: LANE_HANDSHAKES,
    waiting: MAX_OPERATOR_CONNECTIONS,
    ..CAPS
};

/// TLS handshakes at once on the status lane.
pub const LANE_HANDSHAKES: usize = 16;

/// Passes `Status` calls on and answers every other path "unimplemented".
#[derive(Clone, Copy, Debug)]
pub struct OnlyStatus;

impl Screening for OnlyStatus {
    fn screen(&self, req: http::Request<TonicBody>) -> Result<Passed, Status> {
        if Method::from_path(req.uri().path()) == Some(Method::Status) {
            return Ok(req.into());
        }
        Err(Status::unimplemented(
            "the operator listener and the status lane answer `status` only; other calls \
             go to the proxy's main listener without asking for the lane",
        ))
    }
}
