//! What bgpd writes into the cluster state on its own: its node (name, addresses, AS, labels
//! from the configuration, keeping what others recorded, e.g. the tunnel address) and the
//! default pools the configuration names. Done whenever the datastore (re)connects, retried
//! with backoff while it fails; the first success is announced on a watch channel, which the
//! IPAM API waits for (an address asked for at start-up would otherwise find no pool yet).
//! While connected, it also gives this node's blocks that stayed empty for the configured
//! grace period back to the pool.

use std::time::Duration;

use tokio::sync::watch;

use ::datastore::contract::Datastore;
use ::datastore::model::Node;
use ::datastore::{ResourceError, Resources};
use ipam::IpamError;
use ipam::allocator::Ipam;

use crate::config::Config;
use crate::datastore::{DatastoreHandle, DatastoreState};

/// How often this node looks for empty blocks past their grace period.
const RECLAIM_EVERY: Duration = Duration::from_secs(60);

/// Registers the node and ensures the default pools, every time the datastore connects;
/// `registered` becomes true after the first time.
pub async fn run(config: Config, mut datastore: DatastoreHandle, registered: watch::Sender<bool>) {
    loop {
        if let Some(ipam) = datastore.ipam() {
            let mut delay = Duration::from_millis(250);
            loop {
                match register(&config, &ipam).await {
                    Ok(()) => {
                        registered.send_replace(true);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register the node yet; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(30));
                        if datastore.store().is_none() {
                            break;
                        }
                    }
                }
            }
        }
        // Until the next (re)connection: reclaim empty blocks now and then.
        loop {
            let state = tokio::select! {
                state = datastore.changed() => state,
                _ = tokio::time::sleep(RECLAIM_EVERY) => {
                    if let Some(ipam) = datastore.ipam() {
                        match ipam.reclaim_empty_blocks(&config.node.name).await {
                            Ok(blocks) if !blocks.is_empty() => tracing::info!(?blocks, "empty blocks given back to the pool"),
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "cannot reclaim empty blocks"),
                        }
                    }
                    continue;
                }
            };
            if !datastore.is_alive() {
                return;
            }
            if state == DatastoreState::Connected {
                break;
            }
        }
    }
}

/// One registration pass.
pub async fn register<D: Datastore>(config: &Config, ipam: &Ipam<D>) -> Result<(), IpamError> {
    let name = &config.node.name;
    let resources = Resources::new(ipam.store());
    let mut node = match resources.get_node(name).await {
        Ok((n, _)) => n,
        Err(ResourceError::NotFound(_)) => Node::new(name),
        Err(e) => return Err(e.into()),
    };
    node.ipv4 = config.node.address;
    node.ipv6 = config.node.address6;
    // The node's AS stays what the datastore says (unset: the cluster's, from the
    // BGPConfiguration or, until there is one, `[bgp] as`): writing the file's AS here would
    // pin every node and keep a cluster-wide AS change from taking.
    node.labels = config.node.labels.clone();
    resources.register_node(&node, None).await?;
    tracing::info!(node = %name, "node registered");
    for pool in &config.ipam.default_pools {
        match ipam.create_pool(&pool.to_pool()).await {
            Ok(_) => tracing::info!(pool = %pool.name, cidr = %pool.cidr, "default pool created"),
            Err(IpamError::AlreadyExists(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
