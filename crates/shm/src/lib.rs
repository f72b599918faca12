//! polyrail-shm: the node-local channels of polyrail.
//!
//! - [`ShmTransport`] (`shm`): active messages through shared memory. One single-producer
//!   single-consumer ring per ordered pair, in the sender's segment: a 128-byte record per
//!   message (the header, compact for whole eager messages, and payloads up to 112 bytes) and
//!   64-byte body slots for payloads up to 256 bytes; larger ones go in send cells of the
//!   sender's pool that the record names (Chai 2009, §3.2). Arrivals are handed to the sink
//!   borrowed from the ring or the cell: the only copies are the sender's copy in and the
//!   receiver's copy out.
//! - [`CmaTransport`] (`cma`): one-sided `get`/`put` with `process_vm_readv`/`process_vm_writev`
//!   (kernel single copy), after a real probe of each peer.
//! - [`Loopback`] (`self`): messages and one-sided copies within the process.
//!
//! All three implement [`polyrail_core::Transport`]. Bytes written by peers (records, cell
//! indices, addresses, keys) are checked before use: a faulty peer gets an
//! [`polyrail_core::Error::Protocol`] or a refusal, never an out-of-bounds access.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod cells;
mod cma;
mod fill_rate;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod key;
mod loopback;
mod ring;
mod segment;
pub mod settings;
mod shm;
mod sys;

pub use cma::CmaTransport;
pub use loopback::Loopback;
pub use settings::{CmaSettings, ShmSettings};
pub use shm::ShmTransport;

use polyrail_core::{ChannelFactory, ChannelStart, Opened, Result, TransportKind};

/// The shared-memory channel's name.
pub const SHM: TransportKind = TransportKind::new("shm");
/// The kernel single-copy channel's name.
pub const CMA: TransportKind = TransportKind::new("cma");

/// Starts `self` (loopback) in every process.
pub struct LoopbackFactory;

impl ChannelFactory for LoopbackFactory {
    fn kind(&self) -> TransportKind {
        TransportKind::SELF
    }
    fn open(&self, start: &ChannelStart<'_>) -> Result<Opened> {
        Ok(Opened::Channel(Box::new(Loopback::new(start.rank))))
    }
}

/// Starts `shm` in a process that has peers.
pub struct ShmFactory;

impl ChannelFactory for ShmFactory {
    fn kind(&self) -> TransportKind {
        SHM
    }
    fn variables(&self) -> Vec<polyrail_core::config::VarInfo> {
        polyrail_core::config::infos(settings::VARS)
    }
    fn check_settings(&self, config: &polyrail_core::Config) -> Result<()> {
        ShmSettings::from_config(config).map(drop)
    }
    fn open(&self, start: &ChannelStart<'_>) -> Result<Opened> {
        if let Some(absent) = start.without_peers() {
            return Ok(absent);
        }
        Ok(Opened::Channel(Box::new(ShmTransport::new(start.config, start.job_id, start.rank, start.size)?)))
    }
}

/// Starts `cma` in a process that has peers.
pub struct CmaFactory;

impl ChannelFactory for CmaFactory {
    fn kind(&self) -> TransportKind {
        CMA
    }
    fn variables(&self) -> Vec<polyrail_core::config::VarInfo> {
        polyrail_core::config::infos(settings::CMA_VARS)
    }
    fn check_settings(&self, config: &polyrail_core::Config) -> Result<()> {
        CmaSettings::from_config(config).map(drop)
    }
    fn effective(
        &self,
        config: &polyrail_core::Config,
        given: &dyn Fn(&str) -> Option<String>,
    ) -> Vec<polyrail_core::config::Effective> {
        match CmaSettings::from_config(config) {
            Ok(s) => s.effective(given),
            Err(_) => polyrail_core::config::effective_of(&self.variables(), given),
        }
    }
    fn open(&self, start: &ChannelStart<'_>) -> Result<Opened> {
        if let Some(absent) = start.without_peers() {
            return Ok(absent);
        }
        let settings = CmaSettings::from_config(start.config)?;
        Ok(Opened::Channel(Box::new(CmaTransport::new().with_rndv_from(settings.rndv_from()))))
    }
}
