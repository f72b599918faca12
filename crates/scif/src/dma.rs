//! The DMA engine: a thread of the process that runs RMAs posted without `RMA_USECPU`, reports
//! them complete when the [`Pacer`] says, and writes fence signals once what they wait for
//! completed. A co-processor's DMA engine moves the bytes without a host CPU; here a CPU does,
//! and [`DmaStats::cpu`] says how much time it took.

use crate::conn::Conn;
use crate::window::Seg;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes the engine copies between two checks that the peer is alive.
const CHUNK: usize = 1 << 20;
/// Transfers from this size on are split between the engine's two channels (as a DMA engine
/// spreads a large transfer over its channels); smaller ones run on one.
const SPLIT_FROM: usize = 512 << 10;
/// In [`DmaMode::Reverse`], how long after the last post the engine waits for more before it
/// runs the queue (a fence or a synchronous RMA runs it at once): long enough that a test's
/// posts land in one batch on a loaded machine.
const GATHER: Duration = Duration::from_millis(100);
/// How often the engine looks again at signals that wait for the peer.
const SIGNAL_POLL: Duration = Duration::from_millis(1);
/// How often the engine reads what the peers of live connections sent: their window records
/// stay drained (a peer's register never waits for room) and a lost peer is noticed without a
/// call on its endpoint.
const WATCH: Duration = Duration::from_millis(20);

/// In which order the engine runs what was posted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DmaMode {
    /// First posted, first run: completions happen to come in order.
    #[default]
    InOrder,
    /// A test mode: the engine gathers what was posted and runs it last first, each transfer's
    /// pieces last first too, so RMAs without `RMA_ORDERED` complete out of order on purpose.
    /// An `RMA_ORDERED` RMA runs after every RMA posted before it, and writes its last cache line
    /// last.
    Reverse,
}

/// A transfer as a link model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The SCIF node the bytes leave.
    pub from: u16,
    /// The SCIF node the bytes reach.
    pub to: u16,
    /// How many bytes.
    pub bytes: usize,
    /// Whether the caller's CPU copied (`RMA_USECPU`) rather than the DMA engine.
    pub by_cpu: bool,
}

/// Says when a transfer completes: the hook for a link model (a transfer finishing at
/// max(posted, link busy until) + latency + bytes / bandwidth). The engine reports the transfer
/// complete at the returned time, never before its copy ended; it never sleeps in a post.
pub trait Pacer: Send + Sync {
    /// When `transfer`, posted at `posted` and whose copy ended at `copied`, completes. Called
    /// once per transfer, in the order the copies ran, on the thread that copied; must not block.
    fn complete_at(&self, transfer: &Transfer, posted: Instant, copied: Instant) -> Instant;
}

/// No link model: a transfer completes when its copy ends.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unpaced;

impl Pacer for Unpaced {
    fn complete_at(&self, _: &Transfer, _: Instant, copied: Instant) -> Instant {
        copied
    }
}

/// What the DMA engine did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaStats {
    /// Transfers the engine copied.
    pub transfers: u64,
    /// Bytes the engine copied.
    pub bytes: u64,
    /// CPU time of the engine's thread: work a co-processor's DMA engine does without a CPU.
    pub cpu: Duration,
    /// Transfers callers copied themselves (`RMA_USECPU`).
    pub cpu_transfers: u64,
    /// Bytes callers copied themselves.
    pub cpu_bytes: u64,
    /// Bytes of transfers whose source and destination differed mod 64 (a cache line): the
    /// engine copied them twice, through a temporary buffer, as SCIF's driver does where DMA
    /// cannot run between the two.
    pub unaligned_bytes: u64,
}

/// Bytes of a cache line: DMA runs between addresses equal mod this.
pub const CACHE_LINE: usize = 64;

/// Where bytes are: mapped in this process, or in a peer's ordinary memory (a window it
/// registered in place), which only the kernel's cross-process copy reaches.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Place {
    /// Mapped here.
    Here(*mut u8),
    /// At `addr` in process `pid`.
    Peer { pid: i32, addr: usize },
}

impl Place {
    /// Where it lies within its cache line.
    pub(crate) fn cache_offset(self) -> usize {
        match self {
            Place::Here(p) => p as usize % CACHE_LINE,
            Place::Peer { addr, .. } => addr % CACHE_LINE,
        }
    }

    /// The place `n` bytes further.
    pub(crate) fn offset(self, n: usize) -> Place {
        match self {
            // `wrapping_add`: only an address here; `pieces` keeps it inside its span.
            Place::Here(p) => Place::Here(p.wrapping_add(n)),
            Place::Peer { pid, addr } => Place::Peer { pid, addr: addr + n },
        }
    }
}

/// An address range the engine may copy from or to: a window's piece or a caller's buffer that
/// the caller keeps borrowed until the transfer completes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub at: Place,
    pub len: usize,
}

// SAFETY: a span is only an address; whoever makes one keeps the memory alive and unmoved until
// the transfer completes (segments in `Copy::keep`, a caller's buffer by waiting).
unsafe impl Send for Span {}

impl Span {
    /// `len` bytes mapped here from `ptr`.
    pub(crate) fn here(ptr: *mut u8, len: usize) -> Span {
        Span { at: Place::Here(ptr), len }
    }

    pub(crate) fn of(segs: &[Seg]) -> Vec<Span> {
        segs.iter().map(|s| Span { at: s.place(), len: s.len }).collect()
    }
}

/// Copies `n` bytes from `from` to `to`: a memory copy between mappings of this process, or
/// the kernel's cross-process copy (`process_vm_readv`/`process_vm_writev`, as a DMA engine
/// reaches a peer's pinned pages) when one side is a peer's memory. Says why not: the peer's
/// memory is not mapped there, or the kernel refuses (Yama, seccomp), or the peer is gone.
///
/// # Safety
/// `n` bytes at each `Place::Here` are mapped (and writable for `to`) for the call.
pub(crate) unsafe fn copy_piece(from: Place, to: Place, n: usize) -> Result<(), String> {
    let (local, remote, pid, write) = match (from, to) {
        (Place::Here(f), Place::Here(t)) => {
            // SAFETY: the caller's promise; `copy` allows the two to overlap (a window mapped twice).
            unsafe { std::ptr::copy(f, t, n) };
            return Ok(());
        }
        (Place::Peer { pid, addr }, Place::Here(t)) => (t, addr, pid, false),
        (Place::Here(f), Place::Peer { pid, addr }) => (f, addr, pid, true),
        (Place::Peer { .. }, Place::Peer { .. }) => return Err("a copy between two peers' memory".into()),
    };
    let mut done = 0;
    while done < n {
        let l = libc::iovec { iov_base: local.wrapping_add(done).cast(), iov_len: n - done };
        let r = libc::iovec { iov_base: (remote + done) as *mut libc::c_void, iov_len: n - done };
        // SAFETY: the local iovec is mapped for `n - done` bytes (the caller's promise); the
        // kernel checks the remote one against the peer's mappings and copies nothing outside.
        let got = unsafe {
            if write {
                libc::process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        let call = if write { "process_vm_writev" } else { "process_vm_readv" };
        match got {
            n if n > 0 => done += n as usize,
            0 => return Err(format!("{call} of pid {pid} at {:#x} copied nothing", remote + done)),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!("{call} of {} bytes of pid {pid} at {:#x}: {e}", n - done, remote + done));
            }
        }
    }
    Ok(())
}

/// One RMA for the engine.
pub(crate) struct Copy {
    pub conn: Arc<Conn>,
    pub seq: u64,
    pub src: Vec<Span>,
    pub dst: Vec<Span>,
    /// The windows the spans lie in, mapped until the copy ends.
    pub keep: Vec<Seg>,
    pub ordered: bool,
    pub transfer: Transfer,
    /// When the RMA was posted: a link model's transfer starts then.
    pub posted: Instant,
    /// Told when the engine is done with the spans (copied, abandoned or dropped): a caller
    /// whose buffer a span borrows waits for it before it returns.
    pub released: Option<Arc<Released>>,
}

/// Whether the engine is done with a job's spans.
#[derive(Debug, Default)]
pub(crate) struct Released {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Released {
    /// Waits until the engine let go of the job's spans. Never gives up: the caller's buffer
    /// must not be touched after the caller returns. The engine runs or drops every job it
    /// receives, and a job tells this when dropped.
    pub(crate) fn wait(&self) {
        let mut d = self.done.lock().unwrap();
        while !*d {
            d = self.cv.wait(d).unwrap();
        }
    }
}

impl Copy {
    /// The engine is done with the spans: tells a waiting caller.
    fn release(&mut self) {
        if let Some(r) = self.released.take() {
            *r.done.lock().unwrap() = true;
            r.cv.notify_all();
        }
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        self.release();
    }
}

/// What a fence signal waits for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum After {
    /// This endpoint's RMAs up to this sequence number.
    Mine(u64),
    /// The peer's RMAs up to this sequence number.
    Peers(u64),
}

/// A fence signal: values written (Release) once the RMAs it waits for completed.
pub(crate) struct Signal {
    pub conn: Arc<Conn>,
    pub after: After,
    pub writes: Vec<(Seg, u64)>,
}

struct Deferred {
    at: Instant,
    conn: Arc<Conn>,
    seq: u64,
}

impl PartialEq for Deferred {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl Eq for Deferred {}
impl PartialOrd for Deferred {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Deferred {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.cmp(&other.at)
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Copy>,
    deferred: BinaryHeap<Reverse<Deferred>>,
    signals: Vec<Signal>,
    last_post: Option<Instant>,
    kicked: bool,
    stop: bool,
}

struct Shared {
    st: Mutex<State>,
    /// The connections of this process, read every `WATCH`.
    watched: Mutex<Vec<Weak<Conn>>>,
    cv: Condvar,
    pacer: Arc<dyn Pacer>,
    mode: DmaMode,
    transfers: AtomicU64,
    bytes: AtomicU64,
    cpu_ns: AtomicU64,
    cpu_transfers: AtomicU64,
    cpu_bytes: AtomicU64,
    unaligned_bytes: AtomicU64,
    /// The second channel: takes half of a large transfer's pieces.
    lane: Mutex<Option<mpsc::Sender<LaneJob>>>,
    /// CPU time of the second channel's thread.
    lane_cpu_ns: Arc<AtomicU64>,
    /// CPU time callers spent running their synchronous RMAs ([`Engine::run_if_idle`]).
    caller_cpu_ns: AtomicU64,
}

/// Pieces for the engine's second channel, and where to say how the copy went.
struct LaneJob {
    parts: Vec<(Place, Place, usize)>,
    done: mpsc::Sender<Result<(), String>>,
}

// SAFETY: the places are addresses whose memory the job that owns them keeps mapped until the
// lane answered (the engine's thread waits for the answer before it releases the job).
unsafe impl Send for LaneJob {}

/// The second channel's thread: copies the pieces it is given, in order, until the engine goes.
fn run_lane(jobs: mpsc::Receiver<LaneJob>, cpu_ns: Arc<AtomicU64>) {
    while let Ok(job) = jobs.recv() {
        // SAFETY: each piece lies in memory the owning job keeps mapped until this answer.
        let copied = job.parts.into_iter().try_for_each(|(from, to, n)| unsafe { copy_piece(from, to, n) });
        let _ = job.done.send(copied);
        // Relaxed: a counter for reports.
        cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
    }
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

/// The engine: its threads run while the engine lives.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    lane: Option<JoinHandle<()>>,
}

impl Engine {
    pub(crate) fn start(mode: DmaMode, pacer: Arc<dyn Pacer>, name: String) -> std::io::Result<Engine> {
        let (lane_tx, lane_rx) = mpsc::channel();
        let lane_cpu_ns = Arc::new(AtomicU64::new(0));
        let cpu = lane_cpu_ns.clone();
        let lane = std::thread::Builder::new().name(format!("{name}.1")).spawn(move || run_lane(lane_rx, cpu))?;
        let shared = Arc::new(Shared {
            st: Mutex::new(State::default()),
            watched: Mutex::new(Vec::new()),
            cv: Condvar::new(),
            pacer,
            mode,
            transfers: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            cpu_transfers: AtomicU64::new(0),
            cpu_bytes: AtomicU64::new(0),
            unaligned_bytes: AtomicU64::new(0),
            lane: Mutex::new(Some(lane_tx)),
            lane_cpu_ns,
            caller_cpu_ns: AtomicU64::new(0),
        });
        let run = shared.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || run.run())?;
        Ok(Engine { shared, thread: Some(thread), lane: Some(lane) })
    }

    pub(crate) fn mode(&self) -> DmaMode {
        self.shared.mode
    }

    /// Queues an RMA; returns at once.
    pub(crate) fn post(&self, job: Copy) {
        let mut st = self.shared.st.lock().unwrap();
        st.queue.push_back(job);
        st.last_post = Some(Instant::now());
        self.shared.cv.notify_all();
    }

    /// Runs a synchronous, unordered RMA on the calling thread when the engine has nothing
    /// queued (in [`DmaMode::InOrder`]): the caller would only wait while the engine's thread
    /// copied, and handing the job over costs two wake-ups per transfer. The copy counts as the
    /// engine's (transfers, bytes, CPU time) and completes when the pacer says, as on the
    /// engine's thread. The caller's thread is one channel: a large transfer is not split with
    /// the second (two callers, the two halves of a message split between processes, already
    /// keep two CPUs copying). Hands the job back when the engine must run it.
    pub(crate) fn run_if_idle(&self, job: Copy) -> Option<Copy> {
        let s = &self.shared;
        if s.mode != DmaMode::InOrder || job.ordered || !s.st.lock().unwrap().queue.is_empty() {
            return Some(job);
        }
        let start = thread_cpu_ns();
        s.copy(job, false);
        // Relaxed: a counter for reports.
        s.caller_cpu_ns.fetch_add(thread_cpu_ns().saturating_sub(start), Ordering::Relaxed);
        None
    }

    /// Reads what the peer of `conn` sends every `WATCH` while `conn` lives.
    pub(crate) fn watch(&self, conn: &Arc<Conn>) {
        self.shared.watched.lock().unwrap().push(Arc::downgrade(conn));
    }

    /// Queues a fence signal.
    pub(crate) fn signal(&self, sig: Signal) {
        let mut st = self.shared.st.lock().unwrap();
        st.signals.push(sig);
        st.kicked = true;
        self.shared.cv.notify_all();
    }

    /// Runs what is queued without gathering more (a fence or a synchronous RMA waits on it).
    pub(crate) fn kick(&self) {
        let mut st = self.shared.st.lock().unwrap();
        if !st.kicked {
            st.kicked = true;
            self.shared.cv.notify_all();
        }
    }

    /// A copy the caller made itself (`RMA_USECPU`) from `posted` on: completes it when the pacer
    /// says.
    pub(crate) fn copied_by_cpu(&self, conn: &Arc<Conn>, seq: u64, transfer: Transfer, posted: Instant) {
        self.shared.cpu_transfers.fetch_add(1, Ordering::Relaxed);
        self.shared.cpu_bytes.fetch_add(transfer.bytes as u64, Ordering::Relaxed);
        let now = Instant::now();
        let at = self.shared.pacer.complete_at(&transfer, posted, now);
        if at <= now {
            conn.complete(seq);
        } else {
            let mut st = self.shared.st.lock().unwrap();
            st.deferred.push(Reverse(Deferred { at, conn: conn.clone(), seq }));
            self.shared.cv.notify_all();
        }
    }

    pub(crate) fn stats(&self) -> DmaStats {
        let s = &self.shared;
        // Relaxed: counters for reports, read without ordering against the copies.
        DmaStats {
            transfers: s.transfers.load(Ordering::Relaxed),
            bytes: s.bytes.load(Ordering::Relaxed),
            cpu: Duration::from_nanos(
                s.cpu_ns.load(Ordering::Relaxed)
                    + s.lane_cpu_ns.load(Ordering::Relaxed)
                    + s.caller_cpu_ns.load(Ordering::Relaxed),
            ),
            cpu_transfers: s.cpu_transfers.load(Ordering::Relaxed),
            cpu_bytes: s.cpu_bytes.load(Ordering::Relaxed),
            unaligned_bytes: s.unaligned_bytes.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.st.lock().unwrap().stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The second channel ends when its queue closes.
        drop(self.shared.lane.lock().unwrap().take());
        if let Some(t) = self.lane.take() {
            let _ = t.join();
        }
    }
}

/// Moves the pieces after the first `at` bytes of `parts` (splitting one if needed) into the
/// returned list.
fn split_at_bytes(parts: &mut Vec<(Place, Place, usize)>, at: usize) -> Vec<(Place, Place, usize)> {
    let mut seen = 0;
    for i in 0..parts.len() {
        let (from, to, n) = parts[i];
        if seen + n > at {
            let keep = at - seen;
            let mut rest = parts.split_off(i + 1);
            if keep == 0 {
                rest.insert(0, parts.pop().expect("piece i"));
            } else {
                parts[i].2 = keep;
                rest.insert(0, (from.offset(keep), to.offset(keep), n - keep));
            }
            return rest;
        }
        seen += n;
    }
    Vec::new()
}

/// Copies `len` bytes from `src` to `dst` (equal totals) as (from, to, len) pieces.
fn pieces(src: &[Span], dst: &[Span]) -> Vec<(Place, Place, usize)> {
    let mut out = Vec::with_capacity(src.len().max(dst.len()));
    let (mut i, mut j, mut si, mut dj) = (0, 0, 0usize, 0usize);
    while i < src.len() && j < dst.len() {
        let n = (src[i].len - si).min(dst[j].len - dj).min(CHUNK);
        // `si < src[i].len` and `dj < dst[j].len`: both stay inside their spans.
        out.push((src[i].at.offset(si), dst[j].at.offset(dj), n));
        si += n;
        dj += n;
        if si == src[i].len {
            i += 1;
            si = 0;
        }
        if dj == dst[j].len {
            j += 1;
            dj = 0;
        }
    }
    out
}

impl Shared {
    fn run(&self) {
        // Completions the pacer defers are due microseconds apart: wake at their time, not up
        // to the default 50 µs of timer slack later.
        // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only this thread's timers.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
        let mut st = self.st.lock().unwrap();
        let mut next_watch = Instant::now() + WATCH;
        loop {
            if st.stop {
                return;
            }
            let mut now = Instant::now();
            if now >= next_watch {
                drop(st);
                self.watch_all();
                st = self.st.lock().unwrap();
                now = Instant::now();
                next_watch = now + WATCH;
            }
            while st.deferred.peek().is_some_and(|d| d.0.at <= now) {
                let Reverse(d) = st.deferred.pop().unwrap();
                d.conn.complete(d.seq);
            }
            if !st.signals.is_empty() {
                let signals = std::mem::take(&mut st.signals);
                drop(st);
                let waiting: Vec<Signal> = signals.into_iter().filter_map(fire_if_ready).collect();
                st = self.st.lock().unwrap();
                st.signals.extend(waiting);
                self.note_cpu();
            }
            if let Some(job) = self.pick(&mut st, now) {
                drop(st);
                self.copy(job, true);
                self.note_cpu();
                st = self.st.lock().unwrap();
                continue;
            }
            let mut wait = next_watch.saturating_duration_since(now);
            if let Some(d) = st.deferred.peek() {
                wait = wait.min(d.0.at.saturating_duration_since(now));
            }
            if !st.signals.is_empty() {
                wait = wait.min(SIGNAL_POLL);
            }
            if !st.queue.is_empty() {
                let since = st.last_post.map_or(Duration::ZERO, |t| now.duration_since(t));
                wait = wait.min(GATHER.saturating_sub(since).max(Duration::from_millis(1)));
            }
            st = self.cv.wait_timeout(st, wait).unwrap().0;
        }
    }

    /// The next RMA to run, or `None` (in reverse mode, while posts may still come).
    fn pick(&self, st: &mut State, now: Instant) -> Option<Copy> {
        if st.queue.is_empty() {
            st.kicked = false;
            return None;
        }
        match self.mode {
            DmaMode::InOrder => st.queue.pop_front(),
            DmaMode::Reverse => {
                let gathering = st.last_post.is_some_and(|t| now.duration_since(t) < GATHER);
                if gathering && !st.kicked {
                    return None;
                }
                // Last first, but never past an ordered RMA: what was posted before it runs first.
                let i = match st.queue.iter().position(|j| j.ordered) {
                    Some(0) => 0,
                    Some(k) => k - 1,
                    None => st.queue.len() - 1,
                };
                st.queue.remove(i)
            }
        }
    }

    /// Copies `job` on this thread, from `SPLIT_FROM` bytes with the second channel when `split`,
    /// and completes it when the pacer says. Where source and destination differ mod
    /// [`CACHE_LINE`], every piece goes through a temporary buffer, on this thread.
    fn copy(&self, mut job: Copy, split: bool) {
        let total = job.transfer.bytes;
        let mut parts = pieces(&job.src, &job.dst);
        let unaligned = parts.first().is_some_and(|(from, to, _)| from.cache_offset() != to.cache_offset());
        let mut temp = if unaligned { vec![0u8; total.min(CHUNK)] } else { Vec::new() };
        let reverse = self.mode == DmaMode::Reverse && !job.ordered;
        if reverse {
            parts.reverse();
        }
        // A large transfer's second half goes to the second channel, unless it is busy or gone.
        let mut lane = None;
        if split && !unaligned && !reverse && total >= SPLIT_FROM {
            let half = split_at_bytes(&mut parts, (total / 2).next_multiple_of(4096));
            let (done, answer) = mpsc::channel();
            let work = LaneJob { parts: half, done };
            let sent = match self.lane.lock().unwrap().as_ref() {
                Some(l) => l.send(work).map_err(|e| e.0),
                None => Err(work),
            };
            match sent {
                Ok(()) => lane = Some(answer),
                Err(back) => parts.extend(back.parts),
            }
        }
        let mut ok = true;
        for (from, to, n) in parts {
            // A lost peer stops the transfer within a piece (at most `CHUNK` bytes).
            ok = job.conn.alive();
            if !ok {
                break;
            }
            // `from` and `to` are `n` bytes inside spans whose memory `job.keep` (window
            // mappings) or a waiting caller (its buffer) keeps mapped until the engine releases
            // the job below.
            let copied = if unaligned {
                let here = Place::Here(temp.as_mut_ptr());
                // SAFETY: the spans as said above; `temp` holds `min(total, CHUNK) >= n` bytes.
                unsafe { copy_piece(from, here, n).and_then(|()| copy_piece(here, to, n)) }
            } else {
                // SAFETY: the spans as said above.
                unsafe { copy_piece(from, to, n) }
            };
            if let Err(why) = copied {
                job.conn.fault(job.seq, why);
                ok = false;
                break;
            }
        }
        // The job's memory stays mapped until the second channel answered.
        if let Some(answer) = lane {
            let copied = answer.recv().unwrap_or_else(|_| Err("the DMA engine's second channel stopped".into()));
            if let Err(why) = copied {
                if ok && job.conn.alive() {
                    job.conn.fault(job.seq, why);
                }
                ok = false;
            }
        }
        drop(std::mem::take(&mut job.keep));
        job.release();
        if ok {
            self.transfers.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(total as u64, Ordering::Relaxed);
            if unaligned {
                self.unaligned_bytes.fetch_add(total as u64, Ordering::Relaxed);
            }
        }
        let now = Instant::now();
        let at = if ok { self.pacer.complete_at(&job.transfer, job.posted, now) } else { now };
        if at <= now {
            job.conn.complete(job.seq);
        } else {
            let conn = job.conn.clone();
            self.st.lock().unwrap().deferred.push(Reverse(Deferred { at, conn, seq: job.seq }));
            // The engine's thread may sleep past `at` when a caller ran the copy.
            self.cv.notify_all();
        }
    }

    /// Reads what the peers sent on every live connection; forgets the dropped ones.
    fn watch_all(&self) {
        let live: Vec<Arc<Conn>> = {
            let mut w = self.watched.lock().unwrap();
            w.retain(|c| c.strong_count() > 0);
            w.iter().filter_map(Weak::upgrade).collect()
        };
        for conn in live.iter().filter(|c| !c.is_dead()) {
            conn.pump();
        }
        if !live.is_empty() {
            self.note_cpu();
        }
    }

    fn note_cpu(&self) {
        // Relaxed: a counter for reports.
        self.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
    }
}

/// Writes a signal's values if what it waits for completed; hands it back if not yet. A signal of
/// a dead connection is dropped.
fn fire_if_ready(sig: Signal) -> Option<Signal> {
    if sig.conn.is_dead() {
        return None;
    }
    let ready = match sig.after {
        After::Mine(seq) => sig.conn.done_through(seq),
        After::Peers(seq) => sig.conn.peer_counters().1 >= seq,
    };
    if !ready {
        return Some(sig);
    }
    for (seg, value) in &sig.writes {
        // `fence_signal` refuses windows registered in place: a signal writes mapped memory only.
        let Place::Here(ptr) = seg.place() else { continue };
        debug_assert!(seg.len == 8 && (ptr as usize) % 8 == 0);
        // SAFETY: an 8-byte aligned piece of a writable window (resolved and checked at post),
        // mapped while `seg` lives; accessed atomically here and by the readers of the flag.
        let word = unsafe { &*ptr.cast::<AtomicU64>() };
        // Release: the RMAs this signal waited for are visible to whoever reads the value with
        // Acquire (`Memory::load_u64`, `PeerMap::load_u64`).
        word.store(*value, Ordering::Release);
    }
    None
}
