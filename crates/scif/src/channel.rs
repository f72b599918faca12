//! The `scif` channel: a polyrail [`Transport`] between the host and the devices of one node,
//! on the libscif API of this crate (as Open MPI's btl/scif and MPICH's scif netmod were).
//!
//! - Bring-up: each process listens on a SCIF port it publishes ([`Transport::address`]); of
//!   two peers the higher rank connects (in a thread, since `connect` waits for the accept) and
//!   the lower accepts, both without blocking the job: `progress` and `try_send` finish what
//!   is pending, and a peer not ready yet gets [`Issued::WouldBlock`].
//! - Eager messages: each side registers a receive ring as a window at offset 0 of the
//!   connection, sends its offset and length in a handshake, and maps the peer's ring; a sender
//!   writes frames into the peer's ring with CPU stores and moves the ring's tail, the reader
//!   polls its own ring and moves its head (both positions live in the ring's first page).
//! - One-sided memory: a registration becomes a window at the same offset on every connection,
//!   named by its packed key (the offset of the region's first byte and its length). A
//!   transfer's buffer is lent in place, the pages it lies in, which the peer's DMA engine reads
//!   or writes with no copy first; where peers cannot reach this process's memory (Yama), it
//!   gets a page-aligned stand-in (a bounce window, copied back at the end); long-lived memory
//!   with a memory file is registered as its file, and a transfer's buffer inside it uses that
//!   window. `get`/`put` are `vreadfrom`/`vwriteto` by the provider's DMA engine, finished
//!   when they return; from 512 KiB a message is split, the receiver getting the front while
//!   the sender puts the back. DMA copies between addresses equal mod 64 (else the provider
//!   copies twice, as SCIF's driver does): from 64 KiB, a transfer whose two sides differ goes
//!   through the connection's bounce window in 1 MiB pieces, the DMA engine filling one half
//!   while the caller copies the other (as MPICH's scif netmod did).
//!
//! Every position, length, offset and key a peer wrote is checked before use: a forged one is
//! an [`Error::Protocol`] naming the peer, never an access outside the ring or a window.

use crate::dma::CACHE_LINE;
use crate::endpoint::{poll, Endpoint, Mark, PeerMap, PollEp};
use crate::error::ScifError;
use crate::fabric::{Fabric, FabricConfig};
use crate::flags::{AcceptFlags, FenceFlags, MapFlags, MsgFlags, PollEvents, PortId, Prot, RmaFlags};
use crate::memory::{page_size, Memory};
use crate::pacing::ScifPacer;
use crate::ring::{self, frame_len, Frame, RingRead, RingWrite, FRAME_HEAD, MAX_EAGER};
use crate::settings::{ScifSettings, VARS};
use polyrail_core::observe::{Observation, Observe};
use polyrail_core::{
    Address, Caps, ChannelFactory, ChannelStart, Config, Cost, Error, Header, Issued, Lifetime, MemHandle, OneSided,
    OpId, Opened, PeerAccess, PeerInfo, Rank, Reach, Region, RegionMut, RemoteKey, Result, RndvFrom, Sink, Transport,
    TransportAttr, TransportKind,
};
use std::collections::HashMap;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The channel's name.
pub const SCIF: TransportKind = TransportKind::new("scif");

/// Magic of addresses, handshakes and keys ("SCIF").
const MAGIC: u32 = 0x4649_4353;
/// Bytes of an address: magic, physical node, SCIF node, port.
const ADDRESS_LEN: usize = 12;
/// Bytes of a handshake: magic, rank, ring window offset, ring length.
const HELLO_LEN: usize = 24;
/// Bytes of a packed key: magic, offset of the region's first byte, registered length.
const KEY_LEN: usize = 20;
/// Positions in a ring's first page: the writer's tail, the reader's head, the writer's goodbye.
const TAIL: usize = 0;
const HEAD: usize = 64;
const BYE: usize = 128;
/// Largest `get`/`put`.
const MAX_RMA: usize = 64 << 20;
/// Smallest transfer split between both processes (from it the DMA engine splits too).
const SPLIT_FROM: usize = 512 << 10;
/// The emulation's costs, fitted to `polyrail-bench` between the host and device 1 with the
/// protocol forced (`POLYRAIL_ROUTE=all:0-:scif/eager` or `/get`) on a 2-core machine. Eager
/// through the ring: 0.32 us one way at 8 B, of which about 0.2 us the sender's (4.9 M
/// messages/s, `mbw-mr`); from 256 KiB to 4 MiB 61 ps a byte, two copies at 32 GB/s.
const AM_COST: Cost = Cost { latency_ns: 120.0, overhead_ns: 200.0, bandwidth: 32e9 };
/// A `get` from ordinary memory: 38 us one way at 8 B with its two control messages through
/// the ring (its window's record and the DMA engine's handoffs; the model counts it all as
/// latency), then 142 ps a byte (7 GB/s) to 4 MiB, through
/// `process_vm_readv`. With these the model never prefers it to the ring ([`RNDV_FROM`]).
const RMA_COST: Cost = Cost { latency_ns: 37_000.0, overhead_ns: 0.0, bandwidth: 7e9 };
/// Smallest message from ordinary memory sent one-sided (split between both processes) rather
/// than through the ring, measured: at 4 MiB the ring's one-way time is 0.6-0.8 of the split's
/// but its streaming bandwidth 0.8-1.0 of it, and from 8 MiB the ring streams at under 0.6.
const RNDV_FROM: usize = 4 << 20;
/// Smallest message from long-lived registered memory (the peer maps its window, so copies
/// are loads and stores) sent one-sided, measured: at 256 KiB the ring streams 15-17 GB/s
/// against 11-12; at 1 MiB one-sided streams 18-20 against 15-19 (one way 70 us against
/// 57-65); from 2 MiB it wins both.
const MAPPED_FROM: usize = 1 << 20;
/// How long a registration waits for the connections still coming up.
const BRING_UP: Duration = Duration::from_secs(10);
/// Where registrations' windows start in each connection's window space (the ring is at 0).
const REG_BASE: u64 = 1 << 32;
/// Where a connection's bounce window is, between the ring and the registrations.
const BOUNCE_AT: u64 = 1 << 31;
/// Bytes a piece through the bounce window has at most (MPICH's scif netmod used 1 MiB).
const BOUNCE_PIECE: usize = 1 << 20;
/// Bytes of each half of the bounce window: a piece and room to align it.
const BOUNCE_HALF: usize = BOUNCE_PIECE + 4096;
/// Smallest `get`/`put` that goes through the bounce window where its two sides differ mod
/// [`CACHE_LINE`]: smaller ones pay the provider's temporary buffer, cheaper than the fences.
const BOUNCE_FROM: usize = 64 << 10;
/// Largest registration a key may name.
const KEY_LEN_MAX: u64 = 1 << 40;

fn transport_error(what: impl std::fmt::Display) -> Error {
    Error::Transport { kind: SCIF.name(), what: what.to_string() }
}

/// Starts `scif` in a process that has peers.
pub struct ScifFactory;

impl ChannelFactory for ScifFactory {
    fn kind(&self) -> TransportKind {
        SCIF
    }
    fn variables(&self) -> Vec<polyrail_core::config::VarInfo> {
        let mut v = polyrail_core::config::infos(VARS);
        v.extend(polyrail_link::settings::variables());
        v
    }
    fn check_settings(&self, config: &Config) -> Result<()> {
        ScifSettings::from_config(config)?;
        polyrail_link::LinkSettings::from_config(config).map(drop)
    }
    fn open(&self, start: &ChannelStart<'_>) -> Result<Opened> {
        if let Some(absent) = start.without_peers() {
            return Ok(absent);
        }
        let settings = ScifSettings::from_config(start.config)?;
        let node = settings.node.unwrap_or(start.config.domain);
        let nodes = settings.nodes.unwrap_or(start.config.domains).max(node.saturating_add(1));
        if nodes < 2 {
            return Ok(Opened::Absent(
                "this node has no device (POLYRAIL_DOMAINS is 1 or unset): scif joins a host and its devices".into(),
            ));
        }
        let base = settings
            .dir
            .clone()
            .or_else(|| std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()).map(Into::into))
            .unwrap_or_else(|| "/tmp".into());
        let mut cfg = FabricConfig::new(base, start.job_id, node, nodes);
        cfg.physical_node = start.config.node.unwrap_or(0);
        let pacer = ScifPacer::from_config(start.config, start.job_id, cfg.physical_node)?.map(Arc::new);
        if let Some(p) = &pacer {
            cfg = cfg.pacer(p.clone());
        }
        let fabric = Fabric::new(cfg).map_err(|e| transport_error(format_args!("starting the SCIF provider: {e}")))?;
        let mut channel = ScifChannel::new(fabric, &settings, start.rank, start.size)?;
        channel.pacer = pacer;
        Ok(Opened::Channel(Box::new(channel)))
    }
}

/// Registers a receive ring of `ring` data bytes at offset 0 of `ep` and sends the handshake
/// that names it: done by the dialling thread itself, so that the peer's link gets ready
/// whether or not this side's `progress` runs.
fn open_ring(ep: &Endpoint, ring: usize, rank: Rank) -> std::result::Result<Memory, ScifError> {
    let rx = Memory::new(page_size() + ring)?;
    ep.register(&rx, 0, rx.len(), 0, Prot::READ | Prot::WRITE, MapFlags::FIXED)?;
    let mut hello = [0u8; HELLO_LEN];
    hello[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    hello[4..8].copy_from_slice(&rank.to_le_bytes());
    hello[8..16].copy_from_slice(&0u64.to_le_bytes());
    hello[16..24].copy_from_slice(&(ring as u64).to_le_bytes());
    ep.send(&hello, MsgFlags::BLOCK)?;
    Ok(rx)
}

/// What the channel knows of one rank.
enum Slot {
    /// Not added, or declined.
    None,
    /// This rank connects to it: the thread waiting for its accept.
    Dialing(JoinHandle<std::result::Result<(Endpoint, Memory), ScifError>>),
    /// It connects to this rank: its connection is accepted when it comes.
    Awaiting,
    /// Connected, handshake sent; waiting for its handshake (in `links`).
    Handshaking,
    /// Connected both ways.
    Ready(Box<Link>),
    /// Gone, and why; `reported` once the sink heard of it.
    Lost { why: String, reported: bool },
    /// Finalized and gone.
    Finished,
}

/// One connection: the endpoint, this side's receive ring and, once the handshake came, the
/// peer's ring mapped here.
struct Link {
    ep: Endpoint,
    /// The peer's rank: known when this side dialled, learned from the handshake otherwise.
    rank: Option<Rank>,
    /// This side's receive ring: its first page holds the positions, the data follows.
    rx: Memory,
    /// The handshake received so far.
    hello: [u8; HELLO_LEN],
    got: usize,
    /// The peer's ring, mapped writable.
    tx: Option<PeerMap>,
    /// Data bytes of the peer's ring.
    tx_cap: u64,
    /// Next byte this side reads of its ring (private: the page's copy is only published).
    head: u64,
    /// Next byte this side writes of the peer's ring.
    tail: u64,
    /// The bounce window, registered at [`BOUNCE_AT`] at the first transfer that needs it.
    bounce: Option<Memory>,
}

impl Link {
    /// The bounce window of this connection, registered at first use.
    fn bounce(&mut self) -> std::result::Result<&Memory, ScifError> {
        if self.bounce.is_none() {
            let mem = Memory::new(2 * BOUNCE_HALF)?;
            self.ep.register(&mem, 0, mem.len(), BOUNCE_AT, Prot::READ | Prot::WRITE, MapFlags::FIXED)?;
            self.bounce = Some(mem);
        }
        Ok(self.bounce.as_ref().expect("registered above"))
    }

    /// Reads `buf.len()` bytes of the peer's windows at `remote` through the bounce window
    /// (as MPICH's scif netmod did where the two differ mod 64, which DMA cannot copy between):
    /// the DMA engine fills one half with a piece, aligned as the peer's bytes are, while this
    /// thread copies the other half's piece out.
    fn read_bounced(&mut self, buf: &mut [u8], remote: u64) -> std::result::Result<(), ScifError> {
        let skew = remote as usize % CACHE_LINE;
        let total = buf.len();
        let count = total.div_ceil(BOUNCE_PIECE);
        // Piece `k`: where it starts in `buf` and its length.
        let piece = move |k: usize| (k * BOUNCE_PIECE, BOUNCE_PIECE.min(total - k * BOUNCE_PIECE));
        self.bounce()?;
        let post = |ep: &Endpoint, k: usize| -> std::result::Result<Mark, ScifError> {
            let (at, len) = piece(k);
            ep.readfrom(BOUNCE_AT + ((k % 2) * BOUNCE_HALF + skew) as u64, len, remote + at as u64, RmaFlags::NONE)?;
            ep.fence_mark(FenceFlags::INIT_SELF)
        };
        let mut marks = std::collections::VecDeque::new();
        for k in 0..count.min(2) {
            marks.push_back(post(&self.ep, k)?);
        }
        for k in 0..count {
            self.ep.fence_wait(marks.pop_front().expect("a mark per posted piece"))?;
            let (at, len) = piece(k);
            let mem = self.bounce.as_ref().expect("registered above");
            mem.read((k % 2) * BOUNCE_HALF + skew, &mut buf[at..at + len]);
            if k + 2 < count {
                marks.push_back(post(&self.ep, k + 2)?);
            }
        }
        Ok(())
    }

    /// Writes `buf` into the peer's windows at `remote` through the bounce window: this thread
    /// copies a piece into one half, aligned as the peer's destination is, while the DMA engine
    /// writes the other half's piece.
    fn write_bounced(&mut self, buf: &[u8], remote: u64) -> std::result::Result<(), ScifError> {
        let skew = remote as usize % CACHE_LINE;
        self.bounce()?;
        let mut marks = std::collections::VecDeque::new();
        for (k, at) in (0..buf.len()).step_by(BOUNCE_PIECE).enumerate() {
            let len = BOUNCE_PIECE.min(buf.len() - at);
            if marks.len() == 2 {
                // The half this piece goes to is free once the piece before the last one left.
                self.ep.fence_wait(marks.pop_front().expect("two marks"))?;
            }
            let local = (k % 2) * BOUNCE_HALF + skew;
            self.bounce.as_ref().expect("registered above").write(local, &buf[at..at + len]);
            self.ep.writeto(BOUNCE_AT + local as u64, len, remote + at as u64, RmaFlags::NONE)?;
            marks.push_back(self.ep.fence_mark(FenceFlags::INIT_SELF)?);
        }
        match marks.pop_back() {
            Some(last) => self.ep.fence_wait(last),
            None => Ok(()),
        }
    }

    fn word<'a>(base: *mut u8, offset: usize) -> &'a AtomicU64 {
        // SAFETY: callers pass the start of a live mapping of at least one page and an offset
        // of the first page that is 8-byte aligned (TAIL, HEAD, BYE); the mapping outlives the
        // borrow (it belongs to the link), and the word is only accessed atomically.
        unsafe { &*base.add(offset).cast::<AtomicU64>() }
    }
}

/// This side's receive ring as its reader sees it: the data bytes after the positions' page.
struct RxRing<'a> {
    mem: &'a Memory,
    page: usize,
    cap: usize,
}

impl RingRead for RxRing<'_> {
    fn cap(&self) -> usize {
        self.cap
    }
    fn read(&self, at: usize, out: &mut [u8]) {
        self.mem.read(self.page + at, out);
    }
}

/// The peer's ring mapped here as its writer sees it: the data bytes after the positions' page.
struct TxRing<'a> {
    map: &'a PeerMap,
    page: usize,
    cap: usize,
}

impl RingWrite for TxRing<'_> {
    fn cap(&self) -> usize {
        self.cap
    }
    fn write(&mut self, at: usize, bytes: &[u8]) {
        // The handshake mapped the ring read-write; `PeerMap::write` checks the range.
        self.map.write(self.page + at, bytes).expect("the peer's ring is mapped writable");
    }
}

/// A registration: the window's memory, and what to copy back at the end.
struct Reg {
    lent: Lent,
    /// Bytes of the window (whole pages).
    window_len: usize,
    /// The registered region and, for a stand-in peers write, where its bytes go back.
    region: Region,
    copy_back: bool,
    prot: Prot,
    /// Long-lived ([`Lifetime::Lasting`]): transfers within its region use its window.
    lasting: bool,
}

/// What a registration's window is.
enum Lent {
    /// A memory file: the region's own, or a stand-in holding a copy of it.
    File(Memory),
    /// The pages of the region itself, from this page-aligned address.
    InPlace(usize),
}

impl Reg {
    /// Registers the window at `at` on `ep`.
    fn lend(&self, ep: &Endpoint, at: u64) -> std::result::Result<(), ScifError> {
        match &self.lent {
            Lent::File(mem) => ep.register(mem, 0, self.window_len, at, self.prot, MapFlags::FIXED).map(drop),
            // SAFETY: the registrant keeps the region (and so the pages it lies in) mapped, and
            // leaves it to the peers it lends it to, until `deregister`, which unregisters the
            // window from every connection first.
            Lent::InPlace(addr) => unsafe {
                ep.register_in_place(*addr as *const u8, self.window_len, at, self.prot, MapFlags::FIXED).map(drop)
            },
        }
    }
}

/// The `scif` channel; see the module documentation.
pub struct ScifChannel {
    attr: TransportAttr,
    fabric: Fabric,
    /// The port this process listens on.
    port: u16,
    /// Connections the acceptor thread accepted (ring registered, handshake sent).
    accepted: Receiver<std::result::Result<(Endpoint, Memory), ScifError>>,
    /// Tells the acceptor thread to end.
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    rank: Rank,
    physical_node: u32,
    node: u16,
    ring: usize,
    slots: Vec<Slot>,
    /// Connections waiting for the peer's handshake.
    links: Vec<Link>,
    regs: HashMap<u64, Reg>,
    next_window: u64,
    /// What peers sent that was refused (bad handshakes), for `describe`.
    refused: Vec<String>,
    /// Where the next `progress` starts: every peer gets its turn.
    cursor: usize,
    /// The link model pacing this node's transfers (its DMA through the fabric, ring frames
    /// here), if a profile is set.
    pacer: Option<Arc<ScifPacer>>,
}

impl ScifChannel {
    /// The channel of rank `rank` of `size` on `fabric`, listening on a port of its own.
    pub fn new(fabric: Fabric, settings: &ScifSettings, rank: Rank, size: u32) -> Result<ScifChannel> {
        let failed = |what: &str, e: ScifError| transport_error(format_args!("{what}: {e}"));
        let mut listener = Endpoint::open(&fabric).map_err(|e| failed("opening the listening endpoint", e))?;
        listener.bind(0).map_err(|e| failed("binding a port", e))?;
        listener.listen(64).map_err(|e| failed("listening", e))?;
        let ring = settings.ring.max(64 << 10).next_multiple_of(page_size());
        // The DMA engine is CPU threads of each process, so a transfer split between both
        // processes doubles the copy rate (`CPU_COPY`). Hardware SCIF would differ (DMA at PCIe
        // rates, no CPU copy, so an earlier one-sided start).
        let attr = TransportAttr {
            kind: SCIF,
            max_inline: 256 - FRAME_HEAD - Header::WIRE_LEN,
            max_eager: MAX_EAGER,
            max_rma: MAX_RMA,
            caps: Caps::AM | Caps::GET | Caps::PUT | Caps::RMA_INLINE_COMPLETION | Caps::NODE_LOCAL | Caps::CPU_COPY,
            am_cost: AM_COST,
            rma_cost: RMA_COST,
            split_from: Some(SPLIT_FROM),
            mapped_from: Some(MAPPED_FROM),
            rndv_from: vec![RndvFrom {
                class: None,
                from: RNDV_FROM,
                reason: "measured for the scif emulation: below it the ring's two copies are faster".into(),
            }],
        };
        let physical_node = fabric.inner.physical_node;
        let node = fabric.node();
        let port = listener.local().map_or(0, |p| p.port);
        let (tx, accepted) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        // Accepting in a thread of its own lets a peer's `connect` (which waits for the accept)
        // finish whether or not this process is in `progress` just then.
        let acceptor = std::thread::Builder::new()
            .name("scif-accept".into())
            .spawn(move || {
                // Acquire: pairs with the Release store in `drop`.
                while !halt.load(Ordering::Acquire) {
                    let mut p = [PollEp::new(&listener, PollEvents::IN)];
                    if !poll(&mut p, Some(Duration::from_millis(50))).is_ok_and(|n| n > 0) {
                        continue;
                    }
                    let got = match listener.accept(AcceptFlags::NONE) {
                        Ok((_, ep)) => open_ring(&ep, ring, rank).map(|rx| (ep, rx)),
                        Err(ScifError::Eagain(_)) => continue,
                        Err(e) => Err(e),
                    };
                    if tx.send(got).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| transport_error(format_args!("no thread to accept connections: {e}")))?;
        Ok(ScifChannel {
            attr,
            fabric,
            port,
            accepted,
            stop,
            acceptor: Some(acceptor),
            rank,
            physical_node,
            node,
            ring,
            slots: (0..size).map(|_| Slot::None).collect(),
            links: Vec::new(),
            regs: HashMap::new(),
            next_window: REG_BASE,
            refused: Vec::new(),
            cursor: 0,
            pacer: None,
        })
    }

    fn slot(&mut self, peer: Rank) -> Option<&mut Slot> {
        self.slots.get_mut(peer as usize)
    }

    /// A new connection whose ring is registered and handshake sent: every registration is
    /// registered on it too, at its offset.
    fn start_link(&mut self, ep: Endpoint, rx: Memory, rank: Option<Rank>) -> std::result::Result<Link, ScifError> {
        for (&at, reg) in &self.regs {
            reg.lend(&ep, at)?;
        }
        Ok(Link { ep, rank, rx, hello: [0; HELLO_LEN], got: 0, tx: None, tx_cap: 0, head: 0, tail: 0, bounce: None })
    }

    /// Finishes what bring-up left pending, without blocking: dialled connections that were
    /// accepted, connections to accept, handshakes that arrived.
    fn settle(&mut self) {
        for r in 0..self.slots.len() {
            let finished = matches!(&self.slots[r], Slot::Dialing(h) if h.is_finished());
            if !finished {
                continue;
            }
            let Slot::Dialing(h) = std::mem::replace(&mut self.slots[r], Slot::Handshaking) else { unreachable!() };
            let link = match h.join() {
                Ok(Ok((ep, rx))) => self.start_link(ep, rx, Some(r as Rank)),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(ScifError::Einval("the connecting thread panicked".into())),
            };
            match link {
                Ok(link) => self.links.push(link),
                Err(e) => self.slots[r] = lost(format!("connecting to rank {r} over SCIF failed: {e}")),
            }
        }
        while let Ok(got) = self.accepted.try_recv() {
            match got.and_then(|(ep, rx)| self.start_link(ep, rx, None)) {
                Ok(link) => self.links.push(link),
                Err(e) => self.refused.push(format!("an accepted connection failed its start: {e}")),
            }
        }
        let mut i = 0;
        while i < self.links.len() {
            match self.handshake(i) {
                Ok(None) => i += 1,
                Ok(Some(rank)) => {
                    let link = self.links.swap_remove(i);
                    self.slots[rank as usize] = Slot::Ready(Box::new(link));
                }
                Err((rank, why)) => {
                    self.links.swap_remove(i);
                    match rank {
                        Some(r) => self.slots[r as usize] = lost(why),
                        None => self.refused.push(why),
                    }
                }
            }
        }
    }

    /// Waits up to `patience` until every peer added is connected both ways (or lost): peers
    /// connect and accept in threads of their own, so this needs nothing of theirs but to live.
    fn bring_up(&mut self, patience: Duration) {
        let start = std::time::Instant::now();
        loop {
            self.settle();
            let pending = self.slots.iter().any(|s| matches!(s, Slot::Dialing(_) | Slot::Awaiting | Slot::Handshaking));
            if !pending || start.elapsed() > patience {
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Reads what arrived of link `i`'s handshake; once whole, checks it and maps the peer's
    /// ring. `Ok(Some(rank))` when the link is ready, `Err` with the rank if known and why not.
    fn handshake(&mut self, i: usize) -> std::result::Result<Option<Rank>, (Option<Rank>, String)> {
        let link = &mut self.links[i];
        let known = link.rank;
        let who = |r: Option<Rank>| r.map_or_else(|| "a connecting peer".to_string(), |r| format!("rank {r}"));
        while link.got < HELLO_LEN {
            match link.ep.recv(&mut link.hello[link.got..], MsgFlags::NONE) {
                Ok(0) => return Ok(None),
                Ok(n) => link.got += n,
                Err(e) => return Err((known, format!("{} went during the SCIF handshake: {e}", who(known)))),
            }
        }
        let h = &link.hello;
        let word = |r: Range<usize>| u64::from_le_bytes(h[r].try_into().unwrap());
        let magic = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let rank = u32::from_le_bytes(h[4..8].try_into().unwrap());
        let (offset, cap) = (word(8..16), word(16..24));
        let refuse = |what: String| Err((known, format!("{}: refused handshake: {what}", who(known))));
        if magic != MAGIC {
            return refuse(format!("magic {magic:#x}, not a scif channel's"));
        }
        match known {
            Some(r) if r != rank => return refuse(format!("it says it is rank {rank}")),
            None if !matches!(self.slots.get(rank as usize), Some(Slot::Awaiting)) => {
                return refuse(format!("rank {rank} was not expected to connect"))
            }
            _ => {}
        }
        let page = page_size() as u64;
        let fits = cap % page == 0 && (frame_len(MAX_EAGER) as u64) * 2 <= cap && cap <= 1 << 30 && offset % page == 0;
        if !fits {
            return refuse(format!(
                "ring of {cap} bytes at {offset:#x} (whole pages, room for two frames, at most 1 GiB)"
            ));
        }
        let tx = match link.ep.mmap(offset, (page + cap) as usize, Prot::READ | Prot::WRITE) {
            Ok(m) => m,
            Err(e) => return refuse(format!("its ring window at {offset:#x}: {e}")),
        };
        link.tx = Some(tx);
        link.tx_cap = cap;
        link.rank = Some(rank);
        Ok(Some(rank))
    }

    /// The link to `peer`, settling pending bring-up first; `Ok(None)` while it is not ready.
    fn ready(&mut self, peer: Rank, what: &str) -> Result<Option<&mut Link>> {
        match self.slot(peer) {
            Some(Slot::Ready(_)) => {}
            Some(Slot::Dialing(_) | Slot::Awaiting | Slot::Handshaking) => {
                self.settle();
                if !matches!(self.slot(peer), Some(Slot::Ready(_))) {
                    return match self.slot(peer) {
                        Some(Slot::Lost { why, .. }) => Err(Error::PeerLost { rank: peer, why: why.clone() }),
                        _ => Ok(None),
                    };
                }
            }
            Some(Slot::Lost { why, .. }) => return Err(Error::PeerLost { rank: peer, why: why.clone() }),
            Some(Slot::Finished) => return Err(Error::PeerFinished { rank: peer }),
            Some(Slot::None) | None => {
                return Err(transport_error(format_args!("{what}: rank {peer} is not a peer of this channel")))
            }
        }
        match self.slot(peer) {
            Some(Slot::Ready(link)) => Ok(Some(link)),
            _ => unreachable!("checked above"),
        }
    }

    /// Reads the frames of `peer`'s ring into `sink`, up to `budget`; a broken frame loses the
    /// peer.
    fn drain(&mut self, peer: usize, budget: usize, sink: &mut dyn Sink) -> usize {
        let Slot::Ready(link) = &mut self.slots[peer] else { return 0 };
        let rank = peer as Rank;
        let page = page_size();
        let base = link.rx.as_ptr();
        // Acquire: pairs with the writer's Release store of the tail after its frames.
        let tail = Link::word(base, TAIL).load(Ordering::Acquire);
        let rx = RxRing { mem: &link.rx, page, cap: self.ring };
        let mut n = 0;
        let result = match ring::Frames::new(&rx, link.head, tail) {
            Err(what) => Err(what),
            Ok(mut frames) => {
                let read = frames.by_ref().take(budget).try_for_each(|frame| {
                    let Frame { hdr, payload, .. } = frame?;
                    assert!(page + payload.end <= link.rx.len(), "a frame's payload outside the ring");
                    // SAFETY: `page + payload` lies in the ring's mapping (checked), which the
                    // link holds while it lives; the writer does not reuse the bytes before the
                    // head passes them (published below, after the sink's call).
                    let bytes = unsafe { std::slice::from_raw_parts(base.add(page + payload.start), payload.len()) };
                    sink.message(rank, &hdr, bytes);
                    n += 1;
                    Ok(())
                });
                link.head = frames.head();
                read
            }
        };
        // Release: the writer may reuse the bytes read once it loads the head with Acquire.
        Link::word(base, HEAD).store(link.head, Ordering::Release);
        if let Err(what) = result {
            let why = format!("rank {rank} broke the scif ring protocol: {what}");
            sink.peer_lost(rank, Error::protocol(rank, &what));
            self.slots[peer] = Slot::Lost { why, reported: true };
        }
        n
    }

    /// Writes `bytes` at the tail of `peer`'s ring and moves the tail by `advance`, whatever
    /// they are, as a faulty or hostile writer would: for tests of the reader's checks.
    #[doc(hidden)]
    pub fn forge_frame(&mut self, peer: Rank, bytes: &[u8], advance: u64) -> Result<()> {
        self.bring_up(BRING_UP);
        let Some(link) = self.ready(peer, "forge_frame")? else { return Err(transport_error("not connected")) };
        let tx = link.tx.as_ref().expect("a ready link maps the peer's ring");
        let pos = (link.tail % link.tx_cap) as usize;
        assert!(pos + bytes.len() <= link.tx_cap as usize, "forged bytes pass the ring's end");
        tx.write(page_size() + pos, bytes).map_err(transport_error)?;
        link.tail = link.tail.wrapping_add(advance);
        Link::word(tx.as_ptr(), TAIL).store(link.tail, Ordering::Release);
        Ok(())
    }

    /// Publishes `head` as this side's head of the ring `peer` writes, as a faulty or hostile
    /// reader would: for tests of the writer's checks.
    #[doc(hidden)]
    pub fn forge_head(&mut self, peer: Rank, head: u64) -> Result<()> {
        self.bring_up(BRING_UP);
        let Some(link) = self.ready(peer, "forge_head")? else { return Err(transport_error("not connected")) };
        Link::word(link.rx.as_ptr(), HEAD).store(head, Ordering::Release);
        Ok(())
    }

    /// The key of the window at `at` of `len` bytes.
    fn key(at: u64, len: u64) -> RemoteKey {
        let mut k = [0u8; KEY_LEN];
        k[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        k[4..12].copy_from_slice(&at.to_le_bytes());
        k[12..20].copy_from_slice(&len.to_le_bytes());
        RemoteKey::new(&k).expect("20 bytes fit a key")
    }

    /// The window offset and length a key names, if it is a key's shape at all.
    fn unpack(key: &RemoteKey) -> Option<(u64, u64)> {
        let k = key.as_bytes();
        if k.len() != KEY_LEN || k[0..4] != MAGIC.to_le_bytes() {
            return None;
        }
        let at = u64::from_le_bytes(k[4..12].try_into().unwrap());
        let len = u64::from_le_bytes(k[12..20].try_into().unwrap());
        (at >= REG_BASE && len <= KEY_LEN_MAX).then_some((at, len))
    }

    /// The remote offset of `len` bytes at `offset` of the registration `key` of `peer`.
    fn target(peer: Rank, key: &RemoteKey, offset: usize, len: usize, what: &str) -> Result<u64> {
        let Some((at, klen)) = Self::unpack(key) else {
            return Err(Error::protocol(peer, format_args!("{what}: {key:?} is not a scif key")));
        };
        match (offset as u64).checked_add(len as u64) {
            Some(end) if end <= klen => Ok(at + offset as u64),
            _ => Err(transport_error(format_args!(
                "{what}: {len} bytes at offset {offset} pass the {klen} bytes rank {peer} registered"
            ))),
        }
    }

    /// Registers `mem` as the window at `at` on every connection.
    fn expose(&mut self, at: u64, reg: &Reg) -> std::result::Result<(), ScifError> {
        let links = self.links.iter().chain(self.slots.iter().filter_map(|s| match s {
            Slot::Ready(l) => Some(&**l),
            _ => None,
        }));
        for link in links {
            reg.lend(&link.ep, at)?;
        }
        Ok(())
    }

    /// The key of `region` inside a long-lived registration's window that allows `prot`: a
    /// transfer's buffer there needs no window of its own (peers of a memory file copy with
    /// plain loads and stores).
    fn within_lasting(&self, region: Region, prot: Prot) -> Option<RemoteKey> {
        let start = region.ptr as usize;
        self.regs.iter().find_map(|(&at, r)| {
            let from = r.region.ptr as usize;
            let inside = r.lasting && start >= from && start + region.len <= from + r.region.len;
            (inside && r.prot.contains(prot)).then(|| Self::key(at + (start - from) as u64, region.len as u64))
        })
    }

    /// Unregisters the window at `at` everywhere (a connection that lost it already is fine).
    fn withdraw(&mut self, at: u64, len: usize) {
        for s in &self.slots {
            if let Slot::Ready(l) = s {
                let _ = l.ep.unregister(at, len);
            }
        }
        for l in &self.links {
            let _ = l.ep.unregister(at, len);
        }
    }
}

fn lost(why: String) -> Slot {
    Slot::Lost { why, reported: false }
}

impl Transport for ScifChannel {
    fn attr(&self) -> &TransportAttr {
        &self.attr
    }

    fn address(&self) -> Address {
        let port = self.port;
        let mut a = Vec::with_capacity(ADDRESS_LEN);
        a.extend_from_slice(&MAGIC.to_le_bytes());
        a.extend_from_slice(&self.physical_node.to_le_bytes());
        a.extend_from_slice(&self.node.to_le_bytes());
        a.extend_from_slice(&port.to_le_bytes());
        a
    }

    fn add_peer(&mut self, peer: &PeerInfo, address: &[u8]) -> Reach {
        let r = peer.rank;
        if r == self.rank {
            return Reach::No("scif joins two domains of a node; this rank is in its own".into());
        }
        if r as usize >= self.slots.len() {
            return Reach::No(format!("rank {r} is not in this job of {}", self.slots.len()));
        }
        let Ok(a) = <[u8; ADDRESS_LEN]>::try_from(address) else {
            return Reach::No(format!(
                "rank {r} published a scif address of {} bytes, not {ADDRESS_LEN}",
                address.len()
            ));
        };
        let magic = u32::from_le_bytes(a[0..4].try_into().unwrap());
        let phys = u32::from_le_bytes(a[4..8].try_into().unwrap());
        let node = u16::from_le_bytes(a[8..10].try_into().unwrap());
        let port = u16::from_le_bytes(a[10..12].try_into().unwrap());
        if magic != MAGIC {
            return Reach::No(format!("rank {r} published a malformed scif address"));
        }
        if phys != self.physical_node || peer.node != self.physical_node {
            return Reach::No(format!(
                "rank {r} is on node {}, this rank on node {}: scif stays within a node",
                peer.node, self.physical_node
            ));
        }
        if node == self.node || peer.domain == self.node {
            return Reach::No(format!(
                "rank {r} is in this rank's domain ({}): memory of one domain is shared, scif joins two",
                domain_name(self.node)
            ));
        }
        if node != peer.domain {
            return Reach::No(format!(
                "rank {r}'s scif address names SCIF node {node}, but it is in domain {}",
                peer.domain
            ));
        }
        if port < crate::EPHEMERAL_PORT_FIRST {
            return Reach::No(format!("rank {r} published port {port}, below the ports a channel binds"));
        }
        if !matches!(self.slots[r as usize], Slot::None) {
            return Reach::No(format!("rank {r} was added already"));
        }
        let why = format!("SCIF node {} <-> {} of node {}, port {node}:{port}", self.node, node, self.physical_node);
        if r > self.rank {
            self.slots[r as usize] = Slot::Awaiting;
            return Reach::Yes(format!("{why} (it connects; {})", crate::PROVIDER));
        }
        let (fabric, ring, me) = (self.fabric.clone(), self.ring, self.rank);
        let dial = std::thread::Builder::new().name(format!("scif-dial-{r}")).spawn(move || {
            let mut ep = Endpoint::open(&fabric)?;
            ep.connect(PortId::new(node, port))?;
            let rx = open_ring(&ep, ring, me)?;
            Ok((ep, rx))
        });
        match dial {
            Ok(h) => {
                self.slots[r as usize] = Slot::Dialing(h);
                Reach::Yes(format!("{why} (this rank connects; {})", crate::PROVIDER))
            }
            Err(e) => Reach::No(format!("no thread to connect to rank {r}: {e}")),
        }
    }

    fn try_send(&mut self, peer: Rank, hdr: &Header, payload: &[u8]) -> Result<Issued> {
        if payload.len() > MAX_EAGER {
            return Err(transport_error(format_args!(
                "a message of {} bytes to rank {peer} passes the {MAX_EAGER}-byte eager limit",
                payload.len()
            )));
        }
        let (pacer, node) = (self.pacer.clone(), self.node);
        let Some(link) = self.ready(peer, "try_send")? else { return Ok(Issued::WouldBlock) };
        let tx = link.tx.as_ref().expect("a ready link maps the peer's ring");
        let base = tx.as_ptr();
        // Acquire: pairs with the reader's Release store of its head after it read the bytes.
        let head = Link::word(base, HEAD).load(Ordering::Acquire);
        let cap = link.tx_cap;
        let frame = frame_len(payload.len()) as u64;
        if let Some(p) = pacer {
            // Only a frame the ring has room for takes the link (a bogus head fails below).
            let room = head <= link.tail && cap.saturating_sub(link.tail - head) >= frame;
            let to = link.ep.peer().map_or(node, |(p, _)| p.node);
            if room && !p.admit(node, to, frame as usize, std::time::Instant::now()) {
                return Ok(Issued::WouldBlock);
            }
        }
        let mut ring = TxRing { map: tx, page: page_size(), cap: cap as usize };
        let tail = match ring::write(&mut ring, head, link.tail, hdr, payload) {
            Err(what) => return Err(Error::protocol(peer, what)),
            Ok(None) => return Ok(Issued::WouldBlock),
            Ok(Some(tail)) => tail,
        };
        link.tail = tail;
        // Release: the frame's bytes are visible to the reader that loads the tail with Acquire.
        Link::word(base, TAIL).store(tail, Ordering::Release);
        Ok(Issued::Done)
    }

    fn progress(&mut self, budget: usize, sink: &mut dyn Sink) -> Result<usize> {
        if !self.links.is_empty() || self.slots.iter().any(|s| matches!(s, Slot::Dialing(_) | Slot::Awaiting)) {
            self.settle();
        }
        let n = self.slots.len();
        let mut done = 0;
        for k in 0..n {
            if done >= budget {
                break;
            }
            let p = (self.cursor + k) % n;
            done += self.drain(p, budget - done, sink);
        }
        self.cursor = (self.cursor + 1) % n.max(1);
        Ok(done)
    }

    fn memory(&mut self) -> Option<&mut dyn OneSided> {
        Some(self)
    }

    fn observe(&mut self, peer: Rank, what: Observe) -> Option<Observation> {
        // Every window is a memory file the peer maps, so a peer this channel reaches copies
        // registered memory with loads and stores.
        if !matches!(what, Observe::MapsRegistered) {
            return None;
        }
        let reached = self
            .slots
            .get(peer as usize)
            .is_some_and(|s| !matches!(s, Slot::None | Slot::Lost { .. } | Slot::Finished));
        Some(Observation::MapsRegistered(reached))
    }

    fn check_peers(&mut self, sink: &mut dyn Sink) {
        self.settle();
        for r in 0..self.slots.len() {
            let gone = match &self.slots[r] {
                Slot::Ready(link) => {
                    let mut p = [PollEp::new(&link.ep, PollEvents::NONE)];
                    let hup = poll(&mut p, Some(Duration::ZERO)).is_ok_and(|n| n > 0)
                        && p[0].revents.intersects(PollEvents::HUP | PollEvents::ERR);
                    // Acquire: pairs with the peer's Release store at finalize.
                    let bye = Link::word(link.rx.as_ptr(), BYE).load(Ordering::Acquire) != 0;
                    match (hup, bye) {
                        (false, _) => None,
                        (true, true) => Some(None),
                        (true, false) => {
                            let pid = link.ep.peer().map_or(0, |(_, pid)| pid);
                            Some(Some(format!("rank {r} (pid {pid}, SCIF node {}) closed its scif connection without finalizing: it died or was killed", link.ep.peer().map_or(0, |(p, _)| p.node))))
                        }
                    }
                }
                Slot::Lost { reported: false, why } => Some(Some(why.clone())),
                _ => None,
            };
            match gone {
                None => {}
                Some(None) => {
                    // Whatever it sent before it went is read first.
                    self.drain(r, usize::MAX, sink);
                    if matches!(self.slots[r], Slot::Ready(_)) {
                        self.slots[r] = Slot::Finished;
                        sink.peer_lost(r as Rank, Error::PeerFinished { rank: r as Rank });
                    }
                }
                Some(Some(why)) => {
                    // What it sent before it died still counts.
                    self.drain(r, usize::MAX, sink);
                    sink.peer_lost(r as Rank, Error::PeerLost { rank: r as Rank, why: why.clone() });
                    self.slots[r] = Slot::Lost { why, reported: true };
                }
            }
        }
    }

    fn finalize(&mut self) {
        for s in &self.slots {
            if let Slot::Ready(link) = s {
                if let Some(tx) = &link.tx {
                    // Release: every frame written before is visible with the goodbye.
                    Link::word(tx.as_ptr(), BYE).store(1, Ordering::Release);
                }
            }
        }
    }

    fn describe(&self) -> String {
        let ready = self.slots.iter().filter(|s| matches!(s, Slot::Ready(_))).count();
        let pending =
            self.links.len() + self.slots.iter().filter(|s| matches!(s, Slot::Dialing(_) | Slot::Awaiting)).count();
        let refused =
            if self.refused.is_empty() { String::new() } else { format!("; refused: {}", self.refused.join("; ")) };
        format!(
            "scif on SCIF node {} ({}) of node {}: {ready} peers connected, {pending} pending, {} KiB rings, \
             {} windows lent; {}{refused}",
            self.node,
            domain_name(self.node),
            self.physical_node,
            self.ring >> 10,
            self.regs.len(),
            self.fabric.describe()
        )
    }
}

impl OneSided for ScifChannel {
    fn register(&mut self, region: Region, access: PeerAccess, lifetime: Lifetime) -> Result<MemHandle> {
        let prot = match access {
            PeerAccess::Read => Prot::READ,
            PeerAccess::Write => Prot::WRITE,
            PeerAccess::ReadWrite => Prot::READ | Prot::WRITE,
        };
        let failed = |e: ScifError| transport_error(format_args!("registering {} bytes: {e}", region.len));
        if lifetime == Lifetime::Transfer {
            if let Some(key) = self.within_lasting(region, prot) {
                return Ok(MemHandle::new(key, &lifetime));
            }
        }
        // The window, where the region starts in it, and whether peers' writes go back.
        let (lent, start, copy_back) = match lifetime {
            Lifetime::Lasting { file: Some(f) } => {
                // SAFETY: the registrant promises the file stays open until `deregister`; it is
                // only borrowed here to duplicate it.
                let fd = unsafe { BorrowedFd::borrow_raw(f.fd) };
                let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0)
                    .map_err(|e| transport_error(format_args!("duplicating a memory file: {e}")))?;
                let inode = rustix::fs::fstat(&dup).map(|s| s.st_ino).unwrap_or(0);
                if inode != f.inode {
                    return Err(transport_error("the registered memory's file was closed (its descriptor names another file)"));
                }
                let mem = Memory::from_file(dup).map_err(failed)?;
                if mem.len() < region.len {
                    return Err(transport_error(format_args!(
                        "the memory file of {} bytes is smaller than the {}-byte region",
                        mem.len(),
                        region.len
                    )));
                }
                (Lent::File(mem), 0, false)
            }
            Lifetime::Lasting { file: None } => {
                return Err(transport_error(
                    "scif lends long-lived memory only with its memory file (AnonMemory::shared): SCIF windows are files the peer maps",
                ))
            }
            Lifetime::Transfer if region.len > 0 && self.fabric.lends_in_place() => {
                // The pages the region lies in, lent in place: peers reach the region itself.
                let page = page_size();
                let first = region.ptr as usize / page * page;
                (Lent::InPlace(first), region.ptr as usize - first, false)
            }
            Lifetime::Transfer => {
                // A stand-in: SCIF windows are whole pages at page offsets, a buffer is anywhere.
                let mem = Memory::new(region.len).map_err(failed)?;
                if access != PeerAccess::Write && region.len > 0 {
                    // SAFETY: the registrant promises `region` is valid for reads now.
                    let src = unsafe { std::slice::from_raw_parts(region.ptr, region.len) };
                    mem.write(0, src);
                }
                (Lent::File(mem), 0, access != PeerAccess::Read)
            }
        };
        let window_len = match &lent {
            Lent::File(mem) => mem.len(),
            Lent::InPlace(_) => (start + region.len).next_multiple_of(page_size()),
        };
        // Every connection gets the window before its key can leave.
        self.bring_up(BRING_UP);
        let at = self.next_window;
        self.next_window += window_len as u64;
        let lasting = matches!(lifetime, Lifetime::Lasting { .. });
        let reg = Reg { lent, window_len, region, copy_back, prot, lasting };
        if let Err(e) = self.expose(at, &reg) {
            self.withdraw(at, window_len);
            return Err(failed(e));
        }
        self.regs.insert(at, reg);
        Ok(MemHandle::new(Self::key(at + start as u64, region.len as u64), &lifetime))
    }

    fn deregister(&mut self, handle: &MemHandle, written: Range<usize>) {
        let Some((at, _)) = Self::unpack(handle.key()) else { return };
        let base = at - at % page_size() as u64;
        // A transfer's handle into a long-lived window ends nothing.
        if self.regs.get(&base).is_none_or(|r| r.lasting != handle.is_lasting()) {
            return;
        }
        let Some(reg) = self.regs.remove(&base) else { return };
        self.withdraw(base, reg.window_len);
        let (start, end) = (written.start, written.end.min(reg.region.len));
        if reg.copy_back && start < end {
            // SAFETY: `start..end` lies in the region (clipped above), which the registrant
            // keeps valid and unaliased until this call; the stand-in is a distinct mapping.
            let dst = unsafe { std::slice::from_raw_parts_mut(reg.region.ptr.cast_mut().add(start), end - start) };
            if let Lent::File(mem) = &reg.lent {
                mem.read(start, dst);
            }
        }
    }

    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, _op: OpId) -> Result<Issued> {
        let what = format!("get of {} bytes from rank {peer}", into.len);
        let remote = Self::target(peer, key, offset, into.len, &what);
        let Some(link) = self.ready(peer, &what)? else { return Ok(Issued::WouldBlock) };
        let remote = remote?;
        if into.len == 0 {
            return Ok(Issued::Done);
        }
        // SAFETY: the caller promises `into` is valid and unaliased until the operation ends,
        // which is before this call returns.
        let buf = unsafe { std::slice::from_raw_parts_mut(into.ptr, into.len) };
        let read = if bounces(buf.as_ptr(), remote, buf.len()) {
            link.read_bounced(buf, remote)
        } else {
            link.ep.vreadfrom(buf, remote, RmaFlags::NONE)
        };
        read.map_err(|e| transport_error(format_args!("{what}: {e}")))?;
        Ok(Issued::Done)
    }

    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, _op: OpId) -> Result<Issued> {
        let what = format!("put of {} bytes to rank {peer}", from.len);
        let remote = Self::target(peer, key, offset, from.len, &what);
        let Some(link) = self.ready(peer, &what)? else { return Ok(Issued::WouldBlock) };
        let remote = remote?;
        if from.len == 0 {
            return Ok(Issued::Done);
        }
        // SAFETY: the caller promises `from` is valid until the operation ends, before return.
        let buf = unsafe { std::slice::from_raw_parts(from.ptr, from.len) };
        let written = if bounces(buf.as_ptr(), remote, buf.len()) {
            link.write_bounced(buf, remote)
        } else {
            link.ep.vwriteto(buf, remote, RmaFlags::NONE)
        };
        written.map_err(|e| transport_error(format_args!("{what}: {e}")))?;
        Ok(Issued::Done)
    }
}

impl Drop for ScifChannel {
    fn drop(&mut self) {
        // Release: pairs with the acceptor's Acquire load; it ends within one poll.
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// Whether a `len`-byte transfer between `local` and the peer's window offset `remote` goes
/// through the bounce window: from [`BOUNCE_FROM`] bytes, where the two differ mod
/// [`CACHE_LINE`] (windows start at page boundaries, so an offset's cache line position is its
/// bytes').
fn bounces(local: *const u8, remote: u64, len: usize) -> bool {
    len >= BOUNCE_FROM && local as usize % CACHE_LINE != remote as usize % CACHE_LINE
}

/// A domain as reports name it.
fn domain_name(node: u16) -> String {
    if node == 0 {
        "the host".into()
    } else {
        format!("device {node}")
    }
}
