//! Calico's `projectcalico.org/v3` resource files, as `calicoctl` reads and writes them, mapped
//! to and from bgpd's API messages. Sans-IO: text in, requests (or refusals naming the field's
//! path) out; `commands` does the talking to bgpd.
//!
//! A file is one or more documents (`---`), each a resource or a `List` of them (`kind: List`
//! or `kind: IPPoolList` … with `items`). Every document is checked before anything is
//! applied; a field margay does not support is refused with its path, never ignored. Only
//! read-only metadata the datastore sets (`uid`, `creationTimestamp`, `generation`) and a
//! Node's `status` are accepted and left out, as calicoctl does.

pub mod bgpconfig;
pub mod bgpfilter;
pub mod bgppeer;
pub mod commands;
pub mod fields;
pub mod ippool;
pub mod node;
pub mod policy;
pub mod yaml;

use std::fmt;

use serde_json::{Value, json};

use fields::{FieldError, Obj};

pub const API_VERSION: &str = "projectcalico.org/v3";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    IpPool,
    BgpConfiguration,
    BgpPeer,
    BgpFilter,
    Node,
    /// Network policy (`policy`): documents bgpd checks and stores as written.
    /// Calico's `projectcalico.org/v3` NetworkPolicy; on the command line, both dialects.
    NetworkPolicy,
    /// Kubernetes' `networking.k8s.io/v1` NetworkPolicy.
    K8sNetworkPolicy,
    GlobalNetworkPolicy,
    WorkloadEndpoint,
    /// Kubernetes' `v1` Namespace (its labels, for namespace selectors).
    Namespace,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::IpPool => "IPPool",
            Kind::BgpConfiguration => "BGPConfiguration",
            Kind::BgpPeer => "BGPPeer",
            Kind::BgpFilter => "BGPFilter",
            Kind::Node => "Node",
            Kind::NetworkPolicy | Kind::K8sNetworkPolicy => "NetworkPolicy",
            Kind::GlobalNetworkPolicy => "GlobalNetworkPolicy",
            Kind::WorkloadEndpoint => "WorkloadEndpoint",
            Kind::Namespace => "Namespace",
        }
    }

    /// The kind's apiVersion.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::K8sNetworkPolicy => "networking.k8s.io/v1",
            Kind::Namespace => "v1",
            _ => API_VERSION,
        }
    }

    /// A network-policy kind (stored as a document, in a namespace or not).
    pub fn is_policy_document(self) -> bool {
        matches!(
            self,
            Kind::NetworkPolicy
                | Kind::K8sNetworkPolicy
                | Kind::GlobalNetworkPolicy
                | Kind::WorkloadEndpoint
                | Kind::Namespace
        )
    }

    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Kind::NetworkPolicy | Kind::K8sNetworkPolicy | Kind::WorkloadEndpoint
        )
    }

    /// The kind of a document from its `kind` and `apiVersion`.
    pub fn of_document(kind: &str, api_version: &str) -> Result<Kind, String> {
        match (kind, api_version) {
            ("NetworkPolicy", "networking.k8s.io/v1") => Ok(Kind::K8sNetworkPolicy),
            ("Namespace", "v1") => Ok(Kind::Namespace),
            _ => Kind::parse(kind, false),
        }
    }

    /// The kind as written in a file (exact) or on the command line (any case, plural, short).
    pub fn parse(s: &str, loose: bool) -> Result<Kind, String> {
        let all = [
            Kind::IpPool,
            Kind::BgpConfiguration,
            Kind::BgpPeer,
            Kind::BgpFilter,
            Kind::Node,
            Kind::NetworkPolicy,
            Kind::GlobalNetworkPolicy,
            Kind::WorkloadEndpoint,
            Kind::Namespace,
        ];
        if let Some(k) = all.iter().find(|k| k.name() == s) {
            return Ok(*k);
        }
        if loose {
            let full = s.to_ascii_lowercase();
            if full == "ns" {
                return Ok(Kind::Namespace);
            }
            let l = full.strip_suffix('s').unwrap_or(&full);
            match l {
                "ippool" | "pool" => return Ok(Kind::IpPool),
                "bgpconfiguration" | "bgpconfig" => return Ok(Kind::BgpConfiguration),
                "bgppeer" | "peer" => return Ok(Kind::BgpPeer),
                "bgpfilter" => return Ok(Kind::BgpFilter),
                "node" | "no" => return Ok(Kind::Node),
                "networkpolicy" | "netpol" | "np" | "networkpolicie" => {
                    return Ok(Kind::NetworkPolicy);
                }
                "k8snetworkpolicy" | "k8snetworkpolicie" | "knp" => {
                    return Ok(Kind::K8sNetworkPolicy);
                }
                "globalnetworkpolicy" | "globalnetworkpolicie" | "gnp" => {
                    return Ok(Kind::GlobalNetworkPolicy);
                }
                "workloadendpoint" | "wep" => return Ok(Kind::WorkloadEndpoint),
                "namespace" => return Ok(Kind::Namespace),
                _ => {}
            }
        }
        Err(format!(
            "unknown kind {s:?}: one of IPPool, BGPConfiguration, BGPPeer, BGPFilter, Node, NetworkPolicy, GlobalNetworkPolicy, WorkloadEndpoint, Namespace"
        ))
    }
}

/// One resource document of a file, before its fields are checked.
#[derive(Debug, Clone)]
pub struct Document {
    /// 1-based position in the file (items of a List count one each).
    pub index: usize,
    pub kind: Kind,
    pub name: String,
    /// A namespaced kind's namespace (`default` when the document names none); else empty.
    pub namespace: String,
    pub body: Value,
}

/// A refusal of one document: which one, and the field (or reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocError {
    pub index: usize,
    pub kind: String,
    pub name: String,
    pub error: FieldError,
}

impl fmt::Display for DocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.name.is_empty() {
            "(no name)"
        } else {
            &self.name
        };
        write!(
            f,
            "document {} ({} {name}): {}; nothing was applied",
            self.index, self.kind, self.error
        )
    }
}

impl std::error::Error for DocError {}

impl Document {
    pub fn error(&self, e: FieldError) -> DocError {
        DocError {
            index: self.index,
            kind: self.kind.name().into(),
            name: self.name.clone(),
            error: e,
        }
    }
}

/// The resource documents of a file, in order, with `List`s flattened.
pub fn parse_file(text: &str) -> Result<Vec<Document>, DocError> {
    let raw = yaml::parse_stream(text).map_err(|e| DocError {
        index: 0,
        kind: "file".into(),
        name: String::new(),
        error: FieldError::new("(file)", e),
    })?;
    let mut docs = Vec::new();
    for value in raw {
        let index = docs.len() + 1;
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        let is_list = kind == "List" || (kind.ends_with("List") && kind.len() > 4);
        if is_list {
            let fail = |e: FieldError| DocError {
                index,
                kind: kind.to_owned(),
                name: String::new(),
                error: e,
            };
            let mut top = Obj::new("", value.clone()).map_err(fail)?;
            check_list_api_version(&mut top).map_err(fail)?;
            top.take("kind");
            top.take("metadata"); // a List's metadata is only its resourceVersion
            let items = top.list("items").map_err(fail)?.unwrap_or_default();
            top.finish().map_err(fail)?;
            let want = kind.strip_suffix("List").filter(|k| !k.is_empty());
            for (i, item) in items.into_iter().enumerate() {
                let index = docs.len() + 1;
                let d = document(index, item).map_err(|mut e| {
                    e.error.path = format!("items[{i}].{}", e.error.path);
                    e
                })?;
                if let Some(w) = want.filter(|w| *w != d.kind.name()) {
                    return Err(d.error(FieldError::new(
                        format!("items[{i}].kind"),
                        format!("a {kind} holds {w} items only"),
                    )));
                }
                docs.push(d);
            }
        } else {
            docs.push(document(index, value)?);
        }
    }
    Ok(docs)
}

/// A List's apiVersion: Calico's, or v1 as Kubernetes writes its lists (`kubectl get -o yaml`).
fn check_list_api_version(top: &mut Obj) -> fields::Result<()> {
    match top.str("apiVersion")?.as_deref() {
        Some(API_VERSION | "v1") => Ok(()),
        None => Err(FieldError::new(
            "apiVersion",
            format!("required ({API_VERSION})"),
        )),
        Some(other) => Err(FieldError::new(
            "apiVersion",
            format!("{other:?} is not supported: {API_VERSION} or v1 only"),
        )),
    }
}

fn check_api_version(top: &mut Obj) -> fields::Result<()> {
    match top.str("apiVersion")?.as_deref() {
        Some(API_VERSION) => Ok(()),
        None => Err(FieldError::new(
            "apiVersion",
            format!("required ({API_VERSION})"),
        )),
        Some(other) => Err(FieldError::new(
            "apiVersion",
            format!("{other:?} is not supported: {API_VERSION} only"),
        )),
    }
}

fn document(index: usize, value: Value) -> Result<Document, DocError> {
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let kind_text = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let fail = |e: FieldError| DocError {
        index,
        kind: if kind_text.is_empty() {
            "(no kind)".into()
        } else {
            kind_text.clone()
        },
        name: name.clone(),
        error: e,
    };
    if kind_text.is_empty() {
        return Err(fail(FieldError::new("kind", "required")));
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind =
        Kind::of_document(&kind_text, api_version).map_err(|e| fail(FieldError::new("kind", e)))?;
    if name.is_empty() {
        return Err(fail(FieldError::new("metadata.name", "required")));
    }
    let namespace = if kind.namespaced() {
        value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned()
    } else {
        String::new()
    };
    Ok(Document {
        index,
        kind,
        name,
        namespace,
        body: value,
    })
}

/// A document's metadata and spec, with `apiVersion` and `kind` checked.
pub struct Parts {
    pub metadata: Obj,
    pub spec: Obj,
    /// `metadata.resourceVersion`: the revision the document was read at, checked on apply.
    pub revision: u64,
}

/// Splits a document; `extra_top` names top-level fields besides the usual four that the kind
/// accepts and drops (a Node's `status`).
pub fn parts(doc: &Document, extra_top: &[&str]) -> fields::Result<Parts> {
    let mut top = Obj::new("", doc.body.clone())?;
    check_api_version(&mut top)?;
    top.take("kind");
    for k in extra_top {
        top.take(k);
    }
    let mut metadata = top
        .obj("metadata")?
        .ok_or_else(|| FieldError::new("metadata", "required"))?;
    let spec = top.obj("spec")?.unwrap_or(Obj::new("spec", Value::Null)?);
    top.finish()?;
    metadata.take("name");
    for read_only in ["uid", "creationTimestamp", "generation"] {
        metadata.take(read_only);
    }
    metadata.refuse(
        "namespace",
        "Calico's BGP and IPAM resources are not namespaced",
        &[json!("")],
    )?;
    let revision = match metadata.take("resourceVersion") {
        None => 0,
        Some(Value::String(s)) if s.is_empty() => 0,
        Some(Value::String(s)) => s.parse().map_err(|_| {
            FieldError::new(
                "metadata.resourceVersion",
                format!("{s:?} is not a revision bgpd gave (a whole number)"),
            )
        })?,
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(_) => {
            return Err(FieldError::new(
                "metadata.resourceVersion",
                "must be a string",
            ));
        }
    };
    Ok(Parts {
        metadata,
        spec,
        revision,
    })
}

/// The metadata margay keeps for every kind but Node: name and revision; labels and
/// annotations are refused (margay does not store them for this kind).
pub fn plain_metadata(mut m: Obj, kind: Kind) -> fields::Result<()> {
    let why = format!("not stored for {} resources by margay", kind.name());
    m.refuse("labels", &why, &[json!({})])?;
    m.refuse("annotations", &why, &[json!({})])?;
    m.finish()
}

/// A document as `get` prints it.
pub fn document_value(kind: Kind, name: &str, revision: u64, spec: Value) -> Value {
    let mut metadata = json!({ "name": name });
    if revision != 0 {
        metadata["resourceVersion"] = json!(revision.to_string());
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": kind.name(),
        "metadata": metadata,
        "spec": spec,
    })
}

/// Several documents of one kind, as calicoctl prints a list.
pub fn list_value(kind: Kind, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": format!("{}List", kind.name()),
        "items": items,
    })
}

#[cfg(test)]
mod tests;
