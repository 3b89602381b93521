//! Service advertisement on the Kubernetes datastore, as calico-node does it: bgpd follows the
//! cluster's Services and EndpointSlices (a list, then watches from its version) and the
//! `BGPConfiguration`, asks `services::kubernetes` what this node announces, and hands the
//! difference to the service announcements (`crate::services`) under the owner `kubernetes`.
//!
//! - An address is announced when the plan first has it and withdrawn when the plan stops
//!   having it: a Service with `externalTrafficPolicy: Local` follows its ready endpoints.
//! - What the task announced stays announced while the apiserver cannot be asked (a watch
//!   that ends is followed by a new list, after a backoff from 1 s to 30 s): the leases are
//!   renewed from the last plan, as Calico keeps its routes while its datastore is away.
//! - An address another owner leases (`bgpctl service announce`, a load-balancer
//!   controller) is left to it: this task neither takes it over nor withdraws it.
//! - A Service that names an address outside the ranges, or something that is no address, is
//!   reported once per change in the log and as an Event on the Service (reason
//!   `AddressNotAnnounced`), and the rest of the cluster's Services go on.
//!
//! The task ends at once on other datastores (there, a load-balancer controller calls the
//! `Services` API).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ::datastore::contract::{ObjectEvent, StoreError};
use ::datastore::kubernetes::{EventSubject, KubeStore};
use ::datastore::model::BgpConfiguration;
use ::datastore::{Resources, Store};

use crate::datastore::DatastoreHandle;
use crate::services::ServicesHandle;
use crate::services::kubernetes::ClusterServices;
use crate::warnings::Reason;

/// The owner of the leases this task takes (`bgpctl service list` shows it).
pub const OWNER: &str = "kubernetes";
/// How often the leases are renewed and the `BGPConfiguration` read again.
const RENEW: Duration = Duration::from_secs(10);
/// A lease's length: far above [`RENEW`], so that a request hanging on an unreachable
/// apiserver (each is bounded by [`REQUEST_LIMIT`]) never lets an address lapse.
const LEASE_TTL_S: u32 = 600;
/// The longest a list may take before the task gives up on it and tries again.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);
/// How often a Service's standing problems are reported again (see `Announcer::reported`).
const REPORT_AGAIN: Duration = Duration::from_secs(30 * 60);
/// The longest wait between two attempts to follow the cluster after failures (doubling
/// from a second, as client-go's backoff does).
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Starts the task of node `node`.
pub fn start(node: String, datastore: DatastoreHandle, services: ServicesHandle) {
    tokio::spawn(run(node, datastore, services));
}

/// What the task announced and reported so far.
struct Announcer {
    node: String,
    services: ServicesHandle,
    config: BgpConfiguration,
    announced: BTreeSet<IpAddr>,
    reported: BTreeMap<String, Vec<String>>,
    /// When `reported` was last forgotten: problems are reported again each
    /// [`REPORT_AGAIN`], since the apiserver drops Events after an hour and a write may fail.
    reported_since: Instant,
    renewed: Instant,
}

impl Announcer {
    /// Brings the announcements to what `cluster` asks for; a Service's new problems are
    /// logged and reported (`crate::warnings`: an Event on it).
    ///
    /// An address leased by another owner (an operator's `bgpctl service announce`, a
    /// load-balancer controller) is theirs: neither taken over nor withdrawn here.
    async fn apply(&mut self, cluster: &ClusterServices, kube: &KubeStore) {
        if self.reported_since.elapsed() >= REPORT_AGAIN {
            self.reported.clear();
            self.reported_since = Instant::now();
        }
        let plan = cluster.plan(&self.node, &self.config);
        for (service, problems) in &plan.problems {
            if self.reported.get(service) != Some(problems) {
                for problem in problems {
                    tracing::warn!(%service, %problem, "a Service's address is not announced");
                }
                let (namespace, name) = service.split_once('/').unwrap_or(("", service));
                crate::warnings::report(
                    Some(kube),
                    EventSubject::service(namespace, name, cluster.uid_of(service)),
                    Reason::AddressNotAnnounced,
                    problems.clone(),
                    &self.node,
                );
            }
        }
        self.reported = plan.problems;
        if plan.announce == self.announced {
            return;
        }
        let others = self.held_by_others().await;
        let gone: Vec<IpAddr> = self.announced.difference(&plan.announce).copied().collect();
        for address in gone {
            self.announced.remove(&address);
            if others.contains(&address) {
                continue;
            }
            match self.services.withdraw(address).await {
                Ok(()) => {
                    tracing::info!(%address, "service address withdrawn: no ready endpoint here any more")
                }
                Err(e) => {
                    tracing::warn!(%address, error = %e, "withdrawing a service address failed")
                }
            }
        }
        let new: Vec<IpAddr> = plan
            .announce
            .difference(&self.announced)
            .filter(|a| !others.contains(a))
            .copied()
            .collect();
        for address in new {
            match self
                .services
                .announce(address, OWNER.into(), LEASE_TTL_S)
                .await
            {
                Ok(_) => {
                    tracing::info!(%address, "service address announced: a ready endpoint is here");
                    self.announced.insert(address);
                }
                Err(e) => {
                    tracing::warn!(%address, error = %e, "announcing a service address failed")
                }
            }
        }
    }

    /// The addresses whose lease another owner holds now.
    async fn held_by_others(&self) -> BTreeSet<IpAddr> {
        self.services
            .list()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|l| l.owner != OWNER)
            .map(|l| l.address)
            .collect()
    }

    /// Renews every lease once [`RENEW`] has passed since the last time.
    async fn renew_if_due(&mut self) {
        if self.renewed.elapsed() >= RENEW {
            self.renew().await;
        }
    }

    /// Renews every lease this task holds (one another owner took is left to it).
    async fn renew(&mut self) {
        self.renewed = Instant::now();
        let others = self.held_by_others().await;
        self.announced.retain(|a| !others.contains(a));
        for &address in &self.announced {
            if let Err(e) = self
                .services
                .announce(address, OWNER.into(), LEASE_TTL_S)
                .await
            {
                tracing::warn!(%address, error = %e, "renewing a service address failed");
            }
        }
    }
}

async fn run(node: String, datastore: DatastoreHandle, services: ServicesHandle) {
    let mut a = Announcer {
        node,
        services,
        config: BgpConfiguration::default(),
        announced: BTreeSet::new(),
        reported: BTreeMap::new(),
        reported_since: Instant::now(),
        renewed: Instant::now(),
    };
    let mut cluster = ClusterServices::default();
    let mut backoff = Duration::from_secs(1);
    loop {
        if let Some(store) = datastore.store() {
            let Some(kube) = store.as_kubernetes() else {
                return;
            };
            let kube = kube.clone();
            let started = Instant::now();
            if let Err(e) = follow(&kube, &store, &mut cluster, &mut a).await {
                // A follow that lasted is a fresh start; one that failed at once waits longer.
                backoff = if started.elapsed() > BACKOFF_MAX {
                    Duration::from_secs(1)
                } else {
                    (backoff * 2).min(BACKOFF_MAX)
                };
                tracing::warn!(error = %e, retry_in = ?backoff, "following the cluster's Services failed; what is announced stays");
            }
        }
        // Sleeps in steps, so that the leases are renewed however long the backoff.
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            a.renew_if_due().await;
            tokio::time::sleep(Duration::from_secs(1).min(until - Instant::now())).await;
        }
    }
}

/// Reads the `BGPConfiguration` into `a`; on failure keeps the one it had.
async fn read_config(store: &Store, a: &mut Announcer) {
    let resources = Resources::new(store);
    match tokio::time::timeout(REQUEST_LIMIT, resources.bgp_configuration()).await {
        Ok(Ok(c)) => a.config = c.map(|(c, _)| c).unwrap_or_default(),
        Err(_) => tracing::warn!(
            "reading the BGPConfiguration for service advertisement took over {REQUEST_LIMIT:?}; the last one read stays"
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reading the BGPConfiguration for service advertisement failed; the last one read stays")
        }
    }
}

async fn limited<T>(
    what: &str,
    request: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(REQUEST_LIMIT, request)
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!("listing {what} took over {REQUEST_LIMIT:?}"))
        })?
}

/// One list of both kinds and their watches, until a watch ends.
async fn follow(
    kube: &KubeStore,
    store: &Store,
    cluster: &mut ClusterServices,
    a: &mut Announcer,
) -> Result<(), StoreError> {
    read_config(store, a).await;
    let services = limited("Services", kube.list_services()).await?;
    let slices = limited("EndpointSlices", kube.list_endpoint_slices()).await?;
    cluster.clear();
    for o in &services.items {
        cluster.set_service(&o.name, decoded(&o.name, Some(&o.value)));
    }
    for o in &slices.items {
        cluster.set_slice(&o.name, decoded(&o.name, Some(&o.value)));
    }
    a.apply(cluster, kube).await;
    let mut service_watch = kube.watch_services(services.version);
    let mut slice_watch = kube.watch_endpoint_slices(slices.version);
    let mut tick = tokio::time::interval(RENEW);
    loop {
        tokio::select! {
            e = service_watch.next() => {
                let e = event(e, "Services")?;
                cluster.set_service(&e.name, decoded(&e.name, e.value.as_deref()));
            }
            e = slice_watch.next() => {
                let e = event(e, "EndpointSlices")?;
                cluster.set_slice(&e.name, decoded(&e.name, e.value.as_deref()));
            }
            _ = tick.tick() => {
                read_config(store, a).await;
                a.renew().await;
            }
        }
        a.apply(cluster, kube).await;
    }
}

fn event(
    e: Option<Result<ObjectEvent, StoreError>>,
    what: &str,
) -> Result<ObjectEvent, StoreError> {
    e.unwrap_or_else(|| {
        Err(StoreError::Unavailable(format!(
            "the watch of {what} ended"
        )))
    })
}

/// A value of `datastore::kubernetes`' own JSON; one that does not read (it cannot, short of
/// a bug) is taken as gone, with a warning.
fn decoded<T: serde::de::DeserializeOwned>(name: &str, value: Option<&[u8]>) -> Option<T> {
    let value = value?;
    serde_json::from_slice(value)
        .map_err(|e| tracing::warn!(%name, error = %e, "skipping a Service or EndpointSlice margay cannot read"))
        .ok()
}
