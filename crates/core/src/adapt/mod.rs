//! Run-time adaptations: small per-peer state machines that watch what the channels and the
//! protocol see of one peer and advise on the protocol of the next send to it. The route table
//! ([`crate::policy::PeerRoute`]) gives each size its channel and protocol; an adapter only moves
//! a send between eager and single copy, and only where the route's rules allow it.
//!
//! Every adapter has one interface, [`Adapter`]: [`Adapter::observe`] takes in what was seen
//! ([`Seen`]) and [`Adapter::advise`] answers for one send ([`SendFacts`] → [`Advice`]). The
//! engine keeps one [`PeerAdapters`] per peer and folds their advice with [`Advice::merge`];
//! each adapter is tested alone in its module.
//!
//! - [`PlacementAdapter`]: where the peer's core sits (near, middle, apart) and whether copies
//!   to it run slowly (`POLYRAIL_NEAR_EAGER`, `POLYRAIL_APART_SINGLE_COPY`);
//! - [`SkewAdapter`]: skew feedback, both sides (`POLYRAIL_SKEW`, Chai §6.3.2);
//! - [`StreamAdapter`]: a stream of sends goes eagerly (`POLYRAIL_STREAM_EAGER`).
//!
//! The split share's search (`POLYRAIL_SPLIT_SHARE`) and the polling priority
//! (`POLYRAIL_POLL`) adapt too, but decide a split point and a polling order rather than a
//! protocol: they live beside the engine's split protocol and in the driver.

mod placement;
mod skew;
mod stream;

pub use placement::PlacementAdapter;
pub use skew::SkewAdapter;
pub use stream::StreamAdapter;

use crate::config::SkewPolicy;
use crate::observe::Observation;
use crate::policy::{ChannelId, PeerRoute, Protocol};

/// What an adapter may be told about its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A channel's observation of the peer ([`crate::Transport::observe`]).
    Channel(Observation),
    /// The peer said that it lags behind our messages (`true`) or caught up (`false`).
    PeerLags(bool),
    /// A new route was set for the peer.
    Route,
}

/// What an adapter knows of one send when it advises on it.
#[derive(Clone, Copy, Debug)]
pub struct SendFacts<'a> {
    /// Message length in bytes.
    pub len: usize,
    /// The peer's route table.
    pub route: &'a PeerRoute,
    /// The protocol the route table (and its registered-memory rule) chose.
    pub protocol: Protocol,
    /// The message lies in registered memory the peer maps, and the route's registered-memory
    /// rule decided it ([`crate::policy::MappedRule`]): adapters that move sends between eager
    /// and single copy leave it alone.
    pub mapped: bool,
    /// No message came from the peer since our last send to it.
    pub streaming: bool,
}

/// How strongly an adapter asks for an eager send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Eager {
    /// Eager unless another adapter vetoes it ([`Advice::veto_eager`]).
    Unless,
    /// Eager whatever the others say (a lagging receiver: waiting for it costs more).
    Always,
}

/// What the adapters say of one send; [`Advice::default`] says nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Advice {
    /// An eager send goes by single copy on this channel instead.
    pub single_copy: Option<ChannelId>,
    /// A single-copy send goes eagerly instead.
    pub eager: Option<Eager>,
    /// No [`Eager::Unless`] advice applies.
    pub veto_eager: bool,
}

impl Advice {
    /// Both advices together: the first single-copy channel, the stronger eager advice, any
    /// veto.
    #[inline]
    pub fn merge(self, other: Advice) -> Advice {
        Advice {
            single_copy: self.single_copy.or(other.single_copy),
            eager: self.eager.max(other.eager),
            veto_eager: self.veto_eager || other.veto_eager,
        }
    }

    /// The protocol and channel of a send that the route table gave `(protocol, channel)`,
    /// with `am` the peer's active-message channel.
    #[inline]
    pub fn apply(self, protocol: Protocol, channel: ChannelId, am: ChannelId) -> (Protocol, ChannelId) {
        let (mut protocol, mut channel) = (protocol, channel);
        if let Some(ch) = self.single_copy.filter(|_| protocol == Protocol::Eager) {
            (protocol, channel) = (Protocol::RndvGet, ch);
        }
        let eager = match self.eager {
            Some(Eager::Always) => true,
            Some(Eager::Unless) => !self.veto_eager,
            None => false,
        };
        if protocol.is_one_sided() && eager {
            (protocol, channel) = (Protocol::Eager, am);
        }
        (protocol, channel)
    }
}

/// The one interface of the run-time adaptations.
pub trait Adapter {
    /// Takes in something seen of the peer.
    fn observe(&mut self, seen: Seen, route: Option<&PeerRoute>);
    /// What it says of a send to the peer.
    fn advise(&self, send: &SendFacts<'_>) -> Advice;
}

/// The settings the adapters of every peer share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Whether every rank of this machine has a CPU of its own (see
    /// [`PlacementAdapter`]).
    pub own_cpus: bool,
    /// Skew feedback, or `None` for none (`POLYRAIL_SKEW`).
    pub skew: Option<SkewPolicy>,
    /// The receiver's share of split messages (`POLYRAIL_SPLIT_SHARE`).
    pub split_share: crate::config::SplitShare,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { own_cpus: true, skew: None, split_share: crate::config::SplitShare::Auto }
    }
}

impl Tuning {
    /// The adapters' settings in `config`, for a process that has a CPU of its own or not.
    pub fn from_config(config: &crate::Config, own_cpus: bool) -> Tuning {
        Tuning { own_cpus, skew: config.skew, split_share: config.split_share }
    }
}

/// The adapters of one peer.
#[derive(Clone, Debug)]
pub struct PeerAdapters {
    /// Where the peer's core sits.
    pub placement: PlacementAdapter,
    /// Skew feedback.
    pub skew: SkewAdapter,
    /// Streams go eagerly.
    pub stream: StreamAdapter,
}

impl PeerAdapters {
    /// A peer's adapters under `tuning`.
    pub fn new(tuning: &Tuning) -> Self {
        PeerAdapters {
            placement: PlacementAdapter::new(tuning.own_cpus),
            skew: SkewAdapter::new(tuning.skew),
            stream: StreamAdapter,
        }
    }

    /// Tells every adapter.
    pub fn observe(&mut self, seen: Seen, route: Option<&PeerRoute>) {
        self.placement.observe(seen, route);
        self.skew.observe(seen, route);
        self.stream.observe(seen, route);
    }

    /// Takes new settings, keeping what was measured.
    #[cfg(test)]
    pub(crate) fn retune(&mut self, tuning: &Tuning) {
        self.placement.own_cpus = tuning.own_cpus;
        self.skew.policy = tuning.skew;
    }

    /// Every adapter's advice, merged.
    #[inline]
    pub fn advise(&self, send: &SendFacts<'_>) -> Advice {
        self.placement.advise(send).merge(self.skew.advise(send)).merge(self.stream.advise(send))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ChannelId;

    #[test]
    fn a_veto_stops_weak_eager_advice_but_not_strong() {
        let weak = Advice { eager: Some(Eager::Unless), ..Advice::default() };
        let veto = Advice { veto_eager: true, ..Advice::default() };
        let strong = Advice { eager: Some(Eager::Always), ..Advice::default() };
        let get = (Protocol::RndvGet, ChannelId(1));
        assert_eq!(weak.apply(get.0, get.1, ChannelId(0)), (Protocol::Eager, ChannelId(0)));
        assert_eq!(weak.merge(veto).apply(get.0, get.1, ChannelId(0)), get);
        assert_eq!(weak.merge(veto).merge(strong).apply(get.0, get.1, ChannelId(0)), (Protocol::Eager, ChannelId(0)));
        assert_eq!(
            Advice::default().apply(Protocol::Eager, ChannelId(0), ChannelId(0)),
            (Protocol::Eager, ChannelId(0))
        );
    }

    #[test]
    fn single_copy_advice_moves_eager_sends_only_and_eager_advice_can_move_them_back() {
        let copy = Advice { single_copy: Some(ChannelId(2)), ..Advice::default() };
        assert_eq!(copy.apply(Protocol::Eager, ChannelId(0), ChannelId(0)), (Protocol::RndvGet, ChannelId(2)));
        assert_eq!(copy.apply(Protocol::RndvSplit, ChannelId(1), ChannelId(0)), (Protocol::RndvSplit, ChannelId(1)));
        let both = copy.merge(Advice { eager: Some(Eager::Unless), ..Advice::default() });
        assert_eq!(both.apply(Protocol::Eager, ChannelId(0), ChannelId(0)), (Protocol::Eager, ChannelId(0)));
    }
}
