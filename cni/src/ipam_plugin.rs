//! `margay-ipam`: addresses from bgpd, under the handle `<network>.<container id>` with the
//! attributes namespace, pod, node and container id. The same functions serve the `margay`
//! main plugin in-process (one gRPC call per ADD, no second exec), and the `margay-ipam`
//! binary under any main plugin (ptp, bridge, ...).
//!
//! - ADD: the requested addresses (`runtimeConfig.ips`, `args.cni.ips`, else CNI_ARGS `IP=`),
//!   or one IPv4 and/or one IPv6 address from the configured pools (`assign_ipv4`,
//!   `assign_ipv6`); dual stack all or nothing: when one family fails, the other is released.
//!   An ADD again for the same container gets what its handle already holds.
//! - DEL: releases the handle; an unknown handle is success, so DEL is idempotent.
//! - CHECK: the handle still holds the addresses of prevResult.
//! - GC: releases this network's handles whose container is not among the valid attachments.
//! - STATUS (`ipam_status`): bgpd answers, and some pool can serve each family asked for.
//!
//! Why this file is long: ADD's paths (retry, requested, automatic, withheld addresses
//! skipped) share the handle and its all-or-nothing release, and are tested together.
//!
//! Gateways. Under `margay` the pod gets a host address and routes through 169.254.1.1 and
//! fe80::ecee:eeff:feee:eeee. Under another main plugin each address carries its block's prefix
//! (as calico-ipam's do) and a gateway that plugin can use, chosen by `ipam.gateway`:
//! `"link-local"` (the default under `ptp`) reports Calico's two link-local gateways, which ptp
//! puts on the host end of each pod's veth; `"block"` (the default under every other plugin:
//! bridge, macvlan, ...) reports the block's first address after its network address, as
//! host-local and bridge do by default, for a plugin that puts the gateway inside the pods'
//! subnet (bridge's isGateway: one gateway per block, so such a node's pods of one family
//! should fit one block). Either way no pod gets an address that is the subnet's rather than a
//! host's (see `subnet`): when bgpd hands one out, margay-ipam keeps it while it asks for
//! another, then gives it back. Pools shared with `margay` pods on the same node are best
//! avoided under `"block"`: such a pod may hold a block's first address, which a bridge then
//! also claims.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;
use proto::v1 as pb;

use crate::bgpd_client::{Bgpd, IpamError};
use crate::spec::NetConf;
use crate::spec::config::{Gateway, MAIN_TYPE, parse_requested_ip};
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
    if let Some(id) = &env.args.k8s_infra_container_id {
        a.insert("pod_infra_container_id".into(), id.clone());
    }
    if let Some(uid) = &env.args.k8s_pod_uid {
        a.insert("pod_uid".into(), uid.clone());
    }
    a.insert("node".into(), node_name(conf));
    a.insert("container_id".into(), env.container_id.clone());
    // The pod's interface: its primary one (eth0) is the one the Pod's status reports, which
    // the Kubernetes datastore's GC judges by.
    a.insert(POD_IFNAME.into(), env.ifname.clone());
    // Only our main plugin wires the host side: bgpd then desires the pod's route on it
    // (another main plugin using margay-ipam has interfaces of its own).
    if conf.plugin_type == MAIN_TYPE {
        a.insert(
            WORKLOAD_INTERFACE.into(),
            crate::attachment::host_ifname(conf, env),
        );
    }
    a
}

/// The allocation attribute naming the pod's interface (CNI_IFNAME).
pub const POD_IFNAME: &str = "ifname";

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

/// The AutoAssign request of this attachment, for `num_ipv4` and `num_ipv6` addresses.
fn assign_request(
    conf: &NetConf,
    env: &Env,
    num_ipv4: u32,
    num_ipv6: u32,
) -> pb::AutoAssignRequest {
    pb::AutoAssignRequest {
        handle: conf.handle(&env.container_id),
        attributes: attributes(conf, env),
        num_ipv4,
        num_ipv6,
        node: conf.nodename.clone().unwrap_or_default(),
        ipv4_pools: conf.ipam.ipv4_pools.clone(),
        ipv6_pools: conf.ipam.ipv6_pools.clone(),
        r#use: pb::AllowedUse::Workload.into(),
        strict_affinity: false,
    }
}

/// The configuration with what a Kubernetes pod's Calico annotations ask for on its primary
/// interface (bgpd reads
/// them from the Pod and its Namespace, and refuses, naming the annotation, a pool that does
/// not exist or an address outside every pool): their pools replace the configuration's, and
/// their fixed addresses (`ipAddrs`) are requested unless the runtime requested some.
async fn with_annotations(bgpd: &mut Bgpd, conf: &NetConf, env: &Env) -> Result<NetConf, CniError> {
    let mut conf = conf.clone();
    let (Some(namespace), Some(pod)) = (&env.args.k8s_namespace, &env.args.k8s_pod) else {
        return Ok(conf);
    };
    // The annotations are the pod's primary network's (Calico's own plugin reads them): a
    // second network (Multus' net1, ...) keeps its own pools.
    if env.ifname != "eth0" {
        return Ok(conf);
    }
    let asked = bgpd
        .pod_addressing(namespace, pod)
        .await
        .map_err(|e| e.to_cni())?;
    if let Some(pools) = asked.ipv4_pools {
        conf.ipam.ipv4_pools = pools.values;
    }
    if let Some(pools) = asked.ipv6_pools {
        conf.ipam.ipv6_pools = pools.values;
    }
    if let Some(fixed) = asked.ip_addrs
        && conf.requested_ips.is_empty()
    {
        conf.requested_ips = fixed
            .values
            .iter()
            .map(|v| {
                v.parse().map_err(|_| {
                    CniError::new(
                        code::IPAM_REFUSED,
                        format!("{}: {v:?} is not an IP address", fixed.source),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
    }
    Ok(conf)
}

/// Allocates this attachment's addresses; each with the prefix length of its block. Under a
/// main plugin other than margay, none is an address of the block's subnet (see the module).
pub async fn allocate(bgpd: &mut Bgpd, conf: &NetConf, env: &Env) -> Result<Vec<IpNet>, CniError> {
    let conf = &with_annotations(bgpd, conf, env).await?;
    let handle = conf.handle(&env.container_id);
    let wanted = requested(conf, env)?;
    // margay's pods get host addresses: every address of a block suits them.
    let subnet = (conf.plugin_type != MAIN_TYPE).then(|| conf.ipam_gateway());
    let allocations = if wanted.is_empty() {
        if let Some(held) = held_for_retry(bgpd, conf, &handle).await? {
            // An ADD again for the same container (the runtime lost the first answer, or
            // retries what it saw fail): the handle's addresses are the answer, as calico-ipam
            // gives them, so a retry never takes a second address.
            return held
                .iter()
                .map(|a| address_of(a).map_err(|e| CniError::new(code::IPAM_REFUSED, e)))
                .collect();
        }
        let r = bgpd
            .auto_assign(assign_request(
                conf,
                env,
                u32::from(conf.ipam.assign_ipv4),
                u32::from(conf.ipam.assign_ipv6),
            ))
            .await
            .map_err(|e| ambiguous(e, &handle))?;
        let mut all = r.ipv4;
        all.extend(r.ipv6);
        match subnet {
            Some(mode) => skip_withheld(bgpd, conf, env, all, mode).await?,
            None => all,
        }
    } else {
        let attributes = attributes(conf, env);
        let node = conf.nodename.clone().unwrap_or_default();
        let reqs = wanted
            .iter()
            .map(|ip| pb::AssignIpRequest {
                address: ip.to_string(),
                handle: handle.clone(),
                attributes: attributes.clone(),
                node: node.clone(),
            })
            .collect();
        let got = bgpd
            .assign_ips(reqs)
            .await
            .map_err(|e| ambiguous(e, &handle))?;
        if let Some(mode) = subnet
            && let Some(refusal) = refuse_withheld(&got, mode)
        {
            give_back_all(bgpd, &handle).await;
            return Err(refusal);
        }
        got
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

/// What an earlier ADD of this container left under its handle, if it is what this ADD
/// wants (one address of each family asked for). Anything else under the handle (a partial
/// allocation, or one of other families) is given back first, so the ADD starts clean.
async fn held_for_retry(
    bgpd: &mut Bgpd,
    conf: &NetConf,
    handle: &str,
) -> Result<Option<Vec<pb::Allocation>>, CniError> {
    let held = bgpd
        .get_handle(handle)
        .await
        .map_err(|e| ambiguous(e, handle))?;
    if held.is_empty() {
        return Ok(None);
    }
    let v6 = held.iter().filter(|a| a.address.contains(':')).count();
    let v4 = held.len() - v6;
    if v4 == usize::from(conf.ipam.assign_ipv4) && v6 == usize::from(conf.ipam.assign_ipv6) {
        return Ok(Some(held));
    }
    bgpd.release_handle(handle)
        .await
        .map_err(|e| ambiguous(e, handle))?;
    Ok(None)
}

/// Rounds of asking bgpd for replacements before giving up. A block holds three withheld
/// addresses (network, gateway, broadcast), and those given back after earlier ADDs are
/// free again: on a node whose blocks are otherwise full, every block may offer its three
/// before bgpd claims a new one (whose first two are withheld too). They stay held while
/// bgpd is asked again, so each round moves past one: three per block of the node's (20 by
/// default, `maxBlocksPerHost`) and a new block's two.
const SKIP_ROUNDS: usize = 3 * 20 + 2;

/// Whether the allocation is one a pod must not get (an error for a block too small for the
/// gateway mode).
fn is_withheld(a: &pb::Allocation, mode: Gateway) -> Result<bool, CniError> {
    let net = address_of(a).map_err(|e| CniError::new(code::IPAM_REFUSED, e))?;
    crate::subnet::withheld(&net, mode).map_err(|e| CniError::new(code::IPAM_REFUSED, e))
}

/// Replaces each withheld allocation by another of its family. The withheld ones stay held
/// while bgpd is asked again, so it moves past them (to another block if need be); then they
/// are given back. All or nothing: on failure the handle is released.
async fn skip_withheld(
    bgpd: &mut Bgpd,
    conf: &NetConf,
    env: &Env,
    mut got: Vec<pb::Allocation>,
    mode: Gateway,
) -> Result<Vec<pb::Allocation>, CniError> {
    let handle = conf.handle(&env.container_id);
    let mut skipped = false;
    for round in 0..=SKIP_ROUNDS {
        let mut keep = Vec::with_capacity(got.len());
        let mut bad = Vec::new();
        for a in got {
            match is_withheld(&a, mode) {
                Ok(true) => bad.push(a),
                Ok(false) => keep.push(a),
                Err(e) => {
                    give_back_all(bgpd, &handle).await;
                    return Err(e);
                }
            }
        }
        if bad.is_empty() {
            got = keep;
            break;
        }
        if round == SKIP_ROUNDS {
            give_back_all(bgpd, &handle).await;
            return Err(CniError::new(
                code::NO_ADDRESS,
                format!(
                    "bgpd offered only addresses that are a block's network, broadcast or gateway address ({}) after {SKIP_ROUNDS} tries; the node's blocks are nearly full",
                    bad.iter()
                        .map(|a| a.address.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let v6 = bad.iter().filter(|a| a.address.contains(':')).count() as u32;
        let v4 = bad.len() as u32 - v6;
        tracing::debug!(withheld = ?bad.iter().map(|a| &a.address).collect::<Vec<_>>(), "addresses of the subnet held back from the pod");
        skipped = true;
        match bgpd
            .auto_assign_more(assign_request(conf, env, v4, v6))
            .await
        {
            Ok(r) => {
                keep.extend(r.ipv4);
                keep.extend(r.ipv6);
                got = keep;
            }
            Err(e) => {
                give_back_all(bgpd, &handle).await;
                return Err(e.to_cni());
            }
        }
    }
    if skipped {
        give_back_extra(bgpd, &handle, &got).await;
    }
    Ok(got)
}

/// Gives back what `handle` holds beyond `kept`: the withheld addresses, and any a lost answer
/// left. A failure only costs those addresses until the pod's DEL releases the handle.
async fn give_back_extra(bgpd: &mut Bgpd, handle: &str, kept: &[pb::Allocation]) {
    let held = match bgpd.get_handle(handle).await {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(%handle, "cannot read the handle to give back withheld addresses: {e}; DEL releases them");
            return;
        }
    };
    let extra: Vec<pb::ReleaseIp> = held
        .into_iter()
        .filter(|h| !kept.iter().any(|k| k.address == h.address))
        .map(|h| pb::ReleaseIp {
            address: h.address,
            handle: handle.to_owned(),
            sequence: h.sequence,
        })
        .collect();
    if let Err(e) = bgpd.release_ips(extra).await {
        tracing::warn!(%handle, "cannot give back withheld addresses: {e}; DEL releases them");
    }
}

/// Releases everything under `handle` after a failed ADD (logged if that fails too: the
/// runtime's DEL releases it).
async fn give_back_all(bgpd: &mut Bgpd, handle: &str) {
    if let Err(e) = bgpd.release_handle(handle).await {
        tracing::warn!(%handle, "cannot release the handle after a failed ADD: {e}; DEL releases it");
    }
}

/// A requested address a pod must not have: the refusal to give.
fn refuse_withheld(got: &[pb::Allocation], mode: Gateway) -> Option<CniError> {
    for a in got {
        match is_withheld(a, mode) {
            Ok(false) => {}
            Ok(true) => {
                return Some(CniError::new(
                    code::IPAM_REFUSED,
                    format!(
                        "{} is the network, broadcast or gateway address of its block {} (ipam.gateway {:?}); ask for another address",
                        a.address,
                        a.block,
                        mode.name()
                    ),
                ));
            }
            Err(e) => return Some(e),
        }
    }
    None
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

/// The `margay-ipam` ADD result: each address with its block prefix and the gateway the main
/// plugin routes through ([`NetConf::ipam_gateway`]).
pub fn ipam_result(conf: &NetConf, addresses: &[IpNet]) -> Result<CniResult, CniError> {
    let mode = conf.ipam_gateway();
    let mut ips = Vec::with_capacity(addresses.len());
    for a in addresses {
        let gateway =
            crate::subnet::gateway(a, mode).map_err(|e| CniError::new(code::IPAM_REFUSED, e))?;
        ips.push(IpConfig {
            address: *a,
            gateway: Some(gateway),
            interface: None,
        });
    }
    Ok(CniResult {
        ips,
        dns: conf.dns.clone(),
        ..CniResult::default()
    })
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
        assert!(!a.contains_key("pod_infra_container_id"));
        // What a kubelet's runtime adds (containerd's CRI passes both).
        let a = attributes(
            &c,
            &env(
                "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=sb1;K8S_POD_UID=u-9",
            ),
        );
        assert_eq!(a["pod_infra_container_id"], "sb1");
        assert_eq!(a["pod_uid"], "u-9");
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

    #[test]
    fn ipam_results_carry_gateways() {
        let c = conf(serde_json::json!({"dns": {"nameservers": ["10.96.0.10"]}}));
        let nets = [
            "172.20.0.5/26".parse().unwrap(),
            "fd00::5/122".parse().unwrap(),
        ];
        let r = ipam_result(&c, &nets).unwrap();
        // margay-ipam on its own (type margay-ipam, no main plugin named): block gateways.
        assert_eq!(r.ips[0].gateway, Some("172.20.0.1".parse().unwrap()));
        assert_eq!(r.ips[1].gateway, Some("fd00::1".parse().unwrap()));
        let ptp = conf(serde_json::json!({"type": "ptp"}));
        let r = ipam_result(&ptp, &nets).unwrap();
        assert_eq!(r.ips[0].gateway, Some("169.254.1.1".parse().unwrap()));
        assert_eq!(
            r.ips[1].gateway,
            Some("fe80::ecee:eeff:feee:eeee".parse().unwrap())
        );
        let tiny = ["10.0.0.4/31".parse().unwrap()];
        assert_eq!(ipam_result(&c, &tiny).unwrap_err().code, code::IPAM_REFUSED);
        let r = ipam_result(&c, &nets).unwrap();
        assert!(r.interfaces.is_empty() && r.ips.iter().all(|i| i.interface.is_none()));
        assert_eq!(r.dns.nameservers, ["10.96.0.10"]);
    }
}
