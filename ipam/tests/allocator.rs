//! The allocator's rules one by one, on a SQLite store: pools, claims and their states, the
//! block limit, borrowing and strict affinity, dual stack all-or-nothing, release guards,
//! GC, node removal, and bad input that writes nothing.
//!
//! Why this file is long: one short test per allocator rule, sharing the store set-up above them.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use ipam::IpamError;
use ipam::allocator::{AssignRequest, Ipam, ReleaseRequest};
use ipam::block::AffinityState;
use ipam::model::{EncapMode, IpPool, IpamConfig, Node};
use ipam::store::Datastore;
use ipam::store::sqlite::{SqliteOptions, SqliteStore};

async fn ipam() -> (Ipam<SqliteStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db"), SqliteOptions::default())
        .await
        .unwrap();
    (Ipam::new(store), dir)
}

fn pool(name: &str, cidr: &str, block: u8) -> IpPool {
    let mut p = IpPool::new(name, cidr.parse().unwrap());
    p.block_size = block;
    p
}

fn req(handle: &str, node: &str, v4: u32, v6: u32) -> AssignRequest {
    AssignRequest {
        handle: handle.into(),
        node: node.into(),
        num_v4: v4,
        num_v6: v6,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_node_claims_a_confirmed_block_and_fills_it_before_the_next() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.1.0.0/24", 28))
        .await
        .unwrap();
    let (a, _) = ipam
        .auto_assign(&req("net.c1", "node-a", 10, 0))
        .await
        .unwrap();
    let (b, _) = ipam
        .auto_assign(&req("net.c2", "node-a", 10, 0))
        .await
        .unwrap();
    let blocks: HashSet<_> = a.iter().chain(&b).map(|x| x.block).collect();
    assert_eq!(
        blocks.len(),
        2,
        "16 addresses per block: 20 need two blocks"
    );
    assert!(
        a.iter().all(|x| x.block == a[0].block),
        "the first 10 come from one block"
    );
    assert!(a.iter().chain(&b).all(|x| !x.borrowed));
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r.state == Some(AffinityState::Confirmed)
                && r.affinity.as_deref() == Some("node-a"))
    );
    assert_eq!(rows.iter().map(|r| r.used).sum::<u32>(), 20);
    assert!(ipam.check().await.unwrap().problems.is_empty());
}

#[tokio::test]
async fn nodes_walk_the_pool_in_different_orders() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.2.0.0/16", 26))
        .await
        .unwrap();
    let mut firsts = HashSet::new();
    for n in 0..8 {
        let (v4, _) = ipam
            .auto_assign(&req(&format!("net.{n}"), &format!("node-{n}"), 1, 0))
            .await
            .unwrap();
        firsts.insert(v4[0].block);
    }
    assert_eq!(firsts.len(), 8, "each node starts at its own block");
}

#[tokio::test]
async fn the_block_limit_then_borrowing_then_strict_affinity() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.3.0.0/28", 30))
        .await
        .unwrap();
    ipam.set_config(&IpamConfig {
        max_blocks_per_host: 1,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    ipam.auto_assign(&req("net.a", "node-a", 4, 0))
        .await
        .unwrap();
    // node-a is at its limit and its block is full; no other block exists yet.
    let e = ipam
        .auto_assign(&req("net.a2", "node-a", 1, 0))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains("limit of 1")),
        "{e}"
    );
    // node-b claims a block; node-a may then borrow from it.
    ipam.auto_assign(&req("net.b", "node-b", 1, 0))
        .await
        .unwrap();
    let (v4, _) = ipam
        .auto_assign(&req("net.a3", "node-a", 1, 0))
        .await
        .unwrap();
    assert!(v4[0].borrowed, "{v4:?}");
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(rows.iter().map(|r| r.borrowed).sum::<u32>(), 1);
    // Strict affinity: no borrowing.
    let mut strict = req("net.a4", "node-a", 1, 0);
    strict.strict_affinity = true;
    let e = ipam.auto_assign(&strict).await.unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains("strict")),
        "{e}"
    );
}

#[tokio::test]
async fn dual_stack_is_all_or_nothing() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("v4", "10.4.0.0/24", 26))
        .await
        .unwrap();
    ipam.create_pool(&pool("v6", "fd00:4::/120", 122))
        .await
        .unwrap();
    let (v4, v6) = ipam
        .auto_assign(&req("net.ds", "node-a", 1, 1))
        .await
        .unwrap();
    assert!(v4[0].address.is_ipv4() && v6[0].address.is_ipv6());
    // 300 IPv6 addresses do not exist in a /120: the IPv4 part must be undone.
    let before = ipam.usage("v4").await.unwrap().0[0].used;
    let e = ipam
        .auto_assign(&req("net.big", "node-a", 1, 300))
        .await
        .unwrap_err();
    assert!(matches!(e, IpamError::Exhausted(_)), "{e}");
    assert_eq!(
        ipam.usage("v4").await.unwrap().0[0].used,
        before,
        "IPv4 address leaked"
    );
    assert!(matches!(
        ipam.handle_allocations("net.big").await,
        Err(IpamError::NotFound(_))
    ));
    assert!(ipam.check().await.unwrap().problems.is_empty());
}

#[tokio::test]
async fn a_stale_release_never_frees_a_reused_address() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.5.0.0/30", 30))
        .await
        .unwrap();
    let (first, _) = ipam
        .auto_assign(&req("net.old", "node-a", 1, 0))
        .await
        .unwrap();
    let addr = first[0].address;
    ipam.release_by_handle("net.old").await.unwrap();
    // Fill the block so the address is handed out again.
    let (again, _) = ipam
        .auto_assign(&req("net.new", "node-a", 4, 0))
        .await
        .unwrap();
    assert!(again.iter().any(|a| a.address == addr));
    let stale = ReleaseRequest {
        address: addr,
        handle: Some("net.old".into()),
        seq: None,
    };
    assert!(ipam.release_ips(&[stale]).await.unwrap().is_empty());
    let stale_seq = ReleaseRequest {
        address: addr,
        handle: None,
        seq: Some(first[0].seq),
    };
    assert!(ipam.release_ips(&[stale_seq]).await.unwrap().is_empty());
    assert_eq!(ipam.handle_allocations("net.new").await.unwrap().len(), 4);
    // Releasing twice, or an unknown handle, is fine and frees nothing more.
    assert_eq!(ipam.release_by_handle("net.new").await.unwrap().len(), 4);
    assert!(ipam.release_by_handle("net.new").await.unwrap().is_empty());
    assert!(
        ipam.release_by_handle("net.never")
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn freed_addresses_are_reused_oldest_first() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.6.0.0/29", 29))
        .await
        .unwrap();
    let mut held = Vec::new();
    for i in 0..8 {
        let (v4, _) = ipam
            .auto_assign(&req(&format!("net.{i}"), "node-a", 1, 0))
            .await
            .unwrap();
        held.push(v4[0].address);
    }
    for i in [5, 2, 7] {
        ipam.release_by_handle(&format!("net.{i}")).await.unwrap();
    }
    let mut reused = Vec::new();
    for i in 0..3 {
        let (v4, _) = ipam
            .auto_assign(&req(&format!("net.r{i}"), "node-a", 1, 0))
            .await
            .unwrap();
        reused.push(v4[0].address);
    }
    assert_eq!(reused, vec![held[5], held[2], held[7]]);
}

#[tokio::test]
async fn a_specific_address_and_its_errors() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.7.0.0/24", 26))
        .await
        .unwrap();
    let a: IpAddr = "10.7.0.70".parse().unwrap();
    let got = ipam
        .assign_ip(a, "reserved.gw", &BTreeMap::new(), "node-a")
        .await
        .unwrap();
    assert_eq!(got.block.to_string(), "10.7.0.64/26");
    assert!(!got.borrowed, "the node claimed the block of the address");
    let e = ipam
        .assign_ip(a, "other", &BTreeMap::new(), "node-b")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::InUse(m) if m.contains("reserved.gw")),
        "{e}"
    );
    let e = ipam
        .assign_ip(
            "10.99.0.1".parse().unwrap(),
            "x",
            &BTreeMap::new(),
            "node-a",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            IpamError::InvalidArgument {
                field: "address",
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn gc_releases_dead_handles_of_the_node_but_not_tunnels() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.8.0.0/24", 26))
        .await
        .unwrap();
    for h in ["k8s.c1", "k8s.c2", "k8s.c3"] {
        ipam.auto_assign(&req(h, "node-a", 1, 0)).await.unwrap();
    }
    ipam.auto_assign(&req("other.c9", "node-a", 1, 0))
        .await
        .unwrap();
    ipam.auto_assign(&req("k8s.b1", "node-b", 1, 0))
        .await
        .unwrap();
    let mut tunnel = req("vxlan-tunnel-addr-node-a", "node-a", 1, 0);
    tunnel.use_tunnel = true;
    ipam.auto_assign(&tunnel).await.unwrap();
    let live: HashSet<String> = ["k8s.c2".to_string()].into();
    let dry = ipam.gc("node-a", &live, "k8s.", true).await.unwrap();
    assert_eq!(dry.len(), 2);
    assert_eq!(
        ipam.handle_allocations("k8s.c1").await.unwrap().len(),
        1,
        "dry run released"
    );
    let released: Vec<String> = ipam
        .gc("node-a", &live, "k8s.", false)
        .await
        .unwrap()
        .into_iter()
        .map(|(h, _)| h)
        .collect();
    assert_eq!(released, ["k8s.c1", "k8s.c3"]);
    for kept in ["k8s.c2", "other.c9", "k8s.b1", "vxlan-tunnel-addr-node-a"] {
        assert_eq!(
            ipam.handle_allocations(kept).await.unwrap().len(),
            1,
            "{kept}"
        );
    }
}

#[tokio::test]
async fn removing_a_node_releases_its_addresses_and_blocks() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.9.0.0/24", 28))
        .await
        .unwrap();
    ipam.register_node(&Node::new("node-a"), None)
        .await
        .unwrap();
    ipam.auto_assign(&req("net.a", "node-a", 3, 0))
        .await
        .unwrap();
    let mut tunnel = req("vxlan-tunnel-addr-node-a", "node-a", 1, 0);
    tunnel.use_tunnel = true;
    ipam.auto_assign(&tunnel).await.unwrap();
    // node-b borrows from node-a's block once node-b is at its limit with no block of its own.
    ipam.set_config(&IpamConfig {
        max_blocks_per_host: 0,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    let (b, _) = ipam
        .auto_assign(&req("net.b", "node-b", 1, 0))
        .await
        .unwrap();
    assert!(b[0].borrowed);
    let (blocks, addrs) = ipam.delete_node("node-a").await.unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(addrs.len(), 4);
    assert!(matches!(
        ipam.get_node("node-a").await,
        Err(IpamError::NotFound(_))
    ));
    // The block stays, with no affinity, for node-b's borrowed address.
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].affinity, None);
    assert_eq!(rows[0].used, 1);
    assert!(
        ipam.check().await.unwrap().problems.is_empty(),
        "{:?}",
        ipam.check().await.unwrap()
    );
    // Its last address released, the orphan block goes back to the pool.
    ipam.release_by_handle("net.b").await.unwrap();
    assert!(ipam.usage("").await.unwrap().1.is_empty());
}

#[tokio::test]
async fn bad_input_is_refused_and_writes_nothing() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.10.0.0/16", 26))
        .await
        .unwrap();
    let before = ipam.store().revision().await.unwrap();
    let cases: Vec<(IpPool, &str)> = vec![
        (pool("q", "10.10.128.0/20", 26), "overlaps pool p"),
        (pool("q", "10.11.0.1/16", 26), "not a network address"),
        (pool("q", "10.12.0.0/16", 19), "out of range"),
        (pool("q", "10.12.0.0/16", 33), "out of range"),
        (
            {
                let mut p = pool("q", "10.12.0.0/16", 26);
                p.node_selector = "zone == 'a' &&".into();
                p
            },
            "position 14",
        ),
        (
            {
                let mut p = pool("q", "10.12.0.0/16", 26);
                p.vxlan_mode = EncapMode::Always;
                p.ipip_mode = EncapMode::Always;
                p
            },
            "not both",
        ),
        (pool("p", "10.13.0.0/16", 26), "already exists"),
    ];
    for (p, needle) in cases {
        let e = ipam.create_pool(&p).await.unwrap_err().to_string();
        assert!(e.contains(needle), "{p:?}: {e}");
    }
    let e = ipam
        .auto_assign(&req("", "node-a", 1, 0))
        .await
        .unwrap_err();
    assert!(matches!(
        e,
        IpamError::InvalidArgument {
            field: "handle",
            ..
        }
    ));
    let mut named = req("net.x", "node-a", 1, 0);
    named.v4_pools = vec!["nope".into()];
    let e = ipam.auto_assign(&named).await.unwrap_err();
    assert!(
        matches!(
            e,
            IpamError::InvalidArgument {
                field: "ipv4_pools",
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        ipam.handle_allocations("net.none").await,
        Err(IpamError::NotFound(_))
    ));
    assert_eq!(
        ipam.store().revision().await.unwrap(),
        before,
        "a refused request wrote something"
    );
}

#[tokio::test]
async fn an_exhausted_pool_is_a_clear_error_and_leaves_nothing() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("tiny", "10.14.0.0/30", 30))
        .await
        .unwrap();
    ipam.auto_assign(&req("net.a", "node-a", 3, 0))
        .await
        .unwrap();
    let e = ipam
        .auto_assign(&req("net.b", "node-a", 2, 0))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains("tiny")),
        "{e}"
    );
    assert!(matches!(
        ipam.handle_allocations("net.b").await,
        Err(IpamError::NotFound(_))
    ));
    assert_eq!(ipam.usage("").await.unwrap().0[0].used, 3);
}

#[tokio::test]
async fn pools_in_use_cannot_be_deleted_or_resized_but_can_be_disabled() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.15.0.0/24", 26))
        .await
        .unwrap();
    ipam.auto_assign(&req("net.a", "node-a", 1, 0))
        .await
        .unwrap();
    let e = ipam.delete_pool("p").await.unwrap_err().to_string();
    assert!(
        e.contains("1 address(es) in use") && e.contains("10.15.0."),
        "{e}"
    );
    let (mut p, rev) = ipam.get_pool("p").await.unwrap();
    p.block_size = 28;
    let e = ipam
        .update_pool(&p, Some(rev))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot change"), "{e}");
    p.block_size = 26;
    p.disabled = true;
    ipam.update_pool(&p, Some(rev)).await.unwrap();
    let e = ipam.update_pool(&p, Some(rev)).await.unwrap_err();
    assert!(matches!(e, IpamError::Stale(_)), "{e}");
    let e = ipam
        .auto_assign(&req("net.b", "node-a", 1, 0))
        .await
        .unwrap_err();
    assert!(matches!(e, IpamError::Exhausted(_)), "{e}");
    ipam.release_by_handle("net.a").await.unwrap();
    ipam.delete_pool("p").await.unwrap();
    assert!(
        ipam.usage("").await.unwrap().1.is_empty(),
        "empty blocks go with the pool"
    );
}

#[tokio::test]
async fn node_selectors_pick_the_pools() {
    let (ipam, _d) = ipam().await;
    let mut a = pool("zone-a", "10.16.0.0/24", 26);
    a.node_selector = "zone == 'a'".into();
    let mut b = pool("zone-b", "10.17.0.0/24", 26);
    b.node_selector = "zone == 'b'".into();
    ipam.create_pool(&a).await.unwrap();
    ipam.create_pool(&b).await.unwrap();
    let mut node = Node::new("node-b");
    node.labels.insert("zone".into(), "b".into());
    ipam.register_node(&node, None).await.unwrap();
    let (v4, _) = ipam
        .auto_assign(&req("net.x", "node-b", 1, 0))
        .await
        .unwrap();
    assert_eq!(v4[0].pool, "zone-b");
    let e = ipam
        .auto_assign(&req("net.y", "node-unlabelled", 1, 0))
        .await
        .unwrap_err();
    assert!(matches!(e, IpamError::Exhausted(_)), "{e}");
}

#[tokio::test]
async fn an_empty_block_goes_back_to_the_pool_after_the_grace_period() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.18.0.0/24", 26))
        .await
        .unwrap();
    ipam.auto_assign(&req("net.a", "node-a", 1, 0))
        .await
        .unwrap();
    ipam.release_by_handle("net.a").await.unwrap();
    // Within the grace period (default 300 s) the empty block stays the node's.
    assert!(
        ipam.reclaim_empty_blocks("node-a")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(ipam.usage("").await.unwrap().1.len(), 1);
    ipam.set_config(&IpamConfig {
        empty_block_grace_s: 0,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    let back = ipam.reclaim_empty_blocks("node-a").await.unwrap();
    assert_eq!(back.len(), 1);
    assert!(
        ipam.usage("").await.unwrap().1.is_empty(),
        "the block is gone"
    );
    assert!(ipam.check().await.unwrap().problems.is_empty());
    // And a new allocation claims a block again.
    ipam.auto_assign(&req("net.b", "node-a", 1, 0))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_one_node_share_transactions_and_never_collide() {
    let (ipam, _d) = ipam().await;
    ipam.create_pool(&pool("p", "10.19.0.0/22", 26))
        .await
        .unwrap();
    let ipam = std::sync::Arc::new(ipam);
    // Warm the node's cached state, then 8 tasks x 60 requests at once.
    ipam.auto_assign(&req("net.warm", "node-a", 1, 0))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let ipam = ipam.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..60 {
                    let (v4, _) = ipam
                        .auto_assign(&req(&format!("net.t{t}-{i}"), "node-a", 1, 0))
                        .await
                        .unwrap();
                    assert_eq!(v4.len(), 1);
                    got.push((format!("net.t{t}-{i}"), v4[0].address));
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let distinct: HashSet<IpAddr> = all.iter().map(|(_, a)| *a).collect();
    assert_eq!(distinct.len(), 480, "an address was handed out twice");
    for (handle, addr) in &all {
        let held = ipam.handle_allocations(handle).await.unwrap();
        assert_eq!(held.len(), 1, "{handle}");
        assert_eq!(held[0].address, *addr);
    }
    let report = ipam.check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.allocations, 481);
}

#[tokio::test]
async fn registering_an_unchanged_node_writes_nothing() {
    let (ipam, _d) = ipam().await;
    let mut node = Node::new("node-r");
    node.ipv4 = Some("10.77.0.9/16".parse().unwrap());
    let first = ipam.register_node(&node, None).await.unwrap();
    let store_rev = ipam.store().revision().await.unwrap();
    // A restart registers the same node again: nothing is written, nobody is woken.
    assert_eq!(ipam.register_node(&node, None).await.unwrap(), first);
    assert_eq!(ipam.store().revision().await.unwrap(), store_rev);
    // A change is written.
    node.labels.insert("zone".into(), "a".into());
    let second = ipam.register_node(&node, None).await.unwrap();
    assert!(second > first);
    assert_eq!(ipam.get_node("node-r").await.unwrap(), (node, second));
}
