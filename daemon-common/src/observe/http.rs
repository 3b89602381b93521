//! The HTTP listener bgpd and routewriter serve metrics, status and probes on. Hand-written on
//! tokio (a request line and headers in, one response out, connection closed) because
//! scrapers and probes send nothing more, and an HTTP crate would be most of a web stack for
//! that. Its job is the bounds: a request head of at most [`MAX_HEAD`] bytes, at most
//! [`MAX_CONCURRENT`] connections answered at once (more wait in the kernel's backlog), and
//! [`REQUEST_TIMEOUT`] for reading, answering and writing together. What is served is the
//! caller's: a handler maps a GET [`Request`] to a [`Response`]; other methods are refused
//! here.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// The longest request head read; the rest of a longer one is ignored.
pub const MAX_HEAD: usize = 8192;
/// Connections answered at once: scrapers and probes are few.
pub const MAX_CONCURRENT: usize = 8;
/// Reading, answering and writing one request together.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What a handler sees of a request: only GET reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path without its query string, e.g. "/metrics".
    pub path: String,
}

/// One answer; the connection is closed after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// The Prometheus text exposition format, version 0.0.4.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4";
pub const JSON: &str = "application/json";
pub const TEXT: &str = "text/plain";

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type,
            body: body.into(),
        }
    }

    /// 404 with a hint naming what is served.
    pub fn not_found(paths: &[&str]) -> Self {
        Self::new(404, TEXT, format!("try {}\n", paths.join(" or ")))
    }

    /// The response as bytes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len(),
            self.body
        )
        .into_bytes()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// The request line of a head (what was read of it), or None when there is none.
pub fn parse_request(head: &[u8]) -> Option<Request> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?;
    let target = parts.next()?;
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Some(Request {
        method: method.to_owned(),
        path: path.to_owned(),
    })
}

/// Binds the listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `handler` on `listener` until the task is dropped.
pub async fn serve<H, F>(listener: TcpListener, handler: H)
where
    H: Fn(Request) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT));
    loop {
        // A slot first, so that connections beyond the limit wait in the backlog.
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors, most likely: give others a moment to close theirs.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, handler)).await;
        });
    }
}

async fn answer<H, F>(mut stream: TcpStream, handler: H) -> std::io::Result<()>
where
    H: Fn(Request) -> F,
    F: Future<Output = Response>,
{
    let head = read_head(&mut stream).await?;
    let response = match parse_request(&head) {
        None => Response::new(400, TEXT, "expected a request line\n"),
        Some(r) if r.method != "GET" => Response::new(405, TEXT, "GET only\n"),
        Some(r) => handler(r).await,
    };
    stream.write_all(&response.to_bytes()).await?;
    stream.shutdown().await
}

/// Reads up to the end of the headers, at most [`MAX_HEAD`] bytes.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MAX_HEAD];
    let mut n = 0;
    while n < buf.len() {
        let m = stream.read(&mut buf[n..]).await?;
        if m == 0 {
            break;
        }
        n += m;
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n")
            || buf[..n].windows(2).any(|w| w == b"\n\n")
        {
            break;
        }
    }
    buf.truncate(n);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_parse_and_garbage_does_not() {
        let r = parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/metrics"));
        assert_eq!(
            parse_request(b"POST /ready HTTP/1.0\n\n").unwrap().method,
            "POST"
        );
        for bad in [&b""[..], b"\r\n", b"GET", b"\xff\xfe /x"] {
            assert_eq!(parse_request(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn responses_carry_their_length() {
        let b = Response::new(503, TEXT, "peer_x: Active\n").to_bytes();
        let t = String::from_utf8(b).unwrap();
        assert!(t.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{t}");
        assert!(t.contains("Content-Length: 15\r\n"), "{t}");
        assert!(t.ends_with("\r\n\r\npeer_x: Active\n"), "{t}");
    }

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_handler_and_refuses_the_rest() {
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(serve(l, |r: Request| async move {
            Response::new(200, TEXT, format!("you asked {}", r.path))
        }));
        let ok = get(addr, "GET /a?b HTTP/1.1\r\n\r\n").await;
        assert!(
            ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("you asked /a"),
            "{ok}"
        );
        let post = get(addr, "POST /a HTTP/1.1\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let junk = get(addr, "\r\n\r\n").await;
        assert!(junk.starts_with("HTTP/1.1 400"), "{junk}");
        // A head longer than the bound is cut, not buffered: the request line still counts.
        let long = format!(
            "GET /long HTTP/1.1\r\nX: {}\r\n\r\n",
            "y".repeat(3 * MAX_HEAD)
        );
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(long.as_bytes()).await;
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        assert!(out.is_empty() || out.ends_with("you asked /long"), "{out}");
        task.abort();
    }

    #[tokio::test]
    async fn a_silent_client_does_not_hold_a_slot_forever() {
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(serve(l, |_r: Request| async {
            Response::new(200, TEXT, "fine")
        }));
        // Every slot taken by clients that never send a byte.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONCURRENT {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let started = std::time::Instant::now();
        let out = get(addr, "GET / HTTP/1.1\r\n\r\n").await;
        assert!(out.ends_with("fine"), "{out}");
        assert!(started.elapsed() < REQUEST_TIMEOUT * 2);
        task.abort();
    }
}
