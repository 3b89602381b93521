//! The cluster brain: bgpd's whole BGP world and desired kernel state derived from the
//! datastore, live — what confd does for BIRD by rewriting files, done in-process and
//! without dropping the sessions a change does not concern.
//!
//! One task ([`run`]) follows the datastore: it lists the cluster state, then
//! - makes sure this node has its VXLAN tunnel address (`tunnel`),
//! - publishes the IPAM part of the desired kernel state (`dataplane::desired`),
//! - brings the speaker in line ([`Brain::apply`]): local AS and port, the policy generated
//!   from the pools (`bgp::policy`), the peers (`peers`), what this node originates
//!   (`origin`),
//!
//! then waits for the next change. The computations are pure functions of [`ClusterState`];
//! this module only moves their results to the speaker and the hub.
//!
//! Why this file is long: the cache, what it says a change was (which decides whether a pass
//! runs at all), the brain and the follow loop are one mechanism, tested together below.

pub mod filters;
pub mod origin;
pub mod peers;
pub mod policy;
pub mod tunnel;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use ::datastore::Store;
use ::datastore::contract::{Kind, ObjectEvent, ObjectList};
use ::datastore::documents::DocKind;
use ::datastore::documents::{DocRef, Document};
use ::datastore::model::{BgpConfiguration, BgpFilter, BgpPeer, IpFamily, IpPool, Node};
use ::datastore::resource::{Resource, decode};
use ::datastore::syncer;
use bgp_wire::{Asn, Prefix};
use ipam::IpamError;
use ipam::allocator::Ipam;
use ipam::block::{Block, BlockAffinity};
use ipnet::IpNet;

use crate::config::BgpConfig;
use crate::dataplane::{self, Hub, desired};
use crate::datastore::DatastoreHandle;
use crate::speaker::{Announcement, PeerSpec, SpeakerError, SpeakerHandle};
use bgp::policy::{Encap, Policy, PolicyInputs, PolicyPool};

/// A burst of changes of the cluster is computed once, [`DEBOUNCE`] after its first change
/// (a node's start writes its node, then its blocks, then its tunnel address). A change of
/// this node's own is computed as soon as the changes already read are applied: it is what
/// this node originates (a new block, one commit) and everyone waits for its route, while
/// nodes that learn the block over BGP compute nothing for it (see [`Change`]).
const DEBOUNCE: Duration = Duration::from_millis(20);

/// The cluster state the computations need, from one listing.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub nodes: Vec<Node>,
    pub pools: Vec<IpPool>,
    pub blocks: Vec<Block>,
    pub affinities: Vec<BlockAffinity>,
    pub bgp_config: Option<BgpConfiguration>,
    pub bgp_peers: Vec<BgpPeer>,
    pub bgp_filters: Vec<BgpFilter>,
    /// Network policies, workload endpoints and namespaces.
    pub policy: policy::PolicyDocs,
}

/// One decoded resource of the cluster state. Boxed: the cache's B-tree holds its values in
/// leaves of eleven, so an unboxed item took the size of the largest variant in every slot,
/// used or not, for each of a big cluster's thousands of blocks and affinities (the items'
/// leaves were 434 KB of a 150-node mesh node's 2.9 MB heap).
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Node(Box<Node>),
    Pool(Box<IpPool>),
    Block(Box<Block>),
    Affinity(Box<BlockAffinity>),
    Config(Box<BgpConfiguration>),
    Peer(Box<BgpPeer>),
    Filter(Box<BgpFilter>),
    PolicyDoc(Box<::policy::resource::Resource>),
}

/// What a change to the cache was (see [`StateCache::apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing the brain computes from.
    None,
    /// Another node's, or the cluster's.
    Cluster,
    /// This node's own: its node, its blocks and affinities, an address it borrowed.
    Own,
    /// Which pools carry VXLAN changed, so which of other nodes' blocks the cache must keep:
    /// the cache is to be built again from a new listing.
    Relist,
}

impl Item {
    /// Whether this is node `me`'s own (what it originates and its own kernel state come
    /// from).
    fn concerns(&self, me: &str) -> bool {
        match self {
            Item::Node(n) => n.name == me,
            Item::Block(b) => {
                b.affinity.as_deref() == Some(me) || b.slots.values().any(|s| s.node == me)
            }
            Item::Affinity(a) => a.node == me,
            _ => false,
        }
    }
}

/// The cluster state by key, decoded once per change: a watch event decodes one value, where
/// relisting would decode every value of the cluster on every change (O(N²) per node while
/// N nodes start). Blocks are kept as far as node `me` needs them (see [`slim`]); other
/// nodes' blocks and affinities outside VXLAN pools not at all (see [`StateCache::keeps`]).
#[derive(Debug)]
pub struct StateCache {
    me: String,
    items: BTreeMap<String, Item>,
    /// Policy documents margay cannot enforce, seen since the last [`StateCache::take_problems`].
    problems: Vec<(DocRef, String)>,
}

/// What the computations read of a block on node `me` (`dataplane::desired`, `origin`): its
/// CIDR, pool and affinity, and the addresses that are `me`'s or that another node borrowed
/// from the block's owner. The owner's own addresses (most of a block) and the free list are
/// dropped: decoded, they cost about 1 KB per block on every node (a B-tree leaf of slots,
/// the free ordinals) — 0.24 of the 1.66 MB heap of a 50-node mesh node. So are the block's
/// sequence number and emptied-at time, so that an allocation that changes nothing kept is
/// not a change (see [`StateCache::apply`]).
fn slim(mut b: Block, me: &str) -> Block {
    let slots = std::mem::take(&mut b.slots);
    let owner = b.affinity.as_deref();
    // Collected into a new map: a compact tree of the few kept slots.
    b.slots = slots
        .into_iter()
        .filter(|(_, s)| s.node == me || Some(s.node.as_str()) != owner)
        .collect();
    b.free = Default::default();
    b.seq = 0;
    b.emptied_at = None;
    b
}

/// Whether the JSON `v` holds the string `s` as a whole string (`"s"`): a block that names a
/// node does so that way. Names are checked when stored (DNS labels): no escapes to miss.
fn contains_quoted(v: &[u8], s: &str) -> bool {
    let quoted = format!("\"{s}\"");
    v.windows(quoted.len()).any(|w| w == quoted.as_bytes())
}

impl StateCache {
    pub fn new(me: &str) -> Self {
        StateCache {
            me: me.to_owned(),
            items: BTreeMap::new(),
            problems: Vec::new(),
        }
    }

    /// The policy documents found unenforceable since the last call, each with what is wrong.
    pub fn take_problems(&mut self) -> Vec<(DocRef, String)> {
        std::mem::take(&mut self.problems)
    }

    /// The cache of the objects listed, kind by kind: pools first, for they decide which
    /// blocks are kept (see [`followed_kinds`]).
    pub fn from_lists(me: &str, lists: &[(Kind, ObjectList)]) -> Result<Self, IpamError> {
        let mut c = StateCache::new(me);
        let (pools, rest): (Vec<_>, Vec<_>) = lists.iter().partition(|(k, _)| *k == IpPool::kind());
        for (kind, list) in pools.into_iter().chain(rest) {
            for o in &list.items {
                c.apply(&kind.key(&o.name), Some(&o.value))?;
            }
        }
        Ok(c)
    }

    /// The CIDRs of the pools with VXLAN on: other nodes' blocks there are routed from IPAM.
    fn vxlan_pools(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.items
            .range::<str, _>((
                std::ops::Bound::Included(IpPool::PREFIX),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(IpPool::PREFIX))
            .filter_map(|(_, p)| match p {
                Item::Pool(p) if p.vxlan_mode.is_on() => Some(p.cidr),
                _ => None,
            })
    }

    /// Whether this node keeps other nodes' blocks and affinities at `cidr`: only inside a
    /// VXLAN pool, whose routes come from IPAM (`dataplane::desired`). Elsewhere their routes
    /// come over BGP, and nothing else this node derives reads them (`origin` and the policy
    /// read its own blocks): at a thousand nodes, four thousand blocks and as many affinities
    /// no node but their owner needs, decoded and held on every node. A pool turning to VXLAN
    /// (or from it) is a [`Change::Relist`].
    fn keeps(&self, cidr: &IpNet) -> bool {
        self.vxlan_pools().any(|p| p.contains(&cidr.network()))
    }

    /// Drops what the cache holds at `key`: what that change was.
    fn forget(&mut self, key: &str) -> Change {
        match self.items.remove(key) {
            Some(old) => self.change(Some(&old), None),
            None => Change::None,
        }
    }

    /// A key changed (`None`: deleted). Returns whether what the brain computes from
    /// changed, and whose it was: a handle, or an address of another node in its own block
    /// (dropped by [`slim`]), leaves the state as it was, and the brain need not compute
    /// again.
    pub fn apply(&mut self, key: &str, value: Option<&[u8]>) -> Result<Change, IpamError> {
        if key.starts_with(IpPool::PREFIX) {
            // Which blocks are kept depends on the pools with VXLAN.
            let before: Vec<IpNet> = self.vxlan_pools().collect();
            let change = self.apply_item(key, value)?;
            return Ok(if self.vxlan_pools().ne(before) {
                Change::Relist
            } else {
                change
            });
        }
        self.apply_item(key, value)
    }

    fn apply_item(&mut self, key: &str, value: Option<&[u8]>) -> Result<Change, IpamError> {
        let Some(v) = value else {
            return Ok(self.forget(key));
        };
        let item = if key.starts_with(Node::PREFIX) {
            Item::Node(Box::new(decode(v)?))
        } else if key.starts_with(IpPool::PREFIX) {
            Item::Pool(Box::new(decode(v)?))
        } else if key.starts_with(Block::PREFIX) {
            // Another node's block outside VXLAN pools is not kept, nor decoded: one that
            // concerns this node names it (its affinity, or an address of its own).
            let named = contains_quoted(v, &self.me);
            match ipam::block::cidr_of_key(key) {
                Some(cidr) if !named && !self.keeps(&cidr) => return Ok(self.forget(key)),
                _ => Item::Block(Box::new(slim(decode(v)?, &self.me))),
            }
        } else if let Some(of) = key.strip_prefix(BlockAffinity::PREFIX) {
            // `<node>/<cidr>`: whose it is, from the key.
            let theirs = !of
                .strip_prefix(self.me.as_str())
                .is_some_and(|rest| rest.starts_with('/'));
            match ipam::block::cidr_of_key(key) {
                Some(cidr) if theirs && !self.keeps(&cidr) => return Ok(self.forget(key)),
                _ => Item::Affinity(Box::new(decode(v)?)),
            }
        } else if key == BgpConfiguration::key(BgpConfiguration::NAME) {
            Item::Config(Box::new(decode(v)?))
        } else if key.starts_with(BgpPeer::PREFIX) {
            Item::Peer(Box::new(decode(v)?))
        } else if key.starts_with(BgpFilter::PREFIX) {
            Item::Filter(Box::new(decode(v)?))
        } else if let Some(at) = DocRef::of_key(key) {
            // bgpd's API checks a document before storing it, but on the Kubernetes datastore
            // kubectl writes them too, and another margay version may have: one that does
            // not parse is not fatal to the whole state. A new one is left out; a change that
            // does not parse keeps the version in force (dropping it would open what it
            // closed).
            let parsed = decode::<Document>(v)
                .map_err(|e| e.to_string())
                .and_then(|d| policy::decode(&at, &d.json).map_err(|e| e.to_string()));
            match parsed {
                Ok(r) => Item::PolicyDoc(Box::new(r)),
                Err(e) if self.items.contains_key(key) => {
                    let problem = format!(
                        "a change margay cannot enforce; its last version stays in force: {e}"
                    );
                    tracing::warn!(document = %at, "{problem}");
                    self.problems.push((at, problem));
                    return Ok(Change::None);
                }
                Err(e) => {
                    let problem = format!("left out of the network policy: {e}");
                    tracing::warn!(document = %at, "{problem}");
                    self.problems.push((at, problem));
                    return Ok(Change::None);
                }
            }
        } else {
            // Handles and the like: not part of what the brain computes from.
            return Ok(Change::None);
        };
        let change = match self.items.get(key) {
            Some(old) if *old == item => return Ok(Change::None),
            old => self.change(old, Some(&item)),
        };
        self.items.insert(key.to_owned(), item);
        Ok(change)
    }

    /// What replacing `old` with `new` (either absent) was.
    fn change(&self, old: Option<&Item>, new: Option<&Item>) -> Change {
        let items = || old.into_iter().chain(new);
        if items().any(|i| i.concerns(&self.me)) {
            Change::Own
        } else if items().any(|i| self.computed_from(i)) {
            Change::Cluster
        } else {
            Change::None
        }
    }

    /// Whether this node computes anything from another node's `item` (its blocks and
    /// affinities: only where it keeps them, see [`Self::keeps`]).
    fn computed_from(&self, item: &Item) -> bool {
        match item {
            Item::Block(b) => self.keeps(&b.cidr),
            Item::Affinity(a) => self.keeps(&a.cidr),
            _ => true,
        }
    }

    pub fn state(&self) -> ClusterState {
        let mut c = ClusterState::default();
        for item in self.items.values() {
            match item {
                Item::Node(n) => c.nodes.push(Node::clone(n)),
                Item::Pool(p) => c.pools.push(IpPool::clone(p)),
                Item::Block(b) => c.blocks.push(Block::clone(b)),
                Item::Affinity(a) => c.affinities.push(BlockAffinity::clone(a)),
                Item::Config(g) => c.bgp_config = Some(BgpConfiguration::clone(g)),
                Item::Peer(p) => c.bgp_peers.push(BgpPeer::clone(p)),
                Item::Filter(f) => c.bgp_filters.push(BgpFilter::clone(f)),
                Item::PolicyDoc(r) => c.policy.push(::policy::resource::Resource::clone(r)),
            }
        }
        c
    }
}

impl ClusterState {
    /// The confirmed affinities, indexed (build once, ask for every block).
    pub fn confirmed(&self) -> desired::ConfirmedAffinities<'_> {
        desired::ConfirmedAffinities::new(&self.affinities)
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The cluster's BGP settings: the datastore's, else this node's configuration file.
    pub fn bgp_settings(&self, file: &BgpConfig) -> BgpConfiguration {
        self.bgp_config.clone().unwrap_or_else(|| BgpConfiguration {
            as_number: file.as_number,
            listen_port: file.listen_port,
            external_transit: file.external_transit,
            ..Default::default()
        })
    }
}

/// What was last given to the speaker.
#[derive(Default)]
struct Applied {
    speaker: Option<(Asn, u16)>,
    policy: Option<(Arc<Policy>, Option<Ipv4Addr>)>,
    announced: BTreeSet<Prefix>,
    /// The next hop of each family's announcements: the node's address of that family.
    next_hops: (Option<IpAddr>, Option<IpAddr>),
}

/// Keeps the speaker in line with the cluster state for node `me`.
pub struct Brain {
    me: String,
    file: BgpConfig,
    speaker: SpeakerHandle,
    applied: Applied,
}

impl Brain {
    pub fn new(me: String, file: BgpConfig, speaker: SpeakerHandle) -> Self {
        Brain {
            me,
            file,
            speaker,
            applied: Applied::default(),
        }
    }

    /// Bring the speaker in line with `c`: settings, policy, peers, announcements.
    pub async fn apply(&mut self, c: &ClusterState) -> Result<(), SpeakerError> {
        let Some(me) = c.node(&self.me) else {
            // Not registered yet: nothing derives from a node we do not know.
            return Ok(());
        };
        let settings = c.bgp_settings(&self.file);
        let wanted = (Asn(peers::node_as(&settings, me)), settings.listen_port);
        if self.applied.speaker != Some(wanted) {
            self.speaker.reconfigure(wanted.0, wanted.1).await?;
            self.applied.speaker = Some(wanted);
        }

        let own = origin::own_blocks(&self.me, c);
        let subnets: Vec<IpNet> = IpFamily::ALL
            .into_iter()
            .filter_map(|f| me.address(f).map(|n| n.trunc()))
            .collect();
        let pools: Vec<PolicyPool> = c.pools.iter().map(policy_pool).collect();
        let services = filters::service_cidrs(&settings);
        let advertisements = filters::advertisements(&settings);
        let peer_filters = filters::peer_filters(&self.me, &c.bgp_peers, &c.bgp_filters);
        let policy = Arc::new(Policy::generate(&PolicyInputs {
            pools: &pools,
            own_blocks: &own,
            subnets: &subnets,
            aggregate_to_external: settings.aggregate_pools_to_external,
            external_transit: settings.external_transit,
            program_external_routes: settings.program_external_routes,
            services: &services,
            advertisements: &advertisements,
            peer_filters: &peer_filters,
        }));
        let role = me.route_reflector_cluster_id.or(self.file.cluster_id);
        if self
            .applied
            .policy
            .as_ref()
            .is_none_or(|(p, r)| **p != *policy || *r != role)
        {
            self.speaker.set_policy(policy.clone(), role).await?;
            self.applied.policy = Some((policy, role));
        }

        // Each family's routes carry the node's address of that family as next hop; a
        // family the node has no address in is not announced (as Calico's bird6 has no
        // session without one).
        let next_hop_of = |f: IpFamily| me.address(f).map(|a| a.addr());
        let next_hops = (next_hop_of(IpFamily::V4), next_hop_of(IpFamily::V6));
        let family_of = |p: &Prefix| IpFamily::of(p.addr());
        // The node's blocks (or pool aggregates) and the service ranges every node announces.
        let want: BTreeSet<Prefix> =
            origin::originated(&self.me, c, settings.aggregate_pools_to_external)
                .into_iter()
                .chain(filters::announced_service_ranges(&settings))
                .filter(|p| next_hop_of(family_of(p)).is_some())
                .collect();
        if next_hops != self.applied.next_hops {
            // Every announcement carries the node's address: all again.
            self.applied.announced.clear();
            self.applied.next_hops = next_hops;
        }
        for p in want.difference(&self.applied.announced.clone()) {
            self.speaker
                .announce(Announcement {
                    prefix: *p,
                    next_hop: next_hop_of(family_of(p)),
                    communities: vec![],
                })
                .await?;
            self.applied.announced.insert(*p);
        }
        for p in self.applied.announced.clone().difference(&want) {
            match self.speaker.withdraw(*p).await {
                Ok(()) | Err(SpeakerError::NotAnnounced(_)) => {}
                Err(e) => return Err(e),
            }
            self.applied.announced.remove(p);
        }

        // Peers last: a session that comes up finds this node's routes already there, and
        // gets them in its first UPDATEs rather than in more after them.
        let mut want = peers::desired_peers(&self.me, &settings, &c.nodes, &c.bgp_peers);
        for spec in want.values_mut() {
            spec.error_wait = self.file.error_wait_time;
        }
        self.apply_peers(want).await
    }

    /// Add, replace or remove the cluster-derived peers; peers from the configuration file
    /// or the API are never touched (and win an address both name).
    async fn apply_peers(&self, want: BTreeMap<IpAddr, PeerSpec>) -> Result<(), SpeakerError> {
        let have = self.speaker.peers().await?;
        let mut keep = BTreeSet::new();
        for p in &have {
            let a = p.spec.address;
            if !p.spec.origin.is_cluster() {
                keep.insert(a);
                if want.contains_key(&a) {
                    tracing::debug!(peer = %a, "a configured peer has this address; the derived one waits");
                }
            } else if want.get(&a) == Some(&p.spec) {
                keep.insert(a);
            } else {
                tracing::info!(peer = %p.spec.name(), "cluster peer removed or changed");
                match self.speaker.delete_peer(a).await {
                    Ok(()) | Err(SpeakerError::NoPeer(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let mut added = Vec::new();
        for (a, spec) in want {
            if keep.contains(&a) {
                continue;
            }
            tracing::info!(peer = %spec.name(), asn = %spec.asn, "cluster peer added");
            added.push(spec);
        }
        // All at once: a peer that connects meanwhile is never one not added yet.
        for result in self.speaker.add_peers(added).await? {
            match result {
                Ok(()) | Err(SpeakerError::PeerExists(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error(transparent)]
    Ipam(#[from] IpamError),
    #[error(transparent)]
    Store(#[from] ::datastore::contract::StoreError),
    #[error("BGP: {0}")]
    Bgp(#[from] SpeakerError),
}

/// The kinds the brain follows, pools first (they decide which blocks the cache keeps).
/// Handles are not among them: nothing the brain computes reads them.
fn followed_kinds() -> Vec<Kind> {
    let mut kinds = vec![
        IpPool::kind(),
        Node::kind(),
        BgpConfiguration::kind(),
        BgpPeer::kind(),
        BgpFilter::kind(),
        Block::kind(),
        BlockAffinity::kind(),
    ];
    kinds.extend(DocKind::ALL.iter().map(|d| d.kind()));
    kinds
}

/// Follows the cluster state for node `me` for as long as bgpd runs.
pub async fn run(
    me: String,
    file: BgpConfig,
    mut datastore: DatastoreHandle,
    hub: Hub,
    speaker: SpeakerHandle,
) {
    let mut brain = Brain::new(me, file, speaker);
    let mut backoff = Duration::from_millis(250);
    loop {
        let Some(ipam) = datastore.ipam() else {
            datastore.changed().await;
            if !datastore.is_alive() {
                return;
            }
            continue;
        };
        match follow(&mut brain, &ipam, &hub).await {
            Ok(()) => backoff = Duration::from_millis(250),
            Err(FollowError::Bgp(SpeakerError::Stopped)) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cluster state: re-reading after an error");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Lists once, then follows the watch: each change updates the cache, and each burst of
/// changes is computed and applied once. Returns (to list again) when the watch ends, or when
/// the pools with VXLAN changed (which other nodes' blocks the cache keeps, [`Change::Relist`]).
async fn follow(brain: &mut Brain, ipam: &Ipam<Store>, hub: &Hub) -> Result<(), FollowError> {
    let store = ipam.store();
    // The listing's bytes (every value, handles included) are dropped once decoded, and so
    // is each pass's copy of the state before the wait: neither is kept while idle.
    let (mut cache, mut watch) = {
        let (lists, watch) = syncer::list_and_watch(store, &followed_kinds()).await?;
        (StateCache::from_lists(&brain.me, &lists)?, watch)
    };
    // The node's policy is compiled again only when a policy document changed (pods' blocks
    // and handles change far more often than policies and endpoints).
    let mut node_policy = ::policy::compile::NodePolicy::default();
    let mut policy_changed = true;
    // Whether the state changed since the last pass (the first pass always runs).
    let mut dirty = true;
    loop {
        record_problems(store, &brain.me, cache.take_problems());
        if dirty {
            dirty = false;
            let c = cache.state();
            // When this writes (the node's tunnel address), its own event brings the next
            // pass, which runs whatever that event changed.
            if tunnel::ensure_tunnel(ipam, &brain.me, &c).await? {
                dirty = true;
            } else {
                let peer_gateways = filters::peer_gateways(&brain.me, &c.bgp_peers);
                let mut want = desired::compute(&desired::Inputs {
                    me: &brain.me,
                    nodes: &c.nodes,
                    pools: &c.pools,
                    blocks: &c.blocks,
                    affinities: &c.affinities,
                    peer_gateways: &peer_gateways,
                });
                if policy_changed {
                    node_policy = ::policy::compile::compile(&c.policy.cluster(), &brain.me);
                    policy_changed = false;
                }
                dataplane::policy::extend(&mut want, &node_policy);
                hub.publish(want);
                brain.apply(&c).await?;
            }
        }
        // Applies a change to the cache and says what it was.
        let mut apply = |(kind, e): (Kind, ObjectEvent)| -> Result<Change, FollowError> {
            let change = cache.apply(&kind.key(&e.name), e.value.as_deref())?;
            let changed = !matches!(change, Change::None | Change::Relist);
            policy_changed |= changed && DocKind::ALL.iter().any(|d| d.kind() == kind);
            dirty |= changed;
            Ok(change)
        };
        let mut own = match watch.next().await {
            Some(Ok(e)) => match apply(e)? {
                Change::Relist => return Ok(()),
                c => c == Change::Own,
            },
            Some(Err(e)) => return Err(e.into()),
            None => return Ok(()),
        };
        // Let a burst of changes settle (see DEBOUNCE).
        let latest = tokio::time::Instant::now() + DEBOUNCE;
        loop {
            // Of our own: only what is already there (a deadline now polls once).
            let until = if own {
                tokio::time::Instant::now()
            } else {
                latest
            };
            match tokio::time::timeout_at(until, watch.next()).await {
                Ok(Some(Ok(e))) => match apply(e)? {
                    Change::Relist => return Ok(()),
                    c => own |= c == Change::Own,
                },
                Ok(Some(Err(e))) => return Err(e.into()),
                Ok(None) => return Ok(()),
                Err(_) => break,
            }
        }
    }
}

/// Reports each policy document margay cannot enforce (`crate::warnings`: on the Kubernetes
/// datastore, an Event on the object that holds it).
fn record_problems(store: &Store, me: &str, problems: Vec<(DocRef, String)>) {
    for (at, problem) in problems {
        crate::warnings::report(
            store.as_kubernetes(),
            ::datastore::kubernetes::EventSubject::document(&at),
            crate::warnings::Reason::PolicyNotEnforced,
            vec![problem],
            me,
        );
    }
}

/// A datastore pool as the policy generator sees it.
fn policy_pool(p: &::datastore::model::IpPool) -> PolicyPool {
    let encap = |m: ::datastore::model::EncapMode| match m {
        ::datastore::model::EncapMode::Never => Encap::Never,
        ::datastore::model::EncapMode::Always => Encap::Always,
        ::datastore::model::EncapMode::CrossSubnet => Encap::CrossSubnet,
    };
    PolicyPool {
        name: p.name.clone(),
        cidr: p.cidr,
        vxlan_mode: encap(p.vxlan_mode),
        ipip_mode: encap(p.ipip_mode),
        disable_bgp_export: p.disable_bgp_export,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::datastore::resource::encode;

    #[test]
    fn the_cache_follows_puts_and_deletes_and_ignores_other_keys() {
        let mut c = StateCache::new("a");
        let n = Node::new("a");
        c.apply(&Node::key("a"), Some(&encode(&n))).unwrap();
        c.apply(
            &BgpPeer::key("tor"),
            Some(&encode(&BgpPeer::new(
                "tor",
                "",
                "10.0.0.1".parse().unwrap(),
                65000,
            ))),
        )
        .unwrap();
        c.apply("/margay/v1/ipam/handles/x", Some(b"not even json"))
            .unwrap();
        let s = c.state();
        assert_eq!((s.nodes.len(), s.bgp_peers.len()), (1, 1));
        c.apply(&Node::key("a"), None).unwrap();
        assert!(c.state().nodes.is_empty());
        // A value that does not decode is an error (the follow loop lists again).
        assert!(c.apply(&Node::key("b"), Some(b"{}")).is_err());
    }

    #[test]
    fn policy_documents_margay_cannot_enforce_are_kept_as_problems_until_taken() {
        let mut c = StateCache::new("a");
        let at = DocRef::new(DocKind::K8sNetworkPolicy, "shop", "web");
        let doc = |spec: serde_json::Value| {
            encode(&Document {
                json: serde_json::json!({
                    "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                    "metadata": {"name": "web", "namespace": "shop"}, "spec": spec,
                }),
            })
        };
        let good = doc(serde_json::json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
        let bad = doc(serde_json::json!({"podSelector": 7}));
        c.apply(&at.key(), Some(&bad)).unwrap();
        let problems = c.take_problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, at);
        assert!(
            problems[0]
                .1
                .starts_with("left out of the network policy: "),
            "{problems:?}"
        );
        assert!(c.take_problems().is_empty());
        c.apply(&at.key(), Some(&good)).unwrap();
        assert!(c.take_problems().is_empty());
        c.apply(&at.key(), Some(&bad)).unwrap();
        let problems = c.take_problems();
        assert!(
            problems[0]
                .1
                .starts_with("a change margay cannot enforce; its last version stays in force: "),
            "{problems:?}"
        );
        assert_eq!(c.state().policy.cluster().policies.len(), 1);
    }

    /// A block (of a VXLAN pool) is kept with what this node's computations read: the
    /// owner's own addresses go (on every node but the owner), borrowed ones and this node's
    /// stay, and so do the CIDR and the affinity; the free list goes.
    #[test]
    fn the_cache_keeps_of_a_block_what_this_node_needs() {
        let mut b = Block::new("172.20.0.0/26".parse().unwrap(), "p", Some("a"), 0);
        let none = BTreeMap::new();
        let a1 = b.allocate(1, "pod-of-a", "a", &none)[0].0;
        let c1 = b.allocate(1, "pod-of-c", "c", &none)[0].0;
        let b1 = b.allocate(1, "pod-of-b", "b", &none)[0].0;
        let key = Block::key(&ipam::block::cidr_key(&b.cidr));
        let mut pool = IpPool::new("p", "172.20.0.0/16".parse().unwrap());
        pool.vxlan_mode = ::datastore::model::EncapMode::Always;
        let kept = |me: &str| {
            let mut c = StateCache::new(me);
            c.apply(&IpPool::key("p"), Some(&encode(&pool))).unwrap();
            c.apply(&key, Some(&encode(&b))).unwrap();
            let s = c.state();
            assert_eq!(s.blocks.len(), 1);
            let got = &s.blocks[0];
            assert_eq!((got.cidr, got.affinity.as_deref()), (b.cidr, Some("a")));
            assert!(got.free.is_empty());
            let mut held: Vec<_> = got.slots.keys().map(|o| got.address(*o)).collect();
            held.sort();
            held
        };
        let mut all = vec![a1, b1, c1];
        all.sort();
        assert_eq!(kept("a"), all, "the owner keeps its block whole");
        assert_eq!(kept("b"), vec![c1, b1], "others keep the borrowed ones");
        assert_eq!(kept("d"), vec![c1, b1]);
    }

    /// What `apply` reports drives whether the brain computes again: only a change of what
    /// it keeps counts.
    #[test]
    fn the_cache_says_whether_what_it_keeps_changed() {
        let mut b = Block::new("172.20.0.0/26".parse().unwrap(), "p", Some("a"), 0);
        let key = Block::key(&ipam::block::cidr_key(&b.cidr));
        let none = BTreeMap::new();
        let mut c = StateCache::new("b");
        let mut pool = IpPool::new("p", "172.20.0.0/16".parse().unwrap());
        pool.vxlan_mode = ::datastore::model::EncapMode::Always;
        let pool_key = IpPool::key("p");
        assert_eq!(
            c.apply(&pool_key, Some(&encode(&pool))).unwrap(),
            Change::Relist,
            "a new VXLAN pool: other nodes' blocks in it are kept from now on"
        );
        let put = |c: &mut StateCache, b: &Block| c.apply(&key, Some(&encode(b))).unwrap();
        assert_eq!(
            put(&mut c, &b),
            Change::Cluster,
            "a new block of another node, in a VXLAN pool"
        );
        assert_eq!(put(&mut c, &b), Change::None, "the same again");
        b.allocate(1, "pod-of-a", "a", &none);
        assert_eq!(
            put(&mut c, &b),
            Change::None,
            "the owner's own address is not kept on another node"
        );
        b.allocate(1, "pod-of-b", "b", &none);
        assert_eq!(put(&mut c, &b), Change::Own, "this node's borrowed one is");
        assert_eq!(
            c.apply("/margay/v1/ipam/handles/x", Some(b"{}")).unwrap(),
            Change::None
        );
        assert_eq!(
            c.apply(&key, None).unwrap(),
            Change::Own,
            "deleted, it was ours"
        );
        assert_eq!(c.apply(&key, None).unwrap(), Change::None, "deleted again");
        let mine = Block::new("172.20.0.64/26".parse().unwrap(), "p", Some("b"), 0);
        let key = Block::key(&ipam::block::cidr_key(&mine.cidr));
        assert_eq!(c.apply(&key, Some(&encode(&mine))).unwrap(), Change::Own);
        assert_eq!(c.apply(&key, None).unwrap(), Change::Own);
        assert!(c.state().blocks.is_empty());
    }

    /// Another node's blocks and affinities outside VXLAN pools reach this node's kernel
    /// over BGP: they are neither kept nor a pass, unless they name this node; a pool that
    /// turns to VXLAN (or from it) has the cache listed again.
    #[test]
    fn other_nodes_blocks_outside_vxlan_pools_are_not_kept() {
        let mut c = StateCache::new("b");
        let mut pool = IpPool::new("p", "172.20.0.0/16".parse().unwrap());
        let pool_key = IpPool::key("p");
        assert_eq!(
            c.apply(&pool_key, Some(&encode(&pool))).unwrap(),
            Change::Cluster
        );
        let mut theirs = Block::new("172.20.0.0/26".parse().unwrap(), "p", Some("a"), 0);
        let key = Block::key(&ipam::block::cidr_key(&theirs.cidr));
        assert_eq!(c.apply(&key, Some(&encode(&theirs))).unwrap(), Change::None);
        let aff = BlockAffinity {
            node: "a".into(),
            cidr: theirs.cidr,
            state: ipam::block::AffinityState::Confirmed,
        };
        let aff_key = BlockAffinity::key_of("a", &theirs.cidr);
        assert_eq!(
            c.apply(&aff_key, Some(&encode(&aff))).unwrap(),
            Change::None
        );
        // Outside every pool, the same; a node whose name begins like ours is another node.
        let stray = Block::new("10.9.0.0/26".parse().unwrap(), "gone", Some("bb"), 0);
        let stray_key = Block::key(&ipam::block::cidr_key(&stray.cidr));
        assert_eq!(
            c.apply(&stray_key, Some(&encode(&stray))).unwrap(),
            Change::None
        );
        let bb_aff_key = BlockAffinity::key_of("bb", &stray.cidr);
        let bb_aff = BlockAffinity {
            node: "bb".into(),
            ..aff.clone()
        };
        assert_eq!(
            c.apply(&bb_aff_key, Some(&encode(&bb_aff))).unwrap(),
            Change::None
        );
        assert!(c.state().blocks.is_empty() && c.state().affinities.is_empty());
        // An address this node borrowed from it names it: kept, and a pass; given back, gone.
        let none = BTreeMap::new();
        theirs.allocate(1, "pod-of-b", "b", &none);
        assert_eq!(c.apply(&key, Some(&encode(&theirs))).unwrap(), Change::Own);
        assert_eq!(c.state().blocks.len(), 1);
        let held = theirs.slots.keys().next().copied().unwrap();
        theirs.release(theirs.address(held), None, None, 1);
        assert_eq!(c.apply(&key, Some(&encode(&theirs))).unwrap(), Change::Own);
        assert!(c.state().blocks.is_empty());
        // This node's own block and affinity in the same pool: kept, a pass.
        let mine = Block::new("172.20.0.64/26".parse().unwrap(), "p", Some("b"), 0);
        let mine_key = Block::key(&ipam::block::cidr_key(&mine.cidr));
        assert_eq!(
            c.apply(&mine_key, Some(&encode(&mine))).unwrap(),
            Change::Own
        );
        let my_aff = BlockAffinity {
            node: "b".into(),
            cidr: mine.cidr,
            ..aff.clone()
        };
        let my_aff_key = BlockAffinity::key_of("b", &mine.cidr);
        assert_eq!(
            c.apply(&my_aff_key, Some(&encode(&my_aff))).unwrap(),
            Change::Own
        );
        // The pool turns to VXLAN: list again; a new cache from the same listing keeps them.
        pool.vxlan_mode = ::datastore::model::EncapMode::CrossSubnet;
        assert_eq!(
            c.apply(&pool_key, Some(&encode(&pool))).unwrap(),
            Change::Relist
        );
        let one = ::datastore::Version::from_wire(1);
        let list = |kind: Kind, items: Vec<(&String, Vec<u8>)>| {
            let items = items
                .into_iter()
                .map(|(k, v)| ::datastore::Object {
                    name: kind.name_of(k).unwrap().to_owned(),
                    value: v,
                    version: one,
                })
                .collect();
            (
                kind,
                ObjectList {
                    items,
                    version: one,
                },
            )
        };
        // Pools listed last: the cache takes them first all the same.
        let lists = [
            list(BlockAffinity::kind(), vec![(&aff_key, encode(&aff))]),
            list(
                Block::kind(),
                vec![(&key, encode(&theirs)), (&mine_key, encode(&mine))],
            ),
            list(IpPool::kind(), vec![(&pool_key, encode(&pool))]),
        ];
        let mut c = StateCache::from_lists("b", &lists).unwrap();
        assert_eq!((c.state().blocks.len(), c.state().affinities.len()), (2, 1));
        assert_eq!(c.apply(&key, None).unwrap(), Change::Cluster);
        // A change of the pool that leaves VXLAN as it was is a pass, not a listing.
        pool.nat_outgoing = !pool.nat_outgoing;
        assert_eq!(
            c.apply(&pool_key, Some(&encode(&pool))).unwrap(),
            Change::Cluster
        );
        assert_eq!(c.apply(&pool_key, None).unwrap(), Change::Relist);
    }
}
