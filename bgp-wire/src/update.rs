//! UPDATE (RFC 4271 §4.3) with RFC 7606 revised error handling.
//!
//! Why this file is long: UPDATE decoding and RFC 7606's per-attribute dispositions are one walk
//! over the message; splitting it would split the walk.
//!
//! Decoding never fails outright: it returns what it could parse plus a [`Disposition`]
//! (use it, treat its routes as withdrawn, or reset the session) and the attributes it
//! discarded, each with its reason.

use crate::attributes::mp::{self, MpOutcome};
use crate::attributes::{
    Aggregator, AsPath, MpNlri, MpReach, MpUnreach, NextHop, PathAttributes, RawAttribute, code,
    expected_flags, flag, merge_as4_path, value, write_header,
};
use crate::cursor::{Put, Reader};
use crate::error::{AttrProblem, DecodeError, Disposition, EncodeError, ErrorKind, ProblemKind};
use crate::header::{self, MessageType};
use crate::nlri::{Ipv4Prefix, Prefix, decode_nlri, encode_nlri};
use crate::params::SessionParams;
use crate::types::{Afi, Asn, Family, Origin, Safi};

/// An UPDATE message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Update {
    /// Withdrawn IPv4 routes (the classic field).
    pub withdrawn: Vec<Ipv4Prefix>,
    pub attributes: PathAttributes,
    /// Announced IPv4 routes (the classic field), via `attributes.next_hop`.
    pub nlri: Vec<Ipv4Prefix>,
    pub mp_reach: Option<MpReach>,
    pub mp_unreach: Option<MpUnreach>,
}

/// The three fields of an UPDATE body, located but not parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateParts<'a> {
    pub withdrawn: &'a [u8],
    pub attributes: &'a [u8],
    pub nlri: &'a [u8],
}

/// Locate the fields of an UPDATE body (the message without its header). Lengths that run
/// past the message leave the NLRI unlocatable: a session reset (RFC 7606 §4 / RFC 4271 §6.3).
pub fn split_update(body: &[u8]) -> Result<UpdateParts<'_>, DecodeError> {
    let mut r = Reader::new(body);
    let bad = |detail| DecodeError::new(ErrorKind::MalformedAttributeList, detail);
    let withdrawn = r
        .u16()
        .and_then(|l| r.take(usize::from(l)))
        .ok_or_else(|| bad("withdrawn routes length overruns the message"))?;
    let attributes = r
        .u16()
        .and_then(|l| r.take(usize::from(l)))
        .ok_or_else(|| bad("total path attribute length overruns the message"))?;
    Ok(UpdateParts {
        withdrawn,
        attributes,
        nlri: r.take_rest(),
    })
}

/// The decoded UPDATE and what to do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateDecode {
    /// Everything that could be parsed. Under `TreatAsWithdraw` its announced routes are to
    /// be withdrawn; under `SessionReset` it is incomplete and must not be used.
    pub update: Update,
    pub disposition: Disposition,
    /// Attributes dropped while the rest of the UPDATE stands (attribute discard, duplicates,
    /// unrecognised non-transitive, ...).
    pub discarded: Vec<AttrProblem>,
    /// Set when the message is an End-of-RIB marker (RFC 4724 §2) for this family, whether or
    /// not the family was negotiated.
    pub end_of_rib: Option<Family>,
}

impl Update {
    /// The End-of-RIB marker for `family`: an empty UPDATE for IPv4 unicast, an UPDATE with
    /// only an empty MP_UNREACH_NLRI otherwise. `None` for families this crate does not carry.
    pub fn end_of_rib(family: Family) -> Option<Update> {
        if family == Family::IPV4_UNICAST {
            return Some(Update::default());
        }
        Some(Update {
            mp_unreach: Some(MpUnreach {
                withdrawn: MpNlri::empty(family)?,
            }),
            ..Update::default()
        })
    }

    /// The family this UPDATE is the End-of-RIB marker of, if it is one.
    pub fn is_end_of_rib(&self) -> Option<Family> {
        let bare = self.withdrawn.is_empty()
            && self.nlri.is_empty()
            && self.mp_reach.is_none()
            && self.attributes == PathAttributes::default();
        match &self.mp_unreach {
            _ if !bare => None,
            None => Some(Family::IPV4_UNICAST),
            Some(u) if u.withdrawn.is_empty() => Some(u.family()),
            Some(_) => None,
        }
    }

    /// Every announced route: the NLRI field, then MP_REACH_NLRI's.
    pub fn announced(&self) -> impl Iterator<Item = Prefix> + '_ {
        self.nlri
            .iter()
            .map(|p| Prefix::V4(*p))
            .chain(self.mp_reach.iter().flat_map(|r| mp_prefixes(&r.nlri)))
    }

    /// Every withdrawn route: the withdrawn field, then MP_UNREACH_NLRI's.
    pub fn withdrawn_routes(&self) -> impl Iterator<Item = Prefix> + '_ {
        self.withdrawn.iter().map(|p| Prefix::V4(*p)).chain(
            self.mp_unreach
                .iter()
                .flat_map(|u| mp_prefixes(&u.withdrawn)),
        )
    }

    /// Append the whole message (header included). Attributes are written with
    /// MP_UNREACH_NLRI and MP_REACH_NLRI first (RFC 7606 §5.1), the rest by type code.
    /// The message must fit `session.max_message_len()`; the `pack` module (built on this
    /// one) splits many routes over several messages.
    pub fn encode(&self, session: &SessionParams, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let start = header::begin(out, MessageType::Update);
        let r = self.encode_body(session, out);
        if r.is_err() {
            out.truncate(start);
        }
        r?;
        header::finish(out, start, session.max_message_len())
    }

    fn encode_body(&self, session: &SessionParams, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let wd_at = out.len();
        out.put_u16(0);
        encode_nlri(&self.withdrawn, out);
        let wd_len = out.len().saturating_sub(wd_at).saturating_sub(2);
        out.patch_u16(wd_at, fit_u16(wd_len, "withdrawn routes")?);

        let attr_at = out.len();
        out.put_u16(0);
        if let Some(u) = &self.mp_unreach {
            write_header(out, flag::OPTIONAL, code::MP_UNREACH_NLRI, u.wire_len())?;
            u.write(out);
        }
        if let Some(r) = &self.mp_reach {
            check_next_hop(r.nlri.family().afi, &r.next_hop)?;
            write_header(out, flag::OPTIONAL, code::MP_REACH_NLRI, r.wire_len())?;
            r.write(out);
        }
        self.attributes.write(session, true, out)?;
        let attr_len = out.len().saturating_sub(attr_at).saturating_sub(2);
        out.patch_u16(attr_at, fit_u16(attr_len, "path attributes")?);
        encode_nlri(&self.nlri, out);
        Ok(())
    }
}

fn mp_prefixes(n: &MpNlri) -> Box<dyn Iterator<Item = Prefix> + '_> {
    match n {
        MpNlri::Ipv4(v) => Box::new(v.iter().map(|p| Prefix::V4(*p))),
        MpNlri::Ipv6(v) => Box::new(v.iter().map(|p| Prefix::V6(*p))),
    }
}

pub(crate) fn fit_u16(len: usize, what: &'static str) -> Result<u16, EncodeError> {
    u16::try_from(len).map_err(|_| EncodeError::TooLarge {
        what,
        size: len,
        max: 65535,
    })
}

/// IPv6 routes need an IPv6 next hop; IPv4 routes take either (RFC 8950).
pub(crate) fn check_next_hop(afi: Afi, nh: &NextHop) -> Result<(), EncodeError> {
    if afi == Afi::IPV6 && matches!(nh, NextHop::V4(_)) {
        return Err(EncodeError::Invalid("IPv6 routes need an IPv6 next hop"));
    }
    Ok(())
}

impl UpdateDecode {
    /// Routes to install: everything announced when the disposition is `Ok`, nothing
    /// otherwise.
    pub fn announcements(&self) -> impl Iterator<Item = Prefix> + '_ {
        let ok = self.disposition.is_ok();
        self.update.announced().filter(move |_| ok)
    }

    /// Routes to remove: the withdrawn ones, plus the announced ones under
    /// treat-as-withdraw (RFC 7606 §2). Nothing under a session reset (the session goes).
    pub fn withdrawals(&self) -> impl Iterator<Item = Prefix> + '_ {
        let (usable, taw) = match self.disposition {
            Disposition::Ok => (true, false),
            Disposition::TreatAsWithdraw(_) => (true, true),
            Disposition::SessionReset(_) => (false, false),
        };
        let announced = self.update.announced().filter(move |_| taw);
        self.update
            .withdrawn_routes()
            .chain(announced)
            .filter(move |_| usable)
    }

    fn reset(mut self, e: DecodeError) -> Self {
        self.disposition = Disposition::SessionReset(e);
        self
    }
}

/// Decode an UPDATE body (the message without its 19-octet header).
pub fn decode_update(body: &[u8], session: &SessionParams) -> UpdateDecode {
    let out = UpdateDecode {
        update: Update::default(),
        disposition: Disposition::Ok,
        discarded: Vec::new(),
        end_of_rib: None,
    };
    let parts = match split_update(body) {
        Ok(p) => p,
        Err(e) => return out.reset(e),
    };
    let mut out = UpdateDecode {
        end_of_rib: raw_end_of_rib(&parts),
        ..out
    };

    // RFC 7606 §5.3: a prefix that cannot be parsed leaves the rest unlocatable.
    match decode_nlri(parts.withdrawn) {
        Ok(w) => out.update.withdrawn = w,
        Err(e) => return out.reset(e),
    }
    match decode_nlri(parts.nlri) {
        Ok(n) => out.update.nlri = n,
        Err(e) => return out.reset(e),
    }

    let mut walk = Walk::new(session);
    let walked = walk.attributes(parts.attributes);
    let Walk {
        attrs,
        as4_path,
        as4_aggregator,
        mp_reach,
        mp_unreach,
        mut withdraw,
        discarded,
        seen,
        ..
    } = walk;
    out.update.attributes = attrs;
    out.update.mp_reach = mp_reach;
    out.update.mp_unreach = mp_unreach;
    out.discarded = discarded;
    if let Err(e) = walked {
        return out.reset(e);
    }

    // RFC 7606 §3d: missing well-known mandatory attributes only matter when routes are
    // announced; NEXT_HOP only for routes in the NLRI field (RFC 4760 §3).
    let announces_mp = out
        .update
        .mp_reach
        .as_ref()
        .is_some_and(|r| !r.nlri.is_empty());
    if !out.update.nlri.is_empty() || announces_mp {
        let next_hop_needed = !out.update.nlri.is_empty();
        for c in [code::ORIGIN, code::AS_PATH, code::NEXT_HOP] {
            if !seen.contains(c) && (c != code::NEXT_HOP || next_hop_needed) {
                withdraw.push(AttrProblem {
                    type_code: c,
                    kind: ProblemKind::Malformed(DecodeError::with_data(
                        ErrorKind::MissingWellKnownAttribute,
                        "well-known mandatory attribute missing",
                        &[c],
                    )),
                });
            }
        }
    }

    if !session.four_octet_as {
        merge_as4(&mut out, as4_path, as4_aggregator);
    }

    if !withdraw.is_empty() {
        out.disposition = Disposition::TreatAsWithdraw(withdraw);
    }
    out
}

/// RFC 6793 §4.2.3: rebuild the real AGGREGATOR and AS_PATH on a 2-octet session.
fn merge_as4(out: &mut UpdateDecode, as4_path: Option<AsPath>, as4_aggregator: Option<Aggregator>) {
    let attrs = &mut out.update.attributes;
    match (attrs.aggregator, as4_aggregator) {
        // Aggregated by an OLD speaker after the AS4 attributes were made: both are stale.
        (Some(a), Some(_)) if a.asn != Asn::TRANS => {
            out.discarded.push(AttrProblem {
                type_code: code::AS4_AGGREGATOR,
                kind: ProblemKind::As4Ignored,
            });
            if as4_path.is_some() {
                out.discarded.push(AttrProblem {
                    type_code: code::AS4_PATH,
                    kind: ProblemKind::As4Ignored,
                });
            }
            return;
        }
        (Some(_), Some(a4)) => attrs.aggregator = Some(a4),
        (None, Some(_)) => {
            out.discarded.push(AttrProblem {
                type_code: code::AS4_AGGREGATOR,
                kind: ProblemKind::As4Ignored,
            });
        }
        (_, None) => {}
    }
    if let (Some(p4), Some(p2)) = (as4_path, attrs.as_path.as_mut()) {
        *p2 = merge_as4_path(p2, &p4);
    }
}

/// An End-of-RIB marker: nothing but (for non-IPv4) one empty MP_UNREACH_NLRI.
fn raw_end_of_rib(parts: &UpdateParts<'_>) -> Option<Family> {
    if !parts.withdrawn.is_empty() || !parts.nlri.is_empty() {
        return None;
    }
    if parts.attributes.is_empty() {
        return Some(Family::IPV4_UNICAST);
    }
    let mut r = Reader::new(parts.attributes);
    let flags = r.u8()?;
    if r.u8()? != code::MP_UNREACH_NLRI {
        return None;
    }
    let len = if flags & flag::EXTENDED_LENGTH != 0 {
        r.u16()?
    } else {
        u16::from(r.u8()?)
    };
    let (afi, safi) = (r.u16()?, r.u8()?);
    (len == 3 && r.is_empty()).then_some(Family::new(Afi(afi), Safi(safi)))
}

/// Which type codes were seen (256 bits, no allocation).
#[derive(Default)]
struct Seen([u64; 4]);

impl Seen {
    fn slot(c: u8) -> (usize, u64) {
        (usize::from(c >> 6), 1u64 << (c & 63))
    }
    fn contains(&self, c: u8) -> bool {
        let (i, bit) = Seen::slot(c);
        self.0.get(i).is_some_and(|w| w & bit != 0)
    }
    fn insert(&mut self, c: u8) {
        let (i, bit) = Seen::slot(c);
        if let Some(w) = self.0.get_mut(i) {
            *w |= bit;
        }
    }
}

/// What RFC 7606 §7 prescribes for a malformed attribute of each type.
enum Action {
    Discard,
    Withdraw,
}

fn action_for(type_code: u8) -> Action {
    match type_code {
        code::ATOMIC_AGGREGATE | code::AGGREGATOR | code::AS4_PATH | code::AS4_AGGREGATOR => {
            Action::Discard
        }
        _ => Action::Withdraw,
    }
}

/// The attribute section walker: its state is everything the section can contribute.
struct Walk<'s> {
    session: &'s SessionParams,
    attrs: PathAttributes,
    as4_path: Option<AsPath>,
    as4_aggregator: Option<Aggregator>,
    mp_reach: Option<MpReach>,
    mp_unreach: Option<MpUnreach>,
    withdraw: Vec<AttrProblem>,
    discarded: Vec<AttrProblem>,
    seen: Seen,
}

type Bad = (ErrorKind, &'static str);

impl<'s> Walk<'s> {
    fn new(session: &'s SessionParams) -> Self {
        Walk {
            session,
            attrs: PathAttributes::default(),
            as4_path: None,
            as4_aggregator: None,
            mp_reach: None,
            mp_unreach: None,
            withdraw: Vec::new(),
            discarded: Vec::new(),
            seen: Seen::default(),
        }
    }

    /// Walk the attribute section. `Err` is a session reset.
    fn attributes(&mut self, section: &[u8]) -> Result<(), DecodeError> {
        let mut r = Reader::new(section);
        while !r.is_empty() {
            let at = r.rest();
            let (Some(flags), Some(type_code)) = (r.u8(), r.u8()) else {
                self.section_error(0, "attribute header truncated", &[]);
                break;
            };
            let len = if flags & flag::EXTENDED_LENGTH != 0 {
                r.u16()
            } else {
                r.u8().map(u16::from)
            };
            let Some(len) = len else {
                self.section_error(type_code, "attribute header truncated", &[]);
                break;
            };
            let Some(value) = r.take(usize::from(len)) else {
                // RFC 7606 §4: the last attribute runs past the section. Its own NLRI (if it
                // is an MP attribute) cannot be found, anything else can.
                if matches!(type_code, code::MP_REACH_NLRI | code::MP_UNREACH_NLRI) {
                    return Err(DecodeError::with_data(
                        ErrorKind::AttributeLength,
                        "MP attribute runs past the attribute section",
                        at,
                    ));
                }
                self.section_error(type_code, "attribute runs past the attribute section", at);
                break;
            };
            let raw = at
                .get(..at.len().saturating_sub(r.remaining()))
                .unwrap_or(at);
            self.one(flags, type_code, value, raw)?;
        }
        Ok(())
    }

    fn section_error(&mut self, type_code: u8, detail: &'static str, raw: &[u8]) {
        let kind = if raw.is_empty() {
            ErrorKind::MalformedAttributeList
        } else {
            ErrorKind::AttributeLength
        };
        self.withdraw.push(AttrProblem {
            type_code,
            kind: ProblemKind::Malformed(DecodeError::with_data(kind, detail, raw)),
        });
    }

    fn one(
        &mut self,
        flags: u8,
        type_code: u8,
        value: &[u8],
        raw: &[u8],
    ) -> Result<(), DecodeError> {
        if self.seen.contains(type_code) {
            if matches!(type_code, code::MP_REACH_NLRI | code::MP_UNREACH_NLRI) {
                return Err(DecodeError::new(
                    ErrorKind::MalformedAttributeList,
                    "MP_REACH_NLRI or MP_UNREACH_NLRI repeated",
                ));
            }
            self.discarded.push(AttrProblem {
                type_code,
                kind: ProblemKind::Duplicate,
            });
            return Ok(());
        }
        self.seen.insert(type_code);

        let Some(expected) = expected_flags(type_code) else {
            return self.unknown(flags, type_code, value, raw);
        };
        let flags_ok = flags & (flag::OPTIONAL | flag::TRANSITIVE) == expected;
        if matches!(type_code, code::MP_REACH_NLRI | code::MP_UNREACH_NLRI) {
            // Wrong flags, but the NLRI can still be parsed so its routes can be withdrawn.
            if !flags_ok {
                self.withdraw.push(problem(
                    type_code,
                    ErrorKind::AttributeFlags,
                    "attribute flags conflict",
                    raw,
                ));
            }
            return self.mp(type_code, value, raw);
        }
        // RFC 7606 §3c: wrong flags make the attribute malformed.
        let result = if flags_ok {
            self.known(type_code, value)
        } else {
            Err((ErrorKind::AttributeFlags, "attribute flags conflict"))
        };
        if let Err((kind, detail)) = result {
            let p = if kind == ErrorKind::MalformedAsPath {
                AttrProblem {
                    type_code,
                    kind: ProblemKind::Malformed(DecodeError::new(kind, detail)),
                }
            } else {
                problem(type_code, kind, detail, raw)
            };
            match action_for(type_code) {
                Action::Discard => self.discarded.push(p),
                Action::Withdraw => self.withdraw.push(p),
            }
        }
        Ok(())
    }

    fn unknown(
        &mut self,
        flags: u8,
        type_code: u8,
        value: &[u8],
        raw: &[u8],
    ) -> Result<(), DecodeError> {
        if flags & flag::OPTIONAL == 0 {
            // RFC 4271 §6.3, not revised by RFC 7606.
            return Err(DecodeError::with_data(
                ErrorKind::UnrecognizedWellKnownAttribute,
                "unrecognised well-known attribute",
                raw,
            ));
        }
        if flags & flag::TRANSITIVE != 0 {
            self.attrs.unknown.push(RawAttribute {
                flags: (flags & !flag::EXTENDED_LENGTH) | flag::PARTIAL,
                type_code,
                value: value.to_vec(),
            });
        } else {
            self.discarded.push(AttrProblem {
                type_code,
                kind: ProblemKind::UnrecognizedNonTransitive,
            });
        }
        Ok(())
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one match arm per known attribute type code, each with its RFC 7606 length and value checks; the decoder's table reads best whole"
    )]
    fn known(&mut self, type_code: u8, v: &[u8]) -> Result<(), Bad> {
        use ErrorKind::*;
        let four = self.session.four_octet_as;
        if self.session.external
            && matches!(
                type_code,
                code::LOCAL_PREF | code::ORIGINATOR_ID | code::CLUSTER_LIST
            )
        {
            // Discarded whatever their shape (RFC 7606 §7.5, §7.9, §7.10).
            self.discarded.push(AttrProblem {
                type_code,
                kind: ProblemKind::NotAllowedFromExternal,
            });
            return Ok(());
        }
        let a = &mut self.attrs;
        match type_code {
            code::ORIGIN => {
                let [o] = v else {
                    return Err((AttributeLength, "ORIGIN length is not 1"));
                };
                a.origin =
                    Some(Origin::from_u8(*o).ok_or((InvalidOrigin, "ORIGIN value undefined"))?);
            }
            code::AS_PATH => {
                let p = AsPath::decode(v, four).map_err(|d| (MalformedAsPath, d))?;
                if !self.session.confederation && p.has_confed() {
                    // RFC 5065 §5, RFC 7606 §7.2: treat-as-withdraw.
                    return Err((
                        MalformedAsPath,
                        "confederation segment from a peer outside our confederation",
                    ));
                }
                a.as_path = Some(p);
            }
            code::NEXT_HOP => {
                let nh =
                    value::ipv4_exact(v).ok_or((AttributeLength, "NEXT_HOP length is not 4"))?;
                if mp::ipv4_next_hop_invalid(nh) {
                    return Err((InvalidNextHop, "NEXT_HOP is not a unicast host address"));
                }
                a.next_hop = Some(nh);
            }
            code::MULTI_EXIT_DISC => {
                a.med = Some(
                    value::u32_exact(v)
                        .ok_or((AttributeLength, "MULTI_EXIT_DISC length is not 4"))?,
                );
            }
            code::LOCAL_PREF => {
                a.local_pref = Some(
                    value::u32_exact(v).ok_or((AttributeLength, "LOCAL_PREF length is not 4"))?,
                );
            }
            code::ATOMIC_AGGREGATE => {
                if !v.is_empty() {
                    return Err((AttributeLength, "ATOMIC_AGGREGATE length is not 0"));
                }
                a.atomic_aggregate = true;
            }
            code::AGGREGATOR => {
                let agg = value::aggregator(v, four).ok_or((
                    AttributeLength,
                    "AGGREGATOR length is not 6 or 8 as negotiated",
                ))?;
                a.aggregator = Some(agg);
            }
            code::COMMUNITIES => {
                a.communities =
                    value::list::<4, _>(v, |c| crate::types::Community(u32::from_be_bytes(*c)))
                        .ok_or((
                            AttributeLength,
                            "COMMUNITIES length is not a non-zero multiple of 4",
                        ))?;
            }
            code::ORIGINATOR_ID => {
                a.originator_id = Some(
                    value::ipv4_exact(v)
                        .ok_or((AttributeLength, "ORIGINATOR_ID length is not 4"))?,
                );
            }
            code::CLUSTER_LIST => {
                a.cluster_list =
                    value::list::<4, _>(v, |c| std::net::Ipv4Addr::from(*c)).ok_or((
                        AttributeLength,
                        "CLUSTER_LIST length is not a non-zero multiple of 4",
                    ))?;
            }
            code::EXTENDED_COMMUNITIES => {
                a.ext_communities = value::list::<8, _>(v, |c| crate::types::ExtCommunity(*c))
                    .ok_or((
                        AttributeLength,
                        "EXTENDED_COMMUNITIES length is not a non-zero multiple of 8",
                    ))?;
            }
            code::LARGE_COMMUNITIES => {
                let mut l = value::list::<12, _>(v, value::large_community).ok_or((
                    AttributeLength,
                    "LARGE_COMMUNITIES length is not a non-zero multiple of 12",
                ))?;
                value::dedup_large(&mut l);
                a.large_communities = l;
            }
            code::AS4_PATH | code::AS4_AGGREGATOR if four => {
                self.discarded.push(AttrProblem {
                    type_code,
                    kind: ProblemKind::As4FromNewSpeaker,
                });
            }
            code::AS4_PATH => {
                let p = AsPath::decode(v, true).map_err(|d| (MalformedAsPath, d))?;
                if p.has_confed() {
                    return Err((MalformedAsPath, "AS4_PATH carries confederation segments"));
                }
                self.as4_path = Some(p);
            }
            code::AS4_AGGREGATOR => {
                let agg = value::aggregator(v, true)
                    .ok_or((AttributeLength, "AS4_AGGREGATOR length is not 8"))?;
                self.as4_aggregator = Some(agg);
            }
            _ => {}
        }
        Ok(())
    }

    fn mp(&mut self, type_code: u8, value: &[u8], raw: &[u8]) -> Result<(), DecodeError> {
        if type_code == code::MP_REACH_NLRI {
            match mp::decode_reach(value, raw, self.session)? {
                MpOutcome::Decoded(reach, problem) => {
                    self.mp_reach = Some(reach);
                    if let Some(e) = problem {
                        self.withdraw.push(AttrProblem {
                            type_code,
                            kind: ProblemKind::Malformed(e),
                        });
                    }
                }
                MpOutcome::Unnegotiated(f) => self.discarded.push(AttrProblem {
                    type_code,
                    kind: ProblemKind::UnnegotiatedFamily(f),
                }),
            }
        } else {
            match mp::decode_unreach(value, raw, self.session)? {
                MpOutcome::Decoded(unreach, _) => self.mp_unreach = Some(unreach),
                MpOutcome::Unnegotiated(f) => self.discarded.push(AttrProblem {
                    type_code,
                    kind: ProblemKind::UnnegotiatedFamily(f),
                }),
            }
        }
        Ok(())
    }
}

fn problem(type_code: u8, kind: ErrorKind, detail: &'static str, raw: &[u8]) -> AttrProblem {
    AttrProblem {
        type_code,
        kind: ProblemKind::Malformed(DecodeError::with_data(kind, detail, raw)),
    }
}
