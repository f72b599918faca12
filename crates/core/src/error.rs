//! The one error type of polyrail.

use std::fmt;

/// A rank in the job, from 0 to `size - 1`.
pub type Rank = u32;

/// Everything that can go wrong in polyrail, with enough detail to name the fix.
///
/// Its `Debug` is its message (as `Display`), so that a `main` returning [`Result`] prints
/// what went wrong in words rather than the fields of a variant.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `POLYRAIL_*` variable (or a command-line value) is unknown or has a bad value.
    #[error("{var}={value:?} is not accepted: {accepted}")]
    Config {
        /// The variable (or option) name.
        var: String,
        /// The value that was given.
        value: String,
        /// What would have been accepted.
        accepted: String,
    },
    /// A message was longer than the receive buffer that matched it.
    #[error(
        "message truncated: {len} bytes from rank {from} (tag {tag}) do not fit the {capacity}-byte receive buffer"
    )]
    Truncated {
        /// Sender of the message.
        from: Rank,
        /// Tag of the message.
        tag: u32,
        /// Length of the message.
        len: usize,
        /// Size of the receive buffer.
        capacity: usize,
    },
    /// A peer exited, was killed or stopped answering.
    #[error("rank {rank} was lost: {why}")]
    PeerLost {
        /// The lost peer.
        rank: Rank,
        /// What was observed.
        why: String,
    },
    /// A peer finished normally (finalized and exited) while something still needed it.
    #[error("rank {rank} has finished (finalized and exited); nothing more can come from it or go to it")]
    PeerFinished {
        /// The finished peer.
        rank: Rank,
    },
    /// A peer sent bytes that break the protocol (corrupted slot, bad key, bad length).
    #[error("protocol violation from rank {peer}: {what}")]
    Protocol {
        /// The peer whose bytes were rejected.
        peer: Rank,
        /// What was wrong.
        what: String,
    },
    /// A transport failed to do what it advertised.
    #[error("{kind} transport: {what}")]
    Transport {
        /// Short name of the transport (`shm`, `cma`, ...).
        kind: &'static str,
        /// What went wrong.
        what: String,
    },
    /// Talking to the process manager (PMI) failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// A rank is out of range or a request is unknown.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No enabled transport can reach a peer.
    #[error("no channel carries messages to rank {rank}: {why}")]
    Unreachable {
        /// The peer.
        rank: Rank,
        /// Why every transport declined.
        why: String,
    },
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What polyrail was doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Error {
    /// Builds an [`Error::Io`] from the last OS error.
    pub fn last_os(context: impl fmt::Display) -> Self {
        Error::Io { context: context.to_string(), source: std::io::Error::last_os_error() }
    }

    /// Builds an [`Error::Io`] from an I/O error.
    pub fn io(context: impl fmt::Display, source: std::io::Error) -> Self {
        Error::Io { context: context.to_string(), source }
    }

    /// Builds an [`Error::Protocol`].
    pub fn protocol(peer: Rank, what: impl fmt::Display) -> Self {
        Error::Protocol { peer, what: what.to_string() }
    }

    /// Builds an [`Error::Config`].
    pub fn config(var: impl Into<String>, value: impl Into<String>, accepted: impl Into<String>) -> Self {
        Error::Config { var: var.into(), value: value.into(), accepted: accepted.into() }
    }

    /// A copy of this error, for reporting one failure to several requests.
    ///
    /// I/O errors keep their kind and message.
    pub fn duplicate(&self) -> Self {
        match self {
            Error::Config { var, value, accepted } => {
                Error::Config { var: var.clone(), value: value.clone(), accepted: accepted.clone() }
            }
            Error::Truncated { from, tag, len, capacity } => {
                Error::Truncated { from: *from, tag: *tag, len: *len, capacity: *capacity }
            }
            Error::PeerLost { rank, why } => Error::PeerLost { rank: *rank, why: why.clone() },
            Error::PeerFinished { rank } => Error::PeerFinished { rank: *rank },
            Error::Protocol { peer, what } => Error::Protocol { peer: *peer, what: what.clone() },
            Error::Transport { kind, what } => Error::Transport { kind, what: what.clone() },
            Error::Bootstrap(s) => Error::Bootstrap(s.clone()),
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::Unreachable { rank, why } => Error::Unreachable { rank: *rank, why: why.clone() },
            Error::Io { context, source } => {
                Error::Io { context: context.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
        }
    }
}

/// polyrail's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One line for `err` and its sources, joined by `: `, leaving out a source whose text the line
/// has already (an [`Error::Io`] shows its OS error and also gives it as its source).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
        next = e.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_says_each_cause_once() {
        let io = Error::io("creating the PMI socket of rank 3", std::io::Error::from_raw_os_error(24));
        let line = error_chain(&io);
        assert_eq!(line.matches("os error 24").count(), 1, "{line}");
        assert!(line.starts_with("creating the PMI socket of rank 3: "), "{line}");
    }

    /// `main` returning a polyrail `Result` prints `Error: ` and the error's `Debug`: the
    /// message, not the variant's fields.
    #[test]
    fn debug_is_the_message() {
        let e = Error::config("POLYRAIL_LOG", "loud", "error, warn, info, debug or trace");
        assert_eq!(format!("{e:?}"), "POLYRAIL_LOG=\"loud\" is not accepted: error, warn, info, debug or trace");
        assert_eq!(format!("{e:?}"), e.to_string());
    }
}
