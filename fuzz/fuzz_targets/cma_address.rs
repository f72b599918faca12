//! A peer's cma address (`CmaTransport::decode_address`): what it accepts is the 36-byte
//! layout, read field by field.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((pid, addr, magic, file)) = polyrail_shm::fuzzing::cma_address(data) {
        assert_eq!(data.len(), 36);
        assert_eq!(pid.to_le_bytes(), data[4..8]);
        assert_eq!(addr.to_le_bytes(), data[8..16]);
        assert_eq!(magic.to_le_bytes(), data[16..24]);
        match file {
            Some((fd, inode)) => {
                assert_eq!(fd.to_le_bytes(), data[24..28]);
                assert_eq!(inode.to_le_bytes(), data[28..36]);
            }
            None => assert_eq!(data[24..28], [0xff; 4]),
        }
    }
});
