//! This process's endpoint in the job: [`World`] (the channels, the engine, the requests'
//! buffers) and [`Context`], the communicator over the whole job. The calls themselves are
//! [`Comm`]'s, written once for the world and every space; here are the engine-level
//! operations they reach, in a matching context and with job ranks.

use crate::buffer::RegisteredBuffer;
use crate::comm::Comm;
use crate::dropped::DropBox;
use crate::heap::HeapRegistrations;
use crate::pod::{self, Owned};
use crate::space::{status_in, Members, Space, SplitEntry};
use bytemuck::Pod;
use polyrail_core::engine::{
    CancelRecv, Engine, Finalize, Outgoing, Posted, RecvPath, ReqId, ReqPhase, Setting, Source, SpaceId, Status,
    TagMatch,
};
use polyrail_core::{Config, Error, Rank, Region, RegionMut, Result};
use polyrail_pmi::Bootstrap;
use polyrail_runtime::{Driver, Job, JobReport, ParkedEnd};
use std::io::Write;
use std::sync::Arc;

/// Context id of the barrier's messages, and of whole-job splits'.
pub(crate) const BARRIER_CTX: u16 = 1;
const _: () = assert!(BARRIER_CTX != Space::WORLD.ctx && BARRIER_CTX < Space::FIRST_MADE);
/// Tag of a split's messages in its space's control context (the barrier's tags are its
/// rounds, below 32).
const SPLIT_TAG: u32 = u32::MAX;
/// How long the end of a scope whose closure panicked waits for the requests it left.
pub(crate) const UNWIND_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Requests detached before the context first looks for finished ones among them.
const SWEEP_MIN: usize = 64;
/// How long finalize waits for unfinished sends.
const FINALIZE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A non-blocking send or receive in flight, or one that finished when it started (a small eager
/// send that left at once, a receive whose message was here). Finish it with [`Comm::wait`]
/// (which gives the buffer back) or poll it with [`Comm::test`], on the context that made it or
/// any space of it (another context of the process refuses it with [`Error::InvalidArgument`]).
/// `T` is the element type of its buffer: bytes unless it was started with
/// [`Comm::isend_typed`] or [`Comm::irecv_typed`].
///
/// Dropping a `Request` detaches it (`MPI_Request_free`): the transfer still completes, and the
/// context frees the request and its buffer after it finished: at once if it finished when it was
/// started; else when the context, starting a request, holds at least 64 dropped ones and twice as
/// many as its last look through them left (so fewer than 64 may stay until the context ends). Its
/// result, an error included, goes nowhere. (A dropped [`crate::ScopedRequest`] is waited for by
/// its scope's end instead.) The buffer is owned by the context meanwhile, so it cannot be freed or
/// reused under the transfer (the memory of a raw request, [`Comm::isend_raw`], must stay valid
/// until the context ends). A call that refuses a request made by another context consumes it as a
/// drop does.
#[derive(Debug)]
#[must_use = "a request must be waited for to get its buffer and its result"]
pub struct Request<T = u8> {
    state: RequestState<T>,
    /// Started in a [`crate::Scope`], whose end waits for it: its drop hands nothing back
    /// (the scope's end takes its result, so an id handed back would outlive the request).
    scoped: bool,
}

/// What [`World::take_buf_or`] does when a peer may still write a raw request's memory.
#[derive(Clone, Copy)]
enum LentRaw {
    /// Stops the process: the memory is about to go back to the caller.
    Stop,
    /// Warns: the caller keeps the memory until the context ends (a dropped request's).
    Warn,
}

/// Which [`World`] of this process made a request (engine ids are only unique inside one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ContextMark(u32);

impl ContextMark {
    fn next() -> ContextMark {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        // Relaxed: only uniqueness matters, which the atomic increment gives in any order.
        ContextMark(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

#[derive(Debug)]
enum RequestState<T> {
    /// In the engine of the context marked so: running, or finished with its result not taken
    /// yet. Started in a split [`Space`], it carries the space's ranks, which its status is to
    /// name.
    Engine(ReqId, ContextMark, Option<Arc<Members>>),
    /// Finished when it was started (an eager send that left at once, a receive whose message
    /// was here already): nothing runs, the buffer is free again.
    Done(Completion<T>),
    /// [`RequestState::Done`] for a raw operation, which has no buffer to give back: the
    /// smallest thing to hand back from a small `isend_raw`, which makes many.
    Finished(Status),
}

impl<T> Drop for Request<T> {
    fn drop(&mut self) {
        match self.state {
            RequestState::Engine(id, mark, _) if !self.scoped => DropBox::post(mark, id),
            _ => {}
        }
    }
}

impl<T> Request<T> {
    /// Its state, leaving nothing for its drop to hand back (it is being waited for, or
    /// cancelled).
    fn into_state(mut self) -> RequestState<T> {
        std::mem::replace(&mut self.state, RequestState::Finished(Status { source: 0, tag: 0, len: 0 }))
    }

    /// Consumes a request that needs no more: its result was taken, or it was cancelled.
    fn disarm(self) {
        self.into_state();
    }

    /// The request, started in a scope (whose end waits for it, should it be dropped).
    pub(crate) fn scoped(mut self) -> Request<T> {
        self.scoped = true;
        self
    }

    /// An operation that finished when it started, with `status`; `buf` is given back.
    fn done(status: Status, buf: Vec<T>) -> Request<T> {
        Request { state: RequestState::Done(Completion { status, buf }), scoped: false }
    }

    /// A raw operation that finished when it started, with `status`.
    fn finished(status: Status) -> Request<T> {
        Request { state: RequestState::Finished(status), scoped: false }
    }

    /// The request, started in the space of `members` (with job ranks): its status is to name
    /// ranks of that space.
    pub(crate) fn in_space(self, members: Option<&Arc<Members>>) -> Result<Request<T>> {
        let Some(m) = members else { return Ok(self) };
        let scoped = self.scoped;
        let state = match self.into_state() {
            RequestState::Engine(id, mark, _) => RequestState::Engine(id, mark, Some(Arc::clone(m))),
            RequestState::Done(mut done) => {
                done.status = m.status(done.status)?;
                RequestState::Done(done)
            }
            RequestState::Finished(status) => RequestState::Finished(m.status(status)?),
        };
        Ok(Request { state, scoped })
    }

    /// The engine's request, unless the operation finished when it was started.
    pub(crate) fn engine_id(&self) -> Option<ReqId> {
        match self.state {
            RequestState::Engine(id, ..) => Some(id),
            RequestState::Done(_) | RequestState::Finished(_) => None,
        }
    }

    /// An error unless the request was made by the context marked `mark` (or needs none).
    fn check_made_by(&self, mark: ContextMark) -> Result<()> {
        match self.state {
            RequestState::Engine(_, m, _) if m != mark => {
                Err(Error::InvalidArgument("the request was made by another Context of this process".into()))
            }
            _ => Ok(()),
        }
    }

    /// Whether it has finished (or failed) in `engine`.
    fn has_finished(&self, engine: &Engine) -> bool {
        self.engine_id().is_none_or(|id| engine.phase(id).is_done())
    }
}

// A runtime may start the context on one thread and use it on another.
const _: () = {
    const fn send<T: Send>() {}
    send::<Context>();
    send::<Request>();
    send::<Request<f64>>();
};

/// Requests to look through more than once, from a slice or from a collection holding them.
pub(crate) trait Requests<'r, T: 'r>: IntoIterator<Item = &'r Request<T>> + Clone {}

impl<'r, T: 'r, I: IntoIterator<Item = &'r Request<T>> + Clone> Requests<'r, T> for I {}

/// Index of the first of `reqs` that has finished (or failed).
fn first_finished<'r, T: 'r>(engine: &Engine, reqs: impl Requests<'r, T>) -> Option<usize> {
    reqs.into_iter().position(|r| r.has_finished(engine))
}

/// What [`Comm::cancel`] did with a request.
#[derive(Debug)]
#[must_use = "a request that was not cancelled must still be waited for"]
pub enum Cancel<T = u8> {
    /// The receive was withdrawn before any message matched it; its buffer (empty for a raw
    /// receive). A message meant for it goes to the next matching receive.
    Cancelled(Vec<T>),
    /// It could not be cancelled (a send; a receive that a message matched or that finished,
    /// also while it was being withdrawn; a receive whose peer was lost): wait for it as
    /// before.
    NotCancelled(Request<T>),
}

/// A finished non-blocking operation: its status and its buffer.
#[derive(Debug)]
pub struct Completion<T = u8> {
    /// Source, tag and length in bytes of the message (for sends: the destination, the tag and
    /// the length sent).
    pub status: Status,
    /// The buffer given to `isend`/`irecv` (or their `_typed` forms), whole.
    pub buf: Vec<T>,
}

/// One process's endpoint in a job: its channels, its engine (matching and requests) and the
/// buffers its requests own. It is reached through a communicator: [`Context`], which owns it
/// and spans the whole job, or a space of it ([`crate::InSpace`]).
pub struct World {
    driver: Driver,
    bootstrap: Box<dyn Bootstrap>,
    report: JobReport,
    config: Config,
    /// Buffers of non-blocking requests, by request index.
    owned: Vec<Option<Owned>>,
    /// Blocks of the [`crate::MappedHeap`] registered with the channels.
    heap: HeapRegistrations,
    /// Carried by this context's requests.
    mark: ContextMark,
    /// Where requests of this context dropped while running are handed back.
    dropped: Arc<DropBox>,
    /// Requests handed back that may still run; freed once they finish.
    detached: Vec<ReqId>,
    /// The length of `detached` at which it is next looked through.
    sweep_at: usize,
    /// Matching contexts given out by [`Context::new_space`] so far.
    spaces: u16,
    /// The highest matching context not given to a split space yet.
    next_split: u16,
    finalized: bool,
}

/// One process's endpoint in a job, as the communicator of the whole job: its rank, the job
/// size and point-to-point messaging ([`Comm`]'s calls, the same as in every space), and what
/// only the whole job does: start, make spaces, finish.
///
/// Created once per process with [`Context::init`]; dropped at the end of the program (which
/// finishes outstanding sends and tells the process manager that this rank ends normally).
/// It may move to another thread (`Send`, as its requests may), but its calls take `&mut self`:
/// one thread at a time, as MPI's `MPI_THREAD_SERIALIZED`.
pub type Context = Comm<World>;

impl Context {
    /// Joins the job described by the environment: a PMI process manager (`polyrail run`,
    /// `mpiexec.hydra`, `srun --mpi=pmi2`) or, without one, a job of size 1. Configuration
    /// comes from the `POLYRAIL_*` variables.
    pub fn init() -> Result<Context> {
        Self::init_with(Config::from_env()?)
    }

    /// Like [`Context::init`] with an explicit configuration.
    pub fn init_with(config: Config) -> Result<Context> {
        World::start(config, None).map(Comm::new)
    }

    /// Joins a job through an explicit bootstrap (e.g. from `polyrail_cli::launch::spawn_peers`, or
    /// a runtime's own process manager) instead of the environment's.
    pub fn init_with_bootstrap(config: Config, bootstrap: Box<dyn Bootstrap>) -> Result<Context> {
        World::start(config, Some(bootstrap)).map(Comm::new)
    }

    /// Makes a new matching [`Space`] over the whole job. Every rank must make its spaces in
    /// the same order (the n-th space of each rank is the same space): like `MPI_Comm_dup`, but
    /// without a message. Spaces made here and by splits share 65534 matching contexts (a split
    /// takes two); beyond, an [`Error::InvalidArgument`].
    pub fn new_space(&mut self) -> Result<Space> {
        let world = self.world_mut();
        let ctx = u32::from(Space::FIRST_MADE) + u32::from(world.spaces);
        let Some(ctx) = u16::try_from(ctx).ok().filter(|&c| c <= world.next_split) else {
            return Err(Error::InvalidArgument(format!(
                "no matching context left for a new space ({} made, the splits took {})",
                world.spaces,
                Space::FIRST_SPLIT - world.next_split
            )));
        };
        world.spaces += 1;
        Ok(Space { ctx, members: None })
    }

    /// Finishes: withdraws receives that matched nothing, waits (at most 10 s) for the other
    /// outstanding requests, tells peers and the process manager that this rank ends normally.
    /// Called by `drop`; call it to see its error.
    pub fn finalize(mut self) -> Result<()> {
        self.world_mut().finish()
    }
}

impl World {
    /// [`Comm::alloc_registered`].
    pub(crate) fn alloc_registered(&mut self, len: usize) -> Result<RegisteredBuffer> {
        let buf = RegisteredBuffer::map(len, self.mark)?;
        if let Err(e) = self.driver.register_memory(buf.region(), buf.file()) {
            buf.unmap();
            return Err(e);
        }
        Ok(buf)
    }

    /// [`Comm::free_registered`].
    pub(crate) fn free_registered(&mut self, buf: RegisteredBuffer) -> Result<()> {
        if buf.made_by() != self.mark {
            drop(buf);
            return Err(Error::InvalidArgument(
                "free_registered: the buffer was allocated by another Context of this process; it stays mapped".into(),
            ));
        }
        self.driver.unregister_memory(buf.region());
        buf.unmap();
        Ok(())
    }

    fn start(config: Config, boot: Option<Box<dyn Bootstrap>>) -> Result<World> {
        polyrail_runtime::log::init(config.log);
        let Job { bootstrap, driver, report, config } = Job::start(&crate::channels(), config, boot)?;
        let mark = ContextMark::next();
        let mut world = World {
            driver,
            bootstrap,
            report,
            config,
            owned: Vec::new(),
            heap: HeapRegistrations::default(),
            mark,
            dropped: DropBox::open(mark),
            detached: Vec::new(),
            sweep_at: SWEEP_MIN,
            spaces: 0,
            next_split: Space::FIRST_SPLIT,
            finalized: false,
        };
        world.barrier_in(None, BARRIER_CTX)?;
        Job::connected(&mut world.driver, &mut world.report)?;
        Ok(world)
    }

    /// This process's rank in the job.
    pub(crate) fn rank(&self) -> Rank {
        self.bootstrap.rank()
    }

    /// Number of processes in the job.
    pub(crate) fn size(&self) -> u32 {
        self.bootstrap.size()
    }

    /// The configuration in use.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// What the job learned at start.
    pub(crate) fn report(&self) -> &JobReport {
        &self.report
    }

    /// An [`Error::InvalidArgument`] unless this context can have made `space` (see
    /// [`Comm::in_space`]).
    pub(crate) fn check_space(&self, space: &Space) -> Result<()> {
        let made = match &space.members {
            None => {
                space.ctx == Space::WORLD.ctx
                    || space.ctx.checked_sub(Space::FIRST_MADE).is_some_and(|n| n < self.spaces)
            }
            Some(m) => space.ctx > self.next_split && m.my_job_rank() == Some(self.rank()),
        };
        if !made {
            return Err(Error::InvalidArgument(format!("space {} was not made by this context", space.ctx)));
        }
        Ok(())
    }

    /// Sends this rank's split entry (`color`, `key` and the next free split context) to the
    /// other ranks of a space (their job ranks `job`, this one at `me`) in its `control`
    /// context, and receives theirs: every entry, by rank in the space.
    pub(crate) fn exchange_split(
        &mut self,
        control: u16,
        me: Rank,
        job: &[Rank],
        color: Option<u32>,
        key: u32,
    ) -> Result<Vec<SplitEntry>> {
        let mine = SplitEntry { color, key, next: self.next_split };
        let mut sends = Vec::with_capacity(job.len());
        for (r, &to) in job.iter().enumerate() {
            if r != me as usize {
                sends.push(self.isend_in(control, to, SPLIT_TAG, mine.encode().to_vec())?);
            }
        }
        let mut entries = Vec::with_capacity(job.len());
        // One byte more than an entry, so that a longer message is malformed, not truncated.
        let mut buf = [0u8; SplitEntry::LEN + 1];
        for (r, &from) in job.iter().enumerate() {
            if r == me as usize {
                entries.push(mine);
                continue;
            }
            let st = self.recv_in(control, Source::Rank(from), TagMatch::Tag(SPLIT_TAG), &mut buf)?;
            entries.push(SplitEntry::decode(from, &buf[..st.len])?);
        }
        self.wait_all(sends)?;
        Ok(entries)
    }

    /// Tells the engine that only `members` (job ranks) send in matching context `ctx`.
    pub(crate) fn note_members(&mut self, ctx: u16, members: &[Rank]) {
        self.driver.engine.set(Setting::SpaceMembers(SpaceId(ctx), members));
    }

    /// Gives matching contexts `ctx` and `ctx - 1` to the spaces of a split that every rank of
    /// its space agreed on; later splits take lower ones.
    pub(crate) fn take_split_contexts(&mut self, ctx: u16) -> Result<()> {
        if u32::from(ctx) <= u32::from(Space::FIRST_MADE) + u32::from(self.spaces) {
            return Err(Error::InvalidArgument(format!(
                "no matching context left for a split ({} spaces made, the splits took {})",
                self.spaces,
                Space::FIRST_SPLIT - ctx
            )));
        }
        self.next_split = ctx - 2;
        Ok(())
    }

    /// Whether skew feedback has messages to job rank `peer` sent eagerly now.
    pub(crate) fn sends_eagerly_to(&self, peer: Rank) -> bool {
        self.driver.engine.peer(peer).is_ok_and(|p| p.adapters().skew.peer_lags())
    }

    /// Sends `buf` to job rank `to` in matching context `space`; returns when `buf` may be
    /// reused.
    #[inline]
    pub(crate) fn send_in(&mut self, space: u16, to: Rank, tag: u32, buf: &[u8]) -> Result<()> {
        self.heap.before_post(&mut self.driver, buf.as_ptr(), buf.len());
        if let Some(done) = self.driver.try_send_inline(to, tag, space, buf) {
            return done;
        }
        let msg = Outgoing::Message { tag, space: SpaceId(space) };
        // SAFETY: `buf` is borrowed until this function returns, and the request is waited for
        // (or failed, which ends every use of the buffer) before that.
        let id = unsafe { self.driver.engine.post_send(to, msg, region(buf))? };
        self.driver.drain();
        self.driver.wait(id).result.map(|_| ())
    }

    /// Receives into `buf` in matching context `space` (see [`Comm::recv`]); the status names
    /// the job rank of the sender.
    #[inline]
    pub(crate) fn recv_in(&mut self, space: u16, from: Source, tag: TagMatch, buf: &mut [u8]) -> Result<Status> {
        if let Source::Rank(r) = from {
            self.driver.before_recv(r, buf.len());
        }
        self.heap.before_post(&mut self.driver, buf.as_ptr(), buf.len());
        // SAFETY: `buf` is borrowed for the call; wait_parked ends the parked receive before
        // returning, and a request made (at once, or by the parked receive) is waited for (or
        // abandoned) below, as in `send_in`: it ends before `buf`'s borrow does.
        let posted =
            unsafe { self.driver.engine.post_recv(from, tag, SpaceId(space), region_mut(buf), RecvPath::Park)? };
        let id = match posted {
            Posted::Received(status) => {
                self.driver.drain(); // the skew feedback may have a packet to send
                return Ok(status);
            }
            Posted::Parked => {
                self.driver.drain(); // the skew feedback may have a packet to send
                match self.driver.wait_parked()? {
                    ParkedEnd::Received(status) => return Ok(status),
                    ParkedEnd::Request(id) => id,
                    ParkedEnd::Abandoned { why, peer_may_write } => {
                        if peer_may_write {
                            self.stop_for_lent_buffer();
                        }
                        return Err(why);
                    }
                }
            }
            Posted::Request(id) => {
                self.driver.drain();
                id
            }
        };
        let done = self.driver.wait(id);
        if done.peer_may_write {
            self.stop_for_lent_buffer();
        }
        done.result
    }

    /// Starts sending `buf` (owned by the request until it finishes) to job rank `to` in
    /// matching context `space`.
    #[inline]
    pub(crate) fn isend_in<T: Pod>(&mut self, space: u16, to: Rank, tag: u32, buf: Vec<T>) -> Result<Request<T>> {
        let bytes = pod::bytes(&buf);
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        self.heap.before_post(&mut self.driver, ptr, len);
        // SAFETY: if a request is made, the Vec is stored in `self.owned` until its result is
        // taken; its heap memory does not move when the Vec value moves.
        if let Some(started) = unsafe { self.driver.start_send_inline(to, tag, space, ptr, len) } {
            return Ok(match started? {
                None => Request::done(Status { source: to, tag, len }, buf),
                Some(id) => {
                    self.keep(id, buf);
                    self.request(id)
                }
            });
        }
        let msg = Outgoing::Message { tag, space: SpaceId(space) };
        // SAFETY: the Vec is stored in `self.owned` until the request's result is taken; its
        // heap memory does not move when the Vec value moves.
        let id = unsafe { self.driver.engine.post_send(to, msg, Region { ptr, len })? };
        self.keep(id, buf);
        self.driver.drain();
        Ok(self.request(id))
    }

    /// Starts receiving into `buf` (owned by the request until it finishes) in matching
    /// context `space`.
    #[inline]
    pub(crate) fn irecv_in<T: Pod>(
        &mut self,
        space: u16,
        from: Source,
        tag: TagMatch,
        mut buf: Vec<T>,
    ) -> Result<Request<T>> {
        let region = region_mut(pod::bytes_mut(&mut buf));
        if let Source::Rank(r) = from {
            self.driver.before_recv(r, region.len);
        }
        self.heap.before_post(&mut self.driver, region.ptr, region.len);
        // SAFETY: `buf` is owned here for the call, and as in `isend_in` for a request.
        let id = match unsafe { self.post_irecv(from, tag, space, region)? } {
            Posted::Received(status) => return Ok(Request::done(status, buf)),
            Posted::Request(id) => id,
            Posted::Parked => unreachable!("a non-blocking receive does not park"),
        };
        self.keep(id, buf);
        self.driver.drain();
        Ok(self.request(id))
    }

    /// Starts sending `len` bytes at `ptr` to job rank `to` in matching context `space`.
    ///
    /// # Safety
    /// As for [`Comm::isend_raw`].
    #[inline]
    pub(crate) unsafe fn isend_raw_in(
        &mut self,
        space: u16,
        to: Rank,
        tag: u32,
        ptr: *const u8,
        len: usize,
    ) -> Result<Request> {
        self.heap.before_post(&mut self.driver, ptr, len);
        // SAFETY: forwarded to the caller.
        if let Some(started) = unsafe { self.driver.start_send_inline(to, tag, space, ptr, len) } {
            return Ok(
                started?.map_or_else(|| Request::finished(Status { source: to, tag, len }), |id| self.request(id))
            );
        }
        let msg = Outgoing::Message { tag, space: SpaceId(space) };
        // SAFETY: forwarded to the caller.
        let id = unsafe { self.driver.engine.post_send(to, msg, Region { ptr, len })? };
        self.driver.drain();
        Ok(self.request(id))
    }

    /// Starts receiving into `region` in matching context `space`.
    ///
    /// # Safety
    /// As for [`Comm::irecv_raw`].
    #[inline]
    pub(crate) unsafe fn irecv_raw_in(
        &mut self,
        space: u16,
        from: Source,
        tag: TagMatch,
        region: RegionMut,
    ) -> Result<Request> {
        self.heap.before_post(&mut self.driver, region.ptr, region.len);
        if let Source::Rank(r) = from {
            self.driver.note_placement(r, region.len);
        }
        // SAFETY: forwarded to the caller.
        let id = match unsafe { self.post_irecv(from, tag, space, region)? } {
            Posted::Received(status) => return Ok(Request::finished(status)),
            Posted::Request(id) => id,
            Posted::Parked => unreachable!("a non-blocking receive does not park"),
        };
        self.driver.drain();
        Ok(self.request(id))
    }

    /// Posts a non-blocking receive ([`Engine::post_recv`] with [`RecvPath::Arrived`], which
    /// never parks): the matching message, when it was here already, is copied into `buf`
    /// without a request; else the receive is a request.
    ///
    /// # Safety
    /// `buf` is valid for writes of `buf.len` bytes during the call and, for a request, as
    /// [`Engine::post_recv`] requires.
    #[inline]
    unsafe fn post_irecv(&mut self, from: Source, tag: TagMatch, ctx: u16, buf: RegionMut) -> Result<Posted> {
        // SAFETY: forwarded to the caller.
        let posted = unsafe { self.driver.engine.post_recv(from, tag, SpaceId(ctx), buf, RecvPath::Arrived)? };
        if let Posted::Received(_) = posted {
            self.driver.drain(); // the skew feedback may have a packet to send
        }
        Ok(posted)
    }

    /// Holds `buf` for request `id` until its result is taken. The request handed out for
    /// `id` is a `Request<T>` of the same `T` ([`World::take_vec`] relies on it).
    #[inline]
    fn keep<T: Pod>(&mut self, id: ReqId, buf: Vec<T>) {
        let i = req_index(id);
        if self.owned.len() <= i {
            self.owned.resize_with(i + 1, || None);
        }
        self.owned[i] = Some(Owned::new(buf));
    }

    /// The buffer of `id`, whose result was taken (or which was abandoned), as the vector it
    /// was given as (empty for a raw request, or when it is kept out of use because a peer may
    /// still write there, `peer_may_write`; see [`World::take_buf_or`]).
    ///
    /// # Safety
    /// `T` is the element type of `id`'s request: a `Request<T>` made by this context for
    /// `id`, whose buffer, if any, [`World::keep`] holds as the `Vec<T>` it was given.
    #[inline]
    unsafe fn take_vec<T: Pod>(&mut self, id: ReqId, peer_may_write: bool) -> Vec<T> {
        let buf = self.take_buf_or(id, peer_may_write, LentRaw::Stop);
        // SAFETY: forwarded to the caller.
        buf.map(|b| unsafe { b.into_vec() }).unwrap_or_default()
    }

    /// The buffer of `id`, whose result was taken (or which was abandoned): when a peer may
    /// still write there (`peer_may_write`, as the engine said when the request ended), an
    /// owned one is kept out of use (`None` comes back); a raw one then stops the process or,
    /// for a request dropped unwaited, whose memory the caller keeps until the context ends,
    /// warns.
    fn take_buf_or(&mut self, id: ReqId, peer_may_write: bool, lent_raw: LentRaw) -> Option<Owned> {
        let buf = self.owned.get_mut(req_index(id)).and_then(Option::take);
        if peer_may_write {
            match (buf, lent_raw) {
                (Some(buf), _) => self.quarantine(1, vec![buf]),
                (None, LentRaw::Stop) => self.stop_for_lent_buffer(),
                (None, LentRaw::Warn) => self.quarantine(1, Vec::new()),
            }
            return None;
        }
        buf
    }

    /// Waits for request `id` of a scope whose closure panicked until `deadline` (the scope's
    /// end gives its requests [`UNWIND_WAIT`] in all); then stops the process. Its buffer is
    /// borrowed and about to be given back to unwinding code, and a request a failing program
    /// left behind may never end (a receive whose peer waits for what this process was to send
    /// first): stopping ends the job, as the panic was to, where waiting on would hang it.
    pub(crate) fn wait_while_unwinding(&mut self, id: ReqId, deadline: std::time::Instant) {
        let _ = self.driver.wait_until(|e| e.phase(id).is_done() || std::time::Instant::now() >= deadline);
        if !self.driver.engine.phase(id).is_done() && std::time::Instant::now() >= deadline {
            tracing::error!(
                "rank {}: a scope's closure panicked and left a request that did not end within {} s \
                 (a receive nothing matches?); its buffer is borrowed, so the process stops",
                self.rank(),
                UNWIND_WAIT.as_secs()
            );
            std::process::abort();
        }
    }

    /// Ends the process: a receive into a buffer the caller keeps (borrowed, or raw) failed
    /// while a peer that may still run held the buffer's key: waiting for that peer gave up
    /// (the process manager died and the peer did not finish within the driver's 10 s), or the
    /// peer was lost for breaking the protocol. Returning would hand the caller memory the peer
    /// may still write (a cma write cannot be revoked); unlike an owned buffer, it cannot be
    /// kept out of use, so the process stops instead.
    #[cold]
    fn stop_for_lent_buffer(&self) -> ! {
        let why = format!(
            "rank {}: a failed receive's buffer may yet be written (a peer that may still run, alive \
             or lost for breaking the protocol, holds its key, or the receive's own read is still in \
             flight); the buffer is the caller's and cannot be kept out of use, so the process stops \
             rather than hand it back",
            self.rank()
        );
        // Logged at error level, which every POLYRAIL_LOG setting shows; not `eprintln!`, which
        // panics when stderr is gone (as it is when the launcher died).
        tracing::error!("{why}");
        std::process::abort()
    }

    /// Leaks `bufs`, the owned buffers of `receives` receives that failed after their keys went
    /// to live peers: those may still write there, so the memory must never be reused.
    fn quarantine(&self, receives: usize, bufs: Vec<Owned>) {
        let bytes: usize = bufs.iter().map(Owned::capacity_bytes).sum();
        let kept = match bytes {
            0 => "the caller's buffer must not be reused".to_string(),
            n => format!("{n} B of buffers kept out of use"),
        };
        tracing::warn!(
            "rank {}: {receives} failed receive(s) may yet be written (a peer that may still run holds the key, or a read is in flight); {kept}",
            self.rank()
        );
        bufs.into_iter().for_each(std::mem::forget);
    }

    /// [`Comm::wait`]: the status names ranks of the space the request was started in.
    pub(crate) fn wait<T: Pod>(&mut self, req: Request<T>) -> Result<Completion<T>> {
        req.check_made_by(self.mark)?;
        match req.into_state() {
            RequestState::Engine(id, _, members) => {
                let done = self.driver.wait(id);
                // SAFETY: `req` was a `Request<T>` of this context for `id`.
                let buf = unsafe { self.take_vec::<T>(id, done.peer_may_write) };
                let status = pod::whole::<T>(status_in(members.as_deref(), done.result?)?)?;
                Ok(Completion { status, buf })
            }
            RequestState::Done(done) => pod::whole::<T>(done.status).map(|_| done),
            RequestState::Finished(status) => Ok(Completion { status, buf: Vec::new() }),
        }
    }

    /// [`Comm::cancel`].
    pub(crate) fn cancel<T: Pod>(&mut self, req: Request<T>) -> Result<Cancel<T>> {
        req.check_made_by(self.mark)?;
        let RequestState::Engine(id, ..) = req.state else { return Ok(Cancel::NotCancelled(req)) };
        // Withdrawn, and whether a peer may still write its buffer (never for one withdrawn at
        // once: no peer held its key).
        let withdrawn = match self.driver.engine.cancel_recv(id) {
            CancelRecv::Cancelled => Some(false),
            CancelRecv::NotCancelled => None,
            CancelRecv::Asked => {
                self.driver.drain();
                if let Err(e) = self.driver.wait_until(|e| e.phase(id) != ReqPhase::Posted) {
                    // As a failed wait: the receive is given up, and a buffer a peer may still
                    // write is kept out of use (or, the caller's, stops the process).
                    let peer_may_write = self.driver.abandon(id);
                    drop(self.take_buf_or(id, peer_may_write, LentRaw::Stop));
                    req.disarm();
                    return Err(e);
                }
                (self.driver.engine.phase(id) == ReqPhase::Withdrawn).then(|| self.driver.engine.discard(id))
            }
        };
        let Some(peer_may_write) = withdrawn else { return Ok(Cancel::NotCancelled(req)) };
        req.disarm();
        // SAFETY: `req` was a `Request<T>` of this context for `id`.
        Ok(Cancel::Cancelled(unsafe { self.take_vec::<T>(id, peer_may_write) }))
    }

    /// [`Comm::wait_any`] over requests held in a slice or elsewhere (a [`crate::Scope`]'s).
    pub(crate) fn wait_any_of<'r, T: 'r>(&mut self, reqs: impl Requests<'r, T>) -> Result<usize> {
        self.check_made_here(reqs.clone())?;
        if reqs.clone().into_iter().next().is_none() {
            return Err(Error::InvalidArgument("wait_any was given no request to wait for".into()));
        }
        let mut found = None;
        self.driver.wait_until(|e| {
            found = first_finished(e, reqs.clone());
            found.is_some()
        })?;
        found.ok_or_else(|| Error::InvalidArgument("wait_any ended without a finished request".into()))
    }

    /// [`Comm::test_any`] over requests held in a slice or elsewhere.
    pub(crate) fn test_any_of<'r, T: 'r>(&mut self, reqs: impl Requests<'r, T>) -> Result<Option<usize>> {
        self.check_made_here(reqs.clone())?;
        if let Some(i) = first_finished(&self.driver.engine, reqs.clone()) {
            return Ok(Some(i));
        }
        self.driver.poll()?;
        Ok(first_finished(&self.driver.engine, reqs))
    }

    /// [`Comm::test_all`] over requests held in a slice or elsewhere.
    pub(crate) fn test_all_of<'r, T: 'r>(&mut self, reqs: impl Requests<'r, T>) -> Result<bool> {
        self.check_made_here(reqs.clone())?;
        let all_done = |e: &Engine| reqs.clone().into_iter().all(|r| r.has_finished(e));
        if all_done(&self.driver.engine) {
            return Ok(true);
        }
        self.driver.poll()?;
        Ok(all_done(&self.driver.engine))
    }

    /// An error if one of `reqs` was made by another context of this process: its engine id
    /// would name whatever request has that id here.
    fn check_made_here<'r, T: 'r>(&self, reqs: impl Requests<'r, T>) -> Result<()> {
        reqs.into_iter().try_for_each(|r| r.check_made_by(self.mark))
    }

    /// A request of this context for the engine's `id`, whose buffer (if any) is a `Vec<T>`
    /// held by [`World::keep`]. Takes the requests dropped since the last one, and frees the
    /// finished ones among them when enough are held.
    #[inline]
    pub(crate) fn request<T>(&mut self, id: ReqId) -> Request<T> {
        if self.dropped.pending() {
            self.free_dropped();
        }
        Request { state: RequestState::Engine(id, self.mark, None), scoped: false }
    }

    /// Takes the requests dropped since the last call; when it holds at least 64 and twice as
    /// many as its last look left, frees those that have finished: their results go nowhere,
    /// their buffers are freed (or kept out of use, should a peer still hold their key). Each
    /// drop costs O(1) in all. Out of line, so that starting a request stays small (inlined, osu_bw
    /// 4 KiB measured 2-4 % lower in alternating runs).
    #[cold]
    #[inline(never)]
    fn free_dropped(&mut self) {
        self.dropped.take_into(&mut self.detached);
        if self.detached.len() < self.sweep_at {
            return;
        }
        let mut detached = std::mem::take(&mut self.detached);
        detached.retain(|&id| {
            if !self.driver.engine.phase(id).is_done() {
                return true;
            }
            // Its dropped handle was the only one, so nothing else took the result.
            let done = self.driver.engine.take_result(id);
            if let Some(Err(e)) = done.as_ref().map(|d| &d.result) {
                tracing::debug!("rank {}: a dropped request failed: {e}", self.rank());
            }
            let peer_may_write = done.is_some_and(|d| d.peer_may_write);
            drop(self.take_buf_or(id, peer_may_write, LentRaw::Warn));
            false
        });
        self.sweep_at = SWEEP_MIN.max(2 * detached.len());
        self.detached = detached;
    }

    /// [`Comm::wait_all`].
    pub(crate) fn wait_all<T: Pod>(&mut self, reqs: Vec<Request<T>>) -> Result<Vec<Completion<T>>> {
        self.check_made_here(&reqs)?;
        let mut ids = Vec::with_capacity(reqs.len());
        ids.extend(reqs.iter().filter_map(Request::engine_id));
        // Requests finish roughly in order: skip past the finished prefix instead of checking
        // every request on every poll.
        let mut next = 0;
        let waited = self.driver.wait_until(|e| {
            while next < ids.len() && e.phase(ids[next]).is_done() {
                next += 1;
            }
            next == ids.len()
        });
        // Abandoned requests whose buffers a peer may still write.
        let mut lent = Vec::new();
        if waited.is_err() {
            for &id in &ids {
                if !self.driver.engine.phase(id).is_done() && self.driver.abandon(id) {
                    lent.push(id);
                }
            }
        }
        let mut out = Vec::with_capacity(reqs.len());
        let mut first_err = waited.err();
        for req in reqs {
            let (id, members) = match req.into_state() {
                RequestState::Engine(id, _, members) => (id, members),
                RequestState::Done(done) => {
                    match pod::whole::<T>(done.status) {
                        Ok(_) => out.push(done),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                    continue;
                }
                RequestState::Finished(status) => {
                    out.push(Completion { status, buf: Vec::new() });
                    continue;
                }
            };
            let done = self.driver.engine.take_result(id);
            let peer_may_write = lent.contains(&id) || done.as_ref().is_some_and(|d| d.peer_may_write);
            // SAFETY: `req` was a `Request<T>` of this context for `id`.
            let buf = unsafe { self.take_vec::<T>(id, peer_may_write) };
            let result = done.map(|d| d.result);
            match result.map(|r| r.and_then(|status| pod::whole::<T>(status_in(members.as_deref(), status)?))) {
                Some(Ok(status)) => out.push(Completion { status, buf }),
                Some(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                None => {
                    first_err.get_or_insert_with(|| Error::InvalidArgument("request did not finish".into()));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// [`Comm::probe`] in matching context `space`, with job ranks.
    pub(crate) fn probe_in(&mut self, space: u16, from: Source, tag: TagMatch) -> Result<Status> {
        self.check_source(from)?;
        let mut found = None;
        let mut never = None;
        self.driver.probing(|d| {
            d.wait_until(|e| {
                let probe = e.probe(from, tag, SpaceId(space));
                found = probe.found;
                never = probe.found.is_none().then(|| probe.never()).flatten();
                found.is_some() || never.is_some()
            })
        })?;
        found.ok_or_else(|| never.unwrap_or(Error::InvalidArgument("a probe ended without a message".into())))
    }

    /// [`Comm::iprobe`] in matching context `space`, with job ranks.
    pub(crate) fn iprobe_in(&mut self, space: u16, from: Source, tag: TagMatch) -> Result<Option<Status>> {
        self.check_source(from)?;
        if let Some(s) = self.driver.engine.probe(from, tag, SpaceId(space)).found {
            return Ok(Some(s));
        }
        self.driver.probing(Driver::poll)?;
        let probe = self.driver.engine.probe(from, tag, SpaceId(space));
        match probe.found {
            None => probe.lost().map_or(Ok(None), Err),
            found => Ok(found),
        }
    }

    /// A rank outside the job is an error (a probe for it would never end).
    fn check_source(&self, from: Source) -> Result<()> {
        match from {
            Source::Rank(r) => self.driver.engine.peer(r).map(|_| ()),
            Source::Any => Ok(()),
        }
    }

    /// A barrier among the ranks of a space: the whole job (in [`BARRIER_CTX`]) when `members`
    /// is `None`, else those members in the space's `control` context.
    pub(crate) fn barrier_in(&mut self, members: Option<&Members>, control: u16) -> Result<()> {
        match members {
            None => {
                let (me, n) = (self.rank(), self.size());
                self.barrier_among(BARRIER_CTX, me, n, |r| r)
            }
            Some(m) => self.barrier_among(control, m.me, m.job.len() as u32, |r| m.job[r as usize]),
        }
    }

    /// A dissemination barrier in matching context `ctx` among `n` ranks numbered from 0,
    /// this one `me`; `job` gives their job ranks.
    fn barrier_among(&mut self, ctx: u16, me: Rank, n: u32, job: impl Fn(Rank) -> Rank) -> Result<()> {
        let mut dist = 1;
        let mut round = 0;
        while dist < n {
            let to = job((me + dist) % n);
            let from = job((me + n - dist) % n);
            let msg = Outgoing::Message { tag: round, space: SpaceId(ctx) };
            // SAFETY: an empty buffer; nothing can be read or written through it.
            let s = unsafe { self.driver.engine.post_send(to, msg, region(&[]))? };
            self.driver.drain();
            if let Err(e) = self.recv_in(ctx, Source::Rank(from), TagMatch::Tag(round), &mut []) {
                self.driver.abandon(s); // its slot is not left behind
                return Err(e);
            }
            self.driver.wait(s).result?;
            dist *= 2;
            round += 1;
        }
        Ok(())
    }

    /// [`Context::finalize`], once (later calls do nothing).
    fn finish(&mut self) -> Result<()> {
        if self.finalized {
            return Ok(());
        }
        self.finalized = true;
        let cancelled = self.driver.engine.finalize(Finalize::Withdraw).receives;
        if cancelled > 0 {
            tracing::warn!("rank {}: finalize withdrew {cancelled} receive(s) that matched no message", self.rank());
        }
        self.driver.drain();
        let deadline = std::time::Instant::now() + FINALIZE_WAIT;
        let waited = self.driver.wait_until(|e| e.activity().running == 0 || std::time::Instant::now() > deadline);
        // Receives whose senders did not answer their withdrawal in time (or when waiting
        // failed), or still hold their keys, keep their buffers out of use.
        let exposed = self.driver.engine.finalize(Finalize::Abandon).peer_may_write;
        if !exposed.is_empty() {
            let bufs =
                exposed.iter().filter_map(|&id| self.owned.get_mut(req_index(id)).and_then(Option::take)).collect();
            self.quarantine(exposed.len(), bufs);
        }
        let drained = waited.and_then(|()| match self.driver.engine.activity().running {
            0 => Ok(()),
            n => Err(Error::InvalidArgument(format!(
                "{n} request(s) still unfinished after {} s at finalize: sends their receivers never matched, \
                 or receives whose data never came",
                FINALIZE_WAIT.as_secs()
            ))),
        });
        for ch in &mut self.driver.channels {
            ch.finalize();
        }
        let fin = self.bootstrap.finalize();
        drained.and(fin)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            // Not `eprintln!`, which panics when stderr is gone (as it is when the launcher
            // died, a common cause of this error): a panic in drop while unwinding aborts.
            let _ = writeln!(std::io::stderr(), "polyrail: rank {}: finalize: {e}", self.rank());
        }
        DropBox::close(self.mark);
    }
}

fn req_index(id: ReqId) -> usize {
    id.slot()
}

fn region(buf: &[u8]) -> Region {
    Region { ptr: buf.as_ptr(), len: buf.len() }
}

fn region_mut(buf: &mut [u8]) -> RegionMut {
    RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polyrail_pmi::Singleton;

    fn alone() -> Context {
        Context::init_with_bootstrap(Config::default(), Box::new(Singleton::new())).unwrap()
    }

    fn refused<T: std::fmt::Debug>(r: Result<T>) -> bool {
        matches!(r, Err(Error::InvalidArgument(ref m)) if m.contains("another Context"))
    }

    /// Requests dropped while they ran (here or on another thread) still complete, and are
    /// freed with their buffers after they finished: a program that drops its requests holds
    /// a bounded number of them, not one per message until the context ends.
    #[test]
    fn dropped_requests_complete_and_are_freed() {
        let mut ctx = alone();
        let mut buf = [0u8; 8];
        for i in 0..1000u32 {
            let r = ctx.irecv(0, 5, vec![0u8; 8]).unwrap();
            if i % 2 == 0 {
                drop(r);
            } else {
                std::thread::spawn(move || drop(r)).join().unwrap();
            }
            ctx.send(0, 5, &i.to_le_bytes()).unwrap(); // matches the dropped receive
            ctx.send(0, 6, &i.to_le_bytes()).unwrap();
            ctx.recv(0, 6, &mut buf).unwrap(); // the next message is not taken by it
            assert_eq!(buf[..4], i.to_le_bytes());
        }
        let big = vec![7u8; 1 << 20];
        for _ in 0..200 {
            drop(ctx.isend(0, 9, big.clone()).unwrap()); // rendezvous: runs until received
            let mut got = vec![0u8; 1 << 20];
            assert_eq!(ctx.recv(0, 9, &mut got).unwrap().len, 1 << 20);
            assert!(got == big, "a dropped send delivered its message");
        }
        let live = ctx.kind.driver.engine.activity().requests;
        let kept = ctx.kind.owned.iter().flatten().count();
        assert!(live <= 2 * SWEEP_MIN && kept <= 2 * SWEEP_MIN, "{live} requests and {kept} buffers held");
        ctx.finalize().unwrap();
    }

    /// A scope's request dropped unwaited is waited for by the scope's end, not handed back
    /// to the context (which would free it a second time, or, its id's generation wrapping,
    /// another request that took its slot).
    #[test]
    fn a_dropped_scoped_request_is_left_to_its_scope() {
        let mut ctx = alone();
        let mut buf = [0u8; 8];
        ctx.scope(|s| -> Result<()> {
            drop(s.irecv(0, 5, &mut buf)?);
            s.wait(s.isend(0, 5, b"late")?)?;
            Ok(())
        })
        .unwrap();
        assert_eq!(&buf[..4], b"late");
        assert!(!ctx.kind.dropped.pending() && ctx.kind.detached.is_empty(), "the scope's request was handed back");
        ctx.finalize().unwrap();
    }

    /// A receive nothing matched is withdrawn with its buffer, and the message meant for it goes
    /// to the next receive; a send and a finished receive are not cancelled.
    #[test]
    fn cancel_withdraws_an_unmatched_receive() {
        let mut ctx = alone();
        let r = ctx.irecv(0, 5, vec![1u8; 8]).unwrap();
        match ctx.cancel(r).unwrap() {
            Cancel::Cancelled(buf) => assert_eq!(buf, [1u8; 8], "the buffer comes back untouched"),
            Cancel::NotCancelled(_) => panic!("an unmatched receive was not cancelled"),
        }
        let s = ctx.isend(0, 5, b"after".to_vec()).unwrap();
        let Cancel::NotCancelled(s) = ctx.cancel(s).unwrap() else { panic!("a send was cancelled") };
        ctx.wait(s).unwrap();
        ctx.probe(0, 5).unwrap(); // delivered from the loopback channel: the receive matches it
        let r = ctx.irecv(0, 5, vec![0u8; 8]).unwrap();
        let Cancel::NotCancelled(r) = ctx.cancel(r).unwrap() else { panic!("a matched receive was cancelled") };
        let done = ctx.wait(r).unwrap();
        assert_eq!(&done.buf[..done.status.len], b"after");
        ctx.finalize().unwrap();
    }

    /// Engine ids are per context: a request waited for in another context of the process is
    /// refused instead of naming whatever request has its id there.
    #[test]
    fn a_request_of_another_context_is_refused() {
        let (mut a, mut b) = (alone(), alone());
        let from_a = a.irecv(0, 5, vec![0u8; 8]).unwrap();
        let in_b = b.irecv(0, 5, vec![0u8; 8]).unwrap();
        assert_eq!(from_a.engine_id(), in_b.engine_id(), "the test needs the same id in both engines");
        assert!(refused(b.test(&from_a)));
        assert!(refused(b.test_any(std::slice::from_ref(&from_a))));
        assert!(refused(b.test_all(std::slice::from_ref(&from_a))));
        assert!(refused(b.wait_any(std::slice::from_ref(&from_a))));
        assert!(refused(b.cancel(from_a)));
        let from_a = a.irecv(0, 5, vec![0u8; 8]).unwrap(); // the refused one is gone (detached)
        b.send(0, 5, b"to b").unwrap();
        assert!(refused(b.wait(from_a)));
        let done = b.wait(in_b).unwrap();
        assert_eq!(&done.buf[..done.status.len], b"to b");
        let again = a.irecv(0, 6, vec![0u8; 8]).unwrap();
        assert!(refused(b.wait_all(vec![again])));
        // A registered buffer likewise: only the context that registered it ends that.
        let buf = a.alloc_registered(4096).unwrap();
        assert!(refused(b.free_registered(buf)));
        let mine = a.alloc_registered(4096).unwrap();
        a.free_registered(mine).unwrap();
        a.finalize().unwrap();
        b.finalize().unwrap();
    }

    /// Messages of different spaces never meet, whatever the tags; each space keeps its own
    /// order; a space the context did not make is refused.
    #[test]
    fn spaces_keep_their_messages_apart() {
        let mut ctx = alone();
        let (a, b) = (ctx.new_space().unwrap(), ctx.new_space().unwrap());
        assert_ne!(a, b);
        ctx.in_space(&a).unwrap().send(0, 5, b"in a").unwrap();
        ctx.send(0, 5, b"world").unwrap();
        ctx.in_space(&a).unwrap().send(0, 6, b"a again").unwrap();
        let mut buf = [0u8; 8];
        assert!(ctx.in_space(&b).unwrap().iprobe(0, TagMatch::Any).unwrap().is_none());
        let r = ctx.in_space(&b).unwrap().irecv(Source::Any, TagMatch::Any, vec![0u8; 8]).unwrap();
        let st = ctx.recv(0, TagMatch::Any, &mut buf).unwrap();
        assert_eq!(&buf[..st.len], b"world");
        let mut space_a = ctx.in_space(&a).unwrap();
        assert_eq!(space_a.probe(0, TagMatch::Any).unwrap().tag, 5);
        let st = space_a.recv(0, TagMatch::Any, &mut buf).unwrap();
        assert_eq!((&buf[..st.len], st.tag), (&b"in a"[..], 5));
        let st = space_a.recv(0, TagMatch::Any, &mut buf).unwrap();
        assert_eq!((&buf[..st.len], st.tag), (&b"a again"[..], 6));
        assert!(!ctx.test(&r).unwrap(), "nothing was sent in space b");
        ctx.in_space(&b).unwrap().send(0, 9, b"in b").unwrap();
        let done = ctx.wait(r).unwrap();
        assert_eq!(&done.buf[..done.status.len], b"in b");
        // sendrecv and a scope in a space, with a world message waiting that they must not take.
        ctx.send(0, 4, b"world 2").unwrap();
        let st = ctx.in_space(&a).unwrap().sendrecv(0, 3, b"swap", Source::Any, TagMatch::Any, &mut buf).unwrap();
        assert_eq!((&buf[..st.len], st.tag), (&b"swap"[..], 3));
        let mut scoped = [0u8; 8];
        let st = ctx
            .in_space(&b)
            .unwrap()
            .scope(|s| {
                let r = s.irecv(0, TagMatch::Any, &mut scoped)?;
                let w = s.isend(0, 8, b"scoped")?;
                let st = s.wait(r)?;
                s.wait(w).map(|_| st)
            })
            .unwrap();
        assert_eq!(&scoped[..st.len], b"scoped");
        let st = ctx.recv(0, TagMatch::Any, &mut buf).unwrap();
        assert_eq!(&buf[..st.len], b"world 2");
        assert!(matches!(ctx.in_space(&Space { ctx: b.ctx + 1, members: None }), Err(Error::InvalidArgument(_))));
        let barrier = Space { ctx: BARRIER_CTX, members: None };
        assert!(ctx.in_space(&barrier).is_err(), "the barrier's context is no space");
        ctx.finalize().unwrap();
    }

    /// A job of one splits into a space of one (or none); its messages stay apart from the
    /// world's; contexts run out with an error, not a wrap.
    #[test]
    fn a_split_space_keeps_its_messages_and_contexts_run_out_cleanly() {
        let mut ctx = alone();
        assert!(ctx.split(None, 0).unwrap().is_none());
        let s = ctx.split(Some(3), 9).unwrap().expect("a color was given");
        assert_eq!(s.job_ranks(), Some(&[0][..]));
        let before = ctx.new_space().unwrap();
        assert_ne!(before.ctx, s.ctx);
        ctx.send(0, 5, b"world").unwrap();
        let mut in_s = ctx.in_space(&s).unwrap();
        assert_eq!((in_s.rank(), in_s.size()), (0, 1));
        in_s.send(0, 5, b"split").unwrap();
        assert!(matches!(in_s.send(1, 5, b"x"), Err(Error::InvalidArgument(_))), "no rank 1 in the space");
        let r = in_s.irecv(Source::Any, TagMatch::Any, vec![0u8; 8]).unwrap();
        in_s.barrier().unwrap();
        let done = ctx.wait(r).unwrap();
        assert_eq!((&done.buf[..done.status.len], done.status.source), (&b"split"[..], 0));
        let mut buf = [0u8; 8];
        let st = ctx.recv(0, 5, &mut buf).unwrap();
        assert_eq!(&buf[..st.len], b"world");
        // Take every context left: the last new space or split is refused, nothing wraps.
        let mut made = 0;
        while ctx.split(Some(0), 0).is_ok_and(|s| s.is_some()) {
            made += 1;
        }
        assert!(made > 30_000, "{made} splits");
        while ctx.new_space().is_ok() {}
        assert!(matches!(ctx.split(Some(0), 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(ctx.new_space(), Err(Error::InvalidArgument(_))));
        assert!(ctx.in_space(&s).is_ok() && ctx.in_space(&before).is_ok());
        ctx.finalize().unwrap();
    }
}
