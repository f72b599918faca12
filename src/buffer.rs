//! [`RegisteredBuffer`]: memory registered once with the channels that need registration.

use std::ops::{Deref, DerefMut};

/// Memory that polyrail allocated and registered once with every channel that registers memory
/// for one-sided transfers (the `ib` channel), so that messages sent from it or received into
/// it skip per-message registration (the "pre-registered pool" of DCFA-MPI). Node-local
/// channels need no registration and treat it as ordinary memory.
///
/// Allocate with [`crate::Context::alloc_registered`] and give it back with
/// [`crate::Context::free_registered`]. A buffer dropped without that stays mapped (and
/// registered) until the process ends, so that no transfer can ever land in memory that was
/// reused for something else.
pub struct RegisteredBuffer {
    ptr: *mut u8,
    len: usize,
    freed: bool,
}

// SAFETY: the buffer owns its mapping exclusively; it is plain memory.
unsafe impl Send for RegisteredBuffer {}

impl RegisteredBuffer {
    /// Maps `len` zeroed bytes (at least one page).
    pub(crate) fn map(len: usize) -> polyrail_core::Result<RegisteredBuffer> {
        // SAFETY: an anonymous private mapping without an address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(polyrail_core::Error::last_os(format_args!("mapping a registered buffer of {len} bytes")));
        }
        Ok(RegisteredBuffer { ptr: ptr.cast(), len, freed: false })
    }

    /// The memory as channels see it.
    pub(crate) fn region(&self) -> polyrail_core::Region {
        polyrail_core::Region { ptr: self.ptr, len: self.len }
    }

    /// Unmaps the memory; the caller ended its registrations first.
    pub(crate) fn unmap(mut self) {
        self.freed = true;
        // SAFETY: the mapping made in `map`, unmapped once (`freed` keeps Drop away).
        unsafe { libc::munmap(self.ptr.cast(), self.len.max(1)) };
    }
}

impl Deref for RegisteredBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is mapped, initialized (zero-filled) and owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for RegisteredBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for RegisteredBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuffer").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        if !self.freed {
            tracing::debug!(
                "a registered buffer of {} bytes was dropped without Context::free_registered: it stays mapped",
                self.len
            );
        }
    }
}
