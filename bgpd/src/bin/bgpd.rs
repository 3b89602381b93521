//! `bgpd --config FILE`: margay's node daemon. See the `bgpd` library for what it does.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bgpd::config::Config;
use clap::Parser;

#[derive(Parser)]
#[command(
    version,
    about = "margay's node daemon: datastore, IPAM, BGP and the desired kernel state"
)]
struct Args {
    /// The TOML configuration; every key can be overridden by MARGAY_<SECTION>__<KEY>.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

/// Big tables on huge pages (see `bgpd::hugepages`).
#[global_allocator]
static ALLOCATOR: bgpd::hugepages::HugePageAllocator = bgpd::hugepages::HugePageAllocator;

fn main() -> ExitCode {
    let Some((config, path)) = configure() else {
        return ExitCode::FAILURE;
    };
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bgpd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Boxed, and the arguments read in a function of their own: `main`'s frame stays at
    // the bottom of the stack for the process's life, under every task the runtime polls,
    // so what it holds is resident for good (it was 16 KB with both inline).
    match runtime.block_on(Box::pin(bgpd::daemon::run(config, path))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bgpd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The configuration (and its file, to read again on SIGHUP), logging set up; `None` after
/// saying why not.
#[inline(never)]
fn configure() -> Option<(Config, Option<PathBuf>)> {
    let args = Args::parse();
    match Config::load(args.config.as_deref()) {
        Ok(config) => {
            bgpd::logging::init(config.log.level);
            Some((config, args.config))
        }
        Err(e) => {
            eprintln!("bgpd: {e}");
            None
        }
    }
}

/// Threads for blocking calls (the SQLite datastore's); more calls wait for one.
const BLOCKING_THREADS: usize = 8;

/// Worker threads of the runtime; `BGPD_WORKER_THREADS` overrides (0: one per core).
const WORKER_THREADS_ENV: &str = "BGPD_WORKER_THREADS";

/// The runtime: one thread by default. A node runs one bgpd beside its pods, and a lab runs a
/// hundred on one host: every extra worker is memory (its stack, its malloc arena) and wake-ups
/// of an idle process, for parallelism bgpd's work (one RIB task, sessions that mostly wait)
/// seldom has. A bgpd fed a full table by a fast peer may take more with the variable.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    // glibc gives each thread that allocates an arena of its own (up to 8 per core), and
    // each arena keeps its own freed memory: SQLite's blocking threads kept some 350 KB
    // free in a second arena of a 50-node mesh node. One arena: its lock is seldom
    // contended (one runtime thread, SQLite calls serialised per connection), and a mesh
    // converged no slower with it.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt is called before any other thread exists; it only sets a limit.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let workers = std::env::var(WORKER_THREADS_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let mut b = match workers {
        None | Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            if n > 0 {
                b.worker_threads(n);
            }
            b
        }
    };
    // The blocking pool runs the SQLite calls, serialised per connection (a writer, a
    // reader, one per watch): a few threads, kept. Tokio's default ends a thread idle for
    // 10 s, so an idle bgpd started a new one for every probe and fallback poll.
    b.max_blocking_threads(BLOCKING_THREADS)
        .thread_keep_alive(Duration::from_secs(3600))
        .enable_all()
        .build()
}
