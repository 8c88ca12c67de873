//! Accepting connections with caps. Every open connection costs the proxy buffers
//! (HTTP/2 state, read and write buffers), so at most [`MAX_CONNECTIONS`] are
//! served at once; with the upload limit this keeps the proxy's memory flat in the
//! number of owners.
//!
//! On TLS the handshake runs here, before a connection takes one of those slots.
//! A connection first comes through the listener's door ([`crate::door`]), which
//! holds it (a door place) from its accept to the end of its handshake, capped in
//! all ([`ConnectionCaps::door_places`]) and per source
//! ([`crate::sources::MAX_HANDSHAKES_PER_SOURCE`]: an IPv4 address, or an IPv6
//! /64, and once places run short an IPv6 /56 and /48 too: [`crate::sources`]).
//! While a place is free, a connection past a cap of its source's is closed at
//! once, so a client that reconnects without end delays no one from another
//! source (nor, while places run short, from another site). While every place is
//! held, the door accepts nothing and new connections wait in the kernel's listen
//! backlog ([`crate::LISTEN_BACKLOG`]), holding no descriptor or memory of the
//! proxy process: a burst of hundreds of owners is taken in turn rather than
//! turned away to come back later. Then it queues for one of [`MAX_HANDSHAKES`]
//! handshake places, each held for at most the handshake timeout, in the order
//! it came, and is let go if its client closes meanwhile
//! ([`crate::handshake_queue`]). On the main
//! port the door holds [`MAX_QUEUED_HANDSHAKES`] more than those and sorts what it
//! takes in by the lane its ClientHello asks for: a `status` call goes to the
//! status lane's own handshakes on a thread of their own ([`crate::operator`]).
//! Once authenticated, a party (named by its certificate) holds at most
//! [`MAX_CONNECTIONS_PER_PARTY`] connections, and a connection that finds no slot
//! free gives its handshake and door places back and waits on one of
//! [`MAX_WAITING`] places of their own: hundreds of owners queueing for their
//! upload do not fill the places the next party needs to get in.
//!
//! Of the main listener's slots, [`MAIN_RESERVED_CONNECTIONS`] are kept for the
//! parties who steer studies (users and the operator), at most
//! [`MAIN_RESERVED_PER_PARTY`] of them for any one: owners, however many and
//! however many of them collude, share the rest, so they cannot hold every slot
//! idle and lock the user out of sealing and collecting its study, or the
//! operator out of `proxy status`; and at hundreds of owners uploading at once
//! those parties do not wait behind the uploads for a slot. Nor can one user
//! hold every kept slot (four users or the operator and three users can).
//!
//! A listener holds at most its slots, its door places and [`MAX_WAITING`] TLS
//! connections ([`ConnectionCaps::most_held`]): 2368 on the main port, 520 on the
//! operator's and 32 more on the status lane, each a descriptor; the proxy raises
//! its own limit to 4096 where the system lets it (`cli::DESCRIPTORS_NEEDED`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use crate::door::{Arrival, PlaceHeld};
use crate::handshake_queue::{HandshakeQueue, Queued};
use crate::metrics::{connection_refused as refused, ConnectionRefusal};
use crate::per_key::{Held, PerKey};
use crate::sources::{Crowding, Sources};
use dpca_shell::tls::{Peer, Role};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// TLS handshakes at once.
pub const MAX_HANDSHAKES: usize = 256;
/// Connections the main port's door holds past its handshake places: read for
/// their lane and queued for a handshake ([`crate::door`]). As many as the listen
/// backlog, so a burst that fitted there is taken in and sorted. Each holds in the
/// kernel what its client sent (an honest one's ClientHello, a few hundred
/// bytes; a hostile one's up to a TCP window), as it did in the backlog.
pub const MAX_QUEUED_HANDSHAKES: usize = 1024;
/// Authenticated connections waiting for a slot at once, on the main listener.
/// With the door's places and the connections served, it holds at most 64 +
/// 1280 + 1024 TLS connections (and their descriptors). As many as the listen backlog:
/// an owner past them is closed after its handshake and comes back for another,
/// so with 256 places 1000 owners connecting at once made 2.4-2.6 handshakes each
/// and took about a third more of the proxy's CPU (`dpca-bench --bin load`, M = 8).
/// Each waiting connection may hold in the kernel what its client sent after
/// its handshake (up to a TCP window, 64 KiB from an honest owner's HTTP/2):
/// about 64 MiB for all of them, against 16 MiB with 256; a party holds at most
/// [`MAX_CONNECTIONS_PER_PARTY`] of them.
pub const MAX_WAITING: usize = 1024;
/// Connections served at once for one party (one certificate name).
pub const MAX_CONNECTIONS_PER_PARTY: usize = 8;
/// Of the main listener's [`MAX_CONNECTIONS`], those kept for users and the
/// operator.
pub const MAIN_RESERVED_CONNECTIONS: usize = 8;
/// ... and of a user's or the operator's connections, how many may take a kept
/// one: no one of them holds them all.
pub const MAIN_RESERVED_PER_PARTY: usize = 2;

/// A TLS listener's connections, each with its slot, as the server takes them.
pub type TlsConnections = ReceiverStream<std::io::Result<Capped<TlsStream<TcpStream>>>>;

/// An accepted connection holding one of the capped slots until it closes.
pub struct Capped<IO> {
    io: IO,
    _slot: OwnedSemaphorePermit,
    _party: Option<Held<String>>,
    /// A reserved party's claim on the kept slots, while this connection lasts.
    _kept: Option<Held<String>>,
}

impl<IO: Connected> Connected for Capped<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Capped<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Capped<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The listener's plaintext connections, at most `cap` open at once (test only:
/// with no handshake there is nothing to time out before the HTTP/2 preface).
pub fn capped(
    listener: TcpListener,
    cap: usize,
) -> ReceiverStream<std::io::Result<Capped<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(cap.max(1)));
    tokio::spawn(async move {
        loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let (io, _) = crate::door::accept(&listener).await;
            let conn = Capped {
                io,
                _slot: slot,
                _party: None,
                _kept: None,
            };
            if tx.send(Ok(conn)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// What a TLS listener serves: how many connections, how many per party, and
/// which parties at all (by the role and name in their certificate).
#[derive(Clone, Copy)]
pub struct ConnectionCaps {
    /// The listener's name in the metrics (`main`, `operator`).
    pub name: &'static str,
    /// Connections served at once.
    pub connections: usize,
    /// ... of them for one party.
    pub per_party: usize,
    /// Whether a party may hold a connection here at all; others are closed right
    /// after the handshake, before they take a slot.
    pub admits: fn(&Peer) -> bool,
    /// Of the connections, how many are kept for the parties `reserved_for`
    /// names: every other party shares the rest, so no number of them can take
    /// the last slot from a reserved one. At most `connections - 1` are kept
    /// (more is cut), so at least one slot is shared.
    pub reserved: usize,
    /// The parties the reserved slots are kept for.
    pub reserved_for: fn(&Peer) -> bool,
    /// Of one reserved party's connections, how many may hold a kept slot (its
    /// others are served as any party's): one party cannot hold every kept slot.
    pub reserved_per_party: usize,
    /// What a party that is not reserved does when every slot it may take is held.
    pub when_full: WhenFull,
    /// Connections let in at once, from their accept to the end of their
    /// handshake ([`crate::door`]): at least `handshakes`. More on the main port,
    /// whose door reads each one's ClientHello before it queues for a handshake
    /// place, so that a `status` call is not queued behind a burst of owners.
    pub door_places: usize,
    /// TLS handshakes at once ([`MAX_HANDSHAKES`]).
    pub handshakes: usize,
    /// Authenticated connections waiting for a slot at once ([`MAX_WAITING`]).
    pub waiting: usize,
}

/// What a connection that finds every slot it may take held does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// Waits for one (at most the handshake timeout) on a waiting place: the
    /// main listener's owners, whose uploads take their turn.
    Wait,
    /// Is closed at once, holding nothing: the operator listener's users, whose
    /// status call can be made again, and whose waiting would only hold a
    /// connection open on a port kept for operators.
    Close,
}

impl ConnectionCaps {
    /// The most TLS connections (each a descriptor) a listener under these caps
    /// holds at once: served, handshaking and waiting for a slot.
    pub const fn most_held(&self) -> usize {
        let door = if self.door_places > self.handshakes {
            self.door_places
        } else {
            self.handshakes
        };
        self.connections + door + self.waiting
    }

    /// Connections queued for a handshake place at most: the door's places
    /// beyond its handshakes (the queue keeps room for the next in line even
    /// where there are none: [`HandshakeQueue::new`]).
    pub const fn queued(&self) -> usize {
        self.door_places.saturating_sub(self.handshakes)
    }

    /// The main listener's: [`MAX_CONNECTIONS`], [`MAX_CONNECTIONS_PER_PARTY`],
    /// every party the CA certified, [`MAIN_RESERVED_CONNECTIONS`] kept for the
    /// parties who steer studies; owners wait their turn for the rest.
    pub const MAIN: Self = Self {
        name: "main",
        connections: MAX_CONNECTIONS,
        per_party: MAX_CONNECTIONS_PER_PARTY,
        admits: |_| true,
        reserved: MAIN_RESERVED_CONNECTIONS,
        reserved_for: steers_studies,
        reserved_per_party: MAIN_RESERVED_PER_PARTY,
        when_full: WhenFull::Wait,
        door_places: MAX_HANDSHAKES + MAX_QUEUED_HANDSHAKES,
        handshakes: MAX_HANDSHAKES,
        waiting: MAX_WAITING,
    };
}

/// Users and the operator: the parties a study cannot go on without once its
/// owners are in (the user seals and collects it, the operator watches it).
fn steers_studies(p: &Peer) -> bool {
    match p.role {
        Role::User | Role::Proxy => true,
        Role::Owner => false,
    }
}

/// The slots of a TLS listener: those every admitted party shares, and those kept
/// for the reserved parties.
#[derive(Clone)]
struct Slots {
    shared: Arc<Semaphore>,
    kept: Arc<Semaphore>,
    /// What a party that is not reserved does when the shared slots are held.
    when_full: WhenFull,
    /// Places of the connections waiting for a slot.
    waiting: Arc<Semaphore>,
}

impl Slots {
    fn new(caps: &ConnectionCaps) -> Self {
        let reserved = caps.reserved.min(caps.connections.saturating_sub(1));
        Self {
            shared: Arc::new(Semaphore::new((caps.connections - reserved).max(1))),
            kept: Arc::new(Semaphore::new(reserved)),
            when_full: caps.when_full,
            waiting: Arc::new(Semaphore::new(caps.waiting)),
        }
    }

    /// A slot for a party: one free now (for a reserved one a kept one first, so
    /// the shared ones stay for the others), or else one it waits for, at most
    /// `wait`, on a waiting place (a reserved party whichever frees first);
    /// none if the listener closes such parties when full, or no waiting place
    /// is free.
    async fn take(self, reserved: bool, wait: Duration) -> Option<OwnedSemaphorePermit> {
        let kept = reserved.then(|| self.kept.clone().try_acquire_owned().ok());
        let free = kept
            .flatten()
            .or_else(|| self.shared.clone().try_acquire_owned().ok());
        if free.is_some() || (!reserved && self.when_full == WhenFull::Close) {
            return free;
        }
        let _waiting = self.waiting.clone().try_acquire_owned().ok()?;
        let freed = async {
            match reserved {
                true => tokio::select! {
                    biased;
                    kept = self.kept.clone().acquire_owned() => kept.ok(),
                    shared = self.shared.clone().acquire_owned() => shared.ok(),
                },
                false => self.shared.clone().acquire_owned().await.ok(),
            }
        };
        tokio::time::timeout(wait, freed).await.ok().flatten()
    }

    /// Whether `slot` is one of the kept ones.
    fn is_kept(&self, slot: &OwnedSemaphorePermit) -> bool {
        Arc::ptr_eq(slot.semaphore(), &self.kept)
    }
}

/// A TLS listener on the current runtime: its door (no lanes, so no sorting) and
/// its handshakes under `caps`.
pub fn tls_listener(
    listener: TcpListener,
    caps: ConnectionCaps,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
) -> TlsConnections {
    let (main, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let lanes = crate::door::Lanes { main, status: None };
    tokio::spawn(crate::door::open(listener, caps, handshake_timeout, lanes));
    let arrivals = tokio_stream::wrappers::UnboundedReceiverStream::new(arrivals);
    capped_tls(arrivals, caps, acceptor, handshake_timeout)
}

/// The TLS connections of what came through a door ([`crate::door`]), run on the
/// current runtime: handshakes under their caps (in all, and per source as at
/// the door: [`crate::sources`]) and timeout, then the parties `caps` admits, at
/// most its connections in all and per party. Arrivals queue for a handshake
/// place in the order they come; one whose source holds its share of the places
/// when its turn comes is closed.
pub fn capped_tls(
    arrivals: impl Stream<Item = Arrival> + Send + Unpin + 'static,
    caps: ConnectionCaps,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
) -> TlsConnections {
    let handshakes = Places::new(caps.handshakes);
    let queued = caps.queued();
    capped_tls_on(
        arrivals,
        caps,
        handshakes,
        queued,
        acceptor,
        handshake_timeout,
    )
}

/// A listener's places (at its door, or for its handshakes), with how many
/// there are (at least one: with none nothing would ever be let in).
#[derive(Clone)]
pub struct Places {
    free: Arc<Semaphore>,
    all: usize,
}

impl Places {
    /// `n` places.
    pub fn new(n: usize) -> Self {
        let all = n.max(1);
        Self {
            free: Arc::new(Semaphore::new(all)),
            all,
        }
    }

    /// Whether one is free now.
    pub fn any_free(&self) -> bool {
        self.free.available_permits() > 0
    }

    /// One place, when one is free (`None` once they are closed, which they
    /// are not).
    pub(crate) async fn take(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.free).acquire_owned().await.ok()
    }

    /// Whether they run short.
    pub(crate) fn crowding(&self) -> Crowding {
        Crowding::of(self.free.available_permits(), self.all)
    }
}

/// [`capped_tls`] on handshake places the caller holds a handle on (the status
/// lane's, which the main port's door reads: [`crate::door::StatusLane`]), with
/// at most `queued` of `arrivals` taken off it to wait for one
/// ([`crate::handshake_queue`]).
pub fn capped_tls_on(
    mut arrivals: impl Stream<Item = Arrival> + Send + Unpin + 'static,
    caps: ConnectionCaps,
    handshakes: Places,
    queued: usize,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
) -> TlsConnections {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let sources = Sources::default();
    let admission = Admission {
        caps,
        slots: Slots::new(&caps),
        parties: PerKey::default(),
        kept_by_party: PerKey::default(),
        handshake_timeout,
    };
    tokio::spawn(async move {
        let mut queue = HandshakeQueue::new(queued, caps.name);
        loop {
            // Ends with the server (its receiver dropped), or with the door.
            let next = tokio::select! {
                next = queue.next_turn(&handshakes, &mut arrivals) => next,
                () = tx.closed() => return,
            };
            let Some((place, arrival)) = next else {
                return;
            };
            // Its source's share of the handshake places, as of the door's:
            // past it the connection is closed at once (dropped here).
            let Some(source) = sources.take(arrival.peer, handshakes.crowding()) else {
                refused(caps.name, ConnectionRefusal::SourceCap);
                continue;
            };
            let (acceptor, admission, tx) = (acceptor.clone(), admission.clone(), tx.clone());
            tokio::spawn(async move {
                let held = (place, source);
                let Some(tls) = handshake(arrival, &acceptor, &admission, held).await else {
                    return;
                };
                if let Some(conn) = admission.admit(tls).await {
                    let _ = tx.send(Ok(conn)).await;
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The TLS handshake of `arrival` on the current runtime, within the handshake
/// timeout; its place (with its source's count) and what it held at the door
/// are let go when it ends.
async fn handshake(
    arrival: Queued,
    acceptor: &TlsAcceptor,
    admission: &Admission,
    place: PlaceHeld,
) -> Option<TlsStream<TcpStream>> {
    let name = admission.caps.name;
    let accept = acceptor.accept(arrival.io).into_fallible();
    let tls = match tokio::time::timeout(admission.handshake_timeout, accept).await {
        Ok(Ok(tls)) => tls,
        Ok(Err((_, io))) => {
            refused(name, ConnectionRefusal::Handshake);
            close_after_alert(io).await;
            return None;
        }
        Err(_) => {
            refused(name, ConnectionRefusal::HandshakeTimeout);
            return None;
        }
    };
    // Done with the handshake: a party waiting for a slot holds a waiting place
    // instead.
    drop((place, arrival.held));
    Some(tls)
}

/// What an authenticated connection is admitted under: the listener's caps, its
/// slots and what each party holds.
#[derive(Clone)]
struct Admission {
    caps: ConnectionCaps,
    slots: Slots,
    parties: PerKey<String>,
    /// A reserved party's connections that may take a kept slot.
    kept_by_party: PerKey<String>,
    handshake_timeout: Duration,
}

impl Admission {
    /// The connection with its slot, or none (closed) if its party may not hold
    /// one here, holds its share already, or none frees in time.
    async fn admit(self, tls: TlsStream<TcpStream>) -> Option<Capped<TlsStream<TcpStream>>> {
        let listener = self.caps.name;
        let Some(peer) = party_of(&tls).filter(|p| (self.caps.admits)(p)) else {
            refused(listener, ConnectionRefusal::NotAdmitted);
            return None;
        };
        let name = peer.to_string();
        let Some(party) = self.parties.take(name.clone(), self.caps.per_party) else {
            refused(listener, ConnectionRefusal::PartyCap);
            return None;
        };
        let kept = (self.caps.reserved_for)(&peer)
            .then(|| self.kept_by_party.take(name, self.caps.reserved_per_party))
            .flatten();
        // Waiting is bounded by the handshake timeout.
        let slots = self.slots.clone();
        let Some(slot) = slots.take(kept.is_some(), self.handshake_timeout).await else {
            tracing::debug!(party = %peer, "no connection slot free: closed");
            refused(listener, ConnectionRefusal::NoSlot);
            return None;
        };
        Some(Capped {
            io: tls,
            _party: Some(party),
            // The claim goes with a kept slot only: on a shared one the party may
            // still take a kept slot for another connection.
            _kept: kept.filter(|_| self.slots.is_kept(&slot)),
            _slot: slot,
        })
    }
}

/// Closes a connection whose handshake the proxy refused, after the alert that
/// says why. Closing at once, with the client's first bytes unread, would reset
/// the connection; a client that writes before it reads (under TLS 1.3 it sends
/// its first request right after its certificate) would then see a broken pipe,
/// which it retries as an outage, instead of the alert, which it does not. So the
/// write side is shut and what the client sends is read and dropped for a moment,
/// while the connection still holds its handshake place (so this is capped too).
async fn close_after_alert(mut io: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = io.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(ALERT_LINGER, drain).await;
}

/// How long a refused connection is drained after its alert.
const ALERT_LINGER: Duration = Duration::from_secs(1);

/// The party a TLS connection authenticated as (the name its certificate gives).
fn party_of(tls: &TlsStream<TcpStream>) -> Option<Peer> {
    let certs = tls.get_ref().1.peer_certificates()?;
    dpca_shell::tls::peer_of(certs.first()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(connections: usize, reserved: usize, when_full: WhenFull) -> ConnectionCaps {
        ConnectionCaps {
            name: "test",
            connections,
            per_party: connections,
            admits: |_| true,
            reserved,
            reserved_for: |_| false,
            reserved_per_party: connections,
            when_full,
            door_places: MAX_HANDSHAKES,
            handshakes: MAX_HANDSHAKES,
            waiting: MAX_WAITING,
        }
    }

    async fn within(
        slots: &Slots,
        reserved: bool,
        ms: u64,
    ) -> Result<Option<OwnedSemaphorePermit>, tokio::time::error::Elapsed> {
        let take = slots.clone().take(reserved, Duration::from_secs(30));
        tokio::time::timeout(Duration::from_millis(ms), take).await
    }

    /// The answer to a request that must not wait: a slot, or none.
    async fn now(slots: &Slots, reserved: bool) -> Option<OwnedSemaphorePermit> {
        within(slots, reserved, 100).await.expect("at once")
    }

    /// Others take only the shared slots, and are closed at once when those are
    /// held; a reserved party gets a kept slot, then falls back to a shared one.
    #[tokio::test]
    async fn others_never_take_a_kept_slot() {
        let slots = Slots::new(&caps(3, 1, WhenFull::Close));
        let a = now(&slots, false).await.expect("shared");
        let _b = now(&slots, false).await.expect("shared");
        let refused = now(&slots, false).await;
        assert!(refused.is_none(), "another party took the kept slot");
        let _op = now(&slots, true).await.expect("kept");
        assert!(
            within(&slots, true, 100).await.is_err(),
            "a slot beyond the cap"
        );
        drop(a);
        let _op2 = now(&slots, true).await.expect("shared");
    }

    /// A reserved party takes a kept slot while one is free, leaving the shared
    /// ones to the others.
    #[tokio::test]
    async fn a_reserved_party_takes_a_kept_slot_first() {
        let slots = Slots::new(&caps(3, 1, WhenFull::Close));
        let _op = now(&slots, true).await.expect("kept");
        let _a = now(&slots, false).await.expect("shared");
        let b = now(&slots, false).await;
        assert!(b.is_some(), "the reserved party took a shared slot");
    }

    /// Where others wait (the main listener), a reserved party still gets a kept
    /// slot at once while they queue for the shared ones, and a waiting party
    /// takes a shared slot freed, never the kept one.
    #[tokio::test]
    async fn others_queue_for_the_shared_slots_while_a_reserved_party_gets_in() {
        let slots = Slots::new(&caps(2, 1, WhenFull::Wait));
        let held = now(&slots, false).await.expect("shared");
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take(false, Duration::from_secs(30)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "another party took the kept slot");
        let op = now(&slots, true).await.expect("the kept slot, at once");
        drop(op);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiting.is_finished(),
            "the freed kept slot went to another"
        );
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert!(
            matches!(got, Ok(Ok(Some(_)))),
            "the waiting party got no shared slot"
        );
    }

    /// Parties waiting for a slot hold waiting places, not handshake places: past
    /// [`MAX_WAITING`] of them the next is closed at once, while a reserved party
    /// with a kept slot free still gets in.
    #[tokio::test]
    async fn waiting_is_capped_on_places_of_its_own() {
        let slots = Slots::new(&caps(2, 1, WhenFull::Wait));
        let wait = Duration::from_secs(30);
        let _held = slots.clone().take(false, wait).await.expect("shared");
        let queued: Vec<_> = (0..MAX_WAITING)
            .map(|_| tokio::spawn(slots.clone().take(false, wait)))
            .collect();
        let all_waiting = async {
            while slots.waiting.available_permits() > 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), all_waiting)
            .await
            .expect("the queued parties took no waiting places");
        let late =
            tokio::time::timeout(Duration::from_millis(100), slots.clone().take(false, wait));
        assert!(
            matches!(late.await, Ok(None)),
            "a party past the waiting places was not closed at once"
        );
        let op = tokio::time::timeout(Duration::from_millis(100), slots.clone().take(true, wait));
        assert!(matches!(op.await, Ok(Some(_))), "the reserved party waited");
        for q in queued {
            q.abort();
        }
    }

    /// A dev PKI for a proxy at 127.0.0.1 and these owners, and the proxy's
    /// acceptor; the files live as long as the folder.
    fn loopback_pki(owners: &[&str]) -> (tempfile::TempDir, dpca_shell::tls::DevPki, TlsAcceptor) {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let pki =
            dpca_shell::tls::write_dev_pki(dir.path(), &names(&["127.0.0.1"]), &[], &names(owners))
                .expect("PKI");
        let server = pki.proxy.load(Role::Proxy).expect("proxy files");
        let acceptor = TlsAcceptor::from(Arc::new(server.rustls_server_config().expect("config")));
        (dir, pki, acceptor)
    }

    /// A connection waiting for a slot gives its handshake place back: with one
    /// slot and one handshake place, a party queued behind the one served leaves
    /// the place to the next, whose handshake completes (before, it was closed at
    /// accept).
    #[tokio::test]
    async fn a_party_waiting_for_a_slot_holds_no_handshake_place() {
        use dpca_shell::tls::Transport;
        use tokio_stream::StreamExt;
        let (_dir, pki, acceptor) = loopback_pki(&["a", "b", "c"]);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("https://{}", listener.local_addr().expect("address"));
        let caps = ConnectionCaps {
            door_places: 1,
            handshakes: 1,
            ..caps(1, 0, WhenFull::Wait)
        };
        let mut served = tls_listener(listener, caps, acceptor, Duration::from_secs(30));
        let (tx, mut count) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(conn) = served.next().await {
                held.push(conn);
                let _ = tx.send(held.len());
            }
        });
        let connect = |name: &str| {
            let files = pki.files(name).expect("owner files");
            let transport = Transport::Tls(Arc::new(files.load(Role::Owner).expect("load")));
            let url = url.clone();
            async move {
                let attempt = dpca_shell::client::connect(&url, &transport);
                tokio::time::timeout(Duration::from_secs(5), attempt).await
            }
        };
        let _a = connect("a").await.expect("a in time").expect("a served");
        assert_eq!(count.recv().await, Some(1));
        let _b = connect("b").await.expect("b in time").expect("b queued");
        // While b's handshake finishes on the server, c may still find the place
        // held: it retries for 2 s (b, waiting, would hold it for 30 s).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let c = loop {
            let c = connect("c").await.expect("c in time");
            if c.is_ok() || tokio::time::Instant::now() > deadline {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            c.is_ok(),
            "a party queued for a slot held the only handshake place"
        );
        assert!(
            count.try_recv().is_err(),
            "a party beyond the slot was served"
        );
    }

    /// With every handshake place held, a new connection waits to be accepted and
    /// is then served, instead of being closed at once to come back later (before,
    /// it was closed: hundreds of owners connecting in one instant came back
    /// after their retry pauses, and the last of them set the study's pace).
    #[cfg(target_os = "linux")] // any 127/8 source address is bindable
    #[tokio::test]
    async fn a_connection_past_the_handshake_places_waits_for_one() {
        use dpca_shell::tls::Transport;
        use tokio_stream::StreamExt;
        let (_dir, pki, acceptor) = loopback_pki(&["a"]);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let at = listener.local_addr().expect("address");
        let caps = ConnectionCaps {
            door_places: 1,
            handshakes: 1,
            ..caps(4, 0, WhenFull::Wait)
        };
        let mut served = tls_listener(listener, caps, acceptor, Duration::from_secs(30));
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(conn) = served.next().await {
                held.push(conn);
            }
        });
        // A silent client takes the one place (from another address: the
        // per-source cap is not what this test is about).
        let silent = tokio::net::TcpSocket::new_v4().expect("socket");
        silent
            .bind("127.0.0.2:0".parse().expect("source"))
            .expect("bind");
        let silent = silent.connect(at).await.expect("silent connect");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let transport = Transport::Tls(Arc::new(
            pki.files("a")
                .expect("files")
                .load(Role::Owner)
                .expect("load"),
        ));
        let url = format!("https://{at}");
        let owner = tokio::spawn(async move {
            let attempt = dpca_shell::client::connect(&url, &transport);
            tokio::time::timeout(Duration::from_secs(5), attempt).await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !owner.is_finished(),
            "the owner was answered while the place was held"
        );
        drop(silent);
        let owner = owner.await.expect("task").expect("owner in time");
        assert!(
            owner.is_ok(),
            "turned away while the handshake places were held: {:?}",
            owner.err()
        );
    }

    /// The proxy's own listener on every address, IPv4 and IPv6 (`[::]`); none
    /// on a host without IPv6 sockets.
    #[cfg(target_os = "linux")]
    fn dual_stack_listener() -> Option<TcpListener> {
        let any = std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0));
        let socket = crate::listen(any, 64).ok()?;
        // Whatever the host's default (`net.ipv6.bindv6only`).
        let only_v6 = socket2::SockRef::from(&socket).only_v6();
        assert!(matches!(only_v6, Ok(false)), "{only_v6:?}");
        Some(TcpListener::from_std(socket).expect("listener"))
    }

    /// A dual-stack listener sees its IPv4 clients as mapped IPv6 addresses, each
    /// still a source of its own: silent connections from one address fill that
    /// address's handshakes (the next is closed at once), not another's (an owner
    /// from there gets in).
    #[cfg(target_os = "linux")] // any 127/8 source address is bindable
    #[tokio::test]
    async fn ipv4_clients_of_a_dual_stack_listener_are_each_a_source() {
        use dpca_shell::tls::Transport;
        use tokio::io::AsyncReadExt;
        use tokio_stream::StreamExt;
        let (_dir, pki, acceptor) = loopback_pki(&["a"]);
        let Some(listener) = dual_stack_listener() else {
            return eprintln!("skipped: no IPv6 sockets on this host, so no dual-stack listener");
        };
        let at =
            std::net::SocketAddr::from(([127, 0, 0, 1], listener.local_addr().expect("at").port()));
        let served = tls_listener(
            listener,
            caps(4, 0, WhenFull::Wait),
            acceptor,
            Duration::from_secs(30),
        );
        tokio::spawn(served.collect::<Vec<_>>());
        let from = |last: u8| async move {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind((std::net::Ipv4Addr::new(127, 0, 0, last), 0).into())
                .expect("bind");
            socket.connect(at).await.expect("connect")
        };
        let mut silent = Vec::new();
        for _ in 0..crate::sources::MAX_HANDSHAKES_PER_SOURCE {
            silent.push(from(2).await);
        }
        let mut past_cap = from(2).await;
        let read = tokio::time::timeout(Duration::from_secs(2), past_cap.read(&mut [0u8; 1])).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "a connection past its address's cap was not closed at once: {read:?}"
        );
        let transport = Transport::Tls(Arc::new(
            pki.files("a")
                .expect("files")
                .load(Role::Owner)
                .expect("load"),
        ));
        let other = Some(std::net::IpAddr::from([127, 0, 0, 3]));
        let url = format!("https://{at}");
        let attempt = dpca_shell::client::connect_from(&url, &transport, other);
        let owner = tokio::time::timeout(Duration::from_secs(5), attempt).await;
        assert!(
            matches!(owner, Ok(Ok(_))),
            "an owner from another address was refused: {:?}",
            owner.map(|o| o.err())
        );
        drop(silent);
    }

    /// The main listener keeps a burst of connections it has not yet accepted:
    /// 300 connect at once, none accepted, all within half a second. With the
    /// usual backlog of 128 the kernel dropped the rest, whose clients tried
    /// again only a second later. (On a host whose `net.core.somaxconn` is below
    /// 300 this fails, rightly: the proxy there drops such bursts.)
    #[cfg(target_os = "linux")] // any 127/8 source address is bindable
    #[tokio::test]
    async fn a_burst_waits_in_the_listen_backlog() {
        let at = "127.0.0.1:0".parse().expect("address");
        let listener = crate::listen(at, crate::LISTEN_BACKLOG).expect("listen");
        let at = listener.local_addr().expect("address");
        let connects: Vec<_> = (0..300u32)
            .map(|i| {
                tokio::spawn(async move {
                    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                    let source = std::net::Ipv4Addr::new(127, 0, 3, 1 + (i % 250) as u8);
                    socket.bind((source, 0).into()).expect("bind");
                    tokio::time::timeout(Duration::from_millis(500), socket.connect(at))
                        .await
                        .map(|c| c.map(|_| ()))
                })
            })
            .collect();
        let mut late = 0;
        for c in connects {
            if !matches!(c.await.expect("task"), Ok(Ok(()))) {
                late += 1;
            }
        }
        assert_eq!(
            late, 0,
            "{late} of 300 connections were not taken in time (net.core.somaxconn too low?)"
        );
        drop(listener);
    }

    /// Handshakes on `handshakes` (the caps of a listener of 4 connections),
    /// fed by hand: the sender the test queues its arrivals on, and a listener
    /// whose accepts it makes into them ([`arrival`]); what the handshakes serve
    /// is drained. The PKI they run under comes first, to be kept meanwhile.
    async fn fed_by_hand(
        handshakes: Places,
    ) -> (
        (tempfile::TempDir, dpca_shell::tls::DevPki),
        tokio::sync::mpsc::UnboundedSender<Arrival>,
        TcpListener,
    ) {
        let (dir, pki, acceptor) = loopback_pki(&[]);
        let caps = ConnectionCaps {
            handshakes: handshakes.all,
            ..caps(4, 0, WhenFull::Wait)
        };
        let (to_handshake, arrivals) = tokio::sync::mpsc::unbounded_channel();
        let arrivals = tokio_stream::wrappers::UnboundedReceiverStream::new(arrivals);
        let timeout = Duration::from_secs(30);
        let served = capped_tls_on(arrivals, caps, handshakes, caps.queued(), acceptor, timeout);
        tokio::spawn(tokio_stream::StreamExt::collect::<Vec<_>>(served));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        ((dir, pki), to_handshake, listener)
    }

    /// `io`, accepted by the test, as an arrival from `peer` holding one of
    /// `door`'s places.
    fn arrival(io: TcpStream, peer: std::net::IpAddr, door: &Arc<Semaphore>) -> Arrival {
        Arrival {
            io: io.into_std().expect("std"),
            peer,
            held: (
                door.clone().try_acquire_owned().expect("a door place"),
                Vec::new(),
            ),
        }
    }

    /// The handshake places are shared out by source as the door's are: the door
    /// holds more places than there are handshakes, and a site within its share
    /// of the door's could otherwise hold every handshake place. Here 24
    /// connections of one IPv6 /56, each from a /64 of its own, queue for 40
    /// places: while at least half are free, counting the one each takes, they
    /// take them (20), then the /56's cap of 16 applies and the other 4 are
    /// closed at once.
    #[tokio::test]
    async fn a_site_holds_its_share_of_the_handshake_places_whatever_the_door_holds() {
        let (_pki, to_handshake, listener) = fed_by_hand(Places::new(40)).await;
        let at = listener.local_addr().expect("address");
        let door = Arc::new(Semaphore::new(24));
        let mut clients = Vec::new();
        for i in 0..24u128 {
            let client = TcpStream::connect(at).await.expect("connect");
            let (io, _) = listener.accept().await.expect("accept");
            let site: u128 = 0x2001_0db8_0000_0100 << 64;
            let peer = std::net::IpAddr::V6((site | (i << 64) | 1).into());
            to_handshake.send(arrival(io, peer, &door)).expect("queued");
            clients.push(client);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let closed = clients
            .iter()
            .filter(|c| match c.try_read(&mut [0u8; 1]) {
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                Ok(n) => n == 0,
            })
            .count();
        assert_eq!(closed, 4, "closed past the site's share of the handshakes");
    }

    /// A connection queued for a handshake place whose client closes is let go
    /// before its turn, its door place with it, while a live one keeps its turn.
    /// With the one handshake place held by a handshake that stalls, three
    /// clients each send a ClientHello (the door passes a whole first record
    /// on): one closes before it is queued (its close already there when the
    /// queue takes it), one is queued and then resets, one stays. The first two
    /// door places are back within seconds, the third is still held, and once
    /// the place frees the third's handshake begins. Before, a closed one kept
    /// its door place until its turn came.
    #[tokio::test]
    async fn a_client_that_closes_while_queued_lets_its_door_place_go() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let handshakes = Places::new(1);
        let stalled = handshakes.take().await.expect("the one handshake place");
        let (_pki, to_handshake, listener) = fed_by_hand(handshakes).await;
        let at = listener.local_addr().expect("address");
        let door = Arc::new(Semaphore::new(3));
        let mut clients = Vec::new();
        for i in 0..3 {
            let mut client = TcpStream::connect(at).await.expect("connect");
            let (io, _) = listener.accept().await.expect("accept");
            let hello = dpca_shell::testing::client_hello(&[b"h2"]);
            client.write_all(&hello).await.expect("hello");
            if i == 0 {
                drop(client);
                tokio::time::sleep(Duration::from_millis(100)).await;
            } else {
                clients.push(client);
            }
            let peer = std::net::Ipv4Addr::LOCALHOST.into();
            to_handshake.send(arrival(io, peer, &door)).expect("queued");
        }
        let resets = clients.remove(0);
        let _ = socket2::SockRef::from(&resets).set_linger(Some(Duration::ZERO));
        drop(resets);
        let two_back = async {
            while door.available_permits() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let back = tokio::time::timeout(Duration::from_secs(5), two_back).await;
        assert!(
            back.is_ok(),
            "{} of the 2 closed connections kept their door place",
            2 - door.available_permits()
        );
        tokio::time::sleep(crate::handshake_queue::SWEEP * 3).await;
        assert_eq!(
            door.available_permits(),
            2,
            "the live connection was let go before its turn"
        );
        drop(stalled);
        let mut live = clients.remove(0);
        let read = tokio::time::timeout(Duration::from_secs(5), live.read(&mut [0u8; 64])).await;
        assert!(
            matches!(read, Ok(Ok(n)) if n > 0),
            "the live connection's handshake did not begin: {read:?}"
        );
    }

    /// Without a reservation a party waits its turn.
    #[tokio::test]
    async fn without_a_reservation_parties_wait_for_a_slot() {
        let slots = Slots::new(&caps(1, 0, WhenFull::Wait));
        let held = now(&slots, false).await.expect("slot");
        assert!(within(&slots, false, 100).await.is_err(), "did not wait");
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take(false, Duration::from_secs(30)).await.is_some() }
        });
        drop(held);
        assert!(
            waiting.await.expect("task"),
            "the waiting party got no slot"
        );
    }
}
