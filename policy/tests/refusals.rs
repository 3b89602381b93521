//! Every refusal the resources promise: the document is refused with the path of the field
//! that is wrong and a reason, and a good document next to it is accepted (so a refusal is
//! the field's fault, not the test's).

use policy::resource::{parse_namespace, parse_policy, parse_workload_endpoint};
use serde_json::{Value, json};

fn knp(spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": "p", "namespace": "prod"}, "spec": spec})
}

fn cnp(spec: Value) -> Value {
    json!({"apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
           "metadata": {"name": "p", "namespace": "prod"}, "spec": spec})
}

fn refused(doc: Value, path: &str, reason_has: &str) {
    let e = parse_policy(&doc).expect_err(&format!("accepted {doc}"));
    assert_eq!(e.path, path, "{e}");
    assert!(e.reason.contains(reason_has), "{e}");
    assert_eq!(e.to_string(), format!("{}: {}", e.path, e.reason));
}

fn ingress_from(peer: Value) -> Value {
    knp(json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}, peer]}]}))
}

fn ingress_port(port: Value) -> Value {
    knp(json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80}, port]}]}))
}

#[test]
fn good_documents_parse() {
    parse_policy(&ingress_from(
        json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}),
    ))
    .unwrap();
    parse_policy(&ingress_port(json!({"port": 80, "endPort": 90}))).unwrap();
    let with_meta = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": "prod", "uid": "x", "resourceVersion": "7",
                     "creationTimestamp": "2024-01-01T00:00:00Z", "generation": 2,
                     "annotations": {"a": "b"}, "labels": {"c": "d"}},
        "spec": {"podSelector": {}}});
    parse_policy(&with_meta).unwrap();
}

#[test]
fn unknown_fields_anywhere() {
    refused(
        knp(json!({"podSelector": {}, "ingres": []})),
        "spec.ingres",
        "unknown field",
    );
    refused(
        ingress_from(json!({"ipBlock": {"cidr": "10.0.0.0/8", "exept": []}})),
        "spec.ingress[0].from[1].ipBlock.exept",
        "unknown field",
    );
    refused(
        cnp(json!({"ingress": [{"action": "Allow", "source": {"selectr": "a == 'b'"}}]})),
        "spec.ingress[0].source.selectr",
        "unknown field",
    );
    let mut doc = knp(json!({"podSelector": {}}));
    doc["status"] = json!({});
    refused(doc, "status", "unknown field");
    let mut doc = knp(json!({"podSelector": {}}));
    doc["metadata"]["finalizers"] = json!([]);
    refused(doc, "metadata.finalizers", "unknown field");
    refused(
        knp(json!({"podSelector": {"matchLabel": {}}})),
        "spec.podSelector.matchLabel",
        "unknown field",
    );
}

#[test]
fn selectors_that_do_not_parse() {
    refused(
        cnp(json!({"selector": "app = 'x'"})),
        "spec.selector",
        "does not parse",
    );
    refused(
        cnp(
            json!({"egress": [{"action": "Allow", "destination": {"namespaceSelector": "has(x"}}]}),
        ),
        "spec.egress[0].destination.namespaceSelector",
        "position 5",
    );
    refused(
        knp(json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Has"}]}})),
        "spec.podSelector.matchExpressions[0].operator",
        "not an operator",
    );
    refused(
        knp(
            json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}}),
        ),
        "spec.podSelector.matchExpressions[0].values",
        "at least one",
    );
    refused(
        knp(json!({"podSelector": {"matchLabels": {"a": "it's"}}})),
        "spec.podSelector.matchLabels",
        "not a valid label",
    );
}

#[test]
fn ports_out_of_range_or_inconsistent() {
    refused(
        ingress_port(json!({"port": 0})),
        "spec.ingress[0].ports[1].port",
        "out of range",
    );
    refused(
        ingress_port(json!({"port": 65536})),
        "spec.ingress[0].ports[1].port",
        "out of range",
    );
    refused(
        ingress_port(json!({"port": 80, "endPort": 79})),
        "spec.ingress[0].ports[1].endPort",
        "below port",
    );
    refused(
        ingress_port(json!({"port": "http", "endPort": 90})),
        "spec.ingress[0].ports[1].endPort",
        "not a named one",
    );
    refused(
        ingress_port(json!({"endPort": 90})),
        "spec.ingress[0].ports[1].endPort",
        "numeric port",
    );
    refused(
        ingress_port(json!({"port": "HTTP!"})),
        "spec.ingress[0].ports[1].port",
        "port name",
    );
    refused(
        cnp(
            json!({"ingress": [{"action": "Allow", "protocol": "TCP", "destination": {"ports": ["90:80"]}}]}),
        ),
        "spec.ingress[0].destination.ports[0]",
        "ends before it starts",
    );
    refused(
        cnp(
            json!({"ingress": [{"action": "Allow", "protocol": "TCP", "destination": {"ports": [70000]}}]}),
        ),
        "spec.ingress[0].destination.ports[0]",
        "out of range",
    );
    refused(
        cnp(json!({"ingress": [{"action": "Allow", "destination": {"ports": [80]}}]})),
        "spec.ingress[0].destination.ports",
        "protocol",
    );
    refused(
        cnp(
            json!({"ingress": [{"action": "Allow", "protocol": "UDP", "destination": {"notPorts": ["dns"]}}]}),
        ),
        "spec.ingress[0].destination.notPorts[0]",
        "named ports",
    );
}

#[test]
fn bad_cidrs_and_excepts_outside_their_cidr() {
    refused(
        ingress_from(json!({"ipBlock": {"cidr": "10.0.0.0/33"}})),
        "spec.ingress[0].from[1].ipBlock.cidr",
        "not a CIDR",
    );
    refused(
        ingress_from(
            json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24", "10.1.0.0/24"]}}),
        ),
        "spec.ingress[0].from[1].ipBlock.except[1]",
        "not inside",
    );
    refused(
        ingress_from(json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/16"]}})),
        "spec.ingress[0].from[1].ipBlock.except[0]",
        "not inside",
    );
    refused(
        ingress_from(json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["fd00::/64"]}})),
        "spec.ingress[0].from[1].ipBlock.except[0]",
        "not inside",
    );
    refused(
        cnp(json!({"egress": [{"action": "Allow", "destination": {"nets": ["nope"]}}]})),
        "spec.egress[0].destination.nets[0]",
        "not a CIDR",
    );
    refused(
        ingress_from(json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}})),
        "spec.ingress[0].from[1]",
        "cannot be combined",
    );
    refused(
        ingress_from(json!({})),
        "spec.ingress[0].from[1]",
        "needs podSelector",
    );
}

#[test]
fn unknown_actions_and_protocols() {
    refused(
        cnp(json!({"ingress": [{"action": "Accept"}]})),
        "spec.ingress[0].action",
        "not an action",
    );
    refused(
        cnp(json!({"ingress": [{"action": "Allow", "protocol": "GRE"}]})),
        "spec.ingress[0].protocol",
        "not a protocol",
    );
    refused(
        cnp(json!({"ingress": [{"action": "Allow", "notProtocol": 0}]})),
        "spec.ingress[0].notProtocol",
        "out of range",
    );
    refused(
        ingress_port(json!({"protocol": "ICMP"})),
        "spec.ingress[0].ports[1].protocol",
        "TCP, UDP or SCTP",
    );
    refused(
        cnp(json!({"ingress": [{"action": "Allow", "protocol": "TCP", "icmp": {"type": 8}}]})),
        "spec.ingress[0].icmp",
        "ICMP",
    );
    refused(
        cnp(json!({"ingress": [{"action": "Allow", "protocol": "ICMP", "icmp": {"type": 255}}]})),
        "spec.ingress[0].icmp.type",
        "out of range",
    );
    refused(
        cnp(json!({"ingress": [{"action": "Allow", "protocol": "ICMP", "ipVersion": 6}]})),
        "spec.ingress[0].ipVersion",
        "disagrees",
    );
}

#[test]
fn missing_required_fields_and_wrong_kinds() {
    refused(knp(json!({})), "spec.podSelector", "is required");
    refused(
        cnp(json!({"ingress": [{"protocol": "TCP"}]})),
        "spec.ingress[0].action",
        "is required",
    );
    refused(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": {"namespace": "x"}, "spec": {"podSelector": {}}}),
        "metadata.name",
        "is required",
    );
    refused(
        json!({"kind": "NetworkPolicy"}),
        "apiVersion",
        "is required",
    );
    refused(
        json!({"apiVersion": "v2", "kind": "NetworkPolicy"}),
        "apiVersion",
        "not an API",
    );
    refused(
        json!({"apiVersion": "projectcalico.org/v3", "kind": "IPPool"}),
        "kind",
        "not a kind",
    );
    refused(
        json!({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
               "metadata": {"name": "g", "namespace": "prod"}, "spec": {}}),
        "metadata.namespace",
        "not namespaced",
    );
    refused(
        cnp(json!({"namespaceSelector": "all()"})),
        "spec.namespaceSelector",
        "GlobalNetworkPolicy",
    );
    refused(
        cnp(json!({"types": ["Ingress"], "egress": [{"action": "Allow"}]})),
        "spec.egress",
        "types leaves out Egress",
    );
    refused(
        knp(json!({"podSelector": {}, "policyTypes": ["Both"]})),
        "spec.policyTypes[0]",
        "not a policy type",
    );
    refused(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": {"name": "Bad_Name"}, "spec": {"podSelector": {}}}),
        "metadata.name",
        "not a valid name",
    );
}

#[test]
fn namespaces_and_endpoints() {
    let ns = parse_namespace(&json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "prod", "labels": {"env": "prod", "kubernetes.io/metadata.name": "prod"}},
        "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})).unwrap();
    assert_eq!(
        ns.labels.len(),
        1,
        "the implicit label is not stored: {ns:?}"
    );
    assert_eq!(ns.effective_labels()["kubernetes.io/metadata.name"], "prod");
    assert_eq!(ns.effective_labels()["projectcalico.org/name"], "prod");
    let e = parse_namespace(&json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "prod"}, "spec": {"owner": "me"}}))
    .unwrap_err();
    assert_eq!(e.path, "spec.owner");

    let wep = policy::WorkloadEndpoint {
        namespace: "prod".into(),
        name: "n1-k8s-web-eth0".into(),
        pod: "web".into(),
        node: "n1".into(),
        interface: "cali0123".into(),
        addresses: vec!["10.0.0.5/32".parse().unwrap()],
        labels: [("app".to_string(), "web".to_string())].into(),
        service_account: Some("sa".into()),
        ports: vec![policy::NamedPort {
            name: "http".into(),
            protocol: policy::Protocol::Tcp,
            port: 8080,
        }],
    };
    let doc = wep.to_document();
    assert_eq!(parse_workload_endpoint(&doc).unwrap(), wep, "{doc:#}");
    let stored = serde_json::to_value(&wep).unwrap();
    assert_eq!(stored["ports"][0]["protocol"], "TCP");
    assert_eq!(
        serde_json::from_value::<policy::WorkloadEndpoint>(stored).unwrap(),
        wep
    );
    let mut bad = doc.clone();
    bad["spec"]["ports"][0]["port"] = json!(0);
    assert_eq!(
        parse_workload_endpoint(&bad).unwrap_err().path,
        "spec.ports[0].port"
    );
}
