//! The kernel side: rtnetlink reads (dumps of routes, links, addresses, neighbours, FDB) and
//! writes, on one blocking netlink socket, every write counted.
//!
//! Why this file is long: every kind of kernel object routewriter owns (routes, links, addresses,
//! neighbours, FDB) read and written over one netlink socket and its helpers.
//!
//! Messages are built and parsed with netlink-packet-route (and rtnetlink's link builders);
//! the request/answer loop is ours because the `rtnetlink` handle awaits one answer per
//! request, and a node's bulk load is 100k routes: here many requests go out in one
//! `sendmsg` without asking for an ACK each, followed by one NOOP that does ask. The kernel
//! handles a netlink datagram's messages in order and answers only failures, so when the
//! NOOP's ACK comes back every message before it is done and every refusal has been read. A
//! refusal names its request by sequence number, so one bad route fails alone.
//!
//! The socket is opened in the network namespace of the calling thread and stays there.
//!
//! Both address families go through the same calls: a route, address or neighbour message
//! takes its family from the addresses it carries, and dumps are made per family (a kernel
//! without IPv6 answers an AF_INET6 dump with nothing, or with every family's objects, so
//! answers are filtered by the family asked for).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use net_types::IpFamily;
use netlink_packet_core::Emitable;
use netlink_packet_core::Parseable;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{
    AddressAttribute, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use super::desired::{Kind, Prefix};
use super::reconcile::{
    ActualFdb, ActualLink, ActualNeigh, ActualRoute, DeviceSpec, FdbOp, NeighOp, RouteOp,
    VxlanParams, own_metric, route_scope,
};
use host_kernel::netlink::{NlError, Nlmsgerr};
use proto::mac::{Mac, format_mac};

// Message types and flags (linux/rtnetlink.h, linux/netlink.h).
pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_DELROUTE: u16 = 25;
pub const RTM_GETROUTE: u16 = 26;
pub const RTM_NEWNEIGH: u16 = 28;
pub const RTM_DELNEIGH: u16 = 29;
pub const RTM_GETNEIGH: u16 = 30;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP_INTR: u16 = 16;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const HDR: usize = 16;
/// One sendmsg carries at most this much (the socket's send buffer is larger).
const BATCH_BYTES: usize = 60 * 1024;
/// Room for a whole dump datagram (the kernel fills up to 32 KiB) and for batched refusals.
const RECV_BYTES: usize = 256 * 1024;

/// A refused request of a batch: which one (its index in the batch) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub index: usize,
    pub error: Nlmsgerr,
}

/// One open rtnetlink socket with a write counter.
pub struct Kernel {
    sock: Socket,
    /// The socket's netlink port id: the kernel's notifications of changes this socket asked
    /// for carry it (see `monitor`).
    port: u32,
    seq: u32,
    writes: u64,
    tx: Vec<u8>,
    rx: Vec<u8>,
}

impl Kernel {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Kernel, NlError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(NlError::Open)?;
        let port = sock.bind_auto().map_err(NlError::Open)?.port_number();
        // Failures name the bad attribute; filtered dumps (table, interface) need strict checks.
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        sock.set_netlink_get_strict_chk(true)
            .map_err(NlError::Open)?;
        // Room for many answers at once; as root the limit can be passed (RCVBUFFORCE).
        set_buf(&sock, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, 8 << 20);
        set_buf(&sock, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, 1 << 20);
        // A kernel that never answers must not hang the agent forever.
        let tv = libc::timeval {
            tv_sec: 30,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a valid timeval on our own socket.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        Ok(Kernel {
            sock,
            port,
            seq: 1,
            writes: 0,
            tx: Vec::with_capacity(BATCH_BYTES + 4096),
            rx: vec![0; RECV_BYTES],
        })
    }

    /// The socket's netlink port id (never 0, the kernel's own).
    pub fn port_id(&self) -> u32 {
        self.port
    }

    /// Netlink messages sent that change kernel state (routes, links, addresses, neighbours).
    pub fn writes(&self) -> u64 {
        self.writes
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        if self.seq == 0 {
            self.seq = 1;
        }
        self.seq
    }

    fn send_tx(&mut self) -> Result<(), NlError> {
        let mut off = 0;
        while off < self.tx.len() {
            // SAFETY: sending from our own buffer on our own socket.
            let n = unsafe {
                libc::send(
                    self.sock.as_raw_fd(),
                    self.tx[off..].as_ptr() as *const libc::c_void,
                    self.tx.len() - off,
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(NlError::Io(e));
            }
            // Netlink takes a datagram whole or not at all.
            off = self.tx.len();
        }
        Ok(())
    }

    /// Receives one datagram into `rx`; its length.
    fn recv(&mut self) -> Result<usize, NlError> {
        loop {
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
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOBUFS) => return Err(NlError::Overrun),
                _ => return Err(NlError::Io(e)),
            }
        }
    }

    /// Sends one dump request and calls `f` with each answer's type and payload.
    fn dump(
        &mut self,
        msg_type: u16,
        payload: &dyn Emitable,
        mut f: impl FnMut(u16, &[u8]),
    ) -> Result<(), NlError> {
        let seq = self.next_seq();
        self.tx.clear();
        push_msg(
            &mut self.tx,
            msg_type,
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            payload,
        );
        self.send_tx()?;
        let mut interrupted = false;
        loop {
            let n = self.recv()?;
            let mut off = 0;
            while let Some((hdr, payload, next)) = next_msg(&self.rx[..n], off) {
                off = next;
                if hdr.seq != seq {
                    continue; // a late answer to an earlier request
                }
                interrupted |= hdr.flags & NLM_F_DUMP_INTR != 0;
                match hdr.msg_type {
                    NLMSG_DONE => {
                        return if interrupted {
                            Err(NlError::DumpInterrupted)
                        } else {
                            Ok(())
                        };
                    }
                    NLMSG_ERROR => {
                        let err = Nlmsgerr::parse(hdr.flags, payload);
                        if let Some(e) = err {
                            return Err(NlError::Refused {
                                what: format!("dump (message type {msg_type})"),
                                error: e,
                            });
                        }
                    }
                    t => f(t, payload),
                }
            }
        }
    }

    /// One request that changes state, answered with an ACK; counted as a write.
    fn write_one(
        &mut self,
        msg_type: u16,
        flags: u16,
        payload: &dyn Emitable,
        what: impl FnOnce() -> String,
    ) -> Result<(), NlError> {
        let mut batch = Batch::new(self);
        batch.push(msg_type, flags, payload)?;
        let refusals = batch.finish()?;
        match refusals.into_iter().next() {
            None => Ok(()),
            Some(r) => Err(NlError::Refused {
                what: what(),
                error: r.error,
            }),
        }
    }

    /// A non-dump GET answered with one message; `None` when the kernel says it does not exist.
    fn get_one(
        &mut self,
        msg_type: u16,
        payload: &dyn Emitable,
    ) -> Result<Option<Vec<u8>>, NlError> {
        let seq = self.next_seq();
        self.tx.clear();
        push_msg(&mut self.tx, msg_type, NLM_F_REQUEST, seq, payload);
        self.send_tx()?;
        loop {
            let n = self.recv()?;
            let mut off = 0;
            while let Some((hdr, payload, next)) = next_msg(&self.rx[..n], off) {
                off = next;
                if hdr.seq != seq {
                    continue;
                }
                if hdr.msg_type == NLMSG_ERROR {
                    return match Nlmsgerr::parse(hdr.flags, payload) {
                        Some(e) if e.errno == libc::ENODEV || e.errno == libc::ENOENT => Ok(None),
                        Some(e) => Err(NlError::Refused {
                            what: "get".into(),
                            error: e,
                        }),
                        None => Ok(None),
                    };
                }
                return Ok(Some(payload.to_vec()));
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Routes

    /// Every route of `family` in `table` (optionally only those through interface `oif`).
    pub fn routes(
        &mut self,
        family: IpFamily,
        table: u32,
        oif: Option<u32>,
        mut f: impl FnMut(&ActualRoute),
    ) -> Result<(), NlError> {
        let mut req = RouteMessage::default();
        req.header.address_family = address_family(family);
        req.header.table = table_u8(table);
        req.header.scope = RouteScope::Universe;
        req.header.kind = RouteType::Unspec;
        req.header.protocol = RouteProtocol::Unspec;
        req.attributes.push(RouteAttribute::Table(table));
        if let Some(oif) = oif {
            req.attributes.push(RouteAttribute::Oif(oif));
        }
        self.dump(RTM_GETROUTE, &req, |t, payload| {
            if t == RTM_NEWROUTE
                && let Some(r) = parse_route(payload)
                && r.prefix.family() == family
            {
                f(&r);
            }
        })
    }

    /// Applies route operations in batches. `NoDevice` operations are skipped (the caller
    /// tracks them). Returns the refusals, by index into `ops`.
    ///
    /// IPv6 checks an onlink gateway against the table (`ip6_route_check_nh_onlink`): a
    /// route whose gateway lies inside its own prefix (a VXLAN tunnel address in the remote
    /// block) cannot replace a route there through another device, which covers the gateway.
    /// Such a refusal (EINVAL) is retried once as delete-then-write at that destination.
    pub fn apply_routes(
        &mut self,
        ops: &[RouteOp],
        table: u32,
        protocol: u8,
    ) -> Result<Vec<Refusal>, NlError> {
        let mut batch = Batch::new(self);
        let mut index_of = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let (t, flags, msg) = match op {
                RouteOp::Write {
                    prefix, spec, oif, ..
                } => (
                    RTM_NEWROUTE,
                    NLM_F_CREATE | NLM_F_REPLACE,
                    route_write_msg(
                        *prefix,
                        spec.kind,
                        spec.gateway(),
                        *oif,
                        spec.onlink,
                        table,
                        protocol,
                    ),
                ),
                RouteOp::Delete(r) => (RTM_DELROUTE, 0, route_delete_exact(r)),
                RouteOp::DeleteOwn { prefix } => {
                    (RTM_DELROUTE, 0, route_delete_own(*prefix, table, protocol))
                }

                RouteOp::NoDevice { .. } => continue,
            };
            batch.push(t, flags, &msg)?;
            index_of.push(i);
        }
        let refusals = batch.finish()?;
        let mut out: Vec<Refusal> = refusals
            .into_iter()
            .filter_map(|r| {
                let i = *index_of.get(r.index)?;
                // Deleting what is already gone is what we wanted.
                let gone = matches!(ops[i], RouteOp::Delete(_) | RouteOp::DeleteOwn { .. })
                    && r.error.errno == libc::ESRCH;
                (!gone).then_some(Refusal {
                    index: i,
                    error: r.error,
                })
            })
            .collect();
        let again: Vec<usize> = out
            .iter()
            .filter(|r| r.error.errno == libc::EINVAL)
            .map(|r| r.index)
            .filter(|&i| {
                matches!(ops[i], RouteOp::Write { prefix, spec, .. }
                    if prefix.family() == IpFamily::V6 && spec.onlink)
            })
            .collect();
        if again.is_empty() {
            return Ok(out);
        }
        let mut batch = Batch::new(self);
        for &i in &again {
            let RouteOp::Write {
                prefix, spec, oif, ..
            } = ops[i]
            else {
                continue;
            };
            // Whatever sits at the destination, any protocol (it is being replaced anyway).
            batch.push(RTM_DELROUTE, 0, &route_delete_own(prefix, table, 0))?;
            let msg = route_write_msg(
                prefix,
                spec.kind,
                spec.gateway(),
                oif,
                spec.onlink,
                table,
                protocol,
            );
            batch.push(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, &msg)?;
        }
        let retried = batch.finish()?;
        // Only the writes (odd requests) count; a failed delete shows in its write.
        let still: Vec<Refusal> = retried
            .into_iter()
            .filter(|r| r.index % 2 == 1)
            .map(|r| Refusal {
                index: again[r.index / 2],
                error: r.error,
            })
            .collect();
        out.retain(|r| !again.contains(&r.index));
        out.extend(still);
        out.sort_by_key(|r| r.index);
        Ok(out)
    }

    // -----------------------------------------------------------------------------------------
    // Links

    /// Every link.
    pub fn links(&mut self) -> Result<Vec<ActualLink>, NlError> {
        let mut out = Vec::new();
        let req = LinkMessage::default();
        self.dump(RTM_GETLINK, &req, |t, payload| {
            if t == RTM_NEWLINK
                && let Ok(m) = LinkMessage::parse(payload)
            {
                out.push(link_from(&m));
            }
        })?;
        Ok(out)
    }

    /// One link by name.
    pub fn link(&mut self, name: &str) -> Result<Option<ActualLink>, NlError> {
        let mut req = LinkMessage::default();
        req.attributes.push(LinkAttribute::IfName(name.to_owned()));
        Ok(self
            .get_one(RTM_GETLINK, &req)?
            .and_then(|p| LinkMessage::parse(&p[..]).ok())
            .map(|m| link_from(&m)))
    }

    /// Creates a VXLAN device (of the family of its local address), up; its interface index.
    pub fn create_vxlan(&mut self, spec: &DeviceSpec) -> Result<u32, NlError> {
        let b = rtnetlink::LinkVxlan::new(&spec.name, spec.vni)
            .dev(spec.link)
            .port(spec.port);
        let b = match spec.local {
            IpAddr::V4(a) => b.local(a),
            IpAddr::V6(a) => b.local6(a),
        };
        let msg = b
            .learning(false)
            .mtu(spec.mtu)
            .address(spec.mac.to_vec())
            .up()
            .build();
        self.write_one(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &msg, || {
            format!("create VXLAN device {}", spec.name)
        })?;
        self.link(&spec.name)?
            .map(|l| l.index)
            .ok_or_else(|| NlError::Refused {
                what: format!("create VXLAN device {}", spec.name),
                error: Nlmsgerr {
                    errno: libc::ENODEV,
                    message: "created but not found".into(),
                },
            })
    }

    /// Changes a link in place: MTU, MAC, and brings it up.
    pub fn set_link(
        &mut self,
        index: u32,
        mtu: Option<u32>,
        mac: Option<Mac>,
        up: bool,
    ) -> Result<(), NlError> {
        let mut b = rtnetlink::LinkUnspec::new_with_index(index);
        if let Some(mtu) = mtu {
            b = b.mtu(mtu);
        }
        if let Some(mac) = mac {
            b = b.address(mac.to_vec());
        }
        if up {
            b = b.up();
        }
        let msg = b.build();
        self.write_one(RTM_NEWLINK, 0, &msg, || format!("change link {index}"))
    }

    pub fn delete_link(&mut self, index: u32) -> Result<(), NlError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.write_one(RTM_DELLINK, 0, &msg, || format!("delete link {index}"))
    }

    /// Makes sure the IPIP device exists (creating it loads the `ipip` module where that can
    /// be done); its index, or [`NlError::Missing`] when the kernel has no IPIP.
    pub fn ensure_ipip(&mut self, name: &str) -> Result<u32, NlError> {
        if let Some(l) = self.link(name)? {
            return Ok(l.index);
        }
        let msg = rtnetlink::LinkIpIp::new(name).up().build();
        match self.write_one(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &msg, || {
            format!("create IPIP device {name}")
        }) {
            Ok(()) => {}
            Err(NlError::Refused { error, .. })
                if error.errno == libc::EOPNOTSUPP || error.errno == libc::ENOENT =>
            {
                return Err(ipip_missing());
            }
            // The fallback device appeared meanwhile.
            Err(NlError::Refused { error, .. }) if error.errno == libc::EEXIST => {}
            Err(e) => return Err(e),
        }
        self.link(name)?.map(|l| l.index).ok_or_else(ipip_missing)
    }

    // -----------------------------------------------------------------------------------------
    // Addresses

    /// Every address of `family`: interface index, address, prefix length.
    pub fn all_addresses(&mut self, family: IpFamily) -> Result<Vec<(u32, IpAddr, u8)>, NlError> {
        let mut req = AddressMessage::default();
        req.header.family = address_family(family);
        let mut out = Vec::new();
        self.dump(RTM_GETADDR, &req, |t, payload| {
            if t != RTM_NEWADDR {
                return;
            }
            let Ok(m) = AddressMessage::parse(payload) else {
                return;
            };
            if m.header.family != address_family(family) {
                return;
            }
            // IPv4 names the interface's own address in IFA_LOCAL (IFA_ADDRESS is the peer's
            // on point-to-point links); IPv6 in IFA_ADDRESS.
            let local = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(a) => Some(*a),
                _ => None,
            });
            let addr = local.or_else(|| {
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(a) => Some(*a),
                    _ => None,
                })
            });
            if let Some(a) = addr.filter(|a| IpFamily::of(*a) == family) {
                out.push((m.header.index, a, m.header.prefix_len));
            }
        })?;
        Ok(out)
    }

    pub fn add_address(&mut self, index: u32, addr: IpAddr, len: u8) -> Result<(), NlError> {
        let msg = address_msg(index, addr, len);
        self.write_one(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, &msg, || {
            format!("add address {addr}/{len} to link {index}")
        })
    }

    pub fn del_address(&mut self, index: u32, addr: IpAddr, len: u8) -> Result<(), NlError> {
        let msg = address_msg(index, addr, len);
        match self.write_one(RTM_DELADDR, 0, &msg, || {
            format!("delete address {addr}/{len} from link {index}")
        }) {
            Err(NlError::Refused { error, .. }) if error.errno == libc::EADDRNOTAVAIL => Ok(()),
            r => r,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Neighbours and FDB

    /// Neighbour entries of `family` (ARP, NDP) on interface `index`.
    pub fn neighbours(
        &mut self,
        index: u32,
        family: IpFamily,
    ) -> Result<Vec<ActualNeigh>, NlError> {
        let mut req = NeighbourMessage::default();
        req.header.family = address_family(family);
        let mut out = Vec::new();
        self.dump(RTM_GETNEIGH, &req, |t, payload| {
            if t != RTM_NEWNEIGH {
                return;
            }
            let Ok(m) = NeighbourMessage::parse(payload) else {
                return;
            };
            if m.header.ifindex != index || m.header.family != address_family(family) {
                return;
            }
            let (ip, mac) = neighbour_entry(&m);
            if let Some(ip) = ip {
                out.push(ActualNeigh {
                    ip,
                    mac,
                    permanent: m.header.state == NeighbourState::Permanent,
                });
            }
        })?;
        Ok(out)
    }

    /// Bridge FDB entries of interface `index` (the VXLAN device's own table), with remotes of
    /// either family.
    pub fn fdb(&mut self, index: u32) -> Result<Vec<ActualFdb>, NlError> {
        let mut req = NeighbourMessage::default();
        req.header.family = AddressFamily::Bridge;
        let mut out = Vec::new();
        self.dump(RTM_GETNEIGH, &req, |t, payload| {
            if t != RTM_NEWNEIGH {
                return;
            }
            let Ok(m) = NeighbourMessage::parse(payload) else {
                return;
            };
            if m.header.ifindex != index || m.header.family != AddressFamily::Bridge {
                return;
            }
            let (dst, mac) = neighbour_entry(&m);
            if let Some(mac) = mac {
                out.push(ActualFdb {
                    mac,
                    dst,
                    permanent: m.header.state == NeighbourState::Permanent,
                });
            }
        })?;
        Ok(out)
    }

    /// Applies neighbour operations on interface `index`; refusals by index into `ops`.
    pub fn apply_neighbours(
        &mut self,
        index: u32,
        ops: &[NeighOp],
    ) -> Result<Vec<Refusal>, NlError> {
        let mut batch = Batch::new(self);
        for op in ops {
            let mut m = NeighbourMessage::default();
            let (NeighOp::Set { ip, .. } | NeighOp::Del { ip }) = op;
            m.header.family = address_family(IpFamily::of(*ip));
            m.header.ifindex = index;
            m.attributes
                .push(NeighbourAttribute::Destination(neighbour_address(*ip)));
            match op {
                NeighOp::Set { mac, .. } => {
                    m.header.state = NeighbourState::Permanent;
                    m.header.kind = RouteType::Unicast;
                    m.attributes
                        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
                    batch.push(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, &m)?;
                }
                NeighOp::Del { .. } => batch.push(RTM_DELNEIGH, 0, &m)?,
            }
        }
        let refusals = batch.finish()?;
        Ok(refusals
            .into_iter()
            .filter(|r| {
                !(matches!(ops[r.index], NeighOp::Del { .. }) && r.error.errno == libc::ENOENT)
            })
            .collect())
    }

    /// Applies FDB operations on interface `index`; refusals by index into `ops`.
    pub fn apply_fdb(&mut self, index: u32, ops: &[FdbOp]) -> Result<Vec<Refusal>, NlError> {
        let mut batch = Batch::new(self);
        for op in ops {
            let mut m = NeighbourMessage::default();
            m.header.family = AddressFamily::Bridge;
            m.header.ifindex = index;
            // NTF_SELF: the entry lives in the VXLAN device's own table, not a bridge's.
            m.header.flags = NeighbourFlags::Own;
            match op {
                FdbOp::Set { mac, dst } => {
                    m.header.state = NeighbourState::Permanent;
                    m.attributes
                        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
                    m.attributes
                        .push(NeighbourAttribute::Destination(neighbour_address(*dst)));
                    batch.push(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, &m)?;
                }
                FdbOp::Del { mac, dst } => {
                    m.attributes
                        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
                    if let Some(dst) = dst {
                        m.attributes
                            .push(NeighbourAttribute::Destination(neighbour_address(*dst)));
                    }
                    batch.push(RTM_DELNEIGH, 0, &m)?;
                }
            }
        }
        let refusals = batch.finish()?;
        Ok(refusals
            .into_iter()
            .filter(|r| {
                !(matches!(ops[r.index], FdbOp::Del { .. }) && r.error.errno == libc::ENOENT)
            })
            .collect())
    }
}

fn ipip_missing() -> NlError {
    NlError::Missing {
        feature: "ipip",
        module: "ipip",
        consequence: "pools in IPIP mode cannot be programmed",
    }
}

fn set_buf(sock: &Socket, force: libc::c_int, plain: libc::c_int, size: libc::c_int) {
    for opt in [force, plain] {
        // SAFETY: setsockopt with an int on our own socket.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &size as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return;
        }
    }
}

/// Requests sent many to a datagram, without an ACK each; a NOOP with an ACK closes each
/// datagram, so its ACK means "all before me are done".
pub struct Batch<'k> {
    k: &'k mut Kernel,
    /// Sequence number of the batch's first request; request i has `base + i`.
    base: u32,
    count: usize,
    pending_from: usize,
    refusals: Vec<Refusal>,
}

impl<'k> Batch<'k> {
    pub fn new(k: &'k mut Kernel) -> Self {
        k.tx.clear();
        let base = k.seq.wrapping_add(1);
        Batch {
            k,
            base,
            count: 0,
            pending_from: 0,
            refusals: Vec::new(),
        }
    }

    pub fn push(
        &mut self,
        msg_type: u16,
        flags: u16,
        payload: &dyn Emitable,
    ) -> Result<(), NlError> {
        let seq = self.base.wrapping_add(self.count as u32);
        self.k.seq = seq;
        push_msg(
            &mut self.k.tx,
            msg_type,
            NLM_F_REQUEST | flags,
            seq,
            payload,
        );
        self.count += 1;
        self.k.writes += 1;
        if self.k.tx.len() >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), NlError> {
        if self.count == self.pending_from {
            return Ok(());
        }
        // The barrier gets a sequence number outside the batch's range.
        let barrier = self
            .base
            .wrapping_add(self.count as u32)
            .wrapping_add(1 << 30);
        push_msg(
            &mut self.k.tx,
            NLMSG_NOOP,
            NLM_F_REQUEST | NLM_F_ACK,
            barrier,
            &Empty,
        );
        self.k.send_tx()?;
        self.k.tx.clear();
        loop {
            let n = self.k.recv()?;
            let mut off = 0;
            let mut done = false;
            while let Some((hdr, payload, next)) = next_msg(&self.k.rx[..n], off) {
                off = next;
                if hdr.msg_type != NLMSG_ERROR {
                    continue;
                }
                if hdr.seq == barrier {
                    done = true;
                    continue;
                }
                let index = hdr.seq.wrapping_sub(self.base) as usize;
                if index < self.count
                    && let Some(error) = Nlmsgerr::parse(hdr.flags, payload)
                {
                    self.refusals.push(Refusal { index, error });
                }
            }
            if done {
                break;
            }
        }
        self.pending_from = self.count;
        Ok(())
    }

    /// Sends what is left and returns every refusal, by request index.
    pub fn finish(mut self) -> Result<Vec<Refusal>, NlError> {
        self.flush()?;
        self.k.seq = self
            .base
            .wrapping_add(self.count as u32)
            .wrapping_add(1 << 30);
        Ok(std::mem::take(&mut self.refusals))
    }
}

struct Empty;

impl Emitable for Empty {
    fn buffer_len(&self) -> usize {
        0
    }
    fn emit(&self, _: &mut [u8]) {}
}

struct Hdr {
    msg_type: u16,
    flags: u16,
    seq: u32,
}

fn push_msg(buf: &mut Vec<u8>, msg_type: u16, flags: u16, seq: u32, payload: &dyn Emitable) {
    let len = HDR + payload.buffer_len();
    let start = buf.len();
    buf.resize(start + ((len + 3) & !3), 0);
    buf[start..start + 4].copy_from_slice(&(len as u32).to_ne_bytes());
    buf[start + 4..start + 6].copy_from_slice(&msg_type.to_ne_bytes());
    buf[start + 6..start + 8].copy_from_slice(&flags.to_ne_bytes());
    buf[start + 8..start + 12].copy_from_slice(&seq.to_ne_bytes());
    // Port 0 is the kernel; the kernel fills in ours.
    payload.emit(&mut buf[start + HDR..start + len]);
}

/// The message at `off` in a datagram: header, payload and the next offset.
fn next_msg(data: &[u8], off: usize) -> Option<(Hdr, &[u8], usize)> {
    let h = data.get(off..off + HDR)?;
    let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if len < HDR || off + len > data.len() {
        return None;
    }
    let hdr = Hdr {
        msg_type: u16::from_ne_bytes([h[4], h[5]]),
        flags: u16::from_ne_bytes([h[6], h[7]]),
        seq: u32::from_ne_bytes([h[8], h[9], h[10], h[11]]),
    };
    Some((hdr, &data[off + HDR..off + len], off + ((len + 3) & !3)))
}

fn table_u8(table: u32) -> u8 {
    // Tables over 255 travel in RTA_TABLE; the header then says RT_TABLE_COMPAT.
    u8::try_from(table).unwrap_or(252)
}

/// The destination address and link-layer address of a neighbour or FDB entry (either
/// family; AF_BRIDGE messages carry the remote as raw bytes, 4 or 16 of them).
fn neighbour_entry(m: &NeighbourMessage) -> (Option<IpAddr>, Option<Mac>) {
    let mut ip = None;
    let mut mac = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some(IpAddr::V4(*a)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                ip = Some(IpAddr::V6(*a))
            }
            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => ip = ip_from(b),
            NeighbourAttribute::LinkLayerAddress(l) => mac = mac_from(l),
            _ => {}
        }
    }
    (ip, mac)
}

fn mac_from(l: &[u8]) -> Option<Mac> {
    l.try_into().ok()
}

fn address_family(family: IpFamily) -> AddressFamily {
    match family {
        IpFamily::V4 => AddressFamily::Inet,
        IpFamily::V6 => AddressFamily::Inet6,
    }
}

fn route_address(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }
}

fn neighbour_address(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }
}

/// An address from raw bytes (4 or 16 of them).
fn ip_from(b: &[u8]) -> Option<IpAddr> {
    if let Ok(a) = <[u8; 4]>::try_from(b) {
        Some(IpAddr::V4(Ipv4Addr::from(a)))
    } else {
        <[u8; 16]>::try_from(b)
            .ok()
            .map(|a| IpAddr::V6(Ipv6Addr::from(a)))
    }
}

/// The kernel's form of a desired route, at its family's own metric.
pub fn route_write_msg(
    prefix: Prefix,
    kind: Kind,
    gateway: Option<IpAddr>,
    oif: u32,
    onlink: bool,
    table: u32,
    protocol: u8,
) -> RouteMessage {
    let family = prefix.family();
    let mut m = RouteMessage::default();
    m.header = RouteHeader {
        address_family: address_family(family),
        destination_prefix_length: prefix.prefix_len(),
        source_prefix_length: 0,
        tos: 0,
        table: table_u8(table),
        protocol: RouteProtocol::from(protocol),
        scope: RouteScope::from(route_scope(kind, family)),
        kind: if kind == Kind::Blackhole {
            RouteType::BlackHole
        } else {
            RouteType::Unicast
        },
        flags: if onlink {
            RouteFlags::Onlink
        } else {
            RouteFlags::empty()
        },
    };
    m.attributes.push(RouteAttribute::Table(table));
    m.attributes
        .push(RouteAttribute::Destination(route_address(prefix.addr())));
    let metric = own_metric(family);
    if metric != 0 {
        m.attributes.push(RouteAttribute::Priority(metric));
    }
    if kind != Kind::Blackhole {
        if let Some(g) = gateway {
            m.attributes.push(RouteAttribute::Gateway(route_address(g)));
        }
        if oif != 0 {
            m.attributes.push(RouteAttribute::Oif(oif));
        }
    }
    m
}

/// Deletes exactly the route the kernel reported.
fn route_delete_exact(r: &ActualRoute) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = address_family(r.prefix.family());
    m.header.destination_prefix_length = r.prefix.prefix_len();
    m.header.tos = r.tos;
    m.header.table = table_u8(r.table);
    m.header.protocol = RouteProtocol::from(r.protocol);
    m.header.scope = RouteScope::NoWhere;
    m.header.kind = RouteType::from(r.rtype);
    m.attributes.push(RouteAttribute::Table(r.table));
    m.attributes
        .push(RouteAttribute::Destination(route_address(r.prefix.addr())));
    if r.metric != 0 {
        m.attributes.push(RouteAttribute::Priority(r.metric));
    }
    if let Some(g) = r.gateway() {
        m.attributes.push(RouteAttribute::Gateway(route_address(g)));
    }
    if r.oif != 0 {
        m.attributes.push(RouteAttribute::Oif(r.oif));
    }
    m
}

/// Deletes our route at a prefix (the own metric), whatever its type: the kernel matches the
/// protocol, so another protocol's route there stays. Protocol 0 matches any.
fn route_delete_own(prefix: Prefix, table: u32, protocol: u8) -> RouteMessage {
    let family = prefix.family();
    let mut m = RouteMessage::default();
    m.header.address_family = address_family(family);
    m.header.destination_prefix_length = prefix.prefix_len();
    m.header.table = table_u8(table);
    m.header.protocol = RouteProtocol::from(protocol);
    m.header.scope = RouteScope::NoWhere;
    m.header.kind = RouteType::Unspec;
    m.attributes.push(RouteAttribute::Table(table));
    m.attributes
        .push(RouteAttribute::Destination(route_address(prefix.addr())));
    let metric = own_metric(family);
    if metric != 0 {
        m.attributes.push(RouteAttribute::Priority(metric));
    }
    m
}

/// A dumped or announced route of either family; `None` for anything else.
pub fn parse_route(payload: &[u8]) -> Option<ActualRoute> {
    let m = RouteMessage::parse(payload).ok()?;
    let mut dst = match m.header.address_family {
        AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    let mut table = u32::from(m.header.table);
    let mut gateway = None;
    let mut oif = 0;
    let mut metric = 0;
    let mut multipath = false;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) if dst.is_ipv4() => {
                dst = IpAddr::V4(*d)
            }
            RouteAttribute::Destination(RouteAddress::Inet6(d)) if dst.is_ipv6() => {
                dst = IpAddr::V6(*d)
            }
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => gateway = Some(IpAddr::V4(*g)),
            RouteAttribute::Gateway(RouteAddress::Inet6(g)) => gateway = Some(IpAddr::V6(*g)),
            RouteAttribute::Oif(i) => oif = *i,
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Priority(p) => metric = *p,
            RouteAttribute::MultiPath(_) => multipath = true,
            _ => {}
        }
    }
    Some(ActualRoute {
        prefix: Prefix::new(dst, m.header.destination_prefix_length)?,
        table,
        protocol: u8::from(m.header.protocol),
        metric,
        tos: m.header.tos,
        rtype: u8::from(m.header.kind),
        scope: u8::from(m.header.scope),
        gateway,
        oif,
        onlink: m.header.flags.contains(RouteFlags::Onlink),
        multipath,
    })
}

/// A link's name and index from a link message (for events).
pub fn parse_link(payload: &[u8]) -> Option<ActualLink> {
    LinkMessage::parse(payload).ok().map(|m| link_from(&m))
}

fn link_from(m: &LinkMessage) -> ActualLink {
    let mut l = ActualLink {
        index: m.header.index,
        up: m.header.flags.contains(LinkFlags::Up),
        ..Default::default()
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n.clone(),
            LinkAttribute::Mtu(mtu) => l.mtu = *mtu,
            LinkAttribute::Address(mac) => l.mac = mac_from(mac),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => l.kind = Some(kind_name(k)),
                        LinkInfo::Data(InfoData::Vxlan(v)) => {
                            let mut p = VxlanParams::default();
                            for x in v {
                                match x {
                                    InfoVxlan::Id(id) => p.vni = Some(*id),
                                    InfoVxlan::Port(port) => p.port = Some(*port),
                                    InfoVxlan::Local(a) => p.local = Some(IpAddr::V4(*a)),
                                    InfoVxlan::Local6(a) => p.local = Some(IpAddr::V6(*a)),
                                    InfoVxlan::Link(i) => p.link = Some(*i),
                                    InfoVxlan::Learning(b) => p.learning = Some(*b),
                                    InfoVxlan::CollectMetadata(b) => p.collect_metadata = *b,
                                    _ => {}
                                }
                            }
                            l.vxlan = Some(p);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    l
}

fn kind_name(k: &InfoKind) -> String {
    match k {
        InfoKind::Vxlan => "vxlan".into(),
        InfoKind::Veth => "veth".into(),
        InfoKind::Bridge => "bridge".into(),
        InfoKind::Dummy => "dummy".into(),
        InfoKind::IpIp => "ipip".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn address_msg(index: u32, addr: IpAddr, len: u8) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = address_family(IpFamily::of(addr));
    m.header.prefix_len = len;
    m.header.index = index;
    m.header.scope = AddressScope::Universe;
    m.header.flags = AddressHeaderFlags::Permanent;
    if addr.is_ipv4() {
        m.attributes.push(AddressAttribute::Local(addr));
    } else {
        // The tunnel address is unique by IPAM: duplicate address detection would only keep
        // it tentative (unusable as a source) for a second.
        m.header.flags |= AddressHeaderFlags::Nodad;
    }
    m.attributes.push(AddressAttribute::Address(addr));
    m
}

/// How a neighbour/FDB operation reads in a log line.
pub fn describe_fdb(op: &FdbOp) -> String {
    match op {
        FdbOp::Set { mac, dst } => format!("fdb {} dst {dst}", format_mac(mac)),
        FdbOp::Del { mac, dst } => format!("fdb del {} dst {dst:?}", format_mac(mac)),
    }
}

pub fn describe_neigh(op: &NeighOp) -> String {
    match op {
        NeighOp::Set { ip, mac } => format!("neigh {ip} lladdr {}", format_mac(mac)),
        NeighOp::Del { ip } => format!("neigh del {ip}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_framed_and_found_again() {
        let mut buf = Vec::new();
        let m = route_write_msg(
            Prefix::parse("10.65.0.0/26").unwrap(),
            Kind::Blackhole,
            None,
            0,
            false,
            254,
            80,
        );
        push_msg(&mut buf, RTM_NEWROUTE, NLM_F_REQUEST, 7, &m);
        push_msg(&mut buf, NLMSG_NOOP, NLM_F_REQUEST | NLM_F_ACK, 8, &Empty);
        let (h, payload, next) = next_msg(&buf, 0).unwrap();
        assert_eq!((h.msg_type, h.seq), (RTM_NEWROUTE, 7));
        let r = parse_route(payload).unwrap();
        assert_eq!(r.prefix.to_string(), "10.65.0.0/26");
        assert_eq!((r.protocol, r.table, r.rtype), (80, 254, 6));
        let (h, payload, next) = next_msg(&buf, next).unwrap();
        assert_eq!((h.msg_type, h.seq, payload.len()), (NLMSG_NOOP, 8, 0));
        assert!(next_msg(&buf, next).is_none());
        // Truncated or lying lengths end the walk instead of reading past the end.
        assert!(next_msg(&buf[..20], 0).is_none());
        let mut bad = buf.clone();
        bad[0..4].copy_from_slice(&4u32.to_ne_bytes());
        assert!(next_msg(&bad, 0).is_none());
    }
}
