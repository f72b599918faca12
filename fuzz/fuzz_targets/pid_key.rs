//! A peer's shm/cma remote key (`PidKey::decode`, then `PidKey::range` on an offset and length
//! it names): a key it accepts encodes back to the same bytes, and a range it grants lies
//! inside the key without overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail_core::RemoteKey;
use polyrail_fuzz::Script;

fuzz_target!(|data: &[u8]| {
    let mut s = Script(data);
    let (offset, len) = (s.u64() as usize, s.u64() as usize);
    let n = s.u8() as usize % (RemoteKey::MAX + 1);
    let bytes = s.take(n);
    let Some(key) = RemoteKey::new(bytes) else { return };
    if let Ok((again, range)) = polyrail_shm::fuzzing::pid_key(&key, offset, len) {
        assert_eq!(again.as_bytes(), bytes);
        if let Ok(at) = range {
            let addr = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
            let exposed = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
            let end = (offset as u64).checked_add(len as u64).expect("range overflows");
            assert!(end <= exposed);
            assert_eq!(Some(at), addr.checked_add(offset as u64));
            assert!(addr.checked_add(end).is_some());
        }
    }
});
