//! A gRPC service built on its first request. Server reflection keeps the contract's
//! descriptors (about 40 KiB per protocol version, two versions) for as long as it lives; a
//! node that nobody inspects with grpcurl never needs them, and a lab host runs hundreds.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tower::ServiceExt;

/// `S`, made by `build` when the first request comes; every clone shares it.
pub struct Lazy<S> {
    built: Arc<OnceLock<Result<S, String>>>,
    build: fn() -> Result<S, String>,
}

impl<S> Lazy<S> {
    pub fn new(build: fn() -> Result<S, String>) -> Self {
        Self {
            built: Arc::new(OnceLock::new()),
            build,
        }
    }
}

impl<S> Clone for Lazy<S> {
    fn clone(&self) -> Self {
        Self {
            built: self.built.clone(),
            build: self.build,
        }
    }
}

impl<S: NamedService> NamedService for Lazy<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<Request<Body>> for Lazy<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Response<Body>, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness is the built service's, asked per request (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        match self.built.get_or_init(self.build) {
            Ok(service) => Box::pin(service.clone().oneshot(req)),
            Err(e) => {
                let status = tonic::Status::internal(format!("{} is unavailable: {e}", S::NAME));
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}
