//! The speaker task: owns the [`Rib`] and the set of peers, one session task per peer.
//!
//! Why this file is long: one task's event loop and the handlers of every command and
//! session message it takes, next to the types of its API ([`SpeakerHandle`], [`PeerSpec`]);
//! split, each handler would need the task's whole state (RIBs, peers, listeners).
//!
//! ```text
//!  API (SpeakerHandle) ──Command (bounded)──►┐
//!  listener task ──accepted TcpStream────────►│ speaker task: Rib, peers, status
//!  session tasks ──FromSession (bounded)─────►┘   │
//!                 ◄──ToSession (unbounded, see session.rs)──┘
//! ```
//!
//! **Job.** Start and stop session tasks as peers are added and deleted (from the
//! configuration or the API, without touching other sessions); hand accepted connections
//! to the session of their peer; feed UPDATEs into the RIB and distribute the resulting
//! Adj-RIB-Out changes; answer status and table queries.
//!
//! **Boundaries.** The only owner of the RIB: nothing else reads or writes it, so nothing
//! locks. Never awaits a session (sends to sessions cannot block).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::SystemTime;

use bgp_wire::{
    Asn, Community, Disposition, Family, Ipv4Prefix, Ipv6Prefix, NextHop, Origin, PathAttributes,
    Prefix, cease,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use std::sync::Arc;

use ipnet::IpNet;
use proto::v1 as pb;

use super::bfd::{BfdEvent, BfdHandle};
use super::mailbox;
pub use super::session::Families;
use super::session::{FromSession, Session, ToSession};
use super::sockopt::{self, Transport};
use bgp::fsm::{Fsm, FsmConfig, State};
use bgp::policy::{IfName, KernelVia, PeerClass, Policy};
use bgp::rib::{
    OutUpdate, PeerId, PeerInfo, PeerOptions, Rib, RibPrefix, Route, Source, next_hop_addr,
};

/// Depth of the speaker's inbound queues.
const QUEUE: usize = 1024;
/// Work the speaker does before it lets other tasks (the API) run.
const YIELD_AFTER: std::time::Duration = std::time::Duration::from_millis(2);

#[derive(Debug, thiserror::Error)]
pub enum SpeakerError {
    #[error("peer {0} already exists; delete it first")]
    PeerExists(IpAddr),
    #[error("no peer {0}")]
    NoPeer(String),
    #[error(
        "cannot listen for BGP on {addr}: {source}; is another BGP daemon running? set bgp.listen_port"
    )]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("this node has no BGP router id: set bgp.router_id or node.address")]
    NoRouterId,
    #[error("the BGP speaker has stopped")]
    Stopped,
    #[error("{0} is not announced by this node")]
    NotAnnounced(Prefix),
    #[error(
        "next hop {next_hop} cannot be used for {prefix}: give an IPv6 next hop for IPv6 routes"
    )]
    NextHopFamily { prefix: Prefix, next_hop: IpAddr },
}

/// Where a peer comes from; the cluster brain manages only its own kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerOrigin {
    Config,
    Api,
    /// Node-to-node mesh.
    Mesh,
    /// A reflector of ours, or a client of ours.
    RouteReflector,
    /// A `BGPPeer` resource.
    Resource,
}

impl PeerOrigin {
    /// Derived from the cluster state (and so removed when it changes).
    pub fn is_cluster(self) -> bool {
        matches!(
            self,
            PeerOrigin::Mesh | PeerOrigin::RouteReflector | PeerOrigin::Resource
        )
    }
}

/// How a peer was configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub address: IpAddr,
    pub asn: Asn,
    pub passive: bool,
    pub port: u16,
    pub hold_time: u16,
    pub keepalive: Option<u16>,
    pub origin: PeerOrigin,
    /// Which policy rules apply.
    pub class: PeerClass,
    /// A route-reflector client of this node.
    pub rr_client: bool,
    /// The operator's name for it; `peer_<address>` when unset.
    pub label: Option<String>,
    /// TCP MD5 password, GTSM, multihop TTL.
    pub transport: Transport,
    /// Most prefixes the peer may send (counted before policy, as BIRD's receive limit);
    /// above it the session stops with Cease/Maximum Number of Prefixes.
    pub max_prefixes: Option<u32>,
    /// Restart a session stopped by the limit after this many seconds; `None`: it stays down
    /// until the peer is changed or re-added.
    pub max_prefixes_restart: Option<u16>,
    /// Graceful restart (RFC 4724), both roles; `None`: off for this peer.
    pub graceful_restart: Option<GracefulRestart>,
    /// IPv4 and/or IPv6 unicast. IPv4 on an IPv6 session offers the extended next hop
    /// capability (RFC 8950); IPv6 on an IPv4 session uses the node's IPv6 address as our
    /// next hop.
    pub families: Families,
    /// The peer connects to us as well (another node of this cluster): a failed attempt is
    /// retried only after Calico's `connect retry time` (5 s), since the peer connects to
    /// us as soon as it starts.
    pub peer_connects: bool,
    /// Run BFD (RFC 5880; single-hop RFC 5881, or multihop RFC 5883 with `multihop_ttl`)
    /// with the peer: its session going Down takes the BGP session down at once.
    pub bfd: Option<bfd::SessionConfig>,
    /// `local as`, `allow local as`, `next hop self|keep` (the RIB applies them; the
    /// interface is filled in when the session comes up).
    pub options: PeerOptions,
    /// Seconds before a session starts again after an error, doubled per consecutive error
    /// from the first to the longest (BIRD's `error wait time`).
    pub error_wait: [u16; 2],
}

/// Graceful restart times of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GracefulRestart {
    /// The restart time we announce: how long the peer keeps our routes while we restart.
    pub restart_time: u16,
    /// How long we keep the peer's routes stale after it is back, waiting for its
    /// End-of-RIB.
    pub stale_time: u16,
}

impl Default for GracefulRestart {
    /// BIRD's and FRR's defaults: restart 120 s, stale path 360 s.
    fn default() -> Self {
        GracefulRestart {
            restart_time: 120,
            stale_time: 360,
        }
    }
}

/// Calico's `error wait time 5, 30` (confd's BIRD template): the first and longest wait
/// after a session error, seconds.
pub const DEFAULT_ERROR_WAIT: [u16; 2] = [5, 30];

/// Cease subcode "BFD Down" (RFC 9384).
const CEASE_BFD_DOWN: u8 = 10;

/// Warn when a peer reaches this share of its prefix limit.
const PREFIX_WARN_PERCENT: u64 = 75;

impl PeerSpec {
    pub fn new(address: impl Into<IpAddr>, asn: Asn) -> Self {
        // An IPv4-mapped IPv6 address is the IPv4 peer (its connections arrive as IPv4).
        let address = address.into().to_canonical();
        PeerSpec {
            address,
            families: Families::of(address),
            asn,
            passive: false,
            port: 179,
            hold_time: 240,
            keepalive: None,
            origin: PeerOrigin::Api,
            class: PeerClass::External,
            rr_client: false,
            label: None,
            transport: Transport::default(),
            max_prefixes: None,
            max_prefixes_restart: None,
            graceful_restart: Some(GracefulRestart::default()),
            peer_connects: false,
            bfd: None,
            options: PeerOptions::default(),
            error_wait: DEFAULT_ERROR_WAIT,
        }
    }

    /// The session FSM's settings for this peer, as this speaker (`local_as`, `router_id`)
    /// runs it.
    pub fn fsm_config(&self, local_as: Asn, router_id: Ipv4Addr) -> FsmConfig {
        let mut fc = FsmConfig::new(
            self.options.local_as.unwrap_or(local_as),
            router_id,
            self.asn,
        );
        fc.hold_time = self.hold_time;
        fc.keepalive = self.keepalive;
        fc.passive = self.passive;
        fc.idle_hold = std::time::Duration::from_secs(u64::from(self.error_wait[0]));
        fc.idle_hold_max = std::time::Duration::from_secs(u64::from(self.error_wait[1]));
        fc.connect_retry_max = std::time::Duration::from_secs(5);
        if self.peer_connects {
            // Both nodes of a pair connect, and each listens before it does: of two nodes
            // that start, the later one's attempt finds the other listening. So a refused
            // attempt (the peer is not listening yet) is retried only after 30 s, a safety
            // net: retried every 5 s it was refused again, or collided with the peer's own
            // attempt at its start (200 nodes starting: 24-37 k of 45-64 k connects were
            // refused, the slowest runs most; each of the 19.9 k pairs needs one connect).
            // Other failures (a timeout) are retried at Calico's BIRD `connect retry time 5`
            // (jittered).
            fc.connect_retry = fc.connect_retry_max;
            fc.refused_retry = Some(std::time::Duration::from_secs(30));
        } else {
            // A peer that does not connect to us is found only by retrying: soon at first,
            // every 0.5 s for 5 s (it is likely starting too; doubling at once left us
            // waiting up to 5 s for a peer that was ready after one), then backing off
            // (jittered) to Calico's BIRD `connect retry time 5`.
            fc.connect_retry = std::time::Duration::from_millis(500);
            fc.connect_retry_fast = 20;
        }
        fc.graceful_restart = self.graceful_restart.map(|g| g.restart_time);
        fc.families = self.families.list();
        fc.ext_next_hop = self.address.is_ipv6() && self.families.ipv4;
        let addr_bits = match self.address {
            IpAddr::V4(a) => u64::from(u32::from(a)),
            IpAddr::V6(a) => {
                let b = u128::from(a);
                (b as u64) ^ ((b >> 64) as u64)
            }
        };
        fc.jitter_seed = addr_bits ^ u64::from(u32::from(router_id)) << 32;
        fc
    }

    /// The name shown to operators, BIRD style (`Mesh_10_0_0_2`, `peer_192_0_2_1`).
    pub fn name(&self) -> String {
        match &self.label {
            Some(l) => l.clone(),
            None => format!("peer_{}", self.address.to_string().replace(['.', ':'], "_")),
        }
    }
}

/// A peer as operators see it.
#[derive(Debug, Clone)]
pub struct PeerStatus {
    pub spec: PeerSpec,
    pub state: State,
    pub since: SystemTime,
    pub last_error: Option<String>,
    pub remote_id: Option<Ipv4Addr>,
    pub received: u64,
    pub accepted: u64,
    pub advertised: u64,
    pub malformed: Malformed,
    /// The BFD session's state, when the peer runs BFD.
    pub bfd: Option<bfd::State>,
}

/// Malformed UPDATEs from a peer by RFC 7606 disposition, since the peer was added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Malformed {
    /// UPDATEs whose routes were treated as withdrawn.
    pub treat_as_withdraw: u64,
    /// Attributes discarded while the rest of their UPDATE stood.
    pub attribute_discard: u64,
    /// Messages that ended the session with a NOTIFICATION.
    pub session_reset: u64,
}

/// Which table to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Loc,
    AdjIn,
    AdjOut,
}

/// A route to announce from this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    pub prefix: Prefix,
    pub next_hop: Option<IpAddr>,
    pub communities: Vec<Community>,
}

impl Announcement {
    /// The attributes we originate it with; the next hop is set per peer unless given.
    fn attrs(&self) -> Result<PathAttributes, SpeakerError> {
        let mut attrs = PathAttributes {
            origin: Some(Origin::Igp),
            communities: self.communities.clone(),
            ..PathAttributes::default()
        };
        match (self.prefix, self.next_hop) {
            (_, None) => {}
            (Prefix::V4(_), Some(IpAddr::V4(a))) => attrs.next_hop = Some(a),
            (_, Some(IpAddr::V6(global))) => {
                attrs.mp_next_hop = Some(NextHop::V6 {
                    global,
                    link_local: None,
                })
            }
            (prefix @ Prefix::V6(_), Some(next_hop)) => {
                return Err(SpeakerError::NextHopFamily { prefix, next_hop });
            }
        }
        Ok(attrs)
    }
}

/// Which rule decided a prefix on a peer's session (`bgpctl show filters PEER [PREFIX]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterDecision {
    pub prefix: Prefix,
    /// Received from the peer (else: sent to it).
    pub import: bool,
    pub accept: bool,
    /// The deciding rule's match and reason.
    pub rule: String,
    pub reason: String,
}

/// A route with where it came from, for listings.
#[derive(Debug, Clone)]
pub struct ListedRoute {
    pub route: Route<Prefix>,
    pub from_peer: Option<IpAddr>,
    pub best: bool,
    /// Kept from before the peer's graceful restart, not refreshed yet.
    pub stale: bool,
}

enum Command {
    /// Peers added in one command: no connection is taken between two of them (a mesh
    /// node's peers connecting while it added them one by one were refused as unknown).
    AddPeers(
        Vec<PeerSpec>,
        oneshot::Sender<Vec<Result<(), SpeakerError>>>,
    ),
    DeletePeer(IpAddr, oneshot::Sender<Result<(), SpeakerError>>),
    ListPeers(oneshot::Sender<Vec<PeerStatus>>),
    /// How many routes the Loc-RIBs hold (within a prefix, if given).
    LocCount(Option<Prefix>, oneshot::Sender<usize>),
    Routes {
        table: Table,
        peer: Option<IpAddr>,
        reply: oneshot::Sender<Result<Vec<ListedRoute>, SpeakerError>>,
    },
    Announce(Announcement, oneshot::Sender<Result<(), SpeakerError>>),
    SetPolicy(Arc<Policy>, Option<Ipv4Addr>, oneshot::Sender<()>),
    GetPolicy(oneshot::Sender<Arc<Policy>>),
    ExplainFilters {
        peer: IpAddr,
        prefix: Option<Prefix>,
        reply: oneshot::Sender<Result<Vec<FilterDecision>, SpeakerError>>,
    },
    Reconfigure {
        local_as: Asn,
        listen_port: u16,
        reply: oneshot::Sender<Result<(), SpeakerError>>,
    },
    Withdraw(Prefix, oneshot::Sender<Result<(), SpeakerError>>),
    Accepted(TcpStream, SocketAddr),
    /// The wait after we stopped a session (prefix limit, BFD down) has passed.
    RestartStopped(IpAddr, PeerId),
    /// A graceful-restart timer of a peer ran out (restart time or stale-path time).
    GrExpired(IpAddr, PeerId, u64),
    /// Ask a peer to send its routes again.
    RequestRefresh {
        addr: IpAddr,
        outbound: bool,
        reply: oneshot::Sender<Result<(), SpeakerError>>,
    },
    /// bgpd is stopping: close every session (without NOTIFICATION where graceful restart
    /// is on, so that peers keep our routes until we are back).
    Shutdown(oneshot::Sender<()>),
}

/// A cloneable handle to the speaker task.
#[derive(Debug, Clone)]
pub struct SpeakerHandle {
    tx: mpsc::Sender<Command>,
    bfd: BfdHandle,
}

impl SpeakerHandle {
    /// The BFD task's packet counters (for the metrics).
    pub fn bfd_counters(&self) -> Arc<super::bfd::Counters> {
        self.bfd.counters.clone()
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, SpeakerError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .await
            .map_err(|_| SpeakerError::Stopped)?;
        rx.await.map_err(|_| SpeakerError::Stopped)
    }

    pub async fn add_peer(&self, spec: PeerSpec) -> Result<(), SpeakerError> {
        let address = spec.address;
        self.add_peers(vec![spec])
            .await?
            .pop()
            .unwrap_or(Err(SpeakerError::NoPeer(address.to_string())))
    }

    /// Add several peers at once; one result per peer, in order.
    pub async fn add_peers(
        &self,
        specs: Vec<PeerSpec>,
    ) -> Result<Vec<Result<(), SpeakerError>>, SpeakerError> {
        self.ask(|r| Command::AddPeers(specs, r)).await
    }

    pub async fn delete_peer(&self, address: IpAddr) -> Result<(), SpeakerError> {
        self.ask(|r| Command::DeletePeer(address, r)).await?
    }

    pub async fn peers(&self) -> Result<Vec<PeerStatus>, SpeakerError> {
        self.ask(Command::ListPeers).await
    }

    /// How many routes the Loc-RIBs hold (within a prefix, if given), counted in place: a
    /// listing copies every route.
    pub async fn loc_count(&self, within: Option<Prefix>) -> Result<usize, SpeakerError> {
        self.ask(|reply| Command::LocCount(within, reply)).await
    }

    pub async fn routes(
        &self,
        table: Table,
        peer: Option<IpAddr>,
    ) -> Result<Vec<ListedRoute>, SpeakerError> {
        self.ask(|reply| Command::Routes { table, peer, reply })
            .await?
    }

    pub async fn announce(&self, a: Announcement) -> Result<(), SpeakerError> {
        self.ask(|r| Command::Announce(a, r)).await?
    }

    pub async fn withdraw(&self, prefix: Prefix) -> Result<(), SpeakerError> {
        self.ask(|r| Command::Withdraw(prefix, r)).await?
    }

    /// Apply a new policy, and be a route reflector with `cluster_id` (or not); no session
    /// is reset.
    pub async fn set_policy(
        &self,
        policy: Arc<Policy>,
        cluster_id: Option<Ipv4Addr>,
    ) -> Result<(), SpeakerError> {
        self.ask(|r| Command::SetPolicy(policy, cluster_id, r))
            .await
    }

    /// Ask a peer to send its routes again (ROUTE-REFRESH; with enhanced route refresh,
    /// routes it does not re-advertise are removed), or with `outbound` send it ours again.
    pub async fn refresh(&self, addr: IpAddr, outbound: bool) -> Result<(), SpeakerError> {
        self.ask(|reply| Command::RequestRefresh {
            addr,
            outbound,
            reply,
        })
        .await?
    }

    /// Close every session for bgpd's exit (gracefully where graceful restart is on).
    pub async fn shutdown(&self) -> Result<(), SpeakerError> {
        self.ask(Command::Shutdown).await
    }

    /// For peer `peer`, the rule that decides each prefix it sends us and each we send it
    /// (or only `prefix`, in both directions).
    pub async fn explain_filters(
        &self,
        peer: IpAddr,
        prefix: Option<Prefix>,
    ) -> Result<Vec<FilterDecision>, SpeakerError> {
        self.ask(|reply| Command::ExplainFilters {
            peer,
            prefix,
            reply,
        })
        .await?
    }

    /// The policy in force.
    pub async fn policy(&self) -> Result<Arc<Policy>, SpeakerError> {
        self.ask(Command::GetPolicy).await
    }

    /// Change the local AS or the listen port: every session restarts (its OPEN changes),
    /// which is why the caller does it only when one of them changed.
    pub async fn reconfigure(&self, local_as: Asn, listen_port: u16) -> Result<(), SpeakerError> {
        self.ask(|reply| Command::Reconfigure {
            local_as,
            listen_port,
            reply,
        })
        .await?
    }
}

/// Speaker-wide settings.
#[derive(Clone)]
pub struct SpeakerConfig {
    pub local_as: Asn,
    pub router_id: Ipv4Addr,
    /// Where to listen; bound when the first peer is added (port 0: never listen). With the
    /// unspecified IPv4 address, IPv6 is listened on as well (`[::]`, IPv6 only).
    pub listen: SocketAddr,
    /// The node's IPv6 address: our next hop for IPv6 routes on IPv4 sessions (without
    /// it, the IPv4-mapped address of the session, as FRR does).
    pub ipv6_next_hop: Option<Ipv6Addr>,
    /// Told the kernel routes the policy derives from the Loc-RIB.
    pub kernel: Option<Arc<dyn KernelSink>>,
}

/// Receives the BGP part of the desired kernel state.
pub trait KernelSink: Send + Sync {
    /// Routes to add or replace (`Some`) or remove (`None`), by destination. With `replace`
    /// the list is the whole BGP part (what is not in it goes).
    fn bgp_routes(&self, changes: Vec<(IpNet, Option<pb::DesiredItem>)>, replace: bool);
}

struct PeerEntry {
    spec: PeerSpec,
    id: PeerId,
    tx: mailbox::Sender<ToSession>,
    state: State,
    since: SystemTime,
    last_error: Option<String>,
    remote_id: Option<Ipv4Addr>,
    /// The Established period the RIB holds routes for, if any.
    epoch: Option<u64>,
    /// The families negotiated in that period.
    up: Families,
    /// Families the peer's graceful restart covers (routes kept through its restart).
    gr_families: Families,
    /// We stopped its session (prefix limit passed, BFD down): a new one starts only at
    /// `Command::RestartStopped` (after `max_prefixes_restart`, or the error wait), if ever.
    stopped: bool,
    /// The prefix-limit warning was logged for this session.
    limit_warned: bool,
    /// Bumped by every event that makes a pending graceful-restart timer moot.
    gr_token: u64,
    malformed: Malformed,
    /// The peer's BFD session state (Down until it reports otherwise).
    bfd_state: bfd::State,
}

/// A listening socket and its accept task.
struct Listener {
    task: tokio::task::JoinHandle<()>,
    /// For per-peer MD5 keys (accepted connections inherit them).
    fd: Option<std::os::fd::OwnedFd>,
    ipv6: bool,
}

struct Speaker {
    config: SpeakerConfig,
    /// One RIB per family; a peer is in the RIB of each family its session negotiated.
    rib: Rib<Ipv4Prefix>,
    rib6: Rib<Ipv6Prefix>,
    peers: BTreeMap<IpAddr, PeerEntry>,
    by_id: BTreeMap<PeerId, IpAddr>,
    next_id: u32,
    /// The running listeners (IPv4, and IPv6 where it can be bound), to rebind when the
    /// port changes.
    listeners: Vec<Listener>,
    self_tx: mpsc::Sender<Command>,
    from_sessions: mpsc::Sender<FromSession>,
    /// Prefixes the kernel sink holds a route for (told to it, not withdrawn since).
    in_kernel: hashbrown::HashSet<Prefix>,
    /// The BFD task (it opens its sockets with the first BFD peer).
    bfd: BfdHandle,
}

/// One family's part of [`Speaker::explain`]: every prefix `id` sent us and every
/// Loc-RIB prefix (or only `only`, if of this family), with the deciding rule.
fn explain_family<P: RibPrefix>(
    rib: &Rib<P>,
    id: PeerId,
    spec: &PeerSpec,
    only: Option<Prefix>,
) -> Vec<FilterDecision> {
    let peer = rib.peer_ref(id).unwrap_or(bgp::policy::PeerRef {
        class: spec.class,
        address: spec.address,
        interface: None,
    });
    let (imports, exports): (Vec<P>, Vec<P>) = match only {
        Some(want) => match P::from_any(want) {
            Some(p) => (vec![p], vec![p]),
            None => return Vec::new(),
        },
        None => (
            rib.adj_in(id).into_iter().map(|r| r.prefix).collect(),
            rib.loc_rib().map(|r| r.prefix).collect(),
        ),
    };
    let decision = |p: P, import: bool, v: bgp::policy::Verdict<'_>| {
        let (rule, reason) = v.describe();
        FilterDecision {
            prefix: p.any(),
            import,
            accept: v.accept,
            rule,
            reason,
        }
    };
    let mut out: Vec<FilterDecision> = imports
        .into_iter()
        .map(|p| decision(p, true, rib.explain_import(&peer, &p)))
        .collect();
    out.extend(exports.into_iter().map(|p| {
        let mut d = decision(p, false, rib.explain_export(&peer, &p));
        if rib.best(&p).is_none() {
            d.reason
                .push_str(" (no route for it here: judged as one originated here)");
        }
        d
    }));
    out
}

/// The RIBs of a speaker in AS `local_as`.
fn new_ribs(config: &SpeakerConfig, local_as: Asn) -> (Rib<Ipv4Prefix>, Rib<Ipv6Prefix>) {
    let mut rib = Rib::new(local_as, config.router_id);
    let mut rib6 = Rib::new(local_as, config.router_id);
    if config.kernel.is_some() {
        rib.track_loc_changes();
        rib6.track_loc_changes();
    }
    (rib, rib6)
}

/// Start the speaker task; peers and announcements are added through the handle.
pub fn start(config: SpeakerConfig) -> SpeakerHandle {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (stx, srx) = mpsc::channel(QUEUE);
    let (rib, rib6) = new_ribs(&config, config.local_as);
    let (bfd, bfd_events) = super::bfd::start();
    let speaker = Speaker {
        rib,
        rib6,
        config,
        peers: BTreeMap::new(),
        by_id: BTreeMap::new(),
        next_id: 1,
        listeners: Vec::new(),
        self_tx: tx.clone(),
        from_sessions: stx,
        in_kernel: hashbrown::HashSet::default(),
        bfd: bfd.clone(),
    };
    tokio::spawn(speaker.run(rx, srx, bfd_events));
    SpeakerHandle { tx, bfd }
}

impl Speaker {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut sessions: mpsc::Receiver<FromSession>,
        mut bfd_events: mpsc::Receiver<BfdEvent>,
    ) {
        // When the task last let others run: see below.
        let mut ran_since = tokio::time::Instant::now();
        loop {
            // Unbiased: a peer flooding UPDATEs must not starve API calls (`show protocols`
            // answered in a second rather than at once, as measured by bgp_bench).
            tokio::select! {
                Some(m) = sessions.recv() => {
                    self.session_message(m);
                    // tokio's cooperative budget yields only after 128 messages, tens of
                    // milliseconds of RIB work during a table load, while the API's tasks
                    // wait for a worker thread (bgp_bench saw +-50 ms answers). Yield
                    // after 2 ms of work instead.
                    if ran_since.elapsed() > YIELD_AFTER {
                        tokio::task::yield_now().await;
                        ran_since = tokio::time::Instant::now();
                    }
                }
                cmd = commands.recv() => match cmd {
                    Some(c) => self.command(c).await,
                    None => break,
                },
                Some(e) = bfd_events.recv() => self.bfd_event(e),
            }
        }
        for p in self.peers.values() {
            let _ = p.tx.send(ToSession::Stop {
                subcode: cease::ADMIN_SHUTDOWN,
                reason: "bgpd stopping".into(),
            });
        }
    }

    async fn command(&mut self, c: Command) {
        match c {
            Command::AddPeers(specs, reply) => {
                let mut results = Vec::with_capacity(specs.len());
                for spec in specs {
                    results.push(self.add_peer(spec).await);
                }
                let _ = reply.send(results);
            }
            Command::DeletePeer(addr, reply) => {
                let _ = reply.send(self.delete_peer(addr));
            }
            Command::ListPeers(reply) => {
                let v = self
                    .peers
                    .values()
                    .map(|p| {
                        let (r4, a4, o4) = self.rib.counts(p.id);
                        let (r6, a6, o6) = self.rib6.counts(p.id);
                        let (received, accepted, advertised) = (r4 + r6, a4 + a6, o4 + o6);
                        PeerStatus {
                            spec: p.spec.clone(),
                            state: p.state,
                            since: p.since,
                            last_error: p.last_error.clone(),
                            remote_id: p.remote_id,
                            received,
                            accepted,
                            advertised,
                            malformed: p.malformed,
                            bfd: p.spec.bfd.map(|_| p.bfd_state),
                        }
                    })
                    .collect();
                let _ = reply.send(v);
            }
            Command::LocCount(within, reply) => {
                let _ = reply.send(self.rib.loc_count(within) + self.rib6.loc_count(within));
            }
            Command::Routes { table, peer, reply } => {
                let _ = reply.send(self.list(table, peer));
            }
            Command::ExplainFilters {
                peer,
                prefix,
                reply,
            } => {
                let _ = reply.send(self.explain(peer, prefix));
            }
            Command::SetPolicy(policy, cluster_id, reply) => {
                // The kernel is told everything once, after both families: the policy may
                // change what is programmed even where no best route changed.
                let out = self.rib.set_policy(policy.clone(), cluster_id);
                self.send_updates(out);
                let out = self.rib6.set_policy(policy, cluster_id);
                self.send_updates(out);
                self.publish_kernel(true);
                let _ = reply.send(());
            }
            Command::GetPolicy(reply) => {
                let _ = reply.send(self.rib.policy().clone());
            }
            Command::Reconfigure {
                local_as,
                listen_port,
                reply,
            } => {
                let _ = reply.send(self.reconfigure(local_as, listen_port).await);
            }
            Command::Announce(a, reply) => {
                let r = a.attrs().map(|attrs| match a.prefix {
                    Prefix::V4(p) => {
                        let out = self.rib.announce(p, attrs);
                        self.distribute(out);
                    }
                    Prefix::V6(p) => {
                        let out = self.rib6.announce(p, attrs);
                        self.distribute(out);
                    }
                });
                let _ = reply.send(r);
            }
            Command::Withdraw(prefix, reply) => {
                let done = match prefix {
                    Prefix::V4(p) => self.rib.withdraw(p).map(|out| self.distribute(out)),
                    Prefix::V6(p) => self.rib6.withdraw(p).map(|out| self.distribute(out)),
                };
                let r = done.ok_or(SpeakerError::NotAnnounced(prefix));
                let _ = reply.send(r);
            }
            Command::RequestRefresh {
                addr,
                outbound,
                reply,
            } => {
                let r = match self.peers.get(&addr) {
                    Some(p) if outbound => {
                        if let Some(epoch) = p.epoch {
                            for family in p.up.list() {
                                self.send_refresh(p, epoch, family);
                            }
                        }
                        Ok(())
                    }
                    Some(p) => {
                        let _ = p.tx.send(ToSession::RequestRefresh);
                        Ok(())
                    }
                    None => Err(SpeakerError::NoPeer(addr.to_string())),
                };
                let _ = reply.send(r);
            }
            Command::GrExpired(addr, id, token) => {
                let Some(p) = self.peers.get(&addr) else {
                    return;
                };
                if p.id != id || p.gr_token != token || !self.has_stale(id) {
                    return;
                }
                tracing::info!(peer = %addr, "graceful restart time ran out: stale routes removed");
                self.sweep_stale(id, None);
            }
            Command::Shutdown(reply) => {
                for p in self.peers.values() {
                    // AdminDown tells BFD peers this is no path failure, so graceful restart
                    // keeps its routes (RFC 5882 §3.2).
                    if p.spec.bfd.is_some() {
                        self.bfd.remove(p.spec.address);
                    }
                    let m = if p.spec.graceful_restart.is_some() {
                        ToSession::Shutdown
                    } else {
                        ToSession::Stop {
                            subcode: cease::ADMIN_SHUTDOWN,
                            reason: "bgpd stopping".into(),
                        }
                    };
                    let _ = p.tx.send(m);
                }
                let _ = reply.send(());
            }
            Command::RestartStopped(addr, id) => {
                let Some(p) = self.peers.get(&addr) else {
                    return;
                };
                if p.id != id || !p.stopped {
                    return;
                }
                let tx = self.spawn_session(id, &p.spec);
                if let Some(p) = self.peers.get_mut(&addr) {
                    p.tx = tx;
                    p.stopped = false;
                    p.limit_warned = false;
                    tracing::info!(peer = %addr, after = ?p.last_error, "restarting the session we stopped");
                }
            }
            Command::Accepted(stream, from) => {
                match self.peers.get_mut(&from.ip().to_canonical()) {
                    Some(p) => {
                        use std::os::fd::AsFd;
                        // GTSM: judge the peer by its SYN, before any of its data is read.
                        if let (_, Some(min)) = p.spec.transport.ttls()
                            && let Ok(Some(ttl)) = sockopt::syn_ttl(stream.as_fd())
                            && ttl < min
                        {
                            p.last_error = Some(format!(
                                "refused a connection from {from} with TTL {ttl}: TTL security (GTSM) wants at least {min}"
                            ));
                            tracing::info!(%from, ttl, min, "connection refused by TTL security");
                            return;
                        }
                        if let Err(e) = p.spec.transport.apply_ttls(stream.as_fd(), from.is_ipv6())
                        {
                            tracing::warn!(%from, error = %e, "cannot set TTLs on an accepted connection; refused");
                            return;
                        }
                        let _ = p.tx.send(ToSession::Incoming(Box::new(stream)));
                    }
                    None => tracing::info!(%from, "connection from an unknown peer refused"),
                }
            }
        }
    }

    fn explain(
        &self,
        peer: IpAddr,
        prefix: Option<Prefix>,
    ) -> Result<Vec<FilterDecision>, SpeakerError> {
        let p = self
            .peers
            .get(&peer)
            .ok_or_else(|| SpeakerError::NoPeer(peer.to_string()))?;
        let mut out = explain_family(&self.rib, p.id, &p.spec, prefix);
        out.extend(explain_family(&self.rib6, p.id, &p.spec, prefix));
        Ok(out)
    }

    fn list(&self, table: Table, peer: Option<IpAddr>) -> Result<Vec<ListedRoute>, SpeakerError> {
        let peer_id = match (table, peer) {
            (Table::Loc, _) => None,
            (_, Some(a)) => Some(
                self.peers
                    .get(&a)
                    .map(|p| p.id)
                    .ok_or_else(|| SpeakerError::NoPeer(a.to_string()))?,
            ),
            (_, None) => return Err(SpeakerError::NoPeer("(none given)".into())),
        };
        let mut routes = self.list_family(&self.rib, table, peer_id);
        routes.extend(self.list_family(&self.rib6, table, peer_id));
        Ok(routes)
    }

    /// One family's part of a listing.
    fn list_family<P: RibPrefix>(
        &self,
        rib: &Rib<P>,
        table: Table,
        peer_id: Option<PeerId>,
    ) -> Vec<ListedRoute> {
        let addr_of = |id: PeerId| self.by_id.get(&id).copied();
        let any = |r: Route<P>| Route {
            prefix: r.prefix.any(),
            source: r.source,
            attrs: r.attrs,
        };
        match (table, peer_id) {
            (Table::Loc, _) | (_, None) => rib
                .loc_rib()
                .map(|r| {
                    let (from_peer, stale) = match r.source {
                        Source::Peer(id) => (addr_of(id), rib.is_stale(id, &r.prefix)),
                        Source::Local => (None, false),
                    };
                    ListedRoute {
                        route: any(r),
                        from_peer,
                        best: true,
                        stale,
                    }
                })
                .collect(),
            (Table::AdjIn, Some(id)) => rib
                .adj_in(id)
                .into_iter()
                .map(|r| {
                    let best = rib.best(&r.prefix).is_some_and(|(s, _)| s == r.source);
                    let stale = rib.is_stale(id, &r.prefix);
                    ListedRoute {
                        route: any(r),
                        from_peer: addr_of(id),
                        best,
                        stale,
                    }
                })
                .collect(),
            (Table::AdjOut, Some(id)) => rib
                .adj_out(id)
                .into_iter()
                .map(|r| ListedRoute {
                    route: any(r),
                    from_peer: None,
                    best: true,
                    stale: false,
                })
                .collect(),
        }
    }

    async fn ensure_listening(&mut self) -> Result<(), SpeakerError> {
        if !self.listeners.is_empty() || self.config.listen.port() == 0 {
            return Ok(());
        }
        let addr = self.config.listen;
        let listener = bind(addr).map_err(|source| SpeakerError::Listen { addr, source })?;
        self.spawn_listener(listener, addr.is_ipv6());
        tracing::info!(%addr, "BGP listening");
        if addr.ip() == IpAddr::V4(Ipv4Addr::UNSPECIFIED) {
            // IPv6 peers too; a host without IPv6 only loses them.
            let addr6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, addr.port()));
            match bind(addr6) {
                Ok(l) => {
                    self.spawn_listener(l, true);
                    tracing::info!(addr = %addr6, "BGP listening");
                }
                Err(e) => {
                    tracing::warn!(addr = %addr6, error = %e, "cannot listen for BGP on IPv6; IPv6 peers must connect out")
                }
            }
        }
        let specs: Vec<PeerSpec> = self.peers.values().map(|p| p.spec.clone()).collect();
        for spec in &specs {
            self.listener_key(spec, true);
        }
        Ok(())
    }

    fn spawn_listener(&mut self, listener: TcpListener, ipv6: bool) {
        use std::os::fd::AsFd;
        let fd = listener.as_fd().try_clone_to_owned().ok();
        if let Err(e) = sockopt::save_syns(listener.as_fd()) {
            tracing::warn!(error = %e, "cannot keep SYNs: TTL security (GTSM) is checked only after a connection's first bytes");
        }
        let tx = self.self_tx.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((s, from)) => {
                        if tx.send(Command::Accepted(s, from)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "BGP accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        });
        self.listeners.push(Listener { task, fd, ipv6 });
    }

    async fn add_peer(&mut self, spec: PeerSpec) -> Result<(), SpeakerError> {
        if self.peers.contains_key(&spec.address) {
            return Err(SpeakerError::PeerExists(spec.address));
        }
        if self.config.router_id.is_unspecified() {
            return Err(SpeakerError::NoRouterId);
        }
        self.ensure_listening().await?;
        let id = PeerId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        self.listener_key(&spec, true);
        let tx = self.spawn_session(id, &spec);
        if let Some(c) = spec.bfd {
            self.bfd
                .add(spec.address, c, spec.transport.multihop_ttl.is_some());
        }
        tracing::info!(peer = %spec.address, asn = %spec.asn, passive = spec.passive, "BGP peer added");
        self.by_id.insert(id, spec.address);
        self.peers.insert(
            spec.address,
            PeerEntry {
                spec,
                id,
                tx,
                state: State::Idle,
                since: SystemTime::now(),
                last_error: None,
                remote_id: None,
                epoch: None,
                up: Families::NONE,
                gr_families: Families::NONE,
                stopped: false,
                limit_warned: false,
                gr_token: 0,
                malformed: Malformed::default(),
                bfd_state: bfd::State::Down,
            },
        );
        Ok(())
    }

    /// Start the session task of a peer.
    fn spawn_session(&self, id: PeerId, spec: &PeerSpec) -> mailbox::Sender<ToSession> {
        let fc = spec.fsm_config(self.config.local_as, self.config.router_id);
        let (tx, rx) = mailbox::mailbox();
        let remote = SocketAddr::new(spec.address, spec.port);
        let session = Session::new(id, remote, Fsm::new(fc), self.from_sessions.clone())
            .with_transport(spec.transport.clone());
        tokio::spawn(session.run(rx));
        tx
    }

    /// In `secs`, sweep the peer's stale routes unless something happened since (`token`).
    /// Start a new session for a peer whose session we stopped, `secs` from now.
    fn restart_later(&self, addr: IpAddr, id: PeerId, secs: u16) {
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(u64::from(secs))).await;
            let _ = tx.send(Command::RestartStopped(addr, id)).await;
        });
    }

    fn gr_timer(&self, addr: IpAddr, id: PeerId, token: u64, secs: u16) {
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(u64::from(secs))).await;
            let _ = tx.send(Command::GrExpired(addr, id, token)).await;
        });
    }

    /// After an UPDATE: warn near the peer's prefix limit, stop the session above it. The
    /// limit applies to each family (BIRD's per-channel receive limit).
    fn check_prefix_limit(&mut self, id: PeerId) {
        let held = self.rib.adj_in_len(id).max(self.rib6.adj_in_len(id)) as u64;
        let Some(addr) = self.by_id.get(&id).copied() else {
            return;
        };
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        let Some(max) = p.spec.max_prefixes.map(u64::from) else {
            return;
        };
        if held > max {
            let restart = p.spec.max_prefixes_restart;
            let reason = format!(
                "maximum prefixes exceeded: {held} received, limit {max}; {}",
                match restart {
                    Some(s) => format!("restarting in {s} s"),
                    None => "the session stays down until the peer is reconfigured".into(),
                }
            );
            tracing::warn!(peer = %addr, held, max, "{reason}");
            let _ = p.tx.send(ToSession::Stop {
                subcode: cease::MAX_PREFIXES,
                reason: reason.as_str().into(),
            });
            p.stopped = true;
            p.epoch = None;
            p.last_error = Some(reason);
            if let Some(s) = restart {
                self.restart_later(addr, id, s);
            }
            self.peer_down(id, Families::NONE);
        } else if !p.limit_warned && held * 100 >= max * PREFIX_WARN_PERCENT {
            p.limit_warned = true;
            tracing::warn!(peer = %addr, held, max, "peer is at {PREFIX_WARN_PERCENT}% of its prefix limit");
        }
    }

    /// Install (or remove) a peer's MD5 key on the listening socket.
    fn listener_key(&self, spec: &PeerSpec, install: bool) {
        let Some(p) = spec.transport.password.as_ref() else {
            return;
        };
        use std::os::fd::AsFd;
        let key = install.then(|| p.as_bytes());
        for l in &self.listeners {
            let Some(fd) = l.fd.as_ref().filter(|_| l.ipv6 == spec.address.is_ipv6()) else {
                continue;
            };
            if let Err(e) = sockopt::set_md5(fd.as_fd(), spec.address, key) {
                tracing::warn!(peer = %spec.address, error = %e, "cannot set the TCP MD5 key on the BGP listener");
            }
        }
    }

    async fn reconfigure(&mut self, local_as: Asn, listen_port: u16) -> Result<(), SpeakerError> {
        if listen_port != self.config.listen.port() {
            if !self.listeners.is_empty() {
                for l in self.listeners.drain(..) {
                    l.task.abort();
                }
                // Let the aborted tasks drop their sockets before binding the new port.
                tokio::task::yield_now().await;
            }
            self.config.listen.set_port(listen_port);
            if !self.peers.is_empty() {
                self.ensure_listening().await?;
            }
            tracing::info!(port = listen_port, "BGP listen port changed");
        }
        if local_as != self.config.local_as {
            let specs: Vec<PeerSpec> = self.peers.values().map(|p| p.spec.clone()).collect();
            for s in &specs {
                let _ = self.delete_peer(s.address);
            }
            let (mut rib, mut rib6) = new_ribs(&self.config, local_as);
            let _ = rib.set_policy(self.rib.policy().clone(), self.rib.cluster_id());
            let _ = rib6.set_policy(self.rib.policy().clone(), self.rib.cluster_id());
            for (prefix, attrs) in self.rib.local_routes() {
                let _ = rib.announce(prefix, attrs);
            }
            for (prefix, attrs) in self.rib6.local_routes() {
                let _ = rib6.announce(prefix, attrs);
            }
            self.rib = rib;
            self.rib6 = rib6;
            self.config.local_as = local_as;
            self.publish_kernel(true);
            for s in specs {
                self.add_peer(s).await?;
            }
            tracing::info!(asn = %local_as, "local AS changed; sessions restarted");
        }
        Ok(())
    }

    /// Tell the kernel sink what changed in the Loc-RIBs (everything, with `replace`).
    fn publish_kernel(&mut self, replace: bool) {
        let Some(sink) = self.config.kernel.clone() else {
            return;
        };
        let changed: Vec<Prefix> = (self.rib.take_loc_changes().into_iter().map(Prefix::V4))
            .chain(self.rib6.take_loc_changes().into_iter().map(Prefix::V6))
            .collect();
        if !replace && self.in_kernel.is_empty() && !self.rib.policy().programs_any() {
            // Nothing is programmed and nothing can be: no route to look at (a full table
            // from a peer whose routes policy keeps out of the kernel costs nothing here).
            return;
        }
        let prefixes: Vec<Prefix> = if replace {
            (self.rib.loc_rib().map(|r| r.prefix.any()))
                .chain(self.rib6.loc_rib().map(|r| r.prefix.any()))
                .collect()
        } else {
            changed
        };
        if prefixes.is_empty() && !replace {
            return;
        }
        let items: Vec<(Prefix, Option<pb::DesiredItem>)> = prefixes
            .into_iter()
            .map(|p| (p, self.kernel_item(p)))
            .collect();
        if replace {
            self.in_kernel.clear();
        }
        // Only prefixes that have, or had, a kernel route are the sink's business: a best
        // route that changed but is not programmed (policy) costs the sink nothing.
        let mut changes = Vec::with_capacity(items.len());
        for (p, item) in items {
            let was = if item.is_some() {
                !self.in_kernel.insert(p)
            } else {
                self.in_kernel.remove(&p)
            };
            if item.is_none() && (replace || !was) {
                continue;
            }
            let Ok(net) = IpNet::new(p.addr(), p.prefix_len()) else {
                continue;
            };
            changes.push((net, item));
        }
        if changes.is_empty() && !replace {
            return;
        }
        sink.bgp_routes(changes, replace);
    }

    /// The kernel route the policy derives from the best route for `p`, if any.
    fn kernel_item(&self, p: Prefix) -> Option<pb::DesiredItem> {
        let (src, attrs) = match p {
            Prefix::V4(q) => self.rib.best(&q)?,
            Prefix::V6(q) => self.rib6.best(&q)?,
        };
        let Source::Peer(q) = src else { return None };
        let next_hop = next_hop_addr(attrs)?;
        // routewriter programs each family via a gateway of its own family: an IPv4 route
        // via an IPv6 next hop (RFC 8950) stays out of the kernel table rather than be
        // refused there.
        if p.addr().is_ipv4() != next_hop.is_ipv4() {
            return None;
        }
        let (via, reason) =
            self.rib
                .policy()
                .kernel(p, self.rib.route_source(src), Some(next_hop))?;
        let from = self
            .by_id
            .get(&q)
            .and_then(|a| self.peers.get(a))
            .map(|e| e.spec.name())
            .unwrap_or_default();
        let (kind, onlink) = match via {
            KernelVia::NextHop => (pb::RouteKind::Gateway, false),
            KernelVia::Ipip => (pb::RouteKind::Ipip, true),
        };
        Some(pb::DesiredItem {
            item: Some(pb::desired_item::Item::Route(pb::KernelRoute {
                destination: format!("{}/{}", p.addr(), p.prefix_len()),
                kind: kind.into(),
                gateway: next_hop.to_string(),
                device: String::new(),
                onlink,
                source: format!("bgp from {from} ({reason})"),
            })),
        })
    }

    /// Whether the peer has routes kept through a graceful restart, in any family.
    fn has_stale(&self, id: PeerId) -> bool {
        self.rib.has_stale(id) || self.rib6.has_stale(id)
    }

    /// Drop the peer's stale routes of one family (its End-of-RIB) or all.
    fn sweep_stale(&mut self, id: PeerId, family: Option<Family>) {
        if family.is_none_or(|f| f == Family::IPV4_UNICAST) {
            let out = self.rib.sweep_stale(id);
            self.distribute(out);
        }
        if family.is_none_or(|f| f == Family::IPV6_UNICAST) {
            let out = self.rib6.sweep_stale(id);
            self.distribute(out);
        }
    }

    /// The peer's session ended: its routes of the families in `keep` stay, marked stale
    /// (graceful restart), the others leave every table. Returns how many are kept.
    fn peer_down(&mut self, id: PeerId, keep: Families) -> usize {
        let mut kept = 0;
        if keep.ipv4 {
            kept += self.rib.peer_down_graceful(id);
        } else {
            let out = self.rib.peer_down(id);
            self.distribute(out);
        }
        if keep.ipv6 {
            kept += self.rib6.peer_down_graceful(id);
        } else {
            let out = self.rib6.peer_down(id);
            self.distribute(out);
        }
        kept
    }

    /// Send a peer its Adj-RIB-Out of `family` again.
    fn send_refresh(&self, p: &PeerEntry, epoch: u64, family: Family) {
        let update = if family == Family::IPV6_UNICAST {
            Ipv6Prefix::family_update(self.rib6.refresh(p.id))
        } else {
            Ipv4Prefix::family_update(self.rib.refresh(p.id))
        };
        let _ = p.tx.send(ToSession::Refresh {
            epoch,
            update: Box::new(update),
        });
    }

    /// A BFD session changed state. Down after Up: the forwarding path to the peer is gone,
    /// so its BGP session goes down at once, its routes withdrawn (not kept stale: graceful
    /// restart protects a restarting control plane, not a dead link), and a new session
    /// starts after the peer's error wait, as BIRD does (`bgp_update_startup_delay`): a
    /// session brought up again at once over a path BFD just found dead would bring the
    /// routes back with it, and flap with every BFD failure.
    fn bfd_event(&mut self, e: BfdEvent) {
        let Some(p) = self.peers.get_mut(&e.peer) else {
            return;
        };
        let was = std::mem::replace(&mut p.bfd_state, e.state);
        // A peer that stops BFD on purpose (AdminDown) is no failure (RFC 5882 §3.2).
        if was != bfd::State::Up
            || e.state == bfd::State::Up
            || e.remote_state == bfd::State::AdminDown
            || p.spec.bfd.is_none()
        {
            return;
        }
        let reason = format!("BFD session down: {}", e.diag.text());
        tracing::warn!(peer = %e.peer, bgp_state = ?p.state, "{reason}: BGP session reset");
        let _ = p.tx.send(ToSession::Stop {
            subcode: CEASE_BFD_DOWN,
            reason: reason.as_str().into(),
        });
        p.epoch = None;
        p.gr_token = p.gr_token.wrapping_add(1);
        p.last_error = Some(reason);
        p.stopped = true;
        let (id, wait) = (p.id, p.spec.error_wait[0]);
        self.peer_down(id, Families::NONE);
        self.restart_later(e.peer, id, wait);
    }

    fn delete_peer(&mut self, addr: IpAddr) -> Result<(), SpeakerError> {
        let p = self
            .peers
            .remove(&addr)
            .ok_or_else(|| SpeakerError::NoPeer(addr.to_string()))?;
        self.by_id.remove(&p.id);
        self.listener_key(&p.spec, false);
        if p.spec.bfd.is_some() {
            self.bfd.remove(addr);
        }
        let _ = p.tx.send(ToSession::Stop {
            subcode: cease::PEER_DECONFIGURED,
            reason: "peer deleted".into(),
        });
        self.peer_down(p.id, Families::NONE);
        tracing::info!(peer = %addr, "BGP peer deleted");
        Ok(())
    }

    fn session_message(&mut self, m: FromSession) {
        match m {
            FromSession::State {
                id,
                state,
                since,
                last_error,
            } => {
                if let Some(p) = self.entry(id) {
                    p.state = state;
                    p.since = since;
                    if last_error.is_some() {
                        p.last_error = last_error;
                    }
                }
            }
            FromSession::Up {
                id,
                epoch,
                remote_id,
                local_address,
                families,
                peer_ext_next_hop,
                peer_restart_time,
                peer_gr_families,
            } => {
                let ipv6_next_hop = self.config.ipv6_next_hop;
                let Some(p) = self.entry(id) else { return };
                p.epoch = Some(epoch);
                p.up = families;
                let Families { ipv4, ipv6 } = families;
                // Families whose stale routes may wait for End-of-RIB: in the restarted
                // peer's capability with forwarding preserved (RFC 4724 §4.2).
                let preserved = |f: Family| {
                    peer_restart_time.is_some() && peer_gr_families.contains(&(f, true))
                };
                let wait = Families {
                    ipv4: ipv4 && preserved(Family::IPV4_UNICAST),
                    ipv6: ipv6 && preserved(Family::IPV6_UNICAST),
                };
                let gr = |f: Family| peer_gr_families.iter().any(|(g, _)| *g == f);
                p.gr_families = Families {
                    ipv4: gr(Family::IPV4_UNICAST),
                    ipv6: gr(Family::IPV6_UNICAST),
                };
                p.remote_id = Some(remote_id);
                p.gr_token = p.gr_token.wrapping_add(1);
                let (token, addr) = (p.gr_token, p.spec.address);
                let stale_time = p.spec.graceful_restart.map_or(0, |g| g.stale_time);
                let (next_hop_v4, next_hop_v6) = own_next_hops(
                    local_address,
                    p.spec.address,
                    peer_ext_next_hop,
                    ipv6_next_hop,
                );
                if ipv4 && next_hop_v4.is_none() {
                    tracing::warn!(peer = %addr, "IPv4 negotiated on an IPv6 session, but the peer did not offer the extended next hop capability: no IPv4 routes are sent to it");
                }
                if ipv6 && local_address.is_ipv4() && ipv6_next_hop.is_none() {
                    tracing::warn!(peer = %addr, "IPv6 routes on an IPv4 session get the IPv4-mapped next hop, which most peers refuse: set node.address6");
                }
                let info = PeerInfo {
                    id,
                    address: p.spec.address,
                    asn: p.spec.asn,
                    router_id: remote_id,
                    next_hop_v4: next_hop_v4.filter(|_| ipv4),
                    next_hop_v6: next_hop_v6.filter(|_| ipv6),
                    // Kept before the family filter: an IPv6 session carrying only IPv4
                    // still has our link-local address on its link.
                    local_link_local: match next_hop_v6 {
                        Some(NextHop::V6 { link_local, .. }) => link_local,
                        _ => None,
                    },
                    class: p.spec.class,
                    rr_client: p.spec.rr_client,
                    options: PeerOptions {
                        interface: super::iface::interface_of(local_address)
                            .and_then(|n| IfName::new(&n)),
                        ..p.spec.options
                    },
                };
                let tx = p.tx.clone();
                if ipv4 {
                    let update = Ipv4Prefix::family_update(self.rib.peer_up(info));
                    let _ = tx.send(ToSession::Routes {
                        epoch,
                        update: Box::new(update),
                    });
                }
                if ipv6 {
                    let update = Ipv6Prefix::family_update(self.rib6.peer_up(info));
                    let _ = tx.send(ToSession::Routes {
                        epoch,
                        update: Box::new(update),
                    });
                }
                let _ = tx.send(ToSession::EndOfRib { epoch });
                // Back from its restart: stale routes of the families it preserved stay until
                // its End-of-RIB, at most the stale-path time; the others go now.
                if self.rib.has_stale(id) && !wait.ipv4 {
                    self.sweep_stale(id, Some(Family::IPV4_UNICAST));
                }
                if self.rib6.has_stale(id) && !wait.ipv6 {
                    self.sweep_stale(id, Some(Family::IPV6_UNICAST));
                }
                if self.has_stale(id) {
                    self.gr_timer(addr, id, token, stale_time);
                }
            }
            FromSession::Down {
                id,
                epoch,
                graceful,
            } => {
                let Some(p) = self.entry(id) else { return };
                if p.epoch != Some(epoch) {
                    return;
                }
                p.epoch = None;
                p.gr_token = p.gr_token.wrapping_add(1);
                let (token, addr) = (p.gr_token, p.spec.address);
                match graceful.filter(|_| p.spec.graceful_restart.is_some()) {
                    Some(restart_time) => {
                        // Only the families its capability names are kept (RFC 4724 §4.2).
                        let keep = p.gr_families;
                        let kept = self.peer_down(id, keep);
                        tracing::info!(peer = %addr, kept, restart_time, "peer restarting gracefully: its routes are kept stale");
                        self.gr_timer(addr, id, token, restart_time);
                    }
                    None => {
                        self.peer_down(id, Families::NONE);
                    }
                }
            }
            FromSession::RefreshMarker {
                id,
                epoch,
                family,
                begin,
            } => {
                let Some(p) = self.entry(id) else { return };
                if p.epoch != Some(epoch) {
                    return;
                }
                let v6 = family == Family::IPV6_UNICAST;
                if begin {
                    // What the peer does not re-advertise before EoRR is gone (RFC 7313 §4).
                    if v6 {
                        self.rib6.begin_refresh(id);
                    } else {
                        self.rib.begin_refresh(id);
                    }
                } else {
                    self.sweep_stale(id, Some(family));
                }
            }
            FromSession::MalformedReset { id } => {
                if let Some(p) = self.entry(id) {
                    p.malformed.session_reset = p.malformed.session_reset.saturating_add(1);
                }
            }
            FromSession::EndOfRib { id, epoch, family } => {
                let Some(p) = self.entry(id) else { return };
                if p.epoch != Some(epoch) {
                    return;
                }
                self.sweep_stale(id, Some(family));
                // The stale-path timer stays for families whose End-of-RIB is still due.
                if !self.has_stale(id)
                    && let Some(p) = self.entry(id)
                {
                    p.gr_token = p.gr_token.wrapping_add(1);
                }
            }
            FromSession::Update { id, epoch, update } => {
                let Some(p) = self.entry(id) else { return };
                if p.epoch != Some(epoch) {
                    return;
                }
                let update = *update;
                let (mut withdrawn, mut withdrawn6) =
                    split_families(update.update.withdrawn_routes());
                let bgp_wire::Update {
                    attributes,
                    nlri,
                    mp_reach,
                    ..
                } = update.update;
                p.malformed.attribute_discard = p
                    .malformed
                    .attribute_discard
                    .saturating_add(update.discarded.len() as u64);
                if !update.discarded.is_empty() {
                    tracing::info!(peer = %p.spec.address, discarded = ?update.discarded, "attributes discarded (RFC 7606)");
                }
                let mut routes = Announced::of(attributes, nlri, mp_reach);
                if let Disposition::TreatAsWithdraw(problems) = &update.disposition {
                    p.malformed.treat_as_withdraw = p.malformed.treat_as_withdraw.saturating_add(1);
                    tracing::warn!(peer = %p.spec.address, ?problems, "UPDATE treated as withdraw (RFC 7606)");
                    withdrawn.append(&mut routes.v4);
                    withdrawn.append(&mut routes.mp_v4);
                    withdrawn6.append(&mut routes.v6);
                    routes = Announced::default();
                }
                if !routes.v4.is_empty() || !withdrawn.is_empty() {
                    let out = self.rib.update(id, routes.attrs, &routes.v4, &withdrawn);
                    self.distribute(out);
                }
                if !routes.mp_v4.is_empty() {
                    let out = self
                        .rib
                        .update(id, routes.mp_attrs.clone(), &routes.mp_v4, &[]);
                    self.distribute(out);
                }
                if !routes.v6.is_empty() || !withdrawn6.is_empty() {
                    let out = self
                        .rib6
                        .update(id, routes.mp_attrs, &routes.v6, &withdrawn6);
                    self.distribute(out);
                }
                self.check_prefix_limit(id);
            }
            FromSession::Refresh { id, epoch, family } => {
                let Some(p) = self.by_id.get(&id).and_then(|a| self.peers.get(a)) else {
                    return;
                };
                if p.epoch == Some(epoch) {
                    self.send_refresh(p, epoch, family);
                }
            }
        }
    }

    fn entry(&mut self, id: PeerId) -> Option<&mut PeerEntry> {
        let addr = self.by_id.get(&id)?;
        self.peers.get_mut(addr)
    }

    /// Tell the kernel sink and the peers what a RIB operation changed.
    fn distribute<P: RibPrefix>(&mut self, out: hashbrown::HashMap<PeerId, OutUpdate<P>>) {
        self.publish_kernel(false);
        self.send_updates(out);
    }

    /// Hand each peer's changes to its session.
    fn send_updates<P: RibPrefix>(&self, out: hashbrown::HashMap<PeerId, OutUpdate<P>>) {
        for (id, update) in out {
            let update = P::family_update(update);
            let Some(addr) = self.by_id.get(&id) else {
                continue;
            };
            let Some(p) = self.peers.get(addr) else {
                continue;
            };
            if let Some(epoch) = p.epoch {
                let _ = p.tx.send(ToSession::Routes {
                    epoch,
                    update: Box::new(update),
                });
            }
        }
    }
}

/// Prefixes of an UPDATE by family.
fn split_families(prefixes: impl Iterator<Item = Prefix>) -> (Vec<Ipv4Prefix>, Vec<Ipv6Prefix>) {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for p in prefixes {
        match p {
            Prefix::V4(p) => v4.push(p),
            Prefix::V6(p) => v6.push(p),
        }
    }
    (v4, v6)
}

/// The routes an UPDATE announces, with the attributes to store them with: NEXT_HOP applies
/// to the classic NLRI field only, MP_REACH_NLRI's next hop to its own routes (RFC 4760
/// §3), so each part gets its own copy of the next hop.
#[derive(Debug, Default, PartialEq)]
struct Announced {
    attrs: Option<PathAttributes>,
    /// The classic NLRI field.
    v4: Vec<Ipv4Prefix>,
    /// Attributes of the MP_REACH_NLRI routes, with its next hop.
    mp_attrs: Option<PathAttributes>,
    /// IPv4 routes in MP_REACH_NLRI (an IPv4 next hop, or IPv6 per RFC 8950).
    mp_v4: Vec<Ipv4Prefix>,
    v6: Vec<Ipv6Prefix>,
}

impl Announced {
    fn of(attrs: PathAttributes, nlri: Vec<Ipv4Prefix>, reach: Option<bgp_wire::MpReach>) -> Self {
        let Some(reach) = reach else {
            return Announced {
                attrs: Some(attrs),
                v4: nlri,
                ..Announced::default()
            };
        };
        // A copy only when the UPDATE carries both kinds (rare).
        let (classic, mut mp) = if nlri.is_empty() {
            (None, attrs)
        } else {
            (Some(attrs.clone()), attrs)
        };
        let mut a = Announced {
            attrs: classic,
            v4: nlri,
            ..Announced::default()
        };
        match reach.next_hop {
            NextHop::V4(nh) => {
                mp.next_hop = Some(nh);
                mp.mp_next_hop = None;
            }
            v6 => {
                mp.next_hop = None;
                mp.mp_next_hop = Some(v6);
            }
        }
        match reach.nlri {
            bgp_wire::MpNlri::Ipv4(v) => a.mp_v4 = v,
            bgp_wire::MpNlri::Ipv6(v) => a.v6 = v,
        }
        a.mp_attrs = Some(mp);
        a
    }
}

/// Our next hops on a session from our address on it: for IPv4 routes (our IPv4 address,
/// or our IPv6 one where the peer takes it, RFC 8950) and for IPv6 routes (our IPv6
/// address, with the link-local address of the same interface when the peer is on that
/// link, RFC 2545 §3, as BIRD and FRR send; on an IPv4 session the node's IPv6 address,
/// else the IPv4-mapped one).
///
/// IPv4 routes get the global address alone: FRR without interface knowledge (no zebra)
/// treats a link-local next hop as an error, and the global one is what RFC 8950 needs.
fn own_next_hops(
    local: IpAddr,
    peer: IpAddr,
    peer_ext_next_hop: bool,
    node_v6: Option<Ipv6Addr>,
) -> (Option<NextHop>, Option<NextHop>) {
    match local {
        IpAddr::V4(a) => (
            Some(NextHop::V4(a)),
            Some(NextHop::V6 {
                global: node_v6.unwrap_or(a.to_ipv6_mapped()),
                link_local: None,
            }),
        ),
        IpAddr::V6(global) => {
            let link_local = match peer {
                IpAddr::V6(p) => super::iface::link_local_toward(global, p),
                IpAddr::V4(_) => None,
            };
            let own = NextHop::V6 { global, link_local };
            let global_only = NextHop::V6 {
                global,
                link_local: None,
            };
            (peer_ext_next_hop.then_some(global_only), Some(own))
        }
    }
}

/// A listener with a real backlog (BIRD 1.6's 8 drops SYNs in a mesh) and SO_REUSEADDR.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if addr.is_ipv6() {
        // IPv4 peers have their own listener.
        use std::os::fd::AsFd;
        sockopt::set_v6only(socket.as_fd())?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bgp_wire::{MpNlri, MpReach};

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn the_error_wait_time_is_the_sessions_idle_hold() {
        use bgp::fsm::{Action, Event, Timer};
        let mut spec = PeerSpec::new(Ipv4Addr::new(10, 0, 0, 2), Asn(65000));
        spec.error_wait = [2, 7];
        let fc = spec.fsm_config(Asn(64512), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(
            (fc.idle_hold, fc.idle_hold_max),
            (
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(7)
            )
        );
        // Consecutive errors double the wait from the first to the longest.
        let mut fsm = Fsm::new(fc);
        let mut holds = Vec::new();
        let _ = fsm.handle(Event::Start);
        for _ in 0..4 {
            let _ = fsm.handle(Event::Connected);
            for a in fsm.handle(Event::ConnectionClosed) {
                if let Action::StartTimer(Timer::IdleHold, d) = a {
                    holds.push(d.as_secs());
                }
            }
            let _ = fsm.handle(Event::TimerExpired(Timer::IdleHold));
        }
        assert_eq!(holds, [2, 4, 7, 7]);
    }

    /// The ConnectRetry intervals of a peer's first `n` attempts that end with `failure`.
    fn retries(spec: &PeerSpec, n: usize, failure: bgp::fsm::Event) -> Vec<std::time::Duration> {
        use bgp::fsm::{Action, Event, Timer};
        let mut fsm = Fsm::new(spec.fsm_config(Asn(64512), Ipv4Addr::new(10, 0, 0, 1)));
        let mut out = Vec::new();
        let mut actions = fsm.handle(Event::Start);
        while out.len() < n {
            assert!(actions.contains(&Action::Connect), "{actions:?}");
            actions = fsm.handle(failure.clone());
            let d = actions.iter().find_map(|a| match a {
                Action::StartTimer(Timer::ConnectRetry, d) => Some(*d),
                _ => None,
            });
            out.push(d.expect("a failed attempt is retried"));
            actions = fsm.handle(Event::TimerExpired(Timer::ConnectRetry));
        }
        out
    }

    #[test]
    fn a_node_that_connects_to_us_is_retried_slowly_a_router_soon() {
        use bgp::fsm::Event;
        use std::time::Duration;
        let mut node = PeerSpec::new(Ipv4Addr::new(10, 0, 0, 2), Asn(64512));
        node.peer_connects = true;
        let r = retries(&node, 30, Event::ConnectionFailed);
        assert!(
            r.iter()
                .all(|d| (Duration::from_millis(3750)..=Duration::from_secs(5)).contains(d)),
            "{r:?}"
        );
        // Jittered: nodes refused together do not all come back together.
        assert!(r.windows(2).any(|w| w[0] != w[1]), "{r:?}");
        // Refused: the node is not listening yet, and connects to us once it does.
        let r = retries(&node, 30, Event::ConnectionRefused);
        assert!(
            r.iter()
                .all(|d| (Duration::from_millis(22_500)..=Duration::from_secs(30)).contains(d)),
            "{r:?}"
        );
        assert!(r.windows(2).any(|w| w[0] != w[1]), "{r:?}");
        let router = PeerSpec::new(Ipv4Addr::new(192, 0, 2, 1), Asn(65000));
        for failure in [Event::ConnectionFailed, Event::ConnectionRefused] {
            let r = retries(&router, 30, failure);
            // Every 0.5 s for 5 s (a refused attempt and the retry after it are two timer
            // starts), then doubling to 5 s.
            let (fast, slow) = r.split_at(10);
            assert!(
                fast.iter().all(|d| *d <= Duration::from_millis(500)),
                "{r:?}"
            );
            let slow_range = Duration::from_millis(501)..=Duration::from_secs(5);
            assert!(slow.iter().all(|d| slow_range.contains(d)), "{r:?}");
            assert!(
                slow.last().unwrap() >= &Duration::from_millis(3750),
                "{r:?}"
            );
        }
    }

    #[test]
    fn mp_reach_next_hops_go_with_the_routes_of_their_family() {
        let base = PathAttributes {
            origin: Some(Origin::Igp),
            next_hop: Some(Ipv4Addr::new(10, 0, 0, 2)),
            ..PathAttributes::default()
        };
        let nh6 = NextHop::V6 {
            global: v6("fd99::2"),
            link_local: Some(v6("fe80::2")),
        };
        let classic: Vec<Ipv4Prefix> = vec!["10.1.0.0/24".parse().unwrap()];
        // IPv6 routes beside classic IPv4 ones: each family its own next hop.
        let reach = MpReach {
            next_hop: nh6,
            nlri: MpNlri::Ipv6(vec!["fd20::/122".parse().unwrap()]),
        };
        let a = Announced::of(base.clone(), classic.clone(), Some(reach));
        assert_eq!(a.attrs.unwrap().next_hop, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(a.v4, classic);
        let mp = a.mp_attrs.unwrap();
        assert_eq!((mp.next_hop, mp.mp_next_hop), (None, Some(nh6)));
        assert_eq!(a.v6.len(), 1);
        // IPv4 routes with an IPv6 next hop (RFC 8950), even beside a classic NEXT_HOP:
        // that applies to the NLRI field only (RFC 4760 §3).
        let reach = MpReach {
            next_hop: nh6,
            nlri: MpNlri::Ipv4(vec!["10.20.1.0/24".parse().unwrap()]),
        };
        let a = Announced::of(base.clone(), classic.clone(), Some(reach));
        assert_eq!(a.mp_v4.len(), 1);
        let mp = a.mp_attrs.unwrap();
        assert_eq!((mp.next_hop, mp.mp_next_hop), (None, Some(nh6)));
        assert_eq!(a.attrs.unwrap().next_hop, base.next_hop);
        // Only MP routes: the classic part is empty and the attributes are not copied.
        let reach = MpReach {
            next_hop: NextHop::V4(Ipv4Addr::new(10, 0, 0, 9)),
            nlri: MpNlri::Ipv4(vec!["10.30.0.0/24".parse().unwrap()]),
        };
        let a = Announced::of(base, vec![], Some(reach));
        assert!(a.attrs.is_none() && a.v4.is_empty());
        assert_eq!(
            a.mp_attrs.unwrap().next_hop,
            Some(Ipv4Addr::new(10, 0, 0, 9))
        );
    }

    #[test]
    fn own_next_hops_follow_the_session_family() {
        let a4 = Ipv4Addr::new(10, 0, 0, 1);
        // IPv4 session: IPv4 next hop; IPv6 routes via the node's IPv6 address, else mapped.
        assert_eq!(
            own_next_hops(IpAddr::V4(a4), IpAddr::V4(a4), false, Some(v6("fd99::1"))),
            (
                Some(NextHop::V4(a4)),
                Some(NextHop::V6 {
                    global: v6("fd99::1"),
                    link_local: None
                })
            )
        );
        assert_eq!(
            own_next_hops(IpAddr::V4(a4), IpAddr::V4(a4), false, None).1,
            Some(NextHop::V6 {
                global: v6("::ffff:10.0.0.1"),
                link_local: None
            })
        );
        // IPv6 session (loopback has no link-local): IPv4 routes only with RFC 8950.
        let lo = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let (n4, n6) = own_next_hops(lo, lo, false, None);
        assert_eq!(n4, None);
        assert_eq!(
            n6,
            Some(NextHop::V6 {
                global: Ipv6Addr::LOCALHOST,
                link_local: None
            })
        );
        let (n4, _) = own_next_hops(lo, lo, true, None);
        assert_eq!(n4, n6);
    }

    #[test]
    fn announcements_check_the_next_hop_family() {
        let a = Announcement {
            prefix: "fd10::/122".parse::<Ipv6Prefix>().unwrap().into(),
            next_hop: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
            communities: vec![],
        };
        assert!(matches!(a.attrs(), Err(SpeakerError::NextHopFamily { .. })));
        let a = Announcement {
            next_hop: Some(IpAddr::V6(v6("fd99::7"))),
            ..a
        };
        assert_eq!(
            a.attrs().unwrap().mp_next_hop,
            Some(NextHop::V6 {
                global: v6("fd99::7"),
                link_local: None
            })
        );
    }
}
