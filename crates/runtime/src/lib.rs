//! polyrail-runtime: the I/O half of polyrail.
//!
//! - [`Driver`]: runs the sans-IO engine over the channels — executes its actions, polls the
//!   channels in the polling plan's order, queues sends a full channel refused (per-peer
//!   backpressure), checks liveness and waits (poll, then sleep on a doorbell);
//! - [`Job`]: brings a process's part of a job up — bootstrap, the channels of a registry of
//!   [`polyrail_core::ChannelFactory`]s, address exchange, route tables;
//! - [`topology`]: hwloc's view of the machine and where the RDMA devices sit;
//! - [`log`]: `POLYRAIL_LOG` on standard error, without a subscriber crate.
//!
//! It depends on the core and the bootstrap, never on a channel crate: the facade hands it the
//! channels' factories.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod driver;
mod job;
pub mod log;
pub mod topology;

pub use driver::{Driver, ParkedEnd};
pub use job::{check_settings, domain_name, ChannelReport, Job, JobReport, PeerReport, MAX_RANKS};
