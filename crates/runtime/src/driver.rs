//! Drives the sans-IO engine: executes its actions on the channels, polls the channels, waits.

use polyrail_core::config::{PollPolicy, WaitMode};
use polyrail_core::engine::{
    Action, ChannelSink, Engine, Finished, Observed, OpOutcome, Outgoing, Payload, ReqId, Setting, SpaceId, SplitTime,
    SplitTiming, Status, Unparked,
};
use polyrail_core::observe::{says_yes, Observation, Observe};
use polyrail_core::policy::{ChannelId, ChannelSet};
use polyrail_core::{
    Caps, Error, Header, Issued, Lifetime, MemHandle, PeerAccess, Rank, Region, Result, SharedFile, Transport,
};
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// Idle polls before a waiting process that cannot sleep starts yielding its core to others.
const SPIN_BEFORE_YIELD: u64 = 2000;
/// How long an idle process polls before it sleeps with `POLYRAIL_WAIT=adaptive`. Waking a
/// sleeper costs tens of microseconds, and on a virtual machine whose vCPU went idle, up to a
/// millisecond: polling first keeps that cost off messages that follow each other closely.
const ADAPTIVE_SPIN: Duration = Duration::from_micros(200);
/// First sleep on the shared-memory doorbell while another channel (which cannot ring it, such
/// as `ib`) is polled too, or without a doorbell: an arrival there waits at most this long to be
/// seen. Each further nap of one idle stretch is twice as long, up to [`MAX_NAP`].
const NAP: Duration = Duration::from_micros(100);
/// Longest nap: a process blocked for long wakes about 500 times a second (5-10 µs of CPU each
/// on this 2-core virtual machine: 0.5 % of a core; at 1 ms it was 1 %), and an arrival then
/// waits at most this long.
const MAX_NAP: Duration = Duration::from_millis(2);
/// With `POLYRAIL_WAIT=adaptive`, how long an idle process polls before such naps: a nap may
/// add its length to a message that arrives during it, so a process waiting for replies
/// that take a while (a network round trip, a peer computing briefly) keeps polling; one idle
/// for longer is blocked for real and naps.
const SPIN_BEFORE_NAP: Duration = Duration::from_millis(10);
/// Idle polls before a waiting process sleeps with `POLYRAIL_WAIT=block`.
const SPIN_BEFORE_BLOCK: u64 = 64;
/// How often a waiting process checks that its peers are alive.
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);
/// How long waits go on once the process manager has gone while live peers hold keys of this
/// process's receives (see `Driver::check_liveness`).
const KEYS_SETTLE: Duration = Duration::from_secs(10);
/// A channel whose poll is a system call is polled when an arrival is awaited on it, and on
/// every this many rounds anyway, so that messages nobody waits for yet (and credits for
/// peers' sends) do not sit in it forever.
const SYSCALL_POLL_EVERY: u32 = 256;

/// Whether the socket `fd` was closed or shut down by its other end.
fn hung_up(fd: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut p = [PollFd::new(fd, PollFlags::RDHUP)];
    // A zero timeout: poll does not block.
    let n = poll(&mut p, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })).unwrap_or(0);
    n > 0 && p[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}

/// The engine, the channels, and the sends that could not leave yet.
pub struct Driver {
    /// The protocol engine.
    pub engine: Engine,
    /// This process's rank.
    me: Rank,
    /// A blocking receive waits parked in the engine ([`Driver::wait_parked`]): channels are
    /// polled one message at a time, so that the one it waits for returns to the caller
    /// without the channel looking for another first.
    parked: bool,
    /// The channels, indexed by channel id.
    pub channels: Vec<Box<dyn Transport>>,
    /// Channels that deliver arrivals (active messages, or completions of pending one-sided
    /// operations); the others are not polled.
    polled: Vec<usize>,
    /// The loopback channel, polled only after something was sent to this rank itself.
    loopback: Option<usize>,
    self_sent: bool,
    /// How to wait (`POLYRAIL_WAIT`).
    wait: WaitMode,
    /// The channel a waiting process sleeps on: a polled channel that can wake us.
    sleeper: Option<usize>,
    /// Per peer: actions that would have blocked, in order (later sends queue behind them).
    blocked: Vec<VecDeque<Action>>,
    blocked_peers: usize,
    /// Long-lived registrations ([`Driver::register_memory`]): each region's handle per channel.
    lasting: Vec<(Region, Vec<(usize, MemHandle)>)>,
    last_liveness: Instant,
    /// Rounds of [`Driver::poll`] so far.
    polls: u32,
    /// Polls hung up once the process manager has gone ([`Driver::watch_manager`]).
    manager: Option<OwnedFd>,
    /// When a liveness check first found the process manager gone.
    manager_gone_at: Option<Instant>,
    poll: PollPlan,
    /// Polled channels whose poll is a system call ([`Caps::POLL_IS_SYSCALL`]).
    syscall_polled: ChannelSet,
    /// Rounds since such channels were last polled whatever the engine awaits.
    syscall_skipped: u32,
    /// Poll every channel on every round (see [`Driver::probing`]).
    poll_everything: bool,
    /// When the split message the engine times started ([`Engine::poll_split_timing`]), and when
    /// the last drain since then ended.
    split_since: Instant,
    split_seen: Instant,
}

/// A timed split message during which the process spent longer than this between two drains
/// (out of the library: computing between `isend` and `wait`, or descheduled) says nothing of
/// its share: it is not a trial. Inside a wait, drains come a polling round apart.
const SPLIT_GAP: Duration = Duration::from_micros(5);

/// Largest ratio of the dynamic policy, reached while the others deliver nothing: near Chai's
/// best static ratio (50; 1000 starved the network channel).
const MAX_DYNAMIC_RATIO: u32 = 64;

/// Polling priority between channels (Chai Ch. 7, `POLYRAIL_POLL`): the primary channel is polled
/// on every round, the others on every `ratio`-th.
#[derive(Debug)]
struct PollPlan {
    policy: PollPolicy,
    /// Index in `polled` of the primary channel (lowest modelled active-message latency).
    primary: usize,
    ratio: u32,
    round: u32,
    /// Arrivals since the last recomputation: from the primary channel, from the others.
    from_primary: u32,
    from_others: u32,
}

impl PollPlan {
    fn new(policy: PollPolicy, channels: &[Box<dyn Transport>], polled: &[usize]) -> PollPlan {
        let latency = |i: usize| {
            let a = channels[polled[i]].attr();
            if a.caps.contains(Caps::AM) {
                a.am_cost.latency_ns
            } else {
                f64::INFINITY
            }
        };
        let primary = (0..polled.len()).min_by(|&a, &b| latency(a).total_cmp(&latency(b))).unwrap_or(0);
        let ratio = match policy {
            PollPolicy::All | PollPolicy::Dynamic(_) => 1,
            PollPolicy::Static(r) => r,
        };
        PollPlan { policy, primary, ratio, round: 0, from_primary: 0, from_others: 0 }
    }

    /// Whether the secondary channels are polled on this round.
    #[inline]
    fn others_due(&mut self) -> bool {
        self.round = self.round.wrapping_add(1);
        self.ratio <= 1 || self.round % self.ratio == 0
    }

    /// Counts arrivals; with a dynamic policy, recomputes the ratio every `h` arrivals.
    #[inline]
    fn count(&mut self, primary: usize, others: usize) {
        let PollPolicy::Dynamic(h) = self.policy else { return };
        self.from_primary += primary as u32;
        self.from_others += others as u32;
        if self.from_primary + self.from_others >= h {
            self.ratio = match self.from_others {
                // Chai leaves n = 0 open: poll the others half as often as before, from h + 1
                // up to MAX_DYNAMIC_RATIO, so one quiet stretch does not starve them at once.
                0 => (self.ratio.saturating_mul(2)).min(MAX_DYNAMIC_RATIO).max(h + 1),
                n => self.from_primary / n + 1,
            };
            self.from_primary = 0;
            self.from_others = 0;
        }
    }
}

/// How a receive parked in the engine ended ([`Driver::wait_parked`]).
pub enum ParkedEnd {
    /// Its message was copied in.
    Received(Status),
    /// It became this request, still to be waited for.
    Request(ReqId),
    /// It became a request, which the wait gave up and abandoned.
    Abandoned {
        /// Why the wait gave up.
        why: Error,
        /// Whether its buffer may yet be written ([`Engine::discard`]).
        peer_may_write: bool,
    },
}

impl Driver {
    /// A driver over `engine`, of rank `me` of a job of `size` ranks (as the engine was made),
    /// and `channels`, of which those in `reaching` reach another rank (the others, with no
    /// peer to deliver from, are never polled).
    pub fn new(
        engine: Engine,
        me: Rank,
        size: u32,
        channels: Vec<Box<dyn Transport>>,
        reaching: ChannelSet,
        wait: WaitMode,
        poll: PollPolicy,
    ) -> Self {
        let n = size as usize;
        let polled: Vec<usize> = channels
            .iter()
            .enumerate()
            .filter(|(i, c)| {
                let caps = c.attr().caps;
                !caps.contains(Caps::SELF_ONLY)
                    && reaching.contains(ChannelId(*i as u8))
                    && (caps.contains(Caps::AM) || !caps.contains(Caps::RMA_INLINE_COMPLETION))
            })
            .map(|(i, _)| i)
            .collect();
        let loopback = channels.iter().position(|c| c.attr().caps.contains(Caps::SELF_ONLY));
        let sleeper = polled.iter().copied().find(|&i| channels[i].attr().caps.contains(Caps::WAKEUP));
        let poll = PollPlan::new(poll, &channels, &polled);
        let mut syscall_polled = ChannelSet::EMPTY;
        for &i in polled.iter().filter(|&&i| channels[i].attr().caps.contains(Caps::POLL_IS_SYSCALL)) {
            syscall_polled.insert(ChannelId(i as u8));
        }
        Driver {
            syscall_polled,
            syscall_skipped: 0,
            poll_everything: false,
            split_since: Instant::now(),
            split_seen: Instant::now(),
            me,
            parked: false,
            poll,
            engine,
            channels,
            polled,
            loopback,
            self_sent: false,
            wait,
            sleeper,
            blocked: (0..n).map(|_| VecDeque::new()).collect(),
            blocked_peers: 0,
            lasting: Vec::new(),
            last_liveness: Instant::now(),
            polls: 0,
            manager: None,
            manager_gone_at: None,
        }
    }

    /// Has waits check `watch` ([`polyrail_pmi::Bootstrap::hangup_watch`]) with
    /// their peers: once the process manager has gone (a launcher killed with SIGKILL cannot
    /// stop its ranks), a wait fails instead of waiting for peers that may wait in turn.
    pub fn watch_manager(&mut self, watch: Option<OwnedFd>) {
        self.manager = watch;
    }

    /// Executes every action the engine has.
    #[inline]
    pub fn drain(&mut self) {
        // A timed split message starts before its first action runs and ends once its request
        // has: the clock is read here, on either side of the actions.
        if let Some(timing) = self.engine.poll_split_timing() {
            self.time_split(timing, true);
        }
        while let Some(a) = self.engine.poll_action() {
            self.execute(a);
        }
        if let Some(timing) = self.engine.poll_split_timing() {
            self.time_split(timing, false);
        }
    }

    /// Starts or reads the clock of the split message the engine times; before a drain's
    /// actions, a long gap since the last drain disturbs it ([`SPLIT_GAP`]).
    #[cold]
    fn time_split(&mut self, timing: SplitTiming, before_actions: bool) {
        let now = Instant::now();
        if before_actions && timing != SplitTiming::Start && now.duration_since(self.split_seen) > SPLIT_GAP {
            self.engine.handle_observation(Observed::SplitTime(SplitTime::Disturbed));
        }
        match timing {
            SplitTiming::Start => self.split_since = now,
            SplitTiming::End => {
                let took = SplitTime::Took(now.duration_since(self.split_since).as_nanos() as u64);
                self.engine.handle_observation(Observed::SplitTime(took));
            }
            SplitTiming::Running => {}
        }
        self.split_seen = now;
    }

    fn execute(&mut self, a: Action) {
        let peer = match &a {
            Action::Send { to, .. } => *to,
            Action::Get { peer, .. } | Action::Put { peer, .. } => *peer,
            Action::Register { channel, region, access, op } => {
                let handle = self.channels[channel.index()]
                    .one_sided()
                    .and_then(|m| m.register(*region, *access, Lifetime::Transfer));
                return self.engine.handle_op(*op, OpOutcome::Registered(handle));
            }
            Action::Deregister { channel, handle, written } => {
                if let Some(m) = self.channels[channel.index()].memory() {
                    m.deregister(handle, written.clone());
                }
                return;
            }
        };
        let q = &mut self.blocked[peer as usize];
        if !q.is_empty() {
            // Keep order: anything to a peer with blocked work queues behind it.
            q.push_back(a);
        } else if let Some(a) = self.attempt(a) {
            self.blocked[peer as usize].push_back(a);
            self.blocked_peers += 1;
        }
    }

    /// Tries a send, get or put once; gives it back when the channel would block.
    #[inline]
    fn attempt(&mut self, a: Action) -> Option<Action> {
        let (issued, op) = match &a {
            Action::Send { channel, to, hdr, payload, op } => {
                let bytes: &[u8] = match payload {
                    Payload::Empty => &[],
                    // SAFETY: the engine keeps the user buffer valid until it is told the send left.
                    Payload::User(r) => unsafe { std::slice::from_raw_parts(r.ptr, r.len) },
                    Payload::Key(k) => k.as_bytes(),
                };
                self.self_sent |= *to == self.me;
                match self.channels[channel.index()].try_send(*to, hdr, bytes) {
                    Ok(Issued::WouldBlock) => return Some(a),
                    Ok(_) => {
                        if let Some(op) = op {
                            self.engine.handle_op(*op, OpOutcome::Sent);
                        }
                    }
                    Err(e) => self.engine.handle_peer_lost(*to, e),
                }
                return None;
            }
            Action::Get { channel, peer, key, offset, into, op } => {
                (self.channels[channel.index()].one_sided().and_then(|m| m.get(*peer, key, *offset, *into, *op)), *op)
            }
            Action::Put { channel, peer, from, key, offset, op } => {
                (self.channels[channel.index()].one_sided().and_then(|m| m.put(*peer, *from, key, *offset, *op)), *op)
            }
            Action::Register { .. } | Action::Deregister { .. } => {
                self.execute(a);
                return None;
            }
        };
        match issued {
            Ok(Issued::Done) => self.engine.handle_op(op, OpOutcome::Done(Ok(()))),
            Ok(Issued::Pending) => {}
            Ok(Issued::Ordered) => self.engine.handle_op(op, OpOutcome::Ordered),
            Ok(Issued::WouldBlock) => return Some(a),
            Err(e) => self.engine.handle_op(op, OpOutcome::Done(Err(e))),
        }
        None
    }

    /// Retries blocked actions, oldest first, per peer; how many went.
    fn retry_blocked(&mut self) -> usize {
        let mut went = 0;
        for peer in 0..self.blocked.len() {
            if self.blocked[peer].is_empty() {
                continue;
            }
            if self.engine.peer(peer as Rank).is_ok_and(|p| p.is_gone()) {
                self.drop_blocked(peer, |_| true, "read dropped before it ran: its peer is gone");
                continue;
            }
            while let Some(a) = self.blocked[peer].pop_front() {
                if let Some(a) = self.attempt(a) {
                    self.blocked[peer].push_front(a);
                    break;
                }
                went += 1;
            }
            if self.blocked[peer].is_empty() {
                self.blocked_peers -= 1;
            }
        }
        went
    }

    /// Registers `region` with every channel (none keeps it when one fails) and, when it is a
    /// memory file, tells the engine that peers map it.
    pub fn register_memory(&mut self, region: Region, file: Option<SharedFile>) -> Result<()> {
        let mut handles = Vec::new();
        for i in 0..self.channels.len() {
            let Some(m) = self.channels[i].memory() else { continue };
            match m.register(region, PeerAccess::ReadWrite, Lifetime::Lasting { file }) {
                Ok(h) => handles.push((i, h)),
                Err(e) => {
                    self.deregister_all(&handles);
                    return Err(e);
                }
            }
        }
        self.lasting.push((region, handles));
        if file.is_some() {
            self.engine.set(Setting::MappedMemory(region, true));
        }
        Ok(())
    }

    /// Ends what [`Driver::register_memory`] started for `region`.
    pub fn unregister_memory(&mut self, region: Region) {
        self.engine.set(Setting::MappedMemory(region, false));
        if let Some(i) = self.lasting.iter().position(|(r, _)| r.ptr == region.ptr && r.len == region.len) {
            let (_, handles) = self.lasting.swap_remove(i);
            self.deregister_all(&handles);
        }
    }

    /// Ends registrations made on the channels they name.
    fn deregister_all(&mut self, handles: &[(usize, MemHandle)]) {
        for (i, h) in handles {
            if let Some(m) = self.channels[*i].memory() {
                m.deregister(h, 0..0);
            }
        }
    }

    /// One round: poll every channel, run the actions that follow. Returns arrivals seen.
    #[inline]
    pub fn progress(&mut self) -> Result<usize> {
        let skip = self.skipped_this_round();
        let primary = self.polled.get(self.poll.primary).copied();
        // A blocking receive waits (parked): one message at a time, so that the one it waits
        // for returns to the caller without the channel looking for another first.
        let budget = if self.parked { 1 } else { 64 };
        let mut n = match primary {
            Some(i) if !skip.contains(ChannelId(i as u8)) => {
                self.channels[i].progress(budget, &mut ChannelSink::new(&mut self.engine, ChannelId(i as u8)))?
            }
            _ => 0,
        };
        if self.polled.len() > 1 {
            let mut others = 0;
            if self.poll_everything || self.poll.others_due() {
                for &i in &self.polled {
                    if Some(i) != primary && !skip.contains(ChannelId(i as u8)) {
                        others += self.channels[i]
                            .progress(64, &mut ChannelSink::new(&mut self.engine, ChannelId(i as u8)))?;
                    }
                }
            }
            self.poll.count(n, others);
            n += others;
        }
        if self.self_sent {
            if let Some(i) = self.loopback {
                self.self_sent = false;
                n += self.channels[i]
                    .progress(usize::MAX, &mut ChannelSink::new(&mut self.engine, ChannelId(i as u8)))?;
            }
        }
        // A blocked send that went counts as progress: the wait keeps polling while room
        // comes (a ring the peer drains, a link model's pace) rather than napping between sends.
        if self.blocked_peers > 0 {
            n += self.retry_blocked();
        }
        self.drain();
        Ok(n)
    }

    /// One round of [`Driver::progress`] for a caller that polls instead of waiting (`test`,
    /// `iprobe`): every so often it also makes a wait's liveness check, so that a loop of
    /// polls notices a lost peer (its requests fail, and so finish) or a dead process manager
    /// (an error) within about 100 ms, as a wait does.
    #[inline]
    pub fn poll(&mut self) -> Result<usize> {
        let n = self.progress()?;
        // The clock read every 16th poll only (a `test` loop polls millions of times a second).
        self.polls = self.polls.wrapping_add(1);
        if self.polls % 16 == 0 && self.last_liveness.elapsed() >= LIVENESS_PERIOD {
            self.check_liveness(&mut |_: &mut Engine| false)?;
        }
        Ok(n)
    }

    /// The channels not polled on this round: those whose poll is a system call, unless an
    /// arrival is awaited on them (a receive, a rendezvous or a copy under way, a send waiting
    /// for credits), a probe is looking, or it is their periodic turn (Chai Ch. 7).
    #[inline]
    fn skipped_this_round(&mut self) -> ChannelSet {
        if self.syscall_polled.is_empty() || self.poll_everything || self.blocked_peers > 0 {
            return ChannelSet::EMPTY;
        }
        self.syscall_skipped += 1;
        if self.syscall_skipped >= SYSCALL_POLL_EVERY {
            self.syscall_skipped = 0;
            return ChannelSet::EMPTY;
        }
        self.syscall_polled.without(self.engine.awaited_channels())
    }

    /// Runs `f` polling every channel on every round, whatever the polling ratio: a probe looks
    /// for messages that no request awaits yet, a process about to sleep for arrivals.
    pub fn probing<R>(&mut self, f: impl FnOnce(&mut Driver) -> R) -> R {
        self.poll_everything = true;
        let r = f(self);
        self.poll_everything = false;
        r
    }

    /// For a wait until `done`: checks peers' liveness now, and that the process manager is
    /// still there; `true` when `done` held (the wait is over). (A wait that the check itself
    /// ended, by failing its request when the peer was found lost, reports that request's
    /// error rather than the manager's.)
    fn check_liveness(&mut self, done: &mut impl FnMut(&mut Engine) -> bool) -> Result<bool> {
        self.last_liveness = Instant::now();
        for (i, ch) in self.channels.iter_mut().enumerate() {
            ch.check_peers(&mut ChannelSink::new(&mut self.engine, ChannelId(i as u8)));
        }
        self.drain();
        if !self.manager.as_ref().is_some_and(hung_up) {
            return Ok(false);
        }
        // A live peer holding a receive's key may still write into its buffer: give it time to
        // finish (its FIN ends the receive) or to die of the same cause, rather than hand the
        // buffer back under its write. Likewise our own reads in flight (an RDMA read the
        // adapter is still placing), which complete or fail shortly.
        let gone_at = *self.manager_gone_at.get_or_insert_with(Instant::now);
        let activity = self.engine.activity();
        let writers = activity.lends_keys_to_live_peers || activity.copies_in_flight;
        if done(&mut self.engine) {
            return Ok(true);
        }
        if writers && gone_at.elapsed() < KEYS_SETTLE {
            return Ok(false);
        }
        Err(Error::Bootstrap(
            "the process manager closed its connection (it died: polyrail run, mpiexec or srun was killed?); \
             the job cannot finish"
                .into(),
        ))
    }

    /// Progresses until `done()` holds: polls, then sleeps (or naps) until arrivals, or yields
    /// the core where sleeping is not safe; checks liveness of peers periodically so that a
    /// lost peer ends the wait with an error. Once `done()` held, it is not called again.
    pub fn wait_until(&mut self, mut done: impl FnMut(&mut Engine) -> bool) -> Result<()> {
        // 64 bits: it never overflows (a saturated 32-bit count, reached after 2^32 empty polls
        // of a long spin, stuck at a value that is never a multiple of 256, which ended the
        // liveness checks and the decision to sleep for the rest of the wait).
        let mut idle = 0u64;
        // When the current idle stretch began (read every 256 idle polls, not per poll).
        let mut idle_since: Option<Instant> = None;
        // Whether this idle stretch slept already: then an empty poll goes straight back to
        // sleep (spinning and yielding between naps would take a busy process's core share).
        let mut slept = false;
        let mut nap = NAP;
        loop {
            if done(&mut self.engine) {
                return Ok(());
            }
            let mut arrived = self.progress()?;
            if arrived == 0 {
                // No pause instruction while spinning: it costs more than a poll of the rings
                // and would delay noticing an arrival. After a while, sleep until an arrival
                // rings the doorbell, or nap when no polled channel can ring it; while sleeping
                // is not safe (a send waits for credits), give the core away instead.
                idle += 1;
                let may_sleep = slept
                    || match self.wait {
                        WaitMode::Spin => false,
                        WaitMode::Block => idle > SPIN_BEFORE_BLOCK,
                        WaitMode::Adaptive => {
                            if idle % 256 == 0 && idle_since.is_none() {
                                idle_since = Some(Instant::now());
                            }
                            let spin = if self.naps() { SPIN_BEFORE_NAP } else { ADAPTIVE_SPIN };
                            idle % 256 == 0 && idle_since.is_some_and(|t| t.elapsed() >= spin)
                        }
                    };
                if !(may_sleep && self.can_sleep()) {
                    if may_sleep {
                        // Idle long enough to sleep, but a send waits for room a peer makes
                        // (which rings no doorbell), or for a message to ourselves: nap and
                        // poll between naps, so that a stopped peer costs no CPU time.
                        std::thread::sleep(nap);
                        slept = true;
                        nap = (nap * 2).min(MAX_NAP);
                    } else if idle > SPIN_BEFORE_YIELD {
                        std::thread::yield_now();
                    }
                    let due = (slept || idle % 256 == 0) && self.last_liveness.elapsed() >= LIVENESS_PERIOD;
                    if due && self.check_liveness(&mut done)? {
                        return Ok(());
                    }
                    continue;
                }
                // The polling ratio may have skipped a channel for many rounds: look at every
                // one before sleeping, or an arrival there could wait for many naps.
                arrived = self.probing(|d| d.progress())?;
                if arrived == 0 {
                    self.sleep_once(nap);
                    slept = true;
                    nap = (nap * 2).min(MAX_NAP);
                    if self.last_liveness.elapsed() >= LIVENESS_PERIOD && self.check_liveness(&mut done)? {
                        return Ok(());
                    }
                    continue;
                }
            }
            // Something arrived: a busy stretch again.
            idle = 0;
            idle_since = None;
            slept = false;
            nap = NAP;
        }
    }

    /// Before a send of `len` bytes to `to`, or a receive of up to `len` bytes from it: when
    /// its route decides by how near the peer's core is, times a cache line from the peer
    /// ([`Observe::LineTransfer`]) and tells the engine, with whether copies to the peer run
    /// slowly ([`Observe::CopiesSlow`]).
    #[inline(always)]
    pub fn note_placement(&mut self, to: Rank, len: usize) {
        // Inline: every small message (below any size a placement rule decides) stops at
        // the engine's first comparison.
        if let Some(ch) = self.engine.wants_placement(to, len) {
            self.sample_placement(to, ch);
        }
    }

    /// [`Driver::note_placement`] once the engine asked for a sample on channel `ch`.
    #[inline(never)]
    fn sample_placement(&mut self, to: Rank, ch: ChannelId) {
        let channel = &mut self.channels[ch.index()];
        for what in [Observe::LineTransfer, Observe::CopiesSlow] {
            if let Some(seen) = channel.observe(to, what) {
                self.engine.handle_observation(Observed::Peer(to, seen));
            }
        }
    }

    /// Before a receive of up to `len` bytes naming `peer` is posted: the skew hint
    /// ([`Driver::note_unread`]) and the placement sample ([`Driver::note_placement`]).
    #[inline]
    pub fn before_recv(&mut self, peer: Rank, len: usize) {
        self.note_unread(peer);
        self.note_placement(peer, len);
    }

    /// Before a receive naming `peer` is posted: tells the engine whether a message of `peer`
    /// already waits unread in a channel (skew feedback).
    #[inline]
    pub fn note_unread(&mut self, peer: Rank) {
        let channels = &mut self.channels;
        let unread = self.polled.iter().any(|&i| says_yes(channels[i].observe(peer, Observe::Unread)));
        self.engine.handle_observation(Observed::Peer(peer, Observation::Unread(unread)));
    }

    /// Whether nothing but an arrival can make progress (so sleeping until one is safe).
    fn can_sleep(&self) -> bool {
        self.blocked_peers == 0 && !self.self_sent
    }

    /// Whether sleeping means a nap: no polled channel has a doorbell (only `ib`, say), or
    /// other polled channels cannot ring it.
    fn naps(&self) -> bool {
        self.sleeper.is_none() || self.polled.len() > 1
    }

    /// Sleeps on the doorbell until an arrival ends it, or the liveness period; only for `nap`
    /// when other polled channels (which cannot ring the doorbell) may deliver meanwhile, or
    /// when there is no doorbell.
    fn sleep_once(&mut self, nap: Duration) {
        let Some(i) = self.sleeper else {
            std::thread::sleep(nap);
            return;
        };
        let timeout = if self.naps() { nap } else { LIVENESS_PERIOD };
        let Some(w) = self.channels[i].wakeup() else {
            std::thread::sleep(nap);
            return;
        };
        if w.arm() {
            w.sleep(timeout);
        }
        w.disarm();
    }

    /// Sends a small eager message at once when nothing is queued to `to`; `None` when the
    /// message must take the general path.
    #[inline]
    pub fn try_send_inline(&mut self, to: Rank, tag: u32, ctx: u16, buf: &[u8]) -> Option<Result<()>> {
        // SAFETY: `buf` is borrowed by the caller until this function returns, and a request
        // made for it is waited for (or failed) before that.
        match unsafe { self.start_send_inline(to, tag, ctx, buf.as_ptr(), buf.len())? } {
            Ok(Some(id)) => Some(self.wait(id).result.map(|_| ())),
            Ok(None) => Some(Ok(())),
            Err(e) => Some(Err(e)),
        }
    }

    /// The non-blocking form of [`Driver::try_send_inline`]: `Ok(None)` when the message left
    /// (nothing to wait for), `Ok(Some(id))` when the channel would block and the message waits
    /// as request `id`, in its place in the pair's order; `None` for the general path.
    ///
    /// # Safety
    /// The `len` bytes at `ptr` stay valid and unmodified until the request, if one is made,
    /// was waited for (or failed).
    #[inline(always)]
    pub unsafe fn start_send_inline(
        &mut self,
        to: Rank,
        tag: u32,
        ctx: u16,
        ptr: *const u8,
        len: usize,
    ) -> Option<Result<Option<ReqId>>> {
        // Every send passes here first (the general path after it): the one place it samples.
        self.note_placement(to, len);
        if !self.blocked.get(to as usize)?.is_empty() {
            return None;
        }
        let region = Region { ptr, len };
        let (channel, env) = self.engine.inline_send(to, tag, SpaceId(ctx), region)?;
        // SAFETY: forwarded to the caller.
        Some(unsafe { self.send_prepared(to, channel, env.header(len), region) })
    }

    /// [`Driver::start_send_inline`] through the channel's `try_send`.
    ///
    /// # Safety
    /// As for [`Driver::start_send_inline`].
    #[inline]
    unsafe fn send_prepared(
        &mut self,
        to: Rank,
        channel: ChannelId,
        hdr: Header,
        region: Region,
    ) -> Result<Option<ReqId>> {
        self.self_sent |= to == self.me;
        // SAFETY: the caller keeps the bytes valid for this call (and longer).
        let bytes = unsafe { std::slice::from_raw_parts(region.ptr, region.len) };
        match self.channels[channel.index()].try_send(to, &hdr, bytes) {
            // SAFETY: forwarded to the caller.
            Ok(Issued::WouldBlock) => unsafe { self.queue_prepared(to, channel, hdr, region) },
            Ok(_) => Ok(None),
            Err(e) => {
                self.engine.handle_peer_lost(to, e.duplicate());
                Err(e)
            }
        }
    }

    /// Queues a message [`Driver::start_send_inline`] prepared whose channel would block.
    ///
    /// # Safety
    /// As for [`Driver::start_send_inline`].
    #[cold]
    unsafe fn queue_prepared(
        &mut self,
        to: Rank,
        channel: ChannelId,
        hdr: Header,
        region: Region,
    ) -> Result<Option<ReqId>> {
        // SAFETY: forwarded to the caller.
        let id = unsafe { self.engine.post_send(to, Outgoing::Prepared { channel, hdr }, region) };
        self.drain();
        id.map(Some)
    }

    /// Waits for one request and takes how it ended. If waiting fails, the request is
    /// abandoned: nothing of this process touches its buffer afterwards, but a peer holding its
    /// key or its own read still in flight may ([`Finished::peer_may_write`] says so).
    #[inline]
    pub fn wait(&mut self, req: ReqId) -> Finished {
        if let Err(e) = self.wait_until(|e| e.phase(req).is_done()) {
            let peer_may_write = self.abandon(req);
            return Finished { result: Err(e), peer_may_write };
        }
        self.engine.take_result(req).unwrap_or_else(|| Finished {
            result: Err(Error::InvalidArgument("unknown request".into())),
            peer_may_write: false,
        })
    }

    /// Waits for the receive parked by [`Engine::post_recv`]: its status, or the request it
    /// became (which the caller then waits for). Either way the engine no longer holds the
    /// parked buffer outside that request when this returns.
    #[inline]
    pub fn wait_parked(&mut self) -> Result<ParkedEnd> {
        self.parked = true;
        let waited = self.wait_until(|e| !e.parked_waiting());
        self.parked = false;
        // Settled, or given up when the wait failed first.
        match self.engine.poll_parked(true).expect("a receive given up ends") {
            Unparked::Done(status) => status.map(ParkedEnd::Received),
            Unparked::Promoted(id) if waited.is_ok() => Ok(ParkedEnd::Request(id)),
            Unparked::Promoted(id) => {
                let peer_may_write = self.abandon(id);
                Ok(ParkedEnd::Abandoned { why: waited.expect_err("checked above"), peer_may_write })
            }
            Unparked::Withdrawn => Err(waited
                .err()
                .unwrap_or_else(|| Error::InvalidArgument("a parked receive ended without its message".into()))),
        }
    }

    /// Forgets `req` and drops its queued actions, so that its buffer is no longer used by this
    /// process; whether a peer, or the request's own read in flight, may still write there
    /// ([`Engine::discard`]).
    pub fn abandon(&mut self, req: ReqId) -> bool {
        let mine = |a: &Action| match a {
            Action::Send { op: Some(op), .. } | Action::Get { op, .. } | Action::Put { op, .. } => {
                ReqId::from_op(*op) == Some(req)
            }
            _ => false,
        };
        for peer in 0..self.blocked.len() {
            self.drop_blocked(peer, mine, "read abandoned before it ran");
        }
        self.engine.discard(req)
    }

    /// Drops the blocked actions to `peer` that `pick` chooses. A read among them never runs:
    /// the engine is told (with `why`), so that it does not count it in flight
    /// ([`polyrail_core::engine::Activity::copies_in_flight`]).
    fn drop_blocked(&mut self, peer: usize, pick: impl Fn(&Action) -> bool, why: &str) {
        let q = &mut self.blocked[peer];
        if q.is_empty() {
            return;
        }
        let mut dropped_reads = Vec::new();
        q.retain(|a| match a {
            Action::Get { op, .. } if pick(a) => {
                dropped_reads.push(*op);
                false
            }
            _ => !pick(a),
        });
        if q.is_empty() {
            self.blocked_peers -= 1;
        }
        for op in dropped_reads {
            self.engine.handle_op(op, OpOutcome::Done(Err(Error::InvalidArgument(why.into()))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polyrail_core::engine::{Posted, RecvPath, Source, TagMatch};
    use polyrail_core::policy::{PeerRoute, Protocol, RouteEntry};
    use polyrail_core::{Address, Cost, Header, PeerInfo, Reach, RegionMut, Sink, TransportAttr, TransportKind};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A channel that delivers nothing and counts how often it is polled; its sends would
    /// block while `closed` holds (a full ring, a paced link).
    struct Counted {
        attr: TransportAttr,
        polls: Arc<AtomicUsize>,
        closed: Arc<AtomicBool>,
    }

    impl Counted {
        fn channel(caps: Caps, latency_ns: f64) -> (Box<dyn Transport>, Arc<AtomicUsize>) {
            let c = Counted::new(caps, latency_ns);
            let polls = c.polls.clone();
            (Box::new(c), polls)
        }

        fn new(caps: Caps, latency_ns: f64) -> Counted {
            let cost = Cost { latency_ns, overhead_ns: 0.0, bandwidth: 1e9 };
            let attr = TransportAttr {
                kind: TransportKind::new("test"),
                max_inline: 64,
                max_eager: 1024,
                max_rma: 0,
                caps: Caps::AM | caps,
                am_cost: cost,
                rma_cost: cost,
                split_from: None,
                mapped_from: None,
                rndv_from: Vec::new(),
            };
            Counted { attr, polls: Arc::default(), closed: Arc::default() }
        }
    }

    impl Transport for Counted {
        fn attr(&self) -> &TransportAttr {
            &self.attr
        }
        fn address(&self) -> Address {
            Vec::new()
        }
        fn add_peer(&mut self, _: &PeerInfo, _: &[u8]) -> Reach {
            Reach::Yes(String::new())
        }
        fn try_send(&mut self, _: Rank, _: &Header, _: &[u8]) -> Result<Issued> {
            Ok(if self.closed.load(Ordering::Relaxed) { Issued::WouldBlock } else { Issued::Done })
        }
        fn progress(&mut self, _: usize, _: &mut dyn Sink) -> Result<usize> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            Ok(0)
        }
    }

    /// Rank 0 of 3: rank 1 over a cheap channel (0), rank 2 over one whose poll is a system
    /// call (1). Returns the driver and the poll counters of both channels.
    fn job() -> (Driver, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        job_reaching(ChannelSet::ALL)
    }

    /// As [`job`], with only the channels in `reaching` reaching a peer.
    fn job_reaching(reaching: ChannelSet) -> (Driver, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (cheap, cheap_polls) = Counted::channel(Caps::empty(), 200.0);
        let (syscall, syscall_polls) = Counted::channel(Caps::POLL_IS_SYSCALL, 2000.0);
        let mut engine = Engine::new(0, 3, polyrail_core::adapt::Tuning::default());
        for (peer, am) in [(1, ChannelId(0)), (2, ChannelId(1))] {
            engine.set(Setting::Route(peer, Ok(eager_route(am))));
        }
        let driver = Driver::new(engine, 0, 3, vec![cheap, syscall], reaching, WaitMode::Spin, PollPolicy::All);
        (driver, cheap_polls, syscall_polls)
    }

    /// Every message eagerly over `am`.
    fn eager_route(am: ChannelId) -> PeerRoute {
        let entries =
            vec![RouteEntry { upto: usize::MAX, protocol: Protocol::Eager, channel: am, reason: String::new() }];
        PeerRoute { am, frag: 1024, entries, stream_eager: None, placement: None, mapped: None, as_written: false }
    }

    fn rounds(d: &mut Driver, n: usize) {
        for _ in 0..n {
            d.progress().unwrap();
        }
    }

    fn polls(c: &AtomicUsize) -> usize {
        c.swap(0, Ordering::Relaxed)
    }

    #[test]
    fn a_syscall_channel_is_polled_when_an_arrival_is_awaited_on_it() {
        let (mut d, cheap, syscall) = job();
        rounds(&mut d, 1024);
        assert_eq!(polls(&cheap), 1024);
        assert_eq!(polls(&syscall), 1024 / SYSCALL_POLL_EVERY as usize, "only its periodic turns while idle");

        // A receive from the cheap channel's peer does not make the other one polled.
        let mut buf = [0u8; 8];
        let region = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
        // SAFETY: `buf` outlives the requests, which are discarded before it goes.
        let posted =
            unsafe { d.engine.post_recv(Source::Rank(1), TagMatch::Any, SpaceId(0), region, RecvPath::Request) };
        let Ok(Posted::Request(near)) = posted else { panic!("{posted:?}") };
        rounds(&mut d, 1024);
        assert_eq!(polls(&syscall), 1024 / SYSCALL_POLL_EVERY as usize);
        d.abandon(near);

        // A receive from its peer, or from anyone, does.
        for src in [Source::Rank(2), Source::Any] {
            // SAFETY: as above.
            let posted = unsafe { d.engine.post_recv(src, TagMatch::Any, SpaceId(0), region, RecvPath::Request) };
            let Ok(Posted::Request(r)) = posted else { panic!("{posted:?}") };
            rounds(&mut d, 100);
            assert_eq!(polls(&syscall), 100, "{src:?}");
            d.abandon(r);
            rounds(&mut d, 100);
            assert!(polls(&syscall) <= 1, "{src:?}: polled again after the receive went");
        }

        // So does a probe, which looks for messages no receive awaits.
        d.probing(|d| rounds(d, 100));
        assert_eq!(polls(&syscall), 100);
        assert_eq!(polls(&cheap), 1024 + 4 * 100 + 100, "the cheap channel is polled on every round");
    }

    #[test]
    fn a_channel_that_reaches_no_rank_is_never_polled() {
        let mut reaching = ChannelSet::EMPTY;
        reaching.insert(ChannelId(1));
        let (mut d, cheap, syscall) = job_reaching(reaching);
        d.probing(|d| rounds(d, 100));
        assert_eq!((polls(&cheap), polls(&syscall)), (0, 100));
    }

    /// A blocked send that goes is progress, so that a wait keeps polling while room comes
    /// instead of napping between sends.
    #[test]
    fn a_blocked_send_that_goes_counts_as_progress() {
        let counted = Counted::new(Caps::empty(), 200.0);
        let closed = counted.closed.clone();
        closed.store(true, Ordering::Relaxed);
        let mut engine = Engine::new(0, 2, polyrail_core::adapt::Tuning::default());
        engine.set(Setting::Route(1, Ok(eager_route(ChannelId(0)))));
        let mut d =
            Driver::new(engine, 0, 2, vec![Box::new(counted)], ChannelSet::ALL, WaitMode::Spin, PollPolicy::All);
        let buf = [7u8; 8];
        // SAFETY: `buf` outlives the request, which finishes (or is abandoned) before it goes.
        let started = unsafe { d.start_send_inline(1, 5, 0, buf.as_ptr(), buf.len()) };
        let Some(Ok(Some(id))) = started else { panic!("not queued: {started:?}") };
        assert_eq!(d.progress().unwrap(), 0, "still blocked");
        closed.store(false, Ordering::Relaxed);
        assert_eq!(d.progress().unwrap(), 1, "the send went");
        assert!(d.engine.phase(id).is_done());
        assert!(d.engine.take_result(id).is_some_and(|f| f.result.is_ok()));
    }

    /// Chai's m/n + 1 every h arrivals; a quiet stretch of the others doubles the ratio from
    /// h + 1 up to the cap, and their first arrivals bring it down at once.
    #[test]
    fn the_dynamic_ratio_follows_where_arrivals_come_from() {
        let (d, _, _) = job();
        let mut plan = PollPlan::new(PollPolicy::Dynamic(8), &d.channels, &d.polled);
        assert_eq!(plan.ratio, 1, "every channel until arrivals say otherwise");
        let window = |plan: &mut PollPlan, primary: usize, others: usize| {
            plan.count(primary, others);
            plan.ratio
        };
        assert_eq!(window(&mut plan, 6, 2), 4, "6 / 2 + 1");
        assert_eq!(window(&mut plan, 0, 8), 1, "all from the others");
        let quiet: Vec<u32> = (0..6).map(|_| window(&mut plan, 8, 0)).collect();
        assert_eq!(quiet, [9, 18, 36, 64, 64, 64]);
        assert_eq!(window(&mut plan, 7, 1), 8, "7 / 1 + 1");
        // Arrivals count across calls: 3 + 3 is not a window yet, + 2 is.
        assert_eq!(window(&mut plan, 3, 0), 8);
        assert_eq!(window(&mut plan, 3, 0), 8);
        assert_eq!(window(&mut plan, 0, 2), 4, "6 / 2 + 1");
        // Static and all never change.
        for policy in [PollPolicy::All, PollPolicy::Static(50)] {
            let mut plan = PollPlan::new(policy, &d.channels, &d.polled);
            let before = plan.ratio;
            window(&mut plan, 8, 0);
            assert_eq!(plan.ratio, before);
        }
    }
}
