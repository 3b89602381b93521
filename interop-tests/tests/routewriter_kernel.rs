//! routewriter's kernel layer on its own, in a namespace made per test: batched writes where
//! one refusal fails only its own request, dumps that read what iproute2 wrote, and deletes
//! that never take another protocol's route.

use std::net::Ipv4Addr;

use interop_tests::lab::netns::{Netns, VethPair};
use routewriter::desired::{DevId, Kind, Prefix4, RouteSpec};
use routewriter::kernel::Kernel;
use routewriter::reconcile::{
    ActualRoute, RT_SCOPE_LINK, RTN_BLACKHOLE, RTN_UNICAST, RouteOp, Why,
};

fn p(s: &str) -> Prefix4 {
    Prefix4::parse(s).unwrap()
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

fn gw_route(prefix: Prefix4, gw: &str, oif: u32, onlink: bool) -> RouteOp {
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
        let prefix = Prefix4::new(Ipv4Addr::from(0x0A80_0000 + (i << 6)), 26).unwrap();
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
    k.routes(254, None, |r| main.push(*r)).unwrap();
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
        (RTN_UNICAST, RT_SCOPE_LINK, eth0, 0)
    );
    let g = find(&main, "10.65.1.0/26");
    assert_eq!(
        (g.gateway(), g.oif, g.onlink),
        (Some(Ipv4Addr::new(10, 0, 0, 2)), eth0, true)
    );
    let s = find(&main, "10.65.2.0/26");
    assert_eq!((s.protocol, s.metric), (4, 7));
    assert!(
        main.iter().all(|r| r.table == 254),
        "only the table asked for"
    );
    let mut t100 = Vec::new();
    k.routes(100, None, |r| t100.push(*r)).unwrap();
    assert_eq!(t100.len(), 1);
    assert_eq!(t100[0].prefix, p("10.65.3.0/26"));
    // Filtered by interface.
    let mut on_eth0 = Vec::new();
    k.routes(254, Some(eth0), |r| on_eth0.push(r.prefix))
        .unwrap();
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
