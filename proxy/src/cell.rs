//! One study as the service holds it: under its own lock, so a fold or a release of
//! one study never holds up a call on another, and beside it its view, the study
//! as of its last transition, which `status` and the count of open studies read
//! without waiting behind a fold. The view shares the aggregate and the owners'
//! maps (`Arc`s), so it costs no copy of them.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::study::Study;

/// A study and its view.
pub struct StudyCell {
    study: Arc<AsyncMutex<Study>>,
    view: Mutex<Study>,
}

impl StudyCell {
    /// A cell holding `study`.
    pub fn new(study: Study) -> Arc<Self> {
        Arc::new(Self {
            view: Mutex::new(study.clone()),
            study: Arc::new(AsyncMutex::new(study)),
        })
    }

    /// The study as of its last transition, its deadline applied at `now_ms`;
    /// never waits for a fold or a release.
    pub fn view(&self, now_ms: u64) -> Study {
        // A panic while the view was being replaced leaves the previous view,
        // still a true one.
        let mut s = self
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        s.tick(now_ms);
        s
    }

    /// `f` of the view as it is, its deadline not applied (see
    /// [`Study::deadline_due`]): never waits for a fold or a release, and copies
    /// nothing.
    pub fn peek<T>(&self, f: impl FnOnce(&Study) -> T) -> T {
        f(&self.view.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The study under its lock, waiting for the fold or release that holds it.
    pub async fn lock(self: &Arc<Self>) -> Locked {
        Locked {
            guard: Arc::clone(&self.study).lock_owned().await,
            cell: Arc::clone(self),
        }
    }

    /// The study under its lock if nothing holds it now.
    pub fn try_lock(self: &Arc<Self>) -> Option<Locked> {
        Some(Locked {
            guard: Arc::clone(&self.study).try_lock_owned().ok()?,
            cell: Arc::clone(self),
        })
    }
}

/// A study under its lock. A transition is made with [`Locked::set`], or by the
/// deadline with [`Locked::tick`], each of which also moves the view; changing it
/// in place (`DerefMut`) is for what the view need not show.
pub struct Locked {
    guard: OwnedMutexGuard<Study>,
    cell: Arc<StudyCell>,
}

impl Locked {
    /// Makes `next` the study and its view.
    pub fn set(&mut self, next: Study) {
        *self.guard = next;
        self.show();
    }

    /// Applies the deadline at `now_ms` ([`Study::tick`]), to the view too: a
    /// reader of the view then finds the study closed without asking the study
    /// itself ([`Study::deadline_due`]).
    pub fn tick(&mut self, now_ms: u64) {
        if self.guard.deadline_due(now_ms) {
            self.guard.tick(now_ms);
            self.show();
        }
    }

    /// Makes the study as it is now its view.
    fn show(&self) {
        let view = self.guard.clone();
        *self
            .cell
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = view;
    }
}

impl Deref for Locked {
    type Target = Study;

    fn deref(&self) -> &Study {
        &self.guard
    }
}

impl DerefMut for Locked {
    fn deref_mut(&mut self) -> &mut Study {
        &mut self.guard
    }
}
