//! `store-bench`: the datastore's benchmark and load generator.
//!
//! - `store-bench bench [--smoke]`: one table, for each backend (SQLite with both sync modes,
//!   a real single-member etcd on loopback): conditional updates per second of ~1 KiB values
//!   with 1 and 8 concurrent writers, and watch delivery latency (p50, p99).
//! - `store-bench writer --path FILE --mode generations|counter [--count N]`: a writer
//!   process for the multi-process and kill -9 tests. `generations` rewrites five keys per
//!   transaction forever and prints each committed generation; `counter` increments a shared
//!   counter N times by compare-and-swap.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use datastore::contract::{Atomic, Datastore, Kind, Op, StoreError};
use datastore::etcd::EtcdOptions;
use datastore::sqlite::{SqliteOptions, SqliteStore, Sync};
use interop_tests::{bench, lab};

#[derive(Parser)]
#[command(about = "margay datastore benchmark and load generator")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the benchmark table.
    Bench {
        /// A small, quick run that only shows the benchmark still works.
        #[arg(long)]
        smoke: bool,
    },
    /// Write to a SQLite store until killed (generations) or N times (counter).
    Writer {
        #[arg(long)]
        path: PathBuf,
        #[arg(long, value_enum)]
        mode: WriterMode,
        #[arg(long, default_value_t = 100)]
        count: usize,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum WriterMode {
    Generations,
    Counter,
}

/// The keys of one generation transaction.
pub const GENERATION_KEYS: usize = 5;

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
            Command::Writer { path, mode, count } => writer(path, mode, count).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("store-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn writer(path: PathBuf, mode: WriterMode, count: usize) -> Result<(), StoreError> {
    let store = SqliteStore::open(path, SqliteOptions::default()).await?;
    match mode {
        WriterMode::Generations => loop {
            let gen_kv = store.get_key("/gen").await?;
            let generation = gen_kv.as_ref().map(|kv| parse(&kv.value) + 1).unwrap_or(1);
            let value = generation.to_string().into_bytes();
            let mut ops = Vec::new();
            for i in 0..GENERATION_KEYS {
                let key = format!("/k/{i}");
                ops.push(match store.get_key(&key).await? {
                    Some(kv) => Op::Update {
                        key,
                        value: value.clone(),
                        expected: kv.version,
                    },
                    None => Op::Create {
                        key,
                        value: value.clone(),
                    },
                });
            }
            ops.push(match gen_kv {
                Some(kv) => Op::Update {
                    key: "/gen".into(),
                    value,
                    expected: kv.version,
                },
                None => Op::Create {
                    key: "/gen".into(),
                    value,
                },
            });
            store.txn(ops).await?;
            // Acknowledged: the parent may rely on this generation being stored.
            println!("committed {generation}");
        },
        WriterMode::Counter => {
            for _ in 0..count {
                increment(&store, "/counter").await?;
            }
            Ok(())
        }
    }
}

fn parse(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// One compare-and-swap increment, retried on conflict.
async fn increment<D: Atomic>(store: &D, key: &str) -> Result<(), StoreError> {
    loop {
        let op = match store.get_key(key).await? {
            Some(kv) => Op::Update {
                key: key.into(),
                value: (parse(&kv.value) + 1).to_string().into_bytes(),
                expected: kv.version,
            },
            None => Op::Create {
                key: key.into(),
                value: b"1".to_vec(),
            },
        };
        match store.txn(vec![op]).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}

struct Row {
    backend: String,
    writers: usize,
    updates: usize,
    per_sec: f64,
}

/// Latency from a write's start to its delivery to a watcher on `watcher_store`, p50 and p99.
async fn watch_latency<D: Datastore, W: Datastore>(
    writer_store: Arc<D>,
    watcher_store: Arc<W>,
    prefix: &str,
    count: usize,
) -> Result<(Duration, Duration), StoreError> {
    // A kind of the run's own; the contract's kinds are static (a few bytes per run).
    let kind = Kind::new("BenchThing", Box::leak(prefix.to_owned().into_boxed_str()));
    let mut rev = writer_store
        .create(kind, "k", bench::monotonic_ns().to_string().into_bytes())
        .await?;
    let mut watch = watcher_store.watch(kind, rev).await?;
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        rev = writer_store
            .update(
                kind,
                "k",
                bench::monotonic_ns().to_string().into_bytes(),
                rev,
            )
            .await?;
        let ev = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .map_err(|_| StoreError::Backend("watch event did not arrive in 10 s".into()))?
            .ok_or_else(|| StoreError::Backend("watch ended".into()))??;
        let sent = parse(ev.value.as_deref().unwrap_or_default());
        samples.push(Duration::from_nanos(
            bench::monotonic_ns().saturating_sub(sent),
        ));
        // Spaced writes, as cluster changes come: measure delivery, not queueing.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok((
        bench::percentile(&mut samples, 0.5),
        bench::percentile(&mut samples, 0.99),
    ))
}

async fn bench_backend<D: Datastore>(
    store: Arc<D>,
    name: &str,
    n: usize,
    rows: &mut Vec<Row>,
) -> Result<(), StoreError> {
    for writers in [1, 8] {
        let per_sec =
            bench::cas_updates(store.clone(), &format!("/bench/u{writers}/"), writers, n).await?;
        rows.push(Row {
            backend: name.into(),
            writers,
            updates: n,
            per_sec,
        });
    }
    Ok(())
}

async fn bench(smoke: bool) -> Result<(), StoreError> {
    let n = if smoke { 200 } else { 4000 };
    let watches = if smoke { 50 } else { 500 };
    let dir = tempfile::tempdir().map_err(|e| StoreError::Backend(e.to_string()))?;
    let mut rows = Vec::new();
    let mut latency = Vec::new();

    for (sync, label) in [
        (Sync::Full, "sqlite (sync=full)"),
        (Sync::Normal, "sqlite (sync=normal)"),
    ] {
        let path = dir
            .path()
            .join(format!("{label}.db").replace([' ', '(', ')', '='], ""));
        let options = SqliteOptions {
            sync,
            ..SqliteOptions::default()
        };
        let store = Arc::new(SqliteStore::open(&path, options.clone()).await?);
        bench_backend(store.clone(), label, n, &mut rows).await?;
        if sync == Sync::Full {
            let same = watch_latency(store.clone(), store.clone(), "/bench/w1/", watches).await?;
            latency.push(("sqlite, same process".to_string(), same));
            // A second handle on the file has its own connections and no in-process wake-up:
            // what a watcher in another process sees.
            let other = Arc::new(SqliteStore::open(&path, options).await?);
            let cross = watch_latency(store.clone(), other, "/bench/w2/", watches).await?;
            latency.push(("sqlite, other process".to_string(), cross));
        }
    }

    let etcd = lab::etcd::EtcdCluster::start(1);
    let store = Arc::new(etcd.store(EtcdOptions::default()).await);
    bench_backend(store.clone(), "etcd (1 member)", n, &mut rows).await?;
    let l = watch_latency(store.clone(), store, "/bench/w/", watches).await?;
    latency.push(("etcd".to_string(), l));
    drop(etcd);

    println!(
        "conditional updates of 1 KiB values{}",
        if smoke { " (smoke run)" } else { "" }
    );
    println!(
        "{:<22} {:>7} {:>8} {:>12}",
        "backend", "writers", "updates", "updates/s"
    );
    for r in &rows {
        println!(
            "{:<22} {:>7} {:>8} {:>12.0}",
            r.backend, r.writers, r.updates, r.per_sec
        );
    }
    println!();
    println!("watch delivery latency ({watches} changes, 2 ms apart)");
    println!("{:<22} {:>10} {:>10}", "watcher", "p50", "p99");
    for (name, (p50, p99)) in &latency {
        println!(
            "{:<22} {:>10} {:>10}",
            name,
            bench::ms(*p50),
            bench::ms(*p99)
        );
    }
    Ok(())
}
