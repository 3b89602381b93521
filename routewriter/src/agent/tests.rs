//! The agent's event handling against a recording fake of the host: updates and netlink
//! events in, the writes it asks for (and its metrics) out. The fake keeps a route table the
//! way the kernel would after each write, so a second pass shows what a converged agent does
//! (nothing). The namespace suite (interop-tests) runs the same agent on a real kernel.
//!
//! Why this file is long: the fake implements every call of the `Host` trait, and each
//! handler of the agent (updates, events, retries, full syncs) has its scenario here.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use host_kernel::netlink::{NlError, Nlmsgerr};
use host_kernel::sysctl::{FORWARDING_V4, FORWARDING_V6, Sysctls};
use net_types::IpFamily;
use proto::mac::Mac;
use proto::v1::desired_item::Item;
use proto::v1::{
    DataplaneUpdate, DesiredItem, EndpointPolicy, KernelRoute, NatPool, RouteKind as P,
};

use super::Agent;
use crate::config::RoutewriterConfig;
use crate::desired::{Kind, Prefix};
use crate::host::Host;
use crate::kernel::Refusal;
use crate::metrics::Metrics;
use crate::monitor::Event;
use crate::nat::NatDesired;
use crate::nft::{NftError, Tables};
use crate::policy::PolicyState;
use crate::reconcile::{
    ActualFdb, ActualLink, ActualNeigh, ActualRoute, DeviceSpec, FdbOp, NeighOp, RTN_BLACKHOLE,
    RTN_UNICAST, RouteOp, own_metric, route_scope,
};

/// One call the agent made of its host (reads of devices and addresses are not kept).
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Links,
    Routes(IpFamily, Option<u32>),
    /// The route batch, each op in words (see [`op`]).
    Apply(Vec<String>),
    /// natOutgoing of a family: masquerading pools desired (`None`: table removed), and
    /// whether the tables had been listed.
    Nat(IpFamily, Option<usize>, bool),
    /// The policy table: read back from the kernel, interfaces with rules.
    Policy(bool, usize),
}

/// The host as the agent sees it: a route table that follows the writes, links as set, and
/// scripted refusals.
#[derive(Default)]
struct Fake {
    links: Vec<ActualLink>,
    routes: Vec<ActualRoute>,
    /// Writes to these prefixes are refused with this errno.
    refuse: HashMap<Prefix, i32>,
    /// This many route dumps answer "interrupted" before they succeed.
    interrupted_dumps: usize,
    /// This many policy writes are refused by nft before they succeed.
    policy_refusals: usize,
    calls: Vec<Call>,
    writes: u64,
    nft_writes: u64,
    tables_listed: Cell<u32>,
}

/// An op in words: "write P why", "delete P proto N", "delete-own P".
fn op(o: &RouteOp) -> String {
    match o {
        RouteOp::Write {
            prefix, oif, why, ..
        } => format!("write {prefix} oif {oif} {why:?}"),
        RouteOp::Delete(r) => format!("delete {} proto {}", r.prefix, r.protocol),
        RouteOp::DeleteOwn { prefix } => format!("delete-own {prefix}"),
        RouteOp::NoDevice { prefix, .. } => format!("no-device {prefix}"),
    }
}

impl Fake {
    /// The calls since the last look, and forgets them.
    fn take(&mut self) -> Vec<Call> {
        std::mem::take(&mut self.calls)
    }

    /// The route writes since the last look, in order.
    fn take_writes(&mut self) -> Vec<String> {
        self.take()
            .into_iter()
            .flat_map(|c| match c {
                Call::Apply(ops) => ops,
                _ => vec![],
            })
            .collect()
    }
}

/// A route as the kernel reports it after routewriter wrote `spec` through `oif`.
fn as_written(prefix: Prefix, kind: Kind, gateway: Option<IpAddr>, oif: u32) -> ActualRoute {
    ActualRoute {
        prefix,
        table: 254,
        protocol: 80,
        metric: own_metric(prefix.family()),
        tos: 0,
        rtype: if kind == Kind::Blackhole {
            RTN_BLACKHOLE
        } else {
            RTN_UNICAST
        },
        scope: route_scope(kind, prefix.family()),
        gateway,
        oif,
        onlink: false,
        multipath: false,
    }
}

impl Host for Fake {
    fn netlink_writes(&self) -> u64 {
        self.writes
    }
    fn links(&mut self) -> Result<Vec<ActualLink>, NlError> {
        self.calls.push(Call::Links);
        Ok(self.links.clone())
    }
    fn link(&mut self, name: &str) -> Result<Option<ActualLink>, NlError> {
        Ok(self.links.iter().find(|l| l.name == name).cloned())
    }
    fn routes(
        &mut self,
        family: IpFamily,
        table: u32,
        oif: Option<u32>,
        mut f: impl FnMut(&ActualRoute),
    ) -> Result<(), NlError> {
        self.calls.push(Call::Routes(family, oif));
        if self.interrupted_dumps > 0 {
            self.interrupted_dumps -= 1;
            return Err(NlError::DumpInterrupted);
        }
        self.routes
            .iter()
            .filter(|r| r.prefix.family() == family && r.table == table)
            .filter(|r| oif.is_none_or(|i| r.oif == i))
            .for_each(&mut f);
        Ok(())
    }
    fn apply_routes(
        &mut self,
        ops: &[RouteOp],
        table: u32,
        protocol: u8,
    ) -> Result<Vec<Refusal>, NlError> {
        self.calls.push(Call::Apply(ops.iter().map(op).collect()));
        self.writes += ops.len() as u64;
        let mut refused = Vec::new();
        for (index, o) in ops.iter().enumerate() {
            if let Some(&errno) = self.refuse.get(&o.prefix()) {
                let message = "Nexthop has invalid gateway".into();
                let error = Nlmsgerr { errno, message };
                refused.push(Refusal { index, error });
                continue;
            }
            let own = |r: &ActualRoute, p: Prefix| {
                r.prefix == p && r.protocol == protocol && r.at_own_metric() && r.table == table
            };
            match *o {
                RouteOp::Write {
                    prefix, spec, oif, ..
                } => {
                    self.routes
                        .retain(|r| !(r.prefix == prefix && r.at_own_metric()));
                    let mut r = as_written(prefix, spec.kind, spec.gateway(), oif);
                    r.onlink = spec.onlink;
                    self.routes.push(r);
                }
                RouteOp::Delete(d) => self.routes.retain(|r| *r != d),
                RouteOp::DeleteOwn { prefix } => self.routes.retain(|r| !own(r, prefix)),
                RouteOp::NoDevice { .. } => {}
            }
        }
        Ok(refused)
    }
    fn create_vxlan(&mut self, spec: &DeviceSpec) -> Result<u32, NlError> {
        panic!(
            "no VTEP is desired in these tests, yet {} was created",
            spec.name
        )
    }
    fn set_link(&mut self, _: u32, _: Option<u32>, _: Option<Mac>, _: bool) -> Result<(), NlError> {
        panic!("no device is desired in these tests")
    }
    fn delete_link(&mut self, index: u32) -> Result<(), NlError> {
        panic!("link {index} deleted, but no test has a device of routewriter's")
    }
    fn ensure_ipip(&mut self, name: &str) -> Result<u32, NlError> {
        panic!("{name} asked for, but no IPIP route is desired in these tests")
    }
    fn all_addresses(&mut self, _: IpFamily) -> Result<Vec<(u32, IpAddr, u8)>, NlError> {
        Ok(vec![])
    }
    fn add_address(&mut self, index: u32, addr: IpAddr, _: u8) -> Result<(), NlError> {
        panic!("{addr} added to link {index} without a device")
    }
    fn del_address(&mut self, index: u32, addr: IpAddr, _: u8) -> Result<(), NlError> {
        panic!("{addr} removed from link {index} without a device")
    }
    fn neighbours(&mut self, _: u32, _: IpFamily) -> Result<Vec<ActualNeigh>, NlError> {
        Ok(vec![])
    }
    fn fdb(&mut self, _: u32) -> Result<Vec<ActualFdb>, NlError> {
        Ok(vec![])
    }
    fn apply_neighbours(&mut self, _: u32, ops: &[NeighOp]) -> Result<Vec<Refusal>, NlError> {
        panic!("neighbour writes without a device: {ops:?}")
    }
    fn apply_fdb(&mut self, _: u32, ops: &[FdbOp]) -> Result<Vec<Refusal>, NlError> {
        panic!("FDB writes without a device: {ops:?}")
    }
    fn nft_tables(&self) -> Result<Tables, NftError> {
        self.tables_listed.set(self.tables_listed.get() + 1);
        Ok(Tables::default())
    }
    fn sync_nat(
        &mut self,
        family: IpFamily,
        desired: Option<&NatDesired>,
        known: Option<&Tables>,
    ) -> Result<bool, NftError> {
        let masq = desired.map(|d| d.masq.len());
        self.calls.push(Call::Nat(family, masq, known.is_some()));
        Ok(false)
    }
    fn sync_policy(
        &mut self,
        state: &PolicyState,
        read_back: bool,
        _: Option<&Tables>,
    ) -> Result<bool, NftError> {
        self.calls.push(Call::Policy(read_back, state.counts().0));
        if self.policy_refusals > 0 {
            self.policy_refusals -= 1;
            return Err(NftError::Nft {
                args: "-f -".into(),
                stderr: "Error: Could not process rule: Device or resource busy".into(),
            });
        }
        self.nft_writes += 1;
        Ok(true)
    }
    fn nft_writes(&self) -> u64 {
        self.nft_writes
    }
}

fn p(s: &str) -> Prefix {
    Prefix::parse(s).unwrap()
}

fn route(dest: &str, kind: P, gateway: &str, device: &str) -> DesiredItem {
    DesiredItem {
        item: Some(Item::Route(KernelRoute {
            destination: dest.into(),
            kind: kind as i32,
            gateway: gateway.into(),
            device: device.into(),
            onlink: false,
            source: "test".into(),
        })),
    }
}

fn blackhole(dest: &str) -> DesiredItem {
    route(dest, P::Blackhole, "", "")
}

fn update(revision: u64, snapshot: bool, upsert: Vec<DesiredItem>) -> DataplaneUpdate {
    DataplaneUpdate {
        revision,
        snapshot,
        upsert,
        remove: vec![],
    }
}

/// An agent on `fake` with NAT, policy and sysctls off unless `cfg` turns them on; its
/// sysctls live under `sysctl_root`.
fn agent_with(
    fake: Fake,
    sysctl_root: &std::path::Path,
    cfg: impl FnOnce(&mut RoutewriterConfig),
) -> (Agent<Fake>, Arc<Metrics>) {
    let mut c = RoutewriterConfig {
        nat: false,
        policy: false,
        sysctls: false,
        ..RoutewriterConfig::default()
    };
    cfg(&mut c);
    let metrics = Metrics::new();
    let sysctls = Sysctls::new(sysctl_root);
    let agent = Agent::with_host(c, "node-1".into(), metrics.clone(), fake, sysctls);
    (agent, metrics)
}

fn agent(fake: Fake) -> (Agent<Fake>, Arc<Metrics>) {
    agent_with(fake, std::path::Path::new("/nonexistent"), |_| {})
}

/// An agent converged to a snapshot of two blackholes; its calls so far forgotten.
fn converged() -> (Agent<Fake>, Arc<Metrics>) {
    let (mut a, m) = agent(Fake::default());
    a.apply_updates(&[update(
        1,
        true,
        vec![blackhole("10.65.0.0/26"), blackhole("10.65.0.64/26")],
    )]);
    a.host.take();
    (a, m)
}

#[test]
fn nothing_is_written_before_the_first_snapshot_then_it_converges_once() {
    let (mut a, m) = agent(Fake::default());
    a.apply_updates(&[update(1, false, vec![blackhole("10.65.0.0/26")])]);
    assert_eq!(a.host.take(), vec![]);
    assert!(!m.snapshot().synced);

    a.apply_updates(&[update(
        2,
        true,
        vec![blackhole("10.65.0.0/26"), blackhole("10.65.0.64/26")],
    )]);
    let calls = a.host.take();
    assert_eq!(
        calls,
        vec![
            Call::Links,
            Call::Routes(IpFamily::V4, None),
            Call::Routes(IpFamily::V6, None),
            Call::Apply(vec![
                "write 10.65.0.0/26 oif 0 Missing".into(),
                "write 10.65.0.64/26 oif 0 Missing".into(),
            ]),
        ]
    );
    let s = m.snapshot();
    assert!(s.synced);
    assert_eq!((s.revision, s.resyncs, s.netlink_writes), (2, 1, 2));
    // Converging to the first snapshot is bgpd's doing, not drift.
    assert_eq!(s.corrections.get("route"), None);

    // Converged: a full pass reads, finds nothing, writes nothing.
    a.full_sync();
    assert_eq!(a.host.take_writes(), Vec::<String>::new());
    assert_eq!(m.snapshot().resyncs, 2);
}

#[test]
fn a_full_sync_repairs_drift_and_counts_it() {
    let (mut a, m) = converged();
    // Someone deleted one of ours, added a route of protocol 80 and one of another protocol.
    a.host.routes.retain(|r| r.prefix != p("10.65.0.64/26"));
    let stale = as_written(p("10.99.0.0/24"), Kind::Blackhole, None, 0);
    let mut foreign = as_written(p("10.98.0.0/24"), Kind::Blackhole, None, 0);
    foreign.protocol = 4;
    a.host.routes.extend([stale, foreign]);

    a.full_sync();
    let mut writes = a.host.take_writes();
    writes.sort();
    assert_eq!(
        writes,
        vec![
            "delete 10.99.0.0/24 proto 80".to_owned(),
            "write 10.65.0.64/26 oif 0 Missing".into(),
        ]
    );
    assert_eq!(m.snapshot().corrections.get("route"), Some(&2));
    assert!(
        a.host.routes.contains(&foreign),
        "another protocol's route is not ours"
    );
}

#[test]
fn netlink_events_are_repaired_without_a_dump() {
    let (mut a, m) = converged();
    let ours = as_written(p("10.65.0.0/26"), Kind::Blackhole, None, 0);
    a.host.routes.retain(|r| *r != ours);
    let stale = as_written(p("10.99.0.0/24"), Kind::Blackhole, None, 0);
    let mut foreign = stale;
    foreign.protocol = 4;
    let mut tos = as_written(p("10.65.0.64/26"), Kind::Blackhole, None, 0);
    tos.tos = 8;
    a.handle_events(vec![
        Event::Route {
            deleted: true,
            route: ours,
        },
        Event::Route {
            deleted: false,
            route: stale,
        },
        Event::Route {
            deleted: false,
            route: foreign,
        },
        Event::Route {
            deleted: false,
            route: tos,
        },
    ]);
    assert_eq!(
        a.host.take(),
        vec![
            Call::Apply(vec!["delete 10.99.0.0/24 proto 80".into()]),
            Call::Apply(vec!["write 10.65.0.0/26 oif 0 Differs".into()]),
        ]
    );
    assert_eq!(m.snapshot().corrections.get("route"), Some(&2));

    // The route as it is now, reported again: nothing to do.
    a.handle_events(vec![Event::Route {
        deleted: false,
        route: ours,
    }]);
    assert_eq!(a.host.take(), vec![]);
}

#[test]
fn lost_notifications_bring_a_full_resync() {
    let (mut a, m) = converged();
    a.host.routes.clear();
    a.handle_events(vec![Event::Overflow]);
    assert_eq!(
        a.host.take(),
        vec![
            Call::Links,
            Call::Routes(IpFamily::V4, None),
            Call::Routes(IpFamily::V6, None),
            Call::Apply(vec![
                "write 10.65.0.0/26 oif 0 Missing".into(),
                "write 10.65.0.64/26 oif 0 Missing".into(),
            ]),
        ]
    );
    let s = m.snapshot();
    assert_eq!((s.resyncs, s.corrections.get("route")), (2, Some(&2)));
}

#[test]
fn refused_routes_back_off_and_are_retried() {
    let refused = p("10.65.0.64/26");
    let mut fake = Fake::default();
    fake.refuse.insert(refused, libc::ENETUNREACH);
    let (mut a, m) = agent(fake);
    a.apply_updates(&[update(
        1,
        true,
        vec![blackhole("10.65.0.0/26"), blackhole("10.65.0.64/26")],
    )]);
    a.host.take();
    let s = m.snapshot();
    assert_eq!(s.routes_failing, 1);
    assert_eq!(s.failing_examples.len(), 1);
    assert!(
        s.failing_examples[0].starts_with("route 10.65.0.64/26 (blackhole, missing): "),
        "{:?}",
        s.failing_examples
    );
    assert!(s.failing_examples[0].ends_with(": Nexthop has invalid gateway"));

    // Not due yet: nothing is tried.
    a.retry_due();
    assert_eq!(a.host.take(), vec![]);

    // Due and refused again: the wait doubles.
    a.failing.get_mut(&refused).unwrap().next = Instant::now();
    a.retry_due();
    assert_eq!(
        a.host.take_writes(),
        vec!["write 10.65.0.64/26 oif 0 Changed".to_owned()]
    );
    let f = &a.failing[&refused];
    assert_eq!(f.attempts, 2);
    let wait = f.next.saturating_duration_since(Instant::now());
    assert!(
        wait > Duration::from_millis(1500) && wait <= Duration::from_secs(2),
        "{wait:?}"
    );

    // Due and accepted: nothing fails any more.
    a.host.refuse.clear();
    a.failing.get_mut(&refused).unwrap().next = Instant::now();
    a.retry_due();
    assert_eq!(
        a.host.take_writes(),
        vec!["write 10.65.0.64/26 oif 0 Changed".to_owned()]
    );
    let s = m.snapshot();
    assert_eq!((s.routes_failing, s.failing_examples.len()), (0, 0));
    assert!(a.failing.is_empty());
}

#[test]
fn a_dump_interrupted_three_times_leaves_a_full_resync_for_the_next_retry() {
    let fake = Fake {
        interrupted_dumps: 3,
        ..Fake::default()
    };
    let (mut a, _m) = agent(fake);
    a.apply_updates(&[update(1, true, vec![blackhole("10.65.0.0/26")])]);
    assert_eq!(
        a.host.take(),
        vec![
            Call::Links,
            Call::Routes(IpFamily::V4, None),
            Call::Routes(IpFamily::V4, None),
            Call::Routes(IpFamily::V4, None),
        ]
    );
    assert!(a.need_full);

    a.retry_due();
    assert_eq!(
        a.host.take(),
        vec![
            Call::Links,
            Call::Routes(IpFamily::V4, None),
            Call::Routes(IpFamily::V6, None),
            Call::Apply(vec!["write 10.65.0.0/26 oif 0 Missing".into()]),
        ]
    );
    assert!(!a.need_full);
}

#[test]
fn a_refused_policy_is_shown_and_retried_until_in_force() {
    let fake = Fake {
        policy_refusals: 1,
        ..Fake::default()
    };
    let (mut a, m) = agent_with(fake, std::path::Path::new("/nonexistent"), |c| {
        c.policy = true
    });
    let endpoint = DesiredItem {
        item: Some(Item::EndpointPolicy(EndpointPolicy {
            interface: "cali1".into(),
            ingress_selected: true,
            ingress: vec![],
            egress_selected: false,
            egress: vec![],
        })),
    };
    a.apply_updates(&[update(1, true, vec![endpoint])]);
    // The first convergence plans against the table as read (no write known yet).
    assert!(a.host.take().contains(&Call::Policy(false, 1)));
    assert_eq!(a.host.tables_listed.get(), 1);
    let s = m.snapshot();
    assert_eq!((s.policy_endpoints, s.policy_refused), (1, 1));
    assert!(
        s.policy_error
            .as_deref()
            .is_some_and(|e| e.contains("Device or resource busy")),
        "{s:?}"
    );
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("the previous ruleset stays in force")),
        "{s:?}"
    );

    // Not due: not tried.
    a.retry_due();
    assert_eq!(a.host.take(), vec![]);

    // Due: tried again and in force.
    let (_, wait) = a.policy_retry.unwrap();
    assert_eq!(wait, Duration::from_secs(1));
    a.policy_retry = Some((Instant::now(), wait));
    a.retry_due();
    assert_eq!(a.host.take(), vec![Call::Policy(false, 1)]);
    let s = m.snapshot();
    assert_eq!((s.policy_error, s.policy_refused), (None, 1));
    assert_eq!(a.host.nft_writes, 1);
    assert!(a.policy_retry.is_none());

    // A full sync reads the table back, for drift.
    a.full_sync();
    assert!(a.host.take().contains(&Call::Policy(true, 1)));
}

#[test]
fn nat_follows_the_pools_of_each_family() {
    let (mut a, _m) = agent_with(Fake::default(), std::path::Path::new("/nonexistent"), |c| {
        c.nat = true
    });
    let pool = |cidr: &str, nat_outgoing| DesiredItem {
        item: Some(Item::NatPool(NatPool {
            cidr: cidr.into(),
            nat_outgoing,
        })),
    };
    a.apply_updates(&[update(
        1,
        true,
        vec![pool("10.65.0.0/16", true), pool("10.66.0.0/16", false)],
    )]);
    let nat: Vec<Call> = a
        .host
        .take()
        .into_iter()
        .filter(|c| matches!(c, Call::Nat(..)))
        .collect();
    // IPv6's table exists only while an IPv6 pool is desired; a full sync lists the tables.
    assert_eq!(
        nat,
        vec![
            Call::Nat(IpFamily::V4, Some(1), true),
            Call::Nat(IpFamily::V6, None, true)
        ]
    );

    a.apply_updates(&[update(2, false, vec![pool("fd00:20::/48", true)])]);
    assert_eq!(
        a.host.take(),
        vec![
            Call::Nat(IpFamily::V4, Some(1), false),
            Call::Nat(IpFamily::V6, Some(1), false)
        ]
    );
}

#[test]
fn a_new_workload_interface_keeps_its_routes_for_the_grace_period() {
    let (mut a, _m) = converged();
    // The plugin's route on the pod's new interface, not desired by bgpd yet.
    let pod = as_written(p("10.65.0.5/32"), Kind::Workload, None, 7);
    a.host.routes.push(pod);
    a.handle_events(vec![
        Event::Link {
            deleted: false,
            index: 7,
            name: "cali1".into(),
            up: true,
        },
        Event::Route {
            deleted: false,
            route: pod,
        },
    ]);
    assert_eq!(a.host.take_writes(), Vec::<String>::new());
    a.retry_due();
    assert_eq!(a.host.take(), vec![]);

    // The grace is over and bgpd still does not want it: it goes.
    let long_ago = Instant::now().checked_sub(Duration::from_secs(11)).unwrap();
    a.new_workloads.insert(7, long_ago);
    a.retry_due();
    assert_eq!(
        a.host.take(),
        vec![
            Call::Routes(IpFamily::V4, Some(7)),
            Call::Routes(IpFamily::V6, Some(7)),
            Call::Apply(vec!["delete 10.65.0.5/32 proto 80".into()]),
        ]
    );
    assert!(!a.host.routes.contains(&pod));
}

#[test]
fn forwarding_is_turned_on_per_family_as_it_is_desired() {
    let dir = tempfile::tempdir().unwrap();
    for key in [FORWARDING_V4, FORWARDING_V6] {
        let path = dir.path().join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "0\n").unwrap();
    }
    let read = |key: &str| std::fs::read_to_string(dir.path().join(key)).unwrap();
    let (mut a, m) = agent_with(Fake::default(), dir.path(), |c| c.sysctls = true);
    a.apply_updates(&[update(1, true, vec![blackhole("10.65.0.0/26")])]);
    assert_eq!(
        (read(FORWARDING_V4).as_str(), read(FORWARDING_V6).trim()),
        ("1", "0")
    );
    assert_eq!(m.snapshot().sysctl_writes, 1);

    a.apply_updates(&[update(2, false, vec![blackhole("fd00:20::/122")])]);
    assert_eq!(read(FORWARDING_V6), "1");
    let s = m.snapshot();
    assert_eq!(s.sysctl_writes, 2);
    assert_eq!(
        a.host.take_writes().last().map(String::as_str),
        Some("write fd00:20::/122 oif 0 Changed")
    );
}
