//! IPAM served by bgpd: the node registered at start, the default pool, the `Pools`, `Nodes`
//! and `Ipam` services with their status codes, and bgpctl's pool and ipam commands.

use interop_tests::lab::bgpd::{Daemon, runtime};
use proto::v1 as pb;
use proto::v1::ipam_client::IpamClient;
use proto::v1::nodes_client::NodesClient;
use proto::v1::pools_client::PoolsClient;
use tonic::Code;

const DEFAULT_POOL: &str = "[[ipam.default_pools]]\nname = \"default-ipv4-ippool\"\ncidr = \"172.20.0.0/16\"\nvxlan_mode = \"CrossSubnet\"\nnat_outgoing = true\n";

/// Without VXLAN, so no tunnel address is allocated behind the test's back.
const PLAIN_POOL: &str =
    "[[ipam.default_pools]]\nname = \"default-ipv4-ippool\"\ncidr = \"172.20.0.0/16\"\n";

#[test]
fn the_node_and_the_default_pool_exist_after_start() {
    let d = Daemon::start(DEFAULT_POOL);
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        // Registration runs next to the API: give it a moment.
        let mut node = None;
        for _ in 0..100 {
            match NodesClient::new(channel.clone())
                .get_node(pb::GetNodeRequest {
                    name: "test-node".into(),
                })
                .await
            {
                Ok(n) => {
                    node = Some(n.into_inner());
                    break;
                }
                Err(s) if s.code() == Code::NotFound => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                Err(s) => panic!("{s}"),
            }
        }
        let node = node.expect("the node registers itself");
        assert_eq!(node.ipv4_address, "10.0.0.5/24");
        // No AS of its own: the node speaks the cluster's (0 in the API means unset).
        assert_eq!(node.as_number, 0);
        // The default pool is written right after the node.
        let mut pools = Vec::new();
        for _ in 0..100 {
            pools = PoolsClient::new(channel.clone())
                .list_pools(pb::ListPoolsRequest {})
                .await
                .unwrap()
                .into_inner()
                .pools;
            if !pools.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].cidr, "172.20.0.0/16");
        assert_eq!(pools[0].block_size, 26);
        assert_eq!(pools[0].vxlan_mode, i32::from(pb::EncapMode::CrossSubnet));
        assert!(pools[0].nat_outgoing);
    });
}

#[test]
fn bgpctl_pools() {
    let d = Daemon::start("");
    let created = d.bgpctl_json(&[
        "pool",
        "add",
        "blue",
        "10.50.0.0/16",
        "--block-size",
        "28",
        "--vxlan-mode",
        "Always",
        "--nat-outgoing",
    ]);
    assert_eq!(created["cidr"], "10.50.0.0/16");
    assert_eq!(created["vxlan_mode"], "Always");
    d.bgpctl_ok(&[
        "pool",
        "add",
        "green",
        "fd00:50::/64",
        "--node-selector",
        "zone == 'a'",
    ]);
    let list = d.bgpctl_json(&["pool", "ls"]);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["blue", "green"]);
    assert_eq!(list[1]["block_size"], 122);
    let table = d.bgpctl_ok(&["pool", "ls"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("blue") && l.contains("10.50.0.0/16") && l.contains("Always")),
        "{table}"
    );

    let e = d.bgpctl_fails(&["pool", "add", "red", "10.50.3.0/24"]);
    assert!(e.contains("overlaps pool blue"), "{e}");
    let e = d.bgpctl_fails(&["pool", "add", "red", "10.60.0.1/16"]);
    assert!(e.contains("not a network address"), "{e}");
    let e = d.bgpctl_fails(&["pool", "add", "red", "10.60.0.0/16", "--block-size", "40"]);
    assert!(e.contains("block_size"), "{e}");
    let e = d.bgpctl_fails(&[
        "pool",
        "add",
        "red",
        "10.60.0.0/16",
        "--node-selector",
        "has(zone",
    ]);
    assert!(e.contains("position 8"), "{e}");
    d.bgpctl_ok(&["pool", "del", "green"]);
    let e = d.bgpctl_fails(&["pool", "del", "green"]);
    assert!(e.contains("not found"), "{e}");
}

#[test]
fn bgpctl_ipam_assign_show_release_check_gc() {
    let d = Daemon::start(PLAIN_POOL);
    // Wait for the default pool.
    for _ in 0..100 {
        if d.bgpctl_json(&["pool", "ls"]).as_array().unwrap().len() == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let a = d.bgpctl_json(&["ipam", "assign", "--handle", "k8s.c1"]);
    let addr = a[0]["address"].as_str().unwrap().to_owned();
    assert!(addr.starts_with("172.20."), "{a}");
    assert_eq!(a[0]["borrowed"], false);
    let reserved = d.bgpctl_ok(&[
        "ipam",
        "assign",
        "--handle",
        "ops.gw",
        "--ip",
        "172.20.200.1",
    ]);
    assert!(
        reserved.contains("assigned 172.20.200.1 to ops.gw"),
        "{reserved}"
    );
    let e = d.bgpctl_fails(&[
        "ipam",
        "assign",
        "--handle",
        "ops.gw2",
        "--ip",
        "172.20.200.1",
    ]);
    assert!(e.contains("already allocated"), "{e}");
    d.bgpctl_ok(&[
        "ipam",
        "assign",
        "--handle",
        "k8s.c2",
        "--node",
        "other-node",
    ]);

    let show = d.bgpctl_json(&["ipam", "show", "--show-blocks"]);
    assert_eq!(show["pools"][0]["used"], 3);
    assert_eq!(show["pools"][0]["size"], 65536);
    let blocks = show["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 3, "{show}");
    assert!(blocks.iter().all(|b| b["state"] == "confirmed"), "{show}");
    assert!(blocks.iter().any(|b| b["affinity"] == "other-node"));
    let table = d.bgpctl_ok(&["ipam", "show", "--show-blocks"]);
    assert!(
        table.contains("default-ipv4-ippool") && table.contains("BLOCK"),
        "{table}"
    );

    let check = d.bgpctl_json(&["ipam", "check"]);
    assert_eq!(check["allocations_checked"], 3);
    assert!(check["problems"].as_array().unwrap().is_empty());

    let dry = d.bgpctl_json(&[
        "ipam",
        "gc",
        "--node",
        "test-node",
        "--live",
        "k8s.c9",
        "--prefix",
        "k8s.",
        "--dry-run",
    ]);
    assert_eq!(dry["released"][0]["handle"], "k8s.c1");
    let gc = d.bgpctl_json(&[
        "ipam",
        "gc",
        "--node",
        "test-node",
        "--live",
        "",
        "--prefix",
        "k8s.",
    ]);
    assert_eq!(gc["released"][0]["addresses"][0], addr.as_str());
    let again = d.bgpctl_json(&["ipam", "release", "--handle", "k8s.c1"]);
    assert!(again["released"].as_array().unwrap().is_empty());
    let r = d.bgpctl_json(&["ipam", "release", "--ip", "172.20.200.1"]);
    assert_eq!(r["released"][0], "172.20.200.1");
    assert_eq!(d.bgpctl_json(&["ipam", "show"])["pools"][0]["used"], 1);
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "walks the status code of every Pools and Ipam call in turn against one daemon; one call after another"
)]
fn status_codes_follow_the_contract() {
    let d = Daemon::start("");
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        let mut pools = PoolsClient::new(channel.clone());
        let mut ipam = IpamClient::new(channel.clone());
        let pool = |name: &str, cidr: &str| pb::IpPool {
            name: name.into(),
            cidr: cidr.into(),
            block_size: 30,
            ..Default::default()
        };

        let e = pools
            .create_pool(pb::CreatePoolRequest {
                pool: Some(pool("a", "10.70.0.1/24")),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("cidr"), "{e}");
        let e = pools
            .create_pool(pb::CreatePoolRequest {
                pool: Some(pool("Bad Name", "10.70.0.0/24")),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("name"), "{e}");
        let e = pools
            .get_pool(pb::GetPoolRequest {
                name: "nope".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);

        let created = pools
            .create_pool(pb::CreatePoolRequest {
                pool: Some(pool("small", "10.70.0.0/30")),
            })
            .await
            .unwrap()
            .into_inner();
        let e = pools
            .create_pool(pb::CreatePoolRequest {
                pool: Some(pool("small", "10.71.0.0/30")),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        let mut changed = created.clone();
        changed.disabled = true;
        pools
            .update_pool(pb::UpdatePoolRequest {
                pool: Some(changed.clone()),
            })
            .await
            .unwrap();
        // The same revision again: someone (we) changed it since.
        let e = pools
            .update_pool(pb::UpdatePoolRequest {
                pool: Some(changed.clone()),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted);
        changed.disabled = false;
        changed.revision = 0;
        pools
            .update_pool(pb::UpdatePoolRequest {
                pool: Some(changed),
            })
            .await
            .unwrap();

        let assign = |handle: &str, n: u32| pb::AutoAssignRequest {
            handle: handle.into(),
            num_ipv4: n,
            ..Default::default()
        };
        ipam.auto_assign(assign("h1", 4)).await.unwrap();
        let e = ipam.auto_assign(assign("h2", 1)).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
        let e = ipam.auto_assign(assign("", 1)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("handle"), "{e}");
        let e = ipam
            .get_handle(pb::GetHandleRequest {
                handle: "h2".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        let e = pools
            .delete_pool(pb::DeletePoolRequest {
                name: "small".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("in use"), "{e}");
        let e = ipam
            .release_ips(pb::ReleaseIpsRequest {
                ips: vec![pb::ReleaseIp {
                    address: "not-an-ip".into(),
                    ..Default::default()
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("address"), "{e}");
    });
}

/// Concurrent pod starts on one node share bgpd's one allocator: its node lock queues them
/// and whoever holds it serves the queue in one transaction (group commit), so 100 ADDs at
/// once take far fewer datastore writes than they get addresses. Writes are counted as the
/// SQLite store's revisions (one per write transaction), read from the file beside bgpd.
#[test]
fn concurrent_adds_on_one_node_share_datastore_writes() {
    use datastore::contract::Atomic;
    use datastore::sqlite::{SqliteOptions, SqliteStore};
    const ADDS: usize = 100;
    let d = Daemon::start(PLAIN_POOL);
    runtime().block_on(async {
        let channel = proto::client::connect_unix(&d.socket).await.unwrap();
        let assign = |handle: String| pb::AutoAssignRequest {
            handle,
            num_ipv4: 1,
            ..Default::default()
        };
        // The first ADD waits for registration and claims the node's first block.
        let mut first = None;
        for _ in 0..100 {
            match IpamClient::new(channel.clone())
                .auto_assign(assign("warm-up".into()))
                .await
            {
                Ok(r) => {
                    first = Some(r.into_inner());
                    break;
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
        assert_eq!(first.expect("bgpd serves IPAM").ipv4.len(), 1);
        let store = SqliteStore::open(d.dir.path().join("store.db"), SqliteOptions::default())
            .await
            .unwrap();
        let before = store.revision().await.unwrap();
        let tasks: Vec<_> = (0..ADDS)
            .map(|i| {
                let mut ipam = IpamClient::new(channel.clone());
                let req = assign(format!("net.pod{i}"));
                tokio::spawn(async move { ipam.auto_assign(req).await })
            })
            .collect();
        let mut addresses = std::collections::BTreeSet::new();
        for t in tasks {
            let got = t.await.unwrap().unwrap().into_inner();
            assert_eq!(got.ipv4.len(), 1, "{got:?}");
            assert!(
                addresses.insert(got.ipv4[0].address.clone()),
                "{got:?} twice"
            );
        }
        let writes = store.revision().await.unwrap().0 - before.0;
        println!(
            "{ADDS} concurrent CNI ADDs on one node: {} addresses, {writes} datastore writes",
            addresses.len()
        );
        assert_eq!(addresses.len(), ADDS);
        assert!(
            writes * 4 <= ADDS as u64,
            "{writes} datastore writes for {ADDS} addresses: the requests did not share them"
        );
    });
}
