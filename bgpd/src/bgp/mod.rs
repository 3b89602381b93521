//! The BGP speaker: the state machine and the RIBs (sans-IO), and the tokio tasks that
//! drive them over TCP.
//!
//! - `fsm`: RFC 4271 session state machine, one per peer; events in, actions out.
//! - `rib`: Adj-RIB-In, Loc-RIB with the decision process, Adj-RIB-Out; interned attributes.
//! - `session`: the per-peer tokio task that owns TCP and timers and drives the FSM.
//! - `speaker`: the task that owns the RIB and the peers; [`SpeakerHandle`] is its API.

pub mod fsm;
pub mod policy;
pub mod rib;
pub mod session;
pub mod speaker;

pub use speaker::{
    Announcement, KernelSink, PeerOrigin, PeerSpec, PeerStatus, SpeakerConfig, SpeakerError,
    SpeakerHandle, Table,
};

use std::net::{Ipv4Addr, SocketAddr};

use crate::config::BgpConfig;

/// Start the speaker with the configuration's peers and announcements.
pub async fn start_from_config(
    config: &BgpConfig,
    node_address: Option<Ipv4Addr>,
    kernel: Option<std::sync::Arc<dyn KernelSink>>,
) -> Result<SpeakerHandle, SpeakerError> {
    let router_id = config
        .router_id
        .or(node_address)
        .unwrap_or(Ipv4Addr::UNSPECIFIED);
    let speaker = speaker::start(SpeakerConfig {
        local_as: bgp_wire::Asn(config.as_number),
        router_id,
        listen: SocketAddr::from((Ipv4Addr::UNSPECIFIED, config.listen_port)),
        kernel,
    });
    for a in &config.announce {
        let prefix = bgp_wire::Ipv4Prefix::new(a.prefix.network(), a.prefix.prefix_len());
        let Some(prefix) = prefix else { continue };
        speaker
            .announce(Announcement {
                prefix,
                next_hop: a.next_hop,
                // Validated when the configuration was loaded.
                communities: a
                    .communities
                    .iter()
                    .filter_map(|c| c.parse().ok())
                    .collect(),
            })
            .await?;
    }
    for p in &config.peers {
        let mut spec = PeerSpec::new(p.address, bgp_wire::Asn(p.as_number));
        spec.passive = p.passive;
        spec.port = p.port.unwrap_or(179);
        spec.hold_time = p.hold_time.unwrap_or(240);
        spec.keepalive = p.keepalive;
        spec.origin = PeerOrigin::Config;
        speaker.add_peer(spec).await?;
    }
    Ok(speaker)
}
