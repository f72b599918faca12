//! Matching spaces: separate traffic over the same ranks (`MPI_Comm_dup` of the whole job).

use crate::context::{Context, Request};
use crate::scope::{scope_in, Scope};
use polyrail_core::engine::{Source, Status, TagMatch};
use polyrail_core::{Rank, RegionMut, Result};

/// A matching space: a message sent in one matches only receives and probes in the same one,
/// whatever its tag (as with `MPI_Comm_dup` of the whole job: the same ranks, separate
/// traffic). The calls of [`Context`] itself use [`Space::WORLD`]; a library sharing the job
/// with its caller makes its own with [`Context::new_space`], so that no `ANY_TAG` receive of
/// either can take the other's messages. Use one with [`Context::in_space`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Space(pub(crate) u16);

impl Space {
    /// The space of [`Context`]'s own calls.
    pub const WORLD: Space = Space(0);
    /// The first space [`Context::new_space`] makes (the one before it carries the barrier).
    pub(crate) const FIRST_MADE: u16 = 2;
}

/// [`Context`]'s point-to-point calls in one [`Space`] (from [`Context::in_space`]). Requests
/// they start are waited for, tested and cancelled through the context as any other.
pub struct InSpace<'a> {
    pub(crate) ctx: &'a mut Context,
    pub(crate) space: u16,
}

impl InSpace<'_> {
    /// [`Context::send`] in this space.
    pub fn send(&mut self, to: Rank, tag: u32, buf: &[u8]) -> Result<()> {
        self.ctx.send_in(self.space, to, tag, buf)
    }

    /// [`Context::recv`] in this space.
    pub fn recv(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>, buf: &mut [u8]) -> Result<Status> {
        self.ctx.recv_in(self.space, from.into(), tag.into(), buf)
    }

    /// [`Context::isend`] in this space.
    pub fn isend(&mut self, to: Rank, tag: u32, buf: Vec<u8>) -> Result<Request> {
        self.ctx.isend_in(self.space, to, tag, buf)
    }

    /// [`Context::irecv`] in this space.
    pub fn irecv(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>, buf: Vec<u8>) -> Result<Request> {
        self.ctx.irecv_in(self.space, from.into(), tag.into(), buf)
    }

    /// [`Context::isend_raw`] in this space.
    ///
    /// # Safety
    /// As for [`Context::isend_raw`].
    pub unsafe fn isend_raw(&mut self, to: Rank, tag: u32, ptr: *const u8, len: usize) -> Result<Request> {
        // SAFETY: forwarded to the caller.
        unsafe { self.ctx.isend_raw_in(self.space, to, tag, ptr, len) }
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
        // SAFETY: forwarded to the caller.
        unsafe { self.ctx.irecv_raw_in(self.space, from.into(), tag.into(), RegionMut { ptr, len }) }
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
        self.ctx.sendrecv_in(self.space, to, send_tag, send_buf, from.into(), recv_tag.into(), recv_buf)
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
        self.ctx.probe_in(self.space, from.into(), tag.into())
    }

    /// [`Context::iprobe`] in this space.
    pub fn iprobe(&mut self, from: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Option<Status>> {
        self.ctx.iprobe_in(self.space, from.into(), tag.into())
    }
}
