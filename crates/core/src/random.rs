//! [`random_u64`]: identifiers that tell one process's resources from another's.

/// 64 random bits (`getrandom`; where it fails, the clock mixed with the process id, which
/// still differs between two processes making one at once).
pub fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: `v` is valid for writes of 8 bytes; getrandom writes at most that many.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n == 8 {
        return v;
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32).rotate_left(17)
}
