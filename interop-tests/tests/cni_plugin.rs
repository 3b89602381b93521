//! The `margay` CNI plugin against a real bgpd, in network namespaces: a pod wired the way
//! Calico wires it and reachable, CHECK, DEL (twice, after the namespace is gone), rollback of
//! a failed ADD, the spec's error codes for bad input, the versions 0.4.0 / 1.0.0 / 1.1.0 with
//! GC and STATUS, and IPAM delegated to the reference host-local plugin.
//!
//! Why this file is long: one case per CNI behaviour the spec and Calico define, sharing the pod
//! lab set-up.

mod cni_lab;

use cni_lab::*;
use interop_tests::lab::bgpd::bgpctl;
use interop_tests::lab::netns::Netns;
use serde_json::{Value, json};

const K8S_ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u1";

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one ADD checked in order: the result, the host side, the pod side, reachability, IPAM's handle"
)]
fn add_wires_a_pod_like_calico_and_it_is_reachable() {
    let node = Node::start("add", POOLS_V4);
    let pod1 = Netns::new("addp1").unwrap();
    let pod2 = Netns::new("addp2").unwrap();
    let conf = node.conf("1.0.0");

    let r1 = node
        .run(
            &margay(),
            &Call::new("ADD", "c1", Some(&pod1.path()), &conf).set("CNI_ARGS", K8S_ARGS),
        )
        .result();
    let r2 = node
        .run(
            &margay(),
            &Call::new("ADD", "c2", Some(&pod2.path()), &conf),
        )
        .result();

    // The result: host interface first (Calico's name and MAC), then the pod's, one /32 on it.
    let host_if = cali_name("default.web-0");
    assert_eq!(r1["cniVersion"], "1.0.0");
    assert_eq!(r1["interfaces"][0]["name"], host_if.as_str());
    assert_eq!(r1["interfaces"][0]["mac"], "ee:ee:ee:ee:ee:ee");
    assert!(r1["interfaces"][0].get("sandbox").is_none());
    assert_eq!(r1["interfaces"][1]["name"], "eth0");
    assert_eq!(
        r1["interfaces"][1]["sandbox"],
        pod1.path().display().to_string()
    );
    assert_eq!(r1["ips"].as_array().unwrap().len(), 1);
    assert_eq!(r1["ips"][0]["interface"], 1);
    assert_eq!(r1["ips"][0]["gateway"], "169.254.1.1");
    assert!(r1["ips"][0]["address"].as_str().unwrap().ends_with("/32"));
    assert_eq!(
        r1["routes"][0],
        json!({"dst": "0.0.0.0/0", "gw": "169.254.1.1"})
    );
    // Without pod names the container id names the host interface.
    assert_eq!(r2["interfaces"][0]["name"], cali_name("c2").as_str());
    let (ip1, ip2) = (first_ip(&r1), first_ip(&r2));
    assert_ne!(ip1, ip2);
    assert!(ip1.starts_with("172.20."), "{ip1}");

    // Host side: veth, MAC, up, MTU = uplink 1500 - VXLAN 50, sysctls, the /32 route.
    let link = node.ip(&["-d", "link", "show", &host_if]);
    assert!(link.contains("link/ether ee:ee:ee:ee:ee:ee"), "{link}");
    assert!(
        link.contains("veth") && link.contains("mtu 1450") && link.contains(",UP"),
        "{link}"
    );
    for (key, want) in [
        ("proxy_arp", "1"),
        ("forwarding", "1"),
        ("route_localnet", "1"),
    ] {
        assert_eq!(
            node.sysctl(&format!("net/ipv4/conf/{host_if}/{key}")),
            want,
            "{key}"
        );
    }
    assert_eq!(
        node.sysctl(&format!("net/ipv4/neigh/{host_if}/proxy_delay")),
        "0"
    );
    assert_eq!(
        node.sysctl(&format!("net/ipv6/conf/{host_if}/accept_ra")),
        "0"
    );
    let route = node.ip(&["route", "show", &format!("{ip1}/32")]);
    assert_eq!(
        route.trim(),
        format!("{ip1} dev {host_if} scope link"),
        "protocol boot, scope link"
    );

    // Pod side: eth0 with the /32, 169.254.1.1 on-link, default via it, forwarding off.
    let addr = pod1
        .ip(&["-o", "-4", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(addr.contains(&format!("inet {ip1}/32")), "{addr}");
    let routes = pod1.ip(&["route"]).unwrap();
    assert!(
        routes.contains("default via 169.254.1.1 dev eth0"),
        "{routes}"
    );
    assert!(
        routes.contains("169.254.1.1 dev eth0 scope link"),
        "{routes}"
    );
    assert!(
        pod1.ip(&["link", "show", "eth0"])
            .unwrap()
            .contains("mtu 1450")
    );
    assert_eq!(
        pod1.exec("cat", &["/proc/sys/net/ipv4/ip_forward"])
            .unwrap()
            .trim(),
        "0"
    );

    // Reachable: the node, the other pod; the gateway resolves to the host side's MAC.
    assert!(ping(&pod1, NODE_IP), "pod -> node");
    assert!(ping(&pod1, &ip2), "pod -> pod");
    assert!(ping(&node.ns, &ip1), "node -> pod");
    let neigh = pod1.ip(&["neigh", "show", "169.254.1.1"]).unwrap();
    assert!(neigh.contains("lladdr ee:ee:ee:ee:ee:ee"), "{neigh}");

    // IPAM: handle <network>.<container id> with the workload's attributes.
    assert_eq!(
        node.handle_addresses(&format!("{NET}.c1")),
        std::slice::from_ref(&ip1)
    );
    let attrs = node.handle_attributes(&format!("{NET}.c1"));
    assert_eq!(attrs["namespace"], "default");
    assert_eq!(attrs["pod"], "web-0");
    assert_eq!(attrs["node"], "test-node");
    assert_eq!(attrs["container_id"], "c1");

    for (cid, pod) in [("c1", &pod1), ("c2", &pod2)] {
        node.run(&margay(), &Call::new("DEL", cid, Some(&pod.path()), &conf))
            .ok();
    }
    assert!(node.cali_links().is_empty());
    assert_eq!(node.ipam_used(), 0);
}

#[test]
fn check_passes_then_fails_after_the_host_route_is_deleted() {
    let node = Node::start("chk", POOLS_V4);
    let pod = Netns::new("chkp").unwrap();
    let conf = node.conf("1.0.0");
    let r = node
        .run(&margay(), &Call::new("ADD", "k1", Some(&pod.path()), &conf))
        .result();
    let check = Call::new("CHECK", "k1", Some(&pod.path()), &with_prev(&conf, &r));
    node.run(&margay(), &check).ok();

    let ip = first_ip(&r);
    node.ip(&["route", "del", &format!("{ip}/32")]);
    let out = node.run(&margay(), &check);
    assert_eq!(out.error_code(), 103);
    assert!(
        out.message()
            .contains(&format!("host route {ip}/32 dev {}", cali_name("k1"))),
        "{}",
        out.message()
    );

    // Other faults are named too: the pod address gone, the MAC changed.
    node.ip(&["route", "add", &format!("{ip}/32"), "dev", &cali_name("k1")]);
    node.run(&margay(), &check).ok();
    pod.ip(&["addr", "del", &format!("{ip}/32"), "dev", "eth0"])
        .unwrap();
    let out = node.run(&margay(), &check);
    assert_eq!(out.error_code(), 103);
    assert!(
        out.message().contains("lacks the address"),
        "{}",
        out.message()
    );

    // CHECK without prevResult is a configuration error; CHECK in 0.3.1 does not exist.
    let out = node.run(
        &margay(),
        &Call::new("CHECK", "k1", Some(&pod.path()), &conf),
    );
    assert_eq!(out.error_code(), 7);
    let out = node.run(
        &margay(),
        &Call::new("CHECK", "k1", Some(&pod.path()), &node.conf("0.3.1")),
    );
    assert_eq!(out.error_code(), 1);
    node.run(&margay(), &Call::new("DEL", "k1", Some(&pod.path()), &conf))
        .ok();
}

#[test]
fn del_is_idempotent_and_works_after_the_namespace_is_gone() {
    let node = Node::start("del", POOLS_V4);
    let conf = node.conf("1.0.0");
    let pod = Netns::new("delp").unwrap();
    node.run(&margay(), &Call::new("ADD", "x1", Some(&pod.path()), &conf))
        .result();
    let del = Call::new("DEL", "x1", Some(&pod.path()), &conf);
    node.run(&margay(), &del).ok();
    node.run(&margay(), &del).ok();
    assert!(node.handle_addresses(&format!("{NET}.x1")).is_empty());

    // The namespace is deleted before DEL: the veth went with it, the address is released.
    let gone = Netns::new("delgone").unwrap();
    let path = gone.path();
    let r = node
        .run(&margay(), &Call::new("ADD", "x2", Some(&path), &conf))
        .result();
    assert_eq!(node.handle_addresses(&format!("{NET}.x2")), [first_ip(&r)]);
    drop(gone);
    assert!(!path.exists());
    node.run(&margay(), &Call::new("DEL", "x2", Some(&path), &conf))
        .ok();
    // And without CNI_NETNS at all.
    node.run(&margay(), &Call::new("DEL", "x2", None, &conf))
        .ok();
    assert!(node.handle_addresses(&format!("{NET}.x2")).is_empty());
    // The kernel tears a deleted namespace's veth down asynchronously: give it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !node.cali_links().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(node.cali_links().is_empty());
    assert_eq!(node.ipam_used(), 0);
}

#[test]
fn failed_adds_leave_nothing_behind() {
    let node = Node::start("fail", POOLS_V4);
    let conf = node.conf("1.0.0");

    // A missing namespace: "container unknown", and nothing allocated.
    let missing = std::path::PathBuf::from(format!(
        "/run/netns/{}-nonexistent",
        interop_tests::lab::netns::run_prefix()
    ));
    let out = node.run(&margay(), &Call::new("ADD", "f1", Some(&missing), &conf));
    assert_eq!(out.error_code(), 3, "{out:?}");
    assert_eq!(node.ipam_used(), 0);

    // The container already has the interface: the veth cannot be made after IPAM allocated;
    // everything is rolled back.
    let pod = Netns::new("failp").unwrap();
    let out = node.run(
        &margay(),
        &Call::new("ADD", "f2", Some(&pod.path()), &conf).set("CNI_IFNAME", "lo"),
    );
    assert_eq!(out.error_code(), 100, "{out:?}");
    assert!(
        out.message().contains("already exists"),
        "{}",
        out.message()
    );
    assert!(out.message().contains("rolled back"), "{}", out.message());
    assert!(node.cali_links().is_empty());
    assert!(node.handle_addresses(&format!("{NET}.f2")).is_empty());
    assert_eq!(node.ipam_used(), 0);

    // A stale host interface of the same pod (an earlier sandbox) is replaced, as Calico does.
    let old = Netns::new("failold").unwrap();
    let args = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p";
    node.run(
        &margay(),
        &Call::new("ADD", "old", Some(&old.path()), &conf).set("CNI_ARGS", args),
    )
    .result();
    let r = node
        .run(
            &margay(),
            &Call::new("ADD", "new", Some(&pod.path()), &conf).set("CNI_ARGS", args),
        )
        .result();
    assert_eq!(node.cali_links(), [cali_name("ns.p")]);
    assert!(ping(&pod, NODE_IP));
    // The old sandbox's DEL neither breaks the new pod nor keeps its address.
    node.run(
        &margay(),
        &Call::new("DEL", "old", Some(&old.path()), &conf).set("CNI_ARGS", args),
    )
    .ok();
    assert!(ping(&pod, NODE_IP));
    assert_eq!(node.handle_addresses(&format!("{NET}.new")), [first_ip(&r)]);
    node.run(
        &margay(),
        &Call::new("DEL", "new", Some(&pod.path()), &conf).set("CNI_ARGS", args),
    )
    .ok();
    assert_eq!(node.ipam_used(), 0);
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a list of bad inputs and the CNI error code each must get, then a check that none allocated or wired anything"
)]
fn bad_input_gets_the_specs_error_codes() {
    let node = Node::start("bad", POOLS_V4);
    let pod = Netns::new("badp").unwrap();
    let conf = node.conf("1.0.0");
    let add = || Call::new("ADD", "b1", Some(&pod.path()), &conf);
    let cases: Vec<(&str, Call, u64)> = vec![
        (
            "malformed JSON",
            add().stdin(b"{\"cniVersion\": \"1.0.0\", "),
            6,
        ),
        ("not an object", add().stdin(b"[]"), 6),
        ("empty stdin", add().stdin(b""), 6),
        (
            "unknown cniVersion",
            add().stdin(
                json!({"cniVersion": "9.9.9", "name": NET, "type": "margay"})
                    .to_string()
                    .as_bytes(),
            ),
            1,
        ),
        (
            "no cniVersion (0.1.0)",
            add().stdin(
                json!({"name": NET, "type": "margay"})
                    .to_string()
                    .as_bytes(),
            ),
            1,
        ),
        (
            "cniVersion not a version",
            add().stdin(
                json!({"cniVersion": "latest", "name": NET, "type": "margay"})
                    .to_string()
                    .as_bytes(),
            ),
            6,
        ),
        ("missing CNI_NETNS", add().unset("CNI_NETNS"), 4),
        ("missing CNI_CONTAINERID", add().unset("CNI_CONTAINERID"), 4),
        ("missing CNI_IFNAME", add().unset("CNI_IFNAME"), 4),
        ("missing CNI_COMMAND", add().unset("CNI_COMMAND"), 4),
        ("unknown CNI_COMMAND", add().set("CNI_COMMAND", "ATTACH"), 4),
        ("bad container id", add().set("CNI_CONTAINERID", "-x"), 4),
        (
            "interface name too long",
            add().set("CNI_IFNAME", "a23456789012345x"),
            4,
        ),
        ("bad CNI_ARGS", add().set("CNI_ARGS", "garbage"), 4),
        (
            "netns that is not one",
            add().set("CNI_NETNS", "/etc/hostname"),
            4,
        ),
        (
            "missing name",
            add().stdin(
                json!({"cniVersion": "1.0.0", "type": "margay"})
                    .to_string()
                    .as_bytes(),
            ),
            7,
        ),
        (
            "bad mtu",
            add().stdin(with_key(&conf, "mtu", json!(10)).to_string().as_bytes()),
            7,
        ),
        (
            "ipMasq",
            add().stdin(
                with_key(&conf, "ipMasq", json!(true))
                    .to_string()
                    .as_bytes(),
            ),
            2,
        ),
        (
            "unknown ipam.gateway",
            add().stdin(
                with_key(
                    &conf,
                    "ipam",
                    json!({"type": "margay-ipam", "gateway": "10.0.0.1"}),
                )
                .to_string()
                .as_bytes(),
            ),
            7,
        ),
        (
            "block gateways for margay's own pods",
            add().stdin(
                with_key(
                    &conf,
                    "ipam",
                    json!({"type": "margay-ipam", "gateway": "block"}),
                )
                .to_string()
                .as_bytes(),
            ),
            7,
        ),
        ("GC in 1.0.0", Call::new("GC", "", None, &conf), 1),
        (
            "GC without CNI_PATH",
            Call::new("GC", "", None, &node.conf("1.1.0")).unset("CNI_PATH"),
            4,
        ),
    ];
    for (what, call, want) in cases {
        let out = node.run(&margay(), &call);
        assert_eq!(out.error_code(), want, "{what}: {out:#?}");
        // margay-ipam validates the same way (it never opens the namespace).
        if what != "netns that is not one" {
            let out = node.run(&margay_ipam(), &call);
            assert_eq!(out.error_code(), want, "margay-ipam, {what}: {out:#?}");
        }
    }
    // Nothing was allocated or wired by any of them.
    assert!(node.cali_links().is_empty());
    assert_eq!(node.ipam_used(), 0);
    // The error is printed in the configuration's version.
    let out = node.run(
        &margay(),
        &Call::new("ADD", "b1", Some(&pod.path()), &node.conf("0.4.0")).unset("CNI_NETNS"),
    );
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "0.4.0");
}

fn with_key(conf: &Value, key: &str, value: Value) -> Value {
    let mut c = conf.clone();
    c[key] = value;
    c
}

#[test]
fn versions_0_4_0_1_0_0_and_1_1_0() {
    let node = Node::start("ver", POOLS_V4);
    for bin in [margay(), margay_ipam()] {
        let out = node.run(
            &bin,
            &Call::new("VERSION", "", None, &json!({"cniVersion": "1.0.0"})),
        );
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(
            v["supportedVersions"],
            json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
    }
    for (i, version) in ["0.4.0", "1.0.0", "1.1.0"].iter().enumerate() {
        let pod = Netns::new(&format!("verp{i}")).unwrap();
        let conf = node.conf(version);
        let cid = format!("v{i}");
        let r = node
            .run(&margay(), &Call::new("ADD", &cid, Some(&pod.path()), &conf))
            .result();
        assert_eq!(r["cniVersion"], *version);
        assert_eq!(
            r["ips"][0].get("version").is_some(),
            *version == "0.4.0",
            "{r}"
        );
        assert_eq!(
            r["interfaces"][1].get("mtu").is_some(),
            *version == "1.1.0",
            "{r}"
        );
        assert!(ping(&pod, NODE_IP), "{version}");
        // CHECK exists from 0.4.0 on, and reads the result in its own version.
        node.run(
            &margay(),
            &Call::new("CHECK", &cid, Some(&pod.path()), &with_prev(&conf, &r)),
        )
        .ok();
        node.run(
            &margay(),
            &Call::new("DEL", &cid, Some(&pod.path()), &with_prev(&conf, &r)),
        )
        .ok();
    }
    assert_eq!(node.ipam_used(), 0);
}

#[test]
fn gc_releases_only_this_networks_stale_handles() {
    let node = Node::start("gc", POOLS_V4);
    let conf = node.conf("1.1.0");
    let pods: Vec<Netns> = (0..3)
        .map(|i| Netns::new(&format!("gcp{i}")).unwrap())
        .collect();
    for (i, pod) in pods.iter().enumerate() {
        node.run(
            &margay(),
            &Call::new("ADD", &format!("g{i}"), Some(&pod.path()), &conf),
        )
        .result();
    }
    // Another network's allocation on the same node.
    let out = bgpctl(
        &node.daemon.socket,
        &["ipam", "assign", "--handle", "other-net.z9"],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(node.ipam_used(), 4);

    // The runtime still knows g0 and g2; g1 leaked (say its DEL was lost).
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "g0", "ifname": "eth0"},
        {"containerID": "g2", "ifname": "eth0"}
    ]);
    node.run(
        &margay(),
        &Call::new("GC", "", None, &gc)
            .unset("CNI_CONTAINERID")
            .unset("CNI_IFNAME"),
    )
    .ok();
    assert!(node.handle_addresses(&format!("{NET}.g1")).is_empty());
    assert_eq!(node.handle_addresses(&format!("{NET}.g0")).len(), 1);
    assert_eq!(node.handle_addresses(&format!("{NET}.g2")).len(), 1);
    assert_eq!(node.handle_addresses("other-net.z9").len(), 1);
    // margay-ipam's GC is the same; an empty list releases the rest of this network.
    let mut all = conf.clone();
    all["cni.dev/valid-attachments"] = json!([]);
    node.run(&margay_ipam(), &Call::new("GC", "", None, &all))
        .ok();
    assert_eq!(
        node.ipam_used(),
        1,
        "only the other network's address is left"
    );
    node.ipam_consistent();
}

#[test]
fn status_reports_bgpd_and_pools() {
    let node = Node::start("st", POOLS_V4);
    let conf = node.conf("1.1.0");
    node.run(&margay(), &Call::new("STATUS", "", None, &conf))
        .ok();
    node.run(&margay_ipam(), &Call::new("STATUS", "", None, &conf))
        .ok();

    // No IPv6 pool exists: a node asked for dual stack cannot serve.
    let mut v6 = conf.clone();
    v6["ipam"]["assign_ipv6"] = json!(true);
    let out = node.run(&margay(), &Call::new("STATUS", "", None, &v6));
    assert_eq!(out.error_code(), 50);
    assert!(out.message().contains("IPv6"), "{}", out.message());
    // A pool list naming no existing pool.
    let mut named = conf.clone();
    named["ipam"]["ipv4_pools"] = json!(["nonexistent"]);
    assert_eq!(
        node.run(&margay(), &Call::new("STATUS", "", None, &named))
            .error_code(),
        50
    );
    // bgpd unreachable.
    let mut away = conf.clone();
    away["socket"] = json!("/nonexistent/bgpd.sock");
    let started = std::time::Instant::now();
    let out = node.run(&margay(), &Call::new("STATUS", "", None, &away));
    assert_eq!(out.error_code(), 50);
    assert!(
        out.message().contains("/nonexistent/bgpd.sock"),
        "{}",
        out.message()
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // STATUS does not exist before 1.1.0.
    assert_eq!(
        node.run(
            &margay(),
            &Call::new("STATUS", "", None, &node.conf("1.0.0"))
        )
        .error_code(),
        1
    );
}

#[test]
fn bgpd_unreachable_is_try_again_later_never_a_silent_success() {
    let node = Node::start("unr", POOLS_V4);
    let pod = Netns::new("unrp").unwrap();
    let mut conf = node.conf("1.0.0");
    conf["socket"] = json!(format!("{}/absent.sock", node.daemon.dir.path().display()));
    conf["bgpd_retry_seconds"] = json!(0.5);
    let started = std::time::Instant::now();
    let out = node.run(&margay(), &Call::new("ADD", "u1", Some(&pod.path()), &conf));
    assert_eq!(out.error_code(), 11, "{out:?}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "bounded retries"
    );
    assert!(out.message().contains("absent.sock"), "{}", out.message());
    assert!(node.cali_links().is_empty());
    // DEL cannot release: it says so (code 11) instead of pretending.
    let out = node.run(&margay(), &Call::new("DEL", "u1", Some(&pod.path()), &conf));
    assert_eq!(out.error_code(), 11);
    let out = node.run(
        &margay_ipam(),
        &Call::new("DEL", "u1", Some(&pod.path()), &conf),
    );
    assert_eq!(out.error_code(), 11);
}

#[test]
fn requested_addresses_are_honoured() {
    let node = Node::start("req", POOLS_V4);
    let pod = Netns::new("reqp").unwrap();
    let conf = node.conf("1.0.0");
    let r = node
        .run(
            &margay(),
            &Call::new("ADD", "r1", Some(&pod.path()), &conf).set("CNI_ARGS", "IP=172.20.99.9"),
        )
        .result();
    assert_eq!(r["ips"][0]["address"], "172.20.99.9/32");
    // runtimeConfig.ips wins over CNI_ARGS; an address in use is refused and nothing is left.
    let pod2 = Netns::new("reqp2").unwrap();
    let mut taken = conf.clone();
    taken["runtimeConfig"] = json!({"ips": ["172.20.99.9/24"]});
    let out = node.run(
        &margay(),
        &Call::new("ADD", "r2", Some(&pod2.path()), &taken).set("CNI_ARGS", "IP=172.20.99.10"),
    );
    assert_eq!(out.error_code(), 102, "{out:?}");
    assert_eq!(node.cali_links().len(), 1);
    assert_eq!(node.ipam_used(), 1);
    node.run(&margay(), &Call::new("DEL", "r1", Some(&pod.path()), &conf))
        .ok();
    node.run(
        &margay(),
        &Call::new("DEL", "r2", Some(&pod2.path()), &conf),
    )
    .ok();
    assert_eq!(node.ipam_used(), 0);
}

#[test]
fn ipam_can_be_delegated_to_host_local() {
    reference("host-local");
    let node = Node::start("hl", POOLS_V4);
    let pod = Netns::new("hlp").unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut conf = node.conf("1.0.0");
    conf["ipam"] = json!({
        "type": "host-local",
        "ranges": [[{"subnet": "10.77.0.0/24"}]],
        "dataDir": data.path()
    });
    let r = node
        .run(&margay(), &Call::new("ADD", "h1", Some(&pod.path()), &conf))
        .result();
    let ip = first_ip(&r);
    assert!(ip.starts_with("10.77.0."), "{ip}");
    assert_eq!(r["ips"][0]["address"], format!("{ip}/32"));
    assert!(ping(&pod, NODE_IP));
    node.run(
        &margay(),
        &Call::new("CHECK", "h1", Some(&pod.path()), &with_prev(&conf, &r)),
    )
    .ok();
    node.run(&margay(), &Call::new("DEL", "h1", Some(&pod.path()), &conf))
        .ok();
    // host-local keeps one file per address: gone after DEL.
    let left: Vec<_> = walk(data.path())
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("10.77."))
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(node.ipam_used(), 0, "our IPAM was not used");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn pools_are_chosen_by_the_configuration_and_dual_stack_is_all_or_nothing() {
    let pools =
        format!("{POOLS_V4}[[ipam.default_pools]]\nname = \"blue\"\ncidr = \"172.21.0.0/16\"\n");
    let node = Node::start("pool", &pools);
    let pod = Netns::new("poolp").unwrap();
    let mut conf = node.conf("1.0.0");
    conf["ipam"]["ipv4_pools"] = json!(["blue"]);
    let r = node
        .run(&margay(), &Call::new("ADD", "p1", Some(&pod.path()), &conf))
        .result();
    assert!(first_ip(&r).starts_with("172.21."), "{r}");
    node.run(&margay(), &Call::new("DEL", "p1", Some(&pod.path()), &conf))
        .ok();

    // IPv6 asked for, no IPv6 pool: the IPv4 address is not kept either, nothing is wired.
    let mut dual = node.conf("1.0.0");
    dual["ipam"]["assign_ipv6"] = json!(true);
    let out = node.run(&margay(), &Call::new("ADD", "p2", Some(&pod.path()), &dual));
    let code = out.error_code();
    assert!(code == 101 || code == 102, "{out:?}");
    assert_eq!(node.ipam_used(), 0);
    assert!(node.cali_links().is_empty());
    let out = node.run(
        &margay_ipam(),
        &Call::new("ADD", "p2", Some(&pod.path()), &dual),
    );
    assert!(!out.status.success());
    assert_eq!(node.ipam_used(), 0);
}

#[test]
fn the_install_command_puts_plugins_and_conflist_in_place() {
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("opt/cni/bin");
    let conf = root.path().join("etc/cni/net.d");
    let out = std::process::Command::new(interop_tests::lab::binary("margay-cni-install"))
        .arg("--bin-dir")
        .arg(&bin)
        .arg("--conf-dir")
        .arg(&conf)
        .args(["--socket", "/run/test/bgpd.sock", "--mtu", "1400"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for b in ["margay", "margay-ipam"] {
        let v = std::process::Command::new(bin.join(b))
            .env_clear()
            .env("CNI_COMMAND", "VERSION")
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&v.stdout).unwrap();
        assert_eq!(v["supportedVersions"][4], "1.1.0", "{b}");
    }
    let list: Value =
        serde_json::from_str(&std::fs::read_to_string(conf.join("10-margay.conflist")).unwrap())
            .unwrap();
    assert_eq!(list["plugins"][0]["type"], "margay");
    assert_eq!(list["plugins"][0]["socket"], "/run/test/bgpd.sock");
    assert_eq!(list["plugins"][0]["mtu"], 1400);
    assert_eq!(list["plugins"][0]["ipam"]["type"], "margay-ipam");
    assert_eq!(list["plugins"][1]["type"], "portmap");
    assert_eq!(list["plugins"][2]["type"], "bandwidth");
    assert_eq!(list["plugins"][2]["capabilities"]["bandwidth"], true);
    let install = |extra: &[&str]| {
        std::process::Command::new(interop_tests::lab::binary("margay-cni-install"))
            .arg("--bin-dir")
            .arg(&bin)
            .arg("--conf-dir")
            .arg(&conf)
            .args(extra)
            .output()
            .unwrap()
    };
    // Its own conflist it replaces (a new MTU lands).
    let out = install(&["--mtu", "1300"]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(conf.join("10-margay.conflist")).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["plugins"][0]["mtu"],
        1300
    );
    // A conflist it did not write is never overwritten: refused with the reason, or kept.
    std::fs::write(conf.join("10-margay.conflist"), "{}").unwrap();
    let out = install(&[]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not written by margay-cni-install"), "{err}");
    let out = install(&["--keep-conf"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(conf.join("10-margay.conflist")).unwrap(),
        "{}"
    );
    // --force replaces it.
    let out = install(&["--force"]);
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(conf.join("10-margay.conflist")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["margay"]["writtenBy"], "margay-cni-install", "{text}");
}
