//! A peer's own filter rules: Calico's `BGPFilter` resources attached to a `BGPPeer`, as data.
//!
//! **Job.** Hold one session's import and export rules (both families, in the order the peer
//! names its filters and each filter lists them) and find the first that matches a route.
//! Calico renders each filter as a BIRD function called *before* its generated export logic
//! and before the import default; the first rule that matches, across all the peer's filters,
//! decides, and a route no rule matches falls through to the generated rules
//! ([`super::Policy`] evaluates them in that order).
//!
//! **Boundaries.** Pure data; the datastore's resource is converted by bgpd and validated
//! there (CIDR families, length bounds). Mesh sessions never have filters.

use std::fmt;

use bgp_wire::Prefix;
use ipnet::IpNet;

use super::RouteSource;

/// An interface name as the kernel has it (at most 15 bytes): `Copy`, so that the RIB's
/// per-peer facts stay plain values.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IfName {
    len: u8,
    bytes: [u8; 15],
}

impl IfName {
    /// `None` when `name` is empty or longer than the kernel's limit.
    pub fn new(name: &str) -> Option<Self> {
        let b = name.as_bytes();
        if b.is_empty() || b.len() > 15 {
            return None;
        }
        let mut bytes = [0; 15];
        bytes[..b.len()].copy_from_slice(b);
        Some(IfName {
            len: b.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // Built from a &str, cut only at its end.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Debug for IfName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// How a rule's `cidr` relates to the route's prefix (Calico's `matchOperator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOperator {
    /// The prefix is exactly the CIDR.
    Equal,
    NotEqual,
    /// The prefix is the CIDR or inside it, with a length in the rule's bounds.
    In,
    NotIn,
}

/// Which way a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Direction {
    Import,
    Export,
}

/// One rule of a `BGPFilter`: every condition set must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterRule {
    /// The `BGPFilter` it comes from, and its place there (`exportV4[2]`), for explanations.
    pub filter: String,
    pub place: String,
    /// The family of the list it is in: an IPv4 list never matches an IPv6 route.
    pub ipv6: bool,
    pub cidr: Option<(IpNet, MatchOperator)>,
    /// Calico's `prefixLength {min, max}`; `None` where unset.
    pub min_len: Option<u8>,
    pub max_len: Option<u8>,
    /// `source: RemotePeers`: only routes learned from a BGP peer.
    pub from_peers: bool,
    /// Only routes through an interface of this name (`*` matches any run of characters).
    pub interface: Option<String>,
    pub accept: bool,
}

impl FilterRule {
    /// A rule of filter `filter` at `place` that decides every route of its family.
    pub fn new(filter: &str, place: &str, ipv6: bool, accept: bool) -> Self {
        FilterRule {
            filter: filter.to_owned(),
            place: place.to_owned(),
            ipv6,
            cidr: None,
            min_len: None,
            max_len: None,
            from_peers: false,
            interface: None,
            accept,
        }
    }

    /// The length bounds of `In` / `NotIn` (BIRD's `net ~ [cidr{lo,hi}]`): from the CIDR's
    /// own length (or `min` if longer) to the family's longest (or `max` if shorter).
    fn bounds(&self, cidr: &IpNet) -> (u8, u8) {
        let lo = self
            .min_len
            .map_or(cidr.prefix_len(), |m| m.max(cidr.prefix_len()));
        let hi = self
            .max_len
            .map_or(cidr.max_prefix_len(), |m| m.min(cidr.max_prefix_len()));
        (lo, hi)
    }

    pub fn matches(&self, p: Prefix, src: RouteSource, interface: Option<IfName>) -> bool {
        if p.addr().is_ipv6() != self.ipv6 {
            return false;
        }
        let len = p.prefix_len();
        let net_ok = match self.cidr {
            None => true,
            Some((c, op)) => {
                let exact = c.network() == p.addr() && c.prefix_len() == len;
                let (lo, hi) = self.bounds(&c);
                let inside = c.contains(&p.addr()) && (lo..=hi).contains(&len);
                match op {
                    // Bounds are part of the set for In / NotIn; for Equal / NotEqual they are
                    // conditions of their own on the route's length.
                    MatchOperator::Equal => exact && self.len_ok(len),
                    MatchOperator::NotEqual => !exact && self.len_ok(len),
                    MatchOperator::In => inside,
                    MatchOperator::NotIn => !inside,
                }
            }
        };
        net_ok
            && (!self.from_peers || matches!(src, RouteSource::Peer(_)))
            && self.interface.as_deref().is_none_or(|pat| {
                interface.is_some_and(|i| glob_match(pat.as_bytes(), i.as_str().as_bytes()))
            })
    }

    fn len_ok(&self, len: u8) -> bool {
        self.min_len.is_none_or(|m| len >= m) && self.max_len.is_none_or(|m| len <= m)
    }

    /// The match, BIRD-like: `net ~ [10.0.0.0/16{16,24}] && from peers`.
    pub fn describe_match(&self) -> String {
        let mut parts = vec![
            if self.ipv6 {
                "net.type = NET_IP6"
            } else {
                "net.type = NET_IP4"
            }
            .to_owned(),
        ];
        if let Some((c, op)) = self.cidr {
            let (lo, hi) = self.bounds(&c);
            parts.push(match op {
                MatchOperator::Equal => format!("net = {c}"),
                MatchOperator::NotEqual => format!("net != {c}"),
                MatchOperator::In => format!("net ~ [{c}{{{lo},{hi}}}]"),
                MatchOperator::NotIn => format!("net !~ [{c}{{{lo},{hi}}}]"),
            });
            if matches!(op, MatchOperator::Equal | MatchOperator::NotEqual) {
                if let Some(m) = self.min_len {
                    parts.push(format!("net.len >= {m}"));
                }
                if let Some(m) = self.max_len {
                    parts.push(format!("net.len <= {m}"));
                }
            }
        }
        if self.from_peers {
            parts.push("from remote peers".into());
        }
        if let Some(i) = &self.interface {
            parts.push(format!("ifname ~ \"{i}\""));
        }
        parts.join(" && ")
    }

    /// Why: the filter and the rule's place in it.
    pub fn reason(&self) -> String {
        format!("BGPFilter {} {}", self.filter, self.place)
    }
}

/// `*` matches any run (also empty); everything else itself. Iterative with one backtrack
/// point, so a hostile pattern costs O(n·m) at worst.
fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() && pat[p] == b'*' {
            star = Some((p, i));
            p += 1;
        } else if p < pat.len() && pat[p] == s[i] {
            p += 1;
            i += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|c| *c == b'*')
}

/// One session's rules, both directions, in evaluation order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerFilters {
    pub import: Vec<FilterRule>,
    pub export: Vec<FilterRule>,
}

impl PeerFilters {
    pub fn rules(&self, d: Direction) -> &[FilterRule] {
        match d {
            Direction::Import => &self.import,
            Direction::Export => &self.export,
        }
    }

    /// The first rule of direction `d` that matches, if any.
    pub fn decide(
        &self,
        d: Direction,
        p: Prefix,
        src: RouteSource,
        interface: Option<IfName>,
    ) -> Option<&FilterRule> {
        self.rules(d).iter().find(|r| r.matches(p, src, interface))
    }

    pub fn is_empty(&self) -> bool {
        self.import.is_empty() && self.export.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PeerClass;

    fn pfx(s: &str) -> Prefix {
        let n: IpNet = s.parse().unwrap();
        Prefix::new(n.network(), n.prefix_len()).unwrap()
    }

    fn rule(cidr: &str, op: MatchOperator) -> FilterRule {
        let n: IpNet = cidr.parse().unwrap();
        let mut r = FilterRule::new("f", "exportV4[0]", n.addr().is_ipv6(), true);
        r.cidr = Some((n, op));
        r
    }

    const LOCAL: RouteSource = RouteSource::Local;
    const PEER: RouteSource = RouteSource::Peer(PeerClass::External);

    #[test]
    fn operators_match_as_calico_renders_them() {
        let cases = [
            (MatchOperator::Equal, "10.0.0.0/16", true),
            (MatchOperator::Equal, "10.0.1.0/24", false),
            (MatchOperator::NotEqual, "10.0.0.0/16", false),
            (MatchOperator::NotEqual, "10.0.1.0/24", true),
            (MatchOperator::In, "10.0.1.0/24", true),
            (MatchOperator::In, "10.0.0.0/16", true),
            (MatchOperator::In, "10.0.0.0/8", false),
            (MatchOperator::In, "10.1.0.0/24", false),
            (MatchOperator::NotIn, "10.1.0.0/24", true),
            (MatchOperator::NotIn, "10.0.9.0/26", false),
        ];
        for (op, p, want) in cases {
            assert_eq!(
                rule("10.0.0.0/16", op).matches(pfx(p), LOCAL, None),
                want,
                "{op:?} {p}"
            );
        }
    }

    #[test]
    fn length_bounds_narrow_the_set() {
        let mut r = rule("10.0.0.0/16", MatchOperator::In);
        r.min_len = Some(24);
        r.max_len = Some(26);
        for (p, want) in [
            ("10.0.0.0/16", false),
            ("10.0.1.0/23", false),
            ("10.0.1.0/24", true),
            ("10.0.1.0/26", true),
            ("10.0.1.0/27", false),
        ] {
            assert_eq!(r.matches(pfx(p), LOCAL, None), want, "{p}");
        }
        assert_eq!(
            r.describe_match(),
            "net.type = NET_IP4 && net ~ [10.0.0.0/16{24,26}]"
        );
        // NotIn is the complement of the same set.
        r.cidr = Some(("10.0.0.0/16".parse().unwrap(), MatchOperator::NotIn));
        assert!(r.matches(pfx("10.0.1.0/27"), LOCAL, None));
        assert!(!r.matches(pfx("10.0.1.0/25"), LOCAL, None));
        // A minimum shorter than the CIDR's own length changes nothing.
        let mut r = rule("10.0.0.0/16", MatchOperator::In);
        r.min_len = Some(8);
        assert!(!r.matches(pfx("10.0.0.0/15"), LOCAL, None));
    }

    #[test]
    fn a_list_of_one_family_never_matches_the_other() {
        let any_v4 = FilterRule::new("f", "exportV4[0]", false, false);
        assert!(any_v4.matches(pfx("192.0.2.0/24"), LOCAL, None));
        assert!(!any_v4.matches(pfx("2001:db8::/64"), LOCAL, None));
        let v6 = rule("fd00:20::/48", MatchOperator::In);
        assert!(v6.matches(pfx("fd00:20::/122"), LOCAL, None));
        assert!(!v6.matches(pfx("10.0.0.0/8"), LOCAL, None));
    }

    #[test]
    fn source_and_interface_conditions() {
        let mut r = FilterRule::new("f", "importV4[0]", false, false);
        r.from_peers = true;
        assert!(!r.matches(pfx("10.0.0.0/24"), LOCAL, None));
        assert!(r.matches(pfx("10.0.0.0/24"), PEER, None));
        r.from_peers = false;
        r.interface = Some("eth*".into());
        let eth0 = IfName::new("eth0");
        assert!(r.matches(pfx("10.0.0.0/24"), PEER, eth0));
        assert!(!r.matches(pfx("10.0.0.0/24"), PEER, IfName::new("vxlan.calico")));
        assert!(
            !r.matches(pfx("10.0.0.0/24"), LOCAL, None),
            "no interface: no match"
        );
    }

    #[test]
    fn glob_matches_runs_and_literals() {
        for (pat, s, want) in [
            ("*", "", true),
            ("*", "eth0", true),
            ("eth0", "eth0", true),
            ("eth0", "eth01", false),
            ("*.calico", "vxlan.calico", true),
            ("*.calico", "vxlan.calic", false),
            ("e*h*0", "eth0", true),
            ("a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false),
        ] {
            assert_eq!(glob_match(pat.as_bytes(), s.as_bytes()), want, "{pat} {s}");
        }
        assert_eq!(
            IfName::new("vxlan-v6.calico").map(|i| i.as_str().len()),
            Some(15)
        );
        assert!(IfName::new("sixteen-letters!").is_none());
        assert!(IfName::new("").is_none());
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let mut f = PeerFilters::default();
        f.export.push(rule("10.0.0.0/16", MatchOperator::In));
        f.export
            .push(FilterRule::new("g", "exportV4[0]", false, false));
        let d = |p| {
            f.decide(Direction::Export, pfx(p), LOCAL, None)
                .map(|r| (r.accept, r.filter.clone()))
        };
        assert_eq!(d("10.0.3.0/24"), Some((true, "f".into())));
        assert_eq!(d("192.0.2.0/24"), Some((false, "g".into())));
        assert_eq!(
            d("2001:db8::/64"),
            None,
            "falls through to the generated rules"
        );
        assert_eq!(
            f.decide(Direction::Import, pfx("10.0.3.0/24"), PEER, None),
            None
        );
    }
}
