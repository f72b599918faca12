//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.
//!
//! A thin wrapper over the decoder of the provider's records, which a peer controls.
#![doc(hidden)]

use crate::wire::{Kind, Record};

/// Decodes a peer's record ([`Record::decode`]); `Ok` holds its encoding again.
pub fn record(bytes: &[u8]) -> Result<Vec<u8>, String> {
    Record::decode(bytes).map(|r| r.encode().to_vec())
}

/// Records of each kind as the provider sends them, for the fuzz target's seeds.
pub fn sample_records() -> Vec<(&'static str, Vec<u8>)> {
    [
        ("hello", Record::new(Kind::Hello, 0, 0, 0, 0)),
        ("welcome", Record::new(Kind::Welcome, 0, 0, 0, 0)),
        ("register", Record::new(Kind::Register, 0x10000, 0x4000, 3, 0)),
        ("register_in_place", Record::new(Kind::RegisterInPlace, 0x20000, 0x4000, 1, 0x7f00_0000_0000)),
        ("unregister", Record::new(Kind::Unregister, 0x10000, 0x4000, 0, 0)),
        ("close", Record::new(Kind::Close, 0, 0, 0, 0)),
    ]
    .into_iter()
    .map(|(name, r)| (name, r.encode().to_vec()))
    .collect()
}
