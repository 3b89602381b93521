//! bgpd's desired kernel state, as routewriter receives it over `Dataplane.Watch`: derived from
//! IPAM blocks and nodes for VXLAN pools, resumable by revision.

use std::time::Duration;

use interop_tests::lab::bgpd::{Daemon, runtime};
use proto::v1 as pb;
use proto::v1::dataplane_client::DataplaneClient;
use proto::v1::ipam_client::IpamClient;
use proto::v1::nodes_client::NodesClient;
use tonic::Streaming;

const POOL: &str = "[[ipam.default_pools]]\nname = \"default\"\ncidr = \"172.20.0.0/16\"\nvxlan_mode = \"CrossSubnet\"\nnat_outgoing = true\n";

/// The desired state as a client builds it from the stream.
#[derive(Default, Debug)]
struct State {
    revision: u64,
    items: std::collections::BTreeMap<String, pb::DesiredItem>,
}

fn key_of_item(i: &pb::DesiredItem) -> String {
    use pb::desired_item::Item;
    match i.item.as_ref().unwrap() {
        Item::Route(r) => format!("route {}", r.destination),
        // One VTEP per node and family: the IPv6 one is "/v6".
        Item::Vtep(v) => format!(
            "vtep {}{}",
            v.node,
            v6_suffix(v.underlay_address.contains(':'))
        ),
        Item::LocalVtep(v) => format!("local-vtep{}", v6_suffix(v.underlay_address.contains(':'))),
        Item::NatPool(p) => format!("nat {}", p.cidr),
        Item::EndpointPolicy(e) => format!("endpoint-policy {}", e.interface),
        Item::PolicySet(s) => format!("policy-set {}", s.name),
    }
}

fn v6_suffix(v6: bool) -> &'static str {
    if v6 { "/v6" } else { "" }
}

fn key_of_key(k: &pb::DesiredKey) -> String {
    use pb::desired_key::Key;
    match k.key.as_ref().unwrap() {
        Key::Route(r) => format!("route {r}"),
        Key::Vtep(v) => format!(
            "vtep {}{}",
            v.node,
            v6_suffix(v.family() == pb::IpFamily::V6)
        ),
        Key::LocalVtep(f) => format!("local-vtep{}", v6_suffix(*f == pb::IpFamily::V6 as i32)),
        Key::NatPool(p) => format!("nat {p}"),
        Key::EndpointPolicy(i) => format!("endpoint-policy {i}"),
        Key::PolicySet(s) => format!("policy-set {s}"),
    }
}

impl State {
    fn apply(&mut self, u: &pb::DataplaneUpdate) {
        assert!(
            u.revision > self.revision,
            "revision went from {} to {}",
            self.revision,
            u.revision
        );
        self.revision = u.revision;
        if u.snapshot {
            self.items.clear();
        }
        for i in &u.upsert {
            self.items.insert(key_of_item(i), i.clone());
        }
        for k in &u.remove {
            self.items.remove(&key_of_key(k));
        }
    }

    fn route(&self, dest: &str) -> Option<pb::KernelRoute> {
        match self.items.get(&format!("route {dest}"))?.item.clone()? {
            pb::desired_item::Item::Route(r) => Some(r),
            _ => None,
        }
    }
}

/// Applies updates until `done` holds (10 s at most); returns the updates applied.
async fn until(
    s: &mut Streaming<pb::DataplaneUpdate>,
    state: &mut State,
    what: &str,
    done: impl Fn(&State) -> bool,
) -> Vec<pb::DataplaneUpdate> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done(state) {
        let u = tokio::time::timeout_at(deadline, s.message())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "not within 10 s: {what}; state {:?}",
                    state.items.keys().collect::<Vec<_>>()
                )
            })
            .unwrap()
            .expect("stream open");
        state.apply(&u);
        seen.push(u);
    }
    seen
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: the stream follows IPAM changes, resumes by revision, and falls back to a snapshot; each step needs the revision before it"
)]
fn the_stream_follows_ipam_and_resumes_by_revision() {
    let d = Daemon::start(POOL);
    runtime().block_on(async {
        let ch = proto::client::connect_unix(&d.socket).await.unwrap();
        let mut dp = DataplaneClient::new(ch.clone());
        let mut ipam = IpamClient::new(ch.clone());
        let mut nodes = NodesClient::new(ch.clone());

        let mut s = dp
            .watch(pb::WatchRequest { from_revision: 0 })
            .await
            .unwrap()
            .into_inner();
        let mut state = State::default();
        let first = until(&mut s, &mut state, "own VTEP and the NAT pool", |st| {
            st.items.contains_key("local-vtep") && st.items.contains_key("nat 172.20.0.0/16")
        })
        .await;
        assert!(first[0].snapshot, "the first update is a snapshot");
        let pb::desired_item::Item::LocalVtep(vtep) =
            state.items["local-vtep"].item.clone().unwrap()
        else {
            unreachable!()
        };
        assert_eq!(vtep.underlay_address, "10.0.0.5");
        assert!(vtep.tunnel_address.starts_with("172.20."), "{vtep:?}");
        assert!(vtep.mac.starts_with("66:"), "{vtep:?}");
        assert_eq!(vtep.vni, 4096);

        // A node in our subnet and one beyond it, each with a block.
        let mut b = pb::Node {
            name: "node-b".into(),
            ipv4_address: "10.0.0.6/24".into(),
            ..Default::default()
        };
        nodes
            .register_node(pb::RegisterNodeRequest {
                node: Some(b.clone()),
            })
            .await
            .unwrap();
        let c = pb::Node {
            name: "node-c".into(),
            ipv4_address: "10.9.0.7/24".into(),
            vxlan_tunnel_address: "172.20.250.1".into(),
            vxlan_tunnel_mac: "66:01:02:03:04:05".into(),
            ..Default::default()
        };
        nodes
            .register_node(pb::RegisterNodeRequest { node: Some(c) })
            .await
            .unwrap();
        let assign = |handle: &str, node: &str| pb::AutoAssignRequest {
            handle: handle.into(),
            node: node.into(),
            num_ipv4: 1,
            ..Default::default()
        };
        let own = ipam
            .auto_assign(assign("k8s.a", ""))
            .await
            .unwrap()
            .into_inner()
            .ipv4[0]
            .block
            .clone();
        let bb = ipam
            .auto_assign(assign("k8s.b", "node-b"))
            .await
            .unwrap()
            .into_inner()
            .ipv4[0]
            .block
            .clone();
        let cb = ipam
            .auto_assign(assign("k8s.c", "node-c"))
            .await
            .unwrap()
            .into_inner()
            .ipv4[0]
            .block
            .clone();
        until(&mut s, &mut state, "three block routes", |st| {
            st.route(&own).is_some() && st.route(&bb).is_some() && st.route(&cb).is_some()
        })
        .await;
        assert_eq!(state.route(&own).unwrap().kind(), pb::RouteKind::Blackhole);
        let rb = state.route(&bb).unwrap();
        assert_eq!(
            (rb.kind(), rb.gateway.as_str(), rb.onlink),
            (pb::RouteKind::Gateway, "10.0.0.6", false)
        );
        let rc = state.route(&cb).unwrap();
        assert_eq!(
            (rc.kind(), rc.gateway.as_str(), rc.onlink),
            (pb::RouteKind::Vxlan, "172.20.250.1", true)
        );
        assert!(state.items.contains_key("vtep node-c"));
        assert!(
            !state.items.contains_key("vtep node-b"),
            "node-b has no tunnel address yet"
        );
        let seen_at = state.revision;
        drop(s);

        // While we are away: node-b gets its tunnel address. Resume: only that arrives.
        b.vxlan_tunnel_address = "172.20.251.1".into();
        b.vxlan_tunnel_mac = "66:0a:0b:0c:0d:0e".into();
        nodes
            .register_node(pb::RegisterNodeRequest { node: Some(b) })
            .await
            .unwrap();
        let mut s = dp
            .watch(pb::WatchRequest {
                from_revision: seen_at,
            })
            .await
            .unwrap()
            .into_inner();
        let resumed = until(&mut s, &mut state, "node-b's VTEP", |st| {
            st.items.contains_key("vtep node-b")
        })
        .await;
        assert!(
            resumed.iter().all(|u| !u.snapshot),
            "resumed with a snapshot"
        );
        assert!(
            resumed.iter().all(|u| u.upsert.len() + u.remove.len() <= 2),
            "{resumed:?}"
        );

        // A node removed: its block leaves the desired state.
        nodes
            .delete_node(pb::DeleteNodeRequest {
                name: "node-c".into(),
            })
            .await
            .unwrap();
        until(&mut s, &mut state, "node-c gone", |st| {
            st.route(&cb).is_none() && !st.items.contains_key("vtep node-c")
        })
        .await;

        // A revision this bgpd never issued: a snapshot, equal to what we built.
        let mut fresh = dp
            .watch(pb::WatchRequest { from_revision: 1 })
            .await
            .unwrap()
            .into_inner();
        let snap = fresh.message().await.unwrap().unwrap();
        assert!(snap.snapshot);
        let mut rebuilt = State::default();
        rebuilt.apply(&snap);
        assert_eq!(rebuilt.items, state.items);
    });
}
