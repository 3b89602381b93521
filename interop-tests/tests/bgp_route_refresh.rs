//! Route refresh (RFC 2918) and enhanced route refresh (RFC 7313) with FRR: both sides
//! negotiate the enhanced capability; FRR's `clear bgp ... soft in` makes it ask us, and we
//! answer with our routes between BoRR and EoRR; `bgpctl peer refresh` asks FRR, whose
//! routes come back framed the same way and stay (nothing stale is left behind). No session
//! is reset. Needs root and FRR.

use std::time::Duration;

use interop_tests::lab::bgp_peer::{
    BGPD_ADDR, BgpPeer, Bgpd, LOCAL_AS, Link, PEER_ADDR, wait_until,
};
use interop_tests::lab::bgpd::bgpctl;
use interop_tests::lab::frr::Frr;

const PEER_AS: u32 = 65000;
const OURS: &str = "10.10.1.0/24";
const THEIRS: &str = "10.30.1.0/24";

fn stat(frr: &Frr, key: &str) -> u64 {
    frr.json(&format!("show bgp neighbors {BGPD_ADDR} json"))[BGPD_ADDR]["messageStats"][key]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn enhanced_route_refresh_both_ways_with_frr() {
    let link = Link::new("rref");
    let conf = format!(
        "frr defaults traditional\nhostname peer\nrouter bgp {PEER_AS}\n bgp router-id {PEER_ADDR}\n\
         no bgp ebgp-requires-policy\n no bgp network import-check\n\
         neighbor {BGPD_ADDR} remote-as {LOCAL_AS}\n neighbor {BGPD_ADDR} timers connect 2\n\
         address-family ipv4 unicast\n  network {THEIRS}\n exit-address-family\n"
    );
    let frr = Frr::start_with_config(&link.b, PEER_AS, &conf).unwrap_or_else(|e| panic!("{e}"));
    let b = Bgpd::start_with(
        &link.a,
        &format!(
            "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{BGPD_ADDR}\"\n\
             [[bgp.peers]]\naddress = \"{PEER_ADDR}\"\nas = {PEER_AS}\nhold_time = 9\n\
             [[bgp.announce]]\nprefix = \"{OURS}\"\n"
        ),
    );
    assert!(
        wait_until(Duration::from_secs(40), || frr.route(OURS).is_some()
            && b.route(THEIRS).is_some()),
        "routes did not arrive\n{}",
        b.log()
    );
    let caps = frr.json(&format!("show bgp neighbors {BGPD_ADDR} json"))[BGPD_ADDR]
        ["neighborCapabilities"]
        .clone();
    assert_eq!(
        caps["enhancedRouteRefresh"], "advertisedAndReceived",
        "{caps}"
    );
    let since = b.since();

    // FRR asks us: we answer with BoRR, our routes, EoRR (three more messages at FRR).
    let before = stat(&frr, "routeRefreshRecv");
    frr.vtysh(&[&format!("clear bgp ipv4 unicast {BGPD_ADDR} soft in")]);
    assert!(
        wait_until(Duration::from_secs(10), || stat(&frr, "routeRefreshRecv")
            >= before + 2),
        "FRR saw no BoRR/EoRR from us: {} -> {}: {}",
        before,
        stat(&frr, "routeRefreshRecv"),
        frr.json(&format!("show bgp neighbors {BGPD_ADDR} json"))[BGPD_ADDR]["messageStats"]
    );
    assert!(frr.route(OURS).is_some());

    // We ask FRR: its routes come back between its BoRR and EoRR and are not stale after.
    let asked = stat(&frr, "routeRefreshRecv");
    let answered = stat(&frr, "routeRefreshSent");
    let out = bgpctl(&b.socket, &["peer", "refresh", PEER_ADDR]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        wait_until(Duration::from_secs(10), || stat(&frr, "routeRefreshRecv")
            > asked),
        "FRR did not receive our ROUTE-REFRESH"
    );
    assert!(
        wait_until(Duration::from_secs(10), || stat(&frr, "routeRefreshSent")
            >= answered + 2),
        "FRR did not frame its answer with BoRR/EoRR"
    );
    std::thread::sleep(Duration::from_millis(500));
    let r = b
        .route(THEIRS)
        .expect("FRR's route is gone after the refresh");
    assert_eq!(r["stale"], false, "{r}");
    // And `--out` sends ours again.
    let again = stat(&frr, "routeRefreshRecv");
    let out = bgpctl(&b.socket, &["peer", "refresh", PEER_ADDR, "--out"]);
    assert!(out.status.success(), "{out:?}");
    assert!(wait_until(Duration::from_secs(10), || stat(
        &frr,
        "routeRefreshRecv"
    ) >= again + 2));
    // No session was reset.
    assert_eq!(b.since(), since);
    assert!(b.established() && frr.established());
}
