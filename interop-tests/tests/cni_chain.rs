//! margay in chains with Debian's reference plugins (/usr/lib/cni, containernetworking-plugins):
//! `margay` followed by `portmap` (a TCP port in the pod reached through the node's host port),
//! by `tuning` and `bandwidth` (they accept our result), and `margay-ipam` under `ptp` (the pod
//! gets our address and works), and no pod of such a plugin gets its subnet's own addresses
//! (network, broadcast, a gateway in the block). All inside network namespaces.

mod cni_lab;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use cni_lab::*;
use interop_tests::lab::netns::Netns;
use serde_json::{Value, json};

/// The conflist as configs/10-margay.conflist ships it, pointed at this node's bgpd.
fn conflist(node: &Node) -> Value {
    let mut list: Value =
        serde_json::from_str(include_str!("../../configs/10-margay.conflist")).unwrap();
    let margay = &mut list["plugins"][0];
    margay["socket"] = json!(node.daemon.socket);
    margay["nodename"] = json!("test-node");
    margay["log_file_path"] = json!(node.daemon.dir.path().join("cni.log"));
    list
}

/// What a runtime passes to plugin `i` of `list` (name and cniVersion from the list).
fn plugin_conf(list: &Value, i: usize, prev: Option<&Value>, runtime: Option<Value>) -> Value {
    let mut c = list["plugins"][i].clone();
    c["name"] = list["name"].clone();
    c["cniVersion"] = list["cniVersion"].clone();
    if let Some(p) = prev {
        c["prevResult"] = p.clone();
    }
    if let (Some(rc), Some(caps)) = (runtime, c.get("capabilities").cloned()) {
        // Only the capabilities the plugin declares reach it.
        let mut given = serde_json::Map::new();
        for (k, v) in rc.as_object().unwrap() {
            if caps.get(k) == Some(&json!(true)) {
                given.insert(k.clone(), v.clone());
            }
        }
        c["runtimeConfig"] = Value::Object(given);
    }
    c.as_object_mut().unwrap().remove("capabilities");
    c
}

#[test]
fn portmap_reaches_a_tcp_port_in_the_pod_through_the_host_port() {
    let portmap = reference("portmap");
    let node = Node::start("pm", POOLS_V4);
    let pod = Netns::new("pmp").unwrap();
    let list = conflist(&node);
    let net = list["name"].as_str().unwrap().to_owned();
    let runtime =
        json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]});

    // ADD through the chain, each plugin given the previous one's result.
    let c0 = plugin_conf(&list, 0, None, Some(runtime.clone()));
    let r0 = node
        .run(&margay(), &Call::new("ADD", "pm1", Some(&pod.path()), &c0))
        .result();
    let c1 = plugin_conf(&list, 1, Some(&r0), Some(runtime.clone()));
    let r1 = node
        .run(&portmap, &Call::new("ADD", "pm1", Some(&pod.path()), &c1))
        .result();
    assert_eq!(r1["ips"], r0["ips"], "portmap passes our result on");
    let pod_ip = first_ip(&r0);

    // A server in the pod on port 80; a client in the world connects to the node's port 8080.
    let listener = pod
        .run_in(|| TcpListener::bind("0.0.0.0:80"))
        .unwrap()
        .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        s.write_all(b"hello from the pod\n").unwrap();
        peer
    });
    let reply = node
        .world
        .run_in(|| {
            let mut s = TcpStream::connect_timeout(
                &format!("{NODE_IP}:8080").parse().unwrap(),
                Duration::from_secs(5),
            )?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok::<_, std::io::Error>(text)
        })
        .unwrap()
        .expect("the host port forwards to the pod");
    assert_eq!(reply, "hello from the pod\n");
    let peer = server.join().unwrap();
    assert_eq!(
        peer.ip().to_string(),
        WORLD_IP,
        "no SNAT for outside clients"
    );

    // CHECK our plugin with the chain's final result. (Debian's portmap 1.1.1 fails its own
    // CHECK on IPv4-only pods when ip6tables exists: it looks for an IPv6 chain it never made.)
    let c = plugin_conf(&list, 0, Some(&r1), Some(runtime.clone()));
    node.run(&margay(), &Call::new("CHECK", "pm1", Some(&pod.path()), &c))
        .ok();
    // DEL in reverse order, then nothing is left.
    for (i, plugin) in [(1, portmap), (0, margay())] {
        let c = plugin_conf(&list, i, Some(&r1), Some(runtime.clone()));
        node.run(&plugin, &Call::new("DEL", "pm1", Some(&pod.path()), &c))
            .ok();
    }
    let nat = node.ns.exec("iptables-save", &["-t", "nat"]).unwrap();
    assert!(!nat.contains(&pod_ip), "portmap's rules are gone: {nat}");
    assert!(node.cali_links().is_empty());
    assert!(node.handle_addresses(&format!("{net}.pm1")).is_empty());
}

#[test]
fn tuning_and_bandwidth_accept_our_result() {
    let tuning = reference("tuning");
    let bandwidth = reference("bandwidth");
    let node = Node::start("tb", POOLS_V4);
    let pod = Netns::new("tbp").unwrap();
    let conf = node.conf("1.0.0");
    let r = node
        .run(
            &margay(),
            &Call::new("ADD", "tb1", Some(&pod.path()), &conf),
        )
        .result();
    let mut t = json!({"cniVersion": "1.0.0", "name": NET, "type": "tuning",
                       "sysctl": {"net.core.somaxconn": "512"}});
    t["prevResult"] = r.clone();
    let rt = node
        .run(&tuning, &Call::new("ADD", "tb1", Some(&pod.path()), &t))
        .result();
    assert_eq!(rt["ips"], r["ips"]);
    assert_eq!(
        pod.exec("cat", &["/proc/sys/net/core/somaxconn"])
            .unwrap()
            .trim(),
        "512"
    );
    let mut b = json!({"cniVersion": "1.0.0", "name": NET, "type": "bandwidth",
                       "ingressRate": 8_000_000, "ingressBurst": 80_000,
                       "egressRate": 8_000_000, "egressBurst": 80_000});
    b["prevResult"] = rt.clone();
    let rb = node
        .run(&bandwidth, &Call::new("ADD", "tb1", Some(&pod.path()), &b))
        .result();
    assert_eq!(rb["ips"], r["ips"]);
    // bandwidth shapes the host side of our veth (it finds it through our result).
    let qdisc = node
        .ns
        .exec("tc", &["qdisc", "show", "dev", &cali_name("tb1")])
        .unwrap();
    assert!(qdisc.contains("tbf"), "{qdisc}");
    assert!(ping(&pod, NODE_IP));
    for (plugin, c) in [(bandwidth, &b), (tuning, &t)] {
        node.run(&plugin, &Call::new("DEL", "tb1", Some(&pod.path()), c))
            .ok();
    }
    node.run(
        &margay(),
        &Call::new("DEL", "tb1", Some(&pod.path()), &conf),
    )
    .ok();
    assert!(node.cali_links().is_empty());
}

#[test]
fn margay_ipam_under_the_reference_ptp_plugin() {
    let ptp = reference("ptp");
    let node = Node::start("ptp", POOLS_V4);
    let pods: Vec<Netns> = (0..2)
        .map(|i| Netns::new(&format!("ptpp{i}")).unwrap())
        .collect();
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "ptp-net",
        "type": "ptp",
        "nodename": "test-node",
        "ipam": {
            "type": "margay-ipam",
            "socket": node.daemon.socket
        }
    });
    let mut results = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = node
            .run(
                &ptp,
                &Call::new("ADD", &format!("pt{i}"), Some(&pod.path()), &conf),
            )
            .result();
        results.push(r);
    }
    // Our addresses, with their block's prefix, and the gateway ptp puts on its host end.
    let ip0 = first_ip(&results[0]);
    let ip1 = first_ip(&results[1]);
    let a0 = results[0]["ips"][0]["address"].as_str().unwrap();
    assert!(a0.starts_with("172.20.") && a0.ends_with("/26"), "{a0}");
    assert_eq!(results[0]["ips"][0]["gateway"], "169.254.1.1");
    assert_eq!(
        node.handle_addresses("ptp-net.pt0"),
        std::slice::from_ref(&ip0)
    );
    let attrs = node.handle_attributes("ptp-net.pt0");
    assert_eq!(attrs["container_id"], "pt0");
    // The pod works: its gateway (the node) and the other pod answer.
    assert!(ping(&pods[0], "169.254.1.1"), "pod -> node");
    assert!(ping(&pods[0], &ip1), "pod -> pod");
    assert!(ping(&node.ns, &ip0), "node -> pod");
    // ptp CHECKs its IPAM plugin too.
    node.run(
        &ptp,
        &Call::new(
            "CHECK",
            "pt0",
            Some(&pods[0].path()),
            &with_prev(&conf, &results[0]),
        ),
    )
    .ok();
    for (i, pod) in pods.iter().enumerate() {
        let c = with_prev(&conf, &results[i]);
        node.run(
            &ptp,
            &Call::new("DEL", &format!("pt{i}"), Some(&pod.path()), &c),
        )
        .ok();
    }
    assert_eq!(node.ipam_used(), 0);
    node.ipam_consistent();
}

#[test]
fn margay_ipam_under_the_reference_bridge_plugin() {
    let bridge = reference("bridge");
    let node = Node::start("br", POOLS_V4);
    let pods: Vec<Netns> = (0..2)
        .map(|i| Netns::new(&format!("brp{i}")).unwrap())
        .collect();
    // Pods of one node share its block, so on one bridge they reach each other directly.
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "bridge-net",
        "type": "bridge",
        "bridge": "mgybr0",
        "nodename": "test-node",
        "ipam": {"type": "margay-ipam", "socket": node.daemon.socket}
    });
    let results: Vec<Value> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            node.run(
                &bridge,
                &Call::new("ADD", &format!("br{i}"), Some(&p.path()), &conf),
            )
            .result()
        })
        .collect();
    let ip1 = first_ip(&results[1]);
    assert!(ip1.starts_with("172.20."), "{ip1}");
    assert!(ping(&pods[0], &ip1), "pod -> pod across the bridge");
    for (i, p) in pods.iter().enumerate() {
        node.run(
            &bridge,
            &Call::new(
                "DEL",
                &format!("br{i}"),
                Some(&p.path()),
                &with_prev(&conf, &results[i]),
            ),
        )
        .ok();
    }
    assert_eq!(node.ipam_used(), 0);
}

/// The block of a result's first address, and that address.
fn block_and_ip(result: &Value) -> (ipnet::IpNet, std::net::IpAddr) {
    let a: ipnet::IpNet = result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    (a.trunc(), a.addr())
}

#[test]
fn margay_ipam_never_hands_a_pod_its_subnets_own_addresses() {
    // Blocks of eight: a ptp pod gets one of the six between the network and the broadcast
    // address; the seventh pod needs a second block.
    let pools =
        "[[ipam.default_pools]]\nname = \"small\"\ncidr = \"172.22.0.0/24\"\nblock_size = 29\n";
    let ptp = reference("ptp");
    let node = Node::start("sub", pools);
    let conf = json!({
        "cniVersion": "1.0.0", "name": "ptp-net", "type": "ptp", "nodename": "test-node",
        "ipam": {"type": "margay-ipam", "socket": node.daemon.socket}
    });
    let pods: Vec<Netns> = (0..7)
        .map(|i| Netns::new(&format!("subp{i}")).unwrap())
        .collect();
    let mut results = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = node
            .run(
                &ptp,
                &Call::new("ADD", &format!("s{i}"), Some(&pod.path()), &conf),
            )
            .result();
        let (block, ip) = block_and_ip(&r);
        assert_eq!(block.prefix_len(), 29, "{r}");
        assert!(
            ip != block.network() && ip != block.broadcast(),
            "pod {i} got {ip}, an address of the subnet {block}"
        );
        // The handle holds the pod's address only: the withheld ones went back.
        assert_eq!(
            node.handle_addresses(&format!("ptp-net.s{i}")),
            [ip.to_string()]
        );
        results.push(r);
    }
    let blocks: std::collections::BTreeSet<_> = results.iter().map(|r| block_and_ip(r).0).collect();
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert_eq!(node.ipam_used(), 7);
    // ptp routes a pod's block through its gateway (nothing more without routes from IPAM).
    assert!(
        ping(&pods[0], &block_and_ip(&results[5]).1.to_string()),
        "pod -> pod"
    );
    assert!(
        ping(&node.ns, &block_and_ip(&results[6]).1.to_string()),
        "node -> pod"
    );
    for (i, pod) in pods.iter().enumerate() {
        let c = with_prev(&conf, &results[i]);
        node.run(
            &ptp,
            &Call::new("DEL", &format!("s{i}"), Some(&pod.path()), &c),
        )
        .ok();
    }
    assert_eq!(node.ipam_used(), 0);
    node.ipam_consistent();

    // Under bridge the gateway is the block's first address: asking for it is refused, and
    // nothing is left allocated.
    let bridge = reference("bridge");
    let mut br = conf.clone();
    br["type"] = json!("bridge");
    br["bridge"] = json!("mgybrs");
    br["name"] = json!("bridge-net");
    let gw = {
        let b = blocks.iter().next().unwrap();
        match b.network() {
            std::net::IpAddr::V4(n) => std::net::Ipv4Addr::from(u32::from(n) + 1).to_string(),
            other => panic!("{other}"),
        }
    };
    let out = node.run(
        &bridge,
        &Call::new("ADD", "g1", Some(&pods[0].path()), &br)
            .set("CNI_ARGS", &format!("IgnoreUnknown=1;IP={gw}")),
    );
    assert!(!out.status.success(), "{out:?}");
    let e: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(e["code"], 102, "{out:?}");
    assert!(e["msg"].as_str().unwrap().contains("gateway"), "{e}");
    assert!(node.handle_addresses("bridge-net.g1").is_empty());
    assert_eq!(node.ipam_used(), 0);
}
