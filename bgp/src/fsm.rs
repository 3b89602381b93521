//! The BGP finite state machine of RFC 4271 §8, one instance per configured peer.
//!
//! Why this file is long: one state machine: every state's handling of every event, which reads
//! best as one table of matches.
//!
//! **Job.** Decide, for every event (a start or stop, a TCP connection coming or going, a
//! decoded message, a timer firing), the next state and the actions to take: send an OPEN,
//! KEEPALIVE or NOTIFICATION, arm or stop a timer, open or drop the connection, report the
//! session up or down.
//!
//! **Boundaries.** Sans-IO: no sockets, no clock, no tokio. The session task owns the TCP
//! connection and the timers and performs the [`Action`]s in order; time is only ever a
//! [`Duration`] to arm. Jitter comes from a small seeded generator, so tests are
//! deterministic. UPDATE contents are not looked at here: in Established they are handed
//! on to the RIB with [`Action::Deliver`].
//!
//! **Collisions** (RFC 4271 §6.8). A second connection while one is in OpenSent/OpenConfirm
//! is not fed to this machine until its OPEN has been read; [`Event::CollidingOpen`] then
//! decides which connection survives by comparing BGP identifiers. The peer decides the same
//! way and may say so first: its Cease/Connection Collision Resolution on our connection
//! before Established ends that connection only (back to Connect/Active), and the colliding
//! OPEN that arrives then is taken. One case waits: when the identifiers say to close our own
//! connection after we confirmed it with a KEEPALIVE, the peer may already be Established on
//! it, and then it closes the new one whatever the identifiers say, so neither would be left
//! (seen with BIRD 1.6, which then stops the session with a Cease). The new connection is held
//! ([`Action::HoldColliding`]) until ours is Established (the new one loses), closed (the new
//! one is taken) or [`Timer::CollisionWait`] passes (the identifiers decide).

use std::net::Ipv4Addr;
use std::time::Duration;

use bgp_wire::{
    Asn, Capability, DecodeError, Decoded, ErrorKind, Family, Message, Notification, Open,
    SessionParams, UpdateDecode, cease,
};

/// The hold time proposed while waiting for the peer's OPEN (RFC 4271 §8.2.2: "4 minutes").
const OPEN_HOLD: Duration = Duration::from_secs(240);
/// A session that stays Established this long forgets its earlier errors.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How long a held colliding connection waits for ours to settle: the peer's KEEPALIVE is
/// one round trip away, so only a peer that never answers makes it run out.
const COLLISION_WAIT: Duration = Duration::from_secs(3);

/// RFC 4271 session states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Idle,
    Connect,
    Active,
    OpenSent,
    OpenConfirm,
    Established,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Idle => "Idle",
            State::Connect => "Connect",
            State::Active => "Active",
            State::OpenSent => "OpenSent",
            State::OpenConfirm => "OpenConfirm",
            State::Established => "Established",
        }
    }
}

/// The timers the session task runs for the FSM; arming one that runs restarts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    ConnectRetry,
    Hold,
    Keepalive,
    /// Delay before restarting after errors (the "IdleHoldTimer" of RFC 4271 §8.1.1).
    IdleHold,
    /// Fires once a session has been up long enough to reset the error back-off.
    Stable,
    /// A held colliding connection has waited long enough: feed its OPEN again.
    CollisionWait,
}

/// Per-peer settings the FSM needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsmConfig {
    pub local_as: Asn,
    pub router_id: Ipv4Addr,
    pub peer_as: Asn,
    /// Hold time we propose, seconds: 0 (no keepalives) or 3..=65535.
    pub hold_time: u16,
    /// Keepalive interval we want; `None` means a third of the negotiated hold time.
    pub keepalive: Option<u16>,
    /// Never connect out; wait for the peer.
    pub passive: bool,
    /// First ConnectRetry interval; doubled after each failed attempt up to `connect_retry_max`.
    pub connect_retry: Duration,
    pub connect_retry_max: Duration,
    /// ConnectRetry timer starts (a failed attempt and the retry after it are two) that stay at
    /// `connect_retry` before the doubling starts: peers that start together refuse
    /// connections until they listen, and a refusal costs nothing.
    pub connect_retry_fast: u32,
    /// When set, a refused attempt is retried after this (jittered) instead of the back-off:
    /// for a peer that connects to us itself once it listens (another node), whose own
    /// attempt at its start is what brings the session up.
    pub refused_retry: Option<Duration>,
    /// First idle hold after a session error; doubled per consecutive error up to the max.
    pub idle_hold: Duration,
    pub idle_hold_max: Duration,
    /// Seed of the jitter generator (e.g. derived from the peer address).
    pub jitter_seed: u64,
    /// Graceful restart (RFC 4724): the restart time we announce; `None`: not offered.
    pub graceful_restart: Option<u16>,
    /// The address families we offer (multiprotocol capabilities, RFC 4760).
    pub families: Vec<Family>,
    /// Offer to take IPv4 routes with IPv6 next hops (extended next hop, RFC 8950).
    pub ext_next_hop: bool,
}

impl FsmConfig {
    /// Defaults close to BIRD's (hold 240 s) with test-friendly retry times.
    pub fn new(local_as: Asn, router_id: Ipv4Addr, peer_as: Asn) -> Self {
        FsmConfig {
            local_as,
            router_id,
            peer_as,
            hold_time: 240,
            keepalive: None,
            passive: false,
            connect_retry: Duration::from_secs(5),
            connect_retry_max: Duration::from_secs(120),
            connect_retry_fast: 0,
            refused_retry: None,
            idle_hold: Duration::from_secs(1),
            idle_hold_max: Duration::from_secs(60),
            jitter_seed: 0x9e37_79b9_7f4a_7c15,
            graceful_restart: None,
            families: vec![Family::IPV4_UNICAST],
            ext_next_hop: false,
        }
    }

    pub fn is_external(&self) -> bool {
        self.local_as != self.peer_as
    }

    /// The OPEN we send.
    pub fn open(&self) -> Open {
        let mut caps: Vec<Capability> = self
            .families
            .iter()
            .map(|f| Capability::Multiprotocol(*f))
            .collect();
        if self.ext_next_hop {
            caps.push(Capability::ExtendedNextHop(vec![bgp_wire::ExtNextHop {
                nlri_afi: bgp_wire::Afi::IPV4,
                nlri_safi: 1,
                next_hop_afi: bgp_wire::Afi::IPV6,
            }]));
        }
        caps.extend([
            Capability::RouteRefresh,
            Capability::EnhancedRouteRefresh,
            Capability::FourOctetAs(self.local_as),
        ]);
        if let Some(t) = self.graceful_restart {
            // Forwarding is preserved across a bgpd restart: routewriter keeps the kernel
            // routes while bgpd is away.
            caps.push(Capability::GracefulRestart(bgp_wire::GracefulRestart {
                restarting: false,
                notification: false,
                restart_time: t.min(4095),
                families: self
                    .families
                    .iter()
                    .map(|f| bgp_wire::GrFamily {
                        family: *f,
                        forwarding_preserved: true,
                    })
                    .collect(),
            }));
        }
        Open::new(self.local_as, self.hold_time, self.router_id, caps)
    }
}

/// What happened.
// Events are moved once, straight into `handle`; boxing the message would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Administrative or automatic start.
    Start,
    /// bgpd is going away and will be back (graceful restart): close the connection without
    /// a NOTIFICATION, so that peers keep our routes, and stay Idle.
    Shutdown,
    /// Administrative stop: send Cease (if connected) and stay Idle.
    Stop {
        subcode: u8,
        reason: String,
    },
    /// Our outgoing connection succeeded.
    Connected,
    /// The peer connected to us (and no collision is in play: see [`Event::CollidingOpen`]).
    Accepted,
    /// The connection attempt failed, or the connection closed.
    ConnectionFailed,
    /// The connection attempt was refused: nothing listens at the peer's port (yet).
    ConnectionRefused,
    ConnectionClosed,
    /// A decoded message on the current connection.
    Message(Decoded),
    /// The current connection's bytes did not decode: send its NOTIFICATION.
    DecodeError(DecodeError),
    TimerExpired(Timer),
    /// A second connection's OPEN arrived while this one is in OpenSent/OpenConfirm (or
    /// after the peer ended this one for the collision); `current_inbound` says whether the
    /// current connection was the peer's.
    CollidingOpen {
        open: Open,
        current_inbound: bool,
    },
}

/// What the session task must do, in order.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Connect,
    Send(Message),
    /// Flush what was sent, then close the current connection.
    Disconnect,
    StartTimer(Timer, Duration),
    StopTimer(Timer),
    /// The session is up with these parameters.
    Established(Negotiated),
    /// The session left Established: the peer's routes are gone — or, with `graceful` set,
    /// kept stale for up to that many seconds (the peer offered graceful restart and the
    /// transport failed without a NOTIFICATION).
    Down {
        reason: String,
        graceful: Option<u16>,
    },
    /// An UPDATE for the RIB.
    Deliver(UpdateDecode),
    /// A ROUTE-REFRESH request from the peer: resend the Adj-RIB-Out of the family.
    Refresh(Family),
    /// The peer begins (BoRR) or ends (EoRR) re-advertising its routes of a family
    /// (RFC 7313): at the end, what it did not re-advertise is gone.
    RefreshMarker {
        family: Family,
        begin: bool,
    },
    /// Collision lost by the new connection: send it this Cease and close it.
    RejectColliding(Notification),
    /// Collision won by the new connection: it becomes current (the old one was closed by
    /// the preceding actions); its OPEN was already processed.
    AdoptColliding,
    /// Collision not decided yet: keep the new connection aside and feed its OPEN again
    /// when the state leaves OpenConfirm or [`Timer::CollisionWait`] fires.
    HoldColliding,
}

/// What two OPENs settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub params: SessionParams,
    pub remote_id: Ipv4Addr,
    pub remote_as: Asn,
    /// Seconds; 0 means no hold timer and no keepalives.
    pub hold_time: u16,
    pub keepalive: u16,
    /// The peer's restart time when both sides offered graceful restart for IPv4 unicast.
    pub peer_restart_time: Option<u16>,
    /// Both sides offered enhanced route refresh (RFC 7313): refreshes are framed by
    /// BoRR/EoRR.
    pub enhanced_refresh: bool,
    /// The peer takes IPv4 routes with IPv6 next hops (RFC 8950).
    pub peer_ext_next_hop: bool,
    /// Families of the peer's graceful restart capability that we carry, with its
    /// forwarding-preserved bit: only their routes are kept through its restart (RFC 4724
    /// §4.2).
    pub peer_gr_families: Vec<(Family, bool)>,
}

/// One peer's state machine.
#[derive(Debug, Clone)]
pub struct Fsm {
    config: FsmConfig,
    state: State,
    /// Consecutive failed connection attempts (ConnectRetry back-off).
    attempts: u32,
    /// Consecutive session errors (idle hold back-off).
    errors: u32,
    /// Stopped administratively: no automatic restart.
    stopped: bool,
    negotiated: Option<Negotiated>,
    last_error: Option<String>,
    rng: u64,
    /// A colliding connection is held (see the module text); its next OPEN is decided.
    collision_held: bool,
}

impl Fsm {
    pub fn new(config: FsmConfig) -> Self {
        let rng = config.jitter_seed | 1;
        Fsm {
            config,
            state: State::Idle,
            attempts: 0,
            errors: 0,
            stopped: true,
            negotiated: None,
            last_error: None,
            rng,
            collision_held: false,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn config(&self) -> &FsmConfig {
        &self.config
    }

    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// The last reason the session went down or failed, for operators.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Record why the transport failed (connect errors and timeouts the FSM only sees as
    /// `ConnectionFailed`), for operators.
    pub fn note_transport_error(&mut self, reason: String) {
        self.last_error = Some(reason);
    }

    /// Feed one event; returns the actions in the order they must be performed.
    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Start => self.start(&mut out),
            Event::Shutdown => {
                self.stopped = true;
                self.last_error = Some("stopped for a graceful restart".into());
                self.go_idle(&mut out, None, false);
                out.push(Action::StopTimer(Timer::IdleHold));
            }
            Event::Stop { subcode, reason } => {
                self.stopped = true;
                if self.connected() {
                    // RFC 4486: Maximum Number of Prefixes carries no shutdown text.
                    let n = if subcode == bgp_wire::cease::MAX_PREFIXES {
                        Notification::new(bgp_wire::CEASE, subcode, Vec::new())
                    } else {
                        Notification::shutdown(subcode, &reason)
                    };
                    out.push(Action::Send(Message::Notification(n)));
                }
                self.last_error = Some(format!("stopped: {reason}"));
                self.go_idle(&mut out, None, false);
                out.push(Action::StopTimer(Timer::IdleHold));
            }
            Event::Connected | Event::Accepted => self.connected_event(&mut out),
            Event::ConnectionFailed | Event::ConnectionRefused => match self.state {
                State::Connect | State::Active => {
                    // Try again after the back-off; the passive side keeps waiting.
                    self.state = if self.config.passive {
                        State::Active
                    } else {
                        State::Connect
                    };
                    let d = match self.config.refused_retry {
                        Some(d) if matches!(event, Event::ConnectionRefused) => self.jitter(d),
                        _ => self.retry_delay(),
                    };
                    out.push(Action::StartTimer(Timer::ConnectRetry, d));
                }
                State::Idle => {}
                _ => self.fail(&mut out, "connection failed".into(), None, true),
            },
            Event::ConnectionClosed => match self.state {
                State::Idle => {}
                State::Connect | State::Active => {}
                _ => self.fail(&mut out, "connection closed by peer".into(), None, true),
            },
            Event::DecodeError(e) => {
                if self.connected() {
                    let n = e.notification();
                    self.error(&mut out, format!("sent: {e}"), Some(n));
                }
            }
            Event::TimerExpired(t) => self.timer(t, &mut out),
            Event::Message(m) => self.message(m, &mut out),
            Event::CollidingOpen {
                open,
                current_inbound,
            } => self.collision(open, current_inbound, &mut out),
        }
        out
    }

    fn connected(&self) -> bool {
        matches!(
            self.state,
            State::OpenSent | State::OpenConfirm | State::Established
        )
    }

    fn start(&mut self, out: &mut Vec<Action>) {
        self.stopped = false;
        if self.state != State::Idle {
            return;
        }
        if self.config.passive {
            self.state = State::Active;
        } else {
            self.state = State::Connect;
            out.push(Action::Connect);
            let d = self.retry_delay();
            out.push(Action::StartTimer(Timer::ConnectRetry, d));
        }
    }

    fn connected_event(&mut self, out: &mut Vec<Action>) {
        match self.state {
            State::Connect | State::Active => {
                out.push(Action::StopTimer(Timer::ConnectRetry));
                self.attempts = 0;
                out.push(Action::Send(Message::Open(self.config.open())));
                out.push(Action::StartTimer(Timer::Hold, OPEN_HOLD));
                self.state = State::OpenSent;
            }
            // Idle refuses connections (RFC 4271 §8.2.2).
            State::Idle => out.push(Action::Disconnect),
            // A second connection while connected is a collision, which the session task
            // resolves through `Event::CollidingOpen`; the current one is left alone.
            State::OpenSent | State::OpenConfirm | State::Established => {}
        }
    }

    fn timer(&mut self, t: Timer, out: &mut Vec<Action>) {
        match (t, self.state) {
            (Timer::ConnectRetry, State::Connect | State::Active) => {
                if self.config.passive {
                    return;
                }
                // Abandon the pending attempt and try again.
                out.push(Action::Disconnect);
                self.state = State::Connect;
                out.push(Action::Connect);
                let d = self.retry_delay();
                out.push(Action::StartTimer(Timer::ConnectRetry, d));
            }
            (Timer::Hold, State::OpenSent | State::OpenConfirm | State::Established) => {
                let n = Notification::new(bgp_wire::HOLD_TIMER_EXPIRED, 0, Vec::new());
                let why = if self.state != State::Established {
                    // TCP came up but the exchange stalled: the usual cause is the peer
                    // dropping our packets after the handshake.
                    "hold timer expired before the session was established (the exchange stalled: a TTL security (GTSM) or multihop mismatch, or a filter dropping packets)"
                } else {
                    "hold timer expired"
                };
                self.error(out, why.into(), Some(n));
            }
            (Timer::Keepalive, State::OpenConfirm | State::Established) => {
                out.push(Action::Send(Message::Keepalive));
                if let Some(n) = &self.negotiated
                    && n.keepalive > 0
                {
                    out.push(Action::StartTimer(Timer::Keepalive, secs(n.keepalive)));
                }
            }
            (Timer::IdleHold, State::Idle) if !self.stopped => self.start(out),
            (Timer::Stable, State::Established) => self.errors = 0,
            // A timer from an earlier state that the task had not yet cancelled.
            _ => {}
        }
    }

    fn message(&mut self, m: Decoded, out: &mut Vec<Action>) {
        match (self.state, m) {
            (State::OpenSent, Decoded::Open(open)) => self.open_received(open, out),
            (State::OpenConfirm, Decoded::Keepalive) => {
                let Some(n) = self.negotiated.clone() else {
                    return;
                };
                self.restart_hold(out);
                self.state = State::Established;
                out.push(Action::StartTimer(Timer::Stable, STABLE_AFTER));
                out.push(Action::Established(n));
            }
            (State::Established, Decoded::Keepalive) => self.restart_hold(out),
            (State::Established, Decoded::Update(u)) => {
                self.restart_hold(out);
                out.push(Action::Deliver(u));
            }
            (State::Established, Decoded::RouteRefresh(r)) => {
                self.restart_hold(out);
                // Only families the session carries; unknown subtypes are ignored (RFC 7313 §5).
                let family = r.family;
                let carried = self.negotiated.as_ref().is_some_and(|n| match family {
                    Family::IPV4_UNICAST => n.params.ipv4_unicast,
                    Family::IPV6_UNICAST => n.params.ipv6_unicast,
                    _ => false,
                });
                // Without enhanced route refresh the subtype octet is RFC 2918's Reserved
                // field, which the receiver ignores: every message is a refresh request (as
                // BIRD reads it), never a BoRR / EoRR that would sweep the peer's routes.
                let enhanced = self.negotiated.as_ref().is_some_and(|n| n.enhanced_refresh);
                if carried && !enhanced {
                    out.push(Action::Refresh(family));
                } else if carried {
                    match r.subtype {
                        bgp_wire::RefreshSubtype::Normal => out.push(Action::Refresh(family)),
                        bgp_wire::RefreshSubtype::Begin => out.push(Action::RefreshMarker {
                            family,
                            begin: true,
                        }),
                        bgp_wire::RefreshSubtype::End => out.push(Action::RefreshMarker {
                            family,
                            begin: false,
                        }),
                        bgp_wire::RefreshSubtype::Other(_) => {}
                    }
                }
            }
            (State::OpenSent | State::OpenConfirm, Decoded::Notification(n))
                if n.code == bgp_wire::CEASE && n.subcode == cease::CONNECTION_COLLISION =>
            {
                // The peer resolved a collision for its other connection with us, which we
                // hold aside or are about to get: only this connection ends. (Taken as an
                // error, both sides dropped the session whenever this came before our own
                // resolution.)
                self.last_error = Some(format!("received: {}", describe(&n)));
                out.push(Action::Disconnect);
                out.push(Action::StopTimer(Timer::Hold));
                out.push(Action::StopTimer(Timer::Keepalive));
                self.negotiated = None;
                if self.config.passive {
                    self.state = State::Active;
                } else {
                    self.state = State::Connect;
                    let d = self.retry_delay();
                    out.push(Action::StartTimer(Timer::ConnectRetry, d));
                }
            }
            (_, Decoded::Notification(n)) => {
                // Never answer a NOTIFICATION.
                self.error(out, format!("received: {}", describe(&n)), None);
            }
            (State::Idle | State::Connect | State::Active, _) => {}
            (_, other) => {
                // RFC 4271 §8.2.2: any other message in these states is an FSM error
                // (RFC 6608 subcodes by state).
                let sub = match self.state {
                    State::OpenSent => 1,
                    State::OpenConfirm => 2,
                    _ => 3,
                };
                let n = Notification::new(bgp_wire::FSM_ERROR, sub, Vec::new());
                self.error(
                    out,
                    format!("unexpected {} in {}", kind(&other), self.state.name()),
                    Some(n),
                );
            }
        }
    }

    /// Validate the peer's OPEN and negotiate; on success send KEEPALIVE and go OpenConfirm.
    fn open_received(&mut self, open: Open, out: &mut Vec<Action>) {
        match self.negotiate(&open) {
            Ok(n) => {
                out.push(Action::StopTimer(Timer::ConnectRetry));
                out.push(Action::Send(Message::Keepalive));
                if n.hold_time > 0 {
                    out.push(Action::StartTimer(Timer::Hold, secs(n.hold_time)));
                    out.push(Action::StartTimer(Timer::Keepalive, secs(n.keepalive)));
                } else {
                    out.push(Action::StopTimer(Timer::Hold));
                    out.push(Action::StopTimer(Timer::Keepalive));
                }
                self.negotiated = Some(n);
                self.state = State::OpenConfirm;
            }
            Err(e) => {
                let n = e.notification();
                self.error(out, format!("sent: {e}"), Some(n));
            }
        }
    }

    fn negotiate(&self, open: &Open) -> Result<Negotiated, DecodeError> {
        if open.asn() != self.config.peer_as {
            return Err(DecodeError::with_data(
                ErrorKind::BadPeerAs,
                "peer AS differs from the configured one",
                &open.my_as.to_be_bytes(),
            ));
        }
        let id = open.bgp_id;
        if id.is_unspecified()
            || id.is_multicast()
            || (!self.config.is_external() && id == self.config.router_id)
        {
            return Err(DecodeError::new(
                ErrorKind::BadBgpIdentifier,
                "peer BGP identifier is 0, multicast or equal to ours",
            ));
        }
        let hold = self.config.hold_time.min(open.hold_time);
        if hold == 1 || hold == 2 {
            return Err(DecodeError::new(
                ErrorKind::UnacceptableHoldTime,
                "hold time must be 0 or at least 3",
            ));
        }
        let keepalive = if hold == 0 {
            0
        } else {
            let third = (hold / 3).max(1);
            self.config.keepalive.map_or(third, |k| k.clamp(1, third))
        };
        let peer_restart_time = open
            .graceful_restart()
            .filter(|_| self.config.graceful_restart.is_some())
            .filter(|g| {
                g.restart_time > 0
                    && g.families
                        .iter()
                        .any(|f| self.config.families.contains(&f.family))
            })
            .map(|g| g.restart_time);
        Ok(Negotiated {
            params: SessionParams::negotiate(&self.config.open(), open, self.config.is_external()),
            remote_id: id,
            remote_as: open.asn(),
            hold_time: hold,
            keepalive,
            peer_restart_time,
            enhanced_refresh: open
                .capabilities
                .iter()
                .any(|c| matches!(c, Capability::EnhancedRouteRefresh)),
            peer_gr_families: open
                .graceful_restart()
                .filter(|_| self.config.graceful_restart.is_some())
                .map(|g| {
                    g.families
                        .iter()
                        .filter(|f| self.config.families.contains(&f.family))
                        .map(|f| (f.family, f.forwarding_preserved))
                        .collect()
                })
                .unwrap_or_default(),
            peer_ext_next_hop: open.ext_next_hops().any(|t| {
                t.nlri_afi == bgp_wire::Afi::IPV4
                    && t.nlri_safi == 1
                    && t.next_hop_afi == bgp_wire::Afi::IPV6
            }),
        })
    }

    fn collision(&mut self, open: Open, current_inbound: bool, out: &mut Vec<Action>) {
        let reject = Notification::new(bgp_wire::CEASE, cease::CONNECTION_COLLISION, Vec::new());
        let held_before = std::mem::take(&mut self.collision_held);
        match self.state {
            State::OpenSent | State::OpenConfirm => {
                // The connection opened by the speaker with the higher BGP identifier
                // survives. The colliding one is the peer's (inbound); the current one is
                // ours unless inbound.
                let keep_current =
                    !current_inbound && u32::from(self.config.router_id) > u32::from(open.bgp_id);
                if keep_current {
                    out.push(Action::RejectColliding(reject));
                    return;
                }
                // Ours confirmed: the peer may be Established on it (see the module text).
                if self.state == State::OpenConfirm && !current_inbound && !held_before {
                    self.collision_held = true;
                    out.push(Action::HoldColliding);
                    out.push(Action::StartTimer(Timer::CollisionWait, COLLISION_WAIT));
                    return;
                }
                out.push(Action::Send(Message::Notification(reject)));
                out.push(Action::Disconnect);
            }
            // Ours ended meanwhile (the peer chose this one and said so): it is the one.
            State::Connect | State::Active => {
                out.push(Action::StopTimer(Timer::ConnectRetry));
                self.attempts = 0;
            }
            // Established (or stopped): the new connection loses (RFC 4271 §6.8).
            _ => {
                out.push(Action::RejectColliding(reject));
                return;
            }
        }
        out.push(Action::AdoptColliding);
        // The new connection: we send our OPEN on it, then process its OPEN.
        self.state = State::OpenSent;
        self.negotiated = None;
        out.push(Action::Send(Message::Open(self.config.open())));
        self.open_received(open, out);
    }

    fn restart_hold(&self, out: &mut Vec<Action>) {
        if let Some(n) = &self.negotiated
            && n.hold_time > 0
        {
            out.push(Action::StartTimer(Timer::Hold, secs(n.hold_time)));
        }
    }

    /// A session error: optionally send a NOTIFICATION, drop the connection, go Idle and
    /// restart after the idle hold (doubling per consecutive error).
    fn error(&mut self, out: &mut Vec<Action>, reason: String, notify: Option<Notification>) {
        self.fail(out, reason, notify, false);
    }

    /// An error ends the session; `transport` says it was the connection that failed (no
    /// NOTIFICATION either way), which graceful restart survives.
    fn fail(
        &mut self,
        out: &mut Vec<Action>,
        reason: String,
        notify: Option<Notification>,
        transport: bool,
    ) {
        if let Some(n) = notify {
            out.push(Action::Send(Message::Notification(n)));
        }
        self.last_error = Some(reason.clone());
        self.errors = self.errors.saturating_add(1);
        self.go_idle(out, Some(reason), transport);
        if !self.stopped {
            let d = backoff(
                self.config.idle_hold,
                self.config.idle_hold_max,
                self.errors,
            );
            out.push(Action::StartTimer(Timer::IdleHold, d));
        }
    }

    fn go_idle(&mut self, out: &mut Vec<Action>, reason: Option<String>, transport: bool) {
        let was = self.state;
        if was != State::Idle {
            out.push(Action::Disconnect);
        }
        self.collision_held = false;
        for t in [
            Timer::ConnectRetry,
            Timer::Hold,
            Timer::Keepalive,
            Timer::Stable,
            Timer::CollisionWait,
        ] {
            out.push(Action::StopTimer(t));
        }
        if was == State::Established {
            let graceful = self
                .negotiated
                .as_ref()
                .and_then(|n| n.peer_restart_time)
                .filter(|_| transport);
            out.push(Action::Down {
                reason: reason.unwrap_or_else(|| "stopped".into()),
                graceful,
            });
        }
        self.negotiated = None;
        self.state = State::Idle;
    }

    /// The next ConnectRetry interval: doubled per failed attempt, capped, jittered to
    /// 75–100 % (RFC 4271 §10) so peers that failed together do not retry together.
    fn retry_delay(&mut self) -> Duration {
        let base = backoff(
            self.config.connect_retry,
            self.config.connect_retry_max,
            self.attempts
                .saturating_add(1)
                .saturating_sub(self.config.connect_retry_fast),
        );
        self.attempts = self.attempts.saturating_add(1);
        self.jitter(base)
    }

    fn jitter(&mut self, d: Duration) -> Duration {
        // xorshift64: good enough to spread retries, deterministic for tests.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let permille = 750 + (self.rng % 251) as u32;
        d * permille / 1000
    }
}

fn backoff(base: Duration, max: Duration, n: u32) -> Duration {
    let shift = n.saturating_sub(1).min(16);
    base.saturating_mul(1u32 << shift).min(max)
}

fn secs(s: u16) -> Duration {
    Duration::from_secs(u64::from(s))
}

fn kind(m: &Decoded) -> &'static str {
    match m {
        Decoded::Open(_) => "OPEN",
        Decoded::Update(_) => "UPDATE",
        Decoded::Notification(_) => "NOTIFICATION",
        Decoded::Keepalive => "KEEPALIVE",
        Decoded::RouteRefresh(_) => "ROUTE-REFRESH",
    }
}

/// A NOTIFICATION in words, like BIRD's "Received: Hold timer expired".
pub fn describe(n: &Notification) -> String {
    let what = match (n.code, n.subcode) {
        (1, _) => "Message header error",
        (2, 2) => "Bad peer AS",
        (2, 3) => "Bad BGP identifier",
        (2, 6) => "Unacceptable hold time",
        (2, _) => "OPEN message error",
        (3, _) => "UPDATE message error",
        (4, _) => "Hold timer expired",
        (5, _) => "Finite state machine error",
        (6, 2) => "Administrative shutdown",
        (6, 3) => "Peer de-configured",
        (6, 4) => "Administrative reset",
        (6, 5) => "Connection rejected",
        (6, 7) => "Connection collision resolution",
        (6, _) => "Cease",
        _ => "Unknown error",
    };
    match n.shutdown_communication() {
        Some(t) if !t.is_empty() => format!("{what} ({n}): {t}"),
        _ => format!("{what} ({n})"),
    }
}

#[cfg(test)]
mod tests;
