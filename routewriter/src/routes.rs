//! The desired routes of both families, held compactly (sans-IO): the family's label and its
//! contract value, the prefix and route types every other module uses, the interned device
//! names, and the per-family table behind them.
//!
//! Why this file is long: the family-generic prefix and the compact table of both families are
//! one mechanism, with the tests that pin their layout and behaviour.
//!
//! A node may hold 100k routes, so the table does not store what the rest of routewriter sees.
//! [`Prefix`] and [`RouteSpec`] carry an `IpAddr` (17 bytes) and serve every family alike; the
//! table keeps one map per family, generic over the address width: an IPv4 entry is a u32
//! and a length for the key and a u32 gateway, a 2-byte device id and a byte of kind and flag
//! for the value (16 bytes in the map, as when routewriter knew IPv4 only); an IPv6 entry is
//! the same with 16-byte addresses (36 bytes). Lookups convert on the way in and out.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use net_types::IpFamily;

/// The family's lowercase token: routewriter's metrics labels, status keys and logs say
/// "ipv4" / "ipv6".
pub fn family_label(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4",
        IpFamily::V6 => "ipv6",
    }
}

/// The family of the contract's enum value; `None` for unspecified or unknown.
pub fn family_from_proto(value: i32) -> Option<IpFamily> {
    match proto::v1::IpFamily::try_from(value) {
        Ok(proto::v1::IpFamily::V4) => Some(IpFamily::V4),
        Ok(proto::v1::IpFamily::V6) => Some(IpFamily::V6),
        _ => None,
    }
}

pub fn family_to_proto(family: IpFamily) -> proto::v1::IpFamily {
    match family {
        IpFamily::V4 => proto::v1::IpFamily::V4,
        IpFamily::V6 => proto::v1::IpFamily::V6,
    }
}

/// A prefix of either family with its host bits clear.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

/// The address as an integer of 128 bits (IPv4 in the low 32), for masks (also nat.rs's
/// intervals).
pub(crate) fn bits_of(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The host bits of a prefix of `len` in an address of `width` bits.
pub(crate) fn host_mask(width: u8, len: u8) -> u128 {
    let host = u32::from(width - len);
    if host == 128 {
        u128::MAX
    } else {
        (1u128 << host) - 1
    }
}

impl Prefix {
    /// The prefix, or `None` when `len` is over the family's width or host bits are set.
    pub fn new(addr: IpAddr, len: u8) -> Option<Self> {
        let width = IpFamily::of(addr).bits();
        if len > width {
            return None;
        }
        (bits_of(addr) & host_mask(width, len) == 0).then_some(Prefix { addr, len })
    }

    /// A host route: /32 or /128.
    pub fn host(addr: IpAddr) -> Self {
        Prefix {
            addr,
            len: IpFamily::of(addr).bits(),
        }
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.addr)
    }

    /// "10.0.0.0/26", "fd00::/122", or a bare address for a host route.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (
                a,
                Some(
                    l.parse::<u8>()
                        .map_err(|_| format!("bad prefix length in {s:?}"))?,
                ),
            ),
            None => (s, None),
        };
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP prefix"))?;
        let len = len.unwrap_or(IpFamily::of(ip).bits());
        Prefix::new(ip, len).ok_or_else(|| {
            format!(
                "{s} has host bits set or a length over {} (the kernel refuses it)",
                IpFamily::of(ip).bits()
            )
        })
    }

    pub fn net(&self) -> IpNet {
        // The length was checked when the prefix was made.
        IpNet::new(self.addr, self.len).unwrap_or_default()
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl fmt::Debug for Prefix {
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
    /// `<pod>/32 dev cali... scope link` (`/128` for IPv6): a local workload.
    Workload = 1,
    /// `via <gateway> [dev <dev>] [onlink]`: same-subnet blocks, BGP next hops.
    Gateway = 2,
    /// `via <tunnel address> dev vxlan.calico onlink` (`vxlan-v6.calico`): remote blocks over
    /// VXLAN.
    Vxlan = 3,
    /// `via <node address> dev tunl0 onlink`: remote blocks over IPIP (IPv4 only).
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

    fn from_u8(v: u8) -> Kind {
        match v {
            0 => Kind::Blackhole,
            1 => Kind::Workload,
            2 => Kind::Gateway,
            3 => Kind::Vxlan,
            _ => Kind::Ipip,
        }
    }
}

/// An interned device name; 0 is "no device".
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct DevId(pub u16);

impl DevId {
    pub const NONE: DevId = DevId(0);
}

/// One desired route (the prefix is its key), as the rest of routewriter sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RouteSpec {
    gateway: Option<IpAddr>,
    pub dev: DevId,
    pub kind: Kind,
    pub onlink: bool,
}

impl RouteSpec {
    /// The gateway must be of the prefix's family (the parser sees to it).
    pub fn new(kind: Kind, gateway: Option<IpAddr>, dev: DevId, onlink: bool) -> Self {
        RouteSpec {
            gateway: gateway.filter(|g| !g.is_unspecified()),
            dev,
            kind,
            onlink,
        }
    }

    pub fn gateway(&self) -> Option<IpAddr> {
        self.gateway
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

    pub(crate) fn heap_bytes(&self) -> usize {
        self.names.capacity() * std::mem::size_of::<Option<Box<str>>>()
            + self.refs.capacity() * 4
            + self.free.capacity() * 2
            + self.by_name.capacity() * (std::mem::size_of::<(Box<str>, u16)>() + 1)
            + self.by_name.keys().map(|k| k.len() * 2).sum::<usize>()
    }
}

// ---------------------------------------------------------------------------------------------
// The compact table

/// An address as one family's table holds it.
trait Packed: Copy + Eq + Hash {
    /// "No gateway": the unspecified address is never one.
    const NONE: Self;
    /// `None` for an address of the other family.
    fn pack(ip: IpAddr) -> Option<Self>;
    fn unpack(self) -> IpAddr;
}

impl Packed for u32 {
    const NONE: Self = 0;
    fn pack(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(a) => Some(u32::from(a)),
            IpAddr::V6(_) => None,
        }
    }
    fn unpack(self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(self))
    }
}

/// `Ipv6Addr` is 16 bytes aligned to 1, so an IPv6 entry carries no padding.
impl Packed for Ipv6Addr {
    const NONE: Self = Ipv6Addr::UNSPECIFIED;
    fn pack(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        }
    }
    fn unpack(self) -> IpAddr {
        IpAddr::V6(self)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key<A> {
    addr: A,
    len: u8,
}

/// The value: the device id as bytes and the onlink flag in the kind's byte keep it free of
/// padding (an IPv6 value is 19 bytes, not 22).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot<A> {
    gateway: A,
    dev: [u8; 2],
    /// The kind, and 0x80 for onlink.
    bits: u8,
}

const ONLINK: u8 = 0x80;

impl<A: Packed> Slot<A> {
    fn of(spec: &RouteSpec) -> Option<Self> {
        let gateway = match spec.gateway {
            Some(g) => A::pack(g)?,
            None => A::NONE,
        };
        Some(Slot {
            gateway,
            dev: spec.dev.0.to_le_bytes(),
            bits: spec.kind as u8 | if spec.onlink { ONLINK } else { 0 },
        })
    }

    fn spec(&self) -> RouteSpec {
        RouteSpec {
            gateway: (self.gateway != A::NONE).then(|| self.gateway.unpack()),
            dev: DevId(u16::from_le_bytes(self.dev)),
            kind: Kind::from_u8(self.bits & !ONLINK),
            onlink: self.bits & ONLINK != 0,
        }
    }
}

/// One family's routes.
#[derive(Clone)]
struct Table<A> {
    map: HashMap<Key<A>, Slot<A>>,
}

impl<A> Default for Table<A> {
    fn default() -> Self {
        Table {
            map: HashMap::new(),
        }
    }
}

impl<A: Packed> Table<A> {
    fn key(p: &Prefix) -> Option<Key<A>> {
        Some(Key {
            addr: A::pack(p.addr)?,
            len: p.len,
        })
    }

    fn prefix(k: &Key<A>) -> Prefix {
        Prefix {
            addr: k.addr.unpack(),
            len: k.len,
        }
    }

    fn get(&self, p: &Prefix) -> Option<RouteSpec> {
        self.map.get(&Self::key(p)?).map(Slot::spec)
    }

    /// The old value, if any; `Err` when the spec's gateway is of the other family.
    fn insert(&mut self, p: &Prefix, spec: &RouteSpec) -> Result<Option<RouteSpec>, ()> {
        let (Some(k), Some(v)) = (Self::key(p), Slot::of(spec)) else {
            return Err(());
        };
        Ok(match self.map.entry(k) {
            Entry::Occupied(mut e) => Some(std::mem::replace(e.get_mut(), v).spec()),
            Entry::Vacant(e) => {
                e.insert(v);
                None
            }
        })
    }

    fn remove(&mut self, p: &Prefix) -> Option<RouteSpec> {
        self.map.remove(&Self::key(p)?).map(|s| s.spec())
    }

    fn iter(&self) -> impl Iterator<Item = (Prefix, RouteSpec)> + '_ {
        self.map.iter().map(|(k, v)| (Self::prefix(k), v.spec()))
    }

    /// Estimated heap bytes: hashbrown's buckets are a power of two with at most 7/8 used,
    /// one control byte each.
    fn heap_bytes(&self) -> usize {
        let cap = self.map.capacity();
        let buckets = if cap == 0 {
            0
        } else if cap < 8 {
            (cap + 1).next_power_of_two()
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<(Key<A>, Slot<A>)>() + 1)
    }
}

/// The desired routes of both families, keyed by prefix.
#[derive(Clone, Default)]
pub struct Routes {
    v4: Table<u32>,
    v6: Table<Ipv6Addr>,
}

impl fmt::Debug for Routes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Routes {
    pub fn get(&self, p: &Prefix) -> Option<RouteSpec> {
        match p.family() {
            IpFamily::V4 => self.v4.get(p),
            IpFamily::V6 => self.v6.get(p),
        }
    }

    pub fn contains(&self, p: &Prefix) -> bool {
        self.get(p).is_some()
    }

    /// Inserts or replaces; the old value. A gateway of the other family than the prefix's is
    /// refused (the parser never makes one).
    pub fn insert(&mut self, p: Prefix, spec: RouteSpec) -> Result<Option<RouteSpec>, String> {
        let r = match p.family() {
            IpFamily::V4 => self.v4.insert(&p, &spec),
            IpFamily::V6 => self.v6.insert(&p, &spec),
        };
        r.map_err(|()| format!("route {p}: its gateway is not of the prefix's family"))
    }

    pub fn remove(&mut self, p: &Prefix) -> Option<RouteSpec> {
        match p.family() {
            IpFamily::V4 => self.v4.remove(p),
            IpFamily::V6 => self.v6.remove(p),
        }
    }

    pub fn len(&self) -> usize {
        self.v4.map.len() + self.v6.map.len()
    }

    pub fn len_of(&self, family: IpFamily) -> usize {
        match family {
            IpFamily::V4 => self.v4.map.len(),
            IpFamily::V6 => self.v6.map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Both families' routes, IPv4 first, each in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Prefix, RouteSpec)> + '_ {
        self.v4.iter().chain(self.v6.iter())
    }

    /// One family's routes, in no particular order.
    pub fn iter_of(&self, family: IpFamily) -> Box<dyn Iterator<Item = (Prefix, RouteSpec)> + '_> {
        match family {
            IpFamily::V4 => Box::new(self.v4.iter()),
            IpFamily::V6 => Box::new(self.v6.iter()),
        }
    }

    /// Room for `n` more routes of `family`.
    pub fn reserve(&mut self, family: IpFamily, n: usize) {
        match family {
            IpFamily::V4 => self.v4.map.reserve(n),
            IpFamily::V6 => self.v6.map.reserve(n),
        }
    }

    /// Estimated heap bytes of both maps.
    pub fn heap_bytes(&self) -> usize {
        self.v4.heap_bytes() + self.v6.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        Prefix::parse(s).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_of_both_families_parse_strictly() {
        assert_eq!(p("10.0.0.0/26").to_string(), "10.0.0.0/26");
        assert_eq!(p("10.0.0.5").prefix_len(), 32);
        assert_eq!(p("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(p("fd00:20::40/122").to_string(), "fd00:20::40/122");
        assert_eq!(p("fd00:20::5").prefix_len(), 128);
        assert_eq!(p("::/0").family(), IpFamily::V6);
        assert_eq!(p("fd00::/8").net(), "fd00::/8".parse::<IpNet>().unwrap());
        for bad in [
            "10.0.0.1/26",
            "10.0.0.0/33",
            "fd00:20::41/122",
            "fd00::/129",
            "x",
            "10.0.0.0/",
            "fd00::/",
            "",
        ] {
            assert!(Prefix::parse(bad).is_err(), "{bad}");
        }
        // IPv4 sorts before IPv6, each by address then length.
        let mut v = vec![p("fd00::/8"), p("10.0.0.0/8"), p("10.0.0.0/7")];
        v.sort();
        assert_eq!(v, vec![p("10.0.0.0/7"), p("10.0.0.0/8"), p("fd00::/8")]);
    }

    #[test]
    fn entries_stay_small_in_the_map() {
        // IPv4 as before the table knew two families; IPv6 without padding.
        assert_eq!(std::mem::size_of::<(Key<u32>, Slot<u32>)>(), 16);
        assert_eq!(std::mem::size_of::<(Key<Ipv6Addr>, Slot<Ipv6Addr>)>(), 36);
    }

    #[test]
    fn a_value_survives_the_round_trip_through_its_family_table() {
        let mut r = Routes::default();
        let cases = [
            (
                p("10.65.1.0/26"),
                RouteSpec::new(Kind::Vxlan, Some(ip("10.65.1.1")), DevId(7), true),
            ),
            (
                p("10.65.0.0/26"),
                RouteSpec::new(Kind::Blackhole, None, DevId::NONE, false),
            ),
            (
                p("fd00:20::40/122"),
                RouteSpec::new(Kind::Vxlan, Some(ip("fd00:20::41")), DevId(300), true),
            ),
            (
                p("fd00:20::5/128"),
                RouteSpec::new(Kind::Workload, None, DevId(2), false),
            ),
            (
                p("fd00:30::/122"),
                RouteSpec::new(Kind::Gateway, Some(ip("fe80::1")), DevId(1), false),
            ),
        ];
        for (prefix, spec) in &cases {
            assert_eq!(r.insert(*prefix, *spec), Ok(None));
        }
        assert_eq!((r.len_of(IpFamily::V4), r.len_of(IpFamily::V6)), (2, 3));
        for (prefix, spec) in &cases {
            assert_eq!(r.get(prefix), Some(*spec), "{prefix}");
        }
        let mut all: Vec<_> = r.iter().collect();
        all.sort_by_key(|(p, _)| *p);
        let mut want = cases.to_vec();
        want.sort_by_key(|(p, _)| *p);
        assert_eq!(all, want);
        // A prefix is keyed by family, address and length.
        assert_eq!(r.get(&p("fd00:20::40/123")), None);
        assert_eq!(r.get(&p("10.65.1.0/27")), None);
        // Replacing returns the old value; removing too.
        let new = RouteSpec::new(Kind::Gateway, Some(ip("10.0.0.2")), DevId(1), false);
        assert_eq!(r.insert(cases[0].0, new), Ok(Some(cases[0].1)));
        assert_eq!(r.remove(&cases[2].0), Some(cases[2].1));
        assert_eq!(r.remove(&cases[2].0), None);
        assert_eq!(r.len(), 4);
        // A gateway of the other family cannot be held (and the parser never asks).
        let mixed = RouteSpec::new(Kind::Gateway, Some(ip("10.0.0.2")), DevId(1), false);
        assert!(r.insert(p("fd00:40::/122"), mixed).is_err());
        assert_eq!(r.len(), 4);
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
}
