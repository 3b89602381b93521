//! The API's caps on what clients hold open, so that a hostile or runaway client cannot take
//! bgpd's memory or lock other clients out:
//!
//! - connections, per listener (`api.max_connections`): [`CappedIncoming`] wraps a listener's
//!   stream of accepted connections; each connection carries a [`Permit`] inside its IO
//!   object ([`Held`]), released when hyper drops the connection. One over the cap is closed
//!   as soon as it is accepted (never left half-open in the backlog) and counted.
//! - streaming calls, over all clients (`api.max_watch_streams`): [`StreamCapLayer`], one
//!   tower layer on every listener, takes a permit for each call of a method in [`STREAMING`]
//!   and keeps it inside the response body, so that it is released when the stream ends or
//!   the client goes (hyper drops the body on a reset or a closed connection). One over the
//!   cap gets RESOURCE_EXHAUSTED naming the option. Unary calls never wait on it, so a
//!   client at the cap does not slow anybody's `GetStatus`.
//!
//! A cap is a [`Gate`]: an atomic count of what is open, checked against the cap. Nothing
//! ever waits for a permit (it is taken or refused), so no semaphore queue is needed, and
//! the count is the open-gauge the metrics show. The counts ([`LimitCounters`]) are created
//! with the daemon's other counters and read by `metrics`; the caps come from `[api]`.
//!
//! Boundaries: knows tonic's `Connected` and HTTP bodies, not the services behind the layer.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_stream::Stream;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::server::Connected;

/// Every streaming method bgpd serves: its own (`Dataplane.Watch`, `Bgp.ListRoutes`), the
/// standard health service's `Watch` and server reflection's (bidirectional) stream. A new
/// streaming method of the contract must be added here; a test checks the `.proto` files.
pub const STREAMING: [&str; 5] = [
    "/margay.v1.Dataplane/Watch",
    "/margay.v1.Bgp/ListRoutes",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// At most one log line per cap in this time: a client hammering a cap must not flood the
/// log (each line says how many were refused since the last).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What one cap counts: open now, refused so far, and when a refusal was last logged.
#[derive(Debug, Default)]
pub struct Counts {
    open: AtomicUsize,
    refused: AtomicU64,
    /// (when, `refused` then) of the last log line.
    logged: Mutex<Option<(Instant, u64)>>,
}

impl Counts {
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Counts a refusal at `now`; `Some(refused since the last line)` when a line is due.
    fn refuse(&self, now: Instant) -> Option<u64> {
        let total = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        // Only refusals take the lock; a poisoned one is taken over (it guards a timestamp).
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        match *logged {
            Some((at, _)) if now.duration_since(at) < LOG_EVERY => None,
            Some((_, then)) => {
                *logged = Some((now, total));
                Some(total - then)
            }
            None => {
                *logged = Some((now, total));
                Some(total)
            }
        }
    }
}

/// The caps' counts, created with the daemon's other counters (cheap to clone, shared) and
/// read by the metrics listener.
#[derive(Debug, Clone, Default)]
pub struct LimitCounters {
    /// Connections of the unix socket.
    pub unix: Arc<Counts>,
    /// Connections of the TCP (mutual TLS) listener.
    pub tcp: Arc<Counts>,
    /// Streaming calls over all clients.
    pub streams: Arc<Counts>,
}

/// One cap: at most `max` open at once, counted in `counts`.
#[derive(Debug, Clone)]
pub struct Gate {
    max: usize,
    counts: Arc<Counts>,
}

impl Gate {
    pub fn new(max: u32, counts: Arc<Counts>) -> Self {
        Self {
            max: usize::try_from(max).unwrap_or(usize::MAX),
            counts,
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A permit if fewer than `max` are open; else the refusal is counted, and `Err` holds
    /// the number refused since the last log line when one is due.
    pub fn try_acquire(&self) -> Result<Permit, Option<u64>> {
        let taken = self
            .counts
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(Permit(self.counts.clone())),
            Err(_) => Err(self.counts.refuse(Instant::now())),
        }
    }
}

/// One open connection or stream; dropping it makes room.
#[derive(Debug)]
pub struct Permit(Arc<Counts>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

// ---- Connections ----

/// Most connections refused in one poll before yielding: a flood of connects must not keep
/// the accept loop (and the shutdown signal polled beside it) from the runtime.
const REFUSALS_PER_POLL: usize = 64;

/// A listener's accepted connections, each holding a permit of `gate`; one over the cap is
/// closed at once.
pub struct CappedIncoming<S> {
    inner: S,
    gate: Gate,
    /// "unix" or "tcp", for the log.
    listener: &'static str,
}

impl<S> CappedIncoming<S> {
    pub fn new(inner: S, gate: Gate, listener: &'static str) -> Self {
        Self {
            inner,
            gate,
            listener,
        }
    }
}

impl<S, IO, E> Stream for CappedIncoming<S>
where
    S: Stream<Item = Result<IO, E>> + Unpin,
{
    type Item = Result<Held<IO>, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        for _ in 0..REFUSALS_PER_POLL {
            let io = match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(io))) => io,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            match self.gate.try_acquire() {
                Ok(permit) => {
                    return Poll::Ready(Some(Ok(Held {
                        io,
                        _permit: permit,
                    })));
                }
                Err(due) => {
                    // Dropped here: the connection is closed before any byte is read.
                    drop(io);
                    if let Some(refused) = due {
                        tracing::warn!(
                            listener = self.listener,
                            max = self.gate.max(),
                            refused,
                            "API connections refused: api.max_connections reached on this listener (count since the last such line)"
                        );
                    }
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A connection's IO object with its permit: released when hyper drops the connection.
pub struct Held<IO> {
    io: IO,
    _permit: Permit,
}

impl<IO: Connected> Connected for Held<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Held<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Held<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

// ---- Streams ----

/// The layer that caps streaming calls with one gate shared by every listener.
#[derive(Debug, Clone)]
pub struct StreamCapLayer(Gate);

impl StreamCapLayer {
    pub fn new(gate: Gate) -> Self {
        Self(gate)
    }
}

impl<S> tower::Layer<S> for StreamCapLayer {
    type Service = StreamCap<S>;

    fn layer(&self, inner: S) -> StreamCap<S> {
        StreamCap {
            inner,
            gate: self.0.clone(),
        }
    }
}

/// A service whose streaming calls hold a permit for as long as their response body lives.
#[derive(Debug, Clone)]
pub struct StreamCap<S> {
    inner: S,
    gate: Gate,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The refusal of a stream over the cap: what to raise is in the message.
pub fn refusal(max: usize) -> tonic::Status {
    tonic::Status::resource_exhausted(format!(
        "too many streams open: {max} streaming calls (Watch, ListRoutes, ...) are open over all clients, the most api.max_watch_streams allows; close one, or raise api.max_watch_streams"
    ))
}

impl<S, B> tower::Service<http::Request<B>> for StreamCap<S>
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
        if !STREAMING.contains(&request.uri().path()) {
            return Box::pin(self.inner.call(request));
        }
        let permit = match self.gate.try_acquire() {
            Ok(permit) => permit,
            Err(due) => {
                if let Some(refused) = due {
                    tracing::warn!(
                        max = self.gate.max(),
                        refused,
                        method = request.uri().path(),
                        "API streams refused: api.max_watch_streams reached (count since the last such line)"
                    );
                }
                let response = refusal(self.gate.max()).into_http();
                return Box::pin(std::future::ready(Ok(response)));
            }
        };
        let future = self.inner.call(request);
        Box::pin(async move {
            let response = future.await?;
            Ok(response.map(|inner| {
                Body::new(HeldBody {
                    inner,
                    _permit: permit,
                })
            }))
        })
    }
}

/// A streaming call's response body with its permit.
struct HeldBody {
    inner: Body,
    _permit: Permit,
}

impl http_body::Body for HeldBody {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
