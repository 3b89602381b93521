//! CHECK: is the pod still wired as ADD left it? Compared against `prevResult`: the host end
//! (veth, MAC ee:ee:ee:ee:ee:ee, up, Calico's sysctls, a host route per pod address, and for
//! IPv6 its link-local fe80::ecee:eeff:feee:eeee), the pod end (present, its MAC, up, paired
//! with the host end, its addresses, its default routes), and IPAM (the handle still holds the
//! addresses), for each family the pod has. Every problem found is reported at once, one per
//! line, with code 103. Routes other plugins may add are not looked at: only that ours are
//! there.

use std::net::IpAddr;

use host_kernel::netlink::NlError;
use host_kernel::sysctl::Sysctls;
use netlink_packet_route::AddressFamily;
use tokio::runtime::Runtime;

use crate::attachment::{host_ifname, open_netns};
use crate::delegate;
use crate::ipam_plugin;
use crate::names::{GATEWAY_V4, GATEWAY_V6, HOST_MAC, format_mac};
use crate::netlink::{Link, Netlink, RouteEntry};
use crate::spec::NetConf;
use crate::spec::env::{Command, Env};
use crate::spec::error::{CniError, code};

/// What CHECK compares the kernel against, taken from prevResult.
#[derive(Debug, PartialEq, Eq)]
pub struct Expected {
    pub host_if: String,
    pub pod_if: String,
    pub pod_mac: Option<String>,
    pub addresses: Vec<IpAddr>,
}

/// Reads what ADD reported: our host interface, the pod interface in this sandbox, and the
/// addresses on it.
pub fn expected(conf: &NetConf, env: &Env, host_if: &str) -> Result<Expected, CniError> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            "CHECK needs prevResult (the result of the ADD) in the network configuration",
        )
    })?;
    let netns = env
        .netns
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let pod_index = prev
        .interfaces
        .iter()
        .position(|i| i.name == env.ifname && !i.sandbox.is_empty() && i.sandbox == netns);
    let Some(pod_index) = pod_index else {
        return Err(CniError::new(
            code::CHECK_FAILED,
            format!(
                "prevResult lists no interface {} in the sandbox {netns}",
                env.ifname
            ),
        ));
    };
    if !prev
        .interfaces
        .iter()
        .any(|i| i.name == host_if && i.sandbox.is_empty())
    {
        return Err(CniError::new(
            code::CHECK_FAILED,
            format!("prevResult lists no host interface {host_if}"),
        ));
    }
    let addresses: Vec<IpAddr> = prev
        .ips
        .iter()
        .filter(|i| i.interface == Some(pod_index))
        .map(|i| i.address.addr())
        .collect();
    if addresses.is_empty() {
        return Err(CniError::new(
            code::CHECK_FAILED,
            format!("prevResult lists no address on {}", env.ifname),
        ));
    }
    let mac = &prev.interfaces[pod_index].mac;
    Ok(Expected {
        host_if: host_if.to_owned(),
        pod_if: env.ifname.clone(),
        pod_mac: (!mac.is_empty()).then(|| mac.to_ascii_lowercase()),
        addresses,
    })
}

pub fn check(rt: &Runtime, conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<(), CniError> {
    let host_if = host_ifname(conf, env);
    let want = expected(conf, env, &host_if)?;
    let netns = open_netns(env)?;
    let kernel_err = |e: NlError| CniError::new(code::KERNEL, e.to_string());

    let mut problems = Vec::new();
    let mut host = Netlink::open().map_err(kernel_err)?;
    let host_link = host.link_by_name(&want.host_if).map_err(kernel_err)?;
    let host_routes = if want.addresses.iter().any(IpAddr::is_ipv6) {
        let mut r = host.routes(AddressFamily::Inet).map_err(kernel_err)?;
        r.extend(host.routes(AddressFamily::Inet6).map_err(kernel_err)?);
        r
    } else {
        host.routes(AddressFamily::Inet).map_err(kernel_err)?
    };
    let host_sysctls = read_host_sysctls(&want.host_if, want.addresses.iter().any(IpAddr::is_ipv6));
    problems.extend(check_host(
        &want,
        host_link.as_ref(),
        &host_routes,
        &host_sysctls,
    ));
    if let Some(link) = &host_link
        && want.addresses.iter().any(IpAddr::is_ipv6)
    {
        let addrs: Vec<(u32, IpAddr)> = host
            .addresses(AddressFamily::Inet6)
            .map_err(kernel_err)?
            .iter()
            .map(|a| (a.index, a.address))
            .collect();
        problems.extend(check_gateway_v6(&want.host_if, link.index, &addrs));
    }

    let (pod_link, pod_addresses, pod_routes) = {
        let _inside = netns
            .enter()
            .map_err(|e| CniError::new(code::IO, e.to_string()))?;
        let mut pod = Netlink::open().map_err(kernel_err)?;
        let link = pod.link_by_name(&want.pod_if).map_err(kernel_err)?;
        let mut addrs = pod.addresses(AddressFamily::Inet).map_err(kernel_err)?;
        addrs.extend(pod.addresses(AddressFamily::Inet6).map_err(kernel_err)?);
        let mut routes = pod.routes(AddressFamily::Inet).map_err(kernel_err)?;
        routes.extend(pod.routes(AddressFamily::Inet6).map_err(kernel_err)?);
        (link, addrs, routes)
    };
    let pod_addrs: Vec<(u32, IpAddr, u8)> = pod_addresses
        .iter()
        .map(|a| (a.index, a.address, a.prefix_len))
        .collect();
    problems.extend(check_pod(
        &want,
        pod_link.as_ref(),
        host_link.as_ref().map(|l| l.index),
        &pod_addrs,
        &pod_routes,
    ));

    if problems.is_empty() {
        // The addresses are still ours in IPAM (an "IP reservation" the spec asks CHECK to
        // verify), or the delegate agrees.
        if conf.ipam_is_ours() {
            let mut bgpd = ipam_plugin::client(conf);
            rt.block_on(ipam_plugin::verify(&mut bgpd, conf, env, &want.addresses))?;
        } else {
            let plugin = delegate::find(&conf.ipam.plugin_type, &env.path)?;
            delegate::run(&plugin, Command::Check, stdin)?;
        }
        return Ok(());
    }
    Err(CniError::new(
        code::CHECK_FAILED,
        format!(
            "{} is not wired as ADD left it: {}",
            env.container_id,
            problems.join("; ")
        ),
    ))
}

/// The host-side sysctls CHECK expects, as (path under /proc/sys, expected, actual).
pub type SysctlReading = (String, &'static str, Option<String>);

fn read_host_sysctls(ifname: &str, v6: bool) -> Vec<SysctlReading> {
    let mut keys: Vec<(String, &'static str)> = vec![
        (format!("net/ipv4/conf/{ifname}/proxy_arp"), "1"),
        (format!("net/ipv4/conf/{ifname}/forwarding"), "1"),
        (format!("net/ipv4/conf/{ifname}/route_localnet"), "1"),
        (format!("net/ipv4/neigh/{ifname}/proxy_delay"), "0"),
    ];
    if v6 {
        // What ADD set on the host end for IPv6 (routewriter keeps the same).
        for (key, value) in Sysctls::WORKLOAD_V6 {
            keys.push((format!("net/ipv6/conf/{ifname}/{key}"), value));
        }
        keys.push((format!("net/ipv6/conf/{ifname}/accept_ra"), "0"));
    }
    keys.into_iter()
        .map(|(k, want)| {
            let got = std::fs::read_to_string(format!("/proc/sys/{k}"))
                .ok()
                .map(|s| s.trim().to_owned());
            (k, want, got)
        })
        .collect()
}

/// Host-side problems (pure: compares readings).
pub fn check_host(
    want: &Expected,
    link: Option<&Link>,
    routes: &[RouteEntry],
    sysctls: &[SysctlReading],
) -> Vec<String> {
    let mut p = Vec::new();
    let Some(link) = link else {
        p.push(format!("the host interface {} is missing", want.host_if));
        return p;
    };
    if link.kind.as_deref() != Some("veth") {
        p.push(format!(
            "{} is a {} device, not a veth",
            want.host_if,
            link.kind.as_deref().unwrap_or("unknown")
        ));
    }
    if link.mac != HOST_MAC {
        p.push(format!(
            "{} has MAC {}, not {}",
            want.host_if,
            format_mac(&link.mac),
            format_mac(&HOST_MAC)
        ));
    }
    if !link.up {
        p.push(format!("{} is down", want.host_if));
    }
    for (key, expected, got) in sysctls {
        if got.as_deref() != Some(*expected) {
            p.push(format!(
                "{key} is {}, not {expected}",
                got.as_deref().unwrap_or("unreadable")
            ));
        }
    }
    for ip in &want.addresses {
        let len = if ip.is_ipv4() { 32 } else { 128 };
        let found = routes.iter().any(|r| {
            r.dst == *ip && r.dst_len == len && r.table == 254 && r.oif == Some(link.index)
        });
        if !found {
            p.push(format!(
                "the host route {ip}/{len} dev {} is missing",
                want.host_if
            ));
        }
    }
    p
}

/// The pods' IPv6 gateway is the host end's own link-local address (its MAC's EUI-64): without
/// it the pod's neighbour discovery for the gateway goes unanswered. `addresses` are
/// (ifindex, address) of the host's IPv6 addresses.
pub fn check_gateway_v6(host_if: &str, index: u32, addresses: &[(u32, IpAddr)]) -> Option<String> {
    let gw = IpAddr::V6(GATEWAY_V6);
    (!addresses.iter().any(|(i, a)| *i == index && *a == gw))
        .then(|| format!("{host_if} lacks its link-local address {gw}, the pods' IPv6 gateway"))
}

/// Pod-side problems (pure: compares readings). `addresses` are (ifindex, address, prefix).
pub fn check_pod(
    want: &Expected,
    link: Option<&Link>,
    host_index: Option<u32>,
    addresses: &[(u32, IpAddr, u8)],
    routes: &[RouteEntry],
) -> Vec<String> {
    let mut p = Vec::new();
    let Some(link) = link else {
        p.push(format!("the pod interface {} is missing", want.pod_if));
        return p;
    };
    if let Some(mac) = &want.pod_mac
        && format_mac(&link.mac) != *mac
    {
        p.push(format!(
            "{} has MAC {}, not {mac} as ADD reported",
            want.pod_if,
            format_mac(&link.mac)
        ));
    }
    if !link.up {
        p.push(format!("{} is down", want.pod_if));
    }
    if let Some(h) = host_index
        && link.peer_index != Some(h)
    {
        p.push(format!(
            "{} is not paired with {}",
            want.pod_if, want.host_if
        ));
    }
    for ip in &want.addresses {
        let len = if ip.is_ipv4() { 32 } else { 128 };
        if !addresses
            .iter()
            .any(|(i, a, l)| *i == link.index && a == ip && *l == len)
        {
            p.push(format!("{} lacks the address {ip}/{len}", want.pod_if));
        }
    }
    let default_via = |gw: IpAddr| {
        routes.iter().any(|r| {
            r.dst_len == 0
                && r.dst.is_ipv4() == gw.is_ipv4()
                && r.gateway == Some(gw)
                && r.oif == Some(link.index)
        })
    };
    if want.addresses.iter().any(IpAddr::is_ipv4) && !default_via(IpAddr::V4(GATEWAY_V4)) {
        p.push(format!(
            "the pod has no default route via {GATEWAY_V4} dev {}",
            want.pod_if
        ));
    }
    if want.addresses.iter().any(IpAddr::is_ipv6) && !default_via(IpAddr::V6(GATEWAY_V6)) {
        p.push(format!(
            "the pod has no default route via {GATEWAY_V6} dev {}",
            want.pod_if
        ));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::route::RouteScope;
    use serde_json::json;

    fn conf_with(prev: serde_json::Value) -> NetConf {
        NetConf::parse(
            json!({"cniVersion": "1.0.0", "name": "net", "type": "margay", "prevResult": prev})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    }

    fn env() -> Env {
        let vars = [
            ("CNI_COMMAND", "CHECK"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/pod"),
            ("CNI_IFNAME", "eth0"),
        ];
        Env::parse(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap()
    }

    fn prev() -> serde_json::Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "calihost", "mac": "ee:ee:ee:ee:ee:ee"},
                {"name": "eth0", "mac": "02:AA:00:00:00:01", "sandbox": "/run/netns/pod"}
            ],
            "ips": [{"address": "172.20.0.5/32", "gateway": "169.254.1.1", "interface": 1}]
        })
    }

    #[test]
    fn expectations_come_from_prev_result() {
        let want = expected(&conf_with(prev()), &env(), "calihost").unwrap();
        assert_eq!(want.pod_mac.as_deref(), Some("02:aa:00:00:00:01"));
        assert_eq!(want.addresses, ["172.20.0.5".parse::<IpAddr>().unwrap()]);
        // Wrong host name, wrong sandbox, no prevResult.
        assert_eq!(
            expected(&conf_with(prev()), &env(), "caliother")
                .unwrap_err()
                .code,
            code::CHECK_FAILED
        );
        let mut other = prev();
        other["interfaces"][1]["sandbox"] = json!("/run/netns/else");
        assert_eq!(
            expected(&conf_with(other), &env(), "calihost")
                .unwrap_err()
                .code,
            code::CHECK_FAILED
        );
        let none = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"n","type":"margay"}"#).unwrap();
        assert_eq!(
            expected(&none, &env(), "calihost").unwrap_err().code,
            code::INVALID_CONFIG
        );
    }

    fn link(index: u32, name: &str, mac: [u8; 6], peer: Option<u32>) -> Link {
        Link {
            index,
            name: name.into(),
            mac: mac.to_vec(),
            mtu: 1450,
            up: true,
            peer_index: peer,
            kind: Some("veth".into()),
        }
    }

    fn route(dst: &str, len: u8, gw: Option<&str>, oif: u32) -> RouteEntry {
        RouteEntry {
            dst: dst.parse().unwrap(),
            dst_len: len,
            gateway: gw.map(|g| g.parse().unwrap()),
            oif: Some(oif),
            table: 254,
            scope: RouteScope::Universe,
        }
    }

    #[test]
    fn a_healthy_pod_has_no_problems_and_each_fault_is_named() {
        let want = expected(&conf_with(prev()), &env(), "calihost").unwrap();
        let host = link(9, "calihost", HOST_MAC, Some(2));
        let good_sysctls: Vec<SysctlReading> = vec![(
            "net/ipv4/conf/calihost/proxy_arp".into(),
            "1",
            Some("1".into()),
        )];
        let host_routes = vec![route("172.20.0.5", 32, None, 9)];
        assert!(check_host(&want, Some(&host), &host_routes, &good_sysctls).is_empty());

        let p = check_host(&want, Some(&host), &[], &good_sysctls);
        assert_eq!(p, ["the host route 172.20.0.5/32 dev calihost is missing"]);
        let p = check_host(&want, None, &host_routes, &good_sysctls);
        assert!(p[0].contains("missing"));
        let bad_mac = link(9, "calihost", [2, 0, 0, 0, 0, 1], None);
        let p = check_host(&want, Some(&bad_mac), &host_routes, &good_sysctls);
        assert!(p[0].contains("MAC 02:00:00:00:00:01"), "{p:?}");
        let off = vec![(
            "net/ipv4/conf/calihost/proxy_arp".into(),
            "1",
            Some("0".into()),
        )];
        let p = check_host(&want, Some(&host), &host_routes, &off);
        assert_eq!(p, ["net/ipv4/conf/calihost/proxy_arp is 0, not 1"]);

        let pod = link(2, "eth0", [2, 0xaa, 0, 0, 0, 1], Some(9));
        let addrs = vec![(2, "172.20.0.5".parse().unwrap(), 32)];
        let routes = vec![route("0.0.0.0", 0, Some("169.254.1.1"), 2)];
        assert!(check_pod(&want, Some(&pod), Some(9), &addrs, &routes).is_empty());
        let p = check_pod(&want, Some(&pod), Some(9), &[], &[]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("lacks the address 172.20.0.5/32"));
        assert!(p[1].contains("no default route via 169.254.1.1"));
        let p = check_pod(&want, Some(&pod), Some(10), &addrs, &routes);
        assert_eq!(p, ["eth0 is not paired with calihost"]);
        let wrong_prefix = vec![(2, "172.20.0.5".parse().unwrap(), 24)];
        assert_eq!(
            check_pod(&want, Some(&pod), Some(9), &wrong_prefix, &routes).len(),
            1
        );
        assert!(check_pod(&want, None, Some(9), &addrs, &routes)[0].contains("missing"));
    }

    #[test]
    fn the_host_end_must_answer_as_the_ipv6_gateway() {
        let gw = IpAddr::V6(GATEWAY_V6);
        assert_eq!(check_gateway_v6("calihost", 9, &[(9, gw)]), None);
        let p = check_gateway_v6("calihost", 9, &[(8, gw), (9, "fe80::1".parse().unwrap())]);
        assert_eq!(
            p.as_deref(),
            Some(
                "calihost lacks its link-local address fe80::ecee:eeff:feee:eeee, the pods' IPv6 gateway"
            )
        );
    }
}
