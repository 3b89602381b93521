//! The ADD result: one model that holds everything 1.1.0 can say, read from any version margay
//! speaks (a `prevResult`, a delegate's answer) and written in the version the caller asked for.
//! Fields a version lacks are dropped when writing it; 0.3.x/0.4.0 IPs get their `version` tag.
//! Unknown fields in what is read are ignored.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::{CniError, code};
use super::version::Version;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub mtu: Option<u32>,
    /// The network namespace path for container interfaces; empty on the host.
    #[serde(default)]
    pub sandbox: String,
    #[serde(default)]
    pub socket_path: String,
    #[serde(default, rename = "pciID")]
    pub pci_id: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct IpConfig {
    pub address: IpNet,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`; IPAM results have none.
    #[serde(default)]
    pub interface: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default)]
    pub gw: Option<IpAddr>,
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub advmss: Option<u32>,
    #[serde(default)]
    pub priority: Option<u32>,
    #[serde(default)]
    pub table: Option<u32>,
    #[serde(default)]
    pub scope: Option<u32>,
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Dns {
    #[serde(default)]
    pub nameservers: Vec<String>,
    #[serde(default)]
    pub domain: String,
    #[serde(default)]
    pub search: Vec<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.nameservers.is_empty() {
            m.insert("nameservers".into(), json!(self.nameservers));
        }
        if !self.domain.is_empty() {
            m.insert("domain".into(), json!(self.domain));
        }
        if !self.search.is_empty() {
            m.insert("search".into(), json!(self.search));
        }
        if !self.options.is_empty() {
            m.insert("options".into(), json!(self.options));
        }
        Value::Object(m)
    }
}

/// What any supported version's result looks like on the wire (a superset).
#[derive(Deserialize)]
struct WireResult {
    #[serde(default)]
    interfaces: Vec<Interface>,
    #[serde(default)]
    ips: Vec<IpConfig>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Option<Dns>,
}

impl CniResult {
    /// Reads a result (prevResult, or a delegated plugin's output). `what` names it in errors.
    pub fn from_json(v: &Value, what: &str) -> Result<CniResult, CniError> {
        if !v.is_object() {
            return Err(CniError::new(
                code::DECODE,
                format!("{what} is not a JSON object"),
            ));
        }
        if v.get("ip4").is_some() || v.get("ip6").is_some() {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("{what} is a CNI 0.1/0.2 result (ip4/ip6); margay reads 0.3.0 and later"),
            ));
        }
        let w: WireResult = serde_json::from_value(v.clone())
            .map_err(|e| CniError::new(code::DECODE, format!("{what} cannot be read: {e}")))?;
        let r = CniResult {
            interfaces: w.interfaces,
            ips: w.ips,
            routes: w.routes,
            dns: w.dns.unwrap_or_default(),
        };
        for (i, ip) in r.ips.iter().enumerate() {
            if let Some(idx) = ip.interface
                && idx >= r.interfaces.len()
            {
                return Err(CniError::new(
                    code::DECODE,
                    format!(
                        "{what}: ips[{i}] names interface {idx}, but there are {} interfaces",
                        r.interfaces.len()
                    ),
                ));
            }
        }
        Ok(r)
    }

    /// The result as `version` writes it.
    pub fn to_json(&self, version: Version, version_text: &str) -> Value {
        let mut m = Map::new();
        m.insert("cniVersion".into(), json!(version_text));
        if !self.interfaces.is_empty() {
            let list: Vec<Value> = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut o = Map::new();
                    o.insert("name".into(), json!(i.name));
                    if !i.mac.is_empty() {
                        o.insert("mac".into(), json!(i.mac));
                    }
                    if version.has_1_1_fields() {
                        if let Some(mtu) = i.mtu {
                            o.insert("mtu".into(), json!(mtu));
                        }
                        if !i.socket_path.is_empty() {
                            o.insert("socketPath".into(), json!(i.socket_path));
                        }
                        if !i.pci_id.is_empty() {
                            o.insert("pciID".into(), json!(i.pci_id));
                        }
                    }
                    if !i.sandbox.is_empty() {
                        o.insert("sandbox".into(), json!(i.sandbox));
                    }
                    Value::Object(o)
                })
                .collect();
            m.insert("interfaces".into(), Value::Array(list));
        }
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut o = Map::new();
                if version.ips_carry_version() {
                    let v = if ip.address.addr().is_ipv4() {
                        "4"
                    } else {
                        "6"
                    };
                    o.insert("version".into(), json!(v));
                }
                o.insert("address".into(), json!(ip.address.to_string()));
                if let Some(gw) = ip.gateway {
                    o.insert("gateway".into(), json!(gw.to_string()));
                }
                if let Some(idx) = ip.interface {
                    o.insert("interface".into(), json!(idx));
                }
                Value::Object(o)
            })
            .collect();
        m.insert("ips".into(), Value::Array(ips));
        if !self.routes.is_empty() {
            let routes: Vec<Value> = self
                .routes
                .iter()
                .map(|r| {
                    let mut o = Map::new();
                    o.insert("dst".into(), json!(r.dst.to_string()));
                    if let Some(gw) = r.gw {
                        o.insert("gw".into(), json!(gw.to_string()));
                    }
                    if version.has_1_1_fields() {
                        for (k, v) in [
                            ("mtu", r.mtu),
                            ("advmss", r.advmss),
                            ("priority", r.priority),
                            ("table", r.table),
                            ("scope", r.scope),
                        ] {
                            if let Some(v) = v {
                                o.insert(k.into(), json!(v));
                            }
                        }
                    }
                    Value::Object(o)
                })
                .collect();
            m.insert("routes".into(), Value::Array(routes));
        }
        if !self.dns.is_empty() {
            m.insert("dns".into(), self.dns.to_json());
        }
        Value::Object(m)
    }

    /// Appends `other` after `self` (a main plugin's result after a prevResult it was given):
    /// interfaces are concatenated and `other`'s interface indexes shifted to match.
    pub fn append(&mut self, other: CniResult) {
        let shift = self.interfaces.len();
        self.interfaces.extend(other.interfaces);
        self.ips.extend(other.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + shift);
            ip
        }));
        self.routes.extend(other.routes);
        if self.dns.is_empty() {
            self.dns = other.dns;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "cali0123456789a".into(),
                    mac: "ee:ee:ee:ee:ee:ee".into(),
                    mtu: Some(1450),
                    ..Default::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:01".into(),
                    mtu: Some(1450),
                    sandbox: "/run/netns/pod".into(),
                    ..Default::default()
                },
            ],
            ips: vec![
                IpConfig {
                    address: "172.20.0.5/32".parse().unwrap(),
                    gateway: Some("169.254.1.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::5/128".parse().unwrap(),
                    gateway: None,
                    interface: Some(1),
                },
            ],
            routes: vec![Route {
                scope: Some(0),
                ..Route::new(
                    "0.0.0.0/0".parse().unwrap(),
                    Some("169.254.1.1".parse().unwrap()),
                )
            }],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                ..Default::default()
            },
        }
    }

    #[test]
    fn writes_each_versions_layout() {
        let r = sample();
        let v11 = r.to_json(Version::V1_1_0, "1.1.0");
        assert_eq!(v11["cniVersion"], "1.1.0");
        assert_eq!(v11["interfaces"][0]["mtu"], 1450);
        assert_eq!(v11["interfaces"][1]["sandbox"], "/run/netns/pod");
        assert!(v11["interfaces"][0].get("sandbox").is_none());
        assert!(v11["ips"][0].get("version").is_none());
        assert_eq!(v11["routes"][0]["scope"], 0);
        assert_eq!(v11["dns"]["nameservers"][0], "10.96.0.10");

        let v10 = r.to_json(Version::V1_0_0, "1.0.0");
        assert!(v10["interfaces"][0].get("mtu").is_none());
        assert!(v10["routes"][0].get("scope").is_none());
        assert!(v10["ips"][0].get("version").is_none());
        assert_eq!(v10["ips"][0]["gateway"], "169.254.1.1");
        assert!(v10["ips"][1].get("gateway").is_none());

        for (v, text) in [
            (Version::V0_4_0, "0.4.0"),
            (Version::V0_3_1, "0.3.1"),
            (Version::V0_3_0, "0.3.0"),
        ] {
            let old = r.to_json(v, text);
            assert_eq!(old["cniVersion"], text);
            assert_eq!(old["ips"][0]["version"], "4");
            assert_eq!(old["ips"][1]["version"], "6");
            assert_eq!(old["ips"][1]["interface"], 1);
            assert!(old["interfaces"][0].get("mtu").is_none());
        }
    }

    #[test]
    fn round_trips_through_every_version() {
        let r = sample();
        for (v, text) in [
            (Version::V1_1_0, "1.1.0"),
            (Version::V1_0_0, "1.0.0"),
            (Version::V0_4_0, "0.4.0"),
        ] {
            let back = CniResult::from_json(&r.to_json(v, text), "test").unwrap();
            assert_eq!(back.ips, r.ips, "{text}");
            assert_eq!(back.interfaces.len(), 2);
            assert_eq!(back.interfaces[1].sandbox, "/run/netns/pod");
            assert_eq!(back.dns, r.dns);
            if v.has_1_1_fields() {
                assert_eq!(back, r);
            } else {
                assert_eq!(back.interfaces[0].mtu, None);
                assert_eq!(back.routes[0].scope, None);
            }
        }
    }

    #[test]
    fn ipam_results_have_no_interfaces() {
        let r = CniResult {
            ips: vec![IpConfig {
                address: "172.20.0.5/26".parse().unwrap(),
                gateway: None,
                interface: None,
            }],
            ..Default::default()
        };
        let v = r.to_json(Version::V1_0_0, "1.0.0");
        assert_eq!(
            v,
            json!({"cniVersion": "1.0.0", "ips": [{"address": "172.20.0.5/26"}]})
        );
        // Empty results still carry an (empty) ips list.
        assert_eq!(
            CniResult::default().to_json(Version::V1_0_0, "1.0.0"),
            json!({"cniVersion": "1.0.0", "ips": []})
        );
    }

    #[test]
    fn reads_what_other_plugins_write() {
        // The spec's 0.4.0 example (bridge), with the version tag and unknown fields.
        let v = json!({
            "cniVersion": "0.4.0",
            "ips": [{"version": "4", "address": "10.0.0.5/32", "interface": 2}],
            "interfaces": [
                {"name": "cni0", "mac": "00:11:22:33:44:55"},
                {"name": "veth3243", "mac": "55:44:33:22:11:11"},
                {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue"}
            ],
            "dns": {"nameservers": ["10.1.0.1"]},
            "somethingNew": true
        });
        let r = CniResult::from_json(&v, "prevResult").unwrap();
        assert_eq!(r.ips[0].interface, Some(2));
        assert_eq!(r.interfaces[2].sandbox, "/var/run/netns/blue");
        assert!(r.routes.is_empty());
        // Missing everything is an empty result.
        assert_eq!(
            CniResult::from_json(&json!({}), "x").unwrap(),
            CniResult::default()
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let cases = [
            (json!("x"), code::DECODE),
            (json!({"ips": [{"address": "10.0.0.5"}]}), code::DECODE),
            (json!({"ips": [{"address": "banana/24"}]}), code::DECODE),
            (json!({"ips": "no"}), code::DECODE),
            (json!({"routes": [{"gw": "10.0.0.1"}]}), code::DECODE),
            (
                json!({"ips": [{"address": "10.0.0.5/24", "interface": 0}]}),
                code::DECODE,
            ),
            (
                json!({"ip4": {"ip": "10.0.0.5/24"}}),
                code::INCOMPATIBLE_VERSION,
            ),
        ];
        for (v, want) in cases {
            let e = CniResult::from_json(&v, "prevResult").unwrap_err();
            assert_eq!(e.code, want, "{v}: {e}");
            assert!(e.msg.contains("prevResult"), "{}", e.msg);
        }
    }

    #[test]
    fn append_shifts_interface_indexes() {
        let mut prev = CniResult {
            interfaces: vec![Interface {
                name: "dummy".into(),
                ..Default::default()
            }],
            ips: vec![IpConfig {
                address: "10.9.0.1/24".parse().unwrap(),
                gateway: None,
                interface: Some(0),
            }],
            ..Default::default()
        };
        prev.append(sample());
        assert_eq!(prev.interfaces.len(), 3);
        assert_eq!(prev.ips[0].interface, Some(0));
        assert_eq!(prev.ips[1].interface, Some(2));
        assert_eq!(prev.ips[2].interface, Some(2));
        assert_eq!(prev.dns.nameservers, ["10.96.0.10"]);
    }
}
