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
