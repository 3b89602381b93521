//! [`Store`]: the backend chosen by configuration, one type for the daemon and the tools.

use crate::contract::{
    Atomic, Datastore, KeyValue, Kind, Listing, Object, ObjectList, ObjectWatch, Op, Read,
    ReadResult, Result, Revision, Version, Watch,
};
use crate::etcd::EtcdStore;
use crate::sqlite::SqliteStore;

/// The backend chosen by configuration, and whether its `Atomic` extension is in use.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    extension: bool,
}

#[derive(Clone)]
enum Backend {
    Sqlite(SqliteStore),
    Etcd(EtcdStore),
}

impl Store {
    pub fn sqlite(store: SqliteStore) -> Self {
        Store {
            backend: Backend::Sqlite(store),
            extension: true,
        }
    }

    pub fn etcd(store: EtcdStore) -> Self {
        Store {
            backend: Backend::Etcd(store),
            extension: true,
        }
    }

    /// The same store with its extension hidden from its users ([`Datastore::atomic`] is
    /// `None`): they take the per-object paths a store without one needs (the Kubernetes
    /// API), on a real backend. Tools may still call [`Atomic`] on it directly.
    pub fn per_object(self) -> Self {
        Store {
            extension: false,
            ..self
        }
    }

    /// Whether its users see the extension.
    pub fn extension(&self) -> bool {
        self.extension
    }
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match &$self.backend {
            Backend::Sqlite($s) => $e,
            Backend::Etcd($s) => $e,
        }
    };
}

impl Datastore for Store {
    type Atomic = Store;

    async fn get(&self, kind: Kind, name: &str) -> Result<Option<Object>> {
        dispatch!(self, s => s.get(kind, name).await)
    }
    async fn list(&self, kind: Kind, name_prefix: &str) -> Result<ObjectList> {
        dispatch!(self, s => s.list(kind, name_prefix).await)
    }
    async fn create(&self, kind: Kind, name: &str, value: Vec<u8>) -> Result<Version> {
        dispatch!(self, s => s.create(kind, name, value).await)
    }
    async fn update(
        &self,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
        expected: Version,
    ) -> Result<Version> {
        dispatch!(self, s => s.update(kind, name, value, expected).await)
    }
    async fn delete(&self, kind: Kind, name: &str, expected: Version) -> Result<()> {
        dispatch!(self, s => s.delete(kind, name, expected).await)
    }
    async fn watch(&self, kind: Kind, from: Version) -> Result<ObjectWatch> {
        dispatch!(self, s => s.watch(kind, from).await)
    }
    fn atomic(&self) -> Option<&Store> {
        // Both of today's backends have the extension; a backend without it answers `None`.
        self.extension.then_some(self)
    }
    fn describe(&self) -> String {
        let backend = dispatch!(self, s => s.describe());
        if self.extension {
            backend
        } else {
            format!("{backend} (per-object)")
        }
    }
}

impl Atomic for Store {
    async fn get_key(&self, key: &str) -> Result<Option<KeyValue>> {
        dispatch!(self, s => s.get_key(key).await)
    }
    async fn list_keys(&self, prefix: &str) -> Result<Listing> {
        dispatch!(self, s => s.list_keys(prefix).await)
    }
    async fn read(&self, reads: Vec<Read>) -> Result<(Vec<ReadResult>, Revision)> {
        dispatch!(self, s => s.read(reads).await)
    }
    async fn txn(&self, ops: Vec<Op>) -> Result<Revision> {
        dispatch!(self, s => s.txn(ops).await)
    }
    async fn watch_keys(&self, prefix: &str, after: Revision) -> Result<Watch> {
        dispatch!(self, s => s.watch_keys(prefix, after).await)
    }
    async fn revision(&self) -> Result<Revision> {
        dispatch!(self, s => s.revision().await)
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        dispatch!(self, s => s.compact(revision).await)
    }
}
