//! BGPFilter resources, the BGPConfiguration's services and communities and the BGPPeer's
//! session options through `bgpctl apply/get/delete` against a real bgpd (a process on a
//! SQLite file): a Calico-shaped file applies, `get` shows what was stored and pipes back
//! into `apply` unchanged, a bad filter (in a file, or straight through the gRPC API) is
//! refused naming its field with nothing of it stored, a peer naming a filter that does not
//! exist is refused, and `delete -f` removes it all. Every address is on loopback; the peer
//! points at a loopback port nobody listens on.

use interop_tests::lab::bgpd::{Daemon, runtime};
use proto::v1 as pb;
use proto::v1::bgp_client::BgpClient;
use serde_json::Value;

const POLICY: &str = r#"# Shaped as Calico's documented examples.
apiVersion: projectcalico.org/v3
kind: BGPConfiguration
metadata:
  name: default
spec:
  nodeToNodeMeshEnabled: false
  asNumber: 64600
  serviceClusterIPs:
  - cidr: 10.96.0.0/12
  serviceExternalIPs:
  - cidr: 104.244.42.129/32
  - cidr: fd00:96::/112
  communities:
  - name: bgp-large-community
    value: 64600:300:100
  prefixAdvertisements:
  - cidr: 10.96.0.0/12
    communities:
    - bgp-large-community
    - 64600:120
---
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
---
apiVersion: projectcalico.org/v3
kind: BGPFilter
metadata:
  name: import-default
spec:
  importV4:
  - action: Accept
    matchOperator: Equal
    cidr: 0.0.0.0/0
  - action: Reject
    source: RemotePeers
  importV6:
  - action: Accept
    matchOperator: In
    cidr: fd00::/8
    prefixLength:
      min: 48
      max: 64
    interface: "*.calico"
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata:
  name: rack1-tor
spec:
  peerIP: 127.0.0.2:1790
  asNumber: 64567
  filters:
  - export-pods
  - import-default
  keepOriginalNextHop: true
  localASNumber: 64999
  numAllowedLocalASNumbers: 1
  maxRestartTime: 2m0s
  reachableBy: 127.0.0.1
"#;

fn names(d: &Daemon, kind: &str) -> Vec<String> {
    d.ctl_o_json(&["get", kind])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The stored documents without their revisions, which an update moves on.
fn without_revisions(mut v: Value) -> Value {
    for item in v["items"].as_array_mut().into_iter().flatten() {
        if let Some(m) = item["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
    }
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    v
}

async fn client(d: &Daemon) -> BgpClient<tonic::transport::Channel> {
    BgpClient::new(proto::client::connect_unix(&d.socket).await.unwrap())
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: filters and peer options applied, read back, round-tripped, raced, refused, deleted; each step checks what the last stored"
)]
fn bgp_filters_and_peer_options_apply_round_trip_refuse_and_delete() {
    let d = Daemon::start("");
    let file = d.dir.path().join("policy.yaml");
    std::fs::write(&file, POLICY).unwrap();
    let file = file.to_str().unwrap();

    let out = d.ctl_io_ok(&["apply", "-f", file], None);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "BGPConfiguration default configured",
            "BGPFilter export-pods configured",
            "BGPFilter import-default configured",
            "BGPPeer rack1-tor configured",
        ]
    );

    // What bgpd stored, as Calico documents.
    let f = d.ctl_o_json(&["get", "bgpfilter", "export-pods"]);
    assert_eq!(f["kind"], "BGPFilter");
    assert!(f["metadata"]["resourceVersion"].is_string(), "{f}");
    assert_eq!(
        f["spec"]["exportV4"],
        serde_json::json!([
            {"action": "Accept", "matchOperator": "In", "cidr": "10.0.0.0/16"},
            {"action": "Reject"},
        ])
    );
    let imp = d.ctl_o_json(&["get", "bgpfilter", "import-default"]);
    assert_eq!(imp["spec"]["importV4"][1]["source"], "RemotePeers");
    assert_eq!(
        imp["spec"]["importV6"][0]["prefixLength"],
        serde_json::json!({"min": 48, "max": 64})
    );
    assert_eq!(imp["spec"]["importV6"][0]["interface"], "*.calico");
    assert_eq!(names(&d, "bgpfilters"), ["export-pods", "import-default"]);
    let peer = d.ctl_o_json(&["get", "bgppeer", "rack1-tor"]);
    let s = &peer["spec"];
    assert_eq!(s["peerIP"], "127.0.0.2:1790");
    assert_eq!(
        s["filters"],
        serde_json::json!(["export-pods", "import-default"])
    );
    assert_eq!(s["nextHopMode"], "Keep", "keepOriginalNextHop: true");
    assert_eq!(
        (&s["localASNumber"], &s["numAllowedLocalASNumbers"]),
        (&serde_json::json!(64999), &serde_json::json!(1))
    );
    assert_eq!(s["maxRestartTime"], "120s");
    assert_eq!(s["reachableBy"], "127.0.0.1");
    let cfg = d.ctl_o_json(&["get", "bgpconfiguration", "default"]);
    let s = &cfg["spec"];
    assert_eq!(
        s["serviceClusterIPs"],
        serde_json::json!([{"cidr": "10.96.0.0/12"}])
    );
    assert_eq!(
        s["serviceExternalIPs"],
        serde_json::json!([{"cidr": "104.244.42.129/32"}, {"cidr": "fd00:96::/112"}])
    );
    assert_eq!(
        s["communities"],
        serde_json::json!([{"name": "bgp-large-community", "value": "64600:300:100"}])
    );
    assert_eq!(
        s["prefixAdvertisements"][0]["communities"],
        serde_json::json!(["bgp-large-community", "64600:120"])
    );
    // The API shows the stored peer as a resource.
    let listed = runtime().block_on(async {
        client(&d)
            .await
            .list_bgp_peer_resources(pb::ListBgpPeerResourcesRequest {})
            .await
            .unwrap()
            .into_inner()
            .peers
    });
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].origin, pb::PeerOrigin::Resource as i32);
    assert_eq!(listed[0].next_hop_mode, pb::NextHopMode::Keep as i32);
    assert_eq!(listed[0].max_restart_time_s, 120);

    // get -o yaml (or json) | apply -f - changes nothing.
    for kind in ["bgpfilters", "bgppeers", "bgpconfiguration"] {
        for format in ["yaml", "json"] {
            let before = without_revisions(d.ctl_o_json(&["get", kind]));
            let text = d.ctl_io_ok(&["get", kind, "-o", format], None);
            let applied = d.ctl_io_ok(&["apply", "-f", "-"], Some(&text));
            assert!(applied.contains("configured"), "{applied}");
            assert_eq!(
                without_revisions(d.ctl_o_json(&["get", kind])),
                before,
                "{kind} -o {format}"
            );
        }
    }
    // A filter read before someone else changed it does not apply over the change.
    let old = d.ctl_io_ok(&["get", "bgpfilter", "export-pods"], None);
    d.ctl_io_ok(&["apply", "-f", "-"], Some(&old));
    let err = d.ctl_io_fails(&["apply", "-f", "-"], Some(&old));
    assert!(err.contains("was changed since it was read"), "{err}");

    // A bad filter in a file: refused by path, and nothing of the file is stored.
    let bad = "apiVersion: projectcalico.org/v3\nkind: BGPFilter\nmetadata: {name: extra}\n\
               spec:\n  exportV4:\n  - {action: Reject}\n---\n\
               apiVersion: projectcalico.org/v3\nkind: BGPFilter\nmetadata: {name: broken}\n\
               spec:\n  exportV4:\n  - {action: Accept, matchOperator: In, cidr: 10.0.0.1/24}\n";
    let err = d.ctl_io_fails(&["apply", "-f", "-"], Some(bad));
    assert!(
        err.contains(
            "document 2 (BGPFilter broken): spec.exportV4[0].cidr: 10.0.0.1/24 is not a network \
             address (host bits set): its network is 10.0.0.0/24; nothing was applied"
        ),
        "{err}"
    );
    for (change, want) in [
        (
            "cidr: fd00::/8",
            "spec.exportV4[0].cidr: fd00::/8 is IPv6, in an IPv4 list",
        ),
        (
            "cidr: 10.0.0.0/8, peerType: eBGP",
            "spec.exportV4[0].peerType: not supported",
        ),
        (
            "cidr: 10.0.0.0/8, interface: \"eth 0\"",
            "spec.exportV4[0].interface",
        ),
    ] {
        let err = d.ctl_io_fails(
            &["apply", "-f", "-"],
            Some(&bad.replace("cidr: 10.0.0.1/24", change)),
        );
        assert!(err.contains(want), "{change}: {err}");
    }
    // A peer naming a filter nobody applied.
    let orphan = "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: orphan}\n\
                  spec: {peerIP: 127.0.0.3, asNumber: 64569, filters: [export-pods, nope]}\n";
    let err = d.ctl_io_fails(&["apply", "-f", "-"], Some(orphan));
    assert!(
        err.contains(
            "document 1 (BGPPeer orphan): spec.filters[1]: no BGPFilter \"nope\": apply it first \
             or in the same file"
        ),
        "{err}"
    );
    assert_eq!(names(&d, "bgpfilters"), ["export-pods", "import-default"]);
    assert_eq!(names(&d, "bgppeers"), ["rack1-tor"]);

    // bgpd checks on its own too, naming the field, storing nothing.
    let rule = |cidr: &str| pb::BgpFilterRule {
        cidr: cidr.into(),
        match_operator: "In".into(),
        action: "Accept".into(),
        ..Default::default()
    };
    let apply = |f: pb::BgpFilter| {
        runtime().block_on(async {
            client(&d)
                .await
                .apply_bgp_filter(pb::ApplyBgpFilterRequest { filter: Some(f) })
                .await
        })
    };
    for (f, want) in [
        (
            pb::BgpFilter {
                name: "api-bad".into(),
                export_v4: vec![rule("10.0.0.1/24")],
                ..Default::default()
            },
            "invalid filter.exportV4[0].cidr: 10.0.0.1/24 is not a network address: its network \
             is 10.0.0.0/24",
        ),
        (
            pb::BgpFilter {
                name: "api-bad".into(),
                import_v6: vec![rule("fd00::/8"), rule("10.0.0.0/8")],
                ..Default::default()
            },
            "invalid filter.importV6[1].cidr: 10.0.0.0/8 is IPv4, in an IPv6 list",
        ),
        (
            pb::BgpFilter {
                name: "api-bad".into(),
                export_v4: vec![pb::BgpFilterRule {
                    prefix_length_min: Some(24),
                    ..rule("")
                }],
                ..Default::default()
            },
            "invalid filter.exportV4[0].cidr: required with matchOperator",
        ),
        (
            pb::BgpFilter {
                name: "api-bad".into(),
                export_v4: vec![rule("10.0.0.0/8"), rule("10.0.0.0/8")],
                ..Default::default()
            },
            "invalid filter.exportV4[1]: the same rule as exportV4[0]",
        ),
    ] {
        let e = apply(f).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with(want), "{}", e.message());
    }
    let e = runtime().block_on(async {
        let mut c = client(&d).await;
        let mut cfg = c
            .get_configuration(pb::GetConfigurationRequest {})
            .await
            .unwrap()
            .into_inner();
        cfg.communities[0].value = "65536:1".into();
        c.set_configuration(pb::SetConfigurationRequest {
            configuration: Some(cfg),
        })
        .await
        .unwrap_err()
    });
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .starts_with("invalid communities[0].value: \"65536:1\" is not a community"),
        "{}",
        e.message()
    );
    let e = runtime().block_on(async {
        client(&d)
            .await
            .add_peer(pb::AddPeerRequest {
                peer: Some(pb::BgpPeer {
                    peer_address: "127.0.0.4".into(),
                    as_number: 64570,
                    filters: vec!["export-pods".into()],
                    ..Default::default()
                }),
            })
            .await
            .unwrap_err()
    });
    assert!(
        e.message()
            .contains("only BGPPeer resources (--resource) take filters"),
        "{}",
        e.message()
    );
    assert_eq!(names(&d, "bgpfilters"), ["export-pods", "import-default"]);
    assert_eq!(
        d.ctl_o_json(&["get", "bgpconfiguration"])["items"][0]["spec"]["communities"][0]["value"],
        "64600:300:100",
        "the bad configuration was not stored"
    );

    // delete -f removes what the file made; the configuration goes back to the defaults.
    let out = d.ctl_io_ok(&["delete", "-f", file], None);
    assert_eq!(out.lines().count(), 4, "{out}");
    assert!(names(&d, "bgpfilters").is_empty());
    assert!(names(&d, "bgppeers").is_empty());
    let cfg = d.ctl_o_json(&["get", "bgpconfiguration"]);
    assert!(
        cfg["items"][0]["spec"].get("serviceClusterIPs").is_none(),
        "{cfg}"
    );
    let err = d.ctl_io_fails(&["delete", "bgpfilter", "export-pods"], None);
    assert!(err.contains("not found"), "{err}");
    let err = d.ctl_io_fails(&["get", "bgpfilter", "export-pods"], None);
    assert!(err.contains("BGPFilter export-pods not found"), "{err}");
}
