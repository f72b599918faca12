//! Requests whose handles were dropped while they ran: handed back to the context that made
//! them, which frees each one (its engine slot and its buffer) once it finishes, as
//! `MPI_Request_free` does. A [`crate::Request`] holds no reference to its context, and may be
//! dropped on another thread, so the drop goes through a box per context found by its mark.

use crate::context::ContextMark;
use polyrail_core::engine::ReqId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The requests of one context dropped while running, not yet taken by it.
#[derive(Default)]
pub(crate) struct DropBox {
    /// Whether `ids` may hold something: what the context reads when it starts a request,
    /// instead of taking the lock. Relaxed is enough: the ids themselves pass through the
    /// mutex, and the flag is set inside the critical section that adds one and cleared before
    /// the critical section that takes them, so it can never stay false while an id waits
    /// (were the clear ordered after the set, the clearing side's lock would follow the
    /// adding side's unlock and see its id).
    pending: AtomicBool,
    ids: Mutex<Vec<ReqId>>,
}

/// The drop boxes of this process's live contexts, with the marks their requests carry.
static BOXES: Mutex<Vec<(ContextMark, Arc<DropBox>)>> = Mutex::new(Vec::new());

/// A lock that a panic elsewhere did not spoil: the lists stay consistent at every point
/// (each change is one push, retain or take).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DropBox {
    /// The box of a new context marked `mark`.
    pub(crate) fn open(mark: ContextMark) -> Arc<DropBox> {
        let b = Arc::new(DropBox::default());
        lock(&BOXES).push((mark, Arc::clone(&b)));
        b
    }

    /// The context marked `mark` ended: requests of it dropped later have nothing to free
    /// (its end freed everything).
    pub(crate) fn close(mark: ContextMark) {
        lock(&BOXES).retain(|(m, _)| *m != mark);
    }

    /// Hands request `id`, whose handle was dropped, back to the context marked `mark`.
    pub(crate) fn post(mark: ContextMark, id: ReqId) {
        let boxes = lock(&BOXES);
        if let Some((_, b)) = boxes.iter().find(|(m, _)| *m == mark) {
            let mut ids = lock(&b.ids);
            ids.push(id);
            b.pending.store(true, Ordering::Relaxed);
        }
    }

    /// Whether requests may have been handed back since the last [`DropBox::take_into`].
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Moves the requests handed back since the last call into `out`.
    pub(crate) fn take_into(&self, out: &mut Vec<ReqId>) {
        self.pending.store(false, Ordering::Relaxed);
        out.append(&mut lock(&self.ids));
    }
}
