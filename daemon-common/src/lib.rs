//! What margay's two long-lived daemons, bgpd and routewriter, share and nothing else needs:
//!
//! - `config`: the layered configuration (a TOML file under `MARGAY_` environment overrides)
//!   and its `[log]` section;
//! - `logging`: the tracing subscriber set up from that section and `RUST_LOG`;
//! - `observe`: the HTTP listener for metrics, status and probes, the Prometheus text
//!   writer, and the client of routewriter's status (which bgpctl uses too).
//!
//! What each daemon reports, and its own sections of the configuration, stay with it. No
//! crate of ours below this one: it knows neither the datastore, nor BGP, nor the kernel.

pub mod config;
pub mod logging;
pub mod observe;
