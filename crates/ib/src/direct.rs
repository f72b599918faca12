//! [`DirectIb`]: the `ib` channel. Every packet travels by RDMA write into the peer's eager ring
//! (DCFA-MPI §3.4): per ordered pair, a ring of `credits` blocks in the receiver's memory that
//! only the sender writes. Rendezvous data moves by RDMA read (`get`) or write (`put`) between
//! registered user buffers, driven by the engine's state machines. Messages up to
//! `POLYRAIL_IB_BOUNCE` from memory that is not registered already are copied through a pool of
//! pre-registered bounce buffers instead ([`BouncePool`]): cheaper than registering their pages.
//!
//! A data packet whose 64 bytes of framing would cost one more packet on the wire than its
//! payload (1 KiB at path MTU 1024, 4 KiB at 4096) goes compact when its header is the successor
//! of the previous one (a stream of like messages): payload only, by RDMA write with immediate
//! (see [`crate::packet`]). Each queue pair keeps one receive posted per ring block for them.
//!
//! Credits: the sender may write a block only when it holds a credit for it. Every packet
//! carries the credits its sender returns (blocks of the other direction's ring it consumed);
//! a receiver that holds so many unreturned credits that the sender's view falls under the sync
//! limit sends a credit-only SYNC packet. Data packets leave one credit unused, reserved for
//! SYNC and BYE packets, so two processes that flood each other can always return credits.

use crate::bounce::{self, BouncePool};
use crate::packet::{self, Kind, COMPACT_MAX_CREDITS, DATA_OFFSET, HEADER_OFFSET, OVERHEAD};
use crate::provider::{Access, Completion, MemoryRegion, Opcode, Provider, QpId, WcStatus, WorkRequest};
use crate::settings::IbSettings;
use polyrail_core::observe::{Observation, Observe};
use polyrail_core::sweep::PeerSweep;
use polyrail_core::{
    format_size, Address, AnonMemory, Caps, Cost, Error, Header, Issued, Lifetime, MemHandle, OneSided, OpId,
    PeerAccess, PeerInfo, Rank, Reach, Region, RegionMut, RemoteKey, Result, Sink, Transport, TransportAttr,
};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Magic at the start of an `ib` address: `b"PRIB"`.
const ADDR_MAGIC: u32 = u32::from_le_bytes(*b"PRIB");
/// Staging blocks for outgoing packets (their writes may still be in flight).
const STAGING_BLOCKS: usize = 128;
/// Bytes of an encoded remote key: rkey u32, address u64, length u64.
const KEY_LEN: usize = 20;
/// Bytes of the heartbeat area per peer, after the rings.
const HEARTBEAT_BYTES: usize = 8;
/// Where software RDMA splits a transfer between both processes (see `TransportAttr::split_from`;
/// an earlier Soft-RoCE record, in git history): on Soft-RoCE the split wins from 256 KiB (1 MiB: latency halved,
/// bandwidth 1.5x), at 32 KiB the extra CTS costs more than the halved copy gains; on the soft
/// provider the gain starts about there too. An adapter's DMA engine gains nothing from it.
const SPLIT_FROM: usize = 256 << 10;
/// How long `finalize` waits for writes in flight.
const FINALIZE_DRAIN: Duration = Duration::from_secs(2);

/// What the work request id says: kind in the top 2 bits, peer in the next 30, index below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WrKind {
    /// A packet from staging block `index`.
    Packet,
    /// Part of one-sided operation `index` (slot in `ops`).
    Rma,
    /// A liveness probe.
    Heartbeat,
    /// A posted receive (consumed by a compact packet).
    Recv,
}

fn wr_id(kind: WrKind, peer: Rank, index: u32) -> u64 {
    (kind as u64) << 62 | (peer as u64 & 0x3fff_ffff) << 32 | index as u64
}

fn wr_parts(id: u64) -> (WrKind, Rank, u32) {
    let kind = match id >> 62 {
        0 => WrKind::Packet,
        1 => WrKind::Rma,
        2 => WrKind::Heartbeat,
        _ => WrKind::Recv,
    };
    (kind, ((id >> 32) & 0x3fff_ffff) as Rank, id as u32)
}

/// What a peer published.
#[derive(Clone, Debug)]
pub(crate) struct PeerAddress {
    provider: String,
    endpoint: Vec<u8>,
    rings: u64,
    rings_rkey: u32,
    credits: usize,
    block: usize,
    /// Path MTU its receives take compact packets at (0: it takes none).
    mtu: u32,
    size: u32,
    qpns: Vec<u32>,
}

pub(crate) fn parse_address(a: &[u8]) -> std::result::Result<PeerAddress, String> {
    let mut at = 0usize;
    let mut take = |n: usize| -> std::result::Result<&[u8], String> {
        let s = a.get(at..at + n).ok_or_else(|| format!("ib address truncated at byte {at}"))?;
        at += n;
        Ok(s)
    };
    let u32_of = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if u32_of(take(4)?) != ADDR_MAGIC {
        return Err("not a polyrail ib address".into());
    }
    let plen = take(1)?[0] as usize;
    let provider = String::from_utf8_lossy(take(plen)?).into_owned();
    let elen = u32_of(take(4)?) as usize;
    let endpoint = take(elen)?.to_vec();
    let rings = u64::from_le_bytes(take(8)?.try_into().unwrap_or_default());
    let rings_rkey = u32_of(take(4)?);
    let credits = u32_of(take(4)?) as usize;
    let block = u32_of(take(4)?) as usize;
    let mtu = u32_of(take(4)?);
    let size = u32_of(take(4)?);
    if size > 1 << 24 {
        return Err(format!("ib address names a job of {size} ranks"));
    }
    let qpns = (0..size).map(|_| take(4).map(u32_of)).collect::<std::result::Result<_, _>>()?;
    Ok(PeerAddress { provider, endpoint, rings, rings_rkey, credits, block, mtu, size, qpns })
}

/// One connected peer.
#[derive(Debug)]
struct Peer {
    qp: QpId,
    /// Our ring in the peer's memory, its key, and the heartbeat word there.
    remote_ring: u64,
    remote_rkey: u32,
    remote_heartbeat: u64,
    /// Blocks written to the peer so far, and how many more we may write.
    sent: u64,
    credits: usize,
    /// Blocks of the peer's ring consumed so far, and how many of them we have not returned.
    received: u64,
    unreturned: usize,
    /// Work requests posted on the queue pair and not completed (receives not counted).
    outstanding: usize,
    /// Path MTU at which packets to the peer go compact (0: never).
    compact_mtu: usize,
    /// Header of the last data packet written to the peer, and of the last one read from it:
    /// a compact packet's header is the successor of the one before.
    sent_header: Option<Header>,
    read_header: Option<Header>,
    /// Immediates of compact packets that landed and wait for their turn in the ring.
    compact: VecDeque<u32>,
    /// The queue pair is ready to send (it moves there before the first request: connected on
    /// first use; it is ready to receive from `add_peer` on).
    sending: bool,
    heartbeat_pending: bool,
    /// The peer said BYE (it finalized): when it is found gone, it finished rather than failed.
    finished: bool,
    /// Reported lost or finished to the engine.
    reported: bool,
    /// Its ring held a malformed packet: nothing more is read from it.
    malformed: bool,
}

impl Peer {
    /// Moves the queue pair to ready-to-send before the first request (connected on first use).
    fn ready_to_send<P: Provider>(&mut self, provider: &mut P) -> Result<()> {
        if !self.sending {
            provider.ready_to_send(self.qp)?;
            self.sending = true;
        }
        Ok(())
    }
}

/// Where the local memory of a one-sided operation or an exposure lives.
#[derive(Debug)]
enum Local {
    /// Inside a long-lived registration ([`Lifetime::Lasting`]).
    Pinned,
    /// Registered for this operation only; deregistered when it ends.
    Registered(MemoryRegion),
    /// Bounce slot `slot` stands in for `len` bytes of user memory at `user` (an address: the
    /// transport must stay `Send`).
    Bounce { slot: u32, user: usize, len: usize },
}

/// One one-sided operation in flight.
#[derive(Debug)]
struct RmaOp {
    op: OpId,
    peer: Rank,
    parts_left: usize,
    error: Option<WcStatus>,
    /// Its local memory; a read into a bounce slot is copied to the user's buffer at the end.
    local: Local,
    reads: bool,
}

/// The DirectIB channel over provider `P`. See the module documentation.
pub struct DirectIb<P: Provider> {
    attr: TransportAttr,
    provider: P,
    rank: Rank,
    size: u32,
    credits: usize,
    block: usize,
    sync_limit: usize,
    /// The provider's MTU when queue pairs post receives for compact packets; `None` when it
    /// does not cut transfers into packets (then a compact packet would save nothing) or
    /// `POLYRAIL_IB_COMPACT=off`.
    mtu: Option<usize>,
    /// Compact packets written so far.
    compact_sent: u64,
    /// Peers whose compact packets landed since the last `progress`.
    compact_ready: Vec<Rank>,
    /// Incoming rings, one per peer rank, then the heartbeat area.
    rings: AnonMemory,
    rings_mr: MemoryRegion,
    staging: AnonMemory,
    staging_mr: MemoryRegion,
    free_staging: Vec<u32>,
    /// Queue pair and its number, per rank (none for this rank).
    qps: Vec<Option<(QpId, u32)>>,
    peers: Vec<Option<Peer>>,
    /// Ranks of connected peers, the order rings are polled in.
    active: Vec<Rank>,
    /// Which rings `progress` reads (see [`PeerSweep`]).
    sweep: PeerSweep,
    ops: Vec<Option<RmaOp>>,
    free_ops: Vec<u32>,
    /// Exposures that hold a registration or a bounce slot, by the rkey and address in their key.
    exposed: HashMap<(u32, u64), Local>,
    /// `POLYRAIL_IB_BOUNCE`, and the pool (made at its first use).
    bounce_limit: usize,
    bounce: Option<BouncePool>,
    /// Long-lived registrations ([`Lifetime::Lasting`]): operations inside them register nothing.
    pinned: Vec<MemoryRegion>,
    completions: Vec<Completion>,
    /// Work requests posted to any peer and not completed yet: while there are none, the
    /// completion queue is empty and `progress` does not poll it.
    in_flight: usize,
    /// Peers that failed and must be reported at the next `progress`.
    lost: Vec<(Rank, Error)>,
}

impl<P: Provider> std::fmt::Debug for DirectIb<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectIb").field("provider", &self.provider.name()).field("rank", &self.rank).finish()
    }
}

impl<P: Provider> DirectIb<P> {
    /// Whether a packet of `peer` waits in its ring, unread (a peek, for skew feedback).
    fn has_unread(&self, peer: Rank) -> bool {
        let Some(p) = self.peers.get(peer as usize).and_then(Option::as_ref) else { return false };
        if !p.compact.is_empty() {
            return true;
        }
        let at = self.rings.ptr() as usize
            + peer as usize * self.ring_bytes()
            + (p.received % self.credits as u64) as usize * self.block;
        // SAFETY: as in poll_ring; a peek at word 0 only.
        unsafe { &*(at as *const AtomicU64) }.load(Ordering::Relaxed) != 0
    }

    /// Sets up rings, staging and one queue pair per peer of a job of `size` ranks.
    pub fn new(mut provider: P, settings: &IbSettings, rank: Rank, size: u32) -> Result<DirectIb<P>> {
        // A block holds `settings.block` bytes of payload plus the packet's header and tail.
        let (credits, block) = (settings.credits, settings.block + OVERHEAD);
        let ring_bytes = credits * block;
        let rings = AnonMemory::new(ring_bytes * size as usize + HEARTBEAT_BYTES * size as usize, "ib rings")?;
        let staging = AnonMemory::new(STAGING_BLOCKS * block, "ib staging")?;
        // SAFETY: both mappings live as long as the transport, which deregisters them in Drop
        // before unmapping.
        let rings_mr =
            unsafe { provider.register(rings.ptr(), rings.len(), Access::LOCAL_WRITE | Access::REMOTE_WRITE)? };
        // SAFETY: as above.
        let staging_mr = unsafe { provider.register(staging.ptr(), staging.len(), Access::LOCAL_WRITE)? };
        let mtu = Some(provider.mtu()).filter(|&m| m != usize::MAX && settings.compact);
        let recv_depth = if mtu.is_some() { credits } else { 0 };
        let mut qps = Vec::with_capacity(size as usize);
        for r in 0..size {
            qps.push(if r == rank { None } else { Some(provider.create_qp(recv_depth)?) });
        }
        let soft = provider.name() == "soft";
        let cpu_copies = provider.cpu_copies();
        let max_eager = block - OVERHEAD;
        let attr = TransportAttr {
            kind: crate::IB,
            max_inline: provider.max_inline().saturating_sub(OVERHEAD).min(max_eager),
            max_eager,
            max_rma: usize::MAX,
            caps: Caps::AM | Caps::GET | Caps::PUT | if cpu_copies { Caps::CPU_COPY } else { Caps::empty() },
            // Models: a host channel adapter (1.5 µs, 10 GB/s) or the soft provider's system
            // calls (three per packet).
            am_cost: if soft {
                Cost { latency_ns: 3000.0, overhead_ns: 1500.0, bandwidth: 4e9 }
            } else {
                Cost { latency_ns: 1500.0, overhead_ns: 300.0, bandwidth: 10e9 }
            },
            rma_cost: if soft {
                Cost { latency_ns: 2500.0, overhead_ns: 1500.0, bandwidth: 8e9 }
            } else {
                Cost { latency_ns: 2500.0, overhead_ns: 500.0, bandwidth: 10e9 }
            },
            split_from: cpu_copies.then_some(SPLIT_FROM),
            mapped_from: None,
            rndv_from: settings.rndv_from(),
        };
        Ok(DirectIb {
            attr,
            provider,
            rank,
            size,
            credits,
            block,
            sync_limit: settings.sync_limit,
            mtu,
            compact_sent: 0,
            compact_ready: Vec::new(),
            rings,
            rings_mr,
            staging,
            staging_mr,
            free_staging: (0..STAGING_BLOCKS as u32).rev().collect(),
            qps,
            peers: (0..size).map(|_| None).collect(),
            active: Vec::new(),
            sweep: PeerSweep::default(),
            ops: Vec::new(),
            free_ops: Vec::new(),
            exposed: HashMap::new(),
            bounce_limit: settings.bounce,
            bounce: None,
            pinned: Vec::new(),
            completions: Vec::with_capacity(64),
            in_flight: 0,
            lost: Vec::new(),
        })
    }

    /// The provider (for tests and reports).
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// Data packets written compact so far: payload only, header rebuilt by the receiver (see
    /// the module documentation).
    pub fn compact_packets_sent(&self) -> u64 {
        self.compact_sent
    }

    fn ring_bytes(&self) -> usize {
        self.credits * self.block
    }

    fn max_payload(&self) -> usize {
        self.block - OVERHEAD
    }

    fn not_connected(peer: Rank) -> Error {
        Error::Transport { kind: "ib", what: format!("rank {peer} is not connected over ib") }
    }

    fn peer_mut(&mut self, peer: Rank) -> Result<&mut Peer> {
        self.peers.get_mut(peer as usize).and_then(Option::as_mut).ok_or_else(|| Self::not_connected(peer))
    }

    /// The peer, its queue pair made ready to send if this is the first request to it.
    fn sending_peer(&mut self, peer: Rank) -> Result<&mut Peer> {
        let p = self.peers.get_mut(peer as usize).and_then(Option::as_mut).ok_or_else(|| Self::not_connected(peer))?;
        p.ready_to_send(&mut self.provider)?;
        Ok(p)
    }

    /// Writes one packet into the peer's ring. `WouldBlock` without a credit (data packets keep
    /// one in reserve), a staging block or room on the queue pair.
    fn send_packet(&mut self, to: Rank, kind: Kind, hdr: Option<&Header>, payload: &[u8]) -> Result<Issued> {
        let outstanding_max = self.provider.max_outstanding();
        let (credits_max, block, inline_max) = (self.credits, self.block, self.provider.max_inline());
        let p = self.peers.get_mut(to as usize).and_then(Option::as_mut).ok_or_else(|| Self::not_connected(to))?;
        if !p.reported {
            p.ready_to_send(&mut self.provider)?;
        }
        if p.reported {
            return Err(if p.finished {
                Error::PeerFinished { rank: to }
            } else {
                Error::PeerLost { rank: to, why: "its ib queue pair failed".into() }
            });
        }
        let reserve = if kind == Kind::Data { 1 } else { 0 };
        if p.credits <= reserve || p.outstanding >= outstanding_max {
            return Ok(Issued::WouldBlock);
        }
        let Some(slot) = self.free_staging.pop() else { return Ok(Issued::WouldBlock) };
        let staged = self.staging.ptr() as usize + slot as usize * block;
        // SAFETY: staging block `slot` was free: no write in flight reads it, and nothing else
        // refers to it until its completion returns it to the free list.
        let buf = unsafe { std::slice::from_raw_parts_mut(staged as *mut u8, block) };
        let remote_block = p.remote_ring + (p.sent % credits_max as u64) * block as u64;
        let compact = kind == Kind::Data
            && p.compact_mtu != 0
            && packet::compact_saves_packet(payload.len(), p.compact_mtu)
            && p.sent_header.zip(hdr).is_some_and(|(prev, hdr)| prev.successor(payload.len() as u64) == *hdr);
        let (returned, len, remote_addr, imm) = if compact {
            let returned = p.unreturned.min(COMPACT_MAX_CREDITS);
            buf[..payload.len()].copy_from_slice(payload);
            let imm = packet::compact_imm(payload.len(), returned);
            (returned, payload.len(), remote_block + DATA_OFFSET as u64, Some(imm))
        } else {
            let returned = p.unreturned.min(u16::MAX as usize);
            (returned, packet::encode(buf, p.sent, kind, returned as u16, hdr, payload), remote_block, None)
        };
        let wr = WorkRequest {
            wr_id: wr_id(WrKind::Packet, to, slot),
            opcode: Opcode::Write,
            local_addr: staged as u64,
            len,
            lkey: self.staging_mr.lkey,
            remote_addr,
            rkey: p.remote_rkey,
            inline: len <= inline_max,
            imm,
        };
        if let Err(e) = self.provider.post(p.qp, &wr) {
            self.free_staging.push(slot);
            return Err(e);
        }
        if kind == Kind::Data {
            p.sent_header = hdr.copied();
        }
        self.compact_sent += compact as u64;
        p.outstanding += 1;
        self.in_flight += 1;
        p.unreturned -= returned;
        p.sent += 1;
        p.credits -= 1;
        Ok(Issued::Done)
    }

    /// Handles one completion.
    fn complete(&mut self, c: Completion, sink: &mut dyn Sink) {
        let (kind, peer, index) = wr_parts(c.wr_id);
        if kind == WrKind::Recv {
            match (c.status, c.imm) {
                (WcStatus::Success, Some(imm)) => {
                    let Some(p) = self.peers.get_mut(peer as usize).and_then(Option::as_mut) else { return };
                    p.compact.push_back(imm);
                    if !self.compact_ready.contains(&peer) {
                        self.compact_ready.push(peer);
                    }
                }
                // The queue pair failed: its sends say why, or the heartbeat finds it.
                (WcStatus::Flushed, _) => {}
                (WcStatus::Success, None) => self.fail_peer(
                    peer,
                    Error::protocol(peer, "an ib receive completed without immediate data (DirectIB sends none)"),
                ),
                (status, _) => self.fail_peer(peer, lost(peer, format!("ib receive completion error: {status}"))),
            }
            return;
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(p) = self.peers.get_mut(peer as usize).and_then(Option::as_mut) {
            p.outstanding = p.outstanding.saturating_sub(1);
            if kind == WrKind::Heartbeat {
                p.heartbeat_pending = false;
            }
        }
        match kind {
            WrKind::Packet => self.free_staging.push(index),
            WrKind::Heartbeat | WrKind::Recv => {}
            WrKind::Rma => {
                let Some(Some(op)) = self.ops.get_mut(index as usize) else { return };
                op.parts_left -= 1;
                if c.status != WcStatus::Success && op.error.is_none() {
                    op.error = Some(c.status);
                }
                if op.parts_left == 0 {
                    let Some(op) = self.ops[index as usize].take() else { return };
                    self.free_ops.push(index);
                    let landed = if op.reads && op.error.is_none() { 0..usize::MAX } else { 0..0 };
                    self.release_local(op.local, landed);
                    let result = match op.error {
                        None => Ok(()),
                        Some(s) => Err(Error::Transport {
                            kind: "ib",
                            what: format!("RDMA operation with rank {} failed: {s}", op.peer),
                        }),
                    };
                    sink.completed(op.op, result);
                }
            }
        }
        if c.status != WcStatus::Success && c.status != WcStatus::Flushed {
            self.fail_peer(peer, lost(peer, format!("ib work completion error: {}", c.status)));
        }
    }

    /// Marks `peer` failed; it is reported to the engine once.
    fn fail_peer(&mut self, peer: Rank, why: Error) {
        if let Some(p) = self.peers.get_mut(peer as usize).and_then(Option::as_mut) {
            if !p.reported {
                p.reported = true;
                self.lost.push((peer, why));
            }
        }
    }

    /// `peer` wrote a malformed packet: it is lost, and nothing more is read from its ring (the
    /// packets after a bad one cannot be told apart from it).
    fn malformed(&mut self, peer: Rank, why: impl std::fmt::Display) {
        if let Some(p) = self.peers.get_mut(peer as usize).and_then(Option::as_mut) {
            p.malformed = true;
            // It may still run: its writes and reads of our memory (rings, bounce slots,
            // exposed buffers) end here.
            self.provider.disconnect(p.qp);
        }
        // A protocol error, not a loss: the peer may still run (and hold keys of ours).
        self.fail_peer(peer, Error::protocol(peer, format!("malformed ib packet: {why}")));
    }

    /// Delivers complete packets of `peer`'s ring, up to `budget`; returns how many. Takes at
    /// most `credits` blocks (SYNCs included) per call: no more can land before this call
    /// returns their credits, so a peer that ignores its credits cannot keep it looping.
    fn poll_ring(&mut self, peer: Rank, budget: usize, sink: &mut dyn Sink) -> usize {
        let (credits_max, block, max_payload) = (self.credits, self.block, self.max_payload());
        let ring = self.rings.ptr() as usize + peer as usize * self.ring_bytes();
        let mut n = 0;
        for _ in 0..credits_max {
            if n >= budget {
                break;
            }
            let Some(p) = self.peers.get_mut(peer as usize).and_then(Option::as_mut) else { return n };
            if p.finished || p.malformed {
                return n;
            }
            let at = ring + (p.received % credits_max as u64) as usize * block;
            // SAFETY: `at` is an 8-aligned word inside the rings mapping (blocks are multiples
            // of 64 bytes). Acquire: once the tail is seen below, the payload written before it
            // is visible (the provider places the tail last).
            let w0 = unsafe { &*(at as *const AtomicU64) }.load(Ordering::Acquire);
            if w0 == 0 {
                // Not landed, or a compact packet, whose word 0 stays zero. A compact packet's
                // receive completion comes after every earlier write to the ring landed, so
                // when one waits, this block, the oldest unread, is the one it wrote.
                let Some(imm) = p.compact.pop_front() else { return n };
                let (len, credits) = match packet::decode_compact(imm, max_payload) {
                    Ok(v) => v,
                    Err(why) => {
                        self.malformed(peer, why);
                        return n;
                    }
                };
                let Some(prev) = p.read_header else {
                    self.malformed(peer, "a compact packet before any framed one");
                    return n;
                };
                if let Err(why) = take_credits(p, credits, credits_max) {
                    self.malformed(peer, why);
                    return n;
                }
                let hdr = prev.successor(len as u64);
                p.read_header = Some(hdr);
                p.received += 1;
                p.unreturned += 1;
                // Its receive goes back before the block's credit (with a later packet of ours),
                // so the peer always finds one posted.
                if let Err(e) = self.provider.post_recv(p.qp, wr_id(WrKind::Recv, peer, 0)) {
                    self.fail_peer(peer, lost(peer, format!("ib receive for rank {peer} not posted: {e}")));
                }
                // SAFETY: the block's data landed (its receive completed), and the sender does
                // not write the block again before we return its credit, after this call.
                let payload = unsafe { std::slice::from_raw_parts((at + DATA_OFFSET) as *const u8, len) };
                sink.message(peer, &hdr, payload);
                n += 1;
                continue;
            }
            // Word 0 may still be landing: an RDMA write need not place its first 8 bytes at
            // once (rxe copies bytes). Blocks are zeroed after use, so the length read so far
            // is at most the real one: one above the block's capacity is malformed already;
            // otherwise wait for the tail it points to, then read word 0 again and judge it.
            let len = (w0 & 0xffff_ffff) as usize;
            if len > max_payload {
                self.malformed(peer, format!("length {len} exceeds the block's payload capacity {max_payload}"));
                return n;
            }
            let tail_at = at + packet::tail_offset(len);
            // SAFETY: tail_offset(len) + 8 <= block for len <= max_payload; 8-aligned.
            let tail = unsafe { &*(tail_at as *const AtomicU64) };
            if tail.load(Ordering::Acquire) != packet::tail_value(p.received) {
                return n; // still landing
            }
            // SAFETY: as for the first load of word 0.
            let w0 = unsafe { &*(at as *const AtomicU64) }.load(Ordering::Acquire);
            let w = match packet::decode_word0(w0, max_payload) {
                Ok(w) if w.len == len => w,
                Ok(w) => {
                    self.malformed(peer, format!("length {} read after its tail landed, {len} before", w.len));
                    return n;
                }
                Err(why) => {
                    self.malformed(peer, why);
                    return n;
                }
            };
            if let Err(why) = take_credits(p, w.credits as usize, credits_max) {
                self.malformed(peer, why);
                return n;
            }
            p.received += 1;
            p.unreturned += 1;
            match w.kind {
                Kind::Data => {
                    // SAFETY: the block is complete (tail seen) and the sender does not write it
                    // again before we return its credit, which happens after this call.
                    let (wire, payload) = unsafe {
                        (
                            &*((at + HEADER_OFFSET) as *const [u8; Header::WIRE_LEN]),
                            std::slice::from_raw_parts((at + DATA_OFFSET) as *const u8, w.len),
                        )
                    };
                    let hdr = match Header::parse(wire) {
                        Ok(hdr) => hdr,
                        Err(why) => {
                            self.malformed(peer, why);
                            return n;
                        }
                    };
                    p.read_header = Some(hdr);
                    sink.message(peer, &hdr, payload);
                    n += 1;
                }
                Kind::Sync => {}
                // Not reported yet: the peer's last messages may still wait in another channel.
                // Once its process is gone, the heartbeat fails and it is reported finished.
                Kind::Bye => p.finished = true,
            }
            // Relaxed: the sender rewrites this block only after a later packet of ours returns
            // its credit; posting that packet orders these stores before it.
            tail.store(0, Ordering::Relaxed);
            // SAFETY: as for the load above.
            unsafe { &*(at as *const AtomicU64) }.store(0, Ordering::Relaxed);
        }
        n
    }

    /// Returns credits with a SYNC packet when the peer's view of free blocks falls under the
    /// sync limit.
    fn maybe_sync(&mut self, peer: Rank) {
        let Some(p) = self.peers.get(peer as usize).and_then(Option::as_ref) else { return };
        if p.reported || p.unreturned == 0 || self.credits - p.unreturned.min(self.credits) >= self.sync_limit {
            return;
        }
        // WouldBlock: retried at the next progress; an error surfaces through completions.
        let _ = self.send_packet(peer, Kind::Sync, None, &[]);
    }

    /// A free bounce slot for `len` bytes, making the pool at first use; `None` when the message
    /// is too large to bounce or every slot is busy (then it registers).
    fn bounce_slot(&mut self, len: usize) -> Option<u32> {
        if len == 0 || len > self.bounce_limit {
            return None;
        }
        if self.bounce.is_none() {
            match BouncePool::new(&mut self.provider, self.bounce_limit) {
                Ok(pool) => self.bounce = Some(pool),
                Err(e) => {
                    // Registration still works: stop trying to bounce.
                    tracing::warn!("ib: no bounce buffers ({e}); registering every rendezvous buffer");
                    self.bounce_limit = 0;
                    return None;
                }
            }
        }
        self.bounce.as_mut()?.take()
    }

    /// Local memory for `len` bytes at `ptr`: the long-lived registration covering them, a
    /// bounce slot (filled from `ptr` when `fill`), or a registration made now with `access`.
    /// Returns the address and lkey to use and what to release afterwards.
    fn local_memory(
        &mut self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        fill: bool,
    ) -> Result<(u64, MemoryRegion, Local)> {
        if let Some(mr) = self.pinned.iter().find(|m| m.contains(ptr as u64, len)) {
            return Ok((ptr as u64, *mr, Local::Pinned));
        }
        if let Some(slot) = self.bounce_slot(len) {
            let pool = self.bounce.as_ref().expect("bounce_slot made the pool");
            let at = pool.addr(slot);
            if fill {
                // SAFETY: the caller's `len` bytes at `ptr` are valid for reads (Region's
                // contract); the slot holds at least `len` bytes and nothing else uses it.
                unsafe { std::ptr::copy_nonoverlapping(ptr, at, len) };
            }
            return Ok((at as u64, *pool.region(), Local::Bounce { slot, user: ptr as usize, len }));
        }
        // SAFETY: the engine keeps the buffer valid until the operation or exposure ends
        // (Region's contract); the registration is released then.
        let mr = unsafe { self.provider.register(ptr, len.max(1), access)? };
        Ok((ptr as u64, mr, Local::Registered(mr)))
    }

    /// Ends the use of local memory from [`DirectIb::local_memory`]. For a bounce slot, copies
    /// the bytes of `landed` (offsets, clipped to the slot's length) to the user's memory first.
    fn release_local(&mut self, local: Local, landed: Range<usize>) {
        match local {
            Local::Pinned => {}
            Local::Registered(mr) => self.provider.deregister(&mr),
            Local::Bounce { slot, user, len } => {
                let Some(pool) = self.bounce.as_mut() else { return };
                let range = landed.start.min(len)..landed.end.min(len);
                if !range.is_empty() {
                    // SAFETY: the slot holds `len` bytes the peer or the device wrote; the user
                    // memory is a destination of `len` bytes the engine keeps valid until the
                    // request it belongs to ends, which is after this call.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            pool.addr(slot).add(range.start),
                            (user as *mut u8).add(range.start),
                            range.len(),
                        )
                    };
                }
                pool.give_back(slot);
            }
        }
    }

    /// The rkey, start address and length of a key made by `register`.
    pub(crate) fn decode_key(peer: Rank, key: &RemoteKey) -> Result<(u32, u64, u64)> {
        let b = key.as_bytes();
        if b.len() != KEY_LEN {
            return Err(Error::Transport {
                kind: "ib",
                what: format!("bad remote key from rank {peer}: {} bytes, expected {KEY_LEN}", b.len()),
            });
        }
        let addr = u64::from_le_bytes(b[4..12].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(b[12..20].try_into().unwrap_or_default());
        Ok((u32::from_le_bytes([b[0], b[1], b[2], b[3]]), addr, len))
    }

    /// Posts a one-sided operation in parts of at most the provider's transfer size.
    fn rma(
        &mut self,
        peer: Rank,
        opcode: Opcode,
        (local, len): (*mut u8, usize),
        key: &RemoteKey,
        offset: usize,
        op: OpId,
    ) -> Result<Issued> {
        let (rkey, base, exposed) = Self::decode_key(peer, key)?;
        // The peer's device checks the registration; this checks the exposure, which may be a
        // part of one (a bounce slot, a pinned pool), and names the problem without failing
        // the queue pair.
        if (offset as u64).checked_add(len as u64).is_none_or(|end| end > exposed) {
            return Err(Error::Transport {
                kind: "ib",
                what: format!("bytes {offset}..+{len} lie outside the {exposed} bytes rank {peer} exposed"),
            });
        }
        let remote = base.wrapping_add(offset as u64);
        let max = self.provider.max_transfer();
        let parts = len.div_ceil(max).max(1);
        let limit = self.provider.max_outstanding();
        let p = self.sending_peer(peer)?;
        if p.reported {
            return Err(Error::PeerLost { rank: peer, why: "its ib queue pair failed".into() });
        }
        if p.outstanding + parts > limit {
            return Ok(Issued::WouldBlock);
        }
        let qp = p.qp;
        let reads = opcode == Opcode::Read;
        let access = if reads { Access::LOCAL_WRITE } else { Access(0) };
        let (local_addr, mr, local) = self.local_memory(local, len, access, !reads)?;
        // A write from a bounce slot left the user's buffer alone, and an RC queue pair places
        // it before any later packet to the peer (and flushes those if it fails).
        let ordered = !reads && matches!(local, Local::Bounce { .. });
        let index = match self.free_ops.pop() {
            Some(i) => i,
            None => {
                self.ops.push(None);
                (self.ops.len() - 1) as u32
            }
        };
        self.ops[index as usize] = Some(RmaOp { op, peer, parts_left: parts, error: None, local, reads });
        for i in 0..parts {
            let at = i * max;
            let wr = WorkRequest {
                wr_id: wr_id(WrKind::Rma, peer, index),
                opcode,
                local_addr: local_addr + at as u64,
                len: (len - at).min(max),
                lkey: mr.lkey,
                remote_addr: remote.wrapping_add(at as u64),
                rkey,
                inline: false,
                imm: None,
            };
            if let Err(e) = self.provider.post(qp, &wr) {
                // The parts posted so far still complete; the rest count as failed.
                let o = self.ops[index as usize].as_mut().map(|o| {
                    o.parts_left -= parts - i;
                    o.error.get_or_insert(WcStatus::Flushed);
                    o.parts_left
                });
                if o == Some(0) {
                    if let Some(op) = self.ops[index as usize].take() {
                        self.release_local(op.local, 0..0);
                    }
                    self.free_ops.push(index);
                    return Err(e);
                }
                // Its completion reports the failure.
                return Ok(Issued::Pending);
            }
            self.in_flight += 1;
            if let Ok(p) = self.peer_mut(peer) {
                p.outstanding += 1;
            }
        }
        Ok(if ordered { Issued::Ordered } else { Issued::Pending })
    }

    /// Polls up to `budget` completions into `sink`; returns how many.
    fn poll_completions(&mut self, budget: usize, sink: &mut dyn Sink) -> usize {
        // Without requests in flight the queue holds only receive completions, of compact
        // packets: none come when the provider does not cut transfers into packets.
        if self.in_flight == 0 && self.mtu.is_none() {
            return 0;
        }
        let mut done = 0;
        while done < budget {
            let want = (budget - done).min(64);
            self.completions.clear();
            let mut batch = std::mem::take(&mut self.completions);
            let n = self.provider.poll(&mut batch, want);
            for c in batch.drain(..) {
                self.complete(c, sink);
            }
            self.completions = batch;
            done += n;
            if n < want {
                break;
            }
        }
        done
    }

    /// Delivers up to `budget` packets from the rings of peers whose compact packets landed; a
    /// peer whose ring may hold more stays on the list.
    fn poll_compact(&mut self, budget: usize, sink: &mut dyn Sink) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(peer) = self.compact_ready.pop() else { break };
            let left = budget - n;
            let got = self.poll_ring(peer, left, sink);
            self.maybe_sync(peer);
            if got == left {
                self.compact_ready.push(peer);
            }
            n += got;
        }
        n
    }

    /// Reports failed peers, each after delivering what its ring still holds: a peer that
    /// finalized wrote its last messages and its BYE before it exited, and a write of ours that
    /// failed since (a credit return, a heartbeat) must not make them lost.
    fn report_lost(&mut self, sink: &mut dyn Sink) {
        for (peer, why) in std::mem::take(&mut self.lost) {
            // What the peer wrote before.
            self.poll_ring(peer, usize::MAX, sink);
            let finished = self.peers.get(peer as usize).and_then(Option::as_ref).is_some_and(|p| p.finished);
            sink.peer_lost(peer, if finished { Error::PeerFinished { rank: peer } } else { why });
        }
    }
}

impl<P: Provider> Drop for DirectIb<P> {
    fn drop(&mut self) {
        let exposed = self.exposed.drain().map(|(_, l)| l);
        let in_flight = self.ops.iter_mut().flatten().map(|o| std::mem::replace(&mut o.local, Local::Pinned));
        for local in exposed.chain(in_flight).collect::<Vec<_>>() {
            if let Local::Registered(mr) = local {
                self.provider.deregister(&mr);
            }
        }
        if let Some(pool) = &self.bounce {
            pool.release(&mut self.provider);
        }
        for mr in &self.pinned {
            self.provider.deregister(mr);
        }
        self.provider.deregister(&self.rings_mr);
        self.provider.deregister(&self.staging_mr);
    }
}

impl<P: Provider> Transport for DirectIb<P> {
    fn attr(&self) -> &TransportAttr {
        &self.attr
    }

    /// `"PRIB"`, provider name (u8 length + bytes), device endpoint (u32 length + bytes), rings
    /// address u64 and rkey u32, credits u32, block u32, MTU of compact packets u32 (0: none
    /// taken), job size u32, then one queue pair number u32 per rank (little endian).
    fn address(&self) -> Address {
        let name = self.provider.name().as_bytes();
        let endpoint = self.provider.endpoint();
        let mut a = Vec::with_capacity(40 + endpoint.len() + 4 * self.size as usize);
        a.extend_from_slice(&ADDR_MAGIC.to_le_bytes());
        a.push(name.len() as u8);
        a.extend_from_slice(name);
        a.extend_from_slice(&(endpoint.len() as u32).to_le_bytes());
        a.extend_from_slice(&endpoint);
        a.extend_from_slice(&self.rings_mr.addr.to_le_bytes());
        a.extend_from_slice(&self.rings_mr.rkey.to_le_bytes());
        a.extend_from_slice(&(self.credits as u32).to_le_bytes());
        a.extend_from_slice(&(self.block as u32).to_le_bytes());
        a.extend_from_slice(&self.mtu.map_or(0, |m| m.min(u32::MAX as usize) as u32).to_le_bytes());
        a.extend_from_slice(&self.size.to_le_bytes());
        for q in &self.qps {
            a.extend_from_slice(&q.map_or(0, |(_, n)| n).to_le_bytes());
        }
        a
    }

    fn add_peer(&mut self, peer: &PeerInfo, address: &[u8]) -> Reach {
        let r = peer.rank;
        let Some(Some((qp, _))) = self.qps.get(r as usize).copied() else {
            return Reach::No(if r == self.rank {
                "own rank (the loopback channel carries messages to oneself)".into()
            } else {
                format!("rank {r} outside a job of {} ranks", self.size)
            });
        };
        let a = match parse_address(address) {
            Ok(a) => a,
            Err(why) => return Reach::No(why),
        };
        if a.provider != self.provider.name() {
            return Reach::No(format!(
                "rank {r} uses the {} provider, this process {}: set the same POLYRAIL_IB_PROVIDER everywhere",
                a.provider,
                self.provider.name()
            ));
        }
        if a.credits != self.credits || a.block != self.block || a.size != self.size {
            return Reach::No(format!(
                "eager ring geometry differs: {} x {} B in a job of {} here, {} x {} B in a job of {} at rank {r} (set the same POLYRAIL_IB_CREDITS / POLYRAIL_IB_BLOCK everywhere)",
                self.credits, self.block, self.size, a.credits, a.block, a.size
            ));
        }
        let remote_qpn = a.qpns[self.rank as usize];
        // Receives for compact packets go first: the peer may write once we are connected.
        if self.mtu.is_some() {
            for _ in 0..self.credits {
                if let Err(e) = self.provider.post_recv(qp, wr_id(WrKind::Recv, r, 0)) {
                    return Reach::No(format!("receives for compact packets not posted: {e}"));
                }
            }
        }
        if let Err(e) = self.provider.connect(qp, &a.endpoint, remote_qpn) {
            return Reach::No(e.to_string());
        }
        // Both ends cut packets at the smaller MTU, and the peer takes compact ones.
        let compact_mtu = match (self.mtu, a.mtu) {
            (Some(mine), theirs) if theirs != 0 => mine.min(theirs as usize),
            _ => 0,
        };
        let ring_bytes = self.ring_bytes() as u64;
        // The peer's address gives where its rings start: ours and our heartbeat word must be
        // addresses, not an overflow.
        let at = |n: u64, plus: u64| n.checked_mul(ring_bytes)?.checked_add(plus)?.checked_add(a.rings);
        let heartbeat = (HEARTBEAT_BYTES as u64).checked_mul(self.rank as u64);
        let (Some(remote_ring), Some(remote_heartbeat)) =
            (at(self.rank as u64, 0), heartbeat.and_then(|h| at(self.size as u64, h)))
        else {
            return Reach::No(format!("its address places its rings at {:#x}, where ours would overflow", a.rings));
        };
        self.peers[r as usize] = Some(Peer {
            qp,
            remote_ring,
            remote_rkey: a.rings_rkey,
            remote_heartbeat,
            sent: 0,
            credits: self.credits,
            received: 0,
            unreturned: 0,
            outstanding: 0,
            compact_mtu,
            sent_header: None,
            read_header: None,
            compact: VecDeque::new(),
            sending: false,
            heartbeat_pending: false,
            finished: false,
            malformed: false,
            reported: false,
        });
        self.active.push(r);
        Reach::Yes(format!(
            "{} provider: RC queue pair {} connected to queue pair {remote_qpn} of rank {r} (ready to send on first use); eager ring {} x {} B",
            self.provider.name(),
            qp,
            self.credits,
            self.block
        ))
    }

    fn try_send(&mut self, peer: Rank, hdr: &Header, payload: &[u8]) -> Result<Issued> {
        if payload.len() > self.max_payload() {
            return Err(Error::InvalidArgument(format!(
                "ib packet payload of {} bytes exceeds the eager block capacity {}",
                payload.len(),
                self.max_payload()
            )));
        }
        self.send_packet(peer, Kind::Data, Some(hdr), payload)
    }

    fn progress(&mut self, budget: usize, sink: &mut dyn Sink) -> Result<usize> {
        // Every part takes what the parts before it left of the budget.
        let mut n = self.poll_completions(budget, sink);
        n += self.poll_compact(budget.saturating_sub(n), sink);
        // Polling priority (Chai Ch. 7): the ring that delivered last on every call, all of
        // them now and then, so that idle peers do not make every call slower. Credits are
        // returned as rings are read (a SYNC that would block is retried at the ring's next poll).
        let mut sweep = std::mem::take(&mut self.sweep);
        let active = std::mem::take(&mut self.active);
        if n < budget {
            n += sweep.run(&active, budget - n, |peer, left| {
                let got = self.poll_ring(peer, left, sink);
                self.maybe_sync(peer);
                got
            });
        }
        (self.sweep, self.active) = (sweep, active);
        if !self.lost.is_empty() {
            self.report_lost(sink);
        }
        Ok(n)
    }

    fn observe(&mut self, peer: Rank, what: Observe) -> Option<Observation> {
        (what == Observe::Unread).then(|| Observation::Unread(self.has_unread(peer)))
    }

    /// Writes a word into each idle peer's heartbeat area: a peer that is gone turns that write
    /// into a completion error, which reports it lost.
    fn check_peers(&mut self, sink: &mut dyn Sink) {
        let limit = self.provider.max_outstanding();
        let src = self.staging_mr;
        for i in 0..self.active.len() {
            let r = self.active[i];
            let Some(p) = self.peers[r as usize].as_mut() else { continue };
            if p.reported || p.heartbeat_pending || p.outstanding >= limit {
                continue;
            }
            if p.ready_to_send(&mut self.provider).is_err() {
                continue;
            }
            let wr = WorkRequest {
                wr_id: wr_id(WrKind::Heartbeat, r, 0),
                opcode: Opcode::Write,
                local_addr: src.addr,
                len: HEARTBEAT_BYTES,
                lkey: src.lkey,
                remote_addr: p.remote_heartbeat,
                rkey: p.remote_rkey,
                inline: true,
                imm: None,
            };
            if self.provider.post(p.qp, &wr).is_ok() {
                p.heartbeat_pending = true;
                p.outstanding += 1;
                self.in_flight += 1;
            }
        }
        self.poll_completions(usize::MAX, sink);
        self.report_lost(sink);
    }

    /// Tells every peer this process is done (BYE), then waits (bounded) until every write in
    /// flight left: a process that exits tears its queue pairs down with it.
    fn finalize(&mut self) {
        // A BYE that finds no free staging block (many peers, completions not polled yet) is
        // sent again once completions free one: without it the peer takes our exit for a loss.
        let mut unsent = self.active.clone();
        let mut send_byes = |t: &mut Self| {
            unsent.retain(|&r| matches!(t.send_packet(r, Kind::Bye, None, &[]), Ok(Issued::WouldBlock)));
            !unsent.is_empty()
        };
        let mut byes_left = send_byes(self);
        struct Ignore;
        impl Sink for Ignore {
            fn message(&mut self, _: Rank, _: &Header, _: &[u8]) {}
            fn completed(&mut self, _: OpId, _: Result<()>) {}
            fn peer_lost(&mut self, _: Rank, _: Error) {}
        }
        let start = Instant::now();
        while (byes_left || self.peers.iter().flatten().any(|p| p.outstanding > 0)) && start.elapsed() < FINALIZE_DRAIN
        {
            if self.poll_completions(usize::MAX, &mut Ignore) == 0 {
                std::thread::yield_now();
            }
            if byes_left {
                byes_left = send_byes(self);
            }
        }
        if let Some(pacing) = self.provider.pacing_summary() {
            tracing::info!("ib: {pacing}");
        }
    }

    fn describe(&self) -> String {
        let lost = self.peers.iter().flatten().filter(|p| p.reported && !p.finished).count();
        format!(
            "{}; eager ring {} x {} B per peer (payload up to {} B), sync limit {}, {}, {}, {} peers connected{}",
            self.provider.describe(),
            self.credits,
            self.block,
            self.max_payload(),
            self.sync_limit,
            match self.mtu {
                Some(m) => format!(
                    "packets of whole {m}-byte MTUs without header (write with immediate) in streams of like messages"
                ),
                None => "every packet framed (POLYRAIL_IB_COMPACT=off, or a provider without MTU)".to_string(),
            },
            match self.bounce_limit {
                0 => "every rendezvous buffer registered".to_string(),
                n => format!("rendezvous up to {} through {} bounce buffers", format_size(n), bounce::SLOTS),
            },
            self.active.len(),
            if lost > 0 { format!(", {lost} lost") } else { String::new() }
        )
    }

    fn memory(&mut self) -> Option<&mut dyn OneSided> {
        Some(self)
    }
}

impl<P: Provider> OneSided for DirectIb<P> {
    /// Long-lived memory is registered with the adapter for every access. A transfer's buffer
    /// inside such memory needs nothing; elsewhere a source is copied into a bounce slot now, a
    /// destination's slot is copied out at `deregister`, and registrations made here allow
    /// only `access`.
    fn register(&mut self, region: Region, access: PeerAccess, lifetime: Lifetime) -> Result<MemHandle> {
        let (addr, rkey) = match lifetime {
            Lifetime::Lasting { .. } => {
                // SAFETY: the caller keeps the memory valid until deregister (the trait's
                // contract).
                let mr = unsafe { self.provider.register(region.ptr as *mut u8, region.len.max(1), Access::ALL)? };
                self.pinned.push(mr);
                (region.ptr as u64, mr.rkey)
            }
            Lifetime::Transfer => {
                let (reads, flags) = match access {
                    PeerAccess::Read => (true, Access::REMOTE_READ),
                    PeerAccess::Write => (false, Access::REMOTE_WRITE | Access::LOCAL_WRITE),
                    PeerAccess::ReadWrite => (true, Access::ALL),
                };
                let (addr, mr, local) = self.local_memory(region.ptr as *mut u8, region.len, flags, reads)?;
                if !matches!(local, Local::Pinned) {
                    self.exposed.insert((mr.rkey, addr), local);
                }
                (addr, mr.rkey)
            }
        };
        let mut k = [0u8; KEY_LEN];
        k[..4].copy_from_slice(&rkey.to_le_bytes());
        k[4..12].copy_from_slice(&addr.to_le_bytes());
        k[12..20].copy_from_slice(&(region.len as u64).to_le_bytes());
        let key = RemoteKey::new(&k).ok_or_else(|| Error::InvalidArgument("remote key too long".into()))?;
        Ok(MemHandle::new(key, &lifetime))
    }

    fn deregister(&mut self, handle: &MemHandle, written: Range<usize>) {
        let Ok((rkey, addr, len)) = Self::decode_key(self.rank, handle.key()) else { return };
        if !handle.is_lasting() {
            if let Some(local) = self.exposed.remove(&(rkey, addr)) {
                self.release_local(local, written);
            }
            return;
        }
        let len = (len as usize).max(1);
        if let Some(i) = self.pinned.iter().position(|m| m.rkey == rkey && m.addr == addr && m.len == len) {
            let mr = self.pinned.swap_remove(i);
            self.provider.deregister(&mr);
        }
    }

    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, op: OpId) -> Result<Issued> {
        self.rma(peer, Opcode::Read, (into.ptr, into.len), key, offset, op)
    }

    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, op: OpId) -> Result<Issued> {
        // An RDMA write only reads the local buffer: the cast to *mut does not write.
        self.rma(peer, Opcode::Write, (from.ptr as *mut u8, from.len), key, offset, op)
    }
}

/// `peer` lost (its process gone or unreachable) for `why`.
fn lost(peer: Rank, why: String) -> Error {
    Error::PeerLost { rank: peer, why }
}

/// Adds the `credits` a packet of the peer returns to `p`; `Err` when that is more than the
/// blocks written to it and not returned yet.
fn take_credits(p: &mut Peer, credits: usize, credits_max: usize) -> std::result::Result<(), String> {
    if p.credits + credits > credits_max {
        return Err(format!("returns {credits} credits, only {} outstanding", credits_max - p.credits));
    }
    p.credits += credits;
    Ok(())
}
