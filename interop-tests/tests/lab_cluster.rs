//! The local cluster of the README's first command, end to end, on a lab of this run's own
//! name, dual stack: every pod reaches every pod over both families (same node, same subnet
//! directly, the other subnet over VXLAN, and a capture on the node link shows it for IPv6),
//! natOutgoing hides pod addresses from the outside but not from other pods (both families), a
//! deleted pod leaves nothing, restarts of bgpd and routewriter lose no ping, a removed node
//! leaves every kernel table; `up` twice is safe and `down` leaves nothing. The same cluster
//! also runs on etcd (`up --etcd`).

use std::io::Read;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use interop_tests::lab;

use lab::local::LocalLab as Lab;

/// What these tests ask of the lab beyond the shared driver.
trait LabExt {
    fn capture(&self, node: &str, filter: &str, count: u32, act: impl FnOnce()) -> String;
    fn vxlan_tx(&self, node: &str) -> u64;
    fn ping_train(&self, from: &str, to: &str, count: u32) -> (u32, u32);
}

impl LabExt for Lab {
    /// What tcpdump sees on a node's uplink (`-n`, `-c count`) matching `filter` while `act`
    /// runs.
    fn capture(&self, node: &str, filter: &str, count: u32, act: impl FnOnce()) -> String {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(node)])
            .args(["timeout", "10", "tcpdump", "-n", "-l", "-i", "eth0"])
            .args(["-c", &count.to_string(), filter])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tcpdump (apt-get install tcpdump)");
        // tcpdump needs a moment to open the interface.
        std::thread::sleep(Duration::from_millis(700));
        act();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// TX packets of node's vxlan.calico.
    fn vxlan_tx(&self, node: &str) -> u64 {
        let (ok, out) = self.exec(node, &["ip", "-s", "-j", "link", "show", "vxlan.calico"]);
        assert!(ok, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["stats64"]["tx"]["packets"].as_u64().unwrap()
    }

    /// `count` pings at 100 ms from one pod to an address; (sent, received).
    fn ping_train(&self, from: &str, to: &str, count: u32) -> (u32, u32) {
        let (_, out) = self.exec(
            from,
            &["ping", "-i", "0.1", "-c", &count.to_string(), "-q", to],
        );
        let line = out
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or_else(|| panic!("{out}"));
        let nums: Vec<u32> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|t| t.parse().ok())
            .collect();
        (nums[0], nums[1])
    }
}

/// A TCP listener inside a namespace: the address of the first peer that connects.
fn peer_seen_in(netns: &str, bind: &str) -> std::thread::JoinHandle<String> {
    let path = format!("/var/run/netns/{netns}");
    let bind = bind.to_owned();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: moves only this thread into the namespace.
        assert_eq!(
            unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) },
            0,
            "setns {path}"
        );
        let l = TcpListener::bind(&bind).unwrap();
        ready_tx.send(()).unwrap();
        let (mut s, peer) = l.accept().unwrap();
        let mut buf = [0u8; 16];
        let _ = s.read(&mut buf);
        peer.ip().to_string()
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    h
}

fn connect_from(lab: &Lab, pod: &str, ip: &str, port: u16) {
    let (ok, out) = lab.exec(
        pod,
        &[
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/{ip}/{port}; echo hi >&3"),
        ],
    );
    assert!(ok, "connect from {pod} to {ip}:{port}: {out}");
}

/// `margay-lab`'s output says both ping matrices, IPv4 and IPv6, passed.
fn assert_both_matrices_pass(text: &str) {
    for family in ["ping", "ping -6"] {
        assert!(
            text.contains(&format!("every pod answers every pod ({family})")),
            "{text}"
        );
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario told in order over the local cluster: the IPv4 and IPv6 matrices, encapsulation on the wire, natOutgoing"
)]
fn the_local_cluster_end_to_end() {
    let lab = Lab::new(&format!("mlt{}", std::process::id()));
    let text = lab.ok(&["up"]);
    println!("{text}");
    assert_both_matrices_pass(&text);
    assert_eq!(text.matches(" FAIL").count(), 0, "{text}");
    assert!(text.contains("dev vxlan.calico proto 80 onlink"), "{text}");
    assert!(text.contains("via 10.99.1.12 dev eth0 proto 80"), "{text}");
    assert!(text.contains("blackhole"), "{text}");
    // The IPv6 table: the same shapes.
    assert!(text.contains("dev vxlan-v6.calico proto 80"), "{text}");
    assert!(
        text.contains("via fd00:99:1::12 dev eth0 proto 80"),
        "{text}"
    );
    assert!(text.contains("blackhole fd00:20:"), "{text}");

    // On node-1's link, IPv6 to node-2's pod is plain ICMPv6 between the pods' addresses;
    // to node-4's pod it is VXLAN in UDP over IPv6 between the nodes.
    let n2_6 = lab.pod_address6("node-2-a");
    let n4_6 = lab.pod_address6("node-4-a");
    let plain = lab.capture("node-1", &format!("icmp6 and host {n2_6}"), 2, || {
        lab.ping_train("node-1-a", &n2_6, 3);
    });
    println!("same subnet, IPv6:\n{plain}");
    assert!(
        plain.contains(&format!("> {n2_6}: ICMP6, echo request")),
        "{plain}"
    );
    let tunnelled = lab.capture("node-1", "ip6 and udp port 4789", 2, || {
        lab.ping_train("node-1-a", &n4_6, 3);
    });
    println!("across the router, IPv6:\n{tunnelled}");
    assert!(
        tunnelled.contains("fd00:99:1::11.") && tunnelled.contains("fd00:99:2::14.4789: VXLAN"),
        "{tunnelled}"
    );
    assert!(
        tunnelled.contains(&format!("> {n4_6}: ICMP6, echo request")),
        "{tunnelled}"
    );

    // Same subnet is plain IP: node-1's VXLAN device sends nothing for node-2's pods; the
    // other subnet goes over VXLAN.
    let n2 = lab.pod_address("node-2-a");
    let n4 = lab.pod_address("node-4-a");
    let before = lab.vxlan_tx("node-1");
    assert_eq!(lab.ping_train("node-1-a", &n2, 5), (5, 5));
    assert_eq!(
        lab.vxlan_tx("node-1"),
        before,
        "same-subnet traffic went through VXLAN"
    );
    assert_eq!(lab.ping_train("node-1-a", &n4, 5), (5, 5));
    assert!(
        lab.vxlan_tx("node-1") >= before + 5,
        "cross-subnet traffic did not use VXLAN"
    );

    // natOutgoing: the outside sees node-1's address; another pod sees the pod's.
    let outside = peer_seen_in(&lab.ns("internet"), "203.0.113.10:8080");
    connect_from(&lab, "node-1-a", "203.0.113.10", 8080);
    assert_eq!(outside.join().unwrap(), "10.99.1.11");
    let inside = peer_seen_in(&lab.ns("node-2-a"), &format!("{n2}:8081"));
    connect_from(&lab, "node-1-a", &n2, 8081);
    assert_eq!(inside.join().unwrap(), lab.pod_address("node-1-a"));
    // And for IPv6.
    let outside = peer_seen_in(&lab.ns("internet"), "[2001:db8:113::10]:8080");
    connect_from(&lab, "node-1-a", "2001:db8:113::10", 8080);
    assert_eq!(outside.join().unwrap(), "fd00:99:1::11");
    let inside = peer_seen_in(&lab.ns("node-2-a"), &format!("[{n2_6}]:8081"));
    connect_from(&lab, "node-1-a", &n2_6, 8081);
    assert_eq!(inside.join().unwrap(), lab.pod_address6("node-1-a"));

    // A pod deleted: its route, veth and address go.
    let gone = lab.pod_address("node-1-b");
    lab.ok(&["pod-del", "node-1", "b"]);
    let (_, routes) = lab.exec("node-1", &["ip", "route"]);
    assert!(!routes.contains(&format!("{gone} dev cali")), "{routes}");
    let (_, links) = lab.exec("node-1", &["ip", "-o", "link"]);
    let calis = links
        .lines()
        .filter(|l| l.split(": ").nth(1).is_some_and(|n| n.starts_with("cali")))
        .count();
    assert_eq!(calis, 1, "one pod left on node-1: {links}");
    let sock = format!("/run/margay-lab-{}/node-1/bgpd.sock", lab.name);
    let show = Command::new(lab::binary("bgpctl"))
        .args(["--socket", &sock, "ipam", "show", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    // 7 pods and 4 tunnel addresses, in each family's pool.
    let used = |cidr: &str| {
        v["pools"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["cidr"] == cidr)
            .map(|p| p["used"].clone())
    };
    assert_eq!(used("172.20.0.0/16"), Some(11.into()), "{v}");
    assert_eq!(used("fd00:20::/48"), Some(11.into()), "{v}");
    lab.ok(&["pod-add", "node-1", "c"]);

    // Restarts lose no ping: routewriter (leaving the kernel as it is, rewriting nothing),
    // then bgpd.
    let (_, routes_before) = lab.exec("node-2", &["ip", "route", "show", "proto", "80"]);
    for (node, daemon) in [("node-2", "routewriter"), ("node-1", "bgpd")] {
        let lab2 = lab.borrow();
        let to = n2.clone();
        let train = std::thread::spawn(move || lab2.ping_train("node-1-a", &to, 40));
        std::thread::sleep(Duration::from_millis(800));
        lab.ok(&["restart", node, daemon]);
        let (sent, received) = train.join().unwrap();
        assert_eq!(sent, received, "{daemon} restart on {node} lost pings");
    }
    let (_, routes_after) = lab.exec("node-2", &["ip", "route", "show", "proto", "80"]);
    assert_eq!(routes_before, routes_after);

    // A node removed: its block leaves node-1's table.
    let (_, routes) = lab.exec("node-1", &["ip", "route"]);
    let n3_block_route = routes
        .lines()
        .find(|l| l.contains("via 10.99.1.13"))
        .unwrap_or_else(|| panic!("{routes}"))
        .to_owned();
    lab.ok(&["node-del", "node-3"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, routes) = lab.exec("node-1", &["ip", "route"]);
        if !routes.contains(&n3_block_route) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node-3's block is still routed on node-1:\n{routes}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The SQLite file lives on a small file system of its own (the soak fills it).
    let store = format!("/run/margay-lab-{}/store", lab.name);
    let mounted = || {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(store.as_str()))
    };
    assert!(mounted(), "no file system of its own at {store}");
    assert!(std::path::Path::new(&format!("{store}/store.db")).exists());

    // Twice up is safe; check passes; down leaves nothing.
    let again = lab.ok(&["up"]);
    assert!(again.contains("already up"), "{again}");
    lab.ok(&["check"]);
    lab.ok(&["down"]);
    assert!(!mounted(), "{store} is still mounted after down");
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(
        !left.contains(&format!("{}-", lab.name)),
        "namespaces left: {left}"
    );
    assert!(!std::path::Path::new(&format!("/run/margay-lab-{}", lab.name)).exists());
}

/// `up --etcd`: the same cluster with its state in a real etcd cluster of three members inside
/// the lab (a namespace each); every bgpd uses it, `status` says so, `up` twice is safe, and
/// `down` stops every member by PID and removes their data.
/// The ToR of the no-encapsulation test: FRR with zebra in the lab's router namespace,
/// taking every node of both segments as a dynamic eBGP neighbour, over IPv4 for IPv4 and
/// over IPv6 for IPv6.
fn tor_conf() -> String {
    "frr defaults traditional\nhostname tor\nrouter bgp 65000\n bgp router-id 10.99.1.1\n\
     no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n\
     neighbor NODES peer-group\n neighbor NODES remote-as external\n\
     neighbor NODES6 peer-group\n neighbor NODES6 remote-as external\n\
     bgp listen range 10.99.1.0/24 peer-group NODES\n bgp listen range 10.99.2.0/24 peer-group NODES\n\
     bgp listen range fd00:99:1::/64 peer-group NODES6\n bgp listen range fd00:99:2::/64 peer-group NODES6\n\
     address-family ipv4 unicast\n  neighbor NODES activate\n exit-address-family\n\
     address-family ipv6 unicast\n  neighbor NODES6 activate\n exit-address-family\n"
        .to_string()
}

#[test]
fn a_no_encapsulation_pool_with_a_tor_reaches_pods_directly() {
    let lab = Lab::new(&format!("mlt{}", std::process::id()));
    lab.ok(&["up"]);
    let ctl = |node: &str, args: &[&str]| {
        let sock = format!("/run/margay-lab-{}/{node}/bgpd.sock", lab.name);
        let out = Command::new(lab::binary("bgpctl"))
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "bgpctl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // A link-local BGPPeer cannot name its interface: refused, naming the field, and
    // nothing stored (no session anywhere).
    let sock = format!("/run/margay-lab-{}/node-1/bgpd.sock", lab.name);
    let bad = Command::new(lab::binary("bgpctl"))
        .args(["--socket", &sock, "peer", "add", "fe80::1", "--as", "65000"])
        .args(["--resource", "tor-link-local"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "a link-local BGPPeer was accepted");
    assert!(
        err.contains("peer_address") && err.contains("link-local"),
        "{err}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let protocols = ctl("node-2", &["show", "protocols"]);
    assert!(!protocols.contains("fe80"), "{protocols}");
    // The pools without encapsulation; each node peers with its gateway, the ToR, over
    // each family.
    for pool in ["default-ipv4-ippool", "default-ipv6-ippool"] {
        ctl("node-1", &["pool", "set", pool, "--vxlan-mode", "Never"]);
    }
    for (node, gw, family) in [
        ("node-1", "10.99.1.1", 4),
        ("node-2", "10.99.1.1", 4),
        ("node-3", "10.99.1.1", 4),
        ("node-4", "10.99.2.1", 4),
        ("node-1", "fd00:99:1::1", 6),
        ("node-2", "fd00:99:1::1", 6),
        ("node-3", "fd00:99:1::1", 6),
        ("node-4", "fd00:99:2::1", 6),
    ] {
        let name = format!("tor{family}-{node}");
        ctl(
            "node-1",
            &[
                "peer",
                "add",
                gw,
                "--as",
                "65000",
                "--resource",
                &name,
                "--node",
                node,
            ],
        );
    }
    let router = lab.ns("router");
    let tor = interop_tests::lab::frr::Frr::start_with_kernel(&router, 65000, &tor_conf())
        .unwrap_or_else(|e| panic!("{e}"));
    // The ToR learns every node's block and installs it.
    let blocks = ctl("node-1", &["ipam", "show", "--show-blocks", "--json"]);
    let blocks: serde_json::Value = serde_json::from_str(&blocks).unwrap();
    let cidrs: Vec<String> = blocks["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["cidr"].as_str().map(str::to_owned))
        .collect();
    // Four blocks of each family, one per node.
    assert_eq!(cidrs.len(), 8, "{blocks}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, routes) = lab.exec("router", &["ip", "route", "show", "proto", "bgp"]);
        let (_, routes6) = lab.exec("router", &["ip", "-6", "route", "show", "proto", "bgp"]);
        let all = format!("{routes}{routes6}");
        if cidrs.iter().all(|c| all.contains(c.as_str())) {
            println!("the ToR's kernel:\n{all}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ToR did not learn every block: {all}\n{}\n{}\n{}",
            ctl("node-1", &["show", "protocols"]),
            tor.vtysh(&["show bgp ipv4 unicast"]),
            tor.vtysh(&["show bgp ipv6 unicast"])
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Its namespace reaches every pod directly over both families: the router has no tunnel
    // of any kind.
    for pod in ["node-1-a", "node-2-b", "node-3-a", "node-4-b"] {
        for ip in [lab.pod_address(pod), lab.pod_address6(pod)] {
            let (ok, out) = lab.exec("router", &["ping", "-c", "1", "-W", "2", &ip]);
            assert!(ok, "the ToR cannot reach {pod} ({ip}): {out}");
        }
    }
    // And every pod still reaches every pod, node-4 through the ToR (no VXLAN left).
    let text = lab.ok(&["check"]);
    assert_both_matrices_pass(&text);
    let (_, links) = lab.exec("node-1", &["ip", "-o", "link", "show", "type", "vxlan"]);
    assert!(
        !links.contains("vxlan.calico") && !links.contains("vxlan-v6.calico"),
        "a VXLAN device is left without a VXLAN pool: {links}"
    );
}

#[test]
fn the_local_cluster_on_etcd() {
    let lab = Lab::new(&format!("mle{}", std::process::id()));
    let text = lab.ok(&["up", "--etcd"]);
    println!("{text}");
    assert_both_matrices_pass(&text);
    let endpoints = "http://10.99.1.21:2379,http://10.99.1.22:2379,http://10.99.1.23:2379";
    assert!(
        text.contains(&format!("etcd:{endpoints} (connected)")),
        "{text}"
    );
    assert!(text.contains("== bgpctl show protocols (node-1)"), "{text}");
    let status = lab.ok(&["status"]);
    assert!(
        status.contains(&format!("datastore: etcd {endpoints} (3 members")),
        "{status}"
    );
    let etcd_pids: Vec<i32> = status
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.first()
                .is_some_and(|k| k.starts_with("etcd-") && k.ends_with("-etcd"))
                && w.get(3) == Some(&"running"))
            .then(|| w[2].parse().ok())
            .flatten()
        })
        .collect();
    assert_eq!(etcd_pids.len(), 3, "three running members in:\n{status}");
    // Every node's bgpd is on etcd, not on a SQLite file.
    for node in ["node-1", "node-4"] {
        let sock = format!("/run/margay-lab-{}/{node}/bgpd.sock", lab.name);
        let out = Command::new(lab::binary("bgpctl"))
            .args(["--socket", &sock, "status", "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["datastore"], format!("etcd:{endpoints}"), "{node}: {v}");
        assert_eq!(v["datastore_state"], "connected", "{node}: {v}");
    }
    assert!(
        !std::path::Path::new(&format!("/run/margay-lab-{}/store/store.db", lab.name)).exists()
    );

    let again = lab.ok(&["up", "--etcd"]);
    assert!(again.contains("already up"), "{again}");
    lab.ok(&["down"]);
    for pid in etcd_pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "etcd (pid {pid}) still runs after down"
        );
    }
    assert!(!std::path::Path::new(&format!("/run/margay-lab-{}", lab.name)).exists());
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(
        !left.contains(&format!("{}-", lab.name)),
        "namespaces left: {left}"
    );
}
