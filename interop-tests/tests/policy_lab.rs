//! Network policy in the lab (issue #37), end to end: documents applied with `bgpctl apply`,
//! computed by every bgpd, enforced by every routewriter in `table inet margay-policy`, and
//! checked with real traffic between pods of one lab of this run's own name (TCP connect,
//! UDP, ping; same node, same subnet, across the router; IPv4 and IPv6). Every scenario checks
//! traffic that must pass and traffic that must not, and undoes its policies.
//!
//! The traffic is `lab::flows`': a flow that must not pass is probed once, after the node's
//! nft table shows the change (else a drop would prove nothing); `margay-lab down`, run on
//! drop, removes the pods' namespaces and their servers' sockets.
//! Why this file is long: thirteen scenarios share one lab (it takes ~40 s to come up), and
//! each needs its documents, its waits and its flows written out to be read as a spec.

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use interop_tests::lab::flows::{self, Flow, NFT_WITHIN, Ping, Tcp, Udp, no, ok, serve};
use interop_tests::lab::{self, local::LocalLab as Lab};
use proto::v1 as pb;
use proto::v1::policy_client::PolicyClient;
use serde_json::{Value, json};

/// The lab with what the scenarios keep asking of it.
struct PolicyLab {
    lab: Lab,
    /// Pod → (IPv4, IPv6).
    addresses: HashMap<String, (IpAddr, IpAddr)>,
    docs: PathBuf,
}

impl PolicyLab {
    fn address(&self, pod: &str, v6: bool) -> IpAddr {
        let (a, a6) = self.addresses[pod];
        if v6 { a6 } else { a }
    }

    /// Checks every flow (in parallel) and panics naming each that went the wrong way, with
    /// the policy tables of the nodes involved.
    fn check(&self, scenario: &str, flows: &[Flow]) {
        flows::check(&self.lab, &self.addresses, scenario, flows);
    }

    /// `nft list table inet margay-policy` in a node's namespace (`-a`: with handles).
    fn nft_of(&self, node: &str, handles: bool) -> String {
        let mut args = vec!["nft"];
        args.extend(handles.then_some("-a"));
        args.extend(["list", "table", "inet", "margay-policy"]);
        self.lab.exec(node, &args).1
    }

    fn nft(&self, node: &str) -> String {
        self.nft_of(node, false)
    }

    /// Waits until a node's policy table satisfies `holds`.
    fn wait_nft(&self, node: &str, what: &str, holds: impl Fn(&str) -> bool) {
        flows::wait_table(&self.lab, node, what, holds);
    }

    fn wait_chain(&self, node: &str, chain: &str, present: bool) {
        let what = format!("{} {chain}", if present { "got" } else { "lost" });
        self.wait_nft(node, &what, |t| chain_in(t, chain).is_some() == present);
    }

    fn bgpctl(&self, args: &[&str]) -> String {
        let (ok, out) = self.lab.bgpctl("node-1", args);
        assert!(ok, "bgpctl {args:?}: {out}");
        out
    }

    fn write_doc(&self, name: &str, yaml: &str) -> String {
        let path = self.docs.join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path.display().to_string()
    }

    /// Applies a document (panics when refused); its file, to delete it by.
    fn apply(&self, name: &str, yaml: &str) -> String {
        let path = self.write_doc(name, yaml);
        self.bgpctl(&["apply", "-f", &path]);
        path
    }

    fn delete(&self, path: &str) {
        self.bgpctl(&["delete", "-f", path]);
    }

    /// A pod's interface on its node, from its workload endpoint.
    fn interface(&self, namespace: &str, pod: &str) -> String {
        let v: Value =
            serde_json::from_str(&self.bgpctl(&["get", "wep", "-n", namespace, "-o", "json"]))
                .unwrap();
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|w| w["spec"]["pod"] == pod)
            .and_then(|w| w["spec"]["interfaceName"].as_str())
            .unwrap_or_else(|| panic!("no endpoint of {pod} in {namespace}: {v}"))
            .to_owned()
    }

    /// `bgpctl routewriter --json` of a node, run inside its namespace.
    /// (`Null` while its listener is not up yet.)
    fn routewriter_status(&self, node: &str) -> Value {
        let bgpctl = lab::binary("bgpctl").display().to_string();
        let (ok, out) = self.lab.exec(node, &[&bgpctl, "routewriter", "--json"]);
        if !ok && out.contains("cannot reach routewriter") {
            return Value::Null;
        }
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }
}

/// One chain's part of an nft listing, when the chain is there.
fn chain_in<'a>(table: &'a str, chain: &str) -> Option<&'a str> {
    let start = table.find(&format!("chain {chain} {{"))?;
    let rest = &table[start..];
    Some(&rest[..rest.find("\n\t}").unwrap_or(rest.len())])
}

/// Whether an nft listing names `addr` as an element (a whole token, not a prefix of one).
fn has_element(table: &str, addr: IpAddr) -> bool {
    let addr = addr.to_string();
    table
        .split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':'))
        .any(|t| t == addr)
}

fn k8s_policy(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n  \
         namespace: prod\nspec:\n{spec}"
    )
}

const DENY_INGRESS: &str = "  podSelector: {}\n  policyTypes: [Ingress]\n";
const DENY_EGRESS: &str = "  podSelector: {}\n  policyTypes: [Egress]\n";

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "the numbered policy steps (1 to 10) told in order on one lab; each policy change builds on the one before, and splitting would scatter the story"
)]
fn network_policy_is_enforced_in_the_lab() {
    let started = Instant::now();
    let lab = Lab::new(&format!("mpl{}", std::process::id()));
    lab.ok(&["up"]);
    for (node, pod, ns, label) in [
        ("node-1", "web", "prod", "app=web"),
        ("node-1", "cli", "prod", "app=client"),
        ("node-3", "cli", "prod", "app=client"),
        ("node-2", "dcli", "dev", "app=client"),
        ("node-4", "dns", "kube-system", "k8s-app=kube-dns"),
        ("node-4", "web", "dev", "app=web"),
    ] {
        lab.ok(&["pod-add", node, pod, "--namespace", ns, "--label", label]);
    }
    let status = lab.ok(&["status"]);
    let addresses = flows::pod_addresses(&status);
    assert_eq!(addresses.len(), 14, "{status}");
    for pod in addresses.keys() {
        serve(&lab.ns(pod));
    }
    // In the lab's state folder, which `down` removes, also after a failure.
    let docs = lab.node_dir("policies");
    std::fs::create_dir_all(&docs).unwrap();
    let p = PolicyLab {
        lab,
        addresses,
        docs,
    };
    let web_if = p.interface("prod", "node-1-web");
    let cli1_if = p.interface("prod", "node-1-cli");
    let cli3_if = p.interface("prod", "node-3-cli");
    let dweb_if = p.interface("dev", "node-4-web");
    let (ingress_web, egress_web) = (format!("ingress-{web_if}"), format!("egress-{web_if}"));
    println!("lab with pods up in {:?}", started.elapsed());

    // 1. No policy: everything passes, and no endpoint has a chain.
    assert!(
        !p.nft("node-1").contains("chain ingress-"),
        "{}",
        p.nft("node-1")
    );
    p.check(
        "no policy",
        &[
            ok("node-1-cli", "node-1-web", Tcp(80)),
            ok("node-1-cli", "node-1-web", Udp(80)),
            ok("node-1-cli", "node-1-web", Ping),
            ok("node-3-cli", "node-1-web", Tcp(80)),
            ok("node-3-cli", "node-1-web", Udp(80)),
            ok("node-2-a", "node-1-web", Ping),
            ok("node-2-a", "node-1-web", Tcp(80)).v6(),
            ok("node-3-a", "node-1-web", Ping).v6(),
            ok("node-1-web", "node-4-dns", Udp(53)),
        ],
    );

    // 2. Default-deny ingress in prod, then egress too.
    let deny_in = p.apply("deny-ingress", &k8s_policy("deny-ingress", DENY_INGRESS));
    p.wait_chain("node-1", &ingress_web, true);
    p.wait_chain("node-1", &format!("ingress-{cli1_if}"), true);
    p.wait_chain("node-3", &format!("ingress-{cli3_if}"), true);
    p.check(
        "default-deny ingress",
        &[
            no("node-1-a", "node-1-web", Tcp(80)),
            no("node-1-a", "node-1-web", Udp(80)),
            no("node-1-cli", "node-1-web", Tcp(80)),
            no("node-3-a", "node-1-web", Ping),
            no("node-2-a", "node-1-web", Tcp(80)).v6(),
            no("node-1-web", "node-3-cli", Tcp(80)),
            ok("node-1-web", "node-2-a", Tcp(80)),
            ok("node-1-web", "node-3-a", Ping).v6(),
            ok("node-1-a", "node-2-a", Tcp(80)),
        ],
    );
    let deny_out = p.apply("deny-egress", &k8s_policy("deny-egress", DENY_EGRESS));
    p.wait_chain("node-1", &egress_web, true);
    p.wait_chain("node-3", &format!("egress-{cli3_if}"), true);
    p.check(
        "default-deny ingress and egress",
        &[
            no("node-1-web", "node-2-a", Tcp(80)),
            no("node-1-web", "node-1-a", Udp(80)),
            no("node-1-web", "node-4-a", Ping),
            no("node-1-web", "node-3-a", Tcp(80)).v6(),
            no("node-3-cli", "node-4-a", Udp(53)),
            ok("node-1-a", "node-4-a", Tcp(80)),
        ],
    );
    p.delete(&deny_in);
    p.wait_chain("node-1", &ingress_web, false);
    p.wait_chain("node-3", &format!("ingress-{cli3_if}"), false);

    // 3. Allow DNS only: egress to kube-system on UDP and TCP 53; replies of allowed inbound
    // flows still leave the egress-denied pods (conntrack).
    let dns = p.apply(
        "allow-dns",
        &k8s_policy(
            "allow-dns",
            "  podSelector: {}\n  policyTypes: [Egress]\n  egress:\n  - to:\n    - \
             namespaceSelector:\n        matchLabels:\n          kubernetes.io/metadata.name: \
             kube-system\n    ports:\n    - {protocol: UDP, port: 53}\n    - {protocol: TCP, \
             port: 53}\n",
        ),
    );
    p.wait_nft("node-1", "allowed port 53", |t| t.contains("dport 53"));
    p.check(
        "allow DNS only",
        &[
            ok("node-1-web", "node-4-dns", Udp(53)),
            ok("node-1-web", "node-4-dns", Tcp(53)),
            ok("node-1-web", "node-4-dns", Udp(53)).v6(),
            ok("node-1-cli", "node-4-dns", Tcp(53)),
            ok("node-3-cli", "node-4-dns", Udp(53)),
            no("node-1-web", "node-4-dns", Tcp(80)),
            no("node-1-web", "node-4-dns", Ping),
            no("node-1-web", "node-4-a", Tcp(53)),
            no("node-1-web", "node-4-a", Udp(53)),
            no("node-1-web", "node-1-a", Udp(53)).v6(),
            ok("node-2-a", "node-1-web", Tcp(80)),
            ok("node-2-a", "node-1-web", Udp(80)),
            ok("node-1-a", "node-1-web", Ping),
            ok("node-3-a", "node-1-web", Tcp(80)).v6(),
        ],
    );
    p.delete(&dns);
    p.delete(&deny_out);
    p.wait_chain("node-1", &egress_web, false);

    // 4. Allow from pods with a label, in the policy's namespace only; a namespaceSelector
    // peer lets the other namespace's pod in once its Namespace has the label (7, second
    // half: a Namespace's labels open a flow live).
    let allow_client = |peers: &str| {
        k8s_policy(
            "allow-client",
            &format!(
                "  podSelector:\n    matchLabels: {{app: web}}\n  ingress:\n  - from:\n    - \
                 podSelector:\n        matchLabels: {{app: client}}\n{peers}"
            ),
        )
    };
    let allow = p.apply("allow-client", &allow_client(""));
    p.wait_chain("node-1", &ingress_web, true);
    p.check(
        "allow from app=client",
        &[
            ok("node-1-cli", "node-1-web", Tcp(80)),
            ok("node-3-cli", "node-1-web", Udp(80)),
            ok("node-3-cli", "node-1-web", Ping),
            ok("node-3-cli", "node-1-web", Tcp(80)).v6(),
            no("node-2-dcli", "node-1-web", Tcp(80)),
            no("node-2-dcli", "node-1-web", Ping),
            no("node-1-a", "node-1-web", Tcp(80)),
            no("node-3-a", "node-1-web", Ping).v6(),
        ],
    );
    let before = p.nft("node-1");
    p.apply(
        "allow-client",
        &allow_client(
            "    - namespaceSelector:\n        matchLabels: {team: blue}\n      podSelector:\n        \
             matchLabels: {app: client}\n",
        ),
    );
    p.wait_nft("node-1", "changed for the namespaceSelector", |t| {
        t != before
    });
    p.check(
        "a namespaceSelector no namespace matches yet",
        &[
            no("node-2-dcli", "node-1-web", Tcp(80)),
            ok("node-1-cli", "node-1-web", Tcp(80)),
        ],
    );
    let dev = p.apply(
        "ns-dev",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: dev\n  labels:\n    team: blue\n",
    );
    p.check(
        "the namespace labelled team=blue",
        &[
            ok("node-2-dcli", "node-1-web", Tcp(80)),
            ok("node-2-dcli", "node-1-web", Udp(80)),
            ok("node-2-dcli", "node-1-web", Ping).v6(),
            no("node-1-a", "node-1-web", Tcp(80)),
        ],
    );

    // 10. show policy names the selecting policy, its rule, and each direction's default.
    let shown = p.bgpctl(&["show", "policy", "node-1-web", "-n", "prod"]);
    println!("{shown}");
    for part in [
        "k8s-networkpolicy/prod/allow-client (order 1000)",
        "ingress: deny: selected by 1 policy",
        "app == 'client'",
        "egress: allow: no policy selects it",
    ] {
        assert!(shown.contains(part), "{part:?} not in:\n{shown}");
    }
    let shown = p.bgpctl(&["show", "policy", "node-1-a", "-n", "default"]);
    assert!(!shown.contains("allow-client"), "{shown}");
    assert_eq!(shown.matches("no policy selects it").count(), 2, "{shown}");

    // 7. A label change closes a flow live; restoring it opens it again.
    let cli3 = p.address("node-3-cli", false);
    assert!(has_element(&p.nft("node-1"), cli3), "{}", p.nft("node-1"));
    p.bgpctl(&["label", "wep", "node-3-cli", "app=nobody", "-n", "prod"]);
    p.wait_nft("node-1", "dropped node-3-cli", |t| !has_element(t, cli3));
    p.check(
        "node-3-cli labelled app=nobody",
        &[
            no("node-3-cli", "node-1-web", Tcp(80)),
            no("node-3-cli", "node-1-web", Ping).v6(),
            ok("node-1-cli", "node-1-web", Tcp(80)),
        ],
    );
    p.bgpctl(&["label", "wep", "node-3-cli", "app=client", "-n", "prod"]);
    p.check(
        "node-3-cli labelled app=client again",
        &[
            ok("node-3-cli", "node-1-web", Tcp(80)),
            ok("node-3-cli", "node-1-web", Udp(80)).v6(),
        ],
    );

    // 6. A Calico Deny of lower order beats the Kubernetes allow (TCP only, prod's clients
    // only); removing it restores the allow.
    let deny_tcp = p.apply(
        "deny-clients",
        "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata:\n  name: deny-clients\n  \
         namespace: prod\nspec:\n  order: 100\n  selector: app == 'web'\n  types: [Ingress]\n  \
         ingress:\n  - action: Deny\n    protocol: TCP\n    source:\n      selector: app == \
         'client'\n",
    );
    p.wait_nft("node-1", "got deny-clients", |t| {
        t.contains("networkpolicy/prod/deny-clients")
    });
    p.check(
        "a Calico Deny of order 100",
        &[
            no("node-1-cli", "node-1-web", Tcp(80)),
            no("node-3-cli", "node-1-web", Tcp(80)).v6(),
            ok("node-3-cli", "node-1-web", Udp(80)),
            ok("node-1-cli", "node-1-web", Ping),
            ok("node-2-dcli", "node-1-web", Tcp(80)),
        ],
    );
    p.delete(&deny_tcp);
    p.check(
        "the Calico Deny removed",
        &[
            ok("node-1-cli", "node-1-web", Tcp(80)),
            ok("node-3-cli", "node-1-web", Tcp(80)).v6(),
        ],
    );
    p.delete(&allow);
    p.delete(&dev);
    p.wait_chain("node-1", &ingress_web, false);

    // 5. ipBlock with except: egress to the pool but one pod; IPv6 is not in the block.
    let n2a = p.address("node-2-a", false);
    let egress_pool = p.apply(
        "egress-pool",
        &k8s_policy(
            "egress-pool",
            &format!(
                "  podSelector:\n    matchLabels: {{app: web}}\n  policyTypes: [Egress]\n  \
                 egress:\n  - to:\n    - ipBlock:\n        cidr: 172.20.0.0/16\n        \
                 except: [{n2a}/32]\n"
            ),
        ),
    );
    p.wait_chain("node-1", &egress_web, true);
    p.check(
        "ipBlock with except",
        &[
            ok("node-1-web", "node-3-a", Tcp(80)),
            ok("node-1-web", "node-1-a", Ping),
            ok("node-1-web", "node-2-b", Udp(80)),
            no("node-1-web", "node-2-a", Tcp(80)),
            no("node-1-web", "node-2-a", Udp(80)),
            no("node-1-web", "node-2-a", Ping),
            no("node-1-web", "node-3-a", Tcp(80)).v6(),
            ok("node-1-cli", "node-2-a", Tcp(80)),
        ],
    );
    p.delete(&egress_pool);
    p.wait_chain("node-1", &egress_web, false);

    // 8. A GlobalNetworkPolicy across namespaces: no ICMP to app=web anywhere.
    let gnp = p.apply(
        "no-icmp-to-web",
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata:\n  name: \
         no-icmp-to-web\nspec:\n  order: 10\n  selector: app == 'web'\n  types: [Ingress]\n  \
         ingress:\n  - {action: Deny, protocol: ICMP}\n  - {action: Deny, protocol: ICMPv6}\n  \
         - {action: Allow}\n",
    );
    p.wait_chain("node-1", &ingress_web, true);
    p.wait_chain("node-4", &format!("ingress-{dweb_if}"), true);
    p.check(
        "a GlobalNetworkPolicy",
        &[
            no("node-1-a", "node-1-web", Ping),
            no("node-3-a", "node-4-web", Ping),
            no("node-2-a", "node-4-web", Ping).v6(),
            ok("node-1-a", "node-1-web", Tcp(80)),
            ok("node-3-a", "node-4-web", Udp(80)),
            ok("node-1-a", "node-4-dns", Ping),
        ],
    );

    // 9. Bad input: refused naming the field (by bgpctl, and by bgpd itself when a client
    // sends it anyway), nothing stored, no table changed.
    let tables_before = [p.nft("node-1"), p.nft("node-4")];
    let knp = |name: &str, spec: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": name, "namespace": "prod"}, "spec": spec})
    };
    let bad = [
        (
            json!({"apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
                   "metadata": {"name": "bad-selector", "namespace": "prod"},
                   "spec": {"selector": "app == ", "ingress": [{"action": "Allow"}]}}),
            "spec.selector",
        ),
        (
            knp("bad-field", json!({"podSelector": {}, "ingres": []})),
            "spec.ingres",
        ),
        (
            knp(
                "bad-port",
                json!({"podSelector": {},
                "ingress": [{"ports": [{"protocol": "TCP", "port": 70000}]}]}),
            ),
            "spec.ingress[0].ports[0].port",
        ),
        (
            knp(
                "bad-except",
                json!({"podSelector": {}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"ipBlock": {"cidr": "172.20.0.0/16",
                                                "except": ["10.1.0.0/24"]}}]}]}),
            ),
            "spec.egress[0].to[0].ipBlock.except[0]",
        ),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (doc, path) in bad {
        let name = doc["metadata"]["name"].as_str().unwrap();
        let file = p.write_doc(name, &doc.to_string());
        let (accepted, out) = p.lab.bgpctl("node-1", &["apply", "-f", &file]);
        assert!(!accepted, "{name} was accepted: {out}");
        assert!(
            out.contains(&format!("{path}: ")),
            "{name}: no {path} in {out}"
        );
        assert!(out.contains("nothing was applied"), "{out}");
        let refused = rt.block_on(async {
            let channel = proto::client::connect_unix(&p.lab.socket("node-2"))
                .await
                .unwrap();
            PolicyClient::new(channel)
                .apply(pb::ApplyDocumentRequest {
                    json: doc.to_string(),
                })
                .await
        });
        let status = refused.expect_err(&format!("bgpd on node-2 stored {name}"));
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(path), "{name}: {status:?}");
        let stored = p.bgpctl(&["get", "networkpolicy", "-A", "-o", "json"]);
        assert!(!stored.contains(name), "{name} stored: {stored}");
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!([p.nft("node-1"), p.nft("node-4")], tables_before);
    p.delete(&gnp);
    p.wait_chain("node-1", &ingress_web, false);

    // 11. routewriter owns its table: a rule deleted by hand comes back (a restart's resync),
    // a restart with nothing changed writes nothing, other tables are left alone.
    let deny_in = p.apply("deny-ingress", &k8s_policy("deny-ingress", DENY_INGRESS));
    p.wait_chain("node-1", &ingress_web, true);
    for cmd in [
        "add table inet other",
        "add chain inet other c",
        "add rule inet other c counter",
    ] {
        let args: Vec<&str> = std::iter::once("nft").chain(cmd.split(' ')).collect();
        let (done, out) = p.lab.exec("node-1", &args);
        assert!(done, "nft {cmd}: {out}");
    }
    let (_, chain) = p.lab.exec(
        "node-1",
        &[
            "nft",
            "-a",
            "list",
            "chain",
            "inet",
            "margay-policy",
            &ingress_web,
        ],
    );
    let handle = chain
        .lines()
        .find(|l| l.contains("\"margay: default deny\""))
        .and_then(|l| l.rsplit("# handle ").next())
        .unwrap_or_else(|| panic!("no default deny in {chain}"))
        .trim()
        .to_owned();
    let (done, out) = p.lab.exec(
        "node-1",
        &[
            "nft",
            "delete",
            "rule",
            "inet",
            "margay-policy",
            &ingress_web,
            "handle",
            &handle,
        ],
    );
    assert!(done, "{out}");
    p.check(
        "the default deny deleted by hand",
        &[ok("node-1-a", "node-1-web", Tcp(80))],
    );
    p.lab.ok(&["restart", "node-1", "routewriter"]);
    p.wait_nft("node-1", "got its default deny back", |t| {
        chain_in(t, &ingress_web).is_some_and(|c| c.contains("\"margay: default deny\""))
    });
    p.check(
        "the table repaired",
        &[
            no("node-1-a", "node-1-web", Tcp(80)),
            no("node-2-a", "node-1-web", Ping),
        ],
    );
    let snapshot = || {
        [
            "inet margay-policy",
            "ip margay",
            "ip6 margay",
            "inet other",
        ]
        .map(|t| {
            let mut args = vec!["nft", "-a", "list", "table"];
            args.extend(t.split(' '));
            let (listed, out) = p.lab.exec("node-1", &args);
            assert!(listed, "table {t}: {out}");
            out
        })
    };
    let before = snapshot();
    p.lab.ok(&["restart", "node-1", "routewriter"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while p.routewriter_status("node-1")["synced"] != true {
        assert!(Instant::now() < deadline, "routewriter never synced");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        snapshot(),
        before,
        "a restart with nothing changed rewrote a table"
    );
    let s = p.routewriter_status("node-1");
    assert_eq!(s["nft_writes"], 0, "{s}");
    assert_eq!(s["policy_endpoints"], 2, "node-1-web and node-1-cli: {s}");
    assert_eq!(s["policy_error"], Value::Null, "{s}");
    let bgpctl = lab::binary("bgpctl").display().to_string();
    let (_, text) = p.lab.exec("node-1", &[&bgpctl, "routewriter"]);
    assert!(
        text.contains("policy              ") && text.contains("in force"),
        "{text}"
    );

    // 12. A deleted pod takes its endpoint and its chain with it.
    let cli1_chain = format!("ingress-{cli1_if}");
    assert!(p.nft("node-1").contains(&format!("chain {cli1_chain} {{")));
    p.lab.ok(&["pod-del", "node-1", "cli"]);
    let deadline = Instant::now() + NFT_WITHIN;
    while p
        .bgpctl(&["get", "wep", "-n", "prod", "-o", "json"])
        .contains("\"node-1-cli\"")
    {
        assert!(
            Instant::now() < deadline,
            "node-1-cli's endpoint is still listed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    p.wait_nft("node-1", "lost node-1-cli's interface", |t| {
        !t.contains(&cli1_if)
    });
    p.check("after pod-del", &[no("node-1-a", "node-1-web", Tcp(80))]);
    p.delete(&deny_in);
    p.wait_chain("node-1", &ingress_web, false);

    // 13. A write nftables refuses: another process takes the table (`flags owner`: only the
    // netlink socket that made it may change it, a real refusal, EPERM). routewriter's next
    // write is refused whole, the table stays as it was, status and metrics say so; when the
    // owner goes, routewriter's retry writes the table and the policy is in force again.
    let deny_in = p.apply("deny-ingress", &k8s_policy("deny-ingress", DENY_INGRESS));
    p.wait_chain("node-1", &ingress_web, true);
    let mut holder = Command::new("ip")
        .args(["netns", "exec", &p.lab.ns("node-1"), "nft", "-i"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nft -i");
    holder
        .stdin
        .as_mut()
        .unwrap()
        .write_all(
            b"delete table inet margay-policy\nadd table inet margay-policy { flags owner; }\n",
        )
        .unwrap();
    p.wait_nft("node-1", "was taken by another owner", |t| {
        t.contains("flags owner") && !t.contains("chain ")
    });
    let held = p.nft("node-1");
    let deny_out = p.apply("deny-egress", &k8s_policy("deny-egress", DENY_EGRESS));
    let deadline = Instant::now() + NFT_WITHIN;
    let refused = loop {
        let s = p.routewriter_status("node-1");
        if s["policy_error"].is_string() {
            break s;
        }
        assert!(Instant::now() < deadline, "no refusal reported: {s}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        refused["policy_refused"].as_u64().unwrap_or(0) >= 1,
        "{refused}"
    );
    let (_, text) = p.lab.exec("node-1", &[&bgpctl, "routewriter"]);
    assert!(text.contains("NOT IN FORCE"), "{text}");
    let (_, metrics) = p
        .lab
        .exec("node-1", &["wget", "-qO-", "http://127.0.0.1:9099/metrics"]);
    assert!(
        metrics.lines().any(|l| l.ends_with("policy_in_force 0")),
        "{metrics}"
    );
    assert_eq!(p.nft("node-1"), held, "a refused write changed the table");
    let _ = holder.kill();
    let _ = holder.wait();
    p.wait_chain("node-1", &egress_web, true);
    let deadline = Instant::now() + NFT_WITHIN;
    while !p.routewriter_status("node-1")["policy_error"].is_null() {
        assert!(Instant::now() < deadline, "the refusal is still reported");
        std::thread::sleep(Duration::from_millis(100));
    }
    p.check(
        "in force again after a refused write",
        &[
            no("node-1-a", "node-1-web", Tcp(80)),
            no("node-1-web", "node-2-a", Tcp(80)),
            ok("node-1-a", "node-2-a", Tcp(80)),
        ],
    );
    p.delete(&deny_in);
    p.delete(&deny_out);
    p.wait_chain("node-1", &ingress_web, false);
    p.wait_chain("node-1", &egress_web, false);
    println!("all scenarios in {:?}", started.elapsed());
}
