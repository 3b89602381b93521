//! Sample messages shared by the integration tests and the fuzz seed writer.
#![allow(dead_code)]

pub mod strategies;

use std::net::{Ipv4Addr, Ipv6Addr};

use bgp_wire::*;

pub fn v4(s: &str) -> Ipv4Prefix {
    s.parse().unwrap()
}

pub fn v6(s: &str) -> Ipv6Prefix {
    s.parse().unwrap()
}

pub fn as2() -> SessionParams {
    SessionParams {
        ipv6_unicast: true,
        ipv4_ext_next_hop: true,
        ..SessionParams::default()
    }
}

pub fn as4() -> SessionParams {
    SessionParams {
        four_octet_as: true,
        ipv6_unicast: true,
        ipv4_ext_next_hop: true,
        ..SessionParams::default()
    }
}

pub fn rich_attributes() -> PathAttributes {
    PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::new(vec![
            AsSegment {
                kind: SegmentType::Sequence,
                asns: vec![Asn(65001), Asn(4_200_000_000), Asn(65002)],
            },
            AsSegment {
                kind: SegmentType::Set,
                asns: vec![Asn(64512), Asn(64513)],
            },
        ])),
        next_hop: Some(Ipv4Addr::new(192, 0, 2, 1)),
        med: Some(50),
        local_pref: Some(200),
        atomic_aggregate: true,
        aggregator: Some(Aggregator {
            asn: Asn(4_200_000_001),
            addr: Ipv4Addr::new(10, 0, 0, 9),
        }),
        communities: vec![Community::new(65000, 100), Community::NO_EXPORT],
        originator_id: Some(Ipv4Addr::new(10, 0, 0, 2)),
        cluster_list: vec![Ipv4Addr::new(10, 0, 0, 3)],
        ext_communities: vec![ExtCommunity::route_target(65000, 7)],
        large_communities: vec![LargeCommunity {
            global_admin: 4_200_000_000,
            local1: 1,
            local2: 2,
        }],
        unknown: vec![RawAttribute {
            flags: 0xE0,
            type_code: 99,
            value: vec![1, 2, 3, 4],
        }],
        mp_next_hop: None,
    }
}

pub fn simple_attributes() -> PathAttributes {
    PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::default()),
        next_hop: Some(Ipv4Addr::new(192, 0, 2, 1)),
        local_pref: Some(100),
        ..Default::default()
    }
}

pub fn sample_open() -> Open {
    Open::new(
        Asn(4_200_000_001),
        90,
        Ipv4Addr::new(192, 0, 2, 1),
        vec![
            Capability::Multiprotocol(Family::IPV4_UNICAST),
            Capability::Multiprotocol(Family::IPV6_UNICAST),
            Capability::RouteRefresh,
            Capability::EnhancedRouteRefresh,
            Capability::ExtendedMessage,
            Capability::ExtendedNextHop(vec![ExtNextHop {
                nlri_afi: Afi::IPV4,
                nlri_safi: 1,
                next_hop_afi: Afi::IPV6,
            }]),
            Capability::GracefulRestart(GracefulRestart {
                restarting: false,
                notification: true,
                restart_time: 120,
                families: vec![GrFamily {
                    family: Family::IPV4_UNICAST,
                    forwarding_preserved: true,
                }],
            }),
            Capability::FourOctetAs(Asn(4_200_000_001)),
            Capability::Unknown {
                code: 73,
                value: b"\x04node\x00".to_vec(),
            },
        ],
    )
}

pub fn sample_updates() -> Vec<Update> {
    vec![
        Update {
            attributes: rich_attributes(),
            nlri: vec![v4("10.0.0.0/26"), v4("10.0.0.64/26"), v4("192.168.0.0/16")],
            withdrawn: vec![v4("172.16.0.0/12")],
            ..Default::default()
        },
        Update {
            attributes: simple_attributes(),
            nlri: vec![v4("10.1.0.0/26")],
            ..Default::default()
        },
        Update {
            attributes: PathAttributes {
                next_hop: None,
                ..rich_attributes()
            },
            mp_reach: Some(MpReach {
                next_hop: NextHop::V6 {
                    global: "2001:db8::1".parse().unwrap(),
                    link_local: Some("fe80::1".parse().unwrap()),
                },
                nlri: MpNlri::Ipv6(vec![v6("2001:db8:1::/48"), v6("2001:db8:2::/64")]),
            }),
            mp_unreach: Some(MpUnreach {
                withdrawn: MpNlri::Ipv6(vec![v6("2001:db8:ff::/48")]),
            }),
            ..Default::default()
        },
        Update {
            attributes: PathAttributes {
                next_hop: None,
                ..simple_attributes()
            },
            mp_reach: Some(MpReach {
                next_hop: NextHop::V6 {
                    global: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
                    link_local: None,
                },
                nlri: MpNlri::Ipv4(vec![v4("10.2.0.0/24")]),
            }),
            ..Default::default()
        },
        Update {
            withdrawn: vec![v4("10.0.0.0/26"), v4("0.0.0.0/0")],
            ..Default::default()
        },
        Update::end_of_rib(Family::IPV4_UNICAST).unwrap(),
        Update::end_of_rib(Family::IPV6_UNICAST).unwrap(),
    ]
}

pub fn sample_messages() -> Vec<Message> {
    let mut v = vec![
        Message::Open(sample_open()),
        Message::Keepalive,
        Message::Notification(Notification::new(3, 1, vec![])),
        Message::Notification(Notification::shutdown(cease::ADMIN_SHUTDOWN, "maintenance")),
        Message::RouteRefresh(RouteRefresh::new(
            Family::IPV4_UNICAST,
            RefreshSubtype::Normal,
        )),
        Message::RouteRefresh(RouteRefresh::new(
            Family::IPV6_UNICAST,
            RefreshSubtype::Begin,
        )),
    ];
    v.extend(sample_updates().into_iter().map(Message::Update));
    v
}

/// The body (after the 19-octet header) of an encoded message.
pub fn body(msg: &[u8]) -> &[u8] {
    &msg[HEADER_LEN..]
}

pub fn encode(m: &Message, s: &SessionParams) -> Vec<u8> {
    let mut out = Vec::new();
    m.encode(s, &mut out).unwrap();
    out
}
