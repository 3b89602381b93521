//! `bgpctl pool add|set|del|ls`.

use clap::{Subcommand, ValueEnum};
use proto::v1 as pb;
use proto::v1::pools_client::PoolsClient;
use serde_json::json;
use tonic::transport::Channel;

use super::table::Table;
use super::{CtlError, Output};

#[derive(Clone, Copy, ValueEnum)]
pub enum Mode {
    /// Calico's spelling first; the lower-case one is accepted too.
    #[value(name = "Never", alias = "never")]
    Never,
    #[value(name = "Always", alias = "always")]
    Always,
    #[value(name = "CrossSubnet", alias = "cross-subnet")]
    CrossSubnet,
}

impl From<Mode> for pb::EncapMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Never => pb::EncapMode::Never,
            Mode::Always => pb::EncapMode::Always,
            Mode::CrossSubnet => pb::EncapMode::CrossSubnet,
        }
    }
}

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create an IP pool.
    Add {
        name: String,
        /// A network address with prefix length, e.g. 172.20.0.0/16.
        cidr: String,
        /// Prefix length of the pool's blocks [default: 26 for IPv4, 122 for IPv6].
        #[arg(long)]
        block_size: Option<u32>,
        #[arg(long, value_enum, ignore_case = true)]
        vxlan_mode: Option<Mode>,
        #[arg(long, value_enum, ignore_case = true)]
        ipip_mode: Option<Mode>,
        /// Masquerade traffic from the pool to destinations outside every pool.
        #[arg(long)]
        nat_outgoing: bool,
        /// Never export the pool's routes to external BGP peers.
        #[arg(long)]
        disable_bgp_export: bool,
        /// Which nodes may use the pool, e.g. "zone == 'a'" [default: all()].
        #[arg(long)]
        node_selector: Option<String>,
        /// Create it disabled: no new allocations.
        #[arg(long)]
        disabled: bool,
        #[arg(long)]
        json: bool,
    },
    /// Change a pool's modes and flags (what is not given stays); every node applies it live.
    Set {
        name: String,
        #[arg(long, value_enum)]
        vxlan_mode: Option<Mode>,
        #[arg(long, value_enum)]
        ipip_mode: Option<Mode>,
        #[arg(long, value_parser = ["on", "off"])]
        nat_outgoing: Option<String>,
        #[arg(long, value_parser = ["on", "off"])]
        disable_bgp_export: Option<String>,
        #[arg(long, value_parser = ["on", "off"])]
        disabled: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete an IP pool (refused while it has addresses in use).
    Del {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List the IP pools.
    Ls {
        #[arg(long)]
        json: bool,
    },
}

pub fn mode_name(m: i32) -> &'static str {
    match pb::EncapMode::try_from(m) {
        Ok(pb::EncapMode::Always) => "Always",
        Ok(pb::EncapMode::CrossSubnet) => "CrossSubnet",
        _ => "Never",
    }
}

pub fn pool_json(p: &pb::IpPool) -> serde_json::Value {
    json!({
        "name": p.name,
        "cidr": p.cidr,
        "block_size": p.block_size,
        "vxlan_mode": mode_name(p.vxlan_mode),
        "ipip_mode": mode_name(p.ipip_mode),
        "nat_outgoing": p.nat_outgoing,
        "disabled": p.disabled,
        "disable_bgp_export": p.disable_bgp_export,
        "node_selector": if p.node_selector.is_empty() { "all()" } else { p.node_selector.as_str() },
        "manual": p.assignment_mode == i32::from(pb::AssignmentMode::Manual),
        "revision": p.revision,
    })
}

#[expect(
    clippy::too_many_lines,
    reason = "one match arm per `bgpctl pool` subcommand (add, set, del, ls)"
)]
pub async fn run(channel: Channel, command: PoolCommand, out: &mut Output) -> Result<(), CtlError> {
    let mut client = PoolsClient::new(channel);
    match command {
        PoolCommand::Add {
            name,
            cidr,
            block_size,
            vxlan_mode,
            ipip_mode,
            nat_outgoing,
            disable_bgp_export,
            node_selector,
            disabled,
            json,
        } => {
            let pool = pb::IpPool {
                name,
                cidr,
                block_size: block_size.unwrap_or(0),
                vxlan_mode: pb::EncapMode::from(vxlan_mode.unwrap_or(Mode::Never)).into(),
                ipip_mode: pb::EncapMode::from(ipip_mode.unwrap_or(Mode::Never)).into(),
                nat_outgoing,
                disabled,
                disable_bgp_export,
                node_selector: node_selector.unwrap_or_default(),
                ..Default::default()
            };
            let created = client
                .create_pool(pb::CreatePoolRequest { pool: Some(pool) })
                .await?
                .into_inner();
            if json {
                out.json(&pool_json(&created))
            } else {
                out.line(&format!(
                    "pool {} created: {} in /{} blocks",
                    created.name, created.cidr, created.block_size
                ))
            }
        }
        PoolCommand::Set {
            name,
            vxlan_mode,
            ipip_mode,
            nat_outgoing,
            disable_bgp_export,
            disabled,
            json,
        } => {
            let mut pool = client
                .get_pool(pb::GetPoolRequest { name: name.clone() })
                .await?
                .into_inner();
            let on = |v: &Option<String>| v.as_deref().map(|s| s == "on");
            if let Some(m) = vxlan_mode {
                pool.vxlan_mode = pb::EncapMode::from(m).into();
            }
            if let Some(m) = ipip_mode {
                pool.ipip_mode = pb::EncapMode::from(m).into();
            }
            if let Some(v) = on(&nat_outgoing) {
                pool.nat_outgoing = v;
            }
            if let Some(v) = on(&disable_bgp_export) {
                pool.disable_bgp_export = v;
            }
            if let Some(v) = on(&disabled) {
                pool.disabled = v;
            }
            let updated = client
                .update_pool(pb::UpdatePoolRequest { pool: Some(pool) })
                .await?
                .into_inner();
            if json {
                out.json(&pool_json(&updated))
            } else {
                out.line(&format!(
                    "pool {} updated: vxlan {}, ipip {}",
                    updated.name,
                    mode_name(updated.vxlan_mode),
                    mode_name(updated.ipip_mode)
                ))
            }
        }
        PoolCommand::Del { name, json } => {
            client
                .delete_pool(pb::DeletePoolRequest { name: name.clone() })
                .await?;
            if json {
                out.json(&json!({ "deleted": name }))
            } else {
                out.line(&format!("pool {name} deleted"))
            }
        }
        PoolCommand::Ls { json } => {
            let pools = client
                .list_pools(pb::ListPoolsRequest {})
                .await?
                .into_inner()
                .pools;
            if json {
                return out.json(&serde_json::Value::Array(
                    pools.iter().map(pool_json).collect(),
                ));
            }
            let mut t = Table::new(&[
                "name",
                "cidr",
                "block",
                "vxlan",
                "ipip",
                "nat",
                "disabled",
                "bgp-export",
                "selector",
            ]);
            for p in &pools {
                t.row(vec![
                    p.name.clone(),
                    p.cidr.clone(),
                    format!("/{}", p.block_size),
                    mode_name(p.vxlan_mode).into(),
                    mode_name(p.ipip_mode).into(),
                    p.nat_outgoing.to_string(),
                    p.disabled.to_string(),
                    (!p.disable_bgp_export).to_string(),
                    if p.node_selector.is_empty() {
                        "all()".into()
                    } else {
                        p.node_selector.clone()
                    },
                ]);
            }
            out.text(&t.render())
        }
    }
}
