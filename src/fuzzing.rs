//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.
#![doc(hidden)]

use crate::space::SplitEntry;
use crate::{Rank, Result};

/// Bytes of an encoded split entry.
pub const SPLIT_ENTRY_LEN: usize = SplitEntry::LEN;

/// Decodes the split entry `peer` sent ([`SplitEntry::decode`]); `Ok` holds its encoding again.
pub fn split_entry(peer: Rank, bytes: &[u8]) -> Result<[u8; SPLIT_ENTRY_LEN]> {
    SplitEntry::decode(peer, bytes).map(|e| e.encode())
}

/// The encoding of a split entry: `color` (`None`: no new space), `key`, `next` context.
pub fn encode_split_entry(color: Option<u32>, key: u32, next: u16) -> [u8; SPLIT_ENTRY_LEN] {
    SplitEntry { color, key, next }.encode()
}
