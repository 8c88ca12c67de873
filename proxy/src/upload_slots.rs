//! The proxy's upload slots: at most so many contributions are read at once, and
//! no upload waits long for a slot with its stream open.
//!
//! An upload that waited for a slot would leave its stream unread, with no time
//! limit: an owner could fill the stream's window with DATA frames of one byte,
//! each a slice that keeps alive the whole read buffer it arrived in, and so pin
//! about 1 GiB (docs/PRIVACY.md). So an upload that finds every slot held waits
//! for one [`PATIENCE`] at most, and is then refused. Its owner then asks for a
//! slot with `ReserveUpload`, a unary call that tonic reads whole, to its end,
//! before the handler waits: a waiting owner holds no unread frame. The slot it
//! gets is kept for that owner's next upload for a lease, then given back.
//! Waiting owners are served in the order they asked (tokio's semaphore is fair,
//! and a slot given back goes to a waiter before an upload can take it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// How long a slot kept for an owner waits for its upload. The owner sends as
/// soon as it is told, so an honest upload claims its slot within a round trip
/// and its first chunk (at most 64 KiB of ciphertexts at 4096 bits: a second at
/// the slowest rate the proxy accepts); a reservation never used holds a slot no
/// longer than this.
pub const LEASE: Duration = Duration::from_secs(10);

/// How long an upload waits for a slot, its stream unread, before it is refused
/// and its owner told to reserve one. What a hostile owner can park meanwhile is
/// what it sends in that time, so a short wait bounds it by the owner's
/// bandwidth, not by the 1 GiB a stream's window can pin. Long enough that in a
/// burst of owners with small contributions, whose uploads free a slot every few
/// milliseconds, an upload rarely waits this long: each refusal costs the owner
/// a reservation, and the proxy two calls more (in the load bench at M = 64 and
/// 100 owners, refusing at once every upload that found the slots held took the
/// proxy 0.46-0.47 s of CPU against 0.32-0.34 s, and 255-260 contributions/s
/// against 364-373; with this wait, 320-502/s against 334-366 in the same runs).
pub const PATIENCE: Duration = Duration::from_millis(250);

/// One slot, given back when dropped.
pub type Slot = OwnedSemaphorePermit;

/// Why no slot was given.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SlotError {
    /// Every slot is held (by uploads, or kept for owners who reserved one).
    #[error("every upload slot ({0}) is held")]
    AllHeld(usize),
    /// The slots were closed: the proxy is stopping.
    #[error("the proxy is shutting down")]
    Closed,
}

/// A slot kept for an owner, which keeping it is (a later one replaces it), and
/// the timer that gives it back, stopped when the slot is claimed or replaced:
/// an owner that reserves and claims over and over leaves no timers behind.
struct Kept {
    id: u64,
    slot: Slot,
    timer: tokio::task::AbortHandle,
    /// When the timer gives the slot back.
    until: tokio::time::Instant,
}

/// The upload slots and those kept for owners.
#[derive(Clone)]
pub struct UploadSlots {
    free: Arc<Semaphore>,
    total: usize,
    /// Owner id -> the slot kept for it. At most one per owner, and each is one
    /// of the `total` slots, so the table holds at most `total` entries.
    kept: Arc<Mutex<HashMap<String, Kept>>>,
    next_id: Arc<AtomicU64>,
    lease: Duration,
}

impl UploadSlots {
    /// `total` slots (at least one); a slot kept for an owner is given back
    /// `lease` after it was granted unless the owner's upload claims it first.
    pub fn new(total: usize, lease: Duration) -> Self {
        let total = total.max(1);
        Self {
            free: Arc::new(Semaphore::new(total)),
            total,
            kept: Arc::default(),
            next_id: Arc::default(),
            lease,
        }
    }

    /// How long a kept slot waits for its owner's upload.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// A slot free now, without waiting.
    pub fn take_now(&self) -> Result<Slot, SlotError> {
        Arc::clone(&self.free)
            .try_acquire_owned()
            .map_err(|e| match e {
                TryAcquireError::NoPermits => SlotError::AllHeld(self.total),
                TryAcquireError::Closed => SlotError::Closed,
            })
    }

    /// A slot free now, or given back within `patience`, in turn with the others
    /// waiting.
    pub async fn take_within(&self, patience: Duration) -> Result<Slot, SlotError> {
        match self.take_now() {
            Err(SlotError::AllHeld(_)) => {}
            taken => return taken,
        }
        tokio::time::timeout(patience, self.wait())
            .await
            .unwrap_or(Err(SlotError::AllHeld(self.total)))
    }

    /// The next slot given back, in turn with the others waiting.
    pub async fn wait(&self) -> Result<Slot, SlotError> {
        Arc::clone(&self.free)
            .acquire_owned()
            .await
            .map_err(|_| SlotError::Closed)
    }

    /// Keeps `slot` for `owner`'s next upload until the lease runs out (then it is
    /// given back). A slot already kept for `owner` is given back now. Must be
    /// called on a tokio runtime (the lease is a timer).
    pub fn keep(&self, owner: String, slot: Slot) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (kept, lease, key) = (Arc::clone(&self.kept), self.lease, owner.clone());
        let until = tokio::time::Instant::now() + lease;
        // Started under the table's lock: it cannot look for the entry before
        // the entry is there.
        let mut table = self.lock();
        let timer = tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
            if kept.get(&key).is_some_and(|k| k.id == id) {
                kept.remove(&key);
            }
        })
        .abort_handle();
        let entry = Kept {
            id,
            slot,
            timer,
            until,
        };
        if let Some(earlier) = table.insert(owner, entry) {
            earlier.timer.abort();
        }
    }

    /// How much longer the slot kept for `owner`, if any, waits for its upload.
    pub fn kept_for(&self, owner: &str) -> Option<Duration> {
        let until = self.lock().get(owner)?.until;
        Some(until.saturating_duration_since(tokio::time::Instant::now()))
    }

    /// Takes the slot kept for `owner`, if any: it is then the caller's, given
    /// back when dropped.
    pub fn claim(&self, owner: &str) -> Option<Slot> {
        let kept = self.lock().remove(owner)?;
        kept.timer.abort();
        Some(kept.slot)
    }

    /// The table of kept slots. A panic while it was held left it whole (each
    /// operation is one insert or remove), so a poisoned lock is used as it is.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long beside the scheduler's delays: a check made at half of it cannot
    /// find it run out on a busy machine.
    const LEASE: Duration = Duration::from_secs(2);

    /// Waits up to 10 s for `owner`'s kept slot to be given back: a timer fires
    /// late on a busy machine, never early.
    async fn given_back(slots: &UploadSlots, owner: &str) -> bool {
        for _ in 0..1000 {
            if slots.kept_for(owner).is_none() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// With every slot held, an upload is told so at once; the slot given back
    /// goes to the owner that waited for it, not to an upload that comes after.
    #[tokio::test]
    async fn a_slot_given_back_goes_to_the_owner_waiting_for_it() {
        let slots = UploadSlots::new(1, LEASE);
        let held = slots.take_now().expect("one slot");
        assert_eq!(slots.take_now().err(), Some(SlotError::AllHeld(1)));
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.wait().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        assert_eq!(
            slots.take_now().err(),
            Some(SlotError::AllHeld(1)),
            "an upload took the slot an owner was waiting for"
        );
        let slot = waiter.await.expect("task").expect("the waiter's slot");
        slots.keep("a".into(), slot);
        assert!(slots.kept_for("a").is_some());
        assert!(
            slots.take_now().is_err(),
            "a kept slot was taken by another"
        );
        assert!(slots.claim("b").is_none(), "another owner claimed a's slot");
        let claimed = slots.claim("a").expect("a's slot");
        assert!(slots.kept_for("a").is_none());
        drop(claimed);
        assert!(
            slots.take_now().is_ok(),
            "a claimed slot was not given back"
        );
    }

    /// An upload waits for a slot its patience at most: it gets one given back
    /// meanwhile, in turn, and is told every slot is held once the patience is
    /// spent, not before.
    #[tokio::test]
    async fn an_upload_waits_its_patience_for_a_slot_and_no_longer() {
        let patience = Duration::from_millis(300);
        let slots = UploadSlots::new(1, LEASE);
        let held = slots.take_now().expect("one slot");
        let start = tokio::time::Instant::now();
        assert_eq!(
            slots.take_within(patience).await.err(),
            Some(SlotError::AllHeld(1))
        );
        let waited = start.elapsed();
        assert!(waited >= patience, "refused after {waited:?}");
        assert!(waited < 10 * patience, "waited {waited:?}");
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.take_within(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        assert!(
            waiter.await.expect("task").is_ok(),
            "the slot given back went elsewhere"
        );
    }

    /// A kept slot its owner never claims is given back when the lease runs
    /// out, and not before; what is left of the lease shrinks meanwhile.
    #[tokio::test]
    async fn a_kept_slot_is_given_back_when_its_lease_runs_out() {
        let slots = UploadSlots::new(1, LEASE);
        let start = tokio::time::Instant::now();
        slots.keep("a".into(), slots.take_now().expect("slot"));
        tokio::time::sleep(LEASE / 2).await;
        let left = slots
            .kept_for("a")
            .expect("given back before the lease ran out");
        assert!(
            left <= LEASE / 2,
            "{left:?} of the lease said to be left after half of it"
        );
        assert!(slots.take_now().is_err());
        assert!(given_back(&slots, "a").await, "kept long past its lease");
        assert!(start.elapsed() >= LEASE, "given back early");
        assert!(slots.take_now().is_ok(), "the slot was not given back");
    }

    /// A slot claimed, or kept again, stops the timer of its keeping: an owner
    /// that reserves and claims over and over leaves no task behind for the rest
    /// of each lease.
    #[tokio::test]
    async fn a_claimed_or_replaced_slot_leaves_no_timer_behind() {
        let alive = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = alive();
        let slots = UploadSlots::new(2, LEASE);
        for _ in 0..100 {
            slots.keep("a".into(), slots.take_now().expect("a first slot"));
            slots.keep("a".into(), slots.take_now().expect("a second slot"));
            drop(slots.claim("a").expect("the slot kept"));
        }
        // Aborted tasks end when the runtime next runs them.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(alive(), before, "timers outlived their keeping");
    }

    /// A second keeping for the same owner gives the first slot back at once,
    /// and the first lease's end does not cut the second one short.
    #[tokio::test]
    async fn an_owner_keeps_one_slot_and_its_latest_lease() {
        let slots = UploadSlots::new(2, LEASE);
        slots.keep("a".into(), slots.take_now().expect("first"));
        tokio::time::sleep(LEASE / 2).await;
        let second = tokio::time::Instant::now();
        slots.keep("a".into(), slots.take_now().expect("second"));
        let other = slots.take_now().expect("the first slot was given back");
        drop(other);
        assert!(given_back(&slots, "a").await, "kept long past its lease");
        assert!(
            second.elapsed() >= LEASE,
            "the first lease's end gave back the second slot"
        );
    }
}
