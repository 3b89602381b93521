//! `route_bench`: routewriter's kernel programming against `ip -batch`, side by side in one run.
//!
//! For each N (10,000 and 100,000; `--smoke`: 500): N routes, /26s from 10.128.0.0/9 via a
//! gateway on a veth, each method in a fresh network namespace:
//!
//! - routewriter: a snapshot of N routes handed to routewriter's `Agent` (desired-state
//!   tracker, full diff against a dump of the table, batched netlink writes), then a 1 %
//!   change (0.5 % removed, 0.5 % moved to another gateway) as one incremental update;
//! - `ip -batch` with `route add ... via ... dev ...`, and the same 1 % change;
//! - `ip -batch` with one nexthop object and `route add ... nhid 1`, and the 1 % change.
//!
//! Printed: routes/s, the ratio to plain ip -batch, the 1 % change's time and its share of
//! the bulk time, and the bytes per route routewriter holds, counted (not RSS: the allocator
//! keeps what earlier runs freed): "held" is its desired-state map (buckets × (entry + control
//! byte) + device names), all it keeps between resyncs; the actual side is never held as a
//! table, a full resync streams the dump through the diff and keeps only the prefixes it saw
//! (8 B each), so "resync" = held + 8. Each method's result is checked with
//! `ip route show proto 80`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use interop_tests::lab::netns::{Netns, VethPair};
use proto::v1::{
    DataplaneUpdate, DesiredItem, DesiredKey, KernelRoute, RouteKind, desired_item::Item,
    desired_key::Key,
};
use routewriter::agent::Agent;
use routewriter::config::RoutewriterConfig;
use routewriter::metrics::Metrics;

#[derive(Parser)]
#[command(about = "routewriter's route programming against ip -batch")]
struct Args {
    /// A tiny run (500 routes) that only shows the benchmark still works.
    #[arg(long)]
    smoke: bool,
    /// Route counts to run (default 10000,100000).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
}

/// One method's figures for one N.
struct Row {
    method: &'static str,
    n: usize,
    bulk: Duration,
    change: Duration,
    held: Option<f64>,
    writes: Option<u64>,
}

impl Row {
    fn rate(&self) -> f64 {
        self.n as f64 / self.bulk.as_secs_f64()
    }
}

fn prefix(i: usize) -> String {
    let a = 0x0A80_0000u32 + ((i as u32) << 6);
    format!("{}/26", std::net::Ipv4Addr::from(a))
}

/// The 1 % change: the first half of the changed routes go, the second half move.
fn changed(n: usize) -> (Vec<usize>, Vec<usize>) {
    let k = (n / 100).max(2);
    let step = n / k;
    let picks: Vec<usize> = (0..k).map(|j| j * step + step / 2).collect();
    let (gone, moved) = picks.split_at(k / 2);
    (gone.to_vec(), moved.to_vec())
}

/// A fresh namespace with eth0 10.0.0.1/24 whose peer (10.0.0.2, 10.0.0.3) is in another.
fn namespace(tag: &str) -> Result<(Netns, Netns, VethPair), String> {
    let n = Netns::new(tag).map_err(|e| e.to_string())?;
    let peer = Netns::new(&format!("{tag}p")).map_err(|e| e.to_string())?;
    let v = VethPair::new(&n, "eth0", &peer, "eth0").map_err(|e| e.to_string())?;
    n.ip(&["addr", "add", "10.0.0.1/24", "dev", "eth0"])
        .map_err(|e| e.to_string())?;
    peer.ip(&["addr", "add", "10.0.0.2/24", "dev", "eth0"])
        .map_err(|e| e.to_string())?;
    peer.ip(&["addr", "add", "10.0.0.3/24", "dev", "eth0"])
        .map_err(|e| e.to_string())?;
    Ok((n, peer, v))
}

fn count_routes(ns: &Netns, filter: &str) -> Result<usize, String> {
    let out = ns
        .ip(&["route", "show", "proto", "80"])
        .map_err(|e| e.to_string())?;
    Ok(out.lines().filter(|l| l.contains(filter)).count())
}

fn check(ns: &Netns, method: &str, n: usize) -> Result<(), String> {
    let (gone, moved) = changed(n);
    let total = count_routes(ns, "")?;
    let via3 = count_routes(ns, "10.0.0.3")?;
    if total != n - gone.len() || via3 != moved.len() {
        return Err(format!(
            "{method}: kernel has {total} routes ({via3} via 10.0.0.3), want {} ({})",
            n - gone.len(),
            moved.len()
        ));
    }
    Ok(())
}

fn route_item(i: usize, gw: &str) -> DesiredItem {
    DesiredItem {
        item: Some(Item::Route(KernelRoute {
            destination: prefix(i),
            kind: RouteKind::Gateway as i32,
            gateway: gw.into(),
            device: "eth0".into(),
            onlink: false,
            source: String::new(),
        })),
    }
}

fn routewriter(n: usize) -> Result<Row, String> {
    let (ns, _peer, _v) = namespace(&format!("rw{n}"))?;
    let cfg = RoutewriterConfig {
        nat: false,
        sysctls: false,
        ..Default::default()
    };
    let mut agent = {
        let _inside = ns.enter().map_err(|e| e.to_string())?;
        Agent::new(cfg, "bench".into(), Metrics::new()).map_err(|e| e.to_string())?
    };
    let snapshot = DataplaneUpdate {
        revision: 1,
        snapshot: true,
        upsert: (0..n).map(|i| route_item(i, "10.0.0.2")).collect(),
        remove: vec![],
    };
    let t = Instant::now();
    agent.apply_updates(std::slice::from_ref(&snapshot));
    let bulk = t.elapsed();
    drop(snapshot);
    if !agent.is_synced() || agent.netlink_writes() != n as u64 {
        return Err(format!(
            "routewriter: {} writes for {n} routes",
            agent.netlink_writes()
        ));
    }
    let (gone, moved) = changed(n);
    let update = DataplaneUpdate {
        revision: 2,
        snapshot: false,
        upsert: moved.iter().map(|&i| route_item(i, "10.0.0.3")).collect(),
        remove: gone
            .iter()
            .map(|&i| DesiredKey {
                key: Some(Key::Route(prefix(i))),
            })
            .collect(),
    };
    let before = agent.netlink_writes();
    let t = Instant::now();
    agent.apply_updates(std::slice::from_ref(&update));
    let change = t.elapsed();
    let change_writes = agent.netlink_writes() - before;
    check(&ns, "routewriter", n)?;
    // A full resync with nothing to do, for the record: it reads the table back.
    let t = Instant::now();
    agent.full_sync();
    let resync = t.elapsed();
    eprintln!(
        "routewriter n={n}: 1% change {change_writes} writes; full resync with nothing to change {:.1} ms, {} writes",
        resync.as_secs_f64() * 1e3,
        agent.netlink_writes() - before - change_writes
    );
    let held = agent.desired().route_heap_bytes() as f64 / agent.desired().routes().len() as f64;
    Ok(Row {
        method: "routewriter (batched netlink)",
        n,
        bulk,
        change,
        held: Some(held),
        writes: Some(agent.netlink_writes()),
    })
}

fn ip_batch(ns: &Netns, lines: &str, dir: &Path, name: &str) -> Result<Duration, String> {
    let file = dir.join(name);
    std::fs::File::create(&file)
        .and_then(|mut f| f.write_all(lines.as_bytes()))
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let path = file.to_string_lossy().into_owned();
    ns.ip(&["-batch", &path]).map_err(|e| e.to_string())?;
    Ok(t.elapsed())
}

fn iproute(n: usize, nexthops: bool) -> Result<Row, String> {
    let tag = if nexthops { "nh" } else { "ip" };
    let (ns, _peer, _v) = namespace(&format!("{tag}{n}"))?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut bulk = String::with_capacity(n * 64);
    if nexthops {
        bulk.push_str("nexthop add id 1 via 10.0.0.2 dev eth0\n");
        bulk.push_str("nexthop add id 2 via 10.0.0.3 dev eth0\n");
    }
    for i in 0..n {
        if nexthops {
            bulk.push_str(&format!("route add {} nhid 1 proto 80\n", prefix(i)));
        } else {
            bulk.push_str(&format!(
                "route add {} via 10.0.0.2 dev eth0 proto 80\n",
                prefix(i)
            ));
        }
    }
    let bulk_time = ip_batch(&ns, &bulk, dir.path(), "bulk")?;
    let (gone, moved) = changed(n);
    let mut change = String::new();
    for i in gone {
        change.push_str(&format!("route del {} proto 80\n", prefix(i)));
    }
    for i in moved {
        if nexthops {
            change.push_str(&format!("route replace {} nhid 2 proto 80\n", prefix(i)));
        } else {
            change.push_str(&format!(
                "route replace {} via 10.0.0.3 dev eth0 proto 80\n",
                prefix(i)
            ));
        }
    }
    let change_time = ip_batch(&ns, &change, dir.path(), "change")?;
    let method = if nexthops {
        "ip -batch + nexthop objects"
    } else {
        "ip -batch"
    };
    if nexthops {
        // Routes show "nhid 2" rather than the gateway: count those.
        let total = count_routes(&ns, "")?;
        let nh2 = count_routes(&ns, "nhid 2")?;
        let (gone, moved) = changed(n);
        if total != n - gone.len() || nh2 != moved.len() {
            return Err(format!(
                "{method}: kernel has {total} routes ({nh2} via nhid 2)"
            ));
        }
    } else {
        check(&ns, method, n)?;
    }
    Ok(Row {
        method,
        n,
        bulk: bulk_time,
        change: change_time,
        held: None,
        writes: None,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let sizes = if args.smoke {
        vec![500]
    } else if args.sizes.is_empty() {
        vec![10_000, 100_000]
    } else {
        args.sizes.clone()
    };
    println!(
        "route_bench: N /26 routes from 10.128.0.0/9 via a gateway on a veth, a fresh namespace per method"
    );
    println!(
        "{:>7}  {:<30} {:>9} {:>10} {:>8} {:>12} {:>9} {:>9} {:>11}",
        "N",
        "method",
        "bulk ms",
        "routes/s",
        "vs ip",
        "1% change ms",
        "% of bulk",
        "held B/rt",
        "resync B/rt"
    );
    let mut failed = false;
    for &n in &sizes {
        let rows = [routewriter(n), iproute(n, false), iproute(n, true)];
        let base = match &rows[1] {
            Ok(r) => r.rate(),
            Err(_) => f64::NAN,
        };
        let mut rw_rate = f64::NAN;
        let mut rw_share = f64::NAN;
        let mut rw_held = f64::NAN;
        for row in &rows {
            match row {
                Ok(r) => {
                    let share = 100.0 * r.change.as_secs_f64() / r.bulk.as_secs_f64();
                    if r.held.is_some() {
                        rw_rate = r.rate();
                        rw_share = share;
                        rw_held = r.held.unwrap_or(f64::NAN);
                    }
                    println!(
                        "{:>7}  {:<30} {:>9.1} {:>10.0} {:>7.2}x {:>12.2} {:>8.2}% {:>9} {:>11}",
                        r.n,
                        r.method,
                        r.bulk.as_secs_f64() * 1e3,
                        r.rate(),
                        r.rate() / base,
                        r.change.as_secs_f64() * 1e3,
                        share,
                        r.held
                            .map(|h| format!("{h:.1}"))
                            .unwrap_or_else(|| "-".into()),
                        // While a full resync runs: the prefixes seen, 8 bytes each.
                        r.held
                            .map(|h| format!("{:.1}", h + 8.0))
                            .unwrap_or_else(|| "-".into()),
                    );
                    if let Some(w) = r.writes {
                        eprintln!("routewriter n={n}: {w} netlink writes in all");
                    }
                }
                Err(e) => {
                    failed = true;
                    println!("{n:>7}  FAILED: {e}");
                }
            }
        }
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        println!(
            "{n:>7}  targets: bulk >= 1.0x ip -batch: {:.2}x {}; 1% change < 2% of bulk: {:.2}% {}; < 64 B/route held: {:.1} {}",
            rw_rate / base,
            verdict(rw_rate >= base),
            rw_share,
            verdict(rw_share < 2.0),
            rw_held,
            verdict(rw_held < 64.0)
        );
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
