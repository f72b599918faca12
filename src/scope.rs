//! Non-blocking operations on borrowed buffers: [`Comm::scope`].
//!
//! The owned form (`isend(to, tag, Vec<u8>)`) moves a buffer into the request; a scope lets the
//! requests borrow instead, the way `std::thread::scope` lets threads borrow: every request
//! started in the scope has ended when [`Comm::scope`] returns (it waits for those the
//! closure did not wait for, also when the closure panics), and the buffers stay borrowed until
//! then, so safe code cannot change, free or reuse a buffer under a transfer.

use std::cell::{RefCell, RefMut};
use std::marker::PhantomData;

use bytemuck::Pod;
use polyrail_core::engine::{ReqId, Source, Status, TagMatch};
use polyrail_core::{Error, Rank, Result};

use crate::comm::{Comm, CommKind};
use crate::context::{Cancel, Request, World, UNWIND_WAIT};
use crate::pod;
use crate::space::At;

/// The requests of one [`Comm::scope`] call: start them with [`Scope::isend`] and
/// [`Scope::irecv`] (or their `_typed` forms) on buffers borrowed for the whole scope, in the
/// communicator's space and with its ranks.
///
/// A buffer cannot change while a send may still read it:
///
/// ```compile_fail
/// # fn f(ctx: &mut polyrail::Context) -> polyrail::Result<()> {
/// let mut buf = vec![1u8; 64];
/// ctx.scope(|s| {
///     let req = s.isend(1, 0, &buf)?;
///     buf[0] = 2; // error: `buf` is borrowed by the send until the scope ends
///     s.wait(req).map(|_| ())
/// })
/// # }
/// ```
///
/// and a request cannot leave its scope:
///
/// ```compile_fail
/// # fn f(ctx: &mut polyrail::Context) -> polyrail::Result<()> {
/// let buf = vec![1u8; 64];
/// let req = ctx.scope(|s| s.isend(1, 0, &buf))?; // error: the request borrows the scope
/// # Ok(())
/// # }
/// ```
pub struct Scope<'scope, 'env: 'scope> {
    ctx: RefCell<&'scope mut World>,
    /// Where its sends and receives go.
    at: At<'scope>,
    /// The requests started here and not yet waited for.
    running: RefCell<Running>,
    // Invariant in both lifetimes, as `std::thread::Scope`: neither may be shortened to let a
    // buffer's borrow end before the scope does.
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// Engine ids of a scope's requests by [`ScopedRequest::slot`] (`None` once waited for), and
/// the slots free for new ones: a long-lived scope holds as many slots as requests it ever had
/// running at once.
#[derive(Default)]
struct Running {
    ids: Vec<Option<ReqId>>,
    free: Vec<usize>,
}

/// A request started in a [`Scope`]; [`Scope::wait`] gives its status. One not waited for is
/// waited for when the scope ends.
#[must_use = "a scoped request is waited for at the end of its scope at the latest; wait for it to see its result"]
pub struct ScopedRequest<'scope> {
    req: Request,
    /// Its place in [`Scope::running`] (`None`: it finished when it started).
    slot: Option<usize>,
    /// Checks that the received length is a whole number of the buffer's elements.
    whole: fn(Status) -> Result<Status>,
    // Invariant, as the scope: a request cannot pass for one of another scope, whose end would
    // then not wait for its own request in that slot.
    scope: PhantomData<&'scope mut &'scope ()>,
}

impl<K: CommKind> Comm<K> {
    /// Runs `f` with a [`Scope`] whose non-blocking operations borrow their buffers instead of
    /// owning them; returns when `f` has returned and every request started in the scope has
    /// ended (those `f` did not wait for are waited for here, their results dropped; also when
    /// `f` panics, for up to 10 s in all: then the process stops with a message, rather than
    /// hang or free buffers under transfers, also under a `catch_unwind` that would recover).
    /// A closure that returns early on an error with receives still posted should cancel them
    /// itself ([`Scope::cancel`]): the scope's end waits for them, and a peer that fails alike
    /// would wait for this one. Should a receive's wait give up while a live peer may still
    /// write its buffer, the process stops, as in [`Comm::recv`].
    ///
    /// ```no_run
    /// # fn main() -> polyrail::Result<()> {
    /// let mut ctx = polyrail::Context::init()?;
    /// let (me, n) = (ctx.rank(), ctx.size());
    /// let out = vec![me as u8; 1 << 16];
    /// let mut from_left = vec![0u8; 1 << 16];
    /// ctx.scope(|s| {
    ///     let r = s.irecv((me + n - 1) % n, 0, &mut from_left)?;
    ///     let w = s.isend((me + 1) % n, 0, &out)?;
    ///     s.wait_all(vec![r, w]).map(|_| ())
    /// })?;
    /// assert_eq!(from_left[0], ((me + n - 1) % n) as u8);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scope<'env, F, T>(&mut self, f: F) -> T
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
    {
        let (world, at) = self.parts();
        let scope = Scope {
            ctx: RefCell::new(world),
            at,
            running: RefCell::new(Running::default()),
            scope: PhantomData,
            env: PhantomData,
        };
        let ending = EndOfScope(&scope);
        let result = f(&scope);
        drop(ending);
        result
    }
}

/// Waits for a scope's requests when dropped: at its end, or while `f` unwinds.
struct EndOfScope<'a, 'scope, 'env>(&'a Scope<'scope, 'env>);

impl Drop for EndOfScope<'_, '_, '_> {
    fn drop(&mut self) {
        let left = std::mem::take(&mut self.0.running.borrow_mut().ids);
        // Cannot fail: only the scope's methods borrow the context, each until it returns, and
        // none is running when the closure has returned or unwound.
        let mut ctx = self.0.ctx.borrow_mut();
        // A panicking closure may have left requests nothing will end (a receive whose peer
        // waits for what this one was to send first): they are waited for a while only.
        let deadline = std::thread::panicking().then(|| std::time::Instant::now() + UNWIND_WAIT);
        for id in left.into_iter().flatten() {
            if let Some(deadline) = deadline {
                ctx.wait_while_unwinding(id, deadline);
            }
            // The result goes nowhere: the closure did not ask for it.
            let req = ctx.request::<u8>(id).scoped();
            let _ = ctx.wait(req);
        }
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Starts sending `buf`, borrowed until the scope ends. A small message may leave at once;
    /// its request is then finished already.
    pub fn isend(&'scope self, to: Rank, tag: u32, buf: &'scope [u8]) -> Result<ScopedRequest<'scope>> {
        self.isend_typed(to, tag, buf)
    }

    /// [`Scope::isend`] of plain-old-data elements (`&[f64]`, ...), as their bytes.
    pub fn isend_typed<T: Pod>(&'scope self, to: Rank, tag: u32, buf: &'scope [T]) -> Result<ScopedRequest<'scope>> {
        let to = self.at.job_rank(to)?;
        let buf = pod::bytes(buf);
        let mut ctx = self.context()?;
        // SAFETY: `buf` is borrowed (shared, so unchanged) until the scope ends, and the scope
        // waits for every request it started before it ends.
        let req = unsafe { ctx.isend_raw_in(self.at.ctx, to, tag, buf.as_ptr(), buf.len())? };
        self.started(req, pod::whole::<T>)
    }

    /// Starts receiving into `buf`, borrowed until the scope ends; the message may be at most
    /// `buf.len()` bytes.
    pub fn irecv(
        &'scope self,
        from: impl Into<Source>,
        tag: impl Into<TagMatch>,
        buf: &'scope mut [u8],
    ) -> Result<ScopedRequest<'scope>> {
        self.irecv_typed(from, tag, buf)
    }

    /// [`Scope::irecv`] into plain-old-data elements; [`Scope::wait`] checks the received
    /// length as [`Comm::recv_typed`] does.
    pub fn irecv_typed<T: Pod>(
        &'scope self,
        from: impl Into<Source>,
        tag: impl Into<TagMatch>,
        buf: &'scope mut [T],
    ) -> Result<ScopedRequest<'scope>> {
        let from = self.at.source(from.into())?;
        let buf = pod::bytes_mut(buf);
        let mut ctx = self.context()?;
        let region = polyrail_core::RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
        // SAFETY: `buf` is borrowed exclusively until the scope ends, and the scope waits for
        // every request it started before it ends.
        let req = unsafe { ctx.irecv_raw_in(self.at.ctx, from, tag.into(), region)? };
        self.started(req, pod::whole::<T>)
    }

    /// Waits for a request of this scope; its status.
    pub fn wait(&self, req: ScopedRequest<'scope>) -> Result<Status> {
        let mut ctx = self.context()?;
        self.ended(req.slot);
        ctx.wait(req.req).and_then(|done| (req.whole)(done.status))
    }

    /// Makes progress once; whether `req` finished (then [`Scope::wait`] returns at once).
    pub fn test(&self, req: &ScopedRequest<'scope>) -> Result<bool> {
        self.test_all(std::slice::from_ref(req))
    }

    /// Waits for every request; the statuses are in the order of `reqs`. If any failed, all
    /// are still waited for and the first error is returned (as [`Comm::wait_all`]).
    pub fn wait_all(&self, reqs: Vec<ScopedRequest<'scope>>) -> Result<Vec<Status>> {
        let mut ctx = self.context()?;
        reqs.iter().for_each(|r| self.ended(r.slot));
        let checks: Vec<_> = reqs.iter().map(|r| r.whole).collect();
        let reqs = reqs.into_iter().map(|r| r.req).collect();
        ctx.wait_all(reqs)?.into_iter().zip(checks).map(|(done, whole)| whole(done.status)).collect()
    }

    /// Cancels a receive that no message has matched yet, as [`Comm::cancel`]: `None` when
    /// it was withdrawn (its buffer stays borrowed until the scope ends), else the request to
    /// wait for as before.
    pub fn cancel(&self, req: ScopedRequest<'scope>) -> Result<Option<ScopedRequest<'scope>>> {
        let mut ctx = self.context()?;
        let ScopedRequest { req: inner, slot, whole, scope } = req;
        Ok(match ctx.cancel(inner)? {
            Cancel::Cancelled(_) => {
                self.ended(slot);
                None
            }
            Cancel::NotCancelled(req) => Some(ScopedRequest { req, slot, whole, scope }),
        })
    }

    /// Waits until one of `reqs` has finished (or failed); its index (then [`Scope::wait`] on
    /// it returns at once). As [`Comm::wait_any`].
    pub fn wait_any(&self, reqs: &[ScopedRequest<'scope>]) -> Result<usize> {
        self.context()?.wait_any_of(reqs.iter().map(|r| &r.req))
    }

    /// Makes progress once; the index of the first of `reqs` that has finished (or failed), if
    /// any. As [`Comm::test_any`].
    pub fn test_any(&self, reqs: &[ScopedRequest<'scope>]) -> Result<Option<usize>> {
        self.context()?.test_any_of(reqs.iter().map(|r| &r.req))
    }

    /// Makes progress once; whether every one of `reqs` has finished (or failed). As
    /// [`Comm::test_all`].
    pub fn test_all(&self, reqs: &[ScopedRequest<'scope>]) -> Result<bool> {
        self.context()?.test_all_of(reqs.iter().map(|r| &r.req))
    }

    fn context(&self) -> Result<RefMut<'_, &'scope mut World>> {
        // Each method holds the borrow only while it runs and calls none of the caller's code,
        // so this does not fail; were it to, it is an error rather than a panic.
        self.ctx.try_borrow_mut().map_err(|_| Error::InvalidArgument("the scope's context is in use".into()))
    }

    /// A request started here, with the check of its received length.
    fn started(&self, req: Request, whole: fn(Status) -> Result<Status>) -> Result<ScopedRequest<'scope>> {
        let req = self.at.request(req.scoped())?;
        let slot = req.engine_id().map(|id| {
            let mut running = self.running.borrow_mut();
            match running.free.pop() {
                Some(slot) => {
                    running.ids[slot] = Some(id);
                    slot
                }
                None => {
                    running.ids.push(Some(id));
                    running.ids.len() - 1
                }
            }
        });
        Ok(ScopedRequest { req, slot, whole, scope: PhantomData })
    }

    /// The request in `slot` is being waited for (or was cancelled): the scope's end need not,
    /// and the slot is free (the request's [`ScopedRequest`] was consumed, so none names it).
    fn ended(&self, slot: Option<usize>) {
        let mut running = self.running.borrow_mut();
        if let Some(slot) = slot {
            if running.ids.get_mut(slot).and_then(Option::take).is_some() {
                running.free.push(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Context};
    use polyrail_pmi::Singleton;

    /// A long-lived scope reuses the slots of the requests it waited for: it holds as many as it
    /// ever had running at once, not one per request it started.
    #[test]
    fn a_scope_reuses_the_slots_of_ended_requests() {
        let mut ctx = Context::init_with_bootstrap(Config::default(), Box::new(Singleton::new())).unwrap();
        let mut bufs = vec![[0u8; 8]; 100];
        ctx.scope(|s| -> polyrail_core::Result<()> {
            for (i, buf) in bufs.iter_mut().enumerate() {
                let r = s.irecv(0, 5, buf)?;
                let w = s.isend(0, 5, b"round")?;
                s.wait_all(vec![r, w])?;
                assert!(s.running.borrow().ids.len() <= 2, "round {i}: {} slots", s.running.borrow().ids.len());
            }
            Ok(())
        })
        .unwrap();
        assert!(bufs.iter().all(|b| &b[..5] == b"round"));
        ctx.finalize().unwrap();
    }
}
