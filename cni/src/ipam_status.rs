//! STATUS of both plugins' IPAM: bgpd answers, and each family the configuration asks for has
//! an enabled workload pool with free addresses. A readiness probe: bounded to a second or two,
//! not the ADD budget.

use std::time::Duration;

use ipnet::IpNet;
use proto::v1 as pb;

use crate::bgpd_client::Bgpd;
use crate::spec::NetConf;
use crate::spec::error::{CniError, code};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
