//! bgpd against bgpd, driven live through bgpctl: a peer added over the API comes up without
//! touching the configured one, routes announced over the API flow, a deleted peer's session
//! ends and its routes leave the other side. Two namespaces; needs root.

use std::time::Duration;

use interop_tests::lab::bgp_peer::{BGPD_ADDR, Bgpd, LOCAL_AS, Link, PEER_ADDR, wait_until};

const WAIT: Duration = Duration::from_secs(30);

fn peer_state(b: &Bgpd, addr: &str) -> Option<String> {
    b.ctl_json(&["show", "protocols", "--json"])
        .as_array()?
        .iter()
        .find(|p| p["address"] == addr)
        .and_then(|p| p["state"].as_str().map(str::to_owned))
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: two daemons, peers added and deleted live, routes announced, listed and withdrawn; each step builds on the last"
)]
fn peers_and_routes_added_and_deleted_live() {
    let link = Link::new("api");
    // a: b as a configured peer; b: no peers at all, only the API.
    let a = Bgpd::start_with(
        &link.a,
        &format!(
            "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{BGPD_ADDR}\"\n\
             [[bgp.peers]]\naddress = \"{PEER_ADDR}\"\nas = {LOCAL_AS}\nhold_time = 9\n\
             [[bgp.announce]]\nprefix = \"10.10.1.0/24\"\ncommunities = [\"65000:7\"]\n"
        ),
    );
    let b = Bgpd::start_with(
        &link.b,
        &format!("[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{PEER_ADDR}\"\n"),
    );
    assert!(peer_state(&a, PEER_ADDR).is_some());
    assert!(
        b.ctl_json(&["show", "protocols", "--json"])
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Add a on b, passively: a connects to b.
    b.ctl(&[
        "peer",
        "add",
        BGPD_ADDR,
        "--as",
        &LOCAL_AS.to_string(),
        "--passive",
    ]);
    assert!(
        wait_until(WAIT, || peer_state(&a, PEER_ADDR).as_deref()
            == Some("Established")
            && peer_state(&b, BGPD_ADDR).as_deref() == Some("Established")),
        "no session: a={:?} b={:?}\n{}\n{}",
        peer_state(&a, PEER_ADDR),
        peer_state(&b, BGPD_ADDR),
        a.log(),
        b.log()
    );
    let table = String::from_utf8(
        interop_tests::lab::bgpd::bgpctl(&b.socket, &["show", "protocols"]).stdout,
    )
    .unwrap();
    assert!(
        table.contains("peer_10_99_0_1") && table.contains("Established"),
        "{table}"
    );

    // a's configured announcement, with its community, reaches b.
    assert!(
        wait_until(WAIT, || b.route("10.10.1.0/24").is_some()),
        "{}",
        b.log()
    );
    let r = b.route("10.10.1.0/24").unwrap();
    assert_eq!(r["next_hop"], BGPD_ADDR);
    assert_eq!(r["communities"], serde_json::json!(["65000:7"]));
    assert_eq!(r["local_pref"], 100);

    // A route announced over b's API reaches a; a filtered listing finds it.
    b.ctl(&["route", "add", "10.30.0.0/26", "--next-hop", "10.99.0.9"]);
    assert!(wait_until(WAIT, || a.route("10.30.0.0/26").is_some()));
    assert_eq!(a.route("10.30.0.0/26").unwrap()["next_hop"], "10.99.0.9");
    let filtered = a.ctl_json(&["show", "route", "10.30.0.0/16", "--json"]);
    assert_eq!(filtered.as_array().unwrap().len(), 1, "{filtered}");
    // The same as a count, and the whole table's count matches its listing.
    let counted = a.ctl_json(&["show", "route", "10.30.0.0/16", "--count", "--json"]);
    assert_eq!(counted["routes"], 1, "{counted}");
    let all = a.ctl_json(&["show", "route", "--json"]);
    let all_counted = a.ctl_json(&["show", "route", "--count", "--json"]);
    assert_eq!(
        all_counted["routes"].as_u64(),
        Some(all.as_array().unwrap().len() as u64)
    );
    let adj_in = a.ctl_json(&["show", "route", "--table", "adj-in", PEER_ADDR, "--json"]);
    assert_eq!(adj_in.as_array().unwrap().len(), 1, "{adj_in}");

    // Withdrawing an unknown route is an error an operator can read.
    let out = interop_tests::lab::bgpd::bgpctl(&b.socket, &["route", "del", "10.31.0.0/26"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not announced"));

    // Deleting the peer on b ends the session; a loses b's route and goes back to trying.
    b.ctl(&["peer", "del", BGPD_ADDR]);
    assert!(wait_until(WAIT, || a.route("10.30.0.0/26").is_none()));
    assert!(peer_state(&a, PEER_ADDR).as_deref() != Some("Established"));
    assert!(
        b.ctl_json(&["show", "protocols", "--json"])
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(b.route("10.10.1.0/24").is_none());

    // Session options over the API: shown as given; a's session to b fails (b speaks AS
    // 65010, which a does not expect), so b's peer is not Established.
    b.ctl(&[
        "peer",
        "add",
        BGPD_ADDR,
        "--as",
        &LOCAL_AS.to_string(),
        "--local-as",
        "65010",
        "--next-hop",
        "self",
        "--allow-local-as",
        "2",
        "--max-restart-time",
        "90",
    ]);
    let shown = b.ctl_json(&["show", "protocols", "--json"]);
    let p = &shown[0];
    assert_eq!(
        (
            &p["local_as"],
            &p["next_hop"],
            &p["allow_local_as"],
            &p["restart_time_s"]
        ),
        (
            &serde_json::json!(65010),
            &serde_json::json!("self"),
            &serde_json::json!(2),
            &serde_json::json!(90)
        ),
        "{shown}"
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_ne!(peer_state(&b, BGPD_ADDR).as_deref(), Some("Established"));
    b.ctl(&["peer", "del", BGPD_ADDR]);
    // Filters belong to BGPPeer resources.
    let out = interop_tests::lab::bgpd::bgpctl(
        &b.socket,
        &["peer", "add", BGPD_ADDR, "--as", "1", "--filters", "f"],
    );
    assert!(!out.status.success());

    // Bad input is refused with a reason.
    let out =
        interop_tests::lab::bgpd::bgpctl(&b.socket, &["peer", "add", "10.0.0.300", "--as", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an IP address"));
}
