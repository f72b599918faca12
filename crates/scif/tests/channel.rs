//! The `scif` channel against a faulty peer: forged ring positions, frames and keys are
//! refused with an error naming the peer, and nothing is read or written outside the ring or a
//! window. (The conformance suite runs every regular case over it.)

use polyrail_core::{Error, Header, Issued, OneSided, PeerInfo, Rank, Reach, RegionMut, RemoteKey, Sink, Transport};
use polyrail_scif::settings::ScifSettings;
use polyrail_scif::{Fabric, FabricConfig, ScifChannel};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Seen {
    messages: Vec<(Rank, Vec<u8>)>,
    lost: Vec<(Rank, String)>,
}

impl Sink for Seen {
    fn message(&mut self, from: Rank, _hdr: &Header, payload: &[u8]) {
        self.messages.push((from, payload.to_vec()));
    }
    fn completed(&mut self, _op: u64, _result: polyrail_core::Result<()>) {}
    fn peer_lost(&mut self, peer: Rank, why: Error) {
        self.lost.push((peer, why.to_string()));
    }
}

fn info(rank: Rank, domain: u16) -> PeerInfo {
    PeerInfo { rank, pid: std::process::id(), host: "h".into(), node: 0, cpus: vec![], own_cpus: true, domain }
}

/// Rank 0 on the host, rank 1 on device 1, connected, with one message each way delivered.
fn pair(dir: &std::path::Path) -> (ScifChannel, ScifChannel) {
    let ((a, _), (b, _)) = pair_with_fabrics(dir);
    (a, b)
}

/// [`pair`], and the provider of each side (for its DMA engine's statistics).
fn pair_with_fabrics(dir: &std::path::Path) -> ((ScifChannel, Fabric), (ScifChannel, Fabric)) {
    let open = |rank: Rank, node: u16| {
        let f = Fabric::new(FabricConfig::new(dir, "forge", node, 2)).unwrap();
        (ScifChannel::new(f.clone(), &ScifSettings::default(), rank, 2).unwrap(), f)
    };
    let ((mut a, fa), (mut b, fb)) = (open(0, 0), open(1, 1));
    let (aa, ba) = (a.address(), b.address());
    assert!(matches!(a.add_peer(&info(1, 1), &ba), Reach::Yes(_)));
    assert!(matches!(b.add_peer(&info(0, 0), &aa), Reach::Yes(_)));
    exchange(&mut a, &mut b, 1);
    exchange(&mut b, &mut a, 0);
    ((a, fa), (b, fb))
}

/// One message from `from` to `to` (rank `peer`), delivered.
fn exchange(from: &mut ScifChannel, to: &mut ScifChannel, peer: Rank) {
    let hdr = Header::eager(0, 1, 0, 3);
    {
        let start = Instant::now();
        while from.try_send(peer, &hdr, b"abc").unwrap() != Issued::Done {
            to.progress(8, &mut Seen::default()).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10), "no connection");
        }
        let mut seen = Seen::default();
        while seen.messages.is_empty() {
            to.progress(8, &mut seen).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10), "no arrival");
        }
    }
}

#[test]
fn a_tail_past_the_ring_loses_the_writer_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, mut b) = pair(dir.path());
    b.forge_frame(0, &[], 1 << 40).unwrap();
    let mut seen = Seen::default();
    a.progress(8, &mut seen).unwrap();
    assert!(seen.messages.is_empty());
    assert_eq!(seen.lost.len(), 1, "{:?}", seen.lost);
    assert!(
        seen.lost[0].0 == 1 && seen.lost[0].1.contains("rank 1") && seen.lost[0].1.contains("tail"),
        "{:?}",
        seen.lost
    );
    assert!(matches!(a.try_send(1, &Header::eager(0, 1, 1, 1), b"x"), Err(Error::PeerLost { rank: 1, .. })));
}

#[test]
fn forged_frames_are_refused_not_read() {
    for (what, len, kind) in [("too long", u32::MAX, 0u32), ("past the ring", 200_000, 0), ("unknown kind", 8, 7)] {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair(dir.path());
        let mut fh = [0u8; 8];
        fh[0..4].copy_from_slice(&len.to_le_bytes());
        fh[4..8].copy_from_slice(&kind.to_le_bytes());
        b.forge_frame(0, &fh, 64).unwrap();
        let mut seen = Seen::default();
        a.progress(8, &mut seen).unwrap();
        assert!(seen.messages.is_empty(), "{what}");
        assert!(
            seen.lost.len() == 1 && seen.lost[0].1.contains("protocol violation from rank 1"),
            "{what}: {:?}",
            seen.lost
        );
    }
}

#[test]
fn a_head_past_the_tail_is_refused_to_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, mut b) = pair(dir.path());
    b.forge_head(0, u64::MAX / 2).unwrap();
    let e = a.try_send(1, &Header::eager(0, 1, 1, 1), b"x").unwrap_err().to_string();
    assert!(e.contains("rank 1") && e.contains("head"), "{e}");
}

#[test]
fn forged_keys_are_refused_naming_the_peer() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, _b) = pair(dir.path());
    let mut buf = [0x11u8; 64];
    let into = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
    let mut key = [0u8; 20];
    key[0..4].copy_from_slice(&0x4649_4353u32.to_le_bytes());
    // A window the peer never registered, and one below the registrations (its ring).
    for (at, len) in [(1u64 << 33, 4096u64), (0, 4096)] {
        key[4..12].copy_from_slice(&at.to_le_bytes());
        key[12..20].copy_from_slice(&len.to_le_bytes());
        let k = RemoteKey::new(&key).unwrap();
        let e = OneSided::get(&mut a, 1, &k, 0, into, 1).unwrap_err().to_string();
        assert!(e.contains("rank 1"), "{e}");
    }
    assert!(buf.iter().all(|&x| x == 0x11));
}

#[test]
fn a_peer_gone_is_lost_or_finished_and_named_at_once() {
    for finalized in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair(dir.path());
        let hdr = Header::eager(0, 1, 1, 4);
        assert_eq!(b.try_send(0, &hdr, b"last").unwrap(), Issued::Done);
        if finalized {
            b.finalize();
        }
        drop(b);
        let start = Instant::now();
        let mut seen = Seen::default();
        while seen.lost.is_empty() {
            a.check_peers(&mut seen);
            assert!(start.elapsed() < Duration::from_secs(1), "finalized {finalized}: no loss seen in a second");
        }
        assert_eq!(seen.messages, [(1, b"last".to_vec())], "what it sent before it went arrives first");
        let (rank, why) = &seen.lost[0];
        let named = if finalized { why.contains("has finished") } else { why.contains("without finalizing") };
        assert!(*rank == 1 && why.contains("rank 1") && named, "finalized {finalized}: {why}");
    }
}

/// Gets `into.len` bytes of `key` from rank 1 until `until` says the outcome is the expected
/// one (a peer's window records reach `a` within the engine's watch), or ten seconds pass.
fn get_until(
    a: &mut ScifChannel,
    key: &RemoteKey,
    into: RegionMut,
    until: impl Fn(&polyrail_core::Result<Issued>) -> bool,
) -> polyrail_core::Result<Issued> {
    let start = Instant::now();
    loop {
        let r = OneSided::get(a, 1, key, 0, into, 1);
        if until(&r) || start.elapsed() > Duration::from_secs(10) {
            return r;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_transfer_window_off_a_page_boundary_ends_at_deregister() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, mut b) = pair(dir.path());
    let src: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    let region = polyrail_core::Region { ptr: src[100..].as_ptr(), len: 2000 };
    let h =
        OneSided::register(&mut b, region, polyrail_core::PeerAccess::Read, polyrail_core::Lifetime::Transfer).unwrap();
    let mut buf = [0u8; 2000];
    let into = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
    assert_eq!(get_until(&mut a, h.key(), into, |r| r.is_ok()).unwrap(), Issued::Done);
    assert_eq!(buf[..], src[100..2100]);
    OneSided::deregister(&mut b, &h, 0..0);
    let e = get_until(&mut a, h.key(), into, |r| r.is_err()).unwrap_err().to_string();
    assert!(e.contains("rank 1"), "{e}");
}

#[test]
fn a_transfer_inside_long_lived_memory_uses_its_window_and_ends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, mut b) = pair(dir.path());
    let mem = polyrail_core::AnonMemory::shared(1 << 16, "a test").unwrap();
    // SAFETY: the mapping is `mem.len()` bytes, written only here while nothing else runs.
    unsafe { std::ptr::write_bytes(mem.ptr(), 0x5a, mem.len()) };
    let lasting = polyrail_core::Lifetime::Lasting { file: mem.file() };
    let whole = polyrail_core::Region { ptr: mem.ptr(), len: mem.len() };
    let hl = OneSided::register(&mut b, whole, polyrail_core::PeerAccess::ReadWrite, lasting).unwrap();
    // SAFETY: 40 000 + 100 bytes lie inside the mapping.
    let part = polyrail_core::Region { ptr: unsafe { mem.ptr().add(40_000) }, len: 100 };
    let ht =
        OneSided::register(&mut b, part, polyrail_core::PeerAccess::Read, polyrail_core::Lifetime::Transfer).unwrap();
    let unpack = |h: &polyrail_core::MemHandle| u64::from_le_bytes(h.key().as_bytes()[4..12].try_into().unwrap());
    assert_eq!(unpack(&ht), unpack(&hl) + 40_000, "the transfer's key names the long-lived window");
    let mut buf = [0u8; 100];
    let into = RegionMut { ptr: buf.as_mut_ptr(), len: buf.len() };
    assert_eq!(get_until(&mut a, ht.key(), into, |r| r.is_ok()).unwrap(), Issued::Done);
    assert!(buf.iter().all(|&x| x == 0x5a));
    OneSided::deregister(&mut b, &ht, 0..0);
    buf.fill(0);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(OneSided::get(&mut a, 1, ht.key(), 0, into, 1).unwrap(), Issued::Done, "still registered");
    assert!(buf.iter().all(|&x| x == 0x5a));
    OneSided::deregister(&mut b, &hl, 0..0);
    assert!(get_until(&mut a, hl.key(), into, |r| r.is_err()).is_err());
}

#[test]
fn transfers_whose_sides_differ_mod_64_go_through_the_bounce_window() {
    let dir = tempfile::tempdir().unwrap();
    let ((mut a, fa), (mut b, fb)) = pair_with_fabrics(dir.path());
    let len = (5 << 20) / 2 + 3; // three pieces, the last one short
    let src: Vec<u8> = (0..len + 64).map(|i| (i * 7 % 251) as u8).collect();
    // b lends `src` from a byte 3 past a cache line boundary ...
    let skewed = 64 - src.as_ptr() as usize % 64 + 3;
    let region = polyrail_core::Region { ptr: src[skewed..].as_ptr(), len: len - 64 };
    let access = polyrail_core::PeerAccess::ReadWrite;
    let h = OneSided::register(&mut b, region, access, polyrail_core::Lifetime::Transfer).unwrap();
    // ... and a reads it into a buffer at a cache line boundary, then writes it back changed.
    let mut buf = vec![0u8; len];
    let at = 64 - buf.as_ptr() as usize % 64;
    let into = RegionMut { ptr: buf[at..].as_mut_ptr(), len: len - 64 };
    assert_eq!(get_until(&mut a, h.key(), into, |r| r.is_ok()).unwrap(), Issued::Done);
    assert!(buf[at..at + len - 64] == src[skewed..skewed + len - 64], "the bytes read");
    assert_eq!(fa.dma_stats().unaligned_bytes, 0, "{:?}", fa.dma_stats());
    for x in &mut buf[at..at + len - 64] {
        *x = x.wrapping_add(1);
    }
    let from = polyrail_core::Region { ptr: buf[at..].as_ptr(), len: len - 64 };
    assert_eq!(OneSided::put(&mut a, 1, from, h.key(), 0, 2).unwrap(), Issued::Done);
    let expect: Vec<u8> = buf[at..at + len - 64].to_vec();
    OneSided::deregister(&mut b, &h, 0..len - 64);
    assert!(src[skewed..skewed + len - 64] == expect[..], "the bytes written");
    let stats = fa.dma_stats();
    assert_eq!((stats.unaligned_bytes, stats.bytes), (0, 2 * (len as u64 - 64)), "{stats:?}");
    assert_eq!(fb.dma_stats().transfers, 0, "the reader's and writer's engine moved every byte");
}

#[test]
fn the_provider_copies_transfers_whose_sides_differ_mod_64_through_a_temporary_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let ((mut a, fa), (mut b, _fb)) = pair_with_fabrics(dir.path());
    // Below the bounce window's size, the provider's temporary buffer takes the transfer.
    let src: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
    let region = polyrail_core::Region { ptr: src[5..].as_ptr(), len: 4000 };
    let h =
        OneSided::register(&mut b, region, polyrail_core::PeerAccess::Read, polyrail_core::Lifetime::Transfer).unwrap();
    let mut buf = vec![0u8; 4100];
    // One byte further into its cache line than the source.
    let at = (src[5..].as_ptr() as usize % 64 + 1 + 64 - buf.as_ptr() as usize % 64) % 64;
    let into = RegionMut { ptr: buf[at..].as_mut_ptr(), len: 4000 };
    assert_eq!(get_until(&mut a, h.key(), into, |r| r.is_ok()).unwrap(), Issued::Done);
    assert!(buf[at..at + 4000] == src[5..4005]);
    assert_eq!(fa.dma_stats().unaligned_bytes, 4000, "{:?}", fa.dma_stats());
}

#[test]
fn a_reached_peer_maps_registered_memory_and_an_unknown_one_does_not() {
    use polyrail_core::observe::{Observation, Observe};
    let dir = tempfile::tempdir().unwrap();
    let (mut a, _b) = pair(dir.path());
    // Routes keep their registered-memory rule only for peers that say so.
    assert_eq!(a.observe(1, Observe::MapsRegistered), Some(Observation::MapsRegistered(true)));
    assert_eq!(a.observe(0, Observe::MapsRegistered), Some(Observation::MapsRegistered(false)));
    assert_eq!(a.observe(7, Observe::MapsRegistered), Some(Observation::MapsRegistered(false)));
    assert_eq!(a.observe(1, Observe::Unread), None);
}
