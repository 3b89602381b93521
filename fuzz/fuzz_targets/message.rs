//! Framing + decoding of a byte stream, as the session task does it. The first octet picks
//! the session (bit 0: 4-octet AS, 1: extended messages, 2: IPv6, 3: RFC 8950 next hops,
//! 4: external peer, 5: IPv4 unicast not negotiated, 6: confederation segments allowed).
#![no_main]

use bgp_wire::{Decoded, Message, SessionParams, Split, decode_message, split_message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&bits, mut rest)) = data.split_first() else {
        return;
    };
    let session = SessionParams {
        four_octet_as: bits & 1 != 0,
        extended_message: bits & 2 != 0,
        ipv6_unicast: bits & 4 != 0,
        ipv4_ext_next_hop: bits & 8 != 0,
        external: bits & 16 != 0,
        ipv4_unicast: bits & 32 == 0,
        confederation: bits & 64 != 0,
    };
    loop {
        match split_message(rest, &session) {
            Split::Incomplete(n) => {
                assert!(n > 0);
                break;
            }
            Split::Error(_) => break,
            Split::Message(len) => {
                assert!((19..=65535).contains(&len) && len <= rest.len());
                let (msg, tail) = rest.split_at(len);
                if let Ok(d) = decode_message(msg, &session) {
                    // Whatever decoded must encode again (or refuse cleanly).
                    let m = match d {
                        Decoded::Open(o) => Message::Open(o),
                        Decoded::Update(u) => Message::Update(u.update),
                        Decoded::Notification(n) => Message::Notification(n),
                        Decoded::Keepalive => Message::Keepalive,
                        Decoded::RouteRefresh(r) => Message::RouteRefresh(r),
                    };
                    let mut out = Vec::new();
                    let _ = m.encode(&session, &mut out);
                }
                rest = tail;
            }
        }
    }
});
