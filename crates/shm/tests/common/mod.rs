//! Helpers shared by the integration tests: a collecting sink, peer descriptions, unique job ids,
//! message patterns, and a second process made by re-running the test binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use polyrail_core::{Error, Header, OpId, PacketKind, PeerInfo, Rank, Result, Sink};

/// Environment variable telling a re-run test binary which child role to play.
pub const ROLE_VAR: &str = "PRSHM_TEST_ROLE";

/// A sink that keeps everything.
#[derive(Default, Debug)]
pub struct Collect {
    /// Arrived messages: (from, header, payload).
    pub msgs: Vec<(Rank, Header, Vec<u8>)>,
    /// Lost peers: (rank, error text).
    pub lost: Vec<(Rank, String)>,
    /// Completions: (op, ok).
    pub completed: Vec<(OpId, bool)>,
}

impl Sink for Collect {
    fn message(&mut self, from: Rank, hdr: &Header, payload: &[u8]) {
        self.msgs.push((from, *hdr, payload.to_vec()));
    }
    fn completed(&mut self, op: OpId, result: Result<()>) {
        self.completed.push((op, result.is_ok()));
    }
    fn peer_lost(&mut self, peer: Rank, why: Error) {
        self.lost.push((peer, why.to_string()));
    }
}

/// The host string every test endpoint uses.
pub const HOST: &str = "test-host";

/// A peer description on [`HOST`] with this process's pid.
pub fn peer(rank: Rank) -> PeerInfo {
    PeerInfo { rank, pid: std::process::id(), host: HOST.into(), node: 0, cpus: vec![], own_cpus: true, domain: 0 }
}

/// A job id unique to this process and call (only characters segment names keep).
pub fn job(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("t{}_{tag}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Header of message `n` with payload length `len`: for even `n` the engine's header of a whole
/// eager message (which the shm ring carries in compact form), for odd `n` one with no compact
/// form (a data packet whose offset is `n`).
pub fn header(n: u64, len: usize) -> Header {
    if n % 2 == 0 {
        return Header::eager(0, n as u32, (n / 2) as u32, len as u64);
    }
    Header { offset: n, len: len as u64, sreq: 0x5a, ..Header::new(PacketKind::Data) }
}

/// Byte `i` of message `n`.
pub fn pattern(n: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (n.wrapping_mul(131) as usize + i * 7 + (i >> 8)) as u8).collect()
}

/// Message number and length carried by a header made with [`header`].
pub fn decode_header(h: &Header) -> (u64, usize) {
    match h.kind {
        PacketKind::Eager => (h.tag as u64, h.len as usize),
        _ => (h.offset, h.len as usize),
    }
}

/// Hex text of bytes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of hex text.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex")).collect()
}

/// A second process: this test binary re-run on one test function, with a role.
pub struct ChildProc {
    proc: std::process::Child,
    stdin: Option<ChildStdin>,
    /// What the child said with [`say`], read by a thread so that `recv` can time out.
    said: Receiver<String>,
}

impl ChildProc {
    /// Runs test `entry` of this binary in a new process with `ROLE_VAR=role` and `env`.
    pub fn spawn(entry: &str, role: &str, env: &[(&str, String)]) -> ChildProc {
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = Command::new(exe);
        cmd.args([entry, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut proc = cmd.spawn().expect("spawn child test process");
        let stdin = proc.stdin.take();
        let out = BufReader::new(proc.stdout.take().expect("child stdout"));
        let (tx, said) = channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                // libtest may print "test name ... " on the same line before our text.
                if let Some(i) = line.find("@@ ") {
                    if tx.send(line[i + 3..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        ChildProc { proc, stdin, said }
    }

    /// Sends one line to the child.
    pub fn send(&mut self, line: &str) {
        let w = self.stdin.as_mut().expect("child stdin");
        writeln!(w, "{line}").expect("write to child");
        w.flush().expect("flush to child");
    }

    /// The next line the child said with [`say`].
    pub fn recv(&mut self) -> String {
        self.said.recv_timeout(Duration::from_secs(60)).expect("the child exited or said nothing for 60 s")
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// Waits for the child to exit.
    pub fn wait(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.proc.wait().expect("wait for child")
    }
}

impl Drop for ChildProc {
    /// A test that fails early does not leave its child behind.
    fn drop(&mut self) {
        if let Ok(None) = self.proc.try_wait() {
            let _ = self.proc.kill();
            let _ = self.proc.wait();
        }
    }
}

/// The role this process plays when it is a child, if it is one.
pub fn child_role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

/// Child side: tells the parent a line.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n@@ {line}").unwrap();
    out.flush().unwrap();
}

/// Child side: the next line from the parent.
pub fn hear() -> String {
    let mut s = String::new();
    std::io::stdin().read_line(&mut s).expect("read from parent");
    s.trim_end().to_string()
}

/// Names under `/dev/shm` starting with `prefix`.
pub fn dev_shm_entries(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(prefix)).collect())
        .unwrap_or_default()
}
