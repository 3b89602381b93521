//! One BFD session's state machine (RFC 5880 §6.2, §6.8), sans-IO.
//!
//! Inputs: a decoded packet ([`Session::on_packet`]), the clock reaching
//! [`Session::next_deadline`] ([`Session::on_timeout`]), admin up / down and a parameter
//! change; every input takes `now`. Outputs, drained with [`Session::poll_output`]: packets to
//! send and state changes. We always take the Active role (we send from the start).
//!
//! Timers (§6.8.2-§6.8.4, §6.8.7): while not Up we advertise a DesiredMinTx of at least 1 s
//! (§6.8.3); our transmit interval is max(DesiredMinTx, the peer's RequiredMinRx), jittered to
//! 75-100 % (75-90 % with detect mult 1); the detection time is the peer's Detect Mult ×
//! max(our RequiredMinRx, the peer's DesiredMinTx). A change of our parameters while Up runs a
//! Poll sequence (§6.5): a slower transmit rate or a shorter detection time takes effect only
//! once the peer's Final arrives, the safe direction at once.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::packet::{ControlPacket, Diag, State};

/// The slow rate while not Up (§6.8.3).
const SLOW_TX: Duration = Duration::from_secs(1);

/// The configured parameters of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// bfd.DesiredMinTxInterval once Up.
    pub desired_min_tx: Duration,
    /// bfd.RequiredMinRxInterval.
    pub required_min_rx: Duration,
    /// bfd.DetectMult.
    pub detect_mult: u8,
}

/// A parameter out of range; `field` is the configuration key (`min_rx_ms`, `min_tx_ms`,
/// `multiplier`), which callers prefix with where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SessionConfigError {
    #[error("{field} = {value} ms is below the minimum of {min} ms", min = SessionConfig::MIN_INTERVAL_MS)]
    IntervalTooSmall { field: &'static str, value: u64 },
    #[error("{field} = {value} ms is above the maximum of {max} ms", max = SessionConfig::MAX_INTERVAL_MS)]
    IntervalTooLarge { field: &'static str, value: u64 },
    #[error("multiplier = {0} is outside 1-255")]
    Multiplier(u64),
}

impl SessionConfigError {
    /// The configuration key at fault.
    pub fn field(&self) -> &'static str {
        match self {
            SessionConfigError::IntervalTooSmall { field, .. }
            | SessionConfigError::IntervalTooLarge { field, .. } => field,
            SessionConfigError::Multiplier(_) => "multiplier",
        }
    }
}

impl SessionConfig {
    /// Shorter intervals cost more CPU than a node can spare and are refused.
    pub const MIN_INTERVAL_MS: u64 = 10;
    /// A minute; the wire field would allow about 71 minutes.
    pub const MAX_INTERVAL_MS: u64 = 60_000;

    /// Checked parameters from milliseconds, as the configuration and the API give them.
    pub fn from_ms(
        min_rx_ms: u64,
        min_tx_ms: u64,
        multiplier: u64,
    ) -> Result<SessionConfig, SessionConfigError> {
        for (field, value) in [("min_rx_ms", min_rx_ms), ("min_tx_ms", min_tx_ms)] {
            if value < Self::MIN_INTERVAL_MS {
                return Err(SessionConfigError::IntervalTooSmall { field, value });
            }
            if value > Self::MAX_INTERVAL_MS {
                return Err(SessionConfigError::IntervalTooLarge { field, value });
            }
        }
        let detect_mult = u8::try_from(multiplier)
            .ok()
            .filter(|m| *m > 0)
            .ok_or(SessionConfigError::Multiplier(multiplier))?;
        Ok(SessionConfig {
            desired_min_tx: Duration::from_millis(min_tx_ms),
            required_min_rx: Duration::from_millis(min_rx_ms),
            detect_mult,
        })
    }
}

/// What the session asks of its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send this packet to the peer now.
    Send(ControlPacket),
    /// bfd.SessionState changed.
    StateChange { from: State, to: State, diag: Diag },
}

/// Why a well-formed packet was not taken by this session (§6.8.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Discard {
    #[error("session is administratively down")]
    AdminDown,
    #[error("your discriminator {got} is not this session's {want}")]
    WrongDiscriminator { got: u32, want: u32 },
}

/// One BFD session.
#[derive(Debug, Clone)]
pub struct Session {
    config: SessionConfig,
    state: State,
    remote_state: State,
    local_discr: u32,
    remote_discr: u32,
    local_diag: Diag,
    /// What our packets carry as DesiredMinTx / RequiredMinRx.
    adv_tx: Duration,
    adv_rx: Duration,
    /// What our own timers use (differs from `adv_*` during a Poll sequence).
    tx_in_use: Duration,
    rx_in_use: Duration,
    remote_min_rx: Duration,
    remote_desired_tx: Duration,
    remote_mult: u8,
    poll_active: bool,
    next_tx: Option<Instant>,
    detect_deadline: Option<Instant>,
    rng: u64,
    out: VecDeque<Output>,
}

fn micros(us: u32) -> Duration {
    Duration::from_micros(u64::from(us))
}

fn to_micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn later(now: Instant, d: Duration) -> Instant {
    // An Instant this far ahead cannot overflow in practice; fall back to `now` rather than
    // panic.
    now.checked_add(d).unwrap_or(now)
}

impl Session {
    /// A session in Down with discriminator `local_discr` (non-zero, unique per daemon);
    /// `seed` feeds the transmit jitter. It sends its first packet at once.
    pub fn new(local_discr: u32, config: SessionConfig, seed: u64, now: Instant) -> Session {
        let adv_tx = config.desired_min_tx.max(SLOW_TX);
        Session {
            config,
            state: State::Down,
            remote_state: State::Down,
            local_discr: local_discr.max(1),
            remote_discr: 0,
            local_diag: Diag::None,
            adv_tx,
            adv_rx: config.required_min_rx,
            tx_in_use: adv_tx,
            rx_in_use: config.required_min_rx,
            remote_min_rx: Duration::from_micros(1),
            remote_desired_tx: Duration::ZERO,
            remote_mult: 0,
            poll_active: false,
            next_tx: Some(now),
            detect_deadline: None,
            rng: seed | 1,
            out: VecDeque::new(),
        }
    }

    pub fn state(&self) -> State {
        self.state
    }
    pub fn remote_state(&self) -> State {
        self.remote_state
    }
    pub fn local_discriminator(&self) -> u32 {
        self.local_discr
    }
    pub fn remote_discriminator(&self) -> u32 {
        self.remote_discr
    }
    pub fn diag(&self) -> Diag {
        self.local_diag
    }
    pub fn config(&self) -> SessionConfig {
        self.config
    }
    /// A Poll sequence is running (parameters not yet acknowledged by the peer).
    pub fn polling(&self) -> bool {
        self.poll_active
    }

    /// The interval our periodic packets use before jitter; `None` while the peer asks for
    /// none (RequiredMinRx 0).
    pub fn tx_interval(&self) -> Option<Duration> {
        (!self.remote_min_rx.is_zero()).then(|| self.tx_in_use.max(self.remote_min_rx))
    }

    /// The detection time; `None` before the first packet from the peer.
    pub fn detection_time(&self) -> Option<Duration> {
        (self.remote_mult > 0).then(|| {
            self.rx_in_use
                .max(self.remote_desired_tx)
                .saturating_mul(u32::from(self.remote_mult))
        })
    }

    /// When [`Session::on_timeout`] must next be called.
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.next_tx, self.detect_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next thing to do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// A packet addressed to this session (the driver demultiplexed it by Your
    /// Discriminator, or by address while that is 0).
    pub fn on_packet(&mut self, p: &ControlPacket, now: Instant) -> Result<(), Discard> {
        if p.your_discriminator != 0 && p.your_discriminator != self.local_discr {
            return Err(Discard::WrongDiscriminator {
                got: p.your_discriminator,
                want: self.local_discr,
            });
        }
        if self.state == State::AdminDown {
            return Err(Discard::AdminDown);
        }
        self.remote_discr = p.my_discriminator;
        self.remote_state = p.state;
        self.remote_min_rx = micros(p.required_min_rx_us);
        self.remote_desired_tx = micros(p.desired_min_tx_us);
        self.remote_mult = p.detect_mult;
        if p.final_ && self.poll_active {
            self.poll_active = false;
            self.tx_in_use = self.adv_tx;
            self.rx_in_use = self.adv_rx;
        }
        if let Some(d) = self.detection_time() {
            self.detect_deadline = Some(later(now, d));
        }
        match (self.state, p.state) {
            (from, State::AdminDown) if from != State::Down => {
                self.set_state(State::Down, Diag::NeighborSignaledDown, now)
            }
            (State::Down, State::Down) => self.set_state(State::Init, Diag::None, now),
            (State::Down, State::Init) | (State::Init, State::Init | State::Up) => {
                self.set_state(State::Up, Diag::None, now)
            }
            (State::Up, State::Down) => {
                self.set_state(State::Down, Diag::NeighborSignaledDown, now)
            }
            _ => {}
        }
        if p.poll {
            // The Final goes out at once, whatever the periodic timer says (§6.8.7).
            let fin = self.packet(true);
            self.out.push_back(Output::Send(fin));
        }
        // A faster rate agreed, or the peer allowing packets again: do not wait out an old,
        // longer timer.
        match (self.tx_interval(), self.next_tx) {
            (Some(i), Some(at)) if at > later(now, i) => self.schedule_tx(now),
            (Some(_), None) => self.schedule_tx(now),
            (None, _) => self.next_tx = None,
            _ => {}
        }
        Ok(())
    }

    /// The clock reached [`Session::next_deadline`] (calling it early does nothing harmful).
    pub fn on_timeout(&mut self, now: Instant) {
        if self.detect_deadline.is_some_and(|d| d <= now) {
            self.detect_deadline = None;
            self.remote_discr = 0;
            self.remote_state = State::Down;
            if matches!(self.state, State::Init | State::Up) {
                self.set_state(State::Down, Diag::ControlDetectionTimeExpired, now);
            }
        }
        if self.next_tx.is_some_and(|t| t <= now) {
            self.transmit(now);
        }
    }

    /// Takes the session administratively down (it tells the peer so: state AdminDown).
    pub fn admin_down(&mut self, now: Instant) {
        if self.state != State::AdminDown {
            self.detect_deadline = None;
            self.set_state(State::AdminDown, Diag::AdministrativelyDown, now);
        }
    }

    /// Lets an administratively down session come up again.
    pub fn admin_up(&mut self, now: Instant) {
        if self.state == State::AdminDown {
            self.set_state(State::Down, Diag::None, now);
        }
    }

    /// New parameters; while Up they are negotiated with a Poll sequence.
    pub fn set_config(&mut self, config: SessionConfig, now: Instant) {
        if config == self.config {
            return;
        }
        self.config = config;
        self.readvertise(now);
    }

    fn readvertise(&mut self, now: Instant) {
        let tx = if self.state == State::Up {
            self.config.desired_min_tx
        } else {
            self.config.desired_min_tx.max(SLOW_TX)
        };
        let rx = self.config.required_min_rx;
        if tx == self.adv_tx && rx == self.adv_rx {
            return;
        }
        self.adv_tx = tx;
        self.adv_rx = rx;
        if self.state == State::Up {
            // Only the safe direction at once: sending faster, detecting more leniently.
            self.poll_active = true;
            self.tx_in_use = self.tx_in_use.min(tx);
            self.rx_in_use = self.rx_in_use.max(rx);
            self.transmit(now);
        } else {
            self.poll_active = false;
            self.tx_in_use = tx;
            self.rx_in_use = rx;
        }
    }

    fn set_state(&mut self, to: State, diag: Diag, now: Instant) {
        let from = self.state;
        self.state = to;
        self.local_diag = diag;
        self.out.push_back(Output::StateChange { from, to, diag });
        self.readvertise(now);
        // Tell the peer at once rather than at the next (possibly 1 s) tick; the handshake
        // and a Down then take one packet time, not one interval.
        self.transmit(now);
    }

    fn packet(&self, final_: bool) -> ControlPacket {
        ControlPacket {
            diag: self.local_diag,
            state: self.state,
            // P and F are never both set (§6.8.7).
            poll: self.poll_active && !final_,
            final_,
            control_plane_independent: false,
            demand: false,
            detect_mult: self.config.detect_mult,
            my_discriminator: self.local_discr,
            your_discriminator: self.remote_discr,
            desired_min_tx_us: to_micros(self.adv_tx),
            required_min_rx_us: to_micros(self.adv_rx),
            required_min_echo_rx_us: 0,
        }
    }

    fn transmit(&mut self, now: Instant) {
        if self.remote_min_rx.is_zero() {
            self.next_tx = None;
            return;
        }
        let p = self.packet(false);
        self.out.push_back(Output::Send(p));
        self.schedule_tx(now);
    }

    fn schedule_tx(&mut self, now: Instant) {
        let Some(interval) = self.tx_interval() else {
            self.next_tx = None;
            return;
        };
        // §6.8.7: 75-100 % of the interval, at most 90 % when detect mult is 1.
        let top: u64 = if self.config.detect_mult == 1 {
            90
        } else {
            100
        };
        let span = top.saturating_sub(75).saturating_add(1);
        let pct = 75u64.saturating_add(self.next_random().checked_rem(span).unwrap_or(0));
        let jittered = interval
            .checked_mul(u32::try_from(pct).unwrap_or(100))
            .and_then(|d| d.checked_div(100))
            .unwrap_or(interval);
        self.next_tx = Some(later(now, jittered));
    }

    /// xorshift64: jitter needs to differ between sessions, not to be unpredictable.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x.wrapping_shl(13);
        x ^= x.wrapping_shr(7);
        x ^= x.wrapping_shl(17);
        self.rng = x;
        x
    }
}

#[cfg(test)]
mod tests;
