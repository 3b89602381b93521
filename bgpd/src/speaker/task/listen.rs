//! The BGP listeners: bound with the first peer (IPv4, and IPv6 beside an unspecified IPv4
//! address), one accept task each that queues connections to the speaker as
//! `Command::Accepted`, bound again when the port changes. Each peer's MD5 key is installed
//! on them (accepted connections inherit it), and an accepted connection is checked against
//! its peer's TTL security before its session gets it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;

use tokio::net::{TcpListener, TcpStream};

use super::{Command, PeerSpec, Speaker, SpeakerError, ToSession};
use crate::speaker::sockopt;

/// A listening socket and its accept task.
pub(super) struct Listener {
    task: tokio::task::JoinHandle<()>,
    /// For per-peer MD5 keys (accepted connections inherit them).
    fd: Option<std::os::fd::OwnedFd>,
    ipv6: bool,
}

impl Speaker {
    pub(super) async fn ensure_listening(&mut self) -> Result<(), SpeakerError> {
        if !self.listeners.is_empty() || self.config.listen.port() == 0 {
            return Ok(());
        }
        let addr = self.config.listen;
        let listener = bind(addr).map_err(|source| SpeakerError::Listen { addr, source })?;
        self.spawn_listener(listener, addr.is_ipv6());
        tracing::info!(%addr, "BGP listening");
        if addr.ip() == IpAddr::V4(Ipv4Addr::UNSPECIFIED) {
            // IPv6 peers too; a host without IPv6 only loses them.
            let addr6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, addr.port()));
            match bind(addr6) {
                Ok(l) => {
                    self.spawn_listener(l, true);
                    tracing::info!(addr = %addr6, "BGP listening");
                }
                Err(e) => {
                    tracing::warn!(addr = %addr6, error = %e, "cannot listen for BGP on IPv6; IPv6 peers must connect out")
                }
            }
        }
        let specs: Vec<PeerSpec> = self.peers.values().map(|p| p.spec.clone()).collect();
        for spec in &specs {
            self.listener_key(spec, true);
        }
        Ok(())
    }

    fn spawn_listener(&mut self, listener: TcpListener, ipv6: bool) {
        let fd = listener.as_fd().try_clone_to_owned().ok();
        if let Err(e) = sockopt::save_syns(listener.as_fd()) {
            tracing::warn!(error = %e, "cannot keep SYNs: TTL security (GTSM) is checked only after a connection's first bytes");
        }
        let tx = self.self_tx.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((s, from)) => {
                        if tx.send(Command::Accepted(s, from)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "BGP accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        });
        self.listeners.push(Listener { task, fd, ipv6 });
    }

    /// Install (or remove) a peer's MD5 key on the listening socket.
    pub(super) fn listener_key(&self, spec: &PeerSpec, install: bool) {
        let Some(p) = spec.transport.password.as_ref() else {
            return;
        };
        let key = install.then(|| p.as_bytes());
        for l in &self.listeners {
            let Some(fd) = l.fd.as_ref().filter(|_| l.ipv6 == spec.address.is_ipv6()) else {
                continue;
            };
            if let Err(e) = sockopt::set_md5(fd.as_fd(), spec.address, key) {
                tracing::warn!(peer = %spec.address, error = %e, "cannot set the TCP MD5 key on the BGP listener");
            }
        }
    }

    /// Listen on `port` instead (peers to come connect there; sessions up stay up).
    pub(super) async fn relisten(&mut self, port: u16) -> Result<(), SpeakerError> {
        if !self.listeners.is_empty() {
            for l in self.listeners.drain(..) {
                l.task.abort();
            }
            // Let the aborted tasks drop their sockets before binding the new port.
            tokio::task::yield_now().await;
        }
        self.config.listen.set_port(port);
        if !self.peers.is_empty() {
            self.ensure_listening().await?;
        }
        tracing::info!(port, "BGP listen port changed");
        Ok(())
    }

    /// Hand a connection to the session of its peer, if it is one and passes its TTL check.
    pub(super) fn accepted(&mut self, stream: TcpStream, from: SocketAddr) {
        let Some(p) = self.peers.get_mut(&from.ip().to_canonical()) else {
            tracing::info!(%from, "connection from an unknown peer refused");
            return;
        };
        // GTSM: judge the peer by its SYN, before any of its data is read.
        if let (_, Some(min)) = p.spec.transport.ttls()
            && let Ok(Some(ttl)) = sockopt::syn_ttl(stream.as_fd())
            && ttl < min
        {
            p.last_error = Some(format!(
                "refused a connection from {from} with TTL {ttl}: TTL security (GTSM) wants at least {min}"
            ));
            tracing::info!(%from, ttl, min, "connection refused by TTL security");
            return;
        }
        if let Err(e) = p.spec.transport.apply_ttls(stream.as_fd(), from.is_ipv6()) {
            tracing::warn!(%from, error = %e, "cannot set TTLs on an accepted connection; refused");
            return;
        }
        let _ = p.tx.send(ToSession::Incoming(Box::new(stream)));
    }
}

/// A listener with a real backlog (BIRD 1.6's 8 drops SYNs in a mesh) and SO_REUSEADDR.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if addr.is_ipv6() {
        // IPv4 peers have their own listener.
        sockopt::set_v6only(socket.as_fd())?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}
