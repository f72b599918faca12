//! Skew feedback (Chai §6.3.2): a receiver whose receives keep finding the sender's messages
//! already there lags; told so, the sender sends medium messages eagerly, which complete at
//! once, instead of by single copy, which waits for the receiver.

use super::{Adapter, Advice, Eager, Seen, SendFacts};
use crate::config::SkewPolicy;
use crate::observe::Observation;
use crate::policy::PeerRoute;

/// Skew feedback with one peer, as its receiver and as its sender.
#[derive(Clone, Debug, Default)]
pub struct SkewAdapter {
    /// `None`: skew feedback is off.
    pub(super) policy: Option<SkewPolicy>,
    /// Receives in a row that found the peer's messages waiting unlike what it was told.
    lag_streak: u32,
    /// What the peer was told last: that we lag.
    told_lagging: bool,
    /// Messages of the peer the driver saw unread in a channel before the next receive.
    unread_hint: usize,
    /// The peer said it lags behind our messages.
    peer_lags: bool,
}

impl SkewAdapter {
    /// Skew feedback under `policy` (`None`: off).
    pub fn new(policy: Option<SkewPolicy>) -> Self {
        SkewAdapter { policy, ..Self::default() }
    }

    /// Whether the peer said it lags (so medium messages to it go eagerly).
    pub fn peer_lags(&self) -> bool {
        self.peer_lags
    }

    /// How many of the peer's messages a channel said wait unread, once (the next receive
    /// counts them).
    #[inline]
    pub fn take_unread(&mut self) -> usize {
        std::mem::take(&mut self.unread_hint)
    }

    /// A receive naming the peer is posted and `waiting` of its messages wait for it: the
    /// receiver lags when they are more than the policy's limit. After the policy's window
    /// of receives in a row that say otherwise than the peer was told, tell it: `Some(lags)`.
    #[inline]
    pub fn note_receive(&mut self, waiting: usize) -> Option<bool> {
        let k = self.policy?;
        let lagging_now = waiting > k.limit;
        if lagging_now == self.told_lagging {
            self.lag_streak = 0;
            return None;
        }
        self.changing(lagging_now, k.window)
    }

    /// The rare half of [`SkewAdapter::note_receive`], out of the receive path.
    #[cold]
    #[inline(never)]
    fn changing(&mut self, lagging_now: bool, window: u32) -> Option<bool> {
        self.lag_streak = self.lag_streak.saturating_add(1);
        if self.lag_streak < window {
            return None;
        }
        self.lag_streak = 0;
        self.told_lagging = lagging_now;
        Some(lagging_now)
    }
}

impl Adapter for SkewAdapter {
    /// The peer's word that it lags; a channel's word that messages of the peer wait unread.
    #[inline]
    fn observe(&mut self, seen: Seen, _route: Option<&PeerRoute>) {
        match seen {
            Seen::PeerLags(lags) => self.peer_lags = lags,
            Seen::Channel(Observation::Unread(unread)) => self.unread_hint = unread as usize,
            _ => {}
        }
    }

    /// Eager whatever else is said, up to the policy's size, while the peer lags (not over a
    /// route taken as written).
    #[inline]
    fn advise(&self, send: &SendFacts<'_>) -> Advice {
        let lagging =
            self.peer_lags && !send.route.as_written && self.policy.is_some_and(|k| send.len <= k.eager_up_to);
        Advice { eager: lagging.then_some(Eager::Always), ..Advice::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ChannelId;
    use crate::policy::{Protocol, RouteEntry};

    fn facts(route: &PeerRoute, len: usize) -> SendFacts<'_> {
        SendFacts { len, route, protocol: Protocol::RndvGet, mapped: false, streaming: false }
    }

    const POLICY: SkewPolicy = SkewPolicy { limit: 0, window: 3, eager_up_to: 64 << 10 };

    #[test]
    fn the_peer_is_told_after_a_window_of_receives_in_a_row() {
        let mut a = SkewAdapter::new(Some(POLICY));
        assert_eq!([a.note_receive(1), a.note_receive(1), a.note_receive(0)], [None, None, None]);
        assert_eq!([a.note_receive(2), a.note_receive(1), a.note_receive(1)], [None, None, Some(true)]);
        assert_eq!(a.note_receive(1), None, "told already");
        assert_eq!([a.note_receive(0), a.note_receive(0), a.note_receive(0)], [None, None, Some(false)]);
        let mut off = SkewAdapter::new(None);
        assert!((0..10).all(|_| off.note_receive(5).is_none()));
    }

    #[test]
    fn a_lagging_peer_gets_medium_messages_eagerly_unless_the_route_is_as_written() {
        let mut route = PeerRoute {
            am: ChannelId(0),
            frag: 16 << 10,
            entries: vec![RouteEntry {
                upto: usize::MAX,
                channel: ChannelId(1),
                protocol: Protocol::RndvGet,
                reason: String::new(),
            }],
            stream_eager: None,
            placement: None,
            mapped: None,
            as_written: false,
        };
        let mut a = SkewAdapter::new(Some(POLICY));
        assert_eq!(a.advise(&facts(&route, 32 << 10)).eager, None);
        a.observe(Seen::PeerLags(true), Some(&route));
        assert_eq!(a.advise(&facts(&route, 32 << 10)).eager, Some(Eager::Always));
        assert_eq!(a.advise(&facts(&route, 128 << 10)).eager, None, "beyond eager_up_to");
        route.as_written = true;
        assert_eq!(a.advise(&facts(&route, 32 << 10)).eager, None);
        a.observe(Seen::Channel(Observation::Unread(true)), None);
        assert_eq!((a.take_unread(), a.take_unread()), (1, 0));
    }
}
