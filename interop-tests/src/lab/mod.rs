//! Starting real parts for tests, and finding margay's own binaries.

pub mod bgp_peer;
pub mod bgpd;
pub mod bird;
pub mod calico_bird;
pub mod calico_node;
pub mod etcd;
pub mod flows;
pub mod frr;
pub mod gobgp;
pub mod kernel_observer;
pub mod kube_api;
pub mod kube_webhook;
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
pub mod tor;

use std::path::{Path, PathBuf};

/// A free TCP port on 127.0.0.1 (free when asked; bind it soon).
///
/// Ports come from below the kernel's ephemeral range (32768 and up by default): a port the
/// kernel handed out to `bind(0)` is also what it hands out as the source port of outgoing
/// connections, so with many tests connecting at once a daemon started on such a port a moment
/// later can find it taken (CI saw an etcd member fail to start that way). Where in the range a
/// process starts is random, so concurrent test processes rarely even try the same port.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let _ = NEXT.compare_exchange(
            u32::MAX,
            (h.finish() % u64::from(SPAN)) as u32,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 between {LOW} and {}", LOW + SPAN)
}

/// A file of the repository (`deploy/rbac.yaml`), as a path for a command's argument.
pub fn repo_file(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
        .display()
        .to_string()
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

/// What `ipam check` reported after a claim or release was cut short (`after`, e.g. "stopped
/// after write 3"): each problem must be one of `known` (parts of check's messages for what an
/// interrupted operation leaves, which GC finishes), none of the damage it reports otherwise.
/// Prints them, for the test's output.
pub fn assert_check_knows(problems: &[String], known: &[&str], after: &str) {
    for p in problems {
        assert!(
            known.iter().any(|k| p.contains(k)),
            "{after} left {p:?}, which check does not know to report"
        );
    }
    println!("{after}: check reports {problems:?}");
}

/// Opens a store from "sqlite:PATH", "etcd:URL[,URL...]" or "kubernetes:KUBECONFIG" (what the
/// load generators take), either of the first two with "per-object:" before it for the store
/// with its extension hidden.
pub async fn open_store(spec: &str) -> Result<datastore::Store, datastore::contract::StoreError> {
    use datastore::{Store, StoreError};
    use datastore::{etcd, sqlite};
    if let Some(rest) = spec.strip_prefix("per-object:") {
        Ok(Box::pin(open_store(rest)).await?.per_object())
    } else if let Some(path) = spec.strip_prefix("sqlite:") {
        Ok(Store::sqlite(
            sqlite::SqliteStore::open(path, sqlite::SqliteOptions::default()).await?,
        ))
    } else if let Some(urls) = spec.strip_prefix("etcd:") {
        let endpoints: Vec<String> = urls.split(',').map(str::to_owned).collect();
        Ok(Store::etcd(
            etcd::EtcdStore::connect(&endpoints, etcd::EtcdOptions::default()).await?,
        ))
    } else if let Some(kubeconfig) = spec.strip_prefix("kubernetes:") {
        let store = datastore::kubernetes::KubeStore::connect(
            Some(std::path::Path::new(kubeconfig)),
            ipam::calico::codecs(),
        )
        .await?;
        Ok(Store::kubernetes(store))
    } else {
        Err(StoreError::Backend(format!(
            "{spec:?}: expected sqlite:PATH, etcd:URL or kubernetes:KUBECONFIG"
        )))
    }
}
