//! The datastore contract, in two layers, after Calico's `libcalico-go/lib/backend/api`:
//!
//! - [`Datastore`], the core every backend keeps: objects of one kind at a time, each with an
//!   opaque [`Version`]; get, list, create, update and delete compare-and-swap on that
//!   version, and a watch of one kind from a list's version that ends with
//!   [`StoreError::TooOld`] ("list again") when the backend no longer keeps that history.
//!   The Kubernetes API offers exactly this, and so do SQLite and etcd.
//! - [`Atomic`], an optional extension of stores that version every key with one store-wide
//!   [`Revision`]: transactions over several keys, reads of several keys at one revision,
//!   watches of a whole prefix, compaction. SQLite and etcd have it; only the allocator's
//!   optimisations use it, through [`Datastore::atomic`], and IPAM is correct without it.
//!
//! In the key-value backends an object of kind `k` named `n` is the key `k.prefix + n`, and
//! its version is the key's mod revision. `crate::store::Store` picks a backend at run time,
//! and `Store::per_object` hides its extension (bgpd's `datastore.transactions = false`, and
//! the tests that run the per-object paths on real SQLite and etcd).
//!
//! Why this file is long: the two layers of the contract and their types belong together;
//! the core over a key-value store (`over_keys`) is the bridge between them.

use std::fmt;
use std::future::Future;

use tokio::sync::mpsc;

/// A kind of object: its name (in messages) and where the key-value backends keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kind {
    /// e.g. "IPPool".
    pub name: &'static str,
    /// e.g. "/margay/v1/ippools/": an object's key is this followed by its name.
    pub prefix: &'static str,
}

impl Kind {
    pub const fn new(name: &'static str, prefix: &'static str) -> Self {
        Kind { name, prefix }
    }

    /// The key of the object `name` in a key-value backend.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The object's name, if `key` is of this kind.
    pub fn name_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.prefix)
    }
}

/// An object's version as its backend issued it: compare it for equality and hand it back,
/// nothing else (the Kubernetes API's `resourceVersion` is opaque the same way). It crosses
/// the gRPC API as a number ([`Version::to_wire`]): the key-value backends' revisions are
/// numbers, and so are the resourceVersions of every etcd-backed apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version(u64);

impl Version {
    /// The version as the gRPC API carries it.
    pub fn to_wire(self) -> u64 {
        self.0
    }

    /// A version the gRPC API carried back (from [`Version::to_wire`]).
    pub fn from_wire(wire: u64) -> Self {
        Version(wire)
    }

    /// The key-value backends' version of a key last changed at `revision`.
    pub(crate) fn of_revision(revision: Revision) -> Self {
        Version(revision.0)
    }

    /// The store-wide revision a key-value backend's version stands for.
    pub(crate) fn revision(self) -> Revision {
        Revision(self.0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One object as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub name: String,
    pub value: Vec<u8>,
    /// The version to pass to `update` / `delete`.
    pub version: Version,
}

/// The result of [`Datastore::list`]: the objects, sorted by name, and the version to watch
/// from so that nothing is missed and nothing repeated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectList {
    pub items: Vec<Object>,
    pub version: Version,
}

/// A change of one object seen by a watch of its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectEvent {
    pub name: String,
    /// The new value; `None` when the object was deleted.
    pub value: Option<Vec<u8>>,
    /// The version of the change: a watch started again from it misses nothing after it.
    pub version: Version,
}

/// A store-wide revision of an [`Atomic`] store: the count of write transactions so far.
/// Zero is "before anything".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

impl Revision {
    /// The version of each key that the transaction of this revision wrote (in an
    /// [`Atomic`] store a key's version is the revision of its last write).
    pub fn version(self) -> Version {
        Version::of_revision(self)
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One key as an [`Atomic`] store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The key's version (its last change); the one a conditional op expects.
    pub version: Version,
}

/// The result of [`Atomic::list_keys`]: the keys under a prefix, sorted, and the revision
/// they were read at. Watching from `revision` afterwards misses nothing and repeats nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub items: Vec<KeyValue>,
    pub revision: Revision,
}

/// One read of a consistent multi-read ([`Atomic::read`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    Get(String),
    /// Every key under the prefix, sorted. For small prefixes: large ones take `list_keys`.
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

/// One conditional write of an [`Atomic::txn`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Fails if the key exists.
    Create { key: String, value: Vec<u8> },
    /// Fails unless the key exists at this version.
    Update {
        key: String,
        value: Vec<u8>,
        expected: Version,
    },
    /// Fails unless the key exists at this version.
    Delete { key: String, expected: Version },
    /// Writes nothing; fails unless the key is at this version (`None`: does not exist).
    Check {
        key: String,
        expected: Option<Version>,
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

    /// The version the key must have for the op to go ahead (`None`: must not exist).
    pub fn expected(&self) -> Option<Version> {
        match self {
            Op::Create { .. } => None,
            Op::Update { expected, .. } | Op::Delete { expected, .. } => Some(*expected),
            Op::Check { expected, .. } => *expected,
        }
    }
}

/// A change seen by an [`Atomic::watch_keys`].
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
    /// A conditional write lost: the object is not at the version the writer read.
    /// Re-read it and decide again.
    #[error("{key} was changed by someone else (expected {}, found {}); re-read and retry",
        describe_version(*.expected), describe_version(*.actual))]
    Conflict {
        key: String,
        expected: Option<Version>,
        actual: Option<Version>,
    },
    /// A watch asked for changes the backend no longer keeps.
    #[error(
        "the changes after {requested} are no longer kept (kept from {oldest}); list again and watch from the list's version"
    )]
    TooOld { requested: String, oldest: String },
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

fn describe_version(v: Option<Version>) -> String {
    match v {
        Some(v) => format!("version {v}"),
        None => "no object".into(),
    }
}

impl StoreError {
    /// Whether retrying the same operation later may succeed without re-reading.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    /// The history after `requested` is gone; it is kept from `oldest`.
    pub(crate) fn too_old(requested: Revision, oldest: Revision) -> Self {
        StoreError::TooOld {
            requested: format!("revision {requested}"),
            oldest: format!("revision {oldest}"),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The most operations in one transaction (etcd's default limit is 128).
pub const MAX_TXN_OPS: usize = 128;

/// The changes after a revision, in order; ends with `Err` when the watch can go no further
/// (history no longer kept, lost connection). To resume, watch again from the last change seen.
pub struct Watch {
    rx: mpsc::Receiver<Result<Event>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Depth of the channel between the backend's task and the watcher: a slow watcher holds
    /// the task back instead of growing memory.
    pub const DEPTH: usize = 1024;

    pub(crate) fn new(
        rx: mpsc::Receiver<Result<Event>>,
        task: tokio::task::JoinHandle<()>,
    ) -> Self {
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

/// The changes of one kind after a list's version, in order; ends with `Err` as [`Watch`].
pub struct ObjectWatch {
    source: ObjectSource,
}

enum ObjectSource {
    /// The key-value backends watch the kind's prefix; the names are the keys' rest.
    Keys { keys: Watch, kind: Kind },
    /// A backend of objects (the Kubernetes API) sends them from its task.
    Objects {
        rx: mpsc::Receiver<Result<ObjectEvent>>,
        task: tokio::task::JoinHandle<()>,
    },
}

impl ObjectWatch {
    /// A watch whose backend's `task` sends the kind's changes into `rx`; dropping the watch
    /// stops the task.
    pub(crate) fn of_objects(
        rx: mpsc::Receiver<Result<ObjectEvent>>,
        task: tokio::task::JoinHandle<()>,
    ) -> Self {
        ObjectWatch {
            source: ObjectSource::Objects { rx, task },
        }
    }

    /// The next change; `None` only if the backend stopped without saying why.
    pub async fn next(&mut self) -> Option<Result<ObjectEvent>> {
        let (keys, kind) = match &mut self.source {
            ObjectSource::Objects { rx, .. } => return rx.recv().await,
            ObjectSource::Keys { keys, kind } => (keys, *kind),
        };
        loop {
            let event = match keys.next().await? {
                Ok(e) => e,
                Err(e) => return Some(Err(e)),
            };
            // A prefix watch of "/x/" cannot see other keys; the check keeps that an invariant.
            let Some(name) = kind.name_of(&event.key) else {
                continue;
            };
            return Some(Ok(ObjectEvent {
                name: name.to_owned(),
                value: event.value,
                version: Version::of_revision(event.revision),
            }));
        }
    }
}

impl Drop for ObjectWatch {
    fn drop(&mut self) {
        if let ObjectSource::Objects { task, .. } = &self.source {
            task.abort();
        }
    }
}

/// The core contract: one object of one kind at a time.
pub trait Datastore: Send + Sync + 'static {
    /// The store's [`Atomic`] side (the store itself where it has one).
    type Atomic: Atomic;

    /// The object, if it exists.
    fn get(&self, kind: Kind, name: &str) -> impl Future<Output = Result<Option<Object>>> + Send;
    /// The objects of `kind` whose names start with `name_prefix` ("" for all), sorted by
    /// name, and the version to watch from.
    fn list(
        &self,
        kind: Kind,
        name_prefix: &str,
    ) -> impl Future<Output = Result<ObjectList>> + Send;
    /// Creates the object; `Conflict` if it exists. Returns its version.
    fn create(
        &self,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
    ) -> impl Future<Output = Result<Version>> + Send;
    /// Replaces the object if it is still at `expected`; `Conflict` otherwise (also when it
    /// is gone). Returns its new version.
    fn update(
        &self,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
        expected: Version,
    ) -> impl Future<Output = Result<Version>> + Send;
    /// Deletes the object if it is still at `expected`; `Conflict` otherwise.
    fn delete(
        &self,
        kind: Kind,
        name: &str,
        expected: Version,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The changes to objects of `kind` after `from` (a list's or an event's version).
    fn watch(&self, kind: Kind, from: Version) -> impl Future<Output = Result<ObjectWatch>> + Send;
    /// The extension, where this store has it and it is in use.
    fn atomic(&self) -> Option<&Self::Atomic>;
    /// e.g. "sqlite:/var/lib/margay/store.db".
    fn describe(&self) -> String;
}

/// The [`Datastore::Atomic`] of a store that has no extension (its `atomic()` is always
/// `None`): no value of it exists.
pub enum NoExtension {}

impl Atomic for NoExtension {
    async fn get_key(&self, _: &str) -> Result<Option<KeyValue>> {
        match *self {}
    }
    async fn list_keys(&self, _: &str) -> Result<Listing> {
        match *self {}
    }
    async fn read(&self, _: Vec<Read>) -> Result<(Vec<ReadResult>, Revision)> {
        match *self {}
    }
    async fn txn(&self, _: Vec<Op>) -> Result<Revision> {
        match *self {}
    }
    async fn watch_keys(&self, _: &str, _: Revision) -> Result<Watch> {
        match *self {}
    }
    async fn revision(&self) -> Result<Revision> {
        match *self {}
    }
    async fn compact(&self, _: Revision) -> Result<()> {
        match *self {}
    }
}

/// The optional extension of stores with one store-wide revision: keys, not objects.
pub trait Atomic: Send + Sync + 'static {
    /// The key, if it exists.
    fn get_key(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>>> + Send;
    /// Every key starting with `prefix`, sorted, with the revision of the read.
    fn list_keys(&self, prefix: &str) -> impl Future<Output = Result<Listing>> + Send;
    /// Several reads at one revision, in one round trip; answers in the order asked.
    fn read(
        &self,
        reads: Vec<Read>,
    ) -> impl Future<Output = Result<(Vec<ReadResult>, Revision)>> + Send;
    /// All the ops or none; returns the revision of the writes (the current revision if the
    /// transaction only checks). The first op whose condition fails is reported as `Conflict`.
    fn txn(&self, ops: Vec<Op>) -> impl Future<Output = Result<Revision>> + Send;
    /// The changes to keys under `prefix` after revision `after`.
    fn watch_keys(
        &self,
        prefix: &str,
        after: Revision,
    ) -> impl Future<Output = Result<Watch>> + Send;
    /// The store's current revision.
    fn revision(&self) -> impl Future<Output = Result<Revision>> + Send;
    /// Forgets the history up to and including `revision`; watches from before it fail.
    fn compact(&self, revision: Revision) -> impl Future<Output = Result<()>> + Send;
}

/// The core contract kept by a store with the extension: an object is a key, its version
/// the key's revision. The backends' `Datastore` impls are these calls.
pub(crate) mod over_keys {
    use super::*;

    pub async fn get<A: Atomic>(store: &A, kind: Kind, name: &str) -> Result<Option<Object>> {
        Ok(store.get_key(&kind.key(name)).await?.map(|kv| Object {
            name: name.to_owned(),
            value: kv.value,
            version: kv.version,
        }))
    }

    pub async fn list<A: Atomic>(store: &A, kind: Kind, name_prefix: &str) -> Result<ObjectList> {
        let listing = store.list_keys(&kind.key(name_prefix)).await?;
        Ok(ObjectList {
            items: listing
                .items
                .into_iter()
                .filter_map(|kv| {
                    Some(Object {
                        name: kind.name_of(&kv.key)?.to_owned(),
                        value: kv.value,
                        version: kv.version,
                    })
                })
                .collect(),
            version: Version::of_revision(listing.revision),
        })
    }

    pub async fn create<A: Atomic>(
        store: &A,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
    ) -> Result<Version> {
        let key = kind.key(name);
        let rev = store.txn(vec![Op::Create { key, value }]).await?;
        Ok(Version::of_revision(rev))
    }

    pub async fn update<A: Atomic>(
        store: &A,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
        expected: Version,
    ) -> Result<Version> {
        let key = kind.key(name);
        let rev = store
            .txn(vec![Op::Update {
                key,
                value,
                expected,
            }])
            .await?;
        Ok(Version::of_revision(rev))
    }

    pub async fn delete<A: Atomic>(
        store: &A,
        kind: Kind,
        name: &str,
        expected: Version,
    ) -> Result<()> {
        let key = kind.key(name);
        store.txn(vec![Op::Delete { key, expected }]).await?;
        Ok(())
    }

    pub async fn watch<A: Atomic>(store: &A, kind: Kind, from: Version) -> Result<ObjectWatch> {
        Ok(ObjectWatch {
            source: ObjectSource::Keys {
                keys: store.watch_keys(kind.prefix, from.revision()).await?,
                kind,
            },
        })
    }
}

/// Implements [`Datastore`] for a key-value backend that has [`Atomic`], through
/// [`over_keys`]; `$describe` is the backend's own description.
macro_rules! datastore_over_keys {
    ($store:ty) => {
        impl $crate::contract::Datastore for $store {
            type Atomic = Self;

            async fn get(
                &self,
                kind: $crate::contract::Kind,
                name: &str,
            ) -> $crate::contract::Result<Option<$crate::contract::Object>> {
                $crate::contract::over_keys::get(self, kind, name).await
            }
            async fn list(
                &self,
                kind: $crate::contract::Kind,
                name_prefix: &str,
            ) -> $crate::contract::Result<$crate::contract::ObjectList> {
                $crate::contract::over_keys::list(self, kind, name_prefix).await
            }
            async fn create(
                &self,
                kind: $crate::contract::Kind,
                name: &str,
                value: Vec<u8>,
            ) -> $crate::contract::Result<$crate::contract::Version> {
                $crate::contract::over_keys::create(self, kind, name, value).await
            }
            async fn update(
                &self,
                kind: $crate::contract::Kind,
                name: &str,
                value: Vec<u8>,
                expected: $crate::contract::Version,
            ) -> $crate::contract::Result<$crate::contract::Version> {
                $crate::contract::over_keys::update(self, kind, name, value, expected).await
            }
            async fn delete(
                &self,
                kind: $crate::contract::Kind,
                name: &str,
                expected: $crate::contract::Version,
            ) -> $crate::contract::Result<()> {
                $crate::contract::over_keys::delete(self, kind, name, expected).await
            }
            async fn watch(
                &self,
                kind: $crate::contract::Kind,
                from: $crate::contract::Version,
            ) -> $crate::contract::Result<$crate::contract::ObjectWatch> {
                $crate::contract::over_keys::watch(self, kind, from).await
            }
            fn atomic(&self) -> Option<&Self> {
                Some(self)
            }
            fn describe(&self) -> String {
                self.describe_backend()
            }
        }
    };
}
pub(crate) use datastore_over_keys;

/// Checks what both backends require of keys and transactions.
pub(crate) fn validate_ops(ops: &[Op]) -> Result<()> {
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

pub(crate) fn validate_key(key: &str) -> Result<()> {
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
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7f {
            bytes.push(last + 1);
            return String::from_utf8(bytes).ok();
        }
    }
    None
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
