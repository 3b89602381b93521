//! `margay-lab`: a local margay cluster in network namespaces, on one machine, as root.
//!
//! Why this file is long: the lab's whole life (up, check, status, down) over one topology;
//! its steps share the topology's names. The soak (`soak.rs`) and the etcd cluster
//! (`etcd.rs`) are modules of their own.
//!
//! `up` builds nothing itself (scripts/up builds first) and brings up: three nodes on one L2
//! segment and a fourth in another subnet behind a router namespace, dual stack (every node
//! and router leg has an IPv4 and an IPv6 address); on each node bgpd and routewriter, all
//! sharing one embedded SQLite datastore (on a 64 MiB tmpfs of its own, as a node's
//! /var/lib might be a small partition: the soak fills it); the default pools 172.20.0.0/16
//! (/26 blocks) and fd00:20::/48 (/122 blocks), both vxlanMode CrossSubnet and natOutgoing;
//! two pods per node created through the real CNI protocol (the `margay` plugin run with the
//! CNI environment and stdin), each with one address of each family. It prints a node's
//! status, blocks and kernel routes of both families, and two ping matrices of every pod to
//! every pod (`ping` and `ping -6`), and exits non-zero unless every pair answers in both.
//! `check` re-runs the matrix; `status` shows what is up; `down` removes every namespace,
//! process and mount it created. `up` twice is safe.
//!
//! `up --etcd` puts the cluster's state in a real etcd cluster of three members instead
//! (`etcd.rs`), each in a namespace of its own on the first segment, recorded like the
//! daemons, so `down` stops them by PID and removes their data with the rest; `status` names
//! the datastore in use.
//!
//! `up --kubernetes` puts it in the Kubernetes API instead (`kube.rs`): etcd 3.7 and the
//! kube-apiserver `scripts/build-kube` builds, in a namespace of their own, holding Calico's
//! CRDs; `kubectl ARGS` runs kubectl of the same release against it. There the lab plays the
//! kubelet: a pod's Kubernetes `Pod` exists before its CNI ADD and carries its labels and IPs.
//!
//! `soak --minutes N [--seed S] [--etcd|--kubernetes]`: the lab under faults (`soak.rs`), then
//! taken down and checked that nothing is left.
//!
//! Everything it makes is named `mlab-*` (namespaces) or lives in /run/margay-lab (configs,
//! pid files, logs, the datastore's mount). `MARGAY_LAB_NAME=x` makes that `x-*` and
//! /run/margay-lab-x, so tests run a lab of their own beside a user's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

mod etcd;
mod kube;
mod soak;

const NETWORK: &str = "k8s-pod-network";

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
        /// Keep the cluster's state in a real etcd cluster (three members, a namespace each)
        /// instead of the shared SQLite file.
        #[arg(long, conflicts_with = "kubernetes")]
        etcd: bool,
        /// Keep it in the Kubernetes API (a kube-apiserver over etcd 3.7, in a namespace of
        /// its own), in Calico's CRDs.
        #[arg(long)]
        kubernetes: bool,
    },
    /// kubectl against the lab's apiserver (`up --kubernetes`), e.g. `kubectl get ippools`.
    Kubectl {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Ping every pod from every pod.
    Check,
    /// What is up.
    Status,
    /// Remove every namespace and process of the lab.
    Down,
    /// Create a pod on a node through CNI ADD; prints its address.
    PodAdd {
        node: String,
        pod: String,
        /// The pod's Kubernetes namespace (CNI_ARGS K8S_POD_NAMESPACE).
        #[arg(long, default_value = "default")]
        namespace: String,
        /// A label of the pod (KEY=VALUE, `args.cni.labels`; on Kubernetes its Pod's), for
        /// network policy; repeatable.
        #[arg(long = "label")]
        labels: Vec<String>,
    },
    /// Delete a pod through CNI DEL (on Kubernetes, its Pod then).
    PodDel { node: String, pod: String },
    /// Restart a node's bgpd or routewriter (SIGTERM, then start again).
    Restart { node: String, daemon: String },
    /// Stop a node's daemons and remove it from the cluster (Nodes.DeleteNode).
    NodeDel { node: String },
    /// Ping every pod from every pod at 10/s while injecting faults drawn from a seed; then
    /// check IPAM, kernel routes, recovery and memory, print the table, take the lab down
    /// and check that nothing is left.
    Soak {
        /// How long to inject faults.
        #[arg(long, default_value_t = 2.0)]
        minutes: f64,
        /// The schedule's seed [default: from the clock; printed either way].
        #[arg(long)]
        seed: Option<u64>,
        /// Soak the lab on a three-member etcd cluster (with etcd's faults) instead of SQLite
        /// (with the full disk).
        #[arg(long, conflicts_with = "kubernetes")]
        etcd: bool,
        /// Soak the lab on the Kubernetes API (the apiserver killed and restarted, etcd under
        /// it killed).
        #[arg(long)]
        kubernetes: bool,
        /// Print the seed's planned faults and stop.
        #[arg(long)]
        plan: bool,
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
    // `gone` reaps what this process started (the soak's restarts, or `up` from the same
    // command): a zombie would still count as alive.
    let deadline = Instant::now() + Duration::from_secs(5);
    while procs.iter().any(|(_, p)| !gone(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (_, pid) in &procs {
        if !gone(*pid) {
            // SAFETY: as above.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
    }
    // SIGKILL is not instant: wait until they are gone (reaped), so that nothing of the lab
    // runs once `down` returns.
    let deadline = Instant::now() + Duration::from_secs(5);
    while procs.iter().any(|(_, p)| !gone(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
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
    if is_mounted(&store_dir()) {
        run(Command::new("umount").arg(store_dir()))?;
    }
    let _ = std::fs::remove_dir_all(state());
    println!("margay-lab: down");
    Ok(())
}

/// The SQLite datastore's own file system.
fn store_dir() -> PathBuf {
    state().join("store")
}

/// The size of that file system: the lab's file takes well under 1 MiB, and a full disk must
/// be quick to make.
const STORE_FS_SIZE: &str = "64m";

fn is_mounted(dir: &Path) -> bool {
    let dir = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(dir.as_str()))
}

/// Mounts the datastore's file system (a tmpfs of [`STORE_FS_SIZE`], root only).
fn mount_store() -> Result<(), String> {
    let dir = store_dir();
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    run(Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={STORE_FS_SIZE},mode=0700"))
        .arg(format!("margay-lab-{}", lab_name()))
        .arg(&dir))?;
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
    Kubernetes,
}

impl Datastore {
    /// The `[datastore]` section of a node's configuration.
    fn config_section(self) -> String {
        match self {
            Datastore::Sqlite => format!(
                "[datastore]\nkind = \"sqlite\"\npath = \"{}\"\n",
                store_file().display()
            ),
            Datastore::Etcd => format!(
                "[datastore]\nkind = \"etcd\"\nendpoints = [{}]\n",
                etcd::client_urls()
                    .iter()
                    .map(|u| format!("\"{u}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Datastore::Kubernetes => format!(
                "[datastore]\nkind = \"kubernetes\"\nkubeconfig = \"{}\"\n",
                kube::kubeconfig().display()
            ),
        }
    }

    /// The `--etcd` / `--kubernetes` flags' choice.
    fn chosen(etcd: bool, kubernetes: bool) -> Datastore {
        match (etcd, kubernetes) {
            (true, _) => Datastore::Etcd,
            (_, true) => Datastore::Kubernetes,
            _ => Datastore::Sqlite,
        }
    }

    /// One line for `status` and `up`.
    fn describe(self) -> String {
        match self {
            Datastore::Sqlite => format!(
                "sqlite {} (a {STORE_FS_SIZE} tmpfs)",
                store_file().display()
            ),
            Datastore::Etcd => format!(
                "etcd {} ({} members in {}, data in {})",
                etcd::client_urls().join(","),
                etcd::MEMBERS,
                (0..etcd::MEMBERS)
                    .map(|i| ns(&etcd::member(i)))
                    .collect::<Vec<_>>()
                    .join(" "),
                etcd::dir().display()
            ),
            Datastore::Kubernetes => kube::describe(),
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
            "kubernetes" => Some(Datastore::Kubernetes),
            _ => None,
        }
    }

    fn record(self) -> Result<(), String> {
        let name = match self {
            Datastore::Sqlite => "sqlite",
            Datastore::Etcd => "etcd",
            Datastore::Kubernetes => "kubernetes",
        };
        std::fs::write(state().join("datastore"), name).map_err(|e| e.to_string())
    }
}

/// The shared SQLite file.
fn store_file() -> PathBuf {
    store_dir().join("store.db")
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
         [routewriter]\nsocket = \"{sock}\"\nuplink = \"eth0\"\nmetrics_listen = \"127.0.0.1:9099\"\n",
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

/// Spawns `cmd` with its output appended to `log` (a restarted daemon's follows its earlier
/// lives) and records its PID as `key`, for `down`.
fn launch(mut cmd: Command, log: &Path, key: &str) -> Result<i32, String> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
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
    /// Its Kubernetes namespace.
    k8s_ns: String,
    node: String,
    address: String,
    address6: String,
}

/// Runs the margay CNI plugin in the node's namespace for `command` on `pod`, a pod of
/// Kubernetes namespace `k8s_ns` with `labels` (KEY=VALUE).
fn cni(
    command: &str,
    node: &str,
    pod: &str,
    k8s_ns: &str,
    labels: &[String],
) -> Result<String, String> {
    let pns = pod_ns(node, pod);
    let sock = socket(node);
    let labels: Vec<serde_json::Value> = labels
        .iter()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or((l, ""));
            serde_json::json!({"key": k, "value": v})
        })
        .collect();
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
        "args": {"cni": {"labels": labels}},
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
            format!("K8S_POD_NAMESPACE={k8s_ns};K8S_POD_NAME={pod_name}"),
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

/// Whether the lab's datastore is the Kubernetes API (where it plays the kubelet).
fn on_kubernetes() -> bool {
    Datastore::recorded() == Some(Datastore::Kubernetes)
}

/// A pod's sandbox made through CNI ADD. On Kubernetes its Pod is made first (unless the lab
/// made it already), carrying the labels: the datastore takes them from the Pod, not the
/// CNI's args.
fn cni_add(node: &str, pod: &str, k8s_ns: &str, labels: &[String]) -> Result<Pod, String> {
    let pod_name = format!("{node}-{pod}");
    let kubernetes = on_kubernetes();
    if kubernetes {
        kube::ensure_pod(node, &pod_name, k8s_ns, labels)?;
    }
    let pns = pod_ns(node, pod);
    ip(&["netns", "add", &pns])?;
    in_ns(&pns, &["ip", "link", "set", "lo", "up"])?;
    let labels: &[String] = if kubernetes { &[] } else { labels };
    let text = cni("ADD", node, pod, k8s_ns, labels)?;
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
        k8s_ns: k8s_ns.into(),
        node: node.into(),
    })
}

fn cni_del(node: &str, pod: &str, k8s_ns: &str) -> Result<(), String> {
    cni("DEL", node, pod, k8s_ns, &[])?;
    ip(&["netns", "del", &pod_ns(node, pod)])?;
    Ok(())
}

/// A pod of `up` or `pod-add`: its sandbox, and on Kubernetes its Pod's status then
/// reporting it Running with its IPs, as the kubelet does (the soak's churn and probe
/// sandboxes come and go without).
fn pod_create(node: &str, pod: &str, k8s_ns: &str, labels: &[String]) -> Result<Pod, String> {
    let p = cni_add(node, pod, k8s_ns, labels)?;
    if on_kubernetes() {
        kube::pod_running(&p.k8s_ns, &p.name, &p.address, &p.address6)?;
    }
    Ok(p)
}

fn pod_add(node: &str, pod: &str, k8s_ns: &str, labels: &[String]) -> Result<bool, String> {
    let p = pod_create(node, pod, k8s_ns, labels)?;
    println!("{} {}", p.name, p.address);
    let mut pods = load_pods();
    pods.push(p);
    save_pods(&pods)?;
    Ok(true)
}

fn pod_del(node: &str, pod: &str) -> Result<bool, String> {
    let name = format!("{node}-{pod}");
    let k8s_ns = load_pods()
        .into_iter()
        .find(|p| p.name == name)
        .map(|p| p.k8s_ns)
        .unwrap_or_else(|| "default".into());
    cni_del(node, pod, &k8s_ns)?;
    if on_kubernetes() {
        kube::delete_pod(&k8s_ns, &name)?;
    }
    let pods: Vec<Pod> = load_pods().into_iter().filter(|p| p.name != name).collect();
    save_pods(&pods)?;
    println!("{name} deleted");
    Ok(true)
}

fn stop(node: &str, daemon: &str) -> Result<(), String> {
    let file = state().join("pids").join(format!("{node}-{daemon}"));
    let pid = recorded_pid(node, daemon)?;
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

/// kill -9 of what the lab recorded as `daemon` of `node` (a node, or an etcd member); reaped
/// and its record removed.
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

fn restart(node: &str, daemon: &str) -> Result<bool, String> {
    if !["bgpd", "routewriter"].contains(&daemon) {
        return Err(format!("{daemon}: only bgpd and routewriter restart"));
    }
    stop(node, daemon)?;
    start_again(node, daemon)?;
    println!("{daemon} on {node} restarted");
    Ok(true)
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
    if on_kubernetes() {
        kube::delete_pods_on(node)?;
    }
    let _ = ip(&["netns", "del", &ns(node)]);
    println!("{node} removed");
    Ok(true)
}

/// Runs one async exchange with the lab's daemons (this tool is synchronous otherwise).
fn block_on<T>(f: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(f)
}

fn grpc_delete_node(via: &str, node: &str) -> Result<(), String> {
    block_on(async {
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
        .map(|p| serde_json::json!({"name": p.name, "ns": p.ns, "k8s_ns": p.k8s_ns, "node": p.node, "address": p.address, "address6": p.address6}))
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
                k8s_ns: p["k8s_ns"].as_str().unwrap_or("default").into(),
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

#[expect(
    clippy::too_many_lines,
    reason = "`margay-lab up` in order: topology, datastore, daemons per node, pods, then the mesh check; a lab bring-up script"
)]
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
    match datastore {
        Datastore::Etcd => {
            println!(
                "margay-lab: etcd cluster of {} members at {}",
                etcd::MEMBERS,
                etcd::client_urls().join(",")
            );
            etcd::start_cluster()?;
        }
        Datastore::Kubernetes => {
            println!(
                "margay-lab: kube-apiserver {} at {} over etcd 3.7",
                interop_tests::lab::kube_api::release(),
                kube::url()
            );
            kube::start()?;
        }
        Datastore::Sqlite => mount_store()?,
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
            pods.push(pod_create(n.name, p, "default", &[])?);
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

fn main() -> ExitCode {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("margay-lab: run as root (it creates network namespaces)");
        return ExitCode::FAILURE;
    }
    let result = match Args::parse().command {
        Cmd::Up { etcd, kubernetes } => up(Datastore::chosen(etcd, kubernetes)),
        Cmd::Kubectl { args } => {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kube::kubectl(&args).map(|out| {
                print!("{out}");
                true
            })
        }
        Cmd::Check => check(Duration::from_secs(5)),
        Cmd::Status => status().map(|_| true),
        Cmd::Down => down().map(|_| true),
        Cmd::PodAdd {
            node,
            pod,
            namespace,
            labels,
        } => pod_add(&node, &pod, &namespace, &labels),
        Cmd::PodDel { node, pod } => pod_del(&node, &pod),
        Cmd::Restart { node, daemon } => restart(&node, &daemon),
        Cmd::NodeDel { node } => node_del(&node),
        Cmd::Soak {
            minutes,
            seed,
            etcd,
            kubernetes,
            plan,
        } => soak::run(soak::SoakArgs {
            plan,
            minutes,
            seed: seed.unwrap_or_else(|| soak::unix_now() as u64),
            datastore: Datastore::chosen(etcd, kubernetes),
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
