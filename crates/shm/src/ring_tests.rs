//! Ring tests on heap memory: scenarios, a model-based property test, and a two-thread stress
//! test of the index, stamp and marker logic.
//!
//! They also run under Miri (loop counts scaled down, the property test skipped):
//! `MIRIFLAGS="-Zmiri-disable-weak-memory-emulation" cargo +nightly miri test -p polyrail-shm --lib ring::`
//! Weak-memory emulation is off because Miri (nightly 2026-05) stops with an internal error on
//! words written both atomically (stamps) and as plain bytes; its data-race detector stays on
//! and checks every non-atomic access against the protocol.

use super::*;
use polyrail_core::PacketKind;
use proptest::prelude::*;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::VecDeque;
use std::sync::Arc;

/// Zeroed, 128-byte aligned ring memory on the heap.
struct HeapRing {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain heap memory; the tests share it between one producer and one consumer thread
// exactly as processes share a segment.
unsafe impl Send for HeapRing {}
// SAFETY: as above; all concurrent access goes through the ring protocol.
unsafe impl Sync for HeapRing {}

impl HeapRing {
    fn new(geo: Geometry) -> HeapRing {
        let layout = Layout::from_size_align(geo.bytes(), CONTROL).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        HeapRing { ptr, layout }
    }

    fn pair(&self, geo: Geometry) -> (Producer, Consumer) {
        // SAFETY: the memory is zeroed, aligned, large enough and outlives both sides in every
        // test; one producer and one consumer are made per ring.
        unsafe { (Producer::new(self.ptr, geo), Consumer::new(self.ptr, geo)) }
    }
}

impl Drop for HeapRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A header with no compact form (every field but the kind from `n`).
fn header(n: u64) -> Header {
    Header {
        kind: PacketKind::Data,
        flags: Header::STREAM,
        ctx: n as u16,
        tag: n as u32,
        seq: !n as u32,
        len: n << 20,
        sreq: 0xa5,
        rreq: n as u32 ^ 0x5a,
        offset: n << 3,
    }
}

fn payload(n: u64, len: usize) -> Vec<u8> {
    // Wrapping: property tests pass any n (a debug build checks overflow).
    (0..len).map(|i| (n as usize).wrapping_mul(31).wrapping_add(i.wrapping_mul(7)) as u8).collect()
}

/// Pops one message if there is one and checks it is message `n` of `len` bytes.
fn pop_check(c: &mut Consumer, n: u64, len: usize) -> bool {
    pop_check_header(c, &header(n), n, len)
}

/// As `pop_check`, for a message sent with header `hdr`.
fn pop_check_header(c: &mut Consumer, hdr: &Header, n: u64, len: usize) -> bool {
    let took = c.take(|h, body| {
        assert_eq!(h, hdr, "header of message {n}");
        match body {
            Body::Inline(p) => assert!(p == payload(n, len).as_slice(), "payload of message {n} ({len} bytes)"),
            Body::Cell { .. } => panic!("unexpected cell message"),
        }
        Ok(())
    });
    if !took.expect("ring corrupt") {
        c.idle();
        return false;
    }
    true
}

/// The header the engine gives a whole eager message `n` of `len` bytes (compact in a record).
fn eager(n: u64, len: usize) -> Header {
    Header::eager(0, n as u32, n as u32, len as u64)
}

#[test]
fn geometry_limits() {
    let g = Geometry::new(256, 17);
    assert_eq!(RECORD_INLINE, 112);
    assert_eq!(g.inline_max(), 17 * 64);
    // Bodies take at least two slots: every payload a record carries fits in a body too (a
    // message with a whole header puts it there).
    assert_eq!(Geometry::new(256, 1).max_msg_slots, 2);
    assert!(Geometry::new(256, 1).inline_max() >= RECORD_INLINE);
    assert_eq!(Shape::of(true, 112, false), Shape { kind: KIND_INLINE, nbody: 0 });
    assert_eq!(Shape::of(true, 113, false), Shape { kind: KIND_BODY, nbody: 2 });
    assert_eq!(Shape::of(true, 129, false), Shape { kind: KIND_BODY, nbody: 3 });
    assert_eq!(Shape::of(false, 0, false), Shape { kind: KIND_FULL, nbody: 0 });
    assert_eq!(Shape::of(false, 64, false), Shape { kind: KIND_FULL, nbody: 1 });
    assert_eq!(Shape::of(false, 65, false), Shape { kind: KIND_FULL, nbody: 2 });
    assert_eq!(Shape::of(false, g.inline_max(), false), Shape { kind: KIND_FULL, nbody: 17 });
    assert_eq!(Shape::of(false, 1 << 20, true), Shape { kind: KIND_FULL_CELL, nbody: 0 });
    assert_eq!(Shape::of(true, 1 << 20, true), Shape { kind: KIND_CELL, nbody: 0 });
    // Small rings clamp the message size to a quarter of the ring, large ones to 1023 slots.
    assert_eq!(Geometry::new(16, 17).max_msg_slots, 4);
    assert_eq!(Geometry::new(1 << 16, 1 << 16).max_msg_slots, Geometry::MAX_MSG_SLOTS);
    assert!(Geometry::new(1 << 16, 1 << 16).inline_max() <= u16::MAX as usize);
}

#[test]
fn every_size_through_many_laps() {
    // The largest bodies a small ring allows, and the smallest any ring allows (a record's
    // payload with a whole header goes to the body: it must fit there too).
    // The second prefetches as while the cores share no cache (second lines too), and polls
    // (which prefetches the next payload's lines) before every take.
    for (geo, slow_lines) in [(Geometry::new(16, 17), false), (Geometry::new(16, 1), true)] {
        let mem = HeapRing::new(geo);
        let (mut p, mut c) = mem.pair(geo);
        c.set_slow_lines(slow_lines);
        let mut n = 0u64;
        for round in 0..if cfg!(miri) { 3 } else { 40 } {
            for len in (0..=geo.inline_max()).step_by(if cfg!(miri) { 13 } else { 1 }) {
                // Both header forms: compact (eager, whole) and full.
                let hdr = if n % 2 == 0 { eager(n, len) } else { header(n) };
                assert!(p.try_push_inline(&hdr, &payload(n, len)).unwrap(), "{geo:?} round {round} len {len}");
                assert!(!slow_lines || c.may_have_arrival());
                assert!(pop_check_header(&mut c, &hdr, n, len));
                n += 1;
            }
        }
        assert!(!pop_check(&mut c, n, 0));
    }
}

#[test]
fn full_ring_would_block_until_consumer_publishes() {
    let geo = Geometry::new(16, 4);
    let mem = HeapRing::new(geo);
    let (mut p, mut c) = mem.pair(geo);
    let mut sent = 0u64;
    while p.try_push_inline(&header(sent), &[]).unwrap() {
        sent += 1;
    }
    assert_eq!(sent, 16, "one record per message");
    // Consuming without publishing (fewer than N/4 records) does not free anything yet.
    assert!(pop_check(&mut c, 0, 0));
    assert!(!p.try_push_inline(&header(sent), &[]).unwrap());
    for n in 1..sent {
        assert!(pop_check(&mut c, n, 0));
    }
    // Found empty: the consumer publishes, the producer sees the space.
    assert!(!pop_check(&mut c, sent, 0));
    assert!(p.try_push_inline(&header(sent), &[]).unwrap());
    assert!(pop_check(&mut c, sent, 0));
    assert!(!pop_check(&mut c, sent + 1, 0));
    // The body fills up on its own: 4-slot messages, 16 body slots.
    let big = geo.inline_max();
    let mut n = sent + 1;
    while p.try_push_inline(&header(n), &payload(n, big)).unwrap() {
        n += 1;
    }
    assert_eq!(n - sent - 1, 4, "four bodies of four slots fill the 16 body slots");
    for m in sent + 1..n {
        assert!(pop_check(&mut c, m, big));
    }
}

/// Bytes 0..16 of a valid record of a compact eager message `n` of 3 bytes (in the record);
/// its payload is written at byte 16 separately.
fn record_image(n: u64) -> [u8; 16] {
    let mut img = [0u8; 16];
    img[OFF_KIND] = KIND_INLINE;
    // Context 0, then tag and sequence id `n`, as `eager(n, 3)` says.
    img[OFF_COMPACT + 2..OFF_COMPACT + 6].copy_from_slice(&(n as u32).to_le_bytes());
    img[OFF_COMPACT + 6..OFF_PLEN].copy_from_slice(&(n as u32).to_le_bytes());
    img[OFF_PLEN..].copy_from_slice(&3u16.to_le_bytes());
    img
}

#[test]
fn corrupt_records_are_errors_not_panics() {
    let geo = Geometry::new(16, 4);
    type Mutation = fn(&mut [u8; 16]);
    let cases: &[(&str, Mutation)] = &[
        ("payload over a record", |i| i[OFF_PLEN] = 113),
        ("plen over the limit", |i| {
            i[OFF_KIND] = KIND_BODY;
            i[OFF_PLEN + 1] = 1;
        }),
        ("small payload in the body", |i| i[OFF_KIND] = KIND_BODY),
        ("kind", |i| i[OFF_KIND] = 9),
        ("reserved byte", |i| i[OFF_ZERO] = 1),
    ];
    for &(what, mutate) in cases {
        let mem = HeapRing::new(geo);
        let (mut p, mut c) = mem.pair(geo);
        // The untouched image is accepted: the mutation alone makes the difference.
        p.corrupt_next(OFF_INLINE, &payload(0, 3), false);
        p.corrupt_next(2, &record_image(0)[2..], true);
        assert!(pop_check_header(&mut c, &eager(0, 3), 0, 3), "{what}");
        assert!(p.try_push_inline(&header(1), &payload(1, 3)).unwrap());
        let mut img = record_image(2);
        mutate(&mut img);
        assert!(pop_check(&mut c, 1, 3));
        // Written where message 2 goes (head did not move past message 1 through corrupt_next).
        p.corrupt_next(2, &img[2..], true);
        let err = c.take(|_, _| Ok(())).expect_err(what);
        assert!(err.contains("record"), "{what}: {err}");
    }
    // A whole header (kind FULL) that is no engine header.
    let mem = HeapRing::new(geo);
    let (mut p, mut c) = mem.pair(geo);
    p.corrupt_next(OFF_INLINE, &[77], false);
    p.corrupt_next(OFF_KIND, &[KIND_FULL], true);
    let err = c.take(|_, _| Ok(())).unwrap_err();
    assert!(err.contains("record 0: unknown packet kind 77"), "{err}");
    // A stamp that is neither "arrived" nor "empty".
    let mem = HeapRing::new(geo);
    let (mut p, mut c) = mem.pair(geo);
    p.corrupt_next(0, &[0xad, 0xde], false);
    assert!(c.take(|_, _| Ok(())).unwrap_err().contains("stamp"));
}

#[test]
fn consumer_publishing_nonsense_is_an_error() {
    let geo = Geometry::new(16, 4);
    let mem = HeapRing::new(geo);
    let (mut p, _c) = mem.pair(geo);
    while p.try_push_inline(&header(0), &[]).unwrap() {}
    // SAFETY: test-only write to the read position, as a faulty consumer would do.
    unsafe { (*mem.ptr.as_ptr().cast::<AtomicU64>()).store(1000, Ordering::Relaxed) };
    assert!(p.try_push_inline(&header(0), &[]).is_err());
    // The send cells' reclaim loads the same position: refused there too, naming it.
    let e = p.read_position().unwrap_err();
    assert!(e.contains("1000"), "{e}");
}

#[test]
fn the_read_position_follows_what_the_consumer_published() {
    let geo = Geometry::new(16, 4);
    let mem = HeapRing::new(geo);
    let (mut p, mut c) = mem.pair(geo);
    for n in 0..5 {
        assert!(p.try_push_inline(&header(n), &[]).unwrap());
    }
    assert_eq!(p.read_position(), Ok(0));
    for _ in 0..3 {
        assert!(c.take(|_, _| Ok(())).unwrap());
    }
    assert_eq!(p.read_position(), Ok(0), "consumed, not yet published");
    c.idle(); // what an empty poll does
    assert_eq!(p.read_position(), Ok(3));
}

#[derive(Clone, Debug)]
enum Op {
    Push(usize),
    Pop,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[cfg_attr(miri, ignore)]
    /// Any interleaving of pushes (any inline size) and pops delivers exactly the accepted
    /// messages, in order, intact; the producer refuses only when the model says the ring is full
    /// from its (possibly stale) point of view.
    #[test]
    fn ring_matches_a_queue(ops in prop::collection::vec(
        prop_oneof![(0usize..=220).prop_map(Op::Push), Just(Op::Pop)], 1..600)) {
        let geo = Geometry::new(16, 4);
        let mem = HeapRing::new(geo);
        let (mut p, mut c) = mem.pair(geo);
        let mut model: VecDeque<(u64, usize)> = VecDeque::new();
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::Push(len) => {
                    let len = len.min(geo.inline_max());
                    if p.try_push_inline(&header(next), &payload(next, len)).unwrap() {
                        model.push_back((next, len));
                        next += 1;
                    }
                }
                Op::Pop => match model.front().copied() {
                    Some((n, len)) => {
                        prop_assert!(pop_check(&mut c, n, len));
                        model.pop_front();
                    }
                    None => prop_assert!(!pop_check(&mut c, next, 0)),
                },
            }
        }
        while let Some((n, len)) = model.pop_front() {
            prop_assert!(pop_check(&mut c, n, len));
        }
        prop_assert!(!pop_check(&mut c, next, 0));
        // After a full drain the producer sees all space again.
        prop_assert!(p.try_push_inline(&header(next), &payload(next, geo.inline_max())).unwrap());
    }
}

/// The record a real producer writes for message `n` of `len` bytes (with a whole header or a
/// compact one; in a send cell or in the ring), from byte 2 on (the stamp is the publisher's).
fn written_record(n: u64, len: usize, whole: bool, cell: Option<u32>) -> Vec<u8> {
    let geo = Geometry::new(16, 4);
    let mem = HeapRing::new(geo);
    let (mut p, _c) = mem.pair(geo);
    let hdr = if whole { header(n) } else { eager(n, len) };
    match cell {
        Some(index) => {
            assert!(p.reserve_cell().unwrap());
            p.push_cell(&hdr, len as u32, index);
        }
        None => assert!(p.try_push_inline(&hdr, &payload(n, len.min(geo.inline_max()))).unwrap()),
    }
    // SAFETY: record 0, inside the ring, written above; nobody else touches it.
    unsafe { std::slice::from_raw_parts(p.mem.record(0).add(2), RECORD - 2) }.to_vec()
}

/// Records as a producer writes them, each with up to three bytes changed (none, mostly): a
/// faulty peer's records that get past the consumer's first checks.
fn record_images() -> impl Strategy<Value = Vec<u8>> {
    let cell = prop_oneof![Just(None), (0u32..300).prop_map(Some)];
    let flips = prop::collection::vec((0..RECORD - 2, 1u8..=255), 0..=3);
    (any::<u64>(), 0usize..400, any::<bool>(), cell, flips).prop_map(|(n, len, whole, cell, flips)| {
        let mut img = written_record(n, len, whole, cell);
        for (at, bits) in flips {
            img[at] ^= bits;
        }
        img
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[cfg_attr(miri, ignore)]
    /// Whatever a faulty producer publishes, record after record and lap after lap, the
    /// consumer hands over a message whose payload lies inside the ring (it is read whole here)
    /// or says which record is wrong; it never panics.
    #[test]
    fn any_published_record_is_a_message_or_an_error(images in prop::collection::vec(record_images(), 1..48)) {
        let geo = Geometry::new(16, 4);
        let mem = HeapRing::new(geo);
        let (mut p, mut c) = mem.pair(geo);
        for img in images {
            p.corrupt_next(2, &img, true);
            let taken = c.take(|_, body| {
                if let Body::Inline(bytes) = body {
                    std::hint::black_box(bytes.iter().map(|&b| u64::from(b)).sum::<u64>());
                }
                Ok(())
            });
            match taken {
                Ok(arrived) => prop_assert!(arrived, "a published record was not seen"),
                Err(what) => {
                    prop_assert!(what.starts_with("record "), "{}", what);
                    break; // the transport reports the peer and reads no further
                }
            }
        }
    }
}

/// One producer thread and one consumer thread over a small ring: lengths vary so bodies
/// overflow and headers alternate between compact and full, at every interleaving the scheduler
/// picks.
#[test]
fn two_threads_stress() {
    let geo = Geometry::new(16, 4);
    let mem = Arc::new(HeapRing::new(geo));
    let total: u64 = if cfg!(miri) { 200 } else { 200_000 };
    let len_of = move |n: u64| ((n * 2654435761) % (geo.inline_max() as u64 + 1)) as usize;
    let hdr_of = move |n: u64| if n % 3 == 0 { header(n) } else { eager(n, len_of(n)) };
    let (mut p, mut c) = mem.pair(geo);
    let keep = Arc::clone(&mem);
    let producer = std::thread::spawn(move || {
        let _keep = keep;
        let mut n = 0;
        while n < total {
            if p.try_push_inline(&hdr_of(n), &payload(n, len_of(n))).unwrap() {
                n += 1;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut n = 0;
    while n < total {
        if pop_check_header(&mut c, &hdr_of(n), n, len_of(n)) {
            n += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    producer.join().unwrap();
    assert!(!pop_check(&mut c, n, 0));
}

#[test]
fn the_read_line_is_timed_only_when_the_consumer_published_since() {
    let geo = Geometry::new(16, 4);
    let mem = HeapRing::new(geo);
    let (mut p, mut c) = mem.pair(geo);
    assert_eq!(p.time_read_line(0), None, "nothing published yet");
    assert!(p.try_push_inline(&eager(0, 8), &payload(0, 8)).unwrap());
    assert!(pop_check_header(&mut c, &eager(0, 8), 0, 8));
    assert!(!pop_check(&mut c, 1, 8), "empty: the consumer publishes its read position");
    assert!(p.time_read_line(0).is_some());
    assert_eq!(p.time_read_line(0), None, "the same position again");
    // A position the consumer published while our later messages waited: it counts only
    // within `unread`.
    for i in 1..4 {
        assert!(p.try_push_inline(&eager(i, 8), &payload(i, 8)).unwrap());
    }
    assert!(pop_check_header(&mut c, &eager(1, 8), 1, 8));
    c.idle(); // publishes what it read so far
    assert_eq!(p.time_read_line(1), None, "two of ours unread");
    assert!(pop_check_header(&mut c, &eager(2, 8), 2, 8));
    c.idle(); // publishes what it read so far
    assert!(p.time_read_line(1).is_some(), "one unread");
}

#[test]
fn the_consumer_takes_each_shared_sample_once() {
    let geo = Geometry::new(16, 4);
    let mem = HeapRing::new(geo);
    let (mut p, mut c) = mem.pair(geo);
    assert_eq!(c.shared_sample(), None, "nothing shared yet");
    p.share_sample(37);
    assert_eq!(c.shared_sample(), Some(37));
    assert_eq!(c.shared_sample(), None, "the same sample again");
    p.share_sample(37);
    assert_eq!(c.shared_sample(), Some(37), "a new sample of the same time");
    // The sample lives in the control block's second line, beside nothing the ring uses.
    assert!(p.try_push_inline(&eager(0, 8), &payload(0, 8)).unwrap());
    assert!(pop_check_header(&mut c, &eager(0, 8), 0, 8));
    p.share_sample(u32::MAX);
    assert_eq!(c.shared_sample(), Some(u32::MAX));
}
