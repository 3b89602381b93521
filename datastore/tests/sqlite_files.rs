//! Files that are not a margay store are refused with their name, and left untouched.

use datastore::contract::{Kind, StoreError};

/// The kind the cases write.
const K: Kind = Kind::new("Thing", "/k/");
const X: Kind = Kind::new("Thing", "/x/");
use datastore::sqlite::{SqliteOptions, SqliteStore};

async fn refused(path: &std::path::Path) -> String {
    let before = std::fs::read(path).unwrap();
    let sides =
        ["-wal", "-shm", "-journal", "-commit"].map(|suffix| format!("{}{suffix}", path.display()));
    let existed = sides
        .clone()
        .map(|side| std::path::Path::new(&side).exists());
    let err = match SqliteStore::open(path, SqliteOptions::default()).await {
        Ok(_) => panic!("{} was opened", path.display()),
        Err(e) => e,
    };
    assert!(matches!(err, StoreError::BadFile { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert_eq!(std::fs::read(path).unwrap(), before, "the file was changed");
    for (side, existed) in sides.iter().zip(existed) {
        assert!(
            existed || !std::path::Path::new(side).exists(),
            "{side} was created"
        );
    }
    text
}

#[tokio::test]
async fn a_file_that_is_not_sqlite_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    std::fs::write(&path, b"this is a text file, not a database\n".repeat(200)).unwrap();
    let text = refused(&path).await;
    assert!(text.contains("not an SQLite database"), "{text}");
}

#[tokio::test]
async fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('alice');")
            .unwrap();
    }
    let text = refused(&path).await;
    assert!(text.contains("another application"), "{text}");
}

#[tokio::test]
async fn a_corrupt_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    {
        let store = SqliteStore::open(&path, SqliteOptions::default())
            .await
            .unwrap();
        use datastore::contract::Datastore;
        for i in 0..300 {
            store
                .create(K, &format!("{i:04}"), vec![7u8; 512])
                .await
                .unwrap();
        }
    }
    // Fold the WAL into the main file, then damage pages past the header.
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;")
            .unwrap();
    }
    let mut bytes = std::fs::read(&path).unwrap();
    // Whole pages after the first (headers and cell pointers included), so the damage is
    // structural, not just unused space.
    assert!(
        bytes.len() > 6 * 4096,
        "store too small to damage: {}",
        bytes.len()
    );
    for b in &mut bytes[4096..5 * 4096] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let text = refused(&path).await;
    assert!(text.contains("not a usable margay datastore"), "{text}");
}

#[tokio::test]
async fn a_fresh_path_is_created_with_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/store.db");
    let store = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    use datastore::contract::{Atomic, Datastore};
    assert_eq!(store.describe(), format!("sqlite:{}", path.display()));
    assert_eq!(store.revision().await.unwrap().0, 0);
    drop(store);
    // And opens again as ours.
    SqliteStore::open(&path, SqliteOptions::default())
        .await
        .unwrap();
}

#[test]
fn many_processes_opening_a_fresh_file_at_once_all_succeed() {
    // Threads with their own runtimes stand in for processes: each opens its own connections.
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let threads: Vec<_> = (0..6)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    rt.block_on(SqliteStore::open(&path, SqliteOptions::default()))
                        .map(|_| ())
                })
            })
            .collect();
        for t in threads {
            t.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
}

/// Another process's write (here: another store on the same file, which shares nothing with
/// this one but the file) reaches a watch through inotify, long before the fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_by_another_store_is_seen_at_once() {
    use datastore::contract::Datastore;
    use datastore::sqlite::{FALLBACK_POLL, SqliteOptions, SqliteStore};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let watcher = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    let writer = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    let from = watcher.list(X, "").await.unwrap().version;
    let mut watch = watcher.watch(X, from).await.unwrap();
    for i in 0..3 {
        let start = std::time::Instant::now();
        writer
            .create(X, &format!("{i}"), b"v".to_vec())
            .await
            .unwrap();
        let e = tokio::time::timeout(FALLBACK_POLL / 10, watch.next())
            .await
            .expect("the write was not seen through inotify")
            .unwrap()
            .unwrap();
        assert_eq!(e.name, format!("{i}"));
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }
}

/// Opening a store that is already ours writes nothing to it: every process sharing the file
/// is woken by a write (inotify), so a commit per start costs a big lab quadratically.
#[tokio::test]
async fn opening_an_initialised_store_writes_nothing() {
    use datastore::contract::Datastore;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let wal = dir.path().join("store.db-wal");
    // The first store stays open, so its WAL is not checkpointed away meanwhile.
    let first = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    first.create(K, "a", b"1".to_vec()).await.unwrap();
    let before = (std::fs::read(&path).unwrap(), std::fs::read(&wal).unwrap());
    let second = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(second.get(K, "a").await.unwrap().unwrap().value, b"1");
    let after = (std::fs::read(&path).unwrap(), std::fs::read(&wal).unwrap());
    assert!(before.0 == after.0, "the database file was written");
    assert!(
        before.1 == after.1,
        "the WAL was written ({} -> {} bytes)",
        before.1.len(),
        after.1.len()
    );
    drop((first, second));
}
