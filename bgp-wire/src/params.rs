//! The session options the wire format depends on ([`SessionParams`]): what the two OPENs
//! negotiated, and the message size that follows from it.
//!
//! Only the options live here, below framing and every codec that reads them; working them
//! out from the OPENs ([`SessionParams::negotiate`]) is the `session` module's job, above
//! OPEN.

use crate::types::{MAX_EXTENDED_MESSAGE_LEN, MAX_MESSAGE_LEN};

/// The negotiated state decoding and encoding depend on.
///
/// `Default` is the state before (or without) any capability: 2-octet AS numbers, 4096-octet
/// messages, IPv4 unicast only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionParams {
    /// Both sides sent the 4-octet AS capability (RFC 6793).
    pub four_octet_as: bool,
    /// Both sides sent the extended message capability (RFC 8654): UPDATEs and NOTIFICATIONs
    /// up to 65535 octets.
    pub extended_message: bool,
    /// IPv4 unicast routes are accepted in MP_REACH_NLRI / MP_UNREACH_NLRI. (The classic
    /// NLRI fields are always IPv4 unicast and always accepted.)
    pub ipv4_unicast: bool,
    /// IPv6 unicast was negotiated.
    pub ipv6_unicast: bool,
    /// We announced that we accept IPv4 routes with an IPv6 next hop (RFC 8950).
    pub ipv4_ext_next_hop: bool,
    /// The peer is external (eBGP outside our confederation): LOCAL_PREF, ORIGINATOR_ID and
    /// CLUSTER_LIST from it are discarded.
    pub external: bool,
    /// We and the peer are members of one confederation (RFC 5065): only then may its
    /// AS_PATH carry confederation segments; from any other peer they make the AS_PATH
    /// malformed (treat-as-withdraw, RFC 7606 §7.2). A speaker in no confederation (bgpd)
    /// leaves this off for every peer, iBGP ones included.
    pub confederation: bool,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            four_octet_as: false,
            extended_message: false,
            ipv4_unicast: true,
            ipv6_unicast: false,
            ipv4_ext_next_hop: false,
            external: false,
            confederation: false,
        }
    }
}

impl SessionParams {
    /// The largest message the session may send or receive.
    pub fn max_message_len(&self) -> usize {
        if self.extended_message {
            MAX_EXTENDED_MESSAGE_LEN
        } else {
            MAX_MESSAGE_LEN
        }
    }
}
