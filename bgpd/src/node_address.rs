//! A node's addresses from its Kubernetes `Node` when the configuration gives none: what
//! Calico's `kubernetes-internal-ip` autodetection does, and what the DaemonSet relies on.
//! The first `InternalIP` of each family in the Node's `status.addresses` (the kubelet's
//! report), with the prefix length of the host interface that holds it.
//!
//! bgpd waits for them at start, before anything uses the node's addresses (the speaker's
//! next hops, the registration), logging why while it waits: the Node not there yet (the
//! kubelet registers it), no `InternalIP` yet, or one this host does not have. `pick` decides
//! and is tested without a host; `resolve` asks.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::config::{Config, DatastoreKind};
use crate::datastore::DatastoreHandle;

/// How long to wait between two asks while the Node is not ready to say.
const RETRY: Duration = Duration::from_secs(2);

/// The node's IPv4 and IPv6 address from `internal` (the Node's `InternalIP`s, in order),
/// each with its prefix on this host (`host` gives it); an error names an address the host
/// does not have.
pub fn pick(
    internal: &[IpAddr],
    host: impl Fn(IpAddr) -> Option<IpNet>,
) -> Result<(Option<Ipv4Net>, Option<Ipv6Net>), String> {
    let mut v4 = None;
    let mut v6 = None;
    for &a in internal {
        let taken = match a {
            IpAddr::V4(_) => v4.is_some(),
            IpAddr::V6(_) => v6.is_some(),
        };
        if taken {
            continue;
        }
        match host(a) {
            Some(IpNet::V4(n)) => v4 = Some(n),
            Some(IpNet::V6(n)) => v6 = Some(n),
            None => {
                return Err(format!(
                    "the Node's InternalIP {a} is on no interface of this host: check the \
                     kubelet's --node-ip, or set node.address / node.address6"
                ));
            }
        }
    }
    if v4.is_none() && v6.is_none() {
        return Err("the Node has no InternalIP in status.addresses yet".into());
    }
    Ok((v4, v6))
}

/// `config` with the node's addresses from its Kubernetes Node when it has none and the
/// datastore is the Kubernetes API; waits until the Node says them.
pub async fn resolve(mut config: Config, datastore: &DatastoreHandle) -> Config {
    if config.datastore.kind != DatastoreKind::Kubernetes
        || config.node.address.is_some()
        || config.node.address6.is_some()
    {
        return config;
    }
    let name = config.node.name.clone();
    loop {
        let asked = match datastore.store() {
            None => Err("the Kubernetes API is not reachable yet".to_owned()),
            Some(store) => match store.as_kubernetes() {
                None => return config,
                Some(kube) => match kube.node_internal_ips(&name).await {
                    Ok(Some(ips)) => pick(&ips, |a| {
                        crate::speaker::iface::host_network(a).map(|(_, n)| n)
                    }),
                    Ok(None) => Err(format!(
                        "there is no Kubernetes Node {name} yet (its kubelet registers it)"
                    )),
                    Err(e) => Err(e.to_string()),
                },
            },
        };
        match asked {
            Ok((v4, v6)) => {
                tracing::info!(node = %name, ?v4, ?v6, "the node's addresses, from its Kubernetes Node's InternalIPs");
                config.adopt_addresses(v4, v6);
                return config;
            }
            Err(why) => {
                tracing::warn!(node = %name, "waiting for the node's addresses from its Kubernetes Node (node.address is unset): {why}")
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(a: IpAddr) -> Option<IpNet> {
        match a.to_string().as_str() {
            "10.0.0.5" => Some("10.0.0.5/24".parse().unwrap()),
            "10.1.0.5" => Some("10.1.0.5/16".parse().unwrap()),
            "fd00::5" => Some("fd00::5/64".parse().unwrap()),
            _ => None,
        }
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn the_first_internal_ip_of_each_family_with_the_host_s_prefix() {
        let (v4, v6) = pick(&ips(&["10.0.0.5", "fd00::5", "10.1.0.5"]), host).unwrap();
        assert_eq!(v4.unwrap().to_string(), "10.0.0.5/24");
        assert_eq!(v6.unwrap().to_string(), "fd00::5/64");
        let (v4, v6) = pick(&ips(&["10.1.0.5"]), host).unwrap();
        assert_eq!((v4.unwrap().to_string(), v6), ("10.1.0.5/16".into(), None));
    }

    #[test]
    fn an_address_the_host_lacks_or_none_at_all_is_said() {
        let e = pick(&ips(&["192.0.2.1"]), host).unwrap_err();
        assert!(
            e.contains("InternalIP 192.0.2.1 is on no interface of this host"),
            "{e}"
        );
        let e = pick(&[], host).unwrap_err();
        assert!(e.contains("no InternalIP"), "{e}");
    }
}
