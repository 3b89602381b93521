//! The table of service addresses this node announces, each under a lease its caller (a
//! load-balancer controller) renews, and the checks on a request: sans-IO, the caller gives
//! the time, so expiry is exact and testable. Which addresses may be announced at all is
//! decided here too, from the cluster's `BGPConfiguration` the caller read.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use ::datastore::model::BgpConfiguration;

/// The TTL of a request that gives none (`ttl_s` 0), seconds.
pub const DEFAULT_TTL_S: u32 = 60;
/// The longest lease, seconds: a day. A controller that stops renewing must not pin an
/// address for longer.
pub const MAX_TTL_S: u32 = 86_400;
/// Owners are labels for people (`namespace/name`); this is far above any Kubernetes one.
pub const MAX_OWNER_LEN: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("address: {0:?} is not an IP address")]
    NotAnAddress(String),
    #[error("address: {0} is not a unicast address that can be announced ({1})")]
    NotUnicast(IpAddr, &'static str),
    #[error(
        "address: {0} is not inside serviceExternalIPs or serviceLoadBalancerIPs of the BGPConfiguration; add its range there first"
    )]
    NotAServiceRange(IpAddr),
    #[error(
        "ttl_s: {0} is out of range {min}-{MAX_TTL_S} (0 means {DEFAULT_TTL_S})",
        min = 1
    )]
    TtlRange(u32),
    #[error("owner: {0} bytes is longer than {MAX_OWNER_LEN}")]
    OwnerTooLong(usize),
    #[error("address: {0} is not announced by this node")]
    NotAnnounced(IpAddr),
}

/// One announced address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub owner: String,
    pub ttl_s: u32,
    pub expires_at: Instant,
}

/// What an announcement changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The address was not announced: the speaker must announce it.
    New,
    /// It was: only the lease moved on (and the owner may have changed).
    Renewed,
}

/// The TTL a request asks for, checked: 0 means [`DEFAULT_TTL_S`].
pub fn ttl(ttl_s: u32) -> Result<u32, LeaseError> {
    match ttl_s {
        0 => Ok(DEFAULT_TTL_S),
        1..=MAX_TTL_S => Ok(ttl_s),
        _ => Err(LeaseError::TtlRange(ttl_s)),
    }
}

/// Parses and checks a service address: a unicast address a router can forward to.
pub fn address(text: &str) -> Result<IpAddr, LeaseError> {
    let addr: IpAddr = text
        .trim()
        .parse()
        .map_err(|_| LeaseError::NotAnAddress(text.to_owned()))?;
    let why = match addr {
        IpAddr::V4(a) => v4_refusal(a),
        IpAddr::V6(a) => v6_refusal(a),
    };
    match why {
        Some(why) => Err(LeaseError::NotUnicast(addr, why)),
        None => Ok(addr),
    }
}

fn v4_refusal(a: Ipv4Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        Some("unspecified")
    } else if a.is_loopback() {
        Some("loopback")
    } else if a.is_link_local() {
        Some("link-local")
    } else if a.is_multicast() {
        Some("multicast")
    } else if a.is_broadcast() {
        Some("broadcast")
    } else if a.octets()[0] >= 240 {
        Some("reserved")
    } else {
        None
    }
}

fn v6_refusal(a: Ipv6Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        Some("unspecified")
    } else if a.is_loopback() {
        Some("loopback")
    } else if a.is_multicast() {
        Some("multicast")
    } else if a.segments()[0] & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if a.to_ipv4_mapped().is_some() {
        Some("IPv4-mapped: give the IPv4 address")
    } else {
        None
    }
}

/// Refuses an address outside the configuration's external and load-balancer ranges:
/// those are the ranges the network team agreed the cluster may announce (Calico's
/// allow-list), and the export policy only lets routes inside them out to the ToRs.
pub fn allowed(addr: IpAddr, config: &BgpConfiguration) -> Result<(), LeaseError> {
    let inside = config
        .service_external_ips
        .iter()
        .chain(&config.service_load_balancer_ips)
        .any(|net| net.contains(&addr));
    if inside {
        Ok(())
    } else {
        Err(LeaseError::NotAServiceRange(addr))
    }
}

/// A request's owner, checked.
pub fn owner(owner: &str) -> Result<String, LeaseError> {
    let owner = owner.trim();
    if owner.len() > MAX_OWNER_LEN {
        return Err(LeaseError::OwnerTooLong(owner.len()));
    }
    Ok(owner.to_owned())
}

/// The announced addresses and their leases.
#[derive(Debug, Default)]
pub struct Leases {
    by_addr: BTreeMap<IpAddr, Lease>,
}

impl Leases {
    pub fn new() -> Self {
        Self::default()
    }

    /// Announces `addr` for `ttl_s` seconds from `now` (see [`ttl`]), or renews it: a
    /// renewal replaces the expiry (it may shorten it too: the caller's latest word counts)
    /// and the owner.
    pub fn announce(
        &mut self,
        addr: IpAddr,
        owner: &str,
        ttl_s: u32,
        now: Instant,
    ) -> Result<Change, LeaseError> {
        let ttl_s = ttl(ttl_s)?;
        let owner = self::owner(owner)?;
        let lease = Lease {
            owner,
            ttl_s,
            expires_at: now + Duration::from_secs(u64::from(ttl_s)),
        };
        Ok(match self.by_addr.insert(addr, lease) {
            None => Change::New,
            Some(_) => Change::Renewed,
        })
    }

    /// Stops announcing `addr`; its lease.
    pub fn withdraw(&mut self, addr: IpAddr) -> Result<Lease, LeaseError> {
        self.by_addr
            .remove(&addr)
            .ok_or(LeaseError::NotAnnounced(addr))
    }

    /// Removes the leases that ran out at `now` (a lease whose expiry is `now` has run out);
    /// their addresses, in order.
    pub fn expire(&mut self, now: Instant) -> Vec<IpAddr> {
        let gone: Vec<IpAddr> = self
            .by_addr
            .iter()
            .filter(|(_, l)| l.expires_at <= now)
            .map(|(a, _)| *a)
            .collect();
        for a in &gone {
            self.by_addr.remove(a);
        }
        gone
    }

    /// When the next lease runs out.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.by_addr.values().map(|l| l.expires_at).min()
    }

    pub fn get(&self, addr: IpAddr) -> Option<&Lease> {
        self.by_addr.get(&addr)
    }

    /// Every lease, by address.
    pub fn list(&self) -> Vec<(IpAddr, Lease)> {
        self.by_addr.iter().map(|(a, l)| (*a, l.clone())).collect()
    }

    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_new_address_is_new_and_a_second_announce_renews_and_extends() {
        let t0 = Instant::now();
        let mut l = Leases::new();
        assert_eq!(
            l.announce(a("192.0.2.1"), "default/lb", 10, t0),
            Ok(Change::New)
        );
        assert_eq!(
            l.get(a("192.0.2.1")).unwrap().expires_at,
            t0 + Duration::from_secs(10)
        );
        let t1 = t0 + Duration::from_secs(8);
        assert_eq!(
            l.announce(a("192.0.2.1"), "default/other", 10, t1),
            Ok(Change::Renewed)
        );
        let lease = l.get(a("192.0.2.1")).unwrap();
        assert_eq!(lease.expires_at, t1 + Duration::from_secs(10));
        assert_eq!(lease.owner, "default/other");
        // Past the first expiry, before the renewed one: still there.
        assert!(l.expire(t0 + Duration::from_secs(12)).is_empty());
        assert_eq!(l.len(), 1);
        assert_eq!(l.expire(t1 + Duration::from_secs(10)), vec![a("192.0.2.1")]);
        assert!(l.is_empty());
    }

    #[test]
    fn expiry_is_exact() {
        let t0 = Instant::now();
        let mut l = Leases::new();
        l.announce(a("192.0.2.1"), "", 2, t0).unwrap();
        let end = t0 + Duration::from_secs(2);
        assert!(l.expire(end - Duration::from_nanos(1)).is_empty());
        assert_eq!(l.next_deadline(), Some(end));
        assert_eq!(l.expire(end), vec![a("192.0.2.1")]);
        assert_eq!(l.next_deadline(), None);
        // Nothing left to expire twice.
        assert!(l.expire(end + Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn expire_takes_only_those_that_ran_out_and_the_deadline_is_the_earliest() {
        let t0 = Instant::now();
        let mut l = Leases::new();
        l.announce(a("192.0.2.3"), "", 30, t0).unwrap();
        l.announce(a("192.0.2.1"), "", 5, t0).unwrap();
        l.announce(a("2001:db8::1"), "", 5, t0).unwrap();
        l.announce(a("192.0.2.2"), "", 20, t0).unwrap();
        assert_eq!(l.next_deadline(), Some(t0 + Duration::from_secs(5)));
        assert_eq!(
            l.expire(t0 + Duration::from_secs(6)),
            vec![a("192.0.2.1"), a("2001:db8::1")]
        );
        assert_eq!(l.next_deadline(), Some(t0 + Duration::from_secs(20)));
        let left: Vec<IpAddr> = l.list().into_iter().map(|(a, _)| a).collect();
        assert_eq!(left, vec![a("192.0.2.2"), a("192.0.2.3")]);
    }

    #[test]
    fn withdraw_removes_and_an_unknown_address_is_an_error() {
        let t0 = Instant::now();
        let mut l = Leases::new();
        assert_eq!(
            l.withdraw(a("192.0.2.1")),
            Err(LeaseError::NotAnnounced(a("192.0.2.1")))
        );
        l.announce(a("192.0.2.1"), "ns/x", 0, t0).unwrap();
        let lease = l.withdraw(a("192.0.2.1")).unwrap();
        assert_eq!(lease.owner, "ns/x");
        assert_eq!(lease.ttl_s, DEFAULT_TTL_S);
        assert_eq!(l.next_deadline(), None);
        let err = l.withdraw(a("192.0.2.1")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "address: 192.0.2.1 is not announced by this node"
        );
        // A withdrawn address is new again.
        assert_eq!(l.announce(a("192.0.2.1"), "", 1, t0), Ok(Change::New));
    }

    #[test]
    fn ttl_bounds() {
        assert_eq!(ttl(0), Ok(60));
        assert_eq!(ttl(1), Ok(1));
        assert_eq!(ttl(86_400), Ok(86_400));
        assert_eq!(ttl(86_401), Err(LeaseError::TtlRange(86_401)));
        assert_eq!(ttl(u32::MAX), Err(LeaseError::TtlRange(u32::MAX)));
        assert_eq!(
            ttl(86_401).unwrap_err().to_string(),
            "ttl_s: 86401 is out of range 1-86400 (0 means 60)"
        );
        // Through announce: refused and nothing stored; 0 is 60 s.
        let t0 = Instant::now();
        let mut l = Leases::new();
        assert!(l.announce(a("192.0.2.1"), "", 90_000, t0).is_err());
        assert!(l.is_empty());
        l.announce(a("192.0.2.1"), "", 0, t0).unwrap();
        assert_eq!(
            l.get(a("192.0.2.1")).unwrap().expires_at,
            t0 + Duration::from_secs(60)
        );
        l.announce(a("192.0.2.2"), "", 86_400, t0).unwrap();
        assert_eq!(
            l.get(a("192.0.2.2")).unwrap().expires_at,
            t0 + Duration::from_secs(86_400)
        );
    }

    #[test]
    fn a_refused_renewal_keeps_the_old_lease() {
        let t0 = Instant::now();
        let mut l = Leases::new();
        l.announce(a("192.0.2.1"), "a", 10, t0).unwrap();
        assert!(l.announce(a("192.0.2.1"), "b", 0xffff_ffff, t0).is_err());
        let long = "x".repeat(MAX_OWNER_LEN + 1);
        assert_eq!(
            l.announce(a("192.0.2.1"), &long, 10, t0),
            Err(LeaseError::OwnerTooLong(MAX_OWNER_LEN + 1))
        );
        assert_eq!(l.get(a("192.0.2.1")).unwrap().owner, "a");
    }

    #[test]
    fn only_unicast_addresses_are_service_addresses() {
        assert_eq!(address("192.0.2.1"), Ok(a("192.0.2.1")));
        assert_eq!(address(" 2001:db8::5 "), Ok(a("2001:db8::5")));
        for (text, why) in [
            ("0.0.0.0", "unspecified"),
            ("127.0.0.1", "loopback"),
            ("169.254.1.1", "link-local"),
            ("224.0.0.5", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("ff02::1", "multicast"),
            ("::ffff:192.0.2.1", "IPv4-mapped: give the IPv4 address"),
        ] {
            assert_eq!(address(text), Err(LeaseError::NotUnicast(a(text), why)));
        }
        // fec0::/10 is not link-local.
        assert!(address("fec0::1").is_ok());
        let e = address("192.0.2.1/32").unwrap_err();
        assert_eq!(
            e.to_string(),
            "address: \"192.0.2.1/32\" is not an IP address"
        );
        assert!(address("").is_err());
        assert!(
            address("fe80::1")
                .unwrap_err()
                .to_string()
                .starts_with("address: fe80::1 is not a unicast")
        );
    }

    #[test]
    fn only_addresses_inside_the_external_and_load_balancer_ranges_are_allowed() {
        let config = BgpConfiguration {
            service_cluster_ips: vec!["10.96.0.0/12".parse().unwrap()],
            service_external_ips: vec!["198.51.100.0/24".parse().unwrap()],
            service_load_balancer_ips: vec![
                "203.0.113.0/25".parse().unwrap(),
                "2001:db8:5::/64".parse().unwrap(),
                "192.0.2.77/32".parse().unwrap(),
            ],
            ..Default::default()
        };
        for ok in [
            "198.51.100.1",
            "203.0.113.0",
            "203.0.113.127",
            "2001:db8:5::1",
            "192.0.2.77",
        ] {
            assert_eq!(allowed(a(ok), &config), Ok(()), "{ok}");
        }
        // Cluster IPs are announced as a whole range by every node, never one by one.
        for refused in ["10.96.0.10", "203.0.113.128", "2001:db8:6::1", "192.0.2.78"] {
            assert_eq!(
                allowed(a(refused), &config),
                Err(LeaseError::NotAServiceRange(a(refused))),
                "{refused}"
            );
        }
        assert_eq!(
            allowed(a("192.0.2.1"), &BgpConfiguration::default())
                .unwrap_err()
                .to_string(),
            "address: 192.0.2.1 is not inside serviceExternalIPs or serviceLoadBalancerIPs of the BGPConfiguration; add its range there first"
        );
    }
}
