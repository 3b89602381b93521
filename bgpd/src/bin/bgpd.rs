//! `bgpd --config FILE`: margay's node daemon. See the `bgpd` library for what it does.

use std::path::PathBuf;
use std::process::ExitCode;

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
        Ok(c) => c,
        Err(e) => {
            eprintln!("bgpd: {e}");
            return ExitCode::FAILURE;
        }
    };
    bgpd::logging::init(config.log.level);
    let runtime = match tokio::runtime::Runtime::new() {
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
