//! BFD (RFC 5880/5881) between bgpd and real implementations, each in its own pair of
//! namespaces: FRR's `bfdd` (a static BFD peer beside FRR's bgpd) and BIRD 2's `protocol bfd`
//! (with `bfd on` in its BGP protocol). The sessions come Up at 100 ms × 3; dropping UDP 3784
//! in the peer's namespace (nftables, both directions) takes BFD Down and with it bgpd's BGP
//! session and the peer's route, within a second rather than the 9 s hold time; removing the
//! drop brings BFD, the session and the route back. Needs root, FRR and BIRD 2.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use interop_tests::lab::bgp_peer::{
    BGPD_ADDR, BgpPeer, Bgpd, DaemonPid, LOCAL_AS, Link, PEER_ADDR, PEER_PREFIX, output, read_pid,
    wait_until,
};
use interop_tests::lab::bird::{Bird, BirdVersion};
use interop_tests::lab::frr::{Frr, one_neighbor_conf};
use interop_tests::lab::netns::Netns;

const PEER_AS: u32 = 65000;
const UP: Duration = Duration::from_secs(30);
/// BFD at 100 ms × 3 detects in 0.3 s; a second leaves room for polling and a loaded CI.
const FAST: Duration = Duration::from_secs(1);
const FRR_BFDD: &str = "/usr/lib/frr/bfdd";

fn bgpd(ns: &Netns) -> Bgpd {
    Bgpd::start_with(
        ns,
        &format!(
            "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{BGPD_ADDR}\"\n\
             [[bgp.peers]]\naddress = \"{PEER_ADDR}\"\nas = {PEER_AS}\nhold_time = 9\n\
             bfd = {{ min_rx_ms = 100, min_tx_ms = 100, multiplier = 3 }}\n\
             [[bgp.announce]]\nprefix = \"10.10.1.0/24\"\n\
             [metrics]\nlisten = \"127.0.0.1:9098\"\n"
        ),
    )
}

/// The BFD session's state as `bgpctl show bfd` gives it, with the intervals configured.
/// (`show protocols` carries the same state; the two are separate reads, so during a
/// transition they may differ, and only this one is asked.)
fn bfd_state(b: &Bgpd) -> String {
    let bfd = b.ctl_json(&["show", "bfd", "--json"]);
    assert_eq!(
        (&bfd[0]["min_rx_ms"], &bfd[0]["multiplier"]),
        (&serde_json::json!(100), &serde_json::json!(3)),
        "{bfd}"
    );
    bfd[0]["state"].as_str().unwrap_or("").to_owned()
}

/// Drop (or stop dropping) BFD's UDP 3784 in and out of `ns`.
fn drop_bfd(ns: &Netns, on: bool) {
    let script = if on {
        "nft add table inet bfdcut && \
         nft add chain inet bfdcut in '{ type filter hook input priority 0; }' && \
         nft add chain inet bfdcut out '{ type filter hook output priority 0; }' && \
         nft add rule inet bfdcut in udp dport 3784 drop && \
         nft add rule inet bfdcut out udp dport 3784 drop"
    } else {
        "nft delete table inet bfdcut"
    };
    ns.sh(script).unwrap_or_else(|e| panic!("nft: {e}"));
}

/// Up, cut, down fast with the route gone, back up with the route.
fn cut_and_restore(what: &str, ns_peer: &Netns, b: &Bgpd, peer_bfd_up: &dyn Fn() -> bool) {
    assert!(
        wait_until(UP, || b.established()
            && b.route(PEER_PREFIX).is_some()
            && bfd_state(b) == "up"
            && peer_bfd_up()),
        "{what}: BGP + BFD did not come up: {}\n{}",
        b.ctl_json(&["show", "protocols", "--json"]),
        b.log()
    );
    eprintln!("{what}: BFD and BGP up");
    let start = Instant::now();
    drop_bfd(ns_peer, true);
    assert!(
        wait_until(Duration::from_secs(5), || b.route(PEER_PREFIX).is_none()),
        "{what}: the route stayed after BFD was cut: {}\n{}",
        b.ctl_json(&["show", "protocols", "--json"]),
        b.log()
    );
    let gone = start.elapsed();
    assert!(gone <= FAST, "{what}: route gone only after {gone:?}");
    // The peer may have closed BGP itself first (BIRD's `bfd on`); our own BFD session
    // must still see the failure, and bgpd say so (in last_error and the log, where a
    // reconnect attempt cannot overwrite it).
    assert!(
        wait_until(FAST, || bfd_state(b) != "up"
            && b.log().contains("BFD session down")),
        "{what}: bgpd's BFD did not go down: {}",
        b.ctl_json(&["show", "protocols", "--json"])
    );
    eprintln!("{what}: cut, route gone after {gone:?}");
    drop_bfd(ns_peer, false);
    assert!(
        wait_until(UP, || bfd_state(b) == "up"
            && b.established()
            && b.route(PEER_PREFIX).is_some()),
        "{what}: did not come back: {}\n{}",
        b.ctl_json(&["show", "protocols", "--json"]),
        b.log()
    );
    eprintln!("{what}: back up");
}

/// FRR's bfdd on its own (no zebra: a static peer needs none), configured with one peer.
struct Bfdd {
    ns: String,
    dir: tempfile::TempDir,
    _daemon: DaemonPid,
}

impl Bfdd {
    fn start(ns: &Netns) -> Bfdd {
        assert!(Path::new(FRR_BFDD).exists(), "FRR's bfdd is not installed");
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("bfdd.conf");
        std::fs::write(
            &conf,
            format!(
                "hostname peer\nbfd\n peer {BGPD_ADDR} local-address {PEER_ADDR}\n  \
                 receive-interval 100\n  transmit-interval 100\n  detect-multiplier 3\n \
                 exit\nexit\n"
            ),
        )
        .unwrap();
        let _ = Command::new("chown")
            .args(["-R", "frr:frr"])
            .arg(dir.path())
            .status();
        let pidfile: PathBuf = dir.path().join("bfdd.pid");
        let o = Command::new("ip")
            .args(["netns", "exec", ns.name(), FRR_BFDD, "-d", "-f"])
            .arg(&conf)
            .arg("-i")
            .arg(&pidfile)
            .arg("--vty_socket")
            .arg(dir.path())
            .arg("--bfdctl")
            .arg(dir.path().join("bfdd.sock"))
            .arg("-z")
            .arg(dir.path().join("zserv.api"))
            .args(["-A", "127.0.0.1", "-P", "0", "--log"])
            .arg(format!("file:{}", dir.path().join("bfdd.log").display()))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "bfdd did not start: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let pid = read_pid(&pidfile).expect("bfdd wrote no pid file");
        Bfdd {
            ns: ns.name().to_owned(),
            dir,
            _daemon: DaemonPid { pid },
        }
    }

    fn up(&self) -> bool {
        let out = output(
            Command::new("ip")
                .args(["netns", "exec", &self.ns, "vtysh", "--vty_socket"])
                .arg(self.dir.path())
                .args(["-d", "bfdd", "-c", "show bfd peers json"]),
        );
        serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .is_some_and(|a| {
                a.iter()
                    .any(|p| p["peer"] == BGPD_ADDR && p["status"] == "up")
            })
    }
}

/// The BFD counters of bgpd's metrics (bgpd in `ns`).
fn bfd_counter(ns: &Netns, outcome: &str) -> u64 {
    let text = ns
        .exec("curl", &["-s", "http://127.0.0.1:9098/metrics"])
        .unwrap_or_default();
    let key = format!("margay_bgpd_bfd_packets_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// From the peer's address: malformed packets (version 0), well-formed ones for a
/// discriminator bgpd never gave out, and packets with TTL 64 (not single-hop). All dropped
/// and counted; the real session stays Up.
fn flood(ns_peer: &Netns, ns_bgpd: &Netns, b: &Bgpd) {
    let mut good = [0u8; 24];
    good[0] = 1 << 5;
    good[1] = 3 << 6; // Up
    good[2] = 3;
    good[3] = 24;
    good[4..8].copy_from_slice(&7u32.to_be_bytes());
    good[8..12].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    good[12..16].copy_from_slice(&100_000u32.to_be_bytes());
    good[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    let mut bad = good;
    bad[0] = 0;
    let to = format!("{BGPD_ADDR}:3784");
    ns_peer
        .run_in(|| {
            let s = std::net::UdpSocket::bind(format!("{PEER_ADDR}:0")).unwrap();
            s.set_ttl(255).unwrap();
            // Paced, so that the kernel's socket buffer does not drop them before bgpd
            // can count them.
            let pace = || std::thread::sleep(Duration::from_micros(300));
            for _ in 0..300 {
                s.send_to(&bad, &to).unwrap();
                s.send_to(&good, &to).unwrap();
                pace();
            }
            s.set_ttl(64).unwrap();
            for _ in 0..100 {
                s.send_to(&good, &to).unwrap();
                pace();
            }
        })
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            bfd_counter(ns_bgpd, "malformed") >= 300
                && bfd_counter(ns_bgpd, "no_session") >= 300
                && bfd_counter(ns_bgpd, "ttl_refused") >= 100
        }),
        "flood not counted: malformed {} no_session {} ttl_refused {}",
        bfd_counter(ns_bgpd, "malformed"),
        bfd_counter(ns_bgpd, "no_session"),
        bfd_counter(ns_bgpd, "ttl_refused")
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(bfd_state(b), "up", "the flood took the session down");
    assert!(b.established());
    eprintln!("flood dropped and counted; session still up");
}

/// `bgpctl peer add --bfd` with an interval below 10 ms (for a node peer and a BGPPeer
/// resource): refused naming the field, nothing added, the running session untouched.
fn refused_intervals(b: &Bgpd) {
    let since = b.since();
    for extra in [&[][..], &["--resource", "tor"][..]] {
        let mut args = vec![
            "peer",
            "add",
            "10.99.0.9",
            "--as",
            "65001",
            "--bfd",
            "5,100,3",
        ];
        args.extend_from_slice(extra);
        let out = interop_tests::lab::bgpd::bgpctl(&b.socket, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains("peer.bfd.min_rx_ms"), "{args:?}: {err}");
    }
    let peers = b.ctl_json(&["show", "protocols", "--json"]);
    assert_eq!(peers.as_array().map(Vec::len), Some(1), "{peers}");
    assert_eq!(bfd_state(b), "up");
    assert_eq!(b.since(), since, "the running session was reset");
    eprintln!("BFD interval below 10 ms refused, nothing added");
}

#[test]
fn bfd_with_frr_bfdd() {
    let link = Link::new("bfdf");
    let frr = Frr::start_with_config(
        &link.b,
        PEER_AS,
        &one_neighbor_conf(PEER_AS, &[], &[], &[PEER_PREFIX]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let bfdd = Bfdd::start(&link.b);
    let b = bgpd(&link.a);
    cut_and_restore("FRR bfdd", &link.b, &b, &|| bfdd.up());
    flood(&link.b, &link.a, &b);
    refused_intervals(&b);
    assert!(frr.established(), "FRR's BGP session is back too");
}

#[test]
fn bfd_with_bird2() {
    let link = Link::new("bfdb");
    let conf = format!(
        "router id {PEER_ADDR};\n\
         protocol device {{ scan time 2; }}\n\
         protocol direct {{ ipv4; interface \"*\"; }}\n\
         protocol static st {{ ipv4; route {PEER_PREFIX} blackhole; }}\n\
         protocol bfd {{ interface \"eth0\" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }}; }}\n\
         protocol bgp m {{\n  local as {PEER_AS};\n  neighbor {BGPD_ADDR} as {LOCAL_AS};\n\
           ipv4 {{ import all; export where proto = \"st\"; next hop self; }};\n\
           connect delay time 1;\n  connect retry time 3;\n  error wait time 1,10;\n  bfd on;\n}}\n"
    );
    let bird =
        Bird::start_config(BirdVersion::V2, &link.b, &conf).unwrap_or_else(|e| panic!("{e}"));
    let b = bgpd(&link.a);
    let bird_up = || {
        bird.birdc(&["show", "bfd", "sessions"])
            .lines()
            .any(|l| l.contains(BGPD_ADDR) && l.contains("Up"))
    };
    cut_and_restore("BIRD 2", &link.b, &b, &bird_up);
    assert!(
        wait_until(UP, || bird.established()),
        "BIRD's BGP session is back too"
    );
}
