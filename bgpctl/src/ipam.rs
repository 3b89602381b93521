//! `bgpctl ipam show|assign|release|check|gc`.

use clap::Subcommand;
use proto::v1 as pb;
use proto::v1::ipam_client::IpamClient;
use serde_json::json;
use tonic::transport::Channel;

use super::table::Table;
use super::{CtlError, Output};

#[derive(Subcommand)]
pub enum IpamCommand {
    /// Utilisation per pool, and per block with --show-blocks.
    Show {
        #[arg(long)]
        show_blocks: bool,
        /// Only this pool (name or CIDR).
        #[arg(long)]
        pool: Option<String>,
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
        /// Take it from this pool (name or CIDR).
        #[arg(long)]
        pool: Option<String>,
        /// This very address.
        #[arg(long)]
        ip: Option<String>,
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
    })
}

fn state_name(s: i32) -> &'static str {
    match pb::BlockState::try_from(s) {
        Ok(pb::BlockState::Pending) => "pending",
        Ok(pb::BlockState::Confirmed) => "confirmed",
        Ok(pb::BlockState::PendingDeletion) => "pending-deletion",
        _ => "-",
    }
}

pub async fn run(channel: Channel, command: IpamCommand, out: &mut Output) -> Result<(), CtlError> {
    let mut client = IpamClient::new(channel);
    match command {
        IpamCommand::Show {
            show_blocks,
            pool,
            json,
        } => {
            let r = client
                .show_blocks(pb::ShowBlocksRequest {
                    pool: pool.unwrap_or_default(),
                    show_blocks,
                })
                .await?
                .into_inner();
            if json {
                return out.json(&json!({
                    "pools": r.pools.iter().map(|p| json!({
                        "name": p.name, "cidr": p.cidr, "size": p.size, "used": p.used, "free": p.free, "blocks": p.blocks,
                    })).collect::<Vec<_>>(),
                    "blocks": r.blocks.iter().map(|b| json!({
                        "cidr": b.cidr, "pool": b.pool, "affinity": b.affinity, "state": state_name(b.state),
                        "used": b.used, "free": b.free, "borrowed": b.borrowed,
                    })).collect::<Vec<_>>(),
                }));
            }
            let mut t = Table::new(&["pool", "cidr", "ips total", "in use", "free", "blocks"]);
            for p in &r.pools {
                t.row(vec![
                    p.name.clone(),
                    p.cidr.clone(),
                    p.size.to_string(),
                    p.used.to_string(),
                    p.free.to_string(),
                    p.blocks.to_string(),
                ]);
            }
            out.text(&t.render())?;
            if show_blocks {
                let mut t = Table::new(&[
                    "block", "pool", "affinity", "state", "used", "free", "borrowed",
                ]);
                for b in &r.blocks {
                    t.row(vec![
                        b.cidr.clone(),
                        b.pool.clone(),
                        if b.affinity.is_empty() {
                            "-".into()
                        } else {
                            b.affinity.clone()
                        },
                        state_name(b.state).into(),
                        b.used.to_string(),
                        b.free.to_string(),
                        b.borrowed.to_string(),
                    ]);
                }
                out.line("")?;
                out.text(&t.render())?;
            }
            Ok(())
        }
        IpamCommand::Assign {
            handle,
            node,
            pool,
            ip,
            json,
        } => {
            let allocations = match ip {
                Some(address) => vec![
                    client
                        .assign_ip(pb::AssignIpRequest {
                            address,
                            handle,
                            node: node.unwrap_or_default(),
                            ..Default::default()
                        })
                        .await?
                        .into_inner(),
                ],
                None => {
                    // The family follows the pool named; without one, IPv4.
                    let v6 = pool.as_deref().is_some_and(|p| p.contains(':'));
                    let pools: Vec<String> = pool.into_iter().collect();
                    let r = client
                        .auto_assign(pb::AutoAssignRequest {
                            handle,
                            node: node.unwrap_or_default(),
                            num_ipv4: u32::from(!v6),
                            num_ipv6: u32::from(v6),
                            ipv4_pools: if v6 { vec![] } else { pools.clone() },
                            ipv6_pools: if v6 { pools } else { vec![] },
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
