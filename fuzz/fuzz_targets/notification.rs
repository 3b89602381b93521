//! NOTIFICATION body decoding and the shutdown communication parser.
#![no_main]

use bgp_wire::{HEADER_LEN, MAX_EXTENDED_MESSAGE_LEN, Notification};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(n) = Notification::decode(data) {
        let _ = n.shutdown_communication();
        let _ = n.to_string();
        let mut out = Vec::new();
        if n.encode(&mut out, MAX_EXTENDED_MESSAGE_LEN).is_ok() {
            assert_eq!(Notification::decode(&out[HEADER_LEN..]), Ok(n));
        }
    }
});
