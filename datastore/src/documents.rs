//! Network-policy documents in the datastore: Kubernetes and Calico policies, workload
//! endpoints and namespaces, each kept as the user's JSON (so `bgpctl get` gives back what was
//! applied), under `/margay/v1/policy/<kind>/<namespace>/<name>`.
//!
//! This module only stores: what a document means and whether it is valid is the `policy`
//! crate's business, and bgpd checks every document with it before it calls `put`. Writes are
//! compare-and-swap like every other resource's: a `put` with an expected revision applies only
//! over what the caller read, and `update` retries a read-modify-write (a label change) until
//! it wins or gives up.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::{Datastore, Kind, StoreError, Version};
use crate::error::ResourceError;
use crate::resource::{Resource, decode, encode};

/// Where every document lives; the brain watches it with the rest of `/margay/v1/`.
pub const PREFIX: &str = "/margay/v1/policy/";

/// How often `update` retries a read-modify-write that lost a race.
const RETRIES: u32 = 20;

/// The kinds of document, by where they are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DocKind {
    K8sNetworkPolicy,
    NetworkPolicy,
    GlobalNetworkPolicy,
    WorkloadEndpoint,
    Namespace,
}

impl DocKind {
    pub const ALL: [DocKind; 5] = [
        DocKind::K8sNetworkPolicy,
        DocKind::NetworkPolicy,
        DocKind::GlobalNetworkPolicy,
        DocKind::WorkloadEndpoint,
        DocKind::Namespace,
    ];

    /// The kind's folder under [`PREFIX`].
    pub fn dir(self) -> &'static str {
        match self {
            DocKind::K8sNetworkPolicy => "k8snetworkpolicies",
            DocKind::NetworkPolicy => "networkpolicies",
            DocKind::GlobalNetworkPolicy => "globalnetworkpolicies",
            DocKind::WorkloadEndpoint => "workloadendpoints",
            DocKind::Namespace => "namespaces",
        }
    }

    /// Whether documents of the kind live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(
            self,
            DocKind::K8sNetworkPolicy | DocKind::NetworkPolicy | DocKind::WorkloadEndpoint
        )
    }

    fn of_dir(dir: &str) -> Option<DocKind> {
        DocKind::ALL.into_iter().find(|k| k.dir() == dir)
    }

    /// The kind as the datastore contract names it: a document's object name is
    /// `<namespace>/<name>` for namespaced kinds, `<name>` for the others.
    pub fn kind(self) -> Kind {
        match self {
            DocKind::K8sNetworkPolicy => Kind::new(
                "NetworkPolicy (Kubernetes)",
                "/margay/v1/policy/k8snetworkpolicies/",
            ),
            DocKind::NetworkPolicy => {
                Kind::new("NetworkPolicy", "/margay/v1/policy/networkpolicies/")
            }
            DocKind::GlobalNetworkPolicy => Kind::new(
                "GlobalNetworkPolicy",
                "/margay/v1/policy/globalnetworkpolicies/",
            ),
            DocKind::WorkloadEndpoint => {
                Kind::new("WorkloadEndpoint", "/margay/v1/policy/workloadendpoints/")
            }
            DocKind::Namespace => Kind::new("Namespace", "/margay/v1/policy/namespaces/"),
        }
    }
}

/// One document's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DocRef {
    pub kind: DocKind,
    /// Empty for cluster-wide kinds.
    pub namespace: String,
    pub name: String,
}

impl DocRef {
    pub fn new(kind: DocKind, namespace: &str, name: &str) -> Self {
        DocRef {
            kind,
            namespace: if kind.namespaced() {
                namespace.to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
        }
    }

    /// The document's object name within its kind; names and namespaces are checked by the
    /// `policy` crate (DNS labels and subdomains), so they never hold a `/`.
    pub fn object_name(&self) -> String {
        if self.kind.namespaced() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            self.name.clone()
        }
    }

    /// The document's key in the key-value backends.
    pub fn key(&self) -> String {
        self.kind.kind().key(&self.object_name())
    }

    /// The document of `kind` whose object name is `name`.
    pub fn of_object(kind: DocKind, name: &str) -> Option<DocRef> {
        if kind.namespaced() {
            let (ns, name) = name.split_once('/')?;
            Some(DocRef::new(kind, ns, name))
        } else {
            Some(DocRef::new(kind, "", name))
        }
    }

    /// The document a key names, if it is one.
    pub fn of_key(key: &str) -> Option<DocRef> {
        let rest = key.strip_prefix(PREFIX)?;
        let (dir, rest) = rest.split_once('/')?;
        let kind = DocKind::of_dir(dir)?;
        if kind.namespaced() {
            let (ns, name) = rest.split_once('/')?;
            Some(DocRef::new(kind, ns, name))
        } else {
            Some(DocRef::new(kind, "", rest))
        }
    }

    /// The object-name prefix of every document of `kind` in `namespace`, if given and the
    /// kind has one ("" for all).
    pub fn name_prefix(kind: DocKind, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if kind.namespaced() && !ns.is_empty() => format!("{ns}/"),
            _ => String::new(),
        }
    }
}

impl std::fmt::Display for DocRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.kind.namespaced() {
            write!(f, "{} {}/{}", self.kind.dir(), self.namespace, self.name)
        } else {
            write!(f, "{} {}", self.kind.dir(), self.name)
        }
    }
}

/// A stored document: the user's JSON as it was applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    pub json: Value,
}

impl Resource for Document {
    const KIND: &'static str = "policy document";
    const SCHEMA: u32 = 1;
    const PREFIX: &'static str = PREFIX;
}

/// A document read back, with the version to write over.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredDoc {
    pub doc_ref: DocRef,
    pub json: Value,
    pub version: Version,
}

/// The documents of a datastore.
pub struct Documents<'a, D> {
    store: &'a D,
}

impl<'a, D: Datastore> Documents<'a, D> {
    pub fn new(store: &'a D) -> Self {
        Documents { store }
    }

    pub async fn get(&self, r: &DocRef) -> Result<Option<StoredDoc>, ResourceError> {
        Ok(
            match self.store.get(r.kind.kind(), &r.object_name()).await? {
                Some(o) => Some(StoredDoc {
                    doc_ref: r.clone(),
                    json: decode::<Document>(&o.value)?.json,
                    version: o.version,
                }),
                None => None,
            },
        )
    }

    /// Every document of `kind` (in `namespace`, if given), sorted by namespace and name.
    pub async fn list(
        &self,
        kind: DocKind,
        namespace: Option<&str>,
    ) -> Result<Vec<StoredDoc>, ResourceError> {
        let list = self
            .store
            .list(kind.kind(), &DocRef::name_prefix(kind, namespace))
            .await?;
        list.items
            .into_iter()
            .filter_map(|o| {
                let r = DocRef::of_object(kind, &o.name)?;
                Some(decode::<Document>(&o.value).map(|d| StoredDoc {
                    doc_ref: r,
                    json: d.json,
                    version: o.version,
                }))
            })
            .collect::<Result<_, _>>()
            .map_err(Into::into)
    }

    /// Creates or replaces a document (already checked by the caller). With `expected`, only
    /// over that version (`Stale` otherwise). Returns the write's version and whether the
    /// document is new.
    pub async fn put(
        &self,
        r: &DocRef,
        json: &Value,
        expected: Option<Version>,
    ) -> Result<(Version, bool), ResourceError> {
        let (kind, name) = (r.kind.kind(), r.object_name());
        let value = encode(&Document { json: json.clone() });
        for _ in 0..RETRIES {
            let current = self.store.get(kind, &name).await?.map(|o| o.version);
            if let Some(want) = expected
                && current != Some(want)
            {
                return Err(ResourceError::Stale(r.to_string()));
            }
            let written = match current {
                None => self.store.create(kind, &name, value.clone()).await,
                Some(v) => self.store.update(kind, &name, value.clone(), v).await,
            };
            match written {
                Ok(v) => return Ok((v, current.is_none())),
                Err(StoreError::Conflict { .. }) if expected.is_none() => continue,
                Err(StoreError::Conflict { .. }) => {
                    return Err(ResourceError::Stale(r.to_string()));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(ResourceError::Contention {
            what: r.to_string(),
            attempts: RETRIES,
        })
    }

    /// Changes a stored document with `change` (which may refuse), compare-and-swap, retried
    /// while other writers win. `NotFound` if there is none.
    pub async fn update<E>(
        &self,
        r: &DocRef,
        mut change: impl FnMut(&mut Value) -> Result<(), E>,
    ) -> Result<Result<(Version, Value), E>, ResourceError> {
        for _ in 0..RETRIES {
            let Some(doc) = self.get(r).await? else {
                return Err(ResourceError::NotFound(r.to_string()));
            };
            let mut json = doc.json;
            if let Err(e) = change(&mut json) {
                return Ok(Err(e));
            }
            let value = encode(&Document { json: json.clone() });
            match self
                .store
                .update(r.kind.kind(), &r.object_name(), value, doc.version)
                .await
            {
                Ok(v) => return Ok(Ok((v, json))),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ResourceError::Contention {
            what: r.to_string(),
            attempts: RETRIES,
        })
    }

    /// Deletes a document; `NotFound` if there is none.
    pub async fn delete(&self, r: &DocRef) -> Result<(), ResourceError> {
        let (kind, name) = (r.kind.kind(), r.object_name());
        for _ in 0..RETRIES {
            let Some(o) = self.store.get(kind, &name).await? else {
                return Err(ResourceError::NotFound(r.to_string()));
            };
            match self.store.delete(kind, &name, o.version).await {
                Ok(()) => return Ok(()),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ResourceError::Contention {
            what: r.to_string(),
            attempts: RETRIES,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteStore;
    use serde_json::json;

    #[test]
    fn keys_round_trip_and_cluster_wide_kinds_have_no_namespace() {
        let r = DocRef::new(DocKind::K8sNetworkPolicy, "ns1", "allow-dns");
        assert_eq!(
            r.key(),
            "/margay/v1/policy/k8snetworkpolicies/ns1/allow-dns"
        );
        assert_eq!(DocRef::of_key(&r.key()), Some(r));
        let g = DocRef::new(DocKind::GlobalNetworkPolicy, "ignored", "deny-all");
        assert_eq!(g.key(), "/margay/v1/policy/globalnetworkpolicies/deny-all");
        assert_eq!(DocRef::of_key(&g.key()), Some(g));
        assert_eq!(DocRef::of_key("/margay/v1/policy/other/x"), None);
        assert_eq!(DocRef::of_key("/margay/v1/ippools/x"), None);
        assert_eq!(
            DocKind::WorkloadEndpoint
                .kind()
                .key(&DocRef::name_prefix(DocKind::WorkloadEndpoint, Some("ns1"))),
            "/margay/v1/policy/workloadendpoints/ns1/"
        );
        assert_eq!(DocRef::name_prefix(DocKind::Namespace, Some("ns1")), "");
        let w = DocRef::new(DocKind::WorkloadEndpoint, "ns1", "pod");
        assert_eq!(DocRef::of_object(w.kind, &w.object_name()), Some(w));
    }

    #[tokio::test]
    async fn put_get_list_update_delete_with_revisions() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("s.db"), Default::default())
            .await
            .unwrap();
        let docs = Documents::new(&store);
        let a = DocRef::new(DocKind::NetworkPolicy, "ns1", "a");
        let b = DocRef::new(DocKind::NetworkPolicy, "ns2", "b");
        let (r1, created) = docs.put(&a, &json!({"v": 1}), None).await.unwrap();
        assert!(created);
        docs.put(&b, &json!({"v": 2}), None).await.unwrap();
        let (_, created) = docs.put(&a, &json!({"v": 3}), None).await.unwrap();
        assert!(!created);
        // A write over a revision that is no longer the stored one is refused.
        assert!(matches!(
            docs.put(&a, &json!({"v": 4}), Some(r1)).await,
            Err(ResourceError::Stale(_))
        ));
        assert_eq!(docs.get(&a).await.unwrap().unwrap().json, json!({"v": 3}));
        let all = docs.list(DocKind::NetworkPolicy, None).await.unwrap();
        assert_eq!(
            all.iter().map(|d| d.doc_ref.clone()).collect::<Vec<_>>(),
            vec![a.clone(), b.clone()]
        );
        assert_eq!(
            docs.list(DocKind::NetworkPolicy, Some("ns2"))
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(
            docs.list(DocKind::K8sNetworkPolicy, None)
                .await
                .unwrap()
                .is_empty()
        );
        let changed = docs
            .update(&a, |v| {
                v["v"] = json!(5);
                Ok::<(), String>(())
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(changed.1, json!({"v": 5}));
        // A refused change writes nothing.
        let refused = docs.update(&a, |_| Err("no".to_owned())).await.unwrap();
        assert_eq!(refused, Err("no".to_owned()));
        assert_eq!(docs.get(&a).await.unwrap().unwrap().json, json!({"v": 5}));
        docs.delete(&a).await.unwrap();
        assert!(matches!(
            docs.delete(&a).await,
            Err(ResourceError::NotFound(_))
        ));
        assert!(docs.get(&a).await.unwrap().is_none());
    }
}
