//! The lab's Kubernetes API (`up --kubernetes`): etcd 3.7 and the kube-apiserver that
//! `scripts/build-kube` builds, both in a namespace of their own on the first segment
//! (`kube-api`, 10.99.1.30, which node-4 reaches through the router). etcd listens on that
//! namespace's loopback only; the apiserver serves TLS on 10.99.1.30:6443 with certificates
//! the lab makes (a CA of its own, an admin client certificate, RBAC, service-account
//! signing), and the nodes' bgpd reach it with the admin kubeconfig under the lab's state
//! directory. Both are recorded like the daemons, so `down` stops them by PID; the soak kills
//! and restarts either. Calico's CRDs are applied with kubectl of the same release.
//!
//! The lab is also the nodes' kubelet: a pod's WorkloadEndpoint is its `Pod` object, so the
//! Pod (with its Namespace and that namespace's `default` ServiceAccount) exists before its
//! CNI ADD, gets its IPs in its status after it, and goes after its DEL.

use std::path::{Path, PathBuf};
use std::time::Duration;

use interop_tests::lab::kube_api;

use super::{attach, detached, in_ns, ip, kill9, launch, ns, state, wait_for};

/// The namespace's short name, and the key prefix of its processes' PID records.
pub const NAME: &str = "kube-api";
const ADDRESS: &str = "10.99.1.30";
const PORT: u16 = 6443;
const ETCD_CLIENT: &str = "http://127.0.0.1:2379";

/// Where the certificates, the kubeconfig, etcd's data and the logs are.
pub fn dir() -> PathBuf {
    state().join("kube")
}

/// The admin's kubeconfig, as the nodes' `[datastore] kubeconfig`.
pub fn kubeconfig() -> PathBuf {
    dir().join("kubeconfig")
}

pub fn url() -> String {
    format!("https://{ADDRESS}:{PORT}")
}

/// Creates the namespace, starts etcd and the apiserver, waits until it is ready and applies
/// Calico's CRDs (and margay's own).
pub fn start() -> Result<(), String> {
    let apiserver = kube_api::kube_dir().join("kube-apiserver");
    if !apiserver.exists() {
        return Err(format!(
            "{} is missing: run scripts/build-kube (scripts/up --kubernetes does)",
            apiserver.display()
        ));
    }
    let name = ns(NAME);
    ip(&["netns", "add", &name])?;
    in_ns(&name, &["ip", "link", "set", "lo", "up"])?;
    attach(
        &name,
        "eth0",
        "seg1",
        &format!("{ADDRESS}/24"),
        "fd00:99:1::30/64",
    )?;
    in_ns(
        &name,
        &["ip", "route", "add", "default", "via", "10.99.1.1"],
    )?;
    std::fs::create_dir_all(dir()).map_err(|e| e.to_string())?;
    kube_api::write_pki(&dir(), &[ADDRESS, "127.0.0.1"]);
    std::fs::write(kubeconfig(), kube_api::kubeconfig_text(&dir(), &url()))
        .map_err(|e| e.to_string())?;
    start_etcd()?;
    start_apiserver()?;
    apply_crds()
}

/// Starts etcd on its data (a new one the first time).
pub fn start_etcd() -> Result<(), String> {
    let mut cmd = detached(NAME, &kube_api::etcd_path());
    interop_tests::lab::etcd::member_args(
        &mut cmd,
        "kube-etcd",
        &dir().join("etcd"),
        ETCD_CLIENT,
        "http://127.0.0.1:2380",
    );
    launch(cmd, &dir().join("etcd.log"), &format!("{NAME}-etcd"))?;
    Ok(())
}

/// Starts the apiserver and waits until `/readyz` says ok.
pub fn start_apiserver() -> Result<(), String> {
    let mut cmd = detached(NAME, &kube_api::kube_dir().join("kube-apiserver"));
    cmd.args(kube_api::apiserver_args(&dir(), ETCD_CLIENT, ADDRESS, PORT));
    launch(
        cmd,
        &dir().join("apiserver.log"),
        &format!("{NAME}-apiserver"),
    )?;
    wait_ready(Duration::from_secs(90))
}

/// Waits until the apiserver answers `/readyz` with ok.
pub fn wait_ready(limit: Duration) -> Result<(), String> {
    wait_for("the kube-apiserver to be ready", limit, || {
        kubectl(&["get", "--raw", "/readyz"]).is_ok_and(|out| out.trim() == "ok")
    })
    .map_err(|e| {
        let log = std::fs::read_to_string(dir().join("apiserver.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        format!(
            "{e}\nthe end of its log:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    })
}

/// kubectl of the pinned release as the admin, run in the apiserver's namespace.
pub fn kubectl(args: &[&str]) -> Result<String, String> {
    let kubectl = kube_api::kubectl_path().display().to_string();
    let config = format!("--kubeconfig={}", kubeconfig().display());
    let mut all = vec![kubectl.as_str(), config.as_str()];
    all.extend_from_slice(args);
    in_ns(&ns(NAME), &all)
}

/// Applies the CRDs of `datastore/crds/` and waits until the apiserver serves them.
fn apply_crds() -> Result<(), String> {
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datastore/crds");
    let crds = crds.display().to_string();
    kubectl(&["apply", "--recursive", "-f", &crds])?;
    kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd",
        "--all",
    ])?;
    Ok(())
}

/// kill -9 of the apiserver.
pub fn kill_apiserver() -> Result<(), String> {
    kill9(NAME, "apiserver")
}

/// kill -9 of etcd under the apiserver.
pub fn kill_etcd() -> Result<(), String> {
    kill9(NAME, "etcd")
}

/// One line for `status`.
pub fn describe() -> String {
    format!(
        "kubernetes {} (kube-apiserver {} over etcd 3.7 in {}, kubeconfig {})",
        url(),
        kube_api::release(),
        ns(NAME),
        kubeconfig().display()
    )
}

/// The image of the lab's Pods: none is ever pulled (no kubelet runs), and `.invalid` says so.
const POD_IMAGE: &str = "margay-lab.invalid/none";

/// The Pods the lab made (a line each: namespace, name, node), so that a sandbox made again
/// for one of them (the soak's churn and probe pods, during faults too) asks the apiserver
/// nothing.
fn made_pods_file() -> PathBuf {
    dir().join("pods")
}

fn made_pods() -> Vec<(String, String, String)> {
    std::fs::read_to_string(made_pods_file())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace().map(str::to_owned);
            Some((w.next()?, w.next()?, w.next()?))
        })
        .collect()
}

fn save_made_pods(pods: &[(String, String, String)]) -> Result<(), String> {
    let text: String = pods
        .iter()
        .map(|(namespace, name, node)| format!("{namespace} {name} {node}\n"))
        .collect();
    std::fs::write(made_pods_file(), text).map_err(|e| e.to_string())
}

/// `kubectl create ...`, where an object that exists already is as good (this lab, an
/// earlier command or the apiserver made it).
fn create(args: &[&str]) -> Result<(), String> {
    match kubectl(args) {
        Ok(_) => Ok(()),
        // `Error from server (AlreadyExists): ... already exists` for most kinds; `create
        // serviceaccount` says only `... already exists`.
        Err(e) if e.contains("already exists") => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes sure Pod `name` of `namespace` exists, bound to `node` with `labels` (KEY=VALUE),
/// as the kubelet finds it before it runs CNI: the datastore refuses an ADD for a Pod the
/// apiserver does not hold. Its Namespace and `default` ServiceAccount first (no
/// controller-manager makes the account, and admission refuses a Pod without it). No
/// scheduler or kubelet runs, so it stays Pending until [`pod_running`]. A Pod that exists is
/// reused as it is.
pub fn ensure_pod(
    node: &str,
    name: &str,
    namespace: &str,
    labels: &[String],
) -> Result<(), String> {
    let mut made = made_pods();
    if made.iter().any(|(ns, n, _)| ns == namespace && n == name) {
        return Ok(());
    }
    create(&["create", "namespace", namespace])?;
    create(&["create", "serviceaccount", "default", "-n", namespace])?;
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or((l, ""));
            (k.to_owned(), v.into())
        })
        .collect();
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": POD_IMAGE}],
            "automountServiceAccountToken": false,
        },
    });
    let file = dir().join(format!("pod-{namespace}-{name}.json"));
    std::fs::write(&file, pod.to_string()).map_err(|e| format!("{}: {e}", file.display()))?;
    create(&["create", "-f", &file.display().to_string()])?;
    made.push((namespace.into(), name.into(), node.into()));
    save_made_pods(&made)
}

/// The Pod's status after its sandbox's ADD, as the kubelet reports it: Running, with its
/// addresses (without prefix) of both families.
pub fn pod_running(namespace: &str, name: &str, v4: &str, v6: &str) -> Result<(), String> {
    let status = serde_json::json!({"status": {
        "phase": "Running",
        "podIP": v4,
        "podIPs": [{"ip": v4}, {"ip": v6}],
    }});
    kubectl(&[
        "patch",
        "pod",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ])?;
    Ok(())
}

/// Deletes Pod `name` of `namespace` (its sandbox gone through CNI DEL) and forgets it.
pub fn delete_pod(namespace: &str, name: &str) -> Result<(), String> {
    let pod = [
        "pod",
        name,
        "-n",
        namespace,
        "--wait=false",
        "--ignore-not-found",
    ];
    // A user's delete: graceful, so for a Pod bound to a node the apiserver only marks it
    // (deletionTimestamp) and waits for that node's kubelet...
    kubectl(&[&["delete"][..], &pod].concat())?;
    // ...to confirm, its containers and sandbox gone, with a grace period of 0. No kubelet
    // runs here: the lab confirms, or the Pod would stay Terminating for good.
    kubectl(&[&["delete", "--grace-period=0", "--force"][..], &pod].concat())?;
    let made: Vec<_> = made_pods()
        .into_iter()
        .filter(|(ns, n, _)| !(ns == namespace && n == name))
        .collect();
    save_made_pods(&made)
}

/// Deletes the Pods the lab made on `node` (which is gone), as Kubernetes' pod garbage
/// collector does with a deleted node's Pods.
pub fn delete_pods_on(node: &str) -> Result<(), String> {
    for (namespace, name, _) in made_pods().into_iter().filter(|(_, _, n)| n == node) {
        delete_pod(&namespace, &name)?;
    }
    Ok(())
}
