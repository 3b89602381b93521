//! A three-member etcd cluster on loopback: writers keep going while members are killed and
//! restarted, and nothing acknowledged is lost.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use datastore::contract::{Datastore, Kind, StoreError};
use datastore::etcd::EtcdOptions;
use interop_tests::lab::etcd::EtcdCluster;

/// The objects the writers create, one per acknowledged write.
const ACK: Kind = Kind::new("Ack", "/ack/");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_survive_a_member_being_killed_and_restarted() {
    let mut etcd = EtcdCluster::start(3);
    let options = EtcdOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        tls: None,
    };
    let store = Arc::new(etcd.store(options).await);
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (store, stop, acks) = (store.clone(), stop.clone(), acks.clone());
        writers.push(tokio::spawn(async move {
            let mut acknowledged = BTreeSet::new();
            let mut failures = 0usize;
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("w{w}-{n:06}");
                match store.create(ACK, &key, key.as_bytes().to_vec()).await {
                    Ok(_) => {}
                    // An earlier attempt committed but its answer was lost: it is stored.
                    Err(StoreError::Conflict { .. }) => {}
                    Err(_) => {
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
                acknowledged.insert(key);
                acks.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            (acknowledged, failures)
        }));
    }
    let during = |acks: &AtomicUsize| acks.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut progress = Vec::new();
    for member in [0, 1] {
        etcd.kill(member);
        // Killing the leader pauses writes for an election; they must resume while the member
        // is still down.
        let before = during(&acks);
        let killed = std::time::Instant::now();
        while during(&acks) < before + 100 && killed.elapsed() < Duration::from_secs(8) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        progress.push((member, during(&acks) - before, killed.elapsed().as_millis()));
        etcd.restart(member);
        etcd.wait_ready();
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = BTreeSet::new();
    let mut failures = 0;
    for w in writers {
        let (a, f) = w.await.unwrap();
        acknowledged.extend(a);
        failures += f;
    }
    println!(
        "acknowledged {} writes ({failures} failed attempts retried); (member killed, writes while down, ms until 100 writes): {progress:?}",
        acknowledged.len()
    );
    assert!(
        progress.iter().all(|&(_, writes, _)| writes >= 100),
        "writes stalled while a member was down: {progress:?}"
    );

    let stored: BTreeSet<String> = store
        .list(ACK, "")
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.name)
        .collect();
    let lost: Vec<_> = acknowledged.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged keys lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(
        acknowledged.len() > 100,
        "only {} writes acknowledged",
        acknowledged.len()
    );
}
