//! IPAM from many OS processes at once, on one SQLite file and through etcd, with the
//! stores' transactions and again one object at a time (their extension hidden, as on a
//! datastore without one): no address is ever handed out twice, `check` is clean, nothing is
//! left after releasing everything; a process killed with SIGKILL in the middle of
//! allocating, 50 times, changes none of that; and a process stopped right after each write
//! of a claim, an allocation and a block's release leaves only what `check` reports and the
//! runtime's DEL retry and GC finish. The same on the real kube-apiserver (the Kubernetes
//! datastore, which writes one object at a time).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use datastore::Store;
use datastore::model::IpPool;
use interop_tests::lab;
use ipam::allocator::Ipam;

fn worker(store: &str, node: &str, count: usize, prefix: &str) -> Child {
    worker_with(store, node, count, prefix, &[])
}

fn worker_with(store: &str, node: &str, count: usize, prefix: &str, extra: &[&str]) -> Child {
    Command::new(lab::binary("ipam-bench"))
        .args([
            "worker", "--store", store, "--node", node, "--prefix", prefix,
        ])
        .args(["--count", &count.to_string()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The (handle, address) pairs a worker acknowledged on stdout.
fn acknowledged(child: &mut Child) -> Vec<(String, String)> {
    let out = child.stdout.take().unwrap();
    BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| {
            let mut parts = l.strip_prefix("assigned ")?.split(' ');
            Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
        })
        .collect()
}

async fn eight_processes(spec: &str, store: Store) {
    eight_processes_of(spec, store, 500).await;
}

/// Eight workers of `EACH` allocations each.
async fn eight_processes_of(spec: &str, store: Store, each: usize) {
    let ipam = Ipam::new(store);
    ipam.create_pool(&IpPool::new("p", "10.100.0.0/16".parse().unwrap()))
        .await
        .unwrap();
    #[allow(non_snake_case)]
    let EACH = each;
    // Four nodes, two processes each: processes of one node race for the same blocks.
    let mut children: Vec<Child> = (0..8)
        .map(|i| worker(spec, &format!("node-{}", i % 4), EACH, &format!("w{i}")))
        .collect();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| {
            let out = c.stdout.take().unwrap();
            std::thread::spawn(move || {
                BufReader::new(out)
                    .lines()
                    .map_while(Result::ok)
                    .filter_map(|l| {
                        let mut p = l.strip_prefix("assigned ")?.split(' ');
                        Some((p.next()?.to_owned(), p.next()?.to_owned()))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for c in &mut children {
        assert!(c.wait().unwrap().success(), "a worker failed");
    }
    let acks: Vec<(String, String)> = readers
        .into_iter()
        .flat_map(|r| r.join().unwrap())
        .collect();
    assert_eq!(acks.len(), 8 * EACH);
    let addresses: HashSet<&str> = acks.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!(addresses.len(), 8 * EACH, "an address was handed out twice");
    let report = ipam.check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.allocations as usize, 8 * EACH);
    for (handle, address) in &acks {
        let held = ipam.handle_allocations(handle).await.unwrap();
        assert_eq!(held.len(), 1, "{handle}");
        assert_eq!(held[0].address.to_string(), *address);
    }
    for (handle, _) in &acks {
        assert_eq!(ipam.release_by_handle(handle).await.unwrap().len(), 1);
    }
    let report = ipam.check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.allocations, 0);
    assert_eq!(report.handles, 0, "handles left after releasing everything");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_on_one_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("sqlite:{}", dir.path().join("ipam.db").display());
    let store = lab::open_store(&spec).await.unwrap();
    eight_processes(&spec, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_on_one_sqlite_file_one_object_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("per-object:sqlite:{}", dir.path().join("ipam.db").display());
    let store = lab::open_store(&spec).await.unwrap();
    eight_processes(&spec, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_through_etcd() {
    let etcd = lab::etcd::EtcdCluster::start(1);
    let store = Store::etcd(etcd.store(Default::default()).await);
    let spec = format!("etcd:{}", etcd.endpoints().join(","));
    eight_processes(&spec, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_through_etcd_one_object_at_a_time() {
    let etcd = lab::etcd::EtcdCluster::start(1);
    let store = Store::etcd(etcd.store(Default::default()).await).per_object();
    let spec = format!("per-object:etcd:{}", etcd.endpoints().join(","));
    eight_processes(&spec, store).await;
}

/// The real kube-apiserver: eight processes of four nodes, 100 allocations each, one object
/// at a time (the Kubernetes API has no transaction over several objects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_through_the_kubernetes_api() {
    let api = lab::kube_api::KubeApi::start();
    let spec = format!("kubernetes:{}", api.kubeconfig.display());
    let store = lab::open_store(&spec).await.unwrap();
    store.as_kubernetes().unwrap().install_crds().await.unwrap();
    eight_processes_of(&spec, store, 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_allocation_never_hands_out_an_address_twice() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("sqlite:{}", dir.path().join("ipam.db").display());
    kill_9_mid_allocation(&spec, (20, 80)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_allocation_one_object_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("per-object:sqlite:{}", dir.path().join("ipam.db").display());
    kill_9_mid_allocation(&spec, (20, 80)).await;
}

/// A worker is stopped right after its k-th write, for every k of one pod's life on the
/// per-object path: its ADD (a claim: affinity pending, block, affinity confirmed; then the
/// handle and the block with the address) and its DEL (the last address of the block, no
/// grace: affinity pending deletion, block, affinity, handle), nine writes. What each stop
/// leaves is only what `check` knows to report; the runtime's retried DEL and the node's GC
/// finish it, and a pod of another node is untouched throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_between_any_two_steps_leaves_only_what_gc_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("per-object:sqlite:{}", dir.path().join("ipam.db").display());
    stop_between_any_two_steps(&spec).await;
}

/// The same nine stops on the real kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_between_any_two_steps_on_the_kubernetes_api() {
    let api = lab::kube_api::KubeApi::start();
    let spec = format!("kubernetes:{}", api.kubeconfig.display());
    let store = lab::open_store(&spec).await.unwrap();
    store.as_kubernetes().unwrap().install_crds().await.unwrap();
    stop_between_any_two_steps(&spec).await;
}

/// Kill -9 of processes on the real kube-apiserver, 50 times, each after 150–450 ms (its
/// allocations take longer than on SQLite: each write is a request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_allocation_on_the_kubernetes_api() {
    let api = lab::kube_api::KubeApi::start();
    let spec = format!("kubernetes:{}", api.kubeconfig.display());
    let store = lab::open_store(&spec).await.unwrap();
    store.as_kubernetes().unwrap().install_crds().await.unwrap();
    kill_9_mid_allocation(&spec, (150, 300)).await;
}

async fn stop_between_any_two_steps(spec: &str) {
    use datastore::model::IpamConfig;
    let spec = spec.to_owned();
    let ipam = Ipam::new(lab::open_store(&spec).await.unwrap());
    let mut pool = IpPool::new("p", "10.102.0.0/24".parse().unwrap());
    pool.block_size = 29;
    ipam.create_pool(&pool).await.unwrap();
    ipam.set_config(&IpamConfig {
        empty_block_grace_s: 0,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    let resident = ipam
        .auto_assign(&ipam::allocator::AssignRequest {
            handle: "resident".into(),
            node: "node-r".into(),
            num_v4: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .0;
    let known = [
        "unfinished claim",
        "unfinished release",
        "the block holds none",
        "has no affinity record",
    ];
    const WRITES: usize = 9;
    for k in 0..=WRITES {
        let k_arg = k.to_string();
        let extra: &[&str] = if k < WRITES {
            &["--release", "--crash-after-writes", &k_arg]
        } else {
            &["--release"]
        };
        let mut child = worker_with(&spec, "node-s", 1, &format!("s{k}"), extra);
        let status = child.wait().unwrap();
        assert_eq!(
            status.success(),
            k == WRITES,
            "stop after write {k}: {status}"
        );
        let report = ipam.check().await.unwrap();
        lab::assert_check_knows(
            &report.problems,
            &known,
            &format!("stopped after write {k}"),
        );
        // The runtime retries the pod's DEL; then the node's GC runs (no live pods).
        ipam.release_by_handle(&format!("s{k}-0")).await.unwrap();
        ipam.gc("node-s", &HashSet::new(), "", false).await.unwrap();
        let report = ipam.check().await.unwrap();
        assert!(
            report.problems.is_empty(),
            "after write {k}: {:?}",
            report.problems
        );
        // And the node allocates and releases again, nothing of the stop in its way.
        let mut probe = worker_with(&spec, "node-s", 1, &format!("p{k}"), &["--release"]);
        assert!(probe.wait().unwrap().success(), "after write {k}");
        let held = ipam.handle_allocations("resident").await.unwrap();
        assert_eq!(held.len(), resident.len(), "after write {k}");
        assert_eq!(
            report.allocations as usize,
            resident.len(),
            "after write {k}"
        );
    }
}

/// Kills a worker `window.0 + random(window.1)` ms after it started, 50 times.
async fn kill_9_mid_allocation(spec: &str, window: (u64, u64)) {
    let ipam = Ipam::new(lab::open_store(spec).await.unwrap());
    // Small blocks, so the workers claim new ones often and get killed mid-claim too; ten
    // nodes of 20 such blocks hold more than 50 rounds allocate.
    let mut pool = IpPool::new("p", "10.101.0.0/16".parse().unwrap());
    pool.block_size = 27;
    ipam.create_pool(&pool).await.unwrap();

    let mut acks: Vec<(String, String)> = Vec::new();
    let mut seed = std::process::id() as u64;
    for round in 0..50 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let node = format!("node-{}", round % 10);
        let mut child = worker(spec, &node, 1_000_000, &format!("r{round}"));
        std::thread::sleep(Duration::from_millis(window.0 + (seed >> 33) % window.1));
        child.kill().unwrap();
        child.wait().unwrap();
        let acked = acknowledged(&mut child);
        // The pod whose ADD the kill cut short: the runtime calls its DEL.
        ipam.release_by_handle(&format!("r{round}-{}", acked.len()))
            .await
            .unwrap();
        acks.extend(acked);
    }
    assert!(
        acks.len() > 50,
        "only {} allocations acknowledged",
        acks.len()
    );

    // Every acknowledged address is held by its handle, and by no other.
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for (handle, address) in &acks {
        assert!(
            owner.insert(address, handle).is_none(),
            "{address} acknowledged twice"
        );
        let held = ipam.handle_allocations(handle).await.unwrap();
        assert_eq!(held.len(), 1, "{handle}");
        assert_eq!(held[0].address.to_string(), *address);
    }
    // After GC (live = what was acknowledged; an allocation stored but not yet printed when
    // the kill came is a leak GC collects), the store is consistent.
    let live: HashSet<String> = acks.iter().map(|(h, _)| h.clone()).collect();
    let mut collected = 0;
    for n in 0..10 {
        collected += ipam
            .gc(&format!("node-{n}"), &live, "r", false)
            .await
            .unwrap()
            .len();
    }
    let report = ipam.check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        report.allocations as usize,
        acks.len(),
        "{collected} collected"
    );
    // New allocations never collide with what survived.
    let mut after = worker(spec, "node-1", 50, "after");
    assert!(after.wait().unwrap().success());
    let more = acknowledged(&mut after);
    let taken: BTreeSet<&str> = acks.iter().map(|(_, a)| a.as_str()).collect();
    assert!(
        more.iter().all(|(_, a)| !taken.contains(a.as_str())),
        "a surviving address was handed out again"
    );
}
