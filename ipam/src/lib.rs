//! IP address management for margay: pools, blocks with node affinity, handles and allocation,
//! and the versioned datastore they live in.
//!
//! - `store`: the datastore contract (a key-value store versioned like etcd's) and its two
//!   backends, SQLite (embedded default) and etcd (clusters).
//! - `resource`: how typed resources are encoded into store values, with a schema version.
//! - `model`: pools, nodes, the IPAM configuration, and their validation.
//! - `selector`: node selectors (`zone == 'a' && has(gpu)`), re-exported from `policy`, which
//!   owns the selector language (policies use it too).
//! - `block`: blocks, affinities and handles; allocation on one block (sans-IO).
//! - `documents`: network-policy documents (policies, workload endpoints, namespaces) stored
//!   as the user's JSON, by kind, namespace and name.
//! - `allocator`: IPAM against the datastore: claims, allocation, release, GC, check.

pub mod allocator;
pub mod block;
pub mod documents;
pub mod error;
pub mod model;
pub mod resource;
pub mod store;

pub use error::IpamError;
pub use policy::selector;
