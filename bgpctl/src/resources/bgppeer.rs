//! BGPPeer ⇄ `BgpPeer` with origin Resource: stored by bgpd, and every node it concerns (the
//! one named in `spec.node`, or all when none is) opens the session.

use std::net::IpAddr;

use proto::v1 as pb;
use serde_json::{Value, json};

use super::fields::{FieldError, Result, as_number, duration_s, duration_text};
use super::ippool::validate_name;
use super::{Document, Kind, document_value, parts, plain_metadata};

pub fn from_document(doc: &Document) -> Result<pb::BgpPeer> {
    let p = parts(doc, &[])?;
    if p.revision != 0 {
        return Err(FieldError::new(
            "metadata.resourceVersion",
            "BGPPeer resources have no revision in bgpd's API: leave it out",
        ));
    }
    plain_metadata(p.metadata, Kind::BgpPeer)?;
    validate_name(&doc.name)?;
    if doc.name.parse::<IpAddr>().is_ok() {
        // bgpd's DeletePeer takes an address as a session, not as a resource's name.
        return Err(FieldError::new(
            "metadata.name",
            "a BGPPeer may not be named like an IP address in margay (it could not be deleted \
             by name)",
        ));
    }
    let mut s = p.spec;
    let peer_ip = s
        .str("peerIP")?
        .ok_or_else(|| FieldError::new("spec.peerIP", "required (margay has no peerSelector)"))?;
    let (address, port) = peer_ip_port("spec.peerIP", &peer_ip)?;
    let as_number = match s.take("asNumber") {
        Some(v) => as_number("spec.asNumber", v)?,
        None => return Err(FieldError::new("spec.asNumber", "required")),
    };
    let ttl = s.uint("ttlSecurity", 255)?.unwrap_or(0) as u32;
    let keepalive = match s.str("keepaliveTime")? {
        Some(d) => u32::try_from(duration_s("spec.keepaliveTime", &d)?)
            .ok()
            .filter(|v| *v <= 65535)
            .ok_or_else(|| FieldError::new("spec.keepaliveTime", "at most 65535s"))?,
        None => 0,
    };
    let sel = "not supported yet: name the node (spec.node) or leave it out for every node";
    s.refuse("nodeSelector", sel, &[json!("")])?;
    s.refuse(
        "peerSelector",
        "not supported yet: peer with an address (spec.peerIP)",
        &[json!("")],
    )?;
    s.refuse(
        "password",
        "not supported: a secretKeyRef names a Kubernetes secret, and margay has no Kubernetes \
         datastore to read it from; give the password in bgpd's configuration ([[bgp.peers]] \
         password) instead",
        &[],
    )?;
    s.refuse("keepOriginalNextHop", "not supported yet", &[json!(false)])?;
    s.refuse("nextHopMode", "not supported yet", &[json!("Auto")])?;
    let not_stored = "not supported yet for BGPPeer resources (bgpd does not store it)";
    s.refuse("maxRestartTime", not_stored, &[])?;
    s.refuse("restartMode", not_stored, &[json!("GracefulRestart")])?;
    s.refuse("sourceAddress", not_stored, &[])?;
    s.refuse("numAllowedLocalASNumbers", not_stored, &[json!(0)])?;
    s.refuse(
        "failureDetectionMode",
        "not supported yet (no BFD for BGPPeer resources)",
        &[json!("None")],
    )?;
    s.refuse(
        "birdGatewayMode",
        "not supported (margay does not run BIRD)",
        &[],
    )?;
    s.refuse("reachableBy", not_stored, &[json!("")])?;
    s.refuse(
        "filters",
        "not supported yet (no BGPFilter resources)",
        &[json!([])],
    )?;
    s.refuse("localWorkloadSelector", "not supported yet", &[json!("")])?;
    s.refuse("reversePeering", not_stored, &[])?;
    let peer = pb::BgpPeer {
        name: doc.name.clone(),
        peer_address: address.to_string(),
        as_number,
        node: match s.str("node")? {
            Some(n) => {
                validate_name(&n).map_err(|e| FieldError::new("spec.node", e.message))?;
                n
            }
            None => String::new(),
        },
        port: u32::from(port),
        ttl_security_hops: ttl,
        keepalive_time_s: keepalive,
        origin: pb::PeerOrigin::Resource as i32,
        ..Default::default()
    };
    s.finish()?;
    Ok(peer)
}

/// `peerIP` as Calico writes it: an address, `address:port` for IPv4, `[address]:port` for IPv6.
/// Port 0 means the default (179).
pub fn peer_ip_port(path: &str, s: &str) -> Result<(IpAddr, u16)> {
    let bad = || {
        FieldError::new(
            path,
            format!("{s:?} is not an IP address, IPv4:port or [IPv6]:port"),
        )
    };
    let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad);
    let t = s.trim();
    if let Some(rest) = t.strip_prefix('[') {
        let (a, after) = rest.split_once(']').ok_or_else(bad)?;
        let addr: std::net::Ipv6Addr = a.parse().map_err(|_| bad())?;
        return match after {
            "" => Ok((IpAddr::V6(addr), 0)),
            _ => Ok((
                IpAddr::V6(addr),
                port(after.strip_prefix(':').ok_or_else(bad)?)?,
            )),
        };
    }
    if let Ok(a) = t.parse::<IpAddr>() {
        return Ok((a, 0));
    }
    let (a, p) = t.split_once(':').ok_or_else(bad)?;
    let addr: std::net::Ipv4Addr = a.parse().map_err(|_| bad())?;
    Ok((IpAddr::V4(addr), port(p)?))
}

/// The document of a stored BGPPeer resource (the inverse of `from_document`).
pub fn to_document(p: &pb::BgpPeer) -> Value {
    let ip = match (p.peer_address.parse::<IpAddr>(), p.port) {
        (_, 0 | 179) => p.peer_address.clone(),
        (Ok(IpAddr::V6(a)), port) => format!("[{a}]:{port}"),
        (_, port) => format!("{}:{port}", p.peer_address),
    };
    let mut spec = json!({ "peerIP": ip, "asNumber": p.as_number });
    if !p.node.is_empty() {
        spec["node"] = json!(p.node);
    }
    if p.ttl_security_hops != 0 {
        spec["ttlSecurity"] = json!(p.ttl_security_hops);
    }
    if p.keepalive_time_s != 0 {
        spec["keepaliveTime"] = json!(duration_text(p.keepalive_time_s));
    }
    document_value(Kind::BgpPeer, &p.name, 0, spec)
}
