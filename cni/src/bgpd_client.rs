//! The plugins' only line to the cluster: bgpd's `Ipam` and `Pools` services over its unix
//! socket. Every call is bounded twice: each attempt by `bgpd_timeout_seconds`, and retries of
//! transient failures (socket absent or refused, datastore down, write contention, a connection
//! dropped mid-call) by `bgpd_retry_seconds` with exponential backoff. What is left after that
//! is an [`IpamError`] that says whether the runtime should try again later (code 11).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proto::v1 as pb;
use proto::v1::ipam_client::IpamClient;
use proto::v1::policy_client::PolicyClient;
use proto::v1::pools_client::PoolsClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::retry::Backoff;
use crate::spec::error::{CniError, code};

#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error(
        "cannot reach bgpd at {socket} ({attempts} attempts in {elapsed:.1?}): {reason} (is bgpd running? the network configuration's \"socket\" names its socket)"
    )]
    Unreachable {
        socket: PathBuf,
        reason: String,
        attempts: u32,
        elapsed: Duration,
    },
    #[error("bgpd could not {what} ({attempts} attempts in {elapsed:.1?}): {reason}")]
    Transient {
        what: &'static str,
        reason: String,
        attempts: u32,
        elapsed: Duration,
    },
    #[error("no address available: {0}")]
    Exhausted(String),
    #[error("bgpd refused to {what}: {reason}")]
    Refused { what: &'static str, reason: String },
    #[error("bgpd knows no allocation under handle {0}")]
    NotFound(String),
}

impl IpamError {
    /// Whether the runtime should simply try again later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            IpamError::Unreachable { .. } | IpamError::Transient { .. }
        )
    }

    pub fn to_cni(&self) -> CniError {
        let code = match self {
            IpamError::Unreachable { .. } | IpamError::Transient { .. } => code::TRY_AGAIN_LATER,
            IpamError::Exhausted(_) => code::NO_ADDRESS,
            IpamError::Refused { .. } | IpamError::NotFound(_) => code::IPAM_REFUSED,
        };
        CniError::new(code, self.to_string())
    }
}

/// How a failed attempt is handled.
enum Failure {
    /// Worth another attempt (the reason, for the final error).
    Retry(String),
    Fatal(IpamError),
}

/// Sorts a gRPC status: what may clear up by itself is retried, the rest is final.
fn classify(what: &'static str, s: &Status) -> Failure {
    let reason = if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        s.message().to_owned()
    };
    match s.code() {
        // Datastore down, connection lost, write conflicts: all pass.
        Code::Unavailable
        | Code::Aborted
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown => Failure::Retry(reason),
        Code::ResourceExhausted => Failure::Fatal(IpamError::Exhausted(reason)),
        Code::NotFound => Failure::Fatal(IpamError::NotFound(reason)),
        _ => Failure::Fatal(IpamError::Refused { what, reason }),
    }
}

pub struct Bgpd {
    socket: PathBuf,
    timeout: Duration,
    retry: Duration,
    channel: Option<Channel>,
}

impl Bgpd {
    pub fn new(socket: &Path, timeout: Duration, retry: Duration) -> Bgpd {
        Bgpd {
            socket: socket.to_owned(),
            timeout,
            retry,
            channel: None,
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Another client to the same bgpd, sharing the connection.
    pub fn clone_config(&self) -> Bgpd {
        Bgpd {
            socket: self.socket.clone(),
            timeout: self.timeout,
            retry: self.retry,
            channel: self.channel.clone(),
        }
    }

    /// Runs `call` until it succeeds, fails for good, or the retry budget is spent. `call`
    /// gets a connected channel and the attempt number (0 first).
    async fn call<T, F, Fut>(&mut self, what: &'static str, mut call: F) -> Result<T, IpamError>
    where
        F: FnMut(Channel, u32) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let started = Instant::now();
        let mut backoff = Backoff::new(self.retry);
        let mut attempt = 0u32;
        loop {
            let (reason, connected) = match self.connect().await {
                Err(reason) => (reason, false),
                Ok(channel) => {
                    match tokio::time::timeout(self.timeout, call(channel, attempt)).await {
                        Ok(Ok(v)) => return Ok(v),
                        Ok(Err(status)) => match classify(what, &status) {
                            Failure::Fatal(e) => return Err(e),
                            Failure::Retry(reason) => (reason, true),
                        },
                        Err(_) => (format!("no answer within {:?}", self.timeout), true),
                    }
                }
            };
            attempt += 1;
            // A fresh connection for the next attempt: the old one may be what failed.
            self.channel = None;
            tracing::debug!(what, attempt, %reason, "bgpd call failed");
            match backoff.after_failure(started.elapsed()) {
                Some(pause) => tokio::time::sleep(pause).await,
                None => {
                    let (attempts, elapsed) = (backoff.attempts, started.elapsed());
                    return Err(if connected {
                        IpamError::Transient {
                            what,
                            reason,
                            attempts,
                            elapsed,
                        }
                    } else {
                        IpamError::Unreachable {
                            socket: self.socket.clone(),
                            reason,
                            attempts,
                            elapsed,
                        }
                    });
                }
            }
        }
    }

    async fn connect(&mut self) -> Result<Channel, String> {
        if let Some(c) = &self.channel {
            return Ok(c.clone());
        }
        let connecting = proto::client::connect_unix(&self.socket);
        match tokio::time::timeout(self.timeout, connecting).await {
            Ok(Ok(c)) => {
                self.channel = Some(c.clone());
                Ok(c)
            }
            Ok(Err(proto::client::Unreachable { reason, .. })) => Err(reason),
            Err(_) => Err(format!("connecting took longer than {:?}", self.timeout)),
        }
    }

    /// Allocates addresses under `req.handle`. A retry first releases the handle: an attempt
    /// whose answer was lost may have allocated already, and the handle is this container's
    /// alone, so releasing it cannot free anything else.
    pub async fn auto_assign(
        &mut self,
        req: pb::AutoAssignRequest,
    ) -> Result<pb::AutoAssignResponse, IpamError> {
        self.assign(req, true).await
    }

    /// Allocates more addresses under a handle that already holds some. A retry cannot release
    /// the handle first, so an attempt whose answer was lost may leave an address under it that
    /// the caller never saw: the caller gives back what the handle holds beyond its result.
    pub async fn auto_assign_more(
        &mut self,
        req: pb::AutoAssignRequest,
    ) -> Result<pb::AutoAssignResponse, IpamError> {
        self.assign(req, false).await
    }

    async fn assign(
        &mut self,
        req: pb::AutoAssignRequest,
        fresh: bool,
    ) -> Result<pb::AutoAssignResponse, IpamError> {
        self.call("allocate addresses", |ch, attempt| {
            let req = req.clone();
            async move {
                let mut c = IpamClient::new(ch);
                if attempt > 0 && fresh {
                    c.release_by_handle(pb::ReleaseByHandleRequest {
                        handle: req.handle.clone(),
                    })
                    .await?;
                }
                Ok(c.auto_assign(req).await?.into_inner())
            }
        })
        .await
    }

    /// Allocates the given addresses under one handle, all or none.
    pub async fn assign_ips(
        &mut self,
        reqs: Vec<pb::AssignIpRequest>,
    ) -> Result<Vec<pb::Allocation>, IpamError> {
        let handle = reqs.first().map(|r| r.handle.clone()).unwrap_or_default();
        let result = self
            .call("allocate the requested addresses", |ch, attempt| {
                let (reqs, handle) = (reqs.clone(), handle.clone());
                async move {
                    let mut c = IpamClient::new(ch);
                    if attempt > 0 {
                        c.release_by_handle(pb::ReleaseByHandleRequest { handle })
                            .await?;
                    }
                    let mut out = Vec::with_capacity(reqs.len());
                    for r in reqs {
                        out.push(c.assign_ip(r).await?.into_inner());
                    }
                    Ok(out)
                }
            })
            .await;
        if result.is_err() && !handle.is_empty() {
            // All or nothing: the first addresses may be held when a later one failed.
            let _ = self.release_handle(&handle).await;
        }
        result
    }

    /// Creates or replaces a network-policy document (the pod's WorkloadEndpoint).
    pub async fn apply_document(&mut self, json: String) -> Result<(), IpamError> {
        self.call("record the pod's workload endpoint", |ch, _| {
            let json = json.clone();
            async move {
                PolicyClient::new(ch)
                    .apply(pb::ApplyDocumentRequest { json })
                    .await?;
                Ok(())
            }
        })
        .await
    }

    /// Deletes a network-policy document; one already gone counts as deleted.
    pub async fn delete_document(&mut self, r: pb::DocumentRef) -> Result<(), IpamError> {
        let done = self
            .call("remove the pod's workload endpoint", |ch, _| {
                let r = r.clone();
                async move {
                    PolicyClient::new(ch).delete(r).await?;
                    Ok(())
                }
            })
            .await;
        match done {
            Err(IpamError::NotFound(_)) => Ok(()),
            other => other,
        }
    }

    /// Releases everything under `handle`; an unknown handle releases nothing and succeeds.
    pub async fn release_handle(&mut self, handle: &str) -> Result<Vec<String>, IpamError> {
        self.call("release addresses", |ch, _| {
            let handle = handle.to_owned();
            async move {
                let r = IpamClient::new(ch)
                    .release_by_handle(pb::ReleaseByHandleRequest { handle })
                    .await?;
                Ok(r.into_inner().released)
            }
        })
        .await
    }

    /// Releases the given addresses (each guarded by handle and sequence number when set).
    pub async fn release_ips(&mut self, ips: Vec<pb::ReleaseIp>) -> Result<Vec<String>, IpamError> {
        self.call("release addresses", |ch, _| {
            let ips = ips.clone();
            async move {
                let r = IpamClient::new(ch)
                    .release_ips(pb::ReleaseIpsRequest { ips })
                    .await?;
                Ok(r.into_inner().released)
            }
        })
        .await
    }

    /// The allocations under `handle`; empty if it holds none.
    pub async fn get_handle(&mut self, handle: &str) -> Result<Vec<pb::Allocation>, IpamError> {
        let r = self
            .call("read a handle", |ch, _| {
                let handle = handle.to_owned();
                async move {
                    let r = IpamClient::new(ch)
                        .get_handle(pb::GetHandleRequest { handle })
                        .await?;
                    Ok(r.into_inner().allocations)
                }
            })
            .await;
        match r {
            Err(IpamError::NotFound(_)) => Ok(Vec::new()),
            other => other,
        }
    }

    pub async fn garbage_collect(
        &mut self,
        req: pb::GarbageCollectRequest,
    ) -> Result<pb::GarbageCollectResponse, IpamError> {
        self.call("collect garbage", |ch, _| {
            let req = req.clone();
            async move { Ok(IpamClient::new(ch).garbage_collect(req).await?.into_inner()) }
        })
        .await
    }

    /// What pod `namespace/pod`'s Calico annotations ask of IPAM, checked by bgpd against the
    /// pools (empty where its datastore keeps no Pods).
    pub async fn pod_addressing(
        &mut self,
        namespace: &str,
        pod: &str,
    ) -> Result<pb::PodAddressingResponse, IpamError> {
        self.call("read the pod's annotations", |ch, _| {
            let req = pb::PodAddressingRequest {
                namespace: namespace.to_owned(),
                pod: pod.to_owned(),
            };
            async move { Ok(IpamClient::new(ch).pod_addressing(req).await?.into_inner()) }
        })
        .await
    }

    /// Pools with their settings, and their utilisation.
    pub async fn pools(&mut self) -> Result<(Vec<pb::IpPool>, Vec<pb::PoolUsage>), IpamError> {
        self.call("list pools", |ch, _| async move {
            let pools = PoolsClient::new(ch.clone())
                .list_pools(pb::ListPoolsRequest {})
                .await?
                .into_inner()
                .pools;
            let usage = IpamClient::new(ch)
                .show_blocks(pb::ShowBlocksRequest {
                    pool: String::new(),
                    show_blocks: false,
                })
                .await?
                .into_inner()
                .pools;
            Ok((pools, usage))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_sort_into_retry_and_final() {
        for c in [
            Code::Unavailable,
            Code::Aborted,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
        ] {
            assert!(
                matches!(classify("x", &Status::new(c, "m")), Failure::Retry(_)),
                "{c:?}"
            );
        }
        let fatal = |c| match classify("allocate", &Status::new(c, "why")) {
            Failure::Fatal(e) => e,
            Failure::Retry(_) => panic!("{c:?} retried"),
        };
        assert!(matches!(
            fatal(Code::ResourceExhausted),
            IpamError::Exhausted(_)
        ));
        assert!(matches!(fatal(Code::NotFound), IpamError::NotFound(_)));
        for c in [
            Code::InvalidArgument,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::Internal,
            Code::Unimplemented,
            Code::PermissionDenied,
        ] {
            let e = fatal(c);
            assert!(matches!(e, IpamError::Refused { .. }), "{c:?}");
            assert!(e.to_string().contains("why"));
        }
    }

    #[test]
    fn cni_codes() {
        let unreachable = IpamError::Unreachable {
            socket: "/run/margay/bgpd.sock".into(),
            reason: "No such file or directory".into(),
            attempts: 7,
            elapsed: Duration::from_secs(5),
        };
        assert!(unreachable.is_transient());
        let e = unreachable.to_cni();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(e.msg.contains("/run/margay/bgpd.sock") && e.msg.contains("7 attempts"));
        assert_eq!(
            IpamError::Exhausted("x".into()).to_cni().code,
            code::NO_ADDRESS
        );
        assert_eq!(
            IpamError::Refused {
                what: "x",
                reason: "y".into()
            }
            .to_cni()
            .code,
            code::IPAM_REFUSED
        );
        assert!(!IpamError::Exhausted("x".into()).is_transient());
    }

    #[test]
    fn an_absent_socket_fails_within_the_budget() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut b = Bgpd::new(
            &dir.path().join("none.sock"),
            Duration::from_secs(1),
            Duration::from_millis(150),
        );
        let started = Instant::now();
        let e = rt.block_on(b.release_handle("net.x")).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        match e {
            IpamError::Unreachable { attempts, .. } => assert!(attempts >= 3, "{attempts}"),
            other => panic!("{other}"),
        }
    }
}
