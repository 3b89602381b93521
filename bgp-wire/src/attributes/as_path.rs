//! AS_PATH (type 2) and AS4_PATH (type 17), RFC 4271 §4.3, RFC 5065, RFC 6793.
//!
//! In memory a path always holds 4-octet AS numbers; the session decides whether they go on
//! the wire as 2 or 4 octets. On a 2-octet session the decoder rebuilds the real path from
//! AS_PATH and AS4_PATH ([`merge_as4_path`]) and the encoder splits it back (AS_TRANS in
//! AS_PATH, the real numbers in AS4_PATH).

use std::fmt;

use crate::cursor::{Put, Reader};
use crate::types::Asn;

/// Segment types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentType {
    Set = 1,
    Sequence = 2,
    ConfedSequence = 3,
    ConfedSet = 4,
}

impl SegmentType {
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(SegmentType::Set),
            2 => Some(SegmentType::Sequence),
            3 => Some(SegmentType::ConfedSequence),
            4 => Some(SegmentType::ConfedSet),
            _ => None,
        }
    }
    pub const fn is_confed(self) -> bool {
        matches!(self, SegmentType::ConfedSequence | SegmentType::ConfedSet)
    }
    const fn is_sequence(self) -> bool {
        matches!(self, SegmentType::Sequence | SegmentType::ConfedSequence)
    }
}

/// One segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AsSegment {
    pub kind: SegmentType,
    pub asns: Vec<Asn>,
}

/// An AS path in canonical form: no empty segments, and no two adjacent sequences of the same
/// kind (they are one sequence; the wire's 255-AS limit per segment is the encoder's concern).
/// So two paths that mean the same compare equal, which the RIB's attribute interning needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AsPath {
    segments: Vec<AsSegment>,
}

impl AsPath {
    /// A path from segments, normalised to the canonical form.
    pub fn new(segments: Vec<AsSegment>) -> Self {
        let mut p = AsPath {
            segments: Vec::with_capacity(segments.len()),
        };
        for s in segments {
            p.push_segment(s.kind, s.asns);
        }
        p
    }

    /// A single AS_SEQUENCE.
    pub fn from_sequence(asns: impl IntoIterator<Item = Asn>) -> Self {
        let mut p = AsPath::default();
        p.push_segment(SegmentType::Sequence, asns.into_iter().collect());
        p
    }

    fn push_segment(&mut self, kind: SegmentType, mut asns: Vec<Asn>) {
        if asns.is_empty() {
            return;
        }
        if let Some(last) = self.segments.last_mut()
            && last.kind == kind
            && kind.is_sequence()
        {
            last.asns.append(&mut asns);
            return;
        }
        self.segments.push(AsSegment { kind, asns });
    }

    pub fn segments(&self) -> &[AsSegment] {
        &self.segments
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Path length for the decision process (RFC 4271 §9.1.2.2): each AS in a sequence
    /// counts one, a whole AS_SET counts one, confederation segments count nothing (RFC 5065).
    pub fn path_len(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match s.kind {
                SegmentType::Sequence => s.asns.len(),
                SegmentType::Set => 1,
                SegmentType::ConfedSequence | SegmentType::ConfedSet => 0,
            })
            .fold(0, usize::saturating_add)
    }

    /// Put `asn` in front (eBGP export): into the leading AS_SEQUENCE, or a new one.
    pub fn prepend(&mut self, asn: Asn) {
        match self.segments.first_mut() {
            Some(s) if s.kind == SegmentType::Sequence => s.asns.insert(0, asn),
            _ => self.segments.insert(
                0,
                AsSegment {
                    kind: SegmentType::Sequence,
                    asns: vec![asn],
                },
            ),
        }
    }

    /// True if `asn` appears anywhere (loop detection).
    pub fn contains(&self, asn: Asn) -> bool {
        self.segments.iter().any(|s| s.asns.contains(&asn))
    }

    /// How often `asn` appears, in every segment (BIRD's `allow local as` counts so).
    pub fn count(&self, asn: Asn) -> usize {
        self.segments
            .iter()
            .map(|s| s.asns.iter().filter(|a| **a == asn).count())
            .sum()
    }

    /// The neighbouring AS: first AS of a leading AS_SEQUENCE (for MED comparison and the
    /// eBGP first-AS check).
    pub fn first_asn(&self) -> Option<Asn> {
        self.segments
            .iter()
            .find(|s| !s.kind.is_confed())
            .filter(|s| s.kind == SegmentType::Sequence)
            .and_then(|s| s.asns.first().copied())
    }

    /// The originating AS: last AS of a trailing AS_SEQUENCE.
    pub fn origin_asn(&self) -> Option<Asn> {
        self.segments
            .last()
            .filter(|s| s.kind == SegmentType::Sequence)
            .and_then(|s| s.asns.last().copied())
    }

    pub fn has_confed(&self) -> bool {
        self.segments.iter().any(|s| s.kind.is_confed())
    }

    /// The path without confederation segments (what leaves a confederation, and what
    /// AS4_PATH may carry).
    pub fn without_confed(&self) -> AsPath {
        AsPath::new(
            self.segments
                .iter()
                .filter(|s| !s.kind.is_confed())
                .cloned()
                .collect(),
        )
    }

    /// True if some AS outside confederation segments needs 4 octets.
    pub(crate) fn needs_as4(&self) -> bool {
        self.segments
            .iter()
            .filter(|s| !s.kind.is_confed())
            .any(|s| s.asns.iter().any(|a| !a.is_16bit()))
    }

    /// Octets of the attribute value with `asn_size`-octet AS numbers.
    pub(crate) fn wire_len(&self, asn_size: usize, skip_confed: bool) -> usize {
        self.segments
            .iter()
            .filter(|s| !(skip_confed && s.kind.is_confed()))
            .flat_map(|s| s.asns.chunks(255))
            .map(|c| c.len().saturating_mul(asn_size).saturating_add(2))
            .fold(0, usize::saturating_add)
    }

    /// Append the attribute value. Segments longer than 255 ASes are split; in 2-octet form
    /// an AS that needs 4 octets becomes AS_TRANS.
    pub(crate) fn write(&self, out: &mut Vec<u8>, four_octet: bool, skip_confed: bool) {
        for s in self
            .segments
            .iter()
            .filter(|s| !(skip_confed && s.kind.is_confed()))
        {
            for chunk in s.asns.chunks(255) {
                out.put_u8(s.kind as u8);
                out.put_u8(u8::try_from(chunk.len()).unwrap_or(u8::MAX));
                for a in chunk {
                    if four_octet {
                        out.put_u32(a.0);
                    } else {
                        out.put_u16(a.to_16bit());
                    }
                }
            }
        }
    }

    /// Decode an AS_PATH or AS4_PATH value with `four_octet` AS numbers.
    ///
    /// Malformed per RFC 7606 §7.2: an unknown segment type, an empty segment, a segment
    /// overrunning the attribute, or a trailing partial segment header.
    pub(crate) fn decode(value: &[u8], four_octet: bool) -> Result<AsPath, &'static str> {
        let mut r = Reader::new(value);
        let mut path = AsPath::default();
        while !r.is_empty() {
            let (Some(ty), Some(count)) = (r.u8(), r.u8()) else {
                return Err("AS_PATH segment header truncated");
            };
            let kind = SegmentType::from_u8(ty).ok_or("AS_PATH segment type unknown")?;
            if count == 0 {
                return Err("AS_PATH segment is empty");
            }
            let size = if four_octet { 4 } else { 2 };
            let bytes = r
                .take(usize::from(count).saturating_mul(size))
                .ok_or("AS_PATH segment overruns the attribute")?;
            let asns: Vec<Asn> = if four_octet {
                bytes
                    .as_chunks::<4>()
                    .0
                    .iter()
                    .map(|c| Asn(u32::from_be_bytes(*c)))
                    .collect()
            } else {
                bytes
                    .as_chunks::<2>()
                    .0
                    .iter()
                    .map(|c| Asn(u32::from(u16::from_be_bytes(*c))))
                    .collect()
            };
            path.push_segment(kind, asns);
        }
        Ok(path)
    }
}

impl fmt::Display for AsPath {
    /// BIRD-like text: `65001 65002 {65003 65004} (65010)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for s in &self.segments {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            let (open, close) = match s.kind {
                SegmentType::Sequence => ("", ""),
                SegmentType::Set => ("{", "}"),
                SegmentType::ConfedSequence => ("(", ")"),
                SegmentType::ConfedSet => ("[", "]"),
            };
            f.write_str(open)?;
            for (i, a) in s.asns.iter().enumerate() {
                if i > 0 {
                    f.write_str(" ")?;
                }
                write!(f, "{a}")?;
            }
            f.write_str(close)?;
        }
        Ok(())
    }
}

/// Rebuild the real path from a 2-octet AS_PATH and an AS4_PATH (RFC 6793 §4.2.3).
///
/// If AS_PATH holds fewer ASes than AS4_PATH, AS4_PATH is ignored. Otherwise the leading
/// ASes of AS_PATH that AS4_PATH lacks (counted as for path length: a set counts one,
/// confederation segments none) are put in front of AS4_PATH, together with any
/// confederation segment that leads the path or sits next to what is taken.
pub fn merge_as4_path(as_path: &AsPath, as4_path: &AsPath) -> AsPath {
    let (n2, n4) = (as_path.path_len(), as4_path.path_len());
    let Some(mut need) = n2.checked_sub(n4) else {
        return as_path.clone();
    };
    let mut out: Vec<AsSegment> = Vec::with_capacity(
        as_path
            .segments
            .len()
            .saturating_add(as4_path.segments.len()),
    );
    for s in &as_path.segments {
        match s.kind {
            SegmentType::ConfedSequence | SegmentType::ConfedSet => out.push(s.clone()),
            _ if need == 0 => break,
            SegmentType::Set => {
                out.push(s.clone());
                need = need.saturating_sub(1);
            }
            SegmentType::Sequence => {
                let take = need.min(s.asns.len());
                out.push(AsSegment {
                    kind: s.kind,
                    asns: s.asns.get(..take).unwrap_or(&s.asns).to_vec(),
                });
                need = need.saturating_sub(take);
                if take < s.asns.len() {
                    break;
                }
            }
        }
    }
    out.extend(as4_path.segments.iter().cloned());
    AsPath::new(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(a: &[u32]) -> AsSegment {
        AsSegment {
            kind: SegmentType::Sequence,
            asns: a.iter().map(|&x| Asn(x)).collect(),
        }
    }
    fn set(a: &[u32]) -> AsSegment {
        AsSegment {
            kind: SegmentType::Set,
            asns: a.iter().map(|&x| Asn(x)).collect(),
        }
    }
    fn cseq(a: &[u32]) -> AsSegment {
        AsSegment {
            kind: SegmentType::ConfedSequence,
            asns: a.iter().map(|&x| Asn(x)).collect(),
        }
    }

    #[test]
    fn canonical_form() {
        let p = AsPath::new(vec![
            seq(&[1]),
            seq(&[]),
            seq(&[2, 3]),
            set(&[4]),
            set(&[5]),
        ]);
        assert_eq!(p.segments(), &[seq(&[1, 2, 3]), set(&[4]), set(&[5])]);
        assert_eq!(p.path_len(), 5);
        assert_eq!(p.to_string(), "1 2 3 {4} {5}");
    }

    #[test]
    fn prepend_and_queries() {
        let mut p = AsPath::new(vec![cseq(&[65010]), seq(&[65001, 65002])]);
        assert_eq!(p.first_asn(), Some(Asn(65001)));
        assert_eq!(p.origin_asn(), Some(Asn(65002)));
        assert_eq!(p.path_len(), 2);
        p.prepend(Asn(64512));
        assert_eq!(p.segments()[0], seq(&[64512]));
        assert!(p.contains(Asn(65010)) && !p.contains(Asn(1)));
        let mut q = AsPath::default();
        q.prepend(Asn(7));
        q.prepend(Asn(8));
        assert_eq!(q.segments(), &[seq(&[8, 7])]);
        assert_eq!(AsPath::new(vec![set(&[1, 2])]).first_asn(), None);
    }

    #[test]
    fn wire_round_trip_and_long_segments() {
        let long: Vec<u32> = (1..=300).collect();
        let p = AsPath::new(vec![seq(&long), set(&[7, 8])]);
        for four in [false, true] {
            let mut out = Vec::new();
            p.write(&mut out, four, false);
            let size = if four { 4 } else { 2 };
            assert_eq!(out.len(), p.wire_len(size, false));
            // 300 ASes are split into 255 + 45 on the wire and merged back on decode.
            assert_eq!(out[1], 255);
            assert_eq!(AsPath::decode(&out, four).unwrap(), p);
        }
    }

    #[test]
    fn sequence_is_written_as_type_2() {
        let mut out = Vec::new();
        AsPath::from_sequence([Asn(65001)]).write(&mut out, true, false);
        assert_eq!(out, [2, 1, 0, 0, 0xFD, 0xE9]);
    }

    #[test]
    fn malformed_paths() {
        // Length 3: a segment header and one byte of an AS.
        assert!(AsPath::decode(&[2, 1, 0], false).is_err());
        // One trailing byte after a valid segment (zettabgp loops forever here).
        assert!(AsPath::decode(&[2, 1, 0, 1, 2], false).is_err());
        // Empty segment, unknown type, overrun.
        assert!(AsPath::decode(&[2, 0], true).is_err());
        assert!(AsPath::decode(&[5, 1, 0, 1], false).is_err());
        assert!(AsPath::decode(&[2, 2, 0, 1, 0, 2], true).is_err());
        assert_eq!(AsPath::decode(&[], true).unwrap(), AsPath::default());
    }

    #[test]
    fn as4_merge_per_rfc_6793() {
        let t = Asn::TRANS.0;
        // The usual case: same length, AS4_PATH wins entirely.
        let m = merge_as4_path(
            &AsPath::new(vec![seq(&[65001, t])]),
            &AsPath::new(vec![seq(&[65001, 4_200_000_000])]),
        );
        assert_eq!(m, AsPath::new(vec![seq(&[65001, 4_200_000_000])]));
        // An OLD speaker prepended two ASes that AS4_PATH lacks.
        let m = merge_as4_path(
            &AsPath::new(vec![seq(&[1, 2, 3, t])]),
            &AsPath::new(vec![seq(&[3, 4_200_000_000])]),
        );
        assert_eq!(m, AsPath::new(vec![seq(&[1, 2, 3, 4_200_000_000])]));
        // AS4_PATH longer than AS_PATH: ignored.
        let a2 = AsPath::new(vec![seq(&[1])]);
        assert_eq!(merge_as4_path(&a2, &AsPath::new(vec![seq(&[5, 6])])), a2);
        // A set counts one and is taken whole; a leading confed segment is kept.
        let m = merge_as4_path(
            &AsPath::new(vec![cseq(&[65010]), set(&[1, 2]), seq(&[t])]),
            &AsPath::new(vec![seq(&[4_200_000_000])]),
        );
        assert_eq!(
            m,
            AsPath::new(vec![cseq(&[65010]), set(&[1, 2]), seq(&[4_200_000_000])])
        );
    }
}
