//! This node's VXLAN tunnel address and VTEP MAC, claimed from IPAM and written on its node
//! resource in the datastore (as calico-node does). The brain's task calls [`ensure_tunnel`]
//! first on each pass; when it writes, the pass ends there and the node's own change brings
//! the next one. It writes nothing else and computes nothing for the dataplane.

use ipam::IpamError;
use ipam::allocator::{AssignRequest, Ipam, TUNNEL_HANDLE_PREFIX};
use ipam::model::AllowedUse;
use ipam::selector::Selector;
use ipam::store::Store;

use super::ClusterState;

/// Gives this node its VXLAN tunnel address and VTEP MAC when a VXLAN pool that allows
/// tunnel addresses selects it (as calico-node does). Returns whether it wrote anything.
pub async fn ensure_tunnel(
    ipam: &Ipam<Store>,
    me: &str,
    c: &ClusterState,
) -> Result<bool, IpamError> {
    let Some(node) = c.nodes.iter().find(|n| n.name == me) else {
        return Ok(false);
    };
    if node.vxlan_tunnel_address.is_some() && node.vxlan_tunnel_mac.is_some() {
        return Ok(false);
    }
    let pools: Vec<String> = c
        .pools
        .iter()
        .filter(|p| {
            p.vxlan_mode.is_on()
                && !p.disabled
                && p.allows(AllowedUse::Tunnel)
                && p.cidr.addr().is_ipv4()
        })
        .filter(|p| Selector::parse(&p.node_selector).is_ok_and(|s| s.matches(&node.labels)))
        .map(|p| p.name.clone())
        .collect();
    if pools.is_empty() {
        return Ok(false);
    }
    let handle = format!("{TUNNEL_HANDLE_PREFIX}{me}");
    // An address from an earlier attempt that did not reach the node is reused.
    let address = match ipam.handle_allocations(&handle).await {
        Ok(held) if !held.is_empty() => held[0].address,
        _ => {
            let req = AssignRequest {
                handle,
                node: me.into(),
                num_v4: 1,
                v4_pools: pools,
                use_tunnel: true,
                attrs: [
                    ("type".to_owned(), "vxlanTunnelAddress".to_owned()),
                    ("node".to_owned(), me.to_owned()),
                ]
                .into(),
                ..Default::default()
            };
            ipam.auto_assign(&req).await?.0[0].address
        }
    };
    let (mut node, rev) = ipam.get_node(me).await?;
    node.vxlan_tunnel_address = Some(address);
    node.vxlan_tunnel_mac = Some(proto::mac::format_mac(&proto::mac::vtep_mac(me)));
    ipam.register_node(&node, Some(rev)).await?;
    tracing::info!(node = me, tunnel = %address, "VXLAN tunnel address assigned");
    Ok(true)
}
