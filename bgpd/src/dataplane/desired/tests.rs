use super::*;
use crate::dataplane::item::{KernelRoute, Via};
use ::datastore::model::Node;
use std::collections::BTreeMap;

fn node(name: &str, ip: &str, tunnel: &str) -> Node {
    let mut n = Node::new(name);
    n.ipv4 = Some(ip.parse().unwrap());
    n.vxlan_tunnel_address = Some(tunnel.parse().unwrap());
    n.vxlan_tunnel_mac = Some(format!("66:00:00:00:00:{:02x}", name.len()));
    n
}

fn block(cidr: &str, owner: Option<&str>) -> (Block, Option<BlockAffinity>) {
    let cidr: IpNet = cidr.parse().unwrap();
    let b = Block::new(cidr, "default", owner, 0);
    let a = owner.map(|o| BlockAffinity {
        node: o.into(),
        cidr,
        state: AffinityState::Confirmed,
    });
    (b, a)
}

fn kernel_route(d: &Desired, dest: &str) -> Option<KernelRoute> {
    match d.get(&ItemKey::Route(dest.parse().unwrap()))? {
        DesiredItem::Route(r) => Some(r.clone()),
        _ => None,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct World {
    nodes: Vec<Node>,
    pools: Vec<IpPool>,
    blocks: Vec<Block>,
    affinities: Vec<BlockAffinity>,
    peer_gateways: Vec<(std::net::IpAddr, std::net::IpAddr, String)>,
}

impl World {
    fn new(mode: EncapMode) -> Self {
        let mut pool = IpPool::new("default", "172.20.0.0/16".parse().unwrap());
        pool.vxlan_mode = mode;
        pool.nat_outgoing = true;
        let mut w = World {
            nodes: vec![
                node("a", "10.0.0.1/24", "172.20.0.1"),
                node("b", "10.0.0.2/24", "172.20.0.65"),
                node("d", "10.0.1.4/24", "172.20.0.129"),
            ],
            pools: vec![pool],
            blocks: vec![],
            affinities: vec![],
            peer_gateways: vec![],
        };
        for (cidr, owner) in [
            ("172.20.0.0/26", "a"),
            ("172.20.0.64/26", "b"),
            ("172.20.0.128/26", "d"),
        ] {
            let (b, a) = block(cidr, Some(owner));
            w.blocks.push(b);
            w.affinities.extend(a);
        }
        w
    }
    fn compute(&self, me: &str) -> Desired {
        compute(&Inputs {
            me,
            nodes: &self.nodes,
            pools: &self.pools,
            blocks: &self.blocks,
            affinities: &self.affinities,
            peer_gateways: &self.peer_gateways,
        })
    }
}

#[test]
fn cross_subnet_is_direct_in_the_subnet_and_vxlan_beyond() {
    let w = World::new(EncapMode::CrossSubnet);
    let d = w.compute("a");
    let own = kernel_route(&d, "172.20.0.0/26").unwrap();
    assert_eq!(own.via, Via::Blackhole);
    let same = kernel_route(&d, "172.20.0.64/26").unwrap();
    assert_eq!(same.via, Via::Gateway(ip("10.0.0.2")));
    let other = kernel_route(&d, "172.20.0.128/26").unwrap();
    assert_eq!(other.via, Via::Vxlan(ip("172.20.0.129")));
    assert!(
        d.contains_key(&ItemKey::Vtep("b".into(), IpFamily::V4))
            && d.contains_key(&ItemKey::Vtep("d".into(), IpFamily::V4))
    );
    assert!(d.contains_key(&ItemKey::LocalVtep(IpFamily::V4)));
    assert!(!d.contains_key(&ItemKey::Vtep("a".into(), IpFamily::V4)));
    // Both ways: d sees a and b over VXLAN.
    let from_d = w.compute("d");
    assert_eq!(
        kernel_route(&from_d, "172.20.0.0/26").unwrap().via,
        Via::Vxlan(ip("172.20.0.1"))
    );
    assert_eq!(
        kernel_route(&from_d, "172.20.0.64/26").unwrap().via,
        Via::Vxlan(ip("172.20.0.65"))
    );
}

/// The IPv6 side of a dual-stack cluster: the same world with an IPv6 pool beside the
/// IPv4 one, every node with an IPv6 address and VTEP.
fn dual_stack(mode: EncapMode) -> World {
    let mut w = World::new(mode);
    let mut pool = IpPool::new("default-v6", "fd00:20::/48".parse().unwrap());
    pool.vxlan_mode = mode;
    pool.nat_outgoing = true;
    w.pools.push(pool);
    for (n, (addr, tunnel)) in w.nodes.iter_mut().zip([
        ("fd00:10::1/64", "fd00:20::1"),
        ("fd00:10::2/64", "fd00:20::41"),
        ("fd00:11::4/64", "fd00:20::81"),
    ]) {
        n.ipv6 = Some(addr.parse().unwrap());
        let mac = format!("66:00:00:00:06:{:02x}", n.name.len());
        n.set_vxlan_tunnel(IpFamily::V6, Some((tunnel.parse().unwrap(), mac)));
    }
    for (cidr, owner) in [
        ("fd00:20::/122", "a"),
        ("fd00:20::40/122", "b"),
        ("fd00:20::80/122", "d"),
    ] {
        let (b, a) = block(cidr, Some(owner));
        w.blocks.push(b);
        w.affinities.extend(a);
    }
    w
}

#[test]
fn ipv6_cross_subnet_follows_the_ipv6_subnets_with_a_vtep_per_family() {
    let w = dual_stack(EncapMode::CrossSubnet);
    let d = w.compute("a");
    assert_eq!(
        kernel_route(&d, "fd00:20::/122").unwrap().via,
        Via::Blackhole
    );
    let same = kernel_route(&d, "fd00:20::40/122").unwrap();
    assert_eq!(same.via, Via::Gateway(ip("fd00:10::2")));
    let other = kernel_route(&d, "fd00:20::80/122").unwrap();
    assert_eq!(other.via, Via::Vxlan(ip("fd00:20::81")));
    // The IPv4 side is unchanged.
    assert_eq!(
        kernel_route(&d, "172.20.0.64/26").unwrap().via,
        Via::Gateway(ip("10.0.0.2"))
    );
    for f in IpFamily::ALL {
        assert!(d.contains_key(&ItemKey::LocalVtep(f)), "{f:?}");
        assert!(d.contains_key(&ItemKey::Vtep("d".into(), f)), "{f:?}");
    }
    let Some(DesiredItem::Vtep(v6)) = d.get(&ItemKey::Vtep("d".into(), IpFamily::V6)) else {
        panic!("no IPv6 VTEP of d");
    };
    assert_eq!(
        (v6.underlay_address, v6.tunnel_address),
        (ip("fd00:11::4"), ip("fd00:20::81"))
    );
    let Some(DesiredItem::LocalVtep(mine)) = d.get(&ItemKey::LocalVtep(IpFamily::V6)) else {
        panic!("no local IPv6 VTEP");
    };
    assert_eq!(mine.underlay_address, ip("fd00:10::1"));
    assert!(d.contains_key(&ItemKey::NatPool("fd00:20::/48".parse().unwrap())));
}

#[test]
fn an_ipv6_block_is_not_routed_to_a_node_without_an_ipv6_vtep() {
    let mut w = dual_stack(EncapMode::Always);
    w.nodes[2].set_vxlan_tunnel(IpFamily::V6, None);
    let d = w.compute("a");
    assert!(kernel_route(&d, "fd00:20::80/122").is_none());
    assert!(!d.contains_key(&ItemKey::Vtep("d".into(), IpFamily::V6)));
    // Its IPv4 VTEP stays.
    assert!(d.contains_key(&ItemKey::Vtep("d".into(), IpFamily::V4)));
    // And a VXLAN pool of one family makes no device of the other.
    let mut w = dual_stack(EncapMode::Never);
    w.pools[1].vxlan_mode = EncapMode::Always;
    let d = w.compute("a");
    assert!(d.contains_key(&ItemKey::LocalVtep(IpFamily::V6)));
    assert!(!d.contains_key(&ItemKey::LocalVtep(IpFamily::V4)));
}

#[test]
fn vxlan_always_tunnels_even_in_the_subnet() {
    let d = World::new(EncapMode::Always).compute("a");
    assert_eq!(
        kernel_route(&d, "172.20.0.64/26").unwrap().via,
        Via::Vxlan(ip("172.20.0.65"))
    );
}

#[test]
fn no_encapsulation_leaves_remote_blocks_to_bgp() {
    let d = World::new(EncapMode::Never).compute("a");
    assert_eq!(
        kernel_route(&d, "172.20.0.0/26").unwrap().via,
        Via::Blackhole
    );
    assert!(kernel_route(&d, "172.20.0.64/26").is_none());
    assert!(
        !d.contains_key(&ItemKey::LocalVtep(IpFamily::V4)),
        "no VXLAN pool, no VXLAN device"
    );
    assert!(d.contains_key(&ItemKey::NatPool("172.20.0.0/16".parse().unwrap())));
}

#[test]
fn pending_blocks_are_neither_blackholed_nor_routed() {
    let mut w = World::new(EncapMode::CrossSubnet);
    for a in &mut w.affinities {
        a.state = AffinityState::Pending;
    }
    let d = w.compute("a");
    assert!(
        d.keys().all(|k| !matches!(k, ItemKey::Route(_))),
        "{:?}",
        d.keys().collect::<Vec<_>>()
    );
}

#[test]
fn borrowed_addresses_get_a_host_route_to_their_holder() {
    let mut w = World::new(EncapMode::CrossSubnet);
    // d borrowed 172.20.0.70 from b's block.
    let attrs = Default::default();
    w.blocks[1]
        .allocate_addr("172.20.0.70".parse().unwrap(), "h", "d", &attrs)
        .unwrap();
    let d = w.compute("a");
    let host = kernel_route(&d, "172.20.0.70/32").unwrap();
    assert_eq!(host.via, Via::Vxlan(ip("172.20.0.129")));
    // On d itself, its own borrowed address is its workload route, not ours.
    assert!(kernel_route(&w.compute("d"), "172.20.0.70/32").is_none());
}

#[test]
fn our_workloads_get_a_host_route_on_their_interface() {
    let mut w = World::new(EncapMode::CrossSubnet);
    let attrs: BTreeMap<String, String> = [
        (
            WORKLOAD_INTERFACE.to_string(),
            "cali0123456789a".to_string(),
        ),
        ("namespace".to_string(), "default".to_string()),
        ("pod".to_string(), "web-0".to_string()),
    ]
    .into();
    w.blocks[0]
        .allocate_addr("172.20.0.5".parse().unwrap(), "h", "a", &attrs)
        .unwrap();
    // Allocated without an interface (another main plugin): no route of ours.
    w.blocks[0]
        .allocate_addr(
            "172.20.0.6".parse().unwrap(),
            "h2",
            "a",
            &Default::default(),
        )
        .unwrap();
    let r = kernel_route(&w.compute("a"), "172.20.0.5/32").unwrap();
    assert_eq!(
        (r.via, r.source.as_str()),
        (
            Via::Workload {
                device: "cali0123456789a".into()
            },
            "workload default/web-0"
        )
    );
    assert!(kernel_route(&w.compute("a"), "172.20.0.6/32").is_none());
    // Other nodes route the whole block, not the pod.
    assert!(kernel_route(&w.compute("b"), "172.20.0.5/32").is_none());
}

#[test]
fn a_mode_change_is_a_small_diff() {
    let w = World::new(EncapMode::CrossSubnet);
    let before = w.compute("a");
    let mut w2 = World::new(EncapMode::Always);
    w2.blocks = w.blocks.clone();
    let after = w2.compute("a");
    let (upsert, remove) = diff(&before, &after);
    assert_eq!(upsert.len(), 1, "only b's block changes: {upsert:?}");
    assert!(remove.is_empty());
    let (upsert, remove) = diff(&after, &after);
    assert!(upsert.is_empty() && remove.is_empty());
    let (_, remove) = diff(&after, &Desired::new());
    assert_eq!(remove.len(), after.len());
}

#[test]
fn a_peer_reachable_by_a_gateway_gets_a_route_through_it() {
    let mut w = World::new(EncapMode::Never);
    w.peer_gateways = vec![(
        "192.0.2.1".parse().unwrap(),
        "10.0.0.254".parse().unwrap(),
        "tor".into(),
    )];
    let r = kernel_route(&w.compute("a"), "192.0.2.1/32").unwrap();
    assert_eq!(
        (r.via, r.source.as_str()),
        (Via::Gateway(ip("10.0.0.254")), "BGPPeer tor reachableBy")
    );
    w.peer_gateways.clear();
    assert!(kernel_route(&w.compute("a"), "192.0.2.1/32").is_none());
}
