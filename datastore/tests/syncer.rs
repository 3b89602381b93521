//! The syncer on SQLite, both ways: one prefix watch where the store has the extension, one
//! watch per kind merged where it has not. Both list what is there, kind by kind, and then
//! deliver every later change of the kinds followed, and nothing of the others.

use std::time::Duration;

use datastore::contract::{Datastore, Kind};
use datastore::sqlite::{SqliteOptions, SqliteStore};
use datastore::syncer::{self, KindsWatch};
use datastore::{ObjectEvent, Store};

const A: Kind = Kind::new("A", "/t/a/");
const B: Kind = Kind::new("B", "/t/b/");
const C: Kind = Kind::new("C", "/t/c/");

async fn next(w: &mut KindsWatch) -> (Kind, ObjectEvent) {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("a change within 10 s")
        .expect("the watch goes on")
        .expect("no error")
}

async fn follows_its_kinds<D: Datastore>(store: D) {
    store.create(A, "a1", b"1".to_vec()).await.unwrap();
    store.create(B, "b1", b"1".to_vec()).await.unwrap();
    store.create(C, "c1", b"1".to_vec()).await.unwrap();
    let (lists, mut watch) = syncer::list_and_watch(&store, &[A, B]).await.unwrap();
    let names: Vec<(&str, Vec<&str>)> = lists
        .iter()
        .map(|(k, l)| (k.name, l.items.iter().map(|o| o.name.as_str()).collect()))
        .collect();
    assert_eq!(names, vec![("A", vec!["a1"]), ("B", vec!["b1"])]);
    store.create(C, "c2", b"2".to_vec()).await.unwrap();
    let v = store.create(B, "b2", b"2".to_vec()).await.unwrap();
    store.update(B, "b2", b"3".to_vec(), v).await.unwrap();
    let a = store.get(A, "a1").await.unwrap().unwrap();
    store.delete(A, "a1", a.version).await.unwrap();
    // Each kind's changes in order; the kinds' relative order is not promised.
    let mut got = Vec::new();
    for _ in 0..3 {
        let (k, e) = next(&mut watch).await;
        got.push((k.name, e.name, e.value));
    }
    let of = |kind: &str| -> Vec<(String, Option<Vec<u8>>)> {
        got.iter()
            .filter(|(k, _, _)| *k == kind)
            .map(|(_, n, v)| (n.clone(), v.clone()))
            .collect()
    };
    assert_eq!(
        of("B"),
        vec![
            ("b2".to_owned(), Some(b"2".to_vec())),
            ("b2".to_owned(), Some(b"3".to_vec()))
        ]
    );
    assert_eq!(of("A"), vec![("a1".to_owned(), None)]);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), watch.next())
            .await
            .is_err(),
        "a change of a kind not followed came through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_prefix_watch_where_the_store_has_the_extension() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db"), SqliteOptions::default())
        .await
        .unwrap();
    follows_its_kinds(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watch_per_kind_where_it_has_not() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db"), SqliteOptions::default())
        .await
        .unwrap();
    follows_its_kinds(Store::sqlite(store).per_object()).await;
}
