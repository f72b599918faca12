//! A peer's SCIF provider record (`Record::decode`): what it accepts encodes back to the same
//! kind and numbers (the 4 bytes after the tag are padding, not read).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(again) = polyrail_scif::fuzzing::record(data) {
        assert_eq!(data.len(), again.len());
        assert_eq!(data[..4], again[..4]);
        assert_eq!(data[8..], again[8..]);
    }
});
