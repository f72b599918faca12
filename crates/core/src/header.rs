//! The engine's packet header: what every active message carries in front of its payload.
//!
//! Transports take it as a [`Header`] and hand one back on arrival. A channel that carries the
//! whole header puts its [`Header::WIRE_LEN`]-byte encoding on the wire and reads it back with
//! [`Header::decode`], which rejects a kind or flag a well-behaved peer would not send; one that
//! carries a whole eager message's header in compact form ([`Header::is_compact`]) rebuilds it
//! with [`Header::eager`]. The engine checks the rest (sequence ids, lengths, request ids).

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
    /// Withdraw (receiver to sender): the receive `rreq` is being cancelled, and its RTR gave
    /// the sender its key (or a later receive's RTR counts it in its place). The sender drops
    /// every RTR of the receiver it still holds and answers each with a
    /// [`PacketKind::Withdrawn`].
    Withdraw = 9,
    /// Withdrawn (sender to receiver): the sender no longer holds the key of receive `rreq`
    /// (flag [`Header::ANSWER`] when this answers that receive's [`PacketKind::Withdraw`]);
    /// `offset` is how many messages it had sent then, each of which left before this packet.
    Withdrawn = 10,
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
            9 => Self::Withdraw,
            10 => Self::Withdrawn,
            _ => return None,
        })
    }

    /// Whether the packet takes part in per-pair message ordering (carries a `seq`).
    pub fn is_ordered(self) -> bool {
        matches!(self, Self::Eager | Self::Rts)
    }
}

/// What the header of a whole eager message says besides its length: context, tag and per-pair
/// sequence id (the fields a compact header carries, [`Header::is_compact`]). The engine's
/// small-message path works with this; [`Envelope::header`] builds the header.
///
/// One 128-bit value, so that it travels in two registers (a struct of three fields would go
/// through memory).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Envelope(u128);

impl Envelope {
    /// The envelope of a message with this context, tag and sequence id.
    #[inline]
    pub fn new(ctx: u16, tag: u32, seq: u32) -> Self {
        Envelope(u128::from(tag) | u128::from(seq) << 32 | u128::from(ctx) << 64)
    }

    /// The message tag.
    #[inline]
    pub fn tag(self) -> u32 {
        self.0 as u32
    }

    /// The per-pair sequence id.
    #[inline]
    pub fn seq(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The communication context.
    #[inline]
    pub fn ctx(self) -> u16 {
        (self.0 >> 64) as u16
    }

    /// The header of a whole eager message of `len` bytes with this envelope.
    #[inline]
    pub fn header(self, len: usize) -> Header {
        Header::eager(self.ctx(), self.tag(), self.seq(), len as u64)
    }
}

impl std::fmt::Debug for Envelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envelope")
            .field("ctx", &self.ctx())
            .field("tag", &self.tag())
            .field("seq", &self.seq())
            .finish()
    }
}

/// The engine header of one packet. Fixed size on the wire: [`Header::WIRE_LEN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the packet is.
    pub kind: PacketKind,
    /// Flags ([`Header::ANY_TAG`], [`Header::STREAM`], [`Header::TRUNCATED`], [`Header::ANSWER`]).
    pub flags: u8,
    /// Matching context: 0 = the world's messages, 1 = the barrier's, the others the spaces the
    /// facade makes (`new_space` counting up from 2, splits down from 65535).
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
    /// Byte offset (fragments, data, CTS split point) or a count (RTR, Withdrawn).
    pub offset: u64,
}

impl Header {
    /// Bytes a header takes on the wire.
    pub const WIRE_LEN: usize = 36;
    /// RTR flag: the receive takes any tag.
    pub const ANY_TAG: u8 = 1;
    /// RTS/CTS flag: the data streams through active messages (no one-sided copy).
    pub const STREAM: u8 = 2;
    /// FIN flag: to a sender, the receiver could not take the message (truncation), and the
    /// send still ends; to a receiver, the sender could not write its part, and the receive
    /// fails.
    pub const TRUNCATED: u8 = 4;
    /// Withdrawn flag: this answers the receive's own [`PacketKind::Withdraw`] (without it, the
    /// RTR was dropped because another receive of the same receiver was withdrawn).
    pub const ANSWER: u8 = 8;
    const KNOWN_FLAGS: u8 = Self::ANY_TAG | Self::STREAM | Self::TRUNCATED | Self::ANSWER;

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
        Self::parse(b).map_err(|what| Error::protocol(peer, what))
    }

    /// [`Header::decode`] for a channel that reports errors itself: `Err` says what is wrong.
    #[inline]
    pub fn parse(b: &[u8; Self::WIRE_LEN]) -> std::result::Result<Self, String> {
        let kind = PacketKind::from_u8(b[0]).ok_or_else(|| format!("unknown packet kind {}", b[0]))?;
        if b[1] & !Self::KNOWN_FLAGS != 0 {
            return Err(format!("unknown header flags {:#x}", b[1]));
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

    /// The header of a whole eager message of `len` bytes: context, tag and sequence id, every
    /// other field zero.
    #[inline]
    pub fn eager(ctx: u16, tag: u32, seq: u32, len: u64) -> Self {
        Header { kind: PacketKind::Eager, flags: 0, ctx, tag, seq, len, sreq: 0, rreq: 0, offset: 0 }
    }

    /// Context, tag and sequence id: the whole header when [`Header::is_compact`] says so.
    #[inline]
    pub fn envelope(&self) -> Envelope {
        Envelope::new(self.ctx, self.tag, self.seq)
    }

    /// Whether this is the header of a whole eager message carrying `plen` payload bytes (no
    /// flags, length `plen`, no request ids, no offset): then its context, tag and sequence id
    /// are all it says, and [`Header::eager`] rebuilds it from them. A channel may carry such
    /// headers in those 10 bytes.
    #[inline]
    pub fn is_compact(&self, plen: usize) -> bool {
        self.kind == PacketKind::Eager
            && self.flags == 0
            && self.len == plen as u64
            && (self.sreq | self.rreq) == 0
            && self.offset == 0
    }

    /// The header that follows this one in a stream of like messages: every field the same but
    /// the sequence id, one higher, and the length, `len`. A channel that sends only headers
    /// equal to the successor of the last one it sent in a compact form (and rebuilds them the
    /// same way on receipt) never changes a header.
    #[inline]
    pub fn successor(&self, len: u64) -> Self {
        Header { seq: self.seq.wrapping_add(1), len, ..*self }
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
        assert_eq!(h.successor(1024), Header { seq: 0, len: 1024, ..h });
    }

    #[test]
    fn compact_form_only_for_whole_eager_messages() {
        let h = Header::eager(513, 0xdead_beef, 41, 8);
        assert!(h.is_compact(8));
        // A first fragment (length above the payload), flags, a request id or another kind are not.
        assert!(!h.is_compact(7));
        for other in [
            Header { flags: Header::STREAM, ..h },
            Header { sreq: 1, ..h },
            Header { rreq: 1, ..h },
            Header { offset: 1, ..h },
            Header { kind: PacketKind::Rts, ..h },
        ] {
            assert!(!other.is_compact(8), "{other:?}");
        }
    }

    #[test]
    fn envelope_keeps_every_bit() {
        let env = Envelope::new(0xfedc, 0x8765_4321, 0xffff_fffe);
        assert_eq!((env.ctx(), env.tag(), env.seq()), (0xfedc, 0x8765_4321, 0xffff_fffe));
        let h = env.header(100);
        assert_eq!(h, Header::eager(0xfedc, 0x8765_4321, 0xffff_fffe, 100));
        assert!(h.is_compact(100));
        assert_eq!(h.envelope(), env);
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
