//! routewriter's counters and their small HTTP listener: `GET /metrics` answers Prometheus
//! text, `GET /status` one JSON object for people and tests. Hand-written on tokio (a request
//! line and headers in, one response out, connection closed) to need no HTTP crate; requests
//! are bounded in size, time and number at once.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::desired::Kind;

/// Everything the listener reports, updated by the agent.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct State {
    pub revision: u64,
    pub stream_connected: bool,
    pub stream_reconnects: u64,
    /// A snapshot has been applied and the kernel converged to it once.
    pub synced: bool,
    /// Desired routes by kind.
    pub routes: BTreeMap<&'static str, u64>,
    /// Routes the kernel refused, waiting for a retry.
    pub routes_failing: u64,
    /// Routes whose device does not exist (yet).
    pub routes_waiting_for_device: u64,
    /// Routes that need a kernel feature this kernel lacks, by feature.
    pub routes_unsupported: BTreeMap<String, u64>,
    /// Repairs of drift, by object (route, neigh, fdb, device, address, nat, sysctl).
    pub corrections: BTreeMap<&'static str, u64>,
    pub resyncs: u64,
    pub last_resync_seconds: f64,
    pub netlink_writes: u64,
    pub nft_writes: u64,
    pub sysctl_writes: u64,
    pub items_rejected: u64,
    pub vxlan_device: Option<String>,
    pub last_error: Option<String>,
    pub last_error_unix: u64,
    /// Up to 20 failing routes with the kernel's reason.
    pub failing_examples: Vec<String>,
}

/// Shared between the agent (writer) and the listener (reader).
#[derive(Debug, Default)]
pub struct Metrics {
    state: Mutex<State>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let m = Metrics::default();
        if let Ok(mut s) = m.state.lock() {
            for k in Kind::ALL {
                s.routes.insert(k.name(), 0);
            }
        }
        Arc::new(m)
    }

    /// Runs `f` on the state (a short critical section; a poisoned lock is taken over).
    pub fn update(&self, f: impl FnOnce(&mut State)) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s);
    }

    pub fn snapshot(&self) -> State {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn error(&self, message: impl Into<String>) {
        let message = message.into();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.update(|s| {
            s.last_error = Some(message);
            s.last_error_unix = now;
        });
    }

    pub fn correction(&self, object: &'static str, n: u64) {
        if n > 0 {
            self.update(|s| *s.corrections.entry(object).or_insert(0) += n);
        }
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let s = self.snapshot();
        let mut o = String::new();
        let mut gauge = |name: &str, help: &str, kind: &str, lines: &[(String, String)]| {
            let _ = writeln!(o, "# HELP routewriter_{name} {help}");
            let _ = writeln!(o, "# TYPE routewriter_{name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(o, "routewriter_{name}{labels} {value}");
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        gauge(
            "revision",
            "Revision of the desired state last applied.",
            "gauge",
            &one(s.revision.to_string()),
        );
        gauge(
            "stream_connected",
            "1 while the Dataplane stream from bgpd is up.",
            "gauge",
            &one(u8::from(s.stream_connected).to_string()),
        );
        gauge(
            "stream_reconnects_total",
            "Reconnects to bgpd.",
            "counter",
            &one(s.stream_reconnects.to_string()),
        );
        gauge(
            "synced",
            "1 once the kernel converged to a snapshot.",
            "gauge",
            &one(u8::from(s.synced).to_string()),
        );
        let routes: Vec<_> = s
            .routes
            .iter()
            .map(|(k, v)| (format!("{{kind=\"{k}\"}}"), v.to_string()))
            .collect();
        gauge("routes", "Desired routes by kind.", "gauge", &routes);
        gauge(
            "routes_failing",
            "Routes the kernel refused, retried with backoff.",
            "gauge",
            &one(s.routes_failing.to_string()),
        );
        gauge(
            "routes_waiting_for_device",
            "Routes whose device does not exist yet.",
            "gauge",
            &one(s.routes_waiting_for_device.to_string()),
        );
        let unsupported: Vec<_> = s
            .routes_unsupported
            .iter()
            .map(|(k, v)| (format!("{{feature=\"{}\"}}", escape(k)), v.to_string()))
            .collect();
        gauge(
            "routes_unsupported",
            "Routes needing a kernel feature this kernel lacks.",
            "gauge",
            &unsupported,
        );
        let corrections: Vec<_> = s
            .corrections
            .iter()
            .map(|(k, v)| (format!("{{object=\"{k}\"}}"), v.to_string()))
            .collect();
        gauge(
            "corrections_total",
            "Drift repaired, by object.",
            "counter",
            &corrections,
        );
        gauge(
            "resyncs_total",
            "Full resyncs.",
            "counter",
            &one(s.resyncs.to_string()),
        );
        gauge(
            "resync_duration_seconds",
            "Duration of the last full resync.",
            "gauge",
            &one(format!("{:.6}", s.last_resync_seconds)),
        );
        gauge(
            "netlink_writes_total",
            "Netlink messages that change kernel state.",
            "counter",
            &one(s.netlink_writes.to_string()),
        );
        gauge(
            "nft_writes_total",
            "nftables transactions.",
            "counter",
            &one(s.nft_writes.to_string()),
        );
        gauge(
            "sysctl_writes_total",
            "Sysctl values written.",
            "counter",
            &one(s.sysctl_writes.to_string()),
        );
        gauge(
            "items_rejected_total",
            "Desired items that could not be taken.",
            "counter",
            &one(s.items_rejected.to_string()),
        );
        let err = match &s.last_error {
            Some(e) => vec![(
                format!("{{message=\"{}\"}}", escape(e)),
                s.last_error_unix.to_string(),
            )],
            None => vec![],
        };
        gauge(
            "last_error_timestamp_seconds",
            "When the last error happened; its message is the label.",
            "gauge",
            &err,
        );
        o
    }

    pub fn status_json(&self) -> String {
        serde_json::to_string_pretty(&self.snapshot()).unwrap_or_else(|_| "{}".into())
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves `/metrics` and `/status` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    // Scrapers are few; more at once than this wait.
    let slots = Arc::new(Semaphore::new(8));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(Duration::from_secs(5), answer(stream, &metrics)).await;
        });
    }
}

async fn answer(mut stream: tokio::net::TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let mut n = 0;
    // Read up to the end of the headers, at most 8 KiB.
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
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
        ("GET", "/status") => ("200 OK", "application/json", metrics.status_json()),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "try /metrics or /status\n".into(),
        ),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(resp.as_bytes()).await?;
    stream.shutdown().await
}

/// Binds the listener (an error names the address).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::new();
        m.update(|s| {
            s.revision = 7;
            s.routes.insert("vxlan", 3);
            s.netlink_writes = 12;
        });
        m.correction("route", 2);
        m.correction("fdb", 0);
        m.error("route 10.65.1.0/26: \"quoted\"\nnext");
        let t = m.render();
        assert!(t.contains("routewriter_revision 7\n"), "{t}");
        assert!(t.contains("routewriter_routes{kind=\"vxlan\"} 3\n"));
        assert!(t.contains("routewriter_routes{kind=\"blackhole\"} 0\n"));
        assert!(t.contains("routewriter_corrections_total{object=\"route\"} 2\n"));
        assert!(!t.contains("object=\"fdb\""));
        assert!(t.contains("routewriter_netlink_writes_total 12\n"));
        assert!(t.contains("message=\"route 10.65.1.0/26: \\\"quoted\\\"\\nnext\""));
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
        let j: serde_json::Value = serde_json::from_str(&m.status_json()).unwrap();
        assert_eq!(j["revision"], 7);
    }

    #[tokio::test]
    async fn serves_metrics_and_status() {
        let m = Metrics::new();
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(serve(l, m.clone()));
        for (path, want) in [("/metrics", "200 OK"), ("/status", "200 OK"), ("/x", "404")] {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            assert!(
                out.starts_with("HTTP/1.1 ") && out.contains(want),
                "{path}: {out}"
            );
        }
        task.abort();
    }
}
