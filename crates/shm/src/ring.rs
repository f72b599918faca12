//! The single-producer single-consumer ring of one ordered pair of processes.
//!
//! The ring lives in the **sender's** segment (Chai §3.1: placed in the sender's memory by first
//! touch). It has two parts:
//! - **records**: one 128-byte record (a pair of cache lines, the unit of the adjacent-line
//!   prefetcher) per message, with the engine header and, for small eager messages, the payload
//!   itself (up to [`RECORD_INLINE`] bytes);
//! - **body**: 64-byte slots for payloads that do not fit in their record, contiguous from the
//!   first byte of a slot, so the receiver copies them out in whole lines.
//!
//! A whole eager message (the engine's common case) carries its header in compact form: the
//! context, tag and sequence id in 10 bytes ([`Header::is_compact`]), the length in the record's
//! own length field; every other header takes 36 bytes of its record.
//!
//! The sender owns a [`Producer`], the receiver a [`Consumer`]; each keeps its indices in its own
//! private memory, and the only shared words are the records, the body slots and the consumer's
//! published read positions.
//!
//! # Ring memory
//!
//! ```text
//! offset   0  line 0   read: AtomicU64 — records the consumer has finished with;
//!                      body_read: AtomicU64 (offset 8) — body slots likewise; both written by
//!                      the consumer only, in batches; read by the producer when the ring
//!                      or its cells run short, when reclaiming cells, and to time a line
//! offset  64  line 1   shared_sample: AtomicU64 — the producer's latest line-transfer time
//!                      (`count << 32 | ns`, see `Producer::share_sample`), written by the
//!                      producer only, rarely; the rest padding (the adjacent-line prefetcher
//!                      fetches 128-byte pairs)
//! offset 128  record 0 .. N-1, 128 bytes each
//! then        body slot 0 .. N-1, 64 bytes each, then OVERFLOW = max_msg_slots - 1 slots, so a
//!             body never wraps
//! ```
//!
//! # Record layout (128 bytes)
//!
//! ```text
//! byte  0..2   stamp   u16        lap + 1 once the record is complete; bytes 0..8 are one
//!                                 AtomicU64, written last (Release)
//! byte  2      kind    u8         see below
//! byte  3      zero    u8         0 (reserved; anything else is rejected)
//! byte  4..14  compact            compact kinds: the header's context (u16), tag (u32) and
//!                                 sequence id (u32); other kinds: zero
//! byte 14..16  plen    u16        payload length (kinds INLINE, BODY, FULL)
//! byte 16..128 inline  [u8; 112]  INLINE: the payload; FULL and FULL_CELL: the 36-byte header;
//!                                 CELL kinds: cell index u32 at 56, payload length u32 at 60
//!                                 (the second line is written only by INLINE payloads over 48
//!                                 bytes)
//! ```
//! Kinds, and where the header and payload are:
//! - `INLINE`: compact header, payload in the record (at most 112 bytes);
//! - `BODY`: compact header, payload in `ceil(plen / 64)` body slots;
//! - `FULL`: header in the record, payload (if any) in `ceil(plen / 64)` body slots;
//! - `CELL`: compact header, payload in a send cell;
//! - `FULL_CELL`: header in the record, payload in a send cell.
//!
//! # Positions and stamps
//!
//! Record positions and body positions count from 0 and never wrap (`u64`). The record at
//! position `p` is record `p % N` of lap `p / N`; every message takes one record. A message's
//! body starts at body position `b` (slot `b % N`) and takes `nbody` positions; a body running
//! past slot `N - 1` continues into the overflow slots, and the slots at the start of the next
//! lap that its positions stand for stay unused.
//!
//! The consumer waiting for record position `p` reads the stamp of record `p % N`:
//! - `lap(p) + 1`: the record has arrived;
//! - `lap(p)`: not yet (the value the record's previous message, one lap earlier, left);
//! - anything else: the record is corrupt, an [`Err`] for the caller to turn into
//!   `Error::Protocol`.
//!
//! Stamps are `u16` and compared after truncation, exact modulo 2^16 laps (the consumer is never
//! a lap behind the record it reads). Zero-filled memory is a valid empty ring.
//!
//! # Batching of the read positions
//!
//! The consumer publishes `read` and `body_read` when it has consumed at least `N / 4` records
//! since its last publication, or when it finds the ring empty with unpublished consumption
//! (without the second rule a producer could wait forever for a consumer that waits for it). The
//! producer caches the last values it loaded and reloads only when they say "possibly full".

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use polyrail_core::{Envelope, Header};

/// Bytes of one body slot (one cache line).
pub(crate) const SLOT: usize = 64;
/// Bytes of one record: a 128-byte pair of cache lines, the unit the adjacent-line prefetcher
/// fetches, so that a payload of up to [`RECORD_INLINE`] bytes travels with its header.
pub(crate) const RECORD: usize = 128;
/// Bytes of the control block in front of the records (two cache lines).
pub(crate) const CONTROL: usize = 128;
/// Payload bytes a record carries itself (kind `INLINE`).
pub(crate) const RECORD_INLINE: usize = RECORD - OFF_INLINE;

/// Record kind: compact header, payload in the record.
pub(crate) const KIND_INLINE: u8 = 1;
/// Record kind: compact header, payload in body slots.
pub(crate) const KIND_BODY: u8 = 2;
/// Record kind: header in the record, payload in body slots.
pub(crate) const KIND_FULL: u8 = 3;
/// Record kind: compact header, payload in a send cell.
pub(crate) const KIND_CELL: u8 = 4;
/// Record kind: header in the record, payload in a send cell.
pub(crate) const KIND_FULL_CELL: u8 = 5;

const OFF_KIND: usize = 2;
const OFF_ZERO: usize = 3;
const OFF_COMPACT: usize = 4;
const OFF_PLEN: usize = 14;
const OFF_INLINE: usize = 16;
const OFF_CELL: usize = 56;
const OFF_CELL_LEN: usize = 60;
const _: () = assert!(
    OFF_COMPACT + 10 == OFF_PLEN
        && OFF_INLINE + Header::WIRE_LEN <= OFF_CELL
        && OFF_CELL_LEN + 4 == SLOT
        && RECORD_INLINE <= 2 * SLOT
);

/// Shape of a ring; both sides of a pair must agree on it (checked at connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// `N`: records and body slots in the ring, a power of two, at least 16.
    pub slots: u32,
    /// Most body slots one message may take; `2..=min(slots / 4, MAX_MSG_SLOTS)` (at least a
    /// record's payload, so that every payload a record carries also fits in the body).
    pub max_msg_slots: u32,
}

impl Geometry {
    /// Most body slots a message may take whatever the ring's size: the payload length in a
    /// record is a `u16`.
    pub(crate) const MAX_MSG_SLOTS: u32 = 1023;

    /// A geometry of `slots` slots (a power of two, at least 16) and bodies of up to
    /// `max_msg_slots` slots, clamped to `2..=slots / 4` and to [`Geometry::MAX_MSG_SLOTS`].
    pub(crate) fn new(slots: u32, max_msg_slots: u32) -> Geometry {
        debug_assert!(slots.is_power_of_two() && slots >= 16);
        Geometry { slots, max_msg_slots: max_msg_slots.clamp(2, (slots / 4).min(Self::MAX_MSG_SLOTS)) }
    }

    /// Body slots after slot `N - 1` that a body may run into.
    pub(crate) fn overflow(&self) -> u32 {
        self.max_msg_slots - 1
    }

    /// Bytes of ring memory (control block, records, body slots and overflow slots).
    pub(crate) fn bytes(&self) -> usize {
        CONTROL + self.slots as usize * RECORD + (self.slots + self.overflow()) as usize * SLOT
    }

    /// Largest payload carried in the ring (larger ones go through send cells).
    #[inline]
    pub(crate) fn inline_max(&self) -> usize {
        self.max_msg_slots as usize * SLOT
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

/// How a message is laid out in the ring: its record kind and its body slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    kind: u8,
    nbody: u32,
}

impl Shape {
    /// The shape of a message with this header (compact or not) and `plen` payload bytes in the
    /// ring (`cell`: in a send cell).
    #[inline]
    fn of(compact: bool, plen: usize, cell: bool) -> Shape {
        match (compact, cell) {
            (true, false) if plen <= RECORD_INLINE => Shape { kind: KIND_INLINE, nbody: 0 },
            (true, false) => Shape { kind: KIND_BODY, nbody: plen.div_ceil(SLOT) as u32 },
            (false, false) => Shape { kind: KIND_FULL, nbody: plen.div_ceil(SLOT) as u32 },
            (true, true) => Shape { kind: KIND_CELL, nbody: 0 },
            (false, true) => Shape { kind: KIND_FULL_CELL, nbody: 0 },
        }
    }
}

/// What a record says of its message's header.
#[derive(Clone, Copy, Debug)]
enum RecordHeader<'a> {
    /// Context, tag and sequence id in the record's compact bytes (a whole eager message).
    Compact(Envelope),
    /// The whole header, encoded in the record's inline bytes.
    Whole(&'a Header),
}

impl<'a> RecordHeader<'a> {
    /// `hdr` in compact form when `compact` (`hdr.is_compact(..)` said so), else whole.
    #[inline]
    fn of(hdr: &'a Header, compact: bool) -> Self {
        if compact {
            Self::Compact(hdr.envelope())
        } else {
            Self::Whole(hdr)
        }
    }
}

/// Pointers into one ring's memory.
#[derive(Clone, Copy, Debug)]
struct RingMem {
    base: NonNull<u8>,
    geo: Geometry,
}

impl RingMem {
    /// # Safety
    /// `base` is 128-byte aligned and valid for `geo.bytes()` bytes while the ring is used.
    unsafe fn new(base: NonNull<u8>, geo: Geometry) -> RingMem {
        assert_eq!(base.as_ptr() as usize % CONTROL, 0, "ring memory must be 128-byte aligned");
        RingMem { base, geo }
    }

    #[inline]
    fn read_pos(&self) -> &AtomicU64 {
        // SAFETY: the ring memory starts 128-byte aligned and holds the control block; its first
        // 8 bytes are only ever accessed as this atomic.
        unsafe { &*self.base.as_ptr().cast::<AtomicU64>() }
    }

    #[inline]
    fn body_read_pos(&self) -> &AtomicU64 {
        // SAFETY: as `read_pos`, bytes 8..16 of the control block.
        unsafe { &*self.base.as_ptr().add(8).cast::<AtomicU64>() }
    }

    #[inline]
    fn shared_sample(&self) -> &AtomicU64 {
        // SAFETY: as `read_pos`, bytes 64..72 of the control block, only ever accessed as this
        // atomic.
        unsafe { &*self.base.as_ptr().add(64).cast::<AtomicU64>() }
    }

    #[inline]
    fn record(&self, index: usize) -> *mut u8 {
        // SAFETY: callers pass `index < slots`: a record inside the ring memory.
        unsafe { self.base.as_ptr().add(CONTROL + index * RECORD) }
    }

    #[inline]
    fn body_slot(&self, index: usize) -> *mut u8 {
        // SAFETY: callers pass `index < slots + overflow`: a body slot inside the ring memory.
        unsafe { self.base.as_ptr().add(CONTROL + self.geo.slots as usize * RECORD + index * SLOT) }
    }

    /// The first word of record `index`: the stamp in its low 16 bits, then bytes 2..8.
    #[inline]
    fn first_word(&self, index: usize) -> &AtomicU64 {
        // SAFETY: the record is 128-byte aligned inside the ring memory; its first 8 bytes are
        // only ever accessed as this atomic.
        unsafe { &*self.record(index).cast::<AtomicU64>() }
    }
}

/// How far ahead of the next record [`Consumer::consume`] prefetches one.
const RECORD_AHEAD: u64 = 3;

/// Asks for the line at `line` (inside a ring). A prefetch, not a load: the producer may be
/// writing the line, and a prefetch is no access to it (no data race), only a request for it.
#[inline(always)]
fn prefetch(line: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 never faults and reads nothing into the program.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// The stamp in a record's first word (its bytes 0..2, the word read as a little-endian `u64`).
#[inline]
fn stamp_of(first_word: u64) -> u16 {
    first_word as u16
}

/// The sending side of a ring. Private state lives here, in the sender's own memory.
#[derive(Debug)]
pub(crate) struct Producer {
    mem: RingMem,
    /// Next record position. Invariant: `cached_read <= read <= head <= cached_read + N`
    /// whenever the consumer behaves.
    head: u64,
    /// Last `read` loaded from shared memory; stale (lower than the real value) by design: a
    /// stale value only makes the ring look fuller than it is.
    cached_read: u64,
    /// Next body position; `cached_body_read <= body_read <= body_head <= cached_body_read + N`.
    body_head: u64,
    /// Last `body_read` loaded from shared memory.
    cached_body_read: u64,
    /// Last `read` loaded from shared memory, by `read_position` or `time_read_line`.
    seen_read: u64,
    /// Samples shared so far ([`Producer::share_sample`]).
    shared: u32,
}

// SAFETY: the Producer is the only writer of its ring's records and body slots; the raw pointer
// is to shared memory that stays mapped while the owning transport lives, and moving the
// Producer to another thread moves that sole writer with it.
unsafe impl Send for Producer {}

impl Producer {
    /// A producer for the ring at `base`.
    ///
    /// # Safety
    /// `base` is 128-byte aligned, valid for reads and writes of `geo.bytes()` bytes for the life
    /// of the producer, holds a fresh ring (zero-filled), and no other producer writes it.
    pub(crate) unsafe fn new(base: NonNull<u8>, geo: Geometry) -> Producer {
        // SAFETY: the caller's guarantees.
        let mem = unsafe { RingMem::new(base, geo) };
        Producer { mem, head: 0, cached_read: 0, body_head: 0, cached_body_read: 0, seen_read: 0, shared: 0 }
    }

    /// Whether a record and `nbody` body slots are free. `Err` names a read position the
    /// consumer could not have published.
    #[inline]
    fn reserve(&mut self, nbody: u32) -> Result<bool, String> {
        let n = self.mem.geo.slots as u64;
        let need = self.head + 1;
        let body_need = self.body_head + nbody as u64;
        if need - self.cached_read <= n && body_need - self.cached_body_read <= n {
            return Ok(true);
        }
        self.reload(need, body_need)
    }

    /// [`Producer::reserve`] when the cached read positions say "possibly full": loads them.
    #[cold]
    fn reload(&mut self, need: u64, body_need: u64) -> Result<bool, String> {
        let n = self.mem.geo.slots as u64;
        let read = self.read_position()?;
        // Acquire: as in `read_position`, for the body slots.
        let body_read = self.mem.body_read_pos().load(Ordering::Acquire);
        if body_read < self.cached_body_read || body_read > self.body_head {
            return Err(format!(
                "consumer published body read position {body_read}, outside {}..={} (body slots written)",
                self.cached_body_read, self.body_head
            ));
        }
        self.cached_body_read = body_read;
        Ok(need - read <= n && body_need - body_read <= n)
    }

    /// The consumer's read position as it published it last (checked: `Err` names a position it
    /// could not have published): it has read every record below it, and the send cells they
    /// name ([`crate::cells::SendCells::reclaim`]).
    #[inline]
    pub(crate) fn read_position(&mut self) -> Result<u64, String> {
        // Acquire: pairs with the Release store in Consumer::publish, so the consumer's reads of
        // the records below the position and of their cells happen before we overwrite them.
        let read = self.mem.read_pos().load(Ordering::Acquire);
        if read < self.cached_read || read > self.head {
            return Err(format!(
                "consumer published read position {read}, outside {}..={} (records written)",
                self.cached_read, self.head
            ));
        }
        (self.cached_read, self.seen_read) = (read, read);
        Ok(read)
    }

    /// How long, in nanoseconds beyond the timer's own cost, loading the consumer's read
    /// position took, when the consumer published a new one since this producer last loaded it
    /// (so the line had to come from the consumer's cache); `None` otherwise. A cheap measure of
    /// how near the two cores are: on an AMD EPYC host (an earlier record, in git history) 20 ns with both
    /// vCPUs in one core complex, 110-120 ns apart.
    ///
    /// Only a position that leaves at most `unread` of our messages unread counts: a consumer
    /// further behind is taking a stream of them and writes the line again soon, and the load
    /// waits behind those writes (on the Intel Xeon host, osu_bw 4 KiB: seven of a peer's latest
    /// nine samples beyond 100 ns several times a run, where an idle line takes 55-95).
    pub(crate) fn time_read_line(&mut self, unread: u64) -> Option<u32> {
        let timer = Instant::now().elapsed();
        let start = Instant::now();
        // Relaxed: only the value's change and the load's duration matter here (`reload` loads
        // it again with Acquire before relying on it).
        let read = self.mem.read_pos().load(Ordering::Relaxed);
        let took = start.elapsed();
        if read == self.seen_read {
            return None;
        }
        self.seen_read = read;
        if self.head.wrapping_sub(read) > unread {
            return None;
        }
        Some(took.saturating_sub(timer).as_nanos().min(u32::MAX as u128) as u32)
    }

    /// Publishes `ns`, a line-transfer time this producer measured ([`Producer::time_read_line`]),
    /// for the consumer: the two cores are as near to each other either way, and a consumer
    /// that sends little (the receiver of a one-way stream) has no fresh line of its own to
    /// time ([`Consumer::shared_sample`]).
    pub(crate) fn share_sample(&mut self, ns: u32) {
        self.shared = self.shared.wrapping_add(1);
        // Relaxed: a hint read on its own; nothing else is published with it.
        self.mem.shared_sample().store(u64::from(self.shared) << 32 | u64::from(ns), Ordering::Relaxed);
    }

    /// Writes a message whose payload goes into the ring (`payload.len() <= inline_max()`): in its
    /// record ([`Producer::try_push_compact`]) or in body slots; `Ok(false)` when the ring is full.
    ///
    /// Order of the writes: the payload (into body slots, or the record's inline bytes), then the
    /// rest of the record from byte 8, then its first word with the stamp; the consumer spins on
    /// the record's line, so writing that line in one burst lets it move to the consumer once
    /// instead of twice.
    #[inline]
    pub(crate) fn try_push_inline(&mut self, hdr: &Header, payload: &[u8]) -> Result<bool, String> {
        let plen = payload.len();
        assert!(plen <= self.mem.geo.inline_max(), "inline payload over the ring's limit");
        let compact = hdr.is_compact(plen);
        if compact && plen <= RECORD_INLINE {
            return self.try_push_compact(hdr.envelope(), payload);
        }
        // The payload goes into body slots (kind BODY or FULL).
        let shape = Shape::of(compact, plen, false);
        if !self.reserve(shape.nbody)? {
            return Ok(false);
        }
        let body = self.mem.body_slot((self.body_head & self.mem.geo.mask()) as usize);
        self.body_head += shape.nbody as u64;
        // SAFETY: `reserve` said the body's positions are released; it starts at a slot below N
        // and nbody <= max_msg_slots = overflow + 1 (plen <= inline_max), so the bytes lie
        // inside the body slots; nobody reads them until the record's stamp is published.
        unsafe { ptr::copy_nonoverlapping(payload.as_ptr(), body, plen) };
        self.write_record(shape.kind, RecordHeader::of(hdr, compact), plen as u16, None);
        Ok(true)
    }

    /// [`Producer::try_push_inline`] for the common case, with nothing else to decide: a whole
    /// eager message (`env.header(payload.len())`) whose payload fits in the record.
    #[inline(always)]
    pub(crate) fn try_push_compact(&mut self, env: Envelope, payload: &[u8]) -> Result<bool, String> {
        let plen = payload.len();
        assert!(plen <= RECORD_INLINE, "payload over a record");
        if !self.reserve(0)? {
            return Ok(false);
        }
        let record = self.mem.record((self.head & self.mem.geo.mask()) as usize);
        // A call to `memcpy`, on purpose: copying small payloads inline (fewer instructions, no
        // call) measured slower, at 8 B one way and in osu_bw of 64 B messages.
        // SAFETY: plen <= 112: bytes 16..128 of the record, released by the consumer (`reserve`)
        // and read by it only after the stamp is published.
        unsafe { ptr::copy_nonoverlapping(payload.as_ptr(), record.add(OFF_INLINE), plen) };
        self.write_record(KIND_INLINE, RecordHeader::Compact(env), plen as u16, None);
        Ok(true)
    }

    /// Whether a record is free for a message whose payload goes through a send cell.
    #[inline]
    pub(crate) fn reserve_cell(&mut self) -> Result<bool, String> {
        self.reserve(0)
    }

    /// Writes a message whose payload (`plen` bytes) the caller already copied into send cell
    /// `cell`. The caller has had `reserve_cell` answer `Ok(true)`.
    #[inline]
    pub(crate) fn push_cell(&mut self, hdr: &Header, plen: u32, cell: u32) {
        let compact = hdr.is_compact(plen as usize);
        let kind = Shape::of(compact, plen as usize, true).kind;
        self.write_record(kind, RecordHeader::of(hdr, compact), 0, Some((cell, plen)));
    }

    /// Writes the record at `head` (payload already in place): the header whole when it has no
    /// compact form, the cell, byte 8's word (compact header tail and `plen`), then the first
    /// word with the stamp; moves the head.
    #[inline]
    fn write_record(&mut self, kind: u8, header: RecordHeader, plen: u16, cell: Option<(u32, u32)>) {
        let index = (self.head & self.mem.geo.mask()) as usize;
        let record = self.mem.record(index);
        let stamp = ((self.head >> self.mem.geo.shift()) + 1) as u16;
        // Bytes 0..8 and 8..16 as little-endian words: stamp, kind, zero, then the compact
        // header (context, tag, sequence id), then the payload length.
        let (mut first, mut second) = (u64::from(stamp) | u64::from(kind) << 16, u64::from(plen) << 48);
        if let RecordHeader::Compact(env) = header {
            first |= u64::from(env.ctx()) << 32 | u64::from(env.tag()) << 48;
            second |= u64::from(env.tag() >> 16) | u64::from(env.seq()) << 16;
        }
        // SAFETY: the record is inside the ring, 128-byte aligned, and released by the consumer
        // (`reserve`); its bytes from 8 are written here only, and read by the consumer only
        // after the first word is published.
        unsafe {
            if let RecordHeader::Whole(hdr) = header {
                let mut wire = [0u8; Header::WIRE_LEN];
                hdr.encode(&mut wire);
                ptr::copy_nonoverlapping(wire.as_ptr(), record.add(OFF_INLINE), Header::WIRE_LEN);
            }
            if let Some((index, len)) = cell {
                let word = u64::from(index) | u64::from(len) << 32;
                ptr::write(record.add(OFF_CELL).cast::<[u8; 8]>(), word.to_le_bytes());
            }
            ptr::write(record.add(8).cast::<[u8; 8]>(), second.to_le_bytes());
        }
        // Release: publishes the record (the stamp and bytes 2..8 in this word, the rest written
        // before), its body and the cell's contents; pairs with the Acquire load in
        // Consumer::take.
        self.mem.first_word(index).store(first, Ordering::Release);
        self.head += 1;
    }

    /// Messages pushed so far.
    #[inline]
    pub(crate) fn pushed(&self) -> u64 {
        self.head
    }

    /// Test hook: writes `bytes` at `offset` of the record where the next message goes. With
    /// `publish`, the record is then published (whatever its fields say); without, only the
    /// bytes change (e.g. a garbage stamp).
    pub(crate) fn corrupt_next(&mut self, offset: usize, bytes: &[u8], publish: bool) {
        let offset = offset.min(RECORD);
        let len = bytes.len().min(RECORD - offset);
        let index = (self.head & self.mem.geo.mask()) as usize;
        // SAFETY: offset + len <= 128: the writes stay inside one record.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.record(index).add(offset), len) };
        if publish {
            // The record as it now is, with the stamp of an arrived message.
            let word = self.mem.first_word(index).load(Ordering::Relaxed) & !0xffff;
            let stamp = ((self.head >> self.mem.geo.shift()) + 1) as u16;
            // Release: as in write_record.
            self.mem.first_word(index).store(word | u64::from(stamp), Ordering::Release);
            self.head += 1;
        }
    }
}

/// Where an arrived message's payload is.
#[derive(Debug)]
pub(crate) enum Body<'a> {
    /// In the ring, borrowed.
    Inline(&'a [u8]),
    /// In the sender's send cell `index`; `len` is not yet checked against the cell size.
    Cell {
        /// The cell index as the record gives it (not yet checked against the pool).
        index: u32,
        /// The payload length.
        len: usize,
    },
}

/// The receiving side of a ring (the ring is in the peer's segment; this state is ours).
#[derive(Debug)]
pub(crate) struct Consumer {
    mem: RingMem,
    /// Position of the next record.
    expected: u64,
    /// Last position stored into `read`; `published <= expected`.
    published: u64,
    /// Body position of the next message's body.
    body_expected: u64,
    /// Body slots of the last message (at most 16): idle polls prefetch as many of the next
    /// ones (see [`Consumer::prefetch_next_payload`]).
    expect_body: u32,
    /// The last message's payload reached its record's second line, and line transfers are
    /// slow: idle polls prefetch the second line of the next record too.
    expect_buddy: bool,
    /// Line transfers from the producer's core are slow ([`Consumer::set_slow_lines`]).
    slow_lines: bool,
    /// The last value of the producer's shared sample taken ([`Consumer::shared_sample`]).
    seen_sample: u64,
}

// SAFETY: the Consumer is the only reader of its ring's records and body and the only writer of
// the read positions; moving it to another thread moves that role with it.
unsafe impl Send for Consumer {}

impl Consumer {
    /// A consumer for the ring at `base`.
    ///
    /// # Safety
    /// `base` is 128-byte aligned and valid for reads and writes of `geo.bytes()` bytes for the
    /// life of the consumer, and no other consumer reads this ring.
    pub(crate) unsafe fn new(base: NonNull<u8>, geo: Geometry) -> Consumer {
        // SAFETY: the caller's guarantees.
        let mem = unsafe { RingMem::new(base, geo) };
        Consumer {
            mem,
            expected: 0,
            published: 0,
            body_expected: 0,
            expect_body: 0,
            expect_buddy: false,
            slow_lines: false,
            seen_sample: 0,
        }
    }

    /// The producer's latest line-transfer time ([`Producer::share_sample`]), when it shared one
    /// since the last call; `None` otherwise. Only a hint (the placement's): whatever a peer
    /// writes there changes nothing else.
    pub(crate) fn shared_sample(&mut self) -> Option<u32> {
        // Relaxed: see `share_sample`.
        let v = self.mem.shared_sample().load(Ordering::Relaxed);
        if v == self.seen_sample {
            return None;
        }
        self.seen_sample = v;
        Some(v as u32)
    }

    /// Whether the expected position may hold something: its stamp is not the "not yet" value
    /// (an arrival, or a corrupt record that [`Consumer::take`] reports). One load of a line that
    /// stays in this core's cache while nothing arrives: the check of an idle poll (after a
    /// message with payload lines of its own, also a prefetch of where the next one's go).
    #[inline]
    pub(crate) fn may_have_arrival(&self) -> bool {
        let index = (self.expected & self.mem.geo.mask()) as usize;
        let lap = (self.expected >> self.mem.geo.shift()) as u16;
        if self.expect_body > 0 || self.expect_buddy {
            self.prefetch_next_payload(index);
        }
        // Relaxed: only a hint; `take` loads the stamp again with Acquire before reading.
        stamp_of(self.mem.first_word(index).load(Ordering::Relaxed)) != lap
    }

    /// Prefetches the lines the next message's payload would take if it is shaped like the
    /// last one while waiting for its record (record `index`): its record's second line, or its
    /// body slots (at most 16). The producer writes a payload before its record's first word, so
    /// once both are written the next poll misses on all those lines at once, instead of
    /// fetching the payload only after the record said there is one: one cache-line transfer
    /// less per message. Paired runs (ping-pong, one way, medians of 66 pairs apart and 384
    /// near), body slots: 64 B apart 0.422 -> 0.325 µs and near 0.129 -> 0.125, 512 B apart
    /// 0.573 -> 0.480 and near unchanged (0.176); 8 B within 1.5 % (no payload line, no
    /// prefetch); osu_bw 64 B-4 KiB within 4 %. The second line only while line transfers are
    /// slow ([`Consumer::set_slow_lines`]). Out of line: inlined into the poll, it cost 8 B
    /// near 2 ns.
    #[inline(never)]
    fn prefetch_next_payload(&self, index: usize) {
        let mask = self.mem.geo.mask();
        // SAFETY: `index` is masked below N: the record and its second line (RECORD = 2 * SLOT)
        // are inside the ring.
        let buddy = self.expect_buddy.then(|| unsafe { self.mem.record(index).add(SLOT) });
        let bodies =
            (0..self.expect_body as u64).map(|k| self.mem.body_slot(((self.body_expected + k) & mask) as usize));
        for line in buddy.into_iter().chain(bodies) {
            prefetch(line);
        }
    }

    /// Whether line transfers from the producer's core are slow (the cores share no cache; off
    /// at first). While they are, idle polls also prefetch the second line of the next record
    /// after a message whose payload reached its record's second line (64 B one way apart
    /// 0.355 µs without, 0.319 with, 7-8 alternating runs); near, that prefetch competes with
    /// the producer's write of the line (0.113 without, 0.133 with). (Near, prefetching at most
    /// 8 body lines instead of 16 made 1 KiB one way 6 % faster but osu_bw 1 KiB 7 % slower, 14
    /// alternating runs: not adopted.)
    pub(crate) fn set_slow_lines(&mut self, slow: bool) {
        self.slow_lines = slow;
        self.expect_buddy &= slow;
    }

    /// Hands the message at the expected position to `handle`, with its header and payload
    /// borrowed, and moves past it when `handle` returns `Ok`. `Ok(false)`: nothing has
    /// arrived. `Err` (what is wrong): the record is corrupt, or `handle` refused the message
    /// (which then stays). Every field read from shared memory is read once and checked before
    /// use.
    #[inline]
    pub(crate) fn take(
        &mut self,
        handle: impl FnOnce(&Header, Body<'_>) -> Result<(), String>,
    ) -> Result<bool, String> {
        let geo = self.mem.geo;
        let index = (self.expected & geo.mask()) as usize;
        let lap = self.expected >> geo.shift();
        // Acquire: pairs with the Release store of the first word in Producer::write_record; makes
        // the record, the body and a cell's contents visible.
        let first = self.mem.first_word(index).load(Ordering::Acquire);
        let (stamp, arrived) = (stamp_of(first), (lap + 1) as u16);
        if stamp != arrived {
            if stamp == lap as u16 {
                return Ok(false);
            }
            return Err(format!(
                "record {index} has stamp {stamp}, expected {arrived} (arrived) or {} (empty)",
                lap as u16
            ));
        }
        let record = self.mem.record(index);
        // SAFETY: bytes 8..16 of the record, inside the ring, 8-byte aligned, published by the
        // first word; one volatile read, so the values checked below are the values used even if
        // a faulty peer rewrites the record.
        let second = unsafe { ptr::read_volatile(record.add(8).cast::<u64>()) };
        let zero = (first >> (8 * OFF_ZERO)) as u8;
        if zero != 0 {
            return Err(format!("record {index} has reserved byte {zero:#x} (must be 0)"));
        }
        let kind = (first >> (8 * OFF_KIND)) as u8;
        let cell = || {
            // SAFETY: bytes 56..64 of the record, as above.
            let word = unsafe { ptr::read_volatile(record.add(OFF_CELL).cast::<u64>()) };
            (word as u32, (word >> 32) as u32 as usize)
        };
        let (compact, plen, cell) = match kind {
            KIND_INLINE | KIND_BODY | KIND_FULL => {
                (kind != KIND_FULL, (second >> (8 * (OFF_PLEN - 8))) as u16 as usize, None)
            }
            KIND_CELL | KIND_FULL_CELL => {
                let (index, len) = cell();
                (kind == KIND_CELL, len, Some(index))
            }
            other => return Err(format!("record {index} has unknown kind {other}")),
        };
        let shape = Shape::of(compact, plen, cell.is_some());
        if shape.kind != kind || (cell.is_none() && plen > geo.inline_max()) {
            return Err(format!(
                "record {index}: kind {kind} with {plen} payload bytes (inline limit {} bytes)",
                geo.inline_max()
            ));
        }
        let hdr = if compact {
            let tag = (first >> 48) as u32 | (second as u32 & 0xffff) << 16;
            Header::eager((first >> 32) as u16, tag, (second >> 16) as u32, plen as u64)
        } else {
            // SAFETY: bytes 16..52 of the record, inside the ring and published; one volatile
            // read, as for the first words.
            let wire = unsafe { ptr::read_volatile(record.add(OFF_INLINE).cast::<[u8; Header::WIRE_LEN]>()) };
            Header::parse(&wire).map_err(|what| format!("record {index}: {what}"))?
        };
        let payload = match (kind, cell) {
            // SAFETY: plen <= 112 (the shape check): bytes 16..16 + plen of the record, published.
            (KIND_INLINE, _) => Body::Inline(unsafe { std::slice::from_raw_parts(record.add(OFF_INLINE), plen) }),
            (_, Some(index)) => Body::Cell { index, len: plen },
            _ => {
                let body = self.mem.body_slot((self.body_expected & geo.mask()) as usize);
                // SAFETY: nbody <= max_msg_slots = overflow + 1 (the inline limit, checked
                // above), so `plen` bytes from a slot below N lie inside the body slots and
                // overflow; published by the stamp, and not written by the producer until we
                // publish a body read position past them.
                Body::Inline(unsafe { std::slice::from_raw_parts(body, plen) })
            }
        };
        handle(&hdr, payload)?;
        self.expect_body = shape.nbody.min(16);
        let two_lines = kind == KIND_INLINE && plen > SLOT - OFF_INLINE;
        self.expect_buddy = self.slow_lines && two_lines;
        self.consume(shape.nbody, two_lines);
        Ok(true)
    }

    /// Moves past a handled message whose body took `nbody` slots; publishes the read positions
    /// every `N / 4` records. Prefetches the record [`RECORD_AHEAD`] positions on: in a stream
    /// the producer wrote it already, and its line then travels while the messages before it
    /// are handled. Alternating runs against no prefetch: osu_bw near 8 B 1.01x, 64 B 1.07x,
    /// 512 B 0.99x (16 runs), apart 8 B 1.07x, 64 B 1.05x (8); 8 B one way near 0.97x (12).
    /// After a message whose payload reached its record's second line (`two_lines`), that
    /// record's second line too: osu_bw 64 B near 1.06-1.14x, 100 B 1.04x, apart 64 B 1.11x
    /// (12-16 alternating runs; 4 apart), 64 B one way unchanged.
    #[inline]
    fn consume(&mut self, nbody: u32, two_lines: bool) {
        self.expected += 1;
        self.body_expected += nbody as u64;
        let ahead = self.mem.record(((self.expected + RECORD_AHEAD) & self.mem.geo.mask()) as usize);
        prefetch(ahead);
        if two_lines {
            // SAFETY: a record is two lines inside the ring.
            prefetch(unsafe { ahead.add(SLOT) });
        }
        if self.expected - self.published >= (self.mem.geo.slots / 4) as u64 {
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
        // Release (both): our reads of every record and body slot before these positions happen
        // before the producer, after its Acquire loads in Producer::reserve, overwrites them.
        self.mem.body_read_pos().store(self.body_expected, Ordering::Release);
        self.mem.read_pos().store(self.expected, Ordering::Release);
        self.published = self.expected;
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
