//! bgpd seen from outside, over HTTP on `metrics.listen` (the listener routewriter uses too,
//! `observe::http`):
//!
//! - `GET /metrics`: Prometheus text, names prefixed `margay_bgpd_` (BGP sessions and
//!   prefixes, IPAM usage per pool, gRPC API calls and latency, datastore, uptime).
//! - `GET /ready`: 200 "ready", or 503 with one line per reason: the datastore is not
//!   connected, or a BGP session is not Established and not in `metrics.ready_allow_down`.
//! - `GET /live`: 200 "live" while the main loops answer (the speaker within 2 s, the
//!   datastore supervisor running), else 503 with the reasons.
//! - `GET /status`: one JSON object (node, datastore, readiness, sessions).
//!
//! Boundaries: this module reads through the daemon's handles (`api::DaemonInfo`: speaker,
//! datastore, the API's call counters of `crate::api_stats` and its caps' counts of
//! `api::limits`) and owns nothing but a short cache of the IPAM usage; every read has a
//! time limit, so a stuck part makes a scrape say so rather than hang.
//!
//! - `ready`: readiness and liveness as pure verdicts.
//! - `render`: the Prometheus text of a snapshot.
//! - `tcp_drops`: the kernel's counts of segments TCP MD5 and GTSM refused.

pub mod ready;
pub mod render;
pub mod tcp_drops;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::Mutex;

use ready::{PeerRow, Verdict};
use render::{IpamView, PoolRow, Snapshot};

use crate::api::DaemonInfo;
use crate::config::MetricsConfig;
use crate::datastore::DatastoreState;
use daemon_common::observe::http::{self, Request, Response};

/// How long the speaker gets to list its sessions; longer counts as not answering.
pub const SPEAKER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a read of the IPAM usage may take before the last figures are served.
pub const IPAM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long IPAM figures are reused: scrapes of several Prometheus servers share one read.
pub const IPAM_TTL: Duration = Duration::from_secs(2);

const PATHS: [&str; 4] = ["/metrics", "/ready", "/live", "/status"];

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(
        "cannot serve metrics on {addr}: {source} (is another process using it? change metrics.listen)"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The bound listener, before the daemon's parts exist to serve.
pub struct Listener {
    listener: TcpListener,
    allow_down: Vec<String>,
}

impl Listener {
    /// Binds `metrics.listen`; `None` when it is not set (nothing is served).
    pub async fn bind(config: &MetricsConfig) -> Result<Option<Self>, MetricsError> {
        let Some(addr) = config.listen else {
            return Ok(None);
        };
        let listener = http::bind(addr)
            .await
            .map_err(|source| MetricsError::Bind { addr, source })?;
        Ok(Some(Self {
            listener,
            allow_down: config.ready_allow_down.clone(),
        }))
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves the endpoints until the task is dropped.
    pub async fn serve(self, info: DaemonInfo) {
        let endpoints = Arc::new(Endpoints {
            info,
            allow_down: self.allow_down,
            ipam: Mutex::new(None),
        });
        http::serve(self.listener, move |r: Request| {
            let endpoints = endpoints.clone();
            async move { endpoints.answer(&r).await }
        })
        .await
    }
}

struct Endpoints {
    info: DaemonInfo,
    allow_down: Vec<String>,
    /// The last IPAM figures read and when.
    ipam: Mutex<Option<(Instant, Vec<PoolRow>)>>,
}

impl Endpoints {
    async fn answer(&self, r: &Request) -> Response {
        match r.path.as_str() {
            "/metrics" => {
                let (peers, ipam) = tokio::join!(self.peers(), self.ipam());
                let ready = self.readiness(&peers).ok();
                let snapshot = Snapshot {
                    uptime_seconds: self.info.started.elapsed().as_secs_f64(),
                    datastore_connected: self.info.datastore.state() == DatastoreState::Connected,
                    ready,
                    peers,
                    ipam,
                    api: self.info.api_stats.calls.snapshot(),
                    api_limits: render::ApiLimits::of(&self.info.api_stats.limits),
                    bfd: self.info.bgp.bfd_counters().snapshot(),
                    tcp_drops: tcp_drops::read(),
                    warnings: crate::warnings::counts(),
                };
                Response::new(200, http::PROMETHEUS, render::render(&snapshot))
            }
            "/ready" => probe(self.readiness(&self.peers().await), "ready"),
            "/live" => {
                let peers = self.peers().await;
                probe(
                    ready::liveness(&peers, self.info.datastore.is_alive()),
                    "live",
                )
            }
            "/status" => Response::new(200, http::JSON, self.status().await),
            _ => Response::not_found(&PATHS),
        }
    }

    fn readiness(&self, peers: &Result<Vec<PeerRow>, String>) -> Verdict {
        ready::readiness(
            self.info.datastore.describe(),
            &self.info.datastore.state(),
            peers,
            &self.allow_down,
        )
    }

    /// The speaker's sessions, or why it did not give them.
    async fn peers(&self) -> Result<Vec<PeerRow>, String> {
        match tokio::time::timeout(SPEAKER_TIMEOUT, self.info.bgp.peers()).await {
            Ok(Ok(peers)) => Ok(peers.iter().map(PeerRow::from_status).collect()),
            Ok(Err(e)) => Err(format!("BGP speaker: {e}")),
            Err(_) => Err(format!(
                "BGP speaker did not answer within {}s",
                SPEAKER_TIMEOUT.as_secs()
            )),
        }
    }

    /// The pools' usage, read at most every [`IPAM_TTL`]; when a read fails or takes too
    /// long, the last figures with their age.
    async fn ipam(&self) -> IpamView {
        let mut cache = self.ipam.lock().await;
        if let Some((at, pools)) = cache.as_ref()
            && at.elapsed() < IPAM_TTL
        {
            return IpamView {
                pools: pools.clone(),
                read_ok: true,
                age_seconds: at.elapsed().as_secs_f64(),
            };
        }
        let read = match self.info.datastore.ipam() {
            None => None,
            Some(ipam) => match tokio::time::timeout(IPAM_TIMEOUT, ipam.usage("")).await {
                Ok(Ok((pools, _blocks))) => {
                    Some(pools.iter().map(PoolRow::from_usage).collect::<Vec<_>>())
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "metrics: cannot read the IPAM usage");
                    None
                }
                Err(_) => {
                    tracing::debug!("metrics: the IPAM usage took longer than {IPAM_TIMEOUT:?}");
                    None
                }
            },
        };
        match read {
            Some(pools) => {
                *cache = Some((Instant::now(), pools.clone()));
                IpamView {
                    pools,
                    read_ok: true,
                    age_seconds: 0.0,
                }
            }
            None => match cache.as_ref() {
                Some((at, pools)) => IpamView {
                    pools: pools.clone(),
                    read_ok: false,
                    age_seconds: at.elapsed().as_secs_f64(),
                },
                None => IpamView::default(),
            },
        }
    }

    async fn status(&self) -> String {
        let peers = self.peers().await;
        let verdict = self.readiness(&peers);
        let (state, error) = match self.info.datastore.state() {
            DatastoreState::Connected => ("connected", None),
            DatastoreState::Connecting => ("connecting", None),
            DatastoreState::Unavailable(why) => ("unavailable", Some(why)),
        };
        let status = serde_json::json!({
            "node": self.info.node,
            "version": crate::VERSION,
            "uptime_s": self.info.started.elapsed().as_secs(),
            "datastore": {
                "name": self.info.datastore.describe(),
                "state": state,
                "error": error,
            },
            "ready": verdict.ok(),
            "not_ready_reasons": verdict.reasons,
            "speaker_answered": peers.is_ok(),
            "peers": peers.unwrap_or_default(),
        });
        serde_json::to_string_pretty(&status).unwrap_or_else(|_| "{}".into())
    }
}

fn probe(verdict: Verdict, pass: &str) -> Response {
    let status = if verdict.ok() { 200 } else { 503 };
    Response::new(status, http::TEXT, verdict.body(pass))
}
