//! Socket options of BGP transport: TCP MD5 signatures (RFC 2385), TTL for multihop eBGP,
//! and the minimum TTL of GTSM (RFC 5082). Thin, checked wrappers over `setsockopt`; the
//! session and the speaker decide when to call them.
//!
//! MD5 keys live on a socket per peer address: on the listening socket (accepted connections
//! inherit them) and on each connecting socket. A segment without the right signature never
//! reaches us, so a wrong password shows only as a connection that does not come up.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A peer's password: kept out of logs and listings.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// `None` for an empty password (no signatures).
    pub fn new(s: &str) -> Result<Option<Self>, String> {
        if s.is_empty() {
            return Ok(None);
        }
        if s.len() > TCP_MD5SIG_MAXKEYLEN {
            return Err(format!(
                "a TCP MD5 password is at most {TCP_MD5SIG_MAXKEYLEN} bytes (Linux's limit)"
            ));
        }
        Ok(Some(Password(s.to_owned())))
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("*****")
    }
}

/// How a peer's transport is secured and how far away it may be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transport {
    pub password: Option<Password>,
    /// GTSM: the peer is at most this many hops away (we send TTL 255, accept ≥ 256 - hops).
    pub ttl_security_hops: Option<u8>,
    /// eBGP multihop: the TTL we send (ignored with GTSM).
    pub multihop_ttl: Option<u8>,
}

impl Transport {
    /// The TTL to send and the minimum TTL to accept, if either is set.
    pub fn ttls(&self) -> (Option<u8>, Option<u8>) {
        match self.ttl_security_hops {
            Some(h) => (Some(255), Some(255u8.saturating_sub(h.saturating_sub(1)))),
            None => (self.multihop_ttl, None),
        }
    }

    /// Everything but the MD5 key on `fd` (the key goes on before connecting, see
    /// [`set_md5`]).
    pub fn apply_ttls(&self, fd: BorrowedFd<'_>, v6: bool) -> io::Result<()> {
        let (ttl, min) = self.ttls();
        if let Some(t) = ttl {
            set_int(
                fd,
                ip_level(v6),
                if v6 {
                    libc::IPV6_UNICAST_HOPS
                } else {
                    libc::IP_TTL
                },
                t.into(),
            )?;
        }
        if let Some(m) = min {
            set_int(
                fd,
                ip_level(v6),
                if v6 {
                    libc::IPV6_MINHOPCOUNT
                } else {
                    libc::IP_MINTTL
                },
                m.into(),
            )?;
        }
        Ok(())
    }
}

/// Keep each SYN a listener receives, so that [`syn_ttl`] can tell how far away the
/// connecting peer is before a byte of its data is read (GTSM on a listener shared by peers
/// with different settings).
pub fn save_syns(fd: BorrowedFd<'_>) -> io::Result<()> {
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_SAVE_SYN, 1)
}

/// An IPv6 socket that takes IPv6 only (IPv4 has its own listener, whatever the host's
/// `bindv6only` default).
pub fn set_v6only(fd: BorrowedFd<'_>) -> io::Result<()> {
    set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)
}

/// The TTL (hop limit) of the SYN that opened an accepted connection, if it was saved.
pub fn syn_ttl(fd: BorrowedFd<'_>) -> io::Result<Option<u8>> {
    let mut buf = [0u8; 512];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `buf` and updates `len`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_SAVED_SYN,
            buf.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let headers = buf.get(..len as usize).unwrap_or_default();
    // The saved SYN starts with its IP header: IPv4 TTL at byte 8, IPv6 hop limit at byte 7.
    Ok(match headers.first().map(|b| b >> 4) {
        Some(4) => headers.get(8).copied(),
        Some(6) => headers.get(7).copied(),
        _ => None,
    })
}

fn ip_level(v6: bool) -> libc::c_int {
    if v6 {
        libc::IPPROTO_IPV6
    } else {
        libc::IPPROTO_IP
    }
}

const TCP_MD5SIG_MAXKEYLEN: usize = 80;

/// `struct tcp_md5sig` of linux/tcp.h.
#[repr(C)]
struct TcpMd5Sig {
    addr: libc::sockaddr_storage,
    flags: u8,
    prefixlen: u8,
    keylen: u16,
    ifindex: libc::c_int,
    key: [u8; TCP_MD5SIG_MAXKEYLEN],
}

/// Sets (or with `None`, removes) the MD5 key for segments to and from `peer` on `fd`.
pub fn set_md5(fd: BorrowedFd<'_>, peer: IpAddr, key: Option<&[u8]>) -> io::Result<()> {
    let key = key.unwrap_or_default();
    if key.len() > TCP_MD5SIG_MAXKEYLEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "TCP MD5 key longer than 80 bytes",
        ));
    }
    // SAFETY: all-zero is a valid `sockaddr_storage` and a valid `TcpMd5Sig`.
    let mut sig: TcpMd5Sig = unsafe { std::mem::zeroed() };
    write_addr(&mut sig.addr, peer);
    sig.keylen = key.len() as u16;
    sig.key[..key.len()].copy_from_slice(key);
    // SAFETY: `sig` is a properly laid out `struct tcp_md5sig` that outlives the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            (&raw const sig).cast(),
            std::mem::size_of::<TcpMd5Sig>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `peer` as a `sockaddr_in` / `sockaddr_in6` in `storage`.
pub(crate) fn write_addr(storage: &mut libc::sockaddr_storage, peer: IpAddr) {
    match peer {
        IpAddr::V4(a) => {
            // SAFETY: `sockaddr_storage` is large and aligned enough for any socket address.
            let sin = unsafe {
                &mut *(storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.octets());
        }
        IpAddr::V6(a) => {
            // SAFETY: as above.
            let sin6 = unsafe {
                &mut *(storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_addr.s6_addr = a.octets();
        }
    }
}

pub(crate) fn set_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `v` is a c_int that outlives the call; the length says so.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&raw const v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gtsm_sends_255_and_accepts_only_from_close_enough() {
        let t = Transport {
            ttl_security_hops: Some(1),
            multihop_ttl: Some(5),
            ..Default::default()
        };
        assert_eq!(t.ttls(), (Some(255), Some(255)));
        let t = Transport {
            ttl_security_hops: Some(3),
            ..Default::default()
        };
        assert_eq!(t.ttls(), (Some(255), Some(253)));
        let t = Transport {
            multihop_ttl: Some(5),
            ..Default::default()
        };
        assert_eq!(t.ttls(), (Some(5), None));
        assert_eq!(Transport::default().ttls(), (None, None));
    }

    #[test]
    fn passwords_stay_out_of_debug_output_and_respect_the_kernel_limit() {
        let p = Password::new("s3cret").unwrap().unwrap();
        assert_eq!(format!("{p:?}"), "*****");
        assert!(Password::new("").unwrap().is_none());
        assert!(Password::new(&"x".repeat(81)).is_err());
    }

    #[test]
    fn keys_and_ttls_are_accepted_by_the_kernel() {
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        use std::os::fd::AsFd;
        set_md5(s.as_fd(), "127.0.0.2".parse().unwrap(), Some(b"secret")).unwrap();
        set_md5(s.as_fd(), "127.0.0.2".parse().unwrap(), None).unwrap();
        let t = Transport {
            ttl_security_hops: Some(2),
            ..Default::default()
        };
        t.apply_ttls(s.as_fd(), false).unwrap();
        assert!(set_md5(s.as_fd(), "127.0.0.2".parse().unwrap(), Some(&[0; 81])).is_err());
    }
}
