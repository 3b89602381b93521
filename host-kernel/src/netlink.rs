//! The netlink error both clients report, and the decoding of the kernel's refusals: the
//! errno of an `NLMSG_ERROR` and, when the socket asked for extended ACKs, the kernel's own
//! explanation ("Nexthop device is not up"), which tells an operator far more than the errno.

use std::io;

/// `NLM_F_CAPPED` on an `NLMSG_ERROR`: the echoed request is its header only.
const NLM_F_CAPPED: u16 = 0x100;
/// `NLM_F_ACK_TLVS` on an `NLMSG_ERROR`: extended-ACK attributes follow the echoed request.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `NLMSGERR_ATTR_MSG`: the extended ACK's text.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// A netlink message header.
const HDR: usize = 16;

/// What can go wrong talking rtnetlink, for every client of ours.
#[derive(Debug, thiserror::Error)]
pub enum NlError {
    #[error(
        "cannot open a netlink socket: {0} (run as root, or with CAP_NET_ADMIN in this network namespace)"
    )]
    Open(io::Error),
    #[error("netlink I/O failed: {0}")]
    Io(io::Error),
    #[error(
        "the kernel's answers overflowed the netlink receive buffer: what happened is unknown until the next full resync"
    )]
    Overrun,
    #[error("the kernel changed the table during a dump; try again")]
    DumpInterrupted,
    #[error("{what}: {error}")]
    Refused { what: String, error: Nlmsgerr },
    #[error("cannot read the kernel's answer to {what}: {reason}")]
    Decode { what: String, reason: String },
    #[error(
        "kernel has no {feature} support (module {module}): {consequence} (load the module with `modprobe {module}`, or run a kernel built with it)"
    )]
    Missing {
        feature: &'static str,
        module: &'static str,
        consequence: &'static str,
    },
}

impl NlError {
    /// The errno the kernel refused with, when it refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NlError::Refused { error, .. } => Some(error.errno),
            _ => None,
        }
    }
}

/// The kernel's refusal of one request: errno and, when it says more, its extended message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nlmsgerr {
    /// Positive (`libc::ENOENT`, not the negative code on the wire).
    pub errno: i32,
    /// The extended ACK's text; empty when the kernel gave none.
    pub message: String,
}

impl std::fmt::Display for Nlmsgerr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let os = io::Error::from_raw_os_error(self.errno);
        if self.message.is_empty() {
            write!(f, "{os}")
        } else {
            write!(f, "{os}: {}", self.message)
        }
    }
}

impl Nlmsgerr {
    /// An `NLMSG_ERROR`'s payload (what follows its netlink header) with the header's `flags`:
    /// `None` for an ACK (code 0) or a payload too short to hold a code, the refusal otherwise.
    /// Attributes that overrun the payload end the walk; nothing is read past it.
    pub fn parse(flags: u16, payload: &[u8]) -> Option<Nlmsgerr> {
        let code = i32::from_ne_bytes(payload.get(0..4)?.try_into().ok()?);
        if code == 0 {
            return None;
        }
        let mut message = String::new();
        if flags & NLM_F_ACK_TLVS != 0 {
            // After the code: the request as echoed (its header only when capped), then the
            // attributes.
            let echoed = if flags & NLM_F_CAPPED != 0 {
                HDR
            } else {
                payload.get(4..8).map_or(HDR, |b| {
                    u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize
                })
            };
            let mut off = (4 + echoed + 3) & !3;
            while let Some(h) = payload.get(off..off + 4) {
                let len = u16::from_ne_bytes([h[0], h[1]]) as usize;
                let kind = u16::from_ne_bytes([h[2], h[3]]) & 0x3fff;
                if len < 4 || off + len > payload.len() {
                    break;
                }
                if kind == NLMSGERR_ATTR_MSG {
                    let v = &payload[off + 4..off + len];
                    let text = v.split(|b| *b == 0).next().unwrap_or(v);
                    message = String::from_utf8_lossy(text).into_owned();
                }
                off += (len + 3) & !3;
            }
        }
        Some(Nlmsgerr {
            errno: code.saturating_neg(),
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `NLMSG_ERROR` payload: `code`, a capped echoed header, and one message attribute.
    fn refusal(code: i32, text: &[u8], nla_len: u16) -> Vec<u8> {
        let mut p = code.to_ne_bytes().to_vec();
        p.extend_from_slice(&[16, 0, 0, 0, 24, 0, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&nla_len.to_ne_bytes());
        p.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        p.extend_from_slice(text);
        p
    }

    #[test]
    fn refusals_carry_the_kernels_message() {
        let text = b"Nexthop has invalid gateway\0";
        let p = refusal(-libc::ENETUNREACH, text, (4 + text.len()) as u16);
        let e = Nlmsgerr::parse(NLM_F_ACK_TLVS | NLM_F_CAPPED, &p).unwrap();
        assert_eq!(e.errno, libc::ENETUNREACH);
        assert_eq!(e.message, "Nexthop has invalid gateway");
        assert!(
            e.to_string().ends_with(": Nexthop has invalid gateway"),
            "{e}"
        );
        // Without NLM_F_ACK_TLVS the bytes after the echoed request are not attributes.
        let e = Nlmsgerr::parse(NLM_F_CAPPED, &p).unwrap();
        assert_eq!((e.errno, e.message.as_str()), (libc::ENETUNREACH, ""));
        // Not capped: the echoed request's own length says where the attributes start.
        let e = Nlmsgerr::parse(NLM_F_ACK_TLVS, &p).unwrap();
        assert_eq!(e.message, "Nexthop has invalid gateway");
    }

    #[test]
    fn acks_and_bad_payloads_are_not_refusals() {
        assert_eq!(Nlmsgerr::parse(0, &0i32.to_ne_bytes()), None);
        assert_eq!(Nlmsgerr::parse(NLM_F_ACK_TLVS, &[1, 2]), None);
        // An attribute claiming more bytes than there are is ignored, not read past.
        let p = refusal(-libc::EEXIST, b"File exists", 200);
        let e = Nlmsgerr::parse(NLM_F_ACK_TLVS | NLM_F_CAPPED, &p).unwrap();
        assert_eq!((e.errno, e.message.as_str()), (libc::EEXIST, ""));
    }

    #[test]
    fn errors_name_the_request_and_what_to_do() {
        let e = NlError::Refused {
            what: "add route 10.0.0.0/24".into(),
            error: Nlmsgerr {
                errno: libc::ENETDOWN,
                message: "Nexthop device is not up".into(),
            },
        };
        assert!(e.to_string().starts_with("add route 10.0.0.0/24: "), "{e}");
        assert!(e.to_string().ends_with("Nexthop device is not up"), "{e}");
        assert_eq!(e.errno(), Some(libc::ENETDOWN));
        assert_eq!(NlError::Overrun.errno(), None);
        let e = NlError::Open(io::Error::from_raw_os_error(libc::EPERM));
        assert!(e.to_string().contains("CAP_NET_ADMIN"), "{e}");
        let e = NlError::Missing {
            feature: "ipip",
            module: "ipip",
            consequence: "pools in IPIP mode cannot be programmed",
        };
        assert!(e.to_string().contains("modprobe ipip"), "{e}");
    }
}
