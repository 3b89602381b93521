//! Negotiation: what the two OPENs agreed on, as far as the wire format is concerned
//! ([`SessionParams::negotiate`]).
//!
//! The resulting options are defined in `params`, below the codecs that use them; this
//! module sits above OPEN, whose capabilities it reads.

use crate::open::{Capability, Open};
use crate::params::SessionParams;
use crate::types::{Afi, Family};

/// Families an OPEN offers: its multiprotocol capabilities, or IPv4 unicast if it has none
/// (RFC 4760 §8).
fn offered(open: &Open) -> impl Iterator<Item = Family> + '_ {
    let implicit = open
        .families()
        .next()
        .is_none()
        .then_some(Family::IPV4_UNICAST);
    open.families().chain(implicit)
}

impl SessionParams {
    /// Negotiate from the OPEN we sent and the OPEN we received.
    pub fn negotiate(local: &Open, remote: &Open, external: bool) -> Self {
        let both = |code: u8| local.has(code) && remote.has(code);
        let family = |f: Family| offered(local).any(|x| x == f) && offered(remote).any(|x| x == f);
        SessionParams {
            four_octet_as: local.four_octet_as().is_some() && remote.four_octet_as().is_some(),
            extended_message: both(Capability::ExtendedMessage.code()),
            ipv4_unicast: family(Family::IPV4_UNICAST),
            ipv6_unicast: family(Family::IPV6_UNICAST),
            ipv4_ext_next_hop: local.ext_next_hops().any(|t| {
                t.nlri_afi == Afi::IPV4 && t.nlri_safi == 1 && t.next_hop_afi == Afi::IPV6
            }),
            external,
            // Confederations are not negotiated: a caller that is in one sets this for the
            // peers that are members.
            confederation: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::open::ExtNextHop;
    use crate::types::Asn;
    use std::net::Ipv4Addr;

    fn open(caps: Vec<Capability>) -> Open {
        Open::new(Asn(65001), 90, Ipv4Addr::new(1, 1, 1, 1), caps)
    }

    #[test]
    fn negotiation() {
        let local = open(vec![
            Capability::Multiprotocol(Family::IPV4_UNICAST),
            Capability::Multiprotocol(Family::IPV6_UNICAST),
            Capability::FourOctetAs(Asn(65001)),
            Capability::ExtendedMessage,
            Capability::ExtendedNextHop(vec![ExtNextHop {
                nlri_afi: Afi::IPV4,
                nlri_safi: 1,
                next_hop_afi: Afi::IPV6,
            }]),
        ]);
        let remote = open(vec![
            Capability::Multiprotocol(Family::IPV6_UNICAST),
            Capability::FourOctetAs(Asn(65002)),
        ]);
        let s = SessionParams::negotiate(&local, &remote, true);
        assert!(s.four_octet_as && !s.extended_message && s.ipv6_unicast && !s.ipv4_unicast);
        assert!(s.ipv4_ext_next_hop && s.external);
        assert_eq!(s.max_message_len(), 4096);
        // No multiprotocol capability at all: IPv4 unicast is implied.
        let s = SessionParams::negotiate(
            &open(vec![]),
            &open(vec![Capability::ExtendedMessage]),
            false,
        );
        assert!(s.ipv4_unicast && !s.ipv6_unicast && !s.four_octet_as);
        let s = SessionParams::negotiate(&open(vec![]), &local, false);
        assert!(s.ipv4_unicast && !s.ipv6_unicast);
    }
}
