//! [`Comm`]: the communicator. The whole job ([`crate::Context`], `Comm<World>`) and each
//! matching space of it ([`crate::InSpace`], `Comm<Within>`) are one generic type, whose calls
//! are written once here (and in `space.rs` and `scope.rs`). A communicator knows where its
//! calls go ([`At`]): for the world that is a constant, so the world's calls translate no rank
//! and take no branch for it.

use crate::buffer::RegisteredBuffer;
use crate::context::{Cancel, Completion, Request, World};
use crate::pod;
use crate::space::{At, InSpace, Space};
use bytemuck::Pod;
use polyrail_core::engine::{Source, Status, TagMatch};
use polyrail_core::{Config, Rank, RegionMut, Result};
use polyrail_runtime::JobReport;

/// A communicator: this process's endpoint seen over the whole job ([`crate::Context`], which
/// is `Comm<World>`) or over one matching space of it ([`crate::InSpace`], `Comm<Within>`, from
/// [`Comm::in_space`]). Both have the same calls; code that works in either takes
/// `&mut Comm<impl CommKind>`:
///
/// ```no_run
/// use polyrail::{Comm, CommKind, Context};
///
/// /// Sends each rank's rank to the next one around the ring; what came from the previous.
/// fn ring_shift(c: &mut Comm<impl CommKind>) -> polyrail::Result<u32> {
///     let (me, n) = (c.rank(), c.size());
///     let mut got = [0u32];
///     c.sendrecv_typed((me + 1) % n, 0, &[me], (me + n - 1) % n, 0, &mut got)?;
///     Ok(got[0])
/// }
///
/// # fn main() -> polyrail::Result<()> {
/// let mut ctx = Context::init()?;
/// let from_world = ring_shift(&mut ctx)?;
/// let me = ctx.rank();
/// let half = ctx.split(Some(me % 2), me)?.expect("a color was given");
/// let from_half = ring_shift(&mut ctx.in_space(&half)?)?;
/// # Ok(())
/// # }
/// ```
///
/// Ranks given to a communicator's calls and named in the statuses they return are its own
/// (a space's are numbered from 0); requests started in any communicator of a context are
/// waited for, tested and cancelled through any other of it. Messages are bytes (`send`,
/// `recv`, ...) or slices and vectors of any plain-old-data type ([`bytemuck::Pod`]: `f64`,
/// `u32`, `#[derive(Pod)]` structs; `send_typed`, `recv_typed`, ...), which travel as their
/// bytes in this machine's layout.
pub struct Comm<K: CommKind> {
    pub(crate) kind: K,
}

/// What a [`Comm`] spans: [`World`] (the whole job, which the communicator owns) or
/// [`Within`] (a space of it). Generic code takes `&mut Comm<impl CommKind>`. Sealed: these
/// two are all there is.
pub trait CommKind: sealed::Sealed {}

pub(crate) mod sealed {
    use crate::context::World;
    use crate::space::Space;

    /// What [`super::CommKind`] gives the calls: the endpoint, and the space (`None`: the
    /// whole job).
    pub trait Sealed {
        /// The endpoint and the space.
        fn parts(&mut self) -> (&mut World, Option<&Space>);
        /// The endpoint and the space, to read.
        fn parts_ref(&self) -> (&World, Option<&Space>);
    }
}

/// A [`Comm`] over one [`Space`] of a context: the context, borrowed, and the space.
pub struct Within<'a> {
    world: &'a mut World,
    space: &'a Space,
}

impl CommKind for World {}

impl sealed::Sealed for World {
    #[inline]
    fn parts(&mut self) -> (&mut World, Option<&Space>) {
        (self, None)
    }

    #[inline]
    fn parts_ref(&self) -> (&World, Option<&Space>) {
        (self, None)
    }
}

impl CommKind for Within<'_> {}

impl sealed::Sealed for Within<'_> {
    #[inline]
    fn parts(&mut self) -> (&mut World, Option<&Space>) {
        (self.world, Some(self.space))
    }

    #[inline]
    fn parts_ref(&self) -> (&World, Option<&Space>) {
        (self.world, Some(self.space))
    }
}

impl<K: CommKind> Comm<K> {
    /// The communicator of `kind`.
    pub(crate) fn new(kind: K) -> Comm<K> {
        Comm { kind }
    }

    /// The endpoint, and where this communicator's calls go.
    #[inline(always)]
    pub(crate) fn parts(&mut self) -> (&mut World, At<'_>) {
        let (world, space) = self.kind.parts();
        (world, At::of(space))
    }

    /// The endpoint, and where this communicator's calls go, to read.
    #[inline]
    pub(crate) fn parts_ref(&self) -> (&World, At<'_>) {
        let (world, space) = self.kind.parts_ref();
        (world, At::of(space))
    }

    /// The endpoint.
    #[inline]
    pub(crate) fn world_mut(&mut self) -> &mut World {
        self.kind.parts().0
    }

    /// This process's rank, from 0 to `size() - 1` (in a space: its rank there).
    pub fn rank(&self) -> Rank {
        let (world, at) = self.parts_ref();
        at.members().map_or_else(|| world.rank(), |m| m.me)
    }

    /// Number of ranks: processes in the job, or members of the space.
    pub fn size(&self) -> u32 {
        let (world, at) = self.parts_ref();
        at.members().map_or_else(|| world.size(), |m| m.job.len() as u32)
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        self.kind.parts_ref().0.config()
    }

    /// What the job learned at start: topology, channels, and the route table to every peer
    /// (by job rank).
    pub fn report(&self) -> &JobReport {
        self.kind.parts_ref().0.report()
    }

    /// Whether skew feedback has messages to `peer` sent eagerly now (the peer reported that it
    /// lags behind this process; see `POLYRAIL_SKEW`). `false` for a rank outside the space.
    pub fn sends_eagerly_to(&self, peer: Rank) -> bool {
        let (world, at) = self.parts_ref();
        at.job_rank(peer).is_ok_and(|j| world.sends_eagerly_to(j))
    }

    /// Allocates `len` bytes registered once with every channel: messages sent from it or
    /// received into it skip per-message registration on `ib`, and `cma` copies them without
    /// the kernel (peers map the buffer; see [`RegisteredBuffer`]). Give it back with
    /// [`Comm::free_registered`]. The buffer belongs to the context, whichever of its
    /// communicators allocated it.
    pub fn alloc_registered(&mut self, len: usize) -> Result<RegisteredBuffer> {
        self.world_mut().alloc_registered(len)
    }

    /// Ends the registrations of a buffer from [`Comm::alloc_registered`] and frees it. No
    /// request may still use it. A buffer of another context of this process is refused and
    /// stays mapped, as one dropped without this call (its registrations are that context's).
    pub fn free_registered(&mut self, buf: RegisteredBuffer) -> Result<()> {
        self.world_mut().free_registered(buf)
    }

    /// The communicator of `space`: `ctx.in_space(&s)?.send(1, 7, b"x")`. A space this context
    /// cannot have made (its matching context is not among those this context gave out, or a
    /// split space does not hold this rank) is an [`crate::Error::InvalidArgument`]; a space of
    /// another `Context` of this process whose number is among them is not told apart. Called
    /// on a space, it gives another space of the same context (not a nested one: a space's
    /// ranks are always its own).
    pub fn in_space<'a>(&'a mut self, space: &'a Space) -> Result<InSpace<'a>> {
        let world = self.world_mut();
        world.check_space(space)?;
        Ok(Comm::new(Within { world, space }))
    }

    /// Sends `buf` to `to` with `tag`; returns when `buf` may be reused.
    #[inline(always)]
    pub fn send(&mut self, to: Rank, tag: u32, buf: &[u8]) -> Result<()> {
        self.send_typed(to, tag, buf)
    }

    /// [`Comm::send`] of plain-old-data elements (`&[f64]`, `&[u32]`, ...), as their bytes.
    #[inline(always)]
    pub fn send_typed<T: Pod>(&mut self, to: Rank, tag: u32, buf: &[T]) -> Result<()> {
        let (world, at) = self.parts();
        let to = at.job_rank(to)?;
        world.send_in(at.ctx, to, tag, pod::bytes(buf))
    }

    /// Receives into `buf` a message from `from` (a rank or [`Source::Any`]) whose tag matches
    /// `tag` (a tag or [`TagMatch::Any`]). A longer message is an [`crate::Error::Truncated`].
    ///
    /// Should the wait give up (the process manager died) while a live peer holds `buf`'s key
    /// (it may be writing there through cma, which cannot be revoked), or the peer holding it
    /// break the protocol (it may still run), the process stops with a message saying so
    /// rather than hand `buf` back under that write.
    #[inline(always)]
    pub fn recv(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>, buf: &mut [u8]) -> Result<Status> {
        self.recv_typed(from, tag, buf)
    }

    /// [`Comm::recv`] into plain-old-data elements. The status's `len` counts bytes (elements
    /// received: `len / size_of::<T>()`); a message whose length is not a whole number of
    /// elements is an [`crate::Error::InvalidArgument`] naming both sizes (its bytes were
    /// written into `buf`).
    #[inline(always)]
    pub fn recv_typed<T: Pod>(
        &mut self,
        from: impl Into<Source>,
        tag: impl Into<TagMatch>,
        buf: &mut [T],
    ) -> Result<Status> {
        let (world, at) = self.parts();
        let from = at.source(from.into())?;
        let status = world.recv_in(at.ctx, from, tag.into(), pod::bytes_mut(buf))?;
        pod::whole::<T>(at.status(status)?)
    }

    /// Sends `send_buf` to `to` with `send_tag` and receives into `recv_buf` from `from` with
    /// `recv_tag` at once (`MPI_Sendrecv`): neither waits for the other, so ranks that exchange
    /// with each other (a ring shift, a halo) cannot deadlock whatever the sizes. The receive's
    /// status; a longer message is an [`crate::Error::Truncated`].
    pub fn sendrecv(
        &mut self,
        to: Rank,
        send_tag: u32,
        send_buf: &[u8],
        from: impl Into<Source>,
        recv_tag: impl Into<TagMatch>,
        recv_buf: &mut [u8],
    ) -> Result<Status> {
        self.sendrecv_typed(to, send_tag, send_buf, from, recv_tag, recv_buf)
    }

    /// [`Comm::sendrecv`] of plain-old-data elements; the received length is checked as in
    /// [`Comm::recv_typed`].
    pub fn sendrecv_typed<T: Pod>(
        &mut self,
        to: Rank,
        send_tag: u32,
        send_buf: &[T],
        from: impl Into<Source>,
        recv_tag: impl Into<TagMatch>,
        recv_buf: &mut [T],
    ) -> Result<Status> {
        let (from, recv_tag) = (from.into(), recv_tag.into());
        {
            // A rank outside the space is refused before anything starts.
            let (_, at) = self.parts_ref();
            at.job_rank(to)?;
            at.source(from)?;
        }
        self.scope(|s| {
            let received = s.irecv_typed(from, recv_tag, recv_buf)?;
            let sent = match s.isend_typed(to, send_tag, send_buf) {
                Ok(sent) => sent,
                Err(e) => {
                    // Not left for the scope's end to wait for: its message may never come.
                    // One that matched already is waited for there, and ends.
                    let _ = s.cancel(received);
                    return Err(e);
                }
            };
            // Both are waited for, then the receive's error (if any) comes first.
            let (status, sent) = (s.wait(received), s.wait(sent));
            let status = status?;
            sent.map(|_| status)
        })
    }

    /// Starts sending `buf` (owned by the request until it finishes). A small eager message
    /// leaves at once when the channel has room; its request is then finished already.
    #[inline]
    pub fn isend(&mut self, to: Rank, tag: u32, buf: Vec<u8>) -> Result<Request> {
        self.isend_typed(to, tag, buf)
    }

    /// [`Comm::isend`] of a vector of plain-old-data elements (`Vec<f64>`, `Vec<u32>`, ...);
    /// [`Comm::wait`] gives it back.
    #[inline]
    pub fn isend_typed<T: Pod>(&mut self, to: Rank, tag: u32, buf: Vec<T>) -> Result<Request<T>> {
        let (world, at) = self.parts();
        let to = at.job_rank(to)?;
        let req = world.isend_in(at.ctx, to, tag, buf)?;
        at.request(req)
    }

    /// Starts receiving into `buf` (owned by the request until it finishes); the message may
    /// be at most `buf.len()` bytes. When a matching eager message is here already, it is
    /// copied at once and the request is finished already.
    #[inline]
    pub fn irecv(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>, buf: Vec<u8>) -> Result<Request> {
        self.irecv_typed(from, tag, buf)
    }

    /// [`Comm::irecv`] into a vector of plain-old-data elements; [`Comm::wait`] gives it back
    /// whole, and checks the received length as [`Comm::recv_typed`] does.
    #[inline]
    pub fn irecv_typed<T: Pod>(
        &mut self,
        from: impl Into<Source>,
        tag: impl Into<TagMatch>,
        buf: Vec<T>,
    ) -> Result<Request<T>> {
        let (world, at) = self.parts();
        let from = at.source(from.into())?;
        let req = world.irecv_in(at.ctx, from, tag.into(), buf)?;
        at.request(req)
    }

    /// Starts sending `len` bytes at `ptr`, for runtimes that manage their own memory (the
    /// buffer given back by [`Comm::wait`] is empty). Several sends may share one buffer.
    ///
    /// # Safety
    /// The memory must stay valid and unmodified until the request was waited for (or, for a
    /// request dropped without a wait, until the context ends).
    #[inline]
    pub unsafe fn isend_raw(&mut self, to: Rank, tag: u32, ptr: *const u8, len: usize) -> Result<Request> {
        let (world, at) = self.parts();
        let to = at.job_rank(to)?;
        // SAFETY: forwarded to the caller.
        let req = unsafe { world.isend_raw_in(at.ctx, to, tag, ptr, len)? };
        at.request(req)
    }

    /// Starts receiving into `len` bytes at `ptr`; see [`Comm::isend_raw`].
    ///
    /// # Safety
    /// The memory must stay valid, and not be read or written by anyone else, until the request was
    /// waited for (or, for a request dropped without a wait, until the context ends). (Benchmarks
    /// that let several receives write one buffer, as OSU's do, get unspecified contents in it,
    /// nothing worse.) Should its wait give up while a live peer holds the buffer's key, the
    /// process stops, as in [`Comm::recv`]. A receive left unwaited whose withdrawal at finalize
    /// its peer does not answer in time may yet be written by that peer (a warning says so): that
    /// memory must never be reused. Buffers of [`Comm::irecv`] are kept out of use in both cases
    /// by polyrail itself.
    #[inline]
    pub unsafe fn irecv_raw(
        &mut self,
        from: impl Into<Source>,
        tag: impl Into<TagMatch>,
        ptr: *mut u8,
        len: usize,
    ) -> Result<Request> {
        let (world, at) = self.parts();
        let from = at.source(from.into())?;
        // SAFETY: forwarded to the caller.
        let req = unsafe { world.irecv_raw_in(at.ctx, from, tag.into(), RegionMut { ptr, len })? };
        at.request(req)
    }

    /// Waits until a message matching `(from, tag)` can be received; returns its status
    /// without receiving it.
    pub fn probe(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        let (world, at) = self.parts();
        let from = at.source(from.into())?;
        let status = world.probe_in(at.ctx, from, tag.into())?;
        at.status(status)
    }

    /// Whether a message matching `(from, tag)` can be received now, and its status. An error
    /// when none is here and the rank named (for [`Source::Any`], a rank that may send in the
    /// space) was lost: a loop of probes ends as a wait would. A rank that finished is no error
    /// (`None`: what it sent before it finished was matched already).
    pub fn iprobe(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Option<Status>> {
        let (world, at) = self.parts();
        let from = at.source(from.into())?;
        let status = world.iprobe_in(at.ctx, from, tag.into())?;
        status.map(|s| at.status(s)).transpose()
    }

    /// Waits until every rank of the communicator called `barrier` on it (a dissemination
    /// barrier over the channels).
    pub fn barrier(&mut self) -> Result<()> {
        let (world, at) = self.parts();
        world.barrier_in(at.members(), at.control())
    }

    /// Waits for a request; gives back its status and buffer. For a typed receive, a length
    /// that is not a whole number of elements is an error, as in [`Comm::recv_typed`].
    #[inline]
    pub fn wait<T: Pod>(&mut self, req: Request<T>) -> Result<Completion<T>> {
        self.world_mut().wait(req)
    }

    /// Cancels a receive that no message has matched yet (`MPI_Cancel`), e.g. an ANY_SOURCE
    /// receive for control messages at shutdown: [`Cancel::Cancelled`] gives its buffer back.
    /// A send and a matched or finished receive are given back as [`Cancel::NotCancelled`].
    ///
    /// A large receive posted before its message gave the sender its buffer's key (so the
    /// data can be written straight into it), and so may one posted before it: then the
    /// sender is asked to drop the key, and this waits for its answer (a round trip, or the
    /// peer's loss). A message that matches the receive meanwhile wins: `NotCancelled`, and
    /// the receive finishes with it. Should that wait fail, the receive is given up as after a
    /// failed [`Comm::wait`] (a buffer the peer may still write is kept out of use, or, for
    /// a raw one, the process stops).
    pub fn cancel<T: Pod>(&mut self, req: Request<T>) -> Result<Cancel<T>> {
        self.world_mut().cancel(req)
    }

    /// Makes progress once; whether `req` finished (then [`Comm::wait`] returns at once). A
    /// request whose peer was lost counts as finished (its wait gives the error): a loop of
    /// tests checks the peers' liveness every so often, as a wait does, and fails when the
    /// process manager is gone.
    pub fn test<T>(&mut self, req: &Request<T>) -> Result<bool> {
        self.world_mut().test_all_of(std::slice::from_ref(req))
    }

    /// Waits until one of `reqs` has finished (or failed) and returns its index; its result is
    /// then taken with [`Comm::wait`], which returns at once. The first finished request in
    /// `reqs` order is named. A request that failed (e.g. its peer was lost) counts as
    /// finished: `wait` returns its error. An empty `reqs` is an
    /// [`crate::Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # fn main() -> polyrail::Result<()> {
    /// # let mut ctx = polyrail::Context::init()?;
    /// let mut reqs = Vec::new();
    /// for peer in 1..ctx.size() {
    ///     reqs.push(ctx.irecv(peer, 0, vec![0u8; 4096])?);
    /// }
    /// while !reqs.is_empty() {
    ///     let i = ctx.wait_any(&reqs)?;
    ///     let done = ctx.wait(reqs.swap_remove(i))?;
    ///     println!("{} bytes from rank {}", done.status.len, done.status.source);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_any<T>(&mut self, reqs: &[Request<T>]) -> Result<usize> {
        self.world_mut().wait_any_of(reqs)
    }

    /// Makes progress once; the index of the first of `reqs` that has finished (or failed), if
    /// any (then [`Comm::wait`] on it returns at once).
    pub fn test_any<T>(&mut self, reqs: &[Request<T>]) -> Result<Option<usize>> {
        self.world_mut().test_any_of(reqs)
    }

    /// Makes progress once; whether every one of `reqs` has finished (or failed): then
    /// [`Comm::wait_all`] returns at once.
    pub fn test_all<T>(&mut self, reqs: &[Request<T>]) -> Result<bool> {
        self.world_mut().test_all_of(reqs)
    }

    /// Waits for every request; the completions are in the order of `reqs`. If any failed, all
    /// are still waited for and the first error is returned (an error of the waiting itself, a
    /// channel failing or the process manager gone, abandons the unfinished ones).
    pub fn wait_all<T: Pod>(&mut self, reqs: Vec<Request<T>>) -> Result<Vec<Completion<T>>> {
        self.world_mut().wait_all(reqs)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Cancel, Comm, CommKind, Config, Context, Error, Source, TagMatch};
    use polyrail_pmi::Singleton;

    fn alone() -> Context {
        Context::init_with_bootstrap(Config::default(), Box::new(Singleton::new())).unwrap()
    }

    fn floats(salt: u32, len: usize) -> Vec<f64> {
        (0..len).map(|i| f64::from(salt) * 1000.5 + i as f64 * 0.25).collect()
    }

    fn words(salt: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| i.wrapping_mul(2654435761) ^ salt).collect()
    }

    /// Every call of one generic function, on whichever communicator it is given: bytes and
    /// typed messages, blocking, owned, scoped, exchanged and probed.
    fn every_call(c: &mut Comm<impl CommKind>, salt: u32) -> crate::Result<()> {
        let me = c.rank();
        assert_eq!((me, c.size()), (0, 1));
        for len in [0usize, 3, 1000, 100_000] {
            // Blocking sends to this rank itself only when eager: a larger one waits for its
            // receive, which would come after it.
            let small = len < 100;
            let w = c.isend(me, 1, vec![salt as u8; len])?;
            let mut bytes = vec![0u8; len];
            assert_eq!(c.recv(me, 1, &mut bytes)?.len, len);
            assert!(bytes.iter().all(|&b| b == salt as u8));
            c.wait(w)?;

            let w = match small {
                true => c.send_typed(me, 2, &floats(salt, len)).map(|()| None)?,
                false => Some(c.isend_typed(me, 2, floats(salt, len))?),
            };
            assert_eq!(c.probe(Source::Any, 2)?.len, len * 8);
            let mut got = vec![0.0f64; len];
            let st = c.recv_typed(me, 2, &mut got)?;
            assert_eq!((st.source, st.tag, st.len), (me, 2, len * 8));
            assert_eq!(got, floats(salt, len));
            if let Some(w) = w {
                c.wait(w)?;
            }

            let r = c.irecv_typed(me, TagMatch::Any, vec![0u32; len])?;
            let s = c.isend_typed(me, 3, words(salt, len))?;
            let done = c.wait(r)?;
            assert_eq!((done.status.tag, done.status.len), (3, len * 4));
            assert_eq!(done.buf, words(salt, len));
            assert_eq!(c.wait(s)?.buf, words(salt, len), "a typed send gives its vector back");

            let mut back = vec![0.0f64; len];
            let st = c.sendrecv_typed(me, 4, &floats(salt + 1, len), me, 4, &mut back)?;
            assert_eq!(st.len, len * 8);
            assert_eq!(back, floats(salt + 1, len));

            let out = words(salt + 2, len);
            let mut into = vec![0u32; len];
            c.scope(|s| {
                let r = s.irecv_typed(me, 5, &mut into)?;
                let w = s.isend_typed(me, 5, &out)?;
                s.wait_all(vec![r, w]).map(|_| ())
            })?;
            assert_eq!(into, out);
        }
        c.barrier()?;
        assert!(c.iprobe(me, TagMatch::Any)?.is_none(), "every message was taken");
        Ok(())
    }

    /// One generic function serves the world, a whole-job space and a split space, and the
    /// messages of each stay in it.
    #[test]
    fn one_generic_function_works_in_the_world_and_in_spaces() {
        let mut ctx = alone();
        let dup = ctx.new_space().unwrap();
        let split = ctx.split(Some(1), 0).unwrap().expect("a color was given");
        ctx.send_typed(0, 2, &[9.0f64]).unwrap(); // a world message of a tag the spaces use
        every_call(&mut ctx.in_space(&dup).unwrap(), 10).unwrap();
        every_call(&mut ctx.in_space(&split).unwrap(), 20).unwrap();
        let mut one = [0.0f64];
        ctx.recv_typed(0, 2, &mut one).unwrap();
        assert_eq!(one, [9.0]);
        every_call(&mut ctx, 30).unwrap();
        // A request started in a space is waited for through the world, and the other way.
        let r = ctx.in_space(&split).unwrap().irecv_typed(0, 6, vec![0u32; 2]).unwrap();
        ctx.in_space(&split).unwrap().send_typed(0, 6, &[1u32, 2]).unwrap();
        assert_eq!(ctx.wait(r).unwrap().buf, [1, 2]);
        let r = ctx.irecv_typed(0, 7, vec![0u16; 2]).unwrap();
        ctx.send_typed(0, 7, &[3u16, 4]).unwrap();
        assert_eq!(ctx.in_space(&dup).unwrap().wait(r).unwrap().buf, [3, 4]);
        ctx.finalize().unwrap();
    }

    fn not_whole<T: std::fmt::Debug>(r: crate::Result<T>) -> bool {
        matches!(r, Err(Error::InvalidArgument(ref m)) if m.contains("12-byte") && m.contains("8-byte"))
    }

    /// A message whose length is not a whole number of the receive's elements is an error naming
    /// both sizes, on every way to receive, never a panic; the context goes on.
    #[test]
    fn a_length_that_is_not_whole_elements_is_an_error() {
        let mut ctx = alone();
        let twelve = [7u8; 12];
        ctx.send(0, 1, &twelve).unwrap();
        let mut f = [0.0f64; 2];
        assert!(not_whole(ctx.recv_typed(0, 1, &mut f)));
        // Here already when the receive starts, and arriving after it.
        ctx.send(0, 1, &twelve).unwrap();
        let r = ctx.irecv_typed(0, 1, vec![0.0f64; 2]).unwrap();
        assert!(not_whole(ctx.wait(r)));
        let r = ctx.irecv_typed(0, 1, vec![0.0f64; 2]).unwrap();
        ctx.send(0, 1, &twelve).unwrap();
        assert!(not_whole(ctx.wait_all(vec![r])));
        ctx.scope(|s| {
            let r = s.irecv_typed(0, 1, &mut f).unwrap();
            let w = s.isend(0, 1, &twelve).unwrap();
            assert!(not_whole(s.wait_all(vec![r, w])));
        });
        ctx.send(0, 8, &twelve).unwrap();
        assert!(not_whole(ctx.sendrecv_typed(0, 9, &[1.0f64], 0, 8, &mut f)));
        assert_eq!(ctx.recv_typed(0, 9, &mut f).unwrap().len, 8, "sendrecv's send went");
        // A longer message is still truncated, in bytes.
        ctx.send_typed(0, 1, &[1.0f64; 3]).unwrap();
        assert!(matches!(ctx.recv_typed(0, 1, &mut f), Err(Error::Truncated { len: 24, capacity: 16, .. })));
        // A whole number of elements fewer than the buffer holds is fine.
        ctx.send_typed(0, 1, &[5.0f64]).unwrap();
        assert_eq!(ctx.recv_typed(0, 1, &mut f).unwrap().len, 8);
        assert_eq!(f[0], 5.0);
        ctx.finalize().unwrap();
    }

    /// Typed requests that are cancelled give their vector back; dropped ones free theirs as the
    /// type they were (many, so that the context sweeps them).
    #[test]
    fn typed_requests_cancel_and_drop() {
        let mut ctx = alone();
        let r = ctx.irecv_typed(0, 5, vec![2.5f64; 4]).unwrap();
        match ctx.cancel(r).unwrap() {
            Cancel::Cancelled(buf) => assert_eq!(buf, [2.5; 4]),
            Cancel::NotCancelled(_) => panic!("an unmatched receive was not cancelled"),
        }
        for i in 0..500u32 {
            drop(ctx.irecv_typed(0, 6, vec![0u64; 3]).unwrap());
            drop(ctx.isend_typed(0, 7, vec![i; 40_000]).unwrap()); // rendezvous: runs until received
            ctx.send_typed(0, 6, &[u64::from(i); 3]).unwrap();
            let mut got = vec![0u32; 40_000];
            ctx.recv_typed(0, 7, &mut got).unwrap();
            assert!(got.iter().all(|&x| x == i));
        }
        ctx.finalize().unwrap();
    }
}
