//! A compact packet's immediate (`decode_compact`): what it accepts fits the block and is
//! `compact_imm` of what it says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use polyrail_fuzz::Script;

fuzz_target!(|data: &[u8]| {
    let mut s = Script(data);
    let (imm, max_payload) = (s.u32(), s.u32() as usize);
    if let Ok((len, credits)) = polyrail_ib::fuzzing::decode_compact(imm, max_payload) {
        assert!(len <= max_payload && len <= 0xffff && credits <= 0xfff);
        assert_eq!(polyrail_ib::fuzzing::compact_imm(len, credits), imm);
    }
});
