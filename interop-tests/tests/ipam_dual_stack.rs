//! Dual-stack IPAM served by a real bgpd (a process on a SQLite file): an IPv4 and an IPv6
//! VXLAN pool, the node's tunnel address of each family, dual-stack assignments for several
//! handles, `bgpctl ipam show [--show-blocks]`, `ipam check` and `ipam gc` over both
//! families, node removal releasing both tunnel addresses, and bad input (a pool that does
//! not fit its family, a request for the wrong family) refused with the field named and
//! nothing stored.
//!
//! Why this file is long: three end-to-end scenarios, each on a daemon of its own, spelling out
//! the rows and JSON fields they expect for both families.

use std::time::{Duration, Instant};

use datastore::contract::Datastore;
use datastore::resource::{Resource, decode, encode};
use datastore::sqlite::{SqliteOptions, SqliteStore};
use interop_tests::lab::bgpd::{Daemon, bgpctl, runtime, write_config_with_node};
use ipam::block::{Block, Slot, cidr_key};
use proto::v1 as pb;
use proto::v1::ipam_client::IpamClient;
use proto::v1::nodes_client::NodesClient;
use proto::v1::pools_client::PoolsClient;
use serde_json::Value;
use tonic::Code;

const POOLS: &str = "[[ipam.default_pools]]\nname = \"default-ipv4-ippool\"\ncidr = \"172.20.0.0/16\"\nvxlan_mode = \"Always\"\n\
                     [[ipam.default_pools]]\nname = \"default-ipv6-ippool\"\ncidr = \"fd00:20::/48\"\nvxlan_mode = \"Always\"\nnat_outgoing = true\n";

fn start() -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/bgpd.sock");
    let config = write_config_with_node(dir.path(), &socket, "address6 = \"fd99::5/64\"\n", POOLS);
    Daemon::start_with_config(dir, socket, &config)
}

/// A bgpd whose node and default pools are registered and whose brain has given the node a
/// tunnel address of each family (one address and one block of each family in use).
fn ready() -> (Daemon, pb::Node) {
    let d = start();
    let node = wait_for("the node's two tunnel addresses", &d, || {
        if d.bgpctl_json(&["pool", "ls"]).as_array()?.len() != 2 {
            return None;
        }
        runtime().block_on(async {
            let channel = proto::client::connect_unix(&d.socket).await.ok()?;
            let n = NodesClient::new(channel)
                .get_node(pb::GetNodeRequest {
                    name: "test-node".into(),
                })
                .await
                .ok()?
                .into_inner();
            (!n.vxlan_tunnel_address.is_empty() && !n.vxlan_tunnel_address_v6.is_empty())
                .then_some(n)
        })
    });
    (d, node)
}

/// Polls `f` until it returns something, for up to 20 s.
fn wait_for<T>(what: &str, d: &Daemon, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within 20 s; bgpd's log:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The (pool, used) of `ipam show --json`, per family.
fn used(d: &Daemon) -> (u64, u64) {
    let show = d.bgpctl_json(&["ipam", "show"]);
    let of = |family: &str| {
        show["pools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["family"] == family)
            .map(|p| p["used"].as_u64().unwrap())
            .sum()
    };
    (of("IPv4"), of("IPv6"))
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: pods of both families assigned, shown, checked, a leak found, GC run; each step reads the store the last one left"
)]
fn dual_stack_pools_assignments_show_check_and_gc() {
    // The node and both default pools are registered, then the brain gives the node a
    // tunnel address of each family.
    let (d, node) = ready();
    assert!(node.vxlan_tunnel_address.starts_with("172.20."), "{node:?}");
    assert!(
        node.vxlan_tunnel_address_v6.starts_with("fd00:20:"),
        "{node:?}"
    );
    let pools = d.bgpctl_json(&["pool", "ls"]);
    let v6 = &pools[1];
    assert_eq!(
        (
            &v6["cidr"],
            &v6["block_size"],
            &v6["vxlan_mode"],
            &v6["nat_outgoing"]
        ),
        (
            &Value::from("fd00:20::/48"),
            &Value::from(122),
            &Value::from("Always"),
            &Value::from(true)
        ),
        "{pools}"
    );

    // Five dual-stack pods: three through bgpctl, two through the API.
    let mut pods: Vec<(String, Vec<String>)> = Vec::new();
    for i in 0..3 {
        let handle = format!("k8s.pod-{i}");
        let got = d.bgpctl_json(&["ipam", "assign", "--handle", &handle, "--family", "dual"]);
        let addrs: Vec<String> = got
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["address"].as_str().unwrap().to_owned())
            .collect();
        pods.push((handle, addrs));
    }
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        let mut ipam = IpamClient::new(channel);
        for i in 3..5 {
            let handle = format!("k8s.pod-{i}");
            let r = ipam
                .auto_assign(pb::AutoAssignRequest {
                    handle: handle.clone(),
                    num_ipv4: 1,
                    num_ipv6: 1,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!((r.ipv4.len(), r.ipv6.len()), (1, 1), "{r:?}");
            pods.push((
                handle,
                r.ipv4
                    .iter()
                    .chain(&r.ipv6)
                    .map(|a| a.address.clone())
                    .collect(),
            ));
        }
    });
    for (handle, addrs) in &pods {
        assert_eq!(addrs.len(), 2, "{handle}: {addrs:?}");
        assert!(addrs[0].starts_with("172.20."), "{handle}: {addrs:?}");
        assert!(addrs[1].starts_with("fd00:20:"), "{handle}: {addrs:?}");
    }

    // Pools and blocks of both families: the pods and the tunnel addresses, 6 a family.
    let show = d.bgpctl_json(&["ipam", "show", "--show-blocks"]);
    let pool = |family: &str| -> &Value {
        show["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["family"] == family)
            .unwrap()
    };
    assert_eq!(pool("IPv4")["size"], 65536, "{show}");
    assert_eq!(pool("IPv4")["used"], 6, "{show}");
    assert_eq!(pool("IPv6")["used"], 6, "{show}");
    assert_eq!(pool("IPv6")["size"].as_f64(), Some(2f64.powi(80)), "{show}");
    let blocks = show["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "{show}");
    let v6_block = blocks.iter().find(|b| b["family"] == "IPv6").unwrap();
    assert!(
        v6_block["cidr"].as_str().unwrap().ends_with("/122"),
        "{show}"
    );
    assert_eq!(
        (
            &v6_block["affinity"],
            &v6_block["state"],
            &v6_block["used"],
            &v6_block["free"]
        ),
        (
            &Value::from("test-node"),
            &Value::from("confirmed"),
            &Value::from(6),
            &Value::from(58)
        ),
        "{show}"
    );
    let v6_cidr = v6_block["cidr"].as_str().unwrap();
    let table = d.bgpctl_ok(&["ipam", "show", "--show-blocks"]);
    // The table's rows as cells (columns are two spaces or more apart).
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    let line = |grouping: &str, cidr: &str| {
        rows.iter()
            .find(|r| r.len() > 1 && r[0] == grouping && r[1] == cidr)
            .unwrap_or_else(|| panic!("no {grouping} {cidr} in\n{table}"))
            .clone()
    };
    assert_eq!(
        rows[0][..5],
        ["GROUPING", "CIDR", "IPS TOTAL", "IPS IN USE", "IPS FREE"]
    );
    assert_eq!(
        line("IP Pool", "fd00:20::/48")[..6],
        [
            "IP Pool",
            "fd00:20::/48",
            "1.2089e+24",
            "6 (0%)",
            "1.2089e+24 (100%)",
            "default-ipv6-ippool"
        ],
        "{table}"
    );
    assert_eq!(
        line("Block", v6_cidr)[1..5],
        [v6_cidr, "64", "6 (9%)", "58 (91%)"],
        "{table}"
    );
    assert_eq!(
        line("IP Pool", "172.20.0.0/16")[1..5],
        ["172.20.0.0/16", "65536", "6 (0%)", "65530 (100%)"],
        "{table}"
    );
    let short = d.bgpctl_ok(&["ipam", "show"]);
    assert_eq!(short.lines().count(), 3, "{short}");

    let check = d.bgpctl_json(&["ipam", "check"]);
    assert_eq!(check["allocations_checked"], 12, "{check}");
    assert_eq!(check["handles_checked"], 7, "{check}");
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
    assert!(d.bgpctl_ok(&["ipam", "check"]).contains("consistent"));

    // GC with only pod-0 live: the other pods' addresses of both families go, the tunnel
    // addresses of both families stay.
    let dry = d.bgpctl_json(&[
        "ipam",
        "gc",
        "--node",
        "test-node",
        "--live",
        "k8s.pod-0",
        "--dry-run",
    ]);
    assert_eq!(dry["released"].as_array().unwrap().len(), 4, "{dry}");
    assert_eq!(used(&d), (6, 6), "a dry run released something");
    let gc = d.bgpctl_json(&["ipam", "gc", "--node", "test-node", "--live", "k8s.pod-0"]);
    let released: Vec<(&str, Vec<&str>)> = gc["released"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["handle"].as_str().unwrap(),
                h["addresses"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    let want: Vec<(&str, Vec<&str>)> = pods[1..]
        .iter()
        .map(|(h, a)| (h.as_str(), a.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(released, want, "{gc}");
    assert_eq!(used(&d), (2, 2));
    for handle in [
        "vxlan-tunnel-addr-test-node",
        "vxlan-v6-tunnel-addr-test-node",
    ] {
        runtime().block_on(async {
            let channel = proto::client::connect_unix(&d.socket).await.unwrap();
            let held = IpamClient::new(channel)
                .get_handle(pb::GetHandleRequest {
                    handle: handle.into(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(held.allocations.len(), 1, "{handle}: {held:?}");
        });
    }
    let check = d.bgpctl_json(&["ipam", "check"]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");

    // An address of the IPv6 block allocated behind IPAM's back (in the store file, as a
    // hand edit could) is a leak `ipam check` names, with exit code 1.
    let leaked = runtime().block_on(async {
        let store = SqliteStore::open(d.dir.path().join("store.db"), SqliteOptions::default())
            .await
            .unwrap();
        let cidr: ipnet::IpNet = v6_cidr.parse().unwrap();
        let name = cidr_key(&cidr);
        let kv = store.get(Block::kind(), &name).await.unwrap().unwrap();
        let mut block: Block = decode(&kv.value).unwrap();
        let ordinal = block.free.pop_back().unwrap();
        block.slots.insert(
            ordinal,
            Slot {
                handle: "leaked.v6".into(),
                node: "test-node".into(),
                seq: block.seq,
                attrs: Default::default(),
            },
        );
        store
            .update(Block::kind(), &name, encode(&block), kv.version)
            .await
            .unwrap();
        block.address(ordinal).to_string()
    });
    let out = bgpctl(&d.socket, &["ipam", "check"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(&format!(
            "problem: 1 address(es) in {v6_cidr} under handle leaked.v6, which does not record them"
        )),
        "{text}"
    );
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("1 inconsistencies found")
    );
    assert_eq!(used(&d), (2, 3));
    // Releasing the leaked address repairs it, as `calicoctl ipam release --ip` does.
    let r = d.bgpctl_json(&["ipam", "release", "--ip", &leaked]);
    assert_eq!(r["released"][0], leaked.as_str(), "{r}");
    let check = d.bgpctl_json(&["ipam", "check"]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");

    // More IPv6 pools, one per VXLAN mode, with their own block sizes.
    for (name, cidr, mode, size) in [
        ("cross6", "fd00:21::/64", "CrossSubnet", "116"),
        ("never6", "fd00:22::/64", "Never", "128"),
    ] {
        let p = d.bgpctl_json(&[
            "pool",
            "add",
            name,
            cidr,
            "--vxlan-mode",
            mode,
            "--block-size",
            size,
            "--nat-outgoing",
        ]);
        assert_eq!(p["vxlan_mode"], mode, "{p}");
        assert_eq!(p["block_size"].to_string(), size, "{p}");
        assert_eq!(p["nat_outgoing"], true, "{p}");
    }
    let mut one = d.bgpctl_json(&[
        "ipam",
        "assign",
        "--handle",
        "k8s.cross",
        "--pool",
        "cross6",
    ]);
    let a = one[0].take();
    assert!(a["block"].as_str().unwrap().ends_with("/116"), "{a}");
    assert_eq!(a["pool"], "cross6");
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "bad dual-stack requests one after another (API and bgpctl), each refused by field, then one check that nothing was stored"
)]
fn bad_dual_stack_input_is_refused_naming_the_field_and_stores_nothing() {
    let (d, _) = ready();
    let pools_before = d.bgpctl_json(&["pool", "ls"]);
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        let mut pools = PoolsClient::new(channel.clone());
        let mut ipam = IpamClient::new(channel.clone());
        let pool = |name: &str, cidr: &str, block_size: u32| pb::IpPool {
            name: name.into(),
            cidr: cidr.into(),
            block_size,
            ..Default::default()
        };
        let mut ipip6 = pool("ipip6", "fd00:30::/48", 0);
        ipip6.ipip_mode = pb::EncapMode::Always.into();
        for (p, field, needle) in [
            (pool("v6-64", "fd00:30::/48", 64), "block_size", "IPv6"),
            (pool("v4-33", "10.30.0.0/16", 33), "block_size", "IPv4"),
            (pool("v4-122", "10.30.0.0/16", 122), "block_size", "IPv4"),
            (pool("v6-26", "fd00:30::/48", 26), "block_size", "IPv6"),
            (
                pool("inside", "fd00:20:0:1::/64", 0),
                "cidr",
                "overlaps pool default-ipv6-ippool",
            ),
            (
                pool("around", "fd00::/16", 0),
                "cidr",
                "overlaps pool default-ipv6-ippool",
            ),
            (ipip6, "ipip_mode", "IPv4 only"),
        ] {
            let e = pools
                .create_pool(pb::CreatePoolRequest {
                    pool: Some(p.clone()),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{p:?}: {e}");
            assert!(
                e.message().contains(field) && e.message().contains(needle),
                "{p:?}: {e}"
            );
        }

        let named =
            |handle: &str, n4: u32, n6: u32, v4: &[&str], v6: &[&str]| pb::AutoAssignRequest {
                handle: handle.into(),
                num_ipv4: n4,
                num_ipv6: n6,
                ipv4_pools: v4.iter().map(|s| s.to_string()).collect(),
                ipv6_pools: v6.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            };
        for (r, field) in [
            (
                named("bad.1", 1, 0, &["default-ipv6-ippool"], &[]),
                "ipv4_pools",
            ),
            (named("bad.2", 1, 0, &["fd00:20::/48"], &[]), "ipv4_pools"),
            (
                named("bad.3", 0, 1, &[], &["default-ipv4-ippool"]),
                "ipv6_pools",
            ),
            // The IPv4 half is fine: still nothing may be allocated.
            (
                named(
                    "bad.4",
                    1,
                    1,
                    &["default-ipv4-ippool"],
                    &["default-ipv4-ippool"],
                ),
                "ipv6_pools",
            ),
        ] {
            let e = ipam.auto_assign(r.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{r:?}: {e}");
            assert!(
                e.message().contains(field) && e.message().contains("pool"),
                "{r:?}: {e}"
            );
            let e = ipam
                .get_handle(pb::GetHandleRequest {
                    handle: r.handle.clone(),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound, "{} was stored", r.handle);
        }
        // A given IPv6 address no IPv6 pool holds.
        let e = ipam
            .assign_ip(pb::AssignIpRequest {
                address: "fd00:99::1".into(),
                handle: "bad.5".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(
            e.message().contains("address") && e.message().contains("no IPv6 pool"),
            "{e}"
        );
    });
    // bgpctl: an IPv6 address asked of an IPv4 pool, an IPv4 address of an IPv6 pool.
    let e = d.bgpctl_fails(&[
        "ipam",
        "assign",
        "--handle",
        "bad.6",
        "--ip",
        "fd00:20::99",
        "--pool",
        "default-ipv4-ippool",
    ]);
    assert!(
        e.contains("--ip") && e.contains("is an IPv6 address, the pool is IPv4"),
        "{e}"
    );
    let e = d.bgpctl_fails(&[
        "ipam",
        "assign",
        "--handle",
        "bad.7",
        "--family",
        "ipv4",
        "--pool",
        "default-ipv6-ippool",
    ]);
    assert!(e.contains("ipv4_pools") && e.contains("IPv6 pool"), "{e}");
    let e = d.bgpctl_fails(&["pool", "add", "v6-64", "fd00:31::/48", "--block-size", "64"]);
    assert!(
        e.contains("block_size") && e.contains("/116 to /128"),
        "{e}"
    );

    // Nothing was stored: the same pools, only the tunnel addresses in use.
    assert_eq!(d.bgpctl_json(&["pool", "ls"]), pools_before);
    assert_eq!(used(&d), (1, 1));
    let show = d.bgpctl_json(&["ipam", "show", "--show-blocks"]);
    assert_eq!(show["blocks"].as_array().unwrap().len(), 2, "{show}");
    let check = d.bgpctl_json(&["ipam", "check"]);
    assert_eq!(check["handles_checked"], 2, "{check}");
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
}

#[test]
fn removing_a_node_releases_its_tunnel_addresses_of_both_families() {
    let (d, _) = ready();
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        let mut nodes = NodesClient::new(channel.clone());
        let mut ipam = IpamClient::new(channel);
        nodes
            .register_node(pb::RegisterNodeRequest {
                node: Some(pb::Node {
                    name: "other-node".into(),
                    ipv4_address: "10.0.0.6/24".into(),
                    ipv6_address: "fd99::6/64".into(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap();
        let mut want = Vec::new();
        for (handle, n4, n6, use_) in [
            ("vxlan-tunnel-addr-other-node", 1, 0, pb::AllowedUse::Tunnel),
            (
                "vxlan-v6-tunnel-addr-other-node",
                0,
                1,
                pb::AllowedUse::Tunnel,
            ),
            ("k8s.other-pod", 1, 1, pb::AllowedUse::Workload),
        ] {
            let r = ipam
                .auto_assign(pb::AutoAssignRequest {
                    handle: handle.into(),
                    node: "other-node".into(),
                    num_ipv4: n4,
                    num_ipv6: n6,
                    r#use: use_.into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            want.extend(r.ipv4.into_iter().chain(r.ipv6).map(|a| a.address));
        }
        let gone = nodes
            .delete_node(pb::DeleteNodeRequest {
                name: "other-node".into(),
            })
            .await
            .unwrap()
            .into_inner();
        let mut released = gone.released_addresses.clone();
        released.sort();
        want.sort();
        assert_eq!(released, want, "{gone:?}");
        assert!(
            released.iter().any(|a| a.contains(':')) && released.iter().any(|a| a.contains('.'))
        );
        assert_eq!(gone.released_blocks.len(), 2, "{gone:?}");
        for handle in [
            "vxlan-tunnel-addr-other-node",
            "vxlan-v6-tunnel-addr-other-node",
        ] {
            let e = ipam
                .get_handle(pb::GetHandleRequest {
                    handle: handle.into(),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::NotFound, "{handle}");
        }
    });
    let check = d.bgpctl_json(&["ipam", "check"]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
    let show = d.bgpctl_json(&["ipam", "show", "--show-blocks"]);
    assert!(
        show["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["affinity"] != "other-node"),
        "{show}"
    );
}
