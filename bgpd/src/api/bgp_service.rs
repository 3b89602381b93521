//! The `Bgp` service: peers and their sessions, route tables, announcements. A thin adapter
//! over [`SpeakerHandle`]: it converts and validates, the speaker task owns the truth.
//! Cluster configuration and generated filters are not served yet (UNIMPLEMENTED).

use std::net::Ipv4Addr;
use std::pin::Pin;
use std::time::UNIX_EPOCH;

use bgp_wire::{Community, Ipv4Prefix};
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

use crate::bgp::fsm::State;
use crate::bgp::speaker::ListedRoute;
use crate::bgp::{Announcement, PeerSpec, PeerStatus, SpeakerError, SpeakerHandle, Table};

/// Routes per streamed message.
const BATCH: usize = 1000;

#[derive(Clone)]
pub struct BgpService {
    speaker: SpeakerHandle,
}

impl BgpService {
    pub fn new(speaker: SpeakerHandle) -> Self {
        Self { speaker }
    }
}

fn status(e: SpeakerError) -> Status {
    match e {
        SpeakerError::PeerExists(_) => Status::already_exists(e.to_string()),
        SpeakerError::NoPeer(_) | SpeakerError::NotAnnounced(_) => Status::not_found(e.to_string()),
        SpeakerError::Listen { .. } | SpeakerError::NoRouterId => {
            Status::failed_precondition(e.to_string())
        }
        SpeakerError::Stopped => Status::unavailable(e.to_string()),
    }
}

fn parse_addr(field: &str, s: &str) -> Result<Ipv4Addr, Status> {
    s.trim()
        .parse()
        .map_err(|_| Status::invalid_argument(format!("{field}: {s:?} is not an IPv4 address")))
}

fn parse_prefix(s: &str) -> Result<Ipv4Prefix, Status> {
    let net: ipnet::Ipv4Net = s.trim().parse().map_err(|_| {
        Status::invalid_argument(format!(
            "prefix: {s:?} is not an IPv4 prefix like 10.0.0.0/24"
        ))
    })?;
    Ipv4Prefix::new(net.network(), net.prefix_len())
        .ok_or_else(|| Status::invalid_argument(format!("prefix: {s:?} is not valid")))
}

/// Accepts a peer as its address or its name (`peer_10_0_0_2`).
fn peer_ref(s: &str) -> Result<Ipv4Addr, Status> {
    let t = s.trim();
    let t = t
        .strip_prefix("peer_")
        .map(|r| r.replace('_', "."))
        .unwrap_or_else(|| t.to_owned());
    parse_addr("peer", &t)
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
        origin: if spec.from_config {
            PeerOrigin::Config
        } else {
            PeerOrigin::Api
        }
        .into(),
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
        next_hop: a.next_hop.map(|n| n.to_string()).unwrap_or_default(),
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
    }
}

type RouteStream = Pin<Box<dyn Stream<Item = Result<ListRoutesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Bgp for BgpService {
    async fn get_configuration(
        &self,
        _request: Request<GetConfigurationRequest>,
    ) -> Result<Response<BgpConfiguration>, Status> {
        Err(Status::unimplemented(
            "BGP cluster configuration is not served yet",
        ))
    }

    async fn set_configuration(
        &self,
        _request: Request<SetConfigurationRequest>,
    ) -> Result<Response<BgpConfiguration>, Status> {
        Err(Status::unimplemented(
            "BGP cluster configuration is not served yet",
        ))
    }

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
        let mut spec = PeerSpec::new(address, bgp_wire::Asn(p.as_number));
        spec.passive = p.passive;
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
        let addr = peer_ref(&request.into_inner().peer)?;
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

    type ListRoutesStream = RouteStream;

    async fn list_routes(
        &self,
        request: Request<ListRoutesRequest>,
    ) -> Result<Response<Self::ListRoutesStream>, Status> {
        let req = request.into_inner();
        let table = match RouteTable::try_from(req.table).unwrap_or(RouteTable::Unspecified) {
            RouteTable::Unspecified | RouteTable::LocRib => Table::Loc,
            RouteTable::AdjRibIn => Table::AdjIn,
            RouteTable::AdjRibOut => Table::AdjOut,
            RouteTable::Kernel => {
                return Err(Status::unimplemented(
                    "the kernel table is served by the Dataplane service",
                ));
            }
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
        let filter = if req.prefix.trim().is_empty() {
            None
        } else {
            Some(parse_prefix(&req.prefix)?)
        };
        let mut routes = self.speaker.routes(table, peer).await.map_err(status)?;
        if let Some(f) = filter {
            routes.retain(|r| f.contains(&r.route.prefix));
        }
        if req.limit > 0 {
            routes.truncate(usize::try_from(req.limit).unwrap_or(usize::MAX));
        }
        let batches: Vec<Result<ListRoutesResponse, Status>> = routes
            .chunks(BATCH)
            .map(|c| {
                Ok(ListRoutesResponse {
                    routes: c.iter().map(route_message).collect(),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(batches))))
    }

    async fn announce_route(
        &self,
        request: Request<AnnounceRouteRequest>,
    ) -> Result<Response<AnnounceRouteResponse>, Status> {
        let req = request.into_inner();
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

    async fn get_filters(
        &self,
        _request: Request<GetFiltersRequest>,
    ) -> Result<Response<GetFiltersResponse>, Status> {
        Err(Status::unimplemented(
            "generated filters are not served yet",
        ))
    }
}
