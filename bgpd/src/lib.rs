//! bgpd, margay's node daemon: the control plane of one node (BIRD + confd in one process),
//! and bgpctl, the operator's CLI that talks to it over the gRPC API.
//!
//! - `bgp`: the BGP speaker (FSM, RIBs, policy, sessions).
//! - `cluster`: the cluster brain: peers, originated routes and policy derived from the
//!   datastore, live.
//! - `config`: the TOML configuration with `MARGAY_` environment overrides.
//! - `api`: the gRPC server (unix socket, optional TCP with mutual TLS), health and reflection.
//! - `daemon`: start-up, signals and clean shutdown of bgpd.
//! - `dataplane`: the desired kernel state of this node, served to routewriter.
//! - `datastore`: the connection to the cluster datastore, kept current and reported.
//! - `hugepages`: the daemons' allocator (huge pages for the tables of a big RIB).
//! - `ctl`: the client side used by bgpctl (and by tests).
//! - `logging`: one line per event through `tracing`.
//! - `metrics`: bgpd's Prometheus metrics, readiness, liveness and status over HTTP.
//! - `observe`: the HTTP listener and Prometheus writer bgpd and routewriter share.
//! - `registration`: this node and the configured default pools, written at start.
//! - `resident`: memory start-up used, given back once it is over.
//! - `routewriter`: the dataplane agent that makes the kernel match the desired state.

pub mod api;
pub mod bgp;
pub mod cluster;
pub mod config;
pub mod ctl;
pub mod daemon;
pub mod dataplane;
pub mod datastore;
pub mod hugepages;
pub mod logging;
pub mod metrics;
pub mod observe;
pub mod registration;
pub mod resident;
pub mod routewriter;
pub mod signals;

/// The version of margay this binary was built from.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
