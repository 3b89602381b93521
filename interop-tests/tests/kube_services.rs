//! Services on the Kubernetes datastore advertise themselves (issue #51), on a real
//! kube-apiserver and an FRR ToR, with no bgpctl step: three bgpd nodes (n1, n2, n3) on one
//! segment read the cluster from the apiserver (etcd and the apiserver run in the segment's
//! bridge namespace, at 10.97.0.250) and peer with the ToR (`lab::tor`, AS 65000) through
//! Calico `BGPPeer`s, over IPv4 and IPv6. Everything is written with kubectl as Calico's users
//! write it: the `BGPConfiguration`'s service ranges, a Service `shop/web` of type
//! LoadBalancer with `externalTrafficPolicy: Local` (its cluster IP, an external IP, and an
//! IPv6 load-balancer ingress IP in its status), and its EndpointSlice, as the kubelet and the
//! endpoint controller would leave them (no controller runs).
//!
//! - web's three addresses reach the ToR from exactly the nodes with a ready endpoint (n1, then
//!   n1 and n2); n3 announces nothing.
//! - Measured over 20 rounds: from the kubectl write of an endpoint becoming ready (gone) on
//!   n2 to the ToR's next hops with (without) n2, p50 / p99 (printed as `endpoint ready → ToR`
//!   and `endpoint gone → ToR`; each includes kubectl's own start, printed beside).
//! - An operator's own lease (`bgpctl service announce --owner ops`) of web's address on n2
//!   is neither taken over nor withdrawn as n2's endpoint comes and goes.
//! - The apiserver killed for 15 s: the ToR keeps web's routes all along, and after it is back.
//! - A Service of policy Cluster whose external IP is a range of one address is announced by
//!   all three nodes (made first: once the ToR has it, the nodes follow the Services, and web
//!   without a ready endpoint has no route); a Service whose external IP is outside every
//!   range is reported in the log naming it and as one Event on it (`AddressNotAnnounced`),
//!   and not announced.
//! - bgpd runs with the DaemonSet's RBAC (a token of the `margay-node` account), on Nodes
//!   made beforehand as the kubelet makes them; n3's configuration has no address, and it
//!   registers its Node's InternalIPs with eth0's prefix lengths.
//! - The last endpoint not ready: web's addresses leave the ToR; web deleted: nothing stays.
//!
//! Needs root, FRR and the apiserver of `scripts/build-kube`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use interop_tests::lab::bgp_peer::wait_until;
use interop_tests::lab::calico_node::add_ipv6;
use interop_tests::lab::frr::Frr;
use interop_tests::lab::kube_api::KubeApi;
use interop_tests::lab::segment::Segment;
use interop_tests::lab::segment_node::{NodeOptions, SegmentNode as Node};
use interop_tests::lab::{repo_file, tor};

const API: &str = "10.97.0.250";
const CONVERGE: Duration = Duration::from_secs(60);
const EXTERNAL: &str = "198.51.100.7";
const LOAD_BALANCER: &str = "2001:db8:51::5";
/// Policy Cluster, in a range of one address.
const SINGLE: &str = "192.0.2.9";
/// Outside every range.
const STRAY: &str = "203.0.113.99";
const ROUNDS: usize = 20;
/// How long the apiserver is away: beyond a lease renewal (10 s) and several relists.
const OUTAGE: Duration = Duration::from_secs(15);

const CALICO: &str = r"
apiVersion: crd.projectcalico.org/v1
kind: BGPConfiguration
metadata:
  name: default
spec:
  asNumber: 64512
  nodeToNodeMeshEnabled: true
  serviceClusterIPs:
    - cidr: 10.96.0.0/16
  serviceExternalIPs:
    - cidr: 198.51.100.0/24
    - cidr: 192.0.2.9/32
  serviceLoadBalancerIPs:
    - cidr: 2001:db8:51::/64
---
apiVersion: crd.projectcalico.org/v1
kind: BGPPeer
metadata:
  name: tor
spec:
  peerIP: 10.97.0.1
  asNumber: 65000
---
apiVersion: crd.projectcalico.org/v1
kind: BGPPeer
metadata:
  name: tor6
spec:
  peerIP: fd00:97::1
  asNumber: 65000
";

fn host(a: &str) -> String {
    format!("{a}/{}", if a.contains(':') { 128 } else { 32 })
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// web's EndpointSlice with an endpoint on each of `nodes`, ready or not.
fn slice(api: &KubeApi, nodes: &[(&str, bool)]) {
    let endpoints: Vec<serde_json::Value> = nodes
        .iter()
        .enumerate()
        .map(|(i, (node, ready))| {
            serde_json::json!({"addresses": [format!("10.250.0.{}", i + 10)], "nodeName": node,
                               "conditions": {"ready": ready}})
        })
        .collect();
    let manifest = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
    });
    api.apply("slice.json", &manifest.to_string());
}

/// Service `shop/name` of policy Cluster with external IP `address`.
fn apply_service(api: &KubeApi, name: &str, address: &str) {
    let s = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"externalIPs": [address],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    });
    api.apply(&format!("{name}.json"), &s.to_string());
}

/// Which nodes the ToR reaches each of `hosts` through.
fn hops_of(tor: &Frr, hosts: &[String], nodes: &[&Node]) -> Vec<BTreeSet<String>> {
    hosts
        .iter()
        .map(|h| tor::next_hops(tor, h, nodes))
        .collect()
}

fn context(tor: &Frr, nodes: &[&Node]) -> String {
    let mut s = format!(
        "--- ToR\n{}\n{}",
        tor.vtysh(&["show bgp ipv4 unicast"]),
        tor.vtysh(&["show bgp ipv6 unicast"])
    );
    for n in nodes {
        s.push_str(&format!("\n--- {} log (tail)\n{}", n.name, n.log_tail(30)));
    }
    s
}

/// Waits until every host in `hosts` has exactly the next hops `want`; how long it took.
/// Asks the ToR every 20 ms (vtysh's own answer takes some), so that the figures measure
/// margay and not the polling.
fn converge(tor: &Frr, hosts: &[String], nodes: &[&Node], want: &BTreeSet<String>) -> Duration {
    let started = Instant::now();
    while !hops_of(tor, hosts, nodes).iter().all(|h| h == want) {
        assert!(
            started.elapsed() < CONVERGE,
            "{hosts:?}: ToR next hops {:?}, want {want:?}\n{}",
            hops_of(tor, hosts, nodes),
            context(tor, nodes)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: set-up, the Local service, the measured rounds, the apiserver outage, the Cluster and stray services, the end"
)]
#[test]
fn local_services_follow_their_ready_endpoints_to_the_tor() {
    let tag = "ksv";
    let seg = Segment::new(&format!("{tag}seg")).unwrap();
    seg.hub
        .ip(&["addr", "add", &format!("{API}/24"), "dev", "br0"])
        .unwrap();
    let mut api = KubeApi::start_in(seg.hub.name(), API);
    api.apply_crds(&[&repo_file("deploy/rbac.yaml")]);
    api.apply("calico.yaml", CALICO);
    // bgpd runs as the DaemonSet runs it: with the margay-node account's token, on Nodes the
    // kubelet registered (here the test, as the admin).
    let account = api.service_account_kubeconfig("kube-system", "margay-node");
    for name in ["n1", "n2", "n3"] {
        let node =
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        api.apply(&format!("node-{name}.json"), &node.to_string());
    }
    // n3's configuration has no address: its Node's InternalIPs, as its kubelet reports them.
    let addresses = serde_json::json!({"status": {"addresses": [
        {"type": "Hostname", "address": "n3"},
        {"type": "InternalIP", "address": "10.97.0.13"},
        {"type": "InternalIP", "address": "fd00:97::13"},
    ]}});
    api.kubectl_ok(&[
        "patch",
        "node",
        "n3",
        "--subresource=status",
        "--type=merge",
        "-p",
        &addresses.to_string(),
    ]);
    let tor_member = seg
        .attach(&format!("{tag}tor"), &format!("{}/24", tor::ADDRESS))
        .unwrap();
    add_ipv6(&tor_member.ns, "eth0", &format!("{}/64", tor::ADDRESS6))
        .unwrap_or_else(|e| panic!("{e}"));
    let tor = tor::start(&tor_member.ns);
    let nodes: Vec<Node> = [
        ("n1", "10.97.0.11", "fd00:97::11"),
        ("n2", "10.97.0.12", "fd00:97::12"),
        ("n3", "10.97.0.13", "fd00:97::13"),
    ]
    .iter()
    .map(|(name, a4, a6)| {
        Node::start_with(
            &seg,
            name,
            a4,
            &account,
            &NodeOptions {
                tag: Some(&format!("{tag}{name}")),
                addr6: Some(a6),
                kubernetes: true,
                address_from_node: *name == "n3",
                ..Default::default()
            },
        )
    })
    .collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    let [n1, _n2, n3] = [&nodes[0], &nodes[1], &nodes[2]];
    assert!(
        wait_until(CONVERGE, || nodes.iter().all(|n| {
            tor.session_state("ipv4", &n.addr) == "Established"
                && tor.session_state("ipv6", n.addr6.as_deref().unwrap_or("")) == "Established"
        })),
        "the ToR sessions did not come up\n{}",
        context(&tor, &refs)
    );

    // n3 registered the addresses it took from its Node, with eth0's prefix lengths.
    let annotations = api.kubectl_ok(&[
        "get",
        "node",
        "n3",
        "-o",
        "jsonpath={.metadata.annotations}",
    ]);
    let annotations: serde_json::Value = serde_json::from_str(&annotations).unwrap();
    assert_eq!(
        (
            annotations["projectcalico.org/IPv4Address"].as_str(),
            annotations["projectcalico.org/IPv6Address"].as_str()
        ),
        (Some("10.97.0.13/24"), Some("fd00:97::13/64")),
        "{annotations}\n{}",
        n3.log_tail(20)
    );
    assert!(
        n3.log()
            .contains("the node's addresses, from its Kubernetes Node's InternalIPs"),
        "{}",
        n3.log_tail(20)
    );

    // web: LoadBalancer, Local, an external IP and an IPv6 ingress IP; its endpoint on n1.
    api.kubectl_ok(&["create", "namespace", "shop"]);
    let web = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                 "externalIPs": [EXTERNAL],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    });
    api.apply("web.json", &web.to_string());
    let ingress =
        serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": LOAD_BALANCER}]}}});
    api.kubectl_ok(&[
        "patch",
        "service",
        "web",
        "-n",
        "shop",
        "--subresource=status",
        "--type=merge",
        "-p",
        &ingress.to_string(),
    ]);
    let cluster_ip = api.kubectl_ok(&[
        "get",
        "service",
        "web",
        "-n",
        "shop",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    let hosts = [host(cluster_ip.trim()), host(EXTERNAL), host(LOAD_BALANCER)];
    // Nothing before an endpoint is ready anywhere: once the nodes have seen a later Service
    // (policy Cluster in a range of one address: every node announces it), web has no route.
    slice(&api, &[("n1", false)]);
    apply_service(&api, "single", SINGLE);
    converge(&tor, &[host(SINGLE)], &refs, &set(&["n1", "n2", "n3"]));
    assert_eq!(hops_of(&tor, &hosts, &refs), vec![BTreeSet::new(); 3]);
    slice(&api, &[("n1", true)]);
    let took = converge(&tor, &hosts, &refs, &set(&["n1"]));
    println!(
        "web's {hosts:?} on the ToR through n1 only, {} after its endpoint was ready",
        ms(took)
    );
    let leases = n1.ctl_ok(&["service", "list"]);
    assert!(
        leases.contains(EXTERNAL) && leases.contains("kubernetes"),
        "{leases}"
    );
    let none = n3.ctl_ok(&["service", "list", "--json"]);
    assert!(
        !none.contains(EXTERNAL),
        "n3 has no endpoint of web: {none}"
    );

    // The measured rounds: n2's endpoint ready, then not.
    let kubectl_start = {
        let t = Instant::now();
        api.kubectl_ok(&["get", "--raw", "/readyz"]);
        t.elapsed()
    };
    let (mut ready, mut gone) = (Vec::new(), Vec::new());
    let external = [host(EXTERNAL)];
    for _ in 0..ROUNDS {
        let t = Instant::now();
        slice(&api, &[("n1", true), ("n2", true)]);
        converge(&tor, &external, &refs, &set(&["n1", "n2"]));
        ready.push(t.elapsed());
        let t = Instant::now();
        slice(&api, &[("n1", true), ("n2", false)]);
        converge(&tor, &external, &refs, &set(&["n1"]));
        gone.push(t.elapsed());
    }
    ready.sort();
    gone.sort();
    println!(
        "endpoint ready → ToR: p50 {} p99 {} ({ROUNDS} rounds; a kubectl call alone takes {})",
        ms(percentile(&ready, 0.5)),
        ms(percentile(&ready, 0.99)),
        ms(kubectl_start)
    );
    println!(
        "endpoint gone → ToR: p50 {} p99 {} ({ROUNDS} rounds)",
        ms(percentile(&gone, 0.5)),
        ms(percentile(&gone, 0.99))
    );
    converge(&tor, &hosts, &refs, &set(&["n1"]));

    // An operator's own lease of web's external IP on n2 is left to the operator: not taken
    // over when n2's endpoint is ready, not withdrawn when it is gone.
    let n2 = &nodes[1];
    n2.ctl_ok(&[
        "service", "announce", EXTERNAL, "--owner", "ops", "--ttl", "60s",
    ]);
    let others = [host(cluster_ip.trim()), host(LOAD_BALANCER)];
    slice(&api, &[("n1", true), ("n2", true)]);
    converge(&tor, &others, &refs, &set(&["n1", "n2"]));
    let owner_on_n2 = || {
        let leases: serde_json::Value =
            serde_json::from_str(&n2.ctl_ok(&["service", "list", "--json"])).unwrap();
        leases
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["address"] == EXTERNAL)
            .map(|l| l["owner"].as_str().unwrap_or_default().to_owned())
    };
    assert_eq!(owner_on_n2().as_deref(), Some("ops"));
    slice(&api, &[("n1", true), ("n2", false)]);
    converge(&tor, &others, &refs, &set(&["n1"]));
    assert_eq!(owner_on_n2().as_deref(), Some("ops"));
    converge(&tor, &external, &refs, &set(&["n1", "n2"]));
    n2.ctl_ok(&["service", "withdraw", EXTERNAL]);
    converge(&tor, &hosts, &refs, &set(&["n1"]));

    // The apiserver away for longer than a renewal and a few relists: the routes stay all
    // along (asked every half second), and once it is back.
    api.kill_apiserver();
    let until = Instant::now() + OUTAGE;
    while Instant::now() < until {
        assert_eq!(
            hops_of(&tor, &hosts, &refs),
            vec![set(&["n1"]); 3],
            "during the outage\n{}",
            context(&tor, &refs)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    api.start_apiserver();
    std::thread::sleep(Duration::from_secs(3));
    converge(&tor, &hosts, &refs, &set(&["n1"]));
    println!("the apiserver down for {OUTAGE:?}: the ToR kept web's routes through n1 all along");

    // An address outside every range: reported, not announced.
    apply_service(&api, "stray", STRAY);
    assert!(
        wait_until(Duration::from_secs(10), || n1.log().contains(&format!(
            "{STRAY} is outside every BGPConfiguration serviceExternalIPs range"
        ))),
        "the stray Service was not reported\n{}",
        n1.log_tail(30)
    );
    let line = n1
        .log()
        .lines()
        .find(|l| l.contains(STRAY))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(line.contains("shop/stray"), "{line}");
    println!("reported: {line}");
    let uid = api.kubectl_ok(&[
        "get",
        "service",
        "stray",
        "-n",
        "shop",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let said = || {
        api.warnings("shop", "stray")
            .iter()
            .any(|(reason, message, on)| {
                reason == "AddressNotAnnounced" && message.contains(STRAY) && on == uid.trim()
            })
    };
    assert!(
        wait_until(Duration::from_secs(10), said),
        "no Event on shop/stray (uid {uid}): {:?}\n{}",
        api.warnings("shop", "stray"),
        n1.log_tail(20)
    );
    // Three nodes saw it; there is one Event.
    std::thread::sleep(Duration::from_secs(2));
    let warnings = api.warnings("shop", "stray");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    println!("the Event on shop/stray: {warnings:?}");
    assert!(hops_of(&tor, &[host(STRAY)], &refs)[0].is_empty());

    // The last endpoint not ready: web leaves the ToR; web deleted: nothing stays anywhere.
    slice(&api, &[("n1", false)]);
    converge(&tor, &hosts, &refs, &BTreeSet::new());
    slice(&api, &[("n1", true)]);
    converge(&tor, &hosts, &refs, &set(&["n1"]));
    api.kubectl_ok(&["delete", "service", "web", "-n", "shop"]);
    converge(&tor, &hosts, &refs, &BTreeSet::new());
    for n in &nodes {
        let leases = n.ctl_ok(&["service", "list", "--json"]);
        assert!(
            !leases.contains(EXTERNAL) && !leases.contains(LOAD_BALANCER),
            "{}: {leases}",
            n.name
        );
    }
}
