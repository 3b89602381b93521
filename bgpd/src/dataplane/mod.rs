//! The desired kernel state of this node, kept current from the datastore and served as the
//! `Dataplane.Watch` stream: a snapshot, then ordered changes, each with a revision.
//!
//! Two parts make it: the IPAM part, computed by `desired::compute` whenever the cluster state
//! changes (the cluster brain's task calls [`Hub::publish`]), and the BGP part, routes the
//! kernel policy lets through from the Loc-RIB (the speaker calls the hub as its
//! [`crate::bgp::KernelSink`]). The `Hub` merges them, keeps the current state and a bounded
//! history, so a client that reconnects with its last revision gets only what changed (or a
//! snapshot when that revision is too old or from an earlier bgpd).

pub mod desired;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use ipam::IpamError;
use ipam::allocator::{AssignRequest, Ipam, TUNNEL_HANDLE_PREFIX};
use ipam::model::AllowedUse;
use ipam::selector::Selector;
use ipam::store::Store;
use proto::v1 as pb;
use tokio::sync::broadcast;

use desired::{Desired, ItemKey};

/// Updates kept for clients that resume.
const HISTORY: usize = 1024;

struct HubState {
    /// What clients are told: the IPAM part over the BGP part (IPAM wins a destination both
    /// name, e.g. an own block's blackhole).
    current: Desired,
    /// Computed from IPAM blocks and nodes.
    ipam: Desired,
    /// Kernel-filtered BGP routes.
    bgp: Desired,
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
                ipam: Desired::new(),
                bgp: Desired::new(),
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

    /// Publishes `new` as the IPAM part of the desired state: the difference as one update.
    pub fn publish(&self, new: Desired) {
        let mut s = self.lock();
        let old = std::mem::replace(&mut s.ipam, new);
        let keys = desired::changed_keys(&old, &s.ipam);
        let first = !s.ready;
        s.ready = true;
        Self::commit(&mut s, &self.tx, keys, first);
    }

    /// Applies changes to the BGP part.
    fn apply_bgp(&self, changes: Vec<(ItemKey, Option<pb::DesiredItem>)>, replace: bool) {
        let mut s = self.lock();
        let keys = if replace {
            let new: Desired = changes
                .into_iter()
                .filter_map(|(k, v)| Some((k, v?)))
                .collect();
            let old = std::mem::replace(&mut s.bgp, new);
            desired::changed_keys(&old, &s.bgp)
        } else {
            let mut keys = Vec::with_capacity(changes.len());
            for (k, v) in changes {
                match v {
                    Some(v) => s.bgp.insert(k.clone(), v),
                    None => s.bgp.remove(&k),
                };
                keys.push(k);
            }
            keys
        };
        // Before the first IPAM computation nothing is published: the first update is the
        // snapshot, which will include this.
        if s.ready {
            Self::commit(&mut s, &self.tx, keys, false);
        } else {
            for k in keys {
                let v = s.ipam.get(&k).or(s.bgp.get(&k)).cloned();
                match v {
                    Some(v) => s.current.insert(k, v),
                    None => s.current.remove(&k),
                };
            }
        }
    }

    /// Brings `current` in line for `keys` and publishes what changed (the whole state when
    /// `first`).
    fn commit(
        s: &mut HubState,
        tx: &broadcast::Sender<Arc<pb::DataplaneUpdate>>,
        keys: Vec<ItemKey>,
        first: bool,
    ) {
        let mut upsert = Vec::new();
        let mut remove = Vec::new();
        for k in keys {
            let want = s.ipam.get(&k).or(s.bgp.get(&k)).cloned();
            match want {
                Some(v) => {
                    if s.current.get(&k) != Some(&v) {
                        upsert.push(v.clone());
                        s.current.insert(k, v);
                    }
                }
                None => {
                    if s.current.remove(&k).is_some() {
                        remove.push(k.to_proto());
                    }
                }
            }
        }
        if !first && upsert.is_empty() && remove.is_empty() {
            return;
        }
        s.revision += 1;
        let update = Arc::new(if first {
            Self::snapshot_of(s)
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
        let _ = tx.send(update);
    }
}

impl crate::bgp::KernelSink for Hub {
    fn bgp_routes(&self, changes: Vec<(ipnet::IpNet, Option<pb::DesiredItem>)>, replace: bool) {
        self.apply_bgp(
            changes
                .into_iter()
                .map(|(n, v)| (desired::ItemKey::Route(n), v))
                .collect(),
            replace,
        );
    }
}

/// Gives this node its VXLAN tunnel address and VTEP MAC when a VXLAN pool that allows
/// tunnel addresses selects it (as calico-node does). Returns whether it wrote anything.
pub async fn ensure_tunnel(
    ipam: &Ipam<Store>,
    me: &str,
    c: &crate::cluster::ClusterState,
) -> Result<bool, IpamError> {
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
