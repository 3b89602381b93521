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
    Datastore(#[source] ipam::store::StoreError),
    #[error("cannot start BGP: {0}")]
    Bgp(#[from] crate::bgp::SpeakerError),
    #[error("cannot install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

/// Runs bgpd until a stop signal.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let started = Instant::now();
    let mut sigterm = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;

    // The datastore first: a SQLite file that cannot be used stops bgpd before it serves.
    let datastore = datastore::start(&config.datastore)
        .await
        .map_err(DaemonError::Datastore)?;
    let api = Api::bind(&config.api).await?;
    tokio::spawn(crate::registration::run(config.clone(), datastore.clone()));
    let dataplane = crate::dataplane::Hub::new();
    // The speaker always runs (it serves the Bgp API); it binds the BGP port only once it
    // has a peer, so nodes without peers never contend for port 179.
    let bgp = crate::bgp::start_from_config(
        &config.bgp,
        config.node.address.map(|a| a.addr()),
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
    let info = DaemonInfo {
        node: config.node.name.clone(),
        datastore,
        started,
        dataplane,
        bgp,
    };
    tracing::info!(
        version = crate::VERSION,
        node = %info.node,
        socket = %config.api.socket.display(),
        tcp = ?api.tcp_addr(),
        datastore = %info.datastore.describe(),
        "bgpd serving"
    );

    let (stop, stopped) = watch::channel(false);
    let mut server = tokio::spawn(api.serve(info, stopped));
    tokio::select! {
        result = &mut server => return flatten(result),
        _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
        _ = sigint.recv() => tracing::info!("SIGINT: stopping"),
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

fn flatten(
    result: Result<Result<(), ApiError>, tokio::task::JoinError>,
) -> Result<(), DaemonError> {
    match result {
        Ok(r) => r.map_err(DaemonError::from),
        // The server task never panics by design; if it did, stop rather than serve half.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
