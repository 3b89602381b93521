//! bgpd's configuration: a TOML file read with the `config` crate, every key overridable by an
//! environment variable `MARGAY_<SECTION>__<KEY>` (e.g. `MARGAY_NODE__ADDRESS=10.0.0.5/24`).
//! Loading validates everything, so the rest of the daemon works with typed, checked values.
//!
//! Why this file is long: every section's typed keys, defaults and load-time checks in one
//! place, so an operator's key and its check are found together.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::Deserialize;

pub use daemon_common::config::{
    ConfigError, LogConfig, LogFormat, LogLevel, field, hostname, load_layers,
};
/// Where bgpd serves its API when the configuration says nothing.
pub use proto::client::DEFAULT_SOCKET;
/// Where the embedded datastore lives when the configuration says nothing.
pub const DEFAULT_SQLITE_PATH: &str = "/var/lib/margay/store.db";
/// Calico's default cluster AS.
pub const DEFAULT_AS: u32 = 64512;

/// The whole configuration of one bgpd.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Config {
    pub node: NodeConfig,
    pub api: ApiConfig,
    pub datastore: DatastoreConfig,
    pub ipam: IpamSection,
    pub bgp: BgpConfig,
    pub log: LogConfig,
    pub metrics: MetricsConfig,
}

/// `[metrics]`: the HTTP endpoints for Prometheus and probes (`/metrics`, `/ready`, `/live`,
/// `/status`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where to serve them, e.g. "127.0.0.1:9098"; none: not served.
    pub listen: Option<SocketAddr>,
    /// BGP sessions that may be down while bgpd counts as ready, by peer name
    /// ("peer_10_0_0_1"); `*` in a name matches any run of characters, "*" alone every peer.
    pub ready_allow_down: Vec<String>,
}

/// IPAM settings of this node's configuration.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct IpamSection {
    /// Pools bgpd creates at start when no pool of that name exists (existing ones are left
    /// as they are).
    pub default_pools: Vec<DefaultPool>,
    /// On the Kubernetes datastore, how long an address must have leaked (its Pod gone,
    /// elsewhere, finished or not holding it) before the GC releases it, in seconds:
    /// Calico's `leakGracePeriod`, 900 when unset; 0 turns the GC off.
    pub leak_grace_seconds: Option<u64>,
}

impl IpamSection {
    /// Calico's default `leakGracePeriod`.
    pub const LEAK_GRACE_DEFAULT: u64 = 900;

    /// The grace period of leaked addresses; `None` when the GC is off.
    pub fn leak_grace(&self) -> Option<std::time::Duration> {
        match self.leak_grace_seconds.unwrap_or(Self::LEAK_GRACE_DEFAULT) {
            0 => None,
            s => Some(std::time::Duration::from_secs(s)),
        }
    }
}

/// A pool named in the configuration, with Calico's spelling of the modes.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DefaultPool {
    pub name: String,
    pub cidr: ipnet::IpNet,
    pub block_size: Option<u8>,
    #[serde(default)]
    pub vxlan_mode: ::datastore::model::EncapMode,
    #[serde(default)]
    pub ipip_mode: ::datastore::model::EncapMode,
    #[serde(default)]
    pub nat_outgoing: bool,
    #[serde(default)]
    pub disable_bgp_export: bool,
    #[serde(default)]
    pub node_selector: String,
}

impl DefaultPool {
    pub fn to_pool(&self) -> ::datastore::model::IpPool {
        let mut p = ::datastore::model::IpPool::new(&self.name, self.cidr);
        if let Some(size) = self.block_size {
            p.block_size = size;
        }
        p.vxlan_mode = self.vxlan_mode;
        p.ipip_mode = self.ipip_mode;
        p.nat_outgoing = self.nat_outgoing;
        p.disable_bgp_export = self.disable_bgp_export;
        p.node_selector = self.node_selector.clone();
        p
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// The node's name in the cluster; the host name when empty.
    pub name: String,
    /// IPv4 address with prefix length, e.g. "10.0.0.5/24".
    pub address: Option<Ipv4Net>,
    /// IPv6 address with prefix length.
    pub address6: Option<Ipv6Net>,
    /// Labels that pools' node selectors match, e.g. { zone = "a" }.
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Unix socket for local clients (bgpctl, CNI plugins, routewriter); mode 0600.
    pub socket: PathBuf,
    /// Optional TCP address to serve on as well; needs the three TLS files (mutual TLS).
    pub tcp_listen: Option<SocketAddr>,
    /// PEM certificate chain of the server.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the server.
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle that client certificates must chain to.
    pub tls_client_ca: Option<PathBuf>,
    /// Connections open at once on each listener (the unix socket and TCP count apart, so
    /// that remote clients cannot lock the node's own agents out); one more is closed as
    /// soon as it is accepted.
    pub max_connections: u32,
    /// Streams (calls in flight) one HTTP/2 connection may have open at once: the
    /// SETTINGS_MAX_CONCURRENT_STREAMS bgpd announces. A client waits for a free one.
    pub max_streams_per_connection: u32,
    /// Streaming calls open at once over all clients and listeners (`Dataplane.Watch`,
    /// `Bgp.ListRoutes`, `grpc.health.v1.Health.Watch`, server reflection); one more gets
    /// RESOURCE_EXHAUSTED.
    pub max_watch_streams: u32,
}

/// Defaults of the API's caps: far above what a node's own clients open (routewriter
/// holds one Watch, the CNI plugin and bgpctl one connection each per call), and above what
/// `api_hostile` opens (10 000 Watch streams over 10 connections, twice in turn), so that
/// only a runaway or hostile client meets them.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1024;
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 4096;
pub const DEFAULT_MAX_WATCH_STREAMS: u32 = 20_000;

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(DEFAULT_SOCKET),
            tcp_listen: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            max_watch_streams: DEFAULT_MAX_WATCH_STREAMS,
        }
    }
}

/// Mutual-TLS files for the TCP listener, all three present once validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// The largest value of each API cap: beyond, a cap would no longer bound anything (file
/// descriptors and memory run out first), so a value above is a typo.
const MAX_API_CAP: u32 = 1_000_000;

impl ApiConfig {
    /// Each cap at least 1 (0 would serve nothing) and at most [`MAX_API_CAP`].
    fn check_caps(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("api.max_connections", self.max_connections),
            (
                "api.max_streams_per_connection",
                self.max_streams_per_connection,
            ),
            ("api.max_watch_streams", self.max_watch_streams),
        ] {
            if !(1..=MAX_API_CAP).contains(&value) {
                return Err(field(
                    name,
                    format!("{value}: give 1 to {MAX_API_CAP} (0 would refuse every client)"),
                ));
            }
        }
        Ok(())
    }

    /// The TLS files, when the TCP listener is configured.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone()?,
        })
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DatastoreKind {
    /// One SQLite file shared by the processes of one host (the embedded default).
    #[default]
    Sqlite,
    /// An etcd cluster, for real multi-host clusters.
    Etcd,
    /// The Kubernetes API (Calico's "Kubernetes API datastore"): Calico's CRDs.
    Kubernetes,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DatastoreConfig {
    pub kind: DatastoreKind,
    /// The SQLite file.
    pub path: PathBuf,
    /// SQLite: "full" (every commit on disk before it is acknowledged) or "normal" (survives
    /// a crash of bgpd, not necessarily a power loss).
    pub sync: ::datastore::sqlite::Sync,
    /// etcd endpoints, e.g. ["http://127.0.0.1:2379"]; a comma-separated list in the environment.
    pub endpoints: Vec<String>,
    /// etcd over TLS: `ca`, and `cert` + `key` when etcd wants client certificates.
    pub tls: Option<::datastore::etcd::EtcdTls>,
    /// Kubernetes: the kubeconfig to reach the API with; unset in a pod, whose service
    /// account is used.
    pub kubeconfig: Option<PathBuf>,
    /// Whether IPAM uses the backend's transactions over several objects (SQLite and etcd
    /// have them; the Kubernetes API has none, so this is moot there): a claim is one commit. `false` writes one object at a time, as on a
    /// datastore without them (the Kubernetes API); for testing that path on these backends.
    pub transactions: bool,
}

impl Default for DatastoreConfig {
    fn default() -> Self {
        Self {
            kind: DatastoreKind::Sqlite,
            path: PathBuf::from(DEFAULT_SQLITE_PATH),
            sync: ::datastore::sqlite::Sync::Full,
            endpoints: vec!["http://127.0.0.1:2379".into()],
            tls: None,
            kubeconfig: None,
            transactions: true,
        }
    }
}

impl DatastoreConfig {
    /// One line naming the datastore, e.g. "sqlite:/var/lib/margay/store.db".
    pub fn describe(&self) -> String {
        match self.kind {
            DatastoreKind::Sqlite => format!("sqlite:{}", self.path.display()),
            DatastoreKind::Etcd => format!("etcd:{}", self.endpoints.join(",")),
            DatastoreKind::Kubernetes => match &self.kubeconfig {
                Some(path) => format!("kubernetes:{}", path.display()),
                None => "kubernetes:in-cluster".into(),
            },
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct BgpConfig {
    /// This node's AS.
    #[serde(rename = "as")]
    pub as_number: u32,
    /// BGP identifier; the node's IPv4 address when unset.
    pub router_id: Option<Ipv4Addr>,
    pub listen_port: u16,
    /// Explicit peers (`[[bgp.peers]]`).
    pub peers: Vec<BgpPeerConfig>,
    /// Routes this node originates (`[[bgp.announce]]`).
    pub announce: Vec<BgpAnnounce>,
    /// Be a route reflector with this cluster id (RFC 4456); the node's
    /// route-reflector cluster id in the datastore wins when set.
    pub cluster_id: Option<Ipv4Addr>,
    /// Pass routes learned from one configured peer on to the others (until the cluster's
    /// BGP configuration is stored in the datastore, which then decides).
    pub external_transit: bool,
    /// How long a session waits after an error before it starts again, seconds: the first
    /// wait, doubled per consecutive error up to the second (BIRD's `error wait time`;
    /// Calico's 5 and 30 by default). For every session; `[[bgp.peers]]` may set its own.
    pub error_wait_time: [u16; 2],
}

/// One explicitly configured BGP peer.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BgpPeerConfig {
    /// IPv4 or IPv6: the session runs over TCP of that family.
    pub address: IpAddr,
    #[serde(rename = "as")]
    pub as_number: u32,
    /// Wait for the peer to connect; never connect out.
    #[serde(default)]
    pub passive: bool,
    /// TCP port to connect to on the peer; 179 when unset.
    pub port: Option<u16>,
    /// Hold time to propose, seconds (0, or 3 and up); 240 when unset.
    pub hold_time: Option<u16>,
    /// Keepalive interval, seconds; a third of the hold time when unset.
    pub keepalive: Option<u16>,
    /// TCP MD5 password (RFC 2385); both sides must have the same.
    #[serde(default)]
    pub password: String,
    /// GTSM (RFC 5082): the peer is at most this many hops away.
    pub ttl_security: Option<u8>,
    /// eBGP multihop: the TTL of our packets.
    pub multihop: Option<u8>,
    /// A route-reflector client of this node (needs `bgp.cluster_id`).
    #[serde(default)]
    pub rr_client: bool,
    /// Most prefixes the peer may send; above it the session stops (Cease/Maximum Number
    /// of Prefixes).
    pub max_prefixes: Option<u32>,
    /// Seconds before a session stopped by `max_prefixes` restarts; unset: it stays down.
    pub max_prefixes_restart: Option<u16>,
    /// Graceful restart (RFC 4724) with this peer; on by default, as Calico's BIRD.
    #[serde(default = "yes")]
    pub graceful_restart: bool,
    /// The restart time we announce, seconds (at most 4095); 120 when unset.
    pub restart_time: Option<u16>,
    /// How long the peer's routes stay stale after it is back, seconds; 360 when unset.
    pub stale_time: Option<u16>,
    /// Address families the session carries; the session's own family when unset.
    /// `ipv4` on an IPv6 session uses IPv6 next hops (RFC 8950 extended next hop);
    /// `ipv6` on an IPv4 session uses `node.address6` as our next hop.
    pub families: Option<Vec<AddressFamily>>,
    /// BFD with this peer (`bfd = { min_rx_ms = 100, min_tx_ms = 100, multiplier = 3 }`):
    /// single-hop, or multihop (RFC 5883) when `multihop` is set. Its session going Down
    /// takes the BGP session down at once.
    pub bfd: Option<BfdConfig>,
    /// `[first, longest]` wait after a session error, seconds; `bgp.error_wait_time` when
    /// unset.
    pub error_wait_time: Option<[u16; 2]>,
    /// The AS we speak on this session instead of `bgp.as` (BIRD's `local as`, Calico's
    /// `localASNumber`).
    pub local_as: Option<u32>,
    /// How often our AS may appear in a route's AS_PATH before it is a loop (BIRD's `allow
    /// local as`, Calico's `numAllowedLocalASNumbers`).
    #[serde(default)]
    pub allow_local_as: u8,
    /// `"Auto"` (ours to eBGP peers, the route's to iBGP), `"Self"` or `"Keep"` (Calico's
    /// `nextHopMode`).
    #[serde(default)]
    pub next_hop: ::datastore::model::NextHopMode,
}

/// A peer's BFD parameters; FRR's defaults (300 ms × 3) where a key is left out.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct BfdConfig {
    /// The shortest interval at which we can receive packets (RequiredMinRxInterval).
    pub min_rx_ms: u64,
    /// The interval at which we would like to send (DesiredMinTxInterval).
    pub min_tx_ms: u64,
    /// Packets missed before the session is declared Down (Detect Mult), 1-255.
    pub multiplier: u64,
}

impl Default for BfdConfig {
    fn default() -> Self {
        BfdConfig {
            min_rx_ms: 300,
            min_tx_ms: 300,
            multiplier: 3,
        }
    }
}

impl BfdConfig {
    /// The checked session parameters; the error names the key (`min_rx_ms`, ...).
    pub fn session(&self) -> Result<bfd::SessionConfig, bfd::SessionConfigError> {
        bfd::SessionConfig::from_ms(self.min_rx_ms, self.min_tx_ms, self.multiplier)
    }
}

/// An address family a BGP session can carry (unicast), as the user writes it in `families`:
/// an AFI/SAFI to negotiate, not an address's family (`datastore::model::IpFamily`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AddressFamily {
    Ipv4,
    Ipv6,
}

fn yes() -> bool {
    true
}

/// One route this node announces.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BgpAnnounce {
    /// IPv4 or IPv6.
    pub prefix: IpNet,
    /// Next hop to advertise; our address on each session when unset (next-hop-self).
    pub next_hop: Option<IpAddr>,
    /// Standard communities, "65000:100".
    #[serde(default)]
    pub communities: Vec<String>,
}

impl Default for BgpConfig {
    fn default() -> Self {
        Self {
            as_number: DEFAULT_AS,
            router_id: None,
            listen_port: 179,
            peers: Vec::new(),
            announce: Vec::new(),
            cluster_id: None,
            external_transit: false,
            error_wait_time: DEFAULT_ERROR_WAIT,
        }
    }
}

pub use crate::speaker::task::DEFAULT_ERROR_WAIT;

/// `[first, longest]` error wait: the first at least 1 s (a session that keeps failing must
/// not spin), the longest at least the first, both at most an hour.
fn check_error_wait(name: &str, [first, longest]: [u16; 2]) -> Result<(), ConfigError> {
    if first == 0 || first > longest || longest > 3600 {
        return Err(field(
            "bgp.error_wait_time",
            format!(
                "{name} = [{first}, {longest}]: give [first, longest] seconds with 1 <= first <= longest <= 3600"
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// Reads `path` (when given) and the process environment's `MARGAY_` variables.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(path, None)
    }

    /// As [`Config::load`], with the environment given explicitly (`None`: the process's).
    pub fn load_with_env(
        path: Option<&Path>,
        env: Option<config::Map<String, String>>,
    ) -> Result<Self, ConfigError> {
        let mut config: Config = load_layers(
            path,
            env,
            &["datastore.endpoints", "metrics.ready_allow_down"],
        )?;
        config.fill_defaults();
        config.validate()?;
        Ok(config)
    }

    /// Takes the node's addresses found after loading (`node_address`): the router id
    /// follows the IPv4 address as it would have had the file given it, unless the file set
    /// one of its own.
    pub fn adopt_addresses(&mut self, v4: Option<Ipv4Net>, v6: Option<Ipv6Net>) {
        let defaulted = self.bgp.router_id == Some(hashed_router_id(&self.node.name));
        self.node.address = v4;
        self.node.address6 = v6;
        if let Some(a) = v4.filter(|_| defaulted) {
            self.bgp.router_id = Some(a.addr());
        }
    }

    fn fill_defaults(&mut self) {
        if self.node.name.is_empty() {
            self.node.name = hostname();
        }
        if self.bgp.router_id.is_none() {
            // An IPv6-only node has no IPv4 address to take: a router id hashed from its
            // name, as Calico's `routerID: hash` does for IPv6-only clusters.
            self.bgp.router_id = Some(
                self.node
                    .address
                    .map(|a| a.addr())
                    .unwrap_or_else(|| hashed_router_id(&self.node.name)),
            );
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.node.name.is_empty() {
            return Err(field(
                "node.name",
                "must not be empty (set it or give the host a name)",
            ));
        }
        ::datastore::model::validate_name("node.name", &self.node.name)
            .map_err(|e| field("node.name", e.to_string()))?;
        if self.api.socket.as_os_str().is_empty() {
            return Err(field("api.socket", "must not be empty"));
        }
        if self.api.tcp_listen.is_some() && self.api.tls_files().is_none() {
            return Err(field(
                "api.tcp_listen",
                "TCP is served only with mutual TLS: set api.tls_cert, api.tls_key and api.tls_client_ca",
            ));
        }
        self.api.check_caps()?;
        for (i, pool) in self.ipam.default_pools.iter().enumerate() {
            pool.to_pool().validate().map_err(|e| {
                field(
                    "ipam.default_pools",
                    format!("pool {} (entry {i}): {e}", pool.name),
                )
            })?;
        }
        if self.bgp.as_number == 0 {
            return Err(field("bgp.as", "AS 0 is reserved (RFC 7607)"));
        }
        check_error_wait("bgp.error_wait_time", self.bgp.error_wait_time)?;
        for (i, p) in self.bgp.peers.iter().enumerate() {
            self.validate_peer(i, p)?;
        }
        for a in &self.bgp.announce {
            validate_announce(a)?;
        }
        for pattern in &self.metrics.ready_allow_down {
            if pattern.trim().is_empty() {
                return Err(field(
                    "metrics.ready_allow_down",
                    "an entry is empty; name a peer (\"peer_10_0_0_1\") or use \"*\"",
                ));
            }
        }
        match self.datastore.kind {
            DatastoreKind::Sqlite if self.datastore.path.as_os_str().is_empty() => {
                return Err(field("datastore.path", "must name the SQLite file"));
            }
            DatastoreKind::Etcd if self.datastore.endpoints.is_empty() => {
                return Err(field(
                    "datastore.endpoints",
                    "must list at least one etcd endpoint",
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// The checks of `bgp.peers[i]`, one peer at a time.
    fn validate_peer(&self, i: usize, p: &BgpPeerConfig) -> Result<(), ConfigError> {
        if let Some(w) = p.error_wait_time {
            check_error_wait(&format!("bgp.peers[{i}].error_wait_time"), w)?;
        }
        if let Some(Err(e)) = p.bfd.map(|b| b.session()) {
            return Err(field(
                "bgp.peers",
                format!("peer {}: bgp.peers[{i}].bfd.{e}", p.address),
            ));
        }
        if p.as_number == 0 {
            return Err(field(
                "bgp.peers",
                format!("peer {}: AS 0 is reserved", p.address),
            ));
        }
        if p.local_as
            .is_some_and(|a| net_types::asn::is_reserved(a) || a == u32::MAX)
        {
            return Err(field(
                "bgp.peers",
                format!(
                    "peer {}: local_as cannot be 0, AS_TRANS {} or 4294967295",
                    p.address,
                    net_types::asn::AS_TRANS
                ),
            ));
        }
        if matches!(p.hold_time, Some(1 | 2)) {
            return Err(field(
                "bgp.peers",
                format!("peer {}: hold_time must be 0 or at least 3", p.address),
            ));
        }
        if p.restart_time.is_some_and(|t| t > 4095) {
            return Err(field(
                "bgp.peers",
                format!("peer {}: restart_time is at most 4095 seconds", p.address),
            ));
        }
        if p.rr_client && self.bgp.cluster_id.is_none() {
            return Err(field(
                "bgp.peers",
                format!(
                    "peer {}: rr_client needs bgp.cluster_id (this node must be a route reflector)",
                    p.address
                ),
            ));
        }
        crate::speaker::sockopt::Password::new(&p.password)
            .map_err(|e| field("bgp.peers", format!("peer {}: password: {e}", p.address)))?;
        if let IpAddr::V6(a) = p.address
            && a.is_unicast_link_local()
        {
            return Err(field(
                "bgp.peers",
                format!(
                    "peer {}: a link-local address needs an interface, which peers cannot name yet; use the peer's global address",
                    p.address
                ),
            ));
        }
        if p.families.as_ref().is_some_and(Vec::is_empty) {
            return Err(field(
                "bgp.peers",
                format!(
                    "peer {}: families is empty; list \"ipv4\", \"ipv6\" or both, or leave it out",
                    p.address
                ),
            ));
        }
        if matches!(p.ttl_security, Some(0)) || matches!(p.multihop, Some(0)) {
            return Err(field(
                "bgp.peers",
                format!(
                    "peer {}: ttl_security and multihop are 1-255 hops",
                    p.address
                ),
            ));
        }
        Ok(())
    }
}

/// The checks of one `bgp.announce` entry: an IPv6 route's next hop, its communities.
fn validate_announce(a: &BgpAnnounce) -> Result<(), ConfigError> {
    if let (IpNet::V6(_), Some(IpAddr::V4(nh))) = (a.prefix, a.next_hop) {
        return Err(field(
            "bgp.announce",
            format!(
                "prefix {}: next hop {nh} is IPv4; IPv6 routes need an IPv6 next hop",
                a.prefix
            ),
        ));
    }
    for c in &a.communities {
        c.parse::<bgp_wire::Community>().map_err(|e| {
            field(
                "bgp.announce",
                format!("prefix {}: community {c:?}: {e}", a.prefix),
            )
        })?;
    }
    Ok(())
}

/// A stable, non-zero BGP identifier from a node name (for nodes without an IPv4 address).
pub fn hashed_router_id(name: &str) -> std::net::Ipv4Addr {
    let d = proto::mac::sha1(name.as_bytes());
    let id = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
    std::net::Ipv4Addr::from(if id == 0 { 1 } else { id })
}

#[cfg(test)]
mod tests;
