//! Conversions between the contract's messages and the `ipam` crate's types (pools, nodes,
//! allocations, BGPFilter and BGPPeer resources), and the mapping of IPAM errors to gRPC
//! status codes: validation → INVALID_ARGUMENT naming the field (down to a list item's,
//! `filter.exportV4[0].cidr`), missing → NOT_FOUND, a lost compare-and-swap → ABORTED.

use std::net::IpAddr;

use ::datastore::contract::{StoreError, Version};
use ::datastore::model::{self, AllowedUse, AssignmentMode, EncapMode, IpPool, Node};
use ipam::IpamError;
use ipam::allocator::{Assigned, BlockUsage, PoolUsage};
use ipam::block::AffinityState;
use ipnet::IpNet;
use proto::v1 as pb;
use tonic::Status;

/// The status of a call that needs the datastore while it is not connected: which one, and
/// how it is.
pub fn unavailable(datastore: &crate::datastore::DatastoreHandle) -> Status {
    Status::unavailable(format!(
        "datastore {} unavailable: {:?}",
        datastore.describe(),
        datastore.state()
    ))
}

/// The gRPC status of an IPAM or resource error (the resource layer's errors are IPAM's of
/// the same name).
pub fn status(e: impl Into<IpamError>) -> Status {
    let e: IpamError = e.into();
    match &e {
        IpamError::InvalidArgument { .. } => Status::invalid_argument(e.to_string()),
        IpamError::NotFound(_) => Status::not_found(e.to_string()),
        IpamError::AlreadyExists(_) => Status::already_exists(e.to_string()),
        IpamError::InUse(_) => Status::failed_precondition(e.to_string()),
        IpamError::Exhausted(_) => Status::resource_exhausted(e.to_string()),
        IpamError::Contention { .. } | IpamError::Stale(_) => Status::aborted(e.to_string()),
        IpamError::Store(StoreError::Conflict { .. }) => Status::aborted(e.to_string()),
        IpamError::Store(StoreError::Unavailable(_)) => Status::unavailable(e.to_string()),
        IpamError::Store(_) | IpamError::Decode(_) => Status::internal(e.to_string()),
    }
}

pub fn invalid(field: &str, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("invalid {field}: {reason}"))
}

/// A field that names something: empty is a mistake of the request, not an unknown name.
pub fn required<'a>(field: &str, text: &'a str) -> Result<&'a str, Status> {
    if text.trim().is_empty() {
        Err(invalid(field, "required"))
    } else {
        Ok(text)
    }
}

/// An AS number: 4294967295 is reserved (RFC 7300) and never a node's or a peer's.
pub fn asn(field: &str, v: u32) -> Result<u32, Status> {
    if v == u32::MAX {
        Err(invalid(field, "AS 4294967295 is reserved (RFC 7300)"))
    } else {
        Ok(v)
    }
}

pub fn parse_addr(field: &str, text: &str) -> Result<IpAddr, Status> {
    text.parse()
        .map_err(|_| invalid(field, format!("{text:?} is not an IP address")))
}

fn encap_from(field: &str, v: i32) -> Result<EncapMode, Status> {
    match pb::EncapMode::try_from(v) {
        Ok(pb::EncapMode::Unspecified | pb::EncapMode::Never) => Ok(EncapMode::Never),
        Ok(pb::EncapMode::Always) => Ok(EncapMode::Always),
        Ok(pb::EncapMode::CrossSubnet) => Ok(EncapMode::CrossSubnet),
        Err(_) => Err(invalid(field, format!("unknown mode {v}"))),
    }
}

fn encap_to(m: EncapMode) -> i32 {
    match m {
        EncapMode::Never => pb::EncapMode::Never,
        EncapMode::Always => pb::EncapMode::Always,
        EncapMode::CrossSubnet => pb::EncapMode::CrossSubnet,
    }
    .into()
}

pub fn pool_from(p: &pb::IpPool) -> Result<IpPool, Status> {
    let cidr: IpNet = p.cidr.parse().map_err(|_| {
        invalid(
            "cidr",
            format!("{:?} is not a CIDR like 172.20.0.0/16", p.cidr),
        )
    })?;
    let mut pool = IpPool::new(&p.name, cidr);
    if p.block_size != 0 {
        pool.block_size =
            u8::try_from(p.block_size).map_err(|_| invalid("block_size", p.block_size))?;
    }
    pool.vxlan_mode = encap_from("vxlan_mode", p.vxlan_mode)?;
    pool.ipip_mode = encap_from("ipip_mode", p.ipip_mode)?;
    pool.nat_outgoing = p.nat_outgoing;
    pool.disabled = p.disabled;
    pool.disable_bgp_export = p.disable_bgp_export;
    pool.node_selector = p.node_selector.clone();
    if !p.allowed_uses.is_empty() {
        pool.allowed_uses = p
            .allowed_uses
            .iter()
            .map(|u| match pb::AllowedUse::try_from(*u) {
                Ok(pb::AllowedUse::Workload) => Ok(AllowedUse::Workload),
                Ok(pb::AllowedUse::Tunnel) => Ok(AllowedUse::Tunnel),
                _ => Err(invalid("allowed_uses", format!("unknown use {u}"))),
            })
            .collect::<Result<_, _>>()?;
    }
    pool.assignment_mode = match pb::AssignmentMode::try_from(p.assignment_mode) {
        Ok(pb::AssignmentMode::Manual) => AssignmentMode::Manual,
        Ok(_) => AssignmentMode::Automatic,
        Err(_) => return Err(invalid("assignment_mode", p.assignment_mode)),
    };
    Ok(pool)
}

pub fn pool_to(p: &IpPool, rev: Version) -> pb::IpPool {
    pb::IpPool {
        name: p.name.clone(),
        cidr: p.cidr.to_string(),
        block_size: p.block_size.into(),
        vxlan_mode: encap_to(p.vxlan_mode),
        ipip_mode: encap_to(p.ipip_mode),
        nat_outgoing: p.nat_outgoing,
        disabled: p.disabled,
        disable_bgp_export: p.disable_bgp_export,
        node_selector: p.node_selector.clone(),
        allowed_uses: p
            .allowed_uses
            .iter()
            .map(|u| match u {
                AllowedUse::Workload => pb::AllowedUse::Workload.into(),
                AllowedUse::Tunnel => pb::AllowedUse::Tunnel.into(),
            })
            .collect(),
        assignment_mode: match p.assignment_mode {
            AssignmentMode::Automatic => pb::AssignmentMode::Automatic.into(),
            AssignmentMode::Manual => pb::AssignmentMode::Manual.into(),
        },
        revision: rev.to_wire(),
    }
}

fn opt(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

pub fn node_from(n: &pb::Node) -> Result<Node, Status> {
    model::validate_name("name", &n.name).map_err(status)?;
    let mut node = Node::new(&n.name);
    node.ipv4 = opt(&n.ipv4_address)
        .map(|a| {
            a.parse().map_err(|_| {
                invalid(
                    "ipv4_address",
                    format!("{a:?} is not an IPv4 address with prefix length"),
                )
            })
        })
        .transpose()?;
    node.ipv6 = opt(&n.ipv6_address)
        .map(|a| {
            a.parse().map_err(|_| {
                invalid(
                    "ipv6_address",
                    format!("{a:?} is not an IPv6 address with prefix length"),
                )
            })
        })
        .transpose()?;
    node.asn = (asn("as_number", n.as_number)? != 0).then_some(n.as_number);
    node.labels = n.labels.clone().into_iter().collect();
    node.vxlan_tunnel_address = opt(&n.vxlan_tunnel_address)
        .map(|a| parse_addr("vxlan_tunnel_address", a))
        .transpose()?;
    let mac = |field: &str, m: &str| match proto::mac::parse_mac(m) {
        Some(_) => Ok(m.to_owned()),
        None => Err(invalid(
            field,
            format!("{m:?} is not a MAC like aa:bb:cc:dd:ee:ff"),
        )),
    };
    node.vxlan_tunnel_mac = opt(&n.vxlan_tunnel_mac)
        .map(|m| mac("vxlan_tunnel_mac", m))
        .transpose()?;
    node.vxlan_tunnel_address_v6 = opt(&n.vxlan_tunnel_address_v6)
        .map(|a| parse_addr("vxlan_tunnel_address_v6", a))
        .transpose()?;
    node.vxlan_tunnel_mac_v6 = opt(&n.vxlan_tunnel_mac_v6)
        .map(|m| mac("vxlan_tunnel_mac_v6", m))
        .transpose()?;
    node.route_reflector_cluster_id = opt(&n.route_reflector_cluster_id)
        .map(|a| {
            a.parse().map_err(|_| {
                invalid(
                    "route_reflector_cluster_id",
                    format!("{a:?} is not a dotted quad"),
                )
            })
        })
        .transpose()?;
    Ok(node)
}

pub fn node_to(n: &Node, rev: Version) -> pb::Node {
    pb::Node {
        name: n.name.clone(),
        ipv4_address: n.ipv4.map(|a| a.to_string()).unwrap_or_default(),
        ipv6_address: n.ipv6.map(|a| a.to_string()).unwrap_or_default(),
        as_number: n.asn.unwrap_or(0),
        labels: n.labels.clone().into_iter().collect(),
        vxlan_tunnel_address: n
            .vxlan_tunnel_address
            .map(|a| a.to_string())
            .unwrap_or_default(),
        vxlan_tunnel_mac: n.vxlan_tunnel_mac.clone().unwrap_or_default(),
        vxlan_tunnel_address_v6: n
            .vxlan_tunnel_address_v6
            .map(|a| a.to_string())
            .unwrap_or_default(),
        vxlan_tunnel_mac_v6: n.vxlan_tunnel_mac_v6.clone().unwrap_or_default(),
        route_reflector_cluster_id: n
            .route_reflector_cluster_id
            .map(|a| a.to_string())
            .unwrap_or_default(),
        revision: rev.to_wire(),
    }
}

pub fn allocation_to(a: &Assigned) -> pb::Allocation {
    pb::Allocation {
        address: a.address.to_string(),
        block: a.block.to_string(),
        pool: a.pool.clone(),
        borrowed: a.borrowed,
        handle: a.handle.clone(),
        sequence: a.seq,
        attributes: a.attrs.clone().into_iter().collect(),
    }
}

pub fn pool_usage_to(u: &PoolUsage) -> pb::PoolUsage {
    let size = u64::try_from(u.size).unwrap_or(u64::MAX);
    pb::PoolUsage {
        name: u.name.clone(),
        cidr: u.cidr.to_string(),
        size,
        used: u.used,
        free: size.saturating_sub(u.used),
        blocks: u.blocks,
    }
}

pub fn block_usage_to(b: &BlockUsage) -> pb::BlockUsage {
    pb::BlockUsage {
        cidr: b.cidr.to_string(),
        pool: b.pool.clone(),
        affinity: b.affinity.clone().unwrap_or_default(),
        state: match b.state {
            Some(AffinityState::Pending) => pb::BlockState::Pending,
            Some(AffinityState::Confirmed) => pb::BlockState::Confirmed,
            Some(AffinityState::PendingDeletion) => pb::BlockState::PendingDeletion,
            None => pb::BlockState::Unspecified,
        }
        .into(),
        used: b.used,
        free: b.free,
        borrowed: b.borrowed,
    }
}

/// A `BGPFilter` message as the model's, each unparsable field named by its path
/// (`filter.exportV4[0].cidr`); the rules' own checks are `BgpFilter::check`'s.
pub fn filter_from(f: &pb::BgpFilter) -> Result<model::BgpFilter, Status> {
    let list = |name: &str, rules: &[pb::BgpFilterRule]| {
        rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule_from(&format!("filter.{name}[{i}]"), r))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(model::BgpFilter {
        name: f.name.clone(),
        export_v4: list("exportV4", &f.export_v4)?,
        import_v4: list("importV4", &f.import_v4)?,
        export_v6: list("exportV6", &f.export_v6)?,
        import_v6: list("importV6", &f.import_v6)?,
    })
}

fn rule_from(path: &str, r: &pb::BgpFilterRule) -> Result<model::BgpFilterRule, Status> {
    use model::{FilterAction, FilterSource, MatchOperator};
    let field = |f: &str| format!("{path}.{f}");
    let cidr = opt(r.cidr.trim())
        .map(|c| {
            c.parse::<IpNet>().map_err(|_| {
                invalid(
                    &field("cidr"),
                    format!("{c:?} is not a CIDR like 10.0.0.0/16"),
                )
            })
        })
        .transpose()?;
    let match_operator = match r.match_operator.as_str() {
        "" => None,
        "Equal" => Some(MatchOperator::Equal),
        "NotEqual" => Some(MatchOperator::NotEqual),
        "In" => Some(MatchOperator::In),
        "NotIn" => Some(MatchOperator::NotIn),
        other => {
            return Err(invalid(
                &field("matchOperator"),
                format!("unknown value {other:?}: one of Equal, NotEqual, In, NotIn"),
            ));
        }
    };
    let length = |f: &str, v: Option<u32>| {
        v.map(|v| {
            u8::try_from(v)
                .map_err(|_| invalid(&field(f), format!("{v} is above 128, the longest prefix")))
        })
        .transpose()
    };
    let source = match r.source.as_str() {
        "" => None,
        "RemotePeers" => Some(FilterSource::RemotePeers),
        other => {
            return Err(invalid(
                &field("source"),
                format!("unknown value {other:?}: RemotePeers is the only one"),
            ));
        }
    };
    let action = match r.action.as_str() {
        "Accept" => FilterAction::Accept,
        "Reject" => FilterAction::Reject,
        "" => return Err(invalid(&field("action"), "required: Accept or Reject")),
        other => {
            return Err(invalid(
                &field("action"),
                format!("unknown value {other:?}: Accept or Reject"),
            ));
        }
    };
    Ok(model::BgpFilterRule {
        cidr,
        match_operator,
        prefix_length_min: length("prefixLength.min", r.prefix_length_min)?,
        prefix_length_max: length("prefixLength.max", r.prefix_length_max)?,
        source,
        interface: opt(&r.interface).map(str::to_owned),
        action,
    })
}

pub fn filter_to(f: &model::BgpFilter, rev: Version) -> pb::BgpFilter {
    let list = |rules: &[model::BgpFilterRule]| rules.iter().map(rule_to).collect();
    pb::BgpFilter {
        name: f.name.clone(),
        export_v4: list(&f.export_v4),
        import_v4: list(&f.import_v4),
        export_v6: list(&f.export_v6),
        import_v6: list(&f.import_v6),
        revision: rev.to_wire(),
    }
}

fn rule_to(r: &model::BgpFilterRule) -> pb::BgpFilterRule {
    use model::{FilterAction, MatchOperator};
    pb::BgpFilterRule {
        cidr: r.cidr.map(|c| c.to_string()).unwrap_or_default(),
        match_operator: match r.match_operator {
            None => "",
            Some(MatchOperator::Equal) => "Equal",
            Some(MatchOperator::NotEqual) => "NotEqual",
            Some(MatchOperator::In) => "In",
            Some(MatchOperator::NotIn) => "NotIn",
        }
        .into(),
        prefix_length_min: r.prefix_length_min.map(u32::from),
        prefix_length_max: r.prefix_length_max.map(u32::from),
        source: match r.source {
            Some(model::FilterSource::RemotePeers) => "RemotePeers",
            None => "",
        }
        .into(),
        interface: r.interface.clone().unwrap_or_default(),
        action: match r.action {
            FilterAction::Accept => "Accept",
            FilterAction::Reject => "Reject",
        }
        .into(),
    }
}

pub fn next_hop_mode_from(field: &str, v: i32) -> Result<model::NextHopMode, Status> {
    match pb::NextHopMode::try_from(v) {
        Ok(pb::NextHopMode::Auto) => Ok(model::NextHopMode::Auto),
        Ok(pb::NextHopMode::Self_) => Ok(model::NextHopMode::SelfNextHop),
        Ok(pb::NextHopMode::Keep) => Ok(model::NextHopMode::Keep),
        Err(_) => Err(invalid(field, format!("unknown mode {v}"))),
    }
}

pub fn next_hop_mode_to(m: model::NextHopMode) -> i32 {
    match m {
        model::NextHopMode::Auto => pb::NextHopMode::Auto,
        model::NextHopMode::SelfNextHop => pb::NextHopMode::Self_,
        model::NextHopMode::Keep => pb::NextHopMode::Keep,
    }
    .into()
}

/// A stored `BGPPeer` resource as the API shows it: origin Resource, the password hidden.
pub fn bgp_peer_to(p: &model::BgpPeer) -> pb::BgpPeer {
    pb::BgpPeer {
        name: p.name.clone(),
        peer_address: p.peer_address.to_string(),
        as_number: p.as_number,
        node: p.node.clone(),
        passive: p.passive,
        password: if p.password.is_empty() {
            String::new()
        } else {
            "*****".into()
        },
        ttl_security_hops: p.ttl_security_hops.into(),
        keepalive_time_s: p.keepalive_time_s.into(),
        hold_time_s: p.hold_time_s.into(),
        max_prefixes: p.max_prefixes,
        port: p.port.into(),
        origin: pb::PeerOrigin::Resource.into(),
        bfd_min_rx_ms: p.bfd.map_or(0, |b| b.min_rx_ms),
        bfd_min_tx_ms: p.bfd.map_or(0, |b| b.min_tx_ms),
        bfd_multiplier: p.bfd.map_or(0, |b| b.multiplier),
        filters: p.filters.clone(),
        next_hop_mode: next_hop_mode_to(p.next_hop_mode),
        local_as_number: p.local_as_number.unwrap_or(0),
        num_allowed_local_as_numbers: p.num_allowed_local_as_numbers.into(),
        max_restart_time_s: p.max_restart_time_s.map_or(0, u32::from),
        reachable_by: p.reachable_by.map(|a| a.to_string()).unwrap_or_default(),
        ..Default::default()
    }
}

/// A model check's refusal as INVALID_ARGUMENT, its path under `prefix` (`filter.`).
pub fn invalid_field(prefix: &str, e: model::InvalidField) -> Status {
    invalid(&format!("{prefix}{}", e.path), e.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(cidr: &str, op: &str, action: &str) -> pb::BgpFilterRule {
        pb::BgpFilterRule {
            cidr: cidr.into(),
            match_operator: op.into(),
            action: action.into(),
            ..Default::default()
        }
    }

    #[test]
    fn bgp_filters_convert_both_ways_and_name_bad_fields() {
        let m = pb::BgpFilter {
            name: "f".into(),
            export_v4: vec![
                pb::BgpFilterRule {
                    prefix_length_min: Some(16),
                    prefix_length_max: Some(24),
                    source: "RemotePeers".into(),
                    interface: "eth*".into(),
                    ..rule("10.0.0.0/8", "In", "Accept")
                },
                rule("", "", "Reject"),
            ],
            import_v6: vec![rule("fd00::/8", "NotEqual", "Accept")],
            revision: 4,
            ..Default::default()
        };
        let f = filter_from(&m).unwrap();
        f.validate().unwrap();
        assert_eq!(
            f.export_v4[1],
            model::BgpFilterRule::new(model::FilterAction::Reject)
        );
        assert_eq!(filter_to(&f, Version::from_wire(4)), m);
        for (change, want) in [
            (
                rule("10.0.0.0/8", "Within", "Accept"),
                "invalid filter.exportV4[0].matchOperator: unknown value \"Within\"",
            ),
            (
                rule("10.0.0.0/8", "In", ""),
                "invalid filter.exportV4[0].action: required",
            ),
            (
                rule("10.0.0.0/8", "In", "Drop"),
                "invalid filter.exportV4[0].action: unknown value \"Drop\"",
            ),
            (
                rule("10.0.0/8", "In", "Accept"),
                "invalid filter.exportV4[0].cidr: \"10.0.0/8\" is not a CIDR",
            ),
            (
                pb::BgpFilterRule {
                    source: "LocalPeers".into(),
                    ..rule("", "", "Accept")
                },
                "invalid filter.exportV4[0].source: unknown value \"LocalPeers\"",
            ),
            (
                pb::BgpFilterRule {
                    prefix_length_max: Some(300),
                    ..rule("10.0.0.0/8", "In", "Accept")
                },
                "invalid filter.exportV4[0].prefixLength.max: 300 is above 128",
            ),
        ] {
            let bad = pb::BgpFilter {
                name: "f".into(),
                export_v4: vec![change],
                ..Default::default()
            };
            let e = filter_from(&bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with(want), "{}", e.message());
        }
    }

    #[test]
    fn stored_bgp_peers_show_as_resources_with_the_password_hidden() {
        let mut p = model::BgpPeer::new("tor", "node-1", "10.0.0.254".parse().unwrap(), 65000);
        p.password = "secret".into();
        p.next_hop_mode = model::NextHopMode::SelfNextHop;
        p.max_restart_time_s = Some(90);
        p.filters = vec!["a".into()];
        let m = bgp_peer_to(&p);
        assert_eq!(m.origin, pb::PeerOrigin::Resource as i32);
        assert_eq!(m.password, "*****");
        assert_eq!(m.next_hop_mode, pb::NextHopMode::Self_ as i32);
        assert_eq!(
            next_hop_mode_from("x", m.next_hop_mode).unwrap(),
            p.next_hop_mode
        );
        assert_eq!((m.max_restart_time_s, m.filters.len()), (90, 1));
        assert!(next_hop_mode_from("peer.next_hop_mode", 9).is_err());
    }
}
