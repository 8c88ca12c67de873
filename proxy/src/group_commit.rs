//! Group commit: writes handed in while a commit is on its way to disk are
//! written together by the next one, so many callers share one fsync (and the
//! database's fixed cost per commit) instead of queueing for one each.
//!
//! A caller [`GroupCommit::submit`]s its write in the order it must be applied
//! (the service submits under the study's and the budgets' locks, so the queue's
//! order is the order of the transitions in memory) and then [`GroupCommit::wait`]s
//! without any lock for its write to be durable. The first waiter that finds no
//! commit under way leads: it takes every write queued, commits them as one batch
//! and wakes the others; no thread of its own.
//!
//! A leader that knows of writes on their way ([`GroupCommit::announce`]: an
//! upload being read) lingers for them a little before it commits: uploads
//! arrive faster than one commit each only when many run at once, and then the
//! linger is what lets them share one.
//!
//! It stops at the first failure (fail-stop, as databases do when an fsync
//! fails): the failed batch's callers and every later one get the failure, since
//! what they saw in memory may rest on a write that never reached the disk. Only
//! a restart, which reloads the file, clears it.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Why a write is not durable: the cause of the first failed commit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an earlier commit failed ({0}); nothing is written until a restart")]
pub struct Stopped(pub String);

/// A submitted write's place in the queue: pass it to [`GroupCommit::wait`].
#[must_use = "a submitted write is durable only once waited for"]
#[derive(Debug)]
pub struct Ticket(u64);

/// The queue of writes not yet committed.
pub struct GroupCommit<J> {
    state: Mutex<Queue<J>>,
    /// A commit ended (waiters check whether it was theirs).
    done: Condvar,
    /// A write arrived or an announced one will not (the lingering leader checks).
    arrived: Condvar,
    linger: Duration,
}

struct Queue<J> {
    jobs: Vec<J>,
    /// Tickets handed out so far (the last one's number).
    submitted: u64,
    /// Every ticket up to this one is durable.
    durable: u64,
    leading: bool,
    failure: Option<Stopped>,
    /// Writes announced and not yet submitted (nor withdrawn).
    coming: usize,
}

impl<J> Default for GroupCommit<J> {
    fn default() -> Self {
        Self::new(Duration::ZERO)
    }
}

impl<J> GroupCommit<J> {
    /// A queue whose leader waits up to `linger` for announced writes.
    pub fn new(linger: Duration) -> Self {
        Self {
            state: Mutex::new(Queue {
                jobs: Vec::new(),
                submitted: 0,
                durable: 0,
                leading: false,
                failure: None,
                coming: 0,
            }),
            done: Condvar::new(),
            arrived: Condvar::new(),
            linger,
        }
    }

    /// Tells the queue a write is on its way; follow with
    /// [`GroupCommit::submit_announced`] or [`GroupCommit::withdraw`].
    pub fn announce(&self) {
        self.lock().coming += 1;
    }

    /// An announced write will not come.
    pub fn withdraw(&self) {
        let mut q = self.lock();
        q.coming = q.coming.saturating_sub(1);
        drop(q);
        self.arrived.notify_all();
    }

    /// [`GroupCommit::submit`] for an announced write.
    pub fn submit_announced(&self, job: J) -> Result<Ticket, Stopped> {
        let ticket = {
            let mut q = self.lock();
            q.coming = q.coming.saturating_sub(1);
            Self::push(&mut q, job)
        };
        self.arrived.notify_all();
        ticket
    }

    /// Queues `job` behind every job submitted before it; refused once a commit
    /// has failed.
    pub fn submit(&self, job: J) -> Result<Ticket, Stopped> {
        let ticket = Self::push(&mut self.lock(), job);
        self.arrived.notify_all();
        ticket
    }

    fn push(q: &mut Queue<J>, job: J) -> Result<Ticket, Stopped> {
        if let Some(f) = &q.failure {
            return Err(f.clone());
        }
        q.jobs.push(job);
        q.submitted += 1;
        Ok(Ticket(q.submitted))
    }

    /// Returns once the ticket's job is durable, committing queued jobs with
    /// `commit` (all of them in one call, in their order) whenever no other
    /// waiter is committing; a commit it leads lingers for announced writes.
    pub fn wait(
        &self,
        ticket: Ticket,
        commit: impl FnMut(Vec<J>) -> Result<(), String>,
    ) -> Result<(), Stopped> {
        self.wait_lingering(ticket, true, commit)
    }

    /// [`GroupCommit::wait`] without the linger: for a caller that holds what an
    /// announced write needs (a study's lock), which would only wait out the linger.
    pub fn wait_now(
        &self,
        ticket: Ticket,
        commit: impl FnMut(Vec<J>) -> Result<(), String>,
    ) -> Result<(), Stopped> {
        self.wait_lingering(ticket, false, commit)
    }

    fn wait_lingering(
        &self,
        ticket: Ticket,
        linger: bool,
        mut commit: impl FnMut(Vec<J>) -> Result<(), String>,
    ) -> Result<(), Stopped> {
        let mut q = self.lock();
        loop {
            if q.durable >= ticket.0 {
                return Ok(());
            }
            if let Some(f) = &q.failure {
                return Err(f.clone());
            }
            if q.leading {
                q = self.done.wait(q).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            q.leading = true;
            if linger {
                q = self.linger(q);
            }
            let batch = std::mem::take(&mut q.jobs);
            let last = q.submitted;
            drop(q);
            let mut lead = Lead {
                owner: self,
                outcome: Err(Stopped("the commit panicked".into())),
            };
            lead.outcome = commit(batch).map(|()| last).map_err(Stopped);
            drop(lead);
            q = self.lock();
        }
    }

    /// Waits up to the linger while announced writes are still coming.
    fn linger<'a>(&'a self, mut q: MutexGuard<'a, Queue<J>>) -> MutexGuard<'a, Queue<J>> {
        let until = Instant::now() + self.linger;
        while q.coming > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = self
                .arrived
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        q
    }

    /// Whether every job submitted so far is durable and no commit failed.
    pub fn settled_now(&self) -> bool {
        let q = self.lock();
        q.failure.is_none() && q.durable >= q.submitted
    }

    /// Whether a commit has failed (every later write is refused).
    pub fn stopped(&self) -> bool {
        self.lock().failure.is_some()
    }

    fn lock(&self) -> MutexGuard<'_, Queue<J>> {
        // The queue is changed only in short steps that leave it whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The leader's turn; ending it (also by a panic in the commit) records the
/// outcome and wakes the waiters, so none waits for a leader that is gone.
struct Lead<'a, J> {
    owner: &'a GroupCommit<J>,
    outcome: Result<u64, Stopped>,
}

impl<J> Drop for Lead<'_, J> {
    fn drop(&mut self) {
        let mut q = self.owner.lock();
        q.leading = false;
        match std::mem::replace(&mut self.outcome, Ok(0)) {
            Ok(last) => q.durable = q.durable.max(last),
            Err(f) => q.failure = Some(f),
        }
        drop(q);
        self.owner.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn writes_queued_behind_a_commit_share_the_next_one() {
        let gc = Arc::new(GroupCommit::<u32>::default());
        let batches = Arc::new(Mutex::new(Vec::<Vec<u32>>::new()));
        let (entered, proceed) = (
            Arc::new(std::sync::Barrier::new(2)),
            Arc::new(std::sync::Barrier::new(2)),
        );
        let first = gc.submit(0).expect("submit");
        let leader = {
            let (gc, batches, entered, proceed) = (
                gc.clone(),
                batches.clone(),
                entered.clone(),
                proceed.clone(),
            );
            std::thread::spawn(move || {
                gc.wait(first, |b| {
                    if b == [0] {
                        entered.wait();
                        proceed.wait();
                    }
                    batches.lock().expect("lock").push(b);
                    Ok(())
                })
            })
        };
        entered.wait();
        let tickets: Vec<Ticket> = (1..=5).map(|i| gc.submit(i).expect("submit")).collect();
        proceed.wait();
        for t in tickets {
            gc.wait(t, |b| {
                batches.lock().expect("lock").push(b);
                Ok(())
            })
            .expect("durable");
        }
        leader.join().expect("leader").expect("durable");
        assert_eq!(
            *batches.lock().expect("lock"),
            vec![vec![0], vec![1, 2, 3, 4, 5]]
        );
    }

    /// A leader lingers for an announced write and commits it in its batch; it
    /// does not wait out the linger for one withdrawn.
    #[test]
    fn a_leader_lingers_for_announced_writes_only() {
        let gc = Arc::new(GroupCommit::<u32>::new(Duration::from_secs(30)));
        gc.announce();
        gc.announce();
        let first = gc.submit(0).expect("submit");
        let g = gc.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let t = g.submit_announced(1).expect("submit");
            g.withdraw();
            t
        });
        let started = Instant::now();
        let mut batches = Vec::new();
        gc.wait(first, |b| {
            batches.push(b);
            Ok(())
        })
        .expect("durable");
        assert_eq!(
            batches,
            vec![vec![0, 1]],
            "the announced write shares the commit"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "waited out the linger"
        );
        gc.wait(late.join().expect("thread"), |_| Ok(()))
            .expect("durable");
    }

    /// Settled once every submitted job is durable, and never after a failure.
    #[test]
    fn settled_means_every_submitted_job_is_durable() {
        let gc = GroupCommit::<u32>::default();
        assert!(gc.settled_now(), "nothing submitted");
        let t = gc.submit(1).expect("submit");
        assert!(!gc.settled_now(), "a job on its way");
        gc.wait(t, |_| Ok(())).expect("durable");
        assert!(gc.settled_now());
        let t = gc.submit(2).expect("submit");
        assert!(gc.wait(t, |_| Err("disk full".into())).is_err());
        assert!(!gc.settled_now(), "stopped");
    }

    #[test]
    fn a_failed_commit_stops_its_batch_and_every_later_write() {
        let gc = GroupCommit::<u32>::default();
        let (a, b) = (gc.submit(1).expect("submit"), gc.submit(2).expect("submit"));
        let err = gc.wait(a, |_| Err("disk full".into())).expect_err("failed");
        assert!(err.0.contains("disk full"));
        // The second write was in the failed batch: not durable either.
        assert_eq!(gc.wait(b, |_| Ok(())), Err(err.clone()));
        assert_eq!(gc.submit(3).map(|_| ()), Err(err));
        assert!(gc.stopped());
    }

    #[test]
    fn a_panicking_commit_stops_instead_of_leaving_waiters_hanging() {
        let gc = Arc::new(GroupCommit::<u32>::default());
        let t = gc.submit(1).expect("submit");
        let g = gc.clone();
        let second = gc.submit(2).expect("submit");
        let (entered, proceed) = (
            Arc::new(std::sync::Barrier::new(2)),
            Arc::new(std::sync::Barrier::new(2)),
        );
        let (e, p) = (entered.clone(), proceed.clone());
        let leader = std::thread::spawn(move || {
            g.wait(t, |_| {
                e.wait();
                p.wait();
                panic!("boom")
            })
        });
        entered.wait();
        // A second waiter, asleep behind the leader when it panics.
        let g = gc.clone();
        let follower = std::thread::spawn(move || g.wait(second, |_| Ok(())));
        std::thread::sleep(Duration::from_millis(50));
        proceed.wait();
        assert!(leader.join().is_err(), "the leader's panic propagates");
        let woke = follower.join().expect("follower");
        assert!(woke.is_err(), "the waiter behind a panicked commit is told");
        let t3 = gc.submit(3);
        assert!(t3.is_err(), "a write after a panicked commit is refused");
    }

    #[test]
    fn each_write_is_committed_once_and_in_order_under_contention() {
        let gc = Arc::new(GroupCommit::<u32>::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let order = Arc::new(Mutex::new(())); // submit order = number order
        let next = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gc, seen, order, next) =
                    (gc.clone(), seen.clone(), order.clone(), next.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let t = {
                            let _g = order.lock().expect("lock");
                            let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            gc.submit(n).expect("submit")
                        };
                        gc.wait(t, |b| {
                            seen.lock().expect("lock").extend(b);
                            Ok(())
                        })
                        .expect("durable");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let seen = seen.lock().expect("lock");
        assert_eq!(*seen, (0..400).collect::<Vec<_>>());
    }
}
