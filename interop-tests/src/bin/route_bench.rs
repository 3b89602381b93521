//! `route_bench`: routewriter's kernel programming against `ip -batch`, side by side in one run,
//! for each address family.
//!
//! For each N (10,000 and 100,000; `--smoke`: 500) and each family: N routes via a gateway on a
//! veth (IPv4: /26s from 10.128.0.0/9 via 10.0.0.2; IPv6: /122s, Calico's IPv6 block size, from
//! fd80::/16 via fd00::2), each method in a fresh network namespace:
//!
//! - routewriter: a snapshot of N routes handed to routewriter's `Agent` (desired-state
//!   tracker, full diff against a dump of the table, batched netlink writes), then a 1 %
//!   change (0.5 % removed, 0.5 % moved to another gateway) as one incremental update;
//! - `ip -batch` (`ip -6 -batch`) with `route add ... via ... dev ...`, and the same 1 % change;
//! - the same with one nexthop object and `route add ... nhid 1`, and the 1 % change.
//!
//! Printed: routes/s, the ratio to plain ip -batch of the same family, the 1 % change's time
//! and its share of the bulk time, and the bytes per route routewriter holds, counted (not
//! RSS: the allocator keeps what earlier runs freed): "held" is its desired-state map (buckets
//! × (entry + control byte) + device names), all it keeps between resyncs; the actual side is
//! never held as a table, a full resync streams the dump through the diff and keeps only the
//! prefixes it saw, so "resync" = held + the size of a prefix. Each method's result is checked
//! with `ip route show proto 80` (`ip -6 ...`).

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
use routewriter::desired::{Family, Prefix};
use routewriter::metrics::Metrics;

/// What differs between the families' runs: names, addresses, the `ip` flag.
#[derive(Clone, Copy)]
struct Fam {
    family: Family,
    /// "" or "-6 ", in method names.
    tag: &'static str,
    /// The node's address on the veth, its peer's two (the gateways).
    node: &'static str,
    gw: [&'static str; 2],
}

const V4: Fam = Fam {
    family: Family::V4,
    tag: "",
    node: "10.0.0.1/24",
    gw: ["10.0.0.2", "10.0.0.3"],
};

const V6: Fam = Fam {
    family: Family::V6,
    tag: "-6 ",
    node: "fd00::1/64",
    gw: ["fd00::2", "fd00::3"],
};

impl Fam {
    /// `ip` arguments before the command: `-6` for IPv6.
    fn ip_args<'a>(&self, rest: &[&'a str]) -> Vec<&'a str> {
        let mut v = Vec::with_capacity(rest.len() + 1);
        if self.family == Family::V6 {
            v.push("-6");
        }
        v.extend_from_slice(rest);
        v
    }

    fn prefix(&self, i: usize) -> String {
        match self.family {
            Family::V4 => {
                let a = 0x0A80_0000u32 + ((i as u32) << 6);
                format!("{}/26", std::net::Ipv4Addr::from(a))
            }
            Family::V6 => {
                let a = (0xfd80u128 << 112) | ((i as u128) << 6);
                format!("{}/122", std::net::Ipv6Addr::from(a))
            }
        }
    }

    fn name(&self) -> &'static str {
        match self.family {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

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
    method: String,
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

/// The 1 % change: the first half of the changed routes go, the second half move.
fn changed(n: usize) -> (Vec<usize>, Vec<usize>) {
    let k = (n / 100).max(2);
    let step = n / k;
    let picks: Vec<usize> = (0..k).map(|j| j * step + step / 2).collect();
    let (gone, moved) = picks.split_at(k / 2);
    (gone.to_vec(), moved.to_vec())
}

/// A fresh namespace with eth0 on the family's node address whose peer (both gateways) is in
/// another. IPv6 addresses skip duplicate address detection: nothing else is on the link.
fn namespace(tag: &str, f: Fam) -> Result<(Netns, Netns, VethPair), String> {
    let n = Netns::new(tag).map_err(|e| e.to_string())?;
    let peer = Netns::new(&format!("{tag}p")).map_err(|e| e.to_string())?;
    let v = VethPair::new(&n, "eth0", &peer, "eth0").map_err(|e| e.to_string())?;
    let len = if f.family == Family::V4 { "/24" } else { "/64" };
    let gw0 = format!("{}{len}", f.gw[0]);
    let gw1 = format!("{}{len}", f.gw[1]);
    for (ns, addr) in [(&n, f.node), (&peer, gw0.as_str()), (&peer, gw1.as_str())] {
        let mut args = f.ip_args(&["addr", "add", addr, "dev", "eth0"]);
        if f.family == Family::V6 {
            args.push("nodad");
        }
        ns.ip(&args).map_err(|e| e.to_string())?;
    }
    Ok((n, peer, v))
}

fn count_routes(ns: &Netns, f: Fam, filter: &str) -> Result<usize, String> {
    let out = ns
        .ip(&f.ip_args(&["route", "show", "proto", "80"]))
        .map_err(|e| e.to_string())?;
    Ok(out.lines().filter(|l| l.contains(filter)).count())
}

fn check(ns: &Netns, f: Fam, method: &str, n: usize) -> Result<(), String> {
    let (gone, moved) = changed(n);
    let total = count_routes(ns, f, "")?;
    let via = format!("via {} ", f.gw[1]);
    let moved_there = count_routes(ns, f, &via)?;
    if total != n - gone.len() || moved_there != moved.len() {
        return Err(format!(
            "{method}: kernel has {total} routes ({moved_there} {via}), want {} ({})",
            n - gone.len(),
            moved.len()
        ));
    }
    Ok(())
}

fn route_item(f: Fam, i: usize, gw: &str) -> DesiredItem {
    DesiredItem {
        item: Some(Item::Route(KernelRoute {
            destination: f.prefix(i),
            kind: RouteKind::Gateway as i32,
            gateway: gw.into(),
            device: "eth0".into(),
            onlink: false,
            source: String::new(),
        })),
    }
}

fn routewriter(n: usize, f: Fam) -> Result<Row, String> {
    let method = format!("routewriter {}(batched netlink)", f.tag);
    let (ns, _peer, _v) = namespace(&format!("rw{}{n}", f.tag.trim()), f)?;
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
        upsert: (0..n).map(|i| route_item(f, i, f.gw[0])).collect(),
        remove: vec![],
    };
    let t = Instant::now();
    agent.apply_updates(std::slice::from_ref(&snapshot));
    let bulk = t.elapsed();
    drop(snapshot);
    if !agent.is_synced() || agent.netlink_writes() != n as u64 {
        return Err(format!(
            "{method}: {} writes for {n} routes",
            agent.netlink_writes()
        ));
    }
    let (gone, moved) = changed(n);
    let update = DataplaneUpdate {
        revision: 2,
        snapshot: false,
        upsert: moved.iter().map(|&i| route_item(f, i, f.gw[1])).collect(),
        remove: gone
            .iter()
            .map(|&i| DesiredKey {
                key: Some(Key::Route(f.prefix(i))),
            })
            .collect(),
    };
    let before = agent.netlink_writes();
    let t = Instant::now();
    agent.apply_updates(std::slice::from_ref(&update));
    let change = t.elapsed();
    let change_writes = agent.netlink_writes() - before;
    check(&ns, f, &method, n)?;
    // A full resync with nothing to do, for the record: it reads the table back.
    let t = Instant::now();
    agent.full_sync();
    let resync = t.elapsed();
    eprintln!(
        "{method} n={n}: 1% change {change_writes} writes; full resync with nothing to change {:.1} ms, {} writes",
        resync.as_secs_f64() * 1e3,
        agent.netlink_writes() - before - change_writes
    );
    let held = agent.desired().route_heap_bytes() as f64 / agent.desired().routes().len() as f64;
    Ok(Row {
        method,
        n,
        bulk,
        change,
        held: Some(held),
        writes: Some(agent.netlink_writes()),
    })
}

fn ip_batch(ns: &Netns, f: Fam, lines: &str, dir: &Path, name: &str) -> Result<Duration, String> {
    let file = dir.join(name);
    std::fs::File::create(&file)
        .and_then(|mut f| f.write_all(lines.as_bytes()))
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let path = file.to_string_lossy().into_owned();
    ns.ip(&f.ip_args(&["-batch", &path]))
        .map_err(|e| e.to_string())?;
    Ok(t.elapsed())
}

fn iproute(n: usize, f: Fam, nexthops: bool) -> Result<Row, String> {
    let tag = if nexthops { "nh" } else { "ip" };
    let (ns, _peer, _v) = namespace(&format!("{tag}{}{n}", f.tag.trim()), f)?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let [gw2, gw3] = f.gw;
    let mut bulk = String::with_capacity(n * 64);
    if nexthops {
        bulk.push_str(&format!("nexthop add id 1 via {gw2} dev eth0\n"));
        bulk.push_str(&format!("nexthop add id 2 via {gw3} dev eth0\n"));
    }
    for i in 0..n {
        if nexthops {
            bulk.push_str(&format!("route add {} nhid 1 proto 80\n", f.prefix(i)));
        } else {
            bulk.push_str(&format!(
                "route add {} via {gw2} dev eth0 proto 80\n",
                f.prefix(i)
            ));
        }
    }
    let bulk_time = ip_batch(&ns, f, &bulk, dir.path(), "bulk")?;
    let (gone, moved) = changed(n);
    let mut change = String::new();
    for i in gone {
        change.push_str(&format!("route del {} proto 80\n", f.prefix(i)));
    }
    for i in moved {
        if nexthops {
            change.push_str(&format!("route replace {} nhid 2 proto 80\n", f.prefix(i)));
        } else {
            change.push_str(&format!(
                "route replace {} via {gw3} dev eth0 proto 80\n",
                f.prefix(i)
            ));
        }
    }
    let change_time = ip_batch(&ns, f, &change, dir.path(), "change")?;
    let method = if nexthops {
        format!("ip {}-batch + nexthop objects", f.tag)
    } else {
        format!("ip {}-batch", f.tag)
    };
    if nexthops {
        // Routes show "nhid 2" rather than the gateway: count those.
        let total = count_routes(&ns, f, "")?;
        let nh2 = count_routes(&ns, f, "nhid 2")?;
        let (gone, moved) = changed(n);
        if total != n - gone.len() || nh2 != moved.len() {
            return Err(format!(
                "{method}: kernel has {total} routes ({nh2} via nhid 2)"
            ));
        }
    } else {
        check(&ns, f, &method, n)?;
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

/// The bulk rate routewriter must reach, as a multiple of plain `ip -batch` of its family.
const TARGET_RATIO: f64 = 2.0;

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
        "route_bench: N routes via a gateway on a veth (IPv4 /26s from 10.128.0.0/9, IPv6 /122s from fd80::/16), a fresh namespace per method"
    );
    println!(
        "{:>7}  {:<34} {:>9} {:>10} {:>8} {:>12} {:>9} {:>9} {:>11}",
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
        for f in [V4, V6] {
            failed |= run_family(n, f);
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One family's three methods at one N and its targets line; true when one failed.
fn run_family(n: usize, f: Fam) -> bool {
    let rows = [routewriter(n, f), iproute(n, f, false), iproute(n, f, true)];
    let base = match &rows[1] {
        Ok(r) => r.rate(),
        Err(_) => f64::NAN,
    };
    let mut failed = false;
    let mut rw_rate = f64::NAN;
    let mut rw_share = f64::NAN;
    let mut rw_held = f64::NAN;
    // While a full resync runs, the differ keeps each desired prefix it saw.
    let seen = std::mem::size_of::<Prefix>() as f64;
    for row in &rows {
        match row {
            Ok(r) => {
                let share = 100.0 * r.change.as_secs_f64() / r.bulk.as_secs_f64();
                if let Some(h) = r.held {
                    rw_rate = r.rate();
                    rw_share = share;
                    rw_held = h;
                }
                println!(
                    "{:>7}  {:<34} {:>9.1} {:>10.0} {:>7.2}x {:>12.2} {:>8.2}% {:>9} {:>11}",
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
                    r.held
                        .map(|h| format!("{:.1}", h + seen))
                        .unwrap_or_else(|| "-".into()),
                );
                if let Some(w) = r.writes {
                    eprintln!("{} n={n}: {w} netlink writes in all", r.method);
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
        "{n:>7}  targets {}: bulk >= {TARGET_RATIO:.1}x ip {}-batch: {:.2}x {}; 1% change < 2% of bulk: {:.2}% {}; < 64 B/route held: {:.1} {}",
        f.name(),
        f.tag,
        rw_rate / base,
        verdict(rw_rate >= TARGET_RATIO * base),
        rw_share,
        verdict(rw_share < 2.0),
        rw_held,
        verdict(rw_held < 64.0)
    );
    failed
}
