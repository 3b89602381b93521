//! The `Policy` service: network-policy documents (Kubernetes and Calico policies, workload
//! endpoints, namespaces) in and out of the datastore, label changes, and `Explain`. Every
//! document is checked by the `policy` crate before it is stored (refused whole, with the
//! field's path, nothing written); it is stored as the user wrote it, with its namespace filled
//! in and the datastore's read-only metadata left out. The brain picks changes up from the
//! datastore's watch like any other resource's.

use std::collections::BTreeMap;

use ::datastore::Store;
use ::datastore::documents::{DocKind, DocRef, Documents, StoredDoc};
use policy::resource::parse_resource;
use proto::v1 as pb;
use proto::v1::policy_server::Policy as PolicyApi;
use serde_json::Value;
use tonic::{Request, Response, Status};

use super::convert::{self, invalid, required, status};
use crate::cluster::policy::{PolicyDocs, decode, doc_ref};
use crate::datastore::DatastoreHandle;

#[derive(Clone)]
pub struct PolicyService {
    datastore: DatastoreHandle,
    /// This daemon's node: a WorkloadEndpoint that names none is on it (the CNI plugin
    /// on this node records its pods without knowing the node's name).
    node: String,
}

type Reply<T> = Result<Response<T>, Status>;

/// Metadata the datastore sets, never stored from a document.
const READ_ONLY_METADATA: [&str; 4] = ["uid", "resourceVersion", "creationTimestamp", "generation"];

pub fn kind_to_pb(k: DocKind) -> pb::DocumentKind {
    match k {
        DocKind::K8sNetworkPolicy => pb::DocumentKind::K8sNetworkPolicy,
        DocKind::NetworkPolicy => pb::DocumentKind::NetworkPolicy,
        DocKind::GlobalNetworkPolicy => pb::DocumentKind::GlobalNetworkPolicy,
        DocKind::WorkloadEndpoint => pb::DocumentKind::WorkloadEndpoint,
        DocKind::Namespace => pb::DocumentKind::Namespace,
    }
}

fn kind_from_pb(v: i32) -> Result<DocKind, Status> {
    Ok(match pb::DocumentKind::try_from(v) {
        Ok(pb::DocumentKind::K8sNetworkPolicy) => DocKind::K8sNetworkPolicy,
        Ok(pb::DocumentKind::NetworkPolicy) => DocKind::NetworkPolicy,
        Ok(pb::DocumentKind::GlobalNetworkPolicy) => DocKind::GlobalNetworkPolicy,
        Ok(pb::DocumentKind::WorkloadEndpoint) => DocKind::WorkloadEndpoint,
        Ok(pb::DocumentKind::Namespace) => DocKind::Namespace,
        _ => return Err(invalid("kind", format!("{v} is not a document kind"))),
    })
}

fn ref_to_pb(r: &DocRef) -> pb::DocumentRef {
    pb::DocumentRef {
        kind: kind_to_pb(r.kind) as i32,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
    }
}

fn ref_from_pb(r: Option<pb::DocumentRef>) -> Result<DocRef, Status> {
    let r = r.ok_or_else(|| invalid("ref", "required"))?;
    let kind = kind_from_pb(r.kind)?;
    let name = required("ref.name", &r.name)?;
    let ns = if kind.namespaced() && r.namespace.is_empty() {
        "default"
    } else {
        &r.namespace
    };
    Ok(DocRef::new(kind, ns, name))
}

fn stored(d: StoredDoc) -> pb::StoredDocument {
    pb::StoredDocument {
        r#ref: Some(ref_to_pb(&d.doc_ref)),
        json: d.json.to_string(),
        revision: d.version.to_wire(),
    }
}

/// The document as stored: its namespace written out, read-only metadata left out.
fn normalized(mut json: Value, at: &DocRef) -> Value {
    if let Some(meta) = json.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in READ_ONLY_METADATA {
            meta.remove(k);
        }
        if at.kind.namespaced() {
            meta.insert("namespace".into(), Value::String(at.namespace.clone()));
        }
    }
    json
}

/// Checks a document; the refusal names the field.
fn check(json: &Value) -> Result<DocRef, Status> {
    parse_resource(json)
        .map(|r| doc_ref(&r))
        .map_err(|e| Status::invalid_argument(format!("invalid document: {e}")))
}

impl PolicyService {
    pub fn new(datastore: DatastoreHandle, node: String) -> Self {
        PolicyService { datastore, node }
    }

    fn store(&self) -> Result<Store, Status> {
        self.datastore
            .store()
            .ok_or_else(|| convert::unavailable(&self.datastore))
    }

    /// Every policy input of the cluster, parsed as the brain parses it.
    async fn cluster(&self, store: &Store) -> Result<PolicyDocs, Status> {
        let docs = Documents::new(store);
        let mut all = PolicyDocs::default();
        for kind in DocKind::ALL {
            for d in docs.list(kind, None).await.map_err(status)? {
                if let Ok(r) = decode(&d.doc_ref, &d.json) {
                    all.push(r);
                }
            }
        }
        Ok(all)
    }
}

/// Deletes the WorkloadEndpoints of `node` none of whose addresses is allocated any more: the
/// pods a runtime never sent DEL for, once IPAM's GC has released their addresses. Returns the
/// endpoints deleted.
pub async fn collect_endpoints(
    ipam: &ipam::allocator::Ipam<Store>,
    node: &str,
) -> Result<Vec<DocRef>, ipam::IpamError> {
    // On the Kubernetes datastore an endpoint is its Pod's: it goes with the Pod (or when the
    // Pod's addresses go), and `kube_gc` releases what leaked.
    if ipam.store().as_kubernetes().is_some() {
        return Ok(Vec::new());
    }
    let docs = Documents::new(ipam.store());
    let mut gone = Vec::new();
    for d in docs.list(DocKind::WorkloadEndpoint, None).await? {
        let Ok(policy::resource::Resource::WorkloadEndpoint(w)) = decode(&d.doc_ref, &d.json)
        else {
            continue;
        };
        if w.node != node || w.addresses.is_empty() {
            continue;
        }
        let mut live = false;
        for a in &w.addresses {
            if ipam.address_allocation(a.addr()).await?.is_some() {
                live = true;
                break;
            }
        }
        if !live {
            match docs.delete(&d.doc_ref).await {
                Ok(()) | Err(::datastore::ResourceError::NotFound(_)) => gone.push(d.doc_ref),
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(gone)
}

#[tonic::async_trait]
impl PolicyApi for PolicyService {
    async fn apply(
        &self,
        req: Request<pb::ApplyDocumentRequest>,
    ) -> Reply<pb::ApplyDocumentResponse> {
        let mut json: Value = serde_json::from_str(&req.get_ref().json)
            .map_err(|e| invalid("json", format!("not JSON: {e}")))?;
        if json["kind"] == "WorkloadEndpoint"
            && let Some(spec) = json.get_mut("spec").and_then(Value::as_object_mut)
        {
            spec.entry("node")
                .or_insert_with(|| Value::String(self.node.clone()));
        }
        let at = check(&json)?;
        let json = normalized(json, &at);
        let store = self.store()?;
        let (rev, created) = Documents::new(&store)
            .put(&at, &json, None)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ApplyDocumentResponse {
            r#ref: Some(ref_to_pb(&at)),
            created,
            revision: rev.to_wire(),
        }))
    }

    async fn delete(&self, req: Request<pb::DocumentRef>) -> Reply<pb::DeleteDocumentResponse> {
        let at = ref_from_pb(Some(req.into_inner()))?;
        let store = self.store()?;
        Documents::new(&store).delete(&at).await.map_err(status)?;
        Ok(Response::new(pb::DeleteDocumentResponse {}))
    }

    async fn list(
        &self,
        req: Request<pb::ListDocumentsRequest>,
    ) -> Reply<pb::ListDocumentsResponse> {
        let r = req.into_inner();
        let kind = kind_from_pb(r.kind)?;
        let store = self.store()?;
        let ns = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
        let documents = Documents::new(&store)
            .list(kind, ns)
            .await
            .map_err(status)?
            .into_iter()
            .filter(|d| r.name.is_empty() || d.doc_ref.name == r.name)
            .map(stored)
            .collect();
        Ok(Response::new(pb::ListDocumentsResponse { documents }))
    }

    async fn label(&self, req: Request<pb::LabelRequest>) -> Reply<pb::ApplyDocumentResponse> {
        let r = req.into_inner();
        let at = ref_from_pb(r.r#ref)?;
        if !matches!(at.kind, DocKind::WorkloadEndpoint | DocKind::Namespace) {
            return Err(invalid(
                "ref.kind",
                "only workload endpoints and namespaces are labelled this way; edit a policy's file and apply it",
            ));
        }
        let set: BTreeMap<String, String> = r.set.into_iter().collect();
        let store = self.store()?;
        let changed = Documents::new(&store)
            .update(&at, |json| {
                let meta = json
                    .get_mut("metadata")
                    .and_then(Value::as_object_mut)
                    .ok_or_else(|| invalid("document", "has no metadata"))?;
                let labels = meta
                    .entry("labels")
                    .or_insert_with(|| Value::Object(Default::default()));
                let Some(labels) = labels.as_object_mut() else {
                    return Err(invalid("metadata.labels", "is not a map"));
                };
                for k in &r.remove {
                    labels.remove(k);
                }
                for (k, v) in &set {
                    labels.insert(k.clone(), Value::String(v.clone()));
                }
                // The labels must still be labels (keys and values as Kubernetes allows).
                check(json).map(|_| ())
            })
            .await
            .map_err(status)?;
        let (rev, _) = changed?;
        Ok(Response::new(pb::ApplyDocumentResponse {
            r#ref: Some(ref_to_pb(&at)),
            created: false,
            revision: rev.to_wire(),
        }))
    }

    async fn explain(&self, req: Request<pb::ExplainRequest>) -> Reply<pb::ExplainResponse> {
        let r = req.into_inner();
        let endpoint = required("endpoint", &r.endpoint)?;
        let namespace = if r.namespace.is_empty() {
            "default"
        } else {
            &r.namespace
        };
        let store = self.store()?;
        let docs = self.cluster(&store).await?;
        // A pod's name finds its endpoint, as `kubectl` users think in pods.
        let name = docs
            .endpoints
            .iter()
            .find(|w| w.namespace == namespace && (w.name == endpoint || w.pod == endpoint))
            .map(|w| w.name.clone())
            .ok_or_else(|| {
                Status::not_found(format!(
                    "no workload endpoint or pod {endpoint:?} in namespace {namespace:?} (bgpctl get workloadendpoints lists them)"
                ))
            })?;
        let explanation = policy::explain::explain(&docs.cluster(), namespace, &name)
            .ok_or_else(|| Status::not_found(format!("workload endpoint {namespace}/{name}")))?;
        Ok(Response::new(pb::ExplainResponse {
            text: explanation.to_string(),
            json: serde_json::to_string(&explanation).unwrap_or_default(),
        }))
    }
}
