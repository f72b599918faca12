//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.
//!
//! Thin wrappers over the decoders of bytes a peer controls: the provider's records
//! ([`record`]), and the `scif` channel's ring, whose frames a peer writes ([`read_ring`]) and
//! whose head a peer publishes to the writer ([`write_ring`]).
#![doc(hidden)]

use std::ops::Range;

use polyrail_core::Header;

use crate::ring::{self, Frames};
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

/// Largest payload of a ring frame.
pub const MAX_EAGER: usize = ring::MAX_EAGER;

/// Bytes a frame of `payload` bytes takes in a ring.
pub fn frame_len(payload: usize) -> usize {
    ring::frame_len(payload)
}

/// A message frame the ring's reader took: its header, where its payload lies in the ring's
/// data bytes, and the reader's head past it.
pub type RingFrame = (Header, Range<usize>, u64);

/// What [`read_ring`] read: the frames, the reader's head after them, and what stopped the
/// reader if a frame (or the tail) was refused.
pub type RingTaken = (Vec<RingFrame>, u64, Option<String>);

/// Reads up to `budget` message frames of `ring`, the data bytes of a receive ring (its
/// capacity is its length), from the reader's `head` to the writer's `tail`, as
/// `ScifChannel::drain` does (the ring module's `Frames`).
pub fn read_ring(ring: &[u8], head: u64, tail: u64, budget: usize) -> RingTaken {
    let mut frames = match Frames::new(ring, head, tail) {
        Ok(frames) => frames,
        Err(what) => return (Vec::new(), head, Some(what)),
    };
    let mut got = Vec::new();
    let mut refused = None;
    for frame in frames.by_ref().take(budget) {
        match frame {
            Ok(f) => got.push((f.hdr, f.payload, f.head)),
            Err(what) => refused = Some(what),
        }
    }
    (got, frames.head(), refused)
}

/// Writes a frame of `hdr` and `payload` into `ring` at the writer's `tail`, the reader having
/// published `head`, as `ScifChannel::try_send` does (the ring module's `write`): the new tail,
/// `Ok(None)` without room, `Err` for a head no reader could publish. The ring's length and
/// `tail` are multiples of 8 and the payload at most [`MAX_EAGER`] bytes (the writer's own
/// state, which the channel keeps so).
pub fn write_ring(ring: &mut [u8], head: u64, tail: u64, hdr: &Header, payload: &[u8]) -> Result<Option<u64>, String> {
    ring::write(ring, head, tail, hdr, payload)
}

/// A ring as the channel's writer fills it, for the fuzz target's seeds: its name, its data
/// bytes, and the reader's head and the writer's tail over them.
pub type SampleRing = (&'static str, Vec<u8>, u64, u64);

/// Rings of 512 bytes the channel's writer filled ([`write_ring`]): small frames, a frame after
/// a PAD at the ring's end, and a full ring (four frames of 128 bytes).
pub fn sample_rings() -> Vec<SampleRing> {
    let fill = |cap: usize, start: u64, lens: &[usize]| {
        let mut ring = vec![0u8; cap];
        let mut tail = start;
        for (seq, &len) in lens.iter().enumerate() {
            let hdr = Header::eager(0, 7, seq as u32, len as u64);
            let payload = vec![0xa0 | seq as u8 & 0xf; len];
            match ring::write(&mut ring[..], start, tail, &hdr, &payload) {
                Ok(Some(t)) => tail = t,
                _ => break,
            }
        }
        (ring, start, tail)
    };
    let small = fill(512, 0, &[0, 3, 40]);
    let wrap = fill(512, 2 * 512 - 64, &[8, 100]);
    let full = fill(512, 3 * 512, &[80; 5]);
    vec![("small", small.0, small.1, small.2), ("pad-wrap", wrap.0, wrap.1, wrap.2), ("full", full.0, full.1, full.2)]
}
