//! [`Pair`]: two connected endpoints of one channel (or one that talks to itself), with what
//! each endpoint's `progress` delivered, and the loop that drives both until something happened.

use polyrail_core::{Error, Header, OpId, PeerInfo, Rank, Reach, Result, Sink, Transport};
use std::time::{Duration, Instant};

/// How long the suite waits for anything by default (an arrival, a completion, room to send)
/// before it fails naming what it waited for.
const PATIENCE: Duration = Duration::from_secs(5);

/// Everything one endpoint's `progress` (and `check_peers`) handed to its sink.
#[derive(Debug, Default)]
pub(crate) struct Events {
    /// Arrivals: sender, header, payload.
    pub messages: Vec<(Rank, Header, Vec<u8>)>,
    /// Completions: operation, and the error text of a failed one.
    pub completed: Vec<(OpId, std::result::Result<(), String>)>,
    /// Peers reported lost or finished: rank, error text.
    pub lost: Vec<(Rank, String)>,
}

impl Events {
    /// How many arrivals and completions were delivered so far.
    pub fn delivered(&self) -> usize {
        self.messages.len() + self.completed.len()
    }

    /// How many completions of `op` were delivered.
    pub fn completions_of(&self, op: OpId) -> usize {
        self.completed.iter().filter(|(o, _)| *o == op).count()
    }
}

impl Sink for Events {
    fn message(&mut self, from: Rank, hdr: &Header, payload: &[u8]) {
        self.messages.push((from, *hdr, payload.to_vec()));
    }

    fn completed(&mut self, op: OpId, result: Result<()>) {
        self.completed.push((op, result.map_err(|e| e.to_string())));
    }

    fn peer_lost(&mut self, peer: Rank, why: Error) {
        self.lost.push((peer, why.to_string()));
    }
}

/// One of the two endpoints of a [`Pair`]: `A` sends, `B` receives (and exposes memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    A,
    B,
}

/// Two connected endpoints of one channel: endpoint `a` sends to `b` and reads or writes the
/// memory `b` exposes. For a channel that only reaches its own process, both are one endpoint.
pub struct Pair {
    /// The channel and case, for failure messages.
    pub(crate) name: String,
    a: Box<dyn Transport>,
    /// `None`: `a` talks to itself.
    b: Option<Box<dyn Transport>>,
    /// What `b` was told about `a`, and `a` about `b`.
    a_info: PeerInfo,
    b_info: PeerInfo,
    /// What `a`'s and `b`'s progress delivered (one list for one endpoint).
    events: [Events; 2],
    patience: Duration,
    /// The case may make the channel report a peer lost (a failed one-sided operation).
    pub(crate) loss_expected: bool,
    /// What the case found worth reporting besides passing (paths it could not take).
    pub(crate) notes: Vec<String>,
}

impl Pair {
    /// Connects two endpoints of one job as the bootstrap would: each one's address is given to
    /// the other's `add_peer` (`a_info` describes `a` to `b`, `b_info` describes `b` to `a`),
    /// then both are told `connected`. `Err` names the endpoint that refused, and why: the
    /// channel cannot run here.
    pub fn connect(
        a: impl Transport + 'static,
        a_info: PeerInfo,
        b: impl Transport + 'static,
        b_info: PeerInfo,
    ) -> std::result::Result<Pair, String> {
        let (mut a, mut b): (Box<dyn Transport>, Box<dyn Transport>) = (Box::new(a), Box::new(b));
        let (a_address, b_address) = (a.address(), b.address());
        if let Reach::No(why) = a.add_peer(&b_info, &b_address) {
            return Err(format!("rank {} does not reach rank {}: {why}", a_info.rank, b_info.rank));
        }
        if let Reach::No(why) = b.add_peer(&a_info, &a_address) {
            return Err(format!("rank {} does not reach rank {}: {why}", b_info.rank, a_info.rank));
        }
        a.connected().map_err(|e| format!("rank {}: connected: {e}", a_info.rank))?;
        b.connected().map_err(|e| format!("rank {}: connected: {e}", b_info.rank))?;
        Ok(Pair::new(a, Some(b), a_info, b_info))
    }

    /// One endpoint that talks to itself (a loopback-like channel, or a node-local one whose
    /// only peer here is its own process): `info` describes the endpoint to itself. `Err` says
    /// why it does not reach itself.
    pub fn loopback(t: impl Transport + 'static, info: PeerInfo) -> std::result::Result<Pair, String> {
        let mut t: Box<dyn Transport> = Box::new(t);
        let address = t.address();
        if let Reach::No(why) = t.add_peer(&info, &address) {
            return Err(format!("rank {} does not reach itself: {why}", info.rank));
        }
        t.connected().map_err(|e| format!("rank {}: connected: {e}", info.rank))?;
        Ok(Pair::new(t, None, info.clone(), info))
    }

    /// Waits up to `patience` (instead of 5 s) for anything (slow channels: emulated devices).
    pub fn with_patience(mut self, patience: Duration) -> Pair {
        self.patience = patience;
        self
    }

    fn new(a: Box<dyn Transport>, b: Option<Box<dyn Transport>>, a_info: PeerInfo, b_info: PeerInfo) -> Pair {
        Pair {
            name: String::new(),
            a,
            b,
            a_info,
            b_info,
            events: [Events::default(), Events::default()],
            patience: PATIENCE,
            loss_expected: false,
            notes: Vec::new(),
        }
    }

    /// Notes `what` in the report of the case.
    pub(crate) fn note(&mut self, what: impl Into<String>) {
        self.notes.push(what.into());
    }

    /// Whether both ends are one endpoint.
    pub(crate) fn is_loopback(&self) -> bool {
        self.b.is_none()
    }

    /// How long waits may take.
    pub(crate) fn patience(&self) -> Duration {
        self.patience
    }

    /// The sides there are: `A` and `B`, or `A` alone for one endpoint.
    pub(crate) fn sides(&self) -> &'static [Side] {
        if self.is_loopback() {
            &[Side::A]
        } else {
            &[Side::A, Side::B]
        }
    }

    /// Which list of events the endpoint on `side` fills: 0 or 1 (0 for one endpoint).
    pub(crate) fn index(&self, side: Side) -> usize {
        match side {
            Side::B if !self.is_loopback() => 1,
            _ => 0,
        }
    }

    /// The endpoint on `side` and its events.
    pub(crate) fn parts(&mut self, side: Side) -> (&mut dyn Transport, &mut Events) {
        let i = self.index(side);
        let t: &mut dyn Transport = match (side, self.b.as_mut()) {
            (Side::B, Some(b)) => b.as_mut(),
            _ => self.a.as_mut(),
        };
        (t, &mut self.events[i])
    }

    /// The endpoint on `side`.
    pub(crate) fn t(&mut self, side: Side) -> &mut dyn Transport {
        self.parts(side).0
    }

    /// The sending endpoint.
    pub(crate) fn a(&mut self) -> &mut dyn Transport {
        self.t(Side::A)
    }

    /// The receiving (exposing) endpoint.
    pub(crate) fn b(&mut self) -> &mut dyn Transport {
        self.t(Side::B)
    }

    /// What the endpoint on `side` received.
    pub(crate) fn ev(&self, side: Side) -> &Events {
        &self.events[self.index(side)]
    }

    /// The rank of the endpoint on `side`.
    pub(crate) fn rank(&self, side: Side) -> Rank {
        self.info(side).rank
    }

    /// What the other endpoint was told about the one on `side`.
    pub(crate) fn info(&self, side: Side) -> &PeerInfo {
        match side {
            Side::A => &self.a_info,
            Side::B => &self.b_info,
        }
    }

    /// The rank the endpoint on `side` talks to.
    pub(crate) fn peer_of(&self, side: Side) -> Rank {
        self.rank(other(side))
    }

    /// One `progress` call on the endpoint on `side`; returns its answer. Panics on an error.
    pub(crate) fn progress(&mut self, side: Side, budget: usize) -> usize {
        let name = self.name.clone();
        let (t, ev) = self.parts(side);
        t.progress(budget, ev).unwrap_or_else(|e| panic!("{name}: progress on side {side:?} failed: {e}"))
    }

    /// One `progress` call on each endpoint; returns the sum of their answers.
    pub(crate) fn poll(&mut self) -> usize {
        self.sides().iter().map(|&s| self.progress(s, usize::MAX)).sum()
    }

    /// Polls both endpoints until `done` says so; panics naming `what` after the patience.
    pub(crate) fn drive(&mut self, what: &str, mut done: impl FnMut(&mut Pair) -> bool) {
        let start = Instant::now();
        while !done(self) {
            if start.elapsed() > self.patience {
                panic!("{}: timed out after {:?} waiting for {what} ({})", self.name, self.patience, self.state());
            }
            if self.poll() == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// What both endpoints received so far, for failure messages.
    pub(crate) fn state(&self) -> String {
        let one = |e: &Events| {
            format!("{} messages, {} completions, {} lost", e.messages.len(), e.completed.len(), e.lost.len())
        };
        if self.is_loopback() {
            one(&self.events[0])
        } else {
            format!("a got {}; b got {}", one(&self.events[0]), one(&self.events[1]))
        }
    }

    /// Panics if an endpoint reported a peer lost in a case that did not expect it.
    pub(crate) fn assert_no_unexpected_loss(&self) {
        if self.loss_expected {
            return;
        }
        for &side in self.sides() {
            let lost = &self.ev(side).lost;
            assert!(lost.is_empty(), "{}: side {side:?} reported peers lost: {lost:?}", self.name);
        }
    }
}

/// The other side.
pub(crate) fn other(side: Side) -> Side {
    match side {
        Side::A => Side::B,
        Side::B => Side::A,
    }
}
