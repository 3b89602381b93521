//! Errors: every decode error names the NOTIFICATION (code, subcode, data) that RFC 4271 §6
//! (and RFC 4760, 5492, 7313) assigns to it, so the session can answer a peer straight from
//! the error. UPDATE errors are further classified by RFC 7606 (see [`Disposition`]).
//!
//! Above `types` only: the NOTIFICATION message itself, and [`DecodeError::notification`]
//! which builds it, are in the `notification` module, which builds on this one.

use std::fmt;

/// What went wrong, as far as the NOTIFICATION is concerned: one variant per (code, subcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ErrorKind {
    // 1: Message Header Error
    ConnectionNotSynchronized,
    BadMessageLength,
    BadMessageType,
    // 2: OPEN Message Error
    /// Subcode 0 ("unspecific"): a malformed OPEN or capability that no specific subcode covers.
    MalformedOpen,
    UnsupportedVersion,
    BadPeerAs,
    BadBgpIdentifier,
    UnsupportedOptionalParameter,
    UnacceptableHoldTime,
    /// RFC 5492: a capability the local speaker requires is missing; data = the capability.
    UnsupportedCapability,
    // 3: UPDATE Message Error
    MalformedAttributeList,
    UnrecognizedWellKnownAttribute,
    MissingWellKnownAttribute,
    AttributeFlags,
    AttributeLength,
    InvalidOrigin,
    InvalidNextHop,
    OptionalAttribute,
    InvalidNetworkField,
    MalformedAsPath,
    // 7: ROUTE-REFRESH Message Error (RFC 7313)
    RouteRefreshInvalidLength,
}

impl ErrorKind {
    /// NOTIFICATION error code.
    pub const fn code(self) -> u8 {
        use ErrorKind::*;
        match self {
            ConnectionNotSynchronized | BadMessageLength | BadMessageType => 1,
            MalformedOpen
            | UnsupportedVersion
            | BadPeerAs
            | BadBgpIdentifier
            | UnsupportedOptionalParameter
            | UnacceptableHoldTime
            | UnsupportedCapability => 2,
            MalformedAttributeList
            | UnrecognizedWellKnownAttribute
            | MissingWellKnownAttribute
            | AttributeFlags
            | AttributeLength
            | InvalidOrigin
            | InvalidNextHop
            | OptionalAttribute
            | InvalidNetworkField
            | MalformedAsPath => 3,
            RouteRefreshInvalidLength => 7,
        }
    }

    /// NOTIFICATION error subcode.
    pub const fn subcode(self) -> u8 {
        use ErrorKind::*;
        match self {
            ConnectionNotSynchronized => 1,
            BadMessageLength => 2,
            BadMessageType => 3,
            MalformedOpen => 0,
            UnsupportedVersion => 1,
            BadPeerAs => 2,
            BadBgpIdentifier => 3,
            UnsupportedOptionalParameter => 4,
            UnacceptableHoldTime => 6,
            UnsupportedCapability => 7,
            MalformedAttributeList => 1,
            UnrecognizedWellKnownAttribute => 2,
            MissingWellKnownAttribute => 3,
            AttributeFlags => 4,
            AttributeLength => 5,
            InvalidOrigin => 6,
            InvalidNextHop => 8,
            OptionalAttribute => 9,
            InvalidNetworkField => 10,
            MalformedAsPath => 11,
            RouteRefreshInvalidLength => 1,
        }
    }

    const fn name(self) -> &'static str {
        use ErrorKind::*;
        match self {
            ConnectionNotSynchronized => "connection not synchronised",
            BadMessageLength => "bad message length",
            BadMessageType => "bad message type",
            MalformedOpen => "malformed OPEN",
            UnsupportedVersion => "unsupported version number",
            BadPeerAs => "bad peer AS",
            BadBgpIdentifier => "bad BGP identifier",
            UnsupportedOptionalParameter => "unsupported optional parameter",
            UnacceptableHoldTime => "unacceptable hold time",
            UnsupportedCapability => "unsupported capability",
            MalformedAttributeList => "malformed attribute list",
            UnrecognizedWellKnownAttribute => "unrecognised well-known attribute",
            MissingWellKnownAttribute => "missing well-known attribute",
            AttributeFlags => "attribute flags error",
            AttributeLength => "attribute length error",
            InvalidOrigin => "invalid ORIGIN attribute",
            InvalidNextHop => "invalid NEXT_HOP attribute",
            OptionalAttribute => "optional attribute error",
            InvalidNetworkField => "invalid network field",
            MalformedAsPath => "malformed AS_PATH",
            RouteRefreshInvalidLength => "invalid ROUTE-REFRESH message length",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}/{})", self.name(), self.code(), self.subcode())
    }
}

/// A decode error: the NOTIFICATION to send (kind + data) and a short human reason.
///
/// `data` is what RFC 4271 §6 puts in the NOTIFICATION's data field: the bad length, the bad
/// type, the erroneous attribute (flags, type, length and value), the missing type code...
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{kind}: {detail}")]
pub struct DecodeError {
    pub kind: ErrorKind,
    /// Why, in a few words (for logs and counters; not sent on the wire).
    pub detail: &'static str,
    /// The NOTIFICATION data field.
    pub data: Vec<u8>,
}

impl DecodeError {
    pub fn new(kind: ErrorKind, detail: &'static str) -> Self {
        DecodeError {
            kind,
            detail,
            data: Vec::new(),
        }
    }

    pub fn with_data(kind: ErrorKind, detail: &'static str, data: &[u8]) -> Self {
        DecodeError {
            kind,
            detail,
            data: data.to_vec(),
        }
    }
}

/// Why encoding failed. Encoders never write a partial message: on error the caller's buffer
/// is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    #[error("{what} is {size} bytes, more than the {max} allowed")]
    TooLarge {
        what: &'static str,
        size: usize,
        max: usize,
    },
    #[error("{0}")]
    Invalid(&'static str),
}

/// What RFC 7606 says to do with an UPDATE, strongest last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Use the UPDATE as decoded (possibly minus the attributes in `discarded`).
    Ok,
    /// Treat every route the UPDATE announces as withdrawn (RFC 7606 §2), for these reasons.
    TreatAsWithdraw(Vec<AttrProblem>),
    /// Send this NOTIFICATION and reset the session.
    SessionReset(DecodeError),
}

impl Disposition {
    pub fn is_ok(&self) -> bool {
        matches!(self, Disposition::Ok)
    }
}

/// One attribute-level problem found while decoding an UPDATE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttrProblem {
    /// The attribute's type code (0 when the problem is not tied to one attribute).
    pub type_code: u8,
    pub kind: ProblemKind,
}

/// Why an attribute was discarded or caused a treat-as-withdraw.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// Malformed; the error says how (and what NOTIFICATION RFC 4271 would have sent).
    Malformed(DecodeError),
    /// A second (third...) copy of an attribute: all but the first are discarded (RFC 7606 §3g).
    Duplicate,
    /// An unrecognised optional non-transitive attribute: quietly ignored per RFC 4271 §5,
    /// reported so nothing is dropped silently.
    UnrecognizedNonTransitive,
    /// LOCAL_PREF, ORIGINATOR_ID or CLUSTER_LIST from an external peer (RFC 4271 §5.1.5,
    /// RFC 7606 §7.5, §7.9, §7.10).
    NotAllowedFromExternal,
    /// AS4_PATH / AS4_AGGREGATOR on a session where both sides speak 4-octet AS (RFC 6793 §4.1).
    As4FromNewSpeaker,
    /// AS4_PATH / AS4_AGGREGATOR ignored because AGGREGATOR is not AS_TRANS (RFC 6793 §4.2.3).
    As4Ignored,
    /// MP_REACH_NLRI / MP_UNREACH_NLRI for an address family not negotiated on this session.
    UnnegotiatedFamily(crate::types::Family),
}

impl fmt::Display for AttrProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attribute {}: ", self.type_code)?;
        match &self.kind {
            ProblemKind::Malformed(e) => write!(f, "{e}"),
            ProblemKind::Duplicate => f.write_str("duplicate, discarded"),
            ProblemKind::UnrecognizedNonTransitive => {
                f.write_str("unrecognised optional non-transitive, discarded")
            }
            ProblemKind::NotAllowedFromExternal => {
                f.write_str("not allowed from an external peer, discarded")
            }
            ProblemKind::As4FromNewSpeaker => {
                f.write_str("AS4 attribute from a 4-octet AS speaker, discarded")
            }
            ProblemKind::As4Ignored => {
                f.write_str("AS4 attribute ignored: AGGREGATOR is not AS_TRANS")
            }
            ProblemKind::UnnegotiatedFamily(fam) => {
                write!(f, "address family {fam} not negotiated, discarded")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_subcodes_match_rfc_4271() {
        let cases = [
            (ErrorKind::ConnectionNotSynchronized, 1, 1),
            (ErrorKind::BadMessageLength, 1, 2),
            (ErrorKind::BadMessageType, 1, 3),
            (ErrorKind::MalformedOpen, 2, 0),
            (ErrorKind::UnsupportedVersion, 2, 1),
            (ErrorKind::BadPeerAs, 2, 2),
            (ErrorKind::BadBgpIdentifier, 2, 3),
            (ErrorKind::UnsupportedOptionalParameter, 2, 4),
            (ErrorKind::UnacceptableHoldTime, 2, 6),
            (ErrorKind::UnsupportedCapability, 2, 7),
            (ErrorKind::MalformedAttributeList, 3, 1),
            (ErrorKind::UnrecognizedWellKnownAttribute, 3, 2),
            (ErrorKind::MissingWellKnownAttribute, 3, 3),
            (ErrorKind::AttributeFlags, 3, 4),
            (ErrorKind::AttributeLength, 3, 5),
            (ErrorKind::InvalidOrigin, 3, 6),
            (ErrorKind::InvalidNextHop, 3, 8),
            (ErrorKind::OptionalAttribute, 3, 9),
            (ErrorKind::InvalidNetworkField, 3, 10),
            (ErrorKind::MalformedAsPath, 3, 11),
            (ErrorKind::RouteRefreshInvalidLength, 7, 1),
        ];
        for (kind, code, subcode) in cases {
            assert_eq!((kind.code(), kind.subcode()), (code, subcode), "{kind:?}");
        }
    }
}
