//! margay's BGP-4 wire codec.
//!
//! **Job.** Turn bytes from a peer into typed messages and typed messages into bytes, for the
//! subset margay speaks: OPEN with capabilities, UPDATE (IPv4/IPv6 unicast, the attributes
//! of RFC 4271, 1997, 4456, 4360, 4760, 6793, 8092, 8950), NOTIFICATION, KEEPALIVE and
//! ROUTE-REFRESH (RFC 2918, 7313).
//!
//! **Boundaries.** Sans-IO and dependency-free (bar `thiserror`): no sockets, no tokio, no
//! knowledge of peers beyond the negotiated [`SessionParams`]. Policy (which routes, which
//! AS to prepend, whether a peer's AS is the expected one) belongs to the speaker.
//!
//! **Untrusted input.** Decoders read through a small private cursor whose every read can
//! fail and none can index out of bounds; there is no unchecked arithmetic (the lints below
//! enforce both), and every loop consumes input or stops. Any input gives a value or an
//! error, never a panic or a hang; this is fuzzed (`fuzz/`). Every [`DecodeError`]
//! names the NOTIFICATION to send; UPDATEs are classified by RFC 7606 into a [`Disposition`].
//!
//! **Map.** Framing: [`split_message`], [`decode_message`], [`Message::encode`]. Messages:
//! [`Open`] (+ [`Capability`]), [`Update`] / [`decode_update`] / [`UpdateDecode`],
//! [`Notification`], [`RouteRefresh`], [`encode_keepalive`]. Attributes: [`PathAttributes`]
//! and [`attributes`]. Prefixes: [`Ipv4Prefix`], [`Ipv6Prefix`], [`NlriIter`]. Session state:
//! [`SessionParams`]. Adj-RIB-Out packing: [`pack`].
//!
//! **Layers.** Modules depend only on modules below them, never in a cycle: `cursor` and
//! `types`; `params` (the negotiated [`SessionParams`]) and `error`; `nlri` and `header`
//! (framing); the messages `notification`, `open`, `route_refresh`; `session` (negotiation
//! from two OPENs) and `attributes`; `update`; `message` (any message); `pack` on top.
//!
//! **Typical use** (the session task):
//!
//! ```
//! use bgp_wire::{Decoded, SessionParams, Split, decode_message, split_message};
//!
//! let session = SessionParams::default();
//! let mut rx: Vec<u8> = Vec::new();
//! bgp_wire::encode_keepalive(&mut rx);
//! while let Split::Message(len) = split_message(&rx, &session) {
//!     match decode_message(&rx[..len], &session) {
//!         Ok(Decoded::Keepalive) => {}
//!         Ok(other) => { /* hand to the FSM */ let _ = other; }
//!         Err(e) => { /* send e.notification(), close */ let _ = e; break; }
//!     }
//!     rx.drain(..len);
//! }
//! ```

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

pub mod attributes;
mod cursor;
mod error;
mod header;
mod message;
mod nlri;
mod notification;
mod open;
pub mod pack;
mod params;
mod route_refresh;
mod session;
mod types;
mod update;

pub use attributes::{
    Aggregator, AsPath, AsSegment, MpNlri, MpReach, MpUnreach, NextHop, PathAttributes,
    RawAttribute, SegmentType, merge_as4_path,
};
pub use error::{AttrProblem, DecodeError, Disposition, EncodeError, ErrorKind, ProblemKind};
pub use header::{
    HEADER_LEN, Header, MessageType, Split, encode_keepalive, parse_header, split_message,
};
pub use message::{Decoded, Message, decode_message};
pub use nlri::{
    Ipv4Prefix, Ipv6Prefix, NlriIter, NlriPrefix, Prefix, count_nlri, decode_nlri, encode_nlri,
};
pub use notification::{
    CEASE, FSM_ERROR, HOLD_TIMER_EXPIRED, MAX_SHUTDOWN_COMMUNICATION, Notification, cease,
};
pub use open::{BGP_VERSION, Capability, ExtNextHop, GrFamily, GracefulRestart, Open};
pub use params::SessionParams;
pub use route_refresh::{RefreshSubtype, RouteRefresh};
pub use types::{
    Afi, Asn, Community, ExtCommunity, Family, LargeCommunity, MAX_EXTENDED_MESSAGE_LEN,
    MAX_MESSAGE_LEN, Origin, ParseError, Safi,
};
pub use update::{Update, UpdateDecode, UpdateParts, decode_update, split_update};
