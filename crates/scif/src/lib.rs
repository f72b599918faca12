//! polyrail-scif: the libscif user API (Intel MPSS's `scif.h`) in Rust, over a software provider.
//!
//! SCIF connects the host (node 0) and the co-processors (nodes 1..) of a machine: endpoints
//! that are file descriptors, ports, short control messages, registered windows, RMAs between
//! them by DMA or CPU, fences and mappings of a peer's window. This crate gives that API
//! ([`Endpoint`], [`poll`], [`Fabric::get_node_ids`]) with libscif's semantics and errors
//! ([`ScifError`], [`ScifError::errno`]).
//!
//! The provider is a software emulation, and says so ([`Fabric::describe`]): endpoints are
//! Unix sockets named in a directory of the job; windows are memory files ([`Memory`]) passed
//! to the peer once and mapped there, so RMAs and `mmap` are copies between mappings, each
//! checked against the window tables; the DMA engine is a thread of the process whose CPU time
//! is reported ([`DmaStats`]), RMAs complete later and, in [`DmaMode::Reverse`], out of order on
//! purpose; a [`Pacer`] decides when a transfer completes ([`ScifPacer`]: the link model of
//! `polyrail-link`). Ordinary memory can be registered in place
//! ([`Endpoint::register_in_place`]), read-only: the peer's DMA engine reads it with the kernel's
//! cross-process copy, as hardware DMA reads pinned pages.
//!
//! The `scif` channel ([`ScifChannel`], started by [`ScifFactory`]) is polyrail's transport
//! between the host and the devices of a node on this API: eager messages through rings in
//! peer-mapped windows, one-sided `get`/`put` by the provider's DMA engine. Its variables and
//! the provider's are [`settings::VARS`].
//!
//! Records a peer sends (windows, offsets, files, counters) are checked before use: a forged
//! window is refused ([`Endpoint::refusals`]), and no RMA reads or writes outside a window.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod channel;
mod conn;
mod dma;
mod endpoint;
mod error;
mod fabric;
mod flags;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod memory;
mod pacing;
mod ring;
pub mod settings;
mod window;
mod wire;

pub use channel::{ScifChannel, ScifFactory, SCIF};
pub use dma::{DmaMode, DmaStats, Pacer, Transfer, Unpaced};
pub use endpoint::{poll, Endpoint, Mark, PeerMap, PollEp};
pub use error::{Result, ScifError};
pub use fabric::{remove_job_dirs, Fabric, FabricConfig, EPHEMERAL_PORT_FIRST, PRIVILEGED_PORT_LIMIT, PROVIDER};
pub use flags::{AcceptFlags, FenceFlags, MapFlags, MsgFlags, PollEvents, PortId, Prot, RmaFlags};
pub use memory::{page_size, Memory};
pub use pacing::{ScifPacer, STORE_QUEUE};
