//! `cni-bench`: the CNI plugins side by side with the reference chain doing the same wiring,
//! in one run on one (simulated) node, for IPv4, IPv6 and dual-stack pods: `margay` (IPAM
//! in-process from bgpd, the real store) and the reference `ptp` + `host-local` (a veth pair,
//! addresses, routes; IPAM from local files), plus `ptp` + `margay-ipam` to separate the IPAM
//! cost from the wiring. Each runs N ADDs then N DELs, one at a time and 8 at once, each plugin
//! a fresh process started in the node's namespace as a runtime starts it. The chains of a
//! family take turns batch by batch, so noise on a shared machine falls on all of them. The pod
//! namespaces have IPv6 duplicate address detection off for every chain, as margay (like
//! Calico) turns it off on the pod's interface itself: the reference is timed doing the same
//! work, not waiting a second for DAD. Prints ADD and DEL p50/p99, pods per second (ADDs over
//! the time their batches took), and our ratios to the reference per family.
//!
//! `cni-bench [--pods N] [--smoke]`; needs root, the release build of `margay`, and Debian's
//! containernetworking-plugins in /usr/lib/cni.

#[path = "../../tests/cni_lab/mod.rs"]
mod cni_lab;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use cni_lab::{Call, Node, POOLS_V4, POOLS_V6};
use datastore::model::IpFamily;
use interop_tests::bench::{ms, percentile};
use interop_tests::lab::netns::Netns;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(about = "margay's CNI plugins against ptp + host-local, side by side")]
struct Args {
    /// Pods per measurement.
    #[arg(long, default_value_t = 200)]
    pods: usize,
    /// A quick run that checks the benchmark works (few pods).
    #[arg(long)]
    smoke: bool,
}

struct Chain {
    name: &'static str,
    plugin: PathBuf,
    conf: Value,
}

/// The address families a pod gets: one, or one address of each (dual stack).
#[derive(Clone, Copy, PartialEq, Eq)]
enum PodFamilies {
    One(IpFamily),
    Dual,
}

impl PodFamilies {
    const ALL: [PodFamilies; 3] = [
        PodFamilies::One(IpFamily::V4),
        PodFamilies::One(IpFamily::V6),
        PodFamilies::Dual,
    ];

    fn name(self) -> &'static str {
        match self {
            PodFamilies::One(family) => family.name(),
            PodFamilies::Dual => "dual",
        }
    }

    fn has(self, family: IpFamily) -> bool {
        self == PodFamilies::Dual || self == PodFamilies::One(family)
    }

    /// host-local's ranges for these families.
    fn host_local_ranges(self) -> Value {
        let mut ranges = Vec::new();
        if self.has(IpFamily::V4) {
            ranges.push(json!([{"subnet": "10.200.0.0/16"}]));
        }
        if self.has(IpFamily::V6) {
            ranges.push(json!([{"subnet": "fd00:200::/64"}]));
        }
        Value::Array(ranges)
    }
}

struct Row {
    chain: &'static str,
    family: PodFamilies,
    parallel: usize,
    add: Vec<Duration>,
    del: Vec<Duration>,
    add_rate: f64,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cni-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let pods = if args.smoke { 16 } else { args.pods.max(8) };
    interop_tests::lab::netns::remove_stale();
    let node = Node::start("bn", &format!("{POOLS_V4}{POOLS_V6}"));
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;

    // One set of pod namespaces per chain of a family: the chains' pods exist side by side.
    // The families take turns, each leaving the namespaces empty for the next.
    let namespaces: Vec<Vec<Netns>> = (0..3)
        .map(|c| {
            (0..pods)
                .map(|i| {
                    let ns = Netns::new(&format!("b{c}-{i}")).map_err(|e| e.to_string())?;
                    ns.sh("sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0")
                        .map_err(|e| e.to_string())?;
                    Ok(ns)
                })
                .collect::<Result<_, String>>()
        })
        .collect::<Result<_, _>>()?;

    let mut rows = Vec::new();
    for family in PodFamilies::ALL {
        let chains = chains(&node, family, work.path());
        // Warm up: page cache, bgpd's first block claim, host-local's directory.
        for (c, chain) in chains.iter().enumerate() {
            let ns = &namespaces[c][0];
            measure(&node, chain, "ADD", "warm", ns)?;
            measure(&node, chain, "DEL", "warm", ns)?;
        }
        for parallel in [1, 8] {
            rows.extend(run_interleaved(
                &node,
                &chains,
                family,
                &namespaces,
                parallel,
            )?);
        }
    }
    print_table(&rows, pods);
    if node.ipam_used() != 0 {
        let held = interop_tests::lab::bgpd::bgpctl(
            &node.daemon.socket,
            &["ipam", "gc", "--node", "test-node", "--dry-run", "--json"],
        );
        return Err(format!(
            "addresses left allocated after the DELs: {}",
            String::from_utf8_lossy(&held.stdout)
        ));
    }
    if !node.cali_links().is_empty() {
        return Err("interfaces left after the DELs".into());
    }
    Ok(())
}

/// The three chains, configured for `family`.
fn chains(node: &Node, family: PodFamilies, work: &std::path::Path) -> [Chain; 3] {
    let mut ours = node.conf("1.0.0");
    ours["log_level"] = json!("info");
    ours["log_file_path"] = json!(work.join("margay.log"));
    ours["ipam"]["assign_ipv4"] = json!(family.has(IpFamily::V4));
    ours["ipam"]["assign_ipv6"] = json!(family.has(IpFamily::V6));
    [
        Chain {
            name: "margay + margay-ipam",
            plugin: cni_lab::margay(),
            conf: ours,
        },
        Chain {
            name: "ptp + host-local",
            plugin: cni_lab::reference("ptp"),
            conf: json!({
                "cniVersion": "1.0.0", "name": "bench-ref", "type": "ptp", "mtu": 1450,
                "ipam": {"type": "host-local", "ranges": family.host_local_ranges(),
                         "dataDir": work.join(format!("host-local-{}", family.name()))}
            }),
        },
        Chain {
            name: "ptp + margay-ipam",
            plugin: cni_lab::reference("ptp"),
            conf: json!({
                "cniVersion": "1.0.0", "name": "bench-ptp", "type": "ptp", "mtu": 1450,
                "nodename": "test-node",
                "ipam": {"type": "margay-ipam", "socket": node.daemon.socket,
                         "assign_ipv4": family.has(IpFamily::V4),
                         "assign_ipv6": family.has(IpFamily::V6)}
            }),
        },
    ]
}

/// One plugin run; its wall time.
fn measure(
    node: &Node,
    chain: &Chain,
    command: &str,
    cid: &str,
    ns: &Netns,
) -> Result<Duration, String> {
    let call = Call::new(command, cid, Some(&ns.path()), &chain.conf);
    let started = Instant::now();
    let out = node.run(&chain.plugin, &call);
    let took = started.elapsed();
    if !out.status.success() {
        return Err(format!(
            "{} {command} {cid} failed: {} {}",
            chain.name, out.stdout, out.stderr
        ));
    }
    Ok(took)
}

/// `parallel` plugin runs of one chain at once (pods `first..first+parallel`); each one's
/// latency and the wall time of the batch.
fn batch(
    node: &Node,
    chain: &Chain,
    namespaces: &[Netns],
    command: &str,
    first: usize,
    parallel: usize,
) -> Result<(Vec<Duration>, Duration), String> {
    let end = (first + parallel).min(namespaces.len());
    let started = Instant::now();
    let results: Vec<Result<Duration, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (first..end)
            .map(|i| {
                s.spawn(move || measure(node, chain, command, &format!("b{i}"), &namespaces[i]))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect()
    });
    let wall = started.elapsed();
    Ok((results.into_iter().collect::<Result<_, _>>()?, wall))
}

/// All chains measured in turns, batch by batch (the chain that goes first rotates), so a
/// burst of noise on a shared machine falls on every chain alike.
fn run_interleaved(
    node: &Node,
    chains: &[Chain],
    family: PodFamilies,
    namespaces: &[Vec<Netns>],
    parallel: usize,
) -> Result<Vec<Row>, String> {
    let pods = namespaces[0].len();
    let mut rows: Vec<Row> = chains
        .iter()
        .map(|c| Row {
            chain: c.name,
            family,
            parallel,
            add: Vec::new(),
            del: Vec::new(),
            add_rate: 0.0,
        })
        .collect();
    let mut add_wall = vec![Duration::ZERO; chains.len()];
    for command in ["ADD", "DEL"] {
        for (round, first) in (0..pods).step_by(parallel).enumerate() {
            for k in 0..chains.len() {
                let c = (round + k) % chains.len();
                let (samples, wall) =
                    batch(node, &chains[c], &namespaces[c], command, first, parallel)?;
                if command == "ADD" {
                    rows[c].add.extend(samples);
                    add_wall[c] += wall;
                } else {
                    rows[c].del.extend(samples);
                }
            }
        }
    }
    for (row, wall) in rows.iter_mut().zip(add_wall) {
        row.add_rate = row.add.len() as f64 / wall.as_secs_f64().max(1e-9);
    }
    Ok(rows)
}

fn print_table(rows: &[Row], pods: usize) {
    println!(
        "CNI ADD/DEL, {pods} pods per row, each plugin a fresh process in the node's namespace, \
         chains in turns; margay's IPAM: bgpd on SQLite (sync=full); IPv6 DAD off in every pod"
    );
    println!(
        "{:<22} {:>6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "chain", "family", "parallel", "ADD p50", "ADD p99", "DEL p50", "DEL p99", "pods/s"
    );
    let mut stats = Vec::new();
    for r in rows {
        let (mut add, mut del) = (r.add.clone(), r.del.clone());
        let s = (
            percentile(&mut add, 0.50),
            percentile(&mut add, 0.99),
            percentile(&mut del, 0.50),
            percentile(&mut del, 0.99),
        );
        println!(
            "{:<22} {:>6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8.0}",
            r.chain,
            r.family.name(),
            r.parallel,
            ms(s.0),
            ms(s.1),
            ms(s.2),
            ms(s.3),
            r.add_rate
        );
        stats.push((r.chain, r.family, r.parallel, s, r.add_rate));
    }
    println!();
    for family in PodFamilies::ALL {
        for parallel in [1, 8] {
            let find = |name: &str| {
                stats
                    .iter()
                    .find(|(c, f, p, _, _)| *c == name && *f == family && *p == parallel)
                    .map(|(_, _, _, s, rate)| (*s, *rate))
            };
            if let (Some((o, orate)), Some((r, rrate))) =
                (find("margay + margay-ipam"), find("ptp + host-local"))
            {
                let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
                println!(
                    "ratio margay / ptp+host-local, {}, parallel {parallel}: ADD p50 {:.2}  ADD p99 {:.2}  DEL p50 {:.2}  DEL p99 {:.2}  pods/s {:.2}",
                    family.name(),
                    ratio(o.0, r.0),
                    ratio(o.1, r.1),
                    ratio(o.2, r.2),
                    ratio(o.3, r.3),
                    orate / rrate.max(1e-9)
                );
            }
        }
    }
}
