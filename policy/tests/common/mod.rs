//! Helpers the policy tests share: endpoints from a few words, and the verdict of the
//! compiled form (each end's node compiled, as the renderer would) held to the reference.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use policy::compile::{Cluster, compile};
use policy::evaluate::{Packet, Verdict, verdict};
use policy::reference;
use policy::resource::{Direction, NamedPort, Namespace, Policy, WorkloadEndpoint, parse_policy};

pub fn ep(ns: &str, name: &str, node: &str, ip: &str, labels: &[(&str, &str)]) -> WorkloadEndpoint {
    let addr: IpAddr = ip.parse().unwrap();
    WorkloadEndpoint {
        namespace: ns.into(),
        name: name.into(),
        pod: name.into(),
        node: node.into(),
        interface: format!("cali-{name}"),
        addresses: vec![addr.into()],
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        service_account: None,
        ports: Vec::<NamedPort>::new(),
    }
}

pub fn ns(name: &str, labels: &[(&str, &str)]) -> Namespace {
    Namespace {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    }
}

pub fn policies(docs: &[serde_json::Value]) -> Vec<Policy> {
    docs.iter()
        .map(|d| parse_policy(d).unwrap_or_else(|e| panic!("{e}\n{d:#}")))
        .collect()
}

/// The compiled verdict: the source's node's egress, then the destination's node's ingress.
pub fn compiled_allows(cluster: &Cluster, pkt: &Packet) -> bool {
    let owner = |a: IpAddr| cluster.endpoints.iter().find(|e| e.owns(a));
    let pass = |a: IpAddr, dir| {
        owner(a).is_none_or(|e| {
            let np = compile(cluster, &e.node);
            verdict(&np, &e.interface, dir, pkt) == Verdict::Allow
        })
    };
    pass(pkt.src, Direction::Egress) && pass(pkt.dst, Direction::Ingress)
}

/// Both models' verdict, which must agree.
pub fn allows(cluster: &Cluster, pkt: &Packet) -> bool {
    let compiled = compiled_allows(cluster, pkt);
    let reference = reference::allowed(cluster, pkt);
    assert_eq!(
        compiled, reference,
        "compiled and reference disagree on {pkt:?}"
    );
    compiled
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
