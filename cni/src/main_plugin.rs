//! `margay`, the main plugin: ADD wires a pod (IPAM, then the veth pair and its routes; any
//! failure undoes both), DEL removes the pod's interface and releases its addresses, GC and
//! STATUS go to IPAM. With `ipam.type` margay-ipam, IPAM runs in-process (one gRPC call per
//! ADD); any other IPAM plugin is run as a delegate per the spec.

use std::net::IpAddr;
use std::time::Instant;

use ipnet::IpNet;
use tokio::runtime::Runtime;

use crate::attachment::{host_ifname, open_netns};
use crate::dataplane::{self, Plan};
use crate::delegate;
use crate::endpoint;
use crate::ipam_plugin;
use crate::names::{self, GATEWAY_V4, GATEWAY_V6, HOST_MAC};
use crate::netns::{Netns, NetnsError, netns_error};
use crate::spec::NetConf;
use crate::spec::env::{Command, Env};
use crate::spec::error::{CniError, code};
use crate::spec::result::{CniResult, Interface, IpConfig, Route};

/// Where this attachment's addresses came from, to give them back on failure.
enum Ipam {
    Ours(crate::bgpd_client::Bgpd),
    Delegate(std::path::PathBuf),
}

#[expect(
    clippy::too_many_lines,
    reason = "CNI ADD in order: namespace, addresses (ours or a delegate's), wiring, endpoint, each failure giving back what came before; the give-back needs every step's state"
)]
pub fn add(rt: &Runtime, conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<CniResult, CniError> {
    let started = Instant::now();
    // The namespace first: a missing one fails before anything is allocated.
    let netns = open_netns(env)?;
    let host_if = host_ifname(conf, env);
    let plan = |mtu, v6| Plan {
        host_if: &host_if,
        pod_if: &env.ifname,
        netns: &netns,
        mtu,
        allow_ip_forwarding: conf.allow_ip_forwarding,
        v6,
    };

    let (addresses, wired, ipam_dns, mtu, ipam) = if conf.ipam_is_ours() {
        // The veth pair needs no address: it is made while bgpd allocates (the gRPC call is
        // most of an ADD), on a thread of its own so the namespace switch stays on it.
        let v6 = match ipam_plugin::requested(conf, env) {
            Ok(r) if !r.is_empty() => r.iter().any(IpAddr::is_ipv6),
            _ => conf.ipam.assign_ipv6,
        };
        let (allocated, prepared) = std::thread::scope(|s| {
            let wiring = s.spawn(|| {
                let mtu = pod_mtu(conf);
                dataplane::prepare(&plan(mtu, v6)).map(|p| (p, mtu))
            });
            let mut bgpd = ipam_plugin::client(conf);
            let allocated = rt
                .block_on(ipam_plugin::allocate(&mut bgpd, conf, env))
                .map(|nets| (bgpd, nets));
            let prepared = wiring
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (allocated, prepared)
        });
        let (bgpd, nets, pending, mtu) = match (allocated, prepared) {
            (Ok((bgpd, nets)), Ok((pending, mtu))) => (bgpd, nets, pending, mtu),
            (Ok((bgpd, _)), Err(e)) => {
                return Err(give_back(
                    rt,
                    Ipam::Ours(bgpd),
                    conf,
                    env,
                    stdin,
                    e.to_cni(),
                ));
            }
            (Err(e), prepared) => {
                match prepared {
                    Ok((pending, _)) => pending.remove(),
                    Err(d) => tracing::debug!("the veth pair failed too: {d}"),
                }
                return Err(e);
            }
        };
        let ips = host_addresses(&nets);
        match pending.finish(&netns, &ips) {
            Ok(w) => (ips, w, None, mtu, Ipam::Ours(bgpd)),
            Err(e) => {
                return Err(give_back(
                    rt,
                    Ipam::Ours(bgpd),
                    conf,
                    env,
                    stdin,
                    e.to_cni(),
                ));
            }
        }
    } else {
        let plugin = delegate::find(&conf.ipam.plugin_type, &env.path)?;
        let r = match delegate::add(&plugin, stdin) {
            Ok(r) => r,
            Err(e) => {
                // The spec: a delegate whose ADD failed gets a DEL before we give up, so it
                // frees whatever it may have reserved.
                let _ = delegate::run(&plugin, Command::Del, stdin);
                return Err(e);
            }
        };
        let nets: Vec<IpNet> = r.ips.iter().map(|i| i.address).collect();
        let ipam = Ipam::Delegate(plugin);
        if nets.is_empty() {
            let e = CniError::new(
                code::IPAM_REFUSED,
                format!(
                    "the IPAM plugin {} returned no address",
                    conf.ipam.plugin_type
                ),
            );
            return Err(give_back(rt, ipam, conf, env, stdin, e));
        }
        let ips = host_addresses(&nets);
        let mtu = pod_mtu(conf);
        match dataplane::setup(&plan(mtu, ips.iter().any(IpAddr::is_ipv6)), &ips) {
            Ok(w) => (ips, w, Some(r.dns), mtu, ipam),
            Err(e) => return Err(give_back(rt, ipam, conf, env, stdin, e.to_cni())),
        }
    };

    // Policy knows the pod from here on; without its endpoint the pod would be outside every
    // policy, so a failure to record it undoes the ADD.
    let mut bgpd = match ipam {
        Ipam::Ours(ref b) => b.clone_config(),
        Ipam::Delegate(_) => ipam_plugin::client(conf),
    };
    let document = endpoint::document(conf, env, &host_if, &addresses).to_string();
    if let Err(e) = rt.block_on(bgpd.apply_document(document)) {
        if let Err(d) = dataplane::teardown(&netns, &env.ifname) {
            tracing::warn!("removing the pod's interface after a failed ADD: {d}");
        }
        return Err(give_back(rt, ipam, conf, env, stdin, e.to_cni()));
    }

    let mut result = CniResult {
        interfaces: vec![
            Interface {
                name: host_if.clone(),
                mac: names::format_mac(&HOST_MAC),
                mtu: Some(mtu),
                ..Interface::default()
            },
            Interface {
                name: env.ifname.clone(),
                mac: wired.pod_mac.clone(),
                mtu: Some(mtu),
                sandbox: netns.path().display().to_string(),
                ..Interface::default()
            },
        ],
        ips: addresses
            .iter()
            .map(|ip| IpConfig {
                address: IpNet::from(*ip),
                gateway: Some(names::gateway_of(*ip)),
                interface: Some(1),
            })
            .collect(),
        routes: default_routes(&addresses),
        dns: if conf.dns.is_empty() {
            ipam_dns.unwrap_or_default()
        } else {
            conf.dns.clone()
        },
    };
    if let Some(mut prev) = conf.prev_result.clone() {
        // Keep what earlier plugins reported; ours follows.
        prev.append(result);
        result = prev;
    }
    tracing::info!(
        container = %env.container_id,
        interface = %host_if,
        addresses = ?addresses,
        mtu,
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
        "ADD wired the pod"
    );
    Ok(result)
}

/// A pod gets host addresses (/32, /128): its neighbours are all behind the gateway.
fn host_addresses(nets: &[IpNet]) -> Vec<IpAddr> {
    nets.iter().map(IpNet::addr).collect()
}

/// The configured MTU, else the uplink's less the encapsulation.
fn pod_mtu(conf: &NetConf) -> u32 {
    let uplink = match conf.mtu {
        Some(_) => None,
        None => dataplane::uplink_mtu().ok().flatten(),
    };
    dataplane::pod_mtu(conf.mtu, uplink, conf.encapsulation)
}

/// The default route of each family the pod has.
pub fn default_routes(ips: &[IpAddr]) -> Vec<Route> {
    let mut routes = Vec::new();
    if ips.iter().any(IpAddr::is_ipv4) {
        routes.push(Route::new(
            "0.0.0.0/0".parse().expect("a literal prefix"),
            Some(IpAddr::V4(GATEWAY_V4)),
        ));
    }
    if ips.iter().any(IpAddr::is_ipv6) {
        routes.push(Route::new(
            "::/0".parse().expect("a literal prefix"),
            Some(IpAddr::V6(GATEWAY_V6)),
        ));
    }
    routes
}

/// Releases what IPAM handed out for a failed ADD; the error says whether that worked.
fn give_back(
    rt: &Runtime,
    ipam: Ipam,
    conf: &NetConf,
    env: &Env,
    stdin: &[u8],
    mut error: CniError,
) -> CniError {
    let handle = conf.handle(&env.container_id);
    let outcome = match ipam {
        Ipam::Ours(mut bgpd) => rt
            .block_on(ipam_plugin::release(&mut bgpd, conf, env))
            .map(|_| ()),
        Ipam::Delegate(plugin) => delegate::run(&plugin, Command::Del, stdin).map(|_| ()),
    };
    let note = match outcome {
        Ok(()) => format!(
            "rolled back: the interfaces were removed and the addresses of {handle} released"
        ),
        Err(e) => format!(
            "the interfaces were removed, but releasing the addresses of {handle} failed ({}); the runtime's DEL releases them",
            e.msg
        ),
    };
    tracing::warn!("ADD failed: {}; {note}", error.msg);
    error.details = if error.details.is_empty() {
        note
    } else {
        format!("{}; {note}", error.details)
    };
    error
}

/// DEL: the pod's interface goes first (so an address is never released while a pod still
/// holds it), then IPAM. Everything already gone counts as done.
pub fn del(rt: &Runtime, conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<(), CniError> {
    if let Some(path) = &env.netns {
        match Netns::open(path) {
            Ok(ns) => {
                let removed = dataplane::teardown(&ns, &env.ifname).map_err(|e| e.to_cni())?;
                tracing::debug!(removed, "DEL: pod interface");
            }
            // The namespace (and with it the veth pair) is gone already.
            Err(NetnsError::Gone(_) | NetnsError::NotNetns(_)) => {}
            Err(e) => return Err(netns_error(&e)),
        }
    }
    // The endpoint before the addresses: policy forgets the pod before its address can be
    // another pod's.
    let mut bgpd = ipam_plugin::client(conf);
    rt.block_on(bgpd.delete_document(endpoint::doc_ref(env)))
        .map_err(|e| e.to_cni())?;
    if conf.ipam_is_ours() {
        let released = rt.block_on(ipam_plugin::release(&mut bgpd, conf, env))?;
        tracing::info!(container = %env.container_id, ?released, "DEL released the pod's addresses");
    } else {
        let plugin = delegate::find(&conf.ipam.plugin_type, &env.path)?;
        delegate::run(&plugin, Command::Del, stdin)?;
    }
    Ok(())
}

pub fn gc(rt: &Runtime, conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<(), CniError> {
    if conf.ipam_is_ours() {
        let mut bgpd = ipam_plugin::client(conf);
        rt.block_on(ipam_plugin::collect(&mut bgpd, conf))?;
    } else {
        let plugin = delegate::find(&conf.ipam.plugin_type, &env.path)?;
        delegate::run(&plugin, Command::Gc, stdin)?;
    }
    Ok(())
}

pub fn status(rt: &Runtime, conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<(), CniError> {
    if conf.ipam_is_ours() {
        rt.block_on(crate::ipam_status::status(conf))
    } else {
        let plugin = delegate::find(&conf.ipam.plugin_type, &env.path)
            .map_err(|e| CniError::new(code::NOT_AVAILABLE, e.msg))?;
        delegate::run(&plugin, Command::Status, stdin).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_routes_per_family() {
        let v4: IpAddr = "172.20.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let r = default_routes(&[v4]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].dst.to_string(), "0.0.0.0/0");
        assert_eq!(r[0].gw, Some(IpAddr::V4(GATEWAY_V4)));
        let r = default_routes(&[v4, v6]);
        assert_eq!(r[1].dst.to_string(), "::/0");
        assert_eq!(r[1].gw, Some(IpAddr::V6(GATEWAY_V6)));
        assert!(default_routes(&[]).is_empty());
        assert_eq!(names::gateway_of(v6), IpAddr::V6(GATEWAY_V6));
    }
}
