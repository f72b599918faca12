//! polyrail-core: the channel-independent heart of polyrail.
//!
//! - [`Transport`]: the one trait every channel implements, with its attributes and cost model;
//! - [`engine`]: the sans-IO protocol engine (tag matching, per-pair ordering, eager and
//!   rendezvous state machines), driven by `handle_*` calls and read through `poll_*` calls;
//! - [`policy`]: topology classes and per-peer route tables (size range -> channel, protocol);
//! - [`adapt`]: the run-time adaptations that move single sends between eager and single copy;
//! - [`Config`]: every `POLYRAIL_*` setting, parsed once.
//!
//! It contains no channel: those live in `polyrail-shm`, `polyrail-ib`, ...
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod adapt;
pub mod config;
pub mod engine;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod header;
mod memory;
pub mod observe;
pub mod policy;
mod random;
mod size;
pub mod sweep;
mod transport;

pub use config::Config;
pub use error::{error_chain, Error, Rank, Result};
pub use header::{Envelope, Header, PacketKind};
pub use memory::{allow_peer_reads, fits_file_size_limit, memory_file, named_memory_file, AnonMemory, SharedFile};
pub use random::random_u64;
pub use size::{format_size, parse_size};
pub use transport::{
    host_identity, Address, Caps, ChannelFactory, ChannelStart, Cost, Issued, Lifetime, MemHandle, OneSided, OpId,
    Opened, PeerAccess, PeerInfo, Reach, Region, RegionMut, RemoteKey, RndvFrom, Sink, Transport, TransportAttr,
    TransportKind, Wakeup,
};
