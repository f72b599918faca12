//! [`AnonMemory`]: zeroed, page-aligned memory of the process's own, for channels and the facade
//! to register or expose (the ib rings and staging, registered buffers).

use crate::error::{Error, Result};

/// Anonymous private memory from `mmap`: zero-filled, page-aligned, unmapped on drop.
#[derive(Debug)]
pub struct AnonMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; which thread unmaps it does not
// matter, and whoever shares its address synchronizes the accesses.
unsafe impl Send for AnonMemory {}

impl AnonMemory {
    /// Maps `len` bytes (at least one); `what` names the use in the error.
    pub fn new(len: usize, what: &str) -> Result<AnonMemory> {
        let len = len.max(1);
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::last_os(format_args!("mapping {len} bytes for {what}")));
        }
        Ok(AnonMemory { ptr: ptr.cast(), len })
    }

    /// Start of the memory.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes (at least one).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping holds at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for AnonMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
