//! Output of the ranks of a `polyrail run` job: each rank's stdout and stderr reach the launcher
//! through a pipe and leave it a whole line at a time, so that the lines of ranks writing at once
//! do not mix. (One message of a rank is often several writes: Rust's stderr is unbuffered, and
//! `Error: {e:?}` from `main` is written piece by piece; two ranks failing at once printed
//! `Error: Error: Config { Configvar {...` through inherited descriptors.)
//!
//! A line still without its end after [`PARTIAL_WAIT`] (a prompt, progress dots) goes out as
//! it is, and so does one longer than [`MAX_PENDING`]. With labels, every line starts with
//! `[rank] `, as Hydra's `-prepend-rank` does.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Child;
use std::time::{Duration, Instant};

/// How long the start of a line waits for its end before it is written as it is.
pub const PARTIAL_WAIT: Duration = Duration::from_millis(50);
/// Bytes of one line held back at most; a longer line goes out in pieces.
const MAX_PENDING: usize = 64 << 10;
/// Bytes read from one pipe per [`Output::pump`]: a rank that writes without pause cannot keep
/// the launcher from the other ranks' output and its own events.
const READ_PER_PUMP: usize = 256 << 10;

/// The launcher's own stream a rank's stream goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Stdout,
    Stderr,
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

    /// Adds a `poll` entry for every open pipe to `fds`.
    pub fn poll_fds(&self, fds: &mut Vec<libc::pollfd>) {
        fds.extend(self.streams.iter().map(|s| libc::pollfd {
            fd: s.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
    }

    /// When the oldest unfinished line is due to go out as it is.
    pub fn deadline(&self) -> Option<Instant> {
        self.streams.iter().filter_map(|s| s.since).min().map(|t| t + PARTIAL_WAIT)
    }

    /// Reads what every pipe has, writes the whole lines (and lines that waited long enough for
    /// their end), and closes the pipes at their end.
    pub fn pump(&mut self) {
        let label = self.label;
        self.streams.retain_mut(|s| s.pump(label));
    }

    /// Waits until every pipe reached its end, or until `deadline` (a rank's child may hold a
    /// pipe open after the rank exited); then writes what is left.
    pub fn finish(&mut self, deadline: Instant) {
        loop {
            self.pump();
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
            s.write(&rest, label);
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
            self.write(&rest, label);
            return false;
        }
        if self.since.is_some_and(|t| t.elapsed() >= PARTIAL_WAIT) {
            let rest = std::mem::take(&mut self.pending);
            if !self.write(&rest, label) {
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
                return self.write(&rest, label);
            }
            return true;
        };
        let (lines, rest) = bytes.split_at(last_nl + 1);
        let mut out = std::mem::take(&mut self.pending);
        out.extend_from_slice(lines);
        let ok = self.write(&out, label);
        out.clear();
        out.extend_from_slice(rest);
        self.since = (!out.is_empty()).then(Instant::now);
        self.pending = out;
        ok
    }

    /// Writes `bytes` to the launcher's stream in one call, labelled; clears the wait of the
    /// pending line. `false` when the launcher's stream is gone (a closed pipe): then the rank's
    /// own writes should fail, as they would have without the launcher between.
    fn write(&mut self, bytes: &[u8], label: bool) -> bool {
        self.since = None;
        if bytes.is_empty() {
            return true;
        }
        let labelled;
        let bytes = if label {
            labelled = self.labelled(bytes);
            &labelled[..]
        } else {
            bytes
        };
        let written = match self.to {
            Target::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes).and_then(|()| out.flush())
            }
            Target::Stderr => std::io::stderr().lock().write_all(bytes),
        };
        written.is_ok()
    }

    /// `bytes` with `[rank] ` at the start of every line.
    fn labelled(&mut self, bytes: &[u8]) -> Vec<u8> {
        let tag = format!("[{}] ", self.rank);
        let mut out = Vec::with_capacity(bytes.len() + tag.len() * 4);
        for piece in bytes.split_inclusive(|&b| b == b'\n') {
            if self.at_line_start {
                out.extend_from_slice(tag.as_bytes());
            }
            out.extend_from_slice(piece);
            self.at_line_start = piece.ends_with(b"\n");
        }
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
