//! `Loopback`: messages to oneself and memcpy get/put with checked keys.

mod common;

use common::*;
use polyrail_core::{
    Issued, Lifetime, MemHandle, OneSided, PeerAccess, Reach, Region, RegionMut, RemoteKey, Transport, TransportKind,
};
use polyrail_shm::Loopback;

#[test]
fn messages_to_oneself_in_order() {
    let mut l = Loopback::new(3);
    assert_eq!(l.attr().kind, TransportKind::SELF);
    assert!(matches!(l.add_peer(&peer(3), &l.address()), Reach::Yes(_)));
    assert!(matches!(l.add_peer(&peer(4), &l.address()), Reach::No(_)));
    let mut sink = Collect::default();
    for round in 0..3u64 {
        for n in 0..100u64 {
            let len = (n as usize * 37) % 5000;
            assert_eq!(l.try_send(3, &header(round * 100 + n, len), &pattern(n, len)).unwrap(), Issued::Done);
        }
        assert_eq!(l.progress(40, &mut sink).unwrap(), 40);
        assert_eq!(l.progress(usize::MAX, &mut sink).unwrap(), 60);
    }
    for (i, (from, h, p)) in sink.msgs.iter().enumerate() {
        let (n, len) = decode_header(h);
        assert_eq!((*from, n), (3, i as u64));
        assert_eq!(p, &pattern(n % 100, len));
    }
    assert!(l.try_send(4, &header(0, 0), &[]).is_err());
}

#[test]
fn a_full_queue_would_block() {
    let mut l = Loopback::new(0);
    let mut n = 0;
    while l.try_send(0, &header(n, 1), &[1]).unwrap() == Issued::Done {
        n += 1;
    }
    assert_eq!(n, 256);
    let mut sink = Collect::default();
    assert_eq!(l.progress(1, &mut sink).unwrap(), 1);
    assert_eq!(l.try_send(0, &header(n, 1), &[1]).unwrap(), Issued::Done);
}

#[test]
fn get_put_with_checked_keys() {
    let mut l = Loopback::new(0);
    let mut buf = pattern(5, 1000);
    let key =
        *l.register(Region { ptr: buf.as_ptr(), len: 1000 }, PeerAccess::Write, Lifetime::Transfer).unwrap().key();
    let mut out = vec![0u8; 10];
    assert_eq!(l.get(0, &key, 990, RegionMut { ptr: out.as_mut_ptr(), len: 10 }, 1).unwrap(), Issued::Done);
    assert_eq!(out, pattern(5, 1000)[990..]);
    let src = [9u8; 4];
    l.put(0, Region { ptr: src.as_ptr(), len: 4 }, &key, 0, 2).unwrap();
    assert_eq!(std::hint::black_box(&mut buf)[..4], src);

    // Past the end; another pid; a range never registered; another rank; after deregister.
    assert!(l.get(0, &key, 991, RegionMut { ptr: out.as_mut_ptr(), len: 10 }, 3).is_err());
    let mut other = key.as_bytes().to_vec();
    other[..4].copy_from_slice(&(std::process::id() + 1).to_le_bytes());
    let e = l.get(0, &RemoteKey::new(&other).unwrap(), 0, RegionMut { ptr: out.as_mut_ptr(), len: 1 }, 4).unwrap_err();
    assert!(e.to_string().contains("names pid"), "{e}");
    let mut wider = key.as_bytes().to_vec();
    wider[12..20].copy_from_slice(&2000u64.to_le_bytes());
    let e = l.get(0, &RemoteKey::new(&wider).unwrap(), 0, RegionMut { ptr: out.as_mut_ptr(), len: 1 }, 5).unwrap_err();
    assert!(e.to_string().contains("not memory this process exposed"), "{e}");
    assert!(l.get(1, &key, 0, RegionMut { ptr: out.as_mut_ptr(), len: 1 }, 6).is_err());
    l.deregister(&MemHandle::new(key, &Lifetime::Transfer), 0..0);
    assert!(l.get(0, &key, 0, RegionMut { ptr: out.as_mut_ptr(), len: 1 }, 7).is_err());
}
