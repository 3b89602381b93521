use super::*;

fn pool(cidr: &str) -> IpPool {
    IpPool::new("p", cidr.parse().unwrap())
}

#[test]
fn validation_names_the_field() {
    let mut p = pool("172.20.0.1/16");
    assert!(matches!(
        p.validate(),
        Err(ResourceError::InvalidArgument { field: "cidr", .. })
    ));
    p = pool("172.20.0.0/16");
    p.validate().unwrap();
    for (size, ok) in [(19, false), (20, true), (32, true), (33, false)] {
        p.block_size = size;
        assert_eq!(p.validate().is_ok(), ok, "block size {size}");
    }
    let mut v6 = pool("fd00::/48");
    assert_eq!(v6.block_size, 122);
    v6.validate().unwrap();
    for (size, ok) in [
        (115, false),
        (116, true),
        (128, true),
        (129, false),
        (64, false),
    ] {
        v6.block_size = size;
        assert_eq!(v6.validate().is_ok(), ok, "block size {size}");
    }
    // The message names the field, the family and its range.
    for (cidr, size, family, range) in [
        ("fd00::/48", 64, "IPv6", "/116 to /128 (default /122)"),
        ("fd00::/48", 26, "IPv6", "/116 to /128 (default /122)"),
        ("10.0.0.0/16", 33, "IPv4", "/20 to /32 (default /26)"),
        ("10.0.0.0/16", 122, "IPv4", "/20 to /32 (default /26)"),
    ] {
        let mut p = pool(cidr);
        p.block_size = size;
        let e = p.validate().unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "invalid block_size: /{size} is out of range for an {family} pool: blocks are {range}"
            )
        );
    }
    let mut both = pool("10.0.0.0/16");
    both.vxlan_mode = EncapMode::Always;
    both.ipip_mode = EncapMode::CrossSubnet;
    assert!(matches!(
        both.validate(),
        Err(ResourceError::InvalidArgument {
            field: "ipip_mode",
            ..
        })
    ));
    let mut sel = pool("10.0.0.0/16");
    sel.node_selector = "zone = 'a'".into();
    let e = sel.validate().unwrap_err().to_string();
    assert!(
        e.contains("node_selector") && e.contains("position 5"),
        "{e}"
    );
    assert!(pool("169.254.0.0/16").validate().is_err());
    let mut bad = pool("10.0.0.0/16");
    bad.name = "Bad_Name".into();
    assert!(bad.validate().is_err());
}

#[test]
fn blocks_of_a_pool() {
    let p = pool("172.20.0.0/16");
    assert_eq!(p.block_count(), 1024);
    assert_eq!(p.block_at(0).to_string(), "172.20.0.0/26");
    assert_eq!(p.block_at(5).to_string(), "172.20.1.64/26");
    assert_eq!(p.block_at(1023).to_string(), "172.20.255.192/26");
    assert_eq!(
        p.block_of("172.20.1.77".parse().unwrap())
            .unwrap()
            .to_string(),
        "172.20.1.64/26"
    );
    assert_eq!(p.block_of("10.0.0.1".parse().unwrap()), None);
    let v6 = pool("fd00:1::/120");
    assert_eq!(v6.block_count(), 4);
    assert_eq!(v6.block_at(3).to_string(), "fd00:1::c0/122");
}

#[test]
fn a_bgp_peer_may_be_ipv6_but_not_link_local() {
    let global = BgpPeer::new("tor6", "", "fd00:99:1::1".parse().unwrap(), 65000);
    global.validate().unwrap();
    let ll = BgpPeer::new("tor6", "", "fe80::1".parse().unwrap(), 65000);
    match ll.validate() {
        Err(ResourceError::InvalidArgument { field, reason }) => {
            assert_eq!(field, "peer_address");
            assert!(reason.contains("link-local"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_bgp_peers_bfd_is_checked_and_optional_in_storage() {
    let mut p = BgpPeer::new("tor", "", "10.0.0.254".parse().unwrap(), 65000);
    // Stored without the field: it reads back as no BFD (older resources stay valid).
    let json = serde_json::to_string(&p).unwrap();
    assert!(!json.contains("bfd"), "{json}");
    p.bfd = Some(BgpPeerBfd {
        min_rx_ms: 100,
        min_tx_ms: 100,
        multiplier: 3,
    });
    p.validate().unwrap();
    let back: BgpPeer = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
    for (bfd, want) in [
        ((9, 100, 3), "bfd.min_rx_ms"),
        ((100, 5, 3), "bfd.min_tx_ms"),
        ((100, 100, 0), "bfd.multiplier"),
        ((100, 100, 256), "bfd.multiplier"),
    ] {
        p.bfd = Some(BgpPeerBfd {
            min_rx_ms: bfd.0,
            min_tx_ms: bfd.1,
            multiplier: bfd.2,
        });
        match p.validate() {
            Err(ResourceError::InvalidArgument { field, .. }) => assert_eq!(field, want, "{bfd:?}"),
            other => panic!("{bfd:?}: {other:?}"),
        }
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn rule(cidr: &str, op: MatchOperator, action: FilterAction) -> BgpFilterRule {
    BgpFilterRule {
        cidr: Some(net(cidr)),
        match_operator: Some(op),
        ..BgpFilterRule::new(action)
    }
}

/// Calico's documented shape: accept 10.0.0.0/16 and what is in it, reject everything else.
fn filter() -> BgpFilter {
    BgpFilter {
        name: "export-pods".into(),
        export_v4: vec![
            rule("10.0.0.0/16", MatchOperator::In, FilterAction::Accept),
            BgpFilterRule::new(FilterAction::Reject),
        ],
        import_v6: vec![BgpFilterRule {
            prefix_length_min: Some(48),
            prefix_length_max: Some(64),
            source: Some(FilterSource::RemotePeers),
            interface: Some("eth*.calico".into()),
            ..rule("fd00::/8", MatchOperator::NotIn, FilterAction::Reject)
        }],
        ..Default::default()
    }
}

/// The path of the refused field, and the full error as ResourceError prints it.
fn filter_refusal(f: &BgpFilter) -> (String, String) {
    let e = f.check().unwrap_err();
    let ipam = ResourceError::from(e.clone());
    assert_eq!(f.validate().unwrap_err(), ipam);
    (e.path, ipam.to_string())
}

#[test]
fn a_calico_shaped_bgp_filter_is_valid_and_stores() {
    let f = filter();
    f.validate().unwrap();
    let json = serde_json::to_string(&f).unwrap();
    assert!(!json.contains("prefix_length_min\":null"), "{json}");
    let back: BgpFilter = serde_json::from_str(&json).unwrap();
    assert_eq!(back, f);
    // The bare minimum: a name (Calico accepts a filter without rules).
    BgpFilter {
        name: "empty".into(),
        ..Default::default()
    }
    .validate()
    .unwrap();
}

#[expect(
    clippy::too_many_lines,
    reason = "a table of one refused change per field of a rule, each with the path it must name"
)]
#[test]
fn bgp_filter_rules_are_checked_by_path() {
    type Change = Box<dyn Fn(&mut BgpFilter)>;
    let cases: Vec<(Change, &str, &str)> = vec![
        (
            Box::new(|f| f.name = "Bad_Name".into()),
            "name",
            "is not a valid name",
        ),
        (
            Box::new(|f| f.export_v4[0].cidr = Some(net("10.0.0.1/16"))),
            "exportV4[0].cidr",
            "10.0.0.1/16 is not a network address: its network is 10.0.0.0/16",
        ),
        (
            Box::new(|f| f.export_v4[0].match_operator = None),
            "exportV4[0].matchOperator",
            "required with cidr",
        ),
        (
            Box::new(|f| f.export_v4[1].match_operator = Some(MatchOperator::Equal)),
            "exportV4[1].cidr",
            "required with matchOperator",
        ),
        (
            Box::new(|f| f.export_v4[1].prefix_length_min = Some(24)),
            "exportV4[1].prefixLength.min",
            "needs cidr",
        ),
        (
            Box::new(|f| f.export_v4[0].prefix_length_max = Some(33)),
            "exportV4[0].prefixLength.max",
            "33 is above 32, the longest IPv4 prefix",
        ),
        (
            Box::new(|f| f.import_v6[0].prefix_length_max = Some(129)),
            "importV6[0].prefixLength.max",
            "129 is above 128",
        ),
        (
            Box::new(|f| {
                f.export_v4[0].prefix_length_min = Some(28);
                f.export_v4[0].prefix_length_max = Some(24);
            }),
            "exportV4[0].prefixLength",
            "min 28 is above max 24",
        ),
        (
            Box::new(|f| f.export_v4[0].cidr = Some(net("fd00::/8"))),
            "exportV4[0].cidr",
            "fd00::/8 is IPv6, in an IPv4 list (exportV4)",
        ),
        (
            Box::new(|f| f.import_v6[0].cidr = Some(net("10.0.0.0/8"))),
            "importV6[0].cidr",
            "10.0.0.0/8 is IPv4, in an IPv6 list (importV6)",
        ),
        (
            Box::new(|f| f.import_v6[0].interface = Some(String::new())),
            "importV6[0].interface",
            "is not an interface name",
        ),
        (
            Box::new(|f| f.import_v6[0].interface = Some("a-very-long-name0".into())),
            "importV6[0].interface",
            "1-15 characters",
        ),
        (
            Box::new(|f| f.import_v6[0].interface = Some("eth 0".into())),
            "importV6[0].interface",
            "is not an interface name",
        ),
        (
            Box::new(|f| {
                f.export_v4
                    .push(rule("10.0.0.0/16", MatchOperator::In, FilterAction::Accept))
            }),
            "exportV4[2]",
            "the same rule as exportV4[0]",
        ),
    ];
    for (change, path, reason) in cases {
        let mut f = filter();
        change(&mut f);
        let (got, text) = filter_refusal(&f);
        assert_eq!(got, path, "{text}");
        assert!(text.contains(reason), "{path}: {text}");
        if path != "name" {
            assert!(
                text.starts_with(&format!("invalid {}: {path}: ", &path[..8])),
                "{text}"
            );
        }
    }
    // Not duplicates: the same CIDR with another operator or action, or in another list.
    let mut f = filter();
    f.export_v4.push(rule(
        "10.0.0.0/16",
        MatchOperator::Equal,
        FilterAction::Accept,
    ));
    f.export_v4
        .push(rule("10.0.0.0/16", MatchOperator::In, FilterAction::Reject));
    f.import_v4
        .push(rule("10.0.0.0/16", MatchOperator::In, FilterAction::Accept));
    f.validate().unwrap();
    // Bounds at their limits, and a wildcard interface.
    let mut f = filter();
    f.export_v4[0].prefix_length_min = Some(0);
    f.export_v4[0].prefix_length_max = Some(32);
    f.export_v4[1].interface = Some("*".into());
    f.import_v6[0].prefix_length_max = Some(128);
    f.validate().unwrap();
}

fn config() -> BgpConfiguration {
    BgpConfiguration {
        service_cluster_ips: vec![net("10.96.0.0/12"), net("fd00:96::/108")],
        service_external_ips: vec![net("104.244.42.129/32"), net("172.217.3.0/24")],
        service_load_balancer_ips: vec![net("192.0.2.0/24")],
        communities: vec![
            CommunityDef {
                name: "bgp-large-community".into(),
                value: "63400:300:100".into(),
            },
            CommunityDef {
                name: "no-export".into(),
                value: "65535:65281".into(),
            },
        ],
        prefix_advertisements: vec![
            PrefixAdvertisement {
                cidr: net("172.218.4.0/26"),
                communities: vec!["bgp-large-community".into(), "63400:120".into()],
            },
            PrefixAdvertisement {
                cidr: net("fd00:1::/64"),
                communities: vec!["no-export".into()],
            },
        ],
        ..Default::default()
    }
}

fn config_refusal(c: &BgpConfiguration) -> (String, String) {
    let e = c.check().unwrap_err();
    assert_eq!(c.validate().unwrap_err(), ResourceError::from(e.clone()));
    (e.path.clone(), e.to_string())
}

#[expect(
    clippy::too_many_lines,
    reason = "every service-CIDR and community rule of the BGP configuration, accepted and refused, in one table"
)]
#[test]
fn bgp_configuration_services_and_communities() {
    let c = config();
    c.validate().unwrap();
    let back: BgpConfiguration = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    // Stored before these fields existed: they read back empty.
    let old: BgpConfiguration = serde_json::from_str(r#"{"as_number":64600}"#).unwrap();
    assert!(old.service_cluster_ips.is_empty() && old.communities.is_empty());
    assert_eq!(
        c.community("bgp-large-community"),
        Some(CommunityValue::Large(63400, 300, 100))
    );
    assert_eq!(
        c.community("63400:120"),
        Some(CommunityValue::Standard(63400, 120))
    );
    assert_eq!(c.community("nope"), None);

    type Change = Box<dyn Fn(&mut BgpConfiguration)>;
    let cases: Vec<(Change, &str, &str)> = vec![
        (
            Box::new(|c| c.service_cluster_ips[0] = net("10.96.0.1/12")),
            "service_cluster_ips[0]",
            "its network is 10.96.0.0/12",
        ),
        (
            Box::new(|c| c.service_external_ips.push(net("172.217.3.128/25"))),
            "service_external_ips[2]",
            "172.217.3.128/25 overlaps service_external_ips[1] (172.217.3.0/24)",
        ),
        (
            Box::new(|c| c.service_load_balancer_ips.push(net("192.0.2.0/24"))),
            "service_load_balancer_ips[1]",
            "overlaps service_load_balancer_ips[0]",
        ),
        (
            Box::new(|c| c.communities[1].name = "".into()),
            "communities[1].name",
            "required",
        ),
        (
            Box::new(|c| c.communities[1].name = "bgp-large-community".into()),
            "communities[1].name",
            "is already communities[0]'s name",
        ),
        (
            Box::new(|c| c.communities[0].value = "65536:1".into()),
            "communities[0].value",
            "is not a community",
        ),
        (
            Box::new(|c| c.communities[0].value = "1:2:4294967296".into()),
            "communities[0].value",
            "each 0-4294967295",
        ),
        (
            Box::new(|c| c.communities[0].value = "1:2:3:4".into()),
            "communities[0].value",
            "\"1:2:3:4\" is not a community: aa:nn (standard",
        ),
        (
            Box::new(|c| c.communities[0].value = "1:-2".into()),
            "communities[0].value",
            "is not a community",
        ),
        (
            Box::new(|c| c.communities[0].value = "100".into()),
            "communities[0].value",
            "is not a community",
        ),
        (
            Box::new(|c| {
                c.prefix_advertisements[1]
                    .communities
                    .push("unknown".into())
            }),
            "prefix_advertisements[1].communities[1]",
            "\"unknown\" is neither the name of one of communities nor a community value",
        ),
        (
            Box::new(|c| c.prefix_advertisements[0].communities[1] = "63400:70000".into()),
            "prefix_advertisements[0].communities[1]",
            "neither",
        ),
        (
            Box::new(|c| c.prefix_advertisements[0].cidr = net("172.218.4.1/26")),
            "prefix_advertisements[0].cidr",
            "not a network address",
        ),
        (
            Box::new(|c| {
                c.communities = (0..501)
                    .map(|i| CommunityDef {
                        name: format!("c{i}"),
                        value: format!("1:{i}"),
                    })
                    .collect()
            }),
            "communities",
            "501 communities: at most 500",
        ),
        (
            Box::new(|c| {
                c.prefix_advertisements = (0..501)
                    .map(|i| PrefixAdvertisement {
                        cidr: net(&format!("10.{}.{}.0/24", i / 256, i % 256)),
                        communities: vec![],
                    })
                    .collect()
            }),
            "prefix_advertisements",
            "501 prefix advertisements: at most 500",
        ),
        (
            Box::new(|c| {
                c.prefix_advertisements[0].communities = (0..51).map(|i| format!("1:{i}")).collect()
            }),
            "prefix_advertisements[0].communities",
            "51 communities: at most 50 per prefix",
        ),
        (
            Box::new(|c| c.as_number = AS_TRANS),
            "as_number",
            "AS_TRANS",
        ),
    ];
    for (change, path, reason) in cases {
        let mut c = config();
        change(&mut c);
        let (got, text) = config_refusal(&c);
        assert_eq!(got, path, "{text}");
        assert!(text.contains(reason), "{path}: {text}");
    }
    // At the limits.
    let mut c = config();
    c.communities = (0..500)
        .map(|i| CommunityDef {
            name: format!("c{i}"),
            value: format!("4294967295:{i}:0"),
        })
        .collect();
    c.prefix_advertisements = vec![PrefixAdvertisement {
        cidr: net("10.0.0.0/8"),
        communities: (0..50).map(|i| format!("c{i}")).collect(),
    }];
    c.validate().unwrap();
    assert_eq!(
        "65535:0".parse::<CommunityValue>(),
        Ok(CommunityValue::Standard(65535, 0))
    );
    // The same CIDR in two lists is fine (Calico allows it); one family or both.
    let mut c = config();
    c.service_external_ips.push(net("10.96.0.0/12"));
    c.validate().unwrap();
}

#[test]
fn bgp_peer_calico_session_options() {
    let mut p = BgpPeer::new("tor", "", "10.0.0.254".parse().unwrap(), 65000);
    p.filters = vec!["export-pods".into(), "import-default".into()];
    p.next_hop_mode = NextHopMode::SelfNextHop;
    p.local_as_number = Some(64999);
    p.num_allowed_local_as_numbers = 2;
    p.max_restart_time_s = Some(120);
    p.reachable_by = Some("10.0.0.1".parse().unwrap());
    p.validate().unwrap();
    let json = serde_json::to_string(&p).unwrap();
    assert!(json.contains("\"next_hop_mode\":\"Self\""), "{json}");
    assert_eq!(serde_json::from_str::<BgpPeer>(&json).unwrap(), p);
    // A peer stored before these fields existed reads back with their defaults.
    let old: BgpPeer = serde_json::from_str(
        r#"{"name":"tor","peer_address":"10.0.0.254","as_number":65000,"port":0,"passive":false,
            "password":"","ttl_security_hops":0,"keepalive_time_s":0,"hold_time_s":0,"max_prefixes":0}"#,
    )
    .unwrap();
    assert_eq!(old.next_hop_mode, NextHopMode::Auto);
    assert!(old.filters.is_empty() && old.reachable_by.is_none());

    type Change = Box<dyn Fn(&mut BgpPeer)>;
    let cases: Vec<(Change, &str, &str)> = vec![
        (
            Box::new(|p| p.filters[1] = "Not_A_Name".into()),
            "filters[1]",
            "is not a valid name",
        ),
        (
            Box::new(|p| p.local_as_number = Some(0)),
            "local_as_number",
            "reserved",
        ),
        (
            Box::new(|p| p.local_as_number = Some(AS_TRANS)),
            "local_as_number",
            "AS_TRANS",
        ),
        (
            Box::new(|p| p.max_restart_time_s = Some(0)),
            "max_restart_time_s",
            "outside 1-4095",
        ),
        (
            Box::new(|p| p.max_restart_time_s = Some(4096)),
            "max_restart_time_s",
            "12 bits",
        ),
        (
            Box::new(|p| p.reachable_by = Some("fd00::1".parse().unwrap())),
            "reachable_by",
            "fd00::1 is IPv6, the peer address 10.0.0.254 is IPv4",
        ),
        (
            Box::new(|p| p.reachable_by = Some("224.0.0.1".parse().unwrap())),
            "reachable_by",
            "not a unicast address",
        ),
        (
            Box::new(|p| p.reachable_by = Some("0.0.0.0".parse().unwrap())),
            "reachable_by",
            "not a unicast address",
        ),
        (
            Box::new(|p| p.reachable_by = Some("10.0.0.254".parse().unwrap())),
            "reachable_by",
            "the peer itself",
        ),
    ];
    for (change, path, reason) in cases {
        let mut q = p.clone();
        change(&mut q);
        let e = q.check().unwrap_err();
        assert_eq!(q.validate().unwrap_err(), ResourceError::from(e.clone()));
        assert_eq!(e.path, path, "{e}");
        assert!(e.to_string().contains(reason), "{path}: {e}");
    }
    let mut v6 = BgpPeer::new("tor6", "", "fd00:99::1".parse().unwrap(), 65000);
    v6.reachable_by = Some("fd00:99::fffe".parse().unwrap());
    v6.validate().unwrap();
}
