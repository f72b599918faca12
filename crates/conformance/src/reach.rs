//! The optional capabilities of a channel reached through its accessors ([`Transport::memory`],
//! [`Transport::wakeup`]), answering as a channel without them does: one-sided operations are
//! errors, registrations need nothing, and `arm` says no.

use polyrail_core::{Issued, OpId, PeerAccess, Rank, Region, RegionMut, RemoteKey, Result, SharedFile, Transport};
use std::ops::Range;
use std::time::Duration;

/// A channel's capabilities, through its accessors.
pub(crate) trait Capabilities {
    fn expose(&mut self, region: Region, access: PeerAccess) -> Result<RemoteKey>;
    fn unexpose(&mut self, key: &RemoteKey, written: Range<usize>);
    fn register_memory(&mut self, region: Region, file: Option<SharedFile>) -> Result<()>;
    fn unregister_memory(&mut self, region: Region);
    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, op: OpId) -> Result<Issued>;
    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, op: OpId) -> Result<Issued>;
    fn arm(&mut self) -> bool;
    fn sleep(&mut self, timeout: Duration);
    fn disarm(&mut self);
}

impl Capabilities for dyn Transport + '_ {
    fn expose(&mut self, region: Region, access: PeerAccess) -> Result<RemoteKey> {
        self.one_sided()?.expose(region, access)
    }
    fn unexpose(&mut self, key: &RemoteKey, written: Range<usize>) {
        if let Some(m) = self.memory() {
            m.unexpose(key, written);
        }
    }
    fn register_memory(&mut self, region: Region, file: Option<SharedFile>) -> Result<()> {
        self.memory().map_or(Ok(()), |m| m.register_memory(region, file))
    }
    fn unregister_memory(&mut self, region: Region) {
        if let Some(m) = self.memory() {
            m.unregister_memory(region);
        }
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
