//! IP address management for margay: blocks with node affinity, handles, and allocation
//! against the datastore (the `datastore` crate holds the contract, the backends, pools,
//! nodes and the other resources).
//!
//! - `block`: blocks, affinities and handles; allocation on one block (sans-IO).
//! - `steps`: an operation's writes as ordered steps on single objects, and their merge into
//!   one transaction (sans-IO).
//! - `allocator`: IPAM against the datastore: claims, allocation, release, GC, check.
//! - `leaks`: which of a node's pod addresses leaked, on the Kubernetes datastore (sans-IO).
//! - `pod_annotations`: what a Kubernetes pod's Calico annotations ask of IPAM (sans-IO).

pub mod allocator;
pub mod block;
pub mod calico;
pub mod error;
pub mod leaks;
pub mod pod_annotations;
pub mod steps;

pub use error::IpamError;
