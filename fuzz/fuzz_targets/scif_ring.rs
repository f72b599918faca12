//! The `scif` channel's ring: the frames a peer writes into this process's receive ring (read
//! as `ScifChannel::drain` does) and the head a peer publishes to this process's writer
//! (checked as `ScifChannel::try_send` does). One ring, its writer and its reader, driven by the
//! input, which also forges the tail the reader sees, the head the writer sees and the ring's
//! bytes. Until the first forgery the reader must take exactly what the writer wrote; after it,
//! anything goes but a panic, a frame outside the ring or a head that does not advance.
//!
//! The input starts with the capacity (u16: high bit clear, a multiple of 8 up to 8 KiB that the
//! writer takes; set, any up to 8 KiB, reader only) and the starting position (u64), then ops:
//! 0/1 write a frame (header, payload length u16, payload), 2/3 read (budget u8, 128 and up for
//! all), 4 write bytes into the ring (offset u16, length u16, bytes), 5 forge the reader's tail,
//! 6 the writer's head, 7 the reader's own head (mode u8, then a u64 or a u16 distance).
#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use polyrail_core::Header;
use polyrail_fuzz::Script;
use polyrail_scif::fuzzing::{frame_len, read_ring, write_ring, MAX_EAGER};

/// Bytes of a frame before its payload: frame head and engine header.
const BEFORE_PAYLOAD: usize = 8 + Header::WIRE_LEN;

/// A position moved by the next bytes: a u64 outright, or a u16 distance before or after `from`.
fn forged(s: &mut Script, from: u64) -> u64 {
    match s.u8() % 3 {
        0 => s.u64(),
        1 => from.wrapping_add(s.u16() as u64),
        _ => from.wrapping_sub(s.u16() as u64),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut s = Script(data);
    let raw = s.u16();
    let writes = raw & 0x8000 == 0;
    let cap = if writes { (raw as usize % 1024 + 1) * 8 } else { (raw & 0x7fff) as usize % (8192 + 1) };
    // The writer's positions are multiples of 8 and far from 2^64 (they count bytes sent).
    let start = if writes { s.u64() & ((1 << 48) - 1) & !7 } else { s.u64() };
    let mut ring = vec![0u8; cap];
    // The writer's tail and the head it sees; the reader's head and the tail it sees.
    let (mut tail, mut writer_head) = (start, start);
    let (mut head, mut reader_tail) = (start, start);
    let mut sent: VecDeque<(Header, Vec<u8>)> = VecDeque::new();
    let mut forged_any = false;
    let mut steps = 0;
    while !s.is_empty() && steps < 256 {
        steps += 1;
        match s.u8() % 8 {
            0 | 1 => {
                let hdr = s.header(None);
                let n = s.u16() as usize % (cap.min(MAX_EAGER) + 1);
                let payload = s.take(n);
                if !writes {
                    continue;
                }
                let before = ring.clone();
                let bad_head = writer_head > tail || tail - writer_head > cap as u64;
                match write_ring(&mut ring, writer_head, tail, &hdr, payload) {
                    Err(e) => assert!(bad_head, "a head within the ring refused: {e}"),
                    Ok(None) => {
                        assert!(!bad_head, "a head outside the ring taken");
                        let fits = tail == writer_head && 2 * frame_len(payload.len()) <= cap;
                        assert!(!fits, "an empty ring of {cap} bytes refused a frame of {} at {tail}", payload.len());
                        assert_eq!(ring, before, "a refused frame wrote");
                    }
                    Ok(Some(t)) => {
                        assert!(!bad_head, "a head outside the ring taken");
                        let total = frame_len(payload.len()) as u64;
                        let pad = t.checked_sub(tail + total).expect("the tail moved by a frame at least");
                        let pos = tail % cap as u64;
                        assert!(pad == 0 || pos + pad == cap as u64, "a pad of {pad} at {pos} not to the end");
                        assert!(t % 8 == 0 && t - writer_head <= cap as u64, "tail {t} head {writer_head}");
                        // Nothing the reader has yet to read was overwritten.
                        for p in writer_head..tail {
                            let i = (p % cap as u64) as usize;
                            assert_eq!(ring[i], before[i], "unread ring byte {i} overwritten");
                        }
                        tail = t;
                        // The writer publishes its tail, over any forged one.
                        reader_tail = t;
                        if !forged_any {
                            sent.push_back((hdr, payload.to_vec()));
                        }
                    }
                }
            }
            2 | 3 => {
                let b = s.u8();
                let budget = if b >= 128 { usize::MAX } else { b as usize % 8 };
                let (frames, after, refused) = read_ring(&ring, head, reader_tail, budget);
                assert!(frames.len() <= budget);
                let mut prev = head;
                for (hdr, payload, end) in &frames {
                    assert!(payload.start <= payload.end && payload.end <= cap, "{payload:?} outside {cap} bytes");
                    assert!(*end > prev && *end <= reader_tail, "a frame ending at {end} after {prev}");
                    let at = end - frame_len(payload.len()) as u64;
                    assert!(at >= prev, "frames overlap");
                    assert_eq!((at % cap as u64) as usize + BEFORE_PAYLOAD, payload.start);
                    let mut wire = [0u8; Header::WIRE_LEN];
                    hdr.encode(&mut wire);
                    assert_eq!(wire[..], ring[payload.start - Header::WIRE_LEN..payload.start], "header");
                    prev = *end;
                }
                assert!(after >= prev, "the head went back");
                if refused.is_none() {
                    assert!(after <= reader_tail, "the head passed the tail");
                    if frames.len() < budget {
                        assert_eq!(after, reader_tail, "frames left unread");
                    }
                } else {
                    assert!(forged_any, "the writer's own frames refused: {refused:?}");
                }
                if !forged_any {
                    for (hdr, payload, _) in &frames {
                        let (h, p) = sent.pop_front().expect("a frame was written");
                        assert_eq!((*hdr, &ring[payload.clone()]), (h, &p[..]));
                    }
                }
                head = after;
                // The reader publishes its head, over any forged one.
                writer_head = after;
            }
            4 => {
                let offset = s.u16() as usize;
                let n = s.u16() as usize % (cap + 1);
                let bytes = s.take(n);
                if cap > 0 {
                    let offset = offset % cap;
                    let len = bytes.len().min(cap - offset);
                    ring[offset..offset + len].copy_from_slice(&bytes[..len]);
                }
                forged_any = true;
            }
            5 => {
                reader_tail = forged(&mut s, head);
                forged_any = true;
            }
            6 => {
                writer_head = forged(&mut s, tail);
                forged_any = true;
            }
            _ => {
                head = forged(&mut s, reader_tail);
                forged_any = true;
            }
        }
    }
});
