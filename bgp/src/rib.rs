//! The RIBs: Adj-RIB-In per peer, the Loc-RIB with the RFC 4271 §9.1 decision process, and
//! Adj-RIB-Out per established peer, for one address family ([`RibPrefix`]: the speaker
//! keeps one [`Rib`] for IPv4 unicast and one for IPv6 unicast).
//!
//! Why this file is long: Adj-RIB-In, the decision process and Adj-RIB-Out work on one set of
//! tables and change them together; split, each part would need the others' internals.
//!
//! **Job.** Take routes learned from peers and routes we originate; choose one best route
//! per prefix; compute, per peer, what it must be told (iBGP/eBGP rules, next-hop-self,
//! AS prepend, no LOCAL_PREF to eBGP) and return what changed.
//!
//! **Boundaries.** Sans-IO and single-owner: one task (the speaker) owns a [`Rib`] and calls
//! it; nothing here locks or awaits. Packing the returned [`OutUpdate`]s into messages is
//! the session's job (`bgp_wire::pack`).
//!
//! **Next hops.** IPv4 routes keep an IPv4 next hop in NEXT_HOP; IPv6 routes, and IPv4
//! routes with an IPv6 next hop (RFC 8950), keep it in `mp_next_hop`. What a peer is sent
//! for our own routes comes from [`PeerInfo`] (the session decides: our address on it, a
//! link-local one beside it on a shared link, the node's IPv6 address on an IPv4 session).
//!
//! **Policy.** Adj-RIB-In keeps what peers sent, before policy, so a new [`Policy`] (pools
//! changed) is applied without asking peers again: import rules are evaluated when the
//! decision process looks at a candidate, export rules when a route is exported.
//!
//! **Route reflection (RFC 4456).** With a cluster id this RIB reflects: routes from clients
//! go to every iBGP peer, routes from non-clients to clients only; ORIGINATOR_ID and
//! CLUSTER_LIST are set on the way out and checked on the way in.
//!
//! **Memory.** Path attributes are interned: one `Arc` per distinct [`PathAttributes`], shared
//! by every route that carries them (BIRD's attribute cache). Routes hold only the `Arc`,
//! so equality of attributes is pointer equality; the Adj-RIB-In holds a 4-byte [`AttrId`]
//! per route and the interner counts those references. The Loc-RIB holds only *which* candidate
//! is best (a 4-byte source code per prefix, beside its 4-byte slot), not a copy of its
//! attributes: they are read from the Adj-RIB-In (or the originated routes) it points to.
//! An Adj-RIB-Out is one bit per Loc-RIB prefix (`AdjOut`, BIRD's export map): what a peer
//! was sent is what export gives the best route, since each change of a best route is
//! exported when it happens; so a full table sent to a peer costs 1 bit per route, not a map
//! entry (a few duplicate announcements when a best route changes but exports the same, as
//! with BIRD). The per-prefix tables and other maps are `hashbrown` maps with its default
//! hasher (foldhash: fast on small fixed-size keys, where SipHash was a measurable share of
//! ingest time); sorted output is made on request (listings), not maintained on every
//! insert. Measured with `bgp_bench`: these cut ingest time and
//! bytes per route (a B-tree Loc-RIB with attribute copies and SipHash maps cost about 85 B
//! per route).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::Hash;

use hashbrown::{DefaultHashBuilder, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use bgp_wire::{
    AsPath, Asn, Community, Ipv4Prefix, Ipv6Prefix, NextHop, NlriPrefix, Origin, PathAttributes,
    Prefix,
};

use crate::policy::{
    Advertisement, Decider, IfName, PeerClass, PeerRef, Policy, RouteSource, Verdict,
};

/// A peer's identity inside the speaker (stable while the peer is configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// Interned attributes.
pub type Attrs = Arc<PathAttributes>;

/// Which candidate is best for a prefix, in 4 bytes: a peer's id, or [`BestCode::LOCAL`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
struct BestCode(u32);

impl BestCode {
    /// Originated here. Peer ids count up from 1 in the speaker, far from this value.
    const LOCAL: BestCode = BestCode(u32::MAX);

    fn of(s: Source) -> Self {
        match s {
            Source::Local => BestCode::LOCAL,
            Source::Peer(p) => BestCode(p.0),
        }
    }

    fn source(self) -> Source {
        if self == BestCode::LOCAL {
            Source::Local
        } else {
            Source::Peer(PeerId(self.0))
        }
    }
}

/// A Loc-RIB prefix's bit in every peer's [`AdjOut`], held while the prefix has a best route
/// and reused after.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LocSlot(u32);

/// A Loc-RIB entry: which candidate is best, and the prefix's [`LocSlot`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LocEntry {
    best: BestCode,
    slot: LocSlot,
}

/// What an established peer has been sent: one bit per Loc-RIB [`LocSlot`] (BIRD's export map),
/// and how many are set. The attributes it was sent are what export gives the prefix's best
/// route now, because every change of a best route is exported as it happens: no copy is
/// kept (a copy per peer and route was most of the memory of a speaker sending a full table).
#[derive(Debug, Default)]
struct AdjOut {
    bits: Vec<u64>,
    count: usize,
}

impl AdjOut {
    fn has(&self, s: LocSlot) -> bool {
        self.bits
            .get((s.0 / 64) as usize)
            .is_some_and(|w| w & (1 << (s.0 % 64)) != 0)
    }

    /// Set or clear a slot's bit; whether it was set.
    fn mark(&mut self, s: LocSlot, on: bool) -> bool {
        let i = (s.0 / 64) as usize;
        if self.bits.len() <= i {
            if !on {
                return false;
            }
            self.bits.resize(i + 1, 0);
        }
        let bit = 1u64 << (s.0 % 64);
        let Some(w) = self.bits.get_mut(i) else {
            return false;
        };
        let was = *w & bit != 0;
        if on {
            *w |= bit;
        } else {
            *w &= !bit;
        }
        match (was, on) {
            (false, true) => self.count += 1,
            (true, false) => self.count -= 1,
            _ => {}
        }
        was
    }

    fn len(&self) -> usize {
        self.count
    }
}

/// What a peer is sent for a best route depends on its attributes and source, not on the
/// prefix: computed once per pair in a pass over many prefixes (a full table with a few
/// attribute sets costs a few export computations, not one per route).
#[derive(Default)]
struct ExportMemo {
    /// Keyed by the attributes, the source and the advertisements that add communities.
    #[allow(clippy::type_complexity)]
    attrs: HashMap<(*const PathAttributes, BestCode, Vec<*const Advertisement>), Option<Attrs>>,
    /// The split-horizon verdict of the last source seen: a change usually comes from one
    /// peer's UPDATE, so every prefix of it has the same source.
    last_split: Option<(BestCode, bool)>,
}

/// LOCAL_PREF assumed when a route has none (RFC 4271 leaves it to the operator; all of
/// BIRD, FRR and GoBGP use 100).
pub const DEFAULT_LOCAL_PREF: u32 = 100;

/// A prefix type a [`Rib`] holds: IPv4 or IPv6 unicast.
pub trait RibPrefix:
    NlriPrefix + Ord + Hash + fmt::Display + fmt::Debug + Send + Sync + 'static
{
    /// The prefix as policy and listings see it.
    fn any(self) -> Prefix;
    /// This family's prefix, if `p` is of it.
    fn from_any(p: Prefix) -> Option<Self>;
    /// The next hop we give `to` for our routes of this family (next-hop-self); `None`: the
    /// session cannot carry them.
    fn self_next_hop(to: &PeerInfo) -> Option<NextHop>;
    /// Whether `to` can be sent a route of this family with next hop `nh` as it is.
    fn carries(to: &PeerInfo, nh: &NextHop) -> bool;
    /// A peer's changes of this family, for its session.
    fn family_update(u: OutUpdate<Self>) -> FamilyUpdate;
}

impl RibPrefix for Ipv4Prefix {
    fn any(self) -> Prefix {
        Prefix::V4(self)
    }
    fn from_any(p: Prefix) -> Option<Self> {
        match p {
            Prefix::V4(p) => Some(p),
            Prefix::V6(_) => None,
        }
    }
    fn self_next_hop(to: &PeerInfo) -> Option<NextHop> {
        to.next_hop_v4
    }
    fn carries(to: &PeerInfo, nh: &NextHop) -> bool {
        // An IPv6 next hop only to a peer that takes them (RFC 8950: it said so, and we
        // then use one ourselves).
        matches!(nh, NextHop::V4(_)) || matches!(to.next_hop_v4, Some(NextHop::V6 { .. }))
    }
    fn family_update(u: OutUpdate<Self>) -> FamilyUpdate {
        FamilyUpdate::V4(u)
    }
}

impl RibPrefix for Ipv6Prefix {
    fn any(self) -> Prefix {
        Prefix::V6(self)
    }
    fn from_any(p: Prefix) -> Option<Self> {
        match p {
            Prefix::V6(p) => Some(p),
            Prefix::V4(_) => None,
        }
    }
    fn self_next_hop(to: &PeerInfo) -> Option<NextHop> {
        to.next_hop_v6
    }
    fn carries(_: &PeerInfo, nh: &NextHop) -> bool {
        matches!(nh, NextHop::V6 { .. })
    }
    fn family_update(u: OutUpdate<Self>) -> FamilyUpdate {
        FamilyUpdate::V6(u)
    }
}

/// One family's changes for a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FamilyUpdate {
    V4(OutUpdate<Ipv4Prefix>),
    V6(OutUpdate<Ipv6Prefix>),
}

impl FamilyUpdate {
    pub fn is_empty(&self) -> bool {
        match self {
            FamilyUpdate::V4(u) => u.is_empty(),
            FamilyUpdate::V6(u) => u.is_empty(),
        }
    }
}

/// The next hop a route carries, whichever field holds it.
pub fn next_hop_of(a: &PathAttributes) -> Option<NextHop> {
    a.next_hop.map(NextHop::V4).or(a.mp_next_hop)
}

/// The global next-hop address of a route (what the kernel routes via).
pub fn next_hop_addr(a: &PathAttributes) -> Option<IpAddr> {
    next_hop_of(a).map(|nh| match nh {
        NextHop::V4(v4) => IpAddr::V4(v4),
        NextHop::V6 { global, .. } => IpAddr::V6(global),
    })
}

/// Which peers a decision pass tells again about prefixes whose best route stayed (a policy
/// change may change what export gives them).
#[derive(Clone, Copy)]
enum ReExport<'a, P> {
    /// Nobody: only changed best routes are exported.
    None,
    /// Every peer.
    All,
    /// Those in `everyone` to every peer, the others only to `peers`.
    Scoped {
        everyone: &'a HashSet<P>,
        peers: &'a [PeerId],
    },
}

/// An IPv6 next hop whose global address is link-local (unnumbered sessions).
fn link_local_only(nh: &NextHop) -> bool {
    matches!(nh, NextHop::V6 { global, .. } if global.is_unicast_link_local())
}

/// Every verdict policy can give a prefix: (import from each class, export to each class
/// of a route from each source).
fn verdicts(pol: &Policy, p: Prefix) -> ([bool; 2], [bool; 6]) {
    use PeerClass::{Cluster, External};
    let import = [pol.import(Cluster, p), pol.import(External, p)];
    let mut export = [false; 6];
    let sources = [
        RouteSource::Local,
        RouteSource::Peer(Cluster),
        RouteSource::Peer(External),
    ];
    for (i, (to, src)) in [Cluster, External]
        .into_iter()
        .flat_map(|t| sources.into_iter().map(move |s| (t, s)))
        .enumerate()
    {
        if let Some(v) = export.get_mut(i) {
            *v = pol.export(to, p, src);
        }
    }
    (import, export)
}

/// Put `nh` where it belongs: NEXT_HOP for an IPv4 next hop, `mp_next_hop` otherwise.
fn set_next_hop(a: &mut PathAttributes, nh: NextHop) {
    match nh {
        NextHop::V4(v4) => {
            a.next_hop = Some(v4);
            a.mp_next_hop = None;
        }
        v6 => {
            a.next_hop = None;
            a.mp_next_hop = Some(v6);
        }
    }
}

/// What the RIB must know of an established peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    pub id: PeerId,
    pub address: IpAddr,
    pub asn: Asn,
    pub router_id: Ipv4Addr,
    /// The next hop we advertise for IPv4 routes we originate (and on eBGP, for all):
    /// our IPv4 address on the session, or our IPv6 one when the peer takes IPv6 next
    /// hops for IPv4 (RFC 8950); `None`: no IPv4 routes to this peer.
    pub next_hop_v4: Option<NextHop>,
    /// The same for IPv6 routes: our global address on the session (and link-local on a
    /// shared link), or the node's IPv6 address on an IPv4 session.
    pub next_hop_v6: Option<NextHop>,
    /// Our link-local address on the session's link, when the session runs over IPv6 on a
    /// shared link: one of our own addresses even where no IPv6 routes flow (an IPv6 session
    /// carrying only IPv4), so a route naming it as next hop is not usable.
    pub local_link_local: Option<Ipv6Addr>,
    /// Which policy rules apply to the peer.
    pub class: PeerClass,
    /// A route-reflector client of ours (meaningful only when we have a cluster id).
    pub rr_client: bool,
    /// What the operator set on the session beyond the defaults.
    pub options: PeerOptions,
}

/// A session's settings that change what the RIB does with its routes (Calico's `BGPPeer`
/// options; BIRD's `local as`, `allow local as`, `next hop self|keep`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerOptions {
    /// The AS we speak on this session instead of the RIB's: what we prepend, and what makes
    /// the session eBGP or iBGP.
    pub local_as: Option<Asn>,
    /// How often our AS may appear in a received AS_PATH before the route is a loop.
    pub allow_local_as: u8,
    pub next_hop: NextHopMode,
    /// The interface the session runs on: routes from it are "through" it for filters.
    pub interface: Option<IfName>,
}

/// Which next hop a peer is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NextHopMode {
    /// Ours to eBGP peers, the route's to iBGP peers (RFC 4271).
    #[default]
    Auto,
    /// Always ours (`next hop self`).
    SelfNextHop,
    /// Always the route's where it has one the peer can use (`next hop keep`).
    Keep,
}

impl PeerInfo {
    /// The AS we speak on this session, given the RIB's.
    pub fn local_as(&self, rib_as: Asn) -> Asn {
        self.options.local_as.unwrap_or(rib_as)
    }

    /// Whether the session is iBGP: the peer's AS is the one we speak on it.
    pub fn is_ibgp(&self, rib_as: Asn) -> bool {
        self.asn == self.local_as(rib_as)
    }

    /// The peer as policy sees it.
    pub fn policy_ref(&self) -> PeerRef {
        PeerRef {
            class: self.class,
            address: self.address,
            interface: self.options.interface,
        }
    }

    /// Whether `addr` is one of our own addresses on this session: a route with it as
    /// NEXT_HOP is not usable (RFC 4271 §5.1.3, §6.3) and is treated as withdrawn, as BIRD
    /// does.
    pub fn is_own_address(&self, addr: IpAddr) -> bool {
        self.local_link_local.map(IpAddr::V6) == Some(addr)
            || [self.next_hop_v4, self.next_hop_v6]
                .into_iter()
                .flatten()
                .any(|nh| match nh {
                    NextHop::V4(a) => IpAddr::V4(a) == addr,
                    NextHop::V6 { global, link_local } => {
                        IpAddr::V6(global) == addr || link_local.map(IpAddr::V6) == Some(addr)
                    }
                })
    }
}

/// Where a candidate route came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// Originated on this node (configuration or API).
    Local,
    Peer(PeerId),
}

/// A route in a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route<P = Ipv4Prefix> {
    pub prefix: P,
    pub source: Source,
    pub attrs: Attrs,
}

/// What one peer must be sent: announcements grouped by (interned) attributes, withdrawals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutUpdate<P = Ipv4Prefix> {
    pub announce: Vec<(Attrs, Vec<P>)>,
    pub withdraw: Vec<P>,
}

impl<P> Default for OutUpdate<P> {
    fn default() -> Self {
        OutUpdate {
            announce: Vec::new(),
            withdraw: Vec::new(),
        }
    }
}

impl<P> OutUpdate<P> {
    pub fn is_empty(&self) -> bool {
        self.announce.is_empty() && self.withdraw.is_empty()
    }
    pub fn announced(&self) -> usize {
        self.announce.iter().map(|(_, p)| p.len()).sum()
    }
}

/// An interned attribute set's number: what the Adj-RIB-In stores per route (4 bytes
/// instead of an 8-byte `Arc`; with the prefix, 12 bytes a route instead of 16).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttrId(u32);

#[derive(Debug)]
struct Slot {
    attrs: Attrs,
    /// Routes that hold the set by [`AttrId`] (they hold no `Arc`).
    refs: u32,
}

/// Attribute interner: one shared copy per distinct attribute set, with a number for
/// tables that count their references instead of holding an `Arc`.
#[derive(Debug, Default)]
pub struct Interner {
    /// Each set and its slot; the key is one `Arc`, the slot another.
    set: HashMap<Attrs, u32>,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
}

impl Interner {
    pub fn intern(&mut self, attrs: PathAttributes) -> Attrs {
        if let Some((a, _)) = self.set.get_key_value(&attrs) {
            return a.clone();
        }
        let a = Arc::new(attrs);
        let slot = Some(Slot {
            attrs: a.clone(),
            refs: 0,
        });
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(s) = self.slots.get_mut(id as usize) {
                    *s = slot;
                }
                id
            }
            None => {
                // More than 2^32 distinct sets cannot be held in memory anyway: saturate
                // (the extra sets simply cannot be referenced by id; see `hold`).
                let id = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                if id != u32::MAX {
                    self.slots.push(slot);
                }
                id
            }
        };
        self.set.insert(a.clone(), id);
        a
    }

    /// The id of an interned set; `None` only if it has no slot (past 2^32 sets).
    fn id_of(&self, a: &Attrs) -> Option<AttrId> {
        let id = *self.set.get(a.as_ref())?;
        self.slots.get(id as usize)?.as_ref()?;
        Some(AttrId(id))
    }

    /// One more route holds `id`.
    fn hold(&mut self, id: AttrId) {
        if let Some(Some(slot)) = self.slots.get_mut(id.0 as usize) {
            slot.refs = slot.refs.saturating_add(1);
        }
    }

    /// A route stopped holding `id`.
    fn release(&mut self, id: AttrId) {
        if let Some(Some(slot)) = self.slots.get_mut(id.0 as usize) {
            slot.refs = slot.refs.saturating_sub(1);
        }
    }

    fn get(&self, id: AttrId) -> Option<&Attrs> {
        Some(&self.slots.get(id.0 as usize)?.as_ref()?.attrs)
    }

    /// Drop sets no route uses any more (no id reference, no `Arc` but ours).
    pub fn sweep(&mut self) {
        let slots = &mut self.slots;
        let free = &mut self.free;
        self.set.retain(|a, id| {
            let slot = slots.get(*id as usize).and_then(Option::as_ref);
            let refs = slot.map_or(0, |s| s.refs);
            // Our own `Arc`s: the key, and the slot's.
            let ours = 1 + usize::from(slot.is_some());
            let keep = refs > 0 || Arc::strong_count(a) > ours;
            if !keep && let Some(s) = slots.get_mut(*id as usize) {
                *s = None;
                free.push(*id);
            }
            keep
        });
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// What an UPDATE's handling knows of the sender's route for a prefix it touched.
#[derive(Debug, Clone, Copy)]
enum Known {
    /// The sender's route is now this (`true`: it passes import policy and the loop checks).
    Usable(bool),
    /// Not known (a withdrawal the same UPDATE may announce again): look it up.
    LookUp,
}

#[derive(Debug)]
struct PeerState<P> {
    info: PeerInfo,
    adj_in: HashMap<P, AttrId>,
    /// Present only while the session is established.
    adj_out: Option<AdjOut>,
    /// Routes received but rejected by import rules (AS loop).
    rejected: u64,
    /// Graceful restart: routes kept from before the peer restarted, not yet refreshed.
    stale: Option<HashSet<P>>,
    /// How many Adj-RIB-In routes pass import policy, kept up to date as routes come and go
    /// (status is polled while routes stream in; counting there would be O(routes)).
    accepted: u64,
}

/// The three tables of one speaker, for one address family.
#[derive(Debug)]
pub struct Rib<P = Ipv4Prefix> {
    local_as: Asn,
    router_id: Ipv4Addr,
    interner: Interner,
    local: HashMap<P, Attrs>,
    peers: BTreeMap<PeerId, PeerState<P>>,
    /// The Loc-RIB: which candidate is best; its attributes stay where they are stored.
    loc: HashMap<P, LocEntry>,
    /// The hasher of the Loc-RIB and of every Adj-RIB-In (random per RIB, as hashbrown's
    /// default): with one hash function a pass over one table in its order meets the same
    /// prefixes in the others nearly in order, not at random. `bgp_bench`, 500k prefixes:
    /// advertisement (a pass over the Loc-RIB reading each best route's Adj-RIB-In entry)
    /// took 0.13-0.18 s with a hasher of its own per table.
    hasher: DefaultHashBuilder,
    /// Slots of prefixes that left the Loc-RIB, for the next ones; `next_slot` past the last.
    free_slots: Vec<LocSlot>,
    next_slot: u32,
    /// Changes since the last sweep; the interner is swept after many.
    churn: usize,
    policy: Arc<Policy>,
    /// Set: we are a route reflector with this cluster id.
    cluster_id: Option<Ipv4Addr>,
    /// Prefixes whose best route changed, when someone drains them (`track_loc_changes`).
    loc_changes: Option<Vec<P>>,
    /// The established peers and whether each is an iBGP peer, in id order: read on every
    /// change, so kept (rebuilt when a session comes or goes) rather than gathered from
    /// every peer's state each time.
    established: Option<Arc<[(PeerId, bool)]>>,
}

impl<P: RibPrefix> Rib<P> {
    pub fn new(local_as: Asn, router_id: Ipv4Addr) -> Self {
        let hasher = DefaultHashBuilder::default();
        Rib {
            local_as,
            router_id,
            interner: Interner::default(),
            local: HashMap::default(),
            peers: BTreeMap::new(),
            loc: HashMap::with_hasher(hasher.clone()),
            hasher,
            free_slots: Vec::new(),
            next_slot: 0,
            churn: 0,
            policy: Arc::new(Policy::accept_all()),
            cluster_id: None,
            loc_changes: None,
            established: None,
        }
    }

    /// Record Loc-RIB changes for [`Rib::take_loc_changes`] from now on.
    pub fn track_loc_changes(&mut self) {
        self.loc_changes.get_or_insert_with(Vec::new);
    }

    /// The prefixes whose best route changed since the last call (tracking must be on).
    pub fn take_loc_changes(&mut self) -> Vec<P> {
        self.loc_changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    pub fn cluster_id(&self) -> Option<Ipv4Addr> {
        self.cluster_id
    }

    /// Apply a new policy and reflector role to everything held: the Loc-RIB is decided
    /// again and every Adj-RIB-Out brought in line (no session is reset).
    pub fn set_policy(
        &mut self,
        policy: Arc<Policy>,
        cluster_id: Option<Ipv4Addr>,
    ) -> HashMap<PeerId, OutUpdate<P>> {
        if *policy == *self.policy && cluster_id == self.cluster_id {
            return HashMap::new();
        }
        let old = std::mem::replace(&mut self.policy, policy);
        let reflector_changed = cluster_id != self.cluster_id;
        self.cluster_id = cluster_id;
        // A peer's own filters, or the communities added on export, changed: what export
        // gives that peer (or, for communities, every peer) may change for any prefix.
        let filters_changed = self.policy.filters_changed(&old);
        let adverts_changed = self.policy.advertisements_differ(&old);
        let mut all: Vec<P> = self.loc.keys().copied().collect();
        all.extend(self.local.keys().copied());
        for st in self.peers.values() {
            all.extend(st.adj_in.keys().copied());
        }
        all.sort_unstable();
        all.dedup();
        // Only prefixes whose generated verdicts changed are exported again to everyone: a
        // node's policy changes with each block it claims, and a mesh node holds every block.
        let mut import_changed = reflector_changed || !filters_changed.is_empty();
        let mut generated = all.clone();
        if !reflector_changed {
            generated.retain(|p| {
                let (was, now) = (verdicts(&old, p.any()), verdicts(&self.policy, p.any()));
                import_changed |= was.0 != now.0;
                was != now
            });
        }
        if import_changed {
            self.recount_accepted(None);
        }
        if filters_changed.is_empty() && !adverts_changed {
            return self.decide_and_export(&generated, None, ReExport::All, &[]);
        }
        // Every prefix is decided again (an import filter may change any best route); the
        // peers concerned are told everything again, the others what changed for them.
        let peers: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, s)| adverts_changed || filters_changed.contains(&s.info.address))
            .map(|(id, _)| *id)
            .collect();
        let everyone: HashSet<P> = generated.into_iter().collect();
        self.decide_and_export(
            &all,
            None,
            ReExport::Scoped {
                everyone: &everyone,
                peers: &peers,
            },
            &[],
        )
    }

    /// Whether a stored route (by id) passes import policy and the loop checks.
    fn was_eligible(&self, info: &PeerInfo, p: &P, id: AttrId) -> bool {
        self.interner
            .get(id)
            .is_some_and(|a| self.eligible(info, p, a))
    }

    /// Count again which Adj-RIB-In routes pass import policy (of one peer, or all).
    fn recount_accepted(&mut self, only: Option<PeerId>) {
        let ids: Vec<PeerId> = match only {
            Some(id) => vec![id],
            None => self.peers.keys().copied().collect(),
        };
        for id in ids {
            let Some(st) = self.peers.get(&id) else {
                continue;
            };
            let n = st
                .adj_in
                .iter()
                .filter(|(p, id)| {
                    self.interner
                        .get(**id)
                        .is_some_and(|a| self.eligible(&st.info, p, a))
                })
                .count() as u64;
            if let Some(st) = self.peers.get_mut(&id) {
                st.accepted = n;
            }
        }
    }

    /// The attributes of the candidate `code` names for `p`.
    fn attrs_of(&self, p: &P, code: BestCode) -> Option<&Attrs> {
        match code.source() {
            Source::Local => self.local.get(p),
            Source::Peer(id) => self.interner.get(*self.peers.get(&id)?.adj_in.get(p)?),
        }
    }

    /// Whether a route from `code` may not go to iBGP peer `to` (RFC 4271 §9.2: iBGP-learned
    /// routes are not passed to iBGP peers, unless reflected, RFC 4456 §6).
    fn split_horizon(&self, to: &PeerInfo, code: BestCode) -> bool {
        let Source::Peer(q) = code.source() else {
            return false;
        };
        let Some(from) = self.peers.get(&q).map(|s| &s.info) else {
            return false;
        };
        to.is_ibgp(self.local_as)
            && from.is_ibgp(self.local_as)
            && !(self.cluster_id.is_some() && (from.rr_client || to.rr_client))
    }

    /// Peers with an Adj-RIB-Out (established sessions), with whether each is an iBGP peer.
    fn established(&mut self) -> Arc<[(PeerId, bool)]> {
        let local_as = self.local_as;
        self.established
            .get_or_insert_with(|| {
                self.peers
                    .iter()
                    .filter(|(_, s)| s.adj_out.is_some())
                    .map(|(id, s)| (*id, s.info.is_ibgp(local_as)))
                    .collect()
            })
            .clone()
    }

    /// An established peer as policy sees it (with its session's interface).
    pub fn peer_ref(&self, id: PeerId) -> Option<PeerRef> {
        self.peers.get(&id).map(|s| s.info.policy_ref())
    }

    /// Why the best route for `p` is (or is not) sent to `to`; a prefix with no best route
    /// is judged as one originated here (what `bgpctl show filters PEER PREFIX` asks of a
    /// route that might be).
    pub fn explain_export(&self, to: &PeerRef, p: &P) -> Verdict<'_> {
        let (src, iface) = match self.best(p) {
            Some((Source::Peer(q), _)) => (
                self.route_source(Source::Peer(q)),
                self.peers.get(&q).and_then(|s| s.info.options.interface),
            ),
            _ => (RouteSource::Local, None),
        };
        self.policy.export_verdict(to, p.any(), src, iface)
    }

    /// Why `p` from `from` is (or is not) imported (before the loop checks).
    pub fn explain_import(&self, from: &PeerRef, p: &P) -> Verdict<'_> {
        self.policy.import_verdict(from, p.any())
    }

    /// The source of a Loc-RIB route as policy sees it.
    pub fn route_source(&self, source: Source) -> RouteSource {
        match source {
            Source::Local => RouteSource::Local,
            Source::Peer(q) => RouteSource::Peer(
                self.peers
                    .get(&q)
                    .map_or(PeerClass::External, |s| s.info.class),
            ),
        }
    }

    /// Whether a received route may be used: import policy and the reflection loop checks.
    fn eligible(&self, info: &PeerInfo, prefix: &P, a: &PathAttributes) -> bool {
        if info.is_ibgp(self.local_as) {
            if a.originator_id == Some(self.router_id) {
                return false;
            }
            if let Some(c) = self.cluster_id
                && a.cluster_list.contains(&c)
            {
                return false;
            }
        }
        self.policy
            .import_verdict(&info.policy_ref(), prefix.any())
            .accept
    }

    pub fn local_as(&self) -> Asn {
        self.local_as
    }

    pub fn router_id(&self) -> Ipv4Addr {
        self.router_id
    }

    /// Distinct attribute sets currently stored.
    pub fn attribute_sets(&self) -> usize {
        self.interner.len()
    }

    /// A session came up: its Adj-RIB-Out starts empty and is filled from the Loc-RIB.
    pub fn peer_up(&mut self, info: PeerInfo) -> OutUpdate<P> {
        let hasher = &self.hasher;
        let st = self.peers.entry(info.id).or_insert_with(|| PeerState {
            info,
            adj_in: HashMap::with_hasher(hasher.clone()),
            adj_out: None,
            rejected: 0,
            stale: None,
            accepted: 0,
        });
        let class_changed = st.info != info;
        st.info = info;
        st.adj_out = Some(AdjOut::default());
        self.established = None;
        if class_changed {
            self.recount_accepted(Some(info.id));
        }
        // The Loc-RIB is walked in its own order, with each entry at hand: a list of its
        // prefixes to sort first was the largest transient of a fresh session, and looking
        // each up again in prefix order missed the cache every time. The groups are put in
        // prefix order afterwards. An iBGP peer of a RIB that does not reflect is sent no
        // iBGP-learned route (in a full mesh, nearly the whole table): one check per source.
        let Some(mut pass) = self.begin_export(info.id) else {
            return OutUpdate::default();
        };
        let ibgp = self.cluster_id.is_none() && info.is_ibgp(self.local_as);
        let mut learned: HashMap<BestCode, bool> = HashMap::default();
        for (p, e) in &self.loc {
            if ibgp
                && *learned
                    .entry(e.best)
                    .or_insert_with(|| self.ibgp_learned(Some(e.best)))
            {
                continue;
            }
            pass.offer(self, *p, Some(*e), None);
        }
        pass.sort();
        let mut out = HashMap::new();
        self.end_export(info.id, pass, &mut out);
        out.remove(&info.id).unwrap_or_default()
    }

    /// A session went down (or the peer was deleted): its routes leave every table.
    pub fn peer_down(&mut self, id: PeerId) -> HashMap<PeerId, OutUpdate<P>> {
        let Some(st) = self.peers.remove(&id) else {
            return HashMap::new();
        };
        self.established = None;
        let mut prefixes = Vec::with_capacity(st.adj_in.len());
        for (p, a) in &st.adj_in {
            self.interner.release(*a);
            prefixes.push(*p);
        }
        let out = self.recompute(&prefixes, Some(BestCode::of(Source::Peer(id))));
        self.maybe_sweep(prefixes.len());
        out
    }

    /// The peer's session ended but it is restarting gracefully (RFC 4724): its routes stay
    /// in every table, marked stale, until refreshed, swept, or the peer goes for good.
    /// Returns how many are kept.
    pub fn peer_down_graceful(&mut self, id: PeerId) -> usize {
        let Some(st) = self.peers.get_mut(&id) else {
            return 0;
        };
        st.adj_out = None;
        let stale: HashSet<P> = st.adj_in.keys().copied().collect();
        let n = stale.len();
        st.stale = Some(stale);
        self.established = None;
        n
    }

    /// The peer begins re-advertising its routes (enhanced route refresh BoRR): each is
    /// stale until re-advertised; what still is at EoRR goes ([`Rib::sweep_stale`]).
    pub fn begin_refresh(&mut self, id: PeerId) {
        if let Some(st) = self.peers.get_mut(&id) {
            st.stale = Some(st.adj_in.keys().copied().collect());
        }
    }

    /// Drop the peer's routes still stale (its End-of-RIB came, or its time ran out).
    pub fn sweep_stale(&mut self, id: PeerId) -> HashMap<PeerId, OutUpdate<P>> {
        let Some(st) = self.peers.get_mut(&id) else {
            return HashMap::new();
        };
        let Some(stale) = st.stale.take() else {
            return HashMap::new();
        };
        let mut gone = Vec::new();
        let mut released = Vec::new();
        for p in stale {
            if let Some(a) = st.adj_in.remove(&p) {
                gone.push(p);
                released.push(a);
            }
        }
        for a in released {
            self.interner.release(a);
        }
        self.recount_accepted(Some(id));
        let out = self.recompute(&gone, Some(BestCode::of(Source::Peer(id))));
        self.maybe_sweep(gone.len());
        out
    }

    /// Whether the peer has routes kept through a graceful restart.
    pub fn has_stale(&self, id: PeerId) -> bool {
        self.peers.get(&id).is_some_and(|s| s.stale.is_some())
    }

    /// Whether this route of the peer is kept from before its restart.
    pub fn is_stale(&self, id: PeerId, prefix: &P) -> bool {
        self.peers
            .get(&id)
            .and_then(|s| s.stale.as_ref())
            .is_some_and(|st| st.contains(prefix))
    }

    /// Routes from a peer's UPDATE: `announced` with `attrs`, and `withdrawn`.
    pub fn update(
        &mut self,
        from: PeerId,
        attrs: Option<PathAttributes>,
        announced: &[P],
        withdrawn: &[P],
    ) -> HashMap<PeerId, OutUpdate<P>> {
        let local_as = self.local_as;
        let Some(info) = self.peers.get(&from).map(|s| s.info) else {
            return HashMap::new();
        };
        let session_as = info.local_as(local_as);
        let external = info.asn != session_as;
        if let Some(stale) = self.peers.get_mut(&from).and_then(|st| st.stale.as_mut()) {
            // Refreshed (or withdrawn) routes are no longer stale.
            for p in announced.iter().chain(withdrawn) {
                stale.remove(p);
            }
        }
        let mut touched: Vec<P> = Vec::with_capacity(announced.len() + withdrawn.len());
        // Per touched prefix, whether `from` now has a usable route for it, where known
        // without looking again (see `Known`).
        let mut known: Vec<Known> = Vec::with_capacity(touched.capacity());
        // Import policy and loop checks decide `accepted`; evaluated on the way in and out.
        let mut accepted_delta: i64 = 0;
        for p in withdrawn {
            let Some(old) = self.peers.get_mut(&from).and_then(|st| st.adj_in.remove(p)) else {
                continue;
            };
            if self.was_eligible(&info, p, old) {
                accepted_delta -= 1;
            }
            self.interner.release(old);
            touched.push(*p);
            // The same prefix may be announced again further on.
            known.push(Known::LookUp);
        }
        if let Some(attrs) = attrs.filter(|_| !announced.is_empty()) {
            // eBGP loop rejection (RFC 4271 §9.1.2): our AS in the path means it went round.
            // `allow local as N` lets our AS appear N times (Calico's numAllowedLocalASNumbers).
            let looped = external
                && attrs.as_path.as_ref().is_some_and(|p| {
                    p.count(session_as) > usize::from(info.options.allow_local_as)
                });
            // A next hop of ours is not usable: the route is treated as withdrawn.
            let own_next_hop = next_hop_addr(&attrs).is_some_and(|nh| info.is_own_address(nh));
            if looped || own_next_hop {
                for p in announced {
                    let Some(st) = self.peers.get_mut(&from) else {
                        break;
                    };
                    st.rejected = st.rejected.saturating_add(1);
                    if let Some(old) = st.adj_in.remove(p) {
                        if self.was_eligible(&info, p, old) {
                            accepted_delta -= 1;
                        }
                        self.interner.release(old);
                        touched.push(*p);
                        known.push(Known::Usable(false));
                    }
                }
            } else {
                let a = self.interner.intern(attrs);
                let Some(id) = self.interner.id_of(&a) else {
                    // Only past 2^32 distinct sets: the routes cannot be stored.
                    if let Some(st) = self.peers.get_mut(&from) {
                        st.rejected = st.rejected.saturating_add(announced.len() as u64);
                    }
                    return self.recompute_received(from, &touched, &known);
                };
                // One verdict for the whole UPDATE when policy does not look at prefixes.
                let prefix_blind = !self.policy.is_generated();
                let all_ok = prefix_blind
                    && announced
                        .first()
                        .is_some_and(|p| self.eligible(&info, p, &a));
                for p in announced {
                    let ok = if prefix_blind {
                        all_ok
                    } else {
                        self.eligible(&info, p, &a)
                    };
                    let Some(st) = self.peers.get_mut(&from) else {
                        break;
                    };
                    if let Some(old) = st.adj_in.insert(*p, id) {
                        if old == id {
                            // The same route again: nothing to decide.
                            continue;
                        }
                        if self.was_eligible(&info, p, old) {
                            accepted_delta -= 1;
                        }
                        self.interner.release(old);
                    }
                    self.interner.hold(id);
                    if ok {
                        accepted_delta += 1;
                    }
                    touched.push(*p);
                    // Announcements come last: this is the route `from` is left with.
                    known.push(Known::Usable(ok));
                }
            }
        }
        if let Some(st) = self.peers.get_mut(&from) {
            st.accepted = st.accepted.saturating_add_signed(accepted_delta);
        }
        let out = self.recompute_received(from, &touched, &known);
        self.maybe_sweep(touched.len());
        out
    }

    /// Originate `prefix` with `attrs` (next hop and AS path are set per peer on export).
    pub fn announce(&mut self, prefix: P, attrs: PathAttributes) -> HashMap<PeerId, OutUpdate<P>> {
        // The same again changes nothing (and peers are not sent it again).
        if self.local.get(&prefix).is_some_and(|a| **a == attrs) {
            return HashMap::new();
        }
        let a = self.interner.intern(attrs);
        self.local.insert(prefix, a);
        self.recompute(&[prefix], Some(BestCode::LOCAL))
    }

    /// Stop originating `prefix`; `None` if we did not.
    pub fn withdraw(&mut self, prefix: P) -> Option<HashMap<PeerId, OutUpdate<P>>> {
        self.local.remove(&prefix)?;
        let out = self.recompute(&[prefix], Some(BestCode::LOCAL));
        self.maybe_sweep(1);
        Some(out)
    }

    /// Everything advertised to a peer, again (ROUTE-REFRESH from it).
    pub fn refresh(&self, id: PeerId) -> OutUpdate<P> {
        let routes = self
            .adj_out(id)
            .into_iter()
            .map(|r| (r.prefix, Some(r.attrs)));
        group(routes)
    }

    /// What `id` has been sent, in prefix order: the routes its bits mark, with the
    /// attributes export gives them.
    pub fn adj_out(&self, id: PeerId) -> Vec<Route<P>> {
        let Some((info, adj)) = self
            .peers
            .get(&id)
            .and_then(|s| Some((s.info, s.adj_out.as_ref()?)))
        else {
            return Vec::new();
        };
        let mut memo = ExportMemo::default();
        let mut v: Vec<Route<P>> = self
            .loc
            .iter()
            .filter(|(_, e)| adj.has(e.slot))
            .filter_map(|(p, e)| {
                Some(Route {
                    prefix: *p,
                    source: Source::Peer(id),
                    attrs: self.exported(&info, p, e.best, &mut memo)?,
                })
            })
            .collect();
        v.sort_unstable_by_key(|r| r.prefix);
        v
    }

    /// The Loc-RIB in prefix order (sorted here: the table itself is a hash map).
    pub fn loc_rib(&self) -> impl Iterator<Item = Route<P>> + '_ {
        let mut v: Vec<Route<P>> = self
            .loc
            .iter()
            .filter_map(|(p, e)| {
                Some(Route {
                    prefix: *p,
                    source: e.best.source(),
                    attrs: self.attrs_of(p, e.best)?.clone(),
                })
            })
            .collect();
        v.sort_unstable_by_key(|r| r.prefix);
        v.into_iter()
    }

    /// What this node originates.
    pub fn local_routes(&self) -> Vec<(P, PathAttributes)> {
        self.local
            .iter()
            .map(|(p, a)| (*p, PathAttributes::clone(a)))
            .collect()
    }

    pub fn loc_len(&self) -> usize {
        self.loc.len()
    }

    /// Loc-RIB routes within `within` (all of them without), counted in place.
    pub fn loc_count(&self, within: Option<Prefix>) -> usize {
        match within {
            None => self.loc.len(),
            Some(w) => self.loc.keys().filter(|p| w.contains(&p.any())).count(),
        }
    }

    /// The best route for a prefix.
    pub fn best(&self, prefix: &P) -> Option<(Source, &Attrs)> {
        let code = self.loc.get(prefix)?.best;
        Some((code.source(), self.attrs_of(prefix, code)?))
    }

    pub fn adj_in(&self, id: PeerId) -> Vec<Route<P>> {
        let mut v: Vec<Route<P>> = self
            .peers
            .get(&id)
            .into_iter()
            .flat_map(|s| s.adj_in.iter())
            .filter_map(|(p, a)| {
                Some(Route {
                    prefix: *p,
                    source: Source::Peer(id),
                    attrs: self.interner.get(*a)?.clone(),
                })
            })
            .collect();
        v.sort_by_key(|r| r.prefix);
        v
    }

    /// How many prefixes a peer has sent us (before policy), in O(1).
    pub fn adj_in_len(&self, id: PeerId) -> usize {
        self.peers.get(&id).map_or(0, |s| s.adj_in.len())
    }

    /// (received, accepted, advertised) counts for a peer.
    pub fn counts(&self, id: PeerId) -> (u64, u64, u64) {
        self.peers.get(&id).map_or((0, 0, 0), |s| {
            let held = s.adj_in.len() as u64;
            let adv = s.adj_out.as_ref().map_or(0, |o| o.len() as u64);
            (held.saturating_add(s.rejected), s.accepted, adv)
        })
    }

    fn maybe_sweep(&mut self, changed: usize) {
        self.churn = self.churn.saturating_add(changed);
        if self.churn > 4096.max(self.interner.len()) {
            self.interner.sweep();
            self.churn = 0;
        }
    }

    /// Rerun the decision process for `prefixes`, whose candidate from `changed_by` (if
    /// given) was replaced or removed, and export the changes.
    fn recompute(
        &mut self,
        prefixes: &[P],
        changed_by: Option<BestCode>,
    ) -> HashMap<PeerId, OutUpdate<P>> {
        self.decide_and_export(prefixes, changed_by, ReExport::None, &[])
    }

    /// [`Rib::recompute`] after `from`'s UPDATE changed `prefixes`, with what the UPDATE
    /// told of each (`known`, one per prefix).
    #[inline]
    fn recompute_received(
        &mut self,
        from: PeerId,
        prefixes: &[P],
        known: &[Known],
    ) -> HashMap<PeerId, OutUpdate<P>> {
        debug_assert_eq!(prefixes.len(), known.len());
        self.decide_and_export(
            prefixes,
            Some(BestCode::of(Source::Peer(from))),
            ReExport::None,
            known,
        )
    }

    /// [`Rib::recompute`]; prefixes whose best route stayed are exported again as `reexport`
    /// says (policy changed). `known` is empty or says, per prefix, what the caller knows of
    /// `changed_by`'s route.
    fn decide_and_export(
        &mut self,
        prefixes: &[P],
        changed_by: Option<BestCode>,
        reexport: ReExport<'_, P>,
        known: &[Known],
    ) -> HashMap<PeerId, OutUpdate<P>> {
        let export_all = !matches!(reexport, ReExport::None);
        let mut changed: Vec<(P, Option<LocSlot>)> = Vec::with_capacity(prefixes.len());
        // Prefixes whose best stayed, exported again only to `ReExport::Scoped`'s peers.
        let mut for_some: Vec<(P, Option<LocSlot>)> = Vec::new();
        // Slots of prefixes that leave the Loc-RIB: free once every peer's bit is cleared.
        let mut freed = Vec::new();
        // Whether every change is between routes no iBGP peer is sent (see below).
        let mut ibgp_only = self.cluster_id.is_none() && !export_all;
        // Whether `changed_by` is iBGP-learned, asked once rather than per prefix: it is the
        // new best route of most prefixes an UPDATE changes.
        let changed_ibgp = self.ibgp_learned(changed_by);
        let ibgp_learned = |rib: &Self, code: Option<BestCode>| {
            if code.is_some() && code == changed_by {
                changed_ibgp
            } else {
                rib.ibgp_learned(code)
            }
        };
        for (i, p) in prefixes.iter().enumerate() {
            let old = self.loc.get(p).copied();
            let old_best = old.map(|e| e.best);
            // With no best route before, the one candidate that changed is the only one that
            // can be best now: the others, unchanged, were absent or ineligible (the Loc-RIB
            // follows them). A mesh node learns every prefix this way, and looking at every
            // peer for each was most of its decision process. Where the UPDATE that stored
            // the candidate already said whether it is usable, it is not looked up again.
            let best = match (old_best, changed_by.map(BestCode::source)) {
                (None, Some(Source::Peer(from))) => match known.get(i) {
                    Some(Known::Usable(usable)) => usable.then_some(Source::Peer(from)),
                    Some(Known::LookUp) | None => self.sole_candidate(p, from),
                },
                _ => self.decide(p),
            };
            debug_assert_eq!(best, self.decide(p), "the Loc-RIB was out of date for {p}");
            let best = best.map(BestCode::of);
            // The same source staying best is a change when that source's route is the one
            // that changed (`changed_by`): the Loc-RIB holds no copy to compare with.
            if best == old_best && (best.is_none() || best != changed_by) {
                match reexport {
                    ReExport::None => {}
                    ReExport::All => changed.push((*p, old.map(|e| e.slot))),
                    ReExport::Scoped { everyone, .. } if everyone.contains(p) => {
                        changed.push((*p, old.map(|e| e.slot)))
                    }
                    ReExport::Scoped { .. } => for_some.push((*p, old.map(|e| e.slot))),
                }
                continue;
            }
            ibgp_only = ibgp_only && ibgp_learned(self, old_best) && ibgp_learned(self, best);
            let slot = match (best, old) {
                (Some(best), Some(e)) => {
                    self.loc.insert(*p, LocEntry { best, slot: e.slot });
                    Some(e.slot)
                }
                (Some(best), None) => {
                    let slot = self.free_slots.pop().unwrap_or_else(|| {
                        self.next_slot += 1;
                        LocSlot(self.next_slot - 1)
                    });
                    self.loc.insert(*p, LocEntry { best, slot });
                    Some(slot)
                }
                (None, Some(e)) => {
                    self.loc.remove(p);
                    freed.push(e.slot);
                    Some(e.slot)
                }
                (None, None) => None,
            };
            if let Some(track) = self.loc_changes.as_mut() {
                track.push(*p);
            }
            changed.push((*p, slot));
        }
        let mut out = HashMap::new();
        if let ReExport::Scoped { peers, .. } = reexport
            && !for_some.is_empty()
        {
            // Their own filters (or the communities) changed: all they hold is looked at.
            let mut theirs = changed.clone();
            theirs.extend(for_some);
            for id in peers {
                self.export_to(*id, &theirs, &mut out);
            }
            for &(id, _) in self.established().iter() {
                if !peers.contains(&id) && !changed.is_empty() {
                    self.export_to(id, &changed, &mut out);
                }
            }
        } else if !changed.is_empty() {
            for &(id, ibgp) in self.established().iter() {
                // An iBGP peer's Adj-RIB-Out follows the Loc-RIB, and iBGP-learned routes are
                // not passed to iBGP peers unless reflected (RFC 4271 §9.2): when only such
                // routes changed, before and after, it holds none of them and gains none. In
                // a full mesh that is every change, and visiting each peer for it was most of
                // the mesh's CPU time.
                if ibgp_only && ibgp {
                    continue;
                }
                self.export_to(id, &changed, &mut out);
            }
        }
        // Most passes free nothing: no walk over the peers for them (this runs per UPDATE).
        if !freed.is_empty() {
            for adj in self.peers.values_mut().filter_map(|s| s.adj_out.as_mut()) {
                for &slot in &freed {
                    let was = adj.mark(slot, false);
                    debug_assert!(!was, "a withdrawal was not exported");
                }
            }
            self.free_slots.extend(freed);
        }
        out.retain(|_, u| !u.is_empty());
        out
    }

    /// Whether a Loc-RIB entry (`None`: no route) is one no iBGP peer is sent when this RIB
    /// does not reflect: none, or learned from an iBGP peer. A source no longer known (a
    /// peer just deleted) is not assumed to be.
    fn ibgp_learned(&self, code: Option<BestCode>) -> bool {
        match code.map(BestCode::source) {
            None => true,
            Some(Source::Local) => false,
            Some(Source::Peer(q)) => self
                .peers
                .get(&q)
                .is_some_and(|s| s.info.is_ibgp(self.local_as)),
        }
    }

    /// `from`'s route for `p`, if it has one that may be used.
    fn sole_candidate(&self, p: &P, from: PeerId) -> Option<Source> {
        let st = self.peers.get(&from)?;
        let a = self.interner.get(*st.adj_in.get(p)?)?;
        self.eligible(&st.info, p, a).then_some(Source::Peer(from))
    }

    /// The best candidate for a prefix (RFC 4271 §9.1.2).
    fn decide(&self, p: &P) -> Option<Source> {
        let mut best: Option<Candidate<'_>> = self.local.get(p).map(|a| Candidate {
            source: Source::Local,
            attrs: a,
            peer: None,
        });
        for (id, st) in &self.peers {
            let Some(a) = st.adj_in.get(p).and_then(|id| self.interner.get(*id)) else {
                continue;
            };
            if !self.eligible(&st.info, p, a) {
                continue;
            }
            let c = Candidate {
                source: Source::Peer(*id),
                attrs: a,
                peer: Some(&st.info),
            };
            best = match best {
                Some(b) if compare(&b, &c, self.local_as) != Ordering::Greater => Some(b),
                _ => Some(c),
            };
        }
        best.map(|c| c.source)
    }

    /// What `to` is sent for the best route `code` of `p`; `None`: nothing.
    fn exported(
        &self,
        to: &PeerInfo,
        p: &P,
        code: BestCode,
        memo: &mut ExportMemo,
    ) -> Option<Attrs> {
        // Never back to where it came from (export_attrs says so too; checked here first
        // because it is every prefix of a peer that is sending us a table).
        if code == BestCode::of(Source::Peer(to.id)) {
            return None;
        }
        // iBGP-learned to iBGP, not reflected: export_attrs would say no too; said here
        // before policy is evaluated, because in a full mesh it is what almost every
        // (peer, prefix) pair comes to.
        let split = match memo.last_split {
            Some((seen, split)) if seen == code => split,
            _ => {
                let split = self.split_horizon(to, code);
                memo.last_split = Some((code, split));
                split
            }
        };
        if split {
            return None;
        }
        let a = self.attrs_of(p, code)?;
        let src = code.source();
        let from = match src {
            Source::Local => None,
            Source::Peer(q) => self.peers.get(&q).map(|s| s.info),
        };
        let verdict = self.policy.export_verdict(
            &to.policy_ref(),
            p.any(),
            self.route_source(src),
            from.and_then(|f| f.options.interface),
        );
        if !verdict.accept {
            return None;
        }
        // Communities of the prefix's advertisements, unless the peer's own filter accepted
        // it (as Calico's filter `Accept` ends its export function before they are added).
        // Which advertisements apply depends on the prefix, so it is part of the memo's key.
        let adverts: Vec<_> =
            if self.policy.has_advertisements() && !matches!(verdict.by, Decider::Filter(_)) {
                self.policy.advertisements_for(p.any()).collect()
            } else {
                Vec::new()
            };
        // Pointers are stable: nothing is stored or dropped while a memo is in use (and an
        // empty list allocates nothing).
        let key = (
            Arc::as_ptr(a),
            code,
            adverts
                .iter()
                .map(|a| *a as *const Advertisement)
                .collect::<Vec<_>>(),
        );
        if let Some(w) = memo.attrs.get(&key) {
            return w.clone();
        }
        let w = export_attrs::<P>(self.local_as, self.cluster_id, to, src, from.as_ref(), a).map(
            |mut e| {
                for ad in &adverts {
                    for c in &ad.communities {
                        if !e.communities.contains(c) {
                            e.communities.push(*c);
                        }
                    }
                    for c in &ad.large_communities {
                        if !e.large_communities.contains(c) {
                            e.large_communities.push(*c);
                        }
                    }
                }
                Arc::new(e)
            },
        );
        memo.attrs.insert(key, w.clone());
        w
    }

    /// Tell `id` what changed for `changes`: the new best route as export gives it, or a
    /// withdrawal of what it was sent. Each change comes with, for a prefix that has just
    /// left the Loc-RIB, the slot it held (a prefix in the Loc-RIB has its slot there; a
    /// prefix that never had one was never sent).
    fn export_to(
        &mut self,
        id: PeerId,
        changes: &[(P, Option<LocSlot>)],
        out: &mut HashMap<PeerId, OutUpdate<P>>,
    ) {
        let Some(mut pass) = self.begin_export(id) else {
            return;
        };
        for &(p, left) in changes {
            pass.offer(self, p, self.loc.get(&p).copied(), left);
        }
        self.end_export(id, pass, out);
    }

    /// Takes `id`'s Adj-RIB-Out out for an export pass (one lookup, not one per prefix: this
    /// runs for every established peer on every change); [`Rib::end_export`] puts it back.
    fn begin_export(&mut self, id: PeerId) -> Option<ExportPass<P>> {
        let (info, adj) = self
            .peers
            .get_mut(&id)
            .and_then(|s| Some((s.info, s.adj_out.take()?)))?;
        Some(ExportPass {
            info,
            adj,
            update: OutUpdate::default(),
            groups: HashMap::default(),
            memo: ExportMemo::default(),
        })
    }

    /// Puts the pass's Adj-RIB-Out back and adds what it found to `out`, after what earlier
    /// passes found for the same peer.
    fn end_export(
        &mut self,
        id: PeerId,
        pass: ExportPass<P>,
        out: &mut HashMap<PeerId, OutUpdate<P>>,
    ) {
        let ExportPass { adj, update, .. } = pass;
        if let Some(st) = self.peers.get_mut(&id) {
            st.adj_out = Some(adj);
        }
        if !update.is_empty() {
            let slot = out.entry(id).or_default();
            if slot.is_empty() {
                *slot = update;
            } else {
                slot.withdraw.extend(update.withdraw);
                slot.announce.extend(update.announce);
            }
        }
    }
}

/// One peer's export pass: what it is sent, grouped by attributes as the prefixes are offered
/// (no list of changes in between: a full table to a fresh peer is the largest transient of
/// the speaker).
struct ExportPass<P> {
    info: PeerInfo,
    /// The peer's Adj-RIB-Out, taken out of its [`PeerState`] for the pass.
    adj: AdjOut,
    update: OutUpdate<P>,
    /// Index in `update.announce` of each attribute set's group.
    groups: HashMap<*const PathAttributes, usize>,
    memo: ExportMemo,
}

impl<P: RibPrefix> ExportPass<P> {
    /// `p` changed: its Loc-RIB `entry` now, or the `left` slot it held until this change.
    fn offer(&mut self, rib: &Rib<P>, p: P, entry: Option<LocEntry>, left: Option<LocSlot>) {
        // Never in the Loc-RIB: never sent, nothing to send.
        let Some(slot) = entry.map(|e| e.slot).or(left) else {
            return;
        };
        let want = entry.and_then(|e| rib.exported(&self.info, &p, e.best, &mut self.memo));
        let Some(w) = want else {
            if self.adj.mark(slot, false) {
                self.update.withdraw.push(p);
            }
            return;
        };
        self.adj.mark(slot, true);
        let k = Arc::as_ptr(&w);
        match self.groups.get(&k) {
            Some(&i) => {
                if let Some(group) = self.update.announce.get_mut(i) {
                    group.1.push(p);
                }
            }
            None => {
                self.groups.insert(k, self.update.announce.len());
                self.update.announce.push((w, vec![p]));
            }
        }
    }

    /// Prefix order for a fresh peer's table (announcements only: it was sent nothing to
    /// withdraw): each group's prefixes, and the groups by their first prefix (what the peer
    /// receives first does not depend on hashing).
    fn sort(&mut self) {
        for (_, prefixes) in &mut self.update.announce {
            prefixes.sort_unstable();
        }
        self.update
            .announce
            .sort_unstable_by_key(|(_, prefixes)| prefixes.first().copied());
        self.groups.clear(); // its indices no longer match
    }
}

struct Candidate<'a> {
    source: Source,
    attrs: &'a Attrs,
    peer: Option<&'a PeerInfo>,
}

fn local_pref(a: &PathAttributes) -> u32 {
    a.local_pref.unwrap_or(DEFAULT_LOCAL_PREF)
}

/// `Less` means `a` is better. RFC 4271 §9.1.2.2, with locally originated routes first
/// (as every implementation's "weight" does).
fn compare(a: &Candidate<'_>, b: &Candidate<'_>, local_as: Asn) -> Ordering {
    let (x, y) = (a.attrs.as_ref(), b.attrs.as_ref());
    let local = |c: &Candidate<'_>| c.source != Source::Local;
    local(a)
        .cmp(&local(b))
        .then_with(|| local_pref(y).cmp(&local_pref(x)))
        .then_with(|| path_len(x).cmp(&path_len(y)))
        .then_with(|| origin(x).cmp(&origin(y)))
        .then_with(|| {
            // MED only between routes from the same neighbouring AS; missing MED is 0.
            let nx = x.as_path.as_ref().and_then(AsPath::first_asn);
            let ny = y.as_path.as_ref().and_then(AsPath::first_asn);
            if nx == ny {
                x.med.unwrap_or(0).cmp(&y.med.unwrap_or(0))
            } else {
                Ordering::Equal
            }
        })
        .then_with(|| {
            // eBGP over iBGP.
            let ibgp = |c: &Candidate<'_>| c.peer.is_some_and(|p| p.is_ibgp(local_as));
            ibgp(a).cmp(&ibgp(b))
        })
        .then_with(|| {
            // Lowest router id (ORIGINATOR_ID when reflected, RFC 4456 §9), then address.
            let rid = |c: &Candidate<'_>| {
                c.attrs
                    .originator_id
                    .or(c.peer.map(|p| p.router_id))
                    .map_or(0, u32::from)
            };
            rid(a).cmp(&rid(b))
        })
        // Shorter CLUSTER_LIST (RFC 4456 §9).
        .then_with(|| x.cluster_list.len().cmp(&y.cluster_list.len()))
        .then_with(|| {
            let addr = |c: &Candidate<'_>| c.peer.map(|p| p.address);
            addr(a).cmp(&addr(b))
        })
}

fn path_len(a: &PathAttributes) -> usize {
    a.as_path.as_ref().map_or(0, AsPath::path_len)
}

fn origin(a: &PathAttributes) -> Origin {
    a.origin.unwrap_or(Origin::Incomplete)
}

/// The attributes `to` must see for the best route from `src` (None: do not advertise).
fn export_attrs<P: RibPrefix>(
    local_as: Asn,
    cluster_id: Option<Ipv4Addr>,
    to: &PeerInfo,
    src: Source,
    from: Option<&PeerInfo>,
    a: &PathAttributes,
) -> Option<PathAttributes> {
    let session_as = to.local_as(local_as);
    let to_ebgp = to.asn != session_as;
    // A session that cannot carry this family's routes is never asked; without a next hop
    // of ours for it, there is nothing we could say.
    let own = P::self_next_hop(to)?;
    // Set when an iBGP-learned route goes to an iBGP peer: only by reflection.
    let mut reflect = None;
    if let Source::Peer(q) = src {
        // Never back to where it came from.
        if q == to.id {
            return None;
        }
        if let Some(f) = from.filter(|f| !to_ebgp && f.is_ibgp(local_as)) {
            // iBGP to iBGP: only a reflector passes it on, from a client to everyone, from
            // a non-client to clients (RFC 4456 §6).
            let c = cluster_id?;
            if !(f.rr_client || to.rr_client) {
                return None;
            }
            reflect = Some((c, f.router_id));
        }
    }
    if a.communities.contains(&Community::NO_ADVERTISE)
        || (to_ebgp && a.communities.contains(&Community::NO_EXPORT))
    {
        return None;
    }
    let mut e = a.clone();
    if e.origin.is_none() {
        e.origin = Some(Origin::Igp);
    }
    let mut path = e.as_path.take().unwrap_or_default();
    if to_ebgp {
        // Sender-side loop avoidance: the peer would reject it anyway.
        if path.contains(to.asn) {
            return None;
        }
        path.prepend(session_as);
        // `next hop keep` (Calico's keepOriginalNextHop) leaves a learned route's next hop
        // as it is where the peer can use it; otherwise eBGP peers get ours.
        let keep = to.options.next_hop == NextHopMode::Keep
            && src != Source::Local
            && next_hop_of(&e).is_some_and(|nh| P::carries(to, &nh) && !link_local_only(&nh));
        if !keep {
            set_next_hop(&mut e, own);
        }
        e.local_pref = None;
        // MED is not passed on to another AS (RFC 4271 §5.1.4); our own is.
        if src != Source::Local {
            e.med = None;
        }
        e.originator_id = None;
        e.cluster_list.clear();
    } else {
        e.local_pref = Some(local_pref(a));
        if let Some((cluster, originator)) = reflect {
            e.originator_id.get_or_insert(originator);
            e.cluster_list.insert(0, cluster);
        }
    }
    e.as_path = Some(path);
    if to.options.next_hop == NextHopMode::SelfNextHop {
        set_next_hop(&mut e, own);
        return Some(e);
    }
    match next_hop_of(&e) {
        // Next-hop-self for what we originate unless the announcement named one, and for
        // what the peer could not use as it is.
        Some(nh) if P::carries(to, &nh) && !link_local_only(&nh) => {
            if let NextHop::V6 {
                global,
                link_local: Some(_),
            } = nh
                && nh != own
            {
                // A link-local next hop means something only on its own link (RFC 2545).
                set_next_hop(
                    &mut e,
                    NextHop::V6 {
                        global,
                        link_local: None,
                    },
                );
            }
        }
        // An IPv4 route via an IPv6 next hop, to an iBGP peer that takes no IPv6 next hops:
        // we would attract traffic we cannot forward (the kernel table is IPv4-via-IPv4), so
        // it is not advertised, as BIRD and FRR drop next hops they cannot resolve.
        Some(nh) if src != Source::Local && !link_local_only(&nh) => return None,
        // A link-local next hop alone (an unnumbered peer) means nothing off its link: ours,
        // as FRR does.
        _ => set_next_hop(&mut e, own),
    }
    Some(e)
}

/// Group changes by attributes (pointer identity: they are interned).
fn group<P>(changes: impl Iterator<Item = (P, Option<Attrs>)>) -> OutUpdate<P> {
    let mut u = OutUpdate::default();
    let mut index: HashMap<*const PathAttributes, usize> = HashMap::new();
    for (p, a) in changes {
        match a {
            None => u.withdraw.push(p),
            Some(a) => {
                let k = Arc::as_ptr(&a);
                match index.get(&k) {
                    Some(&i) => {
                        if let Some(slot) = u.announce.get_mut(i) {
                            slot.1.push(p);
                        }
                    }
                    None => {
                        index.insert(k, u.announce.len());
                        u.announce.push((a, vec![p]));
                    }
                }
            }
        }
    }
    u
}

#[cfg(test)]
mod tests;

/// Per-peer filters, advertised communities and session options through the RIB.
#[cfg(test)]
mod peer_policy_tests;
