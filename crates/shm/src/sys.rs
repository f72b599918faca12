//! Thin wrappers over the few system calls the node-local channels need: process liveness
//! (`pidfd_open` + `poll`), futexes on shared memory, the global membarrier.

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags};
use rustix::thread::{futex, MembarrierCommand, MembarrierQuery};
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// This process's effective user id.
pub(crate) fn uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// `pid` as the kernel's pid type: `None` for 0 and for values past `i32::MAX` (which would be
/// a process group or mean "this process" to the kernel).
fn kernel_pid(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

/// This process's pid namespace: the inode of `/proc/self/ns/pid` (0 when it cannot be read).
pub(crate) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// A handle that tells when a process has exited: a pidfd where the kernel has one, else the pid
/// probed with `kill(pid, 0)`.
#[derive(Debug)]
pub(crate) enum ProcessWatch {
    /// `pidfd_open(pid)`: readable once the process exited (Linux 5.3+).
    PidFd(OwnedFd),
    /// Fallback: `kill(pid, 0)` fails with `ESRCH` once the process is gone (pid reuse can hide
    /// an exit; only used where pidfds are missing).
    Kill(u32),
}

impl ProcessWatch {
    /// Starts watching `pid`. Never fails: falls back to `kill(pid, 0)` without pidfds.
    pub(crate) fn new(pid: u32) -> ProcessWatch {
        match kernel_pid(pid).map(|p| rustix::process::pidfd_open(p, PidfdFlags::empty())) {
            Some(Ok(fd)) => ProcessWatch::PidFd(fd),
            _ => ProcessWatch::Kill(pid),
        }
    }

    /// Whether the process has exited (never blocks).
    pub(crate) fn exited(&self) -> bool {
        match self {
            ProcessWatch::PidFd(fd) => {
                let mut pfd = [PollFd::new(fd, PollFlags::IN)];
                // A zero timeout: poll returns at once.
                let n = rustix::event::poll(&mut pfd, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })).unwrap_or(0);
                n > 0 && pfd[0].revents().intersects(PollFlags::IN | PollFlags::HUP)
            }
            ProcessWatch::Kill(pid) => !pid_alive(*pid),
        }
    }
}

/// Whether a process with this pid exists (`kill(pid, 0)` does not fail with `ESRCH`).
pub(crate) fn pid_alive(pid: u32) -> bool {
    kernel_pid(pid).is_some_and(|p| rustix::process::test_kill_process(p) != Err(Errno::SRCH))
}

/// Sleeps while `*word == expected`, at most `timeout` (futex on shared memory: the word may be
/// in a mapping other processes wake through, so the futex is not process-private).
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // Errors (EAGAIN when the value changed, EINTR, ETIMEDOUT) all mean "stop sleeping", which is
    // what the caller does next anyway.
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Registers this process, once, for [`global_barrier`] (membarrier's `GLOBAL_EXPEDITED`);
/// whether the kernel offers it and took the registration (a seccomp filter or an old kernel
/// may not).
pub(crate) fn global_barrier_registered() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // The query gives no commands when it fails.
        rustix::thread::membarrier_query().contains(MembarrierQuery::GLOBAL_EXPEDITED)
            && rustix::thread::membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok()
    })
}

/// Makes every running thread of every process registered through
/// [`global_barrier_registered`] pass a full memory barrier before this returns (a thread not
/// running passes one when it is switched in); `false` when the call failed.
pub(crate) fn global_barrier() -> bool {
    rustix::thread::membarrier(MembarrierCommand::GlobalExpedited).is_ok()
}

/// Wakes one process sleeping in [`futex_wait`] on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), 1);
}
