//! The dual-stack variant of the two-namespace link of [`super::bgp_peer`]: both ends get an
//! IPv6 address too (bgpd `fd99::1`, the peer `fd99::2`, /64) next to their IPv4 one, plus the
//! fe80:: link-local address the kernel makes itself; and parsers for the IPv6 parts of the
//! peers' output (next hops with their scope).

use std::time::Duration;

use super::bgp_peer::{Link, wait_until};
use super::netns::Netns;

/// bgpd's IPv6 address on the test link.
pub const BGPD_ADDR6: &str = "fd99::1";
/// The peer's IPv6 address on the test link.
pub const PEER_ADDR6: &str = "fd99::2";
/// The interface at both ends of the link.
pub const DEV: &str = "eth0";

/// [`Link::new`] plus `fd99::1/64` in `a` and `fd99::2/64` in `b`, returned once both ends'
/// addresses (global and link-local) are usable.
pub fn dual_stack_link(tag: &str) -> Link {
    let link = Link::new(tag);
    for (ns, addr) in [(&link.a, BGPD_ADDR6), (&link.b, PEER_ADDR6)] {
        // nodad: duplicate address detection would keep the address tentative (unusable for
        // bind/connect) for a second or more; nothing else is on this link.
        ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{addr}/64"),
            "dev",
            DEV,
            "nodad",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    }
    for ns in [&link.a, &link.b] {
        // The link-local address does go through DAD: the speakers read it when they start
        // (BIRD's device scan, FRR's zebra), and a tentative one cannot be bound.
        let mut last = String::new();
        assert!(
            wait_until(Duration::from_secs(10), || {
                last = ns
                    .ip(&["-6", "addr", "show", "dev", DEV])
                    .unwrap_or_default();
                !last.contains("tentative") && link_local(ns, DEV).is_some()
            }),
            "IPv6 addresses in {} not ready: {last}",
            ns.name()
        );
    }
    link
}

/// The fe80:: address of `dev` in `ns` (without the prefix length).
pub fn link_local(ns: &Netns, dev: &str) -> Option<String> {
    let out = ns
        .ip(&["-6", "-o", "addr", "show", "dev", dev, "scope", "link"])
        .ok()?;
    parse_link_local(&out)
}

fn parse_link_local(ip_o_addr: &str) -> Option<String> {
    ip_o_addr.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        words.find(|w| *w == "inet6")?;
        let addr = words.next()?.split('/').next()?;
        addr.starts_with("fe80:").then(|| addr.to_owned())
    })
}

/// One next hop of a route in FRR's `show bgp ipv4|ipv6 unicast PREFIX json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrrNexthop {
    pub ip: String,
    /// "ipv4" or "ipv6": an IPv4 route with "ipv6" came with an extended next hop (RFC 8950).
    pub afi: String,
    /// "global" or "link-local" for IPv6 next hops, "" for IPv4 ones.
    pub scope: String,
}

/// The next hops of the route's first path (FRR lists the MP_REACH global address first and
/// the link-local one, when the sender put one in, second).
pub fn frr_nexthops(v: &serde_json::Value) -> Vec<FrrNexthop> {
    let Some(path) = v["paths"].as_array().and_then(|p| p.first()) else {
        return Vec::new();
    };
    path["nexthops"]
        .as_array()
        .map(|nhs| {
            nhs.iter()
                .map(|n| FrrNexthop {
                    ip: n["ip"].as_str().unwrap_or("").to_owned(),
                    afi: n["afi"].as_str().unwrap_or("").to_owned(),
                    scope: n["scope"].as_str().unwrap_or("").to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The addresses of `BGP.next_hop:` in BIRD's `show route all PREFIX`: the global one, then
/// the link-local one when the sender put one in (BIRD 2 prints `fd99::1 fe80::...`).
pub fn bird_next_hops(text: &str) -> Vec<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("BGP.next_hop:"))
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The gateway BIRD resolved the route to, from its `via ADDR on IFACE` line: (ADDR, IFACE).
/// A route whose next hop BIRD cannot resolve has no such line (it shows as unreachable).
pub fn bird_gateway(text: &str) -> Option<(String, String)> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("via ")?;
        let (addr, iface) = rest.split_once(" on ")?;
        Some((addr.trim().to_owned(), iface.trim().to_owned()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ip_link_local() {
        let out = "2: eth0    inet6 fe80::981a:45ff:feca:acdd/64 scope link \\       valid_lft forever preferred_lft forever\n";
        assert_eq!(
            parse_link_local(out).as_deref(),
            Some("fe80::981a:45ff:feca:acdd")
        );
        assert_eq!(parse_link_local(""), None);
    }

    #[test]
    fn parses_bird2_ipv6_route() {
        // BIRD 2.0.12, a route from FRR over an IPv6 session.
        let text = "Table master6:\n\
            fd10:1::/122         unicast [m 11:49:19.812] * (100) [AS64512i]\n\
            \tvia fd99::1 on eth0\n\tType: BGP univ\n\tBGP.origin: IGP\n\tBGP.as_path: 64512\n\
            \tBGP.next_hop: fd99::1 fe80::981a:45ff:feca:acdd\n\tBGP.med: 0\n\tBGP.local_pref: 100\n";
        assert_eq!(
            bird_next_hops(text),
            vec!["fd99::1", "fe80::981a:45ff:feca:acdd"]
        );
        assert_eq!(
            bird_gateway(text),
            Some(("fd99::1".to_owned(), "eth0".to_owned()))
        );
        let r = super::super::bird::parse_route(text).unwrap();
        assert_eq!((r.next_hop.as_str(), r.as_path), ("fd99::1", vec![64512]));
        assert!(bird_next_hops("Network not found\n").is_empty());
        assert_eq!(bird_gateway("Network not found\n"), None);
    }

    #[test]
    fn parses_frr_ipv6_nexthops() {
        // FRR 8.4, `show bgp ipv4 unicast 10.10.1.0/24 json` over an IPv6 session with
        // extended next hop (abridged).
        let v = serde_json::json!({"prefix":"10.10.1.0/24","paths":[{"aspath":{"string":"64512"},
            "origin":"IGP","valid":true,"nexthops":[
              {"ip":"fd99::1","afi":"ipv6","scope":"global","metric":0,"accessible":true},
              {"ip":"fe80::981a:45ff:feca:acdd","afi":"ipv6","scope":"link-local","accessible":true,"used":true}]}]});
        let nhs = frr_nexthops(&v);
        assert_eq!(nhs.len(), 2);
        assert_eq!(
            (
                nhs[0].ip.as_str(),
                nhs[0].afi.as_str(),
                nhs[0].scope.as_str()
            ),
            ("fd99::1", "ipv6", "global")
        );
        assert_eq!(nhs[1].scope, "link-local");
        let v4 = serde_json::json!({"paths":[{"nexthops":[{"ip":"10.99.0.1","afi":"ipv4","used":true}]}]});
        assert_eq!(frr_nexthops(&v4)[0].scope, "");
        assert!(frr_nexthops(&serde_json::json!({})).is_empty());
    }
}
