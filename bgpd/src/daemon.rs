//! bgpd's life: bind the API, serve until SIGTERM or SIGINT, then stop cleanly (the socket is
//! removed on the way out). Everything that can fail at start fails before anything is served.

use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::api::{Api, ApiError, DaemonInfo};
use crate::config::Config;
use crate::datastore;

/// How long in-flight requests and streams get to finish after a stop signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("cannot open the datastore: {0}")]
    Datastore(#[source] ::datastore::contract::StoreError),
    #[error("cannot start BGP: {0}")]
    Bgp(#[from] crate::speaker::SpeakerError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error("cannot install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

/// Runs bgpd until a stop signal. SIGHUP reloads `path` (see [`reload`]).
pub async fn run(config: Config, path: Option<std::path::PathBuf>) -> Result<(), DaemonError> {
    let started = Instant::now();
    let mut terminate = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(DaemonError::Signals)?;

    // The datastore first: a SQLite file that cannot be used stops bgpd before it serves.
    let datastore = datastore::start(&config.datastore)
        .await
        .map_err(DaemonError::Datastore)?;
    // On the Kubernetes API, a node without configured addresses takes its Node's.
    let config = crate::node_address::resolve(config, &datastore).await;
    let api = Api::bind(&config.api).await?;
    let observed = crate::metrics::Listener::bind(&config.metrics).await?;
    let (registered_tx, registered) = tokio::sync::watch::channel(false);
    tokio::spawn(crate::registration::run(
        config.clone(),
        datastore.clone(),
        registered_tx,
    ));
    crate::kube_gc::start(&config, &datastore);
    let dataplane = crate::dataplane::Hub::new();
    // The speaker always runs (it serves the Bgp API); it binds the BGP port only once it
    // has a peer, so nodes without peers never contend for port 179.
    let bgp = crate::peering::start_from_config(
        &config.bgp,
        config.node.address.map(|a| a.addr()),
        config.node.address6.map(|a| a.addr()),
        Some(std::sync::Arc::new(dataplane.clone())),
    )
    .await?;
    tokio::spawn(crate::cluster::run(
        config.node.name.clone(),
        config.bgp.clone(),
        datastore.clone(),
        dataplane.clone(),
        bgp.clone(),
    ));
    let api = api.with_services(start_services(&config, &datastore, &bgp));
    let info = DaemonInfo {
        node: config.node.name.clone(),
        datastore,
        registered,
        started,
        dataplane,
        bgp,
        api_stats: Default::default(),
    };
    if let Some(listener) = observed {
        tracing::info!(addr = ?listener.local_addr(), "serving /metrics, /ready, /live, /status");
        tokio::spawn(listener.serve(info.clone()));
    }
    tracing::info!(
        version = crate::VERSION,
        node = %info.node,
        socket = %config.api.socket.display(),
        tcp = ?api.tcp_addr(),
        datastore = %info.datastore.describe(),
        "bgpd serving"
    );

    let (stop, stopped) = watch::channel(false);
    let speaker = info.bgp.clone();
    let mut server = tokio::spawn(api.serve(info, stopped));
    let mut running = config;
    loop {
        tokio::select! {
            result = &mut server => return flatten(result),
            Some(()) = hangup.recv() => reload(&mut running, path.as_deref(), &speaker).await,
            Some(()) = terminate.recv() => {
                tracing::info!("SIGTERM: stopping");
                break;
            }
            Some(()) = interrupt.recv() => {
                tracing::info!("SIGINT: stopping");
                break;
            }
        }
    }
    // Close the BGP sessions first: without a NOTIFICATION where graceful restart is on, so
    // that peers keep our routes until we are back.
    if tokio::time::timeout(Duration::from_secs(1), speaker.shutdown())
        .await
        .is_ok()
    {
        // Let the session tasks close their connections.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
        Ok(result) => flatten(result)?,
        Err(_) => {
            tracing::warn!("requests still open after {SHUTDOWN_GRACE:?}; closing them");
            server.abort();
            // Dropping the aborted task drops the socket guard, which removes the socket.
            let _ = server.await;
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// The service announcements, with the node's own address as next hop (as its blocks have);
/// on the Kubernetes datastore the cluster's Services drive some of them.
fn start_services(
    config: &Config,
    datastore: &crate::datastore::DatastoreHandle,
    bgp: &crate::speaker::SpeakerHandle,
) -> crate::services::ServicesHandle {
    let services = crate::services::start(
        bgp.clone(),
        crate::services::NextHops {
            v4: config.node.address.map(|a| a.addr()),
            v6: config.node.address6.map(|a| a.addr()),
        },
    );
    crate::kube_services::start(
        config.node.name.clone(),
        datastore.clone(),
        services.clone(),
    );
    services
}

/// SIGHUP: read the configuration again; refuse it whole (keeping the running one) if it
/// does not load, else apply the BGP peers and announcements live — only sessions whose
/// options changed are reset — and name what needs a restart.
async fn reload(
    running: &mut Config,
    path: Option<&std::path::Path>,
    speaker: &crate::speaker::SpeakerHandle,
) {
    let mut new = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: configuration reload refused; the running configuration stays");
            return;
        }
    };
    // Addresses the file leaves out are the ones resolved at start (`node_address`).
    if new.node.address.is_none() && new.node.address6.is_none() {
        new.adopt_addresses(running.node.address, running.node.address6);
    }
    match crate::peering::reload(speaker, &running.bgp, &new.bgp).await {
        Ok(mut report) => {
            for (name, changed) in [
                ("node", running.node != new.node),
                ("api", running.api != new.api),
                ("datastore", running.datastore != new.datastore),
                ("ipam", running.ipam != new.ipam),
                ("log", running.log != new.log),
                ("metrics", running.metrics != new.metrics),
            ] {
                if changed {
                    report.need_restart.push(name);
                }
            }
            tracing::info!(
                added = ?report.added,
                removed = ?report.removed,
                reset = ?report.reset,
                announced = ?report.announced,
                withdrawn = ?report.withdrawn,
                need_restart = ?report.need_restart,
                "SIGHUP: configuration reloaded"
            );
            running.bgp = new.bgp;
        }
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: applying the reloaded BGP configuration failed part way; restart bgpd to be sure of its state");
        }
    }
}

fn flatten(
    result: Result<Result<(), ApiError>, tokio::task::JoinError>,
) -> Result<(), DaemonError> {
    match result {
        Ok(r) => r.map_err(DaemonError::from),
        // The server task never panics by design; if it did, stop rather than serve half.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
