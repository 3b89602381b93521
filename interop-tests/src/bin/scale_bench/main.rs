//! `scale_bench`: the node-to-node mesh at scale, bgpd against BIRD 1.6 configured the way
//! Calico's confd configures it (issue #10).
//!
//! Why this file is long: one benchmark run end to end for both implementations: set-up, the
//! convergence and idle measurements, the table.
//!
//! For each N and each implementation, in fresh namespaces (see `lab::mesh`: N nodes on one
//! bridge, 10.77.0.0/16, four /26 blocks each of 172.20.0.0/16, a /14 beyond 256 nodes), it
//! starts one daemon per node and measures:
//! - converge s: from just before the first daemon is started until every node holds every
//!   other node's blocks (4N−4), polled per node every `--poll-ms` over kept connections
//!   (BIRD's control socket: `show route where net ~ [pool+] count`; bgpd's API: the Loc-RIB
//!   through Bgp.ListRoutes). The last column is the slowest single poll seen: with the poll
//!   interval, the resolution of the figure.
//! - CPU s: user + system seconds of all the daemons at convergence (start-up included).
//! - RSS MiB/node: mean VmRSS of the daemons at convergence; anon: the private anonymous
//!   part of it (RssAnon: heap and stacks, without mapped code and libraries); idle RSS: mean
//!   VmRSS again at the end of the idle measurement (what a node holds while it runs).
//! - idle CPU %/node: CPU used over `--idle-secs` with every session up, from `--settle-secs`
//!   after convergence (what ends a convergence is not idle), per node, in percent of one
//!   core, counted per thread (`procstat::ThreadTimes`). A node that lost a block meanwhile
//!   fails the run.
//!
//! BIRD 1.6 runs in the foreground (`bird -f`) with `lab::calico_bird`'s configuration, no
//! kernel protocol, logging off unless `--bird-log` (Calico's default: everything, sessions'
//! states). bgpd reads its mesh from the datastore: before the daemons start, this program
//! seeds one shared datastore (the SQLite file, or with `--store etcd` a real etcd in the
//! hub namespace) with the pool (no encapsulation), every Node (address 10.77.x.y/16) and four
//! blocks claimed and confirmed for each node (one address allocated in each, so they are
//! never reclaimed as empty). bgpd logs warnings only, to a file per node; routewriter is not
//! started.
//!
//! Everything is this run's: namespaces `mgy<pid>-*`, daemons killed by PID at the end of each
//! run, also on an error, a panic or Ctrl-C (SIGINT/SIGTERM stop the run and clean up); the
//! kernel's neighbour-table limits are raised for the run and put back.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use datastore::model::{IpPool, Node};
use interop_tests::lab;
use interop_tests::lab::calico_bird::{self, BirdCtl};
use interop_tests::lab::mesh::{self, Mesh};
use interop_tests::lab::netns::NsProcess;
use interop_tests::lab::procstat;
use ipam::allocator::Ipam;
use proto::v1 as pb;
use proto::v1::bgp_client::BgpClient;
use tonic::transport::Channel;

mod calico_rr;
mod floor;
mod kernel;
mod kube;

#[derive(Parser, Clone)]
#[command(about = "The node-to-node mesh at scale: bgpd against BIRD 1.6 as Calico runs it")]
struct Args {
    /// Node counts (2 to 1024; up to 256 the pool is 172.20.0.0/16, beyond it a /14).
    /// Default: 10,50,100,150 (rib), 10,50,100,200,300 (kernel), 10,100,300
    /// (--event-latency), 300,500,1000 (--topology rr).
    #[arg(long, value_delimiter = ',')]
    n: Vec<usize>,
    /// What "converged" is timed on: `rib`, every daemon's table polled over its control
    /// interface (no kernel programming); `kernel`, every node's kernel routing table
    /// observed over netlink from outside the daemons (routewriter with bgpd, BIRD's kernel
    /// protocol). --event-latency and --topology rr observe the kernel.
    #[arg(long, value_enum, default_value_t = Observe::Rib)]
    observe: Observe,
    /// Who peers with whom: `mesh`, the node-to-node mesh; `rr`, two route reflectors
    /// (nodes 0 and 1, one cluster id) with every other node a client of both, the mesh off.
    #[arg(long, value_enum, default_value_t = kernel::Topology::Mesh)]
    topology: kernel::Topology,
    /// On the converged mesh, claim a new block on the last node `--events` times and time
    /// claim -> route in every kernel, then its release -> route gone everywhere.
    #[arg(long)]
    event_latency: bool,
    /// Claims (and releases) per N with --event-latency.
    #[arg(long, default_value_t = 50)]
    events: usize,
    /// Pause between a claim's or release's end and the next step, milliseconds: what ends
    /// one change (BIRD re-feeding its peers after `configure`) is not the next one's.
    #[arg(long, default_value_t = 200)]
    event_gap_ms: u64,
    /// Stop a run whose machine has less than this much memory available (MiB), before
    /// the machine runs out.
    #[arg(long, default_value_t = 2048)]
    min_available_mib: u64,
    /// Seconds to measure idle CPU after convergence.
    #[arg(long, default_value_t = 60)]
    idle_secs: u64,
    /// Seconds between convergence and the idle measurement: the work that ends a
    /// convergence (the last UPDATEs, collided connections closing) is not idle.
    #[arg(long, default_value_t = 5)]
    settle_secs: u64,
    /// Implementations to run, in this order for each N. `floor` (kernel modes, not with
    /// --event-latency): no daemon, only the routes written straight into every kernel, the
    /// least this machine takes (see `floor.rs`). Default: floor,bird16,bgpd in the kernel
    /// modes, bird16,bgpd with --event-latency and in the rib mode.
    #[arg(long = "impl", value_enum, value_delimiter = ',')]
    impls: Vec<Impl>,
    /// After a kernel-observed run converged, keep its daemons running this many seconds
    /// before the teardown (to look at them: `ps`, /proc, `bgpctl`).
    #[arg(long, default_value_t = 0)]
    hold_secs: u64,
    /// Give up on one run after this many seconds without full convergence.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// Poll interval per node while waiting for convergence, milliseconds.
    #[arg(long, default_value_t = 50)]
    poll_ms: u64,
    /// bgpd's shared datastore; several (`sqlite,etcd,kubernetes`) run bgpd once on each,
    /// side by side in one table.
    #[arg(long = "store", value_enum, value_delimiter = ',', default_values_t = [StoreKind::Sqlite])]
    stores: Vec<StoreKind>,
    /// The datastore of the run under way (one of `stores`).
    #[arg(skip)]
    store: StoreKind,
    /// BIRD with Calico's default logging (everything to a file, sessions' states) instead
    /// of none.
    #[arg(long)]
    bird_log: bool,
    /// Keep each run's directory (the daemons' logs and configurations) and say where; a
    /// failed run's is always kept.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Impl {
    Bgpd,
    #[value(name = "bird16")]
    Bird16,
    Floor,
}

impl Impl {
    /// The name in the table: one word, so the table splits on white space.
    fn name(self) -> &'static str {
        match self {
            Impl::Bgpd => "bgpd",
            Impl::Bird16 => "BIRD1.6",
            Impl::Floor => "floor",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Observe {
    Rib,
    Kernel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
enum StoreKind {
    #[default]
    Sqlite,
    Etcd,
    Kubernetes,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Etcd => "etcd",
            StoreKind::Kubernetes => "kube",
        }
    }
}

/// The runs of one N: each implementation, bgpd once per datastore; with the arguments of
/// that run (`store` set).
fn runs(args: &Args) -> Vec<(Impl, Args)> {
    let mut runs = Vec::new();
    for &imp in &args.impls {
        let stores: &[StoreKind] = if imp == Impl::Bgpd {
            &args.stores
        } else {
            &args.stores[..1]
        };
        for &store in stores {
            let mut a = args.clone();
            a.store = store;
            runs.push((imp, a));
        }
    }
    runs
}

/// A row's name: the implementation, and bgpd's datastore when several are compared.
fn label(imp: Impl, store: StoreKind, args: &Args) -> String {
    if imp == Impl::Bgpd && args.stores.len() > 1 {
        format!("{}/{}", imp.name(), store.name())
    } else {
        imp.name().to_owned()
    }
}

/// Set by SIGINT/SIGTERM; every wait checks it and the run unwinds, cleaning up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn interrupted() -> Result<(), String> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

/// Sleeps `d`, waking early (with an error) on SIGINT/SIGTERM.
fn sleep_interruptible(d: Duration) -> Result<(), String> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        interrupted()?;
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(100)));
    }
    interrupted()
}

struct Row {
    n: usize,
    imp: Impl,
    converge: Duration,
    cpu_s: f64,
    rss_mib: f64,
    anon_mib: f64,
    idle_rss_mib: f64,
    idle_pct: f64,
    poll_max: Duration,
}

/// How to ask one node how many other nodes' blocks it holds, over a kept connection.
enum Probe {
    Bird {
        socket: PathBuf,
        pool: &'static str,
        ctl: Option<BirdCtl>,
    },
    Bgpd {
        socket: PathBuf,
        pool: &'static str,
        own: Vec<ipnet::Ipv4Net>,
        client: Option<BgpClient<Channel>>,
    },
}

impl Probe {
    /// Blocks of other nodes the node holds; `None` while it cannot be asked (starting up).
    async fn others(&mut self) -> Option<usize> {
        match self {
            Probe::Bird { socket, pool, ctl } => {
                if ctl.is_none() {
                    *ctl = BirdCtl::connect(socket).await.ok();
                }
                match ctl.as_mut()?.networks_in(pool).await {
                    // Its own blocks are static routes, there from the start.
                    Ok(n) => Some(n.saturating_sub(mesh::BLOCKS_PER_NODE)),
                    Err(_) => {
                        *ctl = None;
                        None
                    }
                }
            }
            Probe::Bgpd {
                socket,
                pool,
                own,
                client,
            } => {
                if client.is_none() {
                    *client = proto::client::connect_unix(socket)
                        .await
                        .ok()
                        .map(BgpClient::new);
                }
                match loc_rib_others(client.as_mut()?, pool, own).await {
                    Ok(n) => Some(n),
                    Err(_) => {
                        *client = None;
                        None
                    }
                }
            }
        }
    }
}

/// Prefixes of the pool in bgpd's Loc-RIB that are not the node's own blocks: a count query
/// (what `birdc show route ... count` is for BIRD), so that polling does not make bgpd format
/// its whole table hundreds of times and charge that to its convergence.
async fn loc_rib_others(
    client: &mut BgpClient<Channel>,
    pool: &str,
    own: &[ipnet::Ipv4Net],
) -> Result<usize, tonic::Status> {
    let mut stream = client
        .list_routes(pb::ListRoutesRequest {
            table: pb::RouteTable::LocRib.into(),
            peer: String::new(),
            prefix: pool.into(),
            limit: 0,
            count_only: true,
        })
        .await?
        .into_inner();
    let mut count = 0u64;
    while let Some(batch) = stream.message().await? {
        count += batch.count;
    }
    // The node's own blocks are always in its Loc-RIB (originated there).
    Ok(usize::try_from(count)
        .unwrap_or(usize::MAX)
        .saturating_sub(own.len()))
}

/// What polling one node found: when it held everything (since t0), its last count, and the
/// slowest single poll.
struct Polled {
    probe: Probe,
    done: Option<Duration>,
    last: Option<usize>,
    slowest: Duration,
}

async fn poll_node(
    mut probe: Probe,
    want: usize,
    t0: Instant,
    timeout: Duration,
    every: Duration,
) -> Polled {
    let mut slowest = Duration::ZERO;
    let mut last = None;
    loop {
        let q = Instant::now();
        let got = probe.others().await;
        slowest = slowest.max(q.elapsed());
        last = got.or(last);
        if got.is_some_and(|c| c >= want) {
            return Polled {
                probe,
                done: Some(t0.elapsed()),
                last,
                slowest,
            };
        }
        if t0.elapsed() > timeout || INTERRUPTED.load(Ordering::SeqCst) {
            return Polled {
                probe,
                done: None,
                last,
                slowest,
            };
        }
        tokio::time::sleep(every.saturating_sub(q.elapsed())).await;
    }
}

/// Polls every node until all hold `want` other blocks; (time to the last, slowest poll).
fn converge(
    rt: &tokio::runtime::Runtime,
    probes: &mut Vec<Probe>,
    want: usize,
    t0: Instant,
    args: &Args,
    imp: Impl,
) -> Result<(Duration, Duration), String> {
    let timeout = Duration::from_secs(args.timeout_s);
    let every = Duration::from_millis(args.poll_ms);
    let polled: Vec<Polled> = rt.block_on(async {
        let tasks: Vec<_> = probes
            .drain(..)
            .map(|p| tokio::spawn(poll_node(p, want, t0, timeout, every)))
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            match t.await {
                Ok(p) => out.push(p),
                Err(e) => return Err(format!("a poller failed: {e}")),
            }
        }
        Ok(out)
    })?;
    let slowest = polled.iter().map(|p| p.slowest).max().unwrap_or_default();
    let done: Vec<Duration> = polled.iter().filter_map(|p| p.done).collect();
    let last_counts: Vec<Option<usize>> = polled.iter().map(|p| p.last).collect();
    let converged_all = done.len() == polled.len();
    let at = done.iter().max().copied().unwrap_or_default();
    probes.extend(polled.into_iter().map(|p| p.probe));
    interrupted()?;
    if converged_all {
        return Ok((at, slowest));
    }
    let n = last_counts.len();
    let (worst, count) = last_counts
        .iter()
        .enumerate()
        .min_by_key(|(_, c)| c.unwrap_or(0))
        .map(|(i, c)| (i, *c))
        .unwrap_or((0, None));
    let held = count.map_or("could not be asked".into(), |c| {
        format!("holds {c} of {want}")
    });
    let mut msg = format!(
        "{}: {} of {n} nodes hold all {want} other blocks after {} s ({} {held})",
        imp.name(),
        done.len(),
        args.timeout_s,
        mesh::node_name(worst),
    );
    if imp == Impl::Bgpd && last_counts.iter().all(|c| c.unwrap_or(0) == 0) {
        msg.push_str(
            "; no bgpd learned a single block: this bgpd build has no node-to-node mesh \
             (sessions from the registered nodes and origination of confirmed blocks) yet",
        );
    }
    Err(msg)
}

/// The daemons of one run, killed by PID together (SIGKILL: no Cease to wait for) on drop.
struct Daemons(Vec<NsProcess>);

impl Daemons {
    fn pids(&self) -> Vec<i32> {
        self.0.iter().map(NsProcess::pid).collect()
    }

    /// The first daemon that has exited, with how.
    fn exited(&mut self) -> Option<(usize, std::process::ExitStatus)> {
        self.0
            .iter_mut()
            .enumerate()
            .find_map(|(i, p)| p.try_wait().map(|s| (i, s)))
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for pid in self.pids() {
            // SAFETY: kill(2) of a daemon this run started (dropping NsProcess reaps it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Starts one Calico-configured BIRD 1.6 per node.
fn start_bird(mesh: &Mesh, dir: &Path, bird_log: bool) -> Result<(Daemons, Vec<Probe>), String> {
    let (bird, _) = lab::bird::binaries(lab::bird::BirdVersion::V1)?;
    let addrs: Vec<_> = mesh.nodes.iter().map(|n| n.addr).collect();
    let mut configs = Vec::new();
    for (i, node) in mesh.nodes.iter().enumerate() {
        let d = dir.join(mesh::node_name(i));
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        let log = d.join("bird.log");
        let conf = calico_bird::config(
            node.addr,
            &mesh::node_blocks(i),
            mesh::pool(mesh.nodes.len()),
            &addrs,
            bird_log.then_some(log.as_path()),
        );
        std::fs::write(d.join("bird.cfg"), conf).map_err(|e| e.to_string())?;
        configs.push(d);
    }
    let mut daemons = Daemons(Vec::new());
    let mut probes = Vec::new();
    for (node, d) in mesh.nodes.iter().zip(&configs) {
        let socket = d.join("bird.ctl");
        let mut cmd = node.ns.command(&bird);
        cmd.arg("-f")
            .arg("-c")
            .arg(d.join("bird.cfg"))
            .arg("-s")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(log_file(&d.join("bird.stderr"))?);
        daemons.0.push(
            node.ns
                .spawn(&mut cmd)
                .map_err(|e| format!("starting bird in {}: {e}", node.ns.name()))?,
        );
        probes.push(Probe::Bird {
            socket,
            pool: mesh::pool(mesh.nodes.len()),
            ctl: None,
        });
    }
    Ok((daemons, probes))
}

fn log_file(path: &Path) -> Result<std::fs::File, String> {
    std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The datastore spec for bgpd's configuration and for seeding.
fn store_spec(kind: StoreKind, dir: &Path) -> String {
    match kind {
        StoreKind::Sqlite => format!("sqlite:{}", dir.join("store.db").display()),
        StoreKind::Etcd => format!("etcd:http://{}:2379", mesh::HUB_ADDR),
        StoreKind::Kubernetes => format!("kubernetes:{}", kube::kubeconfig(dir).display()),
    }
}

/// Starts etcd in the hub namespace, on the hub's address, with its data in `dir`.
fn start_etcd(mesh: &Mesh, dir: &Path) -> Result<NsProcess, String> {
    let etcd = Path::new(lab::etcd::ETCD);
    if !etcd.exists() {
        return Err(format!(
            "{} is missing: apt-get install etcd-server",
            etcd.display()
        ));
    }
    let data = dir.join("etcd");
    let client = format!("http://{}:2379", mesh::HUB_ADDR);
    let peer = format!("http://{}:2380", mesh::HUB_ADDR);
    let mut cmd = mesh.hub.command(etcd);
    lab::etcd::member_args(&mut cmd, "bench", &data, &client, &peer);
    cmd.args(["--initial-cluster", &format!("bench={peer}")])
        .stdout(Stdio::null())
        .stderr(log_file(&dir.join("etcd.log"))?);
    mesh.hub
        .spawn(&mut cmd)
        .map_err(|e| format!("starting etcd: {e}"))
}

/// What a run's datastore holds beyond the pool, the nodes and their blocks.
#[derive(Debug, Clone, Copy, Default)]
struct SeedOptions {
    /// The first this many nodes are route reflectors of one cluster id, and the
    /// node-to-node mesh is off (0: the mesh).
    reflectors: usize,
    /// Empty blocks go back to the pool at the first garbage collection (no grace period),
    /// so a released block's withdrawal can be timed.
    no_empty_block_grace: bool,
}

/// Calico's usual route-reflector cluster id.
const RR_CLUSTER_ID: std::net::Ipv4Addr = std::net::Ipv4Addr::new(244, 0, 0, 1);

/// Writes the pool, every node and four confirmed blocks per node (one address allocated in
/// each) into the datastore, from inside the hub namespace (where etcd listens).
fn seed(mesh: &Mesh, spec: &str, opts: SeedOptions) -> Result<(), String> {
    let addrs: Vec<_> = mesh.nodes.iter().map(|node| node.addr).collect();
    let cidr = mesh::pool(addrs.len());
    let spec = spec.to_owned();
    mesh.hub
        .run_in(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                // etcd may still be electing itself.
                let deadline = Instant::now() + Duration::from_secs(20);
                let store = loop {
                    match lab::open_store(&spec).await {
                        Ok(s) => break s,
                        Err(e) if Instant::now() > deadline => {
                            return Err(format!("datastore {spec}: {e}"));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                };
                if let Some(k) = store.as_kubernetes() {
                    k.install_crds()
                        .await
                        .map_err(|e| format!("installing the CRDs: {e}"))?;
                }
                let ipam = Ipam::new(store);
                let pool = IpPool::new(
                    "default-ipv4-ippool",
                    cidr.parse().map_err(|e| format!("{cidr}: {e}"))?,
                );
                ipam.create_pool(&pool)
                    .await
                    .map_err(|e| format!("creating pool {cidr}: {e}"))?;
                if opts.reflectors > 0 {
                    let config = datastore::model::BgpConfiguration {
                        node_to_node_mesh: false,
                        ..Default::default()
                    };
                    datastore::Resources::new(ipam.store())
                        .set_bgp_configuration(&config, None)
                        .await
                        .map_err(|e| format!("turning the mesh off: {e}"))?;
                }
                if opts.no_empty_block_grace {
                    let mut config = ipam.config().await.map_err(|e| e.to_string())?;
                    config.empty_block_grace_s = 0;
                    ipam.set_config(&config)
                        .await
                        .map_err(|e| format!("setting the empty-block grace: {e}"))?;
                }
                for (i, addr) in addrs.iter().enumerate() {
                    let name = mesh::node_name(i);
                    let mut node = Node::new(&name);
                    node.ipv4 = Some(
                        ipnet::Ipv4Net::new(*addr, mesh::PREFIX_LEN).map_err(|e| e.to_string())?,
                    );
                    if i < opts.reflectors {
                        node.route_reflector_cluster_id = Some(RR_CLUSTER_ID);
                    }
                    datastore::Resources::new(ipam.store())
                        .register_node(&node, None)
                        .await
                        .map_err(|e| format!("registering {name}: {e}"))?;
                    for (k, block) in mesh::node_blocks(i).iter().enumerate() {
                        let address = std::net::IpAddr::V4(block.network());
                        ipam.assign_ip(
                            address,
                            &format!("scale-bench.{name}.{k}"),
                            &Default::default(),
                            &name,
                        )
                        .await
                        .map_err(|e| format!("claiming {block} for {name}: {e}"))?;
                    }
                }
                Ok(())
            })
        })
        .map_err(|e| format!("entering the hub namespace: {e}"))?
}

/// Writes each node's configuration file (bgpd's, with a `[routewriter]` section for a run
/// that starts routewriter on the same file, as margay-lab does): (node directory, API
/// socket) by node.
fn write_node_configs(
    mesh: &Mesh,
    dir: &Path,
    spec: &str,
) -> Result<Vec<(PathBuf, PathBuf)>, String> {
    let datastore = match spec.split_once(':') {
        Some(("sqlite", path)) => format!("[datastore]\nkind = \"sqlite\"\npath = \"{path}\"\n"),
        Some(("etcd", url)) => format!("[datastore]\nkind = \"etcd\"\nendpoints = [\"{url}\"]\n"),
        Some(("kubernetes", path)) => {
            format!("[datastore]\nkind = \"kubernetes\"\nkubeconfig = \"{path}\"\n")
        }
        _ => {
            return Err(format!(
                "{spec}: expected sqlite:PATH, etcd:URL or kubernetes:KUBECONFIG"
            ));
        }
    };
    let mut configs = Vec::new();
    for (i, node) in mesh.nodes.iter().enumerate() {
        let d = dir.join(mesh::node_name(i));
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        let socket = d.join("bgpd.sock");
        let config = format!(
            "[node]\nname = \"{}\"\naddress = \"{}/{}\"\n[api]\nsocket = \"{}\"\n{datastore}\
             [log]\nlevel = \"warn\"\n[routewriter]\nsocket = \"{}\"\nuplink = \"eth0\"\n",
            mesh::node_name(i),
            node.addr,
            mesh::PREFIX_LEN,
            socket.display(),
            socket.display()
        );
        std::fs::write(d.join("bgpd.toml"), config).map_err(|e| e.to_string())?;
        configs.push((d, socket));
    }
    Ok(configs)
}

/// `cmd` without our caller's MARGAY_ overrides: the configuration file is the whole truth.
fn without_overrides(cmd: &mut std::process::Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MARGAY_") {
            cmd.env_remove(k);
        }
    }
}

/// Starts one bgpd per node on the seeded datastore; the instant the timed start began.
fn start_bgpd(
    mesh: &Mesh,
    dir: &Path,
    spec: &str,
) -> Result<(Daemons, Vec<Probe>, Instant), String> {
    let bgpd = lab::try_binary("bgpd")?;
    let configs = write_node_configs(mesh, dir, spec)?;
    let mut daemons = Daemons(Vec::new());
    let mut probes = Vec::new();
    let t0 = Instant::now();
    for (i, (node, (d, socket))) in mesh.nodes.iter().zip(configs).enumerate() {
        let mut cmd = node.ns.command(&bgpd);
        cmd.arg("--config")
            .arg(d.join("bgpd.toml"))
            .stdout(Stdio::null())
            .stderr(log_file(&d.join("bgpd.log"))?);
        without_overrides(&mut cmd);
        daemons.0.push(
            node.ns
                .spawn(&mut cmd)
                .map_err(|e| format!("starting bgpd in {}: {e}", node.ns.name()))?,
        );
        probes.push(Probe::Bgpd {
            socket,
            pool: mesh::pool(mesh.nodes.len()),
            own: mesh::node_blocks(i),
            client: None,
        });
    }
    Ok((daemons, probes, t0))
}

/// One N, one implementation: topology, daemons, convergence, idle, teardown.
fn run_one(rt: &tokio::runtime::Runtime, args: &Args, n: usize, imp: Impl) -> Result<Row, String> {
    let mesh = Mesh::new(n)?;
    let dir = tempfile::Builder::new()
        .prefix("scale-bench-")
        .tempdir()
        .map_err(|e| format!("a temporary directory: {e}"))?;
    interrupted()?;
    let mut _etcd = None;
    let mut _kube = None;
    let t0;
    let (mut daemons, mut probes) = match imp {
        Impl::Bird16 => {
            t0 = Instant::now();
            start_bird(&mesh, dir.path(), args.bird_log)?
        }
        Impl::Floor => return Err("--impl floor observes the kernels only".into()),
        Impl::Bgpd => {
            if args.store == StoreKind::Etcd {
                _etcd = Some(start_etcd(&mesh, dir.path())?);
            }
            if args.store == StoreKind::Kubernetes {
                _kube = Some(kube::start(&mesh, dir.path())?);
            }
            let spec = store_spec(args.store, dir.path());
            seed(&mesh, &spec, SeedOptions::default())?;
            let (daemons, probes, at) = start_bgpd(&mesh, dir.path(), &spec)?;
            t0 = at;
            (daemons, probes)
        }
    };
    let want = (n - 1) * mesh::BLOCKS_PER_NODE;
    let converged = converge(rt, &mut probes, want, t0, args, imp);
    let (at, slowest) = match converged {
        Ok(c) => {
            // Said now: the row comes only after the idle minute.
            eprintln!(
                "scale_bench: N={n} {}: converged; idle for {} s",
                imp.name(),
                args.settle_secs + args.idle_secs
            );
            c
        }
        Err(e) if INTERRUPTED.load(Ordering::SeqCst) => return Err(format!("N={n}: {e}")),
        Err(e) => {
            let why = daemons.exited().map_or(String::new(), |(i, s)| {
                format!(
                    "; {} on {} exited with {s} (its log: {})",
                    imp.name(),
                    mesh::node_name(i),
                    dir.path().join(mesh::node_name(i)).display()
                )
            });
            // Keep the logs of a failed run for reading.
            let kept = dir.keep();
            return Err(format!("N={n}: {e}{why}; logs in {}", kept.display()));
        }
    };
    let pids = daemons.pids();
    let cpu_at = pids.iter().map(|&p| procstat::cpu_seconds(p)).sum::<f64>();
    let mean = |f: fn(i32) -> f64| pids.iter().map(|&p| f(p)).sum::<f64>() / n as f64;
    let rss = mean(procstat::rss_mib);
    let anon = mean(procstat::anon_rss_mib);
    sleep_interruptible(Duration::from_secs(args.settle_secs))?;
    let threads_at: Vec<_> = pids.iter().map(|&p| procstat::ThreadTimes::of(p)).collect();
    let idle = Duration::from_secs(args.idle_secs);
    sleep_interruptible(idle)?;
    // Before the check below: its polls run code an idle node does not.
    let idle_rss = mean(procstat::rss_mib);
    // Per thread: a daemon's runtime may end idle threads meanwhile (see ThreadTimes).
    let cpu_idle: f64 = pids
        .iter()
        .zip(&threads_at)
        .map(|(&p, at)| procstat::ThreadTimes::of(p).seconds_since(at))
        .sum();
    // Still all there: a mesh that converged and then flapped has not converged.
    converge(rt, &mut probes, want, Instant::now(), args, imp)
        .map_err(|e| format!("N={n}: after {} s idle: {e}", args.idle_secs))?;
    if let Some((i, s)) = daemons.exited() {
        return Err(format!(
            "N={n}: {} on {} exited with {s}",
            imp.name(),
            mesh::node_name(i)
        ));
    }
    drop(probes);
    drop(daemons);
    drop(mesh);
    if args.keep {
        eprintln!(
            "scale_bench: N={n} {}: logs in {}",
            imp.name(),
            dir.keep().display()
        );
    }
    Ok(Row {
        n,
        imp,
        converge: at,
        cpu_s: cpu_at,
        rss_mib: rss,
        anon_mib: anon,
        idle_rss_mib: idle_rss,
        idle_pct: cpu_idle / idle.as_secs_f64().max(1e-9) / n as f64 * 100.0,
        poll_max: slowest,
    })
}

fn print_table(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>5}  {:<8} {:>10} {:>8} {:>13} {:>5} {:>15} {:>8}  {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}  {:>7}",
        "N",
        "impl",
        "converge s",
        "CPU s",
        "RSS MiB/node",
        "anon",
        "idle CPU %/node",
        "idle RSS",
        "×conv",
        "×CPU",
        "×RSS",
        "×anon",
        "×idle",
        "×iRSS",
        "poll ms"
    )?;
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.imp == Impl::Bird16 && b.n == r.n && r.imp == Impl::Bgpd);
        let ratio = |a: f64, b: Option<f64>| match b {
            Some(b) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        writeln!(
            out,
            "{:>5}  {:<8} {:>10.2} {:>8.3} {:>13.1} {:>5.1} {:>15.3} {:>8.1}  {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}  {:>7.1}",
            r.n,
            r.imp.name(),
            r.converge.as_secs_f64(),
            r.cpu_s,
            r.rss_mib,
            r.anon_mib,
            r.idle_pct,
            r.idle_rss_mib,
            ratio(
                r.converge.as_secs_f64(),
                base.map(|b| b.converge.as_secs_f64())
            ),
            ratio(r.cpu_s, base.map(|b| b.cpu_s)),
            ratio(r.rss_mib, base.map(|b| b.rss_mib)),
            ratio(r.anon_mib, base.map(|b| b.anon_mib)),
            ratio(r.idle_pct, base.map(|b| b.idle_pct)),
            ratio(r.idle_rss_mib, base.map(|b| b.idle_rss_mib)),
            r.poll_max.as_secs_f64() * 1000.0,
        )?;
    }
    Ok(())
}

#[expect(
    clippy::too_many_lines,
    reason = "the benchmark driver: root and signal checks, then every N and implementation in turn with its report rows"
)]
fn main() -> ExitCode {
    let mut args = Args::parse();
    let kernel_mode = args.observe == Observe::Kernel
        || args.event_latency
        || args.topology == kernel::Topology::Rr;
    if args.n.is_empty() {
        args.n = if args.topology == kernel::Topology::Rr {
            vec![300, 500, 1000]
        } else if args.event_latency {
            vec![10, 100, 300]
        } else if kernel_mode {
            vec![10, 50, 100, 200, 300]
        } else {
            vec![10, 50, 100, 150]
        };
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("scale_bench: run as root (it creates network namespaces)");
        return ExitCode::FAILURE;
    }
    if let Some(bad) = args
        .n
        .iter()
        .find(|&&n| !(2..=mesh::MAX_NODES).contains(&n))
    {
        eprintln!(
            "scale_bench: --n {bad}: a mesh needs 2 to {} nodes",
            mesh::MAX_NODES
        );
        return ExitCode::FAILURE;
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("scale_bench: a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    lab::netns::remove_stale();
    let profile = if std::env::current_exe()
        .is_ok_and(|p| p.components().any(|c| c.as_os_str() == "release"))
    {
        "release"
    } else {
        "debug"
    };
    if args.impls.is_empty() {
        args.impls = if kernel_mode && !args.event_latency {
            vec![Impl::Floor, Impl::Bird16, Impl::Bgpd]
        } else {
            vec![Impl::Bird16, Impl::Bgpd]
        };
    }
    if args.impls.contains(&Impl::Floor) && (!kernel_mode || args.event_latency) {
        eprintln!(
            "scale_bench: --impl floor writes a converged table into the kernels: it has no \
             rib polling and no claims (use it with --observe kernel or --topology rr)"
        );
        return ExitCode::FAILURE;
    }
    if kernel_mode {
        return kernel_main(&rt, &args, profile);
    }
    println!(
        "# scale_bench: full iBGP mesh, {} blocks/node; idle {} s from {} s after convergence; poll {} ms; bgpd ({profile} build) on {:?}; BIRD 1.6 logging {}",
        mesh::BLOCKS_PER_NODE,
        args.idle_secs,
        args.settle_secs,
        args.poll_ms,
        args.stores,
        if args.bird_log {
            "as Calico (all)"
        } else {
            "off"
        }
    );
    let mut rows = Vec::new();
    let mut failed = false;
    'all: for &n in &args.n {
        for (imp, run_args) in runs(&args) {
            eprintln!(
                "scale_bench: N={n} {} ...",
                label(imp, run_args.store, &args)
            );
            match run_one(&rt, &run_args, n, imp) {
                Ok(r) => {
                    eprintln!(
                        "scale_bench: N={n} {}: converged in {:.2} s",
                        imp.name(),
                        r.converge.as_secs_f64()
                    );
                    rows.push(r);
                }
                Err(e) => {
                    eprintln!("scale_bench: {e}");
                    failed = true;
                    if INTERRUPTED.load(Ordering::SeqCst) {
                        break 'all;
                    }
                }
            }
            // Deleting hundreds of namespaces keeps the kernel busy for a while.
            if sleep_interruptible(Duration::from_millis(2000 + 20 * n as u64)).is_err() {
                failed = true;
                break 'all;
            }
        }
    }
    let _ = print_table(&mut std::io::stdout().lock(), &rows);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The kernel-observed modes: every N, both implementations alternating, one table (and the
/// claims' with --event-latency).
fn kernel_main(rt: &tokio::runtime::Runtime, args: &Args, profile: &str) -> ExitCode {
    println!(
        "# scale_bench --observe kernel: {} ({}), {} blocks/node, pool without encapsulation; \
         bgpd + routewriter ({profile} build) on {:?} vs BIRD 1.6 with Calico's kernel protocol; \
         `*`: resolution above 5% of the figure",
        match args.topology {
            kernel::Topology::Mesh => "full iBGP mesh",
            kernel::Topology::Rr => "two route reflectors, every other node a client of both",
        },
        args.topology.name_for_header(),
        mesh::BLOCKS_PER_NODE,
        args.stores,
    );
    let mut rows = Vec::new();
    let mut events = Vec::new();
    let mut failed = false;
    let mut apiservers = Vec::new();
    'all: for &n in &args.n {
        for (imp, run_args) in runs(args) {
            let name = label(imp, run_args.store, args);
            eprintln!("scale_bench: N={n} {name} (kernel) ...");
            match kernel::run(rt, &run_args, n, imp, args.event_latency) {
                Ok((mut row, ev, apiserver)) => {
                    row.label = name.clone();
                    rows.push(row);
                    events.extend(ev.map(|mut e| {
                        e.label = name.clone();
                        e
                    }));
                    apiservers.extend(apiserver);
                }
                Err(e) => {
                    eprintln!("scale_bench: {e}");
                    failed = true;
                    if INTERRUPTED.load(Ordering::SeqCst) {
                        break 'all;
                    }
                }
            }
            // Deleting hundreds of namespaces keeps the kernel busy for a while.
            if sleep_interruptible(Duration::from_millis(2000 + 20 * n as u64)).is_err() {
                failed = true;
                break 'all;
            }
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = kernel::print_kernel_table(&mut out, &rows);
    if args.event_latency {
        let _ = writeln!(
            out,
            "# --event-latency: {} claims of a new block on the last node and their releases; \
             ms from the claim (release) until every kernel has (no longer has) its route",
            args.events
        );
        let _ = kernel::print_event_table(&mut out, &mut events);
    }
    if !apiservers.is_empty() {
        let _ = kube::print_table(&mut out, &apiservers);
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
