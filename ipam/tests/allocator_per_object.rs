//! `allocator.rs`'s cases again on the allocator's per-object path: the store's `Atomic`
//! extension hidden from the allocator (see `common::ipam`), as on a store without one.

const PER_OBJECT: bool = true;

async fn fresh_store() -> (datastore::Store, cases::common::Backing) {
    cases::common::sqlite().await
}

#[path = "allocator.rs"]
mod cases;
