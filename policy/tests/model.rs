//! Property test: on random small clusters (two namespaces, a few pods on two nodes,
//! labels from a tiny alphabet, Kubernetes and Calico policies with Deny / Pass / Log and
//! orders, ipBlocks with except, named ports) the compiled per-node verdicts equal the
//! reference model's for random packets. The policies are generated as the documents users
//! write, so the parser is exercised too.
//!
//! The cluster is built from a tape of random numbers (each choice takes the next one), so
//! proptest shrinks towards small tapes and first choices.

mod common;

use common::{allows, ns};
use policy::compile::Cluster;
use policy::evaluate::Packet;
use policy::resource::{NamedPort, Policy, Protocol, WorkloadEndpoint, parse_policy};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::net::IpAddr;

struct Tape<'a> {
    values: &'a [u32],
    at: usize,
}

impl Tape<'_> {
    fn pick(&mut self, n: usize) -> usize {
        let v = self.values.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        v as usize % n
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.pick(100) < percent
    }
    fn one<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.pick(items.len())].clone()
    }
}

const NAMESPACES: [&str; 2] = ["ns-a", "ns-b"];
const APPS: [&str; 2] = ["web", "db"];

fn endpoints(t: &mut Tape) -> Vec<WorkloadEndpoint> {
    let count = 2 + t.pick(4);
    (0..count)
        .map(|i| {
            let mut labels = std::collections::BTreeMap::new();
            if t.chance(80) {
                labels.insert("app".to_string(), t.one(&APPS).to_string());
            }
            if t.chance(50) {
                labels.insert("tier".to_string(), t.one(&["1", "2"]).to_string());
            }
            let mut addresses = vec![format!("10.0.0.{}/32", i + 1).parse().unwrap()];
            if t.chance(30) {
                addresses.push(format!("fd00::{}/128", i + 1).parse().unwrap());
            }
            let mut ports = Vec::new();
            if t.chance(50) {
                ports.push(NamedPort {
                    name: "http".into(),
                    protocol: t.one(&[Protocol::Tcp, Protocol::Tcp, Protocol::Udp]),
                    port: t.one(&[80, 8080]),
                });
            }
            WorkloadEndpoint {
                namespace: t.one(&NAMESPACES).into(),
                name: format!("pod{i}"),
                pod: format!("pod{i}"),
                node: t.one(&["n1", "n2"]).into(),
                interface: format!("cali{i}"),
                addresses,
                labels,
                service_account: None,
                ports,
            }
        })
        .collect()
}

fn label_selector(t: &mut Tape) -> Value {
    match t.pick(5) {
        0 | 1 => json!({}),
        2 => json!({"matchLabels": {"app": t.one(&APPS)}}),
        3 => {
            json!({"matchExpressions": [{"key": "tier", "operator": t.one(&["Exists", "DoesNotExist"])}]})
        }
        _ => {
            json!({"matchExpressions": [{"key": "app", "operator": t.one(&["In", "NotIn"]), "values": [t.one(&APPS)]}]})
        }
    }
}

fn calico_selector(t: &mut Tape) -> &'static str {
    t.one(&[
        "all()",
        "app == 'web'",
        "app != 'db'",
        "has(tier)",
        "!has(tier)",
        "app in {'web', 'db'} && tier == '1'",
        "app starts with 'w' || tier ends with '2'",
        "app contains 'e'",
    ])
}

fn k8s_policy(t: &mut Tape, name: String) -> Value {
    let rule = |t: &mut Tape, ingress: bool| {
        let mut r = json!({});
        if t.chance(60) {
            let peers: Vec<Value> = (0..1 + t.pick(2))
                .map(|_| match t.pick(4) {
                    0 => json!({"podSelector": label_selector(t)}),
                    1 => json!({"namespaceSelector": {"matchLabels": {"team": t.one(&["x", "y"])}}}),
                    2 => json!({"podSelector": label_selector(t), "namespaceSelector": {}}),
                    _ => json!({"ipBlock": {"cidr": "10.0.0.0/29", "except": [t.one(&["10.0.0.4/30", "10.0.0.2/32"])]}}),
                })
                .collect();
            r[if ingress { "from" } else { "to" }] = json!(peers);
        }
        if t.chance(60) {
            let ports: Vec<Value> = (0..1 + t.pick(2))
                .map(|_| {
                    let mut p = json!({"protocol": t.one(&["TCP", "UDP"])});
                    match t.pick(4) {
                        0 => p["port"] = json!("http"),
                        1 => {
                            p["port"] = json!(53);
                            p["endPort"] = json!(80);
                        }
                        2 => {}
                        _ => p["port"] = json!(t.one(&[80, 8080, 53])),
                    }
                    p
                })
                .collect();
            r["ports"] = json!(ports);
        }
        r
    };
    let mut spec = json!({"podSelector": label_selector(t)});
    let ingress: Vec<Value> = (0..t.pick(3)).map(|_| rule(t, true)).collect();
    let egress: Vec<Value> = (0..t.pick(3)).map(|_| rule(t, false)).collect();
    spec["ingress"] = json!(ingress);
    spec["egress"] = json!(egress);
    match t.pick(4) {
        0 => spec["policyTypes"] = json!(["Ingress"]),
        1 => spec["policyTypes"] = json!(["Egress"]),
        2 => spec["policyTypes"] = json!(["Ingress", "Egress"]),
        _ => {}
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": t.one(&NAMESPACES)}, "spec": spec})
}

fn calico_policy(t: &mut Tape, name: String) -> Value {
    let global = t.chance(40);
    let entity = |t: &mut Tape, ports_ok: bool| {
        let mut e = json!({});
        if t.chance(40) {
            e["selector"] = json!(calico_selector(t));
        }
        if t.chance(20) {
            e["notSelector"] = json!(calico_selector(t));
        }
        if t.chance(20) {
            e["namespaceSelector"] = json!(t.one(&["team == 'x'", "all()", "global()"]));
        }
        if t.chance(20) {
            e["nets"] =
                json!([t.one(&["10.0.0.0/30", "10.0.0.0/8", "fd00::/120", "192.0.2.0/24"])]);
        }
        if t.chance(15) {
            e["notNets"] = json!([t.one(&["10.0.0.2/31", "10.0.0.5/32"])]);
        }
        if ports_ok && t.chance(50) {
            e["ports"] = json!([t.one(&[json!(80), json!("50:60"), json!("http"), json!(8080)])]);
        }
        if ports_ok && t.chance(15) {
            e["notPorts"] = json!([t.one(&[80, 53])]);
        }
        e
    };
    let rule = |t: &mut Tape| {
        let mut r = json!({"action": t.one(&["Allow", "Allow", "Deny", "Pass", "Log"])});
        let protocol = t.pick(5);
        match protocol {
            0 => r["protocol"] = json!("TCP"),
            1 => r["protocol"] = json!("UDP"),
            2 => {
                r["protocol"] = json!("ICMP");
                if t.chance(50) {
                    r["icmp"] = json!({"type": 8});
                }
            }
            3 if t.chance(50) => r["notProtocol"] = json!("UDP"),
            _ => {}
        }
        if t.chance(10) {
            r["ipVersion"] = json!(4);
            r.as_object_mut().unwrap().remove("protocol");
            r.as_object_mut().unwrap().remove("icmp");
        }
        let ports_ok = protocol < 2 && r.get("protocol").is_some();
        if t.chance(70) {
            let source_ports = ports_ok && t.chance(30);
            r["source"] = entity(t, source_ports);
        }
        if t.chance(70) {
            r["destination"] = entity(t, ports_ok);
        }
        if r.get("ipVersion").is_some() || r.get("protocol") == Some(&json!("ICMP")) {
            // Calico refuses v6 nets in an IPv4 rule; keep the generator to valid documents.
            for side in ["source", "destination"] {
                if let Some(nets) = r.get_mut(side).and_then(|s| s.get_mut("nets"))
                    && nets[0].as_str().is_some_and(|n| n.contains(':'))
                {
                    *nets = json!(["10.0.0.0/8"]);
                }
            }
        }
        r
    };
    let mut spec = json!({});
    if t.chance(80) {
        spec["order"] = json!(t.one(&[10.0, 100.0, 1000.0, 2000.0]));
    }
    if t.chance(60) {
        spec["selector"] = json!(calico_selector(t));
    }
    if global && t.chance(40) {
        spec["namespaceSelector"] = json!(t.one(&["team == 'x'", "has(team)"]));
    }
    let ingress: Vec<Value> = (0..t.pick(4)).map(|_| rule(t)).collect();
    let egress: Vec<Value> = (0..t.pick(4)).map(|_| rule(t)).collect();
    if !ingress.is_empty() {
        spec["ingress"] = json!(ingress);
    }
    if !egress.is_empty() {
        spec["egress"] = json!(egress);
    }
    if t.chance(30) {
        spec["types"] = json!(["Ingress", "Egress"]);
    }
    if global {
        json!({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
               "metadata": {"name": name}, "spec": spec})
    } else {
        json!({"apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
               "metadata": {"name": name, "namespace": t.one(&NAMESPACES)}, "spec": spec})
    }
}

fn packet(t: &mut Tape, eps: &[WorkloadEndpoint]) -> Packet {
    let v6 = t.chance(15);
    let mut addrs: Vec<IpAddr> = eps
        .iter()
        .flat_map(|e| e.addresses.iter().map(|a| a.addr()))
        .filter(|a| a.is_ipv6() == v6)
        .collect();
    addrs.push(if v6 {
        "fd00::99".parse().unwrap()
    } else {
        "10.0.0.6".parse().unwrap()
    });
    addrs.push(if v6 {
        "2001:db8::1".parse().unwrap()
    } else {
        "192.0.2.7".parse().unwrap()
    });
    let src = t.one(&addrs);
    let dst = t.one(&addrs);
    match t.pick(4) {
        0 => Packet::ping(src, dst),
        p => {
            let protocol = if p == 1 { Protocol::Udp } else { Protocol::Tcp };
            Packet::ports(
                protocol,
                src,
                dst,
                t.one(&[1000, 53, 80]),
                t.one(&[53, 55, 80, 8080, 9999]),
            )
        }
    }
}

fn check(values: &[u32]) -> Result<(), TestCaseError> {
    let mut t = Tape { values, at: 0 };
    let eps = endpoints(&mut t);
    let namespaces = vec![ns("ns-a", &[("team", "x")]), ns("ns-b", &[("team", "y")])];
    let mut policies: Vec<Policy> = Vec::new();
    for i in 0..t.pick(5) {
        let doc = if t.chance(50) {
            k8s_policy(&mut t, format!("k{i}"))
        } else {
            calico_policy(&mut t, format!("c{i}"))
        };
        let parsed =
            parse_policy(&doc).map_err(|e| TestCaseError::fail(format!("{e}\n{doc:#}")))?;
        policies.push(parsed);
    }
    let c = Cluster {
        policies: &policies,
        endpoints: &eps,
        namespaces: &namespaces,
    };
    for _ in 0..40 {
        let pkt = packet(&mut t, &eps);
        // `allows` asserts the two models agree.
        allows(&c, &pkt);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn compiled_verdicts_equal_the_reference(values in prop::collection::vec(any::<u32>(), 0..600)) {
        check(&values)?;
    }
}

/// The property is not vacuous: over many clusters both verdicts occur, and policies of
/// every action decide some packets.
#[test]
fn generated_clusters_allow_and_deny() {
    let (mut allowed, mut denied) = (0, 0);
    let mut rng = 0x1234_5678u32;
    for _ in 0..200 {
        let values: Vec<u32> = (0..600)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 17;
                rng ^= rng << 5;
                rng
            })
            .collect();
        let mut t = Tape {
            values: &values,
            at: 0,
        };
        let eps = endpoints(&mut t);
        let namespaces = vec![ns("ns-a", &[("team", "x")]), ns("ns-b", &[("team", "y")])];
        let policies: Vec<Policy> = (0..1 + t.pick(4))
            .map(|i| {
                let doc = if t.chance(50) {
                    k8s_policy(&mut t, format!("k{i}"))
                } else {
                    calico_policy(&mut t, format!("c{i}"))
                };
                parse_policy(&doc).unwrap()
            })
            .collect();
        let c = Cluster {
            policies: &policies,
            endpoints: &eps,
            namespaces: &namespaces,
        };
        for _ in 0..40 {
            if allows(&c, &packet(&mut t, &eps)) {
                allowed += 1;
            } else {
                denied += 1;
            }
        }
    }
    assert!(
        allowed > 1000 && denied > 1000,
        "allowed {allowed}, denied {denied}"
    );
}
