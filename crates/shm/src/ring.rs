//! The single-producer single-consumer ring of one ordered pair of processes.
//!
//! A ring has two parts:
//! - **records**: one 32-byte record per message, in the pair's shared *lanes*. Lane line `k`
//!   (64 bytes) holds record `k` of both directions of the pair, one half each. A reply written
//!   into the line of the message it answers moves between the two caches with it: in a
//!   ping-pong one cache line crosses per message, as in the cache-line floor, where separate
//!   lines per direction cost 1.5x (near) to 1.6x (apart) that on the AMD EPYC host
//!   (`docs/benchmarks/epyc-probes`). Small eager messages (up to [`FIRST_INLINE`] bytes) fit
//!   in their record whole.
//! - **body**: 64-byte slots in the **sender's** segment (Chai §3.1: placed in the sender's
//!   memory by first touch) for what does not fit in a record: larger payloads, full engine
//!   headers.
//!
//! The sender owns a [`Producer`], the receiver a [`Consumer`]; each keeps its indices in its own
//! private memory, and the only shared words are the records, the body slots and the consumer's
//! published read positions.
//!
//! # Ring memory (in the sender's segment)
//!
//! ```text
//! offset   0  line 0   read: AtomicU64 — records the consumer has finished with;
//!                      body_read: AtomicU64 (offset 8) — body slots likewise; both written by
//!                      the consumer only, in batches; read by the producer only when full
//! offset  64  line 1   padding (the adjacent-line prefetcher fetches 128-byte pairs)
//! offset 128  body slot 0 .. N-1, 64 bytes each,
//!             then OVERFLOW = max_msg_slots - 1 slots, so a multi-slot body never wraps
//! then        lanes (128-byte aligned): N lines of 64 bytes. Used only in the segment of the lower rank of the pair
//!             (both directions' records of the pair live there); the lower rank's records use
//!             bytes 0..32 of each line, the higher rank's bytes 32..64.
//! ```
//!
//! # Record layout (32 bytes)
//!
//! ```text
//! byte  0..2   stamp   AtomicU16  lap + 1 once the record is complete; written last (Release)
//! byte  2      kind    u8         see below
//! byte  3      zero    u8         0 (reserved; anything else is rejected)
//! byte  4..14  compact [u8; 10]   the engine header's compact form (Header::compact) or zero
//! byte 14..16  plen    u16        payload length (kinds HALF, BODY, FULL); skip distance (SKIP)
//! byte 16..32  inline  [u8; 16]   the payload (HALF); cell index u32 and length u32 (CELL kinds)
//! ```
//! Kinds, and where the header and payload are:
//! - `HALF`: compact header, payload in the record (at most 16 bytes);
//! - `BODY`: compact header, payload in `ceil(plen / 64)` body slots;
//! - `FULL`: the 36-byte header then the payload, contiguous in `ceil((36 + plen) / 64)` slots;
//! - `CELL`: compact header, payload in a send cell;
//! - `FULL_CELL`: the header in one body slot, payload in a send cell;
//! - `SKIP`: no message; the next record is `plen` positions further (see *Alignment*).
//!
//! # Positions and stamps
//!
//! Record positions and body positions count from 0 and never wrap (`u64`). The record at
//! position `p` is in lane line `p % N`, lap `p / N`; every record takes one position but a skip,
//! which takes its distance. A message's body starts at body position `b` (slot `b % N`) and
//! takes `nbody` positions; a body running past slot `N - 1` continues into the overflow slots
//! and the slots at the start of the next lap that its positions stand for stay unused.
//!
//! The consumer waiting for record position `p` reads the stamp of record `p % N`:
//! - `lap(p) + 1`: the record has arrived;
//! - `lap(p)`: not yet (the value a record one lap earlier left, or the marker below);
//! - anything else: the record is corrupt, an [`Err`] for the caller to turn into
//!   `Error::Protocol`.
//!
//! Stamps are `u16` and compared after truncation, exact modulo 2^16 laps (the consumer is never
//! a lap behind the slot it reads). Zero-filled memory is a valid empty ring.
//!
//! A record position skipped over (by a `SKIP`) keeps the stamp of an older lap. The producer
//! keeps a private shadow of every stamp and, before publishing a record, writes the "not yet"
//! marker where the *next* record will be when the shadow says it is not already there; without
//! skips it never needs to. The marker's record must already be released by the consumer, so the
//! producer keeps one record position free: `head + 1 + 1 - read <= N`.
//!
//! # Alignment
//!
//! Both directions of a pair start at position 0, so in a ping-pong the reply to the message in
//! line `k` goes into line `k` too. After traffic in one direction only, the two heads differ;
//! before its next message the producer compares its head with the line of the last message it
//! consumed from the peer ([`Producer::align`]): when its head is a little behind (at most a
//! quarter of the ring), it writes a `SKIP` record and moves its head to that line. A producer
//! ahead of the peer leaves it to the peer, which moves when it replies. A stream in one
//! direction never skips (nothing is consumed between its messages).
//!
//! # Batching of the read positions
//!
//! The consumer publishes `read` and `body_read` when it has consumed at least `N / 4` records
//! since its last publication, or when it finds the ring empty with unpublished consumption
//! (without the second rule a producer could wait forever for a consumer that waits for it). The
//! producer caches the last values it loaded and reloads only when they say "possibly full".

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use polyrail_core::Header;

/// Bytes of one body slot (one cache line).
pub(crate) const SLOT: usize = 64;
/// Bytes of one record (half a lane line).
pub(crate) const RECORD: usize = 32;
/// Bytes of the control block in front of the body slots (two cache lines).
pub(crate) const CONTROL: usize = 128;
/// Payload bytes a record carries itself (kind `HALF`).
pub(crate) const FIRST_INLINE: usize = 16;

/// Record kind: compact header, payload in the record.
pub(crate) const KIND_HALF: u8 = 1;
/// Record kind: compact header, payload in body slots.
pub(crate) const KIND_BODY: u8 = 2;
/// Record kind: full header and payload in body slots.
pub(crate) const KIND_FULL: u8 = 3;
/// Record kind: compact header, payload in a send cell.
pub(crate) const KIND_CELL: u8 = 4;
/// Record kind: full header in a body slot, payload in a send cell.
pub(crate) const KIND_FULL_CELL: u8 = 5;
/// Record kind: no message; skip `plen` positions.
pub(crate) const KIND_SKIP: u8 = 6;

const OFF_KIND: usize = 2;
const OFF_ZERO: usize = 3;
const OFF_COMPACT: usize = 4;
const OFF_PLEN: usize = 14;
const OFF_INLINE: usize = 16;
const OFF_CELL_LEN: usize = 20;
const _: () = assert!(OFF_COMPACT + Header::COMPACT_LEN == OFF_PLEN && OFF_INLINE + FIRST_INLINE == RECORD);

/// Shape of a ring; both sides of a pair must agree on it (checked at connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// `N`: records and body slots in the ring, a power of two, at least 16.
    pub slots: u32,
    /// Most body slots one message may take; `1..=min(slots / 4, MAX_MSG_SLOTS)`.
    pub max_msg_slots: u32,
}

impl Geometry {
    /// Most body slots a message may take whatever the ring's size: the payload length in a
    /// record is a `u16`.
    pub(crate) const MAX_MSG_SLOTS: u32 = 1024;

    /// A geometry of `slots` slots (a power of two, at least 16) and bodies of up to
    /// `max_msg_slots` slots, clamped to `1..=slots / 4` and to [`Geometry::MAX_MSG_SLOTS`].
    pub(crate) fn new(slots: u32, max_msg_slots: u32) -> Geometry {
        debug_assert!(slots.is_power_of_two() && slots >= 16);
        Geometry { slots, max_msg_slots: max_msg_slots.clamp(1, (slots / 4).min(Self::MAX_MSG_SLOTS)) }
    }

    /// Body slots after slot `N - 1` that a body may run into.
    pub(crate) fn overflow(&self) -> u32 {
        self.max_msg_slots - 1
    }

    /// Offset of the lanes from the start of the ring memory (128-byte aligned, after the body).
    pub(crate) fn lanes_offset(&self) -> usize {
        (CONTROL + (self.slots + self.overflow()) as usize * SLOT).next_multiple_of(CONTROL)
    }

    /// Bytes of ring memory (control block, body slots, overflow slots and lanes).
    pub(crate) fn bytes(&self) -> usize {
        self.lanes_offset() + self.slots as usize * SLOT
    }

    /// Largest payload carried in the ring (whatever the header; larger ones go through cells).
    pub(crate) fn inline_max(&self) -> usize {
        self.max_msg_slots as usize * SLOT - Header::WIRE_LEN
    }

    /// Farthest a producer skips to align with its peer.
    fn max_skip(&self) -> u64 {
        (self.slots / 4).min(u16::MAX as u32) as u64
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
            (true, false) if plen <= FIRST_INLINE => Shape { kind: KIND_HALF, nbody: 0 },
            (true, false) => Shape { kind: KIND_BODY, nbody: plen.div_ceil(SLOT) as u32 },
            (false, false) => Shape { kind: KIND_FULL, nbody: (Header::WIRE_LEN + plen).div_ceil(SLOT) as u32 },
            (true, true) => Shape { kind: KIND_CELL, nbody: 0 },
            (false, true) => Shape { kind: KIND_FULL_CELL, nbody: 1 },
        }
    }
}

/// Pointers into one ring's memory.
#[derive(Clone, Copy, Debug)]
struct RingMem {
    /// The control block, followed by the body slots.
    base: NonNull<u8>,
    /// This direction's record in lane line 0 (the line start, or 32 bytes into it).
    records: NonNull<u8>,
}

impl RingMem {
    /// # Safety
    /// `base` is 128-byte aligned and valid for `geo.lanes_offset()` bytes; `lanes` is 128-byte
    /// aligned and valid for `geo.slots * 64` bytes; `upper` says which half of each lane line
    /// this direction uses. Both stay valid while the ring is used.
    unsafe fn new(base: NonNull<u8>, lanes: NonNull<u8>, upper: bool) -> RingMem {
        assert_eq!(base.as_ptr() as usize % CONTROL, 0, "ring memory must be 128-byte aligned");
        assert_eq!(lanes.as_ptr() as usize % CONTROL, 0, "lanes must be 128-byte aligned");
        // SAFETY: 0 or 32 bytes into the first lane line, inside the lanes.
        let records = unsafe { lanes.add(if upper { RECORD } else { 0 }) };
        RingMem { base, records }
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
    fn slot(&self, index: usize) -> *mut u8 {
        // SAFETY: callers pass `index < slots + overflow`, so the slot lies inside the body.
        unsafe { self.base.as_ptr().add(CONTROL + index * SLOT) }
    }

    #[inline]
    fn record(&self, index: usize) -> *mut u8 {
        // SAFETY: callers pass `index < slots`: one record of lane line `index`.
        unsafe { self.records.as_ptr().add(index * SLOT) }
    }

    #[inline]
    fn stamp(&self, index: usize) -> &AtomicU16 {
        // SAFETY: the record is 32-byte aligned inside the lanes; its first 2 bytes are only ever
        // accessed as this atomic.
        unsafe { &*self.record(index).cast::<AtomicU16>() }
    }
}

/// The sending side of a ring. Private state lives here, in the sender's own memory.
pub(crate) struct Producer {
    mem: RingMem,
    geo: Geometry,
    /// Next record position. Invariant: `cached_read <= read <= head` and
    /// `head + 1 - read <= N` whenever the consumer behaves.
    head: u64,
    /// Last `read` loaded from shared memory; stale (lower than the real value) by design: a
    /// stale value only makes the ring look fuller than it is.
    cached_read: u64,
    /// Next body position; `cached_body_read <= body_read <= body_head <= cached_body_read + N`.
    body_head: u64,
    /// Last `body_read` loaded from shared memory.
    cached_body_read: u64,
    /// The peer's record position [`Producer::align`] last looked at.
    aligned_to: u64,
    /// The stamp each of records `0..N` holds, as last written here.
    shadow: Box<[u16]>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("ring", &self.mem.base)
            .field("geo", &self.geo)
            .field("head", &self.head)
            .field("body_head", &self.body_head)
            .finish_non_exhaustive()
    }
}

// SAFETY: the Producer is the only writer of its ring's records and body slots; the raw pointers
// are to shared memory that stays mapped while the owning transport lives, and moving the
// Producer to another thread moves that sole writer with it.
unsafe impl Send for Producer {}

impl Producer {
    /// A producer for the ring at `base` whose records are in `lanes` (the upper half of each
    /// line when `upper`).
    ///
    /// # Safety
    /// `base` is 128-byte aligned, valid for reads and writes of `geo.lanes_offset()` bytes for
    /// the life of the producer; `lanes` is 128-byte aligned and valid for `geo.slots * 64`
    /// bytes; both are zero-filled, and no other producer writes this ring or this half of the
    /// lanes.
    pub(crate) unsafe fn new(base: NonNull<u8>, lanes: NonNull<u8>, upper: bool, geo: Geometry) -> Producer {
        Producer {
            // SAFETY: the caller's guarantees.
            mem: unsafe { RingMem::new(base, lanes, upper) },
            geo,
            head: 0,
            cached_read: 0,
            body_head: 0,
            cached_body_read: 0,
            aligned_to: u64::MAX,
            shadow: vec![0; geo.slots as usize].into(),
        }
    }

    /// Whether `records` record positions (plus the next record's marker) and `nbody` body slots
    /// are free. `Err` names a read position the consumer could not have published.
    #[inline]
    fn reserve(&mut self, records: u64, nbody: u32) -> Result<bool, String> {
        let n = self.geo.slots as u64;
        let need = self.head + records + 1;
        let body_need = self.body_head + nbody as u64;
        if need - self.cached_read <= n && body_need - self.cached_body_read <= n {
            return Ok(true);
        }
        self.reload(need, body_need)
    }

    /// [`Producer::reserve`] when the cached read positions say "possibly full": loads them.
    #[cold]
    fn reload(&mut self, need: u64, body_need: u64) -> Result<bool, String> {
        let n = self.geo.slots as u64;
        // Acquire: pairs with the Release stores in Consumer::publish, so the consumer's reads of
        // what it released happen before we overwrite it.
        let read = self.mem.read_pos().load(Ordering::Acquire);
        let body_read = self.mem.body_read_pos().load(Ordering::Acquire);
        if read < self.cached_read || read > self.head {
            return Err(format!(
                "consumer published read position {read}, outside {}..={} (records written)",
                self.cached_read, self.head
            ));
        }
        if body_read < self.cached_body_read || body_read > self.body_head {
            return Err(format!(
                "consumer published body read position {body_read}, outside {}..={} (body slots written)",
                self.cached_body_read, self.body_head
            ));
        }
        (self.cached_read, self.cached_body_read) = (read, body_read);
        Ok(need - read <= n && body_need - body_read <= n)
    }

    /// Moves the head to the lane line of the peer's record at position `theirs` (the last
    /// message consumed from the peer), when the head is at most a quarter of the ring behind it
    /// and the ring has room: see *Alignment* in the module documentation. A call with the same
    /// `theirs` as the last one does nothing.
    #[inline]
    pub(crate) fn align(&mut self, theirs: u64) -> Result<(), String> {
        if theirs == self.aligned_to {
            return Ok(());
        }
        self.aligned_to = theirs;
        let n = self.geo.slots as u64;
        // Lines from our head forward to theirs; 0 (their line) and N - 1 (the line after it)
        // already pair each message with one of the peer's.
        let ahead = theirs.wrapping_sub(self.head) & self.geo.mask();
        if ahead == 0 || ahead == n - 1 || ahead > self.geo.max_skip() {
            return Ok(());
        }
        // The skip record, the next message's record and its marker.
        if !self.reserve(ahead + 1, 0)? {
            return Ok(());
        }
        let mut rec = [0u8; RECORD];
        rec[OFF_KIND] = KIND_SKIP;
        rec[OFF_PLEN..OFF_INLINE].copy_from_slice(&(ahead as u16).to_le_bytes());
        self.write_record(rec, ahead);
        Ok(())
    }

    /// Writes a message whose payload goes into the ring (`payload.len() <= inline_max()`);
    /// `Ok(false)` when the ring is full.
    ///
    /// Order of the writes: the body slots and the next record's marker first, then the record in
    /// one burst, then its stamp; the consumer spins on the record's line, so writing that line
    /// in one burst lets it move to the consumer once instead of twice.
    #[inline]
    pub(crate) fn try_push_inline(&mut self, hdr: &[u8; Header::WIRE_LEN], payload: &[u8]) -> Result<bool, String> {
        let plen = payload.len();
        assert!(plen <= self.geo.inline_max(), "inline payload over the ring's limit");
        let compact = Header::compact(hdr, plen);
        let shape = Shape::of(compact.is_some(), plen, false);
        if !self.reserve(1, shape.nbody)? {
            return Ok(false);
        }
        let mut rec = [0u8; RECORD];
        rec[OFF_KIND] = shape.kind;
        rec[OFF_PLEN..OFF_INLINE].copy_from_slice(&(plen as u16).to_le_bytes());
        match compact {
            Some(c) => {
                rec[OFF_COMPACT..OFF_PLEN].copy_from_slice(&c);
                if shape.kind == KIND_HALF {
                    copy_small(&mut rec[OFF_INLINE..], payload);
                } else {
                    // SAFETY: `reserve` said body positions body_head..body_head+nbody are
                    // released; the start index is < N and nbody <= max_msg_slots = overflow + 1
                    // (plen <= inline_max), so the bytes lie inside the body slots; nobody reads
                    // them until the record's stamp is published.
                    unsafe { ptr::copy_nonoverlapping(payload.as_ptr(), self.body_start(), plen) };
                }
            }
            None => {
                // SAFETY: as above, for the header and then the payload (36 + plen bytes).
                unsafe {
                    let body = self.body_start();
                    ptr::copy_nonoverlapping(hdr.as_ptr(), body, Header::WIRE_LEN);
                    ptr::copy_nonoverlapping(payload.as_ptr(), body.add(Header::WIRE_LEN), plen);
                }
            }
        }
        self.body_head += shape.nbody as u64;
        self.write_record(rec, 1);
        Ok(true)
    }

    /// Whether a message with header `hdr` whose payload goes through a send cell fits now.
    #[inline]
    pub(crate) fn reserve_cell(&mut self, hdr: &[u8; Header::WIRE_LEN], plen: usize) -> Result<bool, String> {
        self.reserve(1, Shape::of(Header::compact(hdr, plen).is_some(), plen, true).nbody)
    }

    /// Writes a message whose payload (`plen` bytes) the caller already copied into send cell
    /// `cell`. The caller has had `reserve_cell` answer `Ok(true)`.
    #[inline]
    pub(crate) fn push_cell(&mut self, hdr: &[u8; Header::WIRE_LEN], plen: u32, cell: u32) {
        let compact = Header::compact(hdr, plen as usize);
        let shape = Shape::of(compact.is_some(), plen as usize, true);
        let mut rec = [0u8; RECORD];
        rec[OFF_KIND] = shape.kind;
        match compact {
            Some(c) => rec[OFF_COMPACT..OFF_PLEN].copy_from_slice(&c),
            // SAFETY: `reserve_cell` reserved one body slot at body_head for the header.
            None => unsafe { ptr::copy_nonoverlapping(hdr.as_ptr(), self.body_start(), Header::WIRE_LEN) },
        }
        rec[OFF_INLINE..OFF_CELL_LEN].copy_from_slice(&cell.to_le_bytes());
        rec[OFF_CELL_LEN..OFF_CELL_LEN + 4].copy_from_slice(&plen.to_le_bytes());
        self.body_head += shape.nbody as u64;
        self.write_record(rec, 1);
    }

    /// The first byte of the body slot at `body_head`.
    #[inline]
    fn body_start(&self) -> *mut u8 {
        self.mem.slot((self.body_head & self.geo.mask()) as usize)
    }

    /// Writes bytes 2..32 of the record image `rec` at `head`, the "not yet" marker where the record after
    /// it will be (`positions` further), then publishes the record and moves the head.
    #[inline]
    fn write_record(&mut self, rec: [u8; RECORD], positions: u64) {
        let start = (self.head & self.geo.mask()) as usize;
        let next = self.head + positions;
        let next_index = (next & self.geo.mask()) as usize;
        let not_yet = (next >> self.geo.shift()) as u16;
        if self.shadow[next_index] != not_yet {
            // Relaxed: ordered before the consumer can look at this record by the Release store
            // of this record's stamp below (the consumer only polls `next` after seeing it).
            self.mem.stamp(next_index).store(not_yet, Ordering::Relaxed);
            self.shadow[next_index] = not_yet;
        }
        let record = self.mem.record(start);
        let word = |i: usize| u64::from_ne_bytes(rec[i..i + 8].try_into().expect("8 bytes"));
        // SAFETY: the record at `start` is inside the lanes, 32-byte aligned, and released by
        // the consumer (`reserve`); bytes 2..32 are written here only (as a u16, a u32 and three
        // u64 stores), and read by the consumer only after the stamp is published.
        unsafe {
            ptr::write(record.add(2).cast::<u16>(), u16::from_ne_bytes([rec[2], rec[3]]));
            ptr::write(record.add(4).cast::<u32>(), u32::from_ne_bytes([rec[4], rec[5], rec[6], rec[7]]));
            for i in [8, 16, 24] {
                ptr::write(record.add(i).cast::<u64>(), word(i));
            }
        }
        let stamp = ((self.head >> self.geo.shift()) + 1) as u16;
        self.shadow[start] = stamp;
        // Release: publishes the record, its body, the cell's contents and the next record's
        // marker; pairs with the Acquire load in Consumer::take.
        self.mem.stamp(start).store(stamp, Ordering::Release);
        self.head = next;
    }

    /// Test hook: writes `bytes` at `offset` of the record where the next message goes. With
    /// `publish`, the record is then published (whatever its fields say); without, only the
    /// bytes change (e.g. a garbage stamp).
    pub(crate) fn corrupt_next(&mut self, offset: usize, bytes: &[u8], publish: bool) {
        let offset = offset.min(RECORD);
        let len = bytes.len().min(RECORD - offset);
        let start = (self.head & self.geo.mask()) as usize;
        // SAFETY: offset + len <= 32: the writes stay inside one record of the lanes.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.record(start).add(offset), len) };
        if publish {
            // SAFETY: bytes 2..32 of the same record.
            let rec = unsafe { ptr::read(self.mem.record(start).cast::<[u8; RECORD]>()) };
            self.write_record(rec, 1);
        } else if offset < 2 {
            self.shadow[start] = u16::MAX;
        }
    }
}

/// Copies `src` (at most 16 bytes) to the front of `dst` with at most two overlapping loads and
/// stores of 8, 4 or 1 bytes each, instead of a call to `memcpy` for a length known only now.
#[inline]
fn copy_small(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert!(n <= 16 && dst.len() >= n);
    if n >= 8 {
        dst[..8].copy_from_slice(&src[..8]);
        dst[n - 8..n].copy_from_slice(&src[n - 8..]);
    } else if n >= 4 {
        dst[..4].copy_from_slice(&src[..4]);
        dst[n - 4..n].copy_from_slice(&src[n - 4..]);
    } else {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
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
    geo: Geometry,
    /// Position of the next record.
    expected: u64,
    /// Last position stored into `read`; `published <= expected`.
    published: u64,
    /// Body position of the next message's body.
    body_expected: u64,
    /// Position of the last message consumed (`u64::MAX`: none yet).
    last: u64,
}

// SAFETY: the Consumer is the only reader of its ring's records and body and the only writer of
// the read positions; moving it to another thread moves that role with it.
unsafe impl Send for Consumer {}

impl Consumer {
    /// A consumer for the ring at `base` whose records are in `lanes` (the upper half of each
    /// line when `upper`).
    ///
    /// # Safety
    /// As for [`Producer::new`], with "no other consumer reads this ring".
    pub(crate) unsafe fn new(base: NonNull<u8>, lanes: NonNull<u8>, upper: bool, geo: Geometry) -> Consumer {
        Consumer {
            // SAFETY: the caller's guarantees.
            mem: unsafe { RingMem::new(base, lanes, upper) },
            geo,
            expected: 0,
            published: 0,
            body_expected: 0,
            last: u64::MAX,
        }
    }

    /// Record position of the last message consumed (`u64::MAX` before the first), for the
    /// producer of the other direction ([`Producer::align`]).
    #[inline]
    pub(crate) fn last_consumed(&self) -> u64 {
        self.last
    }

    /// Whether the expected position may hold something: its stamp is not the "not yet" value
    /// (an arrival, a skip, or a corrupt record that [`Consumer::take`] reports). One load of a
    /// line that stays in this core's cache while nothing arrives: the check of an idle poll.
    #[inline]
    pub(crate) fn may_have_arrival(&self) -> bool {
        let index = (self.expected & self.geo.mask()) as usize;
        let lap = (self.expected >> self.geo.shift()) as u16;
        // Relaxed: only a hint; `take` loads the stamp again with Acquire before reading.
        self.mem.stamp(index).load(Ordering::Relaxed) != lap
    }

    /// Hands the message at the expected position (after moving past skip records) to
    /// `handle`, with its header and payload borrowed from the ring, and moves past it when
    /// `handle` returns `Ok`. `Ok(false)`: nothing has arrived. `Err` (what is wrong): a record
    /// is corrupt, or `handle` refused the message (which then stays). Every field read from
    /// shared memory is read once and checked before use.
    #[inline]
    pub(crate) fn take(
        &mut self,
        handle: impl FnOnce(&[u8; Header::WIRE_LEN], Body<'_>) -> Result<(), String>,
    ) -> Result<bool, String> {
        loop {
            let index = (self.expected & self.geo.mask()) as usize;
            let lap = self.expected >> self.geo.shift();
            // Acquire: pairs with the Release store of the stamp in Producer::write_record; makes
            // the record, the body and a cell's contents visible.
            let stamp = self.mem.stamp(index).load(Ordering::Acquire);
            let arrived = (lap + 1) as u16;
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
            // One volatile copy of the record (four aligned words), so the values checked below
            // are the values used even if a faulty peer rewrites the record.
            let mut rec = [0u8; RECORD];
            for (i, chunk) in rec.chunks_exact_mut(8).enumerate() {
                // SAFETY: word i of the record, inside the lanes and 8-byte aligned, published by
                // the stamp above (the stamp's two bytes, read again here, are not used).
                chunk.copy_from_slice(&unsafe { ptr::read_volatile(record.cast::<u64>().add(i)) }.to_ne_bytes());
            }
            let u32_at = |off: usize| u32::from_le_bytes([rec[off], rec[off + 1], rec[off + 2], rec[off + 3]]);
            let kind = rec[OFF_KIND];
            if rec[OFF_ZERO] != 0 {
                return Err(format!("record {index} has reserved byte {:#x} (must be 0)", rec[OFF_ZERO]));
            }
            let plen = u16::from_le_bytes([rec[OFF_PLEN], rec[OFF_PLEN + 1]]) as usize;
            if kind == KIND_SKIP {
                if plen == 0 || plen as u64 > self.geo.max_skip() {
                    return Err(format!("record {index}: skip of {plen} positions (1..={})", self.geo.max_skip()));
                }
                self.expected += plen as u64;
                continue;
            }
            let (compact, plen, in_cell) = match kind {
                KIND_HALF | KIND_BODY => (true, plen, false),
                KIND_FULL => (false, plen, false),
                KIND_CELL => (true, u32_at(OFF_CELL_LEN) as usize, true),
                KIND_FULL_CELL => (false, u32_at(OFF_CELL_LEN) as usize, true),
                other => return Err(format!("record {index} has unknown kind {other}")),
            };
            let shape = Shape::of(compact, plen, in_cell);
            if shape.kind != kind || (!in_cell && plen > self.geo.inline_max()) {
                return Err(format!(
                    "record {index}: kind {kind} with {plen} payload bytes (inline limit {} bytes)",
                    self.geo.inline_max()
                ));
            }
            // nbody <= max_msg_slots = overflow + 1 (the inline limit, checked just above; a cell
            // message takes at most one slot), so a body starting at any slot below N lies inside
            // the body slots and overflow.
            let body = self.mem.slot((self.body_expected & self.geo.mask()) as usize);
            let hdr = if compact {
                let c: &[u8; Header::COMPACT_LEN] = rec[OFF_COMPACT..OFF_PLEN].try_into().expect("compact header");
                Header::expand(c, plen)
            } else {
                // SAFETY: the body's first 36 bytes, published by the stamp; one volatile copy.
                unsafe { ptr::read_volatile(body.cast::<[u8; Header::WIRE_LEN]>()) }
            };
            // The payload's bytes lie inside the ring (above) and the producer does not write
            // them until we publish read positions past them.
            let (start, in_ring) = match kind {
                KIND_HALF => (record.wrapping_add(OFF_INLINE), true),
                KIND_BODY => (body, true),
                KIND_FULL => (body.wrapping_add(Header::WIRE_LEN), true),
                _ => (body, false),
            };
            let payload = if in_ring {
                // SAFETY: `plen` bytes from `start`, inside the ring and published (see above).
                Body::Inline(unsafe { std::slice::from_raw_parts(start, plen) })
            } else {
                Body::Cell { index: u32_at(OFF_INLINE), len: plen }
            };
            handle(&hdr, payload)?;
            self.consume(shape.nbody);
            return Ok(true);
        }
    }

    /// Moves past a handled message whose body took `nbody` slots; publishes the read positions
    /// every `N / 4` records.
    #[inline]
    fn consume(&mut self, nbody: u32) {
        self.last = self.expected;
        self.expected += 1;
        self.body_expected += nbody as u64;
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
