//! What the speaker needs to know of the host's interfaces: the link-local IPv6 address
//! beside a global one, for the second next hop of RFC 2545 when the peer shares the link,
//! and which interface holds a session's local address (the interface `BGPFilter` rules
//! match the session's routes by); and, for `node_address`, the prefix length of the
//! interface that holds an address.
//!
//! Read with `getifaddrs(3)` when a session comes up (rare); nothing is cached, so an
//! address added later is seen by the next session.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The link-local address of the interface that holds `global`, if `peer` is in that
/// address's subnet (on the link) and the interface has one.
pub fn link_local_toward(global: Ipv6Addr, peer: Ipv6Addr) -> Option<Ipv6Addr> {
    let addrs = ipv6_addresses();
    let (name, _, mask) = addrs.iter().find(|(_, a, _)| *a == global)?;
    let on_link = u128::from(global) & u128::from(*mask) == u128::from(peer) & u128::from(*mask);
    if !on_link {
        return None;
    }
    addrs
        .iter()
        .find(|(n, a, _)| n == name && is_link_local(a))
        .map(|(_, a, _)| *a)
}

/// The interface that holds `local` (a session's own address), if any.
pub fn interface_of(local: IpAddr) -> Option<String> {
    match local.to_canonical() {
        IpAddr::V6(a) => ipv6_addresses()
            .into_iter()
            .find(|(_, x, _)| *x == a)
            .map(|(n, _, _)| n),
        IpAddr::V4(a) => ipv4_addresses()
            .into_iter()
            .find(|(_, x)| *x == a)
            .map(|(n, _)| n),
    }
}

/// The interface that holds `addr` and the address with that interface's prefix length
/// (`10.0.0.5/24`), if the host has it.
pub fn host_network(addr: IpAddr) -> Option<(String, ipnet::IpNet)> {
    let found = match addr.to_canonical() {
        IpAddr::V6(a) => ipv6_addresses()
            .into_iter()
            .find(|(_, x, _)| *x == a)
            .map(|(n, _, mask)| (n, u128::from(mask).leading_ones())),
        IpAddr::V4(a) => ipv4_masks()
            .into_iter()
            .find(|(_, (x, _))| *x == a)
            .map(|(n, (_, mask))| (n, u32::from(mask).leading_ones())),
    };
    let (name, len) = found?;
    let len = u8::try_from(len).ok()?;
    Some((name, ipnet::IpNet::new(addr.to_canonical(), len).ok()?))
}

/// Every IPv4 address of the host with its interface name and netmask.
fn ipv4_masks() -> Vec<(String, (Ipv4Addr, Ipv4Addr))> {
    addresses(libc::AF_INET, |ifa| {
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
        let mask = if ifa.ifa_netmask.is_null() {
            Ipv4Addr::BROADCAST
        } else {
            // SAFETY: the netmask of an AF_INET address is a sockaddr_in.
            let m = unsafe { &*ifa.ifa_netmask.cast::<libc::sockaddr_in>() };
            Ipv4Addr::from(u32::from_be(m.sin_addr.s_addr))
        };
        (Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)), mask)
    })
}

fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// Every IPv6 address of the host (this network namespace), with its interface name and
/// netmask.
fn ipv6_addresses() -> Vec<(String, Ipv6Addr, Ipv6Addr)> {
    addresses(libc::AF_INET6, |ifa| {
        // SAFETY: an AF_INET6 address is a sockaddr_in6.
        let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
        let mask = if ifa.ifa_netmask.is_null() {
            Ipv6Addr::from(u128::MAX)
        } else {
            // SAFETY: the netmask of an AF_INET6 address is a sockaddr_in6.
            let m = unsafe { &*ifa.ifa_netmask.cast::<libc::sockaddr_in6>() };
            Ipv6Addr::from(m.sin6_addr.s6_addr)
        };
        (Ipv6Addr::from(sin6.sin6_addr.s6_addr), mask)
    })
    .into_iter()
    .map(|(n, (a, m))| (n, a, m))
    .collect()
}

/// Every IPv4 address of the host, with its interface name.
fn ipv4_addresses() -> Vec<(String, Ipv4Addr)> {
    ipv4_masks().into_iter().map(|(n, (a, _))| (n, a)).collect()
}

/// The addresses of `family` with their interface names, each read by `read` from an entry
/// whose `ifa_addr` is of that family.
fn addresses<T>(family: i32, read: impl Fn(&libc::ifaddrs) -> T) -> Vec<(String, T)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr of the family it names.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != family {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        out.push((name.to_string_lossy().into_owned(), read(ifa)));
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_no_link_local_and_unknown_addresses_none() {
        // ::1 lives on lo, which has no fe80:: address.
        let lo = Ipv6Addr::LOCALHOST;
        assert_eq!(link_local_toward(lo, lo), None);
        let unknown: Ipv6Addr = "2001:db8::dead".parse().unwrap();
        assert_eq!(link_local_toward(unknown, unknown), None);
        assert!(is_link_local(&"fe80::1".parse().unwrap()));
        assert!(!is_link_local(&"fd00::1".parse().unwrap()));
    }

    #[test]
    fn loopback_addresses_are_on_lo() {
        assert_eq!(
            interface_of(IpAddr::V4(Ipv4Addr::LOCALHOST)).as_deref(),
            Some("lo")
        );
        assert_eq!(interface_of("192.0.2.77".parse().unwrap()), None);
    }

    #[test]
    fn loopback_addresses_have_lo_s_prefix_lengths() {
        let (name, net) = host_network(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        assert_eq!(
            (name.as_str(), net.to_string().as_str()),
            ("lo", "127.0.0.1/8")
        );
        assert_eq!(host_network("192.0.2.77".parse().unwrap()), None);
    }
}
