//! Graceful restart (RFC 4724) against real peers, both roles:
//! - bgpd restarting: BIRD 2 and FRR, as helpers, keep our route while bgpd is away (SIGTERM
//!   closes the session without a NOTIFICATION), take the refreshed one when it is back, and
//!   drop it when bgpd does not come back within the restart time we announced;
//! - FRR restarting (killed): bgpd keeps FRR's route marked stale, and refreshed after FRR is
//!   back and sends its End-of-RIB.
//!
//! Needs root, BIRD 2 and FRR.

use std::time::{Duration, Instant};

use interop_tests::lab::bgp_peer::{
    BGPD_ADDR, BgpPeer, Bgpd, LOCAL_AS, Link, PEER_ADDR, wait_until,
};
use interop_tests::lab::bird::{Bird, BirdVersion};
use interop_tests::lab::frr::Frr;
use interop_tests::lab::netns::Netns;

const PEER_AS: u32 = 65000;
const OURS: &str = "10.10.1.0/24";
const RESTART_TIME: u64 = 6;
const UP: Duration = Duration::from_secs(40);

fn bgpd(ns: &Netns) -> Bgpd {
    Bgpd::start_with(
        ns,
        &format!(
            "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{BGPD_ADDR}\"\n\
             [[bgp.peers]]\naddress = \"{PEER_ADDR}\"\nas = {PEER_AS}\nhold_time = 9\n\
             restart_time = {RESTART_TIME}\n\
             [[bgp.announce]]\nprefix = \"{OURS}\"\n"
        ),
    )
}

fn stop(mut b: Bgpd) {
    b.process
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(10))
        .expect("bgpd did not stop on SIGTERM");
}

/// bgpd restarts within the restart time, then stops for good.
fn helper_keeps_our_routes(what: &str, link: &Link, peer: &dyn BgpPeer) {
    let b = bgpd(&link.a);
    assert!(
        wait_until(UP, || peer.established() && peer.route(OURS).is_some()),
        "{what}: session or route did not come up\n{}",
        b.log()
    );
    stop(b);
    let down_at = Instant::now();
    // The session is gone, the route stays.
    assert!(
        wait_until(Duration::from_secs(5), || !peer.established()),
        "{what}: the session did not go down"
    );
    let mut kept = true;
    while down_at.elapsed() < Duration::from_secs(3) {
        kept &= peer.route(OURS).is_some();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        kept,
        "{what}: the helper dropped our route while we restarted"
    );
    eprintln!("{what}: route kept while bgpd was away");

    // Back within the restart time: session up, route still there (and never withdrawn).
    let b = bgpd(&link.a);
    assert!(
        wait_until(UP, || peer.established()),
        "{what}: the session did not come back\n{}",
        b.log()
    );
    assert!(
        peer.route(OURS).is_some(),
        "{what}: route lost after the restart"
    );
    // Well past the restart time: still there (refreshed, End-of-RIB honoured).
    std::thread::sleep(Duration::from_secs(RESTART_TIME + 2));
    assert!(
        peer.route(OURS).is_some(),
        "{what}: the route was swept after we came back"
    );
    eprintln!("{what}: route refreshed after the restart");

    // Gone for good: dropped once the restart time has passed.
    stop(b);
    let gone_at = Instant::now();
    assert!(
        wait_until(Duration::from_secs(RESTART_TIME + 15), || peer
            .route(OURS)
            .is_none()),
        "{what}: the route outlived the restart time"
    );
    let after = gone_at.elapsed();
    assert!(
        after >= Duration::from_secs(RESTART_TIME - 2),
        "{what}: dropped after {after:?}, before the restart time: not graceful"
    );
    eprintln!("{what}: route dropped {after:?} after bgpd left for good");
}

#[test]
fn bird2_keeps_our_routes_across_a_bgpd_restart() {
    let link = Link::new("grb");
    let bird = Bird::start_with(
        BirdVersion::V2,
        &link.b,
        PEER_AS,
        "  graceful restart on;\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    helper_keeps_our_routes("BIRD 2", &link, &bird);
}

fn frr_conf(restarting: bool) -> String {
    format!(
        "frr defaults traditional\nhostname peer\nrouter bgp {PEER_AS}\n bgp router-id {PEER_ADDR}\n\
         no bgp ebgp-requires-policy\n no bgp network import-check\n{}\
         neighbor {BGPD_ADDR} remote-as {LOCAL_AS}\n neighbor {BGPD_ADDR} timers connect 2\n\
         address-family ipv4 unicast\n  network 10.30.1.0/24\n exit-address-family\n",
        if restarting {
            " bgp graceful-restart\n bgp graceful-restart preserve-fw-state\n"
        } else {
            ""
        }
    )
}

#[test]
fn frr_keeps_our_routes_across_a_bgpd_restart() {
    let link = Link::new("grf");
    let frr = Frr::start_with_config(&link.b, PEER_AS, &frr_conf(false))
        .unwrap_or_else(|e| panic!("{e}"));
    helper_keeps_our_routes("FRR", &link, &frr);
}

#[test]
fn bgpd_keeps_a_restarting_frrs_routes_stale_then_refreshes_them() {
    let link = Link::new("grh");
    let mut frr =
        Frr::start_with_config(&link.b, PEER_AS, &frr_conf(true)).unwrap_or_else(|e| panic!("{e}"));
    let b = bgpd(&link.a);
    let theirs = "10.30.1.0/24";
    assert!(
        wait_until(UP, || b.route(theirs).is_some()),
        "FRR's route did not arrive\n{}",
        b.log()
    );
    assert_eq!(b.route(theirs).unwrap()["stale"], false);
    frr.kill();
    assert!(
        wait_until(Duration::from_secs(20), || b
            .route(theirs)
            .is_some_and(|r| r["stale"] == true)),
        "bgpd did not keep FRR's route stale: {:?}\n{}",
        b.route(theirs),
        b.log()
    );
    eprintln!("FRR killed: its route is kept, stale");
    frr.relaunch();
    assert!(
        wait_until(UP, || b.route(theirs).is_some_and(|r| r["stale"] == false)),
        "FRR's route was not refreshed after it came back: {:?}\n{}",
        b.route(theirs),
        b.log()
    );
    eprintln!("FRR back: its route is fresh again");
}
