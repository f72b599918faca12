//! Polling priority among the peers of one channel (Chai Ch. 7): the peer that delivered last is
//! polled on every call, every peer about every [`PeerSweep::EVERY`]-th call, so the cost of a
//! poll does not grow with the number of idle peers.

use crate::error::Rank;

/// Which peers of a channel a `progress` call polls. Channels keep one and hand it their list
/// of connected peers and a function that polls one of them.
#[derive(Debug, Default)]
pub struct PeerSweep {
    /// Where the next sweep starts (round robin, so no peer is always last).
    next: usize,
    /// The peer that delivered last.
    hot: Option<Rank>,
    /// Calls so far, and the call of the last sweep.
    calls: u32,
    last_sweep: u32,
}

impl PeerSweep {
    /// Every how many calls all peers are polled.
    pub const EVERY: u32 = 32;

    /// Polls `peers` for up to `budget` arrivals with `poll(peer, budget left)`, which returns
    /// how many it delivered; returns the total. A sweep due while the hot peer delivers waits
    /// for a call where it does not, but never longer than 8 sweep periods: a busy peer cannot
    /// starve the others.
    #[inline]
    pub fn run(&mut self, peers: &[Rank], budget: usize, mut poll: impl FnMut(Rank, usize) -> usize) -> usize {
        let n = peers.len();
        if n == 0 {
            return 0;
        }
        self.calls = self.calls.wrapping_add(1);
        let since = self.calls.wrapping_sub(self.last_sweep);
        let mut done = 0;
        if let Some(hot) = self.hot {
            done = poll(hot, budget);
            let overdue = since >= 8 * Self::EVERY;
            if since < Self::EVERY || (done > 0 && !overdue) || done >= budget {
                return done;
            }
        }
        self.last_sweep = self.calls;
        let start = self.next.min(n - 1);
        self.next = if start + 1 >= n { 0 } else { start + 1 };
        for step in 0..n {
            let i = if start + step >= n { start + step - n } else { start + step };
            let got = poll(peers[i], budget - done);
            if got > 0 {
                self.hot = Some(peers[i]);
            }
            done += got;
            if done >= budget {
                break;
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_peers_are_polled_once_per_sweep_and_the_busy_one_every_call() {
        let peers: Vec<Rank> = (1..=10).collect();
        let mut sweep = PeerSweep::default();
        let mut polls = [0usize; 11];
        for _ in 0..PeerSweep::EVERY * 4 {
            sweep.run(&peers, 64, |p, _| {
                polls[p as usize] += 1;
                (p == 3) as usize
            });
        }
        assert_eq!(polls[3], PeerSweep::EVERY as usize * 4, "the delivering peer is polled on every call");
        for p in peers.iter().filter(|&&p| p != 3) {
            // The first call sweeps; later sweeps wait while peer 3 keeps delivering, at most 8
            // periods.
            assert!((1..=2).contains(&polls[*p as usize]), "peer {p} polled {} times", polls[*p as usize]);
        }
    }

    #[test]
    fn a_sweep_stops_at_the_budget_and_an_empty_list_polls_nothing() {
        let mut sweep = PeerSweep::default();
        assert_eq!(sweep.run(&[], 8, |_, _| panic!("no peer to poll")), 0);
        let got = sweep.run(&[1, 2, 3], 2, |_, left| left.min(1));
        assert_eq!(got, 2);
    }
}
