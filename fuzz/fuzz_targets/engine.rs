//! The engine's incoming packet handling (`Engine::handle_message`) with every packet kind,
//! from two peers the fuzzer plays, between sends and receives it posts, cancels and finishes.
//! A packet the engine refuses must be a protocol error naming its sender; every action the
//! engine asks for must name memory of a live request and carry a header that decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail_core::engine::{Source, TagMatch};
use polyrail_core::fuzzing::{EngineHarness, JOB_SIZE};
use polyrail_core::Header;
use polyrail_fuzz::Script;

fuzz_target!(|data: &[u8]| {
    let mut s = Script(data);
    let mut h = EngineHarness::new();
    // The sequence id each peer's next ordered message should carry.
    let mut next_seq = [0u32; JOB_SIZE as usize + 1];
    let mut rng = 0x9e37_79b9_u32 | s.u8() as u32;
    let mut fail = move || {
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        rng % 8 == 0
    };
    let mut steps = 0;
    while !s.is_empty() && steps < 256 {
        steps += 1;
        match s.u8() % 8 {
            0 => {
                let src = match s.u8() % 4 {
                    3 => Source::Any,
                    r => Source::Rank(r as u32),
                };
                let tag = match s.u8() % 4 {
                    3 => TagMatch::Any,
                    t => TagMatch::Tag(t as u32),
                };
                let ctx = (s.u8() % 3) as u16;
                let len = s.u16() as usize % 9000;
                h.post_recv(src, tag, ctx, len);
            }
            1 => {
                let to = 1 + (s.u8() % 2) as u32;
                let tag = (s.u8() % 3) as u32;
                let ctx = (s.u8() % 3) as u16;
                let len = s.u16() as usize % 9000;
                h.post_send(to, tag, ctx, len);
            }
            2 | 3 => {
                let mode = s.u8();
                let from = (mode % 4) as u32;
                let wire: [u8; Header::WIRE_LEN] = if mode & 4 != 0 {
                    s.array()
                } else {
                    let slot = &mut next_seq[from as usize];
                    let seq = (mode & 8 == 0).then(|| {
                        *slot = slot.wrapping_add(1);
                        slot.wrapping_sub(1)
                    });
                    let mut w = [0u8; Header::WIRE_LEN];
                    s.header(seq).encode(&mut w);
                    w
                };
                let plen = match s.u8() {
                    255 => s.u16() as usize,
                    n => n as usize,
                };
                let mut payload = s.take(plen).to_vec();
                payload.resize(plen, 0xa5);
                h.packet(from, &wire, &payload);
            }
            4 => h.drain(&mut fail),
            5 => h.cancel(s.u8() as usize),
            6 => h.reap(),
            _ => {
                if s.u8() % 8 == 0 {
                    h.lose(1 + (s.u8() % 2) as u32);
                }
            }
        }
    }
    h.drain(&mut fail);
    h.reap();
});
