//! The small values both dialects share, each checked with a reason the user can act on:
//! metadata, names, protocols, ports, CIDRs, selectors (Calico's text and Kubernetes'
//! `LabelSelector` objects).

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::fields::{Field, Object};
use super::{FieldError, PortSpec, Protocol};
use crate::selector::{LabelOperator, LabelRequirement, LabelSelector, Selector};

pub(crate) struct Meta {
    pub name: String,
    pub namespace: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// Reads `metadata`: `name` (required), `namespace` (for namespaced kinds; `default` when
/// absent, as kubectl does), `labels`, and the read-only fields a `get -o yaml` carries.
pub(crate) fn metadata(top: &Object, namespaced: bool) -> Result<Meta, FieldError> {
    let meta = top.required("metadata")?.object()?;
    let name = meta.required("name")?;
    let name_text = name.str()?;
    check_name(&name, name_text)?;
    let namespace = match (meta.get("namespace"), namespaced) {
        (Some(ns), true) => {
            let text = ns.str()?;
            check_namespace(&ns, text)?;
            Some(text.to_owned())
        }
        (None, true) => Some("default".to_owned()),
        (Some(ns), false) => {
            return Err(ns.error("this kind is not namespaced: remove metadata.namespace"));
        }
        (None, false) => None,
    };
    let labels = match meta.get("labels") {
        Some(l) => {
            let labels = l.string_map()?;
            for (k, v) in &labels {
                check_label(&l, k, v)?;
            }
            labels
        }
        None => BTreeMap::new(),
    };
    if let Some(a) = meta.get("annotations") {
        a.string_map()?;
    }
    meta.ignore(&["uid", "resourceVersion", "creationTimestamp", "generation"]);
    meta.finish()?;
    Ok(Meta {
        name: name_text.to_owned(),
        namespace,
        labels,
    })
}

/// A DNS subdomain, as Kubernetes names objects.
fn check_name(field: &Field, name: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(field.error(format!(
            "{name:?} is not a valid name: use lower-case letters, digits, '-' and '.', \
             starting and ending with a letter or digit (at most 253)"
        )))
    }
}

/// A DNS label, as Kubernetes names namespaces.
pub(crate) fn check_namespace(field: &Field, name: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(field.error(format!(
            "{name:?} is not a valid namespace: use lower-case letters, digits and '-', \
             starting and ending with a letter or digit (at most 63)"
        )))
    }
}

/// A Calico selector string; empty means "no selector" (`None`), not `all()`.
pub(crate) fn selector(field: &Field) -> Result<Option<Selector>, FieldError> {
    let text = field.str()?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    Selector::parse(text).map(Some).map_err(|e| {
        field.error(format!(
            "{:?} does not parse: {} at position {}",
            text, e.reason, e.position
        ))
    })
}

/// A Kubernetes `LabelSelector` object, as a selector (`all()` when empty).
pub(crate) fn label_selector(field: &Field) -> Result<Selector, FieldError> {
    let o = field.object()?;
    let mut ls = LabelSelector::default();
    if let Some(m) = o.get("matchLabels") {
        ls.match_labels = m.string_map()?;
        for (k, v) in &ls.match_labels {
            check_label(&m, k, v)?;
        }
    }
    if let Some(exprs) = o.get("matchExpressions") {
        ls.match_expressions = exprs.each(|e| {
            let r = e.object()?;
            let key = r.required("key")?.str()?.to_owned();
            let op_field = r.required("operator")?;
            let operator = match op_field.str()? {
                "In" => LabelOperator::In,
                "NotIn" => LabelOperator::NotIn,
                "Exists" => LabelOperator::Exists,
                "DoesNotExist" => LabelOperator::DoesNotExist,
                other => {
                    return Err(op_field.error(format!(
                        "{other:?} is not an operator: use In, NotIn, Exists or DoesNotExist"
                    )));
                }
            };
            let values_field = r.get("values");
            let values = match &values_field {
                Some(v) => v.strings()?,
                None => Vec::new(),
            };
            let path = r.path_of("values");
            let needs_values = matches!(operator, LabelOperator::In | LabelOperator::NotIn);
            if needs_values && values.is_empty() {
                return Err(FieldError {
                    path,
                    reason: "In and NotIn need at least one value".into(),
                });
            }
            if !needs_values && !values.is_empty() {
                return Err(FieldError {
                    path,
                    reason: "Exists and DoesNotExist take no values".into(),
                });
            }
            for v in &values {
                check_label(&e, &key, v)?;
            }
            r.finish()?;
            Ok(LabelRequirement {
                key,
                operator,
                values,
            })
        })?;
    }
    o.finish()?;
    Ok(ls.to_selector())
}

/// A label key and value Kubernetes accepts (which the selector language can always quote).
fn check_label(field: &Field, key: &str, value: &str) -> Result<(), FieldError> {
    let key_ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    let value_ok = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if key_ok && value_ok {
        Ok(())
    } else {
        Err(field.error(format!(
            "label {key:?}: {value:?} is not a valid label: keys take letters, digits and \
             '-_./', values letters, digits and '-_.' (at most 63)"
        )))
    }
}

/// Calico's protocol names (any case) or a number 1–255.
pub(crate) fn protocol(field: &Field) -> Result<Protocol, FieldError> {
    if field.value.is_number() {
        return Ok(Protocol::from_number(field.int(1, 255)? as u8));
    }
    let text = field.str()?;
    protocol_name(text).ok_or_else(|| {
        field.error(format!(
            "{text:?} is not a protocol: use TCP, UDP, SCTP, ICMP, ICMPv6, UDPLite or a number 1-255"
        ))
    })
}

fn protocol_name(text: &str) -> Option<Protocol> {
    Some(match text.to_ascii_lowercase().as_str() {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        "icmp" => Protocol::Icmp,
        "icmpv6" => Protocol::IcmpV6,
        "udplite" => Protocol::Number(136),
        _ => return None,
    })
}

/// How `Protocol` is stored: Calico's upper-case names, other protocols as numbers.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProtocolRepr {
    Name(String),
    Number(u8),
}

impl From<Protocol> for ProtocolRepr {
    fn from(p: Protocol) -> Self {
        match p {
            Protocol::Tcp => ProtocolRepr::Name("TCP".into()),
            Protocol::Udp => ProtocolRepr::Name("UDP".into()),
            Protocol::Sctp => ProtocolRepr::Name("SCTP".into()),
            Protocol::Icmp => ProtocolRepr::Name("ICMP".into()),
            Protocol::IcmpV6 => ProtocolRepr::Name("ICMPv6".into()),
            Protocol::Number(n) => ProtocolRepr::Number(n),
        }
    }
}

impl TryFrom<ProtocolRepr> for Protocol {
    type Error = String;
    fn try_from(r: ProtocolRepr) -> Result<Self, String> {
        match r {
            ProtocolRepr::Number(0) => Err("protocol 0 is not a protocol".into()),
            ProtocolRepr::Number(n) => Ok(Protocol::from_number(n)),
            ProtocolRepr::Name(s) => {
                protocol_name(&s).ok_or_else(|| format!("{s:?} is not a protocol"))
            }
        }
    }
}

/// A port number 1–65535.
pub(crate) fn port_number(field: &Field) -> Result<u16, FieldError> {
    Ok(field.int(1, 65535)? as u16)
}

/// A port's name as Kubernetes names container ports (an IANA service name): at most 15
/// lower-case letters, digits and '-', with a letter, no '--', not starting or ending in '-'.
pub(crate) fn port_name(field: &Field, name: &str) -> Result<String, FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.chars().any(|c| c.is_ascii_lowercase())
        && !name.contains("--")
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(name.to_owned())
    } else {
        Err(field.error(format!(
            "{name:?} is neither a port number nor a port name (at most 15 lower-case \
             letters, digits and '-', with a letter)"
        )))
    }
}

/// Calico's port: a number, `"a:b"`, or a name.
pub(crate) fn calico_port(field: &Field) -> Result<PortSpec, FieldError> {
    if field.value.is_number() {
        let p = port_number(field)?;
        return Ok(PortSpec::Range(p, p));
    }
    let text = field.str()?;
    if let Some((a, b)) = text.split_once(':') {
        let bound = |s: &str| -> Result<u16, FieldError> {
            match s.trim().parse::<u32>() {
                Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
                _ => Err(field.error(format!(
                    "{text:?}: {s:?} is not a port: a range is \"FIRST:LAST\" with ports 1-65535"
                ))),
            }
        };
        let (lo, hi) = (bound(a)?, bound(b)?);
        if lo > hi {
            return Err(field.error(format!("{text:?}: the range ends before it starts")));
        }
        return Ok(PortSpec::Range(lo, hi));
    }
    if let Ok(n) = text.trim().parse::<i64>() {
        if (1..=65535).contains(&n) {
            return Ok(PortSpec::Range(n as u16, n as u16));
        }
        return Err(field.error(format!("{n} is out of range: use a port from 1 to 65535")));
    }
    port_name(field, text).map(PortSpec::Named)
}

/// A CIDR (a bare address is its host prefix); host bits are dropped.
pub(crate) fn cidr(field: &Field) -> Result<IpNet, FieldError> {
    let text = field.str()?;
    let parsed = text
        .parse::<IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
    parsed.map(|n| n.trunc()).map_err(|_| {
        field.error(format!(
            "{text:?} is not a CIDR: write an address and a prefix length, as 10.0.0.0/8 or fd00::/64"
        ))
    })
}

/// A policy's types (`types`, `policyTypes`): whether it is an ingress and an egress policy.
pub(crate) fn policy_types(types: &Field) -> Result<(bool, bool), FieldError> {
    let mut seen = (false, false);
    types.each(|t| {
        match t.str()? {
            "Ingress" => seen.0 = true,
            "Egress" => seen.1 = true,
            other => {
                return Err(t.error(format!(
                    "{other:?} is not a policy type: use Ingress or Egress"
                )));
            }
        }
        Ok(())
    })?;
    Ok(seen)
}
