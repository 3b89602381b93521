//! Starting real parts for tests, and finding margay's own binaries.

pub mod bgp_peer;
pub mod bgpd;
pub mod bird;
pub mod calico_bird;
pub mod calico_node;
pub mod etcd;
pub mod frr;
pub mod gobgp;
pub mod kernel_observer;
pub mod link6;
pub mod local;
pub mod mesh;
pub mod netns;
pub mod procstat;
pub mod runtime;
pub mod segment;
pub mod segment_node;
pub mod soak;
pub mod tester;

use std::path::PathBuf;

/// A free TCP port on 127.0.0.1 (free when asked; bind it soon).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("the loopback interface can bind an ephemeral port")
}

/// One of the workspace's binaries (bgpd, bgpctl, ...) built next to the running test or bench.
/// Panics when it is not built (tests want that); see [`try_binary`].
pub fn binary(name: &str) -> PathBuf {
    try_binary(name).unwrap_or_else(|e| panic!("{e}"))
}

/// As [`binary`], with an error that says how to build it when it is missing.
pub fn try_binary(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the running executable: {e}"))?;
    // target/<profile>/deps/<test> or target/<profile>/<bench>
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} is not built; run `cargo build --bins` (with --release for a release run) first",
            path.display()
        ))
    }
}

/// Opens a store from "sqlite:PATH" or "etcd:URL[,URL...]" (what the load generators take).
pub async fn open_store(spec: &str) -> Result<ipam::store::Store, ipam::store::StoreError> {
    use ipam::store::{Store, StoreError, etcd, sqlite};
    if let Some(path) = spec.strip_prefix("sqlite:") {
        Ok(Store::Sqlite(
            sqlite::SqliteStore::open(path, sqlite::SqliteOptions::default()).await?,
        ))
    } else if let Some(urls) = spec.strip_prefix("etcd:") {
        let endpoints: Vec<String> = urls.split(',').map(str::to_owned).collect();
        Ok(Store::Etcd(
            etcd::EtcdStore::connect(&endpoints, etcd::EtcdOptions::default()).await?,
        ))
    } else {
        Err(StoreError::Backend(format!(
            "{spec:?}: expected sqlite:PATH or etcd:URL"
        )))
    }
}
