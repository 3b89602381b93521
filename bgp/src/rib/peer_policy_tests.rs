//! Per-peer filters (`BGPFilter`), advertised communities, service addresses and the
//! session options (`local as`, `allow local as`, `next hop self|keep`) through the RIB.
//!
//! Why this file is long: each of the peer's own settings is checked through the RIB's
//! tables (what each peer is sent, with which attributes), plus two randomised comparisons
//! against a reference evaluation written here.

use super::*;
use bgp_wire::LargeCommunity;
use ipnet::IpNet;

use crate::policy::{FilterRule, IfName, MatchOperator, PeerFilters, PolicyInputs, PolicyPool};

const LOCAL_AS: Asn = Asn(64512);
/// Our address on every session (`peer`'s next hop of ours).
const OURS: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The next hop external peers send.
const THEIRS: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const CLUSTER_ID: Ipv4Addr = Ipv4Addr::new(244, 0, 0, 1);

fn pfx(s: &str) -> Ipv4Prefix {
    let (a, l) = s.split_once('/').unwrap();
    Ipv4Prefix::new(a.parse().unwrap(), l.parse().unwrap()).unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// An external peer (ToR, configured peer) at 10.0.0.n.
fn peer(n: u8, asn: u32) -> PeerInfo {
    PeerInfo {
        id: PeerId(u32::from(n)),
        address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
        asn: Asn(asn),
        router_id: Ipv4Addr::new(10, 0, 0, n),
        next_hop_v4: Some(NextHop::V4(OURS)),
        next_hop_v6: None,
        local_link_local: None,
        class: PeerClass::External,
        rr_client: false,
        options: Default::default(),
    }
}

/// Another node of the cluster (full mesh, our AS).
fn mesh(n: u8) -> PeerInfo {
    PeerInfo {
        class: PeerClass::Cluster,
        ..peer(n, LOCAL_AS.0)
    }
}

fn with(mut p: PeerInfo, f: impl FnOnce(&mut PeerOptions)) -> PeerInfo {
    f(&mut p.options);
    p
}

/// A received route.
fn attrs(path: &[u32], nh: Ipv4Addr, lp: Option<u32>) -> PathAttributes {
    PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::from_sequence(path.iter().map(|a| Asn(*a)))),
        next_hop: Some(nh),
        local_pref: lp,
        ..PathAttributes::default()
    }
}

/// A route we originate: next hop and AS path are set per peer.
fn own() -> PathAttributes {
    PathAttributes {
        origin: Some(Origin::Igp),
        ..PathAttributes::default()
    }
}

fn rib() -> Rib {
    Rib::new(LOCAL_AS, OURS)
}

fn path(a: &PathAttributes) -> Vec<u32> {
    a.as_path
        .iter()
        .flat_map(|p| p.segments())
        .flat_map(|s| s.asns.iter().map(|a| a.0))
        .collect()
}

/// What the generated policy is made from: one pool, our two blocks, and the peer parts.
#[derive(Default)]
struct Setup {
    filters: Vec<(IpAddr, PeerFilters)>,
    services: Vec<IpNet>,
    adverts: Vec<Advertisement>,
    transit: bool,
}

impl Setup {
    fn policy(&self) -> Arc<Policy> {
        let pools = [PolicyPool::new("default", net("172.20.0.0/16"))];
        let own = [net("172.20.1.0/26"), net("172.20.1.64/26")];
        Arc::new(Policy::generate(&PolicyInputs {
            pools: &pools,
            own_blocks: &own,
            external_transit: self.transit,
            program_external_routes: true,
            services: &self.services,
            advertisements: &self.adverts,
            peer_filters: &self.filters,
            ..Default::default()
        }))
    }

    fn filter(mut self, p: &PeerInfo, f: PeerFilters) -> Self {
        self.filters.push((p.address, f));
        self
    }
}

fn rule(cidr: &str, op: MatchOperator, accept: bool) -> FilterRule {
    let n = net(cidr);
    let mut r = FilterRule::new("f", "exportV4[0]", n.addr().is_ipv6(), accept);
    r.cidr = Some((n, op));
    r
}

fn export_only(rules: Vec<FilterRule>) -> PeerFilters {
    PeerFilters {
        import: Vec::new(),
        export: rules,
    }
}

fn import_only(rules: Vec<FilterRule>) -> PeerFilters {
    PeerFilters {
        import: rules,
        export: Vec::new(),
    }
}

/// What each peer has been told, applying the RIB's updates as a session sends them.
#[derive(Default)]
struct Told(BTreeMap<u32, BTreeMap<Ipv4Prefix, Attrs>>);

impl Told {
    fn one(&mut self, id: PeerId, u: OutUpdate) {
        let t = self.0.entry(id.0).or_default();
        for p in u.withdraw {
            t.remove(&p);
        }
        for (a, ps) in u.announce {
            for p in ps {
                t.insert(p, a.clone());
            }
        }
    }
    fn all(&mut self, out: HashMap<PeerId, OutUpdate>) {
        for (id, u) in out {
            self.one(id, u);
        }
    }
    fn up(&mut self, r: &mut Rib, p: PeerInfo) {
        let u = r.peer_up(p);
        self.one(p.id, u);
    }
    fn prefixes(&self, id: u32) -> Vec<Ipv4Prefix> {
        self.0
            .get(&id)
            .map(|t| t.keys().copied().collect())
            .unwrap_or_default()
    }
    fn attrs(&self, id: u32, p: &str) -> Attrs {
        self.0[&id][&pfx(p)].clone()
    }
}

fn keys(out: &HashMap<PeerId, OutUpdate>) -> Vec<u32> {
    let mut k: Vec<u32> = out.keys().map(|p| p.0).collect();
    k.sort();
    k
}

fn announced(out: &HashMap<PeerId, OutUpdate>, id: u32) -> Vec<Ipv4Prefix> {
    let mut v: Vec<Ipv4Prefix> = out
        .get(&PeerId(id))
        .map(|u| u.announce.iter().flat_map(|(_, ps)| ps.clone()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn withdrawn(out: &HashMap<PeerId, OutUpdate>, id: u32) -> Vec<Ipv4Prefix> {
    let mut v = out
        .get(&PeerId(id))
        .map(|u| u.withdraw.clone())
        .unwrap_or_default();
    v.sort();
    v
}

fn sent(r: &Rib, id: u32) -> Vec<Ipv4Prefix> {
    r.adj_out(PeerId(id))
        .into_iter()
        .map(|x| x.prefix)
        .collect()
}

fn loc(r: &Rib) -> Vec<Ipv4Prefix> {
    r.loc_rib().map(|x| x.prefix).collect()
}

fn pfxs(v: &[&str]) -> Vec<Ipv4Prefix> {
    v.iter().map(|s| pfx(s)).collect()
}

// 1. An export filter on one ToR.

#[test]
fn an_export_filter_on_one_tor_keeps_the_block_from_it_only() {
    let (a, b) = (peer(4, 65000), peer(5, 65001));
    let pol = Setup::default()
        .filter(
            &a,
            export_only(vec![rule("172.20.1.0/26", MatchOperator::Equal, false)]),
        )
        .policy();
    let mut r = rib();
    let _ = r.set_policy(pol, None);
    for p in [mesh(2), mesh(3), a, b] {
        r.peer_up(p);
    }
    let out = r.announce(pfx("172.20.1.0/26"), own());
    assert_eq!(keys(&out), vec![2, 3, 5], "{out:?}");
    // Inside the filtered block but not it (Equal, not In), and our other block: to A too.
    let out = r.announce(pfx("172.20.1.0/27"), own());
    assert_eq!(keys(&out), vec![2, 3, 4, 5]);
    let out = r.announce(pfx("172.20.1.64/26"), own());
    assert_eq!(keys(&out), vec![2, 3, 4, 5]);
    let all = pfxs(&["172.20.1.0/26", "172.20.1.0/27", "172.20.1.64/26"]);
    assert_eq!(sent(&r, 4), pfxs(&["172.20.1.0/27", "172.20.1.64/26"]));
    for id in [2, 3, 5] {
        assert_eq!(sent(&r, id), all, "peer {id}");
    }
    assert_eq!(r.counts(PeerId(4)).2, 2);
    // A fresh session to A gets the same table.
    r.peer_down(PeerId(4));
    let fresh = r.peer_up(a);
    let got: Vec<Ipv4Prefix> = fresh.announce.iter().flat_map(|(_, p)| p.clone()).collect();
    assert_eq!(got, pfxs(&["172.20.1.0/27", "172.20.1.64/26"]));
    // And B's attributes are the generated export's: our AS, our next hop.
    let b_attrs = &r.adj_out(PeerId(5))[0].attrs;
    assert_eq!(path(b_attrs), vec![64512]);
    assert_eq!(b_attrs.next_hop, Some(OURS));
}

// 2. An export filter's Accept comes before the generated rules.

#[test]
fn an_export_filter_accept_comes_before_the_generated_rules() {
    let (a, b) = (peer(4, 65000), peer(5, 65001));
    let pol = Setup::default()
        .filter(
            &a,
            export_only(vec![rule("172.20.2.0/26", MatchOperator::Equal, true)]),
        )
        .policy();
    // The generated rules alone would not send another node's block to a ToR.
    let src = RouteSource::Peer(PeerClass::Cluster);
    let p2 = pfx("172.20.2.0/26").any();
    let vb = pol.export_verdict(&b.policy_ref(), p2, src, None);
    assert!(!vb.accept);
    assert!(
        vb.describe().1.contains("cluster routes are announced"),
        "{vb:?}"
    );
    let va = pol.export_verdict(&a.policy_ref(), p2, src, None);
    assert!(va.accept && matches!(va.by, Decider::Filter(_)), "{va:?}");

    let mut r = rib();
    let _ = r.set_policy(pol, None);
    for p in [mesh(2), mesh(3), a, b] {
        r.peer_up(p);
    }
    let nh = Ipv4Addr::new(10, 0, 0, 2);
    let out = r.update(
        PeerId(2),
        Some(attrs(&[], nh, Some(100))),
        &pfxs(&["172.20.2.0/26", "172.20.3.0/26"]),
        &[],
    );
    assert_eq!(keys(&out), vec![4], "only A: {out:?}");
    assert_eq!(announced(&out, 4), pfxs(&["172.20.2.0/26"]));
    let e = &out[&PeerId(4)].announce[0].0;
    assert_eq!(path(e), vec![64512]);
    assert_eq!(e.next_hop, Some(OURS), "Auto: ours to eBGP");
    assert_eq!(e.local_pref, None);
    assert_eq!(r.loc_len(), 2);
}

// 3. An import filter with In and length bounds.

#[test]
fn an_import_filter_rejects_in_its_bounds_from_that_peer_only() {
    let (a, b) = (peer(4, 65000), peer(5, 65001));
    let mut reject = rule("10.50.0.0/16", MatchOperator::In, false);
    reject.min_len = Some(24);
    reject.max_len = Some(26);
    let pol = Setup::default()
        .filter(&a, import_only(vec![reject]))
        .policy();
    let mut r = rib();
    let _ = r.set_policy(pol, None);
    r.peer_up(a);
    r.peer_up(b);
    let sent = pfxs(&[
        "10.50.0.0/16",
        "10.50.1.0/24",
        "10.50.2.0/26",
        "10.50.3.0/27",
        "10.60.0.0/24",
    ]);
    r.update(PeerId(4), Some(attrs(&[65000], THEIRS, None)), &sent, &[]);
    assert_eq!(
        loc(&r),
        pfxs(&["10.50.0.0/16", "10.50.3.0/27", "10.60.0.0/24"])
    );
    assert_eq!(r.counts(PeerId(4)), (5, 3, 0));
    // The same prefixes from B: all taken, and B's is best where A's was refused.
    r.update(PeerId(5), Some(attrs(&[65001], THEIRS, None)), &sent, &[]);
    assert_eq!(loc(&r), sent);
    assert_eq!(r.counts(PeerId(5)), (5, 5, 0));
    assert_eq!(r.counts(PeerId(4)), (5, 3, 0));
    for p in ["10.50.1.0/24", "10.50.2.0/26"] {
        assert_eq!(r.best(&pfx(p)).map(|x| x.0), Some(Source::Peer(PeerId(5))));
    }
    // B withdraws: A's refused routes do not come back.
    r.update(PeerId(5), None, &[], &sent);
    assert_eq!(
        loc(&r),
        pfxs(&["10.50.0.0/16", "10.50.3.0/27", "10.60.0.0/24"])
    );
}

#[test]
fn interface_rules_use_the_session_interface_on_import_and_the_source_on_export() {
    let eth = |p| with(p, |o| o.interface = IfName::new("eth0"));
    let ens = |p| with(p, |o| o.interface = IfName::new("ens5"));
    let (a, b, c) = (
        eth(peer(4, 65000)),
        ens(peer(5, 65001)),
        ens(peer(6, 65002)),
    );
    let mut on_eth = FilterRule::new("f", "importV4[0]", false, false);
    on_eth.interface = Some("eth*".into());
    let both = PeerFilters {
        import: vec![on_eth.clone()],
        export: Vec::new(),
    };
    let pol = Setup {
        transit: true,
        ..Default::default()
    }
    .filter(&a, both.clone())
    .filter(&b, both)
    .filter(&c, export_only(vec![on_eth]))
    .policy();
    let mut r = rib();
    let _ = r.set_policy(pol, None);
    let mut told = Told::default();
    for p in [a, b, c] {
        told.up(&mut r, p);
    }
    told.all(r.update(
        PeerId(4),
        Some(attrs(&[65000], THEIRS, None)),
        &[pfx("10.80.0.0/24")],
        &[],
    ));
    told.all(r.update(
        PeerId(5),
        Some(attrs(&[65001], THEIRS, None)),
        &[pfx("10.81.0.0/24")],
        &[],
    ));
    // A's session is on eth0: its route is refused; B's (ens5) is not.
    assert_eq!(loc(&r), pfxs(&["10.81.0.0/24"]));
    let (received, accepted, _) = r.counts(PeerId(4));
    assert_eq!((received, accepted), (1, 0));
    // C's export filter refuses routes through eth*: B's route came through ens5.
    assert_eq!(told.prefixes(6), pfxs(&["10.81.0.0/24"]));
    // Originated routes come through no interface: the rule does not match them.
    told.all(r.announce(pfx("172.20.1.0/26"), own()));
    assert_eq!(told.prefixes(6), pfxs(&["10.81.0.0/24", "172.20.1.0/26"]));
    // A route from a session on eth0 that A's import accepts (no filter on D), to C: refused.
    let d = eth(peer(7, 65003));
    told.up(&mut r, d);
    told.all(r.update(
        PeerId(7),
        Some(attrs(&[65003], THEIRS, None)),
        &[pfx("10.82.0.0/24")],
        &[],
    ));
    assert!(loc(&r).contains(&pfx("10.82.0.0/24")));
    assert_eq!(told.prefixes(6), pfxs(&["10.81.0.0/24", "172.20.1.0/26"]));
    assert!(
        told.prefixes(5).contains(&pfx("10.82.0.0/24")),
        "no filter on B's export"
    );
}

// 4. Changing the filters through set_policy.

fn three_blocks(filter_on_a: &str) -> (Rib, Told) {
    let mut r = rib();
    let _ = r.set_policy(blocks_policy(filter_on_a), None);
    let mut told = Told::default();
    for p in [mesh(2), peer(4, 65000), peer(5, 65001)] {
        told.up(&mut r, p);
    }
    for p in ["172.20.1.0/26", "172.20.1.64/26", "172.20.1.128/26"] {
        told.all(r.announce(pfx(p), own()));
    }
    (r, told)
}

fn blocks_policy(filter_on_a: &str) -> Arc<Policy> {
    Setup::default()
        .filter(
            &peer(4, 65000),
            export_only(vec![rule(filter_on_a, MatchOperator::Equal, false)]),
        )
        .policy()
}

#[test]
fn changing_a_peers_export_filter_withdraws_and_announces_what_it_changed() {
    let (mut r, mut told) = three_blocks("172.20.1.0/26");
    assert_eq!(
        told.prefixes(4),
        pfxs(&["172.20.1.64/26", "172.20.1.128/26"])
    );
    let out = r.set_policy(blocks_policy("172.20.1.64/26"), None);
    assert_eq!(withdrawn(&out, 4), pfxs(&["172.20.1.64/26"]), "{out:?}");
    assert!(
        announced(&out, 4).contains(&pfx("172.20.1.0/26")),
        "{out:?}"
    );
    assert!(!announced(&out, 4).contains(&pfx("172.20.1.64/26")));
    for id in [2, 5] {
        assert!(withdrawn(&out, id).is_empty(), "peer {id}: {out:?}");
    }
    told.all(out);
    let now = pfxs(&["172.20.1.0/26", "172.20.1.128/26"]);
    assert_eq!(told.prefixes(4), now);
    assert_eq!(sent(&r, 4), now);
    assert_eq!(r.counts(PeerId(4)).2, 2);
    let all = pfxs(&["172.20.1.0/26", "172.20.1.64/26", "172.20.1.128/26"]);
    assert_eq!(told.prefixes(2), all);
    assert_eq!(told.prefixes(5), all);
    // No filters at all: the last block goes to A again.
    let out = r.set_policy(Setup::default().policy(), None);
    assert!(withdrawn(&out, 4).is_empty());
    assert!(announced(&out, 4).contains(&pfx("172.20.1.64/26")));
    told.all(out);
    assert_eq!(told.prefixes(4), all);
    assert_eq!(sent(&r, 4), all);
}

/// Only the filtered peer is told anything: its Adj-RIB-Out is sent again (what it already
/// holds too, as a route refresh would: the one-bit Adj-RIB-Out does not remember what the
/// old filters gave), the withdrawal is exact, and peers without filters get nothing.
#[test]
fn a_filter_change_tells_only_the_filtered_peer_and_only_what_changed() {
    let (mut r, _) = three_blocks("172.20.1.0/26");
    let out = r.set_policy(blocks_policy("172.20.1.64/26"), None);
    assert_eq!(
        announced(&out, 4),
        pfxs(&["172.20.1.0/26", "172.20.1.128/26"]),
        "{out:?}"
    );
    assert_eq!(withdrawn(&out, 4), pfxs(&["172.20.1.64/26"]));
    assert_eq!(keys(&out), vec![4], "nothing to other peers: {out:?}");
}

#[test]
fn changing_a_peers_import_filter_reaches_the_loc_rib_and_other_peers() {
    let a = peer(4, 65000);
    let import = |p: &str| {
        Setup {
            transit: true,
            ..Default::default()
        }
        .filter(&a, import_only(vec![rule(p, MatchOperator::Equal, false)]))
        .policy()
    };
    let mut r = rib();
    let _ = r.set_policy(import("10.50.1.0/24"), None);
    let mut told = Told::default();
    for p in [mesh(2), a, peer(5, 65001)] {
        told.up(&mut r, p);
    }
    told.all(r.update(
        PeerId(4),
        Some(attrs(&[65000], THEIRS, None)),
        &pfxs(&["10.50.1.0/24", "10.50.2.0/24"]),
        &[],
    ));
    assert_eq!(loc(&r), pfxs(&["10.50.2.0/24"]));
    assert_eq!(told.prefixes(5), pfxs(&["10.50.2.0/24"]));
    let out = r.set_policy(import("10.50.2.0/24"), None);
    assert_eq!(withdrawn(&out, 5), pfxs(&["10.50.2.0/24"]), "{out:?}");
    assert_eq!(announced(&out, 5), pfxs(&["10.50.1.0/24"]));
    // Not back to A, and not to the mesh (outside the pools).
    assert_eq!(keys(&out), vec![5]);
    assert_eq!(loc(&r), pfxs(&["10.50.1.0/24"]));
    assert_eq!(r.counts(PeerId(4)), (2, 1, 0));
    told.all(out);
    assert_eq!(told.prefixes(5), sent(&r, 5));
}

// 5. Advertised communities.

fn c(low: u16) -> Community {
    Community::new(65000, low)
}

fn lc(n: u32) -> LargeCommunity {
    LargeCommunity {
        global_admin: 64512,
        local1: n,
        local2: n,
    }
}

fn advertisements() -> Vec<Advertisement> {
    vec![
        Advertisement {
            cidr: net("172.20.0.0/16"),
            communities: vec![c(100)],
            large_communities: vec![lc(1)],
        },
        Advertisement {
            cidr: net("172.20.1.0/24"),
            communities: vec![c(200)],
            large_communities: Vec::new(),
        },
    ]
}

#[test]
fn advertisements_add_communities_inside_their_cidr_on_every_session() {
    let (a, b) = (peer(4, 65000), peer(5, 65001));
    let pol = Setup {
        adverts: advertisements(),
        ..Default::default()
    }
    .filter(
        &a,
        export_only(vec![rule("172.20.1.0/26", MatchOperator::Equal, true)]),
    )
    .policy();
    let mut r = rib();
    let _ = r.set_policy(pol, None);
    let mut told = Told::default();
    for p in [mesh(2), a, b] {
        told.up(&mut r, p);
    }
    told.all(r.announce(pfx("172.20.1.0/26"), own()));
    let mut tagged = own();
    tagged.communities = vec![c(7), c(100)];
    told.all(r.announce(pfx("172.20.5.0/26"), tagged));
    told.all(r.announce(pfx("10.77.0.0/24"), own()));
    for id in [2, 5] {
        // Inside both: both advertisements, in their order.
        let x = told.attrs(id, "172.20.1.0/26");
        assert_eq!(x.communities, vec![c(100), c(200)], "peer {id}");
        assert_eq!(x.large_communities, vec![lc(1)], "peer {id}");
        // Inside the outer one only; a community the route has is not added twice.
        let x = told.attrs(id, "172.20.5.0/26");
        assert_eq!(x.communities, vec![c(7), c(100)], "peer {id}");
        assert_eq!(x.large_communities, vec![lc(1)], "peer {id}");
        // Outside every CIDR.
        let x = told.attrs(id, "10.77.0.0/24");
        assert!(x.communities.is_empty() && x.large_communities.is_empty());
    }
    // A's own filter accepted 172.20.1.0/26: nothing added there, for A only.
    let x = told.attrs(4, "172.20.1.0/26");
    assert!(x.communities.is_empty(), "{x:?}");
    assert!(x.large_communities.is_empty(), "{x:?}");
    let x = told.attrs(4, "172.20.5.0/26");
    assert_eq!(x.communities, vec![c(7), c(100)]);
    assert_eq!(x.large_communities, vec![lc(1)]);
    // What the tables say they sent is what was sent.
    for id in [2, 4, 5] {
        for route in r.adj_out(PeerId(id)) {
            assert_eq!(
                route.attrs, told.0[&id][&route.prefix],
                "peer {id} {}",
                route.prefix
            );
        }
    }
}

#[test]
fn changing_advertisements_reannounces_the_routes_inside_with_the_new_communities() {
    let mut r = rib();
    let _ = r.set_policy(Setup::default().policy(), None);
    let mut told = Told::default();
    for p in [mesh(2), peer(5, 65001)] {
        told.up(&mut r, p);
    }
    told.all(r.announce(pfx("172.20.1.0/26"), own()));
    told.all(r.announce(pfx("10.77.0.0/24"), own()));
    assert!(told.attrs(2, "172.20.1.0/26").communities.is_empty());
    let with_adverts = Setup {
        adverts: advertisements(),
        ..Default::default()
    }
    .policy();
    let out = r.set_policy(with_adverts, None);
    for id in [2, 5] {
        assert!(
            announced(&out, id).contains(&pfx("172.20.1.0/26")),
            "peer {id}: {out:?}"
        );
        assert!(withdrawn(&out, id).is_empty());
    }
    told.all(out);
    for id in [2, 5] {
        assert_eq!(
            told.attrs(id, "172.20.1.0/26").communities,
            vec![c(100), c(200)]
        );
        assert!(told.attrs(id, "10.77.0.0/24").communities.is_empty());
    }
    // And gone again.
    told.all(r.set_policy(Setup::default().policy(), None));
    for id in [2, 5] {
        assert!(told.attrs(id, "172.20.1.0/26").communities.is_empty());
        assert!(told.attrs(id, "172.20.1.0/26").large_communities.is_empty());
    }
}

// 6. Service addresses.

#[test]
fn service_addresses_go_to_external_peers_only_and_so_does_their_withdrawal() {
    let pol = Setup {
        services: vec![net("10.96.0.0/12")],
        ..Default::default()
    }
    .policy();
    let mut r = rib();
    let _ = r.set_policy(pol, None);
    for p in [mesh(2), mesh(3), peer(4, 65000), peer(5, 65001)] {
        r.peer_up(p);
    }
    let svc = pfx("10.96.0.10/32");
    let out = r.announce(svc, own());
    assert_eq!(keys(&out), vec![4, 5], "{out:?}");
    for id in [4, 5] {
        assert_eq!(announced(&out, id), vec![svc]);
        let e = &out[&PeerId(id)].announce[0].0;
        assert_eq!(path(e), vec![64512]);
        assert_eq!(e.next_hop, Some(OURS));
    }
    // A block still goes everywhere.
    let out = r.announce(pfx("172.20.1.0/26"), own());
    assert_eq!(keys(&out), vec![2, 3, 4, 5]);
    // A mesh peer coming up is not sent the service address either.
    let fresh = r.peer_up(mesh(6));
    let got: Vec<Ipv4Prefix> = fresh.announce.iter().flat_map(|(_, p)| p.clone()).collect();
    assert_eq!(got, pfxs(&["172.20.1.0/26"]));
    let out = r.withdraw(svc).unwrap();
    assert_eq!(keys(&out), vec![4, 5], "{out:?}");
    for id in [4, 5] {
        assert_eq!(withdrawn(&out, id), vec![svc]);
        assert!(announced(&out, id).is_empty());
    }
    for id in [4, 5] {
        assert_eq!(sent(&r, id), pfxs(&["172.20.1.0/26"]));
    }
}

// 7. local_as.

#[test]
fn local_as_is_what_we_prepend_and_decides_ebgp_or_ibgp() {
    let a = with(peer(4, 65000), |o| o.local_as = Some(Asn(65010)));
    let b = peer(5, 65001);
    let c = with(peer(6, 65100), |o| o.local_as = Some(Asn(65100)));
    let pol = Setup {
        transit: true,
        ..Default::default()
    }
    .policy();
    let mut r = rib();
    let _ = r.set_policy(pol, None);
    let mut told = Told::default();
    for p in [a, b, c] {
        told.up(&mut r, p);
    }
    told.all(r.announce(pfx("172.20.1.0/26"), own()));
    let mut learned = attrs(&[65001], THEIRS, None);
    learned.med = Some(5);
    told.all(r.update(PeerId(5), Some(learned), &[pfx("10.60.0.0/24")], &[]));

    let x = told.attrs(4, "172.20.1.0/26");
    assert_eq!(path(&x), vec![65010], "the session's AS, not the RIB's");
    assert_eq!(x.local_pref, None);
    assert_eq!(
        told.attrs(5, "172.20.1.0/26").as_path,
        Some(AsPath::from_sequence([LOCAL_AS]))
    );
    let x = told.attrs(4, "10.60.0.0/24");
    assert_eq!(path(&x), vec![65010, 65001]);
    assert_eq!((x.next_hop, x.med), (Some(OURS), None));

    // local_as equal to the peer's AS: an iBGP session.
    let x = told.attrs(6, "172.20.1.0/26");
    assert_eq!(path(&x), Vec::<u32>::new(), "no prepend on iBGP");
    assert_eq!(x.local_pref, Some(DEFAULT_LOCAL_PREF));
    assert_eq!(x.next_hop, Some(OURS));
    let x = told.attrs(6, "10.60.0.0/24");
    assert_eq!(path(&x), vec![65001]);
    assert_eq!(x.local_pref, Some(DEFAULT_LOCAL_PREF));
    assert_eq!((x.next_hop, x.med), (Some(THEIRS), Some(5)), "kept on iBGP");

    // The loop check of that iBGP session does not apply: its AS in the path is fine.
    r.update(
        PeerId(6),
        Some(attrs(&[65100, 65200], THEIRS, Some(100))),
        &[pfx("10.61.0.0/24")],
        &[],
    );
    let (received, accepted, _) = r.counts(PeerId(6));
    assert_eq!((received, accepted), (1, 1));
    assert!(loc(&r).contains(&pfx("10.61.0.0/24")));
}

/// A peer whose AS is the RIB's, reached with `local_as` set to another AS, is an eBGP
/// session everywhere (split horizon, the fresh session's table, what it is sent).
#[test]
fn a_peer_in_our_as_reached_with_another_local_as_is_an_ebgp_session() {
    let d = with(peer(7, LOCAL_AS.0), |o| o.local_as = Some(Asn(65010)));
    let mut r = rib();
    r.peer_up(mesh(2));
    r.peer_up(d);
    let out = r.update(
        PeerId(2),
        Some(attrs(&[], Ipv4Addr::new(10, 0, 0, 2), Some(100))),
        &[pfx("10.70.0.0/24")],
        &[],
    );
    assert_eq!(announced(&out, 7), pfxs(&["10.70.0.0/24"]), "{out:?}");
    let e = &out[&PeerId(7)].announce[0].0;
    assert_eq!(path(e), vec![65010]);
    assert_eq!((e.next_hop, e.local_pref), (Some(OURS), None));
    // A fresh session to it gets the mesh's route too.
    r.peer_down(PeerId(7));
    let fresh = r.peer_up(d);
    assert_eq!(fresh.announced(), 1, "{fresh:?}");
}

/// The decision process's "eBGP over iBGP" step asks the session's AS: a session made iBGP
/// by local_as loses to a real eBGP route.
#[test]
fn a_route_from_an_ibgp_session_by_local_as_loses_to_an_ebgp_route() {
    let c = with(peer(3, 65100), |o| o.local_as = Some(Asn(65100)));
    let b = peer(5, 65001);
    let mut r = rib();
    r.peer_up(c);
    r.peer_up(b);
    let p = pfx("10.90.0.0/24");
    // Equal up to the eBGP/iBGP step: LOCAL_PREF (100 either way), path length, origin, and
    // no MED comparison (different neighbouring AS).
    r.update(
        PeerId(3),
        Some(attrs(&[65300], THEIRS, Some(100))),
        &[p],
        &[],
    );
    r.update(PeerId(5), Some(attrs(&[65001], THEIRS, None)), &[p], &[]);
    assert_eq!(r.best(&p).map(|x| x.0), Some(Source::Peer(PeerId(5))));
}

// 8. allow_local_as.

#[test]
fn allow_local_as_lets_our_as_appear_that_many_times() {
    let once = pfx("10.1.1.0/24");
    let twice = pfx("10.1.2.0/24");
    for (allow, want) in [(0u8, vec![]), (1, vec![once]), (2, vec![once, twice])] {
        let a = with(peer(4, 65000), |o| o.allow_local_as = allow);
        let mut r = rib();
        r.peer_up(a);
        r.update(
            PeerId(4),
            Some(attrs(&[65000, 64512], THEIRS, None)),
            &[once],
            &[],
        );
        r.update(
            PeerId(4),
            Some(attrs(&[65000, 64512, 65005, 64512], THEIRS, None)),
            &[twice],
            &[],
        );
        assert_eq!(loc(&r), want, "allow_local_as {allow}");
        assert_eq!(r.counts(PeerId(4)), (2, want.len() as u64, 0));
    }
    // With local_as, that AS is ours on the session: it is the one counted.
    let a = with(peer(4, 65000), |o| o.local_as = Some(Asn(65010)));
    let mut r = rib();
    r.peer_up(a);
    r.update(
        PeerId(4),
        Some(attrs(&[65000, 65010], THEIRS, None)),
        &[once],
        &[],
    );
    r.update(
        PeerId(4),
        Some(attrs(&[65000, 64512], THEIRS, None)),
        &[twice],
        &[],
    );
    assert_eq!(loc(&r), vec![twice]);
}

// 9. Next hop modes.

#[test]
fn next_hop_keep_keeps_a_learned_routes_next_hop_toward_ebgp() {
    let keep = |p| with(p, |o| o.next_hop = NextHopMode::Keep);
    let (a, b, c) = (keep(peer(4, 65000)), peer(5, 65001), peer(6, 65002));
    let accept_block = export_only(vec![rule("172.20.2.0/26", MatchOperator::In, true)]);
    let pol = Setup {
        transit: true,
        ..Default::default()
    }
    .filter(&a, accept_block.clone())
    .filter(&b, accept_block)
    .policy();
    let mut r = rib();
    let _ = r.set_policy(pol, None);
    let mut told = Told::default();
    for p in [mesh(2), a, b, c] {
        told.up(&mut r, p);
    }
    // From another external peer (transit on).
    told.all(r.update(
        PeerId(6),
        Some(attrs(&[65002], THEIRS, None)),
        &[pfx("10.60.0.0/24")],
        &[],
    ));
    assert_eq!(told.attrs(4, "10.60.0.0/24").next_hop, Some(THEIRS));
    assert_eq!(told.attrs(5, "10.60.0.0/24").next_hop, Some(OURS), "Auto");
    assert_eq!(path(&told.attrs(4, "10.60.0.0/24")), vec![64512, 65002]);
    // From a cluster peer, sent by A's and B's filters.
    let node = Ipv4Addr::new(10, 0, 0, 2);
    told.all(r.update(
        PeerId(2),
        Some(attrs(&[], node, Some(100))),
        &[pfx("172.20.2.0/26")],
        &[],
    ));
    assert_eq!(told.attrs(4, "172.20.2.0/26").next_hop, Some(node));
    assert_eq!(told.attrs(5, "172.20.2.0/26").next_hop, Some(OURS));
    assert!(!told.prefixes(6).contains(&pfx("172.20.2.0/26")));
    // Ours for what we originate.
    told.all(r.announce(pfx("172.20.1.0/26"), own()));
    assert_eq!(told.attrs(4, "172.20.1.0/26").next_hop, Some(OURS));
    // A next hop the peer cannot use (IPv6 for IPv4, no extended next hop): ours.
    let mut v6nh = attrs(&[65002], THEIRS, None);
    v6nh.next_hop = None;
    v6nh.mp_next_hop = Some(NextHop::V6 {
        global: "fd00::5".parse().unwrap(),
        link_local: None,
    });
    told.all(r.update(PeerId(6), Some(v6nh), &[pfx("10.62.0.0/24")], &[]));
    let x = told.attrs(4, "10.62.0.0/24");
    assert_eq!((x.next_hop, x.mp_next_hop), (Some(OURS), None));
}

#[test]
fn next_hop_self_sets_ours_toward_ibgp_peers() {
    let selfnh = |p| with(p, |o| o.next_hop = NextHopMode::SelfNextHop);
    let client = |p: PeerInfo| PeerInfo {
        rr_client: true,
        ..p
    };
    let (c2, c3, c8) = (client(mesh(2)), selfnh(client(mesh(3))), client(mesh(8)));
    let b = peer(5, 65001);
    let mut r = rib();
    let _ = r.set_policy(Setup::default().policy(), Some(CLUSTER_ID));
    let mut told = Told::default();
    for p in [c2, c3, c8, b] {
        told.up(&mut r, p);
    }
    // Reflected from client 2.
    let node = Ipv4Addr::new(10, 0, 0, 2);
    told.all(r.update(
        PeerId(2),
        Some(attrs(&[], node, Some(100))),
        &[pfx("172.20.2.0/26")],
        &[],
    ));
    let x = told.attrs(3, "172.20.2.0/26");
    assert_eq!(x.next_hop, Some(OURS));
    assert_eq!(x.cluster_list, vec![CLUSTER_ID], "still reflected");
    assert_eq!(x.originator_id, Some(node));
    assert_eq!(told.attrs(8, "172.20.2.0/26").next_hop, Some(node), "Auto");
    // Learned from an external peer (inside the pool: sent to the mesh).
    told.all(r.update(
        PeerId(5),
        Some(attrs(&[65001], THEIRS, None)),
        &[pfx("172.20.9.0/26")],
        &[],
    ));
    let x = told.attrs(3, "172.20.9.0/26");
    assert_eq!(x.next_hop, Some(OURS));
    assert_eq!(x.local_pref, Some(DEFAULT_LOCAL_PREF));
    assert_eq!(path(&x), vec![65001]);
    assert_eq!(told.attrs(8, "172.20.9.0/26").next_hop, Some(THEIRS));
    assert_eq!(told.attrs(2, "172.20.9.0/26").next_hop, Some(THEIRS));
}

// 10. Randomised: filters first, generated rules after, against a reference.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// A prefix from a small space, so that rules and routes meet often.
fn random_prefix(rng: &mut Rng, v6: bool) -> Prefix {
    let (a, b, c) = (rng.below(3), rng.below(3), rng.below(4));
    if v6 {
        let len = rng.pick(&[0u8, 16, 31, 32, 33, 48, 64, 100, 128]);
        let addr = format!("fd00:{a}:{b}::{c}")
            .parse::<std::net::Ipv6Addr>()
            .unwrap();
        Prefix::new(IpAddr::V6(addr), len).unwrap()
    } else {
        let len = rng.pick(&[0u8, 8, 15, 16, 17, 20, 24, 25, 26, 27, 32]);
        let addr = Ipv4Addr::new(10, a as u8, b as u8, (c * 64) as u8);
        Prefix::new(IpAddr::V4(addr), len).unwrap()
    }
}

fn random_rule(rng: &mut Rng, i: usize) -> FilterRule {
    let v6 = rng.below(4) == 0;
    let max = if v6 { 128 } else { 32 };
    let mut r = FilterRule::new("f", &format!("rule[{i}]"), v6, rng.below(2) == 0);
    if rng.below(6) != 0 {
        let p = random_prefix(rng, v6);
        let op = rng.pick(&[
            MatchOperator::Equal,
            MatchOperator::NotEqual,
            MatchOperator::In,
            MatchOperator::NotIn,
        ]);
        r.cidr = Some((IpNet::new(p.addr(), p.prefix_len()).unwrap(), op));
    }
    let bound = |rng: &mut Rng| (rng.below(3) == 0).then(|| rng.below(max + 1) as u8);
    r.min_len = bound(rng);
    r.max_len = bound(rng);
    r.from_peers = rng.below(4) == 0;
    if rng.below(4) == 0 {
        r.interface = Some(rng.pick(&["eth*", "eth0", "*", "ens5", "*.calico"]).into());
    }
    r
}

/// The address and length of a prefix as bits, whatever its family, and the family's width.
fn bits(p: IpAddr) -> (u128, u32) {
    match p {
        IpAddr::V4(a) => (u128::from(a.to_bits()), 32),
        IpAddr::V6(a) => (a.to_bits(), 128),
    }
}

fn masked(x: u128, len: u8, width: u32) -> u128 {
    let keep = u32::from(len).min(width);
    if keep == 0 {
        0
    } else {
        x >> (width - keep) << (width - keep)
    }
}

/// Glob as the operator reads it: `*` any run, everything else itself.
fn glob(pat: &[u8], s: &[u8]) -> bool {
    match pat.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((c, rest)) => s.first() == Some(c) && glob(rest, &s[1..]),
    }
}

/// Calico's rule, read from its documentation: the family of the list, the CIDR with the
/// operator (In/NotIn: the CIDR's set with lengths `max(len, min)..=min(width, max)`;
/// Equal/NotEqual: the prefix itself, with the bounds as length conditions), the source,
/// the interface.
fn reference_matches(r: &FilterRule, p: Prefix, src: RouteSource, ifc: Option<&str>) -> bool {
    let (x, width) = bits(p.addr());
    if (width == 128) != r.ipv6 {
        return false;
    }
    let len = p.prefix_len();
    let cidr_ok = match r.cidr {
        None => true,
        Some((c, op)) => {
            let (cn, cw) = bits(c.network());
            assert_eq!(cw, width, "rules are generated in their list's family");
            let cl = c.prefix_len();
            let exact = x == cn && len == cl;
            let len_ok = r.min_len.is_none_or(|m| len >= m) && r.max_len.is_none_or(|m| len <= m);
            let lo = r.min_len.unwrap_or(0).max(cl);
            let hi = r.max_len.map_or(width as u8, |m| m.min(width as u8));
            let in_set = len >= lo && len <= hi && masked(x, cl, width) == cn;
            match op {
                MatchOperator::Equal => exact && len_ok,
                MatchOperator::NotEqual => !exact && len_ok,
                MatchOperator::In => in_set,
                MatchOperator::NotIn => !in_set,
            }
        }
    };
    cidr_ok
        && (!r.from_peers || src != RouteSource::Local)
        && r.interface
            .as_deref()
            .is_none_or(|pat| ifc.is_some_and(|i| glob(pat.as_bytes(), i.as_bytes())))
}

#[test]
fn filter_verdicts_match_a_reference_evaluation_across_random_rules_and_prefixes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let pools = [
        PolicyPool::new("v4", net("10.1.0.0/16")),
        PolicyPool::new("v6", net("fd00:1::/32")),
    ];
    let own = [net("10.1.1.0/26")];
    let filtered = peer(4, 65000);
    let other = peer(5, 65001);
    let node = mesh(2);
    let sources = [
        RouteSource::Local,
        RouteSource::Peer(PeerClass::Cluster),
        RouteSource::Peer(PeerClass::External),
    ];
    let ifaces = [None, Some("eth0"), Some("ens5"), Some("vxlan.calico")];
    let (mut by_filter, mut by_generated) = (0u32, 0u32);
    for _ in 0..300 {
        let n = rng.below(6) as usize;
        let export: Vec<FilterRule> = (0..n).map(|i| random_rule(&mut rng, i)).collect();
        let n = rng.below(6) as usize;
        let import: Vec<FilterRule> = (0..n).map(|i| random_rule(&mut rng, i)).collect();
        let filters = [(
            filtered.address,
            PeerFilters {
                import: import.clone(),
                export: export.clone(),
            },
        )];
        let transit = rng.below(2) == 0;
        let inputs = |f: &[(IpAddr, PeerFilters)]| {
            Policy::generate(&PolicyInputs {
                pools: &pools,
                own_blocks: &own,
                external_transit: transit,
                peer_filters: f,
                ..Default::default()
            })
        };
        let pol = inputs(&filters);
        let base = inputs(&[]);
        for _ in 0..60 {
            let v6 = rng.below(4) == 0;
            let p = random_prefix(&mut rng, v6);
            let src = rng.pick(&sources);
            // The interface of the route's source (export) and of the session (import):
            // drawn apart, so that one cannot stand in for the other.
            let ifc = rng.pick(&ifaces);
            let ifname = ifc.and_then(IfName::new);
            let session_ifc = rng.pick(&ifaces);
            for to in [filtered, other, node] {
                let mut to_ref = to.policy_ref();
                to_ref.interface = session_ifc.and_then(IfName::new);
                let got = pol.export_verdict(&to_ref, p, src, ifname);
                let first = (to.address == filtered.address)
                    .then(|| export.iter().find(|r| reference_matches(r, p, src, ifc)))
                    .flatten();
                match first {
                    Some(r) => {
                        by_filter += 1;
                        assert_eq!(got.accept, r.accept, "{p} {src:?} {ifc:?} {export:#?}");
                        assert_eq!(got.by, Decider::Filter(r), "{p} {src:?} {export:#?}");
                    }
                    None => {
                        by_generated += 1;
                        let want = base.export_verdict(&to_ref, p, src, ifname);
                        assert_eq!(got, want, "{p} {src:?} {ifc:?} {export:#?}");
                    }
                }
                // Import: the session's own interface, the peer's class as the source.
                let got = pol.import_verdict(&to_ref, p);
                let src = RouteSource::Peer(to.class);
                let first = (to.address == filtered.address)
                    .then(|| {
                        import
                            .iter()
                            .find(|r| reference_matches(r, p, src, session_ifc))
                    })
                    .flatten();
                match first {
                    Some(r) => assert_eq!(
                        (got.accept, got.by),
                        (r.accept, Decider::Filter(r)),
                        "{p} {session_ifc:?} {import:#?}"
                    ),
                    None => assert_eq!(got, base.import_verdict(&to_ref, p), "{p} {import:#?}"),
                }
            }
        }
    }
    // Both paths were exercised, many times.
    assert!(
        by_filter > 2000 && by_generated > 2000,
        "{by_filter} {by_generated}"
    );
}

/// Randomised through the RIB: random filters and advertisements changed by `set_policy`
/// while routes come and go; what each peer was told always equals its Adj-RIB-Out, and
/// both equal what a fresh session to it would be sent.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one randomised loop with its oracle inline: policy churn, routes in and out, then the told-equals-fresh-session check after every step; the checks read the loop's state"
)]
fn what_peers_are_told_stays_what_a_fresh_session_gets_under_filter_churn() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let a = with(peer(4, 65000), |o| o.interface = IfName::new("eth0"));
    let b = with(peer(5, 65001), |o| o.next_hop = NextHopMode::Keep);
    let peers = [mesh(2), mesh(3), a, b];
    let prefix = |n: u64| {
        let v = [
            "172.20.1.0/26",
            "172.20.2.0/26",
            "172.20.3.0/26",
            "172.20.3.0/27",
            "10.50.0.0/16",
            "10.50.1.0/24",
            "10.96.0.10/32",
            "10.77.0.0/24",
        ];
        pfx(v[(n % v.len() as u64) as usize])
    };
    let cidrs = [
        "172.20.0.0/16",
        "172.20.3.0/24",
        "10.50.0.0/16",
        "10.96.0.0/12",
    ];
    let random_filters = |rng: &mut Rng| {
        let mut f = PeerFilters::default();
        for i in 0..rng.below(3) {
            let mut r = rule(
                rng.pick(&cidrs),
                rng.pick(&[
                    MatchOperator::Equal,
                    MatchOperator::In,
                    MatchOperator::NotIn,
                ]),
                rng.below(2) == 0,
            );
            r.place = format!("[{i}]");
            if rng.below(3) == 0 {
                r.interface = Some("eth*".into());
            }
            if rng.below(2) == 0 {
                f.export.push(r);
            } else {
                f.import.push(r);
            }
        }
        f
    };
    let mut r = rib();
    let mut told = Told::default();
    for p in peers {
        told.up(&mut r, p);
    }
    for step in 0..600 {
        match rng.below(10) {
            0 => {
                let mut s = Setup {
                    transit: rng.below(2) == 0,
                    services: vec![net("10.96.0.0/12")],
                    ..Default::default()
                };
                if rng.below(2) == 0 {
                    s.adverts = advertisements();
                }
                for p in [a, b] {
                    if rng.below(2) == 0 {
                        s.filters.push((p.address, random_filters(&mut rng)));
                    }
                }
                told.all(r.set_policy(s.policy(), None));
            }
            1 => {
                let p = prefix(rng.next());
                if rng.below(2) == 0 {
                    told.all(r.announce(p, own()));
                } else if let Some(out) = r.withdraw(p) {
                    told.all(out);
                }
            }
            _ => {
                let from = rng.pick(&peers);
                let p = prefix(rng.next());
                if rng.below(3) == 0 {
                    told.all(r.update(from.id, None, &[], &[p]));
                } else {
                    let as_path: &[u32] = if from.class == PeerClass::Cluster {
                        &[]
                    } else {
                        &[from.asn.0]
                    };
                    let lp = (from.class == PeerClass::Cluster).then_some(100);
                    let nh = Ipv4Addr::new(192, 0, 2, rng.below(3) as u8 + 1);
                    told.all(r.update(from.id, Some(attrs(as_path, nh, lp)), &[p], &[]));
                }
            }
        }
        for p in peers {
            let id = p.id.0;
            let held: BTreeMap<Ipv4Prefix, Attrs> = r
                .adj_out(p.id)
                .into_iter()
                .map(|x| (x.prefix, x.attrs))
                .collect();
            let empty = BTreeMap::new();
            let was_told = told.0.get(&id).unwrap_or(&empty);
            assert_eq!(was_told, &held, "step {step}, peer {id}");
            assert_eq!(
                r.counts(p.id).2,
                held.len() as u64,
                "step {step}, peer {id}"
            );
        }
    }
    // A fresh session to each peer gets exactly what it was told.
    for p in peers {
        told.all(r.peer_down(p.id));
        let u = r.peer_up(p);
        let fresh: BTreeMap<Ipv4Prefix, Attrs> = u
            .announce
            .into_iter()
            .flat_map(|(a, ps)| ps.into_iter().map(move |p| (p, a.clone())))
            .collect();
        // Its own routes left the tables with its session: what it is sent now is its
        // Adj-RIB-Out, and so is what every other peer was told.
        let held: BTreeMap<Ipv4Prefix, Attrs> = r
            .adj_out(p.id)
            .into_iter()
            .map(|x| (x.prefix, x.attrs))
            .collect();
        assert_eq!(fresh, held, "peer {}", p.id.0);
        told.0.insert(p.id.0, fresh.into_iter().collect());
    }
    for p in peers {
        let held: BTreeMap<Ipv4Prefix, Attrs> = r
            .adj_out(p.id)
            .into_iter()
            .map(|x| (x.prefix, x.attrs))
            .collect();
        assert_eq!(told.0.get(&p.id.0), Some(&held), "peer {}", p.id.0);
    }
}
