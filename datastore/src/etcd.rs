//! The cluster backend: etcd v3 through the `etcd-client` crate. etcd is already the versioned
//! store the contract describes, so this is a thin mapping: conditions become `Compare`s on
//! create/mod revision, a failed transaction reads the keys back to say which one conflicted,
//! lists are paged at one pinned revision, watches start at `after + 1` (etcd's start is
//! inclusive).

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, SortOrder,
    SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::mpsc;

use crate::contract::{
    Atomic, Event, KeyValue, Listing, Op, Read, ReadResult, Result, Revision, StoreError, Version,
    Watch, datastore_over_keys, prefix_end, validate_key, validate_ops,
};

/// Keys read per page of a `list`.
const PAGE: i64 = 1000;

/// Client certificate and CA for an etcd served over TLS.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdTls {
    /// PEM CA bundle that the etcd server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key, when etcd requires client certificates.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct EtcdOptions {
    pub connect_timeout: Duration,
    /// Deadline of each request.
    pub request_timeout: Duration,
    pub tls: Option<EtcdTls>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            tls: None,
        }
    }
}

#[derive(Clone)]
pub struct EtcdStore {
    // Boxed behind an Arc: the client is several KiB and the store is cloned into tasks.
    client: std::sync::Arc<Client>,
    endpoints: Vec<String>,
}

fn map_err(e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) => StoreError::Unavailable(e.to_string()),
        E::GRpcStatus(ref s) => match s.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                StoreError::Unavailable(s.message().to_owned())
            }
            // A member that has lost its leader (cut off from the others, or in an election)
            // answers some requests with Go's bare context error or etcd's own timeout text
            // under code Unknown. They clear up (another member, a new leader): the caller
            // may try again, as etcd's own client does for these.
            tonic::Code::Unknown if is_transient_message(s.message()) => {
                StoreError::Unavailable(s.message().to_owned())
            }
            _ => StoreError::Backend(s.message().to_owned()),
        },
        other => StoreError::Backend(other.to_string()),
    }
}

/// The texts etcd sends, under code Unknown, for conditions that pass by themselves.
fn is_transient_message(message: &str) -> bool {
    [
        "context deadline exceeded",
        "etcdserver: request timed out",
        "etcdserver: leader changed",
        "etcdserver: no leader",
        "etcdserver: too many requests",
    ]
    .iter()
    .any(|m| message.contains(m))
}

fn rev(r: i64) -> Revision {
    Revision(r.max(0) as u64)
}

fn to_kv(kv: &etcd_client::KeyValue) -> Result<KeyValue> {
    Ok(KeyValue {
        key: kv
            .key_str()
            .map_err(|e| StoreError::Backend(format!("a key in etcd is not UTF-8: {e}")))?
            .to_owned(),
        value: kv.value().to_vec(),
        version: Version::of_revision(rev(kv.mod_revision())),
    })
}

/// Whether a request failed before any member took it: the member the balanced channel
/// picked is down (no connection), or has lost its leader and refused at once (require-leader).
/// Either way nothing was done, so another try is safe, for a write too.
fn not_taken(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable
                && (s.message().contains("tcp connect error")
                    || s.message().contains("etcdserver: no leader"))
        }
        _ => false,
    }
}

/// The pause between tries of a request no member took.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

impl EtcdStore {
    /// Runs `call` on the client, again while no member takes it ([`not_taken`]). The
    /// balanced channel sends each request to one member and does not steer around a dead
    /// or leaderless one, so with one member of three down a third of the requests would fail
    /// for as long as it is down; a new try picks again. A request a member took is never
    /// repeated here (a write's outcome may be unknown): that is for the caller.
    async fn reach<T, F, Fut>(&self, mut call: F) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let tries = 2 * self.endpoints.len() + 1;
        let mut n = 1;
        loop {
            match call((*self.client).clone()).await {
                Err(e) if n < tries && not_taken(&e) => {
                    n += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                other => return other,
            }
        }
    }

    /// One transaction, to whichever member takes it.
    async fn send_txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.reach(|c| {
            let txn = txn.clone();
            async move { c.kv_client().txn(txn).await }
        })
        .await
        .map_err(map_err)
    }

    /// Connects to the endpoints; fails with `Unavailable` when none answers.
    pub async fn connect(endpoints: &[String], options: EtcdOptions) -> Result<Self> {
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from the others refuses at once ("no leader") instead of
            // holding a request until its deadline, and cancels its watches instead of
            // keeping them open and silent: the client goes on with another member.
            .with_require_leader(true);
        if let Some(tls) = &options.tls {
            connect = connect.with_tls(tls_options(tls).await?);
        }
        let client = Client::connect(endpoints, Some(connect))
            .await
            .map_err(map_err)?;
        let store = Self {
            client: std::sync::Arc::new(client),
            endpoints: endpoints.to_vec(),
        };
        // The client connects lazily; ask once so an unreachable cluster is reported now.
        store.revision().await?;
        Ok(store)
    }
}

async fn tls_options(tls: &EtcdTls) -> Result<TlsOptions> {
    let read = |p: PathBuf| async move {
        tokio::fs::read(&p)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot read {}: {e}", p.display())))
    };
    let mut options = TlsOptions::new();
    if let Some(ca) = &tls.ca {
        options = options.ca_certificate(Certificate::from_pem(read(ca.clone()).await?));
    }
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            options = options.identity(Identity::from_pem(
                read(cert.clone()).await?,
                read(key.clone()).await?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Backend(
                "datastore.tls needs both cert and key, or neither".into(),
            ));
        }
    }
    Ok(options)
}

fn compare(op: &Op) -> Compare {
    match op.expected() {
        None => Compare::create_revision(op.key(), CompareOp::Equal, 0),
        Some(v) => Compare::mod_revision(op.key(), CompareOp::Equal, v.revision().0 as i64),
    }
}

datastore_over_keys!(EtcdStore);

impl Atomic for EtcdStore {
    async fn get_key(&self, key: &str) -> Result<Option<KeyValue>> {
        validate_key(key)?;
        let resp = self
            .reach(|c| async move { c.kv_client().get(key, None).await })
            .await
            .map_err(map_err)?;
        resp.kvs().first().map(to_kv).transpose()
    }

    async fn list_keys(&self, prefix: &str) -> Result<Listing> {
        let end = prefix_end(prefix).unwrap_or_else(|| "\u{7f}".to_owned());
        let mut items = Vec::new();
        let mut start = if prefix.is_empty() {
            " ".to_owned()
        } else {
            prefix.to_owned()
        };
        let mut pinned: Option<i64> = None;
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_sort(SortTarget::Key, SortOrder::Ascend)
                .with_limit(PAGE);
            if let Some(r) = pinned {
                options = options.with_revision(r);
            }
            let resp = self
                .reach(|c| {
                    let (start, options) = (start.clone(), options.clone());
                    async move { c.kv_client().get(start, Some(options)).await }
                })
                .await
                .map_err(map_err)?;
            let header_rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            let read_at = *pinned.get_or_insert(header_rev);
            for item in resp.kvs() {
                items.push(to_kv(item)?);
            }
            if !resp.more() || resp.kvs().is_empty() {
                return Ok(Listing {
                    items,
                    revision: rev(read_at),
                });
            }
            // The next page starts just after the last key.
            start = format!("{}\0", items.last().map(|i| i.key.as_str()).unwrap_or(""));
        }
    }

    async fn read(&self, reads: Vec<Read>) -> Result<(Vec<ReadResult>, Revision)> {
        // A transaction without conditions: every range read at one revision, one round trip.
        let mut ops = Vec::with_capacity(reads.len());
        for r in &reads {
            ops.push(match r {
                Read::Get(key) => {
                    validate_key(key)?;
                    TxnOp::get(key.as_str(), None)
                }
                Read::List(prefix) => {
                    let end = prefix_end(prefix).unwrap_or_else(|| "\u{7f}".to_owned());
                    let start = if prefix.is_empty() {
                        " "
                    } else {
                        prefix.as_str()
                    };
                    let options = GetOptions::new()
                        .with_range(end)
                        .with_sort(SortTarget::Key, SortOrder::Ascend);
                    TxnOp::get(start, Some(options))
                }
            });
        }
        let resp = self.send_txn(Txn::new().and_then(ops)).await?;
        let revision = rev(resp.header().map(|h| h.revision()).unwrap_or(0));
        let mut out = Vec::with_capacity(reads.len());
        for (r, answer) in reads.iter().zip(resp.op_responses()) {
            let TxnOpResponse::Get(g) = answer else {
                return Err(StoreError::Backend(
                    "etcd answered a read with a write".into(),
                ));
            };
            out.push(match r {
                Read::Get(_) => ReadResult::Get(g.kvs().first().map(to_kv).transpose()?),
                Read::List(_) => {
                    ReadResult::List(g.kvs().iter().map(to_kv).collect::<Result<Vec<_>>>()?)
                }
            });
        }
        Ok((out, revision))
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Revision> {
        validate_ops(&ops)?;
        let compares: Vec<Compare> = ops.iter().map(compare).collect();
        let writes: Vec<TxnOp> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Create { key, value } | Op::Update { key, value, .. } => {
                    Some(TxnOp::put(key.as_str(), value.clone(), None))
                }
                Op::Delete { key, .. } => Some(TxnOp::delete(key.as_str(), None)),
                Op::Check { .. } => None,
            })
            .collect();
        let reads: Vec<TxnOp> = ops.iter().map(|op| TxnOp::get(op.key(), None)).collect();
        let txn = Txn::new().when(compares).and_then(writes).or_else(reads);
        let resp = self.send_txn(txn).await?;
        let revision = rev(resp.header().map(|h| h.revision()).unwrap_or(0));
        if resp.succeeded() {
            return Ok(revision);
        }
        for (op, answer) in ops.iter().zip(resp.op_responses()) {
            let actual = match answer {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| Version::of_revision(rev(kv.mod_revision()))),
                _ => continue,
            };
            if actual != op.expected() {
                return Err(StoreError::Conflict {
                    key: op.key().to_owned(),
                    expected: op.expected(),
                    actual,
                });
            }
        }
        Err(StoreError::Backend(
            "etcd refused the transaction but every condition reads as met".into(),
        ))
    }

    async fn watch_keys(&self, prefix: &str, after: Revision) -> Result<Watch> {
        let end = prefix_end(prefix).unwrap_or_else(|| "\u{7f}".to_owned());
        let start = if prefix.is_empty() {
            " ".to_owned()
        } else {
            prefix.to_owned()
        };
        let options = WatchOptions::new()
            .with_range(end)
            .with_start_revision(after.0 as i64 + 1);
        let mut stream = self
            .reach(|c| {
                let (start, options) = (start.clone(), options.clone());
                async move { c.watch_client().watch(start, Some(options)).await }
            })
            .await
            .map_err(map_err)?;
        // The first answer says whether the watch was created or refused (compacted start).
        let first = stream.message().await.map_err(map_err)?;
        let refusal = move |resp: &etcd_client::WatchResponse| {
            if resp.compact_revision() > 0 {
                Some(StoreError::too_old(after, rev(resp.compact_revision())))
            } else if resp.canceled() {
                Some(StoreError::Unavailable(format!(
                    "etcd cancelled the watch: {}",
                    resp.cancel_reason()
                )))
            } else {
                None
            }
        };
        let mut pending = Vec::new();
        match &first {
            None => return Err(StoreError::Unavailable("etcd closed the watch".into())),
            Some(resp) => {
                if let Some(e) = refusal(resp) {
                    return Err(e);
                }
                pending.push(resp.clone());
            }
        }
        let (tx, rx) = mpsc::channel(Watch::DEPTH);
        let task = tokio::spawn(async move {
            loop {
                for resp in pending.drain(..) {
                    if let Some(e) = refusal(&resp) {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    for event in resp.events() {
                        let Some(kv) = event.kv() else { continue };
                        let deleted = event.event_type() == etcd_client::EventType::Delete;
                        let item = to_kv(kv).map(|kv| Event {
                            key: kv.key,
                            value: (!deleted).then_some(kv.value),
                            revision: kv.version.revision(),
                        });
                        if tx.send(item).await.is_err() {
                            return;
                        }
                    }
                }
                let next = tokio::select! {
                    next = stream.message() => next,
                    _ = tx.closed() => return,
                };
                match next {
                    Ok(Some(resp)) => pending.push(resp),
                    Ok(None) => {
                        let _ = tx
                            .send(Err(StoreError::Unavailable("etcd closed the watch".into())))
                            .await;
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(map_err(e))).await;
                        return;
                    }
                }
            }
        });
        Ok(Watch::new(rx, task))
    }

    async fn revision(&self) -> Result<Revision> {
        let resp = self
            .reach(|c| async move {
                c.kv_client()
                    .get("\u{7f}", Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await
            .map_err(map_err)?;
        Ok(rev(resp.header().map(|h| h.revision()).unwrap_or(0)))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let current = self.revision().await?;
        // etcd keeps the compaction revision itself watchable; the contract forgets it too.
        let target = (revision.0 + 1).min(current.0);
        if target == 0 {
            return Ok(());
        }
        match self
            .reach(|c| async move { c.kv_client().compact(target as i64, None).await })
            .await
        {
            Ok(_) => Ok(()),
            // Already compacted at or past it: nothing to do.
            Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("compacted") => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }
}

impl EtcdStore {
    fn describe_backend(&self) -> String {
        format!("etcd:{}", self.endpoints.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaderless_members_answers_are_for_now_not_for_good() {
        let status = |code, msg: &str| {
            map_err(etcd_client::Error::GRpcStatus(tonic::Status::new(
                code, msg,
            )))
        };
        for msg in [
            "context deadline exceeded",
            "etcdserver: request timed out",
            "etcdserver: leader changed",
            "etcdserver: no leader",
        ] {
            let e = status(tonic::Code::Unknown, msg);
            assert!(
                matches!(&e, StoreError::Unavailable(m) if m == msg),
                "{msg}: {e:?}"
            );
        }
        assert!(matches!(
            status(tonic::Code::DeadlineExceeded, "x"),
            StoreError::Unavailable(_)
        ));
        // Anything else under Unknown, or a refusal, is the backend's answer.
        assert!(matches!(
            status(
                tonic::Code::Unknown,
                "etcdserver: mvcc: database space exceeded"
            ),
            StoreError::Backend(_)
        ));
        assert!(matches!(
            status(
                tonic::Code::InvalidArgument,
                "etcdserver: key is not provided"
            ),
            StoreError::Backend(_)
        ));
    }

    #[test]
    fn only_requests_no_member_took_are_tried_again() {
        let e = |code, msg: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg));
        assert!(not_taken(&e(tonic::Code::Unavailable, "tcp connect error")));
        assert!(not_taken(&e(
            tonic::Code::Unavailable,
            "etcdserver: no leader"
        )));
        // Taken by a member, outcome unknown (a write may have committed): the caller's call.
        assert!(!not_taken(&e(
            tonic::Code::Unavailable,
            "etcdserver: request timed out"
        )));
        assert!(!not_taken(&e(
            tonic::Code::Unknown,
            "context deadline exceeded"
        )));
        assert!(!not_taken(&e(
            tonic::Code::Unavailable,
            "error reading a body from connection"
        )));
    }
}
