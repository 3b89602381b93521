//! `routewriter`: margay's dataplane agent. Watches bgpd's desired kernel state and makes the
//! kernel match it (routes of protocol 80, `vxlan.calico`, its FDB and neighbour entries,
//! natOutgoing, sysctls). See `bgpd::routewriter`.
//!
//!   routewriter --config /etc/margay/node.toml           run the agent
//!   routewriter --config /etc/margay/node.toml status    a running agent's status (--json)
//!
//! The agent exits 0 on SIGTERM/SIGINT leaving the kernel as it is; 1 on a configuration or
//! start error. `status` asks the agent's own listener (`routewriter.metrics_listen`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bgpd::routewriter::config::Config;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "routewriter", version = bgpd::VERSION, about = "margay's dataplane agent")]
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
    bgpd::logging::init(config.log.level);
    // Two workers: kernel work blocks one (block_in_place) while the other keeps the stream.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("routewriter: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bgpd::routewriter::agent::run(config)) {
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
    let fail = |e: std::io::Error| {
        format!(
            "cannot reach routewriter at {addr}: {e} (is it running, in this network namespace?)"
        )
    };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(fail)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    s.write_all(b"GET /status HTTP/1.1\r\nHost: routewriter\r\n\r\n")
        .map_err(fail)?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(fail)?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .ok_or("routewriter answered without a body")?;
    if json {
        println!("{body}");
        return Ok(());
    }
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("routewriter's status is not JSON: {e}"))?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let yes = |k: &str| if v[k] == true { "yes" } else { "no" };
    let map = |k: &str| {
        v[k].as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "none".into())
    };
    println!("revision            {}", n("revision"));
    println!(
        "stream connected    {} (reconnects {})",
        yes("stream_connected"),
        n("stream_reconnects")
    );
    println!("synced              {}", yes("synced"));
    println!("routes              {}", map("routes"));
    println!(
        "failing             {} (waiting for their device {}, unsupported: {})",
        n("routes_failing"),
        n("routes_waiting_for_device"),
        map("routes_unsupported")
    );
    println!("corrections         {}", map("corrections"));
    println!(
        "writes              netlink {}, nft {}, sysctl {}",
        n("netlink_writes"),
        n("nft_writes"),
        n("sysctl_writes")
    );
    println!(
        "last resync         {:.1} ms ({} resyncs)",
        v["last_resync_seconds"].as_f64().unwrap_or(0.0) * 1e3,
        n("resyncs")
    );
    println!(
        "vxlan device        {}",
        v["vxlan_device"].as_str().unwrap_or("none")
    );
    println!(
        "last error          {}",
        v["last_error"].as_str().unwrap_or("none")
    );
    for f in v["failing_examples"].as_array().into_iter().flatten() {
        println!("  {}", f.as_str().unwrap_or_default());
    }
    Ok(())
}
