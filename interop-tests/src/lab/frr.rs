//! FRR's bgpd (Debian's `frr`) as an interop peer: without zebra (`-Z`), in a namespace,
//! with its own pid file and vty directory, queried through vtysh's JSON output.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::bgp_peer::{
    BGPD_ADDR, BgpPeer, DaemonPid, LOCAL_AS, PEER_ADDR, PEER_PREFIX, PeerRoute, output, read_pid,
    wait_until,
};
use super::netns::Netns;

pub const FRR_BGPD: &str = "/usr/lib/frr/bgpd";

pub struct Frr {
    ns: String,
    asn: u32,
    dir: tempfile::TempDir,
    daemon: DaemonPid,
    /// zebra, when FRR installs what it learns into its namespace's kernel.
    zebra: Option<DaemonPid>,
}

/// FRR's kernel daemon: routes learned by bgpd are installed through it.
pub const FRR_ZEBRA: &str = "/usr/lib/frr/zebra";

impl Frr {
    pub fn start(ns: &Netns, asn: u32) -> Result<Frr, String> {
        let conf = format!(
            "frr defaults traditional\nhostname peer\n\
             router bgp {asn}\n bgp router-id {PEER_ADDR}\n no bgp ebgp-requires-policy\n\
              no bgp network import-check\n neighbor {BGPD_ADDR} remote-as {LOCAL_AS}\n\
              neighbor {BGPD_ADDR} timers connect 2\n\
              address-family ipv4 unicast\n  network {PEER_PREFIX}\n  neighbor {BGPD_ADDR} next-hop-self\n\
              exit-address-family\n"
        );
        Self::start_with_config(ns, asn, &conf)
    }

    /// FRR's bgpd with a whole `bgpd.conf` of the caller's (`asn` names its `router bgp`).
    pub fn start_with_config(ns: &Netns, asn: u32, conf: &str) -> Result<Frr, String> {
        if !std::path::Path::new(FRR_BGPD).exists() {
            return Err("FRR is not installed: apt-get install frr".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("bgpd.conf"), conf).map_err(|e| e.to_string())?;
        // The daemon drops to user frr: it must be able to write its files.
        let _ = Command::new("chown")
            .args(["-R", "frr:frr"])
            .arg(dir.path())
            .status();
        let mut f = Frr {
            ns: ns.name().to_owned(),
            asn,
            dir,
            daemon: DaemonPid { pid: 0 },
            zebra: None,
        };
        f.launch()?;
        Ok(f)
    }

    /// Like [`Frr::start_with_config`], with zebra: what bgpd learns goes into the kernel of
    /// the namespace `ns` (a router that forwards, not only a BGP speaker). By name, so that
    /// a namespace this run does not own (margay-lab's router) can be used.
    pub fn start_with_kernel(ns: &str, asn: u32, conf: &str) -> Result<Frr, String> {
        if !std::path::Path::new(FRR_ZEBRA).exists() {
            return Err("FRR's zebra is not installed: apt-get install frr".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("bgpd.conf"), conf).map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("zebra.conf"), "hostname zebra\n")
            .map_err(|e| e.to_string())?;
        let _ = Command::new("chown")
            .args(["-R", "frr:frr"])
            .arg(dir.path())
            .status();
        let pidfile = dir.path().join("zebra.pid");
        let o = Command::new("ip")
            .args(["netns", "exec", ns, FRR_ZEBRA, "-d", "-f"])
            .arg(dir.path().join("zebra.conf"))
            .arg("-i")
            .arg(&pidfile)
            .arg("--vty_socket")
            .arg(dir.path())
            .arg("-z")
            .arg(dir.path().join("zserv.api"))
            .args(["-A", "127.0.0.1", "-P", "0", "--log"])
            .arg(format!("file:{}", dir.path().join("zebra.log").display()))
            .output()
            .map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(format!(
                "FRR zebra did not start: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        let zebra = DaemonPid {
            pid: read_pid(&pidfile).ok_or("FRR zebra wrote no pid file")?,
        };
        let mut f = Frr {
            ns: ns.to_owned(),
            asn,
            dir,
            daemon: DaemonPid { pid: 0 },
            zebra: Some(zebra),
        };
        f.launch()?;
        Ok(f)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn launch(&mut self) -> Result<(), String> {
        let pidfile = self.path("bgpd.pid");
        let _ = std::fs::remove_file(&pidfile);
        let o = Command::new("ip")
            .args(["netns", "exec", &self.ns, FRR_BGPD, "-d", "-f"])
            .arg(self.path("bgpd.conf"))
            .arg("-i")
            .arg(&pidfile)
            .arg("--vty_socket")
            .arg(self.dir.path())
            .args(if self.zebra.is_some() {
                vec![
                    "-z".to_owned(),
                    self.path("zserv.api").display().to_string(),
                ]
            } else {
                vec!["-Z".to_owned()]
            })
            .args(["-A", "127.0.0.1", "-P", "0", "--log"])
            .arg(format!("file:{}", self.path("bgpd.log").display()))
            .output()
            .map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(format!(
                "FRR bgpd did not start: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        self.daemon.pid = read_pid(&pidfile).ok_or("FRR bgpd wrote no pid file")?;
        Ok(())
    }

    /// `vtysh -c CMD` against this instance.
    pub fn vtysh(&self, cmds: &[&str]) -> String {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, "vtysh", "--vty_socket"])
            .arg(self.dir.path())
            .args(["-d", "bgpd"]);
        for cmd in cmds {
            c.args(["-c", cmd]);
        }
        output(&mut c)
    }

    pub fn json(&self, cmd: &str) -> serde_json::Value {
        serde_json::from_str(&self.vtysh(&[cmd])).unwrap_or(serde_json::Value::Null)
    }

    /// Runs `lines` in `configure terminal` (e.g. `router bgp 65000`,
    /// `address-family ipv6 unicast`, `no network fd20:1::/122`); vtysh's output.
    pub fn configure(&self, lines: &[&str]) -> String {
        let mut cmds = vec!["configure terminal"];
        cmds.extend_from_slice(lines);
        self.vtysh(&cmds)
    }

    /// The state of the session with `neighbor` in `show bgp <afi> unicast summary json`
    /// (`afi` "ipv4" or "ipv6"): "Established", "Active", ...; "" when FRR does not list it.
    pub fn session_state(&self, afi: &str, neighbor: &str) -> String {
        self.json(&format!("show bgp {afi} unicast summary json"))["peers"][neighbor]["state"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    fn network(&self, add: bool) {
        let router = format!("router bgp {}", self.asn);
        let net = format!("{}network {PEER_PREFIX}", if add { "" } else { "no " });
        self.vtysh(&[
            "configure terminal",
            &router,
            "address-family ipv4 unicast",
            &net,
        ]);
    }
}

/// A `bgpd.conf` for FRR in AS `asn` at PEER_ADDR with bgpd (AS 64512, at BGPD_ADDR) as its
/// one neighbour: `router` lines go into `router bgp`, `neighbor` options apply to bgpd, and
/// `networks` are announced.
pub fn one_neighbor_conf(
    asn: u32,
    router: &[&str],
    neighbor: &[&str],
    networks: &[&str],
) -> String {
    let mut c = format!(
        "frr defaults traditional\nhostname peer\nrouter bgp {asn}\n bgp router-id {PEER_ADDR}\n\
         no bgp ebgp-requires-policy\n no bgp network import-check\n"
    );
    for r in router {
        c.push_str(&format!(" {r}\n"));
    }
    c.push_str(&format!(
        " neighbor {BGPD_ADDR} remote-as {LOCAL_AS}\n neighbor {BGPD_ADDR} timers connect 2\n"
    ));
    for o in neighbor {
        c.push_str(&format!(" neighbor {BGPD_ADDR} {o}\n"));
    }
    c.push_str(" address-family ipv4 unicast\n");
    for n in networks {
        c.push_str(&format!("  network {n}\n"));
    }
    c.push_str(" exit-address-family\n");
    c
}

/// The route for a prefix from `show bgp ipv4 unicast PREFIX json`.
pub fn parse_route(v: &serde_json::Value) -> Option<PeerRoute> {
    let path = v["paths"].as_array()?.first()?;
    let as_path = path["aspath"]["string"]
        .as_str()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|a| a.parse().ok())
        .collect();
    Some(PeerRoute {
        next_hop: path["nexthops"][0]["ip"].as_str()?.to_owned(),
        as_path,
        origin: path["origin"].as_str().unwrap_or("").to_uppercase(),
        local_pref: path["locPrf"]
            .as_u64()
            .or(path["localpref"].as_u64())
            .and_then(|l| u32::try_from(l).ok()),
    })
}

impl BgpPeer for Frr {
    fn name(&self) -> &'static str {
        "FRR"
    }

    fn established(&self) -> bool {
        let v = self.json("show bgp ipv4 unicast summary json");
        v["peers"][BGPD_ADDR]["state"] == "Established"
    }

    fn route(&self, prefix: &str) -> Option<PeerRoute> {
        parse_route(&self.json(&format!("show bgp ipv4 unicast {prefix} json")))
    }

    fn announce(&mut self) {
        self.network(true);
    }

    fn withdraw(&mut self) {
        self.network(false);
    }

    fn kill_and_restart(&mut self) {
        self.kill();
        self.relaunch();
    }
}

impl Frr {
    /// SIGKILL: no Cease, the connection just dies (a crash, as its peers see it).
    pub fn kill(&mut self) {
        self.daemon.kill();
    }

    /// Start again with the same configuration, after [`Frr::kill`].
    pub fn relaunch(&mut self) {
        if let Err(e) = self.launch() {
            panic!("{e}");
        }
        wait_until(Duration::from_secs(10), || {
            !self.vtysh(&["show bgp summary"]).is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_frr_json() {
        let v = serde_json::json!({"prefix":"10.10.1.0/24","paths":[{"aspath":{"string":"64512 65001","segments":[]},
            "origin":"IGP","locPrf":100,"nexthops":[{"ip":"10.99.0.1"}]}]});
        let r = parse_route(&v).unwrap();
        assert_eq!(r.as_path, vec![64512, 65001]);
        assert_eq!(
            (r.next_hop.as_str(), r.origin.as_str(), r.local_pref),
            ("10.99.0.1", "IGP", Some(100))
        );
        assert!(parse_route(&serde_json::json!({})).is_none());
        // iBGP, originated by the peer: "Local" is no AS.
        let v = serde_json::json!({"paths":[{"aspath":{"string":"Local"},"origin":"IGP","nexthops":[{"ip":"10.99.0.1"}]}]});
        assert!(parse_route(&v).unwrap().as_path.is_empty());
    }
}
