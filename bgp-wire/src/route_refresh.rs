//! ROUTE-REFRESH (RFC 2918) with the enhanced route refresh subtypes (RFC 7313).

use crate::cursor::{Put, Reader};
use crate::error::{DecodeError, EncodeError, ErrorKind};
use crate::header::{self, MessageType};
use crate::types::{Afi, Family, MAX_MESSAGE_LEN, Safi};

/// The message subtype (the octet RFC 2918 called "Reserved").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefreshSubtype {
    /// 0: a plain route refresh request.
    Normal,
    /// 1: beginning of route refresh (BoRR).
    Begin,
    /// 2: end of route refresh (EoRR).
    End,
    /// 3..=255: RFC 7313 says to ignore the message; kept so the session can count it.
    Other(u8),
}

impl RefreshSubtype {
    pub const fn from_u8(v: u8) -> Self {
        match v {
            0 => RefreshSubtype::Normal,
            1 => RefreshSubtype::Begin,
            2 => RefreshSubtype::End,
            n => RefreshSubtype::Other(n),
        }
    }
    pub const fn to_u8(self) -> u8 {
        match self {
            RefreshSubtype::Normal => 0,
            RefreshSubtype::Begin => 1,
            RefreshSubtype::End => 2,
            RefreshSubtype::Other(n) => n,
        }
    }
}

/// A ROUTE-REFRESH message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouteRefresh {
    pub family: Family,
    pub subtype: RefreshSubtype,
}

impl RouteRefresh {
    pub fn new(family: Family, subtype: RefreshSubtype) -> Self {
        RouteRefresh { family, subtype }
    }

    /// Append the whole message (header included).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let start = header::begin(out, MessageType::RouteRefresh);
        out.put_u16(self.family.afi.0);
        out.put_u8(self.subtype.to_u8());
        out.put_u8(self.family.safi.0);
        header::finish(out, start, MAX_MESSAGE_LEN)
    }

    /// Decode a ROUTE-REFRESH body (without the header).
    ///
    /// BoRR and EoRR must be exactly 4 octets (RFC 7313 §5: the NOTIFICATION data is the
    /// whole message, so `header` is passed in to build it). A plain request may carry ORF
    /// entries (RFC 5291), which we do not support and skip.
    pub fn decode(header: &[u8], body: &[u8]) -> Result<RouteRefresh, DecodeError> {
        let mut r = Reader::new(body);
        let (Some(afi), Some(subtype), Some(safi)) = (r.u16(), r.u8(), r.u8()) else {
            return Err(DecodeError::new(
                ErrorKind::BadMessageLength,
                "ROUTE-REFRESH shorter than 23 octets",
            ));
        };
        let subtype = RefreshSubtype::from_u8(subtype);
        if matches!(subtype, RefreshSubtype::Begin | RefreshSubtype::End) && !r.is_empty() {
            let mut data = Vec::with_capacity(header.len().saturating_add(body.len()));
            data.extend_from_slice(header);
            data.extend_from_slice(body);
            return Err(DecodeError {
                kind: ErrorKind::RouteRefreshInvalidLength,
                detail: "BoRR/EoRR longer than 4 octets",
                data,
            });
        }
        Ok(RouteRefresh {
            family: Family::new(Afi(afi), Safi(safi)),
            subtype,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::HEADER_LEN;

    #[test]
    fn round_trip_each_subtype() {
        for st in [
            RefreshSubtype::Normal,
            RefreshSubtype::Begin,
            RefreshSubtype::End,
            RefreshSubtype::Other(9),
        ] {
            let rr = RouteRefresh::new(Family::IPV6_UNICAST, st);
            let mut out = Vec::new();
            rr.encode(&mut out).unwrap();
            assert_eq!(&out[HEADER_LEN..], &[0, 2, st.to_u8(), 1]);
            assert_eq!(
                RouteRefresh::decode(&out[..HEADER_LEN], &out[HEADER_LEN..]).unwrap(),
                rr
            );
        }
    }

    #[test]
    fn eorr_with_extra_bytes_is_error_7_1_with_the_whole_message() {
        let mut out = Vec::new();
        RouteRefresh::new(Family::IPV4_UNICAST, RefreshSubtype::End)
            .encode(&mut out)
            .unwrap();
        out.push(0);
        let e = RouteRefresh::decode(&out[..HEADER_LEN], &out[HEADER_LEN..]).unwrap_err();
        assert_eq!((e.kind.code(), e.kind.subcode()), (7, 1));
        assert_eq!(e.data, out);
        // A plain request with trailing ORF bytes decodes.
        out[HEADER_LEN + 2] = 0;
        assert_eq!(
            RouteRefresh::decode(&out[..HEADER_LEN], &out[HEADER_LEN..])
                .unwrap()
                .subtype,
            RefreshSubtype::Normal
        );
        assert!(
            RouteRefresh::decode(&out[..HEADER_LEN], &out[HEADER_LEN..HEADER_LEN + 3]).is_err()
        );
    }

    #[test]
    fn unknown_subtype_with_trailing_bytes_is_kept_for_the_session_to_ignore() {
        // Fuzzer input (route_refresh target): subtype 4 followed by one more octet.
        let body = [0x00, 0x01, 0x04, 0x01, 0x00];
        let r = RouteRefresh::decode(&[0xFF; HEADER_LEN], &body).unwrap();
        assert_eq!(
            r,
            RouteRefresh::new(Family::IPV4_UNICAST, RefreshSubtype::Other(4))
        );
    }
}
