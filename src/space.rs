//! Matching spaces: separate traffic over the whole job (`MPI_Comm_dup`) or over some of its
//! ranks (`MPI_Comm_split`).

use std::sync::Arc;

use crate::context::{Context, Request, BARRIER_CTX};
use crate::scope::{scope_in, Scope};
use polyrail_core::engine::{Source, Status, TagMatch};
use polyrail_core::policy::topology::TopoClass;
use polyrail_core::{Error, Rank, RegionMut, Result};

/// A matching space: a message sent in one matches only receives and probes in the same one,
/// whatever its tag. The calls of [`Context`] itself use [`Space::WORLD`]; a library sharing
/// the job with its caller makes its own with [`Context::new_space`] (as `MPI_Comm_dup` of the
/// whole job: the same ranks, separate traffic), so that no `ANY_TAG` receive of either can
/// take the other's messages. [`InSpace::split`] makes spaces over some of the ranks (as
/// `MPI_Comm_split`), numbered from 0 in each. Use one with [`Context::in_space`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Space {
    /// The engine's matching context of its messages.
    pub(crate) ctx: u16,
    /// Its ranks, when it does not span the whole job.
    pub(crate) members: Option<Arc<Members>>,
}

impl Space {
    /// The space of [`Context`]'s own calls.
    pub const WORLD: Space = Space { ctx: 0, members: None };
    /// The first space [`Context::new_space`] makes (the one before it carries the barrier).
    pub(crate) const FIRST_MADE: u16 = 2;
    /// The matching context of the first spaces [`InSpace::split`] makes; later splits count
    /// down from it, two contexts each (its messages, and its barrier's and splits').
    pub(crate) const FIRST_SPLIT: u16 = u16::MAX;

    /// The job ranks of this space's ranks (the job rank of space rank `i` is at `i`), or
    /// `None` when it spans the whole job with the same numbering.
    pub fn job_ranks(&self) -> Option<&[Rank]> {
        self.members.as_deref().map(|m| &m.job[..])
    }
}

/// The ranks of a space made by [`InSpace::split`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Members {
    /// Job rank of each member, by its rank in the space.
    job: Vec<Rank>,
    /// `(job rank, space rank)` of each member, sorted by job rank.
    by_job: Vec<(Rank, Rank)>,
    /// This process's rank in the space.
    me: Rank,
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

/// The job rank of rank `r` of the space of `members` (the whole job when `None`).
pub(crate) fn job_rank_in(members: Option<&Members>, r: Rank) -> Result<Rank> {
    members.map_or(Ok(r), |m| m.job_rank(r))
}

/// `from`, a source in the space of `members`, as a source in the whole job.
pub(crate) fn source_in(members: Option<&Members>, from: Source) -> Result<Source> {
    members.map_or(Ok(from), |m| m.source(from))
}

/// `status`, of a message in the space of `members`, with the source's rank in that space.
pub(crate) fn status_in(members: Option<&Members>, status: Status) -> Result<Status> {
    members.map_or(Ok(status), |m| m.status(status))
}

/// [`Context`]'s point-to-point calls in one [`Space`] (from [`Context::in_space`]). Ranks
/// given to them and named in their statuses are ranks of the space. Requests they start are
/// waited for, tested and cancelled through the context as any other (their statuses, too,
/// name ranks of the space); errors name job ranks.
pub struct InSpace<'a> {
    pub(crate) ctx: &'a mut Context,
    pub(crate) space: &'a Space,
}

impl<'a> InSpace<'a> {
    /// This process's rank in the space.
    pub fn rank(&self) -> Rank {
        self.members().map_or_else(|| self.ctx.rank(), |m| m.me)
    }

    /// The number of ranks in the space.
    pub fn size(&self) -> u32 {
        self.members().map_or_else(|| self.ctx.size(), |m| m.job.len() as u32)
    }

    /// [`Context::send`] in this space.
    pub fn send(&mut self, to: Rank, tag: u32, buf: &[u8]) -> Result<()> {
        let to = self.job_rank(to)?;
        self.ctx.send_in(self.space.ctx, to, tag, buf)
    }

    /// [`Context::recv`] in this space.
    pub fn recv(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>, buf: &mut [u8]) -> Result<Status> {
        let from = self.source(from.into())?;
        let status = self.ctx.recv_in(self.space.ctx, from, tag.into(), buf)?;
        status_in(self.members(), status)
    }

    /// [`Context::isend`] in this space.
    pub fn isend(&mut self, to: Rank, tag: u32, buf: Vec<u8>) -> Result<Request> {
        let to = self.job_rank(to)?;
        let req = self.ctx.isend_in(self.space.ctx, to, tag, buf)?;
        self.tagged(req)
    }

    /// [`Context::irecv`] in this space.
    pub fn irecv(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>, buf: Vec<u8>) -> Result<Request> {
        let from = self.source(from.into())?;
        let req = self.ctx.irecv_in(self.space.ctx, from, tag.into(), buf)?;
        self.tagged(req)
    }

    /// [`Context::isend_raw`] in this space.
    ///
    /// # Safety
    /// As for [`Context::isend_raw`].
    pub unsafe fn isend_raw(&mut self, to: Rank, tag: u32, ptr: *const u8, len: usize) -> Result<Request> {
        let to = self.job_rank(to)?;
        // SAFETY: forwarded to the caller.
        let req = unsafe { self.ctx.isend_raw_in(self.space.ctx, to, tag, ptr, len)? };
        self.tagged(req)
    }

    /// [`Context::irecv_raw`] in this space.
    ///
    /// # Safety
    /// As for [`Context::irecv_raw`].
    pub unsafe fn irecv_raw(
        &mut self,
        from: impl Into<Source>,
        tag: impl Into<TagMatch>,
        ptr: *mut u8,
        len: usize,
    ) -> Result<Request> {
        let from = self.source(from.into())?;
        // SAFETY: forwarded to the caller.
        let req = unsafe { self.ctx.irecv_raw_in(self.space.ctx, from, tag.into(), RegionMut { ptr, len })? };
        self.tagged(req)
    }

    /// [`Context::sendrecv`] in this space.
    pub fn sendrecv(
        &mut self,
        to: Rank,
        send_tag: u32,
        send_buf: &[u8],
        from: impl Into<Source>,
        recv_tag: impl Into<TagMatch>,
        recv_buf: &mut [u8],
    ) -> Result<Status> {
        let (to, from) = (self.job_rank(to)?, self.source(from.into())?);
        let status = self.ctx.sendrecv_in(self.space.ctx, to, send_tag, send_buf, from, recv_tag.into(), recv_buf)?;
        status_in(self.members(), status)
    }

    /// [`Context::scope`] whose [`Scope::isend`] and [`Scope::irecv`] are in this space.
    pub fn scope<'env, F, T>(&mut self, f: F) -> T
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
    {
        scope_in(self.ctx, self.space, f)
    }

    /// [`Context::probe`] in this space.
    pub fn probe(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        let from = self.source(from.into())?;
        let status = self.ctx.probe_in(self.space.ctx, from, tag.into())?;
        status_in(self.members(), status)
    }

    /// [`Context::iprobe`] in this space.
    pub fn iprobe(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Option<Status>> {
        let from = self.source(from.into())?;
        let status = self.ctx.iprobe_in(self.space.ctx, from, tag.into())?;
        status.map(|s| status_in(self.members(), s)).transpose()
    }

    /// Waits until every rank of the space called `barrier` on it.
    pub fn barrier(&mut self) -> Result<()> {
        match self.members() {
            None => self.ctx.barrier(),
            Some(m) => self.ctx.barrier_over(self.control(), m.me, &m.job),
        }
    }

    /// Splits the space (`MPI_Comm_split`): every rank of it calls `split`, and those giving the
    /// same `Some(color)` get a new space of their own, ranked by `key` (ties by their rank
    /// here); `None` takes part and gets no space. The new spaces' messages never meet those of
    /// any other space. A collective call: each rank sends its color and key to every other.
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
        let whole_job: Vec<Rank>;
        let (control, job, me) = match self.members() {
            None => {
                whole_job = (0..self.ctx.size()).collect();
                (BARRIER_CTX, &whole_job[..], self.ctx.rank())
            }
            Some(m) => (self.control(), &m.job[..], m.me),
        };
        let entries = self.ctx.exchange_split(control, me, job, color, key)?;
        // Every rank of the space now knows every entry, so all reach the same contexts.
        let ctx = entries.iter().map(|e| e.next).min().unwrap_or(Space::FIRST_SPLIT);
        self.ctx.take_split_contexts(ctx)?;
        let Some(color) = color else { return Ok(None) };
        let mut mine: Vec<(u32, Rank)> =
            entries.iter().zip(0..).filter(|(e, _)| e.color == Some(color)).map(|(e, r)| (e.key, r)).collect();
        mine.sort_unstable();
        // This rank's own entry, at `me`, has its color.
        let new_me = mine.iter().position(|&(_, r)| r == me).unwrap_or_default() as Rank;
        let members = Members::new(mine.iter().map(|&(_, r)| job[r as usize]).collect(), new_me);
        self.ctx.note_members(ctx, &members.job);
        Ok(Some(Space { ctx, members: Some(Arc::new(members)) }))
    }

    /// Splits the space by node (`MPI_Comm_split_type` with `MPI_COMM_TYPE_SHARED`): every rank
    /// of it calls this and gets the space of its ranks on this rank's node (the same machine
    /// and virtual node, `POLYRAIL_NODE`), in their order here. A collective call, as
    /// [`InSpace::split`].
    pub fn split_by_node(&mut self) -> Result<Space> {
        let peers = &self.ctx.report().peers;
        let on_my_node = |j: &Rank| peers.get(*j as usize).is_some_and(|p| p.class != TopoClass::RemoteNode);
        let (me, first) = match self.members() {
            None => (self.ctx.rank(), (0..self.ctx.size()).find(on_my_node)),
            Some(m) => (m.me, m.job.iter().copied().find(on_my_node)),
        };
        // The same color on every rank of a node: its first job rank in the space.
        let color = first.unwrap_or(me);
        self.split(Some(color), me)?.ok_or_else(|| Error::InvalidArgument("a split with a color gave no space".into()))
    }

    /// Matching context of the barrier and splits of a split space: the one below its own
    /// (a split takes both).
    fn control(&self) -> u16 {
        self.space.ctx - 1
    }

    /// The space's ranks (borrowed from the space, not from `self`).
    fn members(&self) -> Option<&'a Members> {
        self.space.members.as_deref()
    }

    fn job_rank(&self, r: Rank) -> Result<Rank> {
        job_rank_in(self.members(), r)
    }

    fn source(&self, from: Source) -> Result<Source> {
        source_in(self.members(), from)
    }

    /// `req`, whose status is to name ranks of this space.
    fn tagged(&self, req: Request) -> Result<Request> {
        req.in_space(&self.space.members)
    }
}

/// What a rank tells the others in [`InSpace::split`].
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
