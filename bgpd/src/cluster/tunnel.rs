//! This node's VXLAN tunnel address and VTEP MAC, claimed from IPAM and written on its node
//! resource in the datastore (as calico-node does). The brain's task calls [`ensure_tunnel`]
//! first on each pass; when it writes, the pass ends there and the node's own change brings
//! the next one. It writes nothing else and computes nothing for the dataplane.

use ::datastore::model::{AllowedUse, IpFamily};
use ::datastore::selector::Selector;
use ::datastore::{Resources, Store};
use ipam::IpamError;
use ipam::allocator::{AssignRequest, Ipam, tunnel_handle};

use super::ClusterState;
use crate::dataplane::desired;

/// Gives this node its VXLAN tunnel address and VTEP MAC of each family where a VXLAN pool
/// of that family that allows tunnel addresses selects it (as calico-node does). Returns
/// whether it wrote anything.
pub async fn ensure_tunnel(
    ipam: &Ipam<Store>,
    me: &str,
    c: &ClusterState,
) -> Result<bool, IpamError> {
    let mut wrote = false;
    for family in IpFamily::ALL {
        wrote |= ensure_family(ipam, me, c, family).await?;
    }
    Ok(wrote)
}

async fn ensure_family(
    ipam: &Ipam<Store>,
    me: &str,
    c: &ClusterState,
    family: IpFamily,
) -> Result<bool, IpamError> {
    let Some(node) = c.nodes.iter().find(|n| n.name == me) else {
        return Ok(false);
    };
    // A VTEP needs an underlay address of its family.
    if node.vxlan_tunnel(family).is_some() || node.address(family).is_none() {
        return Ok(false);
    }
    let pools: Vec<String> = c
        .pools
        .iter()
        .filter(|p| {
            p.vxlan_mode.is_on()
                && !p.disabled
                && p.allows(AllowedUse::Tunnel)
                && IpFamily::of_net(&p.cidr) == family
        })
        .filter(|p| Selector::parse(&p.node_selector).is_ok_and(|s| s.matches(&node.labels)))
        .map(|p| p.name.clone())
        .collect();
    if pools.is_empty() {
        return Ok(false);
    }
    let handle = tunnel_handle(family, me);
    // An address from an earlier attempt that did not reach the node is reused.
    let address = match ipam.handle_allocations(&handle).await {
        Ok(held) if !held.is_empty() => held[0].address,
        _ => {
            let (num_v4, num_v6, v4_pools, v6_pools) = match family {
                IpFamily::V4 => (1, 0, pools, Vec::new()),
                IpFamily::V6 => (0, 1, Vec::new(), pools),
            };
            let req = AssignRequest {
                handle,
                node: me.into(),
                num_v4,
                num_v6,
                v4_pools,
                v6_pools,
                use_tunnel: true,
                attrs: [
                    ("type".to_owned(), tunnel_type(family).to_owned()),
                    ("node".to_owned(), me.to_owned()),
                ]
                .into(),
                ..Default::default()
            };
            let (v4, v6) = ipam.auto_assign(&req).await?;
            match v4.into_iter().chain(v6).next() {
                Some(a) => a.address,
                None => return Ok(false),
            }
        }
    };
    let resources = Resources::new(ipam.store());
    let (mut node, rev) = resources.get_node(me).await?;
    let mac = proto::mac::format_mac(&proto::mac::vtep_mac(me, desired::pb_family(family)));
    node.set_vxlan_tunnel(family, Some((address, mac)));
    resources.register_node(&node, Some(rev)).await?;
    tracing::info!(node = me, tunnel = %address, family = family.name(), "VXLAN tunnel address assigned");
    Ok(true)
}

/// The allocation's `type` attribute, as Calico names it.
fn tunnel_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "vxlanTunnelAddress",
        IpFamily::V6 => "vxlanV6TunnelAddress",
    }
}
