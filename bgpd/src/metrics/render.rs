//! bgpd's metrics in the Prometheus text format, as a pure function of a [`Snapshot`]: every
//! name starts with `margay_bgpd_`. Families are always present, so that dashboards and
//! alerts see zeros rather than gaps; what could not be read is said by a gauge
//! (`bgp_speaker_up`, `ipam_read_ok`) instead of by missing series.

use std::collections::BTreeMap;

use super::ready::PeerRow;
use crate::api_stats::{BUCKETS, MethodStats};
use bgp::fsm::State;
use daemon_common::observe::prom::{Exposition, Kind};

/// Every FSM state, so that each has its gauge even at zero.
const STATES: [State; 6] = [
    State::Idle,
    State::Connect,
    State::Active,
    State::OpenSent,
    State::OpenConfirm,
    State::Established,
];

/// One pool's addresses, as `bgpctl ipam show` counts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    pub name: String,
    pub cidr: String,
    pub used: u64,
    /// The pool's size less what is used (IPv6 pools are large).
    pub free: u128,
    pub blocks: u32,
}

impl PoolRow {
    pub fn from_usage(u: &ipam::allocator::PoolUsage) -> Self {
        Self {
            name: u.name.clone(),
            cidr: u.cidr.to_string(),
            used: u.used,
            free: u.size.saturating_sub(u128::from(u.used)),
            blocks: u.blocks,
        }
    }
}

/// The IPAM numbers last read, and whether the last read worked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpamView {
    pub pools: Vec<PoolRow>,
    pub read_ok: bool,
    /// Seconds since `pools` were read.
    pub age_seconds: f64,
}

/// Everything one scrape reports.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub uptime_seconds: f64,
    pub datastore_connected: bool,
    pub ready: bool,
    /// The speaker's sessions, or why it did not answer.
    pub peers: Result<Vec<PeerRow>, String>,
    pub ipam: IpamView,
    pub api: BTreeMap<String, MethodStats>,
    /// What the API's caps hold open and refused.
    pub api_limits: ApiLimits,
    /// The BFD task's packet counters, by what happened to the packets.
    pub bfd: Vec<(&'static str, u64)>,
    /// TCP segments the kernel refused for TCP MD5 or GTSM, by reason (`tcp_drops`).
    pub tcp_drops: Vec<(&'static str, u64)>,
    /// Warnings about objects margay cannot act on as written, by reason (`warnings`).
    pub warnings: Vec<(&'static str, u64)>,
}

/// The API's caps at one scrape (`api::limits`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiLimits {
    /// (listener, open, refused) of each listener's connections.
    pub connections: Vec<(&'static str, usize, u64)>,
    pub streams_open: usize,
    pub streams_refused: u64,
}

impl ApiLimits {
    pub fn of(c: &crate::api::limits::LimitCounters) -> Self {
        Self {
            connections: vec![
                ("unix", c.unix.open(), c.unix.refused()),
                ("tcp", c.tcp.open(), c.tcp.refused()),
            ],
            streams_open: c.streams.open(),
            streams_refused: c.streams.refused(),
        }
    }
}

/// A per-peer or per-pool family: its name, its help, and its value for one row.
type Column<T, V> = (&'static str, &'static str, fn(&T) -> V);

pub fn render(s: &Snapshot) -> String {
    let mut e = Exposition::new("margay_bgpd_");
    e.family(
        "build_info",
        "The version of margay this bgpd was built from.",
        Kind::Gauge,
    )
    .sample("build_info", &[("version", crate::VERSION)], 1);
    e.single(
        "uptime_seconds",
        "Seconds since bgpd started.",
        Kind::Gauge,
        format!("{:.3}", s.uptime_seconds),
    );
    e.single(
        "datastore_connected",
        "1 while the datastore answers its probes.",
        Kind::Gauge,
        u8::from(s.datastore_connected),
    );
    e.single(
        "ready",
        "1 while /ready answers 200 (datastore connected, sessions up or allowed down).",
        Kind::Gauge,
        u8::from(s.ready),
    );
    bgp(&mut e, &s.peers);
    ipam(&mut e, &s.ipam);
    api(&mut e, &s.api);
    api_limits(&mut e, &s.api_limits);
    counters(
        &mut e,
        ("bfd_packets_total", "outcome"),
        "BFD control packets by outcome: received, sent, send_errors, and dropped as malformed, no_session, ttl_refused (single-hop TTL below 255) or flooded (above the peer's rate).",
        &s.bfd,
    );
    counters(
        &mut e,
        ("tcp_segments_refused_total", "reason"),
        "TCP segments the kernel refused before BGP saw them, in bgpd's network namespace: TCP MD5 (RFC 2385) md5_failure (wrong signature), md5_not_found (none where one is expected), md5_unexpected (one where none is), and min_ttl (GTSM, RFC 5082).",
        &s.tcp_drops,
    );
    counters(
        &mut e,
        ("warnings_total", "reason"),
        "Objects of the cluster margay cannot act on as written, by reason: AddressNotAnnounced (a Service's address outside every range), PolicyNotEnforced (a policy left out, or an edit not taken), InvalidIPAMAnnotation (a Pod's IPAM annotations that fail its ADD). On the Kubernetes datastore each is also an Event on the object.",
        &s.warnings,
    );
    e.finish()
}

/// A counter family with one label, one sample per row.
fn counters(
    e: &mut Exposition,
    (name, label): (&str, &str),
    help: &str,
    rows: &[(&'static str, u64)],
) {
    e.family(name, help, Kind::Counter);
    for (value, n) in rows {
        e.sample(name, &[(label, value)], n);
    }
}

fn bgp(e: &mut Exposition, peers: &Result<Vec<PeerRow>, String>) {
    let empty = Vec::new();
    let rows = peers.as_ref().unwrap_or(&empty);
    e.single(
        "bgp_speaker_up",
        "1 when the BGP speaker answered this scrape in time; the BGP families are empty otherwise.",
        Kind::Gauge,
        u8::from(peers.is_ok()),
    );
    e.family("bgp_sessions", "BGP sessions by FSM state.", Kind::Gauge);
    if peers.is_ok() {
        for state in STATES.map(State::name) {
            let n = rows.iter().filter(|p| p.state == state).count();
            e.sample("bgp_sessions", &[("state", state)], n);
        }
    }
    e.family(
        "bgp_session_state",
        "1 for the FSM state each BGP session is in, 0 for the others.",
        Kind::Gauge,
    );
    for p in rows {
        for state in STATES.map(State::name) {
            e.sample(
                "bgp_session_state",
                &[("peer", &p.name), ("state", state)],
                u8::from(p.state == state),
            );
        }
    }
    let per_peer: [Column<PeerRow, u64>; 6] = [
        (
            "bgp_prefixes_received",
            "Prefixes the peer sent us (Adj-RIB-In).",
            |p| p.received,
        ),
        (
            "bgp_prefixes_accepted",
            "Prefixes of the peer accepted by import policy.",
            |p| p.accepted,
        ),
        (
            "bgp_prefixes_advertised",
            "Prefixes we advertise to the peer (Adj-RIB-Out).",
            |p| p.advertised,
        ),
        (
            "bgp_malformed_treat_as_withdraw_total",
            "UPDATEs from the peer treated as withdraw (RFC 7606).",
            |p| p.malformed_treat_as_withdraw,
        ),
        (
            "bgp_malformed_attribute_discard_total",
            "Attributes from the peer discarded (RFC 7606).",
            |p| p.malformed_attribute_discard,
        ),
        (
            "bgp_malformed_session_reset_total",
            "Messages from the peer that reset the session.",
            |p| p.malformed_session_reset,
        ),
    ];
    for (name, help, value) in per_peer {
        e.family(name, help, Kind::Gauge);
        for p in rows {
            e.sample(name, &[("peer", &p.name)], value(p));
        }
    }
}

fn ipam(e: &mut Exposition, v: &IpamView) {
    e.single(
        "ipam_read_ok",
        "1 when the last read of the IPAM usage worked; the pool figures are from the last one that did.",
        Kind::Gauge,
        u8::from(v.read_ok),
    );
    e.single(
        "ipam_read_age_seconds",
        "Seconds since the pool figures were read.",
        Kind::Gauge,
        format!("{:.3}", v.age_seconds),
    );
    let per_pool: [Column<PoolRow, u128>; 3] = [
        (
            "ipam_addresses_used",
            "Addresses allocated in the pool.",
            |p| u128::from(p.used),
        ),
        (
            "ipam_addresses_free",
            "Addresses of the pool not allocated.",
            |p| p.free,
        ),
        ("ipam_blocks", "Blocks the pool is cut into so far.", |p| {
            u128::from(p.blocks)
        }),
    ];
    for (name, help, value) in per_pool {
        e.family(name, help, Kind::Gauge);
        for p in &v.pools {
            e.sample(name, &[("pool", &p.name), ("cidr", &p.cidr)], value(p));
        }
    }
}

fn api(e: &mut Exposition, methods: &BTreeMap<String, MethodStats>) {
    e.family(
        "api_requests_total",
        "gRPC API calls by method and status code.",
        Kind::Counter,
    );
    for (method, m) in methods {
        for (code, n) in &m.codes {
            e.sample(
                "api_requests_total",
                &[("method", method), ("code", code)],
                n,
            );
        }
    }
    e.family(
        "api_request_duration_seconds",
        "gRPC API call durations until the call's status, by method.",
        Kind::Histogram,
    );
    for (method, m) in methods {
        let buckets: Vec<(f64, u64)> = BUCKETS.iter().copied().zip(m.buckets).collect();
        e.histogram(
            "api_request_duration_seconds",
            &[("method", method)],
            &buckets,
            m.sum_seconds,
            m.count,
        );
    }
}

fn api_limits(e: &mut Exposition, l: &ApiLimits) {
    e.family(
        "api_connections_open",
        "gRPC API connections open, by listener (unix, tcp).",
        Kind::Gauge,
    );
    for (listener, open, _) in &l.connections {
        e.sample("api_connections_open", &[("listener", listener)], open);
    }
    e.family(
        "api_connections_refused_total",
        "gRPC API connections closed at once because api.max_connections were open on their listener.",
        Kind::Counter,
    );
    for (listener, _, refused) in &l.connections {
        e.sample(
            "api_connections_refused_total",
            &[("listener", listener)],
            refused,
        );
    }
    e.single(
        "api_streams_open",
        "Streaming gRPC API calls open (Dataplane.Watch, Bgp.ListRoutes, Health.Watch, reflection), over all clients.",
        Kind::Gauge,
        l.streams_open,
    );
    e.single(
        "api_streams_refused_total",
        "Streaming gRPC API calls refused with RESOURCE_EXHAUSTED because api.max_watch_streams were open.",
        Kind::Counter,
        l.streams_refused,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, state: &'static str, received: u64) -> PeerRow {
        PeerRow {
            name: name.into(),
            address: "10.0.0.1".into(),
            asn: 65000,
            state,
            established: state == "Established",
            received,
            accepted: received / 2,
            advertised: 3,
            last_error: None,
            malformed_treat_as_withdraw: 0,
            malformed_attribute_discard: 0,
            malformed_session_reset: 0,
        }
    }

    fn snapshot() -> Snapshot {
        let stats = crate::api_stats::ApiStats::default();
        stats.record(
            "margay.v1.Ipam/AutoAssign",
            tonic::Code::Ok,
            std::time::Duration::from_millis(3),
        );
        stats.record(
            "margay.v1.Ipam/AutoAssign",
            tonic::Code::ResourceExhausted,
            std::time::Duration::from_millis(30),
        );
        Snapshot {
            uptime_seconds: 12.5,
            datastore_connected: true,
            ready: false,
            peers: Ok(vec![
                peer("peer_10_0_0_1", "Established", 10),
                peer("peer_10_0_0_2", "Active", 0),
            ]),
            ipam: IpamView {
                pools: vec![PoolRow {
                    name: "blue".into(),
                    cidr: "10.50.0.0/16".into(),
                    used: 3,
                    free: 65533,
                    blocks: 1,
                }],
                read_ok: true,
                age_seconds: 0.25,
            },
            api: stats.snapshot(),
            api_limits: ApiLimits {
                connections: vec![("unix", 8, 3), ("tcp", 0, 0)],
                streams_open: 50,
                streams_refused: 2,
            },
            bfd: vec![("received", 7), ("malformed", 2)],
            tcp_drops: vec![("md5_failure", 4), ("min_ttl", 1)],
            warnings: vec![("PolicyNotEnforced", 3)],
        }
    }

    #[test]
    fn renders_every_family_with_its_samples() {
        let t = render(&snapshot());
        for line in [
            "margay_bgpd_uptime_seconds 12.500",
            "margay_bgpd_datastore_connected 1",
            "margay_bgpd_ready 0",
            "margay_bgpd_bgp_speaker_up 1",
            "margay_bgpd_bfd_packets_total{outcome=\"malformed\"} 2",
            "margay_bgpd_warnings_total{reason=\"PolicyNotEnforced\"} 3",
            "margay_bgpd_tcp_segments_refused_total{reason=\"md5_failure\"} 4",
            "margay_bgpd_tcp_segments_refused_total{reason=\"min_ttl\"} 1",
            "margay_bgpd_bgp_sessions{state=\"Established\"} 1",
            "margay_bgpd_bgp_sessions{state=\"Active\"} 1",
            "margay_bgpd_bgp_sessions{state=\"Idle\"} 0",
            "margay_bgpd_bgp_session_state{peer=\"peer_10_0_0_2\",state=\"Active\"} 1",
            "margay_bgpd_bgp_session_state{peer=\"peer_10_0_0_2\",state=\"Established\"} 0",
            "margay_bgpd_bgp_prefixes_received{peer=\"peer_10_0_0_1\"} 10",
            "margay_bgpd_bgp_prefixes_accepted{peer=\"peer_10_0_0_1\"} 5",
            "margay_bgpd_bgp_prefixes_advertised{peer=\"peer_10_0_0_2\"} 3",
            "margay_bgpd_ipam_read_ok 1",
            "margay_bgpd_ipam_addresses_used{pool=\"blue\",cidr=\"10.50.0.0/16\"} 3",
            "margay_bgpd_ipam_addresses_free{pool=\"blue\",cidr=\"10.50.0.0/16\"} 65533",
            "margay_bgpd_ipam_blocks{pool=\"blue\",cidr=\"10.50.0.0/16\"} 1",
            "margay_bgpd_api_requests_total{method=\"margay.v1.Ipam/AutoAssign\",code=\"OK\"} 1",
            "margay_bgpd_api_requests_total{method=\"margay.v1.Ipam/AutoAssign\",code=\"ResourceExhausted\"} 1",
            "margay_bgpd_api_request_duration_seconds_bucket{method=\"margay.v1.Ipam/AutoAssign\",le=\"0.005\"} 1",
            "margay_bgpd_api_request_duration_seconds_bucket{method=\"margay.v1.Ipam/AutoAssign\",le=\"0.05\"} 2",
            "margay_bgpd_api_request_duration_seconds_bucket{method=\"margay.v1.Ipam/AutoAssign\",le=\"+Inf\"} 2",
            "margay_bgpd_api_request_duration_seconds_count{method=\"margay.v1.Ipam/AutoAssign\"} 2",
            "margay_bgpd_api_connections_open{listener=\"unix\"} 8",
            "margay_bgpd_api_connections_refused_total{listener=\"unix\"} 3",
            "margay_bgpd_api_connections_refused_total{listener=\"tcp\"} 0",
            "margay_bgpd_api_streams_open 50",
            "margay_bgpd_api_streams_refused_total 2",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        well_formed(&t);
    }

    #[test]
    fn what_could_not_be_read_is_said_not_left_out() {
        let mut s = snapshot();
        s.peers = Err("BGP speaker did not answer within 2s".into());
        s.ipam.read_ok = false;
        let t = render(&s);
        assert!(t.contains("\nmargay_bgpd_bgp_speaker_up 0\n"), "{t}");
        assert!(!t.contains("margay_bgpd_bgp_sessions{"), "{t}");
        assert!(t.contains("# TYPE margay_bgpd_bgp_sessions gauge\n"), "{t}");
        assert!(t.contains("\nmargay_bgpd_ipam_read_ok 0\n"), "{t}");
        // The last figures read stay, with their age.
        assert!(t.contains("margay_bgpd_ipam_blocks{pool=\"blue\""), "{t}");
        well_formed(&t);
    }

    /// Every family announced once, every sample belongs to the family above it, every value
    /// is a number.
    fn well_formed(t: &str) {
        let mut seen = std::collections::HashSet::new();
        let mut family = String::new();
        for line in t.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_owned();
                assert!(seen.insert(family.clone()), "{family} twice");
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(name.starts_with("margay_bgpd_"), "{line}");
            assert!(name.starts_with(&family), "{line} outside {family}");
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
