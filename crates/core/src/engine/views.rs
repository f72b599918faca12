//! What the engine's getters answer: small values and views, each answering one question.

use super::{Engine, Source, SpaceId, Status};
use crate::adapt::PeerAdapters;
use crate::error::{Error, Rank};
use crate::policy::PeerRoute;

/// Where a request stands ([`Engine::phase`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqPhase {
    /// A send, or a receive that a message matched, still running.
    Running,
    /// A receive that no message matched yet (also while its withdrawal is asked).
    Posted,
    /// Ended: its result waits for [`Engine::take_result`]. Also said of an id the engine no
    /// longer knows (its result was taken, it was discarded, or the id is stale).
    Done,
    /// Withdrawn by [`Engine::cancel_recv`] before any message matched it: its result is an
    /// error; [`Engine::discard`] it.
    Withdrawn,
}

impl ReqPhase {
    /// Whether it ended: its result can be taken (or it is unknown).
    #[inline]
    pub fn is_done(self) -> bool {
        matches!(self, ReqPhase::Done | ReqPhase::Withdrawn)
    }
}

/// The engine's requests at a glance ([`Engine::activity`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Requests not yet forgotten (running, or finished with their result not taken).
    pub requests: usize,
    /// Requests still running (a failed receive whose own read is in flight counts).
    pub running: usize,
    /// Whether a peer that is still alive holds the key of a running receive (so it may yet
    /// write into that receive's buffer): ending the receive now, e.g. because the process
    /// manager has gone, would hand back a buffer that peer can still write.
    pub lends_keys_to_live_peers: bool,
    /// Whether a one-sided read into a receive's buffer is still in flight (a channel may still
    /// write there, also for a request that failed or was discarded).
    pub copies_in_flight: bool,
}

/// What a probe found ([`Engine::probe`]).
pub struct Probe<'a> {
    pub(super) engine: &'a Engine,
    pub(super) src: Source,
    pub(super) space: SpaceId,
    /// The status of the first unexpected message matching, if one is here.
    pub found: Option<Status>,
}

impl Probe<'_> {
    /// The loss of a sender the probe looks at, if one was lost (or lost for breaking the
    /// protocol; not a finish): the named rank, or for [`Source::Any`] the first lost rank that
    /// may send in the space. A probe finding nothing may wait for a message the loss took.
    pub fn lost(&self) -> Option<Error> {
        self.engine.lost_sender(self.src, self.space)
    }

    /// Why nothing can ever match, if nothing can: the named rank is gone (finished or lost),
    /// or, for [`Source::Any`], every other rank that may send in the space is.
    pub fn never(&self) -> Option<Error> {
        match self.src {
            Source::Rank(r) => self.engine.peer_error(r),
            Source::Any => self.engine.all_others_gone_in(self.space).then(|| {
                Error::InvalidArgument(
                    "every other rank that may send in the space has finished or was lost: an ANY_SOURCE probe can never match"
                        .into(),
                )
            }),
        }
    }
}

/// What the engine knows of one peer ([`Engine::peer`]).
pub struct PeerView<'a> {
    pub(super) engine: &'a Engine,
    pub(super) rank: Rank,
}

impl PeerView<'_> {
    /// Why the peer can no longer be used (finished, lost, or broke the protocol), if it cannot.
    pub fn error(&self) -> Option<Error> {
        self.engine.peer_error(self.rank)
    }

    /// Whether the peer is gone (finished, lost, or broke the protocol).
    pub fn is_gone(&self) -> bool {
        self.engine.peers[self.rank as usize].gone.is_some()
    }

    /// Its route table, if one was set.
    pub fn route(&self) -> Option<&PeerRoute> {
        self.engine.peers[self.rank as usize].route.as_ref()
    }

    /// The run-time adaptations' state for it.
    pub fn adapters(&self) -> &PeerAdapters {
        &self.engine.peers[self.rank as usize].adapt
    }
}
