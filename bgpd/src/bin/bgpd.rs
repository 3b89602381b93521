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

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match Config::load(args.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("bgpd: {e}");
            return ExitCode::FAILURE;
        }
    };
    daemon_common::logging::init(&config.log);
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bgpd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bgpd::daemon::run(config, args.config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bgpd: {e}");
            ExitCode::FAILURE
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
