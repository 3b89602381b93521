//! routewriter's configuration: a TOML file read with the `config` crate, every key overridable
//! by an environment variable `MARGAY_<SECTION>__<KEY>` (e.g. `MARGAY_ROUTEWRITER__TABLE=254`),
//! as bgpd's. The file may be the node's shared file: routewriter reads `[node] name`,
//! `[routewriter]` and `[log]` and ignores bgpd's sections. Loading validates everything.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use daemon_common::config::{LogConfig, field};

/// Where bgpd serves its API (and the Dataplane stream) when the configuration says nothing.
pub use proto::client::DEFAULT_SOCKET;
/// Calico's route protocol for the routes it owns.
pub const DEFAULT_PROTOCOL: u8 = 80;
/// The main routing table.
pub const DEFAULT_TABLE: u32 = 254;
/// The kernel's longest interface name, without the terminating NUL.
pub const IFNAMSIZ_MAX: usize = 15;

pub use daemon_common::config::ConfigError;

/// The whole file as routewriter sees it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Config {
    pub node: NodeConfig,
    pub routewriter: RoutewriterConfig,
    pub log: LogConfig,
}

/// The part of `[node]` routewriter needs; bgpd's other keys there are ignored.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct NodeConfig {
    /// The node's name (the VTEP MAC is derived from it); the host name when empty.
    pub name: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RoutewriterConfig {
    /// bgpd's unix socket, which serves the Dataplane stream.
    pub socket: PathBuf,
    /// Route protocol that marks the routes routewriter owns (`ip route show proto 80`).
    pub protocol: u8,
    /// Routing table the routes go into (254 = main).
    pub table: u32,
    /// The interface that carries the node's address (VXLAN's underlay, same-subnet routes);
    /// empty: the interface that holds the local VTEP's underlay address (of each family).
    pub uplink: String,
    /// Name of the IPv4 VXLAN device.
    pub vxlan_device: String,
    /// Name of the IPv6 VXLAN device (Calico's `vxlan-v6.calico`).
    pub vxlan_device_v6: String,
    /// VXLAN UDP port when the stream gives none.
    pub vxlan_port: u16,
    /// VXLAN network identifier when the stream gives none.
    pub vni: u32,
    /// MTU of the IPv4 VXLAN device when the stream gives none; 0: the uplink's MTU − 50.
    pub vxlan_mtu: u32,
    /// MTU of the IPv6 VXLAN device when the stream gives none; 0: the uplink's MTU − 70
    /// (the IPv6 header is 20 bytes longer).
    pub vxlan_mtu_v6: u32,
    /// Name of the IPIP device routes of IPIP pools go through.
    pub ipip_device: String,
    /// Prefix of workload (pod) interfaces, whose sysctls routewriter keeps.
    pub workload_prefix: String,
    /// Seconds a new workload interface's routes are left alone before routes of ours that
    /// are not desired on it are deleted (the CNI plugin writes them before bgpd wants them).
    pub workload_grace_s: u64,
    /// Seconds between full resyncs (the safety net behind the netlink watch).
    pub resync_interval_s: u64,
    /// Where to serve Prometheus metrics (`/metrics`) and status (`/status`); none: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// Whether to program natOutgoing with nftables.
    pub nat: bool,
    /// The nftables tables (`ip` and, for IPv6 pools, `ip6`) of this name routewriter owns.
    pub nat_table: String,
    /// Whether to enforce network policy with nftables.
    pub policy: bool,
    /// The nftables table (`inet`) of this name routewriter owns for network policy.
    pub policy_table: String,
    /// The `nft` binary.
    pub nft: PathBuf,
    /// Whether to keep the forwarding and workload-interface sysctls.
    pub sysctls: bool,
    /// Longest wait between reconnects to bgpd, in milliseconds (backoff starts at 100 ms).
    pub reconnect_max_ms: u64,
    /// Longest wait between retries of a route the kernel refused, in seconds.
    pub retry_max_s: u64,
}

impl Default for RoutewriterConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(DEFAULT_SOCKET),
            protocol: DEFAULT_PROTOCOL,
            table: DEFAULT_TABLE,
            uplink: String::new(),
            vxlan_device: "vxlan.calico".into(),
            vxlan_device_v6: "vxlan-v6.calico".into(),
            vxlan_port: 4789,
            vni: 4096,
            vxlan_mtu: 0,
            vxlan_mtu_v6: 0,
            ipip_device: "tunl0".into(),
            workload_prefix: "cali".into(),
            workload_grace_s: 10,
            resync_interval_s: 90,
            metrics_listen: None,
            nat: true,
            nat_table: "margay".into(),
            policy: true,
            policy_table: "margay-policy".into(),
            nft: PathBuf::from("nft"),
            sysctls: true,
            reconnect_max_ms: 5_000,
            retry_max_s: 60,
        }
    }
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
        let mut config: Config = daemon_common::config::load_layers(path, env, &[])?;
        if config.node.name.is_empty() {
            // The same name bgpd registers the node under.
            config.node.name = daemon_common::config::hostname();
        }
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let rw = &self.routewriter;
        if self.node.name.is_empty() {
            return Err(field(
                "node.name",
                "must not be empty (set it or give the host a name): the VTEP MAC derives from it",
            ));
        }
        if rw.socket.as_os_str().is_empty() {
            return Err(field("routewriter.socket", "must name bgpd's unix socket"));
        }
        // 0-3 belong to the kernel and to `ip route` (boot): owning them would mean deleting
        // routes nobody gave us.
        if rw.protocol <= 3 {
            return Err(field(
                "routewriter.protocol",
                format!(
                    "{} is used by the kernel or by `ip route add` (boot); pick an exclusive one, e.g. 80",
                    rw.protocol
                ),
            ));
        }
        if rw.table == 0 || rw.table == 255 {
            return Err(field(
                "routewriter.table",
                "0 is not a table and 255 is the kernel's local table; use 254 (main) or your own",
            ));
        }
        validate_devices(rw)?;
        if rw.resync_interval_s == 0 {
            return Err(field("routewriter.resync_interval_s", "must be at least 1"));
        }
        if rw.reconnect_max_ms < 100 {
            return Err(field(
                "routewriter.reconnect_max_ms",
                "must be at least 100",
            ));
        }
        if rw.retry_max_s == 0 {
            return Err(field("routewriter.retry_max_s", "must be at least 1"));
        }
        let plain = |t: &str| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if rw.nat && !plain(&rw.nat_table) {
            return Err(field(
                "routewriter.nat_table",
                "must be a plain nftables name (letters, digits, '-', '_')",
            ));
        }
        if rw.policy && !plain(&rw.policy_table) {
            return Err(field(
                "routewriter.policy_table",
                "must be a plain nftables name (letters, digits, '-', '_')",
            ));
        }
        if rw.workload_prefix.is_empty() {
            return Err(field(
                "routewriter.workload_prefix",
                "must not be empty (it would match every interface)",
            ));
        }
        Ok(())
    }
}

/// The checks of the devices: every interface name (the VXLAN devices, the IPIP device, the
/// uplink), then the two VXLAN devices' names, VNI, port and MTUs.
fn validate_devices(rw: &RoutewriterConfig) -> Result<(), ConfigError> {
    for (name, value) in [
        ("routewriter.vxlan_device", &rw.vxlan_device),
        ("routewriter.vxlan_device_v6", &rw.vxlan_device_v6),
        ("routewriter.ipip_device", &rw.ipip_device),
        ("routewriter.uplink", &rw.uplink),
    ] {
        if value.len() > IFNAMSIZ_MAX || value.contains(['/', ' ']) {
            return Err(field(
                name,
                format!(
                    "{value:?} is not a valid interface name (at most 15 characters, no '/' or space)"
                ),
            ));
        }
    }
    if rw.vxlan_device.is_empty() {
        return Err(field("routewriter.vxlan_device", "must not be empty"));
    }
    if rw.vxlan_device_v6.is_empty() {
        return Err(field("routewriter.vxlan_device_v6", "must not be empty"));
    }
    if rw.vxlan_device_v6 == rw.vxlan_device {
        return Err(field(
            "routewriter.vxlan_device_v6",
            "must differ from routewriter.vxlan_device: each family has its own VXLAN device",
        ));
    }
    if rw.vni == 0 || rw.vni >= 1 << 24 {
        return Err(field("routewriter.vni", "must be between 1 and 16777215"));
    }
    if rw.vxlan_port == 0 {
        return Err(field("routewriter.vxlan_port", "must not be 0"));
    }
    if rw.vxlan_mtu != 0 && !(68..=65535).contains(&rw.vxlan_mtu) {
        return Err(field(
            "routewriter.vxlan_mtu",
            "must be 0 (derive) or 68-65535",
        ));
    }
    if rw.vxlan_mtu_v6 != 0 && !(1280..=65535).contains(&rw.vxlan_mtu_v6) {
        return Err(field(
            "routewriter.vxlan_mtu_v6",
            "must be 0 (derive) or 1280-65535 (IPv6 needs 1280 at least)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Option<config::Map<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn load_text(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rw.toml");
        std::fs::write(&path, text).unwrap();
        Config::load_with_env(Some(&path), env(vars))
    }

    #[test]
    fn defaults_are_calicos() {
        let c = load_text("[node]\nname = \"n1\"\n", &[]).unwrap();
        let rw = &c.routewriter;
        assert_eq!(rw.protocol, 80);
        assert_eq!(rw.table, 254);
        assert_eq!(rw.vxlan_device, "vxlan.calico");
        assert_eq!(rw.vxlan_device_v6, "vxlan-v6.calico");
        assert_eq!((rw.vxlan_mtu, rw.vxlan_mtu_v6), (0, 0));
        assert_eq!(rw.vni, 4096);
        assert_eq!(rw.vxlan_port, 4789);
        assert_eq!(rw.resync_interval_s, 90);
        assert_eq!(rw.socket, PathBuf::from(DEFAULT_SOCKET));
    }

    #[test]
    fn the_sample_node_file_loads() {
        let text = include_str!("../../configs/node.toml");
        let c = load_text(text, &[]).unwrap();
        assert_eq!(c.routewriter.uplink, "eth0");
        assert_eq!(
            c.routewriter.metrics_listen,
            Some("127.0.0.1:9099".parse().unwrap())
        );
        assert_eq!(c.routewriter.protocol, 80);
    }

    #[test]
    fn shares_the_node_file_with_bgpd() {
        let text = "[node]\nname = \"n1\"\naddress = \"10.0.0.5/24\"\n[api]\nsocket = \"/tmp/x.sock\"\n\
                    [datastore]\npath = \"/tmp/s.db\"\n[routewriter]\nsocket = \"/tmp/x.sock\"\ntable = 100\n\
                    uplink = \"eth0\"\nmetrics_listen = \"127.0.0.1:9099\"\n";
        let c = load_text(text, &[]).unwrap();
        assert_eq!(c.node.name, "n1");
        assert_eq!(c.routewriter.table, 100);
        assert_eq!(c.routewriter.uplink, "eth0");
        assert_eq!(
            c.routewriter.metrics_listen,
            Some("127.0.0.1:9099".parse().unwrap())
        );
    }

    #[test]
    fn environment_overrides_the_file() {
        let c = load_text(
            "[node]\nname = \"n1\"\n[routewriter]\nprotocol = 81\n",
            &[
                ("MARGAY_ROUTEWRITER__PROTOCOL", "90"),
                ("MARGAY_ROUTEWRITER__RESYNC_INTERVAL_S", "5"),
            ],
        )
        .unwrap();
        assert_eq!(c.routewriter.protocol, 90);
        assert_eq!(c.routewriter.resync_interval_s, 5);
    }

    #[test]
    fn refusals_name_the_field_and_the_fix() {
        for (text, field_name) in [
            ("[routewriter]\nprotocol = 3\n", "routewriter.protocol"),
            ("[routewriter]\ntable = 255\n", "routewriter.table"),
            (
                "[routewriter]\nvxlan_device = \"a-very-long-name-x\"\n",
                "routewriter.vxlan_device",
            ),
            ("[routewriter]\nvni = 0\n", "routewriter.vni"),
            (
                "[routewriter]\nresync_interval_s = 0\n",
                "routewriter.resync_interval_s",
            ),
            (
                "[routewriter]\nnat_table = \"a b\"\n",
                "routewriter.nat_table",
            ),
            ("[routewriter]\nvxlan_mtu = 10\n", "routewriter.vxlan_mtu"),
            (
                "[routewriter]\nvxlan_mtu_v6 = 1000\n",
                "routewriter.vxlan_mtu_v6",
            ),
            (
                "[routewriter]\nvxlan_device_v6 = \"vxlan.calico\"\n",
                "routewriter.vxlan_device_v6",
            ),
        ] {
            let err = load_text(&format!("[node]\nname = \"n\"\n{text}"), &[]).unwrap_err();
            assert!(err.to_string().contains(field_name), "{err}");
        }
        let err = load_text("[routewriter]\nbogus = 1\n", &[]).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let err =
            Config::load_with_env(Some(Path::new("/nonexistent/rw.toml")), env(&[])).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/rw.toml"), "{err}");
    }
}
