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
    /// The `spec` fields margay models for this kind, which it rewrites; `None` when it
    /// models them all. An update of a kind that leaves some out keeps the others as the
    /// stored resource has them ([`keep_unmodelled`]).
    fn modelled_spec_fields(&self) -> Option<&'static [&'static str]> {
        None
    }
}

/// Annotations under this prefix are margay's own (settings Calico's spec cannot hold).
pub const MARGAY_ANNOTATIONS: &str = "margay.dev/";

/// What margay writes (`new`) over the resource as it is stored (`stored`): `new`'s spec
/// replaces the `modelled` fields, and every other spec field, label and annotation of
/// `stored` stays (Calico's fields margay does not model, such as a BGPPeer's
/// `sourceAddress`; a user's labels; Calico's `projectcalico.org/metadata`), so a rewrite by
/// margay loses nothing another tool wrote. margay's own annotations (`margay.dev/`) are
/// `new`'s alone: one it no longer sets goes.
pub fn keep_unmodelled(new: CrdObject, stored: &CrdObject, modelled: &[&str]) -> CrdObject {
    let mut spec = match &stored.spec {
        serde_json::Value::Object(fields) => fields
            .iter()
            .filter(|(k, _)| !modelled.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        _ => serde_json::Map::new(),
    };
    if let serde_json::Value::Object(fields) = new.spec {
        spec.extend(fields);
    }
    let mut labels = stored.labels.clone();
    labels.extend(new.labels);
    let mut annotations: BTreeMap<String, String> = stored
        .annotations
        .iter()
        .filter(|(k, _)| !k.starts_with(MARGAY_ANNOTATIONS))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.extend(new.annotations);
    CrdObject {
        name: new.name,
        labels,
        annotations,
        spec: serde_json::Value::Object(spec),
    }
}

pub mod manifests;
pub mod model_codecs;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(
        spec: serde_json::Value,
        labels: &[(&str, &str)],
        notes: &[(&str, &str)],
    ) -> CrdObject {
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        CrdObject {
            name: "peer-a".into(),
            labels: map(labels),
            annotations: map(notes),
            spec,
        }
    }

    #[test]
    fn a_rewrite_keeps_what_margay_does_not_model_and_replaces_what_it_does() {
        let stored = object(
            json!({"peerIP": "192.0.2.1", "asNumber": 65001, "keepaliveTime": "30s",
                   "sourceAddress": "None", "filters": ["f"]}),
            &[("team", "net")],
            &[
                ("projectcalico.org/metadata", "{\"uid\":\"u\"}"),
                ("margay.dev/passive", "true"),
                ("margay.dev/max-prefixes", "10"),
            ],
        );
        let new = object(
            json!({"peerIP": "192.0.2.1", "asNumber": 65002}),
            &[],
            &[("margay.dev/max-prefixes", "20")],
        );
        let modelled = ["peerIP", "asNumber", "keepaliveTime", "filters"];
        let merged = keep_unmodelled(new, &stored, &modelled);
        assert_eq!(
            merged.spec,
            json!({"peerIP": "192.0.2.1", "asNumber": 65002, "sourceAddress": "None"}),
            "modelled fields are margay's to drop; sourceAddress stays"
        );
        assert_eq!(merged.labels, stored.labels);
        assert_eq!(
            merged.annotations,
            BTreeMap::from([
                ("margay.dev/max-prefixes".to_owned(), "20".to_owned()),
                (
                    "projectcalico.org/metadata".to_owned(),
                    "{\"uid\":\"u\"}".to_owned()
                ),
            ]),
            "margay's passive annotation it no longer sets goes; Calico's stays"
        );
    }
}
