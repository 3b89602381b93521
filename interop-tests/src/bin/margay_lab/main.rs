//! `margay-lab`: a local margay cluster in network namespaces, on one machine, as root.
//!
//! Why this file is long: the lab's whole life (up, check, status, down, soak) over one
//! topology; its steps share the topology's names.
//!
//! `soak --minutes N [--seed S]` (SQLite lab; brings it up if needed, leaves it up): one
//! `ping -D -O -i 0.1 -W 1` per ordered pair of pods and family, in the source pod's namespace,
//! while faults drawn from the seed (`interop_tests::lab::soak`) hit the cluster one at a
//! time: kill -9 of bgpd / routewriter / both with a restart, SIGHUP of bgpd, the pools'
//! vxlanMode flipped, a pod created and deleted, a node's eth0 down, 20% loss on the router
//! (netem; reported unavailable when the kernel lacks it). After each fault the ping matrix
//! must be green within 10 s; at the end `bgpctl ipam check`, a leak check (`ipam gc
//! --dry-run` against the live pods), each node's proto-80 routes against its Dataplane
//! snapshot, and RSS growth; one table, non-zero exit when a check fails.
//!
//! `up` builds nothing itself (scripts/up builds first) and brings up: three nodes on one L2
//! segment and a fourth in another subnet behind a router namespace, dual stack (every node
//! and router leg has an IPv4 and an IPv6 address); on each node bgpd and routewriter, all
//! sharing one embedded SQLite datastore; the default pools 172.20.0.0/16 (/26 blocks) and
//! fd00:20::/48 (/122 blocks), both vxlanMode CrossSubnet and natOutgoing; two pods per node
//! created through the real CNI protocol (the `margay` plugin run with the CNI environment and
//! stdin), each with one address of each family. It prints a node's status, blocks and
//! kernel routes of both families, and two ping matrices of every pod to every pod (`ping`
//! and `ping -6`), and exits non-zero unless every pair answers in both. `check` re-runs the matrix; `status` shows what
//! is up; `down` removes every namespace and process it created. `up` twice is safe.
//!
//! `up --etcd` puts the cluster's state in a real etcd (Debian's etcd-server) instead of the
//! SQLite file: one member in the router namespace, listening on the router's leg in the first
//! segment (10.99.1.1:2379, which every node reaches directly or through its gateway), with
//! its data under the lab's state directory. It is recorded like the daemons, so `down` stops
//! it by PID and removes its data with the rest; `status` names the datastore in use.
//!
//! Everything it makes is named `mlab-*` (namespaces) or lives in /run/margay-lab (configs,
//! pid files, logs, the datastore file). `MARGAY_LAB_NAME=x` makes that `x-*` and
//! /run/margay-lab-x, so tests run a lab of their own beside a user's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use interop_tests::lab::soak;

const NETWORK: &str = "k8s-pod-network";

/// Where the lab's etcd listens for clients: the router's address on the first segment, so
/// nodes of both segments reach it without leaving the lab's namespaces.
const ETCD_HOST: &str = "10.99.1.1";
const ETCD_PORT: u16 = 2379;

/// The lab's name: the prefix of its namespaces and the suffix of its state directory.
fn lab_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| std::env::var("MARGAY_LAB_NAME").unwrap_or_else(|_| "mlab".into()))
}

fn prefix() -> String {
    format!("{}-", lab_name())
}

fn state() -> PathBuf {
    match lab_name() {
        "mlab" => PathBuf::from("/run/margay-lab"),
        other => PathBuf::from(format!("/run/margay-lab-{other}")),
    }
}

#[derive(Parser)]
#[command(about = "A local margay cluster in network namespaces")]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Bring the cluster up (or show it, when it is up already).
    Up {
        /// Keep the cluster's state in a real etcd (in the router namespace) instead of the
        /// shared SQLite file.
        #[arg(long)]
        etcd: bool,
    },
    /// Ping every pod from every pod.
    Check,
    /// What is up.
    Status,
    /// Remove every namespace and process of the lab.
    Down,
    /// Create a pod on a node through CNI ADD; prints its address.
    PodAdd { node: String, pod: String },
    /// Delete a pod through CNI DEL.
    PodDel { node: String, pod: String },
    /// Restart a node's bgpd or routewriter (SIGTERM, then start again).
    Restart { node: String, daemon: String },
    /// Stop a node's daemons and remove it from the cluster (Nodes.DeleteNode).
    NodeDel { node: String },
    /// Ping every pod from every pod at 10/s while injecting faults drawn from a seed; then
    /// check IPAM, kernel routes, recovery and memory, and print the table (SQLite lab).
    Soak {
        /// How long to inject faults.
        #[arg(long, default_value_t = 2.0)]
        minutes: f64,
        /// The schedule's seed [default: from the clock; printed either way].
        #[arg(long)]
        seed: Option<u64>,
    },
}

/// One node: its name, namespace, segment, addresses and gateways of both families.
struct NodeSpec {
    name: &'static str,
    segment: &'static str,
    address: &'static str,
    gateway: &'static str,
    address6: &'static str,
    gateway6: &'static str,
}

const NODES: [NodeSpec; 4] = [
    NodeSpec {
        name: "node-1",
        segment: "seg1",
        address: "10.99.1.11/24",
        gateway: "10.99.1.1",
        address6: "fd00:99:1::11/64",
        gateway6: "fd00:99:1::1",
    },
    NodeSpec {
        name: "node-2",
        segment: "seg1",
        address: "10.99.1.12/24",
        gateway: "10.99.1.1",
        address6: "fd00:99:1::12/64",
        gateway6: "fd00:99:1::1",
    },
    NodeSpec {
        name: "node-3",
        segment: "seg1",
        address: "10.99.1.13/24",
        gateway: "10.99.1.1",
        address6: "fd00:99:1::13/64",
        gateway6: "fd00:99:1::1",
    },
    NodeSpec {
        name: "node-4",
        segment: "seg2",
        address: "10.99.2.14/24",
        gateway: "10.99.2.1",
        address6: "fd00:99:2::14/64",
        gateway6: "fd00:99:2::1",
    },
];
const PODS_PER_NODE: [&str; 2] = ["a", "b"];

fn ns(name: &str) -> String {
    format!("{}{name}", prefix())
}

fn pod_ns(node: &str, pod: &str) -> String {
    format!("{}{node}-{pod}", prefix())
}

/// Runs a command; its stdout, or an error naming it with its stderr.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<String, String> {
    run(Command::new("ip").args(args))
}

fn in_ns(name: &str, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["netns", "exec", name];
    all.extend_from_slice(args);
    ip(&all)
}

/// Workspace binaries sit next to this one.
fn bin(name: &str) -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    me.parent()
        .map(|d| d.join(name))
        .unwrap_or_else(|| PathBuf::from(name))
}

fn lab_namespaces() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix()))
        .map(str::to_owned)
        .collect()
}

fn pids() -> Vec<(String, i32)> {
    let Ok(dir) = std::fs::read_dir(state().join("pids")) else {
        return vec![];
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid = std::fs::read_to_string(e.path())
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), pid))
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn down() -> Result<(), String> {
    let procs = pids();
    for (_, pid) in &procs {
        // SAFETY: plain kill(2) of a pid this lab recorded.
        unsafe { libc::kill(*pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while procs.iter().any(|(_, p)| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (_, pid) in &procs {
        if alive(*pid) {
            // SAFETY: as above.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
    }
    for n in lab_namespaces() {
        // Processes someone started inside by hand would keep the namespace busy.
        if let Ok(out) = ip(&["netns", "pids", &n]) {
            for pid in out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: a process inside one of the lab's namespaces.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        ip(&["netns", "del", &n])?;
    }
    let _ = std::fs::remove_dir_all(state());
    println!("margay-lab: down");
    Ok(())
}

fn topology() -> Result<(), String> {
    for seg in ["seg1", "seg2"] {
        ip(&["netns", "add", &ns(seg)])?;
        in_ns(&ns(seg), &["ip", "link", "add", "br0", "type", "bridge"])?;
        in_ns(&ns(seg), &["ip", "link", "set", "br0", "up"])?;
    }
    // The router: a leg in each segment, forwarding between them.
    let router = ns("router");
    ip(&["netns", "add", &router])?;
    in_ns(
        &router,
        &[
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward && echo 1 > /proc/sys/net/ipv6/conf/all/forwarding",
        ],
    )?;
    for (seg, addr, addr6) in [
        ("seg1", "10.99.1.1/24", "fd00:99:1::1/64"),
        ("seg2", "10.99.2.1/24", "fd00:99:2::1/64"),
    ] {
        attach(&router, &format!("r-{seg}"), seg, addr, addr6)?;
    }
    // "The internet": a host outside the cluster behind the router, which knows nothing of
    // pod addresses (natOutgoing must hide them).
    let outside = ns("internet");
    ip(&["netns", "add", &outside])?;
    in_ns(&outside, &["ip", "link", "set", "lo", "up"])?;
    in_ns(
        &router,
        &[
            "ip", "link", "add", "r-inet", "type", "veth", "peer", "name", "eth0", "netns",
            &outside,
        ],
    )?;
    for (inside, dev, addr) in [
        (&router, "r-inet", "203.0.113.1/24"),
        (&router, "r-inet", "2001:db8:113::1/64"),
        (&outside, "eth0", "203.0.113.10/24"),
        (&outside, "eth0", "2001:db8:113::10/64"),
    ] {
        in_ns(inside, &["ip", "addr", "add", addr, "dev", dev, "nodad"])?;
    }
    in_ns(&router, &["ip", "link", "set", "r-inet", "up"])?;
    in_ns(&outside, &["ip", "link", "set", "eth0", "up"])?;
    in_ns(
        &outside,
        &["ip", "route", "add", "10.99.0.0/16", "via", "203.0.113.1"],
    )?;
    in_ns(
        &outside,
        &[
            "ip",
            "route",
            "add",
            "fd00:99::/32",
            "via",
            "2001:db8:113::1",
        ],
    )?;
    for n in &NODES {
        let node = ns(n.name);
        ip(&["netns", "add", &node])?;
        in_ns(&node, &["ip", "link", "set", "lo", "up"])?;
        attach(&node, "eth0", n.segment, n.address, n.address6)?;
        in_ns(&node, &["ip", "route", "add", "default", "via", n.gateway])?;
        in_ns(
            &node,
            &["ip", "-6", "route", "add", "default", "via", n.gateway6],
        )?;
    }
    Ok(())
}

/// A veth from `inside` (named `dev`, with `addr` and `addr6`) to segment `seg`'s bridge.
fn attach(inside: &str, dev: &str, seg: &str, addr: &str, addr6: &str) -> Result<(), String> {
    let port = format!("p{}", &inside[prefix().len()..].replace('-', ""))
        .chars()
        .take(15)
        .collect::<String>();
    let port = if dev.starts_with("r-") {
        format!("r{seg}")
    } else {
        port
    };
    in_ns(
        &ns(seg),
        &[
            "ip", "link", "add", &port, "type", "veth", "peer", "name", dev, "netns", inside,
        ],
    )?;
    in_ns(
        &ns(seg),
        &["ip", "link", "set", &port, "master", "br0", "up"],
    )?;
    in_ns(inside, &["ip", "addr", "add", addr, "dev", dev])?;
    // No duplicate address detection: the lab's addresses are its own, and waiting for DAD
    // would only delay the first IPv6 sessions.
    in_ns(inside, &["ip", "addr", "add", addr6, "dev", dev, "nodad"])?;
    in_ns(inside, &["ip", "link", "set", dev, "up"])?;
    Ok(())
}

fn node_dir(node: &str) -> PathBuf {
    state().join(node)
}

fn socket(node: &str) -> PathBuf {
    node_dir(node).join("bgpd.sock")
}

/// Where the cluster keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Datastore {
    Sqlite,
    Etcd,
}

impl Datastore {
    /// The `[datastore]` section of a node's configuration.
    fn config_section(self) -> String {
        match self {
            Datastore::Sqlite => format!(
                "[datastore]\nkind = \"sqlite\"\npath = \"{}\"\n",
                state().join("store.db").display()
            ),
            Datastore::Etcd => format!(
                "[datastore]\nkind = \"etcd\"\nendpoints = [\"{}\"]\n",
                etcd_url()
            ),
        }
    }

    /// One line for `status` and `up`.
    fn describe(self) -> String {
        match self {
            Datastore::Sqlite => format!("sqlite {}", state().join("store.db").display()),
            Datastore::Etcd => format!(
                "etcd {} (in {}, data in {})",
                etcd_url(),
                ns("router"),
                etcd_dir().display()
            ),
        }
    }

    /// What `up` recorded, for `status`; `None` when the lab is not up.
    fn recorded() -> Option<Datastore> {
        match std::fs::read_to_string(state().join("datastore"))
            .ok()?
            .trim()
        {
            "etcd" => Some(Datastore::Etcd),
            "sqlite" => Some(Datastore::Sqlite),
            _ => None,
        }
    }

    fn record(self) -> Result<(), String> {
        let name = match self {
            Datastore::Sqlite => "sqlite",
            Datastore::Etcd => "etcd",
        };
        std::fs::write(state().join("datastore"), name).map_err(|e| e.to_string())
    }
}

fn etcd_url() -> String {
    format!("http://{ETCD_HOST}:{ETCD_PORT}")
}

fn etcd_dir() -> PathBuf {
    state().join("etcd")
}

/// Starts the lab's etcd in the router namespace and waits until it accepts connections.
fn start_etcd() -> Result<(), String> {
    let etcd = Path::new(interop_tests::lab::etcd::ETCD);
    if !etcd.exists() {
        return Err(format!(
            "{} is missing: apt-get install etcd-server (scripts/up installs it)",
            etcd.display()
        ));
    }
    // Connections to the router's own address (etcd's to itself, our probe's) go through lo.
    in_ns(&ns("router"), &["ip", "link", "set", "lo", "up"])?;
    let data = etcd_dir().join("data");
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    let mut cmd = detached("router", etcd);
    // A lone member talks to no peer, but etcd wants a peer URL; it stays beside the client one.
    let peer = format!("http://{ETCD_HOST}:2380");
    interop_tests::lab::etcd::member_args(&mut cmd, "lab", &data, &etcd_url(), &peer);
    cmd.args(["--initial-cluster", &format!("lab={peer}")]);
    launch(cmd, &etcd_dir().join("etcd.log"), "router-etcd")?;
    let probe = format!("exec 3<>/dev/tcp/{ETCD_HOST}/{ETCD_PORT}");
    wait_for("etcd to listen", Duration::from_secs(20), || {
        in_ns(&ns("router"), &["timeout", "1", "bash", "-c", &probe]).is_ok()
    })
    .map_err(|e| {
        let log = std::fs::read_to_string(etcd_dir().join("etcd.log")).unwrap_or_default();
        format!("{e}\netcd's log:\n{log}")
    })
}

fn write_config(n: &NodeSpec, datastore: Datastore) -> Result<PathBuf, String> {
    let dir = node_dir(n.name);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let config = dir.join("node.toml");
    let text = format!(
        "[node]\nname = \"{name}\"\naddress = \"{addr}\"\naddress6 = \"{addr6}\"\n\
         [api]\nsocket = \"{sock}\"\n\
         {store}\
         [[ipam.default_pools]]\nname = \"default-ipv4-ippool\"\ncidr = \"172.20.0.0/16\"\nblock_size = 26\n\
         vxlan_mode = \"CrossSubnet\"\nnat_outgoing = true\n\
         [[ipam.default_pools]]\nname = \"default-ipv6-ippool\"\ncidr = \"fd00:20::/48\"\nblock_size = 122\n\
         vxlan_mode = \"CrossSubnet\"\nnat_outgoing = true\n\
         [log]\nlevel = \"info\"\n\
         [routewriter]\nsocket = \"{sock}\"\nuplink = \"eth0\"\n",
        name = n.name,
        addr = n.address,
        addr6 = n.address6,
        sock = socket(n.name).display(),
        store = datastore.config_section(),
    );
    std::fs::write(&config, text).map_err(|e| e.to_string())?;
    Ok(config)
}

/// Starts `program` (one of the workspace's binaries) inside the node's namespace, detached,
/// logging to the node's directory.
fn start(node: &str, program: &str, args: &[&str]) -> Result<i32, String> {
    let mut cmd = detached(node, &bin(program));
    cmd.args(args);
    launch(
        cmd,
        &node_dir(node).join(format!("{program}.log")),
        &format!("{node}-{program}"),
    )
}

/// `program` run inside the lab namespace `short` in a session of its own, so the lab's
/// daemons outlive this command and a Ctrl-C of it. `setsid` and `ip netns exec` both exec,
/// so the PID of the spawned command is the program's own.
fn detached(short: &str, program: &Path) -> Command {
    let mut cmd = Command::new("setsid");
    cmd.args(["ip", "netns", "exec", &ns(short)]).arg(program);
    cmd
}

/// Spawns `cmd` with its output in `log` and records its PID as `key`, for `down`.
fn launch(mut cmd: Command, log: &Path, key: &str) -> Result<i32, String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting {key}: {e}"))?;
    let pid = child.id() as i32;
    let pids = state().join("pids");
    std::fs::create_dir_all(&pids).map_err(|e| e.to_string())?;
    std::fs::write(pids.join(key), pid.to_string()).map_err(|e| e.to_string())?;
    Ok(pid)
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Result<(), String> {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > limit {
            return Err(format!("not within {limit:?}: {what}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn bgpctl(node: &str, args: &[&str]) -> Result<String, String> {
    run(Command::new(bin("bgpctl"))
        .arg("--socket")
        .arg(socket(node))
        .args(args))
}

/// A pod made through the CNI protocol: its namespace, node and address.
#[derive(Clone)]
struct Pod {
    name: String,
    ns: String,
    node: String,
    address: String,
    address6: String,
}

/// Runs the margay CNI plugin in the node's namespace for `command` on `pod`.
fn cni(command: &str, node: &str, pod: &str) -> Result<String, String> {
    let pns = pod_ns(node, pod);
    let sock = socket(node);
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "margay",
        "socket": sock,
        "ipam": {
            "type": "margay-ipam",
            "socket": sock,
            "assign_ipv4": "true",
            "assign_ipv6": "true",
        },
    });
    let pod_name = format!("{node}-{pod}");
    let cni_path = bin("margay")
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns(node)])
        .arg(bin("margay"))
        .env("CNI_COMMAND", command)
        .env(
            "CNI_CONTAINERID",
            format!("lab{}", pod_name.replace('-', "")),
        )
        .env("CNI_NETNS", format!("/var/run/netns/{pns}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_path)
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod_name}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running the margay CNI plugin: {e}"))?;
    use std::io::Write;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(conf.to_string().as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "CNI {command} of {pod_name} failed: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

fn cni_add(node: &str, pod: &str) -> Result<Pod, String> {
    let pns = pod_ns(node, pod);
    ip(&["netns", "add", &pns])?;
    in_ns(&pns, &["ip", "link", "set", "lo", "up"])?;
    let pod_name = format!("{node}-{pod}");
    let text = cni("ADD", node, pod)?;
    let result: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("CNI result of {pod_name}: {e}: {text}"))?;
    let addresses: Vec<String> = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str()?.split('/').next().map(str::to_owned))
        .collect();
    let of_family = |v6: bool| {
        addresses
            .iter()
            .find(|a| a.contains(':') == v6)
            .cloned()
            .ok_or_else(|| {
                format!(
                    "no IPv{} address in the CNI result of {pod_name}: {text}",
                    if v6 { 6 } else { 4 }
                )
            })
    };
    Ok(Pod {
        address: of_family(false)?,
        address6: of_family(true)?,
        name: pod_name,
        ns: pns,
        node: node.into(),
    })
}

fn cni_del(node: &str, pod: &str) -> Result<(), String> {
    cni("DEL", node, pod)?;
    ip(&["netns", "del", &pod_ns(node, pod)])?;
    Ok(())
}

fn pod_add(node: &str, pod: &str) -> Result<bool, String> {
    let p = cni_add(node, pod)?;
    println!("{} {}", p.name, p.address);
    let mut pods = load_pods();
    pods.push(p);
    save_pods(&pods)?;
    Ok(true)
}

fn pod_del(node: &str, pod: &str) -> Result<bool, String> {
    cni_del(node, pod)?;
    let name = format!("{node}-{pod}");
    let pods: Vec<Pod> = load_pods().into_iter().filter(|p| p.name != name).collect();
    save_pods(&pods)?;
    println!("{name} deleted");
    Ok(true)
}

fn stop(node: &str, daemon: &str) -> Result<(), String> {
    let file = state().join("pids").join(format!("{node}-{daemon}"));
    let pid: i32 = std::fs::read_to_string(&file)
        .map_err(|_| format!("no {daemon} recorded on {node}"))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", file.display()))?;
    // SAFETY: kill(2) of a pid this lab recorded.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    wait_for(
        &format!("{daemon} on {node} to stop"),
        Duration::from_secs(10),
        || !alive(pid),
    )?;
    let _ = std::fs::remove_file(file);
    Ok(())
}

fn restart(node: &str, daemon: &str) -> Result<bool, String> {
    if !["bgpd", "routewriter"].contains(&daemon) {
        return Err(format!("{daemon}: only bgpd and routewriter restart"));
    }
    stop(node, daemon)?;
    let config = node_dir(node).join("node.toml");
    start(node, daemon, &["--config", &config.display().to_string()])?;
    if daemon == "bgpd" {
        wait_for(&format!("bgpd on {node}"), Duration::from_secs(30), || {
            bgpctl(node, &["status"]).is_ok()
        })?;
    }
    println!("{daemon} on {node} restarted");
    Ok(true)
}

/// Removes a node the way an operator would: its daemons stop, its pods go, and it is
/// deleted from the cluster (releasing its blocks) through another node's bgpd.
fn node_del(node: &str) -> Result<bool, String> {
    let other = NODES
        .iter()
        .map(|n| n.name)
        .find(|n| *n != node)
        .ok_or("no other node")?;
    let pods = load_pods();
    for p in pods.iter().filter(|p| p.node == node) {
        let _ = ip(&["netns", "del", &p.ns]);
    }
    save_pods(
        &pods
            .into_iter()
            .filter(|p| p.node != node)
            .collect::<Vec<_>>(),
    )?;
    stop(node, "routewriter")?;
    stop(node, "bgpd")?;
    grpc_delete_node(other, node)?;
    let _ = ip(&["netns", "del", &ns(node)]);
    println!("{node} removed");
    Ok(true)
}

fn grpc_delete_node(via: &str, node: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let ch = proto::client::connect_unix(&socket(via))
            .await
            .map_err(|e| e.to_string())?;
        proto::v1::nodes_client::NodesClient::new(ch)
            .delete_node(proto::v1::DeleteNodeRequest { name: node.into() })
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    })
}

fn save_pods(pods: &[Pod]) -> Result<(), String> {
    let v: Vec<serde_json::Value> = pods
        .iter()
        .map(|p| serde_json::json!({"name": p.name, "ns": p.ns, "node": p.node, "address": p.address, "address6": p.address6}))
        .collect();
    std::fs::write(
        state().join("pods.json"),
        serde_json::Value::Array(v).to_string(),
    )
    .map_err(|e| e.to_string())
}

fn load_pods() -> Vec<Pod> {
    let Ok(text) = std::fs::read_to_string(state().join("pods.json")) else {
        return vec![];
    };
    let v: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    v.iter()
        .filter_map(|p| {
            Some(Pod {
                name: p["name"].as_str()?.into(),
                ns: p["ns"].as_str()?.into(),
                node: p["node"].as_str()?.into(),
                address: p["address"].as_str()?.into(),
                address6: p["address6"].as_str().unwrap_or_default().into(),
            })
        })
        .collect()
}

/// Every pod pings every other pod once at its address of one family (`ping` or `ping -6`);
/// the matrix and whether all answered.
fn matrix(pods: &[Pod], v6: bool) -> (String, bool) {
    let results: BTreeMap<(usize, usize), bool> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .flat_map(|(i, from)| {
                pods.iter()
                    .enumerate()
                    .filter(move |(j, _)| *j != i)
                    .map(move |(j, to)| (i, j, from, to))
            })
            .map(|(i, j, from, to)| {
                s.spawn(move || {
                    let (flag, to) = if v6 {
                        ("-6", &to.address6)
                    } else {
                        ("-4", &to.address)
                    };
                    let ok =
                        in_ns(&from.ns, &["ping", flag, "-c", "1", "-W", "1", "-q", to]).is_ok();
                    ((i, j), ok)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(((0, 0), false)))
            .collect()
    });
    let width = pods.iter().map(|p| p.name.len()).max().unwrap_or(6).max(6);
    let mut out = format!("{:<width$}", "from\\to");
    for p in pods {
        out.push_str(&format!("  {:<width$}", p.name));
    }
    out.push('\n');
    for (i, from) in pods.iter().enumerate() {
        out.push_str(&format!("{:<width$}", from.name));
        for j in 0..pods.len() {
            let cell = if i == j {
                "-"
            } else if results[&(i, j)] {
                "ok"
            } else {
                "FAIL"
            };
            out.push_str(&format!("  {cell:<width$}"));
        }
        out.push('\n');
    }
    (out, results.values().all(|&ok| ok))
}

fn is_up() -> bool {
    let procs = pids();
    !procs.is_empty() && procs.iter().all(|(_, p)| alive(*p)) && !load_pods().is_empty()
}

fn up(datastore: Datastore) -> Result<bool, String> {
    if is_up() {
        println!("margay-lab: already up");
        if let Some(running) = Datastore::recorded()
            && running != datastore
        {
            println!(
                "margay-lab: it runs on {}; run `margay-lab down` first to switch",
                running.describe()
            );
        }
        status()?;
        return check(Duration::from_secs(10));
    }
    if !lab_namespaces().is_empty() || state().exists() {
        println!("margay-lab: cleaning up a previous, incomplete lab");
        down()?;
    }
    for b in ["bgpd", "bgpctl", "routewriter", "margay", "margay-ipam"] {
        if !bin(b).exists() {
            return Err(format!(
                "{} is not built: run scripts/up (it builds first)",
                bin(b).display()
            ));
        }
    }
    std::fs::create_dir_all(state()).map_err(|e| e.to_string())?;
    println!(
        "margay-lab: topology (3 nodes on 10.99.1.0/24 and fd00:99:1::/64, node-4 on 10.99.2.0/24 and fd00:99:2::/64 behind a router)"
    );
    topology()?;
    datastore.record()?;
    if datastore == Datastore::Etcd {
        println!("margay-lab: etcd at {}", etcd_url());
        start_etcd()?;
    }
    for n in &NODES {
        let config = write_config(n, datastore)?;
        start(n.name, "bgpd", &["--config", &config.display().to_string()])?;
    }
    for n in &NODES {
        wait_for(
            &format!("bgpd on {} and its datastore", n.name),
            Duration::from_secs(30),
            || datastore_connected(n.name),
        )?;
    }
    for n in &NODES {
        let config = node_dir(n.name).join("node.toml");
        start(
            n.name,
            "routewriter",
            &["--config", &config.display().to_string()],
        )?;
    }
    println!(
        "margay-lab: bgpd and routewriter up on {} nodes; creating pods through CNI",
        NODES.len()
    );
    let mut pods = Vec::new();
    for n in &NODES {
        for p in PODS_PER_NODE {
            pods.push(cni_add(n.name, p)?);
        }
    }
    save_pods(&pods)?;
    println!();
    println!("== bgpctl status (node-1)");
    print!("{}", bgpctl("node-1", &["status"])?);
    println!("\n== bgpctl ipam show --show-blocks (node-1)");
    print!("{}", bgpctl("node-1", &["ipam", "show", "--show-blocks"])?);
    // The mesh comes up within a few connect retries; show it up (or as it is after 15 s).
    let mesh_up = || {
        bgpctl("node-1", &["show", "protocols", "--json"])
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.as_array().cloned())
            .is_some_and(|a| {
                // One session per family with every other node.
                a.len() == 2 * (NODES.len() - 1) && a.iter().all(|p| p["state"] == "Established")
            })
    };
    if let Err(e) = wait_for(
        "the node-to-node mesh of node-1",
        Duration::from_secs(15),
        mesh_up,
    ) {
        println!("margay-lab: {e}");
    }
    println!("\n== bgpctl show protocols (node-1)");
    print!("{}", bgpctl("node-1", &["show", "protocols"])?);
    println!("\n== kernel routes of node-1 (ip route)");
    print!("{}", in_ns(&ns("node-1"), &["ip", "route"])?);
    println!("\n== kernel routes of node-1 (ip -6 route)");
    print!("{}", in_ns(&ns("node-1"), &["ip", "-6", "route"])?);
    println!();
    check(Duration::from_secs(30))
}

/// The ping matrix, retried until every pair answers or `settle` passes.
fn check(settle: Duration) -> Result<bool, String> {
    let pods = load_pods();
    if pods.is_empty() {
        return Err("the lab is not up: run margay-lab up".into());
    }
    let start = Instant::now();
    let mut every = true;
    for (v6, what) in [(false, "ping"), (true, "ping -6")] {
        loop {
            let (table, all) = matrix(&pods, v6);
            if all || start.elapsed() > settle {
                println!("== {what} matrix ({} pods)", pods.len());
                print!("{table}");
                println!(
                    "{}",
                    if all {
                        format!("every pod answers every pod ({what})")
                    } else {
                        format!("some pairs do not answer ({what})")
                    }
                );
                every &= all;
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    Ok(every)
}

/// bgpd on `node` answers and has its datastore open (with etcd it connects in the
/// background, and IPAM for the pods needs it).
fn datastore_connected(node: &str) -> bool {
    bgpctl(node, &["status", "--json"])
        .ok()
        .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
        .is_some_and(|v| v["datastore_state"] == "connected")
}

fn status() -> Result<(), String> {
    println!(
        "datastore: {}",
        Datastore::recorded().map_or_else(|| "none (the lab is not up)".into(), |d| d.describe())
    );
    let namespaces = lab_namespaces();
    println!(
        "namespaces: {}",
        if namespaces.is_empty() {
            "none".into()
        } else {
            namespaces.join(" ")
        }
    );
    for (name, pid) in pids() {
        println!(
            "{name:<24} pid {pid:<8} {}",
            if alive(pid) { "running" } else { "DEAD" }
        );
    }
    for p in load_pods() {
        println!(
            "pod {:<12} {:<16} {:<24} on {}",
            p.name, p.address, p.address6, p.node
        );
    }
    Ok(())
}

/// The soak's options (see `margay-lab soak --help`).
struct SoakArgs {
    minutes: f64,
    seed: u64,
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

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Gone, and reaped when it was our child (a daemon the soak restarted is; a zombie would
/// still answer kill(pid, 0)).
fn gone(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid(2) without blocking; for a pid that is not our child it fails (ECHILD).
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    !alive(pid)
}

fn recorded_pid(node: &str, daemon: &str) -> Result<i32, String> {
    let file = state().join("pids").join(format!("{node}-{daemon}"));
    std::fs::read_to_string(&file)
        .map_err(|_| format!("no {daemon} recorded on {node}"))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", file.display()))
}

fn kill9(node: &str, daemon: &str) -> Result<(), String> {
    let pid = recorded_pid(node, daemon)?;
    // SAFETY: kill(2) of a pid this lab recorded.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_for(
        &format!("{daemon} on {node} to die"),
        Duration::from_secs(5),
        || gone(pid),
    )?;
    let _ = std::fs::remove_file(state().join("pids").join(format!("{node}-{daemon}")));
    Ok(())
}

/// Starts a daemon again as `up` does; bgpd counts as started when its API answers.
fn start_again(node: &str, daemon: &str) -> Result<(), String> {
    let config = node_dir(node).join("node.toml");
    start(node, daemon, &["--config", &config.display().to_string()])?;
    if daemon == "bgpd" {
        wait_for(&format!("bgpd on {node}"), Duration::from_secs(30), || {
            bgpctl(node, &["status"]).is_ok()
        })?;
    }
    Ok(())
}

/// What injecting a fault came to.
enum Injected {
    Done(String),
    Unavailable(String),
}

/// Does one fault, from its first action to its last; what it did, for the log.
fn inject(f: &soak::Fault, node: &NodeSpec) -> Result<Injected, String> {
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
            // A `[bgp]` option outside `[[bgp.peers]]` that the lab's mesh does not use:
            // error_wait_time applies to configured peers (there are none) at once and to
            // cluster peers at the next start. Changed, reloaded, then restored and reloaded.
            let config = node_dir(n).join("node.toml");
            let original = std::fs::read_to_string(&config).map_err(|e| e.to_string())?;
            let pid = recorded_pid(n, "bgpd")?;
            let changed = format!("{original}[bgp]\nerror_wait_time = [5, 30]\n");
            for text in [&changed, &original] {
                std::fs::write(&config, text).map_err(|e| e.to_string())?;
                // SAFETY: kill(2) of a pid this lab recorded.
                unsafe { libc::kill(pid, libc::SIGHUP) };
                std::thread::sleep(Duration::from_secs(1));
                if !alive(pid) {
                    return Err(format!("bgpd on {n} died on SIGHUP"));
                }
            }
            bgpctl(n, &["status"]).map_err(|e| format!("bgpd on {n} after SIGHUP: {e}"))?;
            Ok(Injected::Done(format!(
                "on {n}, error_wait_time changed and back"
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
            let p = cni_add(n, "churn")?;
            cni_del(n, "churn")?;
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
            let router = ns("router");
            let legs = ["r-seg1", "r-seg2"];
            for (i, dev) in legs.iter().enumerate() {
                let add = in_ns(
                    &router,
                    &[
                        "tc", "qdisc", "add", "dev", dev, "root", "netem", "loss", "20%",
                    ],
                );
                if let Err(e) = add {
                    for done in &legs[..i] {
                        let _ = in_ns(&router, &["tc", "qdisc", "del", "dev", done, "root"]);
                    }
                    // Only tc's own words: the kernel may lack sch_netem, or tc be missing.
                    let why = e.rsplit_once("failed: ").map_or(e.as_str(), |(_, w)| w);
                    return Ok(Injected::Unavailable(format!(
                        "`tc qdisc add dev {dev} root netem loss 20%` in {router}: {why}"
                    )));
                }
            }
            std::thread::sleep(hold);
            for dev in legs {
                in_ns(&router, &["tc", "qdisc", "del", "dev", dev, "root"])?;
            }
            Ok(Injected::Done(format!(
                "20% loss on both router legs for {:.0} s",
                hold.as_secs_f64()
            )))
        }
    }
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
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

/// `margay-lab soak`: pingers, the fault schedule, the checks, the table.
fn run_soak(args: SoakArgs) -> Result<bool, String> {
    if !is_up() {
        println!("margay-lab: the lab is not up; bringing it up");
        if !up(Datastore::Sqlite)? {
            return Err("the lab came up without a full ping matrix: not soaking".into());
        }
    }
    if Datastore::recorded() == Some(Datastore::Etcd) {
        println!("margay-lab: note: this lab runs on etcd; the soak's faults are the SQLite set");
    }
    let pods = load_pods();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    println!(
        "margay-lab soak: seed {} ({:.1} min, {} pods, {} pingers at 10/s)",
        args.seed,
        args.minutes,
        pods.len(),
        pods.len() * (pods.len() - 1) * 2
    );
    let dir = state().join("soak");
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
    let plan = soak::schedule(args.seed, NODES.len(), total * 3);
    let mut report = soak::Report {
        seed: args.seed,
        minutes: args.minutes,
        ..Default::default()
    };
    let baseline_at = Duration::from_secs(60).min(total / 2);
    report.rss_baseline_at = baseline_at.as_secs_f64();
    let mut baseline: Option<Vec<(String, i32, u64)>> = None;
    let mut windows = Vec::new();
    let mut recoveries: Vec<(String, Option<Duration>)> = Vec::new();
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
        match inject(f, node)? {
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
    // Checks.
    let mut ipam_problems = Vec::new();
    for n in &NODES {
        if let Err(e) = bgpctl(n.name, &["ipam", "check"]) {
            ipam_problems.push(format!("{}: {e}", n.name));
        }
    }
    report.checks.push(soak::Check {
        name: "bgpctl ipam check clean on every node".into(),
        passed: ipam_problems.is_empty(),
        detail: if ipam_problems.is_empty() {
            format!("{} nodes", NODES.len())
        } else {
            ipam_problems.join("; ")
        },
    });
    // Leaks: every handle of the lab's network on a node must be one of its live pods.
    let mut leaked = Vec::new();
    for n in &NODES {
        let live: Vec<String> = pods
            .iter()
            .filter(|p| p.node == n.name)
            .map(pod_handle)
            .collect();
        let out = bgpctl(
            n.name,
            &[
                "ipam",
                "gc",
                "--node",
                n.name,
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
        for h in v["released"].as_array().into_iter().flatten() {
            leaked.push(format!("{}: {}", n.name, h["handle"]));
        }
    }
    report.checks.push(soak::Check {
        name: "no leaked address (every handle a live pod's)".into(),
        passed: leaked.is_empty(),
        detail: if leaked.is_empty() {
            format!("{} live pods", pods.len())
        } else {
            leaked.join("; ")
        },
    });
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
    report.checks.push(soak::Check {
        name: "kernel routes (proto 80) = desired on every node".into(),
        passed: drift.is_empty(),
        detail: if drift.is_empty() {
            format!("{} nodes, {compared} routes by prefix", NODES.len())
        } else {
            drift.join("; ")
        },
    });
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
    report.checks.push(soak::Check {
        name: "matrix green within 10 s of every fault".into(),
        passed: late.is_empty(),
        detail: if late.is_empty() {
            format!(
                "{} faults, slowest {:.1} s",
                recoveries.len(),
                worst.as_secs_f64()
            )
        } else {
            format!("late: {}", late.join(", "))
        },
    });
    println!(
        "margay-lab soak: pinger logs in {} (wall time {:.0} s)",
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    print!("{}", report.render());
    Ok(report.passed())
}

fn main() -> ExitCode {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("margay-lab: run as root (it creates network namespaces)");
        return ExitCode::FAILURE;
    }
    let result = match Args::parse().command {
        Cmd::Up { etcd } => up(if etcd {
            Datastore::Etcd
        } else {
            Datastore::Sqlite
        }),
        Cmd::Check => check(Duration::from_secs(5)),
        Cmd::Status => status().map(|_| true),
        Cmd::Down => down().map(|_| true),
        Cmd::PodAdd { node, pod } => pod_add(&node, &pod),
        Cmd::PodDel { node, pod } => pod_del(&node, &pod),
        Cmd::Restart { node, daemon } => restart(&node, &daemon),
        Cmd::NodeDel { node } => node_del(&node),
        Cmd::Soak { minutes, seed } => run_soak(SoakArgs {
            minutes,
            seed: seed.unwrap_or_else(|| unix_now() as u64),
        }),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("margay-lab: {e}");
            ExitCode::FAILURE
        }
    }
}
