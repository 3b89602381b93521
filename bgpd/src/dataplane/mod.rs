//! The desired kernel state of this node, kept current from the datastore and served as the
//! `Dataplane.Watch` stream: a snapshot, then ordered changes, each with a revision.
//!
//! Two parts make it: the IPAM part, computed by `desired::compute` whenever the cluster state
//! changes, with the node's network policy (`policy`) beside it (the cluster brain's task
//! calls [`Hub::publish`]), and the BGP part, routes the
//! kernel policy lets through from the Loc-RIB (the speaker calls the hub as its
//! [`KernelSink`]). Both hand it typed items (`item`); the `Hub` merges them, keeps the current
//! state and a bounded history of the updates it sent (in the contract's form, converted once
//! per update), so a client that reconnects with its last revision gets only what changed (or
//! a snapshot when that revision is too old or from an earlier bgpd).

pub mod desired;
pub mod item;
pub mod policy;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use proto::v1 as pb;
use tokio::sync::broadcast;

use item::{Desired, DesiredItem, ItemKey, KernelRoute};

/// Receives the BGP part of the desired kernel state, the speaker's output (the `Hub`; a
/// trait so that the speaker names no more of the dataplane than this and its routes).
pub trait KernelSink: Send + Sync {
    /// Routes to add or replace (`Some`) or remove (`None`), by destination. With `replace`
    /// the list is the whole BGP part (what is not in it goes).
    fn bgp_routes(&self, changes: Vec<(IpNet, Option<KernelRoute>)>, replace: bool);
}

/// Updates kept for clients that resume, at most.
const HISTORY: usize = 1024;
/// Items (upserts and removals) those updates may hold together: the history is a second
/// copy of what changed, and a node converging in a big mesh changes every route once. A
/// client resuming from further back gets a snapshot, which it reconciles the same way.
const HISTORY_ITEMS: usize = 256;
/// Live updates a watching client's task may fall behind by before it is sent a snapshot
/// instead. The channel sets aside a slot for each from the start (32 bytes each: 32 KB
/// for the history's 1024, in every bgpd); the task only moves updates on to the client's
/// own queue, so it falls behind only when that queue is full, and then resuming from a
/// snapshot is the cheaper way anyway.
const LIVE_LAG: usize = 128;

/// Which part of the desired state a change is to.
#[derive(Clone, Copy)]
enum Part {
    Ipam,
    Bgp,
}

struct HubState {
    /// Computed from IPAM blocks and nodes.
    ipam: Desired,
    /// Kernel-filtered BGP routes.
    bgp: Desired,
    revision: u64,
    history: VecDeque<Arc<pb::DataplaneUpdate>>,
    /// The items `history` holds (see [`HISTORY_ITEMS`]).
    history_items: usize,
    /// Whether a first state has been computed.
    ready: bool,
}

impl HubState {
    /// What clients are told for `k`: the IPAM part over the BGP part (IPAM wins a
    /// destination both name, e.g. an own block's blackhole). Kept as the two parts only, not
    /// merged a third time: a big mesh's routes are most of a node's heap.
    fn effective(&self, k: &ItemKey) -> Option<&DesiredItem> {
        self.ipam.get(k).or(self.bgp.get(k))
    }

    /// The whole state clients are told, in key order.
    fn merged(&self) -> impl Iterator<Item = (&ItemKey, &DesiredItem)> {
        let mut ipam = self.ipam.iter().peekable();
        let mut bgp = self.bgp.iter().peekable();
        std::iter::from_fn(move || match (ipam.peek(), bgp.peek()) {
            (Some((a, _)), Some((b, _))) if b < a => bgp.next(),
            (Some((a, _)), Some((b, _))) if a == b => {
                bgp.next();
                ipam.next()
            }
            (Some(_), _) => ipam.next(),
            (None, _) => bgp.next(),
        })
    }
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
        let (tx, _) = broadcast::channel(LIVE_LAG);
        Self {
            state: Arc::new(Mutex::new(HubState {
                ipam: Desired::new(),
                bgp: Desired::new(),
                revision: epoch,
                history: VecDeque::new(),
                history_items: 0,
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
            upsert: state.merged().map(|(_, v)| v.to_proto()).collect(),
            remove: vec![],
        }
    }

    /// The current desired state, typed.
    pub fn items(&self) -> (Desired, u64) {
        let s = self.lock();
        let merged = s.merged().map(|(k, v)| (k.clone(), v.clone())).collect();
        (merged, s.revision)
    }

    /// The current desired state as the contract has it, for the API (`show route kernel`).
    pub fn current(&self) -> (BTreeMap<ItemKey, pb::DesiredItem>, u64) {
        let s = self.lock();
        let merged = s.merged().map(|(k, v)| (k.clone(), v.to_proto())).collect();
        (merged, s.revision)
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
        Self::commit(&mut s, &self.tx, keys, first, Part::Ipam, |k| old.get(k));
    }

    /// Applies changes to the BGP part.
    fn apply_bgp(&self, changes: Vec<(ItemKey, Option<DesiredItem>)>, replace: bool) {
        let mut s = self.lock();
        // The BGP part as it was, for the keys that change.
        let mut before: BTreeMap<ItemKey, Option<DesiredItem>> = BTreeMap::new();
        if replace {
            let new: Desired = changes
                .into_iter()
                .filter_map(|(k, v)| Some((k, v?)))
                .collect();
            let old = std::mem::replace(&mut s.bgp, new);
            // An added key was nothing before; a changed or removed one its old item.
            for k in s.bgp.keys().filter(|k| !old.contains_key(*k)) {
                before.insert(k.clone(), None);
            }
            for (k, v) in old {
                if s.bgp.get(&k) != Some(&v) {
                    before.insert(k, Some(v));
                }
            }
        } else {
            for (k, v) in changes {
                let was = match v {
                    Some(v) => s.bgp.insert(k.clone(), v),
                    None => s.bgp.remove(&k),
                };
                // A key changed twice in one batch was, before it, what its first change found.
                before.entry(k).or_insert(was);
            }
        }
        // Before the first IPAM computation nothing is published: the first update is the
        // snapshot, which will include this.
        if s.ready {
            let keys = before.keys().cloned().collect();
            Self::commit(&mut s, &self.tx, keys, false, Part::Bgp, |k| {
                before.get(k).and_then(Option::as_ref)
            });
        }
    }

    /// Publishes what changed for `keys` after `part` changed (`was` gives that part's items
    /// as they were); the whole state when `first`.
    fn commit<'a>(
        s: &mut HubState,
        tx: &broadcast::Sender<Arc<pb::DataplaneUpdate>>,
        keys: Vec<ItemKey>,
        first: bool,
        part: Part,
        was: impl Fn(&ItemKey) -> Option<&'a DesiredItem>,
    ) {
        let mut upsert = Vec::new();
        let mut remove = Vec::new();
        for k in keys {
            let before = match part {
                Part::Ipam => was(&k).or(s.bgp.get(&k)),
                Part::Bgp => s.ipam.get(&k).or(was(&k)),
            };
            match s.effective(&k) {
                Some(v) if before != Some(v) => upsert.push(v.to_proto()),
                Some(_) => {}
                None if before.is_some() => remove.push(k.to_proto()),
                None => {}
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
        s.history_items += update.upsert.len() + update.remove.len();
        s.history.push_back(update.clone());
        while s.history.len() > HISTORY || (s.history_items > HISTORY_ITEMS && s.history.len() > 1)
        {
            if let Some(old) = s.history.pop_front() {
                s.history_items -= old.upsert.len() + old.remove.len();
            }
        }
        // Nobody listening is fine.
        let _ = tx.send(update);
    }
}

impl KernelSink for Hub {
    fn bgp_routes(&self, changes: Vec<(IpNet, Option<KernelRoute>)>, replace: bool) {
        self.apply_bgp(
            changes
                .into_iter()
                .map(|(n, r)| (ItemKey::Route(n), r.map(DesiredItem::Route)))
                .collect(),
            replace,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dest: &str) -> ItemKey {
        ItemKey::Route(dest.parse().unwrap())
    }

    fn route(dest: &str, source: &str) -> DesiredItem {
        DesiredItem::Route(KernelRoute {
            destination: dest.parse().unwrap(),
            via: item::Via::Blackhole,
            source: source.into(),
        })
    }

    fn ipam(items: &[(&str, &str)]) -> Desired {
        items.iter().map(|(d, s)| (key(d), route(d, s))).collect()
    }

    fn bgp(hub: &Hub, changes: &[(&str, Option<&str>)], replace: bool) {
        hub.apply_bgp(
            changes
                .iter()
                .map(|(d, s)| (key(d), s.map(|s| route(d, s))))
                .collect(),
            replace,
        );
    }

    /// The sources of an update's upserts and the removed keys, for short assertions.
    fn told(u: &pb::DataplaneUpdate) -> (Vec<String>, usize) {
        let sources = u
            .upsert
            .iter()
            .map(|i| match &i.item {
                Some(pb::desired_item::Item::Route(r)) => r.source.clone(),
                other => panic!("not a route: {other:?}"),
            })
            .collect();
        (sources, u.remove.len())
    }

    /// Every update after revision `from`, as a client resuming there is sent them.
    fn since(hub: &Hub, from: u64) -> Vec<Arc<pb::DataplaneUpdate>> {
        hub.subscribe(from).0
    }

    #[test]
    fn bgp_routes_before_the_first_computation_come_in_its_snapshot() {
        let hub = Hub::new();
        bgp(&hub, &[("10.0.1.0/26", Some("bgp a"))], false);
        assert!(
            since(&hub, 0).is_empty(),
            "nothing published before IPAM's first state"
        );
        hub.publish(ipam(&[("10.0.0.0/26", "blackhole")]));
        let first = since(&hub, 0);
        assert_eq!(first.len(), 1);
        assert!(first[0].snapshot);
        assert_eq!(
            told(&first[0]),
            (vec!["blackhole".into(), "bgp a".into()], 0)
        );
    }

    #[test]
    fn ipam_wins_a_destination_both_parts_name_and_the_other_shows_when_it_leaves() {
        let hub = Hub::new();
        hub.publish(ipam(&[("10.0.0.0/26", "blackhole")]));
        let (_, r0) = hub.items();
        bgp(&hub, &[("10.0.0.0/26", Some("bgp a"))], false);
        assert_eq!(hub.items().1, r0, "hidden by IPAM's item: no update");
        hub.publish(ipam(&[]));
        let (state, r1) = hub.items();
        assert_eq!(r1, r0 + 1);
        assert_eq!(
            state.get(&key("10.0.0.0/26")),
            Some(&route("10.0.0.0/26", "bgp a"))
        );
        let after = since(&hub, r0);
        assert_eq!(after.len(), 1);
        assert_eq!(
            told(&after[0]),
            (vec!["bgp a".into()], 0),
            "an upsert, not a removal"
        );
        bgp(&hub, &[("10.0.0.0/26", None)], false);
        let after = since(&hub, r1);
        assert_eq!(told(&after[0]), (vec![], 1));
        assert!(hub.current().0.is_empty());
    }

    #[test]
    fn updates_carry_what_changed_and_nothing_unchanged_is_published() {
        let hub = Hub::new();
        hub.publish(ipam(&[("10.0.0.0/26", "a"), ("10.0.0.64/26", "b")]));
        let (_, r0) = hub.current();
        hub.publish(ipam(&[("10.0.0.0/26", "a"), ("10.0.0.64/26", "b")]));
        bgp(&hub, &[("10.0.0.64/26", Some("hidden"))], false);
        assert_eq!(hub.current().1, r0);
        hub.publish(ipam(&[("10.0.0.0/26", "a2"), ("10.0.0.128/26", "c")]));
        let after = since(&hub, r0);
        assert_eq!(after.len(), 1);
        assert_eq!(
            told(&after[0]),
            (vec!["a2".into(), "c".into(), "hidden".into()], 0)
        );
        // Replacing the BGP part: what it no longer has goes, what IPAM covers is not told.
        let (_, r1) = hub.current();
        bgp(
            &hub,
            &[
                ("10.0.1.0/26", Some("new")),
                ("10.0.0.0/26", Some("under a2")),
            ],
            true,
        );
        let after = since(&hub, r1);
        assert_eq!(told(&after[0]), (vec!["new".into()], 1));
    }

    #[test]
    fn a_key_changed_twice_in_one_batch_is_judged_by_what_it_was_before_the_batch() {
        let hub = Hub::new();
        hub.publish(ipam(&[]));
        bgp(&hub, &[("10.0.1.0/26", Some("x"))], false);
        let (_, r0) = hub.current();
        // Removed, then added back the same: no change at all.
        bgp(
            &hub,
            &[("10.0.1.0/26", None), ("10.0.1.0/26", Some("x"))],
            false,
        );
        assert_eq!(hub.current().1, r0);
        // Added, then removed, where there was nothing: no change either.
        bgp(
            &hub,
            &[("10.0.2.0/26", Some("y")), ("10.0.2.0/26", None)],
            false,
        );
        assert_eq!(hub.current().1, r0);
    }

    #[test]
    fn a_client_resumes_from_the_history_until_it_holds_too_many_items() {
        let hub = Hub::new();
        hub.publish(ipam(&[]));
        let (_, r0) = hub.current();
        for i in 0..10 {
            bgp(&hub, &[(&format!("10.1.{i}.0/24"), Some("r"))], false);
        }
        let after = since(&hub, r0);
        assert_eq!(after.len(), 10);
        assert!(after.iter().all(|u| !u.snapshot && u.upsert.len() == 1));
        assert_eq!(after[0].revision, r0 + 1);
        // A change of more items than the history holds pushes the older updates out.
        let many: Vec<(String, Option<&str>)> = (0..HISTORY_ITEMS)
            .map(|i| (format!("10.2.{}.{}/32", i / 256, i % 256), Some("m")))
            .collect();
        let many: Vec<(&str, Option<&str>)> = many.iter().map(|(d, s)| (d.as_str(), *s)).collect();
        bgp(&hub, &many, false);
        let (state, r1) = hub.current();
        let back = since(&hub, r0);
        assert_eq!(back.len(), 1);
        assert!(back[0].snapshot, "too far back: a snapshot");
        assert_eq!(back[0].upsert.len(), state.len());
        assert_eq!(state.len(), 10 + HISTORY_ITEMS);
        let recent = since(&hub, r1 - 1);
        assert_eq!(recent.len(), 1);
        assert!(!recent[0].snapshot);
        assert_eq!(recent[0].upsert.len(), HISTORY_ITEMS);
    }
}
