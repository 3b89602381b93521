//! A real BGP speaker (BIRD 1.6, BIRD 2, FRR, GoBGP) as the other side of an interop test,
//! behind one small trait, and the two-namespace topology the tests use: bgpd in namespace
//! `a` (10.99.0.1), the peer in namespace `b` (10.99.0.2), one veth between them.
//!
//! Every process is started inside this run's namespaces and killed by PID when its owner is
//! dropped (also when a test fails); nothing listens outside them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::netns::{Netns, NsProcess, VethPair};

/// bgpd's address on the test link.
pub const BGPD_ADDR: &str = "10.99.0.1";
/// The peer's address on the test link.
pub const PEER_ADDR: &str = "10.99.0.2";
/// Our AS (iBGP peers use it too).
pub const LOCAL_AS: u32 = 64512;

/// A route as the peer holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRoute {
    pub next_hop: String,
    pub as_path: Vec<u32>,
    /// "IGP", "EGP" or "incomplete" (upper-cased by the parsers: "IGP", "EGP", "INCOMPLETE").
    pub origin: String,
    pub local_pref: Option<u32>,
}

/// What a test needs of the other side.
pub trait BgpPeer {
    fn name(&self) -> &'static str;
    /// The session to bgpd is Established, as the peer sees it.
    fn established(&self) -> bool;
    /// The peer's route for `prefix` learned from bgpd, if it has one.
    fn route(&self, prefix: &str) -> Option<PeerRoute>;
    /// Start (again) announcing the peer's test prefix.
    fn announce(&mut self);
    /// Stop announcing it.
    fn withdraw(&mut self);
    /// Kill the process (SIGKILL, no Cease) and start it again with the same configuration.
    fn kill_and_restart(&mut self);
}

/// The prefix each peer announces.
pub const PEER_PREFIX: &str = "10.20.1.0/24";

/// Two namespaces and the link between them.
pub struct Link {
    pub a: Netns,
    pub b: Netns,
    _veth: VethPair,
}

impl Link {
    pub fn new(tag: &str) -> Link {
        let a = Netns::new(&format!("{tag}a")).expect("create namespace a");
        let b = Netns::new(&format!("{tag}b")).expect("create namespace b");
        let veth = VethPair::new(&a, "eth0", &b, "eth0").expect("veth pair");
        a.ip(&["addr", "add", &format!("{BGPD_ADDR}/24"), "dev", "eth0"])
            .unwrap();
        b.ip(&["addr", "add", &format!("{PEER_ADDR}/24"), "dev", "eth0"])
            .unwrap();
        Link { a, b, _veth: veth }
    }
}

/// Poll `f` until it is true or `timeout` passes; whether it became true.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs a command to its end; stdout, or "" if it failed (peers' CLIs fail while starting).
pub fn output(cmd: &mut Command) -> String {
    cmd.stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Reads a daemon's pid file (written when it daemonised), waiting up to 10 s.
pub fn read_pid(path: &Path) -> Option<i32> {
    let mut pid = None;
    wait_until(Duration::from_secs(10), || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        pid.is_some()
    });
    pid
}

/// A daemon that forked away from us: known only by its pid, killed by it on drop.
#[derive(Debug)]
pub struct DaemonPid {
    pub pid: i32,
}

impl DaemonPid {
    /// SIGKILL and wait (up to 5 s) until it is gone.
    pub fn kill(&mut self) {
        if self.pid <= 0 {
            return;
        }
        // SAFETY: kill(2) on the pid this run's daemon wrote into its own pid file.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        wait_until(Duration::from_secs(5), || {
            !Path::new(&format!("/proc/{}", self.pid)).exists()
                || std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
                    .is_ok_and(|s| s.contains(") Z "))
        });
        self.pid = 0;
    }
}

impl Drop for DaemonPid {
    fn drop(&mut self) {
        self.kill();
    }
}

/// bgpd inside namespace `a`, with its API socket in a temporary directory.
pub struct Bgpd {
    pub process: NsProcess,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
}

impl Bgpd {
    /// Starts bgpd in `ns` peering with the peer (AS `peer_as`) and announcing `announce`.
    pub fn start(ns: &Netns, peer_as: u32, announce: &str) -> Bgpd {
        Self::start_with(
            ns,
            &format!(
                "[bgp]\nas = {LOCAL_AS}\nrouter_id = \"{BGPD_ADDR}\"\nerror_wait_time = [1, 60]\n\
                 [[bgp.peers]]\naddress = \"{PEER_ADDR}\"\nas = {peer_as}\nhold_time = 9\n\
                 [[bgp.announce]]\nprefix = \"{announce}\"\n"
            ),
        )
    }

    /// Starts bgpd in `ns` with `extra` (sections after `[api]`, e.g. `[bgp]`).
    pub fn start_with(ns: &Netns, extra: &str) -> Bgpd {
        Self::start_with_node(ns, "", extra)
    }

    /// As [`Bgpd::start_with`], with `node_extra` lines (e.g. `address6 = "fd99::1/64"\n`)
    /// inside the `[node]` section.
    pub fn start_with_node(ns: &Netns, node_extra: &str, extra: &str) -> Bgpd {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("bgpd.sock");
        let config = super::bgpd::write_config_with_node(dir.path(), &socket, node_extra, extra);
        let log = std::fs::File::create(dir.path().join("bgpd.log")).unwrap();
        let mut cmd = ns.command(super::binary("bgpd"));
        cmd.arg("--config").arg(&config);
        cmd.stdout(Stdio::null()).stderr(log);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("MARGAY_") {
                cmd.env_remove(k);
            }
        }
        // Session state changes are logged at debug level: a failed test shows them.
        cmd.env("MARGAY_LOG__LEVEL", "debug");
        let process = ns.spawn(&mut cmd).expect("start bgpd");
        let b = Bgpd {
            process,
            dir,
            socket,
        };
        assert!(
            wait_until(Duration::from_secs(20), || {
                std::os::unix::net::UnixStream::connect(&b.socket).is_ok()
            }),
            "bgpd did not start: {}",
            b.log()
        );
        b
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bgpd.log")).unwrap_or_default()
    }

    /// `bgpctl --json ARGS`, parsed.
    pub fn ctl_json(&self, args: &[&str]) -> serde_json::Value {
        let out = super::bgpd::bgpctl(&self.socket, args);
        assert!(out.status.success(), "bgpctl {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    pub fn ctl(&self, args: &[&str]) {
        let out = super::bgpd::bgpctl(&self.socket, args);
        assert!(out.status.success(), "bgpctl {args:?}: {out:?}");
    }

    pub fn established(&self) -> bool {
        self.ctl_json(&["show", "protocols", "--json"])
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p["state"] == "Established"))
    }

    /// When bgpd's (first) session entered its state, ms since the epoch.
    pub fn since(&self) -> u64 {
        self.ctl_json(&["show", "protocols", "--json"])[0]["since_unix_ms"]
            .as_u64()
            .unwrap_or(0)
    }

    /// bgpd's Loc-RIB entry for `prefix`.
    pub fn route(&self, prefix: &str) -> Option<serde_json::Value> {
        self.ctl_json(&["show", "route", prefix, "--json"])
            .as_array()
            .and_then(|a| a.iter().find(|r| r["prefix"] == prefix).cloned())
    }
}
