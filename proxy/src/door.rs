//! The door of a TLS listener: connections accepted under the listener's places
//! and per-source caps, then, on the main port, sorted by the lane their
//! ClientHello asks for ([`dpca_shell::tls::lane`]) before any handshake.
//!
//! A connection holds a door place from its accept until its handshake ends,
//! and counts against its source ([`crate::sources`]) as long, as it does
//! against its source's share of the handshake places once it has one
//! ([`crate::listener::capped_tls`]): one site can hold no more of those than
//! before the door held more places than them. While every place
//! is held the door accepts nothing: new connections wait in the kernel's listen
//! backlog ([`crate::LISTEN_BACKLOG`]), holding no descriptor or memory of the
//! proxy process. Past its source's cap a connection is closed at once.
//!
//! On the main port the places are more than its handshake places
//! ([`crate::listener::ConnectionCaps::door_places`]), and a source's share of
//! them is its share of the handshakes, scaled. The door takes in a burst of
//! owners, reads each one's ClientHello without consuming it (a peek, bounded by
//! the handshake timeout), and a `status` call among them goes to the status
//! lane, whose handshakes run on a thread of their own, while the owners queue
//! for the main handshake places in the order they came. Before, the call waited
//! in the backlog behind all of them (up to 746 ms at 1000 owners). A call that
//! finds the lane's handshake places held, or its queue full, takes its turn
//! with the others, as it did before there was a lane. The main port's door runs on a thread of its own
//! ([`spawn`]), so neither a busy main runtime nor the lane's handshakes delay
//! its accepts.

use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::listener::{ConnectionCaps, Places};
use crate::metrics::{connection_refused as refused, ConnectionRefusal};
use crate::per_key::Held;
use crate::sources::{Block, Sources};
use dpca_shell::tls::lane::{hello_lane, Hello, MAX_HELLO_BYTES};

/// A connection through the door, on its way to a handshake: taken off the
/// runtime that accepted it, so that another may run the handshake.
pub struct Arrival {
    /// The connection (non-blocking).
    pub io: std::net::TcpStream,
    /// Where it comes from: its handshake counts against this source too.
    pub peer: std::net::IpAddr,
    /// The door's place and the source's counts, held until the handshake ends.
    pub held: PlaceHeld,
}

/// A place (at a door, or for a handshake) and its connection's count in each
/// block of addresses it comes from, held together.
pub type PlaceHeld = (OwnedSemaphorePermit, Vec<Held<Block>>);

/// Where the door sends what it lets in.
#[derive(Clone)]
pub struct Lanes {
    /// The listener's own handshakes.
    pub main: mpsc::UnboundedSender<Arrival>,
    /// The status lane, if the door sorts: connections whose ClientHello asks
    /// for it, while it has room.
    pub status: Option<StatusLane>,
}

/// The status lane as the door sees it: its queue, and its handshake places.
#[derive(Clone)]
pub struct StatusLane {
    /// Where a call goes for its handshake (on the lane's thread).
    pub queue: mpsc::Sender<Arrival>,
    /// The lane's handshake places, read, not taken, by the door.
    pub places: Places,
}

impl StatusLane {
    /// Queues `arrival` on the lane, or gives it back if the lane has no
    /// handshake place free, no room in its queue, or is gone: a call held up
    /// there (anyone may ask for the lane and stall) takes its turn with every
    /// other connection instead, as it did before there was a lane.
    fn take(&self, arrival: Arrival) -> Option<Arrival> {
        if !self.places.any_free() {
            return Some(arrival);
        }
        self.queue.try_send(arrival).err().map(|e| e.into_inner())
    }
}

/// Starts the door of `listener` (the main port's) on a thread and runtime of its
/// own, so that neither a busy main runtime nor the status lane's handshakes
/// delay its accepts. It stops once the main lane's receiver is dropped; the
/// receiver returned ends (with an error) when its thread has ended, whatever
/// ended it.
pub fn spawn(
    listener: std::net::TcpListener,
    caps: ConnectionCaps,
    handshake_timeout: Duration,
    lanes: Lanes,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    listener.set_nonblocking(true)?;
    let (alive, ended) = tokio::sync::oneshot::channel::<()>();
    crate::on_own_thread(format!("{}-door", caps.name), move || async move {
        // Dropped when this ends, however it ends.
        let _alive = alive;
        match TcpListener::from_std(listener) {
            Ok(listener) => open(listener, caps, handshake_timeout, lanes).await,
            Err(e) => tracing::error!(error = %e, "the door cannot take its listener"),
        }
    })?;
    Ok(ended)
}

/// Accepts connections on `listener` under the door places of `caps` until the
/// main lane's receiver is dropped, and sends each to its lane, on the current
/// runtime.
pub async fn open(
    listener: TcpListener,
    caps: ConnectionCaps,
    handshake_timeout: Duration,
    lanes: Lanes,
) {
    let name = caps.name;
    // With no place the door would never accept.
    let handshakes = caps.handshakes.max(1);
    let all = caps.door_places.max(handshakes);
    let places = Places::new(all);
    // A source's share of the door's places is its share of the handshakes.
    let sources = Sources::scaled(all / handshakes);
    loop {
        let next = tokio::select! {
            next = place_then_accept(&places, &listener) => next,
            () = lanes.main.closed() => return,
        };
        let Some((place, (io, addr))) = next else {
            return;
        };
        // Past its source's cap the connection is closed at once (dropped here).
        let Some(source) = sources.take(addr.ip(), places.crowding()) else {
            refused(name, ConnectionRefusal::SourceCap);
            continue;
        };
        let lanes = lanes.clone();
        let arrival = (io, addr.ip(), (place, source));
        tokio::spawn(sort(name, arrival, handshake_timeout, lanes));
    }
}

/// Sends one connection to its lane: the status lane if it has one and the
/// ClientHello asks for it, else the main one.
async fn sort(
    name: &'static str,
    (io, peer, held): (TcpStream, std::net::IpAddr, PlaceHeld),
    handshake_timeout: Duration,
    lanes: Lanes,
) {
    // The status lane, if there is one and the hello asks for it.
    let lane = match &lanes.status {
        None => None,
        Some(lane) => match tokio::time::timeout(handshake_timeout, read_hello(&io)).await {
            Ok(Ok(Hello::Status)) => Some(lane),
            Ok(Ok(Hello::Other | Hello::Incomplete)) => None,
            // Closed before its hello was whole (or before it said anything).
            Ok(Err(_)) => return refused(name, ConnectionRefusal::Handshake),
            Err(_) => return refused(name, ConnectionRefusal::HandshakeTimeout),
        },
    };
    let Ok(io) = io.into_std() else {
        return refused(name, ConnectionRefusal::Handshake);
    };
    let mut arrival = Arrival { io, peer, held };
    if let Some(lane) = lane {
        match lane.take(arrival) {
            None => return,
            Some(back) => arrival = back,
        }
    }
    // Fails only once the listener has stopped.
    let _ = lanes.main.send(arrival);
}

/// How long the door waits before it first looks again at a ClientHello that
/// came in part; each wait after is twice the last, up to [`HELLO_POLL_MAX`]. A
/// peek cannot wait for more bytes than it saw, and a client that sends part of
/// a hello and stalls should not have the door look every few milliseconds until
/// the handshake timeout (though a look costs little: a hello is parsed only
/// once its first record is whole, `hello_lane`).
const HELLO_POLL: Duration = Duration::from_millis(5);
/// The longest wait between two looks at a ClientHello that came in part.
const HELLO_POLL_MAX: Duration = Duration::from_millis(320);

/// The lane a connection's first bytes ask for, read without consuming them; an
/// error if it closes first. A hello that comes in parts is looked at again
/// until its first record is whole (the caller bounds how long).
async fn read_hello(io: &TcpStream) -> std::io::Result<Hello> {
    // A client's hello is a few hundred bytes; the buffer grows only for more.
    let mut buf = vec![0u8; 2048];
    let mut wait = HELLO_POLL;
    loop {
        let n = io.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        match hello_lane(&buf[..n]) {
            Hello::Incomplete if n == buf.len() => buf.resize((n * 2).min(MAX_HELLO_BYTES), 0),
            Hello::Incomplete => {
                // A client that sent part of a hello and closed would be seen
                // by a peek as the same bytes until the timeout, holding its
                // place: a closed connection costs its client nothing to leave.
                if io.ready(Interest::READABLE).await?.is_read_closed() {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(HELLO_POLL_MAX);
            }
            lane @ (Hello::Status | Hello::Other) => return Ok(lane),
        }
    }
}

/// A door place, then the next connection (`None` once the places are closed,
/// which they are not). While every place is held the door accepts nothing:
/// connections wait in the kernel's backlog ([`crate::LISTEN_BACKLOG`]) instead
/// of being closed and coming back, so hundreds of owners connecting in one
/// instant each connect once.
async fn place_then_accept(
    places: &Places,
    listener: &TcpListener,
) -> Option<(OwnedSemaphorePermit, (TcpStream, std::net::SocketAddr))> {
    let place = places.take().await?;
    Some((place, accept(listener).await))
}

/// The next connection, retrying transient errors (out of descriptors and the
/// like) after a pause that doubles while they last ([`ACCEPT_PAUSES`]), and
/// logging them at most once per [`ACCEPT_LOG_EVERY`] for the whole process,
/// with how many went unlogged: a listener that fails every accept neither spins
/// a core nor fills the disk with its log.
pub(crate) async fn accept(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr) {
    let mut pause = ACCEPT_PAUSES.start;
    loop {
        match listener.accept().await {
            Ok((io, addr)) => {
                // Small frames of many ciphertexts: do not wait to coalesce.
                let _ = io.set_nodelay(true);
                // A peer gone without a FIN is found even while idle.
                let keepalive = socket2::TcpKeepalive::new().with_time(crate::KEEPALIVE_INTERVAL);
                let _ = socket2::SockRef::from(&io).set_tcp_keepalive(&keepalive);
                return (io, addr);
            }
            // A connection that went away before it was taken: the next may
            // be waiting, and a client resetting its connections must not slow
            // the listener down.
            Err(e) if gone_before_accept(&e) => continue,
            Err(e) => {
                let logged = ACCEPT_ERRORS
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .note(Instant::now());
                if let Some(unlogged) = logged {
                    tracing::warn!(error = %e, unlogged, "accept failed");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(ACCEPT_PAUSES.end);
            }
        }
    }
}

/// Whether a failed accept is only the one connection's, gone before it was
/// taken (others pass on their errors this way), rather than the listener's
/// or the process's (out of descriptors, of memory).
fn gone_before_accept(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::Interrupted
    )
}

/// The first and the longest pause after a failed accept.
pub const ACCEPT_PAUSES: std::ops::Range<Duration> =
    Duration::from_millis(50)..Duration::from_secs(1);

/// At most one log line about failed accepts per this long, process-wide.
pub const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

static ACCEPT_ERRORS: std::sync::Mutex<LogEvery> = std::sync::Mutex::new(LogEvery::new());

/// Which of a run of like events to log: the first, then one per
/// [`ACCEPT_LOG_EVERY`], each carrying the count of those left unlogged since
/// the last.
#[derive(Debug)]
pub struct LogEvery {
    last: Option<Instant>,
    unlogged: u64,
}

impl LogEvery {
    /// Nothing logged yet.
    pub const fn new() -> Self {
        Self {
            last: None,
            unlogged: 0,
        }
    }

    /// An event at `now`: `Some(unlogged)` if it is to be logged, with the
    /// count of events left unlogged before it.
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= ACCEPT_LOG_EVERY);
        if !due {
            self.unlogged += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

impl Default for LogEvery {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpca_shell::testing::client_hello;
    use dpca_shell::tls::lane::STATUS_LANE_ALPN;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const SOON: Duration = Duration::from_secs(5);

    /// A run of failed accepts logs its first, then one line per
    /// `ACCEPT_LOG_EVERY`, each counting the lines left out: 10,000 failures a
    /// second for a minute log 6 lines.
    #[test]
    fn failed_accepts_are_logged_once_per_interval_with_the_count_left_out() {
        let start = Instant::now();
        let mut log = LogEvery::new();
        assert_eq!(log.note(start), Some(0));
        assert_eq!(log.note(start + Duration::from_millis(1)), None);
        assert_eq!(log.note(start + ACCEPT_LOG_EVERY), Some(1));
        let mut lines = Vec::new();
        for i in 1..=600_000u32 {
            let now = start + ACCEPT_LOG_EVERY + Duration::from_micros(u64::from(i) * 100);
            lines.extend(log.note(now));
        }
        assert_eq!(lines.len(), 6, "{lines:?}");
        assert_eq!(
            lines.iter().sum::<u64>() + 6,
            600_000,
            "every failure counted"
        );
    }

    /// The lanes' receivers of a door, and its address.
    type Door = (
        mpsc::UnboundedReceiver<Arrival>,
        mpsc::Receiver<Arrival>,
        std::net::SocketAddr,
    );

    /// A sorting door on a loopback port with 8 places and a handshake timeout
    /// of 500 ms.
    async fn sorting_door(status_room: usize, places: Places) -> Door {
        sorting_door_sized(status_room, places, 8, Duration::from_millis(500)).await
    }

    /// A sorting door on a loopback port with `door_places` places and this
    /// handshake timeout.
    async fn sorting_door_sized(
        status_room: usize,
        places: Places,
        door_places: usize,
        handshake_timeout: Duration,
    ) -> Door {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let at = listener.local_addr().expect("address");
        let (main, main_rx) = mpsc::unbounded_channel();
        let (queue, status_rx) = mpsc::channel(status_room);
        let lanes = Lanes {
            main,
            status: Some(StatusLane { queue, places }),
        };
        let caps = ConnectionCaps {
            name: "test",
            door_places,
            handshakes: door_places,
            ..ConnectionCaps::MAIN
        };
        tokio::spawn(open(listener, caps, handshake_timeout, lanes));
        (main_rx, status_rx, at)
    }

    async fn saying(at: std::net::SocketAddr, first: &[u8]) -> TcpStream {
        let mut c = TcpStream::connect(at).await.expect("connect");
        c.write_all(first).await.expect("hello");
        c
    }

    /// What a connection the door let through still has to be read: the door
    /// looked at its hello without taking it.
    fn unread(arrival: &Arrival, len: usize) -> Vec<u8> {
        let mut first = vec![0u8; len];
        arrival.io.set_nonblocking(false).expect("blocking");
        let n = arrival.io.peek(&mut first).expect("peek");
        first.truncate(n);
        first
    }

    #[tokio::test]
    async fn a_hello_asking_for_the_lane_goes_there_and_the_rest_the_usual_way() {
        let (mut main, mut status, at) = sorting_door(4, Places::new(1)).await;
        let hinted = client_hello(&[b"h2", STATUS_LANE_ALPN]);
        let _s = saying(at, &hinted).await;
        let arrival = tokio::time::timeout(SOON, status.recv()).await;
        let arrival = arrival.expect("sorted in time").expect("an arrival");
        assert_eq!(unread(&arrival, hinted.len()), hinted);
        let plain = client_hello(&[b"h2"]);
        let _p = saying(at, &plain).await;
        let arrival = tokio::time::timeout(SOON, main.recv()).await;
        let arrival = arrival.expect("sorted in time").expect("an arrival");
        assert_eq!(unread(&arrival, plain.len()), plain);
        // Bytes that are no hello at all go the usual way, where the handshake
        // refuses them.
        let _j = saying(at, b"GET / HTTP/1.1\r\n\r\n").await;
        let arrival = tokio::time::timeout(SOON, main.recv()).await;
        assert!(matches!(arrival, Ok(Some(_))), "junk was not passed on");
        assert!(status.try_recv().is_err(), "a second arrival on the lane");
    }

    /// A hello that comes in two parts is read whole before the door decides.
    #[tokio::test]
    async fn a_hello_in_parts_is_sorted_once_whole() {
        let (mut main, mut status, at) = sorting_door(4, Places::new(1)).await;
        let hinted = client_hello(&[b"h2", STATUS_LANE_ALPN]);
        let (first, rest) = hinted.split_at(hinted.len() / 2);
        let mut c = saying(at, first).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(main.try_recv().is_err() && status.try_recv().is_err());
        c.write_all(rest).await.expect("the rest");
        let arrival = tokio::time::timeout(SOON, status.recv()).await;
        let arrival = arrival.expect("sorted in time").expect("an arrival");
        assert_eq!(unread(&arrival, hinted.len()), hinted);
    }

    /// A client that sends part of a hello and closes (a FIN, or a reset) is
    /// let go at the door's next look, its place with it, not held until the
    /// handshake timeout: on a door of one place, the next client is sorted.
    #[tokio::test]
    async fn a_hello_cut_short_by_a_close_is_let_go_at_once() {
        let timeout = Duration::from_secs(60);
        let (mut main, mut status, at) = sorting_door_sized(4, Places::new(1), 1, timeout).await;
        let hinted = client_hello(&[b"h2", STATUS_LANE_ALPN]);
        let half = &hinted[..hinted.len() / 2];
        let mut c = saying(at, half).await;
        c.shutdown().await.expect("close its side");
        let read = tokio::time::timeout(SOON, c.read(&mut [0u8; 1])).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "held after its client closed: {read:?}"
        );
        // Then a reset instead of a FIN (lingering zero), and a client whose
        // hello is whole: sorted once the door's one place is free again.
        let reset = saying(at, half).await;
        socket2::SockRef::from(&reset)
            .set_linger(Some(Duration::ZERO))
            .expect("linger");
        drop(reset);
        let plain = client_hello(&[b"h2"]);
        let _next = saying(at, &plain).await;
        let arrival = tokio::time::timeout(SOON, main.recv()).await;
        let arrival = arrival
            .expect("the door's one place was let go")
            .expect("an arrival");
        assert_eq!(unread(&arrival, plain.len()), plain);
        assert!(status.try_recv().is_err());
    }

    /// A call that finds every handshake place of the lane held (anyone may ask
    /// for the lane and stall) takes its turn on the main lane at once, rather
    /// than wait there for one.
    #[tokio::test]
    async fn a_call_finding_the_lanes_places_held_goes_the_usual_way() {
        let places = Places::new(1);
        let _held = places.take().await;
        let (mut main, mut status, at) = sorting_door(4, places).await;
        let hinted = client_hello(&[b"h2", STATUS_LANE_ALPN]);
        let _c = saying(at, &hinted).await;
        let arrival = tokio::time::timeout(SOON, main.recv()).await;
        assert!(matches!(arrival, Ok(Some(_))), "not sent the usual way");
        assert!(status.try_recv().is_err(), "queued on a lane with no place");
    }

    /// A call that finds the lane's queue full takes its turn on the main lane,
    /// as before there was a lane; one that says nothing is closed after the
    /// timeout, sent nowhere.
    #[tokio::test]
    async fn a_call_past_the_lanes_room_goes_the_usual_way_and_a_silent_one_is_closed() {
        let (mut main, mut status, at) = sorting_door(1, Places::new(1)).await;
        let hinted = client_hello(&[b"h2", STATUS_LANE_ALPN]);
        let _first = saying(at, &hinted).await;
        let _second = saying(at, &hinted).await;
        let arrival = tokio::time::timeout(SOON, main.recv()).await;
        let arrival = arrival.expect("sorted in time").expect("an arrival");
        assert_eq!(unread(&arrival, hinted.len()), hinted);
        assert!(status.recv().await.is_some(), "the first was not queued");
        // Silent past the timeout (500 ms): closed, sent nowhere.
        let mut silent = TcpStream::connect(at).await.expect("connect");
        let read = tokio::time::timeout(SOON, silent.read(&mut [0u8; 1])).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "a silent connection was kept: {read:?}"
        );
        assert!(main.try_recv().is_err() && status.try_recv().is_err());
    }
}
