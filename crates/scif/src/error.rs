//! [`ScifError`]: libscif's errors, each with a message naming what was wrong.

use rustix::io::Errno;

/// What a SCIF call failed with: the errno libscif would set ([`ScifError::errno`]) and a message
/// naming the offset, length, window, port or peer at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScifError {
    /// `ENXIO`: a range outside every registered window, or a node or port that is not there.
    #[error("ENXIO: {0}")]
    Enxio(String),
    /// `EACCES`: a window's protection forbids the access, or a port below 1024 without privilege.
    #[error("EACCES: {0}")]
    Eacces(String),
    /// `ECONNRESET`: the peer closed its endpoint or died.
    #[error("ECONNRESET: {0}")]
    Econnreset(String),
    /// `ENOTCONN`: the endpoint is not connected.
    #[error("ENOTCONN: {0}")]
    Enotconn(String),
    /// `ENODEV`: the node is not in the job.
    #[error("ENODEV: {0}")]
    Enodev(String),
    /// `EADDRINUSE`: the port is bound, or a fixed window overlaps one registered before.
    #[error("EADDRINUSE: {0}")]
    Eaddrinuse(String),
    /// `EINVAL`: an argument out of range (alignment, length, flags) or a call in the wrong state.
    #[error("EINVAL: {0}")]
    Einval(String),
    /// `EAGAIN`: nothing to take now (a non-blocking accept with no connection pending).
    #[error("EAGAIN: {0}")]
    Eagain(String),
    /// `ECONNREFUSED`: nobody listens at the port.
    #[error("ECONNREFUSED: {0}")]
    Econnrefused(String),
    /// `EISCONN`: the endpoint is connected already.
    #[error("EISCONN: {0}")]
    Eisconn(String),
    /// `ENOSPC`: no port is free.
    #[error("ENOSPC: {0}")]
    Enospc(String),
    /// `ENOMEM`: the window space or memory ran out.
    #[error("ENOMEM: {0}")]
    Enomem(String),
    /// A system call of the provider failed: what it was doing and the OS error.
    #[error("{what}: {}", std::io::Error::from_raw_os_error(*errno))]
    Os {
        /// What the provider was doing.
        what: String,
        /// The OS error number.
        errno: i32,
    },
}

impl ScifError {
    /// The errno libscif sets for this error (`ENXIO`, `EACCES`, ...), as `raw_os_error` gives.
    pub fn errno(&self) -> i32 {
        let e = match self {
            ScifError::Enxio(_) => Errno::NXIO,
            ScifError::Eacces(_) => Errno::ACCESS,
            ScifError::Econnreset(_) => Errno::CONNRESET,
            ScifError::Enotconn(_) => Errno::NOTCONN,
            ScifError::Enodev(_) => Errno::NODEV,
            ScifError::Eaddrinuse(_) => Errno::ADDRINUSE,
            ScifError::Einval(_) => Errno::INVAL,
            ScifError::Eagain(_) => Errno::AGAIN,
            ScifError::Econnrefused(_) => Errno::CONNREFUSED,
            ScifError::Eisconn(_) => Errno::ISCONN,
            ScifError::Enospc(_) => Errno::NOSPC,
            ScifError::Enomem(_) => Errno::NOMEM,
            ScifError::Os { errno, .. } => return *errno,
        };
        e.raw_os_error()
    }

    /// A failed system call: `what` the provider was doing, and the error.
    pub(crate) fn os(what: impl std::fmt::Display, e: impl Into<std::io::Error>) -> ScifError {
        let e: std::io::Error = e.into();
        ScifError::Os { what: what.to_string(), errno: e.raw_os_error().unwrap_or(Errno::IO.raw_os_error()) }
    }
}

impl From<ScifError> for std::io::Error {
    fn from(e: ScifError) -> std::io::Error {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno()).kind(), e)
    }
}

/// A SCIF call's result.
pub type Result<T, E = ScifError> = std::result::Result<T, E>;
