//! `bgpctl show protocols|route`, `bgpctl peer add|del`, `bgpctl route add|del`: the BGP
//! speaker through the `Bgp` service, with birdc-like tables and `--json`.

use clap::Subcommand;
use proto::v1 as pb;
use proto::v1::bgp_client::BgpClient;
use serde_json::json;
use tonic::transport::Channel;

use super::table::Table;
use super::{CtlError, Output};

#[derive(Subcommand)]
pub enum ShowCommand {
    /// BGP sessions: name, state, since, info (like `birdc show protocols`).
    Protocols {
        #[arg(long)]
        json: bool,
    },
    /// Routes of a table, optionally only those inside PREFIX.
    Route {
        prefix: Option<String>,
        /// `loc` (default), `adj-in PEER` or `adj-out PEER` (PEER: address or name).
        #[arg(long, num_args = 1..=2, value_names = ["TABLE", "PEER"])]
        table: Vec<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum PeerCommand {
    /// Add a BGP peer; its session starts at once.
    Add {
        address: String,
        #[arg(long = "as")]
        asn: u32,
        /// Wait for the peer to connect.
        #[arg(long)]
        passive: bool,
        /// The peer's BGP port [default: 179].
        #[arg(long)]
        port: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Delete a peer (by address or name); its routes are withdrawn.
    Del {
        peer: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum RouteCommand {
    /// Announce PREFIX from this node.
    Add {
        prefix: String,
        /// Next hop to advertise [default: our address on each session].
        #[arg(long)]
        next_hop: Option<String>,
        /// Standard communities, "65000:100" (repeatable).
        #[arg(long)]
        community: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Stop announcing PREFIX.
    Del {
        prefix: String,
        #[arg(long)]
        json: bool,
    },
}

pub fn state_name(s: i32) -> &'static str {
    match pb::SessionState::try_from(s) {
        Ok(pb::SessionState::Idle) => "Idle",
        Ok(pb::SessionState::Connect) => "Connect",
        Ok(pb::SessionState::Active) => "Active",
        Ok(pb::SessionState::OpenSent) => "OpenSent",
        Ok(pb::SessionState::OpenConfirm) => "OpenConfirm",
        Ok(pb::SessionState::Established) => "Established",
        _ => "Unknown",
    }
}

fn since(ms: u64) -> String {
    let secs = ms / 1000;
    let (d, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Days since the epoch as a civil date (Howard Hinnant's algorithm).
    let z = i64::try_from(d).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}")
}

pub fn peer_json(p: &pb::PeerStatus) -> serde_json::Value {
    let peer = p.peer.clone().unwrap_or_default();
    json!({
        "name": peer.name,
        "address": peer.peer_address,
        "as": peer.as_number,
        "passive": peer.passive,
        "state": state_name(p.state),
        "since_unix_ms": p.since_unix_ms,
        "info": p.info,
        "last_error": p.last_error,
        "prefixes_received": p.prefixes_received,
        "prefixes_accepted": p.prefixes_accepted,
        "prefixes_advertised": p.prefixes_advertised,
    })
}

pub fn route_json(r: &pb::Route) -> serde_json::Value {
    let origin = match pb::Origin::try_from(r.origin) {
        Ok(pb::Origin::Egp) => "egp",
        Ok(pb::Origin::Incomplete) => "incomplete",
        _ => "igp",
    };
    json!({
        "prefix": r.prefix,
        "next_hop": r.next_hop,
        "as_path": r.as_path,
        "origin": origin,
        "med": r.med,
        "local_pref": r.local_pref,
        "communities": r.communities,
        "from_peer": r.from_peer,
        "best": r.best,
    })
}

pub async fn show(
    channel: Channel,
    command: ShowCommand,
    out: &mut Output,
) -> Result<(), CtlError> {
    let mut client = BgpClient::new(channel);
    match command {
        ShowCommand::Protocols { json } => {
            let peers = client
                .list_peers(pb::ListPeersRequest {})
                .await?
                .into_inner()
                .peers;
            if json {
                return out.json(&serde_json::Value::Array(
                    peers.iter().map(peer_json).collect(),
                ));
            }
            let mut t = Table::new(&["name", "proto", "state", "since", "info"]);
            for p in &peers {
                let peer = p.peer.clone().unwrap_or_default();
                let info = if p.state == i32::from(pb::SessionState::Established) {
                    format!(
                        "{} ({} imported, {} exported)",
                        p.info, p.prefixes_accepted, p.prefixes_advertised
                    )
                } else {
                    p.info.clone()
                };
                t.row(vec![
                    peer.name,
                    "BGP".into(),
                    state_name(p.state).into(),
                    since(p.since_unix_ms),
                    info,
                ]);
            }
            out.text(&t.render())
        }
        ShowCommand::Route {
            prefix,
            table,
            json,
        } => {
            let peer = table.get(1).cloned();
            let table = match table.first().map(String::as_str) {
                None | Some("loc") => pb::RouteTable::LocRib,
                Some("adj-in") => pb::RouteTable::AdjRibIn,
                Some("adj-out") => pb::RouteTable::AdjRibOut,
                Some(other) => {
                    return Err(CtlError::Status {
                        code: tonic::Code::InvalidArgument,
                        message: format!(
                            "--table {other}: expected loc, adj-in PEER or adj-out PEER"
                        ),
                    });
                }
            };
            let mut stream = client
                .list_routes(pb::ListRoutesRequest {
                    table: table.into(),
                    peer: peer.unwrap_or_default(),
                    prefix: prefix.unwrap_or_default(),
                    limit: 0,
                })
                .await?
                .into_inner();
            let mut routes = Vec::new();
            while let Some(batch) = stream.message().await? {
                routes.extend(batch.routes);
            }
            if json {
                return out.json(&serde_json::Value::Array(
                    routes.iter().map(route_json).collect(),
                ));
            }
            let mut t = Table::new(&[
                "prefix",
                "next hop",
                "as path",
                "origin",
                "local pref",
                "med",
                "from",
            ]);
            for r in &routes {
                let path: Vec<String> = r.as_path.iter().map(u32::to_string).collect();
                t.row(vec![
                    r.prefix.clone(),
                    r.next_hop.clone(),
                    path.join(" "),
                    route_json(r)["origin"].as_str().unwrap_or("").to_owned(),
                    r.local_pref.map(|l| l.to_string()).unwrap_or_default(),
                    r.med.map(|m| m.to_string()).unwrap_or_default(),
                    if r.from_peer.is_empty() {
                        "local".into()
                    } else {
                        r.from_peer.clone()
                    },
                ]);
            }
            out.text(&t.render())
        }
    }
}

pub async fn peer(
    channel: Channel,
    command: PeerCommand,
    out: &mut Output,
) -> Result<(), CtlError> {
    let mut client = BgpClient::new(channel);
    match command {
        PeerCommand::Add {
            address,
            asn,
            passive,
            port,
            json,
        } => {
            let p = client
                .add_peer(pb::AddPeerRequest {
                    peer: Some(pb::BgpPeer {
                        peer_address: address,
                        as_number: asn,
                        passive,
                        port: port.unwrap_or(0),
                        ..pb::BgpPeer::default()
                    }),
                })
                .await?
                .into_inner();
            if json {
                out.json(&json!({"name": p.name, "address": p.peer_address, "as": p.as_number}))
            } else {
                out.line(&format!(
                    "peer {} ({}, AS {}) added",
                    p.name, p.peer_address, p.as_number
                ))
            }
        }
        PeerCommand::Del { peer, json } => {
            client
                .delete_peer(pb::DeletePeerRequest { peer: peer.clone() })
                .await?;
            if json {
                out.json(&json!({"deleted": peer}))
            } else {
                out.line(&format!("peer {peer} deleted"))
            }
        }
    }
}

pub async fn route(
    channel: Channel,
    command: RouteCommand,
    out: &mut Output,
) -> Result<(), CtlError> {
    let mut client = BgpClient::new(channel);
    match command {
        RouteCommand::Add {
            prefix,
            next_hop,
            community,
            json,
        } => {
            client
                .announce_route(pb::AnnounceRouteRequest {
                    prefix: prefix.clone(),
                    next_hop: next_hop.unwrap_or_default(),
                    communities: community,
                    large_communities: Vec::new(),
                })
                .await?;
            if json {
                out.json(&json!({"announced": prefix}))
            } else {
                out.line(&format!("{prefix} announced"))
            }
        }
        RouteCommand::Del { prefix, json } => {
            client
                .withdraw_route(pb::WithdrawRouteRequest {
                    prefix: prefix.clone(),
                })
                .await?;
            if json {
                out.json(&json!({"withdrawn": prefix}))
            } else {
                out.line(&format!("{prefix} withdrawn"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_civil_utc_time() {
        assert_eq!(since(0), "1970-01-01 00:00:00");
        assert_eq!(since(1_700_000_000_000), "2023-11-14 22:13:20");
    }
}
