//! The single-producer single-consumer ring of one ordered pair of processes.
//!
//! The ring lives in the **sender's** segment (Chai §3.1: placed in the sender's memory by first
//! touch). The sender owns a [`Producer`], the receiver a [`Consumer`]; each keeps its indices in
//! its own private memory, and the only shared words are the slots and the consumer's published
//! read position.
//!
//! # Ring memory, per cache line
//!
//! ```text
//! offset   0  line 0   read: AtomicU64 — position the consumer has finished with; written by the
//!                      consumer only, in batches; read by the producer only when the ring looks full
//! offset  64  line 1   padding (the adjacent-line prefetcher fetches 128-byte pairs)
//! offset 128  slot 0 .. slot N-1, 64 bytes each
//!             then OVERFLOW = max_msg_slots - 1 slots, so a multi-slot message never wraps
//! ```
//!
//! # Slot layout (first slot of a message)
//!
//! ```text
//! byte  0..4   stamp   AtomicU32  lap + 1 once the message is complete; written last (Release)
//! byte  4..6   nslots  u16        slots the message takes: 1..=max_msg_slots (1 for a cell message)
//! byte  6      kind    u8         KIND_INLINE (payload in the slots) or KIND_CELL (in a send cell)
//! byte  7      flags   u8         0 (reserved; anything else is rejected)
//! byte  8..12  plen    u32        payload length in bytes
//! byte 12..48  header  [u8; 36]   the engine's header, opaque here
//! byte 48..64  inline  [u8; 16]   the first 16 payload bytes (inline), or the cell index (cell)
//! ```
//! The following slots of an inline message are raw payload (64 bytes each), so the payload is
//! contiguous from byte 48 of the first slot and is handed to the sink without a copy.
//!
//! # Positions and stamps
//!
//! Positions count slots from 0 and never wrap (`u64`). A message at position `p` starts in slot
//! `p % N`, is in lap `p / N`, and takes `nslots` positions; the next message starts at
//! `p + nslots`. A message starting near the end may run into the overflow slots; the physical
//! slots at the start of the next lap that its positions stand for are then skipped.
//!
//! The consumer waiting for position `p` reads the stamp of slot `p % N`:
//! - `lap(p) + 1`: the message has arrived;
//! - `lap(p)`: not yet (the value a message one lap earlier left, or the marker below);
//! - anything else: the slot is corrupt, an [`Err`] for the caller to turn into `Error::Protocol`.
//!
//! Stamps are `u32` and compared after truncation, which is exact modulo 2^32 laps. Zero-filled
//! memory is a valid empty ring (lap 0, nothing arrived).
//!
//! A slot that last held the *continuation* of a message (raw payload), or that was skipped after
//! an overflow, does not hold `lap(p)`. The producer keeps a private shadow of every stamp word and,
//! before publishing a message, writes the "not yet" marker into the slot where the *next* message
//! will start when the shadow says it is not already there. Single-slot streams never need it: one
//! cache line is written per small message. The marker's slot must already be released by the
//! consumer, so the producer keeps one position free: `head + nslots + 1 - read <= N`.
//!
//! # Batching of the read position
//!
//! The consumer publishes `read` when it has consumed at least `N / 4` slots since its last
//! publication, or when it finds the ring empty with unpublished consumption (without the second
//! rule a producer could wait forever for a consumer that waits for it). The producer caches the
//! last value it loaded and reloads only when the cached value says "possibly full".

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use polyrail_core::Header;

/// Bytes of one slot (one cache line).
pub(crate) const SLOT: usize = 64;
/// Bytes of the control block in front of the slots (two cache lines).
pub(crate) const CONTROL: usize = 128;
/// Payload bytes in the first slot of an inline message.
pub(crate) const FIRST_INLINE: usize = SLOT - 4 - 2 - 1 - 1 - 4 - Header::WIRE_LEN;
/// `kind`: the payload is in the slots.
pub(crate) const KIND_INLINE: u8 = 1;
/// `kind`: the payload is in a send cell; bytes 48..52 hold the cell index.
pub(crate) const KIND_CELL: u8 = 2;

const OFF_NSLOTS: usize = 4;
const OFF_KIND: usize = 6;
const OFF_FLAGS: usize = 7;
const OFF_PLEN: usize = 8;
const OFF_HEADER: usize = 12;
const OFF_INLINE: usize = 48;
const _: () = assert!(OFF_INLINE + FIRST_INLINE == SLOT && OFF_HEADER + Header::WIRE_LEN == OFF_INLINE);

/// Shadow value meaning "this stamp word holds payload bytes, value unknown".
const UNKNOWN: u64 = u64::MAX;

/// Shape of a ring; both sides of a pair must agree on it (checked at connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// `N`: slots in the ring, a power of two, at least 16.
    pub slots: u32,
    /// Most slots one inline message may take; `1..=slots / 4`.
    pub max_msg_slots: u32,
}

impl Geometry {
    /// A geometry of `slots` slots (a power of two, at least 16) and inline messages of up to
    /// `max_msg_slots` slots, clamped to `1..=slots / 4`.
    pub(crate) fn new(slots: u32, max_msg_slots: u32) -> Geometry {
        debug_assert!(slots.is_power_of_two() && slots >= 16);
        Geometry { slots, max_msg_slots: max_msg_slots.clamp(1, slots / 4) }
    }

    /// Slots after slot `N - 1` that a message may run into.
    pub(crate) fn overflow(&self) -> u32 {
        self.max_msg_slots - 1
    }

    /// Bytes of ring memory (control block, slots and overflow slots).
    pub(crate) fn bytes(&self) -> usize {
        CONTROL + (self.slots + self.overflow()) as usize * SLOT
    }

    /// Largest payload carried in the slots.
    pub(crate) fn inline_max(&self) -> usize {
        FIRST_INLINE + (self.max_msg_slots as usize - 1) * SLOT
    }

    /// Slots an inline payload of `len` bytes takes (`len <= inline_max()`).
    #[inline]
    pub(crate) fn slots_for(len: usize) -> u32 {
        (1 + len.saturating_sub(FIRST_INLINE).div_ceil(SLOT)) as u32
    }

    #[inline]
    fn shift(&self) -> u32 {
        self.slots.trailing_zeros()
    }

    #[inline]
    fn mask(&self) -> u64 {
        self.slots as u64 - 1
    }
}

/// Pointers into one ring's memory.
#[derive(Clone, Copy, Debug)]
struct RingMem {
    base: NonNull<u8>,
}

impl RingMem {
    #[inline]
    fn read_pos(&self) -> &AtomicU64 {
        // SAFETY: the ring memory starts 128-byte aligned (checked by the constructors) and holds
        // the control block; its first 8 bytes are only ever accessed as this atomic.
        unsafe { &*self.base.as_ptr().cast::<AtomicU64>() }
    }

    #[inline]
    fn slot(&self, index: usize) -> *mut u8 {
        // SAFETY: callers pass `index < slots + overflow`, so the slot lies inside the ring
        // memory (`Geometry::bytes`).
        unsafe { self.base.as_ptr().add(CONTROL + index * SLOT) }
    }

    #[inline]
    fn stamp(&self, index: usize) -> &AtomicU32 {
        // SAFETY: `slot(index)` is 64-byte aligned inside the ring; its first 4 bytes are accessed
        // atomically whenever they are a stamp, and only written as payload while the consumer
        // has released them (see the module documentation).
        unsafe { &*self.slot(index).cast::<AtomicU32>() }
    }
}

/// The sending side of a ring. Private state lives here, in the sender's own memory.
pub(crate) struct Producer {
    mem: RingMem,
    geo: Geometry,
    /// Next position to write. Invariant: `cached_read <= read <= head` and
    /// `head + 1 - read <= N` whenever the consumer behaves.
    head: u64,
    /// Last `read` loaded from shared memory. Stale (lower than the real value) by design; a
    /// stale value only makes the ring look fuller than it is.
    cached_read: u64,
    /// What each of slots `0..N` holds in its stamp word: a stamp value, or [`UNKNOWN`] when
    /// payload bytes were written over it.
    shadow: Box<[u64]>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("ring", &self.mem.base)
            .field("geo", &self.geo)
            .field("head", &self.head)
            .field("cached_read", &self.cached_read)
            .finish_non_exhaustive()
    }
}

// SAFETY: the Producer is the only writer of its ring's slots; the raw pointer is to shared
// memory that stays mapped while the owning transport lives, and moving the Producer to another
// thread moves that sole writer with it.
unsafe impl Send for Producer {}

impl Producer {
    /// A producer for the ring at `base`.
    ///
    /// # Safety
    /// `base` is 128-byte aligned, valid for reads and writes of `geo.bytes()` bytes for the life
    /// of the producer, holds a fresh ring (zero-filled), and no other producer writes it.
    pub(crate) unsafe fn new(base: NonNull<u8>, geo: Geometry) -> Producer {
        assert_eq!(base.as_ptr() as usize % CONTROL, 0, "ring memory must be 128-byte aligned");
        Producer { mem: RingMem { base }, geo, head: 0, cached_read: 0, shadow: vec![0; geo.slots as usize].into() }
    }

    /// Whether `nslots` slots (plus the next start's stamp word) are free. `Err` names a read
    /// position the consumer could not have published.
    #[inline]
    pub(crate) fn reserve(&mut self, nslots: u32) -> Result<bool, String> {
        let n = self.geo.slots as u64;
        let need = self.head + nslots as u64 + 1;
        if need - self.cached_read <= n {
            return Ok(true);
        }
        // Possibly full: reload. Acquire pairs with the Release store in Consumer::publish, so the
        // consumer's reads of the slots it released happen before we overwrite them.
        let read = self.mem.read_pos().load(Ordering::Acquire);
        if read < self.cached_read || read > self.head {
            return Err(format!(
                "consumer published read position {read}, outside {}..={} (positions written)",
                self.cached_read, self.head
            ));
        }
        self.cached_read = read;
        Ok(need - read <= n)
    }

    /// Writes an inline message. The caller has had `reserve(Geometry::slots_for(payload.len()))`
    /// answer `Ok(true)` and `payload.len() <= inline_max()`.
    ///
    /// Order of the writes: the continuation slots and the next start's marker first, then the
    /// whole first slot, then its stamp; the consumer spins on the first slot's line, so writing
    /// that line in one burst lets it move to the consumer once instead of twice.
    #[inline]
    pub(crate) fn push_inline(&mut self, hdr: &[u8; Header::WIRE_LEN], payload: &[u8]) {
        let nslots = Geometry::slots_for(payload.len());
        assert!(nslots <= self.geo.max_msg_slots, "inline payload over the ring's limit");
        debug_assert!(self.head + nslots as u64 + 1 - self.cached_read <= self.geo.slots as u64);
        let slot = self.mem.slot((self.head & self.geo.mask()) as usize);
        let (first, rest) = payload.split_at(payload.len().min(FIRST_INLINE));
        if !rest.is_empty() {
            // SAFETY: `reserve` said positions head..head+nslots are released by the consumer;
            // the start index is < N and nslots <= max_msg_slots = overflow + 1, so the
            // `nslots * 64` bytes from `slot` are inside the ring; nobody reads them until the
            // stamp is published.
            unsafe { ptr::copy_nonoverlapping(rest.as_ptr(), slot.add(SLOT), rest.len()) };
        }
        self.prepare(nslots);
        // The first slot after its stamp, composed here and written in one burst.
        let mut line = [0u8; SLOT - 4];
        line[OFF_NSLOTS - 4..OFF_NSLOTS - 2].copy_from_slice(&(nslots as u16).to_ne_bytes());
        line[OFF_KIND - 4] = KIND_INLINE;
        line[OFF_PLEN - 4..OFF_PLEN].copy_from_slice(&(payload.len() as u32).to_ne_bytes());
        line[OFF_HEADER - 4..OFF_INLINE - 4].copy_from_slice(hdr);
        line[OFF_INLINE - 4..OFF_INLINE - 4 + first.len()].copy_from_slice(first);
        // SAFETY: as above, bytes 4..64 of the first slot.
        unsafe { ptr::write(slot.add(4).cast::<[u8; SLOT - 4]>(), line) };
        self.publish(nslots);
    }

    /// Writes a message whose payload (`plen` bytes) the caller already copied into send cell
    /// `cell`. The caller has had `reserve(1)` answer `Ok(true)`.
    #[inline]
    pub(crate) fn push_cell(&mut self, hdr: &[u8; Header::WIRE_LEN], plen: u32, cell: u32) {
        debug_assert!(self.head + 2 - self.cached_read <= self.geo.slots as u64);
        let slot = self.mem.slot((self.head & self.geo.mask()) as usize);
        self.prepare(1);
        // SAFETY: as in push_inline, for one slot.
        unsafe {
            write_fields(slot, 1, KIND_CELL, plen, hdr);
            ptr::write(slot.add(OFF_INLINE).cast::<[u8; 4]>(), cell.to_le_bytes());
        }
        self.publish(1);
    }

    /// Before the first slot of the message of `nslots` slots at `head` is written: notes the
    /// continuation slots in the shadow and writes the "not yet" marker where the next message
    /// will start, if that slot does not hold it already.
    #[inline]
    fn prepare(&mut self, nslots: u32) {
        let n = self.geo.slots as usize;
        let start = (self.head & self.geo.mask()) as usize;
        let next = self.head + nslots as u64;
        // Continuation slots before the end of the ring now hold payload bytes.
        for s in &mut self.shadow[(start + 1).min(n)..(start + nslots as usize).min(n)] {
            *s = UNKNOWN;
        }
        let next_slot = (next & self.geo.mask()) as usize;
        let not_yet = (next >> self.geo.shift()) as u32 as u64;
        if self.shadow[next_slot] != not_yet {
            // Relaxed: ordered before the consumer can look at this slot by the Release store of
            // this message's stamp in `publish` (the consumer only polls `next` after seeing it).
            self.mem.stamp(next_slot).store(not_yet as u32, Ordering::Relaxed);
            self.shadow[next_slot] = not_yet;
        }
    }

    /// Publishes the message of `nslots` slots written at `head` (after `prepare`).
    #[inline]
    fn publish(&mut self, nslots: u32) {
        let start = (self.head & self.geo.mask()) as usize;
        let stamp = ((self.head >> self.geo.shift()) + 1) as u32;
        self.shadow[start] = stamp as u64;
        // Release: publishes the slot (fields, header, payload, the cell's contents and the next
        // slot's marker); pairs with the Acquire load in Consumer::peek.
        self.mem.stamp(start).store(stamp, Ordering::Release);
        self.head += nslots as u64;
    }

    /// Test hook: writes `bytes` at `offset` of the slot where the next message starts. With
    /// `publish`, the slot is then published as a one-slot message (whatever its fields say);
    /// without, only the bytes change (e.g. a garbage stamp).
    pub(crate) fn corrupt_next(&mut self, offset: usize, bytes: &[u8], publish: bool) {
        let offset = offset.min(SLOT);
        let len = bytes.len().min(SLOT - offset);
        let start = (self.head & self.geo.mask()) as usize;
        // SAFETY: offset + len <= 64: the writes stay inside one slot of the ring.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.slot(start).add(offset), len) };
        if publish {
            self.prepare(1);
            self.publish(1);
        } else {
            self.shadow[start] = UNKNOWN;
        }
    }
}

/// Writes the fixed fields of a first slot (everything but the stamp and the payload).
///
/// # Safety
/// `slot` is valid for writes of 64 bytes and 4-byte aligned.
#[inline]
unsafe fn write_fields(slot: *mut u8, nslots: u16, kind: u8, plen: u32, hdr: &[u8; Header::WIRE_LEN]) {
    // SAFETY: every offset is inside the slot; the caller guarantees it is writable and aligned.
    unsafe {
        ptr::write(slot.add(OFF_NSLOTS).cast::<u16>(), nslots);
        ptr::write(slot.add(OFF_KIND), kind);
        ptr::write(slot.add(OFF_FLAGS), 0);
        ptr::write(slot.add(OFF_PLEN).cast::<u32>(), plen);
        ptr::copy_nonoverlapping(hdr.as_ptr(), slot.add(OFF_HEADER), Header::WIRE_LEN);
    }
}

/// Where an arrived message's payload is.
#[derive(Debug)]
pub(crate) enum Body<'a> {
    /// In the slots, borrowed.
    Inline(&'a [u8]),
    /// In the sender's send cell `index`; `len` is not yet checked against the cell size.
    Cell {
        /// The cell index as the slot gives it (not yet checked against the pool).
        index: u32,
        /// The payload length.
        len: usize,
    },
}

/// A message at the consumer's position, validated and borrowed from the ring.
#[derive(Debug)]
pub(crate) struct Arrival<'a> {
    /// Slots to consume once the message is handled.
    pub nslots: u32,
    /// The engine header.
    pub hdr: &'a [u8; Header::WIRE_LEN],
    /// The payload.
    pub body: Body<'a>,
}

/// The receiving side of a ring (the ring is in the peer's segment; this state is ours).
#[derive(Debug)]
pub(crate) struct Consumer {
    mem: RingMem,
    geo: Geometry,
    /// Position of the next message. Always at a message boundary.
    expected: u64,
    /// Last position stored into `read`; `published <= expected`.
    published: u64,
}

// SAFETY: the Consumer is the only reader of its ring's slots and the only writer of `read`;
// moving it to another thread moves that role with it.
unsafe impl Send for Consumer {}

impl Consumer {
    /// A consumer for the ring at `base`.
    ///
    /// # Safety
    /// `base` is 128-byte aligned and valid for reads and writes of `geo.bytes()` bytes for the
    /// life of the consumer, and no other consumer reads this ring.
    pub(crate) unsafe fn new(base: NonNull<u8>, geo: Geometry) -> Consumer {
        assert_eq!(base.as_ptr() as usize % CONTROL, 0, "ring memory must be 128-byte aligned");
        Consumer { mem: RingMem { base }, geo, expected: 0, published: 0 }
    }

    /// Whether the expected position may hold something: its stamp is not the "not yet" value
    /// (an arrival, or a corrupt slot that [`Consumer::peek`] reports). One load of a line that
    /// stays in this core's cache while nothing arrives: the check of an idle poll.
    #[inline]
    pub(crate) fn may_have_arrival(&self) -> bool {
        let index = (self.expected & self.geo.mask()) as usize;
        let lap = self.expected >> self.geo.shift();
        // Relaxed: only a hint; `peek` loads the stamp again with Acquire before reading the slot.
        self.mem.stamp(index).load(Ordering::Relaxed) != lap as u32
    }

    /// The message at the expected position: `Ok(None)` when it has not arrived, `Err` (what is
    /// wrong) when the slot is corrupt. Every field read from shared memory is read once and
    /// checked before use.
    #[inline]
    pub(crate) fn peek(&self) -> Result<Option<Arrival<'_>>, String> {
        let index = (self.expected & self.geo.mask()) as usize;
        let lap = self.expected >> self.geo.shift();
        // Acquire: pairs with the Release store of the stamp in Producer::publish; makes the
        // slot's fields, header and payload (and a cell's contents) visible.
        let stamp = self.mem.stamp(index).load(Ordering::Acquire);
        let arrived = (lap + 1) as u32;
        if stamp != arrived {
            if stamp == lap as u32 {
                return Ok(None);
            }
            return Err(format!(
                "slot {index} has stamp {stamp}, expected {arrived} (arrived) or {} (empty)",
                lap as u32
            ));
        }
        let slot = self.mem.slot(index);
        // SAFETY: the slot is inside the ring; volatile reads copy each field exactly once, so
        // the values checked below are the values used even if a faulty peer rewrites the slot.
        let (nslots, kind, flags, plen) = unsafe {
            (
                ptr::read_volatile(slot.add(OFF_NSLOTS).cast::<u16>()) as u32,
                ptr::read_volatile(slot.add(OFF_KIND)),
                ptr::read_volatile(slot.add(OFF_FLAGS)),
                ptr::read_volatile(slot.add(OFF_PLEN).cast::<u32>()) as usize,
            )
        };
        if flags != 0 {
            return Err(format!("slot {index} has flags {flags:#x} (reserved, must be 0)"));
        }
        // SAFETY: bytes 12..48 of the slot, inside the ring, published by the stamp above.
        let hdr = unsafe { &*slot.add(OFF_HEADER).cast::<[u8; Header::WIRE_LEN]>() };
        let body = match kind {
            KIND_INLINE => {
                if plen > self.geo.inline_max() || nslots != Geometry::slots_for(plen) {
                    return Err(format!(
                        "slot {index}: inline message of {plen} bytes in {nslots} slots (limit {} bytes)",
                        self.geo.inline_max()
                    ));
                }
                // SAFETY: slots_for(plen) = nslots <= max_msg_slots = overflow + 1, so the payload
                // (bytes 48 .. 48 + plen of the slots from `index`) lies inside the ring; the
                // producer does not write these slots until we publish a read position past them.
                Body::Inline(unsafe { std::slice::from_raw_parts(slot.add(OFF_INLINE), plen) })
            }
            KIND_CELL => {
                if nslots != 1 {
                    return Err(format!("slot {index}: cell message claims {nslots} slots"));
                }
                // SAFETY: bytes 48..52 of the slot, inside the ring.
                let cell = unsafe { ptr::read_volatile(slot.add(OFF_INLINE).cast::<[u8; 4]>()) };
                Body::Cell { index: u32::from_le_bytes(cell), len: plen }
            }
            other => return Err(format!("slot {index} has unknown kind {other}")),
        };
        Ok(Some(Arrival { nslots, hdr, body }))
    }

    /// Moves past a handled message of `nslots` slots; publishes `read` every `N / 4` slots.
    #[inline]
    pub(crate) fn consume(&mut self, nslots: u32) {
        self.expected += nslots as u64;
        if self.expected - self.published >= (self.geo.slots / 4) as u64 {
            self.publish();
        }
    }

    /// The ring was found empty: publish consumption the producer has not seen yet, so that a
    /// producer waiting for space is not left waiting for us.
    #[inline]
    pub(crate) fn idle(&mut self) {
        if self.expected != self.published {
            self.publish();
        }
    }

    #[inline]
    fn publish(&mut self) {
        // Release: our reads of every slot before `expected` happen before the producer, after
        // its Acquire load in Producer::reserve, overwrites them.
        self.mem.read_pos().store(self.expected, Ordering::Release);
        self.published = self.expected;
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
