//! A Calico node's BIRD daemons in a namespace, for interop tests: one daemon per family, as
//! calico-node runs `bird` (IPv4) and `bird6` (IPv6) of BIRD 1.6, or BIRD 2 with the same
//! configuration per family; [`super::calico_bird`] renders them. Each daemon gets its own
//! temporary directory (configuration, control socket, pid file, log), is known by the PID it
//! writes and killed by it when dropped (and by its namespace's drop, should it outlive
//! that), and is queried through its own birdc. Also parsers for what tests read off such
//! a node: BIRD's routes in the kernel table, the families a BIRD 2 neighbor announced.
//!
//! Left out of Calico's start-up: `-R` (graceful-restart recovery), which holds the kernel
//! table back until every session has converged once: it only slows a test down.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use datastore::model::IpFamily;

use super::bgp_peer::{DaemonPid, output, read_pid};
use super::bird::{BirdVersion, binaries};
use super::calico_bird::{Dialect, NodeConfig};
use super::netns::Netns;

/// One BIRD daemon of one family inside a node's namespace.
pub struct CalicoBird {
    pub dialect: Dialect,
    pub family: IpFamily,
    ns: String,
    birdc: PathBuf,
    dir: tempfile::TempDir,
    _daemon: DaemonPid,
}

/// The daemon and client binaries for a dialect and family: BIRD 1.6 has one pair per family
/// (`bird`/`birdc`, `bird6`/`birdc6`), BIRD 2 one for both (unpacked when missing, see
/// [`super::bird::binaries`]).
pub fn programs(dialect: Dialect, family: IpFamily) -> Result<(PathBuf, PathBuf), String> {
    match (dialect, family) {
        (Dialect::Bird1, IpFamily::V4) => binaries(BirdVersion::V1),
        (Dialect::Bird1, IpFamily::V6) => {
            let (bird, birdc) = (
                PathBuf::from("/usr/sbin/bird6"),
                PathBuf::from("/usr/sbin/birdc6"),
            );
            if bird.exists() && birdc.exists() {
                Ok((bird, birdc))
            } else {
                Err("BIRD 1.6's bird6 is not installed: apt-get install bird".into())
            }
        }
        (Dialect::Bird2, _) => binaries(BirdVersion::V2),
    }
}

impl CalicoBird {
    /// Renders `node` for `dialect` (logging into the daemon's directory, whatever
    /// `node.log` says) and starts the daemon of `node`'s family in `ns`. BIRD refusing the
    /// configuration is an error carrying its words.
    pub fn start(ns: &Netns, dialect: Dialect, node: &NodeConfig<'_>) -> Result<Self, String> {
        let family = IpFamily::of(node.address);
        let (bird, birdc) = programs(dialect, family)?;
        let dir = tempfile::tempdir().map_err(|e| format!("a directory for BIRD: {e}"))?;
        let (conf, log) = (dir.path().join("bird.cfg"), dir.path().join("bird.log"));
        let text = NodeConfig {
            log: Some(&log),
            ..node.clone()
        }
        .render(dialect)?;
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        let (sock, pidfile) = (dir.path().join("bird.ctl"), dir.path().join("bird.pid"));
        let o = ns
            .command(&bird)
            .arg("-c")
            .arg(&conf)
            .arg("-s")
            .arg(&sock)
            .arg("-P")
            .arg(&pidfile)
            .output()
            .map_err(|e| format!("{}: {e}", bird.display()))?;
        if !o.status.success() {
            return Err(format!(
                "{} did not start in {}: {}",
                bird.display(),
                ns.name(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        let pid = read_pid(&pidfile).ok_or_else(|| {
            format!(
                "{} wrote no pid file in {}",
                bird.display(),
                dir.path().display()
            )
        })?;
        Ok(CalicoBird {
            dialect,
            family,
            ns: ns.name().to_owned(),
            birdc,
            dir,
            _daemon: DaemonPid { pid },
        })
    }

    /// "bird6 (BIRD 1.6)", "BIRD 2 (IPv4)": which daemon, for messages.
    pub fn label(&self) -> String {
        match (self.dialect, self.family) {
            (Dialect::Bird1, IpFamily::V4) => "bird (BIRD 1.6)".into(),
            (Dialect::Bird1, IpFamily::V6) => "bird6 (BIRD 1.6)".into(),
            (Dialect::Bird2, f) => format!("BIRD 2 ({})", f.name()),
        }
    }

    /// The client's output for `args` (`show protocols`, `show route all PREFIX`, ...); ""
    /// while the daemon does not answer.
    pub fn birdc(&self, args: &[&str]) -> String {
        output(
            Command::new("ip")
                .args(["netns", "exec", &self.ns])
                .arg(&self.birdc)
                .arg("-s")
                .arg(self.dir.path().join("bird.ctl"))
                .args(args),
        )
    }

    /// The BGP protocols and their state: name → info column (`Established`, `Active
    /// Socket: Connection refused`, ...).
    pub fn sessions(&self) -> BTreeMap<String, String> {
        parse_bgp_protocols(&self.birdc(&["show", "protocols"]))
    }

    /// What the daemon logged (Calico's default: everything, the sessions' states).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bird.log")).unwrap_or_default()
    }

    /// The configuration it runs.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("bird.cfg")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The BGP rows of `show protocols` (BIRD 1.6 and 2 print the same columns: name, proto,
/// table, state, since, info): name → info.
pub fn parse_bgp_protocols(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 5 && w[1] == "BGP").then(|| (w[0].to_owned(), w[5..].join(" ")))
        })
        .collect()
}

/// Gives `dev` in `ns` the IPv6 address `cidr` (e.g. `fd96:6::2/64`) and returns once the
/// device's addresses are usable: the global one at once (`nodad`: duplicate address
/// detection would keep it tentative, so unbindable, for a second or more, and nothing else
/// on a test's segment has it), the link-local one after its DAD (BIRD reads the device's
/// addresses when it starts).
pub fn add_ipv6(ns: &Netns, dev: &str, cidr: &str) -> Result<(), String> {
    ns.ip(&["-6", "addr", "add", cidr, "dev", dev, "nodad"])
        .map_err(|e| e.to_string())?;
    let mut last = String::new();
    let ready = super::bgp_peer::wait_until(std::time::Duration::from_secs(10), || {
        last = ns
            .ip(&["-6", "addr", "show", "dev", dev])
            .unwrap_or_default();
        !last.contains("tentative") && last.contains("fe80:")
    });
    if ready {
        Ok(())
    } else {
        Err(format!(
            "IPv6 addresses of {dev} in {} not usable after 10 s: {last}",
            ns.name()
        ))
    }
}

/// The gateway of a BIRD route in `ip route show PREFIX` output (`... via X dev eth0 proto
/// bird ...`); routes of other protocols do not count.
pub fn kernel_via(ip_route: &str) -> Option<String> {
    ip_route.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let proto = w.iter().position(|x| *x == "proto")?;
        if w.get(proto + 1) != Some(&"bird") {
            return None;
        }
        let via = w.iter().position(|x| *x == "via")?;
        w.get(via + 1).map(|s| (*s).to_owned())
    })
}

/// The address families the neighbor announced (its Multiprotocol capabilities), from BIRD
/// 2's `show protocols all NAME`: `AF announced:` under `Neighbor capabilities`.
pub fn neighbor_afs(show_protocols_all: &str) -> Vec<String> {
    let mut in_neighbor = false;
    for l in show_protocols_all.lines().map(str::trim) {
        if l.starts_with("Neighbor capabilities") {
            in_neighbor = true;
        } else if l.starts_with("Local capabilities") || l.starts_with("Session:") {
            in_neighbor = false;
        }
        if in_neighbor && let Some(afs) = l.strip_prefix("AF announced:") {
            return afs.split_whitespace().map(str::to_owned).collect();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_routes_and_capabilities() {
        let ip = "fd97:6::40/122 via fd96:6::1 dev eth0 proto bird metric 1024 pref medium\n";
        assert_eq!(kernel_via(ip).as_deref(), Some("fd96:6::1"));
        let theirs = "172.26.1.0/26 via 10.96.6.1 dev eth0 proto 80\n";
        assert_eq!(kernel_via(theirs), None);
        assert_eq!(kernel_via(""), None);
        // BIRD 2.0.12, abridged.
        let caps = "  BGP state:          Established\n    Neighbor address: 10.96.6.1\n\
            Local capabilities\n      Multiprotocol\n        AF announced: ipv4\n\
            Neighbor capabilities\n      Multiprotocol\n        AF announced: ipv4 ipv6\n\
            Session:          internal multihop AS4\n";
        assert_eq!(neighbor_afs(caps), vec!["ipv4", "ipv6"]);
        assert!(neighbor_afs("").is_empty());
    }

    #[test]
    fn parses_show_protocols_of_both_versions() {
        let one = "BIRD 1.6.8 ready.\n\
            name     proto    table    state  since       info\n\
            kernel1  Kernel   master   up     12:43:01\n\
            Mesh_fd96_6__1 BGP      master   up     12:43:04    Established\n\
            Mesh_fd96_6__3 BGP      master   start  12:43:01    Active        Socket: Connection refused\n";
        let s = parse_bgp_protocols(one);
        assert_eq!(s.len(), 2);
        assert_eq!(s["Mesh_fd96_6__1"], "Established");
        assert_eq!(s["Mesh_fd96_6__3"], "Active Socket: Connection refused");
        let two = "BIRD 2.0.12 ready.\n\
            Name       Proto      Table      State  Since         Info\n\
            device1    Device     ---        up     12:43:01.208\n\
            Mesh_10_96_6_1 BGP        ---        up     12:43:04.532  Established\n\
            Mesh_10_96_6_2 BGP        ---        start  12:43:01.208  Connect\n";
        let s = parse_bgp_protocols(two);
        assert_eq!(s["Mesh_10_96_6_1"], "Established");
        assert_eq!(s["Mesh_10_96_6_2"], "Connect");
        assert!(parse_bgp_protocols("").is_empty());
    }
}
