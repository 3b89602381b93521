//! The reference model: whether the cluster's policies allow a packet, straight from the
//! resources' definitions: no sets, no splitting, no per-node view. The source endpoint's
//! egress and the destination endpoint's ingress must both allow it (an address that is
//! no endpoint's has no policy of its own). Endpoints are found by address, as the
//! dataplane sees them. Tests hold `compile` + `evaluate` to this.

use crate::compile::Cluster;
use crate::evaluate::Packet;
use crate::resource::{
    Action, Direction, EntityRule, Icmp, Peer, Policy, PolicyRule, PortSpec, Protocol,
    WorkloadEndpoint,
};
use std::net::IpAddr;

/// Whether `pkt` may go from its source to its destination.
pub fn allowed(cluster: &Cluster, pkt: &Packet) -> bool {
    let egress_ok = owner(cluster, pkt.src)
        .is_none_or(|ep| direction_allows(cluster, ep, Direction::Egress, pkt));
    let ingress_ok = owner(cluster, pkt.dst)
        .is_none_or(|ep| direction_allows(cluster, ep, Direction::Ingress, pkt));
    egress_ok && ingress_ok
}

/// Whether `ep`'s policies for `dir` allow `pkt` (leaving `ep` for egress, reaching it for
/// ingress).
pub fn direction_allows(
    cluster: &Cluster,
    ep: &WorkloadEndpoint,
    dir: Direction,
    pkt: &Packet,
) -> bool {
    let mut policies: Vec<&Policy> = cluster
        .policies
        .iter()
        .filter(|p| p.rules(dir).is_some() && p.subject.matches_in(ep, cluster.namespaces))
        .collect();
    if policies.is_empty() {
        return true;
    }
    policies.sort_by(|a, b| Policy::evaluation_order(a, b));
    for p in policies {
        for rule in p.rules(dir).unwrap_or_default() {
            if rule_matches(cluster, rule, pkt) {
                match rule.action {
                    Action::Allow | Action::Pass => return true,
                    Action::Deny => return false,
                    Action::Log => {}
                }
            }
        }
    }
    false
}

fn owner<'a>(cluster: &Cluster<'a>, addr: IpAddr) -> Option<&'a WorkloadEndpoint> {
    cluster.endpoints.iter().find(|ep| ep.owns(addr))
}

fn rule_matches(cluster: &Cluster, rule: &PolicyRule, pkt: &Packet) -> bool {
    let icmp_is = |icmp: &Icmp| {
        matches!(pkt.protocol, Protocol::Icmp | Protocol::IcmpV6)
            && pkt.icmp_type == icmp.icmp_type
            && icmp.code.is_none_or(|c| c == pkt.icmp_code)
    };
    if rule.ip_version.is_some_and(|v| v != pkt.version())
        || rule.protocol.is_some_and(|p| p != pkt.protocol)
        || rule.not_protocol == Some(pkt.protocol)
        || rule.icmp.as_ref().is_some_and(|i| !icmp_is(i))
        || rule.not_icmp.as_ref().is_some_and(icmp_is)
    {
        return false;
    }
    side_matches(cluster, rule, &rule.source, pkt.src, pkt.src_port, pkt)
        && side_matches(cluster, rule, &rule.destination, pkt.dst, pkt.dst_port, pkt)
}

fn side_matches(
    cluster: &Cluster,
    rule: &PolicyRule,
    side: &EntityRule,
    addr: IpAddr,
    port: u16,
    pkt: &Packet,
) -> bool {
    let ep = owner(cluster, addr);
    let selected = |sel: &crate::resource::EndpointSelection| {
        ep.is_some_and(|e| sel.matches_in(e, cluster.namespaces))
    };
    let in_nets = |nets: &[ipnet::IpNet]| nets.iter().any(|n| n.contains(&addr));
    let peer_ok = side.peers.is_empty()
        || side.peers.iter().any(|peer| match peer {
            Peer::Endpoints { selection, nets } => {
                selected(selection) && (nets.is_empty() || in_nets(nets))
            }
            Peer::Nets { nets, except } => in_nets(nets) && !in_nets(except),
        });
    let not_ok = !side.not_endpoints.as_ref().is_some_and(selected) && !in_nets(&side.not_nets);
    let carries_ports = pkt.protocol.has_ports();
    let port_is = |spec: &PortSpec| match spec {
        PortSpec::Range(a, b) => (*a..=*b).contains(&port),
        PortSpec::Named(name) => rule
            .protocol
            .zip(ep)
            .is_some_and(|(proto, e)| e.named_port(name, proto) == Some(port)),
    };
    let ports_ok = side.ports.is_empty() || (carries_ports && side.ports.iter().any(port_is));
    let not_ports_ok =
        side.not_ports.is_empty() || (carries_ports && !side.not_ports.iter().any(port_is));
    peer_ok && not_ok && ports_ok && not_ports_ok
}
