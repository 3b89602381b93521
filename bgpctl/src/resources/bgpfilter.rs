//! BGPFilter ⇄ `BgpFilter`: four ordered rule lists (`exportV4`, `importV4`, `exportV6`,
//! `importV6`) of Calico's rules, attached to BGPPeer resources by name (`spec.filters`).
//! Every rule is checked here as bgpd checks it (family of the list, host bits, the
//! cidr/matchOperator pair, prefix-length bounds, interface names, duplicates), so that a bad
//! filter stops the file before anything of it is applied; bgpd checks again.
//!
//! The rule fields Calico added in 2026 (`peerType`, `communities`, `asPathPrefix`,
//! `priority`, `operations`) are refused with their path: margay does not evaluate them.

use proto::v1 as pb;
use serde_json::{Map, Value, json};

use super::fields::{FieldError, Obj, Result};
use super::ippool::{network, validate_name};
use super::{Document, Kind, document_value, parts, plain_metadata};

/// The lists in Calico's order, with whether each holds IPv6 rules.
const LISTS: [(&str, bool); 4] = [
    ("exportV4", false),
    ("importV4", false),
    ("exportV6", true),
    ("importV6", true),
];

const OPERATORS: &[&str] = &["Equal", "NotEqual", "In", "NotIn"];

pub fn from_document(doc: &Document) -> Result<pb::BgpFilter> {
    let p = parts(doc, &[])?;
    plain_metadata(p.metadata, Kind::BgpFilter)?;
    validate_name(&doc.name)?;
    let mut s = p.spec;
    let mut f = pb::BgpFilter {
        name: doc.name.clone(),
        revision: p.revision,
        ..Default::default()
    };
    for (list, v6) in LISTS {
        let mut rules: Vec<pb::BgpFilterRule> = Vec::new();
        for (i, item) in s.list(list)?.unwrap_or_default().into_iter().enumerate() {
            let path = format!("spec.{list}[{i}]");
            let r = rule(&path, v6, item)?;
            if let Some(j) = rules.iter().position(|o| *o == r) {
                return Err(FieldError::new(
                    path,
                    format!("the same rule as spec.{list}[{j}]: the second can never decide"),
                ));
            }
            rules.push(r);
        }
        match list {
            "exportV4" => f.export_v4 = rules,
            "importV4" => f.import_v4 = rules,
            "exportV6" => f.export_v6 = rules,
            _ => f.import_v6 = rules,
        }
    }
    s.finish()?;
    Ok(f)
}

fn rule(path: &str, v6: bool, item: Value) -> Result<pb::BgpFilterRule> {
    let mut o = Obj::new(path, item)?;
    let not_yet = "not supported by margay yet (Calico's 2026 BGPFilter extensions)";
    for key in [
        "peerType",
        "communities",
        "asPathPrefix",
        "priority",
        "operations",
    ] {
        o.refuse(key, not_yet, &[])?;
    }
    let mut r = pb::BgpFilterRule {
        action: o
            .choice("action", &["Accept", "Reject"])?
            .ok_or_else(|| FieldError::new(o.path_of("action"), "required: Accept or Reject"))?
            .into(),
        ..Default::default()
    };
    let cidr = o.str("cidr")?;
    let op = o.choice("matchOperator", OPERATORS)?;
    let max_len = if v6 { 128 } else { 32 };
    if let Some(c) = &cidr {
        let (addr, _) = network(&o.path_of("cidr"), c.trim())?;
        if addr.is_ipv6() != v6 {
            let (is, list) = if v6 {
                ("IPv4", "IPv6")
            } else {
                ("IPv6", "IPv4")
            };
            return Err(FieldError::new(
                o.path_of("cidr"),
                format!("{c} is {is}, in an {list} list"),
            ));
        }
        r.cidr = c.trim().to_owned();
    }
    match (&cidr, op) {
        (Some(_), None) => {
            return Err(FieldError::new(
                o.path_of("matchOperator"),
                format!("required with cidr: one of {}", OPERATORS.join(", ")),
            ));
        }
        (None, Some(_)) => {
            return Err(FieldError::new(
                o.path_of("cidr"),
                "required with matchOperator (Calico sets both or neither)",
            ));
        }
        _ => r.match_operator = op.unwrap_or("").into(),
    }
    if let Some(mut len) = o.obj("prefixLength")? {
        if cidr.is_none() {
            return Err(FieldError::new(
                o.path_of("prefixLength"),
                "needs cidr (a prefix length bounds a CIDR match)",
            ));
        }
        r.prefix_length_min = len.uint("min", max_len)?.map(|v| v as u32);
        r.prefix_length_max = len.uint("max", max_len)?.map(|v| v as u32);
        len.finish()?;
        if let (Some(min), Some(max)) = (r.prefix_length_min, r.prefix_length_max)
            && min > max
        {
            return Err(FieldError::new(
                o.path_of("prefixLength"),
                format!("min {min} is above max {max}: no prefix could match"),
            ));
        }
    }
    if let Some(src) = o.choice("source", &["RemotePeers"])? {
        r.source = src.into();
    }
    if let Some(name) = o.str("interface")? {
        let ok = (1..=15).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.*-".contains(&b));
        if !ok {
            return Err(FieldError::new(
                o.path_of("interface"),
                format!(
                    "{name:?} is not an interface name: 1-15 characters of A-Z a-z 0-9 _ . - \
                     and * (a wildcard)"
                ),
            ));
        }
        r.interface = name;
    }
    o.finish()?;
    Ok(r)
}

/// The document of a stored BGPFilter (the inverse of `from_document`): unset fields and
/// empty lists are left out.
pub fn to_document(f: &pb::BgpFilter) -> Value {
    let mut spec = Map::new();
    for (list, rules) in [
        ("exportV4", &f.export_v4),
        ("importV4", &f.import_v4),
        ("exportV6", &f.export_v6),
        ("importV6", &f.import_v6),
    ] {
        if !rules.is_empty() {
            spec.insert(list.into(), rules.iter().map(rule_value).collect());
        }
    }
    document_value(Kind::BgpFilter, &f.name, f.revision, Value::Object(spec))
}

fn rule_value(r: &pb::BgpFilterRule) -> Value {
    let mut v = Map::new();
    v.insert("action".into(), json!(r.action));
    for (key, text) in [
        ("cidr", &r.cidr),
        ("matchOperator", &r.match_operator),
        ("source", &r.source),
        ("interface", &r.interface),
    ] {
        if !text.is_empty() {
            v.insert(key.into(), json!(text));
        }
    }
    let mut len = Map::new();
    if let Some(min) = r.prefix_length_min {
        len.insert("min".into(), json!(min));
    }
    if let Some(max) = r.prefix_length_max {
        len.insert("max".into(), json!(max));
    }
    if !len.is_empty() {
        v.insert("prefixLength".into(), Value::Object(len));
    }
    Value::Object(v)
}
