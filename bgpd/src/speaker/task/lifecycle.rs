//! Peers' sessions over their life: a peer added starts its session task (and its BFD
//! session), deleted stops it; a session the speaker stopped (prefix limit passed, BFD
//! down) starts again later; a session's end takes its routes out of the RIBs or keeps
//! them stale through the peer's graceful restart, until its End-of-RIB or the timers.

use std::net::{IpAddr, SocketAddr};
use std::time::SystemTime;

use bgp::fsm::{Fsm, State};
use bgp::rib::{PeerId, RibPrefix};
use bgp_wire::{Family, Ipv4Prefix, Ipv6Prefix, cease};

use super::{
    Command, Families, Malformed, PeerEntry, PeerSpec, Speaker, SpeakerError, ToSession, mailbox,
};
use crate::speaker::bfd::BfdEvent;
use crate::speaker::session::Session;

/// Cease subcode "BFD Down" (RFC 9384).
const CEASE_BFD_DOWN: u8 = 10;

/// Warn when a peer reaches this share of its prefix limit.
const PREFIX_WARN_PERCENT: u64 = 75;

impl Speaker {
    pub(super) async fn add_peer(&mut self, spec: PeerSpec) -> Result<(), SpeakerError> {
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

    /// Start a new session for a peer whose session we stopped, `secs` from now.
    fn restart_later(&self, addr: IpAddr, id: PeerId, secs: u16) {
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(u64::from(secs))).await;
            let _ = tx.send(Command::RestartStopped(addr, id)).await;
        });
    }

    /// In `secs`, sweep the peer's stale routes unless something happened since (`token`).
    pub(super) fn gr_timer(&self, addr: IpAddr, id: PeerId, token: u64, secs: u16) {
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(u64::from(secs))).await;
            let _ = tx.send(Command::GrExpired(addr, id, token)).await;
        });
    }

    /// After an UPDATE: warn near the peer's prefix limit, stop the session above it. The
    /// limit applies to each family (BIRD's per-channel receive limit).
    pub(super) fn check_prefix_limit(&mut self, id: PeerId) {
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

    /// The wait after we stopped a peer's session is over: a new session starts, unless
    /// the peer was changed or deleted since.
    pub(super) fn restart_stopped(&mut self, addr: IpAddr, id: PeerId) {
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

    /// Whether the peer has routes kept through a graceful restart, in any family.
    pub(super) fn has_stale(&self, id: PeerId) -> bool {
        self.rib.has_stale(id) || self.rib6.has_stale(id)
    }

    /// Drop the peer's stale routes of one family (its End-of-RIB) or all.
    pub(super) fn sweep_stale(&mut self, id: PeerId, family: Option<Family>) {
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
    pub(super) fn peer_down(&mut self, id: PeerId, keep: Families) -> usize {
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
    pub(super) fn send_refresh(&self, p: &PeerEntry, epoch: u64, family: Family) {
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
    pub(super) fn bfd_event(&mut self, e: BfdEvent) {
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

    pub(super) fn delete_peer(&mut self, addr: IpAddr) -> Result<(), SpeakerError> {
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
}
