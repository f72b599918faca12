//! The cases of the suite. Each takes a fresh [`Pair`], checks what the channel's capabilities
//! claim (or that it refuses what they do not), and panics with the channel and case named in
//! `Pair::name` when the channel breaks the contract of [`Transport`].

use crate::pair::{other, Pair, Side};
use crate::reach::Capabilities;
use crate::{has, Case, Outcome};
use polyrail_core::observe::{Observation, Observe};
use polyrail_core::{
    AnonMemory, Caps, Cost, Header, Issued, OpId, PacketKind, PeerAccess, PeerInfo, Rank, Reach, Region, RegionMut,
    RemoteKey, Result, Sink, Transport,
};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Every case, in the order they run.
pub(crate) const ALL: &[Case] = &[
    Case {
        name: "attr_is_consistent",
        about: "sizes, costs and capability flags of `attr()` agree with each other and on both endpoints",
        run: attr_is_consistent,
    },
    Case { name: "describe_is_one_line", about: "`describe()` gives one non-empty line", run: describe_is_one_line },
    Case {
        name: "idle_progress_delivers_nothing",
        about: "`progress` on a pair that exchanged nothing delivers nothing and says 0",
        run: idle_progress_delivers_nothing,
    },
    Case {
        name: "am_every_size_in_order",
        about: "AM: every size up to `max_eager` arrives once, in order, intact, through backpressure; \
                larger payloads are refused and the channel stays usable",
        run: am_every_size_in_order,
    },
    Case {
        name: "am_headers_arrive_as_sent",
        about: "AM: every packet kind, flag and extreme field, and streams of like messages, arrive with \
                the header that was sent",
        run: am_headers_arrive_as_sent,
    },
    Case {
        name: "am_both_ways",
        about: "AM, two endpoints: both flood each other, reading one packet per call, without deadlock or loss",
        run: am_both_ways,
    },
    Case {
        name: "am_progress_respects_budget",
        about: "AM: `progress(1)` delivers at most one arrival and counts what it delivered",
        run: am_progress_respects_budget,
    },
    Case {
        name: "no_allocation_in_steady_state",
        about: "AM (and GET completions): once warm, `try_send` and `progress` do not allocate \
                (where the test binary installs `CountingAllocator`)",
        run: no_allocation_in_steady_state,
    },
    Case {
        name: "am_refused_without_caps",
        about: "no AM: `try_send` is refused, `max_eager` is 0",
        run: am_refused_without_caps,
    },
    Case {
        name: "unknown_peers_refused",
        about: "`try_send`, `get`, `put` to ranks never added are refused with an error, `observe` \
                answers nothing; the real peer still works",
        run: unknown_peers_refused,
    },
    Case {
        name: "bad_addresses_refused",
        about: "`add_peer` with an empty, short, truncated or garbage address says No (no panic), and \
                the rank stays refused",
        run: bad_addresses_refused,
    },
    Case {
        name: "observations_are_sensible",
        about: "`observe` answers None or the kind asked; Unread follows what waits; `mapped_from` \
                comes with a MapsRegistered answer",
        run: observations_are_sensible,
    },
    Case {
        name: "rma_get",
        about: "GET: reads of exposed memory (small and large, at every edge) land intact, completing \
                inline or once through `progress`",
        run: rma_get,
    },
    Case {
        name: "rma_put",
        about: "PUT: writes into exposed memory land once `unexpose` names them, only there; a Done or \
                Ordered source may be reused at once",
        run: rma_put,
    },
    Case {
        name: "rma_many_in_flight",
        about: "GET: 64 reads issued before any completes each complete exactly once, with their op ids",
        run: rma_many_in_flight,
    },
    Case {
        name: "rma_progress_respects_budget",
        about: "GET, completions through `progress`: `progress(1)` delivers at most one completion",
        run: rma_progress_respects_budget,
    },
    Case {
        name: "rma_bounds_and_keys",
        about: "GET/PUT: transfers past the exposed range, into empty exposures or with garbage keys \
                are refused or fail, and touch no byte",
        run: rma_bounds_and_keys,
    },
    Case {
        name: "rma_refused_without_caps",
        about: "no GET / no PUT: `get` / `put` are refused",
        run: rma_refused_without_caps,
    },
    Case {
        name: "rma_registered_memory",
        about: "GET/PUT: inside long-lived registered memory (with a memory file), through its own key and \
                through transfers' registrations, then deregistered",
        run: rma_registered_memory,
    },
    Case {
        name: "put_then_message",
        about: "AM and PUT: the data of a put is in place when a message sent after it arrives",
        run: put_then_message,
    },
    Case {
        name: "check_peers_quiet",
        about: "`check_peers` on live peers reports nothing and leaves the channel usable",
        run: check_peers_quiet,
    },
    Case {
        name: "finalize_keeps_last_messages",
        about: "messages sent before `finalize` arrive, and a finalized peer that still runs is not lost",
        run: finalize_keeps_last_messages,
    },
    Case {
        name: "wakeup",
        about: "WAKEUP: `arm` says no while a message waits, a message sent after `arm` ends `sleep`; \
                without WAKEUP `arm` always says no",
        run: wakeup,
    },
];

/// Bytes either side of every buffer the suite hands to a channel, checked untouched.
const GUARD: usize = 64;
/// The byte guards hold.
const GUARD_BYTE: u8 = 0xee;
/// A small exposure (in `ib`'s bounce buffers) and a large one (registered, several MiB pages).
const SMALL: usize = 8192 + 5;
const LARGE: usize = (1 << 20) + 3;
/// Every observation there is.
const OBSERVE: [Observe; 4] = [Observe::LineTransfer, Observe::CopiesSlow, Observe::Unread, Observe::MapsRegistered];

fn na(why: impl Into<String>) -> Outcome {
    Outcome::NotApplicable(why.into())
}

/// Header of message `n` with payload length `len`: for even `n` the engine's header of a whole
/// eager message (which channels may carry in compact form), for odd `n` one with no compact
/// form (a data packet whose offset is `n`).
fn header(n: u64, len: usize) -> Header {
    if n % 2 == 0 {
        return Header::eager(0, n as u32, (n / 2) as u32, len as u64);
    }
    Header { offset: n, len: len as u64, sreq: 0x5a, ..Header::new(PacketKind::Data) }
}

/// Byte `i` of pattern `n`.
fn pattern(n: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (n.wrapping_mul(131) as usize + i * 7 + (i >> 8)) as u8).collect()
}

/// Where two byte strings first differ, for failure messages.
fn first_difference(got: &[u8], want: &[u8]) -> String {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(i) => format!("byte {i} is {:#04x}, {:#04x} expected", got[i], want[i]),
        None => format!("{} bytes, {} expected", got.len(), want.len()),
    }
}

/// A buffer handed to a channel, with guard bytes around it.
struct Guarded {
    buf: Vec<u8>,
    len: usize,
}

impl Guarded {
    fn new(contents: &[u8]) -> Guarded {
        let mut buf = vec![GUARD_BYTE; contents.len() + 2 * GUARD];
        buf[GUARD..GUARD + contents.len()].copy_from_slice(contents);
        Guarded { buf, len: contents.len() }
    }

    fn filled(byte: u8, len: usize) -> Guarded {
        Guarded::new(&vec![byte; len])
    }

    fn region(&mut self) -> Region {
        Region { ptr: self.buf[GUARD..].as_mut_ptr().cast_const(), len: self.len }
    }

    fn region_mut(&mut self) -> RegionMut {
        RegionMut { ptr: self.buf[GUARD..].as_mut_ptr(), len: self.len }
    }

    /// The contents, read after channels may have written them through raw pointers.
    fn contents(&self) -> &[u8] {
        &black_box(&self.buf)[GUARD..GUARD + self.len]
    }

    fn guards_intact(&self) -> bool {
        let b = black_box(&self.buf);
        b[..GUARD].iter().chain(&b[GUARD + self.len..]).all(|&x| x == GUARD_BYTE)
    }

    /// Overwrites the contents (a source the channel said may be reused).
    fn scribble(&mut self) {
        self.buf[GUARD..GUARD + self.len].fill(0xa5);
    }
}

/// Sends `msgs` from `a` to `b` in order, answering backpressure with progress on both sides;
/// fails when a message is refused, or still would block after the pair's patience.
fn send_all(p: &mut Pair, msgs: &[(Header, Vec<u8>)]) {
    let to = p.peer_of(Side::A);
    let mut last = Instant::now();
    for (i, (h, payload)) in msgs.iter().enumerate() {
        loop {
            match p.a().try_send(to, h, payload) {
                Ok(Issued::Done) => {
                    last = Instant::now();
                    break;
                }
                Ok(Issued::WouldBlock) => {
                    assert!(
                        last.elapsed() < p.patience(),
                        "{}: message {i} ({} bytes) still would block after {:?} ({})",
                        p.name,
                        payload.len(),
                        p.patience(),
                        p.state()
                    );
                    if p.poll() == 0 {
                        std::thread::yield_now();
                    }
                }
                Ok(answer) => {
                    panic!("{}: try_send answered {answer:?}: active messages are Done or WouldBlock", p.name)
                }
                Err(e) => panic!("{}: message {i} ({} bytes, {h:?}) refused: {e}", p.name, payload.len()),
            }
        }
    }
}

/// Waits until `b` received `msgs` after the first `base` of its messages, then checks that
/// exactly those arrived, in order, from `a`, with their headers and payloads.
fn expect_arrivals(p: &mut Pair, base: usize, msgs: &[(Header, Vec<u8>)]) {
    let want = base + msgs.len();
    p.drive(&format!("{} messages at b", msgs.len()), |p| p.ev(Side::B).messages.len() >= want);
    for _ in 0..3 {
        p.poll();
    }
    let from = p.rank(Side::A);
    let got = &p.ev(Side::B).messages[base..];
    assert_eq!(got.len(), msgs.len(), "{}: more messages arrived than were sent", p.name);
    for (i, ((f, h, payload), (want_h, want_payload))) in got.iter().zip(msgs).enumerate() {
        assert_eq!(*f, from, "{}: message {i} from the wrong rank", p.name);
        assert_eq!(h, want_h, "{}: header of message {i} (in order?)", p.name);
        assert!(
            payload == want_payload,
            "{}: payload of message {i} ({} bytes): {}",
            p.name,
            want_payload.len(),
            first_difference(payload, want_payload)
        );
    }
}

/// One small message from `a` to `b`, checked: the channel still works.
fn still_works(p: &mut Pair) {
    if has(p.a(), Caps::AM) {
        let base = p.ev(Side::B).messages.len();
        let msg = [(Header::eager(3, 77, 5, 11), pattern(77, 11))];
        send_all(p, &msg);
        expect_arrivals(p, base, &msg);
    }
}

fn cost_is_sane(name: &str, what: &str, c: &Cost) {
    assert!(
        c.latency_ns.is_finite() && c.latency_ns >= 0.0 && c.overhead_ns.is_finite() && c.overhead_ns >= 0.0,
        "{name}: {what} has a latency or overhead that is negative or not finite: {c:?}"
    );
    assert!(c.bandwidth.is_finite() && c.bandwidth > 0.0, "{name}: {what} has no sensible bandwidth: {c:?}");
}

fn attr_is_consistent(p: &mut Pair) -> Outcome {
    let (at, bt) = (p.a().attr().clone(), p.b().attr().clone());
    let n = p.name.clone();
    assert_eq!(at.kind, bt.kind, "{n}: both endpoints are one channel");
    assert_eq!(at.caps, bt.caps, "{n}: both endpoints claim the same capabilities");
    let name = at.kind.name();
    let writable = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    assert!(writable, "{n}: `{name}` cannot be written in POLYRAIL_TRANSPORTS (lowercase letters, digits, dashes)");
    let caps = at.caps;
    assert!(at.max_inline <= at.max_eager, "{n}: max_inline {} above max_eager {}", at.max_inline, at.max_eager);
    if caps.contains(Caps::AM) {
        assert!(at.max_eager > 0, "{n}: active messages with max_eager 0");
        cost_is_sane(&n, "am_cost", &at.am_cost);
    } else {
        assert_eq!(at.max_eager, 0, "{n}: max_eager without active messages");
        assert!(!caps.contains(Caps::WAKEUP), "{n}: WAKEUP (wakes on arrivals) without active messages");
    }
    if caps.contains(Caps::GET) || caps.contains(Caps::PUT) {
        assert!(at.max_rma > 0, "{n}: GET/PUT with max_rma 0");
        cost_is_sane(&n, "rma_cost", &at.rma_cost);
    } else {
        assert_eq!(at.max_rma, 0, "{n}: max_rma without GET or PUT");
        for flag in [Caps::RMA_INLINE_COMPLETION, Caps::CPU_COPY] {
            assert!(!caps.contains(flag), "{n}: {flag:?} without GET or PUT");
        }
        assert_eq!(at.mapped_from, None, "{n}: mapped_from without GET or PUT");
    }
    if at.split_from.is_some() {
        assert!(caps.contains(Caps::CPU_COPY), "{n}: split_from without CPU_COPY (a NIC gains nothing from it)");
    }
    let one_sided = caps.contains(Caps::GET) || caps.contains(Caps::PUT);
    assert_eq!(p.a().memory().is_some(), one_sided, "{n}: one-sided memory exactly with GET or PUT");
    assert_eq!(p.a().wakeup().is_some(), caps.contains(Caps::WAKEUP), "{n}: a wake-up exactly with WAKEUP");
    if caps.contains(Caps::SELF_ONLY) {
        assert!(p.is_loopback(), "{n}: SELF_ONLY, yet two endpoints were connected");
    }
    for r in &at.rndv_from {
        assert!(r.from > 0 && !r.reason.is_empty(), "{n}: rndv_from entry without size or reason: {r:?}");
    }
    Outcome::Passed
}

fn describe_is_one_line(p: &mut Pair) -> Outcome {
    for &side in p.sides() {
        let d = p.t(side).describe();
        assert!(!d.trim().is_empty(), "{}: describe() of side {side:?} is empty", p.name);
        assert!(!d.contains('\n'), "{}: describe() of side {side:?} is more than one line: {d:?}", p.name);
    }
    Outcome::Passed
}

fn idle_progress_delivers_nothing(p: &mut Pair) -> Outcome {
    for round in 0..3 {
        for &side in p.sides() {
            let n = p.progress(side, usize::MAX);
            assert_eq!(n, 0, "{}: progress round {round} on side {side:?} of an idle pair said {n}", p.name);
        }
    }
    for &side in p.sides() {
        let e = p.ev(side);
        assert!(e.delivered() == 0 && e.lost.is_empty(), "{}: an idle pair delivered {e:?}", p.name);
    }
    Outcome::Passed
}

/// Every size up to 1100 bytes, then every 89th up to 20000, then powers of two, and the
/// largest two; all at most `max`.
fn eager_sizes(max: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = (0..=max.min(1100)).collect();
    sizes.extend((1100..max.min(20000)).step_by(89));
    sizes.extend(std::iter::successors(Some(32usize << 10), |s| s.checked_mul(2)).take_while(|&s| s < max));
    sizes.extend([max.saturating_sub(1), max]);
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

fn am_every_size_in_order(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::AM) {
        return na("no AM");
    }
    let max = p.a().attr().max_eager;
    let msgs: Vec<(Header, Vec<u8>)> = eager_sizes(max)
        .into_iter()
        .enumerate()
        .map(|(i, len)| (header(i as u64, len), pattern(i as u64, len)))
        .collect();
    send_all(p, &msgs);
    expect_arrivals(p, 0, &msgs);
    let to = p.peer_of(Side::A);
    let too_big = vec![0u8; max + 1];
    match p.a().try_send(to, &header(0, max + 1), &too_big) {
        Err(_) => {}
        Ok(answer) => panic!("{}: a payload of max_eager + 1 = {} bytes answered {answer:?}", p.name, max + 1),
    }
    still_works(p);
    Outcome::Passed
}

/// A header of every kind with every flag, headers with extreme fields, eager headers whose
/// length is not the payload's, and streams of like messages (each header the successor of the
/// one before, sequence ids wrapping), with payloads at most `max` bytes.
fn header_zoo(max: usize) -> Vec<(Header, Vec<u8>)> {
    use PacketKind::*;
    let kinds = [Eager, Frag, Rts, Cts, Data, Fin, Rtr, Skew, Withdraw, Withdrawn];
    let all = Header::ANY_TAG | Header::STREAM | Header::TRUNCATED | Header::ANSWER;
    let flag_sets = [0, Header::ANY_TAG, Header::STREAM, Header::TRUNCATED, Header::ANSWER, all];
    let mut out = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        for (j, &flags) in flag_sets.iter().enumerate() {
            let n = (i * flag_sets.len() + j) as u64;
            let len = (n as usize * 5 % 40).min(max);
            let h = Header {
                kind,
                flags,
                ctx: (n * 977) as u16,
                tag: (n * 0x9e37_79b9) as u32,
                seq: (n * 0x85eb_ca6b) as u32,
                len: len as u64 + (j as u64) * 1000,
                sreq: n as u32,
                rreq: !(n as u32),
                offset: n << 40,
            };
            out.push((h, pattern(n, len)));
        }
    }
    let extreme = Header {
        kind: Data,
        flags: all,
        ctx: u16::MAX,
        tag: u32::MAX,
        seq: u32::MAX,
        len: u64::MAX,
        sreq: u32::MAX,
        rreq: u32::MAX,
        offset: u64::MAX,
    };
    out.push((extreme, pattern(900, 3.min(max))));
    // The first part of a larger eager message: not compact.
    out.push((Header::eager(0, 5, 1, 100_000), pattern(901, 200.min(max))));
    out.push((Header::eager(u16::MAX, u32::MAX, u32::MAX, 0), Vec::new()));
    // Streams of like messages: whole packets of common MTUs and a little less, small ones.
    let lens = [1024, 8, 2048, 1000, 900, 0, 4096, 3072, 4000, 1];
    let starts = [Header::eager(7, 42, u32::MAX - 20, 0), Header { sreq: 3, rreq: 4, ..Header::new(PacketKind::Data) }];
    for (s, start) in starts.into_iter().enumerate() {
        let mut h = start;
        for i in 0..48 {
            let len = lens[i % lens.len()].min(max);
            h = h.successor(len as u64);
            out.push((h, pattern(1000 + s as u64 * 100 + i as u64, len)));
        }
    }
    out
}

fn am_headers_arrive_as_sent(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::AM) {
        return na("no AM");
    }
    let msgs = header_zoo(p.a().attr().max_eager);
    send_all(p, &msgs);
    expect_arrivals(p, 0, &msgs);
    Outcome::Passed
}

fn am_both_ways(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::AM) {
        return na("no AM");
    }
    if p.is_loopback() {
        return na("one endpoint");
    }
    const TOTAL: usize = 2000;
    let msg = |side: u64, i: usize| {
        let len = (i * 7) % 41;
        (header(i as u64, len), pattern(side * 100_000 + i as u64, len))
    };
    let (ra, rb) = (p.rank(Side::A), p.rank(Side::B));
    let (mut sa, mut sb) = (0usize, 0usize);
    let mut seen = (0, 0, 0, 0);
    let mut last = Instant::now();
    loop {
        for (side, to, sent) in [(Side::A, rb, &mut sa), (Side::B, ra, &mut sb)] {
            while *sent < TOTAL {
                let (h, payload) = msg(side as u64, *sent);
                match p.t(side).try_send(to, &h, &payload) {
                    Ok(Issued::Done) => *sent += 1,
                    Ok(Issued::WouldBlock) => break,
                    Ok(answer) => panic!("{}: try_send answered {answer:?}", p.name),
                    Err(e) => panic!("{}: side {side:?}, message {}: {e}", p.name, *sent),
                }
            }
        }
        p.progress(Side::A, 1);
        p.progress(Side::B, 1);
        let now = (sa, sb, p.ev(Side::A).messages.len(), p.ev(Side::B).messages.len());
        if now.2 >= TOTAL && now.3 >= TOTAL {
            break;
        }
        if now != seen {
            (seen, last) = (now, Instant::now());
        }
        assert!(
            last.elapsed() < p.patience(),
            "{}: two floods stalled for {:?}: a sent {sa}, b sent {sb}, a got {}, b got {} of {TOTAL}",
            p.name,
            p.patience(),
            now.2,
            now.3
        );
    }
    for (side, from, sender) in [(Side::A, rb, Side::B), (Side::B, ra, Side::A)] {
        let got = &p.ev(side).messages;
        assert_eq!(got.len(), TOTAL, "{}: side {side:?} got more than was sent", p.name);
        for (i, (f, h, payload)) in got.iter().enumerate() {
            let (want_h, want_payload) = msg(sender as u64, i);
            assert!(
                (*f, h, payload) == (from, &want_h, &want_payload),
                "{}: side {side:?}, message {i}: from {f}, {h:?}, {} bytes; expected {want_h:?}, {} bytes",
                p.name,
                payload.len(),
                want_payload.len()
            );
        }
    }
    Outcome::Passed
}

fn am_progress_respects_budget(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::AM) {
        return na("no AM");
    }
    // Two small messages, then a stream of like ones of 1 KiB (which `ib` may send compact):
    // six in all, which rings of 8 blocks (one kept back) take without a credit returned.
    let len = p.a().attr().max_eager.min(1024);
    let mut msgs: Vec<(Header, Vec<u8>)> = (0..2u64).map(|i| (header(i, 16), pattern(i, 16))).collect();
    let mut h = Header::eager(0, 9, 100, len as u64);
    for i in 0..4 {
        msgs.push((h, pattern(10 + i, len)));
        h = h.successor(len as u64);
    }
    let to = p.peer_of(Side::A);
    let start = Instant::now();
    for (h, payload) in &msgs {
        // Only `a` is polled while sending: `b` delivers below, one call at a time.
        while p.a().try_send(to, h, payload).unwrap_or_else(|e| panic!("{}: {e}", p.name)) != Issued::Done {
            assert!(start.elapsed() < p.patience(), "{}: 6 small messages would block", p.name);
            if !p.is_loopback() {
                p.progress(Side::A, usize::MAX);
            }
        }
    }
    let start = Instant::now();
    while p.ev(Side::B).messages.len() < msgs.len() {
        let before = p.ev(Side::B).delivered();
        let n = p.progress(Side::B, 1);
        let got = p.ev(Side::B).delivered() - before;
        assert!(got <= 1, "{}: progress with a budget of 1 delivered {got} arrivals and completions", p.name);
        assert!(n >= got, "{}: progress delivered {got} but said {n}", p.name);
        if !p.is_loopback() {
            p.progress(Side::A, usize::MAX);
        }
        assert!(start.elapsed() < p.patience(), "{}: timed out delivering 6 messages ({})", p.name, p.state());
    }
    expect_arrivals(p, 0, &msgs);
    Outcome::Passed
}

/// A sink that counts what it is given, without allocating.
#[derive(Default)]
struct Tally {
    messages: usize,
    bytes: usize,
    completed: usize,
    failed: usize,
    lost: usize,
}

impl Sink for Tally {
    fn message(&mut self, _from: Rank, _hdr: &Header, payload: &[u8]) {
        self.messages += 1;
        self.bytes += payload.len();
    }

    fn completed(&mut self, _op: OpId, result: Result<()>) {
        self.completed += 1;
        self.failed += usize::from(result.is_err());
    }

    fn peer_lost(&mut self, _peer: Rank, _why: polyrail_core::Error) {
        self.lost += 1;
    }
}

/// One `progress` call on every endpoint into `tallies`; returns the allocations they made.
fn progress_counted(p: &mut Pair, tallies: &mut [Tally; 2], count: fn() -> u64) -> u64 {
    let mut made = 0;
    for &side in p.sides() {
        let i = p.index(side);
        let t = p.t(side);
        let before = count();
        let result = t.progress(usize::MAX, &mut tallies[i]);
        made += count() - before;
        if let Err(e) = result {
            panic!("{}: progress failed: {e}", p.name);
        }
    }
    made
}

fn no_allocation_in_steady_state(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::AM) {
        return na("no AM");
    }
    if !crate::counting() {
        return na("the test binary does not count allocations (see CountingAllocator)");
    }
    let count = crate::allocations;
    let max = p.a().attr().max_eager;
    let msgs: Vec<(Header, Vec<u8>)> = (0..64u64)
        .map(|i| {
            let len = [0, 8, 100, 1000, 4096, max][i as usize % 6].min(max);
            (header(i, len), pattern(i, len))
        })
        .collect();
    let to = p.peer_of(Side::A);
    let (ia, ib) = (p.index(Side::A), p.index(Side::B));
    let get = has(p.a(), Caps::GET);
    let mut src = Guarded::new(&pattern(5, 4096));
    let key = if get { p.b().register_transfer(src.region(), PeerAccess::Read).ok() } else { None };
    let mut dsts: Vec<Guarded> = (0..16).map(|_| Guarded::filled(0, 1024)).collect();
    let mut tallies = [Tally::default(), Tally::default()];
    // Allocations in each round; the last one must make none.
    let mut rounds = [0u64; 4];
    for (round, made) in rounds.iter_mut().enumerate() {
        let start = Instant::now();
        let stuck = |p: &Pair, what: &str| {
            assert!(start.elapsed() < p.patience(), "{}: round {round}: timed out {what}", p.name);
        };
        let target = tallies[ib].messages + msgs.len();
        for (h, payload) in &msgs {
            loop {
                let before = count();
                let sent = p.a().try_send(to, h, payload);
                *made += count() - before;
                match sent {
                    Ok(Issued::Done) => break,
                    Ok(Issued::WouldBlock) => {
                        *made += progress_counted(p, &mut tallies, count);
                        stuck(p, "sending");
                    }
                    other => panic!("{}: try_send answered {other:?}", p.name),
                }
            }
        }
        while tallies[ib].messages < target {
            *made += progress_counted(p, &mut tallies, count);
            stuck(p, "receiving");
        }
        let Some(key) = key else { continue };
        let mut pending = 0;
        for (i, dst) in dsts.iter_mut().enumerate() {
            let into = dst.region_mut();
            loop {
                match p.a().get(to, &key, i * 100, into, i as OpId) {
                    Ok(Issued::WouldBlock) => *made += progress_counted(p, &mut tallies, count),
                    Ok(Issued::Done) => break,
                    Ok(_) => {
                        pending += 1;
                        break;
                    }
                    Err(e) => panic!("{}: get refused: {e}", p.name),
                }
                stuck(p, "issuing gets");
            }
        }
        let target = tallies[ia].completed + pending;
        while tallies[ia].completed < target {
            *made += progress_counted(p, &mut tallies, count);
            stuck(p, "completing gets");
        }
    }
    if let Some(key) = key {
        p.b().deregister_transfer(&key, 0..0);
    }
    let t = &tallies;
    assert!(t.iter().all(|t| t.failed == 0 && t.lost == 0), "{}: failures while counting", p.name);
    assert!(t[ib].bytes > 0 && src.guards_intact(), "{}: nothing arrived", p.name);
    p.note(format!("allocations in try_send and progress per round: {rounds:?}"));
    assert_eq!(
        rounds[3], 0,
        "{}: try_send and progress allocated {} times in a round like the three before it (rounds: {rounds:?})",
        p.name, rounds[3]
    );
    Outcome::Passed
}

fn am_refused_without_caps(p: &mut Pair) -> Outcome {
    if has(p.a(), Caps::AM) {
        return na("has AM");
    }
    let max_eager = p.a().attr().max_eager;
    assert_eq!(max_eager, 0, "{}: max_eager without AM", p.name);
    let to = p.peer_of(Side::A);
    for payload in [&[][..], &[1u8; 8][..]] {
        match p.a().try_send(to, &header(0, payload.len()), payload) {
            Err(_) => {}
            Ok(answer) => panic!("{}: try_send without AM answered {answer:?}", p.name),
        }
    }
    assert_eq!(p.poll(), 0, "{}: progress after refused sends delivered something", p.name);
    Outcome::Passed
}

/// Whether `answer` is an answer to `what`.
fn answers(what: Observe, answer: Option<Observation>) -> bool {
    matches!(
        (what, answer),
        (_, None)
            | (Observe::LineTransfer, Some(Observation::LineTransfer(_)))
            | (Observe::CopiesSlow, Some(Observation::CopiesSlow(_)))
            | (Observe::Unread, Some(Observation::Unread(_)))
            | (Observe::MapsRegistered, Some(Observation::MapsRegistered(_)))
    )
}

/// A key no channel made (its bytes are zero).
fn made_up_key() -> RemoteKey {
    RemoteKey::new(&[0u8; 20]).expect("20 bytes fit a key")
}

/// Ranks the endpoint whose peer is `peer` never added: those of a small job, and far ones.
fn strangers(peer: Rank) -> impl Iterator<Item = Rank> {
    (0..8).chain([1000, u32::MAX - 1, u32::MAX]).filter(move |&r| r != peer)
}

fn unknown_peers_refused(p: &mut Pair) -> Outcome {
    let caps = p.a().attr().caps;
    for &side in p.sides() {
        let peer = p.peer_of(side);
        let there = other(side);
        // Keys of real exposures at the peer (or made up, where it exposes nothing).
        let mut src = Guarded::new(&pattern(60, 4096));
        let mut dst = Guarded::filled(0x5a, 4096);
        let read_key = if caps.contains(Caps::GET) {
            p.t(there).register_transfer(src.region(), PeerAccess::Read).ok()
        } else {
            None
        };
        let write_key = if caps.contains(Caps::PUT) {
            p.t(there).register_transfer(dst.region(), PeerAccess::Write).ok()
        } else {
            None
        };
        let mut local = Guarded::filled(0x11, 64);
        for r in strangers(peer) {
            let name = p.name.clone();
            let t = p.t(side);
            if let Ok(answer) = t.try_send(r, &header(0, 8), &[7; 8]) {
                panic!("{name}: side {side:?}: try_send to rank {r}, never added, answered {answer:?}");
            }
            let key = read_key.unwrap_or_else(made_up_key);
            if let Ok(answer) = t.get(r, &key, 0, local.region_mut(), 1) {
                panic!("{name}: side {side:?}: get from rank {r}, never added, answered {answer:?}");
            }
            let key = write_key.unwrap_or_else(made_up_key);
            if let Ok(answer) = t.put(r, local.region(), &key, 0, 2) {
                panic!("{name}: side {side:?}: put to rank {r}, never added, answered {answer:?}");
            }
            for what in OBSERVE {
                let answer = t.observe(r, what);
                let fine = answers(what, answer)
                    && !matches!(answer, Some(Observation::LineTransfer(_)))
                    && answer.and_then(Observation::flag) != Some(true);
                assert!(fine, "{name}: side {side:?}: observe({what:?}) of rank {r}, never added, said {answer:?}");
            }
        }
        for key in [read_key, write_key].into_iter().flatten() {
            p.t(there).deregister_transfer(&key, 0..0);
        }
        assert!(local.contents().iter().all(|&x| x == 0x11) && local.guards_intact(), "{}: bytes moved", p.name);
        assert!(src.contents() == pattern(60, 4096), "{}: a refused operation changed exposed memory", p.name);
        assert!(dst.contents().iter().all(|&x| x == 0x5a), "{}: a refused put wrote exposed memory", p.name);
    }
    still_works(p);
    Outcome::Passed
}

fn bad_addresses_refused(p: &mut Pair) -> Outcome {
    for &side in p.sides() {
        let peer = p.peer_of(side);
        let real = p.t(other(side)).address();
        let addresses: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            ("one byte", vec![0x50]),
            ("zeros", vec![0; real.len()]),
            ("0xff bytes", vec![0xff; real.len()]),
            ("half of a real one", real[..real.len() / 2].to_vec()),
            ("a real one less its last byte", real[..real.len().saturating_sub(1)].to_vec()),
        ];
        let template: PeerInfo = p.info(other(side)).clone();
        for r in strangers(peer).filter(|r| !(4..1000).contains(r)) {
            let info = PeerInfo { rank: r, ..template.clone() };
            for (what, address) in &addresses {
                let name = p.name.clone();
                if let Reach::Yes(why) = p.t(side).add_peer(&info, address) {
                    panic!("{name}: side {side:?}: rank {r} with an address of {what} was reached: {why}");
                }
            }
            if let Ok(answer) = p.t(side).try_send(r, &header(0, 1), &[1]) {
                panic!("{}: side {side:?}: try_send to rank {r}, refused by add_peer, answered {answer:?}", p.name);
            }
        }
    }
    still_works(p);
    Outcome::Passed
}

fn observations_are_sensible(p: &mut Pair) -> Outcome {
    let mut said = Vec::new();
    for &side in p.sides() {
        let peer = p.peer_of(side);
        for what in OBSERVE {
            let answer = p.t(side).observe(peer, what);
            assert!(answers(what, answer), "{}: observe({what:?}) answered {answer:?}", p.name);
            if side == Side::A {
                said.push(format!("{what:?}: {answer:?}"));
            }
        }
    }
    p.note(format!("side A observes {}", said.join(", ")));
    let (a_rank, b_rank) = (p.rank(Side::A), p.rank(Side::B));
    if p.a().attr().mapped_from.is_some() {
        let answer = p.a().observe(b_rank, Observe::MapsRegistered);
        assert!(answer.is_some(), "{}: mapped_from is set, but observe(MapsRegistered) answers nothing", p.name);
    }
    if !has(p.a(), Caps::AM) {
        return Outcome::Passed;
    }
    let Some(first) = p.b().observe(a_rank, Observe::Unread) else {
        p.note("Unread answers None: what waits unread was not checked");
        return Outcome::Passed;
    };
    assert_eq!(first, Observation::Unread(false), "{}: a message unread before anything was sent", p.name);
    let msg = (Header::eager(0, 1, 0, 5), pattern(3, 5));
    assert_eq!(p.a().try_send(b_rank, &msg.0, &msg.1).ok(), Some(Issued::Done), "{}: one message", p.name);
    let start = Instant::now();
    while p.b().observe(a_rank, Observe::Unread) != Some(Observation::Unread(true)) {
        assert!(start.elapsed() < p.patience(), "{}: a sent message never showed as unread", p.name);
        if !p.is_loopback() {
            p.progress(Side::A, usize::MAX);
        }
    }
    assert!(p.ev(Side::B).messages.is_empty(), "{}: observe delivered a message", p.name);
    expect_arrivals(p, 0, &[msg]);
    p.drive("observe(Unread) to say false once everything was read", |p| {
        p.b().observe(a_rank, Observe::Unread) == Some(Observation::Unread(false))
    });
    Outcome::Passed
}

/// Answers of one-sided operations, checked at the end of a case: each Pending or Ordered one
/// completed exactly once, a Done one never.
#[derive(Default)]
struct Issues(Vec<(OpId, Issued, String)>);

impl Issues {
    fn note(&mut self, op: OpId, issued: Issued, what: &str) {
        self.0.push((op, issued, what.to_string()));
    }

    fn check(&self, p: &mut Pair) {
        for _ in 0..3 {
            p.poll();
        }
        let count = |answer: Issued| self.0.iter().filter(|(_, i, _)| *i == answer).count();
        let answers = [Issued::Done, Issued::Pending, Issued::Ordered].map(|a| format!("{} {a:?}", count(a)));
        p.note(format!("operations answered {}", answers.join(", ")));
        for (op, issued, what) in &self.0 {
            let n = p.ev(Side::A).completions_of(*op);
            let want = usize::from(*issued != Issued::Done);
            assert_eq!(n, want, "{}: {what} (op {op:#x}) answered {issued:?} and completed {n} times", p.name);
        }
    }
}

/// Issues a one-sided operation on `a` with `op`, after progress on both sides while it
/// would block; the channel's answer, or its refusal.
fn issue(p: &mut Pair, what: &str, mut op: impl FnMut(&mut dyn Transport) -> Result<Issued>) -> Result<Issued> {
    let start = Instant::now();
    loop {
        match op(p.a())? {
            Issued::WouldBlock => {
                assert!(
                    start.elapsed() < p.patience(),
                    "{}: {what} still would block after {:?}",
                    p.name,
                    p.patience()
                );
                if p.poll() == 0 {
                    std::thread::yield_now();
                }
            }
            answer => return Ok(answer),
        }
    }
}

/// Waits for the end of an operation that `issue` started with answer `issued`: nothing for
/// Done, its (successful) completion through progress for Pending or Ordered (only a put may be
/// Ordered; a channel with inline completion answers Done).
fn finish(p: &mut Pair, what: &str, op: OpId, issued: Issued, put: bool) {
    let inline = has(p.a(), Caps::RMA_INLINE_COMPLETION);
    match issued {
        Issued::Done | Issued::WouldBlock => {}
        Issued::Ordered if !put => panic!("{}: {what} answered Ordered, which only a put may", p.name),
        Issued::Pending | Issued::Ordered => {
            assert!(!inline, "{}: {what} answered {issued:?}, but the channel claims RMA_INLINE_COMPLETION", p.name);
            p.drive(&format!("the completion of {what} (op {op:#x})"), |p| p.ev(Side::A).completions_of(op) > 0);
            let result = &p.ev(Side::A).completed.iter().find(|c| c.0 == op).expect("completed").1;
            if let Err(e) = result {
                panic!("{}: {what} failed: {e}", p.name);
            }
        }
    }
}

/// (offset, length) pairs inside an exposure of `size` bytes: edges, small and large parts.
fn pieces(size: usize, max: usize) -> Vec<(usize, usize)> {
    let mut v = vec![(0, 1), (1, 8), (size - 1, 1), (100, 100), (4096, 4096), (size / 3, size / 3), (0, size)];
    if size > 200_000 {
        v.extend([(0, 65536), (size - 65537, 65537), (12345, 200_000)]);
    }
    v.retain(|&(offset, len)| len <= max && offset + len <= size);
    v
}

fn rma_get(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::GET) {
        return na("no GET");
    }
    let (max, peer) = (p.a().attr().max_rma, p.peer_of(Side::A));
    let mut issues = Issues::default();
    let mut op: OpId = 0xc0de_0000_0000_0000;
    for (s, size) in [SMALL, LARGE].into_iter().enumerate() {
        let want = pattern(10 + s as u64, size);
        let mut src = Guarded::new(&want);
        let key = p
            .b()
            .register_transfer(src.region(), PeerAccess::Read)
            .unwrap_or_else(|e| panic!("{}: register: {e}", p.name));
        for (offset, len) in pieces(size, max) {
            let what = format!("get of {len} bytes at offset {offset} of {size} exposed");
            let mut dst = Guarded::filled(0x11, len);
            let into = dst.region_mut();
            op += 1;
            let issued = issue(p, &what, |t| t.get(peer, &key, offset, into, op))
                .unwrap_or_else(|e| panic!("{}: {what} refused: {e}", p.name));
            finish(p, &what, op, issued, false);
            issues.note(op, issued, &what);
            let got = dst.contents();
            assert!(
                got == &want[offset..offset + len],
                "{}: {what}: {}",
                p.name,
                first_difference(got, &want[offset..])
            );
            assert!(dst.guards_intact(), "{}: {what} wrote outside its destination", p.name);
        }
        p.b().deregister_transfer(&key, 0..0);
        assert!(src.contents() == want && src.guards_intact(), "{}: gets changed their source", p.name);
    }
    issues.check(p);
    Outcome::Passed
}

fn rma_put(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::PUT) {
        return na("no PUT");
    }
    let (max, peer) = (p.a().attr().max_rma, p.peer_of(Side::A));
    let mut issues = Issues::default();
    let mut op: OpId = 0xfeed_0000_0000_0000;
    for size in [SMALL, LARGE] {
        let mut dst = Guarded::filled(0x5a, size);
        let mut want = vec![0x5a; size];
        let key = p
            .b()
            .register_transfer(dst.region(), PeerAccess::Write)
            .unwrap_or_else(|e| panic!("{}: register: {e}", p.name));
        let lens = [1, 7, 100, 4096, 1000, 65536, 65537, 500_000];
        let mut at = 10;
        for len in lens.into_iter().filter(|&len| len <= max) {
            if at + len > size {
                break;
            }
            let what = format!("put of {len} bytes at offset {at} of {size} exposed");
            let data = pattern(op, len);
            let mut src = Guarded::new(&data);
            let from = src.region();
            op += 1;
            let issued = issue(p, &what, |t| t.put(peer, from, &key, at, op))
                .unwrap_or_else(|e| panic!("{}: {what} refused: {e}", p.name));
            if issued != Issued::Pending {
                // Done and Ordered leave the source free at once.
                src.scribble();
            }
            finish(p, &what, op, issued, true);
            issues.note(op, issued, &what);
            assert!(src.guards_intact(), "{}: {what} wrote around its source", p.name);
            src.scribble();
            want[at..at + len].copy_from_slice(&data);
            at += len;
        }
        p.b().deregister_transfer(&key, 10..at);
        let got = dst.contents();
        assert!(
            got == want,
            "{}: puts into {size} bytes, read after unexpose: {}",
            p.name,
            first_difference(got, &want)
        );
        assert!(dst.guards_intact(), "{}: puts wrote outside the exposed {size} bytes", p.name);
    }
    issues.check(p);
    Outcome::Passed
}

fn rma_many_in_flight(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::GET) {
        return na("no GET");
    }
    const OPS: usize = 64;
    const LEN: usize = 1024;
    let peer = p.peer_of(Side::A);
    let want = pattern(70, 64 * 1000 + LEN);
    let mut src = Guarded::new(&want);
    let key =
        p.b().register_transfer(src.region(), PeerAccess::Read).unwrap_or_else(|e| panic!("{}: register: {e}", p.name));
    let mut dsts: Vec<Guarded> = (0..OPS).map(|_| Guarded::filled(0x11, LEN)).collect();
    let id = |i: usize| u64::MAX / 2 + i as u64 * 0x1_0000_0001;
    let mut issues = Issues::default();
    for (i, dst) in dsts.iter_mut().enumerate() {
        let what = format!("get {i} of {OPS}");
        let into = dst.region_mut();
        let issued = issue(p, &what, |t| t.get(peer, &key, i * 1000, into, id(i)))
            .unwrap_or_else(|e| panic!("{}: {what} refused: {e}", p.name));
        assert!(
            issued == Issued::Done || !has(p.a(), Caps::RMA_INLINE_COMPLETION),
            "{}: {what} answered {issued:?} with inline completion",
            p.name
        );
        issues.note(id(i), issued, &what);
    }
    let pending: Vec<OpId> = issues.0.iter().filter(|(_, i, _)| *i != Issued::Done).map(|(op, _, _)| *op).collect();
    p.drive(&format!("{} completions", pending.len()), |p| {
        pending.iter().all(|&op| p.ev(Side::A).completions_of(op) > 0)
    });
    for (op, result) in &p.ev(Side::A).completed {
        assert!(result.is_ok(), "{}: op {op:#x} failed: {result:?}", p.name);
        assert!(pending.contains(op), "{}: a completion of op {op:#x}, which nothing started", p.name);
    }
    issues.check(p);
    for (i, dst) in dsts.iter().enumerate() {
        let w = &want[i * 1000..i * 1000 + LEN];
        assert!(
            dst.contents() == w && dst.guards_intact(),
            "{}: get {i}: {}",
            p.name,
            first_difference(dst.contents(), w)
        );
    }
    p.b().deregister_transfer(&key, 0..0);
    Outcome::Passed
}

fn rma_progress_respects_budget(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::GET) {
        return na("no GET");
    }
    if has(p.a(), Caps::RMA_INLINE_COMPLETION) {
        return na("completes inline");
    }
    const OPS: usize = 6;
    let peer = p.peer_of(Side::A);
    let want = pattern(75, 4096);
    let mut src = Guarded::new(&want);
    let key =
        p.b().register_transfer(src.region(), PeerAccess::Read).unwrap_or_else(|e| panic!("{}: register: {e}", p.name));
    let mut dsts: Vec<Guarded> = (0..OPS).map(|_| Guarded::filled(0x11, 512)).collect();
    let mut issues = Issues::default();
    for (i, dst) in dsts.iter_mut().enumerate() {
        let what = format!("get {i} of {OPS}");
        let into = dst.region_mut();
        // Issued without progress on `a` in between: every completion waits for the calls below.
        let issued = p.a().get(peer, &key, i * 512, into, 500 + i as OpId);
        match issued {
            Ok(Issued::Pending) => issues.note(500 + i as OpId, Issued::Pending, &what),
            other => panic!("{}: {what} answered {other:?}; {OPS} small gets should be Pending at once", p.name),
        }
    }
    let start = Instant::now();
    while p.ev(Side::A).completed.len() < OPS {
        let before = p.ev(Side::A).delivered();
        let n = p.progress(Side::A, 1);
        let got = p.ev(Side::A).delivered() - before;
        assert!(got <= 1, "{}: progress with a budget of 1 delivered {got} completions", p.name);
        assert!(n >= got, "{}: progress delivered {got} but said {n}", p.name);
        if !p.is_loopback() {
            p.progress(Side::B, usize::MAX);
        }
        assert!(start.elapsed() < p.patience(), "{}: timed out completing {OPS} gets ({})", p.name, p.state());
    }
    issues.check(p);
    for (i, dst) in dsts.iter().enumerate() {
        assert!(dst.contents() == &want[i * 512..i * 512 + 512], "{}: get {i}: wrong bytes", p.name);
    }
    p.b().deregister_transfer(&key, 0..0);
    Outcome::Passed
}

/// Issues an operation that must not move a byte: it is refused, or completes with an error.
fn must_fail(p: &mut Pair, what: &str, op: OpId, f: impl FnMut(&mut dyn Transport) -> Result<Issued>) {
    match issue(p, what, f) {
        Err(_) => {}
        Ok(Issued::Done) => panic!("{}: {what} was carried out (Done)", p.name),
        Ok(issued) => {
            p.drive(&format!("the completion of {what} (op {op:#x})"), |p| p.ev(Side::A).completions_of(op) > 0);
            let result = &p.ev(Side::A).completed.iter().find(|c| c.0 == op).expect("completed").1;
            assert!(result.is_err(), "{}: {what} answered {issued:?} and completed without error", p.name);
        }
    }
}

fn rma_bounds_and_keys(p: &mut Pair) -> Outcome {
    let (get, put) = (has(p.a(), Caps::GET), has(p.a(), Caps::PUT));
    if !get && !put {
        return na("no GET or PUT");
    }
    // A refused transfer may fail the queue pair, and the peer with it (ib).
    p.loss_expected = true;
    let peer = p.peer_of(Side::A);
    const SIZE: usize = 4096;
    let want = pattern(80, SIZE);
    let mut exposed = Guarded::new(&want);
    let access = if get { PeerAccess::Read } else { PeerAccess::Write };
    let key = p.b().register_transfer(exposed.region(), access).unwrap_or_else(|e| panic!("{}: register: {e}", p.name));
    let mut op: OpId = 0xbad0_0000;
    let outside = [(SIZE - 32, 64), (SIZE, 1), (SIZE + 4096, 8), (usize::MAX - 8, 16), (usize::MAX, 1)];
    for (offset, len) in outside {
        let mut local = Guarded::filled(0x11, len);
        op += 1;
        if get {
            let what = format!("get of {len} bytes at offset {offset} of {SIZE} exposed");
            let into = local.region_mut();
            must_fail(p, &what, op, |t| t.get(peer, &key, offset, into, op));
            assert!(local.contents().iter().all(|&x| x == 0x11), "{}: {what} wrote its destination", p.name);
        } else {
            let what = format!("put of {len} bytes at offset {offset} of {SIZE} exposed");
            let from = local.region();
            must_fail(p, &what, op, |t| t.put(peer, from, &key, offset, op));
        }
        assert!(local.guards_intact(), "{}: bytes moved around a local buffer", p.name);
    }
    if get {
        let keys: [&[u8]; 5] = [&[], &[0xab; 7], &[0; 20], &[0xff; 20], &[0xff; RemoteKey::MAX]];
        for bytes in keys {
            let key = RemoteKey::new(bytes).expect("fits");
            let mut local = Guarded::filled(0x11, 8);
            let into = local.region_mut();
            op += 1;
            let what = format!("get with the made-up key {key:?}");
            must_fail(p, &what, op, |t| t.get(peer, &key, 0, into, op));
            assert!(local.contents().iter().all(|&x| x == 0x11), "{}: {what} wrote its destination", p.name);
        }
    }
    // An empty buffer (a receive into nothing) may be exposed; nothing goes through its key.
    let mut empty: Vec<u8> = Vec::new();
    let nothing = Region { ptr: empty.as_mut_ptr().cast_const(), len: 0 };
    for access in [PeerAccess::Read, PeerAccess::Write] {
        let Ok(key) = p.b().register_transfer(nothing, access) else { continue };
        let mut local = Guarded::filled(0x11, 1);
        op += 1;
        let what = format!("a transfer of 1 byte against an empty exposure ({access:?})");
        if access == PeerAccess::Read && get {
            let into = local.region_mut();
            must_fail(p, &what, op, |t| t.get(peer, &key, 0, into, op));
        } else if access == PeerAccess::Write && put {
            let from = local.region();
            must_fail(p, &what, op, |t| t.put(peer, from, &key, 0, op));
        }
        p.b().deregister_transfer(&key, 0..0);
        assert!(local.contents() == [0x11] && local.guards_intact(), "{}: {what} moved bytes", p.name);
    }
    p.b().deregister_transfer(&key, 0..0);
    // Ending it twice, or ending what was never exposed, does nothing.
    p.b().deregister_transfer(&key, 0..0);
    p.b().deregister_transfer(&RemoteKey::new(&[1, 2, 3]).expect("fits"), 0..3);
    assert!(exposed.contents() == want && exposed.guards_intact(), "{}: refused transfers moved bytes", p.name);
    Outcome::Passed
}

fn rma_refused_without_caps(p: &mut Pair) -> Outcome {
    let (get, put) = (has(p.a(), Caps::GET), has(p.a(), Caps::PUT));
    if get && put {
        return na("has GET and PUT");
    }
    let peer = p.peer_of(Side::A);
    let mut local = Guarded::filled(0x11, 64);
    if !get {
        if let Ok(answer) = p.a().get(peer, &made_up_key(), 0, local.region_mut(), 1) {
            panic!("{}: get without GET answered {answer:?}", p.name);
        }
    }
    if !put {
        if let Ok(answer) = p.a().put(peer, local.region(), &made_up_key(), 0, 2) {
            panic!("{}: put without PUT answered {answer:?}", p.name);
        }
    }
    assert!(local.contents().iter().all(|&x| x == 0x11) && local.guards_intact(), "{}: bytes moved", p.name);
    Outcome::Passed
}

/// Memory that peers may map where the system has memory files, plain anonymous memory
/// otherwise.
fn registrable(len: usize) -> AnonMemory {
    AnonMemory::shared(len, "conformance test memory")
        .or_else(|_| AnonMemory::new(len, "conformance test memory"))
        .expect("anonymous memory")
}

/// The bytes of `m`, read after channels may have written them.
fn view(m: &AnonMemory) -> &[u8] {
    // SAFETY: the mapping is `m.len()` bytes, alive as long as `m`; the suite reads it only
    // between operations on it (no transfer in flight).
    black_box(unsafe { std::slice::from_raw_parts(m.ptr(), m.len()) })
}

/// Writes `data` into `m` at `at`.
fn write(m: &mut AnonMemory, at: usize, data: &[u8]) {
    assert!(at + data.len() <= m.len());
    // SAFETY: `at..at + data.len()` lies in the mapping (checked), which nothing else reads or
    // writes now (no transfer in flight), and `data` is not in it (it is borrowed shared).
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), m.ptr().add(at), data.len()) };
}

fn rma_registered_memory(p: &mut Pair) -> Outcome {
    let (get, put) = (has(p.a(), Caps::GET), has(p.a(), Caps::PUT));
    if !get && !put {
        return na("no GET or PUT");
    }
    const LEN: usize = 256 << 10;
    let peer = p.peer_of(Side::A);
    let (mut theirs, mut ours) = (registrable(LEN), registrable(LEN));
    let want = pattern(90, LEN);
    write(&mut theirs, 0, &want);
    write(&mut ours, 0, &vec![0x11; LEN]);
    let whole = |m: &AnonMemory| Region { ptr: m.ptr(), len: m.len() };
    let name = p.name.clone();
    let lasting = |p: &mut Pair, side: Side, m: &AnonMemory| {
        p.t(side).register_lasting(whole(m), m.file()).unwrap_or_else(|e| panic!("{name}: lasting registration: {e}"))
    };
    let theirs_handle = lasting(p, Side::B, &theirs);
    let ours_handle = if p.is_loopback() { None } else { lasting(p, Side::A, &ours) };
    if get {
        // The long-lived registration's own key reaches all of it (an RMA window's way).
        let what = "get of 4000 bytes at offset 200000 through the key of the whole registration";
        let key = *theirs_handle.as_ref().expect("a channel with GET has one-sided memory").key();
        let into = RegionMut { ptr: ours.ptr().wrapping_add(100), len: 4000 };
        let issued = issue(p, what, |t| t.get(peer, &key, 200_000, into, 30))
            .unwrap_or_else(|e| panic!("{name}: {what} refused: {e}"));
        finish(p, what, 30, issued, false);
        let got = &view(&ours)[100..4100];
        assert!(got == &want[200_000..204_000], "{name}: {what}: {}", first_difference(got, &want[200_000..]));
    }
    let mut issues = Issues::default();
    if get {
        let what = "get of 50000 bytes from registered memory";
        let exposed = Region { ptr: theirs.ptr().wrapping_add(4096), len: 100_000 };
        let key =
            p.b().register_transfer(exposed, PeerAccess::Read).unwrap_or_else(|e| panic!("{name}: register: {e}"));
        let into = RegionMut { ptr: ours.ptr().wrapping_add(8192), len: 50_000 };
        let issued = issue(p, what, |t| t.get(peer, &key, 1000, into, 31))
            .unwrap_or_else(|e| panic!("{name}: {what} refused: {e}"));
        finish(p, what, 31, issued, false);
        issues.note(31, issued, what);
        p.b().deregister_transfer(&key, 0..0);
        let got = &view(&ours)[8192..8192 + 50_000];
        assert!(got == &want[5096..5096 + 50_000], "{name}: {what}: {}", first_difference(got, &want[5096..]));
    }
    if put {
        let what = "put of 30000 bytes into registered memory";
        let data = pattern(91, 30_000);
        write(&mut ours, 0, &data);
        let exposed = Region { ptr: theirs.ptr().wrapping_add(131_072), len: 65_536 };
        let key =
            p.b().register_transfer(exposed, PeerAccess::Write).unwrap_or_else(|e| panic!("{name}: register: {e}"));
        let from = Region { ptr: ours.ptr(), len: 30_000 };
        let issued = issue(p, what, |t| t.put(peer, from, &key, 500, 32))
            .unwrap_or_else(|e| panic!("{name}: {what} refused: {e}"));
        finish(p, what, 32, issued, true);
        issues.note(32, issued, what);
        // A flush after a finished put completes (at once, or through progress).
        let flushed = issue(p, "flush", |t| t.flush(peer, 33)).unwrap_or_else(|e| panic!("{name}: flush refused: {e}"));
        assert!(flushed != Issued::Ordered, "{name}: a flush answered Ordered, which only a put may");
        finish(p, "flush", 33, flushed, false);
        p.b().deregister_transfer(&key, 500..30_500);
        let got = &view(&theirs)[131_572..131_572 + 30_000];
        assert!(got == &data[..], "{name}: {what}: {}", first_difference(got, &data));
        let mut expected = want.clone();
        expected[131_572..131_572 + 30_000].copy_from_slice(&data);
        let all = view(&theirs);
        assert!(all == &expected[..], "{name}: {what} wrote elsewhere: {}", first_difference(all, &expected));
    }
    issues.check(p);
    for (side, handle) in [(Side::B, theirs_handle), (Side::A, ours_handle)] {
        if let Some(h) = handle {
            p.t(side).deregister(&h);
        }
    }
    Outcome::Passed
}

fn put_then_message(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::AM) || !has(p.a(), Caps::PUT) {
        return na("needs AM and PUT");
    }
    let peer = p.peer_of(Side::A);
    let mut dst = Guarded::filled(0x5a, SMALL);
    let key = p
        .b()
        .register_transfer(dst.region(), PeerAccess::Write)
        .unwrap_or_else(|e| panic!("{}: register: {e}", p.name));
    let data = pattern(95, 1000);
    let mut src = Guarded::new(&data);
    let from = src.region();
    let what = "put of 1000 bytes followed by a message";
    let issued = issue(p, what, |t| t.put(peer, from, &key, 100, 41)).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    match issued {
        // The engine sends its notice (FIN) only after the completion.
        Issued::Pending => finish(p, what, 41, issued, true),
        _ => src.scribble(),
    }
    let notice = [(Header { sreq: 41, ..Header::new(PacketKind::Fin) }, Vec::new())];
    let base = p.ev(Side::B).messages.len();
    send_all(p, &notice);
    expect_arrivals(p, base, &notice);
    p.b().deregister_transfer(&key, 100..1100);
    let got = dst.contents();
    assert!(got[100..1100] == data[..], "{}: after the message: {}", p.name, first_difference(&got[100..1100], &data));
    assert!(got[..100].iter().chain(&got[1100..]).all(|&x| x == 0x5a), "{}: the put wrote elsewhere", p.name);
    if issued == Issued::Ordered {
        finish(p, what, 41, issued, true);
    }
    let mut issues = Issues::default();
    issues.note(41, issued, what);
    issues.check(p);
    Outcome::Passed
}

fn check_peers_quiet(p: &mut Pair) -> Outcome {
    for _ in 0..3 {
        for &side in p.sides() {
            let (t, events) = p.parts(side);
            t.check_peers(events);
        }
        p.poll();
    }
    still_works(p);
    Outcome::Passed
}

fn finalize_keeps_last_messages(p: &mut Pair) -> Outcome {
    let msgs: Vec<(Header, Vec<u8>)> = (0..3u64).map(|i| (header(i, 40), pattern(i, 40))).collect();
    let am = has(p.a(), Caps::AM);
    if am {
        send_all(p, &msgs);
    }
    p.a().finalize();
    // From here only `b` is polled: `a` is finishing.
    let start = Instant::now();
    while am && p.ev(Side::B).messages.len() < msgs.len() {
        assert!(start.elapsed() < p.patience(), "{}: messages sent before finalize never arrived", p.name);
        p.progress(Side::B, usize::MAX);
    }
    for _ in 0..3 {
        let (t, events) = p.parts(Side::B);
        t.check_peers(events);
        p.progress(Side::B, usize::MAX);
    }
    if am {
        let got: Vec<(Header, Vec<u8>)> = p.ev(Side::B).messages.iter().map(|(_, h, b)| (*h, b.clone())).collect();
        assert!(got == msgs, "{}: the messages sent before finalize arrived changed or out of order", p.name);
    }
    Outcome::Passed
}

fn wakeup(p: &mut Pair) -> Outcome {
    if !has(p.a(), Caps::WAKEUP) {
        for &side in p.sides() {
            assert!(!p.t(side).arm(), "{}: arm said yes on a channel without WAKEUP", p.name);
            p.t(side).disarm();
        }
        return Outcome::Passed;
    }
    let to = p.peer_of(Side::A);
    let msg = |n: u64| (Header::eager(0, 50, n as u32, 8), pattern(n, 8));
    // Something waits: no sleep.
    send_all(p, &[msg(0)]);
    let armed = p.b().arm();
    p.b().disarm();
    assert!(!armed, "{}: arm said nothing arrived while a message waited", p.name);
    expect_arrivals(p, 0, &[msg(0)]);
    // A message sent after arm ends the sleep.
    let mut slept = false;
    if p.b().arm() {
        slept = true;
        let (h, payload) = msg(1);
        let sent = p.a().try_send(to, &h, &payload);
        let start = Instant::now();
        p.b().sleep(Duration::from_secs(5));
        let slept = start.elapsed();
        p.b().disarm();
        assert_eq!(sent.ok(), Some(Issued::Done), "{}: one message", p.name);
        assert!(
            slept < Duration::from_secs(2),
            "{}: a message sent after arm did not end the sleep ({slept:?})",
            p.name
        );
        expect_arrivals(p, 1, &[msg(1)]);
    }
    // Nothing comes: the sleep ends at its timeout.
    if p.b().arm() {
        slept = true;
        let start = Instant::now();
        p.b().sleep(Duration::from_millis(20));
        let slept = start.elapsed();
        p.b().disarm();
        assert!(slept < Duration::from_secs(2), "{}: sleep(20 ms) took {slept:?}", p.name);
    }
    if !slept {
        p.note("arm never said yes here: sleep and its wake-up were not checked");
    }
    Outcome::Passed
}
