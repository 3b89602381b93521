//! IPAM against the datastore: pools, block claims, allocation, release, garbage collection
//! and the consistency check (nodes, BGP peers and the like are `datastore::Resources`').
//!
//! Every operation's writes are one description (`crate::steps`): steps on single objects in
//! Calico's order (a claim: affinity pending, block, affinity confirmed; an allocation: the
//! handle, then the block; a release the other way round), each compare-and-swap on the
//! version read. Where the store has the `Atomic` extension they are merged into one
//! transaction (a claim is one commit, with its first addresses); where it has not, they are
//! written one at a time, and what a crash or a lost race between two of them leaves is
//! finished: a claim's or a release's affinity by the node's `reclaim_empty_blocks` (run by
//! GC too), a handle's stray count by the handle's release. A lost race re-reads and
//! retries, a bounded number of times.
//!
//! One `Ipam` serves every request of a store (bgpd keeps one per connection): a node's
//! requests are serialised by its lock and, on a store with the extension, served together
//! from its cached block (`Fast`, group commit) while the store has not changed under it.
//!
//! Why this file is long: every IPAM operation is a read-check-write on the same blocks,
//! affinities and handles; they share the retry loop, the steps and their executor.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::block::{AffinityState, Block, BlockAffinity, Handle, Released, cidr_key};
use crate::error::IpamError;
use datastore::contract::{
    Atomic, Datastore, KeyValue, Kind, Op, Read, ReadResult, StoreError, Version,
};

use crate::steps::{Expected, Step, merge};
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

/// The outcome of one allocation attempt.
enum Attempt {
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

/// What a commit wrote: one transaction's revision (the version of every object it wrote),
/// or each object's version after its last step.
enum Committed {
    Transaction(Version),
    Steps(Vec<(String, Version)>),
}

impl Committed {
    /// The version the commit left the object at `key` at, if it wrote it.
    fn version_of(&self, key: &str) -> Option<Version> {
        match self {
            Committed::Transaction(v) => Some(*v),
            Committed::Steps(written) => written
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| *v),
        }
    }
}

/// The steps of one allocation, and where in them its claim's affinity and its handle are.
struct AllocationSteps {
    steps: Vec<Step>,
    /// The key of the affinity a claim creates.
    claimed: Option<String>,
    /// The index of the handle's step.
    handle_at: usize,
}

impl AllocationSteps {
    /// The id of the handle the steps write.
    fn handle_id(&self) -> &str {
        self.steps
            .get(self.handle_at)
            .and_then(|s| Handle::kind().name_of(s.key()))
            .unwrap_or_default()
    }
}

/// Where a commit lost a compare-and-swap: the object's key, and how many of the steps were
/// written before it (they stay; see `crate::steps`).
#[derive(Debug)]
struct Lost {
    key: String,
    done: usize,
}

/// The name of the object of kind `T` at `key` (or the name prefix of a key prefix).
fn name_in<T: Resource>(key: &str) -> Result<&str, IpamError> {
    T::kind().name_of(key).ok_or_else(|| {
        IpamError::Store(StoreError::Backend(format!(
            "{key} is not where {} objects are kept",
            T::KIND
        )))
    })
}

/// The kind and name of the object stored at `key`, among the kinds IPAM writes.
fn object_at(key: &str) -> Result<(Kind, &str), IpamError> {
    [
        Block::kind(),
        BlockAffinity::kind(),
        Handle::kind(),
        IpPool::kind(),
        IpamConfig::kind(),
        Node::kind(),
    ]
    .into_iter()
    .find_map(|kind| Some((kind, kind.name_of(key)?)))
    .ok_or_else(|| {
        IpamError::Store(StoreError::Backend(format!(
            "{key} is no object IPAM writes"
        )))
    })
}

impl<D: Datastore> Ipam<D> {
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
    #[expect(
        clippy::too_many_lines,
        reason = "one group commit: the cached states taken, checked against every request, allocated and written together or all put back; splitting it would pass the half-taken states around"
    )]
    async fn try_fast_batch(
        &self,
        batch: &[(&AssignRequest, AllowedUse)],
    ) -> Result<Option<Vec<Vec<Assigned>>>, IpamError> {
        // The cache is only as good as its checks, which only a transaction can make.
        if self.store.atomic().is_none() {
            return Ok(None);
        }
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
                if !usable.iter().any(|p| state.block.in_pool(p)) {
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
        let mut block_steps = Vec::with_capacity(states.len());
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
            block_steps.push(Self::put(
                block_key(&block.cidr),
                &*block,
                Some(state.block_rev),
            ));
        }
        // The handles, then the blocks: an allocation's order (see `crate::steps`).
        let mut steps: Vec<Step> = handles
            .iter()
            .map(|h| Self::put(Handle::key(&h.id), h, None))
            .collect();
        steps.extend(block_steps);
        match self.commit(steps, checks).await? {
            Ok(written) => {
                for (_, state) in &mut states {
                    let key = block_key(&state.block.cidr);
                    if let Some(v) = written.version_of(&key) {
                        state.block_rev = v;
                    }
                }
                self.keep_fast(&node, states);
                Ok(Some(got))
            }
            // The store changed: the cached states are stale, the normal path reads again.
            Err(_) => Ok(None),
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
        let answers = self.read_all(reads).await?;
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

    // ---- typed access, and writing an operation's steps ----

    /// The resource of kind `T` stored at `key`, through the core contract.
    async fn get<T: Resource>(&self, key: &str) -> Result<Option<(T, Version)>, IpamError> {
        let name = name_in::<T>(key)?;
        match self.store.get(T::kind(), name).await? {
            Some(o) => Ok(Some((decode(&o.value)?, o.version))),
            None => Ok(None),
        }
    }

    /// The resources of kind `T` whose keys start with `prefix`, through the core contract.
    async fn list<T: Resource>(&self, prefix: &str) -> Result<Vec<(T, Version)>, IpamError> {
        let name_prefix = name_in::<T>(prefix)?;
        self.store
            .list(T::kind(), name_prefix)
            .await?
            .items
            .into_iter()
            .map(|o| Ok((decode(&o.value)?, o.version)))
            .collect()
    }

    /// A step writing `value` at `key`: a create when `rev` is `None`, else an update over
    /// the version read.
    fn put<T: Resource>(key: String, value: &T, rev: Option<Version>) -> Step {
        Step::Put {
            key,
            value: encode(value),
            expected: rev.map_or(Expected::Absent, Expected::Read),
        }
    }

    /// A step writing `value` at `key` over what an earlier step of the same operation wrote.
    fn put_again<T: Resource>(key: String, value: &T) -> Step {
        Step::Put {
            key,
            value: encode(value),
            expected: Expected::Previous,
        }
    }

    /// Several reads: at one revision in one round trip where the store has the `Atomic`
    /// extension, else one object or kind at a time (a key of the extension's own, the pools
    /// guard, reads as absent there).
    async fn read_all(&self, reads: Vec<Read>) -> Result<Vec<ReadResult>, IpamError> {
        if let Some(atomic) = self.store.atomic() {
            return Ok(atomic.read(reads).await?.0);
        }
        let mut out = Vec::with_capacity(reads.len());
        for read in reads {
            out.push(match read {
                Read::Get(key) => ReadResult::Get(match object_at(&key) {
                    Ok((kind, name)) => self.store.get(kind, name).await?.map(|o| KeyValue {
                        key: key.clone(),
                        value: o.value,
                        version: o.version,
                    }),
                    Err(_) => None,
                }),
                Read::List(prefix) => {
                    let (kind, name_prefix) = object_at(&prefix)?;
                    let list = self.store.list(kind, name_prefix).await?;
                    ReadResult::List(
                        list.items
                            .into_iter()
                            .map(|o| KeyValue {
                                key: kind.key(&o.name),
                                value: o.value,
                                version: o.version,
                            })
                            .collect(),
                    )
                }
            });
        }
        Ok(out)
    }

    /// Writes an operation's steps: as one transaction (with `checks`) where the store has
    /// the `Atomic` extension, else one object at a time in their order (`checks` are the
    /// extension's: they guard the fast path, which only runs there). `Err(Lost)` names the
    /// object whose compare-and-swap lost and how many steps were written before it (0 for
    /// a transaction, which wrote nothing).
    async fn commit(
        &self,
        steps: Vec<Step>,
        checks: Vec<Op>,
    ) -> Result<Result<Committed, Lost>, IpamError> {
        if let Some(atomic) = self.store.atomic() {
            let mut ops = merge(&steps).map_err(|e| StoreError::Backend(e.to_string()))?;
            ops.extend(checks);
            return match atomic.txn(ops).await {
                Ok(rev) => Ok(Ok(Committed::Transaction(rev.version()))),
                Err(StoreError::Conflict { key, .. }) => Ok(Err(Lost { key, done: 0 })),
                Err(e) => Err(e.into()),
            };
        }
        let mut written: Vec<(String, Version)> = Vec::new();
        for (done, step) in steps.iter().enumerate() {
            let key = step.key();
            let (kind, name) = object_at(key)?;
            let expected = match step.expected() {
                Expected::Absent => None,
                Expected::Read(v) => Some(v),
                Expected::Previous => Some(
                    written
                        .iter()
                        .rev()
                        .find(|(k, _)| k == key)
                        .map(|(_, v)| *v)
                        .ok_or_else(|| {
                            StoreError::Backend(format!("step on {key} follows no earlier step"))
                        })?,
                ),
            };
            let result = match (step, expected) {
                (Step::Put { value, .. }, None) => {
                    self.store.create(kind, name, value.clone()).await.map(Some)
                }
                (Step::Put { value, .. }, Some(v)) => self
                    .store
                    .update(kind, name, value.clone(), v)
                    .await
                    .map(Some),
                (Step::Delete { .. }, Some(v)) => {
                    self.store.delete(kind, name, v).await.map(|()| None)
                }
                (Step::Delete { .. }, None) => {
                    return Err(StoreError::Backend(format!(
                        "a delete of {key} must name the version it deletes"
                    ))
                    .into());
                }
            };
            match result {
                Ok(Some(v)) => written.push((key.to_owned(), v)),
                Ok(None) => written.retain(|(k, _)| k != key),
                Err(StoreError::Conflict { .. }) => {
                    return Ok(Err(Lost {
                        key: key.to_owned(),
                        done,
                    }));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Ok(Committed::Steps(written)))
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
            let steps = vec![Self::put(CONFIG_KEY.into(), config, rev)];
            if self.commit(steps, vec![]).await?.is_ok() {
                return Ok(());
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

    /// Where the store has the `Atomic` extension, the write that serialises pool changes
    /// (every pool write bumps the guard in its transaction, so two overlapping pools made
    /// at once cannot both pass the overlap check). Without it, as in Calico, the check is
    /// made on the pools just read.
    async fn pools_guard(&self) -> Result<Vec<Op>, IpamError> {
        let Some(atomic) = self.store.atomic() else {
            return Ok(vec![]);
        };
        let current = atomic.get_key(POOLS_GUARD).await?;
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
        Ok(vec![op])
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
            let guard = self.pools_guard().await?;
            let pools = self.list_pools().await?;
            if pools.iter().any(|(p, _)| p.name == pool.name) {
                return Err(IpamError::AlreadyExists(format!("pool {}", pool.name)));
            }
            Self::check_overlap(pool, &pools)?;
            let key = IpPool::key(&pool.name);
            let steps = vec![Self::put(key.clone(), pool, None)];
            if let Ok(written) = self.commit(steps, guard).await?
                && let Some(v) = written.version_of(&key)
            {
                return Ok(v);
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
            let guard = self.pools_guard().await?;
            let (current, rev) = self.get_pool(&pool.name).await?;
            if expected.is_some_and(|e| e != rev) {
                return Err(IpamError::Stale(format!("pool {}", pool.name)));
            }
            if current.cidr != pool.cidr || current.block_size != pool.block_size {
                let blocks = self.blocks_of_pool(&current).await?;
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
            let key = IpPool::key(&pool.name);
            let steps = vec![Self::put(key.clone(), pool, Some(rev))];
            if let Ok(written) = self.commit(steps, guard).await?
                && let Some(v) = written.version_of(&key)
            {
                return Ok(v);
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
            let blocks = self.blocks_of_pool(&pool).await?;
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
            // The blocks first (each as a block's release: affinity pending deletion, block,
            // affinity), the pool last, so a crash leaves no block of a pool that is gone.
            let mut steps = Vec::new();
            for (b, brev) in &blocks {
                steps.extend(self.block_release_steps(b, *brev, None).await?);
            }
            // Keep each transaction within the store's limit; a pool with more empty blocks
            // than that is emptied over several rounds (the pool goes last).
            let limit = datastore::contract::MAX_TXN_OPS - 2;
            if self.store.atomic().is_some() && merge(&steps).map_or(0, |ops| ops.len()) > limit {
                let mut chunk = Vec::new();
                for (b, brev) in blocks.iter().take(limit / 2) {
                    chunk.extend(self.block_release_steps(b, *brev, None).await?);
                }
                self.commit(chunk, vec![]).await?.ok();
                continue;
            }
            steps.push(Step::Delete {
                key: IpPool::key(&pool.name),
                expected: Expected::Read(rev),
            });
            let guard = self.pools_guard().await?;
            if self.commit(steps, guard).await?.is_ok() {
                return Ok(());
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

    /// The steps that take the block at `cidr` (read at `brev`) from its node, in Calico's
    /// order: the affinity marked pending deletion, the block deleted (or, with `keep`,
    /// written as given: without its affinity), the affinity deleted. A crash between them
    /// leaves the affinity pending deletion, which `reclaim_empty_blocks` finishes.
    fn release_block_steps(
        affinity: Option<(&BlockAffinity, Version)>,
        cidr: &IpNet,
        brev: Version,
        keep: Option<&Block>,
    ) -> Vec<Step> {
        let mut steps = Vec::with_capacity(3);
        let marked = affinity.map(|(a, v)| {
            let key = BlockAffinity::key_of(&a.node, cidr);
            let marked = BlockAffinity {
                state: AffinityState::PendingDeletion,
                ..a.clone()
            };
            steps.push(Self::put(key.clone(), &marked, Some(v)));
            key
        });
        steps.push(match keep {
            None => Step::Delete {
                key: block_key(cidr),
                expected: Expected::Read(brev),
            },
            Some(b) => Self::put(block_key(cidr), b, Some(brev)),
        });
        if let Some(key) = marked {
            steps.push(Step::Delete {
                key,
                expected: Expected::Previous,
            });
        }
        steps
    }

    /// [`Self::release_block_steps`] for `block`, with its node's affinity as stored now.
    async fn block_release_steps(
        &self,
        block: &Block,
        brev: Version,
        keep: Option<&Block>,
    ) -> Result<Vec<Step>, IpamError> {
        let affinity = match &block.affinity {
            Some(node) => {
                self.get::<BlockAffinity>(&BlockAffinity::key_of(node, &block.cidr))
                    .await?
            }
            None => None,
        };
        Ok(Self::release_block_steps(
            affinity.as_ref().map(|(a, v)| (a, *v)),
            &block.cidr,
            brev,
            keep,
        ))
    }

    async fn blocks_of_pool(&self, pool: &IpPool) -> Result<Vec<(Block, Version)>, IpamError> {
        Ok(self
            .all_blocks()
            .await?
            .into_iter()
            .filter(|(b, _)| b.in_pool(pool))
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
                Attempt::Allocated(got) => out.extend(got),
                Attempt::Again => {}
                Attempt::Exhausted(why) => {
                    self.undo(&out).await;
                    return Err(IpamError::Exhausted(why));
                }
            }
        }
        Ok(out)
    }

    /// One step: allocate in an affine block, or claim a block, or borrow.
    #[expect(
        clippy::too_many_lines,
        reason = "Calico's order of choices (the hinted block, the node's blocks, a new claim, borrowing) read top to bottom, each falling through to the next"
    )]
    async fn step(
        &self,
        req: &AssignRequest,
        family: IpFamily,
        use_: AllowedUse,
        n: usize,
        view: View,
    ) -> Result<Attempt, IpamError> {
        let node = req.node.as_str();
        let pools = select_pools(&view.pools, &view.labels, family, req.wants(family).1, use_)?;
        if pools.is_empty() {
            return Ok(Attempt::Exhausted(format!(
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
            let blocks = self.read_all(mine).await?;
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
        Ok(Attempt::Exhausted(if strict {
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
    ) -> Result<Attempt, IpamError> {
        let before = block.clone();
        let got = block.allocate(n, &req.handle, &req.node, &req.attrs);
        if got.is_empty() {
            return Ok(Attempt::Again);
        }
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
        let planned = Self::allocation_steps(&req.node, &before, &block, rev, &handle, hrev);
        let written = match self.commit(planned.steps.clone(), vec![]).await? {
            Ok(w) => w,
            Err(lost) => {
                self.after_lost_allocation(&req.node, &block, &planned, &lost, got.len())
                    .await?;
                return Ok(Attempt::Again);
            }
        };
        let borrowed = block.affinity.as_deref() != Some(req.node.as_str());
        if !borrowed {
            self.set_hint(&req.node, block.cidr);
        }
        let block_written = written.version_of(&block_key(&block.cidr));
        if let (Some((pools, labels, mut checks)), Some(block_rev), Some(_)) =
            (seed, block_written, self.store.atomic())
        {
            // A claimed block's affinity was written with it: the fast path checks it there.
            if let Some(affinity) = planned.claimed {
                checks.push(Op::Check {
                    expected: written.version_of(&affinity),
                    key: affinity,
                });
            }
            let fast = Fast {
                pools,
                labels,
                checks,
                block: block.clone(),
                block_rev,
            };
            self.fast
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((req.node.clone(), IpFamily::of_net(&block.cidr)), fast);
        }
        Ok(Attempt::Allocated(
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

    /// The steps of an allocation in `after` (`before` as read at `rev`; or, with `rev`
    /// `None`, a new block that `node` claims first, [`Self::claim_steps`]): the handle, then
    /// the block, as Calico writes them. On a store with the extension a claim and its first
    /// addresses are one commit: the block is created holding them, its affinity confirmed.
    fn allocation_steps(
        node: &str,
        before: &Block,
        after: &Block,
        rev: Option<Version>,
        handle: &Handle,
        hrev: Option<Version>,
    ) -> AllocationSteps {
        let handle_step = Self::put(Handle::key(&handle.id), handle, hrev);
        let key = block_key(&after.cidr);
        match rev {
            Some(rev) => AllocationSteps {
                steps: vec![handle_step, Self::put(key, after, Some(rev))],
                claimed: None,
                handle_at: 0,
            },
            None => {
                let (affinity, mut steps) = Self::claim_steps(node, before);
                let handle_at = steps.len();
                steps.push(handle_step);
                steps.push(Self::put_again(key, after));
                AllocationSteps {
                    steps,
                    claimed: Some(affinity),
                    handle_at,
                }
            }
        }
    }

    /// The steps that claim `block` (new, empty) for `node`, in Calico's order: the affinity
    /// pending, the block, the affinity confirmed; with the affinity's key. On a store with
    /// the extension they merge into one commit (every node's watch wakes once for it); one
    /// at a time, a crash after the first leaves a pending affinity without its block, which
    /// the node's next claim of it finishes and GC removes.
    fn claim_steps(node: &str, block: &Block) -> (String, Vec<Step>) {
        let key = BlockAffinity::key_of(node, &block.cidr);
        let pending = BlockAffinity {
            node: node.into(),
            cidr: block.cidr,
            state: AffinityState::Pending,
        };
        let confirmed = BlockAffinity {
            state: AffinityState::Confirmed,
            ..pending.clone()
        };
        let steps = vec![
            Self::put(key.clone(), &pending, None),
            Self::put(block_key(&block.cidr), block, None),
            Self::put_again(key.clone(), &confirmed),
        ];
        (key, steps)
    }

    /// After an allocation's steps lost on `lost`: what the steps written before it leave is
    /// put right. The handle's count (written, its block's write lost) is taken back; a claim
    /// that lost its block to another node withdraws its pending affinity; a claim that found
    /// an affinity of ours without its block finishes it ([`Self::claim`]).
    async fn after_lost_allocation(
        &self,
        node: &str,
        block: &Block,
        planned: &AllocationSteps,
        lost: &Lost,
        n: usize,
    ) -> Result<(), IpamError> {
        if lost.done > planned.handle_at {
            self.take_back(&block.cidr, planned.handle_id(), n as u32)
                .await;
        }
        if let Some(affinity) = &planned.claimed {
            if lost.key == *affinity && lost.done == 0 {
                self.claim(node, &block.pool, block.cidr).await?;
            } else if lost.key == block_key(&block.cidr) && lost.done == 1 {
                self.settle_claim(node, block.cidr).await?;
            } else if lost.key == *affinity && lost.done == 2 {
                // The block is ours, its affinity changed meanwhile (confirmed by another of
                // the node's claims, or a pending one cleared away): make it confirmed.
                self.settle_claim(node, block.cidr).await?;
            }
        }
        Ok(())
    }

    /// Takes `n` addresses in `cidr` back from a handle's count (best effort: what stays is
    /// what `ipam check` reports and GC puts right).
    async fn take_back(&self, cidr: &IpNet, handle: &str, n: u32) {
        let key = Handle::key(handle);
        for _ in 0..RETRIES {
            let Ok(Some((mut h, v))) = self.get::<Handle>(&key).await else {
                return;
            };
            h.remove(cidr, n);
            let step = if h.total() == 0 {
                Step::Delete {
                    key: key.clone(),
                    expected: Expected::Read(v),
                }
            } else {
                Self::put(key.clone(), &h, Some(v))
            };
            match self.commit(vec![step], vec![]).await {
                Ok(Ok(_)) => return,
                Ok(Err(_)) => continue,
                Err(e) => {
                    tracing::warn!(handle, error = %e, "cannot take back a handle's count; `ipam gc` will");
                    return;
                }
            }
        }
    }

    /// Deletes `node`'s affinity to `cidr` if it is still pending (a claim that lost the
    /// block).
    async fn withdraw_pending(&self, node: &str, cidr: IpNet) -> Result<(), IpamError> {
        let key = BlockAffinity::key_of(node, &cidr);
        if let Some((a, v)) = self.get::<BlockAffinity>(&key).await?
            && a.state == AffinityState::Pending
        {
            let step = Step::Delete {
                key,
                expected: Expected::Read(v),
            };
            self.commit(vec![step], vec![]).await?.ok();
        }
        Ok(())
    }

    /// Claims `cidr` for `node`, empty ([`Self::claim_steps`]). An affinity of ours already
    /// there without its block (a claim a crash left half done) is finished: the block
    /// created, the affinity confirmed; or withdrawn when another node has the block.
    async fn claim(&self, node: &str, pool: &str, cidr: IpNet) -> Result<(), IpamError> {
        let block = Block::new(cidr, pool, Some(node), now());
        let (key, steps) = Self::claim_steps(node, &block);
        let lost = match self.commit(steps, vec![]).await? {
            Ok(_) => return Ok(()),
            Err(lost) => lost,
        };
        if lost.key != key || lost.done > 0 {
            // The block is there (after our pending affinity, one step at a time).
            return self.settle_claim(node, cidr).await;
        }
        let Some((a, r)) = self.get::<BlockAffinity>(&key).await? else {
            return Ok(());
        };
        if a.state != AffinityState::Pending {
            return Ok(());
        }
        if self.get::<Block>(&block_key(&cidr)).await?.is_some() {
            return self.settle_claim(node, cidr).await;
        }
        // A pending claim of ours that did not finish: the block, then the affinity confirmed.
        let confirmed = BlockAffinity {
            state: AffinityState::Confirmed,
            ..a
        };
        let steps = vec![
            Self::put(block_key(&cidr), &block, None),
            Self::put(key.clone(), &confirmed, Some(r)),
        ];
        match self.commit(steps, vec![]).await? {
            Ok(_) => Ok(()),
            Err(lost) if lost.key == block_key(&cidr) => self.settle_claim(node, cidr).await,
            Err(_) => Ok(()),
        }
    }

    /// After a claim of `cidr` by `node` found its block there: if it is the node's (made by
    /// another of the node's claims: another process of the node, or a claim a crash left
    /// half done that this one finished), the claim is the node's all the same and its
    /// affinity is made confirmed; if it is another node's, the node's pending affinity goes.
    /// (Withdrawing it from a block of the node's own would leave the block without its
    /// affinity record.)
    async fn settle_claim(&self, node: &str, cidr: IpNet) -> Result<(), IpamError> {
        match self.get::<Block>(&block_key(&cidr)).await? {
            Some((b, _)) if b.affinity.as_deref() == Some(node) => {
                self.ensure_confirmed(node, cidr).await
            }
            Some(_) => self.withdraw_pending(node, cidr).await,
            None => Ok(()),
        }
    }

    /// Makes `node`'s affinity to its block `cidr` confirmed: created if missing, confirmed if
    /// pending (one pending deletion is a release under way, left alone).
    async fn ensure_confirmed(&self, node: &str, cidr: IpNet) -> Result<(), IpamError> {
        let key = BlockAffinity::key_of(node, &cidr);
        let confirmed = BlockAffinity {
            node: node.into(),
            cidr,
            state: AffinityState::Confirmed,
        };
        for _ in 0..RETRIES {
            let step = match self.get::<BlockAffinity>(&key).await? {
                None => Self::put(key.clone(), &confirmed, None),
                Some((a, v)) if a.state == AffinityState::Pending => {
                    Self::put(key.clone(), &confirmed, Some(v))
                }
                Some(_) => return Ok(()),
            };
            if self.commit(vec![step], vec![]).await?.is_ok() {
                return Ok(());
            }
        }
        Err(IpamError::Contention {
            what: format!("the affinity of {node} to {cidr}"),
            attempts: RETRIES,
        })
    }

    /// Allocates one given address.
    #[expect(
        clippy::too_many_lines,
        reason = "the address's refusals (no pool, disabled pool, strict affinity, in use) each with its own message, then one allocation's steps"
    )]
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
        // A claim's steps are not interleaved with the node's other claims or their GC.
        let lock = self.node_lock(node);
        let _serial = lock.lock().await;
        for _ in 0..RETRIES {
            // No block yet: this node claims it with the address.
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
            let before = block.clone();
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
            let planned = Self::allocation_steps(node, &before, &block, rev, &h, hrev);
            match self.commit(planned.steps.clone(), vec![]).await? {
                Err(lost) => {
                    self.after_lost_allocation(node, &block, &planned, &lost, 1)
                        .await?;
                    continue;
                }
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
            // A block of no node that became empty goes back to the pool at once; so does a
            // node's, with its affinity, where empty blocks have no grace period (in the
            // same commit where the store has transactions: no moment with an empty block
            // kept).
            let affinity = match &block.affinity {
                Some(node) if block.is_empty() && self.config().await?.empty_block_grace_s == 0 => {
                    self.get::<BlockAffinity>(&BlockAffinity::key_of(node, &cidr))
                        .await?
                }
                _ => None,
            };
            // The block first, then the handles: a release's order (see `crate::steps`).
            let mut steps = if block.is_empty() && (block.affinity.is_none() || affinity.is_some())
            {
                Self::release_block_steps(affinity.as_ref().map(|(a, v)| (a, *v)), &cidr, rev, None)
            } else {
                vec![Self::put(block_key(&cidr), &block, Some(rev))]
            };
            let block_steps = steps.len();
            let mut handles = Vec::new();
            for (h, n) in counts {
                let key = Handle::key(h);
                if let Some((mut handle, hrev)) = self.get::<Handle>(&key).await? {
                    handle.remove(&cidr, n);
                    steps.push(if handle.total() == 0 {
                        Step::Delete {
                            key,
                            expected: Expected::Read(hrev),
                        }
                    } else {
                        Self::put(key, &handle, Some(hrev))
                    });
                    handles.push((h, n));
                }
            }
            let freed_addresses = || freed.iter().map(|(a, _)| *a).collect();
            match self.commit(steps, vec![]).await? {
                Ok(_) => return Ok(freed_addresses()),
                Err(lost) if lost.done >= block_steps => {
                    // One step at a time, the block's went through: the addresses are free.
                    // The handles whose steps did not are taken back on their own.
                    for (h, n) in handles.iter().skip(lost.done - block_steps) {
                        self.take_back(&cidr, h, *n).await;
                    }
                    return Ok(freed_addresses());
                }
                Err(_) => continue,
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
        // As a rule the handle recorded just what was freed, and the last release deleted
        // it; only when it recorded more is it read again and put right.
        if freed.len() as u64 != u64::from(h.total()) {
            self.settle_handle(handle).await?;
        }
        Ok(freed)
    }

    /// Makes a released handle record what its blocks hold of it: nothing, as a rule, so it
    /// goes. What it may still record: counts whose addresses a write never reached (a crash
    /// or a lost race between an allocation's handle step and its block step).
    async fn settle_handle(&self, handle: &str) -> Result<(), IpamError> {
        let key = Handle::key(handle);
        for _ in 0..RETRIES {
            let Some((mut h, v)) = self.get::<Handle>(&key).await? else {
                return Ok(());
            };
            let mut held = BTreeMap::new();
            for cidr in h.blocks.keys() {
                let Ok(net) = cidr.parse::<IpNet>() else {
                    continue;
                };
                if let Some((b, _)) = self.get::<Block>(&block_key(&net)).await? {
                    let n = b.of_handle(handle).count() as u32;
                    if n > 0 {
                        held.insert(cidr.clone(), n);
                    }
                }
            }
            if held == h.blocks {
                return Ok(());
            }
            h.blocks = held;
            let step = if h.total() == 0 {
                Step::Delete {
                    key: key.clone(),
                    expected: Expected::Read(v),
                }
            } else {
                Self::put(key.clone(), &h, Some(v))
            };
            if self.commit(vec![step], vec![]).await?.is_ok() {
                return Ok(());
            }
        }
        Err(IpamError::Contention {
            what: format!("handle {handle}"),
            attempts: RETRIES,
        })
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
            let steps = match block {
                Some((b, brev)) if b.affinity.as_deref() == Some(node) => {
                    if b.is_empty() {
                        Self::release_block_steps(Some((&aff, arev)), &cidr, brev, None)
                    } else if only_if_empty {
                        // Addresses came back: keep the block (confirmed again, if an older
                        // version's release had marked it).
                        if aff.state == AffinityState::PendingDeletion {
                            let confirmed = BlockAffinity {
                                state: AffinityState::Confirmed,
                                ..aff
                            };
                            let steps = vec![Self::put(key, &confirmed, Some(arev))];
                            self.commit(steps, vec![]).await?.ok();
                        }
                        return Ok(false);
                    } else {
                        let orphan = Block {
                            affinity: None,
                            seq: b.seq + 1,
                            ..b.clone()
                        };
                        Self::release_block_steps(Some((&aff, arev)), &cidr, brev, Some(&orphan))
                    }
                }
                // No block of ours there: only the affinity goes.
                _ => vec![Step::Delete {
                    key: key.clone(),
                    expected: Expected::Read(arev),
                }],
            };
            if self.commit(steps, vec![]).await?.is_ok() {
                return Ok(true);
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

    /// The addresses `node` holds for Kubernetes pods' primary interfaces (their `namespace`
    /// and `pod` attributes, `ifname` eth0 or none), for the Kubernetes datastore's GC
    /// (`crate::leaks`).
    pub async fn pod_addresses_on(
        &self,
        node: &str,
    ) -> Result<Vec<crate::leaks::PodAddress>, IpamError> {
        let mut out = Vec::new();
        for (block, _) in self.all_blocks().await? {
            for (&o, slot) in &block.slots {
                if slot.node != node || is_tunnel_handle(&slot.handle) {
                    continue;
                }
                // A second network's address is not in the Pod's status: never judged.
                if slot.attrs.get("ifname").is_some_and(|i| i != "eth0") {
                    continue;
                }
                if let (Some(namespace), Some(pod)) =
                    (slot.attrs.get("namespace"), slot.attrs.get("pod"))
                {
                    out.push(crate::leaks::PodAddress {
                        handle: slot.handle.clone(),
                        address: block.address(o),
                        namespace: namespace.clone(),
                        pod: pod.clone(),
                        pod_uid: slot.attrs.get("pod_uid").cloned(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// The nodes that have block affinities.
    pub async fn nodes_with_affinities(&self) -> Result<BTreeSet<String>, IpamError> {
        Ok(self
            .list::<BlockAffinity>(BlockAffinity::PREFIX)
            .await?
            .into_iter()
            .map(|(a, _)| a.node)
            .collect())
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
        // Handles that record addresses in the node's blocks, none of which any block holds:
        // an allocation's handle step that landed after its pod's DEL (a writer killed with
        // that request in flight: the Kubernetes API still makes it). No slot names them, so
        // only their record finds them; releasing settles them.
        let held: HashSet<&str> = blocks
            .iter()
            .flat_map(|(b, _)| b.slots.values().map(|s| s.handle.as_str()))
            .collect();
        let the_nodes: HashSet<String> = blocks
            .iter()
            .filter(|(b, _)| b.affinity.as_deref() == Some(node))
            .map(|(b, _)| b.cidr.to_string())
            .collect();
        for (handle, _) in self.list::<Handle>(Handle::PREFIX).await? {
            if handle.id.starts_with(prefix)
                && !is_tunnel_handle(&handle.id)
                && !live.contains(&handle.id)
                && !held.contains(handle.id.as_str())
                && handle.blocks.keys().any(|b| the_nodes.contains(b))
            {
                dead.entry(handle.id).or_default();
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
        self.reclaim_empty_blocks(node).await?;
        Ok(out)
    }

    /// Finishes the node's claims and releases that stopped between their steps (a crash,
    /// or a version of old): a pending affinity whose block is the node's is confirmed; a
    /// pending one whose block is not there or is another node's (a claim that lost the
    /// block), and one pending deletion whose block is gone, go. (One pending deletion whose
    /// block is still the node's is `reclaim_empty_blocks`'.) Under the node's lock, so no
    /// claim of this process is between its steps meanwhile.
    async fn finish_claims(&self, node: &str) -> Result<(), IpamError> {
        let lock = self.node_lock(node);
        let _serial = lock.lock().await;
        let unfinished: Vec<(BlockAffinity, Version)> = self
            .list::<BlockAffinity>(&BlockAffinity::prefix_of(node))
            .await?
            .into_iter()
            .filter(|(a, _)| a.state != AffinityState::Confirmed)
            .collect();
        for (aff, v) in unfinished {
            let key = BlockAffinity::key_of(node, &aff.cidr);
            let block = self.get::<Block>(&block_key(&aff.cidr)).await?;
            let ours = block.is_some_and(|(b, _)| b.affinity.as_deref() == Some(node));
            if aff.state == AffinityState::PendingDeletion && ours {
                continue;
            }
            let step = if aff.state == AffinityState::Pending && ours {
                let confirmed = BlockAffinity {
                    state: AffinityState::Confirmed,
                    ..aff
                };
                Self::put(key, &confirmed, Some(v))
            } else {
                Step::Delete {
                    key,
                    expected: Expected::Read(v),
                }
            };
            self.commit(vec![step], vec![]).await?.ok();
        }
        Ok(())
    }

    /// Gives the node's empty blocks back to the pool once empty for the grace period (and
    /// finishes the claims and releases that stopped between their steps).
    pub async fn reclaim_empty_blocks(&self, node: &str) -> Result<Vec<IpNet>, IpamError> {
        self.finish_claims(node).await?;
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
                .filter(|b| b.in_pool(pool))
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
                    pool: pool.name.clone(),
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
    #[expect(
        clippy::too_many_lines,
        reason = "one pass over blocks, handles and affinities, one rule after the other, each naming the problem it finds"
    )]
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
                Some((p, _)) if !b.in_pool(p) => report.problems.push(format!(
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
                (AffinityState::PendingDeletion, _) => report.problems.push(format!(
                    "unfinished release of {} by {} (run ipam gc for that node)",
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
