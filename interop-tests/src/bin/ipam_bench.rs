//! `ipam-bench`: IPAM's benchmark and load generator.
//!
//! - `ipam-bench bench [--smoke]`: one table per backend (SQLite, a real etcd on loopback):
//!   allocations/s and releases/s with 1 and 8 concurrent clients on one node, each next to
//!   the backend's raw conditional-update rate; p50/p99 latency of one allocation; the time
//!   for 200 pods' allocations on one node.
//! - `ipam-bench worker --store SPEC --node N --count C --prefix P [--release]
//!   [--crash-after-writes K]`: allocates C addresses, one per handle `P-<i>`, printing
//!   `assigned <handle> <address>` once each is stored (and with `--release` gives each back,
//!   printing `released <handle>`). With `--crash-after-writes K` the process aborts right
//!   after its K-th write to the store (counted one object at a time: the store's extension
//!   is hidden), as a `kill -9` between two steps would stop it. For the multi-process and
//!   crash tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use datastore::contract::{
    Datastore, Kind, Object, ObjectList, ObjectWatch, Result as StoreResult, Version,
};
use datastore::etcd::EtcdOptions;
use datastore::model::IpPool;
use datastore::sqlite::{SqliteOptions, SqliteStore};
use interop_tests::{bench, lab};
use ipam::IpamError;
use ipam::allocator::{AssignRequest, Ipam};

#[derive(Parser)]
#[command(about = "margay IPAM benchmark and load generator")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the benchmark table.
    Bench {
        #[arg(long)]
        smoke: bool,
    },
    /// Allocate addresses from a store until done (or killed).
    Worker {
        /// sqlite:PATH or etcd:URL[,URL...]
        #[arg(long)]
        store: String,
        #[arg(long)]
        node: String,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        prefix: String,
        /// Release each address after allocating it.
        #[arg(long)]
        release: bool,
        /// Abort the process right after this many writes (0: before the first).
        #[arg(long)]
        crash_after_writes: Option<usize>,
    },
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let result = rt.block_on(async {
        match args.command {
            Command::Bench { smoke } => bench(smoke).await,
            Command::Worker {
                store,
                node,
                count,
                prefix,
                release,
                crash_after_writes,
            } => {
                let store = lab::open_store(&store).await?;
                let work = Work {
                    node: &node,
                    count,
                    prefix: &prefix,
                    release,
                };
                match crash_after_writes {
                    None => worker(Ipam::new(store), work).await,
                    Some(left) => {
                        let store = CrashAfter {
                            inner: store,
                            left: std::sync::atomic::AtomicUsize::new(left),
                        };
                        if left == 0 {
                            std::process::abort();
                        }
                        worker(Ipam::new(store), work).await
                    }
                }
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipam-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn request(handle: String, node: &str) -> AssignRequest {
    AssignRequest {
        handle,
        node: node.into(),
        num_v4: 1,
        ..Default::default()
    }
}

/// What a worker does.
struct Work<'a> {
    node: &'a str,
    count: usize,
    prefix: &'a str,
    release: bool,
}

async fn worker<D: Datastore>(ipam: Ipam<D>, work: Work<'_>) -> Result<(), IpamError> {
    use std::io::Write;
    for i in 0..work.count {
        let handle = format!("{}-{i}", work.prefix);
        let (v4, _) = ipam
            .auto_assign(&request(handle.clone(), work.node))
            .await?;
        println!("assigned {handle} {}", v4[0].address);
        if work.release {
            ipam.release_by_handle(&handle).await?;
            println!("released {handle}");
        }
        // Printed before the next write: what the test reads is what was acknowledged.
        let _ = std::io::stdout().flush();
    }
    Ok(())
}

/// A store that aborts the process right after its `left`-th write, with the extension
/// hidden so that every write is one object's (one step of an IPAM operation).
struct CrashAfter {
    inner: datastore::Store,
    left: std::sync::atomic::AtomicUsize,
}

impl CrashAfter {
    /// Passes a write's result on, aborting once the `left`-th write went through.
    fn wrote<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        if result.is_ok() && self.left.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            std::process::abort();
        }
        result
    }
}

impl Datastore for CrashAfter {
    type Atomic = datastore::Store;

    async fn get(&self, kind: Kind, name: &str) -> StoreResult<Option<Object>> {
        self.inner.get(kind, name).await
    }
    async fn list(&self, kind: Kind, prefix: &str) -> StoreResult<ObjectList> {
        self.inner.list(kind, prefix).await
    }
    async fn create(&self, kind: Kind, name: &str, value: Vec<u8>) -> StoreResult<Version> {
        self.wrote(self.inner.create(kind, name, value).await)
    }
    async fn update(
        &self,
        kind: Kind,
        name: &str,
        value: Vec<u8>,
        expected: Version,
    ) -> StoreResult<Version> {
        self.wrote(self.inner.update(kind, name, value, expected).await)
    }
    async fn delete(&self, kind: Kind, name: &str, expected: Version) -> StoreResult<()> {
        self.wrote(self.inner.delete(kind, name, expected).await)
    }
    async fn watch(&self, kind: Kind, from: Version) -> StoreResult<ObjectWatch> {
        self.inner.watch(kind, from).await
    }
    fn atomic(&self) -> Option<&datastore::Store> {
        None
    }
    fn describe(&self) -> String {
        format!("{} (aborts after writes)", self.inner.describe())
    }
}

struct Rates {
    alloc: f64,
    release: f64,
}

/// `clients` concurrent tasks allocating `total` addresses on one node, then releasing them.
async fn alloc_release<D: Datastore>(
    ipam: Arc<Ipam<D>>,
    run: &str,
    clients: usize,
    total: usize,
) -> Result<(Rates, Vec<Duration>), IpamError> {
    let each = total / clients;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (ipam, run) = (ipam.clone(), run.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(each);
            for i in 0..each {
                let t = Instant::now();
                ipam.auto_assign(&request(format!("{run}.c{c}-{i}"), "bench-node"))
                    .await?;
                latencies.push(t.elapsed());
            }
            Ok::<_, IpamError>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("the task does not panic")?);
    }
    let alloc = (each * clients) as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (ipam, run) = (ipam.clone(), run.to_owned());
        tasks.push(tokio::spawn(async move {
            for i in 0..each {
                ipam.release_by_handle(&format!("{run}.c{c}-{i}")).await?;
            }
            Ok::<_, IpamError>(())
        }));
    }
    for t in tasks {
        t.await.expect("the task does not panic")?;
    }
    let release = (each * clients) as f64 / started.elapsed().as_secs_f64();
    Ok((Rates { alloc, release }, latencies))
}

async fn measure<D: Datastore + Clone>(
    store: D,
    name: &str,
    n: usize,
    rows: &mut Vec<String>,
) -> Result<(), IpamError> {
    let mut raw = Vec::new();
    for writers in [1, 8] {
        raw.push(
            bench::cas_updates(
                Arc::new(store.clone()),
                &format!("/bench/raw{writers}/"),
                writers,
                n,
            )
            .await?,
        );
    }
    let ipam = Arc::new(Ipam::new(store));
    ipam.create_pool(&IpPool::new(
        "bench",
        "10.200.0.0/16".parse().expect("constant"),
    ))
    .await?;
    // 200 pods on one node, one after the other, from a fresh node.
    let started = Instant::now();
    for i in 0..200 {
        ipam.auto_assign(&request(format!("pods.{i}"), "pods-node"))
            .await?;
    }
    let pods200 = started.elapsed();
    for (i, clients) in [1, 8].into_iter().enumerate() {
        let (rates, mut lat) =
            alloc_release(ipam.clone(), &format!("run{clients}"), clients, n).await?;
        let p50 = bench::percentile(&mut lat, 0.5);
        let p99 = bench::percentile(&mut lat, 0.99);
        rows.push(format!(
            "{:<20} {:>7} {:>10.0} {:>9.2} {:>10.0} {:>10.0} {:>10} {:>10} {:>12}",
            name,
            clients,
            rates.alloc,
            rates.alloc / raw[i],
            rates.release,
            raw[i],
            bench::ms(p50),
            bench::ms(p99),
            if i == 0 {
                bench::ms(pods200)
            } else {
                String::new()
            },
        ));
    }
    Ok(())
}

async fn bench(smoke: bool) -> Result<(), IpamError> {
    // 1,200 addresses fit in one node's 20 blocks of 64.
    let n = if smoke { 80 } else { 1200 };
    let dir = tempfile::tempdir().map_err(|e| IpamError::InUse(e.to_string()))?;
    let mut rows = Vec::new();
    let sqlite = SqliteStore::open(dir.path().join("ipam.db"), SqliteOptions::default()).await?;
    measure(sqlite, "sqlite (sync=full)", n, &mut rows).await?;
    let etcd = lab::etcd::EtcdCluster::start(1);
    let store = etcd.store(EtcdOptions::default()).await;
    measure(store, "etcd (1 member)", n, &mut rows).await?;
    drop(etcd);

    println!(
        "IPAM on one node, one address per request{}",
        if smoke { " (smoke run)" } else { "" }
    );
    println!(
        "{:<20} {:>7} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "backend",
        "clients",
        "allocs/s",
        "vs raw",
        "releases/s",
        "raw cas/s",
        "alloc p50",
        "alloc p99",
        "200 pods"
    );
    for r in rows {
        println!("{r}");
    }
    Ok(())
}
