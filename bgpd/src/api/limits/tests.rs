use super::*;
use std::convert::Infallible;
use tower::{Layer, Service, ServiceExt};

#[test]
fn a_gate_gives_max_permits_and_counts_refusals() {
    let counts = Arc::new(Counts::default());
    let gate = Gate::new(2, counts.clone());
    let a = gate.try_acquire().unwrap();
    let b = gate.try_acquire().unwrap();
    assert_eq!(counts.open(), 2);
    // The first refusal is logged at once; the next within LOG_EVERY are not.
    assert_eq!(gate.try_acquire().unwrap_err(), Some(1));
    assert_eq!(gate.try_acquire().unwrap_err(), None);
    assert_eq!((counts.open(), counts.refused()), (2, 2));
    drop(a);
    assert_eq!(counts.open(), 1);
    let _c = gate.try_acquire().unwrap();
    assert_eq!(counts.open(), 2);
    drop(b);
    assert_eq!(counts.open(), 1);
}

#[test]
fn refusals_are_logged_at_most_every_ten_seconds_with_the_count_since() {
    let counts = Counts::default();
    let t0 = Instant::now();
    assert_eq!(counts.refuse(t0), Some(1));
    for _ in 0..5 {
        assert_eq!(counts.refuse(t0 + Duration::from_secs(3)), None);
    }
    assert_eq!(counts.refuse(t0 + LOG_EVERY), Some(6));
    assert_eq!(counts.refuse(t0 + LOG_EVERY), None);
    assert_eq!(counts.refused(), 8);
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_and_the_rest_kept() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let counts = Arc::new(Counts::default());
    let mut incoming = CappedIncoming::new(
        tokio_stream::wrappers::UnixListenerStream::new(listener),
        Gate::new(2, counts.clone()),
        "unix",
    );
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(tokio::net::UnixStream::connect(&path).await.unwrap());
    }
    use tokio_stream::StreamExt;
    let mut first = incoming.next().await.unwrap().unwrap();
    let second = incoming.next().await.unwrap().unwrap();
    // The third is refused inside the stream: nothing comes until a fourth connects.
    let next = tokio::time::timeout(Duration::from_millis(200), incoming.next()).await;
    assert!(next.is_err(), "a third connection got through");
    assert_eq!((counts.open(), counts.refused()), (2, 1));
    // Closed, not held: the third client reads end-of-file at once.
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(2), clients[2].read(&mut buf))
        .await
        .expect("the refused connection is left open");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    // The kept ones work.
    clients[0].write_all(b"x").await.unwrap();
    first.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"x");
    // A kept one closing makes room for the next.
    drop(second);
    assert_eq!(counts.open(), 1);
    let _fourth = tokio::net::UnixStream::connect(&path).await.unwrap();
    let fourth = tokio::time::timeout(Duration::from_secs(2), incoming.next()).await;
    assert!(matches!(fourth, Ok(Some(Ok(_)))));
    assert_eq!((counts.open(), counts.refused()), (2, 1));
}

/// A service answering every call with a body that stays open until `end` is dropped.
fn streaming_service(
    end: tokio::sync::watch::Receiver<()>,
) -> tower::util::BoxCloneService<http::Request<()>, http::Response<Body>, Infallible> {
    tower::util::BoxCloneService::new(tower::service_fn(move |_r: http::Request<()>| {
        let mut end = end.clone();
        async move {
            let stream = async_stream_of(async move {
                let _ = end.changed().await;
            });
            Ok::<_, Infallible>(http::Response::new(stream))
        }
    }))
}

/// A body that ends when `done` completes.
fn async_stream_of(done: impl Future<Output = ()> + Send + 'static) -> Body {
    struct Until(Pin<Box<dyn Future<Output = ()> + Send>>);
    impl http_body::Body for Until {
        type Data = tonic::codegen::Bytes;
        type Error = tonic::Status;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
            self.0.as_mut().poll(cx).map(|()| None)
        }
    }
    Body::new(Until(Box::pin(done)))
}

async fn call(
    s: &mut StreamCap<
        tower::util::BoxCloneService<http::Request<()>, http::Response<Body>, Infallible>,
    >,
    path: &str,
) -> http::Response<Body> {
    let request = http::Request::builder().uri(path).body(()).unwrap();
    s.ready().await.unwrap().call(request).await.unwrap()
}

async fn drain(mut body: Body) {
    use http_body::Body as _;
    while std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
        .await
        .is_some()
    {}
}

#[tokio::test]
async fn streams_hold_a_permit_until_their_body_goes_and_unary_calls_none() {
    let (end_tx, end) = tokio::sync::watch::channel(());
    let counts = Arc::new(Counts::default());
    let layer = StreamCapLayer::new(Gate::new(2, counts.clone()));
    let mut s = layer.layer(streaming_service(end));
    let watch = call(&mut s, "/margay.v1.Dataplane/Watch").await;
    let list = call(&mut s, "/margay.v1.Bgp/ListRoutes").await;
    assert_eq!(counts.open(), 2);
    // Unary calls pass at the cap and take nothing.
    let unary = call(&mut s, "/margay.v1.Daemon/GetStatus").await;
    assert!(tonic::Status::from_header_map(unary.headers()).is_none());
    assert_eq!(counts.open(), 2);
    // One more stream of any streaming method: RESOURCE_EXHAUSTED naming the option.
    let refused = call(&mut s, "/grpc.health.v1.Health/Watch").await;
    let status = tonic::Status::from_header_map(refused.headers()).unwrap();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("api.max_watch_streams"),
        "{status:?}"
    );
    assert_eq!(counts.refused(), 1);
    // A client going away (its body dropped) makes room.
    drop(watch);
    assert_eq!(counts.open(), 1);
    let again = call(&mut s, "/margay.v1.Dataplane/Watch").await;
    assert_eq!(counts.open(), 2);
    // Streams ending (their bodies read to the end, then dropped by hyper) do as well.
    drop(end_tx);
    drain(list.into_body()).await;
    drain(again.into_body()).await;
    assert_eq!(counts.open(), 0);
}

/// Every streaming rpc of the contract is capped: a new one must join [`STREAMING`].
#[test]
fn every_streaming_rpc_of_the_contract_is_listed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../proto/margay/v1");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "proto") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut service = String::new();
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.split_whitespace().next().unwrap().to_owned();
            }
            let Some(rest) = line.strip_prefix("rpc ") else {
                continue;
            };
            let method = rest.split('(').next().unwrap().trim();
            let streams = line.contains("(stream ");
            let path = format!("/margay.v1.{service}/{method}");
            assert_eq!(
                STREAMING.contains(&path.as_str()),
                streams,
                "{path}: streaming is {streams}; keep STREAMING in step"
            );
            if streams {
                found.push(path);
            }
        }
    }
    assert_eq!(found.len(), 2, "{found:?}");
    // The standard services' names, from their generated code.
    for service in [
        tonic_health::pb::health_server::SERVICE_NAME,
        tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
        tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME,
    ] {
        assert!(
            STREAMING
                .iter()
                .any(|p| p.starts_with(&format!("/{service}/"))),
            "{service}"
        );
    }
}
