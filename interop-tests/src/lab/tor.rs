//! The ToR of the service tests (`service_ecmp`, `kube_services`): FRR in AS 65000 on the
//! segment 10.97.0.0/24 and fd00:97::/64 (at 10.97.0.1 / fd00:97::1), taking any node there as
//! an eBGP neighbour (over IPv4 for IPv4 and IPv6 for IPv6), with multipath so that routes of
//! equal AS path from several nodes are all installed, and zebra writing its kernel; and
//! which nodes its paths for an address lead to.

use std::collections::BTreeSet;

use super::frr::Frr;
use super::netns::Netns;
use super::segment_node::SegmentNode;

pub const ADDRESS: &str = "10.97.0.1";
pub const ADDRESS6: &str = "fd00:97::1";

/// Starts the ToR in `ns` (which has its addresses already).
pub fn start(ns: &Netns) -> Frr {
    let conf = "frr defaults traditional\nhostname tor\n\
         router bgp 65000\n bgp router-id 10.97.0.1\n no bgp ebgp-requires-policy\n\
          no bgp default ipv4-unicast\n\
          neighbor NODES peer-group\n neighbor NODES remote-as external\n\
          neighbor NODES timers connect 2\n\
          neighbor NODES6 peer-group\n neighbor NODES6 remote-as external\n\
          neighbor NODES6 timers connect 2\n\
          bgp listen range 10.97.0.0/24 peer-group NODES\n\
          bgp listen range fd00:97::/64 peer-group NODES6\n\
          address-family ipv4 unicast\n  neighbor NODES activate\n  maximum-paths 8\n exit-address-family\n\
          address-family ipv6 unicast\n  neighbor NODES6 activate\n  maximum-paths 8\n exit-address-family\n";
    Frr::start_with_kernel(ns.name(), 65000, conf).unwrap_or_else(|e| panic!("{e}"))
}

/// The next hops of the ToR's paths for `host` (`198.51.100.10/32`) that it uses: the best
/// path and those that share its load (multipath), as the nodes they lead to.
pub fn next_hops(tor: &Frr, host: &str, nodes: &[&SegmentNode]) -> BTreeSet<String> {
    let afi = if host.contains(':') { "ipv6" } else { "ipv4" };
    let v = tor.json(&format!("show bgp {afi} unicast {host} json"));
    let hops = v["paths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["multipath"] == true || p["bestpath"]["overall"] == true)
        .flat_map(|p| p["nexthops"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n["ip"].as_str().map(str::to_owned))
        .collect();
    by_node(hops, nodes)
}

/// Next hops as the nodes they lead to: an IPv6 next hop may be the node's link-local
/// address (RFC 2545) rather than its global one. One that is no node's stays as it is.
pub fn by_node(hops: BTreeSet<String>, nodes: &[&SegmentNode]) -> BTreeSet<String> {
    hops.into_iter()
        .map(|h| {
            nodes
                .iter()
                .find(|n| {
                    h == n.addr
                        || n.addr6.as_deref() == Some(h.as_str())
                        || n.link_local.as_deref() == Some(h.as_str())
                })
                .map(|n| n.name.clone())
                .unwrap_or(h)
        })
        .collect()
}
