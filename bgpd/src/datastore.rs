//! bgpd's connection to the cluster datastore. SQLite is opened before anything is served (a
//! bad file stops bgpd with its name); etcd is connected in the background with backoff, so a
//! cluster that is down at boot delays nothing but the datastore's own users. A probe keeps
//! the state current, and the state is what `bgpctl status` and the health service report:
//! an unreachable datastore is shown as such, never papered over.

use std::sync::Arc;
use std::time::Duration;

use ::datastore::Store;
use ::datastore::contract::{Datastore, StoreError};
use ::datastore::etcd::{EtcdOptions, EtcdStore};
use ::datastore::kubernetes::KubeStore;
use ::datastore::model::BgpConfiguration;
use ::datastore::resource::Resource;
use ::datastore::sqlite::{SqliteOptions, SqliteStore};
use ipam::allocator::Ipam;
use tokio::sync::watch;

use crate::config::{DatastoreConfig, DatastoreKind};

/// How often a connected etcd is probed: a network service, which goes away on its own.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// How often a SQLite file is probed: a local file does not go away by itself, and every
/// probe wakes an idle bgpd (and a thread for the blocking read) on every node.
const PROBE_EVERY_SQLITE: Duration = Duration::from_secs(30);
/// How long a probe may take before the datastore counts as unavailable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatastoreState {
    /// Not connected yet: the first attempt is under way.
    Connecting,
    Connected,
    /// The last attempt or probe failed with this reason; bgpd keeps retrying.
    Unavailable(String),
}

/// The store of one connection and its allocator: one `Ipam` per store, so that its node
/// locks, group-commit queues, hints and fast-path cache serve every request of that store
/// (an `Ipam` per request would keep none of them past the request).
#[derive(Clone)]
struct Generation {
    store: Store,
    ipam: Arc<Ipam<Store>>,
}

impl Generation {
    fn new(store: Store) -> Self {
        Generation {
            ipam: Arc::new(Ipam::new(store.clone())),
            store,
        }
    }
}

#[derive(Clone)]
struct Snapshot {
    state: DatastoreState,
    current: Option<Generation>,
}

/// A cheap, cloneable view of the datastore: its state, and the store when connected.
#[derive(Clone)]
pub struct DatastoreHandle {
    describe: String,
    rx: watch::Receiver<Snapshot>,
}

impl DatastoreHandle {
    /// e.g. "sqlite:/var/lib/margay/store.db".
    pub fn describe(&self) -> &str {
        &self.describe
    }

    pub fn state(&self) -> DatastoreState {
        self.rx.borrow().state.clone()
    }

    /// The store, if connected right now.
    pub fn store(&self) -> Option<Store> {
        self.connected().map(|g| g.store)
    }

    /// The allocator of the store, if connected right now: the same one for every caller
    /// while the store is the same.
    pub fn ipam(&self) -> Option<Arc<Ipam<Store>>> {
        self.connected().map(|g| g.ipam)
    }

    fn connected(&self) -> Option<Generation> {
        let snapshot = self.rx.borrow();
        match snapshot.state {
            DatastoreState::Connected => snapshot.current.clone(),
            _ => None,
        }
    }

    /// Waits for the state to change (returns at once, unchanged, once the supervisor ended).
    pub async fn changed(&mut self) -> DatastoreState {
        let _ = self.rx.changed().await;
        self.state()
    }

    /// Whether the task keeping the datastore current still runs.
    pub fn is_alive(&self) -> bool {
        self.rx.has_changed().is_ok()
    }
}

/// Opens the datastore the configuration names and starts the task that keeps it connected.
/// Only a SQLite file that cannot be used is an error here; etcd retries in the background.
pub async fn start(config: &DatastoreConfig) -> Result<DatastoreHandle, StoreError> {
    let describe = config.describe();
    match config.kind {
        DatastoreKind::Sqlite => {
            let current = Generation::new(connect(config).await?);
            let (tx, rx) = watch::channel(Snapshot {
                state: DatastoreState::Connected,
                current: Some(current.clone()),
            });
            tokio::spawn(supervise(tx, Some(current), config.clone()));
            Ok(DatastoreHandle { describe, rx })
        }
        DatastoreKind::Etcd | DatastoreKind::Kubernetes => {
            let (tx, rx) = watch::channel(Snapshot {
                state: DatastoreState::Connecting,
                current: None,
            });
            tokio::spawn(supervise(tx, None, config.clone()));
            Ok(DatastoreHandle { describe, rx })
        }
    }
}

/// The store as `datastore.transactions` says: with its `Atomic` extension in use, or
/// hidden (every write one object at a time).
fn with_transactions(store: Store, config: &DatastoreConfig) -> Store {
    if config.transactions {
        store
    } else {
        store.per_object()
    }
}

async fn connect(config: &DatastoreConfig) -> Result<Store, StoreError> {
    match config.kind {
        DatastoreKind::Sqlite => {
            let options = SqliteOptions {
                sync: config.sync,
                ..SqliteOptions::default()
            };
            Ok(with_transactions(
                Store::sqlite(SqliteStore::open(&config.path, options).await?),
                config,
            ))
        }
        DatastoreKind::Etcd => {
            let options = EtcdOptions {
                tls: config.tls.clone(),
                ..EtcdOptions::default()
            };
            Ok(with_transactions(
                Store::etcd(EtcdStore::connect(&config.endpoints, options).await?),
                config,
            ))
        }
        DatastoreKind::Kubernetes => {
            let store =
                KubeStore::connect(config.kubeconfig.as_deref(), ipam::calico::codecs()).await?;
            // Calico's CRDs (and margay's own) where the cluster lacks them; a cluster whose
            // RBAC forbids it (calico-node may not create CRDs) has them installed already.
            match store.install_crds().await {
                Ok(created) if !created.is_empty() => {
                    tracing::info!(crds = ?created, "installed the CRDs the cluster lacked");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not install missing CRDs"),
            }
            Ok(Store::kubernetes(store))
        }
    }
}

/// Connects (with backoff) and probes, publishing every change of state. Ends when nobody
/// holds a handle any more.
async fn supervise(
    tx: watch::Sender<Snapshot>,
    mut current: Option<Generation>,
    config: DatastoreConfig,
) {
    let mut backoff = BACKOFF_MIN;
    let publish = |state: DatastoreState, generation: Option<Generation>| {
        tx.send_if_modified(|s| {
            let changed = s.state != state;
            if changed {
                match &state {
                    DatastoreState::Connected => tracing::info!(datastore = %config.describe(), "datastore connected"),
                    DatastoreState::Unavailable(why) => tracing::warn!(datastore = %config.describe(), reason = %why, "datastore unavailable; retrying"),
                    DatastoreState::Connecting => {}
                }
            }
            *s = Snapshot { state: state.clone(), current: generation.clone() };
            changed
        });
    };
    loop {
        if tx.is_closed() {
            return;
        }
        let Some(generation) = current.clone() else {
            match connect(&config).await {
                Ok(s) => {
                    let generation = Generation::new(s);
                    publish(DatastoreState::Connected, Some(generation.clone()));
                    current = Some(generation);
                    backoff = BACKOFF_MIN;
                }
                Err(e) => {
                    publish(DatastoreState::Unavailable(e.to_string()), None);
                    tokio::time::sleep(jitter(backoff)).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
            continue;
        };
        tokio::time::sleep(match config.kind {
            DatastoreKind::Sqlite => PROBE_EVERY_SQLITE,
            DatastoreKind::Etcd | DatastoreKind::Kubernetes => PROBE_EVERY,
        })
        .await;
        // One read of one object: what every backend answers (the BGP configuration may
        // not exist; the read still says the store is reachable).
        let probe = generation
            .store
            .get(BgpConfiguration::kind(), BgpConfiguration::NAME);
        match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(_)) => publish(DatastoreState::Connected, Some(generation)),
            Ok(Err(e)) => publish(DatastoreState::Unavailable(e.to_string()), Some(generation)),
            Err(_) => publish(
                DatastoreState::Unavailable(format!("no answer within {PROBE_TIMEOUT:?}")),
                Some(generation),
            ),
        }
    }
}

/// ±20 % so that many nodes restarted together do not retry in step.
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    let factor = 0.8 + 0.4 * (nanos % 1000) as f64 / 1000.0;
    d.mul_f64(factor)
}
