//! The speaker task: owns the [`Rib`] and the set of peers, one session task per peer.
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

use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasherDefault;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::SystemTime;

use bgp_wire::{Asn, Community, Disposition, Ipv4Prefix, Origin, PathAttributes, Prefix, cease};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net};
use proto::v1 as pb;

use super::fsm::{Fsm, FsmConfig, State};
use super::policy::{KernelVia, PeerClass, Policy};
use super::rib::{OutUpdate, PeerId, PeerInfo, PrefixHasher, Rib, Route, Source};
use super::session::{FromSession, Session, ToSession};
use super::sockopt::{self, Transport};

/// Depth of the speaker's inbound queues.
const QUEUE: usize = 1024;
/// Work the speaker does before it lets other tasks (the API) run.
const YIELD_AFTER: std::time::Duration = std::time::Duration::from_millis(2);

#[derive(Debug, thiserror::Error)]
pub enum SpeakerError {
    #[error("peer {0} already exists; delete it first")]
    PeerExists(Ipv4Addr),
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
    NotAnnounced(Ipv4Prefix),
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
    pub address: Ipv4Addr,
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

/// Warn when a peer reaches this share of its prefix limit.
const PREFIX_WARN_PERCENT: u64 = 75;

impl PeerSpec {
    pub fn new(address: Ipv4Addr, asn: Asn) -> Self {
        PeerSpec {
            address,
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
        }
    }

    /// The name shown to operators, BIRD style (`Mesh_10_0_0_2`, `peer_192_0_2_1`).
    pub fn name(&self) -> String {
        match &self.label {
            Some(l) => l.clone(),
            None => format!("peer_{}", self.address.to_string().replace('.', "_")),
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
    pub prefix: Ipv4Prefix,
    pub next_hop: Option<Ipv4Addr>,
    pub communities: Vec<Community>,
}

/// A route with where it came from, for listings.
#[derive(Debug, Clone)]
pub struct ListedRoute {
    pub route: Route,
    pub from_peer: Option<Ipv4Addr>,
    pub best: bool,
    /// Kept from before the peer's graceful restart, not refreshed yet.
    pub stale: bool,
}

enum Command {
    AddPeer(PeerSpec, oneshot::Sender<Result<(), SpeakerError>>),
    DeletePeer(Ipv4Addr, oneshot::Sender<Result<(), SpeakerError>>),
    ListPeers(oneshot::Sender<Vec<PeerStatus>>),
    Routes {
        table: Table,
        peer: Option<Ipv4Addr>,
        reply: oneshot::Sender<Result<Vec<ListedRoute>, SpeakerError>>,
    },
    Announce(Announcement, oneshot::Sender<()>),
    SetPolicy(Arc<Policy>, Option<Ipv4Addr>, oneshot::Sender<()>),
    GetPolicy(oneshot::Sender<Arc<Policy>>),
    Reconfigure {
        local_as: Asn,
        listen_port: u16,
        reply: oneshot::Sender<Result<(), SpeakerError>>,
    },
    Withdraw(Ipv4Prefix, oneshot::Sender<Result<(), SpeakerError>>),
    Accepted(TcpStream, SocketAddr),
    /// The restart time after a prefix-limit stop has passed.
    RestartAfterLimit(Ipv4Addr, PeerId),
    /// A graceful-restart timer of a peer ran out (restart time or stale-path time).
    GrExpired(Ipv4Addr, PeerId, u64),
    /// Ask a peer to send its routes again.
    RequestRefresh {
        addr: Ipv4Addr,
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
}

impl SpeakerHandle {
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
        self.ask(|r| Command::AddPeer(spec, r)).await?
    }

    pub async fn delete_peer(&self, address: Ipv4Addr) -> Result<(), SpeakerError> {
        self.ask(|r| Command::DeletePeer(address, r)).await?
    }

    pub async fn peers(&self) -> Result<Vec<PeerStatus>, SpeakerError> {
        self.ask(Command::ListPeers).await
    }

    pub async fn routes(
        &self,
        table: Table,
        peer: Option<Ipv4Addr>,
    ) -> Result<Vec<ListedRoute>, SpeakerError> {
        self.ask(|reply| Command::Routes { table, peer, reply })
            .await?
    }

    pub async fn announce(&self, a: Announcement) -> Result<(), SpeakerError> {
        self.ask(|r| Command::Announce(a, r)).await
    }

    pub async fn withdraw(&self, prefix: Ipv4Prefix) -> Result<(), SpeakerError> {
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
    pub async fn refresh(&self, addr: Ipv4Addr, outbound: bool) -> Result<(), SpeakerError> {
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
    /// Where to listen; bound when the first peer is added (port 0: never listen).
    pub listen: SocketAddr,
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
    tx: mpsc::UnboundedSender<ToSession>,
    state: State,
    since: SystemTime,
    last_error: Option<String>,
    remote_id: Option<Ipv4Addr>,
    /// The Established period the RIB holds routes for, if any.
    epoch: Option<u64>,
    /// The peer passed its prefix limit: its session is stopped (restarted later if
    /// configured).
    limit_hit: bool,
    /// The prefix-limit warning was logged for this session.
    limit_warned: bool,
    /// Bumped by every event that makes a pending graceful-restart timer moot.
    gr_token: u64,
    malformed: Malformed,
}

struct Speaker {
    config: SpeakerConfig,
    rib: Rib,
    peers: BTreeMap<Ipv4Addr, PeerEntry>,
    by_id: BTreeMap<PeerId, Ipv4Addr>,
    next_id: u32,
    /// The running listener task, to rebind when the port changes.
    listener: Option<tokio::task::JoinHandle<()>>,
    /// The listening socket, for per-peer MD5 keys (accepted connections inherit them).
    listener_fd: Option<std::os::fd::OwnedFd>,
    self_tx: mpsc::Sender<Command>,
    from_sessions: mpsc::Sender<FromSession>,
    /// Prefixes the kernel sink holds a route for (told to it, not withdrawn since).
    in_kernel: HashSet<Ipv4Prefix, BuildHasherDefault<PrefixHasher>>,
}

/// Start the speaker task; peers and announcements are added through the handle.
pub fn start(config: SpeakerConfig) -> SpeakerHandle {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (stx, srx) = mpsc::channel(QUEUE);
    let mut rib = Rib::new(config.local_as, config.router_id);
    if config.kernel.is_some() {
        rib.track_loc_changes();
    }
    let speaker = Speaker {
        rib,
        config,
        peers: BTreeMap::new(),
        by_id: BTreeMap::new(),
        next_id: 1,
        listener: None,
        listener_fd: None,
        self_tx: tx.clone(),
        from_sessions: stx,
        in_kernel: HashSet::default(),
    };
    tokio::spawn(speaker.run(rx, srx));
    SpeakerHandle { tx }
}

impl Speaker {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut sessions: mpsc::Receiver<FromSession>,
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
            Command::AddPeer(spec, reply) => {
                let _ = reply.send(self.add_peer(spec).await);
            }
            Command::DeletePeer(addr, reply) => {
                let _ = reply.send(self.delete_peer(addr));
            }
            Command::ListPeers(reply) => {
                let v = self
                    .peers
                    .values()
                    .map(|p| {
                        let (received, accepted, advertised) = self.rib.counts(p.id);
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
                        }
                    })
                    .collect();
                let _ = reply.send(v);
            }
            Command::Routes { table, peer, reply } => {
                let _ = reply.send(self.list(table, peer));
            }
            Command::SetPolicy(policy, cluster_id, reply) => {
                let out = self.rib.set_policy(policy, cluster_id);
                self.distribute(out);
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
                let attrs = PathAttributes {
                    origin: Some(Origin::Igp),
                    next_hop: a.next_hop,
                    communities: a.communities,
                    ..PathAttributes::default()
                };
                let out = self.rib.announce(a.prefix, attrs);
                self.distribute(out);
                let _ = reply.send(());
            }
            Command::Withdraw(prefix, reply) => {
                let r = match self.rib.withdraw(prefix) {
                    Some(out) => {
                        self.distribute(out);
                        Ok(())
                    }
                    None => Err(SpeakerError::NotAnnounced(prefix)),
                };
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
                            let update = self.rib.refresh(p.id);
                            let _ = p.tx.send(ToSession::Refresh { epoch, update });
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
                if p.id != id || p.gr_token != token || !self.rib.has_stale(id) {
                    return;
                }
                tracing::info!(peer = %addr, "graceful restart time ran out: stale routes removed");
                let out = self.rib.sweep_stale(id);
                self.distribute(out);
            }
            Command::Shutdown(reply) => {
                for p in self.peers.values() {
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
            Command::RestartAfterLimit(addr, id) => {
                let Some(p) = self.peers.get(&addr) else {
                    return;
                };
                if p.id != id || !p.limit_hit {
                    return;
                }
                let tx = self.spawn_session(id, &p.spec);
                if let Some(p) = self.peers.get_mut(&addr) {
                    p.tx = tx;
                    p.limit_hit = false;
                    p.limit_warned = false;
                }
                tracing::info!(peer = %addr, "restarting the session after its prefix limit");
            }
            Command::Accepted(stream, from) => {
                let SocketAddr::V4(v4) = from else { return };
                match self.peers.get_mut(v4.ip()) {
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
                        if let Err(e) = p.spec.transport.apply_ttls(stream.as_fd(), false) {
                            tracing::warn!(%from, error = %e, "cannot set TTLs on an accepted connection; refused");
                            return;
                        }
                        let _ = p.tx.send(ToSession::Incoming(stream));
                    }
                    None => tracing::info!(%from, "connection from an unknown peer refused"),
                }
            }
        }
    }

    fn list(&self, table: Table, peer: Option<Ipv4Addr>) -> Result<Vec<ListedRoute>, SpeakerError> {
        let addr_of = |id: PeerId| self.by_id.get(&id).copied();
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
        let routes = match (table, peer_id) {
            (Table::Loc, _) | (_, None) => self
                .rib
                .loc_rib()
                .map(|r| {
                    let (from_peer, stale) = match r.source {
                        super::rib::Source::Peer(id) => {
                            (addr_of(id), self.rib.is_stale(id, &r.prefix))
                        }
                        super::rib::Source::Local => (None, false),
                    };
                    ListedRoute {
                        route: r,
                        from_peer,
                        best: true,
                        stale,
                    }
                })
                .collect(),
            (Table::AdjIn, Some(id)) => self
                .rib
                .adj_in(id)
                .into_iter()
                .map(|r| {
                    let best = self.rib.best(&r.prefix).is_some_and(|(s, _)| s == r.source);
                    let stale = self.rib.is_stale(id, &r.prefix);
                    ListedRoute {
                        route: r,
                        from_peer: addr_of(id),
                        best,
                        stale,
                    }
                })
                .collect(),
            (Table::AdjOut, Some(id)) => self
                .rib
                .adj_out(id)
                .into_iter()
                .map(|r| ListedRoute {
                    route: r,
                    from_peer: None,
                    best: true,
                    stale: false,
                })
                .collect(),
        };
        Ok(routes)
    }

    async fn ensure_listening(&mut self) -> Result<(), SpeakerError> {
        if self.listener.is_some() || self.config.listen.port() == 0 {
            return Ok(());
        }
        let addr = self.config.listen;
        let listener = bind(addr).map_err(|source| SpeakerError::Listen { addr, source })?;
        {
            use std::os::fd::AsFd;
            self.listener_fd = listener.as_fd().try_clone_to_owned().ok();
            if let Err(e) = sockopt::save_syns(listener.as_fd()) {
                tracing::warn!(error = %e, "cannot keep SYNs: TTL security (GTSM) is checked only after a connection's first bytes");
            }
        }
        let specs: Vec<PeerSpec> = self.peers.values().map(|p| p.spec.clone()).collect();
        for spec in &specs {
            self.listener_key(spec, true);
        }
        let tx = self.self_tx.clone();
        self.listener = Some(tokio::spawn(async move {
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
        }));
        tracing::info!(%addr, "BGP listening");
        Ok(())
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
                limit_hit: false,
                limit_warned: false,
                gr_token: 0,
                malformed: Malformed::default(),
            },
        );
        Ok(())
    }

    /// Start the session task of a peer.
    fn spawn_session(&self, id: PeerId, spec: &PeerSpec) -> mpsc::UnboundedSender<ToSession> {
        let mut fc = FsmConfig::new(self.config.local_as, self.config.router_id, spec.asn);
        fc.hold_time = spec.hold_time;
        fc.keepalive = spec.keepalive;
        fc.passive = spec.passive;
        // Peers of a cluster start together and refuse connections until they listen: retry
        // soon, then back off (jittered) to Calico's BIRD `connect retry time 5`, so a mesh
        // converges in about a second and a peer that comes late is found within 5 s.
        fc.connect_retry = std::time::Duration::from_millis(500);
        fc.connect_retry_max = std::time::Duration::from_secs(5);
        fc.graceful_restart = spec.graceful_restart.map(|g| g.restart_time);
        fc.jitter_seed =
            u64::from(u32::from(spec.address)) ^ u64::from(u32::from(self.config.router_id)) << 32;
        let (tx, rx) = mpsc::unbounded_channel();
        let remote = SocketAddr::V4(SocketAddrV4::new(spec.address, spec.port));
        let session = Session::new(id, remote, Fsm::new(fc), self.from_sessions.clone())
            .with_transport(spec.transport.clone());
        tokio::spawn(session.run(rx));
        tx
    }

    /// In `secs`, sweep the peer's stale routes unless something happened since (`token`).
    fn gr_timer(&self, addr: Ipv4Addr, id: PeerId, token: u64, secs: u16) {
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(u64::from(secs))).await;
            let _ = tx.send(Command::GrExpired(addr, id, token)).await;
        });
    }

    /// After an UPDATE: warn near the peer's prefix limit, stop the session above it.
    fn check_prefix_limit(&mut self, id: PeerId) {
        let held = self.rib.adj_in_len(id) as u64;
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
                reason: reason.clone(),
            });
            p.limit_hit = true;
            p.epoch = None;
            p.last_error = Some(reason);
            if let Some(s) = restart {
                let tx = self.self_tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_secs(u64::from(s))).await;
                    let _ = tx.send(Command::RestartAfterLimit(addr, id)).await;
                });
            }
            let out = self.rib.peer_down(id);
            self.distribute(out);
        } else if !p.limit_warned && held * 100 >= max * PREFIX_WARN_PERCENT {
            p.limit_warned = true;
            tracing::warn!(peer = %addr, held, max, "peer is at {PREFIX_WARN_PERCENT}% of its prefix limit");
        }
    }

    /// Install (or remove) a peer's MD5 key on the listening socket.
    fn listener_key(&self, spec: &PeerSpec, install: bool) {
        let (Some(fd), Some(p)) = (self.listener_fd.as_ref(), spec.transport.password.as_ref())
        else {
            return;
        };
        use std::os::fd::AsFd;
        let key = install.then(|| p.as_bytes());
        if let Err(e) = sockopt::set_md5(fd.as_fd(), spec.address.into(), key) {
            tracing::warn!(peer = %spec.address, error = %e, "cannot set the TCP MD5 key on the BGP listener");
        }
    }

    async fn reconfigure(&mut self, local_as: Asn, listen_port: u16) -> Result<(), SpeakerError> {
        if listen_port != self.config.listen.port() {
            if let Some(l) = self.listener.take() {
                self.listener_fd = None;
                l.abort();
                // Let the aborted task drop its socket before binding the new port.
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
            let mut rib = Rib::new(local_as, self.config.router_id);
            if self.config.kernel.is_some() {
                rib.track_loc_changes();
            }
            let _ = rib.set_policy(self.rib.policy().clone(), self.rib.cluster_id());
            for (prefix, attrs) in self.rib.local_routes() {
                let _ = rib.announce(prefix, attrs);
            }
            self.rib = rib;
            self.config.local_as = local_as;
            self.publish_kernel(true);
            for s in specs {
                self.add_peer(s).await?;
            }
            tracing::info!(asn = %local_as, "local AS changed; sessions restarted");
        }
        Ok(())
    }

    /// Tell the kernel sink what changed in the Loc-RIB (everything, with `replace`).
    fn publish_kernel(&mut self, replace: bool) {
        let Some(sink) = self.config.kernel.clone() else {
            return;
        };
        let changed = self.rib.take_loc_changes();
        if !replace && self.in_kernel.is_empty() && !self.rib.policy().programs_any() {
            // Nothing is programmed and nothing can be: no route to look at (a full table
            // from a peer whose routes policy keeps out of the kernel costs nothing here).
            return;
        }
        let prefixes: Vec<Ipv4Prefix> = if replace {
            self.rib.loc_rib().map(|r| r.prefix).collect()
        } else {
            changed
        };
        if prefixes.is_empty() && !replace {
            return;
        }
        let items: Vec<(Ipv4Prefix, Option<pb::DesiredItem>)> = prefixes
            .into_iter()
            .map(|p| (p, self.kernel_item(&p)))
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
            let Ok(net) = Ipv4Net::new(p.addr(), p.prefix_len()) else {
                continue;
            };
            changes.push((IpNet::V4(net), item));
        }
        if changes.is_empty() && !replace {
            return;
        }
        sink.bgp_routes(changes, replace);
    }

    /// The kernel route the policy derives from the best route for `p`, if any.
    fn kernel_item(&self, p: &Ipv4Prefix) -> Option<pb::DesiredItem> {
        let (src, attrs) = self.rib.best(p)?;
        let Source::Peer(q) = src else { return None };
        let next_hop = attrs.next_hop?;
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

    fn delete_peer(&mut self, addr: Ipv4Addr) -> Result<(), SpeakerError> {
        let p = self
            .peers
            .remove(&addr)
            .ok_or_else(|| SpeakerError::NoPeer(addr.to_string()))?;
        self.by_id.remove(&p.id);
        self.listener_key(&p.spec, false);
        let _ = p.tx.send(ToSession::Stop {
            subcode: cease::PEER_DECONFIGURED,
            reason: "peer deleted".into(),
        });
        let out = self.rib.peer_down(p.id);
        self.distribute(out);
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
                peer_restart_time,
            } => {
                let Some(p) = self.entry(id) else { return };
                p.epoch = Some(epoch);
                p.remote_id = Some(remote_id);
                p.gr_token = p.gr_token.wrapping_add(1);
                let (token, addr) = (p.gr_token, p.spec.address);
                let stale_time = p.spec.graceful_restart.map_or(0, |g| g.stale_time);
                let info = PeerInfo {
                    id,
                    address: p.spec.address,
                    asn: p.spec.asn,
                    router_id: remote_id,
                    local_address,
                    class: p.spec.class,
                    rr_client: p.spec.rr_client,
                };
                let tx = p.tx.clone();
                let update = self.rib.peer_up(info);
                let _ = tx.send(ToSession::Routes { epoch, update });
                let _ = tx.send(ToSession::EndOfRib { epoch });
                if self.rib.has_stale(id) {
                    if peer_restart_time.is_some() {
                        // Back from its restart: its routes stay until its End-of-RIB, at
                        // most the stale-path time.
                        self.gr_timer(addr, id, token, stale_time);
                    } else {
                        let out = self.rib.sweep_stale(id);
                        self.distribute(out);
                    }
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
                        let kept = self.rib.peer_down_graceful(id);
                        tracing::info!(peer = %addr, kept, restart_time, "peer restarting gracefully: its routes are kept stale");
                        self.gr_timer(addr, id, token, restart_time);
                    }
                    None => {
                        let out = self.rib.peer_down(id);
                        self.distribute(out);
                    }
                }
            }
            FromSession::RefreshMarker { id, epoch, begin } => {
                let Some(p) = self.entry(id) else { return };
                if p.epoch != Some(epoch) {
                    return;
                }
                if begin {
                    // What the peer does not re-advertise before EoRR is gone (RFC 7313 §4).
                    self.rib.begin_refresh(id);
                } else if self.rib.has_stale(id) {
                    let out = self.rib.sweep_stale(id);
                    self.distribute(out);
                }
            }
            FromSession::MalformedReset { id } => {
                if let Some(p) = self.entry(id) {
                    p.malformed.session_reset = p.malformed.session_reset.saturating_add(1);
                }
            }
            FromSession::EndOfRib { id, epoch } => {
                let Some(p) = self.entry(id) else { return };
                if p.epoch != Some(epoch) {
                    return;
                }
                p.gr_token = p.gr_token.wrapping_add(1);
                if self.rib.has_stale(id) {
                    let out = self.rib.sweep_stale(id);
                    self.distribute(out);
                }
            }
            FromSession::Update { id, epoch, update } => {
                let Some(p) = self.entry(id) else { return };
                if p.epoch != Some(epoch) {
                    return;
                }
                let u = update.update;
                let v4 = |p: Prefix| match p {
                    Prefix::V4(p) => Some(p),
                    Prefix::V6(_) => None,
                };
                let mut withdrawn: Vec<Ipv4Prefix> = u.withdrawn_routes().filter_map(v4).collect();
                let mut announced: Vec<Ipv4Prefix> = u.announced().filter_map(v4).collect();
                let mut attrs = Some(u.attributes);
                p.malformed.attribute_discard = p
                    .malformed
                    .attribute_discard
                    .saturating_add(update.discarded.len() as u64);
                if !update.discarded.is_empty() {
                    tracing::info!(peer = %p.spec.address, discarded = ?update.discarded, "attributes discarded (RFC 7606)");
                }
                if let Disposition::TreatAsWithdraw(problems) = &update.disposition {
                    p.malformed.treat_as_withdraw = p.malformed.treat_as_withdraw.saturating_add(1);
                    tracing::warn!(peer = %p.spec.address, ?problems, "UPDATE treated as withdraw (RFC 7606)");
                    withdrawn.append(&mut announced);
                    attrs = None;
                }
                // Routes in MP_REACH_NLRI carry their next hop there.
                if let (Some(a), Some(r)) = (attrs.as_mut(), u.mp_reach.as_ref())
                    && a.next_hop.is_none()
                    && let bgp_wire::NextHop::V4(nh) = r.next_hop
                {
                    a.next_hop = Some(nh);
                }
                let out = self.rib.update(id, attrs, &announced, &withdrawn);
                self.distribute(out);
                self.check_prefix_limit(id);
            }
            FromSession::Refresh { id, epoch } => {
                let Some(p) = self
                    .peers
                    .get(self.by_id.get(&id).unwrap_or(&Ipv4Addr::UNSPECIFIED))
                else {
                    return;
                };
                if p.epoch == Some(epoch) {
                    let update = self.rib.refresh(id);
                    let _ = p.tx.send(ToSession::Refresh { epoch, update });
                }
            }
        }
    }

    fn entry(&mut self, id: PeerId) -> Option<&mut PeerEntry> {
        let addr = self.by_id.get(&id)?;
        self.peers.get_mut(addr)
    }

    fn distribute(&mut self, out: std::collections::HashMap<PeerId, OutUpdate>) {
        self.publish_kernel(false);
        for (id, update) in out {
            let Some(addr) = self.by_id.get(&id) else {
                continue;
            };
            let Some(p) = self.peers.get(addr) else {
                continue;
            };
            if let Some(epoch) = p.epoch {
                let _ = p.tx.send(ToSession::Routes { epoch, update });
            }
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
    socket.bind(addr)?;
    socket.listen(1024)
}
