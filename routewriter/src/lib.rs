//! routewriter: margay's dataplane agent (Felix's route table, VXLAN and NAT managers in one).
//! It subscribes to bgpd's `Dataplane.Watch` stream of desired kernel state and makes the kernel
//! match it: routes tagged with its protocol, the VXLAN devices (`vxlan.calico` for IPv4,
//! `vxlan-v6.calico` for IPv6) with their FDB and neighbour entries, an nftables table per
//! family for natOutgoing, one for the pods' network policy, and the forwarding sysctls. It
//! decides nothing (bgpd compiles the policy): it reconciles
//! desired against actual, repairs drift, and never touches what it does not own. Both address
//! families go through one mechanism, with the family as a parameter.
//!
//! - `config`: the TOML configuration (`[node]`, `[routewriter]`, `[log]`), `MARGAY_` overrides.
//! - `routes`: the address family, prefixes and routes of both families, held compactly.
//! - `desired`: the desired state built from the stream (sans-IO), with its revision for resume.
//! - `reconcile`: the pure diff of desired against actual, as lists of operations (sans-IO).
//! - `kernel`: rtnetlink reads and batched writes, every write counted.
//! - `host`: what the agent asks of the host (`kernel`, `nat`, `policy`) as one trait, so its
//!   event handling is unit-tested against a recording fake.
//! - `monitor`: the netlink multicast listener that reports changes made by others.
//! - `nft`: the `nft` binary (list a table, run an atomic script) and interval-set elements.
//! - `nat`: natOutgoing's tables.
//! - `policy`: network policy of the pod interfaces, enforced in `table inet margay-policy`.
//! - `metrics`: the counters and the Prometheus text / status listener (its client and the
//!   status's text are `daemon_common::observe::status`, which bgpctl shares).
//! - `agent`: the tokio wiring: stream client, monitor, periodic resync, signals.
//!
//! It talks to bgpd only over the API (`proto`), never to the datastore.

pub mod agent;
pub mod config;
pub mod desired;
pub mod host;
pub mod kernel;
pub mod metrics;
pub mod monitor;
pub mod nat;
pub mod nft;
pub mod policy;
pub mod reconcile;
pub mod routes;
