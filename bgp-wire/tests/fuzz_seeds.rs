//! Checks that every sample message survives encode → frame → decode, and (when
//! `BGP_WIRE_SEED_DIR` is set, e.g. to `fuzz/corpus`) writes them as fuzzing seeds:
//!
//! ```text
//! BGP_WIRE_SEED_DIR=$PWD/fuzz/corpus cargo test -p bgp-wire --test fuzz_seeds
//! ```

mod common;

use std::path::Path;

use bgp_wire::*;
use common::*;

/// First octet of a `message` fuzz input: which session to decode under.
fn session_byte(s: &SessionParams) -> u8 {
    u8::from(s.four_octet_as)
        | u8::from(s.extended_message) << 1
        | u8::from(s.ipv6_unicast) << 2
        | u8::from(s.ipv4_ext_next_hop) << 3
        | u8::from(s.external) << 4
}

fn write(dir: Option<&Path>, target: &str, name: &str, bytes: &[u8]) {
    if let Some(d) = dir {
        let d = d.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("seed-{name}")), bytes).unwrap();
    }
}

#[test]
fn samples_round_trip_and_become_seeds() {
    let dir = std::env::var_os("BGP_WIRE_SEED_DIR").map(std::path::PathBuf::from);
    let dir = dir.as_deref();
    let mut checked = 0;
    for (sname, s) in [("as2", as2()), ("as4", as4())] {
        let mut stream = vec![session_byte(&s)];
        for (i, m) in sample_messages().iter().enumerate() {
            let bytes = encode(m, &s);
            assert_eq!(split_message(&bytes, &s), Split::Message(bytes.len()));
            let decoded = decode_message(&bytes, &s).unwrap();
            match (m, &decoded) {
                (Message::Update(u), Decoded::Update(d)) => {
                    assert_eq!(&d.update, u, "{sname} sample {i}");
                    assert!(
                        d.disposition.is_ok() && d.discarded.is_empty(),
                        "{sname} sample {i}: {d:?}"
                    );
                    write(
                        dir,
                        &format!("update_{sname}"),
                        &i.to_string(),
                        body(&bytes),
                    );
                }
                (Message::Open(o), Decoded::Open(d)) => {
                    assert_eq!(o, d);
                    write(dir, "open", sname, body(&bytes));
                }
                (Message::Notification(n), Decoded::Notification(d)) => {
                    assert_eq!(n, d);
                    write(dir, "notification", &format!("{sname}-{i}"), body(&bytes));
                }
                (Message::RouteRefresh(r), Decoded::RouteRefresh(d)) => {
                    assert_eq!(r, d);
                    write(dir, "route_refresh", &format!("{sname}-{i}"), body(&bytes));
                }
                (Message::Keepalive, Decoded::Keepalive) => {}
                other => panic!("{sname} sample {i}: {other:?}"),
            }
            let mut one = vec![session_byte(&s)];
            one.extend_from_slice(&bytes);
            write(dir, "message", &format!("{sname}-{i}"), &one);
            stream.extend_from_slice(&bytes);
            checked += 1;
        }
        write(dir, "message", &format!("{sname}-stream"), &stream);
    }
    assert_eq!(checked, 2 * sample_messages().len());
}
