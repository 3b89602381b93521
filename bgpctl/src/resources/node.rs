//! Node ⇄ `Node`: the BGP fields (`spec.bgp`) and the labels. The VXLAN tunnel addresses and
//! MACs are margay's IPAM's to assign: a document may carry them (as `get` prints them) only
//! with the values bgpd already has. Applying keeps them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use proto::v1 as pb;
use serde_json::{Map, Value, json};

use super::fields::{FieldError, Obj, Result, as_number};
use super::{Document, Kind, document_value, ippool::validate_name, parts};

/// Reads one of a node's tunnel fields.
type TunnelField = fn(&pb::Node) -> &String;

pub struct NodeSpec {
    pub node: pb::Node,
    /// Tunnel fields the document gave: (path, value, which field of `pb::Node`).
    tunnels: Vec<(&'static str, String, TunnelField)>,
}

const TUNNEL_FIELDS: [(&str, &str, TunnelField); 4] = [
    ("ipv4VXLANTunnelAddr", "spec.ipv4VXLANTunnelAddr", |n| {
        &n.vxlan_tunnel_address
    }),
    ("vxlanTunnelMACAddr", "spec.vxlanTunnelMACAddr", |n| {
        &n.vxlan_tunnel_mac
    }),
    ("ipv6VXLANTunnelAddr", "spec.ipv6VXLANTunnelAddr", |n| {
        &n.vxlan_tunnel_address_v6
    }),
    ("vxlanTunnelMACAddrV6", "spec.vxlanTunnelMACAddrV6", |n| {
        &n.vxlan_tunnel_mac_v6
    }),
];

pub fn from_document(doc: &Document) -> Result<NodeSpec> {
    let p = parts(doc, &["status"])?;
    validate_name(&doc.name)?;
    let mut m = p.metadata;
    let labels = labels(&mut m)?;
    m.refuse(
        "annotations",
        "not stored for Node resources by margay",
        &[json!({})],
    )?;
    m.finish()?;
    let mut s = p.spec;
    let mut node = pb::Node {
        name: doc.name.clone(),
        labels,
        revision: p.revision,
        ..Default::default()
    };
    if let Some(mut bgp) = s.obj("bgp")? {
        if let Some(a) = bgp.str("ipv4Address")? {
            node.ipv4_address = interface_address("spec.bgp.ipv4Address", &a, true)?;
        }
        if let Some(a) = bgp.str("ipv6Address")? {
            node.ipv6_address = interface_address("spec.bgp.ipv6Address", &a, false)?;
        }
        if let Some(v) = bgp.take("asNumber") {
            node.as_number = as_number("spec.bgp.asNumber", v)?;
        }
        if let Some(id) = bgp.str("routeReflectorClusterID")? {
            id.parse::<Ipv4Addr>().map_err(|_| {
                FieldError::new(
                    "spec.bgp.routeReflectorClusterID",
                    format!("{id:?} is not a cluster id (a dotted quad, e.g. 224.0.0.1)"),
                )
            })?;
            node.route_reflector_cluster_id = id;
        }
        bgp.refuse(
            "ipv4IPIPTunnelAddr",
            "not supported on this kernel (no ipip)",
            &[json!("")],
        )?;
        bgp.finish()?;
    }
    let mut tunnels = Vec::new();
    for (key, path, field) in TUNNEL_FIELDS {
        if let Some(v) = s.str(key)?.filter(|v| !v.is_empty()) {
            tunnels.push((path, v, field));
        }
    }
    let unsupported = "not supported by margay";
    s.refuse("orchRefs", unsupported, &[json!([])])?;
    s.refuse("addresses", unsupported, &[json!([])])?;
    s.refuse(
        "wireguard",
        "not supported yet (no WireGuard)",
        &[json!({})],
    )?;
    s.refuse("interfaceName", unsupported, &[json!("")])?;
    s.finish()?;
    Ok(NodeSpec { node, tunnels })
}

fn labels(m: &mut Obj) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    match m.take("labels") {
        None => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let Value::String(s) = v else {
                    return Err(FieldError::new(
                        format!("metadata.labels.{k}"),
                        "must be a string (quote numbers and booleans)",
                    ));
                };
                out.insert(k, s);
            }
        }
        Some(_) => return Err(FieldError::new("metadata.labels", "must be a mapping")),
    }
    Ok(out)
}

/// An address with its prefix length (the prefix decides which nodes are on the same subnet);
/// a bare address is taken as a host route, as Calico does.
fn interface_address(path: &str, s: &str, v4: bool) -> Result<String> {
    let (a, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let family = if v4 { "IPv4" } else { "IPv6" };
    let addr: IpAddr = a
        .parse()
        .ok()
        .filter(|a: &IpAddr| a.is_ipv4() == v4)
        .ok_or_else(|| FieldError::new(path, format!("{a:?} is not an {family} address")))?;
    let bits = if v4 { 32 } else { 128 };
    let prefix = match prefix {
        None => bits,
        Some(p) => p.parse::<u8>().ok().filter(|p| *p <= bits).ok_or_else(|| {
            FieldError::new(path, format!("/{p} is not a prefix length (0-{bits})"))
        })?,
    };
    Ok(format!("{addr}/{prefix}"))
}

impl NodeSpec {
    /// The node to register: the document's fields, the stored node's tunnel addresses.
    pub fn request(&self, current: Option<&pb::Node>) -> Result<pb::Node> {
        let empty = pb::Node::default();
        let cur = current.unwrap_or(&empty);
        for (path, value, field) in &self.tunnels {
            if field(cur) != value {
                return Err(FieldError::new(
                    *path,
                    format!(
                        "{value}: assigned by margay's IPAM (now {:?}); leave it out",
                        field(cur)
                    ),
                ));
            }
        }
        let mut n = self.node.clone();
        n.vxlan_tunnel_address = cur.vxlan_tunnel_address.clone();
        n.vxlan_tunnel_mac = cur.vxlan_tunnel_mac.clone();
        n.vxlan_tunnel_address_v6 = cur.vxlan_tunnel_address_v6.clone();
        n.vxlan_tunnel_mac_v6 = cur.vxlan_tunnel_mac_v6.clone();
        if n.revision == 0 {
            n.revision = cur.revision;
        }
        Ok(n)
    }
}

pub fn to_document(n: &pb::Node) -> Value {
    let mut bgp = Map::new();
    let mut put = |k: &str, v: &str| {
        if !v.is_empty() {
            bgp.insert(k.into(), json!(v));
        }
    };
    put("ipv4Address", &n.ipv4_address);
    put("ipv6Address", &n.ipv6_address);
    put("routeReflectorClusterID", &n.route_reflector_cluster_id);
    if n.as_number != 0 {
        bgp.insert("asNumber".into(), json!(n.as_number));
    }
    let mut spec = json!({ "bgp": bgp });
    for (key, _, field) in TUNNEL_FIELDS {
        if !field(n).is_empty() {
            spec[key] = json!(field(n));
        }
    }
    let mut doc = document_value(Kind::Node, &n.name, n.revision, spec);
    if !n.labels.is_empty() {
        let labels: std::collections::BTreeMap<_, _> = n.labels.iter().collect();
        doc["metadata"]["labels"] = json!(labels);
    }
    doc
}
