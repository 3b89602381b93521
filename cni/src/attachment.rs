//! One attachment (a container's interface on this network) as both plugins see it: the name
//! of its host-side interface, which `margay` creates and `margay-ipam` records with the
//! addresses, and its network namespace (CNI_NETNS) opened with the CNI error of each failure.
//! Nothing here changes the system.

use std::path::Path;

use crate::names;
use crate::netns::{Netns, netns_error};
use crate::spec::NetConf;
use crate::spec::env::Env;
use crate::spec::error::CniError;

/// The host-side interface name of this attachment.
pub fn host_ifname(conf: &NetConf, env: &Env) -> String {
    names::host_ifname(
        &conf.interface_prefix,
        env.args.workload_key().as_deref(),
        &env.container_id,
    )
}

/// The attachment's network namespace (CNI_NETNS), opened.
pub fn open_netns(env: &Env) -> Result<Netns, CniError> {
    let path = env.netns.as_deref().unwrap_or(Path::new(""));
    Netns::open(path).map_err(|e| netns_error(&e))
}
