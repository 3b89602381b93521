//! RIB tests: decision process steps one by one, export rules, interning, churn.
//!
//! Why this file is long: the decision process step by step, export rules, reflection and
//! interning, one short test each.

use super::*;
use bgp_wire::AsSegment;

use crate::policy::PeerClass;

const LOCAL_AS: Asn = Asn(64512);

fn pfx(s: &str) -> Ipv4Prefix {
    let (a, l) = s.split_once('/').unwrap();
    Ipv4Prefix::new(a.parse().unwrap(), l.parse().unwrap()).unwrap()
}

fn peer(n: u8, asn: u32) -> PeerInfo {
    PeerInfo {
        id: PeerId(u32::from(n)),
        address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
        asn: Asn(asn),
        router_id: Ipv4Addr::new(10, 0, 0, n),
        next_hop_v4: Some(NextHop::V4(Ipv4Addr::new(10, 0, 0, 1))),
        next_hop_v6: None,
        local_link_local: None,
        class: PeerClass::External,
        rr_client: false,
        options: Default::default(),
    }
}

fn attrs(path: &[u32], lp: Option<u32>) -> PathAttributes {
    PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::from_sequence(path.iter().map(|a| Asn(*a)))),
        next_hop: Some(Ipv4Addr::new(192, 0, 2, 1)),
        local_pref: lp,
        ..PathAttributes::default()
    }
}

fn rib<P: RibPrefix>() -> Rib<P> {
    Rib::new(LOCAL_AS, Ipv4Addr::new(10, 0, 0, 1))
}

fn best_from(r: &Rib, p: &str) -> Option<Source> {
    r.best(&pfx(p)).map(|(s, _)| s)
}

#[test]
fn learned_route_reaches_loc_rib_and_withdrawal_removes_it() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.update(
        PeerId(2),
        Some(attrs(&[], Some(100))),
        &[pfx("10.1.0.0/26")],
        &[],
    );
    assert_eq!(best_from(&r, "10.1.0.0/26"), Some(Source::Peer(PeerId(2))));
    assert_eq!(r.counts(PeerId(2)), (1, 1, 0));
    r.update(PeerId(2), None, &[], &[pfx("10.1.0.0/26")]);
    assert_eq!(r.loc_len(), 0);
}

/// An UPDATE that withdraws a prefix and announces it again leaves it announced (the
/// announcement is the route the peer is left with), in the Loc-RIB and towards other peers;
/// here the route it replaces was unusable (our own, reflected back), so there was no best.
#[test]
fn a_prefix_withdrawn_and_announced_in_one_update_is_announced() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(4, 65000));
    let p = pfx("10.1.0.0/26");
    let ours = PathAttributes {
        originator_id: Some(Ipv4Addr::new(10, 0, 0, 1)),
        ..attrs(&[], Some(100))
    };
    r.update(PeerId(2), Some(ours), &[p], &[]);
    assert_eq!(r.loc_len(), 0);
    assert_eq!(r.counts(PeerId(2)), (1, 0, 0));
    let out = r.update(PeerId(2), Some(attrs(&[], Some(100))), &[p], &[p]);
    assert_eq!(best_from(&r, "10.1.0.0/26"), Some(Source::Peer(PeerId(2))));
    assert_eq!(r.counts(PeerId(2)), (1, 1, 0));
    let to_ebgp = &out[&PeerId(4)];
    assert!(to_ebgp.withdraw.is_empty(), "{to_ebgp:?}");
    assert!(announced_to(&out, 4).iter().all(|(q, _)| *q == p));
    assert!(!announced_to(&out, 4).is_empty());
}

#[test]
fn decision_local_pref_then_path_then_origin() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(3, 64512));
    let p = [pfx("10.1.0.0/24")];
    r.update(PeerId(2), Some(attrs(&[65000, 65001], Some(200))), &p, &[]);
    r.update(PeerId(3), Some(attrs(&[65000], Some(100))), &p, &[]);
    assert_eq!(
        best_from(&r, "10.1.0.0/24"),
        Some(Source::Peer(PeerId(2))),
        "local-pref"
    );
    r.update(PeerId(2), Some(attrs(&[65000, 65001], Some(100))), &p, &[]);
    assert_eq!(
        best_from(&r, "10.1.0.0/24"),
        Some(Source::Peer(PeerId(3))),
        "path length"
    );
    let mut inc = attrs(&[65000], Some(100));
    inc.origin = Some(Origin::Incomplete);
    r.update(PeerId(3), Some(inc), &p, &[]);
    let mut egp = attrs(&[65000], Some(100));
    egp.origin = Some(Origin::Egp);
    r.update(PeerId(2), Some(egp), &p, &[]);
    assert_eq!(
        best_from(&r, "10.1.0.0/24"),
        Some(Source::Peer(PeerId(2))),
        "origin"
    );
}

#[test]
fn med_only_between_same_neighbour_as() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(3, 64512));
    let p = [pfx("10.2.0.0/24")];
    let mut a = attrs(&[65000], Some(100));
    a.med = Some(50);
    let mut b = attrs(&[65000], Some(100));
    b.med = Some(10);
    r.update(PeerId(2), Some(a), &p, &[]);
    r.update(PeerId(3), Some(b), &p, &[]);
    assert_eq!(best_from(&r, "10.2.0.0/24"), Some(Source::Peer(PeerId(3))));
    // Different neighbour AS: MED ignored, falls to router id (lowest wins: peer 2).
    let mut c = attrs(&[65009], Some(100));
    c.med = Some(500);
    r.update(PeerId(2), Some(c), &p, &[]);
    assert_eq!(best_from(&r, "10.2.0.0/24"), Some(Source::Peer(PeerId(2))));
}

#[test]
fn ebgp_beats_ibgp_then_lowest_router_id() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(3, 65000));
    let p = [pfx("10.3.0.0/24")];
    r.update(PeerId(2), Some(attrs(&[65000], Some(100))), &p, &[]);
    r.update(PeerId(3), Some(attrs(&[65000], None)), &p, &[]);
    assert_eq!(best_from(&r, "10.3.0.0/24"), Some(Source::Peer(PeerId(3))));
    let mut r = rib();
    r.peer_up(peer(5, 64512));
    r.peer_up(peer(4, 64512));
    r.update(PeerId(5), Some(attrs(&[], Some(100))), &p, &[]);
    r.update(PeerId(4), Some(attrs(&[], Some(100))), &p, &[]);
    assert_eq!(best_from(&r, "10.3.0.0/24"), Some(Source::Peer(PeerId(4))));
}

#[test]
fn lowest_peer_address_breaks_the_last_tie() {
    let mut r = rib();
    let mut a = peer(7, 64512);
    let mut b = peer(6, 64512);
    a.router_id = Ipv4Addr::new(1, 1, 1, 1);
    b.router_id = Ipv4Addr::new(1, 1, 1, 1);
    r.peer_up(a);
    r.peer_up(b);
    let p = [pfx("10.4.0.0/24")];
    r.update(PeerId(7), Some(attrs(&[], Some(100))), &p, &[]);
    r.update(PeerId(6), Some(attrs(&[], Some(100))), &p, &[]);
    assert_eq!(best_from(&r, "10.4.0.0/24"), Some(Source::Peer(PeerId(6))));
}

#[test]
fn ibgp_routes_are_not_sent_to_ibgp_peers_but_to_ebgp_with_prepend() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(3, 64512));
    r.peer_up(peer(4, 65000));
    let out = r.update(
        PeerId(2),
        Some(attrs(&[65100], Some(150))),
        &[pfx("10.5.0.0/24")],
        &[],
    );
    assert!(!out.contains_key(&PeerId(2)), "not back to the sender");
    assert!(!out.contains_key(&PeerId(3)), "no iBGP to iBGP");
    let u = &out[&PeerId(4)];
    let (a, ps) = &u.announce[0];
    assert_eq!(ps, &vec![pfx("10.5.0.0/24")]);
    assert_eq!(a.local_pref, None, "no LOCAL_PREF to eBGP");
    assert_eq!(a.next_hop, Some(Ipv4Addr::new(10, 0, 0, 1)));
    assert_eq!(
        a.as_path.as_ref().unwrap().segments(),
        &[AsSegment {
            kind: bgp_wire::SegmentType::Sequence,
            asns: vec![LOCAL_AS, Asn(65100)],
        }]
    );
}

#[test]
fn ebgp_routes_go_to_ibgp_with_local_pref_and_their_next_hop() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(4, 65000));
    let out = r.update(
        PeerId(4),
        Some(attrs(&[65000], None)),
        &[pfx("10.6.0.0/24")],
        &[],
    );
    let (a, _) = &out[&PeerId(2)].announce[0];
    assert_eq!(a.local_pref, Some(DEFAULT_LOCAL_PREF));
    assert_eq!(a.next_hop, Some(Ipv4Addr::new(192, 0, 2, 1)));
    assert_eq!(a.as_path.as_ref().unwrap().path_len(), 1);
}

#[test]
fn ebgp_loop_is_rejected() {
    let mut r = rib();
    r.peer_up(peer(4, 65000));
    r.update(
        PeerId(4),
        Some(attrs(&[65000, 64512], None)),
        &[pfx("10.7.0.0/24")],
        &[],
    );
    assert_eq!(r.loc_len(), 0);
    assert_eq!(r.counts(PeerId(4)), (1, 0, 0));
}

/// RFC 4271 §5.1.3: a route whose NEXT_HOP is our own address on the session is not
/// usable; it is treated as withdrawn (BIRD's "invalid NEXT_HOP"), also when it replaces a
/// usable one.
#[test]
fn a_route_with_our_own_address_as_next_hop_is_treated_as_withdrawn() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    let p = pfx("10.7.0.0/26");
    r.update(PeerId(2), Some(attrs(&[], Some(100))), &[p], &[]);
    assert_eq!(best_from(&r, "10.7.0.0/26"), Some(Source::Peer(PeerId(2))));
    let ours = PathAttributes {
        next_hop: Some(Ipv4Addr::new(10, 0, 0, 1)),
        ..attrs(&[], Some(100))
    };
    r.update(PeerId(2), Some(ours.clone()), &[p], &[]);
    assert_eq!(
        r.loc_len(),
        0,
        "the earlier route is gone, the new one unusable"
    );
    r.update(PeerId(2), Some(ours), &[pfx("10.7.1.0/26")], &[]);
    assert_eq!(r.loc_len(), 0);
    // Another peer's address as next hop is fine.
    r.update(PeerId(2), Some(attrs(&[], Some(100))), &[p], &[]);
    assert_eq!(r.loc_len(), 1);
}

/// The same on an IPv6 session that carries only IPv4 (RFC 8950): no IPv6 next hop of ours
/// is in use there, but our link-local address on the link is still ours.
#[test]
fn our_link_local_address_is_ours_on_an_ipv6_session_carrying_only_ipv4() {
    let mut r = rib();
    r.peer_up(PeerInfo {
        next_hop_v4: Some(NextHop::V6 {
            global: v6("fd99::1"),
            link_local: None,
        }),
        next_hop_v6: None,
        ..peer6(2, 65000)
    });
    let via = |nh: &str| PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::from_sequence([Asn(65000)])),
        mp_next_hop: Some(NextHop::V6 {
            global: v6(nh),
            link_local: None,
        }),
        ..PathAttributes::default()
    };
    let p = pfx("10.30.0.0/24");
    r.update(PeerId(2), Some(via("fd99::2")), &[p], &[]);
    assert_eq!(r.loc_len(), 1);
    for own in ["fe80::1", "fd99::1"] {
        r.update(PeerId(2), Some(via(own)), &[p], &[]);
        assert_eq!(r.loc_len(), 0, "next hop {own} is ours: not usable");
        r.update(PeerId(2), Some(via("fd99::2")), &[p], &[]);
        assert_eq!(r.loc_len(), 1);
    }
}

#[test]
fn originated_routes_use_next_hop_self_and_right_attributes() {
    let mut r = rib();
    let ib = r.peer_up(peer(2, 64512));
    assert!(ib.is_empty());
    r.peer_up(peer(4, 65000));
    let out = r.announce(
        pfx("10.8.0.0/26"),
        PathAttributes {
            origin: Some(Origin::Igp),
            ..PathAttributes::default()
        },
    );
    let (a, _) = &out[&PeerId(2)].announce[0];
    assert_eq!(a.next_hop, Some(Ipv4Addr::new(10, 0, 0, 1)));
    assert_eq!(a.local_pref, Some(100));
    assert!(a.as_path.as_ref().unwrap().is_empty());
    let (e, _) = &out[&PeerId(4)].announce[0];
    assert_eq!(e.local_pref, None);
    assert_eq!(e.as_path.as_ref().unwrap().first_asn(), Some(LOCAL_AS));
    // A peer coming up later gets the table.
    let late = r.peer_up(peer(3, 64512));
    assert_eq!(late.announced(), 1);
    // Withdraw: every peer is told.
    let out = r.withdraw(pfx("10.8.0.0/26")).unwrap();
    assert_eq!(out.len(), 3);
    assert!(out.values().all(|u| u.withdraw == vec![pfx("10.8.0.0/26")]));
    assert!(r.withdraw(pfx("10.8.0.0/26")).is_none());
}

#[test]
fn peer_down_withdraws_its_routes_from_others() {
    let mut r = rib();
    r.peer_up(peer(4, 65000));
    r.peer_up(peer(2, 64512));
    r.update(
        PeerId(4),
        Some(attrs(&[65000], None)),
        &[pfx("10.9.0.0/24")],
        &[],
    );
    assert_eq!(r.adj_out(PeerId(2)).len(), 1);
    let out = r.peer_down(PeerId(4));
    assert_eq!(out[&PeerId(2)].withdraw, vec![pfx("10.9.0.0/24")]);
    assert_eq!(r.loc_len(), 0);
    assert!(r.adj_out(PeerId(2)).is_empty());
}

#[test]
fn failover_to_second_best_announces_the_new_route() {
    let mut r = rib();
    r.peer_up(peer(4, 65000));
    r.peer_up(peer(5, 65001));
    r.peer_up(peer(2, 64512));
    let p = [pfx("10.10.0.0/24")];
    r.update(PeerId(4), Some(attrs(&[65000], None)), &p, &[]);
    r.update(PeerId(5), Some(attrs(&[65001, 65002], None)), &p, &[]);
    let out = r.peer_down(PeerId(4));
    let (a, _) = &out[&PeerId(2)].announce[0];
    assert_eq!(a.as_path.as_ref().unwrap().path_len(), 2);
}

#[test]
fn attributes_are_interned_and_swept() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(3, 64512));
    let ps: Vec<_> = (0..=255u8)
        .map(|i| Ipv4Prefix::new(Ipv4Addr::new(10, 20, i, 0), 24).unwrap())
        .collect();
    r.update(PeerId(2), Some(attrs(&[65000], Some(100))), &ps, &[]);
    r.update(PeerId(3), Some(attrs(&[65000], Some(100))), &ps, &[]);
    let a = r.adj_in(PeerId(2));
    let b = r.adj_in(PeerId(3));
    assert!(
        a.iter()
            .zip(&b)
            .all(|(x, y)| Arc::ptr_eq(&x.attrs, &y.attrs))
    );
    assert_eq!(r.attribute_sets(), 1);
    drop((a, b));
    r.peer_down(PeerId(2));
    r.peer_down(PeerId(3));
    r.interner.sweep();
    assert_eq!(r.attribute_sets(), 0);
}

#[test]
fn export_groups_prefixes_by_attributes() {
    let mut r = rib();
    r.peer_up(peer(4, 65000));
    r.peer_up(peer(2, 64512));
    let ps: Vec<_> = (0..100u8)
        .map(|i| Ipv4Prefix::new(Ipv4Addr::new(10, 30, i, 0), 24).unwrap())
        .collect();
    let out = r.update(PeerId(4), Some(attrs(&[65000], None)), &ps, &[]);
    assert_eq!(out[&PeerId(2)].announce.len(), 1);
    assert_eq!(out[&PeerId(2)].announced(), 100);
    // Re-announcing the same attributes changes nothing downstream.
    let out = r.update(PeerId(4), Some(attrs(&[65000], None)), &ps, &[]);
    assert!(out.is_empty());
    assert_eq!(r.refresh(PeerId(2)).announced(), 100);
}

#[test]
fn no_export_and_no_advertise_are_honoured() {
    let mut r = rib();
    r.peer_up(peer(4, 65000));
    r.peer_up(peer(5, 65001));
    r.peer_up(peer(2, 64512));
    let mut a = attrs(&[65000], None);
    a.communities = vec![Community::NO_EXPORT];
    let out = r.update(PeerId(4), Some(a), &[pfx("10.11.0.0/24")], &[]);
    assert!(out.contains_key(&PeerId(2)));
    assert!(!out.contains_key(&PeerId(5)));
    let mut a = attrs(&[65000], None);
    a.communities = vec![Community::NO_ADVERTISE];
    let out = r.update(PeerId(4), Some(a), &[pfx("10.12.0.0/24")], &[]);
    assert!(out.is_empty());
}

/// Property: whatever order announcements and withdrawals come in, the Loc-RIB holds the
/// best of what is in the Adj-RIBs-In, and every Adj-RIB-Out equals a fresh export.
#[test]
fn tables_stay_consistent_under_random_churn() {
    let peers = [
        peer(2, 64512),
        peer(3, 64512),
        peer(4, 65000),
        peer(5, 65001),
    ];
    check_churn(
        rib(),
        peers,
        |n| Ipv4Prefix::new(Ipv4Addr::new(10, 40, n, 0), 24).unwrap(),
        |path, lp| attrs(path, Some(lp)),
    );
}

/// The same for IPv6, with peers that send global + link-local next hops.
#[test]
fn ipv6_tables_stay_consistent_under_random_churn() {
    let peers = [
        peer6(2, 64512),
        peer6(3, 64512),
        peer6(4, 65000),
        peer6(5, 65001),
    ];
    check_churn(
        Rib::<Ipv6Prefix>::new(LOCAL_AS, Ipv4Addr::new(10, 0, 0, 1)),
        peers,
        |n| Ipv6Prefix::new(v6(&format!("fd40:{n}::")), 64).unwrap(),
        |path, lp| PathAttributes {
            next_hop: None,
            mp_next_hop: Some(NextHop::V6 {
                global: v6("fd99::77"),
                link_local: Some(v6("fe80::77")),
            }),
            ..attrs(path, Some(lp))
        },
    );
}

#[expect(
    clippy::too_many_lines,
    reason = "the churn property in one piece: random resets, loops and UPDATEs applied as a session would, then a rebuild from scratch compared table by table with the recounts"
)]
fn check_churn<P: RibPrefix>(
    mut r: Rib<P>,
    peers: [PeerInfo; 4],
    prefix: impl Fn(u8) -> P,
    attrs: impl Fn(&[u32], u32) -> PathAttributes,
) {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // What each peer was told, from the updates the RIB returned (as a session applies them:
    // withdrawals, then announcements).
    let mut told: HashMap<PeerId, BTreeMap<P, PathAttributes>> = HashMap::new();
    fn tell<P: RibPrefix>(told: &mut BTreeMap<P, PathAttributes>, u: OutUpdate<P>) {
        for p in u.withdraw {
            told.remove(&p);
        }
        for (a, ps) in u.announce {
            for p in ps {
                told.insert(p, PathAttributes::clone(&a));
            }
        }
    }
    let tell_all = |told: &mut HashMap<PeerId, BTreeMap<P, PathAttributes>>,
                    out: HashMap<PeerId, OutUpdate<P>>| {
        for (id, u) in out {
            tell(told.entry(id).or_default(), u);
        }
    };
    for p in peers {
        let u = r.peer_up(p);
        tell(told.entry(p.id).or_default(), u);
    }
    for _ in 0..2000 {
        let info = peers[(next() % 4) as usize];
        let who = info.id;
        let p = prefix((next() % 16) as u8);
        match next() % 12 {
            0 => {
                let out = r.update(who, None, &[], &[p]);
                tell_all(&mut told, out);
            }
            // A session resets: its routes leave every table, then it is back, empty.
            11 => {
                let out = r.peer_down(who);
                tell_all(&mut told, out);
                let mine = told.entry(who).or_default();
                mine.clear();
                tell(mine, r.peer_up(info));
            }
            1 | 2 => {
                let out = r.announce(p, PathAttributes::default());
                tell_all(&mut told, out);
            }
            3 | 4 => {
                if let Some(out) = r.withdraw(p) {
                    tell_all(&mut told, out);
                }
            }
            _ => {
                let len = (next() % 3) as usize;
                let mut path: Vec<u32> = (0..len).map(|i| 65000 + i as u32).collect();
                // Now and then our own AS: an eBGP peer's routes loop and are rejected.
                if next() % 8 == 0 {
                    path.push(LOCAL_AS.0);
                }
                // Up to three prefixes, repeats allowed, and now and then a withdrawal in the
                // same UPDATE, perhaps of a prefix it also announces.
                let announced: Vec<P> = std::iter::once(p)
                    .chain((0..next() % 3).map(|_| prefix((next() % 16) as u8)))
                    .collect();
                let withdrawn: Vec<P> = match next() % 4 {
                    0 => vec![announced[(next() % announced.len() as u64) as usize]],
                    1 => vec![prefix((next() % 16) as u8)],
                    _ => vec![],
                };
                let out = r.update(
                    who,
                    Some(attrs(&path, 100 + (next() % 2) as u32)),
                    &announced,
                    &withdrawn,
                );
                tell_all(&mut told, out);
            }
        }
    }
    // Rebuild from scratch and compare.
    for p in peers {
        let mine = r.adj_out(p.id);
        let mut fresh: Vec<_> = r
            .loc_rib()
            .filter_map(|route| {
                let from = match route.source {
                    Source::Peer(q) => peers.iter().find(|x| x.id == q).copied(),
                    Source::Local => None,
                };
                export_attrs::<P>(
                    LOCAL_AS,
                    None,
                    &p,
                    route.source,
                    from.as_ref(),
                    &route.attrs,
                )
                .map(|a| (route.prefix, a))
            })
            .collect();
        fresh.sort_by_key(|(p, _)| *p);
        let mine: Vec<_> = mine
            .into_iter()
            .map(|r| (r.prefix, (*r.attrs).clone()))
            .collect();
        assert_eq!(mine, fresh, "adj-out of {:?}", p.id);
        let heard: Vec<_> = told.remove(&p.id).unwrap_or_default().into_iter().collect();
        assert_eq!(heard, fresh, "what {:?} was told", p.id);
        // Every route out carries a next hop the session can use.
        for (_, a) in &mine {
            let nh = next_hop_of(a).expect("a next hop");
            assert!(P::carries(&p, &nh), "{nh:?} to {:?}", p.id);
            if let NextHop::V6 {
                link_local: Some(_),
                ..
            } = nh
            {
                assert_eq!(
                    Some(nh),
                    P::self_next_hop(&p),
                    "a foreign link-local next hop"
                );
            }
        }
    }
    for route in r.loc_rib() {
        assert!(r.decide(&route.prefix).is_some());
    }
    // The accepted counts kept up to date on the way equal a recount.
    for p in peers {
        let st = &r.peers[&p.id];
        let n = st
            .adj_in
            .iter()
            .filter(|(x, id)| r.was_eligible(&st.info, x, **id))
            .count() as u64;
        assert_eq!(r.counts(p.id).1, n, "accepted of {:?}", p.id);
    }
}

fn cluster_peer(n: u8, client: bool) -> PeerInfo {
    PeerInfo {
        class: PeerClass::Cluster,
        rr_client: client,
        ..peer(n, 64512)
    }
}

fn announced_to(out: &HashMap<PeerId, OutUpdate>, id: u32) -> Vec<(Ipv4Prefix, Attrs)> {
    out.get(&PeerId(id))
        .map(|u| {
            u.announce
                .iter()
                .flat_map(|(a, ps)| ps.iter().map(|p| (*p, a.clone())))
                .collect()
        })
        .unwrap_or_default()
}

const CLUSTER_ID: Ipv4Addr = Ipv4Addr::new(244, 0, 0, 1);

#[test]
fn a_reflector_passes_client_routes_to_everyone_and_others_to_clients_only() {
    let mut r = rib();
    let _ = r.set_policy(Arc::new(Policy::accept_all()), Some(CLUSTER_ID));
    r.peer_up(cluster_peer(2, true));
    r.peer_up(cluster_peer(3, true));
    r.peer_up(cluster_peer(4, false));
    let from_client = r.update(
        PeerId(2),
        Some(attrs(&[], Some(100))),
        &[pfx("172.20.2.0/26")],
        &[],
    );
    let to3 = announced_to(&from_client, 3);
    let to4 = announced_to(&from_client, 4);
    assert_eq!(to3.len(), 1, "client to client");
    assert_eq!(to4.len(), 1, "client to non-client");
    assert!(
        announced_to(&from_client, 2).is_empty(),
        "never back to the sender"
    );
    let a = &to3[0].1;
    assert_eq!(a.originator_id, Some(Ipv4Addr::new(10, 0, 0, 2)));
    assert_eq!(a.cluster_list, vec![CLUSTER_ID]);
    assert_eq!(
        a.next_hop,
        Some(Ipv4Addr::new(192, 0, 2, 1)),
        "next hop kept"
    );

    let from_non_client = r.update(
        PeerId(4),
        Some(attrs(&[], Some(100))),
        &[pfx("172.20.4.0/26")],
        &[],
    );
    assert_eq!(announced_to(&from_non_client, 2).len(), 1);
    assert_eq!(announced_to(&from_non_client, 3).len(), 1);
    assert!(announced_to(&from_non_client, 4).is_empty());
}

#[test]
fn without_a_cluster_id_ibgp_routes_stay_put() {
    let mut r = rib();
    r.peer_up(cluster_peer(2, true));
    r.peer_up(cluster_peer(3, true));
    let out = r.update(
        PeerId(2),
        Some(attrs(&[], Some(100))),
        &[pfx("172.20.2.0/26")],
        &[],
    );
    assert!(announced_to(&out, 3).is_empty());
}

#[test]
fn reflection_loops_are_refused_on_the_way_in() {
    let mut r = rib();
    let _ = r.set_policy(Arc::new(Policy::accept_all()), Some(CLUSTER_ID));
    r.peer_up(cluster_peer(2, false));
    let mut looped = attrs(&[], Some(100));
    looped.cluster_list = vec![Ipv4Addr::new(244, 0, 0, 9), CLUSTER_ID];
    r.update(PeerId(2), Some(looped), &[pfx("172.20.2.0/26")], &[]);
    let mut mine = attrs(&[], Some(100));
    mine.originator_id = Some(Ipv4Addr::new(10, 0, 0, 1));
    r.update(PeerId(2), Some(mine), &[pfx("172.20.3.0/26")], &[]);
    assert_eq!(r.loc_len(), 0);
    assert_eq!(r.counts(PeerId(2)), (2, 0, 0));
}

#[test]
fn shorter_cluster_list_wins_a_tie() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(3, 64512));
    let p = [pfx("172.20.2.0/26")];
    let mut long = attrs(&[], Some(100));
    long.originator_id = Some(Ipv4Addr::new(10, 9, 9, 9));
    long.cluster_list = vec![Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(2, 2, 2, 2)];
    let mut short = long.clone();
    short.cluster_list.truncate(1);
    r.update(PeerId(2), Some(long), &p, &[]);
    r.update(PeerId(3), Some(short), &p, &[]);
    assert_eq!(
        best_from(&r, "172.20.2.0/26"),
        Some(Source::Peer(PeerId(3)))
    );
}

fn pool_policy(own: &[&str]) -> Arc<Policy> {
    let pools = vec![crate::policy::PolicyPool::new(
        "default",
        "172.20.0.0/16".parse().unwrap(),
    )];
    let own: Vec<ipnet::IpNet> = own.iter().map(|s| s.parse().unwrap()).collect();
    Arc::new(Policy::generate(&crate::policy::PolicyInputs {
        pools: &pools,
        own_blocks: &own,
        program_external_routes: true,
        ..Default::default()
    }))
}

#[test]
fn a_new_policy_applies_to_routes_already_held_without_asking_the_peer() {
    let mut r = rib();
    r.track_loc_changes();
    r.peer_up(cluster_peer(2, false));
    r.update(
        PeerId(2),
        Some(attrs(&[], Some(100))),
        &[
            pfx("172.20.2.0/26"),
            pfx("10.0.0.0/8"),
            pfx("172.20.1.0/26"),
        ],
        &[],
    );
    assert_eq!(r.loc_len(), 3);
    let _ = r.take_loc_changes();
    let _ = r.set_policy(pool_policy(&["172.20.1.0/26"]), None);
    // Outside the pools from a cluster peer, and our own block coming back: out.
    let loc: Vec<Ipv4Prefix> = r.loc_rib().map(|x| x.prefix).collect();
    assert_eq!(loc, vec![pfx("172.20.2.0/26")]);
    assert_eq!(r.counts(PeerId(2)), (3, 1, 0));
    let mut changed = r.take_loc_changes();
    changed.sort();
    assert_eq!(changed, vec![pfx("10.0.0.0/8"), pfx("172.20.1.0/26")]);
    // And back.
    let _ = r.set_policy(Arc::new(Policy::accept_all()), None);
    assert_eq!(r.loc_len(), 3);
}

#[test]
fn a_policy_change_tells_peers_what_it_changed_and_only_that() {
    let mut r = rib();
    r.peer_up(cluster_peer(2, false));
    r.peer_up(peer(4, 65000));
    r.update(
        PeerId(2),
        Some(attrs(&[], Some(100))),
        &[pfx("172.20.1.0/26"), pfx("172.20.2.0/26")],
        &[],
    );
    assert_eq!(r.adj_out(PeerId(4)).len(), 2, "accept_all: relayed to eBGP");
    // Our own block coming back is no longer imported, and cluster routes no longer go
    // to external peers: both withdrawn from peer 4, whose table was derived from them.
    let out = r.set_policy(pool_policy(&["172.20.1.0/26"]), None);
    let mut gone = out
        .get(&PeerId(4))
        .map(|u| u.withdraw.clone())
        .unwrap_or_default();
    gone.sort();
    assert_eq!(
        gone,
        vec![pfx("172.20.1.0/26"), pfx("172.20.2.0/26")],
        "{out:?}"
    );
    assert!(r.adj_out(PeerId(4)).is_empty());
    // The same policy again, or one whose verdicts are the same: nothing to tell.
    assert!(
        r.set_policy(pool_policy(&["172.20.1.0/26"]), None)
            .is_empty()
    );
    let more_blocks = pool_policy(&["172.20.1.0/26", "172.20.9.0/26"]);
    assert!(r.set_policy(more_blocks, None).is_empty());
}

#[test]
fn export_policy_keeps_cluster_routes_from_external_peers() {
    let mut r = rib();
    let _ = r.set_policy(pool_policy(&["172.20.1.0/26"]), None);
    r.peer_up(cluster_peer(2, false));
    r.peer_up(peer(3, 65000));
    let own = r.announce(
        pfx("172.20.1.0/26"),
        PathAttributes {
            origin: Some(Origin::Igp),
            next_hop: Some(Ipv4Addr::new(10, 0, 0, 1)),
            ..Default::default()
        },
    );
    assert_eq!(announced_to(&own, 2).len(), 1);
    assert_eq!(announced_to(&own, 3).len(), 1);
    // Another node's block: not relayed to the external peer.
    let other = r.update(
        PeerId(2),
        Some(attrs(&[], Some(100))),
        &[pfx("172.20.2.0/26")],
        &[],
    );
    assert!(announced_to(&other, 3).is_empty());
    assert_eq!(r.loc_len(), 2);
}

#[test]
fn graceful_restart_keeps_routes_stale_until_refreshed_or_swept() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    r.peer_up(peer(3, 65000));
    let a = attrs(&[], Some(100));
    r.update(
        PeerId(2),
        Some(a.clone()),
        &[pfx("10.1.0.0/24"), pfx("10.2.0.0/24")],
        &[],
    );
    assert_eq!(r.peer_down_graceful(PeerId(2)), 2);
    // Still best, still advertised to peer 3, marked stale.
    assert_eq!(best_from(&r, "10.1.0.0/24"), Some(Source::Peer(PeerId(2))));
    assert!(r.is_stale(PeerId(2), &pfx("10.1.0.0/24")));
    assert_eq!(r.adj_out(PeerId(3)).len(), 2);
    // Back: one route refreshed, then End-of-RIB sweeps the other.
    r.peer_up(peer(2, 64512));
    r.update(PeerId(2), Some(a), &[pfx("10.1.0.0/24")], &[]);
    assert!(!r.is_stale(PeerId(2), &pfx("10.1.0.0/24")));
    assert!(r.is_stale(PeerId(2), &pfx("10.2.0.0/24")));
    let out = r.sweep_stale(PeerId(2));
    assert_eq!(out[&PeerId(3)].withdraw, vec![pfx("10.2.0.0/24")]);
    assert_eq!(best_from(&r, "10.2.0.0/24"), None);
    assert_eq!(best_from(&r, "10.1.0.0/24"), Some(Source::Peer(PeerId(2))));
    assert!(!r.has_stale(PeerId(2)));
    // A hard down after a graceful one removes everything.
    r.peer_down_graceful(PeerId(2));
    r.peer_down(PeerId(2));
    assert_eq!(r.loc_len(), 0);
}

#[test]
fn an_enhanced_refresh_drops_what_the_peer_did_not_readvertise() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    let a = attrs(&[], Some(100));
    r.update(
        PeerId(2),
        Some(a.clone()),
        &[pfx("10.1.0.0/24"), pfx("10.2.0.0/24")],
        &[],
    );
    r.begin_refresh(PeerId(2));
    r.update(PeerId(2), Some(a), &[pfx("10.1.0.0/24")], &[]);
    let _ = r.sweep_stale(PeerId(2));
    assert_eq!(best_from(&r, "10.1.0.0/24"), Some(Source::Peer(PeerId(2))));
    assert_eq!(best_from(&r, "10.2.0.0/24"), None);
}

// ---- IPv6 and extended next hops -------------------------------------------------------

fn v6(s: &str) -> std::net::Ipv6Addr {
    s.parse().unwrap()
}

fn pfx6(s: &str) -> Ipv6Prefix {
    s.parse().unwrap()
}

/// A peer on an IPv6 session: our next hop there is `fd99::1` (+ `fe80::1` on the link).
fn peer6(n: u8, asn: u32) -> PeerInfo {
    let own = NextHop::V6 {
        global: v6("fd99::1"),
        link_local: Some(v6("fe80::1")),
    };
    PeerInfo {
        address: IpAddr::V6(v6(&format!("fd99::{n}"))),
        next_hop_v4: None,
        next_hop_v6: Some(own),
        local_link_local: Some(v6("fe80::1")),
        ..peer(n, asn)
    }
}

fn announced_nh<P: RibPrefix>(out: &HashMap<PeerId, OutUpdate<P>>, to: u8) -> Option<NextHop> {
    let (a, _) = out.get(&PeerId(u32::from(to)))?.announce.first()?;
    next_hop_of(a)
}

#[test]
fn ipv6_routes_we_originate_carry_our_global_and_link_local_next_hop() {
    let mut r: Rib<Ipv6Prefix> = rib();
    let up = r.peer_up(peer6(2, 65000));
    assert!(up.is_empty());
    let out = r.announce(pfx6("fd10:1::/122"), PathAttributes::default());
    let (a, ps) = &out[&PeerId(2)].announce[0];
    assert_eq!(ps, &vec![pfx6("fd10:1::/122")]);
    assert_eq!(a.next_hop, None, "IPv6 routes have no NEXT_HOP attribute");
    assert_eq!(
        a.mp_next_hop,
        Some(NextHop::V6 {
            global: v6("fd99::1"),
            link_local: Some(v6("fe80::1")),
        })
    );
}

#[test]
fn an_ebgp_learned_ipv6_route_keeps_its_global_next_hop_toward_ibgp_but_not_a_foreign_link_local() {
    let mut r: Rib<Ipv6Prefix> = rib();
    r.peer_up(peer6(2, 65000));
    r.peer_up(peer6(3, 64512));
    r.peer_up(peer6(4, 65100));
    let theirs = PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::from_sequence([Asn(65000)])),
        mp_next_hop: Some(NextHop::V6 {
            global: v6("fd99::2"),
            link_local: Some(v6("fe80::2")),
        }),
        ..PathAttributes::default()
    };
    let out = r.update(PeerId(2), Some(theirs), &[pfx6("fd20::/122")], &[]);
    // iBGP: next hop unchanged, but a link-local address of another link means nothing.
    assert_eq!(
        announced_nh(&out, 3),
        Some(NextHop::V6 {
            global: v6("fd99::2"),
            link_local: None,
        })
    );
    // eBGP: ours.
    assert_eq!(
        announced_nh(&out, 4),
        Some(NextHop::V6 {
            global: v6("fd99::1"),
            link_local: Some(v6("fe80::1")),
        })
    );
}

#[test]
fn a_link_local_only_next_hop_becomes_ours_toward_ibgp_peers() {
    let mut r: Rib<Ipv6Prefix> = rib();
    r.peer_up(peer6(2, 65000));
    r.peer_up(peer6(3, 64512));
    // An unnumbered peer: its only next hop is link-local.
    let theirs = PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::from_sequence([Asn(65000)])),
        mp_next_hop: Some(NextHop::V6 {
            global: v6("fe80::2"),
            link_local: None,
        }),
        ..PathAttributes::default()
    };
    let out = r.update(PeerId(2), Some(theirs), &[pfx6("fd20::/122")], &[]);
    assert_eq!(announced_nh(&out, 3), peer6(3, 64512).next_hop_v6);
}

#[test]
fn a_session_without_a_next_hop_of_the_family_is_sent_nothing() {
    let mut r: Rib<Ipv6Prefix> = rib();
    r.peer_up(peer(2, 65000)); // next_hop_v6: None
    let out = r.announce(pfx6("fd10:1::/122"), PathAttributes::default());
    assert!(out.is_empty(), "{out:?}");
    assert!(r.adj_out(PeerId(2)).is_empty());
}

#[test]
fn ipv4_routes_over_extended_next_hop_use_ipv6_next_hops_only_where_the_peer_takes_them() {
    let mut r = rib();
    // Peer 2: an IPv6 session whose peer takes IPv6 next hops for IPv4 (RFC 8950); our
    // next hop there is the global address alone (as the speaker makes it).
    let enh = PeerInfo {
        next_hop_v4: Some(NextHop::V6 {
            global: v6("fd99::1"),
            link_local: None,
        }),
        ..peer6(2, 65000)
    };
    r.peer_up(enh);
    // Peer 3: a plain IPv4 iBGP session; peer 4: an IPv4 iBGP session that takes IPv6 next
    // hops.
    r.peer_up(peer(3, 64512));
    r.peer_up(PeerInfo {
        next_hop_v4: enh.next_hop_v4,
        ..peer(4, 64512)
    });
    let out = r.announce(pfx("10.10.1.0/24"), PathAttributes::default());
    assert_eq!(announced_nh(&out, 2), enh.next_hop_v4);
    assert_eq!(
        announced_nh(&out, 3),
        Some(NextHop::V4(Ipv4Addr::new(10, 0, 0, 1)))
    );
    // A route learned from peer 2 with an IPv6 next hop: peer 3 cannot use that next hop,
    // and we cannot forward IPv4 via IPv6 ourselves: it is not told; peer 4 gets it as is.
    let theirs = PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::from_sequence([Asn(65000)])),
        mp_next_hop: Some(NextHop::V6 {
            global: v6("fd99::2"),
            link_local: None,
        }),
        ..PathAttributes::default()
    };
    let out = r.update(PeerId(2), Some(theirs), &[pfx("10.20.1.0/24")], &[]);
    assert!(!out.contains_key(&PeerId(3)), "{out:?}");
    assert!(
        r.adj_out(PeerId(3))
            .iter()
            .all(|x| x.prefix != pfx("10.20.1.0/24"))
    );
    assert_eq!(
        announced_nh(&out, 4),
        Some(NextHop::V6 {
            global: v6("fd99::2"),
            link_local: None
        })
    );
    let best = r.best(&pfx("10.20.1.0/24")).unwrap().1;
    assert_eq!(
        next_hop_addr(best),
        Some(IpAddr::V6(v6("fd99::2"))),
        "the Loc-RIB keeps the received IPv6 next hop"
    );
}

#[test]
fn loc_rib_counts_within_a_prefix_without_listing() {
    let mut r = rib();
    r.peer_up(peer(2, 64512));
    let ps = [pfx("10.1.0.0/26"), pfx("10.1.0.64/26"), pfx("10.2.0.0/26")];
    r.update(PeerId(2), Some(attrs(&[], Some(100))), &ps, &[]);
    let within = |s: &str| Some(Prefix::V4(pfx(s)));
    assert_eq!(r.loc_count(None), 3);
    assert_eq!(r.loc_count(within("10.1.0.0/16")), 2);
    assert_eq!(r.loc_count(within("10.2.0.0/26")), 1);
    assert_eq!(r.loc_count(within("10.3.0.0/16")), 0);
    let v6: Ipv6Prefix = "fd00::/8".parse().unwrap();
    assert_eq!(r.loc_count(Some(Prefix::V6(v6))), 0);
}

/// An Adj-RIB-Out is a bit per Loc-RIB prefix: a peer sent nothing (here: every route came
/// from that peer itself, back after a graceful restart) holds nothing; one sent a table holds
/// its bits and gets the table again on request.
#[test]
fn adj_rib_out_holds_a_bit_per_route_sent() {
    let mut r = rib();
    r.peer_up(peer(2, 65000));
    let routes: Vec<Ipv4Prefix> = (0..4096u32)
        .map(|i| Ipv4Prefix::new(Ipv4Addr::from(0x0B00_0000 + (i << 6)), 26).unwrap())
        .collect();
    r.update(PeerId(2), Some(attrs(&[65000], None)), &routes, &[]);
    assert_eq!(r.loc_len(), 4096);
    r.peer_down_graceful(PeerId(2));
    let sent = r.peer_up(peer(2, 65000));
    assert!(
        sent.is_empty(),
        "routes went back to the peer they came from"
    );
    let adj = r.peers[&PeerId(2)].adj_out.as_ref().unwrap();
    assert_eq!((adj.len(), adj.bits.len()), (0, 0));
    let sent = r.peer_up(peer(3, 65001));
    assert_eq!(
        sent.announce.iter().map(|(_, p)| p.len()).sum::<usize>(),
        4096
    );
    assert_eq!(r.counts(PeerId(3)).2, 4096);
    assert_eq!(
        r.peers[&PeerId(3)].adj_out.as_ref().unwrap().bits.len(),
        4096 / 64
    );
    assert_eq!(r.refresh(PeerId(3)).announced(), 4096);
    // Half withdrawn: the bits follow, and the slots are used again for new prefixes.
    let out = r.update(PeerId(2), None, &[], &routes[..2048]);
    assert_eq!(out[&PeerId(3)].withdraw.len(), 2048);
    assert_eq!(r.counts(PeerId(3)).2, 2048);
    let more: Vec<Ipv4Prefix> = (0..2048u32)
        .map(|i| Ipv4Prefix::new(Ipv4Addr::from(0x0C00_0000 + (i << 6)), 26).unwrap())
        .collect();
    r.update(PeerId(2), Some(attrs(&[65000], None)), &more, &[]);
    assert_eq!(r.counts(PeerId(3)).2, 4096);
    assert_eq!(
        r.peers[&PeerId(3)].adj_out.as_ref().unwrap().bits.len(),
        4096 / 64
    );
    assert_eq!(r.adj_out(PeerId(3)).len(), 4096);
}

/// A fresh peer is sent the whole table in prefix order, whatever order the Loc-RIB holds it
/// in: each attribute set's prefixes sorted, the groups by their first prefix.
#[test]
fn a_fresh_peer_gets_the_table_in_prefix_order() {
    let mut r = rib();
    r.peer_up(peer(2, 65000));
    // Three attribute sets, interleaved, learned in a scrambled order.
    let mut all = Vec::new();
    for i in (0u32..300).map(|i| (i * 7919) % 300) {
        let p = Ipv4Prefix::new(Ipv4Addr::from(0x0a00_0000 | (i << 8)), 24).unwrap();
        let mut a = attrs(&[65000], None);
        a.med = Some(i % 3);
        r.update(PeerId(2), Some(a), &[p], &[]);
        all.push(p);
    }
    let sent = r.peer_up(peer(3, 65001));
    assert!(sent.withdraw.is_empty());
    assert_eq!(sent.announce.len(), 3, "one group per attribute set");
    for (_, prefixes) in &sent.announce {
        assert!(prefixes.is_sorted(), "a group out of prefix order");
    }
    let firsts: Vec<_> = sent.announce.iter().map(|(_, p)| p[0]).collect();
    assert!(firsts.is_sorted(), "groups out of order: {firsts:?}");
    let mut got: Vec<_> = sent
        .announce
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    got.sort_unstable();
    all.sort_unstable();
    assert_eq!(got, all, "every prefix exactly once");
}
