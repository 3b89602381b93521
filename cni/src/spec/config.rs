//! The network configuration on stdin: the spec's keys (`cniVersion`, `name`, `type`, `ipam`,
//! `dns`, `runtimeConfig`, `args`, `prevResult`, `cni.dev/valid-attachments`) and margay's own
//! (Calico's names where Calico has one). Parsing is pure: bytes in, a validated [`NetConf`] or
//! the CNI error the runtime should see out. Each refusal names the key.
//!
//! Why this file is long: the network configuration of the CNI spec and Calico's plugin keys, each
//! parsed and validated with a clear error, with the tests of each.
//!
//! Codes: not JSON or a key of the wrong JSON type: 6; `cniVersion` margay does not speak: 1;
//! a value that is invalid: 7; a feature margay knows and does not offer (`ipMasq: true`,
//! `device_type: netkit`): 2.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::env::is_valid_name;
use super::error::{CniError, code};
use super::result::{CniResult, Dns};
use super::version::{self, Version};

/// Where bgpd listens unless the configuration says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/margay/bgpd.sock";
/// The IPAM plugin served by this crate.
pub const IPAM_TYPE: &str = "margay-ipam";
/// The main plugin served by this crate.
pub const MAIN_TYPE: &str = "margay";

/// Encapsulation of the pools the pods use: it sets how much of the uplink MTU a pod may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encap {
    Vxlan,
    Ipip,
    None,
}

impl Encap {
    /// Bytes the encapsulation adds to every packet (outer IPv4 + UDP + VXLAN + inner
    /// Ethernet = 50; outer IPv4 = 20).
    pub fn overhead(self) -> u32 {
        match self {
            Encap::Vxlan => 50,
            Encap::Ipip => 20,
            Encap::None => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// The gateway `margay-ipam` reports with each address (`ipam.gateway`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gateway {
    /// Calico's fixed link-local gateways, 169.254.1.1 and fe80::ecee:eeff:feee:eeee: for main
    /// plugins that put the gateway on the host end of each pod's veth (margay, ptp), where it
    /// never collides with a pod's address.
    LinkLocal,
    /// The block's first address after its network address: for main plugins whose pods share
    /// a segment with the gateway on it (bridge with isGateway, macvlan, ipvlan), which needs
    /// an address inside the pods' subnet. Pods never get it.
    Block,
}

impl Gateway {
    pub fn name(self) -> &'static str {
        match self {
            Gateway::LinkLocal => "link-local",
            Gateway::Block => "block",
        }
    }
}

/// The `ipam` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpamConf {
    pub plugin_type: String,
    /// bgpd's socket for IPAM; falls back to the plugin's `socket`.
    pub socket: Option<PathBuf>,
    pub assign_ipv4: bool,
    pub assign_ipv6: bool,
    /// Pool names or CIDRs; empty means every pool the node may use.
    pub ipv4_pools: Vec<String>,
    pub ipv6_pools: Vec<String>,
    /// margay-ipam's `gateway`; None chooses by the main plugin ([`NetConf::ipam_gateway`]).
    pub gateway: Option<Gateway>,
}

impl Default for IpamConf {
    fn default() -> Self {
        IpamConf {
            plugin_type: IPAM_TYPE.into(),
            socket: None,
            assign_ipv4: true,
            assign_ipv6: false,
            ipv4_pools: Vec::new(),
            ipv6_pools: Vec::new(),
            gateway: None,
        }
    }
}

/// One still-valid attachment named in a GC request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

/// A validated network configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    /// `cniVersion` as written (results echo it).
    pub cni_version: String,
    pub version: Version,
    pub name: String,
    pub plugin_type: String,
    pub socket: PathBuf,
    /// The pod MTU; None derives it from the uplink and `encapsulation`.
    pub mtu: Option<u32>,
    pub encapsulation: Encap,
    /// The node name recorded with allocations (and asked of bgpd when set).
    pub nodename: Option<String>,
    pub log_level: LogLevel,
    pub log_file: Option<PathBuf>,
    pub allow_ip_forwarding: bool,
    /// Host-side interface names start with this (Calico's `cali`).
    pub interface_prefix: String,
    pub ipam: IpamConf,
    pub dns: Dns,
    /// Addresses the runtime asked for (`runtimeConfig.ips`, else `args.cni.ips`).
    pub requested_ips: Vec<IpAddr>,
    /// The pod's labels (`args.cni.labels`, the conventions' list of key/value pairs), which
    /// network policy selects on.
    pub labels: BTreeMap<String, String>,
    pub prev_result: Option<CniResult>,
    /// GC only: the attachments still in use.
    pub valid_attachments: Vec<Attachment>,
    /// How long one call to bgpd may take.
    pub bgpd_timeout: Duration,
    /// How long to keep retrying while bgpd is unreachable or its datastore is down.
    pub bgpd_retry: Duration,
}

impl NetConf {
    /// Reads just the version for an error object before the configuration is known to be
    /// valid: the configuration's when readable, else the newest.
    pub fn version_for_errors(stdin: &[u8]) -> String {
        serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
            .filter(|s| Version::parse(s).is_ok_and(Version::is_supported))
            .unwrap_or_else(|| Version::LATEST.to_string())
    }

    #[expect(
        clippy::too_many_lines,
        reason = "reads every NetConf key in turn, each with its own refusal and CNI error code; one configuration key after another"
    )]
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                code::DECODE,
                format!("the network configuration on stdin is not JSON: {e}"),
            )
        })?;
        let Value::Object(obj) = value else {
            return Err(CniError::new(
                code::DECODE,
                "the network configuration on stdin is not a JSON object",
            ));
        };

        // A configuration without cniVersion predates versioning: 0.1.0, as libcni reads it.
        let cni_version: String = field(&obj, "cniVersion")?.unwrap_or_else(|| "0.1.0".into());
        let version = Version::parse(&cni_version)
            .map_err(|e| CniError::new(code::DECODE, format!("cniVersion: {e}")))?;
        if !version.is_supported() {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "incompatible CNI version: the configuration has cniVersion {cni_version:?}, margay supports {}",
                    version::supported_strings().join(", ")
                ),
            ));
        }

        let name: String = field(&obj, "name")?.unwrap_or_default();
        if name.is_empty() {
            return Err(invalid("name", "is missing: every network has a name"));
        }
        if !is_valid_name(&name) {
            return Err(invalid(
                "name",
                format!(
                    "{name:?} must start with a letter or digit, then letters, digits, '_', '.' or '-'"
                ),
            ));
        }
        let plugin_type: String = field(&obj, "type")?.unwrap_or_default();
        if plugin_type.is_empty() {
            return Err(invalid("type", "is missing"));
        }

        if field::<bool>(&obj, "ipMasq")?.unwrap_or(false) {
            return Err(CniError::new(
                code::UNSUPPORTED_FIELD,
                "unsupported field ipMasq=true: margay does not masquerade per network; set natOutgoing on the IP pool",
            ));
        }
        if let Some(dt) = field::<String>(&obj, "device_type")?
            && dt != "veth"
        {
            return Err(CniError::new(
                code::UNSUPPORTED_FIELD,
                format!("unsupported field device_type={dt:?}: margay creates veth pairs only"),
            ));
        }

        let socket = path_field(&obj, "socket")?.unwrap_or_else(|| DEFAULT_SOCKET.into());
        let mtu = match field::<u32>(&obj, "mtu")? {
            None | Some(0) => None,
            Some(m) if !(68..=65535).contains(&m) => {
                return Err(invalid(
                    "mtu",
                    format!("{m} is outside 68..65535 (0 derives it)"),
                ));
            }
            Some(m) => Some(m),
        };
        let encapsulation = match field::<String>(&obj, "encapsulation")?.as_deref() {
            None | Some("vxlan") => Encap::Vxlan,
            Some("ipip") => Encap::Ipip,
            Some("none") => Encap::None,
            Some(other) => {
                return Err(invalid(
                    "encapsulation",
                    format!("{other:?} is not one of vxlan, ipip, none"),
                ));
            }
        };
        let nodename = field::<String>(&obj, "nodename")?.filter(|n| !n.is_empty());
        let log_level = match field::<String>(&obj, "log_level")?
            .map(|s| s.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("info") => LogLevel::Info,
            Some("error") => LogLevel::Error,
            Some("warn" | "warning") => LogLevel::Warn,
            Some("debug") => LogLevel::Debug,
            Some("trace") => LogLevel::Trace,
            Some(other) => {
                return Err(invalid(
                    "log_level",
                    format!("{other:?} is not one of error, warn, info, debug, trace"),
                ));
            }
        };
        let log_file = path_field(&obj, "log_file_path")?;
        let allow_ip_forwarding = match obj.get("container_settings") {
            None | Some(Value::Null) => false,
            Some(Value::Object(cs)) => field::<bool>(cs, "allow_ip_forwarding")
                .map_err(|e| prefixed(e, "container_settings."))?
                .unwrap_or(false),
            Some(_) => return Err(wrong_type("container_settings", "an object")),
        };
        let interface_prefix: String =
            field(&obj, "interface_prefix")?.unwrap_or_else(|| "cali".into());
        if interface_prefix.is_empty()
            || interface_prefix.len() > 11
            || super::env::validate_ifname(&interface_prefix).is_err()
        {
            return Err(invalid(
                "interface_prefix",
                format!(
                    "{interface_prefix:?} must be 1 to 11 characters valid in an interface name"
                ),
            ));
        }

        let ipam = match obj.get("ipam") {
            None | Some(Value::Null) => IpamConf::default(),
            Some(Value::Object(m)) => parse_ipam(m)?,
            Some(_) => return Err(wrong_type("ipam", "an object")),
        };
        if plugin_type == MAIN_TYPE && ipam.gateway == Some(Gateway::Block) {
            return Err(invalid(
                "ipam.gateway",
                "\"block\" is for main plugins whose pods share a segment: margay routes every pod through 169.254.1.1 and fe80::ecee:eeff:feee:eeee",
            ));
        }
        let dns: Dns = field(&obj, "dns")?.unwrap_or_default();

        let mut requested_ips = Vec::new();
        let runtime_ips = obj
            .get("runtimeConfig")
            .and_then(|rc| rc.get("ips"))
            .filter(|v| !v.is_null());
        let args_ips = obj
            .get("args")
            .and_then(|a| a.get("cni"))
            .and_then(|c| c.get("ips"))
            .filter(|v| !v.is_null());
        if let Some((key, list)) = runtime_ips
            .map(|v| ("runtimeConfig.ips", v))
            .or(args_ips.map(|v| ("args.cni.ips", v)))
        {
            let list: Vec<String> = serde_json::from_value(list.clone())
                .map_err(|_| wrong_type(key, "a list of strings"))?;
            for text in list {
                requested_ips.push(parse_requested_ip(&text).map_err(|e| invalid(key, e))?);
            }
        }

        let mut labels = BTreeMap::new();
        if let Some(list) = obj
            .get("args")
            .and_then(|a| a.get("cni"))
            .and_then(|c| c.get("labels"))
            .filter(|v| !v.is_null())
        {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Label {
                key: String,
                value: String,
            }
            let list: Vec<Label> = serde_json::from_value(list.clone()).map_err(|_| {
                wrong_type(
                    "args.cni.labels",
                    "a list of {\"key\": ..., \"value\": ...}",
                )
            })?;
            for l in list {
                if l.key.is_empty() {
                    return Err(invalid("args.cni.labels", "has a label with an empty key"));
                }
                labels.insert(l.key, l.value);
            }
        }

        let prev_result = match obj.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v) => Some(CniResult::from_json(v, "prevResult")?),
        };

        // libcni writes the list under both names (the spec's name changed once).
        let attachments = obj
            .get("cni.dev/valid-attachments")
            .or_else(|| obj.get("cni.dev/attachments"))
            .filter(|v| !v.is_null());
        let mut valid_attachments = Vec::new();
        if let Some(list) = attachments {
            let Value::Array(items) = list else {
                return Err(wrong_type("cni.dev/valid-attachments", "a list"));
            };
            for item in items {
                let id = item.get("containerID").and_then(Value::as_str);
                let ifname = item.get("ifname").and_then(Value::as_str).unwrap_or("");
                let Some(id) = id else {
                    return Err(invalid(
                        "cni.dev/valid-attachments",
                        format!("{item} has no containerID"),
                    ));
                };
                valid_attachments.push(Attachment {
                    container_id: id.to_owned(),
                    ifname: ifname.to_owned(),
                });
            }
        }

        let bgpd_timeout = seconds(&obj, "bgpd_timeout_seconds", 30.0)?;
        let bgpd_retry = seconds(&obj, "bgpd_retry_seconds", 5.0)?;

        Ok(NetConf {
            cni_version,
            version,
            name,
            plugin_type,
            socket,
            mtu,
            encapsulation,
            nodename,
            log_level,
            log_file,
            allow_ip_forwarding,
            interface_prefix,
            ipam,
            dns,
            requested_ips,
            labels,
            prev_result,
            valid_attachments,
            bgpd_timeout,
            bgpd_retry,
        })
    }

    /// The socket the IPAM side talks to.
    pub fn ipam_socket(&self) -> &std::path::Path {
        self.ipam.socket.as_deref().unwrap_or(&self.socket)
    }

    /// Whether IPAM is margay's own (served in-process by the main plugin).
    pub fn ipam_is_ours(&self) -> bool {
        self.ipam.plugin_type == IPAM_TYPE
    }

    /// The gateway margay-ipam reports: `ipam.gateway` when set, else link-local under the
    /// main plugins that put it on each pod's veth (margay, ptp) and the block's first address
    /// under every other (bridge and the like need it inside the pods' subnet).
    pub fn ipam_gateway(&self) -> Gateway {
        self.ipam
            .gateway
            .unwrap_or(match self.plugin_type.as_str() {
                MAIN_TYPE | "ptp" => Gateway::LinkLocal,
                _ => Gateway::Block,
            })
    }

    /// The IPAM handle of one container: `<network>.<container id>`, as Calico names it.
    pub fn handle(&self, container_id: &str) -> String {
        format!("{}.{}", self.name, container_id)
    }

    /// The prefix every handle of this network starts with (for GC).
    pub fn handle_prefix(&self) -> String {
        format!("{}.", self.name)
    }
}

fn parse_ipam(m: &Map<String, Value>) -> Result<IpamConf, CniError> {
    let p = |e| prefixed(e, "ipam.");
    let plugin_type: String = field(m, "type").map_err(p)?.unwrap_or_default();
    if plugin_type.is_empty() {
        return Err(invalid("ipam.type", "is missing"));
    }
    if plugin_type.contains('/') {
        return Err(invalid(
            "ipam.type",
            format!("{plugin_type:?} must be a file name, not a path"),
        ));
    }
    let assign_ipv4 = flag(m, "assign_ipv4", true).map_err(p)?;
    let assign_ipv6 = flag(m, "assign_ipv6", false).map_err(p)?;
    if plugin_type == IPAM_TYPE && !assign_ipv4 && !assign_ipv6 {
        return Err(invalid(
            "ipam",
            "assign_ipv4 and assign_ipv6 are both false: the pod would get no address",
        ));
    }
    // Another IPAM plugin's `gateway` is its own business (host-local's is an address).
    let gateway = if plugin_type == IPAM_TYPE {
        match field::<String>(m, "gateway").map_err(p)?.as_deref() {
            None => None,
            Some("link-local") => Some(Gateway::LinkLocal),
            Some("block") => Some(Gateway::Block),
            Some(other) => {
                return Err(invalid(
                    "ipam.gateway",
                    format!(
                        "{other:?} is not one of \"link-local\" (169.254.1.1 and fe80::ecee:eeff:feee:eeee) or \"block\" (the block's first address)"
                    ),
                ));
            }
        }
    } else {
        None
    };
    Ok(IpamConf {
        plugin_type,
        gateway,
        socket: path_field(m, "socket").map_err(p)?,
        assign_ipv4,
        assign_ipv6,
        ipv4_pools: field(m, "ipv4_pools").map_err(p)?.unwrap_or_default(),
        ipv6_pools: field(m, "ipv6_pools").map_err(p)?.unwrap_or_default(),
    })
}

/// An address the runtime asked for: "10.0.0.5" or "10.0.0.5/24" (the prefix is ignored: a
/// pod gets a host address).
pub fn parse_requested_ip(text: &str) -> Result<IpAddr, String> {
    let addr = text.split_once('/').map_or(text, |(a, _)| a);
    addr.trim()
        .parse()
        .map_err(|_| format!("{text:?} is not an IP address"))
}

/// A key of type T, None when absent or null; a wrong type is a decode error naming the key.
fn field<T: DeserializeOwned>(obj: &Map<String, Value>, key: &str) -> Result<Option<T>, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| {
            CniError::new(
                code::DECODE,
                format!("network configuration key {key}: {e}"),
            )
        }),
    }
}

fn path_field(obj: &Map<String, Value>, key: &str) -> Result<Option<PathBuf>, CniError> {
    Ok(field::<String>(obj, key)?
        .filter(|s| !s.is_empty())
        .map(PathBuf::from))
}

/// Calico writes booleans as strings ("true"); both are accepted.
fn flag(obj: &Map<String, Value>, key: &str, default: bool) -> Result<bool, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(CniError::new(
            code::DECODE,
            format!("network configuration key {key}: {other} is not true or false"),
        )),
    }
}

fn seconds(obj: &Map<String, Value>, key: &str, default: f64) -> Result<Duration, CniError> {
    let s = field::<f64>(obj, key)?.unwrap_or(default);
    if !(s.is_finite() && s > 0.0 && s <= 3600.0) {
        return Err(invalid(
            key,
            format!("{s} is not a number of seconds in (0, 3600]"),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

fn invalid(key: &str, why: impl std::fmt::Display) -> CniError {
    CniError::new(
        code::INVALID_CONFIG,
        format!("invalid network configuration: {key} {why}"),
    )
}

fn wrong_type(key: &str, expected: &str) -> CniError {
    CniError::new(
        code::DECODE,
        format!("network configuration key {key}: expected {expected}"),
    )
}

/// Names a nested key in full ("ipam.assign_ipv4").
fn prefixed(mut e: CniError, prefix: &str) -> CniError {
    e.msg = e.msg.replacen("key ", &format!("key {prefix}"), 1);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<NetConf, CniError> {
        NetConf::parse(v.to_string().as_bytes())
    }

    fn base() -> Value {
        json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "margay"})
    }

    fn with(key: &str, value: Value) -> Value {
        let mut v = base();
        v[key] = value;
        v
    }

    fn code_of(v: Value) -> u32 {
        parse(v).unwrap_err().code
    }

    #[test]
    fn defaults() {
        let c = parse(base()).unwrap();
        assert_eq!(c.version, Version::V1_0_0);
        assert_eq!(c.cni_version, "1.0.0");
        assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(c.ipam_socket(), std::path::Path::new(DEFAULT_SOCKET));
        assert_eq!(c.mtu, None);
        assert_eq!(c.encapsulation, Encap::Vxlan);
        assert_eq!(c.log_level, LogLevel::Info);
        assert_eq!(c.interface_prefix, "cali");
        assert!(c.ipam_is_ours());
        assert!(c.ipam.assign_ipv4 && !c.ipam.assign_ipv6);
        assert!(!c.allow_ip_forwarding);
        assert!(c.prev_result.is_none());
        assert_eq!(c.handle("abc"), "k8s-pod-network.abc");
        assert_eq!(c.handle_prefix(), "k8s-pod-network.");
        assert_eq!(c.bgpd_timeout, Duration::from_secs(30));
        assert_eq!(c.bgpd_retry, Duration::from_secs(5));
    }

    #[test]
    fn a_full_configuration() {
        let c = parse(json!({
            "cniVersion": "1.1.0", "name": "net", "type": "margay",
            "socket": "/tmp/bgpd.sock", "mtu": 1400, "encapsulation": "ipip",
            "nodename": "node-a", "log_level": "DEBUG", "log_file_path": "/var/log/m.log",
            "container_settings": {"allow_ip_forwarding": true},
            "interface_prefix": "mgy",
            "ipam": {"type": "margay-ipam", "socket": "/tmp/ipam.sock", "assign_ipv4": "true",
                     "assign_ipv6": "true", "ipv4_pools": ["p4"], "ipv6_pools": ["fd00::/48"]},
            "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]},
            "runtimeConfig": {"ips": ["10.0.0.5/24", "fd00::5"]},
            "bgpd_timeout_seconds": 2, "bgpd_retry_seconds": 0.5,
            "unknownKeysAreIgnored": {"x": 1}
        }))
        .unwrap();
        assert_eq!(c.mtu, Some(1400));
        assert_eq!(c.encapsulation, Encap::Ipip);
        assert_eq!(c.nodename.as_deref(), Some("node-a"));
        assert_eq!(c.log_level, LogLevel::Debug);
        assert!(c.allow_ip_forwarding);
        assert_eq!(c.interface_prefix, "mgy");
        assert_eq!(c.ipam_socket(), std::path::Path::new("/tmp/ipam.sock"));
        assert!(c.ipam.assign_ipv6);
        assert_eq!(c.ipam.ipv6_pools, ["fd00::/48"]);
        assert_eq!(c.dns.search, ["svc.cluster.local"]);
        assert_eq!(
            c.requested_ips,
            [
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert_eq!(c.bgpd_retry, Duration::from_millis(500));
    }

    #[test]
    fn versions() {
        for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
            assert_eq!(parse(with("cniVersion", json!(v))).unwrap().cni_version, v);
        }
        for v in ["0.1.0", "0.2.0", "1.2.0", "2.0.0", "0.4.1"] {
            let e = parse(with("cniVersion", json!(v))).unwrap_err();
            assert_eq!(e.code, code::INCOMPATIBLE_VERSION, "{v}");
            assert!(e.msg.contains(v) && e.msg.contains("1.1.0"), "{}", e.msg);
        }
        // Missing means 0.1.0, which margay does not speak.
        let mut v = base();
        v.as_object_mut().unwrap().remove("cniVersion");
        let e = parse(v).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.msg.contains("0.1.0"));
        assert_eq!(code_of(with("cniVersion", json!("one"))), code::DECODE);
        assert_eq!(code_of(with("cniVersion", json!(1))), code::DECODE);
    }

    #[test]
    fn not_json_or_not_an_object() {
        for bad in ["", "{", "nope", "{\"name\": }", "\u{0}"] {
            assert_eq!(
                NetConf::parse(bad.as_bytes()).unwrap_err().code,
                code::DECODE,
                "{bad:?}"
            );
        }
        for bad in ["[]", "1", "\"x\"", "null"] {
            assert_eq!(
                NetConf::parse(bad.as_bytes()).unwrap_err().code,
                code::DECODE,
                "{bad}"
            );
        }
    }

    #[test]
    fn names_and_types() {
        assert_eq!(code_of(with("name", json!(""))), code::INVALID_CONFIG);
        assert_eq!(code_of(with("name", json!("-x"))), code::INVALID_CONFIG);
        assert_eq!(code_of(with("name", json!("a b"))), code::INVALID_CONFIG);
        assert_eq!(code_of(with("name", json!(7))), code::DECODE);
        let mut v = base();
        v.as_object_mut().unwrap().remove("name");
        assert_eq!(code_of(v), code::INVALID_CONFIG);
        let mut v = base();
        v.as_object_mut().unwrap().remove("type");
        assert_eq!(code_of(v), code::INVALID_CONFIG);
    }

    #[test]
    fn invalid_values_name_their_key() {
        let cases = [
            ("mtu", json!(20), code::INVALID_CONFIG),
            ("mtu", json!(70000), code::INVALID_CONFIG),
            ("mtu", json!(-1), code::DECODE),
            ("mtu", json!("1500"), code::DECODE),
            ("encapsulation", json!("gre"), code::INVALID_CONFIG),
            ("log_level", json!("loud"), code::INVALID_CONFIG),
            ("interface_prefix", json!(""), code::INVALID_CONFIG),
            (
                "interface_prefix",
                json!("averylongprefix"),
                code::INVALID_CONFIG,
            ),
            ("interface_prefix", json!("a/b"), code::INVALID_CONFIG),
            ("container_settings", json!(true), code::DECODE),
            ("ipam", json!("margay-ipam"), code::DECODE),
            ("dns", json!({"nameservers": "x"}), code::DECODE),
            ("bgpd_timeout_seconds", json!(0), code::INVALID_CONFIG),
            ("bgpd_retry_seconds", json!(-1), code::INVALID_CONFIG),
            ("cni.dev/valid-attachments", json!({}), code::DECODE),
            (
                "cni.dev/valid-attachments",
                json!([{"ifname": "eth0"}]),
                code::INVALID_CONFIG,
            ),
        ];
        for (key, value, want) in cases {
            let e = parse(with(key, value.clone())).unwrap_err();
            assert_eq!(e.code, want, "{key}={value}: {e}");
            assert!(e.msg.contains(key), "{key}={value}: {}", e.msg);
        }
        let e = parse(with(
            "container_settings",
            json!({"allow_ip_forwarding": "yes"}),
        ))
        .unwrap_err();
        assert!(
            e.msg.contains("container_settings.allow_ip_forwarding"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn unsupported_fields_are_code_2_with_key_and_value() {
        let e = parse(with("ipMasq", json!(true))).unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        assert!(e.msg.contains("ipMasq=true"), "{}", e.msg);
        assert!(parse(with("ipMasq", json!(false))).is_ok());
        let e = parse(with("device_type", json!("netkit"))).unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        assert!(e.msg.contains("device_type=\"netkit\""), "{}", e.msg);
        assert!(parse(with("device_type", json!("veth"))).is_ok());
    }

    #[test]
    fn ipam_section() {
        let e = parse(with("ipam", json!({}))).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("ipam.type"));
        assert_eq!(
            code_of(with("ipam", json!({"type": "../evil"}))),
            code::INVALID_CONFIG
        );
        let e = parse(with(
            "ipam",
            json!({"type": "margay-ipam", "assign_ipv4": false}),
        ))
        .unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        let e = parse(with(
            "ipam",
            json!({"type": "margay-ipam", "assign_ipv6": 1}),
        ))
        .unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("ipam.assign_ipv6"), "{}", e.msg);
        let e = parse(with(
            "ipam",
            json!({"type": "margay-ipam", "ipv4_pools": "p"}),
        ))
        .unwrap_err();
        assert!(e.msg.contains("ipam.ipv4_pools"), "{}", e.msg);
        let c = parse(with(
            "ipam",
            json!({"type": "host-local", "subnet": "10.1.0.0/16"}),
        ))
        .unwrap();
        assert!(!c.ipam_is_ours());
        let c = parse(with(
            "ipam",
            json!({"type": "margay-ipam", "assign_ipv4": "false", "assign_ipv6": "TRUE"}),
        ))
        .unwrap();
        assert!(!c.ipam.assign_ipv4 && c.ipam.assign_ipv6);
    }

    #[test]
    fn ipam_gateway_follows_the_main_plugin_unless_set() {
        let of = |main: &str, ipam: Value| {
            let mut v = base();
            v["type"] = json!(main);
            v["ipam"] = ipam;
            parse(v).map(|c| c.ipam_gateway())
        };
        let plain = json!({"type": "margay-ipam"});
        assert_eq!(of("margay", plain.clone()), Ok(Gateway::LinkLocal));
        assert_eq!(of("ptp", plain.clone()), Ok(Gateway::LinkLocal));
        assert_eq!(of("bridge", plain.clone()), Ok(Gateway::Block));
        assert_eq!(of("macvlan", plain), Ok(Gateway::Block));
        let set = |g: &str| json!({"type": "margay-ipam", "gateway": g});
        assert_eq!(of("ptp", set("block")), Ok(Gateway::Block));
        assert_eq!(of("bridge", set("link-local")), Ok(Gateway::LinkLocal));
        // margay's pods route through the link-local gateways, always.
        let e = of("margay", set("block")).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("ipam.gateway"), "{}", e.msg);
        let e = of("bridge", set("10.0.0.1")).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("\"10.0.0.1\""), "{}", e.msg);
        assert_eq!(
            of("bridge", json!({"type": "margay-ipam", "gateway": 1}))
                .unwrap_err()
                .code,
            code::DECODE
        );
        // host-local's gateway is an address, and none of ours.
        let hl = json!({"type": "host-local", "subnet": "10.1.0.0/16", "gateway": "10.1.0.1"});
        assert!(of("bridge", hl).is_ok());
    }

    #[test]
    fn requested_addresses() {
        let c = parse(with("args", json!({"cni": {"ips": ["10.1.2.3"]}}))).unwrap();
        assert_eq!(c.requested_ips, ["10.1.2.3".parse::<IpAddr>().unwrap()]);
        // runtimeConfig wins over args.
        let mut v = with("args", json!({"cni": {"ips": ["10.1.2.3"]}}));
        v["runtimeConfig"] = json!({"ips": ["10.9.9.9/32"]});
        assert_eq!(
            parse(v).unwrap().requested_ips,
            ["10.9.9.9".parse::<IpAddr>().unwrap()]
        );
        let e = parse(with("runtimeConfig", json!({"ips": ["nope"]}))).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("runtimeConfig.ips"));
        let e = parse(with("runtimeConfig", json!({"ips": "10.0.0.1"}))).unwrap_err();
        assert_eq!(e.code, code::DECODE);
        // Other runtimeConfig keys (portMappings for portmap) are not margay's business.
        assert!(parse(with("runtimeConfig", json!({"portMappings": []}))).is_ok());
        assert_eq!(
            parse_requested_ip(" 10.0.0.1 ").unwrap().to_string(),
            "10.0.0.1"
        );
    }

    #[test]
    fn prev_result_and_attachments() {
        let mut v = base();
        v["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.5/32"}]});
        v["cni.dev/valid-attachments"] =
            json!([{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "net1"}]);
        let c = parse(v).unwrap();
        assert_eq!(c.prev_result.unwrap().ips.len(), 1);
        assert_eq!(c.valid_attachments.len(), 2);
        assert_eq!(c.valid_attachments[1].container_id, "b");
        // The older name is read too.
        let c = parse(with("cni.dev/attachments", json!([{"containerID": "z"}]))).unwrap();
        assert_eq!(c.valid_attachments[0].container_id, "z");
        // A broken prevResult is a decode error naming it.
        let e = parse(with("prevResult", json!({"ips": [{"address": "x"}]}))).unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("prevResult"));
    }

    #[test]
    fn version_for_errors() {
        assert_eq!(
            NetConf::version_for_errors(b"{\"cniVersion\": \"0.4.0\"}"),
            "0.4.0"
        );
        assert_eq!(
            NetConf::version_for_errors(b"{\"cniVersion\": \"9.9.9\"}"),
            "1.1.0"
        );
        assert_eq!(NetConf::version_for_errors(b"garbage"), "1.1.0");
        assert_eq!(NetConf::version_for_errors(b""), "1.1.0");
    }
}
