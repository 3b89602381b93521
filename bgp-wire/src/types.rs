//! Identities and small values: AS numbers, address families, communities, and the message
//! size limits that framing, the session parameters and the encoders share.
//!
//! The bottom layer with `cursor`: it depends on no other module of the crate.

use std::fmt;
use std::str::FromStr;

/// Largest message without the extended-message capability (RFC 4271).
pub const MAX_MESSAGE_LEN: usize = 4096;
/// Largest message once extended messages are negotiated (RFC 8654).
pub const MAX_EXTENDED_MESSAGE_LEN: usize = 65535;

/// An AS number. Always held as 4 octets; whether it goes on the wire as 2 or 4 depends on
/// the session (RFC 6793).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Asn(pub u32);

impl Asn {
    /// AS_TRANS (RFC 6793): stands in for a 4-octet AS on 2-octet wire fields.
    ///
    /// The same number as `net_types::asn::AS_TRANS`, where the rule "0 and AS_TRANS are no
    /// speaker's AS" lives for the datastore's validations; stated again here because the
    /// codec may depend on no crate of ours.
    pub const TRANS: Asn = Asn(23456);

    /// True when the AS fits a 2-octet field.
    pub const fn is_16bit(self) -> bool {
        self.0 <= 0xFFFF
    }

    /// The 2-octet form: the AS itself when it fits, AS_TRANS otherwise.
    pub const fn to_16bit(self) -> u16 {
        if self.0 <= 0xFFFF {
            self.0 as u16
        } else {
            Asn::TRANS.0 as u16
        }
    }
}

impl fmt::Display for Asn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<u32> for Asn {
    fn from(v: u32) -> Self {
        Asn(v)
    }
}

/// Address Family Identifier (IANA "Address Family Numbers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Afi(pub u16);

impl Afi {
    pub const IPV4: Afi = Afi(1);
    pub const IPV6: Afi = Afi(2);
}

/// Subsequent Address Family Identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Safi(pub u8);

impl Safi {
    pub const UNICAST: Safi = Safi(1);
    pub const MULTICAST: Safi = Safi(2);
}

/// An (AFI, SAFI) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Family {
    pub afi: Afi,
    pub safi: Safi,
}

impl Family {
    pub const IPV4_UNICAST: Family = Family {
        afi: Afi::IPV4,
        safi: Safi::UNICAST,
    };
    pub const IPV6_UNICAST: Family = Family {
        afi: Afi::IPV6,
        safi: Safi::UNICAST,
    };

    pub const fn new(afi: Afi, safi: Safi) -> Self {
        Family { afi, safi }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Family::IPV4_UNICAST => f.write_str("ipv4-unicast"),
            Family::IPV6_UNICAST => f.write_str("ipv6-unicast"),
            Family { afi, safi } => write!(f, "afi {}/safi {}", afi.0, safi.0),
        }
    }
}

/// ORIGIN attribute value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    Igp = 0,
    Egp = 1,
    Incomplete = 2,
}

impl Origin {
    pub const fn from_u8(v: u8) -> Option<Origin> {
        match v {
            0 => Some(Origin::Igp),
            1 => Some(Origin::Egp),
            2 => Some(Origin::Incomplete),
            _ => None,
        }
    }
}

/// A standard community (RFC 1997), `asn:value` in its two halves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Community(pub u32);

impl Community {
    pub const NO_EXPORT: Community = Community(0xFFFF_FF01);
    pub const NO_ADVERTISE: Community = Community(0xFFFF_FF02);
    pub const NO_EXPORT_SUBCONFED: Community = Community(0xFFFF_FF03);
    pub const NO_PEER: Community = Community(0xFFFF_FF04);
    /// RFC 8326 graceful shutdown.
    pub const GRACEFUL_SHUTDOWN: Community = Community(0xFFFF_0000);

    pub const fn new(high: u16, low: u16) -> Self {
        Community(((high as u32) << 16) | low as u32)
    }
    pub const fn high(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub const fn low(self) -> u16 {
        (self.0 & 0xFFFF) as u16
    }
}

impl fmt::Display for Community {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.high(), self.low())
    }
}

/// "Could not parse" for the small `FromStr` impls of this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {0:?}")]
pub struct ParseError(pub String);

impl FromStr for Community {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError(s.to_owned());
        let (h, l) = s.split_once(':').ok_or_else(bad)?;
        Ok(Community::new(
            h.parse().map_err(|_| bad())?,
            l.parse().map_err(|_| bad())?,
        ))
    }
}

/// A large community (RFC 8092).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LargeCommunity {
    pub global_admin: u32,
    pub local1: u32,
    pub local2: u32,
}

impl fmt::Display for LargeCommunity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.global_admin, self.local1, self.local2)
    }
}

impl FromStr for LargeCommunity {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError(s.to_owned());
        let mut it = s.split(':').map(|p| p.parse::<u32>().map_err(|_| bad()));
        let lc = LargeCommunity {
            global_admin: it.next().ok_or_else(bad)??,
            local1: it.next().ok_or_else(bad)??,
            local2: it.next().ok_or_else(bad)??,
        };
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(lc)
    }
}

/// An extended community (RFC 4360), kept as its 8 raw octets: type, subtype and value are
/// interpreted by whoever needs them (route targets, encapsulation...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtCommunity(pub [u8; 8]);

impl ExtCommunity {
    /// The type octet (high-order octet of the type field).
    pub const fn type_high(self) -> u8 {
        self.0[0]
    }
    /// The sub-type octet (for the types that have one).
    pub const fn subtype(self) -> u8 {
        self.0[1]
    }
    /// A two-octet-AS specific route target (type 0x00, subtype 0x02).
    pub const fn route_target(asn: u16, value: u32) -> Self {
        let a = asn.to_be_bytes();
        let v = value.to_be_bytes();
        ExtCommunity([0x00, 0x02, a[0], a[1], v[0], v[1], v[2], v[3]])
    }
}

impl fmt::Display for ExtCommunity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asn_16bit_form() {
        assert_eq!(Asn(65000).to_16bit(), 65000);
        assert_eq!(Asn(65536).to_16bit(), 23456);
        assert!(Asn(65535).is_16bit());
        assert!(!Asn(65536).is_16bit());
        // Unlike zettabgp's AS type, 65536 is not AS 1.
        assert_ne!(Asn(65536), Asn(1));
    }

    #[test]
    fn community_text() {
        let c: Community = "65000:100".parse().unwrap();
        assert_eq!(c, Community::new(65000, 100));
        assert_eq!(c.to_string(), "65000:100");
        assert!("65536:1".parse::<Community>().is_err());
        let l: LargeCommunity = "4200000000:1:2".parse().unwrap();
        assert_eq!(l.to_string(), "4200000000:1:2");
        assert!("1:2".parse::<LargeCommunity>().is_err());
        assert!("1:2:3:4".parse::<LargeCommunity>().is_err());
    }

    #[test]
    fn family_display() {
        assert_eq!(Family::IPV6_UNICAST.to_string(), "ipv6-unicast");
        assert_eq!(Family::new(Afi(25), Safi(65)).to_string(), "afi 25/safi 65");
    }
}
