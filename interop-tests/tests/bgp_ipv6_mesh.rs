//! The dual-stack node-to-node mesh against Calico's own daemons. Three nodes on one L2
//! segment (10.96.6.0/24 and fd96:6::/64): bgpd on `a`; BIRD 1.6 on `b`, as calico-node runs
//! it (`bird` for IPv4, `bird6` for IPv6); BIRD 2 on `c`, one daemon per family with the same
//! configuration in BIRD 2's syntax. The BIRDs are configured the way confd renders bird.cfg
//! and bird6.cfg (`lab::calico_bird`): router id, device and direct, the kernel protocol
//! (learning, and programming what `calico_kernel_programming` passes), static blackholes for
//! their own blocks, `calico_aggr`, the `bgp_template`, one `Mesh_<addr>` per other node.
//!
//! bgpd learns the cluster through its API: Nodes `b` and `c` with both addresses, one
//! no-encapsulation pool per family, and a block of each family claimed for every node (a's
//! through its own AutoAssign; b's and c's claimed for them, and written into their BIRD
//! configurations as confd would). It proves:
//!
//! - every session of the mesh is Established, each family between the nodes' addresses of
//!   that family (`Mesh_fd96_6__2`, as bird6 names them), on all three nodes;
//! - every node routes every other node's blocks of both families via that node's address:
//!   BIRD in b's and c's kernels (`proto bird`), bgpd in a's desired kernel state (bgpctl and
//!   `Dataplane.Watch`), where it names the session and the pool rule; `bgpctl show filters`
//!   shows the IPv6 pool's rules;
//! - an IPv4 session carries no IPv6 route and an IPv6 session no IPv4 route, either way,
//!   and bgpd offers each session its own family only;
//! - a's IPv6 block, released and given back to the pool, leaves b's and c's kernels and
//!   RIBs while its IPv4 block stays.
//!
//! Everything is this run's (namespaces `mgy<pid>-…`); the daemons are killed by PID and the
//! namespaces deleted when the test ends, also when it fails. Needs root, BIRD 1.6 (`bird`,
//! `bird6`) and BIRD 2.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use IpFamily::{V4, V6};
use datastore::model::{IpFamily, IpamConfig};
use interop_tests::lab::bgp_peer::wait_until;
use interop_tests::lab::bgpd::{bgpctl, runtime};
use interop_tests::lab::calico_bird::{Dialect, NodeConfig, Pool, mesh_name};
use interop_tests::lab::calico_node::{CalicoBird, add_ipv6, kernel_via, neighbor_afs};
use interop_tests::lab::link6::{bird_gateway, bird_next_hops};
use interop_tests::lab::netns::{Netns, NsProcess};
use interop_tests::lab::segment::{Member, Segment};
use interop_tests::lab::{binary, open_store};
use ipam::allocator::Ipam;
use proto::v1 as pb;
use tonic::transport::Channel;

/// A node: its name and its addresses on the segment (/24 and /64).
struct Spec {
    name: &'static str,
    v4: &'static str,
    v6: &'static str,
}

impl Spec {
    fn addr(&self, f: IpFamily) -> &'static str {
        match f {
            V4 => self.v4,
            V6 => self.v6,
        }
    }

    /// The name of the session toward this node of family `f` (`Mesh_fd96_6__2`).
    fn mesh(&self, f: IpFamily) -> String {
        mesh_name(self.addr(f).parse::<IpAddr>().expect("a node address"))
    }
}

const fn spec(name: &'static str, v4: &'static str, v6: &'static str) -> Spec {
    Spec { name, v4, v6 }
}

const NODES: [Spec; 3] = [
    spec("a", "10.96.6.1", "fd96:6::1"),
    spec("b", "10.96.6.2", "fd96:6::2"),
    spec("c", "10.96.6.3", "fd96:6::3"),
];
/// The pools (name, CIDR), both without encapsulation.
fn pool(f: IpFamily) -> (&'static str, &'static str) {
    match f {
        V4 => ("mesh-v4", "172.26.0.0/16"),
        V6 => ("mesh-v6", "fd97:6::/48"),
    }
}
/// Handles of the addresses that hold the blocks; a's two families apart, so that one can go.
const A4: &str = "mesh6.a.v4";
const A6: &str = "mesh6.a.v6";
const CONVERGE: Duration = Duration::from_secs(60);

fn other(f: IpFamily) -> IpFamily {
    match f {
        V4 => V6,
        V6 => V4,
    }
}

/// Everything the test starts. Fields drop in order: the daemons before their namespaces,
/// the namespaces before the segment's bridge.
struct Lab {
    /// b's and c's daemons, by (node, family), once started.
    birds: Vec<((usize, IpFamily), CalicoBird)>,
    bgpd: Option<NsProcess>,
    nodes: Vec<Member>,
    _seg: Segment,
    /// bgpd's configuration, datastore, socket and log.
    dir: tempfile::TempDir,
}

impl Lab {
    /// The segment and its three nodes, their addresses usable, and bgpd running on `a`.
    fn new() -> Lab {
        let seg = Segment::new("m6seg").unwrap_or_else(|e| panic!("{e}"));
        let mut nodes = Vec::new();
        for n in &NODES {
            let m = seg.attach(&format!("m6{}", n.name), &format!("{}/24", n.v4));
            nodes.push(m.unwrap_or_else(|e| panic!("{e}")));
        }
        // Addresses of both families are ready before the daemons start.
        for (m, n) in nodes.iter().zip(&NODES) {
            add_ipv6(&m.ns, "eth0", &format!("{}/64", n.v6)).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut lab = Lab {
            birds: Vec::new(),
            bgpd: None,
            nodes,
            _seg: seg,
            dir: tempfile::tempdir().unwrap(),
        };
        let config = lab.dir.path().join("bgpd.toml");
        std::fs::write(
            &config,
            format!(
                "[node]\nname = \"a\"\naddress = \"{}/24\"\naddress6 = \"{}/64\"\n\
                 [datastore]\nkind = \"sqlite\"\npath = \"{}\"\n\
                 [api]\nsocket = \"{}\"\n[log]\nlevel = \"debug\"\n",
                NODES[0].v4,
                NODES[0].v6,
                lab.store().display(),
                lab.socket().display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(lab.dir.path().join("bgpd.log")).unwrap();
        let mut cmd = lab.ns(0).command(binary("bgpd"));
        cmd.arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("MARGAY_") {
                cmd.env_remove(k);
            }
        }
        lab.bgpd = Some(lab.ns(0).spawn(&mut cmd).unwrap());
        assert!(
            wait_until(Duration::from_secs(20), || {
                std::os::unix::net::UnixStream::connect(lab.socket()).is_ok()
            }),
            "bgpd did not serve its API\n{}",
            lab.bgpd_log()
        );
        lab
    }

    fn ns(&self, node: usize) -> &Netns {
        &self.nodes[node].ns
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store.db")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("bgpd.sock")
    }

    fn bgpd_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bgpd.log")).unwrap_or_default()
    }

    /// Starts node `node`'s daemon of family `f` (b: BIRD 1.6, c: BIRD 2) with the
    /// configuration confd would render from the cluster: its `block`, the pool, the mesh.
    fn start_bird(&mut self, node: usize, f: IpFamily, block: ipnet::IpNet) {
        let dialect = [Dialect::Bird1, Dialect::Bird2][node - 1];
        let pools = [Pool {
            cidr: pool(f).1.parse().unwrap(),
            vxlan: false,
        }];
        let peers: Vec<IpAddr> = NODES.iter().map(|n| n.addr(f).parse().unwrap()).collect();
        let conf = NodeConfig {
            router_id: NODES[node].v4.parse().unwrap(),
            address: NODES[node].addr(f).parse().unwrap(),
            blocks: &[block],
            pools: &pools,
            peers: &peers,
            kernel: true,
            log: None,
        };
        let bird =
            CalicoBird::start(self.ns(node), dialect, &conf).unwrap_or_else(|e| panic!("{e}"));
        self.birds.push(((node, f), bird));
    }

    fn bird(&self, node: usize, f: IpFamily) -> &CalicoBird {
        let (_, b) = self.birds.iter().find(|(k, _)| *k == (node, f)).unwrap();
        b
    }

    /// bgpctl's output (stdout, then stderr).
    fn ctl(&self, args: &[&str]) -> String {
        let o = bgpctl(&self.socket(), args);
        String::from_utf8_lossy(&[o.stdout, o.stderr].concat()).into_owned()
    }

    /// The rows of `bgpctl ARGS --json` (none when it fails).
    fn rows(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let o = bgpctl(&self.socket(), &[args, &["--json"]].concat());
        match serde_json::from_slice(&o.stdout) {
            Ok(serde_json::Value::Array(rows)) => rows,
            _ => Vec::new(),
        }
    }

    /// bgpd's sessions: name → the row of `show protocols`.
    fn a_sessions(&self) -> BTreeMap<String, serde_json::Value> {
        let rows = self.rows(&["show", "protocols"]);
        rows.into_iter()
            .map(|p| (p["name"].as_str().unwrap_or("").to_owned(), p))
            .collect()
    }

    /// bgpd's desired kernel state: destination → (route as `ip route` shows it, why).
    fn a_kernel(&self) -> BTreeMap<String, (String, String)> {
        let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
        self.rows(&["show", "route", "--table", "kernel"])
            .iter()
            .map(|r| (text(&r["prefix"]), (text(&r["route"]), text(&r["source"]))))
            .collect()
    }

    /// The prefixes of one of bgpd's Adj-RIBs (`adj-in` or `adj-out`) of a session.
    fn a_adj(&self, table: &str, peer: &str) -> Vec<String> {
        self.rows(&["show", "route", "--table", table, peer])
            .iter()
            .filter_map(|r| r["prefix"].as_str().map(str::to_owned))
            .collect()
    }

    /// `ip route show PREFIX` in a node's namespace (b and c: what BIRD programmed).
    fn ip_route(&self, node: usize, prefix: &str) -> String {
        let fam = if prefix.contains(':') { "-6" } else { "-4" };
        let ns = self.ns(node);
        ns.ip(&[fam, "route", "show", prefix]).unwrap_or_default()
    }

    /// The gateway node `node` routes `prefix` via: b and c from their kernel tables (BIRD's
    /// routes only), a from bgpd's desired kernel state.
    fn via(&self, node: usize, prefix: &str) -> Option<String> {
        if node == 0 {
            let (route, _) = self.a_kernel().remove(prefix)?;
            return route.strip_prefix("via ").map(str::to_owned);
        }
        kernel_via(&self.ip_route(node, prefix))
    }

    /// What every daemon says: sessions, routes, kernel tables, and with `logs` the tails
    /// of their logs (for a failure message).
    fn report(&self, what: &str, logs: bool) -> String {
        let mut s = format!("{what}\n");
        for args in [
            &["show", "protocols"][..],
            &["show", "route"],
            &["show", "route", "--table", "kernel"],
        ] {
            s.push_str(&format!(
                "--- a: bgpctl {} ---\n{}",
                args.join(" "),
                self.ctl(args)
            ));
        }
        for ((node, _), bird) in &self.birds {
            let who = format!("{}: {}", NODES[*node].name, bird.label());
            s.push_str(&format!(
                "--- {who}: show protocols ---\n{}--- {who}: show route ---\n{}",
                bird.birdc(&["show", "protocols"]),
                bird.birdc(&["show", "route"])
            ));
            if logs {
                s.push_str(&format!("--- {who}: log ---\n{}\n", tail(&bird.log(), 25)));
            }
        }
        for (m, n) in self.nodes.iter().zip(&NODES).skip(1) {
            let ns = &m.ns;
            s.push_str(&format!(
                "--- {}: ip route / ip -6 route (proto bird) ---\n{}{}",
                n.name,
                ns.ip(&["route", "show", "proto", "bird"])
                    .unwrap_or_default(),
                ns.ip(&["-6", "route", "show", "proto", "bird"])
                    .unwrap_or_default()
            ));
        }
        if logs {
            let log = tail(&self.bgpd_log(), 60);
            s.push_str(&format!("--- a: bgpd log ---\n{log}\n"));
        }
        s
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---- the API ----

async fn api(lab: &Lab) -> Channel {
    proto::client::connect_unix(&lab.socket())
        .await
        .unwrap_or_else(|e| panic!("bgpd's API: {e}"))
}

/// Addresses for `node` ("" for a itself) under `handle`; the blocks they came from, IPv4
/// first.
async fn claim(ch: &Channel, node: &str, handle: &str, v4: u32, v6: u32) -> Vec<ipnet::IpNet> {
    let r = pb::ipam_client::IpamClient::new(ch.clone())
        .auto_assign(pb::AutoAssignRequest {
            handle: handle.into(),
            node: node.into(),
            num_ipv4: v4,
            num_ipv6: v6,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("AutoAssign {handle}: {e}"))
        .into_inner();
    let blocks = r.ipv4.iter().chain(&r.ipv6).map(|a| a.block.parse());
    blocks.collect::<Result<_, _>>().unwrap()
}

/// Nodes b and c, both pools, and the blocks: a's per family, b's and c's. Returns each
/// node's blocks, IPv4 and IPv6.
async fn seed(lab: &Lab) -> Vec<[ipnet::IpNet; 2]> {
    let ch = api(lab).await;
    let mut nodes = pb::nodes_client::NodesClient::new(ch.clone());
    for n in &NODES[1..] {
        let node = pb::Node {
            name: n.name.into(),
            ipv4_address: format!("{}/24", n.v4),
            ipv6_address: format!("{}/64", n.v6),
            ..Default::default()
        };
        let req = pb::RegisterNodeRequest { node: Some(node) };
        if let Err(e) = nodes.register_node(req).await {
            panic!("RegisterNode {}: {e}", n.name);
        }
    }
    let mut pools = pb::pools_client::PoolsClient::new(ch.clone());
    for (name, cidr) in [pool(V4), pool(V6)] {
        let pool = pb::IpPool {
            name: name.into(),
            cidr: cidr.into(),
            vxlan_mode: pb::EncapMode::Never.into(),
            ipip_mode: pb::EncapMode::Never.into(),
            ..Default::default()
        };
        let req = pb::CreatePoolRequest { pool: Some(pool) };
        if let Err(e) = pools.create_pool(req).await {
            panic!("CreatePool {name}: {e}");
        }
    }
    let a4 = claim(&ch, "", A4, 1, 0).await;
    let a6 = claim(&ch, "", A6, 0, 1).await;
    let mut out = vec![[a4[0], a6[0]]];
    for n in &NODES[1..] {
        let b = claim(&ch, n.name, &format!("mesh6.{}", n.name), 1, 1).await;
        out.push([b[0], b[1]]);
    }
    out
}

/// The routes of the first update of `Dataplane.Watch`: the snapshot of a's desired state.
async fn watched_routes(lab: &Lab) -> Vec<pb::KernelRoute> {
    let mut stream = pb::dataplane_client::DataplaneClient::new(api(lab).await)
        .watch(pb::WatchRequest { from_revision: 0 })
        .await
        .unwrap_or_else(|e| panic!("Dataplane.Watch: {e}"))
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("Dataplane.Watch sent no snapshot within 10 s")
        .unwrap_or_else(|e| panic!("Dataplane.Watch: {e}"))
        .expect("Dataplane.Watch ended before its snapshot");
    assert!(first.snapshot, "the first update is not a snapshot");
    let routes = first.upsert.into_iter().filter_map(|i| match i.item {
        Some(pb::desired_item::Item::Route(r)) => Some(r),
        _ => None,
    });
    routes.collect()
}

/// Sets the empty-block grace period to 0 (only the datastore's IPAM configuration holds
/// it), then collects a's garbage through the API with only its IPv4 handle live: the IPv6
/// handle is released and its emptied block goes back to the pool.
async fn release_a6(lab: &Lab) {
    let store = open_store(&format!("sqlite:{}", lab.store().display()))
        .await
        .unwrap_or_else(|e| panic!("bgpd's datastore: {e}"));
    let config = IpamConfig {
        empty_block_grace_s: 0,
        ..Default::default()
    };
    if let Err(e) = Ipam::new(store).set_config(&config).await {
        panic!("IPAM configuration: {e}");
    }
    let r = pb::ipam_client::IpamClient::new(api(lab).await)
        .garbage_collect(pb::GarbageCollectRequest {
            node: String::new(),
            live_handles: vec![A4.into()],
            handle_prefix: "mesh6.a.".into(),
            dry_run: false,
        })
        .await
        .unwrap_or_else(|e| panic!("GarbageCollect: {e}"))
        .into_inner();
    let released: Vec<&str> = r.released.iter().map(|h| h.handle.as_str()).collect();
    assert_eq!(released, [A6], "GarbageCollect released {:?}", r.released);
}

// ---- the test ----

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: the dual-stack mesh converges, then each node's kernel, RIB and desired state is checked per family"
)]
fn a_dual_stack_mesh_with_bird6_and_bird2() {
    let rt = runtime();
    let mut lab = Lab::new();
    let blocks = rt.block_on(seed(&lab));
    let block = |node: usize, f: IpFamily| blocks[node][usize::from(f == V6)].to_string();
    eprintln!("blocks (IPv4, IPv6) of a, b, c: {blocks:?}");
    for (node, own) in blocks.iter().enumerate().skip(1) {
        lab.start_bird(node, V4, own[0]);
        lab.start_bird(node, V6, own[1]);
    }

    // 1. Every session of the mesh Established, each family between that family's addresses.
    let want = |node: usize, f: IpFamily| -> Vec<String> {
        let others = NODES.iter().enumerate().filter(|(i, _)| *i != node);
        others.map(|(_, n)| n.mesh(f)).collect()
    };
    let all_up = || {
        let a = lab.a_sessions();
        let a_up = [V4, V6]
            .iter()
            .flat_map(|&f| want(0, f))
            .all(|n| a.get(&n).is_some_and(|p| p["state"] == "Established"));
        a_up && a.len() == 4
            && lab.birds.iter().all(|((node, f), bird)| {
                let s = bird.sessions();
                let up = |n: &String| s.get(n).is_some_and(|i| i.starts_with("Established"));
                s.len() == 2 && want(*node, *f).iter().all(up)
            })
    };
    let why = "the mesh did not come up on every node";
    assert!(wait_until(CONVERGE, all_up), "{}", lab.report(why, true));
    // bird6's sessions are IPv6 only, bird's IPv4 only: so are bgpd's toward them.
    for (name, p) in lab.a_sessions() {
        let v6 = name.starts_with("Mesh_fd");
        let family = serde_json::json!([if v6 { "ipv6" } else { "ipv4" }]);
        assert_eq!(p["families"], family, "{name}: {p}");
    }

    // 2. Every node routes every other node's blocks, both families, via that node's address.
    let converged = || {
        (0..NODES.len()).all(|node| {
            (0..NODES.len()).filter(|&o| o != node).all(|owner| {
                [V4, V6].iter().all(|&f| {
                    lab.via(node, &block(owner, f)).as_deref() == Some(NODES[owner].addr(f))
                })
            })
        })
    };
    let why = "the blocks did not reach every node's kernel table";
    assert!(wait_until(CONVERGE, converged), "{}", lab.report(why, true));
    eprintln!("{}", lab.report("=== converged ===", false));
    // a's IPv6 block in b's kernel, as bird6 programmed it.
    let a6 = block(0, V6);
    let b_route = lab.ip_route(1, &a6);
    let want_route = format!("via {} dev eth0 proto bird", NODES[0].v6);
    assert!(b_route.contains(&want_route), "{b_route}");
    // ... and in c's RIB: next hop a's IPv6 address, resolved on the segment.
    let c_rib = lab.bird(2, V6).birdc(&["show", "route", "all", &a6]);
    eprintln!("--- c: BIRD 2 (IPv6): show route all {a6} ---\n{c_rib}");
    assert_eq!(bird_next_hops(&c_rib), [NODES[0].v6], "{c_rib}");
    let via_eth0 = Some((NODES[0].v6.to_owned(), "eth0".to_owned()));
    assert_eq!(bird_gateway(&c_rib), via_eth0, "{c_rib}");
    // b's and c's IPv6 blocks in a's desired kernel state: via their IPv6 addresses, from
    // the IPv6 sessions, by the pool's rule; a's own block a blackhole.
    let k = lab.a_kernel();
    for owner in [1, 2] {
        let b6 = block(owner, V6);
        let route = (
            format!("via {}", NODES[owner].v6),
            format!(
                "bgp from {} (pool {} has no encapsulation)",
                NODES[owner].mesh(V6),
                pool(V6).0
            ),
        );
        assert_eq!(k.get(&b6), Some(&route), "{k:#?}");
    }
    let own = k.get(&a6).map(|(route, _)| route.as_str());
    assert_eq!(own, Some("blackhole"), "{k:#?}");
    // The same over Dataplane.Watch (what routewriter gets).
    let watched = rt.block_on(watched_routes(&lab));
    for owner in [1, 2] {
        let b6 = block(owner, V6);
        let r = watched.iter().find(|r| r.destination == b6);
        let got = r.map(|r| (r.kind(), r.gateway.as_str()));
        let want = (pb::RouteKind::Gateway, NODES[owner].v6);
        assert_eq!(got, Some(want), "{b6} in Dataplane.Watch: {watched:#?}");
    }

    // 3. An IPv4 session carries no IPv6 route, an IPv6 session no IPv4 route, either way.
    for owner in [1, 2] {
        for f in [V4, V6] {
            let peer = NODES[owner].mesh(f);
            let other_family = |p: &String| p.contains(':') != (f == V6);
            let out = lab.a_adj("adj-out", &peer);
            let inn = lab.a_adj("adj-in", &peer);
            let out_ok = out.contains(&block(0, f)) && !out.iter().any(other_family);
            assert!(out_ok, "{peer} adj-out: {out:?}");
            let in_ok = inn.contains(&block(owner, f)) && !inn.iter().any(other_family);
            assert!(in_ok, "{peer} adj-in: {inn:?}");
            // What the BIRD side learned from a on that session.
            let bird = lab.bird(owner, f);
            let learned = bird.birdc(&["show", "route", "protocol", &NODES[0].mesh(f)]);
            let ok = learned.contains(&block(0, f)) && !learned.contains(&block(0, other(f)));
            assert!(ok, "{} from a: {learned}", bird.label());
        }
    }
    // BIRD 2 shows what bgpd offered: one family per session.
    for (f, family) in [(V4, "ipv4"), (V6, "ipv6")] {
        let all = lab
            .bird(2, f)
            .birdc(&["show", "protocols", "all", &NODES[0].mesh(f)]);
        assert_eq!(neighbor_afs(&all), [family], "{all}");
    }

    // 4. `bgpctl show filters` explains the IPv6 pool's routes.
    let rules = lab.rows(&["show", "filters"]);
    let has = |scope: &str, action: &str, reason: &str| {
        rules.iter().any(|r| {
            r["scope"] == scope
                && r["match"].as_str().is_some_and(|m| m.contains(pool(V6).1))
                && r["action"] == action
                && r["reason"] == reason
        })
    };
    let text = lab.ctl(&["show", "filters"]);
    eprintln!("--- a: bgpctl show filters ---\n{text}");
    let (name, _) = pool(V6);
    assert!(
        has("import", "accept", &format!("inside pool {name}")),
        "{text}"
    );
    let reason = format!("pool {name} has no encapsulation");
    assert!(has("kernel", "accept via bgp next hop", &reason), "{text}");

    // 5. a's IPv6 block goes back to the pool: it leaves b's and c's kernels and RIBs, the
    // IPv4 block stays.
    rt.block_on(release_a6(&lab));
    let gone = || {
        let in_rib = |node| {
            lab.bird(node, V6)
                .birdc(&["show", "route", &a6])
                .contains(&a6)
        };
        lab.via(1, &a6).is_none()
            && lab.via(2, &a6).is_none()
            && !in_rib(1)
            && !in_rib(2)
            && !lab.a_kernel().contains_key(&a6)
    };
    let why = format!("{a6} was released but is still routed");
    assert!(wait_until(CONVERGE, gone), "{}", lab.report(&why, true));
    let a4 = block(0, V4);
    for node in [1, 2] {
        let why = format!("{a4} left {} with the IPv6 block", NODES[node].name);
        let kept = lab.via(node, &a4).as_deref() == Some(NODES[0].v4);
        assert!(kept, "{}", lab.report(&why, true));
    }
    eprintln!("{}", lab.report(&format!("=== {a6} withdrawn ==="), false));
}
