//! What DirectIB needs from an RDMA provider: registered memory with keys, reliable-connected
//! queue pairs, RDMA write and read, completion polling.
//!
//! Two providers implement [`Provider`]: real verbs through rdma-core (feature `verbs`) and the
//! [`SoftProvider`](crate::SoftProvider), which gives the same semantics between processes of
//! one machine. The protocol code in [`DirectIb`](crate::DirectIb) is the same for both.
//!
//! DirectIB carries every packet (eager data, rendezvous control, credits) by RDMA write into
//! the peer's eager ring, as DCFA-MPI does. The receive queue serves one purpose: an RDMA write
//! with immediate consumes a posted receive and tells the receiver, through a completion, that
//! its data landed, with 32 bits of the sender's choosing. DirectIB uses it for packets whose
//! header would push them past one path MTU (see `direct.rs`).

use polyrail_core::Result;
use std::fmt;

/// Remote access a registration allows (real verbs' `IBV_ACCESS_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    /// The local side may write (target of an RDMA read).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA-write into it.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA-read from it.
    pub const REMOTE_READ: Access = Access(4);
    /// Every access.
    pub const ALL: Access = Access(7);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// Key for local work requests.
    pub lkey: u32,
    /// Key peers present to read or write it.
    pub rkey: u32,
    /// Provider's handle (index of its registration).
    pub handle: usize,
}

impl MemoryRegion {
    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: usize) -> bool {
        let region_end = self.addr.checked_add(self.len as u64);
        addr >= self.addr && addr.checked_add(len as u64).zip(region_end).is_some_and(|(end, limit)| end <= limit)
    }
}

/// A queue pair, by index in its provider.
pub type QpId = usize;

/// An RDMA operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// Write local memory into the peer's region.
    Write,
    /// Read the peer's region into local memory.
    Read,
}

/// One work request on a queue pair's send queue (one scatter/gather element).
#[derive(Clone, Copy, Debug)]
pub struct WorkRequest {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Write or read.
    pub opcode: Opcode,
    /// Local memory: start address.
    pub local_addr: u64,
    /// Length in bytes (both sides).
    pub len: usize,
    /// Key of the registration holding the local memory.
    pub lkey: u32,
    /// Peer memory: start address.
    pub remote_addr: u64,
    /// Key of the peer's registration.
    pub rkey: u32,
    /// Copy the data into the request at post time (small writes): the local memory may be
    /// reused at once.
    pub inline: bool,
    /// For a write: the immediate data of an RDMA write with immediate, which consumes a
    /// receive the peer posted ([`Provider::post_recv`]) and completes it with this value.
    pub imm: Option<u32>,
}

/// Status of a work completion (the subset of `ibv_wc_status` the providers produce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// The local memory was not covered by the lkey (`IBV_WC_LOC_PROT_ERR`).
    LocalProtection,
    /// The peer refused: wrong rkey, range outside its region, or access not granted
    /// (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccess,
    /// The peer did not answer: gone or unreachable (`IBV_WC_RETRY_EXC_ERR`).
    RetryExceeded,
    /// The peer had no receive posted for a write with immediate (`IBV_WC_RNR_RETRY_EXC_ERR`).
    ReceiverNotReady,
    /// Not executed because the queue pair had failed before (`IBV_WC_WR_FLUSH_ERR`).
    Flushed,
    /// Another provider status, by its number.
    Other(u32),
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcStatus::Success => f.write_str("success"),
            WcStatus::LocalProtection => f.write_str("local protection error (lkey does not cover the buffer)"),
            WcStatus::RemoteAccess => {
                f.write_str("remote access error (wrong rkey, range outside the region, or access not granted)")
            }
            WcStatus::RetryExceeded => f.write_str("transport retry counter exceeded (peer gone or unreachable)"),
            WcStatus::ReceiverNotReady => {
                f.write_str("receiver not ready (no receive posted for a write with immediate)")
            }
            WcStatus::Flushed => f.write_str("flushed (the queue pair failed earlier)"),
            WcStatus::Other(n) => write!(f, "provider status {n}"),
        }
    }
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// Its outcome.
    pub status: WcStatus,
    /// Which queue pair it was posted on.
    pub qp: QpId,
    /// For a receive ([`Provider::post_recv`]) that a write with immediate consumed: the
    /// immediate data. `None` for send-queue requests and for failed receives.
    pub imm: Option<u32>,
}

/// An RDMA provider. See the module documentation.
///
/// Every posted request is signaled: exactly one [`Completion`] comes back for it through
/// [`Provider::poll`], successful or not. After a failed completion, the queue pair is in the
/// error state: later requests on it complete with [`WcStatus::Flushed`].
pub trait Provider: Send {
    /// `verbs` or `soft`.
    fn name(&self) -> &'static str;

    /// Device, port and addressing in one line, for `polyrail info`.
    fn describe(&self) -> String;

    /// Largest write that may be posted with [`WorkRequest::inline`].
    fn max_inline(&self) -> usize;

    /// Largest transfer of one work request.
    fn max_transfer(&self) -> usize;

    /// Largest payload of one packet on the wire (the port's active MTU); `usize::MAX` when
    /// transfers are not cut into packets.
    fn mtu(&self) -> usize;

    /// Work requests that may be outstanding on one queue pair.
    fn max_outstanding(&self) -> usize;

    /// Whether RDMA reads and writes are copies the host CPUs make (the soft provider,
    /// Soft-RoCE, siw) rather than an adapter's DMA: then a transfer split between both
    /// processes goes faster.
    fn cpu_copies(&self) -> bool;

    /// What a link model (an emulation) did to this provider's transfers, in one line; `None`
    /// without one.
    fn pacing_summary(&self) -> Option<String> {
        None
    }

    /// Bytes a peer needs to reach this process's device (GID and LID, or process id).
    fn endpoint(&self) -> Vec<u8>;

    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// The memory must stay valid until [`Provider::deregister`]; peers may write it when
    /// `access` allows.
    unsafe fn register(&mut self, addr: *mut u8, len: usize, access: Access) -> Result<MemoryRegion>;

    /// Ends a registration: peers' later accesses with its key fail.
    fn deregister(&mut self, mr: &MemoryRegion);

    /// Creates a reliable-connected queue pair with room for `recv_depth` posted receives;
    /// returns it and its number for the peer.
    fn create_qp(&mut self, recv_depth: usize) -> Result<(QpId, u32)>;

    /// Connects `qp` to queue pair `remote_qpn` at the device `remote_endpoint` and makes it
    /// ready to receive: from now on the peer's requests land.
    fn connect(&mut self, qp: QpId, remote_endpoint: &[u8], remote_qpn: u32) -> Result<()>;

    /// Makes a connected queue pair ready to send (a no-op when it is). DirectIB calls it before
    /// its first request to the peer: queue pairs are connected on first use.
    fn ready_to_send(&mut self, qp: QpId) -> Result<()>;

    /// Moves `qp` to the error state for good: the peer's requests on it fail from now on (its
    /// writes and reads of our memory no longer land), and ours complete as
    /// [`WcStatus::Flushed`]. For a peer found breaking the protocol, which may still run.
    fn disconnect(&mut self, qp: QpId);

    /// Posts a work request on `qp`. `Err` means it was not posted (queue full, not connected).
    fn post(&mut self, qp: QpId, wr: &WorkRequest) -> Result<()>;

    /// Posts a receive without a buffer on `qp` (connected or not), for one write with immediate
    /// from the peer; it completes with `wr_id` and the immediate data. A queue pair holds up to
    /// `recv_depth` of them (given at [`Provider::create_qp`]).
    fn post_recv(&mut self, qp: QpId, wr_id: u64) -> Result<()>;

    /// Appends up to `max` completions to `out`; returns how many.
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize;
}
