//! Path attributes: the typed set ([`PathAttributes`]) and their wire forms.
//!
//! `PathAttributes` is what a route carries apart from its prefix; it is `Eq + Hash` so the
//! RIB can keep one copy per distinct set. NLRI-bearing attributes (MP_REACH_NLRI,
//! MP_UNREACH_NLRI) are not part of it: they live in the UPDATE (`bgp_wire::Update`, a layer
//! above this module). Neither are AS4_PATH and AS4_AGGREGATOR: they are wire artefacts of
//! 2-octet sessions, merged on decode and re-created on encode.

pub mod as_path;
pub mod mp;

use std::net::Ipv4Addr;

use crate::cursor::{Put, Reader};
use crate::error::EncodeError;
use crate::params::SessionParams;
use crate::types::{Asn, Community, ExtCommunity, LargeCommunity, Origin};

pub use as_path::{AsPath, AsSegment, SegmentType, merge_as4_path};
pub use mp::{MpNlri, MpReach, MpUnreach, NextHop};

/// Attribute type codes.
pub mod code {
    pub const ORIGIN: u8 = 1;
    pub const AS_PATH: u8 = 2;
    pub const NEXT_HOP: u8 = 3;
    pub const MULTI_EXIT_DISC: u8 = 4;
    pub const LOCAL_PREF: u8 = 5;
    pub const ATOMIC_AGGREGATE: u8 = 6;
    pub const AGGREGATOR: u8 = 7;
    pub const COMMUNITIES: u8 = 8;
    pub const ORIGINATOR_ID: u8 = 9;
    pub const CLUSTER_LIST: u8 = 10;
    pub const MP_REACH_NLRI: u8 = 14;
    pub const MP_UNREACH_NLRI: u8 = 15;
    pub const EXTENDED_COMMUNITIES: u8 = 16;
    pub const AS4_PATH: u8 = 17;
    pub const AS4_AGGREGATOR: u8 = 18;
    pub const LARGE_COMMUNITIES: u8 = 32;
}

/// Attribute flag bits.
pub mod flag {
    pub const OPTIONAL: u8 = 0x80;
    pub const TRANSITIVE: u8 = 0x40;
    pub const PARTIAL: u8 = 0x20;
    pub const EXTENDED_LENGTH: u8 = 0x10;
}

/// The Optional and Transitive bits each known attribute must carry; `None` if unknown.
pub(crate) const fn expected_flags(type_code: u8) -> Option<u8> {
    use code::*;
    use flag::*;
    match type_code {
        ORIGIN | AS_PATH | NEXT_HOP | LOCAL_PREF | ATOMIC_AGGREGATE => Some(TRANSITIVE),
        MULTI_EXIT_DISC | ORIGINATOR_ID | CLUSTER_LIST | MP_REACH_NLRI | MP_UNREACH_NLRI => {
            Some(OPTIONAL)
        }
        AGGREGATOR | COMMUNITIES | EXTENDED_COMMUNITIES | AS4_PATH | AS4_AGGREGATOR
        | LARGE_COMMUNITIES => Some(OPTIONAL | TRANSITIVE),
        _ => None,
    }
}

/// AGGREGATOR / AS4_AGGREGATOR value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Aggregator {
    pub asn: Asn,
    pub addr: Ipv4Addr,
}

/// An attribute this crate does not interpret, kept as received.
///
/// On decode only optional transitive ones are kept, and their Partial bit is set because we
/// pass them on without understanding them (RFC 4271 §5). The Extended Length bit is not
/// stored: the encoder sets it from the value's length.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawAttribute {
    pub flags: u8,
    pub type_code: u8,
    pub value: Vec<u8>,
}

/// The path attributes of a route. Empty vectors mean "attribute absent" (an empty
/// COMMUNITIES etc. is malformed on the wire anyway, RFC 7606 §7.8).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PathAttributes {
    pub origin: Option<Origin>,
    /// The real (4-octet) path, whatever the session.
    pub as_path: Option<AsPath>,
    /// The classic NEXT_HOP attribute (IPv4 routes in the NLRI field). MP_REACH_NLRI's next
    /// hop is in [`MpReach`].
    pub next_hop: Option<Ipv4Addr>,
    pub med: Option<u32>,
    pub local_pref: Option<u32>,
    pub atomic_aggregate: bool,
    pub aggregator: Option<Aggregator>,
    pub communities: Vec<Community>,
    pub originator_id: Option<Ipv4Addr>,
    pub cluster_list: Vec<Ipv4Addr>,
    pub ext_communities: Vec<ExtCommunity>,
    pub large_communities: Vec<LargeCommunity>,
    /// Unrecognised optional transitive attributes, in the order received.
    pub unknown: Vec<RawAttribute>,
    /// Not an attribute of its own: the MP_REACH_NLRI next hop of the routes these
    /// attributes go with, for tables that store one attribute set per route (IPv6 routes,
    /// IPv4 routes with an IPv6 next hop). The decoder leaves it `None` (the next hop is in
    /// [`MpReach`]); the encoders ignore it (the packer takes the next hop as an argument).
    pub mp_next_hop: Option<NextHop>,
}

/// Octets of an attribute header for a value of `len` octets.
#[inline]
pub(crate) fn header_len(len: usize) -> usize {
    if len > 255 { 4 } else { 3 }
}

/// Write an attribute header; the Extended Length bit is set exactly when needed.
#[inline]
pub(crate) fn write_header(
    out: &mut Vec<u8>,
    flags: u8,
    type_code: u8,
    len: usize,
) -> Result<(), EncodeError> {
    let flags = flags & !flag::EXTENDED_LENGTH;
    if let Ok(l) = u8::try_from(len) {
        out.put_u8(flags);
        out.put_u8(type_code);
        out.put_u8(l);
    } else {
        let l = u16::try_from(len).map_err(|_| EncodeError::TooLarge {
            what: "attribute",
            size: len,
            max: 65535,
        })?;
        out.put_u8(flags | flag::EXTENDED_LENGTH);
        out.put_u8(type_code);
        out.put_u16(l);
    }
    Ok(())
}

fn is_known(type_code: u8) -> bool {
    expected_flags(type_code).is_some()
}

impl PathAttributes {
    /// Octets this set takes on the wire for `session` (MP attributes excluded).
    pub fn wire_len(&self, session: &SessionParams, with_next_hop: bool) -> usize {
        let mut total = 0usize;
        self.for_each_len(session, with_next_hop, |len| {
            total = total.saturating_add(header_len(len).saturating_add(len))
        });
        total
    }

    /// Calls `f` with the value length of every attribute the encoder will write.
    fn for_each_len(&self, session: &SessionParams, with_next_hop: bool, mut f: impl FnMut(usize)) {
        let four = session.four_octet_as;
        if self.origin.is_some() {
            f(1);
        }
        if let Some(p) = &self.as_path {
            f(p.wire_len(if four { 4 } else { 2 }, false));
        }
        if with_next_hop && self.next_hop.is_some() {
            f(4);
        }
        if self.med.is_some() {
            f(4);
        }
        if self.local_pref.is_some() {
            f(4);
        }
        if self.atomic_aggregate {
            f(0);
        }
        if self.aggregator.is_some() {
            f(if four { 8 } else { 6 });
        }
        if !self.communities.is_empty() {
            f(self.communities.len().saturating_mul(4));
        }
        if self.originator_id.is_some() {
            f(4);
        }
        if !self.cluster_list.is_empty() {
            f(self.cluster_list.len().saturating_mul(4));
        }
        if !self.ext_communities.is_empty() {
            f(self.ext_communities.len().saturating_mul(8));
        }
        if !four {
            if let Some(p) = self.as_path.as_ref().filter(|p| p.needs_as4()) {
                f(p.wire_len(4, true));
            }
            if self.aggregator.is_some_and(|a| !a.asn.is_16bit()) {
                f(8);
            }
        }
        if !self.large_communities.is_empty() {
            f(self.large_communities.len().saturating_mul(12));
        }
        for u in &self.unknown {
            f(u.value.len());
        }
    }

    /// Append every attribute (MP attributes excluded) in type-code order, unknown ones last.
    /// `with_next_hop` is false for UPDATEs whose only routes are in MP_REACH_NLRI
    /// (RFC 4760 §3: they should not carry NEXT_HOP).
    ///
    /// On error, `out` may hold a partial attribute list: callers truncate.
    #[expect(
        clippy::too_many_lines,
        reason = "one block per path attribute in ascending type-code order, AS4_PATH and AS4_AGGREGATOR only towards a 2-octet speaker; the order on the wire is the function"
    )]
    pub(crate) fn write(
        &self,
        session: &SessionParams,
        with_next_hop: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        use code::*;
        use flag::*;
        let four = session.four_octet_as;
        if let Some(o) = self.origin {
            write_header(out, TRANSITIVE, ORIGIN, 1)?;
            out.put_u8(o as u8);
        }
        if let Some(p) = &self.as_path {
            write_header(
                out,
                TRANSITIVE,
                AS_PATH,
                p.wire_len(if four { 4 } else { 2 }, false),
            )?;
            p.write(out, four, false);
        }
        if with_next_hop && let Some(nh) = self.next_hop {
            write_header(out, TRANSITIVE, NEXT_HOP, 4)?;
            out.extend_from_slice(&nh.octets());
        }
        if let Some(m) = self.med {
            write_header(out, OPTIONAL, MULTI_EXIT_DISC, 4)?;
            out.put_u32(m);
        }
        if let Some(lp) = self.local_pref {
            write_header(out, TRANSITIVE, LOCAL_PREF, 4)?;
            out.put_u32(lp);
        }
        if self.atomic_aggregate {
            write_header(out, TRANSITIVE, ATOMIC_AGGREGATE, 0)?;
        }
        if let Some(a) = self.aggregator {
            write_header(
                out,
                OPTIONAL | TRANSITIVE,
                AGGREGATOR,
                if four { 8 } else { 6 },
            )?;
            if four {
                out.put_u32(a.asn.0);
            } else {
                out.put_u16(a.asn.to_16bit());
            }
            out.extend_from_slice(&a.addr.octets());
        }
        if !self.communities.is_empty() {
            write_header(
                out,
                OPTIONAL | TRANSITIVE,
                COMMUNITIES,
                self.communities.len().saturating_mul(4),
            )?;
            for c in &self.communities {
                out.put_u32(c.0);
            }
        }
        if let Some(id) = self.originator_id {
            write_header(out, OPTIONAL, ORIGINATOR_ID, 4)?;
            out.extend_from_slice(&id.octets());
        }
        if !self.cluster_list.is_empty() {
            write_header(
                out,
                OPTIONAL,
                CLUSTER_LIST,
                self.cluster_list.len().saturating_mul(4),
            )?;
            for id in &self.cluster_list {
                out.extend_from_slice(&id.octets());
            }
        }
        if !self.ext_communities.is_empty() {
            write_header(
                out,
                OPTIONAL | TRANSITIVE,
                EXTENDED_COMMUNITIES,
                self.ext_communities.len().saturating_mul(8),
            )?;
            for c in &self.ext_communities {
                out.extend_from_slice(&c.0);
            }
        }
        if !four {
            // RFC 6793 §4.2.2: a NEW speaker talking to an OLD one sends the real numbers
            // alongside, without confederation segments.
            if let Some(p) = self.as_path.as_ref().filter(|p| p.needs_as4()) {
                write_header(out, OPTIONAL | TRANSITIVE, AS4_PATH, p.wire_len(4, true))?;
                p.write(out, true, true);
            }
            if let Some(a) = self.aggregator.filter(|a| !a.asn.is_16bit()) {
                write_header(out, OPTIONAL | TRANSITIVE, AS4_AGGREGATOR, 8)?;
                out.put_u32(a.asn.0);
                out.extend_from_slice(&a.addr.octets());
            }
        }
        if !self.large_communities.is_empty() {
            write_header(
                out,
                OPTIONAL | TRANSITIVE,
                LARGE_COMMUNITIES,
                self.large_communities.len().saturating_mul(12),
            )?;
            for c in &self.large_communities {
                out.put_u32(c.global_admin);
                out.put_u32(c.local1);
                out.put_u32(c.local2);
            }
        }
        for u in &self.unknown {
            if is_known(u.type_code) {
                return Err(EncodeError::Invalid(
                    "unknown attribute uses a known type code",
                ));
            }
            write_header(out, u.flags, u.type_code, u.value.len())?;
            out.extend_from_slice(&u.value);
        }
        Ok(())
    }
}

/// Value decoders shared by the UPDATE decoder. Each returns `None` when the value is
/// malformed; the caller knows which error and disposition that means.
pub(crate) mod value {
    use super::*;

    pub(crate) fn u32_exact(v: &[u8]) -> Option<u32> {
        let mut r = Reader::new(v);
        let x = r.u32()?;
        r.is_empty().then_some(x)
    }

    pub(crate) fn ipv4_exact(v: &[u8]) -> Option<Ipv4Addr> {
        u32_exact(v).map(Ipv4Addr::from)
    }

    pub(crate) fn aggregator(v: &[u8], four_octet: bool) -> Option<Aggregator> {
        let mut r = Reader::new(v);
        let asn = if four_octet {
            r.u32()?
        } else {
            u32::from(r.u16()?)
        };
        let addr = Ipv4Addr::from(r.u32()?);
        r.is_empty().then_some(Aggregator {
            asn: Asn(asn),
            addr,
        })
    }

    /// A non-empty list of `N`-octet items.
    pub(crate) fn list<const N: usize, T>(v: &[u8], f: impl Fn(&[u8; N]) -> T) -> Option<Vec<T>> {
        let (items, rest) = v.as_chunks::<N>();
        (!items.is_empty() && rest.is_empty()).then(|| items.iter().map(f).collect())
    }

    pub(crate) fn large_community(c: &[u8; 12]) -> LargeCommunity {
        let mut r = Reader::new(c);
        LargeCommunity {
            global_admin: r.u32().unwrap_or(0),
            local1: r.u32().unwrap_or(0),
            local2: r.u32().unwrap_or(0),
        }
    }

    /// RFC 8092 §5: duplicate large communities are removed (first occurrence kept).
    pub(crate) fn dedup_large(v: &mut Vec<LargeCommunity>) {
        // Short lists (the usual case) are checked without allocating; long ones with a set,
        // so a peer cannot make us do quadratic work.
        let has_dup = v.len() > 64
            || v.iter()
                .enumerate()
                .any(|(i, c)| v.iter().take(i).any(|d| d == c));
        if has_dup {
            let mut seen = std::collections::HashSet::with_capacity(v.len());
            v.retain(|c| seen.insert(*c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_length_only_when_needed() {
        let mut out = Vec::new();
        write_header(&mut out, flag::OPTIONAL | flag::EXTENDED_LENGTH, 99, 255).unwrap();
        assert_eq!(out, [0x80, 99, 255]);
        out.clear();
        write_header(&mut out, flag::OPTIONAL, 99, 256).unwrap();
        assert_eq!(out, [0x90, 99, 1, 0]);
        assert!(write_header(&mut out, 0, 99, 65536).is_err());
    }

    #[test]
    fn wire_len_matches_what_is_written() {
        let attrs = PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::from_sequence([Asn(65001), Asn(4_200_000_000)])),
            next_hop: Some(Ipv4Addr::new(10, 0, 0, 1)),
            med: Some(5),
            local_pref: Some(100),
            atomic_aggregate: true,
            aggregator: Some(Aggregator {
                asn: Asn(4_200_000_000),
                addr: Ipv4Addr::new(1, 2, 3, 4),
            }),
            communities: (0..100).map(Community).collect(),
            originator_id: Some(Ipv4Addr::new(9, 9, 9, 9)),
            cluster_list: vec![Ipv4Addr::new(1, 1, 1, 1)],
            ext_communities: vec![ExtCommunity::route_target(65000, 1)],
            large_communities: vec![LargeCommunity {
                global_admin: 1,
                local1: 2,
                local2: 3,
            }],
            unknown: vec![RawAttribute {
                flags: 0xE0,
                type_code: 99,
                value: vec![1, 2, 3],
            }],
            mp_next_hop: None,
        };
        for four in [false, true] {
            for nh in [false, true] {
                let s = SessionParams {
                    four_octet_as: four,
                    ..SessionParams::default()
                };
                let mut out = Vec::new();
                attrs.write(&s, nh, &mut out).unwrap();
                assert_eq!(out.len(), attrs.wire_len(&s, nh), "four {four} nh {nh}");
            }
        }
    }

    #[test]
    fn unknown_with_a_known_code_is_refused() {
        let attrs = PathAttributes {
            unknown: vec![RawAttribute {
                flags: 0xC0,
                type_code: code::COMMUNITIES,
                value: vec![0; 4],
            }],
            ..Default::default()
        };
        assert!(
            attrs
                .write(&SessionParams::default(), true, &mut Vec::new())
                .is_err()
        );
    }

    #[test]
    fn large_community_dedup_keeps_first_order() {
        let lc = |n| LargeCommunity {
            global_admin: n,
            local1: 0,
            local2: 0,
        };
        let mut v = vec![lc(3), lc(1), lc(3), lc(2), lc(1)];
        value::dedup_large(&mut v);
        assert_eq!(v, [lc(3), lc(1), lc(2)]);
    }
}
