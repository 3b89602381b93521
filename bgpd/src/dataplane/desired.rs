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

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use ::datastore::model::{EncapMode, IpFamily, IpPool, Node};
use ipam::block::{AffinityState, Block, BlockAffinity};
use ipnet::IpNet;

use super::item::{Desired, DesiredItem, ItemKey, KernelRoute, LocalVtep, NatPool, Via, Vtep};
// Where `cluster::tunnel` finds it: it derives its VTEP MAC with the contract's family.
pub use super::item::pb_family;

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
    /// Routes to BGP peers through a gateway (Calico's `BGPPeer.reachableBy`): peer address,
    /// gateway, the peer's name.
    pub peer_gateways: &'a [(IpAddr, IpAddr, String)],
}

fn route(destination: IpNet, via: Via, source: String) -> DesiredItem {
    DesiredItem::Route(KernelRoute {
        destination,
        via,
        source,
    })
}

/// How traffic to `node` for a block of `pool` is carried, if this module decides it.
fn remote_route(dest: IpNet, pool: &IpPool, me: Option<&Node>, node: &Node) -> Option<DesiredItem> {
    if !pool.vxlan_mode.is_on() {
        return None;
    }
    // Everything is of the destination's family: the node's address, our subnet, the VTEP.
    let family = IpFamily::of_net(&dest);
    let theirs = node.address(family)?;
    let same_subnet = me
        .and_then(|m| m.address(family))
        .is_some_and(|mine| mine.contains(&theirs.addr()));
    if pool.vxlan_mode == EncapMode::CrossSubnet && same_subnet {
        return Some(route(
            dest,
            Via::Gateway(theirs.addr()),
            format!(
                "block of {} (pool {} CrossSubnet, same subnet)",
                node.name, pool.name
            ),
        ));
    }
    let (tunnel, _) = node.vxlan_tunnel(family)?;
    Some(route(
        dest,
        Via::Vxlan(tunnel),
        format!("block of {} (pool {} VXLAN)", node.name, pool.name),
    ))
}

#[expect(
    clippy::too_many_lines,
    reason = "the whole desired state in three passes sharing the indexed lookups: every block's routes, one VTEP per node and family, the peers' gateway routes"
)]
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
                    Via::Blackhole,
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
                        route(
                            host,
                            Via::Workload {
                                device: dev.clone(),
                            },
                            format!("workload {who}"),
                        ),
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

    // One VTEP per node and family, where a VXLAN pool of that family exists.
    for family in IpFamily::ALL {
        let any_vxlan = inputs
            .pools
            .iter()
            .any(|p| p.vxlan_mode.is_on() && IpFamily::of_net(&p.cidr) == family);
        if !any_vxlan {
            continue;
        }
        for n in inputs.nodes {
            let (Some(ip), Some((tunnel, mac))) = (n.address(family), n.vxlan_tunnel(family))
            else {
                continue;
            };
            let (key, item) = if n.name == inputs.me {
                (
                    ItemKey::LocalVtep(family),
                    DesiredItem::LocalVtep(LocalVtep {
                        underlay_address: ip.addr(),
                        mac: mac.to_owned(),
                        tunnel_address: tunnel,
                        vni: VXLAN_VNI,
                        port: VXLAN_PORT,
                        mtu: 0,
                    }),
                )
            } else {
                (
                    ItemKey::Vtep(n.name.clone(), family),
                    DesiredItem::Vtep(Vtep {
                        node: n.name.clone(),
                        underlay_address: ip.addr(),
                        mac: mac.to_owned(),
                        tunnel_address: tunnel,
                    }),
                )
            };
            out.insert(key, item);
        }
    }

    // A peer beyond our subnet is reached through the gateway its BGPPeer names, as Calico
    // adds a static route for it.
    for (peer, gateway, name) in inputs.peer_gateways {
        let dest = IpNet::from(*peer);
        out.insert(
            ItemKey::Route(dest),
            route(
                dest,
                Via::Gateway(*gateway),
                format!("BGPPeer {name} reachableBy"),
            ),
        );
    }

    for p in inputs.pools {
        out.insert(
            ItemKey::NatPool(p.cidr),
            DesiredItem::NatPool(NatPool {
                cidr: p.cidr,
                nat_outgoing: p.nat_outgoing,
            }),
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
pub fn diff(old: &Desired, new: &Desired) -> (Vec<DesiredItem>, Vec<ItemKey>) {
    let mut upsert = Vec::new();
    let mut remove = Vec::new();
    for k in changed_keys(old, new) {
        match new.get(&k) {
            Some(v) => upsert.push(v.clone()),
            None => remove.push(k),
        }
    }
    (upsert, remove)
}

/// The confirmed affinities, indexed by (block, node): which node owns a block is asked for
/// every block, and a scan of every affinity each time cost 160 000 string comparisons per
/// recompute at 100 nodes. Ordered by the block first, so a lookup compares node names only
/// of the block's own affinities (hashing each name cost more than the whole lookup).
pub struct ConfirmedAffinities<'a> {
    confirmed: BTreeSet<(IpNet, &'a str)>,
}

impl<'a> ConfirmedAffinities<'a> {
    pub fn new(affinities: &'a [BlockAffinity]) -> Self {
        ConfirmedAffinities {
            confirmed: affinities
                .iter()
                .filter(|a| a.state == AffinityState::Confirmed)
                .map(|a| (a.cidr, a.node.as_str()))
                .collect(),
        }
    }

    /// The node a block is affine to, if that affinity is confirmed (a pending block is
    /// neither routed nor announced).
    pub fn owner<'b>(&self, b: &'b Block) -> Option<&'b str> {
        let owner = b.affinity.as_deref()?;
        self.confirmed.contains(&(b.cidr, owner)).then_some(owner)
    }
}

#[cfg(test)]
mod tests;
