//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.
//!
//! [`EngineHarness`] is one rank of a job of three whose two peers the fuzzer plays: it posts
//! sends and receives into buffers it owns, feeds packets to the engine as a channel would
//! ([`Engine::handle_message`]), and plays the channels for the actions the engine asks for,
//! checking that every region an action names lies inside a buffer of a live request's.
#![doc(hidden)]

use crate::engine::{
    Action, Engine, OpOutcome, Outgoing, Payload, Posted, RecvPath, ReqId, Setting, Source, SpaceId, TagMatch,
};
use crate::policy::{ChannelId, PeerRoute, Protocol, RouteEntry};
use crate::{Error, Header, Lifetime, MemHandle, Rank, Region, RegionMut, RemoteKey};

/// The active-message channel of the harness's routes.
const AM: ChannelId = ChannelId(0);
/// The one-sided channel of the harness's routes.
const RMA: ChannelId = ChannelId(1);
/// Ranks in the harness's job: this one (0) and two peers.
pub const JOB_SIZE: u32 = 3;
/// Most requests the harness keeps posted.
const MAX_REQUESTS: usize = 64;

/// One rank's engine driven by the fuzzer; see the module documentation.
pub struct EngineHarness {
    // Declared first, so dropped before the buffers its requests point into.
    engine: Engine,
    /// The memory of every request posted, kept for the harness's life.
    buffers: Vec<Box<[u8]>>,
    /// Requests posted and not yet finished.
    live: Vec<ReqId>,
    /// Keys handed out for exposures so far.
    exposures: u64,
}

impl Default for EngineHarness {
    fn default() -> Self {
        Self::new()
    }
}

fn route(protocols: &[(usize, Protocol)]) -> PeerRoute {
    let entries = protocols
        .iter()
        .map(|&(upto, protocol)| RouteEntry {
            upto,
            protocol,
            channel: if protocol.is_one_sided() { RMA } else { AM },
            reason: String::new(),
        })
        .collect();
    PeerRoute { am: AM, frag: 100, entries, stream_eager: None, placement: None, mapped: None, as_written: false }
}

impl EngineHarness {
    /// Rank 0 of three; rank 1 is reached eagerly below 1 KiB, by get below 4 KiB and split
    /// above, rank 2 eagerly up to 1 KiB and by streaming above (fragments of 100 bytes).
    pub fn new() -> Self {
        let mut engine = Engine::new(0, JOB_SIZE, crate::adapt::Tuning::default());
        let one_sided = route(&[(1023, Protocol::Eager), (4095, Protocol::RndvGet), (usize::MAX, Protocol::RndvSplit)]);
        let stream = route(&[(1024, Protocol::Eager), (usize::MAX, Protocol::RndvStream)]);
        engine.set(Setting::Route(0, Ok(one_sided.clone())));
        engine.set(Setting::Route(1, Ok(one_sided)));
        engine.set(Setting::Route(2, Ok(stream)));
        EngineHarness { engine, buffers: Vec::new(), live: Vec::new(), exposures: 0 }
    }

    /// The engine, for reading its state.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn buffer(&mut self, len: usize) -> Option<*mut u8> {
        if self.live.len() >= MAX_REQUESTS {
            return None;
        }
        self.buffers.push(vec![0u8; len].into_boxed_slice());
        self.buffers.last_mut().map(|b| b.as_mut_ptr())
    }

    /// Posts a receive of `len` bytes; `false` when the engine refused it (or too many wait).
    pub fn post_recv(&mut self, src: Source, tag: TagMatch, ctx: u16, len: usize) -> bool {
        let Some(ptr) = self.buffer(len) else { return false };
        // SAFETY: the buffer is owned by the harness and outlives the engine.
        match unsafe { self.engine.post_recv(src, tag, SpaceId(ctx), RegionMut { ptr, len }, RecvPath::Request) } {
            Ok(Posted::Request(id)) => {
                self.live.push(id);
                true
            }
            _ => false,
        }
    }

    /// Posts a send of `len` bytes; `false` when the engine refused it (or too many wait).
    pub fn post_send(&mut self, to: Rank, tag: u32, ctx: u16, len: usize) -> bool {
        let Some(ptr) = self.buffer(len) else { return false };
        // SAFETY: the buffer is owned by the harness, outlives the engine and is not modified.
        match unsafe { self.engine.post_send(to, Outgoing::Message { tag, space: SpaceId(ctx) }, Region { ptr, len }) }
        {
            Ok(id) => {
                self.live.push(id);
                true
            }
            Err(_) => false,
        }
    }

    /// Asks to cancel the `which`-th live receive (counted modulo their number).
    pub fn cancel(&mut self, which: usize) {
        if !self.live.is_empty() {
            let id = self.live[which % self.live.len()];
            let _ = self.engine.cancel_recv(id);
        }
    }

    /// A packet of `from` arrives as its channel would deliver it: the header decoded from
    /// `wire` (a packet that does not decode goes no further, as on a channel), then handed to
    /// the engine; a packet the engine refuses makes the peer lost, as a channel's caller does.
    pub fn packet(&mut self, from: Rank, wire: &[u8; Header::WIRE_LEN], payload: &[u8]) {
        let Ok(hdr) = Header::decode(from, wire) else { return };
        if let Err(e) = self.engine.handle_message(from, &hdr, payload) {
            // A refused packet is the sender's protocol error (handle_message's contract).
            assert!(matches!(e, Error::Protocol { peer, .. } if peer == from), "{e:?}");
            self.engine.handle_peer_lost(from, e);
        }
    }

    /// `peer` is lost (its channel failed).
    pub fn lose(&mut self, peer: Rank) {
        self.engine.handle_peer_lost(peer, Error::PeerLost { rank: peer, why: "fuzzed".into() });
    }

    fn inside(&self, ptr: *const u8, len: usize, what: &Action) {
        let ok = self.buffers.iter().any(|b| {
            let (start, end) = (b.as_ptr() as usize, b.as_ptr() as usize + b.len());
            (ptr as usize) >= start && (ptr as usize).checked_add(len).is_some_and(|e| e <= end)
        });
        assert!(ok || len == 0, "{what:?} names memory outside every request's buffer");
    }

    /// Plays the channels for every action waiting: sends leave, exposures succeed (or fail
    /// when `fail` says so), copies complete (or fail likewise). Each action's header must
    /// decode back to itself and its regions must lie in a request's buffer.
    pub fn drain(&mut self, mut fail: impl FnMut() -> bool) {
        let mut budget = 10_000;
        while let Some(action) = self.engine.poll_action() {
            budget -= 1;
            assert!(budget > 0, "the engine keeps asking for actions");
            match &action {
                Action::Send { hdr, payload, op, .. } => {
                    let mut wire = [0u8; Header::WIRE_LEN];
                    hdr.encode(&mut wire);
                    assert_eq!(Header::parse(&wire).as_ref(), Ok(hdr), "a header the engine sent does not decode");
                    if let Payload::User(r) = payload {
                        self.inside(r.ptr, r.len, &action);
                    }
                    if let Some(op) = *op {
                        self.engine.handle_op(op, OpOutcome::Sent);
                    }
                }
                Action::Register { region, op, .. } => {
                    self.inside(region.ptr, region.len, &action);
                    let op = *op;
                    let key = if fail() {
                        Err(Error::Transport { kind: "fuzz", what: "exposure refused".into() })
                    } else {
                        self.exposures += 1;
                        let key = RemoteKey::new(&self.exposures.to_le_bytes()).unwrap_or_else(|| unreachable!());
                        Ok(MemHandle::new(key, &Lifetime::Transfer))
                    };
                    self.engine.handle_op(op, OpOutcome::Registered(key));
                }
                Action::Deregister { .. } => {}
                Action::Get { into, op, .. } => {
                    self.inside(into.ptr, into.len, &action);
                    let op = *op;
                    let r =
                        if fail() { Err(Error::Transport { kind: "fuzz", what: "get failed".into() }) } else { Ok(()) };
                    self.engine.handle_op(op, OpOutcome::Done(r));
                }
                Action::Put { from, op, .. } => {
                    self.inside(from.ptr, from.len, &action);
                    let op = *op;
                    let r =
                        if fail() { Err(Error::Transport { kind: "fuzz", what: "put failed".into() }) } else { Ok(()) };
                    self.engine.handle_op(op, OpOutcome::Done(r));
                }
            }
        }
    }

    /// Takes the results of finished requests.
    pub fn reap(&mut self) {
        let engine = &mut self.engine;
        self.live.retain(|&id| engine.take_result(id).is_none());
    }
}
