//! `polyrail run`: starts the ranks of a job on this machine and serves them PMI.
//!
//! Each rank gets one end of a `socketpair` as `PMI_FD`, plus `PMI_RANK`, `PMI_SIZE` and
//! `PMI_JOBID` (as Slurm sets it); the other end goes to a [`PmiServer`], which speaks PMI-1 and
//! PMI-2. The job is named `pr<launcher pid>` (the PMI-1 kvsname and PMI-2 jobid). Output of
//! the ranks reaches the launcher's stdout and stderr through pipes, a whole line at a time, so
//! that lines of ranks writing at once do not mix (the `output` module); only rank 0 reads
//! stdin.
//!
//! Every rank leads a process group of its own (rank 0 not while its stdin is a terminal: it
//! must stay in the terminal's foreground group to read it), so that the launcher's signals
//! reach the processes a rank started too (a rank that is `sh -c prog`); once every rank has
//! exited, what is left in their groups is killed (the launcher says which), and the ranks are
//! reaped only then, so that no other process can take the id of a group it still signals.
//!
//! When a rank dies abnormally (killed by a signal, nonzero exit, or exit without PMI finalize
//! after having opened a PMI session), the launcher says so in one line, gives the other ranks
//! [`LaunchOptions::grace`] to notice and exit on their own, then kills them. A PMI abort kills the
//! other ranks at once. SIGINT, SIGQUIT, SIGTERM or SIGHUP (SIGHUP not under `nohup`) to the
//! launcher is forwarded as SIGTERM, followed by
//! SIGKILL after the grace period (a second signal kills at once); so is SIGQUIT. SIGTSTP
//! (Ctrl-Z) stops the ranks and then the launcher; continued, it continues them (the time
//! stopped does not count against `--timeout`). The job's shared-memory segments are memory
//! files of its ranks: they go with the ranks, and the launcher removes no file in `/dev/shm` (a
//! name there that looks like a job's may be anyone's). At the end it removes the software SCIF
//! provider's job directories that belong to its user (private directories, checked by owner).
//!
//! Between events the launcher sleeps in `poll(2)` on descriptors that something happening makes
//! readable: the PMI server's event notices, a pipe its signal handler writes, a pidfd per
//! running rank and the ranks' output pipes. It does not wake up periodically (once a second at
//! most, as a safety net), so it takes no CPU time from the ranks, whose latency a launcher
//! waking 100 times a second disturbed (a rank sharing its core waited a fraction of a
//! millisecond each time).

mod output;

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use polyrail_core::{Error, Rank, Result};
use polyrail_pmi::server::{PmiServer, ServerEvent};

use output::Output;

/// Where the ranks may run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bind {
    /// Rank `r` is bound to one CPU: the `r % n`-th of the `n` CPUs the launcher may use.
    #[default]
    Core,
    /// Ranks inherit the launcher's CPU affinity.
    None,
}

/// What to launch and how.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Number of ranks (at least 1).
    pub ranks: u32,
    /// The program every rank runs (looked up in `PATH` if it has no `/`).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// CPU binding (default [`Bind::Core`]).
    pub bind: Bind,
    /// Variables added to the ranks' environment (which is otherwise the launcher's).
    pub env: Vec<(OsString, OsString)>,
    /// How long ranks may take to exit on their own once the job is stopping (default 2 s).
    pub grace: Duration,
    /// Virtual node of each rank (`POLYRAIL_NODE`), or none: every rank on this machine's node.
    /// Ranks on different nodes never use node-local channels. See [`nodes_from_counts`].
    pub nodes: Option<Vec<u32>>,
    /// Memory domain of each rank within its node (`POLYRAIL_DOMAIN`: 0 the host, k device k)
    /// and how many domains its node has (`POLYRAIL_DOMAINS`), or none: every rank on the
    /// host. See [`Layout`].
    pub domains: Option<Vec<(u16, u16)>>,
    /// Start every line of the ranks' output with `[rank] ` (`polyrail run --label`).
    pub label: bool,
    /// Stop the job once it has run this long (`polyrail run --timeout`): SIGTERM to every rank,
    /// SIGKILL after [`LaunchOptions::grace`]; the job's code is then at least
    /// [`TIMEOUT_CODE`]. `None` (the default): no limit.
    pub timeout: Option<Duration>,
    /// Let the ranks outlive a launcher killed with SIGKILL (`polyrail run
    /// --ranks-outlive-launcher`), as under a process manager that does not kill them: they then
    /// find the process manager gone in their polyrail calls. By default (`false`) the kernel
    /// kills them with the launcher.
    pub ranks_outlive_launcher: bool,
}

/// The least exit code of a job stopped by [`LaunchOptions::timeout`] (as `timeout(1)`'s).
pub const TIMEOUT_CODE: i32 = 124;

/// The most ranks `polyrail run` starts: every rank is a process of this machine, and no
/// kernel runs more (the largest `pid_max`, 2^22).
pub const MAX_RANKS: u32 = 1 << 22;

fn check_ranks(ranks: u32) -> Result<()> {
    match ranks {
        0 => Err(Error::InvalidArgument("polyrail run needs at least one rank (-n 1 or more)".into())),
        n if n > MAX_RANKS => Err(Error::InvalidArgument(format!(
            "{n} ranks: polyrail run starts at most {MAX_RANKS}, each a process of this machine"
        ))),
        _ => Ok(()),
    }
}

/// Node of each of `ranks` ranks from `ranks per node` counts (`--layout 2,2`).
pub fn nodes_from_counts(ranks: u32, counts: &[u32]) -> Result<Vec<u32>> {
    check_ranks(ranks)?;
    let total: u64 = counts.iter().map(|&c| c as u64).sum();
    if counts.is_empty() || counts.contains(&0) || total != ranks as u64 {
        return Err(Error::InvalidArgument(format!(
            "layout {counts:?} does not place {ranks} ranks: give ranks per node, each at least 1, summing to {ranks}"
        )));
    }
    Ok(counts.iter().enumerate().flat_map(|(node, &c)| std::iter::repeat_n(node as u32, c as usize)).collect())
}

/// Where `polyrail run --layout` puts each rank: its virtual node, and within the node its
/// memory domain (the host, or device k) with the node's number of domains.
///
/// The syntax is one entry per node, separated by commas; an entry is the ranks of each domain
/// of the node separated by `+`, the host's first, then device 1's, device 2's and so on:
/// `2,2` is two nodes of two host ranks, `1+2,1+2` two nodes each with one rank on the host
/// and two on device 1, `1+1+1` one node with a rank on the host and on each of two devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Node of each rank.
    pub nodes: Vec<u32>,
    /// Domain of each rank and how many domains its node has.
    pub domains: Vec<(u16, u16)>,
}

impl Layout {
    /// Most domains of a node: the host and 255 devices.
    pub const MAX_DOMAINS: usize = 256;

    /// Reads `spec` for a job of `ranks` ranks; errors name the entry at fault and the syntax.
    pub fn parse(ranks: u32, spec: &str) -> Result<Layout> {
        check_ranks(ranks)?;
        let syntax = "one entry per node separated by commas, each the ranks of the host and of devices 1, 2, ... \
                      separated by '+', e.g. --layout 1+2,1+2";
        let bad = |what: String| Error::InvalidArgument(format!("--layout {spec:?}: {what} ({syntax})"));
        let (mut nodes, mut domains) = (Vec::new(), Vec::new());
        let mut total: u64 = 0;
        for (node, entry) in spec.split(',').enumerate() {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(bad(format!("node {node} is empty")));
            }
            let counts: Vec<&str> = entry.split('+').map(str::trim).collect();
            if counts.len() > Self::MAX_DOMAINS {
                return Err(bad(format!(
                    "node {node} ({entry}) has {} domains; at most {}",
                    counts.len(),
                    Self::MAX_DOMAINS
                )));
            }
            let mut on_node = 0u64;
            for (domain, count) in counts.iter().enumerate() {
                let where_ = if domain == 0 { "its host".to_string() } else { format!("device {domain}") };
                let n: u32 = count
                    .parse()
                    .map_err(|_| bad(format!("node {node} ({entry}): {count:?} for {where_} is not a whole number")))?;
                on_node += u64::from(n);
                total += u64::from(n);
                if total > u64::from(ranks) {
                    return Err(bad(format!("it places more than the {ranks} ranks of the job")));
                }
                for _ in 0..n {
                    nodes.push(node as u32);
                    domains.push((domain as u16, counts.len() as u16));
                }
            }
            if on_node == 0 {
                return Err(bad(format!("node {node} ({entry}) has no rank")));
            }
        }
        if total != u64::from(ranks) {
            return Err(bad(format!("it places {total} ranks, but the job has {ranks}")));
        }
        Ok(Layout { nodes, domains })
    }

    /// Whether some rank is on a device (else the layout is only virtual nodes).
    pub fn has_devices(&self) -> bool {
        self.domains.iter().any(|&(_, n)| n > 1)
    }
}

/// Node of each of `ranks` ranks spread in blocks over `nodes` nodes (`--nodes 2`).
pub fn nodes_in_blocks(ranks: u32, nodes: u32) -> Result<Vec<u32>> {
    check_ranks(ranks)?;
    if nodes == 0 || nodes > ranks {
        return Err(Error::InvalidArgument(format!("cannot spread {ranks} ranks over {nodes} nodes")));
    }
    let counts: Vec<u32> = (0..nodes).map(|i| ranks / nodes + u32::from(i < ranks % nodes)).collect();
    nodes_from_counts(ranks, &counts)
}

impl LaunchOptions {
    /// `ranks` copies of `program` without arguments, with the default binding and grace.
    pub fn new(ranks: u32, program: impl Into<OsString>) -> Self {
        LaunchOptions { ranks, program: program.into(), ..Default::default() }
    }
}

impl Default for LaunchOptions {
    /// One rank, no program yet, [`Bind::Core`], no extra variables, a grace of 2 s, no labels,
    /// no timeout, ranks killed with the launcher.
    fn default() -> Self {
        LaunchOptions {
            ranks: 1,
            program: OsString::new(),
            args: Vec::new(),
            bind: Bind::Core,
            env: Vec::new(),
            grace: Duration::from_secs(2),
            nodes: None,
            domains: None,
            label: false,
            timeout: None,
            ranks_outlive_launcher: false,
        }
    }
}

/// Runs the job to completion and returns its exit code.
///
/// The code is the abort code (as `abort_status` makes it an exit status) if a rank aborted the job first; otherwise the worst rank's:
/// 128 + signal for a rank killed by a signal (other than the launcher's own), else the largest
/// exit code, an exit without PMI finalize counting as at least 1. A job stopped by SIGINT,
/// SIGQUIT, SIGTERM or SIGHUP returns at least 128 + that signal, one stopped by its timeout at least
/// [`TIMEOUT_CODE`].
///
/// Raises the calling process's soft limit on open files to its hard limit (the ranks get the
/// limit the process had): the launcher holds five descriptors per rank. The ranks are killed
/// when the calling thread ends (`PR_SET_PDEATHSIG`; unless
/// [`LaunchOptions::ranks_outlive_launcher`]), so that a launcher killed with SIGKILL leaves
/// none behind: call it from a thread that outlives the job (`polyrail run` calls it from its
/// main thread).
pub fn launch(opts: &LaunchOptions) -> Result<i32> {
    check_ranks(opts.ranks)?;
    let job = job_name();
    if let Some(limit) = raise_open_file_limit() {
        let needed = FILES_PER_RANK * libc::rlim_t::from(opts.ranks) + 16;
        if needed > limit {
            return Err(Error::InvalidArgument(format!(
                "{} ranks need about {needed} open files in the launcher ({FILES_PER_RANK} per rank), \
                 above this process's limit of {limit} (`ulimit -Hn`)",
                opts.ranks
            )));
        }
    }
    let _signals = SignalGuard::install();
    let (server_ends, child_ends) = socket_pairs(opts.ranks)?;
    let server = PmiServer::start(&job, server_ends)?;
    let (procs, output) = match spawn_all(opts, &job, &child_ends) {
        Ok(started) => started,
        Err(e) => {
            // The ranks started so far were killed; segments they made go with them.
            server.stop();
            polyrail_scif::remove_job_dirs(&job);
            output::flush(|| RECEIVED.load(Ordering::Relaxed) != 0);
            return Err(e);
        }
    };
    drop(child_ends);
    let mut run = Run::new(opts, procs, output, server, signal_notices());
    run.wait_all();
    run.release();
    let code = run.exit_code();
    print_notices(&run.server); // of the server's last moments
    run.server.stop();
    polyrail_scif::remove_job_dirs(&job);
    // What is still queued for the launcher's stdout and stderr goes out; a job stopped from
    // outside (a signal, its timeout) waits for a reader that does not read for a moment only,
    // and a signal now ends the wait.
    let give_up_at = run.stop_code.map(|_| Instant::now() + OUTPUT_DRAIN);
    output::flush(|| RECEIVED.load(Ordering::Relaxed) != 0 || give_up_at.is_some_and(|t| Instant::now() >= t));
    Ok(code)
}

/// The launcher holds five descriptors per rank (its PMI socket, its exit notice, both ends of a
/// socket pair until the ranks start, two output pipes): raises this process's soft limit on
/// open files to the hard one, so that a job of a few hundred ranks does not meet the usual
/// soft limit of 1024. The ranks get the soft limit the launcher had (see `child_setup`).
/// Returns the soft limit now in force (`None` if it cannot be read).
fn raise_open_file_limit() -> Option<libc::rlim_t> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct passed; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let _ = INHERITED_FILE_LIMIT.set(lim);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &libc::rlimit { rlim_cur: lim.rlim_max, ..lim }) == 0 {
                return Some(lim.rlim_max);
            }
        }
    }
    Some(lim.rlim_cur)
}

/// Descriptors the launcher holds per rank (see [`raise_open_file_limit`]).
const FILES_PER_RANK: libc::rlim_t = 5;

/// The open-file limits this process had before [`raise_open_file_limit`], if it raised them.
static INHERITED_FILE_LIMIT: OnceLock<libc::rlimit> = OnceLock::new();

/// `pr<pid>` for the first job of this process, `pr<pid>_<n>` for later ones.
fn job_name() -> String {
    static JOBS: AtomicU32 = AtomicU32::new(0);
    match JOBS.fetch_add(1, Ordering::Relaxed) {
        0 => format!("pr{}", std::process::id()),
        n => format!("pr{}_{n}", std::process::id()),
    }
}

fn socket_pairs(n: u32) -> Result<(Vec<UnixStream>, Vec<UnixStream>)> {
    let mut server = Vec::with_capacity(n as usize);
    let mut child = Vec::with_capacity(n as usize);
    for r in 0..n {
        let (s, c) = UnixStream::pair().map_err(|e| Error::io(format!("creating the PMI socket of rank {r}"), e))?;
        server.push(s);
        child.push(c);
    }
    Ok((server, child))
}

/// One running (or finished) rank.
struct Proc {
    child: Child,
    status: Option<ExitStatus>,
    initialized: bool,
    finalized: bool,
    aborted: bool,
    /// The launcher sent it a signal: its death by signal is not its fault.
    signalled_by_us: bool,
    /// Its contribution to the job's exit code, once it has exited.
    code: Option<i32>,
    /// Readable once it exited (a pidfd; `None` on kernels without them, before Linux 5.3).
    exit_notice: Option<OwnedFd>,
    /// It leads a process group of its own, which the processes it starts join: the launcher's
    /// signals go to the whole group, and what is left of it when the job ends is killed.
    own_group: bool,
    /// It was reaped (at the end, or by someone else when `waitid` failed): neither its pid
    /// nor its group's id is ours to signal any more.
    reaped: bool,
}

impl Proc {
    /// The target of `kill(2)` for this rank: its process group, or itself.
    fn kill_target(&self) -> libc::pid_t {
        let pid = self.child.id() as libc::pid_t;
        if self.own_group {
            -pid
        } else {
            pid
        }
    }

    /// Kills the rank and what is left of its group, and reaps it.
    fn kill_and_reap(&mut self) {
        if self.reaped {
            return;
        }
        // SAFETY: kill has no memory-safety preconditions; the rank is not reaped yet, so its
        // pid (and the id of its group) names nothing else.
        unsafe { libc::kill(self.kill_target(), libc::SIGKILL) };
        let _ = self.child.wait();
        self.reaped = true;
    }
}

fn spawn_all(opts: &LaunchOptions, job: &str, child_ends: &[UnixStream]) -> Result<(Vec<Proc>, Output)> {
    let cpus = match opts.bind {
        Bind::Core => allowed_cpus(),
        Bind::None => Vec::new(),
    };
    let mut procs: Vec<Proc> = Vec::with_capacity(child_ends.len());
    let mut output = Output::new(opts.label);
    let stdin_is_terminal = std::io::IsTerminal::is_terminal(&std::io::stdin());
    for (r, end) in child_ends.iter().enumerate() {
        let cpu = (!cpus.is_empty()).then(|| cpus[r % cpus.len()]);
        // Rank 0 reading the terminal must stay in the terminal's foreground group, the
        // launcher's (in a group of its own, its read would stop it with SIGTTIN).
        let own_group = !(r == 0 && stdin_is_terminal);
        match spawn_rank(opts, job, r as Rank, end, cpu, true, own_group) {
            Ok(mut child) => {
                output.add(r, &mut child);
                procs.push(Proc {
                    exit_notice: exit_notice(child.id()),
                    child,
                    status: None,
                    initialized: false,
                    finalized: false,
                    aborted: false,
                    signalled_by_us: false,
                    code: None,
                    own_group,
                    reaped: false,
                })
            }
            Err(e) => {
                for p in &mut procs {
                    p.kill_and_reap();
                }
                let prog = opts.program.to_string_lossy();
                return Err(Error::io(format!("cannot start `{prog}` as rank {r}"), e));
            }
        }
    }
    Ok((procs, output))
}

/// The exit status of `pid`, our child, if it has exited, leaving it unreaped.
fn exit_status(pid: u32) -> std::io::Result<Option<ExitStatus>> {
    // SAFETY: siginfo_t is plain data; zeroed, its pid reads 0 when no child changed state.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        // SAFETY: waitid writes `info` only; `pid` is our child.
        if unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) } == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
    // SAFETY: waitid filled in the SIGCHLD fields of `info`, or left them zero.
    let (who, status) = unsafe { (info.si_pid(), info.si_status()) };
    let raw = match info.si_code {
        _ if who == 0 => return Ok(None),
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_KILLED => status,
        libc::CLD_DUMPED => status | 0x80,
        _ => return Ok(None),
    };
    Ok(Some(ExitStatus::from_raw(raw)))
}

/// The live processes (pid, group) in process groups `groups` other than the groups' leaders,
/// from `/proc` (none if it cannot be read).
fn processes_in_groups(groups: &[libc::pid_t]) -> Vec<(libc::pid_t, libc::pid_t)> {
    if groups.is_empty() {
        return Vec::new();
    }
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<libc::pid_t>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // After the command in parentheses (which may hold anything): state, ppid, pgrp.
        let Some((_, fields)) = stat.rsplit_once(')') else { continue };
        let mut fields = fields.split_whitespace();
        let dead = matches!(fields.next(), Some("Z" | "X"));
        let Some(group) = fields.nth(1).and_then(|g| g.parse().ok()) else { continue };
        if !dead && groups.contains(&group) && pid != group {
            found.push((pid, group));
        }
    }
    found.sort_unstable();
    found
}

/// A descriptor that polls readable once process `pid`, our child, exited: a pidfd (close-on-exec
/// by default); `None` where the kernel has none.
fn exit_notice(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; the pid is
    // our unreaped child, so it names that process.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative return is a new descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Starts rank `rank` of job `job`. `launcher`: for `polyrail run`, which reads the rank's
/// output through pipes and whose death kills the rank; else for a program that embeds the
/// job ([`spawn_peers`]), whose ranks inherit its output and outlive the thread that started
/// them.
fn spawn_rank(
    opts: &LaunchOptions,
    job: &str,
    rank: Rank,
    end: &UnixStream,
    cpu: Option<usize>,
    launcher: bool,
    own_group: bool,
) -> std::io::Result<Child> {
    let fd = end.as_raw_fd();
    let mut cmd = Command::new(&opts.program);
    cmd.args(&opts.args);
    for var in ["PMI_FD", "PMI_PORT", "PMI_RANK", "PMI_SIZE", "PMI_ID", "PMI_JOBID"] {
        cmd.env_remove(var);
    }
    cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
    cmd.env("PMI_FD", fd.to_string())
        .env("PMI_RANK", rank.to_string())
        .env("PMI_SIZE", opts.ranks.to_string())
        .env("PMI_JOBID", job);
    if let Some(node) = opts.nodes.as_ref().and_then(|n| n.get(rank as usize)) {
        cmd.env("POLYRAIL_NODE", node.to_string());
    }
    if let Some(&(domain, domains)) = opts.domains.as_ref().and_then(|d| d.get(rank as usize)) {
        cmd.env("POLYRAIL_DOMAIN", domain.to_string()).env("POLYRAIL_DOMAINS", domains.to_string());
    }
    if rank != 0 {
        cmd.stdin(Stdio::null());
    }
    if launcher {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    if own_group {
        // Set in the child before exec: the group exists once `spawn` returns.
        cmd.process_group(0);
    }
    let set = cpu.map(cpu_set_of);
    let limit = INHERITED_FILE_LIMIT.get().copied();
    // The launcher, whose death is to kill the rank (`polyrail run` spawns from its main thread,
    // the one PR_SET_PDEATHSIG watches).
    let parent = (launcher && !opts.ranks_outlive_launcher).then(|| std::process::id() as libc::pid_t);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system
    // calls (fcntl, sched_setaffinity, setrlimit, prctl, getppid) on data prepared before the
    // fork; it does not allocate.
    unsafe { cmd.pre_exec(move || child_setup(fd, set.as_ref(), limit.as_ref(), parent)) };
    cmd.spawn()
}

/// In the child: lets the PMI socket survive exec, binds to the chosen CPU, puts back the
/// open-file limit the launcher started with, and, started by `polyrail run` (`launcher`, its
/// pid), asks to be killed when the launcher dies: a launcher killed with SIGKILL cannot stop
/// its ranks, and a rank that computes (or never talks PMI) would run on with nowhere to write.
fn child_setup(
    fd: i32,
    cpus: Option<&libc::cpu_set_t>,
    files: Option<&libc::rlimit>,
    launcher: Option<libc::pid_t>,
) -> std::io::Result<()> {
    if let Some(pid) = launcher {
        // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number; getppid has no
        // preconditions.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before the request took effect: nothing will send the signal.
            if libc::getppid() != pid {
                return Err(std::io::Error::other("the launcher died while starting the rank"));
            }
        }
    }
    // SAFETY: fcntl on an open descriptor (the parent keeps it open across the fork).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    // SAFETY: as above; clearing FD_CLOEXEC only changes this process's descriptor table.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if let Some(set) = cpus {
        // SAFETY: `set` points to a valid cpu_set_t of the size passed.
        if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if let Some(lim) = files {
        // SAFETY: setrlimit reads the struct passed. Lowering the soft limit cannot fail.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, lim) };
    }
    Ok(())
}

/// The CPUs this process may run on, in order (all online CPUs if the mask cannot be read).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let ok = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } == 0;
    if ok {
        // SAFETY: CPU_ISSET reads the set in bounds (cpu < CPU_SETSIZE).
        let cpus: Vec<usize> =
            (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect();
        if !cpus.is_empty() {
            return cpus;
        }
    }
    // SAFETY: sysconf has no memory-safety preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    // A fixed-size cpu_set_t holds CPUs below CPU_SETSIZE only (the mask could not be read
    // because the kernel has more: those beyond are never chosen).
    (0..(online.max(1) as usize).min(libc::CPU_SETSIZE as usize)).collect()
}

fn cpu_set_of(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes in bounds: `cpu` comes from allowed_cpus (< CPU_SETSIZE).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set
}

/// The launcher's view of a running job.
struct Run<'a> {
    opts: &'a LaunchOptions,
    procs: Vec<Proc>,
    /// The ranks' stdout and stderr.
    output: Output,
    server: PmiServer,
    /// Readable after a SIGINT, SIGQUIT, SIGTERM, SIGHUP or SIGTSTP (see [`signal_notices`]).
    signal_notices: Option<&'static OwnedFd>,
    /// When surviving ranks get SIGKILL; set once the job is stopping.
    kill_at: Option<Instant>,
    killed: bool,
    /// The abort code, if a rank aborted the job before anything else went wrong.
    abort_code: Option<i32>,
    /// Something went wrong already (later failures are consequences and are not announced).
    failed: bool,
    /// The least code of a job stopped from outside: 128 + the signal that stopped the
    /// launcher, or [`TIMEOUT_CODE`].
    stop_code: Option<i32>,
    /// When the job runs out of time (`LaunchOptions::timeout`), until it does.
    deadline: Option<Instant>,
    /// Ranks whose PMI connection broke, in the order the server saw it: the likely causes.
    lost: Vec<usize>,
    /// Lost ranks already waited for (see `settle_lost`).
    settled: Vec<usize>,
}

impl<'a> Run<'a> {
    fn new(
        opts: &'a LaunchOptions,
        procs: Vec<Proc>,
        output: Output,
        server: PmiServer,
        signal_notices: Option<&'static OwnedFd>,
    ) -> Self {
        Run {
            opts,
            procs,
            output,
            server,
            signal_notices,
            kill_at: None,
            killed: false,
            abort_code: None,
            failed: false,
            stop_code: None,
            // A timeout beyond what the clock can hold is no limit.
            deadline: opts.timeout.and_then(|t| Instant::now().checked_add(t)),
            lost: Vec::new(),
            settled: Vec::new(),
        }
    }

    fn running(&self) -> usize {
        self.procs.iter().filter(|p| p.status.is_none()).count()
    }

    fn wait_all(&mut self) {
        while self.running() > 0 {
            let mut exited = self.newly_exited();
            // A signal first: rank 0, in the terminal's process group, dies of the same Ctrl-C,
            // and is not to be blamed for stopping the job.
            self.check_signal();
            while let Some(ev) = self.server.try_event() {
                self.on_event(ev);
            }
            if !self.failed && !exited.is_empty() {
                self.settle_lost(&mut exited);
            }
            // What the ranks wrote before they exited goes out before the launcher says so
            // (their pipes are read also while the launcher's streams are backed up).
            self.output.pump(&exited);
            // Ranks that lost their PMI connection first are announced first: the others
            // usually exit because of them.
            exited.sort_by_key(|&r| (self.lost.iter().position(|&l| l == r).unwrap_or(usize::MAX), r));
            for r in exited {
                self.on_exit(r);
            }
            self.check_suspend();
            self.check_signal();
            self.check_deadline();
            if self.kill_at.is_some_and(|t| Instant::now() >= t) && !self.killed && self.running() > 0 {
                self.kill_survivors();
            }
            if self.running() > 0 {
                self.wait_for_news();
            }
        }
    }

    /// Sleeps until something may have happened: a PMI event, a signal, a rank's exit or output
    /// (each makes a descriptor polled here readable), or the kill deadline or an unfinished
    /// line's; [`IDLE_WAKE`] at most, [`EXIT_POLL`] while a rank's exit has no descriptor.
    fn wait_for_news(&mut self) {
        let polled = |fd: RawFd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let mut fds = vec![polled(self.server.event_fd().as_raw_fd())];
        fds.extend(self.signal_notices.map(|f| polled(f.as_raw_fd())));
        let mut wait = IDLE_WAKE;
        for p in self.procs.iter().filter(|p| p.status.is_none()) {
            match &p.exit_notice {
                Some(fd) => fds.push(polled(fd.as_raw_fd())),
                None => wait = EXIT_POLL,
            }
        }
        self.output.poll_fds(&mut fds);
        for t in self.kill_at.into_iter().chain(self.deadline).chain(self.output.deadline()) {
            wait = wait.min(t.saturating_duration_since(Instant::now()));
        }
        // Rounded up: a deadline less than a millisecond away must not make this a busy loop.
        let ms = wait.as_micros().div_ceil(1000) as libc::c_int;
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs.
        // Its result does not matter: the caller looks at everything after any wake-up.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if let Some(f) = self.signal_notices {
            drain(f);
        }
    }

    /// Collects the ranks that exited since the last call.
    fn newly_exited(&mut self) -> Vec<usize> {
        (0..self.procs.len()).filter(|&r| self.check_exit(r)).collect()
    }

    /// Whether rank `r` has just been found exited. It is left unreaped (until
    /// [`Run::release`]), so that neither its pid nor the id of its group can be taken by
    /// another process while the launcher may still signal them.
    fn check_exit(&mut self, r: usize) -> bool {
        let p = &mut self.procs[r];
        if p.status.is_some() {
            return false;
        }
        match exit_status(p.child.id()) {
            Ok(Some(st)) => p.status = Some(st),
            Ok(None) => return false,
            Err(e) => {
                say(&format!("cannot wait for rank {r} (pid {}): {e}; counting it as failed", p.child.id()));
                p.status = Some(ExitStatus::from_raw(1 << 8));
                p.reaped = true;
            }
        }
        true
    }

    /// Once every rank has exited: kills the processes the ranks left running in their groups,
    /// reaps the ranks, forwards what is left in their pipes, and then says what it killed.
    fn release(&mut self) {
        let groups: Vec<libc::pid_t> =
            self.procs.iter().filter(|p| p.own_group).map(|p| p.child.id() as libc::pid_t).collect();
        // Processes that got the job's SIGTERM with their rank may still be on their way out:
        // they get a moment before they count as left running.
        let mut left = processes_in_groups(&groups);
        let waited = Instant::now();
        while !left.is_empty() && waited.elapsed() < LEFTOVER_WAIT {
            std::thread::sleep(Duration::from_millis(5));
            left = processes_in_groups(&groups);
        }
        let left: Vec<String> = left
            .into_iter()
            .filter_map(|(pid, group)| {
                let r = self.procs.iter().position(|p| p.own_group && p.child.id() as libc::pid_t == group)?;
                Some(format!("{pid} (from rank {r})"))
            })
            .collect();
        for p in &mut self.procs {
            p.kill_and_reap();
        }
        self.output.finish(Instant::now() + OUTPUT_DRAIN);
        if !left.is_empty() {
            say(&format!("killed what the ranks left running: pid {}", left.join(", ")));
        }
    }

    /// Before the first failure is announced: gives ranks whose PMI connection already broke up
    /// to 100 ms to become reapable (a dying process closes its sockets before it can be
    /// waited for), so that the cause is named rather than a rank reacting to it.
    fn settle_lost(&mut self, exited: &mut Vec<usize>) {
        let waiting: Vec<usize> = self
            .lost
            .iter()
            .copied()
            .filter(|r| !self.settled.contains(r) && self.procs[*r].status.is_none())
            .collect();
        if waiting.is_empty() {
            return;
        }
        self.settled.extend(&waiting);
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut left = waiting;
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            left.retain(|&r| {
                let done = self.check_exit(r);
                if done {
                    exited.push(r);
                }
                !done
            });
        }
    }

    fn on_event(&mut self, ev: ServerEvent) {
        match ev {
            ServerEvent::Initialized(r) => self.procs[r as usize].initialized = true,
            ServerEvent::Finalized(r) => self.procs[r as usize].finalized = true,
            ServerEvent::Aborted { rank, code, message } => self.on_abort(rank as usize, code, &message),
            // The rank's exit, which follows, is what counts.
            ServerEvent::Lost { rank, .. } => self.lost.push(rank as usize),
            ServerEvent::Notice(line) => output::say_line(&line),
        }
    }

    fn on_abort(&mut self, r: usize, code: i32, message: &str) {
        let pid = self.procs[r].child.id();
        self.procs[r].aborted = true;
        say(&format!("rank {r} (pid {pid}) aborted the job with code {code}: {message}"));
        if !self.failed {
            self.failed = true;
            self.abort_code = Some(code);
        }
        let others: Vec<usize> = (0..self.procs.len()).filter(|&o| o != r).collect();
        self.signal(&others, libc::SIGKILL);
        // The aborting rank exits by itself once the server closes its connection.
        self.stop_after(self.opts.grace);
    }

    fn on_exit(&mut self, r: usize) {
        let p = &self.procs[r];
        let Some(st) = p.status else { return };
        let (code, what) = match (st.signal(), st.code()) {
            (Some(sig), _) => (128 + sig, format!("was killed by signal {sig} ({})", signal_name(sig))),
            (None, Some(c)) if c != 0 => (c, format!("exited with code {c}")),
            _ if p.initialized && !p.finalized && !p.aborted => (1, "exited without calling PMI finalize".to_owned()),
            _ => (0, String::new()),
        };
        let ours = p.signalled_by_us && st.signal().is_some();
        let aborted = p.aborted;
        self.procs[r].code = if ours { None } else { Some(code) };
        if code == 0 || ours || aborted {
            return;
        }
        if !self.failed {
            self.failed = true;
            let others = self.running() > 0;
            let tail = if others { "; stopping the job" } else { "" };
            say(&format!("rank {r} (pid {}) {what}{tail}", self.procs[r].child.id()));
            self.stop_after(self.opts.grace);
        }
    }

    /// Ctrl-Z (SIGTSTP): the ranks, in process groups of their own, do not get the terminal's
    /// signal. Stops them, then the launcher itself; once continued (the shell's `fg` or
    /// `bg`), continues them.
    /// The time the job spent stopped does not count against its timeout or grace period.
    fn check_suspend(&mut self) {
        if !SUSPEND.swap(false, Ordering::Relaxed) {
            return;
        }
        let stopped_at = Instant::now();
        let all: Vec<usize> = (0..self.procs.len()).collect();
        self.signal(&all, libc::SIGTSTP);
        // The launcher stops as it would have without its handler (not at all in an orphaned
        // process group, where the kernel discards the signal: then it continues the ranks at
        // once rather than stop for good).
        // SAFETY: sigaction is plain data; SIG_DFL with no flags is the default disposition,
        // and `ours` gets back the handler this guard installed. raise has no preconditions.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            let mut ours: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGTSTP, &dfl, &mut ours) == 0 {
                libc::raise(libc::SIGTSTP);
                libc::sigaction(libc::SIGTSTP, &ours, std::ptr::null_mut());
            }
        }
        self.signal(&all, libc::SIGCONT);
        let stopped = stopped_at.elapsed();
        for t in [&mut self.deadline, &mut self.kill_at].into_iter().flatten() {
            *t += stopped;
        }
    }

    fn check_signal(&mut self) {
        let sig = RECEIVED.swap(0, Ordering::Relaxed);
        if sig == 0 {
            return;
        }
        let all: Vec<usize> = (0..self.procs.len()).collect();
        // A signal came before (its code is above 128; a timeout's is 124).
        if self.stop_code.is_some_and(|c| c > 128) {
            say(&format!("received {} again; killing the job", signal_name(sig)));
            self.signal(&all, libc::SIGKILL);
            self.killed = true;
            return;
        }
        say(&format!("received {}; stopping the job", signal_name(sig)));
        self.stop_code = Some(128 + sig);
        self.failed = true;
        self.signal(&all, libc::SIGTERM);
        self.stop_after(self.opts.grace);
    }

    /// Stops the job once it has run past its timeout: SIGTERM now, SIGKILL after the grace.
    fn check_deadline(&mut self) {
        if self.deadline.is_none_or(|t| Instant::now() < t) {
            return;
        }
        self.deadline = None;
        let limit = self.opts.timeout.unwrap_or_default().as_secs_f64();
        say(&format!("the job ran past its timeout of {limit} s; stopping it"));
        self.stop_code = Some(self.stop_code.unwrap_or(0).max(TIMEOUT_CODE));
        self.failed = true;
        let all: Vec<usize> = (0..self.procs.len()).collect();
        self.signal(&all, libc::SIGTERM);
        self.stop_after(self.opts.grace);
    }

    /// Sets the SIGKILL deadline to `grace` from now unless an earlier one is set.
    fn stop_after(&mut self, grace: Duration) {
        let t = Instant::now() + grace;
        self.kill_at = Some(self.kill_at.map_or(t, |old| old.min(t)));
    }

    fn kill_survivors(&mut self) {
        let left: Vec<usize> = (0..self.procs.len()).filter(|&r| self.procs[r].status.is_none()).collect();
        let names: Vec<String> = left.iter().map(|r| r.to_string()).collect();
        say(&format!(
            "rank(s) {} still running {:?} after the job started stopping; killing them",
            names.join(", "),
            self.opts.grace
        ));
        self.signal(&left, libc::SIGKILL);
        self.killed = true;
    }

    /// Sends `sig` to those of `ranks` not reaped yet, with their groups: an exited rank's
    /// group still holds what it left running (and the rank, unreaped, keeps the group's id
    /// ours).
    fn signal(&mut self, ranks: &[usize], sig: i32) {
        for &r in ranks {
            let p = &mut self.procs[r];
            if p.reaped || (p.status.is_some() && !p.own_group) {
                continue;
            }
            // Stopping and continuing is no blame for how it ends.
            p.signalled_by_us |= p.status.is_none() && !matches!(sig, libc::SIGTSTP | libc::SIGCONT);
            // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child,
            // so neither it nor its group's id can have been reused.
            unsafe { libc::kill(p.kill_target(), sig) };
        }
    }

    fn exit_code(&self) -> i32 {
        let worst = self.procs.iter().filter_map(|p| p.code).max().unwrap_or(0);
        let code = self.abort_code.map_or(worst, polyrail_pmi::abort_status);
        self.stop_code.map_or(code, |s| code.max(s))
    }
}

/// Prints the notices `server` has queued, taking its other events too (for a launch, those
/// that came after the last rank; for an embedded job, events nobody reads).
fn print_notices(server: &PmiServer) {
    while let Some(ev) = server.try_event() {
        if let ServerEvent::Notice(line) = ev {
            output::say_line(&line);
        }
    }
}

/// Tells the user something, on one line of stderr (after what the ranks wrote there before).
fn say(msg: &str) {
    output::say_line(&format!("polyrail run: {msg}"));
}

/// `SIGKILL`, `SIGSEGV`... for the signals a job meets; `SIG<n>` otherwise.
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    name.to_owned()
}

/// Longest sleep of a waiting launcher: a safety net only (every event wakes it).
const IDLE_WAKE: Duration = Duration::from_secs(1);
/// Sleep of a waiting launcher while a running rank has no exit descriptor (no pidfds): its
/// exit is seen by polling.
const EXIT_POLL: Duration = Duration::from_millis(10);
/// How long processes left in the ranks' groups at the end may take to exit before they are
/// killed and named (those the job's SIGTERM reached are on their way out).
const LEFTOVER_WAIT: Duration = Duration::from_millis(100);
/// How long the launcher forwards output after the last rank exited, while a process the
/// ranks started holds their output pipes open.
const OUTPUT_DRAIN: Duration = Duration::from_millis(200);

/// The last SIGINT, SIGQUIT, SIGTERM or SIGHUP the launcher received (0: none since last
/// looked at).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// A SIGTSTP (Ctrl-Z) the launcher has not acted on yet.
static SUSPEND: AtomicBool = AtomicBool::new(false);
/// Write end of the signal notice pipe (-1: none yet, or pipe2 failed).
static SIGNAL_NOTICE: AtomicI32 = AtomicI32::new(-1);

/// The read end of the pipe the signal handlers write a byte to, made once per process and
/// never closed, so that a handler never writes to a closed (or reused) descriptor; `None` if
/// pipe2 failed (then the launcher sees signals at its next wake-up, within [`IDLE_WAKE`]).
/// Launches running at once in one process share it (as they share [`RECEIVED`]): one may
/// drain the other's notice, which then sees the signal within `IDLE_WAKE`.
fn signal_notices() -> Option<&'static OwnedFd> {
    static PIPE: OnceLock<Option<(OwnedFd, OwnedFd)>> = OnceLock::new();
    let pipe = PIPE.get_or_init(|| {
        let mut ends = [-1; 2];
        // SAFETY: `ends` has room for the two descriptors pipe2 returns.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return None;
        }
        // SAFETY: pipe2 succeeded: both are new descriptors that nothing else owns.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        SIGNAL_NOTICE.store(w.as_raw_fd(), Ordering::Relaxed);
        Some((r, w))
    });
    pipe.as_ref().map(|(r, _)| r)
}

extern "C" fn on_signal(sig: libc::c_int) {
    // Relaxed: the launcher reads the flags on every wake-up, the one this write causes or,
    // at worst, the next one.
    if sig == libc::SIGTSTP {
        SUSPEND.store(true, Ordering::Relaxed);
    } else {
        RECEIVED.store(sig, Ordering::Relaxed);
    }
    let fd = SIGNAL_NOTICE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: errno access and write(2) are async-signal-safe; the byte is a local; errno
        // is put back for the code the signal interrupted. A full pipe is readable already.
        unsafe {
            let errno = *libc::__errno_location();
            libc::write(fd, [1u8].as_ptr().cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// Reads a non-blocking descriptor until it is empty.
fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 64];
    // SAFETY: `buf` is writable for its length; `fd` is open (borrowed) and non-blocking.
    while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

/// SIGINT, SIGQUIT, SIGTERM, SIGHUP and SIGTSTP handlers (SIGHUP and SIGTSTP not when they were
/// ignored: `nohup`, no job control), and SIGCHLD not ignored, for the duration of a launch;
/// the previous dispositions come back on drop.
/// The handlers also write to the [`signal_notices`] pipe, which the launcher polls.
struct SignalGuard {
    old: Vec<(i32, libc::sigaction)>,
}

impl SignalGuard {
    fn install() -> SignalGuard {
        // Before the handlers: they find the pipe's write end in SIGNAL_NOTICE.
        signal_notices();
        let mut old = Vec::new();
        for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP, libc::SIGTSTP] {
            // SAFETY: sigaction is plain data; all zeroes is a valid starting point.
            let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART;
            // SAFETY: both structs are valid; the handler only stores to an atomic, which is
            // async-signal-safe. Children get default dispositions back at exec.
            let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: see above.
            if unsafe { libc::sigaction(sig, &act, &mut prev) } == 0 {
                if matches!(sig, libc::SIGHUP | libc::SIGTSTP) && prev.sa_sigaction == libc::SIG_IGN {
                    // Started with `nohup` (a hangup is to leave the job running), or where
                    // job control is off: left ignored.
                    // SAFETY: `prev` is the disposition sigaction just returned for `sig`.
                    unsafe { libc::sigaction(sig, &prev, std::ptr::null_mut()) };
                    continue;
                }
                old.push((sig, prev));
            }
        }
        // An ignored SIGCHLD (or SA_NOCLDWAIT), inherited from whatever started the launcher,
        // makes the kernel reap the ranks as they exit: their statuses would be lost, and the
        // ids of their groups free for reuse while the launcher may still signal them.
        // SAFETY: sigaction is plain data; a null new action only reads the current one.
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: see above.
        let read = unsafe { libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut prev) } == 0;
        if read && (prev.sa_sigaction == libc::SIG_IGN || prev.sa_flags & libc::SA_NOCLDWAIT != 0) {
            // SAFETY: all zeroes with SIG_DFL is the default disposition.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: a valid action for SIGCHLD.
            if unsafe { libc::sigaction(libc::SIGCHLD, &dfl, std::ptr::null_mut()) } == 0 {
                old.push((libc::SIGCHLD, prev));
            }
        }
        SignalGuard { old }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, prev) in &self.old {
            // SAFETY: `prev` is the disposition sigaction returned for `sig`.
            unsafe { libc::sigaction(*sig, prev, std::ptr::null_mut()) };
        }
    }
}

/// A job whose rank 0 is the calling process: ranks 1.. are started as children, and rank 0
/// gets its bootstrap in memory (see [`polyrail::Context::init_with_bootstrap`]). Their output goes
/// straight to this process's stdout and stderr (not line by line as with [`launch`]). For benchmark
/// harnesses and programs that start their own helpers.
pub struct EmbeddedJob {
    bootstrap: Option<Box<dyn polyrail_pmi::Bootstrap>>,
    server: Option<PmiServer>,
    children: Vec<Child>,
    /// The job id (naming the SCIF provider's job directories removed at the end).
    job: String,
}

/// Starts ranks `1..opts.ranks` of `opts.program`; the caller is rank 0 (bound to the first
/// allowed CPU when `opts.bind` is [`Bind::Core`]). With `opts.nodes`, the caller sets its own
/// node in the [`Config`](polyrail::Config) it starts with.
pub fn spawn_peers(opts: &LaunchOptions) -> Result<EmbeddedJob> {
    check_ranks(opts.ranks)?;
    let job = job_name();
    let (server_ends, mut child_ends) = socket_pairs(opts.ranks)?;
    let own = child_ends.remove(0);
    let server = PmiServer::start(&job, server_ends)?;
    let cpus = match opts.bind {
        Bind::Core => allowed_cpus(),
        Bind::None => Vec::new(),
    };
    if let Some(&cpu) = cpus.first() {
        let set = cpu_set_of(cpu);
        // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 names the calling thread.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    }
    let mut children = Vec::new();
    for (i, end) in child_ends.iter().enumerate() {
        let r = i + 1;
        let cpu = (!cpus.is_empty()).then(|| cpus[r % cpus.len()]);
        match spawn_rank(opts, &job, r as Rank, end, cpu, false, false) {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(Error::io(format!("cannot start `{}` as rank {r}", opts.program.to_string_lossy()), e));
            }
        }
    }
    drop(child_ends);
    let client = polyrail_pmi::Pmi1Client::from_stream(own, 0, opts.ranks)?;
    Ok(EmbeddedJob { bootstrap: Some(Box::new(client)), server: Some(server), children, job })
}

impl EmbeddedJob {
    /// Rank 0's bootstrap (once).
    pub fn take_bootstrap(&mut self) -> Option<Box<dyn polyrail_pmi::Bootstrap>> {
        self.bootstrap.take()
    }

    /// Waits for ranks 1.. to exit; returns the worst exit code (128 + signal for a killed one).
    /// A rank that aborts the job (PMI abort) has the others killed, as `polyrail run` does;
    /// the code is then the abort's.
    pub fn wait(mut self) -> Result<i32> {
        let (mut worst, mut abort_code) = (0, None);
        let mut left: Vec<usize> = (0..self.children.len()).collect();
        while !left.is_empty() {
            if let Some(server) = &self.server {
                while let Some(ev) = server.try_event() {
                    match ev {
                        ServerEvent::Notice(line) => output::say_line(&line),
                        ServerEvent::Aborted { rank, code, message } => {
                            output::say_line(&format!(
                                "polyrail: rank {rank} aborted the job with code {code}: {message}"
                            ));
                            // As `polyrail run` makes it an exit status (256 is not 0).
                            abort_code.get_or_insert(polyrail_pmi::abort_status(code));
                            for &i in &left {
                                let _ = self.children[i].kill();
                            }
                        }
                        _ => {}
                    }
                }
            }
            let mut still = Vec::with_capacity(left.len());
            for i in left {
                match self.children[i].try_wait().map_err(|e| Error::io("waiting for a rank", e))? {
                    Some(st) => worst = worst.max(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))),
                    None => still.push(i),
                }
            }
            left = still;
            if !left.is_empty() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.children.clear();
        Ok(abort_code.unwrap_or(worst))
    }
}

impl Drop for EmbeddedJob {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(s) = self.server.take() {
            print_notices(&s);
            s.stop();
        }
        polyrail_scif::remove_job_dirs(&self.job);
        let give_up_at = Instant::now() + OUTPUT_DRAIN;
        output::flush(|| Instant::now() >= give_up_at);
    }
}

#[cfg(test)]
mod layout_tests {
    use super::Layout;

    #[test]
    fn layouts_place_ranks_on_nodes_and_domains() {
        let l = Layout::parse(4, "2,2").unwrap();
        assert_eq!(l.nodes, [0, 0, 1, 1]);
        assert!(!l.has_devices());
        let l = Layout::parse(6, "1+2, 1+2").unwrap();
        assert_eq!(l.nodes, [0, 0, 0, 1, 1, 1]);
        assert_eq!(l.domains, [(0, 2), (1, 2), (1, 2), (0, 2), (1, 2), (1, 2)]);
        let l = Layout::parse(2, "0+1+1").unwrap();
        assert_eq!(l.domains, [(1, 3), (2, 3)]);
    }

    #[test]
    fn malformed_layouts_are_named() {
        for (ranks, spec, says) in [
            (4, "2,,2", "node 1 is empty"),
            (4, "2+x,2", "\"x\" for device 1 is not a whole number"),
            (2, "0+0,2", "node 0 (0+0) has no rank"),
            (4, "1+1", "places 2 ranks, but the job has 4"),
            (2, "1+1+1", "more than the 2 ranks"),
            (2, "-1,3", "\"-1\" for its host"),
        ] {
            let e = Layout::parse(ranks, spec).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("--layout"), "{spec}: {e}");
        }
        let many = vec!["1"; 300].join("+");
        assert!(Layout::parse(300, &many).unwrap_err().to_string().contains("at most 256"));
    }
}
