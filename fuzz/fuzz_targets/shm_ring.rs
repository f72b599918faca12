//! The shm ring: records and body slots a peer's producer writes (`Consumer::take`), and the
//! read positions a peer's consumer publishes (`Producer::read_position`). One ring, its
//! producer and consumer, driven by the input, which also writes what a faulty peer would
//! anywhere in the ring. Until the first such write the consumer must take exactly what the
//! producer pushed; after it, anything goes but a panic or an access outside the ring.
#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use polyrail_core::{Envelope, Header};
use polyrail_fuzz::Script;
use polyrail_shm::fuzzing::{RingHarness, Taken};

fuzz_target!(|data: &[u8]| {
    let mut s = Script(data);
    let mut ring = RingHarness::new();
    let mut pushed = VecDeque::new();
    let mut corrupt = false;
    let mut steps = 0;
    while !s.is_empty() && steps < 512 {
        steps += 1;
        match s.u8() % 8 {
            0 => {
                let hdr = s.header(None);
                let n = s.u16() as usize % (ring.inline_max() + 1);
                let payload = s.take(n).to_vec();
                match ring.push(&hdr, &payload) {
                    Ok(true) => pushed.push_back(Taken::Inline(hdr, payload)),
                    Ok(false) => {}
                    Err(e) => assert!(corrupt, "{e}"),
                }
            }
            1 => {
                let env = Envelope::new(s.u16(), s.u32(), s.u32());
                let n = s.u8() as usize % 113;
                let payload = s.take(n).to_vec();
                match ring.push_compact(env, &payload) {
                    Ok(true) => pushed.push_back(Taken::Inline(env.header(payload.len()), payload)),
                    Ok(false) => {}
                    Err(e) => assert!(corrupt, "{e}"),
                }
            }
            2 => {
                let mut hdr = s.header(None);
                let (plen, cell) = (s.u32(), s.u32());
                if s.u8() & 1 == 0 {
                    hdr = Header::eager(hdr.ctx, hdr.tag, hdr.seq, plen as u64);
                }
                match ring.push_cell(&hdr, plen, cell) {
                    Ok(true) => pushed.push_back(Taken::Cell(hdr, cell, plen as usize)),
                    Ok(false) => {}
                    Err(e) => assert!(corrupt, "{e}"),
                }
            }
            3 | 4 => {
                let got = ring.take();
                if !corrupt {
                    assert_eq!(got, Ok(pushed.pop_front()));
                }
            }
            5 => {
                if s.u8() & 1 == 0 {
                    ring.idle();
                } else {
                    let _ = ring.may_have_arrival();
                    let r = ring.read_position();
                    assert!(corrupt || r.is_ok(), "{r:?}");
                }
            }
            6 => {
                let offset = s.u16() as usize;
                let n = s.u8() as usize % 64;
                let bytes = s.take(n).to_vec();
                ring.scribble(offset, &bytes);
                corrupt = true;
            }
            _ => {
                let offset = s.u8() as usize;
                let n = s.u8() as usize % 32;
                let publish = s.u8() & 1 == 1;
                let bytes = s.take(n).to_vec();
                ring.corrupt_next(offset, &bytes, publish);
                corrupt = true;
            }
        }
    }
});
