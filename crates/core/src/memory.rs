//! [`AnonMemory`]: zeroed, page-aligned memory of the process's own, for channels and the facade
//! to register or expose (the ib rings and staging, registered buffers), and [`SharedFile`]: the
//! file behind such memory when other processes of the machine may map it.

use crate::error::{Error, Result};
use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// A memory file that other processes of this machine may map: a sealed memfd, reachable as
/// `/proc/<owner pid>/fd/<fd>` by processes allowed to read the owner's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedFile {
    /// The owner's descriptor of the file.
    pub fd: RawFd,
    /// The file's inode number: tells the file apart from a later one that reuses `fd`.
    pub inode: u64,
}

/// Zero-filled, page-aligned memory from `mmap`, unmapped on drop: private anonymous memory
/// ([`AnonMemory::new`]) or a sealed memory file mapped shared ([`AnonMemory::shared`]).
/// A raw mapping: its bytes are only reached through [`AnonMemory::ptr`], and whoever shares
/// that address (other threads, other processes, an adapter) synchronizes the accesses.
#[derive(Debug)]
pub struct AnonMemory {
    /// Declared before `file`: unmapped before the file closes.
    map: MmapRaw,
    /// The memory file behind a shared mapping, and its inode number.
    file: Option<(OwnedFd, u64)>,
}

/// Creates a memory file of `len` bytes (`memfd_create`, close-on-exec), sealed against
/// shrinking and growing so that a process that maps it can never fault past its end; returns
/// it with its inode number, or the step that failed and why. Allocates nothing (the global
/// allocator of the facade calls it).
pub fn memory_file(len: usize) -> std::result::Result<(OwnedFd, u64), (&'static str, std::io::Error)> {
    named_memory_file(c"polyrail-memory", len)
}

/// [`memory_file`] under another name (shown as `/memfd:<name>` in `/proc/<pid>/fd` and
/// `/proc/<pid>/maps`, so that each use can be told apart there).
pub fn named_memory_file(
    name: &CStr,
    len: usize,
) -> std::result::Result<(OwnedFd, u64), (&'static str, std::io::Error)> {
    // `Errno` to `io::Error` is a raw OS error: no allocation.
    let failed = |step| move |e: Errno| (step, std::io::Error::from(e));
    if !fits_file_size_limit(len) {
        return Err(("sizing past the file-size limit (ulimit -f)", Errno::FBIG.into()));
    }
    let fd = create_memfd(name).map_err(failed("memfd_create"))?;
    rustix::fs::ftruncate(&fd, len as u64).map_err(failed("sizing"))?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(failed("sealing"))?;
    let inode = rustix::fs::fstat(&fd).map_err(failed("fstat"))?.st_ino;
    Ok((fd, inode))
}

/// A new memory file (close-on-exec, sealable, not executable where the kernel knows
/// `MFD_NOEXEC_SEAL`). Allocates nothing (the name is a C string already).
fn create_memfd(name: &CStr) -> rustix::io::Result<OwnedFd> {
    // `MFD_NOEXEC_SEAL` (Linux 6.3): a memory file that can never be executed. Where
    // `vm.memfd_noexec` is 2, `memfd_create` refuses files without it; older kernels refuse the
    // flag itself (`EINVAL`). Whether the kernel refused it once (then it is not asked again).
    // Relaxed: a stale read only costs one refused call.
    static NO_NOEXEC: AtomicBool = AtomicBool::new(false);
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    if !NO_NOEXEC.load(Ordering::Relaxed) {
        match rustix::fs::memfd_create(name, flags | MemfdFlags::NOEXEC_SEAL) {
            Err(Errno::INVAL) => NO_NOEXEC.store(true, Ordering::Relaxed),
            done => return done,
        }
    }
    rustix::fs::memfd_create(name, flags)
}

/// Whether a file of `len` bytes stays within this process's file-size limit (`ulimit -f`,
/// `RLIMIT_FSIZE`): sizing a file past it sends SIGXFSZ, which ends the process before the
/// call can fail. Allocates nothing.
pub fn fits_file_size_limit(len: usize) -> bool {
    // Raw libc: rustix's `getrlimit` takes the call for infallible (it panics in debug builds
    // when the call fails, and uses the unwritten result otherwise), and this runs inside the
    // facade's global allocator, where a refusal (a seccomp filter) must mean "no known limit".
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is valid for writes; the result is checked before `lim` is read.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } == 0;
    !read || lim.rlim_cur == libc::RLIM_INFINITY || len as u64 <= lim.rlim_cur
}

impl AnonMemory {
    /// Maps `len` bytes (at least one) of private memory; `what` names the use in the error.
    pub fn new(len: usize, what: &str) -> Result<AnonMemory> {
        let len = len.max(1);
        let map = MmapOptions::new().len(len).map_anon().map_err(|e| mapping_failed(len, what, e))?;
        Ok(AnonMemory { map: map.into(), file: None })
    }

    /// Maps `len` bytes (at least one) of a new memory file (`memfd_create`), sealed against
    /// shrinking and growing so that a process that maps it can never fault past its end;
    /// [`AnonMemory::file`] names it for those processes. Fails where memfds are missing
    /// (Linux before 3.17, some seccomp profiles); `what` names the use in the error.
    pub fn shared(len: usize, what: &str) -> Result<AnonMemory> {
        let len = len.max(1);
        let (fd, inode) = memory_file(len)
            .map_err(|(step, e)| Error::io(format_args!("{step} of a {len}-byte memory file for {what}"), e))?;
        // Shared and read-write, of a file exactly `len` bytes long that can neither shrink nor
        // grow: no access within the mapping can fault past the file's end.
        let map = MmapOptions::new().len(len).map_raw(&fd).map_err(|e| mapping_failed(len, what, e))?;
        Ok(AnonMemory { map, file: Some((fd, inode)) })
    }

    /// Start of the memory.
    pub fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Length in bytes (at least one).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: a mapping holds at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The memory file behind memory from [`AnonMemory::shared`] (open while `self` lives).
    pub fn file(&self) -> Option<SharedFile> {
        self.file.as_ref().map(|(fd, inode)| SharedFile { fd: fd.as_raw_fd(), inode: *inode })
    }
}

fn mapping_failed(len: usize, what: &str, e: std::io::Error) -> Error {
    Error::io(format_args!("mapping {len} bytes for {what}"), e)
}

/// Lets processes of this user read and write this process's memory with `process_vm_readv`/
/// `writev` (Yama's `PR_SET_PTRACER_ANY`) and says whether they can: not under Yama's
/// `ptrace_scope` 2 (admin only) or 3 (none).
pub fn allow_peer_reads() -> bool {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    match scope.as_deref().map(str::trim) {
        None | Some("0") => true,
        Some("1") => rustix::process::set_ptracer(rustix::process::PTracer::Any).is_ok(),
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a file-size limit, a memory file past it is an error naming the limit: sizing it
    /// sent SIGXFSZ, which ended the process (a `Vec` of the `MappedHeap` could do that).
    #[test]
    fn a_memory_file_past_the_file_size_limit_is_an_error() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -f 16 && exec \"$0\" --exact memory::tests::helper_file_past_the_limit --ignored")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    #[test]
    #[ignore = "run by a_memory_file_past_the_file_size_limit_is_an_error under `ulimit -f 16`"]
    fn helper_file_past_the_limit() {
        assert!(!fits_file_size_limit(1 << 20), "run me under ulimit -f 16");
        let e = AnonMemory::shared(1 << 20, "a test").map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("ulimit -f"), "{e}");
        AnonMemory::shared(4096, "a test").unwrap();
    }

    #[test]
    fn shared_memory_is_a_sealed_file_of_its_size() {
        let m = AnonMemory::shared(5000, "a test").unwrap();
        let f = m.file().unwrap();
        // SAFETY: `m` is 5000 writable bytes.
        unsafe { m.ptr().add(4999).write(7) };
        // SAFETY: `f.fd` stays open while `m` lives.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(f.fd) };
        let st = rustix::fs::fstat(fd).unwrap();
        assert_eq!((st.st_size, st.st_ino), (5000, f.inode));
        assert!(rustix::fs::fcntl_get_seals(fd).unwrap().contains(SealFlags::SHRINK | SealFlags::GROW));
        assert!(rustix::fs::ftruncate(fd, 1).is_err(), "a sealed file must not shrink");
        assert!(AnonMemory::new(10, "a test").unwrap().file().is_none());
    }
}
