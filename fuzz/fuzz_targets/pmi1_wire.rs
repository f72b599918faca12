//! The PMI-1 wire (`parse_v1`, `read_v1`, the server's `take_frame`): a line it accepts
//! encodes (`encode_v1`) to one that parses to the same message, and reading it from a stream
//! or a server's buffer gives the same message too.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use polyrail_pmi::wire::{parse_v1, read_v1, take_frame, Wire, MAX_V1_LINE};

fuzz_target!(|data: &[u8]| {
    let parsed = parse_v1(data);
    if let Ok(msg) = &parsed {
        let line = msg.encode_v1();
        if line.len() < MAX_V1_LINE {
            assert_eq!(parse_v1(&line).ok().as_ref(), Some(msg), "{:?}", String::from_utf8_lossy(&line));
        }
    }
    // A stream and a server's buffer read the first line.
    let first = data.iter().position(|&b| b == b'\n').map(|end| &data[..=end]);
    let from_stream = read_v1(&mut Cursor::new(data));
    if let Some(line) = first.filter(|l| l.len() <= MAX_V1_LINE) {
        assert_eq!(format!("{from_stream:?}"), format!("{:?}", parse_v1(line)));
    }
    if data.first().is_some_and(|b| !b.is_ascii_digit() && *b != b' ') {
        let mut buf = data.to_vec();
        match take_frame(&mut buf) {
            Ok(Some((wire, msg))) => {
                assert_eq!(wire, Wire::V1);
                assert_eq!(Some(msg), parse_v1(first.expect("a whole line")).ok());
            }
            Ok(None) => assert!(first.is_none()),
            Err(_) => {}
        }
    }
});
