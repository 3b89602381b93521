//! Which AS numbers may be a node's, a peer's or a session's local AS: the rule every
//! validation of an AS number applies, stated once.
//!
//! bgp-wire has its own `Asn::TRANS` (the codec needs it on the wire): it may depend on no
//! crate of ours, so it cannot take the constant from here; both are RFC 6793's value.

/// AS_TRANS (RFC 6793): stands in for a 4-octet AS on 2-octet wire fields, so no speaker
/// may have it.
pub const AS_TRANS: u32 = 23456;

/// 0 (RFC 7607) and AS_TRANS are reserved: neither can be a node's, a peer's or a local AS.
pub fn is_reserved(asn: u32) -> bool {
    asn == 0 || asn == AS_TRANS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved() {
        assert_eq!(AS_TRANS, 23456);
        assert!(is_reserved(0) && is_reserved(23456));
        assert!(!is_reserved(1) && !is_reserved(64512) && !is_reserved(4_200_000_000));
    }
}
