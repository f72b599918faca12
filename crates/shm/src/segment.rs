//! Shared-memory segments: one per process, named per user, job and rank.
//!
//! # Segment layout
//!
//! ```text
//! offset 0        SegmentInfo (64 bytes, written by the owner right after creating the file;
//!                 its nonce is in the published address too)
//! offset 64       finalized: AtomicU32 on its own line (owner stores 1 with Release in finalize)
//! offset 128      sleeping: AtomicU32 on its own line (owner: 1 while it sleeps on its doorbell;
//!                 read by senders after every message when waiting may block)
//! offset 192      doorbell: AtomicU32 futex word on its own line (senders add 1 and wake)
//! offset 256      sleep_barrier: AtomicU32 on its own line (1 when the owner passes the global
//!                 barrier while going to sleep, so its senders need no fence of their own)
//! offset 4096     ring r for r in 0..size: the owner's outgoing ring to rank r
//!                 (ring_stride = Geometry::bytes rounded up to 128 bytes; see `ring.rs`)
//! cells_offset    send cell c for c in 0..cells (page aligned):
//!                   cell_size bytes of payload, rounded up to 64 (a cell is free again once
//!                   the receiver's read position passes the record naming it: `cells.rs`)
//! total_len       rounded up to 4096
//! ```
//! Everything is allocated by the owner at creation (`posix_fallocate`, so a full `/dev/shm` is an
//! error now rather than a `SIGBUS` later, and first touch places the pages in the owner's NUMA
//! node), and mapped with `MAP_POPULATE` so no page fault lands on the message path. The memory
//! is `size` rings per process, `size * size` per node with everything on one node: with the
//! defaults, about 12 KiB per ordered pair (a header line, 64 records of 128 bytes and 67 body
//! slots of 64), plus each process's send cells.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

use polyrail_core::{Error, Result};

use crate::ring::{Geometry, CONTROL};
use crate::sys;

/// Magic number at the start of every segment: `b"PRLSHM01"`.
const MAGIC: u64 = u64::from_le_bytes(*b"PRLSHM01");
/// Layout version; bump on any change of the segment or slot layout (3: 128-byte records, the
/// sleep-barrier flag; 4: the producer's shared line-transfer sample in each ring; 5: a nonce in
/// the header and the address, the owner's pid namespace).
pub(crate) const VERSION: u32 = 5;
/// Bytes before the first ring.
const HEADER_BYTES: usize = 4096;
/// Offset of the `finalized` flag.
const FINALIZED_AT: usize = 64;
/// Offset of the `sleeping` flag.
const SLEEPING_AT: usize = 128;
/// Offset of the doorbell futex word.
const DOORBELL_AT: usize = 192;
/// Offset of the sleep-barrier flag.
const SLEEP_BARRIER_AT: usize = 256;
/// Magic number at the start of an address: `b"PRSH"`.
const ADDR_MAGIC: u32 = u32::from_le_bytes(*b"PRSH");

/// The fixed information at offset 0 of a segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SegmentInfo {
    magic: u64,
    version: u32,
    rank: u32,
    size: u32,
    slots: u32,
    max_msg_slots: u32,
    cells: u32,
    cell_size: u32,
    owner_pid: u32,
    total_len: u64,
    /// Random, also in the published address: a peer that opens the name finds out whether it
    /// is the segment that was published (another job of the same id, in another pid namespace
    /// sharing /dev/shm, may have replaced it).
    nonce: u64,
    /// The owner's pid namespace (`/proc/self/ns/pid`'s inode; 0 unknown): only in its own
    /// namespace does `owner_pid` name the owner.
    pid_ns: u64,
}

// The header ends where the `finalized` flag's line begins.
const _: () = assert!(std::mem::size_of::<SegmentInfo>() <= FINALIZED_AT);

/// Sizes and offsets of a segment. Every process of a job computes the same one from the same
/// configuration; peers with another layout are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegLayout {
    /// Ranks in the job (one outgoing ring each).
    pub size: u32,
    /// Ring shape.
    pub geo: Geometry,
    /// Send cells in the pool.
    pub cells: u32,
    /// Payload bytes per cell.
    pub cell_size: u32,
    /// Bytes between two rings.
    pub ring_stride: usize,
    /// Offset of the first cell (page aligned).
    pub cells_offset: usize,
    /// Bytes between two cells.
    pub cell_stride: usize,
    /// Bytes of the whole segment.
    pub total_len: usize,
}

impl SegLayout {
    /// The layout for these parameters; `None` if its size overflows.
    pub(crate) fn new(size: u32, geo: Geometry, cells: u32, cell_size: u32) -> Option<SegLayout> {
        let ring_stride = geo.bytes().div_ceil(CONTROL) * CONTROL;
        let rings_end = HEADER_BYTES.checked_add(ring_stride.checked_mul(size as usize)?)?;
        let cells_offset = rings_end.checked_next_multiple_of(4096)?;
        let cell_stride = (cell_size as usize).checked_next_multiple_of(64)?;
        let total = cells_offset.checked_add(cell_stride.checked_mul(cells as usize)?)?;
        let total_len = total.checked_next_multiple_of(4096)?;
        Some(SegLayout { size, geo, cells, cell_size, ring_stride, cells_offset, cell_stride, total_len })
    }

    /// Offset of the owner's outgoing ring to `rank` (`rank < size`).
    pub(crate) fn ring_offset(&self, rank: u32) -> usize {
        debug_assert!(rank < self.size);
        HEADER_BYTES + rank as usize * self.ring_stride
    }

    /// What differs between two layouts, for a refusal message.
    fn differences(&self, theirs: &SegLayout) -> String {
        let mut d = Vec::new();
        let mut cmp = |what: &str, ours: u64, their: u64| {
            if ours != their {
                d.push(format!("{what}: ours {ours}, theirs {their}"));
            }
        };
        cmp("ranks", self.size as u64, theirs.size as u64);
        cmp("slots per ring (POLYRAIL_SHM_SLOTS)", self.geo.slots as u64, theirs.geo.slots as u64);
        cmp("slots per inline message", self.geo.max_msg_slots as u64, theirs.geo.max_msg_slots as u64);
        cmp("cells (POLYRAIL_SHM_CELLS)", self.cells as u64, theirs.cells as u64);
        cmp("cell size (POLYRAIL_SHM_CELL_SIZE)", self.cell_size as u64, theirs.cell_size as u64);
        cmp("segment bytes", self.total_len as u64, theirs.total_len as u64);
        d.join("; ")
    }
}

/// What a process publishes so that peers can map its segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SegAddress {
    /// The POSIX shared-memory name (`/polyrail-...`).
    pub name: String,
    /// The owner's rank.
    pub rank: u32,
    /// The owner's layout.
    pub layout: SegLayout,
    /// The segment's nonce (see `SegmentInfo`).
    pub nonce: u64,
}

impl SegAddress {
    /// `"PRSH"`, version u32, name length u16 + name, rank, size, slots, max_msg_slots, cells,
    /// cell_size (u32 each), total length and nonce (u64 each); little endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let l = &self.layout;
        let mut out = Vec::with_capacity(64 + self.name.len());
        out.extend_from_slice(&ADDR_MAGIC.to_le_bytes());
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        out.extend_from_slice(self.name.as_bytes());
        for v in [self.rank, l.size, l.geo.slots, l.geo.max_msg_slots, l.cells, l.cell_size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(l.total_len as u64).to_le_bytes());
        out.extend_from_slice(&self.nonce.to_le_bytes());
        out
    }

    /// Reads an address made by [`SegAddress::encode`]; `Err` says what is wrong.
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<SegAddress, String> {
        let mut r = Reader(bytes);
        if r.u32()? != ADDR_MAGIC {
            return Err("not a polyrail shm address".into());
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(format!("layout version {version}, this build speaks {VERSION}"));
        }
        let name_len = r.u16()? as usize;
        let name = std::str::from_utf8(r.take(name_len)?).map_err(|_| "segment name is not UTF-8")?.to_string();
        let (rank, size, slots, max_msg_slots, cells, cell_size) =
            (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let (total_len, nonce) = (r.u64()?, r.u64()?);
        if !r.0.is_empty() {
            return Err(format!("{} trailing bytes", r.0.len()));
        }
        // A shape Geometry::new would not make as it is (its clamp of the message size) is one
        // no peer of ours published.
        if !slots.is_power_of_two() || slots < 16 || Geometry::new(slots, max_msg_slots).max_msg_slots != max_msg_slots
        {
            return Err(format!("impossible ring shape: {slots} slots, messages of up to {max_msg_slots} slots"));
        }
        let geo = Geometry::new(slots, max_msg_slots);
        let layout = SegLayout::new(size, geo, cells, cell_size).ok_or("segment size overflows")?;
        if layout.total_len as u64 != total_len {
            return Err(format!("segment length {total_len} does not match its layout ({} bytes)", layout.total_len));
        }
        Ok(SegAddress { name, rank, layout, nonce })
    }
}

/// Cursor over peer-controlled bytes; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("address is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u16(&mut self) -> std::result::Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().map_err(|_| "short")?))
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| "short")?))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| "short")?))
    }
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is an address range; which thread unmaps it does not matter, and the
// transports that hold one synchronize every access to the memory through their ring protocol.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, read-write, pre-faulted.
    pub(crate) fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        Mapping::map_with(fd, len, libc::MAP_POPULATE)
    }

    /// Maps `len` bytes of `fd` shared, read-write, faulting pages in as they are used: for
    /// files of any size of which a message uses a part (pre-faulting a sparse memory file
    /// takes long and allocates every page the peer never touched).
    pub(crate) fn map_lazily(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        Mapping::map_with(fd, len, 0)
    }

    fn map_with(fd: &OwnedFd, len: usize, flags: libc::c_int) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel; `fd` is open read-write and `len` bytes
        // long (checked by the callers).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | flags,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Start of the mapping (page aligned).
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Pointer to `offset` (callers keep `offset` inside the mapping, at the alignment they use).
    #[inline]
    pub(crate) fn at(&self, offset: usize) -> NonNull<u8> {
        assert!(offset < self.len, "offset {offset} outside a mapping of {} bytes", self.len);
        // SAFETY: offset < len, inside the mapping, so the result is in bounds and non-null.
        unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(offset)) }
    }

    /// The segment's `finalized` flag.
    pub(crate) fn finalized(&self) -> &AtomicU32 {
        // SAFETY: offset 64 is 4-byte aligned inside the header page of every segment (mappings
        // are at least HEADER_BYTES long) and only ever accessed as this atomic.
        unsafe { &*self.at(FINALIZED_AT).as_ptr().cast::<AtomicU32>() }
    }

    /// The owner's `sleeping` flag.
    #[inline]
    pub(crate) fn sleeping(&self) -> &AtomicU32 {
        // SAFETY: as for `finalized`: offset 128, aligned, in the header page, only this atomic.
        unsafe { &*self.at(SLEEPING_AT).as_ptr().cast::<AtomicU32>() }
    }

    /// The owner's doorbell (a futex word).
    #[inline]
    pub(crate) fn doorbell(&self) -> &AtomicU32 {
        // SAFETY: as for `finalized`: offset 192, aligned, in the header page, only this atomic.
        unsafe { &*self.at(DOORBELL_AT).as_ptr().cast::<AtomicU32>() }
    }

    /// 1 when the owner passes the global barrier ([`sys::global_barrier`]) between setting its
    /// `sleeping` flag and its last look at the rings: then a sender registered for that
    /// barrier needs no fence of its own before it reads the flag. Set before the segment's
    /// address is published.
    pub(crate) fn sleep_barrier(&self) -> &AtomicU32 {
        // SAFETY: as for `finalized`: offset 256, aligned, in the header page, only this atomic.
        unsafe { &*self.at(SLEEP_BARRIER_AT).as_ptr().cast::<AtomicU32>() }
    }

    fn info(&self) -> SegmentInfo {
        // SAFETY: the mapping is at least HEADER_BYTES long and page aligned; a volatile copy
        // reads each byte once, whatever the peer does to it meanwhile.
        unsafe { std::ptr::read_volatile(self.ptr.as_ptr().cast::<SegmentInfo>()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len is a mapping we made and nobody uses after the owner is dropped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// `/dev/shm` path of a shared-memory name, for messages.
fn path_of(name: &str) -> String {
    format!("/dev/shm{name}")
}

/// This process's own segment.
#[derive(Debug)]
pub(crate) struct OwnSegment {
    /// The mapping.
    pub map: Mapping,
    /// The shared-memory name.
    pub name: String,
    /// Its nonce, to publish with its address.
    pub nonce: u64,
    unlinked: bool,
}

impl OwnSegment {
    /// Creates, sizes, allocates and maps the segment `name` for `rank` with `layout`.
    pub(crate) fn create(name: &str, rank: u32, layout: &SegLayout) -> Result<OwnSegment> {
        let len = layout.total_len;
        let what = || format!("creating shared-memory segment {} ({len} bytes)", path_of(name));
        let cname = CString::new(name).map_err(|_| Error::InvalidArgument(format!("segment name {name:?}")))?;
        let mut tried_stale = false;
        let fd = loop {
            // SAFETY: `cname` is a valid C string; shm_open returns a new descriptor or -1.
            let fd = unsafe {
                libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC, 0o600)
            };
            if fd >= 0 {
                // SAFETY: just returned by the kernel, owned by nobody else.
                break unsafe { OwnedFd::from_raw_fd(fd) };
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EEXIST) && !tried_stale && remove_stale(&cname) {
                tried_stale = true;
                continue;
            }
            let hint = if err.raw_os_error() == Some(libc::EEXIST) {
                " (a job with the same id owns it: its process is alive, or it was made less than a minute ago)"
            } else {
                ""
            };
            return Err(Error::io(format!("{}{hint}", what()), err));
        };
        let info = SegmentInfo {
            magic: MAGIC,
            version: VERSION,
            rank,
            size: layout.size,
            slots: layout.geo.slots,
            max_msg_slots: layout.geo.max_msg_slots,
            cells: layout.cells,
            cell_size: layout.cell_size,
            owner_pid: std::process::id(),
            total_len: len as u64,
            nonce: polyrail_core::random_u64(),
            pid_ns: sys::pid_namespace(),
        };
        // The header first, before the long part (allocating every page): a process killed
        // meanwhile leaves a file that names its owner, which `remove_stale` can then remove.
        // SAFETY: SegmentInfo is repr(C) integers without padding, so all its bytes are
        // initialized; `fd` is open for writing.
        let wrote = unsafe {
            libc::pwrite(fd.as_raw_fd(), (&info as *const SegmentInfo).cast(), std::mem::size_of::<SegmentInfo>(), 0)
        };
        let header = if wrote == std::mem::size_of::<SegmentInfo>() as isize {
            Ok(())
        } else {
            Err(Error::io(format!("{}: writing its header", what()), io::Error::last_os_error()))
        };
        let mapped = header
            .and_then(|()| {
                allocate(&fd, len)
                    .map_err(|e| Error::io(format!("{}: is /dev/shm large enough? (df -h /dev/shm)", what()), e))
            })
            .and_then(|()| Mapping::map(&fd, len).map_err(|e| Error::io(format!("{}: mmap", what()), e)));
        let map = match mapped {
            Ok(map) => map,
            Err(e) => {
                // SAFETY: a valid C string; the name is ours (created above with O_EXCL).
                unsafe { libc::shm_unlink(cname.as_ptr()) };
                return Err(e);
            }
        };
        Ok(OwnSegment { map, name: name.to_string(), nonce: info.nonce, unlinked: false })
    }

    /// Removes the name from `/dev/shm` (mappings stay valid). Idempotent.
    pub(crate) fn unlink(&mut self) -> Result<()> {
        if self.unlinked {
            return Ok(());
        }
        let cname = CString::new(self.name.as_str()).map_err(|_| Error::InvalidArgument(self.name.clone()))?;
        // SAFETY: a valid C string.
        if unsafe { libc::shm_unlink(cname.as_ptr()) } != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENOENT) {
                // Not marked unlinked: the drop tries again.
                return Err(Error::io(format!("unlinking {}", path_of(&self.name)), err));
            }
        }
        self.unlinked = true;
        Ok(())
    }
}

impl Drop for OwnSegment {
    fn drop(&mut self) {
        let _ = self.unlink();
    }
}

/// Checks free space, sizes the file and allocates every page now.
fn allocate(fd: &OwnedFd, len: usize) -> io::Result<()> {
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is valid for writes.
    if unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) } == 0 {
        let avail = (st.f_bavail as u128) * (st.f_frsize as u128);
        if st.f_blocks != 0 && avail < len as u128 {
            return Err(io::Error::other(format!(
                "only {avail} bytes free in /dev/shm, {len} needed (No space left on device)"
            )));
        }
    }
    if !polyrail_core::fits_file_size_limit(len) {
        // Sizing the file would send SIGXFSZ, which ends the process.
        return Err(io::Error::other(format!(
            "the segment's {len} bytes are above this process's file-size limit (ulimit -f)"
        )));
    }
    // SAFETY: `fd` is an open descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is an open descriptor; posix_fallocate returns an error number.
    let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len as libc::off_t) };
    if rc != 0 && rc != libc::EOPNOTSUPP && rc != libc::EINVAL {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// A segment's name lives in /dev/shm only while its job starts (it is unlinked once every
/// local rank has attached), so one older than this was left by a job killed while it started.
/// The age spares a starting job whose owner this process cannot see (another pid namespace
/// sharing /dev/shm), whose pid may name nothing, or another process, here.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes this user's polyrail segments (`/dev/shm/polyrail-<uid>-*`) that are stale (see
/// `remove_stale`): what a job killed with SIGKILL while it started leaves when nothing cleans
/// up after it (`polyrail run` removes its job's segments, but `kill -9` of `mpiexec` and its
/// ranks leaves them). Returns how many it removed.
pub(crate) fn sweep_stale(uid: u32) -> usize {
    let prefix = format!("polyrail-{uid}-");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return 0 };
    dir.flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)))
        .filter_map(|e| CString::new(format!("/{}", e.file_name().to_str()?)).ok())
        .filter(remove_stale)
        .count()
}

/// Unlinks `name` if it is a polyrail segment whose owner process is gone (left by a killed job:
/// found under the name a new segment needs, or by [`sweep_stale`]): an owner of this pid
/// namespace that is not alive, or one of another namespace (or of an unknown one) whose
/// segment is older than [`STALE_AFTER`]. Returns whether it did.
fn remove_stale(name: &CString) -> bool {
    use std::os::unix::fs::FileExt;
    // SAFETY: a valid C string; read-only open.
    let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: just opened, owned here.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let old = || {
        let modified = file.metadata().and_then(|m| m.modified());
        modified.is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= STALE_AFTER))
    };
    let mut info = [0u8; std::mem::size_of::<SegmentInfo>()];
    if file.read_exact_at(&mut info, 0).is_err() {
        // Shorter than a header: its creator died between creating it and writing the header
        // (microseconds apart), or is doing that now; once old, nobody will.
        if !old() {
            return false;
        }
        tracing::warn!("removing shared-memory segment {:?} left without a header", name);
        // SAFETY: a valid C string.
        return unsafe { libc::shm_unlink(name.as_ptr()) == 0 };
    }
    // SAFETY: SegmentInfo is plain integers; any bytes are a valid value.
    let info: SegmentInfo = unsafe { std::ptr::read_unaligned(info.as_ptr().cast()) };
    if info.magic != MAGIC || sys::pid_alive(info.owner_pid) {
        return false;
    }
    let ours = info.pid_ns != 0 && info.pid_ns == sys::pid_namespace();
    if !ours && !old() {
        return false;
    }
    tracing::warn!(pid = info.owner_pid, "removing stale shared-memory segment {:?} of an exited process", name);
    // SAFETY: a valid C string.
    unsafe { libc::shm_unlink(name.as_ptr()) == 0 }
}

/// A peer's segment, mapped read-write; `Err` says why it cannot be used.
pub(crate) fn open_peer(addr: &SegAddress, expect_rank: u32) -> std::result::Result<(Mapping, u32), String> {
    let name = &addr.name;
    if !name.starts_with("/polyrail-") || name[1..].contains('/') || name.len() > 255 {
        return Err(format!("{name:?} is not a polyrail segment name"));
    }
    if addr.rank != expect_rank {
        return Err(format!("address is of rank {}, not {expect_rank}", addr.rank));
    }
    let path = path_of(name);
    let cname = CString::new(name.as_str()).map_err(|_| format!("{name:?} contains a NUL byte"))?;
    // SAFETY: a valid C string; shm_open returns a new descriptor or -1.
    let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("cannot open {path}: {}", io::Error::last_os_error()));
    }
    // SAFETY: just opened, owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` valid for writes.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(format!("cannot stat {path}: {}", io::Error::last_os_error()));
    }
    let len = addr.layout.total_len;
    if st.st_size as u64 != len as u64 {
        return Err(format!("{path} is {} bytes, its address says {len}", st.st_size));
    }
    if st.st_uid != sys::uid() {
        return Err(format!("{path} belongs to uid {}, not to us ({})", st.st_uid, sys::uid()));
    }
    let map = Mapping::map(&fd, len).map_err(|e| format!("cannot map {path} ({len} bytes): {e}"))?;
    let info = map.info();
    let l = &addr.layout;
    let expected = SegmentInfo {
        magic: MAGIC,
        version: VERSION,
        rank: addr.rank,
        size: l.size,
        slots: l.geo.slots,
        max_msg_slots: l.geo.max_msg_slots,
        cells: l.cells,
        cell_size: l.cell_size,
        owner_pid: info.owner_pid,
        total_len: len as u64,
        nonce: addr.nonce,
        pid_ns: info.pid_ns,
    };
    if info.nonce != addr.nonce {
        return Err(format!(
            "{path} is not the segment rank {} published (another job's under the same name?)",
            addr.rank
        ));
    }
    if info != expected {
        return Err(format!("{path}: header {info:?} does not match the address {expected:?}"));
    }
    // The owner's pid names a process of its pid namespace: in another, its exit could not be
    // seen from here (the pid names nothing, or another process).
    let ours = sys::pid_namespace();
    if info.pid_ns != ours {
        return Err(format!(
            "{path} belongs to a process of another pid namespace (pid:[{}], here pid:[{ours}]), whose \
             liveness cannot be watched from here",
            info.pid_ns
        ));
    }
    Ok((map, info.owner_pid))
}

/// Checks that a peer's layout equals ours; `Err` lists the differences.
pub(crate) fn same_layout(ours: &SegLayout, theirs: &SegLayout) -> std::result::Result<(), String> {
    if ours == theirs {
        Ok(())
    } else {
        Err(format!(
            "segment layout differs ({}): every process of a job needs the same POLYRAIL_SHM_* settings",
            ours.differences(theirs)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address of a 64-slot ring whose message size field (`max_msg_slots`) says `max`.
    fn address_with_max(max: u32) -> Vec<u8> {
        let layout = SegLayout::new(2, Geometry::new(64, 16), 128, 16 << 10).unwrap();
        let mut bytes = SegAddress { name: "/n".into(), rank: 1, layout, nonce: 7 }.encode();
        // magic, version, name length and name, rank, size, slots: then max_msg_slots.
        let at = 4 + 4 + 2 + 2 + 4 + 4 + 4;
        bytes[at..at + 4].copy_from_slice(&max.to_le_bytes());
        bytes
    }

    /// Writes `/dev/shm/<name>` with a segment header naming `owner` of pid namespace `pid_ns`,
    /// last modified `age` ago.
    fn fake_segment(name: &str, owner: u32, pid_ns: u64, age: std::time::Duration) {
        let info = SegmentInfo {
            magic: MAGIC,
            version: VERSION,
            rank: 0,
            size: 2,
            slots: 64,
            max_msg_slots: 16,
            cells: 128,
            cell_size: 16 << 10,
            owner_pid: owner,
            total_len: std::mem::size_of::<SegmentInfo>() as u64,
            nonce: 0,
            pid_ns,
        };
        // SAFETY: SegmentInfo is repr(C) integers without padding (u64, eight u32, three u64):
        // every byte of it is initialized.
        let bytes = unsafe {
            std::slice::from_raw_parts((&info as *const SegmentInfo).cast::<u8>(), std::mem::size_of::<SegmentInfo>())
        };
        let path = format!("/dev/shm/{name}");
        std::fs::write(&path, bytes).unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(std::time::SystemTime::now() - age).unwrap();
    }

    /// Only segments of a dead owner are swept, and of those, one of another (or an unknown) pid
    /// namespace only once it is old: a young one may belong to a job starting now whose owner
    /// this process cannot see. A live owner's is in use. One without a header goes once old.
    #[test]
    fn stale_segments_of_dead_owners_are_swept() {
        let uid = sys::uid();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let minutes = std::time::Duration::from_secs(120);
        let (young, ns) = (std::time::Duration::ZERO, sys::pid_namespace());
        if ns == 0 {
            // No /proc/self/ns/pid here: every owner's namespace is unknown (the age rule).
            eprintln!("skipped: this process's pid namespace is unknown");
            return;
        }
        let cases = [
            ("old-dead-unknown-ns", dead, 0, minutes, true),
            ("young-dead-unknown-ns", dead, 0, young, false),
            ("young-dead-other-ns", dead, ns + 1, young, false),
            ("old-dead-other-ns", dead, ns + 1, minutes, true),
            ("young-dead-our-ns", dead, ns, young, true),
            ("old-live-our-ns", std::process::id(), ns, minutes, false),
        ];
        let name = |what: &str| format!("polyrail-{uid}-sweeptest{}-{what}", std::process::id());
        for (what, owner, pid_ns, age, _) in cases {
            fake_segment(&name(what), owner, pid_ns, age);
        }
        // Left without a header (its creator killed between creating and writing it): swept
        // once old, as nothing will write it then.
        let headerless = [("old-headerless", minutes, true), ("young-headerless", young, false)];
        for (what, age, _) in headerless {
            let file = std::fs::File::create(format!("/dev/shm/{}", name(what))).unwrap();
            file.set_modified(std::time::SystemTime::now() - age).unwrap();
        }
        assert!(sweep_stale(uid) >= 4);
        let expected = cases.iter().map(|c| (c.0, c.4)).chain(headerless.iter().map(|c| (c.0, c.2)));
        for (what, swept) in expected {
            let path = format!("/dev/shm/{}", name(what));
            assert_eq!(!std::path::Path::new(&path).exists(), swept, "{what}");
            let _ = std::fs::remove_file(path);
        }
    }

    /// A segment of rank 1 of a two-rank job named after `tag`, and its address.
    fn rank_1_segment(tag: &str) -> (OwnSegment, SegAddress) {
        let layout = SegLayout::new(2, Geometry::new(64, 16), 4, 4096).unwrap();
        let name = format!("/polyrail-{}-{tag}{}-1", sys::uid(), std::process::id());
        let seg = OwnSegment::create(&name, 1, &layout).unwrap();
        let addr = SegAddress { name, rank: 1, layout, nonce: seg.nonce };
        (seg, addr)
    }

    /// A peer's segment whose owner lives in another pid namespace is refused: the pid that
    /// would watch its liveness means something else here.
    #[test]
    fn a_segment_of_another_pid_namespace_is_refused() {
        use std::os::unix::fs::FileExt;
        let (_seg, addr) = rank_1_segment("nstest");
        assert!(open_peer(&addr, 1).is_ok());
        // Its owner's pid would name nothing, or another process, here: its exit would go
        // unseen (or be seen at once).
        let other_ns = (sys::pid_namespace() ^ 1).to_ne_bytes();
        let file = std::fs::OpenOptions::new().write(true).open(path_of(&addr.name)).unwrap();
        file.write_all_at(&other_ns, std::mem::offset_of!(SegmentInfo, pid_ns) as u64).unwrap();
        let err = open_peer(&addr, 1).unwrap_err();
        assert!(err.contains("another pid namespace"), "{err}");
    }

    /// A peer whose address names a segment that is no longer the one published (another job
    /// of the same id replaced it) is refused, not mapped.
    #[test]
    fn a_replaced_segment_is_refused() {
        let (seg, addr) = rank_1_segment("noncetest");
        let decoded = SegAddress::decode(&addr.encode()).unwrap();
        assert_eq!(decoded, addr);
        assert_eq!(open_peer(&decoded, 1).unwrap().1, std::process::id());
        let other = SegAddress { nonce: seg.nonce ^ 1, ..addr };
        let err = open_peer(&other, 1).unwrap_err();
        assert!(err.contains("is not the segment rank 1 published"), "{err}");
    }

    #[test]
    fn decode_refuses_ring_shapes_geometry_would_not_make() {
        assert_eq!(SegAddress::decode(&address_with_max(16)).unwrap().layout.geo.max_msg_slots, 16);
        for max in [0, 17, Geometry::MAX_MSG_SLOTS + 1] {
            let err = SegAddress::decode(&address_with_max(max)).unwrap_err();
            assert!(err.contains("impossible ring shape"), "{max}: {err}");
        }
    }
}
