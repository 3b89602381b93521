//! Prefix limits against a real peer: FRR announces six prefixes to a bgpd that accepts at
//! most four. bgpd stops the session with Cease / Maximum Number of Prefixes Reached (FRR
//! reports the NOTIFICATION it received), drops the peer's routes, says why in
//! `show protocols`, and restarts the session after the configured time. Needs root and FRR.

use std::time::{Duration, Instant};

use interop_tests::lab::bgp_peer::{
    BGPD_ADDR, BgpPeer, Bgpd, LOCAL_AS, Link, PEER_ADDR, wait_until,
};
use interop_tests::lab::frr::Frr;

const PEER_AS: u32 = 65000;

#[test]
fn a_peer_above_its_prefix_limit_is_stopped_with_the_right_cease() {
    let link = Link::new("maxp");
    let mut conf = format!(
        "frr defaults traditional\nhostname peer\nrouter bgp {PEER_AS}\n bgp router-id {PEER_ADDR}\n\
         no bgp ebgp-requires-policy\n no bgp network import-check\n\
         neighbor {BGPD_ADDR} remote-as {LOCAL_AS}\n neighbor {BGPD_ADDR} timers connect 2\n\
         address-family ipv4 unicast\n"
    );
    for i in 1..=6 {
        conf.push_str(&format!("  network 10.40.{i}.0/24\n"));
    }
    conf.push_str(" exit-address-family\n");
    let frr = Frr::start_with_config(&link.b, PEER_AS, &conf).unwrap_or_else(|e| panic!("{e}"));
    let b = Bgpd::start_with(
        &link.a,
        &format!(
            "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{BGPD_ADDR}\"\n\
             [[bgp.peers]]\naddress = \"{PEER_ADDR}\"\nas = {PEER_AS}\nhold_time = 9\n\
             max_prefixes = 4\nmax_prefixes_restart = 5\n"
        ),
    );

    // FRR received our Cease with subcode 1.
    let neighbor = || frr.json(&format!("show bgp neighbors {BGPD_ADDR} json"))[BGPD_ADDR].clone();
    let mut n = serde_json::Value::Null;
    assert!(
        wait_until(Duration::from_secs(40), || {
            n = neighbor();
            n.to_string().contains("Maximum Number of Prefixes Reached")
        }),
        "FRR never saw Cease/Maximum Number of Prefixes: {n}\n{}",
        b.log()
    );
    let stopped_at = Instant::now();
    eprintln!(
        "FRR says: {} / {}",
        n["lastResetDueTo"], n["lastNotificationReason"]
    );
    // bgpd says why, and holds none of the peer's routes.
    let p = &b.ctl_json(&["show", "protocols", "--json"])[0];
    assert!(
        p["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("maximum prefixes exceeded") && e.contains("limit 4")),
        "{p}"
    );
    assert!(b.route("10.40.1.0/24").is_none());

    // And tries again after the restart time: the session comes back (and stops again).
    assert!(
        wait_until(Duration::from_secs(30), || frr.established()
            || b.established()),
        "the session did not restart\n{}",
        b.log()
    );
    assert!(
        stopped_at.elapsed() >= Duration::from_secs(3),
        "restarted after {:?}, before the configured 5 s",
        stopped_at.elapsed()
    );
}
