//! A peer's ib remote key (`DirectIb::decode_key`): what it accepts is the 20-byte layout.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail_core::RemoteKey;

fuzz_target!(|data: &[u8]| {
    let Some(key) = RemoteKey::new(data) else { return };
    if let Ok((rkey, addr, len)) = polyrail_ib::fuzzing::decode_key(3, &key) {
        assert_eq!(data.len(), 20);
        assert_eq!(rkey.to_le_bytes(), data[..4]);
        assert_eq!(addr.to_le_bytes(), data[4..12]);
        assert_eq!(len.to_le_bytes(), data[12..20]);
    }
});
