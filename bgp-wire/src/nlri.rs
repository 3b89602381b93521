//! Prefixes and the NLRI encoding (RFC 4271 §4.3: a length in bits, then just enough octets).
//!
//! A prefix value never has host bits set: constructors mask them, and so does the decoder
//! (as BIRD does: trailing bits a peer leaves set are ignored, not an error). A length beyond
//! 32 (IPv4) or 128 (IPv6) is an invalid network field.

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::error::{DecodeError, ErrorKind};
use crate::types::{Afi, ParseError};

/// An IPv4 prefix with host bits zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Prefix {
    addr: Ipv4Addr,
    len: u8,
}

/// An IPv6 prefix with host bits zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv6Prefix {
    addr: Ipv6Addr,
    len: u8,
}

#[inline]
fn mask_v4(addr: u32, len: u8) -> u32 {
    let host_bits = 32u32.saturating_sub(u32::from(len));
    addr & u32::MAX.checked_shl(host_bits).unwrap_or(0)
}

#[inline]
fn mask_v6(addr: u128, len: u8) -> u128 {
    let host_bits = 128u32.saturating_sub(u32::from(len));
    addr & u128::MAX.checked_shl(host_bits).unwrap_or(0)
}

impl Ipv4Prefix {
    /// `addr/len` with host bits cleared; `None` when `len > 32`.
    pub fn new(addr: Ipv4Addr, len: u8) -> Option<Self> {
        (len <= 32).then(|| Ipv4Prefix {
            addr: mask_v4(addr.to_bits(), len).into(),
            len,
        })
    }
    pub const fn addr(&self) -> Ipv4Addr {
        self.addr
    }
    pub const fn prefix_len(&self) -> u8 {
        self.len
    }
    /// True if `other` lies within this prefix.
    pub fn contains(&self, other: &Ipv4Prefix) -> bool {
        other.len >= self.len && mask_v4(other.addr.to_bits(), self.len) == self.addr.to_bits()
    }
}

/// The default route, 0.0.0.0/0.
impl Default for Ipv4Prefix {
    fn default() -> Self {
        Ipv4Prefix {
            addr: Ipv4Addr::UNSPECIFIED,
            len: 0,
        }
    }
}

impl Ipv6Prefix {
    /// `addr/len` with host bits cleared; `None` when `len > 128`.
    pub fn new(addr: Ipv6Addr, len: u8) -> Option<Self> {
        (len <= 128).then(|| Ipv6Prefix {
            addr: mask_v6(addr.to_bits(), len).into(),
            len,
        })
    }
    pub const fn addr(&self) -> Ipv6Addr {
        self.addr
    }
    pub const fn prefix_len(&self) -> u8 {
        self.len
    }
    /// True if `other` lies within this prefix.
    pub fn contains(&self, other: &Ipv6Prefix) -> bool {
        other.len >= self.len && mask_v6(other.addr.to_bits(), self.len) == self.addr.to_bits()
    }
}

/// The default route, ::/0.
impl Default for Ipv6Prefix {
    fn default() -> Self {
        Ipv6Prefix {
            addr: Ipv6Addr::UNSPECIFIED,
            len: 0,
        }
    }
}

/// Either kind of prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prefix {
    V4(Ipv4Prefix),
    V6(Ipv6Prefix),
}

impl Prefix {
    /// `addr/len` with host bits cleared; `None` when the length is too long for the family.
    pub fn new(addr: IpAddr, len: u8) -> Option<Self> {
        match addr {
            IpAddr::V4(a) => Ipv4Prefix::new(a, len).map(Prefix::V4),
            IpAddr::V6(a) => Ipv6Prefix::new(a, len).map(Prefix::V6),
        }
    }
    pub fn addr(&self) -> IpAddr {
        match self {
            Prefix::V4(p) => p.addr.into(),
            Prefix::V6(p) => p.addr.into(),
        }
    }
    pub fn prefix_len(&self) -> u8 {
        match self {
            Prefix::V4(p) => p.len,
            Prefix::V6(p) => p.len,
        }
    }
    pub fn afi(&self) -> Afi {
        match self {
            Prefix::V4(_) => Afi::IPV4,
            Prefix::V6(_) => Afi::IPV6,
        }
    }
    /// Whether `other` lies within this prefix (never across families).
    pub fn contains(&self, other: &Prefix) -> bool {
        match (self, other) {
            (Prefix::V4(o), Prefix::V4(i)) => o.contains(i),
            (Prefix::V6(o), Prefix::V6(i)) => o.contains(i),
            _ => false,
        }
    }
}

impl From<Ipv4Prefix> for Prefix {
    fn from(p: Ipv4Prefix) -> Self {
        Prefix::V4(p)
    }
}
impl From<Ipv6Prefix> for Prefix {
    fn from(p: Ipv6Prefix) -> Self {
        Prefix::V6(p)
    }
}

impl fmt::Display for Ipv4Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}
impl fmt::Display for Ipv6Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}
impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prefix::V4(p) => p.fmt(f),
            Prefix::V6(p) => p.fmt(f),
        }
    }
}

fn split_prefix_text(s: &str) -> Result<(&str, u8), ParseError> {
    let bad = || ParseError(s.to_owned());
    let (a, l) = s.split_once('/').ok_or_else(bad)?;
    Ok((a, l.parse().map_err(|_| bad())?))
}

/// Parses `a.b.c.d/len`; host bits are cleared.
impl FromStr for Ipv4Prefix {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = split_prefix_text(s)?;
        let addr = a.parse().map_err(|_| ParseError(s.to_owned()))?;
        Ipv4Prefix::new(addr, l).ok_or_else(|| ParseError(s.to_owned()))
    }
}

/// Parses `x::y/len`; host bits are cleared.
impl FromStr for Ipv6Prefix {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = split_prefix_text(s)?;
        let addr = a.parse().map_err(|_| ParseError(s.to_owned()))?;
        Ipv6Prefix::new(addr, l).ok_or_else(|| ParseError(s.to_owned()))
    }
}

impl FromStr for Prefix {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = split_prefix_text(s)?;
        let addr: IpAddr = a.parse().map_err(|_| ParseError(s.to_owned()))?;
        Prefix::new(addr, l).ok_or_else(|| ParseError(s.to_owned()))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Ipv4Prefix {}
    impl Sealed for super::Ipv6Prefix {}
}

/// A prefix type that has an NLRI encoding: [`Ipv4Prefix`] or [`Ipv6Prefix`].
pub trait NlriPrefix: sealed::Sealed + Copy + Eq + std::hash::Hash + fmt::Debug {
    /// The address family this prefix belongs to.
    const AFI: Afi;
    /// The longest valid prefix length.
    const MAX_LEN: u8;

    /// Decode one prefix from the front of `buf`, returning it and the rest.
    fn read(buf: &[u8]) -> Result<(Self, &[u8]), DecodeError>;

    /// Octets this prefix takes on the wire (1 + ceil(len / 8)).
    fn wire_len(&self) -> usize;

    /// Append the NLRI encoding.
    fn write(&self, out: &mut Vec<u8>);
}

#[inline]
fn octets_for(len: u8) -> usize {
    usize::from(len).div_ceil(8)
}

#[inline]
fn read_raw<const N: usize>(buf: &[u8], max_len: u8) -> Result<(u8, [u8; N], &[u8]), DecodeError> {
    let (&len, rest) = buf
        .split_first()
        .ok_or_else(|| DecodeError::new(ErrorKind::InvalidNetworkField, "prefix truncated"))?;
    if len > max_len {
        return Err(DecodeError::new(
            ErrorKind::InvalidNetworkField,
            "prefix length too long",
        ));
    }
    let n = octets_for(len);
    let (bytes, rest) = rest
        .split_at_checked(n)
        .ok_or_else(|| DecodeError::new(ErrorKind::InvalidNetworkField, "prefix truncated"))?;
    let mut addr = [0u8; N];
    if let Some(dst) = addr.get_mut(..n) {
        dst.copy_from_slice(bytes);
    }
    Ok((len, addr, rest))
}

impl NlriPrefix for Ipv4Prefix {
    const AFI: Afi = Afi::IPV4;
    const MAX_LEN: u8 = 32;

    #[inline]
    fn read(buf: &[u8]) -> Result<(Self, &[u8]), DecodeError> {
        let (len, addr, rest) = read_raw::<4>(buf, Self::MAX_LEN)?;
        let addr = mask_v4(u32::from_be_bytes(addr), len).into();
        Ok((Ipv4Prefix { addr, len }, rest))
    }

    #[inline]
    fn wire_len(&self) -> usize {
        octets_for(self.len).saturating_add(1)
    }

    #[inline]
    fn write(&self, out: &mut Vec<u8>) {
        out.push(self.len);
        let octets = self.addr.octets();
        out.extend_from_slice(octets.get(..octets_for(self.len)).unwrap_or(&octets));
    }
}

impl NlriPrefix for Ipv6Prefix {
    const AFI: Afi = Afi::IPV6;
    const MAX_LEN: u8 = 128;

    #[inline]
    fn read(buf: &[u8]) -> Result<(Self, &[u8]), DecodeError> {
        let (len, addr, rest) = read_raw::<16>(buf, Self::MAX_LEN)?;
        let addr = mask_v6(u128::from_be_bytes(addr), len).into();
        Ok((Ipv6Prefix { addr, len }, rest))
    }

    #[inline]
    fn wire_len(&self) -> usize {
        octets_for(self.len).saturating_add(1)
    }

    #[inline]
    fn write(&self, out: &mut Vec<u8>) {
        out.push(self.len);
        let octets = self.addr.octets();
        out.extend_from_slice(octets.get(..octets_for(self.len)).unwrap_or(&octets));
    }
}

/// A zero-copy iterator over the prefixes of an NLRI field (or withdrawn-routes field).
///
/// Yields `Err` once, at the first malformed prefix, and then stops.
#[derive(Debug, Clone)]
pub struct NlriIter<'a, P> {
    buf: &'a [u8],
    _p: PhantomData<P>,
}

impl<'a, P: NlriPrefix> NlriIter<'a, P> {
    pub fn new(buf: &'a [u8]) -> Self {
        NlriIter {
            buf,
            _p: PhantomData,
        }
    }
}

impl<P: NlriPrefix> Iterator for NlriIter<'_, P> {
    type Item = Result<P, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        match P::read(self.buf) {
            Ok((p, rest)) => {
                self.buf = rest;
                Some(Ok(p))
            }
            Err(e) => {
                self.buf = &[];
                Some(Err(e))
            }
        }
    }
}

/// Decode a whole NLRI field into a vector sized exactly (one validating pass counts the
/// prefixes, so the vector is allocated once).
pub fn decode_nlri<P: NlriPrefix>(buf: &[u8]) -> Result<Vec<P>, DecodeError> {
    let count = count_nlri::<P>(buf)?;
    let mut out = Vec::with_capacity(count);
    for p in NlriIter::<P>::new(buf) {
        out.push(p?);
    }
    Ok(out)
}

/// Count the prefixes of an NLRI field, checking every length on the way.
pub fn count_nlri<P: NlriPrefix>(mut buf: &[u8]) -> Result<usize, DecodeError> {
    let mut count = 0usize;
    while let Some((&len, rest)) = buf.split_first() {
        if len > P::MAX_LEN {
            return Err(DecodeError::new(
                ErrorKind::InvalidNetworkField,
                "prefix length too long",
            ));
        }
        buf = rest
            .get(octets_for(len)..)
            .ok_or_else(|| DecodeError::new(ErrorKind::InvalidNetworkField, "prefix truncated"))?;
        count = count.saturating_add(1);
    }
    Ok(count)
}

/// Append the NLRI encoding of every prefix.
pub fn encode_nlri<'a, P: NlriPrefix + 'a>(
    prefixes: impl IntoIterator<Item = &'a P>,
    out: &mut Vec<u8>,
) {
    for p in prefixes {
        p.write(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> Ipv4Prefix {
        s.parse().unwrap()
    }

    #[test]
    fn constructors_clear_host_bits() {
        assert_eq!(v4("10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert_eq!(v4("10.1.2.3/32").to_string(), "10.1.2.3/32");
        assert_eq!(v4("10.1.2.3/0").to_string(), "0.0.0.0/0");
        assert!(Ipv4Prefix::new(Ipv4Addr::LOCALHOST, 33).is_none());
        let p: Ipv6Prefix = "2001:db8::1/64".parse().unwrap();
        assert_eq!(p.to_string(), "2001:db8::/64");
        assert!(Ipv6Prefix::new(Ipv6Addr::LOCALHOST, 129).is_none());
        assert!("10.0.0.0".parse::<Ipv4Prefix>().is_err());
        assert!(v4("10.0.0.0/8").contains(&v4("10.1.0.0/16")));
        assert!(!v4("10.1.0.0/16").contains(&v4("10.0.0.0/8")));
    }

    #[test]
    fn encodes_minimal_octets() {
        let mut out = Vec::new();
        encode_nlri(
            &[v4("10.0.0.0/8"), v4("192.168.1.64/26"), v4("0.0.0.0/0")],
            &mut out,
        );
        assert_eq!(out, [8, 10, 26, 192, 168, 1, 64, 0]);
    }

    #[test]
    fn decodes_and_masks_trailing_host_bits() {
        // 10.255/9: the bits after the ninth are set on the wire and must be cleared.
        let got = decode_nlri::<Ipv4Prefix>(&[9, 10, 255, 24, 1, 2, 3]).unwrap();
        assert_eq!(got, [v4("10.128.0.0/9"), v4("1.2.3.0/24")]);
    }

    #[test]
    fn ipv4_prefix_length_33_is_an_invalid_network_field() {
        let e = decode_nlri::<Ipv4Prefix>(&[33, 1, 2, 3, 4, 5]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidNetworkField);
        // 249 and up overflowed u8 arithmetic in zettabgp; here it is the same error.
        let e = decode_nlri::<Ipv4Prefix>(&[255]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidNetworkField);
        // IPv6 allows up to 128.
        assert!(decode_nlri::<Ipv6Prefix>(&[128; 17]).is_ok());
        assert!(decode_nlri::<Ipv6Prefix>(&[129; 18]).is_err());
    }

    #[test]
    fn truncated_prefix_is_an_error() {
        let e = decode_nlri::<Ipv4Prefix>(&[24, 10, 0]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidNetworkField);
        assert_eq!(
            count_nlri::<Ipv4Prefix>(&[24, 10, 0]).unwrap_err().detail,
            "prefix truncated"
        );
    }

    #[test]
    fn iterator_stops_after_the_first_error() {
        let mut it = NlriIter::<Ipv4Prefix>::new(&[8, 10, 40, 1, 8, 11]);
        assert_eq!(it.next(), Some(Ok(v4("10.0.0.0/8"))));
        assert!(matches!(it.next(), Some(Err(_))));
        assert_eq!(it.next(), None);
    }

    #[test]
    fn ipv6_round_trip() {
        let ps: Vec<Ipv6Prefix> = [
            "2001:db8::/32",
            "::/0",
            "fd00:1:2:3::/64",
            "2001:db8::1/128",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let mut out = Vec::new();
        encode_nlri(&ps, &mut out);
        assert_eq!(
            out.len(),
            ps.iter().map(NlriPrefix::wire_len).sum::<usize>()
        );
        assert_eq!(decode_nlri::<Ipv6Prefix>(&out).unwrap(), ps);
    }
}
