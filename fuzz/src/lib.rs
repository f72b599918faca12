//! What the fuzz targets share: a cursor that reads their input as a script.

use polyrail_core::{Header, PacketKind};

/// Reads a fuzz input front to back; past its end every read gives zeros.
pub struct Script<'a>(pub &'a [u8]);

impl<'a> Script<'a> {
    /// Whether the input is used up.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The next `n` bytes (fewer at the end).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    /// The next byte.
    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    /// The next `N` bytes, zero-padded.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let b = self.take(N);
        a[..b.len()].copy_from_slice(b);
        a
    }

    /// The next little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// The next little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// The next little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// A header of one of the engine's kinds, with small values where the engine matches on
    /// them (context, tag, request ids) so that packets meet the engine's state; `seq` when
    /// given replaces the sequence id.
    pub fn header(&mut self, seq: Option<u32>) -> Header {
        let kinds = [
            PacketKind::Eager,
            PacketKind::Frag,
            PacketKind::Rts,
            PacketKind::Cts,
            PacketKind::Data,
            PacketKind::Fin,
            PacketKind::Rtr,
            PacketKind::Skew,
            PacketKind::Withdraw,
            PacketKind::Withdrawn,
        ];
        let kind = kinds[self.u8() as usize % kinds.len()];
        let flags = self.u8() & 0xf;
        let small = self.u8();
        let own_seq = self.u8() as u32;
        let len = match self.u8() {
            0 => self.u64(),
            n => self.u16() as u64 % (n as u64 * 64 + 1),
        };
        let (sreq, rreq) = (self.u8() as u32, self.u8() as u32);
        let offset = match self.u8() {
            0 => self.u64(),
            _ => self.u16() as u64,
        };
        Header {
            kind,
            flags,
            ctx: (small & 3) as u16,
            tag: (small >> 2 & 3) as u32,
            seq: seq.unwrap_or(own_seq),
            len,
            sreq,
            rreq,
            offset,
        }
    }
}
