//! Route reflection (RFC 4456) against real peers on one segment (AS 64512 throughout):
//! - bgpd reflecting between a BIRD 1.6 client and an FRR client: each learns the other's
//!   route with the original next hop, ORIGINATOR_ID and our CLUSTER_LIST;
//! - bgpd as a client of an FRR reflector, with BIRD 2 as the other client;
//! - two reflectors sharing a cluster id (bgpd and FRR as non-clients of each other): what
//!   FRR reflects from its client comes back with our cluster id and is refused — no loop.
//!
//! Needs root, BIRD 1.6, BIRD 2 and FRR.

use std::time::Duration;

use interop_tests::lab::bgp_peer::{BgpPeer, Bgpd, PEER_PREFIX, wait_until};
use interop_tests::lab::bird::{Bird, BirdVersion};
use interop_tests::lab::frr::Frr;
use interop_tests::lab::segment::{Member, Segment};

const AS: u32 = 64512;
const CLUSTER: &str = "244.0.0.1";
const BGPD_PREFIX: &str = "10.10.1.0/24";
const FRR_PREFIX: &str = "10.30.1.0/24";
const UP: Duration = Duration::from_secs(40);

/// BIRD's address is fixed by the lab's BIRD configuration (router id 10.99.0.2, neighbour
/// 10.99.0.1); bgpd and FRR take the two others as each case needs.
struct Lab {
    _seg: Segment,
    a: Member,
    bird: Member,
    c: Member,
}

fn lab(tag: &str) -> Lab {
    let seg = Segment::new(&format!("{tag}s")).unwrap();
    let a = seg.attach(&format!("{tag}a"), "10.99.0.1/24").unwrap();
    let bird = seg.attach(&format!("{tag}b"), "10.99.0.2/24").unwrap();
    let c = seg.attach(&format!("{tag}c"), "10.99.0.3/24").unwrap();
    Lab {
        _seg: seg,
        a,
        bird,
        c,
    }
}

fn bgpd(m: &Member, bgp: &str) -> Bgpd {
    Bgpd::start_with(
        &m.ns,
        &format!(
            "[bgp]\nas = {AS}\nrouter_id = \"{}\"\n{bgp}\n\
             [[bgp.announce]]\nprefix = \"{BGPD_PREFIX}\"\n",
            m.addr
        ),
    )
}

fn frr(m: &Member, body: &str) -> Frr {
    let conf = format!(
        "frr defaults traditional\nhostname frr\nrouter bgp {AS}\n bgp router-id {}\n\
         no bgp ebgp-requires-policy\n no bgp network import-check\n{body}\
         address-family ipv4 unicast\n  network {FRR_PREFIX}\n exit-address-family\n",
        m.addr
    );
    Frr::start_with_config(&m.ns, AS, &conf).unwrap_or_else(|e| panic!("{e}"))
}

fn frr_neighbor(addr: &str, extra: &[&str]) -> String {
    let mut s = format!(" neighbor {addr} remote-as {AS}\n neighbor {addr} timers connect 2\n");
    for e in extra {
        s.push_str(&format!(" neighbor {addr} {e}\n"));
    }
    s
}

fn frr_route_text(f: &Frr, prefix: &str) -> Option<String> {
    let v = f.json(&format!("show bgp ipv4 unicast {prefix} json"));
    v["paths"].as_array().filter(|p| !p.is_empty())?;
    Some(v.to_string())
}

fn sessions_up(b: &Bgpd, n: usize) -> bool {
    b.ctl_json(&["show", "protocols", "--json"])
        .as_array()
        .is_some_and(|a| a.len() == n && a.iter().all(|p| p["state"] == "Established"))
}

#[test]
fn bgpd_reflects_between_a_bird16_client_and_an_frr_client() {
    let l = lab("rra");
    let bird = Bird::start(BirdVersion::V1, &l.bird.ns, AS).unwrap_or_else(|e| panic!("{e}"));
    let f = frr(&l.c, &frr_neighbor("10.99.0.1", &[]));
    let b = bgpd(
        &l.a,
        &format!(
            "cluster_id = \"{CLUSTER}\"\n\
             # Both clients are configured (external) peers: routes pass between them.\n\
             external_transit = true\n\
             [[bgp.peers]]\naddress = \"10.99.0.2\"\nas = {AS}\nrr_client = true\nhold_time = 9\n\
             [[bgp.peers]]\naddress = \"10.99.0.3\"\nas = {AS}\nrr_client = true\nhold_time = 9\n"
        ),
    );
    assert!(
        wait_until(UP, || sessions_up(&b, 2) && bird.established()),
        "sessions did not come up\n{}",
        b.log()
    );
    // BIRD 1.6's route at FRR: next hop kept, BIRD as originator, our cluster id.
    let mut text = None;
    assert!(
        wait_until(UP, || {
            text = frr_route_text(&f, PEER_PREFIX);
            text.is_some()
        }),
        "FRR did not get BIRD 1.6's route by reflection\n{}",
        b.log()
    );
    let text = text.unwrap();
    assert!(text.contains("\"originatorId\":\"10.99.0.2\""), "{text}");
    assert!(text.contains(CLUSTER), "{text}");
    assert!(text.contains("10.99.0.2"), "next hop kept: {text}");
    // FRR's route at BIRD 1.6, with the reflection attributes.
    let mut shown = String::new();
    assert!(
        wait_until(UP, || {
            shown = bird.birdc(&["show", "route", "all", FRR_PREFIX]);
            shown.contains("BGP.originator_id")
        }),
        "BIRD 1.6 did not get FRR's route by reflection: {shown}"
    );
    assert!(shown.contains("BGP.originator_id: 10.99.0.3"), "{shown}");
    assert!(
        shown.contains(&format!("BGP.cluster_list: {CLUSTER}")),
        "{shown}"
    );
    assert!(shown.contains("via 10.99.0.3"), "next hop kept: {shown}");
    // Our own route goes to both, without reflection attributes.
    assert!(wait_until(UP, || bird.route(BGPD_PREFIX).is_some()));
    let ours = frr_route_text(&f, BGPD_PREFIX).unwrap_or_default();
    assert!(!ours.contains("originatorId"), "{ours}");
}

/// FRR at 10.99.0.1 (where BIRD looks for its neighbour), bgpd at 10.99.0.3.
fn frr_reflector(l: &Lab, cluster_id: Option<&str>, bgpd_is_client: bool) -> Frr {
    let mut body = String::new();
    if let Some(c) = cluster_id {
        body.push_str(&format!(" bgp cluster-id {c}\n"));
    }
    body.push_str(&frr_neighbor("10.99.0.2", &[]));
    body.push_str(&frr_neighbor("10.99.0.3", &[]));
    body.push_str(" address-family ipv4 unicast\n");
    body.push_str("  neighbor 10.99.0.2 route-reflector-client\n");
    if bgpd_is_client {
        body.push_str("  neighbor 10.99.0.3 route-reflector-client\n");
    }
    body.push_str(" exit-address-family\n");
    frr(&l.a, &body)
}

#[test]
fn bgpd_as_a_client_of_an_frr_reflector() {
    let l = lab("rrb");
    let _f = frr_reflector(&l, None, true);
    let bird = Bird::start(BirdVersion::V2, &l.bird.ns, AS).unwrap_or_else(|e| panic!("{e}"));
    let b = bgpd(
        &l.c,
        &format!("[[bgp.peers]]\naddress = \"10.99.0.1\"\nas = {AS}\nhold_time = 9\n"),
    );
    assert!(
        wait_until(UP, || sessions_up(&b, 1) && bird.established()),
        "sessions did not come up\n{}",
        b.log()
    );
    // BIRD 2's route reaches us through the reflector, next hop still BIRD.
    assert!(
        wait_until(UP, || b.route(PEER_PREFIX).is_some_and(|r| r["next_hop"]
            == "10.99.0.2"
            && r["from_peer"] == "10.99.0.1")),
        "BIRD 2's route did not arrive through FRR: {:?}\n{}",
        b.route(PEER_PREFIX),
        b.log()
    );
    // Ours reaches BIRD 2 the same way.
    let mut shown = String::new();
    assert!(
        wait_until(UP, || {
            shown = bird.birdc(&["show", "route", "all", BGPD_PREFIX]);
            shown.contains("BGP.originator_id")
        }),
        "our route did not reach BIRD 2 through FRR: {shown}"
    );
    assert!(shown.contains("BGP.originator_id: 10.99.0.3"), "{shown}");
}

#[test]
fn two_reflectors_with_one_cluster_id_do_not_loop() {
    let l = lab("rrc");
    let f = frr_reflector(&l, Some(CLUSTER), false);
    let bird = Bird::start(BirdVersion::V2, &l.bird.ns, AS).unwrap_or_else(|e| panic!("{e}"));
    let b = bgpd(
        &l.c,
        &format!(
            "cluster_id = \"{CLUSTER}\"\n\
             [[bgp.peers]]\naddress = \"10.99.0.1\"\nas = {AS}\nhold_time = 9\n"
        ),
    );
    assert!(
        wait_until(UP, || sessions_up(&b, 1) && bird.established()),
        "sessions did not come up\n{}",
        b.log()
    );
    // FRR reflects its client's route to us (a non-client) carrying our shared cluster id:
    // it arrives (Adj-RIB-In) and is refused (not in the Loc-RIB).
    let adj_in = || {
        b.ctl_json(&["show", "route", "--table", "adj-in", "10.99.0.1", "--json"])
            .as_array()
            .is_some_and(|a| a.iter().any(|r| r["prefix"] == PEER_PREFIX))
    };
    assert!(
        wait_until(UP, adj_in),
        "FRR did not reflect its client's route to us\n{}",
        b.log()
    );
    assert!(
        b.route(PEER_PREFIX).is_none(),
        "a route with our cluster id in CLUSTER_LIST entered the Loc-RIB"
    );
    let p = &b.ctl_json(&["show", "protocols", "--json"])[0];
    assert!(
        p["prefixes_received"].as_u64() > p["prefixes_accepted"].as_u64(),
        "{p}"
    );
    // FRR's own route (not reflected) is accepted, and ours reaches FRR.
    assert!(wait_until(UP, || b.route(FRR_PREFIX).is_some()));
    assert!(wait_until(UP, || frr_route_text(&f, BGPD_PREFIX).is_some()));
}
