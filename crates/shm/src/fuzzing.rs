//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`); not an API.
//!
//! Thin wrappers over the decoders of bytes a peer controls: its segment address
//! ([`seg_address`]), its one-sided keys ([`pid_key`]), its cma address ([`cma_address`]), and
//! the ring records and read positions it writes ([`RingHarness`]).
#![doc(hidden)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use polyrail_core::{Envelope, Header, RemoteKey};

use crate::cma::CmaTransport;
use crate::key::PidKey;
use crate::ring::{Body, Consumer, Geometry, Producer, CONTROL};
use crate::segment::SegAddress;

/// Decodes a peer's segment address ([`SegAddress::decode`]); `Ok` holds its encoding again.
pub fn seg_address(bytes: &[u8]) -> Result<Vec<u8>, String> {
    SegAddress::decode(bytes).map(|a| a.encode())
}

/// Decodes a peer's key ([`PidKey::decode`]); `Ok` holds its encoding again and where
/// `[offset, offset + len)` lies in it ([`PidKey::range`]).
pub fn pid_key(key: &RemoteKey, offset: usize, len: usize) -> Result<(RemoteKey, Result<u64, String>), String> {
    PidKey::decode(key).map(|k| (k.encode(), k.range(offset, len)))
}

/// A decoded cma address: pid, probe word address, magic, and the probe file's descriptor and
/// inode when there is one.
pub type CmaAddress = (u32, u64, u64, Option<(u32, u64)>);

/// Decodes a peer's cma address (`CmaTransport::decode_address`).
pub fn cma_address(bytes: &[u8]) -> Result<CmaAddress, String> {
    CmaTransport::decode_address(bytes).map(|(pid, addr, magic, f)| (pid, addr, magic, f.map(|f| (f.fd, f.inode))))
}

/// A message taken from a ring: its header, and its payload (in the ring) or its send cell.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// The payload was in the ring.
    Inline(Header, Vec<u8>),
    /// The payload is in send cell `index`, `len` bytes.
    Cell(Header, u32, usize),
}

/// One ring of 16 slots (bodies of up to 4 slots) in heap memory, with its producer and its
/// consumer, where the fuzzer also writes what a faulty peer would.
pub struct RingHarness {
    producer: Producer,
    consumer: Consumer,
    geo: Geometry,
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Default for RingHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl RingHarness {
    /// A fresh (zeroed) ring.
    pub fn new() -> Self {
        let geo = Geometry::new(16, 4);
        let layout = Layout::from_size_align(geo.bytes(), CONTROL).unwrap_or_else(|_| unreachable!());
        // SAFETY: the layout has a non-zero size.
        let ptr =
            NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // SAFETY: zeroed, 128-byte aligned memory of the geometry's size, freed only on drop, one
        // producer and one consumer.
        let (producer, consumer) = unsafe { (Producer::new(ptr, geo), Consumer::new(ptr, geo)) };
        RingHarness { producer, consumer, geo, ptr, layout }
    }

    /// Bytes of ring memory.
    pub fn bytes(&self) -> usize {
        self.geo.bytes()
    }

    /// Largest payload [`RingHarness::push`] takes.
    pub fn inline_max(&self) -> usize {
        self.geo.inline_max()
    }

    /// The producer writes a message (payload cut to [`RingHarness::inline_max`]); `Ok(false)`:
    /// the ring is full.
    pub fn push(&mut self, hdr: &Header, payload: &[u8]) -> Result<bool, String> {
        self.producer.try_push_inline(hdr, &payload[..payload.len().min(self.inline_max())])
    }

    /// The producer writes a whole eager message in compact form (payload cut to a record's).
    pub fn push_compact(&mut self, env: Envelope, payload: &[u8]) -> Result<bool, String> {
        self.producer.try_push_compact(env, &payload[..payload.len().min(crate::ring::RECORD_INLINE)])
    }

    /// The producer writes a message whose payload is in send cell `cell`.
    pub fn push_cell(&mut self, hdr: &Header, plen: u32, cell: u32) -> Result<bool, String> {
        if !self.producer.reserve_cell()? {
            return Ok(false);
        }
        self.producer.push_cell(hdr, plen, cell);
        Ok(true)
    }

    /// The consumer's read position as the producer loads it ([`Producer::read_position`]).
    pub fn read_position(&mut self) -> Result<u64, String> {
        self.producer.read_position()
    }

    /// The consumer takes the next message, if one arrived.
    pub fn take(&mut self) -> Result<Option<Taken>, String> {
        let mut taken = None;
        self.consumer.take(|hdr, body| {
            taken = Some(match body {
                Body::Inline(b) => Taken::Inline(*hdr, b.to_vec()),
                Body::Cell { index, len } => Taken::Cell(*hdr, index, len),
            });
            Ok(())
        })?;
        Ok(taken)
    }

    /// The consumer finds the ring empty (publishes its read positions).
    pub fn idle(&mut self) {
        self.consumer.idle();
    }

    /// Whether the consumer's poll sees something at its position.
    pub fn may_have_arrival(&self) -> bool {
        self.consumer.may_have_arrival()
    }

    /// A faulty peer writes `bytes` at `offset` of the ring memory (clipped to it).
    pub fn scribble(&mut self, offset: usize, bytes: &[u8]) {
        let offset = offset % self.bytes();
        let len = bytes.len().min(self.bytes() - offset);
        // SAFETY: `offset + len <= bytes()`: inside the allocation; single-threaded, and no
        // reference into the memory is alive across calls.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(offset), len) };
    }

    /// A faulty producer writes `bytes` at `offset` of the next record, publishing it or not
    /// (the ring's own test hook).
    pub fn corrupt_next(&mut self, offset: usize, bytes: &[u8], publish: bool) {
        self.producer.corrupt_next(offset, bytes, publish);
    }
}

impl Drop for RingHarness {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the producer and consumer are not used
        // after this.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
