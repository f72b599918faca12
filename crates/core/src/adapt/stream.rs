//! A stream of sends (no message came from the peer since the last send to it) goes eagerly up
//! to the route's stream size: both processes then copy at once, where single copy has the
//! receiver copy alone.

use super::{Adapter, Advice, Eager, Seen, SendFacts};
use crate::policy::PeerRoute;

/// Streams go eagerly (`POLYRAIL_STREAM_EAGER`); all it needs is in [`SendFacts`].
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamAdapter;

impl Adapter for StreamAdapter {
    fn observe(&mut self, _seen: Seen, _route: Option<&PeerRoute>) {}

    /// Eager unless vetoed, for a send in a stream up to the route's stream size (not one the
    /// registered-memory rule decided).
    #[inline]
    fn advise(&self, send: &SendFacts<'_>) -> Advice {
        let stream =
            send.streaming && !send.mapped && send.route.stream_eager.as_ref().is_some_and(|r| send.len <= r.upto);
        Advice { eager: stream.then_some(Eager::Unless), ..Advice::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ChannelId;
    use crate::policy::{Protocol, RouteEntry, StreamEagerRule};

    #[test]
    fn only_a_stream_up_to_the_rules_size_goes_eagerly() {
        let route = PeerRoute {
            am: ChannelId(0),
            frag: 16 << 10,
            entries: vec![RouteEntry {
                upto: usize::MAX,
                channel: ChannelId(1),
                protocol: Protocol::RndvGet,
                reason: String::new(),
            }],
            stream_eager: Some(StreamEagerRule { upto: 64 << 10, reason: String::new() }),
            placement: None,
            mapped: None,
            as_written: false,
        };
        let send = |len, streaming, mapped| {
            StreamAdapter
                .advise(&SendFacts { len, route: &route, protocol: Protocol::RndvGet, mapped, streaming })
                .eager
        };
        assert_eq!(send(32 << 10, true, false), Some(Eager::Unless));
        assert_eq!(send(32 << 10, false, false), None);
        assert_eq!(send(128 << 10, true, false), None);
        assert_eq!(send(32 << 10, true, true), None);
    }
}
