//! SIGHUP reloads bgpd's configuration file: peers added and removed live, a peer whose
//! options changed is reset and no other, announcements follow; a configuration that does
//! not load is refused whole, with the reason in the log, and the running one stays.
//! bgpd runs in a namespace of its own (its peers are passive and never answer).

use std::time::Duration;

use interop_tests::lab::bgp_peer::{Bgpd, wait_until};
use interop_tests::lab::netns::Netns;

fn config(peers: &[(&str, u16)], announce: &str) -> String {
    let mut s = "[bgp]\nas = 64512\nrouter_id = \"10.99.0.1\"\n".to_string();
    for (addr, hold) in peers {
        s.push_str(&format!(
            "[[bgp.peers]]\naddress = \"{addr}\"\nas = 64512\npassive = true\nhold_time = {hold}\n"
        ));
    }
    s.push_str(&format!("[[bgp.announce]]\nprefix = \"{announce}\"\n"));
    s
}

fn since_by_peer(b: &Bgpd) -> std::collections::BTreeMap<String, u64> {
    b.ctl_json(&["show", "protocols", "--json"])
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["address"].as_str().unwrap_or("").to_owned(),
                p["since_unix_ms"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn hup(b: &Bgpd, new_config: &str) {
    interop_tests::lab::bgpd::write_config(b.dir.path(), &b.socket, new_config);
    // SAFETY: kill(2) on the bgpd this test started.
    unsafe { libc::kill(b.process.pid(), libc::SIGHUP) };
}

#[test]
fn sighup_applies_peer_and_route_changes_and_refuses_a_bad_file() {
    let ns = Netns::new("reload").unwrap();
    let b = Bgpd::start_with(
        &ns,
        &config(&[("10.99.0.2", 9), ("10.99.0.3", 9)], "10.10.1.0/24"),
    );
    assert!(wait_until(Duration::from_secs(10), || since_by_peer(&b)
        .len()
        == 2));
    let before = since_by_peer(&b);
    std::thread::sleep(Duration::from_millis(1100));

    // .2 unchanged, .3 with another hold time, .4 new; another announcement.
    hup(
        &b,
        &config(
            &[("10.99.0.2", 9), ("10.99.0.3", 30), ("10.99.0.4", 9)],
            "10.10.2.0/24",
        ),
    );
    assert!(
        wait_until(Duration::from_secs(10), || since_by_peer(&b).len() == 3
            && b.route("10.10.2.0/24").is_some()),
        "the reload was not applied\n{}",
        b.log()
    );
    let after = since_by_peer(&b);
    assert_eq!(
        after["10.99.0.2"], before["10.99.0.2"],
        "an unchanged peer was reset"
    );
    assert!(
        after["10.99.0.3"] > before["10.99.0.3"],
        "the changed peer was not reset"
    );
    assert!(
        b.route("10.10.1.0/24").is_none(),
        "the old announcement stayed"
    );
    assert!(b.log().contains("SIGHUP: configuration reloaded"));

    // A file that does not load: refused whole, nothing changes.
    hup(&b, "[bgp]\nas = 0\n");
    assert!(
        wait_until(Duration::from_secs(10), || b
            .log()
            .contains("configuration reload refused")),
        "{}",
        b.log()
    );
    assert_eq!(
        since_by_peer(&b),
        after,
        "a refused reload changed the peers"
    );
    assert!(b.route("10.10.2.0/24").is_some());
    // A peer removed.
    hup(&b, &config(&[("10.99.0.2", 9)], "10.10.2.0/24"));
    assert!(
        wait_until(Duration::from_secs(10), || since_by_peer(&b).len() == 1),
        "{}",
        b.log()
    );
    assert_eq!(since_by_peer(&b)["10.99.0.2"], before["10.99.0.2"]);
}
