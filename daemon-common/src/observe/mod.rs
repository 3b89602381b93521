//! What bgpd and routewriter share to be observed from outside: the small HTTP listener their
//! metrics, status and probe endpoints are served on, and the writer of the Prometheus text
//! format. What each daemon reports, and what its endpoints mean, stays with the daemon
//! (`routewriter::metrics`, `metrics` for bgpd); the one client of the listener sits here too.
//!
//! - `http`: the bounded listener; routes are the caller's handler.
//! - `prom`: metric families, samples and histograms in the text exposition format.
//! - `status`: the client of routewriter's `/status` and its text, for `routewriter status`
//!   and `bgpctl routewriter` (bgpctl links this, not the agent).

pub mod http;
pub mod prom;
pub mod status;
