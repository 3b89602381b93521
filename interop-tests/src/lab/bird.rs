//! BIRD 1.6 (Debian's `bird`) and BIRD 2 (Debian's `bird2`, unpacked next to it because the
//! two packages conflict) as interop peers, in a namespace, controlled through birdc.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::bgp_peer::{
    BGPD_ADDR, BgpPeer, DaemonPid, LOCAL_AS, PEER_ADDR, PEER_PREFIX, PeerRoute, output, read_pid,
    wait_until,
};
use super::netns::Netns;

/// Where the lab keeps BIRD 2 (`usr/sbin/bird` below it).
pub const BIRD2_DIR: &str = "/var/cache/margay/bird2";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BirdVersion {
    V1,
    V2,
}

/// The bird and birdc binaries of a version; BIRD 2 is downloaded and unpacked
/// (`apt-get download bird2`, `dpkg -x`) into [`BIRD2_DIR`] when missing.
pub fn binaries(v: BirdVersion) -> Result<(PathBuf, PathBuf), String> {
    match v {
        BirdVersion::V1 => {
            let b = PathBuf::from("/usr/sbin/bird");
            if !b.exists() {
                return Err("BIRD 1.6 is not installed: apt-get install bird".into());
            }
            Ok((b, PathBuf::from("/usr/sbin/birdc")))
        }
        BirdVersion::V2 => {
            let dir = Path::new(BIRD2_DIR);
            let bird = dir.join("usr/sbin/bird");
            if !bird.exists() {
                unpack_bird2(dir)?;
            }
            Ok((bird, dir.join("usr/sbin/birdc")))
        }
    }
}

fn unpack_bird2(dir: &Path) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let run = |c: &mut Command| -> Result<(), String> {
        let o = c.output().map_err(|e| e.to_string())?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{c:?}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    };
    run(Command::new("apt-get")
        .args(["download", "bird2"])
        .current_dir(tmp.path()))?;
    let deb = std::fs::read_dir(tmp.path())
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download bird2 left no .deb")?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    run(Command::new("dpkg").arg("-x").arg(&deb).arg(dir))
}

/// A BIRD daemon in a namespace with one BGP protocol `m` to bgpd and a static protocol `st`
/// holding [`PEER_PREFIX`].
pub struct Bird {
    version: BirdVersion,
    ns_name: String,
    bird: PathBuf,
    birdc: PathBuf,
    dir: tempfile::TempDir,
    daemon: DaemonPid,
    ns: NsCommand,
}

/// Enough of a [`Netns`] to run commands in it later.
#[derive(Debug, Clone)]
struct NsCommand(String);

impl NsCommand {
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0]).arg(program);
        c
    }
}

impl Bird {
    /// Starts BIRD `version` in `ns` as AS `asn`, peering with bgpd (AS 64512).
    pub fn start(version: BirdVersion, ns: &Netns, asn: u32) -> Result<Bird, String> {
        Self::start_with(version, ns, asn, "")
    }

    /// Like [`Bird::start`], with `extra` lines inside the `protocol bgp` block (e.g.
    /// `password "x";`, `ttl security on;`).
    pub fn start_with(
        version: BirdVersion,
        ns: &Netns,
        asn: u32,
        extra: &str,
    ) -> Result<Bird, String> {
        let conf = match version {
            BirdVersion::V1 => format!(
                "router id {PEER_ADDR};\n\
                 protocol device {{ scan time 2; }}\n\
                 protocol direct {{ interface \"*\"; }}\n\
                 protocol static st {{ route {PEER_PREFIX} blackhole; }}\n\
                 protocol bgp m {{\n  local as {asn};\n  neighbor {BGPD_ADDR} as {LOCAL_AS};\n\
                   import all;\n  export where proto = \"st\";\n  next hop self;\n\
                   connect delay time 1;\n  connect retry time 3;\n  error wait time 1,10;\n{extra}}}\n"
            ),
            BirdVersion::V2 => format!(
                "router id {PEER_ADDR};\n\
                 protocol device {{ scan time 2; }}\n\
                 protocol direct {{ ipv4; interface \"*\"; }}\n\
                 protocol static st {{ ipv4; route {PEER_PREFIX} blackhole; }}\n\
                 protocol bgp m {{\n  local as {asn};\n  neighbor {BGPD_ADDR} as {LOCAL_AS};\n\
                   ipv4 {{ import all; export where proto = \"st\"; next hop self; }};\n\
                   connect delay time 1;\n  connect retry time 3;\n  error wait time 1,10;\n{extra}}}\n"
            ),
        };
        Self::start_config(version, ns, &conf)
    }

    /// BIRD `version` in `ns` with a whole `bird.conf` of the caller's. Name its BGP protocol
    /// `m` and the static protocol it exports `st` and the [`BgpPeer`] methods work as usual
    /// (`established`, `route` of protocol `m`, `announce`/`withdraw` enable/disable `st`).
    pub fn start_config(version: BirdVersion, ns: &Netns, conf: &str) -> Result<Bird, String> {
        let (bird, birdc) = binaries(version)?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("bird.conf"), conf).map_err(|e| e.to_string())?;
        let mut b = Bird {
            version,
            ns_name: ns.name().to_owned(),
            bird,
            birdc,
            dir,
            daemon: DaemonPid { pid: 0 },
            ns: NsCommand(ns.name().to_owned()),
        };
        b.launch()?;
        Ok(b)
    }

    fn launch(&mut self) -> Result<(), String> {
        let d = self.dir.path();
        let pidfile = d.join("bird.pid");
        let _ = std::fs::remove_file(&pidfile);
        let _ = std::fs::remove_file(d.join("bird.ctl"));
        let o = self
            .ns
            .command(&self.bird)
            .arg("-c")
            .arg(d.join("bird.conf"))
            .arg("-s")
            .arg(d.join("bird.ctl"))
            .arg("-P")
            .arg(&pidfile)
            .output()
            .map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(format!(
                "bird did not start in {}: {}",
                self.ns_name,
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        self.daemon.pid = read_pid(&pidfile).ok_or("bird wrote no pid file")?;
        Ok(())
    }

    /// `birdc CMD...` output.
    pub fn birdc(&self, args: &[&str]) -> String {
        output(
            self.ns
                .command(&self.birdc)
                .arg("-s")
                .arg(self.dir.path().join("bird.ctl"))
                .args(args),
        )
    }
}

/// Parses `show route all PREFIX` output (both versions print `BGP.<attr>: value` lines).
pub fn parse_route(text: &str) -> Option<PeerRoute> {
    let attr = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    let next_hop = attr("BGP.next_hop:")?;
    Some(PeerRoute {
        next_hop: next_hop.split_whitespace().next().unwrap_or("").to_owned(),
        as_path: attr("BGP.as_path:")
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|a| a.parse().ok())
            .collect(),
        origin: attr("BGP.origin:").unwrap_or_default().to_uppercase(),
        local_pref: attr("BGP.local_pref:").and_then(|v| v.parse().ok()),
    })
}

impl BgpPeer for Bird {
    fn name(&self) -> &'static str {
        match self.version {
            BirdVersion::V1 => "BIRD 1.6",
            BirdVersion::V2 => "BIRD 2",
        }
    }

    fn established(&self) -> bool {
        self.birdc(&["show", "protocols", "m"])
            .lines()
            .any(|l| l.starts_with("m ") && l.contains("Established"))
    }

    fn route(&self, prefix: &str) -> Option<PeerRoute> {
        parse_route(&self.birdc(&["show", "route", "all", prefix, "protocol", "m"]))
    }

    fn announce(&mut self) {
        self.birdc(&["enable", "st"]);
    }

    fn withdraw(&mut self) {
        self.birdc(&["disable", "st"]);
    }

    fn kill_and_restart(&mut self) {
        self.daemon.kill();
        if let Err(e) = self.launch() {
            panic!("{e}");
        }
        wait_until(Duration::from_secs(10), || {
            !self.birdc(&["show", "status"]).is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bird_route_output() {
        let text = "10.10.1.0/24       via 10.99.0.1 on eth0 [m 07:20:01] * (100/0) [i]\n\
                    \tType: BGP unicast univ\n\tBGP.origin: IGP\n\tBGP.as_path: 64512 65001\n\
                    \tBGP.next_hop: 10.99.0.1\n\tBGP.local_pref: 100\n";
        let r = parse_route(text).unwrap();
        assert_eq!(r.next_hop, "10.99.0.1");
        assert_eq!(r.as_path, vec![64512, 65001]);
        assert_eq!((r.origin.as_str(), r.local_pref), ("IGP", Some(100)));
        assert!(parse_route("Network not in table\n").is_none());
    }
}
