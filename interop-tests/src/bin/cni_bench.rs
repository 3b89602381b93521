//! `cni-bench`: the CNI plugins side by side with the reference chain doing the same wiring,
//! in one run on one (simulated) node: `margay` (IPAM in-process from bgpd, the real store) and
//! the reference `ptp` + `host-local` (a veth pair, addresses, routes; IPAM from local files),
//! plus `ptp` + `margay-ipam` to separate the IPAM cost from the wiring. Each runs N ADDs then
//! N DELs, one at a time and 8 at once, each plugin a fresh process started in the node's
//! namespace as a runtime starts it. The chains take turns batch by batch, so noise on a shared
//! machine falls on all of them. Prints ADD and DEL p50/p99, pods per second (ADDs over the
//! time their batches took), and our ratios to the reference.
//!
//! `cni-bench [--pods N] [--smoke]`; needs root, the release build of `margay`, and Debian's
//! containernetworking-plugins in /usr/lib/cni.

#[path = "../../tests/cni_lab/mod.rs"]
mod cni_lab;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use cni_lab::{Call, Node, POOLS_V4};
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

struct Row {
    chain: &'static str,
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
    let node = Node::start("bn", POOLS_V4);
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;

    let mut ours = node.conf("1.0.0");
    ours["log_level"] = json!("info");
    ours["log_file_path"] = json!(work.path().join("margay.log"));
    let chains = [
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
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.200.0.0/16"}]],
                         "dataDir": work.path().join("host-local")}
            }),
        },
        Chain {
            name: "ptp + margay-ipam",
            plugin: cni_lab::reference("ptp"),
            conf: json!({
                "cniVersion": "1.0.0", "name": "bench-ptp", "type": "ptp", "mtu": 1450,
                "nodename": "test-node",
                "ipam": {"type": "margay-ipam", "socket": node.daemon.socket}
            }),
        },
    ];
    // One set of pod namespaces per chain: the chains' pods exist side by side.
    let namespaces: Vec<Vec<Netns>> = (0..chains.len())
        .map(|c| {
            (0..pods)
                .map(|i| Netns::new(&format!("b{c}-{i}")).map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()
        })
        .collect::<Result<_, _>>()?;

    // Warm up: page cache, bgpd's first block claim, host-local's directory.
    for (c, chain) in chains.iter().enumerate() {
        let ns = &namespaces[c][0];
        measure(&node, chain, "ADD", "warm", ns)?;
        measure(&node, chain, "DEL", "warm", ns)?;
    }

    let mut rows = Vec::new();
    for parallel in [1, 8] {
        rows.extend(run_interleaved(&node, &chains, &namespaces, parallel)?);
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
    namespaces: &[Vec<Netns>],
    parallel: usize,
) -> Result<Vec<Row>, String> {
    let pods = namespaces[0].len();
    let mut rows: Vec<Row> = chains
        .iter()
        .map(|c| Row {
            chain: c.name,
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
         chains in turns; margay's IPAM: bgpd on SQLite (sync=full)"
    );
    println!(
        "{:<22} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "chain", "parallel", "ADD p50", "ADD p99", "DEL p50", "DEL p99", "pods/s"
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
            "{:<22} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8.0}",
            r.chain,
            r.parallel,
            ms(s.0),
            ms(s.1),
            ms(s.2),
            ms(s.3),
            r.add_rate
        );
        stats.push((r.chain, r.parallel, s, r.add_rate));
    }
    println!();
    for parallel in [1, 8] {
        let find = |name: &str| {
            stats
                .iter()
                .find(|(c, p, _, _)| *c == name && *p == parallel)
                .map(|(_, _, s, rate)| (*s, *rate))
        };
        if let (Some((o, orate)), Some((r, rrate))) =
            (find("margay + margay-ipam"), find("ptp + host-local"))
        {
            let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
            println!(
                "ratio margay / ptp+host-local, parallel {parallel}: ADD p50 {:.2}  ADD p99 {:.2}  DEL p50 {:.2}  DEL p99 {:.2}  pods/s {:.2}",
                ratio(o.0, r.0),
                ratio(o.1, r.1),
                ratio(o.2, r.2),
                ratio(o.3, r.3),
                orate / rrate.max(1e-9)
            );
        }
    }
}
