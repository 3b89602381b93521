//! margay as the network of real container runtimes, installed as a user installs it
//! (`margay-cni-install`: margay, portmap, bandwidth) on the lab's nodes:
//! - containerd 1.6 + runc: `ctr run --cni` containers on two nodes reach each other and the
//!   lab's pods; killing one releases its address;
//! - containerd's CRI, driven as a kubelet drives it (RunPodSandbox, CreateContainer,
//!   StartContainer, StopPodSandbox twice, RemovePodSandbox): the sandbox gets an address, the
//!   pod's namespace, name and sandbox id are stored with it (`bgpctl ipam show --ip`), a
//!   mapped host port answers through portmap and an egress bandwidth limit holds;
//! - Podman 4.3 with its CNI backend: `podman run --network margay`, `network ls` / `inspect`,
//!   `-p 8080:80` through portmap.
//!
//! Everything comes from Debian's packages (containerd, runc, podman, containernetworking-
//! plugins, busybox-static); images are built here from busybox, nothing is pulled. A runtime
//! that cannot run here fails the test with the reason.
//!
//! Why this file is long: each test is one runtime session end to end (a lab, a runtime, its
//! scenarios in order), and the faults build on each other's state.

use std::path::Path;
use std::time::{Duration, Instant};

use interop_tests::lab::local::LocalLab;
use interop_tests::lab::runtime::containerd::{CRI_NAMESPACE, Containerd};
use interop_tests::lab::runtime::cri::PodSpec;
use interop_tests::lab::runtime::podman::Podman;
use interop_tests::lab::runtime::{self, CniDirs, image};
use serde_json::Value;

/// The runtimes' network (the lab's own pods are on `k8s-pod-network`: a GC against the
/// runtime's live list, by this network's handle prefix, leaves them alone).
const NETWORK: &str = "containerd-pods";
const SANDBOX_IMAGE: &str = "docker.io/margay/busybox:1";

/// The node's address in its subnet (the lab's NodeSpec).
fn node_address(node: &str) -> &'static str {
    match node {
        "node-1" => "10.99.1.11",
        "node-2" => "10.99.1.12",
        "node-3" => "10.99.1.13",
        _ => "10.99.2.14",
    }
}

/// margay installed for `node` under `root`, as a user installs it.
fn install(lab: &LocalLab, root: &Path, node: &str, network: &str) -> CniDirs {
    runtime::install_on(lab, root, node, network).unwrap_or_else(|e| panic!("{e}"))
}

/// `bgpctl ipam show --ip ADDR --json` on `node`: the allocation, or None if it is free.
fn allocation(lab: &LocalLab, node: &str, address: &str) -> Option<Value> {
    let (ok, out) = lab.bgpctl(node, &["ipam", "show", "--ip", address, "--json"]);
    if !ok {
        assert!(
            out.contains("not allocated"),
            "ipam show --ip {address}: {out}"
        );
        return None;
    }
    Some(serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}")))
}

/// The body of `url` fetched from namespace `from`, within `secs`; must contain "margay".
fn http_get(lab: &LocalLab, from: &str, url: &str, secs: u64) {
    eventually(secs, || {
        let (ok, out) = lab.exec(from, &["wget", "-q", "-T", "2", "-O", "-", url]);
        if ok && out.contains("margay") {
            Ok(())
        } else {
            Err(out)
        }
    })
    .unwrap_or_else(|e| panic!("{from} -> {url}: {e}"));
}

/// The addresses `node`'s handles of this network hold.
fn held(lab: &LocalLab, node: &str) -> Vec<String> {
    runtime::held(lab, node, NETWORK).unwrap_or_else(|e| panic!("{e}"))
}

/// margay's GC against the runtime's live sandboxes.
fn gc_against(lab: &LocalLab, node: &str, live_ids: &[String]) -> Vec<String> {
    runtime::gc_against(lab, node, NETWORK, live_ids).unwrap_or_else(|e| panic!("{e}"))
}

fn assert_ipam_clean(lab: &LocalLab) {
    let (ok, out) = lab.bgpctl("node-1", &["ipam", "check"]);
    assert!(ok, "ipam check: {out}");
}

/// Waits up to `secs` for `f` to hold; the last value on timeout.
fn eventually<T>(secs: u64, mut f: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The IPv4 address of eth0 in `ip -4 -o addr` output.
fn eth0_address(text: &str) -> Option<String> {
    text.lines()
        .find(|l| l.contains(" eth0 ") || l.contains(" eth0@"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|a| a.split('/').next())
        .map(str::to_owned)
}

/// A `ctr` container's eth0 address, asked inside it.
fn ctr_address(c: &Containerd, id: &str) -> Result<String, String> {
    let out = c.ctr(&[
        "tasks",
        "exec",
        "--exec-id",
        &format!("ip-{id}"),
        id,
        "/bin/ip",
        "-4",
        "-o",
        "addr",
        "show",
    ])?;
    eth0_address(&out).ok_or_else(|| format!("no eth0 address in {id}: {out}"))
}

fn ctr_ping(c: &Containerd, id: &str, to: &str) -> Result<String, String> {
    c.ctr(&[
        "tasks",
        "exec",
        "--exec-id",
        &format!("ping-{id}-{}", to.replace('.', "-")),
        id,
        "/bin/ping",
        "-c",
        "1",
        "-W",
        "2",
        to,
    ])
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: containerd through ctr, then through its CRI as a kubelet drives it, with the IPAM checked clean after each"
)]
fn containerd_runs_margay_containers_through_ctr_and_its_cri() {
    let lab = LocalLab::new(&format!("mrc{}", std::process::id()));
    lab.ok(&["up"]);
    let root = tempfile::tempdir().unwrap();
    let img = image::build(&root.path().join("image"), SANDBOX_IMAGE).unwrap();

    // containerd on node-1 and node-2 (different racks of the same subnet), each with margay
    // installed for its node.
    let cni1 = install(&lab, root.path(), "node-1", NETWORK);
    let cni2 = install(&lab, root.path(), "node-2", NETWORK);
    let list = cni1.conflist().unwrap();
    let types: Vec<&str> = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["type"].as_str())
        .collect();
    assert_eq!(types, ["margay", "portmap", "bandwidth"], "{list}");
    let c1 = Containerd::start(
        &root.path().join("containerd-1"),
        &lab.ns("node-1"),
        &cni1,
        SANDBOX_IMAGE,
    )
    .unwrap_or_else(|e| panic!("containerd cannot run here: {e}"));
    let c2 = Containerd::start(
        &root.path().join("containerd-2"),
        &lab.ns("node-2"),
        &cni2,
        SANDBOX_IMAGE,
    )
    .unwrap_or_else(|e| panic!("containerd cannot run here: {e}"));
    println!("{}", c1.ctr(&["version"]).unwrap());

    // --- ctr run --cni: a container on each node.
    let mut run1 = c1
        .ctr_run(&img.rootfs, "web1", &["/bin/sleep", "600"])
        .unwrap();
    let mut run2 = c2
        .ctr_run(&img.rootfs, "web2", &["/bin/sleep", "600"])
        .unwrap();
    let a1 = eventually(20, || ctr_address(&c1, "web1")).unwrap();
    let a2 = eventually(20, || ctr_address(&c2, "web2")).unwrap();
    println!("ctr containers: web1 {a1} on node-1, web2 {a2} on node-2");
    // Each address is margay's, under the runtime's container id (`<namespace>-<id>` for ctr).
    let alloc = allocation(&lab, "node-1", &a1).expect("web1's address is allocated");
    assert_eq!(
        alloc["handle"],
        format!("{NETWORK}.default-web1"),
        "{alloc}"
    );
    assert_eq!(alloc["attributes"]["node"], "node-1", "{alloc}");
    // Container to container across nodes, to the lab's pods in both subnets, and back.
    eventually(10, || ctr_ping(&c1, "web1", &a2)).unwrap();
    for pod in ["node-3-a", "node-4-a"] {
        let to = lab.pod_address(pod);
        eventually(10, || ctr_ping(&c1, "web1", &to))
            .unwrap_or_else(|e| panic!("web1 -> {pod}: {e}"));
    }
    let (ok, out) = lab.exec("node-4-a", &["ping", "-c", "1", "-W", "2", &a2]);
    assert!(ok, "node-4-a -> web2: {out}");

    // Killing the task ends ctr's run; ctr's CNI DEL releases the address; rm leaves nothing.
    c1.ctr(&["tasks", "kill", "-s", "KILL", "web1"]).unwrap();
    let status = eventually(15, || {
        run1.try_wait()
            .map_err(|e| e.to_string())?
            .ok_or("running".to_string())
    })
    .unwrap();
    println!("ctr run web1 ended: {status}");
    c1.ctr(&["containers", "rm", "web1"]).unwrap();
    assert_eq!(
        allocation(&lab, "node-1", &a1),
        None,
        "web1's address is released"
    );
    assert_ipam_clean(&lab);

    // --- The CRI, as a kubelet drives it.
    c1.ctr(&[
        "-n",
        CRI_NAMESPACE,
        "images",
        "import",
        &img.oci_archive.display().to_string(),
    ])
    .unwrap();
    let mut cri = c1.cri().unwrap();
    println!("CRI: {}", cri.version().unwrap());
    let pod = PodSpec {
        host_ports: vec![(80, 8080)],
        egress_bandwidth: Some("100M".into()),
        ..PodSpec::new("shop", "web-0")
    };
    let sandbox = cri
        .run_sandbox(&pod)
        .unwrap_or_else(|e| panic!("{e}\ncontainerd: {}", c1.log_tail()));
    let (pod_ip, state) = cri.sandbox_ip(&sandbox).unwrap();
    assert!(!pod_ip.is_empty(), "the sandbox has no address ({state})");
    println!("CRI sandbox shop/web-0: {pod_ip} {state} (sandbox {sandbox})");
    // The allocation names the pod, as Calico's does (bgpctl ipam show --ip).
    let alloc = allocation(&lab, "node-1", &pod_ip).expect("the sandbox's address is allocated");
    assert_eq!(alloc["handle"], format!("{NETWORK}.{sandbox}"), "{alloc}");
    assert_eq!(alloc["attributes"]["namespace"], "shop", "{alloc}");
    assert_eq!(alloc["attributes"]["pod"], "web-0", "{alloc}");
    assert_eq!(
        alloc["attributes"]["pod_infra_container_id"],
        sandbox.as_str(),
        "{alloc}"
    );
    let (ok, text) = lab.bgpctl("node-1", &["ipam", "show", "--ip", &pod_ip]);
    assert!(
        ok && text.contains("web-0") && text.contains("shop"),
        "{text}"
    );
    println!("{text}");

    // A container in the sandbox serves HTTP on port 80, with files to time the limit by.
    cri.start_container(
        &sandbox,
        &pod,
        "httpd",
        SANDBOX_IMAGE,
        &[
            "/bin/sh",
            "-c",
            "dd if=/dev/zero of=/www/burst bs=1M count=528 2>/dev/null && dd if=/dev/zero of=/www/big bs=1M count=16 2>/dev/null && exec httpd -f -p 80 -h /www",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}\ncontainerd: {}", c1.log_tail()));
    // Reached from a lab pod in the other subnet, directly.
    let url = format!("http://{pod_ip}/index.html");
    http_get(&lab, "node-4-a", &url, 15);
    // The mapped host port answers through portmap, from another node.
    let mapped = format!("http://{}:8080/index.html", node_address("node-1"));
    http_get(&lab, "node-2", &mapped, 10);
    println!("hostPort 8080 on node-1 answers from the pod's port 80");
    // The egress limit holds. containerd 1.6 gives the bandwidth plugin the rate with a burst
    // of 2^32 bits (its tbf says "burst 512Mb"): the first 512 MiB leave at line rate. So: drain the burst, then time 16 MiB at the limit of 100 Mbit/s.
    let (_, qdiscs) = lab.exec("node-1", &["tc", "qdisc", "show"]);
    let tbf = qdiscs
        .lines()
        .find(|l| l.contains("qdisc tbf") && l.contains("rate 100Mbit"))
        .unwrap_or_else(|| panic!("no tbf of 100Mbit on node-1:\n{qdiscs}"));
    println!("bandwidth's qdisc: {}", tbf.trim());
    let rate = |file: &str, mib: f64| {
        let url = format!("http://{pod_ip}/{file}");
        let t = Instant::now();
        let (ok, out) = lab.exec(
            "node-2",
            &["wget", "-q", "-T", "60", "-O", "/dev/null", &url],
        );
        assert!(ok, "download of {url}: {out}");
        let secs = t.elapsed().as_secs_f64();
        (secs, mib * 8.0 * 1.048_576 / secs)
    };
    let (s1, line) = rate("burst", 528.0);
    let (s2, limited) = rate("big", 16.0);
    println!(
        "egress-bandwidth 100M: the burst (528 MiB) in {s1:.2} s = {line:.0} Mbit/s, then 16 MiB in {s2:.2} s = {limited:.1} Mbit/s"
    );
    assert!(
        limited < 100.0 * 1.25,
        "the bandwidth limit did not hold: {limited:.1} Mbit/s"
    );
    assert!(
        limited > 100.0 * 0.5,
        "far below the limit: {limited:.1} Mbit/s"
    );

    // The kubelet's teardown: StopPodSandbox (twice, as kubelets do on retries), then remove.
    for _ in 0..2 {
        cri.stop_sandbox(&sandbox)
            .unwrap_or_else(|e| panic!("{e}\ncontainerd: {}", c1.log_tail()));
    }
    assert_eq!(
        allocation(&lab, "node-1", &pod_ip),
        None,
        "the sandbox's address is released"
    );
    cri.remove_sandbox(&sandbox).unwrap();
    let (_, rules) = lab.exec("node-1", &["iptables-save", "-t", "nat"]);
    assert!(
        !rules.contains("8080"),
        "portmap's rules outlive the pod: {rules}"
    );

    // web2 still runs; ending it releases its address too.
    c2.ctr(&["tasks", "kill", "-s", "KILL", "web2"]).unwrap();
    eventually(15, || {
        run2.try_wait()
            .map_err(|e| e.to_string())?
            .ok_or("running".to_string())
    })
    .unwrap();
    c2.ctr(&["containers", "rm", "web2"]).unwrap();
    assert_eq!(allocation(&lab, "node-2", &a2), None);
    assert_ipam_clean(&lab);
}

#[test]
fn podman_runs_margay_containers_with_its_cni_backend() {
    let lab = LocalLab::new(&format!("mrp{}", std::process::id()));
    lab.ok(&["up"]);
    let root = tempfile::tempdir().unwrap();
    let img = image::build(&root.path().join("image"), SANDBOX_IMAGE).unwrap();
    let cni = install(&lab, root.path(), "node-1", "margay");
    let podman = Podman::new(&root.path().join("podman"), &lab.ns("node-1"), &cni)
        .unwrap_or_else(|e| panic!("podman cannot run here: {e}"));
    println!(
        "{}",
        podman
            .run(&["version", "--format", "podman {{.Client.Version}}"])
            .unwrap()
    );
    podman
        .run(&[
            "import",
            &img.layer.display().to_string(),
            "margay/busybox:1",
        ])
        .unwrap();

    // The network margay-cni-install wrote is Podman's network "margay".
    let ls = podman
        .run(&["network", "ls", "--format", "{{.Name}} {{.Driver}}"])
        .unwrap();
    assert!(
        ls.lines().any(|l| l.starts_with("margay ")),
        "network ls: {ls}"
    );
    let inspect: Value =
        serde_json::from_str(&podman.run(&["network", "inspect", "margay"]).unwrap()).unwrap();
    assert_eq!(inspect[0]["name"], "margay", "{inspect}");
    println!("podman network ls: {}", ls.trim().replace('\n', "; "));

    let id = podman
        .run(&[
            "run",
            "-d",
            "--name",
            "web",
            "--network",
            "margay",
            "-p",
            "8080:80",
            "localhost/margay/busybox:1",
            "/bin/httpd",
            "-f",
            "-p",
            "80",
            "-h",
            "/www",
        ])
        .unwrap()
        .trim()
        .to_owned();
    let ip = podman
        .run(&[
            "inspect",
            "web",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        ])
        .unwrap()
        .trim()
        .to_owned();
    println!("podman container web ({}): {ip}", &id[..12.min(id.len())]);
    let alloc = allocation(&lab, "node-1", &ip).expect("the container's address is allocated");
    assert_eq!(alloc["handle"], format!("margay.{id}"), "{alloc}");
    // Reached from a lab pod across subnets, and through the mapped port from another node.
    let url = format!("http://{ip}/index.html");
    http_get(&lab, "node-4-a", &url, 15);
    let mapped = format!("http://{}:8080/index.html", node_address("node-1"));
    http_get(&lab, "node-2", &mapped, 10);
    println!("-p 8080:80 answers through portmap");

    // rm -f: Podman's DEL releases the address.
    podman.run(&["rm", "-f", "-t", "0", "web"]).unwrap();
    assert_eq!(
        allocation(&lab, "node-1", &ip),
        None,
        "the container's address is released"
    );
    assert_ipam_clean(&lab);
}

/// A lab daemon's PID (margay-lab records them).
fn daemon_pid(lab: &LocalLab, node: &str, daemon: &str) -> i32 {
    let path = format!("/run/margay-lab-{}/pids/{node}-{daemon}", lab.name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a daemon of this test's lab.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill {pid}");
}

/// Whether a margay plugin process of `cni` (by its path) is running: an ADD in progress.
fn plugin_running(cni: &CniDirs) -> bool {
    !interop_tests::lab::runtime::pids_with_arg(&cni.bin.join("margay").display().to_string())
        .is_empty()
}

/// The named network namespaces now (the CRI pins its pods' under /run/netns).
fn named_netns() -> std::collections::BTreeSet<String> {
    std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "the numbered runtime faults told in order (ADD repeated, forgotten containers, a runtime killed mid-ADD), each followed by the IPAM check"
)]
fn runtime_faults_leave_no_address_behind() {
    let lab = LocalLab::new(&format!("mrf{}", std::process::id()));
    lab.ok(&["up"]);
    let root = tempfile::tempdir().unwrap();
    let img = image::build(&root.path().join("image"), SANDBOX_IMAGE).unwrap();
    let cni = install(&lab, root.path(), "node-1", NETWORK);
    let mut c = Containerd::start(
        &root.path().join("containerd"),
        &lab.ns("node-1"),
        &cni,
        SANDBOX_IMAGE,
    )
    .unwrap_or_else(|e| panic!("containerd cannot run here: {e}"));
    c.ctr(&[
        "-n",
        CRI_NAMESPACE,
        "images",
        "import",
        &img.oci_archive.display().to_string(),
    ])
    .unwrap();

    // 1. ADD again for the same container id. `ctr run -d` never calls DEL, so the first
    // container's address outlives it; the second ADD of that id gets the same address, not
    // a second one.
    let rootfs = img.rootfs.display().to_string();
    let run_detached = || {
        c.ctr(&[
            "run",
            "-d",
            "--cni",
            "--rootfs",
            &rootfs,
            "again",
            "/bin/sleep",
            "600",
        ])
        .unwrap()
    };
    // Gone without a DEL: the task killed and removed, the container removed.
    let forget = || {
        c.ctr(&["tasks", "kill", "-s", "KILL", "again"]).unwrap();
        eventually(10, || c.ctr(&["tasks", "rm", "again"])).unwrap();
        c.ctr(&["containers", "rm", "again"]).unwrap();
    };
    run_detached();
    let first = ctr_address(&c, "again").unwrap();
    forget();
    run_detached();
    let second = ctr_address(&c, "again").unwrap();
    assert_eq!(first, second, "a retried ADD took another address");
    assert_eq!(
        held(&lab, "node-1"),
        vec![first.clone()],
        "one address for one container"
    );
    println!("ADD retried for container 'again': {first} both times");
    forget();
    // The runtime forgot it without a DEL: margay's GC against its live list releases it.
    let released = gc_against(&lab, "node-1", &[]);
    println!("gc against ctr's (empty) list released {released:?}");
    assert_eq!(released, vec![first.clone()]);
    assert!(held(&lab, "node-1").is_empty());

    let mut cri = c.cri().unwrap();

    // 2. The runtime killed mid-ADD: bgpd is paused so the ADD hangs in the plugin;
    // containerd is killed; bgpd resumes and the orphaned plugin finishes its ADD for a
    // sandbox no runtime knows. containerd restarts, the sandbox is not in its list, and GC
    // against the list releases the address.
    let bgpd = daemon_pid(&lab, "node-1", "bgpd");
    signal(bgpd, libc::SIGSTOP);
    let socket = c.socket.clone();
    let add = std::thread::spawn(move || {
        let mut cri = interop_tests::lab::runtime::cri::Cri::connect(&socket).unwrap();
        cri.run_sandbox(&PodSpec::new("shop", "crashed"))
    });
    let mid_add = eventually(10, || {
        if plugin_running(&cni) {
            Ok(())
        } else {
            Err("no plugin yet".to_string())
        }
    });
    c.crash();
    signal(bgpd, libc::SIGCONT);
    mid_add.unwrap();
    let r = add.join().unwrap();
    assert!(
        r.is_err(),
        "RunPodSandbox answered although containerd was killed: {r:?}"
    );
    eventually(20, || {
        if plugin_running(&cni) {
            Err("the plugin still runs".to_string())
        } else {
            Ok(())
        }
    })
    .unwrap();
    let orphaned = held(&lab, "node-1");
    println!("runtime killed mid-ADD: the plugin finished alone, leaving {orphaned:?}");
    c.start_again().unwrap();
    let mut cri2 = c.cri().unwrap();
    let live = cri2.sandboxes().unwrap();
    println!(
        "after the restart containerd knows {} sandboxes",
        live.len()
    );
    for id in &live {
        // What a kubelet does with sandboxes it did not ask for (or saw fail): stop, remove.
        cri2.stop_sandbox(id).unwrap();
        cri2.remove_sandbox(id).unwrap();
    }
    gc_against(&lab, "node-1", &cri2.sandboxes().unwrap());
    assert!(
        held(&lab, "node-1").is_empty(),
        "after GC: {:?}",
        held(&lab, "node-1")
    );
    assert_ipam_clean(&lab);
    drop(cri);
    cri = cri2;

    // 3. bgpd restarted mid-ADD: killed, the ADD starts (the plugin retries while bgpd is
    // unreachable), bgpd comes back. Either the ADD succeeds with exactly one address, or
    // RunPodSandbox fails and the runtime's own cleanup (its DEL) leaves nothing.
    signal(daemon_pid(&lab, "node-1", "bgpd"), libc::SIGKILL);
    let socket = c.socket.clone();
    let add = std::thread::spawn(move || {
        let mut cri = interop_tests::lab::runtime::cri::Cri::connect(&socket).unwrap();
        cri.run_sandbox(&PodSpec::new("shop", "bgpd-restart"))
    });
    std::thread::sleep(Duration::from_millis(500));
    lab.ok(&["restart", "node-1", "bgpd"]);
    match add.join().unwrap() {
        Ok(id) => {
            let (ip, state) = cri.sandbox_ip(&id).unwrap();
            println!("bgpd restarted mid-ADD: the ADD went through ({ip}, {state})");
            assert_eq!(held(&lab, "node-1"), vec![ip]);
            cri.stop_sandbox(&id).unwrap();
            cri.remove_sandbox(&id).unwrap();
        }
        Err(e) => println!("bgpd restarted mid-ADD: RunPodSandbox failed ({e})"),
    }
    assert!(
        held(&lab, "node-1").is_empty(),
        "{:?}",
        held(&lab, "node-1")
    );
    assert_ipam_clean(&lab);

    // 4. The host "reboots" under a running pod: containers, shims and containerd killed, the
    // runtime's state and the pod's network namespace gone, the datastore kept; node-1's
    // daemons restart too. containerd comes back knowing the sandbox (NOTREADY); the kubelet
    // stops and removes it, and margay's DEL (its namespace long gone) releases the address.
    let before = named_netns();
    let id = cri.run_sandbox(&PodSpec::new("shop", "rebooted")).unwrap();
    let (ip, _) = cri.sandbox_ip(&id).unwrap();
    let pinned: Vec<String> = named_netns().difference(&before).cloned().collect();
    assert_eq!(
        pinned.len(),
        1,
        "the sandbox's network namespace: {pinned:?}"
    );
    drop(cri);
    c.reboot(&pinned);
    for daemon in ["bgpd", "routewriter"] {
        lab.ok(&["restart", "node-1", daemon]);
    }
    c.start_again().unwrap();
    let mut cri = c.cri().unwrap();
    let known = cri.sandboxes().unwrap();
    assert!(
        known.contains(&id),
        "containerd lost the sandbox's record: {known:?}"
    );
    let (_, state) = cri.sandbox_ip(&id).unwrap();
    println!("after the reboot: sandbox {ip} is {state}");
    assert_eq!(held(&lab, "node-1"), vec![ip.clone()]);
    cri.stop_sandbox(&id)
        .unwrap_or_else(|e| panic!("{e}\ncontainerd: {}", c.log_tail()));
    cri.remove_sandbox(&id).unwrap();
    assert!(
        held(&lab, "node-1").is_empty(),
        "{:?}",
        held(&lab, "node-1")
    );
    assert_ipam_clean(&lab);
    let (_, routes) = lab.exec("node-1", &["ip", "route", "show", "proto", "80"]);
    assert!(
        !routes.contains(&format!("{ip} ")),
        "the pod's route outlives it: {routes}"
    );
}
