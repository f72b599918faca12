//! The DirectIB channel over the software provider, two endpoints in one process.

use polyrail_core::{Error, Issued, Lifetime, MemHandle, OneSided, PeerAccess, Reach, Region, RegionMut, Transport};
use polyrail_ib::provider::{Access, Completion, Opcode, Provider, WcStatus, WorkRequest};
use polyrail_ib::IbSettings;
use polyrail_ib::{DirectIb, SoftProvider};

mod common;

use common::{hdr_of, info, pair, request, Recorder};

fn soft_pair(settings: &IbSettings) -> (DirectIb<SoftProvider>, DirectIb<SoftProvider>) {
    pair(SoftProvider::new, settings)
}

#[test]
fn credits_hold_a_fast_sender_back_without_loss() {
    common::credits_hold_a_fast_sender_back(SoftProvider::new, &IbSettings::default());
}

#[test]
fn two_floods_never_deadlock() {
    common::two_floods_never_deadlock(SoftProvider::new, &IbSettings::default());
}

#[test]
fn like_messages_go_compact_at_a_packet_mtu() {
    let compact = common::like_messages_go_compact(|| SoftProvider::with_mtu(1024), &IbSettings::default(), 1024);
    assert!(compact > 200, "{compact}");
    // Without packets nothing is saved: every packet framed, as the soft provider runs by default.
    assert_eq!(common::like_messages_go_compact(SoftProvider::new, &IbSettings::default(), 1024), 0);
}

/// Provider level: a write with immediate consumes a posted receive, whose completion carries
/// the immediate; with none posted it fails as receiver-not-ready; a read cannot carry one.
#[test]
fn soft_writes_with_immediate_consume_posted_receives() {
    let (mut target, mut initiator) = (SoftProvider::new(), SoftProvider::new());
    let mut mem = vec![0u8; 64];
    let mr = unsafe { target.register(mem.as_mut_ptr(), 64, Access::ALL).unwrap() };
    let mut src = vec![7u8; 16];
    let src_mr = unsafe { initiator.register(src.as_mut_ptr(), 16, Access::ALL).unwrap() };
    let (tq, tnum) = target.create_qp(2).unwrap();
    let (iq, inum) = initiator.create_qp(0).unwrap();
    target.connect(tq, &initiator.endpoint(), inum).unwrap();
    initiator.connect(iq, &target.endpoint(), tnum).unwrap();
    initiator.ready_to_send(iq).unwrap();
    target.post_recv(tq, 41).unwrap();
    target.post_recv(tq, 42).unwrap();
    assert!(target.post_recv(tq, 43).unwrap_err().to_string().contains("full"));
    let wr = |imm| WorkRequest {
        imm: Some(imm),
        ..request(1, Opcode::Write, src.as_ptr() as u64, src_mr.lkey, mr.addr, mr.rkey, 16)
    };
    let mut out = Vec::new();
    for imm in [0xdead_beef, 5] {
        initiator.post(iq, &wr(imm)).unwrap();
        out.clear();
        initiator.poll(&mut out, 4);
        assert_eq!((out[0].status, out[0].imm), (WcStatus::Success, None));
    }
    out.clear();
    assert_eq!(target.poll(&mut out, 8), 2);
    assert_eq!(out.iter().map(|c| (c.wr_id, c.imm)).collect::<Vec<_>>(), [(41, Some(0xdead_beef)), (42, Some(5))]);
    assert_eq!(&mem[..16], &[7u8; 16]);
    // Both receives used: the next write with immediate finds none.
    initiator.post(iq, &wr(6)).unwrap();
    out.clear();
    initiator.poll(&mut out, 4);
    assert_eq!(out[0].status, WcStatus::ReceiverNotReady);
    let read =
        WorkRequest { imm: Some(1), ..request(2, Opcode::Read, src.as_ptr() as u64, src_mr.lkey, mr.addr, mr.rkey, 8) };
    assert!(initiator.post(iq, &read).is_err());
}

#[test]
fn get_and_put_move_registered_memory() {
    let (mut a, mut b) = soft_pair(&IbSettings { bounce: 0, ..IbSettings::default() });
    let (mut ra, mut rb) = (Recorder::default(), Recorder::default());
    let src: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31) as u8).collect();
    let key =
        *a.register(Region { ptr: src.as_ptr(), len: src.len() }, PeerAccess::Read, Lifetime::Transfer).unwrap().key();
    let mut dst = vec![0u8; 1_000_000];
    let into = RegionMut { ptr: dst.as_mut_ptr(), len: dst.len() };
    assert_eq!(b.get(0, &key, 1_000_000, into, 7).unwrap(), Issued::Pending);
    b.progress(64, &mut rb).unwrap();
    assert!(matches!(rb.completed[..], [(7, Ok(()))]));
    assert_eq!(&dst[..], &src[1_000_000..2_000_000]);
    // Put into exposed memory.
    let mut target = vec![0u8; 4096];
    let tkey = *a
        .register(Region { ptr: target.as_mut_ptr(), len: target.len() }, PeerAccess::Write, Lifetime::Transfer)
        .unwrap()
        .key();
    assert_eq!(b.put(0, Region { ptr: dst.as_ptr(), len: 100 }, &tkey, 10, 8).unwrap(), Issued::Pending);
    b.progress(64, &mut rb).unwrap();
    assert!(matches!(rb.completed[1], (8, Ok(()))));
    assert_eq!(&target[10..110], &dst[..100]);
    // Past the exposed range: refused before anything is posted, the connection stays.
    let mut small = vec![0xeeu8; 64];
    let into = RegionMut { ptr: small.as_mut_ptr(), len: 64 };
    let e = b.get(0, &tkey, 4096 - 32, into, 9).unwrap_err();
    assert!(e.to_string().contains("outside the 4096 bytes"), "{e}");
    // A key forged to claim more than was registered: the provider refuses it with a
    // completion error, nothing is read, and the failed queue pair takes the peer down.
    let e = b.get(0, &common::widened(&tkey, 4096), 4096 - 32, into, 10).unwrap();
    assert_eq!(e, Issued::Pending);
    b.progress(64, &mut rb).unwrap();
    match &rb.completed[2] {
        (10, Err(e)) => assert!(e.to_string().contains("remote access error"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(small.iter().all(|&x| x == 0xee));
    assert!(matches!(rb.lost[..], [(0, Error::PeerLost { .. })]));
    a.deregister(&MemHandle::new(key, &Lifetime::Transfer), 0..0);
    a.deregister(&MemHandle::new(tkey, &Lifetime::Transfer), 0..0);
    a.progress(64, &mut ra).unwrap();
}

/// A source exposed for reading cannot be written through its key.
#[test]
fn read_only_exposures_refuse_writes() {
    let (mut a, mut b) = soft_pair(&IbSettings { bounce: 0, ..IbSettings::default() });
    let mut rb = Recorder::default();
    let src = vec![7u8; 4096];
    let key =
        *a.register(Region { ptr: src.as_ptr(), len: src.len() }, PeerAccess::Read, Lifetime::Transfer).unwrap().key();
    let junk = [0u8; 16];
    assert_eq!(b.put(0, Region { ptr: junk.as_ptr(), len: 16 }, &key, 0, 1).unwrap(), Issued::Pending);
    b.progress(64, &mut rb).unwrap();
    assert!(matches!(&rb.completed[..], [(1, Err(_))]), "{:?}", rb.completed);
    assert!(std::hint::black_box(&src).iter().all(|&x| x == 7));
    a.deregister(&MemHandle::new(key, &Lifetime::Transfer), 0..0);
}

/// Medium messages go through bounce buffers on both sides: a get lands in the user's buffer
/// at its completion, a put into an exposed destination when the exposure ends, and only the
/// bytes the owner names; with every slot busy, exposures register instead.
#[test]
fn medium_messages_bounce_and_land_in_place() {
    let settings = IbSettings::default();
    assert_eq!(settings.bounce, 64 << 10);
    let (mut a, mut b) = soft_pair(&settings);
    let (mut ra, mut rb) = (Recorder::default(), Recorder::default());
    assert!(a.describe().contains("rendezvous up to 64k through 64 bounce buffers"), "{}", a.describe());
    // More sources than slots, so the last ones register.
    let sources: Vec<Vec<u8>> = (0..70u32).map(|i| (0..10_000u32).map(|j| (j * 7 + i) as u8).collect()).collect();
    let handles: Vec<_> = sources
        .iter()
        .map(|s| a.register(Region { ptr: s.as_ptr(), len: s.len() }, PeerAccess::Read, Lifetime::Transfer).unwrap())
        .collect();
    let mut outs = vec![vec![0u8; 10_000]; 70];
    for (i, (h, o)) in handles.iter().zip(&mut outs).enumerate() {
        let into = RegionMut { ptr: o.as_mut_ptr(), len: o.len() };
        assert_eq!(b.get(0, h.key(), 0, into, i as u64).unwrap(), Issued::Pending);
        b.progress(64, &mut rb).unwrap();
    }
    assert_eq!(rb.completed.len(), 70);
    assert!(rb.completed.iter().all(|(_, r)| r.is_ok()));
    assert!(outs == sources, "gets through bounce buffers: data differs");
    for h in &handles {
        a.deregister(h, 0..0);
    }
    // A destination: nothing reaches it before the exposure ends, then only `written`.
    let mut target = vec![0x5au8; 8192];
    let tkey = *a
        .register(Region { ptr: target.as_mut_ptr(), len: target.len() }, PeerAccess::Write, Lifetime::Transfer)
        .unwrap()
        .key();
    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    // From a bounce slot: the source is free at once and the write ordered before later packets.
    assert_eq!(b.put(0, Region { ptr: data.as_ptr(), len: data.len() }, &tkey, 100, 99).unwrap(), Issued::Ordered);
    b.progress(64, &mut rb).unwrap();
    assert!(matches!(rb.completed.last(), Some((99, Ok(())))));
    assert!(std::hint::black_box(&target).iter().all(|&x| x == 0x5a), "the put went to a bounce buffer");
    a.deregister(&MemHandle::new(tkey, &Lifetime::Transfer), 100..1100);
    assert_eq!(&target[100..1100], &data[..]);
    assert!(target[..100].iter().chain(&target[1100..]).all(|&x| x == 0x5a));
    a.progress(64, &mut ra).unwrap();
    assert!(ra.lost.is_empty() && rb.lost.is_empty());
}

/// Provider level: a wrong key, an offset past the region, a forged length and a deregistered
/// key each end in a remote access error, and memory outside the region is never touched.
#[test]
fn soft_provider_checks_keys_and_bounds() {
    let mut target = SoftProvider::new();
    let mut initiator = SoftProvider::new();
    // A guarded buffer: the region is the middle 4 KiB.
    let mut mem = vec![0x11u8; 3 * 4096];
    let region_start = unsafe { mem.as_mut_ptr().add(4096) };
    let mr = unsafe { target.register(region_start, 4096, Access::ALL).unwrap() };
    let mut src = vec![0x99u8; 8192];
    let src_mr = unsafe { initiator.register(src.as_mut_ptr(), src.len(), Access::ALL).unwrap() };
    let endpoint = target.endpoint();
    let fresh_qp = |p: &mut SoftProvider| {
        let (qp, _) = p.create_qp(0).unwrap();
        p.connect(qp, &endpoint, 1).unwrap();
        p.ready_to_send(qp).unwrap();
        qp
    };
    let base = mr.addr;
    let cases: Vec<(&str, u64, usize, u32, Opcode)> = vec![
        ("in bounds", base + 100, 200, mr.rkey, Opcode::Write),
        ("wrong key", base, 8, mr.rkey ^ 0x10000, Opcode::Write),
        ("offset past the end", base + 4096, 8, mr.rkey, Opcode::Write),
        ("forged length", base + 4000, 200, mr.rkey, Opcode::Write),
        ("before the start", base - 8, 16, mr.rkey, Opcode::Write),
        ("wrapping length", base + 8, usize::MAX - 4, mr.rkey, Opcode::Read),
        ("read past the end", base + 4000, 200, mr.rkey, Opcode::Read),
    ];
    let mut out: Vec<Completion> = Vec::new();
    for (what, remote_addr, len, rkey, opcode) in cases {
        let qp = fresh_qp(&mut initiator);
        let len_ok = len <= src.len();
        let wr = request(1, opcode, src.as_ptr() as u64, src_mr.lkey, remote_addr, rkey, len);
        initiator.post(qp, &wr).unwrap();
        out.clear();
        assert_eq!(initiator.poll(&mut out, 8), 1);
        let expect = if what == "in bounds" {
            WcStatus::Success
        } else if !len_ok {
            WcStatus::LocalProtection
        } else {
            WcStatus::RemoteAccess
        };
        assert_eq!(out[0].status, expect, "{what}");
        // A failed queue pair flushes what follows.
        if expect != WcStatus::Success {
            initiator.post(qp, &WorkRequest { rkey: mr.rkey, remote_addr: base, len: 8, ..wr }).unwrap();
            out.clear();
            initiator.poll(&mut out, 8);
            assert_eq!(out[0].status, WcStatus::Flushed, "{what}");
        }
    }
    assert!(mem[..4096].iter().all(|&x| x == 0x11), "bytes before the region were written");
    assert!(mem[8192..].iter().all(|&x| x == 0x11), "bytes after the region were written");
    assert!(mem[4096 + 100..4096 + 300].iter().all(|&x| x == 0x99));
    // After deregistration the key is refused.
    target.deregister(&mr);
    let qp = fresh_qp(&mut initiator);
    let wr = request(2, Opcode::Write, src.as_ptr() as u64, src_mr.lkey, base, mr.rkey, 8);
    initiator.post(qp, &wr).unwrap();
    out.clear();
    initiator.poll(&mut out, 8);
    assert_eq!(out[0].status, WcStatus::RemoteAccess);
}

/// A compact packet with an unknown immediate format, or before any framed packet (no header to
/// follow), fails the peer with a reason.
#[test]
fn malformed_compact_packets_fail_the_peer_with_a_reason() {
    for (imm, why) in [(2u32 << 28 | 8, "unknown immediate format 2"), (1 << 28 | 8, "before any framed one")] {
        let (_a, b) = pair(|| SoftProvider::with_mtu(1024), &IbSettings::default());
        forged_packet_fails_rank_0(b, vec![1u8; 8], 56, Some(imm), why);
    }
}

/// Writes `data` at `offset` of the first block of rank 0's ring in `b` (with immediate `imm`)
/// from a second provider, and checks that `b` then fails rank 0 with a reason containing `why`.
fn forged_packet_fails_rank_0(
    mut b: DirectIb<SoftProvider>,
    mut data: Vec<u8>,
    offset: u64,
    imm: Option<u32>,
    why: &str,
) {
    // b's address: "PRIB", name length + "soft", endpoint length + 34 bytes, rings, rkey.
    let addr = b.address();
    let at = 4 + 1 + 4 + 4 + 34;
    let rings = u64::from_le_bytes(addr[at..at + 8].try_into().unwrap());
    let rkey = u32::from_le_bytes(addr[at + 8..at + 12].try_into().unwrap());
    let mut forger = SoftProvider::new();
    let mr = unsafe { forger.register(data.as_mut_ptr(), data.len(), Access::ALL).unwrap() };
    let (qp, _) = forger.create_qp(0).unwrap();
    // b's queue pair for rank 0 is its first: number 1.
    forger.connect(qp, &addr[13..47], 1).unwrap();
    forger.ready_to_send(qp).unwrap();
    let wr = request(0, Opcode::Write, data.as_ptr() as u64, mr.lkey, rings + offset, rkey, data.len());
    forger.post(qp, &WorkRequest { imm, ..wr }).unwrap();
    let mut out = Vec::new();
    forger.poll(&mut out, 4);
    assert_eq!(out[0].status, WcStatus::Success);
    let mut rb = Recorder::default();
    b.progress(64, &mut rb).unwrap();
    // A protocol error, not a loss: the forger still runs.
    match &rb.lost[..] {
        [(0, Error::Protocol { peer: 0, what })] => assert!(what.contains(why), "{what}"),
        other => panic!("{why}: {other:?}"),
    }
    // ... and is cut off: its queue pair is in the error state, so its next write into b's
    // memory fails.
    forger.post(qp, &WorkRequest { imm, ..wr }).unwrap();
    out.clear();
    forger.poll(&mut out, 4);
    assert_eq!(out[0].status, WcStatus::RetryExceeded, "{why}: a faulty peer still wrote");
}

/// A peer that finalizes says BYE; one that vanishes is found by the heartbeat.
#[test]
fn finished_and_lost_peers_are_told_apart() {
    let (mut a, mut b) = soft_pair(&IbSettings::default());
    let mut rb = Recorder::default();
    a.finalize();
    b.progress(64, &mut rb).unwrap();
    b.check_peers(&mut rb);
    assert!(rb.lost.is_empty(), "a finalized peer is reported only once it is gone");
    drop(a);
    b.check_peers(&mut rb);
    assert!(matches!(rb.lost[..], [(0, Error::PeerFinished { rank: 0 })]), "{:?}", rb.lost);

    // A peer whose process is gone: point a transport at a child process that exits.
    let mut child = std::process::Command::new("sleep").arg("0").spawn().unwrap();
    child.wait().unwrap();
    let mut c = DirectIb::new(SoftProvider::new(), &IbSettings::default(), 0, 2).unwrap();
    let d = DirectIb::new(SoftProvider::new(), &IbSettings::default(), 1, 2).unwrap();
    // Forge d's endpoint to name the dead child's pid: the connect probe refuses it.
    let mut addr = d.address();
    let pid = child.id().to_le_bytes();
    let at = addr.windows(4).position(|w| w == std::process::id().to_le_bytes()).unwrap();
    addr[at..at + 4].copy_from_slice(&pid);
    match c.add_peer(&info(1), &addr) {
        Reach::No(why) => assert!(why.contains("cannot read the registration table"), "{why}"),
        Reach::Yes(_) => panic!("a dead process was reached"),
    }
}

/// A peer that sent, finalized and exited before its packets were read: a failed write of ours
/// (here the heartbeat) reports it only after its last message, and as finished, not lost (the
/// race a final barrier over two nodes hit in CI).
#[test]
fn last_messages_of_a_finished_peer_arrive_before_it_is_reported() {
    let (mut a, mut b) = soft_pair(&IbSettings::default());
    assert!(matches!(a.try_send(1, &hdr_of(7), b"last").unwrap(), Issued::Done));
    a.finalize();
    drop(a);
    let mut rb = Recorder::default();
    b.check_peers(&mut rb);
    assert_eq!(rb.messages.len(), 1, "the message sent before BYE is delivered");
    assert_eq!((rb.messages[0].0, rb.messages[0].1, &rb.messages[0].2[..]), (0, hdr_of(7), &b"last"[..]));
    assert!(matches!(rb.lost[..], [(0, Error::PeerFinished { rank: 0 })]), "{:?}", rb.lost);
}

/// A forged block in the ring (unknown kind, impossible length, too many credits) is a named
/// protocol error for that peer, not a crash or an out-of-bounds read.
#[test]
fn malformed_packets_fail_the_peer_with_a_reason() {
    let cases: [(u64, &str); 3] = [
        (9 << 32, "unknown packet kind 9"),
        (1 << 32 | 100_000, "exceeds the block's payload capacity"),
        (2 << 32 | 500 << 48, "returns 500 credits"),
    ];
    for (word0, why) in cases {
        let mut block = vec![0u8; 64];
        block[..8].copy_from_slice(&word0.to_le_bytes());
        // The tail of block 0 (empty payload): the block counts as landed.
        block[56..64].copy_from_slice(&0x5052_4942_7461_696c_u64.to_le_bytes());
        forged_packet_fails_rank_0(soft_pair(&IbSettings::default()).1, block, 0, None, why);
    }
    // A well-framed data packet whose engine header is not one.
    let mut block = vec![0u8; 64];
    block[..8].copy_from_slice(&(1u64 << 32).to_le_bytes());
    block[16] = 77;
    block[56..64].copy_from_slice(&0x5052_4942_7461_696c_u64.to_le_bytes());
    let why = "malformed ib packet: unknown packet kind 77";
    forged_packet_fails_rank_0(soft_pair(&IbSettings::default()).1, block, 0, None, why);
}

/// Provider level, with a link model (an emulation): an RDMA write from a device rank's memory
/// completes in `poll` at the model's time, in posting order, after a later-due transfer holds
/// back nothing posted before it; the endpoint carries node and domain, so the write takes the
/// adapter's read of local device memory and its write of the remote device's memory.
#[test]
fn soft_completions_wait_for_the_link_model() {
    use polyrail_ib::SoftLink;
    use polyrail_link::{Domain, LinkModel, Path, Profile};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    // 962 kB/s for the adapter's read of device memory: 1 MB takes about a second of model time.
    let model = Arc::new(LinkModel::in_dir(Profile::parse("prism/1000").unwrap(), dir.path(), "soft").unwrap());
    let link = |node, domain| SoftLink { model: model.clone(), node, domain };
    let mut target = SoftProvider::new().with_link(link(1, Domain::Device(1)));
    let mut initiator = SoftProvider::new().with_link(link(0, Domain::Device(2)));
    assert!(initiator.describe().contains("link model prism/1000 (emulation)"), "{}", initiator.describe());
    let len = 1 << 20;
    let mut mem = vec![0u8; len];
    let mr = unsafe { target.register(mem.as_mut_ptr(), len, Access::ALL).unwrap() };
    let mut src = vec![3u8; len];
    let src_mr = unsafe { initiator.register(src.as_mut_ptr(), len, Access::ALL).unwrap() };
    let (tq, tnum) = target.create_qp(0).unwrap();
    let (iq, inum) = initiator.create_qp(0).unwrap();
    target.connect(tq, &initiator.endpoint(), inum).unwrap();
    initiator.connect(iq, &target.endpoint(), tnum).unwrap();
    initiator.ready_to_send(iq).unwrap();
    let posted = Instant::now();
    initiator.post(iq, &request(1, Opcode::Write, src.as_ptr() as u64, src_mr.lkey, mr.addr, mr.rkey, len)).unwrap();
    initiator.post(iq, &request(2, Opcode::Write, src.as_ptr() as u64, src_mr.lkey, mr.addr, mr.rkey, 8)).unwrap();
    // The copy ran in the post but for the last 8 bytes, which land when the completion is due.
    assert_eq!(mem[0], 3);
    let mut out = Vec::new();
    if posted.elapsed() < Duration::from_millis(500) {
        assert_eq!(mem[len - 1], 0);
        assert_eq!(initiator.poll(&mut out, 4), 0);
    }
    // Model time: the write was reserved on the adapter's read of node 0's device memory, the
    // network out of 0 and into 1, and the adapter's write of node 1's device memory.
    let read_busy = model.busy_until(0, Path::AdapterReadsDevice).unwrap().unwrap();
    assert!(read_busy >= posted + Duration::from_millis(1_000), "{:?}", read_busy - posted);
    assert!(model.busy_until(1, Path::AdapterWritesDevice).unwrap().unwrap() > posted);
    assert!(model.busy_until(0, Path::NetOut).unwrap().unwrap() > posted);
    assert!(model.busy_until(1, Path::NetIn).unwrap().unwrap() > posted);
    assert!(model.busy_until(1, Path::AdapterReadsDevice).unwrap().unwrap() < posted);
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < 2 && Instant::now() < deadline {
        initiator.poll(&mut out, 4);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        out.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert!(Instant::now() >= read_busy);
    assert_eq!(mem[len - 1], 3);
    let (name, stats) = initiator.pacing().unwrap();
    assert_eq!((name.as_str(), stats.paced), ("prism/1000", 2));
    assert!(stats.delayed >= 1);
    model.remove_files();
}

/// Provider level, with a link model: a write with immediate completes the target's receive only
/// once the initiator's completion is due (the immediate lands from the initiator's `poll`).
#[test]
fn soft_receive_completions_wait_for_the_link_model() {
    use polyrail_ib::SoftLink;
    use polyrail_link::{Domain, LinkModel, Profile};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    // 6 MB/s on the network: 64 KiB take about 11 ms of model time.
    let model = Arc::new(LinkModel::in_dir(Profile::parse("prism/1000").unwrap(), dir.path(), "imm").unwrap());
    let link = |node| SoftLink { model: model.clone(), node, domain: Domain::Host };
    let (mut target, mut initiator) = (SoftProvider::new().with_link(link(1)), SoftProvider::new().with_link(link(0)));
    let len = 64 << 10;
    let mut mem = vec![0u8; len];
    let mr = unsafe { target.register(mem.as_mut_ptr(), len, Access::ALL).unwrap() };
    let mut src = vec![9u8; len];
    let src_mr = unsafe { initiator.register(src.as_mut_ptr(), len, Access::ALL).unwrap() };
    let (tq, tnum) = target.create_qp(2).unwrap();
    let (iq, inum) = initiator.create_qp(0).unwrap();
    target.connect(tq, &initiator.endpoint(), inum).unwrap();
    initiator.connect(iq, &target.endpoint(), tnum).unwrap();
    initiator.ready_to_send(iq).unwrap();
    target.post_recv(tq, 7).unwrap();
    let posted = Instant::now();
    let wr = request(1, Opcode::Write, src.as_ptr() as u64, src_mr.lkey, mr.addr, mr.rkey, len);
    initiator.post(iq, &WorkRequest { imm: Some(77), ..wr }).unwrap();
    let (mut got, mut out) = (Vec::new(), Vec::new());
    if posted.elapsed() < Duration::from_millis(5) {
        assert_eq!(target.poll(&mut got, 4), 0, "the receive completes only when the write is due");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.is_empty() && Instant::now() < deadline {
        initiator.poll(&mut out, 4);
        target.poll(&mut got, 4);
    }
    assert_eq!((got[0].wr_id, got[0].imm), (7, Some(77)));
    assert!(posted.elapsed() >= Duration::from_millis(10), "{:?}", posted.elapsed());
    assert_eq!(out[0].status, WcStatus::Success);
    assert_eq!(mem, src);
    model.remove_files();
}
