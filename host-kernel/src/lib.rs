//! What the CNI plugin and routewriter share to talk to the host's kernel, and nothing else:
//!
//! - `netlink`: the one netlink error type ([`netlink::NlError`]) and the decoding of the
//!   kernel's refusals with their extended-ACK text ([`netlink::Nlmsgerr`]);
//! - `sysctl`: reading and writing `/proc/sys` values, only where they differ, and the
//!   settings of a workload interface's host end that both keep (Calico's).
//!
//! Each netlink client (its socket, requests and dumps) stays with its crate: the plugin's is
//! a few blocking requests per pod, routewriter's a batching writer of 100k routes. A leaf
//! crate: nothing of ours below it, and nothing here knows pods, pools or bgpd.

pub mod netlink;
pub mod sysctl;
