//! [`AnonMemory`]: zeroed, page-aligned memory of the process's own, for channels and the facade
//! to register or expose (the ib rings and staging, registered buffers), and [`SharedFile`]: the
//! file behind such memory when other processes of the machine may map it.

use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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
#[derive(Debug)]
pub struct AnonMemory {
    ptr: *mut u8,
    len: usize,
    /// The memory file behind a shared mapping, and its inode number.
    file: Option<(OwnedFd, u64)>,
}

// SAFETY: the mapping is plain memory owned by this value; which thread unmaps it does not
// matter, and whoever shares its address synchronizes the accesses.
unsafe impl Send for AnonMemory {}

/// Maps `len` bytes of `fd` (or anonymous memory when `None`) read-write.
fn map(len: usize, fd: Option<RawFd>, what: &str) -> Result<*mut u8> {
    let (flags, fd) = match fd {
        Some(fd) => (libc::MAP_SHARED, fd),
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: a fresh mapping with no address hint, of an open descriptor at least `len` bytes
    // long or of anonymous memory; the result is checked.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
    if ptr == libc::MAP_FAILED {
        return Err(Error::last_os(format_args!("mapping {len} bytes for {what}")));
    }
    Ok(ptr.cast())
}

/// Creates a memory file of `len` bytes (`memfd_create`, close-on-exec), sealed against
/// shrinking and growing so that a process that maps it can never fault past its end; returns
/// it with its inode number, or the step that failed and why. Allocates nothing (the global
/// allocator of the facade calls it).
pub fn memory_file(len: usize) -> std::result::Result<(OwnedFd, u64), (&'static str, std::io::Error)> {
    let failed = |step| (step, std::io::Error::last_os_error());
    if !fits_file_size_limit(len) {
        return Err(("sizing past the file-size limit (ulimit -f)", std::io::Error::from_raw_os_error(libc::EFBIG)));
    }
    let fd = create_memfd();
    if fd < 0 {
        return Err(failed("memfd_create"));
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    // SAFETY: plain system calls on our own descriptor; `st` is written by fstat before use.
    unsafe {
        if libc::ftruncate(raw, len as libc::off_t) != 0 {
            return Err(failed("sizing"));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        if libc::fcntl(raw, libc::F_ADD_SEALS, seals) != 0 {
            return Err(failed("sealing"));
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(raw, &mut st) != 0 {
            return Err(failed("fstat"));
        }
        Ok((fd, st.st_ino))
    }
}

/// `MFD_NOEXEC_SEAL` (Linux 6.3): a memory file that can never be executed. Where
/// `vm.memfd_noexec` is 2, `memfd_create` refuses files without it; older kernels refuse the
/// flag itself (`EINVAL`).
const MFD_NOEXEC_SEAL: libc::c_uint = 0x0008;

/// A new memory file's descriptor (close-on-exec, sealable, not executable where the kernel
/// knows the flag), or -1 with `errno` set. Allocates nothing.
fn create_memfd() -> libc::c_int {
    // Whether the kernel refused MFD_NOEXEC_SEAL once (then it is not asked again). Relaxed:
    // a stale read only costs one refused call.
    static NO_NOEXEC: AtomicBool = AtomicBool::new(false);
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if !NO_NOEXEC.load(Ordering::Relaxed) {
        // SAFETY: the name is a NUL-terminated literal; the result is checked.
        let fd = unsafe { libc::memfd_create(c"polyrail-memory".as_ptr(), flags | MFD_NOEXEC_SEAL) };
        if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return fd;
        }
        NO_NOEXEC.store(true, Ordering::Relaxed);
    }
    // SAFETY: as above.
    unsafe { libc::memfd_create(c"polyrail-memory".as_ptr(), flags) }
}

/// Whether a file of `len` bytes stays within this process's file-size limit (`ulimit -f`,
/// `RLIMIT_FSIZE`): sizing a file past it sends SIGXFSZ, which ends the process before the
/// call can fail. Allocates nothing.
pub fn fits_file_size_limit(len: usize) -> bool {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is valid for writes.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } == 0;
    !read || lim.rlim_cur == libc::RLIM_INFINITY || len as u64 <= lim.rlim_cur
}

impl AnonMemory {
    /// Maps `len` bytes (at least one) of private memory; `what` names the use in the error.
    pub fn new(len: usize, what: &str) -> Result<AnonMemory> {
        let len = len.max(1);
        Ok(AnonMemory { ptr: map(len, None, what)?, len, file: None })
    }

    /// Maps `len` bytes (at least one) of a new memory file (`memfd_create`), sealed against
    /// shrinking and growing so that a process that maps it can never fault past its end;
    /// [`AnonMemory::file`] names it for those processes. Fails where memfds are missing
    /// (Linux before 3.17, some seccomp profiles); `what` names the use in the error.
    pub fn shared(len: usize, what: &str) -> Result<AnonMemory> {
        let len = len.max(1);
        let (fd, inode) = memory_file(len)
            .map_err(|(step, e)| Error::io(format_args!("{step} of a {len}-byte memory file for {what}"), e))?;
        let raw = fd.as_raw_fd();
        Ok(AnonMemory { ptr: map(len, Some(raw), what)?, len, file: Some((fd, inode)) })
    }

    /// Start of the memory.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes (at least one).
    pub fn len(&self) -> usize {
        self.len
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

impl Drop for AnonMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is the mapping made in `new` or `shared`, unmapped once; the
        // file (if any) closes after, when `self.file` drops.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
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
        // SAFETY: plain queries of an open descriptor; `st` is written by fstat.
        let (size, ino, seals) = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(f.fd, &mut st), 0);
            (st.st_size, st.st_ino, libc::fcntl(f.fd, libc::F_GET_SEALS))
        };
        assert_eq!((size, ino), (5000, f.inode));
        assert_eq!(seals & libc::F_SEAL_SHRINK, libc::F_SEAL_SHRINK);
        // SAFETY: as above: ftruncate on our own descriptor.
        assert_ne!(unsafe { libc::ftruncate(f.fd, 1) }, 0, "a sealed file must not shrink");
        assert!(AnonMemory::new(10, "a test").unwrap().file().is_none());
    }
}
