//! What a pod of another main plugin (ptp, bridge, macvlan, ...) makes of its block, sans IO.
//! `margay-ipam` hands such a plugin each address with its block's prefix, as calico-ipam does,
//! and the plugin puts it on the pod's interface that way: the block is then the pod's subnet.
//! So the block's network address, and an IPv4 block's broadcast address, are the subnet's, not
//! a pod's (an IPv4 broadcast address never reaches one pod; older kernels treat the network
//! address as a broadcast too), and with [`Gateway::Block`] its first address is the gateway,
//! which the main plugin puts on the segment (bridge's isGateway). Under `margay` none of this
//! applies: its pods have host addresses (/32, /128) and link-local gateways.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::spec::config::Gateway;

/// The address `offset` places after the network address of `block`.
fn nth(block: &IpNet, offset: u128) -> IpAddr {
    match block.network() {
        IpAddr::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n).wrapping_add(offset as u32))),
        IpAddr::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n).wrapping_add(offset))),
    }
}

/// How many addresses `block` has (saturating at u128::MAX for a /0 IPv6).
fn size(block: &IpNet) -> u128 {
    let host_bits = u32::from(block.max_prefix_len() - block.prefix_len());
    1u128.checked_shl(host_bits).unwrap_or(u128::MAX)
}

/// The gateway reported with `address` (the pod's address with its block's prefix).
pub fn gateway(address: &IpNet, mode: Gateway) -> Result<IpAddr, String> {
    match mode {
        Gateway::LinkLocal => Ok(crate::names::gateway_of(address.addr())),
        Gateway::Block => {
            let block = address.trunc();
            // Network address, gateway, one pod (and an IPv4 broadcast address): four at least.
            if size(&block) < 4 {
                return Err(format!(
                    "the block {block} is too small to hold a gateway besides its pods; use blocks of /30 (IPv4) or /126 (IPv6) or larger, or set ipam.gateway to \"link-local\""
                ));
            }
            Ok(nth(&block, 1))
        }
    }
}

/// Whether a pod must not get `address` (with its block's prefix): it is the block's network
/// address, its IPv4 broadcast address, or (with [`Gateway::Block`]) its gateway. Blocks too
/// small to have a subnet's addresses (/31 and /32, /127 and /128 under link-local gateways)
/// withhold nothing.
pub fn withheld(address: &IpNet, mode: Gateway) -> Result<bool, String> {
    let block = address.trunc();
    let ip = address.addr();
    if mode == Gateway::Block && ip == gateway(address, mode)? {
        return Ok(true);
    }
    Ok(match block {
        // A router on the segment answers an IPv6 block's first address as its Subnet-Router
        // anycast address (RFC 4291 2.6.1): only when the gateway is on the segment.
        IpNet::V6(_) => mode == Gateway::Block && ip == block.network(),
        IpNet::V4(_) => size(&block) >= 4 && (ip == block.network() || ip == block.broadcast()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn gateways_by_mode() {
        let v4 = net("172.20.3.70/26");
        let v6 = net("fd00::45/122");
        assert_eq!(gateway(&v4, Gateway::LinkLocal), Ok(ip("169.254.1.1")));
        assert_eq!(
            gateway(&v6, Gateway::LinkLocal),
            Ok(ip("fe80::ecee:eeff:feee:eeee"))
        );
        assert_eq!(gateway(&v4, Gateway::Block), Ok(ip("172.20.3.65")));
        assert_eq!(gateway(&v6, Gateway::Block), Ok(ip("fd00::41")));
        assert_eq!(
            gateway(&net("10.0.0.5/30"), Gateway::Block),
            Ok(ip("10.0.0.5"))
        );
        for tiny in ["10.0.0.4/31", "10.0.0.4/32", "fd00::4/127", "fd00::4/128"] {
            let e = gateway(&net(tiny), Gateway::Block).unwrap_err();
            assert!(e.contains("too small") && e.contains("link-local"), "{e}");
            assert!(gateway(&net(tiny), Gateway::LinkLocal).is_ok());
        }
    }

    #[test]
    fn the_subnets_own_addresses_are_withheld() {
        let w = |a: &str, m| withheld(&net(a), m).unwrap();
        for m in [Gateway::LinkLocal, Gateway::Block] {
            assert!(w("172.20.3.64/26", m), "network, {m:?}");
            assert!(w("172.20.3.127/26", m), "broadcast, {m:?}");
            assert!(!w("172.20.3.66/26", m));
            assert!(!w("fd00::42/122", m));
            assert!(!w("fd00::7f/122", m), "IPv6 has no broadcast address");
        }
        assert!(w("172.20.3.65/26", Gateway::Block));
        assert!(!w("172.20.3.65/26", Gateway::LinkLocal));
        assert!(w("fd00::41/122", Gateway::Block));
        assert!(w("fd00::40/122", Gateway::Block), "Subnet-Router anycast");
        assert!(!w("fd00::40/122", Gateway::LinkLocal));
        assert!(!w("fd00::41/122", Gateway::LinkLocal));
        // Host-sized blocks are all pod.
        for a in ["10.0.0.4/32", "10.0.0.4/31", "10.0.0.5/31", "fd00::4/128"] {
            assert!(!w(a, Gateway::LinkLocal), "{a}");
        }
        assert!(withheld(&net("10.0.0.4/31"), Gateway::Block).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(size(&net("10.0.0.0/26")), 64);
        assert_eq!(size(&net("0.0.0.0/0")), 1 << 32);
        assert_eq!(size(&net("::/0")), u128::MAX);
        assert_eq!(nth(&net("10.0.0.64/26"), 1), ip("10.0.0.65"));
    }
}
