//! The one trait every channel implements, and the vocabulary around it.
//!
//! A transport is a mechanism: it says what it can do and what that costs ([`TransportAttr`]),
//! moves bytes, and reports arrivals and completions through a [`Sink`]. It never matches tags
//! and never chooses a protocol; the engine and the policy do that.

use crate::config::Config;
use crate::error::{Error, Rank, Result};
use crate::header::Header;
use crate::memory::SharedFile;
use crate::observe::{Observation, Observe};
use crate::policy::topology::TopoClass;
use std::fmt;
use std::ops::Range;

/// A channel's stable short name (`self`, `shm`, `cma`, `ib`, ...), as `POLYRAIL_TRANSPORTS`,
/// `POLYRAIL_ROUTE` and reports write it. Each channel crate declares its own (e.g.
/// `polyrail_shm::SHM`); only the loopback's is core's, since configuration treats it apart
/// (it cannot be denied).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransportKind(&'static str);

impl TransportKind {
    /// The loopback channel to this process itself (`self`), always on.
    pub const SELF: TransportKind = TransportKind("self");

    /// The kind named `name`: lowercase letters, digits and dashes.
    pub const fn new(name: &'static str) -> Self {
        TransportKind(name)
    }

    /// The short name.
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Capability flags of a transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Caps(u32);

impl Caps {
    /// Active messages: `try_send` and arrivals through `progress`.
    pub const AM: Caps = Caps(1);
    /// One-sided read of a peer's registered memory.
    pub const GET: Caps = Caps(2);
    /// One-sided write into a peer's registered memory.
    pub const PUT: Caps = Caps(4);
    /// `get`/`put` finish before they return (no completion through `progress`).
    pub const RMA_INLINE_COMPLETION: Caps = Caps(8);
    /// Polling costs a system call: poll only when an arrival is expected.
    pub const POLL_IS_SYSCALL: Caps = Caps(16);
    /// A process can sleep until an arrival on this channel wakes it (`arm` / `sleep`).
    pub const WAKEUP: Caps = Caps(32);
    /// Reaches only processes of its own (virtual) node: not offered for peers placed on
    /// another node, whatever `add_peer` would say.
    pub const NODE_LOCAL: Caps = Caps(64);
    /// `get`/`put` are copies made by the calling CPU, so splitting one transfer between both
    /// processes doubles the copy rate (a NIC's copy engine gains nothing from it).
    pub const CPU_COPY: Caps = Caps(128);

    /// Reaches only this process (loopback): polled only after something was sent to this
    /// process itself.
    pub const SELF_ONLY: Caps = Caps(256);
    /// Measures how near the peer's core is ([`Observe::LineTransfer`]) and how fast its copies
    /// to the peer run ([`Observe::CopiesSlow`]): routes over it may change with the placement
    /// of the peer's core ([`crate::policy::PlacementRule`]).
    pub const PLACEMENT: Caps = Caps(512);
    /// Reaches only processes of its own memory domain of its node (the host, or one device):
    /// not offered for a peer in another domain ([`PeerInfo::domain`]), whatever `add_peer`
    /// would say.
    pub const DOMAIN_LOCAL: Caps = Caps(1024);

    /// No capability.
    pub const fn empty() -> Caps {
        Caps(0)
    }

    /// Whether all flags of `other` are set.
    pub const fn contains(self, other: Caps) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Caps {
    type Output = Caps;
    fn bitor(self, rhs: Caps) -> Caps {
        Caps(self.0 | rhs.0)
    }
}

/// A linear cost model: `time(size) = latency + overhead + size / bandwidth`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Time for the first byte to reach the peer, in nanoseconds.
    pub latency_ns: f64,
    /// CPU time per operation on the issuing side, in nanoseconds.
    pub overhead_ns: f64,
    /// Sustained bandwidth in bytes per second.
    pub bandwidth: f64,
}

impl Cost {
    /// Modelled one-way time in nanoseconds for a message of `size` bytes.
    pub fn time_ns(&self, size: usize) -> f64 {
        self.latency_ns + self.overhead_ns + size as f64 * 1e9 / self.bandwidth
    }
}

/// What a transport can do and what it costs (the `perf()` of the issues; UCX's `uct_iface_attr`).
#[derive(Clone, Debug)]
pub struct TransportAttr {
    /// Which channel this is.
    pub kind: TransportKind,
    /// Payload bytes that travel inline with the header in the smallest unit (slot, packet).
    pub max_inline: usize,
    /// Largest payload a single `try_send` accepts (0 without [`Caps::AM`]).
    pub max_eager: usize,
    /// Largest `get`/`put` a single call accepts (0 without [`Caps::GET`]/[`Caps::PUT`]).
    pub max_rma: usize,
    /// Capability flags.
    pub caps: Caps,
    /// Cost of an active message.
    pub am_cost: Cost,
    /// Cost of a one-sided `get` or `put`.
    pub rma_cost: Cost,
    /// Smallest single-copy message worth splitting between both processes (the receiver gets
    /// the front, the sender puts the back; see [`Caps::CPU_COPY`]), as measured for this
    /// channel; `None` when splitting gains nothing. `POLYRAIL_SPLIT_THRESHOLD` overrides it.
    pub split_from: Option<usize>,
    /// Smallest message worth a one-sided copy when its source is registered memory with a
    /// memory file (see [`Lifetime::Lasting`]), which this channel copies through a
    /// mapping without the kernel, as measured for it; `None` when the channel does not map
    /// such memory.
    pub mapped_from: Option<usize>,
    /// Where this channel wants one-sided copies to start, by the peer's topology class, from
    /// the channel's own settings (the first entry whose class matches applies); where none
    /// does, the selection takes the cost model and the class defaults.
    pub rndv_from: Vec<RndvFrom>,
}

/// A channel's smallest message for one-sided copies to peers of one class ([`TransportAttr::rndv_from`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RndvFrom {
    /// The class it applies to; `None`: every class.
    pub class: Option<TopoClass>,
    /// The size.
    pub from: usize,
    /// Where it comes from (a variable, a tuning file), for `polyrail info`.
    pub reason: String,
}

/// What the job knows of a peer when transports connect to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's rank.
    pub rank: Rank,
    /// The peer's process id.
    pub pid: u32,
    /// Identity of the peer's machine (host name and boot id).
    pub host: String,
    /// Virtual node of the peer within the job layout (equal to this rank's when on the same node).
    pub node: u32,
    /// Logical CPUs the peer is bound to.
    pub cpus: Vec<usize>,
    /// Whether every rank on this machine has a CPU of its own. When the machine runs more ranks
    /// than it has CPUs, ranks share CPUs, their caches and their time: a channel that reads
    /// from timings how near the peer's core is, or how fast its copies run, stops trusting them.
    pub own_cpus: bool,
    /// Memory domain of the peer within its node: 0 the host, k device k (libscif's node
    /// numbering; `POLYRAIL_DOMAIN`).
    pub domain: u16,
}

/// Identity of this machine as `hostname/boot-id`, which [`PeerInfo::host`] holds.
///
/// The boot id (`/proc/sys/kernel/random/boot_id`) tells apart two machines with the same host
/// name (containers, cloned VMs) and a machine before and after a reboot.
pub fn host_identity() -> String {
    let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_owned()).ok();
    let host = read("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown-host".into());
    format!("{host}/{}", read("/proc/sys/kernel/random/boot_id").unwrap_or_default())
}

/// Whether a transport can carry traffic to a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Yes; the string says what was checked (shown by `polyrail info`).
    Yes(String),
    /// No, and why (shown by `polyrail info`).
    No(String),
}

/// Bytes a transport publishes at bootstrap so that peers can reach it.
pub type Address = Vec<u8>;

/// Identifies a one-sided operation so its completion can be reported.
pub type OpId = u64;

/// The packed key of registered memory (pid + address, rkey, SCIF offset...), as peers name it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RemoteKey {
    len: u8,
    bytes: [u8; RemoteKey::MAX],
}

impl RemoteKey {
    /// Largest key in bytes.
    pub const MAX: usize = 40;

    /// A key holding `bytes`; `None` when longer than [`RemoteKey::MAX`].
    pub fn new(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > Self::MAX {
            return None;
        }
        let mut k = RemoteKey { len: bytes.len() as u8, bytes: [0; Self::MAX] };
        k.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(k)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteKey(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// What peers do with memory a process registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerAccess {
    /// Peers read it: the source of a send, pulled by the receiver.
    Read,
    /// Peers write it: the destination of a receive, pushed by the sender.
    Write,
    /// Peers read and write it (long-lived memory: a registered heap, an RMA window).
    ReadWrite,
}

/// How long a registration lives ([`OneSided::register`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// The buffer of one transfer (a rendezvous message): a channel may register a stand-in, a
    /// copy of a source or a bounce area for a destination, and copies the part peers wrote
    /// into place at [`OneSided::deregister`].
    Transfer,
    /// Long-lived memory (a registered heap, an RMA window): peers access it in place, and
    /// transfers from or into any part of it need no registration work of their own. `file`,
    /// when given, is a memory file of exactly this region (from [`crate::AnonMemory::shared`])
    /// that node-local channels may let peers map, so that they copy with plain loads and
    /// stores. The memory (and the file) must stay valid until [`OneSided::deregister`].
    Lasting {
        /// The region's memory file, if it has one.
        file: Option<SharedFile>,
    },
}

/// A registration ([`OneSided::register`]): the packed key the owner sends to peers, who name
/// the memory with it in `get` and `put`, and what the owner ends it with
/// ([`OneSided::deregister`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemHandle {
    key: RemoteKey,
    lasting: bool,
}

impl MemHandle {
    /// The handle of a registration of `lifetime` whose packed key is `key` (for channels).
    pub fn new(key: RemoteKey, lifetime: &Lifetime) -> Self {
        MemHandle { key, lasting: matches!(lifetime, Lifetime::Lasting { .. }) }
    }

    /// The packed key, for peers.
    pub fn key(&self) -> &RemoteKey {
        &self.key
    }

    /// Whether it is a long-lived registration ([`Lifetime::Lasting`]).
    pub fn is_lasting(&self) -> bool {
        self.lasting
    }
}

/// Local memory handed to a transport for a one-sided operation.
///
/// Holds a raw pointer: whoever builds one promises the memory stays valid (and, for
/// [`RegionMut`], unaliased) until the operation completes.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    /// Start of the memory.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

/// Writable local memory for a one-sided `get`; see [`Region`].
#[derive(Clone, Copy, Debug)]
pub struct RegionMut {
    /// Start of the memory.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
}

// SAFETY: a Region is a plain description of memory; the promise that the memory is valid comes
// from whoever constructed it, not from the thread that holds it.
unsafe impl Send for Region {}
// SAFETY: as for Region.
unsafe impl Send for RegionMut {}

/// Outcome of a non-blocking operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issued {
    /// Finished: the buffer may be reused.
    Done,
    /// Started; completion comes through [`Sink::completed`].
    Pending,
    /// A `put` started from a copy: the local buffer may be reused now, and the data lands
    /// before anything sent later on this channel to the same peer (a failure stops those
    /// too), so a notice sent that way may leave at once. Completion still comes through
    /// [`Sink::completed`].
    Ordered,
    /// No resources now (ring full, no free cell); try again after `progress`.
    WouldBlock,
}

/// How arrivals and completions come up from a transport.
pub trait Sink {
    /// A packet from `from`: its engine header (decoded by the transport, see
    /// [`Header::decode`]) and its payload, borrowed from the transport's buffer for the
    /// duration of the call.
    fn message(&mut self, from: Rank, hdr: &Header, payload: &[u8]);
    /// A `get` or `put` that returned [`Issued::Pending`] finished.
    fn completed(&mut self, op: OpId, result: Result<()>);
    /// The peer is gone (exited, killed, corrupt): every operation involving it must fail.
    fn peer_lost(&mut self, peer: Rank, why: Error);
}

impl dyn Transport + '_ {
    /// The channel's one-sided memory ([`Transport::memory`]), or the error of an operation the
    /// channel cannot do.
    pub fn one_sided(&mut self) -> Result<&mut dyn OneSided> {
        let kind = self.attr().kind.name();
        self.memory().ok_or_else(|| Error::Transport { kind, what: "no one-sided memory".into() })
    }
}

/// One-sided memory of a channel ([`Transport::memory`]): memory this process lends its peers,
/// and reads and writes of theirs. Completions of operations that answered
/// [`Issued::Pending`] come through [`Transport::progress`].
pub trait OneSided {
    /// Registers local memory for peers' `get` and `put` (as `access` says) and returns its
    /// handle, whose packed key goes to peers. One mechanism for both lifetimes: a transfer's
    /// buffer ([`Lifetime::Transfer`]; a channel may register a stand-in) and long-lived memory
    /// ([`Lifetime::Lasting`]; a channel that needs no registration for it keeps nothing, but
    /// still gives a key). The memory must stay valid until [`OneSided::deregister`].
    fn register(&mut self, region: Region, access: PeerAccess, lifetime: Lifetime) -> Result<MemHandle>;

    /// Ends a registration. `written` is the part of the region (offsets from its start) that
    /// peers wrote and the owner wants: a channel that registered a stand-in for a transfer's
    /// destination copies that part into the region before it returns.
    fn deregister(&mut self, _handle: &MemHandle, _written: Range<usize>) {}

    /// Reads `into.len` bytes at `offset` of a peer's registered memory.
    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, op: OpId) -> Result<Issued>;

    /// Writes `from.len` bytes at `offset` of a peer's registered memory.
    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, op: OpId) -> Result<Issued>;

    /// Makes every put to `peer` issued before it complete at the peer: [`Issued::Done`] when
    /// it did, or its completion comes through `progress` with `op`. Channels whose put
    /// completions already mean the data is in place keep the default.
    fn flush(&mut self, _peer: Rank, _op: OpId) -> Result<Issued> {
        Ok(Issued::Done)
    }
}

/// How a process sleeps until a peer's arrival on a channel wakes it ([`Transport::wakeup`]).
pub trait Wakeup {
    /// Prepares to sleep: from now on, senders wake this process. Returns false when something
    /// arrived already (then do not sleep); always call [`Wakeup::disarm`] afterwards.
    fn arm(&mut self) -> bool;

    /// Sleeps until a sender woke this process or `timeout` passed; only after `arm` said yes.
    fn sleep(&mut self, timeout: std::time::Duration);

    /// Ends what `arm` started.
    fn disarm(&mut self);
}

/// A channel. See the module documentation.
///
/// Implementations must not block, and must not allocate on `try_send` or `progress`.
/// They may refuse any optional operation with [`Error::Transport`].
pub trait Transport: Send {
    /// What the transport can do and what it costs.
    fn attr(&self) -> &TransportAttr;

    /// Bytes published at bootstrap so peers can reach this process.
    fn address(&self) -> Address;

    /// Called once per peer after the addresses were exchanged (and before the bootstrap's
    /// closing fence): attach, probe, or decline with a reason.
    fn add_peer(&mut self, peer: &PeerInfo, address: &[u8]) -> Reach;

    /// Called once every peer was added and every process passed a fence: release what only
    /// had to live until peers attached (e.g. unlink shared-memory names).
    fn connected(&mut self) -> Result<()> {
        Ok(())
    }

    /// Sends an active message ([`Caps::AM`]): the engine header and a payload (at most
    /// `attr().max_eager` bytes). Returns [`Issued::Done`] (the payload was copied or sent) or
    /// [`Issued::WouldBlock`]. The transport carries the header as it likes (encoded with
    /// [`Header::encode`], or in a compact form, [`Header::is_compact`]) and hands the same
    /// header to the peer's [`Sink::message`]. Active messages stay a method of their own (not an
    /// accessor as the capabilities below) because every small message passes here: one dynamic
    /// call, not two. A channel without them keeps the default, an error.
    fn try_send(&mut self, peer: Rank, _hdr: &Header, _payload: &[u8]) -> Result<Issued> {
        Err(Error::Transport {
            kind: self.attr().kind.name(),
            what: format!("no active messages (to rank {peer}): this channel only reads and writes memory"),
        })
    }

    /// Delivers up to `budget` arrivals and completions to `sink`; returns how many.
    fn progress(&mut self, budget: usize, sink: &mut dyn Sink) -> Result<usize>;

    /// What the channel observed about `peer` ([`Observe`] says which observation); `None`
    /// when it has no such observation (the default). The runtime asks; the selection decides
    /// what to make of the answer.
    fn observe(&mut self, _peer: Rank, _what: Observe) -> Option<Observation> {
        None
    }

    /// One-sided memory ([`Caps::GET`], [`Caps::PUT`]); `None` without it (the default).
    fn memory(&mut self) -> Option<&mut dyn OneSided> {
        None
    }

    /// Sleeping until an arrival ([`Caps::WAKEUP`]); `None` without it (the default).
    fn wakeup(&mut self) -> Option<&mut dyn Wakeup> {
        None
    }

    /// Checks that connected peers are alive; reports lost ones through `sink`. Called from
    /// waits that made no progress for a while, never on the hot path.
    fn check_peers(&mut self, _sink: &mut dyn Sink) {}

    /// This process is finishing cleanly; peers may tell its exit from a crash.
    fn finalize(&mut self) {}

    /// One line about this transport's state for `polyrail info` (probe results, sizes).
    fn describe(&self) -> String {
        String::new()
    }
}

/// What a process knows when it starts its channels: its settings and its place in the job.
#[derive(Clone, Copy, Debug)]
pub struct ChannelStart<'a> {
    /// The process's settings.
    pub config: &'a Config,
    /// A name unique to the job on this machine (from the process manager).
    pub job_id: &'a str,
    /// This process's rank.
    pub rank: Rank,
    /// The number of processes in the job.
    pub size: u32,
}

impl ChannelStart<'_> {
    /// [`Opened::Absent`] when the job is this process alone, for channels that only reach
    /// other processes.
    pub fn without_peers(&self) -> Option<Opened> {
        (self.size == 1).then(|| Opened::Absent("a job of one process has no peer to reach".into()))
    }
}

/// What starting a channel gave.
pub enum Opened {
    /// The channel runs in this process.
    Channel(Box<dyn Transport>),
    /// There is nothing to start here (no device, a job of one process), and why: not a
    /// failure, the job simply has no such channel.
    Absent(String),
}

/// How a channel crate starts its channel; the runtime starts every registered factory that
/// `POLYRAIL_TRANSPORTS` allows, in registration order (the order of the channel ids).
pub trait ChannelFactory: Sync {
    /// Which channel this factory starts.
    fn kind(&self) -> TransportKind;

    /// Starts the channel in this process; `Err` when starting failed (reported, and the job
    /// goes on without the channel).
    fn open(&self, start: &ChannelStart<'_>) -> Result<Opened>;

    /// The `POLYRAIL_*` variables the channel's crate declares (its own settings, read from
    /// [`Config::others`]); none by default.
    fn variables(&self) -> Vec<crate::config::VarInfo> {
        Vec::new()
    }

    /// Checks the channel's variables in `config` as `open` will read them (each value, and
    /// how they go together); the error names the variable, the value and what is accepted.
    fn check_settings(&self, _config: &Config) -> Result<()> {
        Ok(())
    }

    /// The effective value of each of the channel's variables in `config` and where it came
    /// from, for `polyrail info --config`; `given` tells which the environment set. The
    /// default says environment or default; a channel that also reads files says so.
    fn effective(&self, _config: &Config, given: &dyn Fn(&str) -> Option<String>) -> Vec<crate::config::Effective> {
        crate::config::effective_of(&self.variables(), given)
    }
}
