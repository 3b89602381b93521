//! The items of the desired kernel state as bgpd holds them: typed (destinations as `IpNet`,
//! gateways and VTEP addresses as `IpAddr`), made by both producers, the brain's IPAM part
//! (`desired`, `policy`) and the speaker's BGP part (through [`super::KernelSink`]).
//!
//! The `Dataplane` contract carries them as strings (`proto/margay/v1/dataplane.proto`);
//! `to_proto` here is the one place they become its messages, when the `Hub` publishes a
//! change or a snapshot. Nothing in bgpd formats a route to parse it back.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ::datastore::model::IpFamily;
use ipnet::IpNet;
use proto::v1 as pb;

/// Identifies one desired item, so that changes are upserts and removals by key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ItemKey {
    Route(IpNet),
    Vtep(String, IpFamily),
    LocalVtep(IpFamily),
    NatPool(IpNet),
    /// A pod interface's network policy, and an address set its rules name (`policy`).
    EndpointPolicy(String),
    PolicySet(String),
}

/// A whole desired state (or one part of it), by key.
pub type Desired = BTreeMap<ItemKey, DesiredItem>;

/// One item of the desired state.
#[derive(Debug, Clone, PartialEq)]
pub enum DesiredItem {
    Route(KernelRoute),
    Vtep(Vtep),
    LocalVtep(LocalVtep),
    NatPool(NatPool),
    /// The compiled policy of one pod interface and an address set, already in the
    /// contract's form: `policy::extend` builds them from `policy::compile`'s output, and
    /// nothing in bgpd reads them back.
    EndpointPolicy(pb::EndpointPolicy),
    PolicySet(pb::PolicySet),
}

/// A route routewriter is to program (protocol 80).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRoute {
    pub destination: IpNet,
    pub via: Via,
    /// Why the route is desired, for operators: "own block (pool default)",
    /// "bgp from Mesh_10_0_0_2 (...)".
    pub source: String,
}

/// Where a [`KernelRoute`] sends its traffic: the contract's `RouteKind` with what each
/// kind needs (a gateway of the destination's family, or the workload's device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// Nowhere: an own block, whose addresses not handed out are not routed.
    Blackhole,
    /// A local workload's host-side interface (scope link).
    Workload { device: String },
    /// A gateway: a BGP next hop, or a node in our subnet (CrossSubnet).
    Gateway(IpAddr),
    /// The VXLAN device, onlink to the owner's tunnel address.
    Vxlan(IpAddr),
    /// The IPIP device, onlink to the owner's address.
    Ipip(IpAddr),
}

/// A remote VXLAN endpoint (its family is that of its addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vtep {
    pub node: String,
    pub underlay_address: IpAddr,
    /// As the node's resource holds it (`66:00:...`).
    pub mac: String,
    pub tunnel_address: IpAddr,
}

/// This node's own VXLAN device of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalVtep {
    pub underlay_address: IpAddr,
    pub mac: String,
    pub tunnel_address: IpAddr,
    pub vni: u32,
    pub port: u32,
    /// 0: routewriter derives it from the uplink.
    pub mtu: u32,
}

/// A pool as the NAT rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatPool {
    pub cidr: IpNet,
    pub nat_outgoing: bool,
}

/// The contract's name of a family.
pub fn pb_family(f: IpFamily) -> pb::IpFamily {
    match f {
        IpFamily::V4 => pb::IpFamily::V4,
        IpFamily::V6 => pb::IpFamily::V6,
    }
}

impl ItemKey {
    pub fn to_proto(&self) -> pb::DesiredKey {
        use pb::desired_key::Key;
        pb::DesiredKey {
            key: Some(match self {
                ItemKey::Route(n) => Key::Route(n.to_string()),
                ItemKey::Vtep(n, f) => Key::Vtep(pb::VtepKey {
                    node: n.clone(),
                    family: pb_family(*f).into(),
                }),
                ItemKey::LocalVtep(f) => Key::LocalVtep(pb_family(*f).into()),
                ItemKey::NatPool(n) => Key::NatPool(n.to_string()),
                ItemKey::EndpointPolicy(i) => Key::EndpointPolicy(i.clone()),
                ItemKey::PolicySet(s) => Key::PolicySet(s.clone()),
            }),
        }
    }
}

impl DesiredItem {
    pub fn to_proto(&self) -> pb::DesiredItem {
        use pb::desired_item::Item;
        let item = match self {
            DesiredItem::Route(r) => Item::Route(r.to_proto()),
            DesiredItem::Vtep(v) => Item::Vtep(pb::Vtep {
                node: v.node.clone(),
                underlay_address: v.underlay_address.to_string(),
                mac: v.mac.clone(),
                tunnel_address: v.tunnel_address.to_string(),
            }),
            DesiredItem::LocalVtep(v) => Item::LocalVtep(pb::LocalVtep {
                underlay_address: v.underlay_address.to_string(),
                mac: v.mac.clone(),
                tunnel_address: v.tunnel_address.to_string(),
                vni: v.vni,
                port: v.port,
                mtu: v.mtu,
            }),
            DesiredItem::NatPool(p) => Item::NatPool(pb::NatPool {
                cidr: p.cidr.to_string(),
                nat_outgoing: p.nat_outgoing,
            }),
            DesiredItem::EndpointPolicy(e) => Item::EndpointPolicy(e.clone()),
            DesiredItem::PolicySet(s) => Item::PolicySet(s.clone()),
        };
        pb::DesiredItem { item: Some(item) }
    }
}

impl KernelRoute {
    pub fn to_proto(&self) -> pb::KernelRoute {
        let (kind, gateway, device, onlink) = match &self.via {
            Via::Blackhole => (pb::RouteKind::Blackhole, None, "", false),
            Via::Workload { device } => (pb::RouteKind::Workload, None, device.as_str(), false),
            Via::Gateway(g) => (pb::RouteKind::Gateway, Some(g), "", false),
            Via::Vxlan(g) => (pb::RouteKind::Vxlan, Some(g), "", true),
            Via::Ipip(g) => (pb::RouteKind::Ipip, Some(g), "", true),
        };
        pb::KernelRoute {
            destination: self.destination.to_string(),
            kind: kind.into(),
            gateway: gateway.map(IpAddr::to_string).unwrap_or_default(),
            device: device.to_owned(),
            onlink,
            source: self.source.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(destination: &str, via: Via) -> pb::KernelRoute {
        KernelRoute {
            destination: destination.parse().unwrap(),
            via,
            source: "why".into(),
        }
        .to_proto()
    }

    /// The strings routewriter parses are those bgpd sent before its items were typed.
    #[test]
    fn routes_become_the_contracts_fields_of_their_kind() {
        let r = route("10.0.0.0/26", Via::Blackhole);
        assert_eq!(
            (r.kind(), r.destination.as_str(), r.gateway.as_str()),
            (pb::RouteKind::Blackhole, "10.0.0.0/26", "")
        );
        let r = route(
            "10.0.0.5/32",
            Via::Workload {
                device: "cali0".into(),
            },
        );
        assert_eq!(
            (r.kind(), r.device.as_str(), r.gateway.as_str(), r.onlink),
            (pb::RouteKind::Workload, "cali0", "", false)
        );
        let r = route(
            "fd00:20::40/122",
            Via::Gateway("fd00:10::2".parse().unwrap()),
        );
        assert_eq!(
            (r.kind(), r.destination.as_str(), r.gateway.as_str()),
            (pb::RouteKind::Gateway, "fd00:20::40/122", "fd00:10::2")
        );
        assert!(!r.onlink && r.device.is_empty() && r.source == "why");
        let r = route("10.0.1.0/26", Via::Vxlan("172.20.0.129".parse().unwrap()));
        assert_eq!(
            (r.kind(), r.gateway.as_str(), r.onlink),
            (pb::RouteKind::Vxlan, "172.20.0.129", true)
        );
        let r = route("10.0.2.0/26", Via::Ipip("10.0.0.3".parse().unwrap()));
        assert_eq!(
            (r.kind(), r.gateway.as_str(), r.onlink),
            (pb::RouteKind::Ipip, "10.0.0.3", true)
        );
    }

    #[test]
    fn vteps_and_pools_carry_their_addresses_as_text() {
        let v = DesiredItem::Vtep(Vtep {
            node: "d".into(),
            underlay_address: "fd00:11::4".parse().unwrap(),
            mac: "66:00:00:00:06:01".into(),
            tunnel_address: "fd00:20::81".parse().unwrap(),
        });
        let Some(pb::desired_item::Item::Vtep(v)) = v.to_proto().item else {
            panic!("not a VTEP");
        };
        assert_eq!(
            (v.underlay_address.as_str(), v.tunnel_address.as_str()),
            ("fd00:11::4", "fd00:20::81")
        );
        let p = DesiredItem::NatPool(NatPool {
            cidr: "172.20.0.0/16".parse().unwrap(),
            nat_outgoing: true,
        });
        let Some(pb::desired_item::Item::NatPool(p)) = p.to_proto().item else {
            panic!("not a pool");
        };
        assert_eq!((p.cidr.as_str(), p.nat_outgoing), ("172.20.0.0/16", true));
    }
}
