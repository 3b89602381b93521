//! bgpd's gRPC server. It serves the contract of the `proto` crate on a unix socket and,
//! when configured, on TCP with mutual TLS; both listeners carry the same services, the
//! standard health service and server reflection (v1 and v1alpha). Services of the contract
//! that are not implemented yet are not registered, so tonic answers them UNIMPLEMENTED.
//! A request that cannot be decoded gets INVALID_ARGUMENT naming the field, one over the
//! size limit RESOURCE_EXHAUSTED (see `decode_error_status`).
//!
//! Caps bound what clients hold open (`limits`): connections per listener
//! (`api.max_connections`), streams per connection (`api.max_streams_per_connection`, HTTP/2
//! SETTINGS_MAX_CONCURRENT_STREAMS) and streaming calls over all clients
//! (`api.max_watch_streams`).
//!
//! The API layer owns no state of its own: each service holds handles to the parts of the
//! daemon that own the state; the caps' permits live in the connections and streams they
//! admit.

mod bgp_service;
pub mod convert;
mod daemon_service;
mod dataplane_service;
mod ipam_service;
mod lazy;
pub mod limits;
mod policy_service;
mod services_service;
pub mod socket;

use std::net::SocketAddr;
use std::path::PathBuf;

use proto::v1::daemon_server::DaemonServer;
use proto::v1::dataplane_server::DataplaneServer;
use proto::v1::ipam_server::IpamServer;
use proto::v1::nodes_server::NodesServer;
use proto::v1::pools_server::PoolsServer;
use proto::v1::services_server::ServicesServer;
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::service::Routes;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

pub use daemon_service::{ApiCounters, DaemonInfo};

use crate::config::{ApiConfig, TlsFiles};
use crate::datastore::{DatastoreHandle, DatastoreState};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "another bgpd is already serving on {0}; stop it first or set api.socket to another path"
    )]
    AlreadyRunning(PathBuf),
    #[error("{0} exists and is not a socket; remove it or set api.socket to another path")]
    NotASocket(PathBuf),
    #[error("cannot create the API socket {path}: {source}")]
    SocketBind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on TCP {addr}: {source}")]
    TcpBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read TLS file {path}: {source}")]
    TlsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid TLS configuration: {0}")]
    Tls(#[source] tonic::transport::Error),
    #[error("the API server failed: {0}")]
    Serve(#[source] tonic::transport::Error),
}

/// The API's listeners, bound and ready to serve.
pub struct Api {
    unix: tokio::net::UnixListener,
    socket: socket::SocketGuard,
    tcp: Option<(tokio::net::TcpListener, ServerTlsConfig)>,
    /// The service-address task, once the daemon has started it (`Services` is served only
    /// then).
    services: Option<crate::services::ServicesHandle>,
    /// `api.max_connections`, `api.max_streams_per_connection`, `api.max_watch_streams`.
    caps: Caps,
}

#[derive(Debug, Clone, Copy)]
struct Caps {
    connections: u32,
    streams_per_connection: u32,
    streams: u32,
}

/// How long a TCP client gets to finish its TLS handshake: one that stalls must not hold
/// one of the listener's `api.max_connections` for ever (tonic sets no limit).
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Api {
    /// Binds every configured listener, so that start-up fails before anything is served.
    pub async fn bind(config: &ApiConfig) -> Result<Self, ApiError> {
        let (unix, socket) = socket::bind(&config.socket)?;
        let tcp = match (config.tcp_listen, config.tls_files()) {
            (Some(addr), Some(files)) => {
                let tls = tls_config(&files).await?;
                // Parse the certificates now, so a bad file stops start-up with its reason.
                Server::builder()
                    .tls_config(tls.clone())
                    .map_err(ApiError::Tls)?;
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| ApiError::TcpBind { addr, source })?;
                Some((listener, tls))
            }
            _ => None,
        };
        Ok(Self {
            unix,
            socket,
            tcp,
            services: None,
            caps: Caps {
                connections: config.max_connections,
                streams_per_connection: config.max_streams_per_connection,
                streams: config.max_watch_streams,
            },
        })
    }

    /// Serve `Services` through this task.
    pub fn with_services(mut self, services: crate::services::ServicesHandle) -> Self {
        self.services = Some(services);
        self
    }

    /// The TCP address actually bound (useful when configured with port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Serves until `shutdown` turns true; the socket is removed when this returns.
    pub async fn serve(
        self,
        info: DaemonInfo,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), ApiError> {
        // Every call on every listener is counted for the metrics.
        let counted = info.api_stats.calls.layer();
        let decode_codes = tower::util::MapResponseLayer::new(
            decode_error_status as fn(http::Response<Body>) -> http::Response<Body>,
        );
        let limits = info.api_stats.limits.clone();
        // Inside the counting layer: a refused stream is counted as a RESOURCE_EXHAUSTED call.
        let streams = limits::StreamCapLayer::new(limits::Gate::new(
            self.caps.streams,
            limits.streams.clone(),
        ));
        let per_connection = Some(self.caps.streams_per_connection);
        let routes = routes(info, self.services).await;
        let _socket = self.socket;
        let unix = Server::builder()
            .max_concurrent_streams(per_connection)
            .layer(counted.clone())
            .layer(decode_codes.clone())
            .layer(streams.clone())
            .add_routes(routes.clone())
            .serve_with_incoming_shutdown(
                limits::CappedIncoming::new(
                    UnixListenerStream::new(self.unix),
                    limits::Gate::new(self.caps.connections, limits.unix.clone()),
                    "unix",
                ),
                wait_for(shutdown.clone()),
            );
        match self.tcp {
            None => unix.await.map_err(ApiError::Serve),
            Some((listener, tls)) => {
                let tcp = Server::builder()
                    .tls_config(tls)
                    .map_err(ApiError::Tls)?
                    .max_concurrent_streams(per_connection)
                    .layer(counted)
                    .layer(decode_codes)
                    .layer(streams)
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(
                        limits::CappedIncoming::new(
                            TcpListenerStream::new(listener),
                            limits::Gate::new(self.caps.connections, limits.tcp.clone()),
                            "tcp",
                        ),
                        wait_for(shutdown),
                    );
                let (u, t) = tokio::join!(unix, tcp);
                u.and(t).map_err(ApiError::Serve)
            }
        }
    }
}

/// The status of a request tonic could not decode, as the gRPC status codes mean it. tonic
/// answers INTERNAL to a message protobuf refuses (invalid UTF-8 in a string, a truncated or
/// mistyped field), but the fault is the client's and the API's contract is INVALID_ARGUMENT
/// naming the field, which prost's message already does ("IpPool.name:
/// CreatePoolRequest.pool: invalid string value: data is not UTF-8 encoded"). A message over
/// the decoding limit (tonic's default, 4 MiB: the largest request, a GC's live handles, is
/// far below) gets OUT_OF_RANGE from tonic, RESOURCE_EXHAUSTED in gRPC's table. Both fail
/// before a handler runs, so the status is in the response headers (trailers-only).
fn decode_error_status(mut response: http::Response<Body>) -> http::Response<Body> {
    let Some(status) = tonic::Status::from_header_map(response.headers()) else {
        return response;
    };
    let code = match status.code() {
        tonic::Code::Internal if status.message().starts_with("failed to decode Protobuf") => {
            tonic::Code::InvalidArgument
        }
        tonic::Code::OutOfRange
            if status
                .message()
                .starts_with("Error, decoded message length too large") =>
        {
            tonic::Code::ResourceExhausted
        }
        _ => return response,
    };
    response
        .headers_mut()
        .insert("grpc-status", http::HeaderValue::from(code as i32));
    response
}

async fn wait_for(mut shutdown: watch::Receiver<bool>) {
    // An error means the sender is gone: shut down as well.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Every service bgpd serves, on every listener.
async fn routes(info: DaemonInfo, services: Option<crate::services::ServicesHandle>) -> Routes {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<DaemonServer<daemon_service::DaemonService>>()
        .await;
    tokio::spawn(follow_datastore(health, info.datastore.clone()));

    // Built on the first reflection request (see `lazy`).
    fn reflection() -> tonic_reflection::server::Builder<'static> {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    }
    let reflection_v1 = lazy::Lazy::new(|| reflection().build_v1().map_err(|e| e.to_string()));
    let reflection_v1alpha =
        lazy::Lazy::new(|| reflection().build_v1alpha().map_err(|e| e.to_string()));

    let ipam = ipam_service::IpamService::new(
        info.datastore.clone(),
        info.registered.clone(),
        info.node.clone(),
    );
    let mut routes = Routes::new(health_service);
    if let Some(services) = services {
        routes = routes.add_service(ServicesServer::new(services_service::ServicesService::new(
            services,
            info.datastore.clone(),
        )));
    }
    routes
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(PoolsServer::new(ipam.clone()))
        .add_service(NodesServer::new(ipam.clone()))
        .add_service(IpamServer::new(ipam))
        .add_service(DataplaneServer::new(
            dataplane_service::DataplaneService::new(info.dataplane.clone()),
        ))
        .add_service(proto::v1::bgp_server::BgpServer::new(
            bgp_service::BgpService::new(
                info.bgp.clone(),
                info.datastore.clone(),
                info.dataplane.clone(),
            ),
        ))
        .add_service(proto::v1::policy_server::PolicyServer::new(
            policy_service::PolicyService::new(info.datastore.clone(), info.node.clone()),
        ))
        .add_service(DaemonServer::new(daemon_service::DaemonService::new(info)))
}

/// The overall health ("") is SERVING only while the datastore answers: a node whose datastore
/// is gone must not look ready.
async fn follow_datastore(
    health: tonic_health::server::HealthReporter,
    mut datastore: DatastoreHandle,
) {
    use tonic_health::ServingStatus;
    let mut state = datastore.state();
    loop {
        let status = match state {
            DatastoreState::Connected => ServingStatus::Serving,
            _ => ServingStatus::NotServing,
        };
        health.set_service_status("", status).await;
        state = datastore.changed().await;
        if !datastore.is_alive() {
            return;
        }
    }
}

async fn tls_config(files: &TlsFiles) -> Result<ServerTlsConfig, ApiError> {
    let read = |path: PathBuf| async move {
        tokio::fs::read(&path)
            .await
            .map_err(|source| ApiError::TlsFile { path, source })
    };
    let cert = read(files.cert.clone()).await?;
    let key = read(files.key.clone()).await?;
    let ca = read(files.client_ca.clone()).await?;
    // A client CA makes client certificates mandatory: mutual TLS.
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(ca))
        .timeout(TLS_HANDSHAKE_TIMEOUT))
}
