//! One peer's session task: owns the TCP connection and the timers, and drives the [`Fsm`].
//!
//! Why this file is long: one task's event loop and everything it does (connecting and
//! collisions, reading and framing, performing the FSM's actions, the write queue) work on
//! the one `Session`; split, each part would need the whole of its state.
//!
//! **Job.** Move bytes and time: connect or take an accepted connection, frame and decode
//! what arrives (`bgp_wire`), feed the FSM, perform its actions, encode and write what the
//! speaker hands over (Adj-RIB-Out changes), report state changes and UPDATEs to the speaker.
//!
//! **Boundaries.** Decides nothing: protocol decisions are the FSM's, routes are the RIB's
//! (in the speaker task). The only owner of this peer's sockets.
//!
//! Channels: session → speaker is bounded (a slow RIB slows our reads, which is TCP
//! back-pressure on the peer); speaker → session is unbounded because the speaker must never
//! wait on one session (two tasks waiting on each other's full queues would deadlock), and
//! what it queues is bounded by the Adj-RIB-Out it diffs against.
//!
//! **Writes never block the task.** Encoded messages go to a write queue that the task's
//! loop drains whenever the socket is writable, next to reading, timers and commands; a
//! peer that stops reading cannot freeze our hold timer or FSM. The queue is bounded: above
//! [`OUT_HIGH_WATER`] the task stops taking Adj-RIB-Out changes from the speaker (they wait
//! in the channel) until the peer catches up. A peer that takes nothing for the hold time
//! while we have something to send is treated like an expired hold timer (NOTIFICATION
//! attempted, connection closed).
//!
//! **Never drop an attempt that may have connected.** The peer's connection, accepted while
//! our own attempt is pending, waits for that attempt: the peer may already hold ours. If
//! ours connects, the two collide and the FSM decides by BGP identifiers, as the peer does.
//! One accepted while we wait to restart after an error waits for the restart.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::SystemTime;

use bgp_wire::{
    Decoded, Family, Message, Open, SessionParams, Split, UpdateDecode, cease, decode_message,
    split_message,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};

use super::mailbox;
use super::sockopt::Transport;
use bgp::fsm::{Action, Event, Fsm, State, Timer};
use bgp::rib::{FamilyUpdate, OutUpdate, PeerId};

/// Largest message plus a read's worth: the receive buffer never needs more.
const RX_BUF: usize = 2 * bgp_wire::MAX_EXTENDED_MESSAGE_LEN;
/// How long a colliding connection gets to send its OPEN.
const COLLISION_OPEN_WAIT: Duration = Duration::from_secs(10);
/// Queued output above which the task takes no more route changes from the speaker.
pub const OUT_HIGH_WATER: usize = 8 << 20;
/// Room the write queue keeps once drained.
const OUT_KEEP: usize = 1024;
/// How long closing a connection may wait for queued messages (a final NOTIFICATION) to go.
const FLUSH_ON_CLOSE: Duration = Duration::from_secs(1);
/// Write-stall limit when no hold time applies (hold time 0 negotiated).
const DEFAULT_STALL: Duration = Duration::from_secs(240);

/// The address families a session carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    pub ipv4: bool,
    pub ipv6: bool,
}

impl Families {
    pub const NONE: Families = Families {
        ipv4: false,
        ipv6: false,
    };

    /// What a session negotiated.
    pub fn negotiated(p: &SessionParams) -> Self {
        Families {
            ipv4: p.ipv4_unicast,
            ipv6: p.ipv6_unicast,
        }
    }

    /// The session's own family only (BIRD's and FRR's default: a channel per session
    /// family).
    pub fn of(address: IpAddr) -> Self {
        Families {
            ipv4: address.is_ipv4(),
            ipv6: address.is_ipv6(),
        }
    }

    pub fn list(self) -> Vec<Family> {
        let mut v = Vec::with_capacity(2);
        if self.ipv4 {
            v.push(Family::IPV4_UNICAST);
        }
        if self.ipv6 {
            v.push(Family::IPV6_UNICAST);
        }
        v
    }
}

/// What the speaker tells a session.
///
/// Kept small (the payloads are boxed): the channel allocates its slots 32 at a time, and
/// every session holds such a block for its whole life, idle or not.
#[derive(Debug)]
pub enum ToSession {
    /// Changes to advertise, computed for the session's `epoch`th Established period.
    Routes {
        epoch: u64,
        update: Box<FamilyUpdate>,
    },
    /// The peer connected to our listener.
    Incoming(Box<TcpStream>),
    /// Leave: send Cease with this subcode and end the task.
    Stop { subcode: u8, reason: Box<str> },
    /// Leave for a graceful restart: close without a NOTIFICATION and end the task.
    Shutdown,
    /// The initial routes of the `epoch`th Established period are all sent: End-of-RIB
    /// for every negotiated family.
    EndOfRib { epoch: u64 },
    /// The whole Adj-RIB-Out of a family again, for the peer's ROUTE-REFRESH (framed by
    /// BoRR/EoRR when enhanced route refresh was negotiated).
    Refresh {
        epoch: u64,
        update: Box<FamilyUpdate>,
    },
    /// Ask the peer to send its routes again (ROUTE-REFRESH).
    RequestRefresh,
}

/// What a session tells the speaker.
// Sent once per UPDATE through a channel; boxing would add an allocation per message.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum FromSession {
    State {
        id: PeerId,
        state: State,
        since: SystemTime,
        last_error: Option<String>,
    },
    /// Established: `epoch` counts Established periods of this session.
    Up {
        id: PeerId,
        epoch: u64,
        remote_id: Ipv4Addr,
        /// Our address on the connection.
        local_address: IpAddr,
        /// Families both sides offered.
        families: Families,
        /// The peer takes IPv4 routes with IPv6 next hops (RFC 8950).
        peer_ext_next_hop: bool,
        /// The peer's restart time, when both sides offered graceful restart.
        peer_restart_time: Option<u16>,
        /// The families whose routes are kept through the peer's restart, with its
        /// forwarding-preserved bit.
        peer_gr_families: Vec<(Family, bool)>,
    },
    /// Left Established; with `graceful`, the peer's routes are kept stale that long.
    Down {
        id: PeerId,
        epoch: u64,
        graceful: Option<u16>,
    },
    /// The peer's End-of-RIB for a family.
    EndOfRib {
        id: PeerId,
        epoch: u64,
        family: Family,
    },
    /// A message from the peer was malformed beyond repair: the session is reset.
    MalformedReset { id: PeerId },
    /// The peer begins or ends an enhanced route refresh (RFC 7313).
    RefreshMarker {
        id: PeerId,
        epoch: u64,
        family: Family,
        begin: bool,
    },
    Update {
        id: PeerId,
        epoch: u64,
        /// Boxed: an UPDATE's parts are most of this enum's size otherwise, and the speaker's
        /// queue allocates room for 32 messages at a time (15 KB a block unboxed, 2 KB boxed:
        /// the message is 64 bytes, the decoded UPDATE 456).
        update: Box<UpdateDecode>,
    },
    /// The peer asked for our routes of a family again (ROUTE-REFRESH).
    Refresh {
        id: PeerId,
        epoch: u64,
        family: Family,
    },
}

/// The deadlines of the FSM's running timers, one slot per kind: a handful of kinds, so an
/// array in the session rather than a map of its own on the heap for every session.
#[derive(Debug, Default)]
struct Timers([Option<Instant>; Timers::KINDS]);

impl Timers {
    const KINDS: usize = 6;

    /// Every kind, each at its slot (a test checks the two agree; `slot`'s match is
    /// exhaustive, so a new kind must be given a slot, and then a place here).
    const ALL: [Timer; Self::KINDS] = [
        Timer::ConnectRetry,
        Timer::Hold,
        Timer::Keepalive,
        Timer::IdleHold,
        Timer::Stable,
        Timer::CollisionWait,
    ];

    fn slot(t: Timer) -> usize {
        match t {
            Timer::ConnectRetry => 0,
            Timer::Hold => 1,
            Timer::Keepalive => 2,
            Timer::IdleHold => 3,
            Timer::Stable => 4,
            Timer::CollisionWait => 5,
        }
    }

    fn set(&mut self, t: Timer, at: Instant) {
        self.0[Self::slot(t)] = Some(at);
    }

    fn stop(&mut self, t: Timer) {
        self.0[Self::slot(t)] = None;
    }

    fn is_running(&self, t: Timer) -> bool {
        self.0[Self::slot(t)].is_some()
    }

    /// The earliest deadline.
    fn next(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }

    /// The timers due at `now`, in a fixed order.
    fn due(&self, now: Instant) -> impl Iterator<Item = Timer> + use<> {
        let slots = self.0;
        Self::ALL
            .into_iter()
            .filter(move |t| slots[Self::slot(*t)].is_some_and(|d| d <= now))
    }

    /// Stops `t` if it is still due at `now` (handling an earlier timer may have stopped or
    /// restarted it), telling whether it was.
    fn take_due(&mut self, t: Timer, now: Instant) -> bool {
        let slot = &mut self.0[Self::slot(t)];
        let due = slot.is_some_and(|d| d <= now);
        if due {
            *slot = None;
        }
        due
    }
}

/// A colliding connection whose OPEN has been read.
struct Colliding {
    stream: TcpStream,
    open: Open,
    rest: Vec<u8>,
}

/// The session task's state.
pub struct Session {
    id: PeerId,
    remote: SocketAddr,
    fsm: Fsm,
    to_speaker: mpsc::Sender<FromSession>,
    stream: Option<TcpStream>,
    inbound: bool,
    /// The start of a message whose end has not arrived yet; usually empty. Reads go to the
    /// thread's shared receive buffer ([`scratch`]): a mesh node has a session per node, and
    /// most of them only ever see keepalives.
    rx: Vec<u8>,
    /// The write queue: bytes not yet taken by the socket start at `out_at`.
    out: Vec<u8>,
    out_at: usize,
    /// When the socket last took bytes (or the queue became non-empty).
    out_progress: Instant,
    params: SessionParams,
    timers: Timers,
    connecting: bool,
    /// The peer's connection, accepted while our own attempt was pending or while we wait to
    /// restart after an error: it waits for that (see [`Session::incoming`]).
    waiting: Option<TcpStream>,
    /// A colliding connection the FSM holds until ours settles ([`Action::HoldColliding`]).
    held: Option<Colliding>,
    /// Bumped by every Connect action: a retry abandons the attempt still pending.
    attempt: u64,
    epoch: u64,
    /// OPENs read aside from colliding connections; made at the first collision (a channel
    /// holds room for 32 messages from the start, and most sessions never collide).
    colliding: Option<(mpsc::Sender<Colliding>, mpsc::Receiver<Colliding>)>,
    /// MD5 key and TTLs for the connections we open.
    transport: Transport,
}

impl Session {
    pub fn new(
        id: PeerId,
        remote: SocketAddr,
        fsm: Fsm,
        to_speaker: mpsc::Sender<FromSession>,
    ) -> Self {
        Session {
            id,
            remote,
            fsm,
            to_speaker,
            stream: None,
            inbound: false,
            rx: Vec::new(),
            out: Vec::new(),
            out_at: 0,
            out_progress: Instant::now(),
            params: SessionParams::default(),
            timers: Timers::default(),
            connecting: false,
            waiting: None,
            held: None,
            attempt: 0,
            epoch: 0,
            colliding: None,
            transport: Transport::default(),
        }
    }

    /// Connections we open carry this MD5 key and these TTLs.
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Why a connect failed, with the hint an operator needs when MD5 is on.
    fn connect_failed(&mut self, what: String) {
        let mut hint = String::new();
        if self.transport.password.is_some() {
            hint.push_str(
                "; TCP MD5 is on for this peer: a wrong or missing password on either side looks like this",
            );
        }
        if self.transport.ttl_security_hops.is_some() {
            hint.push_str(
                "; TTL security (GTSM) is on for this peer: a peer that does not send TTL 255 looks like this",
            );
        }
        self.fsm
            .note_transport_error(format!("connect to {}: {what}{hint}", self.remote));
    }

    /// Run until told to stop or the speaker goes away.
    ///
    /// What each event sets off (`feed`, `receive`, ...) is awaited boxed: unboxed, the task
    /// would hold room for the deepest of those chains (events, actions and messages by
    /// value, several levels deep: 5.3 KB of 5.3 KB in a debug build) for its whole life,
    /// while it mostly waits; boxed, that room is taken for one event at a time.
    #[expect(
        clippy::too_many_lines,
        reason = "the session task's select loop: commands, the socket, connect attempts and timers in one `select!`, which is the hot path and is kept whole"
    )]
    pub async fn run(mut self, mut commands: mailbox::Receiver<ToSession>) {
        Box::pin(self.feed(Event::Start)).await;
        let mut connect: Option<
            std::pin::Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send>>,
        > = None;
        let mut connect_attempt = 0;
        loop {
            if connect_attempt != self.attempt && connect.take().is_some() {
                // A retry abandons an attempt the peer never answered.
                self.connect_failed("no answer within the connect retry time".into());
                Box::pin(self.report_state()).await;
            }
            if self.connecting && connect.is_none() {
                connect_attempt = self.attempt;
                let addr = self.remote;
                let transport = self.transport.clone();
                connect = Some(Box::pin(async move { connect_to(addr, &transport).await }));
            }
            if !self.connecting {
                connect = None;
            }
            let deadline = self.timers.next();
            let stall = self.stall_deadline();
            // Above the high-water mark, route changes wait in the channel.
            let take_commands = self.queued() < OUT_HIGH_WATER;
            let stream = self.stream.as_ref();
            let pending = self.out.get(self.out_at..).unwrap_or_default();
            tokio::select! {
                cmd = commands.recv(), if take_commands => match cmd {
                    None => {
                        Box::pin(self.stop(cease::PEER_DECONFIGURED, "speaker stopped")).await;
                        return;
                    }
                    Some(ToSession::Stop { subcode, reason }) => {
                        Box::pin(self.stop(subcode, &reason)).await;
                        return;
                    }
                    Some(ToSession::Shutdown) => {
                        Box::pin(self.feed(Event::Shutdown)).await;
                        return;
                    }
                    Some(ToSession::Refresh { epoch, update }) => self.refresh(epoch, *update),
                    Some(ToSession::RequestRefresh) => {
                        if self.fsm.state() == State::Established {
                            for family in self.families() {
                                let r = bgp_wire::RouteRefresh::new(
                                    family,
                                    bgp_wire::RefreshSubtype::Normal,
                                );
                                self.send(&Message::RouteRefresh(r));
                            }
                        }
                    }
                    Some(ToSession::EndOfRib { epoch }) => {
                        if self.fsm.state() == State::Established && epoch == self.epoch {
                            for family in self.families() {
                                if let Some(u) = bgp_wire::Update::end_of_rib(family) {
                                    self.send(&Message::Update(u));
                                }
                            }
                        }
                    }
                    Some(ToSession::Routes { epoch, update }) => self.routes(epoch, *update),
                    Some(ToSession::Incoming(s)) => Box::pin(self.incoming(*s)).await,
                },
                res = async {
                    match connect.as_mut() {
                        Some(c) => c.await,
                        None => std::future::pending().await,
                    }
                } => {
                    connect = None;
                    self.connecting = false;
                    match res {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            self.adopt(s, false, Vec::new());
                            Box::pin(self.feed(Event::Connected)).await;
                        }
                        Err(e) => {
                            tracing::debug!(peer = %self.remote, error = %e, "connect failed");
                            self.connect_failed(e.to_string());
                            let event = if e.kind() == std::io::ErrorKind::ConnectionRefused {
                                Event::ConnectionRefused
                            } else {
                                Event::ConnectionFailed
                            };
                            Box::pin(self.feed(event)).await;
                        }
                    }
                    // Ours connected: the waiting one collides with it; ours failed: the
                    // waiting one is the connection.
                    if let Some(w) = self.waiting.take() {
                        Box::pin(self.incoming(w)).await;
                    }
                }
                // Readiness, not a read: no buffer is held while the peer is quiet.
                r = async {
                    match stream {
                        Some(s) => s.readable().await,
                        None => std::future::pending().await,
                    }
                } => match r {
                    Ok(()) => Box::pin(self.receive()).await,
                    Err(_) => {
                        self.drop_connection();
                        Box::pin(self.feed(Event::ConnectionClosed)).await;
                    }
                },
                w = async {
                    match stream {
                        Some(s) if !pending.is_empty() => {
                            s.writable().await?;
                            s.try_write(pending)
                        }
                        _ => std::future::pending().await,
                    }
                } => match w {
                    Ok(n) if n > 0 => self.wrote(n),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {} // stale readiness
                    _ => {
                        tracing::debug!(peer = %self.remote, "write failed");
                        self.drop_connection();
                        Box::pin(self.feed(Event::ConnectionClosed)).await;
                    }
                },
                _ = async {
                    match stall {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => {
                    tracing::warn!(peer = %self.remote, queued = self.queued(), "the peer has taken none of our messages for the hold time; closing");
                    // Treated as an expired hold timer: NOTIFICATION (if it still fits), close.
                    self.timers.stop(Timer::Hold);
                    Box::pin(self.feed(Event::TimerExpired(Timer::Hold))).await;
                    // Whatever the FSM did, this connection is done.
                    if self.stream.is_some() {
                        self.drop_connection();
                        Box::pin(self.feed(Event::ConnectionClosed)).await;
                    }
                }
                Some(c) = async {
                    match self.colliding.as_mut() {
                        Some((_, rx)) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => Box::pin(self.collision(c)).await,
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => {
                    let now = Instant::now();
                    for t in self.timers.due(now) {
                        if !self.timers.take_due(t, now) {
                            continue;
                        }
                        if t == Timer::ConnectRetry && let Some(w) = self.waiting.take() {
                            // Our attempt went unanswered; the peer's connection is there.
                            self.connecting = false;
                            Box::pin(self.incoming(w)).await;
                            continue;
                        }
                        if t == Timer::CollisionWait {
                            if let Some(c) = self.held.take() {
                                Box::pin(self.collision(c)).await;
                            }
                            continue;
                        }
                        Box::pin(self.feed(Event::TimerExpired(t))).await;
                        if t == Timer::IdleHold && let Some(w) = self.waiting.take() {
                            // The peer's connection is the restart: an attempt of ours as
                            // well would only collide with it.
                            self.connecting = false;
                            Box::pin(self.incoming(w)).await;
                        }
                    }
                }
            }
        }
    }

    /// Bytes queued for the socket.
    fn queued(&self) -> usize {
        self.out.len().saturating_sub(self.out_at)
    }

    /// The socket took `n` queued bytes.
    fn wrote(&mut self, n: usize) {
        self.out_at = self.out_at.saturating_add(n).min(self.out.len());
        self.out_progress = Instant::now();
        if self.out_at == self.out.len() {
            // Drained: a table's worth of room is given back (a mesh node would otherwise keep
            // its largest burst per peer); a KEEPALIVE's is kept.
            if self.out.capacity() > OUT_KEEP {
                self.out = Vec::new();
            } else {
                self.out.clear();
            }
            self.out_at = 0;
        } else if self.out_at > self.out.len() / 2 && self.out_at > 64 * 1024 {
            // Reclaim the written front now and then, not on every write.
            self.out.drain(..self.out_at);
            self.out_at = 0;
        }
    }

    /// When a stalled write queue ends the connection: the hold time after the socket last
    /// took anything, while something waits.
    fn stall_deadline(&self) -> Option<Instant> {
        if self.stream.is_none() || self.queued() == 0 {
            return None;
        }
        let hold = self
            .fsm
            .negotiated()
            .map_or(self.fsm.config().hold_time, |n| n.hold_time);
        let limit = if hold == 0 {
            DEFAULT_STALL
        } else {
            Duration::from_secs(u64::from(hold))
        };
        Some(self.out_progress + limit)
    }

    /// Forget the connection and whatever was queued for it.
    fn drop_connection(&mut self) {
        self.stream = None;
        self.out.clear();
        self.out_at = 0;
        self.rx = Vec::new();
    }

    fn adopt(&mut self, s: TcpStream, inbound: bool, rest: Vec<u8>) {
        self.stream = Some(s);
        self.inbound = inbound;
        self.out.clear();
        self.out_at = 0;
        self.params = SessionParams::default();
        self.rx = rest;
    }

    /// The socket is readable: read into the shared receive buffer after the partial message
    /// kept from the last read, handle every complete message, keep the new partial one.
    async fn receive(&mut self) {
        let Some(s) = self.stream.as_ref() else {
            return;
        };
        let mut buf = scratch::take();
        buf.extend_from_slice(&self.rx);
        let open = match s.try_read_buf(&mut buf) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => true, // stale readiness
            Ok(n) if n > 0 => {
                let used = self.drain_messages(&buf).await;
                self.rx.clear();
                match buf.get(used..) {
                    Some(rest) if !rest.is_empty() && self.stream.is_some() => {
                        self.rx.extend_from_slice(rest)
                    }
                    _ => self.rx = Vec::new(),
                }
                true
            }
            _ => false,
        };
        scratch::give(buf);
        if !open {
            self.drop_connection();
            self.feed(Event::ConnectionClosed).await;
        }
    }

    /// Frame and decode the messages at the start of `data`; feed each to the FSM. Returns
    /// how many bytes were used: the rest is a partial message (all of `data` is used when
    /// the connection ended).
    async fn drain_messages(&mut self, data: &[u8]) -> usize {
        let mut start = 0;
        loop {
            if self.stream.is_none() {
                return data.len();
            }
            let buf = data.get(start..).unwrap_or_default();
            match split_message(buf, &self.params) {
                Split::Message(len) => {
                    let msg = buf.get(..len).unwrap_or_default();
                    let event = match decode_message(msg, &self.params) {
                        Ok(d) => Event::Message(d),
                        Err(e) => {
                            tracing::warn!(peer = %self.remote, error = %e, "bad message");
                            let _ = self
                                .to_speaker
                                .send(FromSession::MalformedReset { id: self.id })
                                .await;
                            Event::DecodeError(e)
                        }
                    };
                    start = start.saturating_add(len);
                    self.feed(event).await;
                }
                Split::Incomplete(_) => break,
                Split::Error(e) => {
                    tracing::warn!(peer = %self.remote, error = %e, "bad message header");
                    let _ = self
                        .to_speaker
                        .send(FromSession::MalformedReset { id: self.id })
                        .await;
                    self.feed(Event::DecodeError(e)).await;
                    return data.len();
                }
            }
        }
        start
    }

    async fn incoming(&mut self, s: TcpStream) {
        let _ = s.set_nodelay(true);
        match self.fsm.state() {
            // Restarting after an error: the connection waits for the restart. Refused
            // (dropped), it failed the peer's session too, and two nodes that both connect
            // then each restarted into the other's idle hold, for ever.
            State::Idle if self.timers.is_running(Timer::IdleHold) => self.waiting = Some(s),
            State::Idle => {} // stopped: refused
            State::Connect | State::Active if self.connecting => {
                // Our own attempt may already be connected at the peer, which may be
                // deciding the same way about ours: dropping either side's attempt here
                // left each side on the connection the other had just closed (two nodes
                // that connect to each other at once, over and over). So this one waits
                // for our attempt: connected, the two collide (RFC 4271 §6.8, decided by
                // BGP identifiers on both sides); failed, this one is taken.
                self.waiting = Some(s);
            }
            State::Connect | State::Active => {
                self.adopt(s, true, Vec::new());
                self.feed(Event::Accepted).await;
            }
            _ => {
                // Collision: read its OPEN aside, then let the FSM decide (RFC 4271 §6.8).
                let tx = self
                    .colliding
                    .get_or_insert_with(|| mpsc::channel(2))
                    .0
                    .clone();
                tokio::spawn(async move {
                    if let Ok(Some(c)) =
                        tokio::time::timeout(COLLISION_OPEN_WAIT, read_open(s)).await
                    {
                        let _ = tx.send(c).await;
                    }
                });
            }
        }
    }

    async fn collision(&mut self, c: Colliding) {
        let current_inbound = self.inbound;
        let actions = self.fsm.handle(Event::CollidingOpen {
            open: c.open.clone(),
            current_inbound,
        });
        let mut pending = Some(c);
        for a in actions {
            match a {
                Action::RejectColliding(n) => {
                    if let Some(mut c) = pending.take() {
                        let mut out = Vec::new();
                        if n.encode(&mut out, bgp_wire::MAX_MESSAGE_LEN).is_ok() {
                            let _ = c.stream.write_all(&out).await;
                        }
                    }
                }
                Action::AdoptColliding => {
                    if let Some(c) = pending.take() {
                        self.connecting = false;
                        self.adopt(c.stream, true, c.rest);
                    }
                }
                Action::HoldColliding => self.held = pending.take(),
                other => self.perform(other).await,
            }
        }
        self.report_state().await;
    }

    async fn feed(&mut self, event: Event) {
        let before = self.fsm.state();
        let actions = self.fsm.handle(event);
        for a in actions {
            self.perform(a).await;
        }
        if self.fsm.state() != before {
            self.report_state().await;
        }
        // Ours settled (Established, closed or failed): the held connection's turn.
        if self.fsm.state() != State::OpenConfirm
            && let Some(c) = self.held.take()
        {
            self.collision(c).await;
        }
    }

    async fn report_state(&mut self) {
        tracing::debug!(peer = %self.remote, state = self.fsm.state().name(), inbound = self.inbound, error = self.fsm.last_error(), "session state");
        let _ = self
            .to_speaker
            .send(FromSession::State {
                id: self.id,
                state: self.fsm.state(),
                since: SystemTime::now(),
                last_error: self.fsm.last_error().map(str::to_owned),
            })
            .await;
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one match arm per FSM action (connect, send, timers, established, down, deliver, refresh)"
    )]
    async fn perform(&mut self, a: Action) {
        match a {
            Action::Connect => {
                self.connecting = true;
                self.attempt = self.attempt.wrapping_add(1);
            }
            Action::Send(m) => self.send(&m),
            Action::Disconnect => {
                self.connecting = false;
                self.waiting = None;
                if let Some(mut s) = self.stream.take() {
                    // What was sent goes first (a NOTIFICATION above all), for a bounded time:
                    // a peer that does not read must not hold the task.
                    let rest = self.out.get(self.out_at..).unwrap_or_default();
                    let _ = tokio::time::timeout(FLUSH_ON_CLOSE, async {
                        s.write_all(rest).await?;
                        s.shutdown().await
                    })
                    .await;
                }
                self.drop_connection();
            }
            Action::StartTimer(t, d) => {
                self.timers.set(t, Instant::now() + d);
            }
            Action::StopTimer(t) => {
                self.timers.stop(t);
            }
            Action::Established(n) => {
                self.params = n.params;
                self.epoch = self.epoch.wrapping_add(1);
                let local_address = self
                    .stream
                    .as_ref()
                    .and_then(|s| s.local_addr().ok())
                    .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip().to_canonical());
                tracing::info!(peer = %self.remote, hold = n.hold_time, "session established");
                let _ = self
                    .to_speaker
                    .send(FromSession::Up {
                        id: self.id,
                        epoch: self.epoch,
                        remote_id: n.remote_id,
                        local_address,
                        families: Families::negotiated(&n.params),
                        peer_ext_next_hop: n.peer_ext_next_hop,
                        peer_restart_time: n.peer_restart_time,
                        peer_gr_families: n.peer_gr_families,
                    })
                    .await;
            }
            Action::Down { reason, graceful } => {
                tracing::info!(peer = %self.remote, %reason, ?graceful, "session down");
                self.params = SessionParams::default();
                let _ = self
                    .to_speaker
                    .send(FromSession::Down {
                        id: self.id,
                        epoch: self.epoch,
                        graceful,
                    })
                    .await;
            }
            Action::Deliver(UpdateDecode {
                end_of_rib: Some(family),
                ..
            }) => {
                let _ = self
                    .to_speaker
                    .send(FromSession::EndOfRib {
                        id: self.id,
                        epoch: self.epoch,
                        family,
                    })
                    .await;
            }
            Action::Deliver(update) => {
                let _ = self
                    .to_speaker
                    .send(FromSession::Update {
                        id: self.id,
                        epoch: self.epoch,
                        update: Box::new(update),
                    })
                    .await;
            }
            Action::RefreshMarker { family, begin } => {
                let _ = self
                    .to_speaker
                    .send(FromSession::RefreshMarker {
                        id: self.id,
                        epoch: self.epoch,
                        family,
                        begin,
                    })
                    .await;
            }
            Action::Refresh(family) => {
                let _ = self
                    .to_speaker
                    .send(FromSession::Refresh {
                        id: self.id,
                        epoch: self.epoch,
                        family,
                    })
                    .await;
            }
            // Only produced for collisions, handled in `collision`.
            Action::RejectColliding(_) | Action::AdoptColliding | Action::HoldColliding => {}
        }
    }

    fn send(&mut self, m: &Message) {
        let mut out = Vec::new();
        if let Err(e) = m.encode(&self.params, &mut out) {
            tracing::error!(peer = %self.remote, error = %e, "cannot encode a message");
            return;
        }
        self.write(&out);
    }

    /// Queue bytes for the peer; the task's loop writes them as the socket takes them.
    fn write(&mut self, bytes: &[u8]) {
        if self.stream.is_none() {
            return;
        }
        if self.queued() == 0 {
            self.out_progress = Instant::now();
        }
        self.out.extend_from_slice(bytes);
    }

    /// Answer a ROUTE-REFRESH: the routes, between BoRR and EoRR when enhanced route refresh
    /// was negotiated (RFC 7313 §4).
    fn refresh(&mut self, epoch: u64, update: FamilyUpdate) {
        if self.fsm.state() != State::Established || epoch != self.epoch {
            return;
        }
        let enhanced = self.fsm.negotiated().is_some_and(|n| n.enhanced_refresh);
        let family = match &update {
            FamilyUpdate::V4(_) => Family::IPV4_UNICAST,
            FamilyUpdate::V6(_) => Family::IPV6_UNICAST,
        };
        let marker = |subtype| Message::RouteRefresh(bgp_wire::RouteRefresh::new(family, subtype));
        if enhanced {
            self.send(&marker(bgp_wire::RefreshSubtype::Begin));
        }
        self.routes(epoch, update);
        if enhanced {
            self.send(&marker(bgp_wire::RefreshSubtype::End));
        }
    }

    /// The families negotiated on the current session.
    fn families(&self) -> Vec<Family> {
        Families::negotiated(&self.params).list()
    }

    fn routes(&mut self, epoch: u64, update: FamilyUpdate) {
        if self.fsm.state() != State::Established || epoch != self.epoch || self.stream.is_none() {
            return;
        }
        if self.queued() == 0 {
            self.out_progress = Instant::now();
        }
        // Packed straight into the write queue: a full table is megabytes, and a second
        // copy would raise the peak.
        let mut out = std::mem::take(&mut self.out);
        let result = match &update {
            FamilyUpdate::V4(u) => pack_v4(&self.params, u, &mut out),
            FamilyUpdate::V6(u) => pack_mp(&self.params, u, &mut out),
        };
        if let Err(e) = result {
            tracing::error!(peer = %self.remote, error = %e, "cannot encode routes");
        }
        self.out = out;
    }

    async fn stop(&mut self, subcode: u8, reason: &str) {
        self.feed(Event::Stop {
            subcode,
            reason: reason.to_owned(),
        })
        .await;
    }
}

/// IPv4 changes: the NLRI field with NEXT_HOP, or MP_REACH_NLRI for routes with an IPv6
/// next hop (RFC 8950). Every group is tried; the first error is returned.
fn pack_v4(
    params: &SessionParams,
    u: &OutUpdate<bgp_wire::Ipv4Prefix>,
    out: &mut Vec<u8>,
) -> Result<(), bgp_wire::EncodeError> {
    let mut result = Ok(());
    if !u.withdraw.is_empty() {
        result = result
            .and(bgp_wire::pack::withdraw_ipv4(params, u.withdraw.iter().copied(), out).map(drop));
    }
    for (attrs, prefixes) in &u.announce {
        let r = match (attrs.next_hop, attrs.mp_next_hop) {
            (None, Some(nh)) => {
                bgp_wire::pack::announce_mp(params, attrs, nh, prefixes.iter().copied(), out)
            }
            _ => bgp_wire::pack::announce_ipv4(params, attrs, prefixes.iter().copied(), out),
        };
        result = result.and(r.map(drop));
    }
    result
}

/// Changes of a family that travels only in MP_REACH_NLRI / MP_UNREACH_NLRI (IPv6).
fn pack_mp<P: bgp_wire::NlriPrefix>(
    params: &SessionParams,
    u: &OutUpdate<P>,
    out: &mut Vec<u8>,
) -> Result<(), bgp_wire::EncodeError> {
    let mut result = Ok(());
    if !u.withdraw.is_empty() {
        result = result
            .and(bgp_wire::pack::withdraw_mp(params, u.withdraw.iter().copied(), out).map(drop));
    }
    for (attrs, prefixes) in &u.announce {
        let r = match attrs.mp_next_hop {
            Some(nh) => {
                bgp_wire::pack::announce_mp(params, attrs, nh, prefixes.iter().copied(), out)
            }
            None => Err(bgp_wire::EncodeError::Invalid("route without a next hop")),
        };
        result = result.and(r.map(drop));
    }
    result
}

/// Open a connection to `addr` with the peer's MD5 key and TTLs set before the SYN.
async fn connect_to(addr: SocketAddr, t: &Transport) -> std::io::Result<TcpStream> {
    use std::os::fd::AsFd;
    let s = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Some(p) = &t.password {
        super::sockopt::set_md5(s.as_fd(), addr.ip(), Some(p.as_bytes()))?;
    }
    t.apply_ttls(s.as_fd(), addr.is_ipv6())?;
    s.connect(addr).await
}

/// The receive buffer the sessions of a thread share. A session holds it only while handling
/// what one read brought; one that needs it meanwhile (another waits on the speaker) gets a
/// buffer of its own for that read. Its pages become resident only as far as reads fill it.
mod scratch {
    use std::cell::Cell;

    thread_local! {
        static FREE: Cell<Option<Vec<u8>>> = const { Cell::new(None) };
    }

    pub fn take() -> Vec<u8> {
        FREE.with(Cell::take)
            .unwrap_or_else(|| Vec::with_capacity(super::RX_BUF))
    }

    pub fn give(mut buf: Vec<u8>) {
        buf.clear();
        FREE.with(|f| f.set(Some(buf)));
    }
}

/// Read one OPEN from a fresh connection (collision handling); anything else ends it.
async fn read_open(mut s: TcpStream) -> Option<Colliding> {
    let mut buf = vec![0u8; bgp_wire::MAX_MESSAGE_LEN];
    let mut filled = 0;
    let params = SessionParams::default();
    loop {
        let n = s.read(buf.get_mut(filled..)?).await.ok()?;
        if n == 0 {
            return None;
        }
        filled = filled.saturating_add(n);
        let data = buf.get(..filled)?;
        match split_message(data, &params) {
            Split::Message(len) => {
                let Ok(Decoded::Open(open)) = decode_message(data.get(..len)?, &params) else {
                    return None;
                };
                let rest = data.get(len..)?.to_vec();
                return Some(Colliding {
                    stream: s,
                    open,
                    rest,
                });
            }
            Split::Incomplete(_) => {}
            Split::Error(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests;
