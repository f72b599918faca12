//! [`Endpoint`]: libscif's endpoint and its calls.

use crate::conn::{map_peer_status, Conn};
use crate::dma::{copy_piece, After, Copy, Released, Signal, Span, Transfer};
use crate::error::{Result, ScifError};
use crate::fabric::{Fabric, Inner, PortHold};
use crate::flags::{AcceptFlags, FenceFlags, MapFlags, MsgFlags, PollEvents, PortId, Prot, RmaFlags};
use crate::memory::{map_peer_file, page_size, reopen_read_only, Memory};
use crate::window::{Backing, Seg, Table, Win, OFFSET_LIMIT};
use crate::wire::{self, Kind, Received, Record};
use memmap2::MmapRaw;
use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long `accept` waits for a connector's first record.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// A SCIF endpoint: a file descriptor (a Unix socket here), so it can be polled ([`crate::poll`],
/// or any poller through [`AsFd`]). Open, then bind and listen to accept, or connect; a
/// connected endpoint sends and receives control messages, registers windows and runs RMAs on
/// them. Dropping it is `scif_close`: its windows go, the peer sees `ECONNRESET`.
///
/// Calls that change its state take `&mut self`; the others `&self`, from any thread.
#[derive(Debug)]
pub struct Endpoint {
    fabric: Arc<Inner>,
    sock: OwnedFd,
    state: State,
}

#[derive(Debug)]
enum State {
    Unbound,
    Bound(PortHold),
    Listening(PortHold),
    /// The connector holds its port; an accepted endpoint shares the listener's.
    Connected(Option<PortHold>, Arc<Conn>),
}

/// What [`Endpoint::fence_mark`] returns and [`Endpoint::fence_wait`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    conn: u64,
    peer: bool,
    seq: u64,
}

/// A mapping of a peer's window ([`Endpoint::mmap`]); `scif_munmap` is dropping it. It stays
/// valid after the peer unregisters the window or dies (the pages stay, as with SCIF).
#[derive(Debug)]
pub struct PeerMap {
    map: MmapRaw,
    prot: Prot,
}

fn unix_addr(path: &std::path::Path) -> Result<SocketAddrUnix> {
    SocketAddrUnix::new(path).map_err(|e| ScifError::os(format_args!("naming {}", path.display()), e))
}

impl Endpoint {
    /// `scif_open`: a new endpoint of `fabric`, not bound.
    pub fn open(fabric: &Fabric) -> Result<Endpoint> {
        let sock = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
            .map_err(|e| ScifError::os("opening an endpoint's socket", e))?;
        Ok(Endpoint { fabric: fabric.inner.clone(), sock, state: State::Unbound })
    }

    /// `scif_bind`: binds to `port` of this node, or with 0 to the first free port from 1088;
    /// returns the port. `EINVAL` if bound already, `EADDRINUSE` if the port is taken, `EACCES`
    /// below 1024 without privilege, `ENOSPC` if no port is free.
    pub fn bind(&mut self, port: u16) -> Result<u16> {
        if !matches!(self.state, State::Unbound) {
            return Err(ScifError::Einval(format!("bind({port}): the endpoint is bound already ({})", self.name())));
        }
        let hold = self.fabric.reserve(port)?;
        let port = hold.port;
        self.state = State::Bound(hold);
        Ok(port)
    }

    /// `scif_listen`: accepts connections to its port, `backlog` of them pending at most.
    /// `EINVAL` if not bound or listening already, `EISCONN` if connected.
    pub fn listen(&mut self, backlog: i32) -> Result<()> {
        let hold = match std::mem::replace(&mut self.state, State::Unbound) {
            State::Bound(hold) => hold,
            other => {
                let e = match &other {
                    State::Connected(..) => ScifError::Eisconn(format!("listen: {} is connected", self.name())),
                    State::Listening(h) => ScifError::Einval(format!("listen: port {} listens already", h.port)),
                    _ => ScifError::Einval("listen: the endpoint is not bound".into()),
                };
                self.state = other;
                return Err(e);
            }
        };
        let addr = unix_addr(&hold.sock_path)?;
        let listening =
            rustix::net::bind(&self.sock, &addr).and_then(|()| rustix::net::listen(&self.sock, backlog.max(1)));
        let mut hold = hold;
        hold.listening = true;
        if let Err(e) = listening {
            let _ = std::fs::remove_file(&hold.sock_path);
            hold.listening = false;
            self.state = State::Bound(hold);
            return Err(ScifError::os("listening", e));
        }
        self.state = State::Listening(hold);
        Ok(())
    }

    /// `scif_connect`: connects to the endpoint listening at `dst`, binding this one to a free
    /// port first if it is not bound; waits until the peer accepts and returns this endpoint's
    /// address. `ENODEV` for a node not in the job, `ECONNREFUSED` if nobody listens there,
    /// `EISCONN` if connected, `EINVAL` if listening.
    pub fn connect(&mut self, dst: PortId) -> Result<PortId> {
        match &self.state {
            State::Connected(..) => {
                return Err(ScifError::Eisconn(format!("connect({dst}): {} is connected", self.name())))
            }
            State::Listening(h) => return Err(ScifError::Einval(format!("connect({dst}): port {} listens", h.port))),
            _ => {}
        }
        if dst.node >= self.fabric.nodes {
            return Err(ScifError::Enodev(format!(
                "connect({dst}): node {} is not in the job (nodes 0..{})",
                dst.node, self.fabric.nodes
            )));
        }
        if matches!(self.state, State::Unbound) {
            self.state = State::Bound(self.fabric.reserve(0)?);
        }
        let State::Bound(hold) = &self.state else { unreachable!("bound above") };
        let local = PortId::new(self.fabric.node, hold.port);
        let addr = unix_addr(&self.fabric.sock_path(dst.node, dst.port))?;
        match rustix::net::connect(&self.sock, &addr) {
            Ok(()) => {}
            Err(Errno::NOENT | Errno::CONNREFUSED) => {
                return Err(ScifError::Econnrefused(format!("connect({dst}): nobody listens at port {dst}")))
            }
            Err(Errno::AGAIN) => {
                return Err(ScifError::Econnrefused(format!("connect({dst}): the listener's backlog is full")))
            }
            Err(e) => return Err(ScifError::os(format_args!("connect({dst})"), e)),
        }
        let (ctl, ctl_peer) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .map_err(|e| ScifError::os("making a control socket", e))?;
        let status = Memory::new(page_size())?;
        let hello = Record::new(Kind::Hello, local.to_bits(), u64::from(std::process::id()), 0, 0);
        wire::send(self.sock.as_fd(), &hello, &[ctl_peer.as_fd(), status.file()])
            .map_err(|e| ScifError::Econnrefused(format!("connect({dst}): the listener went ({e})")))?;
        drop(ctl_peer);
        let refused = |why: String| ScifError::Econnrefused(format!("connect({dst}): {why}"));
        // The welcome comes when the peer accepts; a listener that closes first drops our
        // control socket with its queue, or resets the stream.
        loop {
            let mut fds = [PollFd::new(&ctl, PollFlags::IN), PollFd::new(&self.sock, PollFlags::IN)];
            match rustix::event::poll(&mut fds, None) {
                Err(Errno::INTR) => continue,
                Err(e) => return Err(ScifError::os("waiting to be accepted", e)),
                Ok(_) => {}
            }
            if !fds[0].revents().is_empty() {
                break;
            }
            if fds[1].revents().intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::IN) {
                return Err(refused("the listener closed before accepting".into()));
            }
        }
        let (rec, mut fds) = match wire::recv(ctl.as_fd(), true) {
            Ok(Received::Record(rec, fds)) if rec.kind == Kind::Welcome && fds.len() == 1 => (rec, fds),
            Ok(Received::Eof) | Err(_) => return Err(refused("the listener closed before accepting".into())),
            _ => return Err(refused("the listener's reply is not a welcome".into())),
        };
        let peer_status =
            map_peer_status(&fds.pop().unwrap()).map_err(|why| refused(format!("its status page: {why}")))?;
        let peer_pid =
            rustix::net::sockopt::socket_peercred(&self.sock).map_or(rec.b as i32, |c| c.pid.as_raw_nonzero().get());
        let conn = Arc::new(Conn::new(local, dst, peer_pid, ctl, status, peer_status));
        self.fabric.engine.watch(&conn);
        let State::Bound(hold) = std::mem::replace(&mut self.state, State::Unbound) else { unreachable!() };
        self.state = State::Connected(Some(hold), conn);
        Ok(local)
    }

    /// `scif_accept`: the next connection to this listening endpoint, as a new connected
    /// endpoint and the connector's address. With [`AcceptFlags::SYNC`] it waits for one, else
    /// `EAGAIN` if none is pending. `EINVAL` if not listening; `ECONNRESET` if the connector
    /// went or did not introduce itself.
    pub fn accept(&self, flags: AcceptFlags) -> Result<(PortId, Endpoint)> {
        let State::Listening(hold) = &self.state else {
            return Err(ScifError::Einval(format!("accept: {} is not listening", self.name())));
        };
        let me = PortId::new(self.fabric.node, hold.port);
        let timeout = if flags.contains(AcceptFlags::SYNC) { None } else { Some(Duration::ZERO) };
        if !wait_readable(self.sock.as_fd(), timeout)? {
            return Err(ScifError::Eagain(format!("accept: no connection pending at {me}")));
        }
        let sock = loop {
            match rustix::net::accept_with(&self.sock, SocketFlags::CLOEXEC) {
                Err(Errno::INTR) => continue,
                Err(e) => return Err(ScifError::os(format_args!("accept at {me}"), e)),
                Ok(s) => break s,
            }
        };
        let pid = rustix::net::sockopt::socket_peercred(&sock).map_or(0, |c| c.pid.as_raw_nonzero().get());
        let reset = |why: &str| ScifError::Econnreset(format!("accept at {me}: the connection from pid {pid} {why}"));
        if !wait_readable(sock.as_fd(), Some(HELLO_TIMEOUT))? {
            return Err(reset("sent no hello"));
        }
        let (rec, mut fds) = match wire::recv(sock.as_fd(), true) {
            Ok(Received::Record(rec, fds)) if rec.kind == Kind::Hello && fds.len() == 2 => (rec, fds),
            _ => return Err(reset("did not introduce itself")),
        };
        let peer = PortId::from_bits(rec.a)
            .filter(|p| p.node < self.fabric.nodes)
            .ok_or_else(|| reset("named no valid port"))?;
        let status_fd = fds.pop().unwrap();
        let ctl = fds.pop().unwrap();
        if rustix::net::sockopt::socket_type(&ctl) != Ok(SocketType::SEQPACKET) {
            return Err(reset("passed no control socket"));
        }
        let peer_status =
            map_peer_status(&status_fd).map_err(|why| reset(&format!("passed a bad status page: {why}")))?;
        let status = Memory::new(page_size())?;
        let welcome = Record::new(Kind::Welcome, me.to_bits(), u64::from(std::process::id()), 0, 0);
        wire::send(ctl.as_fd(), &welcome, &[status.file()]).map_err(|_| reset("went before the welcome"))?;
        let conn = Arc::new(Conn::new(me, peer, pid, ctl, status, peer_status));
        self.fabric.engine.watch(&conn);
        Ok((peer, Endpoint { fabric: self.fabric.clone(), sock, state: State::Connected(None, conn) }))
    }

    /// This endpoint's address, once bound.
    pub fn local(&self) -> Option<PortId> {
        let port = match &self.state {
            State::Unbound => return None,
            State::Bound(h) | State::Listening(h) | State::Connected(Some(h), _) => h.port,
            State::Connected(None, c) => return Some(c.local),
        };
        Some(PortId::new(self.fabric.node, port))
    }

    /// The peer's address and process id, once connected.
    pub fn peer(&self) -> Option<(PortId, i32)> {
        match &self.state {
            State::Connected(_, c) => Some((c.peer, c.peer_pid)),
            _ => None,
        }
    }

    /// What the peer sent that the provider refused (forged windows, malformed records), each
    /// saying why.
    pub fn refusals(&self) -> Vec<String> {
        match &self.state {
            State::Connected(_, c) => {
                c.pump();
                c.refusals()
            }
            _ => Vec::new(),
        }
    }

    fn name(&self) -> String {
        match self.local() {
            Some(p) => format!("endpoint {p}"),
            None => "the endpoint".into(),
        }
    }

    fn conn(&self, call: &str) -> Result<&Arc<Conn>> {
        match &self.state {
            State::Connected(_, c) => Ok(c),
            _ => Err(ScifError::Enotconn(format!("{call}: {} is not connected", self.name()))),
        }
    }

    /// The peer went: `ECONNRESET` naming it (after reading what it said last).
    fn lost(&self, conn: &Conn) -> ScifError {
        conn.pump();
        conn.lost();
        conn.dead_error()
    }

    /// `scif_send`: sends `buf` to the peer. With [`MsgFlags::BLOCK`] it waits until all is sent,
    /// else it sends what fits now (maybe 0 bytes); returns the bytes sent. `ENOTCONN` if not
    /// connected, `ECONNRESET` if the peer is gone.
    pub fn send(&self, buf: &[u8], flags: MsgFlags) -> Result<usize> {
        let conn = self.conn("send")?;
        let block = flags.contains(MsgFlags::BLOCK);
        let mut sent = 0;
        while sent < buf.len() {
            let f = if block { SendFlags::NOSIGNAL } else { SendFlags::NOSIGNAL | SendFlags::DONTWAIT };
            match rustix::net::send(&self.sock, &buf[sent..], f) {
                Ok(n) => sent += n,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) if !block => break,
                Err(Errno::PIPE | Errno::CONNRESET) => return Err(self.lost(conn)),
                Err(e) => return Err(ScifError::os(format_args!("send to {}", conn.who()), e)),
            }
        }
        Ok(sent)
    }

    /// `scif_recv`: receives into `buf`. With [`MsgFlags::BLOCK`] it waits until `buf` is full,
    /// else it takes what has arrived (maybe 0 bytes); returns the bytes received. `ENOTCONN` if
    /// not connected, `ECONNRESET` if the peer is gone before what was asked arrived.
    pub fn recv(&self, buf: &mut [u8], flags: MsgFlags) -> Result<usize> {
        let conn = self.conn("recv")?;
        let block = flags.contains(MsgFlags::BLOCK);
        let mut got = 0;
        while got < buf.len() {
            let f = if block { RecvFlags::empty() } else { RecvFlags::DONTWAIT };
            match rustix::net::recv(&self.sock, &mut buf[got..], f) {
                Ok((0, _)) => return Err(self.lost(conn)),
                Ok((n, _)) => got += n,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) if !block => break,
                Err(Errno::CONNRESET) => return Err(self.lost(conn)),
                Err(e) => return Err(ScifError::os(format_args!("recv from {}", conn.who()), e)),
            }
        }
        Ok(got)
    }

    /// `scif_register`: makes `len` bytes of `mem` from `mem_offset` a window of this endpoint,
    /// which the peer reaches by RMA and `mmap` within `prot`. With [`MapFlags::FIXED`] the window
    /// is at `offset`, else the provider chooses (and ignores `offset`); returns the window's
    /// offset. Offsets and lengths are page multiples (`EINVAL`); a fixed window overlapping one
    /// before is `EADDRINUSE`; `ENOTCONN` if not connected.
    pub fn register(
        &self,
        mem: &Memory,
        mem_offset: usize,
        len: usize,
        offset: u64,
        prot: Prot,
        flags: MapFlags,
    ) -> Result<u64> {
        let conn = self.conn("register")?;
        let page = page_size();
        let what = format!("register({mem_offset:#x}+{len:#x} at {offset:#x})");
        if len == 0 || len % page != 0 || mem_offset % page != 0 {
            return Err(ScifError::Einval(format!("{what}: the memory range must be whole {page}-byte pages")));
        }
        if mem_offset.checked_add(len).is_none_or(|end| end > mem.len()) {
            return Err(ScifError::Einval(format!(
                "{what}: the range passes the end of {:#x} bytes of memory",
                mem.len()
            )));
        }
        check_prot(prot, &what)?;
        // A window the peer may only read goes as a read-only file: the kernel refuses it more.
        let ro = if prot == Prot::READ {
            Some(reopen_read_only(mem.file()).map_err(|e| ScifError::os("reopening a memory file read-only", e))?)
        } else {
            None
        };
        let file = ro.as_ref().map_or(mem.file(), |f| f.as_fd());
        let win = Win { len: len as u64, prot, backing: Backing::Local(mem.clone()), base: mem_offset, file: None };
        Self::add_window(conn, win, (Kind::Register, mem_offset as u64), offset, flags, &what, &[file])
    }

    /// Adds `win` to this endpoint's windows (at `offset` if `flags` fix it) and tells the peer
    /// with a record of `kind` and `arg`, passing `files`; takes the window back if that fails.
    fn add_window(
        conn: &Arc<Conn>,
        win: Win,
        (kind, arg): (Kind, u64),
        offset: u64,
        flags: MapFlags,
        what: &str,
        files: &[BorrowedFd<'_>],
    ) -> Result<u64> {
        conn.check()?;
        let (len, prot) = (win.len, win.prot);
        let mut w = conn.windows.lock().unwrap();
        let at = Self::place_window(&w.mine, offset, len, flags, what)?;
        w.mine.insert(at, win);
        let rec = Record::new(kind, at, len, u64::from(prot.bits()), arg);
        if let Err(e) = conn.send_after(w, &rec, files) {
            conn.windows.lock().unwrap().mine.remove_exact(at, len);
            return Err(e);
        }
        Ok(at)
    }

    /// `scif_register` of ordinary memory, in place: `len` bytes from `addr` (whole pages,
    /// page-aligned) become a window the peer reaches within `prot`, at `offset` with
    /// [`MapFlags::FIXED`] or where the provider chooses; returns the window's offset. The pages
    /// are not copied: the peer's RMAs read and write them with `process_vm_readv`/`writev`, as a
    /// DMA engine reaches pinned pages. Its peers cannot `mmap` such a window nor signal into it
    /// (`EINVAL`: this provider maps only memory files); [`Fabric::lends_in_place`] says whether
    /// peers can reach them at all. Errors as [`Endpoint::register`].
    ///
    /// # Safety
    /// The `len` bytes from `addr` stay mapped (readable, and writable with [`Prot::WRITE`])
    /// until the window is unregistered or the endpoint closed: this endpoint's own RMAs reach
    /// them here. With [`Prot::WRITE`], nothing else reads or writes them meanwhile but through
    /// SCIF, as with memory a DMA engine writes.
    pub unsafe fn register_in_place(
        &self,
        addr: *const u8,
        len: usize,
        offset: u64,
        prot: Prot,
        flags: MapFlags,
    ) -> Result<u64> {
        let conn = self.conn("register_in_place")?;
        let page = page_size();
        let what = format!("register_in_place({addr:p}+{len:#x} at {offset:#x})");
        if len == 0 || len % page != 0 || addr as usize % page != 0 {
            return Err(ScifError::Einval(format!("{what}: the memory range must be whole {page}-byte pages")));
        }
        check_prot(prot, &what)?;
        if !self.fabric.in_place {
            return Err(ScifError::Eacces(format!(
                "{what}: peers cannot reach this process's memory (Yama ptrace_scope above 1): register memory files"
            )));
        }
        let win =
            Win { len: len as u64, prot, backing: Backing::InPlace { addr: addr as usize, len }, base: 0, file: None };
        Self::add_window(conn, win, (Kind::RegisterInPlace, addr as u64), offset, flags, &what, &[])
    }

    /// Where a new window of `len` bytes goes: at `offset` if fixed (page-aligned, below 2^63,
    /// `EADDRINUSE` over another), else where the table has room.
    fn place_window(mine: &Table, offset: u64, len: u64, flags: MapFlags, what: &str) -> Result<u64> {
        let page = page_size() as u64;
        if !flags.contains(MapFlags::FIXED) {
            return mine.choose(len).ok_or_else(|| ScifError::Enomem(format!("{what}: no room in the window space")));
        }
        if offset % page != 0 || offset.checked_add(len).is_none_or(|e| e > OFFSET_LIMIT) {
            return Err(ScifError::Einval(format!(
                "{what}: a fixed offset must be page-aligned and the window below 2^63"
            )));
        }
        if let Some((s, l)) = mine.overlap(offset, len) {
            return Err(ScifError::Eaddrinuse(format!("{what}: overlaps the window at {s:#x}+{l:#x}")));
        }
        Ok(offset)
    }

    /// `scif_unregister`: removes the windows exactly covering `[offset, offset + len)`.
    /// `EINVAL` for ranges not in whole pages, `ENXIO` if the range does not start and end at
    /// window bounds or has a gap, `ENOTCONN` if not connected. RMAs already posted finish on the
    /// memory (it stays mapped while they run).
    pub fn unregister(&self, offset: u64, len: usize) -> Result<()> {
        let conn = self.conn("unregister")?;
        let page = page_size();
        if len == 0 || len % page != 0 || offset % page as u64 != 0 {
            return Err(ScifError::Einval(format!("unregister({offset:#x}+{len:#x}): not whole {page}-byte pages")));
        }
        let mut w = conn.windows.lock().unwrap();
        if w.mine.remove_exact(offset, len as u64).is_none() {
            return Err(ScifError::Enxio(format!(
                "unregister({offset:#x}+{len:#x}): the range is not whole registered windows ({})",
                w.mine.summary()
            )));
        }
        match conn.send_after(w, &Record::new(Kind::Unregister, offset, len as u64, 0, 0), &[]) {
            Ok(()) | Err(ScifError::Econnreset(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `scif_readfrom`: copies `len` bytes of the peer's windows at `remote` into this endpoint's
    /// windows at `local` (both ranges may span adjacent windows).
    pub fn readfrom(&self, local: u64, len: usize, remote: u64, flags: RmaFlags) -> Result<()> {
        self.rma("readfrom", Target::Window(local), len, remote, flags, true)
    }

    /// `scif_writeto`: copies `len` bytes of this endpoint's windows at `local` into the peer's
    /// windows at `remote`.
    pub fn writeto(&self, local: u64, len: usize, remote: u64, flags: RmaFlags) -> Result<()> {
        self.rma("writeto", Target::Window(local), len, remote, flags, false)
    }

    /// `scif_vreadfrom`: copies the peer's windows at `remote` into `buf`, ordinary memory. The
    /// buffer is borrowed, so the call returns once the copy completed (as with `RMA_SYNC`).
    pub fn vreadfrom(&self, buf: &mut [u8], remote: u64, flags: RmaFlags) -> Result<()> {
        let span = Span::here(buf.as_mut_ptr(), buf.len());
        self.rma("vreadfrom", Target::Buffer(span), buf.len(), remote, flags | RmaFlags::SYNC, true)
    }

    /// `scif_vwriteto`: copies `buf`, ordinary memory, into the peer's windows at `remote`;
    /// returns once the copy completed (as with `RMA_SYNC`).
    pub fn vwriteto(&self, buf: &[u8], remote: u64, flags: RmaFlags) -> Result<()> {
        let span = Span::here(buf.as_ptr().cast_mut(), buf.len());
        self.rma("vwriteto", Target::Buffer(span), buf.len(), remote, flags | RmaFlags::SYNC, false)
    }

    /// One RMA. Errors: `EINVAL` for a zero length, `ENXIO` for a range outside the windows,
    /// `EACCES` for a window whose protection forbids the access, `ENOTCONN`, `ECONNRESET`.
    /// Without `RMA_SYNC` it returns once posted; with `RMA_USECPU` the caller copies.
    fn rma(&self, call: &str, local: Target, len: usize, remote: u64, flags: RmaFlags, read: bool) -> Result<()> {
        let conn = self.conn(call)?;
        if len == 0 {
            return Err(ScifError::Einval(format!("{call}: a zero length")));
        }
        conn.check()?;
        let (local_need, remote_need) = if read { (Prot::WRITE, Prot::READ) } else { (Prot::READ, Prot::WRITE) };
        let borrowed = matches!(local, Target::Buffer(_));
        let (local_spans, mut keep) = match local {
            Target::Window(off) => {
                let w = conn.windows.lock().unwrap();
                let segs = w.mine.resolve(off, len, local_need, &format!("{call}'s local range"))?;
                (Span::of(&segs), segs)
            }
            Target::Buffer(span) => (vec![span], Vec::new()),
        };
        let remote_segs = {
            let w = conn.windows.lock().unwrap();
            w.peers.resolve(remote, len, remote_need, &format!("{call}'s remote range (windows of {})", conn.who()))?
        };
        let remote_spans = Span::of(&remote_segs);
        keep.extend(remote_segs);
        let (src, dst) = if read { (remote_spans, local_spans) } else { (local_spans, remote_spans) };
        let (from, to) = if read { (conn.peer.node, conn.local.node) } else { (conn.local.node, conn.peer.node) };
        let by_cpu = flags.contains(RmaFlags::USECPU);
        let transfer = Transfer { from, to, bytes: len, by_cpu };
        let posted = std::time::Instant::now();
        let engine = &self.fabric.engine;
        if by_cpu && flags.contains(RmaFlags::ORDERED) {
            engine.kick();
            conn.wait(conn.issued(), true)?;
        }
        let seq = conn.issue();
        if by_cpu {
            let copied = copy_spans(&src, &dst);
            drop(keep);
            if let Err(why) = copied {
                conn.fault(seq, why);
            }
            engine.copied_by_cpu(conn, seq, transfer, posted);
        } else {
            let ordered = flags.contains(RmaFlags::ORDERED);
            // A caller's buffer stays borrowed until the engine let go of it, whatever happens
            // to the connection meanwhile.
            let released = borrowed.then(|| Arc::new(Released::default()));
            let job =
                Copy { conn: conn.clone(), seq, src, dst, keep, ordered, transfer, posted, released: released.clone() };
            let job = if flags.contains(RmaFlags::SYNC) { engine.run_if_idle(job) } else { Some(job) };
            if let Some(job) = job {
                engine.post(job);
                if let Some(r) = released {
                    engine.kick();
                    r.wait();
                }
            }
        }
        if flags.contains(RmaFlags::SYNC) {
            engine.kick();
            conn.wait(seq, false)?;
        }
        Ok(())
    }

    /// `scif_fence_mark`: a mark for the RMAs initiated so far by this endpoint
    /// ([`FenceFlags::INIT_SELF`]) or by its peer ([`FenceFlags::INIT_PEER`]): exactly one of the
    /// two, else `EINVAL`.
    pub fn fence_mark(&self, flags: FenceFlags) -> Result<Mark> {
        let conn = self.conn("fence_mark")?;
        let peer = init_side(flags, "fence_mark")?;
        if flags.intersects(FenceFlags::SIGNAL_LOCAL | FenceFlags::SIGNAL_REMOTE) {
            return Err(ScifError::Einval("fence_mark: SIGNAL flags belong to fence_signal".into()));
        }
        let seq = if peer {
            conn.check()?;
            conn.peer_counters().0
        } else {
            self.fabric.engine.kick();
            conn.issued()
        };
        Ok(Mark { conn: conn.id, peer, seq })
    }

    /// `scif_fence_wait`: waits until the RMAs of `mark` completed. `EINVAL` for a mark of
    /// another endpoint; `ECONNRESET` naming the peer if it is lost first or an RMA failed.
    pub fn fence_wait(&self, mark: Mark) -> Result<()> {
        let conn = self.conn("fence_wait")?;
        if mark.conn != conn.id {
            return Err(ScifError::Einval("fence_wait: the mark belongs to another endpoint".into()));
        }
        if mark.peer {
            conn.wait_peer(mark.seq)
        } else {
            self.fabric.engine.kick();
            conn.wait(mark.seq, true)
        }
    }

    /// `scif_fence_signal`: once the RMAs initiated so far (by this endpoint with `INIT_SELF`, by
    /// the peer with `INIT_PEER`) completed, writes `local_value` at `local` in this endpoint's
    /// windows (`SIGNAL_LOCAL`) and `remote_value` at `remote` in the peer's (`SIGNAL_REMOTE`),
    /// each as one u64 with Release. Returns at once. `EINVAL` for flags that are not one INIT
    /// and at least one SIGNAL, or an offset not 8-byte aligned; `ENXIO`/`EACCES` as for RMAs.
    pub fn fence_signal(
        &self,
        local: u64,
        local_value: u64,
        remote: u64,
        remote_value: u64,
        flags: FenceFlags,
    ) -> Result<()> {
        let conn = self.conn("fence_signal")?;
        let peer = init_side(flags, "fence_signal")?;
        let (sl, sr) = (flags.contains(FenceFlags::SIGNAL_LOCAL), flags.contains(FenceFlags::SIGNAL_REMOTE));
        if !sl && !sr {
            return Err(ScifError::Einval("fence_signal: neither SIGNAL_LOCAL nor SIGNAL_REMOTE".into()));
        }
        if (sl && local % 8 != 0) || (sr && remote % 8 != 0) {
            return Err(ScifError::Einval(format!(
                "fence_signal: offsets must be 8-byte aligned (local {local:#x}, remote {remote:#x})"
            )));
        }
        conn.check()?;
        let mut writes: Vec<(Seg, u64)> = Vec::new();
        {
            let w = conn.windows.lock().unwrap();
            let mapped = |segs: Vec<Seg>, what: &str| match segs.into_iter().next() {
                Some(seg) if matches!(seg.place(), crate::dma::Place::Here(_)) => Ok(seg),
                _ => Err(ScifError::Einval(format!(
                    "{what}: the window is ordinary memory registered in place; a signal needs a memory file's window"
                ))),
            };
            if sl {
                let what = "fence_signal's local offset";
                writes.push((mapped(w.mine.resolve(local, 8, Prot::WRITE, what)?, what)?, local_value));
            }
            if sr {
                let what = format!("fence_signal's remote offset (windows of {})", conn.who());
                writes.push((mapped(w.peers.resolve(remote, 8, Prot::WRITE, &what)?, &what)?, remote_value));
            }
        }
        let after = if peer { After::Peers(conn.peer_counters().0) } else { After::Mine(conn.issued()) };
        self.fabric.engine.signal(Signal { conn: conn.clone(), after, writes });
        Ok(())
    }

    /// `scif_mmap`: maps `len` bytes of the peer's window at `offset` here, within `prot`.
    /// `EINVAL` for ranges not in whole pages, `ENXIO` if one window does not hold the range,
    /// `EACCES` for a protection the window lacks.
    pub fn mmap(&self, offset: u64, len: usize, prot: Prot) -> Result<PeerMap> {
        let conn = self.conn("mmap")?;
        let page = page_size();
        if len == 0 || len % page != 0 || offset % page as u64 != 0 || prot == Prot::NONE {
            return Err(ScifError::Einval(format!(
                "mmap({offset:#x}+{len:#x}): not whole {page}-byte pages, or no protection"
            )));
        }
        conn.check()?;
        let w = conn.windows.lock().unwrap();
        let Some((start, win)) = w.peers.containing(offset, len as u64) else {
            return Err(ScifError::Enxio(format!(
                "mmap({offset:#x}+{len:#x}): no window of {} holds the range ({})",
                conn.who(),
                w.peers.summary()
            )));
        };
        if !win.prot.contains(prot) {
            return Err(ScifError::Eacces(format!(
                "mmap({offset:#x}+{len:#x}, {}): the window at {start:#x} is {}",
                prot.name(),
                win.prot.name()
            )));
        }
        let Some((file, file_off)) = win.file.as_ref() else {
            return Err(ScifError::Einval(format!(
                "mmap({offset:#x}+{len:#x}): the window at {start:#x} is {}'s ordinary memory, registered in place, \
                 which this software provider does not map (only windows of memory files)",
                conn.who()
            )));
        };
        let map = map_peer_file(file.as_fd(), file_off + (offset - start), len, prot.contains(Prot::WRITE))
            .map_err(|e| ScifError::os(format_args!("mmap({offset:#x}+{len:#x})"), e))?;
        Ok(PeerMap { map, prot })
    }

    /// Sends a window record with any values and file, as a faulty or hostile peer would: for
    /// tests of the receiver's checks.
    #[doc(hidden)]
    pub fn forge_window(
        &self,
        offset: u64,
        len: u64,
        prot: u64,
        file_offset: u64,
        file: Option<BorrowedFd<'_>>,
    ) -> Result<()> {
        let conn = self.conn("forge_window")?;
        let files: Vec<BorrowedFd<'_>> = file.into_iter().collect();
        conn.send(&Record::new(Kind::Register, offset, len, prot, file_offset), &files)
    }

    /// Sends a record of a window registered in place with any values, as a faulty or hostile
    /// peer would: for tests of the receiver's checks.
    #[doc(hidden)]
    pub fn forge_window_in_place(&self, offset: u64, len: u64, prot: u64, addr: u64) -> Result<()> {
        let conn = self.conn("forge_window_in_place")?;
        conn.send(&Record::new(Kind::RegisterInPlace, offset, len, prot, addr), &[])
    }

    /// The memory file behind `mem`, for [`Endpoint::forge_window`].
    #[doc(hidden)]
    pub fn forge_file(mem: &Memory) -> BorrowedFd<'_> {
        mem.file()
    }
}

/// Whether a fence is about the peer's RMAs: exactly one of `INIT_SELF` and `INIT_PEER`.
fn init_side(flags: FenceFlags, call: &str) -> Result<bool> {
    match (flags.contains(FenceFlags::INIT_SELF), flags.contains(FenceFlags::INIT_PEER)) {
        (true, false) => Ok(false),
        (false, true) => Ok(true),
        _ => Err(ScifError::Einval(format!("{call}: exactly one of INIT_SELF and INIT_PEER"))),
    }
}

enum Target {
    Window(u64),
    Buffer(Span),
}

/// Copies between span lists of equal totals, in the caller; says why not.
fn copy_spans(src: &[Span], dst: &[Span]) -> std::result::Result<(), String> {
    let (mut i, mut j, mut si, mut dj) = (0, 0, 0, 0);
    while i < src.len() && j < dst.len() {
        let n = (src[i].len - si).min(dst[j].len - dj);
        // SAFETY: both pieces lie inside their spans, which the caller keeps mapped (window
        // segments it holds, or a buffer it borrows) for the call.
        unsafe { copy_piece(src[i].at.offset(si), dst[j].at.offset(dj), n)? };
        si += n;
        dj += n;
        if si == src[i].len {
            (i, si) = (i + 1, 0);
        }
        if dj == dst[j].len {
            (j, dj) = (j + 1, 0);
        }
    }
    Ok(())
}

/// Waits until `fd` is readable, at most `timeout` (`None`: for ever); whether it is.
fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<bool> {
    let ts = timeout.map(|t| rustix::event::Timespec { tv_sec: t.as_secs() as _, tv_nsec: t.subsec_nanos() as _ });
    loop {
        let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Err(Errno::INTR) => continue,
            Err(e) => return Err(ScifError::os("poll", e)),
            Ok(n) => return Ok(n > 0),
        }
    }
}

impl AsFd for Endpoint {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for Endpoint {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let State::Connected(_, conn) = &self.state {
            conn.close_local();
            let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Both);
        }
    }
}

/// One endpoint for [`poll`]: what to wait for, and what is ready.
#[derive(Debug)]
pub struct PollEp<'a> {
    /// The endpoint.
    pub ep: &'a Endpoint,
    /// What to wait for: [`PollEvents::IN`], [`PollEvents::OUT`].
    pub events: PollEvents,
    /// What is ready: `IN`, `OUT`, and always reported `ERR` and `HUP` (the peer is gone, or
    /// the endpoint is not connected).
    pub revents: PollEvents,
}

impl<'a> PollEp<'a> {
    /// Waits on `ep` for `events`.
    pub fn new(ep: &'a Endpoint, events: PollEvents) -> PollEp<'a> {
        PollEp { ep, events, revents: PollEvents::NONE }
    }
}

/// `scif_poll`: waits until one of `eps` is ready or `timeout` passed (`None`: for ever);
/// returns how many are ready, each with its `revents`. `IN` on a listening endpoint means a
/// connection to accept; on a connected one, bytes to receive (the provider's own records go
/// on another socket and never wake a poller).
pub fn poll(eps: &mut [PollEp<'_>], timeout: Option<Duration>) -> Result<usize> {
    let ts = timeout.map(|t| rustix::event::Timespec { tv_sec: t.as_secs() as _, tv_nsec: t.subsec_nanos() as _ });
    let mut fds: Vec<PollFd<'_>> = eps
        .iter()
        .map(|p| {
            let mut f = PollFlags::empty();
            if p.events.contains(PollEvents::IN) {
                f |= PollFlags::IN;
            }
            if p.events.contains(PollEvents::OUT) {
                f |= PollFlags::OUT;
            }
            PollFd::from_borrowed_fd(p.ep.sock.as_fd(), f)
        })
        .collect();
    let n = loop {
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Err(Errno::INTR) => continue,
            Err(e) => return Err(ScifError::os("poll", e)),
            Ok(n) => break n,
        }
    };
    for (p, f) in eps.iter_mut().zip(&fds) {
        let r = f.revents();
        let mut out = PollEvents::NONE;
        if r.intersects(PollFlags::IN | PollFlags::PRI) {
            out = out | PollEvents::IN;
        }
        if r.contains(PollFlags::OUT) {
            out = out | PollEvents::OUT;
        }
        if r.contains(PollFlags::ERR) {
            out = out | PollEvents::ERR;
        }
        if r.intersects(PollFlags::HUP | PollFlags::RDHUP) {
            out = out | PollEvents::HUP;
        }
        p.revents = out;
    }
    Ok(n)
}

impl PeerMap {
    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: a mapping holds at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The protection it was mapped with.
    pub fn prot(&self) -> Prot {
        self.prot
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`. Panics outside the mapping.
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        assert!(offset.checked_add(buf.len()).is_some_and(|e| e <= self.len()), "read outside the mapping");
        // SAFETY: inside the mapping (checked), which lives while `self` does.
        unsafe { std::ptr::copy(self.as_ptr().add(offset), buf.as_mut_ptr(), buf.len()) }
    }

    /// Copies `buf` to `offset`: `EACCES` if mapped without `WRITE`. Panics outside the mapping.
    pub fn write(&self, offset: usize, buf: &[u8]) -> Result<()> {
        if !self.prot.contains(Prot::WRITE) {
            return Err(ScifError::Eacces(format!("write at {offset:#x}: the mapping is {}", self.prot.name())));
        }
        assert!(offset.checked_add(buf.len()).is_some_and(|e| e <= self.len()), "write outside the mapping");
        // SAFETY: inside a writable mapping (checked), which lives while `self` does.
        unsafe { std::ptr::copy(buf.as_ptr(), self.as_ptr().add(offset), buf.len()) };
        Ok(())
    }

    /// Reads the u64 at `offset` (8-byte aligned) with Acquire: pairs with a signal's Release.
    pub fn load_u64(&self, offset: usize) -> u64 {
        assert!(offset % 8 == 0 && offset + 8 <= self.len(), "u64 at {offset:#x} misaligned or outside");
        // SAFETY: 8 aligned bytes inside the mapping (checked), alive while `self` is.
        let w = unsafe { &*self.as_ptr().add(offset).cast::<AtomicU64>() };
        w.load(Ordering::Acquire)
    }
}

/// `EINVAL` for a window without protection.
fn check_prot(prot: Prot, what: &str) -> Result<()> {
    if prot == Prot::NONE {
        return Err(ScifError::Einval(format!("{what}: no protection (READ, WRITE or both)")));
    }
    Ok(())
}
