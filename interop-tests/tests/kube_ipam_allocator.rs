//! The ipam crate's `allocator.rs` cases on the real kube-apiserver: each case's allocator on a
//! fresh apiserver of its own (the Kubernetes datastore, one object at a time, as the
//! per-object run on SQLite), its writes counted by an admission webhook where SQLite counts
//! its commits (`lab::kube_webhook::counted_admin_store`). Cases that check the store
//! itself (a refused request writes nothing, a claim is five writes) check the apiserver.

const PER_OBJECT: bool = true;

async fn fresh_store() -> (datastore::Store, cases::common::Backing) {
    let (store, keep, count) = interop_tests::lab::kube_webhook::counted_admin_store().await;
    let counter = cases::common::WriteCounter::Observed(count);
    (store, cases::common::Backing { keep, counter })
}

#[path = "../../ipam/tests/allocator.rs"]
mod cases;
