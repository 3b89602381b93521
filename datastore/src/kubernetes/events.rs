//! Warnings margay records as Kubernetes Events on the objects it cannot act on as written (a
//! Service address outside every range, a policy it cannot enforce, a Pod's IPAM annotation
//! that names no pool), as Kubernetes' own controllers do, so that `kubectl describe` and
//! `kubectl get events` show them beside the object.
//!
//! One warning is one Event, named after the object and a digest of what is wrong (not of
//! the node that saw it): every node that sees the same problem writes the same Event, the
//! first one creates it and the rest find it there. Recording is best effort: a failure is
//! the caller's to log, and never stops what it was doing.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, PostParams};
use sha2::{Digest, Sha256};

use super::{KubeStore, http_code, request_error};
use crate::contract::Result;
use crate::documents::{DocKind, DocRef};

/// Who records the Events (`source.component`, `reportingComponent`).
const COMPONENT: &str = "margay-bgpd";
/// Where Events on cluster-wide objects go, as Kubernetes puts them.
const CLUSTER_WIDE_NAMESPACE: &str = "default";

/// The object a warning is about.
#[derive(Debug, Clone)]
pub struct EventSubject {
    resource: ApiResource,
    namespace: Option<String>,
    name: String,
    /// Its uid when the caller knows it; else it is read before the Event is written.
    uid: Option<String>,
}

impl EventSubject {
    /// A Service of `uid` (bgpd may list Services but not get one).
    pub fn service(namespace: &str, name: &str, uid: &str) -> Self {
        EventSubject {
            resource: ApiResource::erase::<Service>(&()),
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
            uid: (!uid.is_empty()).then(|| uid.to_owned()),
        }
    }

    pub fn pod(namespace: &str, name: &str) -> Self {
        EventSubject {
            resource: ApiResource::erase::<Pod>(&()),
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
            uid: None,
        }
    }

    /// The object that holds policy document `r` on this datastore (an endpoint's: its Pod).
    pub fn document(r: &DocRef) -> Self {
        if r.kind == DocKind::WorkloadEndpoint {
            let pod = r
                .name
                .rsplit_once('.')
                .map_or(r.name.as_str(), |(pod, _)| pod);
            return Self::pod(&r.namespace, pod);
        }
        EventSubject {
            resource: super::documents::shape(r.kind).resource,
            namespace: (!r.namespace.is_empty()).then(|| r.namespace.clone()),
            name: r.name.clone(),
            uid: None,
        }
    }
}

/// The Event's name: the object's (shortened to leave room) and a digest of the warning and
/// the object's uid when known (a Service made again under the same name gets an Event of
/// its own).
fn event_name(subject: &EventSubject, reason: &str, message: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        subject.resource.kind.as_str(),
        subject.namespace.as_deref().unwrap_or(""),
        subject.name.as_str(),
        subject.uid.as_deref().unwrap_or(""),
        reason,
        message,
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let digest = data_encoding::HEXLOWER.encode(&h.finalize()[..8]);
    let base: String = subject.name.chars().take(200).collect();
    format!("{}.{digest}", base.trim_end_matches(['-', '.']))
}

impl KubeStore {
    /// Records a warning `reason` (CamelCase, as Kubernetes' reasons are) with `message` on
    /// `subject`, seen by node `reporter`. Already recorded (by this node or another): done.
    pub async fn warn(
        &self,
        subject: &EventSubject,
        reason: &str,
        message: &str,
        reporter: &str,
    ) -> Result<()> {
        let client = self.inner.client.clone();
        // The uid makes `kubectl describe` find the Event (it asks by the object's uid).
        let uid = match &subject.uid {
            Some(uid) => Some(uid.clone()),
            None => {
                let objects: Api<DynamicObject> = match &subject.namespace {
                    Some(ns) => Api::namespaced_with(client.clone(), ns, &subject.resource),
                    None => Api::all_with(client.clone(), &subject.resource),
                };
                objects
                    .get_opt(&subject.name)
                    .await
                    .map_err(|e| request_error(e, &subject.name))?
                    .and_then(|o| o.metadata.uid)
            }
        };
        let namespace = subject
            .namespace
            .clone()
            .unwrap_or_else(|| CLUSTER_WIDE_NAMESPACE.to_owned());
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name(subject, reason, message)),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(subject.resource.api_version.clone()),
                kind: Some(subject.resource.kind.clone()),
                namespace: subject.namespace.clone(),
                name: Some(subject.name.clone()),
                uid,
                ..ObjectReference::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some("Warning".to_owned()),
            source: Some(EventSource {
                component: Some(COMPONENT.to_owned()),
                host: Some(reporter.to_owned()),
            }),
            reporting_component: Some(COMPONENT.to_owned()),
            reporting_instance: Some(reporter.to_owned()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Event::default()
        };
        let events: Api<Event> = Api::namespaced(client, &namespace);
        match events.create(&PostParams::default(), &event).await {
            Ok(_) => Ok(()),
            Err(e) if http_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(request_error(e, "an Event")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_warning_on_the_same_object_is_one_event_whoever_sees_it() {
        let web = EventSubject::service("shop", "web", "u1");
        let a = event_name(&web, "AddressNotAnnounced", "203.0.113.1 is outside");
        assert_eq!(
            a,
            event_name(&web, "AddressNotAnnounced", "203.0.113.1 is outside")
        );
        assert!(a.starts_with("web."), "{a}");
        assert_ne!(
            a,
            event_name(&web, "AddressNotAnnounced", "203.0.113.2 is outside")
        );
        assert_ne!(
            a,
            event_name(
                &EventSubject::service("shop", "web", "u2"),
                "AddressNotAnnounced",
                "203.0.113.1 is outside"
            )
        );
        let pod = EventSubject::pod("shop", "web");
        assert_ne!(
            a,
            event_name(&pod, "AddressNotAnnounced", "203.0.113.1 is outside")
        );
        let long = EventSubject::service("shop", &"x".repeat(253), "");
        assert!(event_name(&long, "R", "m").len() <= 253);
    }

    #[test]
    fn a_document_is_reported_on_the_object_that_holds_it() {
        let ep = EventSubject::document(&DocRef::new(
            DocKind::WorkloadEndpoint,
            "shop",
            "web-1.eth0",
        ));
        assert_eq!(
            (ep.resource.kind.as_str(), ep.name.as_str()),
            ("Pod", "web-1")
        );
        let gnp = EventSubject::document(&DocRef::new(DocKind::GlobalNetworkPolicy, "", "deny"));
        assert_eq!(gnp.resource.api_version, "crd.projectcalico.org/v1");
        assert_eq!(gnp.namespace, None);
        let knp = EventSubject::document(&DocRef::new(DocKind::K8sNetworkPolicy, "shop", "allow"));
        assert_eq!(knp.resource.api_version, "networking.k8s.io/v1");
        assert_eq!(knp.resource.plural, "networkpolicies");
    }
}
