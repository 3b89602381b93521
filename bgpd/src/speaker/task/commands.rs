//! The speaker task's side of its commands: `command` takes each `Command` off the queue,
//! does it, and answers on its oneshot. The commands that change something are here (peers,
//! policy, announcements, refreshes, the local AS and port, shutdown, the task's own timers);
//! those that only answer are in `queries`, accepted connections in `listen`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use bgp::policy::Policy;
use bgp::rib::PeerId;
use bgp_wire::{Asn, Prefix, cease};

use super::{Announcement, Command, PeerSpec, Speaker, SpeakerError, ToSession, new_ribs};

impl Speaker {
    pub(super) async fn command(&mut self, c: Command) {
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
                let _ = reply.send(self.peer_statuses());
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
                self.set_policy(policy, cluster_id);
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
                let _ = reply.send(self.announce(&a));
            }
            Command::Withdraw(prefix, reply) => {
                let _ = reply.send(self.withdraw(prefix));
            }
            Command::RequestRefresh {
                addr,
                outbound,
                reply,
            } => {
                let _ = reply.send(self.request_refresh(addr, outbound));
            }
            Command::GrExpired(addr, id, token) => self.graceful_restart_expired(addr, id, token),
            Command::Shutdown(reply) => {
                self.shutdown();
                let _ = reply.send(());
            }
            Command::RestartStopped(addr, id) => self.restart_stopped(addr, id),
            Command::Accepted(stream, from) => self.accepted(stream, from),
        }
    }

    fn set_policy(&mut self, policy: Arc<Policy>, cluster_id: Option<Ipv4Addr>) {
        // The kernel is told everything once, after both families: the policy may change
        // what is programmed even where no best route changed.
        let out = self.rib.set_policy(policy.clone(), cluster_id);
        self.send_updates(out);
        let out = self.rib6.set_policy(policy, cluster_id);
        self.send_updates(out);
        self.publish_kernel(true);
    }

    fn announce(&mut self, a: &Announcement) -> Result<(), SpeakerError> {
        let attrs = a.attrs()?;
        match a.prefix {
            Prefix::V4(p) => {
                let out = self.rib.announce(p, attrs);
                self.distribute(out);
            }
            Prefix::V6(p) => {
                let out = self.rib6.announce(p, attrs);
                self.distribute(out);
            }
        }
        Ok(())
    }

    fn withdraw(&mut self, prefix: Prefix) -> Result<(), SpeakerError> {
        let done = match prefix {
            Prefix::V4(p) => self.rib.withdraw(p).map(|out| self.distribute(out)),
            Prefix::V6(p) => self.rib6.withdraw(p).map(|out| self.distribute(out)),
        };
        done.ok_or(SpeakerError::NotAnnounced(prefix))
    }

    /// Ask the peer for its routes again, or (`outbound`) send it ours again.
    fn request_refresh(&self, addr: IpAddr, outbound: bool) -> Result<(), SpeakerError> {
        let p = self
            .peers
            .get(&addr)
            .ok_or_else(|| SpeakerError::NoPeer(addr.to_string()))?;
        if !outbound {
            let _ = p.tx.send(ToSession::RequestRefresh);
        } else if let Some(epoch) = p.epoch {
            for family in p.up.list() {
                self.send_refresh(p, epoch, family);
            }
        }
        Ok(())
    }

    /// A graceful-restart timer ran out: the peer's routes still stale go, unless something
    /// happened since it was set (`token`).
    fn graceful_restart_expired(&mut self, addr: IpAddr, id: PeerId, token: u64) {
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        if p.id != id || p.gr_token != token || !self.has_stale(id) {
            return;
        }
        tracing::info!(peer = %addr, "graceful restart time ran out: stale routes removed");
        self.sweep_stale(id, None);
    }

    /// Close every session for bgpd's exit.
    fn shutdown(&self) {
        for p in self.peers.values() {
            // AdminDown tells BFD peers this is no path failure, so graceful restart keeps
            // its routes (RFC 5882 §3.2).
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
    }

    /// Change the local AS or the listen port: a new port is listened on at once; a new AS
    /// restarts every session with RIBs of the new AS (policy and local routes carried over).
    async fn reconfigure(&mut self, local_as: Asn, listen_port: u16) -> Result<(), SpeakerError> {
        if listen_port != self.config.listen.port() {
            self.relisten(listen_port).await?;
        }
        if local_as != self.config.local_as {
            self.change_local_as(local_as).await?;
        }
        Ok(())
    }

    async fn change_local_as(&mut self, local_as: Asn) -> Result<(), SpeakerError> {
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
        Ok(())
    }
}
