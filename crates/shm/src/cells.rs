//! Send cells (Chai §3.2): payloads too large for the ring's slots travel in a cell of the
//! sender's pool, and the ring carries only the cell index (indirection: the receiver polls one
//! place per peer, and ordering stays in the ring).
//!
//! A cell has one writer at a time, and the ring says whose turn it is:
//! - the sender takes a cell it knows is free, fills it, then publishes the record that names
//!   it (the record's Release stamp orders the fill before the receiver sees it); it keeps, per
//!   destination, a FIFO of its cells in flight with the ring position of each one's record;
//! - the receiver copies the payload out (or lends it to the sink) before it moves past the
//!   record, and its read position, published with Release as the ring's, gives back every
//!   cell named below it;
//! - the sender reclaims from the read position (Acquire, [`SendCells::reclaim`]), which it
//!   loads anyway to find room in the ring. Until 2026-11 each cell had a state word on a
//!   line of its own before the payload, which the sender set and the receiver cleared: two
//!   writes of a line the other core held and a load of one it had just written, per message
//!   (on the Intel Xeon host, osu_bw 2 KiB 6.7-8.3 -> 7.6-8.5 GB/s, 4 KiB 9.5-9.9 -> 9.7-10.9
//!   without them; then without the line, every cell page aligned as the buffers of the
//!   benchmarks are, 4 KiB 10.5-10.9 -> 10.9-12.3, 8 KiB 13.7-14.2 -> 14.7-15.2).
//!
//! The free list is ordered by when cells came back, and a fill takes the cell that came back
//! longest ago. Measured on the AMD host, shm only (no CMA): with every payload in the cell
//! freed last, a stream of 16 KiB cells filled one in about 7 µs apart and 2 µs near (a cell
//! just read out by the receiver, refilled while it reads the next one), with the oldest about
//! 0.7 µs near; 4 MiB one-way 500 -> 185-210 µs near and 1870 -> 1630 apart, osu_bw 16 KiB 6-9
//! -> 25-29 GB/s near. Up to 4 KiB the cell freed last was as fast or faster there (2 KiB one
//! way 0.33-0.38 against 0.41-0.50 µs near), and small payloads took it until 2026-11; on the
//! Intel Xeon host the oldest cell is faster at every size (osu_bw 2 KiB 5.1-5.2 -> 7.7-8.1
//! GB/s, 4 KiB 7.2-7.7 -> 9.9-10.5; one way 2 KiB 0.92-1.13 -> 0.75-0.80 µs: the receiver's
//! copy of a just-refilled cell takes each line out of the sender's cache while the sender's
//! writes still wait to take it from the receiver's), and taking the warm cell only near
//! made that speed hang on a placement verdict that line samples on a loaded mesh do not give
//! reliably.

use std::collections::VecDeque;
use std::ptr::NonNull;

use crate::segment::SegLayout;
use polyrail_core::observe::Placement;

/// A fill takes back the cells the destination has read only when fewer than one in this many
/// of the pool are free: each look loads the ring's read position, a line the receiver writes.
/// (Looking at the oldest cell in flight for every message, when cells had a state word each,
/// took a third of the time of the sender of a 4 KiB osu_bw stream on the Intel Xeon host.)
const LOW_WATER: usize = 4;

/// Apart, payloads above this many bytes go into a cell with non-temporal stores; smaller ones
/// with ordinary stores, as they went in the ring's body slots until 2026-11 (a few lines: the
/// receiver takes them from the sender's cache sooner than from memory; with the placement
/// forced apart on the Intel Xeon host, 512 B one way 0.85 µs through memory against 0.34-0.61
/// from the cache).
const STREAMING_ABOVE: usize = 1024;

/// The cell pool in some process's segment, as seen by this process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CellArea {
    /// First cell (page aligned; cells are `stride` bytes apart, a multiple of 64).
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

    /// Where cell `index` starts.
    #[inline]
    fn cell(&self, index: u32) -> *mut u8 {
        debug_assert!(index < self.count);
        // SAFETY: index < count, so the cell lies inside the pool (count * stride bytes).
        unsafe { self.base.as_ptr().add(index as usize * self.stride) }
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
        // does not write the cell again before our read position passes the record that named
        // it (after the borrow ends).
        Ok(unsafe { std::slice::from_raw_parts(self.cell(index), len) })
    }
}

/// Sender side: this process's own pool and what is in flight to whom.
#[derive(Debug)]
pub(crate) struct SendCells {
    area: CellArea,
    /// Cells free to use, in the order they came back (last freed at the back).
    free: VecDeque<u32>,
    /// Per destination rank: cells in flight, oldest first, each with the position of the
    /// record that names it in our ring to that rank. Capacity `count` once the peer is added,
    /// so pushing never allocates.
    in_flight: Vec<VecDeque<(u32, u64)>>,
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

    /// Whether every cell is in flight (then the destinations' read positions free some:
    /// [`SendCells::reclaim`]).
    pub(crate) fn exhausted(&self) -> bool {
        self.free.is_empty()
    }

    /// Moves the cells whose records `dest` has read (positions below `read`, the read
    /// position of our ring to it) to the free list.
    #[inline]
    pub(crate) fn reclaim(&mut self, dest: u32, read: u64) {
        let Some(q) = self.in_flight.get_mut(dest as usize) else { return };
        while let Some(&(c, _)) = q.front().filter(|&&(_, record)| record < read) {
            q.pop_front();
            self.free.push_back(c);
        }
    }

    /// Moves every cell in flight to `dest` to the free list: `dest` reads no more of them (it
    /// exited, or broke the protocol and is lost to us).
    pub(crate) fn release(&mut self, dest: u32) {
        if let Some(q) = self.in_flight.get_mut(dest as usize) {
            self.free.extend(q.drain(..).map(|(c, _)| c));
        }
    }

    /// Copies `payload` (at most `cell_size()` bytes) into the free cell that came back longest
    /// ago, in flight to `dest` from now on in the record at position `record` of our ring to
    /// it, and returns the cell's index; `Ok(None)` when every cell is in flight. When few cells
    /// are free, a fill first asks `read` for the read position of that ring (`Err`: the
    /// position is nonsense). Apart (the placement of `dest`'s core), over [`STREAMING_ABOVE`]
    /// bytes, with non-temporal stores ([`copy_streaming`]).
    #[inline]
    pub(crate) fn fill(
        &mut self,
        dest: u32,
        payload: &[u8],
        placement: Placement,
        record: u64,
        read: impl FnOnce() -> Result<u64, String>,
    ) -> Result<Option<u32>, String> {
        debug_assert!(payload.len() <= self.area.size);
        if self.free.len() < (self.area.count as usize).div_ceil(LOW_WATER) {
            self.reclaim(dest, read()?);
        }
        let Some(c) = self.free.pop_front() else { return Ok(None) };
        // c < count: the free list only holds pool indices.
        let dst = self.area.cell(c);
        if placement == Placement::Apart && payload.len() > STREAMING_ABOVE {
            // SAFETY: dst is 64-byte aligned; len <= cell size; the cell is ours: never used, or
            // the receiver published a read position past the record that named it (Acquire),
            // after its last read of the cell.
            unsafe { copy_streaming(dst, payload) };
        } else {
            // SAFETY: as for the streaming copy.
            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, payload.len()) };
        }
        // `dest` is a connected peer, below the job size (checked by the transport).
        self.in_flight[dest as usize].push_back((c, record));
        self.filled = self.filled.saturating_add(1);
        Ok(Some(c))
    }
}

/// Copies `src` to `dst` (64-byte aligned) with non-temporal stores, then fences them.
///
/// Ordinary stores into a cell the receiver read last time need each line back from the
/// receiver's cache first; when the two cores share no cache that read-for-ownership crosses
/// between them for every line. Non-temporal stores write whole lines without reading them:
/// apart, a stream of cells fills several times faster; near they gain little and slow
/// osu_bw, so the transport uses them apart only.
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
        // before the Release stamp of the record that names the cell.
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

    /// Cells in flight come back, oldest first, once the destination's read position passes
    /// the records that named them; the position is loaded only when few cells are free.
    #[test]
    fn cells_come_back_with_the_read_position_oldest_first() {
        #[repr(align(64))]
        struct Pool([u8; 8 * 64]);
        let mut pool = Pool([0; 8 * 64]);
        // Eight cells of 64 bytes.
        let area = CellArea { base: NonNull::from(&mut pool.0).cast(), count: 8, size: 64, stride: 64 };
        let mut cells = SendCells::new(area, 2);
        cells.add_dest(1);
        let mut reads = 0;
        let mut fill = |record, read: u64| {
            cells
                .fill(1, b"c", Placement::Middle, record, || {
                    reads += 1;
                    Ok(read)
                })
                .unwrap()
        };
        // Cells 0-7 in records 0-7; a fill looks at the read position only when under a
        // quarter of the pool (two cells) is free: the eighth, then every one but the tenth.
        assert_eq!((0..8).map(|r| fill(r, 0)).collect::<Vec<_>>(), (0..8).map(Some).collect::<Vec<_>>());
        assert_eq!(fill(8, 0), None, "every cell in flight");
        // The receiver read records 0-2 (cells 0-2); they come back in that order.
        assert_eq!([fill(8, 3), fill(9, 3), fill(10, 3), fill(11, 3)], [Some(0), Some(1), Some(2), None]);
        assert_eq!(reads, 5);
        assert_eq!(&pool.0[..1], b"c");
        let mut cells = SendCells::new(area, 2);
        cells.add_dest(1);
        for r in 0..7 {
            assert!(
                cells.fill(1, b"c", Placement::Near, r, || Err("bad".into())).is_ok(),
                "no look while cells are free"
            );
        }
        assert_eq!(cells.fill(1, b"c", Placement::Near, 7, || Err("bad".into())), Err("bad".into()));
    }

    /// The non-temporal copy writes exactly `src` for every length around whole lines and any
    /// alignment of the source, and nothing past it.
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
