//! The datastore's policy resources as the policy generator takes them: each `BGPPeer`'s
//! `BGPFilter`s (as `bgp::policy::PeerFilters`), the service CIDRs, and the communities of
//! `prefixAdvertisements`; and the routes `reachableBy` asks for. Pure functions of the
//! cluster state.
//!
//! Resources are validated when stored; what still does not convert (a filter a peer names
//! but nobody created yet, a community written by another client) is skipped with a warning,
//! as Calico's confd skips a missing filter, rather than stopping the node's policy.

use std::net::IpAddr;

use ::datastore::model::{
    self, BgpConfiguration, BgpFilter, BgpFilterRule, BgpPeer, CommunityValue,
};
use bgp::policy::{Advertisement, FilterRule, MatchOperator, PeerFilters};
use bgp_wire::{Community, LargeCommunity, Prefix};
use ipnet::IpNet;

use super::peers::effective_resources;

/// Each of node `me`'s `BGPPeer` sessions that names filters, with their rules in order: the
/// peer's filters in its `filters` order, each filter's rules in list order.
pub fn peer_filters(
    me: &str,
    peers: &[BgpPeer],
    filters: &[BgpFilter],
) -> Vec<(IpAddr, PeerFilters)> {
    let mut out = Vec::new();
    for (addr, p) in effective_resources(me, peers) {
        let mut pf = PeerFilters::default();
        for name in &p.filters {
            let Some(f) = filters.iter().find(|f| &f.name == name) else {
                tracing::warn!(peer = %p.name, filter = %name, "BGPPeer names a BGPFilter that does not exist: skipped");
                continue;
            };
            let lists: [(&str, bool, &[BgpFilterRule], bool); 4] = [
                ("importV4", false, &f.import_v4, true),
                ("importV6", true, &f.import_v6, true),
                ("exportV4", false, &f.export_v4, false),
                ("exportV6", true, &f.export_v6, false),
            ];
            // One filter's v4 and v6 lists never both match a route: their order relative to
            // each other does not matter, only the order within each and across filters.
            for (list, ipv6, rules, import) in lists {
                for (i, r) in rules.iter().enumerate() {
                    let rule = filter_rule(&f.name, &format!("{list}[{i}]"), ipv6, r);
                    if import {
                        pf.import.push(rule);
                    } else {
                        pf.export.push(rule);
                    }
                }
            }
        }
        if !pf.is_empty() {
            out.push((addr, pf));
        }
    }
    out
}

fn filter_rule(filter: &str, place: &str, ipv6: bool, r: &BgpFilterRule) -> FilterRule {
    let mut rule = FilterRule::new(filter, place, ipv6, r.action == model::FilterAction::Accept);
    rule.cidr = r.cidr.map(|c| {
        let op = match r.match_operator {
            Some(model::MatchOperator::Equal) => MatchOperator::Equal,
            Some(model::MatchOperator::NotEqual) => MatchOperator::NotEqual,
            Some(model::MatchOperator::NotIn) => MatchOperator::NotIn,
            // A CIDR without an operator (validation refuses it) means "inside".
            Some(model::MatchOperator::In) | None => MatchOperator::In,
        };
        (c.trunc(), op)
    });
    rule.min_len = r.prefix_length_min;
    rule.max_len = r.prefix_length_max;
    rule.from_peers = r.source == Some(model::FilterSource::RemotePeers);
    rule.interface = r.interface.clone();
    rule
}

/// Node `me`'s peers with `reachableBy`: (peer address, gateway, peer name).
pub fn peer_gateways(me: &str, peers: &[BgpPeer]) -> Vec<(IpAddr, IpAddr, String)> {
    effective_resources(me, peers)
        .into_iter()
        .filter_map(|(addr, p)| {
            let gw = p.reachable_by?;
            // Validated when stored: a gateway of the other family is never a route.
            (gw.is_ipv4() == addr.is_ipv4()).then(|| (addr, gw, p.name.clone()))
        })
        .collect()
}

/// Every service CIDR of the configuration (cluster, external and load-balancer IPs), both
/// families: what may go only to external peers.
pub fn service_cidrs(c: &BgpConfiguration) -> Vec<IpNet> {
    c.service_cluster_ips
        .iter()
        .chain(&c.service_external_ips)
        .chain(&c.service_load_balancer_ips)
        .map(IpNet::trunc)
        .collect()
}

/// The service ranges every node announces: each cluster-IP CIDR, and each external-IP and
/// load-balancer CIDR that is not a single address (single addresses are announced by the
/// nodes that host the service, through the `Services` API), as Calico does.
pub fn announced_service_ranges(c: &BgpConfiguration) -> Vec<Prefix> {
    let single = |n: &IpNet| n.prefix_len() == n.max_prefix_len();
    c.service_cluster_ips
        .iter()
        .chain(c.service_external_ips.iter().filter(|n| !single(n)))
        .chain(c.service_load_balancer_ips.iter().filter(|n| !single(n)))
        .filter_map(|n| Prefix::new(n.network(), n.prefix_len()))
        .collect()
}

/// The communities of `prefixAdvertisements`, names resolved through `communities`.
pub fn advertisements(c: &BgpConfiguration) -> Vec<Advertisement> {
    let mut out = Vec::new();
    for pa in &c.prefix_advertisements {
        let mut ad = Advertisement {
            cidr: pa.cidr.trunc(),
            communities: Vec::new(),
            large_communities: Vec::new(),
        };
        for name in &pa.communities {
            match c.community(name) {
                Some(CommunityValue::Standard(a, n)) => ad
                    .communities
                    .push(Community(u32::from(a) << 16 | u32::from(n))),
                Some(CommunityValue::Large(global_admin, local1, local2)) => {
                    ad.large_communities.push(LargeCommunity {
                        global_admin,
                        local1,
                        local2,
                    })
                }
                None => {
                    tracing::warn!(cidr = %pa.cidr, community = %name, "prefixAdvertisements: not a defined community nor a value: skipped");
                }
            }
        }
        out.push(ad);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::datastore::model::{CommunityDef, FilterAction, PrefixAdvertisement};

    fn rule(cidr: Option<&str>, op: Option<model::MatchOperator>, accept: bool) -> BgpFilterRule {
        BgpFilterRule {
            cidr: cidr.map(|c| c.parse().unwrap()),
            match_operator: op,
            prefix_length_min: None,
            prefix_length_max: None,
            source: None,
            interface: None,
            action: if accept {
                FilterAction::Accept
            } else {
                FilterAction::Reject
            },
        }
    }

    #[test]
    fn a_peers_filters_come_in_its_order_and_missing_ones_are_skipped() {
        let mut tor = BgpPeer::new("tor", "", "10.99.1.1".parse().unwrap(), 65000);
        tor.filters = vec!["second".into(), "ghost".into(), "first".into()];
        let other = BgpPeer::new("other", "", "10.99.1.2".parse().unwrap(), 65000);
        let mut first = BgpFilter {
            name: "first".into(),
            ..Default::default()
        };
        first.export_v4 = vec![rule(
            Some("10.0.0.0/16"),
            Some(model::MatchOperator::In),
            true,
        )];
        let mut second = BgpFilter {
            name: "second".into(),
            ..Default::default()
        };
        second.export_v4 = vec![rule(None, None, false)];
        second.import_v6 = vec![rule(
            Some("fd00::/8"),
            Some(model::MatchOperator::NotIn),
            false,
        )];
        let got = peer_filters("a", &[tor, other], &[first, second]);
        assert_eq!(got.len(), 1, "a peer without filters has none");
        let (addr, pf) = &got[0];
        assert_eq!(*addr, "10.99.1.1".parse::<IpAddr>().unwrap());
        let places: Vec<_> = pf.export.iter().map(|r| r.reason()).collect();
        assert_eq!(
            places,
            [
                "BGPFilter second exportV4[0]",
                "BGPFilter first exportV4[0]"
            ]
        );
        assert_eq!(pf.import.len(), 1);
        assert!(pf.import[0].ipv6);
        assert_eq!(
            pf.import[0].cidr,
            Some(("fd00::/8".parse().unwrap(), MatchOperator::NotIn))
        );
    }

    #[test]
    fn a_node_specific_peer_replaces_the_global_one_for_its_filters_too() {
        let mut global = BgpPeer::new("g", "", "10.99.1.1".parse().unwrap(), 65000);
        global.filters = vec!["f".into()];
        let mine = BgpPeer::new("mine", "a", "10.99.1.1".parse().unwrap(), 65000);
        let f = BgpFilter {
            name: "f".into(),
            export_v4: vec![rule(None, None, false)],
            ..Default::default()
        };
        assert!(peer_filters("a", &[global.clone(), mine], std::slice::from_ref(&f)).is_empty());
        assert_eq!(peer_filters("b", &[global], &[f]).len(), 1);
    }

    #[test]
    fn service_ranges_skip_single_addresses_of_external_and_lb_lists() {
        let c = BgpConfiguration {
            service_cluster_ips: vec!["10.96.0.0/12".parse().unwrap()],
            service_external_ips: vec![
                "192.0.2.0/24".parse().unwrap(),
                "192.0.2.10/32".parse().unwrap(),
            ],
            service_load_balancer_ips: vec![
                "198.51.100.0/24".parse().unwrap(),
                "2001:db8:5::7/128".parse().unwrap(),
            ],
            ..Default::default()
        };
        let ranges: Vec<String> = announced_service_ranges(&c)
            .iter()
            .map(|p| format!("{}/{}", p.addr(), p.prefix_len()))
            .collect();
        assert_eq!(ranges, ["10.96.0.0/12", "192.0.2.0/24", "198.51.100.0/24"]);
        assert_eq!(
            service_cidrs(&c).len(),
            5,
            "every entry stays out of the mesh"
        );
    }

    #[test]
    fn advertisements_resolve_names_and_literals() {
        let c = BgpConfiguration {
            communities: vec![
                CommunityDef {
                    name: "lab".into(),
                    value: "65001:100".into(),
                },
                CommunityDef {
                    name: "big".into(),
                    value: "4200000000:1:2".into(),
                },
            ],
            prefix_advertisements: vec![PrefixAdvertisement {
                cidr: "172.20.0.0/16".parse().unwrap(),
                communities: vec!["lab".into(), "big".into(), "65001:7".into(), "nope".into()],
            }],
            ..Default::default()
        };
        let ads = advertisements(&c);
        assert_eq!(ads.len(), 1);
        assert_eq!(
            ads[0].communities,
            [Community(65001 << 16 | 100), Community(65001 << 16 | 7)]
        );
        assert_eq!(
            ads[0].large_communities,
            [LargeCommunity {
                global_admin: 4_200_000_000,
                local1: 1,
                local2: 2
            }]
        );
    }
}
