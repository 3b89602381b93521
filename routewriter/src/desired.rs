//! The desired kernel state, built from the Dataplane stream (sans-IO: updates in, changes out).
//!
//! Why this file is long: one state built from the stream: routes of both families, the VTEPs of
//! each family, NAT pools, each item's validation, and the tests of each.
//!
//! [`DesiredState::apply`] takes one `DataplaneUpdate` and reports what changed, so the agent
//! writes only that; it keeps the revision the agent resumes from after a reconnect. Items the
//! kernel could never take (bad addresses, a gateway of the other family, IPv6 over IPIP, a
//! route without its gateway) are rejected one by one with a reason; the rest of the update
//! still applies.
//!
//! Both families go through the same parsing and the same state; where they differ (the VXLAN
//! device a route defaults to, IPIP being IPv4 only, a link-local IPv6 gateway needing its
//! device) the family is a parameter. Routes live in the compact per-family table of
//! [`super::routes`]; the VTEPs and the local VTEP are kept per family, as the contract keys
//! them (`VtepKey {node, family}`, `local_vtep: IpFamily`).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;
use net_types::IpFamily;
use proto::v1::{DataplaneUpdate, desired_item::Item, desired_key::Key};

use proto::mac::{Mac, parse_mac};

use super::policy::{self, PolicyState};
pub use super::routes::{DevId, Devices, Kind, Prefix, RouteSpec, Routes};
use super::routes::{family_from_proto, family_label};

/// The one family type (net-types') under the name interop-tests' route bench and kernel
/// tests import.
pub use net_types::IpFamily as Family;

/// A remote VXLAN endpoint; its family is that of its addresses (both of one family).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct VtepSpec {
    pub underlay: IpAddr,
    pub mac: Mac,
    pub tunnel: IpAddr,
}

/// This node's VXLAN device of one family as the stream gives it; zeros and `None` mean "use
/// the default".
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LocalVtepSpec {
    pub underlay: IpAddr,
    pub mac: Option<Mac>,
    pub tunnel: IpAddr,
    pub vni: u32,
    pub port: u16,
    pub mtu: u32,
}

impl LocalVtepSpec {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.underlay)
    }
}

/// Where the defaults for unnamed devices come from (the configuration).
#[derive(Clone, Debug)]
pub struct Defaults {
    pub vxlan_device: String,
    pub vxlan_device_v6: String,
    pub ipip_device: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            vxlan_device: "vxlan.calico".into(),
            vxlan_device_v6: "vxlan-v6.calico".into(),
            ipip_device: "tunl0".into(),
        }
    }
}

impl Defaults {
    /// The VXLAN device of a family.
    pub fn vxlan_device(&self, family: IpFamily) -> &str {
        match family {
            IpFamily::V4 => &self.vxlan_device,
            IpFamily::V6 => &self.vxlan_device_v6,
        }
    }
}

/// What one update changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Applied {
    /// The update was at or below the revision already applied and was ignored.
    pub stale: bool,
    /// The update was a snapshot: everything was replaced.
    pub snapshot: bool,
    /// Routes whose desired value changed (added, changed or removed), sorted, no duplicates.
    pub routes: Vec<Prefix>,
    /// The remote VTEPs of a family changed (indexed by [`IpFamily::index`]).
    pub vteps: [bool; 2],
    /// The local VTEP of a family changed.
    pub local_vtep: [bool; 2],
    pub nat: bool,
    /// An interface's policy or an address set changed.
    pub policy: bool,
    /// Items that could not be taken, each "what: why".
    pub rejected: Vec<String>,
}

impl Applied {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
            && self.vteps == [false; 2]
            && self.local_vtep == [false; 2]
            && !self.nat
            && !self.policy
            && !self.snapshot
    }
}

/// The desired state of the node's kernel.
#[derive(Debug, Default, Clone)]
pub struct DesiredState {
    revision: u64,
    /// Whether a snapshot has been applied (before that, the state is not the server's word).
    complete: bool,
    routes: Routes,
    devices: Devices,
    /// Routes by family and kind.
    counts: [[usize; 5]; 2],
    vteps: [BTreeMap<String, VtepSpec>; 2],
    local: [Option<LocalVtepSpec>; 2],
    /// Pools of both families, by CIDR, with their natOutgoing flag.
    pools: BTreeMap<IpNet, bool>,
    /// The pod interfaces' network policy and its address sets.
    policy: PolicyState,
    defaults: Defaults,
    /// During an incremental update: each touched route's value before it (first one wins).
    journal: Option<Vec<(Prefix, Named)>>,
}

/// A route's value with its device by name: ids may be reused within one update.
type Named = Option<(Kind, Option<IpAddr>, bool, Option<Box<str>>)>;

impl DesiredState {
    pub fn new(defaults: Defaults) -> Self {
        DesiredState {
            defaults,
            ..Default::default()
        }
    }

    /// The revision of the last update applied; 0 for none.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Whether a snapshot has been applied since start.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    pub fn route(&self, prefix: &Prefix) -> Option<RouteSpec> {
        self.routes.get(prefix)
    }

    pub fn devices(&self) -> &Devices {
        &self.devices
    }

    pub fn defaults(&self) -> &Defaults {
        &self.defaults
    }

    /// Desired routes of a family by kind, in [`Kind::ALL`] order.
    pub fn counts(&self, family: IpFamily) -> [usize; 5] {
        self.counts[family.index()]
    }

    /// The remote VTEPs of a family, by node.
    pub fn vteps(&self, family: IpFamily) -> &BTreeMap<String, VtepSpec> {
        &self.vteps[family.index()]
    }

    pub fn local_vtep(&self, family: IpFamily) -> Option<&LocalVtepSpec> {
        self.local[family.index()].as_ref()
    }

    /// Pools of both families by CIDR, with their natOutgoing flag.
    pub fn pools(&self) -> &BTreeMap<IpNet, bool> {
        &self.pools
    }

    /// The pod interfaces' network policy.
    pub fn policy(&self) -> &PolicyState {
        &self.policy
    }

    /// Whether anything of `family` is desired: a route, a VTEP, the local VTEP, a pool. The
    /// IPv6 parts of the node (forwarding, the NAT table) are set up only then.
    pub fn uses(&self, family: IpFamily) -> bool {
        self.routes.len_of(family) > 0
            || !self.vteps[family.index()].is_empty()
            || self.local[family.index()].is_some()
            || self.pools.keys().any(|n| family_of_net(n) == family)
    }

    /// Estimated heap bytes of the routes (map buckets, control bytes, device names).
    pub fn route_heap_bytes(&self) -> usize {
        self.routes.heap_bytes() + self.devices.heap_bytes()
    }

    /// Applies one update from the stream. Removals are applied before upserts, so an update
    /// may remove a key and set it again.
    pub fn apply(&mut self, update: &DataplaneUpdate) -> Applied {
        if !update.snapshot && self.revision > 0 && update.revision <= self.revision {
            return Applied {
                stale: true,
                ..Default::default()
            };
        }
        if update.snapshot {
            return self.apply_snapshot(update);
        }
        let mut applied = Applied::default();
        self.journal = Some(Vec::new());
        for key in &update.remove {
            match &key.key {
                Some(Key::Route(dest)) => match Prefix::parse(dest) {
                    Ok(p) => {
                        if self.remove_route(&p) {
                            applied.routes.push(p);
                        }
                    }
                    Err(e) => applied.rejected.push(format!("remove route {dest}: {e}")),
                },
                Some(Key::Vtep(k)) => match family_from_proto(k.family) {
                    Some(f) => {
                        applied.vteps[f.index()] |= self.vteps[f.index()].remove(&k.node).is_some()
                    }
                    None => applied.rejected.push(format!(
                        "remove vtep {:?}: family {} is neither IPv4 nor IPv6",
                        k.node, k.family
                    )),
                },
                Some(Key::LocalVtep(family)) => match family_from_proto(*family) {
                    Some(f) => {
                        applied.local_vtep[f.index()] |= self.local[f.index()].take().is_some()
                    }
                    None => applied.rejected.push(format!(
                        "remove local vtep: family {family} is neither IPv4 nor IPv6"
                    )),
                },
                Some(Key::NatPool(cidr)) => match parse_pool(cidr) {
                    Ok(net) => applied.nat |= self.pools.remove(&net).is_some(),
                    Err(e) => applied.rejected.push(format!("remove pool {cidr}: {e}")),
                },
                Some(Key::EndpointPolicy(iface)) => {
                    applied.policy |= self.policy.remove_endpoint(iface)
                }
                Some(Key::PolicySet(name)) => applied.policy |= self.policy.remove_set(name),
                None => applied.rejected.push("an empty key".into()),
            }
        }
        for item in &update.upsert {
            self.upsert(item.item.as_ref(), &mut applied);
        }
        self.revision = update.revision;
        applied.routes.sort_unstable();
        applied.routes.dedup();
        // A route removed and set again, or changed and changed back, within the update has
        // not moved: nothing to write for it.
        if let Some(journal) = self.journal.take() {
            let mut first: HashMap<Prefix, Named> = HashMap::with_capacity(journal.len());
            for (p, v) in journal {
                first.entry(p).or_insert(v);
            }
            applied
                .routes
                .retain(|p| first.get(p) != Some(&self.named(self.routes.get(p))));
        }
        applied
    }

    fn named(&self, spec: Option<RouteSpec>) -> Named {
        spec.map(|s| {
            (
                s.kind,
                s.gateway(),
                s.onlink,
                self.devices.name(s.dev).map(Box::from),
            )
        })
    }

    /// Notes a touched route's old value while an incremental update runs.
    fn note(&mut self, p: Prefix, old: Option<RouteSpec>) {
        if self.journal.is_some() {
            let v = self.named(old);
            if let Some(j) = self.journal.as_mut() {
                j.push((p, v));
            }
        }
    }

    fn apply_snapshot(&mut self, update: &DataplaneUpdate) -> Applied {
        let mut next = DesiredState::new(self.defaults.clone());
        // Room for each family's routes up front (a bulk load of 100k must not rehash).
        let v6 = update
            .upsert
            .iter()
            .filter(|i| matches!(&i.item, Some(Item::Route(r)) if r.destination.contains(':')))
            .count();
        next.routes.reserve(IpFamily::V4, update.upsert.len() - v6);
        next.routes.reserve(IpFamily::V6, v6);
        let mut applied = Applied {
            snapshot: true,
            ..Default::default()
        };
        for item in &update.upsert {
            next.upsert(item.item.as_ref(), &mut applied);
        }
        // Which routes differ from before, so the caller can tell what moved.
        let mut changed = Vec::new();
        for (p, spec) in next.routes.iter() {
            match self.routes.get(&p) {
                Some(old) if self.same_route(&old, &next, &spec) => {}
                _ => changed.push(p),
            }
        }
        changed.extend(
            self.routes
                .iter()
                .map(|(p, _)| p)
                .filter(|p| !next.routes.contains(p)),
        );
        changed.sort_unstable();
        changed.dedup();
        applied.routes = changed;
        for f in IpFamily::ALL {
            let i = f.index();
            applied.vteps[i] = next.vteps[i] != self.vteps[i];
            applied.local_vtep[i] = next.local[i] != self.local[i];
        }
        applied.nat = next.pools != self.pools;
        applied.policy = next.policy != self.policy;
        next.revision = update.revision;
        next.complete = true;
        *self = next;
        applied
    }

    fn same_route(&self, a: &RouteSpec, other: &DesiredState, b: &RouteSpec) -> bool {
        a.kind == b.kind
            && a.gateway() == b.gateway()
            && a.onlink == b.onlink
            && self.devices.name(a.dev) == other.devices.name(b.dev)
    }

    fn upsert(&mut self, item: Option<&Item>, applied: &mut Applied) {
        match item {
            Some(Item::Route(r)) => match self.parse_route(r) {
                Ok((p, spec)) => match self.insert_route(p, spec) {
                    Ok(true) => applied.routes.push(p),
                    Ok(false) => {}
                    Err(e) => applied.rejected.push(e),
                },
                Err(e) => {
                    applied
                        .rejected
                        .push(format!("route {} ({}): {e}", r.destination, r.source));
                    // The server no longer wants the old value either: drop it.
                    if let Ok(p) = Prefix::parse(&r.destination)
                        && self.remove_route(&p)
                    {
                        applied.routes.push(p);
                    }
                }
            },
            Some(Item::Vtep(v)) => match parse_vtep(v) {
                Ok(spec) => {
                    let i = IpFamily::of(spec.underlay).index();
                    if self.vteps[i].get(&v.node) != Some(&spec) {
                        self.vteps[i].insert(v.node.clone(), spec);
                        applied.vteps[i] = true;
                    }
                }
                Err(e) => {
                    applied.rejected.push(format!("vtep {:?}: {e}", v.node));
                    if let Some(f) = family_hint(&[&v.underlay_address, &v.tunnel_address]) {
                        let i = f.index();
                        applied.vteps[i] |= self.vteps[i].remove(&v.node).is_some();
                    }
                }
            },
            Some(Item::LocalVtep(l)) => match parse_local_vtep(l) {
                Ok(spec) => {
                    let i = spec.family().index();
                    if self.local[i] != Some(spec) {
                        self.local[i] = Some(spec);
                        applied.local_vtep[i] = true;
                    }
                }
                Err(e) => {
                    applied.rejected.push(format!("local vtep: {e}"));
                    if let Some(f) = family_hint(&[&l.underlay_address, &l.tunnel_address]) {
                        let i = f.index();
                        applied.local_vtep[i] |= self.local[i].take().is_some();
                    }
                }
            },
            Some(Item::NatPool(pool)) => match parse_pool(&pool.cidr) {
                Ok(net) => {
                    if self.pools.insert(net, pool.nat_outgoing) != Some(pool.nat_outgoing) {
                        applied.nat = true;
                    }
                }
                Err(e) => applied.rejected.push(format!("pool {}: {e}", pool.cidr)),
            },
            Some(Item::EndpointPolicy(p)) => match policy::parse_endpoint(p) {
                Ok((iface, rules)) => applied.policy |= self.policy.upsert_endpoint(iface, rules),
                Err(e) => {
                    // The server no longer wants the old rules, and these cannot be
                    // written: fail closed, the selected directions drop everything.
                    applied.rejected.push(e);
                    let deny = policy::EndpointRules {
                        ingress: p.ingress_selected.then(Vec::new),
                        egress: p.egress_selected.then(Vec::new),
                    };
                    if policy::interface_name(&p.interface) {
                        applied.policy |= self.policy.upsert_endpoint(p.interface.clone(), deny);
                    }
                }
            },
            Some(Item::PolicySet(set)) => match policy::parse_set(set) {
                Ok((name, members)) => applied.policy |= self.policy.upsert_set(name, members),
                Err(e) => {
                    applied.rejected.push(e);
                    applied.policy |= self.policy.remove_set(&set.name);
                }
            },
            None => applied.rejected.push("an empty item".into()),
        }
    }

    /// Inserts or replaces; true when the desired value changed. Takes ownership of the
    /// device reference in `spec`.
    fn insert_route(&mut self, p: Prefix, spec: RouteSpec) -> Result<bool, String> {
        let f = p.family().index();
        match self.routes.insert(p, spec) {
            Ok(Some(old)) => {
                self.note(p, Some(old));
                self.devices.release(old.dev);
                self.counts[f][old.kind as usize] -= 1;
                self.counts[f][spec.kind as usize] += 1;
                Ok(old != spec)
            }
            Ok(None) => {
                self.note(p, None);
                self.counts[f][spec.kind as usize] += 1;
                Ok(true)
            }
            Err(e) => {
                self.devices.release(spec.dev);
                Err(e)
            }
        }
    }

    fn remove_route(&mut self, p: &Prefix) -> bool {
        match self.routes.remove(p) {
            Some(old) => {
                self.note(*p, Some(old));
                self.devices.release(old.dev);
                self.counts[p.family().index()][old.kind as usize] -= 1;
                true
            }
            None => false,
        }
    }

    /// Checks a route and interns its device (one reference, owned by the returned spec).
    fn parse_route(&mut self, r: &proto::v1::KernelRoute) -> Result<(Prefix, RouteSpec), String> {
        use proto::v1::RouteKind as P;
        let p = Prefix::parse(&r.destination)?;
        let family = p.family();
        let kind = match P::try_from(r.kind) {
            Ok(P::Blackhole) => Kind::Blackhole,
            Ok(P::Workload) => Kind::Workload,
            Ok(P::Gateway) => Kind::Gateway,
            Ok(P::Vxlan) => Kind::Vxlan,
            Ok(P::Ipip) => Kind::Ipip,
            Ok(P::Unspecified) | Err(_) => {
                return Err(format!(
                    "route kind {} is not one routewriter knows",
                    r.kind
                ));
            }
        };
        let gateway = if r.gateway.is_empty() {
            None
        } else {
            Some(parse_addr("gateway", &r.gateway, Some(family))?)
        };
        let device = r.device.trim();
        if device.len() > super::config::IFNAMSIZ_MAX || device.contains(['/', ' ']) {
            return Err(format!("device {device:?} is not a valid interface name"));
        }
        let (gateway, device, onlink) = match kind {
            Kind::Blackhole => (None, "", false),
            Kind::Workload => {
                if device.is_empty() {
                    return Err("a workload route needs its interface (device)".into());
                }
                (None, device, false)
            }
            Kind::Gateway => {
                let Some(g) = gateway else {
                    return Err("a gateway route needs its gateway".into());
                };
                if r.onlink && device.is_empty() {
                    return Err("an onlink route needs its device".into());
                }
                if is_link_local(g) && device.is_empty() {
                    return Err(format!(
                        "gateway {g} is link-local: the route needs the device it is on"
                    ));
                }
                (Some(g), device, r.onlink)
            }
            Kind::Ipip if family == IpFamily::V6 => {
                return Err(
                    "IPIP carries IPv4 only: an IPv6 pool needs VXLAN or no encapsulation".into(),
                );
            }
            Kind::Vxlan | Kind::Ipip => {
                let Some(g) = gateway else {
                    return Err(format!("a {} route needs the remote address", kind.name()));
                };
                let default = if kind == Kind::Vxlan {
                    self.defaults.vxlan_device(family)
                } else {
                    &self.defaults.ipip_device
                };
                let dev = if device.is_empty() { default } else { device };
                // Tunnel routes are always onlink: the gateway is not on a subnet of the device.
                (Some(g), dev, true)
            }
        };
        let dev = if device.is_empty() {
            DevId::NONE
        } else {
            // Borrow dance: defaults live in self, devices too.
            let name = device.to_owned();
            self.devices.intern(&name)?
        };
        Ok((p, RouteSpec::new(kind, gateway, dev, onlink)))
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
        IpAddr::V4(_) => false,
    }
}

fn family_of_net(n: &IpNet) -> IpFamily {
    IpFamily::of(n.addr())
}

/// The family of the first of `addrs` that parses: what a bad item meant to be.
fn family_hint(addrs: &[&str]) -> Option<IpFamily> {
    addrs
        .iter()
        .find_map(|s| s.parse::<IpAddr>().ok())
        .map(IpFamily::of)
}

/// A usable unicast address, of `family` when given.
fn parse_addr(what: &str, s: &str, family: Option<IpFamily>) -> Result<IpAddr, String> {
    let a: IpAddr = s
        .parse()
        .map_err(|_| format!("{what} {s:?} is not an address"))?;
    if a.is_unspecified() || a.is_multicast() {
        return Err(format!("{what} {a} is not a usable unicast address"));
    }
    match family {
        Some(f) if IpFamily::of(a) != f => Err(format!(
            "{what} {a} is {}, the route is {}: routewriter does not mix families in a route",
            family_label(IpFamily::of(a)),
            family_label(f)
        )),
        _ => Ok(a),
    }
}

/// The underlay and tunnel addresses of a VTEP: both usable, both of one family.
fn parse_pair(underlay: &str, tunnel: &str) -> Result<(IpAddr, IpAddr), String> {
    let u = parse_addr("underlay address", underlay, None)?;
    let t = parse_addr("tunnel address", tunnel, None)?;
    if IpFamily::of(u) != IpFamily::of(t) {
        return Err(format!(
            "underlay address {u} and tunnel address {t} are of different families (a VTEP is of one)"
        ));
    }
    Ok((u, t))
}

fn parse_vtep(v: &proto::v1::Vtep) -> Result<VtepSpec, String> {
    if v.node.is_empty() {
        return Err("a VTEP needs its node name".into());
    }
    let (underlay, tunnel) = parse_pair(&v.underlay_address, &v.tunnel_address)?;
    Ok(VtepSpec {
        underlay,
        mac: parse_mac(&v.mac).ok_or_else(|| format!("MAC {:?} is not a MAC address", v.mac))?,
        tunnel,
    })
}

fn parse_local_vtep(l: &proto::v1::LocalVtep) -> Result<LocalVtepSpec, String> {
    let mac = if l.mac.is_empty() {
        None
    } else {
        let m = parse_mac(&l.mac).ok_or_else(|| format!("MAC {:?} is not a MAC address", l.mac))?;
        if m[0] & 1 == 1 {
            return Err(format!("MAC {} is a multicast address", l.mac));
        }
        Some(m)
    };
    if l.vni >= 1 << 24 {
        return Err(format!("VNI {} is over 24 bits", l.vni));
    }
    let port = u16::try_from(l.port).map_err(|_| format!("UDP port {} is over 65535", l.port))?;
    if l.mtu != 0 && !(68..=65535).contains(&l.mtu) {
        return Err(format!("MTU {} is outside 68-65535", l.mtu));
    }
    let (underlay, tunnel) = parse_pair(&l.underlay_address, &l.tunnel_address)?;
    if IpFamily::of(underlay) == IpFamily::V6 && l.mtu != 0 && l.mtu < 1280 {
        return Err(format!(
            "MTU {} is below 1280, the least IPv6 allows",
            l.mtu
        ));
    }
    Ok(LocalVtepSpec {
        underlay,
        mac,
        tunnel,
        vni: l.vni,
        port,
        mtu: l.mtu,
    })
}

fn parse_pool(cidr: &str) -> Result<IpNet, String> {
    Ok(Prefix::parse(cidr)?.net())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::v1 as pb;
    use proto::v1::{
        DesiredItem, DesiredKey, KernelRoute, LocalVtep, NatPool, RouteKind as P, Vtep, VtepKey,
    };

    fn route(dest: &str, kind: P, gw: &str, dev: &str, onlink: bool) -> DesiredItem {
        DesiredItem {
            item: Some(Item::Route(KernelRoute {
                destination: dest.into(),
                kind: kind as i32,
                gateway: gw.into(),
                device: dev.into(),
                onlink,
                source: "test".into(),
            })),
        }
    }

    fn update(
        rev: u64,
        snapshot: bool,
        upsert: Vec<DesiredItem>,
        remove: Vec<DesiredKey>,
    ) -> DataplaneUpdate {
        DataplaneUpdate {
            revision: rev,
            snapshot,
            upsert,
            remove,
        }
    }

    fn rm_route(dest: &str) -> DesiredKey {
        DesiredKey {
            key: Some(Key::Route(dest.into())),
        }
    }

    fn rm_vtep(node: &str, family: pb::IpFamily) -> DesiredKey {
        DesiredKey {
            key: Some(Key::Vtep(VtepKey {
                node: node.into(),
                family: family.into(),
            })),
        }
    }

    fn rm_local(family: pb::IpFamily) -> DesiredKey {
        DesiredKey {
            key: Some(Key::LocalVtep(family.into())),
        }
    }

    fn vtep(node: &str, underlay: &str, mac: &str, tunnel: &str) -> DesiredItem {
        DesiredItem {
            item: Some(Item::Vtep(Vtep {
                node: node.into(),
                underlay_address: underlay.into(),
                mac: mac.into(),
                tunnel_address: tunnel.into(),
            })),
        }
    }

    fn local(underlay: &str, tunnel: &str, mtu: u32) -> DesiredItem {
        DesiredItem {
            item: Some(Item::LocalVtep(LocalVtep {
                underlay_address: underlay.into(),
                mac: String::new(),
                tunnel_address: tunnel.into(),
                vni: 0,
                port: 0,
                mtu,
            })),
        }
    }

    fn pool(cidr: &str, nat: bool) -> DesiredItem {
        DesiredItem {
            item: Some(Item::NatPool(NatPool {
                cidr: cidr.into(),
                nat_outgoing: nat,
            })),
        }
    }

    fn p(s: &str) -> Prefix {
        Prefix::parse(s).unwrap()
    }

    fn endpoint_policy(iface: &str, rules: Vec<proto::v1::PolicyRule>) -> DesiredItem {
        DesiredItem {
            item: Some(Item::EndpointPolicy(proto::v1::EndpointPolicy {
                interface: iface.into(),
                ingress_selected: true,
                ingress: rules,
                egress_selected: false,
                egress: vec![],
            })),
        }
    }

    fn policy_set(name: &str, members: &[&str]) -> DesiredItem {
        DesiredItem {
            item: Some(Item::PolicySet(proto::v1::PolicySet {
                name: name.into(),
                members: members.iter().map(|m| m.to_string()).collect(),
            })),
        }
    }

    #[test]
    fn policy_items_are_held_checked_and_removed_by_key() {
        let mut d = DesiredState::new(Defaults::default());
        let allow = proto::v1::PolicyRule {
            action: proto::v1::PolicyAction::Allow as i32,
            protocol: Some(6),
            src_set: "p-a".into(),
            dst_ports: vec![proto::v1::PortRange {
                first: 80,
                last: 80,
            }],
            origin: "knp/ns/a ingress[0]".into(),
            ..Default::default()
        };
        let a = d.apply(&update(
            1,
            true,
            vec![
                endpoint_policy("cali1", vec![allow.clone()]),
                policy_set("p-a", &["10.0.0.1", "10.0.0.2/32", "fd00::1"]),
            ],
            vec![],
        ));
        assert!(a.policy && a.rejected.is_empty(), "{a:?}");
        let ep = &d.policy().endpoints["cali1"];
        assert_eq!(ep.ingress.as_ref().unwrap()[0].dst_ports, vec![(80, 80)]);
        assert!(ep.egress.is_none());
        assert_eq!(d.policy().sets["p-a"][0], vec![(0x0a00_0001, 0x0a00_0002)]);
        assert_eq!(d.policy().sets["p-a"][1].len(), 1);
        // The same again changes nothing.
        let a = d.apply(&update(
            2,
            false,
            vec![policy_set("p-a", &["10.0.0.1", "10.0.0.2", "fd00::1"])],
            vec![],
        ));
        assert!(!a.policy);
        // Rules that cannot be written fail closed: the selected direction denies all.
        let bad = proto::v1::PolicyRule {
            dst_ports: vec![proto::v1::PortRange {
                first: 90,
                last: 80,
            }],
            ..allow
        };
        let a = d.apply(&update(
            3,
            false,
            vec![endpoint_policy("cali1", vec![bad])],
            vec![],
        ));
        assert_eq!(a.rejected.len(), 1, "{a:?}");
        assert!(a.policy);
        assert_eq!(d.policy().endpoints["cali1"].ingress, Some(vec![]));
        // A bad set member is refused, and the set goes.
        let a = d.apply(&update(
            4,
            false,
            vec![policy_set("p-a", &["nope"])],
            vec![],
        ));
        assert_eq!(a.rejected.len(), 1);
        assert!(!d.policy().sets.contains_key("p-a"));
        let a = d.apply(&update(
            5,
            false,
            vec![],
            vec![DesiredKey {
                key: Some(Key::EndpointPolicy("cali1".into())),
            }],
        ));
        assert!(a.policy);
        assert!(d.policy().is_empty());
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn snapshot_then_changes_report_exactly_what_moved() {
        let mut d = DesiredState::new(Defaults::default());
        let a = d.apply(&update(
            5,
            true,
            vec![
                route("10.65.0.0/26", P::Blackhole, "", "", false),
                route("10.65.1.0/26", P::Vxlan, "10.65.1.1", "", false),
                route("10.65.0.5/32", P::Workload, "", "cali12345678901", false),
            ],
            vec![],
        ));
        assert!(a.snapshot && a.rejected.is_empty(), "{a:?}");
        assert_eq!(a.routes.len(), 3);
        assert_eq!(d.revision(), 5);
        assert!(d.is_complete());
        assert_eq!(d.counts(IpFamily::V4), [1, 1, 0, 1, 0]);
        assert_eq!(d.counts(IpFamily::V6), [0; 5]);
        assert!(d.uses(IpFamily::V4) && !d.uses(IpFamily::V6));
        let vx = d.route(&p("10.65.1.0/26")).unwrap();
        assert!(vx.onlink, "tunnel routes are onlink");
        assert_eq!(d.devices().name(vx.dev), Some("vxlan.calico"));

        // The same value again changes nothing; a new gateway changes one route.
        let a = d.apply(&update(
            6,
            false,
            vec![
                route("10.65.0.0/26", P::Blackhole, "", "", false),
                route("10.65.1.0/26", P::Vxlan, "10.65.1.2", "", false),
            ],
            vec![rm_route("10.65.0.5/32")],
        ));
        assert_eq!(a.routes, vec![p("10.65.0.5/32"), p("10.65.1.0/26")]);
        assert_eq!(d.counts(IpFamily::V4), [1, 0, 0, 1, 0]);
        // The workload's interface name is freed with its last route.
        assert_eq!(d.devices().id("cali12345678901"), None);

        // Old revisions are ignored.
        let a = d.apply(&update(
            6,
            false,
            vec![route("10.9.0.0/24", P::Blackhole, "", "", false)],
            vec![],
        ));
        assert!(a.stale);
        assert!(d.route(&p("10.9.0.0/24")).is_none());
    }

    /// Every route kind of IPv6, as bgpd sends them, lands in the state of its family: a VXLAN
    /// route defaults to the IPv6 device, a workload route is a /128, a gateway may be
    /// link-local with its device.
    #[test]
    fn ipv6_routes_of_every_kind() {
        let mut d = DesiredState::new(Defaults::default());
        let a = d.apply(&update(
            1,
            true,
            vec![
                route("fd00:20::/122", P::Blackhole, "", "", false),
                route("fd00:20::5/128", P::Workload, "", "cali12345678901", false),
                route("fd00:20::40/122", P::Gateway, "fd00:10::2", "", false),
                route("fd00:20::c0/122", P::Gateway, "fe80::2", "eth0", false),
                route("fd00:20::80/122", P::Vxlan, "fd00:20::81", "", true),
                route("10.65.0.0/26", P::Blackhole, "", "", false),
            ],
            vec![],
        ));
        assert!(a.rejected.is_empty(), "{:?}", a.rejected);
        assert_eq!(d.counts(IpFamily::V6), [1, 1, 2, 1, 0]);
        assert_eq!(d.counts(IpFamily::V4), [1, 0, 0, 0, 0]);
        assert_eq!(
            (
                d.routes().len_of(IpFamily::V4),
                d.routes().len_of(IpFamily::V6)
            ),
            (1, 5)
        );
        assert!(d.uses(IpFamily::V6));
        let vx = d.route(&p("fd00:20::80/122")).unwrap();
        assert_eq!(d.devices().name(vx.dev), Some("vxlan-v6.calico"));
        assert_eq!(
            (vx.kind, vx.gateway(), vx.onlink),
            (Kind::Vxlan, Some(ip("fd00:20::81")), true)
        );
        let ll = d.route(&p("fd00:20::c0/122")).unwrap();
        assert_eq!(ll.gateway(), Some(ip("fe80::2")));
        assert_eq!(d.devices().name(ll.dev), Some("eth0"));
        // The VXLAN device of each family is interned once, whatever the number of routes.
        assert!(d.devices().id("vxlan.calico").is_none());
        // An IPv6 route is removed by its key like an IPv4 one.
        let a = d.apply(&update(2, false, vec![], vec![rm_route("fd00:20::5/128")]));
        assert_eq!(a.routes, vec![p("fd00:20::5/128")]);
        assert_eq!(d.counts(IpFamily::V6), [1, 0, 2, 1, 0]);
    }

    #[test]
    fn a_snapshot_drops_what_it_does_not_name() {
        let mut d = DesiredState::new(Defaults::default());
        d.apply(&update(
            1,
            true,
            vec![
                route("10.65.0.0/26", P::Blackhole, "", "", false),
                route("10.65.2.0/26", P::Gateway, "10.0.0.2", "eth0", true),
                route("fd00:20::/122", P::Blackhole, "", "", false),
            ],
            vec![],
        ));
        let a = d.apply(&update(
            1,
            true,
            vec![
                route("10.65.0.0/26", P::Blackhole, "", "", false),
                route("10.65.2.0/26", P::Gateway, "10.0.0.3", "eth0", true),
                route("10.65.3.0/26", P::Gateway, "10.0.0.3", "", false),
                route("fd00:20::/122", P::Blackhole, "", "", false),
                route("fd00:20::40/122", P::Vxlan, "fd00:20::41", "", true),
            ],
            vec![],
        ));
        // Snapshots are always taken, even at a lower or equal revision (a restarted server).
        assert!(!a.stale);
        assert_eq!(
            a.routes,
            vec![p("10.65.2.0/26"), p("10.65.3.0/26"), p("fd00:20::40/122")]
        );
        let a = d.apply(&update(2, true, vec![], vec![]));
        assert_eq!(a.routes.len(), 5);
        assert!(d.routes().is_empty());
        assert_eq!(d.devices().iter().count(), 0);
    }

    #[test]
    fn bad_items_are_rejected_one_by_one() {
        let mut d = DesiredState::new(Defaults::default());
        let a = d.apply(&update(
            1,
            true,
            vec![
                route("10.65.0.1/26", P::Blackhole, "", "", false),
                route("fd00::1/64", P::Blackhole, "", "", false),
                route("10.65.1.0/26", P::Gateway, "", "", false),
                route("10.65.2.0/26", P::Workload, "", "", false),
                route("10.65.3.0/26", P::Unspecified, "", "", false),
                route("10.65.4.0/26", P::Gateway, "10.0.0.1", "", true),
                route(
                    "10.65.5.0/26",
                    P::Gateway,
                    "10.0.0.1",
                    "this-name-is-too-long",
                    false,
                ),
                // Families do not mix within a route.
                route("10.65.7.0/26", P::Gateway, "fd00::1", "eth0", false),
                route("fd00:1::/64", P::Vxlan, "10.65.1.1", "", true),
                // IPIP is IPv4 only; a link-local gateway needs its device.
                route("fd00:2::/64", P::Ipip, "fd00::2", "", true),
                route("fd00:3::/64", P::Gateway, "fe80::1", "", false),
                route("fd00:4::/64", P::Gateway, "ff02::1", "eth0", false),
                route("10.65.6.0/26", P::Blackhole, "", "", false),
                route("fd00:5::/64", P::Blackhole, "", "", false),
                vtep("b", "10.0.0.2", "not-a-mac", "10.65.1.0"),
                vtep("c", "10.0.0.3", "66:00:00:00:00:03", "fd00:20::41"),
                pool("10.65.0.0/16", true),
                pool("fd00:20::/48", true),
                pool("fd00:20::1/48", true),
                DesiredItem { item: None },
            ],
            vec![],
        ));
        assert_eq!(a.rejected.len(), 16, "{:#?}", a.rejected);
        assert_eq!(d.routes().len(), 2);
        assert!(d.route(&p("10.65.6.0/26")).is_some());
        assert!(d.route(&p("fd00:5::/64")).is_some());
        assert_eq!(d.pools().len(), 2);
        let said = |what: &str| a.rejected.iter().any(|r| r.contains(what));
        assert!(said("IPIP carries IPv4 only"), "{:#?}", a.rejected);
        assert!(said("does not mix families"), "{:#?}", a.rejected);
        assert!(said("link-local"), "{:#?}", a.rejected);
        assert!(said("different families"), "{:#?}", a.rejected);
        assert!(said("not a usable unicast address"), "{:#?}", a.rejected);
    }

    #[test]
    fn an_invalid_update_of_a_route_drops_the_old_value() {
        let mut d = DesiredState::new(Defaults::default());
        d.apply(&update(
            1,
            true,
            vec![
                route("10.65.1.0/26", P::Gateway, "10.0.0.2", "", false),
                route("fd00:20::40/122", P::Gateway, "fd00:10::2", "", false),
            ],
            vec![],
        ));
        let a = d.apply(&update(
            2,
            false,
            vec![
                route("10.65.1.0/26", P::Gateway, "", "", false),
                route("fd00:20::40/122", P::Ipip, "fd00:10::2", "", true),
            ],
            vec![],
        ));
        assert_eq!(a.routes, vec![p("10.65.1.0/26"), p("fd00:20::40/122")]);
        assert_eq!(a.rejected.len(), 2);
        assert!(d.routes().is_empty());
        assert_eq!(d.counts(IpFamily::V6), [0; 5]);
    }

    /// VTEPs and the local VTEP are kept per family, as the contract keys them: removing one
    /// family's leaves the other's.
    #[test]
    fn vteps_and_local_vteps_per_family() {
        let mut d = DesiredState::new(Defaults::default());
        let b4 = |mac: &str| vtep("b", "10.0.0.2", mac, "10.65.1.0");
        let b6 = vtep("b", "fd00:10::2", "66:00:00:00:06:02", "fd00:20::41");
        let a = d.apply(&update(
            1,
            true,
            vec![
                b4("66:00:00:00:00:02"),
                b6.clone(),
                local("10.0.0.1", "10.65.0.0", 0),
                local("fd00:10::1", "fd00:20::1", 0),
            ],
            vec![],
        ));
        assert!(a.rejected.is_empty(), "{:?}", a.rejected);
        assert_eq!(a.vteps, [true, true]);
        assert_eq!(a.local_vtep, [true, true]);
        assert!(!a.nat);
        assert_eq!(d.vteps(IpFamily::V6)["b"].underlay, ip("fd00:10::2"));
        assert_eq!(d.vteps(IpFamily::V4)["b"].underlay, ip("10.0.0.2"));
        assert_eq!(
            d.local_vtep(IpFamily::V6).map(|l| l.tunnel),
            Some(ip("fd00:20::1"))
        );
        assert!(d.uses(IpFamily::V6));
        let a = d.apply(&update(
            2,
            false,
            vec![b4("66:00:00:00:00:02"), b6.clone()],
            vec![],
        ));
        assert!(a.is_empty(), "unchanged items change nothing: {a:?}");
        let a = d.apply(&update(3, false, vec![b4("66:00:00:00:00:03")], vec![]));
        assert_eq!(a.vteps, [true, false]);
        assert_eq!(d.vteps(IpFamily::V4)["b"].mac, [0x66, 0, 0, 0, 0, 3]);
        // Removing the IPv6 VTEP and device leaves the IPv4 ones.
        let a = d.apply(&update(
            4,
            false,
            vec![],
            vec![rm_vtep("b", pb::IpFamily::V6), rm_local(pb::IpFamily::V6)],
        ));
        assert_eq!((a.vteps, a.local_vtep), ([false, true], [false, true]));
        assert!(d.vteps(IpFamily::V6).is_empty() && d.local_vtep(IpFamily::V6).is_none());
        assert_eq!(d.vteps(IpFamily::V4).len(), 1);
        assert!(d.local_vtep(IpFamily::V4).is_some());
        assert!(!d.uses(IpFamily::V6));
        // A key without a family names nothing: rejected, nothing removed.
        let a = d.apply(&update(
            5,
            false,
            vec![],
            vec![
                rm_vtep("b", pb::IpFamily::Unspecified),
                rm_local(pb::IpFamily::Unspecified),
            ],
        ));
        assert_eq!(a.rejected.len(), 2, "{:?}", a.rejected);
        assert_eq!(d.vteps(IpFamily::V4).len(), 1);
        // A bad item drops the old value of the family it meant.
        let a = d.apply(&update(
            6,
            false,
            vec![vtep("b", "10.0.0.2", "bad", "10.65.1.0")],
            vec![],
        ));
        assert_eq!(a.vteps, [true, false]);
        assert!(d.vteps(IpFamily::V4).is_empty());
        let a = d.apply(&update(
            7,
            false,
            vec![local("10.0.0.1", "10.65.0.0", 10)],
            vec![],
        ));
        assert_eq!(a.local_vtep, [true, false]);
        assert!(d.local_vtep(IpFamily::V4).is_none());
        // IPv6 needs an MTU of 1280 at least.
        let a = d.apply(&update(
            8,
            false,
            vec![local("fd00:10::1", "fd00:20::1", 1200)],
            vec![],
        ));
        assert!(a.rejected[0].contains("1280"), "{:?}", a.rejected);
    }

    #[test]
    fn pools_of_both_families() {
        let mut d = DesiredState::new(Defaults::default());
        d.apply(&update(
            1,
            true,
            vec![pool("10.65.0.0/16", true), pool("fd00:20::/48", true)],
            vec![],
        ));
        assert!(d.uses(IpFamily::V6) && d.uses(IpFamily::V4));
        let a = d.apply(&update(
            2,
            false,
            vec![],
            vec![DesiredKey {
                key: Some(Key::NatPool("fd00:20::/48".into())),
            }],
        ));
        assert!(a.nat);
        assert_eq!(d.pools().len(), 1);
        assert!(!d.uses(IpFamily::V6));
    }

    #[test]
    fn held_bytes_per_route_stay_small() {
        for (family, make) in [
            (
                IpFamily::V4,
                (|i: u32| {
                    let net = std::net::Ipv4Addr::from(0x0A80_0000 + (i << 6));
                    route(&format!("{net}/26"), P::Gateway, "10.0.0.2", "eth0", false)
                }) as fn(u32) -> DesiredItem,
            ),
            (IpFamily::V6, |i: u32| {
                let net = std::net::Ipv6Addr::from((0xfd80u128 << 112) | (u128::from(i) << 6));
                route(&format!("{net}/122"), P::Gateway, "fd00::2", "eth0", false)
            }),
        ] {
            let mut d = DesiredState::new(Defaults::default());
            let a = d.apply(&update(1, true, (0..10_000).map(make).collect(), vec![]));
            assert!(a.rejected.is_empty(), "{:?}", &a.rejected[..1]);
            assert_eq!(d.routes().len_of(family), 10_000);
            let per_route = d.route_heap_bytes() / 10_000;
            let limit = if family == IpFamily::V4 { 40 } else { 64 };
            assert!(per_route < limit, "{family:?}: {per_route} bytes per route");
        }
    }

    /// Property: any sequence of updates (snapshots, upserts and removals of routes, VTEPs,
    /// local VTEPs and pools of both families) leaves the state equal to a plain model of the
    /// contract (a map from key to item), and every route reported as changed is exactly one
    /// whose desired value moved.
    mod model {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeMap as Map;

        #[derive(Debug, Clone)]
        enum Op {
            Route(u8, u8),
            RemoveRoute(u8),
            Vtep(u8, bool, u8),
            RemoveVtep(u8, bool),
            Local(bool, u8),
            RemoveLocal(bool),
            Pool(bool, bool),
        }

        /// Eight destinations, half of each family.
        fn dest(i: u8) -> String {
            match i % 8 {
                0 => "10.65.0.0/26".into(),
                1 => "10.65.1.0/26".into(),
                2 => "10.65.0.5/32".into(),
                3 => "0.0.0.0/0".into(),
                4 => "fd00:20::/122".into(),
                5 => "fd00:20::40/122".into(),
                6 => "fd00:20::5/128".into(),
                _ => "::/0".into(),
            }
        }

        /// One of the route shapes of the destination's family (some invalid: IPIP for IPv6).
        fn route_item(d: &str, shape: u8) -> DesiredItem {
            let v6 = d.contains(':');
            let (gw, gw2) = if v6 {
                ("fd00:10::2", "fe80::2")
            } else {
                ("10.0.0.2", "10.0.0.3")
            };
            match shape % 6 {
                0 => route(d, P::Blackhole, "", "", false),
                1 => route(d, P::Workload, "", "cali1", false),
                2 => route(d, P::Gateway, gw, "", false),
                3 => route(d, P::Gateway, gw2, "eth0", true),
                4 => route(d, P::Vxlan, gw, "", true),
                _ => route(d, P::Ipip, gw, "", true),
            }
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Route(a, b)),
                any::<u8>().prop_map(Op::RemoveRoute),
                (0u8..3, any::<bool>(), any::<u8>()).prop_map(|(n, v6, m)| Op::Vtep(n, v6, m)),
                (0u8..3, any::<bool>()).prop_map(|(n, v6)| Op::RemoveVtep(n, v6)),
                (any::<bool>(), any::<u8>()).prop_map(|(v6, m)| Op::Local(v6, m)),
                any::<bool>().prop_map(Op::RemoveLocal),
                (any::<bool>(), any::<bool>()).prop_map(|(v6, nat)| Op::Pool(v6, nat)),
            ]
        }

        fn fam(v6: bool) -> pb::IpFamily {
            if v6 {
                pb::IpFamily::V6
            } else {
                pb::IpFamily::V4
            }
        }

        fn item_of(op: &Op) -> Option<(String, DesiredItem)> {
            Some(match op {
                Op::Route(d, s) => (format!("r{}", dest(*d)), route_item(&dest(*d), *s)),
                Op::Vtep(n, v6, m) => {
                    let (u, t) = if *v6 {
                        (format!("fd00:10::{}", n + 2), format!("fd00:20::{}", n + 2))
                    } else {
                        (format!("10.0.0.{}", n + 2), format!("10.65.{n}.0"))
                    };
                    let mac = format!("66:00:00:00:00:{m:02x}");
                    (format!("v{n}{v6}"), vtep(&format!("n{n}"), &u, &mac, &t))
                }
                Op::Local(v6, m) => {
                    let mtu = 1300 + u32::from(*m % 2);
                    let item = if *v6 {
                        local("fd00:10::1", "fd00:20::1", mtu)
                    } else {
                        local("10.0.0.1", "10.65.9.0", mtu)
                    };
                    (format!("l{v6}"), item)
                }
                Op::Pool(v6, nat) => {
                    let cidr = if *v6 { "fd00:20::/48" } else { "10.65.0.0/16" };
                    (format!("p{cidr}"), pool(cidr, *nat))
                }
                _ => return None,
            })
        }

        fn key_of(op: &Op) -> Option<(String, DesiredKey)> {
            Some(match op {
                Op::RemoveRoute(d) => (format!("r{}", dest(*d)), rm_route(&dest(*d))),
                Op::RemoveVtep(n, v6) => (format!("v{n}{v6}"), rm_vtep(&format!("n{n}"), fam(*v6))),
                Op::RemoveLocal(v6) => (format!("l{v6}"), rm_local(fam(*v6))),
                _ => return None,
            })
        }

        /// The routes the state should hold for the model's items, as text (kind, gateway,
        /// device with the family's default, onlink), and the number of VTEPs and local VTEPs.
        fn expected(model: &Map<String, DesiredItem>) -> (Map<String, String>, usize, usize) {
            let mut routes = Map::new();
            let mut vteps = 0;
            let mut locals = 0;
            for item in model.values() {
                match item.item.as_ref().unwrap() {
                    Item::Route(r) => {
                        let v6 = r.destination.contains(':');
                        let dev = match (P::try_from(r.kind).unwrap(), v6) {
                            // IPIP is IPv4 only: rejected.
                            (P::Ipip, true) => continue,
                            (P::Ipip, false) => "tunl0",
                            (P::Vxlan, false) => "vxlan.calico",
                            (P::Vxlan, true) => "vxlan-v6.calico",
                            _ => r.device.as_str(),
                        };
                        let text = format!("{} {} {dev} {}", r.kind, r.gateway, r.onlink);
                        routes.insert(r.destination.clone(), text);
                    }
                    Item::Vtep(_) => vteps += 1,
                    Item::LocalVtep(_) => locals += 1,
                    Item::NatPool(_) | Item::EndpointPolicy(_) | Item::PolicySet(_) => {}
                }
            }
            (routes, vteps, locals)
        }

        fn actual(d: &DesiredState) -> (Map<String, String>, usize, usize) {
            let routes = d
                .routes()
                .iter()
                .map(|(p, s)| {
                    let gw = s.gateway().map(|g| g.to_string()).unwrap_or_default();
                    let kind = match s.kind {
                        Kind::Blackhole => P::Blackhole,
                        Kind::Workload => P::Workload,
                        Kind::Gateway => P::Gateway,
                        Kind::Vxlan => P::Vxlan,
                        Kind::Ipip => P::Ipip,
                    };
                    let dev = d.devices().name(s.dev).unwrap_or("");
                    let text = format!("{} {gw} {dev} {}", kind as i32, s.onlink);
                    (p.to_string(), text)
                })
                .collect();
            let vteps = IpFamily::ALL.iter().map(|f| d.vteps(*f).len()).sum();
            let locals = IpFamily::ALL
                .iter()
                .filter(|f| d.local_vtep(**f).is_some())
                .count();
            (routes, vteps, locals)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn the_state_follows_the_contract(batches in prop::collection::vec(
                (any::<bool>(), prop::collection::vec(op(), 0..12)), 1..12)) {
                let mut d = DesiredState::new(Defaults::default());
                let mut model: Map<String, DesiredItem> = Map::new();
                for (rev, (snapshot, ops)) in batches.into_iter().enumerate() {
                    let before = actual(&d).0;
                    let upserts: Vec<(String, DesiredItem)> = ops.iter().filter_map(item_of).collect();
                    let removes: Vec<(String, DesiredKey)> = ops.iter().filter_map(key_of).collect();
                    let u = if snapshot {
                        // A snapshot replaces everything: the items named, last one wins.
                        model = upserts.into_iter().collect();
                        update(rev as u64 + 1, true, model.values().cloned().collect(), vec![])
                    } else {
                        // The contract: removals first, then upserts in order.
                        for (k, _) in &removes {
                            model.remove(k);
                        }
                        for (k, item) in &upserts {
                            model.insert(k.clone(), item.clone());
                        }
                        update(
                            rev as u64 + 1,
                            false,
                            upserts.into_iter().map(|(_, i)| i).collect(),
                            removes.into_iter().map(|(_, k)| k).collect(),
                        )
                    };
                    let a = d.apply(&u);
                    prop_assert!(!a.stale);
                    let now = actual(&d);
                    prop_assert_eq!(&now, &expected(&model));
                    // Reported route changes: exactly the destinations whose value moved.
                    let moved: Vec<String> = before
                        .keys()
                        .chain(now.0.keys())
                        .filter(|k| before.get(*k) != now.0.get(*k))
                        .cloned()
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    let mut reported: Vec<String> = a.routes.iter().map(|p| p.to_string()).collect();
                    reported.sort();
                    prop_assert_eq!(reported, moved);
                    for f in IpFamily::ALL {
                        prop_assert_eq!(d.counts(f).iter().sum::<usize>(), d.routes().len_of(f));
                    }
                }
            }
        }
    }
}
