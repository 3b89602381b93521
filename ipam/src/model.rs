//! The cluster's resources as stored in the datastore: IP pools, nodes, the IPAM
//! configuration; and their validation. Blocks, affinities and handles live in `block`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::IpamError;
use crate::resource::Resource;
use crate::selector::Selector;

/// Encapsulation mode of a pool (Calico's vxlanMode / ipipMode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EncapMode {
    #[default]
    Never,
    Always,
    CrossSubnet,
}

impl EncapMode {
    pub fn is_on(self) -> bool {
        self != EncapMode::Never
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AllowedUse {
    Workload,
    Tunnel,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AssignmentMode {
    #[default]
    Automatic,
    /// Only requests naming the pool take addresses from it.
    Manual,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpPool {
    pub name: String,
    pub cidr: IpNet,
    pub block_size: u8,
    #[serde(default)]
    pub vxlan_mode: EncapMode,
    #[serde(default)]
    pub ipip_mode: EncapMode,
    #[serde(default)]
    pub nat_outgoing: bool,
    #[serde(default)]
    pub disabled: bool,
    #[serde(default)]
    pub disable_bgp_export: bool,
    #[serde(default)]
    pub node_selector: String,
    #[serde(default = "default_uses")]
    pub allowed_uses: Vec<AllowedUse>,
    #[serde(default)]
    pub assignment_mode: AssignmentMode,
}

fn default_uses() -> Vec<AllowedUse> {
    vec![AllowedUse::Workload, AllowedUse::Tunnel]
}

impl Resource for IpPool {
    const KIND: &'static str = "IPPool";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/ippools/";
}

/// The default block size of a pool of this family.
pub fn default_block_size(cidr: &IpNet) -> u8 {
    match cidr {
        IpNet::V4(_) => 26,
        IpNet::V6(_) => 122,
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> IpamError {
    IpamError::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

/// A resource name: DNS-label-like, as Kubernetes names.
pub fn validate_name(field: &'static str, name: &str) -> Result<(), IpamError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "{name:?} is not a valid name (lower-case letters, digits, '-' and '.', at most 253)"
            ),
        ))
    }
}

impl IpPool {
    /// A pool with defaults for everything but name and CIDR.
    pub fn new(name: &str, cidr: IpNet) -> Self {
        Self {
            name: name.into(),
            cidr,
            block_size: default_block_size(&cidr),
            vxlan_mode: EncapMode::Never,
            ipip_mode: EncapMode::Never,
            nat_outgoing: false,
            disabled: false,
            disable_bgp_export: false,
            node_selector: String::new(),
            allowed_uses: default_uses(),
            assignment_mode: AssignmentMode::Automatic,
        }
    }

    /// Checks the pool on its own (overlaps with other pools are checked by the caller).
    pub fn validate(&self) -> Result<(), IpamError> {
        validate_name("name", &self.name)?;
        if self.cidr.trunc() != self.cidr {
            return Err(invalid(
                "cidr",
                format!(
                    "{} is not a network address (did you mean {}?)",
                    self.cidr,
                    self.cidr.trunc()
                ),
            ));
        }
        let (min, max) = match self.cidr {
            IpNet::V4(_) => (20, 32),
            IpNet::V6(_) => (116, 128),
        };
        if !(min..=max).contains(&self.block_size) {
            return Err(invalid(
                "block_size",
                format!(
                    "/{} is out of range for an {} pool: blocks are /{min} to /{max} (default /{})",
                    self.block_size,
                    IpFamily::of_net(&self.cidr).name(),
                    default_block_size(&self.cidr)
                ),
            ));
        }
        if self.block_size < self.cidr.prefix_len() {
            return Err(invalid(
                "block_size",
                format!(
                    "blocks of /{} do not fit in the pool {}",
                    self.block_size, self.cidr
                ),
            ));
        }
        let link_local: IpNet = match self.cidr {
            IpNet::V4(_) => "169.254.0.0/16".parse().expect("constant"),
            IpNet::V6(_) => "fe80::/10".parse().expect("constant"),
        };
        if overlaps(&self.cidr, &link_local) {
            return Err(invalid(
                "cidr",
                format!("{} overlaps the link-local range {link_local}", self.cidr),
            ));
        }
        if self.vxlan_mode.is_on() && self.ipip_mode.is_on() {
            return Err(invalid("ipip_mode", "a pool uses VXLAN or IPIP, not both"));
        }
        if self.ipip_mode.is_on() && self.cidr.addr().is_ipv6() {
            return Err(invalid("ipip_mode", "IPIP carries IPv4 only"));
        }
        Selector::parse(&self.node_selector)
            .map_err(|e| invalid("node_selector", e.to_string()))?;
        if self.allowed_uses.is_empty() {
            return Err(invalid("allowed_uses", "needs Workload, Tunnel or both"));
        }
        Ok(())
    }

    /// The number of blocks the pool holds.
    pub fn block_count(&self) -> u128 {
        1u128 << (self.block_size - self.cidr.prefix_len()).min(127)
    }

    /// The `index`-th block of the pool.
    pub fn block_at(&self, index: u128) -> IpNet {
        let shift = self.cidr.max_prefix_len() - self.block_size;
        match self.cidr {
            IpNet::V4(net) => {
                let base = u32::from(net.network()) as u128 + (index << shift);
                IpNet::new(IpAddr::V4((base as u32).into()), self.block_size).expect("valid prefix")
            }
            IpNet::V6(net) => {
                let base = u128::from(net.network()) + (index << shift);
                IpNet::new(IpAddr::V6(base.into()), self.block_size).expect("valid prefix")
            }
        }
    }

    /// The block of the pool that holds `addr`.
    pub fn block_of(&self, addr: IpAddr) -> Option<IpNet> {
        if !self.cidr.contains(&addr) {
            return None;
        }
        IpNet::new(addr, self.block_size).ok().map(|n| n.trunc())
    }

    pub fn allows(&self, use_: AllowedUse) -> bool {
        self.allowed_uses.contains(&use_)
    }
}

pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// A node of the cluster, registered by its bgpd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub ipv4: Option<ipnet::Ipv4Net>,
    pub ipv6: Option<ipnet::Ipv6Net>,
    /// `None`: the cluster's AS.
    pub asn: Option<u32>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub vxlan_tunnel_address: Option<IpAddr>,
    #[serde(default)]
    pub vxlan_tunnel_mac: Option<String>,
    /// The IPv6 VTEP (Calico's `ipv6VXLANTunnelAddr`, `vxlanTunnelMACAddrV6`): a node has one
    /// VTEP per family, each claimed from a VXLAN pool of that family.
    #[serde(default)]
    pub vxlan_tunnel_address_v6: Option<IpAddr>,
    #[serde(default)]
    pub vxlan_tunnel_mac_v6: Option<String>,
    #[serde(default)]
    pub route_reflector_cluster_id: Option<std::net::Ipv4Addr>,
}

impl Resource for Node {
    const KIND: &'static str = "Node";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/nodes/";
}

impl Node {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            ipv4: None,
            ipv6: None,
            asn: None,
            labels: BTreeMap::new(),
            vxlan_tunnel_address: None,
            vxlan_tunnel_mac: None,
            vxlan_tunnel_address_v6: None,
            vxlan_tunnel_mac_v6: None,
            route_reflector_cluster_id: None,
        }
    }

    /// The node's address (with its subnet's prefix length) in `family`.
    pub fn address(&self, family: IpFamily) -> Option<IpNet> {
        match family {
            IpFamily::V4 => self.ipv4.map(IpNet::V4),
            IpFamily::V6 => self.ipv6.map(IpNet::V6),
        }
    }

    /// The node's VTEP of `family`: its tunnel address and MAC, once both are assigned.
    pub fn vxlan_tunnel(&self, family: IpFamily) -> Option<(IpAddr, &str)> {
        let (addr, mac) = match family {
            IpFamily::V4 => (self.vxlan_tunnel_address, &self.vxlan_tunnel_mac),
            IpFamily::V6 => (self.vxlan_tunnel_address_v6, &self.vxlan_tunnel_mac_v6),
        };
        Some((addr?, mac.as_deref()?))
    }

    /// Sets (or with `None`, clears) the node's VTEP of `family`.
    pub fn set_vxlan_tunnel(&mut self, family: IpFamily, vtep: Option<(IpAddr, String)>) {
        let (addr, mac) = vtep.unzip();
        match family {
            IpFamily::V4 => (self.vxlan_tunnel_address, self.vxlan_tunnel_mac) = (addr, mac),
            IpFamily::V6 => (self.vxlan_tunnel_address_v6, self.vxlan_tunnel_mac_v6) = (addr, mac),
        }
    }
}

/// An address family. Pools, blocks, node addresses, VTEPs and routes each belong to one; the
/// code paths that handle them are the same for both, parameterised by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    pub fn of(addr: IpAddr) -> Self {
        if addr.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }

    pub fn of_net(net: &IpNet) -> Self {
        Self::of(net.addr())
    }

    /// "IPv4" / "IPv6", for messages.
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

/// Cluster-wide IPAM settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamConfig {
    /// Never borrow addresses from another node's block.
    pub strict_affinity: bool,
    pub max_blocks_per_host: u32,
    /// How long an empty block stays affine to its node before going back to the pool.
    pub empty_block_grace_s: u64,
}

impl Default for IpamConfig {
    fn default() -> Self {
        Self {
            strict_affinity: false,
            max_blocks_per_host: 20,
            empty_block_grace_s: 300,
        }
    }
}

impl Resource for IpamConfig {
    const KIND: &'static str = "IPAMConfig";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/ipam/config/";
}

/// The cluster-wide BGP settings (Calico's `BGPConfiguration` "default"); absent means
/// every default. Read live by every bgpd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpConfiguration {
    /// The cluster's AS (nodes may override theirs).
    pub as_number: u32,
    /// Full iBGP mesh between the nodes.
    pub node_to_node_mesh: bool,
    pub listen_port: u16,
    /// Seconds; 0: the defaults (hold 240, keepalive a third of it, as BIRD).
    pub keepalive_time_s: u16,
    pub hold_time_s: u16,
    /// Export one aggregate per pool to external peers instead of its blocks.
    pub aggregate_pools_to_external: bool,
    /// Routes learned from one external peer are exported to the other external peers.
    pub external_transit: bool,
    /// Routes from external peers outside every pool go into the kernel table (Calico does).
    pub program_external_routes: bool,
}

impl Default for BgpConfiguration {
    fn default() -> Self {
        Self {
            as_number: 64512,
            node_to_node_mesh: true,
            listen_port: 179,
            keepalive_time_s: 0,
            hold_time_s: 0,
            aggregate_pools_to_external: false,
            external_transit: false,
            program_external_routes: true,
        }
    }
}

impl Resource for BgpConfiguration {
    const KIND: &'static str = "BGPConfiguration";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/bgpconfigurations/";
}

impl BgpConfiguration {
    /// The name of the one cluster-wide resource.
    pub const NAME: &'static str = "default";

    pub fn validate(&self) -> Result<(), IpamError> {
        if self.as_number == 0 || self.as_number == 23456 {
            return Err(invalid(
                "as_number",
                format!(
                    "{} cannot be a node's AS (0 and AS_TRANS 23456 are reserved)",
                    self.as_number
                ),
            ));
        }
        if self.listen_port == 0 {
            return Err(invalid("listen_port", "must be 1-65535"));
        }
        if self.hold_time_s != 0 && self.hold_time_s < 3 {
            return Err(invalid(
                "hold_time_s",
                "must be 0 or at least 3 seconds (RFC 4271)",
            ));
        }
        if self.hold_time_s != 0 && self.keepalive_time_s >= self.hold_time_s {
            return Err(invalid("keepalive_time_s", "must be less than hold_time_s"));
        }
        Ok(())
    }
}

/// An explicit BGP peering (Calico's `BGPPeer`): every node (`node` empty) or one node peers
/// with `peer_address`, e.g. the node's top-of-rack router.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpPeer {
    pub name: String,
    /// Empty: every node.
    #[serde(default)]
    pub node: String,
    pub peer_address: IpAddr,
    pub as_number: u32,
    /// 0: 179.
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub passive: bool,
    /// TCP MD5 password (needs the production speaker, see issue #6).
    #[serde(default)]
    pub password: String,
    /// GTSM hops; 0 off.
    #[serde(default)]
    pub ttl_security_hops: u8,
    #[serde(default)]
    pub keepalive_time_s: u16,
    #[serde(default)]
    pub hold_time_s: u16,
    /// Most prefixes the peer may send; 0: no limit.
    #[serde(default)]
    pub max_prefixes: u32,
    /// BFD with the peer (RFC 5880); none: no BFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<BgpPeerBfd>,
}

/// A `BGPPeer`'s BFD parameters, as in bgpd's `[[bgp.peers]] bfd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpPeerBfd {
    pub min_rx_ms: u32,
    pub min_tx_ms: u32,
    pub multiplier: u32,
}

impl BgpPeerBfd {
    /// The bounds bgpd's BFD sessions accept (the `bfd` crate's `SessionConfig::from_ms`):
    /// checked here too, so that nothing bgpd would refuse is stored.
    pub const MIN_INTERVAL_MS: u32 = 10;
    pub const MAX_INTERVAL_MS: u32 = 60_000;

    fn validate(&self) -> Result<(), IpamError> {
        for (field, v) in [
            ("bfd.min_rx_ms", self.min_rx_ms),
            ("bfd.min_tx_ms", self.min_tx_ms),
        ] {
            if !(Self::MIN_INTERVAL_MS..=Self::MAX_INTERVAL_MS).contains(&v) {
                return Err(invalid(
                    field,
                    format!(
                        "{v} ms is outside {}-{} ms",
                        Self::MIN_INTERVAL_MS,
                        Self::MAX_INTERVAL_MS
                    ),
                ));
            }
        }
        if !(1..=255).contains(&self.multiplier) {
            return Err(invalid(
                "bfd.multiplier",
                format!("{} is outside 1-255", self.multiplier),
            ));
        }
        Ok(())
    }
}

impl Resource for BgpPeer {
    const KIND: &'static str = "BGPPeer";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/bgppeers/";
}

impl BgpPeer {
    /// A peering of every node (`node` empty) with `peer_address`, defaults elsewhere.
    pub fn new(name: &str, node: &str, peer_address: IpAddr, as_number: u32) -> Self {
        BgpPeer {
            name: name.into(),
            node: node.into(),
            peer_address,
            as_number,
            port: 0,
            passive: false,
            password: String::new(),
            ttl_security_hops: 0,
            keepalive_time_s: 0,
            hold_time_s: 0,
            max_prefixes: 0,
            bfd: None,
        }
    }

    pub fn validate(&self) -> Result<(), IpamError> {
        validate_name("name", &self.name)?;
        if !self.node.is_empty() {
            validate_name("node", &self.node)?;
        }
        if self.as_number == 0 || self.as_number == 23456 {
            return Err(invalid(
                "as_number",
                "0 and AS_TRANS 23456 cannot be a peer's AS",
            ));
        }
        if self.peer_address.is_unspecified() || self.peer_address.is_multicast() {
            return Err(invalid("peer_address", "must be a unicast address"));
        }
        if let IpAddr::V6(a) = self.peer_address
            && a.is_unicast_link_local()
        {
            return Err(invalid(
                "peer_address",
                format!(
                    "{a} is link-local: it needs an interface, which a BGPPeer cannot name; use the peer's global address"
                ),
            ));
        }
        if self.hold_time_s != 0 && self.hold_time_s < 3 {
            return Err(invalid(
                "hold_time_s",
                "must be 0 or at least 3 seconds (RFC 4271)",
            ));
        }
        if let Some(b) = &self.bfd {
            b.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
