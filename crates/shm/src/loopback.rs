//! [`Loopback`]: messages from a process to itself, and one-sided copies within it.

use std::collections::VecDeque;
use std::ops::Range;

use polyrail_core::{
    Address, Caps, Cost, Error, Header, Issued, Lifetime, MemHandle, OneSided, OpId, PeerAccess, PeerInfo, Rank, Reach,
    Region, RegionMut, RemoteKey, Result, Sink, Transport, TransportAttr, TransportKind,
};

use crate::key::PidKey;

/// Messages queued before `try_send` answers [`Issued::WouldBlock`].
const QUEUE_DEPTH: usize = 256;
/// Largest payload of one message.
const MAX_EAGER: usize = 1 << 20;

/// A queued message; its payload buffer is recycled after delivery.
#[derive(Debug)]
struct Packet {
    hdr: Header,
    payload: Vec<u8>,
}

/// The channel to oneself (`self`): a queue of reusable buffers for active messages, `memcpy`
/// for `get`/`put` on memory this process exposed.
#[derive(Debug)]
pub struct Loopback {
    attr: TransportAttr,
    rank: Rank,
    pid: u32,
    queue: VecDeque<Packet>,
    /// Buffers of delivered packets, reused by later sends (no allocation in steady state).
    spare: Vec<Vec<u8>>,
    /// Regions registered and not yet deregistered: `(address, length)`.
    exposed: Vec<(u64, u64)>,
}

impl Loopback {
    /// The loopback channel of rank `rank`.
    pub fn new(rank: Rank) -> Loopback {
        let attr = TransportAttr {
            kind: TransportKind::SELF,
            max_inline: MAX_EAGER,
            max_eager: MAX_EAGER,
            max_rma: isize::MAX as usize,
            caps: Caps::AM | Caps::GET | Caps::PUT | Caps::RMA_INLINE_COMPLETION | Caps::CPU_COPY | Caps::SELF_ONLY,
            // Model defaults: a queue push and pop; memcpy bandwidth (two copies for messages).
            am_cost: Cost { latency_ns: 30.0, overhead_ns: 20.0, bandwidth: 8e9 },
            rma_cost: Cost { latency_ns: 10.0, overhead_ns: 10.0, bandwidth: 16e9 },
            // One thread makes both halves of a split copy: nothing gained.
            split_from: None,
            mapped_from: None,
            rndv_from: Vec::new(),
        };
        Loopback {
            attr,
            rank,
            pid: std::process::id(),
            queue: VecDeque::with_capacity(QUEUE_DEPTH),
            spare: Vec::with_capacity(QUEUE_DEPTH),
            exposed: Vec::new(),
        }
    }

    fn not_self(&self, peer: Rank) -> Error {
        Error::Transport { kind: "self", what: format!("rank {peer} is not this process (rank {})", self.rank) }
    }

    /// Checks `key` names memory this process exposed, covering `[offset, offset + len)`;
    /// returns the address.
    fn check_key(&self, peer: Rank, key: &RemoteKey, offset: usize, len: usize) -> Result<*mut u8> {
        if peer != self.rank {
            return Err(self.not_self(peer));
        }
        let bad = |what: String| Error::Transport { kind: "self", what: format!("bad remote key: {what}") };
        let k = PidKey::decode(key).map_err(bad)?;
        if k.pid != self.pid {
            return Err(bad(format!("it names pid {}, this process is {}", k.pid, self.pid)));
        }
        let addr = k.range(offset, len).map_err(bad)?;
        let inside = self.exposed.iter().any(|&(a, l)| k.addr >= a && k.addr - a <= l && k.len <= l - (k.addr - a));
        if !inside {
            return Err(bad(format!("{:#x}+{} is not memory this process exposed", k.addr, k.len)));
        }
        Ok(addr as usize as *mut u8)
    }
}

impl Transport for Loopback {
    fn attr(&self) -> &TransportAttr {
        &self.attr
    }

    fn address(&self) -> Address {
        self.pid.to_le_bytes().to_vec()
    }

    fn add_peer(&mut self, peer: &PeerInfo, _address: &[u8]) -> Reach {
        if peer.rank == self.rank {
            Reach::Yes("this process".into())
        } else {
            Reach::No("the loopback channel only reaches this process".into())
        }
    }

    fn try_send(&mut self, peer: Rank, hdr: &Header, payload: &[u8]) -> Result<Issued> {
        if peer != self.rank {
            return Err(self.not_self(peer));
        }
        if payload.len() > MAX_EAGER {
            return Err(Error::Transport {
                kind: "self",
                what: format!("payload of {} bytes exceeds max_eager ({MAX_EAGER})", payload.len()),
            });
        }
        if self.queue.len() >= QUEUE_DEPTH {
            return Ok(Issued::WouldBlock);
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(payload);
        self.queue.push_back(Packet { hdr: *hdr, payload: buf });
        Ok(Issued::Done)
    }

    fn progress(&mut self, budget: usize, sink: &mut dyn Sink) -> Result<usize> {
        let mut done = 0;
        while done < budget {
            let Some(p) = self.queue.pop_front() else { break };
            sink.message(self.rank, &p.hdr, &p.payload);
            self.spare.push(p.payload);
            done += 1;
        }
        Ok(done)
    }

    fn describe(&self) -> String {
        format!("queue of {QUEUE_DEPTH} messages of up to {MAX_EAGER} B, {} regions exposed", self.exposed.len())
    }

    fn memory(&mut self) -> Option<&mut dyn OneSided> {
        Some(self)
    }
}

impl OneSided for Loopback {
    fn register(&mut self, region: Region, _access: PeerAccess, lifetime: Lifetime) -> Result<MemHandle> {
        self.exposed.push((region.ptr as u64, region.len as u64));
        let key = PidKey { pid: self.pid, addr: region.ptr as u64, len: region.len as u64, file: None }.encode();
        Ok(MemHandle::new(key, &lifetime))
    }

    fn deregister(&mut self, handle: &MemHandle, _written: Range<usize>) {
        if let Ok(k) = PidKey::decode(handle.key()) {
            if let Some(i) = self.exposed.iter().position(|&(a, l)| a == k.addr && l == k.len) {
                self.exposed.swap_remove(i);
            }
        }
    }

    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, _op: OpId) -> Result<Issued> {
        let src = self.check_key(peer, key, offset, into.len)?;
        // SAFETY: `src..src + len` lies in a region this process registered and has not deregistered
        // (whose builder promised it valid), `into` is valid for writes by its builder's promise;
        // `copy` allows the two to overlap.
        unsafe { std::ptr::copy(src, into.ptr, into.len) };
        Ok(Issued::Done)
    }

    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, _op: OpId) -> Result<Issued> {
        let dst = self.check_key(peer, key, offset, from.len)?;
        // SAFETY: as in `get`, with the roles of the two regions swapped.
        unsafe { std::ptr::copy(from.ptr, dst, from.len) };
        Ok(Issued::Done)
    }
}
