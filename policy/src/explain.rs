//! Why an endpoint's packets pass or drop, for operators (`bgpctl show policy POD`): per
//! direction, the policies that select the endpoint in evaluation order, each rule as one
//! readable line, and what happens when no rule decides. Read from the resources, as the
//! user wrote them; the compiled form is the renderer's business.

use std::fmt;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::compile::Cluster;
use crate::resource::{
    Direction, EndpointSelection, EntityRule, NamespaceMatch, Peer, Policy, PolicyId, PolicyRule,
    PortSpec,
};
use crate::selector::Selector;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub namespace: String,
    pub name: String,
    pub pod: String,
    pub node: String,
    pub interface: String,
    pub addresses: Vec<IpNet>,
    pub ingress: DirectionExplanation,
    pub egress: DirectionExplanation,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirectionExplanation {
    pub direction: Direction,
    /// The selecting policies, in evaluation order.
    pub policies: Vec<PolicyExplanation>,
    /// What happens when no rule decides: `deny: selected by 2 policies` or `allow: no
    /// policy selects it`.
    pub default: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyExplanation {
    pub id: PolicyId,
    pub order: f64,
    /// One line per user rule (its index first).
    pub rules: Vec<String>,
}

/// Explains endpoint `namespace/endpoint_name` (its WorkloadEndpoint name or its pod's
/// name); `None` if there is no such endpoint.
pub fn explain(cluster: &Cluster, namespace: &str, endpoint_name: &str) -> Option<Explanation> {
    let ep = cluster
        .endpoints
        .iter()
        .find(|e| e.namespace == namespace && e.name == endpoint_name)
        .or_else(|| {
            cluster
                .endpoints
                .iter()
                .find(|e| e.namespace == namespace && e.pod == endpoint_name)
        })?;
    let mut policies: Vec<&Policy> = cluster
        .policies
        .iter()
        .filter(|p| p.subject.matches_in(ep, cluster.namespaces))
        .collect();
    policies.sort_by(|a, b| Policy::evaluation_order(a, b));
    let direction = |dir: Direction| {
        let selecting: Vec<PolicyExplanation> = policies
            .iter()
            .filter_map(|p| {
                let rules = p.rules(dir)?;
                Some(PolicyExplanation {
                    id: p.id.clone(),
                    order: p.order,
                    rules: describe_rules(cluster, rules),
                })
            })
            .collect();
        let default = match selecting.len() {
            0 => "allow: no policy selects it".to_owned(),
            1 => "deny: selected by 1 policy".to_owned(),
            n => format!("deny: selected by {n} policies"),
        };
        DirectionExplanation {
            direction: dir,
            policies: selecting,
            default,
        }
    };
    Some(Explanation {
        namespace: ep.namespace.clone(),
        name: ep.name.clone(),
        pod: ep.pod.clone(),
        node: ep.node.clone(),
        interface: ep.interface.clone(),
        addresses: ep.addresses.clone(),
        ingress: direction(Direction::Ingress),
        egress: direction(Direction::Egress),
    })
}

/// One line per user rule; a Kubernetes rule split per protocol is joined back with "; ".
fn describe_rules(cluster: &Cluster, rules: &[PolicyRule]) -> Vec<String> {
    let mut lines: Vec<(usize, String)> = Vec::new();
    for r in rules {
        let text = describe_rule(cluster, r);
        match lines.last_mut() {
            Some((index, line)) if *index == r.index => {
                line.push_str("; ");
                line.push_str(&text);
            }
            _ => lines.push((r.index, text)),
        }
    }
    lines
        .into_iter()
        .map(|(i, line)| format!("[{i}] {line}"))
        .collect()
}

fn describe_rule(cluster: &Cluster, r: &PolicyRule) -> String {
    let mut words = vec![r.action.to_string()];
    if let Some(v) = r.ip_version {
        words.push(format!("{v:?}").to_lowercase());
    }
    match r.protocol {
        Some(p) => words.push(p.to_string()),
        None if r.not_protocol.is_none() => words.push("all protocols".into()),
        None => {}
    }
    if let Some(p) = r.not_protocol {
        words.push(format!("not {p}"));
    }
    for (label, icmp) in [("type", r.icmp), ("not type", r.not_icmp)] {
        if let Some(i) = icmp {
            let code = i.code.map(|c| format!(" code {c}")).unwrap_or_default();
            words.push(format!("{label} {}{code}", i.icmp_type));
        }
    }
    for (label, side) in [("sport", &r.source), ("dport", &r.destination)] {
        if !side.ports.is_empty() {
            words.push(format!("{label} {}", ports(&side.ports)));
        }
        if !side.not_ports.is_empty() {
            words.push(format!("{label} not {}", ports(&side.not_ports)));
        }
    }
    for (label, side) in [("from", &r.source), ("to", &r.destination)] {
        if let Some(text) = describe_side(cluster, side) {
            words.push(format!("{label} {text}"));
        }
    }
    words.join(" ")
}

/// One item as itself, several as `{a, b}`.
fn one_or_braced<T: std::fmt::Display>(items: &[T]) -> String {
    match items {
        [one] => one.to_string(),
        many => format!(
            "{{{}}}",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn ports(specs: &[PortSpec]) -> String {
    one_or_braced(specs)
}

fn describe_side(cluster: &Cluster, side: &EntityRule) -> Option<String> {
    if side.any_address() {
        return None;
    }
    let mut parts: Vec<String> = side
        .peers
        .iter()
        .map(|p| describe_peer(cluster, p))
        .collect();
    let peers = match parts.len() {
        0 => "anywhere".to_owned(),
        1 => parts.remove(0),
        _ => format!("any of: {}", parts.join(" | ")),
    };
    let mut text = peers;
    if let Some(not) = &side.not_endpoints {
        text.push_str(&format!(" but not {}", describe_selection(cluster, not)));
    }
    if !side.not_nets.is_empty() {
        text.push_str(&format!(" but not {}", nets(&side.not_nets)));
    }
    Some(text)
}

fn describe_peer(cluster: &Cluster, peer: &Peer) -> String {
    match peer {
        Peer::Endpoints { selection, nets: n } if n.is_empty() => {
            describe_selection(cluster, selection)
        }
        Peer::Endpoints { selection, nets: n } => format!(
            "{} within {}",
            describe_selection(cluster, selection),
            nets(n)
        ),
        Peer::Nets { nets: n, except } if except.is_empty() => nets(n),
        Peer::Nets { nets: n, except } => format!("{} except {}", nets(n), nets(except)),
    }
}

/// `namespace kube-system (ns selector ...)`, `pods app == 'x' in namespace default`, with
/// how many endpoints that is now.
fn describe_selection(cluster: &Cluster, s: &EndpointSelection) -> String {
    let count = cluster
        .endpoints
        .iter()
        .filter(|e| s.matches_in(e, cluster.namespaces))
        .count();
    let plural = if count == 1 { "" } else { "s" };
    let mut text = match (&s.selector, &s.namespaces) {
        (Selector::All, NamespaceMatch::Named(ns)) => format!("all pods of namespace {ns}"),
        (Selector::All, NamespaceMatch::Any) => "all pods".to_owned(),
        (Selector::All, NamespaceMatch::Selector(ns)) => named_namespace(ns)
            .map(|n| format!("namespace {n} (ns selector {ns})"))
            .unwrap_or_else(|| format!("namespaces matching {ns}")),
        (sel, NamespaceMatch::Named(ns)) => format!("pods {sel} in namespace {ns}"),
        (sel, NamespaceMatch::Any) => format!("pods {sel} in any namespace"),
        (sel, NamespaceMatch::Selector(ns)) => {
            format!("pods {sel} in namespaces matching {ns}")
        }
    };
    if let Some(sa) = &s.service_accounts {
        if sa.names.is_empty() {
            text.push_str(&format!(" with service account matching {}", sa.selector));
        } else {
            text.push_str(&format!(" with service account {}", sa.names.join(" or ")));
        }
    }
    format!("{text} ({count} endpoint{plural})")
}

/// The namespace a selector names by its implicit name label, if that is all it does.
fn named_namespace(s: &Selector) -> Option<&str> {
    match s {
        Selector::Eq(k, v)
            if k == "kubernetes.io/metadata.name" || k == "projectcalico.org/name" =>
        {
            Some(v)
        }
        _ => None,
    }
}

fn nets(n: &[IpNet]) -> String {
    one_or_braced(n)
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addrs = self
            .addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            f,
            "endpoint {}/{} (pod {}, node {}, interface {}, {})",
            self.namespace, self.name, self.pod, self.node, self.interface, addrs
        )?;
        for d in [&self.ingress, &self.egress] {
            writeln!(f, "{}: {}", d.direction, d.default)?;
            for p in &d.policies {
                let order = if p.order.is_finite() {
                    p.order.to_string()
                } else {
                    "none".into()
                };
                writeln!(f, "  {} (order {order})", p.id)?;
                if p.rules.is_empty() {
                    writeln!(f, "    no rules: allows nothing itself")?;
                }
                for r in &p.rules {
                    writeln!(f, "    {r}")?;
                }
            }
        }
        Ok(())
    }
}
