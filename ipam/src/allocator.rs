//! IPAM against the datastore: pools, block claims, allocation, release, garbage collection
//! and the consistency check (nodes, BGP peers and the like are `datastore::Resources`').
//!
//! Today every operation is a compare-and-swap transaction of the datastore's `Atomic`
//! extension over the versions just read: a claim creates the block, with its first
//! addresses, and its confirmed affinity in one commit (Calico's three steps, affinity
//! pending → block → affinity confirmed, make up for a store without multi-key
//! transactions); a block and the handles change together, so a crash never leaves an
//! address without its handle or the other way round. A lost race re-reads and retries, a
//! bounded number of times. Affinities left pending or pending deletion (by older versions)
//! are finished by `claim`, `gc` and `reclaim_empty_blocks`.
//!
//! One `Ipam` serves every request of a store (bgpd keeps one per connection): a node's
//! requests are serialised by its lock and served together from its cached block (`Fast`,
//! group commit) while the store has not changed under it.
//!
//! Not yet: the per-object path that stores without the extension (the Kubernetes API)
//! need, in Calico's order, sharing one description of the steps with the transaction.
//!
//! Why this file is long: every IPAM operation is a read-check-write transaction on the same
//! blocks, affinities and handles; they share the retry loop and the transaction helpers.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::block::{AffinityState, Block, BlockAffinity, Handle, Released, cidr_key};
use crate::error::IpamError;
use datastore::contract::{Atomic, Datastore, Op, Read, ReadResult, Revision, StoreError, Version};
use datastore::model::{AllowedUse, AssignmentMode, IpFamily, IpPool, IpamConfig, Node, overlaps};
use datastore::resource::{Resource, decode, encode};
use datastore::selector::Selector;

/// How often a lost compare-and-swap is retried before giving up.
pub const RETRIES: u32 = 100;

/// Serialises pool changes: every pool write also bumps this key, so two overlapping pools
/// created at once cannot both pass the overlap check.
const POOLS_GUARD: &str = "/margay/v1/meta/ippools-guard";
const CONFIG_KEY: &str = "/margay/v1/ipam/config/default";
/// Handles of tunnel addresses (Calico's names); only node removal releases them.
pub const TUNNEL_HANDLE_PREFIX: &str = "vxlan-tunnel-addr-";
pub const TUNNEL_HANDLE_PREFIX_V6: &str = "vxlan-v6-tunnel-addr-";

/// The handle of `node`'s VXLAN tunnel address of `family`.
pub fn tunnel_handle(family: IpFamily, node: &str) -> String {
    match family {
        IpFamily::V4 => format!("{TUNNEL_HANDLE_PREFIX}{node}"),
        IpFamily::V6 => format!("{TUNNEL_HANDLE_PREFIX_V6}{node}"),
    }
}

/// Whether `handle` holds a tunnel address (of either family).
pub fn is_tunnel_handle(handle: &str) -> bool {
    handle.starts_with(TUNNEL_HANDLE_PREFIX) || handle.starts_with(TUNNEL_HANDLE_PREFIX_V6)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn block_key(cidr: &IpNet) -> String {
    format!("{}{}", Block::PREFIX, cidr_key(cidr))
}

/// An automatic assignment request.
#[derive(Debug, Clone, Default)]
pub struct AssignRequest {
    pub handle: String,
    pub attrs: BTreeMap<String, String>,
    pub num_v4: u32,
    pub num_v6: u32,
    pub node: String,
    /// Pool names or CIDRs; empty: every automatic pool that selects the node.
    pub v4_pools: Vec<String>,
    pub v6_pools: Vec<String>,
    pub use_tunnel: bool,
    pub strict_affinity: bool,
}

impl AssignRequest {
    /// How many addresses of `family` the request asks for, and the pools it names for them.
    pub fn wants(&self, family: IpFamily) -> (u32, &[String]) {
        match family {
            IpFamily::V4 => (self.num_v4, &self.v4_pools),
            IpFamily::V6 => (self.num_v6, &self.v6_pools),
        }
    }
}

/// The request field that names the pools of `family`.
fn pools_field(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4_pools",
        IpFamily::V6 => "ipv6_pools",
    }
}

/// One address handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    pub address: IpAddr,
    pub block: IpNet,
    pub pool: String,
    pub borrowed: bool,
    pub handle: String,
    pub seq: u64,
    pub attrs: BTreeMap<String, String>,
}

/// A release of one address, optionally guarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    pub address: IpAddr,
    pub handle: Option<String>,
    pub seq: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    pub name: String,
    pub cidr: IpNet,
    pub size: u128,
    pub used: u64,
    pub blocks: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockUsage {
    pub cidr: IpNet,
    pub pool: String,
    pub affinity: Option<String>,
    pub state: Option<AffinityState>,
    pub used: u32,
    pub free: u32,
    pub borrowed: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub allocations: u64,
    pub handles: u64,
    pub problems: Vec<String>,
}

/// The outcome of one allocation step.
enum Step {
    Allocated(Vec<Assigned>),
    /// Something changed (a claim made, a race lost): read again.
    Again,
    Exhausted(String),
}

pub struct Ipam<D> {
    store: D,
    /// The block each node allocated from last in each family: read along with the rest of a
    /// step, so the common case is one read and one write. Only a hint; correctness rests on
    /// the CAS.
    hints: std::sync::Mutex<std::collections::HashMap<(String, IpFamily), IpNet>>,
    /// What this process last read and wrote for a node in each family, to allocate the next
    /// address with no read at all: the transaction re-checks every assumption (see `Fast`).
    fast: std::sync::Mutex<std::collections::HashMap<(String, IpFamily), Fast>>,
    /// Serialises one node's allocations within this process, so they do not race each other
    /// for the node's block (other processes still race, and lose or win by CAS).
    node_locks: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Requests waiting for a node's lock: whoever gets the lock serves all of them in one
    /// transaction when it can (group commit), so concurrent pod starts on one node share a
    /// write instead of racing for the block.
    queues: std::sync::Mutex<std::collections::HashMap<String, Vec<Queued>>>,
}

/// A request waiting for its node's lock, and where its answer goes (`None`: take the
/// normal path).
struct Queued {
    req: AssignRequest,
    use_: AllowedUse,
    answer: tokio::sync::oneshot::Sender<Option<Vec<Assigned>>>,
}

/// At most this many requests share one transaction (the store allows 128 operations).
const BATCH: usize = 100;

/// Everything one allocation step reads, at one revision and in one round trip.
struct View {
    pools: Vec<IpPool>,
    labels: BTreeMap<String, String>,
    config: IpamConfig,
    affinities: Vec<(BlockAffinity, Version)>,
    handle: Option<(Handle, Version)>,
    hinted: Option<(Block, Version)>,
    /// Checks that the pools, the node and the configuration are still as read.
    checks: Vec<Op>,
}

/// What a step read that a later fast allocation relies on: pools, labels, checks.
type FastSeed = (Vec<IpPool>, BTreeMap<String, String>, Vec<Op>);

/// A node's last allocation state in one family: the view it was made under and the block as
/// written. (One per family, so a dual-stack node's IPv4 and IPv6 requests do not evict each
/// other's, and a dual-stack request takes the fast path too.)
/// An allocation from it writes the block and creates the handle together with `Check`s of
/// the pools guard, node, configuration and affinity revisions: if anything changed, the
/// transaction fails as a conflict and the normal path reads again.
#[derive(Clone)]
struct Fast {
    pools: Vec<IpPool>,
    labels: BTreeMap<String, String>,
    checks: Vec<Op>,
    block: Block,
    block_rev: Version,
}

impl<D: Datastore + Atomic> Ipam<D> {
    pub fn new(store: D) -> Self {
        Self {
            store,
            hints: Default::default(),
            fast: Default::default(),
            node_locks: Default::default(),
            queues: Default::default(),
        }
    }

    /// Serves up to `BATCH` queued requests of `node` (the caller holds the node's lock);
    /// `false` when the queue was empty. As many as the node's cached blocks hold share one
    /// transaction; when they hold none of the rest (a block filled up, or nothing is cached
    /// yet), the first of the rest takes the normal path here, which claims a block and
    /// caches it, and the others share the next transaction.
    async fn serve_queue(&self, node: &str) -> bool {
        let mut rest: Vec<Queued> = {
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            let q = queues.entry(node.to_owned()).or_default();
            let n = q.len().min(BATCH);
            q.drain(..n).collect()
        };
        if rest.is_empty() {
            return false;
        }
        while !rest.is_empty() {
            let fit = self.fast_fit(node, &rest);
            if fit == 0 {
                let q = rest.remove(0);
                let got = self.assign_slow(&q.req, q.use_).await.ok();
                let _ = q
                    .answer
                    .send(got.map(|(v4, v6)| v4.into_iter().chain(v6).collect()));
                continue;
            }
            let batch: Vec<Queued> = rest.drain(..fit).collect();
            let reqs: Vec<(&AssignRequest, AllowedUse)> =
                batch.iter().map(|q| (&q.req, q.use_)).collect();
            let served = match self.try_fast_batch(&reqs).await {
                Ok(Some(all)) => all.into_iter().map(Some).collect(),
                // Not for want of room: each request takes the normal path on its own.
                _ => vec![None; batch.len()],
            };
            for (q, answer) in batch.into_iter().zip(served) {
                let _ = q.answer.send(answer);
            }
        }
        true
    }

    /// How many of `queued`, from the first, the node's cached blocks have room for (0: no
    /// cached block of a family the first one asks for, or no room).
    fn fast_fit(&self, node: &str, queued: &[Queued]) -> usize {
        let fast = self.fast.lock().unwrap_or_else(|p| p.into_inner());
        let mut room: Vec<(IpFamily, u64)> = IpFamily::ALL
            .into_iter()
            .filter_map(|f| {
                let state = fast.get(&(node.to_owned(), f))?;
                Some((f, u64::from(state.block.free_count())))
            })
            .collect();
        let mut fit = 0;
        for q in queued {
            for (family, left) in &mut room {
                let want = u64::from(q.req.wants(*family).0);
                if want > *left {
                    return fit;
                }
                *left -= want;
            }
            if IpFamily::ALL
                .into_iter()
                .any(|f| q.req.wants(f).0 > 0 && !room.iter().any(|(g, _)| *g == f))
            {
                return fit;
            }
            fit += 1;
        }
        fit
    }

    fn node_lock(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.node_locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(node.to_owned()).or_default().clone()
    }

    /// Allocates from the node's cached state with no read; `None` when there is no usable
    /// cached state or the store changed since (then the normal path runs).
    async fn try_fast(
        &self,
        req: &AssignRequest,
        use_: AllowedUse,
    ) -> Result<Option<Vec<Assigned>>, IpamError> {
        Ok(self
            .try_fast_batch(&[(req, use_)])
            .await?
            .and_then(|mut all| all.pop()))
    }

    /// Allocates for several requests of one node in one transaction from the node's cached
    /// state of each family the requests ask for: each block is written once and each
    /// request's handle created (a dual-stack request's handle records both of its blocks).
    /// All or none: `None` when the cache cannot serve every request (they take the normal
    /// path).
    async fn try_fast_batch(
        &self,
        batch: &[(&AssignRequest, AllowedUse)],
    ) -> Result<Option<Vec<Vec<Assigned>>>, IpamError> {
        let Some((first, _)) = batch.first() else {
            return Ok(Some(vec![]));
        };
        let node = first.node.clone();
        if batch.iter().any(|(r, _)| r.node != node) {
            return Ok(None);
        }
        let families: Vec<IpFamily> = IpFamily::ALL
            .into_iter()
            .filter(|f| batch.iter().any(|(r, _)| r.wants(*f).0 > 0))
            .collect();
        let mut states: Vec<(IpFamily, Fast)> = {
            let mut fast = self.fast.lock().unwrap_or_else(|p| p.into_inner());
            if !families
                .iter()
                .all(|f| fast.contains_key(&(node.clone(), *f)))
            {
                return Ok(None);
            }
            families
                .iter()
                .filter_map(|f| Some((*f, fast.remove(&(node.clone(), *f))?)))
                .collect()
        };
        // What every state relies on must have been read at the same revisions (one check
        // per key: a transaction names a key once); else one of them is stale.
        let mut checks: Vec<Op> = Vec::new();
        for (_, state) in &states {
            for check in &state.checks {
                match checks.iter().find(|c| c.key() == check.key()) {
                    Some(c) if c == check => {}
                    Some(_) => return Ok(None),
                    None => checks.push(check.clone()),
                }
            }
        }
        let Some((_, first)) = states.first() else {
            return Ok(None);
        };
        let (pools, labels) = (&first.pools, &first.labels);
        let mut handles = HashSet::new();
        for (req, use_) in batch {
            if !handles.insert(req.handle.as_str()) {
                self.keep_fast(&node, states);
                return Ok(None);
            }
            for (family, state) in &states {
                let (n, named) = req.wants(*family);
                if n == 0 {
                    continue;
                }
                let Ok(usable) = select_pools(pools, labels, *family, named, *use_) else {
                    self.keep_fast(&node, states);
                    return Ok(None);
                };
                if !usable.iter().any(|p| p.name == state.block.pool) {
                    self.keep_fast(&node, states);
                    return Ok(None);
                }
            }
        }
        for (family, state) in &states {
            let needed: u64 = batch
                .iter()
                .map(|(r, _)| u64::from(r.wants(*family).0))
                .sum();
            if u64::from(state.block.free_count()) < needed {
                self.keep_fast(&node, states);
                return Ok(None);
            }
        }
        let mut ops = Vec::with_capacity(batch.len() + states.len() + checks.len());
        let mut got: Vec<Vec<Assigned>> = vec![Vec::new(); batch.len()];
        let mut handles: Vec<Handle> = batch
            .iter()
            .map(|(req, _)| Handle {
                id: req.handle.clone(),
                ..Handle::default()
            })
            .collect();
        for (family, state) in &mut states {
            let block = &mut state.block;
            for (i, (req, _)) in batch.iter().enumerate() {
                let n = req.wants(*family).0 as usize;
                if n == 0 {
                    continue;
                }
                let mine = block.allocate(n, &req.handle, &req.node, &req.attrs);
                handles[i].add(&block.cidr, mine.len() as u32);
                got[i].extend(mine.into_iter().map(|(address, seq)| Assigned {
                    address,
                    block: block.cidr,
                    pool: block.pool.clone(),
                    borrowed: false,
                    handle: req.handle.clone(),
                    seq,
                    attrs: req.attrs.clone(),
                }));
            }
            ops.push(Self::put(
                block_key(&block.cidr),
                &*block,
                Some(state.block_rev),
            ));
        }
        for h in &handles {
            ops.push(Self::put(Handle::key(&h.id), h, None));
        }
        ops.extend(checks);
        match self.store.txn(ops).await {
            Ok(rev) => {
                for (_, state) in &mut states {
                    state.block_rev = rev.version();
                }
                self.keep_fast(&node, states);
                Ok(Some(got))
            }
            // The store changed: the cached states are stale, the normal path reads again.
            Err(StoreError::Conflict { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Puts cached states back: they are what the store holds (as last written, or unused).
    fn keep_fast(&self, node: &str, states: Vec<(IpFamily, Fast)>) {
        let mut fast = self.fast.lock().unwrap_or_else(|p| p.into_inner());
        for (family, state) in states {
            fast.insert((node.to_owned(), family), state);
        }
    }

    fn hint(&self, node: &str, family: IpFamily) -> Option<IpNet> {
        self.hints
            .lock()
            .ok()?
            .get(&(node.to_owned(), family))
            .copied()
    }

    fn set_hint(&self, node: &str, cidr: IpNet) {
        if let Ok(mut h) = self.hints.lock() {
            h.insert((node.to_owned(), IpFamily::of_net(&cidr)), cidr);
        }
    }

    /// What a step for `family` reads (the hinted block is the node's last of that family).
    async fn view(&self, node: &str, handle: &str, family: IpFamily) -> Result<View, IpamError> {
        let hint = self.hint(node, family);
        let mut reads = vec![
            Read::List(IpPool::PREFIX.into()),
            Read::Get(Node::key(node)),
            Read::Get(CONFIG_KEY.into()),
            Read::List(BlockAffinity::prefix_of(node)),
            Read::Get(Handle::key(handle)),
            Read::Get(POOLS_GUARD.into()),
        ];
        if let Some(cidr) = &hint {
            reads.push(Read::Get(block_key(cidr)));
        }
        let (answers, _) = self.store.read(reads).await?;
        let mut a = answers.into_iter();
        let mut next = || {
            a.next()
                .ok_or_else(|| StoreError::Backend("short read".into()))
        };
        let pools = next()?
            .into_list()
            .iter()
            .map(|kv| decode(&kv.value))
            .collect::<Result<_, _>>()?;
        let node_kv = next()?.into_get();
        let labels = match &node_kv {
            Some(kv) => decode::<Node>(&kv.value)?.labels,
            None => BTreeMap::new(),
        };
        let config_kv = next()?.into_get();
        let config = match &config_kv {
            Some(kv) => decode::<IpamConfig>(&kv.value)?,
            None => IpamConfig::default(),
        };
        let affinities = next()?
            .into_list()
            .iter()
            .map(|kv| Ok((decode(&kv.value)?, kv.version)))
            .collect::<Result<_, IpamError>>()?;
        let handle = match next()?.into_get() {
            Some(kv) => Some((decode::<Handle>(&kv.value)?, kv.version)),
            None => None,
        };
        let guard_kv = next()?.into_get();
        let check = |key: &str, kv: &Option<datastore::contract::KeyValue>| Op::Check {
            key: key.to_owned(),
            expected: kv.as_ref().map(|kv| kv.version),
        };
        let checks = vec![
            check(POOLS_GUARD, &guard_kv),
            check(&Node::key(node), &node_kv),
            check(CONFIG_KEY, &config_kv),
        ];
        let hinted = match hint {
            Some(_) => match next()?.into_get() {
                Some(kv) => Some((decode::<Block>(&kv.value)?, kv.version)),
                None => None,
            },
            None => None,
        };
        Ok(View {
            pools,
            labels,
            config,
            affinities,
            handle,
            hinted,
            checks,
        })
    }

    pub fn store(&self) -> &D {
        &self.store
    }

    // ---- typed access ----

    async fn get<T: Resource>(&self, key: &str) -> Result<Option<(T, Version)>, IpamError> {
        match self.store.get_key(key).await? {
            Some(kv) => Ok(Some((decode(&kv.value)?, kv.version))),
            None => Ok(None),
        }
    }

    async fn list<T: Resource>(&self, prefix: &str) -> Result<Vec<(T, Version)>, IpamError> {
        self.store
            .list_keys(prefix)
            .await?
            .items
            .into_iter()
            .map(|kv| Ok((decode(&kv.value)?, kv.version)))
            .collect()
    }

    /// An op writing `value` at `key`: create when `rev` is `None`, else update.
    fn put<T: Resource>(key: String, value: &T, rev: Option<Version>) -> Op {
        match rev {
            None => Op::Create {
                key,
                value: encode(value),
            },
            Some(expected) => Op::Update {
                key,
                value: encode(value),
                expected,
            },
        }
    }

    // ---- configuration ----

    pub async fn config(&self) -> Result<IpamConfig, IpamError> {
        Ok(self
            .get::<IpamConfig>(CONFIG_KEY)
            .await?
            .map(|(c, _)| c)
            .unwrap_or_default())
    }

    pub async fn set_config(&self, config: &IpamConfig) -> Result<(), IpamError> {
        for _ in 0..RETRIES {
            let rev = self.get::<IpamConfig>(CONFIG_KEY).await?.map(|(_, r)| r);
            match self
                .store
                .txn(vec![Self::put(CONFIG_KEY.into(), config, rev)])
                .await
            {
                Err(StoreError::Conflict { .. }) => continue,
                other => return other.map(|_| ()).map_err(Into::into),
            }
        }
        Err(IpamError::Contention {
            what: "the IPAM configuration".into(),
            attempts: RETRIES,
        })
    }

    // ---- pools ----

    pub async fn list_pools(&self) -> Result<Vec<(IpPool, Version)>, IpamError> {
        self.list(IpPool::PREFIX).await
    }

    pub async fn get_pool(&self, name: &str) -> Result<(IpPool, Version), IpamError> {
        self.get(&IpPool::key(name))
            .await?
            .ok_or_else(|| IpamError::NotFound(format!("pool {name}")))
    }

    async fn pools_guard(&self) -> Result<(Op, u64), IpamError> {
        let current = self.store.get_key(POOLS_GUARD).await?;
        let n = current
            .as_ref()
            .and_then(|kv| std::str::from_utf8(&kv.value).ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        let value = (n + 1).to_string().into_bytes();
        let op = match current {
            None => Op::Create {
                key: POOLS_GUARD.into(),
                value,
            },
            Some(kv) => Op::Update {
                key: POOLS_GUARD.into(),
                value,
                expected: kv.version,
            },
        };
        Ok((op, n))
    }

    fn check_overlap(pool: &IpPool, others: &[(IpPool, Version)]) -> Result<(), IpamError> {
        for (other, _) in others {
            if other.name != pool.name && overlaps(&other.cidr, &pool.cidr) {
                return Err(IpamError::InvalidArgument {
                    field: "cidr",
                    reason: format!(
                        "{} overlaps pool {} ({})",
                        pool.cidr, other.name, other.cidr
                    ),
                });
            }
        }
        Ok(())
    }

    pub async fn create_pool(&self, pool: &IpPool) -> Result<Version, IpamError> {
        pool.validate()?;
        for _ in 0..RETRIES {
            let (guard, _) = self.pools_guard().await?;
            let pools = self.list_pools().await?;
            if pools.iter().any(|(p, _)| p.name == pool.name) {
                return Err(IpamError::AlreadyExists(format!("pool {}", pool.name)));
            }
            Self::check_overlap(pool, &pools)?;
            match self
                .store
                .txn(vec![guard, Self::put(IpPool::key(&pool.name), pool, None)])
                .await
            {
                Err(StoreError::Conflict { .. }) => continue,
                other => return other.map(Revision::version).map_err(Into::into),
            }
        }
        Err(IpamError::Contention {
            what: "the pools".into(),
            attempts: RETRIES,
        })
    }

    /// Replaces a pool's settings. CIDR and block size cannot change while blocks exist.
    pub async fn update_pool(
        &self,
        pool: &IpPool,
        expected: Option<Version>,
    ) -> Result<Version, IpamError> {
        pool.validate()?;
        for _ in 0..RETRIES {
            let (guard, _) = self.pools_guard().await?;
            let (current, rev) = self.get_pool(&pool.name).await?;
            if expected.is_some_and(|e| e != rev) {
                return Err(IpamError::Stale(format!("pool {}", pool.name)));
            }
            if current.cidr != pool.cidr || current.block_size != pool.block_size {
                let blocks = self.blocks_of_pool(&current.name).await?;
                if let Some((b, _)) = blocks.first() {
                    return Err(IpamError::InUse(format!(
                        "pool {} has {} block(s) (e.g. {} affine to {}): its cidr and block size cannot change; create a new pool and disable this one",
                        pool.name,
                        blocks.len(),
                        b.cidr,
                        b.affinity.as_deref().unwrap_or("no node")
                    )));
                }
                Self::check_overlap(pool, &self.list_pools().await?)?;
            }
            match self
                .store
                .txn(vec![
                    guard,
                    Self::put(IpPool::key(&pool.name), pool, Some(rev)),
                ])
                .await
            {
                Err(StoreError::Conflict { .. }) => continue,
                other => return other.map(Revision::version).map_err(Into::into),
            }
        }
        Err(IpamError::Contention {
            what: format!("pool {}", pool.name),
            attempts: RETRIES,
        })
    }

    /// Deletes a pool with no address in use; its empty blocks and their affinities go too.
    pub async fn delete_pool(&self, name: &str) -> Result<(), IpamError> {
        for _ in 0..RETRIES {
            let (pool, rev) = self.get_pool(name).await?;
            let blocks = self.blocks_of_pool(name).await?;
            let used: u32 = blocks.iter().map(|(b, _)| b.used()).sum();
            if used > 0 {
                let example = blocks.iter().find(|(b, _)| b.used() > 0).map(|(b, _)| b);
                let example = example
                    .map(|b| {
                        format!(
                            " (e.g. {} in {})",
                            b.address(*b.slots.keys().next().unwrap_or(&0)),
                            b.cidr
                        )
                    })
                    .unwrap_or_default();
                return Err(IpamError::InUse(format!(
                    "pool {name} has {used} address(es) in use in {} block(s){example}; release them first, or disable the pool to stop new allocations",
                    blocks.len()
                )));
            }
            let (guard, _) = self.pools_guard().await?;
            let mut ops = vec![
                guard,
                Op::Delete {
                    key: IpPool::key(&pool.name),
                    expected: rev,
                },
            ];
            for (b, brev) in &blocks {
                ops.push(Op::Delete {
                    key: block_key(&b.cidr),
                    expected: *brev,
                });
                if let Some(node) = &b.affinity {
                    let key = BlockAffinity::key_of(node, &b.cidr);
                    if let Some(kv) = self.store.get_key(&key).await? {
                        ops.push(Op::Delete {
                            key,
                            expected: kv.version,
                        });
                    }
                }
            }
            // Keep each transaction within the store's limit; a pool with more empty blocks
            // than that is emptied over several rounds (the pool goes last).
            if ops.len() > datastore::contract::MAX_TXN_OPS {
                let mut chunk: Vec<Op> = ops
                    .drain(2..)
                    .take(datastore::contract::MAX_TXN_OPS - 2)
                    .collect();
                chunk.retain(
                    |op| !matches!(op, Op::Delete { key, .. } if key == &IpPool::key(&pool.name)),
                );
                match self.store.txn(chunk).await {
                    Ok(_) | Err(StoreError::Conflict { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            match self.store.txn(ops).await {
                Err(StoreError::Conflict { .. }) => continue,
                other => return other.map(|_| ()).map_err(Into::into),
            }
        }
        Err(IpamError::Contention {
            what: format!("pool {name}"),
            attempts: RETRIES,
        })
    }

    async fn all_blocks(&self) -> Result<Vec<(Block, Version)>, IpamError> {
        self.list(Block::PREFIX).await
    }

    async fn blocks_of_pool(&self, pool: &str) -> Result<Vec<(Block, Version)>, IpamError> {
        Ok(self
            .all_blocks()
            .await?
            .into_iter()
            .filter(|(b, _)| b.pool == pool)
            .collect())
    }

    // ---- nodes (their registration is the datastore's: `datastore::Resources`) ----

    /// Removes a node: its addresses (tunnel address included) and its blocks are released.
    pub async fn delete_node(&self, name: &str) -> Result<(Vec<IpNet>, Vec<IpAddr>), IpamError> {
        let released = self.release_node(name).await?;
        for _ in 0..RETRIES {
            match self.get::<Node>(&Node::key(name)).await? {
                None => return Ok(released),
                Some((_, rev)) => match self.store.delete(Node::kind(), name, rev).await {
                    Err(StoreError::Conflict { .. }) => continue,
                    other => return other.map(|_| released).map_err(Into::into),
                },
            }
        }
        Err(IpamError::Contention {
            what: format!("node {name}"),
            attempts: RETRIES,
        })
    }

    // ---- allocation ----

    /// Allocates addresses for a request; IPv4 and IPv6 together, all or nothing.
    pub async fn auto_assign(
        &self,
        req: &AssignRequest,
    ) -> Result<(Vec<Assigned>, Vec<Assigned>), IpamError> {
        if req.handle.is_empty() {
            return Err(IpamError::InvalidArgument {
                field: "handle",
                reason: "must not be empty".into(),
            });
        }
        if req.node.is_empty() {
            return Err(IpamError::InvalidArgument {
                field: "node",
                reason: "must not be empty".into(),
            });
        }
        if req.num_v4 == 0 && req.num_v6 == 0 {
            return Err(IpamError::InvalidArgument {
                field: "num_ipv4",
                reason: "ask for at least one address".into(),
            });
        }
        let use_ = if req.use_tunnel {
            AllowedUse::Tunnel
        } else {
            AllowedUse::Workload
        };
        let split = |got: Vec<Assigned>| -> (Vec<Assigned>, Vec<Assigned>) {
            got.into_iter().partition(|a| a.address.is_ipv4())
        };
        let lock = self.node_lock(&req.node);
        // Queue, then either another request's holder of the lock serves us, or we get the
        // lock and serve everyone queued.
        let (answer, mut rx) = tokio::sync::oneshot::channel();
        self.queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(req.node.clone())
            .or_default()
            .push(Queued {
                req: req.clone(),
                use_,
                answer,
            });
        let mut told_slow = false;
        let _serial = tokio::select! {
            biased;
            r = &mut rx => match r {
                Ok(Some(got)) => return Ok(split(got)),
                _ => {
                    told_slow = true;
                    lock.lock().await
                }
            },
            g = lock.lock() => g,
        };
        if !told_slow {
            // Our request is still queued until answered: serve the queue until it is.
            while rx.is_empty() && self.serve_queue(&req.node).await {}
            if let Ok(Some(got)) = rx.try_recv() {
                return Ok(split(got));
            }
        }
        if let Some(got) = self.try_fast(req, use_).await? {
            return Ok(split(got));
        }
        self.assign_slow(req, use_).await
    }

    /// The normal path of one request (the caller holds the node's lock): read, then
    /// allocate in an affine block, claim one, or borrow, family by family.
    async fn assign_slow(
        &self,
        req: &AssignRequest,
        use_: AllowedUse,
    ) -> Result<(Vec<Assigned>, Vec<Assigned>), IpamError> {
        let wanted: Vec<(IpFamily, u32)> = IpFamily::ALL
            .into_iter()
            .map(|f| (f, req.wants(f).0))
            .filter(|(_, n)| *n > 0)
            .collect();
        // Read once up front so a request naming a wrong pool fails before anything is written.
        let first = wanted.first().map_or(IpFamily::V4, |(f, _)| *f);
        let view = self.view(&req.node, &req.handle, first).await?;
        for (family, _) in &wanted {
            select_pools(
                &view.pools,
                &view.labels,
                *family,
                req.wants(*family).1,
                use_,
            )?;
        }
        let mut view = Some(view);
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (family, n) in wanted {
            match self
                .assign_family(req, family, n as usize, use_, view.take())
                .await
            {
                Ok(got) if family == IpFamily::V4 => v4 = got,
                Ok(got) => v6 = got,
                Err(e) => {
                    self.undo(&v4).await;
                    return Err(e);
                }
            }
        }
        Ok((v4, v6))
    }

    async fn undo(&self, assigned: &[Assigned]) {
        let releases: Vec<ReleaseRequest> = assigned
            .iter()
            .map(|a| ReleaseRequest {
                address: a.address,
                handle: Some(a.handle.clone()),
                seq: Some(a.seq),
            })
            .collect();
        if let Err(e) = self.release_ips(&releases).await {
            tracing::warn!(error = %e, "could not undo a partial allocation; `ipam gc` will collect it");
        }
    }

    async fn assign_family(
        &self,
        req: &AssignRequest,
        family: IpFamily,
        n: usize,
        use_: AllowedUse,
        mut prefetched: Option<View>,
    ) -> Result<Vec<Assigned>, IpamError> {
        let mut out: Vec<Assigned> = Vec::new();
        if n == 0 {
            return Ok(out);
        }
        let mut attempts = 0;
        while out.len() < n {
            attempts += 1;
            if attempts > RETRIES {
                self.undo(&out).await;
                return Err(IpamError::Contention {
                    what: format!("the blocks of node {}", req.node),
                    attempts: RETRIES,
                });
            }
            let view = match prefetched.take() {
                Some(v) => Ok(v),
                None => self.view(&req.node, &req.handle, family).await,
            };
            let step = match view {
                Ok(view) => self.step(req, family, use_, n - out.len(), view).await,
                Err(e) => Err(e),
            };
            let step = match step {
                Ok(s) => s,
                Err(e) => {
                    self.undo(&out).await;
                    return Err(e);
                }
            };
            match step {
                Step::Allocated(got) => out.extend(got),
                Step::Again => {}
                Step::Exhausted(why) => {
                    self.undo(&out).await;
                    return Err(IpamError::Exhausted(why));
                }
            }
        }
        Ok(out)
    }

    /// One step: allocate in an affine block, or claim a block, or borrow.
    async fn step(
        &self,
        req: &AssignRequest,
        family: IpFamily,
        use_: AllowedUse,
        n: usize,
        view: View,
    ) -> Result<Step, IpamError> {
        let node = req.node.as_str();
        let pools = select_pools(&view.pools, &view.labels, family, req.wants(family).1, use_)?;
        if pools.is_empty() {
            return Ok(Step::Exhausted(format!(
                "no enabled {} pool can serve node {node} for this request",
                family.name()
            )));
        }
        let pools = pools.as_slice();
        let config = &view.config;
        let strict = req.strict_affinity || config.strict_affinity;
        let affinities = &view.affinities;
        let handle = view.handle.clone();
        let in_pools = |cidr: &IpNet| pools.iter().any(|p| p.cidr.contains(&cidr.network()));
        // The confirmed affinity of an affine block with room: its check keeps a fast
        // allocation from using a block that is being released.
        let usable = |b: &Block| -> Option<Op> {
            if b.affinity.as_deref() != Some(node) || b.free_count() == 0 || !in_pools(&b.cidr) {
                return None;
            }
            affinities
                .iter()
                .find(|(a, _)| a.cidr == b.cidr && a.state == AffinityState::Confirmed)
                .map(|(a, rev)| Op::Check {
                    key: BlockAffinity::key_of(node, &a.cidr),
                    expected: Some(*rev),
                })
        };
        let seed = |affinity: Op| {
            let mut checks = view.checks.clone();
            checks.push(affinity);
            (view.pools.clone(), view.labels.clone(), checks)
        };
        // The common case: the block used last still has room.
        if let Some((block, rev)) = view.hinted.clone()
            && let Some(affinity) = usable(&block)
        {
            return self
                .allocate_in(block, Some(rev), n, req, handle, Some(seed(affinity)))
                .await;
        }
        let mine: Vec<Read> = affinities
            .iter()
            .filter(|(a, _)| a.state == AffinityState::Confirmed && in_pools(&a.cidr))
            .map(|(a, _)| Read::Get(block_key(&a.cidr)))
            .collect();
        if !mine.is_empty() {
            let (blocks, _) = self.store.read(mine).await?;
            for kv in blocks.into_iter().filter_map(ReadResult::into_get) {
                let block: Block = decode(&kv.value)?;
                if let Some(affinity) = usable(&block) {
                    return self
                        .allocate_in(
                            block,
                            Some(kv.version),
                            n,
                            req,
                            handle,
                            Some(seed(affinity)),
                        )
                        .await;
                }
            }
        }
        // The limit counts the node's blocks in the pools this request may use, so one
        // family's blocks never use up the other's (as Calico counts them).
        let claimed = affinities.iter().filter(|(a, _)| in_pools(&a.cidr)).count() as u32;
        if claimed < config.max_blocks_per_host {
            let blocks = self.all_blocks().await?;
            let taken: HashSet<IpNet> = blocks.iter().map(|(b, _)| b.cidr).collect();
            for pool in pools {
                if let Some(cidr) = free_block(pool, node, &taken) {
                    // Claimed with its first addresses, in one transaction (`allocate_in`).
                    let block = Block::new(cidr, &pool.name, Some(node), now());
                    let seed = (view.pools.clone(), view.labels.clone(), view.checks.clone());
                    return self
                        .allocate_in(block, None, n, req, handle, Some(seed))
                        .await;
                }
            }
        }
        if !strict {
            let blocks = self.all_blocks().await?;
            for (block, rev) in blocks {
                if in_pools(&block.cidr)
                    && block.free_count() > 0
                    && block.affinity.as_deref() != Some(node)
                {
                    return self
                        .allocate_in(block, Some(rev), n, req, handle, None)
                        .await;
                }
            }
        }
        let why = if claimed >= config.max_blocks_per_host {
            format!(
                "node {node} has reached its limit of {} {} blocks and they are full",
                config.max_blocks_per_host,
                family.name()
            )
        } else {
            format!(
                "the pools {} have no free address for node {node}",
                pools
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Ok(Step::Exhausted(if strict {
            format!("{why} (strict affinity: no borrowing)")
        } else {
            why
        }))
    }

    /// Allocates up to `n` in `block` and records them under the handle, in one transaction.
    /// `rev`: the block's revision as read, or `None` for a new block of `req.node`'s, which
    /// the same transaction claims (see [`Self::claim_ops`]). `handle` is the handle as read
    /// in the same step (`None`: it does not exist yet). `seed` (pools, labels, checks) lets
    /// the next allocation of the node take the fast path.
    async fn allocate_in(
        &self,
        mut block: Block,
        rev: Option<Version>,
        n: usize,
        req: &AssignRequest,
        handle: Option<(Handle, Version)>,
        seed: Option<FastSeed>,
    ) -> Result<Step, IpamError> {
        let got = block.allocate(n, &req.handle, &req.node, &req.attrs);
        if got.is_empty() {
            return Ok(Step::Again);
        }
        let handle_key = Handle::key(&req.handle);
        let (mut handle, hrev) = match handle {
            Some((h, r)) => (h, Some(r)),
            None => (
                Handle {
                    id: req.handle.clone(),
                    ..Handle::default()
                },
                None,
            ),
        };
        handle.add(&block.cidr, got.len() as u32);
        let (claimed, block_ops) = Self::block_ops(&req.node, &block, rev);
        let mut ops = vec![Self::put(handle_key, &handle, hrev)];
        ops.extend(block_ops);
        let written = match self.store.txn(ops).await {
            Ok(r) => r.version(),
            Err(StoreError::Conflict { key, .. }) => {
                if let Some(affinity) = &claimed {
                    self.claim_conflict(&req.node, &block, affinity, &key)
                        .await?;
                }
                return Ok(Step::Again);
            }
            Err(e) => return Err(e.into()),
        };
        let borrowed = block.affinity.as_deref() != Some(req.node.as_str());
        if !borrowed {
            self.set_hint(&req.node, block.cidr);
        }
        if let Some((pools, labels, mut checks)) = seed {
            // A claimed block's affinity was written with it: the fast path checks it there.
            if let Some(affinity) = claimed {
                checks.push(Op::Check {
                    key: affinity,
                    expected: Some(written),
                });
            }
            let fast = Fast {
                pools,
                labels,
                checks,
                block: block.clone(),
                block_rev: written,
            };
            self.fast
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((req.node.clone(), IpFamily::of_net(&block.cidr)), fast);
        }
        Ok(Step::Allocated(
            got.into_iter()
                .map(|(address, seq)| Assigned {
                    address,
                    block: block.cidr,
                    pool: block.pool.clone(),
                    borrowed,
                    handle: req.handle.clone(),
                    seq,
                    attrs: req.attrs.clone(),
                })
                .collect(),
        ))
    }

    /// The ops that write `block` as read at `rev`, or claim it for `node` where it is new
    /// (`None`, [`Self::claim_ops`]); with the claimed affinity's key, to check or to name
    /// the loser of a conflict.
    fn block_ops(node: &str, block: &Block, rev: Option<Version>) -> (Option<String>, Vec<Op>) {
        match rev {
            Some(rev) => (
                None,
                vec![Self::put(block_key(&block.cidr), block, Some(rev))],
            ),
            None => {
                let (key, ops) = Self::claim_ops(node, block);
                (Some(key), ops)
            }
        }
    }

    /// The ops that claim `block` (new, for `node`) in one transaction: the block and its
    /// confirmed affinity, neither of which may exist yet; with the affinity's key. Calico
    /// claims in three steps (affinity pending, block, affinity confirmed) because its
    /// datastore has no transactions over several keys; ours has, so a claim is one commit
    /// and there is no half-done claim to clean up after a crash (and every node's
    /// datastore watch wakes once for it, not three times).
    fn claim_ops(node: &str, block: &Block) -> (String, Vec<Op>) {
        let key = BlockAffinity::key_of(node, &block.cidr);
        let affinity = BlockAffinity {
            node: node.into(),
            cidr: block.cidr,
            state: AffinityState::Confirmed,
        };
        let ops = vec![
            Self::put(block_key(&block.cidr), block, None),
            Self::put(key.clone(), &affinity, None),
        ];
        (key, ops)
    }

    /// A claim's transaction lost on `lost`. On the block, another node (or an earlier claim
    /// of ours) got it first: the caller reads again. On the affinity, the block is not there
    /// but an affinity of ours is: a claim a version with three-step claims left half done,
    /// which [`Self::claim`] finishes.
    async fn claim_conflict(
        &self,
        node: &str,
        block: &Block,
        affinity: &str,
        lost: &str,
    ) -> Result<(), IpamError> {
        if lost == affinity {
            self.claim(node, &block.pool, block.cidr).await?;
        }
        Ok(())
    }

    /// Claims `cidr` for `node`, empty ([`Self::claim_ops`]); an affinity of ours already
    /// there without its block is finished (pending) or left to the caller.
    async fn claim(&self, node: &str, pool: &str, cidr: IpNet) -> Result<(), IpamError> {
        let block = Block::new(cidr, pool, Some(node), now());
        let (key, ops) = Self::claim_ops(node, &block);
        let lost = match self.store.txn(ops).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { key: lost, .. }) => lost,
            Err(e) => return Err(e.into()),
        };
        if lost != key {
            // Another node got the block first.
            return Ok(());
        }
        let Some((a, r)) = self.get::<BlockAffinity>(&key).await? else {
            return Ok(());
        };
        if a.state != AffinityState::Pending {
            return Ok(());
        }
        // A pending claim of ours that did not finish (a crash of an older version): finish it.
        let confirmed = BlockAffinity {
            state: AffinityState::Confirmed,
            ..a
        };
        let ops = vec![
            Self::put(block_key(&cidr), &block, None),
            Self::put(key.clone(), &confirmed, Some(r)),
        ];
        match self.store.txn(ops).await {
            Ok(_) => Ok(()),
            Err(StoreError::Conflict { key: lost, .. }) if lost == block_key(&cidr) => {
                // Another node got the block first: withdraw our claim.
                let _ = self.store.txn(vec![Op::Delete { key, expected: r }]).await;
                Ok(())
            }
            Err(StoreError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Allocates one given address.
    pub async fn assign_ip(
        &self,
        address: IpAddr,
        handle: &str,
        attrs: &BTreeMap<String, String>,
        node: &str,
    ) -> Result<Assigned, IpamError> {
        if handle.is_empty() {
            return Err(IpamError::InvalidArgument {
                field: "handle",
                reason: "must not be empty".into(),
            });
        }
        let pools = self.list_pools().await?;
        let (pool, _) = pools
            .iter()
            .find(|(p, _)| p.cidr.contains(&address))
            .ok_or_else(|| {
                let family = IpFamily::of(address);
                let same: Vec<String> = pools
                    .iter()
                    .filter(|(p, _)| IpFamily::of_net(&p.cidr) == family)
                    .map(|(p, _)| format!("{} {}", p.name, p.cidr))
                    .collect();
                IpamError::InvalidArgument {
                    field: "address",
                    reason: if same.is_empty() {
                        format!(
                            "{address} is an {} address and there is no {} pool",
                            family.name(),
                            family.name()
                        )
                    } else {
                        format!(
                            "{address} is in no {} pool (they are: {})",
                            family.name(),
                            same.join(", ")
                        )
                    },
                }
            })?;
        let cidr = pool
            .block_of(address)
            .expect("the pool contains the address");
        let strict = self.config().await?.strict_affinity;
        for _ in 0..RETRIES {
            // No block yet: this node claims it with the address, in one transaction.
            let (mut block, rev) = match self.get::<Block>(&block_key(&cidr)).await? {
                Some((b, r)) => (b, Some(r)),
                None if pool.disabled => {
                    return Err(IpamError::InvalidArgument {
                        field: "address",
                        reason: format!("pool {} is disabled", pool.name),
                    });
                }
                None => (Block::new(cidr, &pool.name, Some(node), now()), None),
            };
            if strict && block.affinity.as_deref() != Some(node) {
                return Err(IpamError::InvalidArgument {
                    field: "address",
                    reason: format!(
                        "{address} is in block {cidr} of node {} and strict affinity forbids borrowing",
                        block.affinity.as_deref().unwrap_or("none")
                    ),
                });
            }
            let Some(seq) = block.allocate_addr(address, handle, node, attrs) else {
                let holder = block
                    .ordinal(address)
                    .and_then(|o| block.slots.get(&o))
                    .map(|s| s.handle.clone())
                    .unwrap_or_default();
                return Err(IpamError::InUse(format!(
                    "{address} is already allocated (handle {holder})"
                )));
            };
            let handle_key = Handle::key(handle);
            let (mut h, hrev) = match self.get::<Handle>(&handle_key).await? {
                Some((h, r)) => (h, Some(r)),
                None => (
                    Handle {
                        id: handle.into(),
                        ..Handle::default()
                    },
                    None,
                ),
            };
            h.add(&cidr, 1);
            let (claimed, block_ops) = Self::block_ops(node, &block, rev);
            let mut ops = vec![Self::put(handle_key, &h, hrev)];
            ops.extend(block_ops);
            match self.store.txn(ops).await {
                Err(StoreError::Conflict { key, .. }) => {
                    if let Some(affinity) = &claimed {
                        self.claim_conflict(node, &block, affinity, &key).await?;
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
                Ok(_) => {
                    return Ok(Assigned {
                        address,
                        block: cidr,
                        pool: pool.name.clone(),
                        borrowed: block.affinity.as_deref() != Some(node),
                        handle: handle.into(),
                        seq,
                        attrs: attrs.clone(),
                    });
                }
            }
        }
        Err(IpamError::Contention {
            what: format!("block {cidr}"),
            attempts: RETRIES,
        })
    }

    // ---- release ----

    /// The block holding `address`, found through the pools (or by scanning for blocks of
    /// deleted pools).
    async fn block_cidr_of(&self, address: IpAddr) -> Result<Option<IpNet>, IpamError> {
        for (pool, _) in self.list_pools().await? {
            if let Some(cidr) = pool.block_of(address) {
                return Ok(Some(cidr));
            }
        }
        Ok(self
            .all_blocks()
            .await?
            .into_iter()
            .map(|(b, _)| b.cidr)
            .find(|c| c.contains(&address)))
    }

    /// Releases addresses; those already free or guarded by a stale handle or sequence number
    /// are left alone. Returns the addresses freed.
    pub async fn release_ips(&self, releases: &[ReleaseRequest]) -> Result<Vec<IpAddr>, IpamError> {
        let mut by_block: BTreeMap<IpNet, Vec<&ReleaseRequest>> = BTreeMap::new();
        for r in releases {
            if let Some(cidr) = self.block_cidr_of(r.address).await? {
                by_block.entry(cidr).or_default().push(r);
            }
        }
        let mut freed = Vec::new();
        for (cidr, rs) in by_block {
            freed.extend(
                self.release_in_block(cidr, |block, now| {
                    rs.iter()
                        .filter_map(|r| {
                            match block.release(r.address, r.handle.as_deref(), r.seq, now) {
                                Released::Freed { handle } => Some((r.address, handle)),
                                _ => None,
                            }
                        })
                        .collect()
                })
                .await?,
            );
        }
        Ok(freed)
    }

    /// Applies `release` to a fresh copy of the block and writes block and handles together.
    async fn release_in_block(
        &self,
        cidr: IpNet,
        release: impl Fn(&mut Block, u64) -> Vec<(IpAddr, String)>,
    ) -> Result<Vec<IpAddr>, IpamError> {
        for _ in 0..RETRIES {
            let Some((mut block, rev)) = self.get::<Block>(&block_key(&cidr)).await? else {
                return Ok(vec![]);
            };
            let freed = release(&mut block, now());
            if freed.is_empty() {
                return Ok(vec![]);
            }
            let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
            for (_, h) in &freed {
                *counts.entry(h.as_str()).or_default() += 1;
            }
            let mut ops = Vec::new();
            // A block of no node that became empty goes back to the pool at once; so does a
            // node's, with its affinity, where empty blocks have no grace period (in the
            // same transaction: one commit, and no moment with an empty block kept).
            let affinity = match &block.affinity {
                Some(node) if block.is_empty() && self.config().await?.empty_block_grace_s == 0 => {
                    let key = BlockAffinity::key_of(node, &cidr);
                    self.get::<BlockAffinity>(&key)
                        .await?
                        .map(|(_, expected)| Op::Delete { key, expected })
                }
                _ => None,
            };
            if block.is_empty() && (block.affinity.is_none() || affinity.is_some()) {
                ops.push(Op::Delete {
                    key: block_key(&cidr),
                    expected: rev,
                });
                ops.extend(affinity);
            } else {
                ops.push(Self::put(block_key(&cidr), &block, Some(rev)));
            }
            for (h, n) in counts {
                let key = Handle::key(h);
                if let Some((mut handle, hrev)) = self.get::<Handle>(&key).await? {
                    handle.remove(&cidr, n);
                    ops.push(if handle.total() == 0 {
                        Op::Delete {
                            key,
                            expected: hrev,
                        }
                    } else {
                        Self::put(key, &handle, Some(hrev))
                    });
                }
            }
            match self.store.txn(ops).await {
                Ok(_) => return Ok(freed.into_iter().map(|(a, _)| a).collect()),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::Contention {
            what: format!("block {cidr}"),
            attempts: RETRIES,
        })
    }

    /// Releases every address of a handle. An unknown handle releases nothing.
    pub async fn release_by_handle(&self, handle: &str) -> Result<Vec<IpAddr>, IpamError> {
        let Some((h, _)) = self.get::<Handle>(&Handle::key(handle)).await? else {
            return Ok(vec![]);
        };
        let mut freed = Vec::new();
        for cidr in h.blocks.keys() {
            let Ok(cidr) = cidr.parse::<IpNet>() else {
                continue;
            };
            freed.extend(
                self.release_in_block(cidr, |block, now| {
                    let mine: Vec<IpAddr> = block.of_handle(handle).map(|(a, _)| a).collect();
                    mine.into_iter()
                        .filter_map(|a| match block.release(a, Some(handle), None, now) {
                            Released::Freed { handle } => Some((a, handle)),
                            _ => None,
                        })
                        .collect()
                })
                .await?,
            );
        }
        Ok(freed)
    }

    /// The addresses a handle holds.
    pub async fn handle_allocations(&self, handle: &str) -> Result<Vec<Assigned>, IpamError> {
        let Some((h, _)) = self.get::<Handle>(&Handle::key(handle)).await? else {
            return Err(IpamError::NotFound(format!("handle {handle}")));
        };
        let mut out = Vec::new();
        for cidr in h.blocks.keys() {
            let Ok(cidr) = cidr.parse::<IpNet>() else {
                continue;
            };
            if let Some((block, _)) = self.get::<Block>(&block_key(&cidr)).await? {
                for (address, slot) in block.of_handle(handle) {
                    out.push(Assigned {
                        address,
                        block: cidr,
                        pool: block.pool.clone(),
                        borrowed: block.affinity.as_deref() != Some(slot.node.as_str()),
                        handle: handle.into(),
                        seq: slot.seq,
                        attrs: slot.attrs.clone(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// The allocation holding `address`, if any (`bgpctl ipam show --ip`): which handle, and
    /// the attributes the CNI call stored with it (namespace, pod, container).
    pub async fn address_allocation(&self, address: IpAddr) -> Result<Option<Assigned>, IpamError> {
        let Some(cidr) = self.block_cidr_of(address).await? else {
            return Ok(None);
        };
        let Some((block, _)) = self.get::<Block>(&block_key(&cidr)).await? else {
            return Ok(None);
        };
        let Some(slot) = block.ordinal(address).and_then(|o| block.slots.get(&o)) else {
            return Ok(None);
        };
        Ok(Some(Assigned {
            address,
            block: cidr,
            pool: block.pool.clone(),
            borrowed: block.affinity.as_deref() != Some(slot.node.as_str()),
            handle: slot.handle.clone(),
            seq: slot.seq,
            attrs: slot.attrs.clone(),
        }))
    }

    /// Releases a node's claim on a block in one transaction: the affinity goes, and the
    /// block with it (if empty) or it loses its affinity (its remaining addresses become
    /// borrowed ones). Both are compared on their revisions, so an allocation in the block
    /// meanwhile makes it read again. (Calico marks the affinity pending deletion first, for
    /// want of transactions over several keys; an affinity an older version left so marked
    /// is released the same way.)
    async fn release_affinity(
        &self,
        node: &str,
        cidr: IpNet,
        only_if_empty: bool,
    ) -> Result<bool, IpamError> {
        let key = BlockAffinity::key_of(node, &cidr);
        for _ in 0..RETRIES {
            let Some((aff, arev)) = self.get::<BlockAffinity>(&key).await? else {
                return Ok(false);
            };
            let block = self.get::<Block>(&block_key(&cidr)).await?;
            let mut ops = vec![Op::Delete {
                key: key.clone(),
                expected: arev,
            }];
            match block {
                Some((b, brev)) if b.affinity.as_deref() == Some(node) => {
                    if b.is_empty() {
                        ops.push(Op::Delete {
                            key: block_key(&cidr),
                            expected: brev,
                        });
                    } else if only_if_empty {
                        // Addresses came back: keep the block (confirmed again, if an older
                        // version's release had marked it).
                        if aff.state == AffinityState::PendingDeletion {
                            let confirmed = BlockAffinity {
                                state: AffinityState::Confirmed,
                                ..aff
                            };
                            let _ = self
                                .store
                                .txn(vec![Self::put(key, &confirmed, Some(arev))])
                                .await;
                        }
                        return Ok(false);
                    } else {
                        let orphan = Block {
                            affinity: None,
                            seq: b.seq + 1,
                            ..b
                        };
                        ops.push(Self::put(block_key(&cidr), &orphan, Some(brev)));
                    }
                }
                _ => {}
            }
            match self.store.txn(ops).await {
                Ok(_) => return Ok(true),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::Contention {
            what: format!("block {cidr}"),
            attempts: RETRIES,
        })
    }

    /// Releases everything of a node: its addresses, its tunnel address, its blocks.
    pub async fn release_node(&self, node: &str) -> Result<(Vec<IpNet>, Vec<IpAddr>), IpamError> {
        let mut handles = BTreeSet::new();
        for (block, _) in self.all_blocks().await? {
            handles.extend(
                block
                    .slots
                    .values()
                    .filter(|s| s.node == node)
                    .map(|s| s.handle.clone()),
            );
        }
        let mut addresses = Vec::new();
        for h in handles {
            addresses.extend(self.release_by_handle(&h).await?);
        }
        let mut blocks = Vec::new();
        for (aff, _) in self
            .list::<BlockAffinity>(&BlockAffinity::prefix_of(node))
            .await?
        {
            if self.release_affinity(node, aff.cidr, false).await? {
                blocks.push(aff.cidr);
            }
        }
        Ok((blocks, addresses))
    }

    /// Releases the node's handles that are not live (tunnel handles excepted), claims that
    /// never finished, and empty blocks past their grace period. Returns the released handles.
    pub async fn gc(
        &self,
        node: &str,
        live: &HashSet<String>,
        prefix: &str,
        dry_run: bool,
    ) -> Result<Vec<(String, Vec<IpAddr>)>, IpamError> {
        let blocks = self.all_blocks().await?;
        let mut dead: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for (block, _) in &blocks {
            for (&o, slot) in &block.slots {
                if slot.node == node
                    && slot.handle.starts_with(prefix)
                    && !is_tunnel_handle(&slot.handle)
                    && !live.contains(&slot.handle)
                {
                    dead.entry(slot.handle.clone())
                        .or_default()
                        .push(block.address(o));
                }
            }
        }
        if dry_run {
            return Ok(dead.into_iter().collect());
        }
        let mut out = Vec::new();
        for (handle, _) in dead {
            let freed = self.release_by_handle(&handle).await?;
            out.push((handle, freed));
        }
        // Claims that never finished (a crash between the steps of an older version's claim).
        let unfinished: Vec<(BlockAffinity, Version)> = self
            .list::<BlockAffinity>(&BlockAffinity::prefix_of(node))
            .await?
            .into_iter()
            .filter(|(a, _)| a.state != AffinityState::Confirmed)
            .collect();
        let existing: HashSet<IpNet> = if unfinished.is_empty() {
            HashSet::new()
        } else {
            self.all_blocks()
                .await?
                .into_iter()
                .map(|(b, _)| b.cidr)
                .collect()
        };
        for (aff, rev) in unfinished {
            if !existing.contains(&aff.cidr) {
                let key = BlockAffinity::key_of(node, &aff.cidr);
                let _ = self
                    .store
                    .txn(vec![Op::Delete { key, expected: rev }])
                    .await;
            }
        }
        self.reclaim_empty_blocks(node).await?;
        Ok(out)
    }

    /// Gives the node's empty blocks back to the pool once empty for the grace period.
    pub async fn reclaim_empty_blocks(&self, node: &str) -> Result<Vec<IpNet>, IpamError> {
        let grace = self.config().await?.empty_block_grace_s;
        let now = now();
        let mut out = Vec::new();
        for (aff, _) in self
            .list::<BlockAffinity>(&BlockAffinity::prefix_of(node))
            .await?
        {
            // A release an older version marked and did not finish goes on now, grace or not
            // (kept, confirmed again, if the block has addresses).
            let due = |b: &Block| match aff.state {
                AffinityState::Confirmed => {
                    b.emptied_at.is_some_and(|t| t.saturating_add(grace) <= now)
                }
                AffinityState::PendingDeletion => true,
                AffinityState::Pending => false,
            };
            if let Some((b, _)) = self.get::<Block>(&block_key(&aff.cidr)).await?
                && (b.is_empty() || aff.state == AffinityState::PendingDeletion)
                && due(&b)
                && self.release_affinity(node, aff.cidr, true).await?
            {
                out.push(aff.cidr);
            }
        }
        Ok(out)
    }

    // ---- show and check ----

    pub async fn usage(
        &self,
        pool_filter: &str,
    ) -> Result<(Vec<PoolUsage>, Vec<BlockUsage>), IpamError> {
        let pools = self.list_pools().await?;
        let blocks = self.all_blocks().await?;
        let affinities = self.list::<BlockAffinity>(BlockAffinity::PREFIX).await?;
        let mut pool_rows = Vec::new();
        let mut block_rows = Vec::new();
        for (pool, _) in pools.iter().filter(|(p, _)| {
            pool_filter.is_empty() || p.name == pool_filter || p.cidr.to_string() == pool_filter
        }) {
            let mine: Vec<&Block> = blocks
                .iter()
                .map(|(b, _)| b)
                .filter(|b| b.pool == pool.name)
                .collect();
            pool_rows.push(PoolUsage {
                name: pool.name.clone(),
                cidr: pool.cidr,
                size: 1u128 << (pool.cidr.max_prefix_len() - pool.cidr.prefix_len()).min(127),
                used: mine.iter().map(|b| b.used() as u64).sum(),
                blocks: mine.len() as u32,
            });
            for b in mine {
                let state = b.affinity.as_ref().and_then(|n| {
                    affinities
                        .iter()
                        .find(|(a, _)| &a.node == n && a.cidr == b.cidr)
                        .map(|(a, _)| a.state)
                });
                block_rows.push(BlockUsage {
                    cidr: b.cidr,
                    pool: b.pool.clone(),
                    affinity: b.affinity.clone(),
                    state,
                    used: b.used(),
                    free: b.free_count(),
                    borrowed: b.borrowed(),
                });
            }
        }
        Ok((pool_rows, block_rows))
    }

    /// Every allocation has its handle and every handle its allocations; blocks and
    /// affinities agree; no address is both free and allocated.
    pub async fn check(&self) -> Result<CheckReport, IpamError> {
        let blocks = self.all_blocks().await?;
        let handles = self.list::<Handle>(Handle::PREFIX).await?;
        let affinities = self.list::<BlockAffinity>(BlockAffinity::PREFIX).await?;
        let pools = self.list_pools().await?;
        let mut report = CheckReport {
            handles: handles.len() as u64,
            ..CheckReport::default()
        };
        let mut seen: BTreeMap<(String, String), u32> = BTreeMap::new();
        for (b, _) in &blocks {
            report.allocations += b.used() as u64;
            let free: BTreeSet<u32> = b.free.iter().copied().collect();
            if free.len() != b.free.len() {
                report
                    .problems
                    .push(format!("block {}: an address is listed free twice", b.cidr));
            }
            if let Some(o) = b.slots.keys().find(|o| free.contains(o)) {
                report.problems.push(format!(
                    "block {}: {} is both free and allocated",
                    b.cidr,
                    b.address(*o)
                ));
            }
            if let Some(o) = free.iter().chain(b.slots.keys()).find(|o| **o >= b.size()) {
                report.problems.push(format!(
                    "block {}: ordinal {o} is outside its {} addresses",
                    b.cidr,
                    b.size()
                ));
            }
            if free.len() + b.slots.len() != b.size() as usize {
                report.problems.push(format!(
                    "block {}: {} free + {} allocated != {} addresses",
                    b.cidr,
                    free.len(),
                    b.slots.len(),
                    b.size()
                ));
            }
            for slot in b.slots.values() {
                *seen
                    .entry((slot.handle.clone(), b.cidr.to_string()))
                    .or_default() += 1;
            }
            match pools
                .iter()
                .find(|(p, _)| p.cidr.contains(&b.cidr.network()))
            {
                None => report
                    .problems
                    .push(format!("block {} belongs to no pool", b.cidr)),
                Some((p, _)) if p.name != b.pool => report.problems.push(format!(
                    "block {} lies in pool {} ({}) but records pool {}",
                    b.cidr, p.name, p.cidr, b.pool
                )),
                Some((p, _)) if p.block_size != b.cidr.prefix_len() => {
                    report.problems.push(format!(
                        "block {} is not one of pool {}'s /{} blocks",
                        b.cidr, p.name, p.block_size
                    ))
                }
                Some(_) => {}
            }
            if let Some(node) = &b.affinity
                && !affinities
                    .iter()
                    .any(|(a, _)| &a.node == node && a.cidr == b.cidr)
            {
                report.problems.push(format!(
                    "block {} is affine to {node} but has no affinity record",
                    b.cidr
                ));
            }
        }
        // Blocks sorted by network: one that overlaps another contains the next one.
        let mut cidrs: Vec<IpNet> = blocks.iter().map(|(b, _)| b.cidr).collect();
        cidrs.sort();
        for w in cidrs.windows(2) {
            if w[0].contains(&w[1].network()) {
                report.problems.push(format!(
                    "blocks {} and {} overlap: an address in both can be handed out twice",
                    w[0], w[1]
                ));
            }
        }
        for ((handle, cidr), n) in &seen {
            let recorded = handles
                .iter()
                .find(|(h, _)| &h.id == handle)
                .and_then(|(h, _)| h.blocks.get(cidr))
                .copied();
            match recorded {
                None => report.problems.push(format!(
                    "{n} address(es) in {cidr} under handle {handle}, which does not record them"
                )),
                Some(r) if r != *n => report.problems.push(format!(
                    "handle {handle} records {r} address(es) in {cidr}, the block holds {n}"
                )),
                _ => {}
            }
        }
        for (h, _) in &handles {
            for (cidr, n) in &h.blocks {
                if !seen.contains_key(&(h.id.clone(), cidr.clone())) {
                    report.problems.push(format!(
                        "handle {} records {n} address(es) in {cidr}, the block holds none",
                        h.id
                    ));
                }
            }
        }
        for (a, _) in &affinities {
            let block = blocks.iter().find(|(b, _)| b.cidr == a.cidr);
            match (a.state, block) {
                (AffinityState::Confirmed, Some((b, _)))
                    if b.affinity.as_deref() != Some(a.node.as_str()) =>
                {
                    report.problems.push(format!(
                        "affinity of {} to {} but the block is affine to {}",
                        a.node,
                        a.cidr,
                        b.affinity.as_deref().unwrap_or("no node")
                    ));
                }
                (AffinityState::Confirmed, None) => report.problems.push(format!(
                    "confirmed affinity of {} to {} but no such block",
                    a.node, a.cidr
                )),
                (AffinityState::Pending, _) => report.problems.push(format!(
                    "unfinished claim of {} by {} (run ipam gc for that node)",
                    a.cidr, a.node
                )),
                _ => {}
            }
        }
        Ok(report)
    }
}

/// The first unclaimed block of the pool in the node's own order: a walk from a start point
/// hashed from the node name, so nodes spread over the pool and rarely race for one block.
pub fn free_block(pool: &IpPool, node: &str, taken: &HashSet<IpNet>) -> Option<IpNet> {
    let count = pool.block_count();
    let start = fnv1a(node.as_bytes()) as u128 % count;
    // Bounded: a huge IPv6 pool is not walked to its end.
    let limit = count.min(1 << 20);
    (0..limit)
        .map(|i| pool.block_at((start + i) % count))
        .find(|c| !taken.contains(c))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

/// The pools a request may take addresses of one family from: the ones it names (which must
/// exist, be enabled, of the family and allow the use), else every enabled automatic pool of
/// the family whose node selector matches the node's labels.
fn select_pools(
    pools: &[IpPool],
    labels: &BTreeMap<String, String>,
    family: IpFamily,
    named: &[String],
    use_: AllowedUse,
) -> Result<Vec<IpPool>, IpamError> {
    let field = pools_field(family);
    if !named.is_empty() {
        let mut out = Vec::new();
        for n in named {
            let pool = pools
                .iter()
                .find(|p| &p.name == n || p.cidr.to_string() == *n)
                .ok_or_else(|| IpamError::InvalidArgument {
                    field,
                    reason: format!("no pool named {n}"),
                })?;
            let problem = if IpFamily::of_net(&pool.cidr) != family {
                Some(format!(
                    "({}) is an {} pool; {field} takes {} pools only",
                    pool.cidr,
                    IpFamily::of_net(&pool.cidr).name(),
                    family.name()
                ))
            } else if pool.disabled {
                Some("is disabled".to_owned())
            } else if !pool.allows(use_) {
                Some(format!("does not allow {use_:?} addresses"))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(IpamError::InvalidArgument {
                    field,
                    reason: format!("pool {n} {problem}"),
                });
            }
            out.push(pool.clone());
        }
        return Ok(out);
    }
    Ok(pools
        .iter()
        .filter(|p| IpFamily::of_net(&p.cidr) == family && !p.disabled && p.allows(use_))
        .filter(|p| p.assignment_mode == AssignmentMode::Automatic)
        .filter(|p| {
            Selector::parse(&p.node_selector)
                .map(|s| s.matches(labels))
                .unwrap_or(false)
        })
        .cloned()
        .collect())
}
