//! A peer's ib address (`parse_address`): no input makes it panic or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = polyrail_ib::fuzzing::parse_address(data);
});
