use super::*;

fn pool(cidr: &str) -> IpPool {
    IpPool::new("p", cidr.parse().unwrap())
}

#[test]
fn validation_names_the_field() {
    let mut p = pool("172.20.0.1/16");
    assert!(matches!(
        p.validate(),
        Err(IpamError::InvalidArgument { field: "cidr", .. })
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
        Err(IpamError::InvalidArgument {
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
        Err(IpamError::InvalidArgument { field, reason }) => {
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
            Err(IpamError::InvalidArgument { field, .. }) => assert_eq!(field, want, "{bfd:?}"),
            other => panic!("{bfd:?}: {other:?}"),
        }
    }
}
