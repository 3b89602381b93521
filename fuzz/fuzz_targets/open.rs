//! OPEN body decoding; whatever decodes must re-encode to something that decodes the same.
#![no_main]

use bgp_wire::{HEADER_LEN, Open};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(open) = Open::decode(data) {
        let mut out = Vec::new();
        if open.encode(&mut out).is_ok() {
            assert_eq!(Open::decode(&out[HEADER_LEN..]).as_ref(), Ok(&open));
        }
    }
});
