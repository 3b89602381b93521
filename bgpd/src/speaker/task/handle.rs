//! The speaker task's API: [`SpeakerHandle`], the commands it queues for the task
//! (`Command`, answered on a oneshot each), and the values and errors they carry. The task's
//! side of each command is in `commands` (changes) and `queries` (answers).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use bgp::policy::Policy;
use bgp::rib::{PeerId, Route};
use bgp_wire::{Asn, Community, NextHop, Origin, PathAttributes, Prefix};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::peer::{PeerSpec, PeerStatus};
use crate::speaker::bfd::{BfdHandle, Counters};

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
    pub(super) fn attrs(&self) -> Result<PathAttributes, SpeakerError> {
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

/// What the handle (and the task's own listeners and timers) ask of the task.
pub(super) enum Command {
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
    pub(super) tx: mpsc::Sender<Command>,
    pub(super) bfd: BfdHandle,
}

impl SpeakerHandle {
    /// The BFD task's packet counters (for the metrics).
    pub fn bfd_counters(&self) -> Arc<Counters> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use bgp_wire::Ipv6Prefix;
    use std::net::Ipv6Addr;

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
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
