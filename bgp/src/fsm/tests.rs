//! FSM tests: every state's reaction to every event that matters, without sockets.
//!
//! Why this file is long: every state against every event that matters, one short test each.

use super::*;
use bgp_wire::{HOLD_TIMER_EXPIRED, RefreshSubtype, RouteRefresh};

const ME: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn cfg() -> FsmConfig {
    FsmConfig::new(Asn(64512), ME, Asn(64512))
}

fn peer_open(hold: u16) -> Open {
    Open::new(
        Asn(64512),
        hold,
        PEER,
        vec![Capability::FourOctetAs(Asn(64512))],
    )
}

fn sent(actions: &[Action]) -> Vec<&Message> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn notification(actions: &[Action]) -> Option<(u8, u8)> {
    sent(actions).into_iter().find_map(|m| match m {
        Message::Notification(n) => Some((n.code, n.subcode)),
        _ => None,
    })
}

fn timer(actions: &[Action], t: Timer) -> Option<Duration> {
    actions.iter().find_map(|a| match a {
        Action::StartTimer(x, d) if *x == t => Some(*d),
        _ => None,
    })
}

/// Drive a fresh FSM to Established with the given peer hold time.
fn established(config: FsmConfig, hold: u16) -> (Fsm, Vec<Action>) {
    let mut f = Fsm::new(config);
    f.handle(Event::Start);
    f.handle(Event::Connected);
    f.handle(Event::Message(Decoded::Open(peer_open(hold))));
    let a = f.handle(Event::Message(Decoded::Keepalive));
    assert_eq!(f.state(), State::Established);
    (f, a)
}

#[test]
fn starts_idle_and_active_start_connects() {
    let mut f = Fsm::new(cfg());
    assert_eq!(f.state(), State::Idle);
    let a = f.handle(Event::Start);
    assert_eq!(f.state(), State::Connect);
    assert_eq!(a.first(), Some(&Action::Connect));
    let d = timer(&a, Timer::ConnectRetry).unwrap();
    assert!(
        d >= Duration::from_millis(3750) && d <= Duration::from_secs(5),
        "{d:?}"
    );
}

#[test]
fn passive_start_waits_and_never_connects() {
    let mut c = cfg();
    c.passive = true;
    let mut f = Fsm::new(c);
    let a = f.handle(Event::Start);
    assert_eq!(f.state(), State::Active);
    assert!(!a.contains(&Action::Connect));
    // Its ConnectRetry never makes it connect.
    let a = f.handle(Event::TimerExpired(Timer::ConnectRetry));
    assert!(!a.contains(&Action::Connect));
    let a = f.handle(Event::Accepted);
    assert_eq!(f.state(), State::OpenSent);
    assert!(matches!(sent(&a)[..], [Message::Open(_)]));
}

#[test]
fn full_handshake_negotiates_hold_and_keepalive() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    let a = f.handle(Event::Connected);
    assert_eq!(f.state(), State::OpenSent);
    let Some(Message::Open(o)) = sent(&a).first().copied() else {
        panic!("no OPEN: {a:?}")
    };
    assert_eq!((o.asn(), o.hold_time, o.bgp_id), (Asn(64512), 240, ME));
    assert_eq!(timer(&a, Timer::Hold), Some(OPEN_HOLD));
    let a = f.handle(Event::Message(Decoded::Open(peer_open(90))));
    assert_eq!(f.state(), State::OpenConfirm);
    assert_eq!(sent(&a), vec![&Message::Keepalive]);
    assert_eq!(timer(&a, Timer::Hold), Some(Duration::from_secs(90)));
    assert_eq!(timer(&a, Timer::Keepalive), Some(Duration::from_secs(30)));
    let a = f.handle(Event::Message(Decoded::Keepalive));
    assert_eq!(f.state(), State::Established);
    let n = a
        .iter()
        .find_map(|a| match a {
            Action::Established(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!((n.hold_time, n.keepalive, n.remote_id), (90, 30, PEER));
    assert!(n.params.four_octet_as && !n.params.external);
}

#[test]
fn configured_keepalive_is_capped_to_a_third_of_hold() {
    let mut c = cfg();
    c.keepalive = Some(100);
    let (f, _) = established(c.clone(), 30);
    assert_eq!(f.negotiated().unwrap().keepalive, 10);
    c.keepalive = Some(3);
    let (f, _) = established(c, 30);
    assert_eq!(f.negotiated().unwrap().keepalive, 3);
}

#[test]
fn hold_time_zero_means_no_timers() {
    let (mut f, _) = established(cfg(), 0);
    let n = f.negotiated().unwrap();
    assert_eq!((n.hold_time, n.keepalive), (0, 0));
    let a = f.handle(Event::Message(Decoded::Keepalive));
    assert_eq!(timer(&a, Timer::Hold), None);
    // We propose 0 ourselves: negotiated 0 whatever the peer says.
    let mut c = cfg();
    c.hold_time = 0;
    let (f, _) = established(c, 90);
    assert_eq!(f.negotiated().unwrap().hold_time, 0);
}

#[test]
fn keepalive_timer_sends_and_rearms() {
    let (mut f, _) = established(cfg(), 9);
    let a = f.handle(Event::TimerExpired(Timer::Keepalive));
    assert_eq!(sent(&a), vec![&Message::Keepalive]);
    assert_eq!(timer(&a, Timer::Keepalive), Some(Duration::from_secs(3)));
}

#[test]
fn hold_timer_expiry_notifies_and_goes_idle_then_restarts() {
    let (mut f, _) = established(cfg(), 9);
    let a = f.handle(Event::TimerExpired(Timer::Hold));
    assert_eq!(notification(&a), Some((HOLD_TIMER_EXPIRED, 0)));
    assert!(a.contains(&Action::Disconnect));
    assert!(a.iter().any(|a| matches!(a, Action::Down { .. })));
    assert_eq!(f.state(), State::Idle);
    assert_eq!(f.last_error(), Some("hold timer expired"));
    let d = timer(&a, Timer::IdleHold).unwrap();
    assert_eq!(d, Duration::from_secs(1));
    let a = f.handle(Event::TimerExpired(Timer::IdleHold));
    assert_eq!(f.state(), State::Connect);
    assert!(a.contains(&Action::Connect));
}

#[test]
fn repeated_errors_double_the_idle_hold_until_stable() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    let mut holds = Vec::new();
    for _ in 0..8 {
        f.handle(Event::Connected);
        let a = f.handle(Event::ConnectionClosed);
        holds.push(timer(&a, Timer::IdleHold).unwrap().as_secs());
        f.handle(Event::TimerExpired(Timer::IdleHold));
    }
    assert_eq!(holds, vec![1, 2, 4, 8, 16, 32, 60, 60]);
    // A session that stays up resets the back-off.
    f.handle(Event::Connected);
    f.handle(Event::Message(Decoded::Open(peer_open(90))));
    let a = f.handle(Event::Message(Decoded::Keepalive));
    assert_eq!(timer(&a, Timer::Stable), Some(STABLE_AFTER));
    f.handle(Event::TimerExpired(Timer::Stable));
    let a = f.handle(Event::ConnectionClosed);
    assert_eq!(timer(&a, Timer::IdleHold), Some(Duration::from_secs(1)));
}

#[test]
fn connect_retry_backs_off_with_jitter() {
    let mut f = Fsm::new(cfg());
    let a = f.handle(Event::Start);
    let mut ds = vec![timer(&a, Timer::ConnectRetry).unwrap()];
    for _ in 0..7 {
        let a = f.handle(Event::ConnectionFailed);
        assert_eq!(f.state(), State::Connect);
        ds.push(timer(&a, Timer::ConnectRetry).unwrap());
        let a = f.handle(Event::TimerExpired(Timer::ConnectRetry));
        assert!(a.contains(&Action::Connect));
    }
    for (i, d) in ds.iter().enumerate() {
        assert!(*d <= Duration::from_secs(120), "{i}: {d:?}");
    }
    // Growing, capped at 120 s (minus jitter), never below 75 % of the base.
    assert!(ds[0] >= Duration::from_millis(3750));
    assert!(ds.last().unwrap() >= &Duration::from_secs(90));
    assert!(ds.windows(2).take(3).all(|w| w[1] > w[0]), "{ds:?}");
    // Jitter: two peers with different seeds do not retry in lockstep.
    let mut c = cfg();
    c.jitter_seed = 12345;
    let mut g = Fsm::new(c);
    let b = g.handle(Event::Start);
    assert_ne!(timer(&b, Timer::ConnectRetry), Some(ds[0]));
    // A success resets the back-off.
    f.handle(Event::Connected);
    f.handle(Event::ConnectionClosed);
    let a = f.handle(Event::TimerExpired(Timer::IdleHold));
    assert!(timer(&a, Timer::ConnectRetry).unwrap() <= Duration::from_secs(5));
}

#[test]
fn wrong_peer_as_is_bad_peer_as() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    f.handle(Event::Connected);
    let a = f.handle(Event::Message(Decoded::Open(Open::new(
        Asn(65000),
        90,
        PEER,
        vec![],
    ))));
    assert_eq!(notification(&a), Some((2, 2)));
    assert_eq!(f.state(), State::Idle);
}

#[test]
fn bad_identifiers_are_refused() {
    for id in [Ipv4Addr::UNSPECIFIED, ME, Ipv4Addr::new(224, 0, 0, 1)] {
        let mut f = Fsm::new(cfg());
        f.handle(Event::Start);
        f.handle(Event::Connected);
        let a = f.handle(Event::Message(Decoded::Open(Open::new(
            Asn(64512),
            90,
            id,
            vec![],
        ))));
        assert_eq!(notification(&a), Some((2, 3)), "{id}");
    }
}

#[test]
fn unexpected_messages_are_fsm_errors() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    f.handle(Event::Connected);
    let a = f.handle(Event::Message(Decoded::Keepalive));
    assert_eq!(notification(&a), Some((bgp_wire::FSM_ERROR, 1)));
    let (mut f, _) = established(cfg(), 90);
    let a = f.handle(Event::Message(Decoded::Open(peer_open(90))));
    assert_eq!(notification(&a), Some((bgp_wire::FSM_ERROR, 3)));
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    f.handle(Event::Connected);
    f.handle(Event::Message(Decoded::Open(peer_open(90))));
    let a = f.handle(Event::Message(Decoded::RouteRefresh(RouteRefresh::new(
        Family::IPV4_UNICAST,
        RefreshSubtype::Normal,
    ))));
    assert_eq!(notification(&a), Some((bgp_wire::FSM_ERROR, 2)));
}

#[test]
fn received_notification_is_not_answered() {
    let (mut f, _) = established(cfg(), 90);
    let a = f.handle(Event::Message(Decoded::Notification(Notification::new(
        6,
        2,
        vec![],
    ))));
    assert_eq!(notification(&a), None);
    assert_eq!(f.state(), State::Idle);
    assert!(f.last_error().unwrap().contains("Administrative shutdown"));
}

#[test]
fn decode_error_sends_its_notification() {
    let (mut f, _) = established(cfg(), 90);
    let e = DecodeError::new(ErrorKind::MalformedAsPath, "test");
    let a = f.handle(Event::DecodeError(e));
    assert_eq!(notification(&a), Some((3, 11)));
    assert!(a.iter().any(|a| matches!(a, Action::Down { .. })));
}

#[test]
fn updates_and_refresh_are_delivered_in_established() {
    let (mut f, _) = established(cfg(), 90);
    let u = bgp_wire::decode_update(&[0, 0, 0, 0], &SessionParams::default());
    let a = f.handle(Event::Message(Decoded::Update(u)));
    assert!(a.iter().any(|a| matches!(a, Action::Deliver(_))));
    assert_eq!(timer(&a, Timer::Hold), Some(Duration::from_secs(90)));
    let a = f.handle(Event::Message(Decoded::RouteRefresh(RouteRefresh::new(
        Family::IPV4_UNICAST,
        RefreshSubtype::Normal,
    ))));
    assert!(a.contains(&Action::Refresh(Family::IPV4_UNICAST)));
}

#[test]
fn stop_sends_cease_and_stays_idle() {
    let (mut f, _) = established(cfg(), 90);
    let a = f.handle(Event::Stop {
        subcode: cease::ADMIN_SHUTDOWN,
        reason: "bye".into(),
    });
    assert_eq!(notification(&a), Some((6, 2)));
    assert_eq!(f.state(), State::Idle);
    assert_eq!(timer(&a, Timer::IdleHold), None);
    // A stale idle hold does not restart it.
    let a = f.handle(Event::TimerExpired(Timer::IdleHold));
    assert!(a.is_empty());
    assert_eq!(f.state(), State::Idle);
    // Idle refuses connections.
    let a = f.handle(Event::Accepted);
    assert_eq!(a, vec![Action::Disconnect]);
}

#[test]
fn a_connection_event_while_connected_leaves_the_session_alone() {
    let (mut f, _) = established(cfg(), 90);
    assert!(f.handle(Event::Accepted).is_empty());
    assert!(f.handle(Event::Connected).is_empty());
    assert_eq!(f.state(), State::Established);
}

#[test]
fn stale_timers_are_ignored() {
    let mut f = Fsm::new(cfg());
    for t in [
        Timer::Hold,
        Timer::Keepalive,
        Timer::ConnectRetry,
        Timer::Stable,
    ] {
        assert!(f.handle(Event::TimerExpired(t)).is_empty());
    }
    f.handle(Event::Start);
    f.handle(Event::Connected);
    assert!(f.handle(Event::TimerExpired(Timer::Keepalive)).is_empty());
    assert_eq!(f.state(), State::OpenSent);
}

#[test]
fn collision_higher_local_id_keeps_our_connection() {
    let mut c = cfg();
    c.router_id = Ipv4Addr::new(10, 0, 0, 9);
    let mut f = Fsm::new(c);
    f.handle(Event::Start);
    f.handle(Event::Connected);
    let a = f.handle(Event::CollidingOpen {
        open: peer_open(90),
        current_inbound: false,
    });
    assert!(
        matches!(a[..], [Action::RejectColliding(ref n)] if n.subcode == cease::CONNECTION_COLLISION)
    );
    assert_eq!(f.state(), State::OpenSent);
}

#[test]
fn collision_lower_local_id_switches_to_the_peers_connection() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    f.handle(Event::Connected);
    let a = f.handle(Event::CollidingOpen {
        open: peer_open(90),
        current_inbound: false,
    });
    assert_eq!(notification(&a), Some((6, cease::CONNECTION_COLLISION)));
    let adopt = a.iter().position(|x| *x == Action::AdoptColliding).unwrap();
    let disc = a.iter().position(|x| *x == Action::Disconnect).unwrap();
    assert!(disc < adopt);
    // OPEN then KEEPALIVE on the new connection.
    let after: Vec<_> = sent(&a[adopt..]).into_iter().cloned().collect();
    assert!(matches!(after[..], [Message::Open(_), Message::Keepalive]));
    assert_eq!(f.state(), State::OpenConfirm);
}

/// The identifiers say to close our connection, but we have confirmed it with a KEEPALIVE:
/// the peer may be Established on it and then keeps it whatever the identifiers say. So
/// the new connection waits; it loses to ours Established, is taken when ours is closed,
/// and the identifiers decide when the wait runs out.
#[test]
fn a_collision_after_our_keepalive_waits_for_our_connection_to_settle() {
    let collide = |f: &mut Fsm, current_inbound| {
        f.handle(Event::CollidingOpen {
            open: peer_open(90),
            current_inbound,
        })
    };
    let confirmed = || {
        let mut f = Fsm::new(cfg()); // ME < PEER: the peer's connection should survive
        f.handle(Event::Start);
        f.handle(Event::Connected);
        let a = f.handle(Event::Message(Decoded::Open(peer_open(90))));
        assert!(sent(&a).contains(&&Message::Keepalive));
        assert_eq!(f.state(), State::OpenConfirm);
        let a = collide(&mut f, false);
        assert_eq!(
            a,
            vec![
                Action::HoldColliding,
                Action::StartTimer(Timer::CollisionWait, COLLISION_WAIT)
            ]
        );
        assert_eq!(f.state(), State::OpenConfirm);
        f
    };

    // The peer's KEEPALIVE on ours: Established, the held one loses.
    let mut f = confirmed();
    f.handle(Event::Message(Decoded::Keepalive));
    assert_eq!(f.state(), State::Established);
    let a = collide(&mut f, false);
    assert!(
        matches!(a[..], [Action::RejectColliding(ref n)] if n.subcode == cease::CONNECTION_COLLISION),
        "{a:?}"
    );

    // The peer closed ours: the held one is the session.
    let mut f = confirmed();
    let cease = Notification::new(bgp_wire::CEASE, cease::CONNECTION_COLLISION, Vec::new());
    f.handle(Event::Message(Decoded::Notification(cease)));
    assert_eq!(f.state(), State::Connect);
    let a = collide(&mut f, false);
    assert!(a.contains(&Action::AdoptColliding), "{a:?}");
    assert_eq!(f.state(), State::OpenConfirm);

    // The wait ran out: the identifiers decide, ours is closed.
    let mut f = confirmed();
    let a = collide(&mut f, false);
    assert_eq!(notification(&a), Some((6, cease::CONNECTION_COLLISION)));
    let disc = a.iter().position(|x| *x == Action::Disconnect).unwrap();
    let adopt = a.iter().position(|x| *x == Action::AdoptColliding).unwrap();
    assert!(disc < adopt, "{a:?}");

    // Before our KEEPALIVE (OpenSent), or when the current connection is the peer's too,
    // nothing waits.
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    f.handle(Event::Connected);
    assert!(collide(&mut f, false).contains(&Action::AdoptColliding));
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    f.handle(Event::Accepted);
    f.handle(Event::Message(Decoded::Open(peer_open(90))));
    assert!(collide(&mut f, true).contains(&Action::AdoptColliding));
}

/// The peer resolved the collision first and said so on our connection (the loser): only
/// that connection ends; its other one, read aside meanwhile, becomes the session.
#[test]
fn the_peers_collision_cease_ends_only_our_connection() {
    let mut c = cfg();
    c.router_id = Ipv4Addr::new(10, 0, 0, 9);
    for before_its_open in [true, false] {
        let mut f = Fsm::new(c.clone());
        f.handle(Event::Start);
        f.handle(Event::Connected);
        if !before_its_open {
            f.handle(Event::Message(Decoded::Open(peer_open(90))));
            assert_eq!(f.state(), State::OpenConfirm);
        }
        let cease = Notification::new(bgp_wire::CEASE, cease::CONNECTION_COLLISION, Vec::new());
        let a = f.handle(Event::Message(Decoded::Notification(cease)));
        assert!(a.contains(&Action::Disconnect), "{a:?}");
        assert_eq!(notification(&a), None, "a NOTIFICATION is never answered");
        assert_eq!(timer(&a, Timer::IdleHold), None, "no error back-off: {a:?}");
        assert!(timer(&a, Timer::ConnectRetry).is_some(), "{a:?}");
        assert_eq!(f.state(), State::Connect);
        assert!(f.negotiated().is_none());
        // Its other connection's OPEN, read aside: taken, whatever the identifiers say.
        let a = f.handle(Event::CollidingOpen {
            open: peer_open(90),
            current_inbound: false,
        });
        let adopt = a.iter().position(|x| *x == Action::AdoptColliding).unwrap();
        let after: Vec<_> = sent(&a[adopt..]).into_iter().cloned().collect();
        assert!(
            matches!(after[..], [Message::Open(_), Message::Keepalive]),
            "{a:?}"
        );
        assert_eq!(notification(&a), None);
        assert_eq!(f.state(), State::OpenConfirm);
        f.handle(Event::Message(Decoded::Keepalive));
        assert_eq!(f.state(), State::Established);
    }
    // In Established a Cease is the end of the session, collision or not.
    let (mut f, _) = established(cfg(), 90);
    let cease = Notification::new(bgp_wire::CEASE, cease::CONNECTION_COLLISION, Vec::new());
    let a = f.handle(Event::Message(Decoded::Notification(cease)));
    assert!(timer(&a, Timer::IdleHold).is_some());
    assert_eq!(f.state(), State::Idle);
}

#[test]
fn collision_in_established_rejects_the_newcomer() {
    let (mut f, _) = established(cfg(), 90);
    let a = f.handle(Event::CollidingOpen {
        open: peer_open(90),
        current_inbound: false,
    });
    assert!(matches!(a[..], [Action::RejectColliding(_)]));
    assert_eq!(f.state(), State::Established);
}

#[test]
fn ebgp_is_external_and_negotiates_so() {
    let c = FsmConfig::new(Asn(64512), ME, Asn(65000));
    let mut f = Fsm::new(c);
    f.handle(Event::Start);
    f.handle(Event::Connected);
    f.handle(Event::Message(Decoded::Open(Open::new(
        Asn(65000),
        90,
        ME, // same id is allowed for eBGP
        vec![Capability::FourOctetAs(Asn(65000))],
    ))));
    f.handle(Event::Message(Decoded::Keepalive));
    assert_eq!(f.state(), State::Established);
    assert!(f.negotiated().unwrap().params.external);
}

#[test]
fn backoff_is_capped_and_never_overflows() {
    let s = Duration::from_secs(1);
    assert_eq!(backoff(s, Duration::from_secs(60), 1), s);
    assert_eq!(
        backoff(s, Duration::from_secs(60), u32::MAX),
        Duration::from_secs(60)
    );
}

fn gr_open(restart_time: u16, families: Vec<bgp_wire::GrFamily>) -> Open {
    Open::new(
        Asn(64512),
        9,
        PEER,
        vec![
            Capability::FourOctetAs(Asn(64512)),
            Capability::GracefulRestart(bgp_wire::GracefulRestart {
                restarting: false,
                notification: false,
                restart_time,
                families,
            }),
        ],
    )
}

const V4: bgp_wire::GrFamily = bgp_wire::GrFamily {
    family: Family::IPV4_UNICAST,
    forwarding_preserved: true,
};

fn down(actions: &[Action]) -> Option<Option<u16>> {
    actions.iter().find_map(|a| match a {
        Action::Down { graceful, .. } => Some(*graceful),
        _ => None,
    })
}

fn gr_established(ours: Option<u16>, theirs: Open) -> Fsm {
    let mut c = cfg();
    c.graceful_restart = ours;
    let mut f = Fsm::new(c);
    f.handle(Event::Start);
    f.handle(Event::Connected);
    f.handle(Event::Message(Decoded::Open(theirs)));
    f.handle(Event::Message(Decoded::Keepalive));
    assert_eq!(f.state(), State::Established);
    f
}

#[test]
fn graceful_restart_is_offered_with_forwarding_preserved() {
    let mut c = cfg();
    assert!(c.open().graceful_restart().is_none());
    c.graceful_restart = Some(120);
    let gr = c.open().graceful_restart().cloned().unwrap();
    assert_eq!(gr.restart_time, 120);
    assert_eq!(gr.families, vec![V4]);
    assert!(!gr.restarting);
}

#[test]
fn a_lost_transport_is_graceful_only_when_both_sides_offered_it() {
    let mut f = gr_established(Some(120), gr_open(90, vec![V4]));
    assert_eq!(f.negotiated().unwrap().peer_restart_time, Some(90));
    let a = f.handle(Event::ConnectionClosed);
    assert_eq!(down(&a), Some(Some(90)));
    // Helper-only peers (no family) and restart time 0 do not count.
    let mut f = gr_established(Some(120), gr_open(120, vec![]));
    assert_eq!(down(&f.handle(Event::ConnectionClosed)), Some(None));
    let mut f = gr_established(Some(120), gr_open(0, vec![V4]));
    assert_eq!(down(&f.handle(Event::ConnectionClosed)), Some(None));
    // Nor when we did not offer it.
    let mut f = gr_established(None, gr_open(90, vec![V4]));
    assert_eq!(down(&f.handle(Event::ConnectionClosed)), Some(None));
}

#[test]
fn a_notification_ends_graceful_restart() {
    let mut f = gr_established(Some(120), gr_open(90, vec![V4]));
    let a = f.handle(Event::TimerExpired(Timer::Hold));
    assert_eq!(
        down(&a),
        Some(None),
        "hold timer expiry sends a NOTIFICATION"
    );
    let mut f = gr_established(Some(120), gr_open(90, vec![V4]));
    let n = Notification::new(bgp_wire::CEASE, cease::ADMIN_RESET, vec![]);
    let a = f.handle(Event::Message(Decoded::Notification(n)));
    assert_eq!(down(&a), Some(None));
}

#[test]
fn shutdown_for_a_restart_sends_no_notification() {
    let mut f = gr_established(Some(120), gr_open(90, vec![V4]));
    let a = f.handle(Event::Shutdown);
    assert_eq!(notification(&a), None);
    assert!(a.contains(&Action::Disconnect));
    assert_eq!(f.state(), State::Idle);
    // And it stays down: no restart timer.
    assert_eq!(timer(&a, Timer::IdleHold), None);
    let mut f = gr_established(Some(120), gr_open(90, vec![V4]));
    let a = f.handle(Event::Stop {
        subcode: cease::ADMIN_SHUTDOWN,
        reason: "bye".into(),
    });
    assert_eq!(
        notification(&a),
        Some((bgp_wire::CEASE, cease::ADMIN_SHUTDOWN))
    );
}

#[test]
fn enhanced_route_refresh_is_offered_and_its_markers_reach_the_rib() {
    assert!(
        cfg()
            .open()
            .capabilities
            .contains(&Capability::EnhancedRouteRefresh)
    );
    let mut theirs = peer_open(9);
    theirs.capabilities.push(Capability::EnhancedRouteRefresh);
    let mut f = Fsm::new(cfg());
    f.handle(Event::Start);
    f.handle(Event::Connected);
    f.handle(Event::Message(Decoded::Open(theirs)));
    f.handle(Event::Message(Decoded::Keepalive));
    assert!(f.negotiated().unwrap().enhanced_refresh);
    let rr = |subtype| {
        Event::Message(Decoded::RouteRefresh(RouteRefresh::new(
            Family::IPV4_UNICAST,
            subtype,
        )))
    };
    assert!(
        f.handle(rr(RefreshSubtype::Begin))
            .contains(&Action::RefreshMarker {
                family: Family::IPV4_UNICAST,
                begin: true
            })
    );
    assert!(
        f.handle(rr(RefreshSubtype::End))
            .contains(&Action::RefreshMarker {
                family: Family::IPV4_UNICAST,
                begin: false
            })
    );
    // Unknown subtypes and other families are ignored (RFC 7313 §5).
    let a = f.handle(rr(RefreshSubtype::Other(9)));
    assert!(
        !a.iter()
            .any(|a| matches!(a, Action::Refresh(_) | Action::RefreshMarker { .. }))
    );
    assert_eq!(f.state(), State::Established);
    // Without the peer's capability, no framing: the subtype octet is RFC 2918's Reserved
    // field, so a BoRR, an EoRR or an unknown subtype is a plain refresh request (as BIRD
    // reads it), and never sweeps the peer's routes.
    let (mut f, _) = established(cfg(), 9);
    assert!(!f.negotiated().unwrap().enhanced_refresh);
    for subtype in [
        RefreshSubtype::Begin,
        RefreshSubtype::End,
        RefreshSubtype::Other(9),
    ] {
        let a = f.handle(rr(subtype));
        assert!(a.contains(&Action::Refresh(Family::IPV4_UNICAST)), "{a:?}");
        assert!(
            !a.iter().any(|a| matches!(a, Action::RefreshMarker { .. })),
            "{a:?}"
        );
    }
}

#[test]
fn graceful_restart_families_are_those_of_the_peer_we_carry_with_their_forwarding_bit() {
    let mut c = cfg();
    c.graceful_restart = Some(120);
    c.families = vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST];
    let v6_not_preserved = bgp_wire::GrFamily {
        family: Family::IPV6_UNICAST,
        forwarding_preserved: false,
    };
    let other = bgp_wire::GrFamily {
        family: Family::new(bgp_wire::Afi::IPV4, bgp_wire::Safi(128)),
        forwarding_preserved: true,
    };
    let mut f = Fsm::new(c.clone());
    f.handle(Event::Start);
    f.handle(Event::Connected);
    f.handle(Event::Message(Decoded::Open(gr_open(
        90,
        vec![V4, v6_not_preserved, other],
    ))));
    f.handle(Event::Message(Decoded::Keepalive));
    let n = f.negotiated().unwrap();
    assert_eq!(
        n.peer_gr_families,
        vec![(Family::IPV4_UNICAST, true), (Family::IPV6_UNICAST, false)]
    );
    assert_eq!(n.peer_restart_time, Some(90));
    // Without graceful restart on our side, nothing is kept.
    c.graceful_restart = None;
    let f = gr_established(None, gr_open(90, vec![V4]));
    assert!(f.negotiated().unwrap().peer_gr_families.is_empty());
}

#[test]
fn route_refresh_is_answered_only_for_negotiated_families() {
    let mut c = cfg();
    c.families = vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST];
    // The peer offers no multiprotocol capability: IPv4 unicast only (RFC 4760 §8).
    let (mut f, _) = established(c, 9);
    let rr = |family| {
        Event::Message(Decoded::RouteRefresh(RouteRefresh::new(
            family,
            RefreshSubtype::Normal,
        )))
    };
    assert!(
        f.handle(rr(Family::IPV4_UNICAST))
            .contains(&Action::Refresh(Family::IPV4_UNICAST))
    );
    assert!(
        !f.handle(rr(Family::IPV6_UNICAST))
            .iter()
            .any(|a| matches!(a, Action::Refresh(_)))
    );
}

#[test]
fn the_open_offers_our_families_and_extended_next_hop() {
    let mut c = cfg();
    c.families = vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST];
    c.ext_next_hop = true;
    let open = c.open();
    let fams: Vec<Family> = open.families().collect();
    assert_eq!(fams, vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST]);
    assert!(
        open.ext_next_hops()
            .any(|t| t.nlri_afi == bgp_wire::Afi::IPV4 && t.next_hop_afi == bgp_wire::Afi::IPV6)
    );
    c.ext_next_hop = false;
    assert_eq!(c.open().ext_next_hops().count(), 0);
}

#[test]
fn the_first_retries_stay_at_the_base_interval_then_back_off() {
    let mut c = cfg();
    c.connect_retry = Duration::from_millis(500);
    c.connect_retry_max = Duration::from_secs(5);
    c.connect_retry_fast = 8;
    let mut f = Fsm::new(c);
    let a = f.handle(Event::Start);
    let mut ds = vec![timer(&a, Timer::ConnectRetry).unwrap()];
    for _ in 0..8 {
        let a = f.handle(Event::ConnectionFailed);
        ds.push(timer(&a, Timer::ConnectRetry).unwrap());
        f.handle(Event::TimerExpired(Timer::ConnectRetry));
    }
    // 75-100 % of 0.5 s while fast (the start and each failure and retry count), then
    // growing to the cap.
    for d in &ds[..5] {
        assert!(
            *d >= Duration::from_millis(375) && *d <= Duration::from_millis(500),
            "{ds:?}"
        );
    }
    assert!(ds[5] >= Duration::from_millis(750), "{ds:?}");
    assert!(ds[8] >= Duration::from_millis(3750), "{ds:?}");
    assert!(ds.iter().all(|d| *d <= Duration::from_secs(5)));
}

#[test]
fn a_refused_attempt_waits_the_refused_retry_where_one_is_set() {
    // Without one, a refusal is a failure like any other.
    let mut f = Fsm::new(cfg());
    let start = timer(&f.handle(Event::Start), Timer::ConnectRetry).unwrap();
    let refused = timer(&f.handle(Event::ConnectionRefused), Timer::ConnectRetry).unwrap();
    let mut g = Fsm::new(cfg());
    g.handle(Event::Start);
    let failed = timer(&g.handle(Event::ConnectionFailed), Timer::ConnectRetry).unwrap();
    assert_eq!(refused, failed);
    assert!(start <= refused, "{start:?} {refused:?}");

    let mut c = cfg();
    c.connect_retry_max = Duration::from_secs(5);
    c.refused_retry = Some(Duration::from_secs(30));
    let mut f = Fsm::new(c);
    f.handle(Event::Start);
    for _ in 0..5 {
        let a = f.handle(Event::ConnectionRefused);
        let d = timer(&a, Timer::ConnectRetry).unwrap();
        assert!(
            (Duration::from_millis(22_500)..=Duration::from_secs(30)).contains(&d),
            "{d:?}"
        );
        assert_eq!(f.state(), State::Connect);
        assert!(
            f.handle(Event::TimerExpired(Timer::ConnectRetry))
                .contains(&Action::Connect)
        );
    }
    // A timeout or an unreachable peer is retried at the usual interval.
    let d = timer(&f.handle(Event::ConnectionFailed), Timer::ConnectRetry).unwrap();
    assert!(d <= Duration::from_secs(5), "{d:?}");
}
