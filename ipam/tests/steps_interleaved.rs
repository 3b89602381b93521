//! The allocator's per-object path under interleavings and crashes: three nodes (one of
//! them as two processes) claim, allocate and release at once on one store without the
//! `Atomic` extension, every write preceded by a number of yields drawn from the case's seed (so the nodes' steps interleave
//! differently in every case), and the "process" crashing at a drawn write: from there on
//! every write fails, as if bgpd had been killed between two steps. Then a restarted
//! allocator does what the cluster does after a crash: the runtime retries the CNI DEL of
//! every pod whose ADD or DEL failed, and each node's GC runs with its live pods. After that,
//! no address is held twice, every pod that got its addresses still holds exactly them,
//! `ipam check` finds nothing, and every node allocates again.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use datastore::contract::{
    Datastore, Kind, Object, ObjectList, ObjectWatch, Result, StoreError, Version,
};
use datastore::model::{IpPool, IpamConfig};
use datastore::sqlite::{SqliteOptions, SqliteStore};
use ipam::allocator::{AssignRequest, Ipam};
use proptest::prelude::*;

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

/// A store without the extension whose writes yield first (as drawn from the seed) and,
/// from the crash point on, fail. Clones share the state.
#[derive(Clone)]
struct Chaos {
    inner: SqliteStore,
    state: Arc<ChaosState>,
}

struct ChaosState {
    /// A small generator shared by every write: how many times the next write yields.
    rng: AtomicU64,
    writes: AtomicUsize,
    crash_at: Option<usize>,
    /// Writes count (and crash) only once the case's set-up is done.
    armed: AtomicBool,
    crashed: AtomicBool,
}

impl Chaos {
    /// Yields as drawn, then says whether this write may go ahead.
    async fn before_write(&self) -> Result<()> {
        let s = &self.state;
        let x = s
            .rng
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_mul(0xbf58_476d_1ce4_e5b9);
        for _ in 0..(x >> 61) {
            tokio::task::yield_now().await;
        }
        if !s.armed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let n = s.writes.fetch_add(1, Ordering::SeqCst);
        if s.crash_at == Some(n) {
            s.crashed.store(true, Ordering::SeqCst);
        }
        if s.crashed.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("crashed".into()));
        }
        Ok(())
    }
}

impl Datastore for Chaos {
    type Atomic = SqliteStore;

    fn get(&self, kind: Kind, name: &str) -> impl Future<Output = Result<Option<Object>>> + Send {
        self.inner.get(kind, name)
    }
    fn list(&self, kind: Kind, prefix: &str) -> impl Future<Output = Result<ObjectList>> + Send {
        self.inner.list(kind, prefix)
    }
    async fn create(&self, kind: Kind, name: &str, value: Vec<u8>) -> Result<Version> {
        self.before_write().await?;
        self.inner.create(kind, name, value).await
    }
    async fn update(
        &self,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
        expected: Version,
    ) -> Result<Version> {
        self.before_write().await?;
        self.inner.update(kind, name, value, expected).await
    }
    async fn delete(&self, kind: Kind, name: &str, expected: Version) -> Result<()> {
        self.before_write().await?;
        self.inner.delete(kind, name, expected).await
    }
    fn watch(&self, kind: Kind, from: Version) -> impl Future<Output = Result<ObjectWatch>> + Send {
        self.inner.watch(kind, from)
    }
    fn atomic(&self) -> Option<&SqliteStore> {
        None
    }
    fn describe(&self) -> String {
        format!("{} (chaos)", self.inner.describe())
    }
}

#[derive(Debug, Clone)]
enum Action {
    /// A pod start: `n` addresses under a new handle.
    Add(u32),
    /// A pod stop: the handle of the node's `k`-th pod started so far (if any).
    Del(usize),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (1..4u32).prop_map(Action::Add),
        1 => (0..8usize).prop_map(Action::Del),
    ]
}

/// What one node's actions came to: pods holding addresses, and handles whose CNI call
/// failed (the runtime retries their DEL).
#[derive(Default)]
struct Outcome {
    live: BTreeMap<String, BTreeSet<IpAddr>>,
    retry_del: BTreeSet<String>,
}

/// One process's pods on `node` (`tag` tells two processes of one node apart).
async fn node_run(
    ipam: Arc<Ipam<Chaos>>,
    node: &'static str,
    tag: &'static str,
    actions: Vec<Action>,
) -> Outcome {
    let mut out = Outcome::default();
    let mut started = Vec::new();
    for (i, action) in actions.into_iter().enumerate() {
        match action {
            Action::Add(n) => {
                let handle = format!("net.{node}{tag}-{i}");
                started.push(handle.clone());
                let req = AssignRequest {
                    handle: handle.clone(),
                    node: node.into(),
                    num_v4: n,
                    ..Default::default()
                };
                match ipam.auto_assign(&req).await {
                    Ok((v4, _)) => {
                        out.live
                            .insert(handle, v4.into_iter().map(|a| a.address).collect());
                    }
                    // Exhausted or crashed: the pod failed; its DEL follows.
                    Err(_) => {
                        out.retry_del.insert(handle);
                    }
                }
            }
            Action::Del(k) => {
                let Some(handle) = started.get(k % started.len().max(1)).cloned() else {
                    continue;
                };
                out.live.remove(&handle);
                if ipam.release_by_handle(&handle).await.is_err() {
                    out.retry_del.insert(handle);
                }
            }
        }
    }
    out
}

async fn run_case(
    seed: u64,
    crash_at: Option<usize>,
    plans: [Vec<Action>; 4],
) -> std::result::Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("s.db"), SqliteOptions::default())
        .await
        .unwrap();
    let store = Chaos {
        inner: sqlite,
        state: Arc::new(ChaosState {
            rng: AtomicU64::new(seed),
            writes: AtomicUsize::new(0),
            crash_at,
            armed: AtomicBool::new(false),
            crashed: AtomicBool::new(false),
        }),
    };
    // Small blocks, no grace: claims, borrowing and block releases all happen.
    let setup = Ipam::new(store.clone());
    let mut pool = IpPool::new("p", "10.30.0.0/27".parse().unwrap());
    pool.block_size = 29;
    setup.create_pool(&pool).await.unwrap();
    setup
        .set_config(&IpamConfig {
            empty_block_grace_s: 0,
            ..IpamConfig::default()
        })
        .await
        .unwrap();
    store.state.armed.store(true, Ordering::SeqCst);

    // Node a runs two processes (two allocators: their node locks are their own, and they
    // race for the node's blocks as two bgpds of one node would); b and c share the first.
    let ipam = Arc::new(Ipam::new(store.clone()));
    let other = Arc::new(Ipam::new(store.clone()));
    let [a, a2, b, c] = plans;
    let (oa, oa2, ob, oc) = tokio::join!(
        node_run(ipam.clone(), NODES[0], "", a),
        node_run(other, NODES[0], "x", a2),
        node_run(ipam.clone(), NODES[1], "", b),
        node_run(ipam.clone(), NODES[2], "", c),
    );
    let mut oa = oa;
    oa.live.extend(oa2.live);
    oa.retry_del.extend(oa2.retry_del);

    // The restart: a new allocator (no cache, no locks held) on a store that works again.
    store.state.armed.store(false, Ordering::SeqCst);
    store.state.crashed.store(false, Ordering::SeqCst);
    let ipam = Ipam::new(store.clone());
    let mut live = BTreeMap::new();
    for (node, o) in NODES.iter().zip([oa, ob, oc]) {
        for h in &o.retry_del {
            ipam.release_by_handle(h).await.unwrap();
        }
        let handles: std::collections::HashSet<String> = o.live.keys().cloned().collect();
        ipam.gc(node, &handles, "", false).await.unwrap();
        live.extend(o.live);
    }
    let mut seen = BTreeSet::new();
    for (handle, addresses) in &live {
        let held: BTreeSet<IpAddr> = ipam
            .handle_allocations(handle)
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.address)
            .collect();
        prop_assert_eq!(&held, addresses, "{} lost or gained addresses", handle);
        for a in held {
            prop_assert!(seen.insert(a), "{} is held twice", a);
        }
    }
    let report = ipam.check().await.unwrap();
    prop_assert!(
        report.problems.is_empty(),
        "seed {}, crash at {:?}: {:?}",
        seed,
        crash_at,
        report.problems
    );
    prop_assert_eq!(report.allocations as usize, seen.len());
    // Nothing of the crash stands in any node's way: each allocates again, clear of the rest.
    for node in NODES {
        let req = AssignRequest {
            handle: format!("net.{node}-after"),
            node: node.into(),
            num_v4: 1,
            ..Default::default()
        };
        match ipam.auto_assign(&req).await {
            Ok((v4, _)) => {
                prop_assert!(
                    seen.insert(v4[0].address),
                    "{} handed out again",
                    v4[0].address
                );
            }
            // A full pool is an answer; anything else is something left in the way.
            Err(ipam::IpamError::Exhausted(_)) => {}
            Err(e) => prop_assert!(false, "{} cannot allocate after the crash: {}", node, e),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn interleaved_steps_and_a_crash_leave_nothing_gc_cannot_finish(
        seed in any::<u64>(),
        crash_at in proptest::option::of(0..80usize),
        a in proptest::collection::vec(action(), 0..10),
        a2 in proptest::collection::vec(action(), 0..10),
        b in proptest::collection::vec(action(), 0..10),
        c in proptest::collection::vec(action(), 0..10),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run_case(seed, crash_at, [a, a2, b, c]))?;
    }
}
