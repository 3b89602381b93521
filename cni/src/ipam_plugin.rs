//! `margay-ipam`: addresses from bgpd, under the handle `<network>.<container id>` with the
//! attributes namespace, pod, node and container id. The same functions serve the `margay`
//! main plugin in-process (one gRPC call per ADD, no second exec), and the `margay-ipam`
//! binary under any main plugin (ptp, bridge, ...).
//!
//! - ADD: the requested addresses (`runtimeConfig.ips`, `args.cni.ips`, else CNI_ARGS `IP=`),
//!   or one IPv4 and/or one IPv6 address from the configured pools; dual stack all or nothing.
//! - DEL: releases the handle; an unknown handle is success, so DEL is idempotent.
//! - CHECK: the handle still holds the addresses of prevResult.
//! - GC: releases this network's handles whose container is not among the valid attachments.
//! - STATUS: bgpd answers, and some pool can serve each family asked for.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use proto::v1 as pb;

use crate::bgpd_client::{Bgpd, IpamError};
use crate::names::{GATEWAY_V4, GATEWAY_V6};
use crate::spec::NetConf;
use crate::spec::config::parse_requested_ip;
use crate::spec::env::Env;
use crate::spec::error::{CniError, code};
use crate::spec::result::{CniResult, IpConfig};

/// The connection to bgpd for IPAM, as configured.
pub fn client(conf: &NetConf) -> Bgpd {
    Bgpd::new(conf.ipam_socket(), conf.bgpd_timeout, conf.bgpd_retry)
}

/// The node name recorded with allocations: the configured one, else the host name.
pub fn node_name(conf: &NetConf) -> String {
    conf.nodename.clone().unwrap_or_else(hostname)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The attributes stored with each allocation.
pub fn attributes(conf: &NetConf, env: &Env) -> HashMap<String, String> {
    let mut a = HashMap::new();
    if let Some(ns) = &env.args.k8s_namespace {
        a.insert("namespace".into(), ns.clone());
    }
    if let Some(pod) = &env.args.k8s_pod {
        a.insert("pod".into(), pod.clone());
    }
    a.insert("node".into(), node_name(conf));
    a.insert("container_id".into(), env.container_id.clone());
    // Only our main plugin wires the host side: bgpd then desires the pod's route on it
    // (another main plugin using margay-ipam has interfaces of its own).
    if conf.plugin_type == "margay" {
        a.insert(
            WORKLOAD_INTERFACE.into(),
            crate::attachment::host_ifname(conf, env),
        );
    }
    a
}

/// The allocation attribute naming the host-side interface of a workload.
pub const WORKLOAD_INTERFACE: &str = "interface";

/// The addresses the runtime asked for, if any: configuration first (the conventions say
/// `args`/`runtimeConfig` win over CNI_ARGS), then CNI_ARGS `IP=`.
pub fn requested(conf: &NetConf, env: &Env) -> Result<Vec<IpAddr>, CniError> {
    if !conf.requested_ips.is_empty() {
        return Ok(conf.requested_ips.clone());
    }
    env.args
        .ips
        .iter()
        .map(|t| {
            parse_requested_ip(t)
                .map_err(|e| CniError::new(code::INVALID_ENVIRONMENT, format!("CNI_ARGS IP: {e}")))
        })
        .collect()
}

/// Allocates this attachment's addresses; each with the prefix length of its block.
pub async fn allocate(bgpd: &mut Bgpd, conf: &NetConf, env: &Env) -> Result<Vec<IpNet>, CniError> {
    let handle = conf.handle(&env.container_id);
    let attributes = attributes(conf, env);
    let node = conf.nodename.clone().unwrap_or_default();
    let wanted = requested(conf, env)?;
    let allocations = if wanted.is_empty() {
        let r = bgpd
            .auto_assign(pb::AutoAssignRequest {
                handle: handle.clone(),
                attributes,
                num_ipv4: u32::from(conf.ipam.assign_ipv4),
                num_ipv6: u32::from(conf.ipam.assign_ipv6),
                node,
                ipv4_pools: conf.ipam.ipv4_pools.clone(),
                ipv6_pools: conf.ipam.ipv6_pools.clone(),
                r#use: pb::AllowedUse::Workload.into(),
                strict_affinity: false,
            })
            .await
            .map_err(|e| ambiguous(e, &handle))?;
        let mut all = r.ipv4;
        all.extend(r.ipv6);
        all
    } else {
        let reqs = wanted
            .iter()
            .map(|ip| pb::AssignIpRequest {
                address: ip.to_string(),
                handle: handle.clone(),
                attributes: attributes.clone(),
                node: node.clone(),
            })
            .collect();
        bgpd.assign_ips(reqs)
            .await
            .map_err(|e| ambiguous(e, &handle))?
    };
    let mut out = Vec::with_capacity(allocations.len());
    for a in &allocations {
        out.push(address_of(a).map_err(|e| CniError::new(code::IPAM_REFUSED, e))?);
    }
    if out.is_empty() {
        return Err(CniError::new(
            code::IPAM_REFUSED,
            format!("bgpd allocated no address under {handle}"),
        ));
    }
    Ok(out)
}

/// A transient failure may have allocated before the answer was lost: say where it is.
fn ambiguous(e: IpamError, handle: &str) -> CniError {
    let transient = e.is_transient();
    let cni = e.to_cni();
    if transient {
        cni.with_details(format!(
            "if bgpd recorded an allocation before the failure, it stays under handle {handle} until the runtime's DEL (or GC) releases it"
        ))
    } else {
        cni
    }
}

/// An allocation's address with its block's prefix length ("172.20.3.70" in
/// "172.20.3.64/26" gives 172.20.3.70/26): what calico-ipam hands to its main plugin.
pub fn address_of(a: &pb::Allocation) -> Result<IpNet, String> {
    let ip: IpAddr = a
        .address
        .parse()
        .map_err(|_| format!("bgpd answered with {:?}, not an address", a.address))?;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    let len = a
        .block
        .parse::<IpNet>()
        .ok()
        .filter(|b| b.contains(&ip))
        .map_or(full, |b| b.prefix_len());
    IpNet::new(ip, len).map_err(|e| e.to_string())
}

/// Releases the attachment's addresses (none held is success).
pub async fn release(bgpd: &mut Bgpd, conf: &NetConf, env: &Env) -> Result<Vec<String>, CniError> {
    let handle = conf.handle(&env.container_id);
    bgpd.release_handle(&handle).await.map_err(|e| {
        let mut c = e.to_cni();
        c.details =
            format!("the addresses under handle {handle} are still allocated; DEL again later");
        c
    })
}

/// CHECK for IPAM: every address in `expected` is still held by the attachment's handle.
pub async fn verify(
    bgpd: &mut Bgpd,
    conf: &NetConf,
    env: &Env,
    expected: &[IpAddr],
) -> Result<(), CniError> {
    let handle = conf.handle(&env.container_id);
    let held: Vec<IpAddr> = bgpd
        .get_handle(&handle)
        .await
        .map_err(|e| e.to_cni())?
        .iter()
        .filter_map(|a| a.address.parse().ok())
        .collect();
    let missing: Vec<String> = expected
        .iter()
        .filter(|ip| !held.contains(ip))
        .map(ToString::to_string)
        .collect();
    if held.is_empty() || !missing.is_empty() {
        return Err(CniError::new(
            code::CHECK_FAILED,
            format!(
                "IPAM: handle {handle} does not hold {} (it holds {})",
                if missing.is_empty() {
                    "any address".to_owned()
                } else {
                    missing.join(", ")
                },
                if held.is_empty() {
                    "nothing".to_owned()
                } else {
                    held.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        ));
    }
    Ok(())
}

/// GC: releases this network's handles that belong to no valid attachment.
pub async fn collect(bgpd: &mut Bgpd, conf: &NetConf) -> Result<Vec<pb::ReleasedHandle>, CniError> {
    let live = conf
        .valid_attachments
        .iter()
        .map(|a| conf.handle(&a.container_id))
        .collect();
    let r = bgpd
        .garbage_collect(pb::GarbageCollectRequest {
            node: conf.nodename.clone().unwrap_or_default(),
            live_handles: live,
            handle_prefix: conf.handle_prefix(),
            dry_run: false,
        })
        .await
        .map_err(|e| e.to_cni())?;
    for h in &r.released {
        tracing::info!(handle = %h.handle, addresses = ?h.addresses, "GC released a stale handle");
    }
    Ok(r.released)
}

/// STATUS: bgpd answers, and each family asked for has an enabled workload pool with free
/// addresses. (Pool node selectors are bgpd's to evaluate; a pool whose selector excludes this
/// node still counts here.)
pub async fn status(conf: &NetConf) -> Result<(), CniError> {
    // STATUS is a readiness probe: answer within a second or two, not after the ADD budget.
    let mut bgpd = Bgpd::new(
        conf.ipam_socket(),
        conf.bgpd_timeout.min(Duration::from_secs(2)),
        conf.bgpd_retry.min(Duration::from_secs(1)),
    );
    let (pools, usage) = bgpd
        .pools()
        .await
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, e.to_string()))?;
    let mut families = Vec::new();
    if conf.ipam.assign_ipv4 {
        families.push((false, &conf.ipam.ipv4_pools));
    }
    if conf.ipam.assign_ipv6 {
        families.push((true, &conf.ipam.ipv6_pools));
    }
    for (v6, wanted) in families {
        let family = if v6 { "IPv6" } else { "IPv4" };
        match serving_pools(&pools, &usage, v6, wanted) {
            PoolCheck::Ok => {}
            PoolCheck::NoPool => {
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
                    format!("no enabled {family} pool serves workloads{}", only(wanted)),
                ));
            }
            PoolCheck::Full(names) => {
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
                    format!("every {family} pool is full: {}", names.join(", ")),
                ));
            }
        }
    }
    Ok(())
}

fn only(wanted: &[String]) -> String {
    if wanted.is_empty() {
        String::new()
    } else {
        format!(" among {}", wanted.join(", "))
    }
}

#[derive(Debug, PartialEq, Eq)]
enum PoolCheck {
    Ok,
    NoPool,
    Full(Vec<String>),
}

/// Whether some pool can serve a workload address of the family.
fn serving_pools(
    pools: &[pb::IpPool],
    usage: &[pb::PoolUsage],
    v6: bool,
    wanted: &[String],
) -> PoolCheck {
    let candidates: Vec<&pb::IpPool> = pools
        .iter()
        .filter(|p| !p.disabled)
        .filter(|p| {
            p.cidr
                .parse::<IpNet>()
                .is_ok_and(|c| c.addr().is_ipv6() == v6)
        })
        .filter(|p| {
            p.allowed_uses.is_empty()
                || p.allowed_uses
                    .contains(&i32::from(pb::AllowedUse::Workload))
        })
        .filter(|p| {
            if wanted.is_empty() {
                p.assignment_mode != i32::from(pb::AssignmentMode::Manual)
            } else {
                wanted.iter().any(|w| *w == p.name || *w == p.cidr)
            }
        })
        .collect();
    if candidates.is_empty() {
        return PoolCheck::NoPool;
    }
    let free = |p: &pb::IpPool| {
        usage
            .iter()
            .find(|u| u.name == p.name)
            // No usage row yet: nothing allocated, so it has room.
            .is_none_or(|u| u.free > 0)
    };
    if candidates.iter().any(|p| free(p)) {
        PoolCheck::Ok
    } else {
        PoolCheck::Full(candidates.iter().map(|p| p.name.clone()).collect())
    }
}

/// The `margay-ipam` ADD result: each address with its block prefix and the gateway the main
/// plugin routes through (169.254.1.1 / fe80::ecee:eeff:feee:eeee, which ptp puts on its host
/// end).
pub fn ipam_result(conf: &NetConf, addresses: &[IpNet]) -> CniResult {
    CniResult {
        ips: addresses
            .iter()
            .map(|a| IpConfig {
                address: *a,
                gateway: Some(if a.addr().is_ipv4() {
                    IpAddr::V4(GATEWAY_V4)
                } else {
                    IpAddr::V6(GATEWAY_V6)
                }),
                interface: None,
            })
            .collect(),
        dns: conf.dns.clone(),
        ..CniResult::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: serde_json::Value) -> NetConf {
        let mut v =
            serde_json::json!({"cniVersion": "1.1.0", "name": "net", "type": "margay-ipam"});
        if let serde_json::Value::Object(m) = extra {
            for (k, x) in m {
                v[k] = x;
            }
        }
        NetConf::parse(v.to_string().as_bytes()).unwrap()
    }

    fn env(args: &str) -> Env {
        let vars = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", args),
        ];
        Env::parse(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap()
    }

    #[test]
    fn attributes_name_the_workload() {
        let c = conf(serde_json::json!({"nodename": "node-a"}));
        let a = attributes(&c, &env("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"));
        assert_eq!(a["namespace"], "default");
        assert_eq!(a["pod"], "web-0");
        assert_eq!(a["node"], "node-a");
        assert_eq!(a["container_id"], "c1");
        let a = attributes(&c, &env(""));
        assert!(!a.contains_key("pod") && !a.contains_key("namespace"));
        // Without a configured name the host name is recorded.
        assert_eq!(
            attributes(&conf(serde_json::json!({})), &env(""))["node"],
            hostname()
        );
    }

    #[test]
    fn only_the_main_plugin_names_the_host_interface() {
        let args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0";
        let standalone = attributes(&conf(serde_json::json!({})), &env(args));
        assert!(!standalone.contains_key(WORKLOAD_INTERFACE));
        let main = attributes(&conf(serde_json::json!({"type": "margay"})), &env(args));
        assert_eq!(
            main[WORKLOAD_INTERFACE],
            crate::names::host_ifname("cali", Some("default.web-0"), "c1")
        );
    }

    #[test]
    fn requested_addresses_prefer_the_configuration() {
        let plain = conf(serde_json::json!({}));
        assert!(requested(&plain, &env("")).unwrap().is_empty());
        assert_eq!(
            requested(&plain, &env("IP=10.0.0.7/24")).unwrap(),
            ["10.0.0.7".parse::<IpAddr>().unwrap()]
        );
        let e = requested(&plain, &env("IP=nope")).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        let rc = conf(serde_json::json!({"runtimeConfig": {"ips": ["10.9.9.9"]}}));
        assert_eq!(
            requested(&rc, &env("IP=10.0.0.7")).unwrap(),
            ["10.9.9.9".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn addresses_carry_their_block_prefix() {
        let a = |address: &str, block: &str| pb::Allocation {
            address: address.into(),
            block: block.into(),
            ..Default::default()
        };
        assert_eq!(
            address_of(&a("172.20.3.70", "172.20.3.64/26"))
                .unwrap()
                .to_string(),
            "172.20.3.70/26"
        );
        assert_eq!(
            address_of(&a("fd00::5", "fd00::/122")).unwrap().to_string(),
            "fd00::5/122"
        );
        // No block, or one that does not contain the address: a host prefix.
        assert_eq!(
            address_of(&a("172.20.3.70", "")).unwrap().to_string(),
            "172.20.3.70/32"
        );
        assert_eq!(
            address_of(&a("172.20.3.70", "10.0.0.0/26"))
                .unwrap()
                .to_string(),
            "172.20.3.70/32"
        );
        assert!(address_of(&a("x", "")).is_err());
    }

    fn pool(name: &str, cidr: &str) -> pb::IpPool {
        pb::IpPool {
            name: name.into(),
            cidr: cidr.into(),
            ..Default::default()
        }
    }

    fn used(name: &str, free: u64) -> pb::PoolUsage {
        pb::PoolUsage {
            name: name.into(),
            free,
            ..Default::default()
        }
    }

    #[test]
    fn which_pools_can_serve() {
        let v4 = pool("v4", "172.20.0.0/16");
        let v6 = pool("v6", "fd00::/48");
        assert_eq!(
            serving_pools(std::slice::from_ref(&v4), &[], false, &[]),
            PoolCheck::Ok
        );
        assert_eq!(
            serving_pools(std::slice::from_ref(&v4), &[], true, &[]),
            PoolCheck::NoPool
        );
        assert_eq!(
            serving_pools(&[v4.clone(), v6.clone()], &[used("v6", 3)], true, &[]),
            PoolCheck::Ok
        );
        assert_eq!(
            serving_pools(std::slice::from_ref(&v4), &[used("v4", 0)], false, &[]),
            PoolCheck::Full(vec!["v4".into()])
        );
        let disabled = pb::IpPool {
            disabled: true,
            ..v4.clone()
        };
        assert_eq!(
            serving_pools(&[disabled], &[], false, &[]),
            PoolCheck::NoPool
        );
        let tunnel_only = pb::IpPool {
            allowed_uses: vec![pb::AllowedUse::Tunnel.into()],
            ..v4.clone()
        };
        assert_eq!(
            serving_pools(&[tunnel_only], &[], false, &[]),
            PoolCheck::NoPool
        );
        let manual = pb::IpPool {
            assignment_mode: pb::AssignmentMode::Manual.into(),
            ..v4.clone()
        };
        assert_eq!(
            serving_pools(std::slice::from_ref(&manual), &[], false, &[]),
            PoolCheck::NoPool
        );
        // A manual pool serves when the configuration names it (by name or CIDR).
        assert_eq!(
            serving_pools(std::slice::from_ref(&manual), &[], false, &["v4".into()]),
            PoolCheck::Ok
        );
        assert_eq!(
            serving_pools(&[manual], &[], false, &["172.20.0.0/16".into()]),
            PoolCheck::Ok
        );
        assert_eq!(
            serving_pools(&[v4], &[], false, &["other".into()]),
            PoolCheck::NoPool
        );
    }

    #[test]
    fn ipam_results_carry_gateways() {
        let c = conf(serde_json::json!({"dns": {"nameservers": ["10.96.0.10"]}}));
        let r = ipam_result(
            &c,
            &[
                "172.20.0.5/26".parse().unwrap(),
                "fd00::5/122".parse().unwrap(),
            ],
        );
        assert_eq!(r.ips[0].gateway, Some(IpAddr::V4(GATEWAY_V4)));
        assert_eq!(r.ips[1].gateway, Some(IpAddr::V6(GATEWAY_V6)));
        assert!(r.interfaces.is_empty() && r.ips.iter().all(|i| i.interface.is_none()));
        assert_eq!(r.dns.nameservers, ["10.96.0.10"]);
    }
}
