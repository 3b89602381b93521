//! BIRD 1.6 configured as Calico's confd renders a node of a kernel-programming run: the
//! mesh (`lab::calico_bird` with its kernel protocol), or route reflection: the node-to-node
//! mesh off and the peerings of `BGPPeer` resources selecting the reflectors, which confd
//! renders as node-specific peers `Node_<address>` (both sides connect; no `passive`). On a
//! reflector (a node with a route-reflector cluster id), a peer without that cluster id is a
//! client (`rr client; rr cluster id <id>;`); a reflector of the same cluster id is a plain
//! iBGP peer. A client peers with every reflector. The rest of the file (filters, kernel,
//! static, device, direct, the template) is `lab::calico_bird`'s.

use std::net::{IpAddr, Ipv4Addr};

use interop_tests::lab::calico_bird::{self, Dialect, NodeConfig, Pool};
use interop_tests::lab::mesh::{self, Mesh};
use ipnet::IpNet;

use super::RR_CLUSTER_ID;

/// Node `i`'s bird.cfg: its own blocks plus `extra` (blocks claimed since), the kernel
/// protocol on, peered as the topology says (`reflectors` 0: the mesh).
pub fn config(
    mesh: &Mesh,
    i: usize,
    reflectors: usize,
    extra: &[ipnet::Ipv4Net],
) -> Result<String, String> {
    let n = mesh.nodes.len();
    let me = mesh.nodes[i].addr;
    let blocks: Vec<IpNet> = mesh::node_blocks(i)
        .into_iter()
        .chain(extra.iter().copied())
        .map(IpNet::V4)
        .collect();
    let pools = [Pool {
        cidr: mesh::pool(n)
            .parse()
            .map_err(|e| format!("{}: {e}", mesh::pool(n)))?,
        vxlan: false,
    }];
    let all: Vec<IpAddr> = mesh.nodes.iter().map(|m| IpAddr::V4(m.addr)).collect();
    let node = NodeConfig {
        router_id: me,
        address: IpAddr::V4(me),
        blocks: &blocks,
        pools: &pools,
        // With reflectors, the mesh is off: the sessions are the BGPPeers' below.
        peers: if reflectors == 0 { &all } else { &[] },
        kernel: true,
        log: None,
    };
    let mut text = node.render(Dialect::Bird1)?;
    if reflectors > 0 {
        let addrs: Vec<Ipv4Addr> = mesh.nodes.iter().map(|m| m.addr).collect();
        text.push_str(&reflector_peers(&addrs, i, reflectors));
    }
    Ok(text)
}

/// The `Node_` protocols of node `i` when nodes `0..reflectors` reflect.
fn reflector_peers(addrs: &[Ipv4Addr], i: usize, reflectors: usize) -> String {
    let me = addrs[i];
    let i_reflect = i < reflectors;
    let peers: Vec<usize> = if i_reflect {
        (0..addrs.len()).filter(|&j| j != i).collect()
    } else {
        (0..reflectors.min(addrs.len())).collect()
    };
    let mut c = String::from("# Peers of the BGPPeer resources (route reflection).\n");
    for j in peers {
        let peer = addrs[j];
        let name = calico_bird::mesh_name(peer).replacen("Mesh_", "Node_", 1);
        c.push_str(&format!(
            "protocol bgp {name} from bgp_template {{\n  neighbor {peer} as {};\n  \
             source address {me};\n",
            calico_bird::AS
        ));
        // A peer outside this reflector's cluster is its client.
        if i_reflect && j >= reflectors {
            c.push_str(&format!("  rr client;\n  rr cluster id {RR_CLUSTER_ID};\n"));
        }
        c.push_str("}\n\n");
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflectors_serve_clients_and_clients_peer_with_both() {
        let addrs: Vec<Ipv4Addr> = (1..=4).map(|k| Ipv4Addr::new(10, 77, 1, k)).collect();
        let rr = reflector_peers(&addrs, 0, 2);
        assert_eq!(rr.matches("protocol bgp").count(), 3, "{rr}");
        // The other reflector is a plain peer, the two clients are clients.
        assert!(rr.contains("Node_10_77_1_2 from bgp_template {\n  neighbor 10.77.1.2 as 64512;\n  source address 10.77.1.1;\n}"), "{rr}");
        assert_eq!(rr.matches("rr client;").count(), 2, "{rr}");
        assert_eq!(rr.matches("rr cluster id 244.0.0.1;").count(), 2, "{rr}");
        let client = reflector_peers(&addrs, 3, 2);
        assert_eq!(client.matches("protocol bgp").count(), 2, "{client}");
        assert!(client.contains("Node_10_77_1_1 ") && client.contains("Node_10_77_1_2 "));
        assert!(!client.contains("rr client") && !client.contains("passive"));
    }
}
