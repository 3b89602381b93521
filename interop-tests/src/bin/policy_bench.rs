//! `policy-bench`: network policy at a node's scale, in a lab of its own (`margay-lab up`, four
//! nodes): 1,000 pods' endpoints on node-1 and 100 policies, then three figures in one run.
//!
//! Why this file is long: one benchmark's whole run (documents, lab, monitors, traffic,
//! baseline, table) shares the model of the generated policies; split, each part would take
//! it as a parameter list.
//!
//! - **apply → in force**: on the converged table, one policy changed K times (its port); each
//!   time from the gRPC `Policy.Apply` starting until the changed rule is in the kernel of every
//!   node that must enforce it (its subject has endpoints on all four), seen by `nft monitor
//!   rules` started in each node's namespace before the change (the line naming the policy and
//!   the new port). p50 / p99, beside the monitor's own lag, measured with a probe rule.
//! - **routewriter's cost** on node-1: CPU (utime + stime) of the bulk load and per change, and
//!   its resident memory with the 1,000-pod table.
//! - **the packet path**: TCP throughput and connection rate (connect, then close with a reset)
//!   from a real pod on node-1 to a real pod on node-3 (same subnet, routed directly), in three
//!   modes side by side: (a) no policy at all; (b) margay's policies, both pods selected and
//!   the flow allowed; (c) margay's policies gone and the same ingress allows as iptables rules
//!   (Debian's iptables, nft-backed) in node-3's FORWARD chain, one per allowed (source pod,
//!   destination pod, port), after an ESTABLISHED accept and before a drop per selected
//!   destination. Ratios b/a and c/a.
//!
//! The endpoints other than the two real pods are documents only (`WorkloadEndpoint`s whose
//! `cali…` interfaces need not exist), addressed from a /20 of the pool 172.20.0.0/16 that
//! none of the lab's IPAM blocks is in; one per app is also placed on nodes 2–4 so a change
//! must reach every node.
//!
//! `policy-bench [--pods N] [--policies M] [--events K] [--seconds S] [--smoke]`; needs root,
//! the release build of every binary `margay-lab` starts, nft and iptables-restore.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use clap::Parser;
use interop_tests::bench::{ms, percentile};
use interop_tests::lab::local::LocalLab;
use interop_tests::lab::procstat;
use proto::v1 as pb;
use proto::v1::policy_client::PolicyClient;
use serde_json::{Value, json};
use tonic::transport::Channel;

const NAMESPACE: &str = "bench";
/// The port the real pods' flow uses (allowed by the last two policies).
const PORT: u16 = 5201;
/// A port no policy allows: a connection to it must be dropped where policy is in force.
const DENIED_PORT: u16 = 5299;
const NODES: [&str; 4] = ["node-1", "node-2", "node-3", "node-4"];
const TABLE: &str = "margay-policy";
/// The policy the events change, and the app it selects.
const EVENT_POLICY: &str = "bench-event";
const EVENT_APP: usize = 5;
const EVENT_BASE_PORT: u16 = 30000;
/// How long one change may take before the run is failed.
const IN_FORCE_LIMIT: Duration = Duration::from_secs(15);

#[derive(Parser)]
#[command(
    about = "network policy at 1,000 pods: apply → in force, routewriter's cost, packet path"
)]
struct Args {
    /// Endpoints on node-1 (the real client pod included).
    #[arg(long, default_value_t = 1000)]
    pods: usize,
    /// Policies (at least 4; the last two allow the real pods' flow).
    #[arg(long, default_value_t = 100)]
    policies: usize,
    /// Timed policy changes.
    #[arg(long, default_value_t = 50)]
    events: usize,
    /// Seconds of traffic per packet-path sample (3 samples per mode and figure).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Apps the endpoints' labels spread over.
    #[arg(long, default_value_t = 20)]
    apps: usize,
    /// A quick run that checks the benchmark works (CI sizes).
    #[arg(long)]
    smoke: bool,
    /// Leave the lab up after the run, to look at it (`MARGAY_LAB_NAME=<name> margay-lab down`).
    #[arg(long)]
    keep_lab: bool,
}

/// One endpoint of the model: a document-only one, or one of the two real pods.
struct Endpoint {
    name: String,
    node: &'static str,
    iface: String,
    addr: Ipv4Addr,
    app: String,
}

/// Which way a generated policy points.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Ingress,
    Egress,
}

#[derive(Clone, Copy)]
enum Dialect {
    K8s,
    Calico,
    Global,
}

/// One generated policy: its subject apps allow `peer` on TCP `ports`, one direction.
struct GenPolicy {
    name: String,
    dialect: Dialect,
    dir: Dir,
    subject: Vec<String>,
    peer: String,
    ports: (u16, u16),
}

fn app(i: usize) -> String {
    format!("app-{i:02}")
}

/// The endpoints: `pods - 1` on node-1 besides the real client, one per app on nodes 2–4.
fn endpoints(pods: usize, apps: usize, range: Ipv4Addr) -> Vec<Endpoint> {
    let base = u32::from(range);
    let mut out = Vec::new();
    for i in 0..pods.saturating_sub(1) {
        out.push(Endpoint {
            name: format!("ep-1-{i:04}"),
            node: "node-1",
            iface: format!("calib1{i:04}"),
            addr: Ipv4Addr::from(base + 16 + i as u32),
            app: app(i % apps),
        });
    }
    for (n, node) in NODES.iter().enumerate().skip(1) {
        for a in 0..apps {
            out.push(Endpoint {
                name: format!("ep-{}-{a:04}", n + 1),
                node,
                iface: format!("calib{}{a:04}", n + 1),
                addr: Ipv4Addr::from(base + 3072 + (n * 256 + a) as u32),
                app: app(a),
            });
        }
    }
    out
}

/// `m` policies over the apps: a third each Kubernetes, Calico and global, blocks of `apps`
/// alternating ingress and egress, every tenth one also selecting a real pod (more rules in
/// its chain), a few with port ranges; the last two allow the real pods' flow (last in every
/// rule list, so the naive baseline's allow is at the end of its chain).
fn policies(m: usize, apps: usize) -> Vec<GenPolicy> {
    let mut out = Vec::new();
    for i in 0..m.saturating_sub(2) {
        let dir = if (i / apps).is_multiple_of(2) {
            Dir::Ingress
        } else {
            Dir::Egress
        };
        let mut subject = vec![app(i % apps)];
        if i % 10 == 4 {
            subject.push(
                if dir == Dir::Ingress {
                    "server"
                } else {
                    "client"
                }
                .into(),
            );
        }
        let port = 1000 + i as u16;
        out.push(GenPolicy {
            name: format!("bench-p{i:03}"),
            dialect: [Dialect::K8s, Dialect::Calico, Dialect::Global][i % 3],
            dir,
            subject,
            peer: app((i * 7 + 3) % apps),
            ports: if i % 5 == 0 {
                (port, port + 9)
            } else {
                (port, port)
            },
        });
    }
    out.push(GenPolicy {
        name: "bench-server".into(),
        dialect: Dialect::K8s,
        dir: Dir::Ingress,
        subject: vec!["server".into()],
        peer: "client".into(),
        ports: (PORT, PORT),
    });
    out.push(GenPolicy {
        name: "bench-client".into(),
        dialect: Dialect::Calico,
        dir: Dir::Egress,
        subject: vec!["client".into()],
        peer: "server".into(),
        ports: (PORT, PORT),
    });
    out
}

fn calico_selector(apps: &[String]) -> String {
    match apps {
        [one] => format!("app == '{one}'"),
        many => format!(
            "app in {{{}}}",
            many.iter()
                .map(|a| format!("'{a}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The policy as the document a user applies.
fn policy_doc(p: &GenPolicy) -> Value {
    match p.dialect {
        Dialect::K8s => {
            let mut port = json!({"protocol": "TCP", "port": p.ports.0});
            if p.ports.1 != p.ports.0 {
                port["endPort"] = json!(p.ports.1);
            }
            let peer = json!([{"podSelector": {"matchLabels": {"app": p.peer}}}]);
            let (types, rules) = match p.dir {
                Dir::Ingress => (
                    "Ingress",
                    json!({"ingress": [{"from": peer, "ports": [port]}]}),
                ),
                Dir::Egress => ("Egress", json!({"egress": [{"to": peer, "ports": [port]}]})),
            };
            let mut spec = json!({
                "podSelector": {"matchExpressions": [
                    {"key": "app", "operator": "In", "values": p.subject}]},
                "policyTypes": [types],
            });
            for (k, v) in rules.as_object().into_iter().flatten() {
                spec[k] = v.clone();
            }
            json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": p.name, "namespace": NAMESPACE},
                "spec": spec,
            })
        }
        Dialect::Calico | Dialect::Global => {
            let ports = if p.ports.1 == p.ports.0 {
                json!([p.ports.0])
            } else {
                json!([format!("{}:{}", p.ports.0, p.ports.1)])
            };
            let peer = format!("app == '{}'", p.peer);
            let (types, key, rule) = match p.dir {
                Dir::Ingress => (
                    "Ingress",
                    "ingress",
                    json!({"action": "Allow", "protocol": "TCP", "source": {"selector": peer},
                           "destination": {"ports": ports}}),
                ),
                Dir::Egress => (
                    "Egress",
                    "egress",
                    json!({"action": "Allow", "protocol": "TCP",
                           "destination": {"selector": peer, "ports": ports}}),
                ),
            };
            let mut spec = json!({"selector": calico_selector(&p.subject), "types": [types]});
            spec[key] = json!([rule]);
            let mut meta = json!({"name": p.name});
            let kind = if let Dialect::Global = p.dialect {
                "GlobalNetworkPolicy"
            } else {
                meta["namespace"] = json!(NAMESPACE);
                "NetworkPolicy"
            };
            json!({"apiVersion": "projectcalico.org/v3", "kind": kind, "metadata": meta,
                   "spec": spec})
        }
    }
}

fn policy_ref(p: &GenPolicy) -> pb::DocumentRef {
    let (kind, namespace) = match p.dialect {
        Dialect::K8s => (pb::DocumentKind::K8sNetworkPolicy, NAMESPACE),
        Dialect::Calico => (pb::DocumentKind::NetworkPolicy, NAMESPACE),
        Dialect::Global => (pb::DocumentKind::GlobalNetworkPolicy, ""),
    };
    pb::DocumentRef {
        kind: kind as i32,
        namespace: namespace.into(),
        name: p.name.clone(),
    }
}

fn endpoint_doc(e: &Endpoint) -> Value {
    json!({
        "apiVersion": "projectcalico.org/v3",
        "kind": "WorkloadEndpoint",
        "metadata": {"name": e.name, "namespace": NAMESPACE, "labels": {"app": e.app}},
        "spec": {"node": e.node, "pod": e.name, "interfaceName": e.iface,
                 "ipNetworks": [format!("{}/32", e.addr)]},
    })
}

/// The event policy at change `j`: ingress to the event app from its neighbour, on a new port.
fn event_policy(j: usize, apps: usize) -> GenPolicy {
    GenPolicy {
        name: EVENT_POLICY.into(),
        dialect: Dialect::K8s,
        dir: Dir::Ingress,
        subject: vec![app(EVENT_APP % apps)],
        peer: app((EVENT_APP + 1) % apps),
        ports: (EVENT_BASE_PORT + j as u16, EVENT_BASE_PORT + j as u16),
    }
}

/// bgpd's Policy service on node-1, called from this thread.
struct Api {
    rt: tokio::runtime::Runtime,
    client: PolicyClient<Channel>,
}

impl Api {
    fn connect(lab: &LocalLab) -> Result<Api, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let channel = rt
            .block_on(proto::client::connect_unix(&lab.socket("node-1")))
            .map_err(|e| format!("node-1's bgpd: {e}"))?;
        Ok(Api {
            rt,
            client: PolicyClient::new(channel),
        })
    }

    fn apply(&mut self, doc: &Value) -> Result<(), String> {
        let req = pb::ApplyDocumentRequest {
            json: doc.to_string(),
        };
        self.rt
            .block_on(self.client.apply(req))
            .map(|_| ())
            .map_err(|s| format!("Apply {}: {}", doc["metadata"]["name"], s.message()))
    }

    fn delete(&mut self, r: pb::DocumentRef) -> Result<(), String> {
        let name = r.name.clone();
        match self.rt.block_on(self.client.delete(r)) {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(format!("Delete {name}: {}", s.message())),
        }
    }
}

/// `nft list table inet margay-policy` in a node: (endpoint chains, rules in them), or zeros
/// when the table is not there; and the text.
fn table_of(lab: &LocalLab, node: &str) -> (usize, usize, String) {
    let (ok, text) = lab.exec(node, &["nft", "list", "table", "inet", TABLE]);
    if !ok {
        return (0, 0, String::new());
    }
    let (mut chains, mut rules, mut in_ep) = (0, 0, false);
    for l in text.lines().map(str::trim) {
        if let Some(name) = l.strip_prefix("chain ") {
            in_ep = name.starts_with("ingress-") || name.starts_with("egress-");
            chains += usize::from(in_ep);
        } else if in_ep && l.contains("comment") {
            rules += 1;
        }
    }
    (chains, rules, text)
}

/// The endpoint chains each node must have: one per selected endpoint and direction (the real
/// pods by their labels; their interfaces are the plugin's).
fn expected_chains(eps: &[Endpoint], pols: &[GenPolicy]) -> BTreeMap<&'static str, usize> {
    let mut want: BTreeMap<&'static str, usize> = NODES.iter().map(|n| (*n, 0)).collect();
    for e in eps {
        for dir in [Dir::Ingress, Dir::Egress] {
            if pols
                .iter()
                .any(|p| p.dir == dir && p.subject.contains(&e.app))
            {
                *want.entry(e.node).or_default() += 1;
            }
        }
    }
    want
}

/// Waits until every node's table has the chains it must and contains `marker`, unchanged
/// over two polls; the time it took.
fn converge(
    lab: &LocalLab,
    want: &BTreeMap<&'static str, usize>,
    marker: Option<&str>,
    limit: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last: BTreeMap<&str, String> = BTreeMap::new();
    loop {
        let mut done = true;
        let mut state = Vec::new();
        for (node, n) in want {
            let (chains, rules, text) = table_of(lab, node);
            state.push(format!("{node}: {chains}/{n} chains, {rules} rules"));
            let ok = chains == *n && marker.is_none_or(|m| text.contains(m));
            let stable = last.get(node) == Some(&text);
            done &= ok && stable;
            last.insert(node, text);
        }
        if done {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "the policy tables did not converge within {limit:?}: {}",
                state.join("; ")
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `nft monitor rules` in every node, each line timestamped when read.
struct Monitors {
    children: Vec<Child>,
    lines: mpsc::Receiver<(usize, Instant, String)>,
}

impl Monitors {
    fn start(lab: &LocalLab) -> Result<Monitors, String> {
        let (tx, lines) = mpsc::channel();
        let mut children = Vec::new();
        for (i, node) in NODES.iter().enumerate() {
            let mut child = Command::new("ip")
                .args(["netns", "exec", &lab.ns(node), "nft", "monitor", "rules"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("nft monitor in {node}: {e}"))?;
            let out = child.stdout.take().ok_or("nft monitor: no stdout")?;
            let err = child.stderr.take().ok_or("nft monitor: no stderr")?;
            children.push(child);
            // What nft complains about shows up with the lines, for the error.
            let etx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if etx
                        .send((i, Instant::now(), format!("stderr: {line}")))
                        .is_err()
                    {
                        break;
                    }
                }
            });
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((i, Instant::now(), line)).is_err() {
                        break;
                    }
                }
            });
        }
        let mon = Monitors { children, lines };
        mon.until_listening(lab)?;
        Ok(mon)
    }

    /// Waits until every monitor prints: `nft monitor` reads the whole ruleset before it
    /// subscribes (long with a large table, on a busy machine), so a rule written before
    /// then is never shown. A probe rule in a table of this bench's own, again every 500 ms,
    /// until each node's monitor has shown one. Each try makes a new table with its rule in
    /// one batch: a table made between the monitor's read and its subscription stays
    /// unknown to it ("Received event for an unknown table"), and so would its rules.
    fn until_listening(&self, lab: &LocalLab) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for (i, node) in NODES.iter().enumerate() {
            let mut n = 0;
            loop {
                n += 1;
                let (probe, comment) = (format!("policy-bench-ready-{n}"), format!("ready-{n}"));
                let (ok, text) = lab.exec(
                    node,
                    &[
                        "nft",
                        &format!(
                            "add table inet {probe}; add chain inet {probe} c; \
                             add rule inet {probe} c accept comment \"{comment}\""
                        ),
                    ],
                );
                if !ok {
                    return Err(format!("nft probe table in {node}: {text}"));
                }
                let seen = self.wait_for(&[i], &[&comment], Duration::from_millis(500));
                lab.exec(node, &["nft", "delete", "table", "inet", &probe]);
                match seen {
                    Ok(_) => break,
                    Err(e) if Instant::now() > deadline => {
                        return Err(format!("nft monitor in {node} never listened: {e}"));
                    }
                    Err(_) => {}
                }
            }
        }
        self.drain();
        Ok(())
    }

    fn drain(&self) {
        while self.lines.try_recv().is_ok() {}
    }

    /// When each node of `nodes` first printed an `add rule` line containing every needle.
    fn wait_for(
        &self,
        nodes: &[usize],
        needles: &[&str],
        limit: Duration,
    ) -> Result<BTreeMap<usize, Instant>, String> {
        let deadline = Instant::now() + limit;
        let mut seen = BTreeMap::new();
        // What the monitors printed meanwhile, for the error: lines per node, the last one.
        let mut other: BTreeMap<usize, (usize, String)> = BTreeMap::new();
        while seen.len() < nodes.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok((node, at, line)) = self.lines.recv_timeout(left) else {
                return Err(format!(
                    "no rule with {needles:?} within {limit:?} on {:?}; the monitors printed \
                     meanwhile: {:?}",
                    nodes
                        .iter()
                        .filter(|n| !seen.contains_key(*n))
                        .map(|n| NODES[*n])
                        .collect::<Vec<_>>(),
                    other
                        .iter()
                        .map(|(n, (count, last))| format!(
                            "{}: {count} lines, last {last:?}",
                            NODES[*n]
                        ))
                        .collect::<Vec<_>>()
                ));
            };
            if nodes.contains(&node)
                && line.starts_with("add rule")
                && needles.iter().all(|n| line.contains(n))
            {
                seen.entry(node).or_insert(at);
            } else {
                let e = other.entry(node).or_default();
                e.0 += 1;
                e.1 = line.chars().take(160).collect();
            }
        }
        Ok(seen)
    }
}

impl Drop for Monitors {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The monitor's lag, with probe rules in a table of this bench's own in node-1: from the
/// `nft` command's exit (a lower bound: it committed before) and from its start (an upper
/// bound) to the line. Medians.
fn monitor_lag(lab: &LocalLab, mon: &Monitors) -> Result<(Duration, Duration), String> {
    let probe = "policy-bench-probe";
    let (ok, text) = lab.exec(
        "node-1",
        &[
            "nft",
            &format!("add table inet {probe}; add chain inet {probe} c"),
        ],
    );
    if !ok {
        return Err(format!("nft probe table: {text}"));
    }
    let (mut low, mut high) = (Vec::new(), Vec::new());
    for k in 0..7 {
        mon.drain();
        let comment = format!("probe-{k}-{}", std::process::id());
        let started = Instant::now();
        let (ok, text) = lab.exec(
            "node-1",
            &[
                "nft",
                &format!("add rule inet {probe} c accept comment \"{comment}\""),
            ],
        );
        let ended = Instant::now();
        if !ok {
            return Err(format!("nft probe rule: {text}"));
        }
        let at = mon.wait_for(&[0], &[&comment], Duration::from_secs(5))?[&0];
        low.push(at.saturating_duration_since(ended));
        high.push(at.saturating_duration_since(started));
    }
    lab.exec("node-1", &["nft", "delete", "table", "inet", probe]);
    Ok((percentile(&mut low, 0.5), percentile(&mut high, 0.5)))
}

/// What one read of node-1's policy table costs, as routewriter reads it before each write
/// (`nft -j list table`, read only): wall time and CPU (this process's waited-for children),
/// medians of 5, and the listing's size in bytes.
fn table_read_cost(lab: &LocalLab) -> (Duration, Duration, usize) {
    let children_cpu = || {
        // SAFETY: getrusage fills the struct we own.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
        let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
        t(u.ru_utime) + t(u.ru_stime)
    };
    let (mut wall, mut cpu, mut size) = (Vec::new(), Vec::new(), 0);
    for _ in 0..5 {
        let (c, t) = (children_cpu(), Instant::now());
        let (_, text) = lab.exec("node-1", &["nft", "-j", "list", "table", "inet", TABLE]);
        wall.push(t.elapsed());
        cpu.push(children_cpu().saturating_sub(c));
        size = text.len();
    }
    (percentile(&mut wall, 0.5), percentile(&mut cpu, 0.5), size)
}

/// A daemon's PID on a node, from the lab's pid file.
fn daemon_pid(lab: &LocalLab, node: &str, daemon: &str) -> Result<i32, String> {
    let path = format!("/run/margay-lab-{}/pids/{node}-{daemon}", lab.name);
    std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("no {daemon} pid in {path}"))
}

/// CPU seconds used so far on node-1: routewriter's own, its children's (the `nft` runs it
/// waited for: /proc's cutime + cstime), and bgpd's (which compiles the policy).
#[derive(Clone, Copy, Default)]
struct CpuUse {
    routewriter: f64,
    nft: f64,
    bgpd: f64,
}

impl CpuUse {
    fn now(rw: i32, bgpd: i32) -> CpuUse {
        let stat = std::fs::read_to_string(format!("/proc/{rw}/stat")).unwrap_or_default();
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        // Fields 16 and 17 (cutime, cstime) are the 14th and 15th after the command name.
        let ticks: u64 = [13, 14]
            .iter()
            .filter_map(|i| f.get(*i)?.parse::<u64>().ok())
            .sum();
        // SAFETY: sysconf only reads a system constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        CpuUse {
            routewriter: procstat::cpu_seconds(rw),
            nft: ticks as f64 / hz,
            bgpd: procstat::cpu_seconds(bgpd),
        }
    }

    fn since(self, earlier: CpuUse) -> CpuUse {
        CpuUse {
            routewriter: self.routewriter - earlier.routewriter,
            nft: self.nft - earlier.nft,
            bgpd: self.bgpd - earlier.bgpd,
        }
    }

    fn per(self, n: usize) -> CpuUse {
        let n = n.max(1) as f64;
        CpuUse {
            routewriter: self.routewriter / n,
            nft: self.nft / n,
            bgpd: self.bgpd / n,
        }
    }
}

/// Moves this thread into a lab namespace for good (the thread is the bench's own).
fn enter(ns: &str) -> std::io::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    // SAFETY: setns on a valid namespace fd only changes this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A TCP server in the server pod: drains every connection it accepts, one at a time.
struct Server {
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
    client_ns: String,
}

impl Server {
    fn start(server_ns: &str, client_ns: &str, addr: Ipv4Addr) -> Result<Server, String> {
        let (ready_tx, ready) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, flag) = (server_ns.to_owned(), stop.clone());
        std::thread::spawn(move || {
            let listener = enter(&ns).and_then(|_| TcpListener::bind(("0.0.0.0", PORT)));
            let listener = match listener {
                Ok(l) => {
                    // A deep accept queue: with std's 128, a descheduled accept thread on a
                    // busy machine overflows it and the client's SYN waits 1 s to be resent.
                    // SAFETY: listen(2) again on our listening socket only resizes its queue.
                    unsafe { libc::listen(l.as_raw_fd(), 4096) };
                    let _ = ready_tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("server in {ns}: {e}")));
                    return;
                }
            };
            let mut buf = vec![0u8; 256 << 10];
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
            }
        });
        ready.recv().map_err(|e| e.to_string())??;
        Ok(Server {
            stop,
            addr: SocketAddr::from((addr, PORT)),
            client_ns: client_ns.to_owned(),
        })
    }

    /// Runs `f` on a fresh thread inside the client pod.
    fn in_client<R: Send + 'static>(
        &self,
        f: impl FnOnce(SocketAddr) -> Result<R, String> + Send + 'static,
    ) -> Result<R, String> {
        let (ns, addr) = (self.client_ns.clone(), self.addr);
        std::thread::spawn(move || {
            enter(&ns).map_err(|e| format!("client in {ns}: {e}"))?;
            f(addr)
        })
        .join()
        .map_err(|_| "the client thread panicked".to_string())?
    }

    /// Bytes per second of one bulk stream for `secs`.
    fn throughput(&self, secs: f64) -> Result<f64, String> {
        self.in_client(move |addr| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                .map_err(|e| format!("connect {addr}: {e}"))?;
            let buf = vec![0x5au8; 128 << 10];
            let (start, mut sent) = (Instant::now(), 0u64);
            while start.elapsed().as_secs_f64() < secs {
                s.write_all(&buf).map_err(|e| format!("send: {e}"))?;
                sent += buf.len() as u64;
            }
            Ok(sent as f64 / start.elapsed().as_secs_f64())
        })
    }

    /// Connections per second (connect, then close with a reset: no TIME_WAIT) for `secs`.
    fn connection_rate(&self, secs: f64) -> Result<f64, String> {
        self.in_client(move |addr| {
            let (start, mut n) = (Instant::now(), 0u64);
            while start.elapsed().as_secs_f64() < secs {
                let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                    .map_err(|e| format!("connect {addr} (#{n}): {e}"))?;
                let linger = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                // SAFETY: setsockopt on the socket we own, with a linger struct of ours.
                unsafe {
                    libc::setsockopt(
                        s.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&linger as *const libc::linger).cast(),
                        std::mem::size_of::<libc::linger>() as libc::socklen_t,
                    )
                };
                drop(s);
                n += 1;
            }
            Ok(n as f64 / start.elapsed().as_secs_f64())
        })
    }

    /// Whether a connection to a port no policy allows gets an answer (a refusal) within
    /// 500 ms: it must not where policy is in force (the SYN is dropped).
    fn denied_port_answers(&self) -> Result<bool, String> {
        self.in_client(|addr| {
            let to = SocketAddr::new(addr.ip(), DENIED_PORT);
            Ok(
                match TcpStream::connect_timeout(&to, Duration::from_millis(500)) {
                    Ok(_) => true,
                    Err(e) => e.kind() != std::io::ErrorKind::TimedOut,
                },
            )
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.in_client(|addr| {
            let _ = TcpStream::connect_timeout(&addr, Duration::from_millis(300));
            Ok(())
        });
    }
}

/// One mode's packet-path samples.
struct PathRow {
    mode: String,
    throughput: Vec<f64>,
    rate: Vec<f64>,
    denied_answers: bool,
    /// SYNs the client resent during the connection-rate samples.
    syn_retransmits: u64,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

impl PathRow {
    fn new(mode: String) -> PathRow {
        PathRow {
            mode,
            throughput: Vec::new(),
            rate: Vec::new(),
            denied_answers: false,
            syn_retransmits: 0,
        }
    }

    /// One sample of each figure in the mode now in force. The mode must be what it says:
    /// the port no policy allows is dropped exactly where policy is in force.
    fn sample(&mut self, lab: &LocalLab, server: &Server, secs: f64) -> Result<(), String> {
        self.denied_answers = server.denied_port_answers()?;
        if self.denied_answers != self.mode.starts_with("(a)") {
            return Err(format!(
                "{}: a connection to port {DENIED_PORT} was {}",
                self.mode,
                if self.denied_answers {
                    "answered: the policy is not in force"
                } else {
                    "dropped without any policy"
                }
            ));
        }
        // Warm up: neighbour entries, the first connections' lookups.
        server.connection_rate(0.2)?;
        self.throughput.push(server.throughput(secs)?);
        let before = syn_retransmits(lab, "node-1-client");
        self.rate.push(server.connection_rate(secs)?);
        self.syn_retransmits += syn_retransmits(lab, "node-1-client").saturating_sub(before);
        Ok(())
    }
}

/// The naive baseline: node-3's ingress allows as iptables rules, one per allowed (source,
/// destination, port range), after an ESTABLISHED accept, then a drop per selected
/// destination. Returns the script and the position of the real pods' allow in it.
fn iptables_rules(eps: &[Endpoint], pols: &[GenPolicy]) -> (String, usize, usize) {
    let mut rules =
        vec!["-A policy-bench -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT".to_string()];
    let mut client_at = 0;
    let dests: Vec<&Endpoint> = eps.iter().filter(|e| e.node == "node-3").collect();
    let mut selected = Vec::new();
    for p in pols.iter().filter(|p| p.dir == Dir::Ingress) {
        for d in dests.iter().filter(|d| p.subject.contains(&d.app)) {
            if !selected.contains(&d.addr) {
                selected.push(d.addr);
            }
            for s in eps.iter().filter(|s| s.app == p.peer) {
                let ports = if p.ports.0 == p.ports.1 {
                    p.ports.0.to_string()
                } else {
                    format!("{}:{}", p.ports.0, p.ports.1)
                };
                if s.app == "client" && d.app == "server" {
                    client_at = rules.len() + 1;
                }
                rules.push(format!(
                    "-A policy-bench -s {}/32 -d {}/32 -p tcp --dport {ports} -j ACCEPT",
                    s.addr, d.addr
                ));
            }
        }
    }
    for d in selected {
        rules.push(format!("-A policy-bench -d {d}/32 -j DROP"));
    }
    let n = rules.len();
    let script = format!(
        "*filter\n:FORWARD ACCEPT [0:0]\n:policy-bench - [0:0]\n-A FORWARD -j policy-bench\n{}\nCOMMIT\n",
        rules.join("\n")
    );
    (script, n, client_at)
}

/// Takes the baseline out again (the jump, then its chain).
const IPTABLES_REMOVE: &str =
    "*filter\n-D FORWARD -j policy-bench\n-F policy-bench\n-X policy-bench\nCOMMIT\n";

fn iptables_restore(lab: &LocalLab, script: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.ns("node-3"),
            "iptables-restore",
            "--noflush",
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("iptables-restore: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(script.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "iptables-restore in node-3: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// A /20 of the pool that none of the lab's IPAM blocks is in (the nodes' blocks are spread
/// over the pool), for the document endpoints.
fn free_range(lab: &LocalLab) -> Result<Ipv4Addr, String> {
    let (ok, blocks) = lab.bgpctl("node-1", &["ipam", "show", "--show-blocks"]);
    if !ok {
        return Err(format!("bgpctl ipam show --show-blocks: {blocks}"));
    }
    let used: Vec<u8> = blocks
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("172.20.")?.split('.').next()?.parse().ok())
        .collect();
    (0..16u8)
        .rev()
        .map(|k| k * 16)
        .find(|first| !used.iter().any(|u| (*first..=*first + 15).contains(u)))
        .map(|first| Ipv4Addr::new(172, 20, first, 0))
        .ok_or_else(|| format!("no /20 of 172.20.0.0/16 is free of IPAM blocks:\n{blocks}"))
}

/// The SYNs the kernel of a lab namespace has sent again (`TcpExt: TCPSynRetrans`): a
/// connection-rate sample with one has a 1 s stall in it.
fn syn_retransmits(lab: &LocalLab, ns: &str) -> u64 {
    let (_, text) = lab.exec(ns, &["cat", "/proc/net/netstat"]);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with("TcpExt:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    match rows.as_slice() {
        [names, values, ..] => names
            .iter()
            .position(|n| *n == "TCPSynRetrans")
            .and_then(|i| values.get(i)?.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

struct Figures {
    load_wall: Duration,
    converge: Duration,
    chains: usize,
    rules: usize,
    load_cpu: CpuUse,
    rss_after_load: f64,
    apply_ret: Vec<Duration>,
    in_force: Vec<Duration>,
    in_force_node1: Vec<Duration>,
    lag: (Duration, Duration),
    event_cpu: CpuUse,
    rss_end: f64,
    rss_peak: f64,
    paths: Vec<PathRow>,
    naive_rules: usize,
    naive_client_at: usize,
    /// Every policy applied again until in force on every node, per round after the first.
    reapply: Vec<Duration>,
    /// Every policy deleted until every node's endpoint chains are gone, per round.
    removal: Vec<Duration>,
    /// node-3's policy table in mode (a).
    table_in_a: String,
    /// `nft -j list table` of node-1's: wall, CPU, bytes.
    read_cost: (Duration, Duration, usize),
    /// /proc/loadavg at the start and the end.
    load_avg: (String, String),
}

#[expect(
    clippy::too_many_lines,
    reason = "the benchmark told in order: lab, load, apply-to-in-force changes, then the packet path's rounds over three modes; the figures gather along the way"
)]
fn run(args: &Args) -> Result<(), String> {
    let (pods, m, k, secs, rounds) = if args.smoke {
        (40, 6, 5, 0.5, 1)
    } else {
        (
            args.pods.max(2),
            args.policies.max(4),
            args.events.max(1),
            args.seconds,
            3,
        )
    };
    let apps = args.apps.clamp(2, 99);
    let load_avg_start = load_avg();
    let lab = LocalLab::new(&format!("mpb{}", std::process::id() % 100_000));
    if args.keep_lab {
        eprintln!("policy-bench: keeping the lab {} up", lab.name);
    }
    let lab = if args.keep_lab {
        let kept = lab.borrow();
        // The owner would take the lab down when dropped.
        std::mem::forget(lab);
        kept
    } else {
        lab
    };
    let (ok, text) = lab.run(&["up"]);
    if !ok {
        return Err(format!("margay-lab up: {text}"));
    }
    for (node, pod, label) in [
        ("node-1", "client", "app=client"),
        ("node-3", "server", "app=server"),
    ] {
        let (ok, text) = lab.run(&[
            "pod-add",
            node,
            pod,
            "--namespace",
            NAMESPACE,
            "--label",
            label,
        ]);
        if !ok {
            return Err(format!("margay-lab pod-add {node} {pod}: {text}"));
        }
    }
    let range = free_range(&lab)?;
    let client_addr: Ipv4Addr = lab
        .pod_address("node-1-client")
        .parse()
        .map_err(|e| format!("client address: {e}"))?;
    let server_addr: Ipv4Addr = lab
        .pod_address("node-3-server")
        .parse()
        .map_err(|e| format!("server address: {e}"))?;
    let mut eps = endpoints(pods, apps, range);
    let doc_eps = eps.len();
    for (name, node, addr, a) in [
        ("node-1-client", "node-1", client_addr, "client"),
        ("node-3-server", "node-3", server_addr, "server"),
    ] {
        eps.push(Endpoint {
            name: name.into(),
            node,
            iface: String::new(),
            addr,
            app: a.into(),
        });
    }
    let pols = policies(m, apps);
    let mut all_pols = policies(m, apps);
    all_pols.push(event_policy(0, apps));
    let want = expected_chains(&eps, &all_pols);
    let rw = daemon_pid(&lab, "node-1", "routewriter")?;
    let bgpd = daemon_pid(&lab, "node-1", "bgpd")?;
    let mut api = Api::connect(&lab)?;

    // The load: every endpoint, then every policy, then the event policy's first version.
    let cpu0 = CpuUse::now(rw, bgpd);
    let t = Instant::now();
    for e in &eps[..doc_eps] {
        api.apply(&endpoint_doc(e))?;
    }
    for p in &pols {
        api.apply(&policy_doc(p))?;
    }
    api.apply(&policy_doc(&event_policy(0, apps)))?;
    let load_wall = t.elapsed();
    let marker = format!("dport {EVENT_BASE_PORT} ");
    let converge_time = converge(&lab, &want, Some(&marker), Duration::from_secs(300))?;
    let load_cpu = CpuUse::now(rw, bgpd).since(cpu0);
    let rss_after_load = procstat::rss_mib(rw);
    let (chains, rules, _) = table_of(&lab, "node-1");
    let read_cost = table_read_cost(&lab);

    // Apply → in force.
    let mon = Monitors::start(&lab)?;
    let lag = monitor_lag(&lab, &mon)?;
    let all_nodes: Vec<usize> = (0..NODES.len()).collect();
    let (mut apply_ret, mut in_force, mut in_force_node1) = (Vec::new(), Vec::new(), Vec::new());
    let cpu1 = CpuUse::now(rw, bgpd);
    // Change 0 is the load's; change 1 warms up and is not counted.
    for j in 1..=k + 1 {
        std::thread::sleep(Duration::from_millis(150));
        mon.drain();
        let p = event_policy(j, apps);
        let doc = policy_doc(&p);
        let port = format!("dport {} ", p.ports.0);
        let started = Instant::now();
        api.apply(&doc)?;
        let returned = started.elapsed();
        let seen = mon.wait_for(&all_nodes, &[EVENT_POLICY, &port], IN_FORCE_LIMIT)?;
        if j == 1 {
            continue;
        }
        apply_ret.push(returned);
        in_force.push(
            seen.values()
                .map(|at| *at - started)
                .max()
                .unwrap_or_default(),
        );
        in_force_node1.push(seen[&0] - started);
    }
    let event_cpu = CpuUse::now(rw, bgpd).since(cpu1).per(k + 1);
    drop(mon);

    // The packet path: (b) with the policies, (a) with none, (c) the naive iptables rules.
    let server = Server::start(
        &lab.ns("node-3-server"),
        &lab.ns("node-1-client"),
        server_addr,
    )?;
    // The modes take turns, round by round, so a burst of noise on a shared machine falls
    // on all of them; the policies are applied again (all, then the event policy's last
    // version) for each round's (b).
    let (script, naive_rules, naive_client_at) = iptables_rules(&eps, &pols);
    let mut paths = vec![
        PathRow::new(format!("(b) margay, {m} policies")),
        PathRow::new("(a) no policy".into()),
        PathRow::new(format!("(c) iptables, {naive_rules} rules")),
    ];
    let none: BTreeMap<&'static str, usize> = NODES.iter().map(|n| (*n, 0)).collect();
    let last_event = event_policy(k + 1, apps);
    let (mut reapply, mut removal) = (Vec::new(), Vec::new());
    let mut table_in_a = String::new();
    for round in 0..rounds {
        if round > 0 {
            let t = Instant::now();
            for p in &pols {
                api.apply(&policy_doc(p))?;
            }
            api.apply(&policy_doc(&last_event))?;
            let marker = format!("dport {} ", last_event.ports.0);
            converge(&lab, &want, Some(&marker), Duration::from_secs(300))?;
            reapply.push(t.elapsed());
        }
        paths[0].sample(&lab, &server, secs)?;
        let t = Instant::now();
        for p in &all_pols {
            api.delete(policy_ref(p))?;
        }
        converge(&lab, &none, None, Duration::from_secs(120))?;
        removal.push(t.elapsed());
        let (ok, text) = lab.exec("node-3", &["nft", "list", "table", "inet", TABLE]);
        table_in_a = if ok {
            format!("{} lines", text.lines().count())
        } else {
            "absent".into()
        };
        paths[1].sample(&lab, &server, secs)?;
        iptables_restore(&lab, &script)?;
        paths[2].sample(&lab, &server, secs)?;
        iptables_restore(&lab, IPTABLES_REMOVE)?;
    }
    drop(server);
    let rss_end = procstat::rss_mib(rw);
    let rss_peak = procstat::peak_rss_mib(rw);
    print(
        &Figures {
            load_wall,
            converge: converge_time,
            chains,
            rules,
            load_cpu,
            rss_after_load,
            apply_ret,
            in_force,
            in_force_node1,
            lag,
            event_cpu,
            rss_end,
            rss_peak,
            paths,
            naive_rules,
            naive_client_at,
            reapply,
            removal,
            table_in_a,
            read_cost,
            load_avg: (load_avg_start, load_avg()),
        },
        pods,
        m,
        k,
    );
    Ok(())
}

/// The machine's load averages (1, 5, 15 min): the figures are only as good as the machine
/// was idle.
fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[expect(
    clippy::too_many_lines,
    reason = "prints the report's tables one after another, one println per line of output"
)]
fn print(f: &Figures, pods: usize, m: usize, k: usize) {
    println!(
        "policy-bench: {pods} endpoints on node-1 (1 real pod), 3 x one per app on nodes 2-4, \
         {m} policies (K8s, Calico, global); 4 nodes; {} build",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!(
        "load: applied in {:.2} s, every node's table converged {:.2} s later; node-1: {} \
         endpoint chains, {} rules",
        f.load_wall.as_secs_f64(),
        f.converge.as_secs_f64(),
        f.chains,
        f.rules
    );
    println!();
    println!(
        "{:<44} {:>10} {:>10} {:>10}",
        format!("apply -> in force, {k} changes"),
        "p50",
        "p99",
        "max"
    );
    for (what, v) in [
        ("Policy.Apply returned", &f.apply_ret),
        ("rule in node-1's kernel", &f.in_force_node1),
        ("rule in every node's kernel (4)", &f.in_force),
    ] {
        let mut v = v.clone();
        let max = v.iter().max().copied().unwrap_or_default();
        println!(
            "{what:<44} {:>10} {:>10} {:>10}",
            ms(percentile(&mut v, 0.5)),
            ms(percentile(&mut v, 0.99)),
            ms(max)
        );
    }
    println!(
        "resolution: nft monitor's line {} after a probe rule's nft exited, {} after it started (p50)",
        ms(f.lag.0),
        ms(f.lag.1)
    );
    println!(
        "node-1's table read back as routewriter reads it before a write (nft -j list table, \
         {} KiB): {} wall, {} CPU (p50 of 5)",
        f.read_cost.2 / 1024,
        ms(f.read_cost.0),
        ms(f.read_cost.1)
    );
    println!();
    println!(
        "{:<34} {:>14} {:>14} {:>14}",
        "CPU on node-1", "routewriter", "its nft runs", "bgpd"
    );
    for (what, c, scale, unit) in [
        ("the load", f.load_cpu, 1e3, "ms"),
        ("per change", f.event_cpu, 1e3, "ms"),
    ] {
        println!(
            "{what:<34} {:>11.2} {unit:<2} {:>11.2} {unit:<2} {:>11.2} {unit:<2}",
            c.routewriter * scale,
            c.nft * scale,
            c.bgpd * scale
        );
    }
    println!(
        "routewriter node-1 RSS: {:.1} MiB after the load, {:.1} MiB at the end, peak {:.1} MiB",
        f.rss_after_load, f.rss_end, f.rss_peak
    );
    println!();
    println!(
        "{:<34} {:>12} {:>14} {:>9} {:>9} {:>8} {:>8}",
        "packet path node-1 -> node-3",
        "TCP Gbit/s",
        "connections/s",
        "tput/a",
        "conn/a",
        "SYN rtx",
        "denied"
    );
    let base = f.paths.iter().find(|p| p.mode.starts_with("(a)"));
    let (bt, br) = base.map_or((1.0, 1.0), |b| (median(&b.throughput), median(&b.rate)));
    for p in &f.paths {
        let (t, r) = (median(&p.throughput), median(&p.rate));
        println!(
            "{:<34} {:>12.2} {:>14.0} {:>9.2} {:>9.2} {:>8} {:>8}",
            p.mode,
            t * 8.0 / 1e9,
            r,
            t / bt,
            r / br,
            p.syn_retransmits,
            if p.denied_answers {
                "answers"
            } else {
                "dropped"
            }
        );
    }
    println!(
        "(medians of {} samples, modes in turns; the naive allow of the pods' pair is rule {} \
         of {} in node-3's FORWARD; node-3's margay table in (a): {})",
        f.paths.first().map_or(0, |p| p.rate.len()),
        f.naive_client_at,
        f.naive_rules,
        f.table_in_a
    );
    let secs = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.2}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "mode switches: every policy deleted -> every node's chains gone in {} s; applied again \
         -> in force on every node in {} s",
        secs(&f.removal),
        if f.reapply.is_empty() {
            "-".into()
        } else {
            secs(&f.reapply)
        }
    );
    println!(
        "load average at the start {}, at the end {} ({} cores)",
        f.load_avg.0,
        f.load_avg.1,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    let mut v = f.in_force.clone();
    let p99 = percentile(&mut v, 0.99);
    println!(
        "== apply -> in force on every node: p50 {} p99 {} (target p99 <= 200 ms: {})",
        ms(percentile(&mut v, 0.5)),
        ms(p99),
        if p99 <= Duration::from_millis(200) {
            "met"
        } else {
            "missed"
        }
    );
    println!(
        "== routewriter node-1 with {pods} endpoints: {:.1} MiB RSS, {:.1} ms CPU for the load, {:.1} ms per change (own + nft runs)",
        f.rss_after_load,
        (f.load_cpu.routewriter + f.load_cpu.nft) * 1e3,
        (f.event_cpu.routewriter + f.event_cpu.nft) * 1e3
    );
    let ratio = |prefix: &str| {
        f.paths
            .iter()
            .find(|p| p.mode.starts_with(prefix))
            .map_or((0.0, 0.0), |p| {
                (median(&p.throughput) / bt, median(&p.rate) / br)
            })
    };
    let (b, c) = (ratio("(b)"), ratio("(c)"));
    println!(
        "== packet path b/a: throughput {:.2} connections/s {:.2} (target >= 0.90: {}); c/a: throughput {:.2} connections/s {:.2}",
        b.0,
        b.1,
        if b.0 >= 0.9 && b.1 >= 0.9 {
            "met"
        } else {
            "missed"
        },
        c.0,
        c.1
    );
}

fn main() -> std::process::ExitCode {
    match run(&Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("policy-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
