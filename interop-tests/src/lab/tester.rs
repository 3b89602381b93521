//! A raw BGP test peer of ours ("Tester"): the only speaker in the lab that sends broken
//! messages on purpose. It is a blocking TCP connection, over IPv4 or IPv6, from a chosen
//! local address (so one namespace can play many configured peers) plus builders for raw
//! messages and capabilities (the extended next hop one of RFC 8950 included); it checks
//! nothing itself: the tests decide what bgpd's answer should be.
//!
//! Boundaries: no BGP state machine here (the tests send OPEN and KEEPALIVE themselves, or
//! call [`Tester::establish`]); what comes back is split into (type, body) and, for
//! NOTIFICATIONs, into code, subcode and data, without the codec under test.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Message type codes.
pub const OPEN: u8 = 1;
pub const UPDATE: u8 = 2;
pub const NOTIFICATION: u8 = 3;
pub const KEEPALIVE: u8 = 4;
pub const ROUTE_REFRESH: u8 = 5;

/// AS_TRANS (RFC 6793).
pub const AS_TRANS: u16 = 23456;

/// A NOTIFICATION as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notified {
    pub code: u8,
    pub subcode: u8,
    pub data: Vec<u8>,
}

impl Notified {
    /// "c/s", plus " data HEX" when `with_data`.
    pub fn show(&self, with_data: bool) -> String {
        if with_data {
            format!(
                "NOTIFICATION {}/{} data {}",
                self.code,
                self.subcode,
                hex(&self.data)
            )
        } else {
            format!("NOTIFICATION {}/{}", self.code, self.subcode)
        }
    }
}

/// Lower-case hex, no separators ("" for nothing).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One TCP connection to bgpd.
pub struct Tester {
    pub s: TcpStream,
    /// The last [`Tester::read`] ended by the read timeout, not by the connection ending.
    pub timed_out: bool,
}

impl Tester {
    /// Connects from `local` (an address of the calling thread's namespace) to `remote`:179,
    /// over IPv4 or IPv6 (both addresses of one family).
    pub fn connect_from(local: impl Into<IpAddr>, remote: impl Into<IpAddr>) -> io::Result<Tester> {
        let (local, remote) = (local.into(), remote.into());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let s = rt.block_on(async {
            let sock = if local.is_ipv6() {
                tokio::net::TcpSocket::new_v6()?
            } else {
                tokio::net::TcpSocket::new_v4()?
            };
            sock.bind(SocketAddr::new(local, 0))?;
            let s = sock.connect(SocketAddr::new(remote, 179)).await?;
            s.into_std()
        })?;
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(8)))?;
        Ok(Tester {
            s,
            timed_out: false,
        })
    }

    pub fn send(&mut self, bytes: &[u8]) {
        // A write after bgpd closed shows up as EOF on the next read.
        let _ = self.s.write_all(bytes);
    }

    /// The next message as (type, body); `None` at EOF, on a reset or after the read timeout.
    pub fn read(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 19];
        let r = self.s.read_exact(&mut head).and_then(|()| {
            let len = usize::from(u16::from_be_bytes([head[16], head[17]]));
            let mut body = vec![0; len.saturating_sub(19)];
            self.s.read_exact(&mut body).map(|()| body)
        });
        match r {
            Ok(body) => Some((head[18], body)),
            Err(e) => {
                self.timed_out = matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                );
                None
            }
        }
    }

    /// The NOTIFICATION bgpd sends, skipping what comes before it; `None` if the connection
    /// ends (or stays silent) without one.
    pub fn notification(&mut self) -> Option<Notified> {
        loop {
            let (ty, body) = self.read()?;
            if ty == NOTIFICATION {
                return Some(Notified {
                    code: body.first().copied().unwrap_or(0),
                    subcode: body.get(1).copied().unwrap_or(0),
                    data: body.get(2..).unwrap_or_default().to_vec(),
                });
            }
        }
    }

    /// Sends `open` and a KEEPALIVE and waits for bgpd's OPEN and KEEPALIVE: `Ok` once the
    /// session is Established, else the NOTIFICATION (or `None`: closed without one).
    pub fn establish(&mut self, open: &[u8]) -> Result<(), Option<Notified>> {
        let mut out = open.to_vec();
        out.extend_from_slice(&keepalive());
        self.send(&out);
        let mut got_open = false;
        loop {
            match self.read() {
                Some((OPEN, _)) => got_open = true,
                Some((KEEPALIVE, _)) if got_open => return Ok(()),
                Some((NOTIFICATION, body)) => {
                    return Err(Some(Notified {
                        code: body.first().copied().unwrap_or(0),
                        subcode: body.get(1).copied().unwrap_or(0),
                        data: body.get(2..).unwrap_or_default().to_vec(),
                    }));
                }
                Some(_) => {}
                None => return Err(None),
            }
        }
    }

    /// bgpd ends the connection (possibly after other messages) without a NOTIFICATION
    /// within the read timeout; else what it did instead.
    pub fn closed_silently(&mut self) -> Result<(), String> {
        loop {
            match self.read() {
                None if self.timed_out => return Err("still open after the read timeout".into()),
                None => return Ok(()),
                Some((NOTIFICATION, body)) => {
                    return Err(format!("answered with NOTIFICATION {}", hex(&body)));
                }
                Some(_) => {}
            }
        }
    }
}

/// A whole message: header (marker, length, type) and `body`.
pub fn msg(ty: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
    m.push(ty);
    m.extend_from_slice(body);
    m
}

pub fn keepalive() -> Vec<u8> {
    msg(KEEPALIVE, &[])
}

/// An OPEN body's fixed fields followed by `params` (the optional parameters field with its
/// length octet(s), as sent).
pub fn open_with(version: u8, my_as: u16, hold: u16, id: Ipv4Addr, params: &[u8]) -> Vec<u8> {
    let mut b = vec![version];
    b.extend_from_slice(&my_as.to_be_bytes());
    b.extend_from_slice(&hold.to_be_bytes());
    b.extend_from_slice(&id.octets());
    b.extend_from_slice(params);
    msg(OPEN, &b)
}

/// The optional parameters field (length octet included) holding one capabilities parameter
/// with `caps` (each capability as code, length, value).
pub fn caps_param(caps: &[u8]) -> Vec<u8> {
    let mut p = vec![(caps.len() + 2) as u8, 2, caps.len() as u8];
    p.extend_from_slice(caps);
    p
}

/// Capabilities: multiprotocol IPv4 unicast and the 4-octet AS `asn`.
pub fn std_caps(asn: u32) -> Vec<u8> {
    let mut c = vec![1, 4, 0, 1, 0, 1, 65, 4];
    c.extend_from_slice(&asn.to_be_bytes());
    c
}

/// The extended next hop capability (RFC 8950 §3) with these (NLRI AFI, NLRI SAFI, next hop
/// AFI) tuples; the SAFI takes two octets here.
pub fn ext_next_hop_cap(tuples: &[(u16, u16, u16)]) -> Vec<u8> {
    let mut c = vec![5, (tuples.len() * 6) as u8];
    for (afi, safi, nh_afi) in tuples {
        for v in [afi, safi, nh_afi] {
            c.extend_from_slice(&v.to_be_bytes());
        }
    }
    c
}

/// The tuple a speaker offers to take IPv4 unicast routes with IPv6 next hops.
pub const IPV4_OVER_IPV6: (u16, u16, u16) = (1, 1, 2);

/// An MP_REACH_NLRI value (RFC 4760 §3): AFI, SAFI, next hop length and `next_hop` as given
/// (any length, for malformed ones), the reserved octet, `nlri`.
pub fn mp_reach_value(afi: u16, safi: u8, next_hop: &[u8], nlri: &[u8]) -> Vec<u8> {
    let mut v = afi.to_be_bytes().to_vec();
    v.push(safi);
    v.push(next_hop.len() as u8);
    v.extend_from_slice(next_hop);
    v.push(0);
    v.extend_from_slice(nlri);
    v
}

/// A well-formed OPEN for `asn` (AS_TRANS in My AS when it needs 4 octets), hold time 90.
pub fn std_open(asn: u32, id: Ipv4Addr, extra_caps: &[u8]) -> Vec<u8> {
    let my_as = u16::try_from(asn).unwrap_or(AS_TRANS);
    let mut caps = std_caps(asn);
    caps.extend_from_slice(extra_caps);
    open_with(4, my_as, 90, id, &caps_param(&caps))
}

/// An UPDATE with these withdrawn routes, attributes and NLRI (lengths computed).
pub fn update(withdrawn: &[u8], attrs: &[u8], nlri: &[u8]) -> Vec<u8> {
    let mut b = (withdrawn.len() as u16).to_be_bytes().to_vec();
    b.extend_from_slice(withdrawn);
    b.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    b.extend_from_slice(attrs);
    b.extend_from_slice(nlri);
    msg(UPDATE, &b)
}

/// A NOTIFICATION message.
pub fn notification(code: u8, subcode: u8, data: &[u8]) -> Vec<u8> {
    let mut b = vec![code, subcode];
    b.extend_from_slice(data);
    msg(NOTIFICATION, &b)
}

/// A path attribute (flags, type, one-octet length, value).
pub fn attr(flags: u8, ty: u8, value: &[u8]) -> Vec<u8> {
    let mut a = vec![flags, ty, value.len() as u8];
    a.extend_from_slice(value);
    a
}

/// ORIGIN IGP.
pub fn origin_igp() -> Vec<u8> {
    attr(0x40, 1, &[0])
}

/// AS_PATH of one AS_SEQUENCE of 4-octet ASNs (empty path for `&[]`).
pub fn as_path(asns: &[u32]) -> Vec<u8> {
    if asns.is_empty() {
        return attr(0x40, 2, &[]);
    }
    let mut v = vec![2, asns.len() as u8];
    for a in asns {
        v.extend_from_slice(&a.to_be_bytes());
    }
    attr(0x40, 2, &v)
}

pub fn next_hop(a: Ipv4Addr) -> Vec<u8> {
    attr(0x40, 3, &a.octets())
}

/// `a.b.c.0/24` as NLRI.
pub fn nlri24(a: u8, b: u8, c: u8) -> Vec<u8> {
    vec![24, a, b, c]
}
