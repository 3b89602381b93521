//! The lab's etcd (`up --etcd`): a cluster of three members (Debian's etcd-server), each in a
//! namespace of its own on the first segment (`etcd-1`..`etcd-3`, 10.99.1.21-23, which node-4
//! reaches through the router), data under the lab's state directory. Members are recorded
//! like the daemons, so `down` stops them by PID. The soak kills them (the leader too), starts
//! them again on their data, and cuts one off from the others with nftables.
//!
//! The leader is read from each member's own `/metrics` (`etcd_server_is_leader`), over plain
//! HTTP from inside the member's namespace: no etcdctl, and the same view etcd exports.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{attach, detached, in_ns, ip, kill9, lab_name, launch, ns, state, wait_for};

/// Members in the lab's cluster.
pub const MEMBERS: usize = interop_tests::lab::soak::ETCD_MEMBERS;

const CLIENT_PORT: u16 = 2379;
const PEER_PORT: u16 = 2380;

/// The nftables table that cuts a member off (in the member's own namespace).
const PARTITION_TABLE: &str = "margay_soak_partition";

/// `etcd-1` for member 0.
pub fn member(i: usize) -> String {
    format!("etcd-{}", i + 1)
}

fn address(i: usize) -> String {
    format!("10.99.1.{}", 21 + i)
}

fn peer_url(i: usize) -> String {
    format!("http://{}:{PEER_PORT}", address(i))
}

/// Every member's client URL, as the nodes' `[datastore] endpoints`.
pub fn client_urls() -> Vec<String> {
    (0..MEMBERS)
        .map(|i| format!("http://{}:{CLIENT_PORT}", address(i)))
        .collect()
}

/// Where the members keep their data and logs.
pub fn dir() -> PathBuf {
    state().join("etcd")
}

/// The key of member `i` in the lab's PID records.
fn key(i: usize) -> String {
    format!("{}-etcd", member(i))
}

/// Creates the members' namespaces, starts a new cluster and waits until every member listens.
pub fn start_cluster() -> Result<(), String> {
    let etcd = Path::new(interop_tests::lab::etcd::ETCD);
    if !etcd.exists() {
        return Err(format!(
            "{} is missing: apt-get install etcd-server (scripts/up installs it)",
            etcd.display()
        ));
    }
    for i in 0..MEMBERS {
        let name = ns(&member(i));
        ip(&["netns", "add", &name])?;
        in_ns(&name, &["ip", "link", "set", "lo", "up"])?;
        attach(
            &name,
            "eth0",
            "seg1",
            &format!("{}/24", address(i)),
            &format!("fd00:99:1::{}/64", 21 + i),
        )?;
        in_ns(
            &name,
            &["ip", "route", "add", "default", "via", "10.99.1.1"],
        )?;
    }
    for i in 0..MEMBERS {
        spawn(i, "new")?;
    }
    for i in 0..MEMBERS {
        wait_listening(i)?;
    }
    Ok(())
}

/// Starts member `i` (`state` is etcd's `--initial-cluster-state`: "new" the first time,
/// "existing" on its data afterwards); its log is appended to across restarts.
fn spawn(i: usize, cluster_state: &str) -> Result<(), String> {
    let data = dir().join(member(i));
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    let initial = (0..MEMBERS)
        .map(|m| format!("{}={}", member(m), peer_url(m)))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = detached(&member(i), Path::new(interop_tests::lab::etcd::ETCD));
    interop_tests::lab::etcd::member_args(
        &mut cmd,
        &member(i),
        &data,
        &client_urls()[i],
        &peer_url(i),
    );
    cmd.args(["--initial-cluster", &initial])
        .args(["--initial-cluster-state", cluster_state])
        .args(["--initial-cluster-token", &format!("{}-lab", lab_name())]);
    launch(cmd, &dir().join(format!("{}.log", member(i))), &key(i))?;
    Ok(())
}

/// A shell line, run in member `i`'s namespace, that opens its client port (and, with
/// `request`, sends it and prints the answer).
fn over_tcp(i: usize, request: Option<&str>) -> Result<String, String> {
    let mut script = format!("exec 3<>/dev/tcp/{}/{CLIENT_PORT}", address(i));
    if let Some(r) = request {
        script.push_str(&format!("; printf '{r}' >&3; cat <&3"));
    }
    in_ns(&ns(&member(i)), &["timeout", "2", "bash", "-c", &script])
}

fn wait_listening(i: usize) -> Result<(), String> {
    wait_for(
        &format!("etcd member {} to listen", member(i)),
        Duration::from_secs(20),
        || over_tcp(i, None).is_ok(),
    )
    .map_err(|e| {
        let log =
            std::fs::read_to_string(dir().join(format!("{}.log", member(i)))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        format!(
            "{e}\nthe end of its log:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    })
}

/// The member that says it is the leader, if one does (none during an election).
pub fn leader() -> Option<usize> {
    (0..MEMBERS).find(|&i| {
        over_tcp(i, Some("GET /metrics HTTP/1.0\\r\\n\\r\\n"))
            .is_ok_and(|m| m.lines().any(|l| l.trim() == "etcd_server_is_leader 1"))
    })
}

/// Waits up to `limit` for a leader (after a kill, the others elect one within a second).
pub fn wait_leader(limit: Duration) -> Result<usize, String> {
    let mut found = None;
    wait_for("an etcd leader", limit, || {
        found = leader();
        found.is_some()
    })?;
    found.ok_or_else(|| "no etcd leader".into())
}

/// kill -9 of member `i`; it is reaped and its record removed.
pub fn kill(i: usize) -> Result<(), String> {
    kill9(&member(i), "etcd")
}

/// Starts member `i` again on its data and waits until it listens.
pub fn restart(i: usize) -> Result<(), String> {
    spawn(i, "existing")?;
    wait_listening(i)
}

/// Cuts member `i` off from the other members (both directions, every port) with a table of
/// its own in its namespace; its clients, the nodes, still reach it. `false` heals the cut.
pub fn partition(i: usize, cut: bool) -> Result<(), String> {
    let name = ns(&member(i));
    if !cut {
        in_ns(&name, &["nft", "delete", "table", "inet", PARTITION_TABLE])?;
        return Ok(());
    }
    let others = (0..MEMBERS)
        .filter(|&m| m != i)
        .map(address)
        .collect::<Vec<_>>()
        .join(", ");
    let rules = format!(
        "table inet {PARTITION_TABLE} {{\n\
         chain input {{ type filter hook input priority 0; policy accept; ip saddr {{ {others} }} drop; }}\n\
         chain output {{ type filter hook output priority 0; policy accept; ip daddr {{ {others} }} drop; }}\n\
         }}\n"
    );
    let file = dir().join("partition.nft");
    std::fs::write(&file, rules).map_err(|e| e.to_string())?;
    in_ns(&name, &["nft", "-f", &file.display().to_string()])?;
    Ok(())
}
