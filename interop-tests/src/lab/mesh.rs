//! A flat cluster of many nodes on one machine, for scale runs: a hub namespace holding a
//! bridge, and one namespace per node whose `eth0` is a veth plugged into that bridge. Every
//! node is on one L2 segment, 10.77.0.0/16 (node `i` at 10.77.(1 + i/250).(1 + i%250), the hub
//! at 10.77.0.1), and owns four /26 blocks of the pool (node `i`: 172.(20 + i/256).(i%256).0/24
//! cut in four). The pool is Calico's-default-sized 172.20.0.0/16 up to 256 nodes, and
//! 172.20.0.0/14 beyond, up to 1024.
//!
//! What it does not do: start any daemon (the benchmark does, inside the node namespaces).
//!
//! Everything is this run's (namespaces `mgy<pid>-…`, see [`super::netns`]) and goes away
//! when the [`Mesh`] is dropped, also on a panic: each namespace kills the processes still
//! inside it by PID and deletes itself, which deletes its veth end and so the pair. The
//! kernel's neighbour-table limits, shared by every namespace, and the inotify instances per
//! user are raised for the run (a mesh of 50+ nodes overflows the neighbour defaults, one of
//! 128+ bgpds the inotify one) and put back when the [`KernelLimits`] guard drops.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use super::netns::{CmdError, Netns, run};
use super::segment::Segment;

/// The pool every node's blocks come from, in a mesh of `n` nodes.
pub fn pool(n: usize) -> &'static str {
    if n <= 256 {
        "172.20.0.0/16"
    } else {
        "172.20.0.0/14"
    }
}
/// The hub's address on the segment (where a shared service such as etcd can listen).
pub const HUB_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// Prefix length of the node segment.
pub const PREFIX_LEN: u8 = 16;
/// Blocks each node owns.
pub const BLOCKS_PER_NODE: usize = 4;
/// Nodes the largest pool has blocks for (4096 /26 blocks, four each).
pub const MAX_NODES: usize = 1024;

/// Node `i`'s address.
pub fn node_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (1 + i / 250) as u8, (1 + i % 250) as u8)
}

/// Node `i`'s name in the datastore and in messages.
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// Node `i`'s four /26 blocks.
pub fn node_blocks(i: usize) -> Vec<ipnet::Ipv4Net> {
    (0..BLOCKS_PER_NODE)
        .map(|k| {
            let (hi, lo) = ((20 + i / 256) as u8, (i % 256) as u8);
            ipnet::Ipv4Net::new(Ipv4Addr::new(172, hi, lo, (k * 64) as u8), 26)
                .expect("26 is a valid IPv4 prefix length")
        })
        .collect()
}

/// One node: its namespace and address.
pub struct MeshNode {
    pub ns: Netns,
    pub addr: Ipv4Addr,
}

/// The hub and the nodes; see the module documentation.
pub struct Mesh {
    // Nodes first: dropping them kills their daemons before the hub (and its bridge) goes.
    pub nodes: Vec<MeshNode>,
    pub hub: Netns,
    _limits: KernelLimits,
}

impl Mesh {
    /// Creates the hub and `n` nodes, all links up and addressed.
    pub fn new(n: usize) -> Result<Mesh, String> {
        if n == 0 || n > MAX_NODES {
            return Err(format!(
                "{n} nodes: the mesh holds 1 to {MAX_NODES} (the pool {} has four /26 blocks for each)",
                pool(MAX_NODES)
            ));
        }
        let mut limits = KernelLimits::default();
        // About n² neighbour entries in all; small meshes stay within the defaults
        // (128/512/1024), and leaving them alone keeps concurrent small runs from restoring
        // under a large one.
        if n * n > 256 {
            let e = (n * n) as u64;
            let mins = [e.max(32768), (2 * e).max(65536), (4 * e).max(131072)];
            for (k, min) in mins.into_iter().enumerate() {
                limits.raise(
                    &format!("/proc/sys/net/ipv4/neigh/default/gc_thresh{}", k + 1),
                    min,
                )?;
            }
        }
        // One inotify instance per bgpd, beside the machine's own users: past the default 128
        // a bgpd finds none and polls the datastore file instead (idle CPU, slower changes).
        limits.raise("/proc/sys/fs/inotify/max_user_instances", n as u64 + 128)?;
        // The segment's bridge; its members are attached below in batches rather than by
        // `Segment::attach`, which takes several `ip` processes a member.
        let Segment { hub } = Segment::new("hub").map_err(|e| e.to_string())?;
        hub.ip(&[
            "addr",
            "add",
            &format!("{HUB_ADDR}/{PREFIX_LEN}"),
            "dev",
            "br0",
        ])
        .map_err(|e| e.to_string())?;
        let mut mesh = Mesh {
            nodes: Vec::with_capacity(n),
            hub,
            _limits: limits,
        };
        // The hub's side of every veth in one `ip -batch`: hundreds of `ip` processes would
        // take seconds.
        let mut hub_batch = String::new();
        for i in 0..n {
            let ns = Netns::new(&format!("n{i}")).map_err(|e| e.to_string())?;
            hub_batch.push_str(&format!(
                "link add v{i} type veth peer name eth0 netns {}\nlink set v{i} master br0 up\n",
                ns.name()
            ));
            mesh.nodes.push(MeshNode {
                ns,
                addr: node_addr(i),
            });
        }
        batch(&mesh.hub, &hub_batch).map_err(|e| e.to_string())?;
        for node in &mesh.nodes {
            batch(
                &node.ns,
                &format!(
                    "addr add {}/{PREFIX_LEN} dev eth0\nlink set eth0 up\n",
                    node.addr
                ),
            )
            .map_err(|e| e.to_string())?;
            // A node routes for its pods: forwarding is on before any daemon starts, as on
            // the hosts of a cluster (Kubernetes requires it). Left to routewriter, a
            // thousand of them would write it while the others insert routes, and the kernel
            // spins on that write (`devinet_sysctl_forward` restarts the syscall until it
            // gets RTNL, one lock for every namespace of this machine): seconds of CPU the
            // benchmark would count and no real node pays.
            node.ns
                .run_in(|| std::fs::write("/proc/sys/net/ipv4/ip_forward", "1"))
                .and_then(|r| r)
                .map_err(|e| format!("forwarding on in {}: {e}", node.ns.name()))?;
        }
        Ok(mesh)
    }
}

/// Runs `ip -n <ns> -batch` over `commands`, one a line.
fn batch(ns: &Netns, commands: &str) -> Result<(), CmdError> {
    let file = tempfile::NamedTempFile::new().map_err(|e| CmdError {
        command: "a temporary batch file".into(),
        status: None,
        stderr: e.to_string(),
    })?;
    std::fs::write(file.path(), commands).map_err(|e| CmdError {
        command: format!("writing {}", file.path().display()),
        status: None,
        stderr: e.to_string(),
    })?;
    run(Command::new("ip")
        .args(["-n", ns.name(), "-batch"])
        .arg(file.path()))
    .map(|_| ())
}

/// Kernel limits (sysctl files) raised for a run and restored on drop: the neighbour (ARP)
/// table's, shared by every namespace and settable only in the initial one, and the number
/// of inotify instances per user (every bgpd follows its datastore file with one).
#[derive(Default)]
pub struct KernelLimits {
    old: Vec<(PathBuf, String)>,
}

impl KernelLimits {
    /// Raises the file to at least `min` (a value already higher is left alone).
    pub fn raise(&mut self, path: &str, min: u64) -> Result<(), String> {
        let old = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        if old.trim().parse::<u64>().unwrap_or(0) >= min {
            return Ok(());
        }
        std::fs::write(path, min.to_string()).map_err(|e| {
            format!("{path}: {e} (raising kernel limits for a large mesh needs root)")
        })?;
        self.old.push((PathBuf::from(path), old));
        Ok(())
    }
}

impl Drop for KernelLimits {
    fn drop(&mut self) {
        // In reverse, so gc_thresh1 <= gc_thresh2 <= gc_thresh3 holds at every step.
        for (path, old) in self.old.iter().rev() {
            let _ = std::fs::write(path, old.trim());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_blocks_do_not_collide() {
        let addrs: std::collections::HashSet<_> = (0..MAX_NODES).map(node_addr).collect();
        assert_eq!(addrs.len(), MAX_NODES);
        assert!(!addrs.contains(&HUB_ADDR));
        assert_eq!(node_addr(0).to_string(), "10.77.1.1");
        assert_eq!(node_addr(250).to_string(), "10.77.2.1");
        let blocks: std::collections::HashSet<_> = (0..MAX_NODES).flat_map(node_blocks).collect();
        assert_eq!(blocks.len(), MAX_NODES * BLOCKS_PER_NODE);
        assert_eq!(node_blocks(3)[1].to_string(), "172.20.3.64/26");
        assert_eq!(node_blocks(257)[0].to_string(), "172.21.1.0/26");
        for n in [2, 256, 257, MAX_NODES] {
            let pool: ipnet::Ipv4Net = pool(n).parse().unwrap();
            assert!(
                (0..n).flat_map(node_blocks).all(|b| pool.contains(&b)),
                "{n}"
            );
        }
    }
}
