//! The PMI server's request handling: bytes from the ranks of a job of three, in any order
//! and split anywhere, fed to the server's state as its reads would. It must answer or refuse
//! without panic, and every answer it queues must be a well-formed PMI message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail_fuzz::Script;
use polyrail_pmi::fuzzing::Server;
use polyrail_pmi::wire::take_frame;

const RANKS: usize = 3;

fuzz_target!(|data: &[u8]| {
    let mut s = Script(data);
    let mut server = Server::new("fuzzjob", RANKS).expect("a server");
    let mut open = [true; RANKS];
    while !s.is_empty() {
        let rank = s.u8() as usize % RANKS;
        let n = s.u8() as usize;
        let bytes = s.take(n);
        open[rank] = server.feed(rank, bytes);
        for (r, &o) in open.iter().enumerate() {
            let mut answers = server.answers(r);
            assert!(o || answers.is_empty(), "answers to closed rank {r}");
            while !answers.is_empty() {
                match take_frame(&mut answers) {
                    Ok(Some(_)) => {}
                    other => panic!("malformed answer to rank {r} ({other:?}): {answers:?}"),
                }
            }
        }
        let _ = server.events();
    }
});
