//! The DirectIB channel and the provider over real verbs (rdma-core), on the device that
//! `POLYRAIL_IB_DEVICE` / `POLYRAIL_IB_GID_INDEX` name (default: the first device, GID index 0),
//! two endpoints in one process. Soft-RoCE in a VM: `scripts/ib-vm-test.sh`.
//!
//! Without an RDMA device every test says it is skipped and passes, unless
//! `IB_TEST_REQUIRE_DEVICE=1` is set (then a missing device fails them).
#![cfg(feature = "verbs")]

mod common;

use common::{pair, request, until, Recorder};
use polyrail_core::{Error, Issued, Lifetime, MemHandle, OneSided, PeerAccess, Region, RegionMut, Transport};
use polyrail_ib::provider::{Access, Completion, MemoryRegion, Opcode, Provider, QpId, WcStatus, WorkRequest};
use polyrail_ib::verbs::VerbsProvider;
use polyrail_ib::IbSettings;
use polyrail_ib::{DirectIb, Unavailable};
use std::time::{Duration, Instant};

/// The settings from the environment, or `None` (test skipped) when there is no RDMA device.
fn settings(test: &str) -> Option<IbSettings> {
    let cfg = polyrail_core::Config::from_env().expect("POLYRAIL_* variables");
    let ib = IbSettings::from_config(&cfg).expect("POLYRAIL_IB_* variables");
    match VerbsProvider::open(&ib) {
        Ok(Ok(p)) => {
            eprintln!("{test}: on {}", p.describe());
            Some(ib)
        }
        Ok(Err(Unavailable(why))) => {
            if std::env::var_os("IB_TEST_REQUIRE_DEVICE").is_some_and(|v| v == "1") {
                panic!("{test}: IB_TEST_REQUIRE_DEVICE=1 but {why}");
            }
            eprintln!("{test}: skipped: {why}");
            None
        }
        Err(e) => panic!("{test}: opening the verbs provider: {e}"),
    }
}

fn open(s: &IbSettings) -> VerbsProvider {
    VerbsProvider::open(s).expect("open").expect("device")
}

fn verbs_pair(settings: &IbSettings) -> (DirectIb<VerbsProvider>, DirectIb<VerbsProvider>) {
    pair(|| open(settings), settings)
}

#[test]
fn credits_hold_a_fast_sender_back_without_loss() {
    let Some(env) = settings("credits") else { return };
    let start = Instant::now();
    let held = common::credits_hold_a_fast_sender_back(|| open(&env), &env);
    eprintln!("credits: 5000 packets in {:.2} s, sender held back {held} times", start.elapsed().as_secs_f64());
}

#[test]
fn two_floods_never_deadlock() {
    let Some(env) = settings("floods") else { return };
    let start = Instant::now();
    common::two_floods_never_deadlock(|| open(&env), &env);
    eprintln!("floods: 2 x 3000 packets in {:.2} s", start.elapsed().as_secs_f64());
}

/// Progresses `t` until `rec` holds `n` completions.
fn wait_completed(t: &mut DirectIb<VerbsProvider>, rec: &mut Recorder, n: usize) {
    until(&format!("{n} completions"), || {
        t.progress(64, rec).unwrap();
        rec.completed.len() >= n
    });
}

#[test]
fn like_messages_go_compact_at_the_port_mtu() {
    let Some(s) = settings("like_messages_go_compact_at_the_port_mtu") else { return };
    let mtu = open(&s).mtu();
    let compact = common::like_messages_go_compact(|| open(&s), &s, mtu);
    assert!(compact > 200, "{compact}");
}

#[test]
fn get_and_put_move_registered_memory() {
    let Some(env) = settings("get/put") else { return };
    let (mut a, mut b) = verbs_pair(&env);
    let (mut ra, mut rb) = (Recorder::default(), Recorder::default());
    let max = b.provider().max_transfer();
    // Big enough to be split into several requests when the port's messages are small (rxe).
    let big = if max <= 8 << 20 { max + (1 << 20) + 12345 } else { 3 << 20 };
    let src: Vec<u8> = (0..big as u32 + (1 << 20)).map(|i| (i.wrapping_mul(31) ^ (i >> 11)) as u8).collect();
    let key =
        *a.register(Region { ptr: src.as_ptr(), len: src.len() }, PeerAccess::Read, Lifetime::Transfer).unwrap().key();
    // Get of 1 MiB at an offset.
    let mut dst = vec![0u8; 1 << 20];
    let t = Instant::now();
    let into = RegionMut { ptr: dst.as_mut_ptr(), len: dst.len() };
    assert_eq!(b.get(0, &key, 1 << 20, into, 7).unwrap(), Issued::Pending);
    wait_completed(&mut b, &mut rb, 1);
    assert!(matches!(rb.completed[..], [(7, Ok(()))]), "{:?}", rb.completed);
    assert!(dst == src[1 << 20..2 << 20], "get: data differs");
    eprintln!("get/put: get of 1 MiB in {:.3} s", t.elapsed().as_secs_f64());
    // A get larger than one request.
    let mut whole = vec![0u8; big];
    let t = Instant::now();
    let into = RegionMut { ptr: whole.as_mut_ptr(), len: whole.len() };
    assert_eq!(b.get(0, &key, 1000, into, 8).unwrap(), Issued::Pending);
    wait_completed(&mut b, &mut rb, 2);
    assert!(matches!(rb.completed[1], (8, Ok(()))), "{:?}", rb.completed);
    assert!(whole == src[1000..1000 + big], "split get: data differs");
    eprintln!(
        "get/put: get of {big} B ({} requests of at most {max} B) in {:.3} s",
        big.div_ceil(max),
        t.elapsed().as_secs_f64()
    );
    // Put of 2 MiB into exposed memory, at an offset, surrounded by bytes that must stay.
    let mut target = vec![0x5au8; 3 << 20];
    let tkey = *a
        .register(Region { ptr: target.as_mut_ptr(), len: target.len() }, PeerAccess::Write, Lifetime::Transfer)
        .unwrap()
        .key();
    let t = Instant::now();
    assert_eq!(b.put(0, Region { ptr: whole.as_ptr(), len: 2 << 20 }, &tkey, 4096 + 10, 9).unwrap(), Issued::Pending);
    wait_completed(&mut b, &mut rb, 3);
    assert!(matches!(rb.completed[2], (9, Ok(()))), "{:?}", rb.completed);
    eprintln!("get/put: put of 2 MiB in {:.3} s", t.elapsed().as_secs_f64());
    assert!(target[4096 + 10..4096 + 10 + (2 << 20)] == whole[..2 << 20], "put: data differs");
    assert!(target[..4096 + 10].iter().all(|&x| x == 0x5a), "put wrote before its range");
    assert!(target[4096 + 10 + (2 << 20)..].iter().all(|&x| x == 0x5a), "put wrote after its range");
    // Past the exposed range: refused before anything is posted.
    let mut small = vec![0xeeu8; 64];
    let into = RegionMut { ptr: small.as_mut_ptr(), len: 64 };
    let e = b.get(0, &key, src.len() - 32, into, 10).unwrap_err();
    assert!(e.to_string().contains("outside the"), "{e}");
    // A key forged to claim more than was registered: the device refuses it with a completion
    // error, and nothing was read.
    let forged = common::widened(&key, 4096);
    assert_eq!(b.get(0, &forged, src.len() - 32, into, 10).unwrap(), Issued::Pending);
    wait_completed(&mut b, &mut rb, 4);
    match &rb.completed[3] {
        (10, Err(e)) => assert!(e.to_string().contains("remote access error"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(small.iter().all(|&x| x == 0xee));
    // The failed queue pair takes the peer down.
    until("the peer reported lost", || {
        b.progress(64, &mut rb).unwrap();
        !rb.lost.is_empty()
    });
    assert!(matches!(rb.lost[..], [(0, Error::PeerLost { .. })]), "{:?}", rb.lost);
    a.deregister(&MemHandle::new(key, &Lifetime::Transfer), 0..0);
    a.deregister(&MemHandle::new(tkey, &Lifetime::Transfer), 0..0);
    a.progress(64, &mut ra).unwrap();
}

/// A connected pair of queue pairs: `(initiator's, target's)`.
fn qp_pair(initiator: &mut VerbsProvider, target: &mut VerbsProvider) -> (QpId, QpId) {
    let (iq, inum) = initiator.create_qp(0).unwrap();
    let (tq, tnum) = target.create_qp(0).unwrap();
    initiator.connect(iq, &target.endpoint(), tnum).unwrap();
    target.connect(tq, &initiator.endpoint(), inum).unwrap();
    initiator.ready_to_send(iq).unwrap();
    target.ready_to_send(tq).unwrap();
    (iq, tq)
}

/// Polls `p` until one completion arrives.
fn one_completion(p: &mut VerbsProvider, what: &str) -> Completion {
    let mut out: Vec<Completion> = Vec::new();
    until(&format!("completion of {what}"), || p.poll(&mut out, 8) > 0 || !out.is_empty());
    assert_eq!(out.len(), 1, "{what}: {out:?}");
    out[0]
}

/// Provider level: a wrong key, an offset past the region, a forged length, a local range
/// past its registration and a deregistered key each end in an error completion, and memory
/// outside the region is never touched.
#[test]
fn verbs_provider_checks_keys_and_bounds() {
    let Some(env) = settings("keys and bounds") else { return };
    let mut target = open(&env);
    let mut initiator = open(&env);
    // A guarded buffer: the region is the middle 4 KiB.
    let mut mem = vec![0x11u8; 3 * 4096];
    // SAFETY: offset 4096 lies inside the 12 KiB vector.
    let region_start = unsafe { mem.as_mut_ptr().add(4096) };
    // SAFETY: `mem` outlives the registration (deregistered below, before `mem` is dropped).
    let mr = unsafe { target.register(region_start, 4096, Access::ALL).unwrap() };
    // The initiator's memory: 16 KiB, of which the first 8 KiB are registered.
    let mut src = vec![0x99u8; 16384];
    // SAFETY: `src` (16 KiB) outlives the registration of its first 8 KiB.
    let src_mr: MemoryRegion = unsafe { initiator.register(src.as_mut_ptr(), 8192, Access::ALL).unwrap() };
    let base = mr.addr;
    // (what, local offset in src, remote address, length, rkey, opcode, expected status)
    let cases: Vec<(&str, u64, u64, usize, u32, Opcode, WcStatus)> = vec![
        ("in bounds", 0, base + 100, 200, mr.rkey, Opcode::Write, WcStatus::Success),
        ("inline in bounds", 0, base + 300, 8, mr.rkey, Opcode::Write, WcStatus::Success),
        ("read in bounds", 0, base + 1000, 200, mr.rkey, Opcode::Read, WcStatus::Success),
        ("wrong key", 0, base, 8, mr.rkey ^ 0x100, Opcode::Write, WcStatus::RemoteAccess),
        ("offset past the end", 0, base + 4096, 8, mr.rkey, Opcode::Write, WcStatus::RemoteAccess),
        ("forged length", 0, base + 4000, 200, mr.rkey, Opcode::Write, WcStatus::RemoteAccess),
        ("before the start", 0, base - 8, 16, mr.rkey, Opcode::Write, WcStatus::RemoteAccess),
        ("read past the end", 0, base + 4000, 200, mr.rkey, Opcode::Read, WcStatus::RemoteAccess),
        ("read with a wrong key", 0, base, 8, mr.rkey ^ 0x100, Opcode::Read, WcStatus::RemoteAccess),
        ("local range past its registration", 8192 - 8, base, 16, mr.rkey, Opcode::Write, WcStatus::LocalProtection),
    ];
    for (what, local_off, remote_addr, len, rkey, opcode, expect) in cases {
        let (qp, _) = qp_pair(&mut initiator, &mut target);
        if opcode == Opcode::Read {
            src[..len].fill(0x99);
        }
        let wr = WorkRequest {
            inline: what.starts_with("inline"),
            ..request(1, opcode, src.as_ptr() as u64 + local_off, src_mr.lkey, remote_addr, rkey, len)
        };
        initiator.post(qp, &wr).unwrap();
        let c = one_completion(&mut initiator, what);
        assert_eq!((c.wr_id, c.qp, c.status), (1, qp, expect), "{what}");
        eprintln!("keys and bounds: {what}: {}", c.status);
        if opcode == Opcode::Read && expect == WcStatus::Success {
            assert!(src[..len].iter().all(|&x| x == 0x11), "{what}: data");
        }
        if opcode == Opcode::Read && expect != WcStatus::Success {
            assert!(src[..len].iter().all(|&x| x == 0x99), "{what}: a failed read wrote local memory");
        }
        // A failed queue pair flushes what follows.
        if expect != WcStatus::Success {
            let next = WorkRequest {
                wr_id: 2,
                local_addr: src.as_ptr() as u64,
                rkey: mr.rkey,
                remote_addr: base,
                len: 8,
                inline: false,
                ..wr
            };
            match initiator.post(qp, &next) {
                Ok(()) => {
                    let c = one_completion(&mut initiator, &format!("{what}: the request after"));
                    assert_eq!((c.wr_id, c.status), (2, WcStatus::Flushed), "{what}");
                }
                Err(e) => eprintln!("keys and bounds: {what}: the failed queue pair refused a request: {e}"),
            }
        }
    }
    // A request too long for the port is refused at post.
    let (qp, _) = qp_pair(&mut initiator, &mut target);
    let huge = request(3, Opcode::Read, src.as_ptr() as u64, src_mr.lkey, base + 8, mr.rkey, usize::MAX - 4);
    assert!(initiator.post(qp, &huge).is_err());
    assert!(mem[..4096].iter().all(|&x| x == 0x11), "bytes before the region were written");
    assert!(mem[8192..].iter().all(|&x| x == 0x11), "bytes after the region were written");
    assert!(mem[4096 + 100..4096 + 300].iter().all(|&x| x == 0x99));
    assert!(mem[4096 + 300..4096 + 308].iter().all(|&x| x == 0x99));
    assert!(mem[4096..4096 + 100].iter().all(|&x| x == 0x11));
    assert!(mem[4096 + 308..8192].iter().all(|&x| x == 0x11));
    // After deregistration the key is refused.
    target.deregister(&mr);
    let wr = request(4, Opcode::Write, src.as_ptr() as u64, src_mr.lkey, base, mr.rkey, 8);
    initiator.post(qp, &wr).unwrap();
    assert_eq!(one_completion(&mut initiator, "deregistered key").status, WcStatus::RemoteAccess);
    assert!(mem.iter().all(|&x| x == 0x11 || x == 0x99));
    assert!(mem[4096..4104].iter().all(|&x| x == 0x11), "a deregistered region was written");
    initiator.deregister(&src_mr);
}

/// The send queue depth is enforced at post, and every request completes exactly once.
#[test]
fn full_send_queue_is_refused_and_every_request_completes() {
    let Some(env) = settings("send queue") else { return };
    let mut target = open(&env);
    let mut initiator = open(&env);
    let mut mem = vec![0u8; 4096];
    // SAFETY: `mem` outlives the registration (deregistered at the end).
    let mr = unsafe { target.register(mem.as_mut_ptr(), mem.len(), Access::ALL).unwrap() };
    let mut src = vec![7u8; 64];
    // SAFETY: `src` outlives the registration (deregistered at the end).
    let src_mr = unsafe { initiator.register(src.as_mut_ptr(), src.len(), Access(0)).unwrap() };
    let (qp, _) = qp_pair(&mut initiator, &mut target);
    let depth = initiator.max_outstanding();
    let mut posted = 0u64;
    let mut refused = false;
    while posted < depth as u64 + 1 {
        let wr = WorkRequest {
            inline: posted % 2 == 0,
            ..request(
                posted,
                Opcode::Write,
                src.as_ptr() as u64,
                src_mr.lkey,
                mr.addr + (posted % 64) * 64,
                mr.rkey,
                64,
            )
        };
        if initiator.post(qp, &wr).is_err() {
            refused = true;
            break;
        }
        posted += 1;
    }
    assert!(refused && posted == depth as u64, "depth {depth}: posted {posted} before a refusal");
    let mut out = Vec::new();
    until("every completion", || {
        initiator.poll(&mut out, 64);
        out.len() >= posted as usize
    });
    let mut ids: Vec<u64> = out.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..posted).collect::<Vec<_>>());
    assert!(out.iter().all(|c| c.status == WcStatus::Success && c.qp == qp));
    assert!(mem.iter().all(|&x| x == 7));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(initiator.poll(&mut out, 64), 0, "a request completed twice");
    initiator.deregister(&src_mr);
    target.deregister(&mr);
}

/// A peer that finalizes says BYE; once its queue pair is gone, the heartbeat finds it and it
/// is reported finished, not lost.
#[test]
fn finished_peer_is_found_by_the_heartbeat() {
    let Some(env) = settings("finished peer") else { return };
    let (mut a, mut b) = verbs_pair(&env);
    let mut rb = Recorder::default();
    a.finalize();
    b.progress(64, &mut rb).unwrap();
    b.check_peers(&mut rb);
    assert!(rb.lost.is_empty(), "a finalized peer is reported only once it is gone");
    drop(a);
    let t = Instant::now();
    until("the heartbeat to a destroyed queue pair failing", || {
        b.check_peers(&mut rb);
        !rb.lost.is_empty()
    });
    eprintln!("finished peer: found gone after {:.2} s", t.elapsed().as_secs_f64());
    assert!(matches!(rb.lost[..], [(0, Error::PeerFinished { rank: 0 })]), "{:?}", rb.lost);
}

/// A named device that does not exist is an error, not "unavailable".
#[test]
fn unknown_device_is_an_error() {
    let Some(env) = settings("unknown device") else { return };
    let s = IbSettings { device: Some(("no-such-device9".into(), 1)), ..env.clone() };
    match VerbsProvider::open(&s) {
        Err(e) => assert!(e.to_string().contains("does not exist"), "{e}"),
        Ok(Ok(_)) => panic!("opened a device that does not exist"),
        Ok(Err(why)) => panic!("{why:?}"),
    }
    let dev = env.device.clone().map_or_else(|| None, |(n, _)| Some(n));
    if let Some(name) = dev {
        let s = IbSettings { device: Some((name, 9)), ..env };
        let e = VerbsProvider::open(&s).expect_err("port 9 opened");
        assert!(e.to_string().contains("port"), "{e}");
    }
}
