//! `ShmTransport` scenarios: two endpoints in one thread (deterministic), in two threads, and in
//! two processes.

mod common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use common::*;
use polyrail_core::config::PlacementMode;
use polyrail_core::observe::{Observation, Observe};
use polyrail_core::{Caps, Config, Envelope, Error, Issued, PeerInfo, Reach, Transport, Wakeup};
use polyrail_shm::ShmTransport;

fn cfg(slots: usize, cells: usize, cell_size: usize) -> Config {
    shm_config(Config::default(), slots, cells, cell_size)
}

/// `base` with these ring slots and send cells (checked when a transport starts).
fn shm_config(mut base: Config, slots: usize, cells: usize, cell_size: usize) -> Config {
    for (var, value) in
        [("POLYRAIL_SHM_SLOTS", slots), ("POLYRAIL_SHM_CELLS", cells), ("POLYRAIL_SHM_CELL_SIZE", cell_size)]
    {
        base.set(var, &value.to_string()).unwrap();
    }
    base
}

/// The stream configuration: a small ring (many laps), few cells (reuse), cells above 20000 B.
fn stream_cfg() -> Config {
    cfg(64, 16, 32 << 10)
}

/// Ranks 0 and 1 of a fresh job, connected to each other.
fn pair(cfg: &Config) -> (ShmTransport, ShmTransport) {
    pair_sharing_cpus(cfg, false)
}

/// [`pair`] on a machine that runs more ranks than CPUs when `shared` ([`PeerInfo::own_cpus`]).
fn pair_sharing_cpus(cfg: &Config, shared: bool) -> (ShmTransport, ShmTransport) {
    let mut m = mesh_of(cfg, "pair", 2, shared);
    let b = m.pop().unwrap();
    (m.pop().unwrap(), b)
}

/// The `n` ranks of a fresh job named after `tag`, each connected to every other.
fn mesh(cfg: &Config, tag: &str, n: u32) -> Vec<ShmTransport> {
    mesh_of(cfg, tag, n, false)
}

/// [`mesh`], the ranks sharing CPUs when `shared`.
fn mesh_of(cfg: &Config, tag: &str, n: u32, shared: bool) -> Vec<ShmTransport> {
    let job = job(tag);
    let mut t: Vec<ShmTransport> =
        (0..n).map(|r| ShmTransport::new(cfg, &job, r, n).unwrap().with_host(HOST)).collect();
    let addrs: Vec<_> = t.iter().map(|x| x.address()).collect();
    for (r, x) in t.iter_mut().enumerate() {
        for (q, addr) in addrs.iter().enumerate().filter(|&(q, _)| q != r) {
            let info = PeerInfo { own_cpus: !shared, ..peer(q as u32) };
            assert!(matches!(x.add_peer(&info, addr), Reach::Yes(_)));
        }
    }
    t.iter_mut().for_each(|x| x.connected().unwrap());
    t
}

/// Every size from 0 to 1100 (across the inline limit), then up to 20000 in steps (cells), then
/// a long mixed tail that wraps the 64-slot ring hundreds of times.
fn sizes() -> Vec<usize> {
    let mut v: Vec<usize> = (0..=1100).collect();
    v.extend((1100..=20000).step_by(97));
    v.extend([20000, 0, 48, 49, 64, 65, 112, 113, 255, 256, 257, 1023, 1024, 1025]);
    v.extend((0..2000).map(|i| [8, 100, 256, 257, 1024, 1025, 5000][i % 7]));
    v
}

/// Sends message `n` of `sizes[n]` bytes for every n and checks the echoes, in order.
fn send_and_check_echoes(t: &mut ShmTransport, to: u32, sizes: &[usize]) {
    let mut sink = Collect::default();
    let (mut sent, mut echoed) = (0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut payload = pattern(0, sizes[0]);
    while echoed < sizes.len() {
        let mut moved = false;
        while sent < sizes.len() {
            match t.try_send(to, &header(sent as u64, sizes[sent]), &payload).unwrap() {
                Issued::Done => {
                    sent += 1;
                    moved = true;
                    if sent < sizes.len() {
                        payload = pattern(sent as u64, sizes[sent]);
                    }
                }
                Issued::WouldBlock => break,
                Issued::Pending | Issued::Ordered => panic!("shm sends complete at once"),
            }
        }
        t.progress(64, &mut sink).unwrap();
        for (from, h, p) in sink.msgs.drain(..) {
            moved = true;
            assert_eq!(from, to);
            let (n, len) = decode_header(&h);
            assert_eq!(n, echoed as u64, "echoes arrive in order");
            assert_eq!(len, sizes[echoed]);
            assert!(p == pattern(n, len), "echo {n} ({len} bytes) intact");
            echoed += 1;
        }
        if !moved {
            std::thread::yield_now();
        }
        assert!(Instant::now() < deadline, "stream stuck at {sent} sent, {echoed} echoed");
    }
}

/// Receives `count` messages from `from`, checks them, and sends each back.
fn echo(t: &mut ShmTransport, from: u32, sizes: &[usize]) {
    let mut sink = Collect::default();
    let mut pending = VecDeque::new();
    let (mut received, mut echoed) = (0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    while echoed < sizes.len() {
        t.progress(64, &mut sink).unwrap();
        let got = !sink.msgs.is_empty();
        for (f, h, p) in sink.msgs.drain(..) {
            assert_eq!(f, from);
            let (n, len) = decode_header(&h);
            assert_eq!(n, received as u64, "messages arrive in order");
            assert_eq!(len, sizes[received]);
            assert!(p == pattern(n, len), "message {n} ({len} bytes) intact");
            received += 1;
            pending.push_back((h, p));
        }
        let mut sent = false;
        while let Some((h, p)) = pending.front() {
            match t.try_send(from, h, p).unwrap() {
                Issued::Done => {
                    pending.pop_front();
                    echoed += 1;
                    sent = true;
                }
                _ => break,
            }
        }
        if !got && !sent {
            std::thread::yield_now();
        }
        assert!(Instant::now() < deadline, "echo stuck at {received} received, {echoed} echoed");
    }
}

#[test]
fn attributes_and_description() {
    let (a, _b) = pair(&Config::default());
    let attr = a.attr();
    assert_eq!(attr.kind, polyrail_shm::SHM);
    assert!(attr.caps.contains(Caps::AM));
    assert_eq!(attr.max_eager, 16 << 10);
    assert_eq!(attr.max_inline, a.inline_limit());
    assert_eq!(a.inline_limit(), 256);
    let d = a.describe();
    assert!(d.contains("64 records") && d.contains("128 cells") && d.contains("1 peers"), "{d}");
}

#[test]
fn two_threads_stream_every_size() {
    let (mut a, mut b) = pair(&stream_cfg());
    let sizes = sizes();
    let s2 = sizes.clone();
    let echoer = std::thread::spawn(move || echo(&mut b, 0, &s2));
    send_and_check_echoes(&mut a, 1, &sizes);
    echoer.join().unwrap();
}

/// With the placement given as apart, send cells are filled with non-temporal stores and the
/// consumer prefetches as it does apart: every size still arrives intact and in order.
#[test]
fn two_threads_stream_every_size_apart() {
    let cfg = Config { placement: PlacementMode::Apart, ..stream_cfg() };
    let (mut a, mut b) = pair(&cfg);
    let sizes = sizes();
    let s2 = sizes.clone();
    let echoer = std::thread::spawn(move || echo(&mut b, 0, &s2));
    send_and_check_echoes(&mut a, 1, &sizes);
    echoer.join().unwrap();
    let d = a.describe();
    assert!(d.contains("1 peers mapped, 1 of them apart (POLYRAIL_PLACEMENT"), "{d}");
}

#[test]
fn whole_eager_messages_in_their_record_carry_every_length() {
    let (mut a, mut b) = pair(&cfg(16, 4, 4096));
    // A record's payload.
    let max = 112;
    // Every length a record takes, with tags and sequence ids that use all their bits.
    let env = |n: u64| Envelope::new(n as u16 ^ 0xa5a5, 0xfedc_ba98 ^ n as u32, 0x8765_4321 ^ n as u32);
    let len = |n: u64| (n as usize * 37) % (max + 1);
    let mut sink = Collect::default();
    let mut sent = 0u64;
    while sent <= max as u64 {
        let hdr = env(sent).header(len(sent));
        assert!(hdr.is_compact(len(sent)));
        match a.try_send(1, &hdr, &pattern(sent, len(sent))) {
            Ok(Issued::Done) => sent += 1,
            Ok(Issued::WouldBlock) => {
                assert_eq!(sent % 16, 0, "a ring of 16 records is full after 16 messages");
                b.progress(usize::MAX, &mut sink).unwrap();
            }
            other => panic!("try_send said {other:?}"),
        }
    }
    b.progress(usize::MAX, &mut sink).unwrap();
    assert_eq!(sink.msgs.len(), sent as usize);
    for (n, (from, h, p)) in sink.msgs.iter().enumerate() {
        let n = n as u64;
        assert_eq!((*from, *h), (0, env(n).header(len(n))), "message {n}");
        assert_eq!(p, &pattern(n, len(n)), "message {n}");
    }
}

#[test]
fn a_receiver_that_sends_nothing_learns_the_line_time_from_its_sender() {
    let (mut a, mut b) = pair(&cfg(16, 4, 4096));
    assert_eq!(line(&mut b, 0), None, "nothing to time yet");
    let mut sink = Collect::default();
    for n in 0..4 {
        assert_eq!(a.try_send(1, &header(n, 8), &pattern(n, 8)).unwrap(), Issued::Done);
        b.progress(usize::MAX, &mut sink).unwrap();
    }
    // b published its read position: a times loading it, and shares the time with b, whose
    // own ring to a is unused.
    let ns = line(&mut a, 1).expect("a fresh read position to time");
    assert_eq!(line(&mut b, 0), Some(ns));
    assert_eq!(line(&mut b, 0), None, "each shared time once");
}

#[test]
fn cell_fills_are_timed_once_the_pool_was_used_round() {
    // (placement, every rank has a CPU of its own, a fill is timed)
    for (placement, own_cpus, timed) in [
        (PlacementMode::Measure, true, true),
        (PlacementMode::Middle, true, true),
        (PlacementMode::Apart, true, false),
        (PlacementMode::Measure, false, false),
    ] {
        let (mut a, mut b) = pair_sharing_cpus(&Config { placement, ..cfg(16, 4, 16 << 10) }, !own_cpus);
        assert_eq!(slow(&mut a, 1), None, "nothing timed yet");
        let mut sink = Collect::default();
        // Every fill from the fifth (the pool has four cells) is one a receiver read before;
        // one in 32 messages is timed, unless the cells are filled with non-temporal stores
        // (apart) or the ranks share CPUs.
        for n in 0..40 {
            assert_eq!(a.try_send(1, &header(n, 16 << 10), &pattern(n, 16 << 10)).unwrap(), Issued::Done);
            b.progress(usize::MAX, &mut sink).unwrap();
        }
        assert_eq!(sink.msgs.len(), 40);
        assert_eq!(slow(&mut a, 1).is_some(), timed, "{placement:?}, own CPUs {own_cpus}");
        assert_eq!(slow(&mut b, 0), None, "b filled nothing");
    }
}

#[test]
fn ring_full_would_block_then_progress_frees_it() {
    let (mut a, mut b) = pair(&cfg(16, 4, 4096));
    let mut sent = 0u64;
    while a.try_send(1, &header(sent, 8), &pattern(sent, 8)).unwrap() == Issued::Done {
        sent += 1;
        assert!(sent < 100);
    }
    assert_eq!(sent, 16, "a ring of 16 records holds 16 small messages");
    let mut sink = Collect::default();
    assert_eq!(b.progress(usize::MAX, &mut sink).unwrap(), 16);
    assert_eq!(b.progress(usize::MAX, &mut sink).unwrap(), 0);
    assert_eq!(a.try_send(1, &header(sent, 8), &pattern(sent, 8)).unwrap(), Issued::Done);
    for (i, (from, h, p)) in sink.msgs.iter().enumerate() {
        assert_eq!((*from, decode_header(h)), (0, (i as u64, 8)));
        assert_eq!(p, &pattern(i as u64, 8));
    }
}

#[test]
fn budget_limits_deliveries() {
    let (mut a, mut b) = pair(&Config::default());
    for n in 0..10 {
        assert_eq!(a.try_send(1, &header(n, 3), &pattern(n, 3)).unwrap(), Issued::Done);
    }
    let mut sink = Collect::default();
    assert_eq!(b.progress(4, &mut sink).unwrap(), 4);
    assert_eq!(b.progress(0, &mut sink).unwrap(), 0);
    assert_eq!(b.progress(100, &mut sink).unwrap(), 6);
    let order: Vec<u64> = sink.msgs.iter().map(|m| decode_header(&m.1).0).collect();
    assert_eq!(order, (0..10).collect::<Vec<_>>());
}

#[test]
fn cell_exhaustion_would_block_until_cells_come_back() {
    let (mut a, mut b) = pair(&cfg(64, 4, 4096));
    let big = 3000;
    assert!(big > a.inline_limit());
    for n in 0..4 {
        assert_eq!(a.try_send(1, &header(n, big), &pattern(n, big)).unwrap(), Issued::Done);
    }
    assert_eq!(a.try_send(1, &header(4, big), &pattern(4, big)).unwrap(), Issued::WouldBlock);
    // Inline messages still pass: only cells are exhausted.
    assert_eq!(a.try_send(1, &header(4, 8), &pattern(4, 8)).unwrap(), Issued::Done);
    let mut sink = Collect::default();
    assert_eq!(b.progress(usize::MAX, &mut sink).unwrap(), 5);
    for n in 5..9 {
        assert_eq!(a.try_send(1, &header(n, big), &pattern(n, big)).unwrap(), Issued::Done);
    }
    assert_eq!(b.progress(usize::MAX, &mut sink).unwrap(), 4);
    for (i, (_, h, p)) in sink.msgs.iter().enumerate() {
        let (n, len) = decode_header(h);
        assert_eq!(n, i as u64);
        assert_eq!(p, &pattern(n, len));
    }
    let too_big = vec![0u8; 4097];
    assert!(matches!(a.try_send(1, &header(0, 4097), &too_big), Err(Error::Transport { .. })));
}

/// Cells in flight to a peer that is lost (here: its ring to us is corrupt) come back to the
/// pool: sends to the others do not wait for it for ever.
#[test]
fn cells_held_by_a_lost_peer_come_back() {
    let mut t = mesh(&cfg(64, 4, 4096), "lost-cells", 3);
    let big = 3000;
    for n in 0..4 {
        assert_eq!(t[0].try_send(2, &header(n, big), &pattern(n, big)).unwrap(), Issued::Done);
    }
    assert_eq!(t[0].try_send(1, &header(0, big), &pattern(0, big)).unwrap(), Issued::WouldBlock);
    // Rank 2 never reads them; its ring to rank 0 turns out corrupt.
    assert_eq!(t[2].try_send(0, &header(0, 5), &pattern(0, 5)).unwrap(), Issued::Done);
    t[2].corrupt_for_test(0, 0, &[0xef, 0xbe], false);
    let mut sink = Collect::default();
    t[0].progress(usize::MAX, &mut sink).unwrap();
    assert!(matches!(&sink.lost[..], [(2, _)]), "{:?}", sink.lost);
    assert_eq!(t[0].try_send(1, &header(0, big), &pattern(0, big)).unwrap(), Issued::Done);
    let mut at_1 = Collect::default();
    assert_eq!(t[1].progress(usize::MAX, &mut at_1).unwrap(), 1);
    assert_eq!(at_1.msgs[0].2, pattern(0, big));
}

#[test]
fn corrupt_record_is_a_protocol_error() {
    // Bytes 2..16 of a record (after the stamp): kind, reserved byte, compact header (10 bytes),
    // payload length (u16).
    let image = |kind: u8, plen: u16| {
        let mut img = vec![kind, 0];
        img.extend([0; 10]);
        img.extend(plen.to_le_bytes());
        img
    };
    // (offset, bytes, publish): garbage stamp; unknown kind; 113 bytes claimed in a record; a
    // body over the inline limit; a cell index outside the pool (bytes 56..64: index, length);
    // the reserved byte set.
    let cases: Vec<(usize, Vec<u8>, bool)> = vec![
        (0, vec![0xef, 0xbe], false),
        (2, image(9, 0), true),
        (2, image(1, 113), true),
        (2, image(2, u16::MAX), true),
        (56, [9999u32.to_le_bytes(), 8u32.to_le_bytes()].concat(), false),
        (2, [&[1u8, 1][..], &image(1, 3)[2..]].concat(), true),
    ];
    for (i, (offset, bytes, publish)) in cases.iter().enumerate() {
        let (mut a, mut b) = pair(&Config::default());
        assert_eq!(a.try_send(1, &header(0, 5), &pattern(0, 5)).unwrap(), Issued::Done);
        a.corrupt_for_test(1, *offset, bytes, *publish);
        if i == 4 {
            a.corrupt_for_test(1, 2, &image(4, 0), true); // a cell message naming that cell
        }
        let mut sink = Collect::default();
        assert_eq!(b.progress(usize::MAX, &mut sink).unwrap(), 1);
        match &sink.lost[..] {
            [(0, what)] => {
                assert!(what.contains("protocol") && (what.contains("record") || what.contains("cell")), "{what}")
            }
            other => panic!("case {i}: expected rank 0 lost by a protocol error, got {other:?}"),
        }
        assert_eq!(sink.msgs.len(), 1, "the good message before the corrupt one was delivered");
        // The corrupt peer is not polled again; no panic, no repeated error.
        assert_eq!(b.progress(usize::MAX, &mut sink).unwrap(), 0);
    }
}

/// Segments are memory files opened through their owner's `/proc/<pid>/fd`: nothing of them is
/// named in `/dev/shm`, and once connected the owners close them; the rings still work.
#[test]
fn segments_are_named_nowhere_and_closed_once_connected() {
    let job = job("clean");
    let cfg = Config::default();
    let mut a = ShmTransport::new(&cfg, &job, 0, 2).unwrap().with_host(HOST);
    let mut b = ShmTransport::new(&cfg, &job, 1, 2).unwrap().with_host(HOST);
    assert!(dev_shm_entries("polyrail-").iter().all(|n| !n.contains(&job)));
    let path = a.segment_path().expect("open until connected");
    assert!(path.starts_with(&format!("/proc/{}/fd/", std::process::id())), "{path}");
    let target = std::fs::read_link(&path).unwrap();
    assert!(target.to_string_lossy().starts_with("/memfd:polyrail-segment"), "{target:?}");
    let (aa, ba) = (a.address(), b.address());
    assert!(matches!(a.add_peer(&peer(1), &ba), Reach::Yes(_)));
    assert!(matches!(b.add_peer(&peer(0), &aa), Reach::Yes(_)));
    a.connected().unwrap();
    b.connected().unwrap();
    assert_eq!((a.segment_path(), b.segment_path()), (None, None));
    assert_eq!(a.try_send(1, &header(0, 1), &[7]).unwrap(), Issued::Done);
    let mut sink = Collect::default();
    assert_eq!(b.progress(8, &mut sink).unwrap(), 1);
}

/// Files another process (another user, say) put in `/dev/shm` under the names segments once
/// had, empty or with a header naming a live process and a date in the future, stop no job and
/// are left alone: segments have no name there. (Before, every job of that id failed: "a job
/// with the same id owns it".)
#[test]
fn squatted_names_in_dev_shm_stop_no_job() {
    let job = job("squat");
    let uid = unsafe_uid();
    let squatted: Vec<String> = (0..2).map(|r| format!("/dev/shm/polyrail-{uid}-{job}-{r}")).collect();
    if std::fs::write(&squatted[0], b"").is_err() {
        eprintln!("skipped: /dev/shm is not writable here");
        return;
    }
    // A header-like start naming this (live) process, dated a day ahead.
    let mut forged = b"PRLSHM01".to_vec();
    forged.extend_from_slice(&[5, 0, 0, 0]);
    forged.extend_from_slice(&std::process::id().to_le_bytes().repeat(12));
    std::fs::write(&squatted[1], &forged).unwrap();
    let f = std::fs::File::options().write(true).open(&squatted[1]).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(86400)).unwrap();
    let cfg = Config::default();
    let made = (ShmTransport::new(&cfg, &job, 0, 2), ShmTransport::new(&cfg, &job, 1, 2));
    let (mut a, mut b) = match made {
        (Ok(a), Ok(b)) => (a.with_host(HOST), b.with_host(HOST)),
        other => {
            for s in &squatted {
                let _ = std::fs::remove_file(s);
            }
            panic!("a squatted name stopped the job: {other:?}");
        }
    };
    let (aa, ba) = (a.address(), b.address());
    assert!(matches!(a.add_peer(&peer(1), &ba), Reach::Yes(_)));
    assert!(matches!(b.add_peer(&peer(0), &aa), Reach::Yes(_)));
    assert_eq!(a.try_send(1, &header(0, 1), &[7]).unwrap(), Issued::Done);
    let mut sink = Collect::default();
    assert_eq!(b.progress(8, &mut sink).unwrap(), 1);
    drop((a, b));
    let left: Vec<bool> = squatted.iter().map(|s| std::path::Path::new(s).exists()).collect();
    for s in &squatted {
        let _ = std::fs::remove_file(s);
    }
    assert_eq!(left, [true, true], "someone else's files were removed");
}

#[test]
fn refusals_say_why() {
    let job = job("refuse");
    let cfg = Config::default();
    let mut a = ShmTransport::new(&cfg, &job, 0, 3).unwrap().with_host(HOST);
    let b = ShmTransport::new(&cfg, &job, 1, 3).unwrap().with_host(HOST);
    let other = ShmTransport::new(&shm_config(cfg.clone(), 512, 128, 16 << 10), &job, 2, 3).unwrap().with_host(HOST);
    let no = |r: Reach| match r {
        Reach::No(why) => why,
        Reach::Yes(y) => panic!("expected a refusal, got Yes({y})"),
    };
    let mut far = peer(1);
    far.host = "elsewhere".into();
    assert!(no(a.add_peer(&far, &b.address())).contains("different host"));
    assert!(no(a.add_peer(&peer(0), &a.address())).contains("own rank"));
    assert!(no(a.add_peer(&peer(1), b"garbage")).contains("bad shm address"));
    assert!(no(a.add_peer(&peer(1), &b.address()[..20])).contains("truncated"));
    let why = no(a.add_peer(&peer(2), &other.address()));
    assert!(why.contains("POLYRAIL_SHM_SLOTS") && why.contains("512"), "{why}");
    // The address of rank 1 offered as rank 2's.
    assert!(no(a.add_peer(&peer(2), &b.address())).contains("rank"));
    assert!(no(a.add_peer(&peer(7), &b.address())).contains("outside"));
    assert!(matches!(a.try_send(1, &header(0, 0), &[]), Err(Error::Transport { .. })));
    // A segment whose owner is not the pid the job gave for the rank: its exit would go unseen.
    let mut impostor = peer(1);
    impostor.pid += 1;
    assert!(no(a.add_peer(&impostor, &b.address())).contains("but rank 1 is pid"));
    assert!(matches!(a.add_peer(&peer(1), &b.address()), Reach::Yes(_)));
}

/// A segment larger than the memory there is: refused before anything is allocated, naming
/// the rank, the job and the size.
#[test]
fn segment_creation_errors_name_rank_and_size() {
    let job = job("huge");
    let huge = cfg_huge();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let avail_kib: u64 = mem
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(u64::MAX);
    if avail_kib.saturating_mul(1024) >= 60 << 30 {
        eprintln!("skipped: this machine has 64 GiB for a segment");
        return;
    }
    match ShmTransport::new(&huge, &job, 1, 2) {
        Err(Error::Io { context, source }) => {
            assert!(context.contains("rank 1 of job") && context.contains(&job), "{context}");
            assert!(context.contains("bytes"), "{context}");
            assert!(source.to_string().contains("No space left"), "{source}");
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

fn cfg_huge() -> Config {
    cfg(256, 65536, 1 << 20)
}

#[test]
fn bad_configuration_is_a_config_error() {
    let e = ShmTransport::new(&cfg(100, 4, 4096), &job("cfg"), 0, 1).unwrap_err().to_string();
    assert!(e.contains("POLYRAIL_SHM_SLOTS") && e.contains("100"), "{e}");
    // The same ranges and words as the variables' own checks.
    let e = ShmTransport::new(&cfg(256, 2, 4096), &job("cfg"), 0, 1).unwrap_err().to_string();
    assert!(e.contains("POLYRAIL_SHM_CELLS") && e.contains("a whole number from 4 to 65536"), "{e}");
    let e = ShmTransport::new(&cfg(256, 4, 100), &job("cfg"), 0, 1).unwrap_err().to_string();
    assert!(e.contains("POLYRAIL_SHM_CELL_SIZE") && e.contains("from 4k to 1m"), "{e}");
    assert!(ShmTransport::new(&Config::default(), &job("cfg"), 3, 2).is_err());
}

// ---- two processes ----

/// Entry point of the child processes (does nothing in a normal test run).
#[test]
fn child_entry() {
    let Some(role) = child_role() else { return };
    let job = std::env::var("PRSHM_JOB").unwrap();
    let mut t = ShmTransport::new(&stream_cfg(), &job, 1, 2).unwrap().with_host(HOST);
    let addr0 = unhex(&hear());
    let mut p0 = peer(0);
    p0.pid = std::os::unix::process::parent_id(); // rank 0 is the test that started this one
    let reach = t.add_peer(&p0, &addr0);
    assert!(matches!(reach, Reach::Yes(_)), "{reach:?}");
    if role == "shrink" {
        // Both segments are open and mapped here (rank 0 has not connected yet).
        say(&shrink_segments(&job));
    }
    say(&hex(&t.address()));
    assert_eq!(hear(), "go");
    t.connected().unwrap();
    say("connected");
    match role.as_str() {
        "echo" | "shrink" => {
            echo(&mut t, 0, &sizes());
            t.finalize();
            say("done");
        }
        "die" => {
            assert_eq!(hear(), "die");
            std::process::exit(3);
        }
        other => panic!("unknown role {other}"),
    }
}

/// Rank 0 here, rank 1 in a child process; returns both once connected.
fn connect_child(role: &str) -> (ShmTransport, ChildProc, String) {
    let job = job("proc");
    let mut t = ShmTransport::new(&stream_cfg(), &job, 0, 2).unwrap().with_host(HOST);
    let mut child = ChildProc::spawn("child_entry", role, &[("PRSHM_JOB", job.clone())]);
    child.send(&hex(&t.address()));
    let addr1 = unhex(&child.recv());
    let mut p1 = peer(1);
    p1.pid = child.pid();
    assert!(matches!(t.add_peer(&p1, &addr1), Reach::Yes(_)));
    t.connected().unwrap();
    child.send("go");
    assert_eq!(child.recv(), "connected");
    (t, child, job)
}

#[test]
fn two_processes_stream_every_size() {
    let (mut t, mut child, job) = connect_child("echo");
    assert!(dev_shm_entries(&format!("polyrail-{}-{job}", unsafe_uid())).is_empty());
    send_and_check_echoes(&mut t, 1, &sizes());
    assert_eq!(child.recv(), "done");
    assert!(child.wait().success());
    let mut sink = Collect::default();
    t.check_peers(&mut sink);
    assert_eq!(sink.lost.len(), 1);
    assert!(sink.lost[0].1.contains("has finished (finalized"), "{:?}", sink.lost);
}

#[test]
fn a_peer_that_dies_is_reported_once() {
    let (mut t, mut child, _job) = connect_child("die");
    let mut sink = Collect::default();
    t.check_peers(&mut sink);
    assert!(sink.lost.is_empty(), "alive peer reported: {:?}", sink.lost);
    child.send("die");
    assert!(!child.wait().success());
    t.check_peers(&mut sink);
    t.check_peers(&mut sink);
    assert_eq!(sink.lost.len(), 1, "{:?}", sink.lost);
    assert_eq!(sink.lost[0].0, 1);
    assert!(sink.lost[0].1.contains("exited without finalizing"), "{:?}", sink.lost);
}

/// Tries to truncate every shm segment this process can reach, as a hostile process of the
/// same user (or a peer) would: by a name of the job in `/dev/shm`, through the descriptors of
/// this process and its parent, and through `/proc/self/map_files` (where allowed). Says how
/// many it tried and how many it shrank.
fn shrink_segments(job: &str) -> String {
    let mut paths: Vec<std::path::PathBuf> = dev_shm_entries("polyrail-")
        .iter()
        .filter(|n| n.contains(job))
        .map(|n| format!("/dev/shm/{n}").into())
        .collect();
    let parent = std::os::unix::process::parent_id();
    for dir in ["/proc/self/fd".to_string(), format!("/proc/{parent}/fd"), "/proc/self/map_files".to_string()] {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            if target.to_string_lossy().starts_with("/memfd:polyrail-segment") {
                paths.push(e.path());
            }
        }
    }
    let shrunk = paths
        .iter()
        .filter(|p| std::fs::OpenOptions::new().write(true).open(p).and_then(|f| f.set_len(0)).is_ok())
        .count();
    format!("tried {} shrank {shrunk}", paths.len())
}

/// A segment cannot be truncated under the processes that map it, by anyone: the peer that
/// tries (by every way to the file it has) gets refused, and the pair streams every size
/// after. (Before, a truncated segment killed the next process to touch it with SIGBUS.)
#[test]
fn a_segment_cannot_be_truncated_under_its_peers() {
    let job = job("shrink");
    let mut t = ShmTransport::new(&stream_cfg(), &job, 0, 2).unwrap().with_host(HOST);
    let mut child = ChildProc::spawn("child_entry", "shrink", &[("PRSHM_JOB", job.clone())]);
    child.send(&hex(&t.address()));
    let report = child.recv();
    let n: Vec<usize> = report.split(' ').filter_map(|w| w.parse().ok()).collect();
    assert!(n.len() == 2 && n[0] >= 2 && n[1] == 0, "the child {report}");
    let addr1 = unhex(&child.recv());
    let mut p1 = peer(1);
    p1.pid = child.pid();
    assert!(matches!(t.add_peer(&p1, &addr1), Reach::Yes(_)));
    t.connected().unwrap();
    child.send("go");
    assert_eq!(child.recv(), "connected");
    send_and_check_echoes(&mut t, 1, &sizes());
    assert_eq!(child.recv(), "done");
    assert!(child.wait().success());
}

fn unsafe_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The doorbell: a receiver that arms and sleeps is woken by every message, whether senders
/// fence before they read its `sleeping` flag or count on its global barrier (both endpoints
/// here are in one process, registered for that barrier where the kernel offers it). A lost
/// wake-up sleeps the whole timeout (3 s); no wait may come near it.
#[test]
fn sleepers_are_woken_by_every_message() {
    let (mut a, mut b) = pair(&Config::default());
    const ROUNDS: u64 = 200;
    let sender = std::thread::spawn(move || {
        for n in 0..ROUNDS {
            // Long enough for the receiver to go to sleep, varied so the send lands anywhere in
            // its arm / sleep sequence.
            std::thread::sleep(Duration::from_micros(200 + (n % 7) * 150));
            let hdr = header(2 * n, 8);
            while a.try_send(1, &hdr, &pattern(2 * n, 8)).unwrap() != Issued::Done {}
        }
        a
    });
    let mut sink = Collect::default();
    // Messages may arrive two at a time when this thread falls behind: count them, not rounds.
    while sink.msgs.len() < ROUNDS as usize {
        let start = Instant::now();
        while b.progress(usize::MAX, &mut sink).unwrap() == 0 {
            if b.arm() {
                b.sleep(Duration::from_secs(3));
            }
            b.disarm();
            let waited = start.elapsed();
            assert!(waited < Duration::from_millis(1500), "waited {waited:?} after {} messages", sink.msgs.len());
        }
    }
    let _a = sender.join().unwrap();
    assert_eq!(sink.msgs.len(), ROUNDS as usize);
}

/// The line-transfer time `t` observed towards `peer`, if any.
fn line(t: &mut ShmTransport, peer: u32) -> Option<u32> {
    t.observe(peer, Observe::LineTransfer).and_then(Observation::line_transfer)
}

/// Whether `t` observed its copies to `peer` slow, if it timed them.
fn slow(t: &mut ShmTransport, peer: u32) -> Option<bool> {
    t.observe(peer, Observe::CopiesSlow).and_then(Observation::flag)
}
