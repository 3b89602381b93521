//! What the allocator's test files share: a fresh store (of the crate root's choosing) and a
//! count of its writes, pools and requests, and the per-family spelling of a test's
//! addresses, so that one test body runs for IPv4 and IPv6.

#![allow(dead_code)] // each test file uses its own part

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use datastore::Store;
use datastore::contract::{Atomic, Datastore};
use datastore::model::{IpFamily, IpPool};
use datastore::sqlite::{SqliteOptions, SqliteStore};
use ipam::allocator::{AssignRequest, Ipam};

/// What one test's store needs kept alive (its temporary directory, a kube-apiserver), and
/// how its writes are counted. The crate root's `fresh_store` makes it.
pub struct Backing {
    pub keep: Box<dyn std::any::Any>,
    pub counter: WriteCounter,
}

/// How a test counts the writes made to its store.
pub enum WriteCounter {
    /// The store's revision: one per commit (SQLite, etcd).
    Revision(Store),
    /// Counted where the writes are seen (the kube-apiserver's admission webhook).
    Observed(Box<dyn Fn() -> u64>),
}

impl Backing {
    /// The writes (commits) made to the store so far.
    pub async fn writes(&self) -> u64 {
        match &self.counter {
            WriteCounter::Revision(store) => store.revision().await.unwrap().0,
            WriteCounter::Observed(count) => count(),
        }
    }
}

/// A fresh SQLite store in a temporary directory, with its `Atomic` extension.
pub async fn sqlite() -> (Store, Backing) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db"), SqliteOptions::default())
        .await
        .unwrap();
    let store = Store::sqlite(store);
    let backing = Backing {
        keep: Box::new(dir),
        counter: WriteCounter::Revision(store.clone()),
    };
    (store, backing)
}

/// A fresh store for one test's allocator, of the crate root's `fresh_store` (SQLite in
/// this crate; the Kubernetes API in interop-tests' run of these cases): with its `Atomic`
/// extension in use, or hidden from the allocator when the crate root says `PER_OBJECT`
/// (the same cases again on the per-object path, as on a store without the extension,
/// through `Store::per_object`).
pub async fn ipam() -> (Ipam<Store>, Backing) {
    let (store, backing) = crate::fresh_store().await;
    let store = if crate::PER_OBJECT {
        store.per_object()
    } else {
        store
    };
    (Ipam::new(store), backing)
}

pub fn pool(name: &str, cidr: &str, block: u8) -> IpPool {
    let mut p = IpPool::new(name, cidr.parse().unwrap());
    p.block_size = block;
    p
}

/// Creates the pools `v4` and `v6`, each (cidr, block size).
pub async fn dual_pools(ipam: &Ipam<impl Datastore>, v4: (&str, u8), v6: (&str, u8)) {
    for (name, (cidr, block)) in [("v4", v4), ("v6", v6)] {
        ipam.create_pool(&pool(name, cidr, block)).await.unwrap();
    }
}

pub fn req(handle: &str, node: &str, v4: u32, v6: u32) -> AssignRequest {
    AssignRequest {
        handle: handle.into(),
        node: node.into(),
        num_v4: v4,
        num_v6: v6,
        ..Default::default()
    }
}

/// A request for `n` addresses of `family`.
pub fn req_of(family: IpFamily, handle: &str, node: &str, n: u32) -> AssignRequest {
    let (v4, v6) = counts_of(family, n);
    req(handle, node, v4, v6)
}

/// `n` addresses of `family` as (IPv4 count, IPv6 count).
pub fn counts_of(family: IpFamily, n: u32) -> (u32, u32) {
    match family {
        IpFamily::V4 => (n, 0),
        IpFamily::V6 => (0, n),
    }
}

/// The test's text for `family`: its IPv4 or its IPv6 spelling of the same thing.
pub fn pick<'a>(family: IpFamily, v4: &'a str, v6: &'a str) -> &'a str {
    match family {
        IpFamily::V4 => v4,
        IpFamily::V6 => v6,
    }
}

/// The prefix length of a block of `2^bits` addresses in `family`.
pub fn block_of(family: IpFamily, bits: u8) -> u8 {
    match family {
        IpFamily::V4 => 32 - bits,
        IpFamily::V6 => 128 - bits,
    }
}

/// `tasks` tasks at once, task `t` making `per_task` requests one after another, request `i`
/// for `ask(t, i)` = (node, IPv4 count, IPv6 count) under the handle `net.t{t}-{i}`; each
/// answer checked for the counts and families asked for. Every handle with what it got.
pub async fn concurrent_requests<F>(
    ipam: &Arc<Ipam<Store>>,
    tasks: usize,
    per_task: usize,
    ask: F,
) -> Vec<(String, Vec<IpAddr>)>
where
    F: Fn(usize, usize) -> (&'static str, u32, u32) + Copy + Send + 'static,
{
    let tasks: Vec<_> = (0..tasks)
        .map(|t| {
            let ipam = ipam.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..per_task {
                    let (node, n4, n6) = ask(t, i);
                    let handle = format!("net.t{t}-{i}");
                    let (v4, v6) = ipam.auto_assign(&req(&handle, node, n4, n6)).await.unwrap();
                    assert_eq!((v4.len(), v6.len()), (n4 as usize, n6 as usize));
                    assert!(v4.iter().all(|a| a.address.is_ipv4()));
                    assert!(v6.iter().all(|a| a.address.is_ipv6()));
                    let mine: Vec<IpAddr> = v4.iter().chain(&v6).map(|a| a.address).collect();
                    got.push((handle, mine));
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// What [`concurrent_requests`] handed out: no address twice, each handle holding exactly
/// what it was given, and `check` finding nothing wrong; its report's allocation count.
pub async fn assert_distinct_and_held(ipam: &Ipam<Store>, all: &[(String, Vec<IpAddr>)]) -> u64 {
    let addresses: Vec<IpAddr> = all.iter().flat_map(|(_, a)| a.clone()).collect();
    let distinct: HashSet<&IpAddr> = addresses.iter().collect();
    assert_eq!(
        distinct.len(),
        addresses.len(),
        "an address was handed out twice"
    );
    for (handle, mine) in all {
        let mut held: Vec<IpAddr> = ipam
            .handle_allocations(handle)
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.address)
            .collect();
        held.sort();
        let mut want = mine.clone();
        want.sort();
        assert_eq!(held, want, "{handle}");
    }
    let report = ipam.check().await.unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    report.allocations
}

/// Runs one async test body (`async fn name(family: IpFamily)`) once per family, as the
/// tests `name::v4` and `name::v6`, on two worker threads (concurrent tests need them).
#[macro_export]
macro_rules! both_families {
    ($($name:ident),* $(,)?) => {
        $(mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn v4() {
                super::$name(datastore::model::IpFamily::V4).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn v6() {
                super::$name(datastore::model::IpFamily::V6).await
            }
        })*
    };
}
