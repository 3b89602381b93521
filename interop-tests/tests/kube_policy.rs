//! Network policy with the Kubernetes API as the source of truth (issue #51), in a lab on a
//! real kube-apiserver (`margay-lab up --kubernetes`, the lab playing the kubelet: it creates
//! each Pod on its node, runs CNI, and writes the Pod's IPs to its status). No `bgpctl` step:
//! - the pods' endpoints are their Pods (labels, namespace, addresses), and the CNI plugin's
//!   record of one is Calico's annotations on the Pod, not an object of margay's;
//! - `kubectl apply` of a `networking.k8s.io/v1` NetworkPolicy, and of Calico's
//!   GlobalNetworkPolicy custom resource, is enforced on every node, and `kubectl delete`
//!   lifts it;
//! - `kubectl label pod` and `kubectl label ns` change enforcement live;
//! - an edit margay cannot enforce (kubectl writes past bgpctl's checks) leaves the version
//!   in force, never an open door;
//! - `bgpctl show policy POD` explains it by the Pod's name.
//!
//! Checked with real traffic (`lab::flows`); a flow that must not pass is probed only after
//! the node's nft table shows the change.

use std::net::IpAddr;
use std::time::Instant;

use interop_tests::lab::flows::{self, NFT_WITHIN, Ping, Tcp, Udp, no, ok, serve};
use interop_tests::lab::local::LocalLab as Lab;
use serde_json::Value;

struct KubeLab {
    lab: Lab,
    addresses: std::collections::HashMap<String, (IpAddr, IpAddr)>,
}

impl KubeLab {
    fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["kubectl"];
        all.extend_from_slice(args);
        self.lab.ok(&all)
    }

    /// `kubectl apply` of a manifest written to the lab's state folder.
    fn apply(&self, name: &str, yaml: &str) -> String {
        let dir = self.lab.node_dir("manifests");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let path = path.display().to_string();
        self.kubectl(&["apply", "-f", &path]);
        path
    }

    fn check(&self, scenario: &str, flows: &[flows::Flow]) {
        flows::check(&self.lab, &self.addresses, scenario, flows);
    }

    fn address(&self, pod: &str) -> IpAddr {
        self.addresses[pod].0
    }
}

const ALLOW_CLIENTS: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-clients
  namespace: prod
spec:
  podSelector:
    matchLabels: {app: web}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector:
        matchLabels: {app: client}
    - namespaceSelector:
        matchLabels: {team: web}
    ports:
    - {protocol: TCP, port: 80}
";

const WEB_NO_UDP: &str = "apiVersion: crd.projectcalico.org/v1
kind: GlobalNetworkPolicy
metadata:
  name: web-no-udp
spec:
  order: 10
  selector: app == 'web'
  types: [Egress]
  egress:
  - action: Deny
    protocol: UDP
  - action: Allow
";

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one lab on the apiserver (a minute to come up) told as numbered steps, each building on the one before"
)]
fn kubectl_drives_network_policy_on_every_node() {
    let started = Instant::now();
    let lab = Lab::new(&format!("mkp{}", std::process::id()));
    lab.ok(&["up", "--kubernetes"]);
    for (node, pod, ns, label) in [
        ("node-1", "web", "prod", "app=web"),
        ("node-3", "cli", "prod", "app=client"),
        ("node-2", "dcli", "dev", "app=client"),
    ] {
        lab.ok(&["pod-add", node, pod, "--namespace", ns, "--label", label]);
    }
    let addresses = flows::pod_addresses(&lab.ok(&["status"]));
    for pod in addresses.keys() {
        serve(&lab.ns(pod));
    }
    let k = KubeLab { lab, addresses };
    println!(
        "lab on the apiserver with pods up in {:?}",
        started.elapsed()
    );

    // 1. The endpoints are the Pods: the plugin's record is Calico's annotations on the Pod,
    // and margay keeps no endpoint object of its own.
    let pod: Value =
        serde_json::from_str(&k.kubectl(&["get", "pod", "-n", "prod", "node-1-web", "-o", "json"]))
            .unwrap();
    let notes = &pod["metadata"]["annotations"];
    let web = k.address("node-1-web").to_string();
    assert_eq!(
        notes["cni.projectcalico.org/podIP"],
        format!("{web}/32"),
        "{notes}"
    );
    assert!(
        notes["cni.projectcalico.org/podIPs"]
            .as_str()
            .is_some_and(|ips| ips.contains(&web) && ips.contains(',')),
        "{notes}"
    );
    assert!(
        notes["cni.projectcalico.org/containerID"].is_string(),
        "{notes}"
    );
    let objects = k.kubectl(&["get", "margayobjects", "-o", "name"]);
    assert!(
        !objects.contains("workloadendpoint"),
        "an endpoint stored as margay's own object:\n{objects}"
    );
    let (ok_, shown) = k
        .lab
        .bgpctl("node-1", &["get", "wep", "-n", "prod", "-o", "json"]);
    assert!(ok_, "{shown}");
    let weps: Value = serde_json::from_str(&shown).unwrap();
    let web_ep = weps["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["spec"]["pod"] == "node-1-web")
        .unwrap_or_else(|| panic!("no endpoint of node-1-web: {weps}"));
    assert_eq!(web_ep["metadata"]["labels"]["app"], "web", "{web_ep}");
    let web_if = web_ep["spec"]["interfaceName"].as_str().unwrap().to_owned();

    // 2. No policy: everything passes.
    k.check(
        "no policy",
        &[
            ok("node-3-cli", "node-1-web", Tcp(80)),
            ok("node-2-dcli", "node-1-web", Tcp(80)),
            ok("node-2-a", "node-1-web", Ping),
        ],
    );

    // 3. kubectl apply of a NetworkPolicy: only clients of prod (or of a team=web namespace)
    // reach web, on TCP 80.
    let allow = k.apply("allow-clients", ALLOW_CLIENTS);
    flows::wait_table(&k.lab, "node-1", "got web's ingress chain", |t| {
        t.contains(&format!("chain ingress-{web_if}"))
    });
    k.check(
        "kubectl apply NetworkPolicy",
        &[
            ok("node-3-cli", "node-1-web", Tcp(80)),
            ok("node-3-cli", "node-1-web", Tcp(80)).v6(),
            no("node-3-cli", "node-1-web", Tcp(81)),
            no("node-2-dcli", "node-1-web", Tcp(80)),
            no("node-2-a", "node-1-web", Ping),
        ],
    );
    let shown = k
        .lab
        .bgpctl("node-1", &["show", "policy", "node-1-web", "-n", "prod"])
        .1;
    assert!(
        shown.contains("k8s-networkpolicy/prod/allow-clients"),
        "show policy does not name the policy:\n{shown}"
    );

    // 4. kubectl label pod: the client no longer a client, then again one.
    let cli = k.address("node-3-cli");
    k.kubectl(&[
        "label",
        "pod",
        "-n",
        "prod",
        "node-3-cli",
        "app=other",
        "--overwrite",
    ]);
    flows::wait_table(&k.lab, "node-1", "dropped node-3-cli's address", |t| {
        !t.contains(&cli.to_string())
    });
    k.check(
        "kubectl label pod app=other",
        &[no("node-3-cli", "node-1-web", Tcp(80))],
    );
    k.kubectl(&[
        "label",
        "pod",
        "-n",
        "prod",
        "node-3-cli",
        "app=client",
        "--overwrite",
    ]);
    k.check(
        "kubectl label pod app=client",
        &[ok("node-3-cli", "node-1-web", Tcp(80))],
    );

    // 5. kubectl label ns: dev's pods are let in once dev is team=web.
    let dcli = k.address("node-2-dcli");
    k.kubectl(&["label", "ns", "dev", "team=web"]);
    flows::wait_table(&k.lab, "node-1", "got node-2-dcli's address", |t| {
        t.contains(&dcli.to_string())
    });
    k.check(
        "kubectl label ns dev team=web",
        &[
            ok("node-2-dcli", "node-1-web", Tcp(80)),
            no("node-2-dcli", "node-1-web", Tcp(81)),
        ],
    );

    // 6. Calico's GlobalNetworkPolicy, applied as its custom resource: web sends no UDP.
    let gnp = k.apply("web-no-udp", WEB_NO_UDP);
    flows::wait_table(&k.lab, "node-1", "got web's egress chain", |t| {
        t.contains(&format!("chain egress-{web_if}"))
    });
    k.check(
        "kubectl apply GlobalNetworkPolicy",
        &[
            no("node-1-web", "node-2-a", Udp(80)),
            ok("node-1-web", "node-2-a", Tcp(80)),
            ok("node-1-web", "node-3-a", Ping).v6(),
        ],
    );
    let shown = k
        .lab
        .bgpctl("node-1", &["show", "policy", "node-1-web", "-n", "prod"])
        .1;
    assert!(shown.contains("web-no-udp"), "{shown}");

    // 7. An edit margay cannot enforce (doNotTrack, which it refuses), written with kubectl
    // past bgpctl's checks: the version in force stays, it does not fall open.
    k.apply(
        "web-no-udp",
        &WEB_NO_UDP.replace("  order: 10\n", "  order: 10\n  doNotTrack: true\n"),
    );
    let log = k.lab.node_dir("node-1").join("bgpd.log");
    let deadline = Instant::now() + NFT_WITHIN;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("its last version stays in force")
    {
        assert!(
            Instant::now() < deadline,
            "bgpd never said it kept web-no-udp"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // It is said on the policy too, as an Event (a cluster-wide policy's is in `default`).
    let events = || {
        k.kubectl(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "involvedObject.name=web-no-udp,reason=PolicyNotEnforced",
            "-o",
            "jsonpath={.items[*].message}",
        ])
    };
    let deadline = Instant::now() + NFT_WITHIN;
    while !events().contains("its last version stays in force") {
        assert!(
            Instant::now() < deadline,
            "no Event on web-no-udp: {}",
            events()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    println!("the Event on web-no-udp: {}", events());
    k.check(
        "an edit margay cannot enforce",
        &[
            no("node-1-web", "node-2-a", Udp(80)),
            ok("node-1-web", "node-2-a", Tcp(80)),
        ],
    );

    // 8. kubectl delete lifts both.
    k.kubectl(&["delete", "-f", &allow]);
    k.kubectl(&["delete", "-f", &gnp]);
    flows::wait_table(&k.lab, "node-1", "lost web's chains", |t| {
        !t.contains(&web_if)
    });
    k.check(
        "policies deleted",
        &[
            ok("node-2-a", "node-1-web", Ping),
            ok("node-3-cli", "node-1-web", Tcp(81)),
            ok("node-1-web", "node-2-a", Udp(80)),
        ],
    );

    // 9. A pod deleted the kubelet's way (CNI DEL, then the Pod) leaves no endpoint behind.
    k.lab.ok(&["pod-del", "node-3", "cli"]);
    let deadline = Instant::now() + NFT_WITHIN;
    loop {
        let (_, shown) = k
            .lab
            .bgpctl("node-1", &["get", "wep", "-n", "prod", "-o", "json"]);
        if !shown.contains("node-3-cli") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node-3-cli's endpoint stayed:\n{shown}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    println!("done in {:?}", started.elapsed());
}
