//! bgpd against real BGP speakers (BIRD 1.6, BIRD 2, FRR, GoBGP), each in its own pair of
//! namespaces, over iBGP (AS 64512 both sides) and eBGP (the peer in AS 65000). Needs root and
//! the peers installed (see interop-lab.md; BIRD 2 is unpacked by the lab when missing).
//!
//! Each test walks the whole matrix for one peer: session up; our prefix arrives with the right
//! next hop, origin, AS path and local-pref; theirs arrives in our Loc-RIB; withdrawals both
//! ways; a killed and restarted peer recovers the session and the routes.

use std::time::Duration;

use interop_tests::lab::bgp_peer::{
    BGPD_ADDR, BgpPeer, Bgpd, LOCAL_AS, Link, PEER_ADDR, PEER_PREFIX, wait_until,
};
use interop_tests::lab::bird::{Bird, BirdVersion};
use interop_tests::lab::frr::Frr;
use interop_tests::lab::gobgp::Gobgp;
use interop_tests::lab::netns::Netns;

const OUR_PREFIX: &str = "10.10.1.0/24";
const PEER_EBGP_AS: u32 = 65000;
const UP: Duration = Duration::from_secs(40);
const ROUTE: Duration = Duration::from_secs(20);

type Start = fn(&Netns, u32) -> Result<Box<dyn BgpPeer>, String>;

/// Both sides are up on a session newer than bgpd's `since` of before.
fn new_session(bgpd: &Bgpd, peer: &dyn BgpPeer, since: u64) -> bool {
    bgpd.established() && bgpd.since() != since && peer.established()
}

fn bird1(ns: &Netns, asn: u32) -> Result<Box<dyn BgpPeer>, String> {
    Ok(Box::new(Bird::start(BirdVersion::V1, ns, asn)?))
}
fn bird2(ns: &Netns, asn: u32) -> Result<Box<dyn BgpPeer>, String> {
    Ok(Box::new(Bird::start(BirdVersion::V2, ns, asn)?))
}
fn frr(ns: &Netns, asn: u32) -> Result<Box<dyn BgpPeer>, String> {
    Ok(Box::new(Frr::start(ns, asn)?))
}
fn gobgp(ns: &Netns, asn: u32) -> Result<Box<dyn BgpPeer>, String> {
    Ok(Box::new(Gobgp::start(ns, asn)?))
}

#[expect(
    clippy::too_many_lines,
    reason = "one interop scenario told in order: session up, prefixes both ways, withdrawals both ways; shared by every peer implementation"
)]
fn scenario(tag: &str, start: Start, peer_as: u32) {
    let ebgp = peer_as != LOCAL_AS;
    let link = Link::new(tag);
    let mut peer = start(&link.b, peer_as).unwrap_or_else(|e| panic!("{e}"));
    let bgpd = Bgpd::start(&link.a, peer_as, OUR_PREFIX);
    let name = peer.name();
    let kind = if ebgp { "eBGP" } else { "iBGP" };
    let ctx = |what: &str| format!("{name} {kind}: {what}\n--- bgpd log ---\n{}", bgpd.log());

    // Session up, seen from both sides.
    assert!(
        wait_until(UP, || bgpd.established() && peer.established()),
        "{}",
        ctx("session did not come up")
    );
    eprintln!("{name} {kind}: session up");

    // Our prefix at the peer, with the right attributes.
    let mut got = None;
    assert!(
        wait_until(ROUTE, || {
            got = peer.route(OUR_PREFIX);
            got.is_some()
        }),
        "{}",
        ctx("our prefix did not reach the peer")
    );
    let r = got.unwrap();
    assert_eq!(r.next_hop, BGPD_ADDR, "{}", ctx("next hop"));
    assert_eq!(r.origin, "IGP", "{}", ctx("origin"));
    let want_path: Vec<u32> = if ebgp { vec![LOCAL_AS] } else { vec![] };
    assert_eq!(r.as_path, want_path, "{}", ctx("AS path at the peer"));
    if !ebgp {
        assert_eq!(r.local_pref, Some(100), "{}", ctx("local-pref"));
    }
    eprintln!("{name} {kind}: our prefix arrived: {r:?}");
    // What we sent, from our Adj-RIB-Out: LOCAL_PREF only on iBGP.
    let out = bgpd.ctl_json(&[
        "show", "route", OUR_PREFIX, "--table", "adj-out", PEER_ADDR, "--json",
    ]);
    let sent = &out[0];
    assert_eq!(sent["prefix"], OUR_PREFIX, "{}", ctx("adj-out"));
    let want_lp = if ebgp {
        serde_json::Value::Null
    } else {
        100.into()
    };
    assert_eq!(sent["local_pref"], want_lp, "{}", ctx("LOCAL_PREF sent"));

    // Theirs in our Loc-RIB.
    let mut ours = None;
    assert!(
        wait_until(ROUTE, || {
            ours = bgpd.route(PEER_PREFIX);
            ours.is_some()
        }),
        "{}",
        ctx("the peer's prefix did not reach our Loc-RIB")
    );
    let ours = ours.unwrap();
    assert_eq!(ours["next_hop"], PEER_ADDR, "{}", ctx("their next hop"));
    assert_eq!(ours["origin"], "igp", "{}", ctx("their origin"));
    let want: Vec<u32> = if ebgp { vec![PEER_EBGP_AS] } else { vec![] };
    assert_eq!(
        ours["as_path"],
        serde_json::json!(want),
        "{}",
        ctx("their AS path")
    );
    eprintln!("{name} {kind}: their prefix arrived: {ours}");

    // Withdrawal from our side, and back.
    bgpd.ctl(&["route", "del", OUR_PREFIX]);
    assert!(
        wait_until(ROUTE, || peer.route(OUR_PREFIX).is_none()),
        "{}",
        ctx("our withdrawal did not propagate")
    );
    bgpd.ctl(&["route", "add", OUR_PREFIX]);
    assert!(
        wait_until(ROUTE, || peer.route(OUR_PREFIX).is_some()),
        "{}",
        ctx("our re-announcement did not propagate")
    );
    eprintln!("{name} {kind}: our withdrawal propagated");

    // Withdrawal from their side, and back.
    peer.withdraw();
    assert!(
        wait_until(ROUTE, || bgpd.route(PEER_PREFIX).is_none()),
        "{}",
        ctx("their withdrawal did not propagate")
    );
    peer.announce();
    assert!(
        wait_until(ROUTE, || bgpd.route(PEER_PREFIX).is_some()),
        "{}",
        ctx("their re-announcement did not propagate")
    );
    eprintln!("{name} {kind}: their withdrawal propagated");

    // Kill the peer outright and start it again: a new session (bgpd's `since` moves on)
    // and the routes recover.
    let since = bgpd.since();
    peer.kill_and_restart();
    assert!(
        wait_until(Duration::from_secs(60), || new_session(
            &bgpd, &*peer, since
        ) && peer
            .route(OUR_PREFIX)
            .is_some()
            && bgpd.route(PEER_PREFIX).is_some()),
        "{}",
        ctx("no recovery after the peer was killed and restarted")
    );
    eprintln!("{name} {kind}: recovered after kill and restart");
}

/// BIRD 1.6 killed and started again, twenty times, each time beside a fresh bgpd (so no
/// back-off from earlier errors): the session is back within 5 s each time, after exactly one
/// "session down". Both sides connect again about a second after the kill; when our
/// connection was confirmed first, we closed it for BIRD's (the higher identifier), but BIRD,
/// Established on ours already, stopped the whole session — and again at the restart, each
/// time with a doubled idle hold: about one kill in ten took 7 to 48 s to recover here, and
/// more than a minute once in CI.
#[test]
fn bird1_restarted_again_and_again_is_back_at_once_every_time() {
    let link = Link::new("b1r");
    for round in 0..20u64 {
        let mut peer = Bird::start(BirdVersion::V1, &link.b, PEER_EBGP_AS).unwrap();
        let bgpd = Bgpd::start(&link.a, PEER_EBGP_AS, OUR_PREFIX);
        assert!(
            wait_until(UP, || bgpd.established() && peer.established()),
            "round {round}: session did not come up\n{}",
            bgpd.log()
        );
        // Kills at different points of the keepalive exchange.
        std::thread::sleep(Duration::from_millis(round * 137 % 700));
        let since = bgpd.since();
        let killed = std::time::Instant::now();
        peer.kill_and_restart();
        let back = wait_until(Duration::from_secs(30), || new_session(&bgpd, &peer, since));
        let took = killed.elapsed();
        let log = bgpd.log();
        let downs = log.matches("session down").count();
        assert!(
            back && took < Duration::from_secs(5) && downs == 1,
            "round {round}: back {back} after {took:?} with {downs} session downs\n{log}"
        );
    }
}

#[test]
fn bird1_ibgp() {
    scenario("b1i", bird1, LOCAL_AS);
}

#[test]
fn bird1_ebgp() {
    scenario("b1e", bird1, PEER_EBGP_AS);
}

#[test]
fn bird2_ibgp() {
    scenario("b2i", bird2, LOCAL_AS);
}

#[test]
fn bird2_ebgp() {
    scenario("b2e", bird2, PEER_EBGP_AS);
}

#[test]
fn frr_ibgp() {
    scenario("fri", frr, LOCAL_AS);
}

#[test]
fn frr_ebgp() {
    scenario("fre", frr, PEER_EBGP_AS);
}

#[test]
fn gobgp_ibgp() {
    scenario("gbi", gobgp, LOCAL_AS);
}

#[test]
fn gobgp_ebgp() {
    scenario("gbe", gobgp, PEER_EBGP_AS);
}
