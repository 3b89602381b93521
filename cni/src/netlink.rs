//! A small blocking rtnetlink client: requests built with netlink-packet-route, sent on one
//! socket, answered in order. Batches go out in one `send` with an ACK asked for each message,
//! so the whole pod-side configuration is one round trip. Blocking is deliberate: a plugin does
//! a handful of requests and exits, and the async `rtnetlink` handle would add a connection
//! task per socket for nothing.
//!
//! Why this file is long: the client (batches, dumps, error decoding) and the builders of every
//! request the plugin sends (veth, addresses, routes, neighbours) share its message helpers.
//!
//! A socket belongs to the network namespace of the thread that opened it, for its whole life:
//! open one per namespace (see `netns`).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};

use host_kernel::netlink::{NlError, Nlmsgerr};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

/// One request of a batch, with what it does in words (for errors).
pub struct Request {
    pub what: String,
    pub message: RouteNetlinkMessage,
    pub flags: u16,
}

/// The facts about a link the plugins look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Vec<u8>,
    pub mtu: u32,
    pub up: bool,
    /// For a veth: the peer's index (in the peer's namespace).
    pub peer_index: Option<u32>,
    pub kind: Option<String>,
}

/// An address as dumped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addr {
    pub index: u32,
    pub address: IpAddr,
    pub prefix_len: u8,
}

/// A route as dumped (main-table unicast routes are what CHECK looks at).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteEntry {
    pub dst: IpAddr,
    pub dst_len: u8,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
    pub scope: RouteScope,
}

pub struct Netlink {
    sock: Socket,
    seq: u32,
    tx: Vec<u8>,
    rx: Vec<u8>,
}

const RECV_BYTES: usize = 64 * 1024;

impl Netlink {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Netlink, NlError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(NlError::Open)?;
        sock.bind_auto().map_err(NlError::Open)?;
        // Refusals carry the kernel's own explanation ("Nexthop device is not up").
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        // A kernel that never answers must not hang the runtime.
        let tv = libc::timeval {
            tv_sec: 10,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a valid timeval on our own socket.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        Ok(Netlink {
            sock,
            seq: 0,
            tx: Vec::with_capacity(4096),
            rx: vec![0; RECV_BYTES],
        })
    }

    fn push(&mut self, message: RouteNetlinkMessage, flags: u16) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        m.finalize();
        let start = self.tx.len();
        self.tx.resize(start + m.buffer_len(), 0);
        m.serialize(&mut self.tx[start..]);
        self.seq
    }

    fn send(&mut self) -> Result<(), NlError> {
        let r = self.sock.send(&self.tx, 0);
        self.tx.clear();
        r.map(|_| ()).map_err(NlError::Io)
    }

    /// Reads one datagram; its messages as (sequence, payload or error).
    fn receive(&mut self, what: &str) -> Result<Vec<(u32, Answer)>, NlError> {
        let n = loop {
            // SAFETY: receiving into our own buffer on our own socket.
            let n = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    self.rx.as_mut_ptr() as *mut libc::c_void,
                    self.rx.len(),
                    0,
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(NlError::Io(e));
            }
        };
        let mut out = Vec::new();
        let mut off = 0;
        while off + 16 <= n {
            let len =
                u32::from_ne_bytes(self.rx[off..off + 4].try_into().unwrap_or([0; 4])) as usize;
            if len < 16 || off + len > n {
                return Err(NlError::Decode {
                    what: what.to_owned(),
                    reason: format!("a message of {len} bytes at offset {off} of {n}"),
                });
            }
            let bytes = &self.rx[off..off + len];
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map_err(|e| {
                NlError::Decode {
                    what: what.to_owned(),
                    reason: e.to_string(),
                }
            })?;
            let seq = msg.header.sequence_number;
            let answer = match msg.payload {
                // The shared decoding, from the bytes after the header: it reads the
                // extended ACK's text where the header's flags say there is one.
                NetlinkPayload::Error(_) => match Nlmsgerr::parse(msg.header.flags, &bytes[16..]) {
                    None => Answer::Ack,
                    Some(e) => Answer::Refused(e),
                },
                NetlinkPayload::Done(_) => Answer::Done,
                NetlinkPayload::InnerMessage(m) => Answer::Message(m),
                _ => Answer::Other,
            };
            out.push((seq, answer));
            off += (len + 3) & !3;
        }
        Ok(out)
    }

    /// Sends every request in one datagram and waits for each one's ACK. All are tried (the
    /// kernel handles each message on its own); the first refusal is returned.
    pub fn apply(&mut self, requests: Vec<Request>) -> Result<(), NlError> {
        let mut pending: Vec<(u32, String)> = Vec::with_capacity(requests.len());
        for r in requests {
            let seq = self.push(r.message, r.flags | NLM_F_REQUEST | NLM_F_ACK);
            pending.push((seq, r.what));
        }
        self.send()?;
        let mut first_error = None;
        while !pending.is_empty() {
            let what = pending[0].1.clone();
            for (seq, answer) in self.receive(&what)? {
                let Some(pos) = pending.iter().position(|(s, _)| *s == seq) else {
                    continue;
                };
                let (_, what) = pending.remove(pos);
                if let Answer::Refused(error) = answer
                    && first_error.is_none()
                {
                    first_error = Some(NlError::Refused { what, error });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One request that is answered with one message (a GET by name or index). None when the
    /// kernel says the object does not exist (ENODEV, ENOENT, ESRCH).
    pub fn get(
        &mut self,
        what: &str,
        message: RouteNetlinkMessage,
    ) -> Result<Option<RouteNetlinkMessage>, NlError> {
        let seq = self.push(message, NLM_F_REQUEST);
        self.send()?;
        loop {
            for (s, answer) in self.receive(what)? {
                if s != seq {
                    continue;
                }
                return match answer {
                    Answer::Message(m) => Ok(Some(m)),
                    Answer::Refused(e)
                        if matches!(e.errno, libc::ENODEV | libc::ENOENT | libc::ESRCH) =>
                    {
                        Ok(None)
                    }
                    Answer::Refused(error) => Err(NlError::Refused {
                        what: what.to_owned(),
                        error,
                    }),
                    _ => Err(NlError::Decode {
                        what: what.to_owned(),
                        reason: "no answer message".into(),
                    }),
                };
            }
        }
    }

    /// A dump: every message until DONE.
    pub fn dump(
        &mut self,
        what: &str,
        message: RouteNetlinkMessage,
    ) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        let seq = self.push(message, NLM_F_REQUEST | NLM_F_DUMP);
        self.send()?;
        let mut out = Vec::new();
        loop {
            for (s, answer) in self.receive(what)? {
                if s != seq {
                    continue;
                }
                match answer {
                    Answer::Message(m) => out.push(m),
                    Answer::Done => return Ok(out),
                    Answer::Refused(error) => {
                        return Err(NlError::Refused {
                            what: what.to_owned(),
                            error,
                        });
                    }
                    _ => {}
                }
            }
        }
    }

    // --- Reads -----------------------------------------------------------------------------

    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>, NlError> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_owned()));
        let what = format!("look up interface {name}");
        Ok(self
            .get(&what, RouteNetlinkMessage::GetLink(m))?
            .and_then(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link_of(&l)),
                _ => None,
            }))
    }

    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>, NlError> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        let what = format!("look up interface {index}");
        Ok(self
            .get(&what, RouteNetlinkMessage::GetLink(m))?
            .and_then(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link_of(&l)),
                _ => None,
            }))
    }

    pub fn addresses(&mut self, family: AddressFamily) -> Result<Vec<Addr>, NlError> {
        let mut m = AddressMessage::default();
        m.header.family = family;
        let list = self.dump("list addresses", RouteNetlinkMessage::GetAddress(m))?;
        Ok(list
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => {
                    let address = a.attributes.iter().find_map(|at| match at {
                        AddressAttribute::Local(ip) => Some(*ip),
                        _ => None,
                    });
                    let address = address.or_else(|| {
                        a.attributes.iter().find_map(|at| match at {
                            AddressAttribute::Address(ip) => Some(*ip),
                            _ => None,
                        })
                    })?;
                    Some(Addr {
                        index: a.header.index,
                        address,
                        prefix_len: a.header.prefix_len,
                    })
                }
                _ => None,
            })
            .collect())
    }

    pub fn routes(&mut self, family: AddressFamily) -> Result<Vec<RouteEntry>, NlError> {
        let mut m = RouteMessage::default();
        m.header.address_family = family;
        let list = self.dump("list routes", RouteNetlinkMessage::GetRoute(m))?;
        Ok(list
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => route_of(&r, family),
                _ => None,
            })
            .collect())
    }

    /// The interface the kernel would send to `dst` through (`ip route get`).
    pub fn route_get(&mut self, dst: IpAddr) -> Result<Option<u32>, NlError> {
        let mut m = RouteMessage::default();
        m.header.address_family = family_of(dst);
        m.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
        m.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
        let what = format!("look up the route to {dst}");
        match self.get(&what, RouteNetlinkMessage::GetRoute(m)) {
            Ok(Some(RouteNetlinkMessage::NewRoute(r))) => {
                Ok(r.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Oif(i) => Some(*i),
                    _ => None,
                }))
            }
            Ok(_) => Ok(None),
            // No route at all: nothing to learn from.
            Err(e) if matches!(e.errno(), Some(libc::ENETUNREACH | libc::EHOSTUNREACH)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

enum Answer {
    Ack,
    Refused(Nlmsgerr),
    Done,
    Message(RouteNetlinkMessage),
    Other,
}

fn link_of(l: &LinkMessage) -> Link {
    let mut link = Link {
        index: l.header.index,
        name: String::new(),
        mac: Vec::new(),
        mtu: 0,
        up: l.header.flags.contains(LinkFlags::Up),
        peer_index: None,
        kind: None,
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(m) => link.mac = m.clone(),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::Link(i) => link.peer_index = Some(*i),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        link.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    link
}

fn route_of(r: &RouteMessage, family: AddressFamily) -> Option<RouteEntry> {
    if r.header.kind != RouteType::Unicast {
        return None;
    }
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut table = u32::from(r.header.table);
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = ip_of(d),
            RouteAttribute::Gateway(g) => gateway = ip_of(g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    let dst = dst.unwrap_or(match family {
        AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    });
    Some(RouteEntry {
        dst,
        dst_len: r.header.destination_prefix_length,
        gateway,
        oif,
        table,
        scope: r.header.scope,
    })
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

pub fn family_of(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

// --- Request builders (pure: they only build messages) -------------------------------------

const CREATE: u16 = NLM_F_CREATE | NLM_F_EXCL;

/// A veth pair: `host` here with `host_mac` and up, its peer `peer` created directly in the
/// namespace `peer_netns` (down: it is configured there before it comes up), both with `mtu`.
/// Setting the MAC at creation (not after) marks it as set, so udev's MACAddressPolicy leaves
/// it alone.
pub fn create_veth(
    host: &str,
    host_mac: [u8; 6],
    mtu: u32,
    peer: &str,
    peer_netns: RawFd,
) -> Request {
    let mut peer_msg = LinkMessage::default();
    peer_msg
        .attributes
        .push(LinkAttribute::IfName(peer.to_owned()));
    peer_msg.attributes.push(LinkAttribute::Mtu(mtu));
    peer_msg.attributes.push(LinkAttribute::NetNsFd(peer_netns));
    let mut m = LinkMessage::default();
    m.header.flags = LinkFlags::Up;
    m.header.change_mask = LinkFlags::Up;
    m.attributes.push(LinkAttribute::IfName(host.to_owned()));
    m.attributes.push(LinkAttribute::Address(host_mac.to_vec()));
    m.attributes.push(LinkAttribute::Mtu(mtu));
    m.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Veth),
        LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
    ]));
    Request {
        what: format!("create veth {host} with peer {peer} in the container"),
        message: RouteNetlinkMessage::NewLink(m),
        flags: CREATE,
    }
}

pub fn set_up(index: u32, name: &str) -> Request {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m.header.flags = LinkFlags::Up;
    m.header.change_mask = LinkFlags::Up;
    Request {
        what: format!("set {name} up"),
        message: RouteNetlinkMessage::SetLink(m),
        flags: 0,
    }
}

pub fn delete_link_by_name(name: &str) -> Request {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_owned()));
    Request {
        what: format!("delete interface {name}"),
        message: RouteNetlinkMessage::DelLink(m),
        flags: 0,
    }
}

pub fn delete_link(index: u32, name: &str) -> Request {
    let mut m = LinkMessage::default();
    m.header.index = index;
    Request {
        what: format!("delete interface {name}"),
        message: RouteNetlinkMessage::DelLink(m),
        flags: 0,
    }
}

/// A host address (/32 or /128) on `index`; IPv6 without duplicate address detection.
pub fn add_address(index: u32, ifname: &str, ip: IpAddr) -> Request {
    let mut m = AddressMessage::default();
    m.header.family = family_of(ip);
    m.header.index = index;
    m.header.scope = AddressScope::Universe;
    m.header.prefix_len = if ip.is_ipv4() { 32 } else { 128 };
    if ip.is_ipv4() {
        m.attributes.push(AddressAttribute::Local(ip));
    } else {
        m.header.flags = AddressHeaderFlags::Nodad;
        m.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    m.attributes.push(AddressAttribute::Address(ip));
    Request {
        what: format!("add address {ip} to {ifname}"),
        message: RouteNetlinkMessage::NewAddress(m),
        flags: CREATE,
    }
}

/// A main-table route with protocol boot (what `ip route add` writes; routewriter adopts it).
pub fn add_route(
    dst: IpAddr,
    dst_len: u8,
    gateway: Option<IpAddr>,
    oif: u32,
    ifname: &str,
) -> Request {
    let mut m = RouteMessage::default();
    m.header = RouteHeader {
        address_family: family_of(dst),
        destination_prefix_length: dst_len,
        table: RouteHeader::RT_TABLE_MAIN,
        protocol: RouteProtocol::Boot,
        // IPv4 routes without a gateway reach a neighbour on the link; IPv6 has no link scope
        // for unicast routes.
        scope: if gateway.is_none() && dst.is_ipv4() {
            RouteScope::Link
        } else {
            RouteScope::Universe
        },
        kind: RouteType::Unicast,
        ..RouteHeader::default()
    };
    if dst_len > 0 {
        m.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    }
    if let Some(gw) = gateway {
        m.attributes
            .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
    }
    m.attributes.push(RouteAttribute::Oif(oif));
    let what = match gateway {
        Some(gw) => format!("add route {dst}/{dst_len} via {gw} dev {ifname}"),
        None => format!("add route {dst}/{dst_len} dev {ifname}"),
    };
    Request {
        what,
        message: RouteNetlinkMessage::NewRoute(m),
        flags: CREATE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(r: &Request) -> Vec<u8> {
        let mut m = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::InnerMessage(r.message.clone()),
        );
        m.finalize();
        let mut b = vec![0; m.buffer_len()];
        m.serialize(&mut b);
        b
    }

    #[test]
    fn messages_encode_and_decode_back() {
        let reqs = [
            create_veth("cali0123456789a", [0xee; 6], 1450, "eth0", 7),
            set_up(5, "eth0"),
            delete_link_by_name("eth0"),
            add_address(5, "eth0", "172.20.0.5".parse().unwrap()),
            add_address(5, "eth0", "fd00::5".parse().unwrap()),
            add_route("169.254.1.1".parse().unwrap(), 32, None, 5, "eth0"),
            add_route(
                "0.0.0.0".parse().unwrap(),
                0,
                Some("169.254.1.1".parse().unwrap()),
                5,
                "eth0",
            ),
        ];
        for r in &reqs {
            let b = bytes(r);
            let back = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&b).unwrap();
            match back.payload {
                NetlinkPayload::InnerMessage(m) => assert_eq!(m, r.message, "{}", r.what),
                other => panic!("{}: {other:?}", r.what),
            }
        }
    }

    #[test]
    fn route_scopes_and_attributes() {
        let on_link = add_route("172.20.0.5".parse().unwrap(), 32, None, 9, "cali1");
        let RouteNetlinkMessage::NewRoute(m) = &on_link.message else {
            panic!()
        };
        assert_eq!(m.header.scope, RouteScope::Link);
        assert_eq!(m.header.protocol, RouteProtocol::Boot);
        assert!(m.attributes.contains(&RouteAttribute::Oif(9)));
        let default = add_route(
            "::".parse().unwrap(),
            0,
            Some(crate::names::GATEWAY_V6.into()),
            9,
            "eth0",
        );
        let RouteNetlinkMessage::NewRoute(m) = &default.message else {
            panic!()
        };
        assert_eq!(m.header.scope, RouteScope::Universe);
        assert!(
            !m.attributes
                .iter()
                .any(|a| matches!(a, RouteAttribute::Destination(_)))
        );
        assert_eq!(
            default.what,
            "add route ::/0 via fe80::ecee:eeff:feee:eeee dev eth0"
        );
    }
}
