//! The speaker task: owns the [`Rib`]s and the set of peers, one session task per peer.
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
//!
//! **Layout.** One type, `Speaker`, whose state and event loop are here; its handlers are
//! `impl` blocks in the submodules, one concern each (they call each other's methods, and
//! name only `peer` and `handle` for types, so no two of them depend on each other):
//! - `peer`, `handle`: the API's values ([`PeerSpec`], [`PeerStatus`]), [`SpeakerHandle`] and
//!   the commands it sends;
//! - `commands`: the task's side of each command that changes something; `queries`: of
//!   those that only answer (status, tables, filter decisions);
//! - `lifecycle`: peers' sessions started, stopped, restarted, and what their end does to
//!   the RIBs (graceful restart, prefix limit, BFD);
//! - `listen`: the BGP listeners and the connections they accept;
//! - `messages`: what the sessions report (state, Established, UPDATEs, End-of-RIB);
//! - `kernel`: the BGP part of the desired kernel state, handed to the [`KernelSink`].

mod commands;
mod handle;
mod kernel;
mod lifecycle;
mod listen;
mod messages;
mod peer;
mod queries;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use bgp::fsm::State;
use bgp::rib::{OutUpdate, PeerId, Rib, RibPrefix};
use bgp_wire::{Asn, Ipv4Prefix, Ipv6Prefix, Prefix, cease};
use tokio::sync::mpsc;

use super::bfd::{BfdEvent, BfdHandle};
use super::mailbox;
pub use super::session::Families;
use super::session::{FromSession, ToSession};
pub use crate::dataplane::KernelSink;
use handle::Command;
pub use handle::{Announcement, FilterDecision, ListedRoute, SpeakerError, SpeakerHandle, Table};
use listen::Listener;
pub use peer::{DEFAULT_ERROR_WAIT, GracefulRestart, Malformed, PeerOrigin, PeerSpec, PeerStatus};

/// Depth of the speaker's inbound queues.
const QUEUE: usize = 1024;
/// Work the speaker does before it lets other tasks (the API) run.
const YIELD_AFTER: std::time::Duration = std::time::Duration::from_millis(2);

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
