//! The speaker task's answers: the peers' status, the tables (Loc-RIB, a peer's Adj-RIB-In
//! and Adj-RIB-Out, both families), and which filter rule decides a prefix on a peer's
//! session. Read only: nothing here changes a RIB.

use std::net::IpAddr;

use bgp::rib::{PeerId, Rib, RibPrefix, Route, Source};
use bgp_wire::Prefix;

use super::{FilterDecision, ListedRoute, PeerSpec, PeerStatus, Speaker, SpeakerError, Table};

impl Speaker {
    /// Every peer as operators see it, its route counts over both families.
    pub(super) fn peer_statuses(&self) -> Vec<PeerStatus> {
        self.peers
            .values()
            .map(|p| {
                let (r4, a4, o4) = self.rib.counts(p.id);
                let (r6, a6, o6) = self.rib6.counts(p.id);
                let (received, accepted, advertised) = (r4 + r6, a4 + a6, o4 + o6);
                PeerStatus {
                    spec: p.spec.clone(),
                    state: p.state,
                    since: p.since,
                    last_error: p.last_error.clone(),
                    remote_id: p.remote_id,
                    received,
                    accepted,
                    advertised,
                    malformed: p.malformed,
                    bfd: p.spec.bfd.map(|_| p.bfd_state),
                }
            })
            .collect()
    }

    pub(super) fn explain(
        &self,
        peer: IpAddr,
        prefix: Option<Prefix>,
    ) -> Result<Vec<FilterDecision>, SpeakerError> {
        let p = self
            .peers
            .get(&peer)
            .ok_or_else(|| SpeakerError::NoPeer(peer.to_string()))?;
        let mut out = explain_family(&self.rib, p.id, &p.spec, prefix);
        out.extend(explain_family(&self.rib6, p.id, &p.spec, prefix));
        Ok(out)
    }

    pub(super) fn list(
        &self,
        table: Table,
        peer: Option<IpAddr>,
    ) -> Result<Vec<ListedRoute>, SpeakerError> {
        let peer_id = match (table, peer) {
            (Table::Loc, _) => None,
            (_, Some(a)) => Some(
                self.peers
                    .get(&a)
                    .map(|p| p.id)
                    .ok_or_else(|| SpeakerError::NoPeer(a.to_string()))?,
            ),
            (_, None) => return Err(SpeakerError::NoPeer("(none given)".into())),
        };
        let mut routes = self.list_family(&self.rib, table, peer_id);
        routes.extend(self.list_family(&self.rib6, table, peer_id));
        Ok(routes)
    }

    /// One family's part of a listing.
    fn list_family<P: RibPrefix>(
        &self,
        rib: &Rib<P>,
        table: Table,
        peer_id: Option<PeerId>,
    ) -> Vec<ListedRoute> {
        let addr_of = |id: PeerId| self.by_id.get(&id).copied();
        let any = |r: Route<P>| Route {
            prefix: r.prefix.any(),
            source: r.source,
            attrs: r.attrs,
        };
        match (table, peer_id) {
            (Table::Loc, _) | (_, None) => rib
                .loc_rib()
                .map(|r| {
                    let (from_peer, stale) = match r.source {
                        Source::Peer(id) => (addr_of(id), rib.is_stale(id, &r.prefix)),
                        Source::Local => (None, false),
                    };
                    ListedRoute {
                        route: any(r),
                        from_peer,
                        best: true,
                        stale,
                    }
                })
                .collect(),
            (Table::AdjIn, Some(id)) => rib
                .adj_in(id)
                .into_iter()
                .map(|r| {
                    let best = rib.best(&r.prefix).is_some_and(|(s, _)| s == r.source);
                    let stale = rib.is_stale(id, &r.prefix);
                    ListedRoute {
                        route: any(r),
                        from_peer: addr_of(id),
                        best,
                        stale,
                    }
                })
                .collect(),
            (Table::AdjOut, Some(id)) => rib
                .adj_out(id)
                .into_iter()
                .map(|r| ListedRoute {
                    route: any(r),
                    from_peer: None,
                    best: true,
                    stale: false,
                })
                .collect(),
        }
    }
}

/// One family's part of [`Speaker::explain`]: every prefix `id` sent us and every
/// Loc-RIB prefix (or only `only`, if of this family), with the deciding rule.
fn explain_family<P: RibPrefix>(
    rib: &Rib<P>,
    id: PeerId,
    spec: &PeerSpec,
    only: Option<Prefix>,
) -> Vec<FilterDecision> {
    let peer = rib.peer_ref(id).unwrap_or(bgp::policy::PeerRef {
        class: spec.class,
        address: spec.address,
        interface: None,
    });
    let (imports, exports): (Vec<P>, Vec<P>) = match only {
        Some(want) => match P::from_any(want) {
            Some(p) => (vec![p], vec![p]),
            None => return Vec::new(),
        },
        None => (
            rib.adj_in(id).into_iter().map(|r| r.prefix).collect(),
            rib.loc_rib().map(|r| r.prefix).collect(),
        ),
    };
    let decision = |p: P, import: bool, v: bgp::policy::Verdict<'_>| {
        let (rule, reason) = v.describe();
        FilterDecision {
            prefix: p.any(),
            import,
            accept: v.accept,
            rule,
            reason,
        }
    };
    let mut out: Vec<FilterDecision> = imports
        .into_iter()
        .map(|p| decision(p, true, rib.explain_import(&peer, &p)))
        .collect();
    out.extend(exports.into_iter().map(|p| {
        let mut d = decision(p, false, rib.explain_export(&peer, &p));
        if rib.best(&p).is_none() {
            d.reason
                .push_str(" (no route for it here: judged as one originated here)");
        }
        d
    }));
    out
}
