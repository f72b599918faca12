//! polyrail: messages between the processes of an HPC job, over the best channel per peer.
//!
//! ```no_run
//! use polyrail::{Context, Source, TagMatch};
//! let mut ctx = Context::init()?;
//! if ctx.rank() == 0 {
//!     ctx.send(1, 7, b"hello")?;
//!     ctx.send_typed(1, 8, &[1.5f64, -2.0])?;
//! } else if ctx.rank() == 1 {
//!     let mut buf = [0u8; 16];
//!     let st = ctx.recv(Source::Any, TagMatch::Tag(7), &mut buf)?;
//!     assert_eq!(&buf[..st.len], b"hello");
//!     let mut xs = [0.0f64; 2];
//!     ctx.recv_typed(0, 8, &mut xs)?;
//!     assert_eq!(xs, [1.5, -2.0]);
//! }
//! # Ok::<(), polyrail::Error>(())
//! ```
//!
//! Start the processes with `polyrail run -n 4 ./program` (or `mpiexec.hydra`, or Slurm's
//! `srun --mpi=pmi2`); steer with `POLYRAIL_*` variables (see [`config::VARS`]); see which
//! channel carries what with `polyrail info`.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod buffer;
mod comm;
mod context;
mod dropped;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod heap;
mod pod;
mod scope;
mod space;

pub use buffer::RegisteredBuffer;
pub use bytemuck::{self, Pod};
pub use comm::{Comm, CommKind, Within};
pub use context::{Cancel, Completion, Context, Request, World};
pub use heap::MappedHeap;
pub use polyrail_core::engine::{Source, Status, TagMatch};
pub use polyrail_core::policy::{topology::TopoClass, ChannelId, PeerRoute, Protocol, RouteEntry};
pub use polyrail_core::{
    config, error_chain, format_size, host_identity, parse_size, Config, Error, Rank, Reach, Result, TransportKind,
};
pub use polyrail_pmi::Bootstrap;
pub use polyrail_runtime::topology::DeviceLocality;
pub use polyrail_runtime::{domain_name, ChannelReport, JobReport, PeerReport};
pub use scope::{Scope, ScopedRequest};
pub use space::{InSpace, Space};

/// The README's Rust examples, compiled and run with the doctests so they stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;

/// The channels this build registers, in the order of their channel ids: `self`, `shm` and
/// `cma` always, `scif` with the `scif` feature and `ib` with the `ib` feature (both on by
/// default). `scif` comes before `ib`: between the host and a device of one node, where both
/// reach, the first with active messages carries them.
pub fn channels() -> Vec<&'static dyn polyrail_core::ChannelFactory> {
    let mut list: Vec<&'static dyn polyrail_core::ChannelFactory> =
        vec![&polyrail_shm::LoopbackFactory, &polyrail_shm::ShmFactory, &polyrail_shm::CmaFactory];
    #[cfg(feature = "scif")]
    list.push(&polyrail_scif::ScifFactory);
    #[cfg(feature = "ib")]
    list.push(&polyrail_ib::IbFactory);
    list
}

/// The settings of the `POLYRAIL_*` variables, checked against every variable this build's
/// channels declare, as [`Context::init`] reads them: for a program that reports a bad variable
/// once, before it starts anything.
pub fn settings() -> Result<Config> {
    let config = Config::from_env()?;
    polyrail_runtime::check_settings(&channels(), &config)?;
    Ok(config)
}

/// Every `POLYRAIL_*` variable of this build with its effective value in `config` and where it
/// came from (environment, a file, default), core's first, as `ucx_info -c` lists them.
pub fn effective_settings(config: &Config) -> Vec<config::Effective> {
    let given = |name: &str| std::env::var(name).ok();
    let mut all = config::effective(&given);
    for f in channels() {
        all.extend(f.effective(config, &given));
    }
    // Channels that share a model (scif and ib the link model's) declare its variables each.
    let mut seen = std::collections::HashSet::new();
    all.retain(|e| seen.insert(e.var.name));
    all
}

/// Every `POLYRAIL_*` variable of this build's channels (the core's are [`config::VARS`]),
/// each once.
pub fn channel_variables() -> Vec<config::VarInfo> {
    let mut seen = std::collections::HashSet::new();
    channels().iter().flat_map(|f| f.variables()).filter(|v| seen.insert(v.name)).collect()
}

/// `MPI_ANY_SOURCE`: receive from any rank.
pub const ANY_SOURCE: Source = Source::Any;
/// `MPI_ANY_TAG`: receive any tag.
pub const ANY_TAG: TagMatch = TagMatch::Any;
