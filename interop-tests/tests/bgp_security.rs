//! Transport security against real peers: TCP MD5 (RFC 2385) with BIRD 2 and FRR — the right
//! password brings the session up, a wrong or missing one keeps it down with the reason in
//! `bgpctl show protocols` — and GTSM (RFC 5082) with FRR's `ttl-security hops 1`. Each case
//! in its own pair of namespaces; needs root, BIRD 2 and FRR. What the kernel refuses never
//! reaches the BGP state machine; bgpd's metrics count it
//! (`margay_bgpd_tcp_segments_refused_total{reason}`, the namespace's kernel counters).

use std::time::Duration;

use interop_tests::lab::bgp_peer::{
    BGPD_ADDR, BgpPeer, Bgpd, LOCAL_AS, Link, PEER_ADDR, wait_until,
};
use interop_tests::lab::bird::{Bird, BirdVersion};
use interop_tests::lab::frr::{Frr, one_neighbor_conf};
use interop_tests::lab::netns::Netns;

const PEER_AS: u32 = 65000;
const UP: Duration = Duration::from_secs(30);
/// How long a session must stay down to count as refused (several connect retries).
const DOWN: Duration = Duration::from_secs(10);

/// bgpd peering with the peer over eBGP, with `options` in its `[[bgp.peers]]` entry.
fn bgpd(ns: &Netns, options: &str) -> Bgpd {
    Bgpd::start_with(
        ns,
        &format!(
            "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{BGPD_ADDR}\"\n\
             [[bgp.peers]]\naddress = \"{PEER_ADDR}\"\nas = {PEER_AS}\nhold_time = 9\n{options}\n\
             [[bgp.announce]]\nprefix = \"10.10.1.0/24\"\n\
             [metrics]\nlisten = \"127.0.0.1:9099\"\n"
        ),
    )
}

/// Waits until bgpd has counted refused segments for `reason` (the peer's next connection
/// attempt brings them).
fn counted(ns: &Netns, reason: &str) {
    assert!(
        wait_until(Duration::from_secs(30), || refused(ns, reason) > 0),
        "nothing counted as {reason}"
    );
    eprintln!("counted as {reason}: {}", refused(ns, reason));
}

/// bgpd's count of TCP segments the kernel refused for `reason` (its namespace's).
fn refused(ns: &Netns, reason: &str) -> u64 {
    let text = ns
        .exec("curl", &["-s", "http://127.0.0.1:9099/metrics"])
        .unwrap_or_default();
    let key = format!("margay_bgpd_tcp_segments_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in bgpd's metrics:\n{text}"))
}

fn frr(ns: &Netns, neighbor_options: &[&str]) -> Frr {
    let conf = one_neighbor_conf(PEER_AS, &[], neighbor_options, &[]);
    Frr::start_with_config(ns, PEER_AS, &conf).unwrap_or_else(|e| panic!("{e}"))
}

fn bird2(ns: &Netns, extra: &str) -> Bird {
    Bird::start_with(BirdVersion::V2, ns, PEER_AS, extra).unwrap_or_else(|e| panic!("{e}"))
}

fn session(b: &Bgpd) -> serde_json::Value {
    b.ctl_json(&["show", "protocols", "--json"])[0].clone()
}

fn expect_up(what: &str, b: &Bgpd, peer: &dyn BgpPeer) {
    assert!(
        wait_until(UP, || b.established() && peer.established()),
        "{what}: session did not come up: {}\n{}",
        session(b),
        b.log()
    );
    // And routes flow over the signed connection.
    assert!(
        wait_until(UP, || peer.route("10.10.1.0/24").is_some()),
        "{what}: our route did not arrive"
    );
    eprintln!("{what}: up");
}

fn expect_refused(what: &str, b: &Bgpd, peer: &dyn BgpPeer, reason: &str) {
    let mut last = serde_json::Value::Null;
    let saw_reason = wait_until(DOWN + Duration::from_secs(10), || {
        last = session(b);
        last["last_error"]
            .as_str()
            .is_some_and(|e| e.contains(reason))
    });
    assert!(
        !b.established() && !peer.established(),
        "{what}: the session came up"
    );
    assert!(
        saw_reason,
        "{what}: show protocols does not say why: {last}\n{}",
        b.log()
    );
    assert_ne!(last["state"], "Established", "{what}");
    eprintln!(
        "{what}: refused, show protocols says: {}",
        last["last_error"]
    );
}

#[test]
fn md5_with_bird2() {
    let ok = Link::new("md5b");
    let peer = bird2(&ok.b, "  password \"s3cret\";\n");
    let b = bgpd(&ok.a, "password = \"s3cret\"");
    expect_up("BIRD 2, right password", &b, &peer);

    let wrong = Link::new("md5bw");
    let peer = bird2(&wrong.b, "  password \"s3cret\";\n");
    let b = bgpd(&wrong.a, "password = \"other\"");
    expect_refused("BIRD 2, wrong password", &b, &peer, "TCP MD5");
    counted(&wrong.a, "md5_failure");

    let missing = Link::new("md5bm");
    let peer = bird2(&missing.b, "");
    let b = bgpd(&missing.a, "password = \"s3cret\"");
    expect_refused("BIRD 2, no password on its side", &b, &peer, "TCP MD5");
    counted(&missing.a, "md5_not_found");
}

#[test]
fn md5_with_frr() {
    let ok = Link::new("md5f");
    let peer = frr(&ok.b, &["password s3cret"]);
    let b = bgpd(&ok.a, "password = \"s3cret\"");
    expect_up("FRR, right password", &b, &peer);
    assert_eq!(refused(&ok.a, "md5_failure"), 0);

    let wrong = Link::new("md5fw");
    let peer = frr(&wrong.b, &["password s3cret"]);
    let b = bgpd(&wrong.a, "password = \"other\"");
    expect_refused("FRR, wrong password", &b, &peer, "TCP MD5");
    counted(&wrong.a, "md5_failure");
}

#[test]
fn gtsm_with_frr() {
    let ok = Link::new("gtsm");
    let peer = frr(&ok.b, &["ttl-security hops 1"]);
    let b = bgpd(&ok.a, "ttl_security = 1");
    expect_up("FRR, ttl-security hops 1 both sides", &b, &peer);

    // GTSM on our side only: the peer's eBGP packets leave with TTL 1, below our minimum of
    // 255; the SYN tells, before any data is read.
    // (The other way round FRR applies its minimum only after the OPEN exchange, so a peer
    // without GTSM gets Established on its side and then loses every KEEPALIVE.)
    let ours = Link::new("gtsmo");
    let peer = bird2(&ours.b, "");
    let b = bgpd(&ours.a, "ttl_security = 1");
    expect_refused("bgpd with GTSM, BIRD 2 without", &b, &peer, "GTSM");
    counted(&ours.a, "min_ttl");

    let ours = Link::new("gtsmf");
    let peer = frr(&ours.b, &[]);
    let b = bgpd(&ours.a, "ttl_security = 1");
    expect_refused("bgpd with GTSM, FRR without", &b, &peer, "GTSM");
}
