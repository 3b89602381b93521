//! Warnings about the cluster's objects that margay cannot act on as written: a Service's
//! address outside every range, a policy it cannot enforce, a Pod's IPAM annotations that
//! fail its ADD. Each is counted by reason (`margay_bgpd_warnings_total`) and, on the
//! Kubernetes datastore, recorded as a Warning Event on the object
//! (`datastore::kubernetes::EventSubject`), by a task of its own so that what found the
//! problem does not wait for the apiserver. The caller logs it, with its own context.
//!
//! The counters are process-wide statics: the cluster brain, the API and the services task
//! report here and share no handle, and a counter needs none.

use std::sync::atomic::{AtomicU64, Ordering};

use ::datastore::kubernetes::{EventSubject, KubeStore};

/// What is wrong, as the Event's reason and the metric's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    AddressNotAnnounced = 0,
    PolicyNotEnforced = 1,
    InvalidIpamAnnotation = 2,
}

impl Reason {
    const ALL: [Reason; 3] = [
        Reason::AddressNotAnnounced,
        Reason::PolicyNotEnforced,
        Reason::InvalidIpamAnnotation,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reason::AddressNotAnnounced => "AddressNotAnnounced",
            Reason::PolicyNotEnforced => "PolicyNotEnforced",
            Reason::InvalidIpamAnnotation => "InvalidIPAMAnnotation",
        }
    }
}

static COUNTS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// The warnings reported since bgpd started, by reason.
pub fn counts() -> Vec<(&'static str, u64)> {
    Reason::ALL
        .iter()
        .zip(&COUNTS)
        .map(|(r, c)| (r.name(), c.load(Ordering::Relaxed)))
        .collect()
}

/// Reports `problems` (each one message) of `reason` on `subject`, seen by node `node`.
pub fn report(
    kube: Option<&KubeStore>,
    subject: EventSubject,
    reason: Reason,
    problems: Vec<String>,
    node: &str,
) {
    COUNTS[reason as usize].fetch_add(problems.len() as u64, Ordering::Relaxed);
    let Some(kube) = kube else {
        return;
    };
    let (kube, node) = (kube.clone(), node.to_owned());
    tokio::spawn(async move {
        for problem in problems {
            if let Err(e) = kube.warn(&subject, reason.name(), &problem, &node).await {
                tracing::warn!(?subject, error = %e, "recording a Warning Event failed");
            }
        }
    });
}
