//! `bgp_bench`: BGP ingest side by side in one run — bgpd, BIRD 2, BIRD 1.6, FRR (bgpd -Z)
//! and GoBGP, each alone in fresh namespaces, fed the same packed UPDATEs by our own feeder.
//!
//! The feeder (this process, on a thread inside the feeder's namespace) opens an iBGP session
//! to the receiver (AS 64512, passive there), pre-encodes N /26 prefixes with 1 or 1,000
//! distinct attribute sets into packed UPDATEs (`bgp_wire::pack`), then End-of-RIB, and hands
//! them to TCP in one write. Measured per receiver: time from Established (the feeder's view)
//! until the receiver reports N routes from us, CPU seconds of the receiver over that time,
//! and its peak RSS (VmHWM, start-up included). Counts are polled through each receiver's CLI,
//! so the resolution is one CLI round trip (printed). Ratios are to BIRD 2.
//!
//! Not measured yet: the reverse direction (advertising the N routes to a collector).
//!
//! `--smoke`: N = 2,000 with 1 and 10 attribute sets, to show the benchmark still works.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bgp_wire::{
    AsPath, Asn, Capability, Decoded, Family, Ipv4Prefix, Message, Open, Origin, PathAttributes,
    SessionParams, Split, decode_message, split_message,
};
use clap::Parser;
use interop_tests::lab;
use interop_tests::lab::bgp_peer::{DaemonPid, output, read_pid};
use interop_tests::lab::bird::{BirdVersion, binaries};
use interop_tests::lab::netns::{Netns, NsProcess, VethPair};

const RECV: &str = "10.99.0.1";
const FEED: &str = "10.99.0.2";
const AS: u32 = 64512;

#[derive(Parser)]
#[command(about = "BGP ingest: bgpd against BIRD 2, BIRD 1.6, FRR and GoBGP")]
struct Args {
    /// A tiny run that only shows the benchmark still works.
    #[arg(long)]
    smoke: bool,
    /// Prefix counts [default: 100000,1000000].
    #[arg(long, value_delimiter = ',')]
    n: Vec<usize>,
    /// Receivers to run [default: all].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Give up on one receiver after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bgpd,
    Bird2,
    Bird1,
    Frr,
    Gobgp,
}

impl Kind {
    const ALL: [Kind; 5] = [Kind::Bgpd, Kind::Bird2, Kind::Bird1, Kind::Frr, Kind::Gobgp];
    fn name(self) -> &'static str {
        match self {
            Kind::Bgpd => "bgpd",
            Kind::Bird2 => "BIRD 2",
            Kind::Bird1 => "BIRD 1.6",
            Kind::Frr => "FRR",
            Kind::Gobgp => "GoBGP",
        }
    }
}

/// A running receiver: its pid, how to count its routes from us, what keeps it alive.
struct Receiver {
    pid: i32,
    count: Box<dyn Fn() -> Option<usize>>,
    _keep: Vec<Box<dyn std::any::Any>>,
}

fn start(kind: Kind, ns: &Netns) -> Result<Receiver, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let d = dir.path().to_owned();
    let nsn = ns.name().to_owned();
    let in_ns = move |prog: &str| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &nsn, prog]);
        c
    };
    match kind {
        Kind::Bgpd => {
            let socket = d.join("bgpd.sock");
            let config = lab::bgpd::write_config(
                &d,
                &socket,
                &format!(
                    "[bgp]\nas = {AS}\nrouter_id = \"{RECV}\"\n\
                     [[bgp.peers]]\naddress = \"{FEED}\"\nas = {AS}\npassive = true\n\
                     [log]\nlevel = \"warn\"\n"
                ),
            );
            let mut cmd = ns.command(lab::binary("bgpd"));
            cmd.arg("--config")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let p = ns.spawn(&mut cmd).map_err(|e| e.to_string())?;
            let pid = p.pid();
            let ready = Instant::now() + Duration::from_secs(20);
            while std::os::unix::net::UnixStream::connect(&socket).is_err() {
                if Instant::now() > ready {
                    return Err("bgpd did not start".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let count = move || {
                let o = lab::bgpd::bgpctl(&socket, &["show", "protocols", "--json"]);
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
                v[0]["prefixes_accepted"].as_u64().map(|n| n as usize)
            };
            Ok(Receiver {
                pid,
                count: Box::new(count),
                _keep: vec![Box::new(p), Box::new(dir)],
            })
        }
        Kind::Bird1 | Kind::Bird2 => {
            let v = if kind == Kind::Bird1 {
                BirdVersion::V1
            } else {
                BirdVersion::V2
            };
            let (bird, birdc) = binaries(v)?;
            let conf = if v == BirdVersion::V1 {
                format!(
                    "router id {RECV};\nprotocol device {{ }}\nprotocol direct {{ interface \"*\"; }}\n\
                     protocol bgp m {{ local as {AS}; neighbor {FEED} as {AS}; passive on; import all; export none; }}\n"
                )
            } else {
                format!(
                    "router id {RECV};\nprotocol device {{ }}\nprotocol direct {{ ipv4; interface \"*\"; }}\n\
                     protocol bgp m {{ local as {AS}; neighbor {FEED} as {AS}; passive on; ipv4 {{ import all; export none; }}; }}\n"
                )
            };
            std::fs::write(d.join("bird.conf"), conf).map_err(|e| e.to_string())?;
            let o = in_ns(&bird.to_string_lossy())
                .arg("-c")
                .arg(d.join("bird.conf"))
                .arg("-s")
                .arg(d.join("bird.ctl"))
                .arg("-P")
                .arg(d.join("bird.pid"))
                .output()
                .map_err(|e| e.to_string())?;
            if !o.status.success() {
                return Err(String::from_utf8_lossy(&o.stderr).into_owned());
            }
            let pid = read_pid(&d.join("bird.pid")).ok_or("no pid file")?;
            let ctl = d.join("bird.ctl");
            let birdc = birdc.to_string_lossy().into_owned();
            let count = move || {
                let text = output(in_ns(&birdc).arg("-s").arg(&ctl).args([
                    "show",
                    "protocols",
                    "all",
                    "m",
                ]));
                let line = text
                    .lines()
                    .find(|l| l.trim_start().starts_with("Routes:"))?;
                line.split_whitespace().nth(1)?.parse().ok()
            };
            Ok(Receiver {
                pid,
                count: Box::new(count),
                _keep: vec![Box::new(DaemonPid { pid }), Box::new(dir)],
            })
        }
        Kind::Frr => {
            let conf = format!(
                "frr defaults traditional\nrouter bgp {AS}\n bgp router-id {RECV}\n neighbor {FEED} remote-as {AS}\n neighbor {FEED} passive\n"
            );
            std::fs::write(d.join("bgpd.conf"), conf).map_err(|e| e.to_string())?;
            let _ = Command::new("chown")
                .args(["-R", "frr:frr"])
                .arg(&d)
                .status();
            let o = in_ns(lab::frr::FRR_BGPD)
                .arg("-d")
                .arg("-f")
                .arg(d.join("bgpd.conf"))
                .arg("-i")
                .arg(d.join("bgpd.pid"))
                .arg("--vty_socket")
                .arg(&d)
                .args(["-Z", "-A", "127.0.0.1", "-P", "0"])
                .output()
                .map_err(|e| e.to_string())?;
            if !o.status.success() {
                return Err(String::from_utf8_lossy(&o.stderr).into_owned());
            }
            let pid = read_pid(&d.join("bgpd.pid")).ok_or("no pid file")?;
            let dd = d.clone();
            let count = move || {
                let text = output(in_ns("vtysh").arg("--vty_socket").arg(&dd).args([
                    "-d",
                    "bgpd",
                    "-c",
                    "show bgp ipv4 unicast summary json",
                ]));
                let v: serde_json::Value = serde_json::from_str(&text).ok()?;
                v["peers"][FEED]["pfxRcd"].as_u64().map(|n| n as usize)
            };
            Ok(Receiver {
                pid,
                count: Box::new(count),
                _keep: vec![Box::new(DaemonPid { pid }), Box::new(dir)],
            })
        }
        Kind::Gobgp => {
            let conf = format!(
                "[global.config]\n  as = {AS}\n  router-id = \"{RECV}\"\n\
                 [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{FEED}\"\n    peer-as = {AS}\n\
                   [neighbors.transport.config]\n    passive-mode = true\n"
            );
            std::fs::write(d.join("gobgpd.toml"), conf).map_err(|e| e.to_string())?;
            let mut cmd = ns.command("gobgpd");
            cmd.arg("-f")
                .arg(d.join("gobgpd.toml"))
                .args([
                    "-t",
                    "toml",
                    "--api-hosts",
                    "127.0.0.1:50051",
                    "--pprof-disable",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let p: NsProcess = ns.spawn(&mut cmd).map_err(|e| e.to_string())?;
            let pid = p.pid();
            let count = move || {
                let text = output(
                    in_ns("gobgp").args(["-p", "50051", "global", "rib", "summary", "-a", "ipv4"]),
                );
                let rest = text.split("Destination:").nth(1)?;
                rest.trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            };
            Ok(Receiver {
                pid,
                count: Box::new(count),
                _keep: vec![Box::new(p), Box::new(dir)],
            })
        }
    }
}

/// N prefixes in `sets` groups, each group with its own attributes, packed into UPDATEs,
/// then End-of-RIB.
fn build_updates(n: usize, sets: usize) -> Vec<u8> {
    let session = SessionParams {
        four_octet_as: true,
        ..SessionParams::default()
    };
    let mut out = Vec::new();
    let per = n.div_ceil(sets.max(1));
    let mut i = 0usize;
    for s in 0..sets.max(1) {
        let attrs = PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(AsPath::default()),
            next_hop: Some(FEED.parse().unwrap()),
            local_pref: Some(100),
            med: Some(s as u32),
            ..PathAttributes::default()
        };
        let end = (i + per).min(n);
        let prefixes = (i..end).map(|k| {
            let addr = 0x0B00_0000u32 + (k as u32) * 64;
            Ipv4Prefix::new(Ipv4Addr::from(addr), 26).unwrap()
        });
        bgp_wire::pack::announce_ipv4(&session, &attrs, prefixes, &mut out).unwrap();
        i = end;
    }
    // End-of-RIB for IPv4 unicast: an empty UPDATE.
    out.extend_from_slice(&[0xff; 16]);
    out.extend_from_slice(&[0, 23, 2, 0, 0, 0, 0]);
    out
}

/// The feeder's session: connected, OPENs exchanged; returns the stream at Established.
fn open_session(deadline: Instant) -> Result<(TcpStream, Instant), String> {
    let mut s = loop {
        match TcpStream::connect((RECV, 179)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    s.set_nodelay(true).ok();
    let open = Open::new(
        Asn(AS),
        240,
        FEED.parse().unwrap(),
        vec![
            Capability::Multiprotocol(Family::IPV4_UNICAST),
            Capability::FourOctetAs(Asn(AS)),
        ],
    );
    let mut buf = Vec::new();
    Message::Open(open)
        .encode(&SessionParams::default(), &mut buf)
        .map_err(|e| e.to_string())?;
    s.write_all(&buf).map_err(|e| e.to_string())?;
    let params = SessionParams::default();
    let mut rx = Vec::new();
    let (mut got_open, mut got_ka) = (false, false);
    let mut chunk = [0u8; 4096];
    while !(got_open && got_ka) {
        let n = s.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("receiver closed the session".into());
        }
        rx.extend_from_slice(&chunk[..n]);
        while let Split::Message(len) = split_message(&rx, &params) {
            match decode_message(&rx[..len], &params) {
                Ok(Decoded::Open(_)) => {
                    got_open = true;
                    let mut ka = Vec::new();
                    bgp_wire::encode_keepalive(&mut ka);
                    s.write_all(&ka).map_err(|e| e.to_string())?;
                }
                Ok(Decoded::Keepalive) => got_ka = got_open,
                Ok(Decoded::Notification(n)) => return Err(format!("NOTIFICATION {n}")),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
            rx.drain(..len);
        }
    }
    Ok((s, Instant::now()))
}

fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the command name.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn peak_rss_mib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

struct Row {
    kind: Kind,
    n: usize,
    sets: usize,
    load: Duration,
    cpu_s: f64,
    rss: f64,
    resolution: Duration,
}

fn run_one(kind: Kind, n: usize, sets: usize, timeout: Duration) -> Result<Row, String> {
    let r = Netns::new("br").map_err(|e| e.to_string())?;
    let f = Netns::new("bf").map_err(|e| e.to_string())?;
    let _veth = VethPair::new(&r, "eth0", &f, "eth0").map_err(|e| e.to_string())?;
    r.ip(&["addr", "add", &format!("{RECV}/24"), "dev", "eth0"])
        .map_err(|e| e.to_string())?;
    f.ip(&["addr", "add", &format!("{FEED}/24"), "dev", "eth0"])
        .map_err(|e| e.to_string())?;
    let receiver = start(kind, &r)?;
    let updates = build_updates(n, sets);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (stream, established) = f
        .run_in(|| open_session(deadline))
        .map_err(|e| e.to_string())??;
    let cpu0 = cpu_ticks(receiver.pid);
    // Drain what the receiver sends; keep the session alive while it loads.
    let done = Arc::new(AtomicBool::new(false));
    let mut reader = stream.try_clone().map_err(|e| e.to_string())?;
    let d2 = done.clone();
    let drain = std::thread::spawn(move || {
        reader
            .set_read_timeout(Some(Duration::from_millis(200)))
            .ok();
        let mut b = [0u8; 4096];
        while !d2.load(Ordering::Relaxed) {
            if let Ok(0) = reader.read(&mut b) {
                return;
            }
        }
    });
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let d3 = done.clone();
    let feeder = std::thread::spawn(move || {
        let r = writer.write_all(&updates);
        let mut ka = Vec::new();
        bgp_wire::encode_keepalive(&mut ka);
        let mut last = Instant::now();
        while !d3.load(Ordering::Relaxed) {
            if last.elapsed() > Duration::from_secs(20) {
                let _ = writer.write_all(&ka);
                last = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    });
    let mut resolution = Duration::ZERO;
    let result = loop {
        let t = Instant::now();
        let c = (receiver.count)();
        resolution = resolution.max(t.elapsed());
        if c.is_some_and(|c| c >= n) {
            break Ok(Instant::now() - established);
        }
        if established.elapsed() > timeout {
            break Err(format!(
                "{} held {c:?} of {n} after {timeout:?}",
                kind.name()
            ));
        }
    };
    let cpu_s = (cpu_ticks(receiver.pid).saturating_sub(cpu0)) as f64 / 100.0;
    let rss = peak_rss_mib(receiver.pid);
    done.store(true, Ordering::Relaxed);
    let _ = feeder.join();
    let _ = drain.join();
    drop(stream);
    drop(receiver);
    Ok(Row {
        kind,
        n,
        sets,
        load: result?,
        cpu_s,
        rss,
        resolution,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let ns: Vec<usize> = if args.smoke {
        vec![2000]
    } else if args.n.is_empty() {
        vec![100_000, 1_000_000]
    } else {
        args.n.clone()
    };
    let sets: Vec<usize> = if args.smoke {
        vec![1, 10]
    } else {
        vec![1, 1000]
    };
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| {
            args.only.is_empty()
                || args.only.iter().any(|o| {
                    o.eq_ignore_ascii_case(k.name()) || o.eq_ignore_ascii_case(&format!("{k:?}"))
                })
        })
        .collect();
    let timeout = Duration::from_secs(args.timeout_s);
    lab::netns::remove_stale();
    let mut rows = Vec::new();
    let mut failed = false;
    for &n in &ns {
        for &s in &sets {
            for &k in &kinds {
                match run_one(k, n, s, timeout) {
                    Ok(r) => rows.push(r),
                    Err(e) => {
                        eprintln!("{} N={n} sets={s}: {e}", k.name());
                        failed = true;
                    }
                }
            }
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:>9} {:>5}  {:<9} {:>9} {:>7} {:>8}  {:>7} {:>7} {:>7}  {:>6}",
        "N", "sets", "receiver", "load s", "CPU s", "RSS MiB", "×load", "×CPU", "×RSS", "res ms"
    );
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.kind == Kind::Bird2 && b.n == r.n && b.sets == r.sets);
        let ratio = |a: f64, b: Option<f64>| match b {
            Some(b) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:>9} {:>5}  {:<9} {:>9.3} {:>7.2} {:>8.1}  {:>7} {:>7} {:>7}  {:>6.1}",
            r.n,
            r.sets,
            r.kind.name(),
            r.load.as_secs_f64(),
            r.cpu_s,
            r.rss,
            ratio(r.load.as_secs_f64(), base.map(|b| b.load.as_secs_f64())),
            ratio(r.cpu_s, base.map(|b| b.cpu_s)),
            ratio(r.rss, base.map(|b| b.rss)),
            r.resolution.as_secs_f64() * 1000.0,
        );
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
