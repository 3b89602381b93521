//! The CNI tests' lab: a simulated node (a network namespace with an uplink to a "world"
//! namespace and a default route, the way a host has one), a real bgpd on the embedded store,
//! pod namespaces, and the plugins run the way a runtime runs them: a fresh process in the
//! node's namespace with the CNI_* environment and the configuration on stdin.
//!
//! Shared by the cni_* tests and the cni-bench binary (through `#[path]`); every namespace is
//! per run and removed on drop, also when a test fails.
#![allow(dead_code)]

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use interop_tests::lab::bgpd::{Daemon, bgpctl};
use interop_tests::lab::netns::{Netns, VethPair};
use serde_json::{Value, json};

/// The node's address on its uplink (what bgpd registers).
pub const NODE_IP: &str = "10.0.0.5";
pub const WORLD_IP: &str = "10.0.0.1";
/// The network name every test configuration uses.
pub const NET: &str = "k8s-pod-network";

/// No encapsulation: with a VXLAN pool bgpd would also take a tunnel address for the node,
/// and the tests count the pods' addresses.
pub const POOLS_V4: &str = "[[ipam.default_pools]]\nname = \"pool4\"\ncidr = \"172.20.0.0/16\"\n";
pub const POOLS_V6: &str = "[[ipam.default_pools]]\nname = \"pool6\"\ncidr = \"fd00:20::/48\"\n";

/// Where Debian's containernetworking-plugins are.
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// A simulated node: its namespace, its uplink to the world, and bgpd.
pub struct Node {
    pub ns: Netns,
    pub world: Netns,
    _uplink: VethPair,
    pub daemon: Daemon,
}

impl Node {
    /// bgpd with `pools` (TOML `[[ipam.default_pools]]` entries) and a node namespace whose
    /// default route leaves through a 1500-byte uplink. Forwarding is on, as routewriter (or
    /// Felix) keeps it on a real node.
    pub fn start(tag: &str, pools: &str) -> Node {
        let daemon = Daemon::start(pools);
        let ns = Netns::new(&format!("{tag}n")).expect("node namespace");
        let world = Netns::new(&format!("{tag}w")).expect("world namespace");
        let uplink = VethPair::new(&ns, "up0", &world, "wan0").expect("uplink");
        ns.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "up0"])
            .unwrap();
        world
            .ip(&["addr", "add", &format!("{WORLD_IP}/24"), "dev", "wan0"])
            .unwrap();
        ns.ip(&["route", "add", "default", "via", WORLD_IP])
            .unwrap();
        ns.sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1")
            .unwrap();
        let node = Node {
            ns,
            world,
            _uplink: uplink,
            daemon,
        };
        node.wait_for_pools(pools.matches("[[ipam.default_pools]]").count());
        node
    }

    /// bgpd writes its default pools right after it starts listening.
    pub fn wait_for_pools(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = bgpctl(&self.daemon.socket, &["pool", "ls", "--json"]);
            if out.status.success() {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
                let count = v
                    .as_array()
                    .or_else(|| v.get("pools").and_then(Value::as_array))
                    .map_or(0, Vec::len);
                if count >= n {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "bgpd has no pools after 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A margay configuration for this node's bgpd, in `version`.
    pub fn conf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": NET,
            "type": "margay",
            "socket": self.daemon.socket,
            "nodename": "test-node",
            "log_level": "debug",
            "bgpd_retry_seconds": 2,
            "ipam": {"type": "margay-ipam"}
        })
    }

    /// Runs `plugin` in the node's namespace.
    pub fn run(&self, plugin: &Path, call: &Call) -> Outcome {
        Outcome::from(
            call.command(plugin, &self.ns)
                .output()
                .expect("the plugin runs"),
        )
    }

    pub fn spawn(&self, plugin: &Path, call: &Call) -> Child {
        call.command(plugin, &self.ns)
            .spawn()
            .expect("the plugin starts")
    }

    /// `ip -n node <args>`.
    pub fn ip(&self, args: &[&str]) -> String {
        self.ns.ip(args).unwrap()
    }

    /// The value of a sysctl in the node's namespace.
    pub fn sysctl(&self, key: &str) -> String {
        self.ns
            .exec("cat", &[&format!("/proc/sys/{}", key.replace('.', "/"))])
            .unwrap()
            .trim()
            .to_owned()
    }

    /// The names of the node's `cali*` interfaces.
    pub fn cali_links(&self) -> Vec<String> {
        self.ip(&["-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_owned())
            .filter(|n| n.starts_with("cali"))
            .collect()
    }

    /// `bgpctl ipam show --json`: (pool, used) per pool.
    pub fn ipam_used(&self) -> u64 {
        let out = bgpctl(&self.daemon.socket, &["ipam", "show", "--json"]);
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["pools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["used"].as_u64().unwrap())
            .sum()
    }

    /// `bgpctl ipam check` passes.
    pub fn ipam_consistent(&self) {
        let out = bgpctl(&self.daemon.socket, &["ipam", "check", "--json"]);
        assert!(
            out.status.success(),
            "ipam check: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The addresses held by an IPAM handle (empty if none).
    pub fn handle_addresses(&self, handle: &str) -> Vec<String> {
        let rt = interop_tests::lab::bgpd::runtime();
        rt.block_on(async {
            let ch = proto::client::connect_unix(&self.daemon.socket)
                .await
                .unwrap();
            match proto::v1::ipam_client::IpamClient::new(ch)
                .get_handle(proto::v1::GetHandleRequest {
                    handle: handle.to_owned(),
                })
                .await
            {
                Ok(r) => r
                    .into_inner()
                    .allocations
                    .into_iter()
                    .map(|a| a.address)
                    .collect(),
                Err(s) if s.code() == tonic::Code::NotFound => Vec::new(),
                Err(s) => panic!("GetHandle {handle}: {s}"),
            }
        })
    }

    /// The attributes of a handle's first allocation.
    pub fn handle_attributes(&self, handle: &str) -> std::collections::HashMap<String, String> {
        let rt = interop_tests::lab::bgpd::runtime();
        rt.block_on(async {
            let ch = proto::client::connect_unix(&self.daemon.socket)
                .await
                .unwrap();
            proto::v1::ipam_client::IpamClient::new(ch)
                .get_handle(proto::v1::GetHandleRequest {
                    handle: handle.to_owned(),
                })
                .await
                .unwrap()
                .into_inner()
                .allocations
                .remove(0)
                .attributes
        })
    }
}

/// One plugin invocation: the CNI environment and stdin.
#[derive(Clone, Debug)]
pub struct Call {
    pub vars: Vec<(String, String)>,
    pub stdin: Vec<u8>,
}

impl Call {
    /// CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS (when given), CNI_IFNAME=eth0, CNI_PATH with our
    /// build directory and the reference plugins.
    pub fn new(command: &str, container_id: &str, netns: Option<&Path>, conf: &Value) -> Call {
        let mut vars = vec![
            ("CNI_COMMAND".to_owned(), command.to_owned()),
            ("CNI_CONTAINERID".to_owned(), container_id.to_owned()),
            ("CNI_IFNAME".to_owned(), "eth0".to_owned()),
            ("CNI_PATH".to_owned(), cni_path()),
        ];
        if let Some(p) = netns {
            vars.push(("CNI_NETNS".to_owned(), p.display().to_string()));
        }
        Call {
            vars,
            stdin: conf.to_string().into_bytes(),
        }
    }

    pub fn set(mut self, key: &str, value: &str) -> Call {
        self.vars.retain(|(k, _)| k != key);
        self.vars.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn unset(mut self, key: &str) -> Call {
        self.vars.retain(|(k, _)| k != key);
        self
    }

    pub fn stdin(mut self, bytes: &[u8]) -> Call {
        self.stdin = bytes.to_vec();
        self
    }

    /// The process, started in `ns` (setns before exec: no `ip netns exec` in the way), with
    /// only PATH and the CNI variables in its environment.
    pub fn command(&self, plugin: &Path, ns: &Netns) -> Command {
        let target = File::open(ns.path()).expect("the node namespace");
        let mut c = Command::new(plugin);
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let fd = target.as_raw_fd();
        // SAFETY: only setns (async-signal-safe) runs between fork and exec; `target` lives
        // until the command is spawned and dropped with it.
        unsafe {
            c.pre_exec(move || {
                let _keep = &target;
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        StdinCommand {
            command: c,
            stdin: self.stdin.clone(),
        }
        .into_command()
    }
}

/// A Command that writes `stdin` once started (through a thread, so a large stdin cannot
/// deadlock against a full stdout pipe).
struct StdinCommand {
    command: Command,
    stdin: Vec<u8>,
}

impl StdinCommand {
    fn into_command(mut self) -> Command {
        // The bytes go through a pipe made here; the child reads them from its stdin.
        let (reader, mut writer) = std::io::pipe().expect("a pipe");
        let bytes = std::mem::take(&mut self.stdin);
        std::thread::spawn(move || {
            let _ = writer.write_all(&bytes);
        });
        self.command.stdin(Stdio::from(reader));
        self.command
    }
}

/// What an invocation printed and how it ended.
#[derive(Debug)]
pub struct Outcome {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Outcome {
    fn from(o: Output) -> Self {
        Outcome {
            status: o.status,
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Outcome {
    /// The result of a successful ADD (panics with everything printed otherwise).
    pub fn result(&self) -> Value {
        assert!(self.status.success(), "plugin failed: {self:#?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:#?}"))
    }

    /// A successful command without output.
    pub fn ok(&self) {
        assert!(self.status.success(), "plugin failed: {self:#?}");
        assert!(
            self.stdout.trim().is_empty(),
            "unexpected output: {self:#?}"
        );
    }

    /// The CNI error code of a failed invocation; checks the error object's shape.
    pub fn error_code(&self) -> u64 {
        assert!(!self.status.success(), "plugin succeeded: {self:#?}");
        assert_eq!(self.status.code(), Some(1), "exit status: {self:#?}");
        let v: Value = serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("the error is not JSON ({e}): {self:#?}"));
        assert!(v["cniVersion"].is_string(), "{v}");
        assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        v["code"].as_u64().unwrap_or_else(|| panic!("no code: {v}"))
    }

    pub fn message(&self) -> String {
        let v: Value = serde_json::from_str(&self.stdout).unwrap_or(Value::Null);
        format!(
            "{} {}",
            v["msg"].as_str().unwrap_or(""),
            v["details"].as_str().unwrap_or("")
        )
    }
}

/// Our build directory and the reference plugins.
pub fn cni_path() -> String {
    format!(
        "{}:{REFERENCE_PLUGINS}",
        margay().parent().unwrap().display()
    )
}

pub fn margay() -> PathBuf {
    interop_tests::lab::binary("margay")
}

pub fn margay_ipam() -> PathBuf {
    interop_tests::lab::binary("margay-ipam")
}

pub fn reference(plugin: &str) -> PathBuf {
    let p = Path::new(REFERENCE_PLUGINS).join(plugin);
    assert!(
        p.exists(),
        "{} is missing: install Debian's containernetworking-plugins",
        p.display()
    );
    p
}

/// The host-side interface name Calico gives `key` (`<namespace>.<pod>` or the container id).
pub fn cali_name(key: &str) -> String {
    let digest: String = proto::mac::sha1(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("cali{}", &digest[..11])
}

/// A result's first address without its prefix.
pub fn first_ip(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned()
}

/// The configuration with prevResult set (for CHECK, DEL and chained plugins).
pub fn with_prev(conf: &Value, prev: &Value) -> Value {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c
}

/// Pings `ip` from `ns`: one answer within 4 s, a probe a second. (The reference plugins'
/// IPv6 addresses go through duplicate address detection, which takes a second or two after
/// their ADD: until then the kernel does not answer for them.)
pub fn ping(ns: &Netns, ip: &str) -> bool {
    let mut args = vec!["-c1", "-w4", "-q"];
    if ip.contains(':') {
        args.insert(0, "-6");
    }
    args.push(ip);
    ns.exec("ping", &args).is_ok()
}
