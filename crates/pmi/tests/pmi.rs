//! PMI wire parsing, and the PMI server driven by the PMI-1 and PMI-2 clients over socketpairs.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use polyrail_core::Error;
use polyrail_pmi::server::{PmiServer, ServerEvent};
use polyrail_pmi::wire::{self, Msg, Wire};
use polyrail_pmi::{Bootstrap, Pmi1Client, Pmi2Client};
use proptest::prelude::*;

fn bootstrap_error<T: std::fmt::Debug>(r: polyrail_core::Result<T>) -> String {
    match r {
        Err(Error::Bootstrap(m)) => m,
        other => panic!("expected Error::Bootstrap, got {other:?}"),
    }
}

// ---- wire format ----

#[test]
fn v1_round_trip_escapes_spaces_and_backslashes() {
    let m = Msg::new("abort").with("exitcode", 3).with("message", r"lost rank 2 \ bye");
    let bytes = m.encode_v1();
    assert_eq!(bytes, b"cmd=abort exitcode=3 message=lost\\ rank\\ 2\\ \\\\\\ bye\n");
    assert_eq!(wire::parse_v1(&bytes).unwrap(), m);
}

#[test]
fn v1_parses_hydra_answers() {
    let m = wire::parse_v1(b"cmd=get_result rc=0 msg=success value=(vector,(0,1,1))\n").unwrap();
    assert_eq!(m.cmd, "get_result");
    assert_eq!(m.get("value"), Some("(vector,(0,1,1))"));
    assert!(m.check_rc("get").is_ok());
    let m = wire::parse_v1(b"cmd=get_result rc=-1 msg=key_nokey_not_found value=unknown").unwrap();
    assert!(bootstrap_error(m.check_rc("get of nokey")).contains("key_nokey_not_found"));
    // Extra spaces between fields are tolerated; a value may contain `=`.
    let m = wire::parse_v1(b"cmd=put  key=a value=b=c \n").unwrap();
    assert_eq!(m.get("value"), Some("b=c"));
}

/// Hydra sends free text with unescaped spaces (`msg=Keys with PMI_ prefix are reserved`): the
/// words after the first continue the field before them, as MPICH's parser reads them.
#[test]
fn v1_bare_words_continue_the_value_before_them() {
    let m = wire::parse_v1(b"cmd=put_result rc=1 msg=Keys with PMI_ prefix are reserved\n").unwrap();
    assert_eq!(m.get("msg"), Some("Keys with PMI_ prefix are reserved"));
    assert!(bootstrap_error(m.check_rc("put")).contains("Keys with PMI_ prefix are reserved"));
    assert!(bootstrap_error(wire::parse_v1(b"lonely cmd=x\n")).contains("no `=`"));
}

#[test]
fn v1_rejects_malformed_lines() {
    let cases: &[(&[u8], &str)] = &[
        (b"", "cmd=NAME"),
        (b"\n", "cmd=NAME"),
        (b"hello world\n", "has no `=`"),
        (b"key=v cmd=x\n", "cmd=NAME"),
        (b"cmd=\n", "cmd=NAME"),
        (b"cmd=put key\n", "has no `=`"),
        // Only free text (msg, errmsg, message) runs on past a space.
        (b"cmd=put key=a b value=c\n", "has no `=`"),
        (b"cmd=put =v\n", "not a valid key"),
        (b"cmd=put k\xffey=v\n", "UTF-8"),
        (b"cmd=put key=a\tb\n", "control character"),
        (b"cmd=put key=a\\", "lone backslash"),
    ];
    for (line, hint) in cases {
        let msg = bootstrap_error(wire::parse_v1(line));
        assert!(msg.contains(hint), "{line:?}: {msg:?} should mention {hint:?}");
    }
    let long = [b"cmd=put value=".as_slice(), &vec![b'x'; wire::MAX_V1_LINE]].concat();
    assert!(bootstrap_error(wire::parse_v1(&long)).contains("limit"));
}

#[test]
fn v2_round_trip_doubles_semicolons() {
    let m = Msg::new("kvs-put").with("key", "k0").with("value", "a;b");
    let bytes = m.encode_v2().unwrap();
    assert_eq!(bytes, b"000030cmd=kvs-put;key=k0;value=a;;b;");
    assert_eq!(wire::parse_v2_len(&bytes[..6]).unwrap(), 30);
    assert_eq!(wire::parse_v2(&bytes[6..]).unwrap(), m);
}

#[test]
fn v2_parses_hydra_and_mpich_framing() {
    // Hydra pads the length on the left, MPICH's client on the right.
    assert_eq!(wire::parse_v2_len(b"    59").unwrap(), 59);
    assert_eq!(wire::parse_v2_len(b"38    ").unwrap(), 38);
    assert_eq!(wire::parse_v2_len(b"000037").unwrap(), 37);
    let m = wire::parse_v2(b"cmd=kvs-get-response;found=TRUE;value=v0;rc=0;").unwrap();
    assert_eq!((m.get("found"), m.get("value"), m.get("rc")), (Some("TRUE"), Some("v0"), Some("0")));
    // An empty value, and a last field without its `;`.
    let m = wire::parse_v2(b"cmd=kvs-get;jobid=;srcid=-1;key=k0").unwrap();
    assert_eq!((m.get("jobid"), m.get("key")), (Some(""), Some("k0")));
}

#[test]
fn v2_rejects_malformed_input() {
    for header in [&b"abcdef"[..], b"", b"12345", b"-00001", b"1 2 34", b"      ", b"12345\xff"] {
        let msg = bootstrap_error(wire::parse_v2_len(header));
        assert!(msg.contains("length header"), "{header:?}: {msg}");
    }
    let cases: &[(&[u8], &str)] = &[
        (b"", "cmd=NAME"),
        (b"key=v;", "cmd=NAME"),
        (b"cmd=x;junk;", "has no `=`"),
        (b"cmd=x;=v;", "not a valid key"),
    ];
    for (body, hint) in cases {
        let msg = bootstrap_error(wire::parse_v2(body));
        assert!(msg.contains(hint), "{body:?}: {msg:?} should mention {hint:?}");
    }
}

#[test]
fn frames_are_detected_per_message_and_may_arrive_in_pieces() {
    let mut stream = b"cmd=init pmi_version=2 pmi_subversion=0\n000014cmd=kvs-fence;".to_vec();
    let mut buf = Vec::new();
    let mut got = Vec::new();
    for b in stream.drain(..) {
        buf.push(b);
        while let Some(frame) = wire::take_frame(&mut buf).unwrap() {
            got.push(frame);
        }
    }
    assert!(buf.is_empty());
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].0, got[0].1.cmd.as_str()), (Wire::V1, "init"));
    assert_eq!((got[1].0, got[1].1.cmd.as_str()), (Wire::V2, "kvs-fence"));
    let mut garbage = b"00x014cmd=kvs-fence;".to_vec();
    assert!(bootstrap_error(wire::take_frame(&mut garbage)).contains("length header"));
    let mut endless = vec![b'c'; wire::MAX_V1_LINE];
    assert!(bootstrap_error(wire::take_frame(&mut endless)).contains("longer than"));
}

#[test]
fn check_token_names_the_problem() {
    assert!(wire::check_token("key \"k\"", "abc-1:2", 10).is_ok());
    assert!(bootstrap_error(wire::check_token("key \"k\"", "a b", 10)).contains("key \"k\" contains ' '"));
    assert!(bootstrap_error(wire::check_token("key \"k\"", "a=b", 10)).contains("'='"));
    assert!(bootstrap_error(wire::check_token("the value", "abcdef", 5)).contains("limit of 5"));
    // MPICH's parser refuses `value=`, and Hydra then fails the job.
    assert!(bootstrap_error(wire::check_token("the value", "", 5)).contains("the value is empty"));
}

proptest! {
    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = wire::parse_v1(&bytes);
        let _ = wire::parse_v2(&bytes);
        let _ = wire::parse_v2_len(&bytes);
        let mut buf = bytes.clone();
        while let Ok(Some(_)) = wire::take_frame(&mut buf) {}
    }

    #[test]
    fn printable_values_round_trip(value in "[ -~]{0,60}") {
        let m = Msg::new("x").with("value", &value);
        prop_assert_eq!(wire::parse_v1(&m.encode_v1()).unwrap(), m.clone());
        let v2 = m.encode_v2().unwrap();
        prop_assert_eq!(wire::parse_v2(&v2[6..]).unwrap(), m);
    }
}

// ---- server and clients ----

/// A server for `n` ranks and the clients' ends of their sockets.
fn server(job: &str, n: usize) -> (PmiServer, Vec<UnixStream>) {
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (s, c) = UnixStream::pair().unwrap();
        ours.push(s);
        theirs.push(c);
    }
    (PmiServer::start(job, ours).unwrap(), theirs)
}

/// Events until `done` says so or 10 s pass.
fn events_until(srv: &PmiServer, done: impl Fn(&[ServerEvent]) -> bool) -> Vec<ServerEvent> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut evs = Vec::new();
    while !done(&evs) && Instant::now() < deadline {
        if let Some(e) = srv.next_event(Duration::from_millis(20)) {
            evs.push(e);
        }
    }
    evs
}

fn open(stream: UnixStream, rank: u32, size: u32) -> Box<dyn Bootstrap> {
    if rank % 2 == 0 {
        Box::new(Pmi1Client::from_stream(stream, rank, size).unwrap())
    } else {
        Box::new(Pmi2Client::from_stream(stream, rank).unwrap())
    }
}

fn exchange(b: &mut dyn Bootstrap) -> polyrail_core::Result<()> {
    let (rank, size) = (b.rank(), b.size());
    b.put(&format!("k{rank}"), &format!("v{rank}"))?;
    b.fence()?;
    for o in 0..size {
        assert_eq!(b.get(&format!("k{o}"))?, format!("v{o}"));
    }
    b.fence()?;
    b.finalize()
}

#[test]
fn mixed_pmi1_and_pmi2_clients_share_one_job() {
    let n = 6;
    let (srv, socks) = server("job-mixed", n);
    let handles: Vec<_> = socks
        .into_iter()
        .enumerate()
        .map(|(r, s)| {
            thread::spawn(move || {
                let mut b = open(s, r as u32, n as u32);
                assert_eq!((b.rank(), b.size(), b.job_id()), (r as u32, n as u32, "job-mixed"));
                exchange(b.as_mut())
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    let evs = events_until(&srv, |e| e.iter().filter(|x| matches!(x, ServerEvent::Finalized(_))).count() == n);
    for r in 0..n as u32 {
        assert!(evs.contains(&ServerEvent::Initialized(r)), "{evs:?}");
        assert!(evs.contains(&ServerEvent::Finalized(r)), "{evs:?}");
    }
    assert!(!evs.iter().any(|e| matches!(e, ServerEvent::Lost { .. })), "{evs:?}");
    srv.stop();
}

#[test]
fn missing_keys_and_oversized_values_are_named() {
    let (srv, mut socks) = server("job-limits", 2);
    let s1 = socks.pop().unwrap();
    let s0 = socks.pop().unwrap();
    let t = thread::spawn(move || {
        let mut b = Pmi2Client::from_stream(s1, 1).unwrap();
        assert!(bootstrap_error(b.get("nokey")).contains("\"nokey\""));
        // PMI2_MAX_VALLEN is 1024 with the terminating NUL (Hydra keeps 1023 characters).
        assert_eq!(b.max_value_len(), 1023);
        let msg = bootstrap_error(b.put("big", &"x".repeat(1024)));
        assert!(msg.contains("\"big\"") && msg.contains("limit of 1023"), "{msg}");
        b.put("fits", &"y".repeat(b.max_value_len())).unwrap();
        b.finalize().unwrap();
        assert!(bootstrap_error(b.fence()).contains("after finalize"));
    });
    let mut b = Pmi1Client::from_stream(s0, 0, 2).unwrap();
    assert_eq!(b.max_value_len(), 1023);
    assert!(bootstrap_error(b.get("nokey")).contains("\"nokey\""));
    let msg = bootstrap_error(b.put("big", &"x".repeat(1024)));
    assert!(msg.contains("\"big\"") && msg.contains("1023"), "{msg}");
    assert!(bootstrap_error(b.put("k", "has space")).contains("' '"));
    assert_eq!(b.get("PMI_process_mapping").unwrap(), "(vector,(0,1,2))");
    t.join().unwrap();
    b.finalize().unwrap();
    drop(srv);
}

/// As under Hydra, whose proxy holds puts back until the fence: a value is not seen before
/// the fence that follows its put (code missing a fence fails here too, not only under Hydra),
/// and keys starting with `PMI_` are the server's.
#[test]
fn puts_are_seen_after_the_fence_and_pmi_keys_are_reserved() {
    let (srv, mut socks) = server("job-fence", 2);
    let s1 = socks.pop().unwrap();
    let s0 = socks.pop().unwrap();
    let t = thread::spawn(move || {
        let mut b = Pmi2Client::from_stream(s1, 1).unwrap();
        b.put("early", "1").unwrap();
        assert!(bootstrap_error(b.get("early")).contains("\"early\""), "seen before the fence");
        b.fence().unwrap();
        b.fence().unwrap();
        b.finalize().unwrap();
    });
    let mut b = Pmi1Client::from_stream(s0, 0, 2).unwrap();
    assert!(bootstrap_error(b.put("PMI_process_mapping", "(vector,(0,2,1))")).contains("reserved"));
    b.fence().unwrap();
    assert_eq!(b.get("early").unwrap(), "1");
    assert_eq!(b.get("PMI_process_mapping").unwrap(), "(vector,(0,1,2))");
    b.fence().unwrap();
    t.join().unwrap();
    b.finalize().unwrap();
    drop(srv);
}

#[test]
fn a_rank_that_disconnects_fails_the_barrier_of_the_others() {
    let (srv, socks) = server("job-lost", 3);
    let mut it = socks.into_iter();
    let (s0, s1, s2) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let waiters: Vec<_> =
        [(s0, 0), (s1, 1)].into_iter().map(|(s, r)| thread::spawn(move || open(s, r, 3).fence())).collect();
    let b2 = Pmi1Client::from_stream(s2, 2, 3).unwrap();
    thread::sleep(Duration::from_millis(100));
    drop(b2);
    for w in waiters {
        let msg = bootstrap_error(w.join().unwrap());
        assert!(msg.contains("rank 2"), "{msg}");
    }
    let evs = events_until(&srv, |e| e.iter().any(|x| matches!(x, ServerEvent::Lost { .. })));
    assert!(
        evs.iter().any(|e| matches!(e, ServerEvent::Lost { rank: 2, why } if why.contains("without finalize"))),
        "{evs:?}"
    );
}

#[test]
fn garbage_disconnects_the_sender_only() {
    for garbage in [&b"hello world\n"[..], b"\xff\xfe\xfd\n", b"00x001", b"cmd=put k=\xff\n"] {
        let (srv, mut socks) = server("job-garbage", 2);
        let mut raw = socks.pop().unwrap();
        let s0 = socks.pop().unwrap();
        let t = thread::spawn(move || Pmi1Client::from_stream(s0, 0, 2).and_then(|mut b| b.fence()));
        raw.write_all(garbage).unwrap();
        let mut rest = Vec::new();
        raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(raw.read_to_end(&mut rest).unwrap(), 0, "the server should close the connection");
        let msg = bootstrap_error(t.join().unwrap());
        assert!(msg.contains("rank 1"), "{msg}");
        let evs = events_until(&srv, |e| e.iter().any(|x| matches!(x, ServerEvent::Lost { .. })));
        assert!(
            evs.iter().any(|e| matches!(e, ServerEvent::Lost { rank: 1, why } if why.contains("malformed"))),
            "{evs:?}"
        );
    }
}

/// Sends one message and reads the answer, by hand.
fn raw_call(s: &mut UnixStream, wire: Wire, m: &Msg) -> Msg {
    s.write_all(&m.encode(wire).unwrap()).unwrap();
    match wire {
        Wire::V1 => wire::read_v1(&mut std::io::BufReader::new(s)).unwrap(),
        Wire::V2 => wire::read_v2(s).unwrap(),
    }
}

#[test]
fn abort_is_reported_and_closes_the_connection() {
    let (srv, mut socks) = server("job-abort", 1);
    let mut raw = socks.pop().unwrap();
    let init = Msg::new("init").with("pmi_version", 1).with("pmi_subversion", 1);
    assert_eq!(raw_call(&mut raw, Wire::V1, &init).cmd, "response_to_init");
    raw.write_all(b"cmd=abort exitcode=5 message=bye\\ now\n").unwrap();
    let mut rest = Vec::new();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(raw.read_to_end(&mut rest).unwrap(), 0);
    let evs = events_until(&srv, |e| e.len() >= 2);
    assert_eq!(evs[1], ServerEvent::Aborted { rank: 0, code: 5, message: "bye now".into() });
}

/// An abort message of any length makes a well-formed abort in both formats: free text is cut
/// to `TEXT_LIMIT` characters (a 70 000-byte message made an over-long PMI-1 line, which the
/// server refused as malformed, so the job was not aborted at once).
#[test]
fn a_long_abort_message_is_cut_not_refused() {
    let long = "x".repeat(70_000);
    let text = wire::sanitize_text(&long);
    assert_eq!(text.len(), wire::TEXT_LIMIT + 3);
    assert!(text.ends_with("..."));
    assert_eq!(wire::sanitize_text("short; text\n"), "short, text ");
    for format in [Wire::V1, Wire::V2] {
        let (srv, mut socks) = server("job-long-abort", 1);
        let mut raw = socks.pop().unwrap();
        let init = Msg::new("init").with("pmi_version", 1).with("pmi_subversion", 1);
        assert_eq!(raw_call(&mut raw, Wire::V1, &init).cmd, "response_to_init");
        let abort = Msg::new("abort").with("isworld", "TRUE").with("exitcode", 3).with("message", &text);
        raw.write_all(&abort.encode(format).unwrap()).unwrap();
        let evs = events_until(&srv, |e| e.len() >= 2);
        assert!(
            matches!(&evs[1], ServerEvent::Aborted { rank: 0, code: 3, message } if message.ends_with("...")),
            "{format:?}: {evs:?}"
        );
    }
}

/// The server refuses empty keys and values too (MPICH's parser refuses `value=`, and Hydra
/// then fails the job): a client that is not ours gets the error.
#[test]
fn the_server_refuses_empty_values() {
    let (srv, mut socks) = server("job-empty", 1);
    let mut raw = socks.pop().unwrap();
    let reply = raw_call(&mut raw, Wire::V1, &Msg::new("put").with("key", "k").with("value", ""));
    assert!(bootstrap_error(reply.check_rc("put")).contains("empty"));
    let reply = raw_call(&mut raw, Wire::V2, &Msg::new("kvs-put").with("key", "k").with("value", ""));
    assert!(bootstrap_error(reply.check_rc("put")).contains("empty"));
    drop(srv);
}

/// A rank cannot grow the launcher without limit: puts beyond its share of the key-value space
/// fail naming the limit; a key put again replaces its value rather than taking more.
#[test]
fn the_key_value_space_of_a_rank_is_bounded() {
    use polyrail_pmi::server::rank_kvs_limit;
    let (srv, mut socks) = server("job-kvs", 1);
    let mut raw = socks.pop().unwrap();
    let (max_bytes, max_keys) = rank_kvs_limit(1);
    let value = "v".repeat(1000);
    let put = |raw: &mut UnixStream, key: &str| {
        raw_call(raw, Wire::V1, &Msg::new("put").with("key", key).with("value", &value)).check_rc("put")
    };
    for _ in 0..10 * max_bytes / 1000 {
        put(&mut raw, "same").expect("a key put again takes no more space");
    }
    let mut taken = 0;
    let refused = loop {
        match put(&mut raw, &format!("k{taken}")) {
            Ok(_) => taken += 1,
            Err(e) => break bootstrap_error(Err::<(), _>(e)),
        }
        assert!(taken <= max_keys, "more than {max_keys} keys taken");
    };
    assert!(taken >= (max_bytes / 1004).min(max_keys) - 2, "refused after {taken} keys: {refused}");
    assert!(refused.contains("key-value space is full") && refused.contains(&max_bytes.to_string()), "{refused}");
    drop(srv);
}

#[test]
fn unsupported_commands_get_an_error_answer() {
    let (srv, mut socks) = server("job-unknown", 1);
    let mut raw = socks.pop().unwrap();
    let reply = raw_call(&mut raw, Wire::V1, &Msg::new("spawn"));
    assert_eq!(reply.cmd, "spawn_result");
    assert!(bootstrap_error(reply.check_rc("spawn")).contains("unsupported"));
    let reply = raw_call(&mut raw, Wire::V2, &Msg::new("name-publish").with("thrid", "0x1"));
    assert_eq!((reply.cmd.as_str(), reply.get("thrid")), ("name-publish-response", Some("0x1")));
    assert!(reply.check_rc("publish").is_err());
    // The connection still works.
    let reply = raw_call(&mut raw, Wire::V1, &Msg::new("get_my_kvsname"));
    assert_eq!(reply.get("kvsname"), Some("job-unknown"));
    drop(srv);
}

/// A request whose answer could not be framed (an unsupported PMI-2 command named with
/// 600000 bytes, repeated in the answer beyond PMI-2's 999999-byte limit) closes the connection:
/// the rank is told at once instead of waiting for an answer for ever.
#[test]
fn an_answer_too_long_to_send_closes_the_connection() {
    let (srv, mut socks) = server("job-long", 1);
    let mut raw = socks.pop().unwrap();
    // A request of 999 005 bytes, whose answer (the command's name with `-response`, and an
    // error text) is above the 999 999 bytes a PMI-2 length can say.
    let body = format!("cmd={};", "a".repeat(999_000));
    raw.write_all(format!("{:<6}{body}", body.len()).as_bytes()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    assert_eq!(raw.read_to_end(&mut rest).unwrap(), 0, "closed, not answered");
    let evs = events_until(&srv, |e| e.iter().any(|e| matches!(e, ServerEvent::Lost { .. })));
    assert!(evs.iter().any(|e| matches!(e, ServerEvent::Lost { rank: 0, .. })), "{evs:?}");
}

#[test]
fn fullinit_checks_the_rank_and_accepts_right_padded_lengths() {
    let (srv, mut socks) = server("job-fullinit", 2);
    let mut raw = socks.pop().unwrap();
    let bad = Msg::new("fullinit").with("pmirank", 0).with("threaded", "FALSE");
    assert!(bootstrap_error(raw_call(&mut raw, Wire::V2, &bad).check_rc("fullinit")).contains("rank 1"));
    // As MPICH's PMI-2 client writes it: length padded with spaces on the right.
    raw.write_all(b"38    cmd=fullinit;pmirank=1;threaded=FALSE;").unwrap();
    let reply = wire::read_v2(&mut raw).unwrap();
    assert_eq!((reply.get("rank"), reply.get("size"), reply.get("rc")), (Some("1"), Some("2"), Some("0")));
    drop(srv);
}

#[test]
fn a_finalized_rank_makes_later_barriers_fail() {
    let (srv, mut socks) = server("job-final", 2);
    let s1 = socks.pop().unwrap();
    let s0 = socks.pop().unwrap();
    let mut b0 = Pmi1Client::from_stream(s0, 0, 2).unwrap();
    b0.finalize().unwrap();
    let mut b1 = Pmi2Client::from_stream(s1, 1).unwrap();
    assert!(bootstrap_error(b1.fence()).contains("rank 0 has finalized"));
    drop(srv);
}

/// Whether `fd` polls readable within `ms` milliseconds.
fn readable(fd: std::os::fd::BorrowedFd<'_>, ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// The event descriptor wakes a launcher for each event and is quiet once they were taken,
/// including events that came while it was being drained.
#[test]
fn the_event_descriptor_is_readable_while_events_wait() {
    let (srv, socks) = server("job-notice", 2);
    assert!(!readable(srv.event_fd(), 0), "readable before any event");
    let mut it = socks.into_iter();
    let b0 = Pmi1Client::from_stream(it.next().unwrap(), 0, 2).unwrap();
    assert!(readable(srv.event_fd(), 10_000), "no notice of rank 0's init");
    assert_eq!(srv.try_event(), Some(ServerEvent::Initialized(0)));
    assert_eq!(srv.try_event(), None);
    assert!(!readable(srv.event_fd(), 0), "still readable after every event was taken");
    let b1 = Pmi2Client::from_stream(it.next().unwrap(), 1).unwrap();
    drop(b0);
    let mut evs = Vec::new();
    while evs.len() < 2 {
        assert!(readable(srv.event_fd(), 10_000), "no notice for the events after {evs:?}");
        evs.extend(std::iter::from_fn(|| srv.try_event()));
    }
    assert!(evs.contains(&ServerEvent::Initialized(1)), "{evs:?}");
    assert!(evs.iter().any(|e| matches!(e, ServerEvent::Lost { rank: 0, .. })), "{evs:?}");
    // The server queues an event, then writes its notice: the notice of the second event may
    // come after both were taken. Such a trailing notice finds no event, and taking it leaves
    // the descriptor quiet.
    while readable(srv.event_fd(), 200) {
        assert_eq!(srv.try_event(), None, "an event beyond {evs:?}");
    }
    drop(b1);
}
