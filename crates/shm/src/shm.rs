//! [`ShmTransport`]: active messages between processes of one machine through shared-memory
//! rings and send cells.
//!
//! Each process creates one segment (see `segment.rs` for its layout) holding its outgoing ring
//! to every rank and its send-cell pool. A peer maps it read-write: it reads the records, body
//! slots and cells addressed to it, and writes back only its ring's read positions (which also
//! give the cells back); as a sender it also rings the owner's doorbell (an atomic add and a
//! futex wake) and reads the owner's `sleeping` flag.
//! A segment is a memory file sealed against shrinking, which peers open through the owner's
//! `/proc/<pid>/fd`; once every process has mapped every segment (`connected`), the owner closes
//! it. It has no name in `/dev/shm`, and nothing of it outlives the job's processes.

use std::sync::atomic::{compiler_fence, fence, Ordering};
use std::time::Instant;

use crate::settings::ShmSettings;
use polyrail_core::config::WaitMode;
use polyrail_core::observe::{LineSamples, Observation, Observe, Placement, LOCAL_NS};
use polyrail_core::sweep::PeerSweep;
use polyrail_core::{
    Address, Caps, Config, Cost, Error, Header, Issued, PeerInfo, Rank, Reach, Result, Sink, Transport, TransportAttr,
    Wakeup,
};

use crate::cells::{CellArea, SendCells};
use crate::fill_rate::{local_copy_rate, FillRate, TIMED_FILL_MIN};
use crate::ring::{Body, Consumer, Geometry, Producer, RECORD, RECORD_INLINE, SLOT};
use crate::segment::{self, Mapping, OwnSegment, SegAddress, SegLayout};
use crate::sys::{self, ProcessWatch};

/// Body slots an inline message may take by default: 4 * 64 = 256 payload bytes (clamped to a
/// quarter of the ring). Above that a send cell is faster: on the Intel Xeon host, alternating
/// runs with bodies of up to 1024 bytes (16 slots) and up to 256, one way 512 B 0.31-0.59 µs
/// (two modes from run to run) against 0.34-0.39, 1 KiB 0.58-1.12 against 0.49-0.54, osu_bw
/// 512 B 2.0-2.6 against 3.2-4.8 GB/s, 1 KiB 1.3-2.6 against 2.8-5.8; up to 256 bytes the body
/// is faster one way (192-256 B 0.23-0.32 µs against 0.32-0.34 through cells).
pub(crate) const DEFAULT_INLINE_SLOTS: u32 = 4;

/// Model default of an active message's latency (ns): about twice the cache-line transfer
/// measured between two cores (see `examples/ring_pingpong.rs`).
const AM_LATENCY_NS: f64 = 200.0;
/// Model default of the sender's CPU time per message (ns).
const AM_OVERHEAD_NS: f64 = 50.0;
/// Model default of the bandwidth of the two-copy path through cells (bytes/s).
const AM_BANDWIDTH: f64 = 5e9;
/// One send in this many to a peer times a line transfer from it (when no one asked meanwhile).
const LINE_SAMPLE_EVERY: u64 = 1024;
/// One message in this many (counting every message to the peer) times a line transfer when it
/// goes through a send cell: how cells are filled follows the placement ([`Peer::placement`]).
const CELL_SAMPLE_EVERY: u64 = 32;

/// A connected peer: our ring to it, its ring to us, its segment.
#[derive(Debug)]
struct Peer {
    /// Our outgoing ring to the peer (in our segment).
    out: Producer,
    /// The peer's ring to us (in its segment).
    inc: Consumer,
    /// The peer's send cells (in its segment).
    their_cells: CellArea,
    /// The peer's process id, as its segment header says.
    pid: u32,
    watch: ProcessWatch,
    /// Set once the peer's ring was found corrupt: it is not polled again.
    failed: bool,
    /// Set once `check_peers` reported the peer's exit.
    reported: bool,
    /// The peer passes the global barrier before it sleeps and this process is registered for
    /// it: our doorbell check needs no fence ([`ring_doorbell`]).
    fenceless: bool,
    /// Where the peer's core sits ([`Placement`] from the latest nine line-transfer samples,
    /// [`LineSamples`], as the engine's verdict, or `POLYRAIL_PLACEMENT`; `Middle`
    /// until measured). Apart, send cells are filled with non-temporal stores above 1 KiB
    /// ([`SendCells::fill`]) and the consumer prefetches more ([`Consumer::set_slow_lines`]).
    placement: Placement,
    /// `POLYRAIL_PLACEMENT` gave the placement: samples do not change it.
    given: bool,
    /// Line-transfer samples towards `placement`.
    placement_samples: LineSamples,
    /// Timed fills of cells to the peer (one in [`CELL_SAMPLE_EVERY`] messages, while it is
    /// not apart and `own_cpus`): whether they run slowly just now ([`Observe::CopiesSlow`]).
    fills: FillRate,
    /// Every rank of this machine has a CPU of its own ([`PeerInfo::own_cpus`]): a line sample as fast as a local load is then a
    /// prefetch's doing and not counted, and cell fills are timed. Ranks that share a CPU also share its caches (such samples are
    /// real), and their fills slow for other reasons.
    own_cpus: bool,
    /// The peer's segment; keeps `inc` and `their_cells` valid. Dropped last.
    map: Mapping,
}

/// Shared-memory rings and send cells to the other processes of this machine (`shm`).
///
/// Build one per process with [`ShmTransport::new`], publish [`Transport::address`], call
/// [`Transport::add_peer`] for every peer, pass a fence, then call [`Transport::connected`].
#[derive(Debug)]
pub struct ShmTransport {
    attr: TransportAttr,
    rank: u32,
    host: String,
    layout: SegLayout,
    peers: Vec<Option<Peer>>,
    /// Ranks of connected peers, in the order `progress` visits them.
    active: Vec<u32>,
    /// Which of them `progress` polls (the last to deliver on every call, all now and then).
    sweep: PeerSweep,
    cells: SendCells,
    /// Whether senders check a peer's `sleeping` flag after each message (`POLYRAIL_WAIT` is not
    /// `spin`).
    ring_doorbells: bool,
    /// Doorbell value seen by `arm`, for `sleep`.
    armed_at: u32,
    /// We pass the global barrier before sleeping (our segment says so to senders).
    sleep_barrier: bool,
    /// The global barrier failed once: `arm` never lets the driver sleep again (senders that
    /// skip their fence count on the barrier); it yields the core instead.
    never_sleep: bool,
    /// Every peer's placement as `POLYRAIL_PLACEMENT` gives it, or `None`: measured
    /// ([`Peer::placement`]).
    given: Option<Placement>,
    /// How fast this process copies within its own memory (bytes per ns), where each peer's
    /// [`FillRate`] starts.
    local_copy_rate: f32,
    /// Dropped after the peers: our rings stay mapped while producers exist.
    seg: OwnSegment,
}

/// After a message to the peer owning `map` was published: wakes the peer if it sleeps.
#[inline]
fn ring_doorbell(map: &Mapping, fenceless: bool) {
    // The record's stamp store must be ordered before the `sleeping` load (a Dekker pair with
    // `arm`: either the sleeper sees the message, or we see it sleeping). With `fenceless` the
    // sleeper's global barrier orders them for us (it makes this thread pass a full barrier
    // between the sleeper's store of `sleeping` and its last look at the rings): the compiler
    // fence keeps program order, and a full fence here, which waits for the record's line to
    // come back from the polling receiver, is spared. Otherwise the SeqCst fence pairs with
    // the one in `arm`.
    if fenceless {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
    if map.sleeping().load(Ordering::Relaxed) != 0 {
        // Release: pairs with the Acquire load in `arm`; the count makes a sleep that starts
        // after this return at once (the futex value no longer matches).
        map.doorbell().fetch_add(1, Ordering::Release);
        sys::futex_wake(map.doorbell());
    }
}

impl ShmTransport {
    /// Delivers up to `budget` messages from `rank`'s ring; a corrupt record makes the peer lost.
    /// (An associated function over `peers` alone, so that `progress` can lend the sweep and
    /// the list of active peers at the same time.)
    #[inline]
    fn poll_peer(peers: &mut [Option<Peer>], rank: Rank, budget: usize, sink: &mut dyn Sink) -> usize {
        let Some(p) = peers[rank as usize].as_mut() else { return 0 };
        if p.failed {
            return 0;
        }
        if !p.inc.may_have_arrival() {
            p.inc.idle();
            return 0;
        }
        Self::deliver(p, rank, budget, sink)
    }

    /// The part of [`ShmTransport::poll_peer`] that runs once something may have arrived.
    fn deliver(p: &mut Peer, rank: Rank, budget: usize, sink: &mut dyn Sink) -> usize {
        let mut done = 0;
        while done < budget {
            let their_cells = &mut p.their_cells;
            let took = p.inc.take(|hdr, body| {
                match body {
                    Body::Inline(payload) => sink.message(rank, hdr, payload),
                    // The cell is the sender's again once our read position passes the record.
                    Body::Cell { index, len } => sink.message(rank, hdr, their_cells.payload(index, len)?),
                }
                Ok(())
            });
            match took {
                Ok(true) => done += 1,
                Ok(false) => {
                    p.inc.idle();
                    break;
                }
                Err(what) => {
                    p.failed = true;
                    sink.peer_lost(rank, Error::protocol(rank, what));
                    break;
                }
            }
        }
        done
    }

    /// Creates this process's segment for rank `rank` of job `job_id` of `size` ranks (a memory
    /// file sealed against shrinking), with the ring slots and send cells of `cfg`'s
    /// [`ShmSettings`] (`POLYRAIL_SHM_*`).
    ///
    /// Fails with [`Error::Io`] (naming the rank, the job and the size) when the segment cannot
    /// be created, e.g. the memory is short.
    pub fn new(cfg: &Config, job_id: &str, rank: u32, size: u32) -> Result<ShmTransport> {
        Self::with_inline_slots(cfg, job_id, rank, size, DEFAULT_INLINE_SLOTS)
    }

    /// [`ShmTransport::new`] with inline messages of up to `max_slots` body slots (clamped to
    /// `2..=slots / 4` and 1023); for measurements. Every process of a job must use the same
    /// value.
    #[doc(hidden)]
    pub fn with_inline_slots(cfg: &Config, job_id: &str, rank: u32, size: u32, max_slots: u32) -> Result<ShmTransport> {
        if size == 0 || rank >= size {
            return Err(Error::InvalidArgument(format!("shm: rank {rank} in a job of {size} ranks")));
        }
        let shm = ShmSettings::from_config(cfg)?;
        let geo = Geometry::new(shm.slots as u32, max_slots);
        let layout = SegLayout::new(size, geo, shm.cells as u32, shm.cell_size as u32).ok_or_else(|| {
            Error::InvalidArgument(format!("shm segment for {size} ranks overflows the address space"))
        })?;
        let seg = OwnSegment::create(rank, &layout, &format!("rank {rank} of job {job_id:?}"))?;
        let ring_doorbells = cfg.wait != WaitMode::Spin;
        // A process that may sleep and can make its senders pass a barrier says so in its
        // segment, before the address goes out (Release: pairs with the Acquire in `connect`).
        let sleep_barrier = ring_doorbells && sys::global_barrier_registered();
        seg.map.sleep_barrier().store(sleep_barrier as u32, Ordering::Release);
        // SAFETY: the mapping is `layout.total_len` bytes with this layout, and `seg` outlives
        // `cells` (field order of ShmTransport).
        let area = unsafe { CellArea::new(seg.map.base(), &layout) };
        let attr = TransportAttr {
            kind: crate::SHM,
            max_inline: geo.inline_max(),
            max_eager: layout.cell_size as usize,
            max_rma: 0,
            caps: Caps::AM | Caps::WAKEUP | Caps::NODE_LOCAL | Caps::DOMAIN_LOCAL | Caps::PLACEMENT,
            am_cost: Cost { latency_ns: AM_LATENCY_NS, overhead_ns: AM_OVERHEAD_NS, bandwidth: AM_BANDWIDTH },
            rma_cost: Cost { latency_ns: f64::INFINITY, overhead_ns: 0.0, bandwidth: 1.0 },
            split_from: None,
            mapped_from: None,
            rndv_from: Vec::new(),
        };
        Ok(ShmTransport {
            attr,
            rank,
            host: polyrail_core::host_identity(),
            layout,
            peers: (0..size).map(|_| None).collect(),
            active: Vec::new(),
            sweep: PeerSweep::default(),
            cells: SendCells::new(area, size),
            ring_doorbells,
            armed_at: 0,
            sleep_barrier,
            never_sleep: false,
            given: cfg.placement.given(),
            local_copy_rate: local_copy_rate(),
            seg,
        })
    }

    /// Sets the host identity compared with [`PeerInfo::host`] (default:
    /// [`polyrail_core::host_identity`]); peers whose host differs are not reached.
    pub fn with_host(mut self, host: impl Into<String>) -> ShmTransport {
        self.host = host.into();
        self
    }

    /// Where peers open the segment (`/proc/<pid>/fd/<fd>`), until [`Transport::connected`]
    /// closes it.
    pub fn segment_path(&self) -> Option<String> {
        self.seg.path()
    }

    /// Bytes of this process's segment.
    pub fn segment_len(&self) -> usize {
        self.layout.total_len
    }

    /// Largest payload carried inline in the ring's slots (larger ones go through a send cell).
    pub fn inline_limit(&self) -> usize {
        self.layout.geo.inline_max()
    }

    /// Test hook: writes `bytes` at byte `offset` of the 128-byte record of our next message to
    /// `peer`; with `publish`, stamps that record as arrived (see the record layout in
    /// `ring.rs`). Used to check that a receiver rejects corrupt records.
    #[doc(hidden)]
    pub fn corrupt_for_test(&mut self, peer: Rank, offset: usize, bytes: &[u8], publish: bool) {
        if let Some(Some(p)) = self.peers.get_mut(peer as usize) {
            p.out.corrupt_next(offset, bytes, publish);
        }
    }

    /// Maps the peer's segment and sets up both rings; `Err` is why the peer cannot be reached.
    fn connect(&self, peer: &PeerInfo, address: &[u8]) -> std::result::Result<Peer, String> {
        if peer.host != self.host {
            return Err(format!("different host ({} here, {} there)", self.host, peer.host));
        }
        let addr = SegAddress::decode(address).map_err(|e| format!("bad shm address: {e}"))?;
        segment::same_layout(&self.layout, &addr.layout)?;
        let (map, pid) = segment::open_peer(&addr, (peer.rank, peer.pid))?;
        // Its liveness is watched through this pid: it must be the peer's, as this process
        // sees it (a segment of another pid namespace was refused by `open_peer`).
        if pid != peer.pid {
            return Err(format!("its segment's owner is pid {pid}, but rank {} is pid {}", peer.rank, peer.pid));
        }
        let geo = self.layout.geo;
        // SAFETY: our segment holds a zero-filled ring at this offset (it is only written by the
        // producer made here, once per peer: add_peer refuses a second call), 128-byte aligned,
        // and the segment outlives the producer (field order of ShmTransport).
        let out = unsafe { Producer::new(self.seg.map.at(self.layout.ring_offset(peer.rank)), geo) };
        // SAFETY: the peer's segment has our layout (checked above); its ring to us lies at this
        // offset; `map` is stored with the consumer and dropped after it.
        let mut inc = unsafe { Consumer::new(map.at(self.layout.ring_offset(self.rank)), geo) };
        let placement = self.given.unwrap_or_default();
        inc.set_slow_lines(placement == Placement::Apart);
        // SAFETY: as above, for the peer's cell pool.
        let their_cells = unsafe { CellArea::new(map.base(), &self.layout) };
        // Acquire: pairs with the Release store in `with_inline_slots` (the address that led us
        // here was published after it anyway).
        let fenceless = sys::global_barrier_registered() && map.sleep_barrier().load(Ordering::Acquire) == 1;
        Ok(Peer {
            out,
            inc,
            their_cells,
            pid,
            watch: ProcessWatch::new(pid),
            failed: false,
            reported: false,
            fenceless,
            placement,
            given: self.given.is_some(),
            placement_samples: LineSamples::default(),
            fills: FillRate::new(self.local_copy_rate),
            own_cpus: peer.own_cpus,
            map,
        })
    }

    #[cold]
    fn not_connected(peer: Rank) -> Error {
        Error::Transport { kind: "shm", what: format!("rank {peer} is not connected through shared memory") }
    }

    /// Times a line transfer from `p`'s core (when it published something new since the last
    /// time, leaving at most `unread` of our messages unread; else takes the peer's own latest
    /// time, which it shares for this) and lets our consumer of its ring follow (it prefetches
    /// more while transfers are slow).
    #[cold]
    #[inline(never)]
    fn time_line(p: &mut Peer, unread: u64) -> Option<u32> {
        let ns = match p.out.time_read_line(unread) {
            Some(ns) => {
                p.out.share_sample(ns);
                ns
            }
            // No fresh line of ours (we send little to the peer): the peer's own latest measure.
            None => p.inc.shared_sample()?,
        };
        if ns <= LOCAL_NS && p.own_cpus {
            return Some(ns); // the line was here after all: no measure (the engine agrees)
        }
        // Seven of nine samples decide: one stretched by an interrupt (or, apart, a line a
        // prefetch brought near) does not flip the verdict.
        if let Some(placement) = p.placement_samples.note(ns).filter(|&v| !p.given && v != p.placement) {
            tracing::debug!("shm: pid {}'s core measured {placement:?} (latest {ns} ns for a cache line)", p.pid);
            p.placement = placement;
            p.inc.set_slow_lines(placement == Placement::Apart);
        }
        Some(ns)
    }

    /// A fill of `len` bytes into a cell for `p` that started at `start` ended now.
    #[cold]
    #[inline(never)]
    fn note_fill(p: &mut Peer, len: usize, start: Instant) {
        let now = Instant::now();
        let ns = now.duration_since(start).as_nanos() as u64;
        p.fills.sample(len, ns, now);
        tracing::trace!("shm: filled a cell of {len} B for pid {} in {ns} ns: {:?}", p.pid, p.fills);
    }

    /// What a push into `p`'s ring means for the sender: done (after ringing a sleeping peer's
    /// doorbell; and one push in [`LINE_SAMPLE_EVERY`] times a line transfer), the ring is full,
    /// or the peer published a read position that is nonsense.
    #[inline]
    fn pushed(p: &mut Peer, peer: Rank, pushed: std::result::Result<bool, String>, doorbells: bool) -> Result<Issued> {
        match pushed {
            Ok(true) => {
                Self::after_push(p, doorbells);
                Ok(Issued::Done)
            }
            Ok(false) => Ok(Issued::WouldBlock),
            Err(what) => Err(Error::protocol(peer, what)),
        }
    }

    /// What follows a message's push into `p`'s ring: the doorbell of a sleeping peer, and one
    /// push in [`LINE_SAMPLE_EVERY`] a line transfer's timing.
    #[inline]
    fn after_push(p: &mut Peer, doorbells: bool) {
        if doorbells {
            ring_doorbell(&p.map, p.fenceless);
        }
        if p.out.pushed() % LINE_SAMPLE_EVERY == 0 {
            Self::time_line(p, 1); // the message just pushed
        }
    }

    /// Takes back the send cells every destination has read, and every cell of a destination
    /// that exited or broke the protocol (every cell was in flight).
    #[cold]
    fn reclaim_cells(&mut self) {
        for &r in &self.active {
            let Some(p) = self.peers[r as usize].as_mut() else { continue };
            if p.failed || p.reported {
                // It exited or is lost to us for a corrupt ring: it reads no more cells, and
                // without this the cells it held would stay out of the pool for good.
                self.cells.release(r);
            } else if let Ok(read) = p.out.read_position() {
                // A nonsense read position is reported by the next send to that peer.
                self.cells.reclaim(r, read);
            }
        }
    }

    /// [`Transport::try_send`] for every message but a whole eager one that fits in its record:
    /// a payload in body slots, a header that takes the record, or a payload in a send cell.
    #[inline(never)]
    fn send_general(&mut self, peer: Rank, hdr: &Header, payload: &[u8]) -> Result<Issued> {
        if payload.len() > self.attr.max_inline && self.cells.exhausted() {
            self.reclaim_cells();
        }
        let Some(Some(p)) = self.peers.get_mut(peer as usize) else { return Err(Self::not_connected(peer)) };
        let len = payload.len();
        if len <= self.attr.max_inline {
            let pushed = p.out.try_push_inline(hdr, payload);
            return Self::pushed(p, peer, pushed, self.ring_doorbells);
        }
        if len > self.attr.max_eager {
            return Err(Error::Transport {
                kind: "shm",
                what: format!("payload of {len} bytes to rank {peer} exceeds max_eager ({})", self.attr.max_eager),
            });
        }
        match p.out.reserve_cell() {
            Ok(true) => {}
            no_record => return Self::pushed(p, peer, no_record, self.ring_doorbells),
        }
        // One message in CELL_SAMPLE_EVERY times a line transfer, before the cell and the record
        // are written: right after, the line waits behind the receiver's pull of the cell (on
        // the Intel Xeon host, 4 KiB one way: samples 92-137 ns for the middle half, against
        // 58-83 at every other size). `after_push` times one push in LINE_SAMPLE_EVERY itself.
        let record = p.out.pushed();
        if (record + 1) % CELL_SAMPLE_EVERY == 0 && (record + 1) % LINE_SAMPLE_EVERY != 0 {
            Self::time_line(p, 0);
        }
        // One message in CELL_SAMPLE_EVERY (half-way between the line samples) times its fill.
        let timed = record % CELL_SAMPLE_EVERY == CELL_SAMPLE_EVERY / 2
            && len >= TIMED_FILL_MIN
            && p.placement != Placement::Apart
            && p.own_cpus
            && self.cells.recycling();
        let start = timed.then(Instant::now);
        let cell = match self.cells.fill(peer, payload, p.placement, record, || p.out.read_position()) {
            Ok(Some(cell)) => cell,
            Ok(None) => return Ok(Issued::WouldBlock),
            Err(what) => return Err(Error::protocol(peer, what)),
        };
        if let Some(start) = start {
            Self::note_fill(p, len, start);
        }
        p.out.push_cell(hdr, len as u32, cell);
        Self::pushed(p, peer, Ok(true), self.ring_doorbells)
    }
}

impl Transport for ShmTransport {
    fn attr(&self) -> &TransportAttr {
        &self.attr
    }

    fn address(&self) -> Address {
        self.seg.address(self.rank, self.layout).encode()
    }

    fn add_peer(&mut self, peer: &PeerInfo, address: &[u8]) -> Reach {
        if peer.rank == self.rank {
            return Reach::No("own rank (the loopback channel carries messages to oneself)".into());
        }
        if peer.rank >= self.layout.size {
            return Reach::No(format!("rank {} outside a job of {} ranks", peer.rank, self.layout.size));
        }
        if self.peers[peer.rank as usize].is_some() {
            return Reach::Yes("already connected".into());
        }
        match self.connect(peer, address) {
            Err(why) => Reach::No(why),
            Ok(p) => {
                let why = format!("mapped the segment of pid {} ({} bytes)", p.pid, self.layout.total_len);
                self.cells.add_dest(peer.rank);
                self.peers[peer.rank as usize] = Some(p);
                self.active.push(peer.rank);
                Reach::Yes(why)
            }
        }
    }

    fn connected(&mut self) -> Result<()> {
        self.seg.close();
        Ok(())
    }

    #[inline]
    fn try_send(&mut self, peer: Rank, hdr: &Header, payload: &[u8]) -> Result<Issued> {
        // The common case with nothing else around it: a whole eager message in its record.
        // Anything to report, the general path finds again and reports.
        if payload.len() <= RECORD_INLINE && hdr.is_compact(payload.len()) {
            if let Some(p) = self.peers.get_mut(peer as usize).and_then(Option::as_mut) {
                if let Ok(pushed) = p.out.try_push_compact(hdr.envelope(), payload) {
                    if !pushed {
                        return Ok(Issued::WouldBlock);
                    }
                    Self::after_push(p, self.ring_doorbells);
                    return Ok(Issued::Done);
                }
            }
        }
        self.send_general(peer, hdr, payload)
    }

    fn progress(&mut self, budget: usize, sink: &mut dyn Sink) -> Result<usize> {
        // Polling priority (Chai Ch. 7): idle peers do not slow the busy one's messages.
        let peers = &mut self.peers;
        Ok(self.sweep.run(&self.active, budget, |rank, left| Self::poll_peer(peers, rank, left, sink)))
    }

    fn observe(&mut self, peer: Rank, what: Observe) -> Option<Observation> {
        let p = self.peers.get_mut(peer as usize)?.as_mut()?;
        match what {
            Observe::LineTransfer if !p.failed => Self::time_line(p, 0).map(Observation::LineTransfer),
            Observe::CopiesSlow => p.fills.slow(Instant::now).map(Observation::CopiesSlow),
            // A corrupt record counts too: this is a hint (skew feedback); polling reports it.
            Observe::Unread => Some(Observation::Unread(!p.failed && p.inc.may_have_arrival())),
            _ => None,
        }
    }

    fn check_peers(&mut self, sink: &mut dyn Sink) {
        for i in 0..self.active.len() {
            let rank = self.active[i];
            let Some(p) = self.peers[rank as usize].as_mut() else { continue };
            if p.reported || !p.watch.exited() {
                continue;
            }
            p.reported = true;
            // Acquire: pairs with the Release store in the peer's finalize.
            let finalized = p.map.finalized().load(Ordering::Acquire) != 0;
            let pid = p.pid;
            // What the peer sent before it exited still counts: deliver it first.
            Self::poll_peer(&mut self.peers, rank, usize::MAX, sink);
            let why = if finalized {
                Error::PeerFinished { rank }
            } else {
                Error::PeerLost { rank, why: format!("process {pid} exited without finalizing") }
            };
            sink.peer_lost(rank, why);
        }
    }

    fn finalize(&mut self) {
        // Release: everything this process wrote before finishing is visible to a peer that
        // reads the flag with Acquire in check_peers.
        self.seg.map.finalized().store(1, Ordering::Release);
    }

    fn describe(&self) -> String {
        let l = &self.layout;
        format!(
            "{} records of {RECORD} B and as many body slots of {SLOT} B per ring, inline up to {} B ({RECORD_INLINE} B in the record), {} cells x {} B ({} in flight), segment {} B, {} peers mapped, {} of them apart ({}; cells to them filled with non-temporal stores above 1 KiB), {} with cell fills measured slow lately, {}{}",
            l.geo.slots,
            l.geo.inline_max(),
            l.cells,
            l.cell_size,
            self.cells.in_flight(),
            l.total_len,
            self.active.len(),
            self.active.iter().filter(|&&r| self.peers[r as usize].as_ref().is_some_and(|p| p.placement == Placement::Apart)).count(),
            if self.given.is_some() { "POLYRAIL_PLACEMENT" } else { "measured" },
            self.active.iter().filter(|&&r| self.peers[r as usize].as_ref().is_some_and(|p| p.fills.held())).count(),
            match (self.ring_doorbells, self.sleep_barrier) {
                (false, _) => "no doorbell (POLYRAIL_WAIT=spin)",
                (true, true) => "doorbell checked without a fence (sleepers pass a global barrier, membarrier)",
                (true, false) => "doorbell checked after a fence (no global barrier here)",
            },
            if self.active.iter().any(|&r| self.peers[r as usize].as_ref().is_some_and(|p| p.failed)) {
                " (some rings corrupt)"
            } else {
                ""
            }
        )
    }

    fn wakeup(&mut self) -> Option<&mut dyn Wakeup> {
        Some(self)
    }
}

impl Wakeup for ShmTransport {
    fn arm(&mut self) -> bool {
        let me = &self.seg.map;
        // Acquire: a wake-up counted after this read makes `sleep` return at once.
        self.armed_at = me.doorbell().load(Ordering::Acquire);
        if self.never_sleep {
            // Not sleeping, but giving the core away like a sleep would.
            std::thread::yield_now();
            return false;
        }
        me.sleeping().store(1, Ordering::Relaxed);
        // SeqCst fence: orders the `sleeping` store before the stamp loads below; pairs with the
        // fence in `ring_doorbell` (a sender's stamp store, then its `sleeping` load). Either we
        // see its message here, or it sees us sleeping and rings. Senders that skip their fence
        // (`Peer::fenceless`) are made to pass one by the global barrier: after it, each such
        // sender's stamp stores before its last `sleeping` load are visible to the loads below,
        // or its later `sleeping` loads see our store.
        fence(Ordering::SeqCst);
        if self.sleep_barrier && !sys::global_barrier() {
            self.never_sleep = true;
            me.sleeping().store(0, Ordering::Relaxed);
            tracing::warn!("shm: the global memory barrier failed; this process no longer sleeps while it waits");
            return false;
        }
        let arrived = self
            .active
            .iter()
            .any(|&r| self.peers[r as usize].as_ref().is_some_and(|p| !p.failed && p.inc.may_have_arrival()));
        !arrived
    }

    fn sleep(&mut self, timeout: std::time::Duration) {
        sys::futex_wait(self.seg.map.doorbell(), self.armed_at, timeout);
    }

    fn disarm(&mut self) {
        self.seg.map.sleeping().store(0, Ordering::Relaxed);
    }
}
