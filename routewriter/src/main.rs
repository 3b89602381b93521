//! `routewriter`: margay's dataplane agent. Watches bgpd's desired kernel state and makes the
//! kernel match it (routes of protocol 80 of both families, `vxlan.calico` and
//! `vxlan-v6.calico` with their FDB and neighbour entries, natOutgoing, sysctls). See the
//! `routewriter` library.
//!
//!   routewriter --config /etc/margay/node.toml           run the agent
//!   routewriter --config /etc/margay/node.toml status    a running agent's status (--json)
//!
//! The agent exits 0 on SIGTERM/SIGINT leaving the kernel as it is; 1 on a configuration or
//! start error. `status` asks the agent's own listener (`routewriter.metrics_listen`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use daemon_common::observe::status::{fetch, render};
use routewriter::config::Config;

#[derive(Parser)]
#[command(name = "routewriter", version, about = "margay's dataplane agent")]
struct Args {
    /// Configuration file (TOML); `MARGAY_ROUTEWRITER__<KEY>` variables override it.
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show a running routewriter's status (asks routewriter.metrics_listen).
    Status {
        /// The status object as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match Config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("routewriter: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Cmd::Status { json }) = args.command {
        return match status(&config, json) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("routewriter: {e}");
                ExitCode::FAILURE
            }
        };
    }
    daemon_common::logging::init(&config.log);
    // One thread: an update from bgpd is read, decoded and written to the kernel without a
    // hand-over between threads (the netlink watch has its own, `monitor`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("routewriter: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(routewriter::agent::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("routewriter: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Fetches `/status` from the running agent and prints it.
fn status(config: &Config, json: bool) -> Result<(), String> {
    let Some(addr) = config.routewriter.metrics_listen else {
        return Err("routewriter.metrics_listen is not set: the agent serves no status".into());
    };
    let body = fetch(addr).map_err(|e| e.to_string())?;
    if json {
        println!("{body}");
    } else {
        print!("{}", render(&body).map_err(|e| e.to_string())?);
    }
    Ok(())
}
