//! The PMI-2 wire (`parse_v2_len`, `parse_v2`, `read_v2`, the server's `take_frame` over a
//! buffer of several messages): a body it accepts encodes (`encode_v2`) to a message that
//! parses to the same, and a stream reads what the buffer takes.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use polyrail_pmi::wire::{parse_v2, parse_v2_len, read_v2, take_frame, V2_HEADER};

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = parse_v2(data) {
        if let Ok(framed) = msg.encode_v2() {
            assert_eq!(parse_v2_len(&framed[..V2_HEADER]).ok(), Some(framed.len() - V2_HEADER));
            assert_eq!(
                parse_v2(&framed[V2_HEADER..]).ok().as_ref(),
                Some(&msg),
                "{:?}",
                String::from_utf8_lossy(&framed)
            );
        }
    }
    // A buffer as the server fills it: messages taken off the front until one is incomplete
    // or malformed; a stream reading PMI-2 messages reads the same.
    let mut buf = data.to_vec();
    let mut stream = Cursor::new(data);
    for _ in 0..64 {
        match take_frame(&mut buf) {
            Ok(Some((wire, msg))) => {
                if wire == polyrail_pmi::wire::Wire::V2 {
                    assert_eq!(read_v2(&mut stream).ok(), Some(msg));
                } else {
                    return;
                }
            }
            Ok(None) | Err(_) => return,
        }
        assert_eq!(&data[stream.position() as usize..], &buf[..]);
    }
});
