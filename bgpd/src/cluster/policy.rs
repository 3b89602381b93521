//! Network-policy documents as the brain and the API read them: a stored document (the user's
//! JSON, `::datastore::documents`) parsed by the `policy` crate into a resource, and the identity
//! each resource is stored under. One parse for both: what the API accepts is exactly what the
//! brain computes from.

use ::datastore::documents::{DocKind, DocRef};
use policy::resource::{
    FieldError, Namespace, Policy, PolicyKind, Resource, WorkloadEndpoint, parse_resource,
};
use serde_json::Value;

/// Where a resource is stored.
pub fn doc_ref(r: &Resource) -> DocRef {
    match r {
        Resource::Policy(p) => {
            let kind = match p.id.kind {
                PolicyKind::K8sNetworkPolicy => DocKind::K8sNetworkPolicy,
                PolicyKind::NetworkPolicy => DocKind::NetworkPolicy,
                PolicyKind::GlobalNetworkPolicy => DocKind::GlobalNetworkPolicy,
            };
            DocRef::new(kind, p.id.namespace.as_deref().unwrap_or(""), &p.id.name)
        }
        Resource::WorkloadEndpoint(w) => {
            DocRef::new(DocKind::WorkloadEndpoint, &w.namespace, &w.name)
        }
        Resource::Namespace(n) => DocRef::new(DocKind::Namespace, "", &n.name),
    }
}

/// A stored document, parsed; refused when it does not parse or is not what its key says.
pub fn decode(at: &DocRef, json: &Value) -> Result<Resource, FieldError> {
    let r = parse_resource(json)?;
    let stored = doc_ref(&r);
    if stored != *at {
        return Err(FieldError {
            path: "metadata".into(),
            reason: format!("names {stored}, but is stored as {at}"),
        });
    }
    Ok(r)
}

/// The policy inputs of the cluster, as the brain holds them.
#[derive(Debug, Clone, Default)]
pub struct PolicyDocs {
    pub policies: Vec<Policy>,
    pub endpoints: Vec<WorkloadEndpoint>,
    pub namespaces: Vec<Namespace>,
}

impl PolicyDocs {
    pub fn push(&mut self, r: Resource) {
        match r {
            Resource::Policy(p) => self.policies.push(p),
            Resource::WorkloadEndpoint(w) => self.endpoints.push(w),
            Resource::Namespace(n) => self.namespaces.push(n),
        }
    }

    pub fn cluster(&self) -> policy::compile::Cluster<'_> {
        policy::compile::Cluster {
            policies: &self.policies,
            endpoints: &self.endpoints,
            namespaces: &self.namespaces,
        }
    }
}
