//! IPv6 and dual stack against real peers (issue #6). bgpd in namespace `a` (10.99.0.1 and
//! fd99::1), the peer in `b` (10.99.0.2 and fd99::2), one veth between them; eBGP, the peer in
//! AS 65000. Each case in its own pair of namespaces; needs root, BIRD 2 and FRR. It proves:
//!
//! Why this file is long: one case per IPv6 behaviour against BIRD 2 and FRR, sharing the
//! pair-of-namespaces set-up.
//!
//! - BIRD 2 over an IPv6 session (TCP over IPv6): IPv6 /122 blocks both ways, with the right
//!   next hops (global, and the link-local one RFC 2545 asks for on a shared link) and AS
//!   paths, and withdrawals both ways.
//! - FRR over an IPv6 session with `capability extended-nexthop`: the /122 blocks both ways,
//!   and IPv4 routes with IPv6 next hops both ways (RFC 8950); FRR sees our IPv6 route with a
//!   global and a link-local next hop, and bgpd shows FRR's link-local one.
//! - FRR over an IPv4 session carrying IPv6 too (MP-BGP, RFC 4760): our IPv6 route arrives
//!   with the node's IPv6 address (`[node] address6`) as next hop, theirs with their fd99::2.
//!
//! FRR runs with zebra (it installs what it learns into the peer's namespace): without it
//! FRR's bgpd knows no interfaces and so no next hop of its own for the other family. FRR 8.4
//! with `-Z` on the IPv6 session with extended next hop sends UPDATEs that BIRD 2 refuses
//! ("Received: Invalid network field") and the session flaps.
//!
//! `peer_configs_against_each_other` (ignored; `--run-ignored all`) runs the same peer
//! configurations with BIRD 2 or FRR standing in for bgpd: a check of the lab, not of bgpd.

use std::time::Duration;

use interop_tests::lab::bgp_peer::{
    BGPD_ADDR, BgpPeer, Bgpd, LOCAL_AS, PEER_ADDR, PEER_PREFIX, wait_until,
};
use interop_tests::lab::bgpd::bgpctl;
use interop_tests::lab::bird::{Bird, BirdVersion};
use interop_tests::lab::frr::Frr;
use interop_tests::lab::link6::{
    BGPD_ADDR6, DEV, PEER_ADDR6, bird_gateway, bird_next_hops, dual_stack_link, frr_nexthops,
    link_local,
};
use interop_tests::lab::netns::Netns;

const PEER_AS: u32 = 65000;
/// bgpd's IPv6 block (an IPAM-sized /122) and IPv4 prefix.
const OUR6: &str = "fd10:1::/122";
const OUR4: &str = "10.10.1.0/24";
/// The peer's IPv6 block; its IPv4 prefix is [`PEER_PREFIX`] (10.20.1.0/24).
const PEER6: &str = "fd20:1::/122";
const WAIT: Duration = Duration::from_secs(30);

// ---- the peers' configurations ----

/// BIRD 2 over IPv6 to fd99::1: exports its static /122 (protocol `st`, so that
/// `BgpPeer::withdraw` / `announce` disable and enable it), imports everything.
fn bird2_ipv6_conf(local: &str, neighbor: &str, local_as: u32, neighbor_as: u32) -> String {
    format!(
        "router id {PEER_ADDR};\n\
         protocol device {{ scan time 2; }}\n\
         protocol static st {{ ipv6; route {PEER6} blackhole; }}\n\
         protocol bgp m {{\n  local {local} as {local_as};\n  neighbor {neighbor} as {neighbor_as};\n\
           ipv6 {{ import all; export where proto = \"st\"; }};\n\
           connect delay time 1;\n  connect retry time 3;\n  error wait time 1,10;\n}}\n"
    )
}

/// FRR in AS 65000 with bgpd at `neighbor` (fd99::1 or 10.99.0.1) active in both families,
/// announcing 10.20.1.0/24 and fd20:1::/122. `no bgp network import-check`: the networks
/// need not be in FRR's RIB. On an IPv6 session `capability extended-nexthop` lets IPv4
/// routes carry IPv6 next hops (FRR only offers the capability on its own for unnumbered
/// peers).
fn frr_conf(neighbor: &str) -> String {
    let enhe = if neighbor.contains(':') {
        format!(" neighbor {neighbor} capability extended-nexthop\n")
    } else {
        String::new()
    };
    format!(
        "frr defaults traditional\nhostname peer\nrouter bgp {PEER_AS}\n bgp router-id {PEER_ADDR}\n\
          no bgp ebgp-requires-policy\n no bgp network import-check\n no bgp default ipv4-unicast\n\
          neighbor {neighbor} remote-as {LOCAL_AS}\n neighbor {neighbor} timers connect 2\n{enhe}\
          address-family ipv4 unicast\n  network {PEER_PREFIX}\n  neighbor {neighbor} activate\n\
          exit-address-family\n\
          address-family ipv6 unicast\n  network {PEER6}\n  neighbor {neighbor} activate\n\
          exit-address-family\n"
    )
}

fn start_frr(ns: &Netns, conf: &str) -> Frr {
    Frr::start_with_kernel(ns.name(), PEER_AS, conf).unwrap_or_else(|e| panic!("{e}"))
}

/// FRR's route for `prefix` (`afi` "ipv4" or "ipv6"), as JSON; `{}` when it has none.
fn frr_route(frr: &Frr, afi: &str, prefix: &str) -> serde_json::Value {
    frr.json(&format!("show bgp {afi} unicast {prefix} json"))
}

fn frr_has(frr: &Frr, afi: &str, prefix: &str) -> bool {
    !frr_nexthops(&frr_route(frr, afi, prefix)).is_empty()
}

/// Adds (`add`) or removes FRR's `network prefix` in `afi`.
fn frr_network(frr: &Frr, afi: &str, prefix: &str, add: bool) {
    let net = format!("{}network {prefix}", if add { "" } else { "no " });
    frr.configure(&[
        &format!("router bgp {PEER_AS}"),
        &format!("address-family {afi} unicast"),
        &net,
    ]);
}

// ---- bgpd ----

/// bgpd peering with `peer` (AS 65000), `families` in its peer entry when given,
/// announcing `announce`, with `node` lines in `[node]`.
fn start_bgpd(ns: &Netns, node: &str, peer: &str, families: &str, announce: &[&str]) -> Bgpd {
    let mut extra = format!(
        "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{BGPD_ADDR}\"\n\
         [[bgp.peers]]\naddress = \"{peer}\"\nas = {PEER_AS}\nhold_time = 9\n{families}\n"
    );
    for p in announce {
        extra.push_str(&format!("[[bgp.announce]]\nprefix = \"{p}\"\n"));
    }
    Bgpd::start_with_node(ns, node, &extra)
}

/// A failure message with what both sides say. Plain bgpctl output, not `ctl_json`: that
/// asserts, and a failing bgpctl would hide the message.
fn ctx(what: &str, b: &Bgpd, peer: &str) -> String {
    let ctl = |args: &[&str]| {
        let o = bgpctl(&b.socket, args);
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    format!(
        "{what}\n--- bgpctl show protocols ---\n{}\n--- bgpctl show route ---\n{}\n\
         --- peer ---\n{peer}\n--- bgpd log ---\n{}",
        ctl(&["show", "protocols"]),
        ctl(&["show", "route"]),
        b.log()
    )
}

/// bgpd names its one session by the peer's address (of the session's family).
fn assert_session_address(b: &Bgpd, address: &str, peer: &dyn Fn() -> String) {
    let sessions = b.ctl_json(&["show", "protocols", "--json"]);
    assert_eq!(
        sessions[0]["address"],
        address,
        "{}",
        ctx("peer_address", b, &peer())
    );
}

/// bgpd's route for `prefix`, waited for.
fn bgpd_route(b: &Bgpd, prefix: &str, peer: &dyn Fn() -> String) -> serde_json::Value {
    let mut got = None;
    assert!(
        wait_until(WAIT, || {
            got = b.route(prefix);
            got.is_some()
        }),
        "{}",
        ctx(
            &format!("{prefix} did not reach bgpd's Loc-RIB"),
            b,
            &peer()
        )
    );
    got.unwrap()
}

/// FRR's entry for our `prefix` in `afi`, waited for until it has a next hop.
fn frr_route_of_ours(
    frr: &Frr,
    afi: &str,
    prefix: &str,
    b: &Bgpd,
    what: &str,
    peer: &dyn Fn() -> String,
) -> serde_json::Value {
    let mut v = serde_json::Value::Null;
    assert!(
        wait_until(WAIT, || {
            v = frr_route(frr, afi, prefix);
            !frr_nexthops(&v).is_empty()
        }),
        "{}",
        ctx(&format!("{what} did not reach FRR"), b, &peer())
    );
    v
}

fn as_path(r: &serde_json::Value) -> serde_json::Value {
    r["as_path"].clone()
}

// ---- the cases ----

#[test]
fn bird2_ipv6_session() {
    let link = dual_stack_link("v6b");
    let bird = Bird::start_config(
        BirdVersion::V2,
        &link.b,
        &bird2_ipv6_conf(PEER_ADDR6, BGPD_ADDR6, PEER_AS, LOCAL_AS),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let b = start_bgpd(&link.a, "", PEER_ADDR6, "", &[OUR6]);
    let peer = || {
        format!(
            "{}\n{}",
            bird.birdc(&["show", "protocols", "all", "m"]),
            bird.birdc(&["show", "route", "all"])
        )
    };
    let our_ll = link_local(&link.a, DEV).expect("bgpd's link-local address");
    let their_ll = link_local(&link.b, DEV).expect("BIRD's link-local address");

    assert!(
        wait_until(WAIT, || b.established() && bird.established()),
        "{}",
        ctx("the IPv6 session did not come up", &b, &peer())
    );
    // The session runs over IPv6: bgpd names the peer by its IPv6 address.
    assert_session_address(&b, PEER_ADDR6, &peer);
    eprintln!("BIRD 2 IPv6: session up");

    // Their /122 at bgpd: next hop BIRD's global address, its link-local one beside it (BIRD
    // sends both on a direct session), AS path theirs.
    let r = bgpd_route(&b, PEER6, &peer);
    assert_eq!(
        r["next_hop"],
        PEER_ADDR6,
        "{}",
        ctx("their next hop", &b, &peer())
    );
    assert_eq!(
        r["next_hop_link_local"],
        their_ll.as_str(),
        "{}",
        ctx("their link-local next hop", &b, &peer())
    );
    assert_eq!(
        as_path(&r),
        serde_json::json!([PEER_AS]),
        "{}",
        ctx("their AS path", &b, &peer())
    );
    eprintln!("BIRD 2 IPv6: their block arrived: {r}");

    // Our /122 at BIRD: resolved to a gateway on the link (BIRD shows a route whose next hop
    // it cannot reach as unreachable, without a `via` line), BGP next hop global +
    // link-local, AS path ours.
    let mut text = String::new();
    assert!(
        wait_until(WAIT, || {
            text = bird.birdc(&["show", "route", "all", OUR6, "protocol", "m"]);
            bird.route(OUR6).is_some()
        }),
        "{}",
        ctx("our block did not reach BIRD", &b, &peer())
    );
    assert_eq!(
        bird_gateway(&text),
        Some((BGPD_ADDR6.to_owned(), DEV.to_owned())),
        "{}",
        ctx("BIRD's gateway for our block", &b, &text)
    );
    assert_eq!(
        bird_next_hops(&text),
        vec![BGPD_ADDR6.to_owned(), our_ll.clone()],
        "{}",
        ctx("our next hops at BIRD (global, link-local)", &b, &text)
    );
    let at_bird = bird.route(OUR6).unwrap();
    assert_eq!(
        at_bird.as_path,
        vec![LOCAL_AS],
        "{}",
        ctx("our AS path at BIRD", &b, &text)
    );
    eprintln!("BIRD 2 IPv6: our block arrived: {at_bird:?}");

    // Withdrawals both ways, and back.
    b.ctl(&["route", "del", OUR6]);
    assert!(
        wait_until(WAIT, || bird.route(OUR6).is_none()),
        "{}",
        ctx("our withdrawal did not reach BIRD", &b, &peer())
    );
    b.ctl(&["route", "add", OUR6]);
    assert!(
        wait_until(WAIT, || bird.route(OUR6).is_some()),
        "{}",
        ctx("our re-announcement did not reach BIRD", &b, &peer())
    );
    // (`BgpPeer::withdraw`, without taking `bird` mutably: `peer` reads it.)
    bird.birdc(&["disable", "st"]);
    assert!(
        wait_until(WAIT, || b.route(PEER6).is_none()),
        "{}",
        ctx("BIRD's withdrawal did not reach bgpd", &b, &peer())
    );
    bird.birdc(&["enable", "st"]);
    assert!(
        wait_until(WAIT, || b.route(PEER6).is_some()),
        "{}",
        ctx("BIRD's re-announcement did not reach bgpd", &b, &peer())
    );
    eprintln!("BIRD 2 IPv6: withdrawals propagated both ways");
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: FRR over IPv6, extended next hop negotiated, routes of both families both ways, withdrawals"
)]
fn frr_ipv6_session_with_extended_next_hop() {
    let link = dual_stack_link("v6f");
    let frr = start_frr(&link.b, &frr_conf(BGPD_ADDR6));
    let b = start_bgpd(
        &link.a,
        "",
        PEER_ADDR6,
        "families = [\"ipv6\", \"ipv4\"]",
        &[OUR6, OUR4],
    );
    let peer = || {
        format!(
            "{}\n{}",
            frr.vtysh(&[&format!("show bgp neighbors {BGPD_ADDR6}")]),
            frr.vtysh(&["show bgp ipv4 unicast", "show bgp ipv6 unicast"])
        )
    };
    let our_ll = link_local(&link.a, DEV).expect("bgpd's link-local address");
    let their_ll = link_local(&link.b, DEV).expect("FRR's link-local address");

    assert!(
        wait_until(WAIT, || b.established()
            && frr.session_state("ipv6", BGPD_ADDR6) == "Established"),
        "{}",
        ctx("the IPv6 session did not come up", &b, &peer())
    );
    assert_session_address(&b, PEER_ADDR6, &peer);
    // The extended next hop capability
    // (RFC 8950) both ways: without it FRR would neither send nor accept IPv4 routes with
    // IPv6 next hops.
    let nbr = frr.json(&format!("show bgp neighbors {BGPD_ADDR6} json"));
    let caps = &nbr[BGPD_ADDR6]["neighborCapabilities"];
    assert_eq!(
        caps["extendedNexthop"],
        "advertisedAndReceived",
        "{}",
        ctx(
            "extended next hop capability at FRR",
            &b,
            &format!("{nbr:#}")
        )
    );
    eprintln!("FRR IPv6: session up, extended next hop negotiated");

    // Their /122 at bgpd, with FRR's link-local next hop beside the global one (RFC 2545).
    let r = bgpd_route(&b, PEER6, &peer);
    assert_eq!(
        r["next_hop"],
        PEER_ADDR6,
        "{}",
        ctx("their next hop", &b, &peer())
    );
    assert_eq!(
        r["next_hop_link_local"],
        their_ll.as_str(),
        "{}",
        ctx("their link-local next hop", &b, &peer())
    );
    assert_eq!(
        as_path(&r),
        serde_json::json!([PEER_AS]),
        "{}",
        ctx("their AS path", &b, &peer())
    );
    eprintln!("FRR IPv6: their block arrived: {r}");

    // Their IPv4 prefix over the IPv6 session: an IPv6 next hop (FRR sends fd99::2 plus its
    // link-local address; the global one is the next hop, the link-local one may stand in).
    let r = bgpd_route(&b, PEER_PREFIX, &peer);
    let nh = r["next_hop"].as_str().unwrap_or("");
    assert!(
        nh == PEER_ADDR6 || nh == their_ll,
        "{}",
        ctx(
            &format!("their IPv4 prefix's next hop {nh:?} is not FRR's IPv6 address"),
            &b,
            &peer()
        )
    );
    assert_eq!(
        as_path(&r),
        serde_json::json!([PEER_AS]),
        "{}",
        ctx("their IPv4 AS path", &b, &peer())
    );
    eprintln!("FRR IPv6: their IPv4 prefix arrived with an IPv6 next hop: {r}");

    // Our IPv4 prefix at FRR with our IPv6 address as next hop: RFC 8950 from our side.
    let v = frr_route_of_ours(&frr, "ipv4", OUR4, &b, "our IPv4 prefix", &peer);
    let nhs = frr_nexthops(&v);
    assert_eq!(
        (nhs[0].ip.as_str(), nhs[0].afi.as_str()),
        (BGPD_ADDR6, "ipv6"),
        "{}",
        ctx("our IPv4 prefix's next hop at FRR", &b, &format!("{v:#}"))
    );
    assert_eq!(
        v["paths"][0]["aspath"]["string"],
        "64512",
        "{}",
        ctx("our IPv4 AS path at FRR", &b, &format!("{v:#}"))
    );
    // FRR only uses a path whose next hop it can reach.
    assert_eq!(
        v["paths"][0]["valid"],
        true,
        "{}",
        ctx("our IPv4 path valid at FRR", &b, &format!("{v:#}"))
    );
    eprintln!(
        "FRR IPv6: our IPv4 prefix arrived with next hop {}",
        nhs[0].ip
    );

    // Our /122 at FRR with both next hops: the global fd99::1 and our link-local (RFC 2545).
    let v = frr_route_of_ours(&frr, "ipv6", OUR6, &b, "our block", &peer);
    let got: Vec<(String, String)> = frr_nexthops(&v)
        .into_iter()
        .map(|n| (n.ip, n.scope))
        .collect();
    assert_eq!(
        got,
        vec![
            (BGPD_ADDR6.to_owned(), "global".to_owned()),
            (our_ll.clone(), "link-local".to_owned())
        ],
        "{}",
        ctx("our block's next hops at FRR", &b, &format!("{v:#}"))
    );
    assert_eq!(
        v["paths"][0]["valid"],
        true,
        "{}",
        ctx("our block valid at FRR", &b, &format!("{v:#}"))
    );
    eprintln!("FRR IPv6: our block arrived with next hops {got:?}");

    // Withdrawals both ways, in both families.
    b.ctl(&["route", "del", OUR6]);
    b.ctl(&["route", "del", OUR4]);
    assert!(
        wait_until(WAIT, || !frr_has(&frr, "ipv6", OUR6)
            && !frr_has(&frr, "ipv4", OUR4)),
        "{}",
        ctx("our withdrawals did not reach FRR", &b, &peer())
    );
    frr_network(&frr, "ipv6", PEER6, false);
    frr_network(&frr, "ipv4", PEER_PREFIX, false);
    assert!(
        wait_until(WAIT, || b.route(PEER6).is_none()
            && b.route(PEER_PREFIX).is_none()),
        "{}",
        ctx("FRR's withdrawals did not reach bgpd", &b, &peer())
    );
    // The IPv4 withdrawal over the IPv6 session must not have taken the session with it.
    assert!(
        b.established(),
        "{}",
        ctx("session lost after the withdrawals", &b, &peer())
    );
    eprintln!("FRR IPv6: withdrawals propagated both ways");
}

#[test]
fn frr_ipv4_session_carries_ipv6() {
    let link = dual_stack_link("v6m");
    let frr = start_frr(&link.b, &frr_conf(BGPD_ADDR));
    let b = start_bgpd(
        &link.a,
        &format!("address6 = \"{BGPD_ADDR6}/64\"\n"),
        PEER_ADDR,
        "families = [\"ipv4\", \"ipv6\"]",
        &[OUR6, OUR4],
    );
    let peer = || {
        format!(
            "{}\n{}",
            frr.vtysh(&[&format!("show bgp neighbors {BGPD_ADDR}")]),
            frr.vtysh(&["show bgp ipv4 unicast", "show bgp ipv6 unicast"])
        )
    };

    assert!(
        wait_until(WAIT, || b.established()
            && frr.session_state("ipv6", BGPD_ADDR) == "Established"),
        "{}",
        ctx("the IPv4 session with IPv6 did not come up", &b, &peer())
    );
    assert_session_address(&b, PEER_ADDR, &peer);
    eprintln!("FRR MP-BGP: session up");

    // Their /122 at bgpd: FRR puts its interface's global IPv6 address in MP_REACH.
    let r = bgpd_route(&b, PEER6, &peer);
    assert_eq!(
        r["next_hop"],
        PEER_ADDR6,
        "{}",
        ctx("their IPv6 next hop", &b, &peer())
    );
    assert_eq!(
        as_path(&r),
        serde_json::json!([PEER_AS]),
        "{}",
        ctx("their AS path", &b, &peer())
    );
    eprintln!("FRR MP-BGP: their block arrived: {r}");

    // Our /122 at FRR: the node's IPv6 address as next hop (the session's own address is
    // IPv4 and cannot be one), and FRR can use it.
    let v = frr_route_of_ours(&frr, "ipv6", OUR6, &b, "our block", &peer);
    let nhs = frr_nexthops(&v);
    assert_eq!(
        (nhs[0].ip.as_str(), nhs[0].scope.as_str()),
        (BGPD_ADDR6, "global"),
        "{}",
        ctx("our block's next hop at FRR", &b, &format!("{v:#}"))
    );
    assert_eq!(
        v["paths"][0]["valid"],
        true,
        "{}",
        ctx("our block valid at FRR", &b, &format!("{v:#}"))
    );
    assert_eq!(
        v["paths"][0]["aspath"]["string"],
        "64512",
        "{}",
        ctx("our AS path at FRR", &b, &format!("{v:#}"))
    );
    eprintln!("FRR MP-BGP: our block arrived with next hops {nhs:?}");

    // IPv4 goes on as before on the same session.
    let r = bgpd_route(&b, PEER_PREFIX, &peer);
    assert_eq!(
        r["next_hop"],
        PEER_ADDR,
        "{}",
        ctx("their IPv4 next hop", &b, &peer())
    );
    assert!(
        wait_until(WAIT, || frr_nexthops(&frr_route(&frr, "ipv4", OUR4))
            .first()
            .is_some_and(|n| n.ip == BGPD_ADDR)),
        "{}",
        ctx(
            "our IPv4 prefix did not reach FRR via 10.99.0.1",
            &b,
            &peer()
        )
    );

    // Withdrawals both ways.
    b.ctl(&["route", "del", OUR6]);
    assert!(
        wait_until(WAIT, || !frr_has(&frr, "ipv6", OUR6)),
        "{}",
        ctx("our IPv6 withdrawal did not reach FRR", &b, &peer())
    );
    assert!(
        frr_has(&frr, "ipv4", OUR4),
        "{}",
        ctx("the IPv6 withdrawal took our IPv4 prefix too", &b, &peer())
    );
    frr_network(&frr, "ipv6", PEER6, false);
    assert!(
        wait_until(WAIT, || b.route(PEER6).is_none()),
        "{}",
        ctx("FRR's IPv6 withdrawal did not reach bgpd", &b, &peer())
    );
    eprintln!("FRR MP-BGP: withdrawals propagated both ways");
}

// ---- the lab itself ----

/// The peer configurations above against each other, with BIRD 2 or FRR standing in for bgpd
/// at fd99::1 / 10.99.0.1 in AS 64512: that the peers, the address setup and the parsers
/// do what the cases expect, independent of bgpd. Checks the peer side of each case.
#[test]
#[ignore = "checks the lab (BIRD 2 and FRR against each other), not bgpd"]
#[expect(
    clippy::too_many_lines,
    reason = "three lab cases in a row (BIRD 2's config, then FRR's two), each checked against the other implementation"
)]
fn peer_configs_against_each_other() {
    // Case 1: the BIRD 2 config, FRR (with zebra) standing in for bgpd.
    {
        let link = dual_stack_link("v6xb");
        let mut bird = Bird::start_config(
            BirdVersion::V2,
            &link.b,
            &bird2_ipv6_conf(PEER_ADDR6, BGPD_ADDR6, PEER_AS, LOCAL_AS),
        )
        .unwrap();
        let stand_in = Frr::start_with_kernel(
            link.a.name(),
            LOCAL_AS,
            &format!(
                "frr defaults traditional\nhostname standin\nrouter bgp {LOCAL_AS}\n\
                  bgp router-id {BGPD_ADDR}\n no bgp ebgp-requires-policy\n\
                  no bgp network import-check\n no bgp default ipv4-unicast\n\
                  neighbor {PEER_ADDR6} remote-as {PEER_AS}\n neighbor {PEER_ADDR6} timers connect 2\n\
                  address-family ipv6 unicast\n  network {OUR6}\n  neighbor {PEER_ADDR6} activate\n\
                  exit-address-family\n"
            ),
        )
        .unwrap();
        let our_ll = link_local(&link.a, DEV).unwrap();
        let their_ll = link_local(&link.b, DEV).unwrap();
        assert!(wait_until(WAIT, || bird.established()
            && stand_in.session_state("ipv6", PEER_ADDR6) == "Established"));
        let mut text = String::new();
        assert!(wait_until(WAIT, || {
            text = bird.birdc(&["show", "route", "all", OUR6, "protocol", "m"]);
            bird.route(OUR6).is_some()
        }));
        assert_eq!(
            bird_gateway(&text),
            Some((BGPD_ADDR6.into(), DEV.into())),
            "{text}"
        );
        assert_eq!(
            bird_next_hops(&text),
            vec![BGPD_ADDR6.to_owned(), our_ll],
            "{text}"
        );
        assert_eq!(bird.route(OUR6).unwrap().as_path, vec![LOCAL_AS]);
        assert!(wait_until(WAIT, || frr_has(&stand_in, "ipv6", PEER6)));
        let nhs = frr_nexthops(&frr_route(&stand_in, "ipv6", PEER6));
        assert_eq!(
            (nhs[0].ip.as_str(), nhs[1].ip.as_str()),
            (PEER_ADDR6, their_ll.as_str())
        );
        bird.withdraw();
        assert!(wait_until(WAIT, || !frr_has(&stand_in, "ipv6", PEER6)));
        bird.announce();
        assert!(wait_until(WAIT, || frr_has(&stand_in, "ipv6", PEER6)));
        eprintln!("lab: BIRD 2 IPv6 config OK");
    }
    // Cases 2 and 3: the FRR configs, BIRD 2 standing in for bgpd (extended next hop on the
    // IPv6 session; IPv6 over the IPv4 session with fd99::1 as next hop).
    for (neighbor, local, peer_addr, channels) in [
        (
            BGPD_ADDR6,
            BGPD_ADDR6,
            PEER_ADDR6,
            "ipv6 { import all; export where proto = \"st6\"; };\n\
             ipv4 { import all; export where proto = \"st4\"; extended next hop on; };\n",
        ),
        (
            BGPD_ADDR,
            BGPD_ADDR,
            PEER_ADDR,
            "ipv4 { import all; export where proto = \"st4\"; };\n\
             ipv6 { import all; export where proto = \"st6\"; next hop address fd99::1; };\n",
        ),
    ] {
        let link = dual_stack_link(if neighbor.contains(':') {
            "v6xf"
        } else {
            "v6xm"
        });
        let frr = start_frr(&link.b, &frr_conf(neighbor));
        let stand_in = Bird::start_config(
            BirdVersion::V2,
            &link.a,
            &format!(
                "router id {BGPD_ADDR};\nprotocol device {{ scan time 2; }}\n\
                 protocol static st4 {{ ipv4; route {OUR4} blackhole; }}\n\
                 protocol static st6 {{ ipv6; route {OUR6} blackhole; }}\n\
                 protocol bgp m {{\n local {local} as {LOCAL_AS};\n neighbor {peer_addr} as {PEER_AS};\n\
                 {channels} connect delay time 1;\n connect retry time 3;\n}}\n"
            ),
        )
        .unwrap();
        let our_ll = link_local(&link.a, DEV).unwrap();
        assert!(wait_until(WAIT, || frr.session_state("ipv6", neighbor)
            == "Established"
            && frr_has(&frr, "ipv6", OUR6)
            && frr_has(&frr, "ipv4", OUR4)));
        let v6 = frr_nexthops(&frr_route(&frr, "ipv6", OUR6));
        assert_eq!(
            (v6[0].ip.as_str(), v6[0].scope.as_str()),
            (BGPD_ADDR6, "global"),
            "{v6:?}"
        );
        assert_eq!(
            (v6[1].ip.as_str(), v6[1].scope.as_str()),
            (our_ll.as_str(), "link-local"),
            "{v6:?}"
        );
        let v4 = frr_nexthops(&frr_route(&frr, "ipv4", OUR4));
        if neighbor.contains(':') {
            assert_eq!(
                (v4[0].ip.as_str(), v4[0].afi.as_str()),
                (BGPD_ADDR6, "ipv6"),
                "{v4:?}"
            );
            let nbr = frr.json(&format!("show bgp neighbors {neighbor} json"));
            assert_eq!(
                nbr[neighbor]["neighborCapabilities"]["extendedNexthop"], "advertisedAndReceived",
                "{nbr:#}"
            );
        } else {
            assert_eq!(
                (v4[0].ip.as_str(), v4[0].afi.as_str()),
                (BGPD_ADDR, "ipv4"),
                "{v4:?}"
            );
        }
        // FRR's routes at the stand-in: IPv6 next hops (global + link-local) in both families
        // on the IPv6 session, fd99::2 for IPv6 on the IPv4 one.
        let mut text = String::new();
        assert!(wait_until(WAIT, || {
            text = stand_in.birdc(&["show", "route", "all", PEER6, "protocol", "m"]);
            stand_in.route(PEER6).is_some()
        }));
        assert_eq!(bird_next_hops(&text)[0], PEER_ADDR6, "{text}");
        let text4 = stand_in.birdc(&["show", "route", "all", PEER_PREFIX, "protocol", "m"]);
        let want4 = if neighbor.contains(':') {
            PEER_ADDR6
        } else {
            PEER_ADDR
        };
        assert_eq!(bird_next_hops(&text4)[0], want4, "{text4}");
        frr_network(&frr, "ipv6", PEER6, false);
        assert!(
            wait_until(WAIT, || stand_in.route(PEER6).is_none()),
            "FRR's withdrawal"
        );
        eprintln!("lab: FRR config with neighbor {neighbor} OK");
    }
}
