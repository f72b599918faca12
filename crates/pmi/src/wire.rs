//! The two PMI wire formats, shared by the clients and by [`super::server`].
//!
//! - **PMI-1**: one line per message, `cmd=NAME key=value key=value\n`. Fields are separated by
//!   spaces; a space or backslash inside a value is escaped with a backslash (as MPICH does).
//! - **PMI-2**: a 6-character decimal length (zero- or space-padded, on either side: MPICH 3's
//!   client pads on the right, MPICH 4 and Hydra on the left), then that many bytes of
//!   `cmd=NAME;key=value;key=value;`. A `;` inside a value is read as doubled (`;;`), which
//!   MPICH 4 does not undo: keys, values and free text sent never hold one ([`check_token`],
//!   [`sanitize_text`]).
//!
//! Every message starts with `cmd=`. Parsing rejects malformed input with
//! [`Error::Bootstrap`] naming the problem; it never panics.

use std::io::{BufRead, Read, Write};

use polyrail_core::{Error, Result};

/// Longest PMI-1 line accepted, newline included.
pub const MAX_V1_LINE: usize = 64 << 10;
/// Longest PMI-2 message body (the length header has 6 decimal digits).
pub const MAX_V2_BODY: usize = 999_999;
/// Width of the PMI-2 length header.
pub const V2_HEADER: usize = 6;

/// Which of the two framings a message uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// Newline-terminated, space-separated (PMI-1).
    V1,
    /// Length-prefixed, `;`-separated (PMI-2).
    V2,
}

/// One PMI message: its command and its other fields, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    /// The value of the leading `cmd=` field.
    pub cmd: String,
    /// The fields after `cmd`, in the order they came.
    pub fields: Vec<(String, String)>,
}

impl Msg {
    /// A message with command `cmd` and no fields yet.
    pub fn new(cmd: impl Into<String>) -> Msg {
        Msg { cmd: cmd.into(), fields: Vec::new() }
    }

    /// Appends `key=value`.
    pub fn with(mut self, key: &str, value: impl ToString) -> Msg {
        self.fields.push((key.to_owned(), value.to_string()));
        self
    }

    /// The value of the first field named `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The value of `key`, or an error naming the command and the missing field.
    pub fn require(&self, key: &str) -> Result<&str> {
        self.get(key).ok_or_else(|| bad(format!("PMI message `cmd={}` lacks the field `{key}`", self.cmd)))
    }

    /// The value of `key` as an integer, or an error naming the field.
    pub fn require_int<T: std::str::FromStr>(&self, key: &str) -> Result<T> {
        let v = self.require(key)?;
        v.trim().parse().map_err(|_| bad(format!("PMI message `cmd={}`: `{key}={v}` is not a valid integer", self.cmd)))
    }

    /// Checks `rc` (absent means success); on failure names `what` and the server's message.
    pub fn check_rc(&self, what: &str) -> Result<()> {
        let Some(rc) = self.get("rc") else { return Ok(()) };
        if rc.trim() == "0" {
            return Ok(());
        }
        let why = self.get("msg").or_else(|| self.get("errmsg")).unwrap_or("no reason given");
        Err(bad(format!("{what} failed: the process manager answered rc={rc} ({why})")))
    }

    /// Checks that this is the answer `expected`, naming `what` was asked otherwise.
    pub fn expect_cmd(&self, expected: &str, what: &str) -> Result<()> {
        if self.cmd == expected {
            Ok(())
        } else {
            Err(bad(format!(
                "{what}: expected a `cmd={expected}` answer from the process manager, got `cmd={}`",
                self.cmd
            )))
        }
    }

    /// The message in PMI-1 framing, newline included.
    pub fn encode_v1(&self) -> Vec<u8> {
        let mut s = format!("cmd={}", escape_v1(&self.cmd));
        for (k, v) in &self.fields {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(&escape_v1(v));
        }
        s.push('\n');
        s.into_bytes()
    }

    /// The message in PMI-2 framing, length header included.
    ///
    /// Fails only if the body exceeds [`MAX_V2_BODY`] bytes.
    pub fn encode_v2(&self) -> Result<Vec<u8>> {
        let mut body = format!("cmd={};", escape_v2(&self.cmd));
        for (k, v) in &self.fields {
            body.push_str(k);
            body.push('=');
            body.push_str(&escape_v2(v));
            body.push(';');
        }
        if body.len() > MAX_V2_BODY {
            return Err(bad(format!(
                "PMI-2 message `cmd={}` is {} bytes, above the limit {MAX_V2_BODY}",
                self.cmd,
                body.len()
            )));
        }
        Ok(format!("{:06}{body}", body.len()).into_bytes())
    }

    /// The message in `wire` framing.
    pub fn encode(&self, wire: Wire) -> Result<Vec<u8>> {
        match wire {
            Wire::V1 => Ok(self.encode_v1()),
            Wire::V2 => self.encode_v2(),
        }
    }
}

fn bad(what: impl Into<String>) -> Error {
    Error::Bootstrap(what.into())
}

/// Control characters cannot travel in either format: they become spaces.
fn printable(c: char) -> char {
    if c.is_control() {
        ' '
    } else {
        c
    }
}

fn escape_v1(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars().map(printable) {
        if c == ' ' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s
}

fn escape_v2(v: &str) -> String {
    v.chars().map(printable).collect::<String>().replace(';', ";;")
}

/// Whether `s` is a valid field name: ASCII letters, digits, `_`, `-`, `/`, `.`, `:`.
fn is_key(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-/.:".contains(&b))
}

fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str> {
    std::str::from_utf8(bytes).map_err(|_| bad(format!("{what} is not valid UTF-8: {}", preview(bytes))))
}

/// A short, printable rendering of raw bytes for error messages.
pub fn preview(bytes: &[u8]) -> String {
    const MAX: usize = 80;
    let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX)]).escape_debug().to_string();
    if bytes.len() > MAX {
        format!("\"{shown}\"... ({} bytes)", bytes.len())
    } else {
        format!("\"{shown}\"")
    }
}

/// Builds a message from `(key, value)` tokens; the first must be `cmd`.
fn assemble(tokens: Vec<(String, String)>, raw: &[u8], wire: &str) -> Result<Msg> {
    let mut it = tokens.into_iter();
    match it.next() {
        Some((k, cmd)) if k == "cmd" && !cmd.is_empty() => Ok(Msg { cmd, fields: it.collect() }),
        _ => Err(bad(format!("{wire} message does not start with `cmd=NAME`: {}", preview(raw)))),
    }
}

/// PMI-1 fields of free text, which Hydra sends with unescaped spaces.
const FREE_TEXT: [&str; 3] = ["msg", "errmsg", "message"];

/// Parses one PMI-1 line (with or without its trailing newline).
pub fn parse_v1(line: &[u8]) -> Result<Msg> {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    if body.len() >= MAX_V1_LINE {
        return Err(bad(format!("PMI-1 line of {} bytes is above the limit {MAX_V1_LINE}", body.len())));
    }
    let text = utf8(body, "PMI-1 line")?;
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(bad(format!("PMI-1 line contains the control character {c:?}: {}", preview(body))));
    }
    let mut tokens: Vec<(String, String)> = Vec::new();
    for token in split_v1(text).map_err(|e| bad(format!("{e}: {}", preview(body))))? {
        let Some((k, v)) = token.split_once('=') else {
            // A word without `=` continues a free-text value before it: Hydra sends them with
            // unescaped spaces (`rc=1 msg=Keys with PMI_ prefix are reserved`), which MPICH's
            // parser also reads. Keys and other values stay single words.
            match tokens.last_mut() {
                Some((key, value)) if FREE_TEXT.contains(&key.as_str()) => {
                    value.push(' ');
                    value.push_str(&token);
                    continue;
                }
                _ => return Err(bad(format!("PMI-1 field `{token}` has no `=`: {}", preview(body)))),
            }
        };
        if !is_key(k) {
            return Err(bad(format!("PMI-1 field name `{k}` is not a valid key: {}", preview(body))));
        }
        tokens.push((k.to_owned(), v.to_owned()));
    }
    assemble(tokens, body, "PMI-1")
}

/// Splits a PMI-1 line on unescaped spaces and removes the escapes.
fn split_v1(text: &str) -> std::result::Result<Vec<String>, String> {
    let mut tokens = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.push(chars.next().ok_or("PMI-1 line ends with a lone backslash")?),
            ' ' if cur.is_empty() => {}
            ' ' => tokens.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        tokens.push(cur);
    }
    Ok(tokens)
}

/// Parses a PMI-2 length header (6 characters, digits padded with spaces or zeros).
pub fn parse_v2_len(header: &[u8]) -> Result<usize> {
    let complain = || bad(format!("PMI-2 length header {} is not a 6-character decimal number", preview(header)));
    if header.len() != V2_HEADER {
        return Err(complain());
    }
    let digits = std::str::from_utf8(header).map_err(|_| complain())?.trim_matches(' ');
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(complain());
    }
    digits.parse().map_err(|_| complain())
}

/// Parses a PMI-2 body (without its length header): `cmd=NAME;key=value;...`.
///
/// `;;` inside a value stands for `;`. The last field's `;` may be missing.
pub fn parse_v2(body: &[u8]) -> Result<Msg> {
    let text = utf8(body, "PMI-2 message")?;
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(bad(format!("PMI-2 message contains the control character {c:?}: {}", preview(body))));
    }
    let mut tokens = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (k, after) =
            rest.split_once('=').ok_or_else(|| bad(format!("PMI-2 field `{rest}` has no `=`: {}", preview(body))))?;
        if !is_key(k) {
            return Err(bad(format!("PMI-2 field name `{k}` is not a valid key: {}", preview(body))));
        }
        let (v, next) = take_v2_value(after);
        tokens.push((k.to_owned(), v));
        rest = next;
    }
    assemble(tokens, body, "PMI-2")
}

/// Reads a value up to its terminating single `;`; returns the value and what follows.
fn take_v2_value(s: &str) -> (String, &str) {
    let mut value = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != ';' {
            value.push(c);
            continue;
        }
        if matches!(chars.peek(), Some((_, ';'))) {
            chars.next();
            value.push(';');
            continue;
        }
        return (value, &s[i + 1..]);
    }
    (value, "")
}

/// Which framing a buffer that starts a message uses, once enough bytes are there to tell.
///
/// PMI-1 lines start with a letter (`cmd=`), PMI-2 messages with a digit or a space.
pub fn detect(buf: &[u8]) -> Option<Wire> {
    match buf.first()? {
        b'0'..=b'9' | b' ' => Some(Wire::V2),
        _ => Some(Wire::V1),
    }
}

/// Takes one complete message off the front of `buf`, if there is one.
///
/// Used by the server, which reads whatever bytes arrived; the framing is detected per message
/// (MPICH's PMI-2 client sends its first `init` as a PMI-1 line). Errors mean the peer sent
/// garbage and the connection should be dropped.
pub fn take_frame(buf: &mut Vec<u8>) -> Result<Option<(Wire, Msg)>> {
    let Some(wire) = detect(buf) else { return Ok(None) };
    match wire {
        Wire::V1 => {
            let Some(end) = buf.iter().position(|&b| b == b'\n') else {
                if buf.len() >= MAX_V1_LINE {
                    return Err(bad(format!("PMI-1 line longer than {MAX_V1_LINE} bytes: {}", preview(buf))));
                }
                return Ok(None);
            };
            let line: Vec<u8> = buf.drain(..=end).collect();
            Ok(Some((Wire::V1, parse_v1(&line)?)))
        }
        Wire::V2 => {
            if buf.len() < V2_HEADER {
                return Ok(None);
            }
            let len = parse_v2_len(&buf[..V2_HEADER])?;
            if buf.len() < V2_HEADER + len {
                return Ok(None);
            }
            let frame: Vec<u8> = buf.drain(..V2_HEADER + len).collect();
            Ok(Some((Wire::V2, parse_v2(&frame[V2_HEADER..])?)))
        }
    }
}

/// Reads one PMI-1 line from a blocking stream.
pub fn read_v1(r: &mut impl BufRead) -> Result<Msg> {
    let mut line = Vec::new();
    let n = r.by_ref().take(MAX_V1_LINE as u64).read_until(b'\n', &mut line).map_err(read_error)?;
    if n == 0 {
        return Err(closed());
    }
    if line.last() != Some(&b'\n') {
        return Err(if n >= MAX_V1_LINE {
            bad(format!("PMI-1 line longer than {MAX_V1_LINE} bytes"))
        } else {
            closed()
        });
    }
    parse_v1(&line)
}

/// Reads one PMI-2 message from a blocking stream.
pub fn read_v2(r: &mut impl Read) -> Result<Msg> {
    let mut header = [0u8; V2_HEADER];
    r.read_exact(&mut header).map_err(read_error)?;
    let len = parse_v2_len(&header)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(read_error)?;
    parse_v2(&body)
}

fn closed() -> Error {
    bad("the process manager closed the PMI connection (did the launcher exit or kill the job?)")
}

fn read_error(e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => closed(),
        // The read timeout of POLYRAIL_PMI_TIMEOUT.
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => bad(
            "no answer from the process manager within POLYRAIL_PMI_TIMEOUT; a fence waits for every rank: did one \
             die or stall before it, under a launcher that lets the others run on?",
        ),
        _ => bad(format!("reading from the PMI process manager failed ({e})")),
    }
}

/// Checks that a key or value can travel in both formats: printable ASCII without spaces, `=`,
/// `;` or `\`, at most `max` bytes. `what` names it in the error (`key "k0"`).
pub fn check_token(what: &str, s: &str, max: usize) -> Result<()> {
    if s.is_empty() {
        // MPICH's parser refuses `value=` ("expecting value after ="), and Hydra then fails
        // the whole job.
        return Err(bad(format!("{what} is empty; PMI process managers refuse empty keys and values")));
    }
    if s.len() > max {
        return Err(bad(format!("{what} is {} bytes long, above the process manager's limit of {max}", s.len())));
    }
    if let Some(c) = s.chars().find(|&c| !c.is_ascii_graphic() || "=;\\".contains(c)) {
        return Err(bad(format!(
            "{what} contains {c:?}; PMI keys and values must be printable ASCII without spaces, `=`, `;` \
             or `\\` (encode bytes with polyrail_pmi::encode_hex)"
        )));
    }
    Ok(())
}

/// Characters of free text kept by [`sanitize_text`]: far below either format's limit on a
/// message (a PMI-1 line of 64 KiB, a PMI-2 body of 999 999 bytes), so that a long abort
/// message still makes a well-formed abort.
pub const TEXT_LIMIT: usize = 1024;

/// Makes free text (an abort message) safe for both formats: no control characters, no `;`,
/// at most [`TEXT_LIMIT`] characters (a longer text is cut, and says so with `...`).
pub fn sanitize_text(s: &str) -> String {
    let mut out: String = s.chars().take(TEXT_LIMIT).map(printable).map(|c| if c == ';' { ',' } else { c }).collect();
    if s.chars().nth(TEXT_LIMIT).is_some() {
        out.push_str("...");
    }
    out
}

/// The socket a client talks PMI over: inherited (`PMI_FD`) or connected (`PMI_PORT`).
enum Stream {
    Unix(std::os::unix::net::UnixStream),
    Tcp(std::net::TcpStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A client's blocking connection to the process manager, shared by the PMI-1 and PMI-2 clients.
pub(crate) struct Conn {
    io: std::io::BufReader<Stream>,
    /// Why the connection can no longer be used: a read or write failed or timed out, after
    /// which an answer may still be on its way and would be taken for the next request's.
    broken: Option<String>,
}

impl Conn {
    /// A duplicate of the socket ([`super::Bootstrap::hangup_watch`]); `None` if the process
    /// is out of descriptors.
    pub(crate) fn hangup_watch(&self) -> Option<std::os::fd::OwnedFd> {
        match self.io.get_ref() {
            Stream::Unix(s) => s.try_clone().ok().map(Into::into),
            Stream::Tcp(s) => s.try_clone().ok().map(Into::into),
        }
    }

    /// Makes reads fail after `timeout` without an answer (`None`: wait as long as the
    /// connection lasts).
    pub(crate) fn set_timeout(&mut self, timeout: Option<std::time::Duration>) -> Result<()> {
        let set = match self.io.get_ref() {
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tcp(s) => s.set_read_timeout(timeout),
        };
        set.map_err(|e| bad(format!("setting the PMI read timeout (POLYRAIL_PMI_TIMEOUT) failed ({e})")))
    }

    /// Wraps a connected Unix socket.
    pub(crate) fn from_unix(s: std::os::unix::net::UnixStream) -> Conn {
        Conn { io: std::io::BufReader::new(Stream::Unix(s)), broken: None }
    }

    /// Whether it is a TCP connection to a shared port (`PMI_PORT`), not an inherited socket.
    pub(crate) fn via_port(&self) -> bool {
        matches!(self.io.get_ref(), Stream::Tcp(_))
    }

    /// Connects to the process manager named by `PMI_FD` (preferred) or `PMI_PORT` (within
    /// `timeout` when given, `POLYRAIL_PMI_TIMEOUT`).
    ///
    /// Takes ownership of the `PMI_FD` descriptor: call once per process.
    pub(crate) fn from_env(timeout: Option<std::time::Duration>) -> Result<Conn> {
        if let Some(fd) = std::env::var_os("PMI_FD") {
            return Self::from_fd(&fd.to_string_lossy());
        }
        if let Some(port) = std::env::var_os("PMI_PORT") {
            return Self::from_port(&port.to_string_lossy(), timeout);
        }
        Err(bad("neither PMI_FD nor PMI_PORT is set: this process was not started by a PMI launcher \
                 (use `polyrail run`, `mpiexec.hydra` or `srun --mpi=pmi2`)"))
    }

    fn from_fd(text: &str) -> Result<Conn> {
        use std::os::fd::FromRawFd;
        let not_open = || {
            bad(format!(
                "PMI_FD={text:?} is not an open file descriptor; was this process started by a PMI launcher \
                 (`polyrail run`, `mpiexec.hydra`, `srun --mpi=pmi2`)?"
            ))
        };
        let fd: i32 = text.trim().parse().map_err(|_| not_open())?;
        if fd < 0 {
            return Err(not_open());
        }
        // SAFETY: F_GETFD only queries the descriptor flags; an invalid fd yields -1.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            return Err(not_open());
        }
        // SAFETY: `st` is plain data and fstat writes at most one `stat` into it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and `st` is a valid, writable stat struct.
        if unsafe { libc::fstat(fd, &mut st) } < 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(bad(format!(
                "PMI_FD={text:?} is open but is not a socket; was this process started by a PMI launcher \
                 (`polyrail run`, `mpiexec.hydra`, `srun --mpi=pmi2`)?"
            )));
        }
        // SAFETY: fd is open (checked above); setting FD_CLOEXEC keeps it from leaking into
        // programs this process may start.
        unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        // SAFETY: the launcher handed this descriptor to this process for PMI alone; `Conn` becomes
        // its only owner (from_env is documented to be called once per process).
        let s = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
        Ok(Self::from_unix(s))
    }

    fn from_port(text: &str, timeout: Option<std::time::Duration>) -> Result<Conn> {
        use std::net::ToSocketAddrs;
        let (host, port) = text
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.trim().parse::<u16>().ok()?)))
            .ok_or_else(|| bad(format!("PMI_PORT={text:?} is not of the form HOST:PORT")))?;
        let failed =
            |e: std::io::Error| bad(format!("connecting to the PMI process manager at PMI_PORT={text} failed ({e})"));
        let s = match timeout {
            None => std::net::TcpStream::connect((host, port)).map_err(failed)?,
            Some(t) => {
                // Each address in turn, as `connect` does, each within the timeout.
                let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the host name has no address");
                let mut found = None;
                for addr in (host, port).to_socket_addrs().map_err(failed)? {
                    match std::net::TcpStream::connect_timeout(&addr, t) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                found.ok_or_else(|| failed(last))?
            }
        };
        let _ = s.set_nodelay(true);
        Ok(Conn { io: std::io::BufReader::new(Stream::Tcp(s)), broken: None })
    }

    /// Sends `msg` in `wire` framing.
    pub(crate) fn send(&mut self, wire: Wire, msg: &Msg) -> Result<()> {
        self.usable()?;
        self.send_anyway(wire, msg)
    }

    /// [`Conn::send`] also on a connection an earlier failure left out of step: for an abort,
    /// which waits for no answer. A message that cannot be encoded leaves it usable.
    pub(crate) fn send_anyway(&mut self, wire: Wire, msg: &Msg) -> Result<()> {
        let bytes = msg.encode(wire)?;
        let io = self.io.get_mut();
        let sent = io.write_all(&bytes).and_then(|()| io.flush()).map_err(|e| {
            bad(format!("sending `cmd={}` to the PMI process manager failed ({e}); did the launcher exit?", msg.cmd))
        });
        self.note(sent)
    }

    /// Reads one message in `wire` framing.
    pub(crate) fn recv(&mut self, wire: Wire) -> Result<Msg> {
        self.usable()?;
        let read = match wire {
            Wire::V1 => read_v1(&mut self.io),
            Wire::V2 => read_v2(&mut self.io),
        };
        self.note(read)
    }

    /// An error once a send or read failed: the conversation is out of step.
    fn usable(&self) -> Result<()> {
        match &self.broken {
            None => Ok(()),
            Some(why) => Err(bad(format!("the PMI connection is unusable after an earlier failure ({why})"))),
        }
    }

    /// Marks the connection broken if `r` failed.
    fn note<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.broken.get_or_insert_with(|| e.to_string());
        }
        r
    }

    /// Sends `msg`, reads the answer, checks that it is `expected` with `rc` 0 (if given).
    /// `what` names the operation in errors.
    pub(crate) fn call(&mut self, wire: Wire, msg: &Msg, expected: &str, what: &str) -> Result<Msg> {
        self.send(wire, msg).map_err(|e| bad(format!("{what}: {e}")))?;
        let reply = self.recv(wire).map_err(|e| bad(format!("{what}: {e}")))?;
        reply.expect_cmd(expected, what)?;
        reply.check_rc(what)?;
        Ok(reply)
    }

    /// Waits up to `timeout` for the process manager to close the connection (after an abort).
    pub(crate) fn wait_closed(&mut self, timeout: std::time::Duration) {
        let _ = self.set_timeout(Some(timeout));
        let deadline = std::time::Instant::now() + timeout;
        let mut sink = [0u8; 256];
        while std::time::Instant::now() < deadline {
            match self.io.read(&mut sink) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

/// Reads a rank or size from the environment (`PMI_RANK`, `PMI_SIZE`, `PMI_ID`).
pub(crate) fn env_u32(var: &str) -> Result<Option<u32>> {
    let Some(v) = std::env::var_os(var) else { return Ok(None) };
    v.to_str()
        .and_then(|t| t.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| bad(format!("{var}={v:?} is not a non-negative integer; the launcher set a bad value")))
}

/// Writes `line` and a newline to stderr in one `write`, so that the lines of the ranks and of
/// the launcher, which share the terminal, do not interleave mid-line.
pub fn eprint_line(line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a call times out, its answer may still come and be taken for the next request's:
    /// the connection refuses further calls, but an abort (which waits for no answer) still
    /// goes out.
    #[test]
    fn a_timed_out_connection_refuses_calls_but_not_an_abort() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut conn = Conn::from_unix(ours);
        conn.set_timeout(Some(std::time::Duration::from_millis(20))).unwrap();
        let e = conn.call(Wire::V1, &Msg::new("barrier_in"), "barrier_out", "PMI-1 barrier").unwrap_err();
        assert!(e.to_string().contains("POLYRAIL_PMI_TIMEOUT"), "{e}");
        let e = conn.call(Wire::V1, &Msg::new("get_maxes"), "maxes", "PMI-1 get_maxes").unwrap_err();
        assert!(e.to_string().contains("unusable after an earlier failure"), "{e}");
        conn.send_anyway(Wire::V1, &Msg::new("abort").with("exitcode", 3)).unwrap();
        let mut seen = std::io::BufReader::new(theirs);
        assert_eq!(read_v1(&mut seen).unwrap().cmd, "barrier_in");
        assert_eq!(read_v1(&mut seen).unwrap().cmd, "abort", "the refused get_maxes was never sent");
    }
}
