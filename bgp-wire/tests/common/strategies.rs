//! proptest strategies shared by the property and differential tests.
//!
//! `zetta_safe` restricts values to what zettabgp 0.6 can decode without erroring (it has no
//! confederation segments, and parses a few more attribute codes than we do).

use std::net::{Ipv4Addr, Ipv6Addr};

use bgp_wire::*;
use proptest::prelude::*;
use proptest::sample::select;

pub fn asn() -> impl Strategy<Value = Asn> {
    prop_oneof![1u32..65536, any::<u32>(), Just(Asn::TRANS.0)].prop_map(Asn)
}

pub fn asn16() -> impl Strategy<Value = Asn> {
    (1u32..65536).prop_map(Asn)
}

/// Paths that survive the 2-octet wire: confederation segments (16-bit) only in front, since
/// RFC 6793's merge keeps only leading ones; sets of at most 255 (the encoder splits longer
/// segments, which for a set changes its meaning).
pub fn as_path(four_octet: bool, zetta_safe: bool) -> impl Strategy<Value = AsPath> {
    let seg = prop_oneof![
        prop::collection::vec(asn(), 1..300).prop_map(|asns| AsSegment {
            kind: SegmentType::Sequence,
            asns
        }),
        prop::collection::vec(asn(), 1..8).prop_map(|asns| AsSegment {
            kind: SegmentType::Set,
            asns
        }),
    ];
    let confed = prop_oneof![
        prop::collection::vec(
            if four_octet {
                asn().boxed()
            } else {
                asn16().boxed()
            },
            1..5
        )
        .prop_map(|asns| AsSegment {
            kind: SegmentType::ConfedSequence,
            asns
        }),
        prop::collection::vec(asn16(), 1..5).prop_map(|asns| AsSegment {
            kind: SegmentType::ConfedSet,
            asns
        }),
    ];
    (prop::option::of(confed), prop::collection::vec(seg, 0..4)).prop_map(move |(c, mut segs)| {
        if let Some(c) = c.filter(|_| !zetta_safe) {
            segs.insert(0, c);
        }
        AsPath::new(segs)
    })
}

pub fn unicast_v4() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>()
        .prop_map(Ipv4Addr::from)
        .prop_filter("host address", |a| {
            !a.is_unspecified() && !a.is_multicast() && !a.is_broadcast()
        })
}

pub fn unicast_v6() -> impl Strategy<Value = Ipv6Addr> {
    any::<u128>()
        .prop_map(Ipv6Addr::from)
        .prop_filter("host address", |a| !a.is_unspecified() && !a.is_multicast())
}

pub fn v4_prefix() -> impl Strategy<Value = Ipv4Prefix> {
    (any::<u32>(), 0u8..=32).prop_map(|(a, l)| Ipv4Prefix::new(a.into(), l).unwrap())
}

pub fn v6_prefix() -> impl Strategy<Value = Ipv6Prefix> {
    (any::<u128>(), 0u8..=128).prop_map(|(a, l)| Ipv6Prefix::new(a.into(), l).unwrap())
}

pub const KNOWN_ATTRS: [u8; 16] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 14, 15, 16, 17, 18, 32];

pub fn unknown_attrs(zetta_safe: bool) -> impl Strategy<Value = Vec<RawAttribute>> {
    let codes: Vec<u8> = if zetta_safe {
        (40..=127).collect()
    } else {
        (0..=255).filter(|c| !KNOWN_ATTRS.contains(c)).collect()
    };
    prop::collection::btree_map(
        select(codes),
        prop::collection::vec(any::<u8>(), 0..300),
        0..3,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(type_code, value)| RawAttribute {
                flags: 0xE0,
                type_code,
                value,
            })
            .collect()
    })
}

pub fn dedup<T: PartialEq + Clone>(v: Vec<T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

pub fn attributes(four_octet: bool, zetta_safe: bool) -> impl Strategy<Value = PathAttributes> {
    (
        (
            select(vec![Origin::Igp, Origin::Egp, Origin::Incomplete]),
            as_path(four_octet, zetta_safe),
            prop::option::of(unicast_v4()),
            prop::option::of(any::<u32>()),
            prop::option::of(any::<u32>()),
            any::<bool>(),
            prop::option::of((asn(), any::<u32>())),
        ),
        (
            prop::collection::vec(any::<u32>(), 0..20),
            prop::option::of(any::<u32>()),
            prop::collection::vec(any::<u32>(), 0..5),
            prop::collection::vec(any::<[u8; 8]>(), 0..5),
            prop::collection::vec(any::<(u32, u32, u32)>(), 0..5),
            unknown_attrs(zetta_safe),
        ),
    )
        .prop_map(
            |(
                (origin, path, nh, med, lp, atomic, agg),
                (comms, orig, clusters, ext, large, unknown),
            )| {
                PathAttributes {
                    origin: Some(origin),
                    as_path: Some(path),
                    next_hop: nh,
                    med,
                    local_pref: lp,
                    atomic_aggregate: atomic,
                    aggregator: agg.map(|(asn, a)| Aggregator {
                        asn,
                        addr: a.into(),
                    }),
                    communities: comms.into_iter().map(Community).collect(),
                    originator_id: orig.map(Ipv4Addr::from),
                    cluster_list: clusters.into_iter().map(Ipv4Addr::from).collect(),
                    ext_communities: ext.into_iter().map(ExtCommunity).collect(),
                    large_communities: dedup(
                        large
                            .into_iter()
                            .map(|(g, l1, l2)| LargeCommunity {
                                global_admin: g,
                                local1: l1,
                                local2: l2,
                            })
                            .collect(),
                    ),
                    unknown,
                    mp_next_hop: None,
                }
            },
        )
}

pub fn next_hop_v6() -> impl Strategy<Value = NextHop> {
    (unicast_v6(), prop::option::of(any::<u128>())).prop_map(|(global, ll)| NextHop::V6 {
        global,
        link_local: ll.map(Ipv6Addr::from),
    })
}

pub fn mp_reach() -> impl Strategy<Value = MpReach> {
    prop_oneof![
        (next_hop_v6(), prop::collection::vec(v6_prefix(), 0..40)).prop_map(|(next_hop, v)| {
            MpReach {
                next_hop,
                nlri: MpNlri::Ipv6(v),
            }
        }),
        (
            prop_oneof![unicast_v4().prop_map(NextHop::V4), next_hop_v6()],
            prop::collection::vec(v4_prefix(), 0..40)
        )
            .prop_map(|(next_hop, v)| MpReach {
                next_hop,
                nlri: MpNlri::Ipv4(v)
            }),
    ]
}

pub fn mp_unreach() -> impl Strategy<Value = MpUnreach> {
    prop_oneof![
        prop::collection::vec(v6_prefix(), 0..40).prop_map(|v| MpUnreach {
            withdrawn: MpNlri::Ipv6(v)
        }),
        prop::collection::vec(v4_prefix(), 0..40).prop_map(|v| MpUnreach {
            withdrawn: MpNlri::Ipv4(v)
        }),
    ]
}

pub fn update(four_octet: bool, zetta_safe: bool) -> impl Strategy<Value = Update> {
    (
        prop::collection::vec(v4_prefix(), 0..60),
        attributes(four_octet, zetta_safe),
        prop::collection::vec(v4_prefix(), 0..60),
        unicast_v4(),
        prop::option::of(mp_reach()),
        prop::option::of(mp_unreach()),
    )
        .prop_map(
            |(withdrawn, mut attributes, nlri, nh, mp_reach, mp_unreach)| {
                // Routes in the NLRI field need a NEXT_HOP (or they would be withdrawn).
                if !nlri.is_empty() && attributes.next_hop.is_none() {
                    attributes.next_hop = Some(nh);
                }
                Update {
                    withdrawn,
                    attributes,
                    nlri,
                    mp_reach,
                    mp_unreach,
                }
            },
        )
}

pub fn capability() -> impl Strategy<Value = Capability> {
    let known = [1u8, 2, 5, 6, 64, 65, 70];
    let codes: Vec<u8> = (0..=255).filter(|c| !known.contains(c)).collect();
    let family = (any::<u16>(), any::<u8>()).prop_map(|(a, s)| Family::new(Afi(a), Safi(s)));
    prop_oneof![
        family.clone().prop_map(Capability::Multiprotocol),
        Just(Capability::RouteRefresh),
        Just(Capability::ExtendedMessage),
        Just(Capability::EnhancedRouteRefresh),
        prop::collection::vec(any::<(u16, u16, u16)>(), 0..4).prop_map(|v| {
            Capability::ExtendedNextHop(
                v.into_iter()
                    .map(|(a, s, n)| ExtNextHop {
                        nlri_afi: Afi(a),
                        nlri_safi: s,
                        next_hop_afi: Afi(n),
                    })
                    .collect(),
            )
        }),
        (
            any::<bool>(),
            any::<bool>(),
            0u16..4096,
            prop::collection::vec((family, any::<bool>()), 0..5)
        )
            .prop_map(|(restarting, notification, restart_time, fams)| {
                Capability::GracefulRestart(GracefulRestart {
                    restarting,
                    notification,
                    restart_time,
                    families: fams
                        .into_iter()
                        .map(|(family, f)| GrFamily {
                            family,
                            forwarding_preserved: f,
                        })
                        .collect(),
                })
            }),
        (1u32..).prop_map(|a| Capability::FourOctetAs(Asn(a))),
        (select(codes), prop::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(code, value)| Capability::Unknown { code, value }),
    ]
}

pub fn open() -> impl Strategy<Value = Open> {
    (
        1u16..,
        prop_oneof![Just(0u16), 3u16..],
        1u32..,
        prop::collection::vec(capability(), 0..12),
    )
        .prop_map(|(my_as, hold_time, id, capabilities)| Open {
            my_as,
            hold_time,
            bgp_id: Ipv4Addr::from(id),
            capabilities,
        })
}
