//! How much of a split rendezvous the receiver copies, chosen per peer and message size by
//! measuring whole messages.
//!
//! In the split protocol the receiver pulls the front of a message and the sender pushes the rest,
//! both at once. Halves are fastest when the receiving core has the sender's lines in its cache
//! already (a buffer sent again unchanged, as in osu_latency); when the sender has just written the
//! message (an application's fresh data) the sender's copy reads its own cache and the receiver's
//! crosses between the cores, and the receiver should take a quarter to three eighths (Intel Xeon
//! host, an earlier record in git history: fresh data 64 KiB-1 MiB 5-30 % faster than halves). An equal finish
//! of both copies is not the optimum (they slow each other), so the share is searched: each size
//! class tries every share on a few messages that ran alone, then keeps the fastest for a while.
//!
//! [`SplitTuner`] is the search for one peer; it neither reads a clock nor knows requests: the
//! engine asks it for a share and reports the time the driver measured.

/// The receiver's shares tried, in eighths of the message: halves first (the best share when
/// nothing was measured yet).
const SHARES: [u8; 3] = [4, 3, 2];

/// Messages measured per share and search; the fastest of them counts.
const SAMPLES: u8 = 4;

/// Messages sent with the chosen share before the next search; doubled, up to [`MAX_KEEP`],
/// each time a search finds the share it had (trials of the slower shares cost time).
const KEEP: u16 = 250;
const MAX_KEEP: u16 = 4000;

/// Messages of a class before its first search: the first ones find cold caches and pages
/// not yet mapped, and would make the share tried first look slow.
const WARM_UP: u16 = 16;

/// Another share replaces the one in use only when its fastest message is faster by this many
/// parts in 64 (6 %): times of a few messages are noisy, and each change costs messages that
/// find the caches laid out for the share before.
const MARGIN_64THS: u64 = 4;

/// Size classes (powers of two) from 32 KiB; larger messages share the last one.
const FIRST_CLASS: u32 = 15;
const CLASSES: usize = 13;

/// A share chosen by [`SplitTuner::choose`] that is being measured: report its time with
/// [`SplitTuner::record`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Trial {
    class: u8,
    arm: u8,
}

/// What a search found (for the log): the receiver's share of messages from `from` bytes (to
/// twice that), in eighths, and the fastest time of each share tried (halves, three eighths, a
/// quarter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Found {
    pub from: usize,
    pub eighths: u8,
    pub fastest_ns: [u64; SHARES.len()],
}

/// The search for one peer (see the module documentation).
#[derive(Clone, Debug, Default)]
pub(super) struct SplitTuner {
    classes: [ClassSearch; CLASSES],
}

#[derive(Clone, Copy, Debug)]
struct ClassSearch {
    /// Index in [`SHARES`] of the share in use.
    best: u8,
    /// Messages still to send with `best` before searching again (0: searching), and how many
    /// the last search kept it for (0: none yet).
    keep: u16,
    kept: u16,
    /// This search's fastest time per share (0: none yet) and messages measured.
    fastest_ns: [u64; SHARES.len()],
    measured: [u8; SHARES.len()],
}

impl Default for ClassSearch {
    fn default() -> Self {
        ClassSearch { best: 0, keep: WARM_UP, kept: 0, fastest_ns: [0; SHARES.len()], measured: [0; SHARES.len()] }
    }
}

impl SplitTuner {
    /// The receiver's share of a `len`-byte message, in bytes (page aligned), and the trial to
    /// report when this message is measured. `may_try`: the message will run alone (no other
    /// split copy with any peer is under way), so its time says something of its share.
    pub fn choose(&mut self, len: usize, may_try: bool) -> (usize, Option<Trial>) {
        let class = class_of(len);
        let c = &mut self.classes[class];
        let arm = if c.keep > 0 {
            c.keep -= 1;
            None
        } else if may_try {
            // The shares in turn (the first of those measured least), so that a stretch of
            // slow transfers, which the host has for seconds at times, slows each alike.
            let (a, &n) = c.measured.iter().enumerate().min_by_key(|&(_, n)| n).expect("shares are not empty");
            (n < SAMPLES).then_some(a as u8)
        } else {
            None
        };
        let share = SHARES[arm.unwrap_or(c.best) as usize];
        (split_at(len, share), arm.map(|arm| Trial { class: class as u8, arm }))
    }

    /// Reports how long the message of `trial` took, from its share being chosen until both
    /// copies were done. When that ends a search, returns what it found.
    pub fn record(&mut self, trial: Trial, ns: u64) -> Option<Found> {
        let c = &mut self.classes[trial.class as usize];
        let a = trial.arm as usize;
        if c.keep > 0 || c.measured[a] >= SAMPLES {
            return None; // a search that ended meanwhile
        }
        let ns = ns.max(1);
        c.fastest_ns[a] = if c.fastest_ns[a] == 0 { ns } else { c.fastest_ns[a].min(ns) };
        c.measured[a] += 1;
        if c.measured.iter().all(|&n| n >= SAMPLES) {
            let fastest = (0..SHARES.len()).min_by_key(|&i| c.fastest_ns[i]).expect("shares are not empty");
            let (now, t) = (c.best as usize, c.fastest_ns);
            let best = if t[fastest] * 64 < t[now] * (64 - MARGIN_64THS) { fastest } else { now };
            let found = Found {
                from: 1 << (FIRST_CLASS as usize + trial.class as usize),
                eighths: SHARES[best],
                fastest_ns: c.fastest_ns,
            };
            let keep = if best == now && c.kept > 0 { (c.kept * 2).min(MAX_KEEP) } else { KEEP };
            *c = ClassSearch {
                best: best as u8,
                keep,
                kept: keep,
                fastest_ns: [0; SHARES.len()],
                measured: [0; SHARES.len()],
            };
            return Some(found);
        }
        None
    }

    /// How many messages of the current searches were measured, over every class.
    #[cfg(test)]
    pub fn classes_measured(&self) -> usize {
        self.classes.iter().map(|c| c.measured.iter().map(|&n| n as usize).sum::<usize>()).sum()
    }

    /// The share in use for `len`-byte messages, in eighths.
    #[cfg(test)]
    fn share_eighths(&self, len: usize) -> u8 {
        SHARES[self.classes[class_of(len)].best as usize]
    }
}

/// The receiver's part of a `len`-byte message for a share of `eighths`/8, page aligned.
fn split_at(len: usize, eighths: u8) -> usize {
    (len / 8 * eighths as usize) & !4095
}

/// The receiver's part of a `len`-byte message for a share of `percent` %, page aligned.
pub(super) fn percent_of(len: usize, percent: u8) -> usize {
    (len / 100 * percent as usize) & !4095
}

fn class_of(len: usize) -> usize {
    let log = usize::BITS - 1 - len.max(1).leading_zeros();
    (log.saturating_sub(FIRST_CLASS) as usize).min(CLASSES - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs messages of `len` bytes whose time depends on the share only, until a search
    /// ends (the first after WARM_UP untimed messages); returns the share then in use.
    fn settle(t: &mut SplitTuner, len: usize, mut ns_of: impl FnMut(usize) -> u64) -> u8 {
        let mut trials = 0;
        loop {
            let (split, trial) = t.choose(len, true);
            let Some(trial) = trial else {
                assert_eq!(trials, 0, "trials in a row");
                continue;
            };
            trials += 1;
            if t.record(trial, ns_of(split)).is_some() {
                assert_eq!(trials, SHARES.len() * SAMPLES as usize);
                return t.share_eighths(len);
            }
        }
    }

    #[test]
    fn halves_until_something_was_measured() {
        let mut t = SplitTuner::default();
        for _ in 0..WARM_UP {
            assert_eq!(t.choose(1 << 20, true), (512 << 10, None));
        }
        assert_eq!(t.choose(1 << 20, false), (512 << 10, None));
        assert_eq!(t.choose(1 << 20, true), (512 << 10, Some(Trial { class: 5, arm: 0 })));
        assert_eq!(t.share_eighths(1 << 20), 4);
    }

    #[test]
    fn the_fastest_share_is_kept_per_size_class() {
        let mut t = SplitTuner::default();
        // 64 KiB: a quarter is fastest; 4 MiB: halves.
        assert_eq!(settle(&mut t, 64 << 10, |split| if split == 16 << 10 { 6_000 } else { 10_000 }), 2);
        assert_eq!(settle(&mut t, 4 << 20, |split| 400_000 - split as u64 / 64), 4);
        assert_eq!(t.share_eighths(100 << 10), 2, "64-128 KiB is one class");
        assert_eq!(t.share_eighths(32 << 10), 4, "32 KiB was not measured");
        // Kept for KEEP messages, without trials.
        for _ in 0..KEEP {
            assert_eq!(t.choose(64 << 10, true), (16 << 10, None));
        }
        // Then searched again: the first trial is halves.
        assert_eq!(t.choose(64 << 10, true), (32 << 10, Some(Trial { class: 1, arm: 0 })));
        // The same answer keeps it twice as long, up to MAX_KEEP; another starts over.
        for keep in [2 * KEEP, 4 * KEEP, 8 * KEEP, MAX_KEEP, MAX_KEEP] {
            assert_eq!(settle(&mut t, 64 << 10, |split| if split == 16 << 10 { 6_000 } else { 10_000 }), 2);
            assert_eq!(t.classes[1].keep, keep);
            t.classes[1].keep = 0;
        }
        assert_eq!(settle(&mut t, 64 << 10, |split| if split == 32 << 10 { 6_000 } else { 10_000 }), 4);
        assert_eq!(t.classes[1].keep, KEEP);
    }

    #[test]
    fn the_fastest_sample_of_a_share_counts() {
        let mut t = SplitTuner::default();
        let mut n = 0;
        // Halves are fastest but their first two samples are slow.
        let share = settle(&mut t, 1 << 20, |split| {
            n += 1;
            match split {
                s if s == 512 << 10 && n <= 2 => 90_000,
                s if s == 512 << 10 => 60_000,
                _ => 70_000,
            }
        });
        assert_eq!(share, 4);
    }

    #[test]
    fn the_share_in_use_stays_unless_another_is_clearly_faster() {
        let mut t = SplitTuner::default();
        // A quarter 3 % faster than halves: halves stay; 10 % faster: a quarter.
        assert_eq!(settle(&mut t, 256 << 10, |split| if split == 64 << 10 { 97_000 } else { 100_000 }), 4);
        t.classes[3].keep = 0;
        assert_eq!(settle(&mut t, 256 << 10, |split| if split == 64 << 10 { 90_000 } else { 100_000 }), 2);
        // Now halves need the margin.
        t.classes[3].keep = 0;
        assert_eq!(settle(&mut t, 256 << 10, |split| if split == 128 << 10 { 97_000 } else { 100_000 }), 2);
    }

    #[test]
    fn messages_that_did_not_run_alone_are_not_trials() {
        let mut t = SplitTuner::default();
        for _ in 0..100 {
            assert_eq!(t.choose(256 << 10, false), (128 << 10, None));
        }
        // A late report of a search that ended is ignored.
        settle(&mut t, 256 << 10, |split| split as u64);
        assert_eq!(t.record(Trial { class: 3, arm: 0 }, 1), None);
        assert_eq!(t.share_eighths(256 << 10), 2);
    }

    #[test]
    fn classes_and_split_points() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(32 << 10), 0);
        assert_eq!(class_of((64 << 10) - 1), 0);
        assert_eq!(class_of(64 << 10), 1);
        assert_eq!(class_of(1 << 40), CLASSES - 1);
        assert_eq!(split_at(4 << 20, 3), 3 << 19);
        assert_eq!(split_at(100_000, 4), 49_152, "page aligned");
        assert_eq!(split_at(4096, 2), 0);
        assert_eq!(percent_of(64 << 10, 30), 16 << 10);
        assert_eq!(percent_of(1 << 40, 99), ((1usize << 40) / 100 * 99) & !4095);
    }
}
