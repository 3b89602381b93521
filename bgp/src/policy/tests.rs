use super::*;
use std::net::Ipv4Addr;

fn pfx(s: &str) -> Prefix {
    let n: IpNet = s.parse().unwrap();
    Prefix::new(n.network(), n.prefix_len()).unwrap()
}

fn pool(name: &str, cidr: &str) -> PolicyPool {
    PolicyPool::new(name, cidr.parse().unwrap())
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

struct Case {
    pools: Vec<PolicyPool>,
    own: Vec<IpNet>,
    subnets: Vec<IpNet>,
    aggregate: bool,
    transit: bool,
    program_external: bool,
}

impl Case {
    fn new(pools: Vec<PolicyPool>) -> Self {
        Case {
            pools,
            own: vec![net("172.20.1.0/26")],
            subnets: vec![net("10.99.1.0/24")],
            aggregate: false,
            transit: false,
            program_external: true,
        }
    }
    fn policy(&self) -> Policy {
        Policy::generate(&PolicyInputs {
            pools: &self.pools,
            own_blocks: &self.own,
            subnets: &self.subnets,
            aggregate_to_external: self.aggregate,
            external_transit: self.transit,
            program_external_routes: self.program_external,
            ..Default::default()
        })
    }
}

const NH_SAME: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(10, 99, 1, 12)));
const NH_OTHER: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(10, 99, 2, 14)));

#[test]
fn vxlan_pools_never_reach_the_kernel_from_bgp() {
    for mode in [Encap::Always, Encap::CrossSubnet] {
        let mut p = pool("default", "172.20.0.0/16");
        p.vxlan_mode = mode;
        let pol = Case::new(vec![p]).policy();
        assert_eq!(pol.kernel(pfx("172.20.9.0/26"), CLUSTER, NH_SAME), None);
        assert_eq!(pol.kernel(pfx("172.20.9.0/26"), EXTERNAL, NH_OTHER), None);
        // Still imported and exported (the ToR keeps learning the blocks).
        assert!(pol.import(PeerClass::Cluster, pfx("172.20.9.0/26")));
        assert!(pol.export(
            PeerClass::External,
            pfx("172.20.1.0/26"),
            RouteSource::Local
        ));
    }
}

#[test]
fn no_encapsulation_goes_via_the_next_hop_in_our_subnet_only() {
    let pol = Case::new(vec![pool("default", "172.20.0.0/16")]).policy();
    let (via, why) = pol.kernel(pfx("172.20.9.0/26"), CLUSTER, NH_SAME).unwrap();
    assert_eq!(via, KernelVia::NextHop);
    assert!(why.contains("no encapsulation"), "{why}");
    // Beyond our subnet the gateway is not on a link of ours: left to the node's routes.
    assert!(
        pol.kernel(pfx("172.20.9.0/26"), CLUSTER, NH_OTHER)
            .is_none()
    );
}

#[test]
fn ipip_cross_subnet_is_direct_only_inside_our_subnet() {
    let mut p = pool("default", "172.20.0.0/16");
    p.ipip_mode = Encap::CrossSubnet;
    let pol = Case::new(vec![p.clone()]).policy();
    let b = pfx("172.20.9.0/26");
    assert_eq!(
        pol.kernel(b, CLUSTER, NH_SAME).unwrap().0,
        KernelVia::NextHop
    );
    assert_eq!(pol.kernel(b, CLUSTER, NH_OTHER).unwrap().0, KernelVia::Ipip);
    p.ipip_mode = Encap::Always;
    let pol = Case::new(vec![p]).policy();
    assert_eq!(pol.kernel(b, CLUSTER, NH_SAME).unwrap().0, KernelVia::Ipip);
}

#[test]
fn routes_outside_the_pools_follow_the_setting() {
    let mut c = Case::new(vec![pool("default", "172.20.0.0/16")]);
    let r = pfx("198.51.100.0/24");
    assert!(c.policy().kernel(r, EXTERNAL, NH_SAME).is_some());
    c.program_external = false;
    assert!(c.policy().kernel(r, EXTERNAL, NH_SAME).is_none());
    // Nothing originated here is programmed from BGP.
    assert!(
        c.policy()
            .kernel(pfx("172.20.1.0/26"), RouteSource::Local, None)
            .is_none()
    );
}

#[test]
fn imports_from_cluster_peers_stay_inside_pools_and_own_blocks_are_refused() {
    let pol = Case::new(vec![pool("default", "172.20.0.0/16")]).policy();
    assert!(pol.import(PeerClass::Cluster, pfx("172.20.9.0/26")));
    assert!(!pol.import(PeerClass::Cluster, pfx("10.0.0.0/8")));
    assert!(!pol.import(PeerClass::Cluster, pfx("0.0.0.0/0")));
    assert!(!pol.import(PeerClass::Cluster, pfx("172.20.1.0/26")));
    assert!(!pol.import(PeerClass::External, pfx("172.20.1.0/26")));
    // An address another node borrowed from our block: more specific, accepted.
    assert!(pol.import(PeerClass::Cluster, pfx("172.20.1.7/32")));
    assert!(pol.import(PeerClass::External, pfx("10.0.0.0/8")));
}

#[test]
fn external_export_honours_disable_bgp_export_and_never_sends_default() {
    let mut hidden = pool("hidden", "10.60.0.0/16");
    hidden.disable_bgp_export = true;
    let pol = Case::new(vec![pool("default", "172.20.0.0/16"), hidden]).policy();
    let local = RouteSource::Local;
    assert!(pol.export(PeerClass::External, pfx("172.20.1.0/26"), local));
    assert!(!pol.export(PeerClass::External, pfx("10.60.0.0/26"), local));
    assert!(!pol.export(PeerClass::External, pfx("0.0.0.0/0"), local));
    let v6_default = Prefix::V6("::/0".parse().unwrap());
    assert!(!pol.export(PeerClass::External, v6_default, local));
    assert!(pol.export(
        PeerClass::External,
        Prefix::V6("fd00::/64".parse().unwrap()),
        local
    ));
    // Mesh peers still get blocks of a pool hidden from external peers.
    assert!(pol.export(PeerClass::Cluster, pfx("10.60.0.0/26"), local));
    // Another node's block is announced by that node, not relayed to the ToR.
    assert!(!pol.export(PeerClass::External, pfx("172.20.9.0/26"), CLUSTER));
    // Reflection between cluster peers carries pool routes only.
    assert!(pol.export(PeerClass::Cluster, pfx("172.20.9.0/26"), CLUSTER));
    assert!(!pol.export(PeerClass::Cluster, pfx("198.51.100.0/24"), EXTERNAL));
}

#[test]
fn transit_between_external_peers_is_a_setting() {
    let mut c = Case::new(vec![pool("default", "172.20.0.0/16")]);
    let r = pfx("198.51.100.0/24");
    assert!(!c.policy().export(PeerClass::External, r, EXTERNAL));
    c.transit = true;
    assert!(c.policy().export(PeerClass::External, r, EXTERNAL));
}

#[test]
fn aggregation_exports_one_prefix_per_pool_to_external_peers_only() {
    let mut c = Case::new(vec![pool("default", "172.20.0.0/16")]);
    c.aggregate = true;
    let pol = c.policy();
    let local = RouteSource::Local;
    assert!(pol.export(PeerClass::External, pfx("172.20.0.0/16"), local));
    assert!(!pol.export(PeerClass::External, pfx("172.20.1.0/26"), local));
    assert!(!pol.export(PeerClass::Cluster, pfx("172.20.0.0/16"), local));
    assert!(pol.export(PeerClass::Cluster, pfx("172.20.1.0/26"), local));
}

#[test]
fn nested_pools_decide_by_the_most_specific() {
    let outer = pool("outer", "10.0.0.0/8");
    let mut inner = pool("inner", "10.1.0.0/16");
    inner.vxlan_mode = Encap::Always;
    // Given in either order, the inner pool's rule comes first.
    for pools in [
        vec![outer.clone(), inner.clone()],
        vec![inner.clone(), outer.clone()],
    ] {
        let pol = Case::new(pools).policy();
        assert!(pol.kernel(pfx("10.1.2.0/26"), CLUSTER, NH_SAME).is_none());
        assert!(pol.kernel(pfx("10.2.2.0/26"), CLUSTER, NH_SAME).is_some());
    }
}

#[test]
fn generation_is_deterministic_and_rules_read_like_bird() {
    let a = Case::new(vec![pool("a", "172.20.0.0/16"), pool("b", "10.60.0.0/16")]).policy();
    let b = Case::new(vec![pool("b", "10.60.0.0/16"), pool("a", "172.20.0.0/16")]).policy();
    assert_eq!(a, b);
    let import: Vec<String> = a
        .rules(Scope::Import)
        .iter()
        .map(|r| format!("{} {}", r.describe_match(), r.action))
        .collect();
    assert_eq!(
        import,
        [
            "net = 172.20.1.0/26 reject",
            "net ~ 10.60.0.0/16{16,32} && from cluster peers accept",
            "net ~ 172.20.0.0/16{16,32} && from cluster peers accept",
            "from cluster peers reject",
            "from external peers accept",
        ]
    );
}

#[test]
fn accept_all_accepts_everything_but_programs_nothing_local() {
    let pol = Policy::accept_all();
    assert!(pol.import(PeerClass::Cluster, pfx("0.0.0.0/0")));
    assert!(pol.export(PeerClass::External, pfx("0.0.0.0/0"), CLUSTER));
    assert!(
        pol.kernel(pfx("10.0.0.0/8"), RouteSource::Local, None)
            .is_none()
    );
    assert!(pol.kernel(pfx("10.0.0.0/8"), EXTERNAL, NH_SAME).is_some());
}

#[test]
fn a_pool_changing_mode_changes_only_its_kernel_rule() {
    let mut p = pool("default", "172.20.0.0/16");
    let before = Case::new(vec![p.clone()]).policy();
    p.vxlan_mode = Encap::CrossSubnet;
    let after = Case::new(vec![p]).policy();
    let b = pfx("172.20.9.0/26");
    assert!(before.kernel(b, CLUSTER, NH_SAME).is_some());
    assert!(after.kernel(b, CLUSTER, NH_SAME).is_none());
    for scope in [Scope::Import, Scope::ExportCluster, Scope::ExportExternal] {
        assert_eq!(before.rules(scope), after.rules(scope), "{scope:?}");
    }
    assert_ne!(before.rules(Scope::Kernel), after.rules(Scope::Kernel));
}

#[test]
fn an_ipv6_pool_does_not_change_any_ipv4_decision() {
    let v4 = pool("v4", "172.20.0.0/16");
    let v6 = pool("v6", "fd00:20::/48");
    let with = Case::new(vec![v4.clone(), v6]).policy();
    let without = Case::new(vec![v4]).policy();
    for p in ["172.20.9.0/26", "172.20.1.0/26", "10.1.0.0/16", "0.0.0.0/0"].map(pfx) {
        for class in [PeerClass::Cluster, PeerClass::External] {
            assert_eq!(with.import(class, p), without.import(class, p), "{p:?}");
            for src in [RouteSource::Local, CLUSTER, EXTERNAL] {
                assert_eq!(with.export(class, p, src), without.export(class, p, src));
            }
        }
        for nh in [NH_SAME, NH_OTHER] {
            assert_eq!(with.kernel(p, CLUSTER, nh), without.kernel(p, CLUSTER, nh));
        }
    }
}

/// Both families in one policy: each pool's rules decide its own family's prefixes, and the
/// node's subnet of that family decides direct routes.
#[test]
fn dual_stack_pools_decide_each_family_with_its_own_subnet() {
    let v4 = pool("v4", "172.20.0.0/16");
    let mut v6 = pool("v6", "fd00:20::/48");
    let mut v6_vxlan = pool("v6-vxlan", "fd00:30::/48");
    v6_vxlan.vxlan_mode = Encap::CrossSubnet;
    v6.disable_bgp_export = false;
    let mut case = Case::new(vec![v4, v6, v6_vxlan]);
    case.own.push(net("fd00:20::/122"));
    case.subnets.push(net("fd00:99:1::/64"));
    let pol = case.policy();
    let nh6_same: Option<IpAddr> = Some("fd00:99:1::12".parse().unwrap());
    let nh6_other: Option<IpAddr> = Some("fd00:99:2::14".parse().unwrap());

    // A no-encapsulation IPv6 pool: programmed via a next hop in our IPv6 subnet only.
    let (via, why) = pol
        .kernel(pfx("fd00:20::40/122"), CLUSTER, nh6_same)
        .unwrap();
    assert_eq!(via, KernelVia::NextHop);
    assert!(why.contains("pool v6"), "{why}");
    assert!(
        pol.kernel(pfx("fd00:20::40/122"), CLUSTER, nh6_other)
            .is_none()
    );
    // An IPv4 next hop is never "in" the IPv6 subnet, nor the reverse.
    assert!(
        pol.kernel(pfx("fd00:20::40/122"), CLUSTER, NH_SAME)
            .is_none()
    );
    assert!(
        pol.kernel(pfx("172.20.9.0/26"), CLUSTER, nh6_same)
            .is_none()
    );
    assert!(pol.kernel(pfx("172.20.9.0/26"), CLUSTER, NH_SAME).is_some());
    // A VXLAN IPv6 pool never reaches the kernel from BGP.
    assert_eq!(pol.kernel(pfx("fd00:30::40/122"), CLUSTER, nh6_same), None);

    // Import: pool prefixes of either family from cluster peers, nothing else; an own IPv6
    // block coming back is refused.
    assert!(pol.import(PeerClass::Cluster, pfx("fd00:20::80/122")));
    assert!(pol.import(PeerClass::Cluster, pfx("fd00:30::80/122")));
    assert!(!pol.import(PeerClass::Cluster, pfx("fd00:40::/122")));
    assert!(!pol.import(PeerClass::Cluster, pfx("fd00:20::/122")));
    // Export of an own IPv6 block to the mesh and to a ToR; never another node's block to a
    // ToR.
    assert!(pol.export(PeerClass::Cluster, pfx("fd00:20::/122"), RouteSource::Local));
    assert!(pol.export(
        PeerClass::External,
        pfx("fd00:20::/122"),
        RouteSource::Local
    ));
    assert!(!pol.export(PeerClass::External, pfx("fd00:20::40/122"), CLUSTER));
}

#[test]
fn disable_bgp_export_and_aggregates_work_for_ipv6_pools() {
    let mut v6 = pool("v6", "fd00:20::/48");
    v6.disable_bgp_export = true;
    let mut case = Case::new(vec![pool("v4", "172.20.0.0/16"), v6]);
    case.own.push(net("fd00:20::/122"));
    let pol = case.policy();
    assert!(!pol.export(
        PeerClass::External,
        pfx("fd00:20::/122"),
        RouteSource::Local
    ));
    // The IPv4 pool is unaffected.
    assert!(pol.export(
        PeerClass::External,
        pfx("172.20.1.0/26"),
        RouteSource::Local
    ));

    let mut case = Case::new(vec![pool("v6", "fd00:20::/48")]);
    case.own = vec![net("fd00:20::/122")];
    case.aggregate = true;
    let pol = case.policy();
    assert!(pol.export(PeerClass::External, pfx("fd00:20::/48"), RouteSource::Local));
    assert!(!pol.export(
        PeerClass::External,
        pfx("fd00:20::/122"),
        RouteSource::Local
    ));
    assert!(!pol.export(PeerClass::Cluster, pfx("fd00:20::/48"), RouteSource::Local));
}

#[test]
fn ipv6_rules_are_described_with_the_family_s_longest_length() {
    let pol = Case::new(vec![pool("v6", "fd00:20::/48")]).policy();
    let described: Vec<String> = pol
        .rules(Scope::Import)
        .iter()
        .map(Rule::describe_match)
        .collect();
    assert!(
        described
            .iter()
            .any(|d| d == "net ~ fd00:20::/48{48,128} && from cluster peers"),
        "{described:?}"
    );
    let pol = Case::new(vec![pool("v4", "172.20.0.0/16")]).policy();
    assert!(
        pol.rules(Scope::Import)
            .iter()
            .any(|r| r.describe_match() == "net ~ 172.20.0.0/16{16,32} && from cluster peers")
    );
}
