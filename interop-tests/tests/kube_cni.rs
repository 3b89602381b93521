//! 100 CNI ADDs at once, spread over four nodes, each node's bgpd on the Kubernetes datastore
//! (a real kube-apiserver): the `margay-ipam` plugin run as a runtime runs it, 25 per node
//! concurrently. No address is handed out twice, `ipam check` is clean, and after the 100
//! DELs (also at once) nothing is left: no allocation, no handle. And the Calico annotations
//! on a Pod and its Namespace that choose its pools and addresses.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use datastore::model::IpPool;
use interop_tests::lab;
use interop_tests::lab::bgpd::{Daemon, ipam_plugin, ipam_plugin_for};
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

/// Calico's IPAM annotations (issue #51): `cni.projectcalico.org/ipv4pools` on the Namespace
/// and on the Pod (which wins), `ipAddrs` on the Pod; a pool that does not exist, an address
/// outside every pool, an annotation that does not parse and `ipAddrsNoIpam` fail the ADD with
/// a CNI error naming the annotation, and allocate nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calicos_pod_and_namespace_annotations_choose_pools_and_addresses() {
    let api = KubeApi::start();
    let store = lab::open_store(&format!("kubernetes:{}", api.kubeconfig.display()))
        .await
        .unwrap();
    store.as_kubernetes().unwrap().install_crds().await.unwrap();
    let ipam = Ipam::new(store);
    for (name, cidr) in [("main", "10.250.0.0/16"), ("other", "10.251.0.0/16")] {
        ipam.create_pool(&IpPool::new(name, cidr.parse().unwrap()))
            .await
            .unwrap();
    }
    let daemon = Daemon::on_kubernetes(&api.kubeconfig, "node-a", "10.0.0.10/24");
    api.kubectl_ok(&["create", "namespace", "ann"]);
    api.kubectl_ok(&[
        "annotate",
        "namespace",
        "ann",
        r#"cni.projectcalico.org/ipv4pools=["other"]"#,
    ]);
    let v4 = "cni.projectcalico.org/ipv4pools";
    let fixed = "cni.projectcalico.org/ipAddrs";
    let cases = [
        ("by-namespace", serde_json::json!({}), Ok("10.251.")),
        (
            "by-pod",
            serde_json::json!({v4: r#"["10.250.0.0/16"]"#}),
            Ok("10.250."),
        ),
        (
            "fixed",
            serde_json::json!({fixed: r#"["10.250.7.7"]"#}),
            Ok("10.250.7.7/"),
        ),
        ("no-pool", serde_json::json!({v4: r#"["nope"]"#}), Err(v4)),
        (
            "outside",
            serde_json::json!({fixed: r#"["10.99.0.1"]"#}),
            Err(fixed),
        ),
        ("not-json", serde_json::json!({v4: "other"}), Err(v4)),
        (
            "no-ipam",
            serde_json::json!({"cni.projectcalico.org/ipAddrsNoIpam": r#"["10.99.0.1"]"#}),
            Err("cni.projectcalico.org/ipAddrsNoIpam"),
        ),
    ];
    for (pod, notes, want) in cases {
        api.create_pod("ann", pod, "node-a", notes);
        let out = ipam_plugin_for("ADD", pod, ("ann", pod), "node-a", &daemon.socket)
            .wait_with_output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let result: serde_json::Value =
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{pod}: {e}: {stdout}"));
        match want {
            Ok(prefix) => {
                assert!(out.status.success(), "{pod}: {stdout}");
                let address = result["ips"][0]["address"].as_str().unwrap();
                assert!(address.starts_with(prefix), "{pod}: {address}");
                println!("{pod}: {address}");
            }
            Err(annotation) => {
                assert!(!out.status.success(), "{pod} was not refused: {stdout}");
                assert_eq!(result["code"], 102, "{pod}: {stdout}");
                let msg = result["msg"].as_str().unwrap_or_default().to_owned()
                    + result["details"].as_str().unwrap_or_default();
                assert!(msg.contains(annotation), "{pod}: {stdout}");
                println!("{pod}: refused: {msg}");
                // And said on the Pod, as an Event `kubectl describe pod` shows.
                let deadline = Instant::now() + Duration::from_secs(10);
                while !api.warnings("ann", pod).iter().any(|(reason, message, _)| {
                    reason == "InvalidIPAMAnnotation" && message.contains(annotation)
                }) {
                    assert!(
                        Instant::now() < deadline,
                        "no Event on pod {pod}: {:?}",
                        api.warnings("ann", pod)
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                let held = ipam
                    .handle_allocations(&format!("k8s-pod-network.{pod}"))
                    .await;
                assert!(
                    matches!(held, Err(ipam::IpamError::NotFound(_))),
                    "{pod} was refused but holds {held:?}"
                );
            }
        }
    }
    let report = ipam.check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        report.allocations, 3,
        "only the three accepted pods hold addresses"
    );
}
