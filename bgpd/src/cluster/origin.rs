//! What this node originates into BGP, from IPAM: its confirmed blocks (never a pending
//! one), the addresses it borrowed from other nodes' blocks as /32, and, when configured,
//! one aggregate per pool it has blocks in; both families alike (exported to external peers only, see the
//! policy). Nothing else: no default route, no interface routes.

use std::collections::BTreeSet;

use bgp_wire::Prefix;
use ipam::block::AffinityState;
use ipnet::IpNet;

use super::ClusterState;

fn prefix(n: IpNet) -> Option<Prefix> {
    Prefix::new(n.network(), n.prefix_len())
}

/// This node's confirmed blocks, of both families.
pub fn own_blocks(me: &str, c: &ClusterState) -> Vec<IpNet> {
    // Only this node's confirmed affinities: an index of every node's (`c.confirmed()`)
    // was built twice per change on every node to find a handful.
    let mine: BTreeSet<IpNet> = c
        .affinities
        .iter()
        .filter(|a| a.node == me && a.state == AffinityState::Confirmed)
        .map(|a| a.cidr)
        .collect();
    c.blocks
        .iter()
        .filter(|b| b.affinity.as_deref() == Some(me) && mine.contains(&b.cidr))
        .map(|b| b.cidr)
        .collect()
}

/// The prefixes node `me` announces, of both families (the caller announces a family only
/// where the node has an address of it to put in the next hop).
pub fn originated(me: &str, c: &ClusterState, aggregate: bool) -> BTreeSet<Prefix> {
    let mut out = BTreeSet::new();
    let own = own_blocks(me, c);
    out.extend(own.iter().filter_map(|n| prefix(*n)));
    for b in &c.blocks {
        if b.affinity.as_deref() == Some(me) {
            continue;
        }
        for (ordinal, slot) in &b.slots {
            if slot.node != me {
                continue;
            }
            let a = b.address(*ordinal);
            out.extend(prefix(IpNet::from(a)));
        }
    }
    if aggregate {
        for p in &c.pools {
            if !p.disable_bgp_export && own.iter().any(|b| p.cidr.contains(&b.network())) {
                out.extend(prefix(p.cidr));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::datastore::model::IpPool;
    use ipam::block::{AffinityState, Block, BlockAffinity, Slot};

    fn block(cidr: &str, owner: Option<&str>) -> Block {
        Block::new(cidr.parse().unwrap(), "default", owner, 0)
    }

    fn affinity(node: &str, cidr: &str, state: AffinityState) -> BlockAffinity {
        BlockAffinity {
            node: node.into(),
            cidr: cidr.parse().unwrap(),
            state,
        }
    }

    fn state() -> ClusterState {
        let mut borrowed = block("172.20.0.64/26", Some("b"));
        borrowed.slots.insert(
            5,
            Slot {
                handle: "h".into(),
                node: "a".into(),
                seq: 1,
                attrs: Default::default(),
            },
        );
        ClusterState {
            pools: vec![IpPool::new("default", "172.20.0.0/16".parse().unwrap())],
            blocks: vec![
                block("172.20.0.0/26", Some("a")),
                borrowed,
                block("172.20.0.128/26", Some("a")),
            ],
            affinities: vec![
                affinity("a", "172.20.0.0/26", AffinityState::Confirmed),
                affinity("b", "172.20.0.64/26", AffinityState::Confirmed),
                affinity("a", "172.20.0.128/26", AffinityState::Pending),
            ],
            ..Default::default()
        }
    }

    fn strings(s: &BTreeSet<Prefix>) -> Vec<String> {
        s.iter()
            .map(|p| format!("{}/{}", p.addr(), p.prefix_len()))
            .collect()
    }

    #[test]
    fn confirmed_blocks_and_borrowed_addresses_never_pending_blocks() {
        let c = state();
        assert_eq!(
            strings(&originated("a", &c, false)),
            ["172.20.0.0/26", "172.20.0.69/32"]
        );
        assert_eq!(strings(&originated("b", &c, false)), ["172.20.0.64/26"]);
        assert!(originated("c", &c, false).is_empty());
    }

    #[test]
    fn aggregation_adds_the_pool_where_the_node_has_blocks() {
        let mut c = state();
        let a = strings(&originated("a", &c, true));
        assert_eq!(a, ["172.20.0.0/16", "172.20.0.0/26", "172.20.0.69/32"]);
        c.pools[0].disable_bgp_export = true;
        assert!(!strings(&originated("a", &c, true)).contains(&"172.20.0.0/16".to_string()));
        assert!(!strings(&originated("c", &c, true)).contains(&"172.20.0.0/16".to_string()));
    }

    #[test]
    fn ipv6_blocks_and_borrowed_ipv6_addresses_are_originated_like_ipv4_ones() {
        let mut c = state();
        c.pools
            .push(IpPool::new("v6", "fd00:20::/48".parse().unwrap()));
        let mut borrowed = block("fd00:20::40/122", Some("b"));
        borrowed.slots.insert(
            3,
            Slot {
                handle: "h6".into(),
                node: "a".into(),
                seq: 2,
                attrs: Default::default(),
            },
        );
        c.blocks.push(block("fd00:20::/122", Some("a")));
        c.blocks.push(borrowed);
        c.affinities
            .push(affinity("a", "fd00:20::/122", AffinityState::Confirmed));
        c.affinities
            .push(affinity("b", "fd00:20::40/122", AffinityState::Confirmed));
        assert_eq!(
            strings(&originated("a", &c, false)),
            [
                "172.20.0.0/26",
                "172.20.0.69/32",
                "fd00:20::/122",
                "fd00:20::43/128"
            ]
        );
        assert_eq!(
            own_blocks("a", &c),
            [
                "172.20.0.0/26".parse::<IpNet>().unwrap(),
                "fd00:20::/122".parse().unwrap()
            ]
        );
        assert!(strings(&originated("a", &c, true)).contains(&"fd00:20::/48".to_string()));
    }
}
