//! `CmaTransport`: probes, and get/put between two processes, with bad keys rejected.

mod common;

use common::*;
use polyrail_core::{
    AnonMemory, Caps, Error, Issued, Lifetime, OneSided, PeerAccess, Reach, Region, RegionMut, RemoteKey, Transport,
};
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
            let key = *c
                .register(Region { ptr: buf.as_ptr(), len: buf.len() }, PeerAccess::Write, Lifetime::Transfer)
                .unwrap()
                .key();
            say(&hex(&c.address()));
            say(&hex(key.as_bytes()));
            assert_eq!(hear(), "check");
            // The parent wrote 1000 bytes of pattern 2 at offset 100.
            let mut want = pattern(1, LEN);
            want[100..1100].copy_from_slice(&pattern(2, 1000));
            let ok = std::hint::black_box(&mut buf) == &want;
            say(if ok { "ok" } else { "bad" });
        }
        "file" => {
            // Registered memory with a memory file; the key covers it from byte 4096 on.
            let mut c = CmaTransport::new().with_host(HOST);
            let mem = AnonMemory::shared(LEN, "a test").unwrap();
            // SAFETY: `mem` is LEN writable bytes, used by nothing else yet.
            let buf = unsafe { std::slice::from_raw_parts_mut(mem.ptr(), LEN) };
            buf.copy_from_slice(&pattern(3, LEN));
            let whole = Region { ptr: mem.ptr(), len: LEN };
            let lasting = c.register(whole, PeerAccess::ReadWrite, Lifetime::Lasting { file: mem.file() }).unwrap();
            let key = *c
                .register(Region { ptr: buf[4096..].as_ptr(), len: LEN - 4096 }, PeerAccess::Write, Lifetime::Transfer)
                .unwrap()
                .key();
            say(&hex(&c.address()));
            say(&hex(key.as_bytes()));
            assert_eq!(hear(), "check");
            let mut want = pattern(3, LEN);
            want[4096 + 10..4096 + 1010].copy_from_slice(&pattern(4, 1000));
            say(if std::hint::black_box(&*buf) == &want[..] { "ok" } else { "bad" });
            assert_eq!(hear(), "free");
            c.deregister(&lasting, 0..0);
            drop(mem);
            say("freed");
            assert_eq!(hear(), "bye");
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
    assert!(c.try_send(1, &common::header(0, 0), &[]).is_err());

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
    let yes = |r: Reach| match r {
        Reach::Yes(y) => y,
        Reach::No(n) => panic!("probe of ourselves failed: {n}"),
    };
    let why = yes(c.add_peer(&peer(0), &c.address()));
    assert!(why.contains("memory files map here") && maps(&mut c, 0), "{why}");
    // An address without a probe file (a peer where memfds are missing): CMA only.
    let mut addr = c.address();
    addr[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    let why = yes(c.add_peer(&peer(1), &addr));
    assert!(why.contains("copied with CMA") && why.contains("no memory files") && !maps(&mut c, 1), "{why}");
    // A probe file descriptor that names another file.
    let mut addr = c.address();
    addr[28] ^= 1;
    let why = yes(c.add_peer(&peer(2), &addr));
    assert!(why.contains("not the registered file") && !maps(&mut c, 2), "{why}");
    let mut buf = pattern(9, 4096);
    let key =
        *c.register(Region { ptr: buf.as_ptr(), len: buf.len() }, PeerAccess::Write, Lifetime::Transfer).unwrap().key();
    let mut out = vec![0u8; 100];
    c.get(0, &key, 50, RegionMut { ptr: out.as_mut_ptr(), len: 100 }, 0).unwrap();
    assert_eq!(out, pattern(9, 4096)[50..150]);
    let src = [0xabu8; 16];
    c.put(0, Region { ptr: src.as_ptr(), len: 16 }, &key, 4080, 0).unwrap();
    assert_eq!(std::hint::black_box(&mut buf)[4080..], src);
}

/// Memory registered with a memory file is mapped by the peer and copied with loads and stores;
/// a key whose file range is out of bounds is refused, one whose file cannot be verified falls
/// back to CMA, and a file its owner freed is unmapped by `check_peers`.
#[test]
fn registered_memory_files_are_mapped_by_peers() {
    let mut c = CmaTransport::new().with_host(HOST);
    let mut child = ChildProc::spawn("child_entry", "file", &[]);
    let addr = unhex(&child.recv());
    let key_bytes = unhex(&child.recv());
    assert_eq!(key_bytes.len(), 40, "a key of registered memory names its file");
    let key = RemoteKey::new(&key_bytes).unwrap();
    let mut p1 = peer(1);
    p1.pid = child.pid();
    assert!(matches!(c.add_peer(&p1, &addr), Reach::Yes(_)));
    assert!(maps(&mut c, 1), "the child's probe file maps here");
    assert!(c.describe().contains("0 memory files of peers mapped"), "{}", c.describe());

    let mut got = vec![0u8; LEN - 4096];
    c.get(1, &key, 0, RegionMut { ptr: got.as_mut_ptr(), len: got.len() }, 1).unwrap();
    assert!(got == pattern(3, LEN)[4096..]);
    assert!(c.describe().contains("1 memory files of peers mapped"), "{}", c.describe());
    let src = pattern(4, 1000);
    assert_eq!(c.put(1, Region { ptr: src.as_ptr(), len: 1000 }, &key, 10, 2).unwrap(), Issued::Done);
    // Past the key's range, and a key that claims a file offset past the file's end.
    let mut tail = vec![0u8; 10];
    let past = c.get(1, &key, LEN - 4096 - 9, RegionMut { ptr: tail.as_mut_ptr(), len: 10 }, 3).unwrap_err();
    assert!(past.to_string().contains("outside the"), "{past}");
    let mut beyond = key_bytes.clone();
    beyond[32..40].copy_from_slice(&(LEN as u64).to_le_bytes());
    let beyond = RemoteKey::new(&beyond).unwrap();
    let e = c.get(1, &beyond, 0, RegionMut { ptr: tail.as_mut_ptr(), len: 10 }, 4).unwrap_err().to_string();
    assert!(e.contains("outside its") && e.contains("file"), "{e}");
    child.send("check");
    assert_eq!(child.recv(), "ok");

    // A key naming another inode: the file is not mapped and the copy goes through CMA. That
    // may pass (a peer that closed a file and reused its descriptor), so the peer's files are
    // refused only after several such failures in a row; then its registered memory is copied
    // with CMA from then on.
    let mut other = key_bytes.clone();
    other[24] ^= 1;
    let other = RemoteKey::new(&other).unwrap();
    let mut failures = 0;
    while maps(&mut c, 1) && failures < 100 {
        tail.fill(0);
        c.get(1, &other, 0, RegionMut { ptr: tail.as_mut_ptr(), len: 10 }, 5 + failures).unwrap();
        assert_eq!(tail, pattern(3, LEN)[4096..4106]);
        failures += 1;
    }
    assert!((2..100).contains(&failures), "refused after {failures} failed mappings");
    let d = c.describe();
    assert!(d.contains("copied with CMA for rank 1") && d.contains("not the registered file"), "{d}");

    // The owner frees the memory: the next liveness check unmaps the file here.
    child.send("free");
    assert_eq!(child.recv(), "freed");
    c.check_peers(&mut Collect::default());
    assert!(c.describe().contains("0 memory files of peers mapped"), "{}", c.describe());
    child.send("bye");
    assert!(child.wait().success());
}

/// Peers' memory files stay mapped up to 16 of them and 1 GiB together: the least recently
/// used go first, never the one the copy at hand uses (kept even when it alone is over the
/// limit), and every copy reads the file its key names.
#[test]
fn peer_files_are_unmapped_least_recently_used_first() {
    let mut c = CmaTransport::new().with_host(HOST);
    assert!(matches!(c.add_peer(&peer(0), &c.address()), Reach::Yes(_)) && maps(&mut c, 0));
    let assert_mapped = |c: &CmaTransport, n: usize| {
        let d = c.describe();
        assert!(d.contains(&format!("; {n} memory files of peers mapped")), "{n} mapped expected: {d}");
    };
    // Files are sparse: only the pages a test writes or reads take memory.
    let register = |c: &mut CmaTransport, len: usize, fill: u8| {
        let mem = AnonMemory::shared(len, "a test").unwrap();
        // SAFETY: the first 4096 bytes of `mem` are ours (len >= 4096) and used by nothing else.
        unsafe { mem.ptr().write_bytes(fill, 4096) };
        let lasting = Lifetime::Lasting { file: mem.file() };
        let handle = c.register(Region { ptr: mem.ptr(), len }, PeerAccess::ReadWrite, lasting).unwrap();
        (mem, handle)
    };
    let read = |c: &mut CmaTransport, key: &RemoteKey| {
        let mut got = [0u8; 8];
        c.get(0, key, 100, RegionMut { ptr: got.as_mut_ptr(), len: 8 }, 0).unwrap();
        got[0]
    };
    let small: Vec<_> = (0..18u8).map(|i| register(&mut c, 4096, i + 1)).collect();
    for (i, (_, handle)) in small.iter().enumerate() {
        assert_eq!(read(&mut c, handle.key()), i as u8 + 1);
        assert_mapped(&c, (i + 1).min(16));
    }
    // The first file, used again, is mapped again in place of the least recently used.
    assert_eq!(read(&mut c, small[0].1.key()), 1);
    assert_mapped(&c, 16);
    // Two files of 520 MiB: the second takes the mappings over 1 GiB, and every older file goes.
    let big: Vec<_> = (0..2u8).map(|i| register(&mut c, 520 << 20, 100 + i)).collect();
    assert_eq!(read(&mut c, big[0].1.key()), 100);
    assert_mapped(&c, 16);
    assert_eq!(read(&mut c, big[1].1.key()), 101);
    assert_mapped(&c, 1);
    for (_, handle) in big {
        c.deregister(&handle, 0..0);
    }
    // One file over the limit alone stays mapped while it is used.
    let huge = register(&mut c, 1100 << 20, 200);
    assert_eq!(read(&mut c, huge.1.key()), 200);
    assert_mapped(&c, 1);
    assert_eq!(read(&mut c, small[17].1.key()), 18);
    assert_mapped(&c, 1); // the huge file goes once another is used
}

/// Whether `c` copies `peer`'s registered memory through a mapping.
fn maps(c: &mut CmaTransport, peer: u32) -> bool {
    polyrail_core::observe::says_yes(c.observe(peer, polyrail_core::observe::Observe::MapsRegistered))
}
