//! An observer of the kernels' routing tables, outside every daemon: one NETLINK_ROUTE socket
//! per node namespace, subscribed to IPv4 route changes, opened before the daemons start (the
//! opening thread enters each namespace, opens the socket there and comes back: a socket
//! belongs to the namespace it was opened in for its whole life). One reader thread waits on
//! all of them with epoll and timestamps each RTM_NEWROUTE / RTM_DELROUTE of a /26 block of
//! the pod pool (CLOCK_MONOTONIC, as [`crate::bench::monotonic_ns`]), in the main table.
//!
//! Why this file is long: the socket set-up, the reader's loop with its resolution
//! bookkeeping, the per-node tables and the waits on them belong together, with their tests.
//!
//! What it keeps, per node and block: since when the route is there (a replacement keeps the
//! time of the first arrival) and when it last went. Per node, how many of the blocks it is
//! told to expect are there, and when the last of them arrived: so "converged" is a counter
//! check, not a scan, at a thousand nodes.
//!
//! Resolution: the kernel does not timestamp netlink messages, so a route's time is when the
//! reader read it, and every time comes with its own bound: how long before the read the
//! message may have arrived. The reader knows when each socket was last empty: when a read of
//! it found nothing (it drains each ready socket), when an epoll wait returned without it
//! (epoll lists every ready socket), and when it went to sleep in epoll (every socket was
//! empty then; it sleeps at most 1 ms at a time). A message read at `r` arrived after the
//! latest of these, `e`: its time is `r`, at most `r - e` late. A figure's resolution is the
//! bound of the event that set it (the last route of the last kernel, the last kernel to get
//! a claimed block). The reader runs at a real-time priority (SCHED_FIFO, when allowed) so a
//! busy machine does not delay it; [`Lag`] keeps its longest pass and latest wake-up too.
//!
//! What it does not do: write to any kernel, start daemons, or decide what is expected (the
//! caller says). A socket whose buffer overflowed (ENOBUFS) lost notifications: the observer
//! counts it and the caller must treat the run as failed.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::RouteHeader;
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use super::netns::Netns;
use crate::bench::monotonic_ns;

const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
/// rtattr type of a route's destination.
const RTA_DST: u16 = 1;
/// The length of struct rtmsg, where a route's attributes start.
const RTMSG_LEN: usize = 12;
/// Block length of the pool (Calico's default for IPv4).
const BLOCK_LEN: u8 = 26;
/// How long the reader sleeps between passes when nothing comes: its wake-up probe, and
/// the longest a socket goes without being known empty while the reader idles.
const WAKE_PROBE: Duration = Duration::from_millis(1);
/// An epoll wait that took longer than this slept: every socket was empty when it began.
const SLEPT: u64 = 50_000;
/// Each socket's receive buffer: room for a burst of a few thousand routes.
const RCVBUF: libc::c_int = 4 << 20;

/// One block's route in one kernel.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// When it arrived (monotonic ns), 0 while absent.
    since: u64,
    /// When it was last deleted (monotonic ns), 0 if never.
    gone_at: u64,
    /// How late `since` and `gone_at` may be (ns).
    since_bound: u32,
    gone_bound: u32,
    expected: bool,
}

#[derive(Debug, Default)]
struct NodeTable {
    slots: Vec<Slot>,
    /// Expected blocks present.
    have: usize,
    want: usize,
    /// The arrival of the expected route that completed the set, while it is complete, and
    /// how late it may be.
    complete_at: Option<(u64, u32)>,
}

/// The reader's own lag, for judging a run: its longest pass over the ready sockets, its
/// latest wake-up from an epoll timeout, and the largest bound of any event it stamped.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lag {
    pub max_pass: Duration,
    pub max_wake: Duration,
    pub max_bound: Duration,
}

/// A time the observer stamped (monotonic ns) and how late it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub at: u64,
    pub bound: Duration,
}

fn ns32(d: u64) -> u32 {
    u32::try_from(d).unwrap_or(u32::MAX)
}

#[derive(Debug, Default)]
struct State {
    nodes: Vec<NodeTable>,
    lag: Lag,
    /// Notifications of block routes seen.
    events: u64,
    /// Sockets that overflowed (notifications lost), by node.
    overflowed: Vec<usize>,
    failed: Option<String>,
}

/// See the module documentation.
pub struct KernelObserver {
    shared: Arc<(Mutex<State>, Condvar)>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
    pool_base: u32,
    pool_len: u8,
    /// Whether the reader got its real-time priority.
    pub realtime: bool,
}

impl KernelObserver {
    /// Opens one socket in each namespace (in order: node `i` is `namespaces[i]`) and starts
    /// the reader. `pool`: the pod pool whose /26 blocks are watched.
    pub fn start(namespaces: &[&Netns], pool: ipnet::Ipv4Net) -> Result<KernelObserver, String> {
        let mut sockets = Vec::with_capacity(namespaces.len());
        for ns in namespaces {
            let sock = ns
                .run_in(open_socket)
                .map_err(|e| format!("entering {}: {e}", ns.name()))?
                .map_err(|e| format!("a netlink route socket in {}: {e}", ns.name()))?;
            sockets.push(sock);
        }
        let slots = 1usize << (BLOCK_LEN - pool.prefix_len());
        let state = State {
            nodes: (0..namespaces.len())
                .map(|_| NodeTable {
                    slots: vec![Slot::default(); slots],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let shared = Arc::new((Mutex::new(state), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (rt_tx, rt_rx) = std::sync::mpsc::channel();
        let reader = {
            let (shared, stop) = (shared.clone(), stop.clone());
            let base = u32::from(pool.network());
            let len = pool.prefix_len();
            std::thread::Builder::new()
                .name("kernel-observer".into())
                .spawn(move || {
                    let _ = rt_tx.send(make_realtime());
                    read_loop(sockets, base, len, &shared, &stop)
                })
                .map_err(|e| format!("the observer's thread: {e}"))?
        };
        let realtime = rt_rx.recv().unwrap_or(false);
        Ok(KernelObserver {
            shared,
            stop,
            reader: Some(reader),
            pool_base: u32::from(pool.network()),
            pool_len: pool.prefix_len(),
            realtime,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot of a /26 block of the pool.
    fn slot_of(&self, block: ipnet::Ipv4Net) -> Option<usize> {
        slot_of(
            self.pool_base,
            self.pool_len,
            u32::from(block.network()),
            block.prefix_len(),
        )
    }

    /// Tells which blocks node `node` must hold (replacing what it was told before).
    pub fn expect(&self, node: usize, blocks: &[ipnet::Ipv4Net]) -> Result<(), String> {
        let slots: Vec<usize> = blocks
            .iter()
            .map(|b| {
                self.slot_of(*b)
                    .ok_or_else(|| format!("{b} is not a /26 block of the observed pool"))
            })
            .collect::<Result<_, _>>()?;
        let mut st = self.state();
        let t = st
            .nodes
            .get_mut(node)
            .ok_or_else(|| format!("no node {node}"))?;
        for s in &mut t.slots {
            s.expected = false;
        }
        for &i in &slots {
            t.slots[i].expected = true;
        }
        t.want = slots.len();
        t.have = slots.iter().filter(|&&i| t.slots[i].since != 0).count();
        t.complete_at = (t.have == t.want).then(|| {
            slots
                .iter()
                .map(|&i| (t.slots[i].since, t.slots[i].since_bound))
                .max()
                .unwrap_or((0, 0))
        });
        Ok(())
    }

    /// The reader's lag since the last call, and starts measuring it anew.
    pub fn take_lag(&self) -> Lag {
        std::mem::take(&mut self.state().lag)
    }

    /// Block-route notifications seen so far.
    pub fn events(&self) -> u64 {
        self.state().events
    }

    /// Blocks every node expects, present: the time (monotonic ns) the last of them arrived
    /// in the last kernel, once all are; `None` on timeout. An overflow or a failed reader is
    /// an error.
    pub fn wait_converged(
        &self,
        deadline: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Stamp>, String> {
        self.wait(deadline, stop, |st| {
            let mut last = (0, 0);
            for t in &st.nodes {
                last = last.max(t.complete_at?);
            }
            Some(last)
        })
    }

    /// How many nodes hold every block they expect, and the fewest any node holds.
    pub fn progress(&self) -> (usize, usize, usize) {
        let st = self.state();
        let done = st.nodes.iter().filter(|t| t.complete_at.is_some()).count();
        let (worst, have) = st
            .nodes
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| t.have)
            .map(|(i, t)| (i, t.have))
            .unwrap_or((0, 0));
        (done, worst, have)
    }

    /// Waits until every node in `nodes` holds a route for `block` that arrived at or after
    /// `after`; the latest such arrival.
    pub fn wait_present(
        &self,
        block: ipnet::Ipv4Net,
        nodes: usize,
        after: u64,
        deadline: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Stamp>, String> {
        self.wait_each(block, nodes, deadline, stop, |s| {
            (s.since != 0 && s.since >= after).then_some((s.since, s.since_bound))
        })
    }

    /// Waits until no node in `nodes` holds a route for `block`, each deleted at or after
    /// `after`; the latest deletion.
    pub fn wait_absent(
        &self,
        block: ipnet::Ipv4Net,
        nodes: usize,
        after: u64,
        deadline: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Stamp>, String> {
        self.wait_each(block, nodes, deadline, stop, |s| {
            (s.since == 0 && s.gone_at >= after).then_some((s.gone_at, s.gone_bound))
        })
    }

    /// Waits until `done` gives a stamp for `block` on each of the first `nodes`; the latest.
    fn wait_each(
        &self,
        block: ipnet::Ipv4Net,
        nodes: usize,
        deadline: u64,
        stop: &dyn Fn() -> bool,
        done: impl Fn(&Slot) -> Option<(u64, u32)>,
    ) -> Result<Option<Stamp>, String> {
        let slot = self
            .slot_of(block)
            .ok_or_else(|| format!("{block} is not a /26 block of the observed pool"))?;
        self.wait(deadline, stop, |st| {
            let mut last = (0, 0);
            for t in st.nodes.iter().take(nodes) {
                last = last.max(done(&t.slots[slot])?);
            }
            Some(last)
        })
    }

    /// When node `node` got its route for `block` (0: absent) and when it last lost one
    /// (0: never), monotonic ns; (0, 0) for a block outside the pool or a node not observed.
    pub fn stamp(&self, block: ipnet::Ipv4Net, node: usize) -> (u64, u64) {
        let Some(slot) = self.slot_of(block) else {
            return (0, 0);
        };
        self.state()
            .nodes
            .get(node)
            .map_or((0, 0), |t| (t.slots[slot].since, t.slots[slot].gone_at))
    }

    /// Nodes (of the first `nodes`) holding a route for `block` now.
    pub fn holding(&self, block: ipnet::Ipv4Net, nodes: usize) -> usize {
        let Some(slot) = self.slot_of(block) else {
            return 0;
        };
        self.state()
            .nodes
            .iter()
            .take(nodes)
            .filter(|t| t.slots[slot].since != 0)
            .count()
    }

    fn wait(
        &self,
        deadline: u64,
        stop: &dyn Fn() -> bool,
        done: impl Fn(&State) -> Option<(u64, u32)>,
    ) -> Result<Option<Stamp>, String> {
        let (lock, cvar) = &*self.shared;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(e) = &st.failed {
                return Err(format!("the kernel observer failed: {e}"));
            }
            if let Some(&node) = st.overflowed.first() {
                return Err(format!(
                    "the kernel observer lost notifications (node {node}'s socket overflowed): \
                     its times are not to be trusted; rerun with fewer nodes"
                ));
            }
            if let Some((at, bound)) = done(&st) {
                return Ok(Some(Stamp {
                    at,
                    bound: Duration::from_nanos(u64::from(bound)),
                }));
            }
            let now = monotonic_ns();
            if now >= deadline || stop() {
                return Ok(None);
            }
            let wait = Duration::from_nanos((deadline - now).min(50_000_000));
            st = cvar
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for KernelObserver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// The slot of `addr/len` in the pool `base/pool_len`, when it is one of its /26 blocks.
fn slot_of(base: u32, pool_len: u8, addr: u32, len: u8) -> Option<usize> {
    if len != BLOCK_LEN || pool_len > BLOCK_LEN {
        return None;
    }
    let mask = if pool_len == 0 {
        0
    } else {
        u32::MAX << (32 - pool_len)
    };
    if addr & mask != base {
        return None;
    }
    Some(((addr - base) >> (32 - BLOCK_LEN)) as usize)
}

/// An epoll instance with every socket of `sockets` registered for reading, its event data
/// the socket's index (shared with the scale bench's kernel floor).
pub fn epoll_of(sockets: &[Socket]) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain syscall; the descriptor is owned right away.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(format!(
            "epoll_create1: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `ep` is a fresh descriptor nobody else owns.
    let ep = unsafe { std::os::fd::OwnedFd::from_raw_fd(ep) };
    for (i, s) in sockets.iter().enumerate() {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: i as u64,
        };
        // SAFETY: registering our own socket with our own epoll instance.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) }
            != 0
        {
            return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(ep)
}

/// A route socket in the calling thread's namespace, subscribed to IPv4 route changes,
/// non-blocking.
fn open_socket() -> std::io::Result<Socket> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.add_membership(RTNLGRP_IPV4_ROUTE)?;
    sock.set_non_blocking(true)?;
    // SAFETY: setsockopt with an int on our own socket; a refusal leaves the default size,
    // and an overflow is then reported, not hidden.
    unsafe {
        let fd = sock.as_raw_fd();
        let p = &RCVBUF as *const libc::c_int as *const libc::c_void;
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, p, 4) != 0 {
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, p, 4);
        }
    }
    Ok(sock)
}

/// SCHED_FIFO for the calling thread, so that the daemons' load does not delay the clock;
/// whether it was granted.
fn make_realtime() -> bool {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: changes only the calling thread's policy; prctl sets its own timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0
    }
}

fn read_loop(
    sockets: Vec<Socket>,
    base: u32,
    pool_len: u8,
    shared: &(Mutex<State>, Condvar),
    stop: &AtomicBool,
) {
    let fail = |e: String| {
        let mut st = shared.0.lock().unwrap_or_else(|p| p.into_inner());
        st.failed = Some(e);
        shared.1.notify_all();
    };
    // Closed when this function returns.
    let epoll = match epoll_of(&sockets) {
        Ok(ep) => ep,
        Err(e) => return fail(e),
    };
    let ep = epoll.as_raw_fd();
    // epoll lists every ready socket in one wait: a socket it leaves out is empty.
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; sockets.len().max(1)];
    let mut buf = vec![0u8; 64 * 1024];
    // Stamped routes of one pass (node, slot, deleted, at, bound), applied under the lock
    // once per pass.
    let mut batch: Vec<(usize, u32, bool, u64, u32)> = Vec::new();
    let timeout_ms = WAKE_PROBE.as_millis() as i32;
    // When each socket was last found empty (a read found nothing), and the last pass it
    // was listed in; the previous pass's number and return time.
    let opened = monotonic_ns();
    let mut drained_at = vec![opened; sockets.len()];
    let mut listed_in = vec![0u64; sockets.len()];
    let (mut pass, mut prev_ret) = (0u64, opened);
    while !stop.load(Ordering::SeqCst) {
        let called = monotonic_ns();
        // SAFETY: waiting on our epoll instance into our own event array.
        let n =
            unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, timeout_ms) };
        let woke = monotonic_ns();
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return fail(format!("epoll_wait: {e}"));
        }
        pass += 1;
        // A wait that slept began with every socket empty.
        let slept_floor = if woke - called > SLEPT { called } else { 0 };
        let mut overflowed = Vec::new();
        for ev in &events[..n as usize] {
            let node = ev.u64 as usize;
            let fd = sockets[node].as_raw_fd();
            // Not listed by the previous wait: empty when it returned.
            let unlisted_floor = if listed_in[node] + 1 != pass {
                prev_ret
            } else {
                0
            };
            listed_in[node] = pass;
            loop {
                // SAFETY: receiving into our own buffer from our own non-blocking socket.
                let got =
                    unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
                if got < 0 {
                    match std::io::Error::last_os_error().raw_os_error() {
                        Some(libc::EINTR) => continue,
                        Some(libc::ENOBUFS) => {
                            overflowed.push(node);
                            continue;
                        }
                        _ => {
                            // EAGAIN: drained.
                            drained_at[node] = monotonic_ns();
                            break;
                        }
                    }
                }
                let at = monotonic_ns();
                let empty = drained_at[node].max(unlisted_floor).max(slept_floor);
                let bound = ns32(at.saturating_sub(empty));
                for (deleted, addr, len) in block_routes(&buf[..got as usize]) {
                    if let Some(slot) = slot_of(base, pool_len, addr, len) {
                        batch.push((node, slot as u32, deleted, at, bound));
                    }
                }
            }
        }
        prev_ret = woke;
        let done = monotonic_ns();
        let mut st = shared.0.lock().unwrap_or_else(|p| p.into_inner());
        if n == 0 {
            let late = Duration::from_nanos(woke.saturating_sub(called)).saturating_sub(WAKE_PROBE);
            st.lag.max_wake = st.lag.max_wake.max(late);
        } else {
            st.lag.max_pass = st.lag.max_pass.max(Duration::from_nanos(done - woke));
        }
        st.overflowed.extend(overflowed);
        st.events += batch.len() as u64;
        for (node, slot, deleted, at, bound) in batch.drain(..) {
            let b = Duration::from_nanos(u64::from(bound));
            st.lag.max_bound = st.lag.max_bound.max(b);
            apply(&mut st.nodes[node], slot as usize, deleted, at, bound);
        }
        drop(st);
        if n > 0 {
            shared.1.notify_all();
        }
    }
}

fn apply(t: &mut NodeTable, slot: usize, deleted: bool, at: u64, bound: u32) {
    let s = &mut t.slots[slot];
    let was = s.since != 0;
    if deleted {
        // A deletion of one route of a prefix with several (e.g. two metrics) still leaves
        // one; the observer counts prefixes, so a later RTM_NEWROUTE brings it back.
        s.since = 0;
        s.gone_at = at;
        s.gone_bound = bound;
    } else if !was {
        s.since = at;
        s.since_bound = bound;
    }
    let is = s.since != 0;
    if s.expected && was != is {
        if is {
            t.have += 1;
        } else {
            t.have -= 1;
        }
        // The completing route is the latest: its stamp is the node's.
        t.complete_at = (t.have == t.want).then_some((at, bound));
    }
}

/// (deleted, destination, prefix length) of the IPv4 /26 routes of the main table in one
/// read. Only the header is decoded for the others: at a thousand nodes the observer reads
/// millions of notifications, and its time is taken from the daemons' two cores.
fn block_routes(data: &[u8]) -> Vec<(bool, u32, u8)> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= data.len() {
        let len =
            u32::from_ne_bytes([data[off], data[off + 1], data[off + 2], data[off + 3]]) as usize;
        if len < 16 || off + len > data.len() {
            break;
        }
        let msg_type = u16::from_ne_bytes([data[off + 4], data[off + 5]]);
        let payload = &data[off + 16..off + len];
        off += (len + 3) & !3;
        if msg_type != RTM_NEWROUTE && msg_type != RTM_DELROUTE {
            continue;
        }
        let Ok(h) = RouteHeader::parse(payload) else {
            continue;
        };
        if h.address_family != AddressFamily::Inet
            || h.destination_prefix_length != BLOCK_LEN
            || h.table != RouteHeader::RT_TABLE_MAIN
        {
            continue;
        }
        if let Some(dst) = route_destination(&payload[RTMSG_LEN.min(payload.len())..]) {
            out.push((msg_type == RTM_DELROUTE, dst, h.destination_prefix_length));
        }
    }
    out
}

/// RTA_DST of an IPv4 route's attributes (struct rtattr: length u16, type u16, value,
/// padded to 4 bytes).
fn route_destination(mut attrs: &[u8]) -> Option<u32> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == RTA_DST && len == 8 {
            return Some(u32::from_be_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]));
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    None
}

/// A block's address as the observer's key would see it (for tests).
pub fn block_slot(pool: ipnet::Ipv4Net, block: Ipv4Addr, len: u8) -> Option<usize> {
    slot_of(
        u32::from(pool.network()),
        pool.prefix_len(),
        u32::from(block),
        len,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_destination_of_a_route_notification() {
        // struct nlmsghdr, struct rtmsg (AF_INET, /26, main table), RTA_TABLE, RTA_DST.
        let mut m = Vec::new();
        let body: Vec<u8> = [
            vec![2, 26, 0, 0, 254, 80, 0, 1, 0, 0, 0, 0],
            [8u16.to_ne_bytes(), 15u16.to_ne_bytes()].concat(),
            254u32.to_ne_bytes().to_vec(),
            [8u16.to_ne_bytes(), RTA_DST.to_ne_bytes()].concat(),
            vec![172, 20, 3, 64],
        ]
        .concat();
        m.extend(((16 + body.len()) as u32).to_ne_bytes());
        m.extend(RTM_NEWROUTE.to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend(&body);
        let dst = u32::from(Ipv4Addr::new(172, 20, 3, 64));
        assert_eq!(block_routes(&m), vec![(false, dst, 26)]);
        // A /32 of the pool is not a block, and is skipped before its attributes are read.
        m[16 + 1] = 32;
        assert_eq!(block_routes(&m), vec![]);
    }

    #[test]
    fn slots_cover_the_pool_blocks_only() {
        let pool: ipnet::Ipv4Net = "172.20.0.0/16".parse().unwrap();
        assert_eq!(block_slot(pool, Ipv4Addr::new(172, 20, 0, 0), 26), Some(0));
        assert_eq!(
            block_slot(pool, Ipv4Addr::new(172, 20, 3, 64), 26),
            Some(13)
        );
        assert_eq!(
            block_slot(pool, Ipv4Addr::new(172, 20, 255, 192), 26),
            Some(1023)
        );
        assert_eq!(block_slot(pool, Ipv4Addr::new(172, 21, 0, 0), 26), None);
        assert_eq!(block_slot(pool, Ipv4Addr::new(172, 20, 0, 1), 32), None);
        let big: ipnet::Ipv4Net = "172.20.0.0/14".parse().unwrap();
        assert_eq!(
            block_slot(big, Ipv4Addr::new(172, 23, 255, 192), 26),
            Some(4095)
        );
    }

    #[test]
    fn a_node_completes_with_its_last_expected_route_and_uncompletes_on_loss() {
        let mut t = NodeTable {
            slots: vec![Slot::default(); 8],
            want: 2,
            ..Default::default()
        };
        t.slots[1].expected = true;
        t.slots[5].expected = true;
        apply(&mut t, 1, false, 100, 1);
        apply(&mut t, 3, false, 150, 1); // not expected
        assert_eq!(t.complete_at, None);
        apply(&mut t, 5, false, 200, 7);
        assert_eq!(t.complete_at, Some((200, 7)));
        // A replacement keeps the first arrival.
        apply(&mut t, 5, false, 300, 1);
        assert_eq!((t.slots[5].since, t.complete_at), (200, Some((200, 7))));
        apply(&mut t, 1, true, 400, 2);
        assert_eq!((t.have, t.complete_at, t.slots[1].gone_at), (1, None, 400));
        apply(&mut t, 1, false, 500, 3);
        assert_eq!(t.complete_at, Some((500, 3)));
    }
}
