//! IP address management for margay: pools, blocks with node affinity, handles and allocation,
//! and the versioned datastore they live in (SQLite embedded, etcd for clusters).
//!
//! Empty so far: the datastore and IPAM issues fill it in.
