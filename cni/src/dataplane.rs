//! The kernel side of a pod, the way Calico wires it: a veth pair with the host end
//! `cali…` (MAC ee:ee:ee:ee:ee:ee, proxy ARP, forwarding, route_localnet, no proxy delay, IPv6
//! accept_ra 0; for a pod with IPv6 also IPv6 on, no DAD, proxy NDP, forwarding, and the
//! EUI-64 link-local fe80::ecee:eeff:feee:eeee that the MAC gives), a host route per pod address
//! on it (/32, /128), and inside the pod the interface with its /32 and /128, a link-scope
//! route to 169.254.1.1 and the default routes via 169.254.1.1 and fe80::ecee:eeff:feee:eeee.
//!
//! Netlink round trips for an ADD: create the pair (peer created directly in the pod's
//! namespace, down); read the pod end (its index, MAC, and the host end's index); add the host
//! routes; configure and raise the pod end in one batch. The first two need no address, so
//! they run while IPAM answers ([`prepare`], then [`Pending::finish`]). A failure removes the
//! pair, which takes its routes and addresses with it, so a failed ADD leaves nothing behind.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use host_kernel::netlink::NlError;
use host_kernel::sysctl::{FORWARDING_V4, FORWARDING_V6, SysctlError, Sysctls};

use crate::names::{GATEWAY_V4, GATEWAY_V6, HOST_MAC, format_mac};
use crate::netlink::{self, Link, Netlink};
use crate::netns::{Netns, NetnsError, netns_error};
use crate::spec::config::Encap;
use crate::spec::error::{CniError, code};

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error(transparent)]
    Netlink(#[from] NlError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Sysctl(#[from] SysctlError),
    #[error(
        "interface {ifname} already exists in the container's namespace {netns} (was ADD called twice without DEL?)"
    )]
    Exists { ifname: String, netns: String },
    #[error("{ifname} vanished right after it was created in the container")]
    Vanished { ifname: String },
    #[error(
        "a route to {address} already exists on interface {other}: another workload holds this address"
    )]
    RouteConflict { address: IpAddr, other: String },
}

impl DataplaneError {
    pub fn to_cni(&self) -> CniError {
        match self {
            DataplaneError::Netns(e) => netns_error(e),
            _ => CniError::new(code::KERNEL, self.to_string()),
        }
    }
}

/// What to wire, known before the addresses are.
pub struct Plan<'a> {
    pub host_if: &'a str,
    pub pod_if: &'a str,
    pub netns: &'a Netns,
    pub mtu: u32,
    pub allow_ip_forwarding: bool,
    /// Whether the pod will have an IPv6 address (IPv6 is set up before the link comes up).
    pub v6: bool,
}

/// What was wired.
#[derive(Debug, Clone)]
pub struct Wired {
    pub host_index: u32,
    pub pod_index: u32,
    pub pod_mac: String,
}

/// The pod's MTU: the configured one, else the uplink's less the encapsulation overhead, else
/// 1500 less the overhead.
pub fn pod_mtu(configured: Option<u32>, uplink: Option<u32>, encap: Encap) -> u32 {
    if let Some(m) = configured {
        return m;
    }
    let base = uplink.filter(|m| *m >= 576).unwrap_or(1500);
    base - encap.overhead()
}

/// The MTU of the interface the host's default route leaves through, if there is one.
pub fn uplink_mtu() -> Result<Option<u32>, NlError> {
    let mut nl = Netlink::open()?;
    // A TEST-NET-1 address: routed by the default route on any sane host.
    let probe = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    let Some(oif) = nl.route_get(probe)? else {
        return Ok(None);
    };
    Ok(nl.link_by_index(oif)?.map(|l| l.mtu))
}

/// Wires the pod in one go. On failure nothing of it is left.
pub fn setup(plan: &Plan, addresses: &[IpAddr]) -> Result<Wired, DataplaneError> {
    prepare(plan)?.finish(plan.netns, addresses)
}

/// A veth pair made and prepared (sysctls set, pod end still down), waiting for its
/// addresses. The caller either finishes it or removes it.
pub struct Pending {
    host_if: String,
    pod_if: String,
    host: Netlink,
    pod: Netlink,
    host_index: u32,
    pod_index: u32,
    pod_mac: String,
    allow_ip_forwarding: bool,
    v6_ready: bool,
}

/// Creates and prepares the pair; needs no address, so it can run while IPAM answers. On
/// failure nothing of it is left.
pub fn prepare(plan: &Plan) -> Result<Pending, DataplaneError> {
    let mut host = Netlink::open()?;
    create_pair(&mut host, plan)?;
    match ready(plan) {
        Ok((pod, host_index, pod_index, pod_mac)) => Ok(Pending {
            host_if: plan.host_if.to_owned(),
            pod_if: plan.pod_if.to_owned(),
            host,
            pod,
            host_index,
            pod_index,
            pod_mac,
            allow_ip_forwarding: plan.allow_ip_forwarding,
            v6_ready: plan.v6,
        }),
        Err(e) => {
            delete_pair(&mut host, plan.host_if);
            Err(e)
        }
    }
}

/// Deleting the host end deletes the pod end, and with them their addresses and routes.
fn delete_pair(host: &mut Netlink, host_if: &str) {
    if let Err(undo) = host.apply(vec![netlink::delete_link_by_name(host_if)]) {
        tracing::warn!("rollback: cannot delete {host_if}: {undo} (it is left behind)");
    }
}

fn create_pair(host: &mut Netlink, plan: &Plan) -> Result<(), DataplaneError> {
    let create = || {
        netlink::create_veth(
            plan.host_if,
            HOST_MAC,
            plan.mtu,
            plan.pod_if,
            plan.netns.fd(),
        )
    };
    match host.apply(vec![create()]) {
        Err(e) if e.errno() == Some(libc::EEXIST) => {
            // Either the host name is taken (a stale interface of an earlier sandbox of the
            // same pod: Calico replaces it) or the container already has the interface.
            if host.link_by_name(plan.host_if)?.is_some() {
                tracing::info!("replacing the stale host interface {}", plan.host_if);
                host.apply(vec![netlink::delete_link_by_name(plan.host_if)])?;
                host.apply(vec![create()])?;
                Ok(())
            } else {
                Err(DataplaneError::Exists {
                    ifname: plan.pod_if.to_owned(),
                    netns: plan.netns.path().display().to_string(),
                })
            }
        }
        other => Ok(other?),
    }
}

/// Reads the pod end (its index, MAC, and the host end's index) and sets the sysctls of both
/// ends that must be in place before the pod end comes up.
fn ready(plan: &Plan) -> Result<(Netlink, u32, u32, String), DataplaneError> {
    let (pod, link) = {
        let _inside = plan.netns.enter()?;
        let mut pod = Netlink::open()?;
        let link = pod
            .link_by_name(plan.pod_if)?
            .ok_or_else(|| DataplaneError::Vanished {
                ifname: plan.pod_if.to_owned(),
            })?;
        pod_sysctls(plan.pod_if, plan.allow_ip_forwarding, plan.v6)?;
        (pod, link)
    };
    let host_index = link.peer_index.ok_or_else(|| DataplaneError::Vanished {
        ifname: plan.host_if.to_owned(),
    })?;
    host_sysctls(plan.host_if, plan.v6)?;
    Ok((pod, host_index, link.index, format_mac(&link.mac)))
}

impl Pending {
    /// Adds the addresses and routes and brings the pod end up. On failure the pair is removed.
    pub fn finish(mut self, netns: &Netns, addresses: &[IpAddr]) -> Result<Wired, DataplaneError> {
        match self.configure(netns, addresses) {
            Ok(w) => Ok(w),
            Err(e) => {
                self.remove();
                Err(e)
            }
        }
    }

    /// Removes the pair (IPAM failed, so there is nothing to wire).
    pub fn remove(mut self) {
        delete_pair(&mut self.host, &self.host_if);
    }

    fn configure(&mut self, netns: &Netns, addresses: &[IpAddr]) -> Result<Wired, DataplaneError> {
        let has_v6 = addresses.iter().any(IpAddr::is_ipv6);
        if has_v6 && !self.v6_ready {
            // Not foreseen when the pair was made: IPv6 on before the link comes up.
            let inside = netns.enter()?;
            pod_sysctls(&self.pod_if, self.allow_ip_forwarding, true)?;
            drop(inside);
            host_sysctls(&self.host_if, true)?;
            self.v6_ready = true;
        }
        host_routes(&mut self.host, &self.host_if, addresses, self.host_index)?;

        let (index, name) = (self.pod_index, self.pod_if.as_str());
        let mut batch = vec![netlink::set_up(index, name)];
        for ip in addresses {
            batch.push(netlink::add_address(index, name, *ip));
        }
        if addresses.iter().any(IpAddr::is_ipv4) {
            let gw = IpAddr::V4(GATEWAY_V4);
            batch.push(netlink::add_route(gw, 32, None, index, name));
            batch.push(netlink::add_route(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                0,
                Some(gw),
                index,
                name,
            ));
        }
        if has_v6 {
            batch.push(netlink::add_route(
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                0,
                Some(IpAddr::V6(GATEWAY_V6)),
                index,
                name,
            ));
        }
        self.pod.apply(batch)?;
        Ok(Wired {
            host_index: self.host_index,
            pod_index: self.pod_index,
            pod_mac: self.pod_mac.clone(),
        })
    }
}

fn host_routes(
    host: &mut Netlink,
    host_if: &str,
    addresses: &[IpAddr],
    host_index: u32,
) -> Result<(), DataplaneError> {
    let routes = addresses
        .iter()
        .map(|ip| {
            let len = if ip.is_ipv4() { 32 } else { 128 };
            netlink::add_route(*ip, len, None, host_index, host_if)
        })
        .collect();
    match host.apply(routes) {
        Err(e) if e.errno() == Some(libc::EEXIST) => {
            // Someone got there first. On our own interface that is fine (routewriter may
            // have written it); elsewhere another interface claims the pod's address.
            for ip in addresses {
                if let Some(other) = route_owner(host, *ip)?
                    && other != host_index
                {
                    let name = host
                        .link_by_index(other)?
                        .map_or_else(|| format!("index {other}"), |l: Link| l.name);
                    return Err(DataplaneError::RouteConflict {
                        address: *ip,
                        other: name,
                    });
                }
            }
            // The kernel handles each route of a batch on its own: the others were added.
            Ok(())
        }
        other => Ok(other?),
    }
}

/// The interface of the main-table host route to `ip`, if one exists.
fn route_owner(host: &mut Netlink, ip: IpAddr) -> Result<Option<u32>, NlError> {
    let len = if ip.is_ipv4() { 32 } else { 128 };
    Ok(host
        .routes(netlink::family_of(ip))?
        .into_iter()
        .find(|r| r.dst == ip && r.dst_len == len && r.table == 254)
        .and_then(|r| r.oif))
}

/// Calico's host-side settings (routewriter keeps the same ones, so it finds nothing to do).
fn host_sysctls(ifname: &str, v6: bool) -> Result<(), SysctlError> {
    let mut s = Sysctls::default();
    s.ensure_workload(ifname)?;
    let conf = format!("net/ipv6/conf/{ifname}");
    // Router advertisements from a pod must never configure the host.
    ignore_missing(s.ensure(&format!("{conf}/accept_ra"), "0"))?;
    if v6 {
        s.ensure_workload_v6(ifname)?;
        // The pods' IPv6 gateway is this end's EUI-64 link-local: a host whose default makes
        // other link-locals (stable privacy, none) must not change it. Set before the carrier
        // comes up, when the kernel makes the address.
        ignore_missing(s.ensure(&format!("{conf}/addr_gen_mode"), "0"))?;
    }
    Ok(())
}

/// Inside the pod (the thread must be there): IPv6 on without DAD before the interface comes
/// up, and forwarding only when the configuration allows it.
fn pod_sysctls(pod_if: &str, allow_ip_forwarding: bool, v6: bool) -> Result<(), SysctlError> {
    let mut s = Sysctls::default();
    let forward = if allow_ip_forwarding { "1" } else { "0" };
    s.ensure(FORWARDING_V4, forward)?;
    if v6 {
        let conf = format!("net/ipv6/conf/{pod_if}");
        s.ensure(&format!("{conf}/disable_ipv6"), "0")?;
        s.ensure(&format!("{conf}/accept_dad"), "0")?;
        s.ensure(FORWARDING_V6, forward)?;
    }
    Ok(())
}

fn ignore_missing(r: Result<bool, SysctlError>) -> Result<(), SysctlError> {
    match r {
        Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Removes the pod's interface (and with it the host end and its routes). False when there was
/// nothing to remove.
pub fn teardown(netns: &Netns, pod_if: &str) -> Result<bool, DataplaneError> {
    let _inside = netns.enter()?;
    let mut pod = Netlink::open()?;
    match pod.apply(vec![netlink::delete_link_by_name(pod_if)]) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.errno(), Some(libc::ENODEV | libc::ENOENT)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_from_config_uplink_or_default() {
        assert_eq!(pod_mtu(Some(1400), Some(9000), Encap::Vxlan), 1400);
        assert_eq!(pod_mtu(None, Some(9000), Encap::Vxlan), 8950);
        assert_eq!(pod_mtu(None, Some(1500), Encap::Ipip), 1480);
        assert_eq!(pod_mtu(None, Some(1500), Encap::None), 1500);
        assert_eq!(pod_mtu(None, None, Encap::Vxlan), 1450);
        // A loopback-sized or broken uplink reading falls back to 1500.
        assert_eq!(pod_mtu(None, Some(0), Encap::None), 1500);
        assert_eq!(pod_mtu(None, Some(65536), Encap::None), 65536);
    }

    #[test]
    fn error_codes() {
        let gone = DataplaneError::Netns(NetnsError::Gone("/run/netns/x".into()));
        assert_eq!(gone.to_cni().code, code::UNKNOWN_CONTAINER);
        let not = DataplaneError::Netns(NetnsError::NotNetns("/tmp/x".into()));
        assert_eq!(not.to_cni().code, code::INVALID_ENVIRONMENT);
        let exists = DataplaneError::Exists {
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
        };
        assert_eq!(exists.to_cni().code, code::KERNEL);
        assert!(exists.to_string().contains("eth0"));
    }
}
