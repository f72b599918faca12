//! The PMI server behind `polyrail run`: serves the ranks of one job over one socket each.
//!
//! The launcher creates a `socketpair` per rank, gives one end to the child as `PMI_FD` and the
//! other to [`PmiServer::start`]; connection `r` is rank `r`. The server detects per message
//! whether a client speaks PMI-1 or PMI-2 (MPICH's PMI-2 client opens with a PMI-1 `init` line),
//! answers in the same framing, keeps the job's key-value space and releases a barrier (PMI-1
//! `barrier_in`, PMI-2 `kvs-fence`) once every rank has entered it. It runs on its own thread
//! with `poll(2)` and non-blocking sockets, and reports to the launcher through
//! [`ServerEvent`]s. A barrier that can no longer complete (a rank was lost, aborted or
//! finalized) is answered with an error naming that rank, so that the others notice.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::wire::{check_token, eprint_line, preview, take_frame, Msg, Wire};
use polyrail_core::{Error, Rank, Result};

/// `kvsname_max` announced to PMI-1 clients.
pub const KVSNAME_MAX: usize = 256;
/// `keylen_max` announced to PMI-1 clients (as Hydra does; counts a terminating NUL).
pub const KEYLEN_MAX: usize = 64;
/// `vallen_max` announced to PMI-1 clients (as Hydra does; counts a terminating NUL).
pub const VALLEN_MAX: usize = 1024;
/// Answer bytes a rank may leave unread before the server drops it. A client that follows
/// the protocol has one request in flight, so its unread answers are one value or one
/// failure message at most; only one that sends without reading gets near this.
const MAX_QUEUED_ANSWERS: usize = 16 << 20;

/// What the server tells the launcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// The rank opened its PMI session (`init`).
    Initialized(Rank),
    /// The rank ended its PMI session normally (`finalize`).
    Finalized(Rank),
    /// The rank asked to abort the job.
    Aborted {
        /// Who asked.
        rank: Rank,
        /// The exit code it asked for (1 if it gave none).
        code: i32,
        /// Its message (may be empty).
        message: String,
    },
    /// The rank's connection closed before `finalize`, or was closed because it sent garbage.
    Lost {
        /// The rank.
        rank: Rank,
        /// What happened, as a phrase (`closed its PMI connection without finalize`).
        why: String,
    },
    /// A line for the user (a malformed or unsupported message, a failure of the server):
    /// the launcher prints it with its own messages, so that the server thread never blocks
    /// on the launcher's stderr.
    Notice(String),
}

/// A running PMI server for one job; stops when dropped.
#[derive(Debug)]
pub struct PmiServer {
    job: String,
    events: mpsc::Receiver<ServerEvent>,
    /// Holds a byte per event sent (at most a socket buffer's worth): readable while events
    /// may wait, so that a launcher can poll it beside its other file descriptors.
    notices: UnixStream,
    wake: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl PmiServer {
    /// Serves job `job` (the PMI-1 kvsname and PMI-2 jobid) to `conns.len()` ranks;
    /// `conns[r]` is the server's end of rank `r`'s socket.
    pub fn start(job: &str, conns: Vec<UnixStream>) -> Result<PmiServer> {
        check_token("the PMI job name", job, KVSNAME_MAX - 1)?;
        if conns.is_empty() {
            return Err(Error::Bootstrap("a PMI server needs at least one rank".into()));
        }
        for c in &conns {
            c.set_nonblocking(true).map_err(|e| Error::io("making a PMI socket non-blocking", e))?;
        }
        let (wake, wake_rx) =
            UnixStream::pair().map_err(|e| Error::io("creating the PMI server's wake-up socket", e))?;
        let (tx, events) = mpsc::channel();
        let (notify, notices) =
            UnixStream::pair().map_err(|e| Error::io("creating the PMI server's event notice socket", e))?;
        for s in [&notify, &notices] {
            s.set_nonblocking(true).map_err(|e| Error::io("making the PMI event notice socket non-blocking", e))?;
        }
        let mut state = State::new(job, conns, tx, notify);
        let thread = std::thread::Builder::new()
            .name("polyrail-pmi".into())
            .spawn(move || state.run(&wake_rx))
            .map_err(|e| Error::io("starting the PMI server thread", e))?;
        Ok(PmiServer { job: job.to_owned(), events, notices, wake: Some(wake), thread: Some(thread) })
    }

    /// The job's name, as clients see it.
    pub fn job_id(&self) -> &str {
        &self.job
    }

    /// The next event if one is waiting.
    pub fn try_event(&self) -> Option<ServerEvent> {
        // Notices first, then the queue: an event sent after this drain leaves a notice for
        // the next poll of `event_fd`, so none is waited for while it sits in the queue.
        let mut sink = [0u8; 256];
        while matches!((&self.notices).read(&mut sink), Ok(n) if n > 0) {}
        self.events.try_recv().ok()
    }

    /// A descriptor that polls readable (`POLLIN`) when an event may be waiting: poll it with
    /// others, then take the events with [`try_event`](Self::try_event) until `None` (which
    /// also clears it).
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.notices.as_fd()
    }

    /// Waits up to `timeout` for the next event.
    pub fn next_event(&self, timeout: Duration) -> Option<ServerEvent> {
        self.events.recv_timeout(timeout).ok()
    }

    /// Stops serving and closes every connection.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        // Closing the wake-up socket makes it readable (EOF) in the server's poll set.
        drop(self.wake.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                eprint_line("polyrail PMI server: the server thread panicked");
            }
        }
    }
}

impl Drop for PmiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A barrier or fence answer waiting for the last rank: its framing and its message.
type Pending = (Wire, Msg);

/// One rank's connection.
struct Peer {
    stream: Option<UnixStream>,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    initialized: bool,
    finalized: bool,
    aborted: bool,
    fence: Option<Pending>,
    /// Its puts since its last fence: published to every rank when that fence completes, as
    /// Hydra's proxy does (a get before the fence finds nothing, here as under Hydra). A key
    /// two ranks put before one fence keeps the higher rank's value.
    puts: HashMap<String, String>,
    /// Bytes of keys and values, and keys, this rank holds in the key-value space (published
    /// and pending), against [`rank_kvs_limit`].
    used: (usize, usize),
    /// Unsupported commands it sent, of which the first [`NOTICES_PER_RANK`] are reported (a
    /// rank sending them in a loop must not fill the launcher's queue).
    unsupported: u32,
}

/// Unsupported commands reported per rank.
const NOTICES_PER_RANK: u32 = 8;

/// The key-value space one rank may fill in a job of `n`: bytes of keys and values, and keys.
/// polyrail's own puts take about 8 bytes per rank of the job (its ib address) and a few
/// hundred more: this is twice that, with room for a program's own keys. A put beyond it fails
/// (`rc=-1`, naming the limit) and the launcher's memory stays bounded.
pub fn rank_kvs_limit(n: usize) -> (usize, usize) {
    ((256 << 10) + 16 * n, 256 + n / 32)
}

/// The bytes of keys and values a whole job of `n` may hold, all ranks together.
pub fn job_kvs_limit(n: usize) -> usize {
    (64usize << 20).saturating_add(n.saturating_mul(n).saturating_mul(16))
}

/// The server thread's state.
pub(crate) struct State {
    job: String,
    peers: Vec<Peer>,
    /// Published keys: value and the rank that put it (`None`: the server's own).
    kvs: HashMap<String, (String, Option<usize>)>,
    /// Bytes of keys and values held, all ranks together, against [`job_kvs_limit`].
    held: usize,
    waiting: usize,
    /// Why no barrier can complete any more (a rank left).
    blocker: Option<String>,
    events: mpsc::Sender<ServerEvent>,
    /// Written a byte per event (see `PmiServer::notices`).
    notify: UnixStream,
}

impl State {
    fn new(job: &str, conns: Vec<UnixStream>, events: mpsc::Sender<ServerEvent>, notify: UnixStream) -> State {
        let n = conns.len();
        let peers = conns
            .into_iter()
            .map(|s| Peer {
                stream: Some(s),
                inbuf: Vec::new(),
                outbuf: Vec::new(),
                initialized: false,
                finalized: false,
                aborted: false,
                fence: None,
                puts: HashMap::new(),
                used: (0, 0),
                unsupported: 0,
            })
            .collect();
        let mut kvs = HashMap::new();
        // What MPICH programs ask for: every rank on one node.
        kvs.insert("PMI_process_mapping".to_owned(), (format!("(vector,(0,1,{n}))"), None));
        State { job: job.to_owned(), peers, kvs, held: 0, waiting: 0, blocker: None, events, notify }
    }

    fn size(&self) -> usize {
        self.peers.len()
    }

    /// Tells the user something, through the launcher ([`ServerEvent::Notice`]).
    fn say(&self, msg: &str) {
        self.emit(ServerEvent::Notice(format!("polyrail PMI server: {msg}")));
    }

    fn emit(&self, ev: ServerEvent) {
        // The launcher may have stopped listening; nothing to do then.
        let _ = self.events.send(ev);
        // A full notice buffer already makes the descriptor readable: dropping this byte loses
        // nothing.
        let _ = (&self.notify).write(&[1]);
    }

    fn run(&mut self, wake: &UnixStream) {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            self.flush_all();
            let mut fds = vec![libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
            let mut who = Vec::new();
            for (i, p) in self.peers.iter().enumerate() {
                if let Some(s) = &p.stream {
                    let out = if p.outbuf.is_empty() { 0 } else { libc::POLLOUT };
                    fds.push(libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN | out, revents: 0 });
                    who.push(i);
                }
            }
            // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                self.say(&format!("poll failed ({e}); the PMI server stops"));
                return;
            }
            if fds[0].revents != 0 {
                return;
            }
            for (pfd, &i) in fds[1..].iter().zip(&who) {
                if pfd.revents & libc::POLLOUT != 0 {
                    self.flush(i);
                }
                if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    self.read_from(i, &mut buf);
                }
            }
        }
    }

    /// Reads what rank `i` sent and serves every complete message.
    fn read_from(&mut self, i: usize, buf: &mut [u8]) {
        let Some(stream) = self.peers[i].stream.as_mut() else { return };
        let eof = match stream.read(buf) {
            Ok(0) => true,
            Ok(n) => {
                self.peers[i].inbuf.extend_from_slice(&buf[..n]);
                false
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => false,
            Err(e) => {
                self.lose(i, format!("broke its PMI connection ({e})"));
                return;
            }
        };
        self.serve_buffered(i);
        if eof && self.peers[i].stream.is_some() {
            let why = if self.peers[i].inbuf.is_empty() {
                "closed its PMI connection without finalize".to_owned()
            } else {
                format!("closed its PMI connection in the middle of a message {}", preview(&self.peers[i].inbuf))
            };
            self.lose(i, why);
        }
    }

    fn serve_buffered(&mut self, i: usize) {
        while self.peers[i].stream.is_some() {
            match take_frame(&mut self.peers[i].inbuf) {
                Ok(Some((wire, msg))) => self.handle(i, wire, &msg),
                Ok(None) => return,
                Err(e) => {
                    self.say(&format!("rank {i} sent a malformed PMI message ({e}); closing its PMI connection"));
                    self.lose(i, format!("sent a malformed PMI message ({e})"));
                    return;
                }
            }
        }
    }

    /// Serves one request from rank `i`.
    fn handle(&mut self, i: usize, wire: Wire, req: &Msg) {
        let reply = match (wire, req.cmd.as_str()) {
            (_, "init") => self.init(i, req),
            (_, "finalize") => self.finalize(i, wire),
            (_, "abort") => return self.abort(i, req),
            (Wire::V1, "barrier_in") | (Wire::V2, "kvs-fence") => return self.fence(i, wire, req),
            (Wire::V1, "get_maxes") => Msg::new("maxes")
                .with("kvsname_max", KVSNAME_MAX)
                .with("keylen_max", KEYLEN_MAX)
                .with("vallen_max", VALLEN_MAX)
                .with("rc", 0),
            (Wire::V1, "get_my_kvsname") => Msg::new("my_kvsname").with("kvsname", &self.job).with("rc", 0),
            (Wire::V1, "get_universe_size") => Msg::new("universe_size").with("size", self.size()).with("rc", 0),
            (Wire::V1, "get_appnum") => Msg::new("appnum").with("appnum", 0).with("rc", 0),
            (Wire::V1, "put") => self.put(i, wire, req, "put_result"),
            (Wire::V1, "get") => self.get_v1(req),
            (Wire::V2, "fullinit") => self.fullinit(i, req),
            (Wire::V2, "job-getid") => Msg::new("job-getid-response").with("jobid", &self.job).with("rc", 0),
            (Wire::V2, "kvs-put") => self.put(i, wire, req, "kvs-put-response"),
            (Wire::V2, "kvs-get") => self.get_v2(req, "kvs-get-response"),
            (Wire::V2, "info-getjobattr") => self.get_v2(req, "info-getjobattr-response"),
            (_, other) => {
                let shown = preview(other.as_bytes());
                self.peers[i].unsupported += 1;
                match self.peers[i].unsupported {
                    n if n < NOTICES_PER_RANK => {
                        self.say(&format!("rank {i} sent the unsupported PMI command {shown}; answering with an error"))
                    }
                    NOTICES_PER_RANK => self.say(&format!(
                        "rank {i} sent the unsupported PMI command {shown}; answering with an error (and to its \
                         further unsupported commands, not reported)"
                    )),
                    _ => {}
                }
                let name = if wire == Wire::V1 { format!("{other}_result") } else { format!("{other}-response") };
                failure(wire, Msg::new(name), &format!("unsupported PMI command `{other}`"))
            }
        };
        self.answer(i, wire, req, reply);
    }

    /// Queues `reply` to rank `i`, echoing a PMI-2 `thrid`.
    fn answer(&mut self, i: usize, wire: Wire, req: &Msg, mut reply: Msg) {
        if let (Wire::V2, Some(t)) = (wire, req.get("thrid")) {
            reply = reply.with("thrid", t);
        }
        self.send(i, wire, &reply, "answer");
    }

    /// Encodes `reply` (`what`: the kind of answer, for the error) and queues it to rank `i`;
    /// one that cannot be encoded loses the rank, which would wait for it for ever.
    fn send(&mut self, i: usize, wire: Wire, reply: &Msg, what: &str) {
        match reply.encode(wire) {
            Ok(bytes) => self.queue(i, &bytes),
            Err(e) => self.lose(i, format!("cannot be sent its {what}: {e}")),
        }
    }

    /// Queues encoded answer bytes to rank `i`; a rank that lets more than
    /// [`MAX_QUEUED_ANSWERS`] bytes pile up (it sends requests without reading the answers) is
    /// dropped rather than let the launcher's memory grow without bound.
    fn queue(&mut self, i: usize, bytes: &[u8]) {
        let out = &mut self.peers[i].outbuf;
        out.extend_from_slice(bytes);
        if out.len() > MAX_QUEUED_ANSWERS {
            let n = out.len();
            self.lose(i, format!("does not read its answers ({n} bytes queued)"));
        }
    }

    fn init(&mut self, i: usize, req: &Msg) -> Msg {
        let version = (req.get("pmi_version").unwrap_or(""), req.get("pmi_subversion").unwrap_or(""));
        let ok = match version {
            ("1", "0" | "1") => Some(("1", "1")),
            ("2", "0") => Some(("2", "0")),
            _ => None,
        };
        let Some((v, sv)) = ok else {
            let m = Msg::new("response_to_init").with("pmi_version", 1).with("pmi_subversion", 1);
            return failure(
                Wire::V1,
                m,
                &format!("PMI version {}.{} is not served (1.1 and 2.0 are)", version.0, version.1),
            );
        };
        self.mark_initialized(i);
        Msg::new("response_to_init").with("pmi_version", v).with("pmi_subversion", sv).with("rc", 0)
    }

    fn mark_initialized(&mut self, i: usize) {
        if !self.peers[i].initialized {
            self.peers[i].initialized = true;
            self.emit(ServerEvent::Initialized(i as Rank));
        }
    }

    fn fullinit(&mut self, i: usize, req: &Msg) -> Msg {
        let resp = Msg::new("fullinit-response");
        if let Some(r) = req.get("pmirank") {
            if r.trim().parse::<usize>().ok() != Some(i) {
                return failure(Wire::V2, resp, &format!("pmirank={r} was given to the connection of rank {i}"));
            }
        }
        self.mark_initialized(i);
        resp.with("pmi-version", 2)
            .with("pmi-subversion", 0)
            .with("rank", i)
            .with("size", self.size())
            .with("appnum", 0)
            .with("debugged", "FALSE")
            .with("pmiverbose", "FALSE")
            .with("rc", 0)
    }

    fn put(&mut self, i: usize, wire: Wire, req: &Msg, answer: &str) -> Msg {
        let resp = Msg::new(answer);
        if let Some(k) = req.get("kvsname") {
            if k != self.job {
                return failure(wire, resp, &format!("kvsname {k} is not this job's ({})", self.job));
            }
        }
        let (Some(key), Some(value)) = (req.get("key"), req.get("value")) else {
            return failure(wire, resp, "put needs both `key` and `value`");
        };
        // PMI-1 clients keep one byte for a NUL, PMI-2 clients do not: accept the larger.
        if key.is_empty() || key.len() > KEYLEN_MAX || value.is_empty() || value.len() > VALLEN_MAX {
            let limits = format!("keys of 1 to {KEYLEN_MAX} bytes, values of 1 to {VALLEN_MAX} bytes");
            return failure(wire, resp, &format!("key {key:?} or its value is empty or too long ({limits})"));
        }
        if key.starts_with("PMI_") {
            return failure(wire, resp, &format!("key {key} is reserved: keys starting with PMI_ are the server's"));
        }
        // A key put again before the fence replaces its pending value.
        let size = key.len() + value.len();
        let (old, new_key) = match self.peers[i].puts.get(key) {
            Some(v) => (key.len() + v.len(), 0),
            None => (0, 1),
        };
        let (bytes, keys) = self.peers[i].used;
        let (max_bytes, max_keys) = rank_kvs_limit(self.size());
        let job_max = job_kvs_limit(self.size());
        if bytes - old + size > max_bytes || keys + new_key > max_keys || self.held - old + size > job_max {
            let why = format!(
                "put of key {key} refused: the key-value space is full (a rank may hold {max_keys} keys and \
                 {max_bytes} bytes of keys and values in this job of {}, the job {job_max} bytes; rank {i} holds \
                 {keys} keys and {bytes} bytes, the job {} bytes)",
                self.size(),
                self.held
            );
            return failure(wire, resp, &why);
        }
        self.peers[i].used = (bytes - old + size, keys + new_key);
        self.held = self.held - old + size;
        self.peers[i].puts.insert(key.to_owned(), value.to_owned());
        match wire {
            Wire::V1 => resp.with("rc", 0).with("msg", "success"),
            Wire::V2 => resp.with("rc", 0),
        }
    }

    fn get_v1(&self, req: &Msg) -> Msg {
        let resp = Msg::new("get_result");
        if let Some(k) = req.get("kvsname") {
            if k != self.job {
                return failure(Wire::V1, resp, &format!("kvsname {k} is not this job's ({})", self.job));
            }
        }
        let Some(key) = req.get("key") else { return failure(Wire::V1, resp, "get needs a `key`") };
        match self.kvs.get(key) {
            Some((v, _)) => resp.with("rc", 0).with("msg", "success").with("value", v),
            None => failure(Wire::V1, resp, &format!("key {key} not found")),
        }
    }

    fn get_v2(&self, req: &Msg, answer: &str) -> Msg {
        let resp = Msg::new(answer);
        let Some(key) = req.get("key") else { return failure(Wire::V2, resp, "get needs a `key`") };
        match self.kvs.get(key) {
            Some((v, _)) => resp.with("found", "TRUE").with("value", v).with("rc", 0),
            None => resp.with("found", "FALSE").with("rc", 0),
        }
    }

    fn finalize(&mut self, i: usize, wire: Wire) -> Msg {
        if !self.peers[i].finalized {
            self.peers[i].finalized = true;
            // Reported before the answer goes out, so the launcher knows before the rank exits.
            self.emit(ServerEvent::Finalized(i as Rank));
            self.block_fences(format!("rank {i} has finalized"));
        }
        match wire {
            Wire::V1 => Msg::new("finalize_ack"),
            Wire::V2 => Msg::new("finalize-response").with("rc", 0),
        }
    }

    fn abort(&mut self, i: usize, req: &Msg) {
        let code = req.get("exitcode").and_then(|c| c.trim().parse().ok()).unwrap_or(1);
        let message = req.get("message").or_else(|| req.get("msg")).unwrap_or("").to_owned();
        self.peers[i].aborted = true;
        self.emit(ServerEvent::Aborted { rank: i as Rank, code, message });
        self.lose(i, "aborted the job".into());
    }

    fn fence(&mut self, i: usize, wire: Wire, req: &Msg) {
        let template = match wire {
            Wire::V1 => Msg::new("barrier_out"),
            Wire::V2 => Msg::new("kvs-fence-response"),
        };
        if let Some(why) = &self.blocker {
            let reply = failure(wire, template, &format!("the barrier cannot complete: {why}"));
            return self.answer(i, wire, req, reply);
        }
        if self.peers[i].fence.is_some() {
            let reply = failure(wire, template, "this rank is already in the barrier");
            return self.answer(i, wire, req, reply);
        }
        let mut pending = template;
        if let (Wire::V2, Some(t)) = (wire, req.get("thrid")) {
            pending = pending.with("thrid", t);
        }
        self.peers[i].fence = Some((wire, pending));
        self.waiting += 1;
        if self.waiting == self.size() {
            self.release_fences(None);
        }
    }

    /// Answers every rank waiting in the barrier: success (every rank's puts published first),
    /// or failure with `why`.
    fn release_fences(&mut self, why: Option<&str>) {
        self.waiting = 0;
        if why.is_none() {
            // In rank order: a key two ranks put keeps the higher rank's value, and the space the
            // replaced value took goes back to the rank that put it.
            for i in 0..self.peers.len() {
                let puts: Vec<(String, String)> = self.peers[i].puts.drain().collect();
                for (k, v) in puts {
                    if let Some((old, Some(owner))) = self.kvs.insert(k.clone(), (v, Some(i))) {
                        let freed = k.len() + old.len();
                        let used = &mut self.peers[owner].used;
                        *used = (used.0 - freed, used.1 - 1);
                        self.held -= freed;
                    }
                }
            }
        }
        for i in 0..self.peers.len() {
            let Some((wire, msg)) = self.peers[i].fence.take() else { continue };
            let reply = match why {
                None => msg.with("rc", 0),
                Some(w) => failure(wire, msg, &format!("the barrier cannot complete: {w}")),
            };
            self.send(i, wire, &reply, "barrier answer");
        }
    }

    /// From now on barriers fail with `why`; the ones waiting fail now.
    fn block_fences(&mut self, why: String) {
        if self.blocker.is_none() {
            self.blocker = Some(why.clone());
        }
        if self.waiting > 0 {
            self.release_fences(Some(&why));
        }
    }

    /// Closes rank `i`'s connection; reports it unless it finalized or aborted.
    fn lose(&mut self, i: usize, why: String) {
        let p = &mut self.peers[i];
        if p.stream.take().is_none() {
            return;
        }
        p.outbuf.clear();
        if p.fence.take().is_some() {
            self.waiting -= 1;
        }
        let (finalized, aborted) = (p.finalized, p.aborted);
        if !finalized && !aborted {
            self.emit(ServerEvent::Lost { rank: i as Rank, why: why.clone() });
        }
        if !finalized {
            self.block_fences(format!("rank {i} {why}"));
        }
    }

    fn flush_all(&mut self) {
        for i in 0..self.size() {
            if !self.peers[i].outbuf.is_empty() {
                self.flush(i);
            }
        }
    }

    /// Writes what can be written of rank `i`'s queued answers without blocking.
    fn flush(&mut self, i: usize) {
        let p = &mut self.peers[i];
        let Some(s) = &p.stream else { return };
        while !p.outbuf.is_empty() {
            // SAFETY: the pointer and length describe `p.outbuf`, alive and unaliased for the
            // call; MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
            let n = unsafe {
                libc::send(
                    s.as_raw_fd(),
                    p.outbuf.as_ptr().cast(),
                    p.outbuf.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                p.outbuf.drain(..n as usize);
                continue;
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => return,
                _ => {
                    let why = format!("stopped reading its PMI connection ({e})");
                    return self.lose(i, why);
                }
            }
        }
    }
}

#[cfg(feature = "fuzzing")]
impl State {
    /// The state of a server for `conns.len()` ranks, without its thread: the fuzz targets call
    /// [`State::serve_bytes`] in place of its reads (`crate::fuzzing`). The socket returned is
    /// the other end of its event notices, to keep open as long as the state.
    pub(crate) fn for_fuzzing(
        job: &str,
        conns: Vec<UnixStream>,
        events: mpsc::Sender<ServerEvent>,
    ) -> Result<(State, UnixStream)> {
        let (notify, notices) = UnixStream::pair().map_err(|e| Error::io("creating a socket pair", e))?;
        notify.set_nonblocking(true).map_err(|e| Error::io("making a socket non-blocking", e))?;
        Ok((State::new(job, conns, events, notify), notices))
    }

    /// Rank `i` sent `bytes`: serves every complete message, as the thread does after a read;
    /// `false` once the rank's connection is closed.
    pub(crate) fn serve_bytes(&mut self, i: usize, bytes: &[u8]) -> bool {
        if self.peers[i].stream.is_none() {
            return false;
        }
        self.peers[i].inbuf.extend_from_slice(bytes);
        self.serve_buffered(i);
        self.peers[i].stream.is_some()
    }

    /// The answers queued to rank `i` since the last call, taken (the thread writes them out).
    pub(crate) fn take_answers(&mut self, i: usize) -> Vec<u8> {
        std::mem::take(&mut self.peers[i].outbuf)
    }
}

/// `msg` turned into a failure answer: `rc=-1` and the reason (`msg=` in PMI-1, `errmsg=` in
/// PMI-2).
fn failure(wire: Wire, msg: Msg, why: &str) -> Msg {
    // The text may repeat a client's key: without `;`, which MPICH 4's client would not read
    // back from its doubled form.
    let why = super::wire::sanitize_text(why);
    match wire {
        Wire::V1 => msg.with("rc", -1).with("msg", why),
        Wire::V2 => msg.with("rc", -1).with("errmsg", why),
    }
}
