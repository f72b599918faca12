//! Endpoints in two processes: windows passed across, and a peer killed mid-transfer. The peer
//! is this test binary run again as `child` with `SCIF_CHILD` naming its part.

mod common;

use common::*;
use polyrail_scif::*;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WINDOW: u64 = 0x10_0000;
const READ_ONLY: u64 = 0x80_0000;

fn spawn(role: &str, dir: &std::path::Path, port: u16) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("SCIF_CHILD", role)
        .env("SCIF_DIR", dir)
        .env("SCIF_PORT", port.to_string())
        .spawn()
        .unwrap()
}

/// A listener on node 0 and the child `role` connected to it from node 1.
fn start(fabric: &Fabric, role: &str) -> (Child, Endpoint) {
    let mut l = fabric.open().unwrap();
    let port = l.bind(0).unwrap();
    l.listen(1).unwrap();
    let child = spawn(role, fabric.dir().parent().unwrap(), port);
    let (peer, ep) = l.accept(AcceptFlags::SYNC).unwrap();
    assert_eq!(peer.node, 1);
    assert_eq!(ep.peer().unwrap().1, child.id() as i32, "the peer is named by its pid");
    (child, ep)
}

fn recv_u64(ep: &Endpoint) -> u64 {
    let mut b = [0u8; 8];
    ep.recv(&mut b, MsgFlags::BLOCK).unwrap();
    u64::from_le_bytes(b)
}

/// The child's parts; not a test of its own (it returns at once without `SCIF_CHILD`).
#[test]
#[ignore = "run by the tests of this file in a child process"]
fn child() {
    let Ok(role) = std::env::var("SCIF_CHILD") else { return };
    let dir = std::env::var("SCIF_DIR").unwrap();
    let port: u16 = std::env::var("SCIF_PORT").unwrap().parse().unwrap();
    let fabric = Fabric::new(FabricConfig::new(dir, "t1", 1, 2)).unwrap();
    let mut ep = fabric.open().unwrap();
    ep.connect(PortId::new(0, port)).unwrap();
    let page = page_size();
    match role.as_str() {
        "window" => {
            let mem = patterned(5, 100);
            let rw = Prot::READ | Prot::WRITE;
            ep.register(&mem, 0, 4 * page, WINDOW, rw, MapFlags::FIXED).unwrap();
            ep.register(&mem, 4 * page, page, READ_ONLY, Prot::READ, MapFlags::FIXED).unwrap();
            ep.send(&WINDOW.to_le_bytes(), MsgFlags::BLOCK).unwrap();
            let mut done = [0u8];
            ep.recv(&mut done, MsgFlags::BLOCK).unwrap();
            let ok = bytes(&mem, 2 * page, 64) == vec![0xEE; 64] && bytes(&mem, 3 * page, 6) == b"mapped";
            ep.send(&[ok as u8], MsgFlags::BLOCK).unwrap();
            // Stay until the parent closes: its mappings of our windows stay valid regardless.
            let e = ep.recv(&mut done, MsgFlags::BLOCK).unwrap_err();
            assert!(matches!(e, ScifError::Econnreset(_)), "{e}");
        }
        "victim" => {
            let mem = Memory::new(16 << 20).unwrap();
            ep.register(&mem, 0, 16 << 20, WINDOW, Prot::READ | Prot::WRITE, MapFlags::FIXED).unwrap();
            ep.send(&WINDOW.to_le_bytes(), MsgFlags::BLOCK).unwrap();
            std::thread::sleep(Duration::from_secs(60));
        }
        other => panic!("no child part {other}"),
    }
}

#[test]
fn windows_pass_to_a_peer_process_and_its_rmas_stay_inside_them() {
    let dir = tempfile::tempdir().unwrap();
    let fabric = Fabric::new(FabricConfig::new(dir.path(), "t1", 0, 2)).unwrap();
    let (mut child, ep) = start(&fabric, "window");
    let page = page_size();
    let remote = recv_u64(&ep);
    assert_eq!(remote, WINDOW);
    let mine = Memory::new(4 * page).unwrap();
    let local = ep.register(&mine, 0, 4 * page, 0, Prot::READ | Prot::WRITE, MapFlags::NONE).unwrap();
    // Reads from the child's window see its pattern.
    ep.readfrom(local, 4 * page, remote, RmaFlags::SYNC).unwrap();
    let expect: Vec<u8> = (0..4 * page).map(|i| 100u8.wrapping_add(i as u8)).collect();
    assert!(bytes(&mine, 0, 4 * page) == expect);
    let mut v = vec![0u8; 100];
    ep.vreadfrom(&mut v, READ_ONLY + 7, RmaFlags::USECPU).unwrap();
    assert_eq!(v, expect[7..107].iter().map(|b| b.wrapping_add((4 * page) as u8)).collect::<Vec<_>>());
    // Writes land in the child's memory; so do stores through a mapping.
    mine.write(0, &[0xEE; 64]);
    ep.writeto(local, 64, remote + 2 * page as u64, RmaFlags::NONE).unwrap();
    let map = ep.mmap(remote + 3 * page as u64, page, Prot::READ | Prot::WRITE).unwrap();
    map.write(0, b"mapped").unwrap();
    // What the child may only read it passed read-only: writes and writable mappings are refused.
    assert!(matches!(ep.writeto(local, 8, READ_ONLY, RmaFlags::SYNC), Err(ScifError::Eacces(_))));
    assert!(matches!(ep.mmap(READ_ONLY, page, Prot::WRITE), Err(ScifError::Eacces(_))));
    // Past its windows: refused, nothing touched.
    assert!(matches!(ep.writeto(local, 2 * page, remote + 3 * page as u64, RmaFlags::SYNC), Err(ScifError::Enxio(_))));
    assert!(matches!(ep.readfrom(local, 8, READ_ONLY + page as u64, RmaFlags::SYNC), Err(ScifError::Enxio(_))));
    let m = ep.fence_mark(FenceFlags::INIT_SELF).unwrap();
    ep.fence_wait(m).unwrap();
    ep.send(&[1], MsgFlags::BLOCK).unwrap();
    let mut ok = [0u8];
    ep.recv(&mut ok, MsgFlags::BLOCK).unwrap();
    assert_eq!(ok, [1], "the child saw the write and the store");
    drop(ep);
    assert!(child.wait().unwrap().success());
    drop(map);
    drop(fabric);
    assert!(empty_or_gone(dir.path()));
}

/// Makes every transfer complete `delay` after its copy: transfers stay in flight.
struct Slow(Duration);

impl Pacer for Slow {
    fn complete_at(&self, _: &Transfer, _: Instant, copied: Instant) -> Instant {
        copied + self.0
    }
}

fn assert_names_the_victim(e: &ScifError, pid: u32) {
    assert!(matches!(e, ScifError::Econnreset(_)), "{e}");
    let s = e.to_string();
    assert!(s.contains(&format!("pid {pid}")) && s.contains("peer 1:") && s.contains("died"), "{s}");
}

/// Posts writes to the victim's window, kills it, and checks that waits end in `ECONNRESET`
/// naming it within a second, then that no file is left once the fabric goes.
fn kill_mid_transfer(pacer: Arc<dyn Pacer>, writes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let fabric = Fabric::new(FabricConfig::new(dir.path(), "t1", 0, 2).pacer(pacer)).unwrap();
    let (mut child, ep) = start(&fabric, "victim");
    let pid = child.id();
    let remote = recv_u64(&ep);
    let len = 16usize << 20;
    let mine = patterned(len / page_size(), 1);
    let local = ep.register(&mine, 0, len, 0, Prot::READ | Prot::WRITE, MapFlags::NONE).unwrap();
    let ep = Arc::new(ep);
    let waiter = {
        let ep = ep.clone();
        std::thread::spawn(move || {
            let e = ep.recv(&mut [0u8; 8], MsgFlags::BLOCK).unwrap_err();
            (e, Instant::now())
        })
    };
    for _ in 0..writes {
        ep.writeto(local, len, remote, RmaFlags::NONE).unwrap();
    }
    let mark = ep.fence_mark(FenceFlags::INIT_SELF).unwrap();
    child.kill().unwrap();
    let killed = Instant::now();
    let e = ep.fence_wait(mark).unwrap_err();
    assert!(killed.elapsed() < Duration::from_secs(1), "fence_wait took {:?}", killed.elapsed());
    assert_names_the_victim(&e, pid);
    let (e, at) = waiter.join().unwrap();
    assert!(at.duration_since(killed) < Duration::from_secs(1));
    assert_names_the_victim(&e, pid);
    assert_names_the_victim(&ep.writeto(local, 8, remote, RmaFlags::NONE).unwrap_err(), pid);
    assert_names_the_victim(&ep.send(b"x", MsgFlags::BLOCK).unwrap_err(), pid);
    let st = fabric.dma_stats();
    assert!(st.transfers < writes as u64 || writes == 1, "the engine stopped copying to the dead peer: {st:?}");
    child.wait().unwrap();
    let ep = Arc::into_inner(ep).unwrap();
    drop(ep);
    assert!(!empty_or_gone(dir.path()), "the victim's port file is still there");
    drop(fabric);
    assert!(empty_or_gone(dir.path()), "{:?}", std::fs::read_dir(dir.path()).map(|d| d.collect::<Vec<_>>()));
}

#[test]
fn a_peer_killed_with_transfers_in_flight_is_econnreset_within_a_second() {
    kill_mid_transfer(Arc::new(Slow(Duration::from_secs(5))), 1);
}

#[test]
fn a_peer_killed_while_the_engine_copies_is_econnreset_within_a_second() {
    kill_mid_transfer(Arc::new(Unpaced), 256);
}
