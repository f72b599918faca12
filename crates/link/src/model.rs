//! [`LinkModel`]: when a transfer finishes, with each link's "busy until" shared by every
//! process of a (virtual) node through a small file (emulation).

use crate::profile::{Path, Profile};
use memmap2::MmapMut;
use polyrail_core::{Error, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Magic of a node's link file: `b"PRLINK01"`.
const MAGIC: u64 = u64::from_le_bytes(*b"PRLINK01");
/// Bytes of a node's link file: magic, reserved word, one `u64` per path.
const FILE_LEN: u64 = 16 + 8 * Path::ALL.len() as u64;

/// One hop of a transfer: a path of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop {
    /// The (virtual) node whose link it is (`POLYRAIL_NODE`).
    pub node: u32,
    /// Which of its paths.
    pub path: Path,
}

/// What pacing did so far in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacingStats {
    /// Transfers the model paced.
    pub paced: u64,
    /// Of those, transfers the model made complete later than their copy ended.
    pub delayed: u64,
    /// Time added to the delayed transfers, in all.
    pub delay: Duration,
}

impl PacingStats {
    /// Transfers that were never delayed (their copy took longer than the model asked).
    pub fn undelayed(&self) -> u64 {
        self.paced - self.delayed
    }

    /// One line for reports, naming the profile; says so when pacing never delayed anything
    /// (then the times measured are this machine's, not the model's).
    pub fn summary(&self, profile: &str) -> String {
        if self.paced == 0 {
            format!("link model {profile} (emulation): no transfer paced")
        } else if self.delayed == 0 {
            format!("link model {profile} (emulation): pacing never delayed anything ({} transfers)", self.paced)
        } else {
            format!(
                "link model {profile} (emulation): {} transfers paced, {} delayed by {:.3} ms in all, {} never delayed",
                self.paced,
                self.delayed,
                self.delay.as_secs_f64() * 1e3,
                self.undelayed()
            )
        }
    }
}

/// A node's shared link words, mapped.
struct NodeLinks {
    node: u32,
    map: MmapMut,
    /// The file, held with a shared lock while this process uses it (see its drop).
    file: std::fs::File,
    path: PathBuf,
}

impl Drop for NodeLinks {
    /// The last process of the job to let go of a node's file removes it: an exclusive lock
    /// succeeds only when no other process holds its shared one. (A process that opens the name
    /// later makes a new file: the links are then idle, as a fresh model's are.)
    fn drop(&mut self) {
        use rustix::fs::{flock, FlockOperation};
        if flock(&self.file, FlockOperation::NonBlockingLockExclusive).is_err() {
            return;
        }
        // Only the file this process opened, not one made under the name since.
        let ours = rustix::fs::fstat(&self.file).ok().map(|st| (st.st_dev, st.st_ino));
        let named = std::fs::metadata(&self.path).ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        });
        if ours.is_some() && ours == named {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl NodeLinks {
    /// The "busy until" word of `path` (CLOCK_MONOTONIC nanoseconds).
    fn busy(&self, path: Path) -> &AtomicU64 {
        self.word(2 + path.index())
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!((i + 1) * 8 <= self.map.len());
        // SAFETY: the mapping is page-aligned and at least FILE_LEN bytes (checked at open), so
        // word `i` is in bounds (asserted) and 8-byte aligned; it lives as long as `self`, and
        // every process touches these bytes only through atomics.
        unsafe { &*(self.map.as_ptr().add(8 * i) as *const AtomicU64) }
    }
}

/// Instants as CLOCK_MONOTONIC nanoseconds, the clock every process of the machine shares
/// (`Instant` is that clock on Linux, but has no public conversion).
#[derive(Clone, Copy, Debug)]
struct Clock {
    base: Instant,
    base_ns: u64,
}

impl Clock {
    fn new() -> Clock {
        let base = Instant::now();
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let base_ns = (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64);
        Clock { base, base_ns }
    }

    fn ns(&self, i: Instant) -> u64 {
        match i.checked_duration_since(self.base) {
            Some(d) => self.base_ns.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64),
            None => self.base_ns.saturating_sub(self.base.duration_since(i).as_nanos().min(u64::MAX as u128) as u64),
        }
    }

    fn instant(&self, ns: u64) -> Instant {
        if ns >= self.base_ns {
            self.base.checked_add(Duration::from_nanos(ns - self.base_ns)).unwrap_or(self.base)
        } else {
            self.base.checked_sub(Duration::from_nanos(self.base_ns - ns)).unwrap_or(self.base)
        }
    }
}

/// The link model of a job (an emulation of hardware this machine does not have): a transfer
/// over hops finishes at, for each hop, max(now, link busy until) + bytes / bandwidth, the
/// latest of those plus the hops' latencies; each link's busy time is shared by all processes
/// of its node (a file per node, opened by job id and node number), so concurrent transfers
/// contend. Nothing here sleeps: callers defer completions to the time returned.
pub struct LinkModel {
    profile: Profile,
    dir: PathBuf,
    job: String,
    uid: u32,
    clock: Clock,
    nodes: Mutex<Vec<Arc<NodeLinks>>>,
    paced: AtomicU64,
    delayed: AtomicU64,
    delay_ns: AtomicU64,
}

impl std::fmt::Debug for LinkModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkModel").field("profile", &self.profile.name).field("job", &self.job).finish()
    }
}

impl LinkModel {
    /// The model of job `job` with `profile`, its node files in `/dev/shm` (named
    /// `polyrail-<uid>-<job>-link<node>`, private to the user; the last process of the job to
    /// let go of one removes it).
    pub fn new(profile: Profile, job: &str) -> Result<LinkModel> {
        Self::in_dir(profile, "/dev/shm", job)
    }

    /// As [`LinkModel::new`], the node files in `dir` (tests).
    pub fn in_dir(profile: Profile, dir: impl Into<PathBuf>, job: &str) -> Result<LinkModel> {
        if job.is_empty() || job.len() > 200 || job.bytes().any(|b| b == b'/' || b == 0) {
            return Err(Error::InvalidArgument(format!("link model: job id {job:?} cannot name a file")));
        }
        Ok(LinkModel {
            profile,
            dir: dir.into(),
            job: job.to_string(),
            uid: rustix::process::geteuid().as_raw(),
            clock: Clock::new(),
            nodes: Mutex::new(Vec::new()),
            paced: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            delay_ns: AtomicU64::new(0),
        })
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Whether the model paces anything (not the `none` profile).
    pub fn is_active(&self) -> bool {
        !self.profile.is_none()
    }

    /// The file of `node`'s links.
    fn file_of(&self, node: u32) -> PathBuf {
        self.dir.join(format!("polyrail-{}-{}-link{node}", self.uid, self.job))
    }

    /// `node`'s links, mapped on first use.
    fn node(&self, node: u32) -> Result<Arc<NodeLinks>> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = nodes.iter().find(|n| n.node == node) {
            return Ok(n.clone());
        }
        let n = Arc::new(self.open_node(node)?);
        nodes.push(n.clone());
        Ok(n)
    }

    fn open_node(&self, node: u32) -> Result<NodeLinks> {
        use rustix::fs::{Mode, OFlags};
        let path = self.file_of(node);
        let what = || format!("link model: {}", path.display());
        let io = |e: rustix::io::Errno| Error::io(what(), e.into());
        // Private to the user, never through a link someone planted.
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(io)?;
        let st = rustix::fs::fstat(&fd).map_err(io)?;
        let mode = st.st_mode as u32;
        if st.st_uid != self.uid || mode & 0o077 != 0 || mode & 0o170000 != 0o100000 {
            return Err(Error::InvalidArgument(format!(
                "{}: not a regular file private to uid {} (owner {}, mode {:o}); remove it",
                what(),
                self.uid,
                st.st_uid,
                mode
            )));
        }
        match st.st_size as u64 {
            0 => rustix::fs::ftruncate(&fd, FILE_LEN).map_err(io)?,
            FILE_LEN => {}
            n => return Err(Error::InvalidArgument(format!("{}: {n} bytes, not a link file", what()))),
        }
        // Shared while used: the last process to let go removes the file (NodeLinks's drop).
        rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockShared).map_err(io)?;
        let file = std::fs::File::from(fd);
        // SAFETY: a file of this user, FILE_LEN bytes long, which only link models change (with
        // atomics, never by shrinking it); the mapping is shared so that they see each other.
        let map = unsafe { memmap2::MmapOptions::new().len(FILE_LEN as usize).map_mut(&file) }
            .map_err(|e| Error::io(what(), e))?;
        // Relaxed: the magic only tells a link file from another file; the words after it are
        // zero (never busy) until a reservation moves them, which needs no order with the magic.
        // SAFETY: the mapping is FILE_LEN (at least 8) bytes, page-aligned, so its first word is
        // an aligned u64 that lives as long as `map`; other processes change it only atomically.
        let magic = unsafe { &*(map.as_ptr() as *const AtomicU64) };
        match magic.compare_exchange(0, MAGIC, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) | Err(MAGIC) => {}
            // Not ours to remove either: no NodeLinks (whose drop may remove the file) is made.
            Err(_) => return Err(Error::InvalidArgument(format!("{}: not a link file", what()))),
        }
        Ok(NodeLinks { node, map, file, path: path.clone() })
    }

    /// Reserves `bytes` on each of `hops` from `now`; when the transfer finishes. Without a
    /// model, `now`. Each hop's link is busy from max(now, busy until) for bytes / bandwidth;
    /// the transfer finishes when the last hop is through, plus every hop's latency.
    pub fn reserve(&self, hops: &[Hop], bytes: usize, now: Instant) -> Result<Instant> {
        let now_ns = self.clock.ns(now);
        let mut end = now_ns;
        let mut latency = Duration::ZERO;
        for hop in hops {
            let Some(link) = self.profile.link(hop.path) else { continue };
            let node = self.node(hop.node)?;
            let occupancy = link.occupancy_ns(bytes);
            let busy = node.busy(hop.path);
            // Relaxed: the word publishes nothing but itself. Read-modify-writes of one location
            // are totally ordered whatever their ordering, so each reservation starts where the
            // one before it in that order ended, and no two overlap; no other memory is read
            // or written on the strength of the value.
            let mut seen = busy.load(Ordering::Relaxed);
            let hop_end = loop {
                let done = seen.max(now_ns).saturating_add(occupancy);
                match busy.compare_exchange_weak(seen, done, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break done,
                    Err(v) => seen = v,
                }
            };
            end = end.max(hop_end);
            latency += link.latency;
        }
        let latency_ns = latency.as_nanos().min(u64::MAX as u128) as u64;
        Ok(self.clock.instant(end.saturating_add(latency_ns)))
    }

    /// Paces a transfer over `hops` that started at `start` and whose copy ended at `copied`:
    /// when it completes (never before `copied`), counted in [`LinkModel::stats`].
    pub fn complete(&self, hops: &[Hop], bytes: usize, start: Instant, copied: Instant) -> Result<Instant> {
        if !self.is_active() || hops.is_empty() {
            return Ok(copied);
        }
        let at = self.reserve(hops, bytes, start)?;
        self.paced.fetch_add(1, Ordering::Relaxed);
        if at > copied {
            self.delayed.fetch_add(1, Ordering::Relaxed);
            let d = (at - copied).as_nanos().min(u64::MAX as u128) as u64;
            self.delay_ns.fetch_add(d, Ordering::Relaxed);
            Ok(at)
        } else {
            Ok(copied)
        }
    }

    /// Until when `path` of `node` is busy, shared by the node's processes (`None` without a
    /// model).
    pub fn busy_until(&self, node: u32, path: Path) -> Result<Option<Instant>> {
        if !self.is_active() {
            return Ok(None);
        }
        // Relaxed: a report of one word, ordered with nothing else.
        let ns = self.node(node)?.busy(path).load(Ordering::Relaxed);
        Ok(Some(self.clock.instant(ns)))
    }

    /// What pacing did so far in this process.
    pub fn stats(&self) -> PacingStats {
        // Relaxed: counters for a report, read after the transfers they count completed.
        PacingStats {
            paced: self.paced.load(Ordering::Relaxed),
            delayed: self.delayed.load(Ordering::Relaxed),
            delay: Duration::from_nanos(self.delay_ns.load(Ordering::Relaxed)),
        }
    }

    /// [`PacingStats::summary`] of this model.
    pub fn summary(&self) -> String {
        self.stats().summary(&self.profile.name)
    }

    /// Removes this job's node files from the model's directory now, whoever still uses them
    /// (tests; a job's processes remove them as they finish).
    pub fn remove_files(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return };
        let prefix = format!("polyrail-{}-{}-link", self.uid, self.job);
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Where a process's memory is: the host, or device `k` of its node (`POLYRAIL_SCIF_NODE`: 0
/// the host, k device k; set by whoever starts the provider).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Domain {
    /// Host memory.
    #[default]
    Host,
    /// Memory of device `k` (k ≥ 1) of the node.
    Device(u16),
}

impl Domain {
    /// The domain of SCIF node `node` (0 the host).
    pub fn from_scif_node(node: u16) -> Domain {
        if node == 0 {
            Domain::Host
        } else {
            Domain::Device(node)
        }
    }

    /// The SCIF node number (0 the host).
    pub fn scif_node(self) -> u16 {
        match self {
            Domain::Host => 0,
            Domain::Device(k) => k,
        }
    }

    /// Whether the memory is a device's.
    pub fn is_device(self) -> bool {
        matches!(self, Domain::Device(_))
    }
}

/// The hops of an RDMA transfer whose bytes leave memory in `from` on node `from_node` and land
/// in `to` on `to_node`: the adapter reading device memory, the network out of one node and into
/// the other, the adapter writing device memory. Host memory adds no hop.
pub fn rdma_hops(from_node: u32, from: Domain, to_node: u32, to: Domain) -> Vec<Hop> {
    let mut hops = Vec::with_capacity(4);
    if from.is_device() {
        hops.push(Hop { node: from_node, path: Path::AdapterReadsDevice });
    }
    hops.push(Hop { node: from_node, path: Path::NetOut });
    hops.push(Hop { node: to_node, path: Path::NetIn });
    if to.is_device() {
        hops.push(Hop { node: to_node, path: Path::AdapterWritesDevice });
    }
    hops
}

/// The hops of a SCIF transfer on node `node` from SCIF node `from` to SCIF node `to`: PCIe one
/// way or the other; device to device crosses to the host and back; within one SCIF node, none.
pub fn scif_hops(node: u32, from: u16, to: u16) -> Vec<Hop> {
    let hop = |path| Hop { node, path };
    match (from, to) {
        (a, b) if a == b => Vec::new(),
        (0, _) => vec![hop(Path::HostToDevice)],
        (_, 0) => vec![hop(Path::DeviceToHost)],
        _ => vec![hop(Path::DeviceToHost), hop(Path::HostToDevice)],
    }
}
