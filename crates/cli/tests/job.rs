//! Whole jobs through the launcher: every scenario with 2, 4 and 8 ranks, over each channel
//! forced and over the automatic choice.
//!
//! This test binary is its own rank program: started by `cargo test` it launches itself with
//! `polyrail_cli::launch`; started by the launcher (PMI in the environment) it runs the scenario
//! named by its argument. Survivors of the fault scenarios write what they saw to files the
//! parent checks.

use polyrail::{
    Cancel, Comm, CommKind, Context, Error, MappedHeap, Source, Space, TagMatch, TransportKind, ANY_SOURCE, ANY_TAG,
};
use polyrail_cli::launch::{launch, nodes_in_blocks, Bind, LaunchOptions, Layout};

// The `heap` scenario's buffers come from memory files; every other scenario turns them off
// (`rank_main`) and uses ordinary memory.
#[global_allocator]
static HEAP: MappedHeap = MappedHeap::new();
use std::time::{Duration, Instant};

/// Sizes across every threshold of the default routes (payload in the record, in body slots,
/// cells, eager limit, single-copy and split thresholds), 0 B to 8 MiB.
const SIZES: &[usize] = &[
    0,
    1,
    7,
    8,
    15,
    16,
    17,
    63,
    64,
    100,
    112,
    113,
    255,
    256,
    257,
    1000,
    1023,
    1024,
    1025,
    4095,
    4096,
    4097,
    8127,
    8128,
    8129,
    8192,
    16383,
    16384,
    16385,
    32767,
    32768,
    32769,
    65535,
    65536,
    65537,
    131072,
    131073,
    262143,
    262144,
    262145,
    1 << 20,
    (1 << 20) + 3,
    8 << 20,
];

fn stamp(from: u32, i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k as u32).wrapping_mul(2654435761).wrapping_add(from * 977 + i * 131) as u8).collect()
}

/// Every size of [`SIZES`] around the ring of ranks, then [`raw_window`].
fn sizes_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let (me, n) = (ctx.rank(), ctx.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    for (i, &len) in SIZES.iter().enumerate() {
        let s = ctx.isend(next, i as u32, stamp(me, i as u32, len))?;
        let mut buf = vec![0u8; len];
        let st = ctx.recv(prev, i as u32, &mut buf)?;
        assert_eq!((st.source, st.tag, st.len), (prev, i as u32, len));
        assert!(buf == stamp(prev, i as u32, len), "rank {me}: corrupted {len}-byte message from {prev}");
        // A small send may have left when it started; either way the send's status and its
        // buffer come back.
        let done = ctx.wait(s)?;
        assert_eq!((done.status.source, done.status.tag, done.status.len), (next, i as u32, len));
        assert!(done.buf == stamp(me, i as u32, len), "rank {me}: send buffer of {len} bytes not given back whole");
    }
    raw_window(ctx, next, prev)?;
    scoped_window(ctx, next, prev)?;
    // A ring shift with blocking calls only: every rank sends and receives at once.
    for (i, len) in [0usize, 100, 40_000, 1 << 20].into_iter().enumerate() {
        let tag = 3000 + i as u32;
        let mut buf = vec![0u8; len];
        let st = ctx.sendrecv(next, tag, &stamp(me, tag, len), prev, tag, &mut buf)?;
        assert_eq!((st.source, st.tag, st.len), (prev, tag, len));
        assert!(buf == stamp(prev, tag, len), "rank {me}: sendrecv of {len} bytes corrupted");
    }
    Ok(())
}

/// Ping-pongs between rank pairs (0-1, 2-3, ...) of messages that both processes copy, new
/// contents each round, long enough for the split share's search (16 messages per size class,
/// then four of each share in turn): real copies divided in three eighths and a quarter, and
/// whatever share each class keeps, arrive whole.
fn pingpong_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let me = ctx.rank();
    let peer = me ^ 1;
    if peer >= ctx.size() {
        return Ok(());
    }
    for len in [32 << 10, (64 << 10) + 4196, 1 << 20] {
        let mut buf = vec![0u8; len];
        for round in 0..40u32 {
            let (out_tag, in_tag) = if me % 2 == 0 { (2 * round, 2 * round + 1) } else { (2 * round + 1, 2 * round) };
            if me % 2 == 0 {
                ctx.send(peer, out_tag, &stamp(me, out_tag, len))?;
            }
            let st = ctx.recv(peer, in_tag, &mut buf)?;
            assert_eq!((st.source, st.tag, st.len), (peer, in_tag, len));
            assert!(buf == stamp(peer, in_tag, len), "rank {me}: corrupted {len}-byte message {in_tag} from {peer}");
            if me % 2 == 1 {
                ctx.send(peer, out_tag, &stamp(me, out_tag, len))?;
            }
        }
    }
    Ok(())
}

/// The raw calls as a runtime (or OSU) uses them: every size up to 64 KiB outstanding at once,
/// sends from one buffer each and receives into distinct parts of one buffer; small sends
/// finish when they start, the rest in `wait_all`.
fn raw_window(ctx: &mut Context, next: u32, prev: u32) -> polyrail::Result<()> {
    let me = ctx.rank();
    let sizes: Vec<usize> = SIZES.iter().copied().filter(|&l| l <= 65536).collect();
    let sends: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &l)| stamp(me, 1000 + i as u32, l)).collect();
    let mut recv = vec![0u8; sizes.iter().sum()];
    let mut reqs = Vec::new();
    let mut at = 0;
    for (i, &len) in sizes.iter().enumerate() {
        // SAFETY: `recv` outlives the requests (waited for below) and the parts do not overlap.
        reqs.push(unsafe { ctx.irecv_raw(prev, 1000 + i as u32, recv[at..].as_mut_ptr(), len)? });
        at += len;
    }
    for (i, buf) in sends.iter().enumerate() {
        // SAFETY: `sends` outlives the requests and is not modified.
        reqs.push(unsafe { ctx.isend_raw(next, 1000 + i as u32, buf.as_ptr(), buf.len())? });
    }
    let done = ctx.wait_all(reqs)?;
    let (received, sent) = done.split_at(sizes.len());
    let mut at = 0;
    for (i, (&len, r)) in sizes.iter().zip(received).enumerate() {
        let tag = 1000 + i as u32;
        assert_eq!((r.status.source, r.status.tag, r.status.len, r.buf.len()), (prev, tag, len, 0));
        assert!(recv[at..at + len] == stamp(prev, tag, len), "rank {me}: raw {len}-byte message corrupted");
        at += len;
    }
    for (i, (&len, s)) in sizes.iter().zip(sent).enumerate() {
        assert_eq!((s.status.source, s.status.tag, s.status.len, s.buf.len()), (next, 1000 + i as u32, len, 0));
    }
    Ok(())
}

/// Borrowed buffers in a `Context::scope`: every size outstanding at once from and into parts
/// of one buffer each; half the requests waited for at once, a quarter through `wait_any`, an
/// eighth polled with `test_all` and the rest left to the scope's end. Then a scope whose
/// closure panics with its requests running: they still end before the scope does.
fn scoped_window(ctx: &mut Context, next: u32, prev: u32) -> polyrail::Result<()> {
    let me = ctx.rank();
    let tag = |i: usize| 2000 + i as u32;
    let sends: Vec<u8> = SIZES.iter().enumerate().flat_map(|(i, &l)| stamp(me, tag(i), l)).collect();
    let mut recv = vec![0u8; sends.len()];
    ctx.scope(|s| {
        let (mut rest_in, mut rest_out) = (&mut recv[..], &sends[..]);
        let (mut any, mut all) = (Vec::new(), Vec::new());
        for (i, &len) in SIZES.iter().enumerate() {
            let (into, more_in) = std::mem::take(&mut rest_in).split_at_mut(len);
            let (from, more_out) = rest_out.split_at(len);
            (rest_in, rest_out) = (more_in, more_out);
            let r = s.irecv(prev, tag(i), into)?;
            let w = s.isend(next, tag(i), from)?;
            match i % 8 {
                0 | 2 | 4 | 6 => {
                    let st = s.wait(r)?;
                    assert_eq!((st.source, st.tag, st.len), (prev, tag(i), len));
                    s.wait(w)?;
                }
                1 | 5 => any.extend([r, w]),
                3 => all.extend([r, w]),
                _ => {} // left to the scope's end
            }
        }
        while !any.is_empty() {
            let k = s.wait_any(&any)?;
            s.wait(any.swap_remove(k))?;
        }
        while !s.test_all(&all)? {}
        assert!(s.test_any(&all)?.is_some() || all.is_empty());
        Ok::<(), polyrail::Error>(())
    })?;
    // Cancelling a receive posted before its message: withdrawn at once where nothing holds
    // its key (eager routes, shm's cells), through the sender where it holds the key (an RTR
    // over cma or ib), unless the sender's message took the receive first; either way the
    // message then arrives whole, in a fresh receive or in the kept one.
    let small_out = stamp(me, 2997, 8);
    let big_out = stamp(me, 2996, 300_000);
    let mut bufs = [vec![0u8; 8], vec![0u8; 8], vec![0u8; 300_000], vec![0u8; 300_000]];
    ctx.scope(|s| {
        let mut reqs = Vec::new();
        let [small, small_again, big, big_again] = &mut bufs;
        for (tag, buf, spare) in [(2997, small, small_again), (2996, big, big_again)] {
            reqs.push(match s.cancel(s.irecv(prev, tag, buf)?)? {
                Some(kept) => kept,
                None => s.irecv(prev, tag, spare)?,
            });
        }
        reqs.push(s.isend(next, 2997, &small_out)?);
        reqs.push(s.isend(next, 2996, &big_out)?);
        s.wait_all(reqs).map(|_| ())
    })?;
    for (tag, len, pair) in [(2997, 8, &bufs[..2]), (2996, 300_000, &bufs[2..])] {
        let want = stamp(prev, tag, len);
        assert!(pair.contains(&want), "rank {me}: the message of a cancelled receive (tag {tag}) was lost");
    }
    // With no message on its way (`prev` sends it only after the barrier), a large receive is
    // always withdrawn, through `prev` when it holds the key; the message then goes to the next.
    let big = ctx.irecv(prev, 2995, vec![0u8; 300_000])?;
    let Cancel::Cancelled(buf) = ctx.cancel(big)? else {
        panic!("rank {me}: a receive no message could match yet was not cancelled");
    };
    ctx.barrier()?;
    let w = ctx.isend(next, 2995, stamp(me, 2995, 300_000))?;
    let r = ctx.irecv(prev, 2995, buf)?;
    let got = ctx.wait(r)?;
    ctx.wait(w)?;
    assert!(got.buf == stamp(prev, 2995, 300_000), "rank {me}: the message after a cancel was corrupted");
    let mut at = 0;
    for (i, &len) in SIZES.iter().enumerate() {
        assert!(recv[at..at + len] == stamp(prev, tag(i), len), "rank {me}: scoped {len}-byte message corrupted");
        at += len;
    }
    let out = stamp(me, 2999, 300_000);
    let mut into = vec![0u8; out.len()];
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the panic below is expected: no message
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ctx.scope(|s| {
            let _r = s.irecv(prev, 2999, &mut into);
            let _w = s.isend(next, 2999, &out);
            panic!("rank {me}: a scope's closure panics on purpose with its requests running");
        })
    }));
    std::panic::set_hook(hook);
    assert!(unwound.is_err());
    assert!(into == stamp(prev, 2999, 300_000), "rank {me}: the panicking scope ended before its receive");
    Ok(())
}

/// Like `sizes`, from and into buffers registered once (`Context::alloc_registered`).
fn registered_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let (me, n) = (ctx.rank(), ctx.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let max = *SIZES.iter().max().unwrap_or(&0);
    let mut sbuf = ctx.alloc_registered(max)?;
    let mut rbuf = ctx.alloc_registered(max)?;
    for (i, &len) in SIZES.iter().enumerate() {
        sbuf[..len].copy_from_slice(&stamp(me, i as u32, len));
        if me % 2 == 0 {
            ctx.send(next, i as u32, &sbuf[..len])?;
            ctx.recv(prev, i as u32, &mut rbuf[..len])?;
        } else {
            ctx.recv(prev, i as u32, &mut rbuf[..len])?;
            ctx.send(next, i as u32, &sbuf[..len])?;
        }
        assert!(rbuf[..len] == stamp(prev, i as u32, len), "rank {me}: corrupted {len}-byte message from {prev}");
    }
    ctx.free_registered(sbuf)?;
    ctx.free_registered(rbuf)?;
    Ok(())
}

/// Like `sizes`, with the buffers from 64 KiB up in memory files of the [`MappedHeap`], which
/// the channels register (and the peers map) at first use; each is freed after its message, so
/// later ones often reuse its addresses: messages of one size, again and again, with new
/// contents each time, must never meet an old registration or mapping.
fn heap_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    MappedHeap::set_enabled(true);
    let probe = vec![0u8; 1 << 20];
    assert_eq!(MappedHeap::blocks(), 1, "a 1 MiB Vec must be a memory file");
    drop(probe);
    sizes_scenario(ctx)?;
    let (me, n) = (ctx.rank(), ctx.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    for round in 0..6u32 {
        for (k, &len) in [65536usize, 300_000, 1 << 20, 4 << 20].iter().enumerate() {
            let tag = 1000 + round * 10 + k as u32;
            let s = ctx.isend(next, tag, stamp(me, tag, len))?;
            let mut buf = vec![0u8; len];
            ctx.recv(prev, tag, &mut buf)?;
            assert!(
                buf == stamp(prev, tag, len),
                "rank {me}: corrupted {len}-byte message from {prev} (round {round})"
            );
            ctx.wait(s)?;
        }
    }
    Ok(())
}

/// Every rank sends hundreds of messages to rank 0 at once; rank 0 receives half by name and
/// half by wildcard; per-sender order must hold.
fn order_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    const COUNT: u32 = 200;
    let len_of = |i: u32| [4usize, 200, 3000, 40000, 300000][i as usize % 5];
    let (me, n) = (ctx.rank(), ctx.size());
    if me != 0 {
        let reqs: Vec<_> =
            (0..COUNT).map(|i| ctx.isend(0, i % 3, stamp(me, i, len_of(i)))).collect::<Result<_, _>>()?;
        let done = ctx.wait_all(reqs)?;
        let lens: Vec<usize> = done.iter().map(|c| c.status.len).collect();
        assert_eq!(lens, (0..COUNT).map(len_of).collect::<Vec<_>>(), "completions in the order of the requests");
    } else {
        let mut named = Vec::new();
        for p in 1..n {
            for _ in 0..COUNT / 2 {
                named.push((p, ctx.irecv(p, ANY_TAG, vec![0u8; 300000])?));
            }
        }
        let mut wild = Vec::new();
        for _ in 0..(n - 1) * COUNT / 2 {
            wild.push(ctx.irecv(ANY_SOURCE, ANY_TAG, vec![0u8; 300000])?);
        }
        let mut next = vec![0u32; n as usize];
        for (p, r) in named {
            let c = ctx.wait(r)?;
            let i = next[p as usize];
            next[p as usize] += 1;
            assert_eq!((c.status.source, c.status.tag, c.status.len), (p, i % 3, len_of(i)));
            assert!(c.buf[..c.status.len] == stamp(p, i, len_of(i))[..], "message {i} of rank {p}");
        }
        for r in wild {
            let c = ctx.wait(r)?;
            let p = c.status.source;
            let i = next[p as usize];
            next[p as usize] += 1;
            assert_eq!((c.status.tag, c.status.len), (i % 3, len_of(i)), "wildcard: message {i} of rank {p}");
            assert!(c.buf[..c.status.len] == stamp(p, i, len_of(i))[..]);
        }
        assert!(next[1..].iter().all(|&k| k == COUNT));
    }
    Ok(())
}

/// ANY_SOURCE and ANY_TAG receives meet rendezvous and eager messages; probe and iprobe;
/// then [`any_finished`].
fn wildcard_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let (me, n) = (ctx.rank(), ctx.size());
    const BIG: usize = 1 << 20;
    if me != 0 {
        ctx.send(0, 10 + me, &stamp(me, 1, BIG))?;
        ctx.send(0, 20 + me, &stamp(me, 2, 10))?;
        ctx.recv(0, 40, &mut [])?;
        ctx.send(0, 30, &stamp(me, 3, 50000))?;
    } else {
        let mut seen = vec![0u32; n as usize];
        for _ in 0..2 * (n - 1) {
            let mut buf = vec![0u8; 2 * BIG];
            let st = ctx.recv(Source::Any, TagMatch::Any, &mut buf)?;
            let p = st.source;
            let (tag, len, k) = if seen[p as usize] == 0 { (10 + p, BIG, 1) } else { (20 + p, 10, 2) };
            seen[p as usize] += 1;
            assert_eq!((st.tag, st.len), (tag, len));
            assert!(buf[..len] == stamp(p, k, len)[..]);
        }
        for p in 1..n {
            ctx.send(p, 40, &[])?;
        }
        for _ in 1..n {
            let st = ctx.probe(ANY_SOURCE, 30)?;
            assert_eq!(st.len, 50000);
            let mut buf = vec![0u8; st.len];
            let got = ctx.recv(st.source, 30, &mut buf)?;
            assert_eq!(got, st);
            assert!(buf == stamp(st.source, 3, 50000));
        }
        assert!(ctx.iprobe(ANY_SOURCE, ANY_TAG)?.is_none());
    }
    any_finished(ctx)
}

/// `test_any` and `wait_any` over receives from every peer, eager and rendezvous: each peer
/// sends when rank 0 tells it to, last rank first, so only that receive can finish. Then
/// `test_all` over one more message from every peer.
fn any_finished(ctx: &mut Context) -> polyrail::Result<()> {
    let (me, n) = (ctx.rank(), ctx.size());
    let len = |p: u32| if p % 2 == 1 { 100 } else { 300_000 };
    if me != 0 {
        ctx.recv(0, 60, &mut [])?;
        ctx.send(0, 61, &stamp(me, 61, len(me)))?;
        return ctx.send(0, 62, &[me as u8; 8]);
    }
    let mut peers: Vec<u32> = (1..n).collect();
    let mut reqs = Vec::new();
    for &p in &peers {
        reqs.push(ctx.irecv(p, 61, vec![0u8; len(p)])?);
    }
    assert_eq!(ctx.test_any(&reqs)?, None, "a receive finished before its peer sent");
    assert!(!ctx.test_all(&reqs)? || reqs.is_empty(), "receives finished before their peers sent");
    for p in (1..n).rev() {
        ctx.send(p, 60, &[])?;
        let i = ctx.wait_any(&reqs)?;
        assert_eq!(peers[i], p, "wait_any named the receive from {} while only {p} sent", peers[i]);
        let done = ctx.wait(reqs.swap_remove(i))?;
        peers.swap_remove(i);
        assert_eq!((done.status.source, done.status.len), (p, len(p)));
        assert!(done.buf == stamp(p, 61, len(p)), "corrupted message from {p}");
    }
    assert!(matches!(ctx.wait_any::<u8>(&[]), Err(Error::InvalidArgument(_))));
    assert!(ctx.test_all::<u8>(&[])?, "no request: all finished");
    // Every peer sends one more: test_all turns true once all are here.
    let mut more = Vec::new();
    for p in 1..n {
        more.push(ctx.irecv(p, 62, vec![0u8; 8])?);
    }
    while !ctx.test_all(&more)? {}
    for (p, done) in (1..n).zip(ctx.wait_all(more)?) {
        assert!(done.buf == [p as u8; 8], "message 62 from {p}");
    }
    Ok(())
}

/// Whether `r` is the error for rank `rank` outside the job.
fn names_outside<T: std::fmt::Debug>(r: polyrail::Result<T>, rank: u32) -> bool {
    matches!(&r, Err(Error::InvalidArgument(m)) if m.starts_with(&format!("rank {rank} is out of range")))
}

/// A rank outside the job is an error that names it, for every call that takes one (a receive
/// from one indexed past the engine's peers, and a probe for one never ended, before).
fn outside_ranks(ctx: &mut Context) {
    let n = ctx.size();
    for r in [n, n + 5, u32::MAX] {
        let mut buf = vec![0u8; 1 << 20];
        let checks = [
            ("send", names_outside(ctx.send(r, 0, b"x"), r)),
            ("recv", names_outside(ctx.recv(r, 0, &mut buf[..8]), r)),
            ("recv of a rendezvous size", names_outside(ctx.recv(r, 0, &mut buf), r)),
            ("isend", names_outside(ctx.isend(r, 0, vec![1]), r)),
            ("irecv", names_outside(ctx.irecv(r, 0, vec![0; 8]), r)),
            ("probe", names_outside(ctx.probe(r, ANY_TAG), r)),
            ("iprobe", names_outside(ctx.iprobe(r, ANY_TAG), r)),
            ("sendrecv", names_outside(ctx.sendrecv(0, 0, b"", r, 0, &mut buf), r)),
            ("scoped irecv", names_outside(ctx.scope(|s| s.irecv(r, 0, &mut buf).map(|_| ())), r)),
        ];
        for (call, ok) in checks {
            assert!(ok, "rank {}: {call} with rank {r} of {n}", ctx.rank());
        }
    }
}

/// A message longer than its receive buffer is an error that names it; the pair still works.
/// First [`outside_ranks`].
fn truncate_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    outside_ranks(ctx);
    let me = ctx.rank();
    if me == 1 {
        for len in [100usize, 40000, 1 << 20] {
            ctx.send(0, 5, &stamp(1, 0, len))?;
        }
        ctx.send(0, 6, b"still fine")?;
    } else if me == 0 {
        for len in [100usize, 40000, 1 << 20] {
            let mut small = [0u8; 10];
            match ctx.recv(1, 5, &mut small) {
                Err(Error::Truncated { from: 1, tag: 5, len: l, capacity: 10 }) => assert_eq!(l, len),
                other => panic!("expected truncation of {len} bytes, got {other:?}"),
            }
        }
        let mut buf = [0u8; 10];
        ctx.recv(1, 6, &mut buf)?;
        assert_eq!(&buf, b"still fine");
    }
    Ok(())
}

/// A fast sender and a slow receiver: rank 0 posts thousands of eager sends at once while
/// rank 1 sleeps, then receives them one by one with pauses; nothing is lost or reordered.
fn flood_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    const COUNT: u32 = 5000;
    let len_of = |i: u32| (i as usize * 37) % 1500;
    if ctx.rank() == 0 {
        let reqs: Vec<_> = (0..COUNT).map(|i| ctx.isend(1, 5, stamp(0, i, len_of(i)))).collect::<Result<_, _>>()?;
        ctx.wait_all(reqs)?;
    } else if ctx.rank() == 1 {
        std::thread::sleep(Duration::from_millis(300));
        let mut buf = vec![0u8; 1500];
        for i in 0..COUNT {
            if i % 500 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            let st = ctx.recv(0, 5, &mut buf)?;
            assert!(buf[..st.len] == stamp(0, i, len_of(i)), "message {i} lost or reordered");
        }
    }
    Ok(())
}

/// Rank 1 dies (killed, or exits without finalizing); every other rank must get an error that
/// names it within a second, and write how long it took to `JOBTEST_OUT.<rank>`. After a kill
/// the survivors block in a receive; after an exit they poll (rank 0 tests a receive, the
/// others probe), which must notice the loss as a wait does.
fn fault_scenario(ctx: &mut Context, how: &str) -> polyrail::Result<()> {
    let me = ctx.rank();
    ctx.barrier()?;
    if me == 1 {
        std::thread::sleep(Duration::from_millis(100));
        match how {
            "kill" => {
                // SAFETY: raising a signal against ourselves has no memory-safety effect.
                unsafe { libc::raise(libc::SIGKILL) };
            }
            _ => std::process::exit(0),
        }
    }
    let t = Instant::now();
    let mut buf = [0u8; 8];
    let r = match (how, me) {
        ("kill", 0) => ctx.recv(1, 0, &mut buf),
        ("kill", _) => ctx.recv(ANY_SOURCE, 0, &mut buf),
        (_, 0) => {
            let req = ctx.irecv(1, 0, vec![0u8; 8])?;
            while !ctx.test(&req)? {}
            ctx.wait(req).map(|done| done.status)
        }
        _ => loop {
            match ctx.iprobe(1, 0) {
                Ok(None) => continue,
                Ok(Some(s)) => break Ok(s),
                Err(e) => break Err(e),
            }
        },
    };
    let ms = t.elapsed().as_millis();
    let line = match r {
        Err(e @ Error::PeerLost { rank: 1, .. }) => format!("lost-detected {ms} {e}"),
        other => format!("unexpected {other:?}"),
    };
    let out = std::env::var("JOBTEST_OUT").expect("JOBTEST_OUT set");
    std::fs::write(format!("{out}.{me}"), line).expect("write result");
    // Stay a moment so that our own exit is not what the other survivors see first.
    std::thread::sleep(Duration::from_millis(1200));
    std::process::exit(0);
}

/// Every rank panics in a scope whose receive nothing will match (its peer panicked before
/// sending): the scope's end waits for it a while, then stops the process (before, it waited
/// for ever and the job hung).
fn scope_panic_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let (me, n) = (ctx.rank(), ctx.size());
    ctx.barrier()?;
    let mut buf = [0u8; 8];
    std::panic::set_hook(Box::new(|_| {})); // the panic below is expected: no message
    ctx.scope(|s| {
        let _r = s.irecv((me + 1) % n, 77, &mut buf);
        panic!("rank {me}: the closure fails before it sends");
    })
}

/// Ranks 2.. block in a receive while ranks 0 and 1 ping-pong for about a second; each sleeper
/// writes the CPU time it used while blocked, and the wall time, to `JOBTEST_OUT.<rank>`.
fn sleepers_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let me = ctx.rank();
    ctx.barrier()?;
    if me >= 2 {
        let cpu = || {
            // SAFETY: getrusage writes one rusage into the zeroed struct.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
            let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
            tv(ru.ru_utime) + tv(ru.ru_stime)
        };
        let (c0, t0) = (cpu(), Instant::now());
        let mut buf = [0u8; 4];
        ctx.recv(0, 77, &mut buf)?;
        let (cpu_ms, wall_ms) = (cpu() - c0, t0.elapsed().as_secs_f64() * 1e3);
        let out = std::env::var("JOBTEST_OUT").expect("JOBTEST_OUT set");
        std::fs::write(format!("{out}.{me}"), format!("{cpu_ms:.2} {wall_ms:.2}")).expect("write result");
    } else {
        // Rank 0 keeps the clock; rank 1 is told after each batch whether to go on.
        let t = Instant::now();
        let mut b = [0u8; 8];
        loop {
            for _ in 0..1000 {
                if me == 0 {
                    ctx.send(1, 1, &b)?;
                    ctx.recv(1, 1, &mut b)?;
                } else {
                    ctx.recv(0, 1, &mut b)?;
                    ctx.send(0, 1, &b)?;
                }
            }
            let mut go = [0u8];
            if me == 0 {
                go[0] = (t.elapsed() < Duration::from_millis(1000)) as u8;
                ctx.send(1, 2, &go)?;
            } else {
                ctx.recv(0, 2, &mut go)?;
            }
            if go[0] == 0 {
                break;
            }
        }
        if me == 0 {
            for r in 2..ctx.size() {
                ctx.send(r, 77, b"done")?;
            }
        }
    }
    Ok(())
}

/// While the job runs, no shared-memory name of it is left in /dev/shm.
fn shm_names_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    ctx.barrier()?;
    let leftovers: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    // Only this job's: other jobs of this machine (of older builds, say) may have some.
    let job = format!("-{}-", std::env::var("PMI_JOBID").expect("PMI_JOBID"));
    let mine: Vec<&String> = leftovers.iter().filter(|n| n.starts_with("polyrail-") && n.contains(&job)).collect();
    assert!(mine.is_empty(), "segments still named in /dev/shm while the job runs: {mine:?}");
    sizes_scenario(ctx)
}

/// Every rank tries to truncate every shm segment it maps (its own and its peers'), as a
/// hostile process of the same user could through `/proc/<pid>/map_files`, and writes what it
/// tried and how many it shrank to `JOBTEST_OUT.<rank>`; then every size goes around the ring.
/// Segments are sealed: nothing shrinks and the job runs on. (Before, the next process to touch
/// a truncated segment died of SIGBUS.) Without the privilege to open `map_files`, says so.
fn shrink_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    ctx.barrier()?;
    let mut tried = 0;
    let mut shrunk = 0;
    let mut readable = false;
    for e in std::fs::read_dir("/proc/self/map_files").into_iter().flatten().flatten() {
        let target = std::fs::read_link(e.path()).unwrap_or_default().to_string_lossy().into_owned();
        if !(target.starts_with("/dev/shm/polyrail-") || target.starts_with("/memfd:polyrail-segment")) {
            continue;
        }
        readable = true;
        tried += 1;
        if std::fs::OpenOptions::new().write(true).open(e.path()).and_then(|f| f.set_len(0)).is_ok() {
            shrunk += 1;
        }
    }
    let out = std::env::var("JOBTEST_OUT").expect("JOBTEST_OUT");
    let line = if readable { format!("tried {tried} shrank {shrunk}") } else { "skipped".to_string() };
    std::fs::write(format!("{out}.{}", ctx.rank()), line).expect("report");
    ctx.barrier()?;
    sizes_scenario(ctx)
}

/// Every rank leaves a receive that nothing will match and finishes: finalize must withdraw it
/// rather than wait forever.
fn dangling_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let next = (ctx.rank() + 1) % ctx.size();
    let req = ctx.irecv(next, 4242, vec![0u8; 64])?;
    drop(req);
    // A single-copy size: its buffer is announced to `next` (RTR), so finalize withdraws it
    // through `next` (which is finalizing too) rather than freeing memory `next` could write.
    let req = ctx.irecv(next, 4243, vec![0u8; 1 << 20])?;
    drop(req);
    Ok(())
}

/// Cancels racing with the messages they would take: every rank posts [`RACE_RECEIVES`]
/// large receives from `prev` (after receive-first exchanges that turn window RTRs on, so each
/// gives `prev` its buffer's key and place), then sends as many messages to `next` while
/// cancelling a receive (chosen at random) after every other send, posting a fresh one for
/// each that was withdrawn. Each message takes the earliest live receive, so the receives, in
/// post order, must hold messages 0, 1, 2, ... whole: a withdrawal that let a send write into
/// the wrong receive, or lost a message, shows here.
fn cancel_race_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    const LEN: usize = 100_000;
    let (me, n) = (ctx.rank(), ctx.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    for _ in 0..2 {
        let r = ctx.irecv(prev, 6999, vec![0u8; LEN])?;
        ctx.barrier()?;
        ctx.send(next, 6999, &stamp(me, 6999, LEN))?;
        ctx.wait(r)?;
    }
    let message = |from: u32, i: usize| {
        let mut m = stamp(from, 7000, LEN);
        m[..8].copy_from_slice(&(i as u64).to_le_bytes());
        m
    };
    // A receive no message can match is always withdrawn (the race below may withdraw none).
    let unmatched = ctx.irecv(prev, 7001, vec![0u8; LEN])?;
    assert!(matches!(ctx.cancel(unmatched)?, Cancel::Cancelled(_)), "rank {me}: a receive nothing matches stayed");
    let mut live = Vec::new(); // (post order, request)
    for order in 0..RACE_RECEIVES {
        live.push((order, ctx.irecv(prev, 7000, vec![0u8; LEN])?));
    }
    let mut posted = RACE_RECEIVES;
    let (mut sends, mut cancelled) = (Vec::new(), 0);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(me);
    for i in 0..RACE_RECEIVES {
        sends.push(ctx.isend(next, 7000, message(me, i))?);
        if i % 2 == 0 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let k = rng as usize % live.len();
            let (order, req) = live.remove(k);
            match ctx.cancel(req)? {
                Cancel::Cancelled(buf) => {
                    cancelled += 1;
                    live.push((posted, ctx.irecv(prev, 7000, buf)?));
                    posted += 1;
                }
                Cancel::NotCancelled(req) => live.push((order, req)),
            }
        }
    }
    let mut got = Vec::new();
    for (order, req) in live {
        let done = ctx.wait(req)?;
        assert_eq!(done.status.len, LEN, "rank {me}: receive {order} got a message of another length");
        let i = u64::from_le_bytes(done.buf[..8].try_into().expect("8 bytes")) as usize;
        assert!(
            i < RACE_RECEIVES && done.buf == message(prev, i),
            "rank {me}: receive {order} holds a corrupted message"
        );
        got.push((order, i));
    }
    for s in sends {
        ctx.wait(s)?;
    }
    got.sort_unstable();
    let in_order: Vec<usize> = got.iter().map(|&(_, i)| i).collect();
    assert_eq!(in_order, (0..RACE_RECEIVES).collect::<Vec<_>>(), "rank {me}: messages out of post order");
    eprintln!("rank {me}: cancel race: {cancelled} of {} cancels withdrew their receive", RACE_RECEIVES / 2);
    Ok(())
}

/// Matching spaces over real channels: each rank sends its neighbour a rendezvous-sized message
/// in one space, an eager one in the world and a medium one in another, all with the same tag;
/// the neighbour receives them in the opposite order with ANY_SOURCE / ANY_TAG receives, and
/// each takes the message of its own space.
fn spaces_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let (me, n) = (ctx.rank(), ctx.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let (a, b) = (ctx.new_space()?, ctx.new_space()?);
    let sizes = [(&a, 300_000usize), (&Space::WORLD, 8), (&b, 40_000)];
    let mut recvs = Vec::new();
    for (space, len) in sizes.iter().rev() {
        recvs.push(ctx.in_space(space)?.irecv(ANY_SOURCE, ANY_TAG, vec![0u8; *len])?);
    }
    let mut sends = Vec::new();
    for (i, (space, len)) in sizes.iter().enumerate() {
        sends.push(ctx.in_space(space)?.isend(next, 1, stamp(me, 4000 + i as u32, *len))?);
    }
    for (r, (i, &(_, len))) in recvs.into_iter().zip(sizes.iter().enumerate().rev()) {
        let done = ctx.wait(r)?;
        assert_eq!((done.status.source, done.status.len), (prev, len), "rank {me}: space of message {i}");
        assert!(done.buf == stamp(prev, 4000 + i as u32, len), "rank {me}: message {i} corrupted");
    }
    for s in sends {
        ctx.wait(s)?;
    }
    // A ring shift in a space with a world message of the same tag waiting, by sendrecv and in
    // a scope of another space.
    let world = ctx.isend(next, 2, stamp(me, 4100, 64))?;
    let mut from_prev = vec![0u8; 300_000];
    let st = ctx.in_space(&a)?.sendrecv(next, 2, &stamp(me, 4101, 300_000), ANY_SOURCE, ANY_TAG, &mut from_prev)?;
    assert!(st.source == prev && from_prev == stamp(prev, 4101, 300_000), "rank {me}: sendrecv in a space");
    let out = stamp(me, 4102, 40_000);
    ctx.in_space(&b)?.scope(|s| {
        let r = s.irecv(prev, ANY_TAG, &mut from_prev[..40_000])?;
        let w = s.isend(next, 2, &out)?;
        s.wait_all(vec![r, w]).map(|_| ())
    })?;
    assert!(from_prev[..40_000] == stamp(prev, 4102, 40_000), "rank {me}: scope in a space");
    let got = ctx.recv(prev, 2, &mut from_prev)?;
    assert!(from_prev[..got.len] == stamp(prev, 4100, 64), "rank {me}: the world's message");
    ctx.wait(world)?;
    split_spaces(ctx)
}

/// Split spaces: the job in two interleaved halves ranked backwards, the even half split again
/// in pairs (the odd half not), then the whole job again, its ranks having used different
/// numbers of matching contexts. A ring shift in each space at once (ANY_SOURCE, the same tag,
/// a world message of that tag waiting) takes its own messages, with statuses naming ranks of
/// the space; a probe, a barrier and a new whole-job space after the splits agree everywhere.
fn split_spaces(ctx: &mut Context) -> polyrail::Result<()> {
    let (me, n) = (ctx.rank(), ctx.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let half = ctx.split(Some(me % 2), n - me)?.expect("a color was given");
    let backwards: Vec<u32> = (0..n).rev().filter(|r| r % 2 == me % 2).collect();
    assert_eq!(half.job_ranks(), Some(&backwards[..]), "rank {me}: the half's ranks");
    let pairs = match me % 2 {
        0 => {
            let mut h = ctx.in_space(&half)?;
            let hm = h.rank();
            Some(h.split(Some(hm / 2), 0)?.expect("a color was given"))
        }
        _ => None,
    };
    let all = ctx.split(Some(7), me)?.expect("a color was given");
    assert_eq!(all.job_ranks(), Some(&(0..n).collect::<Vec<_>>()[..]), "rank {me}: the whole job again");
    // (label, space, length): rendezvous, eager and medium.
    let spaces: Vec<(u32, &Space, usize)> =
        [(0, Some(&half), 300_000), (1, pairs.as_ref(), 8), (2, Some(&all), 40_000)]
            .into_iter()
            .filter_map(|(label, space, len)| space.map(|s| (label, s, len)))
            .collect();
    let world = ctx.isend(next, 5, stamp(me, 4300, 8))?;
    let mut recvs = Vec::new();
    for &(label, space, len) in &spaces {
        let mut sp = ctx.in_space(space)?;
        let (r, k) = (sp.rank(), sp.size());
        recvs.push((label, (r + k - 1) % k, len, sp.irecv(ANY_SOURCE, ANY_TAG, vec![0u8; len])?));
    }
    let mut sends = Vec::new();
    for &(label, space, len) in &spaces {
        let mut sp = ctx.in_space(space)?;
        let (r, k) = (sp.rank(), sp.size());
        sends.push(sp.isend((r + 1) % k, 5, stamp(me, 4310 + label, len))?);
    }
    for (label, from, len, r) in recvs {
        let done = ctx.wait(r)?;
        assert_eq!((done.status.source, done.status.len), (from, len), "rank {me}: status in space {label}");
        let job_from =
            spaces.iter().find(|s| s.0 == label).and_then(|s| s.1.job_ranks()).expect("split")[from as usize];
        assert!(done.buf == stamp(job_from, 4310 + label, len), "rank {me}: message of space {label}");
    }
    for s in ctx.wait_all(sends)? {
        assert_eq!(s.status.tag, 5);
    }
    let mut h = ctx.in_space(&half)?;
    let (hm, hn) = (h.rank(), h.size());
    // Not a blocking send: over forced cma even 8 bytes wait for their receiver.
    let probed = h.isend((hm + 1) % hn, 6, b"probe me".to_vec())?;
    let st = h.probe(ANY_SOURCE, 6)?;
    assert_eq!((st.source, st.len), ((hm + hn - 1) % hn, 8), "rank {me}: probe in the half");
    let mut buf = [0u8; 8];
    assert_eq!(h.recv(st.source, 6, &mut buf)?.source, st.source);
    assert!(matches!(h.send(hn, 6, b""), Err(Error::InvalidArgument(_))), "rank {me}: rank {hn} is outside the half");
    assert_eq!(ctx.wait(probed)?.status.source, (hm + 1) % hn, "rank {me}: a send's status in the half");
    for &(_, space, _) in &spaces {
        ctx.in_space(space)?.barrier()?;
    }
    let got = ctx.recv(prev, 5, &mut buf)?;
    assert!(buf[..got.len] == stamp(prev, 4300, 8), "rank {me}: the world's message");
    ctx.wait(world)?;
    // By node: each rank tells every other its virtual node; the node space holds exactly the
    // ranks of this one, in job order.
    let node = ctx.split_by_node()?;
    let my_node = std::env::var("POLYRAIL_NODE").unwrap_or_default();
    let told: Vec<_> = (0..n).filter(|&r| r != me).map(|r| ctx.isend(r, 10, my_node.clone().into_bytes())).collect();
    let mut same = Vec::new();
    for r in 0..n {
        let mut theirs = [0u8; 16];
        let len = if r == me { 0 } else { ctx.recv(r, 10, &mut theirs)?.len };
        if r == me || theirs[..len] == *my_node.as_bytes() {
            same.push(r);
        }
    }
    for t in told {
        ctx.wait(t?)?;
    }
    assert_eq!(node.job_ranks(), Some(&same[..]), "rank {me} on node '{my_node}': the node's space");
    let mut on_node = ctx.in_space(&node)?;
    assert_eq!(on_node.rank() as usize, same.iter().position(|&r| r == me).unwrap_or(usize::MAX));
    on_node.barrier()?;
    let c = ctx.new_space()?;
    let mut buf = [0u8; 64];
    let st = ctx.in_space(&c)?.sendrecv(next, 8, &stamp(me, 4320, 64), prev, ANY_TAG, &mut buf)?;
    assert!(st.source == prev && buf[..] == stamp(prev, 4320, 64), "rank {me}: a new space after the splits");
    typed_ring(ctx, 4400)?;
    typed_ring(&mut ctx.in_space(&half)?, 4500)
}

/// Typed messages in any communicator (the world, a split space): a ring shift of `f64`s by
/// `sendrecv_typed` and of `u32`s by `isend_typed`/`irecv_typed`, eager to rendezvous sizes,
/// values checked; 12 bytes received as `f64`s are an error naming the sizes.
fn typed_ring(c: &mut Comm<impl CommKind>, salt: u32) -> polyrail::Result<()> {
    let (me, n) = (c.rank(), c.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let floats = |from: u32, len: usize| -> Vec<f64> {
        (0..len).map(|i| f64::from(from) * 1e6 + f64::from(salt) + i as f64 * 0.125).collect()
    };
    let words = |from: u32, len: usize| -> Vec<u32> {
        (0..len as u32).map(|i| i.wrapping_mul(2654435761) ^ (from << 24) ^ salt).collect()
    };
    for len in [1usize, 100, 5000, 40_000] {
        let mut got = vec![0.0f64; len];
        let st = c.sendrecv_typed(next, 1, &floats(me, len), ANY_SOURCE, 1, &mut got)?;
        assert_eq!((st.source, st.len), (prev, len * 8), "salt {salt}: status of {len} f64s");
        assert!(got == floats(prev, len), "salt {salt}: {len} f64s from {prev} corrupted");
        let r = c.irecv_typed(prev, 2, vec![0u32; len])?;
        let s = c.isend_typed(next, 2, words(me, len))?;
        let done = c.wait(r)?;
        assert_eq!((done.status.source, done.status.len), (prev, len * 4), "salt {salt}: status of {len} u32s");
        assert!(done.buf == words(prev, len), "salt {salt}: {len} u32s from {prev} corrupted");
        assert!(c.wait(s)?.buf == words(me, len), "salt {salt}: a typed send's vector given back");
    }
    let r = c.irecv_typed(prev, 3, vec![0.0f64; 2])?;
    let s = c.isend(next, 3, vec![7u8; 12])?;
    match c.wait(r) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("12-byte") && m.contains("8-byte"), "{m}"),
        other => panic!("salt {salt}: 12 bytes received as f64s gave {other:?}"),
    }
    c.wait(s).map(|_| ())
}

/// A space whose other members finished: the job in pairs, the second of each pair finalizing at
/// once, while the first waits in its pair with an ANY_SOURCE receive. The receive must end
/// with an error (the partner finished, or every other member has) although the other pairs'
/// ranks live on; before the engine knew a space's members it waited for every rank of the
/// job, whose first ranks waited for it in turn.
fn space_ends_scenario(ctx: &mut Context) -> polyrail::Result<()> {
    let me = ctx.rank();
    let pair = ctx.split(Some(me / 2), me)?.expect("a color was given");
    let mut in_pair = ctx.in_space(&pair)?;
    if in_pair.rank() == 1 || in_pair.size() == 1 {
        return Ok(());
    }
    let mut buf = [0u8; 8];
    match in_pair.recv(ANY_SOURCE, ANY_TAG, &mut buf) {
        Err(Error::PeerFinished { rank }) => assert_eq!(rank, me + 1, "rank {me}: the partner finished"),
        Err(Error::InvalidArgument(m)) => assert!(m.contains("ANY_SOURCE"), "rank {me}: {m}"),
        other => panic!("rank {me}: an ANY_SOURCE receive in a finished pair gave {other:?}"),
    }
    Ok(())
}

/// Receives each rank of [`cancel_race_scenario`] posts (and messages it sends).
const RACE_RECEIVES: usize = 24;

/// How [`orphans_scenario`] waits, and what its check expects.
#[derive(Clone, Copy, PartialEq)]
enum Orphans {
    /// Every rank waits for a message nobody sends.
    Plain,
    /// Rank 0 waits for 1 MiB from rank 1, which holds that receive's key (its RTR) and stays
    /// alive for half a second after its own wait failed.
    Keyed,
    /// As `Keyed`, but rank 1 stays alive for 13 s, longer than a wait holds out for a peer
    /// with a key (10 s).
    KeyedStuck,
}

impl Orphans {
    fn scenario(self) -> &'static str {
        match self {
            Orphans::Plain => "orphans",
            Orphans::Keyed => "orphans-keyed",
            Orphans::KeyedStuck => "orphans-stuck",
        }
    }
}

/// Every rank waits for a message, after writing `waiting` to `JOBTEST_OUT.<rank>` and its
/// process id to `JOBTEST_OUT.<rank>.pid`; the test kills the launcher with SIGKILL. Each wait
/// must then fail, with an error about the process manager or about a peer that exited on
/// noticing it first; the rank writes which to its file. With a key lent ([`Orphans`]), rank
/// 0's wait must go on until rank 1 is gone (ending at once would hand back a buffer rank 1
/// could still write), or, when rank 1 outlives the 10 s a wait holds out, stop the process
/// without returning from `recv`.
fn orphans_scenario(ctx: &mut Context, kind: Orphans) -> polyrail::Result<()> {
    let me = ctx.rank();
    let out = format!("{}.{me}", std::env::var("JOBTEST_OUT").expect("JOBTEST_OUT set"));
    std::fs::write(format!("{out}.pid"), std::process::id().to_string()).expect("write pid");
    std::fs::write(&out, "waiting").expect("write report");
    let r = if kind != Orphans::Plain && me == 0 {
        ctx.recv(1, 0, &mut vec![0u8; 1 << 20]).map(|_| ())
    } else {
        ctx.recv(ANY_SOURCE, 0, &mut [0u8; 8]).map(|_| ())
    };
    let line = match r {
        Err(e @ Error::Bootstrap(_)) => format!("manager-gone {e}"),
        Err(e @ Error::PeerLost { .. }) => format!("lost {e}"),
        other => format!("unexpected {other:?}"),
    };
    std::fs::write(&out, line).expect("write report");
    if me == 1 {
        match kind {
            Orphans::Plain => {}
            Orphans::Keyed => std::thread::sleep(Duration::from_millis(500)),
            Orphans::KeyedStuck => std::thread::sleep(Duration::from_secs(13)),
        }
    }
    std::process::exit(0);
}

/// Whether process `pid` still runs (a zombie does not).
fn runs(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// `polyrail run` (a process of its own here) killed with SIGKILL while its ranks wait for each
/// other: every rank's wait fails within a second, and nothing is left in /dev/shm. (Before
/// the ranks watched the launcher's connection, they waited forever.) With a key lent (2
/// ranks), rank 0's wait for a message whose key rank 1 holds ends only when rank 1 is lost;
/// when rank 1 outlives the wait's 10 s, rank 0's process stops without `recv` returning.
fn orphans_check(ranks: u32, nodes: u32, kind: Orphans, check: &mut impl FnMut(String, bool)) {
    let scenario = kind.scenario();
    let what = format!("{scenario} -n {ranks} on {nodes} node(s)");
    let out = std::env::temp_dir().join(format!("polyrail-jobtest-{}-{scenario}-{ranks}", std::process::id()));
    let out_s = out.to_string_lossy().into_owned();
    let report = |r: u32| std::fs::read_to_string(format!("{out_s}.{r}")).unwrap_or_default();
    let (n, k) = (ranks.to_string(), nodes.to_string());
    let mut launcher = std::process::Command::new(env!("CARGO_BIN_EXE_polyrail"))
        .args(["run", "-n", &n, "--nodes", &k, "--bind", "none", "--ranks-outlive-launcher", "--"])
        .arg(std::env::current_exe().expect("test executable"))
        .arg(scenario)
        .env("JOBTEST_OUT", &out_s)
        .spawn()
        .expect("polyrail run");
    let job = format!("pr{}", launcher.id());
    let t = Instant::now();
    while (0..ranks).any(|r| report(r) != "waiting") && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    check(format!("{what}: every rank waits"), (0..ranks).all(|r| report(r) == "waiting"));
    let pids: Vec<String> =
        (0..ranks).map(|r| std::fs::read_to_string(format!("{out_s}.{r}.pid")).unwrap_or_default()).collect();
    launcher.kill().expect("kill the launcher");
    launcher.wait().expect("reap the launcher");
    let t = Instant::now();
    let mut took = vec![None; ranks as usize];
    let limit = if kind == Orphans::KeyedStuck { Duration::from_secs(16) } else { Duration::from_secs(5) };
    while took.contains(&None) && t.elapsed() < limit {
        for (r, at) in took.iter_mut().enumerate() {
            let stopped = kind == Orphans::KeyedStuck && r == 0 && !runs(&pids[0]);
            if at.is_none() && (report(r as u32) != "waiting" || stopped) {
                *at = Some(t.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut noticed = 0;
    for (r, at) in (0..ranks).zip(took) {
        let seen = report(r);
        let _ = std::fs::remove_file(format!("{out_s}.{r}"));
        let _ = std::fs::remove_file(format!("{out_s}.{r}.pid"));
        noticed += usize::from(seen.starts_with("manager-gone") && seen.contains("process manager"));
        // A rank may also find a peer gone that exited on noticing first: either ends its wait.
        let (expected, within) = match kind {
            Orphans::Keyed if r == 0 => (&["lost rank 1"][..], Duration::from_millis(450)..Duration::from_secs(2)),
            // Stopped, its report untouched, after the 10 s and before rank 1 exits.
            Orphans::KeyedStuck if r == 0 => (&["waiting"][..], Duration::from_secs(10)..Duration::from_millis(12_500)),
            _ => (&["manager-gone", "lost"][..], Duration::ZERO..Duration::from_secs(1)),
        };
        let ok = expected.iter().any(|e| seen.starts_with(e)) && at.is_some_and(|at| within.contains(&at));
        check(format!("{what}: rank {r} saw `{seen}` after {at:?} (expected {expected:?} within {within:?})"), ok);
    }
    check(format!("{what}: {noticed} rank(s) noticed the process manager gone"), noticed > 0);
    let t = Instant::now();
    while pids.iter().any(|p| runs(p)) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20)); // the ranks' exits
    }
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let left: Vec<&String> = left.iter().filter(|f| f.contains(&format!("-{job}-"))).collect();
    check(format!("{what}: nothing left in /dev/shm ({left:?})"), left.is_empty());
}

/// Ranks that no allowed channel connects (shm only, on two virtual nodes): `init` fails at
/// once (its barrier cannot reach the other node) with an error naming the rank and each
/// channel's reason. Each rank writes what it saw to `JOBTEST_OUT.<rank>`.
fn unreachable_scenario() {
    let t = Instant::now();
    let err = match Context::init() {
        Ok(_) => "init succeeded".to_string(),
        Err(e) => e.to_string(),
    };
    let rank = std::env::var("PMI_RANK").unwrap_or_default();
    let out = std::env::var("JOBTEST_OUT").expect("JOBTEST_OUT");
    std::fs::write(format!("{out}.{rank}"), format!("{} ms: {err}", t.elapsed().as_millis())).expect("report");
}

/// A channel that fails to start in every rank (shm, asked for segments larger than the
/// memory there is) leaves each rank without a channel to its peers: one warning line per rank
/// says so, beside the line naming the cause, not one per pair of ranks.
fn short_memory_check(check: &mut impl FnMut(String, bool)) {
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let avail_kib: u64 = mem
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(u64::MAX);
    if avail_kib.saturating_mul(1024) >= 60 << 30 {
        println!("skip short memory: this machine has the 64 GiB segment asked");
        return;
    }
    let out = std::env::temp_dir().join(format!("polyrail-jobtest-{}-short", std::process::id()));
    let out_s = out.to_string_lossy().into_owned();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_polyrail"))
        .args(["run", "-n", "4", "--bind", "none", "--"])
        .arg(std::env::current_exe().expect("test executable"))
        .arg("unreachable")
        .env("JOBTEST_OUT", &out_s)
        .env("POLYRAIL_TRANSPORTS", "shm,cma")
        .env("POLYRAIL_SHM_CELLS", "65536")
        .env("POLYRAIL_SHM_CELL_SIZE", "1m")
        .env("POLYRAIL_LOG", "warn")
        .output()
        .expect("polyrail run");
    for r in 0..4 {
        let _ = std::fs::remove_file(format!("{out_s}.{r}"));
    }
    let err = String::from_utf8_lossy(&run.stderr);
    let lines = err.lines().filter(|l| l.contains("WARN") && l.contains("no channel carries messages")).count();
    let causes = err.lines().filter(|l| l.contains("shm channel unavailable") && l.contains("memory")).count();
    let ok = lines == 4 && causes == 4;
    let output = if ok { String::new() } else { format!(":\n{err}") };
    check(format!("short memory -n 4: {lines} no-channel warning line(s), {causes} naming the cause{output}"), ok);
}

/// Checks that the routes of this rank are those its channel setting (`JOBTEST_CHANNELS`, a
/// name of [`CHANNELS`]) asks for, so that a scenario over a channel really ran over it (a
/// channel that cannot reach a peer only gets a warning, and the route is built from the rest).
fn check_routes(ctx: &Context) {
    let Ok(setting) = std::env::var("JOBTEST_CHANNELS") else { return };
    let report = ctx.report();
    let kind = |e: &polyrail::RouteEntry| report.channel_kind(e.channel).expect("a route names a started channel");
    for peer in report.peers.iter().filter(|p| p.rank != ctx.rank()) {
        let route = peer.route.as_ref().unwrap_or_else(|| panic!("no route to rank {}", peer.rank));
        let at = |size: usize| {
            let e = route.lookup(size);
            (e.protocol, kind(e))
        };
        let kinds: Vec<TransportKind> = route.entries.iter().map(kind).collect();
        let what = format!("{setting}: route of rank {} to rank {}: {route:?}", ctx.rank(), peer.rank);
        let remote = peer.class == polyrail::TopoClass::RemoteNode;
        use polyrail::Protocol::{Eager, RndvGet, RndvSplit, RndvStream};
        let (shm, cma, ib) = (TransportKind::new("shm"), TransportKind::new("cma"), TransportKind::new("ib"));
        let scif = TransportKind::new("scif");
        match setting.as_str() {
            // Host and devices: scif between the domains of a node, ib between nodes.
            "devices" => {
                let (mine, theirs) = (report.place, peer.place);
                if mine.0 != theirs.0 {
                    assert!(remote && kinds.iter().all(|&k| k == ib), "{what}");
                } else if mine.1 != theirs.1 {
                    assert!(kinds.iter().all(|&k| k == scif), "{what}");
                } else {
                    assert!(kinds.contains(&shm), "{what}");
                }
            }
            "auto" | "2 nodes" if !remote => {
                assert!(kinds.contains(&shm) && kinds.contains(&cma), "{what}");
            }
            "2 nodes" | "ib only" => assert!(kinds.iter().all(|&k| k == ib), "{what}"),
            "shm" => assert!(kinds.iter().all(|&k| k == shm), "{what}"),
            "cma" | "cma-share-30" => assert!(at(1).1 == cma && at(8 << 20).1 == cma, "{what}"),
            "cma-nosplit" => {
                assert!(at(1) == (RndvGet, cma) && at(8 << 20) == (RndvGet, cma), "{what}");
            }
            "routed" => {
                assert!(route.as_written, "{what}");
                assert_eq!(
                    [at(0).0, at(2 << 10).0, at(100 << 10).0, at(2 << 20).0],
                    [Eager, RndvGet, RndvStream, RndvSplit]
                );
                assert_eq!([at(2 << 10).1, at(100 << 10).1, at(2 << 20).1], [cma, shm, cma], "{what}");
            }
            "stream-eager" => assert!(route.stream_eager.is_some(), "{what}"),
            "near" | "apart" => assert!(route.placement.is_some(), "{what}"),
            other => panic!("no route check for channel setting {other:?}"),
        }
    }
}

fn rank_main(scenario: &str) {
    MappedHeap::set_enabled(false);
    if scenario == "unreachable" {
        return unreachable_scenario();
    }
    let mut ctx = Context::init().expect("init");
    // The process manager's connection serves one Context.
    assert!(matches!(Context::init(), Err(Error::Bootstrap(_))), "a second init in one process");
    check_routes(&ctx);
    let r = match scenario {
        "sizes" => sizes_scenario(&mut ctx),
        "order" => order_scenario(&mut ctx),
        "wildcard" => wildcard_scenario(&mut ctx),
        "truncate" => truncate_scenario(&mut ctx),
        "kill" | "exit" => fault_scenario(&mut ctx, scenario),
        "scope-panic" => scope_panic_scenario(&mut ctx),
        "shm-names" => shm_names_scenario(&mut ctx),
        "shrink" => shrink_scenario(&mut ctx),
        "sleepers" => sleepers_scenario(&mut ctx),
        "dangling" => dangling_scenario(&mut ctx),
        "flood" => flood_scenario(&mut ctx),
        "registered" => registered_scenario(&mut ctx),
        "heap" => heap_scenario(&mut ctx),
        "pingpong" => pingpong_scenario(&mut ctx),
        "orphans" => orphans_scenario(&mut ctx, Orphans::Plain),
        "orphans-keyed" => orphans_scenario(&mut ctx, Orphans::Keyed),
        "orphans-stuck" => orphans_scenario(&mut ctx, Orphans::KeyedStuck),
        "cancel-race" => cancel_race_scenario(&mut ctx),
        "spaces" => spaces_scenario(&mut ctx),
        "space-ends" => space_ends_scenario(&mut ctx),
        other => panic!("unknown scenario {other}"),
    };
    if let Err(e) = r {
        eprintln!("rank {}: scenario {scenario} failed: {e}", ctx.rank());
        std::process::exit(1);
    }
    if scenario != "space-ends" {
        ctx.barrier().expect("final barrier"); // not after ranks finished on purpose
    }
    ctx.finalize().expect("finalize");
}

/// Runs `scenario` with `ranks` ranks; `nodes` > 1 spreads them over that many virtual nodes.
fn job_on(ranks: u32, nodes: u32, scenario: &str, env: &[(&str, &str)]) -> i32 {
    job_bound(ranks, nodes, Bind::Core, scenario, env)
}

/// How long one scenario's job may run.
const JOB_TIMEOUT: Duration = Duration::from_secs(60);

/// [`job_on`] with a CPU binding.
fn job_bound(ranks: u32, nodes: u32, bind: Bind, scenario: &str, env: &[(&str, &str)]) -> i32 {
    let exe = std::env::current_exe().expect("test executable");
    let mut opts = LaunchOptions::new(ranks, exe);
    opts.bind = bind;
    opts.args = vec![scenario.into()];
    opts.env = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    // A scenario takes a few seconds at most: one that deadlocks fails instead of hanging CI.
    opts.timeout = Some(JOB_TIMEOUT);
    if nodes > 1 {
        opts.nodes = Some(nodes_in_blocks(ranks, nodes.min(ranks)).expect("layout"));
    }
    launch(&opts).expect("launch")
}

/// Runs `scenario` with `ranks` ranks placed by `layout` (`polyrail run --layout`).
fn job_layout(ranks: u32, layout: &str, scenario: &str, env: &[(&str, &str)]) -> i32 {
    let exe = std::env::current_exe().expect("test executable");
    let mut opts = LaunchOptions::new(ranks, exe);
    opts.args = vec![scenario.into()];
    opts.env = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    opts.timeout = Some(JOB_TIMEOUT);
    let layout = Layout::parse(ranks, layout).expect("layout");
    opts.nodes = Some(layout.nodes);
    opts.domains = Some(layout.domains);
    launch(&opts).expect("launch")
}

/// Files of this process's jobs left in /dev/shm and the SCIF provider's directories.
fn leftovers() -> Vec<String> {
    let uid = user_id();
    let tag = format!("pr{}", std::process::id());
    let mut left = Vec::new();
    for (dir, prefix) in [("/dev/shm", format!("polyrail-{uid}-{tag}")), ("/tmp", format!("polyrail-scif.{uid}.{tag}"))]
    {
        let base = if dir == "/tmp" { std::env::var("XDG_RUNTIME_DIR").ok().filter(|d| !d.is_empty()) } else { None };
        for d in [Some(dir.to_string()), base].into_iter().flatten() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) {
                    left.push(format!("{d}/{name}"));
                }
            }
        }
    }
    left
}

/// This process's user id (from /proc, no libc call).
fn user_id() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().next()).unwrap_or("0").into()
}

/// Host and device ranks (`--layout 1+2,1+2`): the message scenarios with scif between the
/// host and the devices of a node, ib between nodes, shm and cma within a device; then a killed
/// device rank, which every survivor must name within a second, leaving no files.
fn devices_section(check: &mut impl FnMut(String, bool)) {
    for scenario in ["sizes", "order", "wildcard", "truncate", "registered"] {
        let t = Instant::now();
        let code = job_layout(6, "1+2,1+2", scenario, &[("JOBTEST_CHANNELS", "devices")]);
        check(format!("{scenario} -n 6 --layout 1+2,1+2 ({:.1} s)", t.elapsed().as_secs_f64()), code == 0);
    }
    for how in ["kill", "exit"] {
        let out = std::env::temp_dir().join(format!("polyrail-jobtest-{}-device-{how}", std::process::id()));
        let out_s = out.to_string_lossy().into_owned();
        // Rank 1 is the device rank of node 0; rank 0 its host (scif), ranks 2 and 3 on node 1 (ib).
        let code = job_layout(4, "1+1,1+1", how, &[("JOBTEST_OUT", &out_s)]);
        check(format!("device {how} -n 4 --layout 1+1,1+1: job status {code} is a failure"), code != 0);
        for r in [0, 2, 3] {
            let f = format!("{out_s}.{r}");
            let seen = std::fs::read_to_string(&f).unwrap_or_else(|_| "no report".into());
            let _ = std::fs::remove_file(&f);
            let ms: Option<u64> = seen.strip_prefix("lost-detected ").and_then(|s| s.split(' ').next()?.parse().ok());
            let named = seen.contains("rank 1");
            check(format!("device {how}: rank {r} saw `{seen}`"), named && ms.is_some_and(|ms| ms < 1000));
        }
        let left = leftovers();
        check(format!("device {how}: files left: {left:?}"), left.is_empty());
    }
}

fn job(ranks: u32, scenario: &str, env: &[(&str, &str)]) -> i32 {
    job_on(ranks, 1, scenario, env)
}

/// Environment variables of a job.
type Vars = &'static [(&'static str, &'static str)];

/// Single copy for every non-empty message, whatever the placement.
const CMA_ONLY: Vars =
    &[("POLYRAIL_CMA_THRESHOLD", "1"), ("POLYRAIL_NEAR_EAGER", "off"), ("POLYRAIL_APART_SINGLE_COPY", "off")];

/// Channel settings: name, virtual nodes, variables.
const CHANNELS: &[(&str, u32, Vars)] = &[
    ("auto", 1, &[]),
    ("shm", 1, &[("POLYRAIL_TRANSPORTS", "shm")]),
    ("cma", 1, CMA_ONLY),
    (
        "cma-nosplit",
        1,
        &[
            ("POLYRAIL_CMA_THRESHOLD", "1"),
            ("POLYRAIL_NEAR_EAGER", "off"),
            ("POLYRAIL_APART_SINGLE_COPY", "off"),
            ("POLYRAIL_SPLIT_THRESHOLD", "off"),
        ],
    ),
    ("routed", 1, &[("POLYRAIL_ROUTE", "all:1k-64k:cma/get,all:64k-1m:shm/stream,all:1m-:cma/split")]),
    // Two virtual nodes: shm and cma within a node, ib (software provider) between them.
    ("2 nodes", 2, &[]),
    // ib for every peer, with small rings so that credits run out often, and a receiver-first
    // rendezvous mix (put) through POLYRAIL_ROUTE.
    (
        "ib only",
        1,
        &[
            ("POLYRAIL_TRANSPORTS", "ib"),
            ("POLYRAIL_IB_PROVIDER", "soft"),
            ("POLYRAIL_IB_CREDITS", "4"),
            ("POLYRAIL_IB_BLOCK", "1k"),
            ("POLYRAIL_IB_EAGER_LIMIT", "2k"),
        ],
    ),
    // Single-copy sizes of a stream through the send cells (off by default).
    ("stream-eager", 1, &[("POLYRAIL_STREAM_EAGER", "auto")]),
    // Both halves of the placement rule, whatever the host does with our vCPUs: near, up to
    // 128k through the cells; apart, below 64k through cells filled with non-temporal stores.
    ("near", 1, &[("POLYRAIL_PLACEMENT", "near")]),
    ("apart", 1, &[("POLYRAIL_PLACEMENT", "apart")]),
    // Split messages divided elsewhere than in halves (the automatic share tries three eighths
    // and a quarter only after 16 messages of a size class, which few scenarios send).
    (
        "cma-share-30",
        1,
        &[
            ("POLYRAIL_CMA_THRESHOLD", "1"),
            ("POLYRAIL_NEAR_EAGER", "off"),
            ("POLYRAIL_APART_SINGLE_COPY", "off"),
            ("POLYRAIL_SPLIT_SHARE", "30"),
        ],
    ),
];

fn main() {
    if std::env::var_os("PMI_FD").is_some() {
        let scenario = std::env::args().nth(1).unwrap_or_default();
        rank_main(&scenario);
        return;
    }
    // Under `cargo test`, arguments are test filters: nothing to filter in this binary.
    let mut failures = Vec::new();
    let mut check = |what: String, ok: bool| {
        println!("{} {what}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            failures.push(what);
        }
    };
    devices_section(&mut check);
    if std::env::var("JOBTEST_ONLY").is_ok_and(|v| v == "devices") {
        return report(failures);
    }
    for &ranks in &[2u32, 4, 8] {
        for (name, nodes, env) in CHANNELS {
            for scenario in
                ["sizes", "order", "wildcard", "truncate", "registered", "heap", "cancel-race", "spaces", "space-ends"]
            {
                if ranks == 8 && scenario == "order" && *name != "auto" {
                    continue; // the 8-rank order run over each forced channel adds little time-wise value
                }
                if (scenario == "registered" || scenario == "heap") && *name == "shm" {
                    continue; // shm copies through its cells whatever the buffer is
                }
                let t = Instant::now();
                let mut vars = env.to_vec();
                vars.push(("JOBTEST_CHANNELS", name));
                let code = job_on(ranks, *nodes, scenario, &vars);
                check(format!("{scenario} -n {ranks} over {name} ({:.1} s)", t.elapsed().as_secs_f64()), code == 0);
            }
        }
    }
    // The split share's search with real copies: cma within a node, ib between two.
    for (ranks, nodes) in [(2u32, 1u32), (4, 1), (2, 2)] {
        let t = Instant::now();
        let code = job_on(ranks, nodes, "pingpong", &[]);
        check(format!("pingpong -n {ranks} on {nodes} node(s) ({:.1} s)", t.elapsed().as_secs_f64()), code == 0);
    }
    for (ranks, nodes) in [(2u32, 1u32), (4, 1), (2, 2), (4, 2)] {
        for how in ["kill", "exit"] {
            let out = std::env::temp_dir().join(format!("polyrail-jobtest-{}-{how}-{ranks}", std::process::id()));
            let out_s = out.to_string_lossy().into_owned();
            let code = job_on(ranks, nodes, how, &[("JOBTEST_OUT", &out_s)]);
            let how = if nodes > 1 { format!("{how} on {nodes} nodes") } else { how.to_string() };
            check(format!("{how} -n {ranks}: job status {code} is a failure"), code != 0);
            for r in (0..ranks).filter(|&r| r != 1) {
                let f = format!("{out_s}.{r}");
                let seen = std::fs::read_to_string(&f).unwrap_or_else(|_| "no report".into());
                let _ = std::fs::remove_file(&f);
                let ms: Option<u64> =
                    seen.strip_prefix("lost-detected ").and_then(|s| s.split(' ').next()?.parse().ok());
                check(format!("{how} -n {ranks}: rank {r} saw `{seen}`"), ms.is_some_and(|ms| ms < 1000));
            }
        }
    }
    let t = Instant::now();
    let code = job(2, "scope-panic", &[]);
    let secs = t.elapsed().as_secs_f64();
    check(format!("scope-panic -n 2: status {code} after {secs:.1} s"), code != 0 && (9.5..30.0).contains(&secs));
    for (ranks, nodes, kind) in
        [(2u32, 1u32, Orphans::Plain), (4, 2, Orphans::Plain), (2, 1, Orphans::Keyed), (2, 1, Orphans::KeyedStuck)]
    {
        orphans_check(ranks, nodes, kind, &mut check);
    }
    // Oversubscribed: 8 ranks on this machine's cores, 6 of them blocked in a receive. They must
    // sleep on the doorbell, not spin (the issue asks under 1 % CPU; 3 % leaves room for noise).
    // On two virtual nodes the sleepers also poll ib, which cannot ring the doorbell: they nap
    // on it (from 100 µs, doubling up to 2 ms) instead of sleeping through; on 8 nodes every
    // rank has only ib, no doorbell at all, and naps with a plain sleep. Unbound, 3 ranks on 2
    // virtual nodes: the sleeper (ib only) could take a core share from the busy pair by
    // polling and yielding, which bound and oversubscribed ranks hide.
    for (ranks, nodes, bind) in [(8, 1u32, Bind::Core), (8, 2, Bind::Core), (8, 8, Bind::Core), (3, 2, Bind::None)] {
        let what = format!("sleepers -n {ranks} on {nodes} node(s), bind {bind:?}");
        let out =
            std::env::temp_dir().join(format!("polyrail-jobtest-{}-sleepers-{ranks}-{nodes}", std::process::id()));
        let out_s = out.to_string_lossy().into_owned();
        let code = job_bound(ranks, nodes, bind, "sleepers", &[("JOBTEST_OUT", &out_s)]);
        check(format!("{what}: job status {code}"), code == 0);
        for r in 2..ranks {
            let f = format!("{out_s}.{r}");
            let seen = std::fs::read_to_string(&f).unwrap_or_default();
            let _ = std::fs::remove_file(&f);
            let v: Vec<f64> = seen.split(' ').filter_map(|x| x.parse().ok()).collect();
            let ok = v.len() == 2 && v[1] >= 900.0 && v[0] < 0.03 * v[1];
            check(format!("{what}: rank {r} used {seen:?} (cpu ms, wall ms) while blocked"), ok);
        }
    }
    for (name, nodes, env) in [("2 nodes", 2, &[][..]), ("ib only", 1, CHANNELS[6].2)] {
        let t = Instant::now();
        let code = job_on(2, nodes, "flood", env);
        check(format!("flood -n 2 over {name}: status {code}, {:.1} s", t.elapsed().as_secs_f64()), code == 0);
    }
    let out = std::env::temp_dir().join(format!("polyrail-jobtest-{}-unreachable", std::process::id()));
    let out_s = out.to_string_lossy().into_owned();
    let code = job_on(2, 2, "unreachable", &[("POLYRAIL_TRANSPORTS", "shm"), ("JOBTEST_OUT", &out_s)]);
    check(format!("unreachable -n 2 on 2 nodes over shm only: job status {code}"), code == 0);
    for r in 0..2 {
        let f = format!("{out_s}.{r}");
        let seen = std::fs::read_to_string(&f).unwrap_or_else(|_| "no report".into());
        let _ = std::fs::remove_file(&f);
        let ms: Option<u64> = seen.split(' ').next().and_then(|ms| ms.parse().ok());
        let named = seen.contains(&format!("no channel carries messages to rank {}", 1 - r))
            && seen.contains("virtual node")
            && seen.contains("POLYRAIL_TRANSPORTS=shm");
        check(format!("unreachable: rank {r} saw `{seen}`"), named && ms.is_some_and(|ms| ms < 1000));
    }
    short_memory_check(&mut check);
    let t = Instant::now();
    let code = job(4, "dangling", &[]);
    check(format!("dangling receives -n 4: status {code}, {:.1} s", t.elapsed().as_secs_f64()), code == 0);
    let code = job(2, "shm-names", &[]);
    check("shm-names -n 2".to_string(), code == 0);
    // Segments truncated under the job: refused, and the job runs on (no SIGBUS).
    let out = std::env::temp_dir().join(format!("polyrail-jobtest-{}-shrink", std::process::id()));
    let out_s = out.to_string_lossy().into_owned();
    let code = job(2, "shrink", &[("POLYRAIL_TRANSPORTS", "shm"), ("JOBTEST_OUT", &out_s)]);
    for r in 0..2 {
        let f = format!("{out_s}.{r}");
        let seen = std::fs::read_to_string(&f).unwrap_or_else(|_| "no report".into());
        let _ = std::fs::remove_file(&f);
        let n: Vec<u32> = seen.split(' ').filter_map(|w| w.parse().ok()).collect();
        let ok = seen == "skipped" || (n.len() == 2 && n[0] >= 2 && n[1] == 0);
        check(format!("shrink -n 2: rank {r} {seen}"), ok);
    }
    check(format!("shrink -n 2: job status {code}"), code == 0);
    // (Segments have no name in /dev/shm: `shm-names` checks that while the job runs, and
    // `orphans_check` after a job whose launcher was killed.)
    report(failures);
}

/// Ends the test: fails naming every failed job.
fn report(failures: Vec<String>) {
    if !failures.is_empty() {
        eprintln!("{} job test(s) failed: {failures:#?}", failures.len());
        std::process::exit(1);
    }
}
