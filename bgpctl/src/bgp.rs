//! `bgpctl show protocols|route|filters`, `bgpctl peer add|del`, `bgpctl route add|del`,
//! `bgpctl config show|set`: the BGP speaker and the cluster's BGP resources through the
//! `Bgp` service, with birdc-like tables and `--json`.
//!
//! Why this file is long: every BGP command of bgpctl (show protocols, route, filters; peer; route;
//! config) and its table rendering share the same client and formatting helpers.

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
    /// BFD sessions (like `birdc show bfd sessions`): peer, state, intervals.
    Bfd {
        #[arg(long)]
        json: bool,
    },
    /// Routes of a table, optionally only those inside PREFIX.
    Route {
        prefix: Option<String>,
        /// `loc` (default), `adj-in PEER`, `adj-out PEER` (PEER: address or name), or
        /// `kernel` (the desired kernel state).
        #[arg(long, num_args = 1..=2, value_names = ["TABLE", "PEER"])]
        table: Vec<String>,
        /// Only how many routes match, like birdc's `show route count`.
        #[arg(long)]
        count: bool,
        #[arg(long)]
        json: bool,
    },
    /// The filters generated from the pools, one rule per line with its reason (first
    /// match wins within a scope); with PEER, its BGPFilter rules first and, for each prefix
    /// it sends us and we send it (or only PREFIX), the rule that decides it.
    Filters {
        /// A peer's name or address.
        peer: Option<String>,
        /// Only this prefix's decisions (it need not be in any table).
        prefix: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Network policy of a pod: which policies select it, in evaluation order, and what
    /// they allow and deny, for ingress and egress.
    Policy {
        /// The pod's name, or its workload endpoint's.
        pod: String,
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// The cluster's BGP configuration.
    Show {
        #[arg(long)]
        json: bool,
    },
    /// Change the cluster's BGP configuration (fields not given keep their value); every
    /// bgpd applies it live.
    Set {
        #[arg(long = "as")]
        asn: Option<u32>,
        /// Node-to-node mesh: on or off.
        #[arg(long, value_parser = ["on", "off"])]
        mesh: Option<String>,
        #[arg(long)]
        listen_port: Option<u32>,
        #[arg(long)]
        hold_time: Option<u32>,
        #[arg(long)]
        keepalive: Option<u32>,
        /// One aggregate per pool to external peers: on or off.
        #[arg(long, value_parser = ["on", "off"])]
        aggregate: Option<String>,
        /// Routes outside the pools from external peers into the kernel: on or off.
        #[arg(long, value_parser = ["on", "off"])]
        program_external_routes: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// `bgpctl peer add`'s arguments (boxed in [`PeerCommand`]: they are most of its size).
#[derive(clap::Args)]
pub struct PeerAddArgs {
    address: String,
    #[arg(long = "as")]
    asn: u32,
    /// Wait for the peer to connect.
    #[arg(long)]
    passive: bool,
    /// The peer's BGP port [default: 179].
    #[arg(long)]
    port: Option<u32>,
    /// Store it as a BGPPeer resource of this name (kept in the datastore; every node
    /// it concerns peers) instead of a session on this node only.
    #[arg(long)]
    resource: Option<String>,
    /// With --resource: only this node peers [default: every node].
    #[arg(long, requires = "resource")]
    node: Option<String>,
    /// TCP MD5 password (RFC 2385).
    #[arg(long)]
    password: Option<String>,
    /// GTSM (RFC 5082): the peer is at most this many hops away.
    #[arg(long)]
    ttl_security: Option<u32>,
    /// eBGP multihop TTL.
    #[arg(long)]
    multihop: Option<u32>,
    /// Most prefixes the peer may send; above it the session stops.
    #[arg(long)]
    max_prefixes: Option<u32>,
    /// Seconds before a session stopped by --max-prefixes restarts [default: stays down].
    #[arg(long, requires = "max_prefixes")]
    max_prefixes_restart: Option<u32>,
    /// Address families, e.g. ipv6,ipv4 [default: the session's own].
    #[arg(long, value_delimiter = ',')]
    families: Vec<String>,
    /// BFD with the peer: MIN_RX_MS,MIN_TX_MS,MULTIPLIER, e.g. 100,100,3 (bgpd checks
    /// intervals of at least 10 ms and a multiplier of 1-255).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "MIN_RX_MS,MIN_TX_MS,MULTIPLIER"
    )]
    bfd: Vec<u32>,
    /// With --resource: BGPFilter resources applied to the session, in order.
    #[arg(long, requires = "resource", value_delimiter = ',')]
    filters: Vec<String>,
    /// The next hop we send: auto (ours to eBGP, the route's to iBGP), self, keep.
    #[arg(long, value_parser = ["auto", "self", "keep"])]
    next_hop: Option<String>,
    /// The AS we speak on this session instead of ours (BIRD's `local as`).
    #[arg(long)]
    local_as: Option<u32>,
    /// How often our AS may appear in a route's AS_PATH (BIRD's `allow local as`).
    #[arg(long)]
    allow_local_as: Option<u32>,
    /// The graceful-restart time announced to the peer, seconds (Calico's maxRestartTime).
    #[arg(long)]
    max_restart_time: Option<u32>,
    /// With --resource: the gateway through which the peer is reached (reachableBy).
    #[arg(long, requires = "resource")]
    reachable_by: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum PeerCommand {
    /// Add a BGP peer; its session starts at once.
    Add(Box<PeerAddArgs>),
    /// Route refresh without a reset: ask the peer to send its routes again, or with
    /// `--out` send it ours again.
    Refresh {
        peer: String,
        #[arg(long)]
        out: bool,
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
        "families": peer.families,
        "passive": peer.passive,
        "next_hop": match pb::NextHopMode::try_from(peer.next_hop_mode) {
            Ok(pb::NextHopMode::Self_) => "self",
            Ok(pb::NextHopMode::Keep) => "keep",
            _ => "auto",
        },
        "local_as": (peer.local_as_number != 0).then_some(peer.local_as_number),
        "allow_local_as": peer.num_allowed_local_as_numbers,
        "restart_time_s": peer.graceful_restart_time_s,
        "state": state_name(p.state),
        "since_unix_ms": p.since_unix_ms,
        "info": p.info,
        "last_error": p.last_error,
        "prefixes_received": p.prefixes_received,
        "prefixes_accepted": p.prefixes_accepted,
        "prefixes_advertised": p.prefixes_advertised,
        "malformed": {
            "treat_as_withdraw": p.malformed_treat_as_withdraw,
            "attribute_discard": p.malformed_attribute_discard,
            "session_reset": p.malformed_session_reset,
        },
        "bfd": if p.bfd_state.is_empty() { serde_json::Value::Null } else { json!({
            "state": p.bfd_state,
            "min_rx_ms": peer.bfd_min_rx_ms,
            "min_tx_ms": peer.bfd_min_tx_ms,
            "multiplier": peer.bfd_multiplier,
        }) },
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
        "next_hop_link_local": r.next_hop_link_local,
        "as_path": r.as_path,
        "origin": origin,
        "med": r.med,
        "local_pref": r.local_pref,
        "communities": r.communities,
        "from_peer": r.from_peer,
        "best": r.best,
        "stale": r.stale,
    })
}

#[expect(
    clippy::too_many_lines,
    reason = "one match arm per `bgpctl show` subcommand (protocols, bfd, route, filters), each a request and its table or JSON"
)]
pub async fn show(
    channel: Channel,
    command: ShowCommand,
    out: &mut Output,
) -> Result<(), CtlError> {
    if let ShowCommand::Policy {
        pod,
        namespace,
        json,
    } = &command
    {
        return crate::resources::policy::show(channel, namespace, pod, *json, out).await;
    }
    let mut client = BgpClient::new(channel);
    match command {
        ShowCommand::Policy { .. } => unreachable!("answered above"),
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
                let mut info = info;
                let bad = [
                    (p.malformed_treat_as_withdraw, "treated as withdraw"),
                    (p.malformed_attribute_discard, "attributes discarded"),
                    (p.malformed_session_reset, "resets"),
                ];
                if bad.iter().any(|(n, _)| *n > 0) {
                    let parts: Vec<String> = bad
                        .iter()
                        .filter(|(n, _)| *n > 0)
                        .map(|(n, what)| format!("{n} {what}"))
                        .collect();
                    info.push_str(&format!(" [malformed: {}]", parts.join(", ")));
                }
                if !p.bfd_state.is_empty() {
                    info.push_str(&format!(" [BFD {}]", p.bfd_state));
                }
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
        ShowCommand::Bfd { json } => {
            let peers: Vec<pb::PeerStatus> = client
                .list_peers(pb::ListPeersRequest {})
                .await?
                .into_inner()
                .peers
                .into_iter()
                .filter(|p| !p.bfd_state.is_empty())
                .collect();
            if json {
                return out.json(&serde_json::Value::Array(
                    peers
                        .iter()
                        .map(|p| {
                            let peer = p.peer.clone().unwrap_or_default();
                            json!({"name": peer.name, "address": peer.peer_address,
                                   "state": p.bfd_state, "min_rx_ms": peer.bfd_min_rx_ms,
                                   "min_tx_ms": peer.bfd_min_tx_ms,
                                   "multiplier": peer.bfd_multiplier})
                        })
                        .collect(),
                ));
            }
            let mut t = Table::new(&["name", "address", "state", "rx/tx ms", "multiplier"]);
            for p in &peers {
                let peer = p.peer.clone().unwrap_or_default();
                t.row(vec![
                    peer.name,
                    peer.peer_address,
                    p.bfd_state.clone(),
                    format!("{}/{}", peer.bfd_min_rx_ms, peer.bfd_min_tx_ms),
                    peer.bfd_multiplier.to_string(),
                ]);
            }
            out.text(&t.render())
        }
        ShowCommand::Route {
            prefix,
            table,
            count,
            json,
        } => {
            let peer = table.get(1).cloned();
            let table = match table.first().map(String::as_str) {
                None | Some("loc") => pb::RouteTable::LocRib,
                Some("kernel") => pb::RouteTable::Kernel,
                Some("adj-in") => pb::RouteTable::AdjRibIn,
                Some("adj-out") => pb::RouteTable::AdjRibOut,
                Some(other) => {
                    return Err(CtlError::Status {
                        code: tonic::Code::InvalidArgument,
                        message: format!(
                            "--table {other}: expected loc, adj-in PEER, adj-out PEER or kernel"
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
                    count_only: count,
                })
                .await?
                .into_inner();
            if count {
                let mut n = 0;
                while let Some(batch) = stream.message().await? {
                    n += batch.count;
                }
                return if json {
                    out.json(&json!({ "routes": n }))
                } else {
                    out.line(&format!("{n} routes"))
                };
            }
            let mut routes = Vec::new();
            while let Some(batch) = stream.message().await? {
                routes.extend(batch.routes);
            }
            if table == pb::RouteTable::Kernel {
                return kernel_table(&routes, json, out);
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
                let next_hop = if r.next_hop_link_local.is_empty() {
                    r.next_hop.clone()
                } else {
                    format!("{} {}", r.next_hop, r.next_hop_link_local)
                };
                t.row(vec![
                    r.prefix.clone(),
                    next_hop,
                    path.join(" "),
                    route_json(r)["origin"].as_str().unwrap_or("").to_owned(),
                    r.local_pref.map(|l| l.to_string()).unwrap_or_default(),
                    r.med.map(|m| m.to_string()).unwrap_or_default(),
                    match (r.from_peer.is_empty(), r.stale) {
                        (true, _) => "local".into(),
                        (false, false) => r.from_peer.clone(),
                        (false, true) => format!("{} (stale)", r.from_peer),
                    },
                ]);
            }
            out.text(&t.render())
        }
        ShowCommand::Filters { peer, prefix, json } => {
            let r = client
                .get_filters(pb::GetFiltersRequest {
                    peer: peer.clone().unwrap_or_default(),
                    prefix: prefix.unwrap_or_default(),
                })
                .await?
                .into_inner();
            if json {
                let rule = |r: &pb::FilterRule| {
                    json!({"scope": scope_name(r.scope), "match": r.r#match,
                           "action": r.action, "reason": r.reason, "filter": r.filter})
                };
                let decision = |d: &pb::FilterDecision| {
                    json!({"prefix": d.prefix, "scope": scope_name(d.scope), "action": d.action,
                           "match": d.r#match, "reason": d.reason})
                };
                if peer.is_none() {
                    return out.json(&serde_json::Value::Array(
                        r.rules.iter().map(rule).collect(),
                    ));
                }
                return out.json(&json!({
                    "rules": r.rules.iter().map(rule).collect::<Vec<_>>(),
                    "decisions": r.decisions.iter().map(decision).collect::<Vec<_>>(),
                }));
            }
            let mut text = render_filters(&r.rules);
            if let Some(p) = &peer {
                text.push_str(&render_decisions(p, &r.decisions));
            }
            out.text(&text)
        }
    }
}

/// Per prefix, the rule that decided it on `peer`'s session, birdc-like.
pub fn render_decisions(peer: &str, decisions: &[pb::FilterDecision]) -> String {
    let mut t = Table::new(&["Prefix", "Direction", "Action", "Rule", "Because"]);
    for d in decisions {
        let dir = if d.scope == i32::from(pb::FilterScope::Import) {
            format!("from {peer}")
        } else {
            format!("to {peer}")
        };
        t.row(vec![
            d.prefix.clone(),
            dir,
            d.action.clone(),
            d.r#match.clone(),
            d.reason.clone(),
        ]);
    }
    format!("\n{}", t.render())
}

fn scope_name(s: i32) -> &'static str {
    match pb::FilterScope::try_from(s) {
        Ok(pb::FilterScope::Import) => "import",
        Ok(pb::FilterScope::ExportCluster) => "export to cluster peers",
        Ok(pb::FilterScope::ExportExternal) => "export to external peers",
        Ok(pb::FilterScope::Kernel) => "kernel",
        _ => "unknown",
    }
}

/// The rules grouped by scope, like BIRD filters: `filter kernel { ... }`.
pub fn render_filters(rules: &[pb::FilterRule]) -> String {
    let mut s = String::new();
    let mut current = None;
    for r in rules {
        // A peer's BGPFilter rules are a group of their own, before the generated ones.
        let group = (r.scope, r.filter.is_empty());
        if current != Some(group) {
            if current.is_some() {
                s.push_str("}\n\n");
            }
            if r.filter.is_empty() {
                s.push_str(&format!("filter {} {{\n", scope_name(r.scope)));
            } else {
                let dir = if r.scope == i32::from(pb::FilterScope::Import) {
                    "import"
                } else {
                    "export"
                };
                s.push_str(&format!(
                    "filter peer {dir} (BGPFilters, before the generated rules) {{\n"
                ));
            }
            current = Some(group);
        }
        // The unconditional last rule reads like BIRD's trailing `accept;` / `reject;`.
        let test = if r.r#match == "all" {
            String::new()
        } else {
            format!("if {} then ", r.r#match)
        };
        s.push_str(&format!("  {test}{};  # {}\n", r.action, r.reason));
    }
    if current.is_some() {
        s.push_str("}\n");
    }
    s
}

fn kernel_table(routes: &[pb::Route], json: bool, out: &mut Output) -> Result<(), CtlError> {
    if json {
        return out.json(&serde_json::Value::Array(
            routes
                .iter()
                .map(|r| json!({"prefix": r.prefix, "route": r.kernel, "source": r.from_peer}))
                .collect(),
        ));
    }
    let mut t = Table::new(&["prefix", "route", "source"]);
    for r in routes {
        t.row(vec![
            r.prefix.clone(),
            r.kernel.clone(),
            r.from_peer.clone(),
        ]);
    }
    out.text(&t.render())
}

fn on(v: &Option<String>) -> Option<bool> {
    v.as_deref().map(|s| s == "on")
}

pub async fn config(
    channel: Channel,
    command: ConfigCommand,
    out: &mut Output,
) -> Result<(), CtlError> {
    let mut client = BgpClient::new(channel);
    let mut c = client
        .get_configuration(pb::GetConfigurationRequest {})
        .await?
        .into_inner();
    let json = match command {
        ConfigCommand::Show { json } => json,
        ConfigCommand::Set {
            asn,
            mesh,
            listen_port,
            hold_time,
            keepalive,
            aggregate,
            program_external_routes,
            json,
        } => {
            if let Some(a) = asn {
                c.as_number = a;
            }
            if let Some(m) = on(&mesh) {
                c.node_to_node_mesh = Some(m);
            }
            if let Some(p) = listen_port {
                c.listen_port = p;
            }
            if let Some(h) = hold_time {
                c.hold_time_s = h;
            }
            if let Some(k) = keepalive {
                c.keepalive_time_s = k;
            }
            if let Some(a) = on(&aggregate) {
                c.aggregate_pools_to_external = a;
            }
            if let Some(p) = on(&program_external_routes) {
                c.program_external_routes = Some(p);
            }
            c = client
                .set_configuration(pb::SetConfigurationRequest {
                    configuration: Some(c),
                })
                .await?
                .into_inner();
            json
        }
    };
    let onoff = |b: bool| if b { "on" } else { "off" };
    if json {
        return out.json(&json!({
            "as": c.as_number,
            "node_to_node_mesh": c.node_to_node_mesh.unwrap_or(true),
            "listen_port": c.listen_port,
            "hold_time_s": c.hold_time_s,
            "keepalive_time_s": c.keepalive_time_s,
            "aggregate_pools_to_external": c.aggregate_pools_to_external,
            "external_transit": c.external_transit,
            "program_external_routes": c.program_external_routes.unwrap_or(true),
            "revision": c.revision,
        }));
    }
    let mut t = Table::new(&["setting", "value"]);
    for (k, v) in [
        ("as", c.as_number.to_string()),
        (
            "node-to-node mesh",
            onoff(c.node_to_node_mesh.unwrap_or(true)).into(),
        ),
        ("listen port", c.listen_port.to_string()),
        ("hold time", c.hold_time_s.to_string()),
        ("keepalive", c.keepalive_time_s.to_string()),
        (
            "aggregate pools to external",
            onoff(c.aggregate_pools_to_external).into(),
        ),
        ("external transit", onoff(c.external_transit).into()),
        (
            "program external routes",
            onoff(c.program_external_routes.unwrap_or(true)).into(),
        ),
        ("revision", c.revision.to_string()),
    ] {
        t.row(vec![k.into(), v]);
    }
    out.text(&t.render())
}

#[expect(
    clippy::too_many_lines,
    reason = "one match arm per `bgpctl peer` subcommand (add, refresh, del); `add` maps every peer flag onto the request"
)]
pub async fn peer(
    channel: Channel,
    command: PeerCommand,
    out: &mut Output,
) -> Result<(), CtlError> {
    let mut client = BgpClient::new(channel);
    match command {
        PeerCommand::Add(args) => {
            let PeerAddArgs {
                address,
                asn,
                passive,
                port,
                resource,
                node,
                password,
                ttl_security,
                multihop,
                max_prefixes,
                max_prefixes_restart,
                families,
                bfd,
                filters,
                next_hop,
                local_as,
                allow_local_as,
                max_restart_time,
                reachable_by,
                json,
            } = *args;
            let next_hop_mode = match next_hop.as_deref() {
                Some("self") => pb::NextHopMode::Self_,
                Some("keep") => pb::NextHopMode::Keep,
                _ => pb::NextHopMode::Auto,
            };
            let (bfd_min_rx_ms, bfd_min_tx_ms, bfd_multiplier) = match bfd[..] {
                [] => (0, 0, 0),
                [rx, tx, m] => (rx, tx, m),
                _ => {
                    return Err(CtlError::Status {
                        code: tonic::Code::InvalidArgument,
                        message: "--bfd: give MIN_RX_MS,MIN_TX_MS,MULTIPLIER, e.g. 100,100,3"
                            .into(),
                    });
                }
            };
            let origin = if resource.is_some() {
                pb::PeerOrigin::Resource
            } else {
                pb::PeerOrigin::Api
            };
            let p = client
                .add_peer(pb::AddPeerRequest {
                    peer: Some(pb::BgpPeer {
                        name: resource.unwrap_or_default(),
                        node: node.unwrap_or_default(),
                        peer_address: address,
                        as_number: asn,
                        passive,
                        port: port.unwrap_or(0),
                        origin: origin.into(),
                        password: password.unwrap_or_default(),
                        ttl_security_hops: ttl_security.unwrap_or(0),
                        multihop_ttl: multihop.unwrap_or(0),
                        max_prefixes: max_prefixes.unwrap_or(0),
                        max_prefixes_restart_s: max_prefixes_restart.unwrap_or(0),
                        families,
                        bfd_min_rx_ms,
                        bfd_min_tx_ms,
                        bfd_multiplier,
                        filters,
                        next_hop_mode: next_hop_mode.into(),
                        local_as_number: local_as.unwrap_or(0),
                        num_allowed_local_as_numbers: allow_local_as.unwrap_or(0),
                        max_restart_time_s: max_restart_time.unwrap_or(0),
                        reachable_by: reachable_by.unwrap_or_default(),
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
        PeerCommand::Refresh {
            peer,
            out: outbound,
        } => {
            client
                .refresh_peer(pb::RefreshPeerRequest {
                    peer: peer.clone(),
                    outbound,
                })
                .await?;
            out.line(&format!(
                "{} {peer}",
                if outbound {
                    "routes sent again to"
                } else {
                    "route refresh requested from"
                }
            ))
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
