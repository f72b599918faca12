//! `CmaTransport`: probes, and get/put between two processes, with bad keys rejected.

mod common;

use common::*;
use polyrail_core::{Caps, Error, Issued, PeerAccess, Reach, Region, RegionMut, RemoteKey, Transport};
use polyrail_shm::CmaTransport;

const LEN: usize = (1 << 20) + 3;

fn refusal(r: Reach) -> String {
    match r {
        Reach::No(why) => why,
        Reach::Yes(y) => panic!("expected a refusal, got Yes({y})"),
    }
}

/// Entry point of the child processes (does nothing in a normal test run).
#[test]
fn child_entry() {
    let Some(role) = child_role() else { return };
    match role.as_str() {
        "expose" => {
            let mut c = CmaTransport::new().with_host(HOST);
            let mut buf = pattern(1, LEN);
            let key = c.expose(Region { ptr: buf.as_ptr(), len: buf.len() }, PeerAccess::Write).unwrap();
            say(&hex(&c.address()));
            say(&hex(key.as_bytes()));
            assert_eq!(hear(), "check");
            // The parent wrote 1000 bytes of pattern 2 at offset 100.
            let mut want = pattern(1, LEN);
            want[100..1100].copy_from_slice(&pattern(2, 1000));
            let ok = std::hint::black_box(&mut buf) == &want;
            say(if ok { "ok" } else { "bad" });
        }
        "refuse" => {
            // Become a user that may not read the parent's memory (root parent) and probe it.
            // SAFETY: changing our own credentials; nothing else runs in this process.
            let dropped = unsafe { libc::getuid() == 0 && libc::setgid(65534) == 0 && libc::setuid(65534) == 0 };
            let mut c = CmaTransport::new().with_host(HOST);
            let addr = unhex(&hear());
            let mut p0 = peer(0);
            p0.pid = 0;
            let r = c.add_peer(&p0, &addr);
            say(&format!(
                "{dropped} {}",
                match r {
                    Reach::Yes(y) => format!("YES {y}"),
                    Reach::No(n) => n,
                }
            ));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn get_and_put_between_two_processes() {
    let mut c = CmaTransport::new().with_host(HOST);
    assert!(c.attr().caps.contains(Caps::GET | Caps::PUT | Caps::RMA_INLINE_COMPLETION));
    assert_eq!(c.attr().max_eager, 0);
    let mut child = ChildProc::spawn("child_entry", "expose", &[]);
    let addr = unhex(&child.recv());
    let key = RemoteKey::new(&unhex(&child.recv())).unwrap();
    let mut p1 = peer(1);
    p1.pid = child.pid();
    let why = match c.add_peer(&p1, &addr) {
        Reach::Yes(y) => y,
        Reach::No(n) => panic!("probe of our own child failed: {n}"),
    };
    assert!(why.contains("probe"), "{why}");
    assert!(c.describe().contains("passed"), "{}", c.describe());

    // Whole buffer.
    let mut got = vec![0u8; LEN];
    let into = RegionMut { ptr: got.as_mut_ptr(), len: LEN };
    assert_eq!(c.get(1, &key, 0, into, 1).unwrap(), Issued::Done);
    assert!(got == pattern(1, LEN));
    // A piece at an offset, up to the last byte.
    let mut tail = vec![0u8; 10];
    assert_eq!(c.get(1, &key, LEN - 10, RegionMut { ptr: tail.as_mut_ptr(), len: 10 }, 2).unwrap(), Issued::Done);
    assert_eq!(tail, pattern(1, LEN)[LEN - 10..]);
    // Put, then read it back.
    let src = pattern(2, 1000);
    assert_eq!(c.put(1, Region { ptr: src.as_ptr(), len: 1000 }, &key, 100, 3).unwrap(), Issued::Done);
    let mut back = vec![0u8; 1000];
    c.get(1, &key, 100, RegionMut { ptr: back.as_mut_ptr(), len: 1000 }, 4).unwrap();
    assert_eq!(back, src);

    // Bad keys: past the end, overflowing, naming another process, wrong length, unknown peer.
    let past = c.get(1, &key, LEN - 9, RegionMut { ptr: tail.as_mut_ptr(), len: 10 }, 5).unwrap_err();
    assert!(matches!(&past, Error::Transport { kind: "cma", what } if what.contains("outside")), "{past}");
    assert!(c.get(1, &key, usize::MAX, RegionMut { ptr: tail.as_mut_ptr(), len: 10 }, 6).is_err());
    let mut forged = key.as_bytes().to_vec();
    forged[..4].copy_from_slice(&std::process::id().to_le_bytes());
    let forged = RemoteKey::new(&forged).unwrap();
    let e = c.put(1, Region { ptr: src.as_ptr(), len: 10 }, &forged, 0, 7).unwrap_err().to_string();
    assert!(e.contains("names pid"), "{e}");
    let short = RemoteKey::new(&key.as_bytes()[..19]).unwrap();
    assert!(c
        .get(1, &short, 0, RegionMut { ptr: tail.as_mut_ptr(), len: 1 }, 8)
        .unwrap_err()
        .to_string()
        .contains("19"));
    assert!(c.get(5, &key, 0, RegionMut { ptr: tail.as_mut_ptr(), len: 1 }, 9).is_err());
    assert!(c.try_send(1, &[0; 36], &[]).is_err());

    child.send("check");
    assert_eq!(child.recv(), "ok");
    assert!(child.wait().success());
    // The peer is gone: the kernel refuses, and the error names the peer and sizes.
    let e = c.get(1, &key, 0, RegionMut { ptr: got.as_mut_ptr(), len: 64 }, 10).unwrap_err().to_string();
    assert!(e.contains("process_vm_readv") && e.contains("rank 1") && e.contains("64 bytes"), "{e}");
}

#[test]
fn probe_refused_by_the_kernel() {
    let c = CmaTransport::new().with_host(HOST);
    let mut child = ChildProc::spawn("child_entry", "refuse", &[]);
    child.send(&hex(&c.address()));
    let answer = child.recv();
    assert!(child.wait().success());
    let (dropped, why) = answer.split_once(' ').unwrap();
    if dropped == "true" {
        assert!(
            why.starts_with(&format!(
                "process_vm_readv from pid {} refused: Operation not permitted",
                std::process::id()
            )),
            "{why}"
        );
        assert!(why.contains("CAP_SYS_PTRACE"), "{why}");
    } else {
        eprintln!("not root: could not drop privileges in the child; it saw: {why}");
    }
}

#[test]
fn probe_of_a_dead_process_or_a_wrong_value() {
    let mut c = CmaTransport::new().with_host(HOST);
    // A process that has exited (and was reaped).
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    let mut addr = c.address();
    addr[4..8].copy_from_slice(&pid.to_le_bytes());
    let why = refusal(c.add_peer(&peer(3), &addr));
    assert!(why.starts_with(&format!("process_vm_readv from pid {pid} refused")), "{why}");
    // Our own probe word with the wrong magic.
    let mut addr = c.address();
    addr[16] ^= 0xff;
    assert!(refusal(c.add_peer(&peer(2), &addr)).contains("wrong value"));
    // Another host, and garbage.
    let mut far = peer(4);
    far.host = "elsewhere".into();
    assert!(refusal(c.add_peer(&far, &c.address())).contains("different host"));
    assert!(refusal(c.add_peer(&peer(5), b"xx")).contains("not a polyrail cma address"));
    let d = c.describe();
    assert!(d.contains("failed for 4 of 4") && d.contains("rank 3"), "{d}");
    assert!(c
        .get(3, &RemoteKey::new(&[0; 20]).unwrap(), 0, RegionMut { ptr: std::ptr::null_mut(), len: 0 }, 0)
        .is_err());
}

#[test]
fn get_and_put_within_one_process() {
    let mut c = CmaTransport::new().with_host(HOST);
    assert!(matches!(c.add_peer(&peer(0), &c.address()), Reach::Yes(_)));
    let mut buf = pattern(9, 4096);
    let key = c.expose(Region { ptr: buf.as_ptr(), len: buf.len() }, PeerAccess::Write).unwrap();
    let mut out = vec![0u8; 100];
    c.get(0, &key, 50, RegionMut { ptr: out.as_mut_ptr(), len: 100 }, 0).unwrap();
    assert_eq!(out, pattern(9, 4096)[50..150]);
    let src = [0xabu8; 16];
    c.put(0, Region { ptr: src.as_ptr(), len: 16 }, &key, 4080, 0).unwrap();
    assert_eq!(std::hint::black_box(&mut buf)[4080..], src);
}
