//! BIRD configured the way Calico's confd configures it for the node-to-node mesh (see
//! shared/reference/calico.md §1.2–1.5), for either family and for BIRD 1.6 or BIRD 2, and a
//! client for BIRD's control socket that keeps its connection, so a benchmark can ask
//! hundreds of daemons for their route counts every few milliseconds without starting a
//! `birdc` process each time.
//!
//! One configuration is one daemon of one family, as calico-node runs `bird` (IPv4) and
//! `bird6` (IPv6) side by side; the family is that of the node's address, and BIRD 2 gets the
//! same configuration in its own syntax (the family's channel inside each protocol). What
//! the configuration holds: router id (the node's IPv4 address, also for IPv6), device and
//! direct protocols (so `gateway recursive` resolves next hops), optionally the kernel
//! protocol (learn, persist, export through `calico_kernel_programming`: BIRD programs
//! no-encapsulation pools' routes, never VXLAN pools'), a static protocol with a blackhole
//! per own block, Calico's export filter (own confirmed blocks, then anything in a pool), the
//! `bgp_template` with Calico's timers, and one `Mesh_<addr>` protocol per other node,
//! passive toward the lexically larger address so each pair has one connector. Left out:
//! communities, service routes and BGPFilters (none configured). A benchmark leaves the
//! kernel protocol out: it must not write the kernel's tables, and nothing it measures
//! depends on it.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use ipnet::IpNet;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Calico's default cluster AS.
pub const AS: u32 = 64512;

/// The protocol name confd gives a mesh peer: `Mesh_10_77_1_2`, `Mesh_fd00__2`.
pub fn mesh_name(peer: impl Into<IpAddr>) -> String {
    format!("Mesh_{}", peer.into().to_string().replace(['.', ':'], "_"))
}

/// Whether `me` waits for `peer` to connect: confd makes the side whose peer has the
/// lexically larger address string passive, so exactly one side of a pair connects.
pub fn passive_toward(me: impl Into<IpAddr>, peer: impl Into<IpAddr>) -> bool {
    peer.into().to_string() > me.into().to_string()
}

/// The BIRD a configuration is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// BIRD 1.6, Calico's: `bird` for IPv4, `bird6` for IPv6, options at protocol level.
    Bird1,
    /// BIRD 2: one binary, import/export and the BGP route options in an `ipv4 { }` or
    /// `ipv6 { }` channel.
    Bird2,
}

/// A pool as confd's templates see it: its CIDR, and whether VXLAN carries it (then BIRD
/// still exports its blocks but never programs them: Felix does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub cidr: IpNet,
    pub vxlan: bool,
}

/// One node's BIRD of one family: everything confd reads from the datastore for it.
#[derive(Debug, Clone)]
pub struct NodeConfig<'a> {
    /// The node's IPv4 address (Calico's router id, also for bird6).
    pub router_id: Ipv4Addr,
    /// The node's address of this configuration's family: its sessions' source address.
    pub address: IpAddr,
    /// The node's own confirmed blocks of that family.
    pub blocks: &'a [IpNet],
    /// The cluster's pools of that family.
    pub pools: &'a [Pool],
    /// Every node's address of that family; the node's own is skipped.
    pub peers: &'a [IpAddr],
    /// With the kernel protocol (Calico's): BIRD writes the routes it learns into the kernel.
    pub kernel: bool,
    /// A file for Calico's default logging (`log ... all` and `debug { states }` on the
    /// sessions), or `None` for none at all.
    pub log: Option<&'a Path>,
}

impl NodeConfig<'_> {
    /// The node's configuration file for `dialect`. An address, block or pool of the other
    /// family than `address` is refused (confd renders each family's file from its own keys).
    pub fn render(&self, dialect: Dialect) -> Result<String, String> {
        let v6 = self.address.is_ipv6();
        let family = if v6 { "IPv6" } else { "IPv4" };
        let wrong = |what: &str, x: &dyn std::fmt::Display| {
            format!(
                "{what} {x} is not {family} like the node's address {}: one BIRD configuration holds one family",
                self.address
            )
        };
        if let Some(b) = self.blocks.iter().find(|b| b.addr().is_ipv6() != v6) {
            return Err(wrong("block", b));
        }
        if let Some(p) = self.pools.iter().find(|p| p.cidr.addr().is_ipv6() != v6) {
            return Err(wrong("pool", &p.cidr));
        }
        if let Some(p) = self.peers.iter().find(|p| p.is_ipv6() != v6) {
            return Err(wrong("peer", p));
        }
        Ok(Text {
            dialect,
            channel: if v6 { "ipv6" } else { "ipv4" },
            router_id: self.router_id,
            address: self.address,
            blocks: self.blocks.iter().map(ToString::to_string).collect(),
            pools: self
                .pools
                .iter()
                .map(|p| (p.cidr.to_string(), p.vxlan))
                .collect(),
            peers: self.peers,
            kernel: self.kernel,
            log: self.log,
        }
        .write())
    }
}

/// The IPv4 bird.cfg of a benchmark's node (BIRD 1.6, no kernel protocol, one pool).
/// `log`: as [`NodeConfig::log`].
pub fn config(
    me: Ipv4Addr,
    blocks: &[ipnet::Ipv4Net],
    pool: &str,
    peers: &[Ipv4Addr],
    log: Option<&Path>,
) -> String {
    let peers: Vec<IpAddr> = peers.iter().map(|&p| p.into()).collect();
    Text {
        dialect: Dialect::Bird1,
        channel: "ipv4",
        router_id: me,
        address: me.into(),
        blocks: blocks.iter().map(ToString::to_string).collect(),
        // As given: BIRD names a pool that is not a prefix when it parses the file.
        pools: vec![(pool.to_owned(), false)],
        peers: &peers,
        kernel: false,
        log,
    }
    .write()
}

/// What the renderer writes, the prefixes already in text.
struct Text<'a> {
    dialect: Dialect,
    /// BIRD 2's channel of the family, "ipv4" or "ipv6".
    channel: &'static str,
    router_id: Ipv4Addr,
    address: IpAddr,
    blocks: Vec<String>,
    /// (CIDR, VXLAN)
    pools: Vec<(String, bool)>,
    peers: &'a [IpAddr],
    kernel: bool,
    log: Option<&'a Path>,
}

impl Text<'_> {
    /// `  ipv6;` (BIRD 2's channel line for protocols with default filters), or nothing.
    fn channel_line(&self) -> String {
        match self.dialect {
            Dialect::Bird1 => String::new(),
            Dialect::Bird2 => format!("  {};\n", self.channel),
        }
    }

    /// `body` as protocol-level lines (BIRD 1.6) or inside the family's channel (BIRD 2).
    fn in_channel(&self, body: &[&str]) -> String {
        match self.dialect {
            Dialect::Bird1 => body.iter().map(|l| format!("  {l}\n")).collect(),
            Dialect::Bird2 => {
                let inner: String = body.iter().map(|l| format!("    {l}\n")).collect();
                format!("  {} {{\n{inner}  }};\n", self.channel)
            }
        }
    }

    fn write(&self) -> String {
        let mut c = String::new();
        if let Some(log) = self.log {
            c.push_str(&format!("log \"{}\" all;\n", log.display()));
        }
        c.push_str(&format!("router id {};\n\n", self.router_id));
        // bird_aggr.cfg: the node's blocks as blackholes (the protocol only when there are
        // some), and calico_aggr(): confirmed own blocks are exported whole, their
        // more-specifics never.
        if !self.blocks.is_empty() {
            c.push_str(&format!("protocol static {{\n{}", self.channel_line()));
            for b in &self.blocks {
                c.push_str(&format!("  route {b} blackhole;\n"));
            }
            c.push_str("}\n\n");
        }
        c.push_str("function calico_aggr ()\n{\n");
        for b in &self.blocks {
            c.push_str(&format!(
                "  if ( net = {b} ) then {{ accept; }}\n  if ( net ~ {b} ) then {{ reject; }}\n"
            ));
        }
        c.push_str("}\n\n");
        // bird_ipam.cfg: what may go to BGP peers, and what BIRD may write into the kernel.
        c.push_str("function calico_export_to_bgp_peers ()\n{\n  calico_aggr();\n");
        for (p, _) in &self.pools {
            c.push_str(&format!("  if ( net ~ {p} ) then {{ accept; }}\n"));
        }
        c.push_str("}\n\n");
        if self.kernel {
            c.push_str("filter calico_kernel_programming\n{\n");
            for (p, vxlan) in &self.pools {
                // VXLAN routes are Felix's (routewriter's); a no-encapsulation pool's go
                // via the BGP next hop.
                let action = if *vxlan { "reject" } else { "accept" };
                c.push_str(&format!("  if ( net ~ {p} ) then {{ {action}; }}\n"));
            }
            c.push_str("  accept;\n}\n\n");
            c.push_str(&format!(
                "protocol kernel {{\n  learn;\n  persist;\n  scan time 2;\n{}  graceful restart;\n  \
                 merge paths on;\n}}\n\n",
                self.in_channel(&["import all;", "export filter calico_kernel_programming;"])
            ));
        }
        // bird.cfg proper.
        c.push_str(&format!(
            "protocol device {{\n  scan time 2;\n}}\n\n\
             protocol direct {{\n{}  interface -\"cali*\", -\"kube-ipvs*\", \"*\";\n}}\n\n",
            self.channel_line()
        ));
        let debug = if self.log.is_some() {
            "debug { states };"
        } else {
            "debug off;"
        };
        c.push_str(&format!(
            "template bgp bgp_template {{\n  {debug}\n  description \"Connection to BGP peer\";\n  \
             local as {AS};\n  multihop;\n{}  graceful restart;\n  connect delay time 2;\n  \
             connect retry time 5;\n  error wait time 5,30;\n}}\n\n",
            self.in_channel(&[
                "gateway recursive;",
                "import all;",
                "export filter { calico_export_to_bgp_peers(); reject; };",
                "add paths on;",
            ])
        ));
        let me = self.address;
        for &peer in self.peers.iter().filter(|&&p| p != me) {
            c.push_str(&format!(
                "protocol bgp {} from bgp_template {{\n  ttl security off;\n  multihop;\n  \
                 neighbor {peer} as {AS};\n  source address {me};\n",
                mesh_name(peer)
            ));
            if passive_toward(me, peer) {
                c.push_str("  passive on; # Mesh is unidirectional, peer will connect to us.\n");
            }
            c.push_str("}\n\n");
        }
        c
    }
}

/// A connection to one BIRD's control socket (what `birdc -s` talks to).
pub struct BirdCtl {
    io: BufReader<UnixStream>,
}

impl BirdCtl {
    /// Connects and reads the greeting ("0001 BIRD 1.6.8 ready.").
    pub async fn connect(socket: &Path) -> std::io::Result<BirdCtl> {
        let stream = UnixStream::connect(socket).await?;
        let mut ctl = BirdCtl {
            io: BufReader::new(stream),
        };
        ctl.reply().await?;
        Ok(ctl)
    }

    /// Sends one command; its reply, every line without the reply codes. A BIRD error reply
    /// (codes 8xxx and 9xxx) is an error carrying BIRD's words.
    pub async fn command(&mut self, cmd: &str) -> std::io::Result<String> {
        self.io
            .get_mut()
            .write_all(format!("{}\n", cmd.trim()).as_bytes())
            .await?;
        self.reply().await
    }

    /// Reads reply lines until the last one: "NNNN text" (a code, then a space), where
    /// "NNNN-text" and " text" continue.
    async fn reply(&mut self) -> std::io::Result<String> {
        let mut text = String::new();
        loop {
            let mut line = String::new();
            if self.io.read_line(&mut line).await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "BIRD closed its control socket",
                ));
            }
            let b = line.as_bytes();
            let coded = b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit);
            text.push_str(if coded { &line[5..] } else { line.trim_start() });
            if coded && b[4] == b' ' {
                if matches!(b[0], b'8' | b'9') {
                    return Err(std::io::Error::other(format!("BIRD: {}", text.trim())));
                }
                return Ok(text);
            }
        }
    }

    /// How many networks of `pool` (the prefix and everything inside it) BIRD's table holds.
    pub async fn networks_in(&mut self, pool: &str) -> std::io::Result<usize> {
        let reply = self
            .command(&format!("show route where net ~ [ {pool}+ ] count"))
            .await?;
        parse_count(&reply).ok_or_else(|| {
            std::io::Error::other(format!("unexpected reply to a route count: {reply:?}"))
        })
    }
}

/// The network count of "12 of 12 routes for 12 networks".
pub fn parse_count(reply: &str) -> Option<usize> {
    let words: Vec<&str> = reply.split_whitespace().collect();
    let i = words.iter().position(|w| w.starts_with("network"))?;
    words.get(i.checked_sub(1)?)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_side_of_each_pair_connects() {
        let a: Ipv4Addr = "10.77.1.9".parse().unwrap();
        let b: Ipv4Addr = "10.77.1.10".parse().unwrap();
        // "10.77.1.9" > "10.77.1.10" as strings (not as addresses): b waits, a connects.
        assert!(passive_toward(b, a));
        assert!(!passive_toward(a, b));
        assert_eq!(mesh_name(a), "Mesh_10_77_1_9");
    }

    #[test]
    fn config_has_every_peer_but_itself() {
        let me: Ipv4Addr = "10.77.1.2".parse().unwrap();
        let peers: Vec<Ipv4Addr> = ["10.77.1.1", "10.77.1.2", "10.77.1.3"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        let blocks = vec!["172.20.1.0/26".parse().unwrap()];
        let c = config(me, &blocks, "172.20.0.0/16", &peers, None);
        assert!(c.contains("protocol bgp Mesh_10_77_1_1 from bgp_template"));
        assert!(c.contains("protocol bgp Mesh_10_77_1_3 from bgp_template"));
        assert!(!c.contains("Mesh_10_77_1_2 "));
        assert_eq!(c.matches("passive on").count(), 1);
        assert!(c.contains("route 172.20.1.0/26 blackhole;"));
        assert!(!c.contains("log "));
    }

    fn v6_node<'a>(
        me: &str,
        blocks: &'a [IpNet],
        pools: &'a [Pool],
        peers: &'a [IpAddr],
    ) -> NodeConfig<'a> {
        NodeConfig {
            router_id: "10.96.6.2".parse().unwrap(),
            address: me.parse().unwrap(),
            blocks,
            pools,
            peers,
            kernel: true,
            log: None,
        }
    }

    #[test]
    fn ipv6_names_and_passive_sides_follow_confd() {
        let a: IpAddr = "fd00::2".parse().unwrap();
        let b: IpAddr = "fd00::10".parse().unwrap();
        assert_eq!(mesh_name(a), "Mesh_fd00__2");
        // "fd00::2" > "fd00::10" as strings: b waits for a.
        assert!(passive_toward(b, a) && !passive_toward(a, b));
    }

    #[test]
    fn an_ipv6_config_in_both_dialects() {
        let blocks: Vec<IpNet> = vec!["fd97:6::40/122".parse().unwrap()];
        let pools = vec![
            Pool {
                cidr: "fd97:6::/48".parse().unwrap(),
                vxlan: false,
            },
            Pool {
                cidr: "fd98:6::/48".parse().unwrap(),
                vxlan: true,
            },
        ];
        let peers: Vec<IpAddr> = ["fd96:6::1", "fd96:6::2", "fd96:6::3"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        let node = v6_node("fd96:6::2", &blocks, &pools, &peers);
        let one = node.render(Dialect::Bird1).unwrap();
        let two = node.render(Dialect::Bird2).unwrap();
        for c in [&one, &two] {
            assert!(c.contains("router id 10.96.6.2;"), "{c}");
            assert!(c.contains("route fd97:6::40/122 blackhole;"), "{c}");
            assert!(
                c.contains("protocol bgp Mesh_fd96_6__1 from bgp_template"),
                "{c}"
            );
            assert!(c.contains("source address fd96:6::2;"), "{c}");
            assert!(!c.contains("Mesh_fd96_6__2 "), "{c}");
            // Toward ::3 (the larger string) this node waits.
            assert_eq!(c.matches("passive on").count(), 1, "{c}");
            // The no-encapsulation pool is programmed, the VXLAN one is not.
            assert!(c.contains("if ( net ~ fd97:6::/48 ) then { accept; }\n  if ( net ~ fd98:6::/48 ) then { reject; }"), "{c}");
            assert!(
                c.contains("export filter calico_kernel_programming;"),
                "{c}"
            );
        }
        assert!(!one.contains("ipv6"), "BIRD 1.6 has no channels: {one}");
        assert!(two.contains("  ipv6 {\n    gateway recursive;"), "{two}");
        assert!(two.contains("protocol direct {\n  ipv6;"), "{two}");
    }

    #[test]
    fn a_config_holds_one_family() {
        let blocks: Vec<IpNet> = vec!["172.26.1.0/26".parse().unwrap()];
        let peers: Vec<IpAddr> = vec!["fd96:6::1".parse().unwrap()];
        let e = v6_node("fd96:6::2", &blocks, &[], &peers)
            .render(Dialect::Bird1)
            .unwrap_err();
        assert!(e.contains("block 172.26.1.0/26 is not IPv6"), "{e}");
        let e = v6_node("10.96.6.2", &[], &[], &peers)
            .render(Dialect::Bird2)
            .unwrap_err();
        assert!(e.contains("peer fd96:6::1 is not IPv4"), "{e}");
        // No blocks: no static protocol (confd emits it only with routes).
        let c = v6_node("fd96:6::2", &[], &[], &peers)
            .render(Dialect::Bird1)
            .unwrap();
        assert!(!c.contains("protocol static"), "{c}");
    }

    #[test]
    fn parses_counts() {
        assert_eq!(parse_count("12 of 14 routes for 13 networks\n"), Some(13));
        assert_eq!(parse_count("0 of 0 routes for 0 networks"), Some(0));
        assert_eq!(parse_count("syntax error"), None);
    }
}
