//! The sans-IO protocol engine.
//!
//! The engine matches messages to receives and runs the eager and rendezvous protocols. It does
//! no I/O and reads no clock: the driver (the `polyrail` facade) feeds it with
//! - `post_send` / `post_recv` (mutators),
//! - `handle_message` (through [`crate::Sink`]), `handle_op` (what became of an action's
//!   channel work), `handle_observation` (what a channel saw of a peer), `handle_peer_lost`
//!   (events),
//!
//! and reads it with `poll_action` (work to do on a channel) and `take_result` (finished
//! requests). Call `poll_action` until it returns `None` after every mutator or event.
//!
//! Protocols (DCFA-MPI and Chai):
//! - eager: `Eager` (+ `Frag`s) on the peer's active-message channel; the send ends when the
//!   packets left;
//! - sender-first rendezvous: `Rts` with the sender's key → the receiver reads (`get`) → `Fin`;
//!   for the split protocol the receiver also sends `Cts` with its key and the split point, the
//!   sender writes the back (`put`) and sends `Fin`;
//! - receiver-first rendezvous: `Rtr` with the receive buffer's key → the sender's matching send
//!   writes (`put`) → `Fin` (with an `Rts` in front that orders the message and, for the split
//!   protocol, lets the receiver pull the front); receives posted behind others for the same
//!   messages send one too, naming their place, while such hints get used;
//! - simultaneous: an `Rtr` that crossed the sender's `Rts` is dropped (RTS wins);
//! - cancelling a receive whose `Rtr` went out: `Withdraw` → the sender drops every `Rtr` of
//!   that receiver it holds and answers each with `Withdrawn` (a send that took the `Rtr` first
//!   finishes instead, and the receive with it; see [`Engine::cancel_recv`]);
//! - mispredictions: an eager message meeting a receive that sent an `Rtr` is copied as usual
//!   (the sender drops the stale `Rtr`); an `Rts` too large for its receive is a truncation;
//! - no one-sided channel: `Rts` → `Cts` → `Data` packets through active messages.
//!
//! Every per-pair message carries a sequence id; packets from a peer must arrive in order on
//! its one active-message channel, and anything out of order is a protocol error.

mod incoming;
mod requests;
mod spare;
mod split_share;
mod types;
mod views;

pub use types::{Action, OpOutcome, Payload, ReqId, Source, SpaceId, Status, TagMatch};
pub use views::{Activity, PeerView, Probe, ReqPhase};

use crate::adapt::{Adapter, PeerAdapters, Seen, SendFacts, Tuning};
use crate::config::SplitShare;
use crate::error::{Error, Rank, Result};
use crate::header::{Envelope, Header, PacketKind};
use crate::observe::{Observation, Placement};
use crate::policy::{ChannelId, ChannelSet, PeerRoute, Protocol};
use crate::transport::{MemHandle, OpId, PeerAccess, Region, RegionMut, RemoteKey, Sink};
use requests::{Dir, ExposeFor, Matching, OwnCopy, Req, ReqKind, Requests};
use spare::SpareBuffers;
use split_share::{SplitTuner, Trial};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use types::{op_id, split_op, OpKind};

/// How many past sends per peer are remembered to tell a stale `Rtr`.
const SEND_HISTORY: usize = 64;
/// Receive-first hints are sent for at most this many receives waiting for the same messages
/// from one peer, and a sender keeps at most this many hints per peer (more are dropped: a hint
/// is only an offer, the send then goes sender-first).
const MAX_RTR_PLACE: u32 = 1024;
/// Largest eager message accepted from a peer (a bigger claimed length is a protocol error).
const MAX_EAGER_LEN: u64 = crate::config::MAX_EAGER_MESSAGE as u64;

/// What the measured placement of `p`'s core says of a message of `len` bytes
/// ([`PlacementAdapter::says_eager`](crate::adapt::PlacementAdapter::says_eager)).
#[inline]
fn placement_says_eager(p: &Peer, len: usize) -> Option<bool> {
    p.adapt.placement.says_eager(p.route.as_ref()?, len)
}

/// Why a peer can no longer take part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gone {
    /// Finalized and exited.
    Finished,
    /// Crashed, killed or unreachable.
    Lost,
    /// Sent bytes that break the protocol: it may still run, and write through the keys it
    /// holds (a cma exposure cannot be revoked).
    Faulty,
}

/// A receive-first hint from a peer: its receive buffer, waiting for a matching send.
#[derive(Clone, Copy, Debug)]
struct Rtr {
    /// How many more matching sends go to receives posted before this one.
    ahead: u32,
    tag: TagMatch,
    ctx: u16,
    rreq: u32,
    cap: usize,
    key: RemoteKey,
}

/// A blocking receive waiting without a request ([`Engine::inline_recv`]).
struct Parked {
    from: Rank,
    tag: TagMatch,
    ctx: u16,
    buf: RegionMut,
    /// How it ended (`Done` or `Promoted`), once it did.
    end: Option<Unparked>,
}

/// How a parked receive ended ([`Engine::unpark`]).
#[derive(Debug)]
pub enum Unparked {
    /// It took its message (or failed) without a request.
    Done(Result<Status>),
    /// It became request `ReqId`, which the caller now waits for as for any receive.
    Promoted(ReqId),
    /// Nothing happened yet; it is withdrawn.
    Withdrawn,
}

/// What [`Engine::inline_recv`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum InlineRecv {
    /// The message was here: it is in the buffer.
    Received(Status),
    /// The receive waits parked: progress until [`Engine::parked_settled`], then
    /// [`Engine::unpark`].
    Parked,
    /// Nothing was done: post the receive with [`Engine::post_recv`].
    Post,
}

/// What [`Engine::cancel_recv`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelRecv {
    /// The receive was withdrawn and forgotten.
    Cancelled,
    /// Nothing: a send, a matched or finished receive, or an unknown request.
    NotCancelled,
    /// Withdrawing the receive needs its sender's word (it holds the receive's key, or an RTR
    /// whose place counts the receive): a `Withdraw` went to it, and
    /// [`Engine::phase`] tells how it ends (it stays [`ReqPhase::Posted`] until then).
    Asked,
}

/// A message that arrived before its receive was posted.
#[derive(Debug)]
struct Unexpected {
    tag: u32,
    ctx: u16,
    seq: u32,
    len: usize,
    order: u64,
    body: UxBody,
}

#[derive(Debug)]
enum UxBody {
    /// Eager data; `received` bytes of `len` arrived so far.
    Eager { data: Vec<u8>, received: usize },
    /// A rendezvous announcement.
    Rts { hdr: Header, key: Option<RemoteKey> },
}

/// Where the later fragments of an eager message go.
#[derive(Debug, Clone, Copy)]
enum FragTarget {
    Req(ReqId),
    Unexpected,
    Discard,
}

#[derive(Debug)]
struct Incoming {
    seq: u32,
    len: usize,
    received: usize,
    target: FragTarget,
}

/// The engine's state for one peer.
struct Peer {
    route: Option<PeerRoute>,
    /// Why no channel reaches the peer ([`Engine::set_route`]).
    unreachable: Option<String>,
    next_send_seq: u32,
    expected_seq: u32,
    /// Receives naming this peer as source, in post order.
    posted: VecDeque<ReqId>,
    unexpected: VecDeque<Unexpected>,
    /// Eager messages still receiving fragments.
    incoming: Vec<Incoming>,
    /// (tag, ctx) of the last sends, by `seq % SEND_HISTORY`.
    history: [(u32, u16); SEND_HISTORY],
    rtrs: VecDeque<Rtr>,
    /// Our `Withdraw`s to this peer not answered yet: no RTR goes to it meanwhile (its place
    /// among the posted receives would count the receive being withdrawn).
    withdrawals: u32,
    gone: Option<Gone>,
    /// Why it was lost (not for a finish), for the errors of later calls that need it.
    lost_why: Option<Box<str>>,
    /// The run-time adaptations' state for this peer.
    adapt: PeerAdapters,
    /// Whether receives posted behind others for the same messages send an RTR too. They pay
    /// only when receives are posted well before the sends (a window's hints usually arrive
    /// after the sender posted its window, and each costs an exposure and a packet): on after
    /// the hint of a first receive was used, off after one behind others was not.
    window_rtrs: bool,
    /// How many messages had come from this peer when the last send to it was posted.
    last_send_at: Option<u32>,
    /// The search for the receiver's share of split messages with this peer (made at the
    /// first one).
    split: Option<Box<SplitTuner>>,
}

impl Peer {
    fn new(tuning: &Tuning) -> Self {
        Peer {
            route: None,
            unreachable: None,
            next_send_seq: 0,
            expected_seq: 0,
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            incoming: Vec::new(),
            history: [(0, 0); SEND_HISTORY],
            rtrs: VecDeque::new(),
            withdrawals: 0,
            gone: None,
            lost_why: None,
            adapt: PeerAdapters::new(tuning),
            window_rtrs: false,
            last_send_at: None,
            split: None,
        }
    }
}

/// The protocol engine of one process. See the module documentation.
pub struct Engine {
    me: Rank,
    peers: Vec<Peer>,
    reqs: Requests,
    actions: VecDeque<Action>,
    /// ANY_SOURCE receives, in post order.
    wild: VecDeque<ReqId>,
    /// The ranks that may send in a context, where not every rank may
    /// ([`Engine::set_space_members`]).
    members_of: HashMap<u16, Box<[Rank]>>,
    /// Peers that finished or were lost.
    gone_peers: u32,
    post_counter: u64,
    arrival_counter: u64,
    /// The settings of the run-time adaptations.
    tuning: Tuning,
    /// Cache of [`Engine::awaited_channels`]; `None` after anything that may change it.
    awaited: Option<ChannelSet>,
    /// Receives that failed after their buffer's key went to a peer that may still run (alive,
    /// or lost for breaking the protocol), or were discarded with their own read still in
    /// flight: see [`Engine::take_peer_may_write`].
    peer_may_write: Vec<ReqId>,
    /// Discarded requests kept until their withdrawal ends (posted, writing nothing) or their
    /// exposure lands and is ended ([`Engine::discard`]); freed after that.
    zombies: Vec<ReqId>,
    /// Smallest message a route's placement rule decides (see [`Engine::wants_placement`]);
    /// `usize::MAX` when no route has one.
    placement_from: usize,
    /// Registered memory that peers map, as address ranges sorted by start (see
    /// [`Engine::set_mapped_memory`]).
    mapped: Vec<Range<usize>>,
    /// The blocking receive parked by [`Engine::inline_recv`], if any.
    parked: Option<Parked>,
    /// Buffers of unexpected eager messages already taken, for the next ones.
    spare: SpareBuffers,
    /// The split message whose time the driver measures for its peer's search, if any, and
    /// the latest split message (a message runs alone when that one has ended).
    split_probe: Option<SplitProbe>,
    last_split: Option<ReqId>,
}

/// A split message timed for [`SplitTuner`]: the driver starts its clock before the message's
/// first action runs and reads it once the request has ended ([`Engine::poll_split_timing`]).
#[derive(Debug)]
struct SplitProbe {
    id: ReqId,
    peer: Rank,
    trial: Trial,
    started: bool,
    /// Another split message started before this one ended, or the driver saw the process
    /// away from the library meanwhile ([`Engine::handle_split_time`]): its time says nothing of
    /// its share.
    disturbed: bool,
}

/// What the driver is to do with its clock for the timed split message
/// ([`Engine::poll_split_timing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitTiming {
    /// Its share was chosen and none of its actions ran yet: start the clock.
    Start,
    /// It runs: keep the clock going (and see whether the process was away meanwhile).
    Running,
    /// It has ended: report the time since the start with [`Engine::handle_split_time`].
    End,
}

/// What the driver's clock said of the timed split message ([`Engine::handle_split_time`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitTime {
    /// The process was away from the library meanwhile: the time says nothing of the share.
    Disturbed,
    /// Nanoseconds from the start to the end.
    Took(u64),
}

/// Whether `buf` lies inside one of `ranges`, which are sorted by start and disjoint (distinct
/// live mappings): only the last range starting at or before `buf` can hold it.
fn in_ranges(ranges: &[Range<usize>], buf: Region) -> bool {
    let start = buf.ptr as usize;
    let i = ranges.partition_point(|r| r.start <= start);
    i > 0 && start.saturating_add(buf.len) <= ranges[i - 1].end
}

impl Engine {
    /// An engine for rank `me` of a job of `size` ranks. Routes are set per peer with
    /// [`Engine::set_route`]; a peer without a route is unreachable.
    pub fn new(me: Rank, size: u32, tuning: Tuning) -> Self {
        Engine {
            me,
            peers: (0..size).map(|_| Peer::new(&tuning)).collect(),
            reqs: Requests::default(),
            actions: VecDeque::new(),
            wild: VecDeque::new(),
            members_of: HashMap::new(),
            gone_peers: 0,
            post_counter: 0,
            arrival_counter: 0,
            tuning,
            awaited: None,
            peer_may_write: Vec::new(),
            zombies: Vec::new(),
            placement_from: usize::MAX,
            mapped: Vec::new(),
            parked: None,
            spare: SpareBuffers::default(),
            split_probe: None,
            last_split: None,
        }
    }

    /// Tells the engine that `region` is registered memory with a memory file, which peers'
    /// channels map (`mapped`), or no longer: sends from it follow the routes'
    /// [`crate::policy::MappedRule`].
    pub fn set_mapped_memory(&mut self, region: Region, mapped: bool) {
        let start = region.ptr as usize;
        if mapped {
            let at = self.mapped.partition_point(|r| r.start < start);
            self.mapped.insert(at, start..start + region.len);
        } else {
            self.mapped.retain(|r| *r != (start..start + region.len));
        }
    }

    /// What to do with the clock of the timed split message now; `None` when no message is
    /// timed (the driver then reads no clock). Call it before and after executing actions.
    /// (Inline: the driver asks on every drain.)
    #[inline]
    pub fn poll_split_timing(&mut self) -> Option<SplitTiming> {
        self.split_probe.as_ref()?;
        Some(self.split_timing())
    }

    /// [`Engine::poll_split_timing`] while a message is timed.
    #[cold]
    fn split_timing(&mut self) -> SplitTiming {
        let probe = self.split_probe.as_mut().expect("checked by the caller");
        if !probe.started {
            probe.started = true;
            return SplitTiming::Start;
        }
        let ended = self.reqs.get(probe.id).is_none_or(|r| r.result.is_some());
        if ended {
            SplitTiming::End
        } else {
            SplitTiming::Running
        }
    }

    /// What the driver's clock says of the timed split message: [`SplitTime::Disturbed`], the
    /// process spent a while outside the library (e.g. computing between `isend` and `wait`),
    /// so its time will not say what its share costs and it is no trial; or
    /// [`SplitTime::Took`], its time once [`SplitTiming::End`] came, which counts for its peer's
    /// search when it ended well and ran alone.
    pub fn handle_split_time(&mut self, time: SplitTime) {
        let ns = match time {
            SplitTime::Disturbed => {
                if let Some(probe) = self.split_probe.as_mut() {
                    probe.disturbed = true;
                }
                return;
            }
            SplitTime::Took(ns) => ns,
        };
        let Some(probe) = self.split_probe.take() else { return };
        let ok = self.reqs.get(probe.id).is_some_and(|r| matches!(r.result, Some(Ok(_))));
        if ok && !probe.disturbed {
            let tuner = self.peers.get_mut(probe.peer as usize).and_then(|p| p.split.as_mut());
            if let Some(found) = tuner.and_then(|t| t.record(probe.trial, ns)) {
                let [half, three_eighths, quarter] = found.fastest_ns;
                tracing::debug!(
                    "rank {}: split messages of {}-{} with rank {}: the receiver copies {}/8 \
                     (fastest message: halves {half} ns, 3/8 {three_eighths} ns, 1/4 {quarter} ns)",
                    self.me,
                    crate::format_size(found.from),
                    crate::format_size(found.from * 2),
                    probe.peer,
                    found.eighths
                );
            }
        }
    }

    /// Where request `id`'s `len`-byte split message with `peer` divides: the receiver copies
    /// the bytes before the returned offset. With [`SplitShare::Auto`] a message that runs
    /// alone may be a trial of the peer's search, timed by the driver.
    fn split_point(&mut self, id: ReqId, peer: Rank, len: usize) -> usize {
        let split = match self.tuning.split_share {
            SplitShare::Percent(p) => split_share::percent_of(len, p),
            SplitShare::Auto => {
                let running = self.last_split.and_then(|r| self.reqs.get(r)).is_some_and(|r| r.result.is_none());
                if let Some(probe) = self.split_probe.as_mut().filter(|_| running) {
                    probe.disturbed = true;
                }
                let tuner = self.peers[peer as usize].split.get_or_insert_with(Box::default);
                let (split, trial) = tuner.choose(len, !running && self.split_probe.is_none());
                if let Some(trial) = trial {
                    self.split_probe = Some(SplitProbe { id, peer, trial, started: false, disturbed: false });
                }
                split
            }
        };
        self.last_split = Some(id);
        split
    }

    /// Takes in what a channel observed of `peer` ([`crate::Transport::observe`]): its
    /// adapters ([`crate::adapt`]) may send later messages to it otherwise.
    #[inline]
    pub fn handle_observation(&mut self, peer: Rank, seen: Observation) {
        let Some(p) = self.peers.get_mut(peer as usize) else { return };
        if let Observation::Unread(_) = seen {
            // Before every receive: only skew feedback takes it, and nothing is logged.
            return p.adapt.skew.observe(Seen::Channel(seen), None);
        }
        self.observe_and_log(peer, seen);
    }

    /// [`Engine::handle_observation`] of the rarer observations, with a line in the log when
    /// a verdict changes.
    #[cold]
    #[inline(never)]
    fn observe_and_log(&mut self, peer: Rank, seen: Observation) {
        let me = self.me;
        let Some(p) = self.peers.get_mut(peer as usize) else { return };
        let (placement, slow) = (p.adapt.placement.placement(), p.adapt.placement.copies_slow());
        p.adapt.observe(Seen::Channel(seen), p.route.as_ref());
        let now = p.adapt.placement.placement();
        if let (Some(placement), true) = (now, now != placement) {
            tracing::debug!(
                "rank {me}: rank {peer}'s core measured {}{}",
                match placement {
                    Placement::Near => "near: medium messages go eagerly",
                    Placement::Middle => "neither near nor apart: the route table decides",
                    Placement::Apart => "apart: medium messages go by single copy",
                },
                seen.line_transfer().map(|ns| format!(" ({ns} ns for a cache line)")).unwrap_or_default()
            );
        }
        if p.adapt.placement.copies_slow() != slow {
            tracing::debug!(
                "rank {me}: copies to rank {peer} {}",
                if slow { "run at their usual rate" } else { "run slowly: large medium messages go by single copy" }
            );
        }
    }

    /// The channel to time a line transfer from `peer` on before a send of `len` bytes to it,
    /// or a receive of at most `len` bytes from it (report it with
    /// [`Engine::handle_observation`]): see [`PlacementAdapter::wants_sample`](crate::adapt::PlacementAdapter::wants_sample).
    /// Inline: a message smaller than any size a route's placement rule decides costs one
    /// comparison.
    #[inline]
    pub fn wants_placement(&mut self, peer: Rank, len: usize) -> Option<ChannelId> {
        if len < self.placement_from {
            return None;
        }
        self.placement_sample(peer, len)
    }

    /// [`Engine::wants_placement`] for a size a placement rule may decide.
    #[inline(never)]
    fn placement_sample(&mut self, peer: Rank, len: usize) -> Option<ChannelId> {
        let p = self.peers.get_mut(peer as usize)?;
        let route = p.route.as_ref()?;
        p.adapt.placement.wants_sample(route, len).then_some(route.am)
    }

    /// What the engine knows of job rank `peer`: its route, adapters and whether it is gone;
    /// an error naming `peer` if it is no rank of the job.
    pub fn peer(&self, peer: Rank) -> Result<PeerView<'_>> {
        if (peer as usize) < self.peers.len() {
            return Ok(PeerView { engine: self, rank: peer });
        }
        Err(Error::InvalidArgument(format!("rank {peer} is out of range (job size {})", self.peers.len())))
    }

    /// This process's rank and the number of ranks of the job.
    pub fn rank_and_size(&self) -> (Rank, u32) {
        (self.me, self.peers.len() as u32)
    }

    /// Sets the route table to `peer`, or records that no channel reaches it and why (`Err`:
    /// each channel's reason): then sends to it and receives naming it fail at once with
    /// [`Error::Unreachable`].
    pub fn set_route(&mut self, peer: Rank, route: std::result::Result<PeerRoute, String>) {
        self.touched();
        let Some(p) = self.peers.get_mut(peer as usize) else { return };
        let route = match route {
            Ok(route) => route,
            Err(why) => {
                (p.route, p.unreachable) = (None, Some(why));
                return;
            }
        };
        if let Some(rule) = &route.placement {
            // Near decides single-copy sizes (from the threshold); apart, eager sizes from its
            // size or single-copy ones below it.
            let threshold = route.rndv_threshold().unwrap_or(usize::MAX);
            let near_from = rule.near_upto.map_or(usize::MAX, |_| threshold);
            let from = near_from.min(rule.apart_from.map_or(usize::MAX, |f| f.min(threshold)));
            self.placement_from = self.placement_from.min(from);
        }
        p.adapt.observe(Seen::Route, Some(&route));
        (p.route, p.unreachable) = (Some(route), None);
    }

    /// The route table to `peer`, if any.
    pub(super) fn route(&self, peer: Rank) -> Option<&PeerRoute> {
        self.peers.get(peer as usize)?.route.as_ref()
    }

    // ---- getters ------------------------------------------------------------------------

    /// Where request `req` stands: running, posted (a receive no message matched yet), done
    /// (its result waits for [`Engine::take_result`]; also for an unknown or stale id) or
    /// withdrawn by [`Engine::cancel_recv`]. A receive that failed while its own read into the
    /// buffer was in flight (an RDMA read the adapter may still place) is done when that read
    /// completes.
    #[inline]
    pub fn phase(&self, req: ReqId) -> ReqPhase {
        let Some(r) = self.reqs.get(req) else { return ReqPhase::Done };
        match &r.result {
            Some(_) if r.kind == ReqKind::Recv(Matching::Withdrawn) => ReqPhase::Withdrawn,
            Some(_) if !r.reading() => ReqPhase::Done,
            None if r.unmatched() => ReqPhase::Posted,
            _ => ReqPhase::Running,
        }
    }

    /// Takes the result of a finished request and forgets it; `None` while it runs.
    #[inline]
    pub fn take_result(&mut self, req: ReqId) -> Option<Result<Status>> {
        Some(self.reqs.take_result(req)?.map_err(|e| *e))
    }

    /// Whether a peer may still write into the buffer of `req`, a request that ended (its
    /// result taken or discarded): a receive that failed, or was discarded, while a peer that
    /// is still alive (or was lost for breaking the protocol, and may still run) held its
    /// buffer's key (an RTR no matching send consumed yet, or a CTS; for a discarded one,
    /// until the peer answers its withdrawal). That peer may yet
    /// write there (a cma exposure cannot be revoked), so the memory must never be reused.
    /// Likewise a receive discarded while its own read into the buffer was in flight (a wait
    /// that gave up): the channel may still place the data there. Answers once per request.
    #[inline]
    pub fn take_peer_may_write(&mut self, req: ReqId) -> bool {
        if self.peer_may_write.is_empty() {
            return false;
        }
        let before = self.peer_may_write.len();
        self.peer_may_write.retain(|&r| r != req);
        self.peer_may_write.len() != before
    }

    /// What a probe for `(src, tag, space)` finds (`MPI_Iprobe`): the status of the first
    /// unexpected message matching, without receiving it, or, when none does, what the
    /// probe's senders' losses say ([`Probe::lost`], [`Probe::never`]).
    pub fn probe(&self, src: Source, tag: TagMatch, space: SpaceId) -> Probe<'_> {
        let found = self.find_unexpected(src, tag, space.0).map(|(from, i)| {
            let u = &self.peers[from as usize].unexpected[i];
            Status { source: from, tag: u.tag, len: u.len }
        });
        Probe { engine: self, src, space, found }
    }

    /// Why `peer` can no longer be used, if it cannot.
    pub(super) fn peer_error(&self, peer: Rank) -> Option<Error> {
        let gone = self.peers.get(peer as usize)?.gone?;
        Some(self.gone_error(peer, gone))
    }

    /// Counts of the requests not yet forgotten and what may still write their buffers (one
    /// pass over the requests: for waits and finalize, not for every message).
    pub fn activity(&self) -> Activity {
        let mut a = Activity { requests: self.reqs.live(), ..Activity::default() };
        for r in self.reqs.ids().filter_map(|id| self.reqs.get(id)) {
            a.running += usize::from(r.result.is_none() || r.reading());
            a.lends_keys_to_live_peers |= r.result.is_none() && self.lent_to_live_peer(r);
            a.copies_in_flight |= r.reading();
        }
        a
    }

    fn peer_alive(&self, peer: Rank) -> bool {
        self.peers.get(peer as usize).is_some_and(|p| p.gone.is_none())
    }

    /// Whether `peer` may still write through keys it holds: alive, or lost for breaking the
    /// protocol (it may still run).
    fn may_still_write(&self, peer: Rank) -> bool {
        self.peers.get(peer as usize).is_some_and(|p| matches!(p.gone, None | Some(Gone::Faulty)))
    }

    /// Whether `r` gave its buffer's key to a peer that is still alive (which may yet write
    /// there).
    fn lent_to_live_peer(&self, r: &Req) -> bool {
        r.lends_key() && self.peer_alive(r.peer)
    }

    /// Channels on which something this process waits for can arrive: the active-message
    /// channel of every peer a running request needs (a match, a CTS or FIN, credits for a
    /// blocked send) or that is part-way through an eager message, and the channel of every
    /// one-sided copy under way. With an ANY_SOURCE receive posted, every channel. The driver
    /// polls channels whose poll is a system call ([`crate::Caps::POLL_IS_SYSCALL`]) only when
    /// they are in this set (Chai Ch. 7). Cached until the next mutator or event.
    pub fn awaited_channels(&mut self) -> ChannelSet {
        if let Some(s) = self.awaited {
            return s;
        }
        let s = self.compute_awaited();
        self.awaited = Some(s);
        s
    }

    /// [`Engine::awaited_channels`] from scratch.
    fn compute_awaited(&self) -> ChannelSet {
        if !self.wild.is_empty() {
            return ChannelSet::ALL;
        }
        let mut s = ChannelSet::EMPTY;
        if let Some(p) = self.parked.as_ref() {
            s.insert(am_of(&self.peers, p.from));
        }
        for id in self.reqs.ids() {
            let Some(r) = self.reqs.get(id).filter(|r| r.result.is_none()) else { continue };
            s.insert(am_of(&self.peers, r.peer));
            if r.protocol.is_one_sided() {
                s.insert(r.channel);
            }
        }
        for p in self.peers.iter().filter(|p| !p.incoming.is_empty()) {
            if let Some(route) = &p.route {
                s.insert(route.am);
            }
        }
        s
    }

    /// Something that may change [`Engine::awaited_channels`] happened.
    #[inline]
    fn touched(&mut self) {
        self.awaited = None;
    }

    // ---- mutators -----------------------------------------------------------------------

    /// The fast path of a small send: when the message `buf` to `to` goes eager in one packet,
    /// assigns its sequence id and returns the channel and envelope to send it with now, without
    /// a request (its header is `envelope.header(buf.len)`). If that send does not happen (the
    /// channel would block), hand the message to [`Engine::post_prepared_send`]; it has its place
    /// in the pair's order already.
    #[inline(always)]
    pub fn inline_send(&mut self, to: Rank, tag: u32, space: SpaceId, buf: Region) -> Option<(ChannelId, Envelope)> {
        let ctx = space.0;
        let len = buf.len;
        let placement_from = self.placement_from;
        let peer = self.peers.get_mut(to as usize)?;
        let route = peer.route.as_ref()?;
        if peer.gone.is_some() || len > route.frag || route.entries[0].upto < len {
            return None;
        }
        if len >= placement_from && placement_says_eager(peer, len) == Some(false) {
            return None; // single copy while the peer is apart (post_send)
        }
        if route.mapped.as_ref().is_some_and(|m| len >= m.from) && in_ranges(&self.mapped, buf) {
            return None; // single copy from mapped memory (post_send)
        }
        let am = route.am;
        let seq = peer.next_send_seq;
        peer.next_send_seq = seq.wrapping_add(1);
        peer.history[seq as usize % SEND_HISTORY] = (tag, ctx);
        if !peer.rtrs.is_empty() {
            Self::take_rtr(peer, tag, ctx);
        }
        Some((am, Envelope::new(ctx, tag, seq)))
    }

    /// Queues a message prepared by [`Engine::inline_send`] that could not leave at once.
    ///
    /// # Safety
    /// As for [`Engine::post_send`].
    pub unsafe fn post_prepared_send(&mut self, to: Rank, channel: ChannelId, hdr: Header, buf: Region) -> ReqId {
        self.touched();
        let (id, req) = self.reqs.insert(Dir::Send, to, TagMatch::Tag(hdr.tag), hdr.ctx, buf.ptr as *mut u8, buf.len);
        (req.seq, req.len, req.pending) = (hdr.seq, buf.len, 1);
        let op = Some(op_id(id, OpKind::Sent));
        self.actions.push_back(Action::Send { channel, to, hdr, payload: Payload::User(buf), op });
        id
    }

    /// Starts sending `buf` to `to` with `tag` in context `ctx`.
    ///
    /// # Safety
    /// `buf` must stay valid and unmodified until the request's result was taken (or the
    /// request failed).
    pub unsafe fn post_send(&mut self, to: Rank, tag: u32, space: SpaceId, buf: Region) -> Result<ReqId> {
        let ctx = space.0;
        self.touched();
        let from_mapped = in_ranges(&self.mapped, buf);
        let peer = self.usable_peer(to)?;
        // A stream: no message came from the peer since our last send to it.
        let streaming = peer.last_send_at.replace(peer.expected_seq) == Some(peer.expected_seq);
        let Some(route) = peer.route.as_ref() else {
            let why = peer.unreachable.clone().unwrap_or_else(|| "no route was set for it".into());
            return Err(Error::Unreachable { rank: to, why });
        };
        let entry = route.lookup(buf.len);
        let (mut protocol, mut data_ch, am, frag) = (entry.protocol, entry.channel, route.am, route.frag);
        // From memory the peer maps, the receiver's single copy costs what one memcpy does:
        // cheaper than two copies through send cells from a smaller size, and in a stream too.
        let mapped = route.mapped.as_ref().filter(|m| from_mapped && buf.len >= m.from);
        if let Some(m) = mapped.filter(|_| protocol == Protocol::Eager) {
            (protocol, data_ch) = (Protocol::RndvGet, m.channel);
        }
        // The run-time adaptations move it between eager and single copy where the route's
        // rules allow it (placement of the peer's core, skew feedback, streams: crate::adapt).
        let facts = SendFacts { len: buf.len, route, protocol, mapped: mapped.is_some(), streaming };
        (protocol, data_ch) = peer.adapt.advise(&facts).apply(protocol, data_ch, am);
        // No setting sends more eagerly than a receiver takes (POLYRAIL_ROUTE, POLYRAIL_SKEW,
        // a CMA threshold or an apart size beyond it): such a message is streamed instead.
        if protocol == Protocol::Eager && buf.len as u64 > MAX_EAGER_LEN {
            (protocol, data_ch) = (Protocol::RndvStream, am);
        }
        let seq = peer.next_send_seq;
        peer.next_send_seq = seq.wrapping_add(1);
        peer.history[seq as usize % SEND_HISTORY] = (tag, ctx);
        let rtr = Self::take_rtr(peer, tag, ctx);
        let (id, req) = self.reqs.insert(Dir::Send, to, TagMatch::Tag(tag), ctx, buf.ptr as *mut u8, buf.len);
        req.seq = seq;
        req.len = buf.len;
        req.protocol = protocol;
        req.channel = data_ch;
        match protocol {
            Protocol::Eager => {
                let mut hdr = Header::new(PacketKind::Eager);
                (hdr.tag, hdr.ctx, hdr.seq, hdr.len) = (tag, ctx, seq, buf.len as u64);
                req.pending = Self::push_chunks(&mut self.actions, am, to, hdr, buf, frag, id);
                if req.pending == 0 {
                    req.finish_ok();
                }
            }
            Protocol::RndvStream => self.send_stream_rts(id),
            Protocol::RndvGet | Protocol::RndvSplit => match rtr {
                Some(rtr) if rtr.cap >= buf.len => {
                    // Receiver first: we write (all, or the back part when splitting).
                    let split = if protocol == Protocol::RndvSplit { self.split_point(id, to, buf.len) } else { 0 };
                    let req = self.reqs.get_mut(id).expect("request made above");
                    req.split = split;
                    req.peer_key = Some(Box::new(rtr.key));
                    req.peer_req = rtr.rreq;
                    req.pending = 1 + (split > 0) as u32; // own put, then the receiver's FIN
                    req.fin_due = split > 0;
                    if split > 0 {
                        req.expose_for = Some(ExposeFor::RtsAfterRtr);
                        self.actions.push_back(Action::Register {
                            channel: data_ch,
                            region: buf,
                            access: PeerAccess::Read,
                            op: op_id(id, OpKind::Exposed),
                        });
                    } else {
                        self.send_rts_after_rtr(id, None);
                    }
                }
                _ => {
                    // Sender first: expose, then RTS; the receiver's FIN ends it.
                    req.pending = 1;
                    req.fin_due = true;
                    req.expose_for = Some(ExposeFor::Rts);
                    self.actions.push_back(Action::Register {
                        channel: data_ch,
                        region: buf,
                        access: PeerAccess::Read,
                        op: op_id(id, OpKind::Exposed),
                    });
                }
            },
        }
        Ok(id)
    }

    /// Starts receiving into `buf` a message from `src` with a tag matching `tag` in `ctx`.
    ///
    /// # Safety
    /// `buf` must stay valid and not be accessed otherwise until the request's result was
    /// taken (or the request failed).
    pub unsafe fn post_recv(&mut self, src: Source, tag: TagMatch, space: SpaceId, buf: RegionMut) -> Result<ReqId> {
        let ctx = space.0;
        self.touched();
        let found = self.find_unexpected(src, tag, ctx);
        if let Source::Rank(r) = src {
            // A peer that finished may have left messages behind: those still match.
            if let Err(e) = self.usable_peer(r) {
                if found.is_none() {
                    return Err(e);
                }
            }
            // Nothing can come from it: the receive would wait forever.
            if let Some(why) = self.peers.get(r as usize).and_then(|p| p.unreachable.clone()) {
                return Err(Error::Unreachable { rank: r, why });
            }
        } else if found.is_none() && self.all_others_gone_in(space) {
            return Err(self.all_gone_error());
        }
        let from = match src {
            Source::Rank(r) => r,
            Source::Any => self.me,
        };
        let (id, req) = self.reqs.insert(Dir::Recv, from, tag, ctx, buf.ptr, buf.len);
        if found.is_none() {
            req.order = self.post_counter;
            self.post_counter += 1;
            req.kind = ReqKind::Recv(Matching::Posted { any_source: src == Source::Any });
        }
        self.count_receive(src);
        if let Some((from, i)) = found {
            let ux = self.peers[from as usize].unexpected.remove(i).expect("index from find_unexpected");
            self.match_unexpected(id, from, ux);
            return Ok(id);
        }
        match src {
            Source::Any => self.wild.push_back(id),
            Source::Rank(r) => {
                if r != self.me {
                    self.maybe_send_rtr(id, r, tag, ctx, buf.len);
                }
                self.peers[r as usize].posted.push_back(id);
            }
        }
        Ok(id)
    }

    /// The fast paths of a receive, without a request. When the first unexpected message
    /// matching `(src, tag, space)` is an eager one that arrived whole and fits `buf`, copies
    /// it into `buf`: [`InlineRecv::Received`]. When nothing matches and `park` allows it, the
    /// receive may wait parked: [`InlineRecv::Parked`] (see below). Else
    /// [`InlineRecv::Post`]: post it with [`Engine::post_recv`] (a rendezvous or fragments
    /// still to come, a message too long for `buf`, which the request then reports, or a
    /// receive that cannot park). The skew feedback counts the receive as `post_recv` does;
    /// run the actions afterwards.
    ///
    /// A parked receive (a blocking one, `park`) names one peer, no other receive waits for
    /// that peer's messages (none posted for it, no ANY_SOURCE one), and a buffer of
    /// `buf.len` bytes takes eager messages from it (so `post_recv` would send no
    /// receive-first hint). A whole eager message that fits is copied straight into `buf` on
    /// arrival; any other matching packet (a first fragment, an RTS, a message too long) first
    /// turns it into the request `post_recv` would have made, in its place. Progress until
    /// [`Engine::parked_settled`], then end it with [`Engine::unpark`].
    ///
    /// # Safety
    /// `buf` must be valid for writes of `buf.len` bytes during the call; when parked, it must
    /// stay valid and not be accessed otherwise until [`Engine::unpark`] (and, when that gives
    /// a request, until the request's result was taken or it failed).
    #[inline]
    pub unsafe fn inline_recv(
        &mut self,
        src: Source,
        tag: TagMatch,
        space: SpaceId,
        buf: RegionMut,
        park: bool,
    ) -> InlineRecv {
        if let Some((from, i)) = self.find_unexpected(src, tag, space.0) {
            // SAFETY: forwarded to the caller.
            return match unsafe { self.take_unexpected(src, from, i, buf) } {
                Some(status) => InlineRecv::Received(status),
                None => InlineRecv::Post,
            };
        }
        if park && self.park_recv(src, tag, space, buf) {
            return InlineRecv::Parked;
        }
        InlineRecv::Post
    }

    /// [`Engine::inline_recv`] once a message matched: unexpected message `i` of `from`.
    /// Out of line: a receive mostly finds none.
    ///
    /// # Safety
    /// As for [`Engine::inline_recv`].
    #[inline(never)]
    unsafe fn take_unexpected(&mut self, src: Source, from: Rank, i: usize, buf: RegionMut) -> Option<Status> {
        let u = &self.peers[from as usize].unexpected[i];
        match &u.body {
            UxBody::Eager { received, .. } if *received == u.len && u.len <= buf.len => {}
            _ => return None,
        }
        self.touched();
        self.count_receive(src);
        let ux = self.peers[from as usize].unexpected.remove(i)?;
        let UxBody::Eager { data, .. } = ux.body else { return None };
        // SAFETY: ux.len <= buf.len (checked above) and data holds ux.len bytes; the caller
        // guarantees the buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr, ux.len) };
        self.spare.give_back(data);
        Some(Status { source: from, tag: ux.tag, len: ux.len })
    }

    /// [`Engine::inline_recv`] of a blocking receive that nothing unexpected matches: parks it
    /// when it may (see there); whether it did. The caller keeps `buf` as `inline_recv` says.
    fn park_recv(&mut self, src: Source, tag: TagMatch, space: SpaceId, buf: RegionMut) -> bool {
        let ctx = space.0;
        let Source::Rank(from) = src else { return false };
        if self.parked.is_some() || !self.wild.is_empty() {
            return false;
        }
        let Some(p) = self.peers.get(from as usize) else { return false };
        // What the peer sends eagerly, as its placement rule says (anything else still meets
        // the parked receive, which then becomes a request).
        let eager = placement_says_eager(p, buf.len)
            .or_else(|| p.route.as_ref().map(|r| !r.lookup(buf.len).protocol.is_one_sided()))
            .unwrap_or(false);
        if !eager || p.gone.is_some() || !p.posted.is_empty() {
            return false;
        }
        self.touched();
        self.count_receive(src);
        self.parked = Some(Parked { from, tag, ctx, buf, end: None });
        true
    }

    /// Whether the parked receive ended or became a request (or none is parked).
    #[inline]
    pub fn parked_settled(&self) -> bool {
        self.parked.as_ref().is_none_or(|p| p.end.is_some())
    }

    /// Ends the parked receive: what became of it. After this the engine no longer uses its
    /// buffer, unless it became a request.
    pub fn unpark(&mut self) -> Unparked {
        self.touched();
        self.parked.take().and_then(|p| p.end).unwrap_or(Unparked::Withdrawn)
    }

    /// A packet `hdr` from `from` that starts a message, in order. When it matches the parked
    /// receive: copies a whole eager message that fits into it (`true`: done), or else turns
    /// the receive into a posted request, which the packet then meets as usual.
    #[inline]
    fn meet_parked(&mut self, from: Rank, hdr: &Header, payload: &[u8]) -> bool {
        let Some(p) = self.parked.as_mut() else { return false };
        if p.from != from || p.ctx != hdr.ctx || !p.tag.matches(hdr.tag) || p.end.is_some() {
            return false;
        }
        if hdr.kind == PacketKind::Eager && payload.len() as u64 == hdr.len && payload.len() <= p.buf.len {
            // SAFETY: payload.len() <= buf.len; inline_recv's caller keeps the buffer valid and
            // unaliased while it is parked.
            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), p.buf.ptr, payload.len()) };
            p.end = Some(Unparked::Done(Ok(Status { source: from, tag: hdr.tag, len: payload.len() })));
            return true;
        }
        let (tag, ctx, buf) = (p.tag, p.ctx, p.buf);
        let (id, req) = self.reqs.insert(Dir::Recv, from, tag, ctx, buf.ptr, buf.len);
        req.order = self.post_counter;
        self.post_counter += 1;
        self.peers[from as usize].posted.push_back(id);
        self.parked.as_mut().expect("checked above").end = Some(Unparked::Promoted(id));
        false
    }

    /// Skew feedback's view of a receive being posted (or taking its message at once): how
    /// many of the named source's messages wait for it. The first message the peer sent after
    /// our last send to it does not count: it may answer that send, and in a rendezvous
    /// ping-pong it always waits (the peer's next RTS follows our DONE at once, before this
    /// receive is posted), which made skew feedback flip the protocol every WINDOW messages
    /// (Intel Xeon host, receiver-pull route forced, 16 KiB one way 2.63 µs against 1.8
    /// without skew feedback).
    #[inline]
    fn count_receive(&mut self, src: Source) {
        if let Source::Rank(r) = src {
            let p = &mut self.peers[r as usize];
            let unread = p.adapt.skew.take_unread();
            let oldest = p.unexpected.front().map_or(p.expected_seq, |u| u.seq);
            let answer = p.last_send_at == Some(oldest) && p.unexpected.len() + unread > 0;
            let waiting = p.unexpected.len() + unread - usize::from(answer);
            self.watch_skew(r, waiting);
        }
    }

    /// Withdraws every receive that has not matched a message yet: one whose RTR gave a live
    /// peer its key is cancelled as by [`Engine::cancel_recv`] (it ends when the peer answers,
    /// or with the peer's loss), the others fail at once with an error that says so. Returns
    /// how many. Used when the process finishes: such a receive could only keep it waiting
    /// forever.
    pub fn cancel_unmatched_receives(&mut self) -> usize {
        self.touched();
        let ids: Vec<ReqId> = self
            .reqs
            .ids()
            .filter(|&id| self.reqs.get(id).is_some_and(|r| r.unmatched() && r.result.is_none()))
            .collect();
        for &id in &ids {
            if !self.ask_withdrawal(id) {
                self.fail(
                    id,
                    Error::InvalidArgument(
                        "receive cancelled: the process finished before a message matched it".into(),
                    ),
                );
            }
        }
        ids.len()
    }

    /// Fails the receives whose withdrawal is still unanswered and the running ones whose key
    /// a live peer holds (an RTR or a CTS gave it to the sender): those peers may yet write
    /// their buffers. Returns every request whose buffer a peer may still write (these, and
    /// those [`Engine::take_peer_may_write`] was not asked about yet), which must never be
    /// reused. For a process that can wait no longer.
    pub fn abandon_lent_receives(&mut self) -> Vec<ReqId> {
        let ids: Vec<(ReqId, bool)> = self
            .reqs
            .ids()
            .filter_map(|id| {
                let r = self.reqs.get(id).filter(|r| r.result.is_none())?;
                let asked = r.withdrawal_asked();
                (asked || self.lent_to_live_peer(r)).then_some((id, asked))
            })
            .collect();
        for &(id, asked) in &ids {
            let why = if asked {
                "receive cancelled: its sender did not answer the withdrawal"
            } else {
                "receive abandoned while its sender still held its buffer's key"
            };
            self.fail(id, Error::InvalidArgument(why.into()));
        }
        std::mem::take(&mut self.peer_may_write)
    }

    /// Withdraws a receive that no message has matched (`MPI_Cancel`). [`CancelRecv::Cancelled`]:
    /// withdrawn and forgotten (a message for it later goes to the next matching receive).
    /// [`CancelRecv::NotCancelled`], changing nothing: a send, a finished or matched receive.
    /// [`CancelRecv::Asked`]: its RTR gave the sender its key, which that peer may be writing
    /// through, or a later receive's RTR counts it (see `ask_withdrawal`); a `Withdraw` went
    /// to the sender, the receive still matches messages meanwhile, and
    /// [`Engine::phase`] tells how it ends ([`ReqPhase::Withdrawn`] when the answer comes
    /// before a message; else it finishes with that message, or fails with the peer).
    pub fn cancel_recv(&mut self, req: ReqId) -> CancelRecv {
        let Some(r) = self.reqs.get(req) else { return CancelRecv::NotCancelled };
        if !r.unmatched() || r.result.is_some() {
            return CancelRecv::NotCancelled;
        }
        if r.withdrawal_asked() || self.ask_withdrawal(req) {
            return CancelRecv::Asked;
        }
        self.discard(req);
        CancelRecv::Cancelled
    }

    /// Sends a `Withdraw` for receive `id` when withdrawing it needs its sender's word; whether
    /// it did. It does when the receive's RTR gave a live peer its key, and also when a receive
    /// posted after it for the same peer and messages (an overlapping tag) sent an RTR: that
    /// RTR's place counts this receive, and were it withdrawn unseen, the send the RTR points
    /// at would write into a receive that took an earlier message.
    fn ask_withdrawal(&mut self, id: ReqId) -> bool {
        let Some(r) = self.reqs.get(id) else { return false };
        let (peer, tag, ctx) = (r.peer, r.tag, r.ctx);
        if r.any_source() || !self.peer_alive(peer) {
            return false;
        }
        if !r.withdrawal_asked() {
            let posted = &self.peers[peer as usize].posted;
            let later_rtr = || {
                let mut later = posted.iter().skip_while(|&&q| q != id).skip(1).filter_map(|q| self.reqs.get(*q));
                later.any(|q| {
                    (q.rtr_sent || q.expose_for == Some(ExposeFor::Rtr)) && q.ctx == ctx && q.tag.overlaps(tag)
                })
            };
            if !r.lends_key() && !later_rtr() {
                return false;
            }
            // Only an unmatched receive is withdrawn (the callers check).
            self.reqs.get_mut(id).expect("checked above").kind = ReqKind::Recv(Matching::Withdrawing);
            self.peers[peer as usize].withdrawals += 1;
            let mut hdr = Header::new(PacketKind::Withdraw);
            hdr.rreq = id.wire();
            let am = am_of(&self.peers, peer);
            self.actions.push_back(Action::Send { channel: am, to: peer, hdr, payload: Payload::Empty, op: None });
        }
        true
    }

    /// Forgets a request whose result will never be taken (e.g. its handle was dropped after
    /// an error). A running receive is withdrawn from matching; when that needs its sender's
    /// word ([`Engine::cancel_recv`]'s `Asked`), it stays posted until the answer: a message
    /// that matches it meanwhile is dropped as truncated, or, when the receive's RTR gave the
    /// sender its key ([`Engine::take_peer_may_write`] then says so), taken into its buffer.
    pub fn discard(&mut self, req: ReqId) {
        self.touched();
        self.zombies.retain(|&z| match self.reqs.get(z) {
            Some(r) if r.result.is_none() || r.channel_busy() => true,
            _ => {
                self.reqs.free(z);
                false
            }
        });
        let unmatched = self.reqs.get(req).is_some_and(|r| r.unmatched() && r.result.is_none());
        if unmatched && self.ask_withdrawal(req) {
            let r = self.reqs.get_mut(req).expect("checked above");
            if r.lends_key() {
                // The sender may be writing already (its RTS and FIN follow): the receive ends
                // as usual, in a buffer `take_peer_may_write` names (kept out of use, or the
                // caller's: the process stops).
                self.peer_may_write.push(req);
            } else {
                (r.ptr, r.cap) = (std::ptr::NonNull::dangling().as_ptr(), 0);
            }
            self.zombies.push(req);
            return;
        }
        if self.reqs.get(req).is_some_and(|r| r.result.is_none()) {
            self.fail(req, Error::InvalidArgument("request discarded".into()));
        }
        if let Some(r) = self.reqs.get(req).filter(|r| r.channel_busy()) {
            // Its exposure is on its way (kept until it lands and is ended, `exposed`), or its
            // read is (kept until it completes, so that `copies_in_flight` sees it; the read may
            // still write the buffer, whose owner must not get it back for reuse).
            if r.reading() && !self.peer_may_write.contains(&req) {
                self.peer_may_write.push(req);
            }
            self.zombies.push(req);
            return;
        }
        self.reqs.free(req);
    }

    // ---- events -------------------------------------------------------------------------

    /// What became of the channel work `op` of an [`Action`].
    #[inline]
    pub fn handle_op(&mut self, op: OpId, outcome: OpOutcome) {
        match outcome {
            OpOutcome::Sent => self.op_sent(op),
            OpOutcome::Registered(handle) => self.op_exposed(op, handle),
            OpOutcome::Ordered => self.op_ordered(op),
            OpOutcome::Done(result) => self.op_done(op, result),
        }
    }

    /// A send action with `op` left the process.
    #[inline]
    fn op_sent(&mut self, op: OpId) {
        self.touched();
        if let Some((id, OpKind::Sent)) = split_op(op) {
            self.count_down(id);
        }
    }

    /// An `Expose` action finished. Call it before polling the next action: what follows from
    /// the key takes the exposure's place in the action order (so an RTS keeps its message's
    /// place among the sends to its peer).
    fn op_exposed(&mut self, op: OpId, handle: Result<MemHandle>) {
        self.touched();
        let before = self.actions.len();
        self.exposed(op, handle);
        let added = self.actions.len() - before;
        self.actions.rotate_right(added);
    }

    fn exposed(&mut self, op: OpId, handle: Result<MemHandle>) {
        let Some((id, OpKind::Exposed)) = split_op(op) else { return };
        let Some(req) = self.reqs.get_mut(id) else { return };
        if req.result.is_some() {
            // It failed while its exposure was on the way: no peer got the key; end it.
            let was_for = req.expose_for.take();
            if let Ok(handle) = handle {
                self.actions.push_back(Action::Deregister { channel: req.channel, handle, written: 0..0 });
            }
            if was_for == Some(ExposeFor::Cts) {
                // A receive that matched an RTS and was to answer with its CTS: the sender
                // waits for that or a FIN to release its buffer; a truncation FIN ends its send.
                self.release_sender(id);
            }
            return;
        }
        let handle = match handle {
            Ok(h) => h,
            Err(e) => return self.exposure_refused(id, e),
        };
        let key = *handle.key();
        req.own_key = Some(Box::new(handle));
        match req.expose_for.take() {
            Some(ExposeFor::Rts) => self.send_rts(id, 0, Payload::Key(key)),
            Some(ExposeFor::RtsAfterRtr) => self.send_rts_after_rtr(id, Some(key)),
            Some(ExposeFor::Cts) => self.send_cts(id, key),
            Some(ExposeFor::Rtr) if matches!(req.kind, ReqKind::Recv(Matching::Posted { .. })) => {
                req.rtr_sent = true;
                let mut hdr = Header::new(PacketKind::Rtr);
                hdr.flags = if req.tag == TagMatch::Any { Header::ANY_TAG } else { 0 };
                (hdr.tag, hdr.ctx, hdr.seq, hdr.len, hdr.rreq, hdr.offset) =
                    (req.tag_value(), req.ctx, req.rtr_place, req.cap as u64, id.wire(), req.rtr_seq as u64);
                let (to, am) = (req.peer, am_of(&self.peers, req.peer));
                self.actions.push_back(Action::Send { channel: am, to, hdr, payload: Payload::Key(key), op: None });
            }
            // Matched, or being withdrawn, before its RTR could go out: no peer ever gets the key.
            Some(ExposeFor::Rtr) => self.release_key(id),
            None => {}
        }
    }

    /// A `Put` answered [`Issued::Ordered`](crate::Issued::Ordered): when the request's notice
    /// to the peer goes over the same channel it cannot overtake the data, so the put counts as
    /// done now (its completion, when it comes, is then ignored).
    fn op_ordered(&mut self, op: OpId) {
        let Some((id, OpKind::Copy)) = split_op(op) else { return };
        let Some(req) = self.reqs.get(id) else { return };
        if am_of(&self.peers, req.peer) == req.channel {
            self.op_done(op, Ok(()));
        }
    }

    /// A `Get` or `Put` finished.
    fn op_done(&mut self, op: OpId, result: Result<()>) {
        self.touched();
        let Some((id, OpKind::Copy)) = split_op(op) else { return };
        let Some(req) = self.reqs.get_mut(id) else { return };
        if req.copy == OwnCopy::Done {
            return;
        }
        req.copy = OwnCopy::Idle;
        if req.result.is_some() {
            // A receive that ended (failed, or was discarded) while its read ran: the sender
            // still waits for our FIN to release its buffer, which we no longer read.
            let (dir, peer) = (req.dir(), req.peer);
            if dir == Dir::Recv && self.peer_alive(peer) {
                self.reqs.get_mut(id).expect("live request").copy = OwnCopy::Done;
                self.send_fin(id, 0);
            }
            return;
        }
        req.copy = OwnCopy::Done;
        // Tell the peer our part is done, also when it failed (the peer would otherwise wait
        // for ever): the receiver's FIN releases the sender's buffer (we no longer read it);
        // the sender's completes the receiver's buffer, or, flagged TRUNCATED after a failed
        // write, fails the receive (its buffer lacks our part).
        let failed_write = req.dir() == Dir::Send && result.is_err();
        self.send_fin(id, if failed_write { Header::TRUNCATED } else { 0 });
        let req = self.reqs.get_mut(id).expect("live request");
        if let Err(e) = result {
            // While the peer still works on the buffer through our key, the request ends with
            // the error only at the peer's FIN (or its loss): a receive whose sender still
            // writes its part (split), so that nothing writes the buffer once the receive has
            // ended; a send whose receiver still reads its part, so that the exposure stays
            // until then (and the receiver's FIN still finds the send).
            let peer_busy = match req.dir() {
                Dir::Recv => req.peer_writing && req.pending > 1,
                Dir::Send => req.fin_due,
            };
            if !peer_busy {
                return self.fail(id, e);
            }
            req.deferred = Some(Box::new(e));
        }
        self.count_down(id);
    }

    /// `peer` is gone: fail every request that needs it.
    pub fn handle_peer_lost(&mut self, peer: Rank, why: Error) {
        self.touched();
        let Some(p) = self.peers.get_mut(peer as usize) else { return };
        if p.gone.is_some() {
            return;
        }
        let gone = match why {
            Error::PeerFinished { .. } => Gone::Finished,
            Error::Protocol { .. } => Gone::Faulty,
            _ => Gone::Lost,
        };
        p.gone = Some(gone);
        if gone != Gone::Finished {
            p.lost_why = Some(match &why {
                Error::PeerLost { why, .. } => why.as_str().into(),
                other => other.to_string().into(),
            });
        }
        p.rtrs.clear();
        p.withdrawals = 0;
        self.gone_peers += 1;
        if let Some(parked) = self.parked.as_mut().filter(|q| q.from == peer && q.end.is_none()) {
            parked.end = Some(Unparked::Done(Err(why.duplicate())));
        }
        let victims: Vec<ReqId> =
            self.reqs.ids().filter(|&id| self.reqs.get(id).is_some_and(|r| r.needs(peer))).collect();
        for id in victims {
            self.fail(id, why.duplicate());
        }
        // A loss may have taken any message of the peer on its way, in a context it sends in;
        // a finish, none (a wildcard ends only once no other sender is left).
        let hopeless = |e: &Engine, id: ReqId| {
            e.reqs.get(id).is_some_and(|r| {
                (gone != Gone::Finished && e.may_send_in(peer, r.ctx)) || e.all_others_gone_in(SpaceId(r.ctx))
            })
        };
        let wild: Vec<ReqId> = self.wild.iter().copied().filter(|&id| hopeless(self, id)).collect();
        for id in wild {
            self.fail(id, why.duplicate());
        }
    }

    // ---- poll ---------------------------------------------------------------------------

    /// The next thing to do on a channel.
    #[inline]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    // ---- internals ----------------------------------------------------------------------

    fn usable_peer(&mut self, r: Rank) -> Result<&mut Peer> {
        self.peer(r)?;
        if let Some(gone) = self.peers[r as usize].gone {
            return Err(self.gone_error(r, gone));
        }
        Ok(&mut self.peers[r as usize])
    }

    /// The error of a call that needs `peer`, which is gone as `gone` says (a loss with the
    /// reason given then).
    fn gone_error(&self, peer: Rank, gone: Gone) -> Error {
        if gone == Gone::Finished {
            return Error::PeerFinished { rank: peer };
        }
        let why = self.peers.get(peer as usize).and_then(|p| p.lost_why.as_deref()).unwrap_or("reported lost");
        Error::PeerLost { rank: peer, why: why.into() }
    }

    /// Declares that only `members` (job ranks, this one among them) send in matching context
    /// `ctx` (a space over some of the ranks): an ANY_SOURCE receive in it is then refused, or
    /// failed, once every other member has finished, not only once every other rank has.
    pub fn set_space_members(&mut self, space: SpaceId, members: &[Rank]) {
        let ctx = space.0;
        self.members_of.insert(ctx, members.into());
    }

    /// Whether `peer` may send in context `ctx` (every rank may, but in a space over some).
    fn may_send_in(&self, peer: Rank, ctx: u16) -> bool {
        self.members_of.get(&ctx).is_none_or(|members| members.contains(&peer))
    }

    /// Whether every other rank that may send in `ctx` has finished or was lost (never when
    /// there is no other).
    pub(super) fn all_others_gone_in(&self, space: SpaceId) -> bool {
        let ctx = space.0;
        if self.gone_peers == 0 {
            return false;
        }
        match self.members_of.get(&ctx) {
            Some(members) => {
                let gone = |r: Rank| r == self.me || self.peers.get(r as usize).is_none_or(|p| p.gone.is_some());
                members.len() > 1 && members.iter().all(|&r| gone(r))
            }
            // Every rank may send: the count says it.
            None => {
                let me_gone = self.peers.get(self.me as usize).is_some_and(|p| p.gone.is_some());
                self.peers.len() > 1 && self.gone_peers as usize - usize::from(me_gone) == self.peers.len() - 1
            }
        }
    }

    /// The loss of the sender a probe for `from` in `ctx` looks at, if it was lost (or lost
    /// for breaking the protocol; not a finish): `from` itself, or for [`Source::Any`] the
    /// first lost rank that may send in `ctx`. Such a probe finding nothing may wait for a
    /// message the loss took.
    pub(super) fn lost_sender(&self, from: Source, space: SpaceId) -> Option<Error> {
        let ctx = space.0;
        let lost = |r: Rank| matches!(self.peers.get(r as usize).and_then(|p| p.gone), Some(Gone::Lost | Gone::Faulty));
        let r = match from {
            Source::Rank(r) => Some(r).filter(|&r| lost(r)),
            Source::Any if self.gone_peers == 0 => None,
            Source::Any => (0..self.peers.len() as Rank).find(|&r| r != self.me && lost(r) && self.may_send_in(r, ctx)),
        }?;
        self.peer_error(r)
    }

    fn all_gone_error(&self) -> Error {
        Error::InvalidArgument(
            "every other rank that may send in the space has finished or was lost: an ANY_SOURCE receive can never match".into(),
        )
    }

    fn frag(&self, peer: Rank) -> usize {
        self.peers[peer as usize].route.as_ref().map_or(1, |r| r.frag)
    }

    /// Queues `hdr` + `buf` split into packets of at most `frag` bytes: the first with
    /// `hdr`, the others as `Frag`/`Data` with their offset. Returns the number of packets.
    fn push_chunks(
        actions: &mut VecDeque<Action>,
        channel: ChannelId,
        to: Rank,
        hdr: Header,
        buf: Region,
        frag: usize,
        id: ReqId,
    ) -> u32 {
        let op = Some(op_id(id, OpKind::Sent));
        let mut off = 0;
        let mut n = 0;
        loop {
            let chunk = (buf.len - off).min(frag);
            let mut h = hdr;
            if n > 0 && hdr.kind == PacketKind::Eager {
                h = Header::new(PacketKind::Frag);
                h.seq = hdr.seq;
            }
            h.offset = off as u64;
            // SAFETY: off + chunk <= buf.len; the caller promised buf is valid.
            let region = Region { ptr: unsafe { buf.ptr.add(off) }, len: chunk };
            actions.push_back(Action::Send { channel, to, hdr: h, payload: Payload::User(region), op });
            n += 1;
            off += chunk;
            if off >= buf.len {
                return n;
            }
        }
    }

    /// Counts a send of `(tag, ctx)` against the receive-first hints: returns the one for the
    /// receive this send will match, whatever protocol it uses; the send moves the others for
    /// the same messages one place closer.
    fn take_rtr(peer: &mut Peer, tag: u32, ctx: u16) -> Option<Rtr> {
        if peer.rtrs.is_empty() {
            return None;
        }
        let mut taken = None;
        peer.rtrs.retain_mut(|r| {
            if r.ctx != ctx || !r.tag.matches(tag) {
                return true;
            }
            if r.ahead > 0 {
                r.ahead -= 1;
                return true;
            }
            // This send takes that receive. A second hint for the same place (only a confused
            // peer sends one) names a receive no send can reach now: drop it too.
            if taken.is_none() {
                taken = Some(*r);
            }
            false
        });
        taken
    }

    /// Request `id`'s exposure failed (e.g. memory its channel could not register): it goes on
    /// by a protocol that needs no key of ours, rather than fail and leave its peer waiting for
    /// its RTS, CTS or FIN (or, for a send, break the pair's sequence of messages).
    fn exposure_refused(&mut self, id: ReqId, e: Error) {
        let req = self.reqs.get_mut(id).expect("live request");
        let (peer, was_for) = (req.peer, req.expose_for.take());
        if let Some(probe) = self.split_probe.as_mut().filter(|p| p.id == id) {
            probe.disturbed = true;
        }
        tracing::debug!("rank {}: exposure for rank {peer} refused ({e}); going on without it", self.me);
        match was_for {
            // Sender first: the data goes through active messages.
            Some(ExposeFor::Rts) => self.send_stream_rts(id),
            // Receiver first, split: we write all of it through the receiver's key.
            Some(ExposeFor::RtsAfterRtr) => {
                (req.split, req.pending, req.fin_due) = (0, 1, false);
                self.send_rts_after_rtr(id, None);
            }
            // Sender first, split: we read all of it through the sender's key.
            Some(ExposeFor::Cts) => {
                (req.split, req.peer_writes, req.pending) = (req.len, 0..0, 1);
                self.start_own_copy(id);
            }
            // The receive waits for its message without offering its buffer.
            Some(ExposeFor::Rtr) => {}
            None => self.fail(id, e),
        }
    }

    /// Sends the RTS of send `id` whose data goes through active messages once the receiver's
    /// CTS asks for it.
    fn send_stream_rts(&mut self, id: ReqId) {
        let req = self.reqs.get_mut(id).expect("live request");
        let am = am_of(&self.peers, req.peer);
        (req.protocol, req.channel) = (Protocol::RndvStream, am);
        req.pending = 1; // the receiver's CTS
        req.fin_due = true; // or its truncation FIN
        self.send_rts(id, Header::STREAM, Payload::Empty);
    }

    /// Sends the RTS of sender-first send `id`, with `flags` and `payload` (our key, or none
    /// for a stream).
    fn send_rts(&mut self, id: ReqId, flags: u8, payload: Payload) {
        let req = self.reqs.get(id).expect("live request");
        let mut hdr = Header::new(PacketKind::Rts);
        (hdr.flags, hdr.tag, hdr.ctx, hdr.seq, hdr.len, hdr.sreq) =
            (flags, req.tag_value(), req.ctx, req.seq, req.len as u64, id.wire());
        let (to, am) = (req.peer, am_of(&self.peers, req.peer));
        self.actions.push_back(Action::Send { channel: am, to, hdr, payload, op: None });
    }

    /// Ends the send of a receive that matched its RTS and will read nothing (it failed, or
    /// was discarded, before its read or CTS): a truncation FIN, unless the sender is gone.
    pub(super) fn release_sender(&mut self, id: ReqId) {
        if self.reqs.get(id).is_some_and(|r| self.peer_alive(r.peer)) {
            self.send_fin(id, Header::TRUNCATED);
        }
    }

    /// Queues the FIN of request `id` to its peer (a receive's names the send, a send's the
    /// receive), with `flags`.
    fn send_fin(&mut self, id: ReqId, flags: u8) {
        let Some(req) = self.reqs.get(id) else { return };
        let mut hdr = Header::new(PacketKind::Fin);
        hdr.flags = flags;
        match req.dir() {
            Dir::Send => hdr.rreq = req.peer_req,
            Dir::Recv => hdr.sreq = req.peer_req,
        }
        let (to, am) = (req.peer, am_of(&self.peers, req.peer));
        self.actions.push_back(Action::Send { channel: am, to, hdr, payload: Payload::Empty, op: None });
    }

    /// Receiver-first send: RTS naming the receiver's request (and our key when it pulls the
    /// front), then our put of the back.
    fn send_rts_after_rtr(&mut self, id: ReqId, key: Option<RemoteKey>) {
        let req = self.reqs.get(id).expect("live request");
        let mut hdr = Header::new(PacketKind::Rts);
        (hdr.tag, hdr.ctx, hdr.seq, hdr.len, hdr.sreq, hdr.rreq, hdr.offset) =
            (req.tag_value(), req.ctx, req.seq, req.len as u64, id.wire(), req.peer_req, req.split as u64);
        let (to, am) = (req.peer, am_of(&self.peers, req.peer));
        let payload = key.map_or(Payload::Empty, Payload::Key);
        self.actions.push_back(Action::Send { channel: am, to, hdr, payload, op: None });
        self.start_own_copy(id);
    }

    /// Issues this request's one-sided copy: the receiver gets `[0, split)`, the sender puts
    /// `[split, len)`. An empty part counts as done at once.
    fn start_own_copy(&mut self, id: ReqId) {
        let req = self.reqs.get(id).expect("live request");
        let (range, key) = match req.dir() {
            Dir::Recv => (0..req.split, req.peer_key.as_deref().copied()),
            Dir::Send => (req.split..req.len, req.peer_key.as_deref().copied()),
        };
        let op = op_id(id, OpKind::Copy);
        if range.is_empty() {
            // Nothing to copy on our side. A receiver that pulls everything (an empty message
            // by rendezvous) still owes the sender its FIN; a sender with nothing to push owes
            // nothing (the receiver does not wait for it).
            return match req.dir() {
                Dir::Recv => self.op_done(op, Ok(())),
                Dir::Send => self.count_down(id),
            };
        }
        let Some(key) = key else { return self.fail(id, Error::protocol(req.peer, "rendezvous without a key")) };
        // SAFETY: range lies within the request's buffer, valid while the request lives.
        let ptr = unsafe { req.ptr.add(range.start) };
        let len = range.len();
        let (channel, peer, offset, dir) = (req.channel, req.peer, range.start, req.dir());
        if dir == Dir::Recv {
            self.reqs.get_mut(id).expect("live request").copy = OwnCopy::Reading;
        }
        self.actions.push_back(match dir {
            Dir::Recv => Action::Get { channel, peer, key, offset, into: RegionMut { ptr, len }, op },
            Dir::Send => Action::Put { channel, peer, from: Region { ptr, len }, key, offset, op },
        });
    }

    fn count_down(&mut self, id: ReqId) {
        let Some(req) = self.reqs.get_mut(id) else { return };
        if req.result.is_some() {
            return;
        }
        req.pending = req.pending.saturating_sub(1);
        if req.pending == 0 {
            match req.deferred.take() {
                Some(e) => self.fail(id, *e),
                None => self.finish(id),
            }
        }
    }

    /// Ends a request successfully and releases its exposure.
    pub(super) fn finish(&mut self, id: ReqId) {
        if let Some(req) = self.reqs.get_mut(id) {
            finish_req(req, &mut self.actions);
        }
    }

    /// Ends the exposure of a request's buffer, if it has one, with what the peer wrote there
    /// (nothing when the request failed).
    fn release_key(&mut self, id: ReqId) {
        if let Some(req) = self.reqs.get_mut(id) {
            unexpose(req, &mut self.actions);
        }
    }

    /// Ends a request with an error and withdraws it from every queue.
    fn fail(&mut self, id: ReqId, e: Error) {
        let Some(req) = self.reqs.get_mut(id) else { return };
        if req.result.is_some() {
            return;
        }
        req.result = Some(Err(Box::new(e)));
        let (unmatched, peer, key_out) = (req.unmatched(), req.peer, req.lends_key());
        if key_out && self.may_still_write(peer) {
            self.peer_may_write.push(id);
        }
        if unmatched {
            self.wild.retain(|&r| r != id);
            if let Some(p) = self.peers.get_mut(peer as usize) {
                p.posted.retain(|&r| r != id);
            }
        }
        for p in &mut self.peers {
            for inc in &mut p.incoming {
                if matches!(inc.target, FragTarget::Req(r) if r == id) {
                    inc.target = FragTarget::Discard;
                }
            }
        }
        self.release_key(id);
    }
}

/// [`Engine::finish`] of a request at hand.
#[inline]
fn finish_req(req: &mut Req, actions: &mut VecDeque<Action>) {
    req.finish_ok();
    unexpose(req, actions);
}

/// [`Engine::release_key`] of a request at hand.
#[inline]
fn unexpose(req: &mut Req, actions: &mut VecDeque<Action>) {
    if let Some(handle) = req.own_key.take() {
        let written = match req.result {
            Some(Ok(_)) => std::mem::replace(&mut req.peer_writes, 0..0),
            _ => 0..0,
        };
        actions.push_back(Action::Deregister { channel: req.channel, handle: *handle, written });
    }
}

/// The active-message channel to `peer`.
fn am_of(peers: &[Peer], peer: Rank) -> ChannelId {
    peers[peer as usize].route.as_ref().map_or(ChannelId(0), |r| r.am)
}

/// The engine as one channel's [`Sink`] (see [`ChannelSink::new`]). A peer's normal finish
/// counts only when the channel that carries the peer's messages reports it: that channel
/// delivers what the peer sent before it finished first, while another one may hear of the
/// finish earlier (the `ib` channel connects to peers on the same node too and gets their BYE
/// before the shared-memory ring with their last messages is read). A lost peer counts from
/// any channel.
pub struct ChannelSink<'a> {
    engine: &'a mut Engine,
    channel: ChannelId,
}

impl<'a> ChannelSink<'a> {
    /// The engine as the sink of channel `channel` (what a driver hands to that channel's
    /// `progress` and `check_peers`).
    #[inline]
    pub fn new(engine: &'a mut Engine, channel: ChannelId) -> Self {
        ChannelSink { engine, channel }
    }
}

impl Sink for ChannelSink<'_> {
    #[inline]
    fn message(&mut self, from: Rank, hdr: &Header, payload: &[u8]) {
        if let Err(e) = self.engine.handle_message(from, hdr, payload) {
            self.engine.handle_peer_lost(from, e);
        }
    }

    #[inline]
    fn completed(&mut self, op: OpId, result: Result<()>) {
        self.engine.op_done(op, result);
    }

    fn peer_lost(&mut self, peer: Rank, why: Error) {
        let carrier = self.engine.route(peer).map(|r| r.am);
        if matches!(why, Error::PeerFinished { .. }) && carrier.is_some_and(|am| am != self.channel) {
            return;
        }
        self.engine.handle_peer_lost(peer, why);
    }
}

#[cfg(test)]
mod tests;

/// Shorthands of the getters for the scenario tests.
#[cfg(test)]
impl Engine {
    pub(crate) fn is_done(&self, req: ReqId) -> bool {
        self.phase(req).is_done()
    }
    /// `Some(true)` withdrawn, `None` still posted, `Some(false)` not withdrawn.
    pub(crate) fn cancel_outcome(&self, req: ReqId) -> Option<bool> {
        match self.phase(req) {
            ReqPhase::Withdrawn => Some(true),
            ReqPhase::Posted => None,
            _ => Some(false),
        }
    }
    pub(crate) fn active_requests(&self) -> usize {
        self.activity().requests
    }
    pub(crate) fn running_requests(&self) -> usize {
        self.activity().running
    }
    pub(crate) fn lends_keys_to_live_peers(&self) -> bool {
        self.activity().lends_keys_to_live_peers
    }
    pub(crate) fn take_all_peer_may_write(&mut self) -> Vec<ReqId> {
        std::mem::take(&mut self.peer_may_write)
    }
    pub(crate) fn adapters(&self, peer: Rank) -> Option<&PeerAdapters> {
        Some(&self.peers.get(peer as usize)?.adapt)
    }
    pub(crate) fn rank(&self) -> Rank {
        self.me
    }
    pub(crate) fn split_timed(&self) -> bool {
        self.split_probe.is_some()
    }
    pub(crate) fn placement_from(&self) -> usize {
        self.placement_from
    }
    pub(crate) fn sink_for(&mut self, channel: ChannelId) -> ChannelSink<'_> {
        ChannelSink::new(self, channel)
    }
    pub(crate) unsafe fn recv_unexpected(
        &mut self,
        src: Source,
        tag: TagMatch,
        space: SpaceId,
        buf: RegionMut,
    ) -> Option<Status> {
        // SAFETY: forwarded to the caller.
        match unsafe { self.inline_recv(src, tag, space, buf, false) } {
            InlineRecv::Received(status) => Some(status),
            _ => None,
        }
    }
    /// [`Engine::inline_recv`] with `park`, checking first that nothing unexpected matches.
    pub(crate) unsafe fn try_park(&mut self, src: Source, tag: TagMatch, space: SpaceId, buf: RegionMut) -> bool {
        self.find_unexpected(src, tag, space.0).is_none() && self.park_recv(src, tag, space, buf)
    }

    /// Changes the adaptations' settings of a running engine (the adapters keep what they
    /// measured).
    pub(crate) fn retune(&mut self, change: impl FnOnce(&mut Tuning)) {
        change(&mut self.tuning);
        for p in &mut self.peers {
            p.adapt.retune(&self.tuning);
        }
    }
}
