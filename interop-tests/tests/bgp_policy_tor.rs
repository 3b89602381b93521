//! What a network team configures on a ToR session, against a real FRR router: two bgpd
//! nodes on one segment (SQLite datastore, no-encapsulation pool) peer with FRR in AS 65000
//! through a global `BGPPeer`. Then, live and without resetting the ToR sessions:
//! - a `BGPFilter` attached to the peer hides one node's block from the ToR (export) and
//!   drops one of the ToR's prefixes (import), and `bgpctl show filters PEER PREFIX` names
//!   the rule that decided;
//! - `prefixAdvertisements` put a standard and a large community on the blocks the ToR gets;
//! - `serviceClusterIPs` is announced to the ToR by both nodes, and never over the mesh.
//!
//! Needs root and FRR.

use std::collections::BTreeMap;
use std::time::Duration;

use datastore::model::{
    BgpConfiguration, BgpFilter, BgpFilterRule, BgpPeer, CommunityDef, FilterAction, IpPool,
    MatchOperator, PrefixAdvertisement,
};
use interop_tests::lab::bgp_peer::wait_until;
use interop_tests::lab::bgpd::runtime;
use interop_tests::lab::frr::Frr;
use interop_tests::lab::open_store;
use interop_tests::lab::segment::Segment;
use interop_tests::lab::segment_node::{self, SegmentNode as Node};
use ipam::allocator::{AssignRequest, Ipam};

const TOR: &str = "10.97.0.1";
const POOL: &str = "172.22.0.0/16";
const SERVICES: &str = "10.96.0.0/12";
const CONVERGE: Duration = Duration::from_secs(40);
const PEER: &str = "Global_10_97_0_1";

/// Session name → (state, since).
fn sessions(n: &Node) -> BTreeMap<String, (String, String)> {
    n.protocols()
        .into_iter()
        .map(|(name, p)| {
            (
                name,
                (
                    p["state"].as_str().unwrap_or("").to_owned(),
                    p["since_unix_ms"].to_string(),
                ),
            )
        })
        .collect()
}

/// FRR in AS 65000 with the two nodes as eBGP neighbours, announcing two prefixes of its
/// own. Named neighbours rather than a listen range: a dynamic neighbour that resets (the
/// local AS change below) is deleted and created again by FRR, and a connection that
/// arrives meanwhile was left unanswered in OpenSent once in a few runs.
fn start_tor(ns: &str) -> Frr {
    let conf = format!(
        "frr defaults traditional\nhostname tor\n\
         router bgp 65000\n bgp router-id {TOR}\n no bgp ebgp-requires-policy\n\
          no bgp network import-check\n\
          neighbor NODES peer-group\n neighbor NODES remote-as external\n\
          neighbor NODES timers connect 2\n\
          neighbor 10.97.0.11 peer-group NODES\n neighbor 10.97.0.12 peer-group NODES\n\
          address-family ipv4 unicast\n  neighbor NODES activate\n\
           network 192.0.2.0/24\n  network 198.51.100.0/24\n exit-address-family\n"
    );
    Frr::start_with_kernel(ns, 65000, &conf).unwrap_or_else(|e| panic!("{e}"))
}

/// The ToR's paths for a prefix: (next hop, standard communities, large communities).
fn tor_paths(tor: &Frr, prefix: &str) -> Vec<(String, String, String)> {
    let v = tor.json(&format!("show bgp ipv4 unicast {prefix} json"));
    v["paths"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let nh = p["nexthops"][0]["ip"].as_str().unwrap_or("").to_owned();
            let c = p["community"]["string"].as_str().unwrap_or("").to_owned();
            let l = p["largeCommunity"]["string"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            (nh, c, l)
        })
        .collect()
}

fn context(nodes: &[&Node], tor: &Frr) -> String {
    format!(
        "--- tor\n{}\n{}",
        tor.vtysh(&["show bgp ipv4 unicast"]),
        segment_node::context(nodes)
    )
}

fn rule(cidr: &str, op: MatchOperator, action: FilterAction) -> BgpFilterRule {
    BgpFilterRule {
        cidr: Some(cidr.parse().unwrap()),
        match_operator: Some(op),
        prefix_length_min: None,
        prefix_length_max: None,
        source: None,
        interface: None,
        action,
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: filters, communities, service addresses and AS loops against a real ToR, each step changing what the next one sees"
)]
fn filters_communities_and_service_addresses_on_a_real_tor() {
    let rt = runtime();
    let seg = Segment::new("pfseg").unwrap();
    let tor_member = seg.attach("pftor", &format!("{TOR}/24")).unwrap();
    let tor = start_tor(tor_member.ns.name());
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store.db");
    let ipam = rt.block_on(async {
        let store = open_store(&format!("sqlite:{}", store_path.display()))
            .await
            .unwrap();
        let ipam = Ipam::new(store);
        ipam.create_pool(&IpPool::new("nonencap", POOL.parse().unwrap()))
            .await
            .unwrap();
        datastore::Resources::new(ipam.store())
            .put_bgp_peer(&BgpPeer::new("tor", "", TOR.parse().unwrap(), 65000))
            .await
            .unwrap();
        ipam
    });
    let n1 = Node::start(&seg, "n1", "10.97.0.11", &store_path, "");
    let n2 = Node::start(&seg, "n2", "10.97.0.12", &store_path, "");
    let nodes = [&n1, &n2];
    let blocks: Vec<String> = rt.block_on(async {
        let mut v = vec![];
        for n in nodes {
            let (got, _) = ipam
                .auto_assign(&AssignRequest {
                    handle: format!("pod-{}", n.name),
                    node: n.name.clone(),
                    num_v4: 1,
                    ..Default::default()
                })
                .await
                .unwrap();
            v.push(got[0].block.to_string());
        }
        v
    });

    // Both blocks at the ToR from their owners; the ToR's prefixes at the nodes.
    let converged = || {
        nodes.iter().zip(&blocks).all(|(owner, b)| {
            tor_paths(&tor, b)
                .iter()
                .any(|(nh, _, _)| *nh == owner.addr)
        }) && nodes.iter().all(|n| {
            let loc = n.prefixes(&[]);
            loc.contains(&"192.0.2.0/24".to_string())
                && loc.contains(&"198.51.100.0/24".to_string())
                && blocks.iter().all(|b| loc.contains(b))
        })
    };
    assert!(
        wait_until(CONVERGE, converged),
        "did not converge\n{}",
        context(&nodes, &tor)
    );
    let since_before = sessions(&n1)[PEER].1.clone();

    // A BGPFilter on the ToR peer: n1's block is not exported, 192.0.2.0/24 not imported.
    rt.block_on(async {
        datastore::Resources::new(ipam.store())
            .put_bgp_filter(
                &BgpFilter {
                    name: "tor-policy".into(),
                    export_v4: vec![rule(&blocks[0], MatchOperator::Equal, FilterAction::Reject)],
                    import_v4: vec![rule(
                        "192.0.2.0/23",
                        MatchOperator::In,
                        FilterAction::Reject,
                    )],
                    ..Default::default()
                },
                None,
            )
            .await
            .unwrap();
        let mut p = BgpPeer::new("tor", "", TOR.parse().unwrap(), 65000);
        p.filters = vec!["tor-policy".into()];
        datastore::Resources::new(ipam.store())
            .put_bgp_peer(&p)
            .await
            .unwrap();
    });
    let filtered = || {
        tor_paths(&tor, &blocks[0]).is_empty()
            && tor_paths(&tor, &blocks[1])
                .iter()
                .any(|(nh, _, _)| *nh == n2.addr)
            && nodes.iter().all(|n| {
                let loc = n.prefixes(&[]);
                !loc.contains(&"192.0.2.0/24".to_string())
                    && loc.contains(&"198.51.100.0/24".to_string())
            })
    };
    assert!(
        wait_until(CONVERGE, filtered),
        "the filter did not take effect\n{}",
        context(&nodes, &tor)
    );
    assert_eq!(
        sessions(&n1)[PEER],
        ("Established".to_string(), since_before.clone()),
        "the ToR session was reset by a filter change"
    );

    // The deciding rule, per prefix.
    let explain = n1.json(&["show", "filters", PEER, &blocks[0], "--json"]);
    let decisions = explain["decisions"].as_array().cloned().unwrap_or_default();
    let export = decisions
        .iter()
        .find(|d| d["scope"] != "import")
        .unwrap_or_else(|| panic!("no export decision: {explain}"));
    assert_eq!(export["action"], "reject", "{explain}");
    assert_eq!(
        export["reason"], "BGPFilter tor-policy exportV4[0]",
        "{explain}"
    );
    let explain = n1.json(&["show", "filters", PEER, "192.0.2.0/24", "--json"]);
    let import = explain["decisions"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["scope"] == "import").cloned())
        .unwrap_or_else(|| panic!("no import decision: {explain}"));
    assert_eq!(import["action"], "reject", "{explain}");
    assert_eq!(import["reason"], "BGPFilter tor-policy importV4[0]");
    // A prefix no filter rule matches falls through to the generated rules: n2's own block
    // is exported by n2, and not by n1, which learned it over the mesh.
    let export_of = |n: &Node| {
        let explain = n.json(&["show", "filters", PEER, &blocks[1], "--json"]);
        explain["decisions"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["scope"] != "import").cloned())
            .unwrap_or_else(|| panic!("no export decision: {explain}"))
    };
    let d = export_of(&n2);
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (
            Some("accept"),
            Some("originated here: own confirmed blocks, borrowed addresses, configured routes")
        ),
        "{d}"
    );
    let d = export_of(&n1);
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (
            Some("reject"),
            Some("cluster routes are announced by the node that owns them")
        ),
        "{d}"
    );

    // Communities on what the nodes advertise, and the service range from both nodes, to
    // the ToR only.
    rt.block_on(async {
        datastore::Resources::new(ipam.store())
            .set_bgp_configuration(
                &BgpConfiguration {
                    service_cluster_ips: vec![SERVICES.parse().unwrap()],
                    communities: vec![CommunityDef {
                        name: "pods".into(),
                        value: "65001:100".into(),
                    }],
                    prefix_advertisements: vec![PrefixAdvertisement {
                        cidr: POOL.parse().unwrap(),
                        communities: vec!["pods".into(), "65001:1:2".into()],
                    }],
                    ..Default::default()
                },
                None,
            )
            .await
            .unwrap();
    });
    let advertised = || {
        let paths = tor_paths(&tor, &blocks[1]);
        let svc = tor_paths(&tor, SERVICES);
        paths
            .iter()
            .any(|(nh, c, l)| *nh == n2.addr && c == "65001:100" && l == "65001:1:2")
            && svc.len() == 2
            && nodes
                .iter()
                .all(|n| svc.iter().any(|(nh, _, _)| *nh == n.addr))
    };
    assert!(
        wait_until(CONVERGE, advertised),
        "communities / service range not at the ToR: {:?} {:?}\n{}",
        tor_paths(&tor, &blocks[1]),
        tor_paths(&tor, SERVICES),
        context(&nodes, &tor)
    );
    // Never over the mesh: each node holds only its own copy.
    for (n, other) in [(&n1, &n2), (&n2, &n1)] {
        let mesh = format!("Mesh_{}", other.addr.replace('.', "_"));
        assert!(
            !n.prefixes(&["adj-out", &mesh])
                .contains(&SERVICES.to_string()),
            "{} sent the service range to {mesh}",
            n.name
        );
        assert!(
            n.prefixes(&["adj-out", PEER])
                .contains(&SERVICES.to_string())
        );
    }
    assert_eq!(
        sessions(&n1)[PEER],
        ("Established".to_string(), since_before),
        "the ToR session was reset by a configuration change"
    );

    // The ToR prepends the cluster's AS to 198.51.100.0/24: a loop, rejected, until the
    // BGPPeer allows our AS once (numAllowedLocalASNumbers). With localASNumber the nodes
    // speak AS 65099 to the ToR: FRR sees it first in the path.
    tor.configure(&[
        "ip prefix-list LOOPED seq 5 permit 198.51.100.0/24",
        "route-map OUT permit 10",
        " match ip address prefix-list LOOPED",
        " set as-path prepend 64512",
        "route-map OUT permit 20",
        "router bgp 65000",
        "address-family ipv4 unicast",
        "neighbor NODES route-map OUT out",
    ]);
    tor.vtysh(&["clear bgp ipv4 unicast * soft out"]);
    let has = |n: &Node, p: &str| n.prefixes(&[]).contains(&p.to_string());
    assert!(
        wait_until(CONVERGE, || nodes.iter().all(|n| !has(
            n,
            "198.51.100.0/24"
        ) && !has(
            n,
            "192.0.2.0/24"
        ))),
        "a route with our AS in its path was accepted\n{}",
        context(&nodes, &tor)
    );
    rt.block_on(async {
        let mut p = BgpPeer::new("tor", "", TOR.parse().unwrap(), 65000);
        p.filters = vec!["tor-policy".into()];
        p.num_allowed_local_as_numbers = 1;
        p.local_as_number = Some(65099);
        datastore::Resources::new(ipam.store())
            .put_bgp_peer(&p)
            .await
            .unwrap();
    });
    let as_path_of = |prefix: &str| -> Vec<String> {
        let v = tor.json(&format!("show bgp ipv4 unicast {prefix} json"));
        v["paths"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p["aspath"]["string"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    assert!(
        wait_until(CONVERGE, || nodes.iter().all(|n| has(n, "198.51.100.0/24"))
            && as_path_of(&blocks[1]) == ["65099"]),
        "allow local as / local as did not take effect: {:?}\n{}",
        as_path_of(&blocks[1]),
        context(&nodes, &tor)
    );
    // The filter still holds on the new session.
    assert!(!has(&n1, "192.0.2.0/24"));
    assert!(tor_paths(&tor, &blocks[0]).is_empty());
    drop(tor);
}
