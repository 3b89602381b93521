//! Property tests: decode ∘ encode = id for every message type (UPDATE under 2- and 4-octet
//! AS sessions), and decoding arbitrary or mutated bytes never panics.

mod common;

use std::net::Ipv4Addr;

use bgp_wire::*;
use common::strategies::*;
use common::*;
use proptest::prelude::*;
use proptest::sample::select;

/// A session of a confederation member: the generated paths carry confederation segments,
/// which only a member may send.
fn session(four_octet: bool) -> SessionParams {
    SessionParams {
        extended_message: true,
        confederation: true,
        ..if four_octet { as4() } else { as2() }
    }
}

/// Encode, frame, decode; the result must be the input, cleanly.
fn round_trip_update(u: &Update, s: &SessionParams) -> Result<(), TestCaseError> {
    let mut out = Vec::new();
    u.encode(s, &mut out)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(split_message(&out, s), Split::Message(out.len()));
    let Decoded::Update(d) =
        decode_message(&out, s).map_err(|e| TestCaseError::fail(e.to_string()))?
    else {
        return Err(TestCaseError::fail("not an UPDATE"));
    };
    prop_assert_eq!(&d.disposition, &Disposition::Ok);
    prop_assert!(d.discarded.is_empty(), "{:?}", d.discarded);
    prop_assert_eq!(&d.update, u);
    Ok(())
}

// ---- round trips ------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn update_round_trip_4_octet(u in update(true, false)) {
        round_trip_update(&u, &session(true))?;
    }

    #[test]
    fn update_round_trip_2_octet(u in update(false, false)) {
        round_trip_update(&u, &session(false))?;
    }

    #[test]
    fn open_round_trip(o in open()) {
        let mut out = Vec::new();
        o.encode(&mut out).unwrap();
        prop_assert_eq!(decode_message(&out, &SessionParams::default()).unwrap(), Decoded::Open(o));
    }

    #[test]
    fn notification_round_trip(code in any::<u8>(), subcode in any::<u8>(), data in prop::collection::vec(any::<u8>(), 0..300)) {
        let n = Notification::new(code, subcode, data);
        let mut out = Vec::new();
        n.encode(&mut out, MAX_MESSAGE_LEN).unwrap();
        prop_assert_eq!(decode_message(&out, &SessionParams::default()).unwrap(), Decoded::Notification(n));
    }

    #[test]
    fn shutdown_communication_round_trip(text in "\\PC{0,300}") {
        let n = Notification::shutdown(cease::ADMIN_SHUTDOWN, &text);
        let got = n.shutdown_communication().unwrap();
        prop_assert!(text.starts_with(got) && got.len() <= 255);
        prop_assert!(got.len() == text.len() || text.len() > 255);
    }

    #[test]
    fn route_refresh_round_trip(afi in any::<u16>(), safi in any::<u8>(), subtype in any::<u8>()) {
        let r = RouteRefresh::new(Family::new(Afi(afi), Safi(safi)), RefreshSubtype::from_u8(subtype));
        let mut out = Vec::new();
        r.encode(&mut out).unwrap();
        prop_assert_eq!(decode_message(&out, &SessionParams::default()).unwrap(), Decoded::RouteRefresh(r));
    }

    #[test]
    fn nlri_iterator_agrees_with_the_vector_decoder(ps in prop::collection::vec(v6_prefix(), 0..100)) {
        let mut out = Vec::new();
        encode_nlri(&ps, &mut out);
        let it: Vec<Ipv6Prefix> = NlriIter::<Ipv6Prefix>::new(&out).map(Result::unwrap).collect();
        prop_assert_eq!(&it, &ps);
        prop_assert_eq!(decode_nlri::<Ipv6Prefix>(&out).unwrap(), ps.clone());
        prop_assert_eq!(count_nlri::<Ipv6Prefix>(&out).unwrap(), ps.len());
    }

    #[test]
    fn packing_carries_every_prefix_once(ps in prop::collection::vec(v4_prefix(), 1..3000), attrs in attributes(true, false)) {
        let s = SessionParams { confederation: true, ..as4() };
        let attrs = PathAttributes { next_hop: Some(Ipv4Addr::new(10, 0, 0, 1)), ..attrs };
        let mut out = Vec::new();
        let n = bgp_wire::pack::announce_ipv4(&s, &attrs, ps.iter().copied(), &mut out);
        let Ok(n) = n else { return Ok(()) }; // attributes too large for one message
        let mut rest = &out[..];
        let mut got = Vec::new();
        for _ in 0..n {
            let Split::Message(len) = split_message(rest, &s) else { return Err(TestCaseError::fail("framing")) };
            let Decoded::Update(d) = decode_message(&rest[..len], &s).unwrap() else { unreachable!() };
            prop_assert_eq!(&d.update.attributes, &attrs);
            got.extend(d.update.nlri);
            rest = &rest[len..];
        }
        prop_assert!(rest.is_empty());
        prop_assert_eq!(got, ps);
    }
}

// ---- never panics -----------------------------------------------------------------------

fn all_sessions() -> Vec<SessionParams> {
    let mut v = Vec::new();
    for bits in 0u8..128 {
        v.push(SessionParams {
            four_octet_as: bits & 1 != 0,
            extended_message: bits & 2 != 0,
            ipv6_unicast: bits & 4 != 0,
            ipv4_ext_next_hop: bits & 8 != 0,
            external: bits & 16 != 0,
            ipv4_unicast: bits & 32 == 0,
            confederation: bits & 64 != 0,
        });
    }
    v
}

/// Decode `bytes` every way there is; only panics (failing the test) matter.
fn decode_everything(bytes: &[u8], s: &SessionParams) {
    let d = decode_update(bytes, s);
    let _ = d.update.announced().count();
    let _ = Open::decode(bytes);
    let _ = Notification::decode(bytes).map(|n| n.to_string());
    let _ = RouteRefresh::decode(&[0xFF; 19], bytes);
    let _ = split_update(bytes);
    let _ = NlriIter::<Ipv4Prefix>::new(bytes).count();
    let _ = decode_nlri::<Ipv6Prefix>(bytes);
    let mut rest = bytes;
    while let Split::Message(n) = split_message(rest, s) {
        let _ = decode_message(&rest[..n], s);
        rest = &rest[n..];
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn apply(bytes: &mut Vec<u8>, muts: &[Mutation]) {
    for m in muts {
        let len = bytes.len().max(1);
        match *m {
            Mutation::Flip(i, x) => {
                if let Some(b) = bytes.get_mut(i % len) {
                    *b ^= x;
                }
            }
            Mutation::Insert(i, x) => bytes.insert(i % (bytes.len() + 1), x),
            Mutation::Remove(i) => {
                if !bytes.is_empty() {
                    bytes.remove(i % len);
                }
            }
            Mutation::Truncate(i) => bytes.truncate(i % len),
        }
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..).prop_map(|(i, x)| Mutation::Flip(i, x)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, x)| Mutation::Insert(i, x)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), s in select(all_sessions())) {
        decode_everything(&bytes, &s);
        // The same bytes behind a valid header of each type.
        for ty in 1u8..=5 {
            let mut m = vec![0xFF; 16];
            m.extend_from_slice(&((19 + bytes.len()) as u16).to_be_bytes());
            m.push(ty);
            m.extend_from_slice(&bytes);
            decode_everything(&m, &s);
        }
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        which in 0usize..64,
        muts in prop::collection::vec(mutation(), 1..6),
        s in select(all_sessions()),
    ) {
        let msgs = sample_messages();
        let m = &msgs[which % msgs.len()];
        let mut bytes = encode(m, &s);
        apply(&mut bytes, &muts);
        decode_everything(&bytes, &s);
        // Mutate the body alone too, so the header stays valid and the decoders see it.
        let mut bytes = encode(m, &s);
        let mut b = bytes.split_off(HEADER_LEN.min(bytes.len()));
        apply(&mut b, &muts);
        decode_everything(&b, &s);
        let len = (HEADER_LEN + b.len()).min(65535) as u16;
        bytes[16..18].copy_from_slice(&len.to_be_bytes());
        bytes.extend_from_slice(&b);
        decode_everything(&bytes, &s);
    }

    #[test]
    fn random_attribute_sections_never_panic(
        attrs in prop::collection::vec((any::<u8>(), select(KNOWN_ATTRS.to_vec()), prop::collection::vec(any::<u8>(), 0..40)), 0..8),
        nlri in prop::collection::vec(any::<u8>(), 0..20),
        s in select(all_sessions()),
    ) {
        // Well-framed attributes of known types with random flags and values: reaches the
        // per-attribute decoders far more often than random bytes do.
        let mut section = Vec::new();
        for (flags, code, value) in &attrs {
            section.push(flags & !0x10);
            section.push(*code);
            section.push(value.len() as u8);
            section.extend_from_slice(value);
        }
        let mut body = vec![0, 0];
        body.extend_from_slice(&(section.len() as u16).to_be_bytes());
        body.extend_from_slice(&section);
        body.extend_from_slice(&nlri);
        let d = decode_update(&body, &s);
        // Whatever came out clean encodes again.
        if d.disposition == Disposition::Ok {
            let mut out = Vec::new();
            if d.update.encode(&s, &mut out).is_ok() && s.four_octet_as {
                let again = decode_update(&out[HEADER_LEN..], &s);
                prop_assert_eq!(again.update, d.update);
            }
        }
    }
}
