//! The datastore conformance suite against both backends: SQLite on a temporary file and a real
//! etcd on loopback.

use std::sync::Arc;

use interop_tests::{conformance, lab};
use ipam::store::etcd::EtcdOptions;
use ipam::store::sqlite::{SqliteOptions, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"), SqliteOptions::default())
        .await
        .unwrap();
    let failures = conformance::run(Arc::new(store), "/conformance/").await;
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_conforms() {
    let etcd = lab::etcd::EtcdCluster::start(1);
    let store = etcd.store(EtcdOptions::default()).await;
    let failures = conformance::run(Arc::new(store), "/conformance/").await;
    assert!(failures.is_empty(), "{failures:#?}");
}
