//! The `Bgp` service: peers and their sessions, route tables, announcements, the cluster's
//! BGP configuration and `BGPPeer` resources, the generated filters. A thin adapter: the
//! speaker task owns sessions and tables, the datastore owns the cluster resources (which the
//! cluster brain turns into peers and policy), the dataplane hub owns the kernel table.
//!
//! Why this file is long: the `Bgp` service has fifteen methods, and the conversions between
//! its messages and the speaker's and datastore's types (about half the file) serve only them
//! (the resource ones live in `convert`).

use std::net::IpAddr;
use std::pin::Pin;
use std::time::UNIX_EPOCH;

use bgp_wire::{Community, Prefix};
use proto::v1::bgp_server::Bgp;
use proto::v1::{
    AddPeerRequest, AnnounceRouteRequest, AnnounceRouteResponse, BgpConfiguration, BgpPeer,
    DeletePeerRequest, DeletePeerResponse, GetConfigurationRequest, GetFiltersRequest,
    GetFiltersResponse, ListPeersRequest, ListPeersResponse, ListRoutesRequest, ListRoutesResponse,
    PeerOrigin, RouteTable, SessionState, SetConfigurationRequest, WithdrawRouteRequest,
    WithdrawRouteResponse,
};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use ::datastore::Resources;
use ::datastore::Store;
use ::datastore::model;
use proto::v1::{FilterRule, FilterScope};

use crate::api::convert;
use crate::dataplane::Hub;
use crate::datastore::DatastoreHandle;
use crate::speaker::task::ListedRoute;
use crate::speaker::{Announcement, PeerSpec, PeerStatus, SpeakerError, SpeakerHandle, Table};
use bgp::fsm::State;
use bgp::policy::Scope;
use bgp::rib::next_hop_addr;

/// Routes per streamed message.
const BATCH: usize = 1000;
/// Communities an announced route may carry (see `announce_route`).
const MAX_COMMUNITIES: usize = 1000;

#[derive(Clone)]
pub struct BgpService {
    speaker: SpeakerHandle,
    datastore: DatastoreHandle,
    dataplane: Hub,
}

impl BgpService {
    pub fn new(speaker: SpeakerHandle, datastore: DatastoreHandle, dataplane: Hub) -> Self {
        Self {
            speaker,
            datastore,
            dataplane,
        }
    }

    /// The store, or `unavailable` naming it.
    fn store(&self) -> Result<Store, Status> {
        self.datastore
            .store()
            .ok_or_else(|| convert::unavailable(&self.datastore))
    }
}

fn config_message(c: &model::BgpConfiguration, revision: u64) -> BgpConfiguration {
    BgpConfiguration {
        as_number: c.as_number,
        node_to_node_mesh: Some(c.node_to_node_mesh),
        listen_port: u32::from(c.listen_port),
        keepalive_time_s: u32::from(c.keepalive_time_s),
        hold_time_s: u32::from(c.hold_time_s),
        service_cluster_cidrs: texts(&c.service_cluster_ips),
        service_external_cidrs: texts(&c.service_external_ips),
        revision,
        aggregate_pools_to_external: c.aggregate_pools_to_external,
        external_transit: c.external_transit,
        program_external_routes: Some(c.program_external_routes),
        service_load_balancer_cidrs: texts(&c.service_load_balancer_ips),
        communities: c
            .communities
            .iter()
            .map(|d| proto::v1::CommunityDef {
                name: d.name.clone(),
                value: d.value.clone(),
            })
            .collect(),
        prefix_advertisements: c
            .prefix_advertisements
            .iter()
            .map(|a| proto::v1::PrefixAdvertisement {
                cidr: a.cidr.to_string(),
                communities: a.communities.clone(),
            })
            .collect(),
    }
}

fn texts(nets: &[ipnet::IpNet]) -> Vec<String> {
    nets.iter().map(ToString::to_string).collect()
}

/// The CIDRs of a configuration list, each unparsable one named (`service_cluster_cidrs[1]`).
fn cidrs(field: &str, list: &[String]) -> Result<Vec<ipnet::IpNet>, Status> {
    list.iter()
        .enumerate()
        .map(|(i, s)| cidr(&format!("{field}[{i}]"), s))
        .collect()
}

fn cidr(field: &str, s: &str) -> Result<ipnet::IpNet, Status> {
    s.trim().parse().map_err(|_| {
        convert::invalid(
            field,
            format!("{s:?} is not a CIDR like 10.96.0.0/12 or fd00:96::/108"),
        )
    })
}

/// The configuration of a request, checked whole (each refusal naming the message's field:
/// `communities[1].value`, `service_cluster_cidrs[0]`).
fn config_from(m: &BgpConfiguration) -> Result<model::BgpConfiguration, Status> {
    let d = model::BgpConfiguration::default();
    let u16_of = |field: &str, v: u32, default: u16| -> Result<u16, Status> {
        if v == 0 {
            return Ok(default);
        }
        u16::try_from(v).map_err(|_| Status::invalid_argument(format!("{field}: above 65535")))
    };
    let c = model::BgpConfiguration {
        as_number: match convert::asn("as_number", m.as_number)? {
            0 => d.as_number,
            a => a,
        },
        node_to_node_mesh: m.node_to_node_mesh.unwrap_or(d.node_to_node_mesh),
        listen_port: u16_of("listen_port", m.listen_port, d.listen_port)?,
        keepalive_time_s: u16_of("keepalive_time_s", m.keepalive_time_s, 0)?,
        hold_time_s: u16_of("hold_time_s", m.hold_time_s, 0)?,
        aggregate_pools_to_external: m.aggregate_pools_to_external,
        external_transit: m.external_transit,
        program_external_routes: m
            .program_external_routes
            .unwrap_or(d.program_external_routes),
        service_cluster_ips: cidrs("service_cluster_cidrs", &m.service_cluster_cidrs)?,
        service_external_ips: cidrs("service_external_cidrs", &m.service_external_cidrs)?,
        service_load_balancer_ips: cidrs(
            "service_load_balancer_cidrs",
            &m.service_load_balancer_cidrs,
        )?,
        communities: m
            .communities
            .iter()
            .map(|c| model::CommunityDef {
                name: c.name.clone(),
                value: c.value.trim().to_owned(),
            })
            .collect(),
        prefix_advertisements: m
            .prefix_advertisements
            .iter()
            .enumerate()
            .map(|(i, a)| {
                Ok(model::PrefixAdvertisement {
                    cidr: cidr(&format!("prefix_advertisements[{i}].cidr"), &a.cidr)?,
                    communities: a.communities.iter().map(|c| c.trim().to_owned()).collect(),
                })
            })
            .collect::<Result<_, Status>>()?,
    };
    c.check().map_err(|mut e| {
        // The model's lists are `service_*_ips`, the message's `service_*_cidrs`.
        if e.head.starts_with("service_") {
            e.path = e.path.replacen("_ips", "_cidrs", 1);
        }
        convert::invalid_field("", e)
    })?;
    Ok(c)
}

/// A kernel route as `ip route` would show it.
fn kernel_text(r: &proto::v1::KernelRoute) -> String {
    use proto::v1::RouteKind;
    let dev = if r.device.is_empty() {
        String::new()
    } else {
        format!(" dev {}", r.device)
    };
    let onlink = if r.onlink { " onlink" } else { "" };
    match RouteKind::try_from(r.kind).unwrap_or(RouteKind::Unspecified) {
        RouteKind::Blackhole => "blackhole".into(),
        RouteKind::Workload => format!("dev {} scope link", r.device),
        RouteKind::Vxlan => format!("via {} dev vxlan.calico onlink", r.gateway),
        RouteKind::Ipip => format!("via {} dev tunl0 onlink", r.gateway),
        RouteKind::Gateway | RouteKind::Unspecified => format!("via {}{dev}{onlink}", r.gateway),
    }
}

fn scope_message(s: Scope) -> FilterScope {
    match s {
        Scope::Import => FilterScope::Import,
        Scope::ExportCluster => FilterScope::ExportCluster,
        Scope::ExportExternal => FilterScope::ExportExternal,
        Scope::Kernel => FilterScope::Kernel,
    }
}

fn status(e: SpeakerError) -> Status {
    match e {
        SpeakerError::PeerExists(_) => Status::already_exists(e.to_string()),
        SpeakerError::NoPeer(_) | SpeakerError::NotAnnounced(_) => Status::not_found(e.to_string()),
        SpeakerError::Listen { .. } | SpeakerError::NoRouterId => {
            Status::failed_precondition(e.to_string())
        }
        SpeakerError::NextHopFamily { .. } => Status::invalid_argument(e.to_string()),
        SpeakerError::Stopped => Status::unavailable(e.to_string()),
    }
}

/// An optional address field: empty is none.
fn opt_addr(field: &str, s: &str) -> Result<Option<IpAddr>, Status> {
    if s.trim().is_empty() {
        Ok(None)
    } else {
        parse_addr(field, s).map(Some)
    }
}

fn parse_addr(field: &str, s: &str) -> Result<IpAddr, Status> {
    let a: IpAddr = s
        .trim()
        .parse()
        .map_err(|_| Status::invalid_argument(format!("{field}: {s:?} is not an IP address")))?;
    if let IpAddr::V6(v6) = a
        && v6.is_unicast_link_local()
    {
        return Err(Status::invalid_argument(format!(
            "{field}: {s:?} is link-local, which needs an interface; use a global address"
        )));
    }
    // An IPv4-mapped address is the IPv4 address.
    Ok(a.to_canonical())
}

fn parse_prefix(s: &str) -> Result<Prefix, Status> {
    let net: ipnet::IpNet = s.trim().parse().map_err(|_| {
        Status::invalid_argument(format!(
            "prefix: {s:?} is not a prefix like 10.0.0.0/24 or fd00::/64"
        ))
    })?;
    Prefix::new(net.network(), net.prefix_len())
        .ok_or_else(|| Status::invalid_argument(format!("prefix: {s:?} is not valid")))
}

/// `families` of a peer request; `None`: the session's own.
fn families(names: &[String]) -> Result<Option<crate::speaker::task::Families>, Status> {
    if names.is_empty() {
        return Ok(None);
    }
    let mut f = crate::speaker::task::Families::NONE;
    for n in names {
        match n.trim() {
            "ipv4" => f.ipv4 = true,
            "ipv6" => f.ipv6 = true,
            other => {
                return Err(Status::invalid_argument(format!(
                    "peer.families: {other:?} is not a family; use \"ipv4\" and/or \"ipv6\""
                )));
            }
        }
    }
    Ok(Some(f))
}

/// Accepts a peer as its address or its session name (`peer_10_0_0_2`, `Mesh_10_0_0_2`,
/// `Node_10_0_0_2_port_1790`, `peer_fd00__2`).
fn peer_ref(s: &str) -> Result<IpAddr, Status> {
    let t = s.trim();
    let named = ["peer_", "Mesh_", "Node_", "Global_"]
        .iter()
        .find_map(|k| t.strip_prefix(k))
        .map(|r| r.split("_port_").next().unwrap_or(r));
    if let Some(r) = named {
        // Names spell an address with `_` for its `.` (IPv4) or `:` (IPv6).
        for sep in [".", ":"] {
            if let Ok(a) = r.replace('_', sep).parse() {
                return Ok(a);
            }
        }
    }
    parse_addr("peer", t)
}

pub fn session_state(s: State) -> SessionState {
    match s {
        State::Idle => SessionState::Idle,
        State::Connect => SessionState::Connect,
        State::Active => SessionState::Active,
        State::OpenSent => SessionState::OpenSent,
        State::OpenConfirm => SessionState::OpenConfirm,
        State::Established => SessionState::Established,
    }
}

fn peer_message(spec: &PeerSpec) -> BgpPeer {
    BgpPeer {
        name: spec.name(),
        peer_address: spec.address.to_string(),
        as_number: spec.asn.0,
        passive: spec.passive,
        hold_time_s: u32::from(spec.hold_time),
        keepalive_time_s: spec.keepalive.map_or(0, u32::from),
        port: u32::from(spec.port),
        origin: match spec.origin {
            crate::speaker::PeerOrigin::Config => PeerOrigin::Config,
            crate::speaker::PeerOrigin::Api => PeerOrigin::Api,
            crate::speaker::PeerOrigin::Mesh => PeerOrigin::Mesh,
            crate::speaker::PeerOrigin::RouteReflector => PeerOrigin::RouteReflector,
            crate::speaker::PeerOrigin::Resource => PeerOrigin::Resource,
        }
        .into(),
        route_reflector_client: spec.rr_client,
        password: if spec.transport.password.is_some() {
            "*****".into()
        } else {
            String::new()
        },
        ttl_security_hops: spec.transport.ttl_security_hops.map_or(0, u32::from),
        max_prefixes: spec.max_prefixes.unwrap_or(0),
        graceful_restart_time_s: spec
            .graceful_restart
            .map_or(0, |g| u32::from(g.restart_time)),
        stale_path_time_s: spec.graceful_restart.map_or(0, |g| u32::from(g.stale_time)),
        max_prefixes_restart_s: spec.max_prefixes_restart.map_or(0, u32::from),
        multihop_ttl: spec.transport.multihop_ttl.map_or(0, u32::from),
        families: [(spec.families.ipv4, "ipv4"), (spec.families.ipv6, "ipv6")]
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, f)| f.to_owned())
            .collect(),
        bfd_min_rx_ms: spec.bfd.map_or(0, |b| b.required_min_rx.as_millis() as u32),
        bfd_min_tx_ms: spec.bfd.map_or(0, |b| b.desired_min_tx.as_millis() as u32),
        bfd_multiplier: spec.bfd.map_or(0, |b| u32::from(b.detect_mult)),
        next_hop_mode: convert::next_hop_mode_to(crate::cluster::peers::model_next_hop(
            spec.options.next_hop,
        )),
        local_as_number: spec.options.local_as.map_or(0, |a| a.0),
        num_allowed_local_as_numbers: u32::from(spec.options.allow_local_as),
        ..BgpPeer::default()
    }
}

fn peer_status(p: &PeerStatus) -> proto::v1::PeerStatus {
    let info = match (p.state, p.remote_id) {
        (State::Established, Some(id)) => format!("Established, router id {id}"),
        (_, _) => p.last_error.clone().unwrap_or_default(),
    };
    proto::v1::PeerStatus {
        peer: Some(peer_message(&p.spec)),
        state: session_state(p.state).into(),
        since_unix_ms: p
            .since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        prefixes_received: p.received,
        prefixes_accepted: p.accepted,
        prefixes_advertised: p.advertised,
        last_error: p.last_error.clone().unwrap_or_default(),
        info,
        malformed_treat_as_withdraw: p.malformed.treat_as_withdraw,
        malformed_attribute_discard: p.malformed.attribute_discard,
        malformed_session_reset: p.malformed.session_reset,
        bfd_state: p.bfd.map_or("", |s| s.name()).into(),
    }
}

fn route_message(r: &ListedRoute) -> proto::v1::Route {
    let a = &r.route.attrs;
    let as_path = a
        .as_path
        .as_ref()
        .map(|p| {
            p.segments()
                .iter()
                .flat_map(|s| s.asns.iter().map(|x| x.0))
                .collect()
        })
        .unwrap_or_default();
    let origin = match a.origin {
        Some(bgp_wire::Origin::Igp) | None => proto::v1::Origin::Igp,
        Some(bgp_wire::Origin::Egp) => proto::v1::Origin::Egp,
        Some(bgp_wire::Origin::Incomplete) => proto::v1::Origin::Incomplete,
    };
    proto::v1::Route {
        prefix: format!("{}/{}", r.route.prefix.addr(), r.route.prefix.prefix_len()),
        next_hop: next_hop_addr(a).map(|n| n.to_string()).unwrap_or_default(),
        next_hop_link_local: match a.mp_next_hop {
            Some(bgp_wire::NextHop::V6 {
                link_local: Some(ll),
                ..
            }) => ll.to_string(),
            _ => String::new(),
        },
        as_path,
        origin: origin.into(),
        med: a.med,
        local_pref: a.local_pref,
        communities: a.communities.iter().map(ToString::to_string).collect(),
        large_communities: a
            .large_communities
            .iter()
            .map(ToString::to_string)
            .collect(),
        from_peer: r.from_peer.map(|p| p.to_string()).unwrap_or_default(),
        best: r.best,
        kernel: String::new(),
        stale: r.stale,
    }
}

type RouteStream = Pin<Box<dyn Stream<Item = Result<ListRoutesResponse, Status>> + Send>>;

/// The optional prefix of a listing request (empty: every route).
fn prefix_filter(s: &str) -> Result<Option<Prefix>, Status> {
    if s.trim().is_empty() {
        Ok(None)
    } else {
        parse_prefix(s).map(Some)
    }
}

/// The answer to a `count_only` listing.
fn count_reply(count: usize) -> RouteStream {
    let reply = ListRoutesResponse {
        routes: vec![],
        count: count as u64,
    };
    Box::pin(tokio_stream::iter(vec![Ok(reply)]))
}

/// A listing's answer: the count alone (`count_only`), or the routes (at most `limit`) in
/// batches, each converted by `to_message`.
fn route_stream<T>(
    req: &ListRoutesRequest,
    mut routes: Vec<T>,
    to_message: impl Fn(&T) -> proto::v1::Route,
) -> RouteStream {
    if req.count_only {
        return count_reply(routes.len());
    }
    if req.limit > 0 {
        routes.truncate(usize::try_from(req.limit).unwrap_or(usize::MAX));
    }
    let batches: Vec<Result<ListRoutesResponse, Status>> = routes
        .chunks(BATCH)
        .map(|c| {
            Ok(ListRoutesResponse {
                routes: c.iter().map(&to_message).collect(),
                count: 0,
            })
        })
        .collect();
    Box::pin(tokio_stream::iter(batches))
}

#[tonic::async_trait]
impl Bgp for BgpService {
    async fn get_configuration(
        &self,
        _request: Request<GetConfigurationRequest>,
    ) -> Result<Response<BgpConfiguration>, Status> {
        let stored = Resources::new(&self.store()?)
            .bgp_configuration()
            .await
            .map_err(convert::status)?;
        Ok(Response::new(match stored {
            Some((c, rev)) => config_message(&c, rev.to_wire()),
            None => config_message(&model::BgpConfiguration::default(), 0),
        }))
    }

    async fn set_configuration(
        &self,
        request: Request<SetConfigurationRequest>,
    ) -> Result<Response<BgpConfiguration>, Status> {
        let m = request
            .into_inner()
            .configuration
            .ok_or_else(|| Status::invalid_argument("configuration: required"))?;
        let c = config_from(&m)?;
        let store = self.store()?;
        let resources = Resources::new(&store);
        let expected = if m.revision != 0 {
            Some(::datastore::Version::from_wire(m.revision))
        } else {
            resources
                .bgp_configuration()
                .await
                .map_err(convert::status)?
                .map(|(_, r)| r)
        };
        let rev = resources
            .set_bgp_configuration(&c, expected)
            .await
            .map_err(convert::status)?;
        Ok(Response::new(config_message(&c, rev.to_wire())))
    }

    #[expect(
        clippy::too_many_lines,
        reason = "checks every AddPeer field before anything is stored or started, then maps them onto the speaker's PeerSpec; one field after another"
    )]
    async fn add_peer(
        &self,
        request: Request<AddPeerRequest>,
    ) -> Result<Response<BgpPeer>, Status> {
        let p = request
            .into_inner()
            .peer
            .ok_or_else(|| Status::invalid_argument("peer: required"))?;
        let address = parse_addr("peer.peer_address", &p.peer_address)?;
        if p.as_number == 0 {
            return Err(Status::invalid_argument("peer.as_number: AS 0 is reserved"));
        }
        convert::asn("peer.as_number", p.as_number)?;
        convert::asn("peer.local_as_number", p.local_as_number)?;
        // The session's options, read once for a resource and for a node's own peer alike.
        let next_hop_mode = convert::next_hop_mode_from("peer.next_hop_mode", p.next_hop_mode)?;
        let local_as = match p.local_as_number {
            0 => None,
            23456 => {
                return Err(Status::invalid_argument(
                    "peer.local_as_number: AS_TRANS 23456 cannot be our AS",
                ));
            }
            a => Some(a),
        };
        let allow_local_as = u8::try_from(p.num_allowed_local_as_numbers).map_err(|_| {
            Status::invalid_argument("peer.num_allowed_local_as_numbers: at most 255")
        })?;
        if PeerOrigin::try_from(p.origin).is_err() {
            return Err(Status::invalid_argument(format!(
                "peer.origin: {} is not an origin",
                p.origin
            )));
        }
        // Checked before anything is stored or started.
        let bfd = match (p.bfd_min_rx_ms, p.bfd_min_tx_ms, p.bfd_multiplier) {
            (0, 0, 0) => None,
            (rx, tx, m) => Some(
                bfd::SessionConfig::from_ms(u64::from(rx), u64::from(tx), u64::from(m))
                    .map_err(|e| Status::invalid_argument(format!("peer.bfd.{e}")))?,
            ),
        };
        if p.origin == i32::from(PeerOrigin::Resource) {
            if !p.families.is_empty() {
                return Err(Status::invalid_argument(
                    "peer.families: BGPPeer resources carry their session's own family; add the peer to one node (no --resource) to choose families",
                ));
            }
            // A BGPPeer resource: stored; every bgpd it concerns adds the session.
            let u16_of = |field: &str, v: u32| {
                u16::try_from(v)
                    .map_err(|_| Status::invalid_argument(format!("peer.{field}: above 65535")))
            };
            let r = model::BgpPeer {
                name: p.name.clone(),
                node: p.node.clone(),
                peer_address: address,
                as_number: p.as_number,
                port: u16_of("port", p.port)?,
                passive: p.passive,
                password: p.password.clone(),
                ttl_security_hops: u8::try_from(p.ttl_security_hops)
                    .map_err(|_| Status::invalid_argument("peer.ttl_security_hops: at most 255"))?,
                keepalive_time_s: u16_of("keepalive_time_s", p.keepalive_time_s)?,
                hold_time_s: u16_of("hold_time_s", p.hold_time_s)?,
                max_prefixes: p.max_prefixes,
                bfd: bfd.map(|_| model::BgpPeerBfd {
                    min_rx_ms: p.bfd_min_rx_ms,
                    min_tx_ms: p.bfd_min_tx_ms,
                    multiplier: p.bfd_multiplier,
                }),
                filters: p.filters.iter().map(|f| f.trim().to_owned()).collect(),
                next_hop_mode,
                local_as_number: local_as,
                num_allowed_local_as_numbers: allow_local_as,
                max_restart_time_s: match p.max_restart_time_s {
                    0 => None,
                    t => Some(u16::try_from(t).map_err(|_| {
                        Status::invalid_argument(
                            "peer.max_restart_time_s: at most 4095 (RFC 4724's 12 bits)",
                        )
                    })?),
                },
                reachable_by: opt_addr("peer.reachable_by", &p.reachable_by)?,
            };
            r.check().map_err(|e| convert::invalid_field("peer.", e))?;
            crate::speaker::sockopt::Password::new(&r.password)
                .map_err(|e| Status::invalid_argument(format!("peer.password: {e}")))?;
            Resources::new(&self.store()?)
                .put_bgp_peer(&r)
                .await
                .map_err(convert::status)?;
            let mut echo = p.clone();
            if !echo.password.is_empty() {
                echo.password = "*****".into();
            }
            return Ok(Response::new(echo));
        }
        // Filters are resources and reachable_by a route the cluster brain installs: both
        // belong to BGPPeer resources.
        if !p.filters.is_empty() {
            return Err(Status::invalid_argument(
                "peer.filters: only BGPPeer resources (--resource) take filters",
            ));
        }
        if !p.reachable_by.trim().is_empty() {
            return Err(Status::invalid_argument(
                "peer.reachable_by: only BGPPeer resources (--resource) take reachable_by",
            ));
        }
        let mut spec = PeerSpec::new(address, bgp_wire::Asn(p.as_number));
        spec.options = bgp::rib::PeerOptions {
            local_as: local_as.map(bgp_wire::Asn),
            allow_local_as,
            next_hop: crate::cluster::peers::rib_next_hop(next_hop_mode),
            interface: None,
        };
        spec.bfd = bfd;
        if let Some(f) = families(&p.families)? {
            spec.families = f;
        }
        spec.passive = p.passive;
        let hops = |field: &str, v: u32| -> Result<Option<u8>, Status> {
            match v {
                0 => Ok(None),
                1..=255 => Ok(Some(v as u8)),
                _ => Err(Status::invalid_argument(format!(
                    "peer.{field}: 1-255 hops"
                ))),
            }
        };
        let mut gr = crate::speaker::task::GracefulRestart::default();
        if p.graceful_restart_time_s != 0 {
            gr.restart_time = u16::try_from(p.graceful_restart_time_s)
                .ok()
                .filter(|t| *t <= 4095)
                .ok_or_else(|| {
                    Status::invalid_argument("peer.graceful_restart_time_s: at most 4095")
                })?;
        }
        // Calico's maxRestartTime is the restart time we announce: the same setting.
        if p.max_restart_time_s != 0 {
            if p.graceful_restart_time_s != 0 && p.graceful_restart_time_s != p.max_restart_time_s {
                return Err(Status::invalid_argument(
                    "peer.max_restart_time_s: names the same setting as graceful_restart_time_s; give one",
                ));
            }
            gr.restart_time = u16::try_from(p.max_restart_time_s)
                .ok()
                .filter(|t| *t <= 4095)
                .ok_or_else(|| Status::invalid_argument("peer.max_restart_time_s: at most 4095"))?;
        }
        if p.stale_path_time_s != 0 {
            gr.stale_time = u16::try_from(p.stale_path_time_s)
                .map_err(|_| Status::invalid_argument("peer.stale_path_time_s: above 65535"))?;
        }
        spec.graceful_restart = Some(gr);
        spec.max_prefixes = (p.max_prefixes != 0).then_some(p.max_prefixes);
        spec.max_prefixes_restart = match p.max_prefixes_restart_s {
            0 => None,
            s => Some(u16::try_from(s).map_err(|_| {
                Status::invalid_argument("peer.max_prefixes_restart_s: above 65535")
            })?),
        };
        spec.transport = crate::speaker::sockopt::Transport {
            password: crate::speaker::sockopt::Password::new(&p.password)
                .map_err(|e| Status::invalid_argument(format!("peer.password: {e}")))?,
            ttl_security_hops: hops("ttl_security_hops", p.ttl_security_hops)?,
            multihop_ttl: hops("multihop_ttl", p.multihop_ttl)?,
        };
        if p.port != 0 {
            spec.port = u16::try_from(p.port)
                .map_err(|_| Status::invalid_argument("peer.port: above 65535"))?;
        }
        if p.hold_time_s != 0 {
            let h = u16::try_from(p.hold_time_s)
                .ok()
                .filter(|h| *h >= 3)
                .ok_or_else(|| {
                    Status::invalid_argument(
                        "peer.hold_time_s: must be 3..=65535 (0 means the default)",
                    )
                })?;
            spec.hold_time = h;
        }
        if p.keepalive_time_s != 0 {
            spec.keepalive = Some(
                u16::try_from(p.keepalive_time_s)
                    .map_err(|_| Status::invalid_argument("peer.keepalive_time_s: above 65535"))?,
            );
        }
        self.speaker.add_peer(spec.clone()).await.map_err(status)?;
        Ok(Response::new(peer_message(&spec)))
    }

    async fn delete_peer(
        &self,
        request: Request<DeletePeerRequest>,
    ) -> Result<Response<DeletePeerResponse>, Status> {
        let peer = request.into_inner().peer;
        convert::required("peer", &peer)?;
        let Ok(addr) = peer_ref(&peer) else {
            // Not an address or session name: a BGPPeer resource's name.
            Resources::new(&self.store()?)
                .delete_bgp_peer(peer.trim())
                .await
                .map_err(convert::status)?;
            return Ok(Response::new(DeletePeerResponse {}));
        };
        let peers = self.speaker.peers().await.map_err(status)?;
        if let Some(p) = peers
            .iter()
            .find(|p| p.spec.address == addr && p.spec.origin.is_cluster())
        {
            return Err(Status::failed_precondition(format!(
                "{} comes from the cluster state ({:?}); change the nodes, the BGP configuration or the BGPPeer resources instead",
                p.spec.name(),
                p.spec.origin
            )));
        }
        self.speaker.delete_peer(addr).await.map_err(status)?;
        Ok(Response::new(DeletePeerResponse {}))
    }

    async fn list_peers(
        &self,
        _request: Request<ListPeersRequest>,
    ) -> Result<Response<ListPeersResponse>, Status> {
        let peers = self.speaker.peers().await.map_err(status)?;
        Ok(Response::new(ListPeersResponse {
            peers: peers.iter().map(peer_status).collect(),
        }))
    }

    async fn refresh_peer(
        &self,
        request: Request<proto::v1::RefreshPeerRequest>,
    ) -> Result<Response<proto::v1::RefreshPeerResponse>, Status> {
        let req = request.into_inner();
        let addr = peer_ref(&req.peer)?;
        self.speaker
            .refresh(addr, req.outbound)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::v1::RefreshPeerResponse {}))
    }

    type ListRoutesStream = RouteStream;

    async fn list_routes(
        &self,
        request: Request<ListRoutesRequest>,
    ) -> Result<Response<Self::ListRoutesStream>, Status> {
        let req = request.into_inner();
        let table = RouteTable::try_from(req.table).map_err(|_| {
            Status::invalid_argument(format!("table: {} is not a table", req.table))
        })?;
        let table = match table {
            RouteTable::Unspecified | RouteTable::LocRib => Table::Loc,
            RouteTable::AdjRibIn => Table::AdjIn,
            RouteTable::AdjRibOut => Table::AdjOut,
            RouteTable::Kernel => return self.kernel_routes(&req),
        };
        let peer = match table {
            Table::Loc => None,
            _ if req.peer.trim().is_empty() => {
                return Err(Status::invalid_argument(
                    "peer: required for adj-in and adj-out tables",
                ));
            }
            _ => Some(peer_ref(&req.peer)?),
        };
        let filter = prefix_filter(&req.prefix)?;
        if req.count_only && table == Table::Loc {
            // Polled in loops (scale_bench, operators' watch): counted where the table is,
            // without a copy of it.
            let count = self.speaker.loc_count(filter).await.map_err(status)?;
            return Ok(Response::new(count_reply(count)));
        }
        let mut routes = self.speaker.routes(table, peer).await.map_err(status)?;
        if let Some(f) = filter {
            routes.retain(|r| f.contains(&r.route.prefix));
        }
        Ok(Response::new(route_stream(&req, routes, route_message)))
    }

    async fn announce_route(
        &self,
        request: Request<AnnounceRouteRequest>,
    ) -> Result<Response<AnnounceRouteResponse>, Status> {
        let req = request.into_inner();
        // A route's COMMUNITIES travel in one UPDATE of at most 4096 octets (RFC 4271 §4.3):
        // about a thousand fit. More could never be sent; refused before parsing, so a
        // request of 350 000 (3 MB, under the decoding limit) costs nothing.
        if req.communities.len() > MAX_COMMUNITIES {
            return Err(Status::invalid_argument(format!(
                "communities: {} given, at most {MAX_COMMUNITIES} fit in a BGP UPDATE",
                req.communities.len()
            )));
        }
        let prefix = parse_prefix(&req.prefix)?;
        let next_hop = if req.next_hop.trim().is_empty() {
            None
        } else {
            Some(parse_addr("next_hop", &req.next_hop)?)
        };
        let communities = req
            .communities
            .iter()
            .map(|c| {
                c.parse::<Community>()
                    .map_err(|e| Status::invalid_argument(format!("communities: {c:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !req.large_communities.is_empty() {
            return Err(Status::unimplemented(
                "large communities on announcements are not supported yet",
            ));
        }
        self.speaker
            .announce(Announcement {
                prefix,
                next_hop,
                communities,
            })
            .await
            .map_err(status)?;
        Ok(Response::new(AnnounceRouteResponse {}))
    }

    async fn withdraw_route(
        &self,
        request: Request<WithdrawRouteRequest>,
    ) -> Result<Response<WithdrawRouteResponse>, Status> {
        let prefix = parse_prefix(&request.into_inner().prefix)?;
        self.speaker.withdraw(prefix).await.map_err(status)?;
        Ok(Response::new(WithdrawRouteResponse {}))
    }

    async fn apply_bgp_filter(
        &self,
        request: Request<proto::v1::ApplyBgpFilterRequest>,
    ) -> Result<Response<proto::v1::BgpFilter>, Status> {
        let m = request
            .into_inner()
            .filter
            .ok_or_else(|| Status::invalid_argument("filter: required"))?;
        let f = convert::filter_from(&m)?;
        f.check()
            .map_err(|e| convert::invalid_field("filter.", e))?;
        let expected = (m.revision != 0).then_some(::datastore::Version::from_wire(m.revision));
        let rev = Resources::new(&self.store()?)
            .put_bgp_filter(&f, expected)
            .await
            .map_err(convert::status)?;
        Ok(Response::new(convert::filter_to(&f, rev)))
    }

    async fn delete_bgp_filter(
        &self,
        request: Request<proto::v1::DeleteBgpFilterRequest>,
    ) -> Result<Response<proto::v1::DeleteBgpFilterResponse>, Status> {
        let name = request.into_inner().name;
        convert::required("name", &name)?;
        Resources::new(&self.store()?)
            .delete_bgp_filter(name.trim())
            .await
            .map_err(convert::status)?;
        Ok(Response::new(proto::v1::DeleteBgpFilterResponse {}))
    }

    async fn list_bgp_filters(
        &self,
        _request: Request<proto::v1::ListBgpFiltersRequest>,
    ) -> Result<Response<proto::v1::ListBgpFiltersResponse>, Status> {
        let filters = Resources::new(&self.store()?)
            .list_bgp_filters()
            .await
            .map_err(convert::status)?;
        Ok(Response::new(proto::v1::ListBgpFiltersResponse {
            filters: filters
                .iter()
                .map(|(f, rev)| convert::filter_to(f, *rev))
                .collect(),
        }))
    }

    async fn list_bgp_peer_resources(
        &self,
        _request: Request<proto::v1::ListBgpPeerResourcesRequest>,
    ) -> Result<Response<proto::v1::ListBgpPeerResourcesResponse>, Status> {
        let peers = Resources::new(&self.store()?)
            .list_bgp_peers()
            .await
            .map_err(convert::status)?;
        Ok(Response::new(proto::v1::ListBgpPeerResourcesResponse {
            peers: peers.iter().map(|(p, _)| convert::bgp_peer_to(p)).collect(),
        }))
    }

    async fn get_filters(
        &self,
        request: Request<GetFiltersRequest>,
    ) -> Result<Response<GetFiltersResponse>, Status> {
        let req = request.into_inner();
        let peer = match req.peer.trim() {
            "" => None,
            p => Some(peer_ref(p)?),
        };
        let prefix = match (req.prefix.trim(), peer) {
            ("", _) => None,
            (_, None) => {
                return Err(Status::invalid_argument(
                    "prefix: needs a peer (the decisions are a peer's)",
                ));
            }
            (p, Some(_)) => Some(parse_prefix(p)?),
        };
        let policy = self.speaker.policy().await.map_err(status)?;
        let mut rules: Vec<FilterRule> = Vec::new();
        if let Some(f) = peer.and_then(|a| policy.peer_filters(a)) {
            // The peer's own rules come first: they are evaluated first.
            for (scope, list) in [
                (FilterScope::Import, &f.import),
                (FilterScope::ExportExternal, &f.export),
            ] {
                rules.extend(list.iter().map(|r| FilterRule {
                    scope: scope.into(),
                    r#match: r.describe_match(),
                    action: if r.accept { "accept" } else { "reject" }.into(),
                    reason: r.reason(),
                    filter: r.filter.clone(),
                }));
            }
        }
        rules.extend(
            [
                Scope::Import,
                Scope::ExportCluster,
                Scope::ExportExternal,
                Scope::Kernel,
            ]
            .into_iter()
            .flat_map(|scope| {
                policy.rules(scope).iter().map(move |r| FilterRule {
                    scope: scope_message(scope).into(),
                    r#match: r.describe_match(),
                    action: r.action.to_string(),
                    reason: r.reason.clone(),
                    filter: String::new(),
                })
            }),
        );
        let mut decisions = Vec::new();
        if let Some(a) = peer {
            let class = self
                .speaker
                .peers()
                .await
                .map_err(status)?
                .into_iter()
                .find(|p| p.spec.address == a)
                .map(|p| p.spec.class);
            let export_scope = match class {
                Some(bgp::policy::PeerClass::Cluster) => FilterScope::ExportCluster,
                _ => FilterScope::ExportExternal,
            };
            for d in self
                .speaker
                .explain_filters(a, prefix)
                .await
                .map_err(status)?
            {
                decisions.push(proto::v1::FilterDecision {
                    prefix: format!("{}/{}", d.prefix.addr(), d.prefix.prefix_len()),
                    scope: if d.import {
                        FilterScope::Import
                    } else {
                        export_scope
                    }
                    .into(),
                    action: if d.accept { "accept" } else { "reject" }.into(),
                    r#match: d.rule,
                    reason: d.reason,
                });
            }
        }
        Ok(Response::new(GetFiltersResponse { rules, decisions }))
    }
}

impl BgpService {
    /// The desired kernel state's routes, as the routes of a table.
    fn kernel_routes(&self, req: &ListRoutesRequest) -> Result<Response<RouteStream>, Status> {
        let filter = prefix_filter(&req.prefix)?;
        let (desired, _) = self.dataplane.current();
        let routes: Vec<proto::v1::Route> = desired
            .values()
            .filter_map(|item| match &item.item {
                Some(proto::v1::desired_item::Item::Route(r)) => Some(r),
                _ => None,
            })
            .filter(|r| {
                filter.is_none_or(|f| parse_prefix(&r.destination).is_ok_and(|p| f.contains(&p)))
            })
            .map(|r| proto::v1::Route {
                prefix: r.destination.clone(),
                next_hop: r.gateway.clone(),
                from_peer: r.source.clone(),
                best: true,
                kernel: kernel_text(r),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(route_stream(req, routes, Clone::clone)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_named_by_address_or_session_name_of_either_family() {
        let v4: IpAddr = "10.0.0.2".parse().unwrap();
        let v6: IpAddr = "fd99::2".parse().unwrap();
        for s in [
            "10.0.0.2",
            "peer_10_0_0_2",
            "Mesh_10_0_0_2",
            "Node_10_0_0_2_port_1790",
        ] {
            assert_eq!(peer_ref(s).unwrap(), v4, "{s}");
        }
        for s in ["fd99::2", "peer_fd99__2", "Global_fd99__2"] {
            assert_eq!(peer_ref(s).unwrap(), v6, "{s}");
        }
        // Mapped addresses are the IPv4 peer; link-local ones cannot be used.
        assert_eq!(peer_ref("::ffff:10.0.0.2").unwrap(), v4);
        assert!(peer_ref("fe80::1").is_err());
        assert!(peer_ref("peer_nonsense").is_err());
    }

    #[test]
    fn configuration_services_and_communities_convert_and_are_checked() {
        let mut m = config_message(&model::BgpConfiguration::default(), 0);
        m.service_cluster_cidrs = vec!["10.96.0.0/12".into()];
        m.service_external_cidrs = vec!["fd00:96::/112".into()];
        m.service_load_balancer_cidrs = vec!["192.0.2.0/24".into()];
        m.communities = vec![proto::v1::CommunityDef {
            name: "big".into(),
            value: "64512:1:2".into(),
        }];
        m.prefix_advertisements = vec![proto::v1::PrefixAdvertisement {
            cidr: "10.96.0.0/12".into(),
            communities: vec!["big".into(), "64512:7".into()],
        }];
        let c = config_from(&m).unwrap();
        assert_eq!(c.service_external_ips[0].to_string(), "fd00:96::/112");
        assert_eq!(config_message(&c, 0), m);
        let refusal = |change: &dyn Fn(&mut BgpConfiguration)| {
            let mut bad = m.clone();
            change(&mut bad);
            let e = config_from(&bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            e.message().to_owned()
        };
        let e = refusal(&|b| b.service_cluster_cidrs.push("10.100.0.0/16".into()));
        assert!(
            e.starts_with("invalid service_cluster_cidrs[1]: 10.100.0.0/16 overlaps"),
            "{e}"
        );
        let e = refusal(&|b| b.service_external_cidrs[0] = "fd00:96::1/112".into());
        assert!(e.starts_with("invalid service_external_cidrs[0]: "), "{e}");
        let e = refusal(&|b| b.service_load_balancer_cidrs[0] = "nonsense".into());
        assert!(
            e.starts_with("invalid service_load_balancer_cidrs[0]: "),
            "{e}"
        );
        let e = refusal(&|b| b.communities[0].value = "1:2:3:4".into());
        assert!(e.starts_with("invalid communities[0].value: "), "{e}");
        let e = refusal(&|b| b.prefix_advertisements[0].communities[0] = "small".into());
        assert!(
            e.starts_with("invalid prefix_advertisements[0].communities[0]: "),
            "{e}"
        );
    }

    #[test]
    fn families_are_checked() {
        assert_eq!(families(&[]).unwrap(), None);
        let f = families(&["ipv6".into(), " ipv4".into()]).unwrap().unwrap();
        assert!(f.ipv4 && f.ipv6);
        let e = families(&["ipx".into()]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("ipx"));
    }

    #[test]
    fn prefixes_of_either_family_filter_listings() {
        let p = |s: &str| parse_prefix(s).unwrap();
        assert!(p("10.0.0.0/8").contains(&p("10.1.0.0/16")));
        assert!(p("fd00::/8").contains(&p("fd10:1::/122")));
        assert!(!p("fd00::/8").contains(&p("10.1.0.0/16")));
        assert!(!p("10.1.0.0/16").contains(&p("10.0.0.0/8")));
        assert!(parse_prefix("10.0.0.1/33").is_err());
    }
}
