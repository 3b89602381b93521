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
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use interop_tests::lab;
use ipam::store::etcd::EtcdOptions;
use ipam::store::sqlite::{SqliteOptions, SqliteStore, Sync};
use ipam::store::{Datastore, Op, StoreError};

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
            let gen_kv = store.get("/gen").await?;
            let generation = gen_kv.as_ref().map(|kv| parse(&kv.value) + 1).unwrap_or(1);
            let value = generation.to_string().into_bytes();
            let mut ops = Vec::new();
            for i in 0..GENERATION_KEYS {
                let key = format!("/k/{i}");
                ops.push(match store.get(&key).await? {
                    Some(kv) => Op::Update {
                        key,
                        value: value.clone(),
                        expected: kv.mod_revision,
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
                    expected: kv.mod_revision,
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
async fn increment<D: Datastore>(store: &D, key: &str) -> Result<(), StoreError> {
    loop {
        let op = match store.get(key).await? {
            Some(kv) => Op::Update {
                key: key.into(),
                value: (parse(&kv.value) + 1).to_string().into_bytes(),
                expected: kv.mod_revision,
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

/// Nanoseconds of CLOCK_MONOTONIC: comparable across processes of this host.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct Row {
    backend: String,
    writers: usize,
    updates: usize,
    per_sec: f64,
}

/// Conditional updates of 1 KiB values: `writers` tasks, each on its own keys.
async fn updates<D: Datastore>(
    store: Arc<D>,
    prefix: &str,
    writers: usize,
    total: usize,
) -> Result<f64, StoreError> {
    let each = total / writers;
    let value = vec![b'x'; 1024];
    // Each writer owns 8 keys (like a node owning blocks) and cycles through them.
    let mut revs = Vec::new();
    for w in 0..writers {
        let mut mine = Vec::new();
        for k in 0..8 {
            let key = format!("{prefix}{w}/{k}");
            let r = store.create(&key, value.clone()).await?;
            mine.push((key, r));
        }
        revs.push(mine);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut mine in revs {
        let (store, value) = (store.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..each {
                let slot = i % mine.len();
                let (key, expected) = &mine[slot];
                let r = store.update(key, value.clone(), *expected).await?;
                mine[slot].1 = r;
            }
            Ok::<(), StoreError>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| StoreError::Backend(e.to_string()))??;
    }
    Ok((each * writers) as f64 / started.elapsed().as_secs_f64())
}

/// Latency from a write's start to its delivery to a watcher on `watcher_store`, p50 and p99.
async fn watch_latency<D: Datastore, W: Datastore>(
    writer_store: Arc<D>,
    watcher_store: Arc<W>,
    prefix: &str,
    count: usize,
) -> Result<(Duration, Duration), StoreError> {
    let key = format!("{prefix}k");
    let mut rev = writer_store
        .create(&key, monotonic_ns().to_string().into_bytes())
        .await?;
    let mut watch = watcher_store.watch(prefix, rev).await?;
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        rev = writer_store
            .update(&key, monotonic_ns().to_string().into_bytes(), rev)
            .await?;
        let ev = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .map_err(|_| StoreError::Backend("watch event did not arrive in 10 s".into()))?
            .ok_or_else(|| StoreError::Backend("watch ended".into()))??;
        let sent = parse(ev.value.as_deref().unwrap_or_default());
        samples.push(Duration::from_nanos(monotonic_ns().saturating_sub(sent)));
        // Spaced writes, as cluster changes come: measure delivery, not queueing.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    samples.sort();
    let pick = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    Ok((pick(0.5), pick(0.99)))
}

async fn bench_backend<D: Datastore>(
    store: Arc<D>,
    name: &str,
    n: usize,
    rows: &mut Vec<Row>,
) -> Result<(), StoreError> {
    for writers in [1, 8] {
        let per_sec = updates(store.clone(), &format!("/bench/u{writers}/"), writers, n).await?;
        rows.push(Row {
            backend: name.into(),
            writers,
            updates: n,
            per_sec,
        });
    }
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
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
        println!("{:<22} {:>10} {:>10}", name, ms(*p50), ms(*p99));
    }
    Ok(())
}
