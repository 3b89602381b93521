//! routewriter's kernel layer on its own, in a namespace made per test: batched writes where
//! one refusal fails only its own request, dumps that read what iproute2 wrote, deletes that
//! never take another protocol's route, and IPv6 routes of every kind written, read back and
//! found converged.

use std::net::{IpAddr, Ipv4Addr};

use interop_tests::lab::netns::{Netns, VethPair};
use routewriter::desired::{DevId, Family, Kind, Prefix, RouteSpec, Routes};
use routewriter::kernel::Kernel;
use routewriter::reconcile::{
    self, ActualRoute, RT_SCOPE_LINK, RTN_BLACKHOLE, RTN_UNICAST, RouteContext, RouteOp, Why,
};

fn p(s: &str) -> Prefix {
    Prefix::parse(s).unwrap()
}

/// A namespace with eth0 10.0.0.1/24 (peer in a second namespace) and its ifindex.
fn setup() -> (Netns, Netns, VethPair, u32) {
    let n = Netns::new("k").unwrap();
    let x = Netns::new("kx").unwrap();
    let v = VethPair::new(&n, "eth0", &x, "eth0").unwrap();
    n.ip(&["addr", "add", "10.0.0.1/24", "dev", "eth0"])
        .unwrap();
    let j: serde_json::Value =
        serde_json::from_str(&n.ip(&["-j", "link", "show", "eth0"]).unwrap()).unwrap();
    let index = j[0]["ifindex"].as_u64().unwrap() as u32;
    (n, x, v, index)
}

fn gw_route(prefix: Prefix, gw: &str, oif: u32, onlink: bool) -> RouteOp {
    RouteOp::Write {
        prefix,
        spec: RouteSpec::new(Kind::Gateway, Some(gw.parse().unwrap()), DevId(1), onlink),
        oif,
        why: Why::Missing,
    }
}

#[test]
fn one_refused_route_in_a_batch_fails_alone() {
    let (n, _x, _v, eth0) = setup();
    let mut k = n.run_in(Kernel::open).unwrap().unwrap();
    let mut ops = Vec::new();
    for i in 0..3000u32 {
        let prefix = Prefix::new(IpAddr::V4(Ipv4Addr::from(0x0A80_0000 + (i << 6))), 26).unwrap();
        // 192.0.2.1 is unreachable and not onlink: the kernel refuses that one.
        let gw = if i == 1500 { "192.0.2.1" } else { "10.0.0.2" };
        ops.push(gw_route(prefix, gw, eth0, false));
    }
    let refusals = k.apply_routes(&ops, 254, 80).unwrap();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0].index, 1500);
    assert_eq!(
        refusals[0].error.errno,
        libc::ENETUNREACH,
        "{}",
        refusals[0].error
    );
    assert!(
        !refusals[0].error.message.is_empty(),
        "the kernel's extended message is kept"
    );
    assert_eq!(k.writes(), 3000);
    let listed = n.ip(&["route", "show", "proto", "80"]).unwrap();
    assert_eq!(listed.lines().count(), 2999);
    assert!(listed.contains("10.128.0.0/26 via 10.0.0.2 dev eth0"));
    assert!(!listed.contains("192.0.2.1"));
}

#[test]
fn dumps_read_what_iproute2_wrote() {
    let (n, _x, _v, eth0) = setup();
    for args in [
        vec!["route", "add", "blackhole", "10.65.0.0/26", "proto", "80"],
        vec![
            "route",
            "add",
            "10.65.0.5/32",
            "dev",
            "eth0",
            "proto",
            "80",
            "scope",
            "link",
        ],
        vec![
            "route",
            "add",
            "10.65.1.0/26",
            "via",
            "10.0.0.2",
            "dev",
            "eth0",
            "onlink",
            "proto",
            "80",
        ],
        vec![
            "route",
            "add",
            "10.65.2.0/26",
            "via",
            "10.0.0.2",
            "metric",
            "7",
            "proto",
            "static",
        ],
        vec![
            "route",
            "add",
            "10.65.3.0/26",
            "via",
            "10.0.0.2",
            "table",
            "100",
            "proto",
            "80",
        ],
    ] {
        n.ip(&args).unwrap();
    }
    let mut k = n.run_in(Kernel::open).unwrap().unwrap();
    let mut main = Vec::new();
    k.routes(Family::V4, 254, None, |r| main.push(*r)).unwrap();
    let find = |v: &[ActualRoute], s: &str| {
        *v.iter()
            .find(|r| r.prefix == p(s))
            .unwrap_or_else(|| panic!("{s}: {v:?}"))
    };
    let bh = find(&main, "10.65.0.0/26");
    assert_eq!((bh.rtype, bh.protocol, bh.table), (RTN_BLACKHOLE, 80, 254));
    let w = find(&main, "10.65.0.5/32");
    assert_eq!(
        (w.rtype, w.scope, w.oif, w.gateway),
        (RTN_UNICAST, RT_SCOPE_LINK, eth0, None)
    );
    let g = find(&main, "10.65.1.0/26");
    assert_eq!(
        (g.gateway(), g.oif, g.onlink),
        (Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))), eth0, true)
    );
    let s = find(&main, "10.65.2.0/26");
    assert_eq!((s.protocol, s.metric), (4, 7));
    assert!(
        main.iter().all(|r| r.table == 254),
        "only the table asked for"
    );
    let mut t100 = Vec::new();
    k.routes(Family::V4, 100, None, |r| t100.push(*r)).unwrap();
    assert_eq!(t100.len(), 1);
    assert_eq!(t100[0].prefix, p("10.65.3.0/26"));
    // Filtered by interface.
    let mut on_eth0 = Vec::new();
    k.routes(Family::V4, 254, Some(eth0), |r| on_eth0.push(r.prefix))
        .unwrap();
    // The IPv6 dump of the same table holds none of them.
    let mut v6 = Vec::new();
    k.routes(Family::V6, 254, None, |r| v6.push(r.prefix))
        .unwrap();
    assert!(v6.iter().all(|p| p.family() == Family::V6), "{v6:?}");
    assert!(
        on_eth0.contains(&p("10.65.1.0/26")) && !on_eth0.contains(&p("10.65.0.0/26")),
        "{on_eth0:?}"
    );
    assert_eq!(k.writes(), 0, "reading is not writing");
}

#[test]
fn deleting_ours_never_takes_another_protocols_route() {
    let (n, _x, _v, _eth0) = setup();
    n.ip(&[
        "route",
        "add",
        "10.65.1.0/26",
        "via",
        "10.0.0.2",
        "proto",
        "static",
    ])
    .unwrap();
    n.ip(&[
        "route",
        "add",
        "10.65.2.0/26",
        "via",
        "10.0.0.2",
        "proto",
        "80",
    ])
    .unwrap();
    let mut k = n.run_in(Kernel::open).unwrap().unwrap();
    let ops = [
        RouteOp::DeleteOwn {
            prefix: p("10.65.1.0/26"),
        },
        RouteOp::DeleteOwn {
            prefix: p("10.65.2.0/26"),
        },
        // Already gone: not an error.
        RouteOp::DeleteOwn {
            prefix: p("10.65.9.0/26"),
        },
    ];
    let refusals = k.apply_routes(&ops, 254, 80).unwrap();
    // The static route is not ours: the kernel finds no route of protocol 80 there.
    assert!(refusals.is_empty(), "{refusals:?}");
    let routes = n.ip(&["route"]).unwrap();
    assert!(
        routes.contains("10.65.1.0/26 via 10.0.0.2 dev eth0 proto static"),
        "{routes}"
    );
    assert!(!routes.contains("10.65.2.0/26"), "{routes}");
}

/// IPv6 routes of every kind, written by routewriter's kernel layer in one batch: iproute2
/// shows them with protocol 80 at metric 1024 in the main table; the dump reads them back so
/// that the diff finds them converged; one refused route fails alone; deleting ours leaves
/// another protocol's route at the same destination.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one round trip told in order: write every IPv6 route kind, read back, one refusal alone, delete beside another protocol's route"
)]
fn ipv6_routes_of_every_kind_round_trip() {
    let (n, x, _v, eth0) = setup();
    n.ip(&["-6", "addr", "add", "fd00:10::1/64", "dev", "eth0", "nodad"])
        .unwrap();
    x.ip(&["-6", "addr", "add", "fd00:10::2/64", "dev", "eth0", "nodad"])
        .unwrap();
    let mut k = n.run_in(Kernel::open).unwrap().unwrap();
    let gw = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    let specs = [
        (
            "fd00:20::/122",
            RouteSpec::new(Kind::Blackhole, None, DevId::NONE, false),
        ),
        (
            "fd00:20::5/128",
            RouteSpec::new(Kind::Workload, None, DevId(1), false),
        ),
        (
            "fd00:20::40/122",
            RouteSpec::new(Kind::Gateway, gw("fd00:10::2"), DevId::NONE, false),
        ),
        (
            "fd00:20::c0/122",
            RouteSpec::new(Kind::Gateway, gw("fe80::2"), DevId(1), false),
        ),
        // Over eth0 here, as over vxlan-v6.calico in the agent: onlink to an address no
        // subnet of the device holds.
        (
            "fd00:20::80/122",
            RouteSpec::new(Kind::Vxlan, gw("fd00:20::81"), DevId(1), true),
        ),
        // Unreachable and not onlink: refused alone.
        (
            "fd00:20::100/122",
            RouteSpec::new(Kind::Gateway, gw("fd00:99::1"), DevId(1), false),
        ),
    ];
    let mut desired = Routes::default();
    for (prefix, spec) in &specs {
        desired.insert(p(prefix), *spec).unwrap();
    }
    let ifindex = |d: DevId| (d == DevId(1)).then_some(eth0);
    let ctx = RouteContext {
        protocol: 80,
        table: 254,
        ifindex: &ifindex,
    };
    let ops = reconcile::diff_routes(&desired, &[], &ctx);
    assert_eq!(ops.len(), specs.len());
    let refusals = k.apply_routes(&ops, 254, 80).unwrap();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(ops[refusals[0].index].prefix(), p("fd00:20::100/122"));
    let mut listed: Vec<String> = n
        .ip(&["-6", "route", "show", "proto", "80"])
        .unwrap()
        .lines()
        .map(|l| l.trim().to_owned())
        .collect();
    listed.sort();
    let mut want = vec![
        "blackhole fd00:20::/122 dev lo metric 1024 pref medium",
        "fd00:20::40/122 via fd00:10::2 dev eth0 metric 1024 pref medium",
        "fd00:20::5 dev eth0 metric 1024 pref medium",
        "fd00:20::80/122 via fd00:20::81 dev eth0 metric 1024 onlink pref medium",
        "fd00:20::c0/122 via fe80::2 dev eth0 metric 1024 pref medium",
    ];
    want.sort();
    assert_eq!(listed, want);
    // Read back, everything but the refused route is as desired.
    let mut actual = Vec::new();
    k.routes(Family::V6, 254, None, |r| actual.push(*r))
        .unwrap();
    let again = reconcile::diff_routes(&desired, &actual, &ctx);
    assert_eq!(
        again.iter().map(|o| o.prefix()).collect::<Vec<_>>(),
        vec![p("fd00:20::100/122")],
        "{again:?}"
    );
    // Another protocol's route at a destination of ours (at another metric) survives our
    // delete.
    n.ip(&[
        "-6",
        "route",
        "add",
        "fd00:20::40/122",
        "via",
        "fd00:10::2",
        "metric",
        "2048",
        "proto",
        "static",
    ])
    .unwrap();
    let deletes: Vec<RouteOp> = specs
        .iter()
        .map(|(prefix, _)| RouteOp::DeleteOwn { prefix: p(prefix) })
        .collect();
    assert_eq!(k.apply_routes(&deletes, 254, 80).unwrap(), vec![]);
    assert_eq!(
        n.ip(&["-6", "route", "show", "proto", "80"])
            .unwrap()
            .trim(),
        ""
    );
    assert_eq!(
        n.ip(&["-6", "route", "show", "fd00:20::40/122"])
            .unwrap()
            .trim(),
        "fd00:20::40/122 via fd00:10::2 dev eth0 proto static metric 2048 pref medium"
    );
}

/// IPv6 looks an onlink gateway up in the table: a VXLAN route whose tunnel address lies in its
/// own block cannot replace a route there through another device (the kernel refuses it,
/// "Nexthop has invalid gateway or device mismatch"). The kernel layer deletes what is there
/// and writes again, so the route lands.
#[test]
fn an_ipv6_onlink_route_replaces_one_through_another_device() {
    let (n, _x, _v, _eth0) = setup();
    n.ip(&["-6", "addr", "add", "fd00:10::1/64", "dev", "eth0", "nodad"])
        .unwrap();
    n.ip(&[
        "link",
        "add",
        "vx6",
        "type",
        "vxlan",
        "id",
        "7",
        "local",
        "fd00:10::1",
        "dev",
        "eth0",
        "dstport",
        "4789",
        "nolearning",
    ])
    .unwrap();
    n.ip(&["link", "set", "vx6", "up"]).unwrap();
    let j: serde_json::Value =
        serde_json::from_str(&n.ip(&["-j", "link", "show", "vx6"]).unwrap()).unwrap();
    let vx6 = j[0]["ifindex"].as_u64().unwrap() as u32;
    // By hand, through eth0, covering the gateway of the route routewriter wants.
    n.ip(&[
        "-6",
        "route",
        "add",
        "fd00:20::80/122",
        "via",
        "fd00:10::9",
        "dev",
        "eth0",
    ])
    .unwrap();
    let mut k = n.run_in(Kernel::open).unwrap().unwrap();
    let gw: IpAddr = "fd00:20::81".parse().unwrap();
    let ops = [RouteOp::Write {
        prefix: p("fd00:20::80/122"),
        spec: RouteSpec::new(Kind::Vxlan, Some(gw), DevId(2), true),
        oif: vx6,
        why: Why::Foreign(3),
    }];
    assert_eq!(k.apply_routes(&ops, 254, 80).unwrap(), vec![]);
    assert_eq!(
        n.ip(&["-6", "route", "show", "fd00:20::80/122"])
            .unwrap()
            .trim(),
        "fd00:20::80/122 via fd00:20::81 dev vx6 proto 80 metric 1024 onlink pref medium"
    );
    // Delete, then write: three messages.
    assert_eq!(k.writes(), 3);
}

/// The netlink watch reports route changes made by others, not the ones routewriter's own
/// socket asked for: the kernel stamps each notification with the asking socket's port id.
#[test]
fn the_watch_skips_routewriter_s_own_route_writes() {
    use routewriter::monitor::{self, Event};
    use std::sync::Arc;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;
    let (n, _x, _v, eth0) = setup();
    let own = Arc::new(AtomicU32::new(0));
    let mut events = n
        .run_in(|| monitor::start(254, 64, own.clone()))
        .unwrap()
        .unwrap();
    let mut ours = n.run_in(Kernel::open).unwrap().unwrap();
    let mut theirs = n.run_in(Kernel::open).unwrap().unwrap();
    own.store(ours.port_id(), std::sync::atomic::Ordering::Relaxed);
    assert_ne!(ours.port_id(), theirs.port_id());
    let write = |k: &mut Kernel, s: &str| {
        let refused = k
            .apply_routes(&[gw_route(p(s), "10.0.0.2", eth0, false)], 254, 80)
            .unwrap();
        assert!(refused.is_empty(), "{refused:?}");
    };
    write(&mut ours, "10.50.0.0/26");
    write(&mut theirs, "10.50.0.64/26");
    write(&mut ours, "10.50.0.128/26");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut seen = Vec::new();
    rt.block_on(async {
        // Everything written is notified at once; a quiet half second after is the end.
        while let Ok(Some(e)) =
            tokio::time::timeout(Duration::from_millis(500), events.recv()).await
        {
            if let Event::Route { deleted, route } = e {
                seen.push((deleted, route.prefix.to_string()));
            }
        }
    });
    assert_eq!(seen, vec![(false, "10.50.0.64/26".to_string())]);
}
