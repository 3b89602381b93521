//! The policy documents (`crate::documents`) in the Kubernetes API, where Kubernetes and Calico
//! keep them, so that what `kubectl apply` and `kubectl label` write, and the Pods the kubelet
//! runs, are what margay enforces, with nothing stored twice:
//!
//! - a Kubernetes NetworkPolicy is a `networking.k8s.io/v1` NetworkPolicy; Calico's
//!   NetworkPolicy and GlobalNetworkPolicy are its `crd.projectcalico.org/v1` resources (the
//!   v3 `spec` as Calico stores it); a Namespace document is the Kubernetes Namespace (its
//!   labels), which margay never deletes;
//! - a WorkloadEndpoint is derived from its Pod as Calico derives it ([`pod_endpoint`]) and
//!   never stored. The CNI plugin's record of one (through bgpd) writes the annotations
//!   Calico's plugin writes on the Pod (`cni.projectcalico.org/podIP`, `podIPs`,
//!   `containerID`), its removal empties the addresses, and its labels are the Pod's own.
//!
//! Versions are the resources' (the Pod's for an endpoint); writes are compare-and-swap on them
//! like every other kind's. Why this file is long: five kinds in three shapes, each with the
//! contract's six requests.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use policy::resource::{NamedPort, Protocol, WorkloadEndpoint};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{KubeStore, follow, http_code, list_objects, request_error, version_of};
use crate::contract::{
    Kind, Object, ObjectEvent, ObjectList, ObjectWatch, Result, StoreError, Version, Watch,
};
use crate::documents::{DocKind, DocRef, Document};
use crate::resource::{decode, encode};

/// Calico's Pod annotations that the CNI plugin writes.
const POD_IP: &str = "cni.projectcalico.org/podIP";
const POD_IPS: &str = "cni.projectcalico.org/podIPs";
const CONTAINER_ID: &str = "cni.projectcalico.org/containerID";
/// Where Calico keeps a v3 resource's own labels on its v1 custom resource.
const CALICO_METADATA: &str = "projectcalico.org/metadata";
/// What the garbage collector needs to know of a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// `metadata.uid`: another Pod of the same name has another.
    pub uid: String,
    /// `spec.nodeName` (empty: not scheduled).
    pub node: String,
    /// Succeeded or Failed.
    pub finished: bool,
    /// Its endpoint's addresses (empty: none yet, or released).
    pub addresses: Vec<IpAddr>,
}

/// The one interface of a Pod that Calico (and margay) derives an endpoint for.
const POD_INTERFACE: &str = "eth0";

/// The document kind a contract kind is, if it is one.
pub(super) fn native(kind: Kind) -> Option<DocKind> {
    DocKind::ALL.into_iter().find(|d| d.kind() == kind)
}

/// Where a document kind other than WorkloadEndpoint lives, and the document it reads as.
pub(super) struct Shape {
    pub(super) resource: ApiResource,
    /// The `apiVersion` of the document margay's policy crate reads.
    document_api_version: &'static str,
    /// Whether the document has a `spec` (a Namespace's is Kubernetes' own business).
    has_spec: bool,
    /// Whether the resource is Calico's (its v3 labels may be in [`CALICO_METADATA`]).
    calico: bool,
}

pub(super) fn shape(kind: DocKind) -> Shape {
    let of = |group: &str, kind: &str, plural: &str, document: &'static str| {
        let version = if group == crate::crd::GROUP {
            crate::crd::VERSION
        } else {
            "v1"
        };
        Shape {
            resource: ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(group, version, kind),
                plural,
            ),
            document_api_version: document,
            has_spec: true,
            calico: group == crate::crd::GROUP,
        }
    };
    match kind {
        DocKind::K8sNetworkPolicy => of(
            "networking.k8s.io",
            "NetworkPolicy",
            "networkpolicies",
            "networking.k8s.io/v1",
        ),
        DocKind::NetworkPolicy => of(
            crate::crd::GROUP,
            "NetworkPolicy",
            "networkpolicies",
            "projectcalico.org/v3",
        ),
        DocKind::GlobalNetworkPolicy => of(
            crate::crd::GROUP,
            "GlobalNetworkPolicy",
            "globalnetworkpolicies",
            "projectcalico.org/v3",
        ),
        // Served from Pods ([`pod_endpoint`]); never asked for a shape.
        DocKind::Namespace | DocKind::WorkloadEndpoint => Shape {
            has_spec: false,
            ..of("", "Namespace", "namespaces", "v1")
        },
    }
}

fn conflict(
    kind: DocKind,
    name: &str,
    expected: Option<Version>,
    actual: Option<Version>,
) -> StoreError {
    StoreError::Conflict {
        key: format!("{} {name}", kind.kind().name),
        expected,
        actual,
    }
}

/// The string map at `value` (labels, annotations), empty when absent.
fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The document a resource reads as: its name, namespace and labels, and its spec.
fn document_of(kind: DocKind, shape: &Shape, d: &DynamicObject) -> Value {
    let mut labels = d.metadata.labels.clone().unwrap_or_default();
    // A resource Calico wrote keeps the v3 labels in an annotation; `kubectl apply` of the
    // custom resource puts them on it.
    if shape.calico
        && let Some(meta) = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CALICO_METADATA))
            .and_then(|m| serde_json::from_str::<Value>(m).ok())
        && meta.get("labels").is_some()
    {
        labels = string_map(meta.get("labels"));
    }
    let mut metadata = json!({ "name": d.metadata.name.clone().unwrap_or_default() });
    if kind.namespaced() {
        metadata["namespace"] = json!(d.metadata.namespace.clone().unwrap_or_default());
    }
    if !labels.is_empty() {
        metadata["labels"] = json!(labels);
    }
    let mut doc = json!({
        "apiVersion": shape.document_api_version,
        "kind": shape.resource.kind,
        "metadata": metadata,
    });
    if shape.has_spec {
        doc["spec"] = d.data.get("spec").cloned().unwrap_or_else(|| json!({}));
    }
    doc
}

fn object_of(kind: DocKind, shape: &Shape, d: &DynamicObject, version: Version) -> Object {
    let r = DocRef::new(
        kind,
        d.metadata.namespace.as_deref().unwrap_or_default(),
        d.metadata.name.as_deref().unwrap_or_default(),
    );
    Object {
        name: r.object_name(),
        value: encode(&Document {
            json: document_of(kind, shape, d),
        }),
        version,
    }
}

/// The document margay was asked to write, checked against the name it is written under.
fn written_document(kind: DocKind, r: &DocRef, value: &[u8]) -> Result<Value> {
    let json = decode::<Document>(value)
        .map_err(|e| StoreError::Backend(format!("{} {r}: {e}", kind.kind().name)))?
        .json;
    Ok(json)
}

/// The pod `<namespace>/<pod>.eth0` names, if it names one.
fn pod_of(name: &str) -> Option<(String, String)> {
    let r = DocRef::of_object(DocKind::WorkloadEndpoint, name)?;
    let pod = r.name.strip_suffix(&format!(".{POD_INTERFACE}"))?;
    Some((r.namespace, pod.to_owned()))
}

/// The endpoint of a Pod, as Calico derives one (`K8S/conversion/workload_endpoint_default.go`):
/// none for a Pod on no node, in the host's network, finished, deleting with its addresses
/// released, or without an address yet. Its addresses are `status.podIPs` (the kubelet's),
/// else `status.podIP`, else the CNI plugin's annotations; its labels the Pod's; its
/// interface the `cali…` name the plugin gave the veth; its named ports the containers'.
pub(super) fn pod_endpoint(pod: &Pod) -> Option<WorkloadEndpoint> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
    if spec.host_network == Some(true) {
        return None;
    }
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return None;
    }
    let notes = meta.annotations.clone().unwrap_or_default();
    let released = notes.get(POD_IP).is_some_and(String::is_empty);
    if meta.deletion_timestamp.is_some() && released {
        return None;
    }
    let from_status: Vec<String> = match status {
        Some(s) => match &s.pod_ips {
            Some(ips) if !ips.is_empty() => ips.iter().map(|i| i.ip.clone()).collect(),
            _ => s.pod_ip.iter().cloned().collect(),
        },
        None => Vec::new(),
    };
    let texts = if !from_status.is_empty() {
        from_status
    } else if let Some(ips) = notes.get(POD_IPS).filter(|v| !v.is_empty()) {
        ips.split(',').map(str::to_owned).collect()
    } else {
        notes.get(POD_IP).into_iter().cloned().collect()
    };
    let addresses: Vec<IpNet> = texts
        .iter()
        .filter_map(|t| {
            let t = t.trim();
            t.parse::<IpNet>()
                .ok()
                .or_else(|| t.parse::<IpAddr>().ok().map(IpNet::from))
        })
        .collect();
    if addresses.is_empty() {
        return None;
    }
    let namespace = meta.namespace.clone().unwrap_or_default();
    let pod_name = meta.name.clone().unwrap_or_default();
    let ports = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
                "UDP" => Protocol::Udp,
                "SCTP" => Protocol::Sctp,
                _ => Protocol::Tcp,
            };
            Some(NamedPort {
                name: p.name.clone()?,
                protocol,
                port: u16::try_from(p.container_port).ok()?,
            })
        })
        .collect();
    Some(WorkloadEndpoint {
        interface: net_types::workload::pod_ifname(&namespace, &pod_name),
        name: format!("{pod_name}.{POD_INTERFACE}"),
        namespace,
        pod: pod_name,
        node,
        addresses,
        labels: meta.labels.clone().unwrap_or_default(),
        service_account: spec.service_account_name.clone().filter(|s| !s.is_empty()),
        ports,
    })
}

/// The stored bytes of a Pod's endpoint.
fn endpoint_value(ep: &WorkloadEndpoint) -> Vec<u8> {
    encode(&Document {
        json: ep.to_document(),
    })
}

impl KubeStore {
    fn resource_api(&self, shape: &Shape, namespace: Option<&str>) -> Api<DynamicObject> {
        let client = self.inner.client.clone();
        match namespace {
            Some(ns) => Api::namespaced_with(client, ns, &shape.resource),
            None => Api::all_with(client, &shape.resource),
        }
    }

    fn pods(&self, namespace: Option<&str>) -> Api<Pod> {
        let client = self.inner.client.clone();
        match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        }
    }

    /// The resource of document `r`, if there is one.
    async fn doc_resource(&self, shape: &Shape, r: &DocRef) -> Result<Option<DynamicObject>> {
        let namespace = r.kind.namespaced().then_some(r.namespace.as_str());
        self.resource_api(shape, namespace)
            .get_opt(&r.name)
            .await
            .map_err(|e| request_error(e, &r.to_string()))
    }

    pub(super) async fn doc_get(&self, kind: DocKind, name: &str) -> Result<Option<Object>> {
        if kind == DocKind::WorkloadEndpoint {
            let Some((ns, pod)) = pod_of(name) else {
                return Ok(None);
            };
            let found = self
                .pods(Some(&ns))
                .get_opt(&pod)
                .await
                .map_err(|e| request_error(e, &format!("pod {ns}/{pod}")))?;
            return match found {
                Some(p) => {
                    let version = version_of(p.metadata.resource_version.as_deref())?;
                    Ok(pod_endpoint(&p).map(|ep| Object {
                        name: name.to_owned(),
                        value: endpoint_value(&ep),
                        version,
                    }))
                }
                None => Ok(None),
            };
        }
        let Some(r) = DocRef::of_object(kind, name) else {
            return Ok(None);
        };
        let shape = shape(kind);
        let Some(d) = self.doc_resource(&shape, &r).await? else {
            return Ok(None);
        };
        let version = version_of(d.metadata.resource_version.as_deref())?;
        Ok(Some(object_of(kind, &shape, &d, version)))
    }

    pub(super) async fn doc_list(&self, kind: DocKind, name_prefix: &str) -> Result<ObjectList> {
        if kind == DocKind::WorkloadEndpoint {
            return list_objects(&self.pods(None), None, "pods", name_prefix, |p, version| {
                Ok(pod_endpoint(p).map(|ep| Object {
                    name: DocRef::new(kind, &ep.namespace, &ep.name).object_name(),
                    value: endpoint_value(&ep),
                    version,
                }))
            })
            .await;
        }
        let shape = shape(kind);
        let api = self.resource_api(&shape, None);
        list_objects(
            &api,
            None,
            shape.resource.plural.as_str(),
            name_prefix,
            |d, version| Ok(Some(object_of(kind, &shape, d, version))),
        )
        .await
    }

    /// Creates (`expected` none) or replaces the document `name`.
    pub(super) async fn doc_write(
        &self,
        kind: DocKind,
        name: &str,
        value: &[u8],
        expected: Option<Version>,
    ) -> Result<Version> {
        if kind == DocKind::WorkloadEndpoint {
            return self.endpoint_write(name, Some(value), expected).await;
        }
        let r = DocRef::of_object(kind, name).ok_or_else(|| {
            StoreError::Backend(format!("{} {name}: not a namespace/name", kind.kind().name))
        })?;
        let json = written_document(kind, &r, value)?;
        let shape = shape(kind);
        let namespace = kind.namespaced().then_some(r.namespace.as_str());
        let api = self.resource_api(&shape, namespace);
        let labels = string_map(json.pointer("/metadata/labels"));
        let mut body = match expected {
            None => {
                let mut d = DynamicObject::new(&r.name, &shape.resource);
                d.metadata.namespace = namespace.map(str::to_owned);
                d
            }
            // The stored resource at the version expected, with the document's labels and
            // spec: its other metadata (annotations, owners) stays as it is.
            Some(expected) => {
                let stored = self.doc_resource(&shape, &r).await?;
                let actual = match &stored {
                    Some(d) => Some(version_of(d.metadata.resource_version.as_deref())?),
                    None => None,
                };
                match stored {
                    Some(d) if actual == Some(expected) => d,
                    _ => return Err(conflict(kind, name, Some(expected), actual)),
                }
            }
        };
        body.metadata.labels = (!labels.is_empty()).then_some(labels);
        if shape.has_spec {
            body.data["spec"] = json.get("spec").cloned().unwrap_or_else(|| json!({}));
        }
        let written = match expected {
            None => api.create(&PostParams::default(), &body).await,
            Some(_) => api.replace(&r.name, &PostParams::default(), &body).await,
        };
        match written {
            Ok(d) => version_of(d.metadata.resource_version.as_deref()),
            // A create that finds no namespace to create in: no retry makes one.
            Err(e) if expected.is_none() && http_code(&e) == Some(404) => {
                Err(StoreError::Backend(format!(
                    "{r}: the namespace {} does not exist (kubectl create namespace {})",
                    r.namespace, r.namespace
                )))
            }
            Err(e) if matches!(http_code(&e), Some(404 | 409)) => {
                let actual = self.doc_get(kind, name).await.ok().flatten();
                Err(conflict(kind, name, expected, actual.map(|o| o.version)))
            }
            Err(e) => Err(request_error(e, &r.to_string())),
        }
    }

    pub(super) async fn doc_delete(
        &self,
        kind: DocKind,
        name: &str,
        expected: Version,
    ) -> Result<()> {
        match kind {
            DocKind::WorkloadEndpoint => self
                .endpoint_write(name, None, Some(expected))
                .await
                .map(|_| ()),
            DocKind::Namespace => Err(StoreError::Backend(format!(
                "namespace {name} is the Kubernetes Namespace on this datastore: margay does not \
                 delete it (with its pods); use kubectl delete namespace"
            ))),
            _ => {
                let r = DocRef::of_object(kind, name)
                    .ok_or_else(|| conflict(kind, name, Some(expected), None))?;
                let shape = shape(kind);
                let namespace = kind.namespaced().then_some(r.namespace.as_str());
                let params = kube::api::DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        resource_version: Some(expected.to_wire().to_string()),
                        uid: None,
                    }),
                    ..Default::default()
                };
                match self
                    .resource_api(&shape, namespace)
                    .delete(&r.name, &params)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) if matches!(http_code(&e), Some(404 | 409)) => {
                        let actual = self.doc_get(kind, name).await.ok().flatten();
                        Err(conflict(
                            kind,
                            name,
                            Some(expected),
                            actual.map(|o| o.version),
                        ))
                    }
                    Err(e) => Err(request_error(e, &r.to_string())),
                }
            }
        }
    }

    pub(super) fn doc_watch(&self, kind: DocKind, from: Version) -> ObjectWatch {
        let (tx, rx) = mpsc::channel(Watch::DEPTH);
        let task = if kind == DocKind::WorkloadEndpoint {
            // Every change of a Pod is its endpoint's: a Pod that has none (yet, or any more)
            // reads as a deletion, which the watcher's cache takes as a no-op if it had none.
            tokio::spawn(follow(
                self.pods(None),
                None,
                from,
                tx,
                move |p, deleted| {
                    let version = version_of(p.metadata.resource_version.as_deref())?;
                    let ns = p.metadata.namespace.clone().unwrap_or_default();
                    let pod = p.metadata.name.clone().unwrap_or_default();
                    let name = DocRef::new(kind, &ns, &format!("{pod}.{POD_INTERFACE}"));
                    let value = if deleted {
                        None
                    } else {
                        pod_endpoint(p).map(|ep| endpoint_value(&ep))
                    };
                    Ok(Some(ObjectEvent {
                        name: name.object_name(),
                        value,
                        version,
                    }))
                },
            ))
        } else {
            let shape = shape(kind);
            let api = self.resource_api(&shape, None);
            tokio::spawn(follow(api, None, from, tx, move |d, deleted| {
                let version = version_of(d.metadata.resource_version.as_deref())?;
                let object = object_of(kind, &shape, d, version);
                Ok(Some(ObjectEvent {
                    name: object.name,
                    value: (!deleted).then_some(object.value),
                    version,
                }))
            }))
        };
        ObjectWatch::of_objects(rx, task)
    }

    /// What the garbage collector needs of Pod `namespace/pod`; `None` when it does not exist.
    pub async fn pod_state(&self, namespace: &str, pod: &str) -> Result<Option<PodState>> {
        let found = self
            .pods(Some(namespace))
            .get_opt(pod)
            .await
            .map_err(|e| request_error(e, &format!("pod {namespace}/{pod}")))?;
        Ok(found.map(|p| PodState {
            uid: p.metadata.uid.clone().unwrap_or_default(),
            node: p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            finished: matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            ),
            addresses: pod_endpoint(&p)
                .map(|ep| ep.addresses.iter().map(IpNet::addr).collect())
                .unwrap_or_default(),
        }))
    }

    /// The names of every Kubernetes Node (margay's or not).
    pub async fn node_names(&self) -> Result<std::collections::BTreeSet<String>> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.inner.client.clone());
        let list = list_objects(&nodes, None, "nodes", "", |n, version| {
            Ok(Some(Object {
                name: n.metadata.name.clone().unwrap_or_default(),
                value: Vec::new(),
                version,
            }))
        })
        .await?;
        Ok(list.items.into_iter().map(|o| o.name).collect())
    }

    /// The annotations of Pod `namespace/pod` and of its Namespace (what Calico's CNI plugin
    /// reads for IPAM); `None` when the Pod does not exist.
    pub async fn pod_annotations(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<(BTreeMap<String, String>, BTreeMap<String, String>)>> {
        let found = self
            .pods(Some(namespace))
            .get_opt(pod)
            .await
            .map_err(|e| request_error(e, &format!("pod {namespace}/{pod}")))?;
        let Some(found) = found else {
            return Ok(None);
        };
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
            Api::all(self.inner.client.clone());
        let of_namespace = namespaces
            .get_opt(namespace)
            .await
            .map_err(|e| request_error(e, &format!("namespace {namespace}")))?
            .and_then(|n| n.metadata.annotations)
            .unwrap_or_default();
        Ok(Some((
            found.metadata.annotations.unwrap_or_default(),
            of_namespace,
        )))
    }

    /// Records (`value`) or removes a Pod's endpoint: Calico's annotations on the Pod, written
    /// through its status (as Calico's plugin does: `pods/status` is all it may patch), over
    /// the Pod's version `expected` (none: the Pod must have no endpoint yet).
    async fn endpoint_write(
        &self,
        name: &str,
        value: Option<&[u8]>,
        expected: Option<Version>,
    ) -> Result<Version> {
        let kind = DocKind::WorkloadEndpoint;
        let (ns, pod) = pod_of(name).ok_or_else(|| {
            StoreError::Backend(format!(
                "workload endpoint {name}: on the Kubernetes datastore an endpoint is a Pod's \
                 {POD_INTERFACE}, named <namespace>/<pod>.{POD_INTERFACE}"
            ))
        })?;
        let api = self.pods(Some(&ns));
        let found = api
            .get_opt(&pod)
            .await
            .map_err(|e| request_error(e, &format!("pod {ns}/{pod}")))?;
        let Some(found) = found else {
            if value.is_none() {
                return Err(conflict(kind, name, expected, None));
            }
            return Err(StoreError::Backend(format!(
                "there is no Pod {ns}/{pod}: on the Kubernetes datastore a workload endpoint is \
                 its Pod's, which must exist before the CNI plugin runs (the kubelet creates it)"
            )));
        };
        let version = version_of(found.metadata.resource_version.as_deref())?;
        let actual = pod_endpoint(&found).map(|_| version);
        if actual != expected {
            return Err(conflict(kind, name, expected, actual));
        }
        let notes = match value {
            Some(value) => {
                let r = DocRef::new(kind, &ns, &format!("{pod}.{POD_INTERFACE}"));
                let json = written_document(kind, &r, value)?;
                let ep = policy::resource::parse_workload_endpoint(&json)
                    .map_err(|e| StoreError::Backend(format!("workload endpoint {name}: {e}")))?;
                let pod_labels = found.metadata.labels.clone().unwrap_or_default();
                if !ep.labels.is_empty() && ep.labels != pod_labels {
                    return Err(StoreError::Backend(format!(
                        "workload endpoint {name}: on the Kubernetes datastore its labels are \
                         its Pod's: kubectl label pod -n {ns} {pod} KEY=VALUE"
                    )));
                }
                let ips: Vec<String> = ep.addresses.iter().map(ToString::to_string).collect();
                let container = json
                    .pointer("/spec/containerID")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                json!({
                    POD_IP: ips.first().cloned().unwrap_or_default(),
                    POD_IPS: ips.join(","),
                    CONTAINER_ID: container,
                })
            }
            // Calico's DEL: the addresses are released, the Pod may stay (a new sandbox).
            None => json!({ POD_IP: "", POD_IPS: "" }),
        };
        let patch = json!({
            "metadata": {
                "resourceVersion": version.to_wire().to_string(),
                "annotations": notes,
            }
        });
        match api
            .patch_status(&pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(p) => version_of(p.metadata.resource_version.as_deref()),
            Err(e) if matches!(http_code(&e), Some(404 | 409)) => {
                let actual = self.doc_get(kind, name).await.ok().flatten();
                Err(conflict(kind, name, expected, actual.map(|o| o.version)))
            }
            Err(e) => Err(request_error(e, &format!("pod {ns}/{pod}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn web(status: Value, annotations: Value) -> Pod {
        pod(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "web"},
                         "annotations": annotations, "resourceVersion": "7"},
            "spec": {"nodeName": "node-1", "serviceAccountName": "shop-sa",
                     "containers": [{"name": "c", "ports": [
                        {"name": "http", "containerPort": 8080},
                        {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                        {"containerPort": 9000}]}]},
            "status": status,
        }))
    }

    #[test]
    fn a_pod_is_an_endpoint_as_calico_derives_it() {
        let ep = pod_endpoint(&web(
            json!({"podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]}),
            json!({POD_IPS: "10.9.9.9/32"}),
        ))
        .unwrap();
        assert_eq!(ep.name, "web-0.eth0");
        assert_eq!(
            (ep.namespace.as_str(), ep.node.as_str()),
            ("shop", "node-1")
        );
        assert_eq!(
            ep.interface,
            net_types::workload::pod_ifname("shop", "web-0")
        );
        assert_eq!(
            ep.addresses,
            vec![
                "10.0.0.5/32".parse::<IpNet>().unwrap(),
                "fd00::5/128".parse().unwrap()
            ],
            "the kubelet's status.podIPs win over the plugin's annotation"
        );
        assert_eq!(ep.service_account.as_deref(), Some("shop-sa"));
        assert_eq!(ep.labels, BTreeMap::from([("app".into(), "web".into())]));
        assert_eq!(
            ep.ports
                .iter()
                .map(|p| (p.name.as_str(), p.port))
                .collect::<Vec<_>>(),
            vec![("http", 8080), ("dns", 53)],
            "named ports only"
        );
        assert_eq!(ep.ports[1].protocol, Protocol::Udp);
        // The document reads back through the policy crate as the same endpoint.
        let parsed = policy::resource::parse_workload_endpoint(&ep.to_document()).unwrap();
        assert_eq!(parsed, ep);
    }

    #[test]
    fn addresses_fall_back_to_the_plugins_annotations() {
        let by_ips = pod_endpoint(&web(json!({}), json!({POD_IPS: "10.0.0.6/32,fd00::6/128"})));
        assert_eq!(by_ips.unwrap().addresses.len(), 2);
        let by_ip = pod_endpoint(&web(json!({}), json!({POD_IP: "10.0.0.7/32"}))).unwrap();
        assert_eq!(
            by_ip.addresses,
            vec!["10.0.0.7/32".parse::<IpNet>().unwrap()]
        );
        let by_status_ip = pod_endpoint(&web(json!({"podIP": "10.0.0.8"}), json!({}))).unwrap();
        assert_eq!(
            by_status_ip.addresses,
            vec!["10.0.0.8/32".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn pods_that_are_no_endpoint() {
        let ips = json!({"podIPs": [{"ip": "10.0.0.5"}]});
        assert!(
            pod_endpoint(&web(json!({}), json!({}))).is_none(),
            "no address yet"
        );
        assert!(
            pod_endpoint(&web(json!({}), json!({POD_IP: "", POD_IPS: ""}))).is_none(),
            "released by DEL"
        );
        let mut finished = web(
            json!({"phase": "Succeeded", "podIPs": ips["podIPs"]}),
            json!({}),
        );
        assert!(pod_endpoint(&finished).is_none(), "finished");
        finished.status.as_mut().unwrap().phase = Some("Running".into());
        assert!(pod_endpoint(&finished).is_some());
        let mut host = web(ips.clone(), json!({}));
        host.spec.as_mut().unwrap().host_network = Some(true);
        assert!(pod_endpoint(&host).is_none(), "host network");
        let mut unscheduled = web(ips.clone(), json!({}));
        unscheduled.spec.as_mut().unwrap().node_name = None;
        assert!(pod_endpoint(&unscheduled).is_none(), "on no node");
        let mut deleting = web(ips, json!({POD_IP: ""}));
        deleting.metadata = serde_json::from_value(json!({
            "name": "web-0", "namespace": "shop", "annotations": {POD_IP: ""},
            "deletionTimestamp": "2026-12-07T00:00:00Z"}))
        .unwrap();
        assert!(pod_endpoint(&deleting).is_none(), "deleting, released");
    }

    #[test]
    fn endpoint_names_are_a_pods_eth0() {
        assert_eq!(
            pod_of("shop/web-0.eth0"),
            Some(("shop".into(), "web-0".into()))
        );
        assert_eq!(pod_of("shop/web-0.net1"), None);
        assert_eq!(pod_of("web-0.eth0"), None);
    }

    #[test]
    fn calico_resources_read_as_v3_documents_with_their_v3_labels() {
        let shape = shape(DocKind::NetworkPolicy);
        let mut d = DynamicObject::new("allow-web", &shape.resource).data(json!({
            "spec": {"selector": "app == 'web'", "ingress": [{"action": "Allow"}]}
        }));
        d.metadata.namespace = Some("shop".into());
        d.metadata.labels = Some(BTreeMap::from([("cr".into(), "label".into())]));
        let doc = document_of(DocKind::NetworkPolicy, &shape, &d);
        assert_eq!(
            doc,
            json!({"apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
                   "metadata": {"name": "allow-web", "namespace": "shop", "labels": {"cr": "label"}},
                   "spec": {"selector": "app == 'web'", "ingress": [{"action": "Allow"}]}})
        );
        d.metadata.annotations = Some(BTreeMap::from([(
            CALICO_METADATA.into(),
            r#"{"labels":{"team":"shop"}}"#.into(),
        )]));
        let doc = document_of(DocKind::NetworkPolicy, &shape, &d);
        assert_eq!(doc["metadata"]["labels"], json!({"team": "shop"}));
        policy::resource::parse_resource(&doc).unwrap();
        let ns = shape_doc_of_namespace();
        assert_eq!(
            ns,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "shop", "labels": {"kubernetes.io/metadata.name": "shop"}}})
        );
    }

    fn shape_doc_of_namespace() -> Value {
        let shape = shape(DocKind::Namespace);
        let mut d = DynamicObject::new("shop", &shape.resource)
            .data(json!({"spec": {"finalizers": ["kubernetes"]}}));
        d.metadata.labels = Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".into(),
            "shop".into(),
        )]));
        document_of(DocKind::Namespace, &shape, &d)
    }
}
