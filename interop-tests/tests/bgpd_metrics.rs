//! bgpd's HTTP endpoints on a real process: `/metrics` counts what the API did (pools,
//! addresses, calls by method and code), `/ready` refuses while a configured BGP session is
//! down and accepts once the configuration allows it down, `/live` and `/status` answer.
//! Everything on 127.0.0.1; no root needed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use interop_tests::lab::bgpd::{Daemon, bgpctl};
use interop_tests::lab::free_port;

/// bgpd with metrics on a free port and one configured peer on 127.0.0.9 that nobody
/// answers (bgpd does not listen for BGP itself: listen_port 0).
fn start(allow_down: &str) -> (Daemon, SocketAddr) {
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let d = Daemon::start(&format!(
        "[bgp]\nlisten_port = 0\n\
         [[bgp.peers]]\naddress = \"127.0.0.9\"\nas = 65000\nport = {}\nhold_time = 9\n\
         [metrics]\nlisten = \"{metrics}\"\nready_allow_down = [{allow_down}]\n",
        free_port()
    ));
    (d, metrics)
}

/// (status code, body) of `GET path`; retried while the listener is not accepting yet.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a head and a body");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (code, body.to_owned())
}

/// The value of the sample line `series` (name with labels, exactly), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn ctl(d: &Daemon, args: &[&str]) -> std::process::Output {
    bgpctl(&d.socket, args)
}

#[test]
fn metrics_count_pools_addresses_and_api_calls() {
    let (d, addr) = start("");
    let ok = |args: &[&str]| {
        let out = ctl(&d, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    };
    ok(&["pool", "add", "blue", "10.50.0.0/16"]);
    // The same pool again: refused, and counted with its code.
    assert!(
        !ctl(&d, &["pool", "add", "blue", "10.50.0.0/16"])
            .status
            .success()
    );
    ok(&["ipam", "assign", "--handle", "net.a", "--pool", "blue"]);
    ok(&["ipam", "assign", "--handle", "net.b", "--pool", "blue"]);
    ok(&[
        "ipam",
        "assign",
        "--handle",
        "ops.gw",
        "--ip",
        "10.50.200.1",
    ]);

    // The IPAM figures are cached briefly: wait for them to show the three addresses.
    let deadline = Instant::now() + Duration::from_secs(10);
    let pool = "{pool=\"blue\",cidr=\"10.50.0.0/16\"}";
    let text = loop {
        let (code, text) = get(addr, "/metrics");
        assert_eq!(code, 200, "{text}");
        if sample(&text, &format!("margay_bgpd_ipam_addresses_used{pool}")) == Some(3.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "never 3 addresses used:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let value =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("{series} missing:\n{text}"));
    assert_eq!(
        value(&format!("margay_bgpd_ipam_addresses_free{pool}")),
        65533.0
    );
    // Two blocks: the node's affine block for the automatic addresses, and the one that
    // holds 10.50.200.1.
    assert_eq!(value(&format!("margay_bgpd_ipam_blocks{pool}")), 2.0);
    assert_eq!(value("margay_bgpd_ipam_read_ok"), 1.0);
    assert_eq!(value("margay_bgpd_datastore_connected"), 1.0);
    assert!(value("margay_bgpd_uptime_seconds") > 0.0);

    let calls = |method: &str, code: &str| {
        sample(
            &text,
            &format!(
                "margay_bgpd_api_requests_total{{method=\"margay.v1.{method}\",code=\"{code}\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(calls("Pools/CreatePool", "OK"), 1.0, "{text}");
    assert_eq!(calls("Pools/CreatePool", "AlreadyExists"), 1.0, "{text}");
    assert_eq!(calls("Ipam/AutoAssign", "OK"), 2.0, "{text}");
    assert_eq!(calls("Ipam/AssignIp", "OK"), 1.0, "{text}");
    assert_eq!(
        value(
            "margay_bgpd_api_request_duration_seconds_count{method=\"margay.v1.Ipam/AutoAssign\"}"
        ),
        2.0
    );
    assert_eq!(
        value(
            "margay_bgpd_api_request_duration_seconds_bucket{method=\"margay.v1.Ipam/AutoAssign\",le=\"+Inf\"}"
        ),
        2.0
    );

    // The configured peer: one session, not Established.
    assert_eq!(value("margay_bgpd_bgp_speaker_up"), 1.0);
    assert_eq!(
        value("margay_bgpd_bgp_sessions{state=\"Established\"}"),
        0.0
    );
    let states: f64 = text
        .lines()
        .filter(|l| l.starts_with("margay_bgpd_bgp_sessions{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(states, 1.0, "{text}");
    assert_eq!(
        value("margay_bgpd_bgp_session_state{peer=\"peer_127_0_0_9\",state=\"Established\"}"),
        0.0
    );
    assert_eq!(
        value("margay_bgpd_bgp_prefixes_received{peer=\"peer_127_0_0_9\"}"),
        0.0
    );
    assert_eq!(value("margay_bgpd_ready"), 0.0);

    let (code, body) = get(addr, "/nothing");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("/metrics"), "{body}");
}

#[test]
fn ready_waits_for_sessions_unless_allowed_down() {
    let (d, addr) = start("");
    let (code, body) = get(addr, "/ready");
    assert_eq!(code, 503, "{body}");
    assert_eq!(body.lines().count(), 1, "{body}");
    assert!(
        body.starts_with("BGP session peer_127_0_0_9 (127.0.0.9 AS 65000) is "),
        "{body}"
    );
    let (code, body) = get(addr, "/live");
    assert_eq!((code, body.as_str()), (200, "live\n"));
    let (code, body) = get(addr, "/status");
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["node"], "test-node");
    assert_eq!(status["ready"], false);
    assert_eq!(status["datastore"]["state"], "connected");
    assert_eq!(status["peers"][0]["name"], "peer_127_0_0_9");
    assert_ne!(status["peers"][0]["state"], "Established");
    drop(d);

    // The same peer, allowed down (by a glob): ready.
    let (_d, addr) = start("\"peer_127_*\"");
    let (code, body) = get(addr, "/ready");
    assert_eq!((code, body.as_str()), (200, "ready\n"));
    let (code, body) = get(addr, "/live");
    assert_eq!((code, body.as_str()), (200, "live\n"));
    let (_, text) = get(addr, "/metrics");
    assert_eq!(sample(&text, "margay_bgpd_ready"), Some(1.0), "{text}");
}

#[test]
fn a_taken_metrics_port_stops_start_up_with_the_key_to_change() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bgpd.sock");
    let out = interop_tests::lab::bgpd::spawn(
        dir.path(),
        &socket,
        &format!("[metrics]\nlisten = \"{addr}\"\n"),
    )
    .wait_with_output()
    .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&addr.to_string()) && err.contains("metrics.listen"),
        "{err}"
    );
}
