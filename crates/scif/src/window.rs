//! Window tables: an endpoint's own windows and the ones its peer registered, offset range →
//! mapping and protection. Every RMA, signal and mapping resolves its range here first: a range
//! outside the windows is `ENXIO`, a protection the window lacks `EACCES`.

use crate::dma::Place;
use crate::error::{Result, ScifError};
use crate::flags::Prot;
use crate::memory::Memory;
use memmap2::MmapRaw;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// The highest window end: libscif offsets are `off_t`.
pub(crate) const OFFSET_LIMIT: u64 = i64::MAX as u64;

/// The memory a window lies in; clones keep mapped what the provider mapped.
#[derive(Clone, Debug)]
pub(crate) enum Backing {
    /// A memory file of this process.
    Local(Memory),
    /// This process's mapping of a peer's memory file.
    Peer(Arc<MmapRaw>),
    /// Ordinary memory of this process registered in place: `len` bytes from `addr`, which the
    /// registrant keeps mapped while the window lives.
    InPlace { addr: usize, len: usize },
    /// A peer's ordinary memory registered in place: `len` bytes from `addr` in process `pid`,
    /// reached only by the kernel's cross-process copy.
    PeerInPlace { pid: i32, addr: usize, len: usize },
}

impl Backing {
    fn len(&self) -> usize {
        match self {
            Backing::Local(m) => m.len(),
            Backing::Peer(m) => m.len(),
            Backing::InPlace { len, .. } | Backing::PeerInPlace { len, .. } => *len,
        }
    }
}

/// A resolved piece of a range: `len` bytes at `off` of `backing`.
#[derive(Clone, Debug)]
pub(crate) struct Seg {
    pub backing: Backing,
    pub off: usize,
    pub len: usize,
}

impl Seg {
    /// Where the piece starts; `len` bytes from it stay there while the segment lives.
    pub(crate) fn place(&self) -> Place {
        debug_assert!(self.off + self.len <= self.backing.len());
        // `off + len` is within the backing: `Table::resolve` only makes segments inside a
        // window, and a window lies inside its backing (checked at insertion).
        match &self.backing {
            Backing::Local(m) => Place::Here(m.as_ptr().wrapping_add(self.off)),
            Backing::Peer(m) => Place::Here(m.as_mut_ptr().wrapping_add(self.off)),
            Backing::InPlace { addr, .. } => Place::Here((addr + self.off) as *mut u8),
            Backing::PeerInPlace { pid, addr, .. } => Place::Peer { pid: *pid, addr: addr + self.off },
        }
    }
}

/// One window.
#[derive(Debug)]
pub(crate) struct Win {
    pub len: u64,
    pub prot: Prot,
    pub backing: Backing,
    /// Where the window starts in its backing.
    pub base: usize,
    /// The peer's memory file and the window's offset in it (peer windows only; for `mmap`).
    pub file: Option<(Arc<OwnedFd>, u64)>,
}

/// Windows by offset, never overlapping.
#[derive(Debug, Default)]
pub(crate) struct Table {
    wins: BTreeMap<u64, Win>,
}

impl Table {
    /// The first window overlapping `[off, off + len)`, as (offset, length).
    pub(crate) fn overlap(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        let end = off + len;
        let before = self.wins.range(..end).next_back();
        before.filter(|(s, w)| **s + w.len > off).map(|(s, w)| (*s, w.len))
    }

    /// Adds `win` at `off`; the caller checked that it overlaps nothing.
    pub(crate) fn insert(&mut self, off: u64, win: Win) {
        debug_assert!(self.overlap(off, win.len).is_none());
        assert!(win.base as u64 + win.len <= win.backing.len() as u64, "a window outside its backing");
        self.wins.insert(off, win);
    }

    /// The lowest page-aligned offset where `len` bytes fit between the windows.
    pub(crate) fn choose(&self, len: u64) -> Option<u64> {
        let mut at = 0u64;
        for (s, w) in &self.wins {
            if at.checked_add(len)? <= *s {
                return Some(at);
            }
            at = at.max(s + w.len);
        }
        at.checked_add(len).filter(|end| *end <= OFFSET_LIMIT).map(|_| at)
    }

    /// The windows exactly covering `[off, off + len)` (one or more, contiguous), removed;
    /// `None` (and nothing removed) when the range does not start and end at window bounds or
    /// has a gap.
    pub(crate) fn remove_exact(&mut self, off: u64, len: u64) -> Option<Vec<Win>> {
        let end = off.checked_add(len)?;
        let mut at = off;
        let mut keys = Vec::new();
        while at < end {
            let w = self.wins.get(&at)?;
            keys.push(at);
            at += w.len;
        }
        if at != end {
            return None;
        }
        Some(keys.into_iter().filter_map(|k| self.wins.remove(&k)).collect())
    }

    /// The window holding all of `[off, off + len)`: its offset and itself.
    pub(crate) fn containing(&self, off: u64, len: u64) -> Option<(u64, &Win)> {
        let (s, w) = self.wins.range(..=off).next_back()?;
        (off.checked_add(len)? <= s + w.len).then_some((*s, w))
    }

    /// The segments of `[off, off + len)`, which contiguous windows allowing `need` must cover.
    /// `what` names the range in errors ("readfrom's remote range").
    pub(crate) fn resolve(&self, off: u64, len: usize, need: Prot, what: &str) -> Result<Vec<Seg>> {
        let end = off
            .checked_add(len as u64)
            .filter(|e| *e <= OFFSET_LIMIT)
            .ok_or_else(|| ScifError::Enxio(format!("{what} {off:#x}+{len:#x} passes the end of the window space")))?;
        let mut segs = Vec::with_capacity(1);
        let mut at = off;
        while at < end {
            let hit = self.wins.range(..=at).next_back().filter(|(s, w)| at < **s + w.len);
            let Some((s, w)) = hit else {
                return Err(ScifError::Enxio(format!(
                    "{what} {off:#x}+{len:#x}: no window at {at:#x} ({})",
                    self.summary()
                )));
            };
            if !w.prot.contains(need) {
                return Err(ScifError::Eacces(format!(
                    "{what} {off:#x}+{len:#x}: the window at {s:#x}+{:#x} is {}, the access needs {}",
                    w.len,
                    w.prot.name(),
                    need.name()
                )));
            }
            let take = (s + w.len).min(end) - at;
            segs.push(Seg { backing: w.backing.clone(), off: w.base + (at - s) as usize, len: take as usize });
            at += take;
        }
        Ok(segs)
    }

    /// The windows, as text for errors: at most four.
    pub(crate) fn summary(&self) -> String {
        if self.wins.is_empty() {
            return "no windows registered".into();
        }
        let mut out = String::from("windows ");
        for (i, (s, w)) in self.wins.iter().enumerate() {
            if i == 4 {
                let _ = write!(out, ", and {} more", self.wins.len() - 4);
                break;
            }
            let _ = write!(out, "{}{s:#x}+{:#x} {}", if i > 0 { ", " } else { "" }, w.len, w.prot.name());
        }
        out
    }

    /// Drops every window.
    pub(crate) fn clear(&mut self) {
        self.wins.clear();
    }
}
