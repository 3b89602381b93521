//! The embedded backend: one SQLite file (WAL mode) that several processes of one host share.
//!
//! Why this file is long: the backend's schema, transactions, watch log and cross-process
//! notification work on one connection pair and share its helpers.
//!
//! Layout: `kv` holds the current keys, `history` one row per change (the watch log), `meta`
//! the store revision and the compaction point. Every write is one `BEGIN IMMEDIATE`
//! transaction, so conditions are checked and writes made under SQLite's write lock, and a
//! process killed mid-transaction leaves nothing behind. Watchers read the history: at once
//! after a write of this process, and after another process's commit when it rings the
//! file's bell (see [`follow_file`]); a writer that does not ring it (killed between its
//! commit and the bell, or a margay before the bell) is seen at the fallback poll.
//!
//! The file is checked before anything is written to it: a file that is not SQLite, is
//! corrupt, or belongs to another application is refused with its name.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio::sync::{mpsc, watch};

use crate::contract::{
    Atomic, Event, KeyValue, Listing, Op, Read, ReadResult, Result, Revision, StoreError, Version,
    Watch, datastore_over_keys, prefix_end, validate_key, validate_ops,
};

/// `PRAGMA application_id` of a margay store ("MRGY").
const APPLICATION_ID: i64 = 0x4d52_4759;
/// Layout version of the tables; bumped with a migration when they change.
const LAYOUT_VERSION: i64 = 1;
/// Page cache of each connection, KiB (SQLite's default is 2000). The file is small and
/// the kernel's page cache holds it for every process anyway, where each connection's own
/// cache is private memory of every process (two connections per bgpd, N bgpd per host).
/// It is discarded whenever another process commits, which in a cluster is often: a large
/// one buys little. 256 KiB filled up in a 100-node lab (0.75 MiB per bgpd).
const CACHE_KIB: u32 = 64;
/// Above every printable-ASCII key: the upper bound of an unbounded prefix range.
const KEY_MAX: &str = "\u{7f}";

/// How the file is synced to disk on commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sync {
    /// Every commit is on disk before it is acknowledged (survives power loss).
    #[default]
    Full,
    /// Commits survive a process crash, not necessarily a power loss; faster.
    Normal,
}

#[derive(Debug, Clone)]
pub struct SqliteOptions {
    pub sync: Sync,
    /// Revisions of history kept for watchers; older ones are compacted automatically.
    pub history: u64,
    /// How often watchers look for other processes' writes where inotify cannot tell them
    /// (with inotify they look when the file changes, and every [`FALLBACK_POLL`] anyway).
    /// Each look is a query: at 5 ms an idle process used about 1 % of a core per watch.
    pub poll_interval: Duration,
    /// How long a writer waits for another process's write lock before giving up.
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            sync: Sync::Full,
            history: 10_000,
            poll_interval: Duration::from_millis(50),
            busy_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    options: SqliteOptions,
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
    /// The latest revision written by this process, to wake this process's watchers.
    written: watch::Sender<Revision>,
    /// Bumped when another process rang the bell after a commit (inotify); `None` where
    /// inotify is unavailable, and watchers poll.
    external: Option<watch::Receiver<u64>>,
    /// Written after each of this process's commits (see [`follow_file`]); `None` where it
    /// cannot be opened (then other processes see this one's writes at their fallback poll).
    bell: Option<std::fs::File>,
    _follower: Option<FileFollower>,
}

/// With inotify, watchers still look this often (a change inotify did not report, e.g. on
/// a network file system, is seen this late at worst). Every look wakes an idle process and
/// reads the file, so it is rare: inotify is what makes changes seen at once.
pub const FALLBACK_POLL: Duration = Duration::from_secs(30);

/// The bell: a file beside the database (`store.db-commit`) that every process writes to
/// after each of its commits, and that every process follows through inotify.
///
/// Following the WAL itself (as before) told of a commit while it was being written, before
/// it was published in the WAL index (shared memory, which inotify does not see): a look
/// right after the report could find nothing, so each report was looked at six more times,
/// 1 ms to 1 s later, in every process sharing the file, and each of a commit's writes woke
/// every process's follower. At 100 bgpds on one file that was most of the CPU one new block
/// cost. The bell rings once per commit, after the commit is visible: one look finds it.
fn bell_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-commit");
    PathBuf::from(name)
}

/// Opens the bell for writing, creating it.
fn open_bell(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(bell_path(path))
}

/// Rings the bell after a commit of `rev`. A failure costs only latency (others see the
/// commit at their fallback poll), so it is logged, not returned: the commit stands.
fn ring(bell: &std::fs::File, rev: Revision) {
    use std::os::unix::fs::FileExt;
    if let Err(e) = bell.write_at(&rev.0.to_le_bytes(), 0) {
        tracing::warn!(error = %e, "cannot ring the datastore's bell; other processes see this write late");
    }
}

/// Follows the bell through inotify (see [`bell_path`]). Idle watchers then cost nothing,
/// where polling every few milliseconds costs every process CPU all the time. A thread of
/// its own (any runtime, even one without I/O, can open a store), ended when the store is.
fn follow_file(path: &Path) -> std::io::Result<(watch::Receiver<u64>, FileFollower)> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let bell = bell_path(path);
    let cbell = std::ffi::CString::new(bell.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    // SAFETY: a plain syscall; the descriptor is owned right away.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `cbell` is a valid NUL-terminated path for the call's duration.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), cbell.as_ptr(), libc::IN_MODIFY) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Dropping the store writes to this eventfd to end the thread, which otherwise sleeps in
    // poll(2) without a timeout: an idle process is not woken until the bell rings.
    // SAFETY: a plain syscall; the descriptor is owned right away.
    let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if stop < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `stop` is a fresh descriptor nobody else owns.
    let stop = Arc::new(unsafe { OwnedFd::from_raw_fd(stop) });
    let stopping = stop.clone();
    let (tx, rx) = watch::channel(0u64);
    std::thread::Builder::new()
        .name("sqlite-inotify".into())
        .spawn(move || {
            let mut buf = vec![0u8; 4096];
            loop {
                let mut pfds = [
                    libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: stopping.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: two valid pollfds, for the call's duration.
                if unsafe { libc::poll(pfds.as_mut_ptr(), 2, -1) } <= 0 {
                    continue;
                }
                if pfds[1].revents != 0 {
                    return;
                }
                // Every event is of the bell: what they say does not matter, only that
                // there were some (many rings read at once are one look).
                // SAFETY: reads into our buffer, at most its length.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n > 0 {
                    tx.send_modify(|v| *v = v.wrapping_add(1));
                }
            }
        })?;
    Ok((rx, FileFollower { stop }))
}

/// Ends the inotify thread when dropped.
struct FileFollower {
    stop: Arc<std::os::fd::OwnedFd>,
}

impl Drop for FileFollower {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd. If it fails (it cannot
        // overflow with one write), the thread lives on with the process; nothing else.
        unsafe { libc::write(self.stop.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}

fn backend(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            StoreError::Unavailable(format!("the SQLite file is locked by another process: {e}"))
        }
        // A full file system clears up when someone frees space: callers may try again (the
        // transaction was rolled back, nothing of it is stored).
        Some(ErrorCode::DiskFull) => StoreError::Unavailable(format!(
            "the SQLite file's file system is full; free space on it: {e}"
        )),
        _ => StoreError::Backend(e.to_string()),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Backend(format!("datastore task failed: {e}")))?
}

impl SqliteStore {
    /// Opens (or creates) the store at `path`.
    pub async fn open(path: impl Into<PathBuf>, options: SqliteOptions) -> Result<Self> {
        let path = path.into();
        let (writer, reader) = {
            let path = path.clone();
            let options = options.clone();
            blocking(move || {
                let writer = open_connection(&path, &options, true)?;
                let reader = open_connection(&path, &options, false)?;
                Ok((writer, reader))
            })
            .await?
        };
        let current = read_revision(&reader).map_err(backend)?;
        let (written, _) = watch::channel(current);
        // The bell first: following it needs it to exist.
        let bell = open_bell(&path)
            .inspect_err(|e| {
                tracing::warn!(
                    path = %bell_path(&path).display(),
                    error = %e,
                    "cannot open the datastore's bell; other processes see this one's writes \
                     at their fallback poll, and this one polls"
                );
            })
            .ok();
        let follow = match &bell {
            Some(_) => follow_file(&path),
            None => Err(std::io::Error::other("no bell to follow")),
        };
        let (external, follower) = match follow {
            Ok((rx, f)) => (Some(rx), Some(f)),
            Err(e) => {
                // Too many processes of this user following files (fs.inotify.max_user_instances,
                // 128 by default) is the usual reason on a host running many daemons.
                tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    every = ?options.poll_interval,
                    "cannot follow the datastore file with inotify; polling it instead \
                     (raise fs.inotify.max_user_instances if the limit was reached)"
                );
                (None, None)
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                options,
                writer: Mutex::new(writer),
                reader: Mutex::new(reader),
                written,
                external,
                bell,
                _follower: follower,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn with_reader<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        blocking(move || {
            let mut conn = inner.reader.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn).map_err(backend)
        })
        .await
    }
}

/// Opens one connection, checking the file before writing anything to it.
fn open_connection(path: &Path, options: &SqliteOptions, init: bool) -> Result<Connection> {
    let bad = |reason: String| StoreError::BadFile {
        path: path.display().to_string(),
        reason,
    };
    check_header(path).map_err(bad)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| bad(format!("cannot create {}: {e}", dir.display())))?;
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| bad(e.to_string()))?;
    conn.busy_timeout(options.busy_timeout).map_err(backend)?;
    // Many processes opening one file together (a 150-node lab) meet locks SQLite does not
    // wait for (WAL recovery, the switch to WAL): every step retries within the busy timeout.
    let deadline = std::time::Instant::now() + options.busy_timeout;

    // Read-only checks first: nothing is written to a file that is not ours. One statement,
    // so both values are of one moment: another process may be initialising the file.
    let (app_id, tables): (i64, i64) = retry_busy(deadline, || {
        conn.query_row(
            "SELECT (SELECT application_id FROM pragma_application_id()), \
                    (SELECT count(*) FROM sqlite_master)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    })
    .map_err(|e| bad(e.to_string()))?;
    let fresh = app_id == 0 && tables == 0;
    if !fresh && app_id != APPLICATION_ID {
        return Err(bad(format!(
            "an SQLite database of another application (application_id {app_id:#x}, {tables} tables)"
        )));
    }
    // The integrity check reads the whole file: once per process, on the writer connection
    // (opened first); the reader opens a file already checked.
    // A hundred nodes sharing one file each checking it three times was most of their start.
    if !fresh && init {
        let check: String = retry_busy(deadline, || {
            conn.query_row("PRAGMA quick_check", [], |r| r.get(0))
        })
        .map_err(|e| bad(e.to_string()))?;
        if check != "ok" {
            return Err(bad(format!("integrity check failed: {check}")));
        }
    }

    // Switching a fresh file to WAL takes an exclusive lock that SQLite does not wait for.
    let mode: String = retry_busy(deadline, || {
        conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
    })
    .map_err(|e| bad(e.to_string()))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(bad(format!("cannot switch to WAL mode (got {mode})")));
    }
    let sync = match options.sync {
        Sync::Full => "FULL",
        Sync::Normal => "NORMAL",
    };
    retry_busy(deadline, || {
        conn.execute_batch(&format!(
            "PRAGMA synchronous={sync}; PRAGMA foreign_keys=OFF; PRAGMA cache_size=-{CACHE_KIB};"
        ))
    })
    .map_err(backend)?;
    // A file already ours is not written to: the tables and the application id are set in
    // one transaction, so the id says the tables are there. Writing them again (the id
    // rewrites page 1 even when unchanged) was a commit per process start, and every other
    // process sharing the file looked at it again for each one: quadratic in a big lab.
    if init && app_id != APPLICATION_ID {
        retry_busy(deadline, || {
            initialise(&conn).inspect_err(|_| {
                // A statement after BEGIN failed: end that transaction before trying again.
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
            })
        })
        .map_err(|e| bad(e.to_string()))?;
    }
    let layout: Option<i64> = retry_busy(deadline, || {
        conn.query_row("SELECT value FROM meta WHERE name = 'layout'", [], |r| {
            r.get(0)
        })
        .optional()
    })
    .map_err(|e| bad(e.to_string()))?;
    match layout {
        Some(LAYOUT_VERSION) => Ok(conn),
        Some(v) => Err(bad(format!(
            "written by a margay with store layout {v}; this one knows layout {LAYOUT_VERSION}"
        ))),
        None => Err(bad("no layout version recorded".into())),
    }
}

/// Runs `f` again while SQLite reports the file busy or locked, until `deadline`.
fn retry_busy<T>(
    deadline: std::time::Instant,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    use rusqlite::ErrorCode;
    loop {
        match f() {
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// A non-empty file must start with SQLite's magic header.
fn check_header(path: &Path) -> std::result::Result<(), String> {
    use std::io::Read;
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    let mut header = [0u8; 16];
    let n = file.read(&mut header).map_err(|e| e.to_string())?;
    if n == 0 || &header[..n] == b"SQLite format 3\0" {
        Ok(())
    } else {
        Err("not an SQLite database (wrong file header)".into())
    }
}

/// Creates the tables in a fresh file; a no-op when another process got there first.
fn initialise(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         CREATE TABLE IF NOT EXISTS kv (
             key TEXT PRIMARY KEY NOT NULL,
             value BLOB NOT NULL,
             create_rev INTEGER NOT NULL,
             mod_rev INTEGER NOT NULL
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS history (
             rev INTEGER NOT NULL,
             idx INTEGER NOT NULL,
             key TEXT NOT NULL,
             value BLOB,
             PRIMARY KEY (rev, idx)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);
         INSERT OR IGNORE INTO meta VALUES ('revision', 0), ('compacted', 0), ('layout', {LAYOUT_VERSION});
         PRAGMA application_id = {APPLICATION_ID};
         COMMIT;"
    ))
}

fn read_meta(conn: &Connection, name: &str) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT value FROM meta WHERE name = ?1")?
        .query_row([name], |r| r.get::<_, i64>(0))
        .map(|v| v as u64)
}

fn read_revision(conn: &Connection) -> rusqlite::Result<Revision> {
    read_meta(conn, "revision").map(Revision)
}

fn row_to_kv(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyValue> {
    Ok(KeyValue {
        key: r.get(0)?,
        value: r.get(1)?,
        version: Version::of_revision(Revision(r.get::<_, i64>(3)? as u64)),
    })
}

/// The conditional writes of one transaction, under SQLite's write lock.
fn apply_txn(conn: &mut Connection, ops: &[Op], history: u64) -> Result<(Revision, bool)> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(backend)?;
    let current = read_revision(&tx).map_err(backend)?;
    {
        let mut get = tx
            .prepare_cached("SELECT mod_rev FROM kv WHERE key = ?1")
            .map_err(backend)?;
        for op in ops {
            let actual = get
                .query_row([op.key()], |r| r.get::<_, i64>(0))
                .optional()
                .map_err(backend)?
                .map(|v| Version::of_revision(Revision(v as u64)));
            if actual != op.expected() {
                return Err(StoreError::Conflict {
                    key: op.key().to_owned(),
                    expected: op.expected(),
                    actual,
                });
            }
        }
    }
    if ops.iter().all(|op| matches!(op, Op::Check { .. })) {
        return Ok((current, false));
    }
    let rev = current.0 + 1;
    let new = rev as i64;
    {
        let mut insert = tx
            .prepare_cached(
                "INSERT INTO kv (key, value, create_rev, mod_rev) VALUES (?1, ?2, ?3, ?3)",
            )
            .map_err(backend)?;
        let mut update = tx
            .prepare_cached("UPDATE kv SET value = ?2, mod_rev = ?3 WHERE key = ?1")
            .map_err(backend)?;
        let mut delete = tx
            .prepare_cached("DELETE FROM kv WHERE key = ?1")
            .map_err(backend)?;
        let mut log = tx
            .prepare_cached("INSERT INTO history (rev, idx, key, value) VALUES (?1, ?2, ?3, ?4)")
            .map_err(backend)?;
        let mut idx = 0i64;
        for op in ops {
            let value = match op {
                Op::Create { key, value } => {
                    insert.execute(params![key, value, new]).map_err(backend)?;
                    Some(value)
                }
                Op::Update { key, value, .. } => {
                    update.execute(params![key, value, new]).map_err(backend)?;
                    Some(value)
                }
                Op::Delete { key, .. } => {
                    delete.execute([key]).map_err(backend)?;
                    None
                }
                Op::Check { .. } => continue,
            };
            log.execute(params![new, idx, op.key(), value])
                .map_err(backend)?;
            idx += 1;
        }
        tx.prepare_cached("UPDATE meta SET value = ?1 WHERE name = 'revision'")
            .map_err(backend)?
            .execute([new])
            .map_err(backend)?;
        // Trim the watch log in steps, not on every write.
        if rev % 256 == 0 && rev > history {
            compact_in(&tx, Revision(rev - history)).map_err(backend)?;
        }
    }
    tx.commit().map_err(backend)?;
    Ok((Revision(rev), true))
}

fn compact_in(conn: &Connection, upto: Revision) -> rusqlite::Result<()> {
    let compacted = read_meta(conn, "compacted")?;
    if upto.0 <= compacted {
        return Ok(());
    }
    conn.execute("DELETE FROM history WHERE rev <= ?1", [upto.0 as i64])?;
    conn.execute(
        "UPDATE meta SET value = ?1 WHERE name = 'compacted'",
        [upto.0 as i64],
    )?;
    Ok(())
}

/// One poll of the history: the changes in (after, upto] under the prefix.
fn read_changes(
    conn: &mut Connection,
    prefix: &str,
    end: &str,
    after: Revision,
) -> Result<(Vec<Event>, Revision)> {
    // Many looks find nothing (a process hears its own bell, and a look after another's
    // commit may already have been made by a look before it): the revision alone, without
    // a transaction, says so. A compaction past `after` needs a newer revision, so the check below still runs
    // whenever it could fail.
    if read_revision(conn).map_err(backend)? <= after {
        return Ok((Vec::new(), after));
    }
    let tx = conn.transaction().map_err(backend)?;
    let compacted = read_meta(&tx, "compacted").map_err(backend)?;
    if after.0 < compacted {
        return Err(StoreError::too_old(after, Revision(compacted)));
    }
    let upto = read_revision(&tx).map_err(backend)?;
    if upto <= after {
        return Ok((Vec::new(), after));
    }
    let mut stmt = tx
        .prepare_cached(
            "SELECT rev, key, value FROM history
             WHERE rev > ?1 AND rev <= ?2 AND key >= ?3 AND key < ?4 ORDER BY rev, idx",
        )
        .map_err(backend)?;
    let events = stmt
        .query_map(params![after.0 as i64, upto.0 as i64, prefix, end], |r| {
            Ok(Event {
                revision: Revision(r.get::<_, i64>(0)? as u64),
                key: r.get(1)?,
                value: r.get(2)?,
            })
        })
        .map_err(backend)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend)?;
    Ok((events, upto))
}

datastore_over_keys!(SqliteStore);

impl Atomic for SqliteStore {
    async fn get_key(&self, key: &str) -> Result<Option<KeyValue>> {
        validate_key(key)?;
        let key = key.to_owned();
        self.with_reader(move |conn| {
            conn.prepare_cached("SELECT key, value, create_rev, mod_rev FROM kv WHERE key = ?1")?
                .query_row([key], row_to_kv)
                .optional()
        })
        .await
    }

    async fn list_keys(&self, prefix: &str) -> Result<Listing> {
        let start = prefix.to_owned();
        let end = prefix_end(prefix).unwrap_or_else(|| KEY_MAX.to_owned());
        self.with_reader(move |conn| {
            // One read transaction: the items and the revision are of the same moment.
            let tx = conn.transaction()?;
            let revision = read_revision(&tx)?;
            let items = tx
                .prepare_cached(
                    "SELECT key, value, create_rev, mod_rev FROM kv
                     WHERE key >= ?1 AND key < ?2 ORDER BY key",
                )?
                .query_map([start, end], row_to_kv)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Listing { items, revision })
        })
        .await
    }

    async fn read(&self, reads: Vec<Read>) -> Result<(Vec<ReadResult>, Revision)> {
        for r in &reads {
            if let Read::Get(key) = r {
                validate_key(key)?;
            }
        }
        self.with_reader(move |conn| {
            let tx = conn.transaction()?;
            let revision = read_revision(&tx)?;
            let mut out = Vec::with_capacity(reads.len());
            for r in reads {
                out.push(match r {
                    Read::Get(key) => ReadResult::Get(
                        tx.prepare_cached(
                            "SELECT key, value, create_rev, mod_rev FROM kv WHERE key = ?1",
                        )?
                        .query_row([key], row_to_kv)
                        .optional()?,
                    ),
                    Read::List(prefix) => {
                        let end = prefix_end(&prefix).unwrap_or_else(|| KEY_MAX.to_owned());
                        ReadResult::List(
                            tx.prepare_cached(
                                "SELECT key, value, create_rev, mod_rev FROM kv
                                 WHERE key >= ?1 AND key < ?2 ORDER BY key",
                            )?
                            .query_map([prefix, end], row_to_kv)?
                            .collect::<rusqlite::Result<Vec<_>>>()?,
                        )
                    }
                });
            }
            Ok((out, revision))
        })
        .await
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Revision> {
        validate_ops(&ops)?;
        let inner = self.inner.clone();
        let (rev, wrote) = blocking(move || {
            let mut conn = inner.writer.lock().unwrap_or_else(|p| p.into_inner());
            let (rev, wrote) = apply_txn(&mut conn, &ops, inner.options.history)?;
            if let (true, Some(bell)) = (wrote, &inner.bell) {
                ring(bell, rev);
            }
            Ok((rev, wrote))
        })
        .await?;
        if wrote {
            self.inner.written.send_if_modified(|r| {
                let newer = rev > *r;
                if newer {
                    *r = rev;
                }
                newer
            });
        }
        Ok(rev)
    }

    async fn watch_keys(&self, prefix: &str, after: Revision) -> Result<Watch> {
        // Watches read through the shared reader connection: each look is one short read
        // transaction, and a connection of its own cost ~150 KiB of SQLite heap (schema,
        // statements, page cache, lookaside) per watch for as long as it ran.
        let inner = self.inner.clone();
        let prefix = prefix.to_owned();
        let end = prefix_end(&prefix).unwrap_or_else(|| KEY_MAX.to_owned());

        // Fail now, not in the stream, when the start is already compacted.
        let first = {
            let (inner, prefix, end) = (inner.clone(), prefix.clone(), end.clone());
            blocking(move || {
                let mut c = inner.reader.lock().unwrap_or_else(|p| p.into_inner());
                read_changes(&mut c, &prefix, &end, after)
            })
            .await?
        };
        let (tx, rx) = mpsc::channel(Watch::DEPTH);
        let mut local = self.inner.written.subscribe();
        let mut external = self.inner.external.clone();
        let poll = if external.is_some() {
            FALLBACK_POLL
        } else {
            self.inner.options.poll_interval
        };
        let task = tokio::spawn(async move {
            let (mut events, mut last) = first;
            loop {
                for e in events.drain(..) {
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    _ = local.changed() => {}
                    Ok(()) = async {
                        match external.as_mut() {
                            Some(e) => e.changed().await,
                            None => std::future::pending().await,
                        }
                    } => {}
                    _ = tokio::time::sleep(poll) => {}
                    _ = tx.closed() => return,
                }
                let (inner, prefix, end) = (inner.clone(), prefix.clone(), end.clone());
                let next = blocking(move || {
                    let mut c = inner.reader.lock().unwrap_or_else(|p| p.into_inner());
                    read_changes(&mut c, &prefix, &end, last)
                })
                .await;
                match next {
                    Ok((e, upto)) => (events, last) = (e, upto),
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
        Ok(Watch::new(rx, task))
    }

    async fn revision(&self) -> Result<Revision> {
        self.with_reader(|conn| read_revision(conn)).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let inner = self.inner.clone();
        blocking(move || {
            let mut conn = inner.writer.lock().unwrap_or_else(|p| p.into_inner());
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            let current = read_revision(&tx).map_err(backend)?;
            compact_in(&tx, revision.min(current)).map_err(backend)?;
            tx.commit().map_err(backend)
        })
        .await
    }
}

impl SqliteStore {
    fn describe_backend(&self) -> String {
        format!("sqlite:{}", self.inner.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_unavailable_for_now_not_a_broken_backend() {
        let sqlite = |code, extended| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error {
                    code,
                    extended_code: extended,
                },
                None,
            )
        };
        let full = backend(sqlite(
            rusqlite::ErrorCode::DiskFull,
            rusqlite::ffi::SQLITE_FULL,
        ));
        assert!(
            matches!(&full, StoreError::Unavailable(m) if m.contains("file system is full")),
            "{full:?}"
        );
        let corrupt = backend(sqlite(
            rusqlite::ErrorCode::DatabaseCorrupt,
            rusqlite::ffi::SQLITE_CORRUPT,
        ));
        assert!(matches!(corrupt, StoreError::Backend(_)), "{corrupt:?}");
    }
}
