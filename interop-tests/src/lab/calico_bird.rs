//! BIRD 1.6 configured the way Calico's confd configures it for the node-to-node mesh (see
//! shared/reference/calico.md §1.2–1.5), and a client for BIRD's control socket that keeps
//! its connection, so a benchmark can ask hundreds of daemons for their route counts every
//! few milliseconds without starting a `birdc` process each time.
//!
//! The configuration keeps what shapes a mesh's cost: router id = node address, device and
//! direct protocols (so `gateway recursive` resolves next hops), a static protocol with a
//! blackhole per own block, Calico's export filter (own confirmed blocks, then anything in the
//! pool), the `bgp_template` with Calico's timers, and one `Mesh_<ip>` protocol per other
//! node, passive toward the lexically larger address so each pair has one connector. Left
//! out: the kernel protocol (a benchmark must not write the kernel's tables; nothing it
//! measures depends on it) and communities, service routes and BGPFilters (none configured).

use std::net::Ipv4Addr;
use std::path::Path;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Calico's default cluster AS.
pub const AS: u32 = 64512;

/// The protocol name confd gives a mesh peer: `Mesh_10_77_1_2`.
pub fn mesh_name(peer: Ipv4Addr) -> String {
    format!("Mesh_{}", peer.to_string().replace('.', "_"))
}

/// Whether `me` waits for `peer` to connect: confd makes the side whose peer has the
/// lexically larger address string passive, so exactly one side of a pair connects.
pub fn passive_toward(me: Ipv4Addr, peer: Ipv4Addr) -> bool {
    peer.to_string() > me.to_string()
}

/// The node's whole bird.cfg. `log`: a file for Calico's default logging (`log ... all` and
/// `debug { states }` on the sessions), or `None` for none at all.
pub fn config(
    me: Ipv4Addr,
    blocks: &[ipnet::Ipv4Net],
    pool: &str,
    peers: &[Ipv4Addr],
    log: Option<&Path>,
) -> String {
    let mut c = String::new();
    if let Some(log) = log {
        c.push_str(&format!("log \"{}\" all;\n", log.display()));
    }
    c.push_str(&format!("router id {me};\n\n"));
    // bird_aggr.cfg: the node's blocks as blackholes, and calico_aggr(): confirmed own blocks
    // are exported whole, their more-specifics never.
    c.push_str("protocol static {\n");
    for b in blocks {
        c.push_str(&format!("  route {b} blackhole;\n"));
    }
    c.push_str("}\n\nfunction calico_aggr ()\n{\n");
    for b in blocks {
        c.push_str(&format!(
            "  if ( net = {b} ) then {{ accept; }}\n  if ( net ~ {b} ) then {{ reject; }}\n"
        ));
    }
    c.push_str("}\n\n");
    // bird_ipam.cfg: what may go to BGP peers.
    c.push_str(&format!(
        "function calico_export_to_bgp_peers ()\n{{\n  calico_aggr();\n  \
         if ( net ~ {pool} ) then {{ accept; }}\n}}\n\n"
    ));
    // bird.cfg proper.
    c.push_str(
        "protocol device {\n  scan time 2;\n}\n\n\
         protocol direct {\n  interface -\"cali*\", -\"kube-ipvs*\", \"*\";\n}\n\n",
    );
    let debug = if log.is_some() {
        "debug { states };"
    } else {
        "debug off;"
    };
    c.push_str(&format!(
        "template bgp bgp_template {{\n  {debug}\n  description \"Connection to BGP peer\";\n  \
         local as {AS};\n  multihop;\n  gateway recursive;\n  import all;\n  \
         export filter {{ calico_export_to_bgp_peers(); reject; }};\n  add paths on;\n  \
         graceful restart;\n  connect delay time 2;\n  connect retry time 5;\n  \
         error wait time 5,30;\n}}\n\n"
    ));
    for &peer in peers.iter().filter(|&&p| p != me) {
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

    #[test]
    fn parses_counts() {
        assert_eq!(parse_count("12 of 14 routes for 13 networks\n"), Some(13));
        assert_eq!(parse_count("0 of 0 routes for 0 networks"), Some(0));
        assert_eq!(parse_count("syntax error"), None);
    }
}
