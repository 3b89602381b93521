//! `margay-cni-install`: installs the `margay` and `margay-ipam` plugins and the network
//! configuration list, e.g.
//! `margay-cni-install --bin-dir /opt/cni/bin --conf-dir /etc/cni/net.d`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use cni::install::{self, ConfOptions};
use cni::spec::config::Encap;

#[derive(Parser)]
#[command(
    version,
    about = "Install margay's CNI plugins and network configuration"
)]
struct Args {
    /// Where the runtime looks for plugins.
    #[arg(long, default_value = "/opt/cni/bin")]
    bin_dir: PathBuf,
    /// Where the runtime reads network configurations.
    #[arg(long, default_value = "/etc/cni/net.d")]
    conf_dir: PathBuf,
    /// The configuration list's file name (runtimes take the first in lexical order).
    #[arg(long, default_value = "10-margay.conflist")]
    conf_name: String,
    /// Where margay and margay-ipam are [default: the directory of this program].
    #[arg(long)]
    from: Option<PathBuf>,
    /// Install the binaries only.
    #[arg(long)]
    skip_conf: bool,
    /// Leave an existing configuration list alone.
    #[arg(long)]
    keep_conf: bool,
    /// Replace the configuration list even if margay-cni-install did not write it.
    #[arg(long, conflicts_with = "keep_conf")]
    force: bool,
    /// The network's name [default: k8s-pod-network].
    #[arg(long)]
    network_name: Option<String>,
    /// bgpd's API socket [default: /run/margay/bgpd.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The pod MTU; 0 derives it from the uplink and --encapsulation.
    #[arg(long)]
    mtu: Option<u32>,
    /// The pools' encapsulation: vxlan, ipip or none (for the derived MTU).
    #[arg(long, value_parser = ["vxlan", "ipip", "none"])]
    encapsulation: Option<String>,
    /// The node name recorded with allocations [default: the host name].
    #[arg(long)]
    nodename: Option<String>,
    /// The plugins' log file [default: /var/log/margay/cni.log].
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// error, warn, info, debug or trace.
    #[arg(long)]
    log_level: Option<String>,
    /// Give pods an IPv6 address too.
    #[arg(long)]
    ipv6: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("margay-cni-install: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), install::InstallError> {
    let from = match args.from {
        Some(d) => d,
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    for p in install::install_binaries(&from, &args.bin_dir)? {
        println!("installed {}", p.display());
    }
    if args.skip_conf {
        return Ok(());
    }
    let target = args.conf_dir.join(&args.conf_name);
    if args.keep_conf && target.exists() {
        println!("kept {}", target.display());
        return Ok(());
    }
    install::may_write(&target, args.force)?;
    let opts = ConfOptions {
        network_name: args.network_name,
        socket: args.socket,
        mtu: args.mtu,
        encapsulation: args.encapsulation.as_deref().map(|e| match e {
            "ipip" => Encap::Ipip,
            "none" => Encap::None,
            _ => Encap::Vxlan,
        }),
        nodename: args.nodename,
        log_file: args.log_file,
        log_level: args.log_level,
        assign_ipv6: args.ipv6,
    };
    let text = install::render_conflist(install::CONFLIST_TEMPLATE, &opts)?;
    install::write_atomically(&target, text.as_bytes(), 0o644)?;
    println!("wrote {}", target.display());
    Ok(())
}
