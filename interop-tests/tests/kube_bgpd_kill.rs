//! kill -9 of bgpd itself between every pair of its IPAM writes, on the real kube-apiserver,
//! with bgpd running under a calico-node-like role (`deploy/rbac.yaml`,
//! a service account's token: RBAC decides each of its requests).
//!
//! A validating admission webhook of the test's own (`lab::kube_webhook`) sees each write
//! bgpd makes to IPAMBlocks, BlockAffinities and IPAMHandles before the apiserver makes it.
//! One pod's life through the `margay-ipam` plugin (ADD, then DEL of the block's only
//! address with no grace period) is counted first; then, for every k, bgpd is killed with
//! SIGKILL when its (k+1)-th write arrives, and that write refused: what is stored is exactly
//! bgpd's first k writes. Each time, `ipam check` finds only what it knows to report; bgpd
//! started again, the runtime's retried DEL and `bgpctl ipam gc` finish it; check is clean,
//! another node's pod is untouched, and the node allocates and releases again.

use std::os::unix::process::ExitStatusExt;

use datastore::Store;
use datastore::model::{IpPool, IpamConfig};
use interop_tests::lab;
use interop_tests::lab::bgpd::{Daemon, ipam_plugin};
use interop_tests::lab::kube_api::KubeApi;
use interop_tests::lab::kube_webhook::Webhook;
use ipam::allocator::{AssignRequest, Ipam};

const NODE: &str = "node-s";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:margay-node";

/// What `check` reports of a claim or a release cut short (see ipam's `check`): a claim or
/// a release of a block left half done, a handle that counts an address its block never
/// got (the handle's step comes first, Calico's order), a block without its affinity.
const KNOWN: [&str; 4] = [
    "unfinished claim",
    "unfinished release",
    "the block holds",
    "has no affinity record",
];

/// Runs `margay-ipam` (ADD or DEL of pod `id`) to its end: whether it succeeded, its output.
fn plugin_run(command: &str, id: &str, daemon: &Daemon) -> (bool, String) {
    let out = ipam_plugin(command, id, NODE, &daemon.socket)
        .wait_with_output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Writes without the resources' names ("CREATE ipamblocks"): one pod's steps are the same
/// steps for another pod, under other names.
fn steps(writes: &[String]) -> Vec<&str> {
    writes
        .iter()
        .map(|w| w.split_once('/').map_or(w.as_str(), |(step, _)| step))
        .collect()
}

/// The admin applies `manifest` (YAML or JSON text).
fn apply(api: &KubeApi, name: &str, manifest: &str) {
    let file = api.dir().join(name);
    std::fs::write(&file, manifest).unwrap();
    api.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
}

/// The admin's view: margay's CRDs, a pool of /29 blocks, no grace period for empty
/// blocks, and three addresses of another node that must stay untouched throughout.
async fn cluster(api: &KubeApi) -> (Ipam<Store>, usize) {
    let admin = lab::open_store(&format!("kubernetes:{}", api.kubeconfig.display()))
        .await
        .unwrap();
    admin.as_kubernetes().unwrap().install_crds().await.unwrap();
    let ipam = Ipam::new(admin);
    let mut pool = IpPool::new("p", "10.102.0.0/24".parse().unwrap());
    pool.block_size = 29;
    ipam.create_pool(&pool).await.unwrap();
    ipam.set_config(&IpamConfig {
        empty_block_grace_s: 0,
        ..IpamConfig::default()
    })
    .await
    .unwrap();
    let resident = ipam
        .auto_assign(&AssignRequest {
            handle: "resident".into(),
            node: "node-r".into(),
            num_v4: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .0;
    (ipam, resident.len())
}

/// bgpd as NODE under its role (`deploy/rbac.yaml`, a token of its
/// service account), its Node made as the kubelet would have made it, and the webhook
/// watching its IPAM writes.
async fn bgpd_under_its_role(api: &KubeApi) -> (Webhook, Daemon) {
    let rbac = include_str!("../../deploy/rbac.yaml");
    apply(api, "rbac.yaml", rbac);
    apply(
        api,
        "node.json",
        &format!(r#"{{"apiVersion": "v1", "kind": "Node", "metadata": {{"name": "{NODE}"}}}}"#),
    );
    let kubeconfig = api.service_account_kubeconfig("kube-system", "margay-node");
    let webhook = Webhook::start(SERVICE_ACCOUNT);
    webhook
        .register(
            api,
            "ipam-writes",
            &[(
                "crd.projectcalico.org",
                &["ipamblocks", "blockaffinities", "ipamhandles"],
            )],
        )
        .await;
    let bgpd = Daemon::on_kubernetes(&kubeconfig, NODE, "10.0.0.9/24");
    (webhook, bgpd)
}

/// After a kill: bgpd started again; the runtime retries the pod's DEL; the node's GC (no
/// live pods). Then check is clean, the other node's addresses are untouched, and the node
/// allocates and releases again, nothing of the kill in its way.
async fn finish(ipam: &Ipam<Store>, bgpd: &mut Daemon, pod: &str, k: usize, resident: usize) {
    let config = bgpd.config_path();
    bgpd.restart(&config);
    let (ok, out) = plugin_run("DEL", pod, bgpd);
    assert!(ok, "the retried DEL after write {k}: {out}");
    bgpd.bgpctl_ok(&["ipam", "gc", "--node", NODE]);
    bgpd.bgpctl_ok(&["ipam", "check"]);
    let report = ipam.check().await.unwrap();
    assert!(
        report.problems.is_empty(),
        "after write {k}: {:?}",
        report.problems
    );
    assert_eq!(report.allocations as usize, resident, "after write {k}");
    assert_eq!(
        ipam.handle_allocations("resident").await.unwrap().len(),
        resident,
        "after write {k}"
    );
    // And the node allocates and releases again, nothing of the kill in its way.
    let probe = format!("p{k}");
    let (ok, out) = plugin_run("ADD", &probe, bgpd);
    assert!(ok, "ADD after write {k}: {out}");
    let (ok, out) = plugin_run("DEL", &probe, bgpd);
    assert!(ok, "DEL after write {k}: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_bgpd_between_any_two_writes_on_the_kubernetes_api() {
    let api = KubeApi::start();
    let (ipam, resident) = cluster(&api).await;
    let (webhook, mut bgpd) = bgpd_under_its_role(&api).await;

    // One pod's life, counted.
    webhook.reset();
    let (ok, out) = plugin_run("ADD", "count", &bgpd);
    assert!(ok, "ADD: {out}\nbgpd's log:\n{}", bgpd.log());
    let add = webhook.writes().len();
    let (ok, out) = plugin_run("DEL", "count", &bgpd);
    assert!(ok, "DEL: {out}\nbgpd's log:\n{}", bgpd.log());
    let writes = webhook.writes();
    println!("one pod's life, bgpd's {} writes in order:", writes.len());
    for (i, w) in writes.iter().enumerate() {
        println!("  {} {w}", if i < add { "ADD" } else { "DEL" });
    }
    // The claim with its address in Calico's order: affinity pending, block, affinity
    // confirmed, handle, block with the address.
    assert_eq!(
        steps(&writes[..5]),
        [
            "CREATE blockaffinities",
            "CREATE ipamblocks",
            "UPDATE blockaffinities",
            "CREATE ipamhandles",
            "UPDATE ipamblocks",
        ],
        "{writes:#?}"
    );
    // The DEL of the block's last address, no grace period, gives the block back: it
    // ends with the block, its affinity and the handle gone.
    assert_eq!(
        steps(&writes[writes.len() - 3..]),
        [
            "DELETE ipamblocks",
            "DELETE blockaffinities",
            "DELETE ipamhandles"
        ],
        "{writes:#?}"
    );

    for k in 0..writes.len() {
        let pod = format!("s{k}");
        webhook.reset();
        webhook.kill_at(k + 1, bgpd.pid());
        let (added, out) = plugin_run("ADD", &pod, &bgpd);
        if added {
            let (deleted, out) = plugin_run("DEL", &pod, &bgpd);
            assert!(
                !deleted,
                "stop before write {}: the DEL succeeded: {out}",
                k + 1
            );
        } else {
            println!(
                "stop before write {}: the ADD failed: {}",
                k + 1,
                out.trim()
            );
        }
        assert!(
            webhook.killed(),
            "bgpd was not stopped before write {}",
            k + 1
        );
        let status = bgpd.signal_and_wait(libc::SIGKILL);
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        assert_eq!(
            steps(&webhook.writes()),
            steps(&writes[..k]),
            "bgpd's first {k} writes"
        );

        let report = ipam.check().await.unwrap();
        let last = writes.get(k.wrapping_sub(1)).map_or("none", String::as_str);
        lab::assert_check_knows(
            &report.problems,
            &KNOWN,
            &format!("killed after write {k} ({last})"),
        );

        webhook.reset();
        finish(&ipam, &mut bgpd, &pod, k, resident).await;
    }
    let report = ipam.check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.allocations as usize, resident);
}
