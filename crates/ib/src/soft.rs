//! [`SoftProvider`]: RDMA semantics between processes of one machine, for development and CI.
//!
//! Each process keeps a registration table in its own memory. A peer that posts an RDMA write or
//! read first reads the table entry its rkey names (with `process_vm_readv`, together with the
//! table's header, so a recycled process id is noticed), checks key, access and bounds the way a
//! responder HCA would, and only then moves the data with `process_vm_writev` / `readv` against
//! the checked range. A wrong key, a range past the region or a forged length ends as a
//! [`WcStatus::RemoteAccess`] completion and puts the queue pair in the error state, like real
//! verbs; nothing outside a registered region is ever touched.
//!
//! Operations run to completion inside [`Provider::post`]; completions are queued for
//! [`Provider::poll`]. With a link model ([`SoftProvider::with_link`], an emulation), a
//! completion is held until the model's time for its transfer (the adapter reading or writing
//! device memory, the network out of one node and into the other) and `poll` hands it out once
//! that time passed; nothing sleeps in a post. A paced write lands its last 8 bytes and its
//! immediate only then (from that `poll`), so the target too sees it at the model's time, writes
//! landing in posting order. Completions leave in the order they were posted,
//! as a reliable connection's do. A write with immediate also needs a receive the target posted: the
//! target publishes, per queue pair, how many it posted and a ring of completion slots; the
//! initiator checks the count (none left: [`WcStatus::ReceiverNotReady`]), writes the data,
//! then the immediate and a stamp into the next slot, which the target's `poll` turns into a
//! receive completion. A queue pair moved to the error state ([`Provider::disconnect`]) says so
//! in its receive queue, which initiators read with every request: theirs then fail as against
//! a peer that is gone. A write of more than 8 bytes lands in two steps, the last 8 bytes after
//! the rest, so a receiver polling a tail word (DirectIB's eager ring) sees the tail only after
//! the data: the in-order placement real HCAs give.
//!
//! Limit: a deregistration that races with a peer's operation which already passed its check may
//! still see that operation land (a real HCA fences this in hardware). DirectIB deregisters only
//! memory whose operations completed. Receive completion slots are never freed (a few bytes per
//! queue pair), so a peer's write with immediate that races with this provider's drop lands in
//! memory nothing else uses.

use crate::provider::{Access, Completion, MemoryRegion, Opcode, Provider, QpId, WcStatus, WorkRequest};
use polyrail_core::{Error, Result};
use polyrail_link::{rdma_hops, Domain, LinkModel, PacingStats};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Magic of a soft provider's table header and endpoint: `b"PRSOFTMR"`.
const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"PRSOFTMR");
/// Registrations one process can hold at once.
const TABLE_CAPACITY: usize = 4096;
/// Largest transfer of one work request (the kernel copies at most this per call anyway).
const MAX_TRANSFER: usize = 1 << 30;
/// Work requests outstanding per queue pair (they run at post, so this only bounds completions
/// not yet polled or not yet due under a link model).
const MAX_OUTSTANDING: usize = 256;
/// Bytes of an endpoint: magic, pid, table address, nonce, node, SCIF node (the domain).
const ENDPOINT_LEN: usize = 34;
/// Queue pairs one process can hold (its table publishes a receive queue for each).
const QP_CAPACITY: usize = 4096;

/// One registration as peers read it: 32 bytes, `repr(C)`.
#[repr(C)]
struct Entry {
    addr: AtomicU64,
    len: AtomicU64,
    /// 0 when free.
    rkey: AtomicU32,
    access: AtomicU32,
    _pad: u64,
}

/// A queue pair's receive queue as its peer reads it: 32 bytes, `repr(C)`.
#[repr(C)]
struct RecvQueue {
    /// Receives posted so far (written by the owner only).
    posted: AtomicU64,
    /// Address of the completion slots, `u64` each: immediate data in the low half, the stamp
    /// (receive number + 1, as `u32`, never 0) in the high half.
    slots: AtomicU64,
    /// Number of slots (the queue pair's receive depth).
    capacity: AtomicU64,
    /// Nonzero once the owner moved the queue pair to the error state
    /// ([`Provider::disconnect`]): the peer's requests on it fail.
    closed: AtomicU64,
}

/// A receive queue as copied from a peer.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct RawRecvQueue {
    posted: u64,
    slots: u64,
    capacity: u64,
    closed: u64,
}

/// The table header peers read with every entry.
#[repr(C)]
struct Header {
    magic: u64,
    nonce: u64,
    capacity: u64,
    _pad: u64,
}

/// The registration table: a header, the entries and the receive queues (by queue pair
/// number - 1), contiguous, at a stable address.
#[repr(C)]
struct Table {
    header: Header,
    entries: [Entry; TABLE_CAPACITY],
    recv: [RecvQueue; QP_CAPACITY],
}

/// Offset of receive queue `i` in a table.
fn recv_queue_offset(i: usize) -> u64 {
    (std::mem::offset_of!(Table, recv) + std::mem::size_of::<RecvQueue>() * i) as u64
}

/// The stamp of receive number `n` (counted from 0) in its completion slot.
fn stamp(n: u64) -> u32 {
    (n % u32::MAX as u64) as u32 + 1
}

/// Entry as copied from a peer.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct RawEntry {
    addr: u64,
    len: u64,
    rkey: u32,
    access: u32,
    _pad: u64,
}

/// A peer process as a soft queue pair sees it.
#[derive(Clone, Copy, Debug)]
struct Remote {
    pid: u32,
    table: u64,
    nonce: u64,
    /// Its (virtual) node and memory domain, for the link model.
    node: u32,
    domain: Domain,
}

/// The part of a paced write that lands when its completion is due: its last bytes (at most 8)
/// and, for a write with immediate, the immediate and its stamp. The target thus sees the write
/// (a ring's tail word, a receive completion) no earlier than the link model says.
#[derive(Clone, Copy, Debug)]
struct Landing {
    pid: u32,
    tail: [u8; 8],
    tail_len: usize,
    tail_addr: u64,
    /// Immediate, slot address, stamp.
    imm: Option<(u32, u64, u32)>,
}

impl Landing {
    /// Writes the rest into the target: the tail, then the immediate, then the stamp.
    fn land(&self) -> io::Result<()> {
        if self.tail_len > 0 {
            copy_range(self.pid, self.tail.as_ptr() as u64, self.tail_addr, self.tail_len, true)?;
        }
        if let Some((imm, slot, stamp)) = self.imm {
            copy_range(self.pid, &imm as *const u32 as u64, slot, 4, true)?;
            copy_range(self.pid, &stamp as *const u32 as u64, slot.wrapping_add(4), 4, true)?;
        }
        Ok(())
    }
}

/// A completion's status from the outcome of its copies.
fn status_of(copied: io::Result<()>) -> WcStatus {
    match copied {
        Ok(()) => WcStatus::Success,
        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => WcStatus::RemoteAccess,
        Err(_) => WcStatus::RetryExceeded,
    }
}

/// The link model a provider paces with (an emulation), and where this process is.
#[derive(Clone, Debug)]
pub struct SoftLink {
    /// The job's model.
    pub model: Arc<LinkModel>,
    /// This process's (virtual) node (`POLYRAIL_NODE`).
    pub node: u32,
    /// Where this process's memory is (host, or device k of the node).
    pub domain: Domain,
}

#[derive(Debug, Default)]
struct SoftQp {
    remote: Option<Remote>,
    /// The peer's queue pair number.
    remote_qpn: u32,
    /// Ready to send (moved there on first use, as with real verbs).
    sending: bool,
    /// Set by the first failed completion; later requests are flushed.
    failed: bool,
    /// Receives of the peer our writes with immediate consumed.
    peer_recvs_used: u64,
    /// Our posted receives (their `wr_id`s, oldest first), how many completed so far, and
    /// their completion slots (published in the table).
    recvs: VecDeque<u64>,
    recvs_done: u64,
    slots: Box<[AtomicU64]>,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        // Peers write these slots from outside; one that passed its checks just before this
        // provider went away may still write: leak them rather than hand them to the allocator.
        std::mem::forget(std::mem::take(&mut self.slots));
    }
}

/// The software RDMA provider (`POLYRAIL_IB_PROVIDER=soft`). See the module documentation.
pub struct SoftProvider {
    pid: u32,
    table: Box<Table>,
    /// Generation per entry, so a reused slot gets a new key.
    generations: Vec<u16>,
    free: Vec<u16>,
    qps: Vec<SoftQp>,
    /// Completions, each with the time it is due under the link model (`None`: at once) and
    /// what of its write lands then.
    completions: VecDeque<(Completion, Option<Instant>, Option<Landing>)>,
    /// Landings among `completions`: while any waits, later writes wait behind it, so that
    /// writes land in posting order.
    landings: usize,
    /// What [`Provider::mtu`] reports.
    mtu: usize,
    /// The link model, if any.
    link: Option<SoftLink>,
}

impl std::fmt::Debug for SoftProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftProvider").field("pid", &self.pid).field("qps", &self.qps.len()).finish()
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

impl SoftProvider {
    /// A provider for this process. Allows any process of the user to read and write its
    /// memory (Yama `PR_SET_PTRACER_ANY`, as the `cma` channel does).
    pub fn new() -> SoftProvider {
        Self::with_mtu(usize::MAX)
    }

    /// As [`SoftProvider::new`], reporting `mtu` as its MTU: transfers still take one system
    /// call each, but DirectIB sends compact packets as over a real port of that MTU (tests of
    /// that path on a machine without RDMA).
    pub fn with_mtu(mtu: usize) -> SoftProvider {
        // Where Yama forbids it anyway, a peer's read fails naming it.
        polyrail_core::allow_peer_reads();
        let pid = std::process::id();
        let nonce = polyrail_core::random_u64();
        // SAFETY: every field of Table is an integer or an atomic integer, for which all-zero
        // bytes are a valid value (free entries); the pointer comes from the global allocator
        // with Table's layout, as Box::from_raw requires.
        // Allocation failure aborts, as for any Box.
        let mut table: Box<Table> = unsafe {
            let layout = std::alloc::Layout::new::<Table>();
            let ptr = std::alloc::alloc_zeroed(layout).cast::<Table>();
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(ptr)
        };
        table.header = Header { magic: TABLE_MAGIC, nonce, capacity: TABLE_CAPACITY as u64, _pad: 0 };
        SoftProvider {
            pid,
            table,
            generations: vec![0; TABLE_CAPACITY],
            free: (0..TABLE_CAPACITY as u16).rev().collect(),
            qps: Vec::new(),
            completions: VecDeque::new(),
            landings: 0,
            mtu,
            link: None,
        }
    }

    /// The same, pacing completions with `link` (an emulation); a model of the `none` profile
    /// paces nothing. Peers learn this process's node and domain from its endpoint.
    pub fn with_link(mut self, link: SoftLink) -> SoftProvider {
        self.link = Some(link);
        self
    }

    /// What the link model did to this provider's transfers, and the profile's name; `None`
    /// without a model.
    pub fn pacing(&self) -> Option<(String, PacingStats)> {
        self.link.as_ref().map(|l| (l.model.profile().name.clone(), l.model.stats()))
    }

    /// When the transfer of `wr` on a queue pair to `remote`, which started at `start` and whose
    /// copy ended at `copied`, completes under the link model: the bytes leave the target for a
    /// read and this process for a write.
    fn due(&self, remote: &Remote, wr: &WorkRequest, start: Instant, copied: Instant) -> Instant {
        let Some(link) = &self.link else { return copied };
        let hops = if wr.opcode == Opcode::Read {
            rdma_hops(remote.node, remote.domain, link.node, link.domain)
        } else {
            rdma_hops(link.node, link.domain, remote.node, remote.domain)
        };
        // A node file that cannot be opened leaves the transfer unpaced rather than failing it.
        link.model.complete(&hops, wr.len, start, copied).unwrap_or(copied)
    }

    fn table_addr(&self) -> u64 {
        &*self.table as *const Table as u64
    }

    /// Index of the entry a key names: keys are `generation << 16 | (index + 1)`.
    fn key_index(key: u32) -> usize {
        ((key & 0xffff) as usize).wrapping_sub(1)
    }

    /// Checks a local scatter element against this process's own table.
    fn check_local(&self, wr: &WorkRequest) -> bool {
        let i = Self::key_index(wr.lkey);
        let Some(e) = self.table.entries.get(i) else { return false };
        // Relaxed: the entry is only written by this thread.
        let (addr, len) = (e.addr.load(Ordering::Relaxed), e.len.load(Ordering::Relaxed) as usize);
        let mr = MemoryRegion { addr, len, lkey: wr.lkey, rkey: wr.lkey, handle: i };
        let need = if wr.opcode == Opcode::Read { Access::LOCAL_WRITE } else { Access(0) };
        e.rkey.load(Ordering::Relaxed) == wr.lkey
            && Access(e.access.load(Ordering::Relaxed)).contains(need)
            && mr.contains(wr.local_addr, wr.len)
    }

    /// Executes one request against `remote`, whose queue pair number `qpn` has had `recvs_used`
    /// of its receives consumed by our writes with immediate; the status of its completion. With
    /// `split`, a write leaves its last bytes and its immediate to the [`Landing`] returned.
    fn execute(
        remote: Remote,
        qpn: u32,
        recvs_used: u64,
        wr: &WorkRequest,
        split: bool,
    ) -> (WcStatus, Option<Landing>) {
        let (status, landing) = Self::execute_inner(remote, qpn, recvs_used, wr, split);
        (status, landing.filter(|_| status == WcStatus::Success))
    }

    fn execute_inner(
        remote: Remote,
        qpn: u32,
        recvs_used: u64,
        wr: &WorkRequest,
        split: bool,
    ) -> (WcStatus, Option<Landing>) {
        let i = Self::key_index(wr.rkey);
        if i >= TABLE_CAPACITY {
            return (WcStatus::RemoteAccess, None);
        }
        // Read the header, the entry the key names and the target queue pair's receive queue
        // (is it closed? for a write with immediate, has it a receive?), in one call.
        let mut header = [0u8; 32];
        let mut entry = RawEntry::default();
        let mut rq = RawRecvQueue::default();
        let local = [
            libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: 32 },
            libc::iovec { iov_base: (&mut entry as *mut RawEntry).cast(), iov_len: 32 },
            libc::iovec { iov_base: (&mut rq as *mut RawRecvQueue).cast(), iov_len: 32 },
        ];
        let entry_addr = remote.table + 32 + 32 * i as u64;
        let rq_addr = remote.table + recv_queue_offset((qpn as usize).saturating_sub(1).min(QP_CAPACITY - 1));
        let remote_iov = [
            libc::iovec { iov_base: remote.table as usize as *mut libc::c_void, iov_len: 32 },
            libc::iovec { iov_base: entry_addr as usize as *mut libc::c_void, iov_len: 32 },
            libc::iovec { iov_base: rq_addr as usize as *mut libc::c_void, iov_len: 32 },
        ];
        let parts = 3;
        // SAFETY: the local iovecs describe our own writable 32-byte buffers; the kernel checks
        // the remote ranges.
        let n = unsafe {
            libc::process_vm_readv(remote.pid as libc::pid_t, local.as_ptr(), parts, remote_iov.as_ptr(), parts, 0)
        };
        if n != 32 * parts as isize || u64_at(&header, 0) != TABLE_MAGIC || u64_at(&header, 8) != remote.nonce {
            // Gone (ESRCH), or a recycled pid that is not our peer any more.
            return (WcStatus::RetryExceeded, None);
        }
        if rq.closed != 0 {
            // The target's queue pair is in the error state: it answers nothing, as a real
            // responder would not.
            return (WcStatus::RetryExceeded, None);
        }
        let need = if wr.opcode == Opcode::Write { Access::REMOTE_WRITE } else { Access::REMOTE_READ };
        let region = MemoryRegion { addr: entry.addr, len: entry.len as usize, lkey: 0, rkey: entry.rkey, handle: i };
        if wr.rkey == 0
            || entry.rkey != wr.rkey
            || !Access(entry.access).contains(need)
            || !region.contains(wr.remote_addr, wr.len)
        {
            return (WcStatus::RemoteAccess, None);
        }
        if wr.imm.is_some() && (rq.posted <= recvs_used || rq.capacity == 0 || rq.slots == 0) {
            return (WcStatus::ReceiverNotReady, None);
        }
        if split && wr.opcode == Opcode::Write {
            let head = wr.len.saturating_sub(8);
            let mut landing = Landing {
                pid: remote.pid,
                tail: [0; 8],
                tail_len: wr.len - head,
                tail_addr: wr.remote_addr + head as u64,
                // As below: wrapping, so that a forged `slots` fails the kernel copy.
                imm: wr.imm.map(|imm| (imm, rq.slots.wrapping_add(8 * (recvs_used % rq.capacity)), stamp(recvs_used))),
            };
            // SAFETY: `post` checked `local_addr..local_addr + len` against a registration of
            // this process (check_local), so its last `tail_len` bytes are readable; `tail` is
            // ours and as long.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (wr.local_addr as usize + head) as *const u8,
                    landing.tail.as_mut_ptr(),
                    landing.tail_len,
                )
            };
            return (status_of(copy_range(remote.pid, wr.local_addr, wr.remote_addr, head, true)), Some(landing));
        }
        let copied =
            vm_copy(remote.pid, wr.local_addr, wr.remote_addr, wr.len, wr.opcode == Opcode::Write).and_then(|()| {
                match wr.imm {
                    // The immediate, then the stamp that makes the slot complete (two steps: the
                    // target sees the stamp only after the immediate).
                    Some(imm) => {
                        // The peer's table gives `slots`: wrapping arithmetic, so that a forged
                        // one makes the kernel copy fail (EFAULT) rather than an overflow panic.
                        let slot = rq.slots.wrapping_add(8 * (recvs_used % rq.capacity));
                        let stamp = stamp(recvs_used);
                        copy_range(remote.pid, &imm as *const u32 as u64, slot, 4, true)?;
                        copy_range(remote.pid, &stamp as *const u32 as u64, slot.wrapping_add(4), 4, true)
                    }
                    None => Ok(()),
                }
            });
        (status_of(copied), None)
    }
}

impl Default for SoftProvider {
    fn default() -> Self {
        Self::new()
    }
}

/// Copies `len` bytes between local `local` and `remote` in process `pid`. A write of more than
/// 8 bytes places the last 8 bytes in a separate step after the rest.
fn vm_copy(pid: u32, local: u64, remote: u64, len: usize, write: bool) -> io::Result<()> {
    if write && len > 8 {
        copy_range(pid, local, remote, len - 8, true)?;
        return copy_range(pid, local + (len - 8) as u64, remote + (len - 8) as u64, 8, true);
    }
    copy_range(pid, local, remote, len, write)
}

/// Copies `len` bytes with as many system calls as the kernel needs.
fn copy_range(pid: u32, local: u64, remote: u64, len: usize, write: bool) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec { iov_base: (local as usize + done) as *mut libc::c_void, iov_len: len - done };
        let r = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: the caller checked `local..local + len` against a registration of this
        // process (so it is valid, and writable for a read); the kernel checks the remote range,
        // which the caller checked against the peer's registration.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid as libc::pid_t, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0)
            }
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::other("no progress")),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

impl Provider for SoftProvider {
    fn name(&self) -> &'static str {
        "soft"
    }

    fn describe(&self) -> String {
        let link = match &self.link {
            Some(l) if l.model.is_active() => format!(
                "; {}, node {}, {}",
                l.model.summary(),
                l.node,
                match l.domain {
                    Domain::Host => "host memory".to_string(),
                    Domain::Device(k) => format!("device {k} memory"),
                }
            ),
            _ => String::new(),
        };
        format!(
            "software RDMA provider (development and CI only: RDMA by process_vm_readv/writev against registered regions, pid {}{link})",
            self.pid
        )
    }

    fn max_inline(&self) -> usize {
        // Every write is executed at post time: the buffer is free at once whatever its size.
        usize::MAX
    }

    fn max_transfer(&self) -> usize {
        MAX_TRANSFER
    }

    /// No packets (`usize::MAX`; every transfer is one system call) unless made
    /// [`SoftProvider::with_mtu`].
    fn mtu(&self) -> usize {
        self.mtu
    }

    fn cpu_copies(&self) -> bool {
        true
    }

    fn pacing_summary(&self) -> Option<String> {
        self.link.as_ref().filter(|l| l.model.is_active()).map(|l| l.model.summary())
    }

    fn max_outstanding(&self) -> usize {
        MAX_OUTSTANDING
    }

    /// `"PRSOFTMR"`, pid u32, table address u64, nonce u64, node u32, SCIF node u16 (0 the
    /// host; little endian).
    fn endpoint(&self) -> Vec<u8> {
        let (node, domain) = self.link.as_ref().map_or((0, Domain::Host), |l| (l.node, l.domain));
        let mut e = Vec::with_capacity(ENDPOINT_LEN);
        e.extend_from_slice(&TABLE_MAGIC.to_le_bytes());
        e.extend_from_slice(&self.pid.to_le_bytes());
        e.extend_from_slice(&self.table_addr().to_le_bytes());
        e.extend_from_slice(&self.table.header.nonce.to_le_bytes());
        e.extend_from_slice(&node.to_le_bytes());
        e.extend_from_slice(&domain.scif_node().to_le_bytes());
        e
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize, access: Access) -> Result<MemoryRegion> {
        if (addr as u64).checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument(format!("registration of {len} bytes at {addr:p} wraps around")));
        }
        let i = self.free.pop().ok_or_else(|| Error::Transport {
            kind: "ib",
            what: format!("soft provider: all {TABLE_CAPACITY} registrations in use"),
        })? as usize;
        self.generations[i] = self.generations[i].wrapping_add(1).max(1);
        let key = (self.generations[i] as u32) << 16 | (i as u32 + 1);
        let e = &self.table.entries[i];
        e.addr.store(addr as u64, Ordering::Relaxed);
        e.len.store(len as u64, Ordering::Relaxed);
        e.access.store(access.0, Ordering::Relaxed);
        // Release: a peer only learns the key after this returns; the kernel copy that reads the
        // entry happens after that, so the fields above are in place.
        e.rkey.store(key, Ordering::Release);
        Ok(MemoryRegion { addr: addr as u64, len, lkey: key, rkey: key, handle: i })
    }

    fn deregister(&mut self, mr: &MemoryRegion) {
        let Some(e) = self.table.entries.get(mr.handle) else { return };
        if e.rkey.load(Ordering::Relaxed) != mr.rkey {
            return;
        }
        // The key goes first: a peer reading the entry from now on is refused.
        e.rkey.store(0, Ordering::Release);
        e.len.store(0, Ordering::Relaxed);
        self.free.push(mr.handle as u16);
    }

    fn create_qp(&mut self, recv_depth: usize) -> Result<(QpId, u32)> {
        let i = self.qps.len();
        if i >= QP_CAPACITY {
            return Err(Error::Transport {
                kind: "ib",
                what: format!("soft provider: all {QP_CAPACITY} queue pairs in use"),
            });
        }
        let slots: Box<[AtomicU64]> = (0..recv_depth).map(|_| AtomicU64::new(0)).collect();
        let rq = &self.table.recv[i];
        // Relaxed: a peer reads these only after it learned the queue pair number, which
        // leaves this process after this returns.
        rq.posted.store(0, Ordering::Relaxed);
        rq.slots.store(if recv_depth == 0 { 0 } else { slots.as_ptr() as u64 }, Ordering::Relaxed);
        rq.capacity.store(recv_depth as u64, Ordering::Relaxed);
        rq.closed.store(0, Ordering::Relaxed);
        let mut q = SoftQp::default();
        q.slots = slots;
        self.qps.push(q);
        Ok((i, i as u32 + 1))
    }

    fn connect(&mut self, qp: QpId, remote_endpoint: &[u8], remote_qpn: u32) -> Result<()> {
        let bad = |why: String| Error::Transport { kind: "ib", what: format!("soft provider: {why}") };
        if remote_endpoint.len() != ENDPOINT_LEN || u64_at(remote_endpoint, 0) != TABLE_MAGIC {
            return Err(bad(format!(
                "not a soft provider endpoint ({} bytes); every process must use the same POLYRAIL_IB_PROVIDER",
                remote_endpoint.len()
            )));
        }
        let pid =
            u32::from_le_bytes([remote_endpoint[8], remote_endpoint[9], remote_endpoint[10], remote_endpoint[11]]);
        let b = remote_endpoint;
        let remote = Remote {
            pid,
            table: u64_at(b, 12),
            nonce: u64_at(b, 20),
            // Any node and domain are acceptable: they only choose which link words pace.
            node: u32::from_le_bytes([b[28], b[29], b[30], b[31]]),
            domain: Domain::from_scif_node(u16::from_le_bytes([b[32], b[33]])),
        };
        // Probe: read the peer's table header.
        let mut header = [0u8; 32];
        let l = libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: 32 };
        let r = libc::iovec { iov_base: remote.table as usize as *mut libc::c_void, iov_len: 32 };
        // SAFETY: `l` is our own 32-byte buffer; the kernel checks the remote range.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0) };
        if n != 32 {
            let e = io::Error::last_os_error();
            return Err(bad(format!(
                "cannot read the registration table of pid {pid}: {e} (Yama ptrace_scope, seccomp or another machine)"
            )));
        }
        if u64_at(&header, 0) != TABLE_MAGIC || u64_at(&header, 8) != remote.nonce {
            return Err(bad(format!("pid {pid} does not hold the registration table it published")));
        }
        if remote_qpn == 0 || remote_qpn as usize > QP_CAPACITY {
            return Err(bad(format!("queue pair number {remote_qpn} of pid {pid} is outside 1..={QP_CAPACITY}")));
        }
        let q = self.qps.get_mut(qp).ok_or_else(|| bad(format!("no queue pair {qp}")))?;
        q.remote = Some(remote);
        q.remote_qpn = remote_qpn;
        Ok(())
    }

    fn ready_to_send(&mut self, qp: QpId) -> Result<()> {
        match self.qps.get_mut(qp) {
            Some(q) if q.remote.is_some() => {
                q.sending = true;
                Ok(())
            }
            _ => Err(Error::Transport { kind: "ib", what: format!("soft provider: queue pair {qp} is not connected") }),
        }
    }

    fn disconnect(&mut self, qp: QpId) {
        if let Some(q) = self.qps.get_mut(qp) {
            q.failed = true;
            // Release: the peer that reads the flag sees the queue pair closed; nothing else is
            // published with it.
            self.table.recv[qp].closed.store(1, Ordering::Release);
        }
    }

    fn post(&mut self, qp: QpId, wr: &WorkRequest) -> Result<()> {
        if wr.imm.is_some() && wr.opcode != Opcode::Write {
            return Err(Error::InvalidArgument("immediate data on an RDMA read".into()));
        }
        let local_ok = self.check_local(wr);
        let q =
            self.qps.get_mut(qp).ok_or_else(|| Error::Transport { kind: "ib", what: format!("no queue pair {qp}") })?;
        let (Some(remote), true) = (q.remote, q.sending) else {
            return Err(Error::Transport { kind: "ib", what: format!("queue pair {qp} is not ready to send") });
        };
        let paced = self.link.as_ref().is_some_and(|l| l.model.is_active());
        let start = paced.then(Instant::now);
        let (mut status, mut landing) = if q.failed {
            (WcStatus::Flushed, None)
        } else if !local_ok {
            (WcStatus::LocalProtection, None)
        } else {
            Self::execute(remote, q.remote_qpn, q.peer_recvs_used, wr, paced)
        };
        q.failed |= status != WcStatus::Success;
        q.peer_recvs_used += (status == WcStatus::Success && wr.imm.is_some()) as u64;
        let due = match start {
            Some(start) if status == WcStatus::Success => Some(self.due(&remote, wr, start, Instant::now())),
            _ => None,
        };
        // Due already (the copy took longer than the model asked) and nothing waiting before
        // it: the write lands now.
        if let Some(l) = landing.filter(|_| self.landings == 0 && due.is_none_or(|d| d <= Instant::now())) {
            status = status_of(l.land());
            landing = None;
            if let (false, Some(q)) = (status == WcStatus::Success, self.qps.get_mut(qp)) {
                q.failed = true;
            }
        }
        self.landings += landing.is_some() as usize;
        self.completions.push_back((Completion { wr_id: wr.wr_id, status, qp, imm: None }, due, landing));
        Ok(())
    }

    fn post_recv(&mut self, qp: QpId, wr_id: u64) -> Result<()> {
        let q =
            self.qps.get_mut(qp).ok_or_else(|| Error::Transport { kind: "ib", what: format!("no queue pair {qp}") })?;
        if q.recvs.len() >= q.slots.len() {
            return Err(Error::Transport {
                kind: "ib",
                what: format!("receive queue of queue pair {qp} is full ({} receives posted)", q.slots.len()),
            });
        }
        q.recvs.push_back(wr_id);
        // Release: orders nothing the peer reads after it (the slots are ours until it writes
        // them), but pairs with the peer's read of the count for the same reason as `register`.
        self.table.recv[qp].posted.store(q.recvs_done + q.recvs.len() as u64, Ordering::Release);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        // In posting order: a completion not yet due holds back those after it.
        let mut n = 0;
        let mut now = None;
        while n < max {
            let Some(&(mut c, due, landing)) = self.completions.front() else { break };
            if let Some(due) = due {
                if due > *now.get_or_insert_with(Instant::now) {
                    break;
                }
            }
            self.completions.pop_front();
            if let Some(l) = landing {
                self.landings -= 1;
                c.status = status_of(l.land());
                if c.status != WcStatus::Success {
                    if let Some(q) = self.qps.get_mut(c.qp) {
                        q.failed = true;
                    }
                }
            }
            out.push(c);
            n += 1;
        }
        for (i, q) in self.qps.iter_mut().enumerate() {
            while n < max && !q.recvs.is_empty() {
                let slot = &q.slots[(q.recvs_done % q.slots.len() as u64) as usize];
                // Acquire: the peer wrote the data and the immediate before the stamp (earlier
                // system calls), so they are in place once the stamp is seen.
                let v = slot.load(Ordering::Acquire);
                if (v >> 32) as u32 != stamp(q.recvs_done) {
                    break;
                }
                let wr_id = q.recvs.pop_front().unwrap_or_default();
                q.recvs_done += 1;
                out.push(Completion { wr_id, status: WcStatus::Success, qp: i, imm: Some(v as u32) });
                n += 1;
            }
        }
        n
    }
}
