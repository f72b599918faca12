//! The libscif API's semantics and each error case, against the software provider, with both
//! endpoints in this process (the cross-process cases are in `processes.rs`).

mod common;

use common::*;
use polyrail_scif::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn errors_carry_libscif_errno() {
    use rustix::io::Errno;
    let cases = [
        (ScifError::Enxio("x".into()), Errno::NXIO),
        (ScifError::Eacces("x".into()), Errno::ACCESS),
        (ScifError::Econnreset("x".into()), Errno::CONNRESET),
        (ScifError::Enotconn("x".into()), Errno::NOTCONN),
        (ScifError::Enodev("x".into()), Errno::NODEV),
        (ScifError::Eaddrinuse("x".into()), Errno::ADDRINUSE),
        (ScifError::Einval("x".into()), Errno::INVAL),
        (ScifError::Eagain("x".into()), Errno::AGAIN),
    ];
    for (e, errno) in cases {
        assert_eq!(e.errno(), errno.raw_os_error(), "{e}");
        assert_eq!(std::io::Error::from(e.clone()).kind(), std::io::Error::from(errno).kind());
        assert!(e.to_string().starts_with('E'), "{e}");
    }
}

#[test]
fn bind_picks_ports_from_1088_and_refuses_taken_or_privileged_ones() {
    let dir = tmp();
    let (f, _) = fabrics(dir.path(), DmaMode::InOrder);
    let mut e1 = f.open().unwrap();
    let p1 = e1.bind(0).unwrap();
    assert!(p1 >= EPHEMERAL_PORT_FIRST, "{p1}");
    let mut e2 = f.open().unwrap();
    let p2 = e2.bind(0).unwrap();
    assert!(p2 >= EPHEMERAL_PORT_FIRST && p2 != p1);
    let e = f.open().unwrap().bind(p1).unwrap_err();
    assert!(matches!(e, ScifError::Eaddrinuse(_)) && e.to_string().contains(&p1.to_string()), "{e}");
    let e = e1.bind(0).unwrap_err();
    assert!(matches!(e, ScifError::Einval(_)), "{e}");
    assert_eq!(e1.local(), Some(PortId::new(0, p1)));
    drop(e1);
    assert_eq!(f.open().unwrap().bind(p1).unwrap(), p1, "a closed endpoint's port is free again");
    assert_eq!(f.open().unwrap().bind(2000).unwrap(), 2000);

    let mut cfg = FabricConfig::new(dir.path(), "t2", 0, 1);
    cfg.privileged = false;
    let plain = Fabric::new(cfg.clone()).unwrap();
    let e = plain.open().unwrap().bind(100).unwrap_err();
    assert!(matches!(e, ScifError::Eacces(_)) && e.to_string().contains("100"), "{e}");
    cfg.privileged = true;
    let root = Fabric::new(cfg).unwrap();
    assert_eq!(root.open().unwrap().bind(100).unwrap(), 100);
}

#[test]
fn listen_connect_and_accept_refuse_the_wrong_state_and_address() {
    let dir = tmp();
    let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
    let mut unbound = fa.open().unwrap();
    assert!(matches!(unbound.listen(1), Err(ScifError::Einval(_))));
    assert!(matches!(unbound.accept(AcceptFlags::SYNC), Err(ScifError::Einval(_))));
    assert!(matches!(unbound.send(b"x", MsgFlags::BLOCK), Err(ScifError::Enotconn(_))));
    assert!(matches!(unbound.recv(&mut [0], MsgFlags::NONE), Err(ScifError::Enotconn(_))));
    let e = unbound.connect(PortId::new(7, 1088)).unwrap_err();
    assert!(matches!(e, ScifError::Enodev(_)) && e.to_string().contains("node 7"), "{e}");
    let e = unbound.connect(PortId::new(0, 4242)).unwrap_err();
    assert!(matches!(e, ScifError::Econnrefused(_)) && e.to_string().contains("0:4242"), "{e}");

    let mut l = fa.open().unwrap();
    let port = l.bind(0).unwrap();
    let mut bound = fb.open().unwrap();
    bound.bind(0).unwrap();
    // Bound but not listening: nobody to connect to.
    let mut c = fb.open().unwrap();
    assert!(matches!(c.connect(PortId::new(0, port)), Err(ScifError::Econnrefused(_))));
    l.listen(2).unwrap();
    assert!(matches!(l.listen(2), Err(ScifError::Einval(_))));
    assert!(matches!(l.connect(PortId::new(1, 1)), Err(ScifError::Einval(_))));
    let e = l.accept(AcceptFlags::NONE).unwrap_err();
    assert!(matches!(e, ScifError::Eagain(_)), "{e}");

    let t = std::thread::spawn(move || {
        let me = bound.connect(PortId::new(0, port)).unwrap();
        (me, bound)
    });
    let (peer, acc) = l.accept(AcceptFlags::SYNC).unwrap();
    let (me, mut conn) = t.join().unwrap();
    assert_eq!(peer, me);
    assert_eq!(me.node, 1);
    assert_eq!(conn.peer().unwrap(), (PortId::new(0, port), std::process::id() as i32));
    assert_eq!(acc.peer().unwrap().0, me);
    assert_eq!(acc.local(), Some(PortId::new(0, port)), "an accepted endpoint shares the listener's port");
    assert!(matches!(conn.connect(PortId::new(0, port)), Err(ScifError::Eisconn(_))));
    assert!(matches!(conn.listen(1), Err(ScifError::Eisconn(_))));
}

#[test]
fn send_and_recv_block_or_take_what_is_there() {
    let dir = tmp();
    let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
    let (a, b) = pair(&fa, &fb);
    let mut buf = [0u8; 16];
    assert_eq!(b.recv(&mut buf, MsgFlags::NONE).unwrap(), 0, "nothing yet");
    assert_eq!(a.send(b"hello", MsgFlags::BLOCK).unwrap(), 5);
    assert_eq!(b.recv(&mut buf[..5], MsgFlags::BLOCK).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(a.send(b"abc", MsgFlags::NONE).unwrap(), 3);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(b.recv(&mut buf, MsgFlags::NONE).unwrap(), 3, "a non-blocking recv takes what arrived");
    // A blocking send larger than the socket buffer completes as the peer reads.
    let big: Vec<u8> = (0..(4 << 20)).map(|i| i as u8).collect();
    let t = std::thread::scope(|s| {
        let h = s.spawn(|| a.send(&big, MsgFlags::BLOCK).unwrap());
        let mut got = vec![0u8; big.len()];
        assert_eq!(b.recv(&mut got, MsgFlags::BLOCK).unwrap(), big.len());
        assert!(got == big);
        h.join().unwrap()
    });
    assert_eq!(t, big.len());
    // A non-blocking send into a full socket sends part, maybe nothing.
    let sent = a.send(&big, MsgFlags::NONE).unwrap();
    assert!(sent < big.len(), "{sent}");
    drop(a);
    let mut rest = vec![0u8; sent];
    assert_eq!(b.recv(&mut rest, MsgFlags::BLOCK).unwrap(), sent, "bytes sent before the close still arrive");
    let e = b.recv(&mut buf, MsgFlags::BLOCK).unwrap_err();
    let s = e.to_string();
    assert!(matches!(e, ScifError::Econnreset(_)) && s.contains("pid") && s.contains("closed its endpoint"), "{e}");
    assert!(matches!(b.send(b"x", MsgFlags::BLOCK), Err(ScifError::Econnreset(_))));
}

#[test]
fn poll_reports_connections_data_room_and_hangups() {
    let dir = tmp();
    let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
    let mut l = fa.open().unwrap();
    let port = l.bind(0).unwrap();
    l.listen(2).unwrap();
    let mut pe = [PollEp::new(&l, PollEvents::IN)];
    assert_eq!(poll(&mut pe, Some(Duration::ZERO)).unwrap(), 0);
    let fb2 = fb.clone();
    let t = std::thread::spawn(move || {
        let mut e = fb2.open().unwrap();
        e.connect(PortId::new(0, port)).unwrap();
        e
    });
    let mut pe = [PollEp::new(&l, PollEvents::IN)];
    assert_eq!(poll(&mut pe, Some(Duration::from_secs(5))).unwrap(), 1);
    assert!(pe[0].revents.contains(PollEvents::IN), "a connection to accept");
    let (_, a) = l.accept(AcceptFlags::NONE).unwrap();
    let b = t.join().unwrap();

    let mut pe = [PollEp::new(&a, PollEvents::IN | PollEvents::OUT), PollEp::new(&b, PollEvents::IN)];
    assert_eq!(poll(&mut pe, Some(Duration::ZERO)).unwrap(), 1);
    assert_eq!(pe[0].revents, PollEvents::OUT);
    assert_eq!(pe[1].revents, PollEvents::NONE);
    // Registering a window sends records on the control socket: they do not wake a poller.
    let m = Memory::new(page_size()).unwrap();
    a.register(&m, 0, page_size(), 0, Prot::READ, MapFlags::NONE).unwrap();
    let mut pe = [PollEp::new(&b, PollEvents::IN)];
    assert_eq!(poll(&mut pe, Some(Duration::from_millis(20))).unwrap(), 0);
    a.send(b"x", MsgFlags::BLOCK).unwrap();
    let mut pe = [PollEp::new(&b, PollEvents::IN)];
    assert_eq!(poll(&mut pe, Some(Duration::from_secs(5))).unwrap(), 1);
    assert_eq!(pe[0].revents, PollEvents::IN);
    drop(a);
    let mut pe = [PollEp::new(&b, PollEvents::IN)];
    poll(&mut pe, Some(Duration::from_secs(5))).unwrap();
    assert!(pe[0].revents.contains(PollEvents::HUP), "{:?}", pe[0].revents);
}

#[test]
fn register_places_windows_and_refuses_bad_ranges() {
    let dir = tmp();
    let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
    let page = page_size();
    let m = Memory::new(8 * page).unwrap();
    assert_eq!(m.len(), 8 * page);
    let mut lone = fa.open().unwrap();
    lone.bind(0).unwrap();
    assert!(matches!(lone.register(&m, 0, page, 0, Prot::READ, MapFlags::NONE), Err(ScifError::Enotconn(_))));

    let (a, _b) = pair(&fa, &fb);
    let rw = Prot::READ | Prot::WRITE;
    for (off, len) in [(0, page + 1), (1, page), (0, 0), (4 * page, 8 * page)] {
        let e = a.register(&m, off, len, 0, rw, MapFlags::NONE).unwrap_err();
        assert!(matches!(e, ScifError::Einval(_)), "{off}+{len}: {e}");
    }
    assert!(matches!(a.register(&m, 0, page, 0, Prot::NONE, MapFlags::NONE), Err(ScifError::Einval(_))));
    let w1 = a.register(&m, 0, 2 * page, 12345, rw, MapFlags::NONE).unwrap();
    let w2 = a.register(&m, 0, page, 0, rw, MapFlags::NONE).unwrap();
    assert!(w1 % page as u64 == 0 && w2 % page as u64 == 0);
    assert!(w2 >= w1 + 2 * page as u64 || w2 + page as u64 <= w1, "chosen windows never overlap");
    let fixed = 1 << 20;
    assert_eq!(a.register(&m, 2 * page, 2 * page, fixed, Prot::READ, MapFlags::FIXED).unwrap(), fixed);
    let e = a.register(&m, 0, 2 * page, fixed + page as u64, rw, MapFlags::FIXED).unwrap_err();
    assert!(matches!(e, ScifError::Eaddrinuse(_)) && e.to_string().contains("0x100000"), "{e}");
    let e = a.register(&m, 0, page, fixed - page as u64 + 8, rw, MapFlags::FIXED).unwrap_err();
    assert!(matches!(e, ScifError::Einval(_)), "{e}");
    // The same memory may back several windows.
    a.register(&m, 0, page, fixed + 2 * page as u64, rw, MapFlags::FIXED).unwrap();

    let e = a.unregister(fixed, page).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)) && e.to_string().contains("0x100000"), "part of a window: {e}");
    assert!(matches!(a.unregister(fixed + 1, page), Err(ScifError::Einval(_))));
    assert!(matches!(a.unregister(fixed, 0), Err(ScifError::Einval(_))));
    // Two adjacent windows go in one call.
    a.unregister(fixed, 3 * page).unwrap();
    assert!(matches!(a.unregister(fixed, 2 * page), Err(ScifError::Enxio(_))), "gone");
    assert_eq!(a.register(&m, 0, page, fixed, rw, MapFlags::FIXED).unwrap(), fixed, "its offsets are free again");
}

/// `a` with a local window `la` of 4 pages (READ|WRITE) and `b` with windows `rb` (4 pages,
/// READ|WRITE) and `ro` (one page, READ).
struct Setup {
    _fa: Fabric,
    _fb: Fabric,
    a: Endpoint,
    b: Endpoint,
    ma: Memory,
    mb: Memory,
    la: u64,
    rb: u64,
    ro: u64,
}

fn setup(dir: &std::path::Path, mode: DmaMode) -> Setup {
    let (fa, fb) = fabrics(dir, mode);
    let (a, b) = pair(&fa, &fb);
    let page = page_size();
    let ma = patterned(4, 0);
    let mb = patterned(5, 100);
    let rw = Prot::READ | Prot::WRITE;
    let la = a.register(&ma, 0, 4 * page, 0, rw, MapFlags::NONE).unwrap();
    let rb = b.register(&mb, 0, 4 * page, 0x10_0000, rw, MapFlags::FIXED).unwrap();
    let ro = b.register(&mb, 4 * page, page, 0x20_0000, Prot::READ, MapFlags::FIXED).unwrap();
    Setup { _fa: fa, _fb: fb, a, b, ma, mb, la, rb, ro }
}

#[test]
fn readfrom_and_writeto_copy_between_windows() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::InOrder);
    let page = page_size();
    s.a.readfrom(s.la, 2 * page, s.rb + page as u64, RmaFlags::SYNC).unwrap();
    assert_eq!(bytes(&s.ma, 0, 2 * page), bytes(&s.mb, page, 2 * page));
    s.ma.write(0, &[7u8; 100]);
    s.a.writeto(s.la, 100, s.rb + 10, RmaFlags::SYNC).unwrap();
    assert_eq!(bytes(&s.mb, 10, 100), vec![7u8; 100]);
    // Without SYNC: posted, then completed by the DMA engine; a fence waits for it.
    s.ma.write(page, &[9u8; 3000]);
    s.a.writeto(s.la + page as u64, 3000, s.rb + 5, RmaFlags::NONE).unwrap();
    let mark = s.a.fence_mark(FenceFlags::INIT_SELF).unwrap();
    s.a.fence_wait(mark).unwrap();
    assert_eq!(bytes(&s.mb, 5, 3000), vec![9u8; 3000]);
    // A remote range over two adjacent windows.
    let m2 = patterned(1, 50);
    let next = s.b.register(&m2, 0, page, s.rb + 4 * page as u64, Prot::READ | Prot::WRITE, MapFlags::FIXED).unwrap();
    s.a.readfrom(s.la, 2 * page, next - page as u64, RmaFlags::SYNC | RmaFlags::USECPU).unwrap();
    assert_eq!(bytes(&s.ma, 0, page), bytes(&s.mb, 3 * page, page));
    assert_eq!(bytes(&s.ma, page, page), bytes(&m2, 0, page));
    let st = s._fa.dma_stats();
    assert!(st.transfers >= 3 && st.bytes >= (2 * page + 3100) as u64, "{st:?}");
    assert!(st.cpu_transfers == 1 && st.cpu_bytes == 2 * page as u64, "{st:?}");
    assert!(st.cpu > Duration::ZERO, "the DMA thread's CPU time is reported: {st:?}");
}

#[test]
fn rmas_outside_windows_or_protection_are_refused() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::InOrder);
    let page = page_size() as u64;
    let e = s.a.readfrom(s.la, 0, s.rb, RmaFlags::SYNC).unwrap_err();
    assert!(matches!(e, ScifError::Einval(_)), "{e}");
    // Past the end of b's window, into the gap after it.
    let e = s.a.readfrom(s.la, 2 * page as usize, s.rb + 3 * page, RmaFlags::SYNC).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)) && e.to_string().contains("0x104000"), "{e}");
    let e = s.a.writeto(s.la, 8, 0x9999_0000, RmaFlags::NONE).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)) && e.to_string().contains("0x99990000"), "{e}");
    let e = s.a.writeto(s.la + 4 * page, 8, s.rb, RmaFlags::NONE).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)) && e.to_string().contains("local"), "{e}");
    let e = s.a.writeto(s.la, 8, u64::MAX - 4, RmaFlags::NONE).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)), "{e}");
    let e = s.a.writeto(s.la, 8, s.ro, RmaFlags::SYNC).unwrap_err();
    assert!(matches!(e, ScifError::Eacces(_)) && e.to_string().contains("READ"), "{e}");
    let e = s.a.vwriteto(&[1; 8], s.ro, RmaFlags::NONE).unwrap_err();
    assert!(matches!(e, ScifError::Eacces(_)), "{e}");
    s.a.readfrom(s.la, 8, s.ro, RmaFlags::SYNC).unwrap();
    // A local window a may only read cannot receive a readfrom.
    let lro = s.a.register(&s.ma, 0, page as usize, 0, Prot::READ, MapFlags::NONE).unwrap();
    let e = s.a.readfrom(lro, 8, s.rb, RmaFlags::SYNC).unwrap_err();
    assert!(matches!(e, ScifError::Eacces(_)), "{e}");
    // A window the peer unregistered is gone.
    s.b.unregister(s.ro, page as usize).unwrap();
    let e = s.a.readfrom(s.la, 8, s.ro, RmaFlags::SYNC).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)), "{e}");
    // Nothing outside a window was touched: b's memory still holds its pattern past the window.
    assert_eq!(bytes(&s.mb, 4 * page as usize, 16), (0..16).map(|i| 100u8.wrapping_add(i as u8)).collect::<Vec<_>>());
}

#[test]
fn vreadfrom_and_vwriteto_use_ordinary_memory() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::InOrder);
    let mut buf = vec![0u8; 5000];
    s.a.vreadfrom(&mut buf, s.rb + 100, RmaFlags::NONE).unwrap();
    assert_eq!(buf, bytes(&s.mb, 100, 5000));
    let data: Vec<u8> = (0..777).map(|i| (i * 3) as u8).collect();
    s.a.vwriteto(&data, s.rb + 1, RmaFlags::USECPU).unwrap();
    assert_eq!(bytes(&s.mb, 1, 777), data);
    s.a.vwriteto(&data, s.rb + 4000, RmaFlags::USECACHE).unwrap();
    assert_eq!(bytes(&s.mb, 4000, 777), data);
    let e = s.a.vreadfrom(&mut buf, s.rb + 4 * page_size() as u64 - 10, RmaFlags::NONE).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)), "{e}");
}

#[test]
fn ordinary_memory_registered_in_place_is_reached_without_a_copy() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::InOrder);
    let page = page_size();
    assert!(s._fb.lends_in_place(), "this machine lets processes of one user read each other");
    let mut mem = memmap2::MmapMut::map_anon(3 * page).unwrap();
    for (i, b) in mem.iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    let base = mem.as_ptr();
    // SAFETY (all calls below): `mem` outlives the windows, which are unregistered or closed
    // with `s` first, but for the one the test unmaps on purpose.
    let unaligned =
        unsafe { s.b.register_in_place(base.wrapping_add(8), page, 0, Prot::READ, MapFlags::NONE) }.unwrap_err();
    assert!(matches!(unaligned, ScifError::Einval(_)), "{unaligned}");
    let partial = unsafe { s.b.register_in_place(base, 100, 0, Prot::READ, MapFlags::NONE) }.unwrap_err();
    assert!(matches!(partial, ScifError::Einval(_)), "{partial}");
    let over = unsafe { s.b.register_in_place(base, page, s.rb, Prot::READ, MapFlags::FIXED) }.unwrap_err();
    assert!(matches!(over, ScifError::Eaddrinuse(_)), "{over}");
    let w = unsafe { s.b.register_in_place(base, 3 * page, 0x50_0000, Prot::READ, MapFlags::FIXED) }.unwrap();
    assert_eq!(w, 0x50_0000);

    // Read with no copy made first, by the DMA engine and by the caller's CPU.
    let mut got = vec![0u8; 2 * page - 2];
    s.a.vreadfrom(&mut got, w + page as u64 - 1, RmaFlags::NONE).unwrap();
    assert_eq!(got, mem[page - 1..3 * page - 3]);
    s.a.readfrom(s.la, page, w + 5, RmaFlags::SYNC | RmaFlags::USECPU).unwrap();
    assert_eq!(bytes(&s.ma, 0, page), mem[5..page + 5]);
    mem[0] = 99;
    s.a.readfrom(s.la, 8, w, RmaFlags::NONE).unwrap();
    s.a.fence_wait(s.a.fence_mark(FenceFlags::INIT_SELF).unwrap()).unwrap();
    assert_eq!(bytes(&s.ma, 0, 1), vec![99], "the window is the memory, not a copy of it");

    // Read-only: writes are refused; mappings of ordinary memory too.
    let e = s.a.writeto(s.la, 8, w, RmaFlags::SYNC).unwrap_err();
    assert!(matches!(e, ScifError::Eacces(_)), "{e}");
    let e = s.a.vwriteto(&[1; 8], w, RmaFlags::NONE).unwrap_err();
    assert!(matches!(e, ScifError::Eacces(_)), "{e}");
    let e = s.a.mmap(w, page, Prot::READ).unwrap_err();
    assert!(matches!(e, ScifError::Einval(_)) && e.to_string().contains("registered in place"), "{e}");

    // Writable: the peer's writes land in the memory itself; a signal needs a memory file.
    let mut out = memmap2::MmapMut::map_anon(2 * page).unwrap();
    let wo =
        unsafe { s.b.register_in_place(out.as_ptr(), 2 * page, 0x58_0000, Prot::READ | Prot::WRITE, MapFlags::FIXED) }
            .unwrap();
    let data: Vec<u8> = (0..page + 100).map(|i| (i * 13 % 253) as u8).collect();
    s.a.vwriteto(&data, wo + 50, RmaFlags::NONE).unwrap();
    s.ma.write(0, &data[..page]);
    s.a.writeto(s.la, 64, wo + page as u64 + 200, RmaFlags::SYNC | RmaFlags::USECPU).unwrap();
    assert_eq!(&out[50..50 + page + 100], &data[..]);
    assert_eq!(&out[page + 200..page + 264], &data[..64]);
    let e = s.a.fence_signal(0, 0, wo, 1, FenceFlags::INIT_SELF | FenceFlags::SIGNAL_REMOTE).unwrap_err();
    assert!(matches!(e, ScifError::Einval(_)) && e.to_string().contains("in place"), "{e}");
    s.b.unregister(wo, 2 * page).unwrap();
    out[0] = 1;

    // Unregistered, it is gone for the peer.
    s.b.unregister(w, 3 * page).unwrap();
    let e = s.a.vreadfrom(&mut got, w, RmaFlags::NONE).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)), "{e}");

    // Memory its owner unmapped while lent: the peer's read fails naming it, nothing else.
    let gone = memmap2::MmapMut::map_anon(page).unwrap();
    let g = unsafe { s.b.register_in_place(gone.as_ptr(), page, 0x60_0000, Prot::READ, MapFlags::FIXED) }.unwrap();
    drop(gone);
    let e = s.a.vreadfrom(&mut got[..page], g, RmaFlags::NONE).unwrap_err();
    assert_eq!(e.errno(), rustix::io::Errno::FAULT.raw_os_error(), "{e}");
    assert!(e.to_string().contains("process_vm_readv"), "{e}");
    // The connection still works.
    s.a.readfrom(s.la, 8, s.rb, RmaFlags::SYNC).unwrap();
}

#[test]
fn large_transfers_copy_every_byte_over_both_dma_channels() {
    let dir = tmp();
    let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
    let (a, b) = pair(&fa, &fb);
    let len = 3 << 20;
    let (ma, mb) = (Memory::new(len).unwrap(), Memory::new(len).unwrap());
    // A pattern that does not repeat every 256 bytes: a piece copied to the wrong place shows.
    mb.write(0, &(0..len).map(|i| ((i as u64).wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<_>>());
    let rw = Prot::READ | Prot::WRITE;
    let la = a.register(&ma, 0, len, 0, rw, MapFlags::NONE).unwrap();
    let rb = b.register(&mb, 0, len, 0, rw, MapFlags::NONE).unwrap();
    // Odd lengths and offsets: the halves meet inside a piece.
    for (n, at) in [(len, 0), ((1 << 20) + 12_345, 777), ((512 << 10) + 1, 3)] {
        a.readfrom(la, n, rb + at as u64, RmaFlags::SYNC).unwrap();
        assert!(bytes(&ma, 0, n) == bytes(&mb, at, n), "{n} bytes at {at}");
        let mut buf = vec![0u8; n];
        a.vreadfrom(&mut buf, rb + at as u64, RmaFlags::NONE).unwrap();
        assert!(buf == bytes(&mb, at, n), "{n} bytes at {at} into ordinary memory");
    }
    // Memory the owner unmapped in the second half of a window lent in place: the transfer
    // fails naming the read, whichever channel met it.
    let page = page_size();
    let mut lent = memmap2::MmapMut::map_anon(2 << 20).unwrap();
    lent.fill(5);
    // SAFETY: the first MiB stays mapped while lent; the second is unmapped on purpose, which
    // only the peer's reads meet.
    let w = unsafe { b.register_in_place(lent.as_ptr(), 2 << 20, 0x1000_0000, Prot::READ, MapFlags::FIXED) }.unwrap();
    let tail = unsafe { lent.as_mut_ptr().add(1 << 20) };
    // SAFETY: unmaps the second MiB of `lent`, which nothing here touches again (`lent` is
    // forgotten below rather than dropped).
    assert_eq!(unsafe { libc::munmap(tail.cast(), 1 << 20) }, 0);
    let mut buf = vec![0u8; 2 << 20];
    let e = a.vreadfrom(&mut buf, w, RmaFlags::NONE).unwrap_err();
    assert_eq!(e.errno(), rustix::io::Errno::FAULT.raw_os_error(), "{e}");
    a.vreadfrom(&mut buf[..page], w, RmaFlags::NONE).unwrap();
    assert!(buf[..page].iter().all(|&x| x == 5));
    std::mem::forget(lent);
}

#[test]
fn forged_windows_in_place_from_a_peer_are_refused() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::InOrder);
    let page = page_size() as u64;
    let cases: Vec<(u64, u64, u64, u64, &str)> = vec![
        (0x70_0000, page, 0, 0x1000_0000, "protection"),
        (0x71_0000, page, 99, 0x1000_0000, "protection"),
        (0x72_0000, page, 1, 0x1000_0001, "multiples"),
        (0x73_0000, 100, 1, 0x1000_0000, "multiples"),
        (0x74_0000, page, 1, u64::MAX - page + 1, "address space"),
        (s.rb, page, 1, 0x1000_0000, "overlaps"),
    ];
    for (off, len, prot, addr, _) in &cases {
        s.b.forge_window_in_place(*off, *len, *prot, *addr).unwrap();
    }
    let refused = s.a.refusals();
    assert_eq!(refused.len(), cases.len(), "{refused:#?}");
    for ((.., why), got) in cases.iter().zip(&refused) {
        assert!(got.contains(why) && got.contains("pid"), "expected {why:?} in {got:?}");
    }
    for (off, ..) in &cases[..5] {
        let e = s.a.readfrom(s.la, 8, *off, RmaFlags::SYNC).unwrap_err();
        assert!(matches!(e, ScifError::Enxio(_)), "{off:#x}: {e}");
    }
    // A window of memory the peer does not have: the read fails, the connection lives.
    s.b.forge_window_in_place(0x80_0000, page, 1, 0x1000).unwrap();
    let e = s.a.readfrom(s.la, 8, 0x80_0000, RmaFlags::SYNC).unwrap_err();
    assert_eq!(e.errno(), rustix::io::Errno::FAULT.raw_os_error(), "{e}");
    s.a.readfrom(s.la, 8, s.rb, RmaFlags::SYNC).unwrap();
}

#[test]
fn fences_mark_wait_and_signal() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::InOrder);
    for f in [
        FenceFlags::NONE,
        FenceFlags::INIT_SELF | FenceFlags::INIT_PEER,
        FenceFlags::INIT_SELF | FenceFlags::SIGNAL_LOCAL,
    ] {
        assert!(matches!(s.a.fence_mark(f), Err(ScifError::Einval(_))), "{f:?}");
    }
    let other = s.b.fence_mark(FenceFlags::INIT_SELF).unwrap();
    assert!(matches!(s.a.fence_wait(other), Err(ScifError::Einval(_))), "a mark of another endpoint");

    // Signal: both values land once the writes before it completed.
    s.ma.write(0, &[5u8; 64]);
    s.a.writeto(s.la, 64, s.rb + 64, RmaFlags::NONE).unwrap();
    let flags = FenceFlags::INIT_SELF | FenceFlags::SIGNAL_LOCAL | FenceFlags::SIGNAL_REMOTE;
    s.a.fence_signal(s.la + 1024, 0xAA, s.rb + 2048, 0xBB, flags).unwrap();
    let t0 = Instant::now();
    while s.mb.load_u64(2048) != 0xBB || s.ma.load_u64(1024) != 0xAA {
        assert!(t0.elapsed() < Duration::from_secs(5), "the signal never came");
        std::thread::yield_now();
    }
    assert_eq!(bytes(&s.mb, 64, 64), vec![5u8; 64], "the write before the signal landed first");

    let bad = [
        (FenceFlags::INIT_SELF, "no SIGNAL flag"),
        (FenceFlags::SIGNAL_LOCAL, "no INIT flag"),
        (FenceFlags::INIT_SELF | FenceFlags::INIT_PEER | FenceFlags::SIGNAL_LOCAL, "two INIT flags"),
    ];
    for (f, why) in bad {
        assert!(matches!(s.a.fence_signal(s.la, 1, s.rb, 1, f), Err(ScifError::Einval(_))), "{why}");
    }
    let sl = FenceFlags::INIT_SELF | FenceFlags::SIGNAL_LOCAL;
    let sr = FenceFlags::INIT_SELF | FenceFlags::SIGNAL_REMOTE;
    assert!(matches!(s.a.fence_signal(s.la + 4, 1, 0, 0, sl), Err(ScifError::Einval(_))), "misaligned");
    assert!(matches!(s.a.fence_signal(1 << 30, 1, 0, 0, sl), Err(ScifError::Enxio(_))));
    assert!(matches!(s.a.fence_signal(0, 0, s.ro, 1, sr), Err(ScifError::Eacces(_))));
    assert!(matches!(s.a.fence_signal(0, 0, 1 << 40, 1, sr), Err(ScifError::Enxio(_))));

    // INIT_PEER: a waits for the RMAs b initiated.
    s.mb.write(0, &[3u8; 256]);
    s.b.writeto(s.rb, 256, s.la + 512, RmaFlags::NONE).unwrap();
    let m = s.a.fence_mark(FenceFlags::INIT_PEER).unwrap();
    s.a.fence_wait(m).unwrap();
    assert_eq!(bytes(&s.ma, 512, 256), vec![3u8; 256]);
    s.a.fence_signal(s.la + 8, 77, 0, 0, FenceFlags::INIT_PEER | FenceFlags::SIGNAL_LOCAL).unwrap();
    let t0 = Instant::now();
    while s.ma.load_u64(8) != 77 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the peer-fenced signal never came");
        std::thread::yield_now();
    }
}

#[test]
fn mmap_maps_a_peers_window_within_its_protection() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::InOrder);
    let page = page_size();
    let map = s.a.mmap(s.rb + page as u64, 2 * page, Prot::READ | Prot::WRITE).unwrap();
    assert_eq!(map.len(), 2 * page);
    let mut got = vec![0u8; 32];
    map.read(0, &mut got);
    assert_eq!(got, bytes(&s.mb, page, 32));
    map.write(8, b"through the map").unwrap();
    assert_eq!(bytes(&s.mb, page + 8, 15), b"through the map");
    s.mb.store_u64(page + 64, 42);
    assert_eq!(map.load_u64(64), 42);

    let ro = s.a.mmap(s.ro, page, Prot::READ).unwrap();
    assert!(matches!(ro.write(0, b"x"), Err(ScifError::Eacces(_))));
    let e = s.a.mmap(s.ro, page, Prot::READ | Prot::WRITE).unwrap_err();
    assert!(matches!(e, ScifError::Eacces(_)) && e.to_string().contains("0x200000"), "{e}");
    let e = s.a.mmap(s.rb + 3 * page as u64, 2 * page, Prot::READ).unwrap_err();
    assert!(matches!(e, ScifError::Enxio(_)), "past the window: {e}");
    assert!(matches!(s.a.mmap(s.rb + 1, page, Prot::READ), Err(ScifError::Einval(_))));
    assert!(matches!(s.a.mmap(s.rb, 100, Prot::READ), Err(ScifError::Einval(_))));
    // The mapping outlives the window.
    s.b.unregister(s.rb, 4 * page).unwrap();
    map.write(0, b"still mapped").unwrap();
    assert_eq!(bytes(&s.mb, page, 12), b"still mapped");
    assert!(matches!(s.a.mmap(s.rb, page, Prot::READ), Err(ScifError::Enxio(_))));
}

#[test]
fn reverse_mode_completes_out_of_order_unless_ordered() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::Reverse);
    let page = page_size() as u64;
    s.ma.write(0, &[1u8; 64]);
    s.ma.write(page as usize, &[2u8; 64]);
    // Two writes to one place without RMA_ORDERED: the later runs first, the earlier lands last.
    s.a.writeto(s.la, 64, s.rb, RmaFlags::NONE).unwrap();
    s.a.writeto(s.la + page, 64, s.rb, RmaFlags::NONE).unwrap();
    let m = s.a.fence_mark(FenceFlags::INIT_SELF).unwrap();
    s.a.fence_wait(m).unwrap();
    assert_eq!(bytes(&s.mb, 0, 64), vec![1u8; 64], "out of order on purpose");
    // With RMA_ORDERED the second runs after the first.
    s.a.writeto(s.la + page, 64, s.rb + 128, RmaFlags::NONE).unwrap();
    s.a.writeto(s.la, 64, s.rb + 128, RmaFlags::ORDERED).unwrap();
    let m = s.a.fence_mark(FenceFlags::INIT_SELF).unwrap();
    s.a.fence_wait(m).unwrap();
    assert_eq!(bytes(&s.mb, 128, 64), vec![1u8; 64], "ordered after the write before it");
    // A transfer's pieces too run last first: a 3 MiB transfer writes its first MiB last.
    let big = 3usize << 20;
    let mbig = patterned(big / page_size(), 9);
    let mdst = Memory::new(big).unwrap();
    let src = s.a.register(&mbig, 0, big, 0, Prot::READ, MapFlags::NONE).unwrap();
    let dst = s.b.register(&mdst, 0, big, 0x4000_0000, Prot::READ | Prot::WRITE, MapFlags::FIXED).unwrap();
    s.a.writeto(src, big, dst, RmaFlags::SYNC).unwrap();
    assert!(bytes(&mdst, 0, big) == bytes(&mbig, 0, big));
}

/// Records each transfer and makes it complete `delay` after its copy.
struct Slow {
    delay: Duration,
    seen: Mutex<Vec<Transfer>>,
}

impl Pacer for Slow {
    fn complete_at(&self, t: &Transfer, _: Instant, copied: Instant) -> Instant {
        self.seen.lock().unwrap().push(*t);
        copied + self.delay
    }
}

#[test]
fn a_pacer_defers_completion_and_posts_never_wait() {
    let dir = tmp();
    let pacer = Arc::new(Slow { delay: Duration::from_millis(300), seen: Mutex::new(Vec::new()) });
    let (fa, fb) = paced(dir.path(), pacer.clone());
    let (a, b) = pair(&fa, &fb);
    let page = page_size();
    let ma = patterned(1, 0);
    let mb = Memory::new(page).unwrap();
    let la = a.register(&ma, 0, page, 0, Prot::READ, MapFlags::NONE).unwrap();
    let rb = b.register(&mb, 0, page, 0, Prot::READ | Prot::WRITE, MapFlags::NONE).unwrap();
    let t0 = Instant::now();
    a.writeto(la, 1000, rb, RmaFlags::NONE).unwrap();
    a.writeto(la, 24, rb, RmaFlags::USECPU).unwrap();
    assert!(t0.elapsed() < Duration::from_millis(100), "a post never waits for the model: {:?}", t0.elapsed());
    let m = a.fence_mark(FenceFlags::INIT_SELF).unwrap();
    a.fence_wait(m).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(300), "completion waits for the model: {:?}", t0.elapsed());
    a.writeto(la, 8, rb, RmaFlags::SYNC).unwrap();
    let seen = pacer.seen.lock().unwrap().clone();
    let dma = Transfer { from: 0, to: 1, bytes: 1000, by_cpu: false };
    assert!(seen.contains(&dma), "{seen:?}");
    assert!(seen.contains(&Transfer { from: 0, to: 1, bytes: 24, by_cpu: true }), "{seen:?}");
    assert_eq!(seen.len(), 3);
}

#[test]
fn node_ids_description_and_job_directory() {
    let dir = tmp();
    {
        let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
        assert_eq!(fa.get_node_ids(), (vec![0, 1], 0));
        assert_eq!(fb.get_node_ids(), (vec![0, 1], 1));
        let d = fa.describe();
        assert!(d.contains("emulation") && d.contains(PROVIDER) && d.contains("CPU"), "{d}");
        let other_job = Fabric::new(FabricConfig::new(dir.path(), "t1/../x", 0, 1)).unwrap();
        assert_ne!(other_job.dir(), fa.dir(), "jobs never share a directory");
        assert!(other_job.dir().starts_with(dir.path()));
        let name = fa.dir().file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.contains(&rustix::process::getuid().as_raw().to_string()), "named per user: {name}");
        assert!(matches!(Fabric::new(FabricConfig::new(dir.path(), "t1", 2, 2)), Err(ScifError::Einval(_))));
        let (a, b) = pair(&fa, &fb);
        let m = Memory::new(page_size()).unwrap();
        a.register(&m, 0, page_size(), 0, Prot::READ, MapFlags::NONE).unwrap();
        assert!(!empty_or_gone(fa.dir()));
        drop((a, b));
    }
    assert!(empty_or_gone(dir.path()), "{:?}", std::fs::read_dir(dir.path()).unwrap().collect::<Vec<_>>());
}

/// A forged window record: offset, length, protection, file offset, file, and the refusal's words.
type Forged<'a> = (u64, u64, u64, u64, Option<std::os::fd::BorrowedFd<'a>>, &'static str);

#[test]
fn forged_windows_from_a_peer_are_refused() {
    let dir = tmp();
    let s = setup(dir.path(), DmaMode::InOrder);
    let page = page_size() as u64;
    let small = Memory::new(page as usize).unwrap();
    let file = Endpoint::forge_file(&small);
    let plain = tempfile::tempfile().unwrap();
    plain.set_len(4 * page).unwrap();
    use std::os::fd::AsFd;
    let cases: Vec<Forged<'_>> = vec![
        (0x30_0000, 2 * page, 3, 0, Some(file), "passes the end"),
        (0x31_0000, page, 3, page, Some(file), "passes the end"),
        (0x32_0000, page, 3, 0, Some(plain.as_fd()), "not a memory file"),
        (0x33_0001, page, 3, 0, Some(file), "multiples"),
        (0x34_0000, 100, 3, 0, Some(file), "multiples"),
        (0x35_0000, page, 0, 0, Some(file), "protection"),
        (0x36_0000, page, 99, 0, Some(file), "protection"),
        (0x37_0000, page, 3, 0, None, "0 files"),
        (s.rb + page, page, 3, 0, Some(file), "overlaps"),
        (u64::MAX - page + 1, page, 3, 0, Some(file), "end of the window space"),
    ];
    for (off, len, prot, foff, fd, _) in &cases {
        s.b.forge_window(*off, *len, *prot, *foff, *fd).unwrap();
    }
    let refused = s.a.refusals();
    assert_eq!(refused.len(), cases.len(), "{refused:#?}");
    for ((.., why), got) in cases.iter().zip(&refused) {
        assert!(got.contains(why) && got.contains("pid"), "expected {why:?} in {got:?}");
    }
    for (off, ..) in &cases[..8] {
        let e = s.a.readfrom(s.la, 8, *off, RmaFlags::SYNC).unwrap_err();
        assert!(matches!(e, ScifError::Enxio(_)), "{off:#x}: {e}");
    }
    // A window b registered READ reaches a as a read-only file: forged as writable, it is refused.
    let ro = rustix::fs::open(
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)),
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    s.b.forge_window(0x40_0000, page, 3, 0, Some(ro.as_fd())).unwrap();
    let refused = s.a.refusals();
    assert!(refused.last().unwrap().contains("mapping it READ|WRITE"), "{refused:#?}");
    assert!(matches!(s.a.writeto(s.la, 8, 0x40_0000, RmaFlags::SYNC), Err(ScifError::Enxio(_))));
    // The connection still works.
    s.a.readfrom(s.la, 8, s.rb, RmaFlags::SYNC).unwrap();
}

#[test]
fn a_connector_that_does_not_introduce_itself_is_refused_and_the_listener_goes_on() {
    use std::io::Write;
    let dir = tmp();
    let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
    let mut l = fa.open().unwrap();
    let port = l.bind(0).unwrap();
    l.listen(4).unwrap();
    let path = fa.dir().join(format!("n0.p{port}.sock"));
    let mut raw = std::os::unix::net::UnixStream::connect(&path).unwrap();
    raw.write_all(&[0x5c; 40]).unwrap();
    let e = l.accept(AcceptFlags::SYNC).unwrap_err();
    assert!(matches!(e, ScifError::Econnreset(_)) && e.to_string().contains("did not introduce itself"), "{e}");
    drop(raw);
    let t0 = Instant::now();
    let _silent = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let e = l.accept(AcceptFlags::SYNC).unwrap_err();
    assert!(e.to_string().contains("sent no hello") && t0.elapsed() < Duration::from_secs(5), "{e}");
    // A real connector still gets through.
    let fb2 = fb.clone();
    let t = std::thread::spawn(move || fb2.open().unwrap().connect(PortId::new(0, port)).map(|_| ()));
    l.accept(AcceptFlags::SYNC).unwrap();
    t.join().unwrap().unwrap();
}

#[test]
fn a_listener_closed_before_accepting_refuses_its_waiting_connectors() {
    let dir = tmp();
    let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
    let mut l = fa.open().unwrap();
    let port = l.bind(0).unwrap();
    l.listen(4).unwrap();
    let t = std::thread::spawn(move || fb.open().unwrap().connect(PortId::new(0, port)).map(|_| ()));
    std::thread::sleep(Duration::from_millis(100));
    drop(l);
    let e = t.join().unwrap().unwrap_err();
    assert!(matches!(e, ScifError::Econnrefused(_)) && e.to_string().contains("closed before accepting"), "{e}");
}

#[test]
fn a_close_reaches_the_peer_at_once_though_transfers_are_still_in_flight() {
    let dir = tmp();
    let pacer = Arc::new(Slow { delay: Duration::from_secs(5), seen: Mutex::new(Vec::new()) });
    let (fa, fb) = paced(dir.path(), pacer);
    let (a, b) = pair(&fa, &fb);
    let page = page_size();
    let (ma, mb) = (patterned(1, 0), Memory::new(page).unwrap());
    let la = a.register(&ma, 0, page, 0, Prot::READ | Prot::WRITE, MapFlags::NONE).unwrap();
    let rb = b.register(&mb, 0, page, 0, Prot::READ | Prot::WRITE, MapFlags::NONE).unwrap();
    let lb = rb;
    a.writeto(la, page, rb, RmaFlags::NONE).unwrap();
    let t0 = Instant::now();
    drop(a);
    let e = b.readfrom(lb, 8, la, RmaFlags::NONE).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(matches!(e, ScifError::Econnreset(_)) && e.to_string().contains("closed its endpoint"), "{e}");
}

#[test]
fn many_windows_register_while_the_peer_makes_no_call() {
    let dir = tmp();
    let (fa, fb) = fabrics(dir.path(), DmaMode::InOrder);
    let (a, b) = pair(&fa, &fb);
    let page = page_size();
    let m = patterned(1, 0);
    // More window records than the control socket holds: the peer's engine drains them.
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let offs: Vec<u64> =
            (0..600).map(|_| b.register(&m, 0, page, 0, Prot::READ, MapFlags::NONE).unwrap()).collect();
        tx.send(()).unwrap();
        (b, offs)
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("register waited for the peer to make a call");
    let (_b, offs) = t.join().unwrap();
    let mut v = [0u8; 4];
    a.vreadfrom(&mut v, offs[599] + 4, RmaFlags::NONE).unwrap();
    assert_eq!(v, [4, 5, 6, 7]);
    assert!(a.refusals().is_empty());
}
