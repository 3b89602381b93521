//! The desired kernel state of one node, computed from the cluster's IPAM state: a pure
//! function of (this node, nodes, pools, blocks, affinities), so it is tested without a
//! datastore and recomputed whole whenever any of them changes.
//!
//! What it yields (DESIGN.md, "Pool modes decide the routes"):
//! - a blackhole for each of this node's confirmed blocks;
//! - for each other node's confirmed block in a VXLAN pool: via that node's address when the
//!   pool is CrossSubnet and the node is in our subnet (plain IP, no encapsulation), else via
//!   its tunnel address on the VXLAN device;
//! - addresses another node borrowed from a block (a /32 towards the node holding them);
//! - this node's workloads: a /32 on the host-side interface the CNI plugin named;
//! - each remote VTEP and this node's own, and every pool for the NAT rules.
//!
//! Routes of pools without VXLAN come from BGP, not from here (the cluster-brain issue).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use ipam::block::{AffinityState, Block, BlockAffinity};
use ipam::model::{EncapMode, IpPool, Node};
use ipnet::IpNet;
use proto::v1 as pb;

/// Identifies one desired item, so that changes are upserts and removals by key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ItemKey {
    Route(IpNet),
    Vtep(String),
    LocalVtep,
    NatPool(IpNet),
}

impl ItemKey {
    pub fn to_proto(&self) -> pb::DesiredKey {
        use pb::desired_key::Key;
        pb::DesiredKey {
            key: Some(match self {
                ItemKey::Route(n) => Key::Route(n.to_string()),
                ItemKey::Vtep(n) => Key::Vtep(n.clone()),
                ItemKey::LocalVtep => Key::LocalVtep(true),
                ItemKey::NatPool(n) => Key::NatPool(n.to_string()),
            }),
        }
    }
}

pub type Desired = BTreeMap<ItemKey, pb::DesiredItem>;

/// The allocation attribute the CNI plugin sets to the workload's host-side interface.
pub const WORKLOAD_INTERFACE: &str = "interface";

/// VXLAN settings as Calico's defaults.
pub const VXLAN_VNI: u32 = 4096;
pub const VXLAN_PORT: u32 = 4789;

pub struct Inputs<'a> {
    pub me: &'a str,
    pub nodes: &'a [Node],
    pub pools: &'a [IpPool],
    pub blocks: &'a [Block],
    pub affinities: &'a [BlockAffinity],
}

fn route(
    dest: IpNet,
    kind: pb::RouteKind,
    gateway: Option<IpAddr>,
    onlink: bool,
    source: String,
) -> pb::DesiredItem {
    pb::DesiredItem {
        item: Some(pb::desired_item::Item::Route(pb::KernelRoute {
            destination: dest.to_string(),
            kind: kind.into(),
            gateway: gateway.map(|g| g.to_string()).unwrap_or_default(),
            device: String::new(),
            onlink,
            source,
        })),
    }
}

/// How traffic to `node` for a block of `pool` is carried, if this module decides it.
fn remote_route(
    dest: IpNet,
    pool: &IpPool,
    me: Option<&Node>,
    node: &Node,
) -> Option<pb::DesiredItem> {
    if !pool.vxlan_mode.is_on() {
        return None;
    }
    let theirs = node.ipv4?;
    let same_subnet = me
        .and_then(|m| m.ipv4)
        .is_some_and(|mine| mine.contains(&theirs.addr()));
    if pool.vxlan_mode == EncapMode::CrossSubnet && same_subnet {
        return Some(route(
            dest,
            pb::RouteKind::Gateway,
            Some(IpAddr::V4(theirs.addr())),
            false,
            format!(
                "block of {} (pool {} CrossSubnet, same subnet)",
                node.name, pool.name
            ),
        ));
    }
    let tunnel = node.vxlan_tunnel_address?;
    Some(route(
        dest,
        pb::RouteKind::Vxlan,
        Some(tunnel),
        true,
        format!("block of {} (pool {} VXLAN)", node.name, pool.name),
    ))
}

pub fn compute(inputs: &Inputs<'_>) -> Desired {
    let mut out = Desired::new();
    let me = inputs.nodes.iter().find(|n| n.name == inputs.me);
    // Lookups by name and by affinity are indexed once: scanning the lists for every block
    // and every address was quadratic (every node recomputes this on every change).
    let by_name: HashMap<&str, &Node> = inputs.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let node = |name: &str| by_name.get(name).copied();
    let affinities = ConfirmedAffinities::new(inputs.affinities);
    let pool_of = |cidr: &IpNet| {
        inputs
            .pools
            .iter()
            .find(|p| p.cidr.contains(&cidr.network()))
    };
    let confirmed = |b: &Block| affinities.owner(b).is_some();

    for block in inputs.blocks {
        let Some(pool) = pool_of(&block.cidr) else {
            continue;
        };
        let owner = block.affinity.as_deref();
        if owner == Some(inputs.me) && confirmed(block) {
            out.insert(
                ItemKey::Route(block.cidr),
                route(
                    block.cidr,
                    pb::RouteKind::Blackhole,
                    None,
                    false,
                    format!("own block (pool {})", pool.name),
                ),
            );
        } else if let Some(owner) = owner.filter(|_| confirmed(block))
            && let Some(n) = node(owner)
            && let Some(item) = remote_route(block.cidr, pool, me, n)
        {
            out.insert(ItemKey::Route(block.cidr), item);
        }
        for (ordinal, slot) in &block.slots {
            let addr = block.address(*ordinal);
            let host = IpNet::from(addr);
            // Our workloads: a host route on their interface (the CNI plugin wrote it first;
            // routewriter keeps it from now on).
            if slot.node == inputs.me {
                if let Some(dev) = slot.attrs.get(WORKLOAD_INTERFACE) {
                    let who = match (slot.attrs.get("namespace"), slot.attrs.get("pod")) {
                        (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
                        _ => slot.handle.clone(),
                    };
                    out.insert(
                        ItemKey::Route(host),
                        pb::DesiredItem {
                            item: Some(pb::desired_item::Item::Route(pb::KernelRoute {
                                destination: host.to_string(),
                                kind: pb::RouteKind::Workload.into(),
                                gateway: String::new(),
                                device: dev.clone(),
                                onlink: false,
                                source: format!("workload {who}"),
                            })),
                        },
                    );
                }
                continue;
            }
            // Addresses held by a node other than the block's: a /32 towards the holder.
            if Some(slot.node.as_str()) == owner {
                continue;
            }
            if let Some(n) = node(&slot.node)
                && let Some(item) = remote_route(host, pool, me, n)
            {
                out.insert(ItemKey::Route(host), item);
            }
        }
    }

    let any_vxlan = inputs.pools.iter().any(|p| p.vxlan_mode.is_on());
    if any_vxlan {
        for n in inputs.nodes {
            let (Some(ip), Some(mac), Some(tunnel)) =
                (n.ipv4, n.vxlan_tunnel_mac.as_ref(), n.vxlan_tunnel_address)
            else {
                continue;
            };
            let vtep = if n.name == inputs.me {
                out.insert(
                    ItemKey::LocalVtep,
                    pb::DesiredItem {
                        item: Some(pb::desired_item::Item::LocalVtep(pb::LocalVtep {
                            underlay_address: ip.addr().to_string(),
                            mac: mac.clone(),
                            tunnel_address: tunnel.to_string(),
                            vni: VXLAN_VNI,
                            port: VXLAN_PORT,
                            mtu: 0,
                        })),
                    },
                );
                continue;
            } else {
                pb::Vtep {
                    node: n.name.clone(),
                    underlay_address: ip.addr().to_string(),
                    mac: mac.clone(),
                    tunnel_address: tunnel.to_string(),
                }
            };
            out.insert(
                ItemKey::Vtep(n.name.clone()),
                pb::DesiredItem {
                    item: Some(pb::desired_item::Item::Vtep(vtep)),
                },
            );
        }
    }

    for p in inputs.pools {
        out.insert(
            ItemKey::NatPool(p.cidr),
            pb::DesiredItem {
                item: Some(pb::desired_item::Item::NatPool(pb::NatPool {
                    cidr: p.cidr.to_string(),
                    nat_outgoing: p.nat_outgoing,
                })),
            },
        );
    }
    out
}

/// Keys whose item differs between `old` and `new` (changed, added or removed).
pub fn changed_keys(old: &Desired, new: &Desired) -> Vec<ItemKey> {
    let mut keys: Vec<ItemKey> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    keys.extend(old.keys().filter(|k| !new.contains_key(*k)).cloned());
    keys
}

/// The changes from `old` to `new`: items to upsert and keys to remove.
pub fn diff(old: &Desired, new: &Desired) -> (Vec<pb::DesiredItem>, Vec<pb::DesiredKey>) {
    let mut upsert = Vec::new();
    let mut remove = Vec::new();
    for k in changed_keys(old, new) {
        match new.get(&k) {
            Some(v) => upsert.push(v.clone()),
            None => remove.push(k.to_proto()),
        }
    }
    (upsert, remove)
}

/// The confirmed affinities, indexed by (node, block): which node owns a block is asked for
/// every block, and a scan of every affinity each time cost 160 000 string comparisons per
/// recompute at 100 nodes.
pub struct ConfirmedAffinities<'a> {
    confirmed: HashSet<(&'a str, IpNet)>,
}

impl<'a> ConfirmedAffinities<'a> {
    pub fn new(affinities: &'a [BlockAffinity]) -> Self {
        ConfirmedAffinities {
            confirmed: affinities
                .iter()
                .filter(|a| a.state == AffinityState::Confirmed)
                .map(|a| (a.node.as_str(), a.cidr))
                .collect(),
        }
    }

    /// The node a block is affine to, if that affinity is confirmed (a pending block is
    /// neither routed nor announced).
    pub fn owner<'b>(&self, b: &'b Block) -> Option<&'b str> {
        let owner = b.affinity.as_deref()?;
        self.confirmed.contains(&(owner, b.cidr)).then_some(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipam::model::Node;

    fn node(name: &str, ip: &str, tunnel: &str) -> Node {
        let mut n = Node::new(name);
        n.ipv4 = Some(ip.parse().unwrap());
        n.vxlan_tunnel_address = Some(tunnel.parse().unwrap());
        n.vxlan_tunnel_mac = Some(format!("66:00:00:00:00:{:02x}", name.len()));
        n
    }

    fn block(cidr: &str, owner: Option<&str>) -> (Block, Option<BlockAffinity>) {
        let cidr: IpNet = cidr.parse().unwrap();
        let b = Block::new(cidr, "default", owner, 0);
        let a = owner.map(|o| BlockAffinity {
            node: o.into(),
            cidr,
            state: AffinityState::Confirmed,
        });
        (b, a)
    }

    fn kernel_route(d: &Desired, dest: &str) -> Option<pb::KernelRoute> {
        match d
            .get(&ItemKey::Route(dest.parse().unwrap()))?
            .item
            .clone()?
        {
            pb::desired_item::Item::Route(r) => Some(r),
            _ => None,
        }
    }

    struct World {
        nodes: Vec<Node>,
        pools: Vec<IpPool>,
        blocks: Vec<Block>,
        affinities: Vec<BlockAffinity>,
    }

    impl World {
        fn new(mode: EncapMode) -> Self {
            let mut pool = IpPool::new("default", "172.20.0.0/16".parse().unwrap());
            pool.vxlan_mode = mode;
            pool.nat_outgoing = true;
            let mut w = World {
                nodes: vec![
                    node("a", "10.0.0.1/24", "172.20.0.1"),
                    node("b", "10.0.0.2/24", "172.20.0.65"),
                    node("d", "10.0.1.4/24", "172.20.0.129"),
                ],
                pools: vec![pool],
                blocks: vec![],
                affinities: vec![],
            };
            for (cidr, owner) in [
                ("172.20.0.0/26", "a"),
                ("172.20.0.64/26", "b"),
                ("172.20.0.128/26", "d"),
            ] {
                let (b, a) = block(cidr, Some(owner));
                w.blocks.push(b);
                w.affinities.extend(a);
            }
            w
        }
        fn compute(&self, me: &str) -> Desired {
            compute(&Inputs {
                me,
                nodes: &self.nodes,
                pools: &self.pools,
                blocks: &self.blocks,
                affinities: &self.affinities,
            })
        }
    }

    #[test]
    fn cross_subnet_is_direct_in_the_subnet_and_vxlan_beyond() {
        let w = World::new(EncapMode::CrossSubnet);
        let d = w.compute("a");
        let own = kernel_route(&d, "172.20.0.0/26").unwrap();
        assert_eq!(own.kind(), pb::RouteKind::Blackhole);
        let same = kernel_route(&d, "172.20.0.64/26").unwrap();
        assert_eq!(
            (same.kind(), same.gateway.as_str(), same.onlink),
            (pb::RouteKind::Gateway, "10.0.0.2", false)
        );
        let other = kernel_route(&d, "172.20.0.128/26").unwrap();
        assert_eq!(
            (other.kind(), other.gateway.as_str(), other.onlink),
            (pb::RouteKind::Vxlan, "172.20.0.129", true)
        );
        assert!(
            d.contains_key(&ItemKey::Vtep("b".into()))
                && d.contains_key(&ItemKey::Vtep("d".into()))
        );
        assert!(d.contains_key(&ItemKey::LocalVtep));
        assert!(!d.contains_key(&ItemKey::Vtep("a".into())));
        // Both ways: d sees a and b over VXLAN.
        let from_d = w.compute("d");
        assert_eq!(
            kernel_route(&from_d, "172.20.0.0/26").unwrap().kind(),
            pb::RouteKind::Vxlan
        );
        assert_eq!(
            kernel_route(&from_d, "172.20.0.64/26").unwrap().gateway,
            "172.20.0.65"
        );
    }

    #[test]
    fn vxlan_always_tunnels_even_in_the_subnet() {
        let d = World::new(EncapMode::Always).compute("a");
        assert_eq!(
            kernel_route(&d, "172.20.0.64/26").unwrap().kind(),
            pb::RouteKind::Vxlan
        );
    }

    #[test]
    fn no_encapsulation_leaves_remote_blocks_to_bgp() {
        let d = World::new(EncapMode::Never).compute("a");
        assert_eq!(
            kernel_route(&d, "172.20.0.0/26").unwrap().kind(),
            pb::RouteKind::Blackhole
        );
        assert!(kernel_route(&d, "172.20.0.64/26").is_none());
        assert!(
            !d.contains_key(&ItemKey::LocalVtep),
            "no VXLAN pool, no VXLAN device"
        );
        assert!(d.contains_key(&ItemKey::NatPool("172.20.0.0/16".parse().unwrap())));
    }

    #[test]
    fn pending_blocks_are_neither_blackholed_nor_routed() {
        let mut w = World::new(EncapMode::CrossSubnet);
        for a in &mut w.affinities {
            a.state = AffinityState::Pending;
        }
        let d = w.compute("a");
        assert!(
            d.keys().all(|k| !matches!(k, ItemKey::Route(_))),
            "{:?}",
            d.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn borrowed_addresses_get_a_host_route_to_their_holder() {
        let mut w = World::new(EncapMode::CrossSubnet);
        // d borrowed 172.20.0.70 from b's block.
        let attrs = Default::default();
        w.blocks[1]
            .allocate_addr("172.20.0.70".parse().unwrap(), "h", "d", &attrs)
            .unwrap();
        let d = w.compute("a");
        let host = kernel_route(&d, "172.20.0.70/32").unwrap();
        assert_eq!(
            (host.kind(), host.gateway.as_str()),
            (pb::RouteKind::Vxlan, "172.20.0.129")
        );
        // On d itself, its own borrowed address is its workload route, not ours.
        assert!(kernel_route(&w.compute("d"), "172.20.0.70/32").is_none());
    }

    #[test]
    fn our_workloads_get_a_host_route_on_their_interface() {
        let mut w = World::new(EncapMode::CrossSubnet);
        let attrs: BTreeMap<String, String> = [
            (
                WORKLOAD_INTERFACE.to_string(),
                "cali0123456789a".to_string(),
            ),
            ("namespace".to_string(), "default".to_string()),
            ("pod".to_string(), "web-0".to_string()),
        ]
        .into();
        w.blocks[0]
            .allocate_addr("172.20.0.5".parse().unwrap(), "h", "a", &attrs)
            .unwrap();
        // Allocated without an interface (another main plugin): no route of ours.
        w.blocks[0]
            .allocate_addr(
                "172.20.0.6".parse().unwrap(),
                "h2",
                "a",
                &Default::default(),
            )
            .unwrap();
        let r = kernel_route(&w.compute("a"), "172.20.0.5/32").unwrap();
        assert_eq!(
            (r.kind(), r.device.as_str(), r.source.as_str()),
            (
                pb::RouteKind::Workload,
                "cali0123456789a",
                "workload default/web-0"
            )
        );
        assert!(kernel_route(&w.compute("a"), "172.20.0.6/32").is_none());
        // Other nodes route the whole block, not the pod.
        assert!(kernel_route(&w.compute("b"), "172.20.0.5/32").is_none());
    }

    #[test]
    fn a_mode_change_is_a_small_diff() {
        let w = World::new(EncapMode::CrossSubnet);
        let before = w.compute("a");
        let mut w2 = World::new(EncapMode::Always);
        w2.blocks = w.blocks.clone();
        let after = w2.compute("a");
        let (upsert, remove) = diff(&before, &after);
        assert_eq!(upsert.len(), 1, "only b's block changes: {upsert:?}");
        assert!(remove.is_empty());
        let (upsert, remove) = diff(&after, &after);
        assert!(upsert.is_empty() && remove.is_empty());
        let (_, remove) = diff(&after, &Desired::new());
        assert_eq!(remove.len(), after.len());
    }
}
