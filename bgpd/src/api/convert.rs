//! Conversions between the contract's messages and the `ipam` crate's types, and the mapping
//! of IPAM errors to gRPC status codes: validation → INVALID_ARGUMENT naming the field,
//! missing → NOT_FOUND, a lost compare-and-swap → ABORTED.

use std::net::IpAddr;

use ipam::IpamError;
use ipam::allocator::{Assigned, BlockUsage, PoolUsage};
use ipam::block::AffinityState;
use ipam::model::{self, AllowedUse, AssignmentMode, EncapMode, IpPool, Node};
use ipam::store::{Revision, StoreError};
use ipnet::IpNet;
use proto::v1 as pb;
use tonic::Status;

pub fn status(e: IpamError) -> Status {
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

pub fn pool_to(p: &IpPool, rev: Revision) -> pb::IpPool {
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
        revision: rev.0,
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
    node.asn = (n.as_number != 0).then_some(n.as_number);
    node.labels = n.labels.clone().into_iter().collect();
    node.vxlan_tunnel_address = opt(&n.vxlan_tunnel_address)
        .map(|a| parse_addr("vxlan_tunnel_address", a))
        .transpose()?;
    node.vxlan_tunnel_mac = opt(&n.vxlan_tunnel_mac).map(str::to_owned);
    node.vxlan_tunnel_address_v6 = opt(&n.vxlan_tunnel_address_v6)
        .map(|a| parse_addr("vxlan_tunnel_address_v6", a))
        .transpose()?;
    node.vxlan_tunnel_mac_v6 = opt(&n.vxlan_tunnel_mac_v6).map(str::to_owned);
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

pub fn node_to(n: &Node, rev: Revision) -> pb::Node {
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
        revision: rev.0,
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
