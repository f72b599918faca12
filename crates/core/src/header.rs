//! The engine's packet header: what every active message carries in front of its payload.
//!
//! Transports store it as [`Header::WIRE_LEN`] opaque bytes and hand it back on arrival; the
//! engine decodes it with [`Header::decode`], which rejects anything a well-behaved peer would not
//! send.

use crate::error::{Error, Rank, Result};

/// What a packet means to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PacketKind {
    /// A whole eager message, or its first fragment (`len` is the whole message length).
    Eager = 1,
    /// A later fragment of an eager message (`seq` names the message, `offset` its place).
    Frag = 2,
    /// Ready-to-send: a rendezvous message is waiting at the sender; payload is its remote key
    /// (empty when the data will be streamed after a [`PacketKind::Cts`]).
    Rts = 3,
    /// Clear-to-send: the receiver matched an RTS. `offset` is the split point: the receiver
    /// pulls `[0, offset)`, the sender pushes `[offset, len)`; payload is the receive buffer's
    /// key when `offset < len` and the data can be put one-sided.
    Cts = 4,
    /// Data of a rendezvous message streamed through active messages (`offset` is its place).
    Data = 5,
    /// Rendezvous finished on the side that sends it (`sreq`/`rreq` names the peer's request).
    Fin = 6,
    /// Ready-to-receive: a receive is posted before the send; payload is its buffer's key,
    /// `offset` is how many messages of the sender the receiver had seen when it posted it,
    /// `seq` how many receives posted before it wait for the same messages (it takes the
    /// matching message after those), `len` the buffer's capacity, flag [`Header::ANY_TAG`]
    /// when it takes any tag.
    Rtr = 7,
    /// Skew feedback (Chai §6.3.2): `offset` 1 = "I am lagging behind you: send medium messages
    /// eagerly", 0 = "caught up".
    Skew = 8,
}

impl PacketKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Eager,
            2 => Self::Frag,
            3 => Self::Rts,
            4 => Self::Cts,
            5 => Self::Data,
            6 => Self::Fin,
            7 => Self::Rtr,
            8 => Self::Skew,
            _ => return None,
        })
    }

    /// Whether the packet takes part in per-pair message ordering (carries a `seq`).
    pub fn is_ordered(self) -> bool {
        matches!(self, Self::Eager | Self::Rts)
    }
}

/// The engine header of one packet. Fixed size on the wire: [`Header::WIRE_LEN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the packet is.
    pub kind: PacketKind,
    /// Flags ([`Header::ANY_TAG`], [`Header::STREAM`]).
    pub flags: u8,
    /// Communication context (0 = user messages; others are internal, e.g. barrier).
    pub ctx: u16,
    /// The message tag.
    pub tag: u32,
    /// Per-pair sequence id of the message this packet belongs to.
    pub seq: u32,
    /// Whole message length in bytes.
    pub len: u64,
    /// Sender's request id (echoed back in CTS / FIN).
    pub sreq: u32,
    /// Receiver's request id (echoed back in Data / FIN / PutDone).
    pub rreq: u32,
    /// Byte offset (fragments, data, CTS split point) or a count (RTR).
    pub offset: u64,
}

impl Header {
    /// Bytes a header takes on the wire.
    pub const WIRE_LEN: usize = 36;
    /// RTR flag: the receive takes any tag.
    pub const ANY_TAG: u8 = 1;
    /// RTS/CTS flag: the data streams through active messages (no one-sided copy).
    pub const STREAM: u8 = 2;
    /// FIN flag: the receiver could not take the message (truncation); the send still ends.
    pub const TRUNCATED: u8 = 4;
    const KNOWN_FLAGS: u8 = Self::ANY_TAG | Self::STREAM | Self::TRUNCATED;

    /// A header of `kind` with every other field zero.
    pub fn new(kind: PacketKind) -> Self {
        Header { kind, flags: 0, ctx: 0, tag: 0, seq: 0, len: 0, sreq: 0, rreq: 0, offset: 0 }
    }

    /// Writes the header into `out` (little endian).
    #[inline]
    pub fn encode(&self, out: &mut [u8; Self::WIRE_LEN]) {
        out[0] = self.kind as u8;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.ctx.to_le_bytes());
        out[4..8].copy_from_slice(&self.tag.to_le_bytes());
        out[8..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..20].copy_from_slice(&self.len.to_le_bytes());
        out[20..24].copy_from_slice(&self.sreq.to_le_bytes());
        out[24..28].copy_from_slice(&self.rreq.to_le_bytes());
        out[28..36].copy_from_slice(&self.offset.to_le_bytes());
    }

    /// Reads a header written by [`Header::encode`]; `peer` names the sender in errors.
    #[inline]
    pub fn decode(peer: Rank, b: &[u8; Self::WIRE_LEN]) -> Result<Self> {
        let kind =
            PacketKind::from_u8(b[0]).ok_or_else(|| Error::protocol(peer, format!("unknown packet kind {}", b[0])))?;
        if b[1] & !Self::KNOWN_FLAGS != 0 {
            return Err(Error::protocol(peer, format!("unknown header flags {:#x}", b[1])));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Ok(Header {
            kind,
            flags: b[1],
            ctx: u16::from_le_bytes([b[2], b[3]]),
            tag: u32_at(4),
            seq: u32_at(8),
            len: u64_at(12),
            sreq: u32_at(20),
            rreq: u32_at(24),
            offset: u64_at(28),
        })
    }

    /// Bytes of a compact header ([`Header::compact`]): the context, tag and sequence id.
    pub const COMPACT_LEN: usize = 10;

    /// The compact form of the wire header `wire` of a packet carrying `plen` payload bytes: its
    /// context, tag and sequence id, when the header is an eager message sent whole (no flags,
    /// length `plen`, no request ids, no offset) and [`Header::expand`] gives it back exactly;
    /// `None` otherwise. A channel may carry such headers in [`Header::COMPACT_LEN`] bytes.
    #[inline]
    pub fn compact(wire: &[u8; Self::WIRE_LEN], plen: usize) -> Option<[u8; Self::COMPACT_LEN]> {
        let len = u64::from_le_bytes(wire[12..20].try_into().expect("8 bytes"));
        let rest = u128::from_le_bytes(wire[20..].try_into().expect("16 bytes"));
        if wire[0] != PacketKind::Eager as u8 || wire[1] != 0 || len != plen as u64 || rest != 0 {
            return None;
        }
        let mut c = [0u8; Self::COMPACT_LEN];
        c[..2].copy_from_slice(&wire[2..4]);
        c[2..].copy_from_slice(&wire[4..12]);
        Some(c)
    }

    /// The wire header whose compact form ([`Header::compact`]) is `c`, for `plen` payload bytes.
    #[inline]
    pub fn expand(c: &[u8; Self::COMPACT_LEN], plen: usize) -> [u8; Self::WIRE_LEN] {
        let mut wire = [0u8; Self::WIRE_LEN];
        wire[0] = PacketKind::Eager as u8;
        wire[2..4].copy_from_slice(&c[..2]);
        wire[4..12].copy_from_slice(&c[2..]);
        wire[12..20].copy_from_slice(&(plen as u64).to_le_bytes());
        wire
    }

    /// The wire header that follows `prev` in a stream of like messages: every field as in
    /// `prev` but the sequence id, one higher, and the length, `len`. A channel that sends
    /// only headers equal to the successor of the last one it sent in a compact form (and
    /// rebuilds them the same way on receipt) never changes a header.
    #[inline]
    pub fn successor(prev: &[u8; Self::WIRE_LEN], len: u64) -> [u8; Self::WIRE_LEN] {
        let mut next = *prev;
        let seq = u32::from_le_bytes([prev[8], prev[9], prev[10], prev[11]]).wrapping_add(1);
        next[8..12].copy_from_slice(&seq.to_le_bytes());
        next[12..20].copy_from_slice(&len.to_le_bytes());
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = Header {
            kind: PacketKind::Cts,
            flags: Header::STREAM,
            ctx: 3,
            tag: 77,
            seq: 9,
            len: 1 << 40,
            sreq: 5,
            rreq: 6,
            offset: 12345,
        };
        let mut w = [0u8; Header::WIRE_LEN];
        h.encode(&mut w);
        assert_eq!(Header::decode(0, &w).unwrap(), h);
    }

    #[test]
    fn successor_changes_only_sequence_and_length() {
        let h = Header { tag: 77, seq: u32::MAX, len: 8, ctx: 2, ..Header::new(PacketKind::Eager) };
        let mut w = [0u8; Header::WIRE_LEN];
        h.encode(&mut w);
        let next = Header::decode(0, &Header::successor(&w, 1024)).unwrap();
        assert_eq!(next, Header { seq: 0, len: 1024, ..h });
    }

    #[test]
    fn compact_form_only_for_whole_eager_messages() {
        let h = Header { tag: 0xdead_beef, seq: 41, len: 8, ctx: 513, ..Header::new(PacketKind::Eager) };
        let mut w = [0u8; Header::WIRE_LEN];
        h.encode(&mut w);
        let c = Header::compact(&w, 8).expect("a whole eager message is compact");
        assert_eq!(Header::expand(&c, 8), w);
        // A first fragment (length above the payload), flags, a request id or another kind are not.
        assert_eq!(Header::compact(&w, 7), None);
        for other in [
            Header { flags: Header::STREAM, ..h },
            Header { sreq: 1, ..h },
            Header { rreq: 1, ..h },
            Header { offset: 1, ..h },
            Header { kind: PacketKind::Rts, ..h },
        ] {
            other.encode(&mut w);
            assert_eq!(Header::compact(&w, 8), None, "{other:?}");
        }
    }

    #[test]
    fn rejects_garbage() {
        let mut w = [0u8; Header::WIRE_LEN];
        w[0] = 200;
        assert!(matches!(Header::decode(4, &w), Err(Error::Protocol { peer: 4, .. })));
        w[0] = 1;
        w[1] = 0x80;
        assert!(Header::decode(4, &w).is_err());
    }
}
