//! UPDATE packing for the Adj-RIB-Out: one attribute set and many prefixes become as few
//! UPDATEs as the session's message size allows, each as full as it can be.
//!
//! The attributes are encoded once, into the first message; every further message copies
//! that message's fixed parts (`extend_from_within`), so packing allocates nothing beyond
//! growing the caller's buffer. MP_REACH_NLRI / MP_UNREACH_NLRI are the first attribute
//! (RFC 7606 §5.1) and always use the extended length form.
//!
//! Each function returns the number of messages appended; on error nothing is appended.

use std::ops::Range;

use crate::attributes::mp::write_reach_head;
use crate::attributes::{NextHop, PathAttributes, code, flag};
use crate::cursor::Put;
use crate::error::EncodeError;
use crate::header::{self, HEADER_LEN, MessageType};
use crate::nlri::{Ipv4Prefix, NlriPrefix};
use crate::params::SessionParams;
use crate::types::{Family, Safi};
use crate::update::{check_next_hop, fit_u16};

/// Offset of the total path attribute length in a message with no withdrawn routes.
const ATTR_LEN_AT: usize = HEADER_LEN + 2;
/// Offset of an MP attribute's length when it is the first attribute (extended length).
const MP_LEN_AT: usize = ATTR_LEN_AT + 4;

/// Announce IPv4 prefixes in the NLRI field, with `attrs` (NEXT_HOP included).
pub fn announce_ipv4(
    session: &SessionParams,
    attrs: &PathAttributes,
    prefixes: impl IntoIterator<Item = Ipv4Prefix>,
    out: &mut Vec<u8>,
) -> Result<usize, EncodeError> {
    check_mandatory(attrs)?;
    if attrs.next_hop.is_none() {
        return Err(EncodeError::Invalid(
            "routes in the NLRI field need a NEXT_HOP",
        ));
    }
    let start = out.len();
    let result = announce_ipv4_inner(session, attrs, prefixes.into_iter(), out);
    settle(out, start, result)
}

fn announce_ipv4_inner(
    session: &SessionParams,
    attrs: &PathAttributes,
    prefixes: impl Iterator<Item = Ipv4Prefix>,
    out: &mut Vec<u8>,
) -> Result<usize, EncodeError> {
    let start = header::begin(out, MessageType::Update);
    out.put_u16(0);
    out.put_u16(fit_u16(attrs.wire_len(session, true), "path attributes")?);
    attrs.write(session, true, out)?;
    let head = start..out.len();
    pack(
        out,
        session.max_message_len(),
        head,
        Tail::None,
        &[],
        prefixes,
    )
}

/// Withdraw IPv4 prefixes in the withdrawn routes field.
pub fn withdraw_ipv4(
    session: &SessionParams,
    prefixes: impl IntoIterator<Item = Ipv4Prefix>,
    out: &mut Vec<u8>,
) -> Result<usize, EncodeError> {
    let start = header::begin(out, MessageType::Update);
    out.put_u16(0);
    let head = start..out.len();
    // Withdrawn length = the prefixes; then a zero total attribute length.
    let result = pack(
        out,
        session.max_message_len(),
        head,
        Tail::Zero,
        &[(HEADER_LEN, 0)],
        prefixes.into_iter(),
    );
    settle(out, start, result)
}

/// Announce prefixes of family `P` (IPv6, or IPv4 with an IPv6 next hop per RFC 8950) in
/// MP_REACH_NLRI via `next_hop`, with `attrs` (its classic NEXT_HOP is not written).
pub fn announce_mp<P: NlriPrefix>(
    session: &SessionParams,
    attrs: &PathAttributes,
    next_hop: NextHop,
    prefixes: impl IntoIterator<Item = P>,
    out: &mut Vec<u8>,
) -> Result<usize, EncodeError> {
    check_mandatory(attrs)?;
    check_next_hop(P::AFI, &next_hop)?;
    let family = Family::new(P::AFI, Safi::UNICAST);
    let attrs_len = attrs.wire_len(session, false);
    let start = header::begin(out, MessageType::Update);
    out.put_u16(0);
    out.put_u16(0);
    out.put_u8(flag::OPTIONAL | flag::EXTENDED_LENGTH);
    out.put_u8(code::MP_REACH_NLRI);
    out.put_u16(0);
    write_reach_head(out, family, &next_hop);
    let reach_fixed = next_hop.wire_len().saturating_add(5);
    let head = start..out.len();
    let patches = [
        (
            ATTR_LEN_AT,
            reach_fixed.saturating_add(4).saturating_add(attrs_len),
        ),
        (MP_LEN_AT, reach_fixed),
    ];
    let tail = Tail::Attributes(session, attrs, attrs_len);
    let result = pack(
        out,
        session.max_message_len(),
        head,
        tail,
        &patches,
        prefixes.into_iter(),
    );
    settle(out, start, result)
}

/// Withdraw prefixes of family `P` in MP_UNREACH_NLRI.
pub fn withdraw_mp<P: NlriPrefix>(
    session: &SessionParams,
    prefixes: impl IntoIterator<Item = P>,
    out: &mut Vec<u8>,
) -> Result<usize, EncodeError> {
    let start = header::begin(out, MessageType::Update);
    out.put_u16(0);
    out.put_u16(0);
    out.put_u8(flag::OPTIONAL | flag::EXTENDED_LENGTH);
    out.put_u8(code::MP_UNREACH_NLRI);
    out.put_u16(0);
    out.put_u16(P::AFI.0);
    out.put_u8(Safi::UNICAST.0);
    let head = start..out.len();
    let patches = [(ATTR_LEN_AT, 7), (MP_LEN_AT, 3)];
    let result = pack(
        out,
        session.max_message_len(),
        head,
        Tail::None,
        &patches,
        prefixes.into_iter(),
    );
    settle(out, start, result)
}

/// A peer would treat routes without ORIGIN or AS_PATH as withdrawn (RFC 7606 §3d): refuse
/// to send them rather than have them vanish on the other side.
fn check_mandatory(attrs: &PathAttributes) -> Result<(), EncodeError> {
    if attrs.origin.is_none() || attrs.as_path.is_none() {
        return Err(EncodeError::Invalid(
            "announcements need ORIGIN and AS_PATH",
        ));
    }
    Ok(())
}

fn settle(
    out: &mut Vec<u8>,
    start: usize,
    result: Result<usize, EncodeError>,
) -> Result<usize, EncodeError> {
    match result {
        Ok(n) if n > 0 => Ok(n),
        other => {
            out.truncate(start);
            other
        }
    }
}

/// What follows the NLRI in each message.
enum Tail<'a> {
    None,
    /// A zero total path attribute length (withdrawals in the classic field).
    Zero,
    /// The path attributes after MP_REACH_NLRI, of the given encoded length.
    Attributes(&'a SessionParams, &'a PathAttributes, usize),
}

impl Tail<'_> {
    fn len(&self) -> usize {
        match self {
            Tail::None => 0,
            Tail::Zero => 2,
            Tail::Attributes(_, _, l) => *l,
        }
    }
    fn write(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            Tail::None => Ok(()),
            Tail::Zero => {
                out.put_u16(0);
                Ok(())
            }
            Tail::Attributes(s, a, _) => a.write(s, false, out),
        }
    }
}

/// Fill messages with prefixes. The first message's fixed head is already in `out[head]`;
/// `patches` are (offset in message, constant) pairs whose field becomes NLRI octets +
/// constant.
fn pack<P: NlriPrefix>(
    out: &mut Vec<u8>,
    max: usize,
    head: Range<usize>,
    tail: Tail<'_>,
    patches: &[(usize, usize)],
    prefixes: impl Iterator<Item = P>,
) -> Result<usize, EncodeError> {
    let tail_len = tail.len();
    let mut messages = 0usize;
    let mut msg_start = head.start;
    let mut nlri_start = head.end;
    let mut tail_at: Option<Range<usize>> = None;
    let mut filled = false;
    for p in prefixes {
        let used = out.len().saturating_sub(msg_start);
        if used.saturating_add(p.wire_len()).saturating_add(tail_len) > max {
            if !filled {
                let size = used.saturating_add(p.wire_len()).saturating_add(tail_len);
                return Err(EncodeError::TooLarge {
                    what: "UPDATE with one prefix",
                    size,
                    max,
                });
            }
            close(
                out,
                max,
                msg_start,
                nlri_start,
                &tail,
                &mut tail_at,
                patches,
            )?;
            messages = messages.saturating_add(1);
            msg_start = out.len();
            out.extend_from_within(head.clone());
            nlri_start = out.len();
        }
        p.write(out);
        filled = true;
    }
    if filled {
        close(
            out,
            max,
            msg_start,
            nlri_start,
            &tail,
            &mut tail_at,
            patches,
        )?;
        messages = messages.saturating_add(1);
    }
    Ok(messages)
}

fn close(
    out: &mut Vec<u8>,
    max: usize,
    msg_start: usize,
    nlri_start: usize,
    tail: &Tail<'_>,
    tail_at: &mut Option<Range<usize>>,
    patches: &[(usize, usize)],
) -> Result<(), EncodeError> {
    let nlri_len = out.len().saturating_sub(nlri_start);
    match tail_at {
        Some(r) => out.extend_from_within(r.clone()),
        None => {
            let s = out.len();
            tail.write(out)?;
            *tail_at = Some(s..out.len());
        }
    }
    for &(offset, constant) in patches {
        out.patch_u16(
            msg_start.saturating_add(offset),
            fit_u16(nlri_len.saturating_add(constant), "UPDATE field")?,
        );
    }
    header::finish(out, msg_start, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attributes::{AsPath, MpNlri};
    use crate::header::{Split, split_message};
    use crate::message::{Decoded, decode_message};
    use crate::nlri::Ipv6Prefix;
    use crate::types::{Asn, Origin};
    use crate::update::Update;
    use std::net::Ipv4Addr;

    fn attrs() -> PathAttributes {
        PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::from_sequence([Asn(65001)])),
            next_hop: Some(Ipv4Addr::new(192, 0, 2, 1)),
            local_pref: Some(100),
            ..Default::default()
        }
    }

    fn v4s(n: u32) -> Vec<Ipv4Prefix> {
        (0..n)
            .map(|i| Ipv4Prefix::new(Ipv4Addr::from(0x0A00_0000 + (i << 6)), 26).unwrap())
            .collect()
    }

    fn v6s(n: u32) -> Vec<Ipv6Prefix> {
        (0..n)
            .map(|i| {
                Ipv6Prefix::new(
                    std::net::Ipv6Addr::from((0x2001_0db8u128 << 96) | (u128::from(i) << 64)),
                    64,
                )
                .unwrap()
            })
            .collect()
    }

    /// Split `buf` into messages and decode each.
    fn decode_all(buf: &[u8], s: &SessionParams) -> Vec<Update> {
        let mut rest = buf;
        let mut out = Vec::new();
        while !rest.is_empty() {
            let Split::Message(n) = split_message(rest, s) else {
                panic!("bad framing")
            };
            assert!(n <= s.max_message_len());
            match decode_message(&rest[..n], s).unwrap() {
                Decoded::Update(d) => {
                    assert!(d.disposition.is_ok(), "{:?}", d.disposition);
                    assert!(d.discarded.is_empty());
                    out.push(d.update);
                }
                other => panic!("{other:?}"),
            }
            rest = &rest[n..];
        }
        out
    }

    #[test]
    fn ipv4_announce_fills_messages() {
        let s = SessionParams::default();
        let ps = v4s(2000);
        let mut out = vec![0xAB];
        let n = announce_ipv4(&s, &attrs(), ps.iter().copied(), &mut out).unwrap();
        let ups = decode_all(&out[1..], &s);
        assert_eq!(ups.len(), n);
        // 5 octets per /26: a full message leaves less than 5 octets unused.
        let fixed = 23 + attrs().wire_len(&s, true);
        assert_eq!(n, 2000usize.div_ceil((4096 - fixed) / 5));
        assert!(out[1..].len() <= n * 4096);
        let got: Vec<_> = ups.iter().flat_map(|u| u.nlri.iter().copied()).collect();
        assert_eq!(got, ps);
        assert!(ups.iter().all(|u| u.attributes == attrs()));
    }

    #[test]
    fn extended_messages_pack_more() {
        let s = SessionParams {
            extended_message: true,
            ..SessionParams::default()
        };
        let mut out = Vec::new();
        let n = announce_ipv4(&s, &attrs(), v4s(20_000), &mut out).unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            decode_all(&out, &s)
                .iter()
                .map(|u| u.nlri.len())
                .sum::<usize>(),
            20_000
        );
    }

    #[test]
    fn ipv4_withdraw() {
        let s = SessionParams::default();
        let mut out = Vec::new();
        let n = withdraw_ipv4(&s, v4s(1000), &mut out).unwrap();
        assert_eq!(n, 2);
        let ups = decode_all(&out, &s);
        assert_eq!(
            ups.iter()
                .flat_map(|u| u.withdrawn.iter().copied())
                .collect::<Vec<_>>(),
            v4s(1000)
        );
        assert!(
            ups.iter()
                .all(|u| u.nlri.is_empty() && u.attributes == PathAttributes::default())
        );
    }

    #[test]
    fn ipv6_announce_and_withdraw() {
        let s = SessionParams {
            ipv6_unicast: true,
            four_octet_as: true,
            ..SessionParams::default()
        };
        let nh = NextHop::V6 {
            global: "2001:db8::1".parse().unwrap(),
            link_local: Some("fe80::1".parse().unwrap()),
        };
        let mut a = attrs();
        a.communities = (0..50).map(crate::types::Community).collect();
        let mut out = Vec::new();
        let n = announce_mp(&s, &a, nh, v6s(1500), &mut out).unwrap();
        let ups = decode_all(&out, &s);
        assert_eq!(ups.len(), n);
        assert!(n >= 2);
        let mut expect = a.clone();
        expect.next_hop = None; // not written for MP-only UPDATEs
        let mut got = Vec::new();
        for u in &ups {
            assert_eq!(u.attributes, expect);
            let r = u.mp_reach.as_ref().unwrap();
            assert_eq!(r.next_hop, nh);
            let MpNlri::Ipv6(v) = &r.nlri else { panic!() };
            got.extend_from_slice(v);
        }
        assert_eq!(got, v6s(1500));
        // Every message but the last is nearly full: one more /64 (9 octets) would not fit.
        let mut rest = &out[..];
        for _ in 0..n - 1 {
            let Split::Message(len) = split_message(rest, &s) else {
                panic!()
            };
            assert!(len + 9 > 4096, "message of {len} octets");
            rest = &rest[len..];
        }

        out.clear();
        let n = withdraw_mp(&s, v6s(1500), &mut out).unwrap();
        let ups = decode_all(&out, &s);
        assert_eq!(ups.len(), n);
        let got: Vec<_> = ups.iter().flat_map(|u| u.withdrawn_routes()).collect();
        assert_eq!(got.len(), 1500);
    }

    #[test]
    fn ipv4_over_ipv6_next_hop() {
        let s = SessionParams {
            ipv4_ext_next_hop: true,
            ..SessionParams::default()
        };
        let nh = NextHop::V6 {
            global: "2001:db8::1".parse().unwrap(),
            link_local: None,
        };
        let mut out = Vec::new();
        announce_mp(&s, &attrs(), nh, v4s(10), &mut out).unwrap();
        let ups = decode_all(&out, &s);
        assert_eq!(
            ups[0].mp_reach.as_ref().unwrap().nlri,
            MpNlri::Ipv4(v4s(10))
        );
    }

    #[test]
    fn nothing_to_pack_writes_nothing() {
        let s = SessionParams::default();
        let mut out = vec![1, 2];
        assert_eq!(announce_ipv4(&s, &attrs(), [], &mut out).unwrap(), 0);
        assert_eq!(withdraw_mp::<Ipv6Prefix>(&s, [], &mut out).unwrap(), 0);
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn attributes_too_large_is_an_error() {
        let s = SessionParams::default();
        let mut a = attrs();
        a.communities = (0..1100).map(crate::types::Community).collect();
        let mut out = vec![9];
        assert!(matches!(
            announce_ipv4(&s, &a, v4s(1), &mut out),
            Err(EncodeError::TooLarge { .. })
        ));
        let nh = NextHop::V4(Ipv4Addr::new(1, 2, 3, 4));
        assert!(announce_mp(&s, &attrs(), nh, v6s(1), &mut out).is_err());
        assert_eq!(out, [9]);
    }

    #[test]
    fn announcements_without_mandatory_attributes_are_refused() {
        let s = SessionParams::default();
        let mut out = Vec::new();
        for a in [
            PathAttributes {
                next_hop: None,
                ..attrs()
            },
            PathAttributes {
                origin: None,
                ..attrs()
            },
            PathAttributes {
                as_path: None,
                ..attrs()
            },
        ] {
            assert!(matches!(
                announce_ipv4(&s, &a, v4s(1), &mut out),
                Err(EncodeError::Invalid(_))
            ));
        }
        let nh = NextHop::V6 {
            global: "2001:db8::1".parse().unwrap(),
            link_local: None,
        };
        let a = PathAttributes {
            origin: None,
            ..attrs()
        };
        assert!(announce_mp(&s, &a, nh, v6s(1), &mut out).is_err());
        // MP announcements do not need the classic NEXT_HOP.
        let a = PathAttributes {
            next_hop: None,
            ..attrs()
        };
        assert_eq!(announce_mp(&s, &a, nh, v6s(1), &mut out), Ok(1));
    }
}
