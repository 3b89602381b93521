//! The RIBs: Adj-RIB-In per peer, the Loc-RIB with the RFC 4271 §9.1 decision process, and
//! Adj-RIB-Out per established peer, for IPv4 unicast.
//!
//! **Job.** Take routes learned from peers and routes we originate; choose one best route
//! per prefix; compute, per peer, what it must be told (iBGP/eBGP rules, next-hop-self,
//! AS prepend, no LOCAL_PREF to eBGP) and return only the differences.
//!
//! **Boundaries.** Sans-IO and single-owner: one task (the speaker) owns a [`Rib`] and calls
//! it; nothing here locks or awaits. Packing the returned [`OutUpdate`]s into messages is
//! the session's job (`bgp_wire::pack`).
//!
//! **Policy.** Adj-RIB-In keeps what peers sent, before policy, so a new [`Policy`] (pools
//! changed) is applied without asking peers again: import rules are evaluated when the
//! decision process looks at a candidate, export rules when Adj-RIB-Out is computed.
//!
//! **Route reflection (RFC 4456).** With a cluster id this RIB reflects: routes from clients
//! go to every iBGP peer, routes from non-clients to clients only; ORIGINATOR_ID and
//! CLUSTER_LIST are set on the way out and checked on the way in.
//!
//! **Memory.** Path attributes are interned: one `Arc` per distinct [`PathAttributes`], shared
//! by every route that carries them (BIRD's attribute cache). Routes hold only the `Arc`,
//! so equality of attributes is pointer equality.

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use bgp_wire::{AsPath, Asn, Community, Ipv4Prefix, Origin, PathAttributes};

use super::policy::{PeerClass, Policy, RouteSource};

/// A peer's identity inside the speaker (stable while the peer is configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// Interned attributes.
pub type Attrs = Arc<PathAttributes>;

/// LOCAL_PREF assumed when a route has none (RFC 4271 leaves it to the operator; all of
/// BIRD, FRR and GoBGP use 100).
pub const DEFAULT_LOCAL_PREF: u32 = 100;

/// What the RIB must know of an established peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    pub id: PeerId,
    pub address: Ipv4Addr,
    pub asn: Asn,
    pub router_id: Ipv4Addr,
    /// Our address on the session: the next hop we advertise for what we originate (and on
    /// eBGP, for everything).
    pub local_address: Ipv4Addr,
    /// Which policy rules apply to the peer.
    pub class: PeerClass,
    /// A route-reflector client of ours (meaningful only when we have a cluster id).
    pub rr_client: bool,
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
pub struct Route {
    pub prefix: Ipv4Prefix,
    pub source: Source,
    pub attrs: Attrs,
}

/// What one peer must be sent: announcements grouped by (interned) attributes, withdrawals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutUpdate {
    pub announce: Vec<(Attrs, Vec<Ipv4Prefix>)>,
    pub withdraw: Vec<Ipv4Prefix>,
}

impl OutUpdate {
    pub fn is_empty(&self) -> bool {
        self.announce.is_empty() && self.withdraw.is_empty()
    }
    pub fn announced(&self) -> usize {
        self.announce.iter().map(|(_, p)| p.len()).sum()
    }
}

/// Attribute interner: one shared copy per distinct attribute set.
#[derive(Debug, Default)]
pub struct Interner {
    set: HashSet<Attrs>,
}

impl Interner {
    pub fn intern(&mut self, attrs: PathAttributes) -> Attrs {
        if let Some(a) = self.set.get(&attrs) {
            return a.clone();
        }
        let a = Arc::new(attrs);
        self.set.insert(a.clone());
        a
    }

    /// Drop sets no route uses any more.
    pub fn sweep(&mut self) {
        self.set.retain(|a| Arc::strong_count(a) > 1);
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[derive(Debug)]
struct PeerState {
    info: PeerInfo,
    adj_in: HashMap<Ipv4Prefix, Attrs>,
    /// Present only while the session is established.
    adj_out: Option<HashMap<Ipv4Prefix, Attrs>>,
    /// Routes received but rejected by import rules (AS loop).
    rejected: u64,
}

/// The three tables of one speaker.
#[derive(Debug)]
pub struct Rib {
    local_as: Asn,
    router_id: Ipv4Addr,
    interner: Interner,
    local: HashMap<Ipv4Prefix, Attrs>,
    peers: BTreeMap<PeerId, PeerState>,
    loc: BTreeMap<Ipv4Prefix, (Source, Attrs)>,
    /// Changes since the last sweep; the interner is swept after many.
    churn: usize,
    policy: Arc<Policy>,
    /// Set: we are a route reflector with this cluster id.
    cluster_id: Option<Ipv4Addr>,
    /// Prefixes whose best route changed, when someone drains them (`track_loc_changes`).
    loc_changes: Option<Vec<Ipv4Prefix>>,
}

impl Rib {
    pub fn new(local_as: Asn, router_id: Ipv4Addr) -> Self {
        Rib {
            local_as,
            router_id,
            interner: Interner::default(),
            local: HashMap::new(),
            peers: BTreeMap::new(),
            loc: BTreeMap::new(),
            churn: 0,
            policy: Arc::new(Policy::accept_all()),
            cluster_id: None,
            loc_changes: None,
        }
    }

    /// Record Loc-RIB changes for [`Rib::take_loc_changes`] from now on.
    pub fn track_loc_changes(&mut self) {
        self.loc_changes.get_or_insert_with(Vec::new);
    }

    /// The prefixes whose best route changed since the last call (tracking must be on).
    pub fn take_loc_changes(&mut self) -> Vec<Ipv4Prefix> {
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
    ) -> HashMap<PeerId, OutUpdate> {
        if *policy == *self.policy && cluster_id == self.cluster_id {
            return HashMap::new();
        }
        self.policy = policy;
        self.cluster_id = cluster_id;
        let mut all: Vec<Ipv4Prefix> = self.loc.keys().copied().collect();
        all.extend(self.local.keys().copied());
        for st in self.peers.values() {
            all.extend(st.adj_in.keys().copied());
        }
        all.sort_unstable();
        all.dedup();
        self.recompute(&all);
        // Export decisions may change for routes whose best did not.
        let mut out = HashMap::new();
        let ids: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, s)| s.adj_out.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.export_to(id, &all, &mut out);
        }
        out.retain(|_, u: &mut OutUpdate| !u.is_empty());
        out
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
    fn eligible(&self, info: &PeerInfo, prefix: &Ipv4Prefix, a: &PathAttributes) -> bool {
        if info.asn == self.local_as {
            if a.originator_id == Some(self.router_id) {
                return false;
            }
            if let Some(c) = self.cluster_id
                && a.cluster_list.contains(&c)
            {
                return false;
            }
        }
        self.policy.import(info.class, prefix)
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
    pub fn peer_up(&mut self, info: PeerInfo) -> OutUpdate {
        let st = self.peers.entry(info.id).or_insert_with(|| PeerState {
            info,
            adj_in: HashMap::new(),
            adj_out: None,
            rejected: 0,
        });
        st.info = info;
        st.adj_out = Some(HashMap::new());
        let prefixes: Vec<Ipv4Prefix> = self.loc.keys().copied().collect();
        let mut out = HashMap::new();
        self.export_to(info.id, &prefixes, &mut out);
        out.remove(&info.id).unwrap_or_default()
    }

    /// A session went down (or the peer was deleted): its routes leave every table.
    pub fn peer_down(&mut self, id: PeerId) -> HashMap<PeerId, OutUpdate> {
        let Some(st) = self.peers.remove(&id) else {
            return HashMap::new();
        };
        let prefixes: Vec<Ipv4Prefix> = st.adj_in.into_keys().collect();
        let out = self.recompute(&prefixes);
        self.maybe_sweep(prefixes.len());
        out
    }

    /// Routes from a peer's UPDATE: `announced` with `attrs`, and `withdrawn`.
    pub fn update(
        &mut self,
        from: PeerId,
        attrs: Option<PathAttributes>,
        announced: &[Ipv4Prefix],
        withdrawn: &[Ipv4Prefix],
    ) -> HashMap<PeerId, OutUpdate> {
        let local_as = self.local_as;
        let Some(st) = self.peers.get_mut(&from) else {
            return HashMap::new();
        };
        let external = st.info.asn != local_as;
        let mut touched: Vec<Ipv4Prefix> = Vec::with_capacity(announced.len() + withdrawn.len());
        for p in withdrawn {
            if st.adj_in.remove(p).is_some() {
                touched.push(*p);
            }
        }
        if let Some(attrs) = attrs.filter(|_| !announced.is_empty()) {
            // eBGP loop rejection (RFC 4271 §9.1.2): our AS in the path means it went round.
            let looped = external && attrs.as_path.as_ref().is_some_and(|p| p.contains(local_as));
            if looped {
                st.rejected = st.rejected.saturating_add(announced.len() as u64);
                for p in announced {
                    if st.adj_in.remove(p).is_some() {
                        touched.push(*p);
                    }
                }
            } else {
                let a = self.interner.intern(attrs);
                for p in announced {
                    st.adj_in.insert(*p, a.clone());
                    touched.push(*p);
                }
            }
        }
        let out = self.recompute(&touched);
        self.maybe_sweep(touched.len());
        out
    }

    /// Originate `prefix` with `attrs` (next hop and AS path are set per peer on export).
    pub fn announce(
        &mut self,
        prefix: Ipv4Prefix,
        attrs: PathAttributes,
    ) -> HashMap<PeerId, OutUpdate> {
        let a = self.interner.intern(attrs);
        self.local.insert(prefix, a);
        self.recompute(&[prefix])
    }

    /// Stop originating `prefix`; `None` if we did not.
    pub fn withdraw(&mut self, prefix: Ipv4Prefix) -> Option<HashMap<PeerId, OutUpdate>> {
        self.local.remove(&prefix)?;
        let out = self.recompute(&[prefix]);
        self.maybe_sweep(1);
        Some(out)
    }

    /// Everything advertised to a peer, again (ROUTE-REFRESH from it).
    pub fn refresh(&self, id: PeerId) -> OutUpdate {
        let Some(out) = self.peers.get(&id).and_then(|s| s.adj_out.as_ref()) else {
            return OutUpdate::default();
        };
        group(out.iter().map(|(p, a)| (*p, Some(a.clone()))))
    }

    pub fn loc_rib(&self) -> impl Iterator<Item = Route> + '_ {
        self.loc.iter().map(|(p, (s, a))| Route {
            prefix: *p,
            source: *s,
            attrs: a.clone(),
        })
    }

    /// What this node originates.
    pub fn local_routes(&self) -> Vec<(Ipv4Prefix, PathAttributes)> {
        self.local
            .iter()
            .map(|(p, a)| (*p, PathAttributes::clone(a)))
            .collect()
    }

    pub fn loc_len(&self) -> usize {
        self.loc.len()
    }

    /// The best route for a prefix.
    pub fn best(&self, prefix: &Ipv4Prefix) -> Option<(Source, &Attrs)> {
        self.loc.get(prefix).map(|(s, a)| (*s, a))
    }

    pub fn adj_in(&self, id: PeerId) -> Vec<Route> {
        self.table(id, |s| Some(&s.adj_in))
    }

    pub fn adj_out(&self, id: PeerId) -> Vec<Route> {
        self.table(id, |s| s.adj_out.as_ref())
    }

    fn table(
        &self,
        id: PeerId,
        pick: impl Fn(&PeerState) -> Option<&HashMap<Ipv4Prefix, Attrs>>,
    ) -> Vec<Route> {
        let mut v: Vec<Route> = self
            .peers
            .get(&id)
            .and_then(pick)
            .into_iter()
            .flatten()
            .map(|(p, a)| Route {
                prefix: *p,
                source: Source::Peer(id),
                attrs: a.clone(),
            })
            .collect();
        v.sort_by_key(|r| r.prefix);
        v
    }

    /// (received, accepted, advertised) counts for a peer.
    pub fn counts(&self, id: PeerId) -> (u64, u64, u64) {
        self.peers.get(&id).map_or((0, 0, 0), |s| {
            let held = s.adj_in.len() as u64;
            let acc = s
                .adj_in
                .iter()
                .filter(|(p, a)| self.eligible(&s.info, p, a))
                .count() as u64;
            let adv = s.adj_out.as_ref().map_or(0, |o| o.len() as u64);
            (held.saturating_add(s.rejected), acc, adv)
        })
    }

    fn maybe_sweep(&mut self, changed: usize) {
        self.churn = self.churn.saturating_add(changed);
        if self.churn > 4096.max(self.interner.len()) {
            self.interner.sweep();
            self.churn = 0;
        }
    }

    /// Rerun the decision process for `prefixes` and export the changes.
    fn recompute(&mut self, prefixes: &[Ipv4Prefix]) -> HashMap<PeerId, OutUpdate> {
        let mut changed = Vec::with_capacity(prefixes.len());
        for p in prefixes {
            let best = self.decide(p);
            let old = self.loc.get(p);
            let same = match (&best, old) {
                (Some((s, a)), Some((os, oa))) => s == os && Arc::ptr_eq(a, oa),
                (None, None) => true,
                _ => false,
            };
            if same {
                continue;
            }
            match best {
                Some(b) => self.loc.insert(*p, b),
                None => self.loc.remove(p),
            };
            if let Some(track) = self.loc_changes.as_mut() {
                track.push(*p);
            }
            changed.push(*p);
        }
        let mut out = HashMap::new();
        if changed.is_empty() {
            return out;
        }
        let ids: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, s)| s.adj_out.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.export_to(id, &changed, &mut out);
        }
        out.retain(|_, u| !u.is_empty());
        out
    }

    /// The best candidate for a prefix (RFC 4271 §9.1.2).
    fn decide(&self, p: &Ipv4Prefix) -> Option<(Source, Attrs)> {
        let mut best: Option<Candidate<'_>> = self.local.get(p).map(|a| Candidate {
            source: Source::Local,
            attrs: a,
            peer: None,
        });
        for (id, st) in &self.peers {
            let Some(a) = st.adj_in.get(p) else { continue };
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
        best.map(|c| (c.source, c.attrs.clone()))
    }

    /// Bring `id`'s Adj-RIB-Out in line with the Loc-RIB for `prefixes`.
    fn export_to(
        &mut self,
        id: PeerId,
        prefixes: &[Ipv4Prefix],
        out: &mut HashMap<PeerId, OutUpdate>,
    ) {
        let Some(info) = self.peers.get(&id).map(|s| s.info) else {
            return;
        };
        let mut changes = Vec::new();
        for p in prefixes {
            let want = self.loc.get(p).and_then(|(src, a)| {
                let from = match src {
                    Source::Local => None,
                    Source::Peer(q) => self.peers.get(q).map(|s| s.info),
                };
                if !self.policy.export(info.class, p, self.route_source(*src)) {
                    return None;
                }
                export_attrs(
                    self.local_as,
                    self.cluster_id,
                    &info,
                    *src,
                    from.as_ref(),
                    a,
                )
            });
            let want = want.map(|w| self.interner.intern(w));
            let Some(adj) = self.peers.get_mut(&id).and_then(|s| s.adj_out.as_mut()) else {
                return;
            };
            match (want, adj.entry(*p)) {
                (Some(w), Entry::Occupied(mut e)) => {
                    if !Arc::ptr_eq(e.get(), &w) {
                        e.insert(w.clone());
                        changes.push((*p, Some(w)));
                    }
                }
                (Some(w), Entry::Vacant(e)) => {
                    e.insert(w.clone());
                    changes.push((*p, Some(w)));
                }
                (None, Entry::Occupied(e)) => {
                    e.remove();
                    changes.push((*p, None));
                }
                (None, Entry::Vacant(_)) => {}
            }
        }
        if !changes.is_empty() {
            let u = group(changes.into_iter());
            let slot = out.entry(id).or_default();
            slot.withdraw.extend(u.withdraw);
            slot.announce.extend(u.announce);
        }
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
            let ibgp = |c: &Candidate<'_>| c.peer.is_some_and(|p| p.asn == local_as);
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
            let addr = |c: &Candidate<'_>| c.peer.map_or(0, |p| u32::from(p.address));
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
fn export_attrs(
    local_as: Asn,
    cluster_id: Option<Ipv4Addr>,
    to: &PeerInfo,
    src: Source,
    from: Option<&PeerInfo>,
    a: &PathAttributes,
) -> Option<PathAttributes> {
    let to_ebgp = to.asn != local_as;
    // Set when an iBGP-learned route goes to an iBGP peer: only by reflection.
    let mut reflect = None;
    if let Source::Peer(q) = src {
        // Never back to where it came from.
        if q == to.id {
            return None;
        }
        if let Some(f) = from.filter(|f| !to_ebgp && f.asn == local_as) {
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
        path.prepend(local_as);
        e.next_hop = Some(to.local_address);
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
        if src == Source::Local {
            // Next-hop-self for what we originate unless the announcement named one.
            if e.next_hop.is_none() {
                e.next_hop = Some(to.local_address);
            }
        }
    }
    e.as_path = Some(path);
    if e.next_hop.is_none() {
        e.next_hop = Some(to.local_address);
    }
    Some(e)
}

/// Group changes by attributes (pointer identity: they are interned).
fn group(changes: impl Iterator<Item = (Ipv4Prefix, Option<Attrs>)>) -> OutUpdate {
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
