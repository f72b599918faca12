//! Scenario tests of the engine over a simulated job: engines joined by in-memory packet
//! queues (channel 0, active messages) and memcpy one-sided copies (channel 1).

use super::send::in_ranges;
use super::*;
use crate::config::SkewPolicy;
use crate::config::SplitShare;
use crate::header::PacketKind;
use crate::observe::{Observation, Placement};
use crate::policy::Protocol;
use crate::policy::{PeerRoute, PlacementRule, RouteEntry};
use crate::transport::Lifetime;
use crate::transport::{MemHandle, PeerAccess};
use proptest::prelude::*;
use std::collections::VecDeque;

const AM: ChannelId = ChannelId(0);
const RMA: ChannelId = ChannelId(1);

/// A packet in flight.
struct Packet {
    from: Rank,
    hdr: Header,
    payload: Vec<u8>,
}

/// Memory a rank exposed: its region, and the stand-in peers really access when the sim plays
/// a channel that bounces (a copy of a source, a scratch area for a destination).
struct Exposure {
    key: RemoteKey,
    region: Region,
    stand_in: Option<Vec<u8>>,
}

/// A job of engines in one process; keys are (address, length) of the exposing engine's memory
/// (or of its stand-in).
struct Sim {
    engines: Vec<Engine>,
    /// Packets to each rank, in order.
    wires: Vec<VecDeque<Packet>>,
    /// Ordered packets delivered (to, from, seq), for the reference model.
    delivered: Vec<(Rank, Rank, u32)>,
    /// Expose stand-ins instead of the memory itself, as a channel with bounce buffers does.
    stand_ins: bool,
    /// Live exposures, per rank.
    exposed: Vec<Vec<Exposure>>,
    /// Answer puts with `Issued::Ordered` (data placed at once) and keep their completions
    /// here, to be delivered late.
    ordered_puts: Option<Vec<(Rank, OpId)>>,
    /// For every get: the rank and how many exposures it held when it issued it.
    held_at_get: Vec<(Rank, usize)>,
    /// A rank whose gets fail (copy nothing, complete with an error).
    failing_gets: Option<Rank>,
    /// A rank whose puts fail likewise.
    failing_puts: Option<Rank>,
    /// Ranks whose exposures fail (e.g. memory a channel cannot register).
    failing_exposures: Vec<Rank>,
    /// Receives whose withdrawal was asked for (`CancelRecv::Asked`), by rank: watched after
    /// each delivery to it; those withdrawn go to `withdrawn` with the ordered packets that rank
    /// had received then.
    asked: Vec<(Rank, ReqId)>,
    withdrawn: Vec<(ReqId, usize)>,
}

fn route(frag: usize, protocols: &[(usize, Protocol)]) -> PeerRoute {
    let entries = protocols
        .iter()
        .map(|&(upto, protocol)| RouteEntry {
            upto,
            protocol,
            channel: if protocol.is_one_sided() { RMA } else { AM },
            reason: String::new(),
        })
        .collect();
    PeerRoute { am: AM, frag, entries, stream_eager: None, placement: None, mapped: None, as_written: false }
}

/// Eager below 1k (fragments of 100 bytes), get up to 4k, split above.
fn one_sided_route() -> PeerRoute {
    route(100, &[(1023, Protocol::Eager), (4095, Protocol::RndvGet), (usize::MAX, Protocol::RndvSplit)])
}

/// [`one_sided_route`] with a placement rule measured at run time (near within 40 ns, apart
/// beyond 100).
fn placed_route(near_upto: Option<usize>, apart_from: Option<usize>) -> PeerRoute {
    let rule = PlacementRule { near_upto, apart_from, rma: RMA, given: None, reason: String::new() };
    PeerRoute { placement: Some(rule), ..one_sided_route() }
}

/// Sends `len` bytes from rank 0 with `tag` to a receive rank 1 posted first; checks what
/// arrived and returns the kind of the message's first packet.
fn first_packet_kind(sim: &mut Sim, len: usize, tag: u32) -> PacketKind {
    let data = pattern(tag as u8, len);
    let mut out = vec![0u8; len];
    let q = recv(sim, 1, Source::Rank(0), TagMatch::Tag(tag), &mut out);
    sim.settle();
    let before = sim.wires[1].len();
    let s = send(sim, 0, 1, tag, &data);
    sim.run_actions();
    let kind = sim.wires[1][before].hdr.kind;
    sim.settle();
    assert!(result(sim, 0, s).is_ok() && result(sim, 1, q).is_ok());
    assert_eq!(out, data);
    kind
}

/// Eager up to 1k, streamed above.
fn stream_route() -> PeerRoute {
    route(100, &[(1024, Protocol::Eager), (usize::MAX, Protocol::RndvStream)])
}

impl Sim {
    fn new(n: u32, r: impl Fn() -> PeerRoute) -> Sim {
        let mut engines: Vec<Engine> = (0..n).map(|i| Engine::new(i, n, Tuning::default())).collect();
        for e in &mut engines {
            for p in 0..n {
                e.set(Setting::Route(p, Ok(r())));
            }
        }
        Sim {
            engines,
            wires: (0..n).map(|_| VecDeque::new()).collect(),
            delivered: Vec::new(),
            stand_ins: false,
            exposed: (0..n).map(|_| Vec::new()).collect(),
            ordered_puts: None,
            held_at_get: Vec::new(),
            failing_gets: None,
            failing_puts: None,
            failing_exposures: Vec::new(),
            asked: Vec::new(),
            withdrawn: Vec::new(),
        }
    }

    /// A sim whose one-sided channel exposes stand-ins (see [`Exposure`]).
    fn bouncing(n: u32, r: impl Fn() -> PeerRoute) -> Sim {
        Sim { stand_ins: true, ..Sim::new(n, r) }
    }

    /// No rank holds more exposures than it has requests: finished ones released theirs.
    fn assert_exposures_released(&self) {
        for (e, x) in self.engines.iter().zip(&self.exposed) {
            assert!(
                x.len() <= e.running_requests(),
                "rank {} holds {} exposures for {} running requests",
                e.rank(),
                x.len(),
                e.running_requests()
            );
        }
    }

    /// Runs every queued action of every engine (not delivering packets).
    fn run_actions(&mut self) {
        loop {
            let mut any = false;
            for i in 0..self.engines.len() {
                while let Some(a) = self.engines[i].poll_action() {
                    any = true;
                    self.execute(i as Rank, a);
                    self.check_awaited(i as Rank);
                }
            }
            if !any {
                return;
            }
        }
    }

    fn execute(&mut self, me: Rank, a: Action) {
        let e = &mut self.engines[me as usize];
        match a {
            Action::Send { to, hdr, payload, op, .. } => {
                let payload = match payload {
                    Payload::Empty => Vec::new(),
                    // SAFETY: the engine promises user payloads are valid until it is told they left.
                    Payload::User(r) => unsafe { std::slice::from_raw_parts(r.ptr, r.len) }.to_vec(),
                    Payload::Key(k) => k.as_bytes().to_vec(),
                };
                self.wires[to as usize].push_back(Packet { from: me, hdr, payload });
                if let Some(op) = op {
                    e.handle_op(op, OpOutcome::Sent);
                }
            }
            Action::Register { channel, region, access, op } => {
                assert_eq!(channel, RMA);
                if self.failing_exposures.contains(&me) {
                    let refused = Error::Transport { kind: "sim", what: "cannot register".into() };
                    return e.handle_op(op, OpOutcome::Registered(Err(refused)));
                }
                let stand_in = self.stand_ins.then(|| match access {
                    // SAFETY: the engine exposes live request buffers.
                    PeerAccess::Read => unsafe { std::slice::from_raw_parts(region.ptr, region.len) }.to_vec(),
                    PeerAccess::Write => vec![0xee; region.len],
                    PeerAccess::ReadWrite => unreachable!("the engine registers a buffer for one access"),
                });
                let addr = stand_in.as_ref().map_or(region.ptr as u64, |s| s.as_ptr() as u64);
                let mut k = Vec::new();
                k.extend_from_slice(&addr.to_le_bytes());
                k.extend_from_slice(&(region.len as u64).to_le_bytes());
                let key = RemoteKey::new(&k).unwrap();
                self.exposed[me as usize].push(Exposure { key, region, stand_in });
                e.handle_op(op, OpOutcome::Registered(Ok(MemHandle::new(key, &Lifetime::Transfer))));
            }
            Action::Deregister { handle, written, .. } => {
                assert!(!handle.is_lasting(), "the engine registers buffers for one transfer");
                let x = &mut self.exposed[me as usize];
                let i = x.iter().position(|x| x.key == *handle.key()).expect("deregistration of a key not registered");
                let x = x.swap_remove(i);
                assert!(written.end <= x.region.len, "written {written:?} outside {} bytes", x.region.len);
                if let Some(s) = x.stand_in {
                    // SAFETY: the request's buffer lives until its result is taken, after this.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            s[written.clone()].as_ptr(),
                            (x.region.ptr as *mut u8).add(written.start),
                            written.len(),
                        )
                    };
                }
            }
            Action::Get { key, offset, into, op, .. } => {
                self.held_at_get.push((me, self.exposed[me as usize].len()));
                if self.failing_gets == Some(me) {
                    let refused = Error::Transport { kind: "sim", what: "get refused".into() };
                    return e.handle_op(op, OpOutcome::Done(Err(refused)));
                }
                let (addr, len) = decode_key(&key);
                assert!(offset + into.len <= len, "get out of the exposed region");
                // SAFETY: test keys name live buffers of this process, bounds checked above.
                unsafe { std::ptr::copy_nonoverlapping((addr + offset) as *const u8, into.ptr, into.len) };
                e.handle_op(op, OpOutcome::Done(Ok(())));
            }
            Action::Put { from, key, offset, op, .. } => {
                if self.failing_puts == Some(me) {
                    let refused = Error::Transport { kind: "sim", what: "put refused".into() };
                    return e.handle_op(op, OpOutcome::Done(Err(refused)));
                }
                let (addr, len) = decode_key(&key);
                assert!(offset + from.len <= len, "put out of the exposed region");
                // SAFETY: as for Get.
                unsafe { std::ptr::copy_nonoverlapping(from.ptr, (addr + offset) as *mut u8, from.len) };
                match &mut self.ordered_puts {
                    Some(late) => {
                        late.push((me, op));
                        e.handle_op(op, OpOutcome::Ordered);
                    }
                    None => e.handle_op(op, OpOutcome::Done(Ok(()))),
                }
            }
        }
    }

    /// Delivers the next packet to `to`; false when none is queued.
    fn deliver_one(&mut self, to: Rank) -> bool {
        let Some(p) = self.wires[to as usize].pop_front() else { return false };
        let hdr = p.hdr;
        if hdr.kind.is_ordered() {
            self.delivered.push((to, p.from, hdr.seq));
        }
        if let Err(e) = self.engines[to as usize].handle_message(p.from, &hdr, &p.payload) {
            panic!("rank {to} refused {hdr:?} from {}: {e}", p.from);
        }
        self.check_awaited(to);
        if !self.asked.is_empty() {
            let arrived = self.delivered.iter().filter(|d| d.0 == to).count();
            let (engine, withdrawn) = (&self.engines[to as usize], &mut self.withdrawn);
            self.asked.retain(|&(rank, id)| match (rank == to).then(|| engine.cancel_outcome(id)).flatten() {
                Some(true) => {
                    withdrawn.push((id, arrived));
                    false
                }
                Some(false) => false,
                None => true,
            });
        }
        true
    }

    /// The engine's cached awaited channels are what its state says: no event forgot to
    /// invalidate the cache.
    fn check_awaited(&mut self, rank: Rank) {
        let e = &mut self.engines[rank as usize];
        let cached = e.awaited_channels();
        assert_eq!(cached, e.compute_awaited(), "rank {rank}: stale awaited channels");
    }

    /// Runs until nothing moves.
    fn settle(&mut self) {
        loop {
            self.run_actions();
            let mut any = false;
            for to in 0..self.engines.len() as Rank {
                while self.deliver_one(to) {
                    any = true;
                    self.run_actions();
                }
            }
            if !any {
                return;
            }
        }
    }
}

fn decode_key(k: &RemoteKey) -> (usize, usize) {
    let b = k.as_bytes();
    (
        u64::from_le_bytes(b[0..8].try_into().unwrap()) as usize,
        u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize,
    )
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn send(sim: &mut Sim, from: Rank, to: Rank, tag: u32, buf: &[u8]) -> ReqId {
    send_in(sim, from, to, tag, 0, buf)
}

/// [`send`] in matching context `ctx`.
fn send_in(sim: &mut Sim, from: Rank, to: Rank, tag: u32, ctx: u16, buf: &[u8]) -> ReqId {
    let msg = Outgoing::Message { tag, space: SpaceId(ctx) };
    // SAFETY: tests keep `buf` alive until settle() finished the request.
    unsafe { sim.engines[from as usize].post_send(to, msg, Region { ptr: buf.as_ptr(), len: buf.len() }) }.unwrap()
}

fn recv(sim: &mut Sim, me: Rank, src: Source, tag: TagMatch, buf: &mut [u8]) -> ReqId {
    recv_in(sim, me, src, tag, 0, buf)
}

/// [`recv`] in matching context `ctx`.
fn recv_in(sim: &mut Sim, me: Rank, src: Source, tag: TagMatch, ctx: u16, buf: &mut [u8]) -> ReqId {
    let region = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
    // SAFETY: as for send.
    request(unsafe { sim.engines[me as usize].post_recv(src, tag, SpaceId(ctx), region, RecvPath::Request) }).unwrap()
}

/// The request [`Engine::post_recv`] made with [`RecvPath::Request`] (or its error).
fn request(posted: Result<Posted>) -> Result<ReqId> {
    posted.map(|p| match p {
        Posted::Request(id) => id,
        other => panic!("a receive posted as a request was not: {other:?}"),
    })
}

fn result(sim: &mut Sim, me: Rank, id: ReqId) -> Result<Status> {
    finished(sim, me, id).result
}

/// How request `id` of rank `me` ended (with whether a peer may still write its buffer).
fn finished(sim: &mut Sim, me: Rank, id: ReqId) -> Finished {
    sim.engines[me as usize].take_result(id).expect("request finished")
}

/// Sends `len` bytes 0 -> 1 with the receive posted before or after, checks data and status,
/// over a channel that exposes memory directly and over one that bounces.
fn transfer(r: fn() -> PeerRoute, len: usize, recv_first: bool) {
    transfer_in(Sim::new(2, r), len, recv_first);
    transfer_in(Sim::bouncing(2, r), len, recv_first);
}

fn transfer_in(mut sim: Sim, len: usize, recv_first: bool) {
    let data = pattern(len as u8, len);
    let mut out = vec![0u8; len + 7];
    let (s, q);
    if recv_first {
        q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(5), &mut out);
        sim.settle();
        s = send(&mut sim, 0, 1, 5, &data);
    } else {
        s = send(&mut sim, 0, 1, 5, &data);
        sim.settle();
        q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(5), &mut out);
    }
    sim.settle();
    assert_eq!(result(&mut sim, 0, s).unwrap().len, len);
    assert_eq!(result(&mut sim, 1, q).unwrap(), Status { source: 0, tag: 5, len });
    assert_eq!(&out[..len], &data[..], "len {len} recv_first {recv_first}");
    assert_eq!(sim.engines[0].active_requests() + sim.engines[1].active_requests(), 0);
    assert!(sim.exposed.iter().all(Vec::is_empty), "every exposure released");
}

#[test]
fn every_protocol_both_orders() {
    for len in [0, 1, 99, 100, 101, 1023, 1024, 1025, 4095, 4096, 8191, 8192, 20000, 100_003] {
        for recv_first in [false, true] {
            transfer(one_sided_route, len, recv_first);
            transfer(stream_route, len, recv_first);
        }
    }
}

#[test]
fn empty_messages_by_rendezvous_finish() {
    for r in [
        (|| route(100, &[(usize::MAX, Protocol::RndvGet)])) as fn() -> PeerRoute,
        || route(100, &[(usize::MAX, Protocol::RndvSplit)]),
        || route(100, &[(usize::MAX, Protocol::RndvStream)]),
    ] {
        for recv_first in [false, true] {
            for len in [0, 1] {
                transfer(r, len, recv_first);
            }
        }
    }
}

#[test]
fn receiver_first_uses_rtr_and_put() {
    let mut sim = Sim::new(2, one_sided_route);
    let data = pattern(1, 2000);
    let mut out = vec![0u8; 2000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    sim.run_actions();
    // The receiver announced its buffer.
    let rtr = sim.wires[0][0].hdr;
    assert_eq!(rtr.kind, PacketKind::Rtr);
    sim.settle();
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.run_actions();
    // The data was written before any packet reached the receiver.
    assert_eq!(out, data);
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
}

/// At finalize, a receive whose RTR gave a live peer its key is withdrawn through that peer
/// (its answer ends the receive, and nothing stays exposed). One whose withdrawal is not
/// answered in time, and a discard after a failed wait, are reported as possibly written by
/// that peer, whose put may still come; once the peer is gone, or when no RTR went out, not.
#[test]
fn a_withdrawn_receive_whose_key_went_out_stays_out_of_use() {
    let mut sim = Sim::new(3, one_sided_route);
    let mut announced = vec![0u8; 2000];
    let mut small = vec![0u8; 8];
    let mut from_gone = vec![0u8; 2000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut announced);
    let quiet = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(2), &mut small);
    let g = recv(&mut sim, 1, Source::Rank(2), TagMatch::Tag(1), &mut from_gone);
    sim.run_actions();
    assert_eq!(sim.wires[0].len(), 1, "one RTR to rank 0 (none for the eager size)");
    assert!(sim.engines[1].lends_keys_to_live_peers(), "rank 0 holds the key of `q`");
    sim.engines[1].handle_peer_lost(2, Error::PeerFinished { rank: 2 });
    assert!(sim.engines[1].lends_keys_to_live_peers());
    assert_eq!(sim.engines[1].finalize(Finalize::Withdraw).receives, 2);
    assert!(result(&mut sim, 1, quiet).is_err() && result(&mut sim, 1, g).is_err());
    assert!(sim.engines[1].lends_keys_to_live_peers(), "rank 0 has not answered yet");
    sim.settle();
    assert!(!sim.engines[1].lends_keys_to_live_peers(), "no running receive lends a key");
    assert!(sim.engines[1].take_all_peer_may_write().is_empty());
    assert!(result(&mut sim, 1, q).is_err());
    assert!(sim.exposed[1].is_empty(), "the withdrawn receive's exposure ended");
    // A withdrawal the process cannot wait for.
    let a = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(5), &mut announced);
    sim.run_actions();
    assert_eq!(sim.engines[1].finalize(Finalize::Withdraw).receives, 1);
    assert_eq!(sim.engines[1].finalize(Finalize::Abandon).peer_may_write, vec![a]);
    assert!(result(&mut sim, 1, a).is_err());
    sim.settle(); // the late answer changes nothing
                  // A discard after a failed wait, answered once per request.
    let d = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(3), &mut announced);
    sim.run_actions();
    assert!(sim.engines[1].discard(d));
    assert!(!sim.engines[1].peer_may_write.contains(&d), "said once");
    // A running receive lends its key while the peer lives.
    let mut later = vec![0u8; 2000];
    let e = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(4), &mut later);
    sim.run_actions();
    assert!(sim.engines[1].lends_keys_to_live_peers());
    sim.engines[1].handle_peer_lost(0, Error::PeerFinished { rank: 0 });
    assert!(!sim.engines[1].lends_keys_to_live_peers(), "a lost peer writes nothing");
    assert!(result(&mut sim, 1, e).is_err());
}

/// A receive no message matched is withdrawn: at once when no peer holds its key (the message
/// meant for it then goes to the next matching receive), through the sender when its RTR gave
/// the sender its key. A finished receive and a send are not; a withdrawal whose peer is lost
/// meanwhile ends with that loss.
#[test]
fn cancel_withdraws_unmatched_receives() {
    let mut sim = Sim::new(2, one_sided_route);
    let (mut small, mut next, mut big) = (vec![0u8; 8], vec![0u8; 8], vec![0u8; 2000]);
    let c = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut small);
    let keyed = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(2), &mut big);
    sim.run_actions();
    assert_eq!(sim.engines[1].cancel_recv(c), CancelRecv::Cancelled, "the RTR of another tag does not count it");
    assert_eq!(sim.engines[1].cancel_recv(c), CancelRecv::NotCancelled, "a forgotten request");
    assert_eq!(sim.engines[1].cancel_recv(keyed), CancelRecv::Asked, "rank 0 holds its key");
    assert_eq!(sim.engines[1].cancel_outcome(keyed), None);
    let n = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut next);
    let s = send(&mut sim, 0, 1, 1, b"for next");
    assert_eq!(sim.engines[0].cancel_recv(s), CancelRecv::NotCancelled, "a send");
    sim.settle();
    assert_eq!(sim.engines[1].cancel_outcome(keyed), Some(true));
    sim.engines[1].discard(keyed);
    assert!(sim.exposed[1].is_empty(), "its exposure ended");
    assert_eq!(result(&mut sim, 1, n).unwrap().len, 8);
    assert_eq!(&next, b"for next");
    assert_eq!(small, [0u8; 8], "the withdrawn receive's buffer was not written");
    assert_eq!(sim.engines[1].cancel_recv(n), CancelRecv::NotCancelled, "finished");
    // The message for the withdrawn receive goes to the next one, which offers its buffer
    // again: no withdrawal is pending.
    let mut again = vec![0u8; 2000];
    let k2 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(2), &mut again);
    sim.run_actions();
    assert_eq!(sim.wires[0].back().map(|p| p.hdr.kind), Some(PacketKind::Rtr));
    let data = vec![7u8; 2000];
    let s2 = send(&mut sim, 0, 1, 2, &data);
    sim.settle();
    assert!(result(&mut sim, 1, k2).is_ok() && result(&mut sim, 0, s2).is_ok());
    assert_eq!((&big, &again), (&vec![0u8; 2000], &data));
    // The peer is lost before it answers.
    let k3 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(2), &mut big);
    sim.run_actions();
    assert_eq!(sim.engines[1].cancel_recv(k3), CancelRecv::Asked);
    sim.engines[1].handle_peer_lost(0, Error::PeerLost { rank: 0, why: "test".into() });
    assert_eq!(sim.engines[1].cancel_outcome(k3), Some(false));
    assert!(result(&mut sim, 1, k3).is_err());
}

/// A send that took the RTR before the withdrawal reached its sender wins: the receive
/// finishes with its message, and the withdrawal's answer changes nothing.
#[test]
fn a_send_that_took_the_rtr_wins_over_the_withdrawal() {
    let mut sim = Sim::new(2, one_sided_route);
    let data = pattern(3, 2000);
    let mut out = vec![0u8; 2000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    sim.settle();
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.run_actions(); // the put is done, its RTS on the way
    assert_eq!(sim.engines[1].cancel_recv(q), CancelRecv::Asked);
    sim.settle();
    assert_eq!(sim.engines[1].cancel_outcome(q), Some(false));
    assert!(result(&mut sim, 1, q).is_ok() && result(&mut sim, 0, s).is_ok());
    assert_eq!(out, data);
    assert!(sim.exposed.iter().all(Vec::is_empty));
}

/// Withdrawing a receive that later receives' RTRs count (their places name the sends that
/// reach them) goes through the sender even when the receive itself sent no RTR: the sender
/// drops every RTR it holds, and the sends then go sender-first to the receives that are left.
/// Withdrawn locally, the second send would write into the receive that took the first.
#[test]
fn withdrawing_a_receive_that_later_rtrs_count_drops_them() {
    for own_rtr in [false, true] {
        let mut sim = Sim::new(2, one_sided_route);
        sim.engines[1].peers[0].window_rtrs = true;
        let mut first = vec![0u8; if own_rtr { 3000 } else { 8 }];
        let (mut second, mut third) = (vec![0u8; 3000], vec![0u8; 3000]);
        let r0 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut first);
        let r1 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut second);
        sim.settle();
        assert_eq!(sim.engines[0].peers[1].rtrs.len(), 1 + own_rtr as usize);
        assert_eq!(sim.engines[1].cancel_recv(r0), CancelRecv::Asked);
        // No RTR while the withdrawal is pending.
        let r2 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut third);
        sim.run_actions();
        let kinds: Vec<PacketKind> = sim.wires[0].iter().map(|p| p.hdr.kind).collect();
        assert_eq!(kinds, [PacketKind::Withdraw]);
        sim.settle();
        assert!(sim.engines[0].peers[1].rtrs.is_empty());
        assert_eq!(sim.engines[1].cancel_outcome(r0), Some(true));
        sim.engines[1].discard(r0);
        let (a, b) = (pattern(1, 3000), pattern(2, 3000));
        let s1 = send(&mut sim, 0, 1, 1, &a);
        let s2 = send(&mut sim, 0, 1, 1, &b);
        sim.settle();
        for (rank, id) in [(0, s1), (0, s2), (1, r1), (1, r2)] {
            assert!(result(&mut sim, rank, id).is_ok());
        }
        assert_eq!((&second, &third), (&a, &b));
        assert!(first.iter().all(|&x| x == 0));
        sim.assert_exposures_released();
    }
}

/// A window of receives posted first for the same messages: once a first receive's RTR was
/// used, each one's RTR names its place, so every send writes straight into its receive,
/// including when a send crossed the RTRs.
#[test]
fn a_window_of_receives_goes_receiver_first() {
    let mut sim = Sim::new(2, one_sided_route);
    let mut first = vec![0u8; 2000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut first);
    sim.settle();
    let s = send(&mut sim, 0, 1, 1, &pattern(8, 2000));
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    assert!(sim.engines[1].peers[0].window_rtrs, "a used RTR turns window hints on");
    let data: Vec<Vec<u8>> = (0..8).map(|i| pattern(i, 2000 + 1000 * (i as usize % 3))).collect();
    let mut outs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 5000]).collect();
    let mut other = vec![0u8; 2000];
    let mut qs = Vec::new();
    for (i, out) in outs.iter_mut().enumerate() {
        qs.push(recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), out));
        if i == 3 {
            // Another tag does not take a place among them, and gets its own RTR.
            qs.push(recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(2), &mut other));
        }
    }
    sim.run_actions();
    let places: Vec<(u32, u32)> =
        sim.wires[0].iter().map(|p| p.hdr).filter(|h| h.kind == PacketKind::Rtr).map(|h| (h.tag, h.seq)).collect();
    let mut expected: Vec<(u32, u32)> = (0..8).map(|i| (1, i)).collect();
    expected.insert(4, (2, 0));
    assert_eq!(places, expected);
    // The first send crosses the RTRs: its own RTR is stale, the others move one place up.
    let mut sends = vec![send(&mut sim, 0, 1, 1, &data[0])];
    sim.settle();
    assert_eq!(outs[0][..data[0].len()], data[0][..]);
    assert_eq!(sim.engines[0].peers[1].rtrs.len(), 8);
    for d in &data[1..] {
        sends.push(send(&mut sim, 0, 1, 1, d));
    }
    let tag2 = pattern(9, 2000);
    sends.push(send(&mut sim, 0, 1, 2, &tag2));
    sim.run_actions();
    // Written before any packet of these sends reached the receiver.
    for (out, d) in outs.iter().zip(&data).skip(1) {
        assert_eq!(out[..d.len()], d[..]);
    }
    assert_eq!(other, tag2);
    assert!(sim.engines[0].peers[1].rtrs.is_empty());
    sim.settle();
    for s in sends {
        assert!(result(&mut sim, 0, s).is_ok());
    }
    for q in qs {
        assert!(result(&mut sim, 1, q).is_ok());
    }
    sim.assert_exposures_released();
}

/// Window hints that arrive after the sender posted its window (as in osu_bw) only cost: the
/// first one not used turns them off, and the first receive's hint alone is sent again.
#[test]
fn unused_window_rtrs_turn_off() {
    let mut sim = Sim::new(2, one_sided_route);
    sim.engines[1].peers[0].window_rtrs = true;
    let data = pattern(5, 3000);
    let mut outs = vec![vec![0u8; 3000]; 3];
    let qs: Vec<ReqId> = outs.iter_mut().map(|o| recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), o)).collect();
    let ss: Vec<ReqId> = (0..3).map(|_| send(&mut sim, 0, 1, 1, &data)).collect();
    sim.settle(); // the RTRs crossed the RTSs: all stale
    for (q, s) in qs.into_iter().zip(ss) {
        assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    }
    assert!(outs.iter().all(|o| *o == data));
    assert!(!sim.engines[1].peers[0].window_rtrs);
    let qs: Vec<ReqId> = outs.iter_mut().map(|o| recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), o)).collect();
    sim.run_actions();
    let rtrs = sim.wires[0].iter().filter(|p| p.hdr.kind == PacketKind::Rtr).count();
    assert_eq!(rtrs, 1);
    for q in qs {
        send(&mut sim, 0, 1, 1, &data);
        sim.settle();
        assert!(result(&mut sim, 1, q).is_ok());
    }
}

/// Receives that take different messages (another tag pattern, ANY_SOURCE) before this one
/// make its place depend on arrivals: no RTR then.
#[test]
fn no_rtr_when_the_place_depends_on_arrivals() {
    let mut sim = Sim::new(3, one_sided_route);
    let mut bufs = vec![vec![0u8; 3000]; 4];
    let [a, b, c, d] = &mut bufs[..] else { unreachable!() };
    recv(&mut sim, 1, Source::Rank(0), TagMatch::Any, a);
    recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), b);
    recv(&mut sim, 2, Source::Any, TagMatch::Tag(1), c);
    recv(&mut sim, 2, Source::Rank(0), TagMatch::Tag(1), d);
    sim.run_actions();
    let rtrs: Vec<Header> = sim.wires[0].iter().map(|p| p.hdr).collect();
    assert_eq!(rtrs.len(), 1, "only the first ANY_TAG receive sends an RTR: {rtrs:?}");
    assert_eq!((rtrs[0].flags & Header::ANY_TAG, rtrs[0].seq), (Header::ANY_TAG, 0));
}

/// Puts answered `Ordered` on a channel that also carries the peer's packets (as ib does) end
/// their request at once; their late completions, even failed ones, change nothing. Over
/// another channel the request waits for the completion.
#[test]
fn ordered_puts_let_the_notice_leave_early() {
    let one_channel = || PeerRoute { am: RMA, ..one_sided_route() };
    for (r, early) in [(one_channel as fn() -> PeerRoute, true), (one_sided_route, false)] {
        for len in [2000, 100_000] {
            let mut sim = Sim { ordered_puts: Some(Vec::new()), ..Sim::new(2, r) };
            let data = pattern(7, len);
            let mut out = vec![0u8; len];
            let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
            sim.settle();
            let s = send(&mut sim, 0, 1, 1, &data);
            sim.settle();
            let late = sim.ordered_puts.replace(Vec::new()).unwrap();
            assert_eq!(late.len(), 1, "one put (receiver first)");
            assert_eq!(sim.engines[0].is_done(s), early, "len {len}");
            assert_eq!(sim.engines[1].is_done(q), early, "len {len}");
            for (i, (rank, op)) in late.into_iter().enumerate() {
                let result = if early && i == 0 { Err(Error::InvalidArgument("late failure".into())) } else { Ok(()) };
                sim.engines[rank as usize].handle_op(op, OpOutcome::Done(result));
            }
            sim.settle();
            assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
            assert_eq!(out, data);
        }
    }
}

#[test]
fn simultaneous_rts_wins_over_rtr() {
    rts_wins_over_rtr(Sim::new(2, one_sided_route));
    rts_wins_over_rtr(Sim::bouncing(2, one_sided_route));
}

fn rts_wins_over_rtr(mut sim: Sim) {
    let data = pattern(2, 3000);
    let mut out = vec![0u8; 3000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.run_actions(); // RTR and RTS cross
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok());
    assert_eq!(result(&mut sim, 1, q).unwrap().len, 3000);
    assert_eq!(out, data);
    assert!(sim.engines[0].peers[1].rtrs.is_empty(), "the crossed RTR was dropped as stale");
    // The receiver ended its RTR's exposure before it pulled: a channel that bounces holds
    // one slot per receive, not two.
    assert_eq!(sim.held_at_get, [(1, 0)]);
    assert!(sim.exposed.iter().all(Vec::is_empty));
}

#[test]
fn an_rts_that_overtakes_the_rtr_exposure_leaves_nothing_exposed() {
    // The receive's exposure for its RTR is still queued when the sender's RTS arrives: one
    // get-only size and one split size, with memory and with stand-ins.
    for len in [3000, 10000] {
        for mut sim in [Sim::new(2, one_sided_route), Sim::bouncing(2, one_sided_route)] {
            let data = pattern(5, len);
            let mut out = vec![0u8; len];
            let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
            let s = send(&mut sim, 0, 1, 1, &data);
            while let Some(a) = sim.engines[0].poll_action() {
                sim.execute(0, a);
            }
            assert!(sim.deliver_one(1), "the RTS reaches rank 1 before it ran its own actions");
            sim.settle();
            assert!(result(&mut sim, 0, s).is_ok());
            assert_eq!(result(&mut sim, 1, q).unwrap().len, len);
            assert_eq!(out, data, "{len} bytes");
            assert!(sim.exposed.iter().all(Vec::is_empty), "{len} bytes: an exposure was left behind");
        }
    }
}

#[test]
fn an_exposure_that_lands_after_its_request_failed_ends() {
    for mut sim in [Sim::new(2, one_sided_route), Sim::bouncing(2, one_sided_route)] {
        let mut out = vec![0u8; 3000];
        let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
        sim.engines[1].handle_peer_lost(0, Error::PeerLost { rank: 0, why: "test".into() });
        sim.settle();
        assert!(matches!(result(&mut sim, 1, q), Err(Error::PeerLost { rank: 0, .. })));
        assert!(sim.exposed.iter().all(Vec::is_empty), "the RTR's exposure was left behind");
    }
}

#[test]
fn eager_meets_a_receive_that_expected_rendezvous() {
    eager_meets_rtr(Sim::new(2, one_sided_route));
    // A bounce area for the receive must not be copied over the eager data.
    eager_meets_rtr(Sim::bouncing(2, one_sided_route));
}

fn eager_meets_rtr(mut sim: Sim) {
    let mut big = vec![0u8; 8000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut big);
    sim.settle();
    let small = pattern(3, 10);
    let s = send(&mut sim, 0, 1, 1, &small);
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok());
    assert_eq!(result(&mut sim, 1, q).unwrap().len, 10);
    assert_eq!(&big[..10], &small[..]);
    // A later large send must not use the consumed RTR.
    let data = pattern(4, 6000);
    let mut out = vec![0u8; 6000];
    let s = send(&mut sim, 0, 1, 1, &data);
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    assert_eq!(out, data);
    assert!(sim.exposed.iter().all(Vec::is_empty), "the RTR's exposure was released");
}

#[test]
fn truncation_is_an_error_and_the_sender_still_ends() {
    for (r, len) in [
        (one_sided_route as fn() -> PeerRoute, 50),
        (one_sided_route, 500),
        (one_sided_route, 9000),
        (stream_route, 9000),
    ] {
        for recv_first in [false, true] {
            let mut sim = Sim::new(2, r);
            let data = pattern(5, len);
            let mut out = vec![0u8; len / 2];
            let (s, q);
            if recv_first {
                q = recv(&mut sim, 1, Source::Any, TagMatch::Any, &mut out);
                s = send(&mut sim, 0, 1, 9, &data);
            } else {
                s = send(&mut sim, 0, 1, 9, &data);
                sim.settle();
                q = recv(&mut sim, 1, Source::Any, TagMatch::Any, &mut out);
            }
            sim.settle();
            assert!(result(&mut sim, 0, s).is_ok());
            match result(&mut sim, 1, q) {
                Err(Error::Truncated { from: 0, tag: 9, len: l, capacity }) => {
                    assert_eq!((l, capacity), (len, len / 2))
                }
                other => panic!("expected truncation, got {other:?}"),
            }
            // The pair still works afterwards.
            let mut ok = [0u8; 4];
            let s = send(&mut sim, 0, 1, 1, b"next");
            let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut ok);
            sim.settle();
            assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
            assert_eq!(&ok, b"next");
        }
    }
}

#[test]
fn any_source_and_any_tag_meet_rendezvous() {
    let mut sim = Sim::new(3, one_sided_route);
    let a = pattern(6, 5000);
    let b = pattern(7, 70);
    let mut o1 = vec![0u8; 6000];
    let mut o2 = vec![0u8; 6000];
    let q1 = recv(&mut sim, 2, Source::Any, TagMatch::Any, &mut o1);
    let q2 = recv(&mut sim, 2, Source::Any, TagMatch::Tag(8), &mut o2);
    let s1 = send(&mut sim, 0, 2, 7, &a);
    sim.settle();
    let s2 = send(&mut sim, 1, 2, 8, &b);
    sim.settle();
    assert!(result(&mut sim, 0, s1).is_ok() && result(&mut sim, 1, s2).is_ok());
    assert_eq!(result(&mut sim, 2, q1).unwrap(), Status { source: 0, tag: 7, len: 5000 });
    assert_eq!(result(&mut sim, 2, q2).unwrap(), Status { source: 1, tag: 8, len: 70 });
    assert_eq!(&o1[..5000], &a[..]);
    assert_eq!(&o2[..70], &b[..]);
}

#[test]
fn awaited_channels_follow_what_the_engine_waits_for() {
    // Rank 0 reaches rank 1 with packets on channel 0 and rank 2 on channel 2; both one-sided
    // on channel 1.
    const FAR: ChannelId = ChannelId(2);
    let mut sim = Sim::new(3, one_sided_route);
    let far = PeerRoute { am: FAR, ..one_sided_route() };
    sim.engines[0].set(Setting::Route(2, Ok(far.clone())));
    sim.engines[2].set(Setting::Route(0, Ok(far)));
    let awaited = |sim: &mut Sim| {
        let s = sim.engines[0].awaited_channels();
        [AM, RMA, FAR].map(|c| s.contains(c))
    };
    assert_eq!(awaited(&mut sim), [false; 3], "nothing posted, nothing awaited");

    // A receive naming rank 2 waits on rank 2's channel only, until it matches.
    let mut small = [0u8; 10];
    let q = recv(&mut sim, 0, Source::Rank(2), TagMatch::Any, &mut small);
    assert_eq!(awaited(&mut sim), [false, false, true]);
    let msg = pattern(1, 10);
    let s = send(&mut sim, 2, 0, 3, &msg);
    sim.settle();
    assert!(result(&mut sim, 2, s).is_ok() && result(&mut sim, 0, q).is_ok());
    assert_eq!(awaited(&mut sim), [false; 3]);

    // A rendezvous send waits for rank 1's packets and for its one-sided copy.
    let data = pattern(2, 5000);
    let s = send(&mut sim, 0, 1, 4, &data);
    sim.run_actions();
    assert_eq!(awaited(&mut sim), [true, true, false]);
    let mut out = vec![0u8; 5000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(4), &mut out);
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    assert_eq!(awaited(&mut sim), [false; 3]);

    // An ANY_SOURCE receive may be met on any channel.
    let q = recv(&mut sim, 0, Source::Any, TagMatch::Any, &mut small);
    assert_eq!(awaited(&mut sim), [true; 3]);
    let s = send(&mut sim, 1, 0, 5, &msg[..4]);
    sim.settle();
    assert!(result(&mut sim, 1, s).is_ok() && result(&mut sim, 0, q).is_ok());
    assert_eq!(awaited(&mut sim), [false; 3]);
}

#[test]
fn probe_sees_unexpected_messages() {
    let mut sim = Sim::new(2, one_sided_route);
    assert_eq!(sim.engines[1].probe(Source::Any, TagMatch::Any, SpaceId(0)).found, None);
    let data = pattern(8, 3000);
    let s = send(&mut sim, 0, 1, 4, &data);
    sim.settle();
    assert_eq!(
        sim.engines[1].probe(Source::Any, TagMatch::Any, SpaceId(0)).found,
        Some(Status { source: 0, tag: 4, len: 3000 })
    );
    assert_eq!(sim.engines[1].probe(Source::Rank(0), TagMatch::Tag(5), SpaceId(0)).found, None);
    let mut out = vec![0u8; 3000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(4), &mut out);
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    assert_eq!(sim.engines[1].probe(Source::Any, TagMatch::Any, SpaceId(0)).found, None);
}

#[test]
fn hundreds_outstanding_keep_pair_order() {
    for r in [one_sided_route as fn() -> PeerRoute, stream_route] {
        let mut sim = Sim::new(2, r);
        let sizes: Vec<usize> = (0..300).map(|i| [3, 700, 1500, 5000, 50][i % 5]).collect();
        let bufs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(i as u8, n)).collect();
        let mut outs: Vec<Vec<u8>> = (0..300).map(|_| vec![0u8; 5000]).collect();
        let (first, second) = outs.split_at_mut(150);
        // 150 receives before the sends, 150 wildcard receives after them.
        let mut qs: Vec<ReqId> =
            first.iter_mut().map(|o| recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), o)).collect();
        let ss: Vec<ReqId> = bufs.iter().map(|b| send(&mut sim, 0, 1, 1, b)).collect();
        qs.extend(second.iter_mut().map(|o| recv(&mut sim, 1, Source::Any, TagMatch::Any, o)));
        sim.settle();
        for s in ss {
            assert!(result(&mut sim, 0, s).is_ok());
        }
        // The k-th receive posted takes the k-th message sent.
        for (k, q) in qs.into_iter().enumerate() {
            assert_eq!(result(&mut sim, 1, q).unwrap().len, sizes[k], "receive {k}");
            assert_eq!(&outs[k][..sizes[k]], &bufs[k][..], "receive {k}");
        }
    }
}

#[test]
fn garbage_from_a_peer_fails_its_requests() {
    let mut sim = Sim::new(2, one_sided_route);
    let mut out = [0u8; 8];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Any, &mut out);
    sim.settle();
    // A message out of the pair's order, through the channel's sink.
    sim.engines[1].sink_for(AM).message(0, &Header::eager(0, 1, 7, 0), &[]);
    assert!(matches!(result(&mut sim, 1, q), Err(Error::Protocol { peer: 0, .. })));
    // A FIN naming a request that does not exist is refused too.
    let mut sim = Sim::new(2, one_sided_route);
    let mut fin = Header::new(PacketKind::Fin);
    fin.sreq = 12345;
    assert!(sim.engines[1].handle_message(0, &fin, &[]).is_err());
    // An eager message claiming more data than it carries, then a wrong fragment offset.
    let mut eager = Header::new(PacketKind::Eager);
    eager.len = 100;
    assert!(sim.engines[1].handle_message(0, &eager, &[1, 2, 3]).is_ok());
    let mut frag = Header::new(PacketKind::Frag);
    frag.offset = 50;
    assert!(sim.engines[1].handle_message(0, &frag, &[0; 10]).is_err());
    // Out-of-order sequence ids.
    let mut sim = Sim::new(2, one_sided_route);
    eager.seq = 3;
    eager.len = 1;
    assert!(sim.engines[1].handle_message(0, &eager, &[1]).is_err());
}

#[test]
fn lost_peer_fails_its_requests_and_wildcards() {
    let mut sim = Sim::new(3, one_sided_route);
    let mut a = [0u8; 4];
    let mut b = [0u8; 4];
    let mut c = [0u8; 4];
    let q1 = recv(&mut sim, 0, Source::Rank(1), TagMatch::Any, &mut a);
    let q2 = recv(&mut sim, 0, Source::Rank(2), TagMatch::Any, &mut b);
    let q3 = recv(&mut sim, 0, Source::Any, TagMatch::Any, &mut c);
    sim.engines[0].handle_peer_lost(1, Error::PeerFinished { rank: 1 });
    assert!(matches!(result(&mut sim, 0, q1), Err(Error::PeerFinished { rank: 1 })));
    assert!(!sim.engines[0].is_done(q2) && !sim.engines[0].is_done(q3), "a finished peer leaves the others alone");
    sim.engines[0].handle_peer_lost(2, Error::PeerLost { rank: 2, why: "killed".into() });
    assert!(matches!(result(&mut sim, 0, q2), Err(Error::PeerLost { rank: 2, .. })));
    assert!(matches!(result(&mut sim, 0, q3), Err(Error::PeerLost { rank: 2, .. })));
    let msg = Outgoing::Message { tag: 0, space: SpaceId(0) };
    // SAFETY: the post is refused, so the buffer is never used.
    let refused = unsafe { sim.engines[0].post_send(2, msg, Region { ptr: a.as_ptr(), len: 4 }) };
    assert!(refused.is_err());
}

#[test]
fn messages_a_finished_peer_left_behind_still_match() {
    let mut sim = Sim::new(2, one_sided_route);
    let _s = send(&mut sim, 1, 0, 9, b"last");
    sim.settle();
    sim.engines[0].handle_peer_lost(1, Error::PeerFinished { rank: 1 });
    let mut buf = [0u8; 4];
    let q = recv(&mut sim, 0, Source::Rank(1), TagMatch::Tag(9), &mut buf);
    assert_eq!(result(&mut sim, 0, q).unwrap().len, 4);
    assert_eq!(&buf, b"last");
    // Nothing else is left: the next receive naming it fails at once.
    let mut more = [0u8; 4];
    // SAFETY: the post is refused, so the buffer is never used.
    let refused = unsafe {
        request(sim.engines[0].post_recv(
            Source::Rank(1),
            TagMatch::Any,
            SpaceId(0),
            RegionMut { ptr: more.as_mut_ptr(), len: 4 },
            RecvPath::Request,
        ))
    };
    assert!(matches!(refused, Err(Error::PeerFinished { rank: 1 })));
}

/// A finish heard on a channel that does not carry the peer's messages waits for the one that
/// does (which delivers the peer's last messages first); a loss counts from any channel.
#[test]
fn a_finish_counts_from_the_channel_that_carries_the_peer() {
    let mut sim = Sim::new(3, one_sided_route);
    let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
    let q1 = recv(&mut sim, 0, Source::Rank(1), TagMatch::Any, &mut a);
    let q2 = recv(&mut sim, 0, Source::Rank(2), TagMatch::Any, &mut b);
    sim.engines[0].sink_for(RMA).peer_lost(1, Error::PeerFinished { rank: 1 });
    assert!(!sim.engines[0].is_done(q1), "the rma channel does not carry rank 1's messages");
    let _s = send(&mut sim, 1, 0, 3, b"last");
    sim.settle();
    sim.engines[0].sink_for(AM).peer_lost(1, Error::PeerFinished { rank: 1 });
    assert_eq!(result(&mut sim, 0, q1).unwrap().len, 4);
    assert_eq!(&a, b"last");
    assert!(sim.engines[0].peer_error(1).is_some(), "finished once its carrier said so");
    sim.engines[0].sink_for(RMA).peer_lost(2, Error::PeerLost { rank: 2, why: "killed".into() });
    assert!(matches!(result(&mut sim, 0, q2), Err(Error::PeerLost { rank: 2, .. })));
}

// ---- property test against a reference model ---------------------------------------------

/// What a receive of the property test became.
enum Got {
    /// A posted (or promoted) request.
    Req(ReqId),
    /// A parked receive's own result.
    Parked(Result<Status>),
}

/// A blocking receive's fast path: parks it (`None` when the engine declines) and runs the job
/// until nothing moves, then ends the park. A parked receive that met nothing is withdrawn and
/// posted instead (`None`): no matching message arrived meanwhile, so it takes the same one.
fn park_and_settle(sim: &mut Sim, me: Rank, src: Source, tag: TagMatch, buf: &mut [u8]) -> Option<Got> {
    let region = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
    // SAFETY: `buf` outlives the sim's use of it (the test keeps it until the end).
    if !unsafe { sim.engines[me as usize].try_park(src, tag, SpaceId(0), region) } {
        return None;
    }
    sim.settle();
    match sim.engines[me as usize].unpark() {
        Unparked::Done(r) => Some(Got::Parked(r)),
        Unparked::Promoted(id) => Some(Got::Req(id)),
        Unparked::Withdrawn => None,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Send {
        from: Rank,
        tag: u32,
        len: usize,
    },
    /// `blocking`: try parking it first ([`RecvPath::Park`]), as a blocking receive does.
    Recv {
        any_source: Option<Rank>,
        tag: Option<u32>,
        blocking: bool,
    },
    Deliver(u8),
    Settle,
    /// Cancel the receive request this picks among those made so far.
    Cancel(u8),
    /// Discard it if no message matched it yet (its handle dropped after an error): the engine
    /// must not write its buffer from then on, unless it says a peer may.
    Discard(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![0usize..200, 900usize..1200, 3000usize..5000, 8000usize..9000];
    prop_oneof![
        (0u32..2, 0u32..3, len).prop_map(|(from, tag, len)| Op::Send { from, tag, len }),
        (prop::option::of(0u32..2), prop::option::of(0u32..3), any::<bool>()).prop_map(|(s, t, blocking)| Op::Recv {
            any_source: s,
            tag: t,
            blocking
        }),
        any::<u8>().prop_map(Op::Deliver),
        Just(Op::Settle),
        any::<u8>().prop_map(Op::Cancel),
        any::<u8>().prop_map(Op::Discard),
    ]
}

/// What happened to rank 2's receives, in order, with the ordered packets it had received then.
#[derive(Clone, Copy, Debug)]
enum Ev {
    /// Receive `i` was posted.
    Post(usize),
    /// Receive `i` was withdrawn (cancelled at once, or when its sender answered).
    Withdraw(usize),
}

/// MPI matching over the order in which messages actually reached the receiver, with the
/// receives posted and withdrawn as `events` say (each after that many arrivals). `Err` names
/// a receive withdrawn after a message matched it.
fn reference(
    arrivals: &[(Rank, u32, u32, usize)],
    recvs: &[(Source, TagMatch)],
    events: &[(usize, Ev)],
) -> std::result::Result<Vec<Option<(Rank, u32)>>, usize> {
    let mut posted: Vec<usize> = Vec::new();
    let mut unexpected: Vec<(Rank, u32, u32)> = Vec::new();
    let mut out = vec![None; recvs.len()];
    let fits = |src: Source, tag: TagMatch, from: Rank, t: u32| {
        (src == Source::Any || src == Source::Rank(from)) && tag.matches(t)
    };
    let mut ei = 0;
    for k in 0..=arrivals.len() {
        while ei < events.len() && events[ei].0 == k {
            match events[ei].1 {
                Ev::Post(ri) => {
                    let (src, tag) = recvs[ri];
                    if let Some(i) = unexpected.iter().position(|&(f, t, _)| fits(src, tag, f, t)) {
                        let (f, _, seq) = unexpected.remove(i);
                        out[ri] = Some((f, seq));
                    } else {
                        posted.push(ri);
                    }
                }
                Ev::Withdraw(ri) => {
                    let i = posted.iter().position(|&r| r == ri).ok_or(ri)?;
                    posted.remove(i);
                }
            }
            ei += 1;
        }
        if k < arrivals.len() {
            let (from, tag, seq, _) = arrivals[k];
            if let Some(i) = posted.iter().position(|&r| fits(recvs[r].0, recvs[r].1, from, tag)) {
                out[posted.remove(i)] = Some((from, seq));
            } else {
                unexpected.push((from, tag, seq));
            }
        }
    }
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 4 } else { 3000 }, ..ProptestConfig::default() })]

    /// Senders 0 and 1 send to rank 2 (payload = seq and sender stamped in), rank 2 receives
    /// with every mix of wildcards; what each receive got must be what MPI matching over the
    /// actual arrival order gives.
    #[test]
    fn matches_reference_model(
        ops in prop::collection::vec(op(), 1..60),
        stream in any::<bool>(),
        bounce in any::<bool>(),
        window_rtrs in any::<bool>(),
    ) {
        let r = if stream { stream_route } else { one_sided_route };
        let mut sim = if bounce { Sim::bouncing(3, r) } else { Sim::new(3, r) };
        for p in &mut sim.engines[2].peers {
            p.window_rtrs = window_rtrs;
        }
        let mut send_bufs: Vec<Vec<u8>> = Vec::new();
        let mut sends = Vec::new();
        let mut seqs = [0u32; 2];
        let mut recv_bufs: Vec<Box<[u8]>> = Vec::new();
        let mut recvs = Vec::new(); // (src, tag, what it became)
        let mut events = Vec::new(); // (arrivals so far, Ev) in the order they happened
        let mut withdrawn = std::collections::HashSet::new(); // receives withdrawn
        let mut discarded: Vec<(usize, Option<Vec<u8>>)> = Vec::new(); // and their buffers then
        let mut meta = Vec::new(); // (from, tag, seq, len) by (from, seq)
        let arrived = |sim: &Sim| sim.delivered.iter().filter(|d| d.0 == 2).count();
        // Withdrawals the sim saw during deliveries, into `events` in their place.
        let note_withdrawn = |sim: &mut Sim, events: &mut Vec<(usize, Ev)>, recvs: &[(Source, TagMatch, Got)], withdrawn: &mut std::collections::HashSet<usize>| {
            for (id, k) in sim.withdrawn.drain(..) {
                let i = recvs.iter().position(|r| matches!(r.2, Got::Req(q) if q == id)).expect("a receive of the test");
                events.push((k, Ev::Withdraw(i)));
                withdrawn.insert(i);
            }
        };
        for op in ops {
            match op {
                Op::Send { from, tag, len } => {
                    let seq = seqs[from as usize];
                    seqs[from as usize] += 1;
                    let mut b = pattern(seq as u8 ^ (from as u8 * 128), len.max(8));
                    b.truncate(len);
                    if len >= 8 {
                        b[..4].copy_from_slice(&from.to_le_bytes());
                        b[4..8].copy_from_slice(&seq.to_le_bytes());
                    }
                    send_bufs.push(b);
                    let b = send_bufs.last().unwrap();
                    meta.push((from, tag, seq, len));
                    sends.push((from, send(&mut sim, from, 2, tag, b)));
                }
                Op::Recv { any_source, tag, blocking } => {
                    let src = any_source.map_or(Source::Any, Source::Rank);
                    let tag = tag.map_or(TagMatch::Any, TagMatch::Tag);
                    // Small buffers sometimes, so that parking applies (eager sizes only).
                    let cap = if blocking { 1000 } else { 9000 };
                    recv_bufs.push(vec![0u8; cap].into_boxed_slice());
                    let b = recv_bufs.last_mut().unwrap();
                    let n = arrived(&sim);
                    let got = if blocking { park_and_settle(&mut sim, 2, src, tag, b) } else { None };
                    let i = recvs.len();
                    let got = match got {
                        // Parked first: posted before what the settle delivered.
                        Some(got) => {
                            events.push((n, Ev::Post(i)));
                            recvs.push((src, tag, got));
                            note_withdrawn(&mut sim, &mut events, &recvs, &mut withdrawn);
                            continue;
                        }
                        None => {
                            note_withdrawn(&mut sim, &mut events, &recvs, &mut withdrawn);
                            Got::Req(recv(&mut sim, 2, src, tag, b))
                        }
                    };
                    events.push((arrived(&sim), Ev::Post(i)));
                    recvs.push((src, tag, got));
                }
                Op::Deliver(k) => {
                    sim.run_actions();
                    let to = (k % 3) as Rank;
                    sim.deliver_one(to);
                }
                Op::Settle => sim.settle(),
                Op::Cancel(k) | Op::Discard(k) => {
                    let requests: Vec<(usize, ReqId)> = recvs.iter().enumerate().filter_map(|(i, r)| match r.2 {
                        Got::Req(id) if !withdrawn.contains(&i) && !discarded.iter().any(|d| d.0 == i) => Some((i, id)),
                        _ => None,
                    }).collect();
                    let Some(&(i, id)) = requests.get(k as usize % requests.len().max(1)) else { continue };
                    if matches!(op, Op::Discard(_)) {
                        let e = &mut sim.engines[2];
                        if !e.reqs.get(id).is_some_and(|r| r.result.is_none() && !r.matched()) {
                            continue; // a matched one's queued copy is the driver's to drop
                        }
                        let may_write = e.discard(id);
                        discarded.push((i, (!may_write).then(|| recv_bufs[i].to_vec())));
                        // Withdrawn now, or through its sender (it stays posted until then).
                        match e.reqs.get(id) {
                            Some(r) if r.withdrawal_asked() => {
                                if !sim.asked.contains(&(2, id)) {
                                    sim.asked.push((2, id)); // not already by a cancel
                                }
                            }
                            _ => events.push((arrived(&sim), Ev::Withdraw(i))),
                        }
                        note_withdrawn(&mut sim, &mut events, &recvs, &mut withdrawn);
                        continue;
                    }
                    {
                        match sim.engines[2].cancel_recv(id) {
                            CancelRecv::Cancelled => {
                                events.push((arrived(&sim), Ev::Withdraw(i)));
                                withdrawn.insert(i);
                            }
                            CancelRecv::Asked if !sim.asked.contains(&(2, id)) => sim.asked.push((2, id)),
                            CancelRecv::Asked | CancelRecv::NotCancelled => {}
                        }
                    }
                }
            }
            note_withdrawn(&mut sim, &mut events, &recvs, &mut withdrawn);
        }
        sim.settle();
        note_withdrawn(&mut sim, &mut events, &recvs, &mut withdrawn);
        prop_assert!(sim.asked.is_empty(), "withdrawals still unanswered once settled: {:?}", sim.asked);
        sim.assert_exposures_released();
        let arrivals: Vec<(Rank, u32, u32, usize)> = sim.delivered.iter().filter(|d| d.0 == 2).map(|&(_, from, seq)| {
            let m = meta.iter().find(|m| m.0 == from && m.2 == seq).unwrap();
            (from, m.1, seq, m.3)
        }).collect();
        let model = reference(&arrivals, &recvs.iter().map(|&(s, t, _)| (s, t)).collect::<Vec<_>>(), &events);
        let model = match model {
            Ok(m) => m,
            Err(i) => return Err(TestCaseError::fail(format!("receive {i} was withdrawn after a message matched it"))),
        };
        for (i, before) in &discarded {
            if let Some(before) = before {
                prop_assert!(recv_bufs[*i][..] == before[..], "discarded receive {} was written", i);
            }
        }
        for (i, (_, _, got)) in recvs.into_iter().enumerate() {
            if withdrawn.contains(&i) {
                prop_assert!(model[i].is_none());
                continue;
            }
            if discarded.iter().any(|d| d.0 == i) {
                continue; // its result is gone; what it took, the model says
            }
            match (model[i], got) {
                (None, Got::Req(id)) => prop_assert!(!sim.engines[2].is_done(id), "receive {} finished without a match in the model", i),
                (None, Got::Parked(st)) => prop_assert!(false, "parked receive {} got {:?} without a match in the model", i, st),
                (Some((from, seq)), got) => {
                    let got = match got {
                        Got::Req(id) => result(&mut sim, 2, id),
                        Got::Parked(st) => st,
                    };
                    let k = meta.iter().position(|m| m.0 == from && m.2 == seq).unwrap();
                    let m = meta[k];
                    let cap = recv_bufs[i].len();
                    if m.3 > cap {
                        let truncated = matches!(got, Err(Error::Truncated { from: f, len, capacity, .. })
                            if f == from && len == m.3 && capacity == cap);
                        prop_assert!(truncated, "receive {} of {} B into {} B: {:?}", i, m.3, cap, got);
                        continue;
                    }
                    prop_assert_eq!(got.unwrap(), Status { source: from, tag: m.1, len: m.3 });
                    prop_assert!(recv_bufs[i][..m.3] == send_bufs[k][..], "receive {} got other bytes than send {}", i, k);
                }
            }
        }
        // Every send the model matched to a receive finishes, and without error (a truncation
        // is the receiver's); one never matched may still wait (a rendezvous) or be done.
        let matched: std::collections::HashSet<(Rank, u32)> = model.iter().flatten().copied().collect();
        for (k, (from, id)) in sends.into_iter().enumerate() {
            if matched.contains(&(from, meta[k].2)) {
                prop_assert!(sim.engines[from as usize].is_done(id), "matched send {} did not finish", k);
            }
            if sim.engines[from as usize].is_done(id) {
                prop_assert!(result(&mut sim, from, id).is_ok(), "send {} failed", k);
            }
        }
    }
}

/// With a stream rule, a single-copy size goes eagerly when no message came from the peer
/// since the last send to it, and by rendezvous again once one did (a ping-pong).
#[test]
fn streams_go_eager_and_ping_pongs_by_single_copy() {
    let with_rule = || PeerRoute {
        stream_eager: Some(crate::policy::StreamEagerRule { upto: 5000, reason: String::new() }),
        ..one_sided_route()
    };
    let mut sim = Sim::new(2, with_rule);
    let data = pattern(6, 3000); // rndv-get by the route
    let sends: Vec<ReqId> = (0..3).map(|_| send(&mut sim, 0, 1, 1, &data)).collect();
    sim.run_actions();
    let kinds: Vec<PacketKind> = sim.wires[1].iter().map(|p| p.hdr.kind).collect();
    let eager = kinds.iter().filter(|k| **k == PacketKind::Eager).count();
    assert_eq!((kinds[0], eager), (PacketKind::Rts, 2), "{kinds:?}");
    let mut outs = vec![vec![0u8; 3000]; 3];
    let qs: Vec<ReqId> = outs.iter_mut().map(|o| recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), o)).collect();
    sim.settle();
    for (s, q) in sends.into_iter().zip(qs) {
        assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    }
    assert!(outs.iter().all(|o| *o == data));
    // The reply makes the next send the first of a new exchange: single copy.
    let mut reply = [0u8; 8];
    let q = recv(&mut sim, 0, Source::Rank(1), TagMatch::Tag(2), &mut reply);
    send(&mut sim, 1, 0, 2, &[1; 8]);
    sim.settle();
    assert!(result(&mut sim, 0, q).is_ok());
    send(&mut sim, 0, 1, 1, &data);
    sim.run_actions();
    assert_eq!(sim.wires[1].back().unwrap().hdr.kind, PacketKind::Rts);
}

/// With a placement rule, nothing changes until three line transfers in a row agree; then a
/// near peer gets single-copy sizes eagerly and an apart one gets eager sizes by single copy;
/// one odd sample changes nothing.
#[test]
fn the_measured_placement_changes_medium_messages() {
    let mut sim = Sim::new(2, || placed_route(Some(5000), Some(50)));
    let e = &mut sim.engines[0];
    assert_eq!((e.wants_placement(1, 8), e.wants_placement(1, 6000)), (None, None), "sizes the rule does not decide");
    let every = PlacementRule::SAMPLE_EVERY as usize;
    let sampled: Vec<bool> = (0..2 * every).map(|_| e.wants_placement(1, 3000).is_some()).collect();
    assert!(sampled[0] && sampled[every] && sampled.iter().filter(|s| **s).count() == 2, "{sampled:?}");
    assert!(e.wants_placement(1, 600).is_some(), "an eager size the apart part decides");
    // The kind of the first packet of a message of `len` bytes, after the samples.
    let first_kind = |sim: &mut Sim, samples: &[u32], len: usize| -> PacketKind {
        for &ns in samples {
            sim.engines[0].handle_observation(Observed::Peer(1, Observation::LineTransfer(ns)));
        }
        first_packet_kind(sim, len, 5)
    };
    assert_eq!(first_kind(&mut sim, &[20; 8], 3000), PacketKind::Rts, "eight quick samples are not enough");
    assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), None);
    assert_eq!(first_kind(&mut sim, &[], 600), PacketKind::Eager, "not measured: the route table");
    assert_eq!(first_kind(&mut sim, &[20], 3000), PacketKind::Eager);
    assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), Some(Placement::Near));
    assert_eq!(
        first_kind(&mut sim, &[500, 20, 200], 3000),
        PacketKind::Eager,
        "two late samples of nine change nothing"
    );
    assert_eq!(
        first_kind(&mut sim, &[150; 4], 3000),
        PacketKind::Rts,
        "five late: the middle, the table's single copy"
    );
    assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), Some(Placement::Middle));
    assert_eq!(first_kind(&mut sim, &[150; 3], 3000), PacketKind::Rts, "seven of nine beyond 100");
    assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), Some(Placement::Apart));
    assert_eq!(first_kind(&mut sim, &[], 600), PacketKind::Rts, "apart: single copy below the threshold");
    assert_eq!(first_kind(&mut sim, &[], 40), PacketKind::Eager, "below the apart part's size");
    assert_eq!(first_kind(&mut sim, &[0, 20, 1, 20, 2], 3000), PacketKind::Rts, "local loads are no samples");
    assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), Some(Placement::Apart));
    // The small-send fast path leaves such sizes to post_send while apart.
    let buf = [7u8; 80];
    let region = Region { ptr: buf.as_ptr(), len: buf.len() };
    assert!(sim.engines[0].inline_send(1, 9, SpaceId(0), region).is_none());
    // A receiver that measured its sender near offers no buffer (RTR) for a single-copy size:
    // the message comes eagerly.
    let mut out = vec![0u8; 3000];
    let data = pattern(4, 3000);
    let rtrs = |sim: &Sim| sim.wires[0].iter().filter(|p| p.hdr.kind == PacketKind::Rtr).count();
    sim.wires[0].clear();
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(6), &mut out);
    sim.run_actions();
    assert_eq!(rtrs(&sim), 1, "not measured: the receive offers its buffer");
    let s = send(&mut sim, 0, 1, 6, &data);
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    sim.wires[0].clear();
    for _ in 0..crate::observe::SAMPLES {
        sim.engines[1].handle_observation(Observed::Peer(0, Observation::LineTransfer(20)));
    }
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(7), &mut out);
    sim.run_actions();
    assert_eq!(rtrs(&sim), 0, "near: no offer");
    // The sender thinks otherwise (apart): its RTS still meets the receive.
    assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), Some(Placement::Apart));
    let s = send(&mut sim, 0, 1, 7, &data);
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    assert_eq!(out, data);
    // And a parked receive of such a size (receiver near) turns into a request on that RTS.
    let mut out = vec![0u8; 3000];
    // SAFETY: `out` outlives the park, ended by unpark below.
    assert!(unsafe {
        sim.engines[1].try_park(
            Source::Rank(0),
            TagMatch::Tag(8),
            SpaceId(0),
            RegionMut { ptr: out.as_mut_ptr(), len: 3000 },
        )
    });
    let s = send(&mut sim, 0, 1, 8, &data);
    sim.settle();
    let id = match sim.engines[1].unpark() {
        Unparked::Promoted(id) => id,
        other => panic!("the RTS should have made the parked receive a request: {other:?}"),
    };
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, id).is_ok());
    assert_eq!(out, data);
    // Lines that take longer than near and less than apart (a cache shared across a mesh):
    // neither rule, the route table decides.
    assert_eq!(first_kind(&mut sim, &[70, 95, 45], 600), PacketKind::Eager, "middle: the table's eager size");
    assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), Some(Placement::Middle));
    assert_eq!(first_kind(&mut sim, &[], 3000), PacketKind::Rts, "middle: the table's single-copy size");
    assert_eq!(first_kind(&mut sim, &[20; 7], 3000), PacketKind::Eager, "near again");
}

/// An apart rule whose size is above the table's threshold sends the sizes between them eagerly
/// while the peer is apart (and the receiver offers no buffer for them), and larger ones by
/// single copy; the small-send path and the placement samples follow.
#[test]
fn an_apart_rule_above_the_threshold_sends_medium_messages_eagerly() {
    let mut sim = Sim::new(2, || placed_route(None, Some(5000)));
    let e = &mut sim.engines[0];
    assert_eq!(e.placement_from(), 1024, "from the table's threshold");
    assert!(e.wants_placement(1, 3000).is_some(), "a single-copy size below the rule's");
    assert_eq!(e.wants_placement(1, 6000), None, "single copy either way");
    for s in &mut sim.engines {
        for _ in 0..crate::observe::SAMPLES {
            s.handle_observation(Observed::Peer(1 - s.rank(), Observation::LineTransfer(150)));
        }
    }
    let rtrs = |sim: &Sim| sim.wires[0].iter().filter(|p| p.hdr.kind == PacketKind::Rtr).count();
    for (len, kind, offers) in [(600, PacketKind::Eager, 0), (3000, PacketKind::Eager, 0), (6000, PacketKind::Rts, 1)] {
        let data = pattern(3, len);
        let mut out = vec![0u8; len];
        sim.wires[0].clear();
        let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(4), &mut out);
        sim.run_actions();
        assert_eq!(rtrs(&sim), offers, "{len} B: buffers offered");
        let before = sim.wires[1].len();
        let s = send(&mut sim, 0, 1, 4, &data);
        sim.run_actions();
        let first = sim.wires[1][before].hdr.kind;
        sim.settle();
        assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
        assert_eq!(out, data);
        if offers == 0 {
            assert_eq!(first, kind, "{len} B apart");
        }
    }
}

/// Near, while the channel measures its copies to the peer slow, sizes from the apart rule's go
/// by single copy and smaller ones stay eager; when the copies are fast again, so is the route.
#[test]
fn slow_copies_send_large_messages_to_a_near_peer_by_single_copy() {
    let mut sim = Sim::new(2, || placed_route(Some(8000), Some(5000)));
    for _ in 0..crate::observe::SAMPLES {
        sim.engines[0].handle_observation(Observed::Peer(1, Observation::LineTransfer(20)));
    }
    fn first_kind(sim: &mut Sim, len: usize, slow: bool) -> PacketKind {
        sim.engines[0].handle_observation(Observed::Peer(1, Observation::CopiesSlow(slow)));
        first_packet_kind(sim, len, 3)
    }
    assert_eq!(first_kind(&mut sim, 6000, false), PacketKind::Eager, "near: eager up to 8000");
    assert_eq!(first_kind(&mut sim, 6000, true), PacketKind::Rts, "slow copies: single copy from 5000");
    assert_eq!(first_kind(&mut sim, 3000, true), PacketKind::Eager, "and eager below it");
    assert_eq!(first_kind(&mut sim, 6000, false), PacketKind::Eager, "fast again");
    assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), Some(Placement::Near));
    // A receiver that lags gets them eagerly all the same: the sender need not wait for it.
    sim.engines[0].retune(|t| t.skew = Some(SkewPolicy { limit: 0, window: 8, eager_up_to: 8000 }));
    let mut lag = Header::new(PacketKind::Skew);
    lag.offset = 1;
    sim.engines[0].handle_message(1, &lag, &[]).unwrap();
    assert!(sim.engines[0].adapters(1).is_some_and(|a| a.skew.peer_lags()));
    assert_eq!(first_kind(&mut sim, 6000, true), PacketKind::Eager, "slow copies, lagging receiver");
    lag.offset = 0;
    sim.engines[0].handle_message(1, &lag, &[]).unwrap();
    sim.engines[0].handle_observation(Observed::Peer(1, Observation::CopiesSlow(false)));
    // More ranks than CPUs on the node: the verdict changes nothing.
    sim.engines[0].retune(|t| t.own_cpus = false);
    sim.engines[0].handle_observation(Observed::Peer(1, Observation::CopiesSlow(true)));
    assert_eq!(first_packet_kind(&mut sim, 6000, 3), PacketKind::Eager, "not counted");
}

/// A given placement (POLYRAIL_PLACEMENT) holds from the start and asks for no samples.
#[test]
fn a_given_placement_needs_no_samples() {
    let rule = |given| PlacementRule {
        near_upto: Some(5000),
        apart_from: Some(50),
        rma: RMA,
        given: Some(given),
        reason: String::new(),
    };
    // Apart, 80 bytes go by single copy (from the rule's 50); otherwise eagerly (the table's).
    for (given, eager_80) in [(Placement::Near, true), (Placement::Middle, true), (Placement::Apart, false)] {
        let mut sim = Sim::new(2, || PeerRoute { placement: Some(rule(given)), ..one_sided_route() });
        assert_eq!(sim.engines[0].adapters(1).and_then(|a| a.placement.placement()), Some(given));
        assert_eq!(sim.engines[0].wants_placement(1, 3000), None);
        assert_eq!(sim.engines[0].wants_placement(1, 600), None);
        assert_eq!(first_packet_kind(&mut sim, 3000, 5) == PacketKind::Eager, given == Placement::Near, "{given:?}");
        let buf = [0u8; 80];
        let region = Region { ptr: buf.as_ptr(), len: buf.len() };
        assert_eq!(sim.engines[0].inline_send(1, 9, SpaceId(0), region).is_some(), eager_80, "{given:?}");
        let other = if given == Placement::Apart { 5 } else { 500 };
        for _ in 0..crate::observe::SAMPLES {
            sim.engines[0].handle_observation(Observed::Peer(1, Observation::LineTransfer(other)));
        }
        assert_eq!(
            sim.engines[0].adapters(1).and_then(|a| a.placement.placement()),
            Some(given),
            "samples do not change a given placement"
        );
    }
}

/// Two ranks on [`one_sided_route`] with skew feedback after three receives, up to 4096 bytes.
fn skewed_sim() -> Sim {
    let mut sim = Sim::new(2, one_sided_route);
    let policy = crate::config::SkewPolicy { limit: 0, window: 3, eager_up_to: 4096 };
    for e in &mut sim.engines {
        e.retune(|t| t.skew = Some(policy));
    }
    sim
}

#[test]
fn skew_feedback_sends_eagerly_while_the_receiver_lags() {
    let mut sim = skewed_sim();
    let data = pattern(9, 2000); // one-sided (rndv-get) by the route
    let mut out = vec![0u8; 2000];
    // One message: returns the kind of its first packet. `late`: the receive is posted after
    // the message arrived (a lagging receiver); otherwise before.
    let mut one = |sim: &mut Sim, late: bool| -> PacketKind {
        let q = if late { None } else { Some(recv(sim, 1, Source::Rank(0), TagMatch::Tag(3), &mut out)) };
        sim.settle();
        let before = sim.wires[1].len();
        let s = send(sim, 0, 1, 3, &data);
        sim.run_actions();
        let kind = sim.wires[1][before].hdr.kind;
        sim.settle();
        let q = q.unwrap_or_else(|| recv(sim, 1, Source::Rank(0), TagMatch::Tag(3), &mut out));
        sim.settle();
        assert_eq!(result(sim, 1, q).unwrap().len, 2000);
        assert!(result(sim, 0, s).is_ok());
        kind
    };
    // Late receives: after `window` of them the sender is told, and switches to eager.
    let kinds: Vec<PacketKind> = (0..5).map(|_| one(&mut sim, true)).collect();
    assert_eq!(kinds, [PacketKind::Rts, PacketKind::Rts, PacketKind::Rts, PacketKind::Eager, PacketKind::Eager]);
    assert!(sim.engines[0].adapters(1).is_some_and(|a| a.skew.peer_lags()));
    // Receives on time again: after `window` of them, single copy resumes.
    let kinds: Vec<PacketKind> = (0..4).map(|_| one(&mut sim, false)).collect();
    assert!(!sim.engines[0].adapters(1).is_some_and(|a| a.skew.peer_lags()), "the receiver reported that it caught up");
    assert_eq!(kinds.last(), Some(&PacketKind::Rts));
    assert_eq!(out, data);
}

/// A route a `POLYRAIL_ROUTE` rule wrote is taken as written: a lagging receiver does not turn
/// its single copy eager (it did, so `polyrail tune`'s single-copy runs could measure eager).
#[test]
fn skew_feedback_leaves_a_written_route_alone() {
    let mut sim = Sim::new(2, || PeerRoute { as_written: true, ..one_sided_route() });
    let policy = crate::config::SkewPolicy { limit: 0, window: 3, eager_up_to: 4096 };
    for e in &mut sim.engines {
        e.retune(|t| t.skew = Some(policy));
    }
    let data = pattern(9, 2000);
    let mut out = vec![0u8; 2000];
    for _ in 0..6 {
        let before = sim.wires[1].len();
        let s = send(&mut sim, 0, 1, 3, &data);
        sim.run_actions();
        assert_eq!(sim.wires[1][before].hdr.kind, PacketKind::Rts);
        sim.settle();
        let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(3), &mut out);
        sim.settle();
        assert_eq!(result(&mut sim, 1, q).unwrap().len, 2000);
        assert!(result(&mut sim, 0, s).is_ok());
    }
    assert!(sim.engines[0].adapters(1).is_some_and(|a| a.skew.peer_lags()), "the receiver lagged, and said so");
    assert_eq!(out, data);
}

/// In a rendezvous ping-pong a receive can find the peer's answer waiting (it follows our
/// message at once): that is no lag, and the answering side keeps single copy.
#[test]
fn a_waiting_answer_is_no_lag() {
    let mut sim = skewed_sim();
    let (ping, pong) = (pattern(1, 2000), pattern(2, 2000)); // one-sided (rndv-get) by the route
    let (mut at0, mut at1) = (vec![0u8; 2000], vec![0u8; 2000]);
    for _ in 0..6 {
        let q1 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut at1);
        let s0 = send(&mut sim, 0, 1, 1, &ping);
        sim.settle();
        assert!(result(&mut sim, 1, q1).is_ok() && result(&mut sim, 0, s0).is_ok());
        // Rank 1 answers at once; rank 0 posts its receive only after the answer arrived.
        let before = sim.wires[0].len();
        let s1 = send(&mut sim, 1, 0, 2, &pong);
        sim.run_actions();
        assert_eq!(sim.wires[0][before].hdr.kind, PacketKind::Rts, "the answer stays single copy");
        sim.settle();
        let q0 = recv(&mut sim, 0, Source::Rank(1), TagMatch::Tag(2), &mut at0);
        sim.settle();
        assert!(result(&mut sim, 0, q0).is_ok() && result(&mut sim, 1, s1).is_ok());
    }
    assert!(!sim.engines[1].adapters(0).is_some_and(|a| a.skew.peer_lags()));
    assert_eq!((at0, at1), (pong, ping));
}

/// From memory the peer maps, sizes the route sends eagerly go one-sided from the mapped rule's
/// size, also in a stream; the receiver pulls them (it routes the size eagerly itself).
#[test]
fn sends_from_mapped_memory_go_one_sided() {
    let with_rule = || PeerRoute {
        stream_eager: Some(crate::policy::StreamEagerRule { upto: 5000, reason: String::new() }),
        mapped: Some(crate::policy::MappedRule { from: 500, channel: RMA, reason: String::new() }),
        frag: 4096,
        ..one_sided_route()
    };
    let mut sim = Sim::new(2, with_rule);
    let mapped = pattern(4, 3000);
    let private = pattern(5, 800);
    sim.engines[0].set(Setting::MappedMemory(Region { ptr: mapped.as_ptr(), len: mapped.len() }, true));
    // The blocking send's fast path leaves such messages to post_send.
    assert!(sim.engines[0].inline_send(1, 0, SpaceId(0), Region { ptr: mapped.as_ptr(), len: 800 }).is_none());
    // (source, expected first packet): 800 bytes from mapped memory, 400 (below the rule), 800
    // from private memory (eager by the route), 3000 from mapped memory in a stream.
    let cases: [(&[u8], PacketKind); 5] = [
        (&mapped[..800], PacketKind::Rts),
        (&mapped[..400], PacketKind::Eager),
        (&private, PacketKind::Eager),
        (&mapped[..], PacketKind::Rts),
        (&mapped[100..900], PacketKind::Rts),
    ];
    for (i, (src, kind)) in cases.iter().enumerate() {
        let before = sim.wires[1].len();
        let s = send(&mut sim, 0, 1, i as u32, src);
        sim.run_actions();
        assert_eq!(sim.wires[1][before].hdr.kind, *kind, "case {i}");
        let mut out = vec![0u8; src.len()];
        let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(i as u32), &mut out);
        if *kind == PacketKind::Rts {
            // The receiver pulls (and says so with FIN); it does not ask for a stream (CTS).
            let before = sim.wires[0].len();
            while sim.deliver_one(1) {}
            sim.run_actions();
            assert_eq!(sim.wires[0][before].hdr.kind, PacketKind::Fin, "case {i}");
        }
        sim.settle();
        assert!(result(&mut sim, 0, s).is_ok());
        assert_eq!(result(&mut sim, 1, q).unwrap().len, src.len());
        assert_eq!(out, *src, "case {i}");
    }
    // Given back: private memory again.
    sim.engines[0].set(Setting::MappedMemory(Region { ptr: mapped.as_ptr(), len: mapped.len() }, false));
    let before = sim.wires[1].len();
    send(&mut sim, 0, 1, 9, &mapped[..800]);
    sim.run_actions();
    assert_eq!(sim.wires[1][before].hdr.kind, PacketKind::Eager);
}

/// Mapped memory is found among many ranges added in any order, and only whole buffers inside
/// one range count.
#[test]
fn mapped_ranges_are_found_in_any_order() {
    let mut e = Engine::new(0, 1, Tuning::default());
    let region = |start: usize, len: usize| Region { ptr: start as *const u8, len };
    for start in [0x9000usize, 0x1000, 0x5000, 0x3000] {
        e.set(Setting::MappedMemory(region(start, 0x1000), true));
    }
    assert!(e.mapped.windows(2).all(|w| w[0].start < w[1].start));
    for (start, len, inside) in [
        (0x1000, 0x1000, true),
        (0x5800, 0x800, true),
        (0x9fff, 1, true),
        (0x2000, 0x10, false),
        (0x0fff, 2, false),
        (0x5800, 0x900, false),
        (0xa000, 1, false),
        (0x100, 1, false),
    ] {
        assert_eq!(in_ranges(&e.mapped, region(start, len)), inside, "{start:#x}+{len:#x}");
    }
    e.set(Setting::MappedMemory(region(0x5000, 0x1000), false));
    assert!(!in_ranges(&e.mapped, region(0x5800, 0x10)));
    assert!(in_ranges(&e.mapped, region(0x3000, 0x10)) && in_ranges(&e.mapped, region(0x9000, 0x10)));
}

#[test]
fn a_receive_takes_a_whole_unexpected_eager_message_without_a_request() {
    let mut sim = Sim::new(3, one_sided_route);
    let (a, b, big) = (pattern(1, 40), pattern(2, 300), pattern(3, 800));
    let sends = [send(&mut sim, 0, 2, 7, &a), send(&mut sim, 1, 2, 8, &b), send(&mut sim, 0, 2, 9, &big)];
    sim.settle();
    let take = |sim: &mut Sim, src: Source, tag: TagMatch, buf: &mut [u8]| {
        let region = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
        // SAFETY: `buf` is valid for the call.
        unsafe { sim.engines[2].recv_unexpected(src, tag, SpaceId(0), region) }
    };
    let mut out = vec![0u8; 500];
    // Nothing with tag 5 from anyone: post the receive instead.
    assert!(take(&mut sim, Source::Any, TagMatch::Tag(5), &mut out).is_none());
    // ANY_SOURCE takes the first arrival that matches.
    let st = take(&mut sim, Source::Any, TagMatch::Any, &mut out).expect("rank 0's first message");
    assert_eq!((st.source, st.tag, st.len), (0, 7, 40));
    assert_eq!(out[..40], a[..]);
    let st = take(&mut sim, Source::Rank(1), TagMatch::Any, &mut out).expect("rank 1's message");
    assert_eq!((st.source, st.tag, st.len), (1, 8, 300));
    assert_eq!(out[..300], b[..]);
    // Too long for the buffer: left for a request, which reports the truncation.
    assert!(take(&mut sim, Source::Rank(0), TagMatch::Any, &mut out).is_none());
    let q = recv(&mut sim, 2, Source::Rank(0), TagMatch::Any, &mut out);
    assert!(matches!(result(&mut sim, 2, q), Err(Error::Truncated { from: 0, tag: 9, len: 800, capacity: 500 })));
    for (i, s) in sends.into_iter().enumerate() {
        assert!(result(&mut sim, [0, 1, 0][i], s).is_ok());
    }
    assert_eq!(sim.engines[2].active_requests(), 0);
}

/// A blocking receive parked in the engine takes a whole eager message without a request, lets
/// others go unexpected, and becomes a request for a fragmented message or an RTS.
#[test]
fn a_parked_receive_takes_its_message_or_becomes_a_request() {
    let mut sim = Sim::new(2, one_sided_route);
    let park = |sim: &mut Sim, tag: u32, buf: &mut [u8]| {
        let region = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
        // SAFETY: every buffer outlives its park (unparked before the test moves on).
        unsafe { sim.engines[1].try_park(Source::Rank(0), TagMatch::Tag(tag), SpaceId(0), region) }
    };
    // Whole eager: copied on arrival; another tag first goes unexpected.
    let (other, a) = (pattern(1, 10), pattern(2, 60));
    let mut out = vec![0u8; 64];
    assert!(park(&mut sim, 7, &mut out));
    assert!(!sim.engines[1].parked_settled());
    let s1 = send(&mut sim, 0, 1, 3, &other);
    let s2 = send(&mut sim, 0, 1, 7, &a);
    sim.settle();
    assert!(sim.engines[1].parked_settled());
    assert!(matches!(sim.engines[1].unpark(), Unparked::Done(Ok(Status { source: 0, tag: 7, len: 60 }))));
    assert_eq!(out[..60], a[..]);
    assert_eq!(sim.engines[1].active_requests(), 0, "no request made");
    // A matching unexpected message is there: no park (the receive takes it as posted).
    assert!(!park(&mut sim, 3, &mut out));
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(3), &mut out);
    assert_eq!(result(&mut sim, 1, q).unwrap().len, 10);
    // Fragments (frag 100) and a message too long: a request, in the receive's place.
    for (len, cap) in [(700, 1000), (200, 100)] {
        let data = pattern(len as u8, len);
        let mut out = vec![0u8; cap];
        assert!(park(&mut sim, 9, &mut out));
        let s = send(&mut sim, 0, 1, 9, &data);
        sim.settle();
        let Unparked::Promoted(q) = sim.engines[1].unpark() else { panic!("{len} B into {cap} B: not promoted") };
        match result(&mut sim, 1, q) {
            Ok(st) => assert_eq!((st.len, &out[..len]), (len, &data[..])),
            Err(e) => assert!(matches!(e, Error::Truncated { len: 200, capacity: 100, .. }), "{e}"),
        }
        assert!(result(&mut sim, 0, s).is_ok());
    }
    // A 1000 B buffer parks (eager size); the RTS of a 2000 B message (single copy) makes it a
    // request, which reports the truncation. A 4000 B buffer is posted (it may send an RTR).
    let big = pattern(9, 2000);
    let mut out = vec![0u8; 1000];
    assert!(park(&mut sim, 4, &mut out));
    let s = send(&mut sim, 0, 1, 4, &big);
    sim.settle();
    let Unparked::Promoted(q) = sim.engines[1].unpark() else { panic!("RTS: not promoted") };
    assert!(matches!(result(&mut sim, 1, q), Err(Error::Truncated { len: 2000, capacity: 1000, .. })));
    let mut large = vec![0u8; 4000];
    assert!(!park(&mut sim, 4, &mut large), "a single-copy-sized buffer parks");
    for s in [s1, s2, s] {
        assert!(result(&mut sim, 0, s).is_ok());
    }
    // Nothing arrived: withdrawn.
    assert!(park(&mut sim, 5, &mut out));
    assert!(matches!(sim.engines[1].unpark(), Unparked::Withdrawn));
    // The peer is lost while parked: the park ends with the error.
    assert!(park(&mut sim, 5, &mut out));
    assert!(sim.engines[1].awaited_channels().contains(AM));
    sim.engines[1].handle_peer_lost(0, Error::PeerLost { rank: 0, why: "killed".into() });
    assert!(matches!(sim.engines[1].unpark(), Unparked::Done(Err(Error::PeerLost { rank: 0, .. }))));
    assert!(!park(&mut sim, 5, &mut out), "parked for a lost peer");
    assert_eq!(sim.engines[1].active_requests(), 0);
}

/// A packet as a faulty peer might send it: any kind, with fields mostly near what the engine
/// expects (the next sequence id, request ids the rank sent out, lengths and offsets around
/// the buffers' sizes, keys of the right length), sometimes anything.
#[derive(Clone, Debug)]
struct FaultyPacket {
    hdr: Header,
    /// `Some(i)`: the sequence id is the next one the peer expects plus `i`.
    seq_ahead: Option<u32>,
    /// `Some(i)`: `sreq` / `rreq` are the `i`-th (modulo) of the ids the rank sent out, or 0.
    sreq_pick: Option<usize>,
    rreq_pick: Option<usize>,
    payload: Vec<u8>,
}

fn faulty_packet() -> impl Strategy<Value = FaultyPacket> {
    use PacketKind::*;
    let kinds = [Eager, Frag, Rts, Cts, Data, Fin, Rtr, Skew, Withdraw, Withdrawn];
    let size = || prop_oneof![4 => 0u64..10_000, 1 => any::<u64>()];
    let pick = || prop_oneof![4 => (0usize..16).prop_map(Some), 1 => Just(None)];
    let payload = prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..300),
        1 => prop::collection::vec(any::<u8>(), 16),
    ];
    let fields = (0..kinds.len(), 0u8..16, 0u16..2, 0u32..3, size(), size(), any::<u32>(), any::<u32>(), any::<u32>());
    let picks = (prop_oneof![4 => (0u32..2).prop_map(Some), 1 => Just(None)], pick(), pick(), payload);
    (fields, picks).prop_map(
        move |((k, flags, ctx, tag, len, offset, seq, sreq, rreq), (seq_ahead, sreq_pick, rreq_pick, payload))| {
            let hdr = Header { kind: kinds[k], flags, ctx, tag, seq, len, sreq, rreq, offset };
            FaultyPacket { hdr, seq_ahead, sreq_pick, rreq_pick, payload }
        },
    )
}

/// Bytes around every buffer of [`faulty_packets_stay_inside_the_buffers`], which nothing may
/// write.
const GUARD: usize = 64;

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 4 } else { 2048 }, ..ProptestConfig::default() })]

    /// Whatever packets a faulty peer sends to a rank with receives and sends of every
    /// protocol under way, the engine refuses them as protocol errors naming the peer or takes
    /// them, and neither panics nor writes outside a posted buffer; it asks channels to read
    /// into and write from nothing but its requests' buffers, and a finished request has a
    /// result.
    #[test]
    fn faulty_packets_stay_inside_the_buffers(packets in prop::collection::vec(faulty_packet(), 1..24)) {
        let mut sim = Sim::new(2, one_sided_route);
        // Receive buffers of split, get, fragmented and eager sizes (the largest matches first),
        // with guard bytes around; sends of the same sizes.
        let sizes = [9000usize, 3000, 700, 8, 0];
        let mut recv_bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xa5; n + 2 * GUARD]).collect();
        let mut reqs = Vec::new();
        let mut inside = Vec::new(); // (start, end) of every user buffer
        for (i, b) in recv_bufs.iter_mut().enumerate() {
            let n = b.len() - 2 * GUARD;
            let user = &mut b[GUARD..GUARD + n];
            inside.push((user.as_ptr() as usize, user.as_ptr() as usize + n));
            let src = if i % 2 == 0 { Source::Rank(0) } else { Source::Any };
            reqs.push(recv(&mut sim, 1, src, TagMatch::Any, user));
        }
        let send_bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| pattern(n as u8, n)).collect();
        for (i, b) in send_bufs.iter().enumerate() {
            inside.push((b.as_ptr() as usize, b.as_ptr() as usize + b.len()));
            reqs.push(send(&mut sim, 1, 0, i as u32, b));
        }
        if packets.len() % 2 == 0 {
            // A withdrawal under way too (the first receive sent an RTR).
            sim.run_actions();
            prop_assert_eq!(sim.engines[1].cancel_recv(reqs[0]), CancelRecv::Asked);
        }
        let within = |ptr: usize, len: usize| len == 0 || inside.iter().any(|&(s, e)| ptr >= s && ptr + len <= e);
        // Request ids the rank sent out (in RTS, RTR, CTS and FIN packets), and none (0): what
        // a peer names.
        let mut ids: Vec<u32> = vec![0];
        let e = &mut sim.engines[1];
        // Puts stay in flight until the packets are all in (as a channel's write may): a send
        // must not end while its put still reads the buffer.
        let mut puts: Vec<OpId> = Vec::new();
        let drain = |e: &mut Engine, ids: &mut Vec<u32>, puts: &mut Vec<OpId>| -> std::result::Result<(), TestCaseError> {
            while let Some(a) = e.poll_action() {
                match a {
                    Action::Send { op, payload, hdr, .. } => {
                        ids.extend([hdr.sreq, hdr.rreq].into_iter().filter(|&id| id != 0));
                        if let Payload::User(r) = payload {
                            prop_assert!(within(r.ptr as usize, r.len), "a send from outside the buffers");
                        }
                        if let Some(op) = op {
                            e.handle_op(op, OpOutcome::Sent);
                        }
                    }
                    Action::Register { region, op, .. } => {
                        prop_assert!(within(region.ptr as usize, region.len), "an exposure outside the buffers");
                        let key = RemoteKey::new(&[7; 16]).unwrap();
                        e.handle_op(op, OpOutcome::Registered(Ok(MemHandle::new(key, &Lifetime::Transfer))));
                    }
                    Action::Deregister { .. } => {}
                    Action::Get { into, op, .. } => {
                        prop_assert!(within(into.ptr as usize, into.len), "a get into {} bytes outside the buffers", into.len);
                        e.handle_op(op, OpOutcome::Done(Ok(())));
                    }
                    Action::Put { from, op, .. } => {
                        prop_assert!(within(from.ptr as usize, from.len), "a put of {} bytes from outside the buffers", from.len);
                        puts.push(op);
                    }
                }
            }
            for &op in puts.iter() {
                let id = ReqId::from_op(op).expect("a request's op");
                prop_assert!(!e.is_done(id), "a send ended while its put still read the buffer");
            }
            Ok(())
        };
        drain(e, &mut ids, &mut puts)?;
        let mut next_seq = 0u32; // the peer's ordered packets the rank took
        for p in &packets {
            let mut hdr = p.hdr;
            let pick = |i: Option<usize>, any: u32| match i {
                Some(i) => ids[i % ids.len()],
                _ => any,
            };
            hdr.sreq = pick(p.sreq_pick, hdr.sreq);
            hdr.rreq = pick(p.rreq_pick, hdr.rreq);
            if let Some(ahead) = p.seq_ahead {
                hdr.seq = next_seq.wrapping_add(ahead);
            }
            match e.handle_message(0, &hdr, &p.payload) {
                Ok(()) => next_seq += u32::from(hdr.kind.is_ordered() && hdr.seq == next_seq),
                Err(err) => prop_assert!(matches!(err, Error::Protocol { peer: 0, .. }), "{:?}: {}", hdr, err),
            }
            drain(e, &mut ids, &mut puts)?;
        }
        for op in std::mem::take(&mut puts) {
            e.handle_op(op, OpOutcome::Done(Ok(())));
        }
        drain(e, &mut ids, &mut puts)?;
        for id in reqs {
            if e.is_done(id) {
                prop_assert!(e.take_result(id).is_some());
            }
        }
        for b in &recv_bufs {
            let n = b.len() - 2 * GUARD;
            prop_assert!(b[..GUARD].iter().chain(&b[GUARD + n..]).all(|&x| x == 0xa5), "a guard byte was written");
        }
    }
}

/// Split messages that run alone settle on the receiver's share the clock finds fastest, with
/// the receive posted first (the sender chooses) and after (the receiver does); the driver's
/// clock is played by `ns_of`, a function of the split point.
#[test]
fn the_split_share_follows_the_measured_times() {
    let len = 64 << 10;
    for (recv_first, fastest) in [(true, 16 << 10), (false, 24 << 10)] {
        let mut sim = Sim::new(2, one_sided_route);
        let chooser = if recv_first { 0 } else { 1 };
        let ns_of = |split: usize| if split == fastest { 3_000 } else { 5_000 };
        let mut splits = Vec::new();
        for i in 0..40u32 {
            let data = pattern(i as u8, len);
            let mut out = vec![0u8; len];
            let (s, q);
            if recv_first {
                q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(i), &mut out);
                sim.settle();
                s = send(&mut sim, 0, 1, i, &data);
            } else {
                s = send(&mut sim, 0, 1, i, &data);
                sim.settle();
                q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(i), &mut out);
            }
            let e = &mut sim.engines[chooser];
            let split = e.reqs.get(if recv_first { s } else { q }).expect("running").split;
            splits.push(split);
            let timed = e.split_timed();
            if timed {
                assert_eq!(e.poll_split_timing(), Some(SplitTiming::Start));
                assert_eq!(e.poll_split_timing(), Some(SplitTiming::Running), "still running");
            }
            sim.settle();
            if timed {
                let e = &mut sim.engines[chooser];
                assert_eq!(e.poll_split_timing(), Some(SplitTiming::End));
                e.handle_observation(Observed::SplitTime(SplitTime::Took(ns_of(split))));
                assert!(!e.split_timed());
            }
            assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
            assert_eq!(out, data);
        }
        // Sixteen halves untimed, each share in turn four times (halves first), then the
        // fastest one.
        let tried = [[32 << 10, 24 << 10, 16 << 10]; 4].concat();
        assert!(splits[..16].iter().all(|&s| s == 32 << 10), "recv_first {recv_first}: {splits:?}");
        assert_eq!(splits[16..28], tried[..], "recv_first {recv_first}");
        assert!(splits[28..].iter().all(|&s| s == fastest), "recv_first {recv_first}: {splits:?}");
        assert!(!sim.engines[chooser].split_timed());
    }
}

/// A split message that starts while another is under way makes neither a trial: with
/// several in flight the search does not advance; and a fixed share is used as given.
#[test]
fn split_messages_in_flight_together_are_not_trials() {
    let len = 64 << 10;
    let mut sim = Sim::new(2, one_sided_route);
    let data = pattern(3, len);
    // Past the warm-up of the size class (messages one at a time, untimed here).
    for _ in 0..16 {
        let mut out = vec![0u8; len];
        let s = send(&mut sim, 0, 1, 1, &data);
        sim.settle();
        let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
        sim.settle();
        assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
        assert!(!sim.engines[1].split_timed());
    }
    let mut outs = vec![vec![0u8; len]; 3];
    // Sender first: the receiver chooses each share as its receive meets the RTS.
    let sends: Vec<ReqId> = (0..3).map(|_| send(&mut sim, 0, 1, 1, &data)).collect();
    sim.settle();
    let recvs: Vec<ReqId> =
        outs.iter_mut().map(|out| recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), out)).collect();
    // The first was a trial, disturbed by the second; the others were not trials.
    let e = &mut sim.engines[1];
    assert_eq!(e.poll_split_timing(), Some(SplitTiming::Start));
    sim.settle();
    let e = &mut sim.engines[1];
    assert_eq!(e.poll_split_timing(), Some(SplitTiming::End));
    e.handle_observation(Observed::SplitTime(SplitTime::Took(1)));
    let tuner = e.peers[0].split.as_ref().expect("made at the first split");
    assert_eq!(tuner.classes_measured(), 0, "a disturbed trial does not count");
    for (s, q) in sends.into_iter().zip(recvs) {
        assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    }
    assert!(outs.iter().all(|o| *o == data));

    let mut sim = Sim::new(2, one_sided_route);
    sim.engines[0].retune(|t| t.split_share = SplitShare::Percent(30));
    let mut out = vec![0u8; len];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    sim.settle();
    let s = send(&mut sim, 0, 1, 1, &data);
    assert_eq!(sim.engines[0].reqs.get(s).unwrap().split, 16 << 10, "30 % of 64 KiB, page aligned");
    assert!(!sim.engines[0].split_timed());
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
    assert_eq!(out, data);
}

/// A rank outside the job is refused by every entry point that takes one, without a panic.
#[test]
fn ranks_outside_the_job_are_errors() {
    let mut e = Engine::new(0, 2, Tuning::default());
    let mut buf = [0u8; 8];
    let region = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
    for r in [2, 7, Rank::MAX] {
        let out_of_range =
            |res: Result<ReqId>| matches!(res, Err(Error::InvalidArgument(m)) if m.contains("out of range"));
        // SAFETY: `buf` outlives the engine's use of it: every call is refused or ends here.
        unsafe {
            assert!(e.recv_unexpected(Source::Rank(r), TagMatch::Any, SpaceId(0), region).is_none());
            assert!(!e.try_park(Source::Rank(r), TagMatch::Any, SpaceId(0), region));
            assert!(out_of_range(request(e.post_recv(
                Source::Rank(r),
                TagMatch::Any,
                SpaceId(0),
                region,
                RecvPath::Request
            ))));
            let msg = Outgoing::Message { tag: 0, space: SpaceId(0) };
            assert!(out_of_range(e.post_send(r, msg, Region { ptr: buf.as_ptr(), len: buf.len() })));
        }
        assert!(e.probe(Source::Rank(r), TagMatch::Any, SpaceId(0)).found.is_none());
        assert!(e.peer_error(r).is_none());
    }
}

/// A peer no channel reaches: a send to it and a receive naming it fail at once with the
/// reason given; ANY_SOURCE receives still wait for the others.
#[test]
fn an_unreachable_peer_fails_sends_and_receives_at_once() {
    let mut sim = Sim::new(3, stream_route);
    sim.engines[0].set(Setting::Route(2, Err("shm: on another node".into())));
    let mut buf = [0u8; 8];
    let unreachable =
        |r: Result<ReqId>| matches!(r, Err(Error::Unreachable { rank: 2, why }) if why == "shm: on another node");
    // SAFETY: `buf` outlives the engine's use of it: the refused calls keep nothing, and the
    // ANY_SOURCE receive is settled below.
    unsafe {
        let msg = Outgoing::Message { tag: 0, space: SpaceId(0) };
        assert!(unreachable(sim.engines[0].post_send(2, msg, Region { ptr: buf.as_ptr(), len: 8 })));
        assert!(unreachable(request(sim.engines[0].post_recv(
            Source::Rank(2),
            TagMatch::Any,
            SpaceId(0),
            RegionMut { ptr: buf.as_mut_ptr(), len: 8 },
            RecvPath::Request
        ))));
    }
    let any = recv(&mut sim, 0, Source::Any, TagMatch::Any, &mut buf);
    let data = pattern(1, 8);
    send(&mut sim, 1, 0, 5, &data);
    sim.settle();
    assert_eq!(result(&mut sim, 0, any).unwrap(), Status { source: 1, tag: 5, len: 8 });
    assert_eq!(buf[..], data[..]);
}

/// A split receive whose own copy fails ends only after the sender's part is written (its
/// FIN), with the copy's error: nothing writes the buffer once the receive has ended, so no
/// warning about a peer that may still write is due. The sender's send succeeds.
#[test]
fn a_split_receive_whose_copy_fails_waits_for_the_senders_part() {
    let split = || route(100, &[(usize::MAX, Protocol::RndvSplit)]);
    // Receiver first with its RTR taken by the send (the sender writes the back through the
    // RTR's key), both posted before anything moves (the RTS crosses the RTR), sender first.
    for order in ["rtr first", "crossed", "sender first"] {
        let mut sim = Sim { ordered_puts: Some(Vec::new()), failing_gets: Some(1), ..Sim::new(2, split) };
        let data = pattern(3, 100_000);
        let mut out = vec![0u8; data.len()];
        let (q, s) = if order != "sender first" {
            let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
            if order == "rtr first" {
                sim.settle();
            }
            (q, send(&mut sim, 0, 1, 1, &data))
        } else {
            let s = send(&mut sim, 0, 1, 1, &data);
            (recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out), s)
        };
        sim.settle();
        let late = sim.ordered_puts.replace(Vec::new()).unwrap();
        assert_eq!(late.len(), 1, "the sender's put is in flight");
        assert!(!sim.engines[1].is_done(q), "{order}: the receive ended while the sender still wrote its part");
        for (rank, op) in late {
            sim.engines[rank as usize].handle_op(op, OpOutcome::Done(Ok(())));
        }
        sim.settle();
        let done = finished(&mut sim, 1, q);
        assert!(matches!(done.result, Err(Error::Transport { kind: "sim", .. })));
        assert!(result(&mut sim, 0, s).is_ok());
        assert!(!done.peer_may_write);
    }
}

/// A discarded receive that later receives' RTRs count stays posted until its sender answers
/// the withdrawal, writing nothing: a message that reaches it meanwhile is dropped (the send
/// still ends), and the next ones go where their receives expect them.
#[test]
fn a_discarded_receive_that_later_rtrs_count_takes_nothing() {
    for message_first in [false, true] {
        let mut sim = Sim::new(2, one_sided_route);
        sim.engines[1].peers[0].window_rtrs = true;
        let mut first = vec![0u8; 8];
        let (mut second, mut third) = (vec![0u8; 3000], vec![0u8; 3000]);
        let r0 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut first);
        let r1 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut second);
        sim.settle();
        let (a, b, c) = (pattern(1, 8), pattern(2, 3000), pattern(3, 3000));
        let s0 = message_first.then(|| send(&mut sim, 0, 1, 1, &a));
        sim.engines[1].discard(r0);
        assert_eq!(sim.engines[1].running_requests(), 2, "still posted");
        sim.settle();
        assert_eq!(sim.engines[1].running_requests(), 1, "ended by the answer or the message");
        let r2 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut third);
        let s1 = send(&mut sim, 0, 1, 1, &b);
        let s2 = send(&mut sim, 0, 1, 1, &c);
        sim.settle();
        for (rank, id) in [(0, s1), (0, s2), (1, r1), (1, r2)].into_iter().chain(s0.map(|s| (0, s))) {
            assert!(result(&mut sim, rank, id).is_ok());
        }
        assert_eq!((&second, &third), (&b, &c));
        assert_eq!(first, [0u8; 8], "the discarded receive's buffer was not written");
        sim.assert_exposures_released();
    }
}

/// A trial the driver saw disturbed (the process away from the library for a while) does not
/// count; the next one does.
#[test]
fn a_disturbed_split_trial_does_not_count() {
    let len = 64 << 10;
    let mut sim = Sim::new(2, one_sided_route);
    let data = pattern(5, len);
    for i in 0..18 {
        let mut out = vec![0u8; len];
        let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
        sim.settle();
        let s = send(&mut sim, 0, 1, 1, &data);
        let e = &mut sim.engines[0];
        assert_eq!(e.split_timed(), i >= 16, "message {i}: trials after 16 untimed ones");
        if i >= 16 {
            assert_eq!(e.poll_split_timing(), Some(SplitTiming::Start));
            if i == 16 {
                e.handle_observation(Observed::SplitTime(SplitTime::Disturbed));
            }
        }
        sim.settle();
        let e = &mut sim.engines[0];
        if i >= 16 {
            assert_eq!(e.poll_split_timing(), Some(SplitTiming::End));
            e.handle_observation(Observed::SplitTime(SplitTime::Took(3_000)));
            let measured = e.peers[1].split.as_ref().expect("made at the first split").classes_measured();
            assert_eq!(measured, i - 16, "message {i}");
        }
        assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, q).is_ok());
        assert_eq!(out, data);
    }
}

/// A receive discarded before its RTR's exposure ran, while a receive behind it waits for the
/// same messages, is withdrawn through the sender; its own RTR never goes out, so nothing can
/// write into its buffer, and every exposure ends.
#[test]
fn a_receive_discarded_before_its_rtr_left_lends_nothing() {
    let mut sim = Sim::new(2, one_sided_route);
    sim.engines[1].peers[0].window_rtrs = true;
    let (mut first, mut second) = (vec![0u8; 3000], vec![0u8; 3000]);
    let r0 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut first);
    let r1 = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut second);
    // Both exposures still queued.
    assert!(!sim.engines[1].discard(r0), "its key never went out");
    sim.run_actions();
    let kinds: Vec<(PacketKind, u32)> = sim.wires[0].iter().map(|p| (p.hdr.kind, p.hdr.rreq)).collect();
    assert_eq!(kinds.iter().filter(|k| k.0 == PacketKind::Rtr).count(), 1, "{kinds:?}");
    assert_eq!(kinds.last().map(|k| k.0), Some(PacketKind::Withdraw));
    sim.settle(); // the withdrawal ends (a message sent before would go to the discarded receive)
    let a = pattern(4, 3000);
    let s = send(&mut sim, 0, 1, 1, &a);
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, r1).is_ok());
    assert_eq!(second, a);
    assert!(first.iter().all(|&x| x == 0), "the discarded receive's buffer was written");
    assert!(sim.exposed.iter().all(Vec::is_empty), "an exposure was left");
}

/// An ANY_SOURCE receive posted once every other rank has finished can never match: refused
/// at once (unless a message they left matches it), as probes are.
#[test]
fn an_any_source_receive_after_every_peer_finished_is_refused() {
    let mut sim = Sim::new(3, one_sided_route);
    let mut left = vec![0u8; 8];
    send(&mut sim, 1, 0, 4, b"left");
    sim.settle();
    sim.engines[0].handle_peer_lost(1, Error::PeerFinished { rank: 1 });
    sim.engines[0].handle_peer_lost(2, Error::PeerFinished { rank: 2 });
    let q = recv(&mut sim, 0, Source::Any, TagMatch::Any, &mut left);
    assert_eq!(result(&mut sim, 0, q).unwrap().source, 1, "the message rank 1 left still matches");
    // SAFETY: `left` outlives the call, which refuses the receive.
    let refused = unsafe {
        request(sim.engines[0].post_recv(
            Source::Any,
            TagMatch::Any,
            SpaceId(0),
            RegionMut { ptr: left.as_mut_ptr(), len: left.len() },
            RecvPath::Request,
        ))
    };
    assert!(matches!(refused, Err(Error::InvalidArgument(ref m)) if m.contains("ANY_SOURCE")), "{refused:?}");
}

/// Matching context of the space of [`wildcards_in_a_space`].
const SPACE: u16 = 7;

/// Three ranks; rank 0 knows that only it and rank 1 send in context [`SPACE`], and has an
/// ANY_SOURCE receive posted there (into `a`) and one in context 0 (into `b`).
fn wildcards_in_a_space(a: &mut [u8], b: &mut [u8]) -> (Sim, ReqId, ReqId) {
    let mut sim = Sim::new(3, one_sided_route);
    sim.engines[0].set(Setting::SpaceMembers(SpaceId(SPACE), &[1, 0]));
    let in_space = recv_in(&mut sim, 0, Source::Any, TagMatch::Any, SPACE, a);
    let in_world = recv_in(&mut sim, 0, Source::Any, TagMatch::Any, 0, b);
    (sim, in_space, in_world)
}

/// In a context only some ranks send in, an ANY_SOURCE receive fails once those have finished,
/// while other ranks live on; receives in other contexts wait on.
#[test]
fn an_any_source_receive_ends_with_the_members_of_its_context() {
    let (mut a, mut b) = (vec![0u8; 8], vec![0u8; 8]);
    let (mut sim, in_space, in_world) = wildcards_in_a_space(&mut a, &mut b);
    assert!(!sim.engines[0].all_others_gone_in(SpaceId(SPACE)));
    sim.engines[0].handle_peer_lost(1, Error::PeerFinished { rank: 1 });
    assert!(sim.engines[0].all_others_gone_in(SpaceId(SPACE)) && !sim.engines[0].all_others_gone_in(SpaceId(0)));
    assert!(matches!(result(&mut sim, 0, in_space), Err(Error::PeerFinished { rank: 1 })));
    assert!(!sim.engines[0].is_done(in_world), "rank 2 may still send in context 0");
    // SAFETY: as above.
    let refused = unsafe {
        let region = RegionMut { ptr: a.as_mut_ptr(), len: 8 };
        request(sim.engines[0].post_recv(Source::Any, TagMatch::Any, SpaceId(SPACE), region, RecvPath::Request))
    };
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(sim.engines[0].finalize(Finalize::Withdraw).receives, 1);
}

/// A lost rank fails the ANY_SOURCE receives of the contexts it may send in (its message may
/// have been lost with it), not those of a space it is no member of.
#[test]
fn a_loss_fails_the_any_source_receives_only_where_the_lost_rank_sends() {
    let (mut a, mut b) = (vec![0u8; 8], vec![0u8; 8]);
    let (mut sim, in_space, in_world) = wildcards_in_a_space(&mut a, &mut b);
    let lost = || Error::PeerLost { rank: 2, why: "killed".into() };
    sim.engines[0].handle_peer_lost(2, lost());
    assert!(matches!(result(&mut sim, 0, in_world), Err(Error::PeerLost { rank: 2, .. })));
    assert!(!sim.engines[0].is_done(in_space), "rank 2 sends nothing in the space");
    let s = send_in(&mut sim, 1, 0, 4, SPACE, b"in space");
    sim.settle();
    assert_eq!(result(&mut sim, 0, in_space).unwrap().source, 1);
    assert!(result(&mut sim, 1, s).is_ok());
    assert_eq!(&a, b"in space");
}

/// A FIN only ends what waits for one: not an eager receive in the middle of its fragments
/// (whose slot would then be freed under the next fragment), not a send twice, not a
/// receiver-first send with a truncation. Each is the peer's protocol error; nothing panics.
#[test]
fn a_fin_nothing_waits_for_is_a_protocol_error() {
    let mut sim = Sim::new(2, one_sided_route);
    let mut out = vec![0u8; 9000];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    let mut first = Header::eager(0, 1, 0, 5000);
    first.kind = PacketKind::Eager;
    assert!(sim.engines[1].handle_message(0, &first, &[7; 100]).is_ok());
    let mut fin = Header::new(PacketKind::Fin);
    fin.rreq = q.wire();
    assert!(matches!(sim.engines[1].handle_message(0, &fin, &[]), Err(Error::Protocol { peer: 0, .. })));
    assert!(!sim.engines[1].is_done(q), "the bogus FIN ended nothing");
    let mut frag = Header::eager(0, 1, 0, 5000);
    (frag.kind, frag.offset) = (PacketKind::Frag, 100);
    assert!(sim.engines[1].handle_message(0, &frag, &[8; 4900]).is_ok());
    assert_eq!(result(&mut sim, 1, q).unwrap().len, 5000);
    assert!(out[..100].iter().all(|&b| b == 7) && out[100..5000].iter().all(|&b| b == 8));
    // A new message after it (sequence 1), first packet and fragment, is kept as unexpected:
    // its fragment finds that message, not the ended receive's freed slot.
    let mut late = Header::eager(0, 1, 1, 5000);
    assert!(sim.engines[1].handle_message(0, &late, &[1; 100]).is_ok());
    late.kind = PacketKind::Frag;
    late.offset = 100;
    assert!(sim.engines[1].handle_message(0, &late, &[1; 100]).is_ok(), "kept as unexpected");

    // Sender first: the receiver's FIN ends the send once; a second one is refused.
    let mut sim = Sim::new(2, one_sided_route);
    let data = pattern(4, 3000);
    let mut buf = vec![0u8; 3000];
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.settle();
    let r = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut buf);
    sim.settle();
    assert!(result(&mut sim, 1, r).is_ok() && sim.engines[0].is_done(s));
    let mut fin = Header::new(PacketKind::Fin);
    fin.sreq = s.wire();
    assert!(sim.engines[0].handle_message(1, &fin, &[]).is_err(), "a second FIN");
    assert!(result(&mut sim, 0, s).is_ok());

    // Receiver first without a split: the receiver sends no FIN, and no truncation either.
    let mut sim = Sim { ordered_puts: Some(Vec::new()), ..Sim::new(2, one_sided_route) };
    let r = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut buf);
    sim.settle();
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.run_actions();
    for flags in [0, Header::TRUNCATED] {
        let mut fin = Header::new(PacketKind::Fin);
        (fin.sreq, fin.flags) = (s.wire(), flags);
        assert!(sim.engines[0].handle_message(1, &fin, &[]).is_err(), "flags {flags}");
    }
    assert!(!sim.engines[0].is_done(s), "the put is still in flight");
    let late = sim.ordered_puts.replace(Vec::new()).unwrap();
    for (rank, op) in late {
        sim.engines[rank as usize].handle_op(op, OpOutcome::Done(Ok(())));
    }
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok() && result(&mut sim, 1, r).is_ok());
    assert_eq!(buf, data);
}

/// A message a lost sender left half-way (an eager one missing fragments, a rendezvous
/// announcement) ends the receive that takes it with the sender's loss, at once.
#[test]
fn a_receive_taking_what_a_lost_peer_left_half_way_fails_at_once() {
    let mut sim = Sim::new(2, one_sided_route);
    let data = pattern(5, 3000);
    let s = send(&mut sim, 0, 1, 2, &data); // an RTS
    sim.settle();
    let mut part = Header::eager(0, 1, 1, 5000);
    part.kind = PacketKind::Eager;
    assert!(sim.engines[1].handle_message(0, &part, &[3; 100]).is_ok());
    sim.engines[1].handle_peer_lost(0, Error::PeerLost { rank: 0, why: "test".into() });
    let (mut a, mut b) = (vec![0u8; 3000], vec![0u8; 5000]);
    let rts = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(2), &mut a);
    let eager = recv(&mut sim, 1, Source::Any, TagMatch::Tag(1), &mut b);
    assert!(matches!(result(&mut sim, 1, rts), Err(Error::PeerLost { rank: 0, .. })));
    assert!(matches!(result(&mut sim, 1, eager), Err(Error::PeerLost { rank: 0, .. })));
    assert!(sim.engines[1].poll_action().is_none(), "no copy from the lost peer was started");
    let _ = s;
}

/// A message beyond the largest eager one a receiver takes is streamed, whatever the route says
/// (here: eager for every size).
#[test]
fn a_message_too_large_for_eager_is_streamed_whatever_the_route() {
    let mut sim = Sim::new(2, || route(64 << 10, &[(usize::MAX, Protocol::Eager)]));
    let big = vec![0u8; MAX_EAGER_LEN as usize + 1]; // zero pages: never touched here
    let s = send(&mut sim, 0, 1, 1, &big);
    match sim.engines[0].poll_action() {
        Some(Action::Send { hdr, .. }) => {
            assert_eq!((hdr.kind, hdr.flags & Header::STREAM), (PacketKind::Rts, Header::STREAM))
        }
        other => panic!("expected the RTS of a stream, got {other:?}"),
    }
    let small = send(&mut sim, 0, 1, 1, &big[..MAX_EAGER_LEN as usize]);
    match sim.engines[0].poll_action() {
        Some(Action::Send { hdr, .. }) => assert_eq!(hdr.kind, PacketKind::Eager),
        other => panic!("expected an eager packet, got {other:?}"),
    }
    let _ = (s, small);
}

/// A one-sided copy that fails still tells the peer its side is over: a receiver whose pull
/// failed sends its FIN (the sender's buffer is free, its send ends), and a sender whose put
/// failed sends a FIN flagged TRUNCATED, which fails the receive. Before, the peer waited for
/// ever.
#[test]
fn a_failed_copy_still_ends_the_peers_side() {
    // The receiver pulls the whole message (sender first), and its get fails.
    let mut sim = Sim { failing_gets: Some(1), ..Sim::new(2, one_sided_route) };
    let data = pattern(5, 2000);
    let mut out = vec![0u8; data.len()];
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.settle();
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    sim.settle();
    assert!(matches!(result(&mut sim, 1, q), Err(Error::Transport { kind: "sim", .. })));
    assert!(result(&mut sim, 0, s).is_ok(), "the send ends: its receiver no longer reads it");
    // The sender puts the whole message through the receive's RTR (receiver first), and its
    // put fails.
    let mut sim = Sim { failing_puts: Some(0), ..Sim::new(2, one_sided_route) };
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    sim.settle();
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.settle();
    assert!(matches!(result(&mut sim, 0, s), Err(Error::Transport { kind: "sim", .. })));
    let got = finished(&mut sim, 1, q);
    assert!(
        matches!(&got.result, Err(Error::Transport { kind: "peer", what }) if what.contains("rank 0 could not write")),
        "{got:?}"
    );
    assert!(!got.peer_may_write, "the sender said it is done with the key");
    // Split, receiver first: the sender's put of the back fails while the receiver still reads
    // the front through the send's key; the send ends (with the error) only at the
    // receiver's FIN, which it still takes (a FIN naming an ended send would be a protocol
    // error, and the sim refuses those).
    let split = || route(100, &[(usize::MAX, Protocol::RndvSplit)]);
    let mut sim = Sim { failing_puts: Some(0), ..Sim::new(2, split) };
    let data = pattern(7, 100_000);
    let mut out = vec![0u8; data.len()];
    let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
    sim.settle();
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.run_actions();
    assert!(!sim.engines[0].is_done(s), "the receiver still reads the front");
    sim.settle();
    assert!(matches!(result(&mut sim, 0, s), Err(Error::Transport { kind: "sim", .. })));
    assert!(matches!(result(&mut sim, 1, q), Err(Error::Transport { kind: "peer", .. })));
}

/// A CTS that names no receive (request id 0) is refused: it would leave the send looking as
/// if no CTS had come, so that a second CTS or a truncation FIN could end the send (or send
/// its data again) while its first data still leaves from the buffer.
#[test]
fn a_cts_naming_no_receive_is_refused() {
    let mut sim = Sim::new(2, stream_route);
    let data = pattern(6, 5000);
    let s = send(&mut sim, 0, 1, 1, &data);
    sim.run_actions();
    let rts = sim.wires[1].pop_front().expect("the RTS");
    assert_eq!(rts.hdr.kind, PacketKind::Rts);
    let mut cts = Header::new(PacketKind::Cts);
    (cts.flags, cts.sreq, cts.rreq) = (Header::STREAM, rts.hdr.sreq, 0);
    assert!(matches!(sim.engines[0].handle_message(1, &cts, &[]), Err(Error::Protocol { peer: 1, .. })));
    assert_eq!(sim.engines[0].reqs.get(s).map(|r| r.peer_req), Some(0), "the send took no CTS");
}

/// An RTS answering a ready-to-receive must name a receive that sent one: an ANY_SOURCE
/// receive (which never does) named by a receiver-first RTS is a protocol error, not a read
/// with the sender's key on a channel the receive never chose.
#[test]
fn a_receiver_first_rts_for_a_receive_without_rtr_is_refused() {
    let mut sim = Sim::new(2, one_sided_route);
    let mut out = vec![0u8; 2000];
    let q = recv(&mut sim, 1, Source::Any, TagMatch::Tag(1), &mut out);
    sim.settle();
    let mut rts = Header::new(PacketKind::Rts);
    (rts.tag, rts.seq, rts.len, rts.sreq, rts.rreq) = (1, 0, 2000, 1, q.wire());
    let key = RemoteKey::new(&[0u8; 16]).unwrap();
    assert!(matches!(sim.engines[1].handle_message(0, &rts, key.as_bytes()), Err(Error::Protocol { peer: 0, .. })));
}

/// Sequence ids wrap after 2^32 messages: a message that begins with the seq of one still
/// waiting for its fragments is refused (its fragments could not be told apart), and the
/// fragments of an unexpected message go to it even when an older, whole message that waits
/// unreceived has the same seq.
#[test]
fn wrapped_sequence_ids_keep_fragments_with_their_message() {
    let eager = |seq: u32, tag: u32, len: u64| Header::eager(0, tag, seq, len);
    // An old whole message of seq 7, unreceived; then, 2^32 messages later, seq 7 again in
    // fragments.
    let mut sim = Sim::new(2, one_sided_route);
    let e = &mut sim.engines[1];
    e.peers[0].expected_seq = 7;
    e.handle_message(0, &eager(7, 1, 5), b"whole").unwrap();
    e.peers[0].expected_seq = 7;
    let long = pattern(9, 300);
    e.handle_message(0, &eager(7, 2, 300), &long[..100]).unwrap();
    let mut frag = Header::new(PacketKind::Frag);
    (frag.seq, frag.offset) = (7, 100);
    e.handle_message(0, &frag, &long[100..]).unwrap();
    let (mut a, mut b) = (vec![0u8; 5], vec![0u8; 300]);
    let qa = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut a);
    let qb = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(2), &mut b);
    assert_eq!(result(&mut sim, 1, qa).unwrap().len, 5);
    assert_eq!(result(&mut sim, 1, qb).unwrap().len, 300);
    assert_eq!((&a[..], &b[..]), (&b"whole"[..], &long[..]));
    // A message of seq 3 still short of its fragments, then seq 3 again.
    let mut sim = Sim::new(2, one_sided_route);
    let e = &mut sim.engines[1];
    e.peers[0].expected_seq = 3;
    e.handle_message(0, &eager(3, 1, 1000), &[1; 10]).unwrap();
    e.peers[0].expected_seq = 3;
    assert!(matches!(e.handle_message(0, &eager(3, 2, 10), &[2; 1]), Err(Error::Protocol { peer: 0, .. })));
}

/// A peer lost for breaking the protocol may still run and write through the keys it holds:
/// a receive whose RTR it took ends saying so ([`Finished::peer_may_write`]); not so when the
/// peer exited.
#[test]
fn a_peer_lost_for_garbage_may_still_write_its_keys() {
    for (why, may_write) in
        [(Error::protocol(0, "garbage"), true), (Error::PeerLost { rank: 0, why: "exited".into() }, false)]
    {
        let mut sim = Sim::new(2, one_sided_route);
        let mut out = vec![0u8; 2000];
        let q = recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out);
        sim.settle();
        assert!(sim.engines[1].lends_keys_to_live_peers(), "the RTR gave rank 0 the key");
        sim.engines[1].handle_peer_lost(0, why);
        let done = finished(&mut sim, 1, q);
        assert!(done.result.is_err());
        assert_eq!(done.peer_may_write, may_write);
    }
}

/// Sends `data` from rank 0 to a receive of rank 1 into `out` posted after it, so that the
/// receive pulls the message; runs rank 1's actions but holds back its read. Returns the send,
/// the receive and the read's op.
fn pull_held(sim: &mut Sim, data: &[u8], out: &mut [u8]) -> (ReqId, ReqId, OpId) {
    match late_receive_holding(sim, data, out, |a| matches!(a, Action::Get { .. })) {
        (s, q, Some(Action::Get { op, .. })) => (s, q, op),
        _ => panic!("the receive pulls the message"),
    }
}

/// Sends `data` from rank 0 to a receive of rank 1 into `out` posted after it, and runs rank
/// 1's actions but the one `held` picks, which it gives back with the send and the receive.
fn late_receive_holding(
    sim: &mut Sim,
    data: &[u8],
    out: &mut [u8],
    held: impl Fn(&Action) -> bool,
) -> (ReqId, ReqId, Option<Action>) {
    let s = send(sim, 0, 1, 1, data);
    sim.settle();
    let q = recv(sim, 1, Source::Rank(0), TagMatch::Tag(1), out);
    let mut kept = None;
    while let Some(a) = sim.engines[1].poll_action() {
        if held(&a) {
            kept = Some(a);
        } else {
            sim.execute(1, a);
        }
    }
    (s, q, kept)
}

/// A receive that fails (its peer lost) while its own read is in flight ends only when the
/// read completes: an adapter may still place an RDMA read into the buffer until then.
#[test]
fn a_failed_receive_waits_for_its_read_in_flight() {
    let mut sim = Sim::new(2, one_sided_route);
    let data = pattern(8, 2000);
    let mut out = vec![0u8; data.len()];
    let (_s, q, read) = pull_held(&mut sim, &data, &mut out);
    sim.engines[1].handle_peer_lost(0, Error::PeerLost { rank: 0, why: "killed".into() });
    assert!(!sim.engines[1].is_done(q), "failed with its read in flight");
    assert!(sim.engines[1].take_result(q).is_none());
    assert_eq!(sim.engines[1].running_requests(), 1);
    sim.engines[1].handle_op(read, OpOutcome::Done(Err(Error::Transport { kind: "sim", what: "flushed".into() })));
    assert!(matches!(result(&mut sim, 1, q), Err(Error::PeerLost { rank: 0, .. })));
}

/// A receive discarded while its read runs still sends its FIN when the read completes: the
/// sender waits for it to release its buffer (before, the send waited until the peer ended).
/// Its buffer is named as one a channel may still write (its owner must not reuse it).
#[test]
fn a_receive_discarded_during_its_read_still_frees_the_sender() {
    let mut sim = Sim::new(2, one_sided_route);
    let data = pattern(9, 2000);
    let mut out = vec![0u8; data.len()];
    let (s, q, read) = pull_held(&mut sim, &data, &mut out);
    assert!(sim.engines[1].discard(q), "its read may still write the buffer");
    sim.engines[1].handle_op(read, OpOutcome::Done(Ok(())));
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok(), "the send ended at the FIN");
    assert_eq!(sim.engines[1].running_requests(), 0, "the discarded receive ended");
}

/// A request whose exposure fails goes on by a protocol that needs no key of its own (before,
/// it failed: its peer waited for ever for its RTS, CTS or FIN, and a send's lost sequence id
/// made the receiver refuse the sender's next message): a sender first streams, a receiver
/// first waits without offering its buffer, a split sender writes all of it, a split receiver
/// reads all of it.
#[test]
fn a_refused_exposure_falls_back_to_a_protocol_without_it() {
    for failing in [vec![0], vec![1], vec![0, 1]] {
        for len in [1024, 4095, 8192, 100_003] {
            for recv_first in [false, true] {
                let sim = Sim { failing_exposures: failing.clone(), ..Sim::new(2, one_sided_route) };
                transfer_in(sim, len, recv_first);
            }
        }
        // The next message of the pair still arrives in order.
        let mut sim = Sim { failing_exposures: failing.clone(), ..Sim::new(2, one_sided_route) };
        let (a, b) = (pattern(1, 5000), pattern(2, 300));
        let (mut out_a, mut out_b) = (vec![0u8; 5000], vec![0u8; 300]);
        let s = [send(&mut sim, 0, 1, 1, &a), send(&mut sim, 0, 1, 2, &b)];
        sim.settle();
        let q = [
            recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(1), &mut out_a),
            recv(&mut sim, 1, Source::Rank(0), TagMatch::Tag(2), &mut out_b),
        ];
        sim.settle();
        for (rank, id) in [(0, s[0]), (0, s[1]), (1, q[0]), (1, q[1])] {
            assert!(result(&mut sim, rank, id).is_ok(), "failing {failing:?}");
        }
        assert_eq!((out_a, out_b), (a, b));
    }
}

/// A split receive discarded while its exposure is on its way ends its sender's send with a
/// truncation FIN once the exposure lands (before, the sender waited until the peer ended).
#[test]
fn a_split_receive_discarded_before_its_cts_frees_the_sender() {
    let mut sim = Sim::new(2, || route(100, &[(usize::MAX, Protocol::RndvSplit)]));
    let data = pattern(11, 100_000);
    let mut out = vec![0u8; data.len()];
    // Sender first, the receive posted late: its exposure for the sender's put (the CTS
    // follows it) is held back.
    let (s, q, expose) = late_receive_holding(&mut sim, &data, &mut out, |a| matches!(a, Action::Register { .. }));
    sim.engines[1].discard(q);
    sim.execute(1, expose.expect("the split receive exposes its buffer for the sender's put"));
    sim.settle();
    assert!(result(&mut sim, 0, s).is_ok(), "the send ended at the truncation FIN");
    assert!(out.iter().all(|&b| b == 0), "nothing was written into the discarded receive");
    assert!(sim.exposed[1].is_empty(), "the late exposure was ended");
}
