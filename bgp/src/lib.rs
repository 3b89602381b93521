//! margay's BGP speaker, sans-IO: what a BGP speaker decides, with no sockets, no clock and no
//! runtime. Inputs go in, outputs come back; bgpd's tokio tasks move the bytes and timers.
//!
//! - `fsm`: the RFC 4271 session state machine, one per peer; events in, actions out.
//! - `rib`: Adj-RIB-In per peer, the Loc-RIB with the decision process, Adj-RIB-Out per
//!   peer; interned attributes; route reflection.
//! - `policy`: import, export and kernel rules, generated from the pools' modes (Calico's
//!   `bird_ipam.cfg`, as data), and their evaluation.
//!
//! Depends only on the codec (`bgp-wire`) and small data crates: never on tokio, the
//! datastore or the kernel.

pub mod fsm;
pub mod policy;
pub mod rib;
