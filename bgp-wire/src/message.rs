//! Whole messages: decode one framed message, encode any message.

use crate::error::{DecodeError, Disposition, EncodeError, ErrorKind};
use crate::header::{self, HEADER_LEN, MessageType};
use crate::notification::Notification;
use crate::open::Open;
use crate::params::SessionParams;
use crate::route_refresh::RouteRefresh;
use crate::update::{Update, UpdateDecode, decode_update};

/// A message to send.
// Messages are transient and moved rarely; boxing the UPDATE would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Open(Open),
    Update(Update),
    Notification(Notification),
    Keepalive,
    RouteRefresh(RouteRefresh),
}

impl Message {
    /// Append the whole message (header included) to `out`; on error `out` is unchanged.
    pub fn encode(&self, session: &SessionParams, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        match self {
            Message::Open(o) => o.encode(out),
            Message::Update(u) => u.encode(session, out),
            Message::Notification(n) => n.encode(out, session.max_message_len()),
            Message::Keepalive => {
                header::encode_keepalive(out);
                Ok(())
            }
            Message::RouteRefresh(r) => r.encode(out),
        }
    }
}

/// A message received.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    Open(Open),
    /// Its disposition is `Ok` or `TreatAsWithdraw`: [`decode_message`] turns a session reset
    /// into an `Err`.
    Update(UpdateDecode),
    Notification(Notification),
    Keepalive,
    RouteRefresh(RouteRefresh),
}

/// Decode exactly one message, as delimited by [`crate::split_message`].
///
/// `Err` means: send `err.notification()` and close the session. That includes UPDATEs whose
/// RFC 7606 disposition is a session reset; lesser UPDATE problems come back inside
/// [`UpdateDecode`].
pub fn decode_message(msg: &[u8], session: &SessionParams) -> Result<Decoded, DecodeError> {
    let h = header::parse_header(msg, session)?;
    if msg.len() != h.length {
        return Err(DecodeError::with_data(
            ErrorKind::BadMessageLength,
            "buffer does not hold exactly one message",
            &u16::try_from(msg.len()).unwrap_or(u16::MAX).to_be_bytes(),
        ));
    }
    let (head, body) = msg.split_at_checked(HEADER_LEN).unwrap_or((msg, &[]));
    Ok(match h.msg_type {
        MessageType::Open => Decoded::Open(Open::decode(body)?),
        MessageType::Update => {
            let d = decode_update(body, session);
            if let Disposition::SessionReset(e) = d.disposition {
                return Err(e);
            }
            Decoded::Update(d)
        }
        MessageType::Notification => Decoded::Notification(Notification::decode(body)?),
        MessageType::Keepalive => Decoded::Keepalive,
        MessageType::RouteRefresh => Decoded::RouteRefresh(RouteRefresh::decode(head, body)?),
    })
}
