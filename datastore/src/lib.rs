//! margay's datastore: the contract every backend keeps, the backends, and the resources
//! kept in it with their model.
//!
//! - `contract`: the core contract ([`Datastore`]: objects of one kind, compare-and-swap on
//!   each object's version, watch of one kind) and the optional [`Atomic`] extension
//!   (multi-key transactions and reads at one store-wide revision).
//! - `store`: [`Store`], the backend chosen at run time, with its extension in use or hidden
//!   (`Store::per_object`).
//! - `syncer`: several kinds listed and watched as one stream (bgpd's brain).
//! - `sqlite` (embedded default), `etcd` (clusters): the backends; both have the extension.
//! - `resource`: how typed resources are encoded into stored values, with a schema version.
//! - `resources`: typed access to them through the core contract ([`Resources`]), with the
//!   cluster's own resources (nodes, BGP configuration, peers, filters).
//! - `model`: pools, nodes, BGP configuration, peers and filters, the IPAM configuration,
//!   and their validation.
//! - `documents`: network-policy documents stored as the user's JSON.
//! - `selector`: node selectors, re-exported from `policy`, which owns the language.
//!
//! IPAM's own resources (blocks, affinities, handles) and the allocator are the `ipam`
//! crate's; they use this crate's contract and resource encoding.

pub mod contract;
pub mod crd;
pub mod documents;
pub mod error;
pub mod etcd;
pub mod kubernetes;
pub mod model;
pub mod resource;
pub mod resources;
pub mod sqlite;
pub mod store;
pub mod syncer;

pub use contract::{
    Atomic, Datastore, Kind, Object, ObjectEvent, ObjectList, ObjectWatch, StoreError, Version,
};
pub use error::ResourceError;
pub use policy::selector;
pub use resources::Resources;
pub use store::Store;
