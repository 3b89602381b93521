//! Counting the gRPC API's calls: a tower layer around every service bgpd serves that counts
//! each call by method and status code and records how long it took, until its status was
//! known. A call's status is in the response headers when it failed at once ("trailers
//! only"), else in the trailers at the end of the body, so the layer watches the body to its
//! end; a body dropped before it (the client went away) counts as CANCELLED.
//!
//! The layer holds no state of the API's: only the counters, shared with the metrics listener.
//!
//! Boundaries: below both of its users, so that neither depends on the other for it: `api`
//! installs the layer on every listener, `metrics` renders the counters (the daemon creates
//! them, `api::DaemonInfo` carries them to both); it knows neither.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::body::Body;
use tonic::codegen::http::{self, HeaderMap};

/// Upper bounds of the latency histogram's buckets, in seconds.
pub const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Distinct methods counted; calls to further ones (a client probing made-up names) count
/// under [`OTHER`], so no caller can grow the exposition without bound.
pub const MAX_METHODS: usize = 128;
pub const OTHER: &str = "other";

/// The counters of one method.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MethodStats {
    /// Calls by status code name ("OK", "NotFound", ...).
    pub codes: BTreeMap<String, u64>,
    /// Cumulative counts per bucket of [`BUCKETS`].
    pub buckets: [u64; BUCKETS.len()],
    pub sum_seconds: f64,
    pub count: u64,
}

impl MethodStats {
    fn record(&mut self, code: Code, elapsed: Duration) {
        *self.codes.entry(code_name(code)).or_insert(0) += 1;
        let s = elapsed.as_secs_f64();
        for (bound, n) in BUCKETS.iter().zip(self.buckets.iter_mut()) {
            if s <= *bound {
                *n += 1;
            }
        }
        self.sum_seconds += s;
        self.count += 1;
    }
}

/// Prometheus-style names: "OK", else the code's name ("NotFound", "Unavailable").
pub fn code_name(code: Code) -> String {
    match code {
        Code::Ok => "OK".to_owned(),
        other => format!("{other:?}"),
    }
}

/// Calls by method ("margay.v1.Ipam/AutoAssign"); cheap to clone, shared.
#[derive(Debug, Clone, Default)]
pub struct ApiStats {
    methods: Arc<Mutex<BTreeMap<String, MethodStats>>>,
}

impl ApiStats {
    pub fn record(&self, method: &str, code: Code, elapsed: Duration) {
        // A short critical section; a poisoned lock is taken over (counters stay usable).
        let mut m = self.methods.lock().unwrap_or_else(|p| p.into_inner());
        let key = if m.contains_key(method) || m.len() < MAX_METHODS {
            method
        } else {
            OTHER
        };
        m.entry(key.to_owned()).or_default().record(code, elapsed);
    }

    pub fn snapshot(&self) -> BTreeMap<String, MethodStats> {
        self.methods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The layer that counts into these stats.
    pub fn layer(&self) -> ApiStatsLayer {
        ApiStatsLayer(self.clone())
    }
}

#[derive(Debug, Clone)]
pub struct ApiStatsLayer(ApiStats);

impl<S> tower::Layer<S> for ApiStatsLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            stats: self.0.clone(),
        }
    }
}

/// A service whose calls are counted.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    stats: ApiStats,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = Call {
            stats: self.stats.clone(),
            method: request.uri().path().trim_start_matches('/').to_owned(),
            started: Instant::now(),
            code: None,
        };
        let future = self.inner.call(request);
        Box::pin(async move {
            match future.await {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    let call = Call {
                        code: grpc_status(&parts.headers),
                        ..call
                    };
                    let watched = Watched {
                        inner: body,
                        call: Some(call),
                    };
                    Ok(http::Response::from_parts(parts, Body::new(watched)))
                }
                Err(e) => {
                    call.finish(Code::Unknown);
                    Err(e)
                }
            }
        })
    }
}

fn grpc_status(headers: &HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .map(|v| Code::from_bytes(v.as_bytes()))
}

/// One call in flight.
struct Call {
    stats: ApiStats,
    method: String,
    started: Instant,
    /// The status, once seen in the headers.
    code: Option<Code>,
}

impl Call {
    fn finish(self, code: Code) {
        self.stats
            .record(&self.method, code, self.started.elapsed());
    }
}

/// A response body that records its call when the status goes by, or when it is dropped.
struct Watched {
    inner: Body,
    call: Option<Call>,
}

impl Watched {
    fn finish(&mut self, code: Option<Code>) {
        if let Some(call) = self.call.take() {
            let code = code.or(call.code).unwrap_or(Code::Unknown);
            call.finish(code);
        }
    }
}

impl http_body::Body for Watched {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = grpc_status(trailers);
                    this.finish(code);
                }
            }
            Poll::Ready(Some(Err(status))) => this.finish(Some(status.code())),
            Poll::Ready(None) => this.finish(None),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        match self.call.as_ref().and_then(|c| c.code) {
            // Trailers-only: the status was in the headers, and the body empty.
            Some(code) => self.finish(Some(code)),
            None => self.finish(Some(Code::Cancelled)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use std::convert::Infallible;
    use tower::{Layer, Service, ServiceExt};

    fn service(
        status_in_headers: Option<&'static str>,
    ) -> tower::util::BoxCloneService<http::Request<()>, http::Response<Body>, Infallible> {
        tower::util::BoxCloneService::new(tower::service_fn(
            move |_r: http::Request<()>| async move {
                let mut b = http::Response::builder();
                if let Some(code) = status_in_headers {
                    b = b.header("grpc-status", code);
                    return Ok::<_, Infallible>(b.body(Body::empty()).unwrap());
                }
                let body = http_body_util_full_with_trailers();
                Ok(b.body(body).unwrap())
            },
        ))
    }

    /// A body of one data frame and trailers with grpc-status 5 (NOT_FOUND).
    fn http_body_util_full_with_trailers() -> Body {
        struct Two(u8);
        impl http_body::Body for Two {
            type Data = tonic::codegen::Bytes;
            type Error = tonic::Status;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                _cx: &mut Context<'_>,
            ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
                self.0 += 1;
                Poll::Ready(match self.0 {
                    1 => Some(Ok(http_body::Frame::data(
                        tonic::codegen::Bytes::from_static(b"x"),
                    ))),
                    2 => {
                        let mut t = HeaderMap::new();
                        t.insert("grpc-status", http::HeaderValue::from_static("5"));
                        Some(Ok(http_body::Frame::trailers(t)))
                    }
                    _ => None,
                })
            }
        }
        Body::new(Two(0))
    }

    async fn drain(mut body: Body) {
        use std::future::poll_fn;
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            frame.unwrap();
        }
    }

    /// Calls `path` on the service behind the layer; the response, body unread.
    async fn call(
        stats: &ApiStats,
        status_in_headers: Option<&'static str>,
        path: &str,
    ) -> http::Response<Body> {
        let request = http::Request::builder().uri(path).body(()).unwrap();
        let mut s = stats.layer().layer(service(status_in_headers));
        s.ready().await.unwrap().call(request).await.unwrap()
    }

    #[tokio::test]
    async fn calls_count_by_method_and_status_wherever_it_is() {
        let stats = ApiStats::default();
        // Status in the headers (trailers only): counted at once.
        drop(call(&stats, Some("14"), "/a.B/Get").await);
        // Status in the trailers: counted when the body ends.
        let r = call(&stats, None, "/a.B/Get").await;
        assert_eq!(stats.snapshot()["a.B/Get"].count, 1);
        drain(r.into_body()).await;
        // A body dropped before its end: the client went away.
        drop(call(&stats, None, "/a.B/List").await);

        let snap = stats.snapshot();
        let get = &snap["a.B/Get"];
        assert_eq!(get.count, 2);
        assert_eq!(get.codes["Unavailable"], 1);
        assert_eq!(get.codes["NotFound"], 1);
        assert_eq!(get.buckets[BUCKETS.len() - 1], 2);
        assert_eq!(snap["a.B/List"].codes["Cancelled"], 1);
    }

    #[test]
    fn methods_beyond_the_bound_count_as_other() {
        let stats = ApiStats::default();
        for i in 0..MAX_METHODS + 5 {
            stats.record(&format!("x/M{i}"), Code::Ok, Duration::from_millis(2));
        }
        stats.record("x/M0", Code::Ok, Duration::from_secs(20));
        let snap = stats.snapshot();
        assert_eq!(snap.len(), MAX_METHODS + 1);
        assert_eq!(snap[OTHER].count, 5);
        let m0 = &snap["x/M0"];
        assert_eq!(m0.count, 2);
        // 2 ms falls in the 2.5 ms bucket and up; 20 s in none but +Inf.
        assert_eq!(m0.buckets[0], 0);
        assert_eq!(m0.buckets[2], 1);
        assert_eq!(m0.buckets[BUCKETS.len() - 1], 1);
        assert_eq!(code_name(Code::Ok), "OK");
        assert_eq!(code_name(Code::NotFound), "NotFound");
    }
}
