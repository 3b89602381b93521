//! The datastore contract's conformance suite, in two parts like the contract: the
//! per-object cases ([`run_objects`]) run against every backend, and against SQLite and etcd
//! with their extension hidden (`datastore::Store::per_object`); the key-value cases of the
//! [`Atomic`] extension ([`run_atomic`]) against the backends that have it. Each case works
//! under its own prefix (or kind), so the cases can share one store, and checks versions only
//! relative to what it read itself.
//!
//! Why this file is long: the whole datastore contract, one case per promise, run against every
//! backend.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use datastore::contract::{
    Atomic, Datastore, Event, KeyValue, Kind, Listing, ObjectEvent, ObjectWatch, Op, Read,
    ReadResult, Revision, StoreError, Watch,
};

type CaseResult = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn e<T>(r: Result<T, StoreError>, what: &str) -> Result<T, String> {
    r.map_err(|err| format!("{what}: {err}"))
}

fn is_conflict<T>(r: &Result<T, StoreError>, key: &str) -> bool {
    matches!(r, Err(StoreError::Conflict { key: k, .. }) if k == key)
}

/// The key-value cases' words for the [`Atomic`] calls: a write is a one-op transaction and
/// answers with its revision, as the extension's users see it.
trait KeyOps: Atomic {
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>, StoreError>> + Send {
        self.get_key(key)
    }
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Listing, StoreError>> + Send {
        self.list_keys(prefix)
    }
    fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> impl Future<Output = Result<Watch, StoreError>> + Send {
        self.watch_keys(prefix, after)
    }
    fn create(
        &self,
        key: &str,
        value: Vec<u8>,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send {
        let key = key.to_owned();
        self.txn(vec![Op::Create { key, value }])
    }
    fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send {
        let (key, expected) = (key.to_owned(), expected.version());
        self.txn(vec![Op::Update {
            key,
            value,
            expected,
        }])
    }
    fn delete(
        &self,
        key: &str,
        expected: Revision,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send {
        let (key, expected) = (key.to_owned(), expected.version());
        self.txn(vec![Op::Delete { key, expected }])
    }
}

impl<A: Atomic> KeyOps for A {}

/// The next event within a deadline.
async fn next(w: &mut Watch) -> Result<Event, String> {
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(Ok(ev))) => Ok(ev),
        Ok(Some(Err(err))) => Err(format!("watch failed: {err}")),
        Ok(None) => Err("watch ended".into()),
        Err(_) => Err("no event within 10 s".into()),
    }
}

/// Nothing more arrives within a short while.
async fn quiet(w: &mut Watch) -> CaseResult {
    match tokio::time::timeout(Duration::from_millis(300), w.next()).await {
        Err(_) => Ok(()),
        Ok(other) => Err(format!("unexpected watch item {other:?}")),
    }
}

async fn get_create_update_delete<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    let k = format!("{p}a");
    ensure!(
        e(s.get(&k).await, "get")?.is_none(),
        "missing key read as present"
    );
    let before = e(s.revision().await, "revision")?;
    let r1 = e(s.create(&k, b"one".to_vec()).await, "create")?;
    ensure!(
        r1 > before,
        "create did not bump the revision ({before} -> {r1})"
    );
    let kv = e(s.get(&k).await, "get")?.ok_or("created key missing")?;
    ensure!(kv.value == b"one", "value {:?}", kv.value);
    ensure!(kv.version == r1.version(), "version {kv:?} vs {r1}");

    let again = s.create(&k, b"two".to_vec()).await;
    ensure!(is_conflict(&again, &k), "second create: {again:?}");
    if let Err(StoreError::Conflict {
        actual, expected, ..
    }) = &again
    {
        ensure!(
            *actual == Some(r1.version()) && expected.is_none(),
            "conflict detail {again:?}"
        );
    }

    let stale = s.update(&k, b"x".to_vec(), Revision(r1.0 - 1)).await;
    ensure!(is_conflict(&stale, &k), "stale update: {stale:?}");
    let r2 = e(s.update(&k, b"two".to_vec(), r1).await, "update")?;
    ensure!(r2 > r1, "update revision {r2} after {r1}");
    let kv = e(s.get(&k).await, "get")?.ok_or("updated key missing")?;
    ensure!(kv.value == b"two" && kv.version == r2.version(), "{kv:?}");

    let missing = s.update(&format!("{p}nope"), b"x".to_vec(), r2).await;
    ensure!(
        is_conflict(&missing, &format!("{p}nope")),
        "update of a missing key: {missing:?}"
    );
    let stale_delete = s.delete(&k, r1).await;
    ensure!(
        is_conflict(&stale_delete, &k),
        "stale delete: {stale_delete:?}"
    );
    let r3 = e(s.delete(&k, r2).await, "delete")?;
    ensure!(r3 > r2, "delete revision");
    ensure!(
        e(s.get(&k).await, "get")?.is_none(),
        "deleted key still there"
    );
    let twice = s.delete(&k, r2).await;
    ensure!(is_conflict(&twice, &k), "second delete: {twice:?}");
    // A deleted key can be created again.
    let r4 = e(s.create(&k, b"three".to_vec()).await, "re-create")?;
    let kv = e(s.get(&k).await, "get")?.ok_or("re-created key missing")?;
    ensure!(kv.version == r4.version(), "re-created {kv:?}");
    Ok(())
}

async fn list_is_sorted_and_prefixed<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    for name in ["c", "a", "b/x", "b/y"] {
        e(
            s.create(&format!("{p}l/{name}"), name.as_bytes().to_vec())
                .await,
            "create",
        )?;
    }
    e(
        s.create(&format!("{p}l0"), b"outside".to_vec()).await,
        "create",
    )?;
    e(
        s.create(&format!("{p}k"), b"outside".to_vec()).await,
        "create",
    )?;
    let listing = e(s.list(&format!("{p}l/")).await, "list")?;
    let keys: Vec<String> = listing.items.iter().map(|kv| kv.key.clone()).collect();
    let want: Vec<String> = ["a", "b/x", "b/y", "c"]
        .iter()
        .map(|n| format!("{p}l/{n}"))
        .collect();
    ensure!(keys == want, "listed {keys:?}, want {want:?}");
    let now = e(s.revision().await, "revision")?;
    ensure!(
        listing.revision == now,
        "listing at {} but store at {now}",
        listing.revision
    );
    ensure!(
        listing
            .items
            .iter()
            .all(|kv| kv.value == kv.key.rsplit("l/").next().unwrap().as_bytes()),
        "values do not match keys"
    );
    let empty = e(s.list(&format!("{p}zzz/")).await, "list")?;
    ensure!(empty.items.is_empty(), "{empty:?}");
    // More than a page of an etcd list.
    for i in 0..1200 {
        e(
            s.create(&format!("{p}many/{i:05}"), vec![1]).await,
            "create",
        )?;
    }
    let many = e(s.list(&format!("{p}many/")).await, "list")?;
    ensure!(
        many.items.len() == 1200,
        "listed {} of 1200",
        many.items.len()
    );
    ensure!(
        many.items.windows(2).all(|w| w[0].key < w[1].key),
        "not sorted"
    );
    Ok(())
}

#[expect(
    clippy::too_many_lines,
    reason = "one transaction case told in order: the all-or-nothing write, check-only, guarded writes; each check depends on the store state the previous one left"
)]
async fn txn_is_all_or_nothing<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    let (a, b, c) = (format!("{p}a"), format!("{p}b"), format!("{p}c"));
    let ra = e(s.create(&a, b"a0".to_vec()).await, "create a")?;
    let rb = e(s.create(&b, b"b0".to_vec()).await, "create b")?;
    // The last condition fails: nothing may be written.
    let lost = s
        .txn(vec![
            Op::Update {
                key: a.clone(),
                value: b"a1".to_vec(),
                expected: ra.version(),
            },
            Op::Create {
                key: c.clone(),
                value: b"c1".to_vec(),
            },
            Op::Delete {
                key: b.clone(),
                expected: ra.version(),
            },
        ])
        .await;
    ensure!(is_conflict(&lost, &b), "txn with a stale delete: {lost:?}");
    ensure!(
        e(s.get(&a).await, "get")?.unwrap().value == b"a0",
        "a written by a failed txn"
    );
    ensure!(
        e(s.get(&c).await, "get")?.is_none(),
        "c created by a failed txn"
    );
    ensure!(
        e(s.get(&b).await, "get")?.is_some(),
        "b deleted by a failed txn"
    );

    let r = e(
        s.txn(vec![
            Op::Update {
                key: a.clone(),
                value: b"a1".to_vec(),
                expected: ra.version(),
            },
            Op::Create {
                key: c.clone(),
                value: b"c1".to_vec(),
            },
            Op::Delete {
                key: b.clone(),
                expected: rb.version(),
            },
        ])
        .await,
        "txn",
    )?;
    let ka = e(s.get(&a).await, "get")?.ok_or("a missing")?;
    let kc = e(s.get(&c).await, "get")?.ok_or("c missing")?;
    ensure!(
        ka.version == r.version() && kc.version == r.version(),
        "one txn, one revision: {ka:?} {kc:?} {r}"
    );
    ensure!(e(s.get(&b).await, "get")?.is_none(), "b not deleted");

    // A check-only txn writes nothing and reports the current revision.
    let now = e(s.revision().await, "revision")?;
    let checked = e(
        s.txn(vec![
            Op::Check {
                key: a.clone(),
                expected: Some(r.version()),
            },
            Op::Check {
                key: b.clone(),
                expected: None,
            },
        ])
        .await,
        "check txn",
    )?;
    ensure!(
        checked == now,
        "check-only txn moved the revision {now} -> {checked}"
    );
    let failed_check = s
        .txn(vec![Op::Check {
            key: b.clone(),
            expected: Some(rb.version()),
        }])
        .await;
    ensure!(is_conflict(&failed_check, &b), "{failed_check:?}");

    // A check guards a write to another key.
    let guarded = s
        .txn(vec![
            Op::Check {
                key: a.clone(),
                expected: Some(ra.version()),
            },
            Op::Create {
                key: format!("{p}d"),
                value: vec![],
            },
        ])
        .await;
    ensure!(is_conflict(&guarded, &a), "{guarded:?}");
    ensure!(
        e(s.get(&format!("{p}d")).await, "get")?.is_none(),
        "guarded write went ahead"
    );

    let dup = s
        .txn(vec![
            Op::Check {
                key: a.clone(),
                expected: None,
            },
            Op::Check {
                key: a.clone(),
                expected: None,
            },
        ])
        .await;
    ensure!(
        matches!(dup, Err(StoreError::DuplicateKey { .. })),
        "{dup:?}"
    );
    let bad = s.create("", vec![]).await;
    ensure!(matches!(bad, Err(StoreError::InvalidKey { .. })), "{bad:?}");
    Ok(())
}

async fn watch_sees_changes_in_order<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    let start = e(s.revision().await, "revision")?;
    let mut w = e(s.watch(&format!("{p}w/"), start).await, "watch")?;
    let k1 = format!("{p}w/1");
    let r1 = e(s.create(&k1, b"v1".to_vec()).await, "create")?;
    e(
        s.create(&format!("{p}x/ignored"), b"-".to_vec()).await,
        "create",
    )?;
    let r2 = e(s.update(&k1, b"v2".to_vec(), r1).await, "update")?;
    let r3 = e(s.delete(&k1, r2).await, "delete")?;
    let want = [
        (r1, Some(b"v1".to_vec())),
        (r2, Some(b"v2".to_vec())),
        (r3, None),
    ];
    for (rev, value) in want.clone() {
        let ev = next(&mut w).await?;
        ensure!(
            ev.key == k1 && ev.revision == rev && ev.value == value,
            "got {ev:?}, want {rev} {value:?}"
        );
    }
    quiet(&mut w).await?;

    // A txn's writes arrive together, with the txn's revision.
    let rt = e(
        s.txn(vec![
            Op::Create {
                key: format!("{p}w/a"),
                value: vec![1],
            },
            Op::Create {
                key: format!("{p}w/b"),
                value: vec![2],
            },
        ])
        .await,
        "txn",
    )?;
    let mut keys = vec![];
    for _ in 0..2 {
        let ev = next(&mut w).await?;
        ensure!(ev.revision == rt, "txn event at {} not {rt}", ev.revision);
        keys.push(ev.key);
    }
    keys.sort();
    ensure!(keys == [format!("{p}w/a"), format!("{p}w/b")], "{keys:?}");

    // Watching from the start again replays the same history.
    let mut replay = e(s.watch(&format!("{p}w/"), start).await, "watch")?;
    for (rev, _) in want {
        let ev = next(&mut replay).await?;
        ensure!(ev.revision == rev, "replay {ev:?}");
    }
    Ok(())
}

async fn watch_resumes_without_loss_or_repeat<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    let start = e(s.revision().await, "revision")?;
    for i in 0..20 {
        e(s.create(&format!("{p}r/{i:02}"), vec![i]).await, "create")?;
    }
    let mut w = e(s.watch(&format!("{p}r/"), start).await, "watch")?;
    let mut seen = Vec::new();
    for _ in 0..7 {
        seen.push(next(&mut w).await?);
    }
    drop(w); // "disconnect"
    for i in 20..30 {
        e(s.create(&format!("{p}r/{i:02}"), vec![i]).await, "create")?;
    }
    let last = seen.last().unwrap().revision;
    let mut w = e(s.watch(&format!("{p}r/"), last).await, "resume")?;
    for _ in 7..30 {
        seen.push(next(&mut w).await?);
    }
    quiet(&mut w).await?;
    let values: Vec<u8> = seen
        .iter()
        .map(|ev| ev.value.as_ref().unwrap()[0])
        .collect();
    let want: Vec<u8> = (0..30).collect();
    ensure!(values == want, "resumed sequence {values:?}");
    ensure!(
        seen.windows(2).all(|w| w[0].revision < w[1].revision),
        "revisions not increasing"
    );
    Ok(())
}

async fn list_then_watch_misses_nothing<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    e(s.create(&format!("{p}lw/a"), vec![0]).await, "create")?;
    let listing = e(s.list(&format!("{p}lw/")).await, "list")?;
    let rb = e(s.create(&format!("{p}lw/b"), vec![1]).await, "create")?;
    let mut w = e(s.watch(&format!("{p}lw/"), listing.revision).await, "watch")?;
    let ev = next(&mut w).await?;
    ensure!(ev.key == format!("{p}lw/b") && ev.revision == rb, "{ev:?}");
    quiet(&mut w).await
}

async fn compacted_history_is_a_typed_error<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    let start = e(s.revision().await, "revision")?;
    let k = format!("{p}c/k");
    let mut r = e(s.create(&k, vec![0]).await, "create")?;
    for i in 1..5 {
        r = e(s.update(&k, vec![i], r).await, "update")?;
    }
    e(s.compact(Revision(r.0 - 1)).await, "compact")?;
    match s.watch(&format!("{p}c/"), start).await {
        Err(StoreError::TooOld { requested, .. }) if requested.ends_with(&start.to_string()) => {}
        Err(other) => return Err(format!("watch from before compaction: {other}")),
        Ok(mut w) => match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Err(StoreError::TooOld { .. }))) => {}
            other => {
                return Err(format!(
                    "watch from before compaction gave {:?}",
                    other.map(|o| o.map(|r| r.map(|ev| ev.revision)))
                ));
            }
        },
    }
    // From the compaction point on, watching works.
    let mut w = e(
        s.watch(&format!("{p}c/"), Revision(r.0 - 1)).await,
        "watch after compaction",
    )?;
    let ev = next(&mut w).await?;
    ensure!(ev.revision == r, "{ev:?}");
    Ok(())
}

async fn many_writers_never_lose_an_update<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    let counter = format!("{p}m/counter");
    let start = e(s.create(&counter, b"0".to_vec()).await, "create counter")?;
    let mut w = e(s.watch(&format!("{p}m/"), start).await, "watch")?;
    let mut tasks = Vec::new();
    for id in 0..WRITERS {
        let (s, counter, p) = (s.clone(), counter.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0usize;
            for n in 0..EACH {
                loop {
                    let kv = s.get(&counter).await?.expect("counter exists");
                    let v: usize = std::str::from_utf8(&kv.value).unwrap().parse().unwrap();
                    let ops = vec![
                        Op::Update {
                            key: counter.clone(),
                            value: (v + 1).to_string().into_bytes(),
                            expected: kv.version,
                        },
                        Op::Create {
                            key: format!("{p}m/w{id}-{n}"),
                            value: vec![],
                        },
                    ];
                    match s.txn(ops).await {
                        Ok(_) => break,
                        Err(StoreError::Conflict { .. }) => conflicts += 1,
                        Err(other) => return Err(other),
                    }
                }
            }
            Ok::<usize, StoreError>(conflicts)
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += e(
            t.await
                .map_err(|j| StoreError::Backend(j.to_string()))
                .and_then(|r| r),
            "writer",
        )?;
    }
    let total = WRITERS * EACH;
    let kv = e(s.get(&counter).await, "get")?.ok_or("counter missing")?;
    ensure!(
        kv.value == total.to_string().as_bytes(),
        "counter {:?} after {total} increments ({conflicts} conflicts retried)",
        String::from_utf8_lossy(&kv.value)
    );
    let listing = e(s.list(&format!("{p}m/w")).await, "list")?;
    ensure!(
        listing.items.len() == total,
        "{} marker keys of {total}",
        listing.items.len()
    );
    // The watcher sees every counter value once, in order.
    let mut expect = 1usize;
    let mut last = start;
    while expect <= total {
        let ev = next(&mut w).await?;
        ensure!(ev.revision >= last, "revision went back");
        last = ev.revision;
        if ev.key == counter {
            let v: usize = String::from_utf8_lossy(ev.value.as_deref().unwrap_or_default())
                .parse()
                .unwrap_or(0);
            ensure!(v == expect, "watch saw counter {v}, expected {expect}");
            expect += 1;
        }
    }
    Ok(())
}

async fn reads_are_one_snapshot<D: Atomic>(s: Arc<D>, p: String) -> CaseResult {
    let (a, b) = (format!("{p}a"), format!("{p}b"));
    let mut r = e(
        s.txn(vec![
            Op::Create {
                key: a.clone(),
                value: b"0".to_vec(),
            },
            Op::Create {
                key: b.clone(),
                value: b"0".to_vec(),
            },
        ])
        .await,
        "create",
    )?;
    let (answers, at) = e(
        s.read(vec![
            Read::Get(a.clone()),
            Read::List(p.clone()),
            Read::Get(format!("{p}missing")),
        ])
        .await,
        "read",
    )?;
    ensure!(at == e(s.revision().await, "revision")?, "read at {at}");
    ensure!(answers.len() == 3, "{} answers", answers.len());
    ensure!(
        matches!(&answers[0], ReadResult::Get(Some(kv)) if kv.key == a),
        "{:?}",
        answers[0]
    );
    ensure!(
        matches!(&answers[1], ReadResult::List(kvs) if kvs.len() == 2 && kvs[0].key == a),
        "{:?}",
        answers[1]
    );
    ensure!(
        matches!(&answers[2], ReadResult::Get(None)),
        "{:?}",
        answers[2]
    );
    // A writer moves a and b together; every read sees them equal.
    let writer = {
        let (s, a, b) = (s.clone(), a.clone(), b.clone());
        tokio::spawn(async move {
            for i in 1..=100u32 {
                let v = i.to_string().into_bytes();
                r = s
                    .txn(vec![
                        Op::Update {
                            key: a.clone(),
                            value: v.clone(),
                            expected: r.version(),
                        },
                        Op::Update {
                            key: b.clone(),
                            value: v,
                            expected: r.version(),
                        },
                    ])
                    .await?;
            }
            Ok::<(), StoreError>(())
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads == 0 {
        let (answers, _) = e(
            s.read(vec![Read::Get(a.clone()), Read::Get(b.clone())])
                .await,
            "read",
        )?;
        let values: Vec<Vec<u8>> = answers
            .into_iter()
            .map(|r| r.into_get().map(|kv| kv.value).unwrap_or_default())
            .collect();
        ensure!(values[0] == values[1], "torn read: {:?}", values);
        reads += 1;
    }
    e(
        writer
            .await
            .map_err(|j| StoreError::Backend(j.to_string()))
            .and_then(|r| r),
        "writer",
    )?;
    Ok(())
}

// ---- the per-object cases: every backend ----

/// A kind of the case's own (the contract's kinds are static: a test's are leaked, a few
/// bytes per case).
fn kind_at(p: &str, name: &str) -> Kind {
    Kind::new(
        "ConformanceThing",
        Box::leak(format!("{p}{name}/").into_boxed_str()),
    )
}

/// The next change of one kind within a deadline.
async fn next_object(w: &mut ObjectWatch) -> Result<ObjectEvent, String> {
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(Ok(ev))) => Ok(ev),
        Ok(Some(Err(err))) => Err(format!("watch failed: {err}")),
        Ok(None) => Err("watch ended".into()),
        Err(_) => Err("no change within 10 s".into()),
    }
}

/// No further change of the kind within a short while.
async fn quiet_object(w: &mut ObjectWatch) -> CaseResult {
    match tokio::time::timeout(Duration::from_millis(300), w.next()).await {
        Err(_) => Ok(()),
        Ok(other) => Err(format!("unexpected change {other:?}")),
    }
}

async fn object_get_create_update_delete<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    let k = kind_at(&p, "things");
    ensure!(
        e(s.get(k, "a").await, "get")?.is_none(),
        "missing object read as present"
    );
    let v1 = e(s.create(k, "a", b"one".to_vec()).await, "create")?;
    let o = e(s.get(k, "a").await, "get")?.ok_or("created object missing")?;
    ensure!(
        o.name == "a" && o.value == b"one" && o.version == v1,
        "{o:?} vs {v1}"
    );
    let again = s.create(k, "a", b"two".to_vec()).await;
    ensure!(
        matches!(again, Err(StoreError::Conflict { .. })),
        "second create: {again:?}"
    );
    let v2 = e(s.update(k, "a", b"two".to_vec(), v1).await, "update")?;
    ensure!(v2 != v1, "an update kept the version {v1}");
    let stale = s.update(k, "a", b"x".to_vec(), v1).await;
    ensure!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "update over an old version: {stale:?}"
    );
    let o = e(s.get(k, "a").await, "get")?.ok_or("updated object missing")?;
    ensure!(o.value == b"two" && o.version == v2, "{o:?}");
    let missing = s.update(k, "nope", b"x".to_vec(), v2).await;
    ensure!(
        matches!(missing, Err(StoreError::Conflict { .. })),
        "update of a missing object: {missing:?}"
    );
    let stale_delete = s.delete(k, "a", v1).await;
    ensure!(
        matches!(stale_delete, Err(StoreError::Conflict { .. })),
        "delete over an old version: {stale_delete:?}"
    );
    e(s.delete(k, "a", v2).await, "delete")?;
    ensure!(
        e(s.get(k, "a").await, "get")?.is_none(),
        "deleted object still there"
    );
    let twice = s.delete(k, "a", v2).await;
    ensure!(
        matches!(twice, Err(StoreError::Conflict { .. })),
        "second delete: {twice:?}"
    );
    // Another kind of the same name is another object.
    let other = kind_at(&p, "others");
    e(
        s.create(other, "a", b"x".to_vec()).await,
        "create other kind",
    )?;
    ensure!(
        e(s.get(k, "a").await, "get")?.is_none(),
        "an object of another kind seen"
    );
    Ok(())
}

async fn object_list_is_by_kind_and_name<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    let k = kind_at(&p, "things");
    for name in ["c", "a", "b-x", "b-y"] {
        e(s.create(k, name, name.as_bytes().to_vec()).await, "create")?;
    }
    e(
        s.create(kind_at(&p, "thingsx"), "z", vec![]).await,
        "create other kind",
    )?;
    let all = e(s.list(k, "").await, "list")?;
    let names: Vec<&str> = all.items.iter().map(|o| o.name.as_str()).collect();
    ensure!(names == ["a", "b-x", "b-y", "c"], "listed {names:?}");
    ensure!(
        all.items.iter().all(|o| o.value == o.name.as_bytes()),
        "values do not match names"
    );
    let b = e(s.list(k, "b-").await, "list by prefix")?;
    let names: Vec<&str> = b.items.iter().map(|o| o.name.as_str()).collect();
    ensure!(names == ["b-x", "b-y"], "listed by prefix {names:?}");
    let none = e(s.list(kind_at(&p, "empty"), "").await, "list empty")?;
    ensure!(none.items.is_empty(), "{none:?}");
    // More than a page of an etcd list.
    let many = kind_at(&p, "many");
    for i in 0..1100 {
        e(s.create(many, &format!("{i:05}"), vec![1]).await, "create")?;
    }
    let listed = e(s.list(many, "").await, "list")?;
    ensure!(
        listed.items.len() == 1100,
        "listed {} of 1100",
        listed.items.len()
    );
    ensure!(
        listed.items.windows(2).all(|w| w[0].name < w[1].name),
        "not sorted"
    );
    Ok(())
}

async fn object_watch_sees_one_kind_in_order<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    let k = kind_at(&p, "things");
    let start = e(s.list(k, "").await, "list")?.version;
    let mut w = e(s.watch(k, start).await, "watch")?;
    let v1 = e(s.create(k, "one", b"v1".to_vec()).await, "create")?;
    e(
        s.create(kind_at(&p, "ignored"), "one", b"-".to_vec()).await,
        "create other kind",
    )?;
    let v2 = e(s.update(k, "one", b"v2".to_vec(), v1).await, "update")?;
    e(s.delete(k, "one", v2).await, "delete")?;
    let want: [Option<&[u8]>; 3] = [Some(b"v1"), Some(b"v2"), None];
    let mut seen = Vec::new();
    for value in want {
        let ev = next_object(&mut w).await?;
        ensure!(
            ev.name == "one" && ev.value.as_deref() == value,
            "got {ev:?}, want {value:?}"
        );
        seen.push(ev);
    }
    ensure!(
        seen[0].version == v1 && seen[1].version == v2,
        "versions {seen:?}, written {v1} {v2}"
    );
    quiet_object(&mut w).await?;
    // Watching again from the first change's version gives what came after it.
    let mut again = e(s.watch(k, seen[0].version).await, "watch from an event")?;
    let ev = next_object(&mut again).await?;
    ensure!(
        ev.value.as_deref() == Some(&b"v2"[..]),
        "resumed with {ev:?}"
    );
    Ok(())
}

async fn object_watch_resumes_without_loss_or_repeat<D: Datastore>(
    s: Arc<D>,
    p: String,
) -> CaseResult {
    let k = kind_at(&p, "things");
    let start = e(s.list(k, "").await, "list")?.version;
    for i in 0..20u8 {
        e(s.create(k, &format!("{i:02}"), vec![i]).await, "create")?;
    }
    let mut w = e(s.watch(k, start).await, "watch")?;
    let mut seen = Vec::new();
    for _ in 0..7 {
        seen.push(next_object(&mut w).await?);
    }
    drop(w); // "disconnect"
    for i in 20..30u8 {
        e(s.create(k, &format!("{i:02}"), vec![i]).await, "create")?;
    }
    let last = seen.last().map(|ev| ev.version).ok_or("nothing seen")?;
    let mut w = e(s.watch(k, last).await, "resume")?;
    for _ in 7..30 {
        seen.push(next_object(&mut w).await?);
    }
    quiet_object(&mut w).await?;
    let values: Vec<u8> = seen
        .iter()
        .map(|ev| ev.value.as_ref().map_or(255, |v| v[0]))
        .collect();
    let want: Vec<u8> = (0..30).collect();
    ensure!(values == want, "resumed sequence {values:?}");
    Ok(())
}

async fn object_list_then_watch_misses_nothing<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    let k = kind_at(&p, "things");
    e(s.create(k, "a", vec![0]).await, "create")?;
    let list = e(s.list(k, "").await, "list")?;
    let vb = e(s.create(k, "b", vec![1]).await, "create")?;
    let mut w = e(s.watch(k, list.version).await, "watch")?;
    let ev = next_object(&mut w).await?;
    ensure!(ev.name == "b" && ev.version == vb, "{ev:?}");
    quiet_object(&mut w).await
}

async fn object_writers_never_lose_an_update<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    let k = kind_at(&p, "counters");
    e(
        s.create(k, "counter", b"0".to_vec()).await,
        "create counter",
    )?;
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0usize;
            for _ in 0..EACH {
                loop {
                    let o = s.get(k, "counter").await?.expect("counter exists");
                    let v: usize = std::str::from_utf8(&o.value).unwrap().parse().unwrap();
                    let next = (v + 1).to_string().into_bytes();
                    match s.update(k, "counter", next, o.version).await {
                        Ok(_) => break,
                        Err(StoreError::Conflict { .. }) => conflicts += 1,
                        Err(other) => return Err(other),
                    }
                }
            }
            Ok::<usize, StoreError>(conflicts)
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += e(
            t.await
                .map_err(|j| StoreError::Backend(j.to_string()))
                .and_then(|r| r),
            "writer",
        )?;
    }
    let total = WRITERS * EACH;
    let o = e(s.get(k, "counter").await, "get")?.ok_or("counter missing")?;
    ensure!(
        o.value == total.to_string().as_bytes(),
        "counter {:?} after {total} increments ({conflicts} conflicts retried)",
        String::from_utf8_lossy(&o.value)
    );
    Ok(())
}

/// The typed "too old, list again" of a watch of one kind. Provoking it takes a compaction,
/// which only a store with the extension offers; the others' "too old" is their own backend's
/// (the Kubernetes API's 410 Gone).
async fn object_watch_too_old_is_a_typed_error<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    let k = kind_at(&p, "things");
    let Some(atomic) = s.atomic() else {
        return Err("needs a store with the extension (run it from run_atomic)".into());
    };
    let start = e(s.list(k, "").await, "list")?.version;
    let mut v = e(s.create(k, "a", vec![0]).await, "create")?;
    for i in 1..5 {
        v = e(s.update(k, "a", vec![i], v).await, "update")?;
    }
    let now = e(atomic.revision().await, "revision")?;
    e(atomic.compact(now).await, "compact")?;
    match s.watch(k, start).await {
        Err(StoreError::TooOld { .. }) => Ok(()),
        Err(other) => Err(format!("watch from before compaction: {other}")),
        Ok(mut w) => match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Err(StoreError::TooOld { .. }))) => Ok(()),
            other => Err(format!("watch from before compaction gave {other:?}")),
        },
    }
}

type Case<D> = fn(Arc<D>, String) -> Pin<Box<dyn Future<Output = CaseResult> + Send>>;

macro_rules! cases {
    ($fn_name:ident: $bound:path; $($name:ident),* $(,)?) => {
        fn $fn_name<D: $bound>() -> Vec<(&'static str, Case<D>)> {
            vec![$((stringify!($name), |s, p| Box::pin($name(s, p)))),*]
        }
    };
}

cases!(
    object_cases: Datastore;
    object_get_create_update_delete,
    object_list_is_by_kind_and_name,
    object_watch_sees_one_kind_in_order,
    object_watch_resumes_without_loss_or_repeat,
    object_list_then_watch_misses_nothing,
    object_writers_never_lose_an_update,
);

/// The extension's cases, and the one per-object case that needs a compaction to provoke.
fn atomic_cases<D: Atomic + Datastore>() -> Vec<(&'static str, Case<D>)> {
    let mut cases = key_cases::<D>();
    cases.push(("object_watch_too_old_is_a_typed_error", |s, p| {
        Box::pin(object_watch_too_old_is_a_typed_error(s, p))
    }));
    cases
}

cases!(
    key_cases: Atomic;
    get_create_update_delete,
    list_is_sorted_and_prefixed,
    txn_is_all_or_nothing,
    watch_sees_changes_in_order,
    watch_resumes_without_loss_or_repeat,
    list_then_watch_misses_nothing,
    compacted_history_is_a_typed_error,
    many_writers_never_lose_an_update,
    reads_are_one_snapshot,
);

/// Runs the per-object cases against `store`, under keys starting with `root`; prints one
/// line per case and returns the failures.
pub async fn run_objects<D: Datastore>(store: Arc<D>, root: &str) -> Vec<String> {
    run_cases(store, root, object_cases::<D>()).await
}

/// Runs the extension's cases against `store`, under keys starting with `root`.
pub async fn run_atomic<D: Atomic + Datastore>(store: Arc<D>, root: &str) -> Vec<String> {
    run_cases(store, root, atomic_cases::<D>()).await
}

async fn run_cases<D: Datastore>(
    store: Arc<D>,
    root: &str,
    cases: Vec<(&'static str, Case<D>)>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, case) in cases {
        let started = std::time::Instant::now();
        let result = case(store.clone(), format!("{root}{name}/")).await;
        let ms = started.elapsed().as_millis();
        match result {
            Ok(()) => println!("conformance {} {name}: ok ({ms} ms)", store.describe()),
            Err(why) => {
                println!("conformance {} {name}: FAILED: {why}", store.describe());
                failures.push(format!("{name}: {why}"));
            }
        }
    }
    failures
}
