//! [`BouncePool`]: pre-registered buffers that medium rendezvous messages are copied through.
//!
//! Registering a user buffer for one rendezvous pins its pages (`ibv_reg_mr`: a system call and
//! a page walk, and the same again to deregister); on Soft-RoCE here an 8 KiB registration cost
//! more than the message (an earlier record, in git history), while copying up to 64 KiB into memory registered
//! once costs little. Long-lived user memory is registered instead (`Lifetime::Lasting`,
//! the zero-copy path), and larger messages still register.

use crate::provider::{Access, MemoryRegion, Provider};
use polyrail_core::{AnonMemory, Result};

/// Slots in a pool: a window of 64 messages in flight (osu_bw's) bounces whole.
pub(crate) const SLOTS: usize = 64;

/// Fixed-size slots in one registered mapping.
#[derive(Debug)]
pub(crate) struct BouncePool {
    mem: AnonMemory,
    mr: MemoryRegion,
    slot: usize,
    free: Vec<u32>,
}

impl BouncePool {
    /// Maps and registers [`SLOTS`] slots of `slot` bytes (rounded up to a cache line), open to
    /// local writes and to peers' reads and writes.
    pub fn new<P: Provider>(provider: &mut P, slot: usize) -> Result<BouncePool> {
        let slot = slot.next_multiple_of(64);
        let mem = AnonMemory::new(slot * SLOTS, "ib bounce buffers")?;
        // SAFETY: the mapping lives as long as the pool; its owner deregisters it (release)
        // before dropping it.
        let mr = unsafe { provider.register(mem.ptr(), mem.len(), Access::ALL)? };
        Ok(BouncePool { mem, mr, slot, free: (0..SLOTS as u32).rev().collect() })
    }

    /// The registration covering every slot.
    pub fn region(&self) -> &MemoryRegion {
        &self.mr
    }

    /// A free slot, if any.
    pub fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Returns slot `index` (taken with [`BouncePool::take`]) to the pool.
    pub fn give_back(&mut self, index: u32) {
        debug_assert!(!self.free.contains(&index), "bounce slot {index} returned twice");
        self.free.push(index);
    }

    /// Start of slot `index`.
    pub fn addr(&self, index: u32) -> *mut u8 {
        debug_assert!((index as usize) < SLOTS);
        // SAFETY: index < SLOTS, so the offset stays inside the mapping.
        unsafe { self.mem.ptr().add(index as usize * self.slot) }
    }

    /// Deregisters the pool (call before dropping it).
    pub fn release<P: Provider>(&self, provider: &mut P) {
        provider.deregister(&self.mr);
    }
}
