//! One bgpd node of a lab cluster: its own namespace on a [`Segment`], its directory, its
//! process, everything else from the datastore the nodes share (a SQLite file, or the
//! Kubernetes API). What the
//! cluster tests with a real ToR (`cluster_brain`, `bgp_policy_tor`, `service_ecmp`) start
//! several of; read through bgpctl's `--json` output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::bgp_peer::wait_until;
use super::bgpd::bgpctl;
use super::netns::NsProcess;
use super::segment::{Member, Segment};

pub struct SegmentNode {
    // Stopped before its namespace goes (fields drop in order).
    process: Option<NsProcess>,
    pub name: String,
    /// Its IPv4 address on the segment (a /24).
    pub addr: String,
    /// Its IPv6 address on the segment (a /64), if it has one, and eth0's link-local one.
    pub addr6: Option<String>,
    pub link_local: Option<String>,
    pub socket: PathBuf,
    dir: tempfile::TempDir,
    pub member: Member,
}

/// How to start a [`SegmentNode`] beyond its name and IPv4 address.
#[derive(Default)]
pub struct NodeOptions<'a> {
    /// The namespace's name (default: the node's name), for runs that must not collide.
    pub tag: Option<&'a str>,
    /// An IPv6 address (/64) on eth0, and `node.address6`.
    pub addr6: Option<&'a str>,
    /// Appended to its configuration (e.g. `[bgp]` settings).
    pub extra: &'a str,
    /// The store path is a kubeconfig: the datastore is the Kubernetes API it names.
    pub kubernetes: bool,
    /// The configuration leaves the addresses out (eth0 has them): bgpd takes its
    /// Kubernetes Node's InternalIPs.
    pub address_from_node: bool,
}

impl SegmentNode {
    /// Attaches `name` to `seg` at `addr`/24 and starts its bgpd on the SQLite file `store`.
    pub fn start(seg: &Segment, name: &str, addr: &str, store: &Path, extra: &str) -> Self {
        Self::start_with(
            seg,
            name,
            addr,
            store,
            &NodeOptions {
                extra,
                ..Default::default()
            },
        )
    }

    /// As [`SegmentNode::start`], with `opts`.
    pub fn start_with(
        seg: &Segment,
        name: &str,
        addr: &str,
        store: &Path,
        opts: &NodeOptions<'_>,
    ) -> Self {
        let member = seg
            .attach(opts.tag.unwrap_or(name), &format!("{addr}/24"))
            .unwrap();
        let mut node_lines = format!("name = \"{name}\"\n");
        if !opts.address_from_node {
            node_lines.push_str(&format!("address = \"{addr}/24\"\n"));
        }
        if let Some(a6) = opts.addr6 {
            super::calico_node::add_ipv6(&member.ns, "eth0", &format!("{a6}/64"))
                .unwrap_or_else(|e| panic!("{e}"));
            if !opts.address_from_node {
                node_lines.push_str(&format!("address6 = \"{a6}/64\"\n"));
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("bgpd.sock");
        let config = dir.path().join("bgpd.toml");
        let datastore = if opts.kubernetes {
            format!(
                "kind = \"kubernetes\"\nkubeconfig = \"{}\"",
                store.display()
            )
        } else {
            format!("kind = \"sqlite\"\npath = \"{}\"", store.display())
        };
        std::fs::write(
            &config,
            format!(
                "[node]\n{node_lines}\
                 [datastore]\n{datastore}\n\
                 [api]\nsocket = \"{}\"\n[log]\nlevel = \"info\"\n{}",
                socket.display(),
                opts.extra
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("bgpd.log")).unwrap();
        let mut cmd = member.ns.command(super::binary("bgpd"));
        cmd.arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // The file says everything: no override from the test's own environment.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("MARGAY_") {
                cmd.env_remove(k);
            }
        }
        let process = member.ns.spawn(&mut cmd).unwrap();
        let link_local = opts.addr6.and_then(|_| link_local_of(&member.ns, "eth0"));
        let node = SegmentNode {
            process: Some(process),
            name: name.into(),
            addr: addr.into(),
            addr6: opts.addr6.map(str::to_owned),
            link_local,
            socket,
            dir,
            member,
        };
        assert!(
            wait_until(Duration::from_secs(20), || {
                std::os::unix::net::UnixStream::connect(&node.socket).is_ok()
            }),
            "{name}: bgpd did not serve\n{}",
            node.log()
        );
        node
    }

    pub fn ns(&self) -> &super::netns::Netns {
        &self.member.ns
    }

    /// `bgpctl ARGS` on this node: (success, stdout, stderr).
    pub fn ctl(&self, args: &[&str]) -> (bool, String, String) {
        let o = bgpctl(&self.socket, args);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// `bgpctl ARGS`, which must succeed; its output.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.ctl(args);
        assert!(
            ok,
            "{}: bgpctl {args:?} failed: {err}\n{}",
            self.name,
            self.log_tail(40)
        );
        out
    }

    /// Stops its bgpd with SIGTERM, as an operator would (it is not started again).
    pub fn terminate(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.signal_and_wait(libc::SIGTERM, Duration::from_secs(10));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bgpd.log")).unwrap_or_default()
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// `bgpctl ARGS` parsed as JSON (`Null` when it fails).
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let o = bgpctl(&self.socket, args);
        serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// Session name → its `show protocols --json` entry.
    pub fn protocols(&self) -> BTreeMap<String, serde_json::Value> {
        self.json(&["show", "protocols", "--json"])
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| (p["name"].as_str().unwrap_or("").to_owned(), p.clone()))
            .collect()
    }

    /// Session name → state.
    pub fn sessions(&self) -> BTreeMap<String, String> {
        self.protocols()
            .into_iter()
            .map(|(n, p)| (n, p["state"].as_str().unwrap_or("").to_owned()))
            .collect()
    }

    /// Whether exactly the sessions `want` exist, all Established.
    pub fn all_established(&self, want: &[&str]) -> bool {
        let s = self.sessions();
        s.len() == want.len()
            && want
                .iter()
                .all(|w| s.get(*w).is_some_and(|st| st == "Established"))
    }

    /// The prefixes of a table (`show route --table ...`; none: the Loc-RIB).
    pub fn prefixes(&self, table: &[&str]) -> Vec<String> {
        let mut args = vec!["show", "route"];
        if !table.is_empty() {
            args.push("--table");
            args.extend_from_slice(table);
        }
        args.push("--json");
        self.json(&args)
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["prefix"].as_str().map(str::to_owned))
            .collect()
    }

    /// Destination → (route as `ip route` shows it, why), of the desired kernel table.
    pub fn kernel(&self) -> BTreeMap<String, (String, String)> {
        self.json(&["show", "route", "--table", "kernel", "--json"])
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                (
                    r["prefix"].as_str().unwrap_or("").to_owned(),
                    (
                        r["route"].as_str().unwrap_or("").to_owned(),
                        r["source"].as_str().unwrap_or("").to_owned(),
                    ),
                )
            })
            .collect()
    }
}

impl Drop for SegmentNode {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// The IPv6 link-local address of `dev` in `ns`.
fn link_local_of(ns: &super::netns::Netns, dev: &str) -> Option<String> {
    let o = ns.ip(&["-6", "-j", "addr", "show", "dev", dev]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&o).ok()?;
    v.as_array()?
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .find_map(|a| {
            a["local"]
                .as_str()
                .filter(|l| l.starts_with("fe80:"))
                .map(str::to_owned)
        })
}

/// What to print when a cluster test fails: each node's sessions, desired kernel table and
/// the tail of its log.
pub fn context(nodes: &[&SegmentNode]) -> String {
    let mut s = String::new();
    for n in nodes {
        s.push_str(&format!(
            "--- {} sessions {:?}\n--- {} kernel {:#?}\n--- {} log (tail)\n{}\n",
            n.name,
            n.sessions(),
            n.name,
            n.kernel(),
            n.name,
            n.log_tail(30)
        ));
    }
    s
}
