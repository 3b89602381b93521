//! `bgpctl apply/get/delete` with Calico v3 resource files against a real bgpd (a process on a
//! SQLite file): a multi-document file of pools, the BGP configuration, BGPPeers and a Node is
//! applied; `get -o yaml` piped into `apply -f -` round-trips; a file with one bad document is
//! refused naming the document and field, with nothing of it stored; `delete -f` removes it
//! all. Every address is on loopback: the mesh is off before the Node is created, and the
//! peers point at loopback ports nobody listens on.

use std::time::{Duration, Instant};

use interop_tests::lab::bgpd::{Daemon, runtime};
use proto::v1 as pb;
use proto::v1::bgp_client::BgpClient;
use serde_json::Value;

const CLUSTER: &str = r#"# Shaped as Calico's documented examples.
apiVersion: projectcalico.org/v3
kind: BGPConfiguration
metadata:
  name: default
spec:
  logSeverityScreen: Info
  nodeToNodeMeshEnabled: false
  asNumber: 64600
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: default-ipv4-ippool
spec:
  cidr: 172.30.0.0/16
  blockSize: 26
  ipipMode: Never
  vxlanMode: Never
  natOutgoing: true
  nodeSelector: all()
---
apiVersion: projectcalico.org/v3
kind: List
items:
- apiVersion: projectcalico.org/v3
  kind: IPPool
  metadata:
    name: default-ipv6-ippool
  spec:
    cidr: fd00:30::/48
    natOutgoing: false
- apiVersion: projectcalico.org/v3
  kind: BGPPeer
  metadata:
    name: rack1-tor
  spec:
    peerIP: 127.0.0.2:1790
    asNumber: 64567
- apiVersion: projectcalico.org/v3
  kind: BGPPeer
  metadata:
    name: node-b-v6
  spec:
    node: node-b
    peerIP: "[::1]:1791"
    asNumber: 64568
---
apiVersion: projectcalico.org/v3
kind: Node
metadata:
  name: node-b
  labels:
    rack: r1
spec:
  bgp:
    ipv4Address: 127.0.0.6/8
    asNumber: 64601
"#;

fn pool_names(d: &Daemon) -> Vec<String> {
    d.ctl_o_json(&["get", "ippools"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The stored documents without their revisions, which an update moves on.
fn without_revisions(mut v: Value) -> Value {
    for item in v["items"].as_array_mut().into_iter().flatten() {
        item["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
    }
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    v
}

fn resource_peer(d: &Daemon, address: &str) -> Option<pb::BgpPeer> {
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.ok()?;
        BgpClient::new(channel)
            .list_peers(pb::ListPeersRequest {})
            .await
            .ok()?
            .into_inner()
            .peers
            .into_iter()
            .filter_map(|s| s.peer)
            .find(|p| p.peer_address == address && p.origin == pb::PeerOrigin::Resource as i32)
    })
}

fn wait_for<T>(what: &str, d: &Daemon, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\nbgpd's log:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: apply Calico files, read them back, round-trip, refuse, delete; each step checks what the previous one stored"
)]
fn calico_files_apply_round_trip_refuse_and_delete() {
    let d = Daemon::start("");
    let dir = d.dir.path().to_owned();
    let file = dir.join("cluster.yaml");
    std::fs::write(&file, CLUSTER).unwrap();
    let file = file.to_str().unwrap();

    let (success, out, err) = d.ctl_io(&["apply", "-f", file], None);
    assert!(success, "{err}\n{}", d.log());
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "BGPConfiguration default configured",
            "IPPool default-ipv4-ippool created",
            "IPPool default-ipv6-ippool created",
            "BGPPeer rack1-tor configured",
            "BGPPeer node-b-v6 configured",
            "Node node-b configured",
        ]
    );
    assert!(
        err.contains("warning: spec.logSeverityScreen: Info not applied"),
        "{err}"
    );

    // What bgpd stored, as Calico documents.
    let cfg = d.ctl_o_json(&["get", "bgpconfiguration", "default"]);
    assert_eq!(cfg["spec"]["asNumber"], 64600);
    assert_eq!(cfg["spec"]["nodeToNodeMeshEnabled"], false);
    let v6 = d.ctl_o_json(&["get", "ippool", "default-ipv6-ippool"]);
    assert_eq!(v6["kind"], "IPPool");
    assert_eq!(v6["spec"]["cidr"], "fd00:30::/48");
    assert_eq!(v6["spec"]["blockSize"], 122);
    assert_eq!(v6["spec"]["vxlanMode"], "Never");
    let node = d.ctl_o_json(&["get", "node", "node-b"]);
    assert_eq!(node["metadata"]["labels"]["rack"], "r1");
    assert_eq!(node["spec"]["bgp"]["ipv4Address"], "127.0.0.6/8");
    assert_eq!(node["spec"]["bgp"]["asNumber"], 64601);
    // The global peer is this node's too; the other one belongs to node-b.
    let tor = wait_for("the rack1-tor session", &d, || {
        resource_peer(&d, "127.0.0.2")
    });
    assert_eq!((tor.as_number, tor.port), (64567, 1790));
    assert!(
        resource_peer(&d, "::1").is_none(),
        "node-b's peer is not test-node's"
    );

    // get -o yaml (or json, which is YAML too) | apply -f - changes nothing.
    for kind in ["ippools", "bgpconfiguration", "nodes"] {
        for format in ["yaml", "json"] {
            let before = without_revisions(d.ctl_o_json(&["get", kind]));
            let text = d.ctl_io_ok(&["get", kind, "-o", format], None);
            assert!(text.contains("projectcalico.org/v3"), "{text}");
            let applied = d.ctl_io_ok(&["apply", "-f", "-"], Some(&text));
            assert!(applied.contains("configured"), "{applied}");
            assert_eq!(
                without_revisions(d.ctl_o_json(&["get", kind])),
                before,
                "{kind} -o {format}"
            );
        }
    }
    // Applying the same file again updates in place.
    let again = d.ctl_io_ok(&["apply", "-f", file], None);
    assert_eq!(again.matches("configured").count(), 6, "{again}");
    assert_eq!(
        resource_peer(&d, "127.0.0.2").map(|p| p.as_number),
        Some(64567)
    );

    // One bad document: refused, naming it, and nothing of the file is stored.
    let bad = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: extra-pool}\n\
               spec: {cidr: 172.31.0.0/16}\n---\n\
               apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: extra-peer}\n\
               spec: {peerIP: 127.0.0.3, asNumber: 64569}\n---\n\
               apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: tunnelled}\n\
               spec: {cidr: 172.29.0.0/16, ipipMode: Always}\n";
    let err = d.ctl_io_fails(&["apply", "-f", "-"], Some(bad));
    assert!(
        err.contains("document 3 (IPPool tunnelled): spec.ipipMode: Always: not supported on this kernel (no ipip)"),
        "{err}"
    );
    // A document that is only wrong against what is stored (a pool's CIDR cannot change).
    let moved = bad.replace(
        "name: tunnelled}\nspec: {cidr: 172.29.0.0/16, ipipMode: Always}",
        "name: default-ipv4-ippool}\nspec: {cidr: 172.29.0.0/16}",
    );
    let err = d.ctl_io_fails(&["apply", "-f", "-"], Some(&moved));
    assert!(
        err.contains(
            "document 3 (IPPool default-ipv4-ippool): spec.cidr: the pool has 172.30.0.0/16"
        ),
        "{err}"
    );
    let overlapping = bad.replace("172.29.0.0/16, ipipMode: Always", "172.30.1.0/24");
    let err = d.ctl_io_fails(&["apply", "-f", "-"], Some(&overlapping));
    assert!(
        err.contains("spec.cidr: 172.30.1.0/24 overlaps the pool default-ipv4-ippool"),
        "{err}"
    );
    let bad_cidr = bad.replace("172.29.0.0/16, ipipMode: Always", "172.29.0.1/16");
    let err = d.ctl_io_fails(&["apply", "-f", "-"], Some(&bad_cidr));
    assert!(
        err.contains("spec.cidr: 172.29.0.1/16 is not a network address"),
        "{err}"
    );
    assert_eq!(
        pool_names(&d),
        ["default-ipv4-ippool", "default-ipv6-ippool"]
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        resource_peer(&d, "127.0.0.3").is_none(),
        "the bad file's peer was not stored"
    );

    // get bgppeers lists the stored resources (not this node's sessions): the file's two.
    let peers: Vec<String> = d.ctl_o_json(&["get", "bgppeers"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(peers, ["node-b-v6", "rack1-tor"]);

    // delete -f removes what the file made.
    let out = d.ctl_io_ok(&["delete", "-f", file], None);
    assert_eq!(out.lines().count(), 6, "{out}");
    assert!(pool_names(&d).is_empty());
    wait_for("the rack1-tor session to go", &d, || {
        resource_peer(&d, "127.0.0.2").is_none().then_some(())
    });
    let (success, _, err) = d.ctl_io(&["get", "node", "node-b"], None);
    assert!(!success && err.contains("node-b"), "{err}");
    let cfg = d.ctl_o_json(&["get", "bgpconfiguration"]);
    assert_eq!(
        cfg["items"][0]["spec"]["nodeToNodeMeshEnabled"], true,
        "back to the defaults"
    );
    // And by kind and name.
    d.ctl_io_ok(
        &["apply", "-f", "-"],
        Some(CLUSTER.split("---").nth(1).unwrap()),
    );
    assert_eq!(
        d.ctl_io_ok(&["delete", "ippool", "default-ipv4-ippool"], None),
        "IPPool default-ipv4-ippool deleted\n"
    );
    assert!(pool_names(&d).is_empty());
}
