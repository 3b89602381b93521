//! IP address management for margay: pools, blocks with node affinity, handles and allocation,
//! and the versioned datastore they live in.
//!
//! - `store`: the datastore contract (a key-value store versioned like etcd's) and its two
//!   backends, SQLite (embedded default) and etcd (clusters).
//! - `resource`: how typed resources are encoded into store values, with a schema version.

pub mod resource;
pub mod store;
