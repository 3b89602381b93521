//! What a peer is to the speaker: how it is configured ([`PeerSpec`], where it comes from,
//! its graceful-restart times, the session FSM's settings derived from them) and how
//! operators see it ([`PeerStatus`]). Plain values: the handle takes and returns them, the
//! task keeps one spec per peer.

use std::net::{IpAddr, Ipv4Addr};
use std::time::SystemTime;

use bgp::fsm::{FsmConfig, State};
use bgp::policy::PeerClass;
use bgp::rib::PeerOptions;
use bgp_wire::Asn;

use crate::speaker::session::Families;
use crate::speaker::sockopt::Transport;

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

#[cfg(test)]
mod tests {
    use super::*;
    use bgp::fsm::Fsm;

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
}
