//! The engine's public vocabulary: request ids, match patterns, statuses and actions.

use crate::error::Rank;
use crate::header::Header;
use crate::policy::ChannelId;
use crate::transport::{MemHandle, OpId, PeerAccess, Region, RegionMut, RemoteKey};
use std::ops::Range;

/// Where a receive accepts messages from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Any rank (`MPI_ANY_SOURCE`).
    Any,
    /// This rank only.
    Rank(Rank),
}

impl From<Rank> for Source {
    fn from(r: Rank) -> Self {
        Source::Rank(r)
    }
}

/// A matching space (an MPI communicator's context): a message matches only receives posted in
/// its own space. Space 0 is the world's; the facade hands out the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpaceId(pub u16);

/// Which tags a receive accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TagMatch {
    /// Any tag (`MPI_ANY_TAG`).
    Any,
    /// This tag only.
    Tag(u32),
}

impl TagMatch {
    /// Whether a message with `tag` matches.
    #[inline]
    pub fn matches(self, tag: u32) -> bool {
        match self {
            TagMatch::Any => true,
            TagMatch::Tag(t) => t == tag,
        }
    }

    /// Whether some tag matches both patterns.
    pub fn overlaps(self, other: TagMatch) -> bool {
        match (self, other) {
            (TagMatch::Tag(a), TagMatch::Tag(b)) => a == b,
            _ => true,
        }
    }
}

impl From<u32> for TagMatch {
    fn from(t: u32) -> Self {
        TagMatch::Tag(t)
    }
}

/// What a completed receive (or probe) reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Sender of the message.
    pub source: Rank,
    /// Tag of the message.
    pub tag: u32,
    /// Length of the message in bytes.
    pub len: usize,
}

/// Identifies a request inside one engine. Ids are reused after the result was taken; a stale
/// id is refused (generation check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReqId(pub(crate) u32);

impl ReqId {
    pub(crate) const INDEX_BITS: u32 = 20;
    pub(crate) const INDEX_MASK: u32 = (1 << Self::INDEX_BITS) - 1;

    pub(crate) fn new(index: u32, gen: u16) -> Self {
        ReqId(index | (gen as u32 & 0xfff) << Self::INDEX_BITS)
    }
    /// A small dense number for this request, unique among live requests (for side tables).
    pub fn slot(self) -> usize {
        self.index()
    }
    pub(crate) fn index(self) -> usize {
        (self.0 & Self::INDEX_MASK) as usize
    }
    pub(crate) fn gen(self) -> u16 {
        (self.0 >> Self::INDEX_BITS) as u16
    }
    /// The id as it travels in headers (never 0).
    pub(crate) fn wire(self) -> u32 {
        self.0.wrapping_add(1)
    }
    pub(crate) fn from_wire(w: u32) -> Option<Self> {
        w.checked_sub(1).map(ReqId)
    }
    /// The request an operation id (from an [`Action`]) belongs to.
    pub fn from_op(op: OpId) -> Option<Self> {
        split_op(op).map(|(id, _)| id)
    }
}

/// What an [`OpId`] reports back to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum OpKind {
    /// A send whose payload points into the user buffer left the process.
    Sent = 1,
    /// The request's own one-sided copy finished.
    Copy = 2,
    /// The request's buffer was registered.
    Exposed = 3,
}

pub(crate) fn op_id(req: ReqId, kind: OpKind) -> OpId {
    (req.0 as u64) << 8 | kind as u64
}

pub(crate) fn split_op(op: OpId) -> Option<(ReqId, OpKind)> {
    let kind = match op & 0xff {
        1 => OpKind::Sent,
        2 => OpKind::Copy,
        3 => OpKind::Exposed,
        _ => return None,
    };
    Some((ReqId((op >> 8) as u32), kind))
}

/// What became of the channel work of an [`Action`] that named an [`OpId`]
/// (`Engine::handle_op`).
#[derive(Debug)]
pub enum OpOutcome {
    /// A [`Action::Send`] left the process.
    Sent,
    /// An [`Action::Register`] finished: the registration, or why not. Report it before
    /// polling the next action: what follows from the key takes the registration's place in
    /// the action order (so an RTS keeps its message's place among the sends to its peer).
    Registered(crate::Result<MemHandle>),
    /// A [`Action::Put`] answered [`Issued::Ordered`](crate::Issued::Ordered): when the
    /// request's notice to the peer goes over the same channel it cannot overtake the data, so
    /// the put counts as done now (its completion, when it comes, is then ignored).
    Ordered,
    /// A [`Action::Get`] or [`Action::Put`] finished.
    Done(crate::Result<()>),
}

/// Payload of a send action.
#[derive(Clone, Copy, Debug)]
pub enum Payload {
    /// No payload.
    Empty,
    /// Bytes of a user buffer (valid until the engine is told the send happened).
    User(Region),
    /// A remote key.
    Key(RemoteKey),
}

/// Work the engine asks its driver to do on a channel. Drained with `Engine::poll_action`.
#[derive(Debug)]
pub enum Action {
    /// Send an active message. When `op` is set, report `OpOutcome::Sent` once it left
    /// (the payload then points into a user buffer). Sends to one peer must leave in order:
    /// if one would block, later ones to the same peer queue behind it.
    Send {
        /// Channel to use.
        channel: ChannelId,
        /// Destination.
        to: Rank,
        /// Header to encode.
        hdr: Header,
        /// Payload.
        payload: Payload,
        /// Completion to report, if any.
        op: Option<OpId>,
    },
    /// Register a request's buffer for one transfer ([`crate::Lifetime::Transfer`]); report
    /// the handle with `OpOutcome::Registered`.
    Register {
        /// Channel to register on.
        channel: ChannelId,
        /// Memory.
        region: Region,
        /// Whether peers read or write it.
        access: PeerAccess,
        /// Completion to report.
        op: OpId,
    },
    /// End a registration made for a request that finished. Execute it before the request's
    /// result is shown to the user: the channel may copy what the peer wrote into place.
    Deregister {
        /// Channel it was registered on.
        channel: ChannelId,
        /// The registration.
        handle: MemHandle,
        /// The part of the memory the peer wrote (empty for sources and failed requests).
        written: Range<usize>,
    },
    /// Read `into.len` bytes at `offset` of the peer's memory named by `key`; report with
    /// `OpOutcome::Done`.
    Get {
        /// Channel.
        channel: ChannelId,
        /// Owner of the memory.
        peer: Rank,
        /// Its key.
        key: RemoteKey,
        /// Offset into it.
        offset: usize,
        /// Destination.
        into: RegionMut,
        /// Completion to report.
        op: OpId,
    },
    /// Write `from` at `offset` of the peer's memory named by `key`; report with
    /// `OpOutcome::Done`.
    Put {
        /// Channel.
        channel: ChannelId,
        /// Owner of the memory.
        peer: Rank,
        /// Source.
        from: Region,
        /// Its key.
        key: RemoteKey,
        /// Offset into it.
        offset: usize,
        /// Completion to report.
        op: OpId,
    },
}
