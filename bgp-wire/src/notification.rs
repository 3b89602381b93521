//! NOTIFICATION (RFC 4271 §4.5), with the shutdown communication of RFC 8203 / RFC 9003,
//! its error codes, and the NOTIFICATION that answers a [`DecodeError`]
//! ([`DecodeError::notification`]).

use crate::cursor::{Put, Reader};
use crate::error::{DecodeError, EncodeError, ErrorKind};
use crate::header::{self, MessageType};

/// Error code 6.
pub const CEASE: u8 = 6;
/// Cease subcodes (RFC 4486, RFC 8538).
pub mod cease {
    pub const MAX_PREFIXES: u8 = 1;
    pub const ADMIN_SHUTDOWN: u8 = 2;
    pub const PEER_DECONFIGURED: u8 = 3;
    pub const ADMIN_RESET: u8 = 4;
    pub const CONNECTION_REJECTED: u8 = 5;
    pub const OTHER_CONFIG_CHANGE: u8 = 6;
    pub const CONNECTION_COLLISION: u8 = 7;
    pub const OUT_OF_RESOURCES: u8 = 8;
    pub const HARD_RESET: u8 = 9;
}
/// Error code 4.
pub const HOLD_TIMER_EXPIRED: u8 = 4;
/// Error code 5 (subcodes in RFC 6608).
pub const FSM_ERROR: u8 = 5;

/// Longest shutdown communication (RFC 9003 raised RFC 8203's 128 to 255 octets).
pub const MAX_SHUTDOWN_COMMUNICATION: usize = 255;

/// A NOTIFICATION message. Codes are kept as numbers so that any code a peer sends survives;
/// [`crate::ErrorKind`] names the ones this crate produces.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Notification {
    pub code: u8,
    pub subcode: u8,
    pub data: Vec<u8>,
}

impl Notification {
    pub fn new(code: u8, subcode: u8, data: Vec<u8>) -> Self {
        Notification {
            code,
            subcode,
            data,
        }
    }

    /// A Cease with a shutdown communication (RFC 9003): `subcode` should be
    /// [`cease::ADMIN_SHUTDOWN`] or [`cease::ADMIN_RESET`]. The text is cut to 255 octets on
    /// a character boundary.
    pub fn shutdown(subcode: u8, text: &str) -> Self {
        let mut end = text.len().min(MAX_SHUTDOWN_COMMUNICATION);
        while !text.is_char_boundary(end) {
            end = end.saturating_sub(1);
        }
        let msg = text.get(..end).unwrap_or("");
        let mut data = Vec::with_capacity(end.saturating_add(1));
        data.push(u8::try_from(msg.len()).unwrap_or(0));
        data.extend_from_slice(msg.as_bytes());
        Notification {
            code: CEASE,
            subcode,
            data,
        }
    }

    /// The shutdown communication, if this is an administrative shutdown or reset carrying
    /// a well-formed one (length octet, then that many octets of UTF-8).
    pub fn shutdown_communication(&self) -> Option<&str> {
        if self.code != CEASE || !matches!(self.subcode, cease::ADMIN_SHUTDOWN | cease::ADMIN_RESET)
        {
            return None;
        }
        let mut r = Reader::new(&self.data);
        let len = r.u8()?;
        let text = r.take(usize::from(len))?;
        std::str::from_utf8(text).ok()
    }

    /// Append the whole message (header included).
    pub fn encode(&self, out: &mut Vec<u8>, max_len: usize) -> Result<(), EncodeError> {
        let start = header::begin(out, MessageType::Notification);
        out.put_u8(self.code);
        out.put_u8(self.subcode);
        out.extend_from_slice(&self.data);
        header::finish(out, start, max_len)
    }

    /// Decode a NOTIFICATION body (without the header). Any code and subcode are accepted:
    /// there is no answering a NOTIFICATION.
    pub fn decode(body: &[u8]) -> Result<Notification, DecodeError> {
        let mut r = Reader::new(body);
        let (Some(code), Some(subcode)) = (r.u8(), r.u8()) else {
            return Err(DecodeError::new(
                ErrorKind::BadMessageLength,
                "NOTIFICATION shorter than 21 octets",
            ));
        };
        Ok(Notification {
            code,
            subcode,
            data: r.take_rest().to_vec(),
        })
    }
}

impl DecodeError {
    /// The NOTIFICATION message that answers this error.
    pub fn notification(&self) -> Notification {
        Notification {
            code: self.kind.code(),
            subcode: self.kind.subcode(),
            data: self.data.clone(),
        }
    }
}

impl std::fmt::Display for Notification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "code {} subcode {}", self.code, self.subcode)?;
        if let Some(text) = self.shutdown_communication() {
            write!(f, " ({text:?})")?;
        } else if !self.data.is_empty() {
            write!(f, " data")?;
            for b in &self.data {
                write!(f, " {b:02x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::HEADER_LEN;
    use crate::types::MAX_MESSAGE_LEN;

    #[test]
    fn round_trip_with_arbitrary_data() {
        let n = Notification::new(3, 11, vec![1, 2, 3, 4, 5]);
        let mut out = Vec::new();
        n.encode(&mut out, MAX_MESSAGE_LEN).unwrap();
        assert_eq!(out.len(), 26);
        assert_eq!(Notification::decode(&out[HEADER_LEN..]).unwrap(), n);
        // No data at all: nothing is appended (zettabgp always wrote two bytes).
        let n = Notification::new(4, 0, vec![]);
        out.clear();
        n.encode(&mut out, MAX_MESSAGE_LEN).unwrap();
        assert_eq!(out.len(), 21);
    }

    #[test]
    fn shutdown_communication() {
        let n = Notification::shutdown(cease::ADMIN_SHUTDOWN, "maintenance until 14:00 ✓");
        assert_eq!(
            n.shutdown_communication(),
            Some("maintenance until 14:00 ✓")
        );
        assert_eq!(
            n.to_string(),
            "code 6 subcode 2 (\"maintenance until 14:00 ✓\")"
        );
        // Cut on a character boundary.
        let long = "é".repeat(200);
        let n = Notification::shutdown(cease::ADMIN_RESET, &long);
        assert_eq!(n.data[0], 254);
        assert_eq!(n.shutdown_communication().unwrap().chars().count(), 127);
        // A length running past the data, or bad UTF-8, is no communication.
        assert_eq!(
            Notification::new(6, 2, vec![5, b'a']).shutdown_communication(),
            None
        );
        assert_eq!(
            Notification::new(6, 2, vec![1, 0xFF]).shutdown_communication(),
            None
        );
        assert_eq!(
            Notification::new(6, 3, vec![1, b'a']).shutdown_communication(),
            None
        );
    }

    #[test]
    fn notification_carries_the_data() {
        let e = DecodeError::with_data(ErrorKind::BadMessageLength, "short", &[0, 18]);
        let n = e.notification();
        assert_eq!(
            (n.code, n.subcode, n.data.as_slice()),
            (1, 2, &[0u8, 18][..])
        );
        assert_eq!(e.to_string(), "bad message length (1/2): short");
    }

    #[test]
    fn too_short() {
        assert_eq!(
            Notification::decode(&[6]).unwrap_err().kind,
            ErrorKind::BadMessageLength
        );
    }
}
