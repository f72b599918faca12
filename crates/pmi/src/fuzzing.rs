//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.
//!
//! The PMI wire decoders are public already ([`crate::wire`]); this adds [`Server`], the PMI
//! server's request handling without its thread and sockets, fed bytes as if a rank sent them.
#![doc(hidden)]

use std::os::unix::net::UnixStream;
use std::sync::mpsc;

use polyrail_core::Result;

use crate::server::{ServerEvent, State};

/// The state of a PMI server for a job of a few ranks, fed bytes in place of its reads.
pub struct Server {
    state: State,
    events: mpsc::Receiver<ServerEvent>,
    /// The ranks' ends of their sockets and the launcher's end of the event notices, kept
    /// open as long as the server (it writes only the notices here).
    _sockets: Vec<UnixStream>,
}

impl Server {
    /// A server for `size` ranks of job `job`.
    pub fn new(job: &str, size: usize) -> Result<Server> {
        let mut conns = Vec::new();
        let mut ranks = Vec::new();
        for _ in 0..size {
            let (a, b) = UnixStream::pair().map_err(|e| polyrail_core::Error::io("creating a socket pair", e))?;
            conns.push(a);
            ranks.push(b);
        }
        let (tx, events) = mpsc::channel();
        let (state, notices) = State::for_fuzzing(job, conns, tx)?;
        ranks.push(notices);
        Ok(Server { state, events, _sockets: ranks })
    }

    /// Rank `rank` sent `bytes`; `false` once the server closed its connection.
    pub fn feed(&mut self, rank: usize, bytes: &[u8]) -> bool {
        self.state.serve_bytes(rank, bytes)
    }

    /// The answers queued to `rank` since the last call.
    pub fn answers(&mut self, rank: usize) -> Vec<u8> {
        self.state.take_answers(rank)
    }

    /// The events for the launcher since the last call.
    pub fn events(&mut self) -> Vec<ServerEvent> {
        self.events.try_iter().collect()
    }
}
