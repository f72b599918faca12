//! What channels observe about their peers, and how samples become verdicts.
//!
//! A channel reports what it measures ([`Observation`], asked for with [`Observe`]); the
//! selection turns observations into choices. The verdict types here ([`Placement`],
//! [`LineSamples`], [`InARow`]) are shared by the selection and by channels that adapt their own
//! mechanics (shm fills send cells with non-temporal stores for an apart peer).

/// What the runtime asks a channel about one peer ([`crate::Transport::observe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observe {
    /// How long a cache line the peer wrote takes to arrive ([`Observation::LineTransfer`]).
    LineTransfer,
    /// Whether this process's copies into memory the peer reads run slowly
    /// ([`Observation::CopiesSlow`]).
    CopiesSlow,
    /// Whether a message of the peer waits unread ([`Observation::Unread`]).
    Unread,
    /// Whether the channel copies the peer's registered memory through a mapping
    /// ([`Observation::MapsRegistered`]).
    MapsRegistered,
}

/// What a channel observed about one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation {
    /// Nanoseconds beyond a local load that a cache line the peer wrote since the last such
    /// observation took to arrive: how near the two cores are. A channel with no fresh line of
    /// its own may give its latest time instead (the cores are as near either way).
    LineTransfer(u32),
    /// Whether this process's copies into memory the peer reads (shm's send cells) ran at under
    /// half their usual rate lately: a host may slow the transfer of lines between two cores
    /// that share a cache for seconds at a time, and single copy then streams faster.
    CopiesSlow(bool),
    /// Whether a message of the peer waits unread (a peek, no delivery; for skew feedback).
    Unread(bool),
    /// Whether the channel copies the peer's registered memory with a memory file through a
    /// mapping (probed when the peer was connected): routes keep their registered-memory rule
    /// ([`crate::policy::MappedRule`]) only then.
    MapsRegistered(bool),
}

impl Observation {
    /// The line-transfer time, if this is one.
    pub fn line_transfer(self) -> Option<u32> {
        if let Observation::LineTransfer(ns) = self {
            Some(ns)
        } else {
            None
        }
    }

    /// The yes-or-no answer of the other kinds.
    pub fn flag(self) -> Option<bool> {
        match self {
            Observation::CopiesSlow(b) | Observation::Unread(b) | Observation::MapsRegistered(b) => Some(b),
            Observation::LineTransfer(_) => None,
        }
    }
}

/// The yes-or-no answer of an observation; no answer is a no.
pub fn says_yes(answer: Option<Observation>) -> bool {
    answer.and_then(Observation::flag).unwrap_or(false)
}

/// Line transfers at most this long are "near" ([`Placement::of_line`]): cores sharing a cache
/// close by (10-20 ns within one AMD core complex).
pub const NEAR_NS: u32 = 40;
/// Line transfers longer than this are "apart" (110-140 ns between AMD core complexes). Between
/// the two lies an L3 shared across a mesh (55-95 ns on an Intel Xeon), where neither rule pays.
pub const APART_NS: u32 = 100;
/// Samples in a row that set or change a two-sided verdict ([`InARow`]): one late sample, an
/// interrupt, does not.
pub const TO_CHANGE: u8 = 3;
/// Line-transfer samples that give the placement, seven of them on one side ([`LineSamples`]):
/// under load a line waits behind the peer's own traffic, and verdicts from three in a row or
/// from a median flipped between the bands several times a second.
pub const SAMPLES: usize = 9;
/// A sample at most this long found the line in the timing core's cache after all (a hardware
/// prefetch brought it): it says nothing about the placement and is not counted while every
/// rank of the node has a CPU of its own.
pub const LOCAL_NS: u32 = 2;

/// Where a peer's core sits against ours, as the time a cache line it wrote takes to arrive
/// says ([`Observation::LineTransfer`]); it decides which placement rule applies
/// ([`crate::policy::PlacementRule`]) and how shm fills its send cells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Sharing a cache close by (a line arrives within [`NEAR_NS`]): two copies
    /// through shared memory stay cheap up to large sizes.
    Near,
    /// Neither near nor apart: a shared cache across a mesh, where a line takes several times
    /// longer than near but the cores share a last-level cache. No rule applies: the route
    /// table's threshold decides.
    #[default]
    Middle,
    /// Sharing no cache (a line takes over [`APART_NS`]): every line that
    /// crosses is expensive.
    Apart,
}

impl Placement {
    /// The band of a line-transfer sample of `ns` nanoseconds beyond a local load.
    pub fn of_line(ns: u32) -> Placement {
        if ns <= NEAR_NS {
            Placement::Near
        } else if ns <= APART_NS {
            Placement::Middle
        } else {
            Placement::Apart
        }
    }
}

/// A two-sided verdict that changes once [`TO_CHANGE`] samples in a row agree
/// (one odd sample, an interrupt, does not): whether shm's cell fills run slowly.
#[derive(Clone, Copy, Debug, Default)]
pub struct InARow {
    /// The side of the latest samples.
    side: bool,
    /// Samples in a row on it, up to `TO_CHANGE`.
    count: u8,
}

impl InARow {
    /// Notes a sample on `side`; the side when it is the [`TO_CHANGE`]-th (or a
    /// later) sample in a row on it.
    pub fn note(&mut self, side: bool) -> Option<bool> {
        self.count = if self.count > 0 && self.side == side { (self.count + 1).min(TO_CHANGE) } else { 1 };
        self.side = side;
        (self.count == TO_CHANGE).then_some(side)
    }
}

/// The latest [`SAMPLES`] line-transfer samples of a peer, which say where its
/// core is, as the engine and the shm channel each measure it: near when seven of the nine
/// lie within [`NEAR_NS`], apart when seven lie beyond
/// [`APART_NS`], and otherwise in the middle. The odd sample an interrupt
/// stretched or a prefetch shortened changes nothing, nor does the spread of a loaded mesh,
/// where a run of three samples on one side, or a median, flipped between the bands.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineSamples {
    /// The samples (ns, at most `u16::MAX`), oldest overwritten first.
    ns: [u16; SAMPLES],
    /// Samples taken so far, up to `SAMPLES`.
    taken: u8,
    /// Where the next one goes.
    next: u8,
}

impl LineSamples {
    /// Notes a sample of `ns` nanoseconds beyond a local load; once there are
    /// [`SAMPLES`], the placement they say.
    pub fn note(&mut self, ns: u32) -> Option<Placement> {
        self.ns[self.next as usize] = ns.min(u16::MAX as u32) as u16;
        self.next = (self.next + 1) % SAMPLES as u8;
        self.taken = (self.taken + 1).min(SAMPLES as u8);
        if (self.taken as usize) < SAMPLES {
            return None;
        }
        let mut sorted = self.ns;
        sorted.sort_unstable();
        // The third shortest and the third longest: seven of nine on one side.
        let (low, high) = (u32::from(sorted[2]), u32::from(sorted[SAMPLES - 3]));
        Some(match (Placement::of_line(high), Placement::of_line(low)) {
            (Placement::Near, _) => Placement::Near,
            (_, Placement::Apart) => Placement::Apart,
            _ => Placement::Middle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_takes_three_samples_in_a_row() {
        let mut v = InARow::default();
        assert_eq!([v.note(true), v.note(true), v.note(false)], [None, None, None]);
        assert_eq!([v.note(true), v.note(true), v.note(true), v.note(true)], [None, None, Some(true), Some(true)]);
        assert_eq!(
            [v.note(false), v.note(true), v.note(false), v.note(false), v.note(false)],
            [None, None, None, None, Some(false)]
        );
    }

    #[test]
    fn the_placement_takes_seven_of_the_latest_nine_samples() {
        let mut v = LineSamples::default();
        let mut note = |samples: &[u32]| samples.iter().map(|&ns| v.note(ns)).last().flatten();
        assert_eq!(note(&[20; SAMPLES - 1]), None, "not enough samples yet");
        assert_eq!(note(&[20]), Some(Placement::Near));
        assert_eq!(note(&[5000, 150]), Some(Placement::Near), "two of nine late");
        assert_eq!(note(&[70]), Some(Placement::Middle), "three of nine late");
        assert_eq!(note(&[150; 4]), Some(Placement::Middle), "six of nine beyond 100");
        assert_eq!(note(&[150]), Some(Placement::Apart), "seven of nine beyond 100");
        assert_eq!(note(&[1, 1]), Some(Placement::Middle), "seven of nine beyond 100 no more");
        let loaded_mesh = [6, 30, 60, 90, 100, 180, 6, 60, 90];
        assert_eq!(note(&loaded_mesh), Some(Placement::Middle), "a loaded mesh");
        let ping_pong_on_a_mesh = [75, 125, 110, 118, 90, 121, 104, 122, 79];
        assert_eq!(note(&ping_pong_on_a_mesh), Some(Placement::Middle));
        assert_eq!(note(&[u32::MAX; SAMPLES]), Some(Placement::Apart));
    }
}
