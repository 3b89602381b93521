//! The seed examples of issue 37, as clusters: every case checks traffic that must pass and
//! traffic that must not, through the compiled form and the reference model (which must
//! agree), and a few properties of the compiled form itself (sets, names, explain).

mod common;

use common::{allows, ep, ip, ns, policies};
use policy::compile::{Cluster, compile};
use policy::evaluate::Packet;
use policy::explain::explain;
use policy::resource::{NamedPort, Protocol};
use serde_json::json;

fn knp(name: &str, ns: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn cnp(name: &str, ns: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn gnp(name: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
           "metadata": {"name": name}, "spec": spec})
}

/// prod/a and prod/b on two nodes, dev/c, kube-system/dns.
fn pods() -> Vec<policy::WorkloadEndpoint> {
    vec![
        ep("prod", "a", "n1", "10.0.1.1", &[("app", "web")]),
        ep("prod", "b", "n2", "10.0.2.1", &[("app", "db")]),
        ep(
            "dev",
            "c",
            "n1",
            "10.0.1.2",
            &[("app", "web"), ("role", "api")],
        ),
        ep(
            "kube-system",
            "dns",
            "n2",
            "10.0.2.2",
            &[("k8s-app", "kube-dns")],
        ),
    ]
}

fn namespaces() -> Vec<policy::Namespace> {
    vec![
        ns("prod", &[("env", "prod")]),
        ns("dev", &[("env", "dev")]),
        ns("kube-system", &[]),
    ]
}

#[test]
fn default_deny_ingress_in_one_namespace() {
    let p = policies(&[knp(
        "deny",
        "prod",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    )]);
    let (eps, nss) = (pods(), namespaces());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.1.2"), ip("10.0.1.1"), 80)),
        "dev -> prod"
    );
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.1.1"), ip("10.0.2.1"), 80)),
        "prod -> prod, across nodes"
    );
    assert!(
        !allows(&c, &Packet::ping(ip("192.0.2.1"), ip("10.0.2.1"))),
        "outside -> prod"
    );
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.1.1"), ip("10.0.1.2"), 80)),
        "prod -> dev"
    );
    assert!(
        allows(&c, &Packet::udp(ip("10.0.1.2"), ip("10.0.2.2"), 53)),
        "dev -> dns"
    );
    let np = compile(&c, "n1");
    assert_eq!(np.endpoints["cali-a"].ingress, Some(vec![]));
    assert_eq!(np.endpoints["cali-a"].egress, None);
    assert_eq!(np.endpoints["cali-c"].ingress, None);
    assert!(!np.endpoints.contains_key("cali-b"), "b is n2's");
}

#[test]
fn default_deny_egress_in_one_namespace() {
    let p = policies(&[knp(
        "deny",
        "prod",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    )]);
    let (eps, nss) = (pods(), namespaces());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.1.1"), ip("10.0.1.2"), 80)),
        "prod -> dev"
    );
    assert!(
        !allows(&c, &Packet::udp(ip("10.0.2.1"), ip("10.0.2.2"), 53)),
        "prod -> dns"
    );
    assert!(
        !allows(&c, &Packet::ping(ip("10.0.1.1"), ip("198.51.100.1"))),
        "prod -> outside"
    );
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.1.2"), ip("10.0.1.1"), 80)),
        "dev -> prod"
    );
}

#[test]
fn allow_dns_only() {
    let p = policies(&[knp(
        "dns-only",
        "prod",
        json!({
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
            }]
        }),
    )]);
    let (eps, nss) = (pods(), namespaces());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    let (a, dns, dev) = (ip("10.0.1.1"), ip("10.0.2.2"), ip("10.0.1.2"));
    assert!(allows(&c, &Packet::udp(a, dns, 53)));
    assert!(allows(&c, &Packet::tcp(a, dns, 53)));
    assert!(!allows(&c, &Packet::tcp(a, dns, 80)));
    assert!(!allows(&c, &Packet::ping(a, dns)));
    assert!(
        !allows(&c, &Packet::udp(a, dev, 53)),
        "53, but not kube-system"
    );
    assert!(
        !allows(&c, &Packet::udp(a, ip("8.8.8.8"), 53)),
        "53, but outside the cluster"
    );
    let np = compile(&c, "n1");
    let rules = np.endpoints["cali-a"].egress.as_ref().unwrap();
    assert_eq!(rules.len(), 2, "one rule per protocol: {rules:?}");
    assert_eq!(
        rules[0].dst.set, rules[1].dst.set,
        "one peer selection, one set"
    );
    let set = &np.sets[rules[0].dst.set.as_ref().unwrap()];
    assert_eq!(set.v4, vec!["10.0.2.2/32".parse().unwrap()]);
}

#[test]
fn allow_from_pods_with_a_label() {
    let p = policies(&[knp(
        "db-from-api",
        "prod",
        json!({
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"from": [
                {"podSelector": {"matchLabels": {"app": "web"}}},
                {"namespaceSelector": {"matchLabels": {"env": "dev"}},
                 "podSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["api"]}]}}
            ]}]
        }),
    )]);
    let mut eps = pods();
    eps.push(ep("dev", "d", "n2", "10.0.2.3", &[("app", "web")]));
    let nss = namespaces();
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    let db = ip("10.0.2.1");
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.1.1"), db, 5432)),
        "prod app=web"
    );
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.1.2"), db, 5432)),
        "dev role=api"
    );
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.2.3"), db, 5432)),
        "dev app=web without role: AND within a peer"
    );
    assert!(!allows(&c, &Packet::tcp(ip("10.0.2.2"), db, 5432)), "dns");
    assert!(
        allows(&c, &Packet::tcp(db, ip("10.0.1.1"), 80)),
        "db's egress is open"
    );
}

#[test]
fn label_change_opens_and_closes_a_flow() {
    let p = policies(&[knp(
        "db-from-web",
        "prod",
        json!({"podSelector": {"matchLabels": {"app": "db"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
    )]);
    let mut eps = pods();
    let nss = namespaces();
    let pkt = Packet::tcp(ip("10.0.1.1"), ip("10.0.2.1"), 5432);
    let before = compile(
        &Cluster {
            policies: &p,
            endpoints: &eps,
            namespaces: &nss,
        },
        "n2",
    );
    assert!(allows(
        &Cluster {
            policies: &p,
            endpoints: &eps,
            namespaces: &nss
        },
        &pkt
    ));
    eps[0].labels.insert("app".into(), "batch".into());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    assert!(!allows(&c, &pkt));
    let after = compile(&c, "n2");
    // Only the set's members changed: same rules, same set name.
    assert_eq!(before.endpoints, after.endpoints);
    assert_eq!(
        before.sets.keys().collect::<Vec<_>>(),
        after.sets.keys().collect::<Vec<_>>()
    );
    assert_ne!(before.sets, after.sets);
}

#[test]
fn ip_block_with_except() {
    let p = policies(&[knp(
        "from-block",
        "prod",
        json!({"podSelector": {"matchLabels": {"app": "db"}},
               "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}],
                            "ports": [{"port": 5432}]}]}),
    )]);
    let (eps, nss) = (pods(), namespaces());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    let db = ip("10.0.2.1");
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.7.9"), db, 5432)),
        "outside address in the block"
    );
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.2.2"), db, 5432)),
        "a pod's address in the block"
    );
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.1.1"), db, 5432)),
        "in except"
    );
    assert!(
        !allows(&c, &Packet::tcp(ip("10.1.0.1"), db, 5432)),
        "outside the block"
    );
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.7.9"), db, 80)),
        "other port"
    );
    assert!(
        !allows(&c, &Packet::udp(ip("10.0.7.9"), db, 5432)),
        "TCP by default"
    );
    let np = compile(&c, "n2");
    let rule = &np.endpoints["cali-b"].ingress.as_ref().unwrap()[0];
    let set = &np.sets[rule.src.set.as_ref().unwrap()];
    let text: Vec<String> = set.v4.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "10.0.0.0/24",
            "10.0.2.0/23",
            "10.0.4.0/22",
            "10.0.8.0/21",
            "10.0.16.0/20",
            "10.0.32.0/19",
            "10.0.64.0/18",
            "10.0.128.0/17"
        ]
    );
}

#[test]
fn calico_deny_with_lower_order_beats_an_allow() {
    let p = policies(&[
        knp(
            "web-open",
            "prod",
            json!({"podSelector": {}, "ingress": [{}]}),
        ),
        cnp(
            "no-dev",
            "prod",
            json!({
                "order": 100,
                "selector": "app == 'web'",
                "ingress": [{"action": "Deny", "source": {"namespaceSelector": "env == 'dev'"}}]
            }),
        ),
        gnp(
            "no-ssh",
            json!({
                "order": 10,
                "ingress": [{"action": "Deny", "protocol": "TCP", "destination": {"ports": [22]}}]
            }),
        ),
    ]);
    let (eps, nss) = (pods(), namespaces());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    let web = ip("10.0.1.1");
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.1.2"), web, 80)),
        "dev denied first"
    );
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.2.2"), web, 80)),
        "kube-system allowed by k8s"
    );
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.2.2"), web, 22)),
        "global ssh deny first"
    );
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.2.2"), ip("10.0.2.1"), 80)),
        "db: only k8s policy"
    );
    // The GNP selects everything for ingress: dev's pod is now default-deny except ssh deny.
    assert!(
        !allows(&c, &Packet::tcp(web, ip("10.0.1.2"), 80)),
        "dev: selected by the GNP only"
    );
    let np = compile(&c, "n1");
    let order: Vec<String> = np.endpoints["cali-a"]
        .ingress
        .as_ref()
        .unwrap()
        .iter()
        .map(|r| r.origin.policy.to_string())
        .collect();
    assert_eq!(
        order,
        [
            "globalnetworkpolicy/no-ssh",
            "networkpolicy/prod/no-dev",
            "k8s-networkpolicy/prod/web-open"
        ]
    );
}

#[test]
fn pass_ends_the_tier_and_log_goes_on() {
    let p = policies(&[
        cnp(
            "trusted",
            "prod",
            json!({"order": 50, "ingress": [
                {"action": "Log"},
                {"action": "Pass", "source": {"selector": "app == 'db'"}}
            ]}),
        ),
        cnp(
            "deny-rest",
            "prod",
            json!({"order": 100, "ingress": [{"action": "Deny"}]}),
        ),
    ]);
    let (eps, nss) = (pods(), namespaces());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    assert!(
        allows(&c, &Packet::tcp(ip("10.0.2.1"), ip("10.0.1.1"), 80)),
        "passed: the profile allows"
    );
    assert!(
        !allows(&c, &Packet::tcp(ip("10.0.1.2"), ip("10.0.1.1"), 80)),
        "logged, then denied"
    );
}

#[test]
fn named_ports_resolve_locally_for_ingress_and_split_for_egress() {
    let p = policies(&[
        knp(
            "to-http",
            "prod",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"ports": [{"port": "http"}]}]}),
        ),
        knp(
            "out-http",
            "dev",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"port": "http"}, {"port": 9999}]}]}),
        ),
    ]);
    let mut eps = pods();
    let http = |port| NamedPort {
        name: "http".into(),
        protocol: Protocol::Tcp,
        port,
    };
    eps[1].ports = vec![http(8080)];
    eps[0].ports = vec![
        http(8081),
        NamedPort {
            name: "http".into(),
            protocol: Protocol::Udp,
            port: 7,
        },
    ];
    let nss = namespaces();
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    let (a, b, dev) = (ip("10.0.1.1"), ip("10.0.2.1"), ip("10.0.1.2"));
    assert!(allows(&c, &Packet::tcp(a, b, 8080)), "b's http");
    assert!(!allows(&c, &Packet::tcp(a, b, 8081)), "a's http, not b's");
    assert!(allows(&c, &Packet::tcp(dev, b, 8080)), "egress to b's http");
    assert!(allows(&c, &Packet::tcp(dev, a, 8081)), "egress to a's http");
    assert!(
        !allows(&c, &Packet::tcp(dev, a, 8080)),
        "8080 is b's http, not a's"
    );
    assert!(
        !allows(&c, &Packet::udp(dev, a, 7)),
        "a's udp port named http: the rule is TCP"
    );
    assert!(
        allows(&c, &Packet::tcp(dev, ip("192.0.2.9"), 9999)),
        "the numeric port stays open"
    );
    assert!(
        !allows(&c, &Packet::tcp(dev, ip("192.0.2.9"), 8080)),
        "a named port is a pod's"
    );
    let np = compile(&c, "n1");
    let egress = np.endpoints["cali-c"].egress.as_ref().unwrap();
    assert_eq!(
        egress.len(),
        3,
        "9999, then http = 8080 and http = 8081: {egress:?}"
    );
}

#[test]
fn set_names_are_stable_shared_and_valid_nft_identifiers() {
    let p = policies(&[
        knp(
            "one",
            "prod",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
        ),
        cnp(
            "two",
            "prod",
            json!({"ingress": [{"action": "Allow", "source": {"selector": "app == 'web'"}}]}),
        ),
    ]);
    let (eps, nss) = (pods(), namespaces());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    let np = compile(&c, "n2");
    assert_eq!(
        np.sets.len(),
        1,
        "the same selection, written two ways: {:?}",
        np.sets
    );
    for name in np.sets.keys() {
        assert!(
            name.0.len() <= 31
                && name
                    .0
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-'),
            "{name}"
        );
    }
    // Membership changes do not rename; another node names it the same.
    let name = np.sets.keys().next().unwrap().clone();
    let fewer: Vec<_> = eps.iter().filter(|e| e.name != "a").cloned().collect();
    let again = compile(
        &Cluster {
            policies: &p,
            endpoints: &fewer,
            namespaces: &nss,
        },
        "n2",
    );
    assert!(again.sets.contains_key(&name));
    assert!(again.sets[&name].is_empty());
    assert!(compile(&c, "n1").sets.contains_key(&name));
}

#[test]
fn explain_lists_policies_in_order_and_rules_as_lines() {
    let p = policies(&[
        knp(
            "dns-only",
            "prod",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
                        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]}),
        ),
        cnp(
            "deny-dev",
            "prod",
            json!({"order": 10, "types": ["Egress"],
            "egress": [{"action": "Deny", "destination": {"namespaceSelector": "env == 'dev'"}}]}),
        ),
    ]);
    let (eps, nss) = (pods(), namespaces());
    let c = Cluster {
        policies: &p,
        endpoints: &eps,
        namespaces: &nss,
    };
    let e = explain(&c, "prod", "a").expect("a exists");
    assert_eq!(e.ingress.default, "allow: no policy selects it");
    assert_eq!(e.egress.default, "deny: selected by 2 policies");
    let ids: Vec<String> = e.egress.policies.iter().map(|p| p.id.to_string()).collect();
    assert_eq!(
        ids,
        [
            "networkpolicy/prod/deny-dev",
            "k8s-networkpolicy/prod/dns-only"
        ]
    );
    assert_eq!(
        e.egress.policies[1].rules,
        [
            "[0] allow udp dport 53 to namespace kube-system (ns selector kubernetes.io/metadata.name == 'kube-system') (1 endpoint); allow tcp dport 53 to namespace kube-system (ns selector kubernetes.io/metadata.name == 'kube-system') (1 endpoint)"
        ]
    );
    assert_eq!(
        e.egress.policies[0].rules,
        ["[0] deny all protocols to namespaces matching env == 'dev' (1 endpoint)"]
    );
    let text = e.to_string();
    assert!(
        text.starts_with("endpoint prod/a (pod a, node n1, interface cali-a, 10.0.1.1/32)\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "egress: deny: selected by 2 policies\n  networkpolicy/prod/deny-dev (order 10)\n"
        ),
        "{text}"
    );
    assert!(explain(&c, "prod", "nobody").is_none());
}
