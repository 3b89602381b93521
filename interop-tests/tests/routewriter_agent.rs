//! routewriter against a real kernel, in network namespaces made per test: the routewriter
//! binary runs inside a "node" namespace (`ip netns exec`), fed by a Dataplane server the test
//! runs on a unix socket, and every result is read back with iproute2 (`ip route`, `ip -d
//! link`, `bridge fdb`, `ip neigh`) and nft, not with routewriter's own netlink code.
//!
//! Why this file is long: one case per kind of kernel object and fault, for each family, sharing
//! the node namespace and Dataplane server set-up.
//!
//! Topology of most tests: node namespace `n` with uplink `eth0` 10.0.0.1/24, a peer namespace
//! `x` on the other end (10.0.0.2/24), pods in namespaces of their own behind `cali*` veths. The
//! IPv6 tests add fd00:10::1/64 and fd00:10::2/64 to the same link, IPv6 pods are in
//! fd00:20::/48, and the IPv6 device is `vxlan-v6.calico`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use interop_tests::lab::{
    self,
    netns::{Netns, NsProcess, VethPair},
};
use proto::v1::{
    DataplaneUpdate, DesiredItem, DesiredKey, IpFamily, KernelRoute, LocalVtep, NatPool, RouteKind,
    Vtep, VtepKey, WatchRequest,
    dataplane_server::{Dataplane, DataplaneServer},
    desired_item::Item,
    desired_key::Key,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

// ---------------------------------------------------------------------------------------------
// A Dataplane server the test drives: it keeps the desired items and every change, answers a
// watch from revision 0 with a snapshot and a watch from a known revision with what followed.

#[derive(Default)]
struct FeedState {
    revision: u64,
    items: BTreeMap<String, DesiredItem>,
    history: Vec<DataplaneUpdate>,
    watchers: Vec<mpsc::Sender<Result<DataplaneUpdate, Status>>>,
    /// The from_revision of every watch received.
    watches: Vec<u64>,
}

#[derive(Clone, Default)]
struct Feed(Arc<Mutex<FeedState>>);

#[tonic::async_trait]
impl Dataplane for Feed {
    type WatchStream = ReceiverStream<Result<DataplaneUpdate, Status>>;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let from = req.into_inner().from_revision;
        let (tx, rx) = mpsc::channel(4096);
        let mut s = self.0.lock().unwrap();
        s.watches.push(from);
        if from > 0 && from <= s.revision {
            for u in s.history.iter().filter(|u| u.revision > from) {
                let _ = tx.try_send(Ok(u.clone()));
            }
        } else {
            let snap = DataplaneUpdate {
                revision: s.revision,
                snapshot: true,
                upsert: s.items.values().cloned().collect(),
                remove: vec![],
            };
            let _ = tx.try_send(Ok(snap));
        }
        s.watchers.push(tx);
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The family of a VTEP item, as bgpd keys it: that of its underlay address.
fn family_of(addr: &str) -> i32 {
    if addr.contains(':') {
        IpFamily::V6 as i32
    } else {
        IpFamily::V4 as i32
    }
}

fn item_key(item: &DesiredItem) -> String {
    match item.item.as_ref().unwrap() {
        Item::Route(r) => format!("route:{}", r.destination),
        Item::Vtep(v) => format!("vtep:{}:{}", v.node, family_of(&v.underlay_address)),
        Item::LocalVtep(l) => format!("local:{}", family_of(&l.underlay_address)),
        Item::NatPool(p) => format!("pool:{}", p.cidr),
        Item::EndpointPolicy(e) => format!("endpoint-policy:{}", e.interface),
        Item::PolicySet(s) => format!("policy-set:{}", s.name),
    }
}

fn key_key(key: &DesiredKey) -> String {
    match key.key.as_ref().unwrap() {
        Key::Route(d) => format!("route:{d}"),
        Key::Vtep(k) => format!("vtep:{}:{}", k.node, k.family),
        Key::LocalVtep(f) => format!("local:{f}"),
        Key::NatPool(c) => format!("pool:{c}"),
        Key::EndpointPolicy(i) => format!("endpoint-policy:{i}"),
        Key::PolicySet(s) => format!("policy-set:{s}"),
    }
}

impl Feed {
    /// Records a change (a new revision) and sends it to every watcher.
    fn publish(&self, upsert: Vec<DesiredItem>, remove: Vec<DesiredKey>) -> u64 {
        let mut s = self.0.lock().unwrap();
        s.revision += 1;
        for k in &remove {
            let k = key_key(k);
            s.items.remove(&k);
        }
        for i in &upsert {
            s.items.insert(item_key(i), i.clone());
        }
        let u = DataplaneUpdate {
            revision: s.revision,
            snapshot: false,
            upsert,
            remove,
        };
        s.history.push(u.clone());
        s.watchers.retain(|w| w.try_send(Ok(u.clone())).is_ok());
        s.revision
    }

    fn watches(&self) -> Vec<u64> {
        self.0.lock().unwrap().watches.clone()
    }
}

/// The feed served on a unix socket; stopping it drops every stream (bgpd gone).
struct Server {
    feed: Feed,
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    /// Keeps the runtime that serves alive.
    _rt: Arc<tokio::runtime::Runtime>,
}

impl Server {
    fn start(rt: Arc<tokio::runtime::Runtime>, socket: &Path, feed: Feed) -> Server {
        let _ = std::fs::remove_file(socket);
        let listener = {
            let _g = rt.enter();
            tokio::net::UnixListener::bind(socket).unwrap()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let svc = DataplaneServer::new(feed.clone());
        rt.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Server {
            feed,
            socket: socket.to_owned(),
            stop: Some(stop),
            _rt: rt,
        }
    }

    /// Stops serving and ends the open streams.
    fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.feed.0.lock().unwrap().watchers.clear();
        let _ = std::fs::remove_file(&self.socket);
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------------------------
// Desired items

fn route(dest: &str, kind: RouteKind, gw: &str, dev: &str, onlink: bool) -> DesiredItem {
    DesiredItem {
        item: Some(Item::Route(KernelRoute {
            destination: dest.into(),
            kind: kind as i32,
            gateway: gw.into(),
            device: dev.into(),
            onlink,
            source: "test".into(),
        })),
    }
}

fn blackhole(dest: &str) -> DesiredItem {
    route(dest, RouteKind::Blackhole, "", "", false)
}

fn workload(dest: &str, dev: &str) -> DesiredItem {
    route(dest, RouteKind::Workload, "", dev, false)
}

fn vxlan(dest: &str, tunnel: &str) -> DesiredItem {
    route(dest, RouteKind::Vxlan, tunnel, "", true)
}

fn local_vtep(underlay: &str, tunnel: &str) -> DesiredItem {
    DesiredItem {
        item: Some(Item::LocalVtep(LocalVtep {
            underlay_address: underlay.into(),
            mac: String::new(),
            tunnel_address: tunnel.into(),
            vni: 0,
            port: 0,
            mtu: 0,
        })),
    }
}

fn vtep(node: &str, underlay: &str, tunnel: &str) -> DesiredItem {
    let mac = if underlay.contains(':') {
        mac6_of(node)
    } else {
        mac_of(node)
    };
    DesiredItem {
        item: Some(Item::Vtep(Vtep {
            node: node.into(),
            underlay_address: underlay.into(),
            mac,
            tunnel_address: tunnel.into(),
        })),
    }
}

fn pool(cidr: &str, nat: bool) -> DesiredItem {
    DesiredItem {
        item: Some(Item::NatPool(NatPool {
            cidr: cidr.into(),
            nat_outgoing: nat,
        })),
    }
}

fn rm_route(dest: &str) -> DesiredKey {
    DesiredKey {
        key: Some(Key::Route(dest.into())),
    }
}

fn rm_vtep(node: &str, family: IpFamily) -> DesiredKey {
    DesiredKey {
        key: Some(Key::Vtep(VtepKey {
            node: node.into(),
            family: family.into(),
        })),
    }
}

fn rm_local(family: IpFamily) -> DesiredKey {
    DesiredKey {
        key: Some(Key::LocalVtep(family.into())),
    }
}

fn rm_pool(cidr: &str) -> DesiredKey {
    DesiredKey {
        key: Some(Key::NatPool(cidr.into())),
    }
}

/// The IPv4 VTEP MAC of a node (what routewriter derives when the stream gives none).
fn mac_of(node: &str) -> String {
    proto::mac::format_mac(&proto::mac::vtep_mac(node, IpFamily::V4))
}

/// The IPv6 VTEP MAC of a node.
fn mac6_of(node: &str) -> String {
    proto::mac::format_mac(&proto::mac::vtep_mac(node, IpFamily::V6))
}

// ---------------------------------------------------------------------------------------------
// The node: namespaces, the routewriter process, its status

const METRICS: &str = "127.0.0.1:9464";

struct Node {
    name: String,
    ns: Netns,
    dir: tempfile::TempDir,
    rw: Option<NsProcess>,
    runs: usize,
}

impl Node {
    fn new(short: &str, node_name: &str) -> Node {
        Node {
            name: node_name.to_owned(),
            ns: Netns::new(short).unwrap(),
            dir: tempfile::tempdir().unwrap(),
            rw: None,
            runs: 0,
        }
    }

    fn config(&self, socket: &Path, extra: &str) -> PathBuf {
        let path = self.dir.path().join("routewriter.toml");
        std::fs::write(
            &path,
            format!(
                "[node]\nname = \"{}\"\n[log]\nlevel = \"debug\"\n[routewriter]\nsocket = \"{}\"\n\
                 metrics_listen = \"{METRICS}\"\n{extra}",
                self.name,
                socket.display()
            ),
        )
        .unwrap();
        path
    }

    /// Starts routewriter inside the namespace; its log goes to `routewriter.<n>.log`.
    fn start(&mut self, socket: &Path, extra: &str) {
        let config = self.config(socket, extra);
        self.runs += 1;
        let log = std::fs::File::create(self.log_path(self.runs)).unwrap();
        let mut cmd = self.ns.command(lab::binary("routewriter"));
        cmd.arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("MARGAY_") {
                cmd.env_remove(k);
            }
        }
        self.rw = Some(self.ns.spawn(&mut cmd).unwrap());
    }

    fn log_path(&self, run: usize) -> PathBuf {
        self.dir.path().join(format!("routewriter.{run}.log"))
    }

    fn log(&self) -> String {
        (1..=self.runs)
            .map(|r| std::fs::read_to_string(self.log_path(r)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----- restart -----\n")
    }

    /// routewriter's `/status`, read from inside the namespace.
    fn status(&self) -> Option<serde_json::Value> {
        let body = self.http("/status")?;
        serde_json::from_str(&body).ok()
    }

    fn metrics(&self) -> String {
        self.http("/metrics").unwrap_or_default()
    }

    fn http(&self, path: &str) -> Option<String> {
        self.ns
            .run_in(|| {
                let addr: SocketAddr = METRICS.parse().unwrap();
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
                let mut out = String::new();
                s.read_to_string(&mut out).ok()?;
                out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
            })
            .ok()
            .flatten()
    }

    /// Waits until routewriter reports `revision` applied and the kernel synced.
    fn wait_synced(&self, revision: u64) -> serde_json::Value {
        let mut last = None;
        let ok = wait_until(Duration::from_secs(20), || {
            last = self.status();
            last.as_ref()
                .is_some_and(|s| s["synced"] == true && s["revision"] == revision)
        });
        assert!(
            ok,
            "routewriter did not sync to revision {revision}: {last:?}\n{}",
            self.log()
        );
        last.unwrap()
    }

    fn ip(&self, args: &[&str]) -> String {
        self.ns
            .ip(args)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.log()))
    }

    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut rw = self.rw.take()?;
        rw.signal_and_wait(libc::SIGTERM, Duration::from_secs(10))
    }
}

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Lines of iproute2 output, trimmed, sorted.
fn lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    v.sort();
    v
}

fn runtime() -> Arc<tokio::runtime::Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
    )
}

/// Node `n` (eth0 10.0.0.1/24) and peer `x` (eth0 10.0.0.2/24).
fn node_and_peer() -> (Node, Netns, VethPair) {
    let node = Node::new("n", "node-a");
    let x = Netns::new("x").unwrap();
    let veth = VethPair::new(&node.ns, "eth0", &x, "eth0").unwrap();
    node.ns
        .ip(&["addr", "add", "10.0.0.1/24", "dev", "eth0"])
        .unwrap();
    x.ip(&["addr", "add", "10.0.0.2/24", "dev", "eth0"])
        .unwrap();
    // A host has a default route; proxy ARP for 169.254.1.1 needs one.
    node.ns
        .ip(&["route", "add", "default", "via", "10.0.0.2"])
        .unwrap();
    (node, x, veth)
}

/// A pod namespace with `eth0` = `addr`/32 behind `cali` in the node, default via 169.254.1.1
/// (the CNI plugin's wiring).
fn pod(node: &Netns, short: &str, cali: &str, addr: &str) -> (Netns, VethPair) {
    let p = Netns::new(short).unwrap();
    let veth = VethPair::new(node, cali, &p, "eth0").unwrap();
    p.ip(&["addr", "add", &format!("{addr}/32"), "dev", "eth0"])
        .unwrap();
    p.ip(&[
        "route",
        "add",
        "169.254.1.1",
        "dev",
        "eth0",
        "scope",
        "link",
    ])
    .unwrap();
    p.ip(&[
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
    ])
    .unwrap();
    (p, veth)
}

/// One TCP connection from namespace `from` to `to_addr:port` served in `to`; the source
/// address the listener saw.
fn tcp_peer(from: &Netns, to: &Netns, to_addr: IpAddr, port: u16) -> Result<IpAddr, String> {
    let listener = to
        .run_in(|| TcpListener::bind((to_addr, port)))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    listener.set_nonblocking(false).unwrap();
    let accept = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().map_err(|e| e.to_string())?;
        let _ = s.write_all(b"hi");
        Ok::<_, String>(peer)
    });
    let connected = from
        .run_in(|| {
            let mut s = TcpStream::connect_timeout(
                &SocketAddr::from((to_addr, port)),
                Duration::from_secs(3),
            )
            .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 2];
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s.read_exact(&mut buf).map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        })
        .map_err(|e| e.to_string())?;
    if let Err(e) = connected {
        // Unblock the accept with a local connection so the thread ends.
        let _ = to.run_in(|| TcpStream::connect((to_addr, port)));
        let _ = accept.join();
        return Err(e);
    }
    Ok(accept.join().unwrap()?.ip())
}

// ---------------------------------------------------------------------------------------------
// IPv6 on the test topology

/// Adds fd00:10::1/64 to the node's eth0 and fd00:10::2/64 to the peer's (no DAD: nothing
/// else is on the link), and waits for both ends' link-local addresses to be usable; the
/// peer's link-local address.
fn dual_stack(node: &Node, x: &Netns) -> String {
    for (ns, addr) in [(&node.ns, "fd00:10::1/64"), (x, "fd00:10::2/64")] {
        ns.ip(&["-6", "addr", "add", addr, "dev", "eth0", "nodad"])
            .unwrap();
    }
    let mut peer_ll = None;
    let ready = wait_until(Duration::from_secs(10), || {
        let settled = [&node.ns, x].iter().all(|ns| {
            ns.ip(&["-6", "addr", "show", "dev", "eth0"])
                .is_ok_and(|a| !a.contains("tentative") && a.contains("fe80:"))
        });
        peer_ll = lab::link6::link_local(x, "eth0");
        settled && peer_ll.is_some()
    });
    assert!(ready, "IPv6 on the test link did not settle");
    peer_ll.unwrap()
}

/// [`pod`] with an IPv6 address too: `addr6`/128 on the pod's eth0, default via fe80::1, the
/// host end's link-local address (as Calico pods reach their gateway).
fn pod_dual(node: &Netns, short: &str, cali: &str, addr: &str, addr6: &str) -> (Netns, VethPair) {
    let (p, veth) = pod(node, short, cali, addr);
    node.ip(&["-6", "addr", "add", "fe80::1/64", "dev", cali, "nodad"])
        .unwrap();
    p.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{addr6}/128"),
        "dev",
        "eth0",
        "nodad",
    ])
    .unwrap();
    p.ip(&[
        "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
    ])
    .unwrap();
    (p, veth)
}

/// `ip -6 route show proto 80`, lines sorted.
fn routes6(node: &Node) -> Vec<String> {
    lines(&node.ip(&["-6", "route", "show", "proto", "80"]))
}

fn fdb(node: &Node, dev: &str) -> Vec<String> {
    lines(
        &node
            .ns
            .exec("bridge", &["fdb", "show", "dev", dev])
            .unwrap_or_default(),
    )
}

fn neigh6(node: &Node, dev: &str) -> Vec<String> {
    lines(
        &node
            .ns
            .ip(&["-6", "neigh", "show", "dev", dev, "nud", "permanent"])
            .unwrap_or_default(),
    )
}

// ---------------------------------------------------------------------------------------------
// One family's addresses, so that one test body serves both families

/// What a test that runs once per family needs of the family: its names in iproute2, nft and
/// the device, and the addresses of the test topologies (node `n`/`na` first, its peer
/// `x`/`nb` second).
struct Fam {
    /// iproute2's family flag.
    ip: &'static str,
    /// nft's table family and its set element type.
    nft: &'static str,
    nft_type: &'static str,
    /// The VXLAN device of the family, and of the other family.
    device: &'static str,
    other_device: &'static str,
    /// Whether routewriter's NAT table of the family goes with the family's last pool (the
    /// IPv4 one stays while NAT is on, as nodes have always had it).
    table_goes_with_last_pool: bool,
    /// The uplink addresses and their prefix length.
    uplink: [&'static str; 2],
    uplink_len: u8,
    /// A pod pool, and a second pool.
    pools: [&'static str; 2],
    /// The two nodes' blocks, their tunnel addresses, and the pods: two on the first node,
    /// one on the second.
    blocks: [&'static str; 2],
    tunnels: [&'static str; 2],
    pods: [&'static str; 3],
}

const V4: Fam = Fam {
    ip: "-4",
    nft: "ip",
    nft_type: "ipv4_addr",
    device: "vxlan.calico",
    other_device: "vxlan-v6.calico",
    table_goes_with_last_pool: false,
    uplink: ["10.0.0.1", "10.0.0.2"],
    uplink_len: 24,
    pools: ["10.65.0.0/16", "10.70.0.0/16"],
    blocks: ["10.65.0.0/26", "10.65.1.0/26"],
    tunnels: ["10.65.0.0", "10.65.1.0"],
    pods: ["10.65.0.5", "10.65.0.6", "10.65.1.5"],
};

const V6: Fam = Fam {
    ip: "-6",
    nft: "ip6",
    nft_type: "ipv6_addr",
    device: "vxlan-v6.calico",
    other_device: "vxlan.calico",
    table_goes_with_last_pool: true,
    uplink: ["fd00:10::1", "fd00:10::2"],
    uplink_len: 64,
    pools: ["fd00:20::/48", "fd00:30::/48"],
    blocks: ["fd00:20::/122", "fd00:20::40/122"],
    tunnels: ["fd00:20::1", "fd00:20::41"],
    pods: ["fd00:20::5", "fd00:20::6", "fd00:20::45"],
};

impl Fam {
    fn is_v6(&self) -> bool {
        self.ip == "-6"
    }

    /// Pod `i`'s address as a host route destination (/32 or /128).
    fn host(&self, i: usize) -> String {
        format!("{}/{}", self.pods[i], if self.is_v6() { 128 } else { 32 })
    }

    fn addr(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Pod `i` behind `cali`: an IPv4 pod, or for IPv6 a dual-stack one (IPv4 alongside, as
    /// Calico's dual-stack pods are).
    fn pod(&self, node: &Netns, short: &str, cali: &str, i: usize) -> (Netns, VethPair) {
        if self.is_v6() {
            pod_dual(node, short, cali, V4.pods[i], self.pods[i])
        } else {
            pod(node, short, cali, self.pods[i])
        }
    }

    /// `nft list table <family> margay`.
    fn nat_table(&self, node: &Node) -> Result<String, String> {
        node.ns
            .exec("nft", &["list", "table", self.nft, "margay"])
            .map_err(|e| e.to_string())
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

/// Every route kind, the VXLAN device, its FDB and neighbour entries, exactly as iproute2
/// shows them; the workload interface's sysctls and forwarding.
#[test]
fn every_route_kind_as_iproute2_shows_it() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let (_p, _pv) = pod(&node.ns, "p", "cali0123456789a", "10.65.0.5");
    let feed = Feed::default();
    feed.publish(
        vec![
            pool("10.65.0.0/16", true),
            local_vtep("10.0.0.1", "10.65.0.0"),
            vtep("node-b", "10.0.0.3", "10.65.2.0"),
            blackhole("10.65.0.0/26"),
            workload("10.65.0.5/32", "cali0123456789a"),
            route("10.65.1.0/26", RouteKind::Gateway, "10.0.0.2", "eth0", true),
            vxlan("10.65.2.0/26", "10.65.2.0"),
            route("10.65.3.0/26", RouteKind::Gateway, "10.0.0.2", "", false),
        ],
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "");
    let status = node.wait_synced(1);
    assert_eq!(status["routes_failing"], 0, "{status}");

    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines(
            "10.65.0.5 dev cali0123456789a scope link\n\
             10.65.1.0/26 via 10.0.0.2 dev eth0 onlink\n\
             10.65.2.0/26 via 10.65.2.0 dev vxlan.calico onlink\n\
             10.65.3.0/26 via 10.0.0.2 dev eth0\n\
             blackhole 10.65.0.0/26"
        ),
        "{}",
        node.log()
    );
    let link = node.ip(&["-d", "link", "show", "vxlan.calico"]);
    let mac = mac_of("node-a");
    assert!(link.contains("mtu 1450 "), "uplink 1500 - 50: {link}");
    assert!(link.contains(&format!("link/ether {mac} ")), "{link}");
    assert!(
        link.contains("vxlan id 4096 local 10.0.0.1 dev eth0 srcport 0 0 dstport 4789 nolearning"),
        "{link}"
    );
    assert!(link.contains(",UP,"), "{link}");
    let addr = node.ip(&["-4", "addr", "show", "dev", "vxlan.calico"]);
    assert!(addr.contains("inet 10.65.0.0/32 "), "{addr}");
    let fdb = node
        .ns
        .exec("bridge", &["fdb", "show", "dev", "vxlan.calico"])
        .unwrap();
    assert_eq!(
        lines(&fdb),
        vec![format!("{} dst 10.0.0.3 self permanent", mac_of("node-b"))]
    );
    let neigh = node.ip(&["neigh", "show", "dev", "vxlan.calico"]);
    assert_eq!(
        lines(&neigh),
        vec![format!("10.65.2.0 lladdr {} PERMANENT", mac_of("node-b"))]
    );
    for (path, want) in [
        ("/proc/sys/net/ipv4/ip_forward", "1"),
        ("/proc/sys/net/ipv4/conf/cali0123456789a/proxy_arp", "1"),
        ("/proc/sys/net/ipv4/conf/cali0123456789a/forwarding", "1"),
        (
            "/proc/sys/net/ipv4/conf/cali0123456789a/route_localnet",
            "1",
        ),
        ("/proc/sys/net/ipv4/neigh/cali0123456789a/proxy_delay", "0"),
    ] {
        assert_eq!(node.ns.exec("cat", &[path]).unwrap().trim(), want, "{path}");
    }
    let m = node.metrics();
    assert!(
        m.contains("routewriter_routes{family=\"ipv4\",kind=\"vxlan\"} 1\n"),
        "{m}"
    );
    assert!(
        m.contains("routewriter_routes{family=\"ipv4\",kind=\"gateway\"} 2\n"),
        "{m}"
    );
    assert!(
        m.contains("routewriter_routes{family=\"ipv6\",kind=\"gateway\"} 0\n"),
        "{m}"
    );
    // Nothing of IPv6 is desired: no IPv6 NAT table, IPv6 forwarding left as it was.
    assert!(
        node.ns
            .exec("nft", &["list", "table", "ip6", "margay"])
            .is_err()
    );
    assert_eq!(
        node.stop().map(|s| s.success()),
        Some(true),
        "SIGTERM exits 0"
    );
}

/// Changes after the snapshot are applied as they come: a new gateway, a removal, a new VTEP,
/// a moved VTEP, and the device's MTU from the stream.
#[test]
fn changes_follow_the_stream() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let feed = Feed::default();
    feed.publish(
        vec![
            local_vtep("10.0.0.1", "10.65.0.0"),
            vtep("node-b", "10.0.0.3", "10.65.2.0"),
            vxlan("10.65.2.0/26", "10.65.2.0"),
            route("10.65.1.0/26", RouteKind::Gateway, "10.0.0.2", "eth0", true),
            blackhole("10.65.0.0/26"),
        ],
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "resync_interval_s = 600\n");
    node.wait_synced(1);
    feed.publish(
        vec![
            route("10.65.1.0/26", RouteKind::Gateway, "10.0.0.3", "eth0", true),
            vtep("node-c", "10.0.0.4", "10.65.3.0"),
            vxlan("10.65.3.0/26", "10.65.3.0"),
            vtep("node-b", "10.0.0.5", "10.65.2.0"),
        ],
        vec![rm_route("10.65.0.0/26")],
    );
    let mut local = match local_vtep("10.0.0.1", "10.65.0.0").item {
        Some(Item::LocalVtep(l)) => l,
        _ => unreachable!(),
    };
    local.mtu = 1400;
    let rev = feed.publish(
        vec![DesiredItem {
            item: Some(Item::LocalVtep(local)),
        }],
        vec![],
    );
    node.wait_synced(rev);
    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines(
            "10.65.1.0/26 via 10.0.0.3 dev eth0 onlink\n\
             10.65.2.0/26 via 10.65.2.0 dev vxlan.calico onlink\n\
             10.65.3.0/26 via 10.65.3.0 dev vxlan.calico onlink"
        ),
        "{}",
        node.log()
    );
    let fdb = node
        .ns
        .exec("bridge", &["fdb", "show", "dev", "vxlan.calico"])
        .unwrap();
    assert_eq!(
        lines(&fdb),
        lines(&format!(
            "{} dst 10.0.0.5 self permanent\n{} dst 10.0.0.4 self permanent",
            mac_of("node-b"),
            mac_of("node-c")
        ))
    );
    assert!(
        node.ip(&["link", "show", "vxlan.calico"])
            .contains("mtu 1400 ")
    );
    // Everything went: nothing of ours is left (the device goes with the local VTEP).
    let rev = feed.publish(
        vec![],
        vec![
            rm_route("10.65.1.0/26"),
            rm_route("10.65.2.0/26"),
            rm_route("10.65.3.0/26"),
            rm_local(IpFamily::V4),
        ],
    );
    node.wait_synced(rev);
    assert_eq!(node.ip(&["route", "show", "proto", "80"]).trim(), "");
    assert!(
        node.ns.ip(&["link", "show", "vxlan.calico"]).is_err(),
        "device removed"
    );
}

/// Drift made by hand is repaired through the netlink watch (the periodic resync is 10
/// minutes away): a deleted route, a changed next hop (with and without protocol 80), a
/// deleted FDB entry, a deleted neighbour, the device's MTU, the device itself, and a stray
/// route of our protocol.
#[test]
fn drift_is_repaired_at_once() {
    let (node, _x, _uplink) = node_and_peer();
    let items = vec![
        local_vtep("10.0.0.1", "10.65.0.0"),
        vtep("node-b", "10.0.0.3", "10.65.2.0"),
        vxlan("10.65.2.0/26", "10.65.2.0"),
        route("10.65.1.0/26", RouteKind::Gateway, "10.0.0.2", "eth0", true),
        blackhole("10.65.0.0/26"),
    ];
    let b = mac_of("node-b");
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("delete a route", vec!["ip", "route", "del", "10.65.1.0/26"]),
        (
            "change a next hop, keeping proto 80",
            vec![
                "ip",
                "route",
                "change",
                "10.65.1.0/26",
                "via",
                "10.0.0.9",
                "dev",
                "eth0",
                "onlink",
                "proto",
                "80",
            ],
        ),
        (
            "change a next hop by hand (proto boot)",
            vec![
                "ip",
                "route",
                "replace",
                "10.65.2.0/26",
                "via",
                "10.0.0.9",
                "dev",
                "eth0",
                "onlink",
            ],
        ),
        (
            "replace a blackhole",
            vec![
                "ip",
                "route",
                "replace",
                "unreachable",
                "10.65.0.0/26",
                "proto",
                "80",
            ],
        ),
        (
            "add a stray route of our protocol",
            vec![
                "ip",
                "route",
                "add",
                "10.99.0.0/24",
                "via",
                "10.0.0.2",
                "proto",
                "80",
            ],
        ),
        (
            "delete the FDB entry",
            vec![
                "bridge",
                "fdb",
                "del",
                &b,
                "dev",
                "vxlan.calico",
                "dst",
                "10.0.0.3",
                "self",
            ],
        ),
        (
            "delete the neighbour entry",
            vec!["ip", "neigh", "del", "10.65.2.0", "dev", "vxlan.calico"],
        ),
    ];
    assert_drift_repaired(node, items, &V4, 1450, "10.99.0.0", &cases);
}

/// Serves `items` to routewriter, then makes each case's drift by hand, and then the device's
/// (its MTU, its state, the device itself), and waits for the netlink watch to repair it (the periodic resync is 10 minutes away): the family's routes of protocol 80 and the device's FDB and
/// neighbour entries as they were after the first sync, the device up with its `mtu`; the
/// stray route of our protocol (to `stray`) gone after each case; and every kind of object
/// counted as corrected.
fn assert_drift_repaired(
    mut node: Node,
    items: Vec<DesiredItem>,
    f: &Fam,
    mtu: u32,
    stray: &str,
    cases: &[(&str, Vec<&str>)],
) {
    let rt = runtime();
    let feed = Feed::default();
    feed.publish(items, vec![]);
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "resync_interval_s = 600\n");
    node.wait_synced(1);
    let node = &node;
    let routes = |n: &Node| lines(&n.ip(&[f.ip, "route", "show", "proto", "80"]));
    let neigh = |n: &Node| {
        lines(
            &n.ns
                .ip(&[f.ip, "neigh", "show", "dev", f.device, "nud", "permanent"])
                .unwrap_or_default(),
        )
    };
    let want_routes = routes(node);
    assert_eq!(want_routes.len(), 3, "{want_routes:?}\n{}", node.log());
    let want_fdb = fdb(node, f.device);
    let want_neigh = neigh(node);
    assert_eq!((want_fdb.len(), want_neigh.len()), (1, 1));
    let device_ok = format!("mtu {mtu} ");
    // The device's own drift, the same for each family.
    let device_cases = [
        (
            "set the device's MTU",
            vec!["ip", "link", "set", f.device, "mtu", "1400"],
        ),
        (
            "take the device down",
            vec!["ip", "link", "set", f.device, "down"],
        ),
        ("delete the device", vec!["ip", "link", "del", f.device]),
    ];
    for (what, c) in cases.iter().chain(&device_cases) {
        let before = node.metrics();
        node.ns
            .exec(c[0], &c[1..])
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let started = Instant::now();
        let repaired = wait_until(Duration::from_secs(5), || {
            routes(node) == want_routes
                && fdb(node, f.device) == want_fdb
                && neigh(node) == want_neigh
                && node
                    .ns
                    .ip(&["link", "show", f.device])
                    .is_ok_and(|l| l.contains(&device_ok) && l.contains(",UP,"))
        });
        assert!(
            repaired,
            "{what}: not repaired\nroutes: {:?}\nfdb: {:?}\nneigh: {:?}\nbefore:\n{before}\n{}",
            routes(node),
            fdb(node, f.device),
            neigh(node),
            node.log()
        );
        eprintln!("{what}: repaired in {:?}", started.elapsed());
        // Nothing else of ours: the stray route is gone too.
        assert!(!node.ip(&[f.ip, "route"]).contains(stray), "{what}");
    }
    let m = node.metrics();
    for object in ["route", "fdb", "neigh", "device"] {
        assert!(
            m.contains(&format!(
                "routewriter_corrections_total{{object=\"{object}\"}}"
            )),
            "{object}: {m}"
        );
    }
}

/// Routes of other protocols stay, also inside the pools' range and across resyncs and
/// snapshots; the same for other tables.
#[test]
fn routes_of_other_protocols_are_left_alone() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let foreign = [
        vec![
            "route",
            "add",
            "10.65.0.128/26",
            "via",
            "10.0.0.2",
            "proto",
            "static",
        ],
        vec!["route", "add", "10.65.0.7/32", "dev", "eth0"],
        vec![
            "route",
            "add",
            "10.65.1.0/26",
            "via",
            "10.0.0.2",
            "metric",
            "100",
            "proto",
            "bird",
        ],
        vec![
            "route",
            "add",
            "10.65.5.0/26",
            "via",
            "10.0.0.2",
            "table",
            "100",
            "proto",
            "80",
        ],
        vec![
            "route",
            "add",
            "blackhole",
            "10.66.0.0/24",
            "proto",
            "static",
        ],
    ];
    for args in &foreign {
        node.ip(args);
    }
    let before_static = node.ip(&["route", "show", "proto", "static"]);
    let before_all = node.ip(&["route", "show", "table", "all"]);
    let feed = Feed::default();
    feed.publish(
        vec![
            blackhole("10.65.0.0/26"),
            route("10.65.1.0/26", RouteKind::Gateway, "10.0.0.2", "eth0", true),
        ],
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "resync_interval_s = 1\n");
    node.wait_synced(1);
    // Several periodic resyncs and a change.
    let rev = feed.publish(
        vec![blackhole("10.65.9.0/26")],
        vec![rm_route("10.65.0.0/26")],
    );
    node.wait_synced(rev);
    let resyncs = |n: &Node| {
        n.status()
            .map(|s| s["resyncs"].as_u64().unwrap_or(0))
            .unwrap_or(0)
    };
    let start = resyncs(&node);
    assert!(
        wait_until(Duration::from_secs(10), || resyncs(&node) >= start + 3),
        "{}",
        node.log()
    );
    assert_eq!(
        node.ip(&["route", "show", "proto", "static"]),
        before_static
    );
    let after_all = node.ip(&["route", "show", "table", "all"]);
    for line in before_all.lines() {
        if line.contains("proto 80") && !line.contains("table 100") {
            continue; // ours
        }
        assert!(
            after_all.contains(line),
            "foreign route gone: {line}\n{after_all}"
        );
    }
    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines("10.65.1.0/26 via 10.0.0.2 dev eth0 onlink\nblackhole 10.65.9.0/26")
    );
}

/// SIGTERM leaves everything in place; a restart with nothing changed makes no write at all
/// (counted by routewriter, and `ip monitor` sees no event).
#[test]
fn restart_with_nothing_changed_writes_nothing() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let (_p, _pv) = pod(&node.ns, "p", "cali0123456789a", "10.65.0.5");
    let feed = Feed::default();
    feed.publish(
        vec![
            pool("10.65.0.0/16", true),
            pool("10.70.0.0/16", false),
            local_vtep("10.0.0.1", "10.65.0.0"),
            vtep("node-b", "10.0.0.3", "10.65.2.0"),
            vtep("node-c", "10.0.0.4", "10.65.3.0"),
            vxlan("10.65.2.0/26", "10.65.2.0"),
            vxlan("10.65.3.0/26", "10.65.3.0"),
            blackhole("10.65.0.0/26"),
            workload("10.65.0.5/32", "cali0123456789a"),
            route("10.65.1.0/26", RouteKind::Gateway, "10.0.0.2", "eth0", true),
        ],
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "");
    let first = node.wait_synced(1);
    assert!(first["netlink_writes"].as_u64().unwrap() > 0, "{first}");
    assert!(first["nft_writes"].as_u64().unwrap() > 0, "{first}");
    let state = |n: &Node| {
        (
            n.ip(&["route", "show", "proto", "80"]),
            n.ip(&["-d", "link", "show", "vxlan.calico"]),
            n.ns.exec("bridge", &["fdb", "show", "dev", "vxlan.calico"])
                .unwrap(),
            n.ip(&["neigh", "show", "dev", "vxlan.calico"]),
            n.ns.exec("nft", &["list", "table", "ip", "margay"])
                .unwrap(),
        )
    };
    let before = state(&node);
    assert_eq!(
        node.stop().map(|s| s.success()),
        Some(true),
        "{}",
        node.log()
    );
    assert_eq!(state(&node), before, "SIGTERM left everything in place");

    // iproute2's own witnesses: IPv4 routes, links, neighbours, addresses, and the FDB.
    // (IPv4 only: the kernel's IPv6 autoconfiguration of the test's links may finish now.)
    let seen = restart_watched(
        &mut node,
        &socket,
        &["ip", "-4", "monitor", "route", "link", "neigh", "address"],
    );
    let events: Vec<&String> = seen
        .iter()
        .filter(|l| !l.contains("inet6") && !l.contains("fe80:"))
        .collect();
    assert!(
        events.iter().all(|l| l.trim().is_empty()),
        "iproute2 saw changes during the restart: {events:?}"
    );
    assert_eq!(state(&node), before);
}

/// Starts routewriter again (the caller stopped it) under iproute2's witnesses, `ip_monitor`
/// and `bridge monitor fdb`, and checks that the second sync wrote nothing by routewriter's
/// own count (no netlink message, nft transaction or sysctl value); the lines the monitors
/// printed meanwhile.
fn restart_watched(node: &mut Node, socket: &Path, ip_monitor: &[&str]) -> Vec<String> {
    let watch = |node: &Node, args: &[&str], file: &str| {
        let log = node.dir.path().join(file);
        let mut cmd = node.ns.command(args[0]);
        cmd.args(&args[1..])
            .stdout(std::fs::File::create(&log).unwrap());
        (node.ns.spawn(&mut cmd).unwrap(), log)
    };
    let (mut ip_mon, ip_log) = watch(node, ip_monitor, "ip.log");
    let (mut fdb_mon, fdb_log) = watch(node, &["bridge", "monitor", "fdb"], "fdb.log");
    std::thread::sleep(Duration::from_millis(300));
    node.start(socket, "");
    let second = node.wait_synced(1);
    std::thread::sleep(Duration::from_millis(500));
    ip_mon.signal_and_wait(libc::SIGTERM, Duration::from_secs(5));
    fdb_mon.signal_and_wait(libc::SIGTERM, Duration::from_secs(5));
    for counter in ["netlink_writes", "nft_writes", "sysctl_writes"] {
        assert_eq!(
            second[counter],
            0,
            "{counter} after a restart: {second}\n{}",
            node.log()
        );
    }
    [ip_log, fdb_log]
        .iter()
        .flat_map(|log| {
            std::fs::read_to_string(log)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// natOutgoing, per family: a pod reaches an outside namespace as the node's address; pod to
/// pod keeps the pod's address; a pool change updates set elements and leaves the rule alone;
/// natOutgoing off empties the masquerade set (and the outside, with no route back, cannot
/// answer); the pools gone remove the `ip6` table and leave the `ip` one (which stays while NAT
/// is on), and the other family's table is left as it was.
#[test]
fn nat_outgoing_masquerades_to_the_outside_only() {
    nat_outgoing_masquerades(&V4);
}

#[test]
fn nat_outgoing_masquerades_ipv6_to_the_outside_only() {
    nat_outgoing_masquerades(&V6);
}

fn nat_outgoing_masquerades(f: &Fam) {
    let rt = runtime();
    let (mut node, x, _uplink) = node_and_peer();
    if f.is_v6() {
        dual_stack(&node, &x);
    }
    let (p1, _v1) = f.pod(&node.ns, "p1", "cali1111111111a", 0);
    let (p2, _v2) = f.pod(&node.ns, "p2", "cali2222222222b", 1);
    let feed = Feed::default();
    feed.publish(
        vec![
            pool(f.pools[0], true),
            blackhole(f.blocks[0]),
            workload(&f.host(0), "cali1111111111a"),
            workload(&f.host(1), "cali2222222222b"),
        ],
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "");
    node.wait_synced(1);
    let other = if f.is_v6() { &V4 } else { &V6 };
    let other_table = other.nat_table(&node).ok();
    let table = f.nat_table(&node).unwrap();
    assert!(
        table.contains(&format!("elements = {{ {} }}", f.pools[0])),
        "{table}"
    );
    assert!(
        table.contains("type nat hook postrouting priority srcnat; policy accept;"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "{0} saddr @masq-pools {0} daddr != @all-pools masquerade fully-random",
            f.nft
        )),
        "{table}"
    );
    let outside = Fam::addr(f.uplink[1]);
    assert_eq!(
        tcp_peer(&p1, &x, outside, 8080),
        Ok(Fam::addr(f.uplink[0])),
        "{}",
        node.log()
    );
    assert_eq!(
        tcp_peer(&p1, &p2, Fam::addr(f.pods[1]), 8081),
        Ok(Fam::addr(f.pods[0]))
    );
    // A pool change, natOutgoing off: set elements change, the rule (its handle) does not.
    let handle = |n: &Node| {
        let t =
            n.ns.exec(
                "nft",
                &["-a", "list", "chain", f.nft, "margay", "nat-outgoing"],
            )
            .unwrap();
        t.lines()
            .find(|l| l.contains("masquerade"))
            .and_then(|l| l.rsplit("# handle ").next().map(str::to_owned))
            .unwrap()
    };
    let h = handle(&node);
    let rev = feed.publish(
        vec![pool(f.pools[1], false), pool(f.pools[0], false)],
        vec![],
    );
    node.wait_synced(rev);
    let table = f.nat_table(&node).unwrap();
    // nft wraps long IPv6 element lists onto more lines.
    let words = table.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains(&format!("{}, {}", f.pools[0], f.pools[1])),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "set masq-pools {{\n\t\ttype {}\n\t\tflags interval\n\t}}",
            f.nft_type
        )),
        "{table}"
    );
    assert_eq!(handle(&node), h);
    // natOutgoing off: the outside sees the pod's address, and cannot answer it (no route
    // back), so the connection fails.
    assert!(tcp_peer(&p1, &x, outside, 8082).is_err());
    let rev = feed.publish(vec![], vec![rm_pool(f.pools[0]), rm_pool(f.pools[1])]);
    node.wait_synced(rev);
    assert_eq!(
        f.nat_table(&node).is_err(),
        f.table_goes_with_last_pool,
        "the ip6 table goes with the last IPv6 pool, the ip one stays"
    );
    assert_eq!(
        other.nat_table(&node).ok(),
        other_table,
        "the other family's table is left as it was"
    );
}

/// IPIP routes fail with a message that names the missing kernel feature; everything else
/// is programmed all the same.
#[test]
fn ipip_routes_fail_clearly_and_the_rest_works() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let feed = Feed::default();
    feed.publish(
        vec![
            blackhole("10.65.0.0/26"),
            route("10.65.4.0/26", RouteKind::Ipip, "10.0.0.2", "", true),
            route("10.65.1.0/26", RouteKind::Gateway, "10.0.0.2", "eth0", true),
            // IPIP has no IPv6: refused as bad input, not as a missing kernel feature.
            route("fd00:20::40/122", RouteKind::Ipip, "fd00:10::2", "", true),
        ],
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "");
    let status = node.wait_synced(1);
    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines("10.65.1.0/26 via 10.0.0.2 dev eth0 onlink\nblackhole 10.65.0.0/26")
    );
    let err = status["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains(
            "kernel has no ipip support (module ipip): pools in IPIP mode cannot be programmed"
        ),
        "{status}"
    );
    assert_eq!(status["routes_unsupported"]["ipip"], 1, "{status}");
    assert_eq!(status["items_rejected"], 1, "{status}");
    assert!(
        node.log().contains(
            "route fd00:20::40/122 (test): IPIP carries IPv4 only: an IPv6 pool needs VXLAN or no encapsulation"
        ),
        "{}",
        node.log()
    );
    assert_eq!(node.ip(&["-6", "route", "show", "proto", "80"]).trim(), "");
    assert!(
        node.log()
            .contains("kernel has no ipip support (module ipip)")
    );
    let m = node.metrics();
    assert!(
        m.contains("routewriter_routes_unsupported{feature=\"ipip\"} 1"),
        "{m}"
    );
    // The operator's view: `routewriter status` asks the running agent.
    let config = node.dir.path().join("routewriter.toml");
    let shown = node
        .ns
        .exec(
            lab::binary("routewriter").to_str().unwrap(),
            &["--config", config.to_str().unwrap(), "status"],
        )
        .unwrap();
    assert!(shown.contains("synced              yes"), "{shown}");
    assert!(shown.contains("unsupported: ipip 1"), "{shown}");
    assert!(shown.contains("kernel has no ipip support"), "{shown}");
    // bgpctl shows the same, asking the same listener.
    let text = std::fs::read_to_string(&config).unwrap();
    let listen = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("metrics_listen = "))
        .expect("the test config sets metrics_listen")
        .trim_matches('"')
        .to_owned();
    let via_bgpctl = node
        .ns
        .exec(
            lab::binary("bgpctl").to_str().unwrap(),
            &["routewriter", "--address", &listen],
        )
        .unwrap();
    assert_eq!(via_bgpctl, shown);
}

/// A route the kernel refuses fails alone, is reported with its reason, and is retried with
/// backoff until the kernel takes it.
#[test]
fn a_refused_route_fails_alone_and_is_retried() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let feed = Feed::default();
    feed.publish(
        vec![
            blackhole("10.65.0.0/26"),
            // 192.0.2.1 is not reachable and the route is not onlink: the kernel refuses it.
            route(
                "10.65.7.0/26",
                RouteKind::Gateway,
                "192.0.2.1",
                "eth0",
                false,
            ),
            route("10.65.1.0/26", RouteKind::Gateway, "10.0.0.2", "eth0", true),
        ],
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "resync_interval_s = 600\n");
    let status = node.wait_synced(1);
    assert_eq!(status["routes_failing"], 1, "{status}");
    let example = status["failing_examples"][0]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        example.contains("10.65.7.0/26") && example.contains("192.0.2.1"),
        "{status}"
    );
    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines("10.65.1.0/26 via 10.0.0.2 dev eth0 onlink\nblackhole 10.65.0.0/26")
    );
    assert!(node.log().contains("kernel refused route 10.65.7.0/26"));
    // Make the gateway reachable: a retry takes it.
    node.ip(&["addr", "add", "192.0.2.10/24", "dev", "eth0"]);
    let ok = wait_until(Duration::from_secs(20), || {
        node.ip(&["route", "show", "proto", "80"])
            .contains("10.65.7.0/26 via 192.0.2.1 dev eth0")
    });
    assert!(ok, "{}", node.log());
    assert!(wait_until(Duration::from_secs(5), || node
        .status()
        .is_some_and(|s| s["routes_failing"] == 0)));
}

/// Without bgpd nothing is written (not even before the first snapshot); when bgpd goes
/// away the kernel keeps its state; routewriter reconnects with backoff and resumes from the
/// last revision it had (the server sees that revision, and sends only what followed).
#[test]
fn bgpd_away_keeps_the_kernel_and_resume_is_from_the_last_revision() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    // A route of ours from an earlier life: without a snapshot it must stay.
    node.ip(&[
        "route",
        "add",
        "10.65.8.0/26",
        "via",
        "10.0.0.2",
        "proto",
        "80",
    ]);
    let socket = node.dir.path().join("bgpd.sock");
    node.start(&socket, "reconnect_max_ms = 400\n");
    assert!(wait_until(Duration::from_secs(10), || node
        .status()
        .is_some()));
    std::thread::sleep(Duration::from_millis(800));
    let s = node.status().unwrap();
    assert_eq!(s["netlink_writes"], 0, "{s}");
    assert_eq!(s["stream_connected"], false);
    assert!(
        node.ip(&["route", "show", "proto", "80"])
            .contains("10.65.8.0/26")
    );

    let feed = Feed::default();
    feed.publish(vec![blackhole("10.65.0.0/26")], vec![]);
    feed.publish(vec![blackhole("10.65.9.0/26")], vec![]);
    let mut server = Server::start(rt.clone(), &socket, feed.clone());
    node.wait_synced(2);
    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines("blackhole 10.65.0.0/26\nblackhole 10.65.9.0/26"),
        "the snapshot decides: the old route goes"
    );
    server.stop();
    assert!(wait_until(Duration::from_secs(5), || node
        .status()
        .is_some_and(|s| s["stream_connected"] == false)));
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines("blackhole 10.65.0.0/26\nblackhole 10.65.9.0/26"),
        "bgpd away: the kernel keeps its state"
    );
    // Changes made while routewriter was away arrive after the reconnect.
    feed.publish(
        vec![blackhole("10.65.10.0/26")],
        vec![rm_route("10.65.9.0/26")],
    );
    let rev = feed.publish(vec![blackhole("10.65.11.0/26")], vec![]);
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.wait_synced(rev);
    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines("blackhole 10.65.0.0/26\nblackhole 10.65.10.0/26\nblackhole 10.65.11.0/26")
    );
    let watches = feed.watches();
    assert_eq!(watches.first(), Some(&0), "{watches:?}");
    assert_eq!(
        watches.last(),
        Some(&2),
        "resumed from the last revision: {watches:?}"
    );
    let s = node.status().unwrap();
    assert!(s["stream_reconnects"].as_u64().unwrap() >= 1, "{s}");
}

/// The periodic resync repairs what the netlink watch cannot see (nftables) at the latest.
#[test]
fn resync_repairs_nat_drift() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let feed = Feed::default();
    feed.publish(
        vec![pool("10.65.0.0/16", true), blackhole("10.65.0.0/26")],
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "resync_interval_s = 1\n");
    node.wait_synced(1);
    let want = node
        .ns
        .exec("nft", &["list", "table", "ip", "margay"])
        .unwrap();
    for drift in [
        vec!["flush", "set", "ip", "margay", "masq-pools"],
        vec!["flush", "chain", "ip", "margay", "nat-outgoing"],
        vec!["delete", "table", "ip", "margay"],
    ] {
        node.ns.exec("nft", &drift).unwrap();
        let ok = wait_until(Duration::from_secs(5), || {
            node.ns
                .exec("nft", &["list", "table", "ip", "margay"])
                .ok()
                .as_deref()
                == Some(want.as_str())
        });
        assert!(ok, "{drift:?} not repaired\n{}", node.log());
    }
    // Counted once each (the counter moves just after the table is right again).
    let counted = wait_until(Duration::from_secs(3), || {
        node.metrics()
            .contains("routewriter_corrections_total{object=\"nat\"} 3")
    });
    assert!(counted, "{}", node.metrics());
}

/// Two nodes, each with its own routewriter and feed, carry pod traffic over VXLAN, per
/// family (IPv6 over `vxlan-v6.calico` with an IPv6 underlay): the device, FDB, neighbour
/// entries and onlink routes are right enough for the kernel to use them; no VTEP of the
/// other family desired, no device of the other family.
#[test]
fn vxlan_carries_pod_traffic_between_two_nodes() {
    vxlan_carries_pod_traffic(&V4);
}

#[test]
fn vxlan_v6_carries_pod_traffic_between_two_nodes() {
    vxlan_carries_pod_traffic(&V6);
}

fn vxlan_carries_pod_traffic(f: &Fam) {
    let rt = runtime();
    let mut a = Node::new("na", "node-a");
    let mut b = Node::new("nb", "node-b");
    let _uplink = VethPair::new(&a.ns, "eth0", &b.ns, "eth0").unwrap();
    for (n, i) in [(&a, 0), (&b, 1)] {
        n.ip(&[
            "addr",
            "add",
            &format!("{}/24", V4.uplink[i]),
            "dev",
            "eth0",
        ]);
        if f.is_v6() {
            let addr = format!("{}/{}", f.uplink[i], f.uplink_len);
            n.ip(&["-6", "addr", "add", &addr, "dev", "eth0", "nodad"]);
        }
    }
    // No default route between the nodes (pod traffic must take the tunnel); proxy ARP for
    // the pods' gateway needs a route to it that is not through the pod's interface.
    for n in [&a, &b] {
        n.ip(&[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ]);
    }
    let (pa, _va) = f.pod(&a.ns, "pa", "caliaaaaaaaaaaa", 0);
    let (pb, _vb) = f.pod(&b.ns, "pb", "calibbbbbbbbbbb", 2);
    // Each node's items: its own VTEP, block and pod, the other's VTEP and block.
    let items = |me: usize, pod: usize, cali: &str, peer: &str| {
        let other = 1 - me;
        vec![
            local_vtep(f.uplink[me], f.tunnels[me]),
            vtep(peer, f.uplink[other], f.tunnels[other]),
            blackhole(f.blocks[me]),
            workload(&f.host(pod), cali),
            vxlan(f.blocks[other], f.tunnels[other]),
        ]
    };
    let fa = Feed::default();
    fa.publish(items(0, 0, "caliaaaaaaaaaaa", "node-b"), vec![]);
    let fb = Feed::default();
    fb.publish(items(1, 2, "calibbbbbbbbbbb", "node-a"), vec![]);
    let sa = a.dir.path().join("bgpd.sock");
    let sb = b.dir.path().join("bgpd.sock");
    let _servera = Server::start(rt.clone(), &sa, fa);
    let _serverb = Server::start(rt.clone(), &sb, fb);
    a.start(&sa, "");
    b.start(&sb, "");
    a.wait_synced(1);
    b.wait_synced(1);
    assert_eq!(
        tcp_peer(&pa, &pb, Fam::addr(f.pods[2]), 9000),
        Ok(Fam::addr(f.pods[0])),
        "{}\n{}",
        a.log(),
        b.log()
    );
    // The tunnel carried it: the only way between the pods' blocks.
    let stats: serde_json::Value =
        serde_json::from_str(&a.ip(&["-j", "-s", "link", "show", f.device])).unwrap();
    assert!(
        stats[0]["stats64"]["tx"]["packets"].as_u64().unwrap() > 0,
        "{stats}"
    );
    // No VTEP of the other family desired: no device of the other family.
    assert!(a.ns.ip(&["link", "show", f.other_device]).is_err());
}

/// A bad configuration is refused with the field and the fix, before anything is touched.
#[test]
fn a_bad_configuration_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rw.toml");
    std::fs::write(&path, "[node]\nname = \"n\"\n[routewriter]\nprotocol = 3\n").unwrap();
    let out = Command::new(lab::binary("routewriter"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("routewriter.protocol") && err.contains("exclusive"),
        "{err}"
    );
}

/// A large snapshot converges once: the notifications of routewriter's own writes (which
/// overflow the watch) cause a resync that finds nothing to do, not a loop of writes.
#[test]
fn a_large_snapshot_converges_once() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let n = 20_000u32;
    let feed = Feed::default();
    feed.publish(
        (0..n)
            .map(|i| {
                let a = Ipv4Addr::from(0x0A80_0000 + (i << 6));
                route(
                    &format!("{a}/26"),
                    RouteKind::Gateway,
                    "10.0.0.2",
                    "eth0",
                    true,
                )
            })
            .collect(),
        vec![],
    );
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "nat = false\n");
    let s = node.wait_synced(1);
    let writes = s["netlink_writes"].as_u64().unwrap();
    assert_eq!(writes, u64::from(n), "{s}");
    std::thread::sleep(Duration::from_secs(2));
    let s = node.status().unwrap();
    assert_eq!(
        s["netlink_writes"].as_u64().unwrap(),
        writes,
        "no writes after convergence: {s}"
    );
    assert_eq!(
        node.ip(&["route", "show", "proto", "80"]).lines().count(),
        n as usize
    );
    // Drift is still repaired after the storm.
    node.ip(&["route", "del", "10.128.0.64/26"]);
    assert!(wait_until(Duration::from_secs(5), || node
        .ip(&["route", "show", "10.128.0.64/26"])
        .contains("via 10.0.0.2")));
}

/// The CNI plugin writes a pod's route (protocol 80) before bgpd desires it: routewriter
/// leaves routes on a new workload interface alone for a grace period, keeps the one bgpd
/// then desires, and removes the one nobody desires once the grace has passed.
#[test]
fn a_new_pods_route_gets_a_grace_period() {
    let rt = runtime();
    let (mut node, _x, _uplink) = node_and_peer();
    let feed = Feed::default();
    feed.publish(vec![blackhole("10.65.0.0/26")], vec![]);
    let socket = node.dir.path().join("bgpd.sock");
    let _server = Server::start(rt.clone(), &socket, feed.clone());
    node.start(&socket, "workload_grace_s = 2\n");
    node.wait_synced(1);
    let (_pa, _va) = pod(&node.ns, "pa", "caliaaaaaaaaaaa", "10.65.0.5");
    let (_pb, _vb) = pod(&node.ns, "pb", "calibbbbbbbbbbb", "10.65.0.6");
    // What the CNI plugin does at ADD.
    for (addr, dev) in [
        ("10.65.0.5", "caliaaaaaaaaaaa"),
        ("10.65.0.6", "calibbbbbbbbbbb"),
    ] {
        node.ip(&[
            "route", "add", addr, "dev", dev, "proto", "80", "scope", "link",
        ]);
    }
    std::thread::sleep(Duration::from_millis(700));
    let routes = node.ip(&["route", "show", "proto", "80"]);
    assert!(
        routes.contains("10.65.0.5 dev caliaaaaaaaaaaa")
            && routes.contains("10.65.0.6 dev calibbbbbbbbbbb"),
        "{routes}"
    );
    let rev = feed.publish(vec![workload("10.65.0.5/32", "caliaaaaaaaaaaa")], vec![]);
    node.wait_synced(rev);
    let gone = wait_until(Duration::from_secs(8), || {
        !node
            .ip(&["route", "show", "proto", "80"])
            .contains("10.65.0.6")
    });
    assert!(gone, "{}", node.log());
    assert_eq!(
        lines(&node.ip(&["route", "show", "proto", "80"])),
        lines("10.65.0.5 dev caliaaaaaaaaaaa scope link\nblackhole 10.65.0.0/26")
    );
}

// ---------------------------------------------------------------------------------------------
// IPv6 and both families at once

/// The items of a dual-stack node `node-a` (fd00:10::1, VTEP fd00:20::1) with a remote
/// node-b (fd00:10::3, fd00:20::81): every IPv6 route kind beside the IPv4 ones, both VTEPs
/// of each family, pools of both families with natOutgoing. `peer_ll` is the peer's
/// link-local address, the gateway of a route via a link-local next hop.
fn dual_stack_items(peer_ll: &str) -> Vec<DesiredItem> {
    vec![
        pool("10.65.0.0/16", true),
        pool("fd00:20::/48", true),
        local_vtep("10.0.0.1", "10.65.0.0"),
        local_vtep("fd00:10::1", "fd00:20::1"),
        vtep("node-b", "10.0.0.3", "10.65.2.0"),
        vtep("node-b", "fd00:10::3", "fd00:20::81"),
        blackhole("10.65.0.0/26"),
        workload("10.65.0.5/32", "cali0123456789a"),
        vxlan("10.65.2.0/26", "10.65.2.0"),
        blackhole("fd00:20::/122"),
        workload("fd00:20::5/128", "cali0123456789a"),
        route(
            "fd00:20::40/122",
            RouteKind::Gateway,
            "fd00:10::2",
            "",
            false,
        ),
        route(
            "fd00:20::c0/122",
            RouteKind::Gateway,
            peer_ll,
            "eth0",
            false,
        ),
        vxlan("fd00:20::80/122", "fd00:20::81"),
    ]
}

/// What keeps a dual-stack test's set-up alive beside its node: the Dataplane server (dropped
/// first, before the node), its feed, the pod, the peer and the runtime.
struct DualStack {
    _server: Server,
    feed: Feed,
    socket: PathBuf,
    /// The peer's link-local address.
    peer_ll: String,
    _pod: (Netns, VethPair),
    _uplink: VethPair,
    _x: Netns,
    _rt: Arc<tokio::runtime::Runtime>,
}

/// Node `n` and peer `x` with IPv6 on their link, a dual-stack pod `p` behind
/// `cali0123456789a`, and a Dataplane server serving [`dual_stack_items`]; routewriter not
/// started yet.
fn dual_stack_node() -> (Node, DualStack) {
    let rt = runtime();
    let (node, x, uplink) = node_and_peer();
    let peer_ll = dual_stack(&node, &x);
    let pod = pod_dual(&node.ns, "p", "cali0123456789a", "10.65.0.5", "fd00:20::5");
    let feed = Feed::default();
    feed.publish(dual_stack_items(&peer_ll), vec![]);
    let socket = node.dir.path().join("bgpd.sock");
    let server = Server::start(rt.clone(), &socket, feed.clone());
    let rest = DualStack {
        _server: server,
        feed,
        socket,
        peer_ll,
        _pod: pod,
        _uplink: uplink,
        _x: x,
        _rt: rt,
    };
    (node, rest)
}

/// Both families in one snapshot: every IPv6 route kind lands with protocol 80 at metric 1024
/// beside the IPv4 routes; `vxlan-v6.calico` runs over the uplink found by the node's IPv6
/// address, with MTU uplink − 70, the tunnel address as /128, and the remote IPv6 VTEP's FDB
/// and neighbour entries; IPv6 forwarding, the workload's IPv6 sysctls and the IPv6 NAT
/// table are set; metrics and status count per family.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one dual-stack node checked as iproute2 shows it, then the IPv6 side removed while the IPv4 side stays; the two halves share the node"
)]
fn both_families_as_iproute2_shows_them() {
    let (mut node, ds) = dual_stack_node();
    node.start(&ds.socket, "");
    let peer_ll = &ds.peer_ll;
    let status = node.wait_synced(1);
    assert_eq!(status["routes_failing"], 0, "{status}\n{}", node.log());
    assert_eq!(status["items_rejected"], 0, "{status}");

    assert_eq!(
        routes6(&node),
        lines(&format!(
            "blackhole fd00:20::/122 dev lo metric 1024 pref medium\n\
             fd00:20::5 dev cali0123456789a metric 1024 pref medium\n\
             fd00:20::40/122 via fd00:10::2 dev eth0 metric 1024 pref medium\n\
             fd00:20::80/122 via fd00:20::81 dev vxlan-v6.calico metric 1024 onlink pref medium\n\
             fd00:20::c0/122 via {peer_ll} dev eth0 metric 1024 pref medium"
        )),
        "{}",
        node.log()
    );
    assert_eq!(
        lines(&node.ip(&["-4", "route", "show", "proto", "80"])),
        lines(
            "10.65.0.5 dev cali0123456789a scope link\n\
             10.65.2.0/26 via 10.65.2.0 dev vxlan.calico onlink\n\
             blackhole 10.65.0.0/26"
        )
    );
    // The IPv6 device beside the IPv4 one, each with its own MAC, MTU and entries.
    let link6 = node.ip(&["-d", "link", "show", "vxlan-v6.calico"]);
    assert!(link6.contains("mtu 1430 "), "uplink 1500 - 70: {link6}");
    assert!(
        link6.contains(&format!("link/ether {} ", mac6_of("node-a"))),
        "{link6}"
    );
    assert!(
        link6.contains(
            "vxlan id 4096 local fd00:10::1 dev eth0 srcport 0 0 dstport 4789 nolearning"
        ),
        "{link6}"
    );
    assert!(link6.contains(",UP,"), "{link6}");
    let link4 = node.ip(&["-d", "link", "show", "vxlan.calico"]);
    assert!(link4.contains("mtu 1450 "), "{link4}");
    assert!(
        link4.contains(&format!("link/ether {} ", mac_of("node-a"))),
        "{link4}"
    );
    let addr6 = node.ip(&[
        "-6",
        "addr",
        "show",
        "dev",
        "vxlan-v6.calico",
        "scope",
        "global",
    ]);
    assert!(
        addr6.contains("inet6 fd00:20::1/128 scope global"),
        "{addr6}"
    );
    assert_eq!(
        addr6.matches("inet6 ").count(),
        1,
        "only the tunnel address: {addr6}"
    );
    assert_eq!(
        fdb(&node, "vxlan-v6.calico"),
        vec![format!(
            "{} dst fd00:10::3 self permanent",
            mac6_of("node-b")
        )]
    );
    assert_eq!(
        neigh6(&node, "vxlan-v6.calico"),
        vec![format!(
            "fd00:20::81 lladdr {} PERMANENT",
            mac6_of("node-b")
        )]
    );
    assert_eq!(
        fdb(&node, "vxlan.calico"),
        vec![format!("{} dst 10.0.0.3 self permanent", mac_of("node-b"))]
    );
    for (path, want) in [
        ("/proc/sys/net/ipv4/ip_forward", "1"),
        ("/proc/sys/net/ipv6/conf/all/forwarding", "1"),
        ("/proc/sys/net/ipv6/conf/cali0123456789a/proxy_ndp", "1"),
        ("/proc/sys/net/ipv6/conf/cali0123456789a/forwarding", "1"),
        ("/proc/sys/net/ipv6/conf/cali0123456789a/accept_dad", "0"),
        ("/proc/sys/net/ipv4/conf/cali0123456789a/proxy_arp", "1"),
    ] {
        assert_eq!(node.ns.exec("cat", &[path]).unwrap().trim(), want, "{path}");
    }
    let nat6 = node
        .ns
        .exec("nft", &["list", "table", "ip6", "margay"])
        .unwrap();
    assert!(nat6.contains("elements = { fd00:20::/48 }"), "{nat6}");
    assert!(
        nat6.contains("ip6 saddr @masq-pools ip6 daddr != @all-pools masquerade fully-random"),
        "{nat6}"
    );
    let nat4 = node
        .ns
        .exec("nft", &["list", "table", "ip", "margay"])
        .unwrap();
    assert!(nat4.contains("elements = { 10.65.0.0/16 }"), "{nat4}");
    let m = node.metrics();
    for (family, kind, n) in [
        ("ipv6", "blackhole", 1),
        ("ipv6", "workload", 1),
        ("ipv6", "gateway", 2),
        ("ipv6", "vxlan", 1),
        ("ipv4", "vxlan", 1),
        ("ipv4", "gateway", 0),
    ] {
        let line = format!("routewriter_routes{{family=\"{family}\",kind=\"{kind}\"}} {n}\n");
        assert!(m.contains(&line), "{line}{m}");
    }
    assert!(m.contains("routewriter_vteps{family=\"ipv6\"} 1\n"), "{m}");
    let s = node.status().unwrap();
    assert_eq!(
        s["vxlan_devices"],
        serde_json::json!(["vxlan.calico", "vxlan-v6.calico"]),
        "{s}"
    );
    let config = node.dir.path().join("routewriter.toml");
    let shown = node
        .ns
        .exec(
            lab::binary("routewriter").to_str().unwrap(),
            &["--config", config.to_str().unwrap(), "status"],
        )
        .unwrap();
    assert!(
        shown.contains("routes by family    ipv4 3, ipv6 5"),
        "{shown}"
    );
    assert!(
        shown.contains("vxlan devices       vxlan.calico, vxlan-v6.calico"),
        "{shown}"
    );

    // The IPv6 side goes away; the IPv4 side stays as it was.
    let rev = ds.feed.publish(
        vec![],
        vec![
            rm_route("fd00:20::/122"),
            rm_route("fd00:20::5/128"),
            rm_route("fd00:20::40/122"),
            rm_route("fd00:20::c0/122"),
            rm_route("fd00:20::80/122"),
            rm_vtep("node-b", IpFamily::V6),
            rm_local(IpFamily::V6),
            rm_pool("fd00:20::/48"),
        ],
    );
    node.wait_synced(rev);
    assert_eq!(routes6(&node), Vec::<String>::new());
    assert!(node.ns.ip(&["link", "show", "vxlan-v6.calico"]).is_err());
    assert!(
        node.ns
            .exec("nft", &["list", "table", "ip6", "margay"])
            .is_err()
    );
    assert_eq!(
        lines(&node.ip(&["-4", "route", "show", "proto", "80"])).len(),
        3
    );
    assert_eq!(fdb(&node, "vxlan.calico").len(), 1);
}

/// IPv6 drift made by hand is repaired through the netlink watch: routes (deleted, changed,
/// replaced by another protocol, a stray one of ours), the IPv6 device's FDB and neighbour
/// entries, its MTU, its state, the device itself.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of hand-made IPv6 drifts (routes, FDB, neighbours, MTU, state, the device), each one repaired in turn"
)]
fn ipv6_drift_is_repaired_at_once() {
    let (node, x, _uplink) = node_and_peer();
    dual_stack(&node, &x);
    let items = vec![
        local_vtep("fd00:10::1", "fd00:20::1"),
        vtep("node-b", "fd00:10::3", "fd00:20::81"),
        vxlan("fd00:20::80/122", "fd00:20::81"),
        route(
            "fd00:20::40/122",
            RouteKind::Gateway,
            "fd00:10::2",
            "eth0",
            false,
        ),
        blackhole("fd00:20::/122"),
    ];
    let b = mac6_of("node-b");
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "delete a route",
            vec!["ip", "-6", "route", "del", "fd00:20::40/122"],
        ),
        (
            "change a next hop, keeping proto 80",
            vec![
                "ip",
                "-6",
                "route",
                "change",
                "fd00:20::40/122",
                "via",
                "fd00:10::9",
                "dev",
                "eth0",
                "proto",
                "80",
            ],
        ),
        (
            "change a next hop by hand (proto boot)",
            vec![
                "ip",
                "-6",
                "route",
                "replace",
                "fd00:20::80/122",
                "via",
                "fd00:10::9",
                "dev",
                "eth0",
            ],
        ),
        (
            "replace a blackhole",
            vec![
                "ip",
                "-6",
                "route",
                "replace",
                "unreachable",
                "fd00:20::/122",
                "proto",
                "80",
            ],
        ),
        (
            "add a stray route of our protocol",
            vec![
                "ip",
                "-6",
                "route",
                "add",
                "fd00:99::/64",
                "via",
                "fd00:10::2",
                "proto",
                "80",
            ],
        ),
        (
            "delete the FDB entry",
            vec![
                "bridge",
                "fdb",
                "del",
                &b,
                "dev",
                "vxlan-v6.calico",
                "dst",
                "fd00:10::3",
                "self",
            ],
        ),
        (
            "delete the neighbour entry",
            vec![
                "ip",
                "-6",
                "neigh",
                "del",
                "fd00:20::81",
                "dev",
                "vxlan-v6.calico",
            ],
        ),
    ];
    assert_drift_repaired(node, items, &V6, 1430, "fd00:99::", &cases);
}

/// A restart with both families in place writes nothing: no netlink message, nft transaction
/// or sysctl value (counted by routewriter), and iproute2's monitors of both families see no
/// change to anything of routewriter's.
#[test]
fn a_dual_stack_restart_writes_nothing() {
    let (mut node, ds) = dual_stack_node();
    node.start(&ds.socket, "");
    let first = node.wait_synced(1);
    assert!(first["netlink_writes"].as_u64().unwrap() > 0, "{first}");
    let state = |n: &Node| {
        (
            n.ip(&["route", "show", "proto", "80"]),
            routes6(n),
            n.ip(&["-d", "link", "show", "vxlan-v6.calico"]),
            n.ip(&[
                "-6",
                "addr",
                "show",
                "dev",
                "vxlan-v6.calico",
                "scope",
                "global",
            ]),
            fdb(n, "vxlan-v6.calico"),
            neigh6(n, "vxlan-v6.calico"),
            fdb(n, "vxlan.calico"),
            n.ns.exec("nft", &["list", "table", "ip6", "margay"])
                .unwrap(),
            n.ns.exec("nft", &["list", "table", "ip", "margay"])
                .unwrap(),
        )
    };
    let before = state(&node);
    assert_eq!(
        node.stop().map(|s| s.success()),
        Some(true),
        "{}",
        node.log()
    );
    // Let the kernel's own IPv6 work on the new device (its link-local address) finish.
    std::thread::sleep(Duration::from_secs(2));
    let seen = restart_watched(
        &mut node,
        &ds.socket,
        &["ip", "monitor", "route", "link", "neigh", "address"],
    );
    // What routewriter owns: routes of its protocol, addresses and neighbours of the pools,
    // its devices, FDB entries with a remote. (The kernel's link-local and multicast
    // bookkeeping is not routewriter's.)
    let ours = |l: &str| {
        !l.contains("fe80")
            && !l.contains("ff0")
            && !l.starts_with("33:33:")
            && (l.contains("proto 80")
                || l.contains("fd00:20:")
                || l.contains("10.65.")
                || l.contains("vxlan")
                || l.contains(" dst "))
    };
    let events: Vec<&String> = seen.iter().filter(|l| ours(l)).collect();
    assert!(
        events.is_empty(),
        "iproute2 saw routewriter's objects change during the restart: {events:?}"
    );
    assert_eq!(state(&node), before);
}
