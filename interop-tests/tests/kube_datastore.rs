//! The Kubernetes datastore against a real kube-apiserver (built by `scripts/build-kube`) over
//! etcd 3.7: the CRDs install and are served, and the per-object conformance cases pass on
//! the apiserver as on SQLite and etcd.

use std::sync::Arc;

use datastore::Store;
use datastore::kubernetes::KubeStore;
use interop_tests::conformance;
use interop_tests::lab::kube_api::KubeApi;

async fn store(api: &KubeApi) -> Store {
    let store = KubeStore::connect(Some(&api.kubeconfig), ipam::calico::codecs())
        .await
        .unwrap();
    let created = store.install_crds().await.unwrap();
    assert_eq!(
        created.len(),
        datastore::crd::manifests::ALL.len() + 1,
        "{created:?}"
    );
    Store::kubernetes(store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_conforms() {
    let api = KubeApi::start();
    let store = store(&api).await;
    // The second start finds every CRD in place and creates none.
    let again = store.as_kubernetes().unwrap().install_crds().await.unwrap();
    assert!(again.is_empty(), "{again:?}");
    let served = api.kubectl_ok(&[
        "api-resources",
        "--api-group=crd.projectcalico.org",
        "-o",
        "name",
    ]);
    for m in datastore::crd::manifests::ALL {
        assert!(
            served.contains(&format!("{}.crd.projectcalico.org", m.plural)),
            "{} not served:\n{served}",
            m.plural
        );
    }
    let failures = conformance::run_objects(Arc::new(store), "/objects/").await;
    assert!(failures.is_empty(), "{failures:#?}");
}

/// margay's nodes are Calico's annotations on the Kubernetes Node: registration merges them
/// into a Node the kubelet made (its labels and annotations kept), the labels read back are
/// the Node's over margay's, and forgetting the node removes only the annotations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_annotations_on_the_kubernetes_node() {
    use datastore::Resources;
    use datastore::model::Node;
    let api = KubeApi::start();
    let store = store(&api).await;
    let kubelet = api.dir().join("node.yaml");
    std::fs::write(
        &kubelet,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: worker-1\n  labels:\n    kubernetes.io/hostname: worker-1\n  annotations:\n    node.alpha.kubernetes.io/ttl: \"0\"\n",
    )
    .unwrap();
    api.kubectl_ok(&["apply", "-f", kubelet.to_str().unwrap()]);
    let resources = Resources::new(&store);
    let mut node = Node::new("worker-1");
    node.ipv4 = Some("10.99.1.11/24".parse().unwrap());
    node.ipv6 = Some("fd00:99:1::11/64".parse().unwrap());
    node.asn = Some(64512);
    node.labels.insert("rack".into(), "r1".into());
    resources.register_node(&node, None).await.unwrap();
    // A second node the cluster has no Node for yet (a lab without kubelets): created.
    let mut other = Node::new("worker-9");
    other.ipv4 = Some("10.99.1.19/24".parse().unwrap());
    resources.register_node(&other, None).await.unwrap();

    let annotations: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&api.kubectl_ok(&[
            "get",
            "node",
            "worker-1",
            "-o",
            "jsonpath={.metadata.annotations}",
        ]))
        .unwrap();
    println!("worker-1's annotations: {annotations:?}");
    assert_eq!(
        annotations["projectcalico.org/IPv4Address"],
        "10.99.1.11/24"
    );
    assert_eq!(
        annotations["projectcalico.org/IPv6Address"],
        "fd00:99:1::11/64"
    );
    assert_eq!(annotations["projectcalico.org/ASNumber"], "64512");
    assert_eq!(annotations["projectcalico.org/labels"], r#"{"rack":"r1"}"#);
    assert_eq!(annotations["node.alpha.kubernetes.io/ttl"], "0");

    let (read, version) = resources.get_node("worker-1").await.unwrap();
    assert_eq!(read.ipv4, node.ipv4);
    assert_eq!(read.labels["rack"], "r1");
    assert_eq!(read.labels["kubernetes.io/hostname"], "worker-1");
    let names: Vec<String> = resources
        .list_nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n.name)
        .collect();
    assert_eq!(names, ["worker-1", "worker-9"]);

    // A stale version loses; the current one forgets the node, not the Kubernetes Node.
    use datastore::contract::Datastore;
    use datastore::resource::Resource;
    let mut changed = read.clone();
    changed.asn = Some(64513);
    resources
        .register_node(&changed, Some(version))
        .await
        .unwrap();
    let stale = store.delete(Node::kind(), "worker-1", version).await;
    assert!(
        matches!(stale, Err(datastore::StoreError::Conflict { .. })),
        "{stale:?}"
    );
    let (_, now) = resources.get_node("worker-1").await.unwrap();
    store.delete(Node::kind(), "worker-1", now).await.unwrap();
    assert!(resources.get_node("worker-1").await.is_err());
    let left = api.kubectl_ok(&[
        "get",
        "node",
        "worker-1",
        "-o",
        "jsonpath={.metadata.annotations}",
    ]);
    assert!(!left.contains("projectcalico.org/"), "{left}");
    assert!(left.contains("node.alpha.kubernetes.io/ttl"), "{left}");
}

/// A watch from a version the apiserver no longer keeps ends with `TooOld` (the apiserver's
/// 410 Gone), so its user lists again; a watch from the list's version then sees what follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_forgotten_version_is_too_old_then_a_relist_resumes() {
    use datastore::contract::{Datastore, Kind};
    const THING: Kind = Kind::new("GoneThing", "/gone/things/");
    // Without the watch cache, which keeps at least 75 s of changes and would serve the old
    // version from memory: the watch goes to etcd, whose history the apiserver compacts
    // every 5 s here.
    let api = KubeApi::start_with(&["--watch-cache=false"]);
    let store = store(&api).await;
    let first = store.create(THING, "a", b"0".to_vec()).await.unwrap();
    let mut version = first;
    for i in 1..=20 {
        version = store
            .update(THING, "a", i.to_string().into_bytes(), version)
            .await
            .unwrap();
    }
    // After two compactions the first version is gone.
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let mut watch = store.watch(THING, first).await.unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next())
        .await
        .expect("the watch answers within 10 s");
    println!("watch from the first version: {ended:?}");
    assert!(
        matches!(ended, Some(Err(datastore::StoreError::TooOld { .. }))),
        "{ended:?}"
    );
    let list = store.list(THING, "").await.unwrap();
    assert_eq!(list.items[0].value, b"20");
    let mut watch = store.watch(THING, list.version).await.unwrap();
    store
        .update(THING, "a", b"21".to_vec(), list.items[0].version)
        .await
        .unwrap();
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next.value.as_deref(), Some(&b"21"[..]));
}

/// Calico deletes an IPAM object in two steps, marking it `deleted` and then deleting it;
/// a watch that listed the object before (and so saw neither its creation nor a change)
/// still sees it go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_calicos_two_step_delete_of_a_listed_object() {
    use datastore::contract::Datastore;
    use datastore::resource::Resource;
    use ipam::block::Handle;
    let api = KubeApi::start();
    let store = store(&api).await;
    let mut handle = Handle {
        id: "k8s-pod-network.abc".into(),
        ..Handle::default()
    };
    handle.add(&"10.244.7.64/26".parse().unwrap(), 1);
    store
        .create(
            Handle::kind(),
            &handle.id,
            datastore::resource::encode(&handle),
        )
        .await
        .unwrap();
    let list = store.list(Handle::kind(), "").await.unwrap();
    assert_eq!(list.items.len(), 1);
    let mut watch = store.watch(Handle::kind(), list.version).await.unwrap();
    api.kubectl_ok(&[
        "patch",
        "ipamhandles.crd.projectcalico.org",
        "k8s-pod-network.abc",
        "--type=merge",
        "-p",
        r#"{"spec":{"deleted":true}}"#,
    ]);
    let marked = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    println!("after the mark: {marked:?}");
    assert_eq!(marked.name, "k8s-pod-network.abc");
    assert_eq!(marked.value, None, "a marked object is gone for margay");
    assert!(
        store
            .get(Handle::kind(), &handle.id)
            .await
            .unwrap()
            .is_none()
    );
    // A create over the leftover finishes Calico's delete and succeeds.
    store
        .create(
            Handle::kind(),
            &handle.id,
            datastore::resource::encode(&handle),
        )
        .await
        .unwrap();
    assert!(
        store
            .get(Handle::kind(), &handle.id)
            .await
            .unwrap()
            .is_some()
    );
}
