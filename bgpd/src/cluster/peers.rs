//! Who this node peers with, from the cluster state: the node-to-node mesh, route
//! reflectors, and `BGPPeer` resources. A pure function, so every rule is tested without a
//! datastore or a socket.
//!
//! The rules (Calico's, `confd` `updatePeersV1`):
//! - mesh on: every other node, one session per family both have an address in, between
//!   those addresses (Calico's bird and bird6), named `Mesh_<address>` (`Mesh_10_0_0_2`,
//!   `Mesh_fd00__2`); each session carries its own family only; route reflector nodes take
//!   no part in the mesh;
//! - a reflector peers with every other node: nodes without its cluster id are its clients,
//!   reflectors with the same cluster id are plain iBGP peers; other nodes peer with every
//!   reflector (`Node_<address>`), also with the mesh off;
//! - `BGPPeer` resources: global ones (`Global_<address>`), then this node's (`Node_<address>`)
//!   which replace a global one for the same address; an explicit peering replaces a derived
//!   one;
//! - between two nodes both sides connect (`peer_connects`), and a refused attempt is
//!   retried only after 30 s (other failures after 5 s): of two nodes that start, the later
//!   one's attempt succeeds. Calico's templates make one side passive instead (the
//!   lexically larger address string waits), which leaves the early node retrying against
//!   a peer that is not up yet; collisions of the two connections are resolved by RFC
//!   4271's rule.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ::datastore::model::{BgpConfiguration, BgpPeer, IpFamily, NextHopMode, Node};
use bgp_wire::Asn;

use crate::speaker::sockopt::{Password, Transport};
use crate::speaker::{PeerOrigin, PeerSpec};
use bgp::policy::PeerClass;
use bgp::rib::PeerOptions;

/// BIRD's default hold time, which Calico keeps.
pub const DEFAULT_HOLD: u16 = 240;

/// The name of a peer as Calico's tools expect it: `Mesh_10_0_0_2`, `Node_10_0_0_2_port_1790`,
/// `Mesh_fd00__2`.
pub fn peer_name(kind: &str, address: IpAddr, port: u16) -> String {
    let mut n = format!("{kind}_{}", address.to_string().replace(['.', ':'], "_"));
    if port != 0 && port != 179 {
        n.push_str(&format!("_port_{port}"));
    }
    n
}

/// The AS a node speaks.
pub fn node_as(config: &BgpConfiguration, node: &Node) -> u32 {
    node.asn.unwrap_or(config.as_number)
}

fn timers(spec: &mut PeerSpec, hold: u16, keepalive: u16) {
    spec.hold_time = if hold == 0 { DEFAULT_HOLD } else { hold };
    spec.keepalive = (keepalive != 0).then_some(keepalive);
}

/// The peers node `me` must have, by address.
#[expect(
    clippy::too_many_lines,
    reason = "Calico's peering rules in one place: the node-to-node mesh, route reflection and the BGPPeer resources decide together which peers this node has"
)]
pub fn desired_peers(
    me: &str,
    config: &BgpConfiguration,
    nodes: &[Node],
    resources: &[BgpPeer],
) -> BTreeMap<IpAddr, PeerSpec> {
    let mut out = BTreeMap::new();
    let Some(my) = nodes.iter().find(|n| n.name == me) else {
        return out;
    };
    let my_addrs: Vec<IpAddr> = IpFamily::ALL
        .into_iter()
        .filter_map(|f| my.address(f).map(|a| a.addr()))
        .collect();
    if my_addrs.is_empty() {
        return out;
    }
    let my_cluster = my.route_reflector_cluster_id;
    // One session per family both nodes have an address in.
    let others = nodes
        .iter()
        .filter(|n| n.name != me)
        .flat_map(|n| {
            IpFamily::ALL.into_iter().filter_map(move |f| {
                my.address(f)?;
                Some((n, n.address(f)?.addr()))
            })
        })
        .filter(|(_, a)| !my_addrs.contains(a));

    for (node, addr) in others {
        let theirs = node.route_reflector_cluster_id;
        let (kind, origin, rr_client) = match (my_cluster, theirs) {
            (None, None) if config.node_to_node_mesh => ("Mesh", PeerOrigin::Mesh, false),
            (None, None) => continue,
            // We are a client of theirs.
            (None, Some(_)) => ("Node", PeerOrigin::RouteReflector, false),
            // Reflectors of one cluster are plain iBGP peers; anyone else is our client.
            (Some(c), Some(t)) if c == t => ("Node", PeerOrigin::RouteReflector, false),
            (Some(_), _) => ("Node", PeerOrigin::RouteReflector, true),
        };
        let mut spec = PeerSpec::new(addr, Asn(node_as(config, node)));
        spec.peer_connects = true;
        spec.origin = origin;
        spec.class = PeerClass::Cluster;
        spec.rr_client = rr_client;
        spec.label = Some(peer_name(kind, addr, 0));
        timers(&mut spec, config.hold_time_s, config.keepalive_time_s);
        out.insert(addr, spec);
    }

    for (addr, p) in effective_resources(me, resources) {
        if my_addrs.contains(&addr) {
            continue;
        }
        let is_node = nodes.iter().any(|n| {
            n.name != me
                && IpFamily::ALL
                    .into_iter()
                    .any(|f| n.address(f).is_some_and(|a| a.addr() == addr))
        });
        let mut spec = PeerSpec::new(addr, Asn(p.as_number));
        spec.port = if p.port == 0 { 179 } else { p.port };
        spec.passive = p.passive;
        spec.peer_connects = is_node;
        spec.origin = PeerOrigin::Resource;
        spec.class = if is_node {
            PeerClass::Cluster
        } else {
            PeerClass::External
        };
        spec.transport = Transport {
            password: match Password::new(&p.password) {
                Ok(pw) => pw,
                Err(e) => {
                    tracing::warn!(peer = %p.name, "BGPPeer password refused: {e}");
                    continue;
                }
            },
            ttl_security_hops: (p.ttl_security_hops != 0).then_some(p.ttl_security_hops),
            multihop_ttl: None,
        };
        spec.max_prefixes = (p.max_prefixes != 0).then_some(p.max_prefixes);
        spec.options = PeerOptions {
            local_as: p.local_as_number.map(Asn),
            allow_local_as: p.num_allowed_local_as_numbers,
            next_hop: rib_next_hop(p.next_hop_mode),
            interface: None,
        };
        if let (Some(t), Some(gr)) = (p.max_restart_time_s, spec.graceful_restart.as_mut()) {
            gr.restart_time = t;
        }
        // Validated when stored; a resource written by an older or other client is checked
        // again rather than trusted.
        spec.bfd = p.bfd.and_then(|b| {
            bfd::SessionConfig::from_ms(
                u64::from(b.min_rx_ms),
                u64::from(b.min_tx_ms),
                u64::from(b.multiplier),
            )
            .map_err(|e| tracing::warn!(peer = %p.name, "BGPPeer BFD refused: {e}"))
            .ok()
        });
        let kind = if p.node.is_empty() { "Global" } else { "Node" };
        spec.label = Some(peer_name(kind, addr, p.port));
        timers(
            &mut spec,
            if p.hold_time_s != 0 {
                p.hold_time_s
            } else {
                config.hold_time_s
            },
            if p.keepalive_time_s != 0 {
                p.keepalive_time_s
            } else {
                config.keepalive_time_s
            },
        );
        out.insert(addr, spec);
    }
    out
}

/// The `BGPPeer` resource that decides each address for node `me`: a global one, replaced by
/// this node's own for the same address (the one with the last name, where several are).
pub fn effective_resources<'a>(
    me: &str,
    resources: &'a [BgpPeer],
) -> BTreeMap<IpAddr, &'a BgpPeer> {
    let mut explicit: Vec<&BgpPeer> = resources
        .iter()
        .filter(|p| p.node.is_empty() || p.node == me)
        .collect();
    // Global first, then by name: the last one collected for an address is left.
    explicit.sort_by_key(|p| (!p.node.is_empty(), p.name.clone()));
    explicit.into_iter().map(|p| (p.peer_address, p)).collect()
}

/// The speaker's next-hop mode for a `BGPPeer`'s (the one mapping between the resource's
/// enum and the RIB's; the API's goes through the resource's).
pub fn rib_next_hop(m: NextHopMode) -> bgp::rib::NextHopMode {
    match m {
        NextHopMode::Auto => bgp::rib::NextHopMode::Auto,
        NextHopMode::SelfNextHop => bgp::rib::NextHopMode::SelfNextHop,
        NextHopMode::Keep => bgp::rib::NextHopMode::Keep,
    }
}

/// The reverse of [`rib_next_hop`], for showing a session's mode.
pub fn model_next_hop(m: bgp::rib::NextHopMode) -> NextHopMode {
    match m {
        bgp::rib::NextHopMode::Auto => NextHopMode::Auto,
        bgp::rib::NextHopMode::SelfNextHop => NextHopMode::SelfNextHop,
        bgp::rib::NextHopMode::Keep => NextHopMode::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ip: &str) -> Node {
        let mut n = Node::new(name);
        n.ipv4 = Some(format!("{ip}/24").parse().unwrap());
        n
    }

    fn rr(mut n: Node, cluster: &str) -> Node {
        n.route_reflector_cluster_id = Some(cluster.parse().unwrap());
        n
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn names(p: &BTreeMap<IpAddr, PeerSpec>) -> Vec<String> {
        p.values().map(PeerSpec::name).collect()
    }

    fn three() -> Vec<Node> {
        vec![
            node("a", "10.0.0.1"),
            node("b", "10.0.0.2"),
            node("c", "10.0.0.10"),
        ]
    }

    #[test]
    fn the_mesh_peers_with_every_other_node_and_both_sides_connect() {
        let cfg = BgpConfiguration::default();
        let nodes = three();
        let a = desired_peers("a", &cfg, &nodes, &[]);
        assert_eq!(names(&a), ["Mesh_10_0_0_2", "Mesh_10_0_0_10"]);
        assert!(
            a.values()
                .all(|p| p.class == PeerClass::Cluster && p.asn == Asn(64512))
        );
        // Every node connects to every other, and expects the other to connect too.
        for x in &nodes {
            for (addr, p) in desired_peers(&x.name, &cfg, &nodes, &[]) {
                assert!(!p.passive && p.peer_connects, "{} to {addr}", x.name);
            }
        }
    }

    #[test]
    fn the_ipv6_mesh_joins_nodes_with_ipv6_addresses_one_session_per_family() {
        let cfg = BgpConfiguration::default();
        let mut nodes = three();
        for (n, a) in nodes.iter_mut().zip(["fd00::1/64", "fd00::2/64"]) {
            n.ipv6 = Some(a.parse().unwrap());
        }
        // c has no IPv6 address: IPv4 only with it.
        let a = desired_peers("a", &cfg, &nodes, &[]);
        assert_eq!(
            names(&a),
            ["Mesh_10_0_0_2", "Mesh_10_0_0_10", "Mesh_fd00__2"]
        );
        let v6 = &a[&ip("fd00::2")];
        assert!(
            v6.families.ipv6 && !v6.families.ipv4,
            "bird6: its own family only"
        );
        assert!(v6.peer_connects && v6.class == PeerClass::Cluster);
        let v4 = &a[&ip("10.0.0.2")];
        assert!(v4.families.ipv4 && !v4.families.ipv6);
        // A node without an IPv6 address has no IPv6 sessions.
        let c = desired_peers("c", &cfg, &nodes, &[]);
        assert!(c.keys().all(|a| a.is_ipv4()), "{:?}", c.keys());
        // An IPv6-only node meshes over IPv6 only.
        nodes[0].ipv4 = None;
        let a = desired_peers("a", &cfg, &nodes, &[]);
        assert_eq!(names(&a), ["Mesh_fd00__2"]);
    }

    #[test]
    fn an_ipv6_bgp_peer_resource_is_an_external_ipv6_session() {
        let cfg = BgpConfiguration::default();
        let mut nodes = three();
        nodes[0].ipv6 = Some("fd00::1/64".parse().unwrap());
        let tor = resource("tor6", "", "fd00::fe", 65000);
        let a = desired_peers("a", &cfg, &nodes, &[tor]);
        let t = &a[&ip("fd00::fe")];
        assert_eq!(t.name(), "Global_fd00__fe");
        assert_eq!(t.class, PeerClass::External);
        assert!(t.families.ipv6 && !t.families.ipv4);
    }

    #[test]
    fn mesh_off_without_reflectors_means_no_peers_and_node_as_overrides() {
        let mut cfg = BgpConfiguration {
            node_to_node_mesh: false,
            ..Default::default()
        };
        assert!(desired_peers("a", &cfg, &three(), &[]).is_empty());
        cfg.node_to_node_mesh = true;
        let mut nodes = three();
        nodes[1].asn = Some(65001);
        let a = desired_peers("a", &cfg, &nodes, &[]);
        assert_eq!(a[&ip("10.0.0.2")].asn, Asn(65001));
        // An unknown or address-less node has no peers.
        assert!(desired_peers("z", &cfg, &nodes, &[]).is_empty());
    }

    #[test]
    fn reflectors_take_clients_and_peer_with_each_other() {
        let cfg = BgpConfiguration {
            node_to_node_mesh: false,
            ..Default::default()
        };
        let nodes = vec![
            rr(node("r1", "10.0.0.1"), "244.0.0.1"),
            rr(node("r2", "10.0.0.2"), "244.0.0.1"),
            node("a", "10.0.0.3"),
            node("b", "10.0.0.4"),
        ];
        let r1 = desired_peers("r1", &cfg, &nodes, &[]);
        assert_eq!(r1.len(), 3);
        assert!(!r1[&ip("10.0.0.2")].rr_client);
        assert!(r1[&ip("10.0.0.3")].rr_client && r1[&ip("10.0.0.4")].rr_client);
        let a = desired_peers("a", &cfg, &nodes, &[]);
        assert_eq!(names(&a), ["Node_10_0_0_1", "Node_10_0_0_2"]);
        assert!(a.values().all(|p| !p.rr_client));
        // With the mesh on, clients also mesh with each other, never with reflectors.
        let on = BgpConfiguration::default();
        let a = desired_peers("a", &on, &nodes, &[]);
        assert_eq!(
            names(&a),
            ["Node_10_0_0_1", "Node_10_0_0_2", "Mesh_10_0_0_4"]
        );
        assert_eq!(desired_peers("r1", &on, &nodes, &[]).len(), 3);
    }

    fn resource(name: &str, node: &str, addr: &str, asn: u32) -> BgpPeer {
        BgpPeer::new(name, node, addr.parse().unwrap(), asn)
    }

    #[test]
    fn bgp_peer_resources_global_and_per_node() {
        let cfg = BgpConfiguration::default();
        let tor = resource("tor", "", "10.0.0.254", 65000);
        let mut mine = resource("my-tor", "a", "10.0.0.254", 65010);
        mine.hold_time_s = 9;
        let theirs = resource("their-tor", "b", "10.0.0.253", 65000);
        let a = desired_peers("a", &cfg, &three(), &[tor.clone(), theirs.clone()]);
        let t = &a[&ip("10.0.0.254")];
        assert_eq!(
            (t.name(), t.asn, t.class),
            (
                "Global_10_0_0_254".to_string(),
                Asn(65000),
                PeerClass::External
            )
        );
        assert!(!a.contains_key(&ip("10.0.0.253")));
        let a = desired_peers("a", &cfg, &three(), &[mine, tor]);
        let t = &a[&ip("10.0.0.254")];
        assert_eq!(
            (t.name().as_str(), t.asn, t.hold_time),
            ("Node_10_0_0_254", Asn(65010), 9)
        );
        assert!(!t.peer_connects, "a router is not a node: retried soon");
        // A resource naming another node is a cluster peer that connects to us too; and
        // our side waits only when the resource says so.
        let mut b = resource("to-b", "", "10.0.0.2", 64512);
        let a = desired_peers("a", &cfg, &three(), &[b.clone()]);
        let p = &a[&ip("10.0.0.2")];
        assert_eq!(
            (p.class, p.passive, p.peer_connects, p.origin),
            (PeerClass::Cluster, false, true, PeerOrigin::Resource)
        );
        b.passive = true;
        assert!(desired_peers("a", &cfg, &three(), &[b])[&ip("10.0.0.2")].passive);
        let mut ported = resource("p", "", "192.0.2.1", 65000);
        ported.port = 1790;
        let a = desired_peers("a", &cfg, &three(), &[ported]);
        assert_eq!(a[&ip("192.0.2.1")].name(), "Global_192_0_2_1_port_1790");
        assert_eq!(a[&ip("192.0.2.1")].port, 1790);
    }

    #[test]
    fn timers_come_from_the_configuration() {
        let cfg = BgpConfiguration {
            hold_time_s: 30,
            keepalive_time_s: 10,
            ..Default::default()
        };
        let a = desired_peers("a", &cfg, &three(), &[]);
        let p = &a[&ip("10.0.0.2")];
        assert_eq!((p.hold_time, p.keepalive), (30, Some(10)));
        let d = desired_peers("a", &BgpConfiguration::default(), &three(), &[]);
        assert_eq!(d[&ip("10.0.0.2")].hold_time, DEFAULT_HOLD);
    }

    #[test]
    fn next_hop_modes_map_both_ways() {
        for m in [
            NextHopMode::Auto,
            NextHopMode::SelfNextHop,
            NextHopMode::Keep,
        ] {
            assert_eq!(model_next_hop(rib_next_hop(m)), m);
        }
        assert_eq!(
            rib_next_hop(NextHopMode::SelfNextHop),
            bgp::rib::NextHopMode::SelfNextHop
        );
    }
}
