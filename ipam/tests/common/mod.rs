//! What the allocator's test files share: a fresh SQLite store, pools and requests, and the
//! per-family spelling of a test's addresses, so that one test body runs for IPv4 and IPv6.

#![allow(dead_code)] // each test file uses its own part

use ipam::allocator::{AssignRequest, Ipam};
use ipam::model::{IpFamily, IpPool};
use ipam::store::sqlite::{SqliteOptions, SqliteStore};

pub async fn ipam() -> (Ipam<SqliteStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db"), SqliteOptions::default())
        .await
        .unwrap();
    (Ipam::new(store), dir)
}

pub fn pool(name: &str, cidr: &str, block: u8) -> IpPool {
    let mut p = IpPool::new(name, cidr.parse().unwrap());
    p.block_size = block;
    p
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
    match family {
        IpFamily::V4 => req(handle, node, n, 0),
        IpFamily::V6 => req(handle, node, 0, n),
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

/// Runs one async test body (`async fn name(family: IpFamily)`) once per family, as the
/// tests `name::v4` and `name::v6`, on two worker threads (concurrent tests need them).
#[macro_export]
macro_rules! both_families {
    ($($name:ident),* $(,)?) => {
        $(mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn v4() {
                super::$name(ipam::model::IpFamily::V4).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn v6() {
                super::$name(ipam::model::IpFamily::V6).await
            }
        })*
    };
}
