//! Kubernetes Services and EndpointSlices, read for bgpd's service advertisement (Calico's
//! `externalTrafficPolicy: Local` routes): per Service what decides its announcement (the
//! policy, its cluster, external and load-balancer ingress addresses), per EndpointSlice the
//! nodes where its Service has a ready endpoint. Both are lists and watches of the cluster's
//! own objects; margay stores nothing of them. A value is the JSON of [`ServiceFacts`] or
//! [`SliceFacts`], so that they travel the same list-and-watch path as every other kind.
//!
//! The mapping (`service_facts`, `slice_facts`) is pure and unit-tested; which addresses a
//! node announces is bgpd's business (`bgpd::services::kubernetes`), not this module's.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::{KubeStore, follow, list_objects, version_of};
use crate::contract::{Object, ObjectEvent, ObjectList, ObjectWatch, Result, Version, Watch};

/// The label Kubernetes puts on an EndpointSlice naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What margay reads of one Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceFacts {
    /// The Service's uid (what an Event on it names).
    pub uid: String,
    /// `externalTrafficPolicy: Local`: announced only from nodes with a ready endpoint.
    pub local: bool,
    /// `spec.clusterIPs` (else `spec.clusterIP`), without `None` (headless).
    pub cluster_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip`.
    pub load_balancer_ips: Vec<IpAddr>,
    /// Entries of `spec.externalIPs` or the ingress IPs that are not addresses, as written.
    pub invalid: Vec<String>,
}

/// What margay reads of one EndpointSlice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceFacts {
    /// The Service's `namespace/name`.
    pub service: String,
    /// The nodes with an endpoint that is ready (a condition left unset counts as ready, as
    /// the API documents it).
    pub ready_nodes: BTreeSet<String>,
}

fn key(namespace: Option<&String>, name: Option<&String>) -> String {
    format!(
        "{}/{}",
        namespace.map_or("", String::as_str),
        name.map_or("", String::as_str)
    )
}

fn parse_into(texts: &[String], good: &mut Vec<IpAddr>, bad: &mut Vec<String>) {
    for t in texts {
        match t.trim().parse() {
            Ok(a) => good.push(a),
            Err(_) => bad.push(t.clone()),
        }
    }
}

/// The facts of `s`.
pub fn service_facts(s: &Service) -> ServiceFacts {
    let mut f = ServiceFacts {
        uid: s.metadata.uid.clone().unwrap_or_default(),
        ..ServiceFacts::default()
    };
    let mut ignored = Vec::new();
    if let Some(spec) = &s.spec {
        f.local = spec.external_traffic_policy.as_deref() == Some("Local");
        let cluster = spec
            .cluster_ips
            .clone()
            .filter(|ips| !ips.is_empty())
            .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
            .unwrap_or_default();
        // Headless ("None") and ExternalName Services have no proxy behind their
        // addresses (kube-proxy skips them, and so does Calico's advertisement): nothing to
        // announce, and nothing wrong.
        let headless = cluster.iter().all(|ip| ip.is_empty() || ip == "None");
        if headless || spec.type_.as_deref() == Some("ExternalName") {
            return f;
        }
        parse_into(&cluster, &mut f.cluster_ips, &mut ignored);
        parse_into(
            spec.external_ips.as_deref().unwrap_or_default(),
            &mut f.external_ips,
            &mut f.invalid,
        );
    }
    let ingress: Vec<String> = s
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .collect();
    parse_into(&ingress, &mut f.load_balancer_ips, &mut f.invalid);
    f
}

/// The facts of `e`.
pub fn slice_facts(e: &EndpointSlice) -> SliceFacts {
    let service = e
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL));
    SliceFacts {
        service: key(e.metadata.namespace.as_ref(), service),
        ready_nodes: e
            .endpoints
            .iter()
            .filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .filter_map(|ep| ep.node_name.clone())
            .collect(),
    }
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("plain structs serialize")
}

/// The name of a resource: `namespace/name`.
fn name_of<K: kube::Resource>(r: &K) -> String {
    key(r.meta().namespace.as_ref(), r.meta().name.as_ref())
}

/// Every resource of `api`, its value the JSON of its `facts`.
async fn list_facts<K, T>(api: &Api<K>, what: &str, facts: fn(&K) -> T) -> Result<ObjectList>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    T: Serialize,
{
    list_objects(api, None, what, "", |r, version| {
        Ok(Some(Object {
            name: name_of(r),
            value: to_json(&facts(r)),
            version,
        }))
    })
    .await
}

/// The changes of `api`'s resources after `from`, as [`list_facts`] gives them (a deletion
/// has no value).
fn watch_facts<K, T>(api: Api<K>, from: Version, facts: fn(&K) -> T) -> ObjectWatch
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    T: Serialize + 'static,
{
    let (tx, rx) = mpsc::channel(Watch::DEPTH);
    let task = tokio::spawn(follow(api, None, from, tx, move |r, deleted| {
        Ok(Some(ObjectEvent {
            name: name_of(r),
            value: (!deleted).then(|| to_json(&facts(r))),
            version: version_of(r.meta().resource_version.as_deref())?,
        }))
    }));
    ObjectWatch::of_objects(rx, task)
}

impl KubeStore {
    fn services_api(&self) -> Api<Service> {
        Api::all(self.inner.client.clone())
    }

    fn slices_api(&self) -> Api<EndpointSlice> {
        Api::all(self.inner.client.clone())
    }

    /// Every Service, named `namespace/name`, its value a [`ServiceFacts`] in JSON.
    pub async fn list_services(&self) -> Result<ObjectList> {
        list_facts(&self.services_api(), "services", service_facts).await
    }

    /// The Services' changes after `from` (a deletion has no value).
    pub fn watch_services(&self, from: Version) -> ObjectWatch {
        watch_facts(self.services_api(), from, service_facts)
    }

    /// Every EndpointSlice, named `namespace/name`, its value a [`SliceFacts`] in JSON.
    pub async fn list_endpoint_slices(&self) -> Result<ObjectList> {
        list_facts(&self.slices_api(), "endpointslices", slice_facts).await
    }

    /// The EndpointSlices' changes after `from` (a deletion has no value).
    pub fn watch_endpoint_slices(&self, from: Version) -> ObjectWatch {
        watch_facts(self.slices_api(), from, slice_facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_service_gives_its_policy_and_addresses_and_names_what_is_no_address() {
        let s = service(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                     "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                     "externalIPs": ["198.51.100.7", "not-an-ip"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.5"}, {"hostname": "lb.example"}]}},
        }));
        let f = service_facts(&s);
        assert!(f.local);
        assert_eq!(
            f.cluster_ips,
            vec![
                "10.96.0.10".parse::<IpAddr>().unwrap(),
                "fd00:96::10".parse().unwrap()
            ]
        );
        assert_eq!(
            f.external_ips,
            vec!["198.51.100.7".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            f.load_balancer_ips,
            vec!["203.0.113.5".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(f.invalid, vec!["not-an-ip".to_owned()]);
    }

    #[test]
    fn headless_and_external_name_services_announce_nothing_and_are_not_wrong() {
        for spec in [
            serde_json::json!({"clusterIP": "None", "externalIPs": ["198.51.100.7", "x"]}),
            serde_json::json!({"type": "ExternalName", "externalName": "db.example",
                               "externalIPs": ["198.51.100.7"]}),
        ] {
            let s = service(serde_json::json!({
                "metadata": {"name": "db", "namespace": "shop"}, "spec": spec,
            }));
            assert_eq!(service_facts(&s), ServiceFacts::default(), "{spec}");
        }
    }

    #[test]
    fn a_slice_names_its_service_and_the_nodes_of_its_ready_endpoints() {
        let e: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-abc", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.1.0.1"], "nodeName": "n1", "conditions": {"ready": true}},
                {"addresses": ["10.1.0.2"], "nodeName": "n2", "conditions": {"ready": false}},
                {"addresses": ["10.1.0.3"], "nodeName": "n3"},
                {"addresses": ["10.1.0.4"]},
            ],
        }))
        .unwrap();
        let f = slice_facts(&e);
        assert_eq!(f.service, "shop/web");
        assert_eq!(
            f.ready_nodes.into_iter().collect::<Vec<_>>(),
            vec!["n1".to_owned(), "n3".to_owned()]
        );
    }
}
