//! Calico `projectcalico.org/v3` `NetworkPolicy` (namespaced) and `GlobalNetworkPolicy`:
//! order, selector expressions, types defaulted as Calico does, and rules with actions,
//! protocols, ICMP, and source / destination entities. Checked as Calico's validation does
//! where it matters for what is enforced (ports need a protocol that has them, ICMP fields
//! need ICMP, `ipVersion` agrees with nets and protocol).
//!
//! Scoping (as Calico's namespaced policies do): in a `NetworkPolicy`, an entity's
//! `selector`, `notSelector` and `serviceAccounts` select endpoints of the policy's own
//! namespace unless the entity has a `namespaceSelector`; in a `GlobalNetworkPolicy` they
//! select in every namespace.

use ipnet::IpNet;

use super::fields::{Field, Object};
use super::values::{calico_port, cidr, metadata, policy_types, protocol, selector};
use super::{
    Action, EndpointSelection, EntityRule, FieldError, Icmp, IpVersion, NamespaceMatch, Peer,
    Policy, PolicyId, PolicyKind, PolicyRule, PortSpec, Protocol, ServiceAccountMatch,
};
use crate::selector::Selector;

pub(super) fn parse(top: &Object, kind: PolicyKind) -> Result<Policy, FieldError> {
    let global = kind == PolicyKind::GlobalNetworkPolicy;
    let meta = metadata(top, !global)?;
    let namespace = meta.namespace.as_deref();
    let spec = top.required("spec")?.object()?;
    let order = match spec.get("order") {
        Some(f) => f.f64()?,
        // Calico: a policy without an order comes after every ordered one.
        None => f64::INFINITY,
    };
    if let Some(tier) = spec.get("tier")
        && tier.str()? != "default"
    {
        return Err(tier.error("margay has one tier: leave tier out or write \"default\""));
    }
    let subject_selector = match spec.get("selector") {
        Some(f) => selector(&f)?.unwrap_or(Selector::All),
        None => Selector::All,
    };
    let namespaces = match (spec.get("namespaceSelector"), namespace) {
        (Some(f), None) => match selector(&f)? {
            Some(s) => NamespaceMatch::Selector(s),
            None => NamespaceMatch::Any,
        },
        (Some(f), Some(_)) => {
            return Err(f.error(
                "a NetworkPolicy applies in its own namespace: use a GlobalNetworkPolicy to \
                 select namespaces",
            ));
        }
        (None, Some(ns)) => NamespaceMatch::Named(ns.to_owned()),
        (None, None) => NamespaceMatch::Any,
    };
    let service_accounts = match spec.get("serviceAccountSelector") {
        Some(f) => selector(&f)?.map(|s| ServiceAccountMatch {
            names: Vec::new(),
            selector: s,
        }),
        None => None,
    };
    let ingress = match spec.get("ingress") {
        Some(f) => rules(&f, namespace)?,
        None => Vec::new(),
    };
    let egress = match spec.get("egress") {
        Some(f) => rules(&f, namespace)?,
        None => Vec::new(),
    };
    let (has_ingress, has_egress) = match spec.get("types") {
        Some(types) => {
            let seen = policy_types(&types)?;
            for (has, rules, key, ty) in [
                (seen.0, &ingress, "ingress", "Ingress"),
                (seen.1, &egress, "egress", "Egress"),
            ] {
                if !has && !rules.is_empty() {
                    return Err(FieldError {
                        path: spec.path_of(key),
                        reason: format!(
                            "{key} rules are present but types leaves out {ty}: add it to types"
                        ),
                    });
                }
            }
            seen
        }
        // Calico's default: egress if there are egress rules; ingress if there are ingress
        // rules or no egress rules.
        None => (!ingress.is_empty() || egress.is_empty(), !egress.is_empty()),
    };
    for key in ["doNotTrack", "preDNAT", "applyOnForward"] {
        if let Some(f) = spec.get(key) {
            if !global {
                return Err(f.error(format!("{key} is for GlobalNetworkPolicy only")));
            }
            if f.bool()? {
                return Err(f.error(format!(
                    "margay does not enforce {key} policies (host endpoints): leave it out"
                )));
            }
        }
    }
    spec.finish()?;
    top.finish()?;
    Ok(Policy {
        id: PolicyId {
            kind,
            namespace: meta.namespace.clone(),
            name: meta.name,
        },
        order,
        subject: EndpointSelection {
            namespaces,
            selector: subject_selector,
            service_accounts,
        },
        ingress: has_ingress.then_some(ingress),
        egress: has_egress.then_some(egress),
    })
}

fn rules(field: &Field, namespace: Option<&str>) -> Result<Vec<PolicyRule>, FieldError> {
    let mut out = Vec::new();
    for (index, r) in field.items()?.iter().enumerate() {
        out.push(rule(r, index, namespace)?);
    }
    Ok(out)
}

fn rule(field: &Field, index: usize, namespace: Option<&str>) -> Result<PolicyRule, FieldError> {
    let o = field.object()?;
    let action_field = o.required("action")?;
    let action = match action_field.str()? {
        "Allow" => Action::Allow,
        "Deny" => Action::Deny,
        "Log" => Action::Log,
        "Pass" => Action::Pass,
        other => {
            return Err(action_field.error(format!(
                "{other:?} is not an action: use Allow, Deny, Log or Pass"
            )));
        }
    };
    let proto = o.get("protocol").map(|f| protocol(&f)).transpose()?;
    let not_protocol = o.get("notProtocol").map(|f| protocol(&f)).transpose()?;
    let ip_version = match o.get("ipVersion") {
        Some(f) => Some(match f.int(4, 6)? {
            4 => IpVersion::V4,
            6 => IpVersion::V6,
            _ => return Err(f.error("use ipVersion 4 or 6")),
        }),
        None => None,
    };
    let mut icmp_fields = Vec::new();
    for key in ["icmp", "notICMP"] {
        let value = match o.get(key) {
            Some(f) => {
                if !matches!(proto, Some(Protocol::Icmp | Protocol::IcmpV6)) {
                    return Err(f.error(format!("{key} needs protocol ICMP or ICMPv6")));
                }
                Some(icmp(&f)?)
            }
            None => None,
        };
        icmp_fields.push(value);
    }
    let family = match proto {
        Some(Protocol::Icmp) => Some(IpVersion::V4),
        Some(Protocol::IcmpV6) => Some(IpVersion::V6),
        _ => None,
    };
    if let (Some(f), Some(v)) = (family, ip_version)
        && f != v
    {
        return Err(FieldError {
            path: o.path_of("ipVersion"),
            reason: "disagrees with the protocol: ICMP is IPv4's, ICMPv6 IPv6's".into(),
        });
    }
    let version = ip_version.or(family);
    let source = match o.get("source") {
        Some(f) => entity(&f, namespace, proto, version)?,
        None => EntityRule::default(),
    };
    let destination = match o.get("destination") {
        Some(f) => entity(&f, namespace, proto, version)?,
        None => EntityRule::default(),
    };
    if let Some(m) = o.get("metadata") {
        let meta = m.object()?;
        if let Some(a) = meta.get("annotations") {
            a.string_map()?;
        }
        meta.finish()?;
    }
    o.finish()?;
    Ok(PolicyRule {
        index,
        action,
        ip_version,
        protocol: proto,
        not_protocol,
        icmp: icmp_fields[0],
        not_icmp: icmp_fields[1],
        source,
        destination,
    })
}

fn icmp(field: &Field) -> Result<Icmp, FieldError> {
    let o = field.object()?;
    let icmp_type = o.get("type").map(|f| f.int(0, 254)).transpose()?;
    let code = o.get("code").map(|f| f.int(0, 255)).transpose()?;
    let icmp_type = match (icmp_type, code) {
        (Some(t), _) => t as u8,
        (None, _) => {
            return Err(FieldError {
                path: o.path_of("type"),
                reason: "is required (a code alone matches nothing in particular)".into(),
            });
        }
    };
    o.finish()?;
    Ok(Icmp {
        icmp_type,
        code: code.map(|c| c as u8),
    })
}

/// An entity's `nets` or `notNets` (`key`): sorted, without duplicates, each of the rule's IP
/// version when it has one.
fn entity_nets(
    o: &Object<'_>,
    key: &'static str,
    version: Option<IpVersion>,
) -> Result<Vec<IpNet>, FieldError> {
    let Some(f) = o.get(key) else {
        return Ok(Vec::new());
    };
    let mut nets = f.each(|n| {
        let net = cidr(&n)?;
        let net_version = match net {
            IpNet::V4(_) => IpVersion::V4,
            IpNet::V6(_) => IpVersion::V6,
        };
        if version.is_some_and(|v| v != net_version) {
            return Err(n.error(format!(
                "{net} is of the other IP version than the rule's ipVersion or protocol"
            )));
        }
        Ok(net)
    })?;
    nets.sort();
    nets.dedup();
    Ok(nets)
}

/// An entity's `serviceAccounts`: the names (sorted, without duplicates) and the selector.
fn service_accounts(f: &Field) -> Result<ServiceAccountMatch, FieldError> {
    let sa = f.object()?;
    let names = match sa.get("names") {
        Some(n) => {
            let mut names = n.strings()?;
            names.sort();
            names.dedup();
            names
        }
        None => Vec::new(),
    };
    let selector = match sa.get("selector") {
        Some(s) => selector(&s)?.unwrap_or(Selector::All),
        None => Selector::All,
    };
    sa.finish()?;
    Ok(ServiceAccountMatch { names, selector })
}

/// An entity's `ports` or `notPorts` (`key`): only with a protocol that has ports, and no
/// named port in `notPorts`.
fn entity_ports(
    o: &Object<'_>,
    key: &'static str,
    proto: Option<Protocol>,
) -> Result<Vec<PortSpec>, FieldError> {
    let Some(f) = o.get(key) else {
        return Ok(Vec::new());
    };
    if !proto.is_some_and(Protocol::has_ports) {
        return Err(f.error(format!(
            "{key} needs the rule's protocol to be TCP, UDP, SCTP or UDPLite"
        )));
    }
    f.each(|p| {
        let spec = calico_port(&p)?;
        if key == "notPorts" && matches!(spec, PortSpec::Named(_)) {
            return Err(p.error("named ports are not supported in notPorts: list numbers"));
        }
        Ok(spec)
    })
}

/// A rule's `source` or `destination`.
fn entity(
    field: &Field,
    namespace: Option<&str>,
    proto: Option<Protocol>,
    version: Option<IpVersion>,
) -> Result<EntityRule, FieldError> {
    let o = field.object()?;
    let nets = entity_nets(&o, "nets", version)?;
    let not_nets = entity_nets(&o, "notNets", version)?;
    let sel = o
        .get("selector")
        .map(|f| selector(&f))
        .transpose()?
        .flatten();
    let not_sel = o
        .get("notSelector")
        .map(|f| selector(&f))
        .transpose()?
        .flatten();
    let ns_sel = o
        .get("namespaceSelector")
        .map(|f| selector(&f))
        .transpose()?
        .flatten();
    let service_accounts = o
        .get("serviceAccounts")
        .map(|f| service_accounts(&f))
        .transpose()?;
    let ports = entity_ports(&o, "ports", proto)?;
    let not_ports = entity_ports(&o, "notPorts", proto)?;
    o.finish()?;
    let scope = match (&ns_sel, namespace) {
        (Some(s), _) => NamespaceMatch::Selector(s.clone()),
        (None, Some(ns)) => NamespaceMatch::Named(ns.to_owned()),
        (None, None) => NamespaceMatch::Any,
    };
    let peers = if sel.is_some() || ns_sel.is_some() || service_accounts.is_some() {
        vec![Peer::Endpoints {
            selection: EndpointSelection {
                namespaces: scope.clone(),
                selector: sel.unwrap_or(Selector::All),
                service_accounts,
            },
            nets,
        }]
    } else if !nets.is_empty() {
        vec![Peer::Nets {
            nets,
            except: Vec::new(),
        }]
    } else {
        Vec::new()
    };
    Ok(EntityRule {
        peers,
        not_endpoints: not_sel.map(|s| EndpointSelection {
            namespaces: scope,
            selector: s,
            service_accounts: None,
        }),
        not_nets,
        ports,
        not_ports,
    })
}
