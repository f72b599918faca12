//! The engine's side of the run-time adaptations: observations of peers, placement samples,
//! skew feedback, and the timing of split messages for the split-share search.

use super::split_share;
use super::split_share::Trial;
use super::types::{Action, Payload, ReqId, Source};
use super::{am_of, Engine, Peer};
use crate::adapt::{Adapter, Seen};
use crate::config::SplitShare;
use crate::error::Rank;
use crate::header::{Header, PacketKind};
use crate::observe::{Observation, Placement};
use crate::policy::ChannelId;

/// What the measured placement of `p`'s core says of a message of `len` bytes
/// ([`PlacementAdapter::says_eager`](crate::adapt::PlacementAdapter::says_eager)).
#[inline]
pub(super) fn placement_says_eager(p: &Peer, len: usize) -> Option<bool> {
    p.adapt.placement.says_eager(p.route.as_ref()?, len)
}

/// A split message timed for [`SplitTuner`]: the driver starts its clock before the message's
/// first action runs and reads it once the request has ended ([`Engine::poll_split_timing`]).
#[derive(Debug)]
pub(super) struct SplitProbe {
    pub(super) id: ReqId,
    pub(super) peer: Rank,
    pub(super) trial: Trial,
    pub(super) started: bool,
    /// Another split message started before this one ended, or the driver saw the process
    /// away from the library meanwhile ([`SplitTime::Disturbed`]): its time says nothing of its
    /// share.
    pub(super) disturbed: bool,
}

/// What the driver is to do with its clock for the timed split message
/// ([`Engine::poll_split_timing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitTiming {
    /// Its share was chosen and none of its actions ran yet: start the clock.
    Start,
    /// It runs: keep the clock going (and see whether the process was away meanwhile).
    Running,
    /// It has ended: report the time since the start ([`SplitTime::Took`]) with
    /// [`Engine::handle_observation`].
    End,
}

/// What the driver's clock said of the timed split message ([`Observed::SplitTime`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitTime {
    /// The process was away from the library meanwhile: the time says nothing of the share.
    Disturbed,
    /// Nanoseconds from the start to the end.
    Took(u64),
}

/// What the driver observed ([`Engine::handle_observation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// What a channel observed of a peer ([`crate::Transport::observe`]).
    Peer(Rank, Observation),
    /// What the driver's clock said of the timed split message ([`Engine::poll_split_timing`]).
    SplitTime(SplitTime),
}

impl Engine {
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
    pub(super) fn split_timing(&mut self) -> SplitTiming {
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

    /// [`Observed::SplitTime`], what the driver's clock says of the timed split message:
    /// [`SplitTime::Disturbed`], the process spent a while outside the library (e.g. computing
    /// between `isend` and `wait`), so its time will not say what its share costs and it is no
    /// trial; or [`SplitTime::Took`], its time once [`SplitTiming::End`] came, which counts for
    /// its peer's search when it ended well and ran alone.
    #[inline(never)]
    fn split_time(&mut self, time: SplitTime) {
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
    pub(super) fn split_point(&mut self, id: ReqId, peer: Rank, len: usize) -> usize {
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

    /// Takes in what the driver observed: what a channel observed of a peer
    /// ([`Observed::Peer`]), whose adapters ([`crate::adapt`]) may send later messages to it
    /// otherwise, or what its clock said of the timed split message ([`Observed::SplitTime`]).
    #[inline]
    pub fn handle_observation(&mut self, seen: Observed) {
        let (peer, seen) = match seen {
            Observed::Peer(peer, seen) => (peer, seen),
            Observed::SplitTime(time) => return self.split_time(time),
        };
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
    pub(super) fn observe_and_log(&mut self, peer: Rank, seen: Observation) {
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
    /// [`Engine::handle_observation`] as [`Observed::Peer`]): see [`PlacementAdapter::wants_sample`](crate::adapt::PlacementAdapter::wants_sample).
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
    pub(super) fn placement_sample(&mut self, peer: Rank, len: usize) -> Option<ChannelId> {
        let p = self.peers.get_mut(peer as usize)?;
        let route = p.route.as_ref()?;
        p.adapt.placement.wants_sample(route, len).then_some(route.am)
    }

    /// Skew feedback's view of a receive being posted (or taking its message at once): how
    /// many of the named source's messages wait for it. The first message the peer sent after
    /// our last send to it does not count: it may answer that send, and in a rendezvous
    /// ping-pong it always waits (the peer's next RTS follows our DONE at once, before this
    /// receive is posted), which made skew feedback flip the protocol every WINDOW messages
    /// (Intel Xeon host, receiver-pull route forced, 16 KiB one way 2.63 µs against 1.8
    /// without skew feedback).
    #[inline]
    pub(super) fn count_receive(&mut self, src: Source) {
        if let Source::Rank(r) = src {
            let p = &mut self.peers[r as usize];
            let unread = p.adapt.skew.take_unread();
            let oldest = p.unexpected.front().map_or(p.expected_seq, |u| u.seq);
            let answer = p.last_send_at == Some(oldest) && p.unexpected.len() + unread > 0;
            let waiting = p.unexpected.len() + unread - usize::from(answer);
            self.watch_skew(r, waiting);
        }
    }

    /// Skew feedback, receiver side ([`crate::adapt::SkewAdapter`]), called when a receive
    /// naming `from` is posted and `waiting` of its messages wait unexpected or unread in the
    /// channel: tells `from` when the adapter says so.
    #[inline]
    pub(super) fn watch_skew(&mut self, from: Rank, waiting: usize) {
        if let Some(lagging_now) = self.peers[from as usize].adapt.skew.note_receive(waiting) {
            self.tell_skew(from, waiting, lagging_now);
        }
    }

    /// Sends `from` the skew packet saying that we lag (or caught up).
    #[cold]
    #[inline(never)]
    pub(super) fn tell_skew(&mut self, from: Rank, waiting: usize, lagging_now: bool) {
        tracing::debug!(
            "rank {}: receives keep finding {waiting} messages of rank {from} waiting: telling it that we {}",
            self.me,
            if lagging_now { "lag" } else { "caught up" }
        );
        let mut hdr = Header::new(PacketKind::Skew);
        hdr.offset = lagging_now as u64;
        let am = am_of(&self.peers, from);
        self.actions.push_back(Action::Send { channel: am, to: from, hdr, payload: Payload::Empty, op: None });
    }

    /// A rendezvous message from `from` met receive `id`: if that receive had sent an RTR,
    /// whether the sender `used` it says whether hints for receives behind others would pay.
    pub(super) fn learn_from_rtr(&mut self, id: ReqId, from: Rank, used: bool) {
        let Some(req) = self.reqs.get(id).filter(|r| r.rtr_sent) else { return };
        let (first, me) = (req.rtr_place == 0, self.me);
        let p = &mut self.peers[from as usize];
        let window_rtrs = match (used, first) {
            (true, true) => true,
            (false, false) => false,
            _ => return,
        };
        if p.window_rtrs != window_rtrs {
            p.window_rtrs = window_rtrs;
            tracing::debug!(
                "rank {me}: route from rank {from} changed: receives behind others {} receive-first hints",
                if window_rtrs { "send" } else { "no longer send" }
            );
        }
    }
}
