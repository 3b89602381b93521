//! Adoption of a Calico cluster on the Kubernetes datastore: a real kube-apiserver holds
//! objects written with kubectl exactly as a Calico cluster keeps them (Calico's
//! `crd.projectcalico.org/v1` IPPool, IPAMBlock with allocations, attributes and sequence
//! numbers, a labelled BlockAffinity, IPAMHandles). margay then reads them as they are: the
//! existing pods keep their addresses, `ipam check` is clean, new claims never collide with
//! them, a release rewrites the block still in Calico's shape, `kubectl get ippools` shows
//! what bgpctl shows, and bgpd on that node routes the adopted block. A rewrite by margay of
//! a Calico BGPPeer or BGPConfiguration keeps the fields it does not model.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use datastore::Store;
use interop_tests::lab;
use interop_tests::lab::bgpd::Daemon;
use interop_tests::lab::kube_api::KubeApi;
use ipam::allocator::{AssignRequest, Ipam};

const BLOCK: &str = "10.244.7.64/26";
/// Calico's hostname-hash label of `worker-2`: base32 of SHA3-256, unpadded.
const WORKER_2_HASH: &str = "53WSO6MBY4ZPU6KG6FI4VASUYQ3HFBO7TQGX7PRHXADNUR67KKUA";

/// The cluster as Calico left it: node worker-2 holds the block 10.244.7.64/26 with its
/// VXLAN tunnel address (ordinal 0) and two pods (ordinals 2 and 3).
fn calico_objects() -> String {
    let mut allocations = vec!["null".to_owned(); 64];
    allocations[0] = "0".into();
    allocations[2] = "1".into();
    allocations[3] = "2".into();
    let unallocated: Vec<String> = (1..64)
        .filter(|o| ![2, 3].contains(o))
        .map(|o| o.to_string())
        .collect();
    format!(
        r#"apiVersion: crd.projectcalico.org/v1
kind: IPPool
metadata:
  name: default-ipv4-ippool
spec:
  cidr: 10.244.0.0/16
  blockSize: 26
  ipipMode: Never
  vxlanMode: CrossSubnet
  natOutgoing: true
  nodeSelector: all()
  allowedUses: [Workload, Tunnel]
---
apiVersion: crd.projectcalico.org/v1
kind: IPAMBlock
metadata:
  name: 10-244-7-64-26
spec:
  cidr: {BLOCK}
  affinity: "host:worker-2"
  allocations: [{allocations}]
  unallocated: [{unallocated}]
  attributes:
  - handle_id: vxlan-tunnel-addr-worker-2
    secondary: {{node: worker-2, type: vxlanTunnelAddress}}
  - handle_id: k8s-pod-network.0a1b2c
    secondary: {{namespace: shop, pod: web-0, node: worker-2, timestamp: "2026-05-01 10:00:05.1 +0000 UTC"}}
  - handle_id: k8s-pod-network.3d4e5f
    secondary: {{namespace: shop, pod: web-1, node: worker-2, timestamp: "2026-05-01 10:00:06.2 +0000 UTC"}}
  sequenceNumber: 1777629600000000042
  sequenceNumberForAllocation: {{"0": 1777629600000000001, "2": 1777629600000000041}}
  deleted: false
  strictAffinity: false
---
apiVersion: crd.projectcalico.org/v1
kind: BlockAffinity
metadata:
  name: worker-2-10-244-7-64-26
  labels:
    projectcalico.org/hostname-hash: {WORKER_2_HASH}
    projectcalico.org/affinity-type: host
    projectcalico.org/ip-version: "4"
spec:
  state: confirmed
  node: worker-2
  cidr: {BLOCK}
  type: host
  deleted: "false"
---
apiVersion: crd.projectcalico.org/v1
kind: IPAMHandle
metadata:
  name: vxlan-tunnel-addr-worker-2
spec:
  handleID: vxlan-tunnel-addr-worker-2
  block: {{"{BLOCK}": 1}}
  deleted: false
---
apiVersion: crd.projectcalico.org/v1
kind: IPAMHandle
metadata:
  name: k8s-pod-network.0a1b2c
spec:
  handleID: k8s-pod-network.0a1b2c
  block: {{"{BLOCK}": 1}}
  deleted: false
---
apiVersion: crd.projectcalico.org/v1
kind: IPAMHandle
metadata:
  name: k8s-pod-network.3d4e5f
spec:
  handleID: k8s-pod-network.3d4e5f
  block: {{"{BLOCK}": 1}}
  deleted: false
"#,
        allocations = allocations.join(", "),
        unallocated = unallocated.join(", "),
    )
}

fn addr(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calico_clusters_ipam_is_adopted_as_it_stands() {
    let api = KubeApi::start();
    let spec = format!("kubernetes:{}", api.kubeconfig.display());
    let store = lab::open_store(&spec).await.unwrap();
    store.as_kubernetes().unwrap().install_crds().await.unwrap();
    let objects = api.dir().join("calico.yaml");
    std::fs::write(&objects, calico_objects()).unwrap();
    let applied = api.kubectl_ok(&["apply", "-f", objects.to_str().unwrap()]);
    println!("kubectl apply:\n{applied}");

    let ipam = Ipam::new(store.clone());
    let report = ipam.check().await.unwrap();
    println!("check after adoption: {report:?}");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.allocations, 3, "{report:?}");
    assert_eq!(report.handles, 3, "{report:?}");

    // The pods and the tunnel keep their addresses.
    for (handle, want) in [
        ("vxlan-tunnel-addr-worker-2", "10.244.7.64"),
        ("k8s-pod-network.0a1b2c", "10.244.7.66"),
        ("k8s-pod-network.3d4e5f", "10.244.7.67"),
    ] {
        let held = ipam.handle_allocations(handle).await.unwrap();
        assert_eq!(held.len(), 1, "{handle}: {held:?}");
        assert_eq!(held[0].address, addr(want), "{handle}");
        println!("adopted {handle}: {}", held[0].address);
    }
    let pod = &ipam
        .handle_allocations("k8s-pod-network.0a1b2c")
        .await
        .unwrap()[0];
    assert_eq!(pod.attrs.get("pod").map(String::as_str), Some("web-0"));
    assert_eq!(pod.attrs.get("namespace").map(String::as_str), Some("shop"));

    new_claims_avoid_the_adopted_addresses(&ipam).await;

    // A release rewrites the block, still in Calico's shape.
    assert_eq!(
        ipam.release_by_handle("k8s-pod-network.0a1b2c")
            .await
            .unwrap()
            .len(),
        1
    );
    let json: serde_json::Value = serde_json::from_str(&api.kubectl_ok(&[
        "get",
        "ipamblocks.crd.projectcalico.org",
        "10-244-7-64-26",
        "-o",
        "json",
    ]))
    .unwrap();
    let spec = &json["spec"];
    let allocations = spec["allocations"].as_array().unwrap();
    assert_eq!(allocations.len(), 64);
    assert!(
        allocations[2].is_null(),
        "ordinal 2 still allocated: {spec}"
    );
    assert!(spec["sequenceNumber"].as_u64().unwrap() > 1777629600000000042);
    let web1 = allocations[3].as_u64().unwrap() as usize;
    assert_eq!(
        spec["attributes"][web1]["handle_id"], "k8s-pod-network.3d4e5f",
        "{spec}"
    );
    assert_eq!(spec["attributes"][web1]["secondary"]["pod"], "web-1");
    assert_eq!(spec["affinity"], "host:worker-2");
    let report = ipam.check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.allocations, 2 + 10 + 5);

    bgpd_routes_the_adopted_block(&api, &store).await;
}

/// New pods of worker-2 fill its adopted block around the existing addresses; another node
/// claims a block of its own.
async fn new_claims_avoid_the_adopted_addresses(ipam: &Ipam<Store>) {
    let taken: HashSet<IpAddr> = ["10.244.7.64", "10.244.7.66", "10.244.7.67"]
        .into_iter()
        .map(addr)
        .collect();
    let block: ipnet::IpNet = BLOCK.parse().unwrap();
    let mut fresh = HashSet::new();
    for i in 0..10 {
        let (v4, _) = ipam
            .auto_assign(&AssignRequest {
                handle: format!("k8s-pod-network.new{i}"),
                node: "worker-2".into(),
                num_v4: 1,
                ..Default::default()
            })
            .await
            .unwrap();
        let a = v4[0].address;
        assert!(block.contains(&a), "{a} is not in worker-2's adopted block");
        assert!(!taken.contains(&a), "{a} was already Calico's pod's");
        assert!(fresh.insert(a), "{a} handed out twice");
    }
    let (elsewhere, _) = ipam
        .auto_assign(&AssignRequest {
            handle: "k8s-pod-network.w3".into(),
            node: "worker-3".into(),
            num_v4: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    for a in &elsewhere {
        assert!(!block.contains(&a.address), "worker-3 got {}", a.address);
    }
    println!(
        "new on worker-2: {:?}; worker-3: {:?}",
        fresh,
        elsewhere.iter().map(|a| a.address).collect::<Vec<_>>()
    );
}

/// bgpd as node worker-2 on the Kubernetes datastore: its kernel table holds the adopted
/// block (a blackhole: it is this node's), and bgpctl lists the pool kubectl lists.
async fn bgpd_routes_the_adopted_block(api: &KubeApi, _store: &Store) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    let config = dir.path().join("bgpd.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nname = \"worker-2\"\naddress = \"10.0.0.5/24\"\n\
             [datastore]\nkind = \"kubernetes\"\nkubeconfig = \"{}\"\n\
             [api]\nsocket = \"{}\"\n",
            api.kubeconfig.display(),
            socket.display()
        ),
    )
    .unwrap();
    let d = Daemon::start_with_config(dir, socket.clone(), Path::new(&config));
    let ch = proto::client::connect_unix(&socket).await.unwrap();
    let mut bgp = proto::v1::bgp_client::BgpClient::new(ch);
    let deadline = Instant::now() + Duration::from_secs(30);
    let route = loop {
        let mut stream = bgp
            .list_routes(proto::v1::ListRoutesRequest {
                table: proto::v1::RouteTable::Kernel.into(),
                prefix: BLOCK.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let mut found = None;
        while let Some(batch) = stream.message().await.unwrap() {
            found = found.or(batch.routes.into_iter().find(|r| r.prefix == BLOCK));
        }
        if let Some(r) = found {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "bgpd never routed the adopted block {BLOCK}:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("bgpd's kernel route for the adopted block: {route:?}");
    let kubectl = api.kubectl_ok(&["get", "ippools.crd.projectcalico.org", "-o", "name"]);
    let bgpctl = d.bgpctl_ok(&["get", "ippool"]);
    println!("kubectl get ippools:\n{kubectl}bgpctl get ippool:\n{bgpctl}");
    assert!(kubectl.contains("ippool.crd.projectcalico.org/default-ipv4-ippool"));
    assert!(bgpctl.contains("default-ipv4-ippool") && bgpctl.contains("10.244.0.0/16"));
}

/// A BGPPeer and the BGPConfiguration as Calico and a user wrote them, with fields margay
/// does not model.
const CALICO_BGP: &str = r#"apiVersion: crd.projectcalico.org/v1
kind: BGPPeer
metadata:
  name: tor-a
  labels: {team: net}
  annotations:
    projectcalico.org/metadata: '{"uid":"0b1c","creationTimestamp":"2026-01-02T03:04:05Z"}'
spec:
  peerIP: 192.0.2.1
  asNumber: 65001
  keepaliveTime: 30s
  sourceAddress: None
---
apiVersion: crd.projectcalico.org/v1
kind: BGPConfiguration
metadata:
  name: default
spec:
  asNumber: 64512
  logSeverityScreen: Info
  bindMode: NodeIP
  nodeToNodeMeshEnabled: true
"#;

/// margay rewrites a Calico BGPPeer and the BGPConfiguration (as bgpctl's changes do) and
/// keeps what it does not model as Calico or the user wrote it: `sourceAddress`,
/// `bindMode`, `logSeverityScreen`, a user's label, Calico's v3 metadata annotation; the
/// fields it models are its own to change and to drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_keeps_the_calico_fields_margay_does_not_model() {
    use datastore::contract::Datastore;
    use datastore::model::{BgpConfiguration, BgpPeer};
    use datastore::resource::{Resource, decode, encode};
    let api = KubeApi::start();
    let store = lab::open_store(&format!("kubernetes:{}", api.kubeconfig.display()))
        .await
        .unwrap();
    store.as_kubernetes().unwrap().install_crds().await.unwrap();
    let objects = api.dir().join("bgp.yaml");
    std::fs::write(&objects, CALICO_BGP).unwrap();
    api.kubectl_ok(&["apply", "-f", objects.to_str().unwrap()]);

    let peer = store.get(BgpPeer::kind(), "tor-a").await.unwrap().unwrap();
    let mut changed: BgpPeer = decode(&peer.value).unwrap();
    assert_eq!(changed.keepalive_time_s, 30);
    changed.as_number = 65002;
    changed.keepalive_time_s = 0;
    store
        .update(BgpPeer::kind(), "tor-a", encode(&changed), peer.version)
        .await
        .unwrap();
    let config = store
        .get(BgpConfiguration::kind(), "default")
        .await
        .unwrap()
        .unwrap();
    let mut cluster: BgpConfiguration = decode(&config.value).unwrap();
    cluster.as_number = 64513;
    store
        .update(
            BgpConfiguration::kind(),
            "default",
            encode(&cluster),
            config.version,
        )
        .await
        .unwrap();

    let get = |what: &str| -> serde_json::Value {
        serde_json::from_str(&api.kubectl_ok(&["get", what, "-o", "json"])).unwrap()
    };
    let peer = get("bgppeers.crd.projectcalico.org/tor-a");
    println!("the BGPPeer after margay's rewrite: {peer}");
    assert_eq!(peer["spec"]["asNumber"], 65002);
    assert!(
        peer["spec"].get("keepaliveTime").is_none(),
        "margay dropped its own field: {peer}"
    );
    assert_eq!(peer["spec"]["sourceAddress"], "None", "{peer}");
    assert_eq!(peer["metadata"]["labels"]["team"], "net", "{peer}");
    assert!(
        peer["metadata"]["annotations"]["projectcalico.org/metadata"]
            .as_str()
            .unwrap()
            .contains("0b1c"),
        "{peer}"
    );
    let config = get("bgpconfigurations.crd.projectcalico.org/default");
    println!("the BGPConfiguration after margay's rewrite: {config}");
    assert_eq!(config["spec"]["asNumber"], 64513);
    assert_eq!(config["spec"]["bindMode"], "NodeIP", "{config}");
    assert_eq!(config["spec"]["logSeverityScreen"], "Info", "{config}");
    // A stale version is still a conflict: the merge never writes over a newer resource.
    let read = peer_version(&peer);
    changed.as_number = 65003;
    store
        .update(BgpPeer::kind(), "tor-a", encode(&changed), read)
        .await
        .unwrap();
    changed.as_number = 65004;
    let stale = store
        .update(BgpPeer::kind(), "tor-a", encode(&changed), read)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, datastore::contract::StoreError::Conflict { .. }),
        "{stale}"
    );
    assert_eq!(
        get("bgppeers.crd.projectcalico.org/tor-a")["spec"]["asNumber"],
        65003
    );
}

fn peer_version(resource: &serde_json::Value) -> datastore::contract::Version {
    let text = resource["metadata"]["resourceVersion"].as_str().unwrap();
    datastore::contract::Version::from_wire(text.parse().unwrap())
}
