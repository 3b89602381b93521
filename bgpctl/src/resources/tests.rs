//! The mapping on files shaped as Calico's documented examples (written for margay): default
//! IPv4 and IPv6 pools, a global BGPPeer to a ToR, a per-node peer, a BGPConfiguration with the
//! mesh off, a Node with BGP fields; and bad input refused by path.

use proto::v1 as pb;

use super::fields::{FieldError, duration_s};
use super::*;

const CLUSTER: &str = r#"
apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: default-ipv4-ippool
spec:
  cidr: 192.168.0.0/16
  blockSize: 26
  ipipMode: Never
  vxlanMode: CrossSubnet
  natOutgoing: true
  nodeSelector: all()
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: default-ipv6-ippool
spec:
  cidr: fd5f:1234::/48
  vxlanMode: Always
  natOutgoing: false
  allowedUses: [Workload, Tunnel]
---
apiVersion: projectcalico.org/v3
kind: BGPConfiguration
metadata:
  name: default
spec:
  logSeverityScreen: Info
  nodeToNodeMeshEnabled: false
  asNumber: 63400
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata:
  name: rack1-tor
spec:
  peerIP: 192.0.2.1
  asNumber: 64567
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata:
  name: node1-peer-v6
spec:
  node: node1
  peerIP: "[2001:db8::1]:1790"
  asNumber: "64512"
  keepaliveTime: 20s
---
apiVersion: projectcalico.org/v3
kind: Node
metadata:
  name: node1
  labels:
    rack: r1
spec:
  bgp:
    ipv4Address: 10.0.0.1/24
    ipv6Address: 2001:db8:0:1::1/64
    asNumber: 64512
    routeReflectorClusterID: 224.0.0.1
"#;

fn checked(text: &str) -> Result<Vec<Document>, DocError> {
    let docs = parse_file(text)?;
    for d in &docs {
        let r = match d.kind {
            Kind::IpPool => ippool::from_document(d).map(drop),
            Kind::BgpConfiguration => bgpconfig::from_document(d).map(drop),
            Kind::BgpPeer => bgppeer::from_document(d).map(drop),
            Kind::Node => node::from_document(d).map(drop),
        };
        r.map_err(|e| d.error(e))?;
    }
    Ok(docs)
}

/// The error of the first refused document, as bgpctl prints it.
fn refused(text: &str) -> String {
    checked(text).unwrap_err().to_string()
}

fn pool(spec: &str) -> String {
    format!("apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: p\nspec:\n{spec}")
}

#[test]
fn a_calico_cluster_file_maps_to_requests() {
    let docs = checked(CLUSTER).unwrap();
    assert_eq!(docs.len(), 6);
    let v4 = ippool::from_document(&docs[0]).unwrap().pool;
    assert_eq!(v4.cidr, "192.168.0.0/16");
    assert_eq!(v4.block_size, 26);
    assert_eq!(v4.vxlan_mode, pb::EncapMode::CrossSubnet as i32);
    assert!(v4.nat_outgoing);
    let v6 = ippool::from_document(&docs[1]).unwrap();
    assert_eq!(v6.pool.block_size, 122, "the IPv6 default");
    assert!(!v6.block_size_given);
    assert_eq!(v6.pool.allowed_uses.len(), 2);

    let c = bgpconfig::from_document(&docs[2]).unwrap();
    assert_eq!((c.as_number, c.node_to_node_mesh), (63400, Some(false)));
    assert!(c.warnings[0].starts_with("spec.logSeverityScreen: Info not applied"));
    let current = pb::BgpConfiguration {
        hold_time_s: 90,
        revision: 7,
        ..Default::default()
    };
    let set = c.request(&current);
    assert_eq!(
        (set.hold_time_s, set.revision),
        (90, 7),
        "margay's own settings kept"
    );

    let tor = bgppeer::from_document(&docs[3]).unwrap();
    assert_eq!(
        (tor.peer_address.as_str(), tor.as_number, tor.port),
        ("192.0.2.1", 64567, 0)
    );
    assert_eq!(tor.node, "", "a global peer");
    assert_eq!(tor.origin, pb::PeerOrigin::Resource as i32);
    let p6 = bgppeer::from_document(&docs[4]).unwrap();
    assert_eq!(
        (
            p6.peer_address.as_str(),
            p6.port,
            p6.node.as_str(),
            p6.keepalive_time_s
        ),
        ("2001:db8::1", 1790, "node1", 20)
    );

    let n = node::from_document(&docs[5])
        .unwrap()
        .request(None)
        .unwrap();
    assert_eq!(n.ipv4_address, "10.0.0.1/24");
    assert_eq!(n.ipv6_address, "2001:db8:0:1::1/64");
    assert_eq!(n.as_number, 64512);
    assert_eq!(n.route_reflector_cluster_id, "224.0.0.1");
    assert_eq!(n.labels["rack"], "r1");
}

#[test]
fn printed_documents_apply_back_to_the_same_requests() {
    let docs = checked(CLUSTER).unwrap();
    let mut stored = ippool::from_document(&docs[0]).unwrap().pool;
    stored.revision = 12;
    // As bgpd answers: the allowed uses spelled out.
    stored.allowed_uses = vec![
        pb::AllowedUse::Workload as i32,
        pb::AllowedUse::Tunnel as i32,
    ];
    let text = yaml::emit(&list_value(
        Kind::IpPool,
        vec![ippool::to_document(&stored)],
    ))
    .unwrap();
    let again = parse_file(&text).unwrap();
    assert_eq!(ippool::from_document(&again[0]).unwrap().pool, stored);

    let peer = bgppeer::from_document(&docs[4]).unwrap();
    let text = yaml::emit(&bgppeer::to_document(&peer)).unwrap();
    assert_eq!(
        bgppeer::from_document(&parse_file(&text).unwrap()[0]).unwrap(),
        peer
    );

    let mut n = node::from_document(&docs[5])
        .unwrap()
        .request(None)
        .unwrap();
    n.vxlan_tunnel_address = "192.168.3.0".into();
    n.vxlan_tunnel_mac = "66:aa:bb:cc:dd:ee".into();
    n.revision = 3;
    let text = yaml::emit(&node::to_document(&n)).unwrap();
    let spec = node::from_document(&parse_file(&text).unwrap()[0]).unwrap();
    assert_eq!(
        spec.request(Some(&n)).unwrap(),
        n,
        "tunnel fields equal to the stored ones"
    );
    let mut other = n.clone();
    other.vxlan_tunnel_address = "192.168.9.0".into();
    let e = spec.request(Some(&other)).unwrap_err();
    assert_eq!(e.path, "spec.ipv4VXLANTunnelAddr");

    let cfg = pb::BgpConfiguration {
        as_number: 63400,
        node_to_node_mesh: Some(false),
        listen_port: 179,
        revision: 4,
        ..Default::default()
    };
    let text = yaml::emit(&bgpconfig::to_document(&cfg)).unwrap();
    let c = bgpconfig::from_document(&parse_file(&text).unwrap()[0]).unwrap();
    assert_eq!(c.request(&cfg), cfg);
}

#[test]
fn lists_are_flattened_and_counted_per_item() {
    let text = "apiVersion: projectcalico.org/v3\nkind: List\nitems:\n\
                - apiVersion: projectcalico.org/v3\n  kind: IPPool\n  metadata: {name: a}\n  spec: {cidr: 10.1.0.0/16}\n\
                - apiVersion: projectcalico.org/v3\n  kind: IPPool\n  metadata: {name: b}\n  spec: {cidr: 10.2.0.0/16, ipipMode: Always}\n";
    let e = refused(text);
    assert_eq!(
        e,
        "document 2 (IPPool b): spec.ipipMode: Always: not supported on this kernel (no ipip); \
         use vxlanMode; nothing was applied"
    );
    let e = refused(&text.replace("kind: List", "kind: BGPPeerList"));
    assert!(
        e.contains("items[0].kind: a BGPPeerList holds BGPPeer items only"),
        "{e}"
    );
}

#[test]
fn unsupported_and_unknown_fields_are_refused_by_path() {
    for (spec, want) in [
        (
            "  cidr: 10.0.0.0/16\n  ipipMode: CrossSubnet\n",
            "spec.ipipMode: CrossSubnet: not supported on this kernel (no ipip)",
        ),
        (
            "  cidr: 10.0.0.0/16\n  vxlanMode: Sometimes\n",
            "spec.vxlanMode: unknown value \"Sometimes\": one of Never, Always, CrossSubnet",
        ),
        (
            "  cidr: 10.0.0.0/16\n  natOutGoing: true\n",
            "spec.natOutGoing: unknown field",
        ),
        (
            "  cidr: 10.0.0.1/16\n",
            "spec.cidr: 10.0.0.1/16 is not a network address",
        ),
        (
            "  cidr: 10.0.0.0/33\n",
            "spec.cidr: /33 is not a prefix length",
        ),
        (
            "  cidr: fd00::/48\n  blockSize: 26\n",
            "spec.blockSize: /26 is out of range",
        ),
        (
            "  cidr: 10.0.0.0/16\n  allowedUses: [LoadBalancer]\n",
            "spec.allowedUses[0]: LoadBalancer: not supported",
        ),
        (
            "  cidr: 10.0.0.0/16\n  assignmentMode: Sometimes\n",
            "spec.assignmentMode: unknown value",
        ),
        (
            "  cidr: 10.0.0.0/16\n  natOutgoing: yes please\n",
            "spec.natOutgoing: must be true or false, not a string",
        ),
    ] {
        let e = refused(&pool(spec));
        assert!(e.contains(want), "{spec}: {e}");
        assert!(e.starts_with("document 1 (IPPool p): "), "{e}");
    }
    let peer = |spec: &str| {
        refused(&format!(
            "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata:\n  name: x\nspec:\n{spec}"
        ))
    };
    assert!(
        peer(
            "  peerIP: 192.0.2.1\n  asNumber: 1\n  password:\n    secretKeyRef: {name: s, key: k}\n"
        )
        .contains("spec.password: not supported: a secretKeyRef names a Kubernetes secret")
    );
    assert!(
        peer("  peerIP: 192.0.2.1\n  asNumber: 1\n  keepOriginalNextHop: true\n")
            .contains("spec.keepOriginalNextHop: not supported yet")
    );
    assert!(
        peer("  peerIP: 192.0.2.1:99999\n  asNumber: 1\n")
            .contains("spec.peerIP: \"192.0.2.1:99999\" is not")
    );
    assert!(peer("  peerIP: 192.0.2.1\n").contains("spec.asNumber: required"));
    assert!(
        peer("  peerIP: 192.0.2.1\n  asNumber: 1\n  node: Node_1\n")
            .contains("spec.node: \"Node_1\" is not a valid name")
    );
    assert!(
        peer("  peerIP: 192.0.2.1\n  asNumber: 0\n")
            .contains("spec.asNumber: must be an AS number")
    );
    assert!(peer("  peerSelector: all()\n  asNumber: 1\n").contains("spec.peerIP: required"));
    let cfg = |spec: &str| {
        refused(&format!(
            "apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata:\n  name: default\nspec:\n{spec}"
        ))
    };
    assert!(
        cfg("  serviceClusterIPs:\n  - cidr: 10.96.0.0/12\n")
            .contains("spec.serviceClusterIPs: not supported yet")
    );
    assert!(cfg("  logSeverityScreen: Loud\n").contains("spec.logSeverityScreen: unknown value"));
    assert!(
        cfg("  listenPort: 70000\n").contains("spec.listenPort: must be a whole number 0-65535")
    );
    let e = refused(
        "apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata:\n  name: node.n1\nspec: {}\n",
    );
    assert!(
        e.contains("metadata.name: \"node.n1\": only the cluster-wide"),
        "{e}"
    );
    let node = |body: &str| {
        refused(&format!(
            "apiVersion: projectcalico.org/v3\nkind: Node\n{body}"
        ))
    };
    assert!(
        node("metadata: {name: n}\nspec:\n  bgp:\n    ipv4IPIPTunnelAddr: 10.0.0.9\n")
            .contains("spec.bgp.ipv4IPIPTunnelAddr: not supported on this kernel (no ipip)")
    );
    assert!(
        node("metadata: {name: n}\nspec:\n  bgp:\n    ipv4Address: fd00::1/64\n")
            .contains("spec.bgp.ipv4Address: \"fd00::1\" is not an IPv4 address")
    );
    assert!(
        node("metadata: {name: n, labels: {a: 1}}\n")
            .contains("metadata.labels.a: must be a string")
    );
    assert!(
        node("metadata: {name: n}\nspec:\n  bgp:\n    asn: 1\n")
            .contains("spec.bgp.asn: unknown field")
    );
}

#[test]
fn document_level_mistakes_name_the_document() {
    assert_eq!(
        refused("apiVersion: projectcalico.org/v3\nkind: BGPFilter\nmetadata: {name: f}\n"),
        "document 1 (BGPFilter f): kind: BGPFilter: not supported yet (bgpd's API has no BGP \
         filter resources); nothing was applied"
    );
    assert!(
        refused(&format!(
            "{}---\nkind: IPPool\nmetadata: {{name: q}}\n",
            pool("  cidr: 10.0.0.0/16\n")
        ))
        .starts_with("document 2 (IPPool q): apiVersion: required")
    );
    assert!(
        refused("apiVersion: v1\nkind: IPPool\nmetadata: {name: q}\n")
            .contains("\"v1\" is not supported")
    );
    assert!(
        refused("apiVersion: projectcalico.org/v3\nkind: IPPool\nspec: {}\n")
            .contains("metadata.name: required")
    );
    assert!(
        refused("apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: q}\nspce: {}\n")
            .contains("spce: unknown field")
    );
    assert!(refused("apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: Q}\nspec: {cidr: 10.0.0.0/8}\n").contains("metadata.name: \"Q\" is not a valid name"));
    assert!(refused("a: [").contains("not valid YAML"));
}

#[test]
fn pool_updates_keep_cidr_and_block_size() {
    let d = &parse_file(&pool("  cidr: 10.0.0.0/16\n")).unwrap()[0];
    let spec = ippool::from_document(d).unwrap();
    let cur = pb::IpPool {
        cidr: "10.0.0.0/16".into(),
        block_size: 28,
        revision: 9,
        ..Default::default()
    };
    let u = ippool::update_of(&spec, &cur).unwrap();
    assert_eq!((u.block_size, u.revision), (28, 9));
    let moved = pb::IpPool {
        cidr: "10.9.0.0/16".into(),
        ..cur
    };
    assert_eq!(
        ippool::update_of(&spec, &moved).unwrap_err().path,
        "spec.cidr"
    );
}

#[test]
fn overlapping_pools_are_refused() {
    let d = &parse_file(&pool("  cidr: 10.1.0.0/16\n")).unwrap()[0];
    let p = ippool::from_document(d).unwrap().pool;
    let e = ippool::check_overlap(&p, [("big", "10.0.0.0/8")]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "spec.cidr: 10.1.0.0/16 overlaps the pool big (10.0.0.0/8)"
    );
    assert!(ippool::check_overlap(&p, [("small", "10.1.2.0/24")]).is_err());
    assert!(ippool::check_overlap(&p, [("next", "10.2.0.0/16"), ("v6", "fd00::/48")]).is_ok());
    assert!(
        ippool::check_overlap(&p, [("p", "10.0.0.0/8")]).is_ok(),
        "itself, resized"
    );
}

#[test]
fn durations_and_kinds() {
    assert_eq!(duration_s("p", "1m30s"), Ok(90));
    assert_eq!(duration_s("p", "2h"), Ok(7200));
    assert!(duration_s("p", "30").is_err());
    assert!(duration_s("p", "5d").is_err());
    assert_eq!(Kind::parse("ippools", true), Ok(Kind::IpPool));
    assert_eq!(Kind::parse("BGPConfig", true), Ok(Kind::BgpConfiguration));
    assert!(
        Kind::parse("ippool", false).is_err(),
        "files spell kinds exactly"
    );
    let _ = FieldError::new("x", "y");
}
