//! The SQLite store shared by several OS processes: concurrent writers lose nothing, a watcher
//! sees another process's writes, and `kill -9` in the middle of transactions never leaves a
//! partial one behind.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datastore::contract::Atomic;
use datastore::sqlite::{SqliteOptions, SqliteStore};
use interop_tests::lab;

fn writer(path: &std::path::Path, mode: &str, count: usize) -> Command {
    let mut c = Command::new(lab::binary("store-bench"));
    c.args(["writer", "--mode", mode, "--count", &count.to_string()])
        .arg("--path")
        .arg(path)
        .stdin(Stdio::null());
    c
}

fn parse(v: &[u8]) -> u64 {
    std::str::from_utf8(v).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_share_one_file_without_losing_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = Arc::new(
        SqliteStore::open(&path, SqliteOptions::default())
            .await
            .unwrap(),
    );
    let start = store.revision().await.unwrap();
    let mut watch = store.watch_keys("/counter", start).await.unwrap();

    const PROCS: usize = 4;
    const EACH: usize = 100;
    let children: Vec<_> = (0..PROCS)
        .map(|_| {
            writer(&path, "counter", EACH)
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    // This process's watcher sees every increment the others make, in order.
    for expect in 1..=(PROCS * EACH) as u64 {
        let ev = tokio::time::timeout(Duration::from_secs(30), watch.next())
            .await
            .expect("a change from another process within 30 s")
            .unwrap()
            .unwrap();
        assert_eq!(parse(ev.value.as_deref().unwrap()), expect);
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let kv = store.get_key("/counter").await.unwrap().unwrap();
    assert_eq!(parse(&kv.value), (PROCS * EACH) as u64);
}

/// A small deterministic generator for kill delays, so a failure can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_transaction_never_leaves_a_partial_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let seed = std::process::id() as u64;
    let mut rng = Lcg(seed);
    let mut acknowledged = 0u64;
    for round in 0..50 {
        let mut child = writer(&path, "generations", 0)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Read acknowledgements on a thread while the writer runs.
        let reader = std::thread::spawn(move || {
            let mut last = 0u64;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(g) = line.strip_prefix("committed ") {
                    last = g.parse().unwrap();
                }
            }
            last
        });
        // Let it get into its stride first (opening costs a few ms), then kill at a random moment.
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(15 + rng.next() % 60));
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "round {round}: the writer ended by itself: {status}"
        );
        let last_ack = reader.join().unwrap();

        // The file opens cleanly (integrity check included) and every transaction is whole.
        let store = SqliteStore::open(&path, SqliteOptions::default())
            .await
            .unwrap_or_else(|e| panic!("round {round} (seed {seed}): {e}"));
        let generation = store
            .get_key("/gen")
            .await
            .unwrap()
            .map(|kv| parse(&kv.value))
            .unwrap_or(0);
        let listing = store.list_keys("/k/").await.unwrap();
        for kv in &listing.items {
            assert_eq!(
                parse(&kv.value),
                generation,
                "round {round} (seed {seed}): {} is at generation {} but /gen is {generation}",
                kv.key,
                parse(&kv.value)
            );
        }
        assert!(
            generation >= last_ack,
            "round {round} (seed {seed}): generation {last_ack} was acknowledged but the store has {generation}"
        );
        assert!(generation >= acknowledged, "round {round}: went back");
        acknowledged = generation;
        drop(store);
        let _ = started;
    }
    assert!(
        acknowledged > 50,
        "the writers committed only {acknowledged} generations in 50 rounds"
    );
}
