//! A split entry a peer sent (`SplitEntry::decode`): an entry it accepts encodes back to the
//! same bytes (but the color's, which say nothing without a color) and decodes again to the
//! same entry; a refused one is the peer's protocol error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail::Error;

fuzz_target!(|data: &[u8]| {
    match polyrail::fuzzing::split_entry(5, data) {
        Ok(again) => {
            let mut expect = data.to_vec();
            if data[0] == 0 {
                expect[1..5].fill(0);
            }
            assert_eq!(again[..], expect[..]);
            assert_eq!(polyrail::fuzzing::split_entry(5, &again).ok(), Some(again));
        }
        Err(Error::Protocol { peer: 5, .. }) => {}
        Err(e) => panic!("not a protocol error: {e:?}"),
    }
});
