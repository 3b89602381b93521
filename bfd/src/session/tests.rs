//! The state machine against RFC 5880's invariants: two sessions over a simulated link come
//! Up and stay Up; Up only after a three-way handshake; Down after Detect Mult × interval of
//! silence, not before; poll / final; jitter bounds.

use super::*;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn cfg(tx: u64, rx: u64, mult: u8) -> SessionConfig {
    SessionConfig::from_ms(rx, tx, u64::from(mult)).expect("valid test config")
}

fn drain(s: &mut Session) -> Vec<Output> {
    std::iter::from_fn(|| s.poll_output()).collect()
}

fn sent(outs: &[Output]) -> Vec<ControlPacket> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Send(p) => Some(*p),
            _ => None,
        })
        .collect()
}

/// Two sessions over a link with a fixed one-way delay; optionally cut from `cut` on.
/// Returns each side's state changes with their times, and a's periodic send times.
struct Sim {
    a: Session,
    b: Session,
    t0: Instant,
    now: Instant,
    delay: Duration,
    cut: Option<Instant>,
    /// (arrival, to_a, packet)
    wire: Vec<(Instant, bool, ControlPacket)>,
    changes: Vec<(Duration, bool, State)>,
    a_sends: Vec<(Duration, ControlPacket)>,
}

impl Sim {
    fn new(ca: SessionConfig, cb: SessionConfig, delay: Duration, seed: u64) -> Sim {
        let t0 = Instant::now();
        Sim {
            a: Session::new(1, ca, seed, t0),
            b: Session::new(2, cb, seed.wrapping_mul(31).wrapping_add(7), t0),
            t0,
            now: t0,
            delay,
            cut: None,
            wire: Vec::new(),
            changes: Vec::new(),
            a_sends: Vec::new(),
        }
    }

    fn collect(&mut self) {
        for (is_a, outs) in [(true, drain(&mut self.a)), (false, drain(&mut self.b))] {
            for o in outs {
                match o {
                    Output::Send(p) => {
                        if is_a {
                            self.a_sends.push((self.now - self.t0, p));
                        }
                        if self.cut.is_none_or(|c| self.now < c) {
                            self.wire.push((self.now + self.delay, !is_a, p));
                        }
                    }
                    Output::StateChange { to, .. } => {
                        self.changes.push((self.now - self.t0, is_a, to))
                    }
                }
            }
        }
    }

    fn run_until(&mut self, end: Duration) {
        let end = self.t0 + end;
        loop {
            self.collect();
            let next_wire = self.wire.iter().map(|w| w.0).min();
            let next = [self.a.next_deadline(), self.b.next_deadline(), next_wire]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = next.filter(|n| *n <= end) else {
                self.now = end;
                return;
            };
            self.now = next.max(self.now);
            let now = self.now;
            let (due, rest): (Vec<_>, Vec<_>) = self.wire.drain(..).partition(|w| w.0 <= now);
            self.wire = rest;
            for (_, to_a, p) in due {
                let s = if to_a { &mut self.a } else { &mut self.b };
                let _ = s.on_packet(&p, now);
            }
            self.a.on_timeout(now);
            self.b.on_timeout(now);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Both come Up within a few packet times, stay Up over a lossless link, settle on the
    /// negotiated interval (the slower side's wish wins) with jitter in 75-100 %, and go Down
    /// by detection-time expiry within Detect Mult × interval of a cut.
    #[test]
    fn two_sessions_come_up_stay_up_and_detect_a_cut(
        a_tx in 10u64..300, a_rx in 10u64..300, b_tx in 10u64..300, b_rx in 10u64..300,
        a_mult in 2u8..6, b_mult in 2u8..6, delay_ms in 0u64..5, seed: u64,
    ) {
        let mut sim = Sim::new(cfg(a_tx, a_rx, a_mult), cfg(b_tx, b_rx, b_mult), ms(delay_ms), seed);
        sim.run_until(ms(100));
        prop_assert_eq!(sim.a.state(), State::Up);
        prop_assert_eq!(sim.b.state(), State::Up);
        sim.run_until(ms(5000));
        // Never left Up on a good link.
        let downs: Vec<_> = sim.changes.iter().filter(|c| c.2 != State::Init && c.2 != State::Up).collect();
        prop_assert!(downs.is_empty(), "unexpected state changes {:?}", downs);
        prop_assert!(!sim.a.polling() && !sim.b.polling(), "poll sequence never ended");
        let interval = ms(a_tx.max(b_rx));
        prop_assert_eq!(sim.a.tx_interval(), Some(interval));
        // Periodic gaps in the last 2 s: 75-100 % of the interval.
        let periodic: Vec<Duration> = sim.a_sends.iter()
            .filter(|(t, p)| *t >= ms(3000) && !p.final_).map(|(t, _)| *t).collect();
        for w in periodic.windows(2) {
            let gap = w[1] - w[0];
            prop_assert!(gap >= interval * 75 / 100 && gap <= interval, "gap {:?} for {:?}", gap, interval);
        }
        // Cut the link; a declares Down within its detection time after the last packet.
        let cut_at = sim.now;
        sim.cut = Some(cut_at);
        let detect = sim.a.detection_time().expect("peer heard");
        prop_assert_eq!(detect, ms(b_tx.max(a_rx)) * u32::from(b_mult));
        sim.run_until(ms(5000) + detect + ms(delay_ms) + ms(1));
        let a_down = sim.changes.iter().find(|c| c.1 && c.2 == State::Down).map(|c| c.0);
        prop_assert!(a_down.is_some(), "a never went down after the cut");
        let a_down = a_down.unwrap_or_default();
        prop_assert!(a_down <= ms(5000) + detect + ms(delay_ms));
        prop_assert_eq!(sim.a.diag(), Diag::ControlDetectionTimeExpired);
    }

    /// Whatever the peer sends, Up is only entered on a packet saying Init (from Down) or
    /// Init/Up (from Init): the peer has heard us, the three-way handshake. AdminDown is
    /// never left by a packet.
    #[test]
    fn never_up_without_a_three_way_handshake(
        steps in proptest::collection::vec((0u8..4, any::<bool>(), 0u64..400, any::<bool>()), 1..60),
        admin_at in proptest::option::of(0usize..60),
    ) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut s = Session::new(5, cfg(50, 50, 3), 1, t0);
        for (i, (st, right_discr, advance, timeout)) in steps.into_iter().enumerate() {
            if admin_at == Some(i) {
                s.admin_down(now);
            }
            now += ms(advance);
            if timeout {
                s.on_timeout(now);
                let _ = drain(&mut s);
            }
            let state = State::from_bits(st);
            let p = ControlPacket {
                diag: Diag::None, state, poll: false, final_: false,
                control_plane_independent: false, demand: false, detect_mult: 3,
                my_discriminator: 77,
                your_discriminator: if right_discr { 5 } else { 0 },
                desired_min_tx_us: 50_000, required_min_rx_us: 50_000, required_min_echo_rx_us: 0,
            };
            let before = s.state();
            let r = s.on_packet(&p, now);
            if before == State::AdminDown {
                prop_assert_eq!(r, Err(Discard::AdminDown));
            }
            for o in drain(&mut s) {
                if let Output::StateChange { from, to: State::Up, .. } = o {
                    match from {
                        State::Down => prop_assert_eq!(state, State::Init),
                        State::Init => prop_assert!(matches!(state, State::Init | State::Up)),
                        other => prop_assert!(false, "Up from {:?}", other),
                    }
                }
            }
        }
    }

    /// Silence after Up: Down exactly at the last reception + Detect Mult × max(our
    /// RequiredMinRx, the peer's DesiredMinTx), not a moment earlier.
    #[test]
    fn silence_takes_it_down_after_the_detection_time(
        rx in 10u64..1000, peer_tx in 10u64..1000, peer_mult in 1u8..10,
    ) {
        let t0 = Instant::now();
        let mut s = Session::new(5, cfg(100, rx, 3), 9, t0);
        let peer = |state, now_final| ControlPacket {
            diag: Diag::None, state, poll: false, final_: now_final,
            control_plane_independent: false, demand: false, detect_mult: peer_mult,
            my_discriminator: 8, your_discriminator: 5,
            desired_min_tx_us: (peer_tx * 1000) as u32, required_min_rx_us: 100_000,
            required_min_echo_rx_us: 0,
        };
        let last = t0 + ms(1);
        prop_assert!(s.on_packet(&peer(State::Init, false), t0).is_ok());
        prop_assert_eq!(s.state(), State::Up);
        prop_assert!(s.on_packet(&peer(State::Up, true), last).is_ok());
        let detect = ms(rx.max(peer_tx)) * u32::from(peer_mult);
        prop_assert_eq!(s.detection_time(), Some(detect));
        // Drive timers up to just before the deadline: still Up.
        let mut now = last;
        while let Some(d) = s.next_deadline().filter(|d| *d < last + detect) {
            now = d;
            s.on_timeout(now);
            prop_assert_eq!(s.state(), State::Up);
        }
        prop_assert!(now < last + detect);
        s.on_timeout(last + detect);
        prop_assert_eq!(s.state(), State::Down);
        prop_assert_eq!(s.diag(), Diag::ControlDetectionTimeExpired);
        prop_assert_eq!(s.remote_discriminator(), 0);
    }
}

#[test]
fn a_poll_is_answered_with_a_final_at_once() {
    let t0 = Instant::now();
    let mut s = Session::new(5, cfg(100, 100, 3), 9, t0);
    let _ = drain(&mut s);
    let mut p = ControlPacket {
        diag: Diag::None,
        state: State::Down,
        poll: true,
        final_: false,
        control_plane_independent: false,
        demand: false,
        detect_mult: 3,
        my_discriminator: 8,
        your_discriminator: 0,
        desired_min_tx_us: 1_000_000,
        required_min_rx_us: 100_000,
        required_min_echo_rx_us: 0,
    };
    s.on_packet(&p, t0).expect("accepted");
    let out = sent(&drain(&mut s));
    assert!(out.iter().any(|q| q.final_ && !q.poll), "{out:?}");
    // The Down → Init change went out too, naming the peer.
    assert!(
        out.iter()
            .any(|q| q.state == State::Init && q.your_discriminator == 8)
    );
    p.poll = false;
    p.state = State::Up;
    p.your_discriminator = 5;
    s.on_packet(&p, t0).expect("accepted");
    assert_eq!(s.state(), State::Up);
}

#[test]
fn parameter_change_while_up_waits_for_the_final() {
    let t0 = Instant::now();
    let mut s = Session::new(5, cfg(100, 100, 3), 9, t0);
    let peer = |state, final_| ControlPacket {
        diag: Diag::None,
        state,
        poll: false,
        final_,
        control_plane_independent: false,
        demand: false,
        detect_mult: 3,
        my_discriminator: 8,
        your_discriminator: 5,
        desired_min_tx_us: 10_000,
        required_min_rx_us: 10_000,
        required_min_echo_rx_us: 0,
    };
    s.on_packet(&peer(State::Init, false), t0).expect("ok");
    s.on_packet(&peer(State::Up, true), t0).expect("ok");
    assert_eq!(s.tx_interval(), Some(ms(100)));
    let _ = drain(&mut s);
    // Slower transmit, shorter detection: neither may apply before the Final.
    s.set_config(cfg(500, 20, 3), t0);
    let out = sent(&drain(&mut s));
    assert!(out.iter().all(|p| p.poll && p.desired_min_tx_us == 500_000));
    assert_eq!(s.tx_interval(), Some(ms(100)));
    assert_eq!(s.detection_time(), Some(ms(100) * 3));
    s.on_packet(&peer(State::Up, true), t0).expect("ok");
    assert!(!s.polling());
    assert_eq!(s.tx_interval(), Some(ms(500)));
    assert_eq!(s.detection_time(), Some(ms(20) * 3));
}

#[test]
fn not_up_means_the_slow_rate() {
    let t0 = Instant::now();
    let mut s = Session::new(5, cfg(50, 50, 3), 9, t0);
    s.on_timeout(t0);
    let p = sent(&drain(&mut s));
    assert_eq!(p[0].desired_min_tx_us, 1_000_000);
    assert_eq!(p[0].state, State::Down);
}

#[test]
fn the_peer_going_down_takes_us_down_with_its_diag() {
    let t0 = Instant::now();
    let mut s = Session::new(5, cfg(50, 50, 3), 9, t0);
    let mut p = ControlPacket::decode(&[
        0x20, 0x80, 3, 24, 0, 0, 0, 8, 0, 0, 0, 5, 0, 0, 0x27, 0x10, 0, 0, 0x27, 0x10, 0, 0, 0, 0,
    ])
    .expect("init packet");
    s.on_packet(&p, t0).expect("ok");
    assert_eq!(s.state(), State::Up);
    p.state = State::AdminDown;
    s.on_packet(&p, t0).expect("ok");
    assert_eq!(
        (s.state(), s.diag()),
        (State::Down, Diag::NeighborSignaledDown)
    );
}

#[test]
fn wrong_discriminator_and_admin_down_are_discarded() {
    let t0 = Instant::now();
    let mut s = Session::new(5, cfg(50, 50, 3), 9, t0);
    let p = ControlPacket {
        diag: Diag::None,
        state: State::Up,
        poll: false,
        final_: false,
        control_plane_independent: false,
        demand: false,
        detect_mult: 3,
        my_discriminator: 8,
        your_discriminator: 6,
        desired_min_tx_us: 10_000,
        required_min_rx_us: 10_000,
        required_min_echo_rx_us: 0,
    };
    assert_eq!(
        s.on_packet(&p, t0),
        Err(Discard::WrongDiscriminator { got: 6, want: 5 })
    );
    s.admin_down(t0);
    let p = ControlPacket {
        your_discriminator: 5,
        ..p
    };
    assert_eq!(s.on_packet(&p, t0), Err(Discard::AdminDown));
    s.admin_up(t0);
    assert_eq!(s.state(), State::Down);
}

#[test]
fn config_bounds_name_the_field() {
    let e = SessionConfig::from_ms(9, 100, 3).unwrap_err();
    assert_eq!(e.field(), "min_rx_ms");
    assert!(e.to_string().contains("min_rx_ms = 9 ms"), "{e}");
    assert_eq!(
        SessionConfig::from_ms(100, 5, 3).unwrap_err().field(),
        "min_tx_ms"
    );
    assert_eq!(
        SessionConfig::from_ms(100, 100, 0).unwrap_err().field(),
        "multiplier"
    );
    assert_eq!(
        SessionConfig::from_ms(100, 100, 256).unwrap_err().field(),
        "multiplier"
    );
    assert!(SessionConfig::from_ms(10, 10, 255).is_ok());
}
