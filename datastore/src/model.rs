//! The cluster's resources as stored in the datastore: IP pools, nodes, the IPAM
//! configuration, the BGP resources (configuration, peers, filters); and their validation.
//! Blocks, affinities and handles live in `block`.
//!
//! Why this file is long: every resource kind is defined next to its validation, which names
//! the refused field (down to a list item's, `exportV4[2].cidr`) for the API and bgpctl.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use net_types::asn::{self, AS_TRANS};
use serde::{Deserialize, Serialize};

use crate::error::ResourceError;
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

fn invalid(field: &'static str, reason: impl Into<String>) -> ResourceError {
    ResourceError::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

/// A resource name: DNS-label-like, as Kubernetes names.
pub fn validate_name(field: &'static str, name: &str) -> Result<(), ResourceError> {
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
    pub fn validate(&self) -> Result<(), ResourceError> {
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

/// The address family: net-types' one type, named with the rest of the model so that its
/// users (ipam, bgpd) need no other path.
pub use net_types::IpFamily;

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
    /// Service CIDRs every node advertises to its external peers (never to the mesh):
    /// Calico's `serviceClusterIPs`, `serviceExternalIPs`, `serviceLoadBalancerIPs`.
    pub service_cluster_ips: Vec<IpNet>,
    pub service_external_ips: Vec<IpNet>,
    pub service_load_balancer_ips: Vec<IpNet>,
    /// Named communities, standard (`aa:nn`) or large (`aa:nn:mm`).
    pub communities: Vec<CommunityDef>,
    /// Which CIDRs carry which communities when this node advertises them.
    pub prefix_advertisements: Vec<PrefixAdvertisement>,
}

/// A named community of `BGPConfiguration.communities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommunityDef {
    pub name: String,
    /// `aa:nn` (standard, each 0-65535) or `aa:nn:mm` (large, each 0-4294967295).
    pub value: String,
}

/// One entry of `BGPConfiguration.prefixAdvertisements`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixAdvertisement {
    pub cidr: IpNet,
    /// Names of `communities` or literal `aa:nn` / `aa:nn:mm` values.
    pub communities: Vec<String>,
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
            service_cluster_ips: Vec::new(),
            service_external_ips: Vec::new(),
            service_load_balancer_ips: Vec::new(),
            communities: Vec::new(),
            prefix_advertisements: Vec::new(),
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

    /// Calico's limits on `communities` and `prefixAdvertisements`, and on the communities of
    /// one advertisement.
    pub const MAX_COMMUNITIES: usize = 500;
    pub const MAX_PREFIX_ADVERTISEMENTS: usize = 500;
    pub const MAX_COMMUNITIES_PER_PREFIX: usize = 50;

    pub fn validate(&self) -> Result<(), ResourceError> {
        self.check().map_err(Into::into)
    }

    /// As `validate`, the refused field named by its full path (`communities[1].value`).
    pub fn check(&self) -> Result<(), InvalidField> {
        self.check_scalars()?;
        for (head, list) in [
            ("service_cluster_ips", &self.service_cluster_ips),
            ("service_external_ips", &self.service_external_ips),
            ("service_load_balancer_ips", &self.service_load_balancer_ips),
        ] {
            for (i, net) in list.iter().enumerate() {
                let path = || format!("{head}[{i}]");
                network_address(net).map_err(|r| InvalidField::new(head, path(), r))?;
                if let Some(j) = list[..i].iter().position(|o| overlaps(o, net)) {
                    return Err(InvalidField::new(
                        head,
                        path(),
                        format!("{net} overlaps {head}[{j}] ({})", list[j]),
                    ));
                }
            }
        }
        if self.communities.len() > Self::MAX_COMMUNITIES {
            return Err(InvalidField::new(
                "communities",
                "communities",
                format!(
                    "{} communities: at most {}",
                    self.communities.len(),
                    Self::MAX_COMMUNITIES
                ),
            ));
        }
        for (i, c) in self.communities.iter().enumerate() {
            let head = "communities";
            if c.name.trim().is_empty() {
                return Err(InvalidField::new(
                    head,
                    format!("{head}[{i}].name"),
                    "required",
                ));
            }
            if let Some(j) = self.communities[..i].iter().position(|o| o.name == c.name) {
                return Err(InvalidField::new(
                    head,
                    format!("{head}[{i}].name"),
                    format!("{:?} is already {head}[{j}]'s name", c.name),
                ));
            }
            c.value
                .parse::<CommunityValue>()
                .map_err(|r| InvalidField::new(head, format!("{head}[{i}].value"), r))?;
        }
        let head = "prefix_advertisements";
        if self.prefix_advertisements.len() > Self::MAX_PREFIX_ADVERTISEMENTS {
            return Err(InvalidField::new(
                head,
                head,
                format!(
                    "{} prefix advertisements: at most {}",
                    self.prefix_advertisements.len(),
                    Self::MAX_PREFIX_ADVERTISEMENTS
                ),
            ));
        }
        for (i, a) in self.prefix_advertisements.iter().enumerate() {
            network_address(&a.cidr)
                .map_err(|r| InvalidField::new(head, format!("{head}[{i}].cidr"), r))?;
            if a.communities.len() > Self::MAX_COMMUNITIES_PER_PREFIX {
                return Err(InvalidField::new(
                    head,
                    format!("{head}[{i}].communities"),
                    format!(
                        "{} communities: at most {} per prefix",
                        a.communities.len(),
                        Self::MAX_COMMUNITIES_PER_PREFIX
                    ),
                ));
            }
            for (k, c) in a.communities.iter().enumerate() {
                if self.community(c).is_none() {
                    return Err(InvalidField::new(
                        head,
                        format!("{head}[{i}].communities[{k}]"),
                        format!(
                            "{c:?} is neither the name of one of communities nor a community \
                             value (aa:nn or aa:nn:mm)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A prefix advertisement's community: the value of the named one of `communities`, or
    /// a literal value; `None` if it is neither.
    pub fn community(&self, name_or_value: &str) -> Option<CommunityValue> {
        match self.communities.iter().find(|c| c.name == name_or_value) {
            Some(c) => c.value.parse().ok(),
            None => name_or_value.parse().ok(),
        }
    }

    fn check_scalars(&self) -> Result<(), ResourceError> {
        if asn::is_reserved(self.as_number) {
            return Err(invalid(
                "as_number",
                format!(
                    "{} cannot be a node's AS (0 and AS_TRANS {AS_TRANS} are reserved)",
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
    /// `BGPFilter` resources applied to the session, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<String>,
    /// Calico's `nextHopMode` (`keepOriginalNextHop: true` is `Keep`).
    #[serde(default)]
    pub next_hop_mode: NextHopMode,
    /// The AS this node speaks on this session instead of its own (BIRD's `local as`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_as_number: Option<u32>,
    /// How often our own AS may appear in a received AS_PATH (BIRD's `allow local as`).
    #[serde(default)]
    pub num_allowed_local_as_numbers: u8,
    /// The graceful-restart time we announce to the peer, seconds (Calico's
    /// `maxRestartTime`); none: the default, 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restart_time_s: Option<u16>,
    /// The gateway through which the peer is reached (Calico's `reachableBy`): the session's
    /// next hop must be resolved through it when the peer is not on our subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reachable_by: Option<IpAddr>,
}

/// What next hop this node sends on a session (Calico's `nextHopMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum NextHopMode {
    /// Ours on eBGP, the route's on iBGP (BIRD's default).
    #[default]
    Auto,
    /// Always ours (`next hop self`).
    #[serde(rename = "Self")]
    SelfNextHop,
    /// Always the route's (`next hop keep`; Calico's `keepOriginalNextHop`).
    Keep,
}

/// A `BGPFilter`: ordered import and export rules per family, attached to `BGPPeer`s.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BgpFilter {
    pub name: String,
    pub export_v4: Vec<BgpFilterRule>,
    pub import_v4: Vec<BgpFilterRule>,
    pub export_v6: Vec<BgpFilterRule>,
    pub import_v6: Vec<BgpFilterRule>,
}

/// One rule of a [`BgpFilter`]: every condition set must hold; the first rule that matches
/// decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpFilterRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<IpNet>,
    /// How the route's prefix relates to `cidr` (needs `cidr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_operator: Option<MatchOperator>,
    /// Bounds on the route's prefix length (needs `cidr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_length_min: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_length_max: Option<u8>,
    /// `Some(RemotePeers)`: only routes learned from BGP peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<FilterSource>,
    /// Only routes through this interface (a `*` wildcard allowed, as Calico).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    pub action: FilterAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MatchOperator {
    Equal,
    NotEqual,
    In,
    NotIn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FilterSource {
    RemotePeers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FilterAction {
    Accept,
    Reject,
}

impl Resource for BgpFilter {
    const KIND: &'static str = "BGPFilter";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = "/margay/v1/bgpfilters/";
}

impl BgpFilter {
    /// The four rule lists with their Calico names and the family each holds.
    pub fn lists(&self) -> [(&'static str, IpFamily, &[BgpFilterRule]); 4] {
        [
            ("exportV4", IpFamily::V4, &self.export_v4),
            ("importV4", IpFamily::V4, &self.import_v4),
            ("exportV6", IpFamily::V6, &self.export_v6),
            ("importV6", IpFamily::V6, &self.import_v6),
        ]
    }

    pub fn validate(&self) -> Result<(), ResourceError> {
        self.check().map_err(Into::into)
    }

    /// As `validate`, the refused field named by its full path (`exportV4[2].cidr`).
    pub fn check(&self) -> Result<(), InvalidField> {
        validate_name("name", &self.name)?;
        for (list, family, rules) in self.lists() {
            for (i, rule) in rules.iter().enumerate() {
                rule.check(list, i, family)?;
                if let Some(j) = rules[..i].iter().position(|r| r == rule) {
                    return Err(InvalidField::new(
                        list,
                        format!("{list}[{i}]"),
                        format!("the same rule as {list}[{j}]: the second can never decide"),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl BgpFilterRule {
    /// A rule with only an action: it matches every route.
    pub fn new(action: FilterAction) -> Self {
        Self {
            cidr: None,
            match_operator: None,
            prefix_length_min: None,
            prefix_length_max: None,
            source: None,
            interface: None,
            action,
        }
    }

    fn check(&self, list: &'static str, i: usize, family: IpFamily) -> Result<(), InvalidField> {
        let err = |field: &str, reason: String| {
            InvalidField::new(list, format!("{list}[{i}].{field}"), reason)
        };
        match (&self.cidr, self.match_operator) {
            (Some(_), None) => {
                return Err(err(
                    "matchOperator",
                    "required with cidr (Equal, NotEqual, In or NotIn)".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(err(
                    "cidr",
                    "required with matchOperator (Calico sets both or neither)".into(),
                ));
            }
            _ => {}
        }
        if let Some(cidr) = &self.cidr {
            if IpFamily::of_net(cidr) != family {
                return Err(err(
                    "cidr",
                    format!(
                        "{cidr} is {}, in an {} list ({list})",
                        IpFamily::of_net(cidr).name(),
                        family.name()
                    ),
                ));
            }
            network_address(cidr).map_err(|r| err("cidr", r))?;
        }
        let max_len = family.bits();
        for (field, v) in [
            ("prefixLength.min", self.prefix_length_min),
            ("prefixLength.max", self.prefix_length_max),
        ] {
            let Some(v) = v else { continue };
            if self.cidr.is_none() {
                return Err(err(
                    field,
                    "needs cidr (a prefix length bounds a CIDR match)".into(),
                ));
            }
            if v > max_len {
                return Err(err(
                    field,
                    format!(
                        "{v} is above {max_len}, the longest {} prefix",
                        family.name()
                    ),
                ));
            }
        }
        if let (Some(min), Some(max)) = (self.prefix_length_min, self.prefix_length_max)
            && min > max
        {
            return Err(err(
                "prefixLength",
                format!("min {min} is above max {max}: no prefix could match"),
            ));
        }
        if let Some(name) = &self.interface {
            let ok = (1..=15).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.*-".contains(&b));
            if !ok {
                return Err(err(
                    "interface",
                    format!(
                        "{name:?} is not an interface name: 1-15 characters of A-Z a-z 0-9 _ . - \
                         and * (a wildcard)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A refused field deep inside a resource: `path` names the list item (`exportV4[2].cidr`,
/// `communities[1].value`); `head` is its top-level field, which [`ResourceError`] names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {path}: {reason}")]
pub struct InvalidField {
    pub head: &'static str,
    pub path: String,
    pub reason: String,
}

impl InvalidField {
    pub fn new(head: &'static str, path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            head,
            path: path.into(),
            reason: reason.into(),
        }
    }
}

impl From<ResourceError> for InvalidField {
    /// Only for the `InvalidArgument`s of this module's checks (their field is the path).
    fn from(e: ResourceError) -> Self {
        match e {
            ResourceError::InvalidArgument { field, reason } => {
                InvalidField::new(field, field, reason)
            }
            other => InvalidField::new("", "", other.to_string()),
        }
    }
}

impl From<InvalidField> for ResourceError {
    fn from(e: InvalidField) -> Self {
        // ResourceError names a static field: the top-level one; the reason starts with the full
        // path when it goes deeper.
        let reason = if e.path == e.head {
            e.reason
        } else {
            format!("{}: {}", e.path, e.reason)
        };
        ResourceError::InvalidArgument {
            field: e.head,
            reason,
        }
    }
}

fn e_reason(e: ResourceError) -> String {
    match e {
        ResourceError::InvalidArgument { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// `Ok` if `net` has no host bits set, else why, naming the network it would be.
fn network_address(net: &IpNet) -> Result<(), String> {
    if net.trunc() == *net {
        Ok(())
    } else {
        Err(format!(
            "{net} is not a network address: its network is {}",
            net.trunc()
        ))
    }
}

/// A BGP community as Calico writes it: `aa:nn` (standard, each part 0-65535) or `aa:nn:mm`
/// (large, RFC 8092, each part 0-4294967295).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommunityValue {
    Standard(u16, u16),
    Large(u32, u32, u32),
}

impl std::str::FromStr for CommunityValue {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{s:?} is not a community: aa:nn (standard, each 0-65535) or aa:nn:mm (large, \
                 each 0-4294967295)"
            )
        };
        let parts: Vec<&str> = s.split(':').collect();
        if parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad());
        }
        match parts[..] {
            [a, n] => Ok(CommunityValue::Standard(
                a.parse().map_err(|_| bad())?,
                n.parse().map_err(|_| bad())?,
            )),
            [a, n, m] => Ok(CommunityValue::Large(
                a.parse().map_err(|_| bad())?,
                n.parse().map_err(|_| bad())?,
                m.parse().map_err(|_| bad())?,
            )),
            _ => Err(bad()),
        }
    }
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

    fn validate(&self) -> Result<(), ResourceError> {
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
            filters: Vec::new(),
            next_hop_mode: NextHopMode::Auto,
            local_as_number: None,
            num_allowed_local_as_numbers: 0,
            max_restart_time_s: None,
            reachable_by: None,
        }
    }

    pub fn validate(&self) -> Result<(), ResourceError> {
        self.check().map_err(Into::into)
    }

    /// As `validate`, the refused field named by its full path (`filters[1]`). Whether the
    /// filters exist is not checked: a peer may be stored before its filters (bgpd skips
    /// the missing ones, as Calico does).
    pub fn check(&self) -> Result<(), InvalidField> {
        self.check_scalars()?;
        for (i, f) in self.filters.iter().enumerate() {
            validate_name("filters", f)
                .map_err(|e| InvalidField::new("filters", format!("filters[{i}]"), e_reason(e)))?;
        }
        if let Some(local_as) = self.local_as_number
            && asn::is_reserved(local_as)
        {
            return Err(InvalidField::new(
                "local_as_number",
                "local_as_number",
                format!("{local_as} cannot be a local AS (0 and AS_TRANS {AS_TRANS} are reserved)"),
            ));
        }
        if let Some(t) = self.max_restart_time_s
            && !(1..=4095).contains(&t)
        {
            return Err(InvalidField::new(
                "max_restart_time_s",
                "max_restart_time_s",
                format!(
                    "{t} s is outside 1-4095 s (the graceful-restart capability's restart \
                     time has 12 bits, RFC 4724)"
                ),
            ));
        }
        if let Some(gw) = self.reachable_by {
            let why = if IpFamily::of(gw) != IpFamily::of(self.peer_address) {
                Some(format!(
                    "{gw} is {}, the peer address {} is {}: the gateway must be of the \
                     peer's family",
                    IpFamily::of(gw).name(),
                    self.peer_address,
                    IpFamily::of(self.peer_address).name()
                ))
            } else if gw.is_unspecified()
                || gw.is_multicast()
                || gw == IpAddr::V4(std::net::Ipv4Addr::BROADCAST)
            {
                Some(format!("{gw} is not a unicast address"))
            } else if gw == self.peer_address {
                Some(format!("{gw} is the peer itself, not a gateway to it"))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(InvalidField::new("reachable_by", "reachable_by", why));
            }
        }
        Ok(())
    }

    fn check_scalars(&self) -> Result<(), ResourceError> {
        validate_name("name", &self.name)?;
        if !self.node.is_empty() {
            validate_name("node", &self.node)?;
        }
        if asn::is_reserved(self.as_number) {
            return Err(invalid(
                "as_number",
                format!("0 and AS_TRANS {AS_TRANS} cannot be a peer's AS"),
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
