//! Malformed input: every case of anchors.md §B.4 (the ones that broke zettabgp) and the
//! RFC 7606 dispositions, each checked for the exact error / disposition, never a panic.
//!
//! Why this file is long: one case per malformation of anchors.md §B.4 and per RFC 7606
//! disposition, each a few lines; together they are the codec's contract for bad input.

mod common;

use bgp_wire::*;
use common::*;

const ORIGIN_IGP: [u8; 4] = [0x40, 1, 1, 0];
const EMPTY_AS_PATH: [u8; 3] = [0x40, 2, 0];
const NEXT_HOP: [u8; 7] = [0x40, 3, 4, 192, 0, 2, 1];
/// 10.0.0.0/24
const NLRI: [u8; 4] = [24, 10, 0, 0];

fn attr(flags: u8, code: u8, value: &[u8]) -> Vec<u8> {
    let mut v = vec![flags, code];
    if flags & 0x10 != 0 {
        v.extend_from_slice(&(value.len() as u16).to_be_bytes());
    } else {
        v.push(value.len() as u8);
    }
    v.extend_from_slice(value);
    v
}

fn body(withdrawn: &[u8], attrs: &[u8], nlri: &[u8]) -> Vec<u8> {
    let mut b = (withdrawn.len() as u16).to_be_bytes().to_vec();
    b.extend_from_slice(withdrawn);
    b.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    b.extend_from_slice(attrs);
    b.extend_from_slice(nlri);
    b
}

/// ORIGIN, empty AS_PATH, NEXT_HOP, then `extra`.
fn with_mandatory(extra: &[u8]) -> Vec<u8> {
    [&ORIGIN_IGP[..], &EMPTY_AS_PATH, &NEXT_HOP, extra].concat()
}

fn decode(attrs: &[u8], s: &SessionParams) -> UpdateDecode {
    decode_update(&body(&[], attrs, &NLRI), s)
}

fn reasons(d: &UpdateDecode) -> Vec<(u8, ErrorKind)> {
    let Disposition::TreatAsWithdraw(r) = &d.disposition else {
        panic!("expected treat-as-withdraw, got {d:?}")
    };
    r.iter()
        .map(|p| match &p.kind {
            ProblemKind::Malformed(e) => (p.type_code, e.kind),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

fn reset(d: &UpdateDecode) -> &DecodeError {
    let Disposition::SessionReset(e) = &d.disposition else {
        panic!("expected session reset, got {d:?}")
    };
    e
}

fn discarded(d: &UpdateDecode) -> Vec<(u8, &ProblemKind)> {
    d.discarded.iter().map(|p| (p.type_code, &p.kind)).collect()
}

fn discarded_kinds(d: &UpdateDecode) -> Vec<(u8, ErrorKind)> {
    d.discarded
        .iter()
        .map(|p| match &p.kind {
            ProblemKind::Malformed(e) => (p.type_code, e.kind),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

#[test]
fn baseline_is_ok() {
    let d = decode(&with_mandatory(&[]), &as4());
    assert_eq!(d.disposition, Disposition::Ok);
    assert_eq!(d.update.nlri, [v4("10.0.0.0/24")]);
    assert_eq!(d.update.attributes.origin, Some(Origin::Igp));
}

// ---- anchors.md §B.4 --------------------------------------------------------------------

#[test]
fn as_path_of_length_3_is_treat_as_withdraw() {
    let a = [&ORIGIN_IGP[..], &attr(0x40, 2, &[2, 1, 0]), &NEXT_HOP].concat();
    for s in [as2(), as4()] {
        let d = decode(&a, &s);
        assert_eq!(reasons(&d), [(2, ErrorKind::MalformedAsPath)]);
        assert_eq!(
            d.update.nlri,
            [v4("10.0.0.0/24")],
            "the routes to withdraw are known"
        );
    }
}

#[test]
fn as_path_with_a_trailing_byte_after_a_valid_segment() {
    let a = [
        &ORIGIN_IGP[..],
        &attr(0x40, 2, &[2, 1, 0xFD, 0xE9, 2]),
        &NEXT_HOP,
    ]
    .concat();
    let d = decode(&a, &as2());
    assert_eq!(reasons(&d), [(2, ErrorKind::MalformedAsPath)]);
    let a = [
        &ORIGIN_IGP[..],
        &attr(0x40, 2, &[2, 1, 0, 0, 0xFD, 0xE9, 2]),
        &NEXT_HOP,
    ]
    .concat();
    assert_eq!(
        reasons(&decode(&a, &as4())),
        [(2, ErrorKind::MalformedAsPath)]
    );
}

#[test]
fn truncated_mp_reach_is_a_session_reset() {
    let a = with_mandatory(&attr(0x80, 14, &[0, 2]));
    let e = reset(&decode(&a, &as4())).clone();
    assert_eq!((e.kind.code(), e.kind.subcode()), (3, 9));
    assert_eq!(
        e.data,
        [0x80, 14, 2, 0, 2],
        "data is the erroneous attribute"
    );
}

#[test]
fn mp_reach_next_hop_longer_than_the_attribute_is_a_session_reset() {
    let a = with_mandatory(&attr(0x80, 14, &[0, 2, 1, 32, 0x20, 0x01, 0x0d, 0xb8]));
    assert_eq!(
        reset(&decode(&a, &as4())).kind,
        ErrorKind::OptionalAttribute
    );
}

#[test]
fn attribute_header_truncated_after_the_flags_byte() {
    // One byte left in the attribute section: less than a header (RFC 7606 §4).
    let a = with_mandatory(&[0x40]);
    assert_eq!(
        reasons(&decode(&a, &as4())),
        [(0, ErrorKind::MalformedAttributeList)]
    );
    // Two bytes, and a header with the extended length bit and only three bytes.
    assert_eq!(
        reasons(&decode(&with_mandatory(&[0x40, 5]), &as4())),
        [(5, ErrorKind::MalformedAttributeList)]
    );
    assert_eq!(
        reasons(&decode(&with_mandatory(&[0x50, 5, 0]), &as4())),
        [(5, ErrorKind::MalformedAttributeList)]
    );
    // A section holding nothing but a flags byte, with no routes: withdraws nothing.
    let d = decode_update(&body(&[], &[0xC0], &[]), &as4());
    assert_eq!(reasons(&d), [(0, ErrorKind::MalformedAttributeList)]);
}

#[test]
fn communities_of_length_3_is_treat_as_withdraw() {
    let a = with_mandatory(&attr(0xC0, 8, &[0, 1, 2]));
    let d = decode(&a, &as4());
    assert_eq!(reasons(&d), [(8, ErrorKind::AttributeLength)]);
    let Disposition::TreatAsWithdraw(r) = &d.disposition else {
        unreachable!()
    };
    let ProblemKind::Malformed(e) = &r[0].kind else {
        unreachable!()
    };
    assert_eq!(e.data, [0xC0, 8, 3, 0, 1, 2]);
    // An empty COMMUNITIES is malformed too (RFC 7606 §7.8: a non-zero multiple of 4).
    assert_eq!(
        reasons(&decode(&with_mandatory(&attr(0xC0, 8, &[])), &as4())),
        [(8, ErrorKind::AttributeLength)]
    );
}

#[test]
fn header_length_below_19() {
    for len in [0u16, 18] {
        let mut m = vec![0xFF; 16];
        m.extend_from_slice(&len.to_be_bytes());
        m.push(2);
        m.extend_from_slice(&[0; 10]);
        let Split::Error(e) = split_message(&m, &as4()) else {
            panic!()
        };
        assert_eq!(
            (e.kind.code(), e.kind.subcode(), e.data.as_slice()),
            (1, 2, &len.to_be_bytes()[..])
        );
        assert_eq!(
            decode_message(&m, &as4()).unwrap_err().kind,
            ErrorKind::BadMessageLength
        );
    }
}

#[test]
fn nlri_prefix_length_33_or_more_is_a_session_reset() {
    for bad in [33u8, 64, 248, 249, 255] {
        let d = decode_update(
            &body(&[], &with_mandatory(&[]), &[bad, 10, 0, 0, 1, 2]),
            &as4(),
        );
        let e = reset(&d);
        assert_eq!(
            (e.kind.code(), e.kind.subcode()),
            (3, 10),
            "prefix length {bad}"
        );
        // In the withdrawn routes field too.
        let d = decode_update(&body(&[bad, 1, 2, 3, 4, 5], &[], &[]), &as4());
        assert_eq!(reset(&d).kind, ErrorKind::InvalidNetworkField);
    }
    // A truncated prefix at the end of the NLRI field.
    assert_eq!(
        reset(&decode_update(
            &body(&[], &with_mandatory(&[]), &[24, 10]),
            &as4()
        ))
        .kind,
        ErrorKind::InvalidNetworkField
    );
}

// ---- RFC 7606 ---------------------------------------------------------------------------

#[test]
fn section_lengths_running_past_the_message_reset() {
    // Withdrawn routes length beyond the body.
    let d = decode_update(&[0, 9, 24, 10, 0, 0, 0, 0], &as4());
    assert_eq!(reset(&d).kind, ErrorKind::MalformedAttributeList);
    // Total path attribute length beyond the body (NLRI cannot be located).
    let d = decode_update(&[0, 0, 0, 50, 0x40, 1, 1, 0], &as4());
    assert_eq!(reset(&d).kind, ErrorKind::MalformedAttributeList);
    // Fewer than 4 octets at all.
    assert_eq!(
        reset(&decode_update(&[0, 0, 0], &as4())).kind,
        ErrorKind::MalformedAttributeList
    );
    assert_eq!(
        reset(&decode_update(&[], &as4())).kind,
        ErrorKind::MalformedAttributeList
    );
}

#[test]
fn last_attribute_overrunning_the_section() {
    // A COMMUNITIES claiming 8 octets with 4 left: treat-as-withdraw, NLRI still located.
    let mut a = with_mandatory(&[]);
    a.extend_from_slice(&[0xC0, 8, 8, 0, 0, 0, 1]);
    let d = decode(&a, &as4());
    assert_eq!(reasons(&d), [(8, ErrorKind::AttributeLength)]);
    assert_eq!(d.update.nlri.len(), 1);
    // The same for MP_REACH_NLRI: its own NLRI is lost, so the session is reset.
    let mut a = with_mandatory(&[]);
    a.extend_from_slice(&[0x90, 14, 0, 40, 0, 2, 1]);
    assert_eq!(reset(&decode(&a, &as4())).kind, ErrorKind::AttributeLength);
}

#[test]
fn duplicates_discard_all_but_the_first() {
    let a = with_mandatory(
        &[
            attr(0x40, 1, &[2]),
            attr(0xC0, 8, &[0, 0, 0, 1]),
            attr(0xC0, 8, &[0, 0, 0, 2]),
        ]
        .concat(),
    );
    let d = decode(&a, &as4());
    assert_eq!(d.disposition, Disposition::Ok);
    assert_eq!(
        d.update.attributes.origin,
        Some(Origin::Igp),
        "the first ORIGIN stands"
    );
    assert_eq!(d.update.attributes.communities, [Community(1)]);
    assert_eq!(
        discarded(&d),
        [(1, &ProblemKind::Duplicate), (8, &ProblemKind::Duplicate)]
    );
    // Even a malformed duplicate is only discarded.
    let a = with_mandatory(&attr(0x40, 3, &[1]));
    assert_eq!(decode(&a, &as4()).disposition, Disposition::Ok);
}

#[test]
fn duplicate_mp_attributes_reset_the_session() {
    let unreach = attr(0x80, 15, &[0, 2, 1]);
    let a = with_mandatory(&[unreach.clone(), unreach].concat());
    let e = reset(&decode(&a, &as4())).clone();
    assert_eq!((e.kind.code(), e.kind.subcode()), (3, 1));
    let reach = attr(
        0x80,
        14,
        &[
            0, 2, 1, 16, 0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0,
        ],
    );
    let a = [&ORIGIN_IGP[..], &EMPTY_AS_PATH, &reach, &reach].concat();
    assert_eq!(
        reset(&decode_update(&body(&[], &a, &[]), &as4())).kind,
        ErrorKind::MalformedAttributeList
    );
}

#[test]
fn missing_well_known_attributes_are_treat_as_withdraw() {
    let d = decode(&[&EMPTY_AS_PATH[..], &NEXT_HOP].concat(), &as4());
    let Disposition::TreatAsWithdraw(r) = &d.disposition else {
        panic!()
    };
    let ProblemKind::Malformed(e) = &r[0].kind else {
        panic!()
    };
    assert_eq!(
        (e.kind.code(), e.kind.subcode(), e.data.as_slice()),
        (3, 3, &[1u8][..])
    );
    assert_eq!(
        reasons(&decode(&[&ORIGIN_IGP[..], &NEXT_HOP].concat(), &as4())),
        [(2, ErrorKind::MissingWellKnownAttribute)]
    );
    assert_eq!(
        reasons(&decode(&[&ORIGIN_IGP[..], &EMPTY_AS_PATH].concat(), &as4())),
        [(3, ErrorKind::MissingWellKnownAttribute)]
    );
    // No routes announced: nothing is mandatory.
    assert_eq!(
        decode_update(&body(&NLRI, &[], &[]), &as4()).disposition,
        Disposition::Ok
    );
    // Routes only in MP_REACH_NLRI: NEXT_HOP is not needed, ORIGIN and AS_PATH are.
    let reach = attr(
        0x80,
        14,
        &[
            0, 2, 1, 16, 0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 32, 0x20, 1,
            0xd, 0xb8,
        ],
    );
    let ok = [&reach[..], &ORIGIN_IGP, &EMPTY_AS_PATH].concat();
    assert_eq!(
        decode_update(&body(&[], &ok, &[]), &as4()).disposition,
        Disposition::Ok
    );
    let d = decode_update(&body(&[], &[&reach[..], &ORIGIN_IGP].concat(), &[]), &as4());
    assert_eq!(reasons(&d), [(2, ErrorKind::MissingWellKnownAttribute)]);
    assert_eq!(d.update.announced().count(), 1);
}

#[test]
fn attribute_flags_conflicts() {
    // ORIGIN marked optional: treat-as-withdraw with an attribute flags error.
    let a = [&attr(0xC0, 1, &[0])[..], &EMPTY_AS_PATH, &NEXT_HOP].concat();
    let d = decode(&a, &as4());
    let Disposition::TreatAsWithdraw(r) = &d.disposition else {
        panic!()
    };
    let ProblemKind::Malformed(e) = &r[0].kind else {
        panic!()
    };
    assert_eq!((e.kind.code(), e.kind.subcode()), (3, 4));
    assert_eq!(e.data, [0xC0, 1, 1, 0]);
    // MED marked transitive: treat-as-withdraw.
    assert_eq!(
        reasons(&decode(
            &with_mandatory(&attr(0xC0, 4, &[0, 0, 0, 1])),
            &as4()
        )),
        [(4, ErrorKind::AttributeFlags)]
    );
    // AGGREGATOR marked well-known: its malformations are attribute discard (RFC 7606 §7.7).
    let d = decode(
        &with_mandatory(&attr(0x40, 7, &[0, 0, 0xFD, 0xE9, 1, 2, 3, 4])),
        &as4(),
    );
    assert_eq!(d.disposition, Disposition::Ok);
    assert_eq!(discarded_kinds(&d), [(7, ErrorKind::AttributeFlags)]);
    // The Partial and Extended Length bits do not matter.
    let d = decode(&with_mandatory(&attr(0xF0, 8, &[0, 0, 0, 7])), &as4());
    assert_eq!(
        (d.disposition, d.update.attributes.communities),
        (Disposition::Ok, vec![Community(7)])
    );
    // MP_UNREACH_NLRI marked transitive: still parsed (so its routes are known), withdrawn.
    let d = decode_update(
        &body(
            &[],
            &attr(0xC0, 15, &[0, 2, 1, 32, 0x20, 1, 0xd, 0xb8]),
            &[],
        ),
        &as4(),
    );
    assert_eq!(reasons(&d), [(15, ErrorKind::AttributeFlags)]);
    assert_eq!(d.update.withdrawn_routes().count(), 1);
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "walks RFC 7606 section 7 in order, one disposition per attribute subsection; splitting would lose the section-by-section reading"
)]
fn per_attribute_dispositions_of_rfc_7606_section_7() {
    let twa = |extra: &[u8], code: u8, kind: ErrorKind, s: &SessionParams| {
        let d = decode(&with_mandatory(extra), s);
        assert_eq!(reasons(&d), [(code, kind)], "attribute {code}");
    };
    let discard = |extra: &[u8], code: u8, kind: ErrorKind, s: &SessionParams| {
        let d = decode(&with_mandatory(extra), s);
        assert_eq!(d.disposition, Disposition::Ok, "attribute {code}");
        assert_eq!(discarded_kinds(&d), [(code, kind)], "attribute {code}");
    };
    let s = as4();
    // §7.1 ORIGIN: wrong length or undefined value.
    let a = [&attr(0x40, 1, &[0, 0])[..], &EMPTY_AS_PATH, &NEXT_HOP].concat();
    assert_eq!(reasons(&decode(&a, &s)), [(1, ErrorKind::AttributeLength)]);
    let a = [&attr(0x40, 1, &[3])[..], &EMPTY_AS_PATH, &NEXT_HOP].concat();
    assert_eq!(reasons(&decode(&a, &s)), [(1, ErrorKind::InvalidOrigin)]);
    // §7.2 AS_PATH: unknown segment type, empty segment.
    let a = [
        &ORIGIN_IGP[..],
        &attr(0x40, 2, &[7, 1, 0, 0, 0, 1]),
        &NEXT_HOP,
    ]
    .concat();
    assert_eq!(reasons(&decode(&a, &s)), [(2, ErrorKind::MalformedAsPath)]);
    let a = [&ORIGIN_IGP[..], &attr(0x40, 2, &[2, 0]), &NEXT_HOP].concat();
    assert_eq!(reasons(&decode(&a, &s)), [(2, ErrorKind::MalformedAsPath)]);
    // §7.3 NEXT_HOP: wrong length; not a host address.
    let a = [
        &ORIGIN_IGP[..],
        &EMPTY_AS_PATH,
        &attr(0x40, 3, &[1, 2, 3, 4, 5]),
    ]
    .concat();
    assert_eq!(reasons(&decode(&a, &s)), [(3, ErrorKind::AttributeLength)]);
    for nh in [[0, 0, 0, 0], [224, 0, 0, 5], [255, 255, 255, 255]] {
        let a = [&ORIGIN_IGP[..], &EMPTY_AS_PATH, &attr(0x40, 3, &nh)].concat();
        let d = decode(&a, &s);
        let Disposition::TreatAsWithdraw(r) = &d.disposition else {
            panic!()
        };
        let ProblemKind::Malformed(e) = &r[0].kind else {
            panic!()
        };
        assert_eq!((e.kind.code(), e.kind.subcode()), (3, 8));
    }
    // §7.4 MED, §7.5 LOCAL_PREF, §7.9 ORIGINATOR_ID, §7.10 CLUSTER_LIST, §7.14 extended
    // communities, RFC 8092 large communities: treat-as-withdraw.
    twa(
        &attr(0x80, 4, &[0, 0, 1]),
        4,
        ErrorKind::AttributeLength,
        &s,
    );
    twa(
        &attr(0x40, 5, &[0, 0, 0, 0, 1]),
        5,
        ErrorKind::AttributeLength,
        &s,
    );
    twa(
        &attr(0x80, 9, &[1, 2, 3]),
        9,
        ErrorKind::AttributeLength,
        &s,
    );
    twa(
        &attr(0x80, 10, &[1, 2, 3, 4, 5, 6]),
        10,
        ErrorKind::AttributeLength,
        &s,
    );
    twa(&attr(0x80, 10, &[]), 10, ErrorKind::AttributeLength, &s);
    twa(&attr(0xC0, 16, &[0; 7]), 16, ErrorKind::AttributeLength, &s);
    twa(
        &attr(0xC0, 32, &[0; 11]),
        32,
        ErrorKind::AttributeLength,
        &s,
    );
    twa(&attr(0xC0, 32, &[]), 32, ErrorKind::AttributeLength, &s);
    // §7.6 ATOMIC_AGGREGATE, §7.7 AGGREGATOR: attribute discard.
    discard(&attr(0x40, 6, &[1]), 6, ErrorKind::AttributeLength, &s);
    discard(
        &attr(0xC0, 7, &[0, 1, 1, 2, 3, 4]),
        7,
        ErrorKind::AttributeLength,
        &s,
    ); // 6 on a 4-octet session
    discard(
        &attr(0xC0, 7, &[0, 0, 0, 1, 1, 2, 3, 4]),
        7,
        ErrorKind::AttributeLength,
        &as2(),
    ); // 8 on a 2-octet one
    // RFC 6793 §6 (via 7606): AS4_PATH / AS4_AGGREGATOR malformed: attribute discard.
    discard(
        &attr(0xC0, 17, &[2, 1, 0, 0]),
        17,
        ErrorKind::MalformedAsPath,
        &as2(),
    );
    discard(
        &attr(0xC0, 17, &[3, 1, 0, 0, 0, 1]),
        17,
        ErrorKind::MalformedAsPath,
        &as2(),
    );
    discard(
        &attr(0xC0, 18, &[0, 1, 1, 2, 3, 4]),
        18,
        ErrorKind::AttributeLength,
        &as2(),
    );
}

#[test]
fn strongest_disposition_wins_and_discards_are_still_reported() {
    let a = with_mandatory(&[attr(0x40, 6, &[1]), attr(0x80, 4, &[0])].concat());
    let d = decode(&a, &as4());
    assert_eq!(reasons(&d), [(4, ErrorKind::AttributeLength)]);
    assert_eq!(discarded_kinds(&d), [(6, ErrorKind::AttributeLength)]);
    // A session reset beats everything.
    let a = with_mandatory(&[attr(0x80, 4, &[0]), attr(0x80, 14, &[0])].concat());
    assert_eq!(
        reset(&decode(&a, &as4())).kind,
        ErrorKind::OptionalAttribute
    );
}

#[test]
fn attributes_not_accepted_from_external_peers() {
    let ebgp = SessionParams {
        external: true,
        ..as4()
    };
    let extra = [
        attr(0x40, 5, &[0, 0, 0, 100]),
        attr(0x80, 9, &[1, 2, 3, 4]),
        attr(0x80, 10, &[1, 2, 3]),
    ]
    .concat();
    let d = decode(&with_mandatory(&extra), &ebgp);
    assert_eq!(
        d.disposition,
        Disposition::Ok,
        "discarded whatever their shape"
    );
    let kinds: Vec<_> = discarded(&d);
    assert_eq!(
        kinds,
        [
            (5, &ProblemKind::NotAllowedFromExternal),
            (9, &ProblemKind::NotAllowedFromExternal),
            (10, &ProblemKind::NotAllowedFromExternal)
        ]
    );
    assert_eq!(d.update.attributes.local_pref, None);
    // Confederation segments from a peer outside our confederation (external or internal)
    // make AS_PATH malformed; only a member of our confederation may send them.
    let a = [
        &ORIGIN_IGP[..],
        &attr(0x40, 2, &[3, 1, 0, 0, 0xFD, 0xEA]),
        &NEXT_HOP,
    ]
    .concat();
    assert_eq!(
        reasons(&decode(&a, &ebgp)),
        [(2, ErrorKind::MalformedAsPath)]
    );
    assert_eq!(
        reasons(&decode(&a, &as4())),
        [(2, ErrorKind::MalformedAsPath)]
    );
    let member = SessionParams {
        confederation: true,
        ..as4()
    };
    assert_eq!(decode(&a, &member).disposition, Disposition::Ok);
}

#[test]
fn unknown_attributes() {
    // Optional transitive: kept, with the Partial bit set for passing on.
    let d = decode(&with_mandatory(&attr(0xC0, 99, &[1, 2, 3])), &as4());
    assert_eq!(d.disposition, Disposition::Ok);
    assert_eq!(
        d.update.attributes.unknown,
        [RawAttribute {
            flags: 0xE0,
            type_code: 99,
            value: vec![1, 2, 3]
        }]
    );
    // Optional non-transitive: dropped, and reported.
    let d = decode(&with_mandatory(&attr(0x80, 99, &[1])), &as4());
    assert_eq!(d.disposition, Disposition::Ok);
    assert!(d.update.attributes.unknown.is_empty());
    assert_eq!(
        discarded(&d),
        [(99, &ProblemKind::UnrecognizedNonTransitive)]
    );
    // Well-known but unrecognised: RFC 4271 §6.3 session reset, data = the attribute.
    let e = reset(&decode(&with_mandatory(&attr(0x40, 99, &[1])), &as4())).clone();
    assert_eq!(
        (e.kind.code(), e.kind.subcode(), e.data),
        (3, 2, vec![0x40, 99, 1, 1])
    );
}

#[test]
fn as4_attributes() {
    // From a 4-octet speaker AS4_PATH is discarded (RFC 6793 §4.1).
    let d = decode(
        &with_mandatory(&attr(0xC0, 17, &[2, 1, 0, 0, 0, 1])),
        &as4(),
    );
    assert_eq!(d.disposition, Disposition::Ok);
    assert_eq!(discarded(&d), [(17, &ProblemKind::As4FromNewSpeaker)]);
    // AGGREGATOR not AS_TRANS plus AS4_AGGREGATOR: both AS4 attributes are ignored.
    let a = [
        &ORIGIN_IGP[..],
        &attr(0x40, 2, &[2, 1, 0x5B, 0xA0]),
        &NEXT_HOP,
        &attr(0xC0, 7, &[0, 5, 1, 2, 3, 4]),
        &attr(0xC0, 17, &[2, 1, 0xFA, 0x56, 0xEA, 0x00]),
        &attr(0xC0, 18, &[0xFA, 0x56, 0xEA, 0x01, 1, 2, 3, 4]),
    ]
    .concat();
    let d = decode(&a, &as2());
    assert_eq!(
        d.update.attributes.as_path,
        Some(AsPath::from_sequence([Asn::TRANS]))
    );
    assert_eq!(d.update.attributes.aggregator.unwrap().asn, Asn(5));
    assert_eq!(
        discarded(&d),
        [
            (18, &ProblemKind::As4Ignored),
            (17, &ProblemKind::As4Ignored)
        ]
    );
    // With AGGREGATOR = AS_TRANS both are merged.
    let a = [
        &ORIGIN_IGP[..],
        &attr(0x40, 2, &[2, 2, 0xFD, 0xE9, 0x5B, 0xA0]),
        &NEXT_HOP,
        &attr(0xC0, 7, &[0x5B, 0xA0, 1, 2, 3, 4]),
        &attr(0xC0, 17, &[2, 1, 0xFA, 0x56, 0xEA, 0x00]),
        &attr(0xC0, 18, &[0xFA, 0x56, 0xEA, 0x01, 1, 2, 3, 4]),
    ]
    .concat();
    let d = decode(&a, &as2());
    assert_eq!(d.disposition, Disposition::Ok);
    assert!(d.discarded.is_empty());
    assert_eq!(
        d.update.attributes.as_path,
        Some(AsPath::from_sequence([Asn(65001), Asn(4_200_000_000)]))
    );
    assert_eq!(
        d.update.attributes.aggregator.unwrap().asn,
        Asn(4_200_000_001)
    );
}

#[test]
fn mp_reach_details() {
    // IPv4 routes with an IPv6 next hop, without the RFC 8950 capability: withdrawn.
    let reach = attr(
        0x80,
        14,
        &[
            0, 1, 1, 16, 0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 24, 10, 9, 9,
        ],
    );
    let a = [&reach[..], &ORIGIN_IGP, &EMPTY_AS_PATH].concat();
    let no_ext = SessionParams {
        ipv4_ext_next_hop: false,
        ..as4()
    };
    assert_eq!(
        reasons(&decode_update(&body(&[], &a, &[]), &no_ext)),
        [(14, ErrorKind::InvalidNextHop)]
    );
    assert_eq!(
        decode_update(&body(&[], &a, &[]), &as4()).disposition,
        Disposition::Ok
    );
    // A family that was not negotiated: discarded, the rest stands.
    let v4_only = SessionParams {
        ipv6_unicast: false,
        ..as4()
    };
    let reach6 = attr(
        0x80,
        14,
        &[
            0, 2, 1, 16, 0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 32, 0x20, 1,
            0xd, 0xb8,
        ],
    );
    let d = decode(&with_mandatory(&reach6), &v4_only);
    assert_eq!(d.disposition, Disposition::Ok);
    assert_eq!(
        discarded(&d),
        [(14, &ProblemKind::UnnegotiatedFamily(Family::IPV6_UNICAST))]
    );
    assert_eq!(d.update.nlri.len(), 1);
    // An IPv6 next hop of 24 octets: no family has that, and the NLRI cannot be trusted.
    let mut v = vec![0, 2, 1, 24];
    v.extend_from_slice(&[0x20; 24]);
    v.push(0);
    assert_eq!(
        reset(&decode(&with_mandatory(&attr(0x80, 14, &v)), &as4())).kind,
        ErrorKind::OptionalAttribute
    );
    // A bad prefix inside MP_UNREACH_NLRI.
    assert_eq!(
        reset(&decode(
            &with_mandatory(&attr(0x80, 15, &[0, 2, 1, 129])),
            &as4()
        ))
        .kind,
        ErrorKind::InvalidNetworkField
    );
}

#[test]
fn end_of_rib_detection() {
    let s = as4();
    assert_eq!(
        decode_update(&[0, 0, 0, 0], &s).end_of_rib,
        Some(Family::IPV4_UNICAST)
    );
    assert_eq!(
        decode_update(&body(&[], &attr(0x80, 15, &[0, 2, 1]), &[]), &s).end_of_rib,
        Some(Family::IPV6_UNICAST)
    );
    // Extended-length form (as GoBGP sends it), and a family we do not carry (EVPN).
    let d = decode_update(&body(&[], &attr(0x90, 15, &[0, 25, 70]), &[]), &s);
    assert_eq!(d.end_of_rib, Some(Family::new(Afi(25), Safi(70))));
    assert_eq!(d.disposition, Disposition::Ok);
    // Not End-of-RIB: withdrawals, other attributes.
    assert_eq!(decode_update(&body(&NLRI, &[], &[]), &s).end_of_rib, None);
    assert_eq!(
        decode_update(&body(&[], &with_mandatory(&[]), &[]), &s).end_of_rib,
        None
    );
    assert_eq!(
        decode_update(&body(&[], &attr(0x80, 15, &[0, 2, 1, 0]), &[]), &s).end_of_rib,
        None
    );
    // The typed check agrees, and the constructor encodes what the decoder detects.
    for f in [Family::IPV4_UNICAST, Family::IPV6_UNICAST] {
        let u = Update::end_of_rib(f).unwrap();
        assert_eq!(u.is_end_of_rib(), Some(f));
        let mut out = Vec::new();
        u.encode(&s, &mut out).unwrap();
        assert_eq!(decode_update(&out[HEADER_LEN..], &s).end_of_rib, Some(f));
    }
    assert!(Update::end_of_rib(Family::new(Afi(25), Safi(70))).is_none());
}

#[test]
fn other_message_types() {
    let msg = |ty: u8, body: &[u8]| {
        let mut m = vec![0xFF; 16];
        m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
        m.push(ty);
        m.extend_from_slice(body);
        m
    };
    // KEEPALIVE with a body.
    assert_eq!(
        decode_message(&msg(4, &[0]), &as4()).unwrap_err().kind,
        ErrorKind::BadMessageLength
    );
    // OPEN of 28 octets.
    assert_eq!(
        decode_message(&msg(1, &[4; 9]), &as4()).unwrap_err().kind,
        ErrorKind::BadMessageLength
    );
    // NOTIFICATION with one octet of body.
    assert_eq!(
        decode_message(&msg(3, &[6]), &as4()).unwrap_err().kind,
        ErrorKind::BadMessageLength
    );
    // Type 7.
    let e = decode_message(&msg(7, &[]), &as4()).unwrap_err();
    assert_eq!(
        (e.kind.code(), e.kind.subcode(), e.data.as_slice()),
        (1, 3, &[7u8][..])
    );
    // A wrong marker.
    let mut m = msg(4, &[]);
    m[3] = 0;
    assert_eq!(
        decode_message(&m, &as4()).unwrap_err().kind,
        ErrorKind::ConnectionNotSynchronized
    );
    // A buffer holding more than one message.
    let mut m = msg(4, &[]);
    m.push(0xFF);
    assert_eq!(
        decode_message(&m, &as4()).unwrap_err().kind,
        ErrorKind::BadMessageLength
    );
    // UPDATE session resets come back as errors from decode_message.
    let e = decode_message(&msg(2, &[0, 0, 0, 0, 33]), &as4()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidNetworkField);
    // ...and lesser problems as a disposition.
    let Decoded::Update(d) = decode_message(&msg(2, &body(&[], &[], &NLRI)), &as4()).unwrap()
    else {
        panic!()
    };
    assert!(matches!(d.disposition, Disposition::TreatAsWithdraw(_)));
}

#[test]
fn nothing_hangs_on_pathological_sizes() {
    // 16,000 zero-length unknown attributes (all duplicates but the first), and a
    // 65,000-octet AS_PATH of maximal segments: linear time, no panic.
    let mut a = with_mandatory(&[]);
    for _ in 0..16_000 {
        a.extend_from_slice(&[0xC0, 200, 0]);
    }
    let s = SessionParams {
        extended_message: true,
        ..as4()
    };
    let d = decode(&a, &s);
    assert_eq!(d.discarded.len(), 15_999);
    let mut path = Vec::new();
    while path.len() + 2 + 255 * 4 <= 65_535 {
        path.extend_from_slice(&[2, 255]);
        path.extend(std::iter::repeat_n([0u8, 0, 0xFD, 0xE9], 255).flatten());
    }
    let a = [&ORIGIN_IGP[..], &attr(0x50, 2, &path), &NEXT_HOP].concat();
    let d = decode(&a, &s);
    assert_eq!(d.disposition, Disposition::Ok);
    assert_eq!(
        d.update.attributes.as_path.unwrap().path_len(),
        path.len() / (2 + 255 * 4) * 255
    );
}

#[test]
fn announcements_and_withdrawals_follow_the_disposition() {
    let ok = decode_update(&body(&[16, 10, 9], &with_mandatory(&[]), &NLRI), &as4());
    assert_eq!(
        ok.announcements().collect::<Vec<_>>(),
        [Prefix::V4(v4("10.0.0.0/24"))]
    );
    assert_eq!(
        ok.withdrawals().collect::<Vec<_>>(),
        [Prefix::V4(v4("10.9.0.0/16"))]
    );
    // Treat-as-withdraw: nothing installed, the announced routes are withdrawn too.
    let taw = decode_update(
        &body(&[16, 10, 9], &with_mandatory(&attr(0xC0, 8, &[1])), &NLRI),
        &as4(),
    );
    assert_eq!(taw.announcements().count(), 0);
    assert_eq!(
        taw.withdrawals().collect::<Vec<_>>(),
        [Prefix::V4(v4("10.9.0.0/16")), Prefix::V4(v4("10.0.0.0/24"))]
    );
    // Session reset: nothing at all.
    let reset = decode_update(
        &body(&[16, 10, 9], &with_mandatory(&attr(0x80, 14, &[0])), &NLRI),
        &as4(),
    );
    assert_eq!(
        (reset.announcements().count(), reset.withdrawals().count()),
        (0, 0)
    );
}
