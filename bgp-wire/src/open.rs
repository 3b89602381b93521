//! OPEN (RFC 4271 §4.2) with capabilities (RFC 5492) and extended optional parameters
//! (RFC 9072).
//!
//! Why this file is long: one message and its capabilities, each with its decoder, encoder and the
//! checks RFC 5492/9072 ask for; the tests of each capability sit with it.
//!
//! Decoding checks what a message alone can tell (version, AS 0, hold time 1 or 2, BGP
//! identifier 0, parameter framing). Checks that need the local configuration (the expected
//! peer AS, our own identifier, required capabilities) belong to the session, which builds
//! its NOTIFICATION with [`DecodeError::new`] and the matching [`ErrorKind`].

use std::net::Ipv4Addr;

use crate::cursor::{Put, Reader};
use crate::error::{DecodeError, EncodeError, ErrorKind};
use crate::header::{self, MessageType};
use crate::types::{Afi, Asn, Family, MAX_MESSAGE_LEN, Safi};

/// The BGP version we speak.
pub const BGP_VERSION: u8 = 4;

/// Optional parameter type for capabilities (RFC 5492).
const PARAM_CAPABILITIES: u8 = 2;
/// RFC 9072 marker: non-extended length 255 followed by type 255.
const PARAM_EXTENDED: u8 = 255;

/// An OPEN message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Open {
    /// The "My Autonomous System" field: the AS itself, or AS_TRANS when it needs 4 octets
    /// (then [`Capability::FourOctetAs`] carries the real one). See [`Open::asn`].
    pub my_as: u16,
    /// Proposed hold time in seconds (0, or 3 and up).
    pub hold_time: u16,
    pub bgp_id: Ipv4Addr,
    /// Capabilities in the order they were sent.
    pub capabilities: Vec<Capability>,
}

/// One capability (RFC 5492 registry). Known ones are decoded; any other is kept raw.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Capability {
    /// 1: multiprotocol extensions (RFC 4760).
    Multiprotocol(Family),
    /// 2: route refresh (RFC 2918).
    RouteRefresh,
    /// 5: extended next hop encoding (RFC 8950).
    ExtendedNextHop(Vec<ExtNextHop>),
    /// 6: extended messages (RFC 8654).
    ExtendedMessage,
    /// 64: graceful restart (RFC 4724, N bit from RFC 8538).
    GracefulRestart(GracefulRestart),
    /// 65: 4-octet AS numbers (RFC 6793).
    FourOctetAs(Asn),
    /// 70: enhanced route refresh (RFC 7313).
    EnhancedRouteRefresh,
    /// Anything else, kept as sent.
    Unknown { code: u8, value: Vec<u8> },
}

/// One (NLRI AFI, NLRI SAFI, next hop AFI) tuple of the extended next hop capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExtNextHop {
    pub nlri_afi: Afi,
    /// Two octets on the wire (RFC 8950 §4), unlike a SAFI elsewhere.
    pub nlri_safi: u16,
    pub next_hop_afi: Afi,
}

/// The graceful restart capability.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GracefulRestart {
    /// R bit: the sender has restarted.
    pub restarting: bool,
    /// N bit (RFC 8538): graceful restart also covers NOTIFICATIONs.
    pub notification: bool,
    /// Restart time in seconds, 12 bits (0..=4095).
    pub restart_time: u16,
    pub families: Vec<GrFamily>,
}

/// A family covered by graceful restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrFamily {
    pub family: Family,
    /// F bit: forwarding state was preserved across the restart.
    pub forwarding_preserved: bool,
}

impl Capability {
    pub fn code(&self) -> u8 {
        match self {
            Capability::Multiprotocol(_) => 1,
            Capability::RouteRefresh => 2,
            Capability::ExtendedNextHop(_) => 5,
            Capability::ExtendedMessage => 6,
            Capability::GracefulRestart(_) => 64,
            Capability::FourOctetAs(_) => 65,
            Capability::EnhancedRouteRefresh => 70,
            Capability::Unknown { code, .. } => *code,
        }
    }

    fn value_len(&self) -> usize {
        match self {
            Capability::Multiprotocol(_) => 4,
            Capability::RouteRefresh
            | Capability::ExtendedMessage
            | Capability::EnhancedRouteRefresh => 0,
            Capability::ExtendedNextHop(v) => v.len().saturating_mul(6),
            Capability::GracefulRestart(gr) => {
                gr.families.len().saturating_mul(4).saturating_add(2)
            }
            Capability::FourOctetAs(_) => 4,
            Capability::Unknown { value, .. } => value.len(),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let len = self.value_len();
        let len = u8::try_from(len).map_err(|_| EncodeError::TooLarge {
            what: "capability",
            size: len,
            max: 255,
        })?;
        out.put_u8(self.code());
        out.put_u8(len);
        match self {
            Capability::Multiprotocol(f) => {
                out.put_u16(f.afi.0);
                out.put_u8(0);
                out.put_u8(f.safi.0);
            }
            Capability::RouteRefresh
            | Capability::ExtendedMessage
            | Capability::EnhancedRouteRefresh => {}
            Capability::ExtendedNextHop(v) => {
                for t in v {
                    out.put_u16(t.nlri_afi.0);
                    out.put_u16(t.nlri_safi);
                    out.put_u16(t.next_hop_afi.0);
                }
            }
            Capability::GracefulRestart(gr) => {
                if gr.restart_time > 0x0FFF {
                    return Err(EncodeError::Invalid(
                        "graceful restart time exceeds 4095 seconds",
                    ));
                }
                let mut word = gr.restart_time;
                if gr.restarting {
                    word |= 0x8000;
                }
                if gr.notification {
                    word |= 0x4000;
                }
                out.put_u16(word);
                for f in &gr.families {
                    out.put_u16(f.family.afi.0);
                    out.put_u8(f.family.safi.0);
                    out.put_u8(if f.forwarding_preserved { 0x80 } else { 0 });
                }
            }
            Capability::FourOctetAs(asn) => out.put_u32(asn.0),
            Capability::Unknown { value, .. } => out.extend_from_slice(value),
        }
        Ok(())
    }

    fn decode(code: u8, value: &[u8]) -> Result<Capability, DecodeError> {
        let malformed = |detail| DecodeError::new(ErrorKind::MalformedOpen, detail);
        let mut r = Reader::new(value);
        let cap = match code {
            1 => {
                let (Some(afi), Some(_reserved), Some(safi), true) =
                    (r.u16(), r.u8(), r.u8(), value.len() == 4)
                else {
                    return Err(malformed("multiprotocol capability length is not 4"));
                };
                Capability::Multiprotocol(Family::new(Afi(afi), Safi(safi)))
            }
            2 | 6 | 70 if !value.is_empty() => return Err(malformed("capability should be empty")),
            2 => Capability::RouteRefresh,
            6 => Capability::ExtendedMessage,
            70 => Capability::EnhancedRouteRefresh,
            5 => {
                if !value.len().is_multiple_of(6) {
                    return Err(malformed(
                        "extended next hop capability length is not a multiple of 6",
                    ));
                }
                let mut tuples = Vec::with_capacity(value.len() / 6);
                while let (Some(a), Some(s), Some(n)) = (r.u16(), r.u16(), r.u16()) {
                    tuples.push(ExtNextHop {
                        nlri_afi: Afi(a),
                        nlri_safi: s,
                        next_hop_afi: Afi(n),
                    });
                }
                Capability::ExtendedNextHop(tuples)
            }
            64 => {
                let word = r
                    .u16()
                    .ok_or_else(|| malformed("graceful restart capability too short"))?;
                if !r.remaining().is_multiple_of(4) {
                    return Err(malformed(
                        "graceful restart capability length is not 2 + 4n",
                    ));
                }
                let mut families = Vec::with_capacity(r.remaining() / 4);
                while let (Some(afi), Some(safi), Some(flags)) = (r.u16(), r.u8(), r.u8()) {
                    families.push(GrFamily {
                        family: Family::new(Afi(afi), Safi(safi)),
                        forwarding_preserved: flags & 0x80 != 0,
                    });
                }
                Capability::GracefulRestart(GracefulRestart {
                    restarting: word & 0x8000 != 0,
                    notification: word & 0x4000 != 0,
                    restart_time: word & 0x0FFF,
                    families,
                })
            }
            65 => match (r.u32(), value.len()) {
                (Some(0), 4) => {
                    return Err(DecodeError::new(
                        ErrorKind::BadPeerAs,
                        "4-octet AS capability carries AS 0",
                    ));
                }
                (Some(asn), 4) => Capability::FourOctetAs(Asn(asn)),
                _ => return Err(malformed("4-octet AS capability length is not 4")),
            },
            _ => Capability::Unknown {
                code,
                value: value.to_vec(),
            },
        };
        Ok(cap)
    }
}

impl Open {
    /// An OPEN for `asn`: `my_as` becomes AS_TRANS when `asn` needs 4 octets. The caller
    /// lists the capabilities, [`Capability::FourOctetAs`] included.
    pub fn new(asn: Asn, hold_time: u16, bgp_id: Ipv4Addr, capabilities: Vec<Capability>) -> Self {
        Open {
            my_as: asn.to_16bit(),
            hold_time,
            bgp_id,
            capabilities,
        }
    }

    /// The sender's AS: from the 4-octet AS capability if present, else the 2-octet field.
    pub fn asn(&self) -> Asn {
        self.four_octet_as().unwrap_or(Asn(u32::from(self.my_as)))
    }

    /// The AS in the 4-octet AS capability, if sent.
    pub fn four_octet_as(&self) -> Option<Asn> {
        self.capabilities.iter().find_map(|c| match c {
            Capability::FourOctetAs(a) => Some(*a),
            _ => None,
        })
    }

    /// Families announced with the multiprotocol capability.
    pub fn families(&self) -> impl Iterator<Item = Family> + '_ {
        self.capabilities.iter().filter_map(|c| match c {
            Capability::Multiprotocol(f) => Some(*f),
            _ => None,
        })
    }

    pub fn has(&self, code: u8) -> bool {
        self.capabilities.iter().any(|c| c.code() == code)
    }

    pub fn graceful_restart(&self) -> Option<&GracefulRestart> {
        self.capabilities.iter().find_map(|c| match c {
            Capability::GracefulRestart(g) => Some(g),
            _ => None,
        })
    }

    /// All extended next hop tuples announced.
    pub fn ext_next_hops(&self) -> impl Iterator<Item = &ExtNextHop> + '_ {
        self.capabilities.iter().flat_map(|c| match c {
            Capability::ExtendedNextHop(v) => v.as_slice(),
            _ => &[],
        })
    }

    /// Append the whole message (header included). OPEN never exceeds 4096 octets.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let start = header::begin(out, MessageType::Open);
        let r = self.encode_body(out);
        if r.is_err() {
            out.truncate(start);
        }
        r?;
        header::finish(out, start, MAX_MESSAGE_LEN)
    }

    fn encode_body(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.put_u8(BGP_VERSION);
        out.put_u16(self.my_as);
        out.put_u16(self.hold_time);
        out.extend_from_slice(&self.bgp_id.octets());
        let caps_len = self
            .capabilities
            .iter()
            .map(|c| c.value_len().saturating_add(2))
            .fold(0usize, usize::saturating_add);
        if self.capabilities.is_empty() {
            out.put_u8(0);
        } else if let Ok(l) = u8::try_from(caps_len)
            && l < 254
        {
            // One parameter holding every capability, as BIRD and FRR send it.
            out.put_u8(l.saturating_add(2));
            out.put_u8(PARAM_CAPABILITIES);
            out.put_u8(l);
        } else {
            // RFC 9072 extended optional parameters.
            let total = caps_len.saturating_add(3);
            let (Ok(total), Ok(caps)) = (u16::try_from(total), u16::try_from(caps_len)) else {
                return Err(EncodeError::TooLarge {
                    what: "OPEN capabilities",
                    size: caps_len,
                    max: 65532,
                });
            };
            out.put_u8(255);
            out.put_u8(PARAM_EXTENDED);
            out.put_u16(total);
            out.put_u8(PARAM_CAPABILITIES);
            out.put_u16(caps);
        }
        for c in &self.capabilities {
            c.encode(out)?;
        }
        Ok(())
    }

    /// Decode an OPEN body (the message without its 19-octet header).
    pub fn decode(body: &[u8]) -> Result<Open, DecodeError> {
        let short = || DecodeError::new(ErrorKind::MalformedOpen, "OPEN truncated");
        let mut r = Reader::new(body);
        let version = r.u8().ok_or_else(short)?;
        if version != BGP_VERSION {
            return Err(DecodeError::with_data(
                ErrorKind::UnsupportedVersion,
                "only BGP-4 is supported",
                &u16::from(BGP_VERSION).to_be_bytes(),
            ));
        }
        let my_as = r.u16().ok_or_else(short)?;
        let hold_time = r.u16().ok_or_else(short)?;
        let bgp_id = Ipv4Addr::from(r.u32().ok_or_else(short)?);
        let opt_len = r.u8().ok_or_else(short)?;
        if my_as == 0 {
            // RFC 7607: AS 0 is never a valid peer AS.
            return Err(DecodeError::new(ErrorKind::BadPeerAs, "peer AS is 0"));
        }
        if hold_time == 1 || hold_time == 2 {
            return Err(DecodeError::new(
                ErrorKind::UnacceptableHoldTime,
                "hold time must be 0 or at least 3",
            ));
        }
        if bgp_id.is_unspecified() {
            return Err(DecodeError::new(
                ErrorKind::BadBgpIdentifier,
                "BGP identifier is 0",
            ));
        }

        // RFC 9072: a non-extended length of 255 followed by type 255 switches every
        // parameter length to two octets.
        let extended = opt_len == 255 && r.rest().first() == Some(&PARAM_EXTENDED);
        let params = if extended {
            let _ = r.u8();
            let len = r.u16().ok_or_else(short)?;
            r.take(usize::from(len))
        } else {
            r.take(usize::from(opt_len))
        }
        .ok_or_else(|| {
            DecodeError::new(
                ErrorKind::MalformedOpen,
                "optional parameters overrun the message",
            )
        })?;
        if !r.is_empty() {
            return Err(DecodeError::new(
                ErrorKind::MalformedOpen,
                "bytes after the optional parameters",
            ));
        }

        let mut capabilities = Vec::new();
        let mut pr = Reader::new(params);
        while !pr.is_empty() {
            let ptype = pr.u8().ok_or_else(short)?;
            let plen = if extended {
                pr.u16()
            } else {
                pr.u8().map(u16::from)
            };
            let value = plen.and_then(|l| pr.take(usize::from(l))).ok_or_else(|| {
                DecodeError::new(ErrorKind::MalformedOpen, "optional parameter overruns")
            })?;
            if ptype != PARAM_CAPABILITIES {
                return Err(DecodeError::new(
                    ErrorKind::UnsupportedOptionalParameter,
                    "optional parameter other than capabilities",
                ));
            }
            let mut cr = Reader::new(value);
            while !cr.is_empty() {
                let code = cr.u8().ok_or_else(short)?;
                let v = cr
                    .u8()
                    .and_then(|l| cr.take(usize::from(l)))
                    .ok_or_else(|| {
                        DecodeError::new(
                            ErrorKind::MalformedOpen,
                            "capability overruns its parameter",
                        )
                    })?;
                capabilities.push(Capability::decode(code, v)?);
            }
        }
        Ok(Open {
            my_as,
            hold_time,
            bgp_id,
            capabilities,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::HEADER_LEN;

    fn sample() -> Open {
        Open::new(
            Asn(4_200_000_001),
            90,
            Ipv4Addr::new(192, 0, 2, 1),
            vec![
                Capability::Multiprotocol(Family::IPV4_UNICAST),
                Capability::Multiprotocol(Family::IPV6_UNICAST),
                Capability::RouteRefresh,
                Capability::EnhancedRouteRefresh,
                Capability::ExtendedMessage,
                Capability::ExtendedNextHop(vec![ExtNextHop {
                    nlri_afi: Afi::IPV4,
                    nlri_safi: 1,
                    next_hop_afi: Afi::IPV6,
                }]),
                Capability::GracefulRestart(GracefulRestart {
                    restarting: true,
                    notification: true,
                    restart_time: 120,
                    families: vec![GrFamily {
                        family: Family::IPV4_UNICAST,
                        forwarding_preserved: true,
                    }],
                }),
                Capability::FourOctetAs(Asn(4_200_000_001)),
                Capability::Unknown {
                    code: 73,
                    value: b"\x04host\x00".to_vec(),
                },
            ],
        )
    }

    fn body(msg: &[u8]) -> &[u8] {
        &msg[HEADER_LEN..]
    }

    #[test]
    fn round_trip_with_capabilities() {
        let o = sample();
        let mut out = Vec::new();
        o.encode(&mut out).unwrap();
        assert_eq!(o.my_as, 23456);
        let d = Open::decode(body(&out)).unwrap();
        assert_eq!(d, o);
        assert_eq!(d.asn(), Asn(4_200_000_001));
        assert_eq!(
            d.families().collect::<Vec<_>>(),
            [Family::IPV4_UNICAST, Family::IPV6_UNICAST]
        );
        assert_eq!(d.graceful_restart().unwrap().restart_time, 120);
        assert!(d.has(2) && d.has(70) && !d.has(69));
    }

    #[test]
    fn decodes_bird_style_open() {
        // BIRD 2 to a peer: AS 65001, hold 240, id 10.0.0.1, one parameter with MP IPv4,
        // route refresh, enhanced route refresh, graceful restart (restart time 120, R bit),
        // 4-octet AS 65001.
        let bytes: &[u8] = &[
            4, 0xFD, 0xE9, 0, 240, 10, 0, 0, 1, 24, // version .. opt len
            2, 22, // parameter: capabilities, 22 octets
            1, 4, 0, 1, 0, 1, // MP ipv4 unicast
            2, 0, // route refresh
            70, 0, // enhanced route refresh
            64, 2, 0x80, 120, // graceful restart, R bit, 120 s, no families
            65, 4, 0, 0, 0xFD, 0xE9, // 4-octet AS
            6, 0, // extended message
        ];
        let o = Open::decode(bytes).unwrap();
        assert_eq!(o.asn(), Asn(65001));
        assert_eq!(o.hold_time, 240);
        assert_eq!(o.capabilities.len(), 6);
        let gr = o.graceful_restart().unwrap();
        assert!(gr.restarting && !gr.notification && gr.families.is_empty());
    }

    #[test]
    fn open_errors_carry_the_right_notification() {
        let mut ok = Vec::new();
        Open::new(Asn(65001), 90, Ipv4Addr::new(1, 1, 1, 1), vec![])
            .encode(&mut ok)
            .unwrap();
        let b = body(&ok).to_vec();

        let mut v = b.clone();
        v[0] = 3;
        let e = Open::decode(&v).unwrap_err();
        assert_eq!(
            (e.kind, e.data.as_slice()),
            (ErrorKind::UnsupportedVersion, &[0u8, 4][..])
        );

        let mut v = b.clone();
        v[1..3].copy_from_slice(&[0, 0]);
        assert_eq!(Open::decode(&v).unwrap_err().kind, ErrorKind::BadPeerAs);

        for hold in [1u16, 2] {
            let mut v = b.clone();
            v[3..5].copy_from_slice(&hold.to_be_bytes());
            let e = Open::decode(&v).unwrap_err();
            assert_eq!((e.kind.code(), e.kind.subcode()), (2, 6));
        }
        for hold in [0u16, 3, 65535] {
            let mut v = b.clone();
            v[3..5].copy_from_slice(&hold.to_be_bytes());
            assert_eq!(Open::decode(&v).unwrap().hold_time, hold);
        }

        let mut v = b.clone();
        v[5..9].copy_from_slice(&[0; 4]);
        assert_eq!(
            Open::decode(&v).unwrap_err().kind,
            ErrorKind::BadBgpIdentifier
        );

        // An optional parameter of type 1 (the deprecated authentication parameter).
        let mut v = b.clone();
        v[9] = 3;
        v.extend_from_slice(&[1, 1, 0]);
        let e = Open::decode(&v).unwrap_err();
        assert_eq!((e.kind.code(), e.kind.subcode()), (2, 4));

        // Parameter length running past the message.
        let mut v = b.clone();
        v[9] = 4;
        v.extend_from_slice(&[2, 2, 65]);
        assert_eq!(Open::decode(&v).unwrap_err().kind, ErrorKind::MalformedOpen);

        // A 4-octet AS capability of length 3, and one carrying AS 0.
        let mut v = b.clone();
        v[9] = 7;
        v.extend_from_slice(&[2, 5, 65, 3, 0, 0, 1]);
        assert_eq!(Open::decode(&v).unwrap_err().kind, ErrorKind::MalformedOpen);
        let mut v = b.clone();
        v[9] = 8;
        v.extend_from_slice(&[2, 6, 65, 4, 0, 0, 0, 0]);
        assert_eq!(Open::decode(&v).unwrap_err().kind, ErrorKind::BadPeerAs);

        // Truncated before the parameter length.
        assert_eq!(
            Open::decode(&b[..9]).unwrap_err().kind,
            ErrorKind::MalformedOpen
        );
    }

    #[test]
    fn extended_optional_parameters_rfc_9072() {
        // Enough unknown capabilities to pass 255 octets of parameters.
        let caps = (0..30)
            .map(|i| Capability::Unknown {
                code: 200,
                value: vec![i; 8],
            })
            .collect();
        let o = Open::new(Asn(65001), 90, Ipv4Addr::new(1, 1, 1, 1), caps);
        let mut out = Vec::new();
        o.encode(&mut out).unwrap();
        assert_eq!(&body(&out)[9..11], &[255, 255]);
        assert_eq!(Open::decode(body(&out)).unwrap(), o);
    }

    #[test]
    fn unencodable_capabilities_are_errors() {
        let mut out = vec![1];
        let o = Open::new(
            Asn(1),
            0,
            Ipv4Addr::new(1, 1, 1, 1),
            vec![Capability::GracefulRestart(GracefulRestart {
                restart_time: 4096,
                ..Default::default()
            })],
        );
        assert!(o.encode(&mut out).is_err());
        let o = Open::new(
            Asn(1),
            0,
            Ipv4Addr::new(1, 1, 1, 1),
            vec![Capability::Unknown {
                code: 9,
                value: vec![0; 256],
            }],
        );
        assert!(o.encode(&mut out).is_err());
        assert_eq!(out, [1]);
    }
}
