//! margay's `Node` in the Kubernetes datastore, as Calico keeps a node there: not a custom
//! resource but annotations on the Kubernetes `Node` object (`projectcalico.org/IPv4Address`,
//! `IPv6Address`, `ASNumber`, `RouteReflectorClusterID`, the VXLAN tunnel addresses and MACs,
//! and Calico-only labels as JSON in `projectcalico.org/labels`). The Node belongs to the
//! cluster (the kubelet writes its spec and status), so margay only merges its annotations
//! into it: a write reads the Node, replaces the annotations margay owns and leaves the rest,
//! and puts it back with the version read (a kubelet's status update in between is a
//! conflict, and the caller reads again). Deleting margay's node removes those annotations,
//! never the Kubernetes Node. A Node without any of them is no node of margay's (not
//! registered).
//!
//! The mapping (`annotations_of`, `node_of`) is pure and unit-tested; the requests are
//! `KubeStore`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;

use super::{KubeStore, follow, http_code, list_objects, request_error, version_of};
use crate::contract::{
    Object, ObjectEvent, ObjectList, ObjectWatch, Result, StoreError, Version, Watch,
};
use crate::model::Node;
use crate::resource::{decode, encode};

const IPV4: &str = "projectcalico.org/IPv4Address";
const IPV6: &str = "projectcalico.org/IPv6Address";
const ASN: &str = "projectcalico.org/ASNumber";
const RR_CLUSTER: &str = "projectcalico.org/RouteReflectorClusterID";
const VXLAN_V4: &str = "projectcalico.org/IPv4VXLANTunnelAddr";
const VXLAN_MAC_V4: &str = "projectcalico.org/VXLANTunnelMACAddr";
const VXLAN_V6: &str = "projectcalico.org/IPv6VXLANTunnelAddr";
const VXLAN_MAC_V6: &str = "projectcalico.org/VXLANTunnelMACAddrV6";
const LABELS: &str = "projectcalico.org/labels";

/// Every annotation margay writes on a Node (and removes when it forgets the node).
pub const OWNED: [&str; 9] = [
    IPV4,
    IPV6,
    ASN,
    RR_CLUSTER,
    VXLAN_V4,
    VXLAN_MAC_V4,
    VXLAN_V6,
    VXLAN_MAC_V6,
    LABELS,
];

/// The annotations that hold `node`. Labels the Kubernetes Node already has with the same
/// value are not repeated in `projectcalico.org/labels`.
pub fn annotations_of(
    node: &Node,
    kube_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    let mut put = |key: &str, value: Option<String>| {
        if let Some(v) = value {
            a.insert(key.to_owned(), v);
        }
    };
    put(IPV4, node.ipv4.map(|n| n.to_string()));
    put(IPV6, node.ipv6.map(|n| n.to_string()));
    put(ASN, node.asn.map(|n| n.to_string()));
    put(
        RR_CLUSTER,
        node.route_reflector_cluster_id.map(|n| n.to_string()),
    );
    put(VXLAN_V4, node.vxlan_tunnel_address.map(|n| n.to_string()));
    put(VXLAN_MAC_V4, node.vxlan_tunnel_mac.clone());
    put(
        VXLAN_V6,
        node.vxlan_tunnel_address_v6.map(|n| n.to_string()),
    );
    put(VXLAN_MAC_V6, node.vxlan_tunnel_mac_v6.clone());
    let own: BTreeMap<&String, &String> = node
        .labels
        .iter()
        .filter(|(k, v)| kube_labels.get(*k) != Some(*v))
        .collect();
    if !own.is_empty() {
        put(LABELS, serde_json::to_string(&own).ok());
    }
    a
}

/// margay's node from a Kubernetes Node's name, labels and annotations; `Ok(None)` when it
/// carries none of margay's annotations (margay has not registered it, or forgot it). A
/// node registered without addresses (only labels, say, for pools' node selectors) is one.
/// Labels are the Node's Kubernetes labels over the Calico-only ones (Kubernetes' win, as
/// in Calico).
pub fn node_of(
    name: &str,
    kube_labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<Option<Node>, String> {
    if !OWNED.iter().any(|k| annotations.contains_key(*k)) {
        return Ok(None);
    }
    fn field<T: std::str::FromStr>(
        a: &BTreeMap<String, String>,
        key: &str,
    ) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        a.get(key)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse()
                    .map_err(|e| format!("annotation {key}={v:?}: {e}"))
            })
            .transpose()
    }
    let mut node = Node::new(name);
    node.ipv4 = field(annotations, IPV4)?;
    node.ipv6 = field(annotations, IPV6)?;
    node.asn = field(annotations, ASN)?;
    node.route_reflector_cluster_id = field(annotations, RR_CLUSTER)?;
    node.vxlan_tunnel_address = field(annotations, VXLAN_V4)?;
    node.vxlan_tunnel_mac = field(annotations, VXLAN_MAC_V4)?;
    node.vxlan_tunnel_address_v6 = field(annotations, VXLAN_V6)?;
    node.vxlan_tunnel_mac_v6 = field(annotations, VXLAN_MAC_V6)?;
    if let Some(json) = annotations.get(LABELS) {
        node.labels = serde_json::from_str(json)
            .map_err(|e| format!("annotation {LABELS}: not a JSON map of strings: {e}"))?;
    }
    for (k, v) in kube_labels {
        node.labels.insert(k.clone(), v.clone());
    }
    Ok(Some(node))
}

/// The parts of a Kubernetes Node the mapping reads.
pub(super) fn parts(n: &KubeNode) -> (String, BTreeMap<String, String>, BTreeMap<String, String>) {
    (
        n.metadata.name.clone().unwrap_or_default(),
        n.metadata.labels.clone().unwrap_or_default(),
        n.metadata.annotations.clone().unwrap_or_default(),
    )
}

/// margay's object of a Kubernetes Node at `version`, if it is margay's node.
pub(super) fn object_of(n: &KubeNode, version: Version) -> Result<Option<Object>> {
    let (name, labels, annotations) = parts(n);
    let node = node_of(&name, &labels, &annotations)
        .map_err(|reason| StoreError::Backend(format!("Kubernetes Node {name}: {reason}")))?;
    Ok(node.map(|node| Object {
        name,
        value: encode(&node),
        version,
    }))
}

/// `n` with margay's annotations set from `value` (or removed, for `None`), the rest kept.
pub(super) fn with_annotations(mut n: KubeNode, value: Option<&[u8]>) -> Result<KubeNode> {
    let (name, labels, mut annotations) = parts(&n);
    annotations.retain(|k, _| !OWNED.contains(&k.as_str()));
    if let Some(value) = value {
        let node: Node =
            decode(value).map_err(|e| StoreError::Backend(format!("Node {name}: {e}")))?;
        annotations.extend(annotations_of(&node, &labels));
    }
    n.metadata.annotations = Some(annotations);
    Ok(n)
}

/// The event of a watched Node's change: margay's node, or its absence for a Node that is
/// deleted or carries no annotation of margay's (any longer; for one that never did, the
/// absence is news to no one, and bgpd's cache drops it). A Node whose annotations margay
/// cannot read is absent too, and said, as a list leaves it out.
pub(super) fn event_of(n: &KubeNode, deleted: bool, version: Version) -> ObjectEvent {
    let name = n.metadata.name.clone().unwrap_or_default();
    let object = if deleted {
        None
    } else {
        object_of(n, version).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "a watched Node margay cannot read is taken as no node");
            None
        })
    };
    ObjectEvent {
        name,
        value: object.map(|o| o.value),
        version,
    }
}

/// The requests of the contract for margay's nodes.
impl KubeStore {
    fn nodes(&self) -> Api<KubeNode> {
        Api::all(self.client().clone())
    }

    /// The `InternalIP`s of Kubernetes Node `name`, in the order its kubelet reported them
    /// (`status.addresses`); `None` when there is no such Node.
    pub async fn node_internal_ips(&self, name: &str) -> Result<Option<Vec<std::net::IpAddr>>> {
        let found = self
            .nodes()
            .get_opt(name)
            .await
            .map_err(|e| request_error(e, &format!("node {name}")))?;
        Ok(found.map(|n| {
            n.status
                .and_then(|s| s.addresses)
                .unwrap_or_default()
                .into_iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect()
        }))
    }

    pub(super) async fn node_get(&self, name: &str) -> Result<Option<Object>> {
        match self.nodes().get_opt(name).await {
            Ok(Some(n)) => object_of(&n, version_of(n.metadata.resource_version.as_deref())?),
            Ok(None) => Ok(None),
            Err(e) => Err(request_error(e, &format!("Node {name}"))),
        }
    }

    pub(super) async fn node_list(&self, name_prefix: &str) -> Result<ObjectList> {
        list_objects(&self.nodes(), None, "nodes", name_prefix, |n, version| {
            object_of(n, version).map_err(|e| e.to_string())
        })
        .await
    }

    /// Registers the node: its annotations on the Kubernetes Node, which is created when the
    /// cluster has none of that name (a lab without kubelets).
    pub(super) async fn node_create(&self, name: &str, value: Vec<u8>) -> Result<Version> {
        let api = self.nodes();
        let found = api
            .get_opt(name)
            .await
            .map_err(|e| request_error(e, &format!("Node {name}")))?;
        let written = match found {
            None => {
                let mut n = KubeNode::default();
                n.metadata.name = Some(name.to_owned());
                api.create(&PostParams::default(), &with_annotations(n, Some(&value))?)
                    .await
            }
            Some(n) => {
                let version = version_of(n.metadata.resource_version.as_deref())?;
                if object_of(&n, version)?.is_some() {
                    return Err(conflict(name, None, Some(version)));
                }
                patch_annotations(&api, &n, Some(&value), version).await?
            }
        };
        self.node_written(name, None, written).await
    }

    /// Rewrites (`Some`) or removes (`None`) margay's annotations on the Node, if it is still
    /// at `expected`.
    pub(super) async fn node_replace(
        &self,
        name: &str,
        value: Option<Vec<u8>>,
        expected: Version,
    ) -> Result<Version> {
        let api = self.nodes();
        let found = api
            .get_opt(name)
            .await
            .map_err(|e| request_error(e, &format!("Node {name}")))?;
        let Some(n) = found else {
            return Err(conflict(name, Some(expected), None));
        };
        let version = version_of(n.metadata.resource_version.as_deref())?;
        if version != expected || object_of(&n, version)?.is_none() {
            let actual = object_of(&n, version)?.map(|_| version);
            return Err(conflict(name, Some(expected), actual));
        }
        let written = patch_annotations(&api, &n, value.as_deref(), expected).await?;
        self.node_written(name, Some(expected), written).await
    }

    async fn node_written(
        &self,
        name: &str,
        expected: Option<Version>,
        written: kube::Result<KubeNode>,
    ) -> Result<Version> {
        match written {
            Ok(n) => version_of(n.metadata.resource_version.as_deref()),
            Err(e) if matches!(http_code(&e), Some(404 | 409)) => {
                let actual = self.node_get(name).await.ok().flatten().map(|o| o.version);
                Err(conflict(name, expected, actual))
            }
            Err(e) => Err(request_error(e, &format!("Node {name}"))),
        }
    }

    pub(super) fn node_watch(&self, from: Version) -> ObjectWatch {
        let (tx, rx) = mpsc::channel(Watch::DEPTH);
        let task = tokio::spawn(follow(
            self.nodes(),
            None,
            from,
            tx,
            move |n: &KubeNode, deleted| {
                let version = version_of(n.metadata.resource_version.as_deref())?;
                Ok(Some(event_of(n, deleted, version)))
            },
        ));
        ObjectWatch::of_objects(rx, task)
    }
}

/// Sets margay's annotations of the Node `n` from `value` (removes them, for `None`) with a
/// merge patch of `nodes/status`, as Calico writes them (calico-node may patch a Node's
/// status, not the Node): the patch names only margay's annotations, and carries `version`,
/// which the apiserver checks (409 if the Node changed since).
async fn patch_annotations(
    api: &Api<KubeNode>,
    n: &KubeNode,
    value: Option<&[u8]>,
    version: Version,
) -> Result<kube::Result<KubeNode>> {
    let name = n.metadata.name.clone().unwrap_or_default();
    let wanted = with_annotations(n.clone(), value)?
        .metadata
        .annotations
        .unwrap_or_default();
    let annotations: serde_json::Map<String, serde_json::Value> = OWNED
        .iter()
        .map(|k| {
            let v = wanted.get(*k).map_or(serde_json::Value::Null, |v| {
                serde_json::Value::from(v.as_str())
            });
            ((*k).to_owned(), v)
        })
        .collect();
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": version.to_wire().to_string(),
            "annotations": annotations,
        }
    });
    Ok(api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await)
}

fn conflict(name: &str, expected: Option<Version>, actual: Option<Version>) -> StoreError {
    StoreError::Conflict {
        key: format!("Node {name}"),
        expected,
        actual,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Node {
        let mut n = Node::new("worker-2");
        n.ipv4 = Some("192.0.2.10/24".parse().unwrap());
        n.ipv6 = Some("fd00:99::10/64".parse().unwrap());
        n.asn = Some(64512);
        n.route_reflector_cluster_id = Some("224.0.0.1".parse().unwrap());
        n.vxlan_tunnel_address = Some("172.20.1.0".parse().unwrap());
        n.vxlan_tunnel_mac = Some("66:11:22:33:44:55".into());
        n.vxlan_tunnel_address_v6 = Some("fd00:20::1".parse().unwrap());
        n.vxlan_tunnel_mac_v6 = Some("66:11:22:33:44:66".into());
        n.labels = BTreeMap::from([
            ("rack".into(), "r1".into()),
            ("kubernetes.io/hostname".into(), "worker-2".into()),
        ]);
        n
    }

    #[test]
    fn a_node_round_trips_through_calicos_annotations() {
        let kube_labels = BTreeMap::from([("kubernetes.io/hostname".into(), "worker-2".into())]);
        let node = full();
        let a = annotations_of(&node, &kube_labels);
        assert_eq!(a[IPV4], "192.0.2.10/24");
        assert_eq!(a[IPV6], "fd00:99::10/64");
        assert_eq!(a[ASN], "64512");
        assert_eq!(a[VXLAN_V4], "172.20.1.0");
        assert_eq!(a[VXLAN_MAC_V6], "66:11:22:33:44:66");
        // The label the Kubernetes Node has already is not repeated.
        assert_eq!(a[LABELS], r#"{"rack":"r1"}"#);
        assert_eq!(node_of("worker-2", &kube_labels, &a).unwrap(), Some(node));
    }

    #[test]
    fn kubernetes_labels_win_and_a_node_without_margays_annotations_is_not_margays() {
        let a = BTreeMap::from([
            (IPV4.to_owned(), "192.0.2.10/24".to_owned()),
            (
                LABELS.to_owned(),
                r#"{"zone":"calico","rack":"r1"}"#.to_owned(),
            ),
        ]);
        let kube = BTreeMap::from([("zone".into(), "kube".into())]);
        let n = node_of("w", &kube, &a).unwrap().unwrap();
        assert_eq!(n.labels["zone"], "kube");
        assert_eq!(n.labels["rack"], "r1");
        assert_eq!(node_of("w", &kube, &BTreeMap::new()).unwrap(), None);
        let other = BTreeMap::from([("node.alpha.kubernetes.io/ttl".into(), "0".into())]);
        assert_eq!(node_of("w", &kube, &other).unwrap(), None);
        // Registered with labels only (no address yet): margay's all the same.
        let labels_only = BTreeMap::from([(LABELS.to_owned(), r#"{"zone":"b"}"#.to_owned())]);
        let n = node_of("w", &BTreeMap::new(), &labels_only)
            .unwrap()
            .unwrap();
        assert_eq!((n.ipv4, n.labels["zone"].as_str()), (None, "b"));
    }

    #[test]
    fn a_malformed_annotation_is_refused_naming_it() {
        let a = BTreeMap::from([
            (IPV4.to_owned(), "192.0.2.10/24".to_owned()),
            (ASN.to_owned(), "sixty".to_owned()),
        ]);
        let err = node_of("w", &BTreeMap::new(), &a).unwrap_err();
        assert!(err.contains(ASN), "{err}");
    }

    #[test]
    fn writing_keeps_what_is_not_margays_and_forgetting_removes_only_margays() {
        let mut kube = KubeNode::default();
        kube.metadata.name = Some("worker-2".into());
        kube.metadata.annotations = Some(BTreeMap::from([
            ("node.alpha.kubernetes.io/ttl".into(), "0".into()),
            (VXLAN_V4.into(), "10.9.9.9".into()),
        ]));
        let written = with_annotations(kube, Some(&encode(&full()))).unwrap();
        let a = written.metadata.annotations.clone().unwrap();
        assert_eq!(a["node.alpha.kubernetes.io/ttl"], "0");
        assert_eq!(a[VXLAN_V4], "172.20.1.0");
        let forgotten = with_annotations(written, None).unwrap();
        let a = forgotten.metadata.annotations.unwrap();
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            ["node.alpha.kubernetes.io/ttl"]
        );
    }
}
