//! BGPConfiguration ⇄ `BgpConfiguration`. Only the cluster-wide one, `default`, exists in
//! margay. Applying replaces the Calico fields (absent ones go back to their defaults, as
//! with calicoctl) and keeps margay's own settings that Calico's resource cannot express
//! (hold and keepalive times, pool aggregation, external transit, program external routes:
//! `bgpctl config set`).
//!
//! `logSeverityScreen` is accepted and not applied, with a warning: it sets the log level of
//! Calico's BIRD and confd, and bgpd's log level is its own configuration (`[log] level`).
//! Refusing it would make Calico's own default BGPConfiguration fail to apply.
//!
//! The service CIDRs (`serviceClusterIPs`, `serviceExternalIPs`, `serviceLoadBalancerIPs`),
//! `communities` and `prefixAdvertisements` are checked here as bgpd checks them (network
//! addresses, no overlap within a list, community values, names defined, Calico's limits).
//! margay advertises the load-balancer CIDRs from every node: Calico's
//! `serviceLoadBalancerAggregation: Enabled`, its default; `Disabled` is refused.

use proto::v1 as pb;
use serde_json::{Value, json};

use super::fields::{FieldError, Obj, Result, as_number};
use super::ippool::{masked, network};
use super::{Document, Kind, document_value, parts, plain_metadata};

/// Calico's limits.
const MAX_COMMUNITIES: usize = 500;
const MAX_PREFIX_ADVERTISEMENTS: usize = 500;
const MAX_COMMUNITIES_PER_PREFIX: usize = 50;

#[derive(Default)]
pub struct ConfigSpec {
    pub as_number: u32,
    pub node_to_node_mesh: Option<bool>,
    pub listen_port: u32,
    pub revision: u64,
    pub service_cluster_ips: Vec<String>,
    pub service_external_ips: Vec<String>,
    pub service_load_balancer_ips: Vec<String>,
    pub communities: Vec<pb::CommunityDef>,
    pub prefix_advertisements: Vec<pb::PrefixAdvertisement>,
    /// Fields accepted but not applied, each with why.
    pub warnings: Vec<String>,
}

pub fn from_document(doc: &Document) -> Result<ConfigSpec> {
    let p = parts(doc, &[])?;
    if doc.name != "default" {
        return Err(FieldError::new(
            "metadata.name",
            format!(
                "{:?}: only the cluster-wide BGPConfiguration \"default\" is supported \
                 (per-node ones, node.<name>, are not)",
                doc.name
            ),
        ));
    }
    plain_metadata(p.metadata, Kind::BgpConfiguration)?;
    let mut s = p.spec;
    let mut warnings = Vec::new();
    if let Some(level) = s.choice(
        "logSeverityScreen",
        &[
            "Trace", "Debug", "Info", "Warning", "Error", "Fatal", "None",
        ],
    )? {
        warnings.push(format!(
            "spec.logSeverityScreen: {level} not applied: bgpd's log level is set in its \
             configuration file ([log] level)"
        ));
    }
    let as_number = match s.take("asNumber") {
        Some(v) => as_number("spec.asNumber", v)?,
        None => 0,
    };
    let listen_port = s.uint("listenPort", 65535)?.unwrap_or(0) as u32;
    let mesh = s.bool("nodeToNodeMeshEnabled")?;
    let service_cluster_ips = service_cidrs(&mut s, "serviceClusterIPs")?;
    let service_external_ips = service_cidrs(&mut s, "serviceExternalIPs")?;
    let service_load_balancer_ips = service_cidrs(&mut s, "serviceLoadBalancerIPs")?;
    s.refuse(
        "serviceLoadBalancerAggregation",
        "Disabled: not supported: margay advertises serviceLoadBalancerIPs from every node \
         (Enabled)",
        &[json!("Enabled")],
    )?;
    let communities = communities(&mut s)?;
    let prefix_advertisements = prefix_advertisements(&mut s, &communities)?;
    let later = "not supported yet";
    s.refuse("ignoredInterfaces", later, &[json!([])])?;
    s.refuse("bindMode", later, &[json!("None")])?;
    s.refuse("nodeMeshPassword", later, &[])?;
    s.refuse("nodeMeshMaxRestartTime", later, &[])?;
    s.refuse("localWorkloadPeeringIPV4", later, &[json!("")])?;
    s.refuse("localWorkloadPeeringIPV6", later, &[json!("")])?;
    s.refuse("programClusterRoutes", later, &[json!("Enabled")])?;
    s.finish()?;
    Ok(ConfigSpec {
        as_number,
        node_to_node_mesh: mesh,
        listen_port,
        revision: p.revision,
        service_cluster_ips,
        service_external_ips,
        service_load_balancer_ips,
        communities,
        prefix_advertisements,
        warnings,
    })
}

/// A list of `{cidr}`: network addresses of either family, none overlapping another.
fn service_cidrs(s: &mut Obj, key: &str) -> Result<Vec<String>> {
    let mut out: Vec<(String, std::net::IpAddr, u8)> = Vec::new();
    for (i, item) in s.list(key)?.unwrap_or_default().into_iter().enumerate() {
        let mut o = Obj::new(&format!("spec.{key}[{i}]"), item)?;
        let path = o.path_of("cidr");
        let cidr = o
            .str("cidr")?
            .ok_or_else(|| FieldError::new(&path, "required"))?;
        let (addr, len) = network(&path, cidr.trim())?;
        o.finish()?;
        if let Some(j) = out.iter().position(|(_, a, l)| {
            let shorter = len.min(*l);
            a.is_ipv4() == addr.is_ipv4() && masked(*a, shorter) == masked(addr, shorter)
        }) {
            return Err(FieldError::new(
                path,
                format!(
                    "{} overlaps spec.{key}[{j}].cidr ({})",
                    cidr.trim(),
                    out[j].0
                ),
            ));
        }
        out.push((cidr.trim().to_owned(), addr, len));
    }
    Ok(out.into_iter().map(|(c, _, _)| c).collect())
}

/// `aa:nn` with 16-bit parts or `aa:nn:mm` with 32-bit parts (a large community).
pub fn is_community_value(v: &str) -> bool {
    let parts: Vec<&str> = v.split(':').collect();
    let all_digits = parts
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    all_digits
        && match parts.len() {
            2 => parts.iter().all(|p| p.parse::<u16>().is_ok()),
            3 => parts.iter().all(|p| p.parse::<u32>().is_ok()),
            _ => false,
        }
}

fn communities(s: &mut Obj) -> Result<Vec<pb::CommunityDef>> {
    let items = s.list("communities")?.unwrap_or_default();
    if items.len() > MAX_COMMUNITIES {
        return Err(FieldError::new(
            "spec.communities",
            format!("{} communities: at most {MAX_COMMUNITIES}", items.len()),
        ));
    }
    let mut out: Vec<pb::CommunityDef> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let mut o = Obj::new(&format!("spec.communities[{i}]"), item)?;
        let name = o
            .str("name")?
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| FieldError::new(o.path_of("name"), "required"))?;
        if let Some(j) = out.iter().position(|c| c.name == name) {
            return Err(FieldError::new(
                o.path_of("name"),
                format!("{name:?} is already spec.communities[{j}]'s name"),
            ));
        }
        let value = o
            .str("value")?
            .ok_or_else(|| FieldError::new(o.path_of("value"), "required"))?;
        if !is_community_value(value.trim()) {
            return Err(FieldError::new(
                o.path_of("value"),
                format!(
                    "{value:?} is not a community: aa:nn (standard, each 0-65535) or aa:nn:mm \
                     (large, each 0-4294967295)"
                ),
            ));
        }
        o.finish()?;
        out.push(pb::CommunityDef {
            name,
            value: value.trim().to_owned(),
        });
    }
    Ok(out)
}

fn prefix_advertisements(
    s: &mut Obj,
    defined: &[pb::CommunityDef],
) -> Result<Vec<pb::PrefixAdvertisement>> {
    let items = s.list("prefixAdvertisements")?.unwrap_or_default();
    if items.len() > MAX_PREFIX_ADVERTISEMENTS {
        return Err(FieldError::new(
            "spec.prefixAdvertisements",
            format!(
                "{} prefix advertisements: at most {MAX_PREFIX_ADVERTISEMENTS}",
                items.len()
            ),
        ));
    }
    let mut out = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let mut o = Obj::new(&format!("spec.prefixAdvertisements[{i}]"), item)?;
        let path = o.path_of("cidr");
        let cidr = o
            .str("cidr")?
            .ok_or_else(|| FieldError::new(&path, "required"))?;
        network(&path, cidr.trim())?;
        let list = o.list("communities")?.unwrap_or_default();
        if list.len() > MAX_COMMUNITIES_PER_PREFIX {
            return Err(FieldError::new(
                o.path_of("communities"),
                format!(
                    "{} communities: at most {MAX_COMMUNITIES_PER_PREFIX} per prefix",
                    list.len()
                ),
            ));
        }
        let mut communities = Vec::new();
        for (k, c) in list.iter().enumerate() {
            let path = format!("{}[{k}]", o.path_of("communities"));
            let c = c
                .as_str()
                .ok_or_else(|| FieldError::new(&path, "must be a community's name or value"))?
                .trim();
            if !defined.iter().any(|d| d.name == c) && !is_community_value(c) {
                return Err(FieldError::new(
                    path,
                    format!(
                        "{c:?} is neither the name of one of spec.communities nor a community \
                         value (aa:nn or aa:nn:mm)"
                    ),
                ));
            }
            communities.push(c.to_owned());
        }
        o.finish()?;
        out.push(pb::PrefixAdvertisement {
            cidr: cidr.trim().to_owned(),
            communities,
        });
    }
    Ok(out)
}

impl ConfigSpec {
    /// The configuration to set, keeping `current`'s margay-only settings.
    pub fn request(&self, current: &pb::BgpConfiguration) -> pb::BgpConfiguration {
        pb::BgpConfiguration {
            as_number: self.as_number,
            node_to_node_mesh: self.node_to_node_mesh,
            listen_port: self.listen_port,
            service_cluster_cidrs: self.service_cluster_ips.clone(),
            service_external_cidrs: self.service_external_ips.clone(),
            service_load_balancer_cidrs: self.service_load_balancer_ips.clone(),
            communities: self.communities.clone(),
            prefix_advertisements: self.prefix_advertisements.clone(),
            revision: if self.revision != 0 {
                self.revision
            } else {
                current.revision
            },
            ..current.clone()
        }
    }
}

pub fn to_document(c: &pb::BgpConfiguration) -> Value {
    let mut spec = json!({
        "nodeToNodeMeshEnabled": c.node_to_node_mesh.unwrap_or(true),
    });
    if c.as_number != 0 {
        spec["asNumber"] = json!(c.as_number);
    }
    if c.listen_port != 0 {
        spec["listenPort"] = json!(c.listen_port);
    }
    for (key, list) in [
        ("serviceClusterIPs", &c.service_cluster_cidrs),
        ("serviceExternalIPs", &c.service_external_cidrs),
        ("serviceLoadBalancerIPs", &c.service_load_balancer_cidrs),
    ] {
        if !list.is_empty() {
            spec[key] = list.iter().map(|c| json!({ "cidr": c })).collect();
        }
    }
    if !c.communities.is_empty() {
        spec["communities"] = c
            .communities
            .iter()
            .map(|d| json!({ "name": d.name, "value": d.value }))
            .collect();
    }
    if !c.prefix_advertisements.is_empty() {
        spec["prefixAdvertisements"] = c
            .prefix_advertisements
            .iter()
            .map(|a| json!({ "cidr": a.cidr, "communities": a.communities }))
            .collect();
    }
    document_value(Kind::BgpConfiguration, "default", c.revision, spec)
}
