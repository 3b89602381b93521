//! scale_bench's kernel-observed runs (issue #36): what a user waits for, a route in the
//! kernel of every node, timed from outside the daemons.
//!
//! Why this file is long: one kernel-observed run end to end for both implementations (the
//! daemons that program the kernel, the observer, convergence, the claims and releases of
//! --event-latency, the memory guard) and its two tables.
//!
//! Each run: a fresh `lab::mesh`, then `lab::kernel_observer` with one socket in every node
//! namespace (opened before any daemon starts), told that node `i` must hold every other
//! node's four blocks. Then the daemons, each started straight into its namespace (`setns`
//! before `exec`, a millisecond a process where `ip netns exec` takes several):
//! - margay: bgpd on every node (the seeded shared datastore, as the rib runs), and on each
//!   node routewriter on the same configuration file once its bgpd's API socket is there
//!   (as margay-lab starts them); routewriter writes the routes (protocol 80).
//! - Calico's way: BIRD 1.6 with the kernel protocol confd renders (`calico_rr`), the pool
//!   without encapsulation so BIRD programs the pod routes.
//!
//! converge s: from just before the first daemon is started to the arrival of the last
//! expected route in the last kernel; start s: when the last daemon had been started (both
//! inside converge). res ms: the figure's resolution, how late the observer may have stamped
//! the route that set it (see `lab::kernel_observer`); a figure whose resolution is above 5%
//! of it is marked `*`. CPU s: all the daemons' user + system
//! time at convergence; RSS MiB/node: the mean over nodes of the node's daemons' VmRSS
//! together (bgpd + routewriter, or bird), anon its RssAnon part, PSS its proportional part
//! (shared code counted once over all the nodes that map it); mem GiB: how much of the
//! machine's memory the run took at its peak (MemAvailable before the namespaces were made,
//! less its lowest during the run: daemons, namespaces, kernel routes, the observer).
//!
//! --event-latency, on the converged mesh, `--events` times: claim a new block on the last
//! node and time from the claim until every kernel (the claiming node's blackhole included)
//! has its route, then release it and time until no kernel has it. margay: `Ipam.AssignIp` of
//! an address of a free block (the claim a CNI ADD makes when the node's blocks are full),
//! then `Ipam.ReleaseByHandle` of its handle (a CNI DEL's; the datastore is seeded with no
//! empty-block grace, so the emptied block goes back to the pool with the address). Calico's
//! way: what confd does, the node's bird.cfg rendered again with the block (its static
//! blackhole and `calico_aggr`) and `configure` over BIRD's control socket; the release
//! renders it without. CPU ms/chg: the CPU time every daemon of the cluster used per claim or
//! release (all nodes share this machine's two cores, so work every node does for a change is
//! done N times over on them), and the claiming node's daemons' alone; own claim / own
//! release: the median time until the claiming node's own kernel had (no longer had) the
//! block's blackhole, the part of a change before its route leaves the node. confd's own delay
//! (its watch of the datastore, its render) is not counted: the Calico figure is a lower bound.
//!
//! A run stops (and fails) when the machine's MemAvailable falls below
//! `--min-available-mib`, before the machine runs out.

use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::ValueEnum;
use interop_tests::bench::{monotonic_ns, percentile};
use interop_tests::lab;
use interop_tests::lab::calico_bird::BirdCtl;
use interop_tests::lab::kernel_observer::{KernelObserver, Lag};
use interop_tests::lab::mesh::{self, Mesh};
use interop_tests::lab::netns::{Netns, NsProcess};
use interop_tests::lab::procstat;
use proto::v1 as pb;
use proto::v1::ipam_client::IpamClient;
use tonic::transport::Channel;

use super::{
    Args, Daemons, INTERRUPTED, Impl, SeedOptions, StoreKind, calico_rr, floor, interrupted, kube,
    log_file, seed, sleep_interruptible, start_etcd, store_spec, without_overrides,
    write_node_configs,
};

/// Who peers with whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Topology {
    Mesh,
    Rr,
}

impl Topology {
    pub fn name(self) -> &'static str {
        match self {
            Topology::Mesh => "mesh",
            Topology::Rr => "rr",
        }
    }

    /// How the header line names the topology's peerings.
    pub fn name_for_header(self) -> &'static str {
        match self {
            Topology::Mesh => "Mesh_ sessions",
            Topology::Rr => "Node_ sessions of BGPPeers, rr cluster id 244.0.0.1",
        }
    }
}

/// Route reflectors with --topology rr (nodes 0 and 1).
pub const REFLECTORS: usize = 2;

/// The handle prefix of --event-latency's claims.
const EVENT_HANDLE: &str = "scale-bench-event.";

/// One kernel-observed convergence.
pub struct KernelRow {
    pub n: usize,
    pub imp: Impl,
    /// The row's name in the table (the implementation, and bgpd's datastore).
    pub label: String,
    pub topology: Topology,
    pub converge: Duration,
    pub started: Duration,
    /// The convergence figure's resolution (how late its last route may be stamped).
    pub resolution: Duration,
    pub cpu_s: f64,
    pub rss_mib: f64,
    pub anon_mib: f64,
    pub pss_mib: f64,
    pub mem_gib: f64,
}

/// One N's claims and releases.
pub struct EventRow {
    pub n: usize,
    pub imp: Impl,
    /// The row's name in the table.
    pub label: String,
    pub claim: Vec<Duration>,
    pub release: Vec<Duration>,
    /// The same for the claiming node's own kernel alone (its blackhole): the part before
    /// the route leaves the node.
    pub claim_own: Vec<Duration>,
    pub release_own: Vec<Duration>,
    /// The largest resolution of any claim's or release's figure.
    pub resolution: Duration,
    /// CPU time per claim or release: of every daemon of the cluster, and of the claiming
    /// node's alone, milliseconds.
    pub cpu_all_ms: f64,
    pub cpu_node_ms: f64,
    pub lag: Lag,
}

/// Proportional resident memory (`Pss` of smaps_rollup: each shared page divided among the
/// processes that map it, so a thousand daemons' shared code counts once in all), MiB.
fn pss_mib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Memory the machine has available, MiB (0 when unreadable).
fn mem_available_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

/// The lowest MemAvailable seen, and whether it went below the floor.
struct MemGuard {
    before_mib: u64,
    floor_mib: u64,
    lowest: Cell<u64>,
}

impl MemGuard {
    fn new(floor_mib: u64) -> MemGuard {
        let now = mem_available_mib();
        MemGuard {
            before_mib: now,
            floor_mib,
            lowest: Cell::new(now),
        }
    }

    /// Samples; true when the machine is short of memory.
    fn low(&self) -> bool {
        let now = mem_available_mib();
        self.lowest.set(self.lowest.get().min(now));
        now < self.floor_mib
    }

    fn taken_gib(&self) -> f64 {
        self.before_mib.saturating_sub(self.lowest.get()) as f64 / 1024.0
    }

    fn error(&self) -> String {
        format!(
            "stopped: the machine had {} MiB available (floor --min-available-mib {}); the run \
             had taken {:.1} GiB",
            self.lowest.get(),
            self.floor_mib,
            self.taken_gib()
        )
    }
}

/// Starts `program` straight inside `ns`: the child enters the namespace between fork and
/// exec (the daemons need no namespace-specific /sys, which `ip netns exec` would mount).
fn spawn_in(ns: &Netns, cmd: &mut Command) -> Result<NsProcess, String> {
    let target =
        std::fs::File::open(ns.path()).map_err(|e| format!("{}: {e}", ns.path().display()))?;
    let fd = target.as_raw_fd();
    // SAFETY: between fork and exec only setns(2), async-signal-safe, on a descriptor that
    // stays open until spawn returns (`target` outlives the call).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {:?} in {}: {e}", cmd.get_program(), ns.name()))?;
    drop(target);
    Ok(NsProcess { child })
}

/// The daemons of one run, with each node's PIDs.
struct Side {
    daemons: Daemons,
    per_node: Vec<Vec<i32>>,
    /// When the last daemon had been started (monotonic ns).
    started: u64,
    /// Calico's way: each node's directory (bird.cfg, bird.ctl).
    bird_dirs: Vec<PathBuf>,
    /// margay: each node's API socket.
    sockets: Vec<PathBuf>,
    _etcd: Option<NsProcess>,
    /// `--store kubernetes`: the apiserver and its etcd.
    kube: Option<kube::KubeProcs>,
    /// The kernel floor's threads (no daemons then).
    floor: Option<floor::Floor>,
}

impl Side {
    fn empty() -> Side {
        Side {
            daemons: Daemons(Vec::new()),
            per_node: Vec::new(),
            started: 0,
            bird_dirs: Vec::new(),
            sockets: Vec::new(),
            _etcd: None,
            kube: None,
            floor: None,
        }
    }
}

/// BIRD 1.6 on every node, programming its kernel; (side, t0).
fn start_bird(mesh: &Mesh, dir: &Path, reflectors: usize) -> Result<(Side, u64), String> {
    let (bird, _) = lab::bird::binaries(lab::bird::BirdVersion::V1)?;
    let mut dirs = Vec::new();
    for i in 0..mesh.nodes.len() {
        let d = dir.join(mesh::node_name(i));
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        std::fs::write(
            d.join("bird.cfg"),
            calico_rr::config(mesh, i, reflectors, &[])?,
        )
        .map_err(|e| e.to_string())?;
        dirs.push(d);
    }
    let mut side = Side::empty();
    let t0 = monotonic_ns();
    for (node, d) in mesh.nodes.iter().zip(&dirs) {
        let mut cmd = Command::new(&bird);
        cmd.arg("-f")
            .arg("-c")
            .arg(d.join("bird.cfg"))
            .arg("-s")
            .arg(d.join("bird.ctl"))
            .stdout(Stdio::null())
            .stderr(log_file(&d.join("bird.stderr"))?);
        let p = spawn_in(&node.ns, &mut cmd)?;
        side.per_node.push(vec![p.pid()]);
        side.daemons.0.push(p);
    }
    side.started = monotonic_ns();
    side.bird_dirs = dirs;
    Ok((side, t0))
}

/// bgpd on every node, then routewriter on each once its bgpd serves; (side, t0).
fn start_margay(
    mesh: &Mesh,
    dir: &Path,
    args: &Args,
    opts: SeedOptions,
) -> Result<(Side, u64), String> {
    let bgpd = lab::try_binary("bgpd")?;
    let routewriter = lab::try_binary("routewriter")?;
    let etcd = match args.store {
        StoreKind::Etcd => Some(start_etcd(mesh, dir)?),
        StoreKind::Sqlite | StoreKind::Kubernetes => None,
    };
    let kube = match args.store {
        StoreKind::Kubernetes => Some(kube::start(mesh, dir)?),
        StoreKind::Sqlite | StoreKind::Etcd => None,
    };
    let spec = store_spec(args.store, dir);
    seed(mesh, &spec, opts)?;
    let configs = write_node_configs(mesh, dir, &spec)?;
    let mut side = Side {
        sockets: configs.iter().map(|(_, s)| s.clone()).collect(),
        _etcd: etcd,
        kube,
        ..Side::empty()
    };
    let t0 = monotonic_ns();
    for (node, (d, _)) in mesh.nodes.iter().zip(&configs) {
        let mut cmd = Command::new(&bgpd);
        cmd.arg("--config")
            .arg(d.join("bgpd.toml"))
            .stdout(Stdio::null())
            .stderr(log_file(&d.join("bgpd.log"))?);
        without_overrides(&mut cmd);
        let p = spawn_in(&node.ns, &mut cmd)?;
        side.per_node.push(vec![p.pid()]);
        side.daemons.0.push(p);
    }
    // routewriter once its bgpd's socket is there (it would retry with a backoff otherwise).
    let mut pending: Vec<usize> = (0..mesh.nodes.len()).collect();
    // bgpd opens its API once its datastore is read: on a machine loaded by hundreds of
    // them (and by the kernel still deleting the previous run's namespaces), that can take
    // minutes.
    let limit = Duration::from_secs(args.timeout_s);
    while !pending.is_empty() {
        interrupted()?;
        if Duration::from_nanos(monotonic_ns() - t0) > limit {
            return Err(format!(
                "{} bgpd API sockets not there after {limit:?} (first: {})",
                pending.len(),
                configs[pending[0]].1.display()
            ));
        }
        let mut still = Vec::new();
        for i in pending {
            let (d, socket) = &configs[i];
            if !socket.exists() {
                still.push(i);
                continue;
            }
            let mut cmd = Command::new(&routewriter);
            cmd.arg("--config")
                .arg(d.join("bgpd.toml"))
                .stdout(Stdio::null())
                .stderr(log_file(&d.join("routewriter.log"))?);
            without_overrides(&mut cmd);
            let p = spawn_in(&mesh.nodes[i].ns, &mut cmd)?;
            side.per_node[i].push(p.pid());
            side.daemons.0.push(p);
        }
        pending = still;
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    side.started = monotonic_ns();
    Ok((side, t0))
}

/// Every block of the other nodes.
fn others_blocks(n: usize, i: usize) -> Vec<ipnet::Ipv4Net> {
    (0..n)
        .filter(|&j| j != i)
        .flat_map(mesh::node_blocks)
        .collect()
}

/// The `k`-th (of four) block --event-latency claims in a mesh of `n` nodes: one of the
/// pool's last /24, which no node's blocks reach.
pub fn event_block(n: usize, k: usize) -> Result<ipnet::Ipv4Net, String> {
    let pool: ipnet::Ipv4Net = mesh::pool(n).parse().map_err(|e| format!("{e}"))?;
    let last = u32::from(pool.broadcast()) & !0xff;
    let block = ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(last + 64 * (k % 4) as u32), 26)
        .map_err(|e| e.to_string())?;
    // Node blocks are 172.(20 + i/256).(i%256).0/24 for i < n.
    let used = (0..n).any(|i| {
        mesh::node_blocks(i)
            .iter()
            .any(|b| b.contains(&block.network()))
    });
    if used {
        return Err(format!(
            "--event-latency at N={n}: the pool {pool} has no free /24 for the claimed blocks \
             (at most {} nodes)",
            if n <= 256 { 255 } else { 1023 }
        ));
    }
    Ok(block)
}

/// One kernel-observed run: convergence, then the claims when `events`.
#[expect(
    clippy::too_many_lines,
    reason = "one kernel-observed run in order: mesh, observer, implementation start, convergence, the claims, teardown; the guards must drop in this order"
)]
pub fn run(
    rt: &tokio::runtime::Runtime,
    args: &Args,
    n: usize,
    imp: Impl,
    events: bool,
) -> Result<(KernelRow, Option<EventRow>, Option<kube::ApiserverRow>), String> {
    let reflectors = match args.topology {
        Topology::Mesh => 0,
        Topology::Rr => REFLECTORS,
    };
    if events {
        event_block(n, 0)?;
    }
    let guard = MemGuard::new(args.min_available_mib);
    let mesh = Mesh::new(n)?;
    let dir = tempfile::Builder::new()
        .prefix("scale-bench-")
        .tempdir()
        .map_err(|e| format!("a temporary directory: {e}"))?;
    let pool: ipnet::Ipv4Net = mesh::pool(n).parse().map_err(|e| format!("{e}"))?;
    let namespaces: Vec<&Netns> = mesh.nodes.iter().map(|m| &m.ns).collect();
    let observer = KernelObserver::start(&namespaces, pool)?;
    for i in 0..n {
        observer.expect(i, &others_blocks(n, i))?;
    }
    interrupted()?;
    let (mut side, t0) = match imp {
        Impl::Floor => {
            let (f, t0) = floor::start(&mesh)?;
            let side = Side {
                floor: Some(f),
                started: t0,
                ..Side::empty()
            };
            (side, t0)
        }
        Impl::Bird16 => start_bird(&mesh, dir.path(), reflectors)?,
        Impl::Bgpd => start_margay(
            &mesh,
            dir.path(),
            args,
            SeedOptions {
                reflectors,
                no_empty_block_grace: events,
            },
        )?,
    };
    let floor_failed = side.floor.as_ref().map(floor::Floor::failed_flag);
    let stop = || {
        INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
            || guard.low()
            || floor_failed
                .as_ref()
                .is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst))
    };
    let deadline = t0 + args.timeout_s * 1_000_000_000;
    let converged = observer.wait_converged(deadline, &stop);
    let lag = observer.take_lag();
    let failed = |why: String, side: &mut Side, dir: tempfile::TempDir| {
        let exited = side.daemons.exited().map_or(String::new(), |(k, s)| {
            format!("; a daemon ({k}th started) exited with {s}")
        });
        let kept = dir.keep();
        format!(
            "N={n} {}: {why}{exited}; logs in {}",
            imp.name(),
            kept.display()
        )
    };
    let at = match converged {
        Ok(Some(stamp)) => stamp,
        Ok(None) => {
            interrupted()?;
            let why = if guard.low() {
                guard.error()
            } else if let Some(Err(e)) = side.floor.take().map(floor::Floor::finish) {
                e
            } else {
                let (done, worst, have) = observer.progress();
                format!(
                    "{done} of {n} kernels hold every other node's blocks after {} s ({} holds \
                     {have} of {})",
                    args.timeout_s,
                    mesh::node_name(worst),
                    (n - 1) * mesh::BLOCKS_PER_NODE
                )
            };
            return Err(failed(why, &mut side, dir));
        }
        Err(e) => return Err(failed(e, &mut side, dir)),
    };
    let pids: Vec<i32> = side.per_node.iter().flatten().copied().collect();
    let mut cpu_s = pids.iter().map(|&p| procstat::cpu_seconds(p)).sum::<f64>();
    if let Some(f) = side.floor.take() {
        match f.finish() {
            Ok(c) => cpu_s += c,
            Err(e) => return Err(failed(e, &mut side, dir)),
        }
    }
    let per_node = |f: fn(i32) -> f64| {
        side.per_node
            .iter()
            .map(|ps| ps.iter().map(|&p| f(p)).sum::<f64>())
            .sum::<f64>()
            / n as f64
    };
    let rss_mib = per_node(procstat::rss_mib);
    let anon_mib = per_node(procstat::anon_rss_mib);
    let pss_mib = per_node(pss_mib);
    guard.low();
    let mut row = KernelRow {
        n,
        imp,
        label: imp.name().to_owned(),
        topology: args.topology,
        converge: Duration::from_nanos(at.at.saturating_sub(t0)),
        started: Duration::from_nanos(side.started.saturating_sub(t0)),
        resolution: at.bound,
        cpu_s,
        rss_mib,
        anon_mib,
        pss_mib,
        mem_gib: 0.0,
    };
    eprintln!(
        "scale_bench: N={n} {} {}: every kernel converged in {:.3} s, ±{:.2} ms (observer: \
         longest pass {:.1} ms, latest wake-up {:.2} ms, largest bound {:.1} ms{})",
        args.topology.name(),
        imp.name(),
        row.converge.as_secs_f64(),
        ms(row.resolution),
        ms(lag.max_pass),
        ms(lag.max_wake),
        ms(lag.max_bound),
        if observer.realtime {
            ""
        } else {
            ", not real-time"
        }
    );
    sleep_interruptible(Duration::from_secs(args.hold_secs))?;
    let event_row = if events {
        match claims(rt, args, &mesh, &observer, &side, imp, reflectors, &stop) {
            Ok(r) => Some(r),
            Err(e) => {
                let e = if guard.low() { guard.error() } else { e };
                return Err(failed(e, &mut side, dir));
            }
        }
    } else {
        None
    };
    let apiserver_row = match &side.kube {
        Some(k) if events => match apiserver_figures(rt, k, &side, n, args.events) {
            Ok(r) => Some(r),
            Err(e) => return Err(failed(e, &mut side, dir)),
        },
        _ => None,
    };
    if let Some((k, s)) = side.daemons.exited() {
        return Err(failed(
            format!("daemon {k} exited with {s} during the run"),
            &mut side,
            dir,
        ));
    }
    row.mem_gib = guard.taken_gib();
    drop(observer);
    drop(side);
    drop(mesh);
    if args.keep {
        eprintln!(
            "scale_bench: N={n} {}: logs in {}",
            imp.name(),
            dir.keep().display()
        );
    }
    Ok((row, event_row, apiserver_row))
}

/// How one side claims and releases a block on node `node`.
enum Claimer<'a> {
    Margay(IpamClient<Channel>),
    Bird {
        mesh: &'a Mesh,
        node: usize,
        reflectors: usize,
        cfg: PathBuf,
        ctl: BirdCtl,
    },
}

impl Claimer<'_> {
    async fn claim(&mut self, block: ipnet::Ipv4Net, k: usize) -> Result<(), String> {
        match self {
            Claimer::Margay(ipam) => {
                // The block's first host address: claiming it claims the block for this node.
                let address = std::net::Ipv4Addr::from(u32::from(block.network()) + 1);
                ipam.assign_ip(pb::AssignIpRequest {
                    address: address.to_string(),
                    handle: format!("{EVENT_HANDLE}{k}"),
                    attributes: Default::default(),
                    node: String::new(),
                })
                .await
                .map_err(|e| format!("Ipam.AssignIp {address}: {}", e.message()))?;
                Ok(())
            }
            Claimer::Bird { .. } => self.render(&[block]).await,
        }
    }

    async fn release(&mut self, k: usize) -> Result<(), String> {
        match self {
            Claimer::Margay(ipam) => {
                let handle = format!("{EVENT_HANDLE}{k}");
                let freed = ipam
                    .release_by_handle(pb::ReleaseByHandleRequest {
                        handle: handle.clone(),
                    })
                    .await
                    .map_err(|e| format!("Ipam.ReleaseByHandle {handle}: {}", e.message()))?
                    .into_inner();
                if freed.released.is_empty() {
                    return Err(format!("Ipam.ReleaseByHandle {handle}: nothing released"));
                }
                Ok(())
            }
            Claimer::Bird { .. } => self.render(&[]).await,
        }
    }

    /// confd's part: the file again, then `configure`.
    async fn render(&mut self, extra: &[ipnet::Ipv4Net]) -> Result<(), String> {
        let Claimer::Bird {
            mesh,
            node,
            reflectors,
            cfg,
            ctl,
        } = self
        else {
            return Ok(());
        };
        let text = calico_rr::config(mesh, *node, *reflectors, extra)?;
        std::fs::write(&*cfg, text).map_err(|e| format!("{}: {e}", cfg.display()))?;
        let reply = ctl
            .command("configure")
            .await
            .map_err(|e| format!("birdc configure: {e}"))?;
        if !reply.contains("econfigur") {
            return Err(format!("birdc configure: {}", reply.trim()));
        }
        Ok(())
    }
}

/// The apiserver under bgpd after the claims: 10 s idle, then a burst of claims back to back
/// on the last node and their releases (rounds of four: the four blocks of the claims' /24),
/// each through its bgpd.
fn apiserver_figures(
    rt: &tokio::runtime::Runtime,
    kube: &kube::KubeProcs,
    side: &Side,
    n: usize,
    events: usize,
) -> Result<kube::ApiserverRow, String> {
    let idle_from = kube.sample();
    sleep_interruptible(Duration::from_secs(10))?;
    let idle_to = kube.sample();
    let socket = &side.sockets[n - 1];
    // The claims' /24 holds four blocks: rounds of four claims back to back, then their
    // four releases, up to `events` claims.
    let rounds = events.div_ceil(4).clamp(1, 5);
    let burst = rounds * 4;
    let burst_from = kube.sample();
    let started = std::time::Instant::now();
    rt.block_on(async {
        let mut claimer = Claimer::Margay(IpamClient::new(
            proto::client::connect_unix(socket)
                .await
                .map_err(|e| format!("{}: {e}", socket.display()))?,
        ));
        for _ in 0..rounds {
            for k in 0..4 {
                claimer.claim(event_block(n, k)?, k).await?;
            }
            for k in 0..4 {
                claimer.release(k).await?;
            }
        }
        Ok::<_, String>(())
    })?;
    let burst_s = started.elapsed().as_secs_f64();
    let burst_to = kube.sample();
    eprintln!(
        "scale_bench: N={n} apiserver: idle {:.1} requests/s, {} watches; a burst of {burst} claims and releases in {burst_s:.2} s, {:.1} requests/s",
        kube::rate(&idle_from, &idle_to),
        idle_to.watches,
        kube::rate(&burst_from, &burst_to)
    );
    Ok(kube::ApiserverRow {
        n,
        idle_rps: kube::rate(&idle_from, &idle_to),
        idle_watches: idle_to.watches,
        burst_rps: kube::rate(&burst_from, &burst_to),
        burst_watches: burst_to.watches,
        burst_claims: burst,
        burst_s,
        cpu_s: burst_to.cpu_s,
        rss_mib: burst_to.rss_mib,
    })
}

/// --event-latency on a converged run.
#[allow(clippy::too_many_arguments)]
#[expect(
    clippy::too_many_lines,
    reason = "the claims in order: the claimer, each claim and release timed in every kernel, the CPU they took"
)]
fn claims(
    rt: &tokio::runtime::Runtime,
    args: &Args,
    mesh: &Mesh,
    observer: &KernelObserver,
    side: &Side,
    imp: Impl,
    reflectors: usize,
    stop: &dyn Fn() -> bool,
) -> Result<EventRow, String> {
    let n = mesh.nodes.len();
    let node = n - 1;
    let mut claimer = rt.block_on(async {
        Ok::<_, String>(match imp {
            Impl::Floor => return Err("the floor claims no blocks".into()),
            Impl::Bgpd => {
                let socket = &side.sockets[node];
                Claimer::Margay(IpamClient::new(
                    proto::client::connect_unix(socket)
                        .await
                        .map_err(|e| format!("{}: {e}", socket.display()))?,
                ))
            }
            Impl::Bird16 => {
                let d = &side.bird_dirs[node];
                Claimer::Bird {
                    mesh,
                    node,
                    reflectors,
                    cfg: d.join("bird.cfg"),
                    ctl: BirdCtl::connect(&d.join("bird.ctl"))
                        .await
                        .map_err(|e| format!("BIRD's control socket: {e}"))?,
                }
            }
        })
    })?;
    let limit = 30_000_000_000u64;
    let gap = Duration::from_millis(args.event_gap_ms);
    let mut row = EventRow {
        n,
        imp,
        label: imp.name().to_owned(),
        claim: Vec::new(),
        release: Vec::new(),
        claim_own: Vec::new(),
        release_own: Vec::new(),
        resolution: Duration::ZERO,
        cpu_all_ms: 0.0,
        cpu_node_ms: 0.0,
        lag: Lag::default(),
    };
    sleep_interruptible(gap)?;
    observer.take_lag();
    let cpu =
        |pids: &mut dyn Iterator<Item = &i32>| pids.map(|&p| procstat::cpu_seconds(p)).sum::<f64>();
    let all_before = cpu(&mut side.per_node.iter().flatten());
    let node_before = cpu(&mut side.per_node[node].iter());
    for k in 0..args.events {
        let block = event_block(n, k)?;
        if observer.holding(block, n) != 0 {
            return Err(format!("{block} is in a kernel before its claim"));
        }
        let t = monotonic_ns();
        rt.block_on(claimer.claim(block, k))?;
        let at = observer
            .wait_present(block, n, t, t + limit, stop)?
            .ok_or_else(|| {
                format!(
                    "claim {k}: {block} in {} of {n} kernels after {} s",
                    observer.holding(block, n),
                    limit / 1_000_000_000
                )
            })?;
        row.claim.push(Duration::from_nanos(at.at - t));
        let (own, _) = observer.stamp(block, node);
        row.claim_own
            .push(Duration::from_nanos(own.saturating_sub(t)));
        row.resolution = row.resolution.max(at.bound);
        sleep_interruptible(gap)?;
        let t = monotonic_ns();
        rt.block_on(claimer.release(k))?;
        let at = observer
            .wait_absent(block, n, t, t + limit, stop)?
            .ok_or_else(|| {
                format!(
                    "release {k}: {block} still in {} of {n} kernels after {} s",
                    observer.holding(block, n),
                    limit / 1_000_000_000
                )
            })?;
        row.release.push(Duration::from_nanos(at.at - t));
        let (_, own) = observer.stamp(block, node);
        row.release_own
            .push(Duration::from_nanos(own.saturating_sub(t)));
        row.resolution = row.resolution.max(at.bound);
        sleep_interruptible(gap)?;
    }
    row.lag = observer.take_lag();
    let changes = (2 * args.events).max(1) as f64;
    row.cpu_all_ms = (cpu(&mut side.per_node.iter().flatten()) - all_before) * 1000.0 / changes;
    row.cpu_node_ms = (cpu(&mut side.per_node[node].iter()) - node_before) * 1000.0 / changes;
    eprintln!(
        "scale_bench: N={n} {}: {} claims and releases; observer: longest pass {:.1} ms, \
         latest wake-up {:.2} ms",
        imp.name(),
        args.events,
        ms(row.lag.max_pass),
        ms(row.lag.max_wake)
    );
    Ok(row)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// "12.3" or "12.3*" when the resolution is above 5% of the figure.
fn marked(figure: Duration, resolution: Duration, width: usize) -> String {
    let star = if resolution.as_secs_f64() > 0.05 * figure.as_secs_f64() {
        "*"
    } else {
        ""
    };
    format!("{:>w$}", format!("{:.1}{star}", ms(figure)), w = width)
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

pub fn print_kernel_table(
    out: &mut impl std::io::Write,
    rows: &[KernelRow],
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>5}  {:<4} {:<11} {:>11} {:>7} {:>8} {:>8} {:>13} {:>5} {:>5} {:>7}  {:>6} {:>6} {:>6} {:>6}  {:>6}",
        "N",
        "topo",
        "impl",
        "converge ms",
        "res ms",
        "start s",
        "CPU s",
        "RSS MiB/node",
        "anon",
        "PSS",
        "mem GiB",
        "×conv",
        "×CPU",
        "×RSS",
        "×PSS",
        "×floor"
    )?;
    for r in rows {
        let base = rows.iter().find(|b| {
            b.imp == Impl::Bird16 && b.n == r.n && b.topology == r.topology && r.imp == Impl::Bgpd
        });
        let floor = rows
            .iter()
            .find(|b| b.imp == Impl::Floor && b.n == r.n && b.topology == r.topology);
        // Memory of a node's daemons: none for the floor.
        let mib = |v: f64| {
            if r.imp == Impl::Floor {
                "-".to_string()
            } else {
                format!("{v:.1}")
            }
        };
        writeln!(
            out,
            "{:>5}  {:<4} {:<11} {} {:>7.2} {:>8.2} {:>8.2} {:>13} {:>5} {:>5} {:>7.2}  {:>6} {:>6} {:>6} {:>6}  {:>6}",
            r.n,
            r.topology.name(),
            r.label,
            marked(r.converge, r.resolution, 11),
            ms(r.resolution),
            r.started.as_secs_f64(),
            r.cpu_s,
            mib(r.rss_mib),
            mib(r.anon_mib),
            mib(r.pss_mib),
            r.mem_gib,
            ratio(
                r.converge.as_secs_f64(),
                base.map(|b| b.converge.as_secs_f64())
            ),
            ratio(r.cpu_s, base.map(|b| b.cpu_s)),
            ratio(r.rss_mib, base.map(|b| b.rss_mib)),
            ratio(r.pss_mib, base.map(|b| b.pss_mib)),
            ratio(
                r.converge.as_secs_f64(),
                floor
                    .filter(|_| r.imp != Impl::Floor)
                    .map(|f| f.converge.as_secs_f64())
            ),
        )?;
    }
    Ok(())
}

pub fn print_event_table(
    out: &mut impl std::io::Write,
    rows: &mut [EventRow],
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>5}  {:<11} {:>7} {:>10} {:>10} {:>10}  {:>10} {:>10} {:>10}  {:>7}  {:>11} {:>8}  {:>6} {:>6}  {:>10} {:>11}",
        "N",
        "impl",
        "events",
        "claim p50",
        "p99 ms",
        "max",
        "release p50",
        "p99 ms",
        "max",
        "res ms",
        "CPU ms/chg",
        "on node",
        "×p99",
        "×rp99",
        "own claim",
        "own release"
    )?;
    let p99s: Vec<(usize, Impl, f64, f64)> = rows
        .iter_mut()
        .map(|r| {
            (
                r.n,
                r.imp,
                ms(percentile(&mut r.claim, 0.99)),
                ms(percentile(&mut r.release, 0.99)),
            )
        })
        .collect();
    for r in rows.iter_mut() {
        let res = r.resolution;
        let base = p99s
            .iter()
            .find(|b| b.1 == Impl::Bird16 && b.0 == r.n && r.imp == Impl::Bgpd);
        let c = [0.5, 0.99, 1.0].map(|q| percentile(&mut r.claim, q));
        let w = [0.5, 0.99, 1.0].map(|q| percentile(&mut r.release, q));
        writeln!(
            out,
            "{:>5}  {:<11} {:>7} {} {} {}  {} {} {}  {:>7.2}  {:>11.1} {:>8.1}  {:>6} {:>6}  {:>10.1} {:>11.1}",
            r.n,
            r.label,
            r.claim.len(),
            marked(c[0], res, 10),
            marked(c[1], res, 10),
            marked(c[2], res, 10),
            marked(w[0], res, 11),
            marked(w[1], res, 10),
            marked(w[2], res, 10),
            ms(res),
            r.cpu_all_ms,
            r.cpu_node_ms,
            ratio(ms(c[1]), base.map(|b| b.2)),
            ratio(ms(w[1]), base.map(|b| b.3)),
            ms(percentile(&mut r.claim_own, 0.5)),
            ms(percentile(&mut r.release_own, 0.5)),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_blocks_are_free_and_in_the_pool() {
        assert_eq!(event_block(10, 0).unwrap().to_string(), "172.20.255.0/26");
        assert_eq!(event_block(10, 5).unwrap().to_string(), "172.20.255.64/26");
        assert_eq!(
            event_block(300, 3).unwrap().to_string(),
            "172.23.255.192/26"
        );
        assert!(event_block(256, 0).is_err());
        for n in [3, 100, 255, 300, 1000] {
            let pool: ipnet::Ipv4Net = mesh::pool(n).parse().unwrap();
            assert!(pool.contains(&event_block(n, 2).unwrap()));
        }
    }

    #[test]
    fn a_figure_is_marked_when_its_resolution_is_above_five_percent() {
        let ms = Duration::from_millis;
        assert_eq!(marked(ms(100), ms(5), 0), "100.0");
        assert_eq!(marked(ms(100), ms(6), 0), "100.0*");
    }
}
