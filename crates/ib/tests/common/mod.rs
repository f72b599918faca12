//! What the provider test files share: a recording sink, a connected pair of endpoints, and
//! the credit scenarios that every provider must pass.
#![allow(dead_code)]

use polyrail_core::{
    Error, Header, Issued, OpId, PacketKind, PeerInfo, Rank, Reach, RemoteKey, Result, Sink, Transport,
};
use polyrail_ib::provider::{Opcode, WorkRequest};
use polyrail_ib::IbSettings;
use polyrail_ib::{DirectIb, Provider};
use std::time::{Duration, Instant};

/// How long any one wait may take (Soft-RoCE under emulation is slow).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// A sink that keeps everything it is given.
#[derive(Default)]
pub struct Recorder {
    pub messages: Vec<(Rank, Header, Vec<u8>)>,
    pub completed: Vec<(OpId, Result<()>)>,
    pub lost: Vec<(Rank, Error)>,
}

impl Sink for Recorder {
    fn message(&mut self, from: Rank, hdr: &Header, payload: &[u8]) {
        self.messages.push((from, *hdr, payload.to_vec()));
    }
    fn completed(&mut self, op: OpId, result: Result<()>) {
        self.completed.push((op, result));
    }
    fn peer_lost(&mut self, peer: Rank, why: Error) {
        self.lost.push((peer, why));
    }
}

/// A peer of this process, on virtual node `rank`.
pub fn info(rank: Rank) -> PeerInfo {
    PeerInfo { rank, pid: std::process::id(), host: "h".into(), node: rank, cpus: vec![], own_cpus: true, domain: 0 }
}

/// Ranks 0 and 1 of a 2-rank job, connected to each other.
pub fn pair<P: Provider>(open: impl Fn() -> P, settings: &IbSettings) -> (DirectIb<P>, DirectIb<P>) {
    let mut a = DirectIb::new(open(), settings, 0, 2).unwrap();
    let mut b = DirectIb::new(open(), settings, 1, 2).unwrap();
    let (aa, ba) = (a.address(), b.address());
    for (t, peer, addr) in [(&mut a, 1, &ba), (&mut b, 0, &aa)] {
        if let Reach::No(why) = t.add_peer(&info(peer), addr) {
            panic!("rank {peer} not reached: {why}");
        }
    }
    (a, b)
}

/// An engine header numbered `i` (a data packet at offset `i`).
pub fn hdr_of(i: u32) -> Header {
    Header { offset: i.into(), ..Header::new(PacketKind::Data) }
}

/// Runs `step` until it returns true; panics with `what` after [`PATIENCE`].
pub fn until(what: &str, mut step: impl FnMut() -> bool) {
    let start = Instant::now();
    while !step() {
        assert!(start.elapsed() < PATIENCE, "timed out: {what}");
    }
}

/// A fast sender and a receiver that reads 3 packets per round through a ring of 8 blocks:
/// nothing is lost or reordered, the sender is held back by credits (never more than 7 packets
/// unread) and never deadlocks. Returns how often the sender was held back.
pub fn credits_hold_a_fast_sender_back<P: Provider>(open: impl Fn() -> P, env: &IbSettings) -> u32 {
    let settings = IbSettings { credits: 8, block: 512, sync_limit: 2, ..env.clone() };
    let (mut a, mut b) = pair(open, &settings);
    let (mut ra, mut rb) = (Recorder::default(), Recorder::default());
    let total = 5000u32;
    let (mut sent, mut would_block) = (0u32, 0u32);
    until("5000 packets through a ring of 8", || {
        while sent < total {
            let payload = vec![sent as u8; (sent as usize * 7) % 400];
            match a.try_send(1, &hdr_of(sent), &payload).unwrap() {
                Issued::Done => sent += 1,
                Issued::WouldBlock => {
                    would_block += 1;
                    break;
                }
                Issued::Pending | Issued::Ordered => unreachable!("eager packets finish at once"),
            }
            assert!(sent as usize - rb.messages.len() <= 7, "ring overrun");
        }
        a.progress(64, &mut ra).unwrap();
        b.progress(3, &mut rb).unwrap();
        rb.messages.len() >= total as usize
    });
    assert!(would_block > 100, "the sender was never held back ({would_block})");
    assert_eq!(rb.messages.len(), total as usize);
    for (i, (from, h, p)) in rb.messages.iter().enumerate() {
        assert_eq!(*from, 0);
        assert_eq!(h, &hdr_of(i as u32), "order");
        assert_eq!(p, &vec![i as u8; (i * 7) % 400]);
    }
    assert!(ra.lost.is_empty() && rb.lost.is_empty(), "{:?} {:?}", ra.lost, rb.lost);
    would_block
}

/// Both sides flood each other through rings of 4 blocks reading one packet per round: credits
/// come back through the reserved block, nothing deadlocks or is lost.
pub fn two_floods_never_deadlock<P: Provider>(open: impl Fn() -> P, env: &IbSettings) {
    let settings = IbSettings { credits: 4, block: 256, sync_limit: 2, ..env.clone() };
    let (mut a, mut b) = pair(open, &settings);
    let (mut ra, mut rb) = (Recorder::default(), Recorder::default());
    let total = 3000usize;
    let (mut sa, mut sb) = (0usize, 0usize);
    until("two floods of 3000 packets", || {
        while sa < total && a.try_send(1, &hdr_of(sa as u32), b"ab").unwrap() == Issued::Done {
            sa += 1;
        }
        while sb < total && b.try_send(0, &hdr_of(sb as u32), b"ba").unwrap() == Issued::Done {
            sb += 1;
        }
        a.progress(1, &mut ra).unwrap();
        b.progress(1, &mut rb).unwrap();
        ra.messages.len() >= total && rb.messages.len() >= total
    });
    for (rec, payload) in [(&rb, b"ab"), (&ra, b"ba")] {
        for (i, (_, h, p)) in rec.messages.iter().enumerate() {
            assert_eq!((h, &p[..]), (&hdr_of(i as u32), &payload[..]));
        }
    }
    assert!(ra.lost.is_empty() && rb.lost.is_empty());
}

/// A stream of eager messages through a ring of 8 blocks to a receiver that reads 3 per round:
/// those of whole MTU packets (`mtu` bytes and twice that, or a little less, which 64 bytes of
/// framing would push into one more packet) whose header follows the one before go compact,
/// the others framed (small ones, and the first after a change of tag); every header and
/// payload arrives as sent, in order. A provider whose [`Provider::mtu`] is not `mtu` (one
/// without packets) sends every packet framed. Returns the compact packets sent.
pub fn like_messages_go_compact<P: Provider>(open: impl Fn() -> P, env: &IbSettings, mtu: usize) -> u64 {
    let packets = open().mtu() == mtu;
    let settings = IbSettings { credits: 8, block: 3 * mtu, sync_limit: 2, ..env.clone() };
    let (mut a, mut b) = pair(open, &settings);
    let (mut ra, mut rb) = (Recorder::default(), Recorder::default());
    let sizes = [mtu, 8, 2 * mtu, mtu - 24, mtu - 124, 0];
    let total = 600u32;
    let message = |i: u32| {
        let len = sizes[i as usize % sizes.len()];
        let tag = if i % 7 == 0 { 1000 + i } else { 5 };
        let h = Header::eager(0, tag, i, len as u64);
        (h, (0..len).map(|j| (i as usize * 13 + j) as u8).collect::<Vec<u8>>())
    };
    let mut expected = 0u64;
    let mut sent = 0u32;
    until("600 like messages through a ring of 8", || {
        while sent < total {
            let (h, payload) = message(sent);
            match a.try_send(1, &h, &payload).unwrap() {
                Issued::Done => {
                    let framed = (56 + payload.len()).next_multiple_of(8) + 8;
                    let follows = sent % 7 > 1;
                    expected += (packets
                        && follows
                        && !payload.is_empty()
                        && framed.div_ceil(mtu) > payload.len().div_ceil(mtu)) as u64;
                    sent += 1;
                }
                Issued::WouldBlock => break,
                other => unreachable!("eager packets finish at once: {other:?}"),
            }
        }
        a.progress(64, &mut ra).unwrap();
        b.progress(3, &mut rb).unwrap();
        rb.messages.len() >= total as usize
    });
    assert!(ra.lost.is_empty() && rb.lost.is_empty(), "{:?} {:?}", ra.lost, rb.lost);
    for (i, (from, h, p)) in rb.messages.iter().enumerate() {
        let (eh, ep) = message(i as u32);
        assert_eq!((*from, h, p), (0, &eh, &ep), "message {i}");
    }
    assert_eq!(a.compact_packets_sent(), expected);
    expected
}

/// `key` (an `ib` key: rkey u32, address u64, length u64) claiming `extra` more bytes than it
/// covers: a forged length that only the peer's device can refuse.
pub fn widened(key: &RemoteKey, extra: u64) -> RemoteKey {
    let mut b = key.as_bytes().to_vec();
    let len = u64::from_le_bytes(b[12..20].try_into().unwrap());
    b[12..20].copy_from_slice(&(len + extra).to_le_bytes());
    RemoteKey::new(&b).unwrap()
}

/// A work request for `len` bytes between `local_addr` (under `lkey`) and the peer's
/// `remote_addr` (under `rkey`), not inline.
pub fn request(
    wr_id: u64,
    opcode: Opcode,
    local_addr: u64,
    lkey: u32,
    remote_addr: u64,
    rkey: u32,
    len: usize,
) -> WorkRequest {
    WorkRequest { wr_id, opcode, local_addr, len, lkey, remote_addr, rkey, inline: false, imm: None }
}
