//! Send cells (Chai §3.2): payloads too large for the ring's slots travel in a cell of the
//! sender's pool, and the ring carries only the cell index (indirection: the receiver polls one
//! place per peer, and ordering stays in the ring).
//!
//! Each cell has a state word on its own line, with one writer at a time:
//! - the sender takes a cell it knows is free, fills it and stores `IN_FLIGHT`, then publishes the
//!   slot that names it (the slot's Release stamp orders all of this before the receiver sees it);
//! - the receiver copies the payload out (or lends it to the sink) and stores `FREE` (Release);
//! - the sender reclaims (mark and sweep): it keeps, per destination, a FIFO of its cells in
//!   flight; a receiver frees them in order, so the sender only looks at the heads of these FIFOs
//!   (Acquire) and moves free ones back to its free list.
//!
//! The free list is ordered by when cells came back. A small payload takes the cell freed last,
//! still warm in the sender's cache, unless the peer's core is in the middle band
//! ([`Placement::Middle`]); a large one takes the cell freed longest ago. Measured on
//! the AMD host, shm only (no CMA): with every payload in the last freed cell, a stream of 16 KiB
//! cells filled one in about 7 µs apart and 2 µs near (a cell just read out by the receiver,
//! refilled while it reads the next one), with the oldest about 0.7 µs near; 4 MiB one-way 500 ->
//! 185-210 µs near and 1870 -> 1630 apart, osu_bw 16 KiB 6-9 -> 25-29 GB/s near. Up to 4 KiB
//! the warm cell is as fast or faster (2 KiB one-way 0.33-0.38 against 0.41-0.50 µs near).
//! On the Intel Xeon host (one L3 across a mesh, the middle band), the cell freed longest ago
//! is faster at every size: osu_bw 2 KiB 5.1-5.2 -> 7.7-8.1 GB/s, 4 KiB 7.2-7.7 -> 9.9-10.5,
//! one way 2 KiB 0.92-1.13 -> 0.75-0.80 µs, 4 KiB 1.13-1.20 -> 1.03-1.07 (the receiver's
//! copy of a just-refilled cell takes each line out of the sender's cache while the
//! sender's writes still wait to take it from the receiver's).

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::segment::{SegLayout, CELL_STATE_BYTES};
use polyrail_core::policy::Placement;

/// Largest payload that takes the cell freed last (warm in the sender's cache) while the peer
/// is not in the middle band; larger ones take the cell freed longest ago (see the module
/// documentation).
const WARM_UP_TO: usize = 4096;

/// A fill that takes the cell freed longest ago reclaims the destination's freed cells only
/// when fewer than one in this many of the pool are free. Looking at the oldest cell in flight
/// costs a line transfer each time (the receiver just wrote its state): on the Intel Xeon host
/// the sender of a 4 KiB osu_bw stream spent a third of its time on that one load.
const LOW_WATER: usize = 4;

/// State of a cell the sender may reuse (zero-filled memory is free).
pub(crate) const FREE: u32 = 0;
/// State of a cell named by a slot the receiver has not handled yet.
pub(crate) const IN_FLIGHT: u32 = 1;

/// The cell pool in some process's segment, as seen by this process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CellArea {
    /// First cell's state line.
    base: NonNull<u8>,
    count: u32,
    size: usize,
    stride: usize,
}

// SAFETY: a description of shared memory that stays mapped while the transport holding it
// lives; accesses are ordered by the cell protocol described in the module documentation.
unsafe impl Send for CellArea {}

impl CellArea {
    /// The pool of a segment mapped at `segment`.
    ///
    /// # Safety
    /// `segment` is the start of a mapping of `layout.total_len` bytes with this layout that
    /// outlives the returned value.
    pub(crate) unsafe fn new(segment: NonNull<u8>, layout: &SegLayout) -> CellArea {
        // SAFETY: cells_offset < total_len by construction of the layout (the caller's promise).
        let base = unsafe { NonNull::new_unchecked(segment.as_ptr().add(layout.cells_offset)) };
        CellArea { base, count: layout.cells, size: layout.cell_size as usize, stride: layout.cell_stride }
    }

    #[inline]
    fn line(&self, index: u32) -> *mut u8 {
        debug_assert!(index < self.count);
        // SAFETY: index < count, so the cell lies inside the pool (count * stride bytes).
        unsafe { self.base.as_ptr().add(index as usize * self.stride) }
    }

    #[inline]
    fn state(&self, index: u32) -> &AtomicU32 {
        // SAFETY: the state line is 64-byte aligned inside the pool and only accessed atomically.
        unsafe { &*self.line(index).cast::<AtomicU32>() }
    }

    /// Receiver side: the `len` payload bytes of cell `index`, both as a peer's slot gave them.
    #[inline]
    pub(crate) fn payload(&self, index: u32, len: usize) -> Result<&[u8], String> {
        if index >= self.count {
            return Err(format!("cell index {index} outside the pool of {} cells", self.count));
        }
        if len > self.size {
            return Err(format!("cell message of {len} bytes, cells hold {}", self.size));
        }
        // SAFETY: index and len are checked above: the bytes are inside cell `index`; the sender
        // does not write the cell again before we store FREE (after the borrow ends).
        Ok(unsafe { std::slice::from_raw_parts(self.line(index).add(CELL_STATE_BYTES), len) })
    }

    /// Receiver side: gives cell `index` (checked by [`CellArea::payload`]) back to its sender.
    #[inline]
    pub(crate) fn release(&self, index: u32) {
        if index < self.count {
            // Release: our reads of the cell happen before the sender, after its Acquire load in
            // SendCells::reclaim, writes the cell again.
            self.state(index).store(FREE, Ordering::Release);
        }
    }
}

/// Sender side: this process's own pool and what is in flight to whom.
#[derive(Debug)]
pub(crate) struct SendCells {
    area: CellArea,
    /// Cells free to use, in the order they came back (last freed at the back).
    free: VecDeque<u32>,
    /// Per destination rank: cells in flight, oldest first. Capacity `count` once the peer is
    /// added, so pushing never allocates.
    in_flight: Vec<VecDeque<u32>>,
    /// Cells filled so far (up to the pool's size): see [`SendCells::recycling`].
    filled: u32,
}

impl SendCells {
    /// The pool in our own segment, all cells free, for a job of `size` ranks.
    pub(crate) fn new(area: CellArea, size: u32) -> SendCells {
        SendCells {
            area,
            free: (0..area.count).collect(),
            in_flight: (0..size).map(|_| VecDeque::new()).collect(),
            filled: 0,
        }
    }

    /// Prepares the in-flight queue of a new destination.
    pub(crate) fn add_dest(&mut self, rank: u32) {
        if let Some(q) = self.in_flight.get_mut(rank as usize) {
            q.reserve_exact(self.area.count as usize);
        }
    }

    /// Whether every cell was filled once: from then on a fill writes lines a receiver read
    /// (before, it may write lines only this process touched, faster than any later fill).
    pub(crate) fn recycling(&self) -> bool {
        self.filled >= self.area.count
    }

    /// Cells in flight to anyone.
    pub(crate) fn in_flight(&self) -> usize {
        self.area.count as usize - self.free.len()
    }

    /// Moves the cells `dest` has freed (the leading run of its FIFO) to the free list.
    #[inline]
    fn reclaim(&mut self, dest: usize) {
        let Some(q) = self.in_flight.get_mut(dest) else { return };
        while let Some(&c) = q.front() {
            // Acquire: pairs with the Release store of FREE in CellArea::release; the receiver's
            // reads of the cell happen before we write it again.
            if self.area.state(c).load(Ordering::Acquire) != FREE {
                break;
            }
            q.pop_front();
            self.free.push_back(c);
        }
    }

    /// Copies `payload` (at most `cell_size()` bytes) into a free cell marked in flight to
    /// `dest` and returns its index; `None` when every cell is in flight. How follows the
    /// placement of `dest`'s core: apart, with non-temporal stores ([`copy_streaming`]); in
    /// the middle band, in the cell freed longest ago whatever the size (module documentation).
    #[inline]
    pub(crate) fn fill(&mut self, dest: u32, payload: &[u8], placement: Placement) -> Option<u32> {
        debug_assert!(payload.len() <= self.area.size);
        let warm = payload.len() <= WARM_UP_TO && placement != Placement::Middle;
        // A warm fill wants the cell the receiver freed last, so it looks every time; a cold
        // one takes the oldest free cell and looks only when few are left (LOW_WATER).
        if warm || self.free.len() < (self.area.count as usize).div_ceil(LOW_WATER) {
            self.reclaim(dest as usize);
        }
        if self.free.is_empty() {
            for d in 0..self.in_flight.len() {
                self.reclaim(d);
            }
        }
        let c = if warm { self.free.pop_back()? } else { self.free.pop_front()? };
        // SAFETY: c < count (the free list only holds pool indices): the payload area of cell c,
        // which starts a line after the cell's 64-byte aligned state line.
        let dst = unsafe { self.area.line(c).add(CELL_STATE_BYTES) };
        if placement == Placement::Apart {
            // SAFETY: dst is 64-byte aligned; len <= cell size; the cell is ours: FREE was
            // observed with Acquire (or it was never used), and no slot names it.
            unsafe { copy_streaming(dst, payload) };
        } else {
            // SAFETY: as for the streaming copy.
            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, payload.len()) };
        }
        // Relaxed: the Release stamp of the slot naming the cell orders this store before the
        // receiver's FREE store, so FREE always comes after IN_FLIGHT in the word's history.
        self.area.state(c).store(IN_FLIGHT, Ordering::Relaxed);
        // `dest` is a connected peer, below the job size (checked by the transport).
        self.in_flight[dest as usize].push_back(c);
        self.filled = self.filled.saturating_add(1);
        Some(c)
    }
}

/// Copies `src` to `dst` (64-byte aligned) with non-temporal stores, then fences them.
///
/// Ordinary stores into a cell the receiver read last time need each line back from the
/// receiver's cache first; when the two cores share no cache that read-for-ownership crosses
/// between them for every line. Non-temporal stores write whole lines without reading them.
/// `docs/benchmarks/epyc-probes/cell-probe.c` (`NT` 0 and 2, `SAME` 1) on the AMD EPYC host,
/// apart: a stream of 16 KiB messages through cells 2.4-3.0 GB/s with `memcpy`, 19.4-19.5 with
/// these stores (8 KiB 3.2-3.5 against 10-12, 4 KiB 2.2 against 11-11.6); near they gain
/// little in the probe and cost polyrail's osu_bw 16 KiB a third to a half, so the transport
/// uses them apart only.
///
/// # Safety
/// `dst` is 64-byte aligned and valid for writes of `src.len()` bytes that nothing else
/// accesses during the call.
#[inline(never)]
unsafe fn copy_streaming(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        debug_assert_eq!(dst as usize % 64, 0);
        let whole = src.len() & !63;
        for line in (0..whole).step_by(64) {
            // SAFETY: line + 64 <= whole <= src.len(): the four unaligned 16-byte loads stay
            // inside `src`; the four aligned stores (dst is 64-byte aligned) inside `dst`'s
            // `src.len()` bytes, which the caller gives us.
            unsafe {
                let from = src.as_ptr().add(line).cast::<__m128i>();
                let to = dst.add(line).cast::<__m128i>();
                for k in 0..4 {
                    _mm_stream_si128(to.add(k), _mm_loadu_si128(from.add(k)));
                }
            }
        }
        // SAFETY: the rest of `src` (under a line) to the rest of `dst`, both in bounds.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(whole), dst.add(whole), src.len() - whole) };
        // Non-temporal stores are not ordered with later stores: the fence makes them visible
        // before the cell's state and the Release stamp of the record that names the cell.
        // SAFETY: SFENCE has no operands and cannot fault.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's promise.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The non-temporal copy writes exactly `src` for every length around whole lines and any
    /// alignment of the source, and nothing past it.
    #[test]
    fn small_payloads_take_the_warm_cell_except_in_the_middle_band() {
        #[repr(align(64))]
        struct Pool([u8; 4 * 128]);
        let mut pool = Pool([0; 4 * 128]);
        // Four cells of 64 bytes, each after its 64-byte state line.
        let area = CellArea { base: NonNull::from(&mut pool.0).cast(), count: 4, size: 64, stride: 128 };
        let mut cells = SendCells::new(area, 2);
        cells.add_dest(1);
        // Near, small payloads take the back of the free list 0, 1, 2, 3: cells 3 and 2; the
        // receiver frees them in order, so the list becomes 0, 1, 3, 2.
        assert_eq!([cells.fill(1, b"a", Placement::Near), cells.fill(1, b"b", Placement::Near)], [Some(3), Some(2)]);
        area.release(3);
        area.release(2);
        let mut cells_again = |placement| {
            let c = cells.fill(1, b"c", placement).unwrap();
            area.release(c);
            c
        };
        assert_eq!(cells_again(Placement::Near), 2, "near: the cell freed last");
        assert_eq!(cells_again(Placement::Apart), 2, "apart: the cell freed last");
        assert_eq!(cells_again(Placement::Middle), 0, "middle: the cell freed longest ago");
        assert_eq!(&pool.0[CELL_STATE_BYTES..CELL_STATE_BYTES + 1], b"c");
    }

    #[test]
    fn the_streaming_copy_copies_every_length_and_alignment() {
        #[repr(align(64))]
        struct Lines([u8; 512]);
        let src: Vec<u8> = (0..600u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in [0, 1, 8, 63] {
            for len in (0..=200).chain([255, 256, 257, 447]) {
                let mut dst = Lines([0xee; 512]);
                // SAFETY: dst is 64-byte aligned and holds 512 >= len bytes.
                unsafe { copy_streaming(dst.0.as_mut_ptr(), &src[offset..offset + len]) };
                assert_eq!(&dst.0[..len], &src[offset..offset + len], "offset {offset} len {len}");
                assert!(dst.0[len..].iter().all(|&b| b == 0xee), "offset {offset} len {len}: wrote past the end");
            }
        }
    }
}
