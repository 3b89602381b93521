//! The BGP speaker's tokio side: the tasks that move bytes, timers and messages for the
//! sans-IO `bgp` crate (its FSM, RIBs and policy). It knows nothing of bgpd's configuration
//! file or the datastore: `crate::peering` (the `[bgp]` section) and `crate::cluster` (the
//! datastore) tell it what to do through [`SpeakerHandle`].
//!
//! - `session`: the per-peer task that owns TCP and timers and drives a `bgp::fsm::Fsm`;
//!   `mailbox` carries the speaker's commands to it; `sockopt` sets TCP MD5 and TTL options;
//!   `iface` finds the link-local address for RFC 2545 next hops.
//! - `task`: the task that owns the RIBs and the peers; [`SpeakerHandle`] is its API.
//! - `bfd`: the task that moves BFD packets and timers for the peers that ask for BFD
//!   (`bfd` crate sessions); a session going Down takes the peer's BGP session down.

pub mod bfd;
pub mod iface;
pub mod mailbox;
pub mod session;
pub mod sockopt;
pub mod task;

pub use task::{
    Announcement, KernelSink, PeerOrigin, PeerSpec, PeerStatus, SpeakerConfig, SpeakerError,
    SpeakerHandle, Table,
};
