//! polyrail-cli: the launcher behind `polyrail run` ([`launch`]) and the `polyrail` command.
//!
//! The launcher is a library too, so that benchmarks and tests start jobs of their own
//! ([`launch::launch`]) or join one as rank 0 ([`launch::spawn_peers`]).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod launch;
