//! [`CmaTransport`]: kernel single copy between processes of one machine with
//! `process_vm_readv` / `process_vm_writev` (Cross Memory Attach).
//!
//! CMA fails at run time when the kernel forbids one process to read another's memory: Yama
//! `ptrace_scope >= 1` (we call `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)` to allow any process
//! of ours, as UCX does), seccomp filters in containers, or a missing `CAP_SYS_PTRACE`. So
//! `add_peer` does a real probe: it reads a word with a known value from the peer, and declines
//! with the kernel's reason if that fails.
//!
//! Memory registered with a memory file (`Context::alloc_registered`, see
//! [`polyrail_core::Lifetime::Lasting`]) is copied without the kernel: its keys also name the file,
//! which a peer opens once as `/proc/<pid>/fd/<fd>` (allowed where reading the owner's memory
//! is), maps, and copies with plain loads and stores. CMA pins every page of every transfer,
//! which makes it cost about twice a user-space copy per byte; a mapped file costs that once.
//! `add_peer` probes that too, through a memory file holding the probe word, so that routes
//! know per peer whether to count on it ([`Observe::MapsRegistered`]).

use std::collections::BTreeMap;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use polyrail_core::observe::{Observation, Observe};
use polyrail_core::{
    Address, AnonMemory, Caps, Cost, Error, Issued, Lifetime, MemHandle, OneSided, OpId, PeerAccess, PeerInfo, Rank,
    Reach, Region, RegionMut, RemoteKey, Result, SharedFile, Sink, Transport, TransportAttr,
};

use crate::key::{FileRef, PidKey};
use crate::segment::Mapping;

/// Largest transfer handed to one system call (the kernel may also stop earlier; we loop).
const CHUNK: usize = 1 << 30;
/// Magic at the start of a CMA address: `b"PRCM"`.
const ADDR_MAGIC: u32 = u32::from_le_bytes(*b"PRCM");
/// Bytes of a CMA address (see `address`).
const ADDR_LEN: usize = 36;
/// The probe file descriptor of an address without one.
const NO_FILE: u32 = u32::MAX;
/// Model default: cost of the system call and page pinning for a small transfer (ns).
const RMA_LATENCY_NS: f64 = 1200.0;
/// Model default: CPU time of the issuing side per operation (ns).
const RMA_OVERHEAD_NS: f64 = 300.0;
/// Model default: single-copy bandwidth (bytes/s).
const RMA_BANDWIDTH: f64 = 10e9;
/// Split copies from here: between two cores sharing an L3, from 32 KiB the two halves copied at
/// once beat one copy (osu_latency, osu_bw).
const SPLIT_FROM: usize = 32 << 10;
/// From here a message from registered memory that the peer maps goes by single copy (the
/// receiver's memcpy from the mapping) rather than through send cells (osu_latency here with
/// `--registered`: 8 KiB 1.3-1.8 µs against 2.2 eager, 16 KiB 1.6-2.2 against 3.9; at 4 KiB
/// 1.1-1.4 against 1.2-1.4, no gain).
const MAPPED_FROM: usize = 8 << 10;
/// Most memory files of peers kept mapped at once (least recently used unmapped first).
const MAX_PEER_FILES: usize = 16;
/// Most bytes of peers' memory files kept mapped at once (a file a peer freed stays in memory
/// while it is mapped here; the one in use is kept even when larger).
const MAX_PEER_FILE_BYTES: usize = 1 << 30;

/// What the probe of one peer found.
#[derive(Clone, Debug)]
struct CmaPeer {
    pid: u32,
    /// `Ok` when the probe passed, else why not.
    probe: std::result::Result<(), String>,
    /// Why the peer's memory files cannot be mapped, once that was found (then its keys with a
    /// file go through CMA); only for peers whose CMA probe passed.
    files_refused: Option<String>,
    /// Mappings of its files that failed in a row for reasons that may pass (see
    /// [`MapRefusal`]); at [`MAX_MAP_FAILURES`] its files are refused for good.
    map_failures: u32,
}

/// Failed mappings of one peer's files in a row, each for a reason that may pass, after which
/// its files are copied with CMA for good.
const MAX_MAP_FAILURES: u32 = 16;

/// Why a peer's memory file was not mapped, and whether that lasts (a permission, a file
/// without seals: the peer's next files meet the same) or may pass (a limit on descriptors or
/// mappings, a file the peer closed meanwhile).
struct MapRefusal {
    why: String,
    lasting: bool,
}

impl MapRefusal {
    fn passing(why: String) -> MapRefusal {
        MapRefusal { why, lasting: false }
    }

    fn lasting(why: String) -> MapRefusal {
        MapRefusal { why, lasting: true }
    }
}

/// Memory registered here with a memory file, which peers may map.
#[derive(Clone, Copy, Debug)]
struct OwnFile {
    addr: u64,
    len: u64,
    file: SharedFile,
}

/// A peer's memory file, mapped here.
#[derive(Debug)]
struct PeerFile {
    pid: u32,
    /// The peer's descriptor of the file and the file's inode number.
    file: FileRef,
    map: Mapping,
    /// Value of `CmaTransport::uses` at the last copy (for least-recently-used eviction).
    last_use: u64,
}

/// Kernel single copy to the other processes of this machine (`cma`): one-sided `get`/`put`
/// that finish before they return. No active messages.
#[derive(Debug)]
pub struct CmaTransport {
    attr: TransportAttr,
    host: String,
    pid: u32,
    /// The word peers read to probe us; holds `magic`. Boxed so its address is stable.
    probe: Box<u64>,
    magic: u64,
    /// A memory file that also holds `magic` at offset 0, for peers to probe mapping ours;
    /// `None` where memory files are missing.
    probe_file: Option<AnonMemory>,
    /// Probe results by rank.
    peers: BTreeMap<Rank, CmaPeer>,
    /// Registered memory with a memory file (a [`Lifetime::Lasting`] registration).
    own_files: Vec<OwnFile>,
    /// Peers' memory files mapped here.
    peer_files: Vec<PeerFile>,
    /// Copies through peers' files so far (the clock of `PeerFile::last_use`).
    uses: u64,
}

impl Default for CmaTransport {
    fn default() -> Self {
        Self::new()
    }
}

/// The text of an OS error without the " (os error N)" suffix.
fn errno_text(err: &io::Error) -> String {
    let s = err.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

impl CmaTransport {
    /// Allows any process to attach to this one (Yama), and sets up the probe word.
    pub fn new() -> CmaTransport {
        // Where Yama forbids it anyway, the probes tell that CMA does not work.
        polyrail_core::allow_peer_reads();
        let pid = std::process::id();
        let mut probe = Box::new(0u64);
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let magic = splitmix(t ^ (pid as u64) << 32 ^ (&*probe as *const u64 as u64)) | 1;
        // SAFETY: `probe` is a live, aligned, exclusively owned u64; volatile so the store stays
        // even though only other processes read it.
        unsafe { std::ptr::write_volatile(&mut *probe, magic) };
        let probe_file = AnonMemory::shared(8, "the cma probe word").ok();
        if let Some(m) = &probe_file {
            // SAFETY: the mapping holds at least 8 bytes, page aligned, and is ours alone until
            // its file is published by `address`.
            unsafe { std::ptr::write_volatile(m.ptr().cast::<u64>(), magic) };
        }
        let attr = TransportAttr {
            kind: crate::CMA,
            max_inline: 0,
            max_eager: 0,
            max_rma: isize::MAX as usize,
            caps: Caps::GET
                | Caps::PUT
                | Caps::RMA_INLINE_COMPLETION
                | Caps::NODE_LOCAL
                | Caps::DOMAIN_LOCAL
                | Caps::CPU_COPY,
            am_cost: Cost { latency_ns: f64::INFINITY, overhead_ns: 0.0, bandwidth: 1.0 },
            rma_cost: Cost { latency_ns: RMA_LATENCY_NS, overhead_ns: RMA_OVERHEAD_NS, bandwidth: RMA_BANDWIDTH },
            split_from: Some(SPLIT_FROM),
            mapped_from: Some(MAPPED_FROM),
            rndv_from: Vec::new(),
        };
        CmaTransport {
            attr,
            host: polyrail_core::host_identity(),
            pid,
            probe,
            magic,
            probe_file,
            peers: BTreeMap::new(),
            own_files: Vec::new(),
            peer_files: Vec::new(),
            uses: 0,
        }
    }

    /// Sets where one-sided copies start by class ([`TransportAttr::rndv_from`]; from
    /// `POLYRAIL_CMA_THRESHOLD` or a tuning file, [`crate::CmaSettings::rndv_from`]).
    pub fn with_rndv_from(mut self, rndv_from: Vec<polyrail_core::RndvFrom>) -> CmaTransport {
        self.attr.rndv_from = rndv_from;
        self
    }

    /// Sets the host identity compared with [`PeerInfo::host`] (default:
    /// [`polyrail_core::host_identity`]).
    pub fn with_host(mut self, host: impl Into<String>) -> CmaTransport {
        self.host = host.into();
        self
    }

    /// Pid, probe word address, magic, and the probe's memory file (if the peer has one).
    pub(crate) fn decode_address(address: &[u8]) -> std::result::Result<(u32, u64, u64, Option<FileRef>), String> {
        if address.len() != ADDR_LEN || address[..4] != ADDR_MAGIC.to_le_bytes() {
            return Err(format!("not a polyrail cma address ({} bytes)", address.len()));
        }
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&address[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let u32_at = |i: usize| u32::from_le_bytes([address[i], address[i + 1], address[i + 2], address[i + 3]]);
        let file = Some(u32_at(24)).filter(|&fd| fd != NO_FILE).map(|fd| FileRef { fd, inode: u64_at(28), offset: 0 });
        Ok((u32_at(4), u64_at(8), u64_at(16), file))
    }

    /// Maps the peer's probe file and reads the magic through it; `Err` says why its memory
    /// files cannot be mapped here.
    fn probe_file(pid: u32, file: Option<FileRef>, magic: u64) -> std::result::Result<(), String> {
        let file = file.ok_or_else(|| format!("pid {pid} has no memory files"))?;
        let map = map_peer_file(pid, &file).map_err(|r| r.why)?;
        // SAFETY: the mapping is at least one page (a file of 8 bytes maps a page), aligned,
        // and only read here.
        let got = unsafe { std::ptr::read_volatile(map.base().as_ptr().cast::<u64>()) };
        if got != magic {
            return Err(format!("the probe file of pid {pid} holds a wrong value"));
        }
        Ok(())
    }

    /// Reads the peer's probe word; `Err` is the reason shown by `polyrail info`.
    fn probe(pid: u32, addr: u64, magic: u64) -> std::result::Result<(), String> {
        let mut got = 0u64;
        let local = libc::iovec { iov_base: (&mut got as *mut u64).cast(), iov_len: 8 };
        let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: 8 };
        // SAFETY: `local` describes our 8-byte `got`, valid for writes; the remote range is only
        // accessed by the kernel, which checks it.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            let why = match err.raw_os_error() {
                Some(libc::ESRCH) => "the process is gone".to_string(),
                Some(libc::EFAULT) => "the probe address is not mapped there".to_string(),
                _ => "Yama ptrace_scope, seccomp or missing CAP_SYS_PTRACE".to_string(),
            };
            return Err(format!("process_vm_readv from pid {pid} refused: {} ({why})", errno_text(&err)));
        }
        if n != 8 || got != magic {
            return Err(format!("probe read wrong value from pid {pid}"));
        }
        Ok(())
    }

    /// The peer's pid when its probe passed.
    fn peer_pid(&self, peer: Rank) -> Result<u32> {
        match self.peers.get(&peer) {
            Some(CmaPeer { pid, probe: Ok(()), .. }) => Ok(*pid),
            Some(CmaPeer { probe: Err(why), .. }) => {
                Err(Error::Transport { kind: "cma", what: format!("rank {peer} is not reachable: {why}") })
            }
            _ => Err(Error::Transport { kind: "cma", what: format!("rank {peer} was not added") }),
        }
    }

    /// Checks `key` against `peer` and `[offset, offset + len)`; returns the pid, the remote
    /// start address, and where the range is in memory mapped here when the key names a memory
    /// file that could be mapped.
    fn check_key(
        &mut self,
        peer: Rank,
        key: &RemoteKey,
        offset: usize,
        len: usize,
    ) -> Result<(u32, u64, Option<*mut u8>)> {
        let pid = self.peer_pid(peer)?;
        let bad =
            |what: String| Error::Transport { kind: "cma", what: format!("bad remote key from rank {peer}: {what}") };
        let k = PidKey::decode(key).map_err(bad)?;
        if k.pid != pid {
            return Err(bad(format!("it names pid {}, but rank {peer} is pid {pid}", k.pid)));
        }
        let remote = k.range(offset, len).map_err(bad)?;
        let Some(file) = k.file else { return Ok((pid, remote, None)) };
        let Some(i) = self.peer_file(peer, pid, &file) else { return Ok((pid, remote, None)) };
        let m = &mut self.peer_files[i];
        let start =
            file.offset.checked_add(offset as u64).filter(|s| s.saturating_add(len as u64) <= m.map.len() as u64);
        let Some(start) = start else {
            return Err(bad(format!(
                "bytes {offset}..+{len} at file offset {} are outside its {}-byte file",
                file.offset,
                m.map.len()
            )));
        };
        self.uses += 1;
        m.last_use = self.uses;
        // SAFETY: start + len <= the mapping's length (checked above), so the pointer is inside it.
        Ok((pid, remote, Some(unsafe { m.map.base().as_ptr().add(start as usize) })))
    }

    /// Index in `peer_files` of the peer's memory file, mapped now if it was not; `None` when
    /// the peer's files cannot be mapped (then CMA copies).
    fn peer_file(&mut self, peer: Rank, pid: u32, file: &FileRef) -> Option<usize> {
        if let Some(i) = self.peer_files.iter().position(|m| m.pid == pid && m.file.inode == file.inode) {
            return Some(i);
        }
        let p = self.peers.get_mut(&peer)?;
        if p.files_refused.is_some() {
            return None;
        }
        match map_peer_file(pid, file) {
            Ok(map) => {
                p.map_failures = 0;
                self.peer_files.push(PeerFile { pid, file: *file, map, last_use: self.uses });
                self.evict();
                Some(self.peer_files.len() - 1)
            }
            Err(MapRefusal { why, lasting }) => {
                p.map_failures += 1;
                if lasting || p.map_failures >= MAX_MAP_FAILURES {
                    tracing::info!("cma: the registered memory of rank {peer} is copied with CMA: {why}");
                    p.files_refused = Some(why);
                } else {
                    tracing::debug!("cma: a memory file of rank {peer} is copied with CMA this time: {why}");
                }
                None
            }
        }
    }

    /// Unmaps least recently used peer files (never the newest) while over the limits.
    fn evict(&mut self) {
        loop {
            let bytes: usize = self.peer_files.iter().map(|m| m.map.len()).sum();
            if self.peer_files.len() <= MAX_PEER_FILES && bytes <= MAX_PEER_FILE_BYTES {
                return;
            }
            // Among all but the last (the newest, in use now, kept even when it alone is over
            // the limit): the list shrinks with each removal.
            let newest = self.peer_files.len() - 1;
            let oldest = (0..newest).min_by_key(|&i| self.peer_files[i].last_use);
            let Some(i) = oldest else { return };
            // `remove`, not `swap_remove`: the newest stays last.
            self.peer_files.remove(i);
        }
    }
}

/// Opens a peer's memory file through `/proc/<pid>/fd/<fd>`, checks that it is the file the
/// key names and sealed against shrinking (so no access can fault past its end), and maps it.
fn map_peer_file(pid: u32, file: &FileRef) -> std::result::Result<Mapping, MapRefusal> {
    let path = format!("/proc/{pid}/fd/{}", file.fd);
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|e| MapRefusal {
        why: format!("opening {path}: {e}"),
        lasting: e.kind() == std::io::ErrorKind::PermissionDenied,
    })?;
    let meta = f.metadata().map_err(|e| MapRefusal::passing(format!("fstat of {path}: {e}")))?;
    if meta.ino() != file.inode {
        let why = format!("{path} is inode {}, not the registered file (inode {})", meta.ino(), file.inode);
        return Err(MapRefusal::passing(why));
    }
    // SAFETY: F_GET_SEALS only reads the seals of an open descriptor.
    let seals = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(MapRefusal::lasting(format!("{path} is not a memory file sealed against shrinking")));
    }
    let fd = OwnedFd::from(f);
    Mapping::map_lazily(&fd, meta.len() as usize).map_err(|e| MapRefusal::passing(format!("mapping {path}: {e}")))
}

/// Moves `len` bytes between `local` and `remote` in process `pid`, looping over partial
/// transfers. `write` selects `process_vm_writev`.
fn transfer(peer: Rank, pid: u32, local: *mut u8, remote: u64, len: usize, write: bool) -> Result<()> {
    let name = if write { "process_vm_writev" } else { "process_vm_readv" };
    let mut done = 0usize;
    while done < len {
        let chunk = (len - done).min(CHUNK);
        // SAFETY: the caller's Region promises `local..local + len` is valid (and writable for a
        // read); done + chunk <= len.
        let l = libc::iovec { iov_base: unsafe { local.add(done) }.cast(), iov_len: chunk };
        let r = libc::iovec { iov_base: (remote + done as u64) as usize as *mut libc::c_void, iov_len: chunk };
        // SAFETY: `l` is valid local memory (see above); the kernel checks the remote range.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid as libc::pid_t, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0)
            }
        };
        if n <= 0 {
            let err = if n < 0 { io::Error::last_os_error() } else { io::Error::other("no progress") };
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::Transport {
                kind: "cma",
                what: format!(
                    "{name} of {len} bytes with rank {peer} (pid {pid}) failed after {done} bytes: {} (errno {})",
                    errno_text(&err),
                    err.raw_os_error().unwrap_or(0)
                ),
            });
        }
        done += n as usize;
    }
    Ok(())
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Transport for CmaTransport {
    fn attr(&self) -> &TransportAttr {
        &self.attr
    }

    /// `"PRCM"`, pid u32, probe word address u64, magic u64, probe file descriptor u32
    /// (`u32::MAX`: none) and inode u64 (little endian).
    fn address(&self) -> Address {
        let file = self.probe_file.as_ref().and_then(AnonMemory::file);
        let mut a = Vec::with_capacity(ADDR_LEN);
        a.extend_from_slice(&ADDR_MAGIC.to_le_bytes());
        a.extend_from_slice(&self.pid.to_le_bytes());
        a.extend_from_slice(&(&*self.probe as *const u64 as u64).to_le_bytes());
        a.extend_from_slice(&self.magic.to_le_bytes());
        a.extend_from_slice(&file.map_or(NO_FILE, |f| f.fd as u32).to_le_bytes());
        a.extend_from_slice(&file.map_or(0, |f| f.inode).to_le_bytes());
        a
    }

    /// Every peer has probed us: the probe word's memory file has done its work (a descriptor
    /// and a page less for the rest of the job).
    fn connected(&mut self) -> Result<()> {
        self.probe_file = None;
        Ok(())
    }

    fn add_peer(&mut self, peer: &PeerInfo, address: &[u8]) -> Reach {
        let decoded = if peer.host != self.host {
            Err(format!("different host ({} here, {} there)", self.host, peer.host))
        } else {
            Self::decode_address(address)
        };
        // The memory files are probed only where CMA works.
        let (pid, probe, files_refused) = match decoded {
            Ok((pid, addr, magic, file)) => {
                let probe = Self::probe(pid, addr, magic);
                let refused = probe.as_ref().ok().and_then(|()| Self::probe_file(pid, file, magic).err());
                (pid, probe, refused)
            }
            Err(why) => (peer.pid, Err(why), None),
        };
        self.peers.insert(
            peer.rank,
            CmaPeer { pid, probe: probe.clone(), files_refused: files_refused.clone(), map_failures: 0 },
        );
        match (probe, files_refused) {
            (Ok(()), None) => Reach::Yes(format!(
                "process_vm_readv probe of pid {pid} passed; its memory files map here (registered memory without the kernel)"
            )),
            (Ok(()), Some(why)) => Reach::Yes(format!(
                "process_vm_readv probe of pid {pid} passed; its registered memory is copied with CMA: {why}"
            )),
            (Err(why), _) => Reach::No(why),
        }
    }

    fn observe(&mut self, peer: Rank, what: Observe) -> Option<Observation> {
        let maps = |p: &CmaPeer| p.probe.is_ok() && p.files_refused.is_none();
        match what {
            Observe::MapsRegistered => Some(Observation::MapsRegistered(self.peers.get(&peer).is_some_and(maps))),
            _ => None,
        }
    }

    fn progress(&mut self, _budget: usize, _sink: &mut dyn Sink) -> Result<usize> {
        Ok(0)
    }

    // The copies through a peer's mapped file are ordered against the owner's own use of the
    // memory by the engine's messages about it (RTS, CTS, FIN through the shm ring, whose slots
    // are published with Release and read with Acquire), as a CMA copy is.

    /// Unmaps the files that their owners closed (freed registered memory, or the process
    /// ended), so that their memory is not kept alive here.
    fn check_peers(&mut self, _sink: &mut dyn Sink) {
        self.peer_files.retain(|m| {
            let path = format!("/proc/{}/fd/{}", m.pid, m.file.fd);
            std::fs::metadata(path).is_ok_and(|meta| meta.ino() == m.file.inode)
        });
    }

    fn describe(&self) -> String {
        let failed: Vec<String> = self
            .peers
            .iter()
            .filter_map(|(r, p)| p.probe.as_ref().err().map(|why| format!("rank {r}: {why}")))
            .collect();
        let probes = if failed.is_empty() {
            format!("process_vm_readv probes passed for all {} peers", self.peers.len())
        } else {
            format!("probes failed for {} of {} peers: {}", failed.len(), self.peers.len(), failed.join("; "))
        };
        let refused: Vec<String> = self
            .peers
            .iter()
            .filter_map(|(r, p)| p.files_refused.as_ref().map(|why| format!("rank {r}: {why}")))
            .collect();
        let files = format!("{} memory files of peers mapped", self.peer_files.len());
        if refused.is_empty() {
            format!("{probes}; {files}")
        } else {
            format!("{probes}; {files}; registered memory copied with CMA for {}", refused.join("; "))
        }
    }

    fn memory(&mut self) -> Option<&mut dyn OneSided> {
        Some(self)
    }
}

impl OneSided for CmaTransport {
    /// Nothing is pinned: a key is the process id and the address (and, inside memory with a
    /// memory file, where it lies in that file, for peers that map it).
    fn register(&mut self, region: Region, _access: PeerAccess, lifetime: Lifetime) -> Result<MemHandle> {
        let (addr, len) = (region.ptr as u64, region.len as u64);
        if let Lifetime::Lasting { file: Some(file) } = lifetime {
            self.own_files.push(OwnFile { addr, len, file });
        }
        let file = self.own_files.iter().find(|f| addr >= f.addr && addr + len <= f.addr + f.len).map(|f| FileRef {
            fd: f.file.fd as u32,
            inode: f.file.inode,
            offset: addr - f.addr,
        });
        Ok(MemHandle::new(PidKey { pid: self.pid, addr, len, file }.encode(), &lifetime))
    }

    fn deregister(&mut self, handle: &MemHandle, _written: Range<usize>) {
        let Ok(k) = PidKey::decode(handle.key()) else { return };
        if handle.is_lasting() {
            self.own_files.retain(|f| f.addr != k.addr || f.len != k.len);
        }
    }

    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, _op: OpId) -> Result<Issued> {
        match self.check_key(peer, key, offset, into.len)? {
            // SAFETY: `src..src + len` is inside the peer's mapped file (check_key); `into` is
            // valid for writes (the Region's promise) and private, so the two cannot overlap.
            (_, _, Some(src)) => unsafe { std::ptr::copy_nonoverlapping(src, into.ptr, into.len) },
            (pid, remote, None) => transfer(peer, pid, into.ptr, remote, into.len, false)?,
        }
        Ok(Issued::Done)
    }

    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, _op: OpId) -> Result<Issued> {
        match self.check_key(peer, key, offset, from.len)? {
            // SAFETY: as in `get`, with the roles swapped: `dst..dst + len` is inside the mapped
            // file, `from` is valid for reads.
            (_, _, Some(dst)) => unsafe { std::ptr::copy_nonoverlapping(from.ptr, dst, from.len) },
            // process_vm_writev only reads the local iovec: the cast to *mut does not write.
            (pid, remote, None) => transfer(peer, pid, from.ptr as *mut u8, remote, from.len, true)?,
        }
        Ok(Issued::Done)
    }
}
