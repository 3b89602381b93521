//! The Kubernetes datastore's garbage collector, the part of Calico's kube-controllers that
//! keeps IPAM clean, run by every bgpd for its own node:
//!
//! - every half grace period, this node's addresses of pods that are gone, on another node,
//!   finished or holding other addresses are released once they have leaked for the grace
//!   period (`ipam::leaks` decides; each is checked again just before);
//! - the first node by name among margay's nodes also releases the addresses, blocks and
//!   affinities of nodes whose Kubernetes `Node` is gone, once gone for the grace period.
//!
//! A pass that cannot ask the apiserver everything it needs releases nothing: a pod that
//! exists is never collected because the apiserver was briefly unreachable. The task ends at
//! once on other datastores (their pods are the runtimes' `CNI GC`'s, `bgpctl ipam gc`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::datastore::kubernetes::{KubeStore, PodState};
use ::datastore::resource::Resource;
use ::datastore::{Store, model::Node};
use ipam::allocator::Ipam;
use ipam::leaks::{LeakTracker, PodSeen, leaked};

use crate::datastore::DatastoreHandle;

/// What one pass released.
#[derive(Debug, Default)]
struct Released {
    handles: Vec<(String, Vec<std::net::IpAddr>)>,
    nodes: Vec<String>,
}

/// The collector's memory between passes: since when each handle and each node has been
/// seen leaking or gone.
struct Collector {
    node: String,
    grace: Duration,
    handles: LeakTracker,
    nodes_gone: HashMap<String, u64>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn seen_of(state: Option<PodState>) -> PodSeen {
    match state {
        None => PodSeen::Gone,
        Some(s) => PodSeen::Exists {
            uid: s.uid,
            node: s.node,
            finished: s.finished,
            addresses: s.addresses,
        },
    }
}

/// Starts the collector of the configured node, unless the configuration turns it off.
pub fn start(config: &crate::config::Config, datastore: &DatastoreHandle) {
    if let Some(grace) = config.ipam.leak_grace() {
        tokio::spawn(run(config.node.name.clone(), grace, datastore.clone()));
    }
}

/// Runs the collector of node `node` with `grace`, until the datastore turns out not to be
/// the Kubernetes API.
pub async fn run(node: String, grace: Duration, datastore: DatastoreHandle) {
    let period = (grace / 2).max(Duration::from_secs(1));
    let mut c = Collector {
        node,
        grace,
        handles: LeakTracker::default(),
        nodes_gone: HashMap::new(),
    };
    // Whether the last pass found no datastore: an outage is said once, when it starts
    // (not before the first connection).
    let mut away = true;
    loop {
        tokio::time::sleep(period).await;
        let Some(ipam) = datastore.ipam() else {
            if !away {
                tracing::warn!(
                    "IPAM garbage collection skipped this pass: the datastore is not connected; no pass runs until it is"
                );
                away = true;
            }
            continue;
        };
        away = false;
        if ipam.store().as_kubernetes().is_none() {
            return;
        }
        match c.pass(&ipam).await {
            Ok(r) => {
                for (handle, addresses) in &r.handles {
                    tracing::info!(%handle, ?addresses, "released the addresses of a pod that is gone");
                }
                for node in &r.nodes {
                    tracing::info!(%node, "released the blocks and addresses of a deleted Node");
                }
            }
            // Nothing was released: what the pass saw before the failure is not acted on.
            Err(e) => tracing::warn!(error = %e, "IPAM garbage collection skipped this pass"),
        }
    }
}

impl Collector {
    async fn pass(&mut self, ipam: &Arc<Ipam<Store>>) -> Result<Released, ipam::IpamError> {
        let Some(kube) = ipam.store().as_kubernetes() else {
            return Ok(Released::default());
        };
        let mut released = Released::default();
        let held = ipam.pod_addresses_on(&self.node).await?;
        let pods: BTreeSet<(String, String)> = held
            .iter()
            .map(|a| (a.namespace.clone(), a.pod.clone()))
            .collect();
        let mut seen = BTreeMap::new();
        for (ns, pod) in pods {
            let state = kube.pod_state(&ns, &pod).await?;
            seen.insert((ns, pod), seen_of(state));
        }
        let grace = self.grace.as_secs();
        for handle in self.handles.pass(now(), grace, &self.node, &held, &seen) {
            // Calico's re-check: the handle's pods asked again, just before.
            if self.still_leaked(kube, &held, &handle).await? {
                let freed = ipam.release_by_handle(&handle).await?;
                released.handles.push((handle.clone(), freed));
            }
            self.handles.forget(&handle);
        }
        released.nodes = self.collect_nodes(ipam, kube).await?;
        Ok(released)
    }

    async fn still_leaked(
        &self,
        kube: &KubeStore,
        held: &[ipam::leaks::PodAddress],
        handle: &str,
    ) -> Result<bool, ipam::IpamError> {
        for a in held.iter().filter(|a| a.handle == handle) {
            let seen = seen_of(kube.pod_state(&a.namespace, &a.pod).await?);
            if !leaked(&self.node, a, Some(&seen)) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// On the first of margay's nodes by name: releases what nodes whose Kubernetes Node has
    /// been gone for the grace period hold. Returns those nodes.
    async fn collect_nodes(
        &mut self,
        ipam: &Arc<Ipam<Store>>,
        kube: &KubeStore,
    ) -> Result<Vec<String>, ipam::IpamError> {
        let margay_nodes = ::datastore::Datastore::list(ipam.store(), Node::kind(), "").await?;
        let first = margay_nodes.items.iter().map(|o| o.name.as_str()).min();
        if first != Some(self.node.as_str()) {
            self.nodes_gone.clear();
            return Ok(Vec::new());
        }
        let existing = kube.node_names().await?;
        let gone: BTreeSet<String> = ipam
            .nodes_with_affinities()
            .await?
            .into_iter()
            .filter(|n| !existing.contains(n))
            .collect();
        self.nodes_gone.retain(|n, _| gone.contains(n));
        let now = now();
        let due: Vec<String> = gone
            .into_iter()
            .filter(|n| {
                let since = *self.nodes_gone.entry(n.clone()).or_insert(now);
                now.saturating_sub(since) >= self.grace.as_secs()
            })
            .collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        // Asked again just before: a Node made again meanwhile keeps what it holds.
        let existing = kube.node_names().await?;
        let mut out = Vec::new();
        for node in due.into_iter().filter(|n| !existing.contains(n)) {
            ipam.release_node(&node).await?;
            self.nodes_gone.remove(&node);
            out.push(node);
        }
        Ok(out)
    }
}
