//! The desired kernel state of this node, kept current from the datastore and served as the
//! `Dataplane.Watch` stream: a snapshot, then ordered changes, each with a revision.
//!
//! One task (`run`) owns the computation: it lists the cluster state, makes sure this node has
//! its VXLAN tunnel address when a VXLAN pool selects it, computes the desired state
//! (`desired::compute`), publishes the difference to the `Hub`, then waits on a datastore watch
//! for the next change. The `Hub` keeps the current state and a bounded history, so a client
//! that reconnects with its last revision gets only what changed (or a snapshot when that
//! revision is too old or from an earlier bgpd).

pub mod desired;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipam::IpamError;
use ipam::allocator::{AssignRequest, Ipam, TUNNEL_HANDLE_PREFIX};
use ipam::block::{Block, BlockAffinity};
use ipam::model::{AllowedUse, IpPool, Node};
use ipam::resource::{Resource, decode};
use ipam::selector::Selector;
use ipam::store::{Datastore, Listing, Store};
use proto::v1 as pb;
use tokio::sync::broadcast;

use crate::datastore::DatastoreHandle;
use desired::{Desired, Inputs};

/// Updates kept for clients that resume.
const HISTORY: usize = 1024;
/// Changes arriving within this window are computed once.
const DEBOUNCE: Duration = Duration::from_millis(20);

struct HubState {
    current: Desired,
    revision: u64,
    history: VecDeque<Arc<pb::DataplaneUpdate>>,
    /// Whether a first state has been computed.
    ready: bool,
}

/// The published desired state; cheap to clone.
#[derive(Clone)]
pub struct Hub {
    state: Arc<Mutex<HubState>>,
    tx: broadcast::Sender<Arc<pb::DataplaneUpdate>>,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new()
    }
}

impl Hub {
    pub fn new() -> Self {
        // Revisions start at this process's start time in microseconds, so a revision from an
        // earlier bgpd is never mistaken for one of ours: its client gets a snapshot.
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let (tx, _) = broadcast::channel(HISTORY);
        Self {
            state: Arc::new(Mutex::new(HubState {
                current: Desired::new(),
                revision: epoch,
                history: VecDeque::new(),
                ready: false,
            })),
            tx,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn snapshot_of(state: &HubState) -> pb::DataplaneUpdate {
        pb::DataplaneUpdate {
            revision: state.revision,
            snapshot: true,
            upsert: state.current.values().cloned().collect(),
            remove: vec![],
        }
    }

    /// The current desired state.
    pub fn current(&self) -> (Desired, u64) {
        let s = self.lock();
        (s.current.clone(), s.revision)
    }

    /// What a client resuming after `from` must be sent first, and the live updates after it.
    pub fn subscribe(
        &self,
        from: u64,
    ) -> (
        Vec<Arc<pb::DataplaneUpdate>>,
        broadcast::Receiver<Arc<pb::DataplaneUpdate>>,
    ) {
        let s = self.lock();
        let rx = self.tx.subscribe();
        if !s.ready {
            // The first computation is published as a snapshot.
            return (vec![], rx);
        }
        let resumable = from != 0
            && from <= s.revision
            && (from == s.revision || s.history.front().is_some_and(|u| u.revision <= from + 1));
        let first = if resumable {
            s.history
                .iter()
                .filter(|u| u.revision > from)
                .cloned()
                .collect()
        } else {
            vec![Arc::new(Self::snapshot_of(&s))]
        };
        (first, rx)
    }

    /// A fresh snapshot (for a client that fell behind the live updates).
    pub fn snapshot(&self) -> Arc<pb::DataplaneUpdate> {
        Arc::new(Self::snapshot_of(&self.lock()))
    }

    /// Publishes `new` as the desired state: the difference as one update.
    pub fn publish(&self, new: Desired) {
        let mut s = self.lock();
        let first = !s.ready;
        let (upsert, remove) = desired::diff(&s.current, &new);
        if !first && upsert.is_empty() && remove.is_empty() {
            return;
        }
        s.revision += 1;
        s.current = new;
        s.ready = true;
        let update = Arc::new(if first {
            Self::snapshot_of(&s)
        } else {
            pb::DataplaneUpdate {
                revision: s.revision,
                snapshot: false,
                upsert,
                remove,
            }
        });
        s.history.push_back(update.clone());
        while s.history.len() > HISTORY {
            s.history.pop_front();
        }
        // Nobody listening is fine.
        let _ = self.tx.send(update);
    }
}

/// The cluster state the computation needs, from one listing.
struct Cluster {
    nodes: Vec<Node>,
    pools: Vec<IpPool>,
    blocks: Vec<Block>,
    affinities: Vec<BlockAffinity>,
}

fn parse(listing: &Listing) -> Result<Cluster, IpamError> {
    let mut c = Cluster {
        nodes: vec![],
        pools: vec![],
        blocks: vec![],
        affinities: vec![],
    };
    for kv in &listing.items {
        let k = kv.key.as_str();
        if k.starts_with(Node::PREFIX) {
            c.nodes.push(decode(&kv.value)?);
        } else if k.starts_with(IpPool::PREFIX) {
            c.pools.push(decode(&kv.value)?);
        } else if k.starts_with(Block::PREFIX) {
            c.blocks.push(decode(&kv.value)?);
        } else if k.starts_with(BlockAffinity::PREFIX) {
            c.affinities.push(decode(&kv.value)?);
        }
    }
    Ok(c)
}

/// Gives this node its VXLAN tunnel address and VTEP MAC when a VXLAN pool that allows
/// tunnel addresses selects it (as calico-node does). Returns whether it wrote anything.
async fn ensure_tunnel(ipam: &Ipam<Store>, me: &str, c: &Cluster) -> Result<bool, IpamError> {
    let Some(node) = c.nodes.iter().find(|n| n.name == me) else {
        return Ok(false);
    };
    if node.vxlan_tunnel_address.is_some() && node.vxlan_tunnel_mac.is_some() {
        return Ok(false);
    }
    let pools: Vec<String> = c
        .pools
        .iter()
        .filter(|p| {
            p.vxlan_mode.is_on()
                && !p.disabled
                && p.allows(AllowedUse::Tunnel)
                && p.cidr.addr().is_ipv4()
        })
        .filter(|p| Selector::parse(&p.node_selector).is_ok_and(|s| s.matches(&node.labels)))
        .map(|p| p.name.clone())
        .collect();
    if pools.is_empty() {
        return Ok(false);
    }
    let handle = format!("{TUNNEL_HANDLE_PREFIX}{me}");
    // An address from an earlier attempt that did not reach the node is reused.
    let address = match ipam.handle_allocations(&handle).await {
        Ok(held) if !held.is_empty() => held[0].address,
        _ => {
            let req = AssignRequest {
                handle,
                node: me.into(),
                num_v4: 1,
                v4_pools: pools,
                use_tunnel: true,
                attrs: [
                    ("type".to_owned(), "vxlanTunnelAddress".to_owned()),
                    ("node".to_owned(), me.to_owned()),
                ]
                .into(),
                ..Default::default()
            };
            ipam.auto_assign(&req).await?.0[0].address
        }
    };
    let (mut node, rev) = ipam.get_node(me).await?;
    node.vxlan_tunnel_address = Some(address);
    node.vxlan_tunnel_mac = Some(crate::routewriter::mac::format_mac(
        &crate::routewriter::mac::vtep_mac(me),
    ));
    ipam.register_node(&node, Some(rev)).await?;
    tracing::info!(node = me, tunnel = %address, "VXLAN tunnel address assigned");
    Ok(true)
}

/// Keeps the hub's desired state current for node `me`, for as long as bgpd runs.
pub async fn run(me: String, mut datastore: DatastoreHandle, hub: Hub) {
    let mut backoff = Duration::from_millis(250);
    loop {
        let Some(store) = datastore.store() else {
            datastore.changed().await;
            if !datastore.is_alive() {
                return;
            }
            continue;
        };
        match follow(&me, &store, &hub).await {
            Ok(()) => backoff = Duration::from_millis(250),
            Err(e) => {
                tracing::warn!(error = %e, "desired dataplane state: re-reading after an error");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Lists, computes, publishes, then waits for the next change; returns to re-list.
async fn follow(me: &str, store: &Store, hub: &Hub) -> Result<(), IpamError> {
    let ipam = Ipam::new(store.clone());
    loop {
        let listing = store.list("/margay/v1/").await?;
        let cluster = parse(&listing)?;
        if ensure_tunnel(&ipam, me, &cluster).await? {
            continue;
        }
        hub.publish(desired::compute(&Inputs {
            me,
            nodes: &cluster.nodes,
            pools: &cluster.pools,
            blocks: &cluster.blocks,
            affinities: &cluster.affinities,
        }));
        let mut watch = store.watch("/margay/v1/", listing.revision).await?;
        match watch.next().await {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => return Ok(()),
        }
        // Let a burst of changes (a pod start writes a block and a handle) settle.
        let until = tokio::time::Instant::now() + DEBOUNCE;
        while let Ok(Some(Ok(_))) = tokio::time::timeout_at(until, watch.next()).await {}
    }
}
