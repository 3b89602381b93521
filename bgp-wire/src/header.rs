//! Framing: the 19-octet header (marker, length, type) and splitting a byte stream into
//! messages.

use crate::cursor::Put;
use crate::error::{DecodeError, EncodeError, ErrorKind};
use crate::params::SessionParams;
use crate::types::MAX_MESSAGE_LEN;

/// Octets in the fixed header.
pub const HEADER_LEN: usize = 19;

const MARKER: [u8; 16] = [0xFF; 16];

/// Message type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageType {
    Open = 1,
    Update = 2,
    Notification = 3,
    Keepalive = 4,
    RouteRefresh = 5,
}

impl MessageType {
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(MessageType::Open),
            2 => Some(MessageType::Update),
            3 => Some(MessageType::Notification),
            4 => Some(MessageType::Keepalive),
            5 => Some(MessageType::RouteRefresh),
            _ => None,
        }
    }

    /// The smallest valid message of this type, header included (RFC 4271 §6.1).
    pub const fn min_len(self) -> usize {
        match self {
            MessageType::Open => 29,
            MessageType::Update => 23,
            MessageType::Notification => 21,
            MessageType::Keepalive => 19,
            MessageType::RouteRefresh => 23,
        }
    }
}

/// A checked header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Whole message length, header included.
    pub length: usize,
    pub msg_type: MessageType,
}

fn bad_length(length: u16) -> DecodeError {
    DecodeError::with_data(
        ErrorKind::BadMessageLength,
        "message length out of range",
        &length.to_be_bytes(),
    )
}

/// Check the header at the front of `buf` (which must hold at least 19 octets).
///
/// OPEN and KEEPALIVE never exceed 4096 octets even after extended messages were negotiated
/// (RFC 8654 §4); other types may use up to `session.max_message_len()`.
pub fn parse_header(buf: &[u8], session: &SessionParams) -> Result<Header, DecodeError> {
    let (hdr, _) = buf.split_first_chunk::<HEADER_LEN>().ok_or_else(|| {
        DecodeError::new(
            ErrorKind::BadMessageLength,
            "message shorter than its header",
        )
    })?;
    let (marker, rest) = hdr
        .split_first_chunk::<16>()
        .unwrap_or((&MARKER, &[0, 0, 0]));
    if *marker != MARKER {
        return Err(DecodeError::new(
            ErrorKind::ConnectionNotSynchronized,
            "marker is not all ones",
        ));
    }
    let [l0, l1, ty] = *rest else {
        return Err(DecodeError::new(
            ErrorKind::BadMessageLength,
            "message shorter than its header",
        ));
    };
    let length = u16::from_be_bytes([l0, l1]);
    let Some(msg_type) = MessageType::from_u8(ty) else {
        return Err(DecodeError::with_data(
            ErrorKind::BadMessageType,
            "unknown message type",
            &[ty],
        ));
    };
    let len = usize::from(length);
    let max = match msg_type {
        MessageType::Open | MessageType::Keepalive => MAX_MESSAGE_LEN,
        _ => session.max_message_len(),
    };
    if len < msg_type.min_len()
        || len > max
        || (msg_type == MessageType::Keepalive && len != HEADER_LEN)
    {
        return Err(bad_length(length));
    }
    Ok(Header {
        length: len,
        msg_type,
    })
}

/// Result of trying to split one message off the front of a receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    /// Not a whole message yet; at least this many more octets are needed.
    Incomplete(usize),
    /// A whole, header-checked message occupies the first `len` octets.
    Message(usize),
    /// The stream is broken: send this NOTIFICATION and close.
    Error(DecodeError),
}

/// Split one message off the front of `buf`: the session task's framing step.
///
/// The marker is checked on whatever prefix of it has arrived, so a desynchronised stream is
/// rejected without waiting for more bytes.
pub fn split_message(buf: &[u8], session: &SessionParams) -> Split {
    let seen = buf.get(..16).unwrap_or(buf);
    if seen.iter().any(|&b| b != 0xFF) {
        return Split::Error(DecodeError::new(
            ErrorKind::ConnectionNotSynchronized,
            "marker is not all ones",
        ));
    }
    if buf.len() < HEADER_LEN {
        return Split::Incomplete(HEADER_LEN.saturating_sub(buf.len()));
    }
    match parse_header(buf, session) {
        Err(e) => Split::Error(e),
        Ok(h) if buf.len() >= h.length => Split::Message(h.length),
        Ok(h) => Split::Incomplete(h.length.saturating_sub(buf.len())),
    }
}

/// Start a message: write the header with a placeholder length and return where it starts.
pub(crate) fn begin(out: &mut Vec<u8>, ty: MessageType) -> usize {
    let start = out.len();
    out.extend_from_slice(&MARKER);
    out.put_u16(0);
    out.put_u8(ty as u8);
    start
}

/// Finish a message begun at `start`: check its size and patch the length. On error the
/// buffer is truncated back to `start`.
pub(crate) fn finish(out: &mut Vec<u8>, start: usize, max: usize) -> Result<(), EncodeError> {
    let len = out.len().saturating_sub(start);
    match u16::try_from(len) {
        Ok(l) if len <= max => {
            out.patch_u16(start.saturating_add(16), l);
            Ok(())
        }
        _ => {
            out.truncate(start);
            Err(EncodeError::TooLarge {
                what: "message",
                size: len,
                max,
            })
        }
    }
}

/// Append a KEEPALIVE.
pub fn encode_keepalive(out: &mut Vec<u8>) {
    out.extend_from_slice(&MARKER);
    out.put_u16(HEADER_LEN as u16);
    out.put_u8(MessageType::Keepalive as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(len: u16, ty: u8) -> Vec<u8> {
        let mut v = vec![0xFF; 16];
        v.extend_from_slice(&len.to_be_bytes());
        v.push(ty);
        v
    }

    fn s() -> SessionParams {
        SessionParams::default()
    }

    #[test]
    fn keepalive_frames() {
        let mut out = Vec::new();
        encode_keepalive(&mut out);
        assert_eq!(out, hdr(19, 4));
        assert_eq!(split_message(&out, &s()), Split::Message(19));
    }

    #[test]
    fn incomplete_until_whole() {
        let mut m = hdr(23, 2);
        m.extend_from_slice(&[0, 0, 0, 0]);
        for cut in 0..m.len() {
            let Split::Incomplete(n) = split_message(&m[..cut], &s()) else {
                panic!("cut {cut}")
            };
            assert!(n > 0 && n <= m.len() - cut);
        }
        m.extend_from_slice(&[0xFF; 5]); // the next message's start
        assert_eq!(split_message(&m, &s()), Split::Message(23));
    }

    #[test]
    fn bad_marker_is_caught_early() {
        let Split::Error(e) = split_message(&[0xFF, 0xFF, 0x00], &s()) else {
            panic!()
        };
        assert_eq!(e.kind, ErrorKind::ConnectionNotSynchronized);
        assert_eq!((e.kind.code(), e.kind.subcode()), (1, 1));
    }

    #[test]
    fn header_length_below_19_is_bad_message_length() {
        for len in [0u16, 1, 18] {
            let Split::Error(e) = split_message(&hdr(len, 4), &s()) else {
                panic!()
            };
            assert_eq!(e.kind, ErrorKind::BadMessageLength);
            assert_eq!(e.data, len.to_be_bytes());
        }
    }

    #[test]
    fn per_type_minimum_and_maximum() {
        // UPDATE of 22, OPEN of 28, NOTIFICATION of 20, ROUTE-REFRESH of 22, KEEPALIVE of 20.
        for (len, ty) in [(22u16, 2u8), (28, 1), (20, 3), (22, 5), (20, 4)] {
            let e = parse_header(&hdr(len, ty), &s()).unwrap_err();
            assert_eq!(
                e.kind,
                ErrorKind::BadMessageLength,
                "type {ty} length {len}"
            );
        }
        // 4097 needs extended messages, and OPEN never gets them.
        assert_eq!(
            parse_header(&hdr(4097, 2), &s()).unwrap_err().kind,
            ErrorKind::BadMessageLength
        );
        let ext = SessionParams {
            extended_message: true,
            ..s()
        };
        assert_eq!(parse_header(&hdr(4097, 2), &ext).unwrap().length, 4097);
        assert_eq!(parse_header(&hdr(65535, 3), &ext).unwrap().length, 65535);
        assert!(parse_header(&hdr(4097, 1), &ext).is_err());
    }

    #[test]
    fn unknown_type_is_bad_message_type() {
        for ty in [0u8, 6, 255] {
            let e = parse_header(&hdr(19, ty), &s()).unwrap_err();
            assert_eq!(e.kind, ErrorKind::BadMessageType);
            assert_eq!(e.data, [ty]);
        }
    }

    #[test]
    fn finish_rejects_oversize_and_restores_buffer() {
        let mut out = vec![7u8];
        let start = begin(&mut out, MessageType::Update);
        out.resize(start + 4097, 0);
        assert!(finish(&mut out, start, MAX_MESSAGE_LEN).is_err());
        assert_eq!(out, [7]);
    }
}
