//! Matching spaces: separate traffic over the whole job (`MPI_Comm_dup`) or over some of its
//! ranks (`MPI_Comm_split`).

use std::sync::Arc;

use crate::comm::{Comm, CommKind, Within};
use crate::context::{Request, BARRIER_CTX};
use polyrail_core::engine::{Source, Status};
use polyrail_core::policy::topology::TopoClass;
use polyrail_core::{Error, Rank, Result};

/// A matching space: a message sent in one matches only receives and probes in the same one,
/// whatever its tag. The calls of [`crate::Context`] itself use [`Space::WORLD`]; a library
/// sharing the job with its caller makes its own with [`crate::Context::new_space`] (as
/// `MPI_Comm_dup` of the whole job: the same ranks, separate traffic), so that no `ANY_TAG`
/// receive of either can take the other's messages. [`Comm::split`] makes spaces over some of
/// the ranks (as `MPI_Comm_split`), numbered from 0 in each. Use one with [`Comm::in_space`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Space {
    /// The engine's matching context of its messages.
    pub(crate) ctx: u16,
    /// Its ranks, when it does not span the whole job.
    pub(crate) members: Option<Arc<Members>>,
}

impl Space {
    /// The space of [`crate::Context`]'s own calls.
    pub const WORLD: Space = Space { ctx: 0, members: None };
    /// The first space [`crate::Context::new_space`] makes (the one before it carries the
    /// barrier).
    pub(crate) const FIRST_MADE: u16 = 2;
    /// The matching context of the first spaces [`Comm::split`] makes; later splits count
    /// down from it, two contexts each (its messages, and its barrier's and splits').
    pub(crate) const FIRST_SPLIT: u16 = u16::MAX;

    /// The job ranks of this space's ranks (the job rank of space rank `i` is at `i`), or
    /// `None` when it spans the whole job with the same numbering.
    pub fn job_ranks(&self) -> Option<&[Rank]> {
        self.members.as_deref().map(|m| &m.job[..])
    }
}

/// The communicator of one [`Space`] of a [`crate::Context`] (from [`Comm::in_space`]): the
/// same calls as the context's, in that space. Ranks given to them and named in their statuses
/// are ranks of the space, as are those named in the statuses of the requests they start
/// (which any communicator of the context waits for, tests and cancels); errors name job ranks.
pub type InSpace<'a> = Comm<Within<'a>>;

/// Where a communicator's calls go: the matching context of its messages, and its ranks when
/// it does not span the whole job. Constant for the world, so that its calls translate nothing.
#[derive(Clone, Copy)]
pub(crate) struct At<'s> {
    /// The engine's matching context of its messages.
    pub(crate) ctx: u16,
    /// Its members, when it does not span the whole job with the job's numbering.
    pub(crate) members: Option<&'s Arc<Members>>,
}

impl<'s> At<'s> {
    /// The whole job.
    pub(crate) const WORLD: At<'static> = At { ctx: Space::WORLD.ctx, members: None };

    /// `space`, or the whole job when `None`.
    #[inline]
    pub(crate) fn of(space: Option<&'s Space>) -> At<'s> {
        match space {
            None => At::WORLD,
            Some(s) => At { ctx: s.ctx, members: s.members.as_ref() },
        }
    }

    /// Its members (borrowed from the space, not from `self`).
    #[inline]
    pub(crate) fn members(&self) -> Option<&'s Members> {
        self.members.map(|m| &**m)
    }

    /// The job rank of its rank `r`; an error naming `r` when it has no such rank.
    #[inline]
    pub(crate) fn job_rank(&self, r: Rank) -> Result<Rank> {
        self.members().map_or(Ok(r), |m| m.job_rank(r))
    }

    /// `from`, a source in it, as a source in the whole job.
    #[inline]
    pub(crate) fn source(&self, from: Source) -> Result<Source> {
        self.members().map_or(Ok(from), |m| m.source(from))
    }

    /// `status`, of a message in it, with the source's rank in it.
    #[inline]
    pub(crate) fn status(&self, status: Status) -> Result<Status> {
        status_in(self.members(), status)
    }

    /// `req`, started in it: its status is to name ranks of it.
    #[inline]
    pub(crate) fn request<T>(&self, req: Request<T>) -> Result<Request<T>> {
        match self.members {
            None => Ok(req),
            members => req.in_space(members),
        }
    }

    /// Matching context of the barrier and splits: the whole job's for a space over the whole
    /// job, else the one below the space's own (a split takes both).
    pub(crate) fn control(&self) -> u16 {
        match self.members {
            None => BARRIER_CTX,
            Some(_) => self.ctx - 1,
        }
    }
}

/// The ranks of a space made by [`Comm::split`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Members {
    /// Job rank of each member, by its rank in the space.
    pub(crate) job: Vec<Rank>,
    /// `(job rank, space rank)` of each member, sorted by job rank.
    by_job: Vec<(Rank, Rank)>,
    /// This process's rank in the space.
    pub(crate) me: Rank,
}

impl Members {
    /// The members of a space: `job` by space rank, with this process at `me`.
    fn new(job: Vec<Rank>, me: Rank) -> Members {
        let mut by_job: Vec<(Rank, Rank)> = job.iter().zip(0..).map(|(&j, i)| (j, i)).collect();
        by_job.sort_unstable();
        Members { job, by_job, me }
    }

    /// The job rank of this process, as the space knows it.
    pub(crate) fn my_job_rank(&self) -> Option<Rank> {
        self.job.get(self.me as usize).copied()
    }

    /// The job rank of space rank `r`; an error naming it when the space has no such rank.
    fn job_rank(&self, r: Rank) -> Result<Rank> {
        self.job.get(r as usize).copied().ok_or_else(|| {
            Error::InvalidArgument(format!("rank {r} is outside this space of {} ranks", self.job.len()))
        })
    }

    /// `from` with a rank in the space turned into its job rank.
    fn source(&self, from: Source) -> Result<Source> {
        match from {
            Source::Rank(r) => self.job_rank(r).map(Source::Rank),
            Source::Any => Ok(Source::Any),
        }
    }

    /// `status` of a message of this space, with its job rank source turned into its rank in
    /// the space. Only members send in a space's context, so another source broke the protocol.
    pub(crate) fn status(&self, mut status: Status) -> Result<Status> {
        let i = self.by_job.binary_search_by_key(&status.source, |&(j, _)| j).map_err(|_| Error::Protocol {
            peer: status.source,
            what: "sent a message in a space it is not a member of".into(),
        })?;
        status.source = self.by_job[i].1;
        Ok(status)
    }
}

/// `status`, of a message in the space of `members`, with the source's rank in that space.
pub(crate) fn status_in(members: Option<&Members>, status: Status) -> Result<Status> {
    members.map_or(Ok(status), |m| m.status(status))
}

impl<K: CommKind> Comm<K> {
    /// Splits the communicator's ranks (`MPI_Comm_split`): every rank of it calls `split`, and
    /// those giving the same `Some(color)` get a new space of their own, ranked by `key` (ties
    /// by their rank here); `None` takes part and gets no space. The new spaces' messages never
    /// meet those of any other space. A collective call: each rank sends its color and key to
    /// every other.
    ///
    /// ```no_run
    /// # fn main() -> polyrail::Result<()> {
    /// let mut ctx = polyrail::Context::init()?;
    /// let me = ctx.rank();
    /// // Two rows of a 2 x (n/2) grid: ranks 0, 2, 4, ... and 1, 3, 5, ...
    /// let row = ctx.split(Some(me % 2), me)?.expect("every rank has a color");
    /// let mut in_row = ctx.in_space(&row)?;
    /// println!("rank {me} is rank {} of {} in its row", in_row.rank(), in_row.size());
    /// in_row.barrier()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn split(&mut self, color: Option<u32>, key: u32) -> Result<Option<Space>> {
        let (world, at) = self.parts();
        let whole_job: Vec<Rank>;
        let (job, me) = match at.members() {
            None => {
                whole_job = (0..world.size()).collect();
                (&whole_job[..], world.rank())
            }
            Some(m) => (&m.job[..], m.me),
        };
        let entries = world.exchange_split(at.control(), me, job, color, key)?;
        // Every rank of the space now knows every entry, so all reach the same contexts.
        let ctx = entries.iter().map(|e| e.next).min().unwrap_or(Space::FIRST_SPLIT);
        world.take_split_contexts(ctx)?;
        let Some(color) = color else { return Ok(None) };
        let mut mine: Vec<(u32, Rank)> =
            entries.iter().zip(0..).filter(|(e, _)| e.color == Some(color)).map(|(e, r)| (e.key, r)).collect();
        mine.sort_unstable();
        // This rank's own entry, at `me`, has its color.
        let new_me = mine.iter().position(|&(_, r)| r == me).unwrap_or_default() as Rank;
        let members = Members::new(mine.iter().map(|&(_, r)| job[r as usize]).collect(), new_me);
        world.note_members(ctx, &members.job);
        Ok(Some(Space { ctx, members: Some(Arc::new(members)) }))
    }

    /// Splits the communicator's ranks by node (`MPI_Comm_split_type` with
    /// `MPI_COMM_TYPE_SHARED`): every rank of it calls this and gets the space of its ranks on
    /// this rank's node (the same machine and virtual node, `POLYRAIL_NODE`), in their order
    /// here. A collective call, as [`Comm::split`].
    pub fn split_by_node(&mut self) -> Result<Space> {
        let (world, at) = self.parts_ref();
        let peers = &world.report().peers;
        let on_my_node = |j: &Rank| peers.get(*j as usize).is_some_and(|p| p.class != TopoClass::RemoteNode);
        let (me, first) = match at.members() {
            None => (world.rank(), (0..world.size()).find(on_my_node)),
            Some(m) => (m.me, m.job.iter().copied().find(on_my_node)),
        };
        // The same color on every rank of a node: its first job rank in the space.
        let color = first.unwrap_or(me);
        self.split(Some(color), me)?.ok_or_else(|| Error::InvalidArgument("a split with a color gave no space".into()))
    }
}

/// What a rank tells the others in [`Comm::split`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitEntry {
    /// Its color (`None`: no new space for it).
    pub(crate) color: Option<u32>,
    /// Where its rank goes among those of its color.
    pub(crate) key: u32,
    /// The highest matching context it has not given to a split space yet.
    pub(crate) next: u16,
}

impl SplitEntry {
    /// Bytes of an encoded entry.
    pub(crate) const LEN: usize = 11;

    /// The entry as sent: a flag and the color, the key, the next context (little endian).
    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = self.color.is_some() as u8;
        b[1..5].copy_from_slice(&self.color.unwrap_or(0).to_le_bytes());
        b[5..9].copy_from_slice(&self.key.to_le_bytes());
        b[9..11].copy_from_slice(&self.next.to_le_bytes());
        b
    }

    /// The entry in `bytes` as received from `peer`; a malformed one is `peer`'s protocol error.
    pub(crate) fn decode(peer: Rank, bytes: &[u8]) -> Result<SplitEntry> {
        let bad = |what: &str| Error::Protocol { peer, what: format!("malformed split entry: {what}") };
        if bytes.len() != Self::LEN {
            return Err(bad(&format!("{} bytes, not {}", bytes.len(), Self::LEN)));
        }
        let color = match bytes[0] {
            0 => None,
            1 => Some(u32::from_le_bytes(bytes[1..5].try_into().expect("4 bytes"))),
            f => return Err(bad(&format!("color flag {f}"))),
        };
        let key = u32::from_le_bytes(bytes[5..9].try_into().expect("4 bytes"));
        let next = u16::from_le_bytes(bytes[9..11].try_into().expect("2 bytes"));
        Ok(SplitEntry { color, key, next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_entries_round_trip_and_malformed_ones_name_their_peer() {
        for e in [
            SplitEntry { color: None, key: 7, next: 65535 },
            SplitEntry { color: Some(0), key: 0, next: 3 },
            SplitEntry { color: Some(u32::MAX), key: u32::MAX, next: 100 },
        ] {
            assert_eq!(SplitEntry::decode(3, &e.encode()).unwrap(), e);
        }
        let mut bad = SplitEntry { color: Some(1), key: 2, next: 9 }.encode();
        bad[0] = 2;
        let err = SplitEntry::decode(5, &bad).unwrap_err();
        assert!(matches!(err, Error::Protocol { peer: 5, .. }), "{err}");
        assert!(matches!(SplitEntry::decode(4, &bad[..10]), Err(Error::Protocol { peer: 4, .. })));
    }

    #[test]
    fn members_translate_ranks_both_ways() {
        let m = Members::new(vec![6, 2, 9], 1);
        assert_eq!(m.job_rank(2).unwrap(), 9);
        assert!(matches!(m.job_rank(3), Err(Error::InvalidArgument(_))));
        assert_eq!(m.source(Source::Rank(0)).unwrap(), Source::Rank(6));
        assert_eq!(m.source(Source::Any).unwrap(), Source::Any);
        let st = m.status(Status { source: 9, tag: 1, len: 3 }).unwrap();
        assert_eq!(st.source, 2);
        assert!(matches!(m.status(Status { source: 4, tag: 1, len: 3 }), Err(Error::Protocol { peer: 4, .. })));
    }
}
