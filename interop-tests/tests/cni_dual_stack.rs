//! Dual stack and IPv6 through the CNI plugins, against a real bgpd, in network namespaces:
//! `margay` giving a pod one address of each family (or IPv6 only), wired the way Calico wires
//! it (a /128 on eth0, the default route via the host end's link-local fe80::ecee:eeff:feee:eeee,
//! a /128 host route, proxy NDP and forwarding on the host end), pods reaching each other over
//! both families, CHECK and DEL covering both, nothing half-assigned when one family cannot be
//! served; and `margay-ipam` under Debian's reference `ptp` and `bridge` plugins, run as a
//! runtime runs a chain (exec with the CNI_* environment and the configuration on stdin, DEL in
//! reverse order), with containers reaching each other over both families.
//!
//! Why this file is long: one case per dual-stack behaviour of each plugin, with the kernel
//! state each one must leave, sharing the pod lab.

mod cni_lab;

use cni_lab::*;
use interop_tests::lab::bgpd::bgpctl;
use interop_tests::lab::netns::Netns;
use serde_json::{Value, json};

const GW6: &str = "fe80::ecee:eeff:feee:eeee";

/// The result's address of one family, with its prefix.
fn address(result: &Value, v6: bool) -> String {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap().to_owned())
        .find(|a| a.contains(':') == v6)
        .unwrap_or_else(|| panic!("no IPv{} address in {result}", if v6 { 6 } else { 4 }))
}

/// The same, without the prefix.
fn ip(result: &Value, v6: bool) -> String {
    address(result, v6).split('/').next().unwrap().to_owned()
}

fn ips_entry(result: &Value, v6: bool) -> Value {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["address"].as_str().unwrap().contains(':') == v6)
        .cloned()
        .unwrap()
}

fn dual(node: &Node, version: &str) -> Value {
    let mut conf = node.conf(version);
    // Calico writes these as strings.
    conf["ipam"]["assign_ipv4"] = json!("true");
    conf["ipam"]["assign_ipv6"] = json!("true");
    conf
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one dual-stack pod told in order: the result, the pod side, the host side, traffic, IPAM, then CHECK and its faults"
)]
fn a_dual_stack_pod_is_wired_like_calico_in_both_families() {
    let node = Node::start("ds", &format!("{POOLS_V4}{POOLS_V6}"));
    let pod1 = Netns::new("dsp1").unwrap();
    let pod2 = Netns::new("dsp2").unwrap();
    let mut conf = dual(&node, "1.1.0");
    conf["mtu"] = json!(1400);
    let r1 = node
        .run(
            &margay(),
            &Call::new("ADD", "d1", Some(&pod1.path()), &conf),
        )
        .result();
    let r2 = node
        .run(
            &margay(),
            &Call::new("ADD", "d2", Some(&pod2.path()), &conf),
        )
        .result();

    // The result: one address of each family on the pod's interface, each with its gateway,
    // and a default route per family.
    assert_eq!(r1["ips"].as_array().unwrap().len(), 2, "{r1}");
    let (v4, v6) = (ips_entry(&r1, false), ips_entry(&r1, true));
    assert!(v4["address"].as_str().unwrap().ends_with("/32"), "{v4}");
    assert_eq!(v4["gateway"], "169.254.1.1");
    assert_eq!(v4["interface"], 1);
    let a6 = v6["address"].as_str().unwrap();
    assert!(a6.starts_with("fd00:20:") && a6.ends_with("/128"), "{v6}");
    assert_eq!(v6["gateway"], GW6);
    assert_eq!(v6["interface"], 1);
    assert_eq!(
        r1["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}, {"dst": "::/0", "gw": GW6}])
    );
    assert_eq!(r1["interfaces"][1]["mtu"], 1400, "1.1.0 reports the MTU");
    let (ip4, ip6) = (ip(&r1, false), ip(&r1, true));
    let (peer4, peer6) = (ip(&r2, false), ip(&r2, true));

    // In the pod: the /128 on eth0 and the default route via the host end's link-local.
    let addr6 = pod1
        .ip(&["-o", "-6", "addr", "show", "dev", "eth0", "scope", "global"])
        .unwrap();
    assert!(addr6.contains(&format!("inet6 {ip6}/128")), "{addr6}");
    let routes6 = pod1.ip(&["-6", "route"]).unwrap();
    assert!(
        routes6.contains(&format!("default via {GW6} dev eth0")),
        "{routes6}"
    );

    // On the host: the host end answers as fe80::ecee:eeff:feee:eeee (its MAC's EUI-64), a
    // /128 route to the pod on it, proxy NDP and forwarding on, router advertisements ignored.
    let host_if = cali_name("d1");
    let ll = node.ip(&["-6", "-o", "addr", "show", "dev", &host_if, "scope", "link"]);
    assert!(ll.contains(&format!("inet6 {GW6}/64")), "{ll}");
    let route = node.ip(&["-6", "route", "show", &format!("{ip6}/128")]);
    assert!(
        route.starts_with(&format!("{ip6} dev {host_if} ")),
        "{route}"
    );
    for (key, want) in [("proxy_ndp", "1"), ("forwarding", "1"), ("accept_ra", "0")] {
        assert_eq!(
            node.sysctl(&format!("net/ipv6/conf/{host_if}/{key}")),
            want,
            "{key}"
        );
    }
    assert_eq!(
        node.sysctl(&format!("net/ipv4/conf/{host_if}/proxy_arp")),
        "1"
    );

    // Traffic over both families: pod to pod both ways, node to pod; the gateway resolves to
    // the host end's MAC.
    assert!(ping(&pod1, &peer6), "pod -> pod over IPv6");
    assert!(ping(&pod2, &ip6), "pod -> pod over IPv6, back");
    assert!(ping(&node.ns, &ip6), "node -> pod over IPv6");
    assert!(ping(&pod1, &peer4), "pod -> pod over IPv4");
    let neigh = pod1.ip(&["-6", "neigh", "show", GW6]).unwrap();
    assert!(neigh.contains("lladdr ee:ee:ee:ee:ee:ee"), "{neigh}");

    // IPAM holds both under the pod's handle.
    let mut held = node.handle_addresses(&format!("{NET}.d1"));
    held.sort();
    let mut want = vec![ip4.clone(), ip6.clone()];
    want.sort();
    assert_eq!(held, want);

    // CHECK covers both families: it passes, then names each IPv6 fault.
    let check = Call::new("CHECK", "d1", Some(&pod1.path()), &with_prev(&conf, &r1));
    node.run(&margay(), &check).ok();
    // CHECK fails with error 103 (the interface is not as ADD left it), naming the fault.
    let refused = |fault: &str| {
        let out = node.run(&margay(), &check);
        assert_eq!(out.error_code(), 103);
        assert!(out.message().contains(fault), "{}", out.message());
    };
    node.ip(&["-6", "route", "del", &format!("{ip6}/128")]);
    refused(&format!("host route {ip6}/128 dev {host_if} is missing"));
    node.ip(&["-6", "route", "add", &format!("{ip6}/128"), "dev", &host_if]);
    node.run(&margay(), &check).ok();
    pod1.ip(&["-6", "route", "del", "default"]).unwrap();
    refused(&format!("no default route via {GW6}"));
    pod1.ip(&["-6", "route", "add", "default", "via", GW6, "dev", "eth0"])
        .unwrap();
    node.ns
        .sh(&format!("sysctl -qw net.ipv6.conf.{host_if}.proxy_ndp=0"))
        .unwrap();
    refused(&format!("net/ipv6/conf/{host_if}/proxy_ndp is 0, not 1"));
    node.ns
        .sh(&format!("sysctl -qw net.ipv6.conf.{host_if}.proxy_ndp=1"))
        .unwrap();
    node.ip(&["-6", "addr", "del", &format!("{GW6}/64"), "dev", &host_if]);
    refused(&format!("{host_if} lacks its link-local address {GW6}"));
    node.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{GW6}/64"),
        "dev",
        &host_if,
        "nodad",
    ]);
    node.run(&margay(), &check).ok();
    pod1.ip(&["-6", "addr", "del", &format!("{ip6}/128"), "dev", "eth0"])
        .unwrap();
    refused(&format!("lacks the address {ip6}/128"));

    // DEL releases both families.
    for (cid, pod) in [("d1", &pod1), ("d2", &pod2)] {
        node.run(&margay(), &Call::new("DEL", cid, Some(&pod.path()), &conf))
            .ok();
        assert!(node.handle_addresses(&format!("{NET}.{cid}")).is_empty());
    }
    assert!(node.cali_links().is_empty());
    assert_eq!(node.ipam_used(), 0);
    node.ipam_consistent();
}

#[test]
fn ipv6_only_pods_get_no_ipv4_at_all() {
    let node = Node::start("v6o", &format!("{POOLS_V4}{POOLS_V6}"));
    let pods: Vec<Netns> = (0..2)
        .map(|i| Netns::new(&format!("v6op{i}")).unwrap())
        .collect();
    let mut conf = node.conf("1.0.0");
    conf["ipam"]["assign_ipv4"] = json!("false");
    conf["ipam"]["assign_ipv6"] = json!("true");
    let results: Vec<Value> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            node.run(
                &margay(),
                &Call::new("ADD", &format!("o{i}"), Some(&p.path()), &conf),
            )
            .result()
        })
        .collect();
    let r = &results[0];
    assert_eq!(r["ips"].as_array().unwrap().len(), 1, "{r}");
    assert!(address(r, true).ends_with("/128"), "{r}");
    assert_eq!(r["ips"][0]["gateway"], GW6);
    assert_eq!(r["routes"], json!([{"dst": "::/0", "gw": GW6}]));
    // No IPv4 address, no IPv4 route, nothing held in the IPv4 pool.
    let addr4 = pods[0]
        .ip(&["-o", "-4", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(addr4.trim().is_empty(), "{addr4}");
    let routes4 = pods[0].ip(&["-4", "route"]).unwrap();
    assert!(routes4.trim().is_empty(), "{routes4}");
    assert_eq!(
        node.handle_addresses(&format!("{NET}.o0")),
        [ip(r, true)],
        "only the IPv6 address is allocated"
    );
    let peer = ip(&results[1], true);
    assert!(ping(&pods[0], &peer), "pod -> pod over IPv6");
    assert!(ping(&node.ns, &ip(r, true)), "node -> pod over IPv6");
    node.run(
        &margay(),
        &Call::new("CHECK", "o0", Some(&pods[0].path()), &with_prev(&conf, r)),
    )
    .ok();
    for (i, p) in pods.iter().enumerate() {
        node.run(
            &margay(),
            &Call::new("DEL", &format!("o{i}"), Some(&p.path()), &conf),
        )
        .ok();
    }
    assert!(node.cali_links().is_empty());
    assert_eq!(node.ipam_used(), 0);
}

#[test]
fn a_family_that_cannot_be_served_leaves_nothing_half_assigned() {
    // The IPv6 pool has one address, and it is taken; IPv4 has room.
    let tiny6 =
        "[[ipam.default_pools]]\nname = \"tiny6\"\ncidr = \"fd00:30::/128\"\nblock_size = 128\n";
    let node = Node::start("half", &format!("{POOLS_V4}{tiny6}"));
    let out = bgpctl(
        &node.daemon.socket,
        &[
            "ipam",
            "assign",
            "--handle",
            "ops.hold",
            "--ip",
            "fd00:30::",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(node.ipam_used(), 1);
    let pod = Netns::new("halfp").unwrap();
    let conf = dual(&node, "1.0.0");

    // margay: a CNI error with the spec's shape, no interface, no IPv4 address kept.
    let out = node.run(&margay(), &Call::new("ADD", "h1", Some(&pod.path()), &conf));
    assert_eq!(out.error_code(), 101, "no address: {out:?}");
    assert!(
        out.message().contains("IPv6") || out.message().contains("tiny6"),
        "{}",
        out.message()
    );
    assert!(node.handle_addresses(&format!("{NET}.h1")).is_empty());
    assert!(node.cali_links().is_empty());
    assert!(
        pod.ip(&["-o", "link", "show", "eth0"]).is_err(),
        "no interface in the pod"
    );
    assert_eq!(node.ipam_used(), 1, "only the held IPv6 address is in use");

    // margay-ipam under ptp: the same, and ptp leaves nothing either.
    let ptp = reference("ptp");
    let ptp_conf = json!({
        "cniVersion": "1.0.0", "name": "ptp-net", "type": "ptp", "nodename": "test-node",
        "ipam": {"type": "margay-ipam", "socket": node.daemon.socket,
                 "assign_ipv4": "true", "assign_ipv6": "true"}
    });
    let out = node.run(&ptp, &Call::new("ADD", "h2", Some(&pod.path()), &ptp_conf));
    assert!(!out.status.success(), "{out:?}");
    // Debian's ptp passes our error object on (without a cniVersion of its own).
    let e: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(e["code"], 101, "{out:?}");
    assert!(node.handle_addresses("ptp-net.h2").is_empty());
    assert_eq!(node.ipam_used(), 1);

    // Once the IPv6 address is free, the same ADD gets both.
    let out = bgpctl(
        &node.daemon.socket,
        &["ipam", "release", "--handle", "ops.hold"],
    );
    assert!(out.status.success(), "{out:?}");
    let r = node
        .run(&margay(), &Call::new("ADD", "h1", Some(&pod.path()), &conf))
        .result();
    assert_eq!(ip(&r, true), "fd00:30::");
    assert_eq!(node.handle_addresses(&format!("{NET}.h1")).len(), 2);
    node.run(&margay(), &Call::new("DEL", "h1", Some(&pod.path()), &conf))
        .ok();
    assert_eq!(node.ipam_used(), 0);
    node.ipam_consistent();
}

/// A configuration of `plugin` with margay-ipam handing out both families.
fn reference_conf(node: &Node, net: &str, plugin: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": net,
        "type": plugin,
        "nodename": "test-node",
        "ipam": {
            "type": "margay-ipam",
            "socket": node.daemon.socket,
            "assign_ipv4": "true",
            "assign_ipv6": "true"
        }
    })
}

/// Whether `a` (an address) is the network address or the first address of `block`.
fn is_network_or_first(a: &str, block: &str) -> bool {
    let block: ipnet::IpNet = block.parse().unwrap();
    let a: std::net::IpAddr = a.parse().unwrap();
    let first = match block.network() {
        std::net::IpAddr::V4(n) => std::net::IpAddr::V4((u32::from(n) + 1).into()),
        std::net::IpAddr::V6(n) => std::net::IpAddr::V6((u128::from(n) + 1).into()),
    };
    a == block.network() || a == first
}

#[test]
fn margay_ipam_dual_stack_under_the_reference_ptp_plugin() {
    let ptp = reference("ptp");
    let node = Node::start("ptp6", &format!("{POOLS_V4}{POOLS_V6}"));
    let pods: Vec<Netns> = (0..2)
        .map(|i| Netns::new(&format!("ptp6p{i}")).unwrap())
        .collect();
    let conf = reference_conf(&node, "ptp-net", "ptp");
    let results: Vec<Value> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            node.run(
                &ptp,
                &Call::new("ADD", &format!("p{i}"), Some(&p.path()), &conf),
            )
            .result()
        })
        .collect();
    // Our addresses with their blocks' prefixes, and the link-local gateways ptp puts on its
    // host end: they never collide with a pod's address.
    let r = &results[0];
    assert_eq!(r["ips"].as_array().unwrap().len(), 2, "{r}");
    assert!(address(r, false).ends_with("/26"), "{r}");
    assert!(address(r, true).starts_with("fd00:20:"), "{r}");
    assert!(address(r, true).ends_with("/122"), "{r}");
    assert_eq!(ips_entry(r, false)["gateway"], "169.254.1.1");
    assert_eq!(ips_entry(r, true)["gateway"], GW6);
    let mut held = node.handle_addresses("ptp-net.p0");
    held.sort();
    let mut want = vec![ip(r, false), ip(r, true)];
    want.sort();
    assert_eq!(held, want);
    // The pods reach each other and the node reaches them, over both families.
    for v6 in [false, true] {
        let (a, b) = (ip(&results[0], v6), ip(&results[1], v6));
        assert!(
            ping(&pods[0], &b),
            "pod -> pod, IPv{}",
            if v6 { 6 } else { 4 }
        );
        assert!(
            ping(&pods[1], &a),
            "pod -> pod back, IPv{}",
            if v6 { 6 } else { 4 }
        );
        assert!(
            ping(&node.ns, &a),
            "node -> pod, IPv{}",
            if v6 { 6 } else { 4 }
        );
    }
    // ptp's CHECK runs margay-ipam's, for both addresses.
    node.run(
        &ptp,
        &Call::new("CHECK", "p0", Some(&pods[0].path()), &with_prev(&conf, r)),
    )
    .ok();
    for (i, p) in pods.iter().enumerate() {
        node.run(
            &ptp,
            &Call::new(
                "DEL",
                &format!("p{i}"),
                Some(&p.path()),
                &with_prev(&conf, &results[i]),
            ),
        )
        .ok();
    }
    assert_eq!(node.ipam_used(), 0);
    node.ipam_consistent();
}

/// A chain as a runtime runs it: ADD through each plugin with the previous one's result,
/// DEL in reverse order with the final result.
struct Chain<'a> {
    node: &'a Node,
    plugins: Vec<(std::path::PathBuf, Value)>,
}

impl Chain<'_> {
    fn conf(&self, i: usize, prev: Option<&Value>) -> Value {
        let mut c = self.plugins[i].1.clone();
        if let Some(p) = prev {
            c["prevResult"] = p.clone();
        }
        c
    }

    fn add(&self, cid: &str, pod: &Netns) -> Value {
        let mut prev: Option<Value> = None;
        for (i, (plugin, _)) in self.plugins.iter().enumerate() {
            let c = self.conf(i, prev.as_ref());
            let r = self
                .node
                .run(plugin, &Call::new("ADD", cid, Some(&pod.path()), &c))
                .result();
            prev = Some(r);
        }
        prev.unwrap()
    }

    fn del(&self, cid: &str, pod: &Netns, result: &Value) {
        for (i, (plugin, _)) in self.plugins.iter().enumerate().rev() {
            let c = self.conf(i, Some(result));
            self.node
                .run(plugin, &Call::new("DEL", cid, Some(&pod.path()), &c))
                .ok();
        }
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one chain told in order: bridge and margay-ipam ADD, gateways, reachability over both families, CHECK, DEL in reverse"
)]
fn margay_ipam_dual_stack_under_the_reference_bridge_plugin_as_gateway() {
    let bridge = reference("bridge");
    let tuning = reference("tuning");
    let node = Node::start("br6", &format!("{POOLS_V4}{POOLS_V6}"));
    let pods: Vec<Netns> = (0..3)
        .map(|i| Netns::new(&format!("br6p{i}")).unwrap())
        .collect();
    // The bridge is the pods' gateway (its address in their subnet) and their default route;
    // tuning follows in the chain, as a runtime would run a conflist.
    let mut br = reference_conf(&node, "bridge-net", "bridge");
    br["bridge"] = json!("mgybr6");
    br["isGateway"] = json!(true);
    br["isDefaultGateway"] = json!(true);
    let tu = json!({"cniVersion": "1.0.0", "name": "bridge-net", "type": "tuning",
                    "sysctl": {"net.ipv6.conf.eth0.hop_limit": "33"}});
    let chain = Chain {
        node: &node,
        plugins: vec![(bridge, br), (tuning, tu)],
    };
    let results: Vec<Value> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| chain.add(&format!("b{i}"), p))
        .collect();

    // Every pod's gateway is its block's first address, the same for all of them; no pod
    // holds it (nor the block's network address).
    let blocks = bgpctl(
        &node.daemon.socket,
        &["ipam", "show", "--show-blocks", "--json"],
    );
    assert!(blocks.status.success(), "{blocks:?}");
    for v6 in [false, true] {
        let gws: Vec<&Value> = results
            .iter()
            .map(|r| {
                r["ips"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|i| i["address"].as_str().unwrap().contains(':') == v6)
                    .map(|i| &i["gateway"])
                    .unwrap()
            })
            .collect();
        assert!(gws.iter().all(|g| *g == gws[0]), "{gws:?}");
        let a = address(&results[0], v6);
        let gw = gws[0].as_str().unwrap();
        let block: ipnet::IpNet = a.parse().unwrap();
        assert!(
            block.contains(&gw.parse::<std::net::IpAddr>().unwrap()),
            "{gw} in {a}"
        );
        assert!(
            is_network_or_first(gw, &block.trunc().to_string()),
            "{gw} of {a}"
        );
        for r in &results {
            assert!(
                !is_network_or_first(&ip(r, v6), &block.trunc().to_string()),
                "a pod got {} of {}",
                ip(r, v6),
                block.trunc()
            );
        }
        // The bridge holds the gateway with the block's prefix.
        let on_bridge = node.ip(&["-o", "addr", "show", "dev", "mgybr6"]);
        assert!(
            on_bridge.contains(&format!("{gw}/{}", block.prefix_len())),
            "{on_bridge}"
        );
    }
    assert_eq!(
        pods[0]
            .exec("cat", &["/proc/sys/net/ipv6/conf/eth0/hop_limit"])
            .unwrap()
            .trim(),
        "33",
        "tuning ran after bridge"
    );

    // Containers reach each other across the bridge, and the gateway, over both families.
    for v6 in [false, true] {
        let family = if v6 { "IPv6" } else { "IPv4" };
        let gw = ips_entry(&results[0], v6)["gateway"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(ping(&pods[0], &ip(&results[1], v6)), "pod -> pod, {family}");
        assert!(ping(&pods[2], &ip(&results[0], v6)), "pod -> pod, {family}");
        assert!(ping(&pods[1], &gw), "pod -> gateway, {family}");
        assert!(
            ping(&node.ns, &ip(&results[2], v6)),
            "node -> pod, {family}"
        );
    }

    // bridge's CHECK runs margay-ipam's.
    node.run(
        &reference("bridge"),
        &Call::new(
            "CHECK",
            "b0",
            Some(&pods[0].path()),
            &chain.conf(0, Some(&results[0])),
        ),
    )
    .ok();
    // DEL through the chain, in reverse: every address is given back.
    for (i, p) in pods.iter().enumerate() {
        chain.del(&format!("b{i}"), p, &results[i]);
        assert!(
            node.handle_addresses(&format!("bridge-net.b{i}"))
                .is_empty()
        );
    }
    assert_eq!(node.ipam_used(), 0);
    node.ipam_consistent();
}
