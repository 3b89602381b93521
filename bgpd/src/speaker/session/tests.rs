//! The session task against a hand-driven peer on loopback.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use bgp_wire::{
    Asn, Capability, Family, Ipv4Prefix, Message, Open, Origin, PathAttributes, SessionParams,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant, timeout};

use super::{FromSession, Session, ToSession};
use bgp::fsm::{Fsm, FsmConfig};
use bgp::rib::{FamilyUpdate, OutUpdate, PeerId};

fn keepalive() -> Vec<u8> {
    let mut ka = Vec::new();
    bgp_wire::encode_keepalive(&mut ka);
    ka
}

/// The peer's OPEN (BGP identifier 10.0.0.2, hold time `hold`) and a KEEPALIVE, as bytes.
fn peer_open_and_keepalive(hold: u16) -> Vec<u8> {
    let mut out = Vec::new();
    Message::Open(Open::new(
        Asn(64512),
        hold,
        Ipv4Addr::new(10, 0, 0, 2),
        vec![
            Capability::Multiprotocol(Family::IPV4_UNICAST),
            Capability::FourOctetAs(Asn(64512)),
        ],
    ))
    .encode(&SessionParams::default(), &mut out)
    .unwrap();
    out.extend_from_slice(&keepalive());
    out
}

/// Every session's command channel holds a block of 32 slots for the session's life (2.3 KiB
/// per session when a command was 72 bytes): the payloads stay boxed.
#[test]
fn a_command_to_a_session_is_three_words() {
    assert!(
        std::mem::size_of::<ToSession>() <= 24,
        "ToSession grew to {} bytes: box the new variant's payload",
        std::mem::size_of::<ToSession>()
    );
}

/// A peer that completes the OPEN exchange, then keeps sending KEEPALIVEs but never reads
/// again: our UPDATEs fill its tiny receive window and our socket buffer. The session must
/// still run its timers, and end the connection once nothing has been taken for the hold
/// time (before: it sat in `write_all` for ever, Established, its hold timer frozen).
#[tokio::test]
async fn a_peer_that_stops_reading_is_dropped_after_the_hold_time() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // Inherited by the accepted connection: the peer's window stays small.
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let remote: SocketAddr = listener.local_addr().unwrap();

    let mut config = FsmConfig::new(Asn(64512), Ipv4Addr::new(10, 0, 0, 1), Asn(64512));
    config.hold_time = 3;
    let (to_speaker, mut from_session) = mpsc::channel(64);
    let (commands, commands_rx) = super::super::mailbox::mailbox();
    let session = Session::new(PeerId(1), remote, Fsm::new(config), to_speaker);
    tokio::spawn(session.run(commands_rx));

    let (mut peer, _) = timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("the session connects")
        .unwrap();
    peer.write_all(&peer_open_and_keepalive(3)).await.unwrap();
    // Its OPEN and KEEPALIVE: small, read once.
    let mut buf = [0u8; 4096];
    let _ = timeout(Duration::from_secs(5), peer.read(&mut buf)).await;

    let epoch = loop {
        match timeout(Duration::from_secs(10), from_session.recv()).await {
            Ok(Some(FromSession::Up { epoch, .. })) => break epoch,
            Ok(Some(_)) => {}
            other => panic!("no Established: {other:?}"),
        }
    };
    // Far more than the socket buffers hold (about 10 MB of UPDATEs).
    let prefixes: Vec<Ipv4Prefix> = (0..2_000_000u32)
        .map(|i| Ipv4Prefix::new(Ipv4Addr::from(0x0b00_0000 + i), 32).unwrap())
        .collect();
    let attrs = Arc::new(PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(Default::default()),
        next_hop: Some(Ipv4Addr::new(10, 0, 0, 1)),
        local_pref: Some(100),
        ..PathAttributes::default()
    });
    commands
        .send(ToSession::Routes {
            epoch,
            update: Box::new(FamilyUpdate::V4(OutUpdate {
                announce: vec![(attrs, prefixes)],
                withdraw: Vec::new(),
            })),
        })
        .unwrap();

    // Keep the hold timer fed from our side, read nothing.
    let (_rd, mut wr) = peer.into_split();
    let feeding = tokio::spawn(async move {
        loop {
            if wr.write_all(&keepalive()).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });

    let start = Instant::now();
    let down = timeout(Duration::from_secs(20), async {
        loop {
            match from_session.recv().await {
                Some(FromSession::Down { .. }) => return,
                Some(_) => {}
                None => panic!("session task ended"),
            }
        }
    })
    .await;
    feeding.abort();
    assert!(
        down.is_ok(),
        "still Established 20 s after the peer stopped reading"
    );
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "dropped after {took:?}, expected about the hold time (3 s)"
    );
    drop(commands);
}

/// A session of the speaker with `router_id`, connecting to `remote`; connections for it
/// go in through the returned sender (as the speaker's listener hands them over).
fn spawn_speaking(
    router_id: Ipv4Addr,
    remote: SocketAddr,
) -> (
    mpsc::Receiver<FromSession>,
    super::super::mailbox::Sender<ToSession>,
) {
    let mut config = FsmConfig::new(Asn(64512), router_id, Asn(64512));
    // Long enough that a test never sees a retry: every connection is one of the first.
    config.connect_retry = Duration::from_secs(30);
    let (to_speaker, from_session) = mpsc::channel(64);
    let (commands, commands_rx) = super::super::mailbox::mailbox();
    let session = Session::new(PeerId(1), remote, Fsm::new(config), to_speaker);
    tokio::spawn(session.run(commands_rx));
    (from_session, commands)
}

/// Waits for the session's Established, then watches it stay up for `stay`.
async fn up_and_stays(rx: &mut mpsc::Receiver<FromSession>, stay: Duration) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(FromSession::Up { .. })) => break,
            Ok(Some(_)) => {}
            other => return Err(format!("no Established: {other:?}")),
        }
    }
    let until = Instant::now() + stay;
    loop {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Err(_) => return Ok(()),
            Ok(Some(FromSession::Down { .. })) => return Err("down again".into()),
            Ok(Some(FromSession::State {
                state, last_error, ..
            })) if state != super::State::Established => {
                return Err(format!("left Established: {state:?} {last_error:?}"));
            }
            Ok(Some(_)) => {}
            Ok(None) => return Err("session task ended".into()),
        }
    }
}

/// Two speakers that connect to each other at the same moment (the nodes of a mesh both
/// connect): each accepts the other's connection while its own attempt is pending in its
/// view, though the kernel has completed it. Each must end up on the same one connection.
/// Before, each took the accepted connection and dropped its own attempt, which the other
/// had just taken: both sessions failed, and restarted in step to fail again.
#[tokio::test]
async fn two_speakers_that_connect_to_each_other_at_once_agree_on_one_connection() {
    for round in 0..10 {
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let (mut a_rx, a_in) = spawn_speaking(Ipv4Addr::new(10, 0, 0, 1), b_addr);
        let (mut b_rx, b_in) = spawn_speaking(Ipv4Addr::new(10, 0, 0, 2), a_addr);
        // Both attempts reach the other's listener (on loopback the kernel completes them
        // at once); each is handed the other's before it has seen its own complete.
        let (to_a, _) = a.accept().await.unwrap();
        let (to_b, _) = b.accept().await.unwrap();
        a_in.send(ToSession::Incoming(Box::new(to_a))).unwrap();
        b_in.send(ToSession::Incoming(Box::new(to_b))).unwrap();
        let stay = Duration::from_millis(300);
        let (ra, rb) = tokio::join!(up_and_stays(&mut a_rx, stay), up_and_stays(&mut b_rx, stay));
        assert!(
            ra.is_ok() && rb.is_ok(),
            "round {round}: a {ra:?}, b {rb:?}"
        );
    }
}

/// A connection from the peer that arrives while the session waits to restart after an
/// error is taken when it restarts, and is the restart: no attempt of ours goes out then.
/// Dropped, it failed the peer's session too (two nodes that both connect then each
/// restarted into the other's idle hold, and never came up); with an attempt of ours beside
/// it, the two collided, and BIRD 1.6, already Established on ours, stopped the session.
#[tokio::test]
async fn a_connection_during_the_idle_hold_is_taken_at_the_restart() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (mut from_session, commands) =
        spawn_speaking(Ipv4Addr::new(10, 0, 0, 1), listener.local_addr().unwrap());

    // Its first connection is closed at once: an error, so Idle for the idle hold (1 s).
    let (first, _) = timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("the session connects")
        .unwrap();
    drop(first);
    timeout(Duration::from_secs(5), async {
        loop {
            match from_session.recv().await {
                Some(FromSession::State {
                    state: super::State::Idle,
                    ..
                }) => return,
                Some(_) => {}
                None => panic!("session task ended"),
            }
        }
    })
    .await
    .expect("Idle after the closed connection");

    // Now the peer connects (as the speaker's listener would hand it over) and speaks.
    let side = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut peer = tokio::net::TcpStream::connect(side.local_addr().unwrap())
        .await
        .unwrap();
    let (ours, _) = side.accept().await.unwrap();
    commands.send(ToSession::Incoming(Box::new(ours))).unwrap();
    peer.write_all(&peer_open_and_keepalive(90)).await.unwrap();
    let up = timeout(Duration::from_secs(5), async {
        loop {
            match from_session.recv().await {
                Some(FromSession::Up { remote_id, .. }) => return remote_id,
                Some(_) => {}
                None => panic!("session task ended"),
            }
        }
    })
    .await
    .expect("Established on the connection that came during the idle hold");
    assert_eq!(up, Ipv4Addr::new(10, 0, 0, 2));
    // An attempt at the restart would be in the listener's queue by now.
    assert!(
        timeout(Duration::from_millis(300), listener.accept())
            .await
            .is_err(),
        "the session connected out as well"
    );
    drop(commands);
}

#[test]
fn timers_fire_in_a_fixed_order_and_a_stopped_one_not_at_all() {
    use super::Timers;
    use bgp::fsm::Timer;
    let now = Instant::now();
    let mut t = Timers::default();
    assert_eq!(t.next(), None);
    t.set(Timer::Stable, now - Duration::from_secs(1));
    t.set(Timer::Hold, now);
    t.set(Timer::Keepalive, now + Duration::from_secs(5));
    assert_eq!(t.next(), Some(now - Duration::from_secs(1)));
    assert!(t.is_running(Timer::Keepalive) && !t.is_running(Timer::IdleHold));
    let due: Vec<Timer> = t.due(now).collect();
    assert_eq!(due, vec![Timer::Hold, Timer::Stable]);
    // Handling the first stopped the second: it does not fire.
    assert!(t.take_due(Timer::Hold, now));
    t.stop(Timer::Stable);
    assert!(!t.take_due(Timer::Stable, now));
    // Not yet due: stays.
    assert!(!t.take_due(Timer::Keepalive, now));
    assert_eq!(t.next(), Some(now + Duration::from_secs(5)));
    // Every kind has its own slot, and the list of kinds names each at its slot.
    for (i, k) in Timers::ALL.iter().enumerate() {
        assert_eq!(Timers::slot(*k), i, "{k:?}");
    }
}
