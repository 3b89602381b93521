//! The session task against a hand-driven peer on loopback.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use bgp_wire::{
    Asn, Capability, Family, Ipv4Prefix, Message, Open, Origin, PathAttributes, SessionParams,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant, timeout};

use super::super::fsm::{Fsm, FsmConfig};
use super::super::rib::{FamilyUpdate, OutUpdate, PeerId};
use super::{FromSession, Session, ToSession};

fn keepalive() -> Vec<u8> {
    let mut ka = Vec::new();
    bgp_wire::encode_keepalive(&mut ka);
    ka
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
    let (commands, commands_rx) = mpsc::unbounded_channel();
    let session = Session::new(PeerId(1), remote, Fsm::new(config), to_speaker);
    tokio::spawn(session.run(commands_rx));

    let (mut peer, _) = timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("the session connects")
        .unwrap();
    let mut open = Vec::new();
    Message::Open(Open::new(
        Asn(64512),
        3,
        Ipv4Addr::new(10, 0, 0, 2),
        vec![
            Capability::Multiprotocol(Family::IPV4_UNICAST),
            Capability::FourOctetAs(Asn(64512)),
        ],
    ))
    .encode(&SessionParams::default(), &mut open)
    .unwrap();
    peer.write_all(&open).await.unwrap();
    peer.write_all(&keepalive()).await.unwrap();
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
