//! The optional capabilities of a channel reached through its accessors ([`Transport::memory`],
//! [`Transport::wakeup`]), answering as a channel without them does: one-sided operations are
//! errors, registrations need nothing, and `arm` says no.

use polyrail_core::{
    Issued, Lifetime, MemHandle, OpId, PeerAccess, Rank, Region, RegionMut, RemoteKey, Result, SharedFile, Transport,
};
use std::ops::Range;
use std::time::Duration;

/// A channel's capabilities, through its accessors.
pub(crate) trait Capabilities {
    /// A transfer's registration, as the engine makes it; its key (which names it).
    fn register_transfer(&mut self, region: Region, access: PeerAccess) -> Result<RemoteKey>;
    /// Ends a transfer's registration named by its key.
    fn deregister_transfer(&mut self, key: &RemoteKey, written: Range<usize>);
    /// A long-lived registration; `None` from a channel without one-sided memory.
    fn register_lasting(&mut self, region: Region, file: Option<SharedFile>) -> Result<Option<MemHandle>>;
    fn deregister(&mut self, handle: &MemHandle);
    fn flush(&mut self, peer: Rank, op: OpId) -> Result<Issued>;
    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, op: OpId) -> Result<Issued>;
    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, op: OpId) -> Result<Issued>;
    fn arm(&mut self) -> bool;
    fn sleep(&mut self, timeout: Duration);
    fn disarm(&mut self);
}

impl Capabilities for dyn Transport + '_ {
    fn register_transfer(&mut self, region: Region, access: PeerAccess) -> Result<RemoteKey> {
        self.one_sided()?.register(region, access, Lifetime::Transfer).map(|h| *h.key())
    }
    fn deregister_transfer(&mut self, key: &RemoteKey, written: Range<usize>) {
        if let Some(m) = self.memory() {
            m.deregister(&MemHandle::new(*key, &Lifetime::Transfer), written);
        }
    }
    fn register_lasting(&mut self, region: Region, file: Option<SharedFile>) -> Result<Option<MemHandle>> {
        let Some(m) = self.memory() else { return Ok(None) };
        m.register(region, PeerAccess::ReadWrite, Lifetime::Lasting { file }).map(Some)
    }
    fn deregister(&mut self, handle: &MemHandle) {
        if let Some(m) = self.memory() {
            m.deregister(handle, 0..0);
        }
    }
    fn flush(&mut self, peer: Rank, op: OpId) -> Result<Issued> {
        self.one_sided()?.flush(peer, op)
    }
    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, op: OpId) -> Result<Issued> {
        self.one_sided()?.get(peer, key, offset, into, op)
    }
    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, op: OpId) -> Result<Issued> {
        self.one_sided()?.put(peer, from, key, offset, op)
    }
    fn arm(&mut self) -> bool {
        self.wakeup().is_some_and(|w| w.arm())
    }
    fn sleep(&mut self, timeout: Duration) {
        if let Some(w) = self.wakeup() {
            w.sleep(timeout);
        }
    }
    fn disarm(&mut self) {
        if let Some(w) = self.wakeup() {
            w.disarm();
        }
    }
}
