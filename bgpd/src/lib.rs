//! bgpd, margay's node daemon: the control plane of one node (BIRD + confd in one process).
//! It keeps the cluster's state in the datastore, serves IPAM, runs the BGP speaker (the
//! sans-IO `bgp` crate driven by tokio tasks) and computes the desired kernel state, which
//! routewriter writes. bgpd itself never writes to the kernel.
//!
//! - `api`: the gRPC server (unix socket, optional TCP with mutual TLS), health and reflection.
//! - `api_stats`: the API's call counters and the tower layer that counts (read by `metrics`).
//! - `cluster`: the cluster brain: peers, originated routes and policy derived from the
//!   datastore, live, and this node's VXLAN tunnel address.
//! - `config`: the TOML configuration with `MARGAY_` environment overrides.
//! - `daemon`: start-up, signals and clean shutdown of bgpd.
//! - `dataplane`: the desired kernel state of this node, served to routewriter.
//! - `datastore`: the connection to the cluster datastore, kept current and reported.
//! - `kube_gc`: on the Kubernetes datastore, the release of leaked pod addresses and of deleted
//!   Nodes' blocks (Calico's kube-controllers' IPAM GC).
//! - `kube_services`: on the Kubernetes datastore, the Services' addresses this node announces
//!   (`externalTrafficPolicy: Local` follows the ready endpoints).
//! - `metrics`: bgpd's Prometheus metrics, readiness, liveness and status over HTTP.
//! - `node_address`: on the Kubernetes API, a node's addresses from its Node's InternalIPs.
//! - `peering`: the `[bgp]` section applied to the speaker, at start and on reload.
//! - `registration`: this node and the configured default pools, written at start.
//! - `services`: single service addresses announced from this node under a renewed lease.
//! - `speaker`: the tokio tasks of the BGP speaker (sessions over TCP, the RIB's owner).
//! - `warnings`: what margay cannot act on as written, counted and said on the object.

pub mod api;
pub mod api_stats;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod datastore;
pub mod kube_gc;
pub mod kube_services;
pub mod metrics;
pub mod node_address;
pub mod peering;
pub mod registration;
pub mod services;
pub mod speaker;
pub mod warnings;

/// The version of margay this binary was built from.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
