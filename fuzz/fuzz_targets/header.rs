//! The engine header (`Header::parse` / `Header::decode`): every packet kind a peer sends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail_core::{Error, Header};

fuzz_target!(|data: &[u8]| {
    let Some(wire) = data.get(..Header::WIRE_LEN) else { return };
    let wire: &[u8; Header::WIRE_LEN] = wire.try_into().expect("36 bytes");
    let parsed = Header::parse(wire);
    match Header::decode(7, wire) {
        Ok(h) => {
            assert_eq!(parsed, Ok(h));
            // Every byte is a field: the encoding gives the input back.
            let mut again = [0u8; Header::WIRE_LEN];
            h.encode(&mut again);
            assert_eq!(&again, wire);
            if h.is_compact(h.len as usize) {
                assert_eq!(h.envelope().header(h.len as usize), h);
                assert_eq!(Header::eager(h.ctx, h.tag, h.seq, h.len), h);
            }
            let next = h.successor(h.len);
            assert_eq!(next.seq, h.seq.wrapping_add(1));
        }
        Err(Error::Protocol { peer: 7, .. }) => assert!(parsed.is_err()),
        Err(e) => panic!("not a protocol error: {e:?}"),
    }
});
