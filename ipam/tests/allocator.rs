//! The allocator's rules one by one, on a SQLite store: pools, claims and their states, the
//! block limit, borrowing and strict affinity, dual stack all-or-nothing, release guards,
//! GC, node removal, and bad input that writes nothing. Each rule is one test body run for
//! IPv4 and for IPv6 (`both_families!`), with the family's spelling of its pools and addresses.
//!
//! Why this file is long: one short test per allocator rule, sharing the store set-up above them.

// This file is also the module of the per-object runs (`allocator_per_object.rs`, and
// interop-tests' `kube_ipam_allocator.rs` on a real kube-apiserver), whose crate root
// says `PER_OBJECT` and `fresh_store`; these two go unused there.
#[allow(dead_code)]
const PER_OBJECT: bool = false;
#[allow(dead_code)]
async fn fresh_store() -> (datastore::Store, common::Backing) {
    common::sqlite().await
}

#[macro_use]
pub mod common;

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use common::{
    assert_distinct_and_held, block_of, concurrent_requests, counts_of, dual_pools, ipam, pick,
    pool, req, req_of,
};
use datastore::contract::Datastore;
use datastore::model::{EncapMode, IpFamily, IpPool, IpamConfig, Node};
use ipam::IpamError;
use ipam::allocator::{ReleaseRequest, tunnel_handle};
use ipam::block::AffinityState;

both_families!(
    a_node_claims_a_confirmed_block_and_fills_it_before_the_next,
    nodes_walk_the_pool_in_different_orders,
    the_block_limit_then_borrowing_then_strict_affinity,
    a_stale_release_never_frees_a_reused_address,
    freed_addresses_are_reused_oldest_first,
    a_specific_address_and_its_errors,
    gc_releases_dead_handles_of_the_node_but_not_tunnels,
    gc_settles_handles_whose_addresses_no_block_holds,
    removing_a_node_releases_its_addresses_and_blocks,
    bad_input_is_refused_and_writes_nothing,
    an_exhausted_pool_is_a_clear_error_and_leaves_nothing,
    pools_in_use_cannot_be_deleted_or_resized_but_can_be_disabled,
    node_selectors_pick_the_pools,
    an_empty_block_goes_back_to_the_pool_after_the_grace_period,
    concurrent_requests_on_one_node_share_transactions_and_never_collide,
    a_claim_and_a_release_without_grace_are_one_commit_each,
    half_done_claims_and_releases_of_older_versions_are_finished,
);

async fn a_node_claims_a_confirmed_block_and_fills_it_before_the_next(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.1.0.0/24", "fd00:1::/120");
    ipam.create_pool(&pool("p", cidr, block_of(f, 4)))
        .await
        .unwrap();
    let got = |(v4, v6): (Vec<_>, Vec<_>)| match f {
        IpFamily::V4 => v4,
        IpFamily::V6 => v6,
    };
    let a = got(ipam
        .auto_assign(&req_of(f, "net.c1", "node-a", 10))
        .await
        .unwrap());
    let b = got(ipam
        .auto_assign(&req_of(f, "net.c2", "node-a", 10))
        .await
        .unwrap());
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
    assert!(
        a.iter()
            .chain(&b)
            .all(|x| IpFamily::of(x.address) == f && x.block.contains(&x.address))
    );
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r.state == Some(AffinityState::Confirmed)
                && r.affinity.as_deref() == Some("node-a")
                && r.cidr.prefix_len() == block_of(f, 4))
    );
    assert_eq!(rows.iter().map(|r| r.used).sum::<u32>(), 20);
    assert!(ipam.check().await.unwrap().problems.is_empty());
}

async fn nodes_walk_the_pool_in_different_orders(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.2.0.0/16", "fd00:2::/112");
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    let mut firsts = HashSet::new();
    for n in 0..8 {
        let (v4, v6) = ipam
            .auto_assign(&req_of(f, &format!("net.{n}"), &format!("node-{n}"), 1))
            .await
            .unwrap();
        firsts.insert(v4.into_iter().chain(v6).next().unwrap().block);
    }
    assert_eq!(firsts.len(), 8, "each node starts at its own block");
}

async fn the_block_limit_then_borrowing_then_strict_affinity(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.3.0.0/28", "fd00:3::/124");
    ipam.create_pool(&pool("p", cidr, block_of(f, 2)))
        .await
        .unwrap();
    ipam.set_config(&IpamConfig {
        max_blocks_per_host: 1,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    ipam.auto_assign(&req_of(f, "net.a", "node-a", 4))
        .await
        .unwrap();
    // node-a is at its limit and its block is full; no other block exists yet.
    let e = ipam
        .auto_assign(&req_of(f, "net.a2", "node-a", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains("limit of 1") && m.contains(f.name())),
        "{e}"
    );
    // node-b claims a block; node-a may then borrow from it.
    ipam.auto_assign(&req_of(f, "net.b", "node-b", 1))
        .await
        .unwrap();
    let (v4, v6) = ipam
        .auto_assign(&req_of(f, "net.a3", "node-a", 1))
        .await
        .unwrap();
    let borrowed = v4.into_iter().chain(v6).next().unwrap();
    assert!(borrowed.borrowed, "{borrowed:?}");
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(rows.iter().map(|r| r.borrowed).sum::<u32>(), 1);
    let lender = rows.iter().find(|r| r.cidr == borrowed.block).unwrap();
    assert_eq!(lender.affinity.as_deref(), Some("node-b"));
    // Strict affinity: no borrowing, per request or cluster-wide.
    let mut strict = req_of(f, "net.a4", "node-a", 1);
    strict.strict_affinity = true;
    let e = ipam.auto_assign(&strict).await.unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains("strict")),
        "{e}"
    );
    ipam.set_config(&IpamConfig {
        max_blocks_per_host: 1,
        strict_affinity: true,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    let e = ipam
        .auto_assign(&req_of(f, "net.a5", "node-a", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains("strict")),
        "{e}"
    );
    for h in ["net.a4", "net.a5"] {
        assert!(matches!(
            ipam.handle_allocations(h).await,
            Err(IpamError::NotFound(_))
        ));
    }
    assert!(ipam.check().await.unwrap().problems.is_empty());
}

#[tokio::test]
async fn dual_stack_is_all_or_nothing() {
    let (ipam, _d) = ipam().await;
    dual_pools(&ipam, ("10.4.0.0/24", 26), ("fd00:4::/120", 122)).await;
    let (v4, v6) = ipam
        .auto_assign(&req("net.ds", "node-a", 1, 1))
        .await
        .unwrap();
    assert!(v4[0].address.is_ipv4() && v6[0].address.is_ipv6());
    let used = |pool: &'static str| {
        let ipam = &ipam;
        async move { ipam.usage(pool).await.unwrap().0[0].used }
    };
    // 300 IPv6 addresses do not exist in a /120: the IPv4 part must be undone; 300 IPv4
    // addresses not in a /24: no IPv6 address may stay behind.
    for (handle, n4, n6) in [("net.big6", 1, 300), ("net.big4", 300, 1)] {
        let before = (used("v4").await, used("v6").await);
        let e = ipam
            .auto_assign(&req(handle, "node-a", n4, n6))
            .await
            .unwrap_err();
        assert!(matches!(e, IpamError::Exhausted(_)), "{e}");
        assert_eq!(
            (used("v4").await, used("v6").await),
            before,
            "an address leaked"
        );
        assert!(matches!(
            ipam.handle_allocations(handle).await,
            Err(IpamError::NotFound(_))
        ));
    }
    assert!(ipam.check().await.unwrap().problems.is_empty());
}

async fn a_stale_release_never_frees_a_reused_address(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.5.0.0/30", "fd00:5::/126");
    ipam.create_pool(&pool("p", cidr, block_of(f, 2)))
        .await
        .unwrap();
    let (v4, v6) = ipam
        .auto_assign(&req_of(f, "net.old", "node-a", 1))
        .await
        .unwrap();
    let first = v4.into_iter().chain(v6).next().unwrap();
    let addr = first.address;
    ipam.release_by_handle("net.old").await.unwrap();
    // Fill the block so the address is handed out again.
    let (v4, v6) = ipam
        .auto_assign(&req_of(f, "net.new", "node-a", 4))
        .await
        .unwrap();
    assert!(v4.iter().chain(&v6).any(|a| a.address == addr));
    let stale = ReleaseRequest {
        address: addr,
        handle: Some("net.old".into()),
        seq: None,
    };
    assert!(ipam.release_ips(&[stale]).await.unwrap().is_empty());
    let stale_seq = ReleaseRequest {
        address: addr,
        handle: None,
        seq: Some(first.seq),
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

async fn freed_addresses_are_reused_oldest_first(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.6.0.0/29", "fd00:6::/125");
    ipam.create_pool(&pool("p", cidr, block_of(f, 3)))
        .await
        .unwrap();
    let one = |handle: String| {
        let ipam = &ipam;
        async move {
            let (v4, v6) = ipam
                .auto_assign(&req_of(f, &handle, "node-a", 1))
                .await
                .unwrap();
            v4.into_iter().chain(v6).next().unwrap().address
        }
    };
    let mut held = Vec::new();
    for i in 0..8 {
        held.push(one(format!("net.{i}")).await);
    }
    for i in [5, 2, 7] {
        ipam.release_by_handle(&format!("net.{i}")).await.unwrap();
    }
    let mut reused = Vec::new();
    for i in 0..3 {
        reused.push(one(format!("net.r{i}")).await);
    }
    assert_eq!(reused, vec![held[5], held[2], held[7]]);
}

async fn a_specific_address_and_its_errors(f: IpFamily) {
    let (ipam, backing) = ipam().await;
    let cidr = pick(f, "10.7.0.0/24", "fd00:7::/120");
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    let a: IpAddr = pick(f, "10.7.0.70", "fd00:7::46").parse().unwrap();
    let got = ipam
        .assign_ip(a, "reserved.gw", &BTreeMap::new(), "node-a")
        .await
        .unwrap();
    assert_eq!(
        got.block.to_string(),
        pick(f, "10.7.0.64/26", "fd00:7::40/122")
    );
    assert!(!got.borrowed, "the node claimed the block of the address");
    let e = ipam
        .assign_ip(a, "other", &BTreeMap::new(), "node-b")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::InUse(m) if m.contains("reserved.gw")),
        "{e}"
    );
    let before = backing.writes().await;
    let outside: IpAddr = pick(f, "10.99.0.1", "fd00:99::1").parse().unwrap();
    let e = ipam
        .assign_ip(outside, "x", &BTreeMap::new(), "node-a")
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            IpamError::InvalidArgument {
                field: "address",
                reason,
            } if reason.contains(f.name())
        ),
        "{e}"
    );
    assert_eq!(backing.writes().await, before);
}

async fn gc_releases_dead_handles_of_the_node_but_not_tunnels(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.8.0.0/24", "fd00:8::/120");
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    for h in ["k8s.c1", "k8s.c2", "k8s.c3"] {
        ipam.auto_assign(&req_of(f, h, "node-a", 1)).await.unwrap();
    }
    ipam.auto_assign(&req_of(f, "other.c9", "node-a", 1))
        .await
        .unwrap();
    ipam.auto_assign(&req_of(f, "k8s.b1", "node-b", 1))
        .await
        .unwrap();
    let tunnel_handle = tunnel_handle(f, "node-a");
    let mut tunnel = req_of(f, &tunnel_handle, "node-a", 1);
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
    // With no prefix every dead handle of the node goes, its tunnel address still stays.
    let released: Vec<String> = ipam
        .gc("node-a", &live, "", false)
        .await
        .unwrap()
        .into_iter()
        .map(|(h, _)| h)
        .collect();
    assert_eq!(released, ["other.c9"]);
    for kept in ["k8s.c2", "k8s.b1", tunnel_handle.as_str()] {
        assert_eq!(
            ipam.handle_allocations(kept).await.unwrap().len(),
            1,
            "{kept}"
        );
    }
}

/// A handle whose count no block holds (its allocation's handle step landed after the pod's
/// DEL: a writer killed with that request in flight) is found by the node's GC through the
/// node's block it names, and settled; a live one, and one naming another node's block, stay.
async fn gc_settles_handles_whose_addresses_no_block_holds(f: IpFamily) {
    use datastore::resource::{Resource, encode};
    use ipam::block::Handle;
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.22.0.0/24", "fd00:22::/120");
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    let mut blocks = Vec::new();
    for (handle, node) in [("net.a", "node-a"), ("net.b", "node-b")] {
        let (v4, v6) = ipam.auto_assign(&req_of(f, handle, node, 1)).await.unwrap();
        blocks.push(v4.into_iter().chain(v6).next().unwrap().block);
    }
    for (id, block) in [
        ("net.ghost", blocks[0]),
        ("net.live-ghost", blocks[0]),
        ("net.other", blocks[1]),
    ] {
        let mut h = Handle {
            id: id.into(),
            ..Handle::default()
        };
        h.add(&block, 1);
        ipam.store()
            .create(Handle::kind(), id, encode(&h))
            .await
            .unwrap();
    }
    let live: HashSet<String> = ["net.a", "net.live-ghost"].map(String::from).into();
    let released = ipam.gc("node-a", &live, "", false).await.unwrap();
    assert_eq!(released, vec![("net.ghost".to_owned(), vec![])]);
    let stored = |id: &'static str| {
        let store = ipam.store().clone();
        async move { store.get(Handle::kind(), id).await.unwrap().is_some() }
    };
    assert!(!stored("net.ghost").await, "the ghost was settled");
    assert!(stored("net.live-ghost").await, "a live handle stays");
    assert!(stored("net.other").await, "another node's stays");
    assert_eq!(ipam.handle_allocations("net.a").await.unwrap().len(), 1);
}

async fn removing_a_node_releases_its_addresses_and_blocks(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.9.0.0/24", "fd00:9::/120");
    ipam.create_pool(&pool("p", cidr, block_of(f, 4)))
        .await
        .unwrap();
    datastore::Resources::new(ipam.store())
        .register_node(&Node::new("node-a"), None)
        .await
        .unwrap();
    ipam.auto_assign(&req_of(f, "net.a", "node-a", 3))
        .await
        .unwrap();
    let mut tunnel = req_of(f, &tunnel_handle(f, "node-a"), "node-a", 1);
    tunnel.use_tunnel = true;
    ipam.auto_assign(&tunnel).await.unwrap();
    // node-b borrows from node-a's block once node-b is at its limit with no block of its own.
    ipam.set_config(&IpamConfig {
        max_blocks_per_host: 0,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    let (v4, v6) = ipam
        .auto_assign(&req_of(f, "net.b", "node-b", 1))
        .await
        .unwrap();
    assert!(v4.iter().chain(&v6).all(|a| a.borrowed));
    let (blocks, addrs) = ipam.delete_node("node-a").await.unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(addrs.len(), 4);
    assert!(addrs.iter().all(|a| IpFamily::of(*a) == f));
    assert!(matches!(
        datastore::Resources::new(ipam.store())
            .get_node("node-a")
            .await,
        Err(datastore::ResourceError::NotFound(_))
    ));
    assert!(matches!(
        ipam.handle_allocations(&tunnel_handle(f, "node-a")).await,
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

async fn bad_input_is_refused_and_writes_nothing(f: IpFamily) {
    let (ipam, backing) = ipam().await;
    let base = pick(f, "10.10.0.0/16", "fd00:10::/64");
    ipam.create_pool(&IpPool::new("p", base.parse().unwrap()))
        .await
        .unwrap();
    let before = backing.writes().await;
    let other = pick(f, "10.12.0.0/16", "fd00:12::/64");
    let default = IpPool::new("q", other.parse().unwrap()).block_size;
    // Block sizes that do not fit the family: just outside its range, and the other
    // family's default (a /122 for IPv4, a /26 for IPv6); IPv6 also the subnet-sized /64.
    let (min, max, foreign) = match f {
        IpFamily::V4 => (20, 32, 122),
        IpFamily::V6 => (116, 128, 26),
    };
    let mut sizes = vec![min - 1, max + 1, foreign];
    if f == IpFamily::V6 {
        sizes.push(64);
    }
    let mut cases: Vec<(IpPool, &str, &str)> = sizes
        .into_iter()
        .map(|size| (pool("q", other, size), "block_size", "out of range"))
        .collect();
    cases.extend([
        (
            pool(
                "q",
                pick(f, "10.10.128.0/20", "fd00:10:0:0:8000::/80"),
                default,
            ),
            "cidr",
            "overlaps pool p",
        ),
        (
            pool("q", pick(f, "10.11.0.1/16", "fd00:11::1/64"), default),
            "cidr",
            "not a network address",
        ),
        (
            {
                let mut p = pool("q", other, default);
                p.node_selector = "zone == 'a' &&".into();
                p
            },
            "node_selector",
            "position 14",
        ),
        (
            {
                let mut p = pool("q", other, default);
                p.vxlan_mode = EncapMode::Always;
                p.ipip_mode = EncapMode::Always;
                p
            },
            "ipip_mode",
            "not both",
        ),
        (pool("p", other, default), "pool p", "already exists"),
    ]);
    for (p, field, needle) in cases {
        let e = ipam.create_pool(&p).await.unwrap_err().to_string();
        assert!(e.contains(field) && e.contains(needle), "{p:?}: {e}");
    }
    let e = ipam
        .auto_assign(&req_of(f, "", "node-a", 1))
        .await
        .unwrap_err();
    assert!(matches!(
        e,
        IpamError::InvalidArgument {
            field: "handle",
            ..
        }
    ));
    let mut named = req_of(f, "net.x", "node-a", 1);
    let field = match f {
        IpFamily::V4 => {
            named.v4_pools = vec!["nope".into()];
            "ipv4_pools"
        }
        IpFamily::V6 => {
            named.v6_pools = vec!["nope".into()];
            "ipv6_pools"
        }
    };
    let e = ipam.auto_assign(&named).await.unwrap_err();
    assert!(
        matches!(&e, IpamError::InvalidArgument { field: got, .. } if *got == field),
        "{e}"
    );
    assert!(matches!(
        ipam.handle_allocations("net.none").await,
        Err(IpamError::NotFound(_))
    ));
    assert_eq!(
        backing.writes().await,
        before,
        "a refused request wrote something"
    );
    assert_eq!(ipam.list_pools().await.unwrap().len(), 1);
}

async fn an_exhausted_pool_is_a_clear_error_and_leaves_nothing(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.14.0.0/30", "fd00:14::/126");
    ipam.create_pool(&pool("tiny", cidr, block_of(f, 2)))
        .await
        .unwrap();
    ipam.auto_assign(&req_of(f, "net.a", "node-a", 3))
        .await
        .unwrap();
    let e = ipam
        .auto_assign(&req_of(f, "net.b", "node-a", 2))
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

async fn pools_in_use_cannot_be_deleted_or_resized_but_can_be_disabled(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.15.0.0/24", "fd00:15::/120");
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    ipam.auto_assign(&req_of(f, "net.a", "node-a", 1))
        .await
        .unwrap();
    let e = ipam.delete_pool("p").await.unwrap_err().to_string();
    assert!(
        e.contains("1 address(es) in use") && e.contains(pick(f, "10.15.0.", "fd00:15::")),
        "{e}"
    );
    let (mut p, rev) = ipam.get_pool("p").await.unwrap();
    p.block_size = block_of(f, 4);
    let e = ipam
        .update_pool(&p, Some(rev))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot change"), "{e}");
    p.block_size = block_of(f, 6);
    p.disabled = true;
    ipam.update_pool(&p, Some(rev)).await.unwrap();
    let e = ipam.update_pool(&p, Some(rev)).await.unwrap_err();
    assert!(matches!(e, IpamError::Stale(_)), "{e}");
    let e = ipam
        .auto_assign(&req_of(f, "net.b", "node-a", 1))
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

async fn node_selectors_pick_the_pools(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let mut a = pool(
        "zone-a",
        pick(f, "10.16.0.0/24", "fd00:16::/120"),
        block_of(f, 6),
    );
    a.node_selector = "zone == 'a'".into();
    let mut b = pool(
        "zone-b",
        pick(f, "10.17.0.0/24", "fd00:17::/120"),
        block_of(f, 6),
    );
    b.node_selector = "zone == 'b'".into();
    ipam.create_pool(&a).await.unwrap();
    ipam.create_pool(&b).await.unwrap();
    let mut node = Node::new("node-b");
    node.labels.insert("zone".into(), "b".into());
    datastore::Resources::new(ipam.store())
        .register_node(&node, None)
        .await
        .unwrap();
    let (v4, v6) = ipam
        .auto_assign(&req_of(f, "net.x", "node-b", 1))
        .await
        .unwrap();
    assert_eq!(v4.into_iter().chain(v6).next().unwrap().pool, "zone-b");
    let e = ipam
        .auto_assign(&req_of(f, "net.y", "node-unlabelled", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains(f.name())),
        "{e}"
    );
}

async fn an_empty_block_goes_back_to_the_pool_after_the_grace_period(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.18.0.0/24", "fd00:18::/120");
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    ipam.auto_assign(&req_of(f, "net.a", "node-a", 1))
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
    ipam.auto_assign(&req_of(f, "net.b", "node-a", 1))
        .await
        .unwrap();
}

async fn concurrent_requests_on_one_node_share_transactions_and_never_collide(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.19.0.0/22", "fd00:19::/118");
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    let ipam = std::sync::Arc::new(ipam);
    // Warm the node's cached state, then 8 tasks x 60 requests at once.
    ipam.auto_assign(&req_of(f, "net.warm", "node-a", 1))
        .await
        .unwrap();
    let (n4, n6) = counts_of(f, 1);
    let all = concurrent_requests(&ipam, 8, 60, move |_, _| ("node-a", n4, n6)).await;
    assert_eq!(all.len(), 480);
    assert!(all.iter().all(|(_, a)| IpFamily::of(a[0]) == f));
    // The 480 and the warm-up's one.
    assert_eq!(assert_distinct_and_held(&ipam, &all).await, 481);
}

#[tokio::test]
async fn registering_an_unchanged_node_writes_nothing() {
    let (ipam, backing) = ipam().await;
    let mut node = Node::new("node-r");
    node.ipv4 = Some("10.77.0.9/16".parse().unwrap());
    let first = datastore::Resources::new(ipam.store())
        .register_node(&node, None)
        .await
        .unwrap();
    let written = backing.writes().await;
    // A restart registers the same node again: nothing is written, nobody is woken.
    assert_eq!(
        datastore::Resources::new(ipam.store())
            .register_node(&node, None)
            .await
            .unwrap(),
        first
    );
    assert_eq!(backing.writes().await, written);
    // A change is written.
    node.labels.insert("zone".into(), "a".into());
    let second = datastore::Resources::new(ipam.store())
        .register_node(&node, None)
        .await
        .unwrap();
    assert_ne!(second, first, "a changed node has a new version");
    assert_eq!(
        datastore::Resources::new(ipam.store())
            .get_node("node-r")
            .await
            .unwrap(),
        (node, second)
    );
}

/// A new block is claimed with its first address in one transaction (block, confirmed
/// affinity, handle): every node's datastore watch wakes once for it. Without a grace period,
/// the release that empties it gives block and affinity back in the same transaction. On
/// the per-object path the same steps are one write each, in Calico's order: a claim with
/// its address is five (affinity pending, block, affinity confirmed, handle, block with the
/// address); the release four (affinity pending deletion, block, affinity, handle).
async fn a_claim_and_a_release_without_grace_are_one_commit_each(f: IpFamily) {
    let (claim, release) = if crate::PER_OBJECT { (5, 4) } else { (1, 1) };
    let (ipam, backing) = ipam().await;
    let cidr = pick(f, "10.20.0.0/24", "fd00:20::/120");
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    ipam.set_config(&IpamConfig {
        empty_block_grace_s: 0,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    let rev = || backing.writes();
    let before = rev().await;
    ipam.auto_assign(&req_of(f, "net.a", "node-a", 1))
        .await
        .unwrap();
    assert_eq!(
        rev().await,
        before + claim,
        "a claim with its address: {claim} commit(s)"
    );
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, Some(AffinityState::Confirmed));
    // A given address claims its block the same way (one of a block nobody has).
    let free = cidr
        .parse::<ipnet::IpNet>()
        .unwrap()
        .subnets(block_of(f, 6))
        .unwrap()
        .find(|b| *b != rows[0].cidr)
        .unwrap();
    let other = match free.network() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) + 1).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) + 1).into()),
    };
    let before = rev().await;
    ipam.assign_ip(other, "net.b", &BTreeMap::new(), "node-b")
        .await
        .unwrap();
    assert_eq!(
        rev().await,
        before + claim,
        "assign_ip into a new block: {claim} commit(s)"
    );
    let (_, rows) = ipam.usage("").await.unwrap();
    assert!(
        rows.iter().any(|r| r.affinity.as_deref() == Some("node-b")
            && r.state == Some(AffinityState::Confirmed)),
        "{rows:?}"
    );
    let before = rev().await;
    ipam.release_by_handle("net.a").await.unwrap();
    assert_eq!(
        rev().await,
        before + release,
        "the release that empties it: {release} commit(s)"
    );
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(
        rows.len(),
        1,
        "node-a's block went back with its affinity: {rows:?}"
    );
    assert!(ipam.check().await.unwrap().problems.is_empty());
}

/// What an older version's three-step claim or two-step release left behind when it
/// crashed (an affinity pending without its block; one marked for deletion) is finished by
/// the next allocation or reclaim, and checks clean after.
async fn half_done_claims_and_releases_of_older_versions_are_finished(f: IpFamily) {
    use datastore::resource::{Resource, encode};
    use ipam::block::{Block, BlockAffinity};
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.21.0.0/26", "fd00:21::/122");
    // One block only, so the next claim must be the one left half done.
    ipam.create_pool(&pool("p", cidr, block_of(f, 6)))
        .await
        .unwrap();
    let block: ipnet::IpNet = cidr.parse().unwrap();
    let pending = BlockAffinity {
        node: "node-a".into(),
        cidr: block,
        state: AffinityState::Pending,
    };
    // Written one object at a time, as an older version did (and as every backend can).
    let store = ipam.store();
    let affinities = BlockAffinity::kind();
    let name = affinities
        .name_of(&BlockAffinity::key_of("node-a", &block))
        .unwrap()
        .to_owned();
    store
        .create(affinities, &name, encode(&pending))
        .await
        .unwrap();
    let (v4, v6) = ipam
        .auto_assign(&req_of(f, "net.a", "node-a", 1))
        .await
        .unwrap();
    let got = v4.into_iter().chain(v6).next().unwrap();
    assert_eq!(got.block, block);
    assert!(!got.borrowed);
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(rows[0].state, Some(AffinityState::Confirmed), "{rows:?}");
    assert!(ipam.check().await.unwrap().problems.is_empty());
    // A release marked pending deletion by an older version, then addresses freed: the
    // reclaim gives the block back.
    let current = store.get(affinities, &name).await.unwrap().unwrap();
    let marked = BlockAffinity {
        state: AffinityState::PendingDeletion,
        ..pending
    };
    store
        .update(affinities, &name, encode(&marked), current.version)
        .await
        .unwrap();
    ipam.release_by_handle("net.a").await.unwrap();
    ipam.set_config(&IpamConfig {
        empty_block_grace_s: 0,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(
        ipam.reclaim_empty_blocks("node-a").await.unwrap(),
        vec![block]
    );
    assert!(ipam.usage("").await.unwrap().1.is_empty());
    assert!(store.get(affinities, &name).await.unwrap().is_none());
    assert!(
        store
            .get(Block::kind(), &ipam::block::cidr_key(&block))
            .await
            .unwrap()
            .is_none()
    );
    // Marked, but an address came back meanwhile: the block stays, confirmed again.
    ipam.auto_assign(&req_of(f, "net.b", "node-a", 1))
        .await
        .unwrap();
    let current = store.get(affinities, &name).await.unwrap().unwrap();
    store
        .update(affinities, &name, encode(&marked), current.version)
        .await
        .unwrap();
    assert_eq!(ipam.reclaim_empty_blocks("node-a").await.unwrap(), vec![]);
    let (_, rows) = ipam.usage("").await.unwrap();
    assert_eq!(rows[0].state, Some(AffinityState::Confirmed), "{rows:?}");
    assert!(ipam.check().await.unwrap().problems.is_empty());
}
