//! The eager ring's block format (DCFA-MPI's EAGER packet with a tail magic).
//!
//! A block is written by the sender with one RDMA write:
//!
//! ```text
//! 0..8     word0: payload length u32 | kind u8 << 32 | returned credits u16 << 48 (never 0)
//! 8..16    sequence number of the block in the pair's stream (u64)
//! 16..52   the engine's header (zero in SYNC and BYE packets)
//! 52..56   padding
//! 56..     payload
//! tail     u64 at the next multiple of 8 after the payload: TAIL_MAGIC ^ sequence
//! ```
//!
//! The receiver polls word0 of the block it expects next, then the tail the length points to;
//! the block is complete once the tail holds the value for this sequence number (the provider
//! places the last 8 bytes of a write last). After consuming the block, the receiver zeroes
//! word0 and the tail, and returns the block to the sender as a credit.
//!
//! A **compact** packet leaves word 0, sequence, header and tail out: only the payload is
//! written, at `DATA_OFFSET` of the block, by an RDMA write with immediate whose 32 bits carry
//! the payload length and the returned credits ([`compact_imm`]), and whose header is the
//! successor of the previous data packet's ([`polyrail_core::Header::successor`]). The sender
//! uses it only when that saves a packet on the wire ([`compact_saves_packet`]: a payload that
//! fits whole path-MTU packets, which 64 bytes of framing would push into one more) and the
//! header is that successor. The receiver learns of it from the receive completion; word 0 of
//! the block stays zero, so the ring poll never mistakes it for a framed packet.

use polyrail_core::Header;

/// Offset of the payload in a block.
pub(crate) const DATA_OFFSET: usize = 56;
/// Offset of the engine header in a block.
pub(crate) const HEADER_OFFSET: usize = 16;
/// Bytes of a block that are not payload, tail included.
pub(crate) const OVERHEAD: usize = DATA_OFFSET + 8;
/// Mixed into the tail word so that zeroed or stale memory never matches.
const TAIL_MAGIC: u64 = 0x5052_4942_7461_696c; // "PRIBtail"

/// Largest payload of a compact packet (16 bits of its immediate).
pub(crate) const COMPACT_MAX_LEN: usize = 0xffff;
/// Most credits a compact packet returns (12 bits of its immediate); more wait for the next
/// packet.
pub(crate) const COMPACT_MAX_CREDITS: usize = 0xfff;
/// Format number of a compact data packet (top 4 bits of the immediate).
const COMPACT_DATA: u32 = 1;

/// Whether a payload of `len` bytes goes in fewer packets of `mtu` bytes without the framing.
pub(crate) fn compact_saves_packet(len: usize, mtu: usize) -> bool {
    (1..=COMPACT_MAX_LEN).contains(&len) && (tail_offset(len) + 8).div_ceil(mtu) > len.div_ceil(mtu)
}

/// The immediate data of a compact packet of `len` payload bytes returning `credits`.
pub(crate) fn compact_imm(len: usize, credits: usize) -> u32 {
    debug_assert!(len <= COMPACT_MAX_LEN && credits <= COMPACT_MAX_CREDITS);
    COMPACT_DATA << 28 | (credits as u32) << 16 | len as u32
}

/// Decodes the immediate of a compact packet into a block holding at most `max_payload` bytes:
/// payload length and returned credits; `Err` says what is wrong.
pub(crate) fn decode_compact(imm: u32, max_payload: usize) -> Result<(usize, usize), String> {
    if imm >> 28 != COMPACT_DATA {
        return Err(format!("unknown immediate format {} in {imm:#010x}", imm >> 28));
    }
    let (len, credits) = ((imm & 0xffff) as usize, (imm >> 16 & 0xfff) as usize);
    if len > max_payload {
        return Err(format!("compact packet length {len} exceeds the block's payload capacity {max_payload}"));
    }
    Ok((len, credits))
}

/// What a block carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An engine packet (header and payload).
    Data = 1,
    /// Credits only (DCFA's SYNC).
    Sync = 2,
    /// The sender finalized: nothing more comes from it.
    Bye = 3,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Data),
            2 => Some(Kind::Sync),
            3 => Some(Kind::Bye),
            _ => None,
        }
    }
}

/// Offset of the tail word for a payload of `len` bytes.
pub(crate) fn tail_offset(len: usize) -> usize {
    (DATA_OFFSET + len).next_multiple_of(8)
}

/// The tail word of block number `seq`.
pub(crate) fn tail_value(seq: u64) -> u64 {
    TAIL_MAGIC ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Word 0 of a block.
pub(crate) fn word0(kind: Kind, len: usize, credits: u16) -> u64 {
    len as u64 | (kind as u64) << 32 | (credits as u64) << 48
}

/// A decoded word 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Word0 {
    pub kind: Kind,
    pub len: usize,
    pub credits: u16,
}

/// Decodes word 0 of a block holding at most `max_payload` bytes; `Err` says what is wrong.
pub(crate) fn decode_word0(w: u64, max_payload: usize) -> Result<Word0, String> {
    let len = (w & 0xffff_ffff) as usize;
    let kind = Kind::from_u8((w >> 32) as u8).ok_or_else(|| format!("unknown packet kind {}", (w >> 32) as u8))?;
    if (w >> 40) as u8 != 0 {
        return Err(format!("reserved bits set in packet word {w:#018x}"));
    }
    if len > max_payload {
        return Err(format!("packet length {len} exceeds the block's payload capacity {max_payload}"));
    }
    if kind != Kind::Data && len != 0 {
        return Err(format!("{kind:?} packet with a payload of {len} bytes"));
    }
    Ok(Word0 { kind, len, credits: (w >> 48) as u16 })
}

/// Writes a whole packet into `block` (the staging copy); returns the bytes to RDMA-write.
pub(crate) fn encode(
    block: &mut [u8],
    seq: u64,
    kind: Kind,
    credits: u16,
    hdr: Option<&Header>,
    payload: &[u8],
) -> usize {
    let tail = tail_offset(payload.len());
    block[0..8].copy_from_slice(&word0(kind, payload.len(), credits).to_le_bytes());
    block[8..16].copy_from_slice(&seq.to_le_bytes());
    let mut wire = [0u8; Header::WIRE_LEN];
    if let Some(hdr) = hdr {
        hdr.encode(&mut wire);
    }
    block[HEADER_OFFSET..HEADER_OFFSET + Header::WIRE_LEN].copy_from_slice(&wire);
    block[HEADER_OFFSET + Header::WIRE_LEN..DATA_OFFSET].fill(0);
    block[DATA_OFFSET..DATA_OFFSET + payload.len()].copy_from_slice(payload);
    block[DATA_OFFSET + payload.len()..tail].fill(0);
    block[tail..tail + 8].copy_from_slice(&tail_value(seq).to_le_bytes());
    tail + 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_and_decode_round_trip() {
        let mut block = vec![0xaau8; 8192];
        let hdr = Header::eager(1, 7, 9, 5);
        let n = encode(&mut block, 42, Kind::Data, 3, Some(&hdr), b"hello");
        assert_eq!(n, tail_offset(5) + 8);
        let w = u64::from_le_bytes(block[..8].try_into().unwrap());
        assert_eq!(decode_word0(w, 8192 - OVERHEAD), Ok(Word0 { kind: Kind::Data, len: 5, credits: 3 }));
        assert_eq!(&block[DATA_OFFSET..DATA_OFFSET + 5], b"hello");
        let t = u64::from_le_bytes(block[tail_offset(5)..tail_offset(5) + 8].try_into().unwrap());
        assert_eq!(t, tail_value(42));
        assert_ne!(tail_value(42), tail_value(43));
        assert_ne!(tail_value(0), 0);
    }

    #[test]
    fn compact_packets_save_one_packet_or_are_not_used() {
        // 1 KiB at MTU 1024: 1088 framed bytes are two packets, the payload alone one.
        assert!(compact_saves_packet(1024, 1024));
        assert!(compact_saves_packet(4096, 4096) && compact_saves_packet(2048, 1024));
        assert!(!compact_saves_packet(8, 1024) && !compact_saves_packet(900, 1024));
        assert!(!compact_saves_packet(1024, usize::MAX) && !compact_saves_packet(0, 1024));
        assert_eq!(decode_compact(compact_imm(1024, 63), 8128), Ok((1024, 63)));
        assert!(decode_compact(compact_imm(9000, 0), 8128).unwrap_err().contains("exceeds"));
        assert!(decode_compact(2 << 28, 8128).unwrap_err().contains("format 2"));
    }

    #[test]
    fn malformed_words_are_named() {
        assert!(decode_word0(word0(Kind::Data, 9000, 0), 8128).unwrap_err().contains("exceeds"));
        assert!(decode_word0(7 << 32, 8128).unwrap_err().contains("unknown packet kind 7"));
        assert!(decode_word0(word0(Kind::Sync, 4, 0), 8128).unwrap_err().contains("Sync packet"));
        assert!(decode_word0(1 << 40 | 1 << 32, 8128).unwrap_err().contains("reserved"));
    }
}
