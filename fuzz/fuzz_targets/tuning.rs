//! The tuning file of the cma channel (`parse_tuning`): what it accepts, `format_tuning` writes back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail_shm::settings::{format_tuning, parse_tuning};

fuzz_target!(|data: &[u8]| {
    // The file is read as UTF-8 text of at most 64 KiB.
    let Ok(text) = std::str::from_utf8(data) else { return };
    if text.len() > 64 << 10 {
        return;
    }
    if let Ok(sizes) = parse_tuning(text) {
        let written = format_tuning("written again", &sizes);
        assert_eq!(parse_tuning(&written), Ok(sizes), "{written}");
    }
});
