//! The agent: one [`Agent`] owns the desired state, the kernel socket, nft and the sysctls,
//! and [`run`] feeds it from three sources on a tokio runtime: the Dataplane stream (with
//! reconnect, backoff and resume from the last revision), the netlink watch (drift made by
//! others, repaired at once), and timers (periodic full resync, retries of refused routes).
//!
//! Why this file is long: the agent's state and each event it handles (stream update, netlink
//! change, timer) change that one state; the handlers belong together.
//!
//! Nothing is written before the first snapshot: until bgpd has said what it wants, the kernel
//! keeps what it has (a restart or an unreachable bgpd never flushes routes). SIGTERM ends the
//! process and leaves everything in place, so traffic keeps flowing across a restart.
//!
//! The [`Agent`]'s methods are synchronous (netlink answers in microseconds, and a bulk load
//! is best done without yielding); [`run`] calls them from its loop, on one thread: the
//! stream waits in its socket meanwhile, and one thread means one wake-up per update instead
//! of a hand-over between workers. Benchmarks and tests may drive an `Agent` directly.
//!
//! Both address families go through the same handlers: routes of both are one desired table
//! diffed against a dump of each family; the VXLAN device, its address and its FDB and
//! neighbour entries are synced per family (`vxlan.calico`, `vxlan-v6.calico`); NAT per family
//! table; forwarding per family. The IPv6 parts that touch the host beyond routes (forwarding,
//! the NAT table) are set up only when something of IPv6 is desired.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use net_types::IpFamily;
use proto::v1::{DataplaneUpdate, WatchRequest, dataplane_client::DataplaneClient};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::config::{Config, RoutewriterConfig};
use super::desired::{Defaults, DesiredState, DevId, Kind, Prefix};
use super::host::{Host, System};
use super::kernel::Refusal;
use super::metrics::{self, Metrics};
use super::monitor::{self, Event};
use super::nat;
use super::nft::Tables;
use super::reconcile::{
    self, ActualRoute, DeviceAction, DeviceSpec, RouteContext, RouteDiffer, RouteOp, Why,
};
use super::routes::{family_label, family_to_proto};
use host_kernel::netlink::NlError;
use host_kernel::sysctl::{FORWARDING_V4, FORWARDING_V6, Sysctls};
use proto::mac::vtep_mac;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Kernel(#[from] NlError),
    #[error("cannot watch netlink for changes: {0}")]
    Monitor(std::io::Error),
    #[error(
        "cannot serve metrics on {addr}: {source} (is another process using it? change routewriter.metrics_listen)"
    )]
    Metrics {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signal(std::io::Error),
}

/// A route the kernel refused, retried with exponential backoff.
#[derive(Debug, Clone)]
struct Failure {
    attempts: u32,
    next: Instant,
    error: String,
}

/// Which repairs count as corrections in the metrics.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Count {
    /// Desired changes, or the first convergence after start: not drift.
    Nothing,
    /// Everything the kernel had wrong, missing routes included.
    All,
    /// Wrong and stale routes, not missing ones (a link that just appeared).
    NotMissing,
}

/// Owns everything routewriter writes, through `H` (the real host unless a test says so).
pub struct Agent<H: Host = System> {
    cfg: RoutewriterConfig,
    node: String,
    host: H,
    desired: DesiredState,
    /// Interface name → index, and back, kept from dumps and link events.
    links: HashMap<String, u32>,
    names: HashMap<u32, (String, bool)>,
    failing: HashMap<Prefix, Failure>,
    waiting: HashSet<Prefix>,
    unsupported: HashMap<Prefix, &'static str>,
    /// Workload interfaces that appeared lately, by index: the CNI plugin writes the pod's
    /// route before bgpd desires it, so routes on them are not deleted for a grace period
    /// (Felix waits 10 s too).
    new_workloads: HashMap<u32, Instant>,
    /// Whether IPIP could not be set up (checked once: trying writes to the kernel).
    ipip_missing: Option<String>,
    /// Per family ([`IpFamily::index`]): the VXLAN device's index and the uplink it runs over.
    vxlan_index: [Option<u32>; 2],
    uplink_name: [Option<String>; 2],
    /// After nft refused the policy table: when to try again, and the backoff.
    policy_retry: Option<(Instant, Duration)>,
    sysctls: Sysctls,
    metrics: Arc<Metrics>,
    /// The kernel has converged to a snapshot once.
    synced: bool,
    /// Something left the kernel's state unknown: resync fully at the next chance.
    need_full: bool,
}

impl Agent<System> {
    /// Opens the kernel socket in the calling thread's network namespace.
    pub fn new(
        cfg: RoutewriterConfig,
        node: String,
        metrics: Arc<Metrics>,
    ) -> Result<Agent, AgentError> {
        let host = System::open(&cfg)?;
        Ok(Agent::with_host(
            cfg,
            node,
            metrics,
            host,
            Sysctls::default(),
        ))
    }
}

impl<H: Host> Agent<H> {
    /// An agent writing through `host` and `sysctls`; nothing is read or written yet.
    pub fn with_host(
        cfg: RoutewriterConfig,
        node: String,
        metrics: Arc<Metrics>,
        host: H,
        sysctls: Sysctls,
    ) -> Agent<H> {
        let defaults = Defaults {
            vxlan_device: cfg.vxlan_device.clone(),
            vxlan_device_v6: cfg.vxlan_device_v6.clone(),
            ipip_device: cfg.ipip_device.clone(),
        };
        Agent {
            node,
            host,
            desired: DesiredState::new(defaults),
            links: HashMap::new(),
            names: HashMap::new(),
            failing: HashMap::new(),
            waiting: HashSet::new(),
            unsupported: HashMap::new(),
            new_workloads: HashMap::new(),
            ipip_missing: None,
            vxlan_index: [None, None],
            uplink_name: [None, None],
            policy_retry: None,
            sysctls,
            metrics,
            synced: false,
            need_full: false,
            cfg,
        }
    }

    /// What the agent writes through.
    pub fn host(&self) -> &H {
        &self.host
    }

    pub fn desired(&self) -> &DesiredState {
        &self.desired
    }

    /// Netlink writes so far.
    pub fn netlink_writes(&self) -> u64 {
        self.host.netlink_writes()
    }

    /// Every write so far: netlink messages, nft transactions and sysctl values.
    pub fn writes(&self) -> u64 {
        self.host.netlink_writes() + self.nft_writes() + self.sysctls.writes
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Applies updates from the stream (several at once are merged) and writes what changed.
    pub fn apply_updates(&mut self, updates: &[DataplaneUpdate]) {
        let mut full = false;
        let mut routes: Vec<Prefix> = Vec::new();
        let (mut vteps, mut local, mut nat, mut policy) = ([false; 2], [false; 2], false, false);
        let mut rejected = 0u64;
        for u in updates {
            let a = self.desired.apply(u);
            if a.stale {
                debug!(
                    revision = u.revision,
                    "ignoring an update at or below the applied revision"
                );
                continue;
            }
            for r in a.rejected.iter().take(20) {
                warn!("rejected from bgpd's desired state: {r}");
            }
            if a.rejected.len() > 20 {
                warn!("... and {} more rejected items", a.rejected.len() - 20);
            }
            rejected += a.rejected.len() as u64;
            full |= a.snapshot;
            routes.extend(a.routes);
            for i in 0..2 {
                vteps[i] |= a.vteps[i];
                local[i] |= a.local_vtep[i];
            }
            nat |= a.nat;
            policy |= a.policy;
        }
        if rejected > 0 {
            self.metrics.update(|s| s.items_rejected += rejected);
            self.metrics
                .error(format!("{rejected} desired items rejected; see the log"));
        }
        if !self.desired.is_complete() {
            // Changes before any snapshot are not the whole picture: write nothing yet.
            self.publish();
            return;
        }
        if full || !self.synced {
            // What a snapshot changes is bgpd's doing, not drift.
            self.sync_all(Count::Nothing);
            return;
        }
        for f in IpFamily::ALL {
            if local[f.index()] {
                self.sync_device(f, Count::Nothing);
            }
            if local[f.index()] || vteps[f.index()] {
                self.sync_vteps(f, Count::Nothing);
            }
        }
        let v6_changed = vteps[IpFamily::V6.index()]
            || local[IpFamily::V6.index()]
            || nat
            || routes.iter().any(|p| p.family() == IpFamily::V6);
        if self.cfg.sysctls && v6_changed && self.desired.uses(IpFamily::V6) {
            // IPv6 items came: forwarding of IPv6 on before their routes are used.
            self.ensure_forwarding(IpFamily::V6);
        }
        if !routes.is_empty() {
            routes.sort_unstable();
            routes.dedup();
            let ops = self.ops_for(&routes);
            self.apply_route_ops(ops, Count::Nothing);
        }
        if nat {
            self.sync_nat(Count::Nothing, None);
        }
        if policy {
            self.sync_policy(Count::Nothing, None);
        }
        self.publish();
    }

    /// The operations that make the kernel follow desired changes at `prefixes`.
    fn ops_for(&self, prefixes: &[Prefix]) -> Vec<RouteOp> {
        let links = &self.links;
        let desired = &self.desired;
        let ifindex = |d: DevId| {
            desired
                .devices()
                .name(d)
                .and_then(|n| links.get(n).copied())
        };
        let ctx = RouteContext {
            protocol: self.cfg.protocol,
            table: self.cfg.table,
            ifindex: &ifindex,
        };
        prefixes
            .iter()
            .map(|p| reconcile::op_for_change(*p, desired.route(p).as_ref(), &ctx))
            .collect()
    }

    /// Reads everything and converges: links, device, VTEP entries, routes, NAT, sysctls.
    /// What it repairs counts as drift.
    pub fn full_sync(&mut self) {
        self.sync_all(Count::All);
    }

    fn sync_all(&mut self, count: Count) {
        if !self.desired.is_complete() {
            return;
        }
        let start = Instant::now();
        let count = if self.synced { count } else { Count::Nothing };
        self.need_full = false;
        if self.cfg.sysctls {
            for f in IpFamily::ALL {
                if f == IpFamily::V4 || self.desired.uses(f) {
                    self.ensure_forwarding(f);
                }
            }
        }
        if let Err(e) = self.refresh_links() {
            self.kernel_error("reading links", e);
        }
        for f in IpFamily::ALL {
            self.sync_device(f, count);
            self.sync_vteps(f, count);
        }
        self.sync_routes(count);
        let tables = self.nft_tables();
        self.sync_nat(count, tables.as_ref());
        self.sync_policy(count, tables.as_ref());
        if self.cfg.sysctls {
            let workloads: Vec<String> = self
                .links
                .keys()
                .filter(|n| n.starts_with(&self.cfg.workload_prefix))
                .cloned()
                .collect();
            self.workload_sysctls(&workloads, count);
        }
        let took = start.elapsed();
        let first = !self.synced;
        self.synced = true;
        self.metrics.update(|s| {
            s.resyncs += 1;
            s.last_resync_seconds = took.as_secs_f64();
            s.synced = true;
        });
        self.publish();
        if first {
            info!(
                routes = self.desired.routes().len(),
                writes = self.writes(),
                "converged to revision {} in {:.1} ms",
                self.desired.revision(),
                took.as_secs_f64() * 1e3
            );
        } else {
            debug!("full resync in {:.1} ms", took.as_secs_f64() * 1e3);
        }
    }

    /// The periodic safety net.
    pub fn periodic_resync(&mut self) {
        if self.desired.is_complete() {
            self.full_sync();
        }
    }

    /// Retries refused routes whose backoff has passed (and a pending full resync).
    pub fn retry_due(&mut self) {
        if self.need_full && self.desired.is_complete() {
            self.full_sync();
            return;
        }
        let now = Instant::now();
        if self.policy_retry.is_some_and(|(at, _)| at <= now) && self.desired.is_complete() {
            self.sync_policy(Count::Nothing, None);
        }
        // Workload interfaces whose grace ended: look at their routes again.
        let grace = Duration::from_secs(self.cfg.workload_grace_s);
        let ended: Vec<u32> = self
            .new_workloads
            .iter()
            .filter(|(_, seen)| now.duration_since(**seen) >= grace)
            .map(|(i, _)| *i)
            .collect();
        for index in ended {
            self.new_workloads.remove(&index);
            if let Some((name, _)) = self.names.get(&index).cloned()
                && self.synced
            {
                self.sync_stale_on_link(index, &name);
            }
        }
        let mut due: Vec<Prefix> = self
            .failing
            .iter()
            .filter(|(_, f)| f.next <= now)
            .map(|(p, _)| *p)
            .collect();
        if due.is_empty() {
            return;
        }
        due.sort_unstable();
        let ops = self.ops_for(&due);
        self.apply_route_ops(ops, Count::Nothing);
        self.publish();
    }

    fn refresh_links(&mut self) -> Result<(), NlError> {
        let links = self.host.links()?;
        self.links.clear();
        self.names.clear();
        for l in links {
            self.links.insert(l.name.clone(), l.index);
            self.names.insert(l.index, (l.name, l.up));
        }
        Ok(())
    }

    fn fail(&self, message: String) {
        error!("{message}");
        self.metrics.error(message);
    }

    fn kernel_error(&mut self, what: &str, e: NlError) {
        if matches!(
            e,
            NlError::Overrun | NlError::DumpInterrupted | NlError::Io(_)
        ) {
            self.need_full = true;
        }
        self.fail(format!("{what}: {e}"));
    }

    // -----------------------------------------------------------------------------------------
    // Routes

    fn sync_routes(&mut self, count: Count) {
        let table = self.cfg.table;
        for _attempt in 0..3 {
            let links = &self.links;
            let desired = &self.desired;
            let ifindex = |d: DevId| {
                desired
                    .devices()
                    .name(d)
                    .and_then(|n| links.get(n).copied())
            };
            let ctx = RouteContext {
                protocol: self.cfg.protocol,
                table,
                ifindex: &ifindex,
            };
            let mut differ = RouteDiffer::new(desired.routes(), &ctx);
            // Both families into one differ: a destination's routes come together either way.
            let dumped = IpFamily::ALL
                .into_iter()
                .try_for_each(|f| self.host.routes(f, table, None, |r| differ.observe(r)));
            match dumped {
                Ok(()) => {
                    let ops = differ.finish();
                    self.apply_route_ops(ops, count);
                    return;
                }
                Err(NlError::DumpInterrupted) => continue,
                Err(e) => {
                    self.kernel_error("reading routes", e);
                    return;
                }
            }
        }
        self.need_full = true;
    }

    /// Routes through one interface, after it appeared or changed.
    fn sync_routes_on_link(&mut self, name: &str) {
        let Some(dev) = self.desired.devices().id(name) else {
            return;
        };
        let Some(&index) = self.links.get(name) else {
            return;
        };
        let mut actual: Vec<ActualRoute> = Vec::new();
        for f in IpFamily::ALL {
            if let Err(e) = self
                .host
                .routes(f, self.cfg.table, Some(index), |r| actual.push(*r))
            {
                self.kernel_error(&format!("reading routes through {name}"), e);
                return;
            }
        }
        let links = &self.links;
        let desired = &self.desired;
        let ifindex = |d: DevId| {
            desired
                .devices()
                .name(d)
                .and_then(|n| links.get(n).copied())
        };
        let ctx = RouteContext {
            protocol: self.cfg.protocol,
            table: self.cfg.table,
            ifindex: &ifindex,
        };
        let ops = reconcile::diff_routes_on_link(desired.routes(), dev, &actual, &ctx);
        self.apply_route_ops(ops, Count::NotMissing);
    }

    /// Our routes through a workload interface whose grace ended, deleted if not desired.
    fn sync_stale_on_link(&mut self, index: u32, name: &str) {
        let mut stale = Vec::new();
        let desired = &self.desired;
        let res = IpFamily::ALL.into_iter().try_for_each(|f| {
            self.host.routes(f, self.cfg.table, Some(index), |r| {
                if r.protocol == self.cfg.protocol
                    && r.tos == 0
                    && (!r.at_own_metric() || desired.route(&r.prefix).is_none())
                {
                    stale.push(RouteOp::Delete(*r));
                }
            })
        });
        match res {
            Ok(()) => self.apply_route_ops(stale, Count::All),
            Err(e) => self.kernel_error(&format!("reading routes through {name}"), e),
        }
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one route write in order: filter, the IPIP check, the batch, then retries and corrections per refused route; the writes and their refusals share indices"
    )]
    fn apply_route_ops(&mut self, ops: Vec<RouteOp>, count: Count) {
        if ops.is_empty() {
            return;
        }
        // Not desired yet, but perhaps soon: leave new workload interfaces' routes alone.
        let ops: Vec<RouteOp> = if self.new_workloads.is_empty() {
            ops
        } else {
            let grace = Duration::from_secs(self.cfg.workload_grace_s);
            ops.into_iter()
                .filter(|op| match op {
                    RouteOp::Delete(r) => self
                        .new_workloads
                        .get(&r.oif)
                        .is_none_or(|seen| seen.elapsed() >= grace),
                    _ => true,
                })
                .collect()
        };
        let mut writable = Vec::with_capacity(ops.len());
        let mut ipip_needed = 0u64;
        for op in ops {
            match op {
                RouteOp::NoDevice {
                    prefix,
                    kind: Kind::Ipip,
                    dev,
                } => match self.ipip_device(dev) {
                    Some(index) => {
                        self.unsupported.remove(&prefix);
                        if let Some(spec) = self.desired.route(&prefix) {
                            writable.push(RouteOp::Write {
                                prefix,
                                spec,
                                oif: index,
                                why: Why::Missing,
                            });
                        }
                    }
                    None => {
                        ipip_needed += 1;
                        self.failing.remove(&prefix);
                        self.unsupported.insert(prefix, "ipip");
                    }
                },
                RouteOp::NoDevice { prefix, dev, .. } => {
                    debug!(
                        "route {prefix} waits for its device {}",
                        self.desired.devices().name(dev).unwrap_or("?")
                    );
                    self.failing.remove(&prefix);
                    self.waiting.insert(prefix);
                }
                other => {
                    let p = other.prefix();
                    self.waiting.remove(&p);
                    self.unsupported.remove(&p);
                    writable.push(other);
                }
            }
        }
        if ipip_needed > 0
            && let Some(msg) = &self.ipip_missing
        {
            let msg = format!("{ipip_needed} routes need IPIP: {msg}");
            self.fail(msg);
        }
        if writable.is_empty() {
            return;
        }
        let started = Instant::now();
        let refusals = match self
            .host
            .apply_routes(&writable, self.cfg.table, self.cfg.protocol)
        {
            Ok(r) => r,
            Err(e) => {
                self.kernel_error("writing routes", e);
                return;
            }
        };
        let mut refused = vec![false; writable.len()];
        let now = Instant::now();
        let max = Duration::from_secs(self.cfg.retry_max_s);
        for r in &refusals {
            refused[r.index] = true;
            let op = &writable[r.index];
            let p = op.prefix();
            let text = format!("route {p} ({}): {}", self.describe(op), r.error);
            let f = self.failing.entry(p).or_insert(Failure {
                attempts: 0,
                next: now,
                error: String::new(),
            });
            f.attempts += 1;
            let backoff = Duration::from_secs(1)
                .saturating_mul(1u32 << f.attempts.min(16).saturating_sub(1))
                .min(max);
            f.next = now + backoff;
            f.error = text.clone();
            warn!(
                "kernel refused {text}; retry in {} s (attempt {})",
                backoff.as_secs(),
                f.attempts
            );
            self.metrics.error(text);
        }
        let mut corrections = 0;
        for (op, refused) in writable.iter().zip(&refused) {
            if *refused {
                continue;
            }
            self.failing.remove(&op.prefix());
            let counts = match count {
                Count::Nothing => false,
                Count::All => op.is_correction(),
                Count::NotMissing => {
                    op.is_correction()
                        && !matches!(
                            op,
                            RouteOp::Write {
                                why: Why::Missing,
                                ..
                            }
                        )
                }
            };
            if counts {
                corrections += 1;
                info!("repaired {} ({})", op.prefix(), self.describe(op));
            }
        }
        self.metrics.correction("route", corrections);
        debug!(
            "{} route writes, {} refused, in {:.1} ms",
            writable.len(),
            refusals.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
    }

    fn describe(&self, op: &RouteOp) -> String {
        match op {
            RouteOp::Write { spec, oif, why, .. } => {
                let dev = self.names.get(oif).map(|(n, _)| n.as_str()).unwrap_or("");
                let via = spec
                    .gateway()
                    .map(|g| format!(" via {g}"))
                    .unwrap_or_default();
                let dev = if dev.is_empty() {
                    String::new()
                } else {
                    format!(" dev {dev}")
                };
                let why = match why {
                    Why::Missing => "missing".to_string(),
                    Why::Differs => "differed".to_string(),
                    Why::Foreign(p) => format!("replacing protocol {p}"),
                    Why::Changed => "desired change".to_string(),
                };
                format!(
                    "{}{via}{dev}{}, {why}",
                    spec.kind.name(),
                    if spec.onlink { " onlink" } else { "" }
                )
            }
            RouteOp::Delete(r) => format!(
                "delete, not desired (protocol {}, metric {})",
                r.protocol, r.metric
            ),
            RouteOp::DeleteOwn { .. } => "delete".into(),
            RouteOp::NoDevice { kind, .. } => format!("{} without its device", kind.name()),
        }
    }

    /// The IPIP device's index, setting it up once; `None` (with the reason kept) if the
    /// kernel cannot.
    fn ipip_device(&mut self, dev: DevId) -> Option<u32> {
        let name = self.desired.devices().name(dev)?.to_owned();
        if let Some(&i) = self.links.get(&name) {
            return Some(i);
        }
        if self.ipip_missing.is_some() {
            return None;
        }
        match self.host.ensure_ipip(&name) {
            Ok(index) => {
                self.links.insert(name.clone(), index);
                self.names.insert(index, (name, true));
                Some(index)
            }
            Err(e) => {
                self.ipip_missing = Some(e.to_string());
                self.fail(e.to_string());
                None
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // The VXLAN devices (one per family) and their entries

    /// The uplink of a family: the configured one, or the interface holding the node's
    /// address of that family (the local VTEP's underlay address).
    fn find_uplink(&mut self, underlay: IpAddr) -> Result<(u32, u32, String), String> {
        if !self.cfg.uplink.is_empty() {
            return match self.host.link(&self.cfg.uplink) {
                Ok(Some(l)) => Ok((l.index, l.mtu, l.name)),
                Ok(None) => Err(format!(
                    "uplink {} (routewriter.uplink) does not exist",
                    self.cfg.uplink
                )),
                Err(e) => Err(format!("reading uplink {}: {e}", self.cfg.uplink)),
            };
        }
        let addrs = self
            .host
            .all_addresses(IpFamily::of(underlay))
            .map_err(|e| format!("reading addresses: {e}"))?;
        let links = self
            .host
            .links()
            .map_err(|e| format!("reading links: {e}"))?;
        let vxlan = [&self.cfg.vxlan_device, &self.cfg.vxlan_device_v6];
        for (index, a, _) in addrs {
            if a != underlay {
                continue;
            }
            if let Some(l) = links
                .iter()
                .find(|l| l.index == index && !vxlan.contains(&&l.name))
            {
                return Ok((l.index, l.mtu, l.name.clone()));
            }
        }
        Err(format!(
            "no interface holds the node address {underlay}; set routewriter.uplink"
        ))
    }

    /// The name of a family's VXLAN device.
    fn vxlan_name(&self, family: IpFamily) -> &str {
        match family {
            IpFamily::V4 => &self.cfg.vxlan_device,
            IpFamily::V6 => &self.cfg.vxlan_device_v6,
        }
    }

    /// The device's MTU: the stream's, the configuration's, or the uplink's less the VXLAN
    /// overhead (50 bytes over IPv4, 70 over IPv6: its header is 20 bytes longer).
    fn vxlan_mtu(&self, family: IpFamily, stream: u32, uplink: u32) -> u32 {
        let (configured, overhead, least) = match family {
            IpFamily::V4 => (self.cfg.vxlan_mtu, 50, 68),
            IpFamily::V6 => (self.cfg.vxlan_mtu_v6, 70, 1280),
        };
        if stream != 0 {
            stream
        } else if configured != 0 {
            configured
        } else {
            uplink.saturating_sub(overhead).max(least)
        }
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one device's reconcile in order: the uplink, the device (keep, create, recreate or fix), its address, the routes a new device needs; each step needs the last one's result"
    )]
    fn sync_device(&mut self, family: IpFamily, count: Count) {
        let fi = family.index();
        let name = self.vxlan_name(family).to_owned();
        let Some(local) = self.desired.local_vtep(family).copied() else {
            // VXLAN of this family is not wanted: the device of that name is ours, remove it.
            if let Ok(Some(l)) = self.host.link(&name)
                && l.kind.as_deref() == Some("vxlan")
            {
                info!(
                    "removing {name}: no local {} VTEP is desired",
                    family_label(family)
                );
                if let Err(e) = self.host.delete_link(l.index) {
                    self.kernel_error(&format!("removing {name}"), e);
                }
            }
            self.vxlan_index[fi] = None;
            return;
        };
        let (uplink, uplink_mtu, uplink_name) = match self.find_uplink(local.underlay) {
            Ok(u) => u,
            Err(e) => {
                self.fail(format!("VXLAN device {name} not programmed: {e}"));
                return;
            }
        };
        self.uplink_name[fi] = Some(uplink_name);
        let spec = DeviceSpec {
            name: name.clone(),
            vni: if local.vni != 0 {
                local.vni
            } else {
                self.cfg.vni
            },
            port: if local.port != 0 {
                local.port
            } else {
                self.cfg.vxlan_port
            },
            local: local.underlay,
            link: uplink,
            mac: local
                .mac
                .unwrap_or_else(|| vtep_mac(&self.node, family_to_proto(family))),
            mtu: self.vxlan_mtu(family, local.mtu, uplink_mtu),
        };
        let actual = match self.host.link(&name) {
            Ok(a) => a,
            Err(e) => return self.kernel_error(&format!("reading {name}"), e),
        };
        let mut recreated = false;
        let index = match reconcile::diff_device(&spec, actual.as_ref()) {
            DeviceAction::Keep => actual.map(|a| a.index),
            DeviceAction::Create => {
                recreated = true;
                // Gone after the first sync: someone deleted it.
                if count != Count::Nothing {
                    self.metrics.correction("device", 1);
                }
                self.create_device(&spec)
            }
            DeviceAction::Recreate(why) => {
                warn!("recreating {name}: {why}");
                recreated = true;
                if count != Count::Nothing {
                    self.metrics.correction("device", 1);
                }
                if let Some(a) = &actual
                    && let Err(e) = self.host.delete_link(a.index)
                {
                    self.kernel_error(&format!("removing {name}"), e);
                    return;
                }
                self.create_device(&spec)
            }
            DeviceAction::Fix { mtu, mac, up } => {
                // A device that was down lost its routes (the kernel drops them silently).
                recreated = up;
                let index = actual.as_ref().map(|a| a.index).unwrap_or(0);
                info!("fixing {name}: mtu {mtu:?} mac {mac:?} up {up}");
                if count != Count::Nothing {
                    self.metrics.correction("device", 1);
                }
                match self.host.set_link(index, mtu, mac, up) {
                    Ok(()) => Some(index),
                    Err(e) => {
                        self.kernel_error(&format!("fixing {name}"), e);
                        Some(index)
                    }
                }
            }
        };
        let Some(index) = index else {
            self.vxlan_index[fi] = None;
            return;
        };
        self.vxlan_index[fi] = Some(index);
        self.links.insert(name.clone(), index);
        self.names.insert(index, (name.clone(), true));
        match self.host.addresses(index, family) {
            Ok(have) => {
                let (add, del) = reconcile::diff_addresses(family, Some(local.tunnel), &have);
                for (a, len) in del {
                    if let Err(e) = self.host.del_address(index, a, len) {
                        self.kernel_error(&format!("removing {a}/{len} from {name}"), e);
                    }
                }
                if let Some((a, len)) = add {
                    if count != Count::Nothing {
                        self.metrics.correction("address", 1);
                    }
                    if let Err(e) = self.host.add_address(index, a, len) {
                        self.kernel_error(&format!("adding {a}/{len} to {name}"), e);
                    }
                }
            }
            Err(e) => self.kernel_error(&format!("reading addresses of {name}"), e),
        }
        if recreated && self.synced {
            // A new (or re-enabled) device has no routes: put them back.
            self.sync_vteps(family, Count::Nothing);
            self.sync_routes_on_link(&name);
        }
    }

    fn create_device(&mut self, spec: &DeviceSpec) -> Option<u32> {
        info!(
            "creating {} vni {} port {} local {} mtu {}",
            spec.name, spec.vni, spec.port, spec.local, spec.mtu
        );
        match self.host.create_vxlan(spec) {
            Ok(i) => Some(i),
            Err(e) => {
                self.kernel_error(&format!("creating {}", spec.name), e);
                None
            }
        }
    }

    fn sync_vteps(&mut self, family: IpFamily, count: Count) {
        let Some(index) = self.vxlan_index[family.index()] else {
            return;
        };
        let name = self.vxlan_name(family).to_owned();
        let neigh = match self.host.neighbours(index, family) {
            Ok(n) => n,
            Err(e) => return self.kernel_error(&format!("reading neighbours of {name}"), e),
        };
        let fdb = match self.host.fdb(index) {
            Ok(f) => f,
            Err(e) => return self.kernel_error(&format!("reading the FDB of {name}"), e),
        };
        let local = self.desired.local_vtep(family).map(|l| l.tunnel);
        let (nops, fops) =
            reconcile::diff_vteps(self.desired.vteps(family).values(), local, &neigh, &fdb);
        if !fops.is_empty() {
            let result = self.host.apply_fdb(index, &fops);
            let describe = |i: usize| super::kernel::describe_fdb(&fops[i]);
            self.report_vtep_writes(result, fops.len(), describe, &name, "fdb", count);
        }
        if !nops.is_empty() {
            let result = self.host.apply_neighbours(index, &nops);
            let describe = |i: usize| super::kernel::describe_neigh(&nops[i]);
            self.report_vtep_writes(result, nops.len(), describe, &name, "neigh", count);
        }
    }

    /// One batch of FDB (`kind` "fdb") or neighbour ("neigh") writes on VXLAN device `name`:
    /// each refusal is a failure, the rest count as corrections.
    fn report_vtep_writes(
        &mut self,
        result: Result<Vec<Refusal>, NlError>,
        total: usize,
        describe: impl Fn(usize) -> String,
        name: &str,
        kind: &'static str,
        count: Count,
    ) {
        let entries = if kind == "fdb" {
            "FDB entries"
        } else {
            "neighbour entries"
        };
        match result {
            Ok(refused) => {
                for r in &refused {
                    let what = describe(r.index);
                    self.fail(format!("kernel refused {what} on {name}: {}", r.error));
                }
                if count != Count::Nothing {
                    let done = total - refused.len();
                    self.metrics.correction(kind, done as u64);
                    info!("repaired {done} {entries} on {name}");
                }
            }
            Err(e) => self.kernel_error(&format!("writing the {entries} of {name}"), e),
        }
    }

    // -----------------------------------------------------------------------------------------
    // NAT and sysctls

    /// Each family's table: IPv4's whenever NAT is on, IPv6's only while IPv6 pools are
    /// desired (see `nat`).
    /// The namespace's nftables tables, listed once for a full sync's NAT and policy tables
    /// (`None`: neither is on, or the listing failed and each reads its own).
    fn nft_tables(&self) -> Option<Tables> {
        if !self.cfg.nat && !self.cfg.policy {
            return None;
        }
        self.host
            .nft_tables()
            .inspect_err(|e| debug!("listing the nftables tables: {e}; each is read on its own"))
            .ok()
    }

    fn sync_nat(&mut self, count: Count, known: Option<&Tables>) {
        if !self.cfg.nat {
            return;
        }
        let pools = self.desired.pools();
        let mut errors = Vec::new();
        let mut repaired = Vec::new();
        for f in IpFamily::ALL {
            let wanted = f == IpFamily::V4 || pools.keys().any(|n| IpFamily::of(n.addr()) == f);
            let desired = wanted.then(|| nat::desired_from_pools(pools, f));
            match self.host.sync_nat(f, desired.as_ref(), known) {
                Ok(true) => repaired.push(f),
                Ok(false) => {}
                Err(e) => errors.push(format!(
                    "natOutgoing of {} not programmed: {e}",
                    family_label(f)
                )),
            }
        }
        for e in errors {
            self.fail(e);
        }
        if count != Count::Nothing {
            for f in repaired {
                self.metrics.correction("nat", 1);
                info!(
                    "repaired the nftables table {} {}",
                    nat::nft_family(f),
                    self.cfg.nat_table
                );
            }
        }
    }

    /// The network-policy table (see `policy`): written only where it differs from what the
    /// desired state renders; a refused write leaves the previous ruleset in force.
    fn sync_policy(&mut self, count: Count, known: Option<&Tables>) {
        if !self.cfg.policy {
            return;
        }
        // A full sync (start, the periodic resync, a repair) reads the table back for drift;
        // a change from the stream is planned against the last write.
        let result = self
            .host
            .sync_policy(self.desired.policy(), count != Count::Nothing, known);
        let (endpoints, rules, sets) = self.desired.policy().counts();
        let refused = result.as_ref().err().map(|e| e.to_string());
        self.metrics.update(|s| {
            s.policy_endpoints = endpoints as u64;
            s.policy_rules = rules as u64;
            s.policy_sets = sets as u64;
            s.policy_refused += u64::from(refused.is_some());
            s.policy_error = refused;
        });
        match result {
            Ok(written) => {
                if self.policy_retry.take().is_some() {
                    info!("network policy in force again");
                }
                if written && count != Count::Nothing {
                    self.metrics.correction("policy", 1);
                    info!("repaired the nftables table inet {}", self.cfg.policy_table);
                }
            }
            Err(e) => {
                // Tried again with a backoff, not only at the next resync: what refused it
                // (another process holding the table, say) may go away.
                let max = Duration::from_secs(self.cfg.retry_max_s);
                let wait = self
                    .policy_retry
                    .map_or(Duration::from_secs(1), |(_, w)| (w * 2).min(max));
                self.policy_retry = Some((Instant::now() + wait, wait));
                self.fail(format!(
                    "network policy not programmed, the previous ruleset stays in force (retry in {wait:?}): {e}"
                ))
            }
        }
    }

    /// nft transactions run, both tables.
    fn nft_writes(&self) -> u64 {
        self.host.nft_writes()
    }

    fn ensure_forwarding(&mut self, family: IpFamily) {
        let key = match family {
            IpFamily::V4 => FORWARDING_V4,
            IpFamily::V6 => FORWARDING_V6,
        };
        match self.sysctls.ensure(key, "1") {
            Ok(true) if self.synced => self.metrics.correction("sysctl", 1),
            Ok(_) => {}
            Err(e) => self.fail(e.to_string()),
        }
    }

    /// The workload interfaces that carry IPv6 (an IPv6 workload route goes through them).
    fn v6_workloads(&self) -> HashSet<DevId> {
        self.desired
            .routes()
            .iter_of(IpFamily::V6)
            .filter(|(_, s)| s.kind == Kind::Workload)
            .map(|(_, s)| s.dev)
            .collect()
    }

    /// The sysctls of the workload interfaces `names`.
    fn workload_sysctls<'n>(&mut self, names: impl IntoIterator<Item = &'n String>, count: Count) {
        let v6 = self.v6_workloads();
        for name in names {
            let with_v6 = self
                .desired
                .devices()
                .id(name)
                .is_some_and(|d| v6.contains(&d));
            let written = self.sysctls.ensure_workload(name).and_then(|n| {
                Ok(n + if with_v6 {
                    self.sysctls.ensure_workload_v6(name)?
                } else {
                    0
                })
            });
            match written {
                Ok(n) if n > 0 && count != Count::Nothing => {
                    self.metrics.correction("sysctl", n as u64)
                }
                Ok(_) => {}
                // The interface may be gone already.
                Err(e) => debug!("{e}"),
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Drift from the netlink watch

    /// Handles a batch of netlink events: repairs what they show is wrong.
    #[expect(
        clippy::too_many_lines,
        reason = "one netlink batch: classify every event, then repair per kind (full resync, devices, VTEPs, routes, workloads); the repairs read the flags the classification set"
    )]
    pub fn handle_events(&mut self, events: Vec<Event>) {
        let mut full = false;
        // Per family: the VXLAN device or its uplink changed; its entries changed.
        let mut device = [false; 2];
        let mut vteps = [false; 2];
        let mut routes_all = false;
        // Last known state of each desired prefix touched (None: deleted).
        let mut touched: HashMap<Prefix, Option<ActualRoute>> = HashMap::new();
        let mut stale: Vec<RouteOp> = Vec::new();
        let mut links_changed: BTreeSet<String> = BTreeSet::new();
        let mut workloads: BTreeSet<String> = BTreeSet::new();
        for ev in events {
            match ev {
                Event::Overflow => full = true,
                Event::Route { deleted, route } => {
                    if route.tos != 0 {
                        continue;
                    }
                    let desired =
                        route.at_own_metric() && self.desired.route(&route.prefix).is_some();
                    if desired {
                        touched.insert(route.prefix, (!deleted).then_some(route));
                    } else if !deleted && route.protocol == self.cfg.protocol {
                        stale.push(RouteOp::Delete(route));
                    }
                }
                Event::Link {
                    deleted,
                    index,
                    name,
                    up,
                } => {
                    let was_up = self.names.get(&index).map(|(_, up)| *up);
                    if deleted {
                        self.names.remove(&index);
                        if self.links.get(&name) == Some(&index) {
                            self.links.remove(&name);
                        }
                    } else {
                        if let Some((old, _)) = self.names.get(&index)
                            && *old != name
                            && self.links.get(old) == Some(&index)
                        {
                            let old = old.clone();
                            self.links.remove(&old);
                        }
                        self.links.insert(name.clone(), index);
                        self.names.insert(index, (name.clone(), up));
                    }
                    let mut vxlan = false;
                    for f in IpFamily::ALL {
                        let i = f.index();
                        if name == self.vxlan_name(f) || Some(index) == self.vxlan_index[i] {
                            device[i] = true;
                            vteps[i] = true;
                            vxlan = true;
                        }
                        if self.uplink_name[i].as_deref() == Some(name.as_str()) {
                            device[i] = true;
                        }
                    }
                    let workload = name.starts_with(&self.cfg.workload_prefix);
                    if workload && !deleted && was_up.is_none() {
                        self.new_workloads.insert(index, Instant::now());
                    }
                    if deleted {
                        self.new_workloads.remove(&index);
                    }
                    if !deleted {
                        if self.desired.devices().id(&name).is_some() {
                            links_changed.insert(name.clone());
                        }
                        if workload {
                            workloads.insert(name.clone());
                        }
                    }
                    // The kernel drops routes through a link that goes away or down without
                    // telling anyone; routes without a device of their own may have used it.
                    let flapped = was_up.is_some_and(|w| w != up);
                    if !workload && (deleted || flapped) && !vxlan {
                        routes_all = true;
                    }
                }
                Event::Neigh { ifindex, .. } => {
                    for f in IpFamily::ALL {
                        if Some(ifindex) == self.vxlan_index[f.index()] {
                            vteps[f.index()] = true;
                        }
                    }
                }
            }
        }
        if !self.desired.is_complete() || !self.synced {
            return;
        }
        if full {
            info!("netlink notifications were lost; resyncing everything");
            self.full_sync();
            return;
        }
        for f in IpFamily::ALL {
            let i = f.index();
            if device[i] {
                self.sync_device(f, Count::All);
            }
            if vteps[i] || device[i] {
                self.sync_vteps(f, Count::All);
            }
        }
        if routes_all {
            self.sync_routes(Count::All);
        } else {
            for name in &links_changed {
                self.sync_routes_on_link(name);
            }
        }
        if !stale.is_empty() {
            self.apply_route_ops(stale, Count::All);
        }
        if !touched.is_empty() && !routes_all {
            let wrong: Vec<Prefix> = {
                let links = &self.links;
                let desired = &self.desired;
                let proto = self.cfg.protocol;
                let mut v: Vec<Prefix> = touched
                    .iter()
                    .filter(|(p, now)| {
                        let Some(spec) = desired.route(p) else {
                            return false;
                        };
                        let Some(r) = now else {
                            return true;
                        };
                        let oif = match spec.dev {
                            DevId::NONE => Some(0),
                            d => desired
                                .devices()
                                .name(d)
                                .and_then(|n| links.get(n).copied()),
                        };
                        match oif {
                            Some(oif) => !reconcile::route_matches(&spec, oif, r, proto),
                            None => false,
                        }
                    })
                    .map(|(p, _)| *p)
                    .collect();
                v.sort_unstable();
                v
            };
            if !wrong.is_empty() {
                let ops: Vec<RouteOp> = self
                    .ops_for(&wrong)
                    .into_iter()
                    .map(|op| match op {
                        RouteOp::Write {
                            prefix, spec, oif, ..
                        } => RouteOp::Write {
                            prefix,
                            spec,
                            oif,
                            why: Why::Differs,
                        },
                        other => other,
                    })
                    .collect();
                self.apply_route_ops(ops, Count::All);
            }
        }
        if self.cfg.sysctls && !workloads.is_empty() {
            self.workload_sysctls(&workloads, Count::All);
        }
        self.publish();
    }

    /// Copies counters into the metrics.
    fn publish(&self) {
        let counts = IpFamily::ALL.map(|f| self.desired.counts(f));
        let vteps = IpFamily::ALL.map(|f| self.desired.vteps(f).len() as u64);
        let mut unsupported: HashMap<&'static str, u64> = HashMap::new();
        for f in self.unsupported.values() {
            *unsupported.entry(f).or_insert(0) += 1;
        }
        let mut examples: Vec<String> = self.failing.values().map(|f| f.error.clone()).collect();
        examples.sort();
        examples.truncate(20);
        let netlink = self.host.netlink_writes();
        let nft = self.nft_writes();
        let sysctl = self.sysctls.writes;
        let vxlan: Vec<String> = IpFamily::ALL
            .into_iter()
            .filter(|f| self.vxlan_index[f.index()].is_some())
            .map(|f| self.vxlan_name(f).to_owned())
            .collect();
        self.metrics.update(|s| {
            s.revision = self.desired.revision();
            for k in Kind::ALL {
                let n = counts.iter().map(|c| c[k as usize] as u64).sum();
                s.routes.insert(k.name(), n);
            }
            for f in IpFamily::ALL {
                let kinds = s.routes_by_family.entry(family_label(f)).or_default();
                for k in Kind::ALL {
                    kinds.insert(k.name(), counts[f.index()][k as usize] as u64);
                }
                s.vteps.insert(family_label(f), vteps[f.index()]);
            }
            s.routes_failing = self.failing.len() as u64;
            s.routes_waiting_for_device = self.waiting.len() as u64;
            s.routes_unsupported = unsupported
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect();
            s.netlink_writes = netlink;
            s.nft_writes = nft;
            s.sysctl_writes = sysctl;
            s.vxlan_devices = vxlan;
            s.failing_examples = examples;
        });
    }
}

/// Keeps the Dataplane stream open: connects, watches from the last revision received,
/// forwards updates, and on any failure waits (100 ms doubling up to `max`) and resumes.
async fn stream_loop(
    socket: PathBuf,
    tx: mpsc::Sender<DataplaneUpdate>,
    metrics: Arc<Metrics>,
    max: Duration,
) {
    let mut last = 0u64;
    let mut backoff = Duration::from_millis(100);
    let mut last_error = String::new();
    loop {
        match proto::client::connect_unix(&socket).await {
            Ok(channel) => {
                let mut client = DataplaneClient::new(channel);
                match client
                    .watch(WatchRequest {
                        from_revision: last,
                    })
                    .await
                {
                    Ok(resp) => {
                        info!(
                            from_revision = last,
                            "watching bgpd's desired dataplane state"
                        );
                        metrics.update(|s| s.stream_connected = true);
                        last_error.clear();
                        let mut stream = resp.into_inner();
                        loop {
                            match stream.message().await {
                                Ok(Some(update)) => {
                                    last = update.revision;
                                    backoff = Duration::from_millis(100);
                                    if tx.send(update).await.is_err() {
                                        return;
                                    }
                                }
                                Ok(None) => {
                                    warn!("bgpd ended the Dataplane stream; reconnecting");
                                    break;
                                }
                                Err(status) => {
                                    warn!(
                                        "Dataplane stream failed: {}; reconnecting",
                                        status.message()
                                    );
                                    break;
                                }
                            }
                        }
                        metrics.update(|s| {
                            s.stream_connected = false;
                            s.stream_reconnects += 1;
                        });
                    }
                    Err(status) => {
                        let text =
                            format!("bgpd refused the Dataplane watch: {}", status.message());
                        if text != last_error {
                            warn!("{text}; retrying, the kernel keeps its state");
                            metrics.error(text.clone());
                            last_error = text;
                        }
                    }
                }
            }
            Err(e) => {
                let text = e.to_string();
                if text != last_error {
                    warn!("{text}; retrying, the kernel keeps its state");
                    metrics.error(text.clone());
                    last_error = text;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(max);
    }
}

/// Runs routewriter until SIGTERM or SIGINT, on any tokio runtime (the binary's has one thread).
pub async fn run(config: Config) -> Result<(), AgentError> {
    use tokio::signal::unix::{SignalKind, signal};
    let cfg = config.routewriter.clone();
    let metrics = Metrics::new();
    let mut terminate = signal(SignalKind::terminate()).map_err(AgentError::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(AgentError::Signal)?;
    if let Some(addr) = cfg.metrics_listen {
        let listener = metrics::bind(addr)
            .await
            .map_err(|source| AgentError::Metrics { addr, source })?;
        tokio::spawn(metrics::serve(listener, metrics.clone()));
    }
    // The watch opens before the first read, so no change falls between them; it skips the
    // agent's own route writes from the moment the agent has its socket.
    let own = Arc::new(AtomicU32::new(0));
    let mut events = monitor::start(cfg.table, 4096, own.clone()).map_err(AgentError::Monitor)?;
    let mut agent = Agent::new(cfg.clone(), config.node.name.clone(), metrics.clone())?;
    own.store(agent.host().kernel.port_id(), Ordering::Relaxed);
    let (tx, mut updates) = mpsc::channel(64);
    let stream = tokio::spawn(stream_loop(
        cfg.socket.clone(),
        tx,
        metrics.clone(),
        Duration::from_millis(cfg.reconnect_max_ms),
    ));
    let mut resync = tokio::time::interval(Duration::from_secs(cfg.resync_interval_s));
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resync.tick().await;
    let mut retry = tokio::time::interval(Duration::from_millis(500));
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!(
        node = %config.node.name,
        socket = %cfg.socket.display(),
        protocol = cfg.protocol,
        table = cfg.table,
        "routewriter started; nothing is written before bgpd's first snapshot"
    );
    loop {
        tokio::select! {
            Some(()) = terminate.recv() => {
                info!("SIGTERM: exiting and leaving the kernel as it is");
                break;
            }
            Some(()) = interrupt.recv() => {
                info!("SIGINT: exiting and leaving the kernel as it is");
                break;
            }
            Some(u) = updates.recv() => {
                let mut batch = vec![u];
                while batch.len() < 256 {
                    match updates.try_recv() {
                        Ok(u) => batch.push(u),
                        Err(_) => break,
                    }
                }
                agent.apply_updates(&batch);
            }
            Some(ev) = events.recv() => {
                let mut batch = vec![ev];
                while batch.len() < 65_536 {
                    match events.try_recv() {
                        Ok(e) => batch.push(e),
                        Err(_) => break,
                    }
                }
                agent.handle_events(batch);
            }
            _ = resync.tick() => agent.periodic_resync(),
            _ = retry.tick() => agent.retry_due(),
        }
    }
    stream.abort();
    Ok(())
}

#[cfg(test)]
mod tests;
