//! margay's BFD: Bidirectional Forwarding Detection (RFC 5880), asynchronous mode, as run over
//! UDP single-hop (RFC 5881) and multihop (RFC 5883) by bgpd.
//!
//! **Job.** [`packet`] turns the octets of a control packet into a checked [`ControlPacket`]
//! (the stateless reception checks of RFC 5880 §6.8.6, each with its own [`DecodeError`]) and
//! back. [`session`] is one session's state machine (§6.2, §6.8): states AdminDown / Down /
//! Init / Up, the three-way handshake, timers negotiated from DesiredMinTx / RequiredMinRx /
//! Detect Mult, the jittered transmit interval (§6.8.7), poll / final for parameter changes
//! (§6.5, §6.8.3) and diagnostics.
//!
//! **Boundaries.** Sans-IO and dependency-free (bar `thiserror`): the caller passes in every
//! packet, timer expiry and the current [`std::time::Instant`]; the session hands back packets
//! to send, state changes and its next deadline. Sockets, TTL / GTSM checks and demultiplexing
//! by discriminator or address belong to the daemon.
//!
//! **Not supported, on purpose.** Authentication (the A bit): such a packet is refused with
//! [`DecodeError::Authentication`], so a peer configured for auth never comes Up with us (RFC
//! 5880 §6.8.6: with no authentication in use locally, a packet with A set is discarded).
//! Demand mode: we never set D; a peer's D bit is ignored (we keep sending periodically and
//! keep our detection timer, so a peer that really stops sending is declared Down). The Echo
//! function: we advertise Required Min Echo RX Interval 0, "not willing to receive Echo".

#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )
)]

pub mod packet;
pub mod session;

pub use packet::{ControlPacket, DecodeError, Diag, PACKET_LEN, State};
pub use session::{Discard, Output, Session, SessionConfig, SessionConfigError};

/// UDP port of single-hop control packets (RFC 5881 §4).
pub const SINGLE_HOP_PORT: u16 = 3784;
/// UDP port of multihop control packets (RFC 5883 §5).
pub const MULTIHOP_PORT: u16 = 4784;
/// Source ports of control packets come from this range (RFC 5881 §4).
pub const SOURCE_PORTS: std::ops::RangeInclusive<u16> = 49152..=65535;
