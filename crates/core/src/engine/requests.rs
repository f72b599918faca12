//! Request records, their states, and the slab that holds them.

use super::types::{ReqId, Status, TagMatch};
use crate::error::{Error, Rank};
use crate::policy::{ChannelId, Protocol};
use crate::transport::{MemHandle, RemoteKey};
use std::ops::Range;

/// What a pending `Expose` is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExposeFor {
    /// Sender first: send the RTS with the key.
    Rts,
    /// Receiver first, split: send the RTS naming the receiver's request, then put.
    RtsAfterRtr,
    /// Receiver matched an RTS and splits: send the CTS with the key, then get.
    Cts,
    /// Receive posted first: send an RTR with the key.
    Rtr,
}

/// What a request is: the operation, with the state only that operation has. Each kind of
/// operation is one variant; its protocols live in their own modules (sends in `send.rs`,
/// receives in `recv.rs` and `incoming.rs`, both sides of the one-sided copies in
/// `rendezvous.rs`). One-sided
/// RMA operations (a put or get into a peer's window, a flush) are to be a further variant with
/// their own state and module: they share the slab, the [`ReqId`]s, the op ids and the
/// completion with sends and receives, and nothing of the send and receive paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReqKind {
    /// A send (`post_send`), and what it waits for from its receiver.
    Send(SendWait),
    /// A receive (`post_recv`), and where its matching stands.
    Recv(Matching),
}

/// What a send waits for from its receiver, besides its own packets and put (`pending`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SendWait {
    /// Nothing: an eager send, a stream whose data leaves, a receiver-first send that puts
    /// all of it, or a send whose receiver answered and reads nothing.
    Nothing,
    /// Sender first, before the receiver answered: its CTS (split, stream) or its FIN (get),
    /// or a truncation FIN, which ends the send.
    Answer,
    /// The receiver answered (a CTS, or receiver first with a split) and reads the front of
    /// the message through our key: its FIN is due.
    Fin,
}

/// Where a receive's matching stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Matching {
    /// Posted; no message matched it yet. `any_source`: posted with ANY_SOURCE (only such a
    /// receive sits in the engine's wildcard queue).
    Posted { any_source: bool },
    /// Posted, and a `Withdraw` went to its sender (see `Engine::cancel_recv`); it still matches
    /// messages until the answer comes.
    Withdrawing,
    /// The sender answered the withdrawal before any message matched: withdrawn (it failed).
    Withdrawn,
    /// A message matched it (`asked`: while its withdrawal was being asked; it ends with that
    /// message). `sender_writes`: the sender holds our key and writes its part of the buffer
    /// until its FIN (after our CTS, or receiver first with a split below the length).
    Matched { asked: bool, sender_writes: bool },
}

/// The request's own one-sided copy (a receive's get, a send's put).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OwnCopy {
    /// Not issued, or a send's put under way (nothing of this process writes a send's buffer,
    /// so a put in flight needs no tracking).
    Idle,
    /// A receive's read into its buffer was issued and has not completed (also after the
    /// request failed: the channel may still be writing the buffer).
    Reading,
    /// Reported done (an ordered put may be reported twice: the second report is ignored).
    Done,
}

/// The direction of a request, for the checks of packets that name one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    Send,
    Recv,
}

/// One request in flight. The fields below `kind` are the protocols' state that sends and
/// receives share; which of them a request uses depends on its kind and protocol.
#[derive(Debug)]
pub(super) struct Req {
    /// The operation and its own state.
    pub kind: ReqKind,
    /// Send: destination. Receive: the source named, or the matched one.
    pub peer: Rank,
    /// Send: `Tag(tag)`. Receive: the pattern, then `Tag(tag)` once matched.
    pub tag: TagMatch,
    pub ctx: u16,
    /// The user buffer (read for sends, written for receives).
    pub ptr: *mut u8,
    pub cap: usize,
    /// Message length (known for sends; for receives once matched).
    pub len: usize,
    /// Sequence id of the message (sends).
    pub seq: u32,
    /// Post order (receives), for ANY_SOURCE ordering.
    pub order: u64,
    pub protocol: Protocol,
    /// Channel of the one-sided copy.
    pub channel: ChannelId,
    /// Things still to happen before completion (packets to leave, copies, peer FINs).
    pub pending: u32,
    /// Bytes arrived (eager fragments, streamed data).
    pub received: usize,
    /// Split point of a rendezvous: the receiver copies `[0, split)`, the sender the rest.
    pub split: usize,
    /// Registration of our buffer, ended at completion (boxed, like `peer_key`: only
    /// rendezvous requests have one, and a smaller request is cheaper to make).
    pub own_key: Option<Box<MemHandle>>,
    /// Receives: the part of the buffer the peer writes through `own_key` (its put).
    pub peer_writes: Range<usize>,
    /// Our one-sided copy.
    pub copy: OwnCopy,
    /// Key of the peer's buffer.
    pub peer_key: Option<Box<RemoteKey>>,
    /// The peer's request id (wire form), once known.
    pub peer_req: u32,
    /// Receives with a receive-first hint: how many of the sender's messages the receiver had
    /// seen, how many receives posted earlier wait for the same messages, and whether the RTR
    /// went out.
    pub rtr_seq: u32,
    pub rtr_place: u32,
    pub rtr_sent: bool,
    /// An error to end with once the peer is done with our key: a receive whose own copy
    /// failed while the sender still wrote its part, or whose sender's FIN said its write
    /// failed; a send whose put failed while the receiver still read its part (see
    /// `Engine::handle_op`).
    pub deferred: Option<Box<Error>>,
    pub expose_for: Option<ExposeFor>,
    /// How it ended (the error boxed: most requests end well, and carry less).
    pub result: Option<std::result::Result<Status, Box<Error>>>,
}

// SAFETY: the raw buffer pointer is owned by the request's poster, who promised (post_send /
// post_recv safety contracts) that it stays valid; moving the engine to another thread does not
// change that.
unsafe impl Send for Req {}

impl Req {
    /// Whether a channel still acts on it: its exposure is on its way (`expose_for`) or its
    /// read into the buffer is in flight ([`OwnCopy::Reading`]). Such a request is kept when discarded.
    pub fn channel_busy(&self) -> bool {
        self.expose_for.is_some() || self.reading()
    }

    /// Whether its own read into the buffer is in flight ([`OwnCopy::Reading`]).
    #[inline]
    pub fn reading(&self) -> bool {
        self.copy == OwnCopy::Reading
    }

    /// Its direction.
    #[inline]
    pub fn dir(&self) -> Dir {
        match self.kind {
            ReqKind::Send(_) => Dir::Send,
            ReqKind::Recv(_) => Dir::Recv,
        }
    }

    /// A receive that a message matched.
    #[inline]
    pub fn matched(&self) -> bool {
        matches!(self.kind, ReqKind::Recv(Matching::Matched { .. }))
    }

    /// A receive that no message matched (posted, being withdrawn, or withdrawn).
    #[inline]
    pub fn unmatched(&self) -> bool {
        matches!(self.kind, ReqKind::Recv(m) if !matches!(m, Matching::Matched { .. }))
    }

    /// A receive posted with ANY_SOURCE that no message matched yet.
    #[inline]
    pub fn any_source(&self) -> bool {
        self.kind == ReqKind::Recv(Matching::Posted { any_source: true })
    }

    /// A receive whose withdrawal was asked and not answered (matched meanwhile or not).
    pub fn withdrawal_asked(&self) -> bool {
        matches!(self.kind, ReqKind::Recv(Matching::Withdrawing | Matching::Matched { asked: true, .. }))
    }

    /// A send whose receiver's FIN (or truncation FIN) is due ([`SendWait`]).
    #[inline]
    pub fn fin_due(&self) -> bool {
        matches!(self.kind, ReqKind::Send(SendWait::Answer | SendWait::Fin))
    }

    /// Sets what a send waits for from its receiver.
    #[inline]
    pub fn set_send_wait(&mut self, wait: SendWait) {
        debug_assert!(matches!(self.kind, ReqKind::Send(_)), "a send's state");
        self.kind = ReqKind::Send(wait);
    }

    /// A matched receive whose sender writes its part through our key until its FIN.
    #[inline]
    pub fn peer_writing(&self) -> bool {
        matches!(self.kind, ReqKind::Recv(Matching::Matched { sender_writes: true, .. }))
    }

    /// Sets whether the sender of a matched receive writes through our key.
    #[inline]
    pub fn set_peer_writing(&mut self, writes: bool) {
        match &mut self.kind {
            ReqKind::Recv(Matching::Matched { sender_writes, .. }) => *sender_writes = writes,
            _ => debug_assert!(false, "only a matched receive has a writing sender"),
        }
    }

    /// A receive that a message `(from, tag)` matched.
    #[inline]
    pub fn mark_matched(&mut self, from: Rank, tag: u32) {
        let asked = self.withdrawal_asked();
        self.kind = ReqKind::Recv(Matching::Matched { asked, sender_writes: false });
        self.peer = from;
        self.tag = TagMatch::Tag(tag);
    }

    /// A receive whose peer holds its key: an RTR that no matching send consumed yet, or a
    /// CTS whose FIN has not come.
    pub fn lends_key(&self) -> bool {
        self.dir() == Dir::Recv && self.own_key.is_some() && ((self.rtr_sent && !self.matched()) || self.peer_writing())
    }

    #[inline]
    pub fn new(dir: Dir, peer: Rank, tag: TagMatch, ctx: u16, ptr: *mut u8, cap: usize) -> Self {
        let kind = match dir {
            Dir::Send => ReqKind::Send(SendWait::Nothing),
            Dir::Recv => ReqKind::Recv(Matching::Posted { any_source: false }),
        };
        Req {
            kind,
            peer,
            tag,
            ctx,
            ptr,
            cap,
            len: 0,
            seq: 0,
            order: 0,
            protocol: Protocol::Eager,
            channel: ChannelId(0),
            pending: 0,
            received: 0,
            split: 0,
            own_key: None,
            peer_writes: 0..0,
            peer_key: None,
            peer_req: 0,
            rtr_seq: 0,
            rtr_place: 0,
            rtr_sent: false,
            copy: OwnCopy::Idle,
            deferred: None,
            expose_for: None,
            result: None,
        }
    }

    /// The tag as it goes on the wire (0 for ANY_TAG).
    pub fn tag_value(&self) -> u32 {
        match self.tag {
            TagMatch::Tag(t) => t,
            TagMatch::Any => 0,
        }
    }

    pub fn finish_ok(&mut self) {
        let status = Status { source: self.peer, tag: self.tag_value(), len: self.len };
        self.result = Some(Ok(status));
    }

    /// Whether this receive accepts a message with `tag` in `ctx`.
    #[inline]
    pub fn accepts(&self, tag: u32, ctx: u16) -> bool {
        self.ctx == ctx && self.tag.matches(tag)
    }

    /// Whether the request cannot finish without `peer`.
    pub fn needs(&self, peer: Rank) -> bool {
        self.result.is_none() && self.peer == peer && !self.any_source()
    }
}

struct Slot {
    gen: u16,
    req: Option<Req>,
}

/// A slab of requests addressed by [`ReqId`] (index + generation).
#[derive(Default)]
pub(super) struct Requests {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
}

impl Requests {
    /// Stores a new request, built in its slot (not built, then copied there: 160 bytes); its
    /// id and the request. Always inline: the common case is a pop from the free list (a
    /// receive's request costs 55 instructions less in callgrind than with a call and a copy);
    /// the slab's growth is out of line.
    #[inline(always)]
    pub fn insert(
        &mut self,
        dir: Dir,
        peer: Rank,
        tag: TagMatch,
        ctx: u16,
        ptr: *mut u8,
        cap: usize,
    ) -> (ReqId, &mut Req) {
        let Some(i) = self.free.pop() else {
            let id = self.push(Req::new(dir, peer, tag, ctx, ptr, cap));
            return (id, self.slots[id.index()].req.as_mut().expect("just stored"));
        };
        self.live += 1;
        let slot = &mut self.slots[i as usize];
        slot.gen = slot.gen.wrapping_add(1) & 0xfff;
        let req = slot.req.insert(Req::new(dir, peer, tag, ctx, ptr, cap));
        (ReqId::new(i, slot.gen), req)
    }

    /// [`Requests::insert`] into a new slot (the slab grows only to the most requests ever
    /// live at once).
    #[cold]
    #[inline(never)]
    fn push(&mut self, req: Req) -> ReqId {
        let i = self.slots.len() as u32;
        assert!(i <= ReqId::INDEX_MASK, "more than 2^20 requests in flight");
        self.live += 1;
        self.slots.push(Slot { gen: 0, req: Some(req) });
        ReqId::new(i, 0)
    }

    #[inline]
    pub fn get(&self, id: ReqId) -> Option<&Req> {
        let s = self.slots.get(id.index())?;
        if s.gen != id.gen() {
            return None;
        }
        s.req.as_ref()
    }

    #[inline]
    pub fn get_mut(&mut self, id: ReqId) -> Option<&mut Req> {
        let s = self.slots.get_mut(id.index())?;
        if s.gen != id.gen() {
            return None;
        }
        s.req.as_mut()
    }

    /// Takes the result of a finished request and forgets the request, in one lookup; `None`
    /// (and nothing changes) while it runs, while its read into the buffer is in flight, or
    /// when `id` is stale.
    #[inline]
    pub fn take_result(&mut self, id: ReqId) -> Option<std::result::Result<Status, Box<Error>>> {
        let s = self.slots.get_mut(id.index()).filter(|s| s.gen == id.gen())?;
        let result = s.req.as_mut().filter(|r| !r.reading())?.result.take()?;
        s.req = None;
        self.free.push(id.index() as u32);
        self.live -= 1;
        Some(result)
    }

    /// Forgets a request (dropping it in place).
    #[inline]
    pub fn free(&mut self, id: ReqId) {
        let Some(s) = self.slots.get_mut(id.index()) else { return };
        if s.gen != id.gen() || s.req.is_none() {
            return;
        }
        s.req = None;
        self.free.push(id.index() as u32);
        self.live -= 1;
    }

    /// Ids of every live request.
    pub fn ids(&self) -> impl Iterator<Item = ReqId> + '_ {
        self.slots.iter().enumerate().filter(|(_, s)| s.req.is_some()).map(|(i, s)| ReqId::new(i as u32, s.gen))
    }

    pub fn live(&self) -> usize {
        self.live
    }
}
