//! Kubernetes `networking.k8s.io/v1` `NetworkPolicy`, as its API defines it: additive allows
//! in Calico's order 1000; `policyTypes` defaulted as Kubernetes does (Ingress always, Egress
//! when there are egress rules); peers OR'ed, `podSelector` and `namespaceSelector` AND'ed
//! within one peer; a rule's ports grouped into one rule per protocol (ports are always the
//! destination's, in both directions).

use ipnet::IpNet;

use super::fields::{Field, Object};
use super::values::{cidr, label_selector, metadata, policy_types, port_name, port_number};
use super::{
    Action, EndpointSelection, EntityRule, FieldError, NamespaceMatch, Peer, Policy, PolicyId,
    PolicyKind, PolicyRule, PortSpec, Protocol,
};
use crate::selector::Selector;

/// Calico's order for Kubernetes policies.
pub const K8S_ORDER: f64 = 1000.0;

pub(super) fn parse(top: &Object) -> Result<Policy, FieldError> {
    let meta = metadata(top, true)?;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let spec = top.required("spec")?.object()?;
    let pod_selector = label_selector(&spec.required("podSelector")?)?;
    let ingress = match spec.get("ingress") {
        Some(f) => rules(&f, &namespace, true)?,
        None => Vec::new(),
    };
    let egress = match spec.get("egress") {
        Some(f) => rules(&f, &namespace, false)?,
        None => Vec::new(),
    };
    let (has_ingress, has_egress) = match spec.get("policyTypes") {
        Some(types) => policy_types(&types)?,
        // Kubernetes' defaulting: every policy is an ingress policy; egress only with rules.
        None => (true, !egress.is_empty()),
    };
    spec.finish()?;
    top.finish()?;
    Ok(Policy {
        id: PolicyId {
            kind: PolicyKind::K8sNetworkPolicy,
            namespace: Some(namespace.clone()),
            name: meta.name,
        },
        order: K8S_ORDER,
        subject: EndpointSelection {
            namespaces: NamespaceMatch::Named(namespace),
            selector: pod_selector,
            service_accounts: None,
        },
        ingress: has_ingress.then_some(ingress),
        egress: has_egress.then_some(egress),
    })
}

fn rules(field: &Field, namespace: &str, ingress: bool) -> Result<Vec<PolicyRule>, FieldError> {
    let mut out = Vec::new();
    for (index, r) in field.items()?.iter().enumerate() {
        out.extend(rule(r, index, namespace, ingress)?);
    }
    Ok(out)
}

/// One `ingress[i]` / `egress[i]`: its peers and ports, as one rule per protocol.
fn rule(
    field: &Field,
    index: usize,
    namespace: &str,
    ingress: bool,
) -> Result<Vec<PolicyRule>, FieldError> {
    let o = field.object()?;
    let peers_key = if ingress { "from" } else { "to" };
    let peers = match o.get(peers_key) {
        Some(f) => f.each(|p| peer(&p, namespace))?,
        None => Vec::new(),
    };
    let groups = match o.get("ports") {
        Some(f) => port_groups(&f)?,
        None => Vec::new(),
    };
    o.finish()?;
    let make = |protocol: Option<Protocol>, ports: Vec<PortSpec>| {
        let remote = EntityRule {
            peers: peers.clone(),
            ..EntityRule::default()
        };
        let (source, mut destination) = if ingress {
            (remote, EntityRule::default())
        } else {
            (EntityRule::default(), remote)
        };
        destination.ports = ports;
        PolicyRule {
            index,
            action: Action::Allow,
            ip_version: None,
            protocol,
            not_protocol: None,
            icmp: None,
            not_icmp: None,
            source,
            destination,
        }
    };
    if groups.is_empty() {
        return Ok(vec![make(None, Vec::new())]);
    }
    Ok(groups
        .into_iter()
        .map(|(protocol, ports)| make(Some(protocol), ports))
        .collect())
}

fn peer(field: &Field, namespace: &str) -> Result<Peer, FieldError> {
    let o = field.object()?;
    let pods = o
        .get("podSelector")
        .map(|f| label_selector(&f))
        .transpose()?;
    let namespaces = o
        .get("namespaceSelector")
        .map(|f| label_selector(&f))
        .transpose()?;
    let block = o.get("ipBlock");
    let peer = match (pods, namespaces, block) {
        (None, None, Some(b)) => ip_block(&b)?,
        (pods, namespaces, None) if pods.is_some() || namespaces.is_some() => Peer::Endpoints {
            selection: EndpointSelection {
                namespaces: match namespaces {
                    Some(s) => NamespaceMatch::Selector(s),
                    None => NamespaceMatch::Named(namespace.to_owned()),
                },
                selector: pods.unwrap_or(Selector::All),
                service_accounts: None,
            },
            nets: Vec::new(),
        },
        (_, _, Some(_)) => {
            return Err(field.error(
                "ipBlock cannot be combined with podSelector or namespaceSelector: write them as \
                 separate peers",
            ));
        }
        _ => {
            return Err(field.error(
                "a peer needs podSelector, namespaceSelector or ipBlock (for any peer, leave \
                 the list out)",
            ));
        }
    };
    o.finish()?;
    Ok(peer)
}

fn ip_block(field: &Field) -> Result<Peer, FieldError> {
    let o = field.object()?;
    let net = cidr(&o.required("cidr")?)?;
    let except = match o.get("except") {
        Some(f) => f.each(|e| {
            let x = cidr(&e)?;
            if !strictly_within(&x, &net) {
                return Err(e.error(format!(
                    "{x} is not inside the cidr {net}: an except must be a smaller part of it"
                )));
            }
            Ok(x)
        })?,
        None => Vec::new(),
    };
    o.finish()?;
    Ok(Peer::Nets {
        nets: vec![net],
        except,
    })
}

fn strictly_within(inner: &IpNet, outer: &IpNet) -> bool {
    inner.prefix_len() > outer.prefix_len() && outer.contains(inner)
}

/// The ports grouped by protocol, in the order protocols first appear; an entry without a
/// port opens its whole protocol (an empty list).
fn port_groups(field: &Field) -> Result<Vec<(Protocol, Vec<PortSpec>)>, FieldError> {
    let mut groups: Vec<(Protocol, Option<Vec<PortSpec>>)> = Vec::new();
    for entry in field.items()? {
        let (protocol, port) = port_entry(&entry)?;
        let slot = match groups.iter().position(|(p, _)| *p == protocol) {
            Some(i) => &mut groups[i].1,
            None => {
                groups.push((protocol, Some(Vec::new())));
                &mut groups.last_mut().expect("just pushed").1
            }
        };
        match (slot.as_mut(), port) {
            (Some(ports), Some(port)) => {
                if !ports.contains(&port) {
                    ports.push(port);
                }
            }
            (_, None) => *slot = None,
            (None, Some(_)) => {}
        }
    }
    Ok(groups
        .into_iter()
        .map(|(p, ports)| (p, ports.unwrap_or_default()))
        .collect())
}

fn port_entry(field: &Field) -> Result<(Protocol, Option<PortSpec>), FieldError> {
    let o = field.object()?;
    let protocol = match o.get("protocol") {
        Some(p) => match p.str()? {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            other => {
                return Err(p.error(format!(
                    "{other:?} is not a protocol here: use TCP, UDP or SCTP"
                )));
            }
        },
        None => Protocol::Tcp,
    };
    let port = o.get("port");
    let end = o.get("endPort");
    let spec = match (&port, &end) {
        (None, None) => None,
        (None, Some(e)) => return Err(e.error("endPort needs a numeric port")),
        (Some(p), end) if p.value.is_string() => {
            if let Some(e) = end {
                return Err(e.error("endPort needs a numeric port, not a named one"));
            }
            Some(PortSpec::Named(port_name(p, p.str()?)?))
        }
        (Some(p), None) => {
            let n = port_number(p)?;
            Some(PortSpec::Range(n, n))
        }
        (Some(p), Some(e)) => {
            let (start, last) = (port_number(p)?, port_number(e)?);
            if last < start {
                return Err(e.error(format!(
                    "endPort {last} is below port {start}: it must be at least the port"
                )));
            }
            Some(PortSpec::Range(start, last))
        }
    };
    o.finish()?;
    Ok((protocol, spec))
}
