//! The mapping on files shaped as Calico's documented examples (written for margay): default
//! IPv4 and IPv6 pools, a global BGPPeer to a ToR, a per-node peer, a BGPConfiguration with the
//! mesh off, a Node with BGP fields, BGPFilters, a BGPConfiguration advertising services with
//! communities, a BGPPeer with filters and session options; and bad input refused by path.
//!
//! Why this file is long: each kind's fields are exercised with Calico-shaped files and each
//! refusal with its exact path; the file texts and the tables of bad input are most of it.

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
        super::commands::check(d)?;
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
#[expect(
    clippy::too_many_lines,
    reason = "a table of IPPool specs and the path each refusal must name; one row per field"
)]
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
        peer("  peerIP: 192.0.2.1\n  asNumber: 1\n  keepOriginalNextHop: true\n  nextHopMode: Keep\n")
            .contains("spec.keepOriginalNextHop: give nextHopMode or the deprecated keepOriginalNextHop, not both")
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
        cfg("  ignoredInterfaces: [eth9]\n").contains("spec.ignoredInterfaces: not supported yet")
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
        refused("apiVersion: projectcalico.org/v3\nkind: BGPFiltre\nmetadata: {name: f}\n"),
        "document 1 (BGPFiltre f): kind: unknown kind \"BGPFiltre\": one of IPPool, \
         BGPConfiguration, BGPPeer, BGPFilter, Node, NetworkPolicy, GlobalNetworkPolicy, \
         WorkloadEndpoint, Namespace; nothing was applied"
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

/// Calico's documented shapes (written for margay): a filter exporting only the pod CIDR and
/// rejecting the rest, one importing a ToR's default route with prefix-length bounds; the
/// services and communities of a BGPConfiguration; a ToR BGPPeer using both filters.
const POLICY: &str = r#"
apiVersion: projectcalico.org/v3
kind: BGPFilter
metadata:
  name: export-pods
spec:
  exportV4:
  - action: Accept
    matchOperator: In
    cidr: 10.0.0.0/16
  - action: Reject
  exportV6:
  - action: Accept
    matchOperator: Equal
    cidr: fd00:10::/64
    source: RemotePeers
  - action: Reject
    interface: "*.calico"
---
apiVersion: projectcalico.org/v3
kind: BGPFilter
metadata:
  name: import-default
spec:
  importV4:
  - action: Accept
    matchOperator: In
    cidr: 0.0.0.0/0
    prefixLength:
      min: 0
      max: 24
  - action: Reject
---
apiVersion: projectcalico.org/v3
kind: BGPConfiguration
metadata:
  name: default
spec:
  asNumber: 63400
  serviceClusterIPs:
  - cidr: 10.96.0.0/12
  - cidr: fd00:96::/108
  serviceExternalIPs:
  - cidr: 104.244.42.129/32
  - cidr: 172.217.3.0/24
  serviceLoadBalancerIPs:
  - cidr: 192.0.2.0/24
  communities:
  - name: bgp-large-community
    value: 63400:300:100
  prefixAdvertisements:
  - cidr: 172.218.4.0/26
    communities:
    - bgp-large-community
    - 63400:120
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata:
  name: rack1-tor
spec:
  peerIP: 192.0.2.1
  asNumber: 64567
  filters:
  - export-pods
  - import-default
  keepOriginalNextHop: true
  localASNumber: 64999
  numAllowedLocalASNumbers: 1
  maxRestartTime: 2m0s
  reachableBy: 10.0.0.1
"#;

fn filter_doc(spec: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: BGPFilter\nmetadata:\n  name: f\nspec:\n{spec}"
    )
}

#[test]
fn calico_policy_files_map_to_requests() {
    let docs = checked(POLICY).unwrap();
    let f = bgpfilter::from_document(&docs[0]).unwrap();
    assert_eq!(f.name, "export-pods");
    assert_eq!(f.export_v4.len(), 2);
    assert_eq!(
        (
            f.export_v4[0].cidr.as_str(),
            f.export_v4[0].match_operator.as_str(),
            f.export_v4[0].action.as_str()
        ),
        ("10.0.0.0/16", "In", "Accept")
    );
    assert_eq!(
        f.export_v4[1],
        pb::BgpFilterRule {
            action: "Reject".into(),
            ..Default::default()
        }
    );
    assert_eq!(f.export_v6[0].source, "RemotePeers");
    assert_eq!(f.export_v6[1].interface, "*.calico");
    assert!(f.import_v4.is_empty() && f.import_v6.is_empty());
    let imp = bgpfilter::from_document(&docs[1]).unwrap();
    assert_eq!(
        (
            imp.import_v4[0].prefix_length_min,
            imp.import_v4[0].prefix_length_max
        ),
        (Some(0), Some(24))
    );

    let c = bgpconfig::from_document(&docs[2]).unwrap();
    let set = c.request(&pb::BgpConfiguration {
        hold_time_s: 90,
        ..Default::default()
    });
    assert_eq!(set.service_cluster_cidrs, ["10.96.0.0/12", "fd00:96::/108"]);
    assert_eq!(
        set.service_external_cidrs,
        ["104.244.42.129/32", "172.217.3.0/24"]
    );
    assert_eq!(set.service_load_balancer_cidrs, ["192.0.2.0/24"]);
    assert_eq!(set.communities[0].value, "63400:300:100");
    assert_eq!(
        set.prefix_advertisements[0].communities,
        ["bgp-large-community", "63400:120"]
    );
    assert_eq!(set.hold_time_s, 90, "margay's own settings kept");

    let p = bgppeer::from_document(&docs[3]).unwrap();
    assert_eq!(p.filters, ["export-pods", "import-default"]);
    assert_eq!(p.next_hop_mode, pb::NextHopMode::Keep as i32);
    assert_eq!(
        (
            p.local_as_number,
            p.num_allowed_local_as_numbers,
            p.max_restart_time_s
        ),
        (64999, 1, 120)
    );
    assert_eq!(p.reachable_by, "10.0.0.1");
    for (mode, want) in [
        ("Self", pb::NextHopMode::Self_),
        ("Keep", pb::NextHopMode::Keep),
        ("Auto", pb::NextHopMode::Auto),
    ] {
        let text = POLICY
            .split("---")
            .nth(3)
            .unwrap()
            .replace("keepOriginalNextHop: true", &format!("nextHopMode: {mode}"));
        let d = &parse_file(&text).unwrap()[0];
        assert_eq!(
            bgppeer::from_document(d).unwrap().next_hop_mode,
            want as i32
        );
    }
}

#[test]
fn printed_policy_documents_apply_back_to_the_same_requests() {
    let docs = checked(POLICY).unwrap();
    for d in &docs[..2] {
        let mut f = bgpfilter::from_document(d).unwrap();
        f.revision = 5;
        let text = yaml::emit(&list_value(
            Kind::BgpFilter,
            vec![bgpfilter::to_document(&f)],
        ))
        .unwrap();
        assert!(text.contains("resourceVersion"), "{text}");
        let again = parse_file(&text).unwrap();
        assert_eq!(bgpfilter::from_document(&again[0]).unwrap(), f);
    }
    let mut cfg = bgpconfig::from_document(&docs[2])
        .unwrap()
        .request(&pb::BgpConfiguration {
            revision: 3,
            ..Default::default()
        });
    // As bgpd answers: the mesh spelled out.
    cfg.node_to_node_mesh = Some(true);
    let text = yaml::emit(&bgpconfig::to_document(&cfg)).unwrap();
    let c = bgpconfig::from_document(&parse_file(&text).unwrap()[0]).unwrap();
    assert_eq!(c.request(&cfg), cfg);
    // keepOriginalNextHop prints as the nextHopMode it is.
    let peer = bgppeer::from_document(&docs[3]).unwrap();
    let doc = bgppeer::to_document(&peer);
    assert_eq!(doc["spec"]["nextHopMode"], "Keep");
    assert_eq!(doc["spec"]["maxRestartTime"], "120s");
    assert!(doc["spec"].get("keepOriginalNextHop").is_none());
    let text = yaml::emit(&doc).unwrap();
    assert_eq!(
        bgppeer::from_document(&parse_file(&text).unwrap()[0]).unwrap(),
        peer
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of bad BGPFilter rules and the path each refusal must name; one row per case"
)]
fn bad_filters_are_refused_by_path() {
    for (spec, want) in [
        (
            "  exportV4:\n  - {action: Accept, matchOperator: In, cidr: 10.0.0.1/24}\n",
            "spec.exportV4[0].cidr: 10.0.0.1/24 is not a network address (host bits set): its \
             network is 10.0.0.0/24",
        ),
        (
            "  exportV4:\n  - {action: Reject}\n  - {action: Reject}\n  - {action: Accept, matchOperator: In, cidr: fd00::/8}\n",
            "spec.exportV4[1]: the same rule as spec.exportV4[0]",
        ),
        (
            "  exportV4:\n  - {action: Reject}\n  - {action: Accept, matchOperator: In, cidr: fd00::/8}\n",
            "spec.exportV4[1].cidr: fd00::/8 is IPv6, in an IPv4 list",
        ),
        (
            "  importV6:\n  - {action: Accept, matchOperator: In, cidr: 10.0.0.0/8}\n",
            "spec.importV6[0].cidr: 10.0.0.0/8 is IPv4, in an IPv6 list",
        ),
        (
            "  exportV4:\n  - {action: Accept, cidr: 10.0.0.0/8}\n",
            "spec.exportV4[0].matchOperator: required with cidr",
        ),
        (
            "  exportV4:\n  - {action: Accept, matchOperator: In}\n",
            "spec.exportV4[0].cidr: required with matchOperator",
        ),
        (
            "  exportV4:\n  - {action: Accept, matchOperator: Within, cidr: 10.0.0.0/8}\n",
            "spec.exportV4[0].matchOperator: unknown value \"Within\": one of Equal, NotEqual, In, NotIn",
        ),
        (
            "  exportV4:\n  - {action: Drop}\n",
            "spec.exportV4[0].action: unknown value \"Drop\"",
        ),
        (
            "  exportV4:\n  - {cidr: 10.0.0.0/8, matchOperator: In}\n",
            "spec.exportV4[0].action: required",
        ),
        (
            "  exportV4:\n  - {action: Accept, prefixLength: {min: 24}}\n",
            "spec.exportV4[0].prefixLength: needs cidr",
        ),
        (
            "  exportV4:\n  - {action: Accept, matchOperator: In, cidr: 10.0.0.0/8, prefixLength: {max: 33}}\n",
            "spec.exportV4[0].prefixLength.max: must be a whole number 0-32",
        ),
        (
            "  exportV6:\n  - {action: Accept, matchOperator: In, cidr: fd00::/8, prefixLength: {min: 129}}\n",
            "spec.exportV6[0].prefixLength.min: must be a whole number 0-128",
        ),
        (
            "  exportV4:\n  - {action: Accept, matchOperator: In, cidr: 10.0.0.0/8, prefixLength: {min: 28, max: 24}}\n",
            "spec.exportV4[0].prefixLength: min 28 is above max 24",
        ),
        (
            "  exportV4:\n  - {action: Accept, matchOperator: In, cidr: 10.0.0.0/8, prefixLength: {mn: 8}}\n",
            "spec.exportV4[0].prefixLength.mn: unknown field",
        ),
        (
            "  exportV4:\n  - {action: Accept, interface: \"this-is-too-long0\"}\n",
            "spec.exportV4[0].interface: \"this-is-too-long0\" is not an interface name",
        ),
        (
            "  exportV4:\n  - {action: Accept, interface: \"eth 0\"}\n",
            "spec.exportV4[0].interface: \"eth 0\" is not an interface name",
        ),
        (
            "  exportV4:\n  - {action: Accept, source: LocalPeers}\n",
            "spec.exportV4[0].source: unknown value \"LocalPeers\": one of RemotePeers",
        ),
        (
            "  exportV4:\n  - {action: Accept, peerType: eBGP}\n",
            "spec.exportV4[0].peerType: not supported by margay yet",
        ),
        (
            "  importV4:\n  - action: Accept\n    communities: {values: [\"65000:100\"]}\n",
            "spec.importV4[0].communities: not supported by margay yet",
        ),
        (
            "  importV4:\n  - {action: Accept, asPathPrefix: [65000]}\n",
            "spec.importV4[0].asPathPrefix: not supported by margay yet",
        ),
        (
            "  importV4:\n  - {action: Accept, priority: 10}\n",
            "spec.importV4[0].priority: not supported by margay yet",
        ),
        (
            "  exportV4:\n  - action: Accept\n    operations:\n    - addCommunity: {value: \"65000:1\"}\n",
            "spec.exportV4[0].operations: not supported by margay yet",
        ),
        ("  exportv4: []\n", "spec.exportv4: unknown field"),
    ] {
        let e = refused(&filter_doc(spec));
        assert!(e.starts_with("document 1 (BGPFilter f): "), "{spec}: {e}");
        assert!(e.contains(want), "{spec}: {e}");
    }
    // Not duplicates: the same CIDR with another operator, in another list.
    checked(&filter_doc(
        "  exportV4:\n  - {action: Accept, matchOperator: In, cidr: 10.0.0.0/8}\n  - {action: Accept, matchOperator: Equal, cidr: 10.0.0.0/8}\n  importV4:\n  - {action: Accept, matchOperator: In, cidr: 10.0.0.0/8}\n  - {action: Reject, interface: \"*\"}\n",
    ))
    .unwrap();
    assert!(
        refused(
            "apiVersion: projectcalico.org/v3\nkind: BGPFilter\nmetadata: {name: f, labels: {a: b}}\nspec: {}\n"
        )
        .contains("metadata.labels: not stored for BGPFilter resources")
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "tables of bad BGPConfiguration and BGPPeer specs and the paths their refusals name; one row per case"
)]
fn bad_services_communities_and_peer_options_are_refused_by_path() {
    let cfg = |spec: &str| {
        refused(&format!(
            "apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata:\n  name: default\nspec:\n{spec}"
        ))
    };
    for (spec, want) in [
        (
            "  serviceClusterIPs:\n  - cidr: 10.96.0.1/12\n",
            "spec.serviceClusterIPs[0].cidr: 10.96.0.1/12 is not a network address (host bits set): its network is 10.96.0.0/12",
        ),
        (
            "  serviceExternalIPs:\n  - cidr: 172.217.3.0/24\n  - cidr: 172.217.3.128/25\n",
            "spec.serviceExternalIPs[1].cidr: 172.217.3.128/25 overlaps spec.serviceExternalIPs[0].cidr (172.217.3.0/24)",
        ),
        (
            "  serviceLoadBalancerIPs:\n  - cidr: 192.0.2.0/24\n  - cidr: 192.0.2.0/24\n",
            "spec.serviceLoadBalancerIPs[1].cidr: 192.0.2.0/24 overlaps",
        ),
        (
            "  serviceLoadBalancerIPs:\n  - {cidr: 192.0.2.0/24, name: x}\n",
            "spec.serviceLoadBalancerIPs[0].name: unknown field",
        ),
        (
            "  serviceLoadBalancerAggregation: Disabled\n",
            "spec.serviceLoadBalancerAggregation: Disabled: not supported",
        ),
        (
            "  communities:\n  - {name: a, value: \"65536:1\"}\n",
            "spec.communities[0].value: \"65536:1\" is not a community",
        ),
        (
            "  communities:\n  - {name: a, value: \"1:2:4294967296\"}\n",
            "spec.communities[0].value: \"1:2:4294967296\" is not a community",
        ),
        (
            "  communities:\n  - {name: a, value: \"1:2:3:4\"}\n",
            "spec.communities[0].value",
        ),
        (
            "  communities:\n  - {name: a, value: \"1:2\"}\n  - {name: a, value: \"1:3\"}\n",
            "spec.communities[1].name: \"a\" is already spec.communities[0]'s name",
        ),
        (
            "  communities:\n  - {value: \"1:2\"}\n",
            "spec.communities[0].name: required",
        ),
        (
            "  communities:\n  - {name: a, value: \"1:2\"}\n  prefixAdvertisements:\n  - cidr: 10.0.0.0/8\n    communities: [a, b]\n",
            "spec.prefixAdvertisements[0].communities[1]: \"b\" is neither the name of one of spec.communities nor a community value",
        ),
        (
            "  prefixAdvertisements:\n  - cidr: 10.0.0.1/8\n    communities: [\"1:1\"]\n",
            "spec.prefixAdvertisements[0].cidr: 10.0.0.1/8 is not a network address",
        ),
        (
            "  prefixAdvertisements:\n  - communities: [\"1:1\"]\n",
            "spec.prefixAdvertisements[0].cidr: required",
        ),
    ] {
        let e = cfg(spec);
        assert!(e.contains(want), "{spec}: {e}");
    }
    let many: String = (0..51).map(|i| format!("\"1:{i}\", ")).collect();
    assert!(
        cfg(&format!(
            "  prefixAdvertisements:\n  - cidr: 10.0.0.0/8\n    communities: [{many}]\n"
        ))
        .contains(
            "spec.prefixAdvertisements[0].communities: 51 communities: at most 50 per prefix"
        )
    );
    let many: String = (0..501)
        .map(|i| format!("  - {{name: c{i}, value: \"1:{i}\"}}\n"))
        .collect();
    assert!(
        cfg(&format!("  communities:\n{many}"))
            .contains("spec.communities: 501 communities: at most 500")
    );
    let peer = |spec: &str| {
        refused(&format!(
            "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata:\n  name: x\nspec:\n  peerIP: 192.0.2.1\n  asNumber: 1\n{spec}"
        ))
    };
    for (spec, want) in [
        (
            "  filters: [ok, Not_OK]\n",
            "spec.filters[1]: \"Not_OK\" is not a valid name",
        ),
        (
            "  filters: [1]\n",
            "spec.filters[0]: must be the name of a BGPFilter",
        ),
        (
            "  nextHopMode: Sometimes\n",
            "spec.nextHopMode: unknown value \"Sometimes\": one of Auto, Self, Keep",
        ),
        (
            "  keepOriginalNextHop: false\n  nextHopMode: Self\n",
            "not both",
        ),
        (
            "  localASNumber: 23456\n",
            "spec.localASNumber: AS_TRANS 23456",
        ),
        (
            "  localASNumber: 0\n",
            "spec.localASNumber: must be an AS number",
        ),
        (
            "  numAllowedLocalASNumbers: 256\n",
            "spec.numAllowedLocalASNumbers: must be a whole number 0-255",
        ),
        (
            "  maxRestartTime: 0s\n",
            "spec.maxRestartTime: 0s is outside 1s-4095s",
        ),
        (
            "  maxRestartTime: 2h\n",
            "spec.maxRestartTime: 7200s is outside",
        ),
        (
            "  maxRestartTime: soon\n",
            "spec.maxRestartTime: \"soon\" is not a duration",
        ),
        (
            "  reachableBy: fd00::1\n",
            "spec.reachableBy: fd00::1 is not of the family of spec.peerIP",
        ),
        (
            "  reachableBy: gateway\n",
            "spec.reachableBy: \"gateway\" is not an IP address",
        ),
    ] {
        let e = peer(spec);
        assert!(e.contains(want), "{spec}: {e}");
    }
}

#[test]
fn a_peer_names_only_filters_stored_or_applied_before_it() {
    let docs = parse_file(POLICY).unwrap();
    let run = |docs: &[Document], stored: &[&str]| {
        let checked: Vec<_> = docs.iter().map(|d| commands::check(d).unwrap()).collect();
        let state = commands::State {
            filters: stored.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        commands::plan(docs, &checked, &state).map(|a| a.len())
    };
    assert_eq!(
        run(&docs, &[]),
        Ok(4),
        "both filters come first in the file"
    );
    // The peer alone: its filters must be stored.
    let peer = &docs[3..];
    assert_eq!(run(peer, &["export-pods", "import-default"]), Ok(1));
    let e = run(peer, &["export-pods"]).unwrap_err().to_string();
    assert_eq!(
        e,
        "document 4 (BGPPeer rack1-tor): spec.filters[1]: no BGPFilter \"import-default\": apply \
         it first or in the same file; nothing was applied"
    );
    // A filter after the peer in the file would leave the session unfiltered meanwhile.
    let reordered = vec![docs[0].clone(), docs[3].clone(), docs[1].clone()];
    let e = run(&reordered, &[]).unwrap_err().to_string();
    assert!(
        e.contains("spec.filters[1]: BGPFilter \"import-default\" comes later in the file"),
        "{e}"
    );
}

#[test]
fn settings_a_bgppeer_document_cannot_show_are_named() {
    let docs = checked(POLICY).unwrap();
    let mut p = bgppeer::from_document(&docs[3]).unwrap();
    assert!(bgppeer::not_in_document(&p).is_empty());
    p.password = "*****".into();
    p.bfd_multiplier = 3;
    assert_eq!(bgppeer::not_in_document(&p), ["password", "BFD"]);
}

const K8S_POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-web
  namespace: prod
spec:
  podSelector:
    matchLabels: {app: web}
  ingress:
  - from:
    - podSelector:
        matchLabels: {app: client}
    ports:
    - {protocol: TCP, port: 80}
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata:
  name: allow-web
  namespace: prod
spec:
  selector: app == 'web'
  order: 10
  ingress:
  - action: Deny
    source:
      nets: [10.0.0.0/8]
---
apiVersion: v1
kind: Namespace
metadata:
  name: prod
  labels: {team: a}
"#;

#[test]
fn policy_documents_of_both_dialects_are_told_apart_and_checked() {
    let docs = checked(K8S_POLICY).unwrap();
    let kinds: Vec<(Kind, &str)> = docs
        .iter()
        .map(|d| (d.kind, d.namespace.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (Kind::K8sNetworkPolicy, "prod"),
            (Kind::NetworkPolicy, "prod"),
            (Kind::Namespace, ""),
        ]
    );
    // The same name in the two dialects is not "given twice".
    assert!(docs[0].name == docs[1].name);
    // A namespaced document without a namespace is in "default".
    let d = parse_file(
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata:\n  name: g\nspec:\n  selector: all()\n",
    )
    .unwrap();
    assert_eq!(
        (d[0].kind, d[0].namespace.as_str()),
        (Kind::GlobalNetworkPolicy, "")
    );
}

#[test]
fn a_bad_policy_is_refused_with_its_path() {
    let bad = K8S_POLICY.replace("{app: client}", "{app: client, \"bad key!\": x}");
    let e = refused(&bad);
    assert!(e.contains("document 1 (NetworkPolicy allow-web)"), "{e}");
    assert!(
        e.contains("spec.ingress[0].from[0].podSelector.matchLabels"),
        "{e}"
    );
    let e = refused(&K8S_POLICY.replace("port: 80", "port: 70000"));
    assert!(e.contains("spec.ingress[0].ports[0].port"), "{e}");
    let e = refused(&K8S_POLICY.replace("selector: app == 'web'", "selector: app == 'web"));
    assert!(
        e.contains("document 2") && e.contains("spec.selector"),
        "{e}"
    );
    let e = refused(&K8S_POLICY.replace("order: 10", "order: 10\n  colour: red"));
    assert!(e.contains("spec.colour"), "{e}");
}

#[test]
fn policy_kinds_on_the_command_line() {
    assert_eq!(
        Kind::parse("networkpolicies", true),
        Ok(Kind::NetworkPolicy)
    );
    assert_eq!(Kind::parse("gnp", true), Ok(Kind::GlobalNetworkPolicy));
    assert_eq!(Kind::parse("wep", true), Ok(Kind::WorkloadEndpoint));
    assert_eq!(
        Kind::parse("workloadendpoints", true),
        Ok(Kind::WorkloadEndpoint)
    );
    assert_eq!(
        Kind::parse("k8snetworkpolicy", true),
        Ok(Kind::K8sNetworkPolicy)
    );
    assert_eq!(Kind::parse("ns", true), Ok(Kind::Namespace));
}
