//! The lab's Kubernetes API (`up --kubernetes`): etcd 3.7 and the kube-apiserver that
//! `scripts/build-kube` builds, both in a namespace of their own on the first segment
//! (`kube-api`, 10.99.1.30, which node-4 reaches through the router). etcd listens on that
//! namespace's loopback only; the apiserver serves TLS on 10.99.1.30:6443 with certificates
//! the lab makes (a CA of its own, an admin client certificate, RBAC, service-account
//! signing), and the nodes' bgpd reach it with the admin kubeconfig under the lab's state
//! directory. Both are recorded like the daemons, so `down` stops them by PID; the soak kills
//! and restarts either. Calico's CRDs are applied with kubectl of the same release.

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
