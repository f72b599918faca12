//! The `scif` channel's ring format, as pure functions over a ring's data bytes: the frames a
//! writer puts into its peer's receive ring ([`write`]) and the reader takes out ([`Frames`]).
//! The positions themselves live in the ring's first page, which the channel keeps.
//!
//! Positions count bytes since the connection started and never wrap: the writer's tail, the
//! reader's head, `head <= tail <= head + cap` for a ring of `cap` data bytes; position `p` is
//! ring byte `p % cap`. A frame is [`FRAME_HEAD`] (payload length u32, kind u32), the engine
//! header and the payload, padded to 8 bytes. No frame passes the ring's end: where one would,
//! the writer first fills the rest of the ring with a [`PAD`] frame.
//!
//! Both sides check what the other controls: the reader the tail, each frame's kind and length
//! and its header; the writer the head the reader publishes. A forged one is an error text (the
//! channel turns it into a protocol error naming the peer), never an access outside the ring.

use polyrail_core::Header;
use std::ops::Range;

/// Bytes of a frame's head: payload length (u32) and kind (u32); the engine header follows.
pub(crate) const FRAME_HEAD: usize = 8;
/// Kind of a frame that carries a message.
pub(crate) const FRAME: u32 = 0;
/// Kind of a frame that fills the ring's end (its length: the bytes after its head).
pub(crate) const PAD: u32 = 1;
/// Largest eager payload.
pub(crate) const MAX_EAGER: usize = 16 << 10;

/// Bytes a frame of `payload` bytes takes in the ring: head, engine header and payload, padded
/// to 8.
pub(crate) fn frame_len(payload: usize) -> usize {
    (FRAME_HEAD + Header::WIRE_LEN + payload).next_multiple_of(8)
}

/// A ring's data bytes as its reader sees them: this side's mapped receive ring, or a slice.
pub(crate) trait RingRead {
    /// Data bytes of the ring: its capacity.
    fn cap(&self) -> usize;
    /// Copies the bytes at ring byte `at` into `out`; callers stay within `cap()`.
    fn read(&self, at: usize, out: &mut [u8]);
}

/// A ring's data bytes as its writer sees them: the peer's ring mapped here, or a slice.
pub(crate) trait RingWrite {
    /// Data bytes of the ring: its capacity.
    fn cap(&self) -> usize;
    /// Copies `bytes` to ring byte `at`; callers stay within `cap()`.
    fn write(&mut self, at: usize, bytes: &[u8]);
}

impl RingRead for [u8] {
    fn cap(&self) -> usize {
        self.len()
    }
    fn read(&self, at: usize, out: &mut [u8]) {
        out.copy_from_slice(&self[at..at + out.len()]);
    }
}

impl RingWrite for [u8] {
    fn cap(&self) -> usize {
        self.len()
    }
    fn write(&mut self, at: usize, bytes: &[u8]) {
        self[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

/// A message frame the reader took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    /// The engine header.
    pub hdr: Header,
    /// Where the payload lies in the ring's data bytes: within `0..cap`, never wrapping.
    pub payload: Range<usize>,
    /// The reader's head past this frame.
    pub head: u64,
}

/// The message frames between the reader's head and the writer's tail, in order, PAD frames
/// passed over; an `Err` with what is wrong ends them. Reads only within the ring, whatever its
/// bytes and the tail say.
pub(crate) struct Frames<'r, R: RingRead + ?Sized> {
    ring: &'r R,
    head: u64,
    tail: u64,
    /// A frame was refused: nothing more is read.
    broken: bool,
}

impl<'r, R: RingRead + ?Sized> Frames<'r, R> {
    /// The frames of `ring` from the reader's `head` to the `tail` the writer published; `Err`
    /// when the tail is not within the ring's capacity after the head.
    pub fn new(ring: &'r R, head: u64, tail: u64) -> Result<Self, String> {
        let cap = ring.cap() as u64;
        if tail < head || tail - head > cap {
            return Err(format!("ring tail {tail} is not within {cap} bytes after the head {head}"));
        }
        Ok(Frames { ring, head, tail, broken: false })
    }

    /// The reader's head: past every frame taken (and PAD frame passed), at a refused one.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Takes the frame at the head: `Some` for a message frame, `None` for a PAD frame.
    fn step(&mut self) -> Result<Option<Frame>, String> {
        let cap = self.ring.cap();
        // `head < tail <= head + cap`, so `cap > 0`.
        let pos = (self.head % cap as u64) as usize;
        let room = cap - pos;
        // Unreachable in the channel (positions and capacities are multiples of 8); a head
        // anywhere else must still not read past the ring.
        if room < FRAME_HEAD {
            return Err(format!("a frame head at ring byte {pos} passes the ring's end"));
        }
        let mut fh = [0u8; FRAME_HEAD];
        self.ring.read(pos, &mut fh);
        let len = u32::from_le_bytes([fh[0], fh[1], fh[2], fh[3]]) as usize;
        let kind = u32::from_le_bytes([fh[4], fh[5], fh[6], fh[7]]);
        let total = match kind {
            PAD if len == room - FRAME_HEAD => room,
            FRAME if len <= MAX_EAGER && frame_len(len) <= room => frame_len(len),
            _ => return Err(format!("a frame of kind {kind} and {len} bytes at ring byte {pos}")),
        };
        if total as u64 > self.tail - self.head {
            return Err(format!("a frame of {total} bytes at ring byte {pos} passes the tail"));
        }
        let frame = if kind == FRAME {
            let mut hb = [0u8; Header::WIRE_LEN];
            self.ring.read(pos + FRAME_HEAD, &mut hb);
            let hdr = Header::parse(&hb)?;
            let at = pos + FRAME_HEAD + Header::WIRE_LEN;
            Some(Frame { hdr, payload: at..at + len, head: self.head + total as u64 })
        } else {
            None
        };
        self.head += total as u64;
        Ok(frame)
    }
}

impl<R: RingRead + ?Sized> Iterator for Frames<'_, R> {
    type Item = Result<Frame, String>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.broken && self.head < self.tail {
            match self.step() {
                Ok(Some(frame)) => return Some(Ok(frame)),
                Ok(None) => {}
                Err(what) => {
                    self.broken = true;
                    return Some(Err(what));
                }
            }
        }
        None
    }
}

/// Writes a frame of `hdr` and `payload` at the writer's `tail` of `ring`, whose reader
/// published `head`, after a PAD frame where it would pass the ring's end: the new tail,
/// `Ok(None)` while the ring has no room for it, `Err` when the head is not one a reader could
/// publish (after the tail, or more than the ring's capacity before it).
///
/// The writer's own state is trusted: the capacity and `tail` are multiples of 8 (the handshake
/// takes whole pages; every frame is whole 8-byte words), the payload is at most [`MAX_EAGER`]
/// bytes and positions do not reach 2^64. A capacity of at least two of the largest frames (as
/// the handshake asks) lets every frame into an empty ring; a smaller one may not.
pub(crate) fn write<W: RingWrite + ?Sized>(
    ring: &mut W,
    head: u64,
    tail: u64,
    hdr: &Header,
    payload: &[u8],
) -> Result<Option<u64>, String> {
    let cap = ring.cap() as u64;
    if head > tail || tail - head > cap {
        return Err(format!("its ring head {head} is not within {cap} bytes before the tail {tail}"));
    }
    debug_assert!(cap % 8 == 0 && tail % 8 == 0 && payload.len() <= MAX_EAGER, "the writer's own state");
    let total = frame_len(payload.len()) as u64;
    let free = cap - (tail - head);
    // Also keeps an empty ring of no bytes from the `%` below.
    if total > free {
        return Ok(None);
    }
    let pos = tail % cap;
    let room = cap - pos;
    let pad = if total > room { room } else { 0 };
    if pad + total > free {
        return Ok(None);
    }
    let mut at = pos as usize;
    if pad > 0 {
        let mut fh = [0u8; FRAME_HEAD];
        fh[0..4].copy_from_slice(&((pad as usize - FRAME_HEAD) as u32).to_le_bytes());
        fh[4..8].copy_from_slice(&PAD.to_le_bytes());
        ring.write(at, &fh);
        at = 0;
    }
    let mut head_bytes = [0u8; FRAME_HEAD + Header::WIRE_LEN];
    head_bytes[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    head_bytes[4..8].copy_from_slice(&FRAME.to_le_bytes());
    let mut hb = [0u8; Header::WIRE_LEN];
    hdr.encode(&mut hb);
    head_bytes[FRAME_HEAD..].copy_from_slice(&hb);
    ring.write(at, &head_bytes);
    ring.write(at + head_bytes.len(), payload);
    Ok(Some(tail + pad + total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use polyrail_core::PacketKind;

    /// Frames as the tests compare them: header and payload.
    type Sent = Vec<(Header, Vec<u8>)>;

    /// Reads every frame of `ring` from `head` to `tail`: the frames and the head after them, or
    /// the error.
    fn read_all(ring: &[u8], head: u64, tail: u64) -> Result<(Sent, u64), String> {
        let mut frames = Frames::new(ring, head, tail)?;
        let got = frames.by_ref().map(|f| f.map(|f| (f.hdr, ring[f.payload].to_vec()))).collect::<Result<_, _>>()?;
        Ok((got, frames.head()))
    }

    fn hdr(seq: u32, len: usize) -> Header {
        Header::eager(0, 7, seq, len as u64)
    }

    #[test]
    fn frames_read_back_as_written() {
        let mut ring = vec![0u8; 4096];
        let mut tail = 0;
        let mut sent = Vec::new();
        for (seq, len) in [(0, 0), (1, 5), (2, 300)] {
            let payload = vec![seq as u8 + 1; len];
            tail = write(&mut ring[..], 0, tail, &hdr(seq, len), &payload).unwrap().unwrap();
            sent.push((hdr(seq, len), payload));
        }
        assert_eq!(tail as usize, frame_len(0) + frame_len(5) + frame_len(300));
        assert_eq!(read_all(&ring, 0, tail), Ok((sent, tail)));
    }

    #[test]
    fn a_frame_past_the_end_wraps_after_a_pad() {
        let mut ring = vec![0u8; 1024];
        let start = 1024 * 5 - 64;
        let first = write(&mut ring[..], start, start, &hdr(0, 8), &[1; 8]).unwrap().unwrap();
        assert_eq!(first, start + 56);
        let second = write(&mut ring[..], start, first, &hdr(1, 100), &[2; 100]).unwrap().unwrap();
        assert_eq!(second, 1024 * 5 + frame_len(100) as u64, "a pad of 8 bytes, then the frame at 0");
        assert_eq!(ring[1016..1024], [0, 0, 0, 0, 1, 0, 0, 0]);
        let (got, head) = read_all(&ring, start, second).unwrap();
        assert_eq!(got, vec![(hdr(0, 8), vec![1; 8]), (hdr(1, 100), vec![2; 100])]);
        assert_eq!(head, second);
    }

    #[test]
    fn a_full_ring_takes_no_more_until_read() {
        let mut ring = vec![0u8; 1024];
        let (mut tail, mut n) = (0, 0);
        while let Some(t) = write(&mut ring[..], 0, tail, &hdr(n, 100), &[n as u8; 100]).unwrap() {
            (tail, n) = (t, n + 1);
        }
        assert_eq!(n as usize, 1024 / frame_len(100));
        let (got, head) = read_all(&ring, 0, tail).unwrap();
        assert_eq!(got.len(), n as usize);
        assert!(write(&mut ring[..], head, tail, &hdr(n, 100), &[0; 100]).unwrap().is_some());
    }

    #[test]
    fn an_empty_ring_takes_a_frame_of_half_its_bytes_wherever_its_tail() {
        let cap = 2 * frame_len(MAX_EAGER);
        let mut ring = vec![0u8; cap];
        for pos in (0..cap as u64).step_by(8) {
            let t = write(&mut ring[..], pos, pos, &hdr(0, MAX_EAGER), &[0; MAX_EAGER]).unwrap();
            assert!(t.is_some(), "tail at {pos}");
        }
    }

    #[test]
    fn a_budget_reads_that_many_frames() {
        let mut ring = vec![0u8; 1024];
        let mut tail = 0;
        for seq in 0..3 {
            tail = write(&mut ring[..], 0, tail, &hdr(seq, 1), &[0]).unwrap().unwrap();
        }
        let mut frames = Frames::new(&ring[..], 0, tail).unwrap();
        assert_eq!(frames.by_ref().take(2).count(), 2);
        assert_eq!(frames.head(), 2 * frame_len(1) as u64);
    }

    #[test]
    fn forged_frames_are_refused_where_they_are() {
        let frame = |len: u32, kind: u32| [len.to_le_bytes(), kind.to_le_bytes()].concat();
        let cases: [(Vec<u8>, u64, &str); 6] = [
            (frame(u32::MAX, FRAME), 64, "a frame of kind 0 and 4294967295 bytes at ring byte 0"),
            (frame(2000, FRAME), 1024, "a frame of kind 0 and 2000 bytes at ring byte 0"),
            (frame(8, 7), 64, "a frame of kind 7 and 8 bytes at ring byte 0"),
            (frame(8, PAD), 64, "a frame of kind 1 and 8 bytes at ring byte 0"),
            (frame(8, FRAME), 8, "a frame of 56 bytes at ring byte 0 passes the tail"),
            // The header's bytes are zeros: kind 0 is none (the error text is the header's own).
            (frame(0, FRAME), 64, "unknown packet kind 0"),
        ];
        for (bytes, tail, what) in cases {
            let mut ring = vec![0u8; 1024];
            ring[..8].copy_from_slice(&bytes);
            assert_eq!(read_all(&ring, 0, tail), Err(what.to_string()));
            let mut frames = Frames::new(&ring[..], 0, tail).unwrap();
            assert!(matches!(frames.next(), Some(Err(_))));
            assert_eq!((frames.next(), frames.head()), (None, 0), "{what}: stops at the broken frame");
        }
        let e = Frames::new(&[0u8; 1024][..], 8, 8 + 1025).err().unwrap();
        assert_eq!(e, "ring tail 1033 is not within 1024 bytes after the head 8");
        assert!(Frames::new(&[0u8; 1024][..], 8, 0).is_err());
        let e = Frames::new(&[0u8; 12][..], 8, 12).unwrap().next().unwrap().unwrap_err();
        assert_eq!(e, "a frame head at ring byte 8 passes the ring's end");
    }

    #[test]
    fn a_forged_head_is_refused_to_the_writer() {
        let mut ring = vec![0u8; 1024];
        let h = Header::new(PacketKind::Eager);
        for (head, tail) in [(65u64, 64u64), (0, 1032), (u64::MAX, 0)] {
            let e = write(&mut ring[..], head, tail, &h, &[]).unwrap_err();
            assert_eq!(e, format!("its ring head {head} is not within 1024 bytes before the tail {tail}"));
        }
        assert_eq!(write(&mut ring[..], 8, 1032, &h, &[]), Ok(None), "full");
    }
}
