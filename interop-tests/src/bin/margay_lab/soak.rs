//! `margay-lab soak`: the lab under faults, the IO side of `interop_tests::lab::soak`.
//!
//! Why this file is long: one driver for every fault kind (each a few lines of real work on
//! namespaces, processes, nftables or a file system) and the end checks, which share the
//! lab's names.
//!
//! One `ping -D -O -i 0.1 -W 1` per ordered pair of pods and family, in the source pod's
//! namespace, while faults drawn from the seed hit the cluster one at a time: kill -9 of
//! bgpd / routewriter / both with a restart (never on node-1, so its daemons' memory is
//! measured over the whole run), SIGHUP of bgpd, the pools' vxlanMode flipped, a pod created
//! and deleted, a node's eth0 down, 20% loss on the router (nftables `numgen random`: this
//! kernel has no netem); on SQLite the datastore's file system full, on etcd a member killed,
//! the leader killed, a member cut off from the others. During and after each datastore fault
//! a pod is created and deleted through CNI, as a user's runtime would. On Kubernetes the
//! churn and probe pods' Pods are made at the start: their ADDs and DELs restart a sandbox.
//!
//! After each fault the ping matrix must be green within 10 s. At the end: `bgpctl ipam
//! check`, a leak check (`ipam gc --dry-run` against the live pods), each node's proto-80
//! routes against its Dataplane snapshot, the link cuts' loss against the cut, the datastore
//! writes, no process in the lab's namespaces but its own; then the lab goes down and nothing
//! may be left (namespaces, processes, the mount). One table; non-zero exit when a check
//! fails. Pinger and daemon logs are kept in /tmp/margay-soak-<lab>.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use interop_tests::lab::soak;

use super::{
    Datastore, NETWORK, NODES, NodeSpec, Pod, alive, bgpctl, block_on, cni, cni_add, cni_del, down,
    etcd, gone, in_ns, ip, is_mounted, is_up, kill9, kube, lab_name, lab_namespaces, load_pods,
    matrix, node_dir, ns, pids, pod_ns, recorded_pid, socket, start_again, state, store_dir, up,
    wait_for,
};

/// The soak's options (see `margay-lab soak --help`).
pub struct SoakArgs {
    pub minutes: f64,
    pub seed: u64,
    pub datastore: Datastore,
    /// Print the seed's schedule and stop.
    pub plan: bool,
}

/// The faults a seed plans for a run (planned times: the run's own take what they take).
fn print_plan(args: &SoakArgs, store: soak::Store) {
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let mut t = Duration::ZERO;
    println!(
        "margay-lab soak: seed {}, {:.1} min, planned faults:",
        args.seed, args.minutes
    );
    for f in soak::schedule(args.seed, NODES.len(), total, store) {
        t += f.gap;
        println!(
            "  ~{:6.1} s  {:<24} {:<8} hold {:.1} s",
            t.as_secs_f64(),
            f.kind.name(),
            if f.kind.has_node() {
                NODES[f.node].name
            } else {
                "-"
            },
            f.hold.as_secs_f64()
        );
        t += f.hold + Duration::from_secs(4);
    }
}

/// The pingers of a soak: one `ping -D -O -i 0.1 -W 1` per ordered pair of pods and family,
/// each in its source pod's namespace, its output in a file. Stopped by PID (SIGINT, so ping
/// prints its last lines; SIGKILL after 2 s) when dropped: on success, on error, on a panic.
struct Pingers {
    children: Vec<std::process::Child>,
    logs: Vec<PathBuf>,
}

/// The pingers' interval: 10 pings per second per pair.
const PING_INTERVAL: Duration = Duration::from_millis(100);

impl Pingers {
    fn start(pods: &[Pod], dir: &Path) -> Result<Pingers, String> {
        let mut me = Pingers {
            children: Vec::new(),
            logs: Vec::new(),
        };
        for from in pods {
            for to in pods.iter().filter(|t| t.name != from.name) {
                for (flag, dest) in [("-4", &to.address), ("-6", &to.address6)] {
                    let log = dir.join(format!("ping{flag}-{}-{}.log", from.name, to.name));
                    let out = std::fs::File::create(&log)
                        .map_err(|e| format!("{}: {e}", log.display()))?;
                    let child = Command::new("ip")
                        .args(["netns", "exec", &from.ns, "ping", flag, "-D", "-O"])
                        .args(["-i", "0.1", "-W", "1", dest])
                        .stdin(Stdio::null())
                        .stdout(out)
                        .stderr(Stdio::null())
                        .spawn()
                        .map_err(|e| format!("starting ping in {}: {e}", from.ns))?;
                    me.children.push(child);
                    me.logs.push(log);
                }
            }
        }
        let pids: Vec<String> = me.children.iter().map(|c| c.id().to_string()).collect();
        let _ = std::fs::write(dir.join("pingers.pids"), pids.join("\n"));
        Ok(me)
    }

    /// Stops every pinger (once) and returns the logs to read.
    fn stop(&mut self) -> Vec<PathBuf> {
        let mut children = std::mem::take(&mut self.children);
        for c in &children {
            // SAFETY: kill(2) of a child this process spawned and has not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for c in &mut children {
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        std::mem::take(&mut self.logs)
    }
}

impl Drop for Pingers {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// What injecting a fault came to.
enum Injected {
    Done(String),
    Unavailable(String),
}

/// Does one fault, from its first action to its last; what it did, for the log. A datastore
/// fault adds its writes' outcomes to `probes`.
#[expect(
    clippy::too_many_lines,
    reason = "one match arm per soak fault kind, each from its first action to its recovery"
)]
fn inject(
    f: &soak::Fault,
    node: &NodeSpec,
    pods: &[Pod],
    probes: &mut Vec<soak::Probe>,
) -> Result<Injected, String> {
    use soak::FaultKind as K;
    let n = node.name;
    let hold = f.hold;
    match f.kind {
        K::KillBgpd | K::KillRoutewriter | K::KillBoth => {
            let daemons: &[&str] = match f.kind {
                K::KillBgpd => &["bgpd"],
                K::KillRoutewriter => &["routewriter"],
                _ => &["bgpd", "routewriter"],
            };
            for d in daemons {
                kill9(n, d)?;
            }
            std::thread::sleep(hold);
            for d in daemons {
                start_again(n, d)?;
            }
            Ok(Injected::Done(format!(
                "on {n}, restarted after {:.1} s",
                hold.as_secs_f64()
            )))
        }
        K::ReloadBgpd => {
            // Peer options changed in node.toml and reloaded, as an operator does: a configured
            // peer is added, its options changed, and it is removed, each by SIGHUP, with
            // `[bgp] error_wait_time` changed on the way. The peer is passive, at an address
            // no one has in the lab: no session, no packet. Only its session may be touched;
            // the mesh must lose nothing.
            let config = node_dir(n).join("node.toml");
            let original = std::fs::read_to_string(&config).map_err(|e| e.to_string())?;
            let pid = recorded_pid(n, "bgpd")?;
            let with_peer = |hold: u16| {
                format!(
                    "{original}[bgp]\nerror_wait_time = [5, 30]\n[[bgp.peers]]\naddress = \"{RELOAD_PEER}\"\nas = 65099\npassive = true\nhold_time = {hold}\n"
                )
            };
            for (text, present) in [
                (with_peer(30), true),
                (with_peer(90), true),
                (original.clone(), false),
            ] {
                std::fs::write(&config, &text).map_err(|e| e.to_string())?;
                // SAFETY: kill(2) of a pid this lab recorded.
                unsafe { libc::kill(pid, libc::SIGHUP) };
                let mut seen = String::new();
                wait_for(
                    &format!(
                        "bgpd on {n} to reload (peer {RELOAD_PEER} {})",
                        if present { "configured" } else { "gone" }
                    ),
                    Duration::from_secs(5),
                    || {
                        seen = bgpctl(n, &["show", "protocols", "--json"]).unwrap_or_default();
                        seen.contains(RELOAD_PEER) == present
                    },
                )
                .map_err(|e| format!("{e}: {seen}"))?;
                if !alive(pid) {
                    return Err(format!("bgpd on {n} died on SIGHUP"));
                }
            }
            Ok(Injected::Done(format!(
                "on {n}, a peer added (hold 30 s), changed (hold 90 s) and removed, error_wait_time changed and back"
            )))
        }
        K::PoolMode => {
            let set = |mode: &str| -> Result<(), String> {
                for pool in ["default-ipv4-ippool", "default-ipv6-ippool"] {
                    bgpctl(n, &["pool", "set", pool, "--vxlan-mode", mode])?;
                }
                Ok(())
            };
            set("Always")?;
            std::thread::sleep(hold);
            set("CrossSubnet")?;
            Ok(Injected::Done(format!(
                "both pools Always for {:.1} s (via {n})",
                hold.as_secs_f64()
            )))
        }
        K::PodChurn => {
            let p = cni_add(n, CHURN_POD, "default", &[])?;
            cni_del(n, CHURN_POD, "default")?;
            Ok(Injected::Done(format!(
                "{} created ({}, {}) and deleted",
                p.name, p.address, p.address6
            )))
        }
        K::UplinkDown => {
            let node_ns = ns(n);
            in_ns(&node_ns, &["ip", "link", "set", "eth0", "down"])?;
            std::thread::sleep(hold);
            in_ns(&node_ns, &["ip", "link", "set", "eth0", "up"])?;
            // Admin down takes the routes through eth0 with it: the lab's own default routes
            // come back as a node's network manager would bring them (margay's are
            // routewriter's to repair).
            in_ns(
                &node_ns,
                &["ip", "route", "replace", "default", "via", node.gateway],
            )?;
            in_ns(
                &node_ns,
                &[
                    "ip",
                    "-6",
                    "route",
                    "replace",
                    "default",
                    "via",
                    node.gateway6,
                ],
            )?;
            Ok(Injected::Done(format!(
                "{n} eth0 down for {:.1} s",
                hold.as_secs_f64()
            )))
        }
        K::RouterLoss => {
            // netem would drop on the router's legs; this kernel has no sch_netem, so the
            // router's forward hook drops a random 20% of what it forwards, both ways.
            let router = ns("router");
            let file = state().join("soak-loss.nft");
            std::fs::write(
                &file,
                format!(
                    "table inet {LOSS_TABLE} {{\n chain forward {{ type filter hook forward priority 0; policy accept; numgen random mod 100 < 20 drop; }}\n}}\n"
                ),
            )
            .map_err(|e| e.to_string())?;
            if let Err(e) = in_ns(&router, &["nft", "-f", &file.display().to_string()]) {
                let why = e.rsplit_once("failed: ").map_or(e.as_str(), |(_, w)| w);
                return Ok(Injected::Unavailable(format!(
                    "nftables in {router}: {why}"
                )));
            }
            std::thread::sleep(hold);
            in_ns(&router, &["nft", "delete", "table", "inet", LOSS_TABLE])?;
            Ok(Injected::Done(format!(
                "20% of what the router forwards dropped for {:.0} s",
                hold.as_secs_f64()
            )))
        }
        K::DiskFull => {
            let until = Instant::now() + hold;
            let fill = store_dir().join("fill");
            let bytes = fill_disk(&fill)?;
            std::thread::sleep(PROBE_AFTER);
            let during = probe(n, soak::ProbePhase::During, f.kind);
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            std::fs::remove_file(&fill).map_err(|e| format!("{}: {e}", fill.display()))?;
            let during = during.finish(n, pods);
            let after = probe(n, soak::ProbePhase::After, f.kind).finish(n, pods);
            let what = format!(
                "{} full ({} MiB written) for {:.1} s; a write through {n} during: {}, after: {}",
                store_dir().display(),
                bytes >> 20,
                hold.as_secs_f64(),
                outcome(&during.outcome),
                outcome(&after.outcome)
            );
            probes.extend([during, after]);
            Ok(Injected::Done(what))
        }
        K::EtcdKillMember | K::EtcdKillLeader | K::EtcdPartition => {
            let member = if f.kind == K::EtcdKillLeader {
                etcd::wait_leader(Duration::from_secs(10))?
            } else {
                f.node % etcd::MEMBERS
            };
            let was_leader = etcd::leader() == Some(member);
            let until = Instant::now() + hold;
            if f.kind == K::EtcdPartition {
                etcd::partition(member, true)?;
            } else {
                etcd::kill(member)?;
            }
            std::thread::sleep(PROBE_AFTER);
            let during = probe(n, soak::ProbePhase::During, f.kind);
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            if f.kind == K::EtcdPartition {
                etcd::partition(member, false)?;
            } else {
                etcd::restart(member)?;
            }
            let during = during.finish(n, pods);
            let after = probe(n, soak::ProbePhase::After, f.kind).finish(n, pods);
            let what = format!(
                "{}{} {} for {:.1} s; a write through {n} during: {}, after: {}",
                etcd::member(member),
                if was_leader { " (the leader)" } else { "" },
                if f.kind == K::EtcdPartition {
                    "cut off from the others"
                } else {
                    "killed, restarted"
                },
                hold.as_secs_f64(),
                outcome(&during.outcome),
                outcome(&after.outcome)
            );
            probes.extend([during, after]);
            Ok(Injected::Done(what))
        }
        K::ApiserverKill | K::KubeEtcdKill => {
            let until = Instant::now() + hold;
            let what = if f.kind == K::ApiserverKill {
                kube::kill_apiserver()?;
                "the kube-apiserver"
            } else {
                kube::kill_etcd()?;
                "the etcd under the apiserver"
            };
            std::thread::sleep(PROBE_AFTER);
            let during = probe(n, soak::ProbePhase::During, f.kind);
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            if f.kind == K::ApiserverKill {
                kube::start_apiserver()?;
            } else {
                kube::start_etcd()?;
                kube::wait_ready(Duration::from_secs(60))?;
            }
            let during = during.finish(n, pods);
            let after = probe(n, soak::ProbePhase::After, f.kind).finish(n, pods);
            let what = format!(
                "{what} killed for {:.1} s, restarted; a write through {n} during: {}, after: {}",
                hold.as_secs_f64(),
                outcome(&during.outcome),
                outcome(&after.outcome)
            );
            probes.extend([during, after]);
            Ok(Injected::Done(what))
        }
    }
}

/// The configured peer the reload fault adds and removes: an address no one has in the lab.
const RELOAD_PEER: &str = "10.99.1.99";

/// The router's loss table (in its namespace).
const LOSS_TABLE: &str = "margay_soak_loss";

/// How long into a datastore fault its write is tried (the fault has taken hold by then: a
/// member's death is seen, an election has begun).
const PROBE_AFTER: Duration = Duration::from_secs(1);

/// Fills the file system of `file` until it refuses more (ENOSPC); the bytes written.
fn fill_disk(file: &Path) -> Result<u64, String> {
    use std::io::Write;
    let mut out = std::fs::File::create(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match out.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => return Err(format!("filling {}: {e}", file.display())),
        }
    }
    // Whatever the page cache holds must be on the file system too.
    let _ = out.sync_all();
    Ok(written)
}

fn outcome(o: &soak::ProbeOutcome) -> String {
    match o {
        soak::ProbeOutcome::Written { secs } => format!("written ({secs:.2} s)"),
        soak::ProbeOutcome::Refused { error, clean } => format!(
            "refused{} ({})",
            if *clean { " cleanly" } else { ", NOT clean" },
            error.chars().take(160).collect::<String>()
        ),
    }
}

/// A probe's pod, its CNI DEL still owed when the ADD or the DEL failed during the fault.
struct PendingProbe {
    probe: soak::Probe,
    del_owed: bool,
}

/// The probe pod's name (one at a time: faults do not overlap).
const PROBE_POD: &str = "probe";

/// The pod the pod churn fault creates and deletes.
const CHURN_POD: &str = "churn";

/// On Kubernetes, the churn and probe pods' Pods on every node, made before any fault (while
/// the apiserver is up): their ADDs and DELs during the soak are a kubelet's sandbox restarts
/// of a Pod that exists, and ask the apiserver nothing, as today when it is down.
fn make_sandbox_pods() -> Result<(), String> {
    for n in &NODES {
        for pod in [CHURN_POD, PROBE_POD] {
            kube::ensure_pod(n.name, &format!("{}-{pod}", n.name), "default", &[])?;
        }
    }
    Ok(())
}

/// A pod created and deleted on `node` through CNI, as a runtime does it.
fn probe(node: &str, phase: soak::ProbePhase, kind: soak::FaultKind) -> PendingProbe {
    let t = Instant::now();
    let (outcome, del_owed) = match cni_add(node, PROBE_POD, "default", &[]) {
        Ok(_) => {
            let secs = t.elapsed().as_secs_f64();
            match cni_del(node, PROBE_POD, "default") {
                Ok(()) => (soak::ProbeOutcome::Written { secs }, false),
                Err(e) => (
                    soak::ProbeOutcome::Refused {
                        error: format!("ADD taken, DEL refused: {e}"),
                        clean: false,
                    },
                    true,
                ),
            }
        }
        Err(e) => (
            soak::ProbeOutcome::Refused {
                // A CNI error object has a code; anything else is not the spec's answer.
                clean: e.contains("\"code\""),
                error: e,
            },
            true,
        ),
    };
    PendingProbe {
        probe: soak::Probe {
            kind,
            phase,
            outcome,
        },
        del_owed,
    }
}

impl PendingProbe {
    /// Once the fault is over: the runtime's cleanup (a DEL, retried for up to 10 s), then
    /// whether anything of the probe's pod is left allocated.
    fn finish(mut self, node: &str, pods: &[Pod]) -> soak::Probe {
        if !self.del_owed {
            return self.probe;
        }
        let mut del = Err(String::new());
        let _ = wait_for("the probe's DEL", Duration::from_secs(10), || {
            del = cni("DEL", node, PROBE_POD, "default", &[]).map(|_| ());
            del.is_ok()
        });
        let _ = ip(&["netns", "del", &pod_ns(node, PROBE_POD)]);
        // Just after the fault the datastore may still be settling (a new leader): asked
        // again for a few seconds before it counts as a failed check.
        let mut leaked = Err(String::new());
        let _ = wait_for("the leak check", Duration::from_secs(10), || {
            leaked = leaked_handles(node, pods);
            leaked.is_ok()
        });
        if let soak::ProbeOutcome::Refused { error, clean } = &mut self.probe.outcome {
            match (&del, &leaked) {
                (Ok(()), Ok(l)) if l.is_empty() => {}
                (Err(e), _) => {
                    *clean = false;
                    error.push_str(&format!("; the runtime's DEL after the fault: {e}"));
                }
                (_, Ok(l)) => {
                    *clean = false;
                    error.push_str(&format!("; left allocated: {}", l.join(", ")));
                }
                (_, Err(e)) => {
                    *clean = false;
                    error.push_str(&format!("; leak check: {e}"));
                }
            }
        }
        self.probe
    }
}

/// Handles of the lab's network on `node` that belong to no live pod (`ipam gc --dry-run`).
fn leaked_handles(node: &str, pods: &[Pod]) -> Result<Vec<String>, String> {
    let live: Vec<String> = pods
        .iter()
        .filter(|p| p.node == node)
        .map(pod_handle)
        .collect();
    let out = bgpctl(
        node,
        &[
            "ipam",
            "gc",
            "--node",
            node,
            "--live",
            &live.join(","),
            "--prefix",
            &format!("{NETWORK}."),
            "--dry-run",
            "--json",
        ],
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| format!("ipam gc --json: {e}: {out}"))?;
    Ok(v["released"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| format!("{node}: {}", h["handle"]))
        .collect())
}

/// How long after `since` the whole ping matrix (both families) answers again; `None` if not
/// within `limit`.
fn recovery(pods: &[Pod], limit: Duration) -> Option<Duration> {
    let since = Instant::now();
    loop {
        if matrix(pods, false).1 && matrix(pods, true).1 {
            return Some(since.elapsed());
        }
        if since.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// bgpd and routewriter of every node: key (`node-1-bgpd`), PID, VmRSS in KiB.
fn daemon_rss() -> Vec<(String, i32, u64)> {
    pids()
        .into_iter()
        .filter(|(k, _)| k.ends_with("-bgpd") || k.ends_with("-routewriter"))
        .filter(|(_, p)| alive(*p))
        .map(|(k, p)| {
            let kib = (interop_tests::lab::procstat::rss_mib(p) * 1024.0).round() as u64;
            (k, p, kib)
        })
        .collect()
}

/// The routes bgpd wants on `node`'s kernel: the Dataplane stream's snapshot, read as
/// routewriter reads it.
fn desired_routes(node: &str) -> Result<std::collections::BTreeSet<String>, String> {
    use routewriter::desired::{Defaults, DesiredState};
    block_on(async {
        let ch = proto::client::connect_unix(&socket(node))
            .await
            .map_err(|e| format!("bgpd on {node}: {e}"))?;
        let mut stream = proto::v1::dataplane_client::DataplaneClient::new(ch)
            .watch(proto::v1::WatchRequest { from_revision: 0 })
            .await
            .map_err(|e| format!("Dataplane.Watch on {node}: {e}"))?
            .into_inner();
        let mut desired = DesiredState::new(Defaults::default());
        while !desired.is_complete() {
            let update = tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .map_err(|_| format!("no snapshot from bgpd on {node} within 5 s"))?
                .map_err(|e| format!("Dataplane.Watch on {node}: {e}"))?
                .ok_or_else(|| format!("bgpd on {node} ended the stream"))?;
            desired.apply(&update);
        }
        Ok(desired
            .routes()
            .iter()
            .map(|(p, _)| normal_prefix(&p.to_string()))
            .collect())
    })
}

/// A prefix as `ip -j route` or the desired state spells it, in one spelling.
fn normal_prefix(dst: &str) -> String {
    let full = match dst {
        "default" => return "default".into(),
        d if d.contains('/') => d.to_owned(),
        d if d.contains(':') => format!("{d}/128"),
        d => format!("{d}/32"),
    };
    full.parse::<ipnet::IpNet>()
        .map(|n| n.to_string())
        .unwrap_or(full)
}

/// routewriter's routes (protocol 80) in `node`'s kernel, both families, every table.
fn kernel_routes(node: &str) -> Result<std::collections::BTreeSet<String>, String> {
    let mut out = std::collections::BTreeSet::new();
    for family in ["-4", "-6"] {
        let text = in_ns(
            &ns(node),
            &[
                "ip", "-j", family, "route", "show", "table", "all", "proto", "80",
            ],
        )?;
        let routes: Vec<serde_json::Value> = serde_json::from_str(text.trim())
            .map_err(|e| format!("ip -j route on {node}: {e}: {text}"))?;
        for r in routes {
            if let Some(dst) = r["dst"].as_str() {
                out.insert(normal_prefix(dst));
            }
        }
    }
    Ok(out)
}

/// Desired against kernel on one node: `Ok` when equal, else what differs (a few of each).
fn kernel_matches_desired(node: &str) -> Result<usize, String> {
    let desired = desired_routes(node)?;
    let kernel = kernel_routes(node)?;
    if desired == kernel {
        return Ok(desired.len());
    }
    let few = |s: Vec<&String>| {
        s.iter()
            .take(4)
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    Err(format!(
        "{node}: missing from the kernel [{}], not desired [{}]",
        few(desired.difference(&kernel).collect()),
        few(kernel.difference(&desired).collect())
    ))
}

/// CNI's handle for a lab pod (`<network>.<container id>`, the container id as `cni` sets it).
fn pod_handle(pod: &Pod) -> String {
    format!("{NETWORK}.lab{}", pod.name.replace('-', ""))
}

/// `margay-lab soak`: pingers, the fault schedule, the checks, the table, the teardown.
#[expect(
    clippy::too_many_lines,
    reason = "the soak run in order: pingers, the fault schedule with its timing budget, the checks, the RSS baseline, the table and the teardown"
)]
pub fn run(args: SoakArgs) -> Result<bool, String> {
    let store = match args.datastore {
        Datastore::Sqlite => soak::Store::Sqlite,
        Datastore::Etcd => soak::Store::Etcd,
        Datastore::Kubernetes => soak::Store::Kubernetes,
    };
    if args.plan {
        print_plan(&args, store);
        return Ok(true);
    }
    if is_up() {
        if let Some(running) = Datastore::recorded()
            && running != args.datastore
        {
            return Err(format!(
                "the lab is up on {}: run `margay-lab down` first to soak the other datastore",
                running.describe()
            ));
        }
        if args.datastore == Datastore::Sqlite && !is_mounted(&store_dir()) {
            return Err(format!(
                "the lab's SQLite file is not on its own file system ({}): it was brought up by an older margay-lab; run `margay-lab down` first",
                store_dir().display()
            ));
        }
    } else {
        println!("margay-lab: the lab is not up; bringing it up");
        if !up(args.datastore)? {
            return Err("the lab came up without a full ping matrix: not soaking".into());
        }
    }
    if args.datastore == Datastore::Kubernetes {
        make_sandbox_pods()?;
    }
    let pods = load_pods();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    println!(
        "margay-lab soak: seed {} ({:.1} min on {}, {} pods, {} pingers at 10/s)",
        args.seed,
        args.minutes,
        args.datastore.describe(),
        pods.len(),
        pods.len() * (pods.len() - 1) * 2
    );
    let dir = std::env::temp_dir().join(format!("margay-soak-{}", lab_name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // IPv6 addresses would go with an admin-down eth0 (and not come back: they are static).
    for n in &NODES {
        in_ns(
            &ns(n.name),
            &["sysctl", "-qw", "net.ipv6.conf.eth0.keep_addr_on_down=1"],
        )?;
    }
    // Planned times are estimates (a restart or a recovery takes what it takes): the list
    // covers three times the run so the driver, which stops by the clock, never runs dry.
    let plan = soak::schedule(args.seed, NODES.len(), total * 3, store);
    let mut report = soak::Report {
        seed: args.seed,
        minutes: args.minutes,
        store,
        ..Default::default()
    };
    // The RSS window starts at minute 5; a short run takes its middle.
    let baseline_at = Duration::from_secs(300).min(total / 2);
    report.rss_baseline_at = baseline_at.as_secs_f64();
    let mut baseline: Option<Vec<(String, i32, u64)>> = None;
    let mut windows = Vec::new();
    let mut recoveries: Vec<(String, Option<Duration>)> = Vec::new();
    let mut longest_cut = Duration::ZERO;
    let mut pingers = Pingers::start(&pods, &dir)?;
    let start = Instant::now();
    // Waits, taking the RSS baseline when its time comes (between faults: daemons are up).
    let idle = |d: Duration, baseline: &mut Option<Vec<(String, i32, u64)>>| {
        let until = Instant::now() + d;
        while Instant::now() < until {
            if baseline.is_none() && start.elapsed() >= baseline_at {
                *baseline = Some(daemon_rss());
            }
            std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
        }
    };
    for f in &plan {
        let node = &NODES[f.node];
        // The fault, its recovery check and a margin must fit in what is left.
        // A known-unavailable kind takes no time; a shorter fault further on may still fit.
        let need = f.gap + f.hold + soak::RECOVERY + Duration::from_secs(5);
        if report.unavailable.contains_key(&f.kind) || start.elapsed() + need > total {
            continue;
        }
        idle(f.gap, &mut baseline);
        let at = start.elapsed().as_secs_f64();
        let t0 = unix_now();
        match inject(f, node, &pods, &mut report.probes)? {
            Injected::Unavailable(why) => {
                println!("[{at:6.1} s] {}: unavailable: {why}", f.kind.name());
                report.unavailable.insert(f.kind, why);
            }
            Injected::Done(what) => {
                let t1 = unix_now();
                windows.push(soak::Window {
                    kind: f.kind,
                    start: t0,
                    end: t1,
                });
                if f.kind == soak::FaultKind::UplinkDown {
                    longest_cut = longest_cut.max(f.hold);
                }
                *report.injected.entry(f.kind).or_default() += 1;
                // Waits past the limit (30 s) so a late recovery is measured, and the next
                // fault does not land on a broken cluster.
                let rec = recovery(&pods, Duration::from_secs(30));
                println!(
                    "[{at:6.1} s] {} {what} ({:.1} s): {}",
                    f.kind.name(),
                    t1 - t0,
                    match rec {
                        Some(d) => format!("matrix green {:.1} s after its end", d.as_secs_f64()),
                        None => "matrix NOT green 30 s after its end".into(),
                    }
                );
                recoveries.push((f.kind.name().to_owned(), rec));
            }
        }
    }
    idle(total.saturating_sub(start.elapsed()), &mut baseline);
    let baseline = baseline.unwrap_or_else(daemon_rss);
    let end_rss = daemon_rss();
    let logs = pingers.stop();
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        report.add_pings(&soak::parse_ping(&text, PING_INTERVAL), &windows);
    }
    let mut baseline = baseline;
    baseline.sort();
    for (key, pid, kib) in baseline {
        report.rss.push(soak::Rss {
            end_kib: end_rss
                .iter()
                .find(|(k, p, _)| *k == key && *p == pid)
                .map(|(_, _, kib)| *kib),
            process: key,
            baseline_kib: kib,
        });
    }
    end_checks(&mut report, &pods, &recoveries, longest_cut)?;
    println!(
        "margay-lab soak: pinger and daemon logs in {} (wall time {:.0} s)",
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    keep_logs(&dir);
    teardown_checks(&mut report)?;
    print!("{}", report.render());
    Ok(report.passed())
}

/// The checks on the cluster as the run leaves it (before it goes down).
fn end_checks(
    report: &mut soak::Report,
    pods: &[Pod],
    recoveries: &[(String, Option<Duration>)],
    longest_cut: Duration,
) -> Result<(), String> {
    let mut ipam_problems = Vec::new();
    for n in &NODES {
        if let Err(e) = bgpctl(n.name, &["ipam", "check"]) {
            ipam_problems.push(format!("{}: {e}", n.name));
        }
    }
    report.checks.push(soak::Check::of(
        "bgpctl ipam check clean on every node",
        ipam_problems,
        || format!("{} nodes", NODES.len()),
    ));
    // Leaks: every handle of the lab's network on a node must be one of its live pods.
    let mut leaked = Vec::new();
    for n in &NODES {
        leaked.extend(leaked_handles(n.name, pods)?);
    }
    report.checks.push(soak::Check::of(
        "no leaked address (every handle a live pod's)",
        leaked,
        || format!("{} live pods", pods.len()),
    ));
    // Desired against kernel, given a few seconds to settle after the last fault.
    let mut drift = Vec::new();
    let mut compared = 0;
    for n in &NODES {
        let mut last = Ok(0);
        for _ in 0..10 {
            last = kernel_matches_desired(n.name);
            if last.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        match last {
            Ok(routes) => compared += routes,
            Err(e) => drift.push(e),
        }
    }
    report.checks.push(soak::Check::of(
        "kernel routes (proto 80) = desired on every node",
        drift,
        || format!("{} nodes, {compared} routes by prefix", NODES.len()),
    ));
    let late: Vec<String> = recoveries
        .iter()
        .filter(|(_, r)| !r.is_some_and(|d| d <= soak::RECOVERY))
        .map(|(k, r)| match r {
            Some(d) => format!("{k} {:.1} s", d.as_secs_f64()),
            None => format!("{k} never"),
        })
        .collect();
    let worst = recoveries
        .iter()
        .filter_map(|(_, r)| *r)
        .max()
        .unwrap_or_default();
    report.checks.push(soak::Check::of(
        "matrix green within 10 s of every fault",
        late,
        || {
            format!(
                "{} faults, slowest {:.1} s",
                recoveries.len(),
                worst.as_secs_f64()
            )
        },
    ));
    report
        .checks
        .push(report.link_cut_check(longest_cut, MESH_HOLD_TIME));
    report.checks.push(soak::probe_check(&report.probes));
    // Every daemon the lab recorded still runs: none died on its own (the soak restarts
    // what it kills, and records the new PID).
    let recorded = pids();
    let dead: Vec<String> = recorded
        .iter()
        .filter(|(_, p)| gone(*p))
        .map(|(k, p)| format!("{k} (pid {p})"))
        .collect();
    report.checks.push(soak::Check::of(
        "every daemon runs at the end (none died on its own)",
        dead,
        || format!("{} processes", recorded.len()),
    ));
    // Nothing runs in the lab's namespaces but what the lab started: no plugin, ping or
    // helper left from a fault.
    let mut strays = Vec::new();
    for n in lab_namespaces() {
        let inside = ip(&["netns", "pids", &n]).unwrap_or_default();
        for pid in inside
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            if !recorded.iter().any(|(_, p)| *p == pid) {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                strays.push(format!("{n}: {pid} {}", comm.trim()));
            }
        }
    }
    report.checks.push(soak::Check::of(
        "no stray process in the lab's namespaces",
        strays,
        || format!("{} namespaces", lab_namespaces().len()),
    ));
    Ok(())
}

/// The mesh's hold time (bgpd's default, which the lab's nodes keep).
const MESH_HOLD_TIME: Duration = Duration::from_secs(bgpd::cluster::peers::DEFAULT_HOLD as u64);

/// Copies the daemons' and etcd's logs next to the pingers' (the state directory goes with
/// the lab).
fn keep_logs(dir: &Path) {
    let mut from: Vec<PathBuf> = NODES.iter().map(|n| node_dir(n.name)).collect();
    from.push(etcd::dir());
    from.push(kube::dir());
    for d in from {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "log") {
                let name = format!(
                    "{}-{}",
                    d.file_name().unwrap_or_default().to_string_lossy(),
                    e.file_name().to_string_lossy()
                );
                let _ = std::fs::copy(&path, dir.join(name));
            }
        }
    }
}

/// Takes the lab down and checks that nothing of it is left: no namespace, no process it
/// recorded, no mount, no state directory.
fn teardown_checks(report: &mut soak::Report) -> Result<(), String> {
    let recorded = pids();
    down()?;
    let mut left = Vec::new();
    left.extend(
        lab_namespaces()
            .into_iter()
            .map(|n| format!("namespace {n}")),
    );
    left.extend(
        recorded
            .iter()
            .filter(|(_, p)| !gone(*p))
            .map(|(k, p)| format!("{k} (pid {p})")),
    );
    if is_mounted(&store_dir()) {
        left.push(format!("mount {}", store_dir().display()));
    }
    if state().exists() {
        left.push(format!("directory {}", state().display()));
    }
    report
        .checks
        .push(soak::Check::of("nothing left after down", left, || {
            format!(
                "{} processes stopped, namespaces, mount and state removed",
                recorded.len()
            )
        }));
    Ok(())
}
