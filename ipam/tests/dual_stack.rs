//! IPAM with pools of both families side by side: IPv6 pools' defaults and modes, dual-stack
//! requests (one transaction from a warm node, no collisions under concurrency), a block
//! limit per family, requests naming a pool of the wrong family, the tunnel addresses of
//! both families through GC and node removal, and `check` finding damage in either family.

// This file is also the module of the per-object runs (`dual_stack_per_object.rs`, and
// interop-tests' `kube_ipam_dual_stack.rs` on a real kube-apiserver), whose crate root
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
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{
    assert_distinct_and_held, concurrent_requests, dual_pools, ipam, pick, pool, req, req_of,
};
use datastore::contract::{
    Atomic, Datastore, KeyValue, Kind, Listing, Object, ObjectList, ObjectWatch, Op, Read,
    ReadResult, Revision, StoreError, Version, Watch,
};
use datastore::model::{EncapMode, IpFamily, IpPool, IpamConfig, Node};
use datastore::resource::{Resource, decode, encode};
use datastore::sqlite::{SqliteOptions, SqliteStore};
use ipam::IpamError;
use ipam::allocator::{Ipam, is_tunnel_handle, tunnel_handle};
use ipam::block::{Block, Handle, Slot, cidr_key};

/// A store that counts the round trips made to it.
struct Counting<D> {
    inner: D,
    reads: AtomicU64,
    txns: AtomicU64,
}

impl<D> Counting<D> {
    /// (reads, transactions) since the last call.
    fn take(&self) -> (u64, u64) {
        (
            self.reads.swap(0, Ordering::SeqCst),
            self.txns.swap(0, Ordering::SeqCst),
        )
    }
}

type Result<T> = std::result::Result<T, StoreError>;

impl<D: Datastore + Atomic> Datastore for Counting<D> {
    type Atomic = Self;

    fn get(&self, kind: Kind, name: &str) -> impl Future<Output = Result<Option<Object>>> + Send {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get(kind, name)
    }
    fn list(&self, kind: Kind, prefix: &str) -> impl Future<Output = Result<ObjectList>> + Send {
        self.reads.fetch_add(1, Ordering::SeqCst);
        Datastore::list(&self.inner, kind, prefix)
    }
    fn create(
        &self,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
    ) -> impl Future<Output = Result<Version>> + Send {
        self.txns.fetch_add(1, Ordering::SeqCst);
        self.inner.create(kind, name, value)
    }
    fn update(
        &self,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
        expected: Version,
    ) -> impl Future<Output = Result<Version>> + Send {
        self.txns.fetch_add(1, Ordering::SeqCst);
        self.inner.update(kind, name, value, expected)
    }
    fn delete(
        &self,
        kind: Kind,
        name: &str,
        expected: Version,
    ) -> impl Future<Output = Result<()>> + Send {
        self.txns.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(kind, name, expected)
    }
    fn watch(&self, kind: Kind, from: Version) -> impl Future<Output = Result<ObjectWatch>> + Send {
        self.inner.watch(kind, from)
    }
    fn atomic(&self) -> Option<&Self> {
        Some(self)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

impl<D: Datastore + Atomic> Atomic for Counting<D> {
    fn get_key(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>>> + Send {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get_key(key)
    }
    fn list_keys(&self, prefix: &str) -> impl Future<Output = Result<Listing>> + Send {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.list_keys(prefix)
    }
    fn read(
        &self,
        reads: Vec<Read>,
    ) -> impl Future<Output = Result<(Vec<ReadResult>, Revision)>> + Send {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read(reads)
    }
    fn txn(&self, ops: Vec<Op>) -> impl Future<Output = Result<Revision>> + Send {
        self.txns.fetch_add(1, Ordering::SeqCst);
        self.inner.txn(ops)
    }
    fn watch_keys(
        &self,
        prefix: &str,
        after: Revision,
    ) -> impl Future<Output = Result<Watch>> + Send {
        self.inner.watch_keys(prefix, after)
    }
    fn revision(&self) -> impl Future<Output = Result<Revision>> + Send {
        self.inner.revision()
    }
    fn compact(&self, revision: Revision) -> impl Future<Output = Result<()>> + Send {
        self.inner.compact(revision)
    }
}

#[tokio::test]
async fn ipv6_pools_have_122_blocks_and_their_own_modes() {
    let (ipam, _d) = ipam().await;
    let modes = [
        ("always", "fd00:30::/48", EncapMode::Always, true),
        ("cross", "fd00:31::/48", EncapMode::CrossSubnet, false),
        ("never", "fd00:32::/48", EncapMode::Never, true),
    ];
    for (name, cidr, mode, nat) in modes {
        let mut p = IpPool::new(name, cidr.parse().unwrap());
        assert_eq!(p.block_size, 122);
        p.vxlan_mode = mode;
        p.nat_outgoing = nat;
        ipam.create_pool(&p).await.unwrap();
    }
    for (name, _, mode, nat) in modes {
        let (p, _) = ipam.get_pool(name).await.unwrap();
        assert_eq!(
            (p.block_size, p.vxlan_mode, p.nat_outgoing),
            (122, mode, nat)
        );
    }
    // IPIP carries IPv4 only.
    let mut ipip = IpPool::new("ipip", "fd00:33::/48".parse().unwrap());
    ipip.ipip_mode = EncapMode::Always;
    let e = ipam.create_pool(&ipip).await.unwrap_err();
    assert!(
        matches!(
            e,
            IpamError::InvalidArgument {
                field: "ipip_mode",
                ..
            }
        ),
        "{e}"
    );
    let mut named = req("net.a", "node-a", 0, 1);
    named.v6_pools = vec!["always".into()];
    let (_, v6) = ipam.auto_assign(&named).await.unwrap();
    assert_eq!(v6[0].block.prefix_len(), 122);
    assert!(
        "fd00:30::/48"
            .parse::<ipnet::IpNet>()
            .unwrap()
            .contains(&v6[0].address)
    );
    let (pools, blocks) = ipam.usage("always").await.unwrap();
    assert_eq!(pools[0].size, 1u128 << 80);
    assert_eq!((pools[0].used, pools[0].blocks), (1, 1));
    assert_eq!((blocks[0].used, blocks[0].free), (1, 63));
}

#[tokio::test]
async fn a_warm_nodes_requests_take_one_transaction_and_no_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db"), SqliteOptions::default())
        .await
        .unwrap();
    let ipam = Ipam::new(Counting {
        inner: store,
        reads: AtomicU64::new(0),
        txns: AtomicU64::new(0),
    });
    let store = ipam.store();
    dual_pools(&ipam, ("10.20.0.0/16", 26), ("fd00:20::/48", 122)).await;
    // The first request claims a block of each family and reads what it needs.
    ipam.auto_assign(&req("net.warm", "node-a", 1, 1))
        .await
        .unwrap();
    store.take();
    let mut seen = HashSet::new();
    for (i, (n4, n6)) in [(1, 1), (1, 0), (0, 1), (1, 1), (0, 1), (1, 0), (2, 2)]
        .into_iter()
        .enumerate()
    {
        let (v4, v6) = ipam
            .auto_assign(&req(&format!("net.{i}"), "node-a", n4, n6))
            .await
            .unwrap();
        assert_eq!((v4.len(), v6.len()), (n4 as usize, n6 as usize));
        assert!(v4.iter().chain(&v6).all(|a| seen.insert(a.address)));
        assert_eq!(
            store.take(),
            (0, 1),
            "request {i} ({n4} IPv4, {n6} IPv6): (reads, transactions)"
        );
        let held = ipam.handle_allocations(&format!("net.{i}")).await.unwrap();
        assert_eq!(held.len(), (n4 + n6) as usize);
        store.take();
    }
    assert!(ipam.check().await.unwrap().problems.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_requests_in_parallel_never_collide() {
    let (ipam, _d) = ipam().await;
    dual_pools(&ipam, ("10.21.0.0/22", 26), ("fd00:21::/118", 122)).await;
    let ipam = Arc::new(ipam);
    // 8 tasks on two nodes, each request dual-stack, IPv4 only or IPv6 only in turn.
    let all = concurrent_requests(&ipam, 8, 40, |t, i| {
        let (n4, n6) = [(1, 1), (1, 0), (0, 1)][(t + i) % 3];
        (["node-a", "node-b"][t % 2], n4, n6)
    })
    .await;
    let addresses: usize = all.iter().map(|(_, a)| a.len()).sum();
    assert_eq!(
        assert_distinct_and_held(&ipam, &all).await as usize,
        addresses
    );
    // Each block holds addresses of its own pool's family only.
    let (pools, blocks) = ipam.usage("").await.unwrap();
    for b in &blocks {
        let p = pools.iter().find(|p| p.name == b.pool).unwrap();
        assert_eq!(
            IpFamily::of_net(&b.cidr),
            IpFamily::of_net(&p.cidr),
            "{b:?}"
        );
    }
}

#[tokio::test]
async fn the_block_limit_counts_each_family_apart() {
    let (ipam, _d) = ipam().await;
    dual_pools(&ipam, ("10.22.0.0/28", 30), ("fd00:22::/124", 126)).await;
    ipam.set_config(&IpamConfig {
        max_blocks_per_host: 1,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    ipam.auto_assign(&req("net.a", "node-a", 4, 0))
        .await
        .unwrap();
    // The node's IPv4 block is full and it may have no second one; its first IPv6 block
    // is still allowed.
    let (_, v6) = ipam
        .auto_assign(&req("net.b", "node-a", 0, 4))
        .await
        .unwrap();
    assert!(v6.iter().all(|a| !a.borrowed));
    let e = ipam
        .auto_assign(&req("net.c", "node-a", 1, 0))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains("limit of 1 IPv4 blocks")),
        "{e}"
    );
    let e = ipam
        .auto_assign(&req("net.c", "node-a", 0, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::Exhausted(m) if m.contains("limit of 1 IPv6 blocks")),
        "{e}"
    );
}

#[tokio::test]
async fn a_request_for_the_wrong_family_is_refused_and_writes_nothing() {
    let (ipam, backing) = ipam().await;
    ipam.create_pool(&IpPool::new("blue", "10.24.0.0/16".parse().unwrap()))
        .await
        .unwrap();
    ipam.create_pool(&IpPool::new("green", "fd00:24::/48".parse().unwrap()))
        .await
        .unwrap();
    let before = backing.writes().await;
    let named = |n4: u32, n6: u32, v4_pools: &[&str], v6_pools: &[&str]| {
        let mut r = req("net.x", "node-a", n4, n6);
        r.v4_pools = v4_pools.iter().map(|s| s.to_string()).collect();
        r.v6_pools = v6_pools.iter().map(|s| s.to_string()).collect();
        r
    };
    let cases = [
        (named(1, 0, &["green"], &[]), "ipv4_pools", "IPv6 pool"),
        (
            named(1, 0, &["fd00:24::/48"], &[]),
            "ipv4_pools",
            "IPv6 pool",
        ),
        (named(0, 1, &[], &["blue"]), "ipv6_pools", "IPv4 pool"),
        // The IPv4 half is fine; the IPv6 half's pool is not, so nothing is allocated.
        (named(1, 1, &["blue"], &["blue"]), "ipv6_pools", "IPv4 pool"),
        (named(1, 1, &["green"], &[]), "ipv4_pools", "IPv6 pool"),
    ];
    for (r, field, needle) in cases {
        let e = ipam.auto_assign(&r).await.unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, IpamError::InvalidArgument { field: f, .. } if *f == field)
                && text.contains(needle),
            "{r:?}: {text}"
        );
    }
    // A given address of the other family's pool: there is no pool of its family holding it.
    let e = ipam
        .assign_ip(
            "fd00:99::5".parse().unwrap(),
            "net.y",
            &BTreeMap::new(),
            "node-a",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, IpamError::InvalidArgument { field: "address", reason } if reason.contains("no IPv6 pool") && reason.contains("green")),
        "{e}"
    );
    // Pools that do not fit their family, or overlap one of theirs.
    let bad = [
        (pool("v6-64", "fd00:25::/48", 64), "block_size"),
        (pool("v4-33", "10.25.0.0/16", 33), "block_size"),
        (pool("v4-122", "10.25.0.0/16", 122), "block_size"),
        (pool("v6-26", "fd00:25::/48", 26), "block_size"),
        (pool("inside", "fd00:24:0:1::/64", 122), "cidr"),
        (pool("around", "fd00::/16", 122), "cidr"),
        (pool("small", "fd00:26::/124", 122), "block_size"),
    ];
    for (p, field) in bad {
        let Err(e) = ipam.create_pool(&p).await else {
            panic!("{p:?} was created");
        };
        assert!(
            matches!(&e, IpamError::InvalidArgument { field: f, .. } if *f == field),
            "{p:?}: {e}"
        );
    }
    assert_eq!(
        backing.writes().await,
        before,
        "a refused request wrote something"
    );
    assert_eq!(ipam.list_pools().await.unwrap().len(), 2);
    assert!(ipam.usage("").await.unwrap().1.is_empty());
    // With no IPv6 pool at all, the message says so.
    let (ipam, _d) = common::ipam().await;
    ipam.create_pool(&IpPool::new("blue", "10.24.0.0/16".parse().unwrap()))
        .await
        .unwrap();
    let e = ipam
        .assign_ip(
            "fd00::5".parse().unwrap(),
            "net.y",
            &BTreeMap::new(),
            "node-a",
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("there is no IPv6 pool"), "{e}");
}

#[tokio::test]
async fn tunnel_addresses_of_both_families_survive_gc_and_go_with_their_node() {
    let (ipam, _d) = ipam().await;
    dual_pools(&ipam, ("10.26.0.0/16", 26), ("fd00:26::/48", 122)).await;
    datastore::Resources::new(ipam.store())
        .register_node(&Node::new("node-a"), None)
        .await
        .unwrap();
    let tunnels = IpFamily::ALL.map(|f| tunnel_handle(f, "node-a"));
    assert_eq!(
        tunnels,
        [
            "vxlan-tunnel-addr-node-a".to_owned(),
            "vxlan-v6-tunnel-addr-node-a".to_owned()
        ]
    );
    assert!(tunnels.iter().all(|h| is_tunnel_handle(h)));
    assert!(!is_tunnel_handle("k8s-pod-network.vxlan-tunnel-addr-x"));
    for (f, handle) in IpFamily::ALL.iter().zip(&tunnels) {
        let mut r = req_of(*f, handle, "node-a", 1);
        r.use_tunnel = true;
        ipam.auto_assign(&r).await.unwrap();
    }
    for h in ["k8s.a", "k8s.b"] {
        ipam.auto_assign(&req(h, "node-a", 1, 1)).await.unwrap();
    }
    // Nothing is live: every pod's addresses go, both tunnel addresses stay.
    let released: Vec<String> = ipam
        .gc("node-a", &HashSet::new(), "", false)
        .await
        .unwrap()
        .into_iter()
        .map(|(h, addrs)| {
            assert_eq!(addrs.len(), 2, "{h}: {addrs:?}");
            h
        })
        .collect();
    assert_eq!(released, ["k8s.a", "k8s.b"]);
    for (f, handle) in IpFamily::ALL.iter().zip(&tunnels) {
        let held = ipam.handle_allocations(handle).await.unwrap();
        assert_eq!(held.len(), 1, "{handle}");
        assert_eq!(IpFamily::of(held[0].address), *f);
    }
    assert!(ipam.check().await.unwrap().problems.is_empty());
    // Removing the node releases both.
    let (blocks, addrs) = ipam.delete_node("node-a").await.unwrap();
    assert_eq!(blocks.len(), 2);
    let families: HashSet<IpFamily> = addrs.iter().map(|a| IpFamily::of(*a)).collect();
    assert_eq!((addrs.len(), families.len()), (2, 2), "{addrs:?}");
    for handle in &tunnels {
        assert!(matches!(
            ipam.handle_allocations(handle).await,
            Err(IpamError::NotFound(_))
        ));
    }
    assert!(ipam.usage("").await.unwrap().1.is_empty());
}

both_families!(check_finds_leaks_duplicates_and_overlaps);

/// Damages a block of `f` four ways (in the store, as a bug or a hand edit could) and
/// expects `check` to name each.
async fn check_finds_leaks_duplicates_and_overlaps(f: IpFamily) {
    let (ipam, _d) = ipam().await;
    let cidr = pick(f, "10.27.0.0/24", "fd00:27::/120");
    let block_size = common::block_of(f, 6);
    ipam.create_pool(&pool("p", cidr, block_size))
        .await
        .unwrap();
    let (v4, v6) = ipam
        .auto_assign(&req_of(f, "net.a", "node-a", 3))
        .await
        .unwrap();
    let got: Vec<_> = v4.into_iter().chain(v6).collect();
    assert!(ipam.check().await.unwrap().problems.is_empty());
    let block = got[0].block;
    let store = ipam.store();
    let name = cidr_key(&block);
    let kv = store.get(Block::kind(), &name).await.unwrap().unwrap();
    let mut b: Block = decode(&kv.value).unwrap();
    // A leak: an address allocated under a handle that does not record it.
    let leaked = b.free.pop_back().unwrap();
    b.slots.insert(
        leaked,
        Slot {
            handle: "leaked.x".into(),
            node: "node-a".into(),
            seq: b.seq,
            attrs: BTreeMap::new(),
        },
    );
    // A duplicate: an allocated address listed free again.
    let dup = *b.slots.keys().next().unwrap();
    b.free.push_back(dup);
    store
        .update(Block::kind(), &name, encode(&b), kv.version)
        .await
        .unwrap();
    // A handle recording addresses in a block that holds none of its.
    let ghost = Handle {
        id: "ghost.y".into(),
        blocks: [(block.to_string(), 2)].into(),
    };
    store
        .create(Handle::kind(), "ghost.y", encode(&ghost))
        .await
        .unwrap();
    // An overlapping block: a smaller one inside the node's block.
    let inner = ipnet::IpNet::new(block.network(), block.prefix_len() + 2).unwrap();
    let overlap = Block::new(inner, "p", None, 0);
    store
        .create(Block::kind(), &cidr_key(&inner), encode(&overlap))
        .await
        .unwrap();
    let problems = ipam.check().await.unwrap().problems;
    let dup_addr = b.address(dup).to_string();
    let expect = [
        format!("in {block} under handle leaked.x, which does not record them"),
        format!("block {block}: {dup_addr} is both free and allocated"),
        format!("handle ghost.y records 2 address(es) in {block}, the block holds none"),
        format!("blocks {block} and {inner} overlap"),
        format!("block {inner} is not one of pool p's /{block_size} blocks"),
    ];
    for e in &expect {
        assert!(
            problems.iter().any(|p| p.contains(e.as_str())),
            "{e:?} not in {problems:#?}"
        );
    }
}
