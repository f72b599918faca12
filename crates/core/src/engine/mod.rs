//! The sans-IO protocol engine.
//!
//! The engine matches messages to receives and runs the eager and rendezvous protocols. It does
//! no I/O and reads no clock. Its methods come in quinn-proto's kinds:
//! - the setter: [`Engine::set`] of a [`Setting`] (a peer's route, a space's members, memory
//!   peers map);
//! - mutators: [`Engine::post_send`] (a new message, or one [`Engine::inline_send`] prepared
//!   whose channel would block), [`Engine::post_recv`] (which may take an arrived message or
//!   park a blocking receive instead of making a request), the request-free fast path
//!   [`Engine::inline_send`], [`Engine::cancel_recv`], [`Engine::discard`], and
//!   [`Engine::finalize`] in its two steps;
//! - events: [`Engine::handle_message`] (a channel's arrivals, through [`ChannelSink`]),
//!   [`Engine::handle_op`] (what became of an action's channel work),
//!   [`Engine::handle_observation`] (a channel's, or the driver's clock),
//!   [`Engine::handle_peer_lost`];
//! - polls: [`Engine::poll_action`] (work for a channel), [`Engine::poll_parked`],
//!   [`Engine::poll_split_timing`], [`Engine::take_result`];
//! - getters, each answering one question: [`Engine::phase`], [`Engine::activity`],
//!   [`Engine::awaited_channels`], [`Engine::probe`], [`Engine::peer`],
//!   [`Engine::wants_placement`].
//!
//! After every mutator or event, call `poll_action` until it returns `None`, executing each
//! action and reporting what became of it with `handle_op` (a registration before the next
//! action is polled).
//!
//! Requests live in one slab (`requests.rs`) addressed by [`ReqId`]. Each has a kind, an enum
//! whose variants carry the state only that operation has: a send, with what it waits for from
//! its receiver (nothing, an answer to its RTS, a FIN), or a receive, with where its matching
//! stands (posted, being withdrawn, withdrawn, matched, and whether its sender writes). One-sided
//! RMA operations (a put or get on a peer's window, a flush) are to be a further kind with its
//! own state and its own module beside `send.rs` and `recv.rs`: it shares the slab, the ids, the
//! operation ids of actions ([`ReqId::from_op`]) and the completion (`phase`, `take_result`), and
//! nothing of the send and receive paths.
//!
//! Files by concern: `send.rs` (the send path), `recv.rs` (posting receives, the parked
//! receive), `incoming.rs` (arrivals and matching), `rendezvous.rs` (exposures, one-sided copies,
//! the RTS/CTS/DATA/FIN exchange), `cancel.rs` (withdrawal, discarding), `adapting.rs`
//! (observations, skew feedback, the split messages' timing), `requests.rs` (the slab and the
//! request states), `views.rs` (what getters answer), `types.rs` (ids, actions), `split_share.rs`
//! and `spare.rs`; this file holds the engine's state, its setters and getters, peer losses and
//! the end of requests.
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

mod adapting;
mod cancel;
mod incoming;
mod recv;
mod rendezvous;
mod requests;
mod send;
mod spare;
mod split_share;
mod types;
mod views;

pub use adapting::{Observed, SplitTime, SplitTiming};
pub use types::{Action, OpOutcome, Payload, ReqId, Source, SpaceId, Status, TagMatch};
pub use views::{Activity, PeerView, Probe, ReqPhase};

use crate::adapt::{PeerAdapters, Seen, Tuning};
use crate::error::{Error, Rank, Result};
use crate::header::Header;
use crate::policy::{ChannelId, ChannelSet, PeerRoute};
use crate::transport::{OpId, Region, RegionMut, RemoteKey, Sink};
use adapting::SplitProbe;
use requests::{Matching, Req, ReqKind, Requests};
use spare::SpareBuffers;
use split_share::SplitTuner;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;

/// How many past sends per peer are remembered to tell a stale `Rtr`.
const SEND_HISTORY: usize = 64;
/// Receive-first hints are sent for at most this many receives waiting for the same messages
/// from one peer, and a sender keeps at most this many hints per peer (more are dropped: a hint
/// is only an offer, the send then goes sender-first).
const MAX_RTR_PLACE: u32 = 1024;
/// Largest eager message accepted from a peer (a bigger claimed length is a protocol error).
const MAX_EAGER_LEN: u64 = crate::config::MAX_EAGER_MESSAGE as u64;

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

/// A blocking receive waiting without a request ([`Engine::post_recv`] with
/// [`RecvPath::Park`]).
struct Parked {
    from: Rank,
    tag: TagMatch,
    ctx: u16,
    buf: RegionMut,
    /// How it ended (`Done` or `Promoted`), once it did.
    end: Option<Unparked>,
}

/// How a parked receive ended ([`Engine::poll_parked`]).
#[derive(Debug)]
pub enum Unparked {
    /// It took its message (or failed) without a request.
    Done(Result<Status>),
    /// It became request `ReqId`, which the caller now waits for as for any receive.
    Promoted(ReqId),
    /// Nothing happened yet; it is withdrawn.
    Withdrawn,
}

/// A setting of the engine ([`Engine::set`]).
#[derive(Debug)]
pub enum Setting<'a> {
    /// The route table to a peer, or that no channel reaches it and why (`Err`: each channel's
    /// reason): then sends to it and receives naming it fail at once with
    /// [`Error::Unreachable`].
    Route(Rank, std::result::Result<PeerRoute, String>),
    /// Only these members (job ranks, this one among them) send in a space over some of the
    /// ranks: an ANY_SOURCE receive in it is then refused, or failed, once every other member
    /// has finished, not only once every other rank has.
    SpaceMembers(SpaceId, &'a [Rank]),
    /// The region is registered memory with a memory file, which peers' channels map (`true`),
    /// or no longer (`false`): sends from it follow the routes' [`crate::policy::MappedRule`].
    MappedMemory(Region, bool),
}

/// What [`Engine::post_send`] sends.
#[derive(Clone, Copy, Debug)]
pub enum Outgoing {
    /// A new message with this tag in this space.
    Message {
        /// Its tag.
        tag: u32,
        /// Its matching space.
        space: SpaceId,
    },
    /// A message [`Engine::inline_send`] prepared that could not leave at once (its channel
    /// would block), with the channel and header it was to leave with: it has its place in the
    /// pair's order already.
    Prepared {
        /// The channel `inline_send` gave.
        channel: ChannelId,
        /// Its header (`envelope.header(buf.len)`).
        hdr: Header,
    },
}

/// How far [`Engine::post_recv`] may go without making a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvPath {
    /// Not at all: the receive is a request.
    Request,
    /// It takes the matching message without a request when that one is here already.
    Arrived,
    /// As `Arrived`, and a blocking receive that nothing here matches may wait parked.
    Park,
}

/// What [`Engine::post_recv`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Posted {
    /// The message was here: it is in the buffer.
    Received(Status),
    /// The receive waits parked: progress until [`Engine::poll_parked`] ends it.
    Parked,
    /// The receive is this request.
    Request(ReqId),
}

/// How a request ended ([`Engine::take_result`]).
#[derive(Debug)]
pub struct Finished {
    /// Its status, or why it failed.
    pub result: Result<Status>,
    /// Whether a peer may still write into its buffer, which must then never be reused: a
    /// receive that failed while a peer that is still alive (or was lost for breaking the
    /// protocol, and may still run) held its buffer's key (an RTR no matching send consumed
    /// yet, or a CTS). That peer may yet write there (a cma exposure cannot be revoked).
    pub peer_may_write: bool,
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

/// A step of finalize ([`Engine::finalize`]): `Withdraw`, then, once the process can wait no
/// longer, `Abandon`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finalize {
    /// Withdraws every receive that has not matched a message yet: one whose RTR gave a live
    /// peer its key is cancelled as by [`Engine::cancel_recv`] (it ends when the peer answers,
    /// or with the peer's loss), the others fail at once with an error that says so. Such a
    /// receive could only keep the process waiting forever.
    Withdraw,
    /// Fails the receives whose withdrawal is still unanswered and the running ones whose key a
    /// live peer holds (an RTR or a CTS gave it to the sender): those peers may yet write their
    /// buffers.
    Abandon,
}

/// What a step of finalize did ([`Engine::finalize`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Finalized {
    /// How many receives it withdrew ([`Finalize::Withdraw`], those withdrawn through their
    /// sender too) or failed ([`Finalize::Abandon`]).
    pub receives: usize,
    /// After [`Finalize::Abandon`], every request whose buffer a peer may still write (those it
    /// failed, and earlier ones whose [`Engine::take_result`] or [`Engine::discard`] has not
    /// said so), which must never be reused; empty after [`Finalize::Withdraw`].
    pub peer_may_write: Vec<ReqId>,
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
    /// Why no channel reaches the peer ([`Setting::Route`]).
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
    /// ([`Setting::SpaceMembers`]).
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
    /// flight, until [`Engine::take_result`] or [`Engine::discard`] says so
    /// ([`Finished::peer_may_write`]).
    peer_may_write: Vec<ReqId>,
    /// Discarded requests kept until their withdrawal ends (posted, writing nothing) or their
    /// exposure lands and is ended ([`Engine::discard`]); freed after that.
    zombies: Vec<ReqId>,
    /// Smallest message a route's placement rule decides (see [`Engine::wants_placement`]);
    /// `usize::MAX` when no route has one.
    placement_from: usize,
    /// Registered memory that peers map, as address ranges sorted by start (see
    /// [`Setting::MappedMemory`]).
    mapped: Vec<Range<usize>>,
    /// The blocking receive parked by [`Engine::post_recv`], if any.
    parked: Option<Parked>,
    /// Buffers of unexpected eager messages already taken, for the next ones.
    spare: SpareBuffers,
    /// The split message whose time the driver measures for its peer's search, if any, and
    /// the latest split message (a message runs alone when that one has ended).
    split_probe: Option<SplitProbe>,
    last_split: Option<ReqId>,
}

impl Engine {
    /// An engine for rank `me` of a job of `size` ranks. Routes are set per peer with
    /// [`Setting::Route`]; a peer without a route is unreachable.
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

    /// Changes a setting ([`Setting`]).
    pub fn set(&mut self, setting: Setting<'_>) {
        match setting {
            Setting::Route(peer, route) => self.set_route(peer, route),
            Setting::SpaceMembers(space, members) => {
                self.members_of.insert(space.0, members.into());
            }
            Setting::MappedMemory(region, mapped) => self.set_mapped_memory(region, mapped),
        }
    }

    /// [`Setting::MappedMemory`].
    fn set_mapped_memory(&mut self, region: Region, mapped: bool) {
        let start = region.ptr as usize;
        if mapped {
            let at = self.mapped.partition_point(|r| r.start < start);
            self.mapped.insert(at, start..start + region.len);
        } else {
            self.mapped.retain(|r| *r != (start..start + region.len));
        }
    }

    /// What the engine knows of job rank `peer`: its route, adapters and whether it is gone;
    /// an error naming `peer` if it is no rank of the job.
    pub fn peer(&self, peer: Rank) -> Result<PeerView<'_>> {
        if (peer as usize) < self.peers.len() {
            return Ok(PeerView { engine: self, rank: peer });
        }
        Err(Error::InvalidArgument(format!("rank {peer} is out of range (job size {})", self.peers.len())))
    }

    /// [`Setting::Route`].
    fn set_route(&mut self, peer: Rank, route: std::result::Result<PeerRoute, String>) {
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

    /// Takes how a finished request ended and forgets it; `None` while it runs. A receive that
    /// failed while a peer held its buffer's key says whether that peer may still write there
    /// ([`Finished::peer_may_write`]); this is the only time it is said.
    #[inline]
    pub fn take_result(&mut self, req: ReqId) -> Option<Finished> {
        let result = self.reqs.take_result(req)?;
        let peer_may_write = result.is_err() && self.take_may_write(req);
        Some(Finished { result: result.map_err(|e| *e), peer_may_write })
    }

    /// Whether a peer may still write into the buffer of `req`, a request that ended (its
    /// result taken, or discarded): a receive that failed, or was discarded, while a peer that
    /// is still alive (or was lost for breaking the protocol, and may still run) held its
    /// buffer's key (an RTR no matching send consumed yet, or a CTS; for a discarded one,
    /// until the peer answers its withdrawal). That peer may yet write there (a cma exposure
    /// cannot be revoked), so the memory must never be reused. Likewise a receive discarded
    /// while its own read into the buffer was in flight (a wait that gave up): the channel may
    /// still place the data there. Answers once per request.
    #[inline]
    fn take_may_write(&mut self, req: ReqId) -> bool {
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

    // ---- events (the others: handle_message in incoming.rs, handle_op in rendezvous.rs,
    // handle_observation in adapting.rs) ------------------------------------------------

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
    pub(crate) fn parked_settled(&self) -> bool {
        self.parked.as_ref().is_none_or(|p| p.end.is_some())
    }
    pub(crate) fn unpark(&mut self) -> Unparked {
        self.poll_parked(true).expect("given up")
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
    /// [`Engine::post_recv`]'s taking of an arrived message, without the request otherwise.
    pub(crate) unsafe fn recv_unexpected(
        &mut self,
        src: Source,
        tag: TagMatch,
        space: SpaceId,
        buf: RegionMut,
    ) -> Option<Status> {
        let (from, i) = self.find_unexpected(src, tag, space.0)?;
        // SAFETY: forwarded to the caller.
        unsafe { self.take_unexpected(src, from, i, buf) }
    }
    /// [`Engine::post_recv`]'s parking, checking first that nothing unexpected matches.
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
