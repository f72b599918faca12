//! How fast this process fills send cells for one peer, and whether that is slow just now.
//!
//! On an AMD EPYC host (an earlier record, in git history), with both vCPUs in one core complex, the host
//! at times slows the transfer of lines between the two cores for seconds to minutes while a
//! single line still crosses in 40 ns: filling a 16 KiB cell the receiver read last time (each
//! line taken back from its cache) then runs at 8-14 GB/s instead of 20-45 (timed fills in
//! osu_bw, 16 KiB and 128 KiB, runs of both kinds minutes apart), and a stream through cells
//! drops from 25-30 GB/s to about 10. Single copy reads the sender's buffer where the receiver's
//! core cached it last time and does not slow as much (64 KiB 11-15 GB/s, 128 KiB 15-20, in
//! osu_bw). A sampled fill tells the two states apart; the engine then sends medium messages
//! as it does to an apart peer ([`polyrail_core::observe::Observation::CopiesSlow`]).
//!
//! The usual rate starts at half of a copy within this process (measured once; about 90 GB/s
//! for 16 KiB on that host), so that a process which starts in the slow state sees it, and
//! then follows the samples.

use std::time::{Duration, Instant};

use polyrail_core::observe::InARow;

/// A fill below this fraction of the usual rate is slow (the two states differ about 3x).
const SLOW_FRACTION: f32 = 0.5;
/// The usual rate follows samples that are not slow by this fraction of each one's difference,
/// and slow ones by a 64th of that: a slow stretch keeps its verdict for several hundred
/// samples, and a usual rate set too high at first (on a machine whose fills between cores
/// are always far slower than a copy within one) comes down all the same.
const FOLLOW: f32 = 1.0 / 16.0;
/// Samples above this rate (bytes per ns) are a clock's glitch, not a copy.
const PLAUSIBLE_MAX: f32 = 256.0;
/// How long three slow samples in a row ([`InARow`]; in the fast state about 1.5 % of the
/// timed fills on the host above were below half the usual rate, so three in a row are rare
/// there) keep the verdict. Meanwhile the engine sends large messages by single copy and few
/// cells are filled; after it the cells are tried again, and three slow samples (96 messages,
/// 1.5 MiB of 16 KiB cells, about 0.15 ms at the slow rate) bring the verdict back: under 1 % of
/// a stream's time.
pub(crate) const SLOW_HOLD: Duration = Duration::from_millis(20);
/// Fills smaller than this are not timed: their time is mostly fixed costs.
pub(crate) const TIMED_FILL_MIN: usize = 8192;
/// A fill between cores that share a cache runs at up to about this share of a copy within one
/// core (20-45 against about 90 GB/s on the host above; the usual rate comes down to the fast
/// fills' within some 30 samples).
const LOCAL_SHARE: f32 = 0.5;

/// Timed fills of cells to one peer (with ordinary stores: non-temporal ones, used while the
/// peer is apart, are not timed).
#[derive(Debug)]
pub(crate) struct FillRate {
    /// The usual rate in bytes per nanosecond (GB/s): at first [`LOCAL_SHARE`] of a local copy,
    /// then following the samples ([`FOLLOW`]).
    usual: f32,
    /// Whether a fill was timed yet.
    sampled: bool,
    /// Samples towards a verdict of slow fills (`true`).
    slow_samples: InARow,
    /// Until when the fills count as slow (after three slow samples in a row).
    slow_until: Option<Instant>,
}

impl FillRate {
    /// Nothing timed yet; `local_rate`: a copy within this process in bytes per ns
    /// ([`local_copy_rate`]).
    pub(crate) fn new(local_rate: f32) -> FillRate {
        FillRate { usual: local_rate * LOCAL_SHARE, sampled: false, slow_samples: InARow::default(), slow_until: None }
    }

    /// Notes a fill of `bytes` that took `ns` nanoseconds, ending at `now`.
    pub(crate) fn sample(&mut self, bytes: usize, ns: u64, now: Instant) {
        let rate = bytes as f32 / ns.max(1) as f32;
        if rate > PLAUSIBLE_MAX {
            return;
        }
        self.sampled = true;
        let slow = rate < self.usual * SLOW_FRACTION;
        // Several in a row decide: one fill stretched by an interrupt does not.
        let verdict = self.slow_samples.note(slow);
        if slow {
            if verdict.is_some() {
                self.slow_until = Some(now + SLOW_HOLD);
            }
            self.usual += (rate - self.usual) * (FOLLOW / 64.0);
        } else {
            self.usual += (rate - self.usual) * FOLLOW;
            self.slow_until = None;
        }
    }

    /// `None` before the first sample; else whether fills were slow within [`SLOW_HOLD`]
    /// before `now` (read only while a verdict holds).
    pub(crate) fn slow(&self, now: impl FnOnce() -> Instant) -> Option<bool> {
        self.sampled.then(|| self.slow_until.is_some_and(|until| now() < until))
    }

    /// Whether a verdict of slow fills holds (without reading the clock: `slow_until` may
    /// have passed), for `polyrail info`.
    pub(crate) fn held(&self) -> bool {
        self.slow_until.is_some()
    }
}

/// How fast this process copies [`TIMED_FILL_MIN`] * 2 bytes within its own memory, in bytes
/// per ns: the median of 15 copies after a first one.
pub(crate) fn local_copy_rate() -> f32 {
    let len = 2 * TIMED_FILL_MIN;
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    let mut ns: Vec<u64> = (0..16)
        .map(|_| {
            let start = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
            start.elapsed().as_nanos() as u64
        })
        .skip(1)
        .collect();
    ns.sort_unstable();
    (len as f32 / ns[ns.len() / 2].max(1) as f32).min(PLAUSIBLE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB16: usize = 16 << 10;

    /// A 16 KiB fill at `gbps` GB/s (bytes per ns).
    fn fill(r: &mut FillRate, gbps: u64, now: Instant) {
        r.sample(KIB16, KIB16 as u64 / gbps, now);
    }

    #[test]
    fn slow_fills_in_a_row_make_a_verdict_that_expires() {
        let t = Instant::now();
        let mut r = FillRate::new(64.0);
        assert_eq!(r.slow(|| t), None, "nothing timed yet");
        for _ in 0..8 {
            fill(&mut r, 32, t);
        }
        assert_eq!(r.slow(|| t), Some(false));
        fill(&mut r, 10, t);
        assert_eq!(r.slow(|| t), Some(false), "one slow fill is not a verdict");
        fill(&mut r, 10, t);
        fill(&mut r, 30, t);
        fill(&mut r, 10, t);
        fill(&mut r, 10, t);
        assert_eq!(r.slow(|| t), Some(false), "nor three that are not in a row");
        fill(&mut r, 11, t);
        assert_eq!(r.slow(|| t), Some(true));
        assert!(r.held());
        assert_eq!(r.slow(|| t + SLOW_HOLD / 2), Some(true));
        assert_eq!(r.slow(|| t + SLOW_HOLD), Some(false), "the verdict expires");
        fill(&mut r, 12, t);
        assert_eq!(r.slow(|| t), Some(true), "slow samples renew it");
        fill(&mut r, 28, t);
        assert_eq!(r.slow(|| t), Some(false), "a fast one ends it");
        assert!(!r.held());
    }

    #[test]
    fn the_usual_rate_follows_fast_fills_and_slowly_slow_ones() {
        let t = Instant::now();
        // A process that starts while fills are slow sees it from a local copy's rate ...
        let mut r = FillRate::new(64.0);
        for _ in 0..3 {
            fill(&mut r, 10, t);
        }
        assert_eq!(r.slow(|| t), Some(true));
        // ... the usual rate comes to the fast fills ...
        for _ in 0..100 {
            fill(&mut r, 25, t);
        }
        assert!((r.usual - 25.0).abs() < 1.0, "usual {}", r.usual);
        for _ in 0..3 {
            fill(&mut r, 10, t);
        }
        assert_eq!(r.slow(|| t), Some(true));
        // ... a slow stretch of hundreds of samples keeps its verdict ...
        for _ in 0..300 {
            fill(&mut r, 10, t);
        }
        assert_eq!(r.slow(|| t), Some(true));
        // ... and one of thousands (or a usual rate far too high from the start) wears off.
        for _ in 0..3000 {
            fill(&mut r, 10, t);
        }
        assert_eq!(r.slow(|| t), Some(false));
        r.sample(KIB16, 0, t);
        assert_eq!(r.slow(|| t), Some(false), "a glitch of the clock is no sample");
    }

    #[test]
    fn a_local_copy_has_a_plausible_rate() {
        let rate = local_copy_rate();
        assert!(rate > 0.0 && rate <= PLAUSIBLE_MAX, "{rate}");
    }
}
