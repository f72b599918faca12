//! One suite for every node-local transport, skipping by capability (UCX's `check_caps`): a
//! channel gets every case its `attr().caps` claims.

mod common;

use common::*;
use polyrail_core::{Caps, Config, Issued, PeerAccess, Rank, Reach, Region, RegionMut, Transport};
use polyrail_shm::{CmaTransport, Loopback, ShmTransport};

/// Two endpoints: `a` sends to rank `to`, `b` receives from rank `from`. For a channel to
/// oneself both are the same transport.
trait Pair {
    fn name(&self) -> &'static str;
    fn a(&mut self) -> &mut dyn Transport;
    fn b(&mut self) -> &mut dyn Transport;
    fn to(&self) -> Rank;
    fn from(&self) -> Rank;
}

struct Two<T> {
    name: &'static str,
    a: T,
    b: T,
}

impl<T: Transport> Pair for Two<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn a(&mut self) -> &mut dyn Transport {
        &mut self.a
    }
    fn b(&mut self) -> &mut dyn Transport {
        &mut self.b
    }
    fn to(&self) -> Rank {
        1
    }
    fn from(&self) -> Rank {
        0
    }
}

struct One<T> {
    name: &'static str,
    t: T,
    rank: Rank,
}

impl<T: Transport> Pair for One<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn a(&mut self) -> &mut dyn Transport {
        &mut self.t
    }
    fn b(&mut self) -> &mut dyn Transport {
        &mut self.t
    }
    fn to(&self) -> Rank {
        self.rank
    }
    fn from(&self) -> Rank {
        self.rank
    }
}

fn shm_pair() -> Two<ShmTransport> {
    let job = job("conf");
    let cfg = Config { shm_slots: 64, shm_cells: 8, shm_cell_size: 20000, ..Config::default() };
    let mut a = ShmTransport::new(&cfg, &job, 0, 2).unwrap().with_host(HOST);
    let mut b = ShmTransport::new(&cfg, &job, 1, 2).unwrap().with_host(HOST);
    let (aa, ba) = (a.address(), b.address());
    assert!(matches!(a.add_peer(&peer(1), &ba), Reach::Yes(_)));
    assert!(matches!(b.add_peer(&peer(0), &aa), Reach::Yes(_)));
    a.connected().unwrap();
    b.connected().unwrap();
    Two { name: "shm", a, b }
}

fn cma_self() -> One<CmaTransport> {
    let mut t = CmaTransport::new().with_host(HOST);
    let addr = t.address();
    assert!(matches!(t.add_peer(&peer(0), &addr), Reach::Yes(_)));
    One { name: "cma", t, rank: 0 }
}

fn loopback() -> One<Loopback> {
    let mut t = Loopback::new(2);
    let addr = t.address();
    assert!(matches!(t.add_peer(&peer(2), &addr), Reach::Yes(_)));
    One { name: "self", t, rank: 2 }
}

/// Every size up to `max_eager` (sampled above 1100 bytes) arrives once, in order, intact,
/// with backpressure answered by progress on the receiving side.
fn am_in_order(p: &mut dyn Pair) {
    if !p.a().attr().caps.contains(Caps::AM) {
        return;
    }
    let max = p.a().attr().max_eager.min(20000);
    let mut sizes: Vec<usize> = (0..=max.min(1100)).collect();
    sizes.extend((1100..=max).step_by(89));
    sizes.push(max);
    let (to, from) = (p.to(), p.from());
    let mut sink = Collect::default();
    let mut sent = 0;
    while sent < sizes.len() {
        let len = sizes[sent];
        match p.a().try_send(to, &header(sent as u64, len), &pattern(sent as u64, len)).unwrap() {
            Issued::Done => sent += 1,
            Issued::WouldBlock => {
                assert!(
                    p.b().progress(usize::MAX, &mut sink).unwrap() > 0,
                    "{}: blocked with nothing to receive",
                    p.name()
                );
            }
            Issued::Pending | Issued::Ordered => panic!("{}: active messages complete at once", p.name()),
        }
    }
    while p.b().progress(usize::MAX, &mut sink).unwrap() > 0 {}
    assert_eq!(sink.msgs.len(), sizes.len(), "{}", p.name());
    for (i, (f, h, payload)) in sink.msgs.iter().enumerate() {
        let (n, len) = decode_header(h);
        assert_eq!((*f, n, len), (from, i as u64, sizes[i]), "{}", p.name());
        assert!(payload == &pattern(n, len), "{}: message {n} intact", p.name());
    }
    let too_big = vec![0u8; p.a().attr().max_eager + 1];
    assert!(p.a().try_send(to, &header(0, 0), &too_big).is_err(), "{}: over max_eager", p.name());
}

/// A transport without active messages refuses them.
fn no_am_refuses(p: &mut dyn Pair) {
    if p.a().attr().caps.contains(Caps::AM) {
        return;
    }
    let to = p.to();
    assert!(p.a().try_send(to, &header(0, 0), &[]).is_err(), "{}", p.name());
    assert_eq!(p.a().attr().max_eager, 0);
}

/// `get` and `put` against memory `b` exposed, inside and outside its range.
fn rma_get_put(p: &mut dyn Pair) {
    let caps = p.a().attr().caps;
    if !caps.contains(Caps::GET) || !caps.contains(Caps::PUT) {
        return;
    }
    let to = p.to();
    let mut target = pattern(4, 8192);
    let key = p.b().expose(Region { ptr: target.as_ptr(), len: target.len() }, PeerAccess::Write).unwrap();
    let mut got = vec![0u8; 4096];
    let r = p.a().get(to, &key, 4096, RegionMut { ptr: got.as_mut_ptr(), len: 4096 }, 1).unwrap();
    if r == Issued::Pending {
        assert!(!caps.contains(Caps::RMA_INLINE_COMPLETION));
        return; // completion through progress: not a node-local behaviour
    }
    assert_eq!(got, pattern(4, 8192)[4096..]);
    let src = pattern(5, 100);
    assert_eq!(p.a().put(to, Region { ptr: src.as_ptr(), len: 100 }, &key, 8092, 2).unwrap(), Issued::Done);
    assert_eq!(std::hint::black_box(&mut target)[8092..], src[..]);
    assert!(p.a().get(to, &key, 8092, RegionMut { ptr: got.as_mut_ptr(), len: 101 }, 3).is_err(), "{}", p.name());
    assert!(p.a().put(to, Region { ptr: src.as_ptr(), len: 100 }, &key, 8093, 4).is_err(), "{}", p.name());
    p.b().unexpose(&key, 0..0);
}

fn suite(p: &mut dyn Pair) {
    am_in_order(p);
    no_am_refuses(p);
    rma_get_put(p);
    assert!(!p.a().describe().is_empty(), "{}", p.name());
}

#[test]
fn shm_passes_the_suite() {
    suite(&mut shm_pair());
}

#[test]
fn cma_passes_the_suite() {
    suite(&mut cma_self());
}

#[test]
fn loopback_passes_the_suite() {
    suite(&mut loopback());
}
