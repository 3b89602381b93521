//! The datastore contract: a key-value store versioned like etcd's. Every write bumps one
//! store-wide revision and every key carries the revision of its last change, so every write
//! can be conditional on what the writer read (compare-and-swap), and a watcher can follow all
//! changes after a revision, in order, resuming where it left off.
//!
//! Two backends implement it: [`sqlite::SqliteStore`] (one file shared by the processes of a
//! host) and [`etcd::EtcdStore`]. [`Store`] picks one at run time from the configuration.
//! Values are opaque bytes here; `crate::resource` gives them types.

pub mod etcd;
pub mod sqlite;

use std::fmt;
use std::future::Future;

use tokio::sync::mpsc;

/// A store-wide revision: the count of write transactions so far. Zero is "before anything".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One key as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision of the key's last change; the one to pass to `update` / `delete`.
    pub mod_revision: Revision,
    /// The revision at which the key was created.
    pub create_revision: Revision,
}

/// The result of `list`: the keys under a prefix, sorted, and the revision they were read at.
/// Watching from `revision` afterwards misses nothing and repeats nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub items: Vec<KeyValue>,
    pub revision: Revision,
}

/// One read of a consistent multi-read (`Datastore::read`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Get(String),
    /// Every key under the prefix, sorted. For small prefixes: large ones take `list`.
    List(String),
}

/// The answer to one `Read`, in the same position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadResult {
    Get(Option<KeyValue>),
    List(Vec<KeyValue>),
}

impl ReadResult {
    /// The key of a `Get`; `None` for a missing key or a `List`.
    pub fn into_get(self) -> Option<KeyValue> {
        match self {
            ReadResult::Get(kv) => kv,
            ReadResult::List(_) => None,
        }
    }

    /// The keys of a `List`; empty for a `Get`.
    pub fn into_list(self) -> Vec<KeyValue> {
        match self {
            ReadResult::List(kvs) => kvs,
            ReadResult::Get(_) => Vec::new(),
        }
    }
}

/// One conditional write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Fails if the key exists.
    Create { key: String, value: Vec<u8> },
    /// Fails unless the key exists with this mod revision.
    Update {
        key: String,
        value: Vec<u8>,
        expected: Revision,
    },
    /// Fails unless the key exists with this mod revision.
    Delete { key: String, expected: Revision },
    /// Writes nothing; fails unless the key is at this revision (`None`: does not exist).
    Check {
        key: String,
        expected: Option<Revision>,
    },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. }
            | Op::Update { key, .. }
            | Op::Delete { key, .. }
            | Op::Check { key, .. } => key,
        }
    }

    /// The revision the key must have for the op to go ahead (`None`: must not exist).
    pub fn expected(&self) -> Option<Revision> {
        match self {
            Op::Create { .. } => None,
            Op::Update { expected, .. } | Op::Delete { expected, .. } => Some(*expected),
            Op::Check { expected, .. } => *expected,
        }
    }
}

/// A change seen by a watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub key: String,
    /// The new value; `None` when the key was deleted.
    pub value: Option<Vec<u8>>,
    /// The revision of the change.
    pub revision: Revision,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A conditional write lost: the key is not at the revision the writer read.
    /// Re-read the key and decide again.
    #[error("{key} was changed by someone else (expected {}, found {}); re-read and retry",
        describe_rev(*.expected), describe_rev(*.actual))]
    Conflict {
        key: String,
        expected: Option<Revision>,
        actual: Option<Revision>,
    },
    /// The changes after `requested` are no longer kept.
    #[error(
        "the history after revision {requested} was compacted (kept from {compacted}); re-list and watch from the listing's revision"
    )]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    #[error("datastore unavailable: {0}")]
    Unavailable(String),
    /// The file is not a usable SQLite database. Nothing was written to it.
    #[error(
        "{path} is not a usable margay datastore: {reason}; nothing was written to it (move it away or set datastore.path)"
    )]
    BadFile { path: String, reason: String },
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("a transaction may hold at most {max} operations")]
    TxnTooLarge { max: usize },
    #[error("{key} appears twice in one transaction")]
    DuplicateKey { key: String },
    #[error("datastore error: {0}")]
    Backend(String),
}

fn describe_rev(r: Option<Revision>) -> String {
    match r {
        Some(r) => format!("revision {r}"),
        None => "no key".into(),
    }
}

impl StoreError {
    /// Whether retrying the same operation later may succeed without re-reading.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The most operations in one transaction (etcd's default limit is 128).
pub const MAX_TXN_OPS: usize = 128;

/// The changes after a revision, in order; ends with `Err` when the watch can go no further
/// (compacted history, lost connection). To resume, watch again from the last revision seen.
pub struct Watch {
    rx: mpsc::Receiver<Result<Event>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Depth of the channel between the backend's task and the watcher: a slow watcher holds
    /// the task back instead of growing memory.
    pub const DEPTH: usize = 1024;

    fn new(rx: mpsc::Receiver<Result<Event>>, task: tokio::task::JoinHandle<()>) -> Self {
        Self { rx, task }
    }

    /// The next change; `None` only if the backend stopped without saying why.
    pub async fn next(&mut self) -> Option<Result<Event>> {
        self.rx.recv().await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The datastore contract both backends implement.
pub trait Datastore: Send + Sync + 'static {
    /// The key, if it exists.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>>> + Send;
    /// Every key starting with `prefix`, sorted, with the revision of the read.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Listing>> + Send;
    /// Several reads at one revision, in one round trip; answers in the order asked.
    fn read(
        &self,
        reads: Vec<Read>,
    ) -> impl Future<Output = Result<(Vec<ReadResult>, Revision)>> + Send;
    /// All the ops or none; returns the revision of the writes (the current revision if the
    /// transaction only checks). The first op whose condition fails is reported as `Conflict`.
    fn txn(&self, ops: Vec<Op>) -> impl Future<Output = Result<Revision>> + Send;
    /// The changes to keys under `prefix` after revision `after`.
    fn watch(&self, prefix: &str, after: Revision) -> impl Future<Output = Result<Watch>> + Send;
    /// The store's current revision.
    fn revision(&self) -> impl Future<Output = Result<Revision>> + Send;
    /// Forgets the history up to and including `revision`; watches from before it fail.
    fn compact(&self, revision: Revision) -> impl Future<Output = Result<()>> + Send;
    /// e.g. "sqlite:/var/lib/margay/store.db".
    fn describe(&self) -> String;

    fn create(&self, key: &str, value: Vec<u8>) -> impl Future<Output = Result<Revision>> + Send {
        self.txn(vec![Op::Create {
            key: key.to_owned(),
            value,
        }])
    }

    fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> impl Future<Output = Result<Revision>> + Send {
        self.txn(vec![Op::Update {
            key: key.to_owned(),
            value,
            expected,
        }])
    }

    fn delete(
        &self,
        key: &str,
        expected: Revision,
    ) -> impl Future<Output = Result<Revision>> + Send {
        self.txn(vec![Op::Delete {
            key: key.to_owned(),
            expected,
        }])
    }
}

/// Checks what both backends require of keys and transactions.
fn validate_ops(ops: &[Op]) -> Result<()> {
    if ops.len() > MAX_TXN_OPS {
        return Err(StoreError::TxnTooLarge { max: MAX_TXN_OPS });
    }
    let mut keys: Vec<&str> = ops.iter().map(Op::key).collect();
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(StoreError::DuplicateKey {
            key: w[0].to_owned(),
        });
    }
    for key in keys {
        validate_key(key)?;
    }
    Ok(())
}

fn validate_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "empty"
    } else if key.len() > 1024 {
        "longer than 1024 bytes"
    } else if !key.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        "only printable ASCII is allowed"
    } else {
        return Ok(());
    };
    Err(StoreError::InvalidKey {
        key: key.chars().take(80).collect(),
        reason,
    })
}

/// The smallest string greater than every string starting with `prefix` (`None`: no bound).
/// Keys are printable ASCII, so incrementing the last byte is enough.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

/// The backend chosen by configuration.
#[derive(Clone)]
pub enum Store {
    Sqlite(sqlite::SqliteStore),
    Etcd(etcd::EtcdStore),
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            Store::Sqlite($s) => $e,
            Store::Etcd($s) => $e,
        }
    };
}

impl Datastore for Store {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        dispatch!(self, s => s.get(key).await)
    }
    async fn list(&self, prefix: &str) -> Result<Listing> {
        dispatch!(self, s => s.list(prefix).await)
    }
    async fn read(&self, reads: Vec<Read>) -> Result<(Vec<ReadResult>, Revision)> {
        dispatch!(self, s => s.read(reads).await)
    }
    async fn txn(&self, ops: Vec<Op>) -> Result<Revision> {
        dispatch!(self, s => s.txn(ops).await)
    }
    async fn watch(&self, prefix: &str, after: Revision) -> Result<Watch> {
        dispatch!(self, s => s.watch(prefix, after).await)
    }
    async fn revision(&self) -> Result<Revision> {
        dispatch!(self, s => s.revision().await)
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        dispatch!(self, s => s.compact(revision).await)
    }
    fn describe(&self) -> String {
        dispatch!(self, s => s.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/a/"), Some("/a0".into()));
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("a~"), Some("a\u{7f}".into()));
    }

    #[test]
    fn ops_are_validated() {
        let op = |k: &str| Op::Check {
            key: k.into(),
            expected: None,
        };
        assert!(validate_ops(&[op("a"), op("b")]).is_ok());
        assert!(matches!(
            validate_ops(&[op("a"), op("a")]),
            Err(StoreError::DuplicateKey { .. })
        ));
        assert!(matches!(
            validate_ops(&[op("")]),
            Err(StoreError::InvalidKey { .. })
        ));
        let many: Vec<Op> = (0..=MAX_TXN_OPS).map(|i| op(&i.to_string())).collect();
        assert!(validate_ops(&many).is_err());
    }
}
