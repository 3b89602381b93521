//! BGPPeer ⇄ `BgpPeer` with origin Resource: stored by bgpd, and every node it concerns (the
//! one named in `spec.node`, or all when none is) opens the session.
//!
//! `keepOriginalNextHop: true` is `nextHopMode: Keep`. Calico applies the old field to eBGP
//! sessions only, but on iBGP sessions keeping the next hop is what Auto does anyway, so the
//! two agree; `get` prints `nextHopMode`. Giving both fields is refused, as Calico does.
//! Whether the BGPFilters named in `filters` exist is `commands`' check (against bgpd).

use std::net::IpAddr;

use proto::v1 as pb;
use serde_json::{Value, json};

use super::fields::{FieldError, Result, as_number, duration_s, duration_text};
use super::ippool::validate_name;
use super::{Document, Kind, document_value, parts, plain_metadata};

#[expect(
    clippy::too_many_lines,
    reason = "reads a BGPPeer's spec field by field, in the order its refusals name them; one Calico field after another"
)]
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
    let keep = s.bool("keepOriginalNextHop")?;
    let mode = s.choice("nextHopMode", &["Auto", "Self", "Keep"])?;
    if keep.is_some() && mode.is_some() {
        return Err(FieldError::new(
            "spec.keepOriginalNextHop",
            "give nextHopMode or the deprecated keepOriginalNextHop, not both (Calico refuses \
             both too)",
        ));
    }
    let next_hop_mode = match (keep, mode) {
        (Some(true), _) | (_, Some("Keep")) => pb::NextHopMode::Keep,
        (_, Some("Self")) => pb::NextHopMode::Self_,
        _ => pb::NextHopMode::Auto,
    };
    let mut filters = Vec::new();
    for (i, f) in s.list("filters")?.unwrap_or_default().iter().enumerate() {
        let path = format!("spec.filters[{i}]");
        let name = f
            .as_str()
            .ok_or_else(|| FieldError::new(&path, "must be the name of a BGPFilter"))?;
        validate_name(name).map_err(|e| FieldError::new(&path, e.message))?;
        filters.push(name.to_owned());
    }
    let local_as = match s.take("localASNumber") {
        Some(v) => match super::fields::as_number("spec.localASNumber", v)? {
            23456 => {
                return Err(FieldError::new(
                    "spec.localASNumber",
                    "AS_TRANS 23456 cannot be a local AS",
                ));
            }
            n => n,
        },
        None => 0,
    };
    let allowed_local = s.uint("numAllowedLocalASNumbers", 255)?.unwrap_or(0) as u32;
    let max_restart = match s.str("maxRestartTime")? {
        Some(d) => match duration_s("spec.maxRestartTime", &d)? {
            t @ 1..=4095 => t as u32,
            t => {
                return Err(FieldError::new(
                    "spec.maxRestartTime",
                    format!(
                        "{t}s is outside 1s-4095s (the graceful-restart capability's restart \
                         time has 12 bits, RFC 4724)"
                    ),
                ));
            }
        },
        None => 0,
    };
    let reachable_by = match s.str("reachableBy")?.filter(|r| !r.trim().is_empty()) {
        Some(r) => {
            let gw: IpAddr = r.trim().parse().map_err(|_| {
                FieldError::new("spec.reachableBy", format!("{r:?} is not an IP address"))
            })?;
            if gw.is_ipv4() != address.is_ipv4() {
                return Err(FieldError::new(
                    "spec.reachableBy",
                    format!("{gw} is not of the family of spec.peerIP ({address})"),
                ));
            }
            gw.to_string()
        }
        None => String::new(),
    };
    let not_stored = "not supported yet for BGPPeer resources (bgpd does not store it)";
    s.refuse("restartMode", not_stored, &[json!("GracefulRestart")])?;
    s.refuse("sourceAddress", not_stored, &[])?;
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
        filters,
        next_hop_mode: next_hop_mode as i32,
        local_as_number: local_as,
        num_allowed_local_as_numbers: allowed_local,
        max_restart_time_s: max_restart,
        reachable_by,
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

/// The settings of a stored BGPPeer resource that its document cannot show (set through
/// `AddPeer` with origin Resource, not from a Calico file).
pub fn not_in_document(p: &pb::BgpPeer) -> Vec<&'static str> {
    [
        (!p.password.is_empty(), "password"),
        (p.passive, "passive"),
        (p.hold_time_s != 0, "hold time"),
        (p.max_prefixes != 0, "max prefixes"),
        (p.bfd_multiplier != 0, "BFD"),
    ]
    .into_iter()
    .filter_map(|(set, what)| set.then_some(what))
    .collect()
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
    if !p.filters.is_empty() {
        spec["filters"] = json!(p.filters);
    }
    match pb::NextHopMode::try_from(p.next_hop_mode) {
        Ok(pb::NextHopMode::Self_) => spec["nextHopMode"] = json!("Self"),
        Ok(pb::NextHopMode::Keep) => spec["nextHopMode"] = json!("Keep"),
        _ => {}
    }
    if p.local_as_number != 0 {
        spec["localASNumber"] = json!(p.local_as_number);
    }
    if p.num_allowed_local_as_numbers != 0 {
        spec["numAllowedLocalASNumbers"] = json!(p.num_allowed_local_as_numbers);
    }
    if p.max_restart_time_s != 0 {
        spec["maxRestartTime"] = json!(duration_text(p.max_restart_time_s));
    }
    if !p.reachable_by.is_empty() {
        spec["reachableBy"] = json!(p.reachable_by);
    }
    document_value(Kind::BgpPeer, &p.name, 0, spec)
}
