//! Facts of the network every crate states the same way, and nothing else:
//!
//! - [`IpFamily`]: IPv4 or IPv6, of an address or a net, with its name and width;
//! - [`asn`]: which AS numbers are reserved (0, AS_TRANS);
//! - [`workload`]: the host-side name of a workload's interface (Calico's `cali…`).
//!
//! A leaf crate: nothing of ours below it, so routewriter and the CLI can use it without the
//! datastore. What a family means to one crate (its device, its NAT table, its label in a
//! metric) stays with that crate.

pub mod asn;
mod family;
pub mod workload;

pub use family::IpFamily;
