//! What a Kubernetes pod's annotations ask of IPAM, read as Calico's CNI plugin reads them
//! (sans-IO: the annotations in, the request's pools and fixed addresses out):
//!
//! - `cni.projectcalico.org/ipv4pools` and `ipv6pools`: JSON lists of pool names or CIDRs to
//!   take the pod's addresses from; the Pod's annotation wins over its Namespace's, each
//!   family on its own;
//! - `cni.projectcalico.org/ipAddrs`: a JSON list of fixed addresses (the Pod's only), each
//!   of which must lie in a pool that gives workload addresses;
//! - `cni.projectcalico.org/ipAddrsNoIpam`: addresses outside IPAM, which Calico allows only
//!   when an operator turns it on; margay refuses it (every address goes through IPAM).
//!
//! A refusal names the annotation and where it was found; it comes before anything is
//! allocated.

use std::collections::BTreeMap;
use std::net::IpAddr;

use datastore::model::{AllowedUse, IpPool};

use crate::IpamError;

pub const IPV4_POOLS: &str = "cni.projectcalico.org/ipv4pools";
pub const IPV6_POOLS: &str = "cni.projectcalico.org/ipv6pools";
pub const IP_ADDRS: &str = "cni.projectcalico.org/ipAddrs";
pub const IP_ADDRS_NO_IPAM: &str = "cni.projectcalico.org/ipAddrsNoIpam";

/// One annotation's values and where they were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotated {
    pub values: Vec<String>,
    /// E.g. "the annotation cni.projectcalico.org/ipv4pools of pod prod/web-0".
    pub source: String,
}

/// What the annotations ask for; `None` where they ask nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAddressing {
    pub ipv4_pools: Option<Annotated>,
    pub ipv6_pools: Option<Annotated>,
    pub ip_addrs: Option<Annotated>,
}

fn refuse(annotation: &'static str, source: &str, reason: String) -> IpamError {
    IpamError::InvalidArgument {
        field: annotation,
        reason: format!("{source}: {reason}"),
    }
}

/// The JSON list of strings of `annotation` in `notes`, if it is there.
fn list(
    notes: &BTreeMap<String, String>,
    annotation: &'static str,
    owner: &str,
) -> Result<Option<Annotated>, IpamError> {
    // Empty is unset, as Calico reads it (the Namespace's then counts).
    let Some(text) = notes.get(annotation).filter(|t| !t.trim().is_empty()) else {
        return Ok(None);
    };
    let source = format!("the annotation {annotation} of {owner}");
    let values: Vec<String> = serde_json::from_str(text).map_err(|e| {
        refuse(
            annotation,
            &source,
            format!("{text:?} is not a JSON list of strings such as [\"pool-a\"] ({e})"),
        )
    })?;
    Ok(Some(Annotated { values, source }))
}

/// Reads the annotations of pod `namespace/pod` (`pod_notes`) and of its namespace
/// (`namespace_notes`).
pub fn read(
    namespace: &str,
    pod: &str,
    pod_notes: &BTreeMap<String, String>,
    namespace_notes: &BTreeMap<String, String>,
) -> Result<PodAddressing, IpamError> {
    let on_pod = format!("pod {namespace}/{pod}");
    let on_namespace = format!("namespace {namespace}");
    if pod_notes.contains_key(IP_ADDRS_NO_IPAM) {
        return Err(refuse(
            IP_ADDRS_NO_IPAM,
            &on_pod,
            "addresses outside IPAM are not supported: margay assigns every address through \
             IPAM; use cni.projectcalico.org/ipAddrs with an address of a pool"
                .into(),
        ));
    }
    let pools = |annotation| -> Result<Option<Annotated>, IpamError> {
        match list(pod_notes, annotation, &on_pod)? {
            Some(found) => Ok(Some(found)),
            None => list(namespace_notes, annotation, &on_namespace),
        }
    };
    let ip_addrs = list(pod_notes, IP_ADDRS, &on_pod)?;
    if let Some(a) = &ip_addrs {
        for v in &a.values {
            if v.parse::<IpAddr>().is_err() {
                return Err(refuse(
                    IP_ADDRS,
                    &a.source,
                    format!("{v:?} is not an IP address"),
                ));
            }
        }
    }
    Ok(PodAddressing {
        ipv4_pools: pools(IPV4_POOLS)?,
        ipv6_pools: pools(IPV6_POOLS)?,
        ip_addrs,
    })
}

impl PodAddressing {
    /// Checks what the annotations ask for against the cluster's `pools`, so that a pool that
    /// does not exist, or an address outside every pool, is refused naming the annotation
    /// before anything is allocated.
    pub fn check(&self, pools: &[IpPool]) -> Result<(), IpamError> {
        for (annotation, asked) in [
            (IPV4_POOLS, &self.ipv4_pools),
            (IPV6_POOLS, &self.ipv6_pools),
        ] {
            let Some(asked) = asked else { continue };
            for v in &asked.values {
                if !pools
                    .iter()
                    .any(|p| p.name == *v || p.cidr.to_string() == *v)
                {
                    return Err(refuse(
                        annotation,
                        &asked.source,
                        format!("there is no pool named {v} (bgpctl get ippools lists them)"),
                    ));
                }
            }
        }
        if let Some(asked) = &self.ip_addrs {
            for v in &asked.values {
                let Ok(addr) = v.parse::<IpAddr>() else {
                    continue;
                };
                if !pools
                    .iter()
                    .any(|p| p.cidr.contains(&addr) && p.allows(AllowedUse::Workload))
                {
                    return Err(refuse(
                        IP_ADDRS,
                        &asked.source,
                        format!("{addr} is in no pool that gives workload addresses"),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notes(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_pods_annotation_wins_over_its_namespaces_per_family() {
        let got = read(
            "prod",
            "web-0",
            &notes(&[(IPV4_POOLS, r#"["pool-a"]"#), (IP_ADDRS, r#"["10.1.0.7"]"#)]),
            &notes(&[(IPV4_POOLS, r#"["pool-b"]"#), (IPV6_POOLS, r#"["pool-6"]"#)]),
        )
        .unwrap();
        assert_eq!(got.ipv4_pools.as_ref().unwrap().values, ["pool-a"]);
        assert!(got.ipv4_pools.unwrap().source.contains("pod prod/web-0"));
        let v6 = got.ipv6_pools.unwrap();
        assert_eq!(v6.values, ["pool-6"]);
        assert!(v6.source.contains("namespace prod"), "{}", v6.source);
        assert_eq!(got.ip_addrs.unwrap().values, ["10.1.0.7"]);
        assert_eq!(
            read("prod", "web-0", &notes(&[]), &notes(&[])).unwrap(),
            PodAddressing::default()
        );
        let empty_on_pod = read(
            "prod",
            "web-0",
            &notes(&[(IPV4_POOLS, "")]),
            &notes(&[(IPV4_POOLS, r#"["pool-b"]"#)]),
        )
        .unwrap();
        assert_eq!(
            empty_on_pod.ipv4_pools.unwrap().values,
            ["pool-b"],
            "empty is unset"
        );
    }

    #[test]
    fn refusals_name_the_annotation_and_where_it_is() {
        let e = read(
            "prod",
            "web-0",
            &notes(&[]),
            &notes(&[(IPV4_POOLS, "pool-a")]),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(IPV4_POOLS) && text.contains("namespace prod"),
            "{text}"
        );
        let e = read(
            "prod",
            "web-0",
            &notes(&[(IP_ADDRS, r#"["10.1.0.x"]"#)]),
            &notes(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains(IP_ADDRS), "{e}");
        let e = read(
            "prod",
            "web-0",
            &notes(&[(IP_ADDRS_NO_IPAM, r#"["10.1.0.7"]"#)]),
            &notes(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains(IP_ADDRS_NO_IPAM), "{e}");
    }

    #[test]
    fn pools_and_addresses_are_checked_against_the_cluster() {
        let mut tunnel_only = IpPool::new("t", "10.9.0.0/16".parse().unwrap());
        tunnel_only.allowed_uses = vec![AllowedUse::Tunnel];
        let pools = [
            IpPool::new("pool-a", "10.1.0.0/16".parse().unwrap()),
            tunnel_only,
        ];
        let asked =
            |pairs: &[(&str, &str)]| read("prod", "web-0", &notes(pairs), &notes(&[])).unwrap();
        asked(&[
            (IPV4_POOLS, r#"["pool-a", "10.1.0.0/16"]"#),
            (IP_ADDRS, r#"["10.1.0.7"]"#),
        ])
        .check(&pools)
        .unwrap();
        let e = asked(&[(IPV4_POOLS, r#"["pool-z"]"#)])
            .check(&pools)
            .unwrap_err();
        assert!(e.to_string().contains("no pool named pool-z"), "{e}");
        assert!(e.to_string().contains(IPV4_POOLS), "{e}");
        for outside in ["10.2.0.7", "10.9.0.7"] {
            let e = asked(&[(IP_ADDRS, &format!(r#"["{outside}"]"#))])
                .check(&pools)
                .unwrap_err();
            assert!(
                e.to_string().contains(IP_ADDRS) && e.to_string().contains(outside),
                "{e}"
            );
        }
    }
}
