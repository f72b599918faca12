//! [`Conn`]: what a connected endpoint shares with the DMA engine — the control socket to the
//! peer, both window tables, the RMA counters and the status pages, and whether the peer lives.

use crate::error::{Result, ScifError};
use crate::flags::{PortId, Prot};
use crate::memory::{check_peer_file, map_peer_file, page_size, Memory};
use crate::window::{Backing, Table, Win, OFFSET_LIMIT};
use crate::wire::{self, Kind, Received, Record};
use memmap2::MmapRaw;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Status page layout (8-byte words): RMAs issued, RMAs completed without a gap.
const ISSUED: usize = 0;
const DONE: usize = 8;
/// Bytes of a status page the reader needs.
pub(crate) const STATUS_LEN: u64 = 16;
/// How long a wait sleeps between two looks at the peer's liveness.
const LIVENESS: Duration = Duration::from_millis(50);

/// Both window tables of a connection.
#[derive(Debug, Default)]
pub(crate) struct Windows {
    /// This endpoint's windows.
    pub mine: Table,
    /// The peer's windows, as this process mapped them.
    pub peers: Table,
}

#[derive(Debug, Default)]
struct Rma {
    /// Sequence number of the last RMA this endpoint issued (the first is 1).
    issued: u64,
    /// Every RMA up to this one completed.
    done: u64,
    /// RMAs above `done` that completed (out of order).
    done_above: BTreeSet<u64>,
    /// RMAs that failed because the peer was lost.
    failed: BTreeSet<u64>,
    /// RMAs whose copy failed, and why (a peer's memory registered in place that it unmapped).
    faults: BTreeMap<u64, String>,
}

/// One connection, shared by its endpoint and the DMA engine.
pub(crate) struct Conn {
    /// Unique in the process: marks name the connection they belong to.
    pub id: u64,
    pub local: PortId,
    pub peer: PortId,
    pub peer_pid: i32,
    ctl: OwnedFd,
    /// Held while records are read from `ctl`: a reader sees every record sent before it.
    ctl_rx: Mutex<()>,
    /// Held while a window record is sent: taken under the window lock, which is then let go,
    /// so records leave in the order of the table's changes without holding the tables during
    /// a send that may wait for room.
    ctl_tx: Mutex<()>,
    pub windows: Mutex<Windows>,
    rma: Mutex<Rma>,
    rma_cv: Condvar,
    /// Counters the peer reads: this side's RMAs.
    status: Memory,
    /// The peer's status page, mapped read-only.
    peer_status: MmapRaw,
    peer_closed: AtomicBool,
    dead: AtomicBool,
    reason: Mutex<String>,
    refused: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Conn({} -> {} pid {})", self.local, self.peer, self.peer_pid)
    }
}

/// Maps the status page a peer passed, after checking its file.
pub(crate) fn map_peer_status(fd: &OwnedFd) -> Result<MmapRaw, String> {
    check_peer_file(fd.as_fd(), 0, STATUS_LEN)?;
    map_peer_file(fd.as_fd(), 0, STATUS_LEN as usize, false).map_err(|e| format!("mapping its status page: {e}"))
}

impl Conn {
    pub(crate) fn new(
        local: PortId,
        peer: PortId,
        peer_pid: i32,
        ctl: OwnedFd,
        status: Memory,
        peer_status: MmapRaw,
    ) -> Conn {
        static IDS: AtomicU64 = AtomicU64::new(1);
        Conn {
            // Relaxed: only uniqueness matters.
            id: IDS.fetch_add(1, Ordering::Relaxed),
            local,
            peer,
            peer_pid,
            ctl,
            ctl_rx: Mutex::new(()),
            ctl_tx: Mutex::new(()),
            windows: Mutex::new(Windows::default()),
            rma: Mutex::new(Rma::default()),
            rma_cv: Condvar::new(),
            status,
            peer_status,
            peer_closed: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            reason: Mutex::new(String::new()),
            refused: Mutex::new(Vec::new()),
        }
    }

    /// The peer, for messages: "peer 0:1088 (pid 42)".
    pub(crate) fn who(&self) -> String {
        format!("peer {} (pid {})", self.peer, self.peer_pid)
    }

    pub(crate) fn is_dead(&self) -> bool {
        // Acquire: pairs with the Release in `set_dead`; the reason is written before.
        self.dead.load(Ordering::Acquire)
    }

    /// The error for an operation on a lost connection: `ECONNRESET` naming the peer.
    pub(crate) fn dead_error(&self) -> ScifError {
        ScifError::Econnreset(self.reason.lock().unwrap().clone())
    }

    fn set_dead(&self, reason: String) {
        let mut r = self.reason.lock().unwrap();
        if self.is_dead() {
            return;
        }
        *r = reason;
        // Release: publishes the reason; pairs with the Acquire in `is_dead`.
        self.dead.store(true, Ordering::Release);
        drop(r);
        let _g = self.rma.lock().unwrap();
        self.rma_cv.notify_all();
    }

    /// The peer's end is gone: closed in order (a close record came first) or not (it died).
    pub(crate) fn lost(&self) {
        let why = if self.peer_closed.load(Ordering::Acquire) {
            format!("{} closed its endpoint, connected to {}", self.who(), self.local)
        } else {
            format!("{} died or reset the connection to {} without closing", self.who(), self.local)
        };
        self.set_dead(why);
    }

    /// This endpoint closes: queued RMAs are dropped and the peer told.
    pub(crate) fn close_local(&self) {
        let _ = wire::send(self.ctl.as_fd(), &Record::new(Kind::Close, 0, 0, 0, 0), &[]);
        // The peer sees the end now, though transfers of the engine still hold this connection.
        let _ = rustix::net::shutdown(&self.ctl, rustix::net::Shutdown::Both);
        self.set_dead(format!("endpoint {} was closed", self.local));
        let mut w = self.windows.lock().unwrap();
        w.mine.clear();
        w.peers.clear();
    }

    /// Reads every record the peer sent so far and applies it; notices a lost peer.
    pub(crate) fn pump(&self) {
        let _g = self.ctl_rx.lock().unwrap();
        while !self.is_dead() {
            match wire::recv(self.ctl.as_fd(), false) {
                Ok(Received::Empty) => return,
                Ok(Received::Eof) => self.lost(),
                Ok(Received::Malformed(why)) => self.refuse(format!("refused {why} from {}", self.who())),
                Ok(Received::Record(rec, fds)) => self.apply(rec, fds),
                Err(_) => self.lost(),
            }
        }
    }

    /// Reads what a lost peer sent last, looking only for its close record: applies nothing, so
    /// callers may hold the window tables.
    fn drain_for_close(&self) {
        // Whoever holds the lock reads the close record itself.
        let Ok(_g) = self.ctl_rx.try_lock() else { return };
        loop {
            match wire::recv(self.ctl.as_fd(), false) {
                // Release: read by `lost`.
                Ok(Received::Record(rec, _)) if rec.kind == Kind::Close => {
                    self.peer_closed.store(true, Ordering::Release)
                }
                Ok(Received::Record(..) | Received::Malformed(_)) => {}
                _ => return,
            }
        }
    }

    /// Whether the peer is still there (after reading what it sent).
    pub(crate) fn alive(&self) -> bool {
        self.pump();
        !self.is_dead()
    }

    /// `Ok` while the peer is there, else `ECONNRESET` naming it.
    pub(crate) fn check(&self) -> Result<()> {
        if self.alive() {
            Ok(())
        } else {
            Err(self.dead_error())
        }
    }

    /// Sends a record to the peer; a peer that is gone is `ECONNRESET`.
    pub(crate) fn send(&self, rec: &Record, fds: &[BorrowedFd<'_>]) -> Result<()> {
        match wire::send(self.ctl.as_fd(), rec, fds) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => {
                self.drain_for_close();
                self.lost();
                Err(self.dead_error())
            }
            Err(e) => Err(ScifError::os(format_args!("sending a record to {}", self.who()), e)),
        }
    }

    /// Sends a record about a change of the tables `held` guards: in the order of the changes,
    /// with the tables let go before the send.
    pub(crate) fn send_after<T>(&self, held: MutexGuard<'_, T>, rec: &Record, fds: &[BorrowedFd<'_>]) -> Result<()> {
        let _tx = self.ctl_tx.lock().unwrap();
        drop(held);
        self.send(rec, fds)
    }

    fn refuse(&self, why: String) {
        self.refused.lock().unwrap().push(why);
    }

    /// What the peer sent that was refused.
    pub(crate) fn refusals(&self) -> Vec<String> {
        self.refused.lock().unwrap().clone()
    }

    fn apply(&self, rec: Record, mut fds: Vec<OwnedFd>) {
        match rec.kind {
            Kind::Register => {
                let (off, len, file_off) = (rec.a, rec.b, rec.d);
                match self.add_peer_window(off, len, rec.c, file_off, &mut fds) {
                    Ok(()) => {}
                    Err(why) => self.refuse(format!(
                        "refused a window of {} at {off:#x}+{len:#x} (file offset {file_off:#x}): {why}",
                        self.who()
                    )),
                }
            }
            Kind::RegisterInPlace => {
                let (off, len, addr) = (rec.a, rec.b, rec.d);
                match self.add_peer_window_in_place(off, len, rec.c, addr, &fds) {
                    Ok(()) => {}
                    Err(why) => self.refuse(format!(
                        "refused a window of {}'s own memory at {off:#x}+{len:#x} (address {addr:#x}): {why}",
                        self.who()
                    )),
                }
            }
            Kind::Unregister => {
                let mut w = self.windows.lock().unwrap();
                if w.peers.remove_exact(rec.a, rec.b).is_none() {
                    drop(w);
                    self.refuse(format!(
                        "refused to unregister {:#x}+{:#x} for {}: not whole windows",
                        rec.a,
                        rec.b,
                        self.who()
                    ));
                }
            }
            // Release: read by `lost` after the end of the socket.
            Kind::Close => self.peer_closed.store(true, Ordering::Release),
            Kind::Hello | Kind::Welcome => self.refuse(format!("refused a {:?} record from {}", rec.kind, self.who())),
        }
    }

    /// Checks a window the peer announced and maps it; says why not.
    fn add_peer_window(
        &self,
        off: u64,
        len: u64,
        prot: u64,
        file_off: u64,
        fds: &mut Vec<OwnedFd>,
    ) -> Result<(), String> {
        let page = page_size() as u64;
        if fds.len() != 1 {
            return Err(format!("{} files attached, one expected", fds.len()));
        }
        let prot = u32::try_from(prot).ok().and_then(Prot::from_bits).filter(|p| *p != Prot::NONE);
        let prot = prot.ok_or("no valid protection")?;
        if len == 0 || len % page != 0 || off % page != 0 || file_off % page != 0 {
            return Err(format!("offsets and length must be multiples of the {page}-byte page"));
        }
        if off.checked_add(len).is_none_or(|end| end > OFFSET_LIMIT) || usize::try_from(len).is_err() {
            return Err("the range passes the end of the window space".into());
        }
        let fd = fds.pop().unwrap();
        check_peer_file(fd.as_fd(), file_off, len)?;
        let map = map_peer_file(fd.as_fd(), file_off, len as usize, prot.contains(Prot::WRITE))
            .map_err(|e| format!("mapping it {}: {e}", prot.name()))?;
        let mut w = self.windows.lock().unwrap();
        if let Some((s, l)) = w.peers.overlap(off, len) {
            return Err(format!("it overlaps its window at {s:#x}+{l:#x}"));
        }
        let backing = Backing::Peer(Arc::new(map));
        w.peers.insert(off, Win { len, prot, backing, base: 0, file: Some((Arc::new(fd), file_off)) });
        Ok(())
    }

    /// Checks a window of the peer's ordinary memory it announced and records it; says why not.
    /// Its pages are the peer's, reached only by the kernel's cross-process copy.
    fn add_peer_window_in_place(
        &self,
        off: u64,
        len: u64,
        prot: u64,
        addr: u64,
        fds: &[OwnedFd],
    ) -> Result<(), String> {
        let page = page_size() as u64;
        if !fds.is_empty() {
            return Err(format!("{} files attached, none expected", fds.len()));
        }
        let prot = u32::try_from(prot).ok().and_then(Prot::from_bits).filter(|p| *p != Prot::NONE);
        let prot = prot.ok_or("no valid protection")?;
        if len == 0 || len % page != 0 || off % page != 0 || addr % page != 0 {
            return Err(format!("offsets, address and length must be multiples of the {page}-byte page"));
        }
        if off.checked_add(len).is_none_or(|end| end > OFFSET_LIMIT)
            || addr.checked_add(len).is_none_or(|end| usize::try_from(end).is_err())
        {
            return Err("the range passes the end of the window space or of the address space".into());
        }
        let mut w = self.windows.lock().unwrap();
        if let Some((s, l)) = w.peers.overlap(off, len) {
            return Err(format!("it overlaps its window at {s:#x}+{l:#x}"));
        }
        let backing = Backing::PeerInPlace { pid: self.peer_pid, addr: addr as usize, len: len as usize };
        w.peers.insert(off, Win { len, prot, backing, base: 0, file: None });
        Ok(())
    }

    /// The next RMA's sequence number, counted as issued (published to the peer).
    pub(crate) fn issue(&self) -> u64 {
        let mut r = self.rma.lock().unwrap();
        r.issued += 1;
        self.status.store_u64(ISSUED, r.issued);
        r.issued
    }

    /// The last RMA issued.
    pub(crate) fn issued(&self) -> u64 {
        self.rma.lock().unwrap().issued
    }

    /// RMA `seq` completed (failed if the peer is lost by now).
    pub(crate) fn complete(&self, seq: u64) {
        let mut r = self.rma.lock().unwrap();
        if self.is_dead() {
            r.failed.insert(seq);
        }
        if seq == r.done + 1 {
            r.done = seq;
            while let Some(next) = r.done_above.first().copied().filter(|n| *n == r.done + 1) {
                r.done_above.remove(&next);
                r.done = next;
            }
            // Release: the RMAs' bytes are written before; pairs with the peer's Acquire in
            // `peer_counters`.
            self.status.store_u64(DONE, r.done);
        } else if seq > r.done {
            r.done_above.insert(seq);
        }
        self.rma_cv.notify_all();
    }

    /// RMA `seq`'s copy failed for `why`; it still completes, as failed.
    pub(crate) fn fault(&self, seq: u64, why: String) {
        self.rma.lock().unwrap().faults.insert(seq, why);
    }

    /// Whether every RMA up to `seq` completed.
    pub(crate) fn done_through(&self, seq: u64) -> bool {
        self.rma.lock().unwrap().done >= seq
    }

    /// Waits until every RMA up to `seq` completed (`through`) or RMA `seq` alone did; a failed
    /// one or a peer lost first is `ECONNRESET` naming it.
    pub(crate) fn wait(&self, seq: u64, through: bool) -> Result<()> {
        let mut r = self.rma.lock().unwrap();
        loop {
            let done = r.done >= seq || (!through && r.done_above.contains(&seq));
            if done {
                let failed =
                    if through { r.failed.first().is_some_and(|f| *f <= seq) } else { r.failed.contains(&seq) };
                if failed {
                    return Err(self.dead_error());
                }
                let fault = if through { r.faults.range(..=seq).next() } else { r.faults.get_key_value(&seq) };
                return match fault {
                    Some((_, why)) => {
                        Err(ScifError::Os { what: why.clone(), errno: rustix::io::Errno::FAULT.raw_os_error() })
                    }
                    None => Ok(()),
                };
            }
            if self.is_dead() {
                return Err(self.dead_error());
            }
            r = self.rma_cv.wait_timeout(r, LIVENESS).unwrap().0;
            r = self.unlocked(r, |c| c.pump());
        }
    }

    fn unlocked<'a>(&'a self, g: MutexGuard<'a, Rma>, f: impl FnOnce(&Conn)) -> MutexGuard<'a, Rma> {
        drop(g);
        f(self);
        self.rma.lock().unwrap()
    }

    /// The peer's counters: RMAs issued and completed without a gap.
    pub(crate) fn peer_counters(&self) -> (u64, u64) {
        let word = |at: usize| {
            // SAFETY: the page is at least `STATUS_LEN` bytes (checked when mapped) and
            // page-aligned, so both words are aligned and inside; mapped while `self` lives.
            let w = unsafe { &*self.peer_status.as_ptr().add(at).cast::<AtomicU64>() };
            // Acquire: pairs with the peer's Release in `issue`/`complete`.
            w.load(Ordering::Acquire)
        };
        (word(ISSUED), word(DONE))
    }

    /// Waits until the peer's RMAs up to `seq` completed; a peer lost first is `ECONNRESET`.
    pub(crate) fn wait_peer(&self, seq: u64) -> Result<()> {
        let mut pause = Duration::from_micros(10);
        loop {
            if self.peer_counters().1 >= seq {
                return Ok(());
            }
            self.check()?;
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}
