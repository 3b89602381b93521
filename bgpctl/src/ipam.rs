//! `bgpctl ipam show|assign|release|check|gc`, for IPv4 and IPv6 alike.

pub mod show;

use clap::{Subcommand, ValueEnum};
use proto::v1 as pb;
use proto::v1::ipam_client::IpamClient;
use proto::v1::pools_client::PoolsClient;
use serde_json::json;
use tonic::transport::Channel;

use super::{CtlError, Output};
use show::Cidr;

/// Which addresses `ipam assign` asks for: one of a family, or one of each (the CLI's
/// `--family`; not an address's family, which is `net_types::IpFamily`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AssignFamilies {
    Ipv4,
    Ipv6,
    /// One of each, all or nothing.
    Dual,
}

#[derive(Subcommand)]
pub enum IpamCommand {
    /// Utilisation per pool, and per block with --show-blocks.
    Show {
        #[arg(long)]
        show_blocks: bool,
        /// Only this pool (name or CIDR).
        #[arg(long, conflicts_with = "ip")]
        pool: Option<String>,
        /// The allocation holding this address: its handle and the workload it belongs to.
        #[arg(long, conflicts_with = "show_blocks")]
        ip: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Allocate an address under a handle (to reserve one, or for scripts).
    Assign {
        #[arg(long)]
        handle: String,
        /// The node to allocate for [default: bgpd's own].
        #[arg(long)]
        node: Option<String>,
        /// Take it from this pool (name or CIDR); with --ip, the address must lie in it.
        #[arg(long)]
        pool: Option<String>,
        /// This very address.
        #[arg(long)]
        ip: Option<String>,
        /// The addresses to ask for [default: the family of --pool, else ipv4].
        #[arg(long, value_enum, conflicts_with = "ip")]
        family: Option<AssignFamilies>,
        #[arg(long)]
        json: bool,
    },
    /// Release the addresses of a handle, or one address.
    Release {
        #[arg(long, conflicts_with = "ip", required_unless_present = "ip")]
        handle: Option<String>,
        #[arg(long)]
        ip: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Check that every allocation has its handle and the other way round (exit 1 if not).
    Check {
        #[arg(long)]
        json: bool,
    },
    /// Release a node's handles that are not live.
    Gc {
        #[arg(long)]
        node: String,
        /// Live handles, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "")]
        live: Vec<String>,
        /// Only handles starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Only show what would be released.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
}

fn allocation_json(a: &pb::Allocation) -> serde_json::Value {
    json!({
        "address": a.address,
        "block": a.block,
        "pool": a.pool,
        "borrowed": a.borrowed,
        "handle": a.handle,
        "sequence": a.sequence,
        "attributes": a.attributes.iter().collect::<std::collections::BTreeMap<_, _>>(),
    })
}

/// One allocation as `ipam show --ip` prints it: the address, its handle and block, then the
/// attributes the runtime's CNI call stored (namespace, pod, container), sorted.
fn allocation_text(a: &pb::Allocation) -> String {
    let borrowed = if a.borrowed { " (borrowed)" } else { "" };
    let mut text = format!(
        "{}\n  handle                 {}\n  block                  {}{borrowed}\n  pool                   {}\n",
        a.address, a.handle, a.block, a.pool
    );
    let attrs: std::collections::BTreeMap<_, _> = a.attributes.iter().collect();
    for (k, v) in attrs {
        text.push_str(&format!("  {k:<22} {v}\n"));
    }
    text
}

/// The CIDR of a pool named by name or CIDR.
async fn pool_cidr(mut pools: PoolsClient<Channel>, pool: &str) -> Result<Cidr, CtlError> {
    if let Some(cidr) = Cidr::parse(pool) {
        return Ok(cidr);
    }
    let p = pools
        .get_pool(pb::GetPoolRequest { name: pool.into() })
        .await?
        .into_inner();
    Cidr::parse(&p.cidr)
        .ok_or_else(|| CtlError::Invalid(format!("pool {pool} has no valid CIDR: {:?}", p.cidr)))
}

/// `--ip` must lie in `--pool`: the address decides the pool bgpd takes it from, so a
/// mismatch is refused here rather than allocated elsewhere.
fn check_in_pool(address: &str, pool: &str, cidr: Cidr) -> Result<(), CtlError> {
    let addr: std::net::IpAddr = address.parse().map_err(|_| {
        CtlError::Invalid(format!("invalid --ip: {address:?} is not an IP address"))
    })?;
    if cidr.contains(addr) {
        return Ok(());
    }
    let family = if addr.is_ipv4() { "IPv4" } else { "IPv6" };
    let why = if family == cidr.family() {
        "lies outside it".to_owned()
    } else {
        format!("is an {family} address, the pool is {}", cidr.family())
    };
    Err(CtlError::Invalid(format!(
        "invalid --ip: {address} is not in pool {pool} ({cidr}): it {why}"
    )))
}

#[expect(
    clippy::too_many_lines,
    reason = "one match arm per `bgpctl ipam` subcommand (show, assign, release, check, gc), each a request and its output"
)]
pub async fn run(channel: Channel, command: IpamCommand, out: &mut Output) -> Result<(), CtlError> {
    let mut client = IpamClient::new(channel.clone());
    match command {
        IpamCommand::Show {
            ip: Some(address),
            json,
            ..
        } => {
            let a = client
                .get_address(pb::GetAddressRequest { address })
                .await?
                .into_inner();
            if json {
                out.json(&allocation_json(&a))
            } else {
                out.text(&allocation_text(&a))
            }
        }
        IpamCommand::Show {
            show_blocks,
            pool,
            json,
            ip: None,
        } => {
            let r = client
                .show_blocks(pb::ShowBlocksRequest {
                    pool: pool.unwrap_or_default(),
                    show_blocks,
                })
                .await?
                .into_inner();
            if json {
                out.json(&show::to_json(&r))
            } else {
                out.text(&show::table(&r, show_blocks))
            }
        }
        IpamCommand::Assign {
            handle,
            node,
            pool,
            ip,
            family,
            json,
        } => {
            let node = node.unwrap_or_default();
            // The pool's CIDR: what its family is, and whether it holds --ip.
            let pool_cidr = match &pool {
                Some(p) => Some(pool_cidr(PoolsClient::new(channel.clone()), p).await?),
                None => None,
            };
            let allocations = match ip {
                Some(address) => {
                    if let (Some(p), Some(cidr)) = (&pool, pool_cidr) {
                        check_in_pool(&address, p, cidr)?;
                    }
                    vec![
                        client
                            .assign_ip(pb::AssignIpRequest {
                                address,
                                handle,
                                node,
                                ..Default::default()
                            })
                            .await?
                            .into_inner(),
                    ]
                }
                None => {
                    let family = family.unwrap_or(match pool_cidr {
                        Some(c) if c.is_ipv6() => AssignFamilies::Ipv6,
                        _ => AssignFamilies::Ipv4,
                    });
                    // The pool goes to its own family's list (for a dual request) or to the
                    // one asked for (where bgpd refuses a pool of the other family).
                    let v6_pool = match family {
                        AssignFamilies::Ipv4 => false,
                        AssignFamilies::Ipv6 => true,
                        AssignFamilies::Dual => pool_cidr.is_some_and(|c| c.is_ipv6()),
                    };
                    let pools: Vec<String> = pool.into_iter().collect();
                    let (ipv4_pools, ipv6_pools) = if v6_pool {
                        (vec![], pools)
                    } else {
                        (pools, vec![])
                    };
                    let r = client
                        .auto_assign(pb::AutoAssignRequest {
                            handle,
                            node,
                            num_ipv4: u32::from(family != AssignFamilies::Ipv6),
                            num_ipv6: u32::from(family != AssignFamilies::Ipv4),
                            ipv4_pools,
                            ipv6_pools,
                            ..Default::default()
                        })
                        .await?
                        .into_inner();
                    r.ipv4.into_iter().chain(r.ipv6).collect()
                }
            };
            if json {
                return out.json(&serde_json::Value::Array(
                    allocations.iter().map(allocation_json).collect(),
                ));
            }
            for a in &allocations {
                let borrowed = if a.borrowed { ", borrowed" } else { "" };
                out.line(&format!(
                    "assigned {} to {} (block {}, pool {}{borrowed})",
                    a.address, a.handle, a.block, a.pool
                ))?;
            }
            Ok(())
        }
        IpamCommand::Release { handle, ip, json } => {
            let released = match (handle, ip) {
                (Some(handle), _) => {
                    client
                        .release_by_handle(pb::ReleaseByHandleRequest { handle })
                        .await?
                }
                (None, Some(address)) => {
                    client
                        .release_ips(pb::ReleaseIpsRequest {
                            ips: vec![pb::ReleaseIp {
                                address,
                                ..Default::default()
                            }],
                        })
                        .await?
                }
                (None, None) => unreachable!("clap requires --handle or --ip"),
            }
            .into_inner()
            .released;
            if json {
                return out.json(&json!({ "released": released }));
            }
            if released.is_empty() {
                out.line("nothing to release")
            } else {
                out.line(&format!("released {}", released.join(", ")))
            }
        }
        IpamCommand::Check { json } => {
            let r = client.check(pb::CheckRequest {}).await?.into_inner();
            if json {
                out.json(&json!({
                    "allocations_checked": r.allocations_checked,
                    "handles_checked": r.handles_checked,
                    "problems": r.problems,
                }))?;
            } else {
                out.line(&format!(
                    "checked {} allocations and {} handles",
                    r.allocations_checked, r.handles_checked
                ))?;
                for p in &r.problems {
                    out.line(&format!("problem: {p}"))?;
                }
                if r.problems.is_empty() {
                    out.line("consistent")?;
                }
            }
            if r.problems.is_empty() {
                Ok(())
            } else {
                Err(CtlError::Inconsistent(r.problems.len()))
            }
        }
        IpamCommand::Gc {
            node,
            live,
            prefix,
            dry_run,
            json,
        } => {
            let r = client
                .garbage_collect(pb::GarbageCollectRequest {
                    node,
                    live_handles: live.into_iter().filter(|h| !h.is_empty()).collect(),
                    handle_prefix: prefix,
                    dry_run,
                })
                .await?
                .into_inner();
            if json {
                return out.json(&json!({
                    "dry_run": dry_run,
                    "released": r.released.iter().map(|h| json!({ "handle": h.handle, "addresses": h.addresses })).collect::<Vec<_>>(),
                }));
            }
            let verb = if dry_run { "would release" } else { "released" };
            if r.released.is_empty() {
                out.line("nothing to release")?;
            }
            for h in &r.released {
                out.line(&format!("{verb} {}: {}", h.handle, h.addresses.join(", ")))?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_outside_the_named_pool_is_refused_with_why() {
        let v4 = Cidr::parse("10.50.0.0/16").unwrap();
        check_in_pool("10.50.3.4", "blue", v4).unwrap();
        let e = check_in_pool("fd00::5", "blue", v4)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid --ip: fd00::5 is not in pool blue (10.50.0.0/16): it is an IPv6 address, the pool is IPv4"
        );
        let e = check_in_pool("10.51.0.1", "blue", v4)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("it lies outside it"), "{e}");
        let v6 = Cidr::parse("fd00:50::/64").unwrap();
        let e = check_in_pool("10.50.0.1", "green", v6)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is an IPv4 address, the pool is IPv6"), "{e}");
        let e = check_in_pool("nope", "green", v6).unwrap_err().to_string();
        assert!(e.contains("not an IP address"), "{e}");
    }
}
