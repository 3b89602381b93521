//! The netlink watch: a socket subscribed to IPv4 and IPv6 route, link and neighbour
//! (ARP, NDP and FDB) notifications,
//! read on a thread of its own, turned into small [`Event`]s on a bounded channel. It only
//! reports; the agent decides what is drift. Route changes routewriter made itself are not
//! reported: the kernel stamps a change's notification with the port id of the socket that
//! asked for it, and the agent's (`own`, set once it opened its socket) is skipped, so a
//! route written costs no wake-up and no event (thousands at start-up, one per change
//! after). When the kernel drops notifications (the socket's buffer overflowed) or the agent
//! falls behind, it reports [`Event::Overflow`], and the agent resyncs everything instead.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use netlink_sys::{Socket, protocols::NETLINK_ROUTE};
use tokio::sync::mpsc;

use super::kernel::{
    RTM_DELLINK, RTM_DELNEIGH, RTM_DELROUTE, RTM_NEWLINK, RTM_NEWNEIGH, RTM_NEWROUTE, parse_link,
    parse_route,
};
use super::reconcile::ActualRoute;

const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// Something changed in the kernel.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Route {
        deleted: bool,
        route: ActualRoute,
    },
    Link {
        deleted: bool,
        index: u32,
        name: String,
        up: bool,
    },
    /// A neighbour (`bridge == false`) or FDB entry changed on interface `ifindex`.
    Neigh {
        ifindex: u32,
        bridge: bool,
    },
    /// Notifications were lost: only a full resync is safe.
    Overflow,
}

/// Opens the subscribed socket in the calling thread's namespace and starts the reader
/// thread. Events for routes of other tables, and of the route changes the socket with port
/// id `own` asked for (0: none yet), are dropped early.
pub fn start(
    table: u32,
    capacity: usize,
    own: Arc<AtomicU32>,
) -> std::io::Result<mpsc::Receiver<Event>> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    for g in [
        RTNLGRP_LINK,
        RTNLGRP_NEIGH,
        RTNLGRP_IPV4_ROUTE,
        RTNLGRP_IPV6_ROUTE,
    ] {
        sock.add_membership(g)?;
    }
    let size: libc::c_int = 16 << 20;
    // SAFETY: setsockopt with an int on our own socket; a refusal leaves the default size.
    unsafe {
        if libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &size as *const _ as *const libc::c_void,
            4,
        ) != 0
        {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                &size as *const _ as *const libc::c_void,
                4,
            );
        }
    }
    let (tx, rx) = mpsc::channel(capacity);
    std::thread::Builder::new()
        .name("rw-monitor".into())
        .spawn(move || read_loop(sock, table, &own, tx))?;
    Ok(rx)
}

fn read_loop(sock: Socket, table: u32, own: &AtomicU32, tx: mpsc::Sender<Event>) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        // SAFETY: receiving into our own buffer on our own socket.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOBUFS) => {
                    if tx.blocking_send(Event::Overflow).is_err() {
                        return;
                    }
                    continue;
                }
                _ => {
                    tracing::error!(
                        "netlink watch failed: {e}; drift is repaired by periodic resync only"
                    );
                    let _ = tx.blocking_send(Event::Overflow);
                    return;
                }
            }
        }
        let data = &buf[..n as usize];
        let mut off = 0;
        while off + 16 <= data.len() {
            let len = u32::from_ne_bytes([data[off], data[off + 1], data[off + 2], data[off + 3]])
                as usize;
            if len < 16 || off + len > data.len() {
                break;
            }
            let msg_type = u16::from_ne_bytes([data[off + 4], data[off + 5]]);
            let port = u32::from_ne_bytes([
                data[off + 12],
                data[off + 13],
                data[off + 14],
                data[off + 15],
            ]);
            let payload = &data[off + 16..off + len];
            off += (len + 3) & !3;
            let mine = port != 0 && port == own.load(Ordering::Relaxed);
            let event = match msg_type {
                RTM_NEWROUTE | RTM_DELROUTE if mine => None,
                RTM_NEWROUTE | RTM_DELROUTE => parse_route(payload)
                    .filter(|r| r.table == table)
                    .map(|route| Event::Route {
                        deleted: msg_type == RTM_DELROUTE,
                        route,
                    }),
                RTM_NEWLINK | RTM_DELLINK => parse_link(payload).map(|l| Event::Link {
                    deleted: msg_type == RTM_DELLINK,
                    index: l.index,
                    name: l.name,
                    up: l.up,
                }),
                RTM_NEWNEIGH | RTM_DELNEIGH if payload.len() >= 8 => {
                    // struct ndmsg: family u8, pad, pad, ifindex i32.
                    let ifindex =
                        u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
                    Some(Event::Neigh {
                        ifindex,
                        bridge: payload[0] == libc::AF_BRIDGE as u8,
                    })
                }
                _ => None,
            };
            if let Some(ev) = event {
                // Waiting here when the agent is behind lets the kernel's buffer take the
                // backlog; if that overflows too, the agent hears Overflow and resyncs.
                if tx.blocking_send(ev).is_err() {
                    return;
                }
            }
        }
    }
}
