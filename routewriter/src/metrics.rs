//! routewriter's counters and what its listener serves: `GET /metrics` answers Prometheus
//! text, `GET /status` one JSON object for people and tests. The listener itself (bounded in
//! size, time and number of requests) is the one bgpd uses too, `observe::http`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use net_types::IpFamily;
use tokio::net::TcpListener;

use super::desired::Kind as RouteKind;
use super::routes::family_label;
use daemon_common::observe::http;
use daemon_common::observe::prom::{Exposition, Kind};

/// Everything the listener reports, updated by the agent.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct State {
    pub revision: u64,
    pub stream_connected: bool,
    pub stream_reconnects: u64,
    /// A snapshot has been applied and the kernel converged to it once.
    pub synced: bool,
    /// Desired routes by kind (both families).
    pub routes: BTreeMap<&'static str, u64>,
    /// Desired routes by family ("ipv4", "ipv6"), then kind.
    pub routes_by_family: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
    /// Remote VTEPs desired, by family.
    pub vteps: BTreeMap<&'static str, u64>,
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
    /// Network policy: pod interfaces with rules, their rules, the address sets.
    pub policy_endpoints: u64,
    pub policy_rules: u64,
    pub policy_sets: u64,
    /// Policy writes nft refused (the previous ruleset stayed in force), and the last refusal
    /// while it stands (cleared by the next write that succeeds).
    pub policy_refused: u64,
    pub policy_error: Option<String>,
    /// The VXLAN devices programmed (one per family at most).
    pub vxlan_devices: Vec<String>,
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
            for k in RouteKind::ALL {
                s.routes.insert(k.name(), 0);
            }
            for f in IpFamily::ALL {
                let kinds = RouteKind::ALL.iter().map(|k| (k.name(), 0)).collect();
                s.routes_by_family.insert(family_label(f), kinds);
                s.vteps.insert(family_label(f), 0);
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
    #[expect(
        clippy::too_many_lines,
        reason = "the Prometheus exposition: one metric family after another, each with its help, type and samples from one snapshot"
    )]
    pub fn render(&self) -> String {
        let s = self.snapshot();
        let mut e = Exposition::new("routewriter_");
        e.single(
            "revision",
            "Revision of the desired state last applied.",
            Kind::Gauge,
            s.revision,
        );
        e.single(
            "stream_connected",
            "1 while the Dataplane stream from bgpd is up.",
            Kind::Gauge,
            u8::from(s.stream_connected),
        );
        e.single(
            "stream_reconnects_total",
            "Reconnects to bgpd.",
            Kind::Counter,
            s.stream_reconnects,
        );
        e.single(
            "synced",
            "1 once the kernel converged to a snapshot.",
            Kind::Gauge,
            u8::from(s.synced),
        );
        e.family("routes", "Desired routes by family and kind.", Kind::Gauge);
        for (family, kinds) in &s.routes_by_family {
            for (kind, n) in kinds {
                e.sample("routes", &[("family", family), ("kind", kind)], n);
            }
        }
        labelled(
            &mut e,
            "vteps",
            "Remote VXLAN endpoints desired, by family.",
            Kind::Gauge,
            "family",
            &s.vteps,
        );
        e.single(
            "routes_failing",
            "Routes the kernel refused, retried with backoff.",
            Kind::Gauge,
            s.routes_failing,
        );
        e.single(
            "routes_waiting_for_device",
            "Routes whose device does not exist yet.",
            Kind::Gauge,
            s.routes_waiting_for_device,
        );
        labelled(
            &mut e,
            "routes_unsupported",
            "Routes needing a kernel feature this kernel lacks.",
            Kind::Gauge,
            "feature",
            &s.routes_unsupported,
        );
        labelled(
            &mut e,
            "corrections_total",
            "Drift repaired, by object.",
            Kind::Counter,
            "object",
            &s.corrections,
        );
        e.single("resyncs_total", "Full resyncs.", Kind::Counter, s.resyncs);
        e.single(
            "resync_duration_seconds",
            "Duration of the last full resync.",
            Kind::Gauge,
            format!("{:.6}", s.last_resync_seconds),
        );
        e.single(
            "netlink_writes_total",
            "Netlink messages that change kernel state.",
            Kind::Counter,
            s.netlink_writes,
        );
        e.single(
            "nft_writes_total",
            "nftables transactions.",
            Kind::Counter,
            s.nft_writes,
        );
        e.single(
            "sysctl_writes_total",
            "Sysctl values written.",
            Kind::Counter,
            s.sysctl_writes,
        );
        e.single(
            "items_rejected_total",
            "Desired items that could not be taken.",
            Kind::Counter,
            s.items_rejected,
        );
        e.single(
            "policy_endpoints",
            "Pod interfaces with network-policy rules.",
            Kind::Gauge,
            s.policy_endpoints,
        );
        e.single(
            "policy_rules",
            "Network-policy rules of the pod interfaces.",
            Kind::Gauge,
            s.policy_rules,
        );
        e.single(
            "policy_sets",
            "Network-policy address sets.",
            Kind::Gauge,
            s.policy_sets,
        );
        e.single(
            "policy_refused_total",
            "Network-policy writes nftables refused; the previous ruleset stayed in force.",
            Kind::Counter,
            s.policy_refused,
        );
        e.single(
            "policy_in_force",
            "1 when the policy table is as desired, 0 while a refused write left an older one.",
            Kind::Gauge,
            u64::from(s.policy_error.is_none()),
        );
        e.family(
            "last_error_timestamp_seconds",
            "When the last error happened; its message is the label.",
            Kind::Gauge,
        );
        if let Some(message) = &s.last_error {
            e.sample(
                "last_error_timestamp_seconds",
                &[("message", message)],
                s.last_error_unix,
            );
        }
        e.finish()
    }

    pub fn status_json(&self) -> String {
        serde_json::to_string_pretty(&self.snapshot()).unwrap_or_else(|_| "{}".into())
    }
}

/// One family with a sample per entry of `values`, labelled `label`.
fn labelled<K: AsRef<str>>(
    e: &mut Exposition,
    name: &str,
    help: &str,
    kind: Kind,
    label: &str,
    values: &BTreeMap<K, u64>,
) {
    e.family(name, help, kind);
    for (k, v) in values {
        e.sample(name, &[(label, k.as_ref())], v);
    }
}

/// Serves `/metrics` and `/status` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    http::serve(listener, move |r: http::Request| {
        let metrics = metrics.clone();
        async move {
            match r.path.as_str() {
                "/metrics" => http::Response::new(200, http::PROMETHEUS, metrics.render()),
                "/status" => http::Response::new(200, http::JSON, metrics.status_json()),
                _ => http::Response::not_found(&["/metrics", "/status"]),
            }
        }
    })
    .await
}

/// Binds the listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    http::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::new();
        m.update(|s| {
            s.revision = 7;
            s.routes.insert("vxlan", 3);
            s.routes_by_family
                .get_mut("ipv4")
                .unwrap()
                .insert("vxlan", 2);
            s.routes_by_family
                .get_mut("ipv6")
                .unwrap()
                .insert("vxlan", 1);
            s.vteps.insert("ipv6", 4);
            s.netlink_writes = 12;
        });
        m.correction("route", 2);
        m.correction("fdb", 0);
        m.error("route 10.65.1.0/26: \"quoted\"\nnext");
        let t = m.render();
        assert!(t.contains("routewriter_revision 7\n"), "{t}");
        assert!(
            t.contains("routewriter_routes{family=\"ipv4\",kind=\"vxlan\"} 2\n"),
            "{t}"
        );
        assert!(t.contains("routewriter_routes{family=\"ipv6\",kind=\"vxlan\"} 1\n"));
        assert!(t.contains("routewriter_routes{family=\"ipv6\",kind=\"blackhole\"} 0\n"));
        assert!(t.contains("routewriter_vteps{family=\"ipv6\"} 4\n"));
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
        assert_eq!(j["routes"]["vxlan"], 3);
        assert_eq!(j["routes_by_family"]["ipv6"]["vxlan"], 1);
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
