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

use crate::error::IpamError;
use crate::resource::{Resource, decode, encode};
use crate::store::{Datastore, Op, Revision, StoreError};

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

    /// The document's key; names and namespaces are checked by the `policy` crate (DNS
    /// labels and subdomains), so they never hold a `/`.
    pub fn key(&self) -> String {
        if self.kind.namespaced() {
            format!(
                "{PREFIX}{}/{}/{}",
                self.kind.dir(),
                self.namespace,
                self.name
            )
        } else {
            format!("{PREFIX}{}/{}", self.kind.dir(), self.name)
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

    /// The prefix of every document of `kind` (in `namespace`, if given and the kind has one).
    pub fn prefix(kind: DocKind, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if kind.namespaced() && !ns.is_empty() => {
                format!("{PREFIX}{}/{ns}/", kind.dir())
            }
            _ => format!("{PREFIX}{}/", kind.dir()),
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

/// A document read back, with the revision to write over.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredDoc {
    pub doc_ref: DocRef,
    pub json: Value,
    pub revision: Revision,
}

/// The documents of a datastore.
pub struct Documents<'a, D> {
    store: &'a D,
}

impl<'a, D: Datastore> Documents<'a, D> {
    pub fn new(store: &'a D) -> Self {
        Documents { store }
    }

    pub async fn get(&self, r: &DocRef) -> Result<Option<StoredDoc>, IpamError> {
        Ok(match self.store.get(&r.key()).await? {
            Some(kv) => Some(StoredDoc {
                doc_ref: r.clone(),
                json: decode::<Document>(&kv.value)?.json,
                revision: kv.mod_revision,
            }),
            None => None,
        })
    }

    /// Every document of `kind` (in `namespace`, if given), sorted by namespace and name.
    pub async fn list(
        &self,
        kind: DocKind,
        namespace: Option<&str>,
    ) -> Result<Vec<StoredDoc>, IpamError> {
        let listing = self.store.list(&DocRef::prefix(kind, namespace)).await?;
        listing
            .items
            .into_iter()
            .filter_map(|kv| {
                let r = DocRef::of_key(&kv.key).filter(|r| r.kind == kind)?;
                Some(decode::<Document>(&kv.value).map(|d| StoredDoc {
                    doc_ref: r,
                    json: d.json,
                    revision: kv.mod_revision,
                }))
            })
            .collect::<Result<_, _>>()
            .map_err(Into::into)
    }

    /// Creates or replaces a document (already checked by the caller). With `expected`, only
    /// over that revision (`Stale` otherwise). Returns the write's revision and whether the
    /// document is new.
    pub async fn put(
        &self,
        r: &DocRef,
        json: &Value,
        expected: Option<Revision>,
    ) -> Result<(Revision, bool), IpamError> {
        let key = r.key();
        let value = encode(&Document { json: json.clone() });
        for _ in 0..RETRIES {
            let current = self.store.get(&key).await?.map(|kv| kv.mod_revision);
            if let Some(want) = expected
                && current != Some(want)
            {
                return Err(IpamError::Stale(r.to_string()));
            }
            let op = match current {
                None => Op::Create {
                    key: key.clone(),
                    value: value.clone(),
                },
                Some(rev) => Op::Update {
                    key: key.clone(),
                    value: value.clone(),
                    expected: rev,
                },
            };
            match self.store.txn(vec![op]).await {
                Ok(rev) => return Ok((rev, current.is_none())),
                Err(StoreError::Conflict { .. }) if expected.is_none() => continue,
                Err(StoreError::Conflict { .. }) => return Err(IpamError::Stale(r.to_string())),
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::Contention {
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
    ) -> Result<Result<(Revision, Value), E>, IpamError> {
        for _ in 0..RETRIES {
            let Some(doc) = self.get(r).await? else {
                return Err(IpamError::NotFound(r.to_string()));
            };
            let mut json = doc.json;
            if let Err(e) = change(&mut json) {
                return Ok(Err(e));
            }
            let op = Op::Update {
                key: r.key(),
                value: encode(&Document { json: json.clone() }),
                expected: doc.revision,
            };
            match self.store.txn(vec![op]).await {
                Ok(rev) => return Ok(Ok((rev, json))),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::Contention {
            what: r.to_string(),
            attempts: RETRIES,
        })
    }

    /// Deletes a document; `NotFound` if there is none.
    pub async fn delete(&self, r: &DocRef) -> Result<(), IpamError> {
        for _ in 0..RETRIES {
            let Some(kv) = self.store.get(&r.key()).await? else {
                return Err(IpamError::NotFound(r.to_string()));
            };
            match self
                .store
                .txn(vec![Op::Delete {
                    key: kv.key,
                    expected: kv.mod_revision,
                }])
                .await
            {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::Contention {
            what: r.to_string(),
            attempts: RETRIES,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
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
            DocRef::prefix(DocKind::WorkloadEndpoint, Some("ns1")),
            "/margay/v1/policy/workloadendpoints/ns1/"
        );
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
            Err(IpamError::Stale(_))
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
        assert!(matches!(docs.delete(&a).await, Err(IpamError::NotFound(_))));
        assert!(docs.get(&a).await.unwrap().is_none());
    }
}
