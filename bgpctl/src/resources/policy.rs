//! Network-policy documents (NetworkPolicy of both dialects, GlobalNetworkPolicy,
//! WorkloadEndpoint, Namespace): checked here with the `policy` crate — the same check bgpd
//! runs — so a file is refused whole before anything is applied, then sent to bgpd's `Policy`
//! service as JSON and stored as written. Also what `get` prints of them (the documents, or a
//! table), and the `label` and `show policy` commands.

use std::collections::BTreeMap;

use clap::Args;
use proto::v1 as pb;
use proto::v1::policy_client::PolicyClient;
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::fields::FieldError;
use super::{Document, Kind};
use crate::table::Table;
use crate::{CtlError, Output};

/// Checks a policy document; the refusal names the field's path.
pub fn check(doc: &Document) -> Result<String, FieldError> {
    policy::resource::parse_resource(&doc.body).map_err(|e| FieldError::new(e.path, e.reason))?;
    Ok(doc.body.to_string())
}

/// The stored kinds a command-line kind names: `networkpolicy` is both dialects.
pub fn stored_kinds(kind: Kind) -> Vec<pb::DocumentKind> {
    match kind {
        Kind::NetworkPolicy => vec![
            pb::DocumentKind::NetworkPolicy,
            pb::DocumentKind::K8sNetworkPolicy,
        ],
        Kind::K8sNetworkPolicy => vec![pb::DocumentKind::K8sNetworkPolicy],
        Kind::GlobalNetworkPolicy => vec![pb::DocumentKind::GlobalNetworkPolicy],
        Kind::WorkloadEndpoint => vec![pb::DocumentKind::WorkloadEndpoint],
        Kind::Namespace => vec![pb::DocumentKind::Namespace],
        _ => vec![],
    }
}

/// The stored kind of a document of the file.
pub fn stored_kind(kind: Kind) -> pb::DocumentKind {
    match kind {
        Kind::K8sNetworkPolicy => pb::DocumentKind::K8sNetworkPolicy,
        other => stored_kinds(other)
            .first()
            .copied()
            .unwrap_or(pb::DocumentKind::Unspecified),
    }
}

/// The documents of `kind` (`namespace` empty: all namespaces), optionally only `name`.
pub async fn list(
    channel: Channel,
    kind: Kind,
    namespace: &str,
    name: Option<&str>,
) -> Result<Vec<Value>, CtlError> {
    let mut c = PolicyClient::new(channel);
    let mut out = Vec::new();
    for k in stored_kinds(kind) {
        let docs = c
            .list(pb::ListDocumentsRequest {
                kind: k as i32,
                namespace: namespace.to_owned(),
                name: name.unwrap_or_default().to_owned(),
            })
            .await?
            .into_inner()
            .documents;
        for d in docs {
            let mut v: Value = serde_json::from_str(&d.json).map_err(|e| {
                CtlError::Invalid(format!("bgpd sent a document that is not JSON: {e}"))
            })?;
            if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), json!(d.revision.to_string()));
            }
            out.push(v);
        }
    }
    if out.is_empty()
        && let Some(n) = name
    {
        return Err(CtlError::Status {
            code: tonic::Code::NotFound,
            message: format!("{} {n} not found", kind.name()),
        });
    }
    Ok(out)
}

/// A list document of policy documents, as kubectl and calicoctl print lists.
pub fn list_value(kind: Kind, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": if kind == Kind::Namespace || kind == Kind::NetworkPolicy { "v1" } else { kind.api_version() },
        "kind": "List",
        "items": items,
    })
}

fn labels_text(v: &Value) -> String {
    let labels: Vec<String> = v
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    if labels.is_empty() {
        "-".into()
    } else {
        labels.join(",")
    }
}

fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("-")
        .to_owned()
}

/// The documents as a table (`get -o table`): endpoints with their pod, node, interface,
/// addresses and labels; others with their kind.
pub fn table(kind: Kind, docs: &[Value]) -> String {
    if kind == Kind::WorkloadEndpoint {
        let mut t = Table::new(&[
            "namespace",
            "name",
            "pod",
            "node",
            "interface",
            "networks",
            "labels",
        ]);
        for d in docs {
            let nets: Vec<&str> = d
                .pointer("/spec/ipNetworks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            t.row(vec![
                text(d, "/metadata/namespace"),
                text(d, "/metadata/name"),
                text(d, "/spec/pod"),
                text(d, "/spec/node"),
                text(d, "/spec/interfaceName"),
                nets.join(","),
                labels_text(d),
            ]);
        }
        return t.render();
    }
    let mut t = Table::new(&["namespace", "name", "kind", "labels"]);
    for d in docs {
        let dialect = match d.get("apiVersion").and_then(Value::as_str) {
            Some("networking.k8s.io/v1") => "NetworkPolicy (k8s)".to_owned(),
            _ => text(d, "/kind"),
        };
        t.row(vec![
            text(d, "/metadata/namespace"),
            text(d, "/metadata/name"),
            dialect,
            labels_text(d),
        ]);
    }
    t.render()
}

/// Deletes `name` of `kind`; every dialect of a `networkpolicy` that has it.
pub async fn delete(
    channel: Channel,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> Result<(), CtlError> {
    let mut c = PolicyClient::new(channel);
    let mut deleted = 0;
    let mut last = None;
    for k in stored_kinds(kind) {
        let r = c
            .delete(pb::DocumentRef {
                kind: k as i32,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
            .await;
        match r {
            Ok(_) => deleted += 1,
            Err(s) if s.code() == tonic::Code::NotFound => last = Some(s),
            Err(s) => return Err(s.into()),
        }
    }
    match (deleted, last) {
        (0, Some(s)) => Err(s.into()),
        _ => Ok(()),
    }
}

#[derive(Args)]
pub struct LabelArgs {
    /// workloadendpoint (wep) or namespace (ns).
    pub kind: String,
    /// The endpoint's or namespace's name (for an endpoint, its pod's name works too).
    pub name: String,
    /// KEY=VALUE sets a label, KEY- removes it.
    #[arg(required = true)]
    pub labels: Vec<String>,
    /// The endpoint's namespace.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
}

/// The label changes of a command line: what to set, what to remove.
pub fn label_changes(args: &[String]) -> Result<(BTreeMap<String, String>, Vec<String>), CtlError> {
    let mut set = BTreeMap::new();
    let mut remove = Vec::new();
    for a in args {
        if let Some((k, v)) = a.split_once('=') {
            if k.is_empty() {
                return Err(CtlError::Invalid(format!("{a:?}: a label needs a key")));
            }
            set.insert(k.to_owned(), v.to_owned());
        } else if let Some(k) = a.strip_suffix('-').filter(|k| !k.is_empty()) {
            remove.push(k.to_owned());
        } else {
            return Err(CtlError::Invalid(format!(
                "{a:?}: write KEY=VALUE to set a label or KEY- to remove it"
            )));
        }
    }
    Ok((set, remove))
}

pub async fn label(channel: Channel, args: LabelArgs, out: &mut Output) -> Result<(), CtlError> {
    let kind = Kind::parse(&args.kind, true).map_err(CtlError::Invalid)?;
    if !matches!(kind, Kind::WorkloadEndpoint | Kind::Namespace) {
        return Err(CtlError::Invalid(format!(
            "label: {} cannot be labelled this way (workloadendpoint or namespace); edit its file and apply it",
            kind.name()
        )));
    }
    let (set, remove) = label_changes(&args.labels)?;
    let namespace = if kind.namespaced() {
        args.namespace.clone()
    } else {
        String::new()
    };
    let mut name = args.name.clone();
    if kind == Kind::WorkloadEndpoint {
        // A pod's name finds its endpoint.
        let all = list(channel.clone(), kind, &namespace, None).await?;
        if let Some(d) = all
            .iter()
            .find(|d| text(d, "/metadata/name") == args.name || text(d, "/spec/pod") == args.name)
        {
            name = text(d, "/metadata/name");
        }
    }
    PolicyClient::new(channel)
        .label(pb::LabelRequest {
            r#ref: Some(pb::DocumentRef {
                kind: stored_kind(kind) as i32,
                namespace,
                name: name.clone(),
            }),
            set: set.into_iter().collect(),
            remove,
        })
        .await?;
    out.line(&format!("{} {name} labelled", kind.name()))
}

/// `bgpctl show policy POD`: which policies select it and what they allow.
pub async fn show(
    channel: Channel,
    namespace: &str,
    endpoint: &str,
    json: bool,
    out: &mut Output,
) -> Result<(), CtlError> {
    let r = PolicyClient::new(channel)
        .explain(pb::ExplainRequest {
            namespace: namespace.to_owned(),
            endpoint: endpoint.to_owned(),
        })
        .await?
        .into_inner();
    if json {
        let v: Value = serde_json::from_str(&r.json).unwrap_or(Value::Null);
        out.json(&v)
    } else {
        out.text(&r.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_changes_set_and_remove() {
        let (set, remove) =
            label_changes(&["app=web".into(), "tier-".into(), "empty=".into()]).unwrap();
        assert_eq!(set["app"], "web");
        assert_eq!(set["empty"], "");
        assert_eq!(remove, vec!["tier"]);
        assert!(label_changes(&["=x".into()]).is_err());
        assert!(label_changes(&["nonsense".into()]).is_err());
    }
}
