//! How a kind of margay's objects is kept as a Calico custom resource (group
//! `crd.projectcalico.org`, version `v1`) in the Kubernetes datastore: a [`CrdCodec`] per
//! kind turns margay's stored bytes into the resource's name, labels, annotations and `spec`
//! in Calico's own field layout, and back. The codecs are pure (no client, no I/O): the
//! Kubernetes backend (`crate::kubernetes`) does the requests, the codecs only the shapes,
//! and each crate that owns a kind owns its codec (the `ipam` crate its blocks, affinities
//! and handles; this crate the pools, peers and configuration).
//!
//! margay's names and Calico's may differ (a block `10.0.0.0-26` is Calico's `10-0-0-0-26`):
//! [`CrdCodec::resource_name`] maps margay's name to the resource's, and `decode` gives
//! margay's name back from the resource's content.

use std::collections::BTreeMap;

use crate::contract::Kind;

/// The API group of Calico's custom resources that running clusters hold.
pub const GROUP: &str = "crd.projectcalico.org";
/// Its one version.
pub const VERSION: &str = "v1";

/// The parts of a custom resource a codec reads and writes. `metadata.resourceVersion` and
/// the rest of the metadata stay with the backend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CrdObject {
    /// `metadata.name`.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub spec: serde_json::Value,
}

/// What a codec refuses: a resource that is not in the shape its kind has, or margay bytes
/// that do not decode. Names the kind, the resource and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name}: {reason}")]
pub struct CodecError {
    pub kind: &'static str,
    pub name: String,
    pub reason: String,
}

/// One kind's mapping between margay's stored bytes and a Calico custom resource.
pub trait CrdCodec: Send + Sync + 'static {
    /// margay's kind (its name is the key of the codec).
    fn kind(&self) -> Kind;
    /// The custom resource's kind, e.g. "IPAMBlock".
    fn crd_kind(&self) -> &'static str;
    /// Its plural, e.g. "ipamblocks".
    fn plural(&self) -> &'static str;
    /// Its API group: Calico's, but for margay's own kinds.
    fn group(&self) -> &'static str {
        GROUP
    }
    /// `metadata.name` of the resource that holds margay's object `name`.
    fn resource_name(&self, name: &str) -> String;
    /// The resource that holds margay's object `name` with the stored bytes `value`.
    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError>;
    /// margay's name and stored bytes of a resource; `Ok(None)` when the resource stands for
    /// no object (Calico marks an object it is deleting with `deleted: true`: readers treat it
    /// as absent).
    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError>;
    /// A label selector that finds the resources of margay's objects whose names start with
    /// `name_prefix`, where the kind labels them so (Calico labels affinities by node); `None`
    /// lists all and filters by name.
    fn selector(&self, name_prefix: &str) -> Option<String> {
        let _ = name_prefix;
        None
    }
}

pub mod manifests;
pub mod model_codecs;
