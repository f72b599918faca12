//! Where the peer's core sits, measured at run time: near (sharing a cache close by), two
//! copies through shared memory stay in that cache where the kernel's single copy is slow;
//! apart (sharing none), every line the send cells move crosses between the caches and single
//! copy pays from a smaller size. The route's [`PlacementRule`] says which sizes move.

use super::{Adapter, Advice, Eager, Seen, SendFacts};
use crate::observe::{LineSamples, Observation, Placement, LOCAL_NS};
use crate::policy::{PeerRoute, PlacementRule};

/// The placement of one peer's core and the speed of copies to it.
#[derive(Clone, Debug, Default)]
pub struct PlacementAdapter {
    /// The verdict (`None`: not yet).
    placement: Option<Placement>,
    samples: LineSamples,
    /// Whether the channel measured its copies to the peer slow lately.
    copies_slow: bool,
    /// Messages whose protocol the placement decides since the last line was timed.
    unsampled: u8,
    /// Whether every rank of this machine has a CPU of its own. Then a line sample as fast as
    /// a local load is a prefetch's doing and not counted ([`LOCAL_NS`]), and the channels'
    /// verdicts on their copies change routes. Ranks that share a CPU share its caches (such
    /// samples are real: counting them keeps a pair on one core near), and a shared core
    /// slows their copies for other reasons while single copy waits for the receiver to be
    /// scheduled.
    pub(super) own_cpus: bool,
}

impl PlacementAdapter {
    /// A peer not measured yet.
    pub fn new(own_cpus: bool) -> Self {
        PlacementAdapter { own_cpus, ..Self::default() }
    }

    /// Where the peer's core was last measured (or given) to be; `None`: not yet.
    pub fn placement(&self) -> Option<Placement> {
        self.placement
    }

    /// Whether copies to the peer run slowly lately.
    pub fn copies_slow(&self) -> bool {
        self.copies_slow
    }

    /// What the placement says of a `len`-byte message over `route`: eager (`Some(true)`),
    /// single copy (`Some(false)`), or nothing (`None`: the route table decides). Near,
    /// messages up to the rule's `near_upto` go eagerly (from its `apart_from` by single copy
    /// while copies run slowly); apart, messages from its `apart_from` go by single copy and
    /// smaller ones eagerly (also above the table's threshold); in the middle, the table
    /// decides. The receiver asks it too, to foresee what the sender does.
    #[inline]
    pub fn says_eager(&self, route: &PeerRoute, len: usize) -> Option<bool> {
        let rule = route.placement.as_ref()?;
        match self.placement? {
            Placement::Near if self.copies_slow && rule.apart_from.is_some_and(|from| len >= from) => Some(false),
            Placement::Near => rule.near_upto.filter(|&upto| len <= upto).map(|_| true),
            Placement::Middle => None,
            Placement::Apart => rule.apart_from.map(|from| len < from),
        }
    }

    /// Whether to time a line transfer from the peer before a send of `len` bytes to it, or a
    /// receive of at most `len` bytes from it: on every [`PlacementRule::SAMPLE_EVERY`]-th
    /// message whose protocol the placement decides.
    pub fn wants_sample(&mut self, route: &PeerRoute, len: usize) -> bool {
        let Some(rule) = route.placement.as_ref().filter(|r| r.given.is_none()) else { return false };
        let one_sided = route.lookup(len).protocol.is_one_sided();
        let near_decides = one_sided && rule.near_upto.is_some_and(|upto| len <= upto);
        let apart_decides = rule.apart_from.is_some_and(|from| one_sided == (len < from));
        if !(near_decides || apart_decides) {
            return false;
        }
        self.unsampled = self.unsampled.wrapping_add(1);
        self.unsampled % PlacementRule::SAMPLE_EVERY == 1
    }
}

impl Adapter for PlacementAdapter {
    /// A line transfer sets or changes the verdict by seven of the latest nine samples in one
    /// band ([`LineSamples`]); copies running slowly count while every rank has a CPU of its
    /// own; a new route with a given placement (`POLYRAIL_PLACEMENT`) sets it.
    fn observe(&mut self, seen: Seen, route: Option<&PeerRoute>) {
        let rule = route.and_then(|r| r.placement.as_ref());
        match seen {
            Seen::Route => {
                if let Some(given) = rule.and_then(|r| r.given) {
                    self.placement = Some(given);
                }
            }
            Seen::Channel(Observation::LineTransfer(ns)) => {
                if rule.is_none_or(|r| r.given.is_some()) || (ns <= LOCAL_NS && self.own_cpus) {
                    return;
                }
                if let Some(placement) = self.samples.note(ns) {
                    self.placement = Some(placement);
                }
            }
            Seen::Channel(Observation::CopiesSlow(slow)) if self.own_cpus => self.copies_slow = slow,
            _ => {}
        }
    }

    /// Single copy or eager as [`PlacementAdapter::says_eager`] says (not for a message the
    /// registered-memory rule decided); while copies run slowly, no other adapter's weak eager
    /// advice from the apart size (single copy does not slow).
    #[inline]
    fn advise(&self, send: &SendFacts<'_>) -> Advice {
        let Some(rule) = send.route.placement.as_ref() else { return Advice::default() };
        let placed = if send.mapped { None } else { self.says_eager(send.route, send.len) };
        Advice {
            single_copy: (placed == Some(false)).then_some(rule.rma),
            eager: (placed == Some(true)).then_some(Eager::Unless),
            veto_eager: self.copies_slow && rule.apart_from.is_some_and(|from| send.len >= from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ChannelId;
    use crate::policy::{Protocol, RouteEntry};

    fn route(near_upto: Option<usize>, apart_from: Option<usize>, given: Option<Placement>) -> PeerRoute {
        PeerRoute {
            am: ChannelId(0),
            frag: 16 << 10,
            entries: vec![
                RouteEntry {
                    upto: (16 << 10) - 1,
                    channel: ChannelId(0),
                    protocol: Protocol::Eager,
                    reason: String::new(),
                },
                RouteEntry {
                    upto: usize::MAX,
                    channel: ChannelId(1),
                    protocol: Protocol::RndvGet,
                    reason: String::new(),
                },
            ],
            stream_eager: None,
            placement: Some(PlacementRule { near_upto, apart_from, rma: ChannelId(1), given, reason: String::new() }),
            mapped: None,
            as_written: false,
        }
    }

    fn facts(route: &PeerRoute, len: usize) -> SendFacts<'_> {
        SendFacts { len, route, protocol: route.lookup(len).protocol, mapped: false, streaming: false }
    }

    fn sample(a: &mut PlacementAdapter, route: &PeerRoute, ns: u32, times: usize) {
        for _ in 0..times {
            a.observe(Seen::Channel(Observation::LineTransfer(ns)), Some(route));
        }
    }

    #[test]
    fn near_sends_single_copy_sizes_eagerly_and_apart_sends_medium_ones_by_single_copy() {
        let r = route(Some(128 << 10), Some(8 << 10), None);
        let mut a = PlacementAdapter::new(true);
        assert_eq!(a.advise(&facts(&r, 64 << 10)), Advice::default(), "nothing measured yet");
        sample(&mut a, &r, 20, crate::observe::SAMPLES);
        assert_eq!(a.placement(), Some(Placement::Near));
        assert_eq!(a.advise(&facts(&r, 64 << 10)).eager, Some(Eager::Unless));
        assert_eq!(a.advise(&facts(&r, 256 << 10)), Advice::default(), "beyond near_upto");
        sample(&mut a, &r, 150, crate::observe::SAMPLES);
        assert_eq!(a.placement(), Some(Placement::Apart));
        assert_eq!(a.advise(&facts(&r, 8 << 10)).single_copy, Some(ChannelId(1)));
        assert_eq!(a.advise(&facts(&r, 4 << 10)).single_copy, None);
        let mapped = SendFacts { mapped: true, ..facts(&r, 8 << 10) };
        assert_eq!(a.advise(&mapped).single_copy, None, "the registered-memory rule decided it");
    }

    #[test]
    fn slow_copies_veto_eager_advice_from_the_apart_size_and_count_only_with_own_cpus() {
        let r = route(Some(128 << 10), Some(8 << 10), None);
        let mut a = PlacementAdapter::new(true);
        sample(&mut a, &r, 20, crate::observe::SAMPLES);
        a.observe(Seen::Channel(Observation::CopiesSlow(true)), Some(&r));
        let advice = a.advise(&facts(&r, 64 << 10));
        assert_eq!((advice.single_copy, advice.veto_eager), (Some(ChannelId(1)), true));
        assert!(!a.advise(&facts(&r, 4 << 10)).veto_eager);
        let mut shared = PlacementAdapter::new(false);
        shared.observe(Seen::Channel(Observation::CopiesSlow(true)), Some(&r));
        assert!(!shared.copies_slow(), "ranks sharing a CPU ignore the verdict");
    }

    #[test]
    fn prefetched_samples_count_only_when_ranks_share_a_cpu_and_a_given_placement_is_kept() {
        let r = route(Some(128 << 10), None, None);
        let mut own = PlacementAdapter::new(true);
        sample(&mut own, &r, 1, crate::observe::SAMPLES);
        assert_eq!(own.placement(), None, "a local load's time is a prefetch's doing");
        let mut shared = PlacementAdapter::new(false);
        sample(&mut shared, &r, 1, crate::observe::SAMPLES);
        assert_eq!(shared.placement(), Some(Placement::Near));
        let given = route(Some(128 << 10), None, Some(Placement::Apart));
        let mut a = PlacementAdapter::new(true);
        a.observe(Seen::Route, Some(&given));
        sample(&mut a, &given, 20, crate::observe::SAMPLES);
        assert_eq!(a.placement(), Some(Placement::Apart));
        assert!(!a.wants_sample(&given, 64 << 10), "nothing to measure");
    }

    #[test]
    fn one_in_sample_every_deciding_messages_is_timed() {
        let r = route(Some(128 << 10), None, None);
        let mut a = PlacementAdapter::new(true);
        let timed = (0..4 * PlacementRule::SAMPLE_EVERY as usize).filter(|_| a.wants_sample(&r, 64 << 10)).count();
        assert_eq!(timed, 4);
        assert!(!a.wants_sample(&r, 1024), "an eager size near_upto does not decide");
    }
}
