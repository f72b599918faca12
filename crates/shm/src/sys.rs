//! Thin wrappers over the few system calls the node-local channels need: process liveness (`pidfd_open` + `poll`), `errno` text.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// This process's effective user id.
pub(crate) fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
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
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
        // is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd >= 0 {
            // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
            ProcessWatch::PidFd(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
        } else {
            ProcessWatch::Kill(pid)
        }
    }

    /// Whether the process has exited (never blocks).
    pub(crate) fn exited(&self) -> bool {
        match self {
            ProcessWatch::PidFd(fd) => {
                let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: `pfd` is one valid pollfd; timeout 0 makes poll return at once.
                let n = unsafe { libc::poll(&mut pfd, 1, 0) };
                n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0
            }
            ProcessWatch::Kill(pid) => !pid_alive(*pid),
        }
    }
}

/// Whether a process with this pid exists (`kill(pid, 0)` does not fail with `ESRCH`).
pub(crate) fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Sleeps while `*word == expected`, at most `timeout` (futex on shared memory: the word may be
/// in a mapping other processes wake through).
pub(crate) fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout: std::time::Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; the kernel only reads
    // it and the timespec. Errors (EAGAIN when the value changed, EINTR, ETIMEDOUT) all mean
    // "stop sleeping", which is what the caller does next anyway.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

/// membarrier(2) commands (linux/membarrier.h).
const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_long = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_long = 1 << 2;

/// Registers this process, once, for [`global_barrier`] (membarrier's `GLOBAL_EXPEDITED`);
/// whether the kernel offers it and took the registration (a seccomp filter or an old kernel
/// may not).
pub(crate) fn global_barrier_registered() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: membarrier takes no pointers; an unknown command or a refused call only returns
        // an error.
        unsafe {
            let cmds = libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0u32, 0i32);
            cmds > 0
                && cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED != 0
                && libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0u32, 0i32) == 0
        }
    })
}

/// Makes every running thread of every process registered through
/// [`global_barrier_registered`] pass a full memory barrier before this returns (a thread not
/// running passes one when it is switched in); `false` when the call failed.
pub(crate) fn global_barrier() -> bool {
    // SAFETY: as in global_barrier_registered.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0u32, 0i32) == 0 }
}

/// Wakes one process sleeping in [`futex_wait`] on `word`.
pub(crate) fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: as for futex_wait; FUTEX_WAKE does not access user memory beyond the address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1, 0usize, 0usize, 0u32);
    }
}
