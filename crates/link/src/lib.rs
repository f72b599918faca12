//! polyrail-link: a link model for the software providers — an **emulation** of a node's
//! paths (host↔device PCIe each way, the network adapter reading and writing device memory, the
//! network each way), each with a latency and a bandwidth.
//!
//! A transfer finishes at max(now, link busy until) + latency + bytes / bandwidth on each of its
//! hops; a link's busy time is shared by every process of its (virtual) node through a small
//! file, so concurrent transfers contend. Providers defer a completion to that time and report
//! it from their progress calls; nothing sleeps in a post. Profiles: `none` (the default),
//! `prism` (the PRISM paper's Sandy Bridge + KNC + FDR node), either divided by a factor
//! (`POLYRAIL_LINK_PROFILE=prism/4`).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod model;
mod profile;
pub mod settings;

pub use model::{rdma_hops, scif_hops, Domain, Hop, LinkModel, PacingStats};
pub use profile::{Link, Path, Profile};
pub use settings::LinkSettings;
