//! What bgpd and routewriter share to be observed from outside: the small HTTP listener their
//! metrics, status and probe endpoints are served on, and the writer of the Prometheus text
//! format. What each daemon reports, and what its endpoints mean, stays with the daemon
//! (`routewriter::metrics`, `metrics` for bgpd).
//!
//! - `http`: the bounded listener; routes are the caller's handler.
//! - `prom`: metric families, samples and histograms in the text exposition format.

pub mod http;
pub mod prom;
