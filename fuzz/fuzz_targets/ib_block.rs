//! A block a peer wrote into our ib eager ring, read as the ring poll reads it: word 0
//! (`decode_word0`) against the block's capacity, the tail it points to, then for a data
//! block the engine header (`Header::parse`) and the payload. What is accepted lies inside
//! the block and encodes (`packet::encode`) back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail_core::Header;
use polyrail_ib::fuzzing::{self as ib, DATA_OFFSET, HEADER_OFFSET, OVERHEAD};

fuzz_target!(|data: &[u8]| {
    // The ring's blocks are multiples of 64 bytes; the input is one, zero-padded.
    if data.len() < 8 || data.len() > 1 << 16 {
        return;
    }
    let mut block = data.to_vec();
    block.resize(data.len().next_multiple_of(64).max(OVERHEAD), 0);
    let max_payload = block.len() - OVERHEAD;
    let w0 = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
    let Ok((kind, len, credits)) = ib::decode_word0(w0, max_payload) else { return };
    assert!(len <= max_payload);
    assert_eq!(ib::word0(kind, len, credits), Some(w0));
    let tail = ib::tail_offset(len);
    assert!(tail + 8 <= block.len(), "tail of a {len}-byte payload outside a {}-byte block", block.len());
    if kind != 1 {
        assert_eq!(len, 0);
        return;
    }
    let wire: &[u8; Header::WIRE_LEN] = block[HEADER_OFFSET..HEADER_OFFSET + Header::WIRE_LEN].try_into().expect("36");
    let Ok(hdr) = Header::parse(wire) else { return };
    let payload = &block[DATA_OFFSET..DATA_OFFSET + len];
    let seq = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
    let again = ib::encode_data_block(seq, credits, &hdr, payload);
    assert_eq!(again.len(), tail + 8);
    assert_eq!(again[..HEADER_OFFSET + Header::WIRE_LEN], block[..HEADER_OFFSET + Header::WIRE_LEN]);
    assert_eq!(&again[DATA_OFFSET..DATA_OFFSET + len], payload);
    assert_eq!(again[tail..], ib::tail_value(seq).to_le_bytes());
});
