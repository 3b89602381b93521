//! `bgp_bench`: BGP ingest and advertisement side by side in one run — bgpd, BIRD 2,
//! BIRD 1.6, FRR (bgpd -Z) and GoBGP, each alone in fresh namespaces, fed the same packed
//! UPDATEs by our own feeder and drained by our own collector (both on `bgp_wire`).
//!
//! Why this file is long: one benchmark run end to end: the feeder, the collector and the set-up of
//! five implementations, which must do the same work.
//!
//! **Ingest.** The feeder (a thread in the feeder's namespace) opens an iBGP session to the
//! receiver (AS 64512, passive there), hands N pre-encoded /26 prefixes with 1 or 1,000
//! distinct attribute sets (`bgp_wire::pack`), then End-of-RIB, to TCP in one write.
//! Measured: time from Established (the feeder's view) until the receiver reports the N
//! routes in its table, CPU seconds of the receiver over that time, and its peak RSS (VmHWM,
//! start-up included).
//!
//! **Advertisement.** A fresh receiver learns the N routes from the feeder over eBGP
//! (feeder AS 65001); once it holds them, our collector (AS 65002, another address in the
//! feeder's namespace) opens a session to it. Measured: time from the collector's
//! Established until it holds all N prefixes, timestamped as the bytes arrive, and the
//! receiver's CPU seconds over that time.
//!
//! **Resolution.** Ingest completion is observed by polling each receiver's own control
//! socket in a tight loop (bgpd: gRPC; BIRD: its CLI socket; FRR: its vty socket; GoBGP: the
//! `gobgp` CLI, a process per poll). The completion lies between the start of the last poll
//! that saw fewer than N and the end of the first that saw N: the time printed is the middle
//! of that window and `±ms` is half its width, so the resolution is honest per row (a
//! receiver busy loading answers its CLI late, which widens its own window). The collector
//! timestamps each read; its `±ms` is half the gap since the previous read.
//!
//! One table, every measure also as a ratio to BIRD 2 of the same N and sets. `B/rt` is
//! the peak RSS above the receiver's RSS before the feed, per route: what the routes cost,
//! apart from code and runtime. `--repeat R` runs every measurement R times and keeps the
//! median run (the machine is shared; foreign load moves single runs a lot).
//!
//! `--smoke`: N = 2,000 with 1 and 10 attribute sets, to show the benchmark still works.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bgp_wire::{
    AsPath, Asn, Capability, Community, Decoded, Family, Ipv4Prefix, Message, Open, Origin,
    PathAttributes, Prefix, SessionParams, Split, decode_message, split_message,
};
use clap::Parser;
use interop_tests::lab;
use interop_tests::lab::bgp_peer::{DaemonPid, read_pid};
use interop_tests::lab::bird::{BirdVersion, binaries};
use interop_tests::lab::netns::{Netns, NsProcess, VethPair};

const RECV: &str = "10.99.0.1";
const FEED: &str = "10.99.0.2";
const COLL: &str = "10.99.0.3";
const AS: u32 = 64512;
const FEED_EBGP_AS: u32 = 65001;
const COLL_AS: u32 = 65002;
/// bgpd puts routes from external peers into its desired kernel table (`--kernel`).
static KERNEL: AtomicBool = AtomicBool::new(false);
/// Pause between polls (`--poll-ms`).
static POLL_MS: AtomicU64 = AtomicU64::new(4);
/// The feeder's prefixes: 11.0.0.0/26, 11.0.0.64/26, ...
const BASE: u32 = 0x0B00_0000;

#[derive(Parser)]
#[command(about = "BGP ingest and advertisement: bgpd against BIRD 2, BIRD 1.6, FRR and GoBGP")]
struct Args {
    /// A tiny run that only shows the benchmark still works.
    #[arg(long)]
    smoke: bool,
    /// Prefix counts [default: 100000,1000000].
    #[arg(long, value_delimiter = ',')]
    n: Vec<usize>,
    /// Attribute sets [default: 1,1000].
    #[arg(long, value_delimiter = ',')]
    sets: Vec<usize>,
    /// Receivers to run [default: all].
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run each measurement this many times and keep the median (a shared machine is
    /// noisy).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Skip the advertisement measurement.
    #[arg(long)]
    no_advertise: bool,
    /// Let bgpd compute the desired kernel table for the learned routes (for routewriter;
    /// the other receivers are not configured to export to a kernel).
    #[arg(long)]
    kernel: bool,
    /// Pause between two polls of a receiver's table, milliseconds.
    #[arg(long, default_value_t = 4)]
    poll_ms: u64,
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

/// Which measurement a receiver is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The feeder is an iBGP peer; nobody else.
    Ingest,
    /// The feeder is an eBGP peer; the collector another, passive on the receiver's side.
    Advertise,
}

impl Mode {
    fn feeder_as(self) -> u32 {
        match self {
            Mode::Ingest => AS,
            Mode::Advertise => FEED_EBGP_AS,
        }
    }
}

/// How to ask a receiver how many routes it holds from the feeder.
// One per receiver, never moved around: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
enum Counter {
    Bgpd {
        rt: tokio::runtime::Runtime,
        client: proto::v1::bgp_client::BgpClient<tonic::transport::Channel>,
    },
    /// BIRD's control socket, and the connection kept open to it (as birdc keeps one).
    Bird(PathBuf, Option<UnixStream>),
    /// FRR's vty socket, and the connection kept open to it (as vtysh keeps one).
    Frr(PathBuf, Option<UnixStream>),
    Gobgp,
}

impl Counter {
    /// Routes from the feeder, if the receiver answered.
    fn count(&mut self) -> Option<usize> {
        match self {
            Counter::Bgpd { rt, client } => {
                let peers = rt
                    .block_on(client.list_peers(proto::v1::ListPeersRequest {}))
                    .ok()?
                    .into_inner()
                    .peers;
                let p = peers
                    .iter()
                    .find(|p| p.peer.as_ref().is_some_and(|s| s.peer_address == FEED))?;
                usize::try_from(p.prefixes_accepted).ok()
            }
            Counter::Bird(ctl, conn) => {
                let text = bird_cli(ctl, conn, "show protocols all f")?;
                let at = text.find("Routes:")?;
                text.get(at + "Routes:".len()..)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            }
            Counter::Frr(vty, conn) => {
                let text = frr_vty(vty, conn, "show bgp ipv4 unicast summary json")?;
                let v: serde_json::Value = serde_json::from_str(&text).ok()?;
                v["peers"][FEED]["pfxRcd"].as_u64().map(|n| n as usize)
            }
            Counter::Gobgp => {
                // Run from the receiver's namespace (the caller entered it): no `ip netns exec`.
                let o = Command::new("gobgp")
                    .args(["-p", "50051", "global", "rib", "summary", "-a", "ipv4"])
                    .stderr(Stdio::null())
                    .output()
                    .ok()?;
                let text = String::from_utf8_lossy(&o.stdout);
                let rest = text.split("Destination:").nth(1)?;
                rest.trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            }
        }
    }
}

/// One command over BIRD's control socket (what birdc does): the reply's text. The
/// connection is kept for the next command; a failed one is dropped and made again.
fn bird_cli(ctl: &Path, conn: &mut Option<UnixStream>, command: &str) -> Option<String> {
    let r = bird_exchange(ctl, conn, command);
    if r.is_none() {
        *conn = None;
    }
    r
}

fn bird_exchange(ctl: &Path, conn: &mut Option<UnixStream>, command: &str) -> Option<String> {
    if conn.is_none() {
        let mut s = UnixStream::connect(ctl).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        // The greeting: "0001 BIRD x.y ready."
        read_bird_reply(&mut s)?;
        *conn = Some(s);
    }
    let s = conn.as_mut()?;
    s.write_all(format!("{command}\n").as_bytes()).ok()?;
    read_bird_reply(s)
}

/// Lines up to the last of a reply: "dddd text" (code, space), where continuation lines
/// are "dddd-text" or " text".
fn read_bird_reply(s: &mut UnixStream) -> Option<String> {
    let mut text = Vec::new();
    let mut byte = [0u8; 4096];
    loop {
        let n = s.read(&mut byte).ok()?;
        if n == 0 {
            return None;
        }
        text.extend_from_slice(byte.get(..n)?);
        if text.ends_with(b"\n") {
            let t = String::from_utf8_lossy(&text);
            let last = t.lines().last().unwrap_or("").as_bytes();
            if last.len() >= 5
                && last
                    .get(..4)
                    .is_some_and(|c| c.iter().all(u8::is_ascii_digit))
                && last.get(4) == Some(&b' ')
            {
                return Some(t.into_owned());
            }
        }
    }
}

/// One command over an FRR daemon's vty socket (what vtysh does): the command NUL-ended;
/// the reply ends with three NULs and a status byte. The connection is kept.
fn frr_vty(vty: &Path, conn: &mut Option<UnixStream>, command: &str) -> Option<String> {
    let r = frr_exchange(vty, conn, command);
    if r.is_none() {
        *conn = None;
    }
    r
}

fn frr_exchange(vty: &Path, conn: &mut Option<UnixStream>, command: &str) -> Option<String> {
    if conn.is_none() {
        let s = UnixStream::connect(vty).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        *conn = Some(s);
    }
    let s = conn.as_mut()?;
    let mut cmd = command.as_bytes().to_vec();
    cmd.push(0);
    s.write_all(&cmd).ok()?;
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        out.extend_from_slice(buf.get(..n)?);
        if out.len() >= 4 && out.get(out.len() - 4..out.len() - 1) == Some(&[0, 0, 0][..]) {
            out.truncate(out.len() - 4);
            return Some(String::from_utf8_lossy(&out).into_owned());
        }
    }
}

/// A running receiver: its pid, how to count its routes from the feeder, what keeps it alive.
struct Receiver {
    pid: i32,
    counter: Counter,
    _keep: Vec<Box<dyn std::any::Any>>,
}

#[expect(
    clippy::too_many_lines,
    reason = "one match arm per implementation under benchmark (bgpd, BIRD 1 and 2, FRR, GoBGP), each writing its config and starting it in the namespace"
)]
fn start(kind: Kind, mode: Mode, ns: &Netns) -> Result<Receiver, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let d = dir.path().to_owned();
    let nsn = ns.name().to_owned();
    let in_ns = move |prog: &str| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &nsn, prog]);
        c
    };
    let fas = mode.feeder_as();
    let adv = mode == Mode::Advertise;
    match kind {
        Kind::Bgpd => {
            let socket = d.join("bgpd.sock");
            let mut peers =
                format!("[[bgp.peers]]\naddress = \"{FEED}\"\nas = {fas}\npassive = true\n");
            if adv {
                peers.push_str(&format!(
                    "[[bgp.peers]]\naddress = \"{COLL}\"\nas = {COLL_AS}\npassive = true\n"
                ));
            }
            let config = lab::bgpd::write_config(
                &d,
                &socket,
                &format!(
                    "[bgp]\nas = {AS}\nrouter_id = \"{RECV}\"\n{peers}[log]\nlevel = \"warn\"\n"
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
            while UnixStream::connect(&socket).is_err() {
                if Instant::now() > ready {
                    return Err("bgpd did not start".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let channel = rt
                .block_on(proto::client::connect_unix(&socket))
                .map_err(|e| e.to_string())?;
            let mut client = proto::v1::bgp_client::BgpClient::new(channel);
            rt.block_on(bgpd_settings(&mut client, adv))?;
            Ok(Receiver {
                pid,
                counter: Counter::Bgpd { rt, client },
                _keep: vec![Box::new(p), Box::new(dir)],
            })
        }
        Kind::Bird1 | Kind::Bird2 => {
            let v = if kind == Kind::Bird1 {
                BirdVersion::V1
            } else {
                BirdVersion::V2
            };
            let (bird, _birdc) = binaries(v)?;
            // Protocol `f` is the feeder, `c` the collector.
            let conf = if v == BirdVersion::V1 {
                let mut c = format!(
                    "router id {RECV};\nprotocol device {{ }}\nprotocol direct {{ interface \"*\"; }}\n\
                     protocol bgp f {{ local as {AS}; neighbor {FEED} as {fas}; passive on; import all; export none; }}\n"
                );
                if adv {
                    c.push_str(&format!(
                        "protocol bgp c {{ local as {AS}; neighbor {COLL} as {COLL_AS}; passive on; import none; export all; }}\n"
                    ));
                }
                c
            } else {
                let mut c = format!(
                    "router id {RECV};\nprotocol device {{ }}\nprotocol direct {{ ipv4; interface \"*\"; }}\n\
                     protocol bgp f {{ local as {AS}; neighbor {FEED} as {fas}; passive on; ipv4 {{ import all; export none; }}; }}\n"
                );
                if adv {
                    c.push_str(&format!(
                        "protocol bgp c {{ local as {AS}; neighbor {COLL} as {COLL_AS}; passive on; ipv4 {{ import none; export all; }}; }}\n"
                    ));
                }
                c
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
            Ok(Receiver {
                pid,
                counter: Counter::Bird(d.join("bird.ctl"), None),
                _keep: vec![Box::new(DaemonPid { pid }), Box::new(dir)],
            })
        }
        Kind::Frr => {
            let mut conf = format!(
                "frr defaults traditional\nrouter bgp {AS}\n bgp router-id {RECV}\n no bgp ebgp-requires-policy\n\
                 neighbor {FEED} remote-as {fas}\n neighbor {FEED} passive\n"
            );
            if adv {
                // MRAI 0: FRR's eBGP default (traditional: 30 s) would time FRR's timer, not
                // its work.
                conf.push_str(&format!(
                    " neighbor {COLL} remote-as {COLL_AS}\n neighbor {COLL} passive\n neighbor {COLL} advertisement-interval 0\n"
                ));
            }
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
            Ok(Receiver {
                pid,
                counter: Counter::Frr(d.join("bgpd.vty"), None),
                _keep: vec![Box::new(DaemonPid { pid }), Box::new(dir)],
            })
        }
        Kind::Gobgp => {
            let mut conf = format!(
                "[global.config]\n  as = {AS}\n  router-id = \"{RECV}\"\n\
                 [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{FEED}\"\n    peer-as = {fas}\n\
                   [neighbors.transport.config]\n    passive-mode = true\n"
            );
            if adv {
                conf.push_str(&format!(
                    "[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{COLL}\"\n    peer-as = {COLL_AS}\n\
                       [neighbors.transport.config]\n    passive-mode = true\n"
                ));
            }
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
            Ok(Receiver {
                pid,
                counter: Counter::Gobgp,
                _keep: vec![Box::new(p), Box::new(dir)],
            })
        }
    }
}

/// bgpd's cluster settings for the run, applied like an operator would (`SetConfiguration`),
/// then waited for until its policy shows them:
/// - routes from external peers are not put into the desired kernel table unless
///   `--kernel`: the BIRD, FRR and GoBGP receivers export nothing to a kernel either;
/// - for the advertisement run, external transit on: Calico's default policy (which bgpd
///   follows) passes nothing from one external peer to another, while the other receivers
///   are configured with `export all` to the collector.
async fn bgpd_settings(
    client: &mut proto::v1::bgp_client::BgpClient<tonic::transport::Channel>,
    transit: bool,
) -> Result<(), String> {
    let kernel = KERNEL.load(Ordering::Relaxed);
    let mut c = client
        .get_configuration(proto::v1::GetConfigurationRequest {})
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    c.external_transit = transit;
    c.program_external_routes = Some(kernel);
    client
        .set_configuration(proto::v1::SetConfigurationRequest {
            configuration: Some(c),
        })
        .await
        .map_err(|e| e.to_string())?;
    let want_kernel = if kernel {
        "program_external_routes on"
    } else {
        "program_external_routes off"
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rules = client
            .get_filters(proto::v1::GetFiltersRequest::default())
            .await
            .map_err(|e| e.to_string())?
            .into_inner()
            .rules;
        let has = |text: &str| rules.iter().any(|r| r.reason.contains(text));
        if has(want_kernel) && (!transit || has("external transit is on")) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("bgpd did not apply the benchmark's BGP configuration".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// N prefixes in `sets` groups, each group with its own attributes (MED and a community, so
/// the sets stay distinct when exported over eBGP, where MED is dropped), packed into
/// UPDATEs, then End-of-RIB.
fn build_updates(n: usize, sets: usize, mode: Mode) -> Vec<u8> {
    let session = SessionParams {
        four_octet_as: true,
        ..SessionParams::default()
    };
    let mut out = Vec::new();
    let per = n.div_ceil(sets.max(1));
    let mut i = 0usize;
    for s in 0..sets.max(1) {
        let mut as_path = AsPath::default();
        let mut local_pref = Some(100);
        if mode == Mode::Advertise {
            as_path.prepend(Asn(FEED_EBGP_AS));
            local_pref = None;
        }
        let attrs = PathAttributes {
            origin: Some(Origin::Igp),
            as_path: Some(as_path),
            next_hop: Some(FEED.parse().unwrap()),
            local_pref,
            med: Some(s as u32),
            communities: vec![Community((FEED_EBGP_AS << 16) | (s as u32 & 0xffff))],
            ..PathAttributes::default()
        };
        let end = (i + per).min(n);
        let prefixes = (i..end).map(|k| {
            let addr = BASE + (k as u32) * 64;
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

/// Our side of a session: connected from `local`, OPENs exchanged; returns the stream at
/// Established and any bytes read past the receiver's KEEPALIVE.
fn open_session(
    local: &str,
    asn: u32,
    deadline: Instant,
) -> Result<(TcpStream, Instant, Vec<u8>), String> {
    let local: Ipv4Addr = local.parse().map_err(|_| "bad local address")?;
    let mut s = loop {
        let socket = connect_from(local);
        match socket {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    s.set_nodelay(true).ok();
    let open = Open::new(
        Asn(asn),
        240,
        local,
        vec![
            Capability::Multiprotocol(Family::IPV4_UNICAST),
            Capability::FourOctetAs(Asn(asn)),
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
        while !(got_open && got_ka)
            && let Split::Message(len) = split_message(&rx, &params)
        {
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
    Ok((s, Instant::now(), rx))
}

/// A connection to the receiver's port 179 from `local` (bound first, so the receiver sees
/// the address it is configured for).
fn connect_from(local: Ipv4Addr) -> std::io::Result<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.bind(SocketAddr::new(local.into(), 0))?;
        let s = tokio::time::timeout(
            Duration::from_secs(2),
            sock.connect(SocketAddr::new(RECV.parse().unwrap(), 179)),
        )
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let s = s.into_std()?;
        s.set_nonblocking(false)?;
        Ok(s)
    })
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
    status_mib(pid, "VmHWM:")
}

/// A memory figure of /proc/<pid>/status, in MiB.
fn status_mib(pid: i32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// A time with its uncertainty (half the window it lies in).
#[derive(Debug, Clone, Copy, Default)]
struct Timed {
    at: Duration,
    pm: Duration,
    /// For the advertisement: when the first of the routes arrived (a receiver may wait
    /// before it starts sending, which is part of the time but not of the work).
    first: Option<Duration>,
}

struct Row {
    kind: Kind,
    n: usize,
    sets: usize,
    ingest: Timed,
    cpu_s: f64,
    rss: f64,
    /// RSS of the started receiver before the feed (code, runtime, empty tables).
    idle_rss: f64,
    adv: Option<Timed>,
    adv_cpu_s: f64,
    adv_rss: f64,
}

/// Two namespaces (receiver, feeder+collector) with a veth between them.
struct Lab {
    r: Netns,
    f: Netns,
    _veth: VethPair,
}

fn lab() -> Result<Lab, String> {
    let r = Netns::new("br").map_err(|e| e.to_string())?;
    let f = Netns::new("bf").map_err(|e| e.to_string())?;
    let veth = VethPair::new(&r, "eth0", &f, "eth0").map_err(|e| e.to_string())?;
    r.ip(&["addr", "add", &format!("{RECV}/24"), "dev", "eth0"])
        .map_err(|e| e.to_string())?;
    f.ip(&["addr", "add", &format!("{FEED}/24"), "dev", "eth0"])
        .map_err(|e| e.to_string())?;
    f.ip(&["addr", "add", &format!("{COLL}/24"), "dev", "eth0"])
        .map_err(|e| e.to_string())?;
    Ok(Lab { r, f, _veth: veth })
}

/// The feeder's session, fed: it writes the UPDATEs, drains what comes back and sends
/// KEEPALIVEs until `done`.
struct Feeder {
    done: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    established: Instant,
}

impl Feeder {
    fn start(l: &Lab, mode: Mode, updates: Vec<u8>) -> Result<Feeder, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let (stream, established, _) =
            l.f.run_in(|| open_session(FEED, mode.feeder_as(), deadline))
                .map_err(|e| e.to_string())??;
        let done = Arc::new(AtomicBool::new(false));
        let mut reader = stream.try_clone().map_err(|e| e.to_string())?;
        let d2 = done.clone();
        let drain = std::thread::spawn(move || {
            reader
                .set_read_timeout(Some(Duration::from_millis(200)))
                .ok();
            let mut b = [0u8; 65536];
            while !d2.load(Ordering::Relaxed) {
                if let Ok(0) = reader.read(&mut b) {
                    return;
                }
            }
        });
        let mut writer = stream;
        let d3 = done.clone();
        let feed = std::thread::spawn(move || {
            let _ = writer.write_all(&updates);
            let mut ka = Vec::new();
            bgp_wire::encode_keepalive(&mut ka);
            let mut last = Instant::now();
            while !d3.load(Ordering::Relaxed) {
                if last.elapsed() > Duration::from_secs(20) {
                    let _ = writer.write_all(&ka);
                    last = Instant::now();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Ok(Feeder {
            done,
            threads: vec![drain, feed],
            established,
        })
    }

    fn stop(self) {
        self.done.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Poll until the receiver holds `n` routes from the feeder: the completion time after
/// `since`, with the poll window as its uncertainty.
fn wait_for(
    receiver: &mut Receiver,
    ns: &Netns,
    n: usize,
    since: Instant,
    timeout: Duration,
) -> Result<Timed, String> {
    // GoBGP's CLI talks TCP to 127.0.0.1 in the receiver's namespace.
    let _guard = ns.enter().map_err(|e| e.to_string())?;
    let mut last_short = since;
    loop {
        let t0 = Instant::now();
        let c = receiver.counter.count();
        let t1 = Instant::now();
        if c.is_some_and(|c| c >= n) {
            let lo = last_short - since;
            let hi = t1 - since;
            return Ok(Timed {
                at: (lo + hi) / 2,
                pm: (hi - lo) / 2,
                first: None,
            });
        }
        last_short = t0;
        if since.elapsed() > timeout {
            return Err(format!("held {c:?} of {n} after {timeout:?}"));
        }
        // A pause keeps the polling from taking a core away from the receiver.
        std::thread::sleep(Duration::from_millis(POLL_MS.load(Ordering::Relaxed)));
    }
}

fn ingest(kind: Kind, n: usize, sets: usize, timeout: Duration) -> Result<Row, String> {
    let l = lab()?;
    let mut receiver = start(kind, Mode::Ingest, &l.r)?;
    let idle_rss = status_mib(receiver.pid, "VmRSS:");
    let updates = build_updates(n, sets, Mode::Ingest);
    let feeder = Feeder::start(&l, Mode::Ingest, updates)?;
    let cpu0 = cpu_ticks(receiver.pid);
    let r = wait_for(&mut receiver, &l.r, n, feeder.established, timeout);
    let cpu_s = (cpu_ticks(receiver.pid).saturating_sub(cpu0)) as f64 / 100.0;
    let rss = peak_rss_mib(receiver.pid);
    feeder.stop();
    drop(receiver);
    Ok(Row {
        kind,
        n,
        sets,
        ingest: r?,
        cpu_s,
        rss,
        idle_rss,
        adv: None,
        adv_cpu_s: 0.0,
        adv_rss: 0.0,
    })
}

/// Advertisement to a fresh collector: (time, receiver CPU s over it, receiver peak RSS).
fn advertise(
    kind: Kind,
    n: usize,
    sets: usize,
    timeout: Duration,
) -> Result<(Timed, f64, f64), String> {
    let l = lab()?;
    let mut receiver = start(kind, Mode::Advertise, &l.r)?;
    let updates = build_updates(n, sets, Mode::Advertise);
    let feeder = Feeder::start(&l, Mode::Advertise, updates)?;
    let loaded = wait_for(&mut receiver, &l.r, n, feeder.established, timeout);
    if let Err(e) = loaded {
        feeder.stop();
        return Err(format!("loading from the eBGP feeder: {e}"));
    }
    let pid = receiver.pid;
    let mut cpu0 = 0;
    let r =
        l.f.run_in(|| collect(n, timeout, || cpu0 = cpu_ticks(pid)))
            .map_err(|e| e.to_string())?;
    let cpu_s = (cpu_ticks(pid).saturating_sub(cpu0)) as f64 / 100.0;
    let rss = peak_rss_mib(pid);
    feeder.stop();
    drop(receiver);
    Ok((r?, cpu_s, rss))
}

/// The collector: connect, and count distinct feeder prefixes until all `n` are held.
fn collect(n: usize, timeout: Duration, at_established: impl FnOnce()) -> Result<Timed, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut s, established, mut rx) = open_session(COLL, COLL_AS, deadline)?;
    at_established();
    let params = SessionParams {
        four_octet_as: true,
        ..SessionParams::default()
    };
    let mut held = vec![0u64; n.div_ceil(64)];
    let mut count = 0usize;
    let mut first = None;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok();
    let mut chunk = vec![0u8; 1 << 16];
    let mut last_read = established;
    let mut last_ka = Instant::now();
    let mut start = 0usize;
    loop {
        // Decode what is buffered.
        while let Split::Message(len) = split_message(&rx[start..], &params) {
            let msg = &rx[start..start + len];
            match decode_message(msg, &params) {
                Ok(Decoded::Update(u)) => {
                    for p in u.update.withdrawn_routes() {
                        if let Some((w, bit)) = slot(p, n)
                            && held[w] & bit != 0
                        {
                            held[w] &= !bit;
                            count -= 1;
                        }
                    }
                    for p in u.update.announced() {
                        if let Some((w, bit)) = slot(p, n)
                            && held[w] & bit == 0
                        {
                            held[w] |= bit;
                            count += 1;
                        }
                    }
                }
                Ok(Decoded::Notification(m)) => return Err(format!("NOTIFICATION {m}")),
                Ok(_) => {}
                Err(e) => return Err(format!("collector: {e}")),
            }
            start += len;
        }
        rx.drain(..start);
        start = 0;
        let now = Instant::now();
        if count > 0 && first.is_none() {
            first = Some(now - established);
        }
        if count >= n {
            let hi = now - established;
            let lo = last_read.saturating_duration_since(established);
            return Ok(Timed {
                at: (lo + hi) / 2,
                pm: (hi - lo) / 2,
                first,
            });
        }
        if established.elapsed() > timeout {
            return Err(format!("collector held {count} of {n} after {timeout:?}"));
        }
        if last_ka.elapsed() > Duration::from_secs(20) {
            let mut ka = Vec::new();
            bgp_wire::encode_keepalive(&mut ka);
            s.write_all(&ka).map_err(|e| e.to_string())?;
            last_ka = Instant::now();
        }
        last_read = Instant::now();
        match s.read(&mut chunk) {
            Ok(0) => return Err(format!("receiver closed after {count} of {n}")),
            Ok(k) => rx.extend_from_slice(&chunk[..k]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Where a feeder prefix sits in the collector's bitmap.
fn slot(p: Prefix, n: usize) -> Option<(usize, u64)> {
    let Prefix::V4(p) = p else { return None };
    if p.prefix_len() != 26 {
        return None;
    }
    let k = usize::try_from(u32::from(p.addr()).checked_sub(BASE)? / 64).ok()?;
    (k < n).then_some((k / 64, 1u64 << (k % 64)))
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
    } else if args.sets.is_empty() {
        vec![1, 1000]
    } else {
        args.sets.clone()
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
    POLL_MS.store(args.poll_ms, Ordering::Relaxed);
    KERNEL.store(args.kernel, Ordering::Relaxed);
    lab::netns::remove_stale();
    let mut rows = Vec::new();
    let mut failed = false;
    for &n in &ns {
        for &s in &sets {
            for &k in &kinds {
                // Each measurement `--repeat` times, in fresh namespaces; the run with the
                // median time is kept (with its CPU and RSS).
                let mut ingests = Vec::new();
                for _ in 0..args.repeat.max(1) {
                    match ingest(k, n, s, timeout) {
                        Ok(r) => ingests.push(r),
                        Err(e) => {
                            eprintln!("{} N={n} sets={s}: ingest: {e}", k.name());
                            failed = true;
                        }
                    }
                }
                ingests.sort_by_key(|r| r.ingest.at);
                let Some(mut row) = median(ingests) else {
                    continue;
                };
                if !args.no_advertise {
                    let mut advs = Vec::new();
                    for _ in 0..args.repeat.max(1) {
                        match advertise(k, n, s, timeout) {
                            Ok(a) => advs.push(a),
                            Err(e) => {
                                eprintln!("{} N={n} sets={s}: advertisement: {e}", k.name());
                                failed = true;
                            }
                        }
                    }
                    advs.sort_by_key(|(t, _, _)| t.at);
                    if let Some((t, cpu, rss)) = median(advs) {
                        row.adv = Some(t);
                        row.adv_cpu_s = cpu;
                        row.adv_rss = rss;
                    }
                }
                eprintln!(
                    "{} N={n} sets={s}: ingest {:.3} s, advertisement {:?}",
                    k.name(),
                    row.ingest.at.as_secs_f64(),
                    row.adv.map(|a| a.at.as_secs_f64())
                );
                rows.push(row);
            }
        }
    }
    print_table(&rows);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The middle element of a sorted list (the upper one of two).
fn median<T>(mut v: Vec<T>) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    let mid = v.len() / 2;
    Some(v.swap_remove(mid))
}

fn print_table(rows: &[Row]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "Ingest: Established → N in the receiver's table (iBGP). Advertisement: collector's \
         Established → collector holds N (receiver learned them over eBGP); 1st: until the \
         first route arrived. ±: half the window the instant lies in. RSS: peak (VmHWM); \
         B/rt: (peak - RSS before the feed) / N. × columns: ratio to BIRD 2 (lower is better)."
    );
    let _ = writeln!(
        out,
        "{:>9} {:>5}  {:<9} {:>9} {:>6} {:>7} {:>8} {:>5}  {:>8} {:>6} {:>7} {:>7} {:>8}  {:>7} {:>6} {:>6} {:>6} {:>6}",
        "N",
        "sets",
        "receiver",
        "ingest s",
        "±ms",
        "CPU s",
        "RSS MiB",
        "B/rt",
        "adv s",
        "±ms",
        "1st ms",
        "advCPU",
        "advRSS",
        "×ingest",
        "×CPU",
        "×RSS",
        "×adv",
        "×aRSS"
    );
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.kind == Kind::Bird2 && b.n == r.n && b.sets == r.sets);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 && a / b >= 0.1 => format!("{:.2}", a / b),
            // Small ratios keep their first digits (a tiny run's advertisement can be 1 ms).
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2e}", a / b),
            _ => "-".into(),
        };
        let adv = r.adv.map(|a| a.at.as_secs_f64());
        let _ = writeln!(
            out,
            "{:>9} {:>5}  {:<9} {:>9.4} {:>6.1} {:>7.2} {:>8.1} {:>5.0}  {:>8} {:>6} {:>7} {:>7.2} {:>8.1}  {:>7} {:>6} {:>6} {:>6} {:>6}",
            r.n,
            r.sets,
            r.kind.name(),
            r.ingest.at.as_secs_f64(),
            r.ingest.pm.as_secs_f64() * 1000.0,
            r.cpu_s,
            r.rss,
            (r.rss - r.idle_rss).max(0.0) * 1048576.0 / r.n.max(1) as f64,
            adv.map_or("-".into(), |a| format!("{a:.4}")),
            r.adv.map_or("-".into(), |a| format!(
                "{:.1}",
                a.pm.as_secs_f64() * 1000.0
            )),
            r.adv
                .and_then(|a| a.first)
                .map_or("-".into(), |f| format!("{:.0}", f.as_secs_f64() * 1000.0)),
            r.adv_cpu_s,
            r.adv_rss,
            ratio(
                Some(r.ingest.at.as_secs_f64()),
                base.map(|b| b.ingest.at.as_secs_f64())
            ),
            ratio(Some(r.cpu_s), base.map(|b| b.cpu_s)),
            ratio(Some(r.rss), base.map(|b| b.rss)),
            ratio(adv, base.and_then(|b| b.adv.map(|a| a.at.as_secs_f64()))),
            ratio(
                r.adv.map(|_| r.adv_rss),
                base.and_then(|b| b.adv.map(|_| b.adv_rss))
            ),
        );
    }
}
