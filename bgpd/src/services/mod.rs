//! Single service addresses (a LoadBalancer's or an external IP, as a /32 or /128) that a
//! load-balancer controller announces from the nodes hosting the service's endpoints
//! (`externalTrafficPolicy: Local`), each under a lease the controller renews.
//!
//! - `leases`: the table and the checks on a request, sans-IO (the time is a parameter).
//! - here: the task that owns the table, takes commands from the API over a bounded queue,
//!   tells the speaker what to announce and withdraw, and withdraws an address when its
//!   lease runs out. Which sessions the routes reach is the policy's business (the cluster
//!   brain sends routes inside the service ranges to external peers only), not this task's.
//!   The API checks the address against the cluster's `BGPConfiguration` before asking.
//!
//! On bgpd's exit nothing is done here: the speaker withdraws everything when it stops.

pub mod kubernetes;
pub mod leases;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use bgp_wire::Prefix;
use tokio::sync::{mpsc, oneshot};

pub use leases::{Change, Lease, LeaseError, Leases};

use crate::speaker::{Announcement, SpeakerError, SpeakerHandle};

/// Commands waiting for the task; an API caller beyond it waits for room.
const QUEUE: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("the BGP speaker refused {prefix}: {source}")]
    Speaker {
        prefix: Prefix,
        #[source]
        source: SpeakerError,
    },
    #[error("the service announcement task has stopped")]
    Stopped,
}

/// One lease as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub address: IpAddr,
    pub owner: String,
    pub ttl_s: u32,
    /// Time left when the answer was made.
    pub expires_in: Duration,
}

impl LeaseView {
    fn new(address: IpAddr, lease: &Lease, now: Instant) -> Self {
        Self {
            address,
            owner: lease.owner.clone(),
            ttl_s: lease.ttl_s,
            expires_in: lease.expires_at.saturating_duration_since(now),
        }
    }
}

/// The next hops this node announces its service addresses with: its own address of each
/// family (as the cluster brain does for blocks); without one, the speaker uses the
/// session's own address.
#[derive(Debug, Clone, Copy, Default)]
pub struct NextHops {
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
}

impl NextHops {
    fn of(&self, addr: IpAddr) -> Option<IpAddr> {
        match addr {
            IpAddr::V4(_) => self.v4.map(IpAddr::V4),
            IpAddr::V6(_) => self.v6.map(IpAddr::V6),
        }
    }
}

/// The host prefix of an address: /32 or /128.
pub fn host_prefix(addr: IpAddr) -> Prefix {
    let len = if addr.is_ipv4() { 32 } else { 128 };
    // A full-length prefix always exists for its family.
    Prefix::new(addr, len).expect("a host prefix has the family's full length")
}

enum Command {
    Announce {
        address: IpAddr,
        owner: String,
        ttl_s: u32,
        reply: oneshot::Sender<Result<(LeaseView, Change), ServicesError>>,
    },
    Withdraw {
        address: IpAddr,
        reply: oneshot::Sender<Result<(), ServicesError>>,
    },
    List {
        reply: oneshot::Sender<Vec<LeaseView>>,
    },
}

/// The task's API.
#[derive(Clone)]
pub struct ServicesHandle {
    tx: mpsc::Sender<Command>,
}

impl ServicesHandle {
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ServicesError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| ServicesError::Stopped)?;
        rx.await.map_err(|_| ServicesError::Stopped)
    }

    /// Announces `address` (checked by [`leases::address`]) or renews its lease; `ttl_s` 0
    /// means the default. Answers once the speaker has the route.
    pub async fn announce(
        &self,
        address: IpAddr,
        owner: String,
        ttl_s: u32,
    ) -> Result<(LeaseView, Change), ServicesError> {
        self.ask(|reply| Command::Announce {
            address,
            owner,
            ttl_s,
            reply,
        })
        .await?
    }

    pub async fn withdraw(&self, address: IpAddr) -> Result<(), ServicesError> {
        self.ask(|reply| Command::Withdraw { address, reply })
            .await?
    }

    pub async fn list(&self) -> Result<Vec<LeaseView>, ServicesError> {
        self.ask(|reply| Command::List { reply }).await
    }
}

/// Starts the task; it ends when every handle is gone.
pub fn start(speaker: SpeakerHandle, next_hops: NextHops) -> ServicesHandle {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(run(speaker, next_hops, rx));
    ServicesHandle { tx }
}

async fn run(speaker: SpeakerHandle, next_hops: NextHops, mut rx: mpsc::Receiver<Command>) {
    let mut leases = Leases::new();
    loop {
        let deadline = leases.next_deadline();
        let expiry = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = rx.recv() => match command {
                Some(c) => handle(&mut leases, &speaker, next_hops, c).await,
                None => return,
            },
            () = expiry => {
                for address in leases.expire(Instant::now()) {
                    let prefix = host_prefix(address);
                    match speaker.withdraw(prefix).await {
                        Ok(()) => tracing::info!(%address, "service lease ran out: withdrawn"),
                        Err(e) => tracing::warn!(%address, error = %e, "service lease ran out, but the speaker did not withdraw it"),
                    }
                }
            }
        }
    }
}

async fn handle(
    leases: &mut Leases,
    speaker: &SpeakerHandle,
    next_hops: NextHops,
    command: Command,
) {
    match command {
        Command::Announce {
            address,
            owner,
            ttl_s,
            reply,
        } => {
            let _ = reply.send(announce(leases, speaker, next_hops, address, &owner, ttl_s).await);
        }
        Command::Withdraw { address, reply } => {
            let result = match leases.withdraw(address) {
                Ok(lease) => {
                    let prefix = host_prefix(address);
                    match speaker.withdraw(prefix).await {
                        Ok(()) => {
                            tracing::info!(%address, owner = %lease.owner, "service address withdrawn");
                            Ok(())
                        }
                        // Gone from the speaker already (it was never there, or something
                        // else withdrew it): what the caller asked for holds.
                        Err(SpeakerError::NotAnnounced(_)) => Ok(()),
                        Err(source) => Err(ServicesError::Speaker { prefix, source }),
                    }
                }
                Err(e) => Err(e.into()),
            };
            let _ = reply.send(result);
        }
        Command::List { reply } => {
            let now = Instant::now();
            let _ = reply.send(
                leases
                    .list()
                    .iter()
                    .map(|(a, l)| LeaseView::new(*a, l, now))
                    .collect(),
            );
        }
    }
}

async fn announce(
    leases: &mut Leases,
    speaker: &SpeakerHandle,
    next_hops: NextHops,
    address: IpAddr,
    owner: &str,
    ttl_s: u32,
) -> Result<(LeaseView, Change), ServicesError> {
    leases::address(&address.to_string())?;
    let now = Instant::now();
    let change = leases.announce(address, owner, ttl_s, now)?;
    if change == Change::New {
        let prefix = host_prefix(address);
        let a = Announcement {
            prefix,
            next_hop: next_hops.of(address),
            communities: vec![],
        };
        if let Err(source) = speaker.announce(a).await {
            // Not announced: no lease either, so the caller's retry starts afresh.
            let _ = leases.withdraw(address);
            return Err(ServicesError::Speaker { prefix, source });
        }
        tracing::info!(%address, owner, ttl_s, "service address announced");
    }
    let lease = leases
        .get(address)
        .ok_or(LeaseError::NotAnnounced(address))?;
    Ok((LeaseView::new(address, lease, now), change))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speaker::{SpeakerConfig, Table, task};

    fn speaker() -> SpeakerHandle {
        task::start(SpeakerConfig {
            local_as: bgp_wire::Asn(64512),
            router_id: Ipv4Addr::new(10, 0, 0, 1),
            // Port 0: never listens (no peers here anyway).
            listen: "0.0.0.0:0".parse().unwrap(),
            ipv6_next_hop: None,
            kernel: None,
        })
    }

    async fn loc(speaker: &SpeakerHandle) -> Vec<String> {
        speaker
            .routes(Table::Loc, None)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.route.prefix.to_string())
            .collect()
    }

    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn services_announce_renew_withdraw_and_expire_through_the_speaker() {
        let speaker = speaker();
        let services = start(
            speaker.clone(),
            NextHops {
                v4: Some(Ipv4Addr::new(10, 0, 0, 1)),
                v6: Some("fd00::1".parse().unwrap()),
            },
        );
        let (view, change) = services
            .announce(a("192.0.2.10"), "default/lb".into(), 30)
            .await
            .unwrap();
        assert_eq!(change, Change::New);
        assert_eq!((view.ttl_s, view.owner.as_str()), (30, "default/lb"));
        assert!(view.expires_in <= Duration::from_secs(30));
        services
            .announce(a("2001:db8::10"), String::new(), 1)
            .await
            .unwrap();
        assert_eq!(
            loc(&speaker).await,
            vec!["192.0.2.10/32", "2001:db8::10/128"]
        );
        let (_, change) = services
            .announce(a("192.0.2.10"), "default/lb".into(), 0)
            .await
            .unwrap();
        assert_eq!(change, Change::Renewed);
        let listed = services.list().await.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].ttl_s, 60);

        // The IPv6 lease runs out after a second: withdrawn from the speaker.
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert_eq!(loc(&speaker).await, vec!["192.0.2.10/32"]);
        assert_eq!(services.list().await.unwrap().len(), 1);

        services.withdraw(a("192.0.2.10")).await.unwrap();
        assert!(loc(&speaker).await.is_empty());
        match services.withdraw(a("192.0.2.10")).await {
            Err(ServicesError::Lease(LeaseError::NotAnnounced(x))) => {
                assert_eq!(x, a("192.0.2.10"))
            }
            other => panic!("{other:?}"),
        }
        // Refused requests leave nothing behind.
        assert!(
            services
                .announce(a("192.0.2.11"), String::new(), 100_000)
                .await
                .is_err()
        );
        assert!(
            services
                .announce(a("fe80::1"), String::new(), 10)
                .await
                .is_err()
        );
        assert!(services.list().await.unwrap().is_empty());
        assert!(loc(&speaker).await.is_empty());
    }

    #[tokio::test]
    async fn the_next_hop_is_the_nodes_address_of_the_family() {
        let speaker = speaker();
        let services = start(
            speaker.clone(),
            NextHops {
                v4: Some(Ipv4Addr::new(10, 0, 0, 7)),
                v6: None,
            },
        );
        services
            .announce(a("192.0.2.10"), String::new(), 10)
            .await
            .unwrap();
        services
            .announce(a("2001:db8::10"), String::new(), 10)
            .await
            .unwrap();
        let routes = speaker.routes(Table::Loc, None).await.unwrap();
        let v4 = routes
            .iter()
            .find(|r| r.route.prefix.to_string() == "192.0.2.10/32")
            .unwrap();
        assert_eq!(
            bgp::rib::next_hop_addr(&v4.route.attrs),
            Some(a("10.0.0.7"))
        );
        // No IPv6 address: the speaker picks the session's per peer.
        let v6 = routes
            .iter()
            .find(|r| r.route.prefix.to_string() == "2001:db8::10/128")
            .unwrap();
        assert!(v6.route.attrs.mp_next_hop.is_none());
    }

    #[test]
    fn host_prefixes_have_the_full_length() {
        assert_eq!(host_prefix(a("192.0.2.1")).to_string(), "192.0.2.1/32");
        assert_eq!(host_prefix(a("2001:db8::1")).to_string(), "2001:db8::1/128");
    }
}
