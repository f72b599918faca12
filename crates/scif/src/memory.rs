//! [`Memory`]: page-aligned memory that windows are registered from, and the checks on a
//! memory file a peer passes.

use crate::error::{Result, ScifError};
use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::SealFlags;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The system's page size: windows and offsets are multiples of it.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// Memory that windows are registered from ([`crate::Endpoint::register`]): zeroed pages of a
/// sealed memory file mapped here, which the provider passes to the peer so that the peer's
/// RMAs are copies into its own mapping of the same pages. Clones share the memory; it stays
/// mapped while a clone, a window or a transfer holds it.
///
/// libscif registers any page-aligned memory of the process; the software provider needs the
/// pages in a file it can pass, so windows come from here.
#[derive(Clone, Debug)]
pub struct Memory(Arc<MemInner>);

#[derive(Debug)]
struct MemInner {
    /// Declared before `file`: unmapped before the file closes.
    map: MmapRaw,
    file: OwnedFd,
}

impl Memory {
    /// Maps `len` bytes rounded up to whole pages (at least one) of a new memory file, sealed
    /// against shrinking and growing so that no mapping of it faults past its end.
    pub fn new(len: usize) -> Result<Memory> {
        let page = page_size();
        let len = len.max(1).checked_next_multiple_of(page).ok_or_else(|| ScifError::Enomem(format!("{len} bytes")))?;
        let (file, _) = polyrail_core::memory_file(len)
            .map_err(|(step, e)| ScifError::os(format_args!("{step} of a {len}-byte memory file"), e))?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| ScifError::os(format_args!("mapping {len} bytes of a memory file"), e))?;
        Ok(Memory(Arc::new(MemInner { map, file })))
    }

    /// Maps all of `file`, a memory file sealed against shrinking whose size is whole pages
    /// (a [`polyrail_core::AnonMemory::shared`] region's file): windows of it share its pages with
    /// every other mapping of the file, so the owner keeps working on its memory in place.
    /// `EINVAL` for a file that is not such a memory file.
    pub fn from_file(file: OwnedFd) -> Result<Memory> {
        let size = rustix::fs::fstat(&file).map_err(|e| ScifError::os("fstat of a memory file", e))?.st_size as u64;
        let len = usize::try_from(size).map_err(|_| ScifError::Einval(format!("a {size}-byte memory file")))?;
        if len == 0 || len % page_size() != 0 {
            return Err(ScifError::Einval(format!("a memory file of {len} bytes is not whole pages")));
        }
        check_peer_file(file.as_fd(), 0, size).map_err(ScifError::Einval)?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| ScifError::os(format_args!("mapping {len} bytes of a memory file"), e))?;
        Ok(Memory(Arc::new(MemInner { map, file })))
    }

    /// Start of the memory. Other threads, the DMA engine and peers may access it concurrently:
    /// whoever shares an address synchronizes (a fence, a signal, a message).
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.map.as_mut_ptr()
    }

    /// Length in bytes, a multiple of the page size.
    pub fn len(&self) -> usize {
        self.0.map.len()
    }

    /// Always false: memory holds at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`. Panics if the range is outside the memory.
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        self.check(offset, buf.len());
        // SAFETY: the range is inside the mapping (checked), which lives while `self` does;
        // `buf` is a distinct local buffer. Concurrent writers race only on the bytes' values.
        unsafe { std::ptr::copy(self.as_ptr().add(offset), buf.as_mut_ptr(), buf.len()) }
    }

    /// Copies `buf` to `offset`. Panics if the range is outside the memory.
    pub fn write(&self, offset: usize, buf: &[u8]) {
        self.check(offset, buf.len());
        // SAFETY: as in `read`, the other way.
        unsafe { std::ptr::copy(buf.as_ptr(), self.as_ptr().add(offset), buf.len()) }
    }

    /// Reads the u64 at `offset` (8-byte aligned) with Acquire: pairs with the Release store of a
    /// [`crate::Endpoint::fence_signal`] or [`Memory::store_u64`].
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.word(offset).load(Ordering::Acquire)
    }

    /// Writes the u64 at `offset` (8-byte aligned) with Release: what was written before is
    /// visible to whoever reads the value with Acquire.
    pub fn store_u64(&self, offset: usize, value: u64) {
        self.word(offset).store(value, Ordering::Release)
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        self.check(offset, 8);
        assert!(offset % 8 == 0, "offset {offset:#x} is not 8-byte aligned");
        // SAFETY: 8 aligned bytes inside the mapping (checked; the mapping is page-aligned),
        // alive while `self` is; they are only accessed atomically or by byte copies.
        unsafe { &*self.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len()),
            "range {offset:#x}+{len:#x} outside {:#x} bytes of memory",
            self.len()
        );
    }

    pub(crate) fn file(&self) -> BorrowedFd<'_> {
        self.0.file.as_fd()
    }
}

/// Opens the memory file `fd` again, read-only: what a peer gets for a window it may only read,
/// so that the kernel refuses it a writable mapping.
pub(crate) fn reopen_read_only(fd: BorrowedFd<'_>) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
}

/// Checks a memory file a peer passed for `[file_off, file_off + len)`: a memfd sealed against
/// shrinking (so no mapping of it can fault) that holds the range. Returns why not.
pub(crate) fn check_peer_file(fd: BorrowedFd<'_>, file_off: u64, len: u64) -> Result<(), String> {
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| format!("its file is not a memory file ({e})"))?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err("its memory file is not sealed against shrinking".into());
    }
    let size = rustix::fs::fstat(fd).map_err(|e| format!("fstat of its file failed ({e})"))?.st_size as u64;
    match file_off.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(format!("its range {file_off:#x}+{len:#x} passes the end of its {size}-byte file")),
    }
}

/// Maps `len` bytes at `file_off` of a peer's memory file, writable when `write`.
pub(crate) fn map_peer_file(fd: BorrowedFd<'_>, file_off: u64, len: usize, write: bool) -> std::io::Result<MmapRaw> {
    let mut opts = MmapOptions::new();
    opts.offset(file_off).len(len);
    if write {
        opts.map_raw(&fd)
    } else {
        opts.map_raw_read_only(&fd)
    }
}
