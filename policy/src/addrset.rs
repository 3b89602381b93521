//! Sets of IP addresses, kept as sorted, disjoint, merged intervals per family and handed
//! out as the fewest CIDRs that cover exactly them (what an nftables interval set holds).
//! Used for a peer's addresses: endpoints' addresses, `cidr` minus `except`, their unions
//! and intersections. Pure arithmetic; nothing here knows about policy.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

/// Addresses of both families. `v4` and `v6` are sorted, disjoint and merged: no two of
/// them overlap or could be joined into one larger prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddrSet {
    pub v4: Vec<Ipv4Net>,
    pub v6: Vec<Ipv6Net>,
}

/// Inclusive intervals, sorted and merged (no two touch).
type Intervals = Vec<(u128, u128)>;

impl AddrSet {
    /// Exactly the addresses of `nets` (host bits ignored).
    pub fn from_nets<'a>(nets: impl IntoIterator<Item = &'a IpNet>) -> AddrSet {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for net in nets {
            match net {
                IpNet::V4(n) => v4.push((
                    u128::from(u32::from(n.network())),
                    u128::from(u32::from(n.broadcast())),
                )),
                IpNet::V6(n) => v6.push((u128::from(n.network()), u128::from(n.broadcast()))),
            }
        }
        AddrSet::from_intervals(normalize(v4), normalize(v6))
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => self.v4.iter().any(|n| n.contains(&a)),
            IpAddr::V6(a) => self.v6.iter().any(|n| n.contains(&a)),
        }
    }

    /// Every prefix of both families, v4 first.
    pub fn nets(&self) -> impl Iterator<Item = IpNet> + '_ {
        let v4 = self.v4.iter().map(|n| IpNet::V4(*n));
        v4.chain(self.v6.iter().map(|n| IpNet::V6(*n)))
    }

    pub fn union(&self, other: &AddrSet) -> AddrSet {
        let (a4, a6) = self.intervals();
        let (b4, b6) = other.intervals();
        AddrSet::from_intervals(
            normalize(a4.into_iter().chain(b4).collect()),
            normalize(a6.into_iter().chain(b6).collect()),
        )
    }

    pub fn intersection(&self, other: &AddrSet) -> AddrSet {
        let (a4, a6) = self.intervals();
        let (b4, b6) = other.intervals();
        AddrSet::from_intervals(intersect(&a4, &b4), intersect(&a6, &b6))
    }

    pub fn difference(&self, other: &AddrSet) -> AddrSet {
        let (a4, a6) = self.intervals();
        let (b4, b6) = other.intervals();
        AddrSet::from_intervals(subtract(&a4, &b4), subtract(&a6, &b6))
    }

    fn intervals(&self) -> (Intervals, Intervals) {
        let v4 = self
            .v4
            .iter()
            .map(|n| {
                (
                    u128::from(u32::from(n.network())),
                    u128::from(u32::from(n.broadcast())),
                )
            })
            .collect();
        let v6 = self
            .v6
            .iter()
            .map(|n| (u128::from(n.network()), u128::from(n.broadcast())))
            .collect();
        // Stored prefixes are already sorted and disjoint, but adjacent ones may need joining.
        (normalize(v4), normalize(v6))
    }

    fn from_intervals(v4: Intervals, v6: Intervals) -> AddrSet {
        let v4 = v4
            .iter()
            .flat_map(|&(lo, hi)| cidrs(lo, hi, 32))
            .map(|(addr, len)| {
                // Both fit: `cidrs` keeps v4 values below 2^32 and lengths <= 32.
                Ipv4Net::new_assert((addr as u32).into(), len)
            })
            .collect();
        let v6 = v6
            .iter()
            .flat_map(|&(lo, hi)| cidrs(lo, hi, 128))
            .map(|(addr, len)| Ipv6Net::new_assert(addr.into(), len))
            .collect();
        AddrSet { v4, v6 }
    }
}

/// Sorts and merges overlapping or touching intervals.
fn normalize(mut v: Intervals) -> Intervals {
    v.sort_unstable();
    let mut out: Intervals = Vec::with_capacity(v.len());
    for (lo, hi) in v {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

fn intersect(a: &Intervals, b: &Intervals) -> Intervals {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let lo = a[i].0.max(b[j].0);
        let hi = a[i].1.min(b[j].1);
        if lo <= hi {
            out.push((lo, hi));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

fn subtract(a: &Intervals, b: &Intervals) -> Intervals {
    let mut out = Vec::new();
    for &(lo, hi) in a {
        let mut lo = Some(lo);
        for &(blo, bhi) in b {
            let Some(start) = lo else { break };
            if bhi < start || blo > hi {
                continue;
            }
            if blo > start {
                out.push((start, blo - 1));
            }
            lo = bhi.checked_add(1).filter(|&next| next <= hi);
        }
        if let Some(start) = lo {
            out.push((start, hi));
        }
    }
    out
}

/// The fewest prefixes covering exactly `lo..=hi` in a `width`-bit space, in order.
fn cidrs(mut lo: u128, hi: u128, width: u8) -> Vec<(u128, u8)> {
    let mut out = Vec::new();
    loop {
        // The largest block aligned at `lo` that does not pass `hi`.
        let mut bits = lo.trailing_zeros().min(u32::from(width));
        while bits > 0 && block_end(lo, bits).is_none_or(|end| end > hi) {
            bits -= 1;
        }
        out.push((lo, width - bits as u8));
        match block_end(lo, bits).and_then(|end| end.checked_add(1)) {
            Some(next) if next <= hi => lo = next,
            _ => return out,
        }
    }
}

/// The last address of the block of 2^bits starting at `lo`, if it fits in u128.
fn block_end(lo: u128, bits: u32) -> Option<u128> {
    let size_minus_one = if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    };
    lo.checked_add(size_minus_one)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(nets: &[&str]) -> AddrSet {
        let nets: Vec<IpNet> = nets.iter().map(|n| n.parse().unwrap()).collect();
        AddrSet::from_nets(&nets)
    }

    fn text(s: &AddrSet) -> Vec<String> {
        s.nets().map(|n| n.to_string()).collect()
    }

    #[test]
    fn merges_and_splits_into_fewest_prefixes() {
        let s = set(&["10.0.0.128/25", "10.0.0.0/25", "10.0.1.0/24", "10.0.0.5/32"]);
        assert_eq!(text(&s), ["10.0.0.0/23"]);
        let s = set(&["10.0.0.1/24"]);
        assert_eq!(text(&s), ["10.0.0.0/24"], "host bits are ignored");
        assert_eq!(text(&set(&["0.0.0.0/0", "::/0"])), ["0.0.0.0/0", "::/0"]);
    }

    #[test]
    fn cidr_minus_except() {
        let s = set(&["172.17.0.0/16"]).difference(&set(&["172.17.1.0/24"]));
        assert_eq!(
            text(&s),
            [
                "172.17.0.0/24",
                "172.17.2.0/23",
                "172.17.4.0/22",
                "172.17.8.0/21",
                "172.17.16.0/20",
                "172.17.32.0/19",
                "172.17.64.0/18",
                "172.17.128.0/17"
            ]
        );
        assert!(s.contains("172.17.0.9".parse().unwrap()));
        assert!(!s.contains("172.17.1.9".parse().unwrap()));
        assert!(!s.contains("172.18.0.1".parse().unwrap()));
        let all6 = set(&["::/0"]).difference(&set(&["::/1"]));
        assert_eq!(text(&all6), ["8000::/1"]);
        let none = set(&["10.0.0.0/8"]).difference(&set(&["0.0.0.0/0"]));
        assert!(none.is_empty());
    }

    #[test]
    fn intersection_and_union() {
        let a = set(&["10.0.0.0/24", "fd00::/64"]);
        let b = set(&["10.0.0.7/32", "10.0.1.1/32", "fd00::1/128"]);
        assert_eq!(text(&a.intersection(&b)), ["10.0.0.7/32", "fd00::1/128"]);
        assert_eq!(
            text(&a.union(&b)),
            ["10.0.0.0/24", "10.0.1.1/32", "fd00::/64"]
        );
    }

    #[test]
    fn set_membership_equals_interval_membership() {
        // Every address of a small space: the prefixes cover exactly the intervals.
        for lo in 0u128..40 {
            for hi in lo..40 {
                let prefixes = cidrs(lo, hi, 32);
                for x in 0u128..48 {
                    let covered = prefixes
                        .iter()
                        .filter(|(p, len)| {
                            let bits = 32 - u32::from(*len);
                            x >> bits == p >> bits
                        })
                        .count();
                    assert_eq!(
                        covered,
                        usize::from(x >= lo && x <= hi),
                        "{lo}..={hi} at {x}"
                    );
                }
            }
        }
    }
}
