//! The address family: pools, blocks, node addresses, VTEPs, routes and pods each belong to
//! one, and the code that handles them is the same for both, parameterised by it.

use std::net::IpAddr;

use ipnet::IpNet;

/// IPv4 or IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    pub fn of(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn of_net(net: &IpNet) -> Self {
        Self::of(net.addr())
    }

    /// "IPv4" / "IPv6", for messages.
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    /// Bits of an address: the longest prefix, a host route's length.
    pub fn bits(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    /// 0 / 1, for arrays indexed by family (in the order of [`IpFamily::ALL`]).
    pub fn index(self) -> usize {
        match self {
            IpFamily::V4 => 0,
            IpFamily::V6 => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_an_address_and_a_net() {
        assert_eq!(IpFamily::of("10.0.0.1".parse().unwrap()), IpFamily::V4);
        assert_eq!(
            IpFamily::of("::ffff:10.0.0.1".parse().unwrap()),
            IpFamily::V6
        );
        assert_eq!(
            IpFamily::of_net(&"fd00::/48".parse().unwrap()),
            IpFamily::V6
        );
        assert_eq!(
            IpFamily::of_net(&"0.0.0.0/0".parse().unwrap()),
            IpFamily::V4
        );
    }

    #[test]
    fn facts() {
        assert_eq!(IpFamily::ALL.map(IpFamily::name), ["IPv4", "IPv6"]);
        assert_eq!(IpFamily::ALL.map(IpFamily::bits), [32, 128]);
        assert_eq!(IpFamily::ALL.map(IpFamily::index), [0, 1]);
    }
}
