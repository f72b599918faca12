//! Ping-pong over `ShmTransport` between two processes pinned to CPUs 0 and 1.
//!
//! ```text
//! cargo run --release -p polyrail-shm --example ring_pingpong [SIZE...]   (default: 8)
//! ```
//! Prints, per payload size, the median one-way latency (half a round trip) over batches of
//! round trips. `PINGPONG_INLINE_SLOTS=n` sets the slots an inline message may take (both
//! processes inherit it; default 4, the library's), to compare inline slots with send cells at
//! a given size.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use polyrail_core::{Config, Error, Header, Issued, OpId, PeerInfo, Rank, Reach, Result, Sink, Transport};
use polyrail_shm::ShmTransport;

const ROLE: &str = "PINGPONG_ROLE";
const BATCH: usize = 1000;
const BATCHES: usize = 100;
const WARMUP: usize = 5000;

struct Count(usize);

impl Sink for Count {
    fn message(&mut self, _from: Rank, _hdr: &Header, payload: &[u8]) {
        std::hint::black_box(payload);
        self.0 += 1;
    }
    fn completed(&mut self, _op: OpId, _result: Result<()>) {}
    fn peer_lost(&mut self, peer: Rank, why: Error) {
        panic!("rank {peer} lost: {why}");
    }
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity only touch `set`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("cannot pin to CPU {cpu}: {}", std::io::Error::last_os_error());
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex")).collect()
}

fn peer(rank: Rank, pid: u32) -> PeerInfo {
    PeerInfo { rank, pid, host: "pingpong".into(), node: 0, cpus: vec![], own_cpus: true, domain: 0 }
}

fn send(t: &mut ShmTransport, to: Rank, hdr: &Header, payload: &[u8], sink: &mut Count) {
    loop {
        match t.try_send(to, hdr, payload).expect("send") {
            Issued::Done => return,
            _ => {
                t.progress(16, sink).expect("progress");
            }
        }
    }
}

fn wait_one(t: &mut ShmTransport, sink: &mut Count) {
    let before = sink.0;
    while sink.0 == before {
        t.progress(1, sink).expect("progress");
    }
}

/// The header the engine gives a whole eager message of `len` bytes.
fn eager_header(len: usize) -> Header {
    Header::eager(0, 7, 0, len as u64)
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("size in bytes")).collect();
    let sizes = if sizes.is_empty() { vec![8] } else { sizes };
    let inline_slots: u32 = std::env::var("PINGPONG_INLINE_SLOTS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    let cfg = Config::default();
    let job = format!("pingpong{}", std::env::var("PINGPONG_JOB").unwrap_or_else(|_| std::process::id().to_string()));
    let rank: Rank = if std::env::var(ROLE).is_ok() { 1 } else { 0 };
    pin(rank as usize);
    let mut t =
        ShmTransport::with_inline_slots(&cfg, &job, rank, 2, inline_slots).expect("segment").with_host("pingpong");
    let mut sink = Count(0);
    if rank == 1 {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        assert!(matches!(
            t.add_peer(&peer(0, std::os::unix::process::parent_id()), &unhex(line.trim())),
            Reach::Yes(_)
        ));
        println!("{}", hex(&t.address()));
        std::io::stdout().flush().unwrap();
        line.clear();
        std::io::stdin().read_line(&mut line).unwrap();
        t.connected().unwrap();
        for &size in &sizes {
            let (hdr, payload) = (eager_header(size), vec![1u8; size]);
            for _ in 0..WARMUP + BATCH * BATCHES {
                wait_one(&mut t, &mut sink);
                send(&mut t, 0, &hdr, &payload, &mut sink);
            }
        }
        t.finalize();
        return;
    }
    let me = std::env::current_exe().unwrap();
    let mut child = Command::new(me)
        .args(std::env::args().skip(1))
        .env(ROLE, "1")
        .env("PINGPONG_JOB", std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rank 1");
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = BufReader::new(child.stdout.take().unwrap());
    writeln!(to_child, "{}", hex(&t.address())).unwrap();
    let mut line = String::new();
    from_child.read_line(&mut line).unwrap();
    assert!(matches!(t.add_peer(&peer(1, child.id()), &unhex(line.trim())), Reach::Yes(_)));
    t.connected().unwrap();
    writeln!(to_child, "go").unwrap();
    println!("{}", t.describe());
    println!("{:>8} {:>14} {:>14}", "bytes", "one-way ns p50", "min batch ns");
    for &size in &sizes {
        let (hdr, payload) = (eager_header(size), vec![1u8; size]);
        let mut round_trip = |t: &mut ShmTransport| {
            send(t, 1, &hdr, &payload, &mut sink);
            wait_one(t, &mut sink);
        };
        for _ in 0..WARMUP {
            round_trip(&mut t);
        }
        let mut one_way = Vec::with_capacity(BATCHES);
        for _ in 0..BATCHES {
            let t0 = Instant::now();
            for _ in 0..BATCH {
                round_trip(&mut t);
            }
            one_way.push(t0.elapsed().as_nanos() as f64 / BATCH as f64 / 2.0);
        }
        one_way.sort_by(f64::total_cmp);
        println!("{size:>8} {:>14.0} {:>14.0}", one_way[BATCHES / 2], one_way[0]);
    }
    t.finalize();
    child.wait().unwrap();
}
