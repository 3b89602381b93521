//! [`Store`]: the backend chosen by configuration, one type for the daemon and the tools.

use crate::contract::{
    Atomic, Datastore, KeyValue, Kind, Listing, Object, ObjectList, ObjectWatch, Op, Read,
    ReadResult, Result, Revision, Version, Watch,
};
use crate::etcd::EtcdStore;
use crate::kubernetes::KubeStore;
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
    /// No extension: the apiserver has no multi-object transaction.
    Kubernetes(KubeStore),
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

    pub fn kubernetes(store: KubeStore) -> Self {
        Store {
            backend: Backend::Kubernetes(store),
            extension: false,
        }
    }

    /// The Kubernetes backend, for what only it does (installing CRDs).
    pub fn as_kubernetes(&self) -> Option<&KubeStore> {
        match &self.backend {
            Backend::Kubernetes(k) => Some(k),
            _ => None,
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
            Backend::Kubernetes($s) => $e,
        }
    };
}

/// As `dispatch!`, for the extension's methods: the backends without one refuse.
macro_rules! dispatch_atomic {
    ($self:ident, $s:ident => $e:expr) => {
        match &$self.backend {
            Backend::Sqlite($s) => $e,
            Backend::Etcd($s) => $e,
            Backend::Kubernetes(k) => Err(crate::contract::StoreError::Backend(format!(
                "{} has no multi-key transactions, reads or watches",
                k.describe()
            ))),
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
        // SQLite and etcd have the extension; the Kubernetes API has none (`extension` false).
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
        dispatch_atomic!(self, s => s.get_key(key).await)
    }
    async fn list_keys(&self, prefix: &str) -> Result<Listing> {
        dispatch_atomic!(self, s => s.list_keys(prefix).await)
    }
    async fn read(&self, reads: Vec<Read>) -> Result<(Vec<ReadResult>, Revision)> {
        dispatch_atomic!(self, s => s.read(reads).await)
    }
    async fn txn(&self, ops: Vec<Op>) -> Result<Revision> {
        dispatch_atomic!(self, s => s.txn(ops).await)
    }
    async fn watch_keys(&self, prefix: &str, after: Revision) -> Result<Watch> {
        dispatch_atomic!(self, s => s.watch_keys(prefix, after).await)
    }
    async fn revision(&self) -> Result<Revision> {
        dispatch_atomic!(self, s => s.revision().await)
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        dispatch_atomic!(self, s => s.compact(revision).await)
    }
}
