//! Measuring helpers shared by the benchmark binaries: the raw conditional-update rate of a
//! store (the ceiling IPAM is measured against), percentiles, a clock comparable across
//! processes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datastore::contract::{Datastore, Kind, StoreError};

/// Conditional updates of 1 KiB values: `writers` tasks, each on its own objects (of a kind
/// kept under `prefix`), through the core contract.
pub async fn cas_updates<D: Datastore>(
    store: Arc<D>,
    prefix: &str,
    writers: usize,
    total: usize,
) -> Result<f64, StoreError> {
    // A kind of the run's own; the contract's kinds are static (a few bytes per run).
    let kind = Kind::new("BenchThing", Box::leak(prefix.to_owned().into_boxed_str()));
    let each = total / writers;
    let value = vec![b'x'; 1024];
    // Each writer owns 8 keys (like a node owning blocks) and cycles through them.
    let mut revs = Vec::new();
    for w in 0..writers {
        let mut mine = Vec::new();
        for k in 0..8 {
            let name = format!("{w}-{k}");
            let v = store.create(kind, &name, value.clone()).await?;
            mine.push((name, v));
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
                let (name, expected) = &mine[slot];
                let v = store.update(kind, name, value.clone(), *expected).await?;
                mine[slot].1 = v;
            }
            Ok::<(), StoreError>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| StoreError::Backend(e.to_string()))??;
    }
    Ok((each * writers) as f64 / started.elapsed().as_secs_f64())
}

/// Nanoseconds of CLOCK_MONOTONIC: comparable across processes of this host.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `q` quantile (0..=1) of the samples (sorted in place).
pub fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    match samples.len() {
        0 => Duration::ZERO,
        n => samples[((n - 1) as f64 * q) as usize],
    }
}

/// "1.23 ms".
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}
