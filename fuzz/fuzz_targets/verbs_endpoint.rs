//! A peer's verbs endpoint (`Endpoint::parse`, feature `verbs`): an endpoint it accepts
//! encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(again) = polyrail_ib::fuzzing::verbs_endpoint(data) {
        assert_eq!(again, data);
    }
});
