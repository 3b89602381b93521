//! margay under load, against a real bgpd: 200 ADDs at once (200 distinct addresses, every pod
//! reachable) then 200 DELs at once (no veth, route or address left); and bgpd killed during a
//! burst of ADDs (each ADD either wired whole or failed with nothing left behind).

mod cni_lab;

use std::collections::HashSet;
use std::process::Child;
use std::time::{Duration, Instant};

use cni_lab::*;
use interop_tests::lab::bgpd::Daemon;
use interop_tests::lab::netns::Netns;
use serde_json::{Value, json};

fn wait(child: Child) -> Outcome {
    Outcome::from(child.wait_with_output().expect("the plugin ran"))
}

/// Collects the outcomes of the children that have ended; how many outcomes there are.
fn reap(children: &mut [Option<Child>], outcomes: &mut [Option<Outcome>]) -> usize {
    for (i, c) in children.iter_mut().enumerate() {
        if c.as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some())
        {
            outcomes[i] = Some(wait(c.take().unwrap()));
        }
    }
    outcomes.iter().filter(|o| o.is_some()).count()
}

#[test]
fn two_hundred_pods_at_once_then_gone_at_once() {
    const N: usize = 200;
    let node = Node::start("sc", POOLS_V4);
    let mut conf = node.conf("1.0.0");
    // 200 processes on a small machine queue behind each other: give them room.
    conf["bgpd_timeout_seconds"] = json!(60);
    conf["log_level"] = json!("warn");
    let pods: Vec<Netns> = (0..N)
        .map(|i| Netns::new(&format!("s{i}")).expect("pod namespace"))
        .collect();
    let started = Instant::now();
    let children: Vec<Child> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            node.spawn(
                &margay(),
                &Call::new("ADD", &format!("s{i}"), Some(&p.path()), &conf),
            )
        })
        .collect();
    let results: Vec<Value> = children.into_iter().map(|c| wait(c).result()).collect();
    eprintln!("{N} ADDs at once: {:?}", started.elapsed());

    let ips: Vec<String> = results.iter().map(first_ip).collect();
    let distinct: HashSet<&String> = ips.iter().collect();
    assert_eq!(distinct.len(), N, "every pod has its own address");
    assert_eq!(node.cali_links().len(), N);
    assert_eq!(node.ipam_used(), N as u64);

    // Every pod reaches every other's gateway path: pod 0 pings all, the node pings all.
    let script: String = ips[1..]
        .iter()
        .map(|ip| format!("ping -c1 -W2 -q {ip} >/dev/null || echo unreachable {ip}\n"))
        .collect();
    let unreachable = pods[0].sh(&script).unwrap();
    assert!(unreachable.is_empty(), "from pod 0: {unreachable}");
    let script: String = ips
        .iter()
        .map(|ip| format!("ping -c1 -W2 -q {ip} >/dev/null || echo unreachable {ip}\n"))
        .collect();
    let unreachable = node.ns.sh(&script).unwrap();
    assert!(unreachable.is_empty(), "from the node: {unreachable}");

    let started = Instant::now();
    let children: Vec<Child> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            node.spawn(
                &margay(),
                &Call::new("DEL", &format!("s{i}"), Some(&p.path()), &conf),
            )
        })
        .collect();
    for c in children {
        wait(c).ok();
    }
    eprintln!("{N} DELs at once: {:?}", started.elapsed());
    assert!(node.cali_links().is_empty(), "no veth left");
    let routes = node.ip(&["route", "show"]);
    assert!(!routes.contains("172.20."), "no pod route left: {routes}");
    for p in &pods {
        let links = p.ip(&["-o", "link"]).unwrap();
        assert!(!links.contains("eth0"), "{links}");
    }
    assert_eq!(node.ipam_used(), 0, "every address released");
    node.ipam_consistent();
}

#[test]
fn bgpd_killed_during_a_burst_of_adds() {
    const N: usize = 40;
    let mut node = Node::start("kill", POOLS_V4);
    let mut conf = node.conf("1.0.0");
    conf["bgpd_retry_seconds"] = json!(1);
    conf["log_level"] = json!("warn");
    let pods: Vec<Netns> = (0..N)
        .map(|i| Netns::new(&format!("k{i}")).expect("pod namespace"))
        .collect();
    // Kill bgpd outright once a few ADDs are through, while others are in flight and more are
    // still being started (those meet a dead bgpd).
    let mut children: Vec<Option<Child>> = (0..N).map(|_| None).collect();
    let mut outcomes: Vec<Option<Outcome>> = (0..N).map(|_| None).collect();
    let mut killed = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, p) in pods.iter().enumerate() {
        children[i] = Some(node.spawn(
            &margay(),
            &Call::new("ADD", &format!("k{i}"), Some(&p.path()), &conf),
        ));
        if !killed && reap(&mut children, &mut outcomes) >= 5 {
            node.daemon.signal_and_wait(libc::SIGKILL);
            killed = true;
        }
    }
    while !killed {
        if reap(&mut children, &mut outcomes) >= 5 {
            node.daemon.signal_and_wait(libc::SIGKILL);
            killed = true;
        }
        assert!(Instant::now() < deadline, "not 5 ADDs finished in 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    for (i, c) in children.iter_mut().enumerate() {
        if let Some(c) = c.take() {
            outcomes[i] = Some(wait(c));
        }
    }
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(Option::unwrap).collect();

    // Each ADD succeeded whole or failed with nothing in the kernel.
    let mut succeeded = Vec::new();
    let mut failed = Vec::new();
    for (i, out) in outcomes.iter().enumerate() {
        let host_if = cali_name(&format!("k{i}"));
        if out.status.success() {
            let r = out.result();
            let ip = first_ip(&r);
            let route = node.ip(&["route", "show", &format!("{ip}/32")]);
            assert!(route.contains(&host_if), "k{i}: {route}");
            let addr = pods[i].ip(&["-o", "addr", "show", "dev", "eth0"]).unwrap();
            assert!(addr.contains(&format!("{ip}/32")), "k{i}: {addr}");
            succeeded.push((i, ip));
        } else {
            assert_eq!(
                out.error_code(),
                11,
                "k{i} fails as 'try again later': {out:?}"
            );
            assert!(
                !node.cali_links().contains(&host_if),
                "k{i} failed but left {host_if}"
            );
            let links = pods[i].ip(&["-o", "link"]).unwrap();
            assert!(
                !links.contains("eth0"),
                "k{i} failed but left eth0: {links}"
            );
            failed.push(i);
        }
    }
    eprintln!("{} succeeded, {} failed", succeeded.len(), failed.len());
    assert!(succeeded.len() >= 5);
    assert!(
        !failed.is_empty(),
        "bgpd died before any ADD was left in flight"
    );
    assert_eq!(node.cali_links().len(), succeeded.len());

    // bgpd comes back on the same store. The runtime DELs each failed ADD (the spec makes it):
    // whatever a lost answer left allocated goes, and only the pods that run hold addresses.
    let dir = std::mem::replace(&mut node.daemon.dir, tempfile::tempdir().unwrap());
    let socket = node.daemon.socket.clone();
    node.daemon = Daemon::start_in(dir, socket, POOLS_V4);
    let leaked: Vec<usize> = failed
        .iter()
        .copied()
        .filter(|i| !node.handle_addresses(&format!("{NET}.k{i}")).is_empty())
        .collect();
    eprintln!("failed ADDs whose allocation outlived bgpd's answer: {leaked:?}");
    for i in &failed {
        node.run(
            &margay(),
            &Call::new("DEL", &format!("k{i}"), Some(&pods[*i].path()), &conf),
        )
        .ok();
    }
    for (i, ip) in &succeeded {
        assert_eq!(
            node.handle_addresses(&format!("{NET}.k{i}")),
            std::slice::from_ref(ip)
        );
    }
    assert_eq!(node.ipam_used(), succeeded.len() as u64);
    node.ipam_consistent();
    for (i, _) in &succeeded {
        assert!(ping(&pods[*i], NODE_IP), "k{i} still works");
    }
}
