//! scale_bench's kernel floor (`--impl floor`): what the kernels of this one machine take to
//! hold a run's routes when nothing but the routes is done, the least any implementation's
//! figure can be.
//!
//! All network namespaces of a machine share one kernel: route writes of every namespace
//! take one lock (RTNL), and each route change is offered to every socket of the machine
//! subscribed to route notifications (the kernel walks them all and skips those of other
//! namespaces). A run of N nodes writes about 4N² routes, each walking about 2N sockets (the
//! observer's, and each node's daemon watching its kernel: routewriter's monitor, BIRD's
//! kernel protocol), so this part grows with N³ and no daemon can avoid it here. On a real
//! cluster each node has a kernel of its own.
//!
//! The floor does exactly that part: before t0, one netlink socket to write with in every
//! node namespace, and one subscribed to IPv4 route notifications that a thread drains (the
//! stand-in for a daemon's watch); from t0, one writer thread per core writes each node's
//! routes to every other node's blocks (`via` the node's address, protocol 80) in batches,
//! with routewriter's own batched netlink writer. No BGP, no datastore, no process start.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use interop_tests::bench::monotonic_ns;
use interop_tests::lab::mesh::{self, Mesh};
use interop_tests::lab::{kernel_observer, procstat};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};
use routewriter::kernel::Kernel;
use routewriter::reconcile::{RouteOp, Why};
use routewriter::routes::{DevId, Kind, Prefix, RouteSpec};

const RTNLGRP_IPV4_ROUTE: u32 = 7;
const MAIN_TABLE: u32 = 254;
const PROTOCOL: u8 = 80;

/// The floor's threads while they run, and the CPU they used.
pub struct Floor {
    stop: Arc<AtomicBool>,
    /// Set by a writer that failed (the run's wait stops on it).
    failed: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Result<f64, String>>>,
}

impl Floor {
    pub fn failed_flag(&self) -> Arc<AtomicBool> {
        self.failed.clone()
    }

    /// Waits for the writers (done by now, at convergence), stops the drain; CPU seconds of
    /// all the floor's threads.
    pub fn finish(mut self) -> Result<f64, String> {
        self.stop.store(true, Ordering::SeqCst);
        let mut cpu = 0.0;
        for t in self.threads.drain(..) {
            cpu += t
                .join()
                .map_err(|_| "a floor thread panicked".to_string())??;
        }
        Ok(cpu)
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Opens the sockets (before t0), then starts the writers; (floor, t0).
pub fn start(mesh: &Mesh) -> Result<(Floor, u64), String> {
    let n = mesh.nodes.len();
    let mut writers = Vec::with_capacity(n);
    let mut watchers = Vec::with_capacity(n);
    for node in &mesh.nodes {
        let (k, w) = node
            .ns
            .run_in(|| {
                let k = Kernel::open().map_err(|e| e.to_string())?;
                let mut w = Socket::new(NETLINK_ROUTE).map_err(|e| e.to_string())?;
                w.bind_auto().map_err(|e| e.to_string())?;
                w.add_membership(RTNLGRP_IPV4_ROUTE)
                    .map_err(|e| e.to_string())?;
                w.set_non_blocking(true).map_err(|e| e.to_string())?;
                Ok::<_, String>((k, w))
            })
            .map_err(|e| format!("entering {}: {e}", node.ns.name()))??;
        writers.push(k);
        watchers.push(w);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    {
        let stop = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name("floor-watch".into())
                .spawn(move || drain(watchers, &stop))
                .map_err(|e| format!("the floor's watch thread: {e}"))?,
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let writers: Arc<Vec<std::sync::Mutex<Kernel>>> =
        Arc::new(writers.into_iter().map(std::sync::Mutex::new).collect());
    let addrs: Arc<Vec<std::net::Ipv4Addr>> = Arc::new(mesh.nodes.iter().map(|m| m.addr).collect());
    let t0 = monotonic_ns();
    for w in 0..cores {
        let (next, writers, addrs) = (next.clone(), writers.clone(), addrs.clone());
        let failed = failed.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("floor-write-{w}"))
                .spawn(move || {
                    let r = write_all(&next, &writers, &addrs);
                    failed.fetch_or(r.is_err(), Ordering::SeqCst);
                    r
                })
                .map_err(|e| format!("a floor writer: {e}"))?,
        );
    }
    Ok((
        Floor {
            stop,
            failed,
            threads,
        },
        t0,
    ))
}

/// One writer: takes nodes in turn (so every core works until the last node) and writes
/// each node's routes; its CPU seconds.
fn write_all(
    next: &AtomicUsize,
    writers: &[std::sync::Mutex<Kernel>],
    addrs: &[std::net::Ipv4Addr],
) -> Result<f64, String> {
    loop {
        let i = next.fetch_add(1, Ordering::SeqCst);
        if i >= addrs.len() {
            return Ok(procstat::thread_cpu().as_secs_f64());
        }
        let ops = routes_of(addrs, i);
        let mut k = writers[i].lock().unwrap_or_else(|p| p.into_inner());
        let refused = k
            .apply_routes(&ops, MAIN_TABLE, PROTOCOL)
            .map_err(|e| format!("{}: {e}", mesh::node_name(i)))?;
        if let Some(r) = refused.first() {
            return Err(format!(
                "{}: {} routes refused, the first: {:?}",
                mesh::node_name(i),
                refused.len(),
                r.error
            ));
        }
    }
}

/// Node `i`'s routes: every other node's blocks via that node.
fn routes_of(addrs: &[std::net::Ipv4Addr], i: usize) -> Vec<RouteOp> {
    let mut ops = Vec::with_capacity((addrs.len() - 1) * mesh::BLOCKS_PER_NODE);
    for (j, via) in addrs.iter().enumerate() {
        if j == i {
            continue;
        }
        for b in mesh::node_blocks(j) {
            if let Some(prefix) = Prefix::new(b.network().into(), b.prefix_len()) {
                ops.push(RouteOp::Write {
                    prefix,
                    spec: RouteSpec::new(Kind::Gateway, Some((*via).into()), DevId::NONE, false),
                    oif: 0,
                    why: Why::Missing,
                });
            }
        }
    }
    ops
}

/// Reads every watch socket until `stop`, as a daemon reads its kernel's notifications.
fn drain(sockets: Vec<Socket>, stop: &AtomicBool) -> Result<f64, String> {
    // Closed when this function returns.
    let epoll = kernel_observer::epoll_of(&sockets)?;
    let ep = epoll.as_raw_fd();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = vec![0u8; 256 * 1024];
    while !stop.load(Ordering::SeqCst) {
        // SAFETY: epoll_wait fills at most `events.len()` entries of our buffer.
        let ready =
            unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as libc::c_int, 50) };
        for ev in events.iter().take(ready.max(0) as usize) {
            let s = &sockets[ev.u64 as usize];
            // Non-blocking: read until empty (an overflow's ENOBUFS is only counted by a
            // daemon; here it is one more error to read past).
            loop {
                match s.recv(&mut &mut buf[..], 0) {
                    Ok(got) if got > 0 => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                    _ => break,
                }
            }
        }
    }
    Ok(procstat::thread_cpu().as_secs_f64())
}
