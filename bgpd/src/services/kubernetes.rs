//! Which service addresses this node announces on the Kubernetes datastore, sans-IO: the
//! cluster's Services and EndpointSlices as bgpd follows them (`datastore::kubernetes`'s
//! facts), and the `BGPConfiguration`'s ranges, in; the host addresses to announce and what
//! is wrong with the Services, out. The task that feeds it and hands the addresses to the
//! service announcements is `crate::kube_services`.
//!
//! Calico's rules (`confd`'s routes): the ranges themselves are announced by every node (the
//! cluster brain does that); a Service with `externalTrafficPolicy: Local` has each of its
//! cluster, external and load-balancer addresses that lies inside its kind's ranges announced
//! as a /32 (/128) by the nodes where it has a ready endpoint, and by no other. An address in
//! a range of a single address is announced by every node for a Service of policy `Cluster`
//! (the cluster brain leaves single addresses out of the ranges it announces). External and
//! load-balancer addresses outside every range of their kind are reported, never announced.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use datastore::kubernetes::{ServiceFacts, SliceFacts};
use datastore::model::BgpConfiguration;
use ipnet::IpNet;

/// The Services and EndpointSlices known so far, by `namespace/name`.
#[derive(Debug, Default, Clone)]
pub struct ClusterServices {
    services: BTreeMap<String, ServiceFacts>,
    slices: BTreeMap<String, SliceFacts>,
}

/// What this node should announce, and what it refuses to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    pub announce: BTreeSet<IpAddr>,
    /// Per Service, what is wrong with it: an address outside every range of its kind, or
    /// an entry that is no address.
    pub problems: BTreeMap<String, Vec<String>>,
}

impl ClusterServices {
    /// Service `name` is now `facts` (`None`: deleted).
    pub fn set_service(&mut self, name: &str, facts: Option<ServiceFacts>) {
        match facts {
            Some(f) => self.services.insert(name.to_owned(), f),
            None => self.services.remove(name),
        };
    }

    /// EndpointSlice `name` is now `facts` (`None`: deleted).
    pub fn set_slice(&mut self, name: &str, facts: Option<SliceFacts>) {
        match facts {
            Some(f) => self.slices.insert(name.to_owned(), f),
            None => self.slices.remove(name),
        };
    }

    /// The uid of Service `name` ("" if unknown).
    pub fn uid_of(&self, name: &str) -> &str {
        self.services.get(name).map_or("", |s| s.uid.as_str())
    }

    /// Forgets everything (before a new list).
    pub fn clear(&mut self) {
        self.services.clear();
        self.slices.clear();
    }

    fn ready_on(&self, service: &str, node: &str) -> bool {
        self.slices
            .values()
            .any(|s| s.service == service && s.ready_nodes.contains(node))
    }

    /// What node `node` announces under `config`.
    pub fn plan(&self, node: &str, config: &BgpConfiguration) -> Plan {
        let mut plan = Plan::default();
        for (name, s) in &self.services {
            let local_ready = s.local && self.ready_on(name, node);
            let mut problems: Vec<String> = s
                .invalid
                .iter()
                .map(|t| format!("{t:?} is not an IP address"))
                .collect();
            let kinds: [(&[IpAddr], &[IpNet], Option<&str>); 3] = [
                (&s.cluster_ips, &config.service_cluster_ips, None),
                (
                    &s.external_ips,
                    &config.service_external_ips,
                    Some("serviceExternalIPs"),
                ),
                (
                    &s.load_balancer_ips,
                    &config.service_load_balancer_ips,
                    Some("serviceLoadBalancerIPs"),
                ),
            ];
            for (addresses, ranges, field) in kinds {
                for &a in addresses {
                    let Some(range) = ranges.iter().find(|r| r.contains(&a)) else {
                        // A cluster IP outside serviceClusterIPs is simply not advertised;
                        // an external one is reported where ranges of its kind exist.
                        if let Some(field) = field.filter(|_| !ranges.is_empty()) {
                            problems.push(format!(
                                "{a} is outside every BGPConfiguration {field} range, so no \
                                 node announces it"
                            ));
                        }
                        continue;
                    };
                    let single = range.prefix_len() == range.max_prefix_len();
                    if local_ready || (!s.local && single) {
                        plan.announce.insert(a);
                    }
                }
            }
            if !problems.is_empty() {
                plan.problems.insert(name.clone(), problems);
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn config() -> BgpConfiguration {
        BgpConfiguration {
            service_cluster_ips: vec!["10.96.0.0/16".parse().unwrap()],
            service_external_ips: vec![
                "198.51.100.0/24".parse().unwrap(),
                "192.0.2.9/32".parse().unwrap(),
            ],
            service_load_balancer_ips: vec!["2001:db8:51::/64".parse().unwrap()],
            ..Default::default()
        }
    }

    fn web(local: bool) -> ServiceFacts {
        ServiceFacts {
            uid: "u-web".into(),
            local,
            cluster_ips: vec![a("10.96.0.10")],
            external_ips: vec![a("198.51.100.7"), a("192.0.2.9")],
            load_balancer_ips: vec![a("2001:db8:51::5")],
            invalid: vec![],
        }
    }

    fn slice(nodes: &[&str]) -> SliceFacts {
        SliceFacts {
            service: "shop/web".into(),
            ready_nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        }
    }

    fn set(addrs: &[&str]) -> BTreeSet<IpAddr> {
        addrs.iter().map(|s| a(s)).collect()
    }

    #[test]
    fn local_policy_announces_every_address_in_range_only_where_an_endpoint_is_ready() {
        let mut c = ClusterServices::default();
        c.set_service("shop/web", Some(web(true)));
        c.set_slice("shop/web-1", Some(slice(&["n1"])));
        let all = set(&["10.96.0.10", "198.51.100.7", "192.0.2.9", "2001:db8:51::5"]);
        assert_eq!(c.plan("n1", &config()).announce, all);
        assert!(c.plan("n2", &config()).announce.is_empty());
        // The last endpoint leaves n1: nothing anywhere.
        c.set_slice("shop/web-1", Some(slice(&[])));
        assert!(c.plan("n1", &config()).announce.is_empty());
        // Another slice of the same Service brings it to n2.
        c.set_slice("shop/web-2", Some(slice(&["n2"])));
        assert_eq!(c.plan("n2", &config()).announce, all);
        c.set_service("shop/web", None);
        assert!(c.plan("n2", &config()).announce.is_empty());
    }

    #[test]
    fn cluster_policy_leaves_ranges_to_the_brain_but_announces_single_address_ranges_everywhere() {
        let mut c = ClusterServices::default();
        c.set_service("shop/web", Some(web(false)));
        for node in ["n1", "n2"] {
            assert_eq!(c.plan(node, &config()).announce, set(&["192.0.2.9"]));
        }
    }

    #[test]
    fn addresses_outside_the_ranges_are_reported_and_never_announced() {
        let mut c = ClusterServices::default();
        let mut s = web(true);
        s.external_ips.push(a("203.0.113.1"));
        s.cluster_ips.push(a("172.16.0.1"));
        s.invalid.push("x.y".into());
        c.set_service("shop/web", Some(s));
        c.set_slice("shop/web-1", Some(slice(&["n1"])));
        let plan = c.plan("n1", &config());
        assert!(!plan.announce.contains(&a("203.0.113.1")));
        assert!(!plan.announce.contains(&a("172.16.0.1")));
        let problems = &plan.problems["shop/web"];
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("\"x.y\" is not an IP address"));
        assert!(
            problems[1]
                .contains("203.0.113.1 is outside every BGPConfiguration serviceExternalIPs range")
        );
        // Without any external range nothing of that kind is wrong: it is not configured.
        let bare = BgpConfiguration::default();
        assert_eq!(c.plan("n1", &bare).problems["shop/web"].len(), 1);
    }

    proptest! {
        /// Whatever the slices say, a node announces only addresses of its Services that lie
        /// in a range, and a Local Service's addresses only where one of its endpoints is ready.
        #[test]
        fn announced_addresses_are_in_range_and_local_ones_need_a_ready_endpoint(
            local in any::<bool>(),
            slices in proptest::collection::vec(
                (proptest::sample::select(vec!["shop/web", "shop/other"]),
                 proptest::collection::btree_set(proptest::sample::select(vec!["n1", "n2", "n3"]), 0..3)),
                0..4),
        ) {
            let mut c = ClusterServices::default();
            c.set_service("shop/web", Some(web(local)));
            for (i, (service, nodes)) in slices.iter().enumerate() {
                c.set_slice(&format!("s{i}"), Some(SliceFacts {
                    service: (*service).into(),
                    ready_nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
                }));
            }
            let cfg = config();
            for node in ["n1", "n2", "n3"] {
                let plan = c.plan(node, &cfg);
                let ready = slices.iter().any(|(s, n)| *s == "shop/web" && n.contains(node));
                for addr in &plan.announce {
                    prop_assert!(cfg.service_cluster_ips.iter()
                        .chain(&cfg.service_external_ips)
                        .chain(&cfg.service_load_balancer_ips)
                        .any(|r| r.contains(addr)));
                    if local { prop_assert!(ready); }
                }
                if local && ready { prop_assert_eq!(plan.announce.len(), 4); }
            }
        }
    }
}
