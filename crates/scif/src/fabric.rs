//! [`Fabric`]: the software SCIF provider of one process — which node it is, the job directory
//! where ports are named, and the DMA engine.

use crate::dma::{DmaMode, DmaStats, Engine, Pacer, Unpaced};
use crate::endpoint::Endpoint;
use crate::error::{Result, ScifError};
use rustix::fs::FlockOperation;
use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The first port `bind(0)` picks.
pub const EPHEMERAL_PORT_FIRST: u16 = 1088;
/// Ports below this one need privilege.
pub const PRIVILEGED_PORT_LIMIT: u16 = 1024;
/// The provider's name in reports.
pub const PROVIDER: &str = "soft-scif";
/// Longest Unix socket path (`sun_path` holds 108 bytes with its terminating zero).
const SUN_PATH_MAX: usize = 107;

/// How to start a [`Fabric`].
#[derive(Clone)]
pub struct FabricConfig {
    /// Directory under which the job's directory is made (`$XDG_RUNTIME_DIR`, `/tmp`, a test's
    /// temporary directory).
    pub base: PathBuf,
    /// The job's id: processes of one job meet in one directory, other jobs never.
    pub job: String,
    /// The physical node (`POLYRAIL_NODE`): SCIF connects only within it.
    pub physical_node: u32,
    /// This process's SCIF node: 0 the host, k device k (`POLYRAIL_SCIF_NODE`).
    pub node: u16,
    /// How many SCIF nodes the physical node has, host included (`POLYRAIL_SCIF_NODES`).
    pub nodes: u16,
    /// In which order the DMA engine runs RMAs.
    pub dma: DmaMode,
    /// When transfers complete (the link model's hook).
    pub pacer: Arc<dyn Pacer>,
    /// Whether ports below 1024 may be bound (by default, when the process runs as root).
    pub privileged: bool,
}

impl std::fmt::Debug for FabricConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricConfig")
            .field("base", &self.base)
            .field("job", &self.job)
            .field("physical_node", &self.physical_node)
            .field("node", &self.node)
            .field("nodes", &self.nodes)
            .field("dma", &self.dma)
            .field("privileged", &self.privileged)
            .finish_non_exhaustive()
    }
}

impl FabricConfig {
    /// Node `node` of `nodes` in job `job`, meeting under `base`; in-order DMA, no link model.
    pub fn new(base: impl Into<PathBuf>, job: &str, node: u16, nodes: u16) -> FabricConfig {
        FabricConfig {
            base: base.into(),
            job: job.to_string(),
            physical_node: 0,
            node,
            nodes,
            dma: DmaMode::InOrder,
            pacer: Arc::new(Unpaced),
            privileged: rustix::process::geteuid().is_root(),
        }
    }

    /// For job `job`, from the environment: `POLYRAIL_NODE` (physical node, default 0),
    /// `POLYRAIL_SCIF_NODE` (SCIF node, default `POLYRAIL_DOMAIN`, else 0: the host),
    /// `POLYRAIL_SCIF_NODES` (default `POLYRAIL_DOMAINS`, else one more than the node),
    /// `POLYRAIL_SCIF_DIR`, else `$XDG_RUNTIME_DIR`, else `/tmp`.
    pub fn from_env(job: &str) -> Result<FabricConfig> {
        fn var<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
            match std::env::var(name) {
                Err(_) => Ok(None),
                Ok(v) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| ScifError::Einval(format!("{name}={v:?} is not a number in range"))),
            }
        }
        let base = ["POLYRAIL_SCIF_DIR", "XDG_RUNTIME_DIR"]
            .iter()
            .find_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()))
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        let node = var::<u16>("POLYRAIL_SCIF_NODE")?.or(var::<u16>("POLYRAIL_DOMAIN")?).unwrap_or(0);
        let nodes =
            var::<u16>("POLYRAIL_SCIF_NODES")?.or(var::<u16>("POLYRAIL_DOMAINS")?).unwrap_or(node.saturating_add(1));
        let mut cfg = FabricConfig::new(base, job, node, nodes);
        cfg.physical_node = var("POLYRAIL_NODE")?.unwrap_or(0);
        Ok(cfg)
    }

    /// The same with DMA mode `dma`.
    pub fn dma(mut self, dma: DmaMode) -> FabricConfig {
        self.dma = dma;
        self
    }

    /// The same with pacer `pacer`.
    pub fn pacer(mut self, pacer: Arc<dyn Pacer>) -> FabricConfig {
        self.pacer = pacer;
        self
    }
}

/// The software SCIF provider of this process: an emulation, not a SCIF driver. Endpoints are
/// Unix sockets named in a directory of the job; windows are memory files passed to the peer,
/// which maps them; the DMA engine is a thread of this process. Endpoints keep it alive; when
/// the last one and the fabric are dropped, the engine stops and the job directory is swept.
#[derive(Clone, Debug)]
pub struct Fabric {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub node: u16,
    pub nodes: u16,
    pub physical_node: u32,
    pub privileged: bool,
    pub dir: PathBuf,
    pub engine: Engine,
    /// Whether peers may read this process's ordinary memory (windows registered in place).
    pub in_place: bool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fabric(node {} of {}, {})", self.node, self.nodes, self.dir.display())
    }
}

/// A name for `job` safe in a path, short, and distinct for distinct jobs.
fn job_component(job: &str) -> String {
    let plain =
        job.len() <= 24 && !job.is_empty() && job.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
    if plain {
        return job.to_string();
    }
    // FNV-1a: a job id that is long or has odd bytes gets its hash.
    let h = job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("h{h:016x}")
}

impl Fabric {
    /// Starts the provider: makes (or joins) the job's directory, private to this user, and
    /// starts the DMA engine. `EINVAL` for a node not below `nodes` or a directory path too long
    /// for a socket name.
    pub fn new(cfg: FabricConfig) -> Result<Fabric> {
        if cfg.node >= cfg.nodes {
            return Err(ScifError::Einval(format!("SCIF node {} is not below the node count {}", cfg.node, cfg.nodes)));
        }
        let uid = rustix::process::getuid().as_raw();
        let dir = cfg.base.join(format!("polyrail-scif.{uid}.{}.{}", job_component(&cfg.job), cfg.physical_node));
        if dir.as_os_str().len() + "/n65535.p65535.lock".len() > SUN_PATH_MAX {
            return Err(ScifError::Einval(format!(
                "{} is too long a directory for socket names ({SUN_PATH_MAX} bytes at most); use a shorter base",
                dir.display()
            )));
        }
        make_private_dir(&dir, uid)?;
        let in_place = polyrail_core::allow_peer_reads();
        let engine = Engine::start(cfg.dma, cfg.pacer.clone(), format!("scif-dma-{}", cfg.node))
            .map_err(|e| ScifError::os("starting the DMA engine's thread", e))?;
        Ok(Fabric {
            inner: Arc::new(Inner {
                node: cfg.node,
                nodes: cfg.nodes,
                physical_node: cfg.physical_node,
                privileged: cfg.privileged,
                dir,
                engine,
                in_place,
            }),
        })
    }

    /// `scif_open`: a new endpoint, not bound.
    pub fn open(&self) -> Result<Endpoint> {
        Endpoint::open(self)
    }

    /// `scif_get_node_ids`: the nodes of this physical node (0 the host, then the devices) and
    /// this process's node.
    pub fn get_node_ids(&self) -> (Vec<u16>, u16) {
        ((0..self.inner.nodes).collect(), self.inner.node)
    }

    /// This process's SCIF node.
    pub fn node(&self) -> u16 {
        self.inner.node
    }

    /// The job's directory, where ports are named.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Whether this process's peers can read windows of ordinary memory it registers in place
    /// ([`Endpoint::register_in_place`]): the kernel's cross-process copy is allowed between
    /// processes of one user unless Yama's `ptrace_scope` is 2 or 3.
    pub fn lends_in_place(&self) -> bool {
        self.inner.in_place
    }

    /// What the DMA engine did so far, with the CPU time it took.
    pub fn dma_stats(&self) -> DmaStats {
        self.inner.engine.stats()
    }

    /// One line for `polyrail info` and reports: says that this is an emulation and how.
    pub fn describe(&self) -> String {
        let i = &self.inner;
        let s = i.engine.stats();
        format!(
            "{PROVIDER}: software SCIF provider, an emulation (no co-processor or SCIF driver): node {} of {} \
             on physical node {}; endpoints are Unix sockets in {}, windows memory files the peer maps; \
             the DMA engine is a thread of this process ({:?} order), which used {:.3} ms of CPU \
             for {} transfers that hardware DMA would move without one ({} bytes copied twice, their two \
             sides differing mod 64)",
            i.node,
            i.nodes,
            i.physical_node,
            i.dir.display(),
            i.engine.mode(),
            s.cpu.as_secs_f64() * 1e3,
            s.transfers,
            s.unaligned_bytes
        )
    }
}

/// Removes what the software provider left of job `job` (endpoint sockets and port locks of
/// processes that died without sweeping): a launcher calls it once the job's processes are
/// gone. Looks under `POLYRAIL_SCIF_DIR`, `$XDG_RUNTIME_DIR` and `/tmp`, at this user's
/// directories only.
pub fn remove_job_dirs(job: &str) {
    let uid = rustix::process::getuid().as_raw();
    let prefix = format!("polyrail-scif.{uid}.{}.", job_component(job));
    let bases = ["POLYRAIL_SCIF_DIR", "XDG_RUNTIME_DIR"]
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()).map(PathBuf::from))
        .chain([PathBuf::from("/tmp")]);
    for base in bases {
        let Ok(entries) = std::fs::read_dir(&base) else { continue };
        for e in entries.flatten() {
            let named = e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix));
            let ours = e.metadata().is_ok_and(|m| m.is_dir() && m.uid() == uid);
            if named && ours {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

fn make_private_dir(dir: &Path, uid: u32) -> Result<()> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(dir).map_err(|e| ScifError::os(format_args!("{}", dir.display()), e))?;
            if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
                return Err(ScifError::Eacces(format!(
                    "{} exists but is not a directory private to uid {uid}",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) => Err(ScifError::os(format_args!("making the job directory {}", dir.display()), e)),
    }
}

/// A port held by an endpoint: a lock file locked while the endpoint lives, and the socket
/// named beside it while the endpoint listens. Both go when it is dropped.
#[derive(Debug)]
pub(crate) struct PortHold {
    pub port: u16,
    lock: File,
    lock_path: PathBuf,
    pub sock_path: PathBuf,
    pub listening: bool,
}

impl Drop for PortHold {
    fn drop(&mut self) {
        if self.listening {
            let _ = std::fs::remove_file(&self.sock_path);
        }
        // Still locked: nobody else removes or reuses the path before this.
        let _ = std::fs::remove_file(&self.lock_path);
        let _ = &self.lock;
    }
}

impl Inner {
    pub(crate) fn sock_path(&self, node: u16, port: u16) -> PathBuf {
        self.dir.join(format!("n{node}.p{port}.sock"))
    }

    fn lock_path(&self, port: u16) -> PathBuf {
        self.dir.join(format!("n{}.p{port}.lock", self.node))
    }

    /// Holds `port` of this node, or (port 0) the first free one from 1088.
    pub(crate) fn reserve(&self, port: u16) -> Result<PortHold> {
        if port == 0 {
            for p in EPHEMERAL_PORT_FIRST..=u16::MAX {
                if let Some(hold) = self.try_reserve(p)? {
                    return Ok(hold);
                }
            }
            return Err(ScifError::Enospc(format!(
                "every port from {EPHEMERAL_PORT_FIRST} of node {} is bound",
                self.node
            )));
        }
        if port < PRIVILEGED_PORT_LIMIT && !self.privileged {
            return Err(ScifError::Eacces(format!(
                "port {port} is below {PRIVILEGED_PORT_LIMIT}: binding it needs privilege"
            )));
        }
        self.try_reserve(port)?.ok_or_else(|| {
            ScifError::Eaddrinuse(format!("port {} of node {} is bound by another endpoint", port, self.node))
        })
    }

    fn try_reserve(&self, port: u16) -> Result<Option<PortHold>> {
        let lock_path = self.lock_path(port);
        for _ in 0..8 {
            let file = match OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&lock_path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Another process swept the job directory away as its last endpoint went.
                    make_private_dir(&self.dir, rustix::process::getuid().as_raw())?;
                    continue;
                }
                Err(e) => return Err(ScifError::os(format_args!("opening {}", lock_path.display()), e)),
            };
            match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(ScifError::os(format_args!("locking {}", lock_path.display()), e)),
            }
            // The previous holder may have removed the path between our open and our lock.
            let same = match (file.metadata(), std::fs::metadata(&lock_path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if same {
                let sock_path = self.sock_path(self.node, port);
                // A socket left by a holder that died.
                let _ = std::fs::remove_file(&sock_path);
                return Ok(Some(PortHold { port, lock: file, lock_path, sock_path, listening: false }));
            }
        }
        Ok(None)
    }

    /// Removes the files of ports whose holders died, then the directory if it is empty.
    fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(stem) = name.strip_suffix(".lock") {
                let Ok(file) = File::open(&path) else { continue };
                if rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
                    let same =
                        matches!((file.metadata(), std::fs::metadata(&path)), (Ok(a), Ok(b)) if a.ino() == b.ino());
                    if same {
                        let _ = std::fs::remove_file(self.dir.join(format!("{stem}.sock")));
                        let _ = std::fs::remove_file(&path);
                    }
                }
            } else if let Some(stem) = name.strip_suffix(".sock") {
                if !self.dir.join(format!("{stem}.lock")).exists() {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.sweep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_names_the_node_and_the_directory() {
        // Only this test of the binary reads these variables.
        std::env::set_var("POLYRAIL_SCIF_DIR", "/run/x");
        std::env::set_var("POLYRAIL_SCIF_NODE", "2");
        std::env::set_var("POLYRAIL_NODE", "5");
        let cfg = FabricConfig::from_env("j").unwrap();
        assert_eq!((cfg.base.as_path(), cfg.node, cfg.nodes, cfg.physical_node), (Path::new("/run/x"), 2, 3, 5));
        std::env::set_var("POLYRAIL_SCIF_NODES", "many");
        let e = FabricConfig::from_env("j").unwrap_err();
        assert!(e.to_string().contains("POLYRAIL_SCIF_NODES=\"many\""), "{e}");
        // The layout's domain and domain count when the SCIF variables are not given.
        std::env::remove_var("POLYRAIL_SCIF_NODES");
        std::env::remove_var("POLYRAIL_SCIF_NODE");
        std::env::set_var("POLYRAIL_DOMAIN", "1");
        std::env::set_var("POLYRAIL_DOMAINS", "4");
        let cfg = FabricConfig::from_env("j").unwrap();
        assert_eq!((cfg.node, cfg.nodes), (1, 4));
        for v in [
            "POLYRAIL_SCIF_DIR",
            "POLYRAIL_SCIF_NODE",
            "POLYRAIL_NODE",
            "POLYRAIL_SCIF_NODES",
            "POLYRAIL_DOMAIN",
            "POLYRAIL_DOMAINS",
        ] {
            std::env::remove_var(v);
        }
    }

    #[test]
    fn job_names_become_short_distinct_path_components() {
        assert_eq!(job_component("job-7"), "job-7");
        let odd = job_component("a/../b");
        assert!(odd.starts_with('h') && odd.len() == 17 && !odd.contains('/'));
        assert_ne!(job_component("a/../b"), job_component("a/../c"));
        assert_eq!(job_component(&"x".repeat(200)).len(), 17);
    }
}
