//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.
//!
//! Thin wrappers over the decoders of bytes a peer controls: its ib address
//! ([`parse_address`]), its remote keys ([`decode_key`]), the blocks it writes into our eager
//! ring ([`decode_word0`], with [`polyrail_core::Header::parse`] for the header in a block),
//! the immediates of its compact packets ([`decode_compact`]) and, with real verbs, its
//! endpoint ([`verbs_endpoint`]); and the encoders the fuzz targets check them against.
#![doc(hidden)]

use polyrail_core::{Header, Rank, RemoteKey, Result};

use crate::direct::DirectIb;
use crate::packet::{self, Kind};
use crate::SoftProvider;

/// Offset of the engine header in a block.
pub const HEADER_OFFSET: usize = packet::HEADER_OFFSET;
/// Offset of the payload in a block.
pub const DATA_OFFSET: usize = packet::DATA_OFFSET;
/// Bytes of a block that are not payload, tail included.
pub const OVERHEAD: usize = packet::OVERHEAD;

/// Decodes a peer's ib address (`parse_address`); `Ok` holds its rendering.
pub fn parse_address(a: &[u8]) -> std::result::Result<String, String> {
    crate::direct::parse_address(a).map(|a| format!("{a:?}"))
}

/// Decodes a peer's remote key (`DirectIb::decode_key`): rkey, start address, length.
pub fn decode_key(peer: Rank, key: &RemoteKey) -> Result<(u32, u64, u64)> {
    DirectIb::<SoftProvider>::decode_key(peer, key)
}

/// A decoded word 0 of a block: kind (1 data, 2 sync, 3 bye), payload length, credits.
pub type Word0 = (u8, usize, u16);

/// Decodes word 0 of a block holding at most `max_payload` bytes (`packet::decode_word0`).
pub fn decode_word0(w: u64, max_payload: usize) -> std::result::Result<Word0, String> {
    packet::decode_word0(w, max_payload).map(|w| (w.kind as u8, w.len, w.credits))
}

/// Word 0 of a block (`packet::word0`); `None` for an unknown kind.
pub fn word0(kind: u8, len: usize, credits: u16) -> Option<u64> {
    let kind = match kind {
        1 => Kind::Data,
        2 => Kind::Sync,
        3 => Kind::Bye,
        _ => return None,
    };
    Some(packet::word0(kind, len, credits))
}

/// Offset of the tail word for a payload of `len` bytes.
pub fn tail_offset(len: usize) -> usize {
    packet::tail_offset(len)
}

/// The tail word of block number `seq`.
pub fn tail_value(seq: u64) -> u64 {
    packet::tail_value(seq)
}

/// A whole data block (`packet::encode`) as a sender writes it, trimmed to the bytes written.
pub fn encode_data_block(seq: u64, credits: u16, hdr: &Header, payload: &[u8]) -> Vec<u8> {
    let mut block = vec![0u8; OVERHEAD + payload.len().next_multiple_of(8)];
    let n = packet::encode(&mut block, seq, Kind::Data, credits, Some(hdr), payload);
    block.truncate(n);
    block
}

/// Decodes a compact packet's immediate (`packet::decode_compact`): payload length, credits.
pub fn decode_compact(imm: u32, max_payload: usize) -> std::result::Result<(usize, usize), String> {
    packet::decode_compact(imm, max_payload)
}

/// The immediate of a compact packet (`packet::compact_imm`), for `len` and `credits` in range
/// (at most 65535 and 4095).
pub fn compact_imm(len: usize, credits: usize) -> u32 {
    packet::compact_imm(len, credits)
}

/// Decodes a peer's verbs endpoint (`Endpoint::parse`); `Ok` holds its encoding again.
#[cfg(feature = "verbs")]
pub fn verbs_endpoint(b: &[u8]) -> Result<Vec<u8>> {
    crate::verbs::Endpoint::parse(b).map(|e| e.encode())
}
