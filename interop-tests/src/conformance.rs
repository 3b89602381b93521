//! The datastore contract's conformance suite. Every backend runs the same cases; each case
//! works under its own key prefix, so the cases can share one store, and checks revisions only
//! relative to what it read itself.
//!
//! Why this file is long: the whole datastore contract, one case per promise, run against every
//! backend.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ipam::store::{Datastore, Event, Op, Read, ReadResult, Revision, StoreError, Watch};

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

fn is_conflict(r: &Result<Revision, StoreError>, key: &str) -> bool {
    matches!(r, Err(StoreError::Conflict { key: k, .. }) if k == key)
}

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

async fn get_create_update_delete<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
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
    ensure!(
        kv.mod_revision == r1 && kv.create_revision == r1,
        "revisions {kv:?} vs {r1}"
    );

    let again = s.create(&k, b"two".to_vec()).await;
    ensure!(is_conflict(&again, &k), "second create: {again:?}");
    if let Err(StoreError::Conflict {
        actual, expected, ..
    }) = &again
    {
        ensure!(
            *actual == Some(r1) && expected.is_none(),
            "conflict detail {again:?}"
        );
    }

    let stale = s.update(&k, b"x".to_vec(), Revision(r1.0 - 1)).await;
    ensure!(is_conflict(&stale, &k), "stale update: {stale:?}");
    let r2 = e(s.update(&k, b"two".to_vec(), r1).await, "update")?;
    ensure!(r2 > r1, "update revision {r2} after {r1}");
    let kv = e(s.get(&k).await, "get")?.ok_or("updated key missing")?;
    ensure!(
        kv.value == b"two" && kv.mod_revision == r2 && kv.create_revision == r1,
        "{kv:?}"
    );

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
    // A deleted key can be created again, with a new create revision.
    let r4 = e(s.create(&k, b"three".to_vec()).await, "re-create")?;
    let kv = e(s.get(&k).await, "get")?.ok_or("re-created key missing")?;
    ensure!(kv.create_revision == r4, "re-created {kv:?}");
    Ok(())
}

async fn list_is_sorted_and_prefixed<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
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

async fn txn_is_all_or_nothing<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    let (a, b, c) = (format!("{p}a"), format!("{p}b"), format!("{p}c"));
    let ra = e(s.create(&a, b"a0".to_vec()).await, "create a")?;
    let rb = e(s.create(&b, b"b0".to_vec()).await, "create b")?;
    // The last condition fails: nothing may be written.
    let lost = s
        .txn(vec![
            Op::Update {
                key: a.clone(),
                value: b"a1".to_vec(),
                expected: ra,
            },
            Op::Create {
                key: c.clone(),
                value: b"c1".to_vec(),
            },
            Op::Delete {
                key: b.clone(),
                expected: ra,
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
                expected: ra,
            },
            Op::Create {
                key: c.clone(),
                value: b"c1".to_vec(),
            },
            Op::Delete {
                key: b.clone(),
                expected: rb,
            },
        ])
        .await,
        "txn",
    )?;
    let ka = e(s.get(&a).await, "get")?.ok_or("a missing")?;
    let kc = e(s.get(&c).await, "get")?.ok_or("c missing")?;
    ensure!(
        ka.mod_revision == r && kc.mod_revision == r,
        "one txn, one revision: {ka:?} {kc:?} {r}"
    );
    ensure!(e(s.get(&b).await, "get")?.is_none(), "b not deleted");

    // A check-only txn writes nothing and reports the current revision.
    let now = e(s.revision().await, "revision")?;
    let checked = e(
        s.txn(vec![
            Op::Check {
                key: a.clone(),
                expected: Some(r),
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
            expected: Some(rb),
        }])
        .await;
    ensure!(is_conflict(&failed_check, &b), "{failed_check:?}");

    // A check guards a write to another key.
    let guarded = s
        .txn(vec![
            Op::Check {
                key: a.clone(),
                expected: Some(ra),
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

async fn watch_sees_changes_in_order<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
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

async fn watch_resumes_without_loss_or_repeat<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
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

async fn list_then_watch_misses_nothing<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    e(s.create(&format!("{p}lw/a"), vec![0]).await, "create")?;
    let listing = e(s.list(&format!("{p}lw/")).await, "list")?;
    let rb = e(s.create(&format!("{p}lw/b"), vec![1]).await, "create")?;
    let mut w = e(s.watch(&format!("{p}lw/"), listing.revision).await, "watch")?;
    let ev = next(&mut w).await?;
    ensure!(ev.key == format!("{p}lw/b") && ev.revision == rb, "{ev:?}");
    quiet(&mut w).await
}

async fn compacted_history_is_a_typed_error<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
    let start = e(s.revision().await, "revision")?;
    let k = format!("{p}c/k");
    let mut r = e(s.create(&k, vec![0]).await, "create")?;
    for i in 1..5 {
        r = e(s.update(&k, vec![i], r).await, "update")?;
    }
    e(s.compact(Revision(r.0 - 1)).await, "compact")?;
    match s.watch(&format!("{p}c/"), start).await {
        Err(StoreError::Compacted { requested, .. }) if requested == start => {}
        Err(other) => return Err(format!("watch from before compaction: {other}")),
        Ok(mut w) => match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Err(StoreError::Compacted { .. }))) => {}
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

async fn many_writers_never_lose_an_update<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
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
                            expected: kv.mod_revision,
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

async fn reads_are_one_snapshot<D: Datastore>(s: Arc<D>, p: String) -> CaseResult {
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
                            expected: r,
                        },
                        Op::Update {
                            key: b.clone(),
                            value: v,
                            expected: r,
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

type Case<D> = fn(Arc<D>, String) -> Pin<Box<dyn Future<Output = CaseResult> + Send>>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        fn cases<D: Datastore>() -> Vec<(&'static str, Case<D>)> {
            vec![$((stringify!($name), |s, p| Box::pin($name(s, p)))),*]
        }
    };
}

cases!(
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

/// Runs every case against `store`, under keys starting with `root`; prints one line per case
/// and returns the failures.
pub async fn run<D: Datastore>(store: Arc<D>, root: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for (name, case) in cases::<D>() {
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
