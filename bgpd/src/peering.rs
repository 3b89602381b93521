//! The `[bgp]` section of the configuration applied to the speaker: the speaker started with
//! its peers and announcements, and a reloaded section applied live (SIGHUP); the daemon
//! calls both. The glue from `config` to `speaker`, kept here so that the speaker knows
//! nothing of the configuration file (the file was validated when it was loaded).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::{BgpAnnounce, BgpConfig, BgpPeerConfig};
use crate::speaker::{
    Announcement, KernelSink, PeerOrigin, PeerSpec, SpeakerConfig, SpeakerError, SpeakerHandle,
    sockopt, task,
};

/// Start the speaker with the configuration's peers and announcements.
pub async fn start_from_config(
    config: &BgpConfig,
    node_address: Option<Ipv4Addr>,
    node_address6: Option<Ipv6Addr>,
    kernel: Option<std::sync::Arc<dyn KernelSink>>,
) -> Result<SpeakerHandle, SpeakerError> {
    let router_id = config
        .router_id
        .or(node_address)
        .unwrap_or(Ipv4Addr::UNSPECIFIED);
    let speaker = task::start(SpeakerConfig {
        local_as: bgp_wire::Asn(config.as_number),
        router_id,
        listen: SocketAddr::from((Ipv4Addr::UNSPECIFIED, config.listen_port)),
        ipv6_next_hop: node_address6,
        kernel,
    });
    if config.cluster_id.is_some() {
        speaker
            .set_policy(
                std::sync::Arc::new(bgp::policy::Policy::accept_all()),
                config.cluster_id,
            )
            .await?;
    }
    for a in &config.announce {
        if let Some(a) = announcement(a) {
            speaker.announce(a).await?;
        }
    }
    for p in &config.peers {
        speaker.add_peer(peer_spec(p, config)).await?;
    }
    Ok(speaker)
}

/// The speaker's view of a `[[bgp.peers]]` entry of `bgp` (validated when the file was
/// loaded).
fn peer_spec(p: &BgpPeerConfig, bgp: &BgpConfig) -> PeerSpec {
    let mut spec = PeerSpec::new(p.address, bgp_wire::Asn(p.as_number));
    spec.error_wait = p.error_wait_time.unwrap_or(bgp.error_wait_time);
    spec.passive = p.passive;
    spec.port = p.port.unwrap_or(179);
    spec.hold_time = p.hold_time.unwrap_or(240);
    spec.keepalive = p.keepalive;
    spec.origin = PeerOrigin::Config;
    spec.rr_client = p.rr_client;
    spec.max_prefixes = p.max_prefixes;
    spec.max_prefixes_restart = p.max_prefixes_restart;
    spec.graceful_restart = p.graceful_restart.then(|| {
        let d = task::GracefulRestart::default();
        task::GracefulRestart {
            restart_time: p.restart_time.unwrap_or(d.restart_time),
            stale_time: p.stale_time.unwrap_or(d.stale_time),
        }
    });
    if let Some(f) = &p.families {
        use crate::config::AddressFamily;
        spec.families = task::Families {
            ipv4: f.contains(&AddressFamily::Ipv4),
            ipv6: f.contains(&AddressFamily::Ipv6),
        };
    }
    spec.bfd = p.bfd.and_then(|b| b.session().ok());
    spec.options = bgp::rib::PeerOptions {
        local_as: p.local_as.map(bgp_wire::Asn),
        allow_local_as: p.allow_local_as,
        next_hop: crate::cluster::peers::rib_next_hop(p.next_hop),
        interface: None,
    };
    spec.transport = sockopt::Transport {
        password: sockopt::Password::new(&p.password).ok().flatten(),
        ttl_security_hops: p.ttl_security,
        multihop_ttl: p.multihop,
    };
    spec
}

/// A `[[bgp.announce]]` entry as an announcement (validated when the file was loaded).
fn announcement(a: &BgpAnnounce) -> Option<Announcement> {
    Some(Announcement {
        prefix: bgp_wire::Prefix::new(a.prefix.network(), a.prefix.prefix_len())?,
        next_hop: a.next_hop,
        communities: a
            .communities
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect(),
    })
}

/// What a configuration reload did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Peers whose options changed: their sessions were reset, no other.
    pub reset: Vec<String>,
    pub announced: Vec<String>,
    pub withdrawn: Vec<String>,
    /// Settings that changed but take effect only after a restart of bgpd.
    pub need_restart: Vec<&'static str>,
}

/// Apply the `[bgp]` section of a reloaded configuration: peers added, removed or (when
/// their options changed) reset, announcements added and withdrawn; nothing else touched.
pub async fn reload(
    speaker: &SpeakerHandle,
    old: &BgpConfig,
    new: &BgpConfig,
) -> Result<ReloadReport, SpeakerError> {
    let mut r = ReloadReport::default();
    if old.as_number != new.as_number {
        r.need_restart.push("bgp.as");
    }
    if old.router_id != new.router_id {
        r.need_restart.push("bgp.router_id");
    }
    if old.listen_port != new.listen_port {
        r.need_restart.push("bgp.listen_port");
    }
    if old.cluster_id != new.cluster_id {
        r.need_restart.push("bgp.cluster_id");
    }
    if old.external_transit != new.external_transit {
        r.need_restart.push("bgp.external_transit");
    }
    if old.error_wait_time != new.error_wait_time {
        // `[[bgp.peers]]` sessions take it now (those without their own); the cluster's
        // sessions at the next start.
        r.need_restart
            .push("bgp.error_wait_time (for cluster peers)");
    }
    let before: BTreeMap<IpAddr, PeerSpec> = old
        .peers
        .iter()
        .map(|p| (p.address, peer_spec(p, old)))
        .collect();
    let after: BTreeMap<IpAddr, PeerSpec> = new
        .peers
        .iter()
        .map(|p| (p.address, peer_spec(p, new)))
        .collect();
    for (addr, spec) in &before {
        match after.get(addr) {
            Some(s) if s == spec => {}
            Some(_) => {
                speaker.delete_peer(*addr).await?;
                r.reset.push(spec.name());
            }
            None => {
                speaker.delete_peer(*addr).await?;
                r.removed.push(spec.name());
            }
        }
    }
    for (addr, spec) in after {
        if before.get(&addr) == Some(&spec) {
            continue;
        }
        if !before.contains_key(&addr) {
            r.added.push(spec.name());
        }
        speaker.add_peer(spec).await?;
    }
    let routes = |c: &BgpConfig| -> BTreeMap<String, Announcement> {
        c.announce
            .iter()
            .filter_map(announcement)
            .map(|a| (a.prefix.to_string(), a))
            .collect()
    };
    let (was, now) = (routes(old), routes(new));
    for (k, a) in &was {
        if !now.contains_key(k) {
            speaker.withdraw(a.prefix).await?;
            r.withdrawn.push(k.clone());
        }
    }
    for (k, a) in now {
        if was.get(&k) != Some(&a) {
            speaker.announce(a).await?;
            r.announced.push(k);
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_peer_takes_the_session_options_a_bgppeer_has() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            f.path(),
            "[bgp]\nas = 64512\nerror_wait_time = [2, 20]\n[[bgp.peers]]\naddress = \"10.0.0.3\"\n\
             as = 65000\nlocal_as = 65010\nallow_local_as = 2\nnext_hop = \"Keep\"\n",
        )
        .unwrap();
        let env = [("MARGAY_NODE__NAME".to_owned(), "n".to_owned())];
        let c =
            crate::config::Config::load_with_env(Some(f.path()), Some(env.into_iter().collect()))
                .unwrap();
        let spec = peer_spec(&c.bgp.peers[0], &c.bgp);
        assert_eq!(spec.options.local_as, Some(bgp_wire::Asn(65010)));
        assert_eq!(spec.options.allow_local_as, 2);
        assert_eq!(spec.options.next_hop, bgp::rib::NextHopMode::Keep);
        assert_eq!(spec.error_wait, [2, 20]);
    }
}
