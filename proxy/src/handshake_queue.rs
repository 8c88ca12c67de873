//! The queue of connections waiting for a handshake place
//! ([`crate::listener::capped_tls_on`]), in the order the door let them in.
//!
//! A queued connection holds its door place until its turn comes. The queue's
//! order bounds that wait (at most the door's places ahead of it, behind
//! handshake places each held at most the handshake timeout), and a live
//! connection keeps its turn however many handshakes stall ahead of it: closing
//! it earlier would turn away the honest parties queued behind a flood, which
//! the order serves. One whose client closes while it waits (after a whole
//! first record, which the door passes on) is let go within about [`SWEEP`],
//! its door place with it, and is not handshaken if its turn comes first:
//! otherwise a client could close and connect again to hold more door places
//! than it holds sockets. A close is seen only if the client's side sends one
//! (a FIN or a reset): a client that leaves without either (its own TCP stack,
//! or a firewall that drops them) still holds its place until its turn and its
//! handshake's timeout, within its source's caps ([`crate::sources`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Interval, MissedTickBehavior};
use tokio_stream::Stream;

use crate::door::{Arrival, PlaceHeld};
use crate::listener::Places;
use crate::metrics::{connection_refused as refused, ConnectionRefusal};

/// How often the queue looks for connections whose client has closed.
pub const SWEEP: Duration = Duration::from_millis(250);

/// A connection waiting for a handshake place, on the runtime that will run its
/// handshake (so that its client's close is seen there).
pub struct Queued {
    /// The connection.
    pub io: TcpStream,
    /// Where it comes from.
    pub peer: std::net::IpAddr,
    /// Its door place and its source's counts there.
    pub held: PlaceHeld,
}

/// The connections waiting for a handshake place, first come first served.
pub struct HandshakeQueue {
    waiting: VecDeque<Queued>,
    /// At most this many are taken off the door's channel to wait here.
    room: usize,
    sweep: Interval,
    /// The listener's name, for the metrics.
    name: &'static str,
}

impl HandshakeQueue {
    /// An empty queue of at most `room` connections (at least one) for the
    /// listener `name`; must be made on a runtime.
    pub fn new(room: usize, name: &'static str) -> Self {
        let mut sweep = tokio::time::interval(SWEEP);
        sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            waiting: VecDeque::new(),
            room: room.max(1),
            sweep,
            name,
        }
    }

    /// A handshake place and the first connection queued for one (`None` once
    /// the door is gone). Meanwhile what arrives joins the queue, and what its
    /// client closed is let go.
    pub async fn next_turn(
        &mut self,
        places: &Places,
        arrivals: &mut (impl Stream<Item = Arrival> + Unpin),
    ) -> Option<(OwnedSemaphorePermit, Queued)> {
        use tokio_stream::StreamExt;
        let Self {
            waiting,
            room,
            sweep,
            name,
        } = self;
        let (room, name) = (*room, *name);
        loop {
            let has_room = waiting.len() < room;
            let any = !waiting.is_empty();
            tokio::select! {
                arrival = arrivals.next(), if has_room => join(waiting, arrival?, name),
                place = places.take(), if any => {
                    let place = place?;
                    while let Some(first) = waiting.pop_front() {
                        if !seen_closed(&first.io) {
                            return Some((place, first));
                        }
                        refused(name, ConnectionRefusal::ClosedWhileQueued);
                    }
                }
                _ = sweep.tick(), if any => let_go_of_closed(waiting, name),
            }
        }
    }
}

/// Queues `arrival`, its connection taken onto this runtime.
fn join(waiting: &mut VecDeque<Queued>, arrival: Arrival, name: &'static str) {
    match TcpStream::from_std(arrival.io) {
        Ok(io) => waiting.push_back(Queued {
            io,
            peer: arrival.peer,
            held: arrival.held,
        }),
        Err(_) => refused(name, ConnectionRefusal::Handshake),
    }
}

/// Lets go of the queued connections whose client has closed.
fn let_go_of_closed(waiting: &mut VecDeque<Queued>, name: &'static str) {
    let before = waiting.len();
    waiting.retain(|q| !seen_closed(&q.io));
    for _ in waiting.len()..before {
        refused(name, ConnectionRefusal::ClosedWhileQueued);
    }
}

/// Whether `io`'s client has closed (a FIN or a reset), as the runtime last saw
/// it; never waits. A queued connection has its ClientHello's bytes unread, so
/// reading cannot tell: the readiness the runtime keeps can.
fn seen_closed(io: &TcpStream) -> bool {
    let ready = pin!(io.ready(Interest::READABLE));
    match ready.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(r)) => r.is_read_closed(),
        Poll::Ready(Err(_)) => true,
        Poll::Pending => false,
    }
}
