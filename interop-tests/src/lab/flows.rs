//! Traffic between the lab's pods, to check what network policy lets through: servers
//! inside every pod's namespace (TCP 53, 80, 81 and UDP 53, 80, both families), one probe
//! per flow (TCP connect, UDP, ping), and a check of many flows at once that names each one
//! that went the wrong way. Shared by the policy tests on every datastore.
//!
//! Policy takes effect asynchronously: a flow that must pass is retried for a few seconds; a
//! flow that must not pass is probed once, so its caller waits until the node's nft table
//! shows the change first (else a drop would prove nothing). Servers are threads of the test
//! process inside the pods' namespaces (the process stays in the host's).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use super::local::LocalLab;

/// How long a probe of a flow that must not pass waits for an answer.
pub const BLOCKED_WAIT: Duration = Duration::from_millis(1500);
/// How long a flow that must pass may take to start passing (policy is asynchronous).
pub const PASS_WITHIN: Duration = Duration::from_secs(8);
/// How long the nft table may take to show a change.
pub const NFT_WITHIN: Duration = Duration::from_secs(10);
pub const TCP_PORTS: [u16; 3] = [53, 80, 81];
pub const UDP_PORTS: [u16; 2] = [53, 80];

#[derive(Clone, Copy, Debug)]
pub enum Probe {
    Tcp(u16),
    Udp(u16),
    Ping,
}
pub use Probe::{Ping, Tcp, Udp};

/// One flow to check: from a pod to a pod's address of one family, and whether it must pass.
#[derive(Clone, Debug)]
pub struct Flow {
    pub from: &'static str,
    pub to: &'static str,
    pub probe: Probe,
    pub v6: bool,
    pub passes: bool,
}

pub fn ok(from: &'static str, to: &'static str, probe: Probe) -> Flow {
    Flow {
        from,
        to,
        probe,
        v6: false,
        passes: true,
    }
}

pub fn no(from: &'static str, to: &'static str, probe: Probe) -> Flow {
    Flow {
        passes: false,
        ..ok(from, to, probe)
    }
}

impl Flow {
    pub fn v6(mut self) -> Flow {
        self.v6 = true;
        self
    }
}

/// Moves the calling thread (only it) into a namespace.
pub fn enter(netns: &str) {
    let path = format!("/var/run/netns/{netns}");
    let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    // SAFETY: setns(2) on a namespace file we opened; it moves only this thread.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

/// Answers TCP (53, 80, 81: "ok" after the first bytes) and UDP (53, 80: "ok" to every
/// datagram) on every address of a pod, both families, from threads inside its namespace.
pub fn serve(netns: &str) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    for port in TCP_PORTS {
        let (netns, ready) = (netns.to_owned(), ready_tx.clone());
        std::thread::spawn(move || {
            enter(&netns);
            let l = match TcpListener::bind(("::", port)) {
                Ok(l) => l,
                Err(e) => return ready.send(Err(format!("{netns} tcp {port}: {e}"))).unwrap(),
            };
            ready.send(Ok(())).unwrap();
            for mut s in l.incoming().flatten() {
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = s.read(&mut [0u8; 16]);
                let _ = s.write_all(b"ok\n");
            }
        });
    }
    for port in UDP_PORTS {
        let (netns, ready) = (netns.to_owned(), ready_tx.clone());
        std::thread::spawn(move || {
            enter(&netns);
            let s = match UdpSocket::bind(("::", port)) {
                Ok(s) => s,
                Err(e) => return ready.send(Err(format!("{netns} udp {port}: {e}"))).unwrap(),
            };
            ready.send(Ok(())).unwrap();
            let mut buf = [0u8; 64];
            while let Ok((_, peer)) = s.recv_from(&mut buf) {
                let _ = s.send_to(b"ok", peer);
            }
        });
    }
    for _ in 0..TCP_PORTS.len() + UDP_PORTS.len() {
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap();
    }
}

/// One attempt of a probe from inside `netns` (this thread moves there for TCP and UDP).
pub fn probe_once(netns: &str, to: IpAddr, probe: Probe, wait: Duration) -> bool {
    let answered = |mut s: TcpStream| -> std::io::Result<bool> {
        s.set_read_timeout(Some(wait))?;
        s.write_all(b"hi\n")?;
        let mut buf = [0u8; 3];
        s.read_exact(&mut buf)?;
        Ok(&buf == b"ok\n")
    };
    match probe {
        Ping => {
            let secs = wait.as_secs().max(1).to_string();
            let to = to.to_string();
            Command::new("ip")
                .args([
                    "netns", "exec", netns, "ping", "-n", "-q", "-c", "1", "-W", &secs, &to,
                ])
                .output()
                .is_ok_and(|o| o.status.success())
        }
        Tcp(port) => {
            enter(netns);
            TcpStream::connect_timeout(&SocketAddr::new(to, port), wait)
                .and_then(answered)
                .unwrap_or(false)
        }
        Udp(port) => {
            enter(netns);
            let bind = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
            let Ok(s) = UdpSocket::bind(bind) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(wait));
            let mut buf = [0u8; 8];
            s.send_to(b"hi", SocketAddr::new(to, port)).is_ok()
                && s.recv_from(&mut buf).is_ok_and(|(n, _)| &buf[..n] == b"ok")
        }
    }
}

/// The node a pod (`node-N-x`) runs on.
pub fn node_of(pod: &str) -> String {
    pod.splitn(3, '-').take(2).collect::<Vec<_>>().join("-")
}

/// Pod → (IPv4, IPv6) addresses, from `margay-lab status`.
pub fn pod_addresses(status: &str) -> HashMap<String, (IpAddr, IpAddr)> {
    status
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.first() == Some(&"pod") && w.len() >= 4).then(|| {
                (
                    w[1].to_owned(),
                    (w[2].parse().unwrap(), w[3].parse().unwrap()),
                )
            })
        })
        .collect()
}

/// `nft list table inet margay-policy` in a node's namespace.
pub fn policy_table(lab: &LocalLab, node: &str) -> String {
    lab.exec(node, &["nft", "list", "table", "inet", "margay-policy"])
        .1
}

/// Checks every flow (in parallel) between pods of `lab` (`addresses` from [`pod_addresses`])
/// and panics naming each that went the wrong way, with the policy tables of the nodes
/// involved.
pub fn check(
    lab: &LocalLab,
    addresses: &HashMap<String, (IpAddr, IpAddr)>,
    scenario: &str,
    flows: &[Flow],
) {
    let started = Instant::now();
    let address = |pod: &str, v6: bool| {
        let (a, a6) = addresses
            .get(pod)
            .unwrap_or_else(|| panic!("no pod {pod} in the lab"));
        if v6 { *a6 } else { *a }
    };
    let results: Vec<(Flow, bool)> = std::thread::scope(|s| {
        let handles: Vec<_> = flows
            .iter()
            .map(|f| {
                let netns = lab.ns(f.from);
                let to = address(f.to, f.v6);
                s.spawn(move || {
                    if !f.passes {
                        return (f.clone(), probe_once(&netns, to, f.probe, BLOCKED_WAIT));
                    }
                    let deadline = Instant::now() + PASS_WITHIN;
                    loop {
                        if probe_once(&netns, to, f.probe, Duration::from_secs(1)) {
                            return (f.clone(), true);
                        }
                        if Instant::now() > deadline {
                            return (f.clone(), false);
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wrong: Vec<String> = results
        .iter()
        .filter(|(f, passed)| f.passes != *passed)
        .map(|(f, passed)| {
            let fam = if f.v6 { "IPv6" } else { "IPv4" };
            let what = if *passed {
                "passed, must not"
            } else {
                "did not pass, must"
            };
            format!("  {} -> {} {fam} {:?}: {what}", f.from, f.to, f.probe)
        })
        .collect();
    if !wrong.is_empty() {
        let mut nodes: Vec<String> = flows
            .iter()
            .flat_map(|f| [node_of(f.from), node_of(f.to)])
            .collect();
        nodes.sort();
        nodes.dedup();
        let tables: String = nodes
            .iter()
            .map(|n| format!("== {n}\n{}\n", policy_table(lab, n)))
            .collect();
        panic!("{scenario}:\n{}\n{tables}", wrong.join("\n"));
    }
    println!(
        "{scenario}: {} flows as expected in {:?}",
        flows.len(),
        started.elapsed()
    );
}

/// Waits (up to [`NFT_WITHIN`]) until a node's policy table satisfies `holds`; panics with
/// the table, saying it never `what`.
pub fn wait_table(lab: &LocalLab, node: &str, what: &str, holds: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + NFT_WITHIN;
    loop {
        let t = policy_table(lab, node);
        if holds(&t) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{node}'s table never {what}:\n{t}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
