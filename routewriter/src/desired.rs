//! The desired kernel state, built from the Dataplane stream (sans-IO: updates in, changes out).
//!
//! Why this file is long: one state built from the stream: routes, devices, FDB and neighbour
//! entries, NAT, each item's validation, and the tests of each.
//!
//! [`DesiredState::apply`] takes one `DataplaneUpdate` and reports what changed, so the agent
//! writes only that; it keeps the revision the agent resumes from after a reconnect. Items the
//! kernel could never take (bad addresses, IPv6 for now, a route without its gateway) are
//! rejected one by one with a reason; the rest of the update still applies.
//!
//! Routes are held compactly because a node may hold 100k of them: a prefix is an u32 and a
//! length, a route is its gateway (u32), its device as an index into an interned, refcounted
//! table of names, its kind and the onlink flag: 16 bytes a route plus the map's overhead.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use proto::v1::{DataplaneUpdate, desired_item::Item, desired_key::Key};

use proto::mac::{Mac, parse_mac};

/// An IPv4 prefix with its host bits clear.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix4 {
    addr: u32,
    len: u8,
}

impl Prefix4 {
    /// The prefix, or `None` when `len` is over 32 or host bits are set.
    pub fn new(addr: Ipv4Addr, len: u8) -> Option<Self> {
        if len > 32 {
            return None;
        }
        let addr = u32::from(addr);
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        (addr & !mask == 0).then_some(Prefix4 { addr, len })
    }

    pub fn addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.addr)
    }

    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// "10.0.0.0/26", or "10.0.0.5" for a /32.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (
                a,
                l.parse::<u8>()
                    .map_err(|_| format!("bad prefix length in {s:?}"))?,
            ),
            None => (s, 32),
        };
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP prefix"))?;
        let IpAddr::V4(v4) = ip else {
            return Err(format!(
                "{s} is IPv6: routewriter programs IPv4 only so far"
            ));
        };
        Prefix4::new(v4, len).ok_or_else(|| {
            format!("{s} has host bits set or a length over 32 (the kernel refuses it)")
        })
    }

    pub fn net(&self) -> Ipv4Net {
        // The length was checked when the prefix was made.
        Ipv4Net::new(self.addr(), self.len).unwrap_or_default()
    }
}

impl fmt::Display for Prefix4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.len)
    }
}

impl fmt::Debug for Prefix4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What a route does; decides its kernel type, scope and flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum Kind {
    /// `blackhole <block>`: an own block.
    Blackhole = 0,
    /// `<pod>/32 dev cali... scope link`: a local workload.
    Workload = 1,
    /// `via <gateway> [dev <dev>] [onlink]`: same-subnet blocks, BGP next hops.
    Gateway = 2,
    /// `via <tunnel address> dev vxlan.calico onlink`: remote blocks over VXLAN.
    Vxlan = 3,
    /// `via <node address> dev tunl0 onlink`: remote blocks over IPIP.
    Ipip = 4,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Blackhole,
        Kind::Workload,
        Kind::Gateway,
        Kind::Vxlan,
        Kind::Ipip,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Blackhole => "blackhole",
            Kind::Workload => "workload",
            Kind::Gateway => "gateway",
            Kind::Vxlan => "vxlan",
            Kind::Ipip => "ipip",
        }
    }
}

/// An interned device name; 0 is "no device".
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct DevId(pub u16);

impl DevId {
    pub const NONE: DevId = DevId(0);
}

/// One desired route (the prefix is its key). 8 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RouteSpec {
    /// The gateway as an u32; 0 for none (0.0.0.0 is never a gateway).
    gateway: u32,
    pub dev: DevId,
    pub kind: Kind,
    pub onlink: bool,
}

impl RouteSpec {
    pub fn new(kind: Kind, gateway: Option<Ipv4Addr>, dev: DevId, onlink: bool) -> Self {
        RouteSpec {
            gateway: gateway.map(u32::from).unwrap_or(0),
            dev,
            kind,
            onlink,
        }
    }

    pub fn gateway(&self) -> Option<Ipv4Addr> {
        (self.gateway != 0).then(|| Ipv4Addr::from(self.gateway))
    }
}

/// Interned, refcounted device names: routes hold a 2-byte id instead of a string, and names
/// of workload interfaces that are gone are freed.
#[derive(Debug, Default, Clone)]
pub struct Devices {
    names: Vec<Option<Box<str>>>,
    refs: Vec<u32>,
    by_name: HashMap<Box<str>, u16>,
    free: Vec<u16>,
}

impl Devices {
    /// The id of `name`, taking one reference.
    pub fn intern(&mut self, name: &str) -> Result<DevId, String> {
        if let Some(&id) = self.by_name.get(name) {
            self.refs[usize::from(id) - 1] += 1;
            return Ok(DevId(id));
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                if self.names.len() >= usize::from(u16::MAX) {
                    return Err("more than 65535 distinct devices in routes".into());
                }
                self.names.push(None);
                self.refs.push(0);
                self.names.len() as u16
            }
        };
        let slot = usize::from(id) - 1;
        self.names[slot] = Some(name.into());
        self.refs[slot] = 1;
        self.by_name.insert(name.into(), id);
        Ok(DevId(id))
    }

    /// Drops one reference; the name is freed with the last.
    pub fn release(&mut self, id: DevId) {
        if id == DevId::NONE {
            return;
        }
        let slot = usize::from(id.0) - 1;
        let Some(refs) = self.refs.get_mut(slot) else {
            return;
        };
        *refs = refs.saturating_sub(1);
        if *refs == 0 {
            if let Some(name) = self.names[slot].take() {
                self.by_name.remove(&name);
            }
            self.free.push(id.0);
        }
    }

    pub fn name(&self, id: DevId) -> Option<&str> {
        if id == DevId::NONE {
            return None;
        }
        self.names
            .get(usize::from(id.0) - 1)
            .and_then(|n| n.as_deref())
    }

    pub fn id(&self, name: &str) -> Option<DevId> {
        self.by_name.get(name).map(|&id| DevId(id))
    }

    /// Live names with their ids.
    pub fn iter(&self) -> impl Iterator<Item = (DevId, &str)> {
        self.names
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_deref().map(|n| (DevId(i as u16 + 1), n)))
    }

    fn heap_bytes(&self) -> usize {
        self.names.capacity() * std::mem::size_of::<Option<Box<str>>>()
            + self.refs.capacity() * 4
            + self.free.capacity() * 2
            + self.by_name.capacity() * (std::mem::size_of::<(Box<str>, u16)>() + 1)
            + self.by_name.keys().map(|k| k.len() * 2).sum::<usize>()
    }
}

/// A remote VXLAN endpoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct VtepSpec {
    pub underlay: Ipv4Addr,
    pub mac: Mac,
    pub tunnel: Ipv4Addr,
}

/// This node's VXLAN device as the stream gives it; zeros and `None` mean "use the default".
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LocalVtepSpec {
    pub underlay: Ipv4Addr,
    pub mac: Option<Mac>,
    pub tunnel: Ipv4Addr,
    pub vni: u32,
    pub port: u16,
    pub mtu: u32,
}

/// Where the defaults for unnamed devices come from (the configuration).
#[derive(Clone, Debug)]
pub struct Defaults {
    pub vxlan_device: String,
    pub ipip_device: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            vxlan_device: "vxlan.calico".into(),
            ipip_device: "tunl0".into(),
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
    pub routes: Vec<Prefix4>,
    pub vteps: bool,
    pub local_vtep: bool,
    pub nat: bool,
    /// Items that could not be taken, each "what: why".
    pub rejected: Vec<String>,
}

impl Applied {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty() && !self.vteps && !self.local_vtep && !self.nat && !self.snapshot
    }
}

/// The desired state of the node's kernel.
#[derive(Debug, Default, Clone)]
pub struct DesiredState {
    revision: u64,
    /// Whether a snapshot has been applied (before that, the state is not the server's word).
    complete: bool,
    routes: HashMap<Prefix4, RouteSpec>,
    devices: Devices,
    counts: [usize; 5],
    vteps: BTreeMap<String, VtepSpec>,
    local: Option<LocalVtepSpec>,
    pools: BTreeMap<Ipv4Net, bool>,
    defaults: Defaults,
}

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

    pub fn routes(&self) -> &HashMap<Prefix4, RouteSpec> {
        &self.routes
    }

    pub fn route(&self, prefix: &Prefix4) -> Option<&RouteSpec> {
        self.routes.get(prefix)
    }

    pub fn devices(&self) -> &Devices {
        &self.devices
    }

    /// Desired routes by kind, in [`Kind::ALL`] order.
    pub fn counts(&self) -> [usize; 5] {
        self.counts
    }

    pub fn vteps(&self) -> &BTreeMap<String, VtepSpec> {
        &self.vteps
    }

    pub fn local_vtep(&self) -> Option<&LocalVtepSpec> {
        self.local.as_ref()
    }

    /// Pools by CIDR, with their natOutgoing flag.
    pub fn pools(&self) -> &BTreeMap<Ipv4Net, bool> {
        &self.pools
    }

    /// Estimated heap bytes of the routes (map buckets, control bytes, device names).
    pub fn route_heap_bytes(&self) -> usize {
        let cap = self.routes.capacity();
        // hashbrown: buckets are a power of two with at most 7/8 used; one control byte each.
        let buckets = if cap == 0 {
            0
        } else if cap < 8 {
            (cap + 1).next_power_of_two()
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<(Prefix4, RouteSpec)>() + 1) + self.devices.heap_bytes()
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
        for key in &update.remove {
            match &key.key {
                Some(Key::Route(dest)) => match Prefix4::parse(dest) {
                    Ok(p) => {
                        if self.remove_route(&p) {
                            applied.routes.push(p);
                        }
                    }
                    Err(e) => applied.rejected.push(format!("remove route {dest}: {e}")),
                },
                Some(Key::Vtep(node)) => applied.vteps |= self.vteps.remove(node).is_some(),
                Some(Key::LocalVtep(true)) => applied.local_vtep |= self.local.take().is_some(),
                Some(Key::LocalVtep(false)) | None => {}
                Some(Key::NatPool(cidr)) => match parse_pool(cidr) {
                    Ok(net) => applied.nat |= self.pools.remove(&net).is_some(),
                    Err(e) => applied.rejected.push(format!("remove pool {cidr}: {e}")),
                },
            }
        }
        for item in &update.upsert {
            self.upsert(item.item.as_ref(), &mut applied);
        }
        self.revision = update.revision;
        applied.routes.sort_unstable();
        applied.routes.dedup();
        applied
    }

    fn apply_snapshot(&mut self, update: &DataplaneUpdate) -> Applied {
        let mut next = DesiredState::new(self.defaults.clone());
        next.routes.reserve(update.upsert.len());
        let mut applied = Applied {
            snapshot: true,
            ..Default::default()
        };
        for item in &update.upsert {
            next.upsert(item.item.as_ref(), &mut applied);
        }
        // Which routes differ from before, so the caller can tell what moved.
        let mut changed = Vec::new();
        for (p, spec) in &next.routes {
            match self.routes.get(p) {
                Some(old) if self.same_route(old, &next, spec) => {}
                _ => changed.push(*p),
            }
        }
        changed.extend(self.routes.keys().filter(|p| !next.routes.contains_key(p)));
        changed.sort_unstable();
        changed.dedup();
        applied.routes = changed;
        applied.vteps = next.vteps != self.vteps;
        applied.local_vtep = next.local != self.local;
        applied.nat = next.pools != self.pools;
        next.revision = update.revision;
        next.complete = true;
        *self = next;
        applied
    }

    fn same_route(&self, a: &RouteSpec, other: &DesiredState, b: &RouteSpec) -> bool {
        a.kind == b.kind
            && a.gateway == b.gateway
            && a.onlink == b.onlink
            && self.devices.name(a.dev) == other.devices.name(b.dev)
    }

    fn upsert(&mut self, item: Option<&Item>, applied: &mut Applied) {
        match item {
            Some(Item::Route(r)) => match self.parse_route(r) {
                Ok((p, spec)) => {
                    if self.insert_route(p, spec) {
                        applied.routes.push(p);
                    }
                }
                Err(e) => {
                    applied
                        .rejected
                        .push(format!("route {} ({}): {e}", r.destination, r.source));
                    // The server no longer wants the old value either: drop it.
                    if let Ok(p) = Prefix4::parse(&r.destination)
                        && self.remove_route(&p)
                    {
                        applied.routes.push(p);
                    }
                }
            },
            Some(Item::Vtep(v)) => match parse_vtep(v) {
                Ok(spec) => {
                    if self.vteps.get(&v.node) != Some(&spec) {
                        self.vteps.insert(v.node.clone(), spec);
                        applied.vteps = true;
                    }
                }
                Err(e) => {
                    applied.rejected.push(format!("vtep {:?}: {e}", v.node));
                    applied.vteps |= self.vteps.remove(&v.node).is_some();
                }
            },
            Some(Item::LocalVtep(l)) => match parse_local_vtep(l) {
                Ok(spec) => {
                    if self.local != Some(spec) {
                        self.local = Some(spec);
                        applied.local_vtep = true;
                    }
                }
                Err(e) => {
                    applied.rejected.push(format!("local vtep: {e}"));
                    applied.local_vtep |= self.local.take().is_some();
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
            None => applied.rejected.push("an empty item".into()),
        }
    }

    /// Inserts or replaces; true when the desired value changed. Takes ownership of the
    /// device reference in `spec`.
    fn insert_route(&mut self, p: Prefix4, spec: RouteSpec) -> bool {
        match self.routes.insert(p, spec) {
            Some(old) => {
                self.devices.release(old.dev);
                self.counts[old.kind as usize] -= 1;
                self.counts[spec.kind as usize] += 1;
                old != spec
            }
            None => {
                self.counts[spec.kind as usize] += 1;
                true
            }
        }
    }

    fn remove_route(&mut self, p: &Prefix4) -> bool {
        match self.routes.remove(p) {
            Some(old) => {
                self.devices.release(old.dev);
                self.counts[old.kind as usize] -= 1;
                true
            }
            None => false,
        }
    }

    /// Checks a route and interns its device (one reference, owned by the returned spec).
    fn parse_route(&mut self, r: &proto::v1::KernelRoute) -> Result<(Prefix4, RouteSpec), String> {
        use proto::v1::RouteKind as P;
        let p = Prefix4::parse(&r.destination)?;
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
            match r.gateway.parse::<IpAddr>() {
                Ok(IpAddr::V4(g)) if !g.is_unspecified() => Some(g),
                Ok(_) => {
                    return Err(format!(
                        "gateway {} is not a usable IPv4 address",
                        r.gateway
                    ));
                }
                Err(_) => return Err(format!("gateway {:?} is not an address", r.gateway)),
            }
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
                (Some(g), device, r.onlink)
            }
            Kind::Vxlan | Kind::Ipip => {
                let Some(g) = gateway else {
                    return Err(format!("a {} route needs the remote address", kind.name()));
                };
                let default = if kind == Kind::Vxlan {
                    &self.defaults.vxlan_device
                } else {
                    &self.defaults.ipip_device
                };
                let dev = if device.is_empty() {
                    default.as_str()
                } else {
                    device
                };
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

fn parse_v4(what: &str, s: &str) -> Result<Ipv4Addr, String> {
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) if !a.is_unspecified() => Ok(a),
        Ok(IpAddr::V4(_)) => Err(format!("{what} 0.0.0.0 is not usable")),
        Ok(IpAddr::V6(_)) => Err(format!(
            "{what} {s} is IPv6: routewriter programs IPv4 only so far"
        )),
        Err(_) => Err(format!("{what} {s:?} is not an address")),
    }
}

fn parse_vtep(v: &proto::v1::Vtep) -> Result<VtepSpec, String> {
    if v.node.is_empty() {
        return Err("a VTEP needs its node name".into());
    }
    Ok(VtepSpec {
        underlay: parse_v4("underlay address", &v.underlay_address)?,
        mac: parse_mac(&v.mac).ok_or_else(|| format!("MAC {:?} is not a MAC address", v.mac))?,
        tunnel: parse_v4("tunnel address", &v.tunnel_address)?,
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
    Ok(LocalVtepSpec {
        underlay: parse_v4("underlay address", &l.underlay_address)?,
        mac,
        tunnel: parse_v4("tunnel address", &l.tunnel_address)?,
        vni: l.vni,
        port,
        mtu: l.mtu,
    })
}

fn parse_pool(cidr: &str) -> Result<Ipv4Net, String> {
    let p = Prefix4::parse(cidr)?;
    Ok(p.net())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::v1::{
        DesiredItem, DesiredKey, KernelRoute, LocalVtep, NatPool, RouteKind as P, Vtep,
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

    fn p(s: &str) -> Prefix4 {
        Prefix4::parse(s).unwrap()
    }

    #[test]
    fn prefixes_parse_strictly() {
        assert_eq!(p("10.0.0.0/26").to_string(), "10.0.0.0/26");
        assert_eq!(p("10.0.0.5").prefix_len(), 32);
        assert_eq!(p("0.0.0.0/0").to_string(), "0.0.0.0/0");
        for bad in [
            "10.0.0.1/26",
            "10.0.0.0/33",
            "fd00::/64",
            "x",
            "10.0.0.0/",
            "",
        ] {
            assert!(Prefix4::parse(bad).is_err(), "{bad}");
        }
        assert!(Prefix4::parse("fd00::/64").unwrap_err().contains("IPv6"));
    }

    #[test]
    fn a_route_is_sixteen_bytes_in_the_map() {
        assert_eq!(std::mem::size_of::<RouteSpec>(), 8);
        assert_eq!(std::mem::size_of::<(Prefix4, RouteSpec)>(), 16);
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
        assert_eq!(d.counts(), [1, 1, 0, 1, 0]);
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
        assert_eq!(d.counts(), [1, 0, 0, 1, 0]);
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

    #[test]
    fn a_snapshot_drops_what_it_does_not_name() {
        let mut d = DesiredState::new(Defaults::default());
        d.apply(&update(
            1,
            true,
            vec![
                route("10.65.0.0/26", P::Blackhole, "", "", false),
                route("10.65.2.0/26", P::Gateway, "10.0.0.2", "eth0", true),
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
            ],
            vec![],
        ));
        // Snapshots are always taken, even at a lower or equal revision (a restarted server).
        assert!(!a.stale);
        assert_eq!(a.routes, vec![p("10.65.2.0/26"), p("10.65.3.0/26")]);
        let a = d.apply(&update(2, true, vec![], vec![]));
        assert_eq!(a.routes.len(), 3);
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
                route("fd00::/64", P::Blackhole, "", "", false),
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
                route("10.65.6.0/26", P::Blackhole, "", "", false),
                DesiredItem {
                    item: Some(Item::Vtep(Vtep {
                        node: "b".into(),
                        underlay_address: "10.0.0.2".into(),
                        mac: "not-a-mac".into(),
                        tunnel_address: "10.65.1.0".into(),
                    })),
                },
                DesiredItem {
                    item: Some(Item::NatPool(NatPool {
                        cidr: "10.65.0.0/16".into(),
                        nat_outgoing: true,
                    })),
                },
                DesiredItem { item: None },
            ],
            vec![],
        ));
        assert_eq!(a.rejected.len(), 9, "{:#?}", a.rejected);
        assert_eq!(d.routes().len(), 1);
        assert!(d.route(&p("10.65.6.0/26")).is_some());
        assert_eq!(d.pools().len(), 1);
        assert!(a.rejected.iter().any(|r| r.contains("IPv6")));
    }

    #[test]
    fn an_invalid_update_of_a_route_drops_the_old_value() {
        let mut d = DesiredState::new(Defaults::default());
        d.apply(&update(
            1,
            true,
            vec![route("10.65.1.0/26", P::Gateway, "10.0.0.2", "", false)],
            vec![],
        ));
        let a = d.apply(&update(
            2,
            false,
            vec![route("10.65.1.0/26", P::Gateway, "", "", false)],
            vec![],
        ));
        assert_eq!(a.routes, vec![p("10.65.1.0/26")]);
        assert_eq!(a.rejected.len(), 1);
        assert!(d.routes().is_empty());
    }

    #[test]
    fn vteps_local_and_pools() {
        let mut d = DesiredState::new(Defaults::default());
        let vtep = |mac: &str| DesiredItem {
            item: Some(Item::Vtep(Vtep {
                node: "b".into(),
                underlay_address: "10.0.0.2".into(),
                mac: mac.into(),
                tunnel_address: "10.65.1.0".into(),
            })),
        };
        let local = DesiredItem {
            item: Some(Item::LocalVtep(LocalVtep {
                underlay_address: "10.0.0.1".into(),
                mac: String::new(),
                tunnel_address: "10.65.0.0".into(),
                vni: 0,
                port: 0,
                mtu: 0,
            })),
        };
        let a = d.apply(&update(
            1,
            true,
            vec![vtep("66:00:00:00:00:02"), local.clone()],
            vec![],
        ));
        assert!(a.vteps && a.local_vtep && !a.nat);
        let a = d.apply(&update(
            2,
            false,
            vec![vtep("66:00:00:00:00:02"), local],
            vec![],
        ));
        assert!(!a.vteps && !a.local_vtep, "unchanged items change nothing");
        let a = d.apply(&update(3, false, vec![vtep("66:00:00:00:00:03")], vec![]));
        assert!(a.vteps);
        assert_eq!(d.vteps()["b"].mac, [0x66, 0, 0, 0, 0, 3]);
        let a = d.apply(&update(
            4,
            false,
            vec![],
            vec![
                DesiredKey {
                    key: Some(Key::Vtep("b".into())),
                },
                DesiredKey {
                    key: Some(Key::LocalVtep(true)),
                },
            ],
        ));
        assert!(a.vteps && a.local_vtep);
        assert!(d.vteps().is_empty() && d.local_vtep().is_none());
    }

    #[test]
    fn devices_are_interned_and_freed() {
        let mut devs = Devices::default();
        let a = devs.intern("eth0").unwrap();
        let b = devs.intern("eth0").unwrap();
        assert_eq!(a, b);
        let c = devs.intern("cali1").unwrap();
        assert_ne!(a, c);
        devs.release(a);
        assert_eq!(devs.name(a), Some("eth0"));
        devs.release(b);
        assert_eq!(devs.name(a), None);
        let d = devs.intern("cali2").unwrap();
        assert_eq!(d, a, "the freed slot is reused");
        devs.release(DevId::NONE);
        devs.release(DevId(999));
    }

    #[test]
    fn held_bytes_per_route_stay_small() {
        let mut d = DesiredState::new(Defaults::default());
        let items: Vec<_> = (0..10_000u32)
            .map(|i| {
                let net = Ipv4Addr::from(0x0A80_0000 + (i << 6));
                route(&format!("{net}/26"), P::Gateway, "10.0.0.2", "eth0", false)
            })
            .collect();
        d.apply(&update(1, true, items, vec![]));
        let per_route = d.route_heap_bytes() / 10_000;
        assert!(per_route < 40, "{per_route} bytes per route");
    }
}
