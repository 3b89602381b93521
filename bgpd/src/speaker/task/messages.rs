//! What the sessions report to the speaker task (`FromSession`), and what each does: a state
//! change is recorded; Established puts the peer in the RIBs of its families, sends it our
//! routes and settles the routes kept through its restart; an UPDATE goes into the RIBs
//! (RFC 7606 dispositions applied, each family with its own next hop); Down, End-of-RIB
//! and the enhanced route refresh markers end or sweep what the peer held.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::SystemTime;

use bgp::fsm::State;
use bgp::policy::IfName;
use bgp::rib::{PeerId, PeerInfo, PeerOptions, RibPrefix};
use bgp_wire::{
    Disposition, Family, Ipv4Prefix, Ipv6Prefix, NextHop, PathAttributes, Prefix, UpdateDecode,
};

use super::{Families, FromSession, Speaker, ToSession};
use crate::speaker::iface;

/// What a session coming up leaves to do about the routes kept from the peer's last one.
struct KeptRoutes {
    addr: IpAddr,
    /// The peer's `gr_token` when it came up: a timer set now is moot once it changes.
    token: u64,
    /// How long stale routes wait for the peer's End-of-RIB, seconds.
    stale_time: u16,
    /// Families whose stale routes wait for it (the others go at once).
    wait: Families,
}

/// What an UPDATE does to the RIBs, by family.
struct RibChanges {
    announced: Announced,
    withdrawn: Vec<Ipv4Prefix>,
    withdrawn6: Vec<Ipv6Prefix>,
}

impl Speaker {
    pub(super) fn session_message(&mut self, m: FromSession) {
        match m {
            FromSession::State {
                id,
                state,
                since,
                last_error,
            } => self.session_state(id, state, since, last_error),
            FromSession::Up {
                id,
                epoch,
                remote_id,
                local_address,
                families,
                peer_ext_next_hop,
                peer_restart_time,
                peer_gr_families,
            } => {
                let Some(kept) = self.record_up(
                    id,
                    epoch,
                    remote_id,
                    families,
                    peer_restart_time,
                    &peer_gr_families,
                ) else {
                    return;
                };
                let Some(info) =
                    self.peer_info(id, remote_id, local_address, families, peer_ext_next_hop)
                else {
                    return;
                };
                self.send_initial_routes(info, epoch, families);
                self.settle_kept_routes(id, kept);
            }
            FromSession::Down {
                id,
                epoch,
                graceful,
            } => self.session_down(id, epoch, graceful),
            FromSession::RefreshMarker {
                id,
                epoch,
                family,
                begin,
            } => self.refresh_marker(id, epoch, family, begin),
            FromSession::MalformedReset { id } => {
                if let Some(p) = self.entry(id) {
                    p.malformed.session_reset = p.malformed.session_reset.saturating_add(1);
                }
            }
            FromSession::EndOfRib { id, epoch, family } => self.end_of_rib(id, epoch, family),
            FromSession::Update { id, epoch, update } => {
                if let Some(changes) = self.read_update(id, epoch, *update) {
                    self.apply_update(id, changes);
                    self.check_prefix_limit(id);
                }
            }
            FromSession::Refresh { id, epoch, family } => {
                let Some(p) = self.by_id.get(&id).and_then(|a| self.peers.get(a)) else {
                    return;
                };
                if p.epoch == Some(epoch) {
                    self.send_refresh(p, epoch, family);
                }
            }
        }
    }

    fn session_state(
        &mut self,
        id: PeerId,
        state: State,
        since: SystemTime,
        last_error: Option<String>,
    ) {
        if let Some(p) = self.entry(id) {
            p.state = state;
            p.since = since;
            if last_error.is_some() {
                p.last_error = last_error;
            }
        }
    }

    /// Established: the peer's entry records the period (`epoch`), its families and what
    /// its graceful restart covers.
    fn record_up(
        &mut self,
        id: PeerId,
        epoch: u64,
        remote_id: Ipv4Addr,
        families: Families,
        peer_restart_time: Option<u16>,
        peer_gr_families: &[(Family, bool)],
    ) -> Option<KeptRoutes> {
        let p = self.entry(id)?;
        p.epoch = Some(epoch);
        p.up = families;
        let Families { ipv4, ipv6 } = families;
        // Families whose stale routes may wait for End-of-RIB: in the restarted peer's
        // capability with forwarding preserved (RFC 4724 §4.2).
        let preserved =
            |f: Family| peer_restart_time.is_some() && peer_gr_families.contains(&(f, true));
        let wait = Families {
            ipv4: ipv4 && preserved(Family::IPV4_UNICAST),
            ipv6: ipv6 && preserved(Family::IPV6_UNICAST),
        };
        let gr = |f: Family| peer_gr_families.iter().any(|(g, _)| *g == f);
        p.gr_families = Families {
            ipv4: gr(Family::IPV4_UNICAST),
            ipv6: gr(Family::IPV6_UNICAST),
        };
        p.remote_id = Some(remote_id);
        p.gr_token = p.gr_token.wrapping_add(1);
        Some(KeptRoutes {
            addr: p.spec.address,
            token: p.gr_token,
            stale_time: p.spec.graceful_restart.map_or(0, |g| g.stale_time),
            wait,
        })
    }

    /// The peer as the RIBs see it on this session: our next hops for it (from our address
    /// on the connection), its interface, its class and options.
    fn peer_info(
        &self,
        id: PeerId,
        remote_id: Ipv4Addr,
        local_address: IpAddr,
        families: Families,
        peer_ext_next_hop: bool,
    ) -> Option<PeerInfo> {
        let ipv6_next_hop = self.config.ipv6_next_hop;
        let p = self.by_id.get(&id).and_then(|a| self.peers.get(a))?;
        let Families { ipv4, ipv6 } = families;
        let addr = p.spec.address;
        let (next_hop_v4, next_hop_v6) =
            own_next_hops(local_address, addr, peer_ext_next_hop, ipv6_next_hop);
        if ipv4 && next_hop_v4.is_none() {
            tracing::warn!(peer = %addr, "IPv4 negotiated on an IPv6 session, but the peer did not offer the extended next hop capability: no IPv4 routes are sent to it");
        }
        if ipv6 && local_address.is_ipv4() && ipv6_next_hop.is_none() {
            tracing::warn!(peer = %addr, "IPv6 routes on an IPv4 session get the IPv4-mapped next hop, which most peers refuse: set node.address6");
        }
        Some(PeerInfo {
            id,
            address: addr,
            asn: p.spec.asn,
            router_id: remote_id,
            next_hop_v4: next_hop_v4.filter(|_| ipv4),
            next_hop_v6: next_hop_v6.filter(|_| ipv6),
            // Kept before the family filter: an IPv6 session carrying only IPv4 still has
            // our link-local address on its link.
            local_link_local: match next_hop_v6 {
                Some(NextHop::V6 { link_local, .. }) => link_local,
                _ => None,
            },
            class: p.spec.class,
            rr_client: p.spec.rr_client,
            options: PeerOptions {
                interface: iface::interface_of(local_address).and_then(|n| IfName::new(&n)),
                ..p.spec.options
            },
        })
    }

    /// Put the peer in the RIB of each family its session negotiated and send it our
    /// routes of those, then End-of-RIB.
    fn send_initial_routes(&mut self, info: PeerInfo, epoch: u64, families: Families) {
        let Some(tx) = self.entry(info.id).map(|p| p.tx.clone()) else {
            return;
        };
        if families.ipv4 {
            let update = Ipv4Prefix::family_update(self.rib.peer_up(info));
            let _ = tx.send(ToSession::Routes {
                epoch,
                update: Box::new(update),
            });
        }
        if families.ipv6 {
            let update = Ipv6Prefix::family_update(self.rib6.peer_up(info));
            let _ = tx.send(ToSession::Routes {
                epoch,
                update: Box::new(update),
            });
        }
        let _ = tx.send(ToSession::EndOfRib { epoch });
    }

    /// Back from its restart: stale routes of the families it preserved stay until its
    /// End-of-RIB, at most the stale-path time; the others go now.
    fn settle_kept_routes(&mut self, id: PeerId, kept: KeptRoutes) {
        if self.rib.has_stale(id) && !kept.wait.ipv4 {
            self.sweep_stale(id, Some(Family::IPV4_UNICAST));
        }
        if self.rib6.has_stale(id) && !kept.wait.ipv6 {
            self.sweep_stale(id, Some(Family::IPV6_UNICAST));
        }
        if self.has_stale(id) {
            self.gr_timer(kept.addr, id, kept.token, kept.stale_time);
        }
    }

    /// Left Established: the peer's routes go, or stay stale through its graceful restart.
    fn session_down(&mut self, id: PeerId, epoch: u64, graceful: Option<u16>) {
        let Some(p) = self.entry(id) else { return };
        if p.epoch != Some(epoch) {
            return;
        }
        p.epoch = None;
        p.gr_token = p.gr_token.wrapping_add(1);
        let (token, addr) = (p.gr_token, p.spec.address);
        match graceful.filter(|_| p.spec.graceful_restart.is_some()) {
            Some(restart_time) => {
                // Only the families its capability names are kept (RFC 4724 §4.2).
                let keep = p.gr_families;
                let kept = self.peer_down(id, keep);
                tracing::info!(peer = %addr, kept, restart_time, "peer restarting gracefully: its routes are kept stale");
                self.gr_timer(addr, id, token, restart_time);
            }
            None => {
                self.peer_down(id, Families::NONE);
            }
        }
    }

    fn refresh_marker(&mut self, id: PeerId, epoch: u64, family: Family, begin: bool) {
        let Some(p) = self.entry(id) else { return };
        if p.epoch != Some(epoch) {
            return;
        }
        if !begin {
            self.sweep_stale(id, Some(family));
        } else if family == Family::IPV6_UNICAST {
            // What the peer does not re-advertise before EoRR is gone (RFC 7313 §4).
            self.rib6.begin_refresh(id);
        } else {
            self.rib.begin_refresh(id);
        }
    }

    fn end_of_rib(&mut self, id: PeerId, epoch: u64, family: Family) {
        let Some(p) = self.entry(id) else { return };
        if p.epoch != Some(epoch) {
            return;
        }
        self.sweep_stale(id, Some(family));
        // The stale-path timer stays for families whose End-of-RIB is still due.
        if !self.has_stale(id)
            && let Some(p) = self.entry(id)
        {
            p.gr_token = p.gr_token.wrapping_add(1);
        }
    }

    /// An UPDATE of the current session, as changes to the RIBs: its malformed parts
    /// counted, and all of it withdrawn when RFC 7606 says to treat it so.
    fn read_update(&mut self, id: PeerId, epoch: u64, update: UpdateDecode) -> Option<RibChanges> {
        let p = self.entry(id)?;
        if p.epoch != Some(epoch) {
            return None;
        }
        let (mut withdrawn, mut withdrawn6) = split_families(update.update.withdrawn_routes());
        let bgp_wire::Update {
            attributes,
            nlri,
            mp_reach,
            ..
        } = update.update;
        p.malformed.attribute_discard = p
            .malformed
            .attribute_discard
            .saturating_add(update.discarded.len() as u64);
        if !update.discarded.is_empty() {
            tracing::info!(peer = %p.spec.address, discarded = ?update.discarded, "attributes discarded (RFC 7606)");
        }
        let mut announced = Announced::of(attributes, nlri, mp_reach);
        if let Disposition::TreatAsWithdraw(problems) = &update.disposition {
            p.malformed.treat_as_withdraw = p.malformed.treat_as_withdraw.saturating_add(1);
            tracing::warn!(peer = %p.spec.address, ?problems, "UPDATE treated as withdraw (RFC 7606)");
            withdrawn.append(&mut announced.v4);
            withdrawn.append(&mut announced.mp_v4);
            withdrawn6.append(&mut announced.v6);
            announced = Announced::default();
        }
        Some(RibChanges {
            announced,
            withdrawn,
            withdrawn6,
        })
    }

    fn apply_update(&mut self, id: PeerId, changes: RibChanges) {
        let RibChanges {
            announced: routes,
            withdrawn,
            withdrawn6,
        } = changes;
        if !routes.v4.is_empty() || !withdrawn.is_empty() {
            let out = self.rib.update(id, routes.attrs, &routes.v4, &withdrawn);
            self.distribute(out);
        }
        if !routes.mp_v4.is_empty() {
            let out = self
                .rib
                .update(id, routes.mp_attrs.clone(), &routes.mp_v4, &[]);
            self.distribute(out);
        }
        if !routes.v6.is_empty() || !withdrawn6.is_empty() {
            let out = self
                .rib6
                .update(id, routes.mp_attrs, &routes.v6, &withdrawn6);
            self.distribute(out);
        }
    }
}

/// Prefixes of an UPDATE by family.
fn split_families(prefixes: impl Iterator<Item = Prefix>) -> (Vec<Ipv4Prefix>, Vec<Ipv6Prefix>) {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for p in prefixes {
        match p {
            Prefix::V4(p) => v4.push(p),
            Prefix::V6(p) => v6.push(p),
        }
    }
    (v4, v6)
}

/// The routes an UPDATE announces, with the attributes to store them with: NEXT_HOP applies
/// to the classic NLRI field only, MP_REACH_NLRI's next hop to its own routes (RFC 4760
/// §3), so each part gets its own copy of the next hop.
#[derive(Debug, Default, PartialEq)]
struct Announced {
    attrs: Option<PathAttributes>,
    /// The classic NLRI field.
    v4: Vec<Ipv4Prefix>,
    /// Attributes of the MP_REACH_NLRI routes, with its next hop.
    mp_attrs: Option<PathAttributes>,
    /// IPv4 routes in MP_REACH_NLRI (an IPv4 next hop, or IPv6 per RFC 8950).
    mp_v4: Vec<Ipv4Prefix>,
    v6: Vec<Ipv6Prefix>,
}

impl Announced {
    fn of(attrs: PathAttributes, nlri: Vec<Ipv4Prefix>, reach: Option<bgp_wire::MpReach>) -> Self {
        let Some(reach) = reach else {
            return Announced {
                attrs: Some(attrs),
                v4: nlri,
                ..Announced::default()
            };
        };
        // A copy only when the UPDATE carries both kinds (rare).
        let (classic, mut mp) = if nlri.is_empty() {
            (None, attrs)
        } else {
            (Some(attrs.clone()), attrs)
        };
        let mut a = Announced {
            attrs: classic,
            v4: nlri,
            ..Announced::default()
        };
        match reach.next_hop {
            NextHop::V4(nh) => {
                mp.next_hop = Some(nh);
                mp.mp_next_hop = None;
            }
            v6 => {
                mp.next_hop = None;
                mp.mp_next_hop = Some(v6);
            }
        }
        match reach.nlri {
            bgp_wire::MpNlri::Ipv4(v) => a.mp_v4 = v,
            bgp_wire::MpNlri::Ipv6(v) => a.v6 = v,
        }
        a.mp_attrs = Some(mp);
        a
    }
}

/// Our next hops on a session from our address on it: for IPv4 routes (our IPv4 address,
/// or our IPv6 one where the peer takes it, RFC 8950) and for IPv6 routes (our IPv6
/// address, with the link-local address of the same interface when the peer is on that
/// link, RFC 2545 §3, as BIRD and FRR send; on an IPv4 session the node's IPv6 address,
/// else the IPv4-mapped one).
///
/// IPv4 routes get the global address alone: FRR without interface knowledge (no zebra)
/// treats a link-local next hop as an error, and the global one is what RFC 8950 needs.
fn own_next_hops(
    local: IpAddr,
    peer: IpAddr,
    peer_ext_next_hop: bool,
    node_v6: Option<Ipv6Addr>,
) -> (Option<NextHop>, Option<NextHop>) {
    match local {
        IpAddr::V4(a) => (
            Some(NextHop::V4(a)),
            Some(NextHop::V6 {
                global: node_v6.unwrap_or(a.to_ipv6_mapped()),
                link_local: None,
            }),
        ),
        IpAddr::V6(global) => {
            let link_local = match peer {
                IpAddr::V6(p) => iface::link_local_toward(global, p),
                IpAddr::V4(_) => None,
            };
            let own = NextHop::V6 { global, link_local };
            let global_only = NextHop::V6 {
                global,
                link_local: None,
            };
            (peer_ext_next_hop.then_some(global_only), Some(own))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bgp_wire::{MpNlri, MpReach, Origin};

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn mp_reach_next_hops_go_with_the_routes_of_their_family() {
        let base = PathAttributes {
            origin: Some(Origin::Igp),
            next_hop: Some(Ipv4Addr::new(10, 0, 0, 2)),
            ..PathAttributes::default()
        };
        let nh6 = NextHop::V6 {
            global: v6("fd99::2"),
            link_local: Some(v6("fe80::2")),
        };
        let classic: Vec<Ipv4Prefix> = vec!["10.1.0.0/24".parse().unwrap()];
        // IPv6 routes beside classic IPv4 ones: each family its own next hop.
        let reach = MpReach {
            next_hop: nh6,
            nlri: MpNlri::Ipv6(vec!["fd20::/122".parse().unwrap()]),
        };
        let a = Announced::of(base.clone(), classic.clone(), Some(reach));
        assert_eq!(a.attrs.unwrap().next_hop, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(a.v4, classic);
        let mp = a.mp_attrs.unwrap();
        assert_eq!((mp.next_hop, mp.mp_next_hop), (None, Some(nh6)));
        assert_eq!(a.v6.len(), 1);
        // IPv4 routes with an IPv6 next hop (RFC 8950), even beside a classic NEXT_HOP:
        // that applies to the NLRI field only (RFC 4760 §3).
        let reach = MpReach {
            next_hop: nh6,
            nlri: MpNlri::Ipv4(vec!["10.20.1.0/24".parse().unwrap()]),
        };
        let a = Announced::of(base.clone(), classic.clone(), Some(reach));
        assert_eq!(a.mp_v4.len(), 1);
        let mp = a.mp_attrs.unwrap();
        assert_eq!((mp.next_hop, mp.mp_next_hop), (None, Some(nh6)));
        assert_eq!(a.attrs.unwrap().next_hop, base.next_hop);
        // Only MP routes: the classic part is empty and the attributes are not copied.
        let reach = MpReach {
            next_hop: NextHop::V4(Ipv4Addr::new(10, 0, 0, 9)),
            nlri: MpNlri::Ipv4(vec!["10.30.0.0/24".parse().unwrap()]),
        };
        let a = Announced::of(base, vec![], Some(reach));
        assert!(a.attrs.is_none() && a.v4.is_empty());
        assert_eq!(
            a.mp_attrs.unwrap().next_hop,
            Some(Ipv4Addr::new(10, 0, 0, 9))
        );
    }

    #[test]
    fn own_next_hops_follow_the_session_family() {
        let a4 = Ipv4Addr::new(10, 0, 0, 1);
        // IPv4 session: IPv4 next hop; IPv6 routes via the node's IPv6 address, else mapped.
        assert_eq!(
            own_next_hops(IpAddr::V4(a4), IpAddr::V4(a4), false, Some(v6("fd99::1"))),
            (
                Some(NextHop::V4(a4)),
                Some(NextHop::V6 {
                    global: v6("fd99::1"),
                    link_local: None
                })
            )
        );
        assert_eq!(
            own_next_hops(IpAddr::V4(a4), IpAddr::V4(a4), false, None).1,
            Some(NextHop::V6 {
                global: v6("::ffff:10.0.0.1"),
                link_local: None
            })
        );
        // IPv6 session (loopback has no link-local): IPv4 routes only with RFC 8950.
        let lo = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let (n4, n6) = own_next_hops(lo, lo, false, None);
        assert_eq!(n4, None);
        assert_eq!(
            n6,
            Some(NextHop::V6 {
                global: Ipv6Addr::LOCALHOST,
                link_local: None
            })
        );
        let (n4, _) = own_next_hops(lo, lo, true, None);
        assert_eq!(n4, n6);
    }
}
