//! MP_REACH_NLRI (type 14) and MP_UNREACH_NLRI (type 15), RFC 4760, with IPv6 next hops
//! (RFC 2545: global, or global + link-local) and IPv4 NLRI over an IPv6 next hop (RFC 8950).
//! An IPv4-mapped next hop of IPv4 NLRI is read as the IPv4 address it maps.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::cursor::{Put, Reader};
use crate::error::{DecodeError, ErrorKind};
use crate::nlri::{Ipv4Prefix, Ipv6Prefix, NlriPrefix, decode_nlri, encode_nlri};
use crate::params::SessionParams;
use crate::types::{Afi, Family, Safi};

/// A next hop as MP_REACH_NLRI carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NextHop {
    V4(Ipv4Addr),
    V6 {
        global: Ipv6Addr,
        link_local: Option<Ipv6Addr>,
    },
}

impl NextHop {
    /// Octets on the wire: 4, 16 or 32.
    pub fn wire_len(&self) -> usize {
        match self {
            NextHop::V4(_) => 4,
            NextHop::V6 {
                link_local: None, ..
            } => 16,
            NextHop::V6 {
                link_local: Some(_),
                ..
            } => 32,
        }
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        match self {
            NextHop::V4(a) => out.extend_from_slice(&a.octets()),
            NextHop::V6 { global, link_local } => {
                out.extend_from_slice(&global.octets());
                if let Some(ll) = link_local {
                    out.extend_from_slice(&ll.octets());
                }
            }
        }
    }

    fn read(bytes: &[u8]) -> Option<NextHop> {
        let mut r = Reader::new(bytes);
        let nh = match bytes.len() {
            4 => NextHop::V4(Ipv4Addr::from(r.array::<4>()?)),
            16 => NextHop::V6 {
                global: Ipv6Addr::from(r.array::<16>()?),
                link_local: None,
            },
            32 => NextHop::V6 {
                global: Ipv6Addr::from(r.array::<16>()?),
                link_local: Some(Ipv6Addr::from(r.array::<16>()?)),
            },
            _ => return None,
        };
        Some(nh)
    }
}

/// Prefixes of one address family (unicast).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MpNlri {
    Ipv4(Vec<Ipv4Prefix>),
    Ipv6(Vec<Ipv6Prefix>),
}

impl MpNlri {
    pub fn family(&self) -> Family {
        match self {
            MpNlri::Ipv4(_) => Family::IPV4_UNICAST,
            MpNlri::Ipv6(_) => Family::IPV6_UNICAST,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            MpNlri::Ipv4(v) => v.len(),
            MpNlri::Ipv6(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// An empty list for `family`, if it is one we carry.
    pub fn empty(family: Family) -> Option<MpNlri> {
        match family {
            Family::IPV4_UNICAST => Some(MpNlri::Ipv4(Vec::new())),
            Family::IPV6_UNICAST => Some(MpNlri::Ipv6(Vec::new())),
            _ => None,
        }
    }
    pub(crate) fn wire_len(&self) -> usize {
        match self {
            MpNlri::Ipv4(v) => v
                .iter()
                .map(NlriPrefix::wire_len)
                .fold(0, usize::saturating_add),
            MpNlri::Ipv6(v) => v
                .iter()
                .map(NlriPrefix::wire_len)
                .fold(0, usize::saturating_add),
        }
    }
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        match self {
            MpNlri::Ipv4(v) => encode_nlri(v, out),
            MpNlri::Ipv6(v) => encode_nlri(v, out),
        }
    }
    fn decode(afi: Afi, bytes: &[u8]) -> Result<MpNlri, DecodeError> {
        if afi == Afi::IPV4 {
            decode_nlri(bytes).map(MpNlri::Ipv4)
        } else {
            decode_nlri(bytes).map(MpNlri::Ipv6)
        }
    }
}

/// MP_REACH_NLRI: routes of one family reachable via `next_hop`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MpReach {
    pub next_hop: NextHop,
    pub nlri: MpNlri,
}

/// MP_UNREACH_NLRI: withdrawn routes of one family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MpUnreach {
    pub withdrawn: MpNlri,
}

impl MpReach {
    pub fn family(&self) -> Family {
        self.nlri.family()
    }
    /// Octets of the attribute value.
    pub(crate) fn wire_len(&self) -> usize {
        self.next_hop
            .wire_len()
            .saturating_add(5)
            .saturating_add(self.nlri.wire_len())
    }
    /// Append the attribute value.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        write_reach_head(out, self.family(), &self.next_hop);
        self.nlri.write(out);
    }
}

impl MpUnreach {
    pub fn family(&self) -> Family {
        self.withdrawn.family()
    }
    pub(crate) fn wire_len(&self) -> usize {
        self.withdrawn.wire_len().saturating_add(3)
    }
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let f = self.family();
        out.put_u16(f.afi.0);
        out.put_u8(f.safi.0);
        self.withdrawn.write(out);
    }
}

/// AFI, SAFI, next hop length, next hop, reserved octet.
pub(crate) fn write_reach_head(out: &mut Vec<u8>, family: Family, next_hop: &NextHop) {
    out.put_u16(family.afi.0);
    out.put_u8(family.safi.0);
    out.put_u8(u8::try_from(next_hop.wire_len()).unwrap_or(0));
    next_hop.write(out);
    out.put_u8(0);
}

/// Outcome of decoding an MP attribute that is well-formed enough to locate its NLRI.
pub(crate) enum MpOutcome<T> {
    /// Decoded; `Some(error)` means the routes must be treated as withdrawn.
    Decoded(T, Option<DecodeError>),
    /// A family we carry but that was not negotiated, or one we do not carry: discarded.
    Unnegotiated(Family),
}

fn family_enabled(session: &SessionParams, family: Family) -> bool {
    match family {
        Family::IPV4_UNICAST => session.ipv4_unicast,
        Family::IPV6_UNICAST => session.ipv6_unicast,
        _ => false,
    }
}

fn optional_error(detail: &'static str, raw: &[u8]) -> DecodeError {
    DecodeError::with_data(ErrorKind::OptionalAttribute, detail, raw)
}

/// Decode an MP_REACH_NLRI value; `Err` means the session must be reset (RFC 7606 §7.11).
pub(crate) fn decode_reach(
    value: &[u8],
    raw: &[u8],
    session: &SessionParams,
) -> Result<MpOutcome<MpReach>, DecodeError> {
    let mut r = Reader::new(value);
    let (Some(afi), Some(safi), Some(nh_len)) = (r.u16(), r.u8(), r.u8()) else {
        return Err(optional_error(
            "MP_REACH_NLRI shorter than its fixed fields",
            raw,
        ));
    };
    let nh_bytes = r
        .take(usize::from(nh_len))
        .ok_or_else(|| optional_error("MP_REACH_NLRI next hop longer than the attribute", raw))?;
    // The reserved octet (once the SNPA count): must be there, is ignored.
    r.u8()
        .ok_or_else(|| optional_error("MP_REACH_NLRI truncated after the next hop", raw))?;
    let family = Family::new(Afi(afi), Safi(safi));
    if !family_enabled(session, family) {
        return Ok(MpOutcome::Unnegotiated(family));
    }
    let next_hop = NextHop::read(nh_bytes).ok_or_else(|| {
        optional_error("MP_REACH_NLRI next hop length does not fit the family", raw)
    })?;
    let next_hop = ipv4_if_mapped(family.afi, next_hop);
    let mut problem = None;
    match (family.afi, next_hop) {
        (Afi::IPV4, NextHop::V4(_)) | (Afi::IPV6, NextHop::V6 { .. }) => {}
        (Afi::IPV4, NextHop::V6 { .. }) if session.ipv4_ext_next_hop => {}
        // The NLRI can still be located, so (as BIRD does) only these routes are lost.
        (Afi::IPV4, NextHop::V6 { .. }) => {
            problem = Some(DecodeError::with_data(
                ErrorKind::InvalidNextHop,
                "IPv6 next hop for IPv4 routes without the extended next hop capability",
                raw,
            ));
        }
        _ => {
            return Err(optional_error(
                "MP_REACH_NLRI IPv4 next hop for IPv6 routes",
                raw,
            ));
        }
    }
    if problem.is_none() && next_hop_invalid(&next_hop) {
        problem = Some(DecodeError::with_data(
            ErrorKind::InvalidNextHop,
            "next hop is not a unicast address",
            raw,
        ));
    }
    let nlri = MpNlri::decode(family.afi, r.rest())?;
    Ok(MpOutcome::Decoded(MpReach { next_hop, nlri }, problem))
}

/// Decode an MP_UNREACH_NLRI value; `Err` means the session must be reset.
pub(crate) fn decode_unreach(
    value: &[u8],
    raw: &[u8],
    session: &SessionParams,
) -> Result<MpOutcome<MpUnreach>, DecodeError> {
    let mut r = Reader::new(value);
    let (Some(afi), Some(safi)) = (r.u16(), r.u8()) else {
        return Err(optional_error("MP_UNREACH_NLRI shorter than 3 octets", raw));
    };
    let family = Family::new(Afi(afi), Safi(safi));
    if !family_enabled(session, family) {
        return Ok(MpOutcome::Unnegotiated(family));
    }
    let withdrawn = MpNlri::decode(family.afi, r.rest())?;
    Ok(MpOutcome::Decoded(MpUnreach { withdrawn }, None))
}

/// For IPv4 routes, an IPv4-mapped IPv6 next hop (`::ffff:a.b.c.d`, RFC 4291 §2.5.5.2) is
/// the IPv4 next hop it maps, as BIRD 2 reads it: the way a 16-octet field carries an IPv4
/// address (RFC 4798 does so for IPv6 routes). Kept as IPv6 it was a next hop no packet
/// can be sent to, and an IPv4 route via IPv6 never reaches the kernel, so the route
/// could win the decision process and still forward nothing. A link-local address beside
/// it is dropped (BIRD 2 likewise).
fn ipv4_if_mapped(afi: Afi, nh: NextHop) -> NextHop {
    match nh {
        NextHop::V6 { global, .. } if afi == Afi::IPV4 => {
            global.to_ipv4_mapped().map_or(nh, NextHop::V4)
        }
        _ => nh,
    }
}

/// Unspecified, multicast or broadcast next hops are not host addresses (RFC 4271 §6.3).
fn next_hop_invalid(nh: &NextHop) -> bool {
    match nh {
        NextHop::V4(a) => ipv4_next_hop_invalid(*a),
        NextHop::V6 { global, .. } => global.is_unspecified() || global.is_multicast(),
    }
}

pub(crate) fn ipv4_next_hop_invalid(a: Ipv4Addr) -> bool {
    a.is_unspecified() || a.is_multicast() || a.is_broadcast()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> SessionParams {
        SessionParams {
            ipv6_unicast: true,
            ..SessionParams::default()
        }
    }

    fn decoded<T>(o: Result<MpOutcome<T>, DecodeError>) -> (T, Option<DecodeError>) {
        match o {
            Ok(MpOutcome::Decoded(t, p)) => (t, p),
            _ => panic!("not decoded"),
        }
    }

    #[test]
    fn ipv6_with_link_local_round_trip() {
        let reach = MpReach {
            next_hop: NextHop::V6 {
                global: "2001:db8::1".parse().unwrap(),
                link_local: Some("fe80::1".parse().unwrap()),
            },
            nlri: MpNlri::Ipv6(vec!["2001:db8:1::/48".parse().unwrap()]),
        };
        let mut v = Vec::new();
        reach.write(&mut v);
        assert_eq!(v.len(), reach.wire_len());
        assert_eq!(v[3], 32);
        let (got, problem) = decoded(decode_reach(&v, &v, &session()));
        assert_eq!(got, reach);
        assert!(problem.is_none());
    }

    #[test]
    fn truncated_mp_reach_resets() {
        for v in [&[0u8, 2][..], &[0, 2, 1], &[0, 2, 1, 16, 0, 0]] {
            let e = decode_reach(v, v, &session()).err().unwrap();
            assert_eq!(e.kind, ErrorKind::OptionalAttribute);
        }
        // Next hop length larger than the attribute.
        let v = [0, 2, 1, 200, 1, 2, 3];
        assert!(decode_reach(&v, &v, &session()).is_err());
        // Next hop length 5 is no family's.
        let v = [0, 2, 1, 5, 1, 2, 3, 4, 5, 0];
        assert!(decode_reach(&v, &v, &session()).is_err());
        // A bad prefix inside.
        let v = [0, 1, 1, 4, 10, 0, 0, 1, 0, 33, 1, 1, 1, 1, 1];
        assert_eq!(
            decode_reach(&v, &v, &session()).err().unwrap().kind,
            ErrorKind::InvalidNetworkField
        );
    }

    #[test]
    fn rfc_8950_needs_the_capability() {
        let reach = MpReach {
            next_hop: NextHop::V6 {
                global: "2001:db8::1".parse().unwrap(),
                link_local: None,
            },
            nlri: MpNlri::Ipv4(vec!["10.0.0.0/24".parse().unwrap()]),
        };
        let mut v = Vec::new();
        reach.write(&mut v);
        let (got, problem) = decoded(decode_reach(&v, &v, &session()));
        assert_eq!(got, reach);
        assert_eq!(problem.unwrap().kind, ErrorKind::InvalidNextHop);
        let ext = SessionParams {
            ipv4_ext_next_hop: true,
            ..session()
        };
        let (got, problem) = decoded(decode_reach(&v, &v, &ext));
        assert_eq!(got, reach);
        assert!(problem.is_none());
    }

    #[test]
    fn ipv4_mapped_next_hop_of_ipv4_routes_is_ipv4() {
        let nlri = MpNlri::Ipv4(vec!["10.0.0.0/24".parse().unwrap()]);
        let mapped: Ipv6Addr = "::ffff:10.0.0.9".parse().unwrap();
        for (link_local, ext) in [(None, false), (None, true), (Some("fe80::9"), true)] {
            let reach = MpReach {
                next_hop: NextHop::V6 {
                    global: mapped,
                    link_local: link_local.map(|a| a.parse().unwrap()),
                },
                nlri: nlri.clone(),
            };
            let mut v = Vec::new();
            reach.write(&mut v);
            let s = SessionParams {
                ipv4_ext_next_hop: ext,
                ..session()
            };
            // With or without RFC 8950: it is an IPv4 next hop, not an IPv6 one.
            let (got, problem) = decoded(decode_reach(&v, &v, &s));
            assert_eq!(got.next_hop, NextHop::V4(Ipv4Addr::new(10, 0, 0, 9)));
            assert_eq!(got.nlri, nlri);
            assert!(problem.is_none());
        }
        // A mapped 0.0.0.0 is as unusable as 0.0.0.0.
        let v = [
            &[0u8, 1, 1, 16][..],
            &[0; 10],
            &[0xff, 0xff, 0, 0, 0, 0],
            &[0, 24, 10, 0, 0],
        ]
        .concat();
        let (got, problem) = decoded(decode_reach(&v, &v, &session()));
        assert_eq!(got.next_hop, NextHop::V4(Ipv4Addr::UNSPECIFIED));
        assert_eq!(problem.unwrap().kind, ErrorKind::InvalidNextHop);
        // For IPv6 routes it stays what it is (RFC 4798's own encoding).
        let reach = MpReach {
            next_hop: NextHop::V6 {
                global: mapped,
                link_local: None,
            },
            nlri: MpNlri::Ipv6(vec!["2001:db8::/32".parse().unwrap()]),
        };
        let mut v = Vec::new();
        reach.write(&mut v);
        let (got, _) = decoded(decode_reach(&v, &v, &session()));
        assert_eq!(got, reach);
    }

    #[test]
    fn unnegotiated_family_is_reported() {
        let v = [0, 25, 70, 4, 1, 2, 3, 4, 0];
        assert!(
            matches!(decode_reach(&v, &v, &session()), Ok(MpOutcome::Unnegotiated(f)) if f.afi == Afi(25))
        );
        let v = [0, 2, 1];
        assert!(matches!(
            decode_unreach(&v, &v, &SessionParams::default()),
            Ok(MpOutcome::Unnegotiated(_))
        ));
        let (u, _) = decoded(decode_unreach(&v, &v, &session()));
        assert!(u.withdrawn.is_empty());
    }
}
