//! [`RegisteredBuffer`]: memory registered once with the channels that need registration.

use crate::context::ContextMark;
use polyrail_core::AnonMemory;
use std::ops::{Deref, DerefMut};

/// Memory that polyrail allocated and registered once with every channel that registers memory
/// for one-sided transfers, so that messages sent from it or received into it skip
/// per-message registration (the "pre-registered pool" of DCFA-MPI) on the `ib` channel. It is
/// a memory file that the other processes of the machine map once, so the `cma` channel moves
/// large messages from and into it with plain copies instead of the kernel's page pinning
/// (where memory files are missing it is private memory, and `cma` uses the kernel). Each
/// buffer holds one file descriptor while it is allocated: allocate few large buffers and carve
/// them up, rather than one per message.
///
/// Allocate with [`crate::Context::alloc_registered`] and give it back with
/// [`crate::Context::free_registered`]. A buffer dropped without that stays mapped (and
/// registered) until the process ends, so that no transfer can ever land in memory that was
/// reused for something else.
pub struct RegisteredBuffer {
    /// The memory; `None` once given back (then it was unmapped).
    memory: Option<AnonMemory>,
    len: usize,
    /// The context that registered it, the only one that can end its registrations.
    made_by: ContextMark,
}

impl RegisteredBuffer {
    /// Maps `len` zeroed bytes (at least one page) of a memory file, or of private memory
    /// where memory files are missing.
    pub(crate) fn map(len: usize, made_by: ContextMark) -> polyrail_core::Result<RegisteredBuffer> {
        const WHAT: &str = "a registered buffer";
        let memory = AnonMemory::shared(len, WHAT).or_else(|e| {
            tracing::debug!("{e}: the registered buffer is private memory");
            AnonMemory::new(len, WHAT)
        })?;
        Ok(RegisteredBuffer { memory: Some(memory), len, made_by })
    }

    /// The context that registered it.
    pub(crate) fn made_by(&self) -> ContextMark {
        self.made_by
    }

    /// The memory file behind the buffer, if it has one.
    pub(crate) fn file(&self) -> Option<polyrail_core::SharedFile> {
        self.memory.as_ref().and_then(AnonMemory::file)
    }

    fn ptr(&self) -> *mut u8 {
        self.memory.as_ref().map_or(std::ptr::NonNull::dangling().as_ptr(), AnonMemory::ptr)
    }

    /// The memory as channels see it.
    pub(crate) fn region(&self) -> polyrail_core::Region {
        polyrail_core::Region { ptr: self.ptr(), len: self.len }
    }

    /// Unmaps the memory; the caller ended its registrations first.
    pub(crate) fn unmap(mut self) {
        self.memory = None;
    }
}

impl Deref for RegisteredBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is mapped (at least `len` bytes), zero-initialized at
        // first and owned by self; the buffer is never used after `unmap` consumed it.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl DerefMut for RegisteredBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

impl std::fmt::Debug for RegisteredBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuffer").field("ptr", &self.ptr()).field("len", &self.len).finish()
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            tracing::debug!(
                "a registered buffer of {} bytes was dropped without Context::free_registered: it stays mapped",
                self.len
            );
            // Peers or a device may still write it: the mapping must never be reused.
            std::mem::forget(memory);
        }
    }
}
