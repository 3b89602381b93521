//! The cluster brain with real daemons: three bgpd nodes on one segment sharing the SQLite
//! datastore, and an FRR top-of-rack router in AS 65000 that every node peers with through
//! one global `BGPPeer` resource. Everything bgpd does here it derives from the datastore,
//! live: the mesh, the ToR sessions, what it announces, its filters, its kernel table.
//!
//! In order: a no-encapsulation pool (the ToR learns every block from its owner, every
//! kernel table routes the other blocks via their owners); a fourth node joins and leaves;
//! the mesh is switched off with one route reflector; the pool turns VXLAN (BGP routes leave
//! the kernel tables, VXLAN routes replace them, the ToR keeps the blocks until the pool
//! disables BGP export). Needs root and FRR.

use std::time::{Duration, Instant};

use datastore::Store;
use datastore::model::{BgpConfiguration, BgpPeer, EncapMode, IpPool};
use interop_tests::lab::bgp_peer::wait_until;
use interop_tests::lab::bgpd::{bgpctl, runtime};
use interop_tests::lab::frr::{Frr, parse_route};
use interop_tests::lab::netns::Netns;
use interop_tests::lab::open_store;
use interop_tests::lab::segment::Segment;
use interop_tests::lab::segment_node::{SegmentNode as Node, context};
use ipam::allocator::{AssignRequest, Ipam};

const TOR: &str = "10.98.0.1";
const POOL: &str = "172.21.0.0/16";
const CONVERGE: Duration = Duration::from_secs(40);

/// FRR in AS 65000 taking any node of the segment as an eBGP neighbour (dynamic peers, any
/// AS but its own, so that the cluster's AS can change).
fn start_tor(ns: &Netns) -> Frr {
    let conf = format!(
        "frr defaults traditional\nhostname tor\n\
         router bgp 65000\n bgp router-id {TOR}\n no bgp ebgp-requires-policy\n\
          neighbor NODES peer-group\n neighbor NODES remote-as external\n\
          neighbor NODES timers connect 2\n\
          bgp listen range 10.98.0.0/24 peer-group NODES\n\
          address-family ipv4 unicast\n  neighbor NODES activate\n exit-address-family\n"
    );
    Frr::start_with_kernel(ns.name(), 65000, &conf).unwrap_or_else(|e| panic!("{e}"))
}

/// The ToR's next hop for a prefix, if it has a route.
fn tor_next_hop(tor: &Frr, prefix: &str) -> Option<String> {
    parse_route(&tor.json(&format!("show bgp ipv4 unicast {prefix} json"))).map(|r| r.next_hop)
}

/// Claims a block for `node` by handing it one address; returns the block.
async fn claim(ipam: &Ipam<Store>, node: &str, handle: &str) -> String {
    let (got, _) = ipam
        .auto_assign(&AssignRequest {
            handle: handle.into(),
            node: node.into(),
            num_v4: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    got[0].block.to_string()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: mesh and ToR established, routes without encapsulation, block propagation timed, then encapsulation changes; one lab throughout"
)]
fn the_cluster_brain_with_a_tor_and_real_daemons() {
    let rt = runtime();
    let seg = Segment::new("cbseg").unwrap();
    let tor_member = seg.attach("cbtor", &format!("{TOR}/24")).unwrap();
    let tor = start_tor(&tor_member.ns);
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

    let n1 = Node::start(&seg, "n1", "10.98.0.11", &store_path, "");
    let n2 = Node::start(&seg, "n2", "10.98.0.12", &store_path, "");
    let n3 = Node::start(&seg, "n3", "10.98.0.13", &store_path, "");
    let nodes = [&n1, &n2, &n3];
    let blocks: Vec<String> = rt.block_on(async {
        let mut v = vec![];
        for n in nodes {
            v.push(claim(&ipam, &n.name, &format!("pod-{}", n.name)).await);
        }
        v
    });

    // The mesh and the ToR sessions, all from the datastore.
    let peers_of = |me: &Node| -> Vec<String> {
        let mut v: Vec<String> = nodes
            .iter()
            .filter(|n| n.name != me.name)
            .map(|n| format!("Mesh_{}", n.addr.replace('.', "_")))
            .collect();
        v.push("Global_10_98_0_1".into());
        v
    };
    assert!(
        wait_until(CONVERGE, || nodes.iter().all(|n| {
            let want = peers_of(n);
            n.all_established(&want.iter().map(String::as_str).collect::<Vec<_>>())
        })),
        "mesh and ToR sessions did not come up\n{}",
        context(&nodes)
    );
    eprintln!("mesh + ToR established: {:?}", n1.sessions());

    // No encapsulation: the ToR learns every block from its owner, and every node's kernel
    // table routes the other blocks via their owners.
    let no_encap_converged = || {
        nodes.iter().zip(&blocks).all(|(owner, block)| {
            tor_next_hop(&tor, block).as_deref() == Some(owner.addr.as_str())
                && nodes.iter().all(|n| {
                    let k = n.kernel();
                    let want = if n.name == owner.name {
                        "blackhole".to_string()
                    } else {
                        format!("via {}", owner.addr)
                    };
                    k.get(block).is_some_and(|(r, _)| *r == want)
                })
        })
    };
    assert!(
        wait_until(CONVERGE, no_encap_converged),
        "no-encapsulation routes did not converge\n{}",
        context(&nodes)
    );
    let k = n2.kernel();
    let (_, why) = &k[&blocks[0]];
    assert!(
        why.starts_with("bgp from Mesh_10_98_0_11") && why.contains("no encapsulation"),
        "{why}"
    );
    // The ToR's own kernel (zebra) routes each block to its node.
    let tor_routes = tor_member
        .ns
        .ip(&["route", "show", "proto", "bgp"])
        .unwrap();
    for (owner, block) in nodes.iter().zip(&blocks) {
        assert!(
            tor_routes
                .lines()
                .any(|l| l.starts_with(block.as_str())
                    && l.contains(&format!("via {} ", owner.addr))),
            "{tor_routes}"
        );
    }
    eprintln!("no encapsulation: ToR and kernel tables hold every block");

    // A block claimed on one node: how long until it is in every other kernel table. The
    // first block has room for 63 more, so claim until a new block appears, timing from the
    // start of the claim that brought it.
    let mut started = Instant::now();
    let mut fresh = blocks[2].clone();
    for i in 0..64 {
        started = Instant::now();
        fresh = rt.block_on(claim(&ipam, "n3", &format!("fill-{i}")));
        if fresh != blocks[2] {
            break;
        }
    }
    assert_ne!(fresh, blocks[2], "no second block was claimed");
    // Polled over gRPC in this process (a bgpctl run costs tens of milliseconds).
    let latency = rt.block_on(async {
        let mut clients = Vec::new();
        for n in [&n1, &n2] {
            let ch = proto::client::connect_unix(&n.socket).await.unwrap();
            clients.push(proto::v1::bgp_client::BgpClient::new(ch));
        }
        let deadline = Instant::now() + CONVERGE;
        loop {
            let mut all = true;
            for c in clients.iter_mut() {
                let mut stream = c
                    .list_routes(proto::v1::ListRoutesRequest {
                        table: proto::v1::RouteTable::Kernel.into(),
                        prefix: fresh.clone(),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let mut found = false;
                while let Some(batch) = stream.message().await.unwrap() {
                    found |= batch.routes.iter().any(|r| r.prefix == fresh);
                }
                all &= found;
            }
            if all {
                return Some(started.elapsed());
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let latency = latency.unwrap_or_else(|| {
        panic!(
            "a new block did not reach the other kernel tables\n{}",
            context(&nodes)
        )
    });
    eprintln!(
        "block claimed on n3 -> in every other node's kernel table: {latency:?} (polled over gRPC every 1 ms)"
    );

    // A fourth node joins: every mesh and every kernel table; then it leaves.
    let n4 = Node::start(&seg, "n4", "10.98.0.14", &store_path, "");
    let block4 = rt.block_on(claim(&ipam, "n4", "pod-n4"));
    assert!(
        wait_until(CONVERGE, || {
            nodes.iter().all(|n| {
                n.sessions().get("Mesh_10_98_0_14").map(String::as_str) == Some("Established")
                    && n.kernel()
                        .get(&block4)
                        .is_some_and(|(r, _)| r == "via 10.98.0.14")
            }) && tor_next_hop(&tor, &block4).as_deref() == Some("10.98.0.14")
        }),
        "the fourth node did not join\n{}",
        context(&[&n1, &n2, &n3, &n4])
    );
    eprintln!("n4 joined every mesh and kernel table");
    let mut n4 = n4;
    n4.terminate();
    rt.block_on(ipam.delete_node("n4")).unwrap();
    assert!(
        wait_until(CONVERGE, || nodes.iter().all(|n| {
            !n.sessions().contains_key("Mesh_10_98_0_14") && !n.kernel().contains_key(&block4)
        })),
        "the fourth node did not leave\n{}",
        context(&nodes)
    );
    drop(n4);
    eprintln!("n4 left every mesh and kernel table");

    // Mesh off, n1 a route reflector: every node still learns every block.
    rt.block_on(async {
        let (mut node, rev) = datastore::Resources::new(ipam.store())
            .get_node("n1")
            .await
            .unwrap();
        node.route_reflector_cluster_id = Some("244.0.0.1".parse().unwrap());
        datastore::Resources::new(ipam.store())
            .register_node(&node, Some(rev))
            .await
            .unwrap();
        datastore::Resources::new(ipam.store())
            .set_bgp_configuration(
                &BgpConfiguration {
                    node_to_node_mesh: false,
                    ..Default::default()
                },
                None,
            )
            .await
            .unwrap();
    });
    let rr_sessions = |n: &Node| -> bool {
        let want: Vec<&str> = if n.name == "n1" {
            vec!["Node_10_98_0_12", "Node_10_98_0_13", "Global_10_98_0_1"]
        } else {
            vec!["Node_10_98_0_11", "Global_10_98_0_1"]
        };
        n.all_established(&want)
    };
    assert!(
        wait_until(CONVERGE, || nodes.iter().all(|n| rr_sessions(n))
            && n2
                .kernel()
                .get(&blocks[2])
                .is_some_and(|(r, _)| r == "via 10.98.0.13")
            && n3
                .kernel()
                .get(&blocks[1])
                .is_some_and(|(r, _)| r == "via 10.98.0.12")),
        "with a reflector and no mesh, blocks did not reach every node\n{}",
        context(&nodes)
    );
    // n2 learned n3's block from the reflector, next hop kept, reflection attributes set.
    let routes = n2.json(&["show", "route", &blocks[2], "--json"]);
    assert_eq!(routes[0]["from_peer"], "10.98.0.11", "{routes}");
    assert_eq!(routes[0]["next_hop"], "10.98.0.13", "{routes}");
    eprintln!("mesh off + reflector n1: every node learns every block");

    // The pool turns VXLAN: BGP routes leave every kernel table, VXLAN routes replace them;
    // the ToR keeps learning the blocks.
    rt.block_on(async {
        let (mut pool, rev) = ipam.get_pool("nonencap").await.unwrap();
        pool.vxlan_mode = EncapMode::Always;
        ipam.update_pool(&pool, Some(rev)).await.unwrap();
    });
    let vxlan_converged = || {
        nodes.iter().zip(&blocks).all(|(owner, block)| {
            nodes.iter().filter(|n| n.name != owner.name).all(|n| {
                n.kernel().get(block).is_some_and(|(r, why)| {
                    r.ends_with("dev vxlan.calico onlink") && !why.starts_with("bgp")
                })
            })
        }) && nodes.iter().all(|n| {
            n.kernel()
                .values()
                .all(|(_, why)| !why.starts_with("bgp from"))
        })
    };
    assert!(
        wait_until(CONVERGE, vxlan_converged),
        "VXLAN routes did not replace the BGP ones\n{}",
        context(&nodes)
    );
    for (owner, block) in nodes.iter().zip(&blocks) {
        assert_eq!(
            tor_next_hop(&tor, block).as_deref(),
            Some(owner.addr.as_str()),
            "the ToR lost {block} when the pool turned VXLAN"
        );
    }
    let filters =
        String::from_utf8_lossy(&bgpctl(&n1.socket, &["show", "filters"]).stdout).into_owned();
    assert!(
        filters.contains("pool nonencap is vxlanMode Always: VXLAN routes come from IPAM"),
        "{filters}"
    );
    eprintln!("VXLAN: kernel routes from IPAM, the ToR still learns the blocks");

    // disableBGPExport: the ToR loses them, the nodes keep their VXLAN routes.
    rt.block_on(async {
        let (mut pool, rev) = ipam.get_pool("nonencap").await.unwrap();
        pool.disable_bgp_export = true;
        ipam.update_pool(&pool, Some(rev)).await.unwrap();
    });
    assert!(
        wait_until(CONVERGE, || blocks
            .iter()
            .all(|b| tor_next_hop(&tor, b).is_none())),
        "the ToR still has blocks of a pool with disableBGPExport\n{}",
        context(&nodes)
    );
    assert!(vxlan_converged(), "{}", context(&nodes));
    eprintln!("disableBGPExport: the ToR no longer learns the blocks");

    // The cluster's AS changes live: every session comes back in the new AS.
    rt.block_on(async {
        let (mut pool, rev) = ipam.get_pool("nonencap").await.unwrap();
        pool.disable_bgp_export = false;
        ipam.update_pool(&pool, Some(rev)).await.unwrap();
        let (mut cfg, rev) = datastore::Resources::new(ipam.store())
            .bgp_configuration()
            .await
            .unwrap()
            .unwrap();
        cfg.as_number = 64600;
        datastore::Resources::new(ipam.store())
            .set_bgp_configuration(&cfg, Some(rev))
            .await
            .unwrap();
    });
    let path = |block: &str| {
        parse_route(&tor.json(&format!("show bgp ipv4 unicast {block} json"))).map(|r| r.as_path)
    };
    assert!(
        wait_until(CONVERGE, || blocks
            .iter()
            .all(|b| path(b) == Some(vec![64600]))
            && nodes.iter().all(|n| rr_sessions(n))),
        "the new AS did not take: {:?}\n{}",
        path(&blocks[0]),
        context(&nodes)
    );
    eprintln!("AS 64512 -> 64600 live: the ToR sees every block from AS 64600");
}
