//! A service address announced from two nodes reaches the ToR with two next hops (ECMP).
//! Two bgpd nodes on one segment share the SQLite datastore; an FRR ToR (AS 65000, with
//! zebra, so its kernel forwards) peers with both through one global `BGPPeer`. The
//! `BGPConfiguration`'s serviceLoadBalancerIPs holds a range; a load-balancer controller's
//! calls are made with `bgpctl service announce|withdraw` on each node.
//!
//! Per family: both nodes announce one address; FRR's RIB and its kernel hold it with both
//! nodes as next hops; a ping from the ToR reaches it (each node has the address on its
//! loopback, as a node-local proxy would answer), and pings from 16 sources reach both nodes
//! (their ICMP counters); one node withdraws and within a second the
//! ToR keeps only the other (printed as `service withdraw → ToR one next hop: N ms`); the
//! other's lease, renewed with 2 s, runs out and the ToR loses the route. Refusals on the way:
//! an address outside the ranges, a withdraw of an address not announced. Needs root and FRR.
//!

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use datastore::model::{BgpConfiguration, BgpPeer};
use interop_tests::lab::bgp_peer::wait_until;
use interop_tests::lab::bgpd::runtime;
use interop_tests::lab::calico_node::add_ipv6;
use interop_tests::lab::frr::Frr;
use interop_tests::lab::netns::Netns;
use interop_tests::lab::open_store;
use interop_tests::lab::segment::Segment;
use interop_tests::lab::segment_node::{NodeOptions, SegmentNode as Node};
use interop_tests::lab::tor;
use ipam::allocator::Ipam;

const TOR: &str = tor::ADDRESS;
const TOR6: &str = tor::ADDRESS6;
const CONVERGE: Duration = Duration::from_secs(40);

/// One family's addresses in the test.
struct Family {
    v6: bool,
    tor: &'static str,
    /// The load-balancer range and the service address inside it.
    range: &'static str,
    service: &'static str,
    /// An address outside every service range.
    outside: &'static str,
}

const V4: Family = Family {
    v6: false,
    tor: TOR,
    range: "198.51.100.0/24",
    service: "198.51.100.10",
    outside: "192.0.2.10",
};

const V6: Family = Family {
    v6: true,
    tor: TOR6,
    range: "2001:db8:51::/64",
    service: "2001:db8:51::10",
    outside: "2001:db8:99::10",
};

impl Family {
    fn host(&self) -> String {
        format!("{}/{}", self.service, if self.v6 { 128 } else { 32 })
    }

    fn afi(&self) -> &'static str {
        if self.v6 { "ipv6" } else { "ipv4" }
    }

    fn node_addr<'a>(&self, n: &'a Node) -> &'a str {
        if self.v6 {
            n.addr6.as_deref().unwrap_or("")
        } else {
            &n.addr
        }
    }
}

/// The node's leases, as `bgpctl service list --json` gives them.
fn leases_of(n: &Node) -> serde_json::Value {
    serde_json::from_str(&n.ctl_ok(&["service", "list", "--json"])).unwrap()
}

/// The gateways of the ToR kernel's route for the service address, as the nodes they lead
/// to.
fn kernel_next_hops(tor_ns: &Netns, f: &Family, nodes: &[&Node]) -> BTreeSet<String> {
    let fam = if f.v6 { "-6" } else { "-4" };
    let out = tor_ns
        .ip(&[fam, "-j", "route", "show", &f.host()])
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let mut hops = BTreeSet::new();
    for r in v.as_array().into_iter().flatten() {
        if let Some(g) = r["gateway"].as_str() {
            hops.insert(g.to_owned());
        }
        for n in r["nexthops"].as_array().into_iter().flatten() {
            if let Some(g) = n["gateway"].as_str() {
                hops.insert(g.to_owned());
            }
        }
    }
    tor::by_node(hops, nodes)
}

/// Echo requests a node's namespace has received (`/proc/net/snmp` is per namespace).
fn echo_requests(n: &Node, f: &Family) -> u64 {
    let (file, key) = if f.v6 {
        ("/proc/net/snmp6", "Icmp6InEchos")
    } else {
        ("/proc/net/snmp", "InEchos")
    };
    let text = n.ns().exec("cat", &[file]).unwrap();
    if f.v6 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {file}"))
    } else {
        // Two `Icmp:` lines, names then values.
        let icmp: Vec<&str> = text.lines().filter(|l| l.starts_with("Icmp:")).collect();
        let names: Vec<&str> = icmp[0].split_whitespace().collect();
        let at = names.iter().position(|w| *w == key).unwrap();
        icmp[1].split_whitespace().nth(at).unwrap().parse().unwrap()
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn context(tor: &Frr, nodes: &[&Node], f: &Family) -> String {
    let mut s = format!(
        "--- ToR bgp\n{}\n--- ToR summary\n{}\n",
        tor.vtysh(&[&format!("show bgp {} unicast", f.afi())]),
        tor.vtysh(&[&format!("show bgp {} unicast summary", f.afi())])
    );
    for n in nodes {
        let (_, protocols, _) = n.ctl(&["show", "protocols"]);
        let tail: Vec<String> = n.log().lines().rev().take(30).map(str::to_owned).collect();
        s.push_str(&format!(
            "--- {} protocols\n{protocols}--- {} log (tail)\n{}\n",
            n.name,
            n.name,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    s
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: refusals, both ToR sessions, announcement, ECMP spread, withdrawal and lease expiry; shared by both families"
)]
fn service_ecmp(f: &Family, tag: &str) {
    let rt = runtime();
    let seg = Segment::new(&format!("{tag}seg")).unwrap();
    let tor_member = seg
        .attach(&format!("{tag}tor"), &format!("{TOR}/24"))
        .unwrap();
    add_ipv6(&tor_member.ns, "eth0", &format!("{TOR6}/64")).unwrap_or_else(|e| panic!("{e}"));
    let tor = tor::start(&tor_member.ns);
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store.db");
    let ipam = rt.block_on(async {
        let store = open_store(&format!("sqlite:{}", store_path.display()))
            .await
            .unwrap();
        let ipam = Ipam::new(store);
        datastore::Resources::new(ipam.store())
            .put_bgp_peer(&BgpPeer::new("tor", "", f.tor.parse().unwrap(), 65000))
            .await
            .unwrap();
        ipam
    });
    let n1 = Node::start_with(
        &seg,
        "n1",
        "10.97.0.11",
        &store_path,
        &NodeOptions {
            tag: Some(&format!("{tag}n1")),
            addr6: Some("fd00:97::11"),
            ..Default::default()
        },
    );
    let n2 = Node::start_with(
        &seg,
        "n2",
        "10.97.0.12",
        &store_path,
        &NodeOptions {
            tag: Some(&format!("{tag}n2")),
            addr6: Some("fd00:97::12"),
            ..Default::default()
        },
    );
    let nodes = [&n1, &n2];

    // Before the range is configured, an announcement is refused, naming the field.
    let (ok, _, err) = n1.ctl(&["service", "announce", f.service]);
    assert!(!ok, "announced outside every service range");
    assert!(
        err.contains(&format!(
            "address: {} is not inside serviceExternalIPs or serviceLoadBalancerIPs of the BGPConfiguration; add its range there first",
            f.service
        )) && err.contains("InvalidArgument"),
        "{err}"
    );
    rt.block_on(async {
        let (mut config, rev) = match datastore::Resources::new(ipam.store())
            .bgp_configuration()
            .await
            .unwrap()
        {
            Some((c, rev)) => (c, Some(rev)),
            None => (BgpConfiguration::default(), None),
        };
        config.service_load_balancer_ips = vec![f.range.parse().unwrap()];
        datastore::Resources::new(ipam.store())
            .set_bgp_configuration(&config, rev)
            .await
            .unwrap();
    });

    // Both ToR sessions up.
    assert!(
        wait_until(CONVERGE, || nodes.iter().all(|n| tor
            .session_state(f.afi(), f.node_addr(n))
            == "Established")),
        "the ToR sessions did not come up\n{}",
        context(&tor, &nodes, f)
    );
    eprintln!("both nodes peer with the ToR over {}", f.afi());

    // Refusals: outside the range; not a unicast address; a TTL out of range; withdrawing
    // what is not announced.
    let (ok, _, err) = n1.ctl(&["service", "announce", f.outside]);
    assert!(
        !ok && err.contains("is not inside serviceExternalIPs"),
        "{err}"
    );
    let ll = if f.v6 { "fe80::10" } else { "169.254.0.10" };
    let (ok, _, err) = n1.ctl(&["service", "announce", ll]);
    assert!(
        !ok && err.contains("address:") && err.contains("link-local"),
        "{err}"
    );
    let (ok, _, err) = n1.ctl(&["service", "announce", f.service, "--ttl", "2d"]);
    assert!(
        !ok && err.contains("ttl_s: 172800 is out of range 1-86400"),
        "{err}"
    );
    let (ok, _, err) = n1.ctl(&["service", "withdraw", f.service]);
    assert!(
        !ok && err.contains("NotFound") && err.contains("is not announced"),
        "{err}"
    );

    // The pods' answer: the address on each node's loopback (a node-local proxy).
    for n in nodes {
        n.ns().ip(&["addr", "add", &f.host(), "dev", "lo"]).unwrap();
    }

    // Both nodes announce it: the ToR holds two next hops, in FRR and in its kernel.
    for n in nodes {
        let out = n.ctl_ok(&[
            "service",
            "announce",
            f.service,
            "--ttl",
            "60s",
            "--owner",
            "default/web",
        ]);
        assert!(
            out.contains(&format!("{} announced for 1m 0s", f.service)),
            "{out}"
        );
    }
    let both = set(&["n1", "n2"]);
    assert!(
        wait_until(CONVERGE, || tor::next_hops(&tor, &f.host(), &nodes) == both
            && kernel_next_hops(&tor_member.ns, f, &nodes) == both),
        "the ToR does not have two next hops for {}: FRR {:?}, kernel {:?}\n{}\n{}",
        f.host(),
        tor::next_hops(&tor, &f.host(), &nodes),
        kernel_next_hops(&tor_member.ns, f, &nodes),
        tor.vtysh(&[&format!("show bgp {} unicast {}", f.afi(), f.host())]),
        context(&tor, &nodes, f)
    );
    let route = tor_member
        .ns
        .ip(&[if f.v6 { "-6" } else { "-4" }, "route", "show", &f.host()])
        .unwrap();
    println!("the ToR's kernel route (ECMP):\n{route}");
    let bgp = tor.json(&format!("show bgp {} unicast {} json", f.afi(), f.host()));
    let multipath = bgp["paths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["multipath"] == true || p["bestpath"]["overall"] == true)
        .count();
    assert_eq!(multipath, 2, "FRR's paths: {bgp}");

    // `service list`: address, owner, TTL, time left; and as JSON.
    let table = n1.ctl_ok(&["service", "list"]);
    assert!(table.starts_with("ADDRESS"), "{table}");
    let row = table.lines().nth(1).unwrap_or("");
    assert!(
        row.starts_with(f.service) && row.contains("default/web") && row.contains("1m 0s"),
        "{table}"
    );
    println!("bgpctl service list:\n{table}");
    let leases = leases_of(&n1);
    assert_eq!(leases[0]["address"], f.service, "{leases}");
    assert_eq!(leases[0]["ttl_s"], 60, "{leases}");
    assert!(
        leases[0]["expires_in_s"]
            .as_u64()
            .is_some_and(|s| (50..=60).contains(&s)),
        "{leases}"
    );

    // A ping from the ToR's side reaches the address (answered by whichever node ECMP picks).
    let mut ping = vec!["ping", "-c", "3", "-i", "0.2", "-W", "2", f.service];
    if f.v6 {
        ping.insert(1, "-6");
    }
    let answer = tor_member.ns.exec(ping[0], &ping[1..]);
    assert!(
        answer.is_ok(),
        "the ToR cannot reach {}: {answer:?}",
        f.service
    );
    println!(
        "ping from the ToR: {}",
        answer.unwrap().lines().rev().nth(1).unwrap_or("")
    );

    // ECMP spreads flows over both nodes: pings from 16 source addresses of the ToR's side
    // (the kernel hashes source and destination) reach both, as each node's ICMP counters
    // show. All 16 landing on one node by chance: 2 in 65536.
    let before: Vec<u64> = nodes.iter().map(|n| echo_requests(n, f)).collect();
    for i in 0..16 {
        let src = if f.v6 {
            format!("fd00:97::2{i:02}")
        } else {
            format!("10.97.0.{}", 200 + i)
        };
        let plen = if f.v6 { 64 } else { 24 };
        let mut add = vec!["addr", "add", "", "dev", "eth0"];
        let cidr = format!("{src}/{plen}");
        add[2] = &cidr;
        if f.v6 {
            add.push("nodad");
        }
        tor_member.ns.ip(&add).unwrap();
        let mut p = vec!["ping", "-c", "1", "-W", "2", "-I", &src, f.service];
        if f.v6 {
            p.insert(1, "-6");
        }
        let answer = tor_member.ns.exec(p[0], &p[1..]);
        assert!(answer.is_ok(), "from {src}: {answer:?}");
    }
    let answered: Vec<u64> = nodes
        .iter()
        .zip(&before)
        .map(|(n, b)| echo_requests(n, f) - b)
        .collect();
    println!("echo requests answered by n1, n2: {answered:?}");
    assert!(
        answered.iter().all(|a| *a > 0) && answered.iter().sum::<u64>() >= 16,
        "ECMP did not spread over both nodes: {answered:?}"
    );

    // n1 withdraws: within a second the ToR keeps n2 only.
    let only_n2 = set(&["n2"]);
    let started = Instant::now();
    n1.ctl_ok(&["service", "withdraw", f.service]);
    let mut elapsed = None;
    while started.elapsed() < Duration::from_secs(3) {
        if tor::next_hops(&tor, &f.host(), &nodes) == only_n2 {
            elapsed = Some(started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = elapsed.unwrap_or_else(|| {
        panic!(
            "the ToR did not drop n1's next hop: FRR {:?}\n{}",
            tor::next_hops(&tor, &f.host(), &nodes),
            context(&tor, &nodes, f)
        )
    });
    println!(
        "service withdraw → ToR one next hop: {} ms ({})",
        elapsed.as_millis(),
        f.afi()
    );
    assert!(elapsed <= Duration::from_secs(1), "took {elapsed:?}");
    assert!(
        wait_until(Duration::from_secs(2), || kernel_next_hops(
            &tor_member.ns,
            f,
            &nodes
        ) == only_n2),
        "the ToR's kernel: {:?}",
        kernel_next_hops(&tor_member.ns, f, &nodes)
    );
    assert!(leases_of(&n1).as_array().is_some_and(Vec::is_empty));
    // Still reachable, through n2.
    let answer = tor_member.ns.exec(ping[0], &ping[1..]);
    assert!(answer.is_ok(), "after n1's withdraw: {answer:?}");

    // n2 renews with 2 s and stops renewing: the lease runs out and the ToR loses the route,
    // not before.
    let renewed = Instant::now();
    n2.ctl_ok(&[
        "service",
        "announce",
        f.service,
        "--ttl",
        "2s",
        "--owner",
        "default/web",
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        tor::next_hops(&tor, &f.host(), &nodes),
        only_n2,
        "gone before the lease ran out"
    );
    assert!(
        wait_until(Duration::from_secs(3), || tor::next_hops(
            &tor,
            &f.host(),
            &nodes
        )
        .is_empty()
            && kernel_next_hops(&tor_member.ns, f, &nodes).is_empty()),
        "the ToR kept {} after n2's lease ran out: FRR {:?}\n{}",
        f.host(),
        tor::next_hops(&tor, &f.host(), &nodes),
        context(&tor, &nodes, f)
    );
    let gone = renewed.elapsed();
    println!(
        "service lease of 2 s ran out → ToR has no route: {} ms after the renewal",
        gone.as_millis()
    );
    assert!(gone >= Duration::from_secs(2), "{gone:?}");
    assert!(leases_of(&n2).as_array().is_some_and(Vec::is_empty));
    assert!(
        tor.json(&format!("show bgp {} unicast {} json", f.afi(), f.host()))["paths"].is_null()
    );
}

#[test]
fn service_ecmp_ipv4() {
    service_ecmp(&V4, "se4");
}

#[test]
fn service_ecmp_ipv6() {
    service_ecmp(&V6, "se6");
}
