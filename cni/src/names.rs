//! Names and fixed addresses a Calico node uses, so `ip link` and `ip route` read the same on a
//! margay node: the host-side interface name, the host-side MAC and the pod's gateways.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Every host-side veth has this MAC (Calico's): pods resolve their gateway to it.
pub const HOST_MAC: [u8; 6] = [0xee; 6];
/// The pod's IPv4 gateway. Nothing owns it: the host side answers ARP for it (proxy ARP).
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pod's IPv6 gateway: the link-local address the kernel derives (EUI-64) from HOST_MAC.
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);

/// The link-local gateway of `ip`'s family (169.254.1.1 or fe80::ecee:eeff:feee:eeee).
pub fn gateway_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(GATEWAY_V4),
        IpAddr::V6(_) => IpAddr::V6(GATEWAY_V6),
    }
}

/// Calico's host-side interface name, shared with the Kubernetes datastore's view of a Pod.
pub use net_types::workload::host_ifname;

pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::mac::sha1;

    #[test]
    fn calico_names() {
        let name = host_ifname("cali", Some("default.web-0"), "ignored");
        assert_eq!(name.len(), 15);
        assert!(name.starts_with("cali"));
        assert_eq!(&name[4..], &hex(&sha1(b"default.web-0"))[..11]);
        // Without a pod name the container id is hashed.
        let by_id = host_ifname("cali", None, "abc123");
        assert_eq!(&by_id[4..], &hex(&sha1(b"abc123"))[..11]);
        assert_ne!(by_id, host_ifname("cali", None, "abc124"));
        // Other prefixes still fill 15 bytes.
        assert_eq!(host_ifname("mgy", None, "x").len(), 15);
        assert_eq!(host_ifname("averylongpre", None, "x").len(), 15);
    }

    #[test]
    fn known_digest() {
        // FIPS 180-4's example digest of "abc".
        assert_eq!(
            hex(&sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(host_ifname("cali", Some("abc"), "x"), "calia9993e36470");
    }

    #[test]
    fn gateway_v6_is_the_eui64_of_the_host_mac() {
        let m = HOST_MAC;
        let eui = [m[0] ^ 0x02, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]];
        let mut octets = [0u8; 16];
        octets[0] = 0xfe;
        octets[1] = 0x80;
        octets[8..].copy_from_slice(&eui);
        assert_eq!(Ipv6Addr::from(octets), GATEWAY_V6);
        assert_eq!(GATEWAY_V6.to_string(), "fe80::ecee:eeff:feee:eeee");
        assert_eq!(format_mac(&HOST_MAC), "ee:ee:ee:ee:ee:ee");
    }

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }
}
