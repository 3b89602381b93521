//! What this node originates into BGP, from IPAM: its confirmed blocks (never a pending
//! one), the addresses it borrowed from other nodes' blocks as /32, and, when configured,
//! one aggregate per pool it has blocks in (exported to external peers only, see the
//! policy). Nothing else: no default route, no interface routes.

use std::collections::BTreeSet;

use bgp_wire::Ipv4Prefix;
use ipnet::{IpNet, Ipv4Net};

use super::ClusterState;

fn prefix(n: Ipv4Net) -> Option<Ipv4Prefix> {
    Ipv4Prefix::new(n.network(), n.prefix_len())
}

/// This node's confirmed IPv4 blocks.
pub fn own_blocks(me: &str, c: &ClusterState) -> Vec<Ipv4Net> {
    let confirmed = c.confirmed();
    c.blocks
        .iter()
        .filter(|b| confirmed.owner(b) == Some(me))
        .filter_map(|b| match b.cidr {
            IpNet::V4(n) => Some(n),
            IpNet::V6(_) => None,
        })
        .collect()
}

/// The prefixes node `me` announces.
pub fn originated(me: &str, c: &ClusterState, aggregate: bool) -> BTreeSet<Ipv4Prefix> {
    let mut out = BTreeSet::new();
    let own = own_blocks(me, c);
    out.extend(own.iter().filter_map(|n| prefix(*n)));
    for b in &c.blocks {
        let IpNet::V4(_) = b.cidr else { continue };
        if b.affinity.as_deref() == Some(me) {
            continue;
        }
        for (ordinal, slot) in &b.slots {
            if slot.node != me {
                continue;
            }
            if let std::net::IpAddr::V4(a) = b.address(*ordinal) {
                out.extend(Ipv4Prefix::new(a, 32));
            }
        }
    }
    if aggregate {
        for p in &c.pools {
            let IpNet::V4(cidr) = p.cidr else { continue };
            if !p.disable_bgp_export && own.iter().any(|b| cidr.contains(&b.network())) {
                out.extend(prefix(cidr));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipam::block::{AffinityState, Block, BlockAffinity, Slot};
    use ipam::model::IpPool;

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

    fn strings(s: &BTreeSet<Ipv4Prefix>) -> Vec<String> {
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
}
