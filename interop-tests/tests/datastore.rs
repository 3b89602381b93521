//! The datastore conformance suite against both backends: SQLite on a temporary file and a real
//! etcd on loopback; the per-object cases also with the extension hidden, as a store without
//! one (the Kubernetes API) is used.

use std::sync::Arc;

use datastore::Store;
use datastore::etcd::EtcdOptions;
use datastore::sqlite::{SqliteOptions, SqliteStore};
use interop_tests::{conformance, lab};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"), SqliteOptions::default())
        .await
        .unwrap();
    let store = Store::sqlite(store);
    let mut failures = conformance::run_objects(Arc::new(store.clone()), "/objects/").await;
    failures.extend(
        conformance::run_objects(Arc::new(store.clone().per_object()), "/per-object/").await,
    );
    failures.extend(conformance::run_atomic(Arc::new(store), "/conformance/").await);
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_conforms() {
    let etcd = lab::etcd::EtcdCluster::start(1);
    let store = Store::etcd(etcd.store(EtcdOptions::default()).await);
    let mut failures = conformance::run_objects(Arc::new(store.clone()), "/objects/").await;
    failures.extend(
        conformance::run_objects(Arc::new(store.clone().per_object()), "/per-object/").await,
    );
    failures.extend(conformance::run_atomic(Arc::new(store), "/conformance/").await);
    assert!(failures.is_empty(), "{failures:#?}");
}
