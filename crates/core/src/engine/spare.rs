//! Buffers of unexpected eager messages, kept for the next ones once their messages were taken.
//!
//! glibc gives a buffer of 128 KiB or more with a fresh mapping, so each such unexpected message
//! faulted in its pages again: a receiver lagging behind a stream of 128 KiB eager messages
//! (`polyrail-bench skew`, near, where such messages go eagerly) took 86-103 µs per message
//! against 47-48 when they went by single copy, with about 27 more page faults per message.

/// Spare buffers, at most [`SpareBuffers::MAX_BYTES`] of them in all.
#[derive(Debug, Default)]
pub(super) struct SpareBuffers {
    bufs: Vec<Vec<u8>>,
    /// Capacity of `bufs`, summed.
    bytes: usize,
}

impl SpareBuffers {
    /// Messages below this size get a new buffer (the allocator's free lists serve them
    /// cheaply), and buffers smaller than this are not kept.
    pub(super) const MIN: usize = 16 << 10;
    /// Most bytes kept: the cell pool's default size twice over.
    pub(super) const MAX_BYTES: usize = 4 << 20;

    /// An empty buffer with room for `len` bytes: the smallest spare that fits, else a new one;
    /// `None` when memory for a new one cannot be had.
    pub(super) fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        if len >= Self::MIN {
            let fit =
                self.bufs.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity());
            if let Some((i, _)) = fit {
                let mut buf = self.bufs.swap_remove(i);
                self.bytes -= buf.capacity();
                buf.clear();
                return Some(buf);
            }
        }
        let mut buf = Vec::new();
        buf.try_reserve_exact(len).ok()?;
        Some(buf)
    }

    /// Keeps `buf`, whose message was taken, when it is large enough to be worth keeping and
    /// there is room; else frees it.
    pub(super) fn give_back(&mut self, buf: Vec<u8>) {
        if buf.capacity() >= Self::MIN && self.bytes + buf.capacity() <= Self::MAX_BYTES {
            self.bytes += buf.capacity();
            self.bufs.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_come_back_and_small_ones_do_not() {
        let mut spare = SpareBuffers::default();
        let big = spare.take(128 << 10).unwrap();
        let at = big.as_ptr();
        spare.give_back(big);
        let again = spare.take(100 << 10).unwrap();
        assert_eq!((again.as_ptr(), again.len()), (at, 0), "the spare, emptied");
        assert_eq!(spare.bytes, 0);
        spare.give_back(Vec::with_capacity(1024));
        assert!(spare.bufs.is_empty(), "small buffers are not kept");
        // The smallest that fits is taken; what does not fit in MAX_BYTES is freed.
        spare.give_back(again);
        spare.give_back(Vec::with_capacity(32 << 10));
        assert_eq!(spare.take(20 << 10).unwrap().capacity(), 32 << 10);
        spare.give_back(Vec::with_capacity(SpareBuffers::MAX_BYTES));
        assert_eq!(spare.bytes, 128 << 10);
        assert!(spare.take(usize::MAX).is_none(), "no memory for it");
    }
}
