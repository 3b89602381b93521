//! margay installed as users install Calico (issue #51), on the real kube-apiserver and Podman:
//! - every manifest of `deploy/` (and the CRDs) is accepted by the apiserver
//!   (`kubectl apply --dry-run=server`), and margay reads the pool as it is written;
//! - the role is what bgpd needs and no more: each request bgpd makes is allowed, and a write
//!   outside the role, made with a token of its service account, is refused by the apiserver
//!   (bgpd itself runs under this role in `kube_bgpd_kill`);
//! - the node image builds from the built binaries with Podman (nothing pulled), and each
//!   binary in it runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use interop_tests::lab::bgpd::runtime;
use interop_tests::lab::kube_api::{KubeApi, kubectl_path};
use interop_tests::lab::local::captured;
use interop_tests::lab::{open_store, repo_file};

/// kubectl with `kubeconfig`: whether it succeeded, and what it printed.
fn kubectl_as(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    captured(
        Command::new(kubectl_path())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args),
    )
}

#[test]
fn the_manifests_are_accepted_and_the_role_refuses_what_margay_does_not_do() {
    // As every cluster that runs privileged node agents (kubeadm's default): routewriter is.
    let api = KubeApi::start_with(&["--allow-privileged=true"]);
    let (rbac, daemonset) = (
        repo_file("deploy/rbac.yaml"),
        repo_file("deploy/daemonset.yaml"),
    );
    let shown = api.kubectl_ok(&[
        "apply",
        "--dry-run=server",
        "-R",
        "-f",
        &repo_file("datastore/crds"),
        "-f",
        &rbac,
        "-f",
        &daemonset,
    ]);
    for part in [
        "daemonset.apps/margay-node created (server dry run)",
        "clusterrole.rbac.authorization.k8s.io/margay-node created (server dry run)",
        "serviceaccount/margay-node created (server dry run)",
        "customresourcedefinition.apiextensions.k8s.io/ipamblocks.crd.projectcalico.org created (server dry run)",
    ] {
        assert!(shown.contains(part), "{part:?} not in:\n{shown}");
    }
    api.apply_crds(&[&rbac]);
    pool_is_accepted_and_read_as_written(&api);
    let node: PathBuf = api.service_account_kubeconfig("kube-system", "margay-node");
    // What bgpd does is allowed.
    for (verb, resource) in [
        ("list", "pods"),
        ("watch", "pods"),
        ("patch", "pods/status"),
        ("patch", "nodes/status"),
        ("watch", "nodes"),
        ("update", "namespaces"),
        ("create", "networkpolicies.networking.k8s.io"),
        ("create", "ipamblocks.crd.projectcalico.org"),
        ("delete", "blockaffinities.crd.projectcalico.org"),
        ("update", "globalnetworkpolicies.crd.projectcalico.org"),
        ("create", "margayobjects.margay.dev"),
        ("watch", "services"),
        ("watch", "endpointslices.discovery.k8s.io"),
        ("create", "events"),
    ] {
        let mut args = vec!["auth", "can-i", verb, "-A"];
        match resource.split_once('/') {
            Some((resource, sub)) => args.extend([resource, "--subresource", sub]),
            None => args.push(resource),
        }
        let (_, answer) = kubectl_as(&node, &args);
        assert_eq!(answer.trim(), "yes", "{verb} {resource}: {answer}");
    }
    // A write outside the role is refused by the apiserver.
    let pod = api.dir().join("pod.json");
    std::fs::write(
        &pod,
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "margay.invalid/none"}]}}"#,
    )
    .unwrap();
    let node_file = api.dir().join("node.json");
    std::fs::write(
        &node_file,
        r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "intruder"}}"#,
    )
    .unwrap();
    for (what, args) in [
        ("create a Pod", vec!["create", "-f", pod.to_str().unwrap()]),
        (
            "create a Node",
            vec!["create", "-f", node_file.to_str().unwrap()],
        ),
        ("delete a Namespace", vec!["delete", "namespace", "default"]),
        (
            "delete a Pod",
            vec!["delete", "pod", "-n", "kube-system", "x"],
        ),
        ("read Secrets", vec!["get", "secrets", "-A"]),
        (
            "change a Service",
            vec!["annotate", "service", "kubernetes", "-n", "default", "x=y"],
        ),
        (
            "delete a CRD",
            vec!["delete", "crd", "ipamblocks.crd.projectcalico.org"],
        ),
    ] {
        let (ok, text) = kubectl_as(&node, &args);
        assert!(
            !ok && (text.contains("Forbidden") || text.contains("forbidden")),
            "bgpd's account could {what}: {text}"
        );
    }
}

/// deploy/ippool.yaml (a custom resource: once its CRD is served) is accepted, and margay
/// reads the pool as it is written.
fn pool_is_accepted_and_read_as_written(api: &KubeApi) {
    let pool = repo_file("deploy/ippool.yaml");
    let shown = api.kubectl_ok(&["apply", "--dry-run=server", "-f", &pool]);
    assert!(
        shown.contains("ippool.crd.projectcalico.org/default-ipv4-ippool created (server dry run)"),
        "{shown}"
    );
    api.kubectl_ok(&["apply", "-f", &pool]);
    let pools = runtime().block_on(async {
        let store = open_store(&format!("kubernetes:{}", api.kubeconfig.display()))
            .await
            .unwrap();
        ipam::allocator::Ipam::new(store)
            .list_pools()
            .await
            .unwrap()
    });
    let (read, _) = pools
        .iter()
        .find(|(p, _)| p.name == "default-ipv4-ippool")
        .unwrap_or_else(|| panic!("margay does not read deploy/ippool.yaml: {pools:?}"));
    assert_eq!(read.cidr.to_string(), "192.168.0.0/16");
    assert!(read.nat_outgoing && !read.disabled, "{read:?}");
}

/// Removes the image when the test ends, also on failure.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
    }
}

#[test]
fn the_node_image_builds_from_the_built_binaries_and_runs_each() {
    let tag = format!("localhost/margay/node:test{}", std::process::id());
    let (built, text) =
        captured(Command::new(repo_file("scripts/build-image")).args(["--debug", "--tag", &tag]));
    let image = Image(tag);
    assert!(built, "scripts/build-image: {text}");
    for (binary, arg, says) in [
        ("/usr/local/bin/bgpd", "--version", "bgpd "),
        ("/usr/local/bin/routewriter", "--version", "routewriter "),
        ("/usr/local/bin/bgpctl", "--version", "bgpctl "),
        (
            "/usr/local/bin/margay-cni-install",
            "--help",
            "Install margay's CNI plugins",
        ),
        ("/usr/sbin/nft", "--version", "nftables"),
    ] {
        let (ran, text) = captured(Command::new("podman").args([
            "run",
            "--rm",
            "--network=none",
            // Limits this sandbox allows: runc may not raise them here (see lab::runtime).
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=1024:1024",
            "--entrypoint",
            binary,
            &image.0,
            arg,
        ]));
        assert!(ran && text.contains(says), "{binary} {arg}: {text}");
    }
}
