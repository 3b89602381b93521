//! What policies select: workload endpoints (one per pod interface, as Calico keeps them)
//! and namespaces, with the implicit labels Calico gives them, and how an
//! `EndpointSelection` matches one endpoint.
//!
//! Implicit labels: a namespace always has `kubernetes.io/metadata.name` and
//! `projectcalico.org/name` set to its name (also when no Namespace document exists); an
//! endpoint has `projectcalico.org/namespace`, `projectcalico.org/orchestrator: k8s` and,
//! with a service account, `projectcalico.org/serviceaccount`. A service account has
//! `projectcalico.org/name`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::fields::{Field, Object};
use super::values::{cidr, metadata, port_name, port_number, protocol};
use super::{EndpointSelection, FieldError, NamespaceMatch, Protocol};

const NAMESPACE_LABEL: &str = "projectcalico.org/namespace";
const ORCHESTRATOR_LABEL: &str = "projectcalico.org/orchestrator";
const SERVICE_ACCOUNT_LABEL: &str = "projectcalico.org/serviceaccount";
const NAME_LABEL: &str = "projectcalico.org/name";
const K8S_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// One pod's interface and what policy needs to know of it. Stored as JSON (serde).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadEndpoint {
    pub namespace: String,
    pub name: String,
    pub pod: String,
    pub node: String,
    /// The host side of the pod's veth (`cali…`).
    pub interface: String,
    pub addresses: Vec<IpNet>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub service_account: Option<String>,
    #[serde(default)]
    pub ports: Vec<NamedPort>,
}

/// A container port with a name, which rules may name instead of its number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl Namespace {
    /// Its labels with the implicit name labels.
    pub fn effective_labels(&self) -> BTreeMap<String, String> {
        implicit_namespace_labels(&self.name, &self.labels)
    }
}

fn implicit_namespace_labels(
    name: &str,
    labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut all = labels.clone();
    all.insert(K8S_NAME_LABEL.into(), name.into());
    all.insert(NAME_LABEL.into(), name.into());
    all
}

/// The labels of namespace `name`: its document's, or only the implicit ones without one.
pub fn namespace_labels(namespaces: &[Namespace], name: &str) -> BTreeMap<String, String> {
    match namespaces.iter().find(|n| n.name == name) {
        Some(ns) => ns.effective_labels(),
        None => implicit_namespace_labels(name, &BTreeMap::new()),
    }
}

impl WorkloadEndpoint {
    /// Its labels with Calico's implicit ones, which selectors may use.
    pub fn effective_labels(&self) -> BTreeMap<String, String> {
        let mut all = self.labels.clone();
        all.insert(NAMESPACE_LABEL.into(), self.namespace.clone());
        all.insert(ORCHESTRATOR_LABEL.into(), "k8s".into());
        if let Some(sa) = &self.service_account {
            all.insert(SERVICE_ACCOUNT_LABEL.into(), sa.clone());
        }
        all
    }

    pub fn owns(&self, addr: IpAddr) -> bool {
        self.addresses.iter().any(|n| n.contains(&addr))
    }

    /// The number of the named port `name` for `protocol`, if the endpoint has one.
    pub fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name == name && p.protocol == protocol)
            .map(|p| p.port)
    }

    /// The endpoint as Calico's `WorkloadEndpoint` document (what `get` shows).
    pub fn to_document(&self) -> serde_json::Value {
        let ports: Vec<_> = self
            .ports
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "protocol": serde_json::to_value(p.protocol).unwrap_or_default(),
                    "port": p.port,
                })
            })
            .collect();
        let mut spec = json!({
            "orchestrator": "k8s",
            "node": self.node,
            "pod": self.pod,
            "endpoint": "eth0",
            "interfaceName": self.interface,
            "ipNetworks": self.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "profiles": [format!("kns.{}", self.namespace)],
            "ports": ports,
        });
        if let Some(sa) = &self.service_account {
            spec["serviceAccountName"] = json!(sa);
        }
        json!({
            "apiVersion": "projectcalico.org/v3",
            "kind": "WorkloadEndpoint",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": self.effective_labels(),
            },
            "spec": spec,
        })
    }
}

impl EndpointSelection {
    /// Whether `ep` is selected; `ep_labels` are its effective labels and `ns_labels` its
    /// namespace's (both computed once by the caller, who matches many selections).
    pub fn matches(
        &self,
        ep: &WorkloadEndpoint,
        ep_labels: &BTreeMap<String, String>,
        ns_labels: &BTreeMap<String, String>,
    ) -> bool {
        let namespace_ok = match &self.namespaces {
            NamespaceMatch::Any => true,
            NamespaceMatch::Named(ns) => *ns == ep.namespace,
            NamespaceMatch::Selector(s) => s.matches(ns_labels),
        };
        let service_account_ok = match (&self.service_accounts, &ep.service_account) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(m), Some(sa)) => {
                let sa_labels = BTreeMap::from([(NAME_LABEL.to_owned(), sa.clone())]);
                (m.names.is_empty() || m.names.contains(sa)) && m.selector.matches(&sa_labels)
            }
        };
        namespace_ok && service_account_ok && self.selector.matches(ep_labels)
    }

    /// The same, looking up the labels (convenient, slower).
    pub fn matches_in(&self, ep: &WorkloadEndpoint, namespaces: &[Namespace]) -> bool {
        self.matches(
            ep,
            &ep.effective_labels(),
            &namespace_labels(namespaces, &ep.namespace),
        )
    }
}

/// Parses a `v1` `Namespace` document.
pub fn parse_namespace(doc: &serde_json::Value) -> Result<Namespace, FieldError> {
    match super::parse_resource(doc)? {
        super::Resource::Namespace(ns) => Ok(ns),
        _ => Err(FieldError {
            path: "kind".into(),
            reason: "is not a Namespace (apiVersion v1)".into(),
        }),
    }
}

/// Parses a `projectcalico.org/v3` `WorkloadEndpoint` document.
pub fn parse_workload_endpoint(doc: &serde_json::Value) -> Result<WorkloadEndpoint, FieldError> {
    match super::parse_resource(doc)? {
        super::Resource::WorkloadEndpoint(ep) => Ok(ep),
        _ => Err(FieldError {
            path: "kind".into(),
            reason: "is not a WorkloadEndpoint (apiVersion projectcalico.org/v3)".into(),
        }),
    }
}

pub(super) fn parse_namespace_object(top: &Object) -> Result<Namespace, FieldError> {
    let meta = metadata(top, false)?;
    // What `kubectl get namespace -o yaml` adds; read-only here.
    if let Some(spec) = top.get("spec") {
        let spec = spec.object()?;
        spec.ignore(&["finalizers"]);
        spec.finish()?;
    }
    if let Some(status) = top.get("status") {
        let status = status.object()?;
        status.ignore(&["phase"]);
        status.finish()?;
    }
    top.finish()?;
    let mut labels = meta.labels;
    labels.remove(K8S_NAME_LABEL);
    labels.remove(NAME_LABEL);
    Ok(Namespace {
        name: meta.name,
        labels,
    })
}

pub(super) fn parse_endpoint_object(top: &Object) -> Result<WorkloadEndpoint, FieldError> {
    let meta = metadata(top, true)?;
    let spec = top.required("spec")?.object()?;
    let text = |f: Field| f.str().map(str::to_owned);
    let node = text(spec.required("node")?)?;
    let pod = text(spec.required("pod")?)?;
    let interface = text(spec.required("interfaceName")?)?;
    let addresses = match spec.get("ipNetworks") {
        Some(f) => f.each(|n| cidr(&n))?,
        None => Vec::new(),
    };
    let service_account = spec.get("serviceAccountName").map(text).transpose()?;
    let ports = match spec.get("ports") {
        Some(f) => f.each(|p| {
            let o = p.object()?;
            let name_field = o.required("name")?;
            let name = port_name(&name_field, name_field.str()?)?;
            let protocol = match o.get("protocol") {
                Some(f) => protocol(&f)?,
                None => Protocol::Tcp,
            };
            let port = port_number(&o.required("port")?)?;
            o.ignore(&["hostPort", "hostIP"]);
            o.finish()?;
            Ok(NamedPort {
                name,
                protocol,
                port,
            })
        })?,
        None => Vec::new(),
    };
    // Calico's bookkeeping, which margay derives instead of storing.
    spec.ignore(&[
        "orchestrator",
        "workload",
        "endpoint",
        "containerID",
        "mac",
        "profiles",
    ]);
    spec.finish()?;
    top.finish()?;
    let mut labels = meta.labels;
    for implicit in [NAMESPACE_LABEL, ORCHESTRATOR_LABEL, SERVICE_ACCOUNT_LABEL] {
        labels.remove(implicit);
    }
    Ok(WorkloadEndpoint {
        namespace: meta.namespace.unwrap_or_default(),
        name: meta.name,
        pod,
        node,
        interface,
        addresses,
        labels,
        service_account,
        ports,
    })
}
