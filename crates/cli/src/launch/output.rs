//! Output of the ranks of a `polyrail run` job: each rank's stdout and stderr reach the launcher
//! through a pipe and leave it a whole line at a time, so that the lines of ranks writing at once
//! do not mix. (One message of a rank is often several writes: Rust's stderr is unbuffered, and
//! `Error: {e:?}` from `main` is written piece by piece; two ranks failing at once printed
//! `Error: Error: Config { Configvar {...` through inherited descriptors.)
//!
//! A line still without its end after [`PARTIAL_WAIT`] (a prompt, progress dots) goes out as
//! it is, and so does one longer than [`MAX_PENDING`]. With labels, every line starts with
//! `[rank] `, as Hydra's `-prepend-rank` does.
//!
//! The launcher's own stdout and stderr are written by a thread each, or one for both where
//! they are one file (a [`Sink`]), not by the launcher's main loop (unless the thread could
//! not be started): a reader that does not keep up (a full pipe, a stopped pager) blocks
//! that thread only, and the job's timeout, signals and rank exits still act. While
//! [`MAX_QUEUED`] bytes wait for a stream, the ranks' pipes to it are not read, so that a rank
//! writing on blocks in its own write, as it would writing to the reader itself. The launcher's
//! own messages ([`say_line`]) take the same way, after what the ranks wrote before them.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How long the start of a line waits for its end before it is written as it is.
pub const PARTIAL_WAIT: Duration = Duration::from_millis(50);
/// Bytes of one line held back at most; a longer line goes out in pieces.
const MAX_PENDING: usize = 64 << 10;
/// Bytes read from one pipe per [`Output::pump`]: a rank that writes without pause cannot keep
/// the launcher from the other ranks' output and its own events.
const READ_PER_PUMP: usize = 256 << 10;

/// Bytes waiting for one of the launcher's streams above which the ranks' pipes to it are not
/// read (see the module documentation).
const MAX_QUEUED: usize = 1 << 20;
/// How often a launcher whose streams are backed up looks again whether they drained.
const BACKED_UP_POLL: Duration = Duration::from_millis(10);

/// The launcher's own stream a rank's stream goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Stdout,
    Stderr,
}

/// A writer thread with the bytes waiting for it: one per stream of the launcher's own, or one
/// for both when they are one file (see [`Target::sink`]).
struct Sink {
    queue: Mutex<Queue>,
    /// Signalled when bytes are queued (the writer thread waits on it).
    queued: Condvar,
    /// Signalled when bytes were written (or dropped after a failed write).
    written: Condvar,
    /// Whether the writer thread runs (`false`: it could not be started, and bytes are written
    /// where they are queued).
    thread: OnceLock<bool>,
}

/// What waits for a [`Sink`].
struct Queue {
    chunks: VecDeque<(Target, Vec<u8>)>,
    /// Bytes queued or being written.
    bytes: usize,
    /// A write failed (a closed pipe): later bytes are dropped.
    broken: bool,
}

static SINKS: [Sink; 2] = [Sink::new(), Sink::new()];

/// Per sink (as [`SINKS`]), with `--label`: the stream (`rank * 2 + target`) whose unfinished
/// line was the last thing queued there, or `usize::MAX`. Only the launcher's main thread
/// labels and queues (ranks' lines and its own, [`say_line`]), so relaxed accesses suffice.
static OPEN_LINE: [AtomicUsize; 2] = [AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX)];

impl Target {
    fn fd(self) -> libc::c_int {
        match self {
            Target::Stdout => libc::STDOUT_FILENO,
            Target::Stderr => libc::STDERR_FILENO,
        }
    }

    /// Its sink, with the writer thread started on first use. Where stdout and stderr are one
    /// file (a terminal, `>log 2>&1`) they share one, so that lines come out in the order they
    /// were queued: a message of the launcher does not overtake a rank's earlier output.
    fn sink(self) -> &'static Sink {
        let i = self.sink_index();
        let sink = &SINKS[i];
        sink.thread.get_or_init(|| {
            let name = format!("polyrail-run-out{i}");
            std::thread::Builder::new().name(name).spawn(move || sink.write_on()).is_ok()
        });
        sink
    }

    /// Queues `bytes` for this stream; `false` when it is gone.
    fn push(self, bytes: Vec<u8>) -> bool {
        self.sink().push(self, bytes)
    }

    /// The index of its sink in [`SINKS`].
    fn sink_index(self) -> usize {
        static ONE_FILE: OnceLock<bool> = OnceLock::new();
        match self {
            Target::Stderr if !*ONE_FILE.get_or_init(stdout_is_stderr) => 1,
            _ => 0,
        }
    }

    /// Whether so much waits for this stream that the ranks' pipes to it are not read.
    fn backed_up(self) -> bool {
        self.sink().backed_up()
    }
}

/// Whether so much waits for each of the launcher's streams (by [`Target`]) that the ranks'
/// pipes to it are not read: looked at once per pass over the pipes.
fn backed_up() -> [bool; 2] {
    [Target::Stdout.backed_up(), Target::Stderr.backed_up()]
}

/// Whether the launcher's stdout and stderr are the same file.
fn stdout_is_stderr() -> bool {
    // SAFETY: stat is plain data; fstat writes it and only looks at the descriptor.
    unsafe {
        let (mut out, mut err): (libc::stat, libc::stat) = (std::mem::zeroed(), std::mem::zeroed());
        libc::fstat(libc::STDOUT_FILENO, &mut out) == 0
            && libc::fstat(libc::STDERR_FILENO, &mut err) == 0
            && (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)
    }
}

impl Sink {
    const fn new() -> Sink {
        Sink {
            queue: Mutex::new(Queue { chunks: VecDeque::new(), bytes: 0, broken: false }),
            queued: Condvar::new(),
            written: Condvar::new(),
            thread: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while the lock was held leaves a queue that is still consistent.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `bytes` for `to`; `false` when the stream is gone.
    fn push(&self, to: Target, bytes: Vec<u8>) -> bool {
        if self.thread.get() == Some(&false) {
            return write_all(to.fd(), &bytes);
        }
        let mut q = self.lock();
        if q.broken {
            return false;
        }
        q.bytes += bytes.len();
        q.chunks.push_back((to, bytes));
        self.queued.notify_one();
        true
    }

    fn backed_up(&self) -> bool {
        self.lock().bytes >= MAX_QUEUED
    }

    /// Waits until everything queued is written, or until `until`; whether it was.
    fn wait_written(&self, until: Instant) -> bool {
        let mut q = self.lock();
        while q.bytes > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = self.written.wait_timeout(q, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }

    /// The writer thread: runs for the rest of the process.
    fn write_on(&self) {
        loop {
            let (to, chunk) = {
                let mut q = self.lock();
                loop {
                    if let Some(c) = q.chunks.pop_front() {
                        break c;
                    }
                    q = self.queued.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            let ok = write_all(to.fd(), &chunk);
            let mut q = self.lock();
            q.bytes -= chunk.len();
            if !ok {
                q.broken = true;
                q.bytes = 0;
                q.chunks.clear();
            }
            self.written.notify_all();
        }
    }
}

/// Writes all of `bytes` to descriptor `fd` (the launcher's stdout or stderr, shared with
/// nothing that buffers: the launcher writes there only through its sinks), waiting while a
/// non-blocking one is full; whether it could.
fn write_all(fd: libc::c_int, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is readable for its length; a bad descriptor is an error, not UB.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN) => {
                    // Inherited with O_NONBLOCK (which is the file's, not ours to change).
                    let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                    // SAFETY: `p` is one valid pollfd.
                    unsafe { libc::poll(&mut p, 1, -1) };
                }
                _ => return false,
            }
            continue;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// Queues one line of the launcher's own for its stderr, after what the ranks wrote there.
pub fn say_line(line: &str) {
    let mut bytes = Vec::with_capacity(line.len() + 2);
    // A rank's unfinished labelled line, written out after its wait, ends before this one
    // (its continuation is then labelled anew).
    let open = &OPEN_LINE[Target::Stderr.sink_index()];
    if open.swap(usize::MAX, Ordering::Relaxed) != usize::MAX {
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    Target::Stderr.push(bytes);
}

/// Waits until what was queued for the launcher's stdout and stderr is written, or until
/// `give_up` says to stop waiting (asked every [`BACKED_UP_POLL`]).
pub fn flush(give_up: impl Fn() -> bool) {
    for sink in &SINKS {
        while !sink.wait_written(Instant::now() + BACKED_UP_POLL) {
            if give_up() {
                return;
            }
        }
    }
}

/// One rank's stdout or stderr.
struct Stream {
    rank: usize,
    to: Target,
    /// The read end of the pipe (non-blocking).
    fd: OwnedFd,
    /// Bytes read and not written yet: the start of a line.
    pending: Vec<u8>,
    /// When `pending` began to wait for its line's end.
    since: Option<Instant>,
    /// Whether the next byte written starts a line (where a label goes).
    at_line_start: bool,
}

/// The pipes of every rank's output (see the module documentation).
pub struct Output {
    streams: Vec<Stream>,
    label: bool,
}

impl Output {
    /// No streams yet; `label`: prefix every line with `[rank] `.
    pub fn new(label: bool) -> Output {
        Output { streams: Vec::new(), label }
    }

    /// Takes over the piped stdout and stderr of `child`, rank `rank` (a stream that is not
    /// piped is left alone).
    pub fn add(&mut self, rank: usize, child: &mut Child) {
        let out = child.stdout.take().map(|s| (Target::Stdout, OwnedFd::from(s)));
        let err = child.stderr.take().map(|s| (Target::Stderr, OwnedFd::from(s)));
        for (to, fd) in out.into_iter().chain(err) {
            // SAFETY: fcntl on a descriptor we own; setting O_NONBLOCK changes no memory.
            unsafe {
                let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
            self.streams.push(Stream { rank, to, fd, pending: Vec::new(), since: None, at_line_start: true });
        }
    }

    /// Whether a pipe is still open (a process holds its write end, or unread bytes remain).
    pub fn is_open(&self) -> bool {
        !self.streams.is_empty()
    }

    /// Adds a `poll` entry for every open pipe whose stream is not backed up to `fds`.
    pub fn poll_fds(&self, fds: &mut Vec<libc::pollfd>) {
        let backed_up = backed_up();
        fds.extend(self.streams.iter().filter(|s| !backed_up[s.to as usize]).map(|s| libc::pollfd {
            fd: s.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
    }

    /// When the oldest unfinished line is due to go out as it is, or when to look again whether
    /// a backed-up stream drained.
    pub fn deadline(&self) -> Option<Instant> {
        // A backed-up stream's unfinished line waits with the stream (`pump` skips it): its
        // overdue time would make the launcher's poll spin.
        let backed_up = backed_up();
        let mut any_backed_up = false;
        let mut partial: Option<Instant> = None;
        for s in &self.streams {
            if backed_up[s.to as usize] {
                any_backed_up = true;
            } else if let Some(t) = s.since {
                partial = Some(partial.map_or(t, |p| p.min(t)));
            }
        }
        let recheck = any_backed_up.then(|| Instant::now() + BACKED_UP_POLL);
        partial.map(|t| t + PARTIAL_WAIT).into_iter().chain(recheck).min()
    }

    /// Reads what every pipe whose stream is not backed up has, writes the whole lines (and
    /// lines that waited long enough for their end), and closes the pipes at their end. The
    /// pipes of `exited`, ranks that exited, are read also while backed up (they hold what the
    /// ranks wrote last and little more), so that their last lines go out before the launcher
    /// says why they ended.
    pub fn pump(&mut self, exited: &[usize]) {
        let backed_up = backed_up();
        self.pump_where(|s| !backed_up[s.to as usize] || exited.contains(&s.rank));
    }

    /// [`Output::pump`] for the pipes `pick` chooses.
    fn pump_where(&mut self, pick: impl Fn(&Stream) -> bool) {
        let label = self.label;
        self.streams.retain_mut(|s| !pick(s) || s.pump(label));
    }

    /// Waits until every pipe reached its end, or until `deadline` (a rank's child may hold a
    /// pipe open after the rank exited); then writes what is left. Once the ranks are gone their
    /// pipes hold what they wrote last and no more, so streams are read here also while backed
    /// up ([`flush`] then waits for the launcher's streams).
    pub fn finish(&mut self, deadline: Instant) {
        loop {
            self.pump_where(|_| true);
            let now = Instant::now();
            if !self.is_open() || now >= deadline {
                break;
            }
            let mut fds = Vec::with_capacity(self.streams.len());
            self.poll_fds(&mut fds);
            let until = self.deadline().map_or(deadline, |d| d.min(deadline));
            let ms = until.saturating_duration_since(now).as_micros().div_ceil(1000) as libc::c_int;
            // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        }
        let label = self.label;
        for s in &mut self.streams {
            let rest = std::mem::take(&mut s.pending);
            s.write(rest, label);
        }
        self.streams.clear();
    }
}

impl Stream {
    /// [`Output::pump`] for this pipe; whether it stays open.
    fn pump(&mut self, label: bool) -> bool {
        let mut buf = [0u8; 64 << 10];
        let mut read = 0;
        let open = loop {
            if read >= READ_PER_PUMP {
                break true;
            }
            // SAFETY: `buf` is writable for its length; the descriptor is open and ours.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                read += n as usize;
                if !self.take(&buf[..n as usize], label) {
                    break false;
                }
                continue;
            }
            if n < 0 {
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => break true,
                    _ => break false,
                }
            }
            break false; // the end: every writer closed the pipe
        };
        if !open {
            let rest = std::mem::take(&mut self.pending);
            self.write(rest, label);
            return false;
        }
        if self.since.is_some_and(|t| t.elapsed() >= PARTIAL_WAIT) {
            let rest = std::mem::take(&mut self.pending);
            if !self.write(rest, label) {
                return false;
            }
        }
        true
    }

    /// Takes `bytes` just read: writes the lines they end; whether the stream can still be
    /// written.
    fn take(&mut self, bytes: &[u8], label: bool) -> bool {
        let Some(last_nl) = bytes.iter().rposition(|&b| b == b'\n') else {
            if self.pending.is_empty() {
                self.since = Some(Instant::now());
            }
            self.pending.extend_from_slice(bytes);
            if self.pending.len() >= MAX_PENDING {
                let rest = std::mem::take(&mut self.pending);
                return self.write(rest, label);
            }
            return true;
        };
        let (lines, rest) = bytes.split_at(last_nl + 1);
        let mut out = std::mem::take(&mut self.pending);
        out.extend_from_slice(lines);
        let ok = self.write(out, label);
        self.since = (!rest.is_empty()).then(Instant::now);
        self.pending = rest.to_vec();
        ok
    }

    /// Writes `bytes` to the launcher's stream in one call, labelled; clears the wait of the
    /// pending line. `false` when the launcher's stream is gone (a closed pipe): then the rank's
    /// own writes should fail, as they would have without the launcher between.
    fn write(&mut self, bytes: Vec<u8>, label: bool) -> bool {
        self.since = None;
        if bytes.is_empty() {
            return true;
        }
        let bytes = if label { self.labelled(&bytes) } else { bytes };
        self.to.push(bytes)
    }

    /// `bytes` with `[rank] ` at the start of every line. When another stream's unfinished line
    /// (written out after [`PARTIAL_WAIT`]) is the last thing in the sink, it is ended first;
    /// when this stream's own unfinished line went out and another stream wrote since, its
    /// continuation starts a labelled line of its own: labelled lines never mix.
    fn labelled(&mut self, bytes: &[u8]) -> Vec<u8> {
        let tag = format!("[{}] ", self.rank);
        let mut out = Vec::with_capacity(bytes.len() + tag.len() * 4 + 1);
        let me = self.rank * 2 + self.to as usize;
        let open = &OPEN_LINE[self.to.sink_index()];
        let other = open.load(Ordering::Relaxed);
        if other != usize::MAX && other != me {
            out.push(b'\n');
        }
        if other != me {
            self.at_line_start = true;
        }
        for piece in bytes.split_inclusive(|&b| b == b'\n') {
            if self.at_line_start {
                out.extend_from_slice(tag.as_bytes());
            }
            out.extend_from_slice(piece);
            self.at_line_start = piece.ends_with(b"\n");
        }
        open.store(if self.at_line_start { usize::MAX } else { me }, Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream() -> Stream {
        let (r, _w) = std::os::unix::net::UnixStream::pair().unwrap();
        Stream {
            rank: 3,
            to: Target::Stdout,
            fd: OwnedFd::from(r),
            pending: Vec::new(),
            since: None,
            at_line_start: true,
        }
    }

    /// Labels go at the start of every line, also across writes that end mid-line.
    #[test]
    fn labels_start_every_line() {
        let mut s = stream();
        assert_eq!(s.labelled(b"a\nb"), b"[3] a\n[3] b");
        assert_eq!(s.labelled(b"c\n\nd\n"), b"c\n[3] \n[3] d\n");
        assert_eq!(s.labelled(b"e"), b"[3] e");
    }

    /// Bytes without a line end wait, and their wait starts with the first of them.
    #[test]
    fn the_start_of_a_line_waits_for_its_end() {
        let mut s = stream();
        assert!(s.take(b"Error: ", false));
        let since = s.since.expect("waiting");
        assert!(s.take(b"Config { ", false));
        assert_eq!(s.pending, b"Error: Config { ");
        assert_eq!(s.since, Some(since));
    }
}
