//! `bgpctl`: the operator's CLI for bgpd, over its gRPC API on the unix socket.
//! Human tables by default, `--json` for scripts; errors are one line on stderr and exit 1.

use std::path::PathBuf;
use std::process::ExitCode;

use bgpctl::ipam::IpamCommand;
use bgpctl::pool::PoolCommand;
use bgpctl::{self as ctl, CtlError, Output};
use clap::{Parser, Subcommand};
use daemon_common::observe::status as routewriter_status;
use proto::v1::GetStatusRequest;
use proto::v1::daemon_client::DaemonClient;

#[derive(Parser)]
#[command(version, about = "Operate margay's bgpd over its API socket")]
struct Args {
    /// bgpd's API socket [default: $MARGAY_API__SOCKET, else /run/margay/bgpd.sock]
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Node name, datastore, uptime and version of bgpd.
    Status {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// IP pools: add, del, ls.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Addresses: show, assign, release, check, gc.
    #[command(subcommand)]
    Ipam(IpamCommand),
    /// routewriter's status, from its own listener (routewriter.metrics_listen).
    Routewriter {
        /// Where routewriter serves its metrics and status.
        #[arg(long, default_value = "127.0.0.1:9099")]
        address: std::net::SocketAddr,
        #[arg(long)]
        json: bool,
    },
    /// BGP sessions, routes and filters, a pod's network policy: show protocols, show route,
    /// show filters, show policy.
    #[command(subcommand)]
    Show(ctl::bgp::ShowCommand),
    /// The cluster's BGP configuration: show, set.
    #[command(subcommand)]
    Config(ctl::bgp::ConfigCommand),
    /// BGP peers: add, del.
    #[command(subcommand)]
    Peer(ctl::bgp::PeerCommand),
    /// Routes this node announces: add, del.
    #[command(subcommand)]
    Route(ctl::bgp::RouteCommand),
    /// Service addresses announced from this node under a lease: announce, withdraw, list.
    #[command(subcommand)]
    Service(ctl::service::ServiceCommand),
    /// Create or update resources from a file: Calico v3 (IPPool, BGPConfiguration, BGPPeer,
    /// BGPFilter, Node, NetworkPolicy, GlobalNetworkPolicy, WorkloadEndpoint), Kubernetes'
    /// NetworkPolicy and Namespace.
    Apply(ctl::resources::commands::ApplyArgs),
    /// Print resources as Calico v3 documents, to apply again.
    Get(ctl::resources::commands::GetArgs),
    /// Delete resources: KIND NAME, or those of a file.
    Delete(ctl::resources::commands::DeleteArgs),
    /// Set or remove labels of a workload endpoint or namespace; policy follows at once.
    Label(ctl::resources::policy::LabelArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let socket = args.socket.unwrap_or_else(|| {
        std::env::var_os("MARGAY_API__SOCKET")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(proto::client::DEFAULT_SOCKET))
    });
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bgpctl: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(socket, args.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bgpctl: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(socket: PathBuf, command: Command) -> Result<(), CtlError> {
    let mut out = Output::stdout();
    // routewriter answers on its own listener, not through bgpd.
    if let Command::Routewriter { address, json } = command {
        let body = routewriter_status::fetch(address)?;
        return if json {
            out.line(&body)
        } else {
            out.text(&routewriter_status::render(&body)?)
        };
    }
    let channel = ctl::connect_unix(&socket).await?;
    match command {
        Command::Status { json } => {
            let status = DaemonClient::new(channel)
                .get_status(GetStatusRequest {})
                .await?
                .into_inner();
            if json {
                out.line(&ctl::status::to_json(&status))
            } else {
                out.text(&ctl::status::to_table(&status))
            }
        }
        Command::Pool(c) => ctl::pool::run(channel, c, &mut out).await,
        Command::Ipam(c) => ctl::ipam::run(channel, c, &mut out).await,
        Command::Routewriter { .. } => unreachable!("answered above"),
        Command::Show(c) => ctl::bgp::show(channel, c, &mut out).await,
        Command::Peer(c) => ctl::bgp::peer(channel, c, &mut out).await,
        Command::Config(c) => ctl::bgp::config(channel, c, &mut out).await,
        Command::Route(c) => ctl::bgp::route(channel, c, &mut out).await,
        Command::Service(c) => ctl::service::run(channel, c, &mut out).await,
        Command::Apply(a) => ctl::resources::commands::apply(channel, a, &mut out).await,
        Command::Get(a) => ctl::resources::commands::get(channel, a, &mut out).await,
        Command::Delete(a) => ctl::resources::commands::delete(channel, a, &mut out).await,
        Command::Label(a) => ctl::resources::policy::label(channel, a, &mut out).await,
    }
}
