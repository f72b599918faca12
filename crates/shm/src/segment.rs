//! Shared-memory segments: one per process, a memory file sealed against shrinking.
//!
//! A segment is a memfd (`/memfd:polyrail-segment` in `/proc/<pid>/fd` and `/proc/<pid>/maps`),
//! not a POSIX shm object: it has no name in `/dev/shm` that another user could squat or that a
//! cleanup could confuse with someone else's, it vanishes with the last process that maps it,
//! and its seals (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) make `ftruncate` fail for
//! everybody, so no access of a peer can fault past its end (a POSIX shm object cannot be
//! sealed: one truncation killed every process mapping it with SIGBUS). Peers open it as
//! `/proc/<owner pid>/fd/<fd>` (as the registered-memory files of `cma`), check its inode,
//! owner, size and seals, and map it; the owner closes its descriptor once every peer has
//! (`ShmTransport::connected`).
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
//! Everything is allocated by the owner at creation (`fallocate`, after checking that the
//! memory is there, so a short machine is an error now rather than a `SIGBUS` or the OOM killer
//! later, and first touch places the pages in the owner's NUMA node), and mapped with
//! `MAP_POPULATE` so no page fault lands on the message path. The memory is `size` rings per
//! process, `size * size` per node with everything on one node: with the defaults, about 12 KiB
//! per ordered pair (a header line, 64 records of 128 bytes and 67 body slots of 64), plus each
//! process's send cells.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

use polyrail_core::{Error, Result};

use crate::ring::{Geometry, CONTROL};
use crate::sys;

/// Magic number at the start of every segment: `b"PRLSHM01"`.
const MAGIC: u64 = u64::from_le_bytes(*b"PRLSHM01");
/// Layout version; bump on any change of the segment or slot layout (3: 128-byte records, the
/// sleep-barrier flag; 4: the producer's shared line-transfer sample in each ring; 5: a nonce in
/// the header and the address, the owner's pid namespace; 6: a sealed memory file, named in the
/// address by the owner's pid, descriptor and the file's inode).
pub(crate) const VERSION: u32 = 6;
/// The memory files' name, which tells segments apart in `/proc/<pid>/fd` and `maps`.
pub(crate) const MEMFD_NAME: &CStr = c"polyrail-segment";
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
    /// Random, also in the published address: a peer that opens the file finds out whether it
    /// is the segment that was published (the owner's descriptor may name another file by then).
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
    /// The owner's process id, as the job's process description gives it too.
    pub pid: u32,
    /// The owner's descriptor of the memory file (`/proc/<pid>/fd/<fd>`).
    pub fd: u32,
    /// The memory file's inode number: the descriptor may name another file by the time a peer
    /// opens it.
    pub inode: u64,
    /// The owner's rank.
    pub rank: u32,
    /// The owner's layout.
    pub layout: SegLayout,
    /// The segment's nonce (see `SegmentInfo`).
    pub nonce: u64,
}

/// Bytes of an encoded [`SegAddress`].
const ADDR_LEN: usize = 4 + 4 + 4 + 4 + 8 + 6 * 4 + 8 + 8;

impl SegAddress {
    /// `"PRSH"`, version, pid, fd (u32 each), inode (u64), rank, size, slots, max_msg_slots,
    /// cells, cell_size (u32 each), total length and nonce (u64 each); little endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let l = &self.layout;
        let mut out = Vec::with_capacity(ADDR_LEN);
        for v in [ADDR_MAGIC, VERSION, self.pid, self.fd] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.inode.to_le_bytes());
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
        let (pid, fd, inode) = (r.u32()?, r.u32()?, r.u64()?);
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
        Ok(SegAddress { pid, fd, inode, rank, layout, nonce })
    }

    /// Where a peer opens the segment.
    fn path(&self) -> String {
        format!("/proc/{}/fd/{}", self.pid, self.fd)
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

/// This process's own segment.
#[derive(Debug)]
pub(crate) struct OwnSegment {
    /// The mapping.
    pub map: Mapping,
    /// The memory file, open until every peer has opened it too ([`OwnSegment::close`]).
    file: Option<OwnedFd>,
    /// Its descriptor number while open, for the address.
    fd: u32,
    /// The file's inode number.
    inode: u64,
    /// Its nonce, to publish with its address.
    pub nonce: u64,
}

impl OwnSegment {
    /// Creates, allocates and maps a sealed segment for `rank` with `layout`; `what` names it
    /// in errors.
    pub(crate) fn create(rank: u32, layout: &SegLayout, what: &str) -> Result<OwnSegment> {
        let len = layout.total_len;
        let what = || format!("creating the shared-memory segment of {what} ({len} bytes)");
        enough_memory(len).map_err(|e| Error::io(what(), e))?;
        let (fd, inode) = polyrail_core::named_memory_file(MEMFD_NAME, len)
            .map_err(|(step, e)| Error::io(format!("{}: {step}", what()), e))?;
        allocate(&fd, len).map_err(|e| Error::io(format!("{}: allocating its pages", what()), e))?;
        let map = Mapping::map(&fd, len).map_err(|e| Error::io(format!("{}: mmap", what()), e))?;
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
        // SAFETY: the mapping is at least HEADER_BYTES long and page aligned, and nobody else
        // knows the file before its address is published.
        unsafe { std::ptr::write_volatile(map.base().as_ptr().cast::<SegmentInfo>(), info) };
        let raw = fd.as_raw_fd() as u32;
        Ok(OwnSegment { map, file: Some(fd), fd: raw, inode, nonce: info.nonce })
    }

    /// The address peers map the segment with (`rank` and `layout` as at creation).
    pub(crate) fn address(&self, rank: u32, layout: SegLayout) -> SegAddress {
        SegAddress { pid: std::process::id(), fd: self.fd, inode: self.inode, rank, layout, nonce: self.nonce }
    }

    /// Where peers open the segment, while they may (`None` after [`OwnSegment::close`]).
    pub(crate) fn path(&self) -> Option<String> {
        self.file.as_ref().map(|_| format!("/proc/{}/fd/{}", std::process::id(), self.fd))
    }

    /// Closes the memory file once every peer mapped it (the mappings keep the memory): no
    /// descriptor stays taken, and no process can open the segment any more.
    pub(crate) fn close(&mut self) {
        self.file = None;
    }
}

/// Checks that `len` more bytes of memory are there: a memory file is not limited by a mount's
/// size, so allocating more than the machine (or this process's memory cgroup) has would wake
/// the OOM killer rather than fail.
fn enough_memory(len: usize) -> io::Result<()> {
    let avail = available_memory();
    match avail {
        Some(avail) if avail < len as u64 => Err(io::Error::other(format!(
            "only {avail} bytes of memory available, {len} needed (No space left on device)"
        ))),
        _ => Ok(()),
    }
}

/// Bytes of memory available to this process: the kernel's `MemAvailable`, and under a cgroup
/// v2 memory limit, what is left of it; `None` if neither can be read.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let machine = meminfo.as_deref().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| {
        let path = c.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = format!("/sys/fs/cgroup{path}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok()?.trim().parse::<u64>().ok();
        // "max" (no limit) does not parse.
        Some(read("memory.max")?.saturating_sub(read("memory.current")?))
    });
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// Allocates every page of the file now.
fn allocate(fd: &OwnedFd, len: usize) -> io::Result<()> {
    match rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, len as u64) {
        // Without fallocate the pages come with MAP_POPULATE.
        Ok(()) | Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A peer's segment, mapped read-write, and its owner's pid; `Err` says why it cannot be used.
/// `expect` is the rank and pid the job gives for the peer.
pub(crate) fn open_peer(addr: &SegAddress, expect: (u32, u32)) -> std::result::Result<(Mapping, u32), String> {
    let (rank, pid) = expect;
    if addr.rank != rank {
        return Err(format!("address is of rank {}, not {rank}", addr.rank));
    }
    if addr.pid != pid {
        return Err(format!("its segment's owner is pid {}, but rank {rank} is pid {pid}", addr.pid));
    }
    let path = addr.path();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open rank {rank}'s segment {path}: {e}"))?;
    let st = file.metadata().map_err(|e| format!("cannot stat rank {rank}'s segment {path}: {e}"))?;
    if st.ino() != addr.inode {
        return Err(format!(
            "{path} is inode {}, not rank {rank}'s segment (inode {}): it closed it meanwhile?",
            st.ino(),
            addr.inode
        ));
    }
    if st.uid() != sys::uid() {
        return Err(format!("{path} belongs to uid {}, not to us ({})", st.uid(), sys::uid()));
    }
    let len = addr.layout.total_len;
    if st.len() != len as u64 {
        return Err(format!("{path} is {} bytes, its address says {len}", st.len()));
    }
    let fd = OwnedFd::from(file);
    // Sealed against shrinking, it can never be truncated under our mapping (which would make
    // our next access of it die of SIGBUS).
    let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|e| format!("reading the seals of {path}: {e}"))?;
    if !seals.contains(rustix::fs::SealFlags::SHRINK) {
        return Err(format!("{path} is not a memory file sealed against shrinking"));
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
        return Err(format!("{path} is not the segment rank {} published", addr.rank));
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
        let mut bytes = SegAddress { pid: 1, fd: 3, inode: 5, rank: 1, layout, nonce: 7 }.encode();
        // magic, version, pid, fd, inode, rank, size, slots: then max_msg_slots.
        let at = 4 + 4 + 4 + 4 + 8 + 4 + 4 + 4;
        bytes[at..at + 4].copy_from_slice(&max.to_le_bytes());
        bytes
    }

    /// A segment of rank 1 of a two-rank job, and its address.
    fn rank_1_segment() -> (OwnSegment, SegAddress) {
        let layout = SegLayout::new(2, Geometry::new(64, 16), 4, 4096).unwrap();
        let seg = OwnSegment::create(1, &layout, "a test").unwrap();
        let addr = seg.address(1, layout);
        (seg, addr)
    }

    /// Who a peer expects rank 1 to be: this process.
    fn rank_1() -> (u32, u32) {
        (1, std::process::id())
    }

    /// A segment can be neither shrunk nor grown, by its owner or by anyone who opens it: a
    /// truncated segment killed the peers mapping it with SIGBUS.
    #[test]
    fn a_segment_cannot_be_resized() {
        let (seg, addr) = rank_1_segment();
        let path = seg.path().unwrap();
        assert_eq!(path, addr.path());
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        for len in [0, 100, addr.layout.total_len as u64 - 1, addr.layout.total_len as u64 + 4096] {
            let e = file.set_len(len).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "resizing to {len}: {e}");
        }
        let (map, pid) = open_peer(&addr, rank_1()).unwrap();
        assert_eq!((map.len(), pid), (addr.layout.total_len, std::process::id()));
        // Closed once every peer mapped it: no one opens it then, and the mappings still work.
        let mut seg = seg;
        seg.close();
        assert!(seg.path().is_none());
        assert!(open_peer(&addr, rank_1()).is_err());
        assert_eq!(map.info().nonce, seg.nonce);
    }

    /// A file that is not sealed against shrinking is not mapped, even with the right inode,
    /// size and header.
    #[test]
    fn an_unsealed_file_is_refused() {
        use std::io::Write;
        let (seg, addr) = rank_1_segment();
        let len = addr.layout.total_len;
        let fd = rustix::fs::memfd_create(c"unsealed", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut file = std::fs::File::from(fd);
        // SAFETY: the segment's first page holds its header, readable.
        let header = unsafe { std::slice::from_raw_parts(seg.map.base().as_ptr(), HEADER_BYTES) };
        file.write_all(header).unwrap();
        file.set_len(len as u64).unwrap();
        let forged = SegAddress { fd: file.as_raw_fd() as u32, inode: file.metadata().unwrap().ino(), ..addr };
        let err = open_peer(&forged, rank_1()).unwrap_err();
        assert!(err.contains("not a memory file sealed against shrinking"), "{err}");
    }

    /// A peer's segment whose owner lives in another pid namespace is refused: the pid that
    /// would watch its liveness means something else here.
    #[test]
    fn a_segment_of_another_pid_namespace_is_refused() {
        let (seg, addr) = rank_1_segment();
        assert!(open_peer(&addr, rank_1()).is_ok());
        // Its owner's pid would name nothing, or another process, here: its exit would go
        // unseen (or be seen at once).
        let other_ns = sys::pid_namespace() ^ 1;
        let at = seg.map.at(std::mem::offset_of!(SegmentInfo, pid_ns));
        // SAFETY: inside the header page, 8-byte aligned (a u64 field of a repr(C) struct at
        // offset 0 of a page).
        unsafe { at.as_ptr().cast::<u64>().write_volatile(other_ns) };
        let err = open_peer(&addr, rank_1()).unwrap_err();
        assert!(err.contains("another pid namespace"), "{err}");
    }

    /// A peer whose address names a segment that is no longer the one published is refused, not
    /// mapped; so is one whose owner is not the process the job names.
    #[test]
    fn a_replaced_segment_is_refused() {
        let (seg, addr) = rank_1_segment();
        let decoded = SegAddress::decode(&addr.encode()).unwrap();
        assert_eq!(decoded, addr);
        assert_eq!(open_peer(&decoded, rank_1()).unwrap().1, std::process::id());
        let other = SegAddress { nonce: seg.nonce ^ 1, ..addr.clone() };
        let err = open_peer(&other, rank_1()).unwrap_err();
        assert!(err.contains("is not the segment rank 1 published"), "{err}");
        let other = SegAddress { inode: addr.inode ^ 1, ..addr.clone() };
        let err = open_peer(&other, rank_1()).unwrap_err();
        assert!(err.contains("not rank 1's segment"), "{err}");
        let err = open_peer(&addr, (1, std::process::id() + 1)).unwrap_err();
        assert!(err.contains("but rank 1 is pid"), "{err}");
    }

    #[test]
    fn decode_refuses_ring_shapes_geometry_would_not_make() {
        assert_eq!(SegAddress::decode(&address_with_max(16)).unwrap().layout.geo.max_msg_slots, 16);
        for max in [0, 17, Geometry::MAX_MSG_SLOTS + 1] {
            let err = SegAddress::decode(&address_with_max(max)).unwrap_err();
            assert!(err.contains("impossible ring shape"), "{err}");
        }
    }

    /// More memory than the machine has is refused before anything is allocated.
    #[test]
    fn a_segment_larger_than_memory_is_refused() {
        let Some(avail) = available_memory() else { return };
        let err = enough_memory(avail as usize + (1 << 30)).unwrap_err().to_string();
        assert!(err.contains("bytes of memory available") && err.contains("No space left"), "{err}");
        enough_memory(4096).unwrap();
    }
}
