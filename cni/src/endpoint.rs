//! The pod's WorkloadEndpoint: what network policy knows of a pod (namespace, pod name,
//! labels, its interface and addresses), recorded with bgpd when ADD has wired the pod and
//! removed on DEL, as Calico's plugin keeps one per pod interface. The namespace and pod come
//! from CNI_ARGS (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, as a kubelet's runtime passes them);
//! without them (ctr, Podman) the pod is the container ID in namespace `default`. Labels come
//! from the conventions' `args.cni.labels`; `bgpctl label` changes them afterwards.

use std::net::IpAddr;

use ipnet::IpNet;
use proto::v1 as pb;
use serde_json::{Value, json};

use crate::spec::NetConf;
use crate::spec::env::Env;

/// The namespace and pod name of the invocation.
pub fn pod_of(env: &Env) -> (String, String) {
    let ns = env
        .args
        .k8s_namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let pod = env
        .args
        .k8s_pod
        .clone()
        .unwrap_or_else(|| env.container_id.clone());
    (ns, pod)
}

/// A DNS subdomain made of `text`: lower case, other characters as '-'.
fn subdomain(text: &str) -> String {
    let s: String = text
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(253)
        .collect();
    let s = s.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if s.is_empty() {
        "pod".to_owned()
    } else {
        s.to_owned()
    }
}

/// The endpoint's name: one per pod interface.
pub fn name_of(env: &Env) -> String {
    let (_, pod) = pod_of(env);
    subdomain(&format!("{pod}.{}", env.ifname))
}

/// The document ADD records.
pub fn document(conf: &NetConf, env: &Env, host_if: &str, addresses: &[IpAddr]) -> Value {
    let (namespace, pod) = pod_of(env);
    let mut spec = json!({
        "pod": pod,
        "endpoint": env.ifname,
        "interfaceName": host_if,
        "containerID": env.container_id,
        "orchestrator": if env.args.k8s_pod.is_some() { "k8s" } else { "cni" },
        "ipNetworks": addresses.iter().map(|a| IpNet::from(*a).to_string()).collect::<Vec<_>>(),
    });
    // bgpd fills in its own node when the configuration names none.
    if let Some(node) = &conf.nodename {
        spec["node"] = json!(node);
    }
    json!({
        "apiVersion": "projectcalico.org/v3",
        "kind": "WorkloadEndpoint",
        "metadata": {
            "name": name_of(env),
            "namespace": namespace,
            "labels": conf.labels,
        },
        "spec": spec,
    })
}

/// What DEL removes.
pub fn doc_ref(env: &Env) -> pb::DocumentRef {
    let (namespace, _) = pod_of(env);
    pb::DocumentRef {
        kind: pb::DocumentKind::WorkloadEndpoint as i32,
        namespace,
        name: name_of(env),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_subdomains() {
        assert_eq!(subdomain("web-0.eth0"), "web-0.eth0");
        assert_eq!(subdomain("Web_0.eth0"), "web-0.eth0");
        assert_eq!(subdomain("--x--"), "x");
        assert_eq!(subdomain("__"), "pod");
    }
}
