//! A peer's shm segment address (`SegAddress::decode`): an address it accepts encodes back to
//! the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(again) = polyrail_shm::fuzzing::seg_address(data) {
        assert_eq!(again, data);
    }
});
