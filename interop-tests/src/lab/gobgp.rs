//! GoBGP (Debian's `gobgpd`) as an interop peer: gobgpd has no daemon mode, so it is our
//! child process (killed by PID on drop); driven and queried through the `gobgp` CLI's JSON.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::bgp_peer::{
    BGPD_ADDR, BgpPeer, LOCAL_AS, PEER_ADDR, PEER_PREFIX, PeerRoute, output, wait_until,
};
use super::netns::{Netns, NsProcess};

/// gobgpd's API port inside its namespace (namespaces have their own port space).
const API_PORT: &str = "50051";

pub struct Gobgp {
    ns: String,
    dir: tempfile::TempDir,
    process: Option<NsProcess>,
    announced: bool,
}

impl Gobgp {
    pub fn start(ns: &Netns, asn: u32) -> Result<Gobgp, String> {
        if Command::new("gobgpd").arg("--version").output().is_err() {
            return Err("GoBGP is not installed: apt-get install gobgpd".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let conf = format!(
            "[global.config]\n  as = {asn}\n  router-id = \"{PEER_ADDR}\"\n\n\
             [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{BGPD_ADDR}\"\n    peer-as = {LOCAL_AS}\n\
               [neighbors.timers.config]\n    connect-retry = 2\n"
        );
        std::fs::write(dir.path().join("gobgpd.toml"), conf).map_err(|e| e.to_string())?;
        let mut g = Gobgp {
            ns: ns.name().to_owned(),
            dir,
            process: None,
            announced: false,
        };
        g.launch()?;
        g.announce();
        Ok(g)
    }

    fn launch(&mut self) -> Result<(), String> {
        let log =
            std::fs::File::create(self.dir.path().join("gobgpd.log")).map_err(|e| e.to_string())?;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, "gobgpd", "-f"])
            .arg(self.dir.path().join("gobgpd.toml"))
            .args(["-t", "toml", "--api-hosts"])
            .arg(format!("127.0.0.1:{API_PORT}"))
            .arg("--pprof-disable")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = c.spawn().map_err(|e| e.to_string())?;
        self.process = Some(NsProcess { child });
        if !wait_until(Duration::from_secs(10), || {
            !self.cli(&["global", "-j"]).is_empty()
        }) {
            return Err("gobgpd's API did not come up".into());
        }
        Ok(())
    }

    /// `gobgp -p PORT ARGS` output.
    pub fn cli(&self, args: &[&str]) -> String {
        output(
            Command::new("ip")
                .args(["netns", "exec", &self.ns, "gobgp", "-p", API_PORT])
                .args(args),
        )
    }
}

/// The best path for a prefix from `gobgp global rib -a ipv4 PREFIX -j`.
pub fn parse_route(v: &serde_json::Value, prefix: &str) -> Option<PeerRoute> {
    let paths = v.get(prefix)?.as_array()?;
    let path = paths
        .iter()
        .find(|p| p["best"].as_bool() == Some(true))
        .or(paths.first())?;
    let attrs = path["attrs"].as_array()?;
    let by_type = |t: u64| attrs.iter().find(|a| a["type"].as_u64() == Some(t));
    let origin = match by_type(1).and_then(|a| a["value"].as_u64()) {
        Some(0) => "IGP",
        Some(1) => "EGP",
        Some(2) => "INCOMPLETE",
        _ => "",
    };
    let as_path = by_type(2)
        .and_then(|a| a["as_paths"].as_array())
        .map(|segs| {
            segs.iter()
                .flat_map(|s| s["asns"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a.as_u64().and_then(|a| u32::try_from(a).ok()))
                .collect()
        })
        .unwrap_or_default();
    Some(PeerRoute {
        next_hop: by_type(3)?["nexthop"].as_str()?.to_owned(),
        as_path,
        origin: origin.to_owned(),
        local_pref: by_type(5)
            .and_then(|a| a["value"].as_u64())
            .and_then(|l| u32::try_from(l).ok()),
    })
}

impl BgpPeer for Gobgp {
    fn name(&self) -> &'static str {
        "GoBGP"
    }

    fn established(&self) -> bool {
        let v: serde_json::Value =
            serde_json::from_str(&self.cli(&["neighbor", BGPD_ADDR, "-j"])).unwrap_or_default();
        let s = &v["state"]["session_state"];
        s.as_u64() == Some(6)
            || s.as_str()
                .is_some_and(|s| s.eq_ignore_ascii_case("established"))
    }

    fn route(&self, prefix: &str) -> Option<PeerRoute> {
        let v: serde_json::Value =
            serde_json::from_str(&self.cli(&["global", "rib", "-a", "ipv4", prefix, "-j"])).ok()?;
        let r = parse_route(&v, prefix)?;
        // Only what bgpd sent, not the peer's own routes.
        (r.next_hop != "0.0.0.0").then_some(r)
    }

    fn announce(&mut self) {
        self.cli(&[
            "global",
            "rib",
            "add",
            "-a",
            "ipv4",
            PEER_PREFIX,
            "nexthop",
            PEER_ADDR,
            "origin",
            "igp",
        ]);
        self.announced = true;
    }

    fn withdraw(&mut self) {
        self.cli(&["global", "rib", "del", "-a", "ipv4", PEER_PREFIX]);
        self.announced = false;
    }

    fn kill_and_restart(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.signal_and_wait(libc::SIGKILL, Duration::from_secs(5));
        }
        if let Err(e) = self.launch() {
            panic!("{e}");
        }
        if self.announced {
            self.announce();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gobgp_json() {
        let v = serde_json::json!({"10.10.1.0/24":[{"nlri":{"prefix":"10.10.1.0/24"},"best":true,"attrs":[
            {"type":1,"value":0},{"type":2,"as_paths":[{"segment_type":2,"num":2,"asns":[64512,65001]}]},
            {"type":3,"nexthop":"10.99.0.1"},{"type":5,"value":100}]}]});
        let r = parse_route(&v, "10.10.1.0/24").unwrap();
        assert_eq!(r.as_path, vec![64512, 65001]);
        assert_eq!(
            (r.next_hop.as_str(), r.origin.as_str(), r.local_pref),
            ("10.99.0.1", "IGP", Some(100))
        );
        assert!(parse_route(&v, "10.0.0.0/8").is_none());
    }
}
