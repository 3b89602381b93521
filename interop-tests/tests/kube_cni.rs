//! 100 CNI ADDs at once, spread over four nodes, each node's bgpd on the Kubernetes datastore
//! (a real kube-apiserver): the `margay-ipam` plugin run as a runtime runs it, 25 per node
//! concurrently. No address is handed out twice, `ipam check` is clean, and after the 100
//! DELs (also at once) nothing is left: no allocation, no handle.

use std::collections::HashSet;

use datastore::model::IpPool;
use interop_tests::lab;
use interop_tests::lab::bgpd::{Daemon, ipam_plugin};
use interop_tests::lab::kube_api::KubeApi;
use ipam::allocator::Ipam;

const NODES: usize = 4;
const PER_NODE: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_cni_adds_over_four_nodes_on_the_kubernetes_api() {
    let api = KubeApi::start();
    let spec = format!("kubernetes:{}", api.kubeconfig.display());
    let store = lab::open_store(&spec).await.unwrap();
    store.as_kubernetes().unwrap().install_crds().await.unwrap();
    let ipam = Ipam::new(store);
    ipam.create_pool(&IpPool::new("p", "10.250.0.0/16".parse().unwrap()))
        .await
        .unwrap();
    let daemons: Vec<Daemon> = (0..NODES)
        .map(|n| {
            let address = format!("10.0.0.{}/24", 10 + n);
            Daemon::on_kubernetes(&api.kubeconfig, &format!("node-{n}"), &address)
        })
        .collect();
    let started = std::time::Instant::now();
    let adds: Vec<_> = (0..NODES * PER_NODE)
        .map(|i| {
            let node = i % NODES;
            ipam_plugin(
                "ADD",
                &format!("pod{i}"),
                &format!("node-{node}"),
                &daemons[node].socket,
            )
        })
        .collect();
    let mut addresses = HashSet::new();
    for (i, child) in adds.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "ADD pod{i}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let result: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let address = result["ips"][0]["address"].as_str().unwrap().to_owned();
        assert!(
            addresses.insert(address.clone()),
            "{address} handed out twice"
        );
    }
    println!(
        "100 ADDs over {NODES} nodes at once: {} distinct addresses in {:.1} s",
        addresses.len(),
        started.elapsed().as_secs_f64()
    );
    let report = ipam.check().await.unwrap();
    println!("check after the ADDs: {report:?}");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.allocations as usize, NODES * PER_NODE);
    let dels: Vec<_> = (0..NODES * PER_NODE)
        .map(|i| {
            let node = i % NODES;
            ipam_plugin(
                "DEL",
                &format!("pod{i}"),
                &format!("node-{node}"),
                &daemons[node].socket,
            )
        })
        .collect();
    for (i, child) in dels.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "DEL pod{i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report = ipam.check().await.unwrap();
    println!("check after the DELs: {report:?}");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.allocations, 0, "leaked allocations");
    assert_eq!(report.handles, 0, "leaked handles");
}
