//! The codecs of this crate's cluster resources in the Kubernetes datastore: `IpPool`,
//! `BgpConfiguration`, `BgpPeer`, `BgpFilter` and `IpamConfig` kept as Calico's custom
//! resources (`crd.projectcalico.org/v1` IPPool, BGPConfiguration, BGPPeer, BGPFilter,
//! IPAMConfig), whose `spec` is Calico's `projectcalico.org/v3` spec as it is. Encoding maps
//! margay's model to Calico's field names; decoding reads what a Calico cluster holds, checks
//! it with the model's own validation and names a refused field by its place in the resource
//! (`spec.blockSize`, `spec.exportV4[2].cidr`). margay's settings that Calico's spec cannot
//! hold travel in `margay.dev/` annotations. Pure: no client, no I/O (`crate::kubernetes`
//! does the requests).
//!
//! Calico fields margay does not model are kept as stored when margay rewrites a resource
//! (`modelled_spec_fields` lists a kind's own), ignored when that can only make margay do
//! less (`bindMode`, `sourceAddress`...), and refused when it would make margay do more (a
//! BGPPeer's `nodeSelector`; a BGPFilter rule's `peerType`; a `secretKeyRef` password).
//! Calico's v3 metadata annotation is neither read nor changed.
//!
//! Why this file is long: five kinds, each mapped both ways field by field with the refusals
//! naming Calico's fields; the tests read Calico-shaped literals as users write them.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use ipnet::IpNet;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::{CodecError, CrdCodec, CrdObject};
use crate::contract::Kind;
use crate::model::{
    AllowedUse, AssignmentMode, BgpConfiguration, BgpFilter, BgpFilterRule, BgpPeer, BgpPeerBfd,
    CommunityDef, EncapMode, FilterAction, InvalidField, IpPool, IpamConfig, NextHopMode,
    PrefixAdvertisement, default_block_size,
};
use crate::resource::{Resource, decode, encode};

/// `IpamConfig.empty_block_grace_s` (seconds; Calico has no such setting).
pub const EMPTY_BLOCK_GRACE: &str = "margay.dev/empty-block-grace-seconds";
/// `BgpConfiguration.keepalive_time_s` (seconds; 0: the defaults).
pub const KEEPALIVE_TIME: &str = "margay.dev/keepalive-time-seconds";
/// `BgpConfiguration.hold_time_s`, `BgpPeer.hold_time_s` (seconds; Calico has keepalive only).
pub const HOLD_TIME: &str = "margay.dev/hold-time-seconds";
/// `BgpConfiguration.aggregate_pools_to_external` (`true`/`false`).
pub const AGGREGATE_POOLS: &str = "margay.dev/aggregate-pools-to-external";
/// `BgpConfiguration.external_transit` (`true`/`false`).
pub const EXTERNAL_TRANSIT: &str = "margay.dev/external-transit";
/// `BgpConfiguration.program_external_routes` (`true`/`false`).
pub const PROGRAM_EXTERNAL_ROUTES: &str = "margay.dev/program-external-routes";
/// `BgpPeer.passive` (`true`/`false`).
pub const PASSIVE: &str = "margay.dev/passive";
/// `BgpPeer.max_prefixes` (0: no limit).
pub const MAX_PREFIXES: &str = "margay.dev/max-prefixes";
/// `BgpPeer.bfd`, as JSON: `{"min_rx_ms":300,"min_tx_ms":300,"multiplier":3}`.
pub const BFD: &str = "margay.dev/bfd";

/// The only name of the singletons (BGPConfiguration, IPAMConfig) margay keeps.
const SINGLETON: &str = "default";
/// Calico's block limit per host when `maxBlocksPerHost` is 0 or absent (`ipam.go`), which
/// is also margay's default.
const CALICO_DEFAULT_MAX_BLOCKS: u32 = 20;

/// Every codec of this module.
pub fn codecs() -> Vec<Box<dyn CrdCodec>> {
    vec![
        Box::new(IpPoolCodec),
        Box::new(BgpConfigurationCodec),
        Box::new(BgpPeerCodec),
        Box::new(BgpFilterCodec),
        Box::new(IpamConfigCodec),
    ]
}

// ---- refusals ----

/// A refused field: where it is in the resource (`spec.blockSize`) and why.
#[derive(Debug)]
struct Refusal {
    path: String,
    reason: String,
}

type Parsed<T> = Result<T, Refusal>;

fn refuse(path: impl Into<String>, reason: impl Into<String>) -> Refusal {
    Refusal {
        path: path.into(),
        reason: reason.into(),
    }
}

impl Refusal {
    fn into_error(self, kind: &'static str, name: &str) -> CodecError {
        CodecError {
            kind,
            name: name.to_owned(),
            reason: format!("{}: {}", self.path, self.reason),
        }
    }
}

/// margay's field names (as the model's validation names them) and where Calico's resource
/// holds each; a name not listed is Calico's own under `spec`.
type FieldMap = &'static [(&'static str, &'static str)];

const POOL_FIELDS: FieldMap = &[
    ("name", "metadata.name"),
    ("block_size", "spec.blockSize"),
    ("vxlan_mode", "spec.vxlanMode"),
    ("ipip_mode", "spec.ipipMode"),
    ("node_selector", "spec.nodeSelector"),
    ("allowed_uses", "spec.allowedUses"),
];

const CONFIG_FIELDS: FieldMap = &[
    ("as_number", "spec.asNumber"),
    ("listen_port", "spec.listenPort"),
    ("service_cluster_ips", "spec.serviceClusterIPs"),
    ("service_external_ips", "spec.serviceExternalIPs"),
    ("service_load_balancer_ips", "spec.serviceLoadBalancerIPs"),
    ("prefix_advertisements", "spec.prefixAdvertisements"),
    (
        "keepalive_time_s",
        "metadata.annotations[margay.dev/keepalive-time-seconds]",
    ),
    (
        "hold_time_s",
        "metadata.annotations[margay.dev/hold-time-seconds]",
    ),
];

const PEER_FIELDS: FieldMap = &[
    ("name", "metadata.name"),
    ("peer_address", "spec.peerIP"),
    ("as_number", "spec.asNumber"),
    ("local_as_number", "spec.localASNumber"),
    ("max_restart_time_s", "spec.maxRestartTime"),
    ("reachable_by", "spec.reachableBy"),
    (
        "hold_time_s",
        "metadata.annotations[margay.dev/hold-time-seconds]",
    ),
    ("bfd", "metadata.annotations[margay.dev/bfd]"),
];

const FILTER_FIELDS: FieldMap = &[("name", "metadata.name")];

/// A refusal of the model's validation, with its field named where the resource holds it.
fn invalid(e: InvalidField, fields: FieldMap) -> Refusal {
    let split = e.path.find(['[', '.']).unwrap_or(e.path.len());
    let (head, rest) = e.path.split_at(split);
    let place = fields
        .iter()
        .find(|(margay, _)| *margay == head)
        .map_or_else(
            || format!("spec.{head}"),
            |(_, calico)| (*calico).to_owned(),
        );
    refuse(format!("{place}{rest}"), e.reason)
}

// ---- reading Calico's spec ----

/// One mapping of a resource (`spec`, `spec.exportV4[0]`), read field by field. Null and
/// Go's empty values (`""`, `0` where Calico omits it) count as absent; fields not asked
/// for are ignored.
struct Fields<'a> {
    path: String,
    map: Option<&'a Map<String, Value>>,
}

impl<'a> Fields<'a> {
    fn new(path: &str, value: &'a Value) -> Parsed<Self> {
        match value {
            Value::Object(map) => Ok(Self {
                path: path.to_owned(),
                map: Some(map),
            }),
            Value::Null => Ok(Self {
                path: path.to_owned(),
                map: None,
            }),
            other => Err(refuse(
                path,
                format!("must be a mapping, not {}", type_name(other)),
            )),
        }
    }

    fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map?.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, want: &str, got: &Value) -> Refusal {
        refuse(
            self.at(key),
            format!("must be {want}, not {}", type_name(got)),
        )
    }

    /// A string; `""` is absent.
    fn str(&self, key: &str) -> Parsed<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    fn bool(&self, key: &str) -> Parsed<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong(key, "true or false", other)),
        }
    }

    /// A whole number 0 to `max`.
    fn uint(&self, key: &str, max: u64) -> Parsed<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) if v <= max => Ok(Some(v)),
                _ => Err(refuse(
                    self.at(key),
                    format!("{n} is not a whole number 0-{max}"),
                )),
            },
            Some(other) => Err(self.wrong(key, "a whole number", other)),
        }
    }

    /// A list; absent is empty.
    fn list(&self, key: &str) -> Parsed<&'a [Value]> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(self.wrong(key, "a list", other)),
        }
    }

    /// The mappings of a list, each with its path (`spec.exportV4[2]`).
    fn items(&self, key: &str) -> Parsed<Vec<Fields<'a>>> {
        let base = self.at(key);
        self.list(key)?
            .iter()
            .enumerate()
            .map(|(i, item)| Fields::new(&format!("{base}[{i}]"), item))
            .collect()
    }

    fn obj(&self, key: &str) -> Parsed<Option<Fields<'a>>> {
        self.get(key)
            .map(|v| Fields::new(&self.at(key), v))
            .transpose()
    }

    /// One of a margay enum's values, spelt as Calico spells them (margay's serde names are
    /// Calico's: `CrossSubnet`, `NotIn`, `RemotePeers`...); `""` is absent.
    fn choice<T: DeserializeOwned>(&self, key: &str) -> Parsed<Option<T>> {
        let Some(text) = self.str(key)? else {
            return Ok(None);
        };
        serde_json::from_value(Value::String(text.to_owned()))
            .map(Some)
            .map_err(|e| refuse(self.at(key), unknown_value(&e)))
    }

    /// A Go duration (`metav1.Duration`: "90s", "1m30s", "2m0s") in seconds, rounded as
    /// Calico's confd rounds it, at most `max`.
    fn duration_s(&self, key: &str, max: u64) -> Parsed<Option<u64>> {
        let Some(text) = self.str(key)? else {
            return Ok(None);
        };
        match go_duration_s(text) {
            Some(s) if s <= max => Ok(Some(s)),
            Some(s) => Err(refuse(self.at(key), format!("{s}s is above {max}s"))),
            None => Err(refuse(
                self.at(key),
                format!("{text:?} is not a duration such as \"90s\" or \"1m30s\""),
            )),
        }
    }

    /// An AS number as Calico's `numorstring.ASNumber` takes it: a number, or a string of
    /// one or in asdot (`"1.10"` is 65546).
    fn as_number(&self, key: &str) -> Parsed<Option<u32>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let bad = || {
            refuse(
                self.at(key),
                format!("{v} is not an AS number (0-4294967295, or asdot such as \"1.10\")"),
            )
        };
        let n = match v {
            Value::Number(n) => n.as_u64().ok_or_else(bad)?,
            Value::String(s) => match s.split_once('.') {
                Some((high, low)) => {
                    let high: u16 = high.parse().map_err(|_| bad())?;
                    let low: u16 = low.parse().map_err(|_| bad())?;
                    (u64::from(high) << 16) | u64::from(low)
                }
                None => s.parse().map_err(|_| bad())?,
            },
            _ => return Err(bad()),
        };
        u32::try_from(n).map(Some).map_err(|_| bad())
    }

    /// A field margay does not model whose meaning it cannot drop (see the module's doc):
    /// refused when set.
    fn refuse_set(&self, key: &str, why: &str) -> Parsed<()> {
        match self.get(key) {
            Some(v) if is_set(v) => Err(refuse(self.at(key), why)),
            _ => Ok(()),
        }
    }
}

/// Whether a value says something: not `""`, `[]` or `{}`.
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// serde's "unknown variant `X`, expected one of `A`, `B`" without its position.
fn unknown_value(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.find(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// A Go duration in whole seconds, rounded half away from zero (`math.Round`); `None` if
/// it is not one or is negative.
fn go_duration_s(text: &str) -> Option<u64> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        if !number.bytes().any(|b| b.is_ascii_digit()) {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = next;
    }
    total.is_finite().then(|| total.round() as u64)
}

/// A margay setting from its `margay.dev/` annotation; `None` when absent.
fn annotation<T: FromStr>(object: &CrdObject, key: &str) -> Parsed<Option<T>>
where
    T::Err: Display,
{
    let Some(text) = object.annotations.get(key) else {
        return Ok(None);
    };
    text.trim().parse().map(Some).map_err(|e| {
        refuse(
            format!("metadata.annotations[{key}]"),
            format!("{text:?}: {e}"),
        )
    })
}

/// Calico's spelling of a margay enum value (its serde name).
fn calico_name<T: Serialize>(value: T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// A CIDR, with its text in the message when it is not one.
fn cidr_at(fields: &Fields, key: &str) -> Parsed<Option<IpNet>> {
    let Some(text) = fields.str(key)? else {
        return Ok(None);
    };
    text.parse().map(Some).map_err(|_| {
        refuse(
            fields.at(key),
            format!("{text:?} is not a CIDR (address/prefix length)"),
        )
    })
}

/// A selector that means every node (absent, `""` or `all()`).
fn selects_all(fields: &Fields, key: &str) -> Parsed<bool> {
    Ok(fields.str(key)?.is_none_or(|s| s.trim() == "all()"))
}

// ---- the codecs' shared steps ----

/// margay's object from its stored bytes.
fn stored<T: Resource>(kind: &'static str, name: &str, value: &[u8]) -> Result<T, CodecError> {
    decode(value).map_err(|e| CodecError {
        kind,
        name: name.to_owned(),
        reason: format!("margay's stored value does not decode: {e}"),
    })
}

/// Refuses to write a singleton under another name than `default`.
fn singleton_name(kind: &'static str, name: &str) -> Result<(), CodecError> {
    if name == SINGLETON {
        Ok(())
    } else {
        Err(CodecError {
            kind,
            name: name.to_owned(),
            reason: format!(
                "metadata.name: margay keeps only the cluster-wide {kind} \"{SINGLETON}\""
            ),
        })
    }
}

fn spec_object(name: &str, spec: Map<String, Value>) -> CrdObject {
    CrdObject {
        name: name.to_owned(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        spec: Value::Object(spec),
    }
}

// ---- IPPool ----

/// `IpPool` ⇄ Calico's IPPool: every field of margay's pool is Calico's.
pub struct IpPoolCodec;

/// The spec fields of Calico's IPPool that margay reads and writes (a rewrite keeps the others).
const POOL_FIELDS_MODELLED: [&str; 10] = [
    "cidr",
    "blockSize",
    "vxlanMode",
    "ipipMode",
    "natOutgoing",
    "disabled",
    "disableBGPExport",
    "nodeSelector",
    "allowedUses",
    "assignmentMode",
];

impl CrdCodec for IpPoolCodec {
    fn kind(&self) -> Kind {
        IpPool::kind()
    }
    fn crd_kind(&self) -> &'static str {
        "IPPool"
    }
    fn plural(&self) -> &'static str {
        "ippools"
    }
    fn resource_name(&self, name: &str) -> String {
        name.to_owned()
    }
    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        let pool: IpPool = stored(self.crd_kind(), name, value)?;
        Ok(spec_object(name, pool_spec(&pool)))
    }
    fn modelled_spec_fields(&self) -> Option<&'static [&'static str]> {
        Some(&POOL_FIELDS_MODELLED)
    }
    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        let pool = pool_from(object).map_err(|r| r.into_error(self.crd_kind(), &object.name))?;
        Ok(Some((object.name.clone(), encode(&pool))))
    }
}

fn pool_spec(p: &IpPool) -> Map<String, Value> {
    let mut spec = Map::new();
    spec.insert("cidr".into(), json!(p.cidr.to_string()));
    spec.insert("blockSize".into(), json!(p.block_size));
    spec.insert("vxlanMode".into(), calico_name(p.vxlan_mode));
    spec.insert("ipipMode".into(), calico_name(p.ipip_mode));
    for (key, on) in [
        ("natOutgoing", p.nat_outgoing),
        ("disabled", p.disabled),
        ("disableBGPExport", p.disable_bgp_export),
    ] {
        if on {
            spec.insert(key.into(), json!(true));
        }
    }
    if !p.node_selector.is_empty() {
        spec.insert("nodeSelector".into(), json!(p.node_selector));
    }
    let uses: Vec<Value> = p.allowed_uses.iter().map(|u| calico_name(*u)).collect();
    spec.insert("allowedUses".into(), Value::Array(uses));
    spec.insert("assignmentMode".into(), calico_name(p.assignment_mode));
    spec
}

fn pool_from(object: &CrdObject) -> Parsed<IpPool> {
    let spec = Fields::new("spec", &object.spec)?;
    let cidr = cidr_at(&spec, "cidr")?.ok_or_else(|| refuse(spec.at("cidr"), "required"))?;
    if !selects_all(&spec, "namespaceSelector")? {
        return Err(refuse(
            spec.at("namespaceSelector"),
            "margay does not select pools by namespace: it would hand this pool's addresses \
             to every namespace",
        ));
    }
    let mut pool = IpPool::new(&object.name, cidr);
    pool.block_size = match spec.uint("blockSize", u8::MAX.into())? {
        None | Some(0) => default_block_size(&cidr),
        Some(size) => size as u8,
    };
    pool.vxlan_mode = spec.choice("vxlanMode")?.unwrap_or(EncapMode::Never);
    pool.ipip_mode = spec.choice("ipipMode")?.unwrap_or(EncapMode::Never);
    pool.nat_outgoing = spec.bool("natOutgoing")?.unwrap_or(false);
    pool.disabled = spec.bool("disabled")?.unwrap_or(false);
    pool.disable_bgp_export = spec.bool("disableBGPExport")?.unwrap_or(false);
    pool.node_selector = spec.str("nodeSelector")?.unwrap_or("").to_owned();
    let uses = allowed_uses(&spec)?;
    if !uses.is_empty() {
        pool.allowed_uses = uses;
    }
    pool.assignment_mode = spec
        .choice("assignmentMode")?
        .unwrap_or(AssignmentMode::Automatic);
    pool.validate()
        .map_err(|e| invalid(InvalidField::from(e), POOL_FIELDS))?;
    Ok(pool)
}

/// `allowedUses`; empty means Calico's default (margay's too), both uses.
fn allowed_uses(spec: &Fields) -> Parsed<Vec<AllowedUse>> {
    let base = spec.at("allowedUses");
    let mut uses = Vec::new();
    for (i, item) in spec.list("allowedUses")?.iter().enumerate() {
        let path = format!("{base}[{i}]");
        if item.as_str() == Some("LoadBalancer") {
            return Err(refuse(
                path,
                "LoadBalancer: margay has no load-balancer IPAM (allowed: Workload, Tunnel)",
            ));
        }
        let use_ =
            serde_json::from_value(item.clone()).map_err(|e| refuse(&path, unknown_value(&e)))?;
        uses.push(use_);
    }
    Ok(uses)
}

// ---- BGPConfiguration ----

/// `BgpConfiguration` ⇄ Calico's BGPConfiguration `default`. Calico's per-node ones
/// (`node.<name>`: listenPort, logSeverityScreen, prefixAdvertisements overrides) have no
/// place in margay's model: they decode as absent.
pub struct BgpConfigurationCodec;

/// The spec fields of Calico's BGPConfiguration that margay reads and writes (a rewrite keeps the others).
const CONFIG_FIELDS_MODELLED: [&str; 8] = [
    "nodeToNodeMeshEnabled",
    "asNumber",
    "listenPort",
    "serviceClusterIPs",
    "serviceExternalIPs",
    "serviceLoadBalancerIPs",
    "communities",
    "prefixAdvertisements",
];

impl CrdCodec for BgpConfigurationCodec {
    fn kind(&self) -> Kind {
        BgpConfiguration::kind()
    }
    fn crd_kind(&self) -> &'static str {
        "BGPConfiguration"
    }
    fn plural(&self) -> &'static str {
        "bgpconfigurations"
    }
    fn resource_name(&self, name: &str) -> String {
        name.to_owned()
    }
    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        singleton_name(self.crd_kind(), name)?;
        let config: BgpConfiguration = stored(self.crd_kind(), name, value)?;
        Ok(config_object(name, &config))
    }
    fn modelled_spec_fields(&self) -> Option<&'static [&'static str]> {
        Some(&CONFIG_FIELDS_MODELLED)
    }
    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        if object.name != BgpConfiguration::NAME {
            return Ok(None);
        }
        let config =
            config_from(object).map_err(|r| r.into_error(self.crd_kind(), &object.name))?;
        Ok(Some((object.name.clone(), encode(&config))))
    }
}

fn config_object(name: &str, c: &BgpConfiguration) -> CrdObject {
    let mut spec = Map::new();
    spec.insert("nodeToNodeMeshEnabled".into(), json!(c.node_to_node_mesh));
    spec.insert("asNumber".into(), json!(c.as_number));
    spec.insert("listenPort".into(), json!(c.listen_port));
    for (key, list) in [
        ("serviceClusterIPs", &c.service_cluster_ips),
        ("serviceExternalIPs", &c.service_external_ips),
        ("serviceLoadBalancerIPs", &c.service_load_balancer_ips),
    ] {
        if !list.is_empty() {
            let blocks = list.iter().map(|n| json!({ "cidr": n.to_string() }));
            spec.insert(key.into(), blocks.collect());
        }
    }
    if !c.communities.is_empty() {
        let defs = c
            .communities
            .iter()
            .map(|d| json!({ "name": d.name, "value": d.value }));
        spec.insert("communities".into(), defs.collect());
    }
    if !c.prefix_advertisements.is_empty() {
        let ads = c
            .prefix_advertisements
            .iter()
            .map(|a| json!({ "cidr": a.cidr.to_string(), "communities": a.communities }));
        spec.insert("prefixAdvertisements".into(), ads.collect());
    }
    let mut object = spec_object(name, spec);
    let d = BgpConfiguration::default();
    let notes = &mut object.annotations;
    for (key, value, default) in [
        (KEEPALIVE_TIME, c.keepalive_time_s, d.keepalive_time_s),
        (HOLD_TIME, c.hold_time_s, d.hold_time_s),
    ] {
        if value != default {
            notes.insert(key.into(), value.to_string());
        }
    }
    for (key, value, default) in [
        (
            AGGREGATE_POOLS,
            c.aggregate_pools_to_external,
            d.aggregate_pools_to_external,
        ),
        (EXTERNAL_TRANSIT, c.external_transit, d.external_transit),
        (
            PROGRAM_EXTERNAL_ROUTES,
            c.program_external_routes,
            d.program_external_routes,
        ),
    ] {
        if value != default {
            notes.insert(key.into(), value.to_string());
        }
    }
    object
}

fn config_from(object: &CrdObject) -> Parsed<BgpConfiguration> {
    let spec = Fields::new("spec", &object.spec)?;
    spec.refuse_set(
        "nodeMeshPassword",
        "margay cannot read Kubernetes secrets: its mesh sessions would go unauthenticated",
    )?;
    let d = BgpConfiguration::default();
    let config = BgpConfiguration {
        as_number: spec.as_number("asNumber")?.unwrap_or(d.as_number),
        node_to_node_mesh: spec
            .bool("nodeToNodeMeshEnabled")?
            .unwrap_or(d.node_to_node_mesh),
        listen_port: match spec.uint("listenPort", u16::MAX.into())? {
            None | Some(0) => d.listen_port,
            Some(port) => port as u16,
        },
        keepalive_time_s: annotation(object, KEEPALIVE_TIME)?.unwrap_or(d.keepalive_time_s),
        hold_time_s: annotation(object, HOLD_TIME)?.unwrap_or(d.hold_time_s),
        aggregate_pools_to_external: annotation(object, AGGREGATE_POOLS)?
            .unwrap_or(d.aggregate_pools_to_external),
        external_transit: annotation(object, EXTERNAL_TRANSIT)?.unwrap_or(d.external_transit),
        program_external_routes: annotation(object, PROGRAM_EXTERNAL_ROUTES)?
            .unwrap_or(d.program_external_routes),
        service_cluster_ips: cidr_blocks(&spec, "serviceClusterIPs")?,
        service_external_ips: cidr_blocks(&spec, "serviceExternalIPs")?,
        service_load_balancer_ips: cidr_blocks(&spec, "serviceLoadBalancerIPs")?,
        communities: communities(&spec)?,
        prefix_advertisements: prefix_advertisements(&spec)?,
    };
    config.check().map_err(|e| invalid(e, CONFIG_FIELDS))?;
    Ok(config)
}

/// A list of `{cidr}` (the service IP blocks).
fn cidr_blocks(spec: &Fields, key: &str) -> Parsed<Vec<IpNet>> {
    spec.items(key)?
        .iter()
        .map(|block| cidr_at(block, "cidr")?.ok_or_else(|| refuse(block.at("cidr"), "required")))
        .collect()
}

fn communities(spec: &Fields) -> Parsed<Vec<CommunityDef>> {
    spec.items("communities")?
        .iter()
        .map(|c| {
            Ok(CommunityDef {
                name: c.str("name")?.unwrap_or("").to_owned(),
                value: c
                    .str("value")?
                    .ok_or_else(|| refuse(c.at("value"), "required"))?
                    .to_owned(),
            })
        })
        .collect()
}

fn prefix_advertisements(spec: &Fields) -> Parsed<Vec<PrefixAdvertisement>> {
    let mut out = Vec::new();
    for a in spec.items("prefixAdvertisements")? {
        let cidr = cidr_at(&a, "cidr")?.ok_or_else(|| refuse(a.at("cidr"), "required"))?;
        let base = a.at("communities");
        let mut communities = Vec::new();
        for (k, c) in a.list("communities")?.iter().enumerate() {
            let c = c.as_str().ok_or_else(|| {
                refuse(
                    format!("{base}[{k}]"),
                    "must be a community's name or value",
                )
            })?;
            communities.push(c.to_owned());
        }
        out.push(PrefixAdvertisement { cidr, communities });
    }
    Ok(out)
}

// ---- BGPPeer ----

/// `BgpPeer` ⇄ Calico's BGPPeer with `peerIP` (margay peers with addresses; it has no
/// `peerSelector`). margay's own session settings go in annotations; a literal password is
/// not written (see [`peer_object`]).
pub struct BgpPeerCodec;

/// The spec fields of Calico's BGPPeer that margay reads and writes (a rewrite keeps the others).
const PEER_FIELDS_MODELLED: [&str; 12] = [
    "peerIP",
    "asNumber",
    "node",
    "ttlSecurity",
    "keepaliveTime",
    "nextHopMode",
    "keepOriginalNextHop",
    "filters",
    "localASNumber",
    "numAllowedLocalASNumbers",
    "maxRestartTime",
    "reachableBy",
];

impl CrdCodec for BgpPeerCodec {
    fn kind(&self) -> Kind {
        BgpPeer::kind()
    }
    fn crd_kind(&self) -> &'static str {
        "BGPPeer"
    }
    fn plural(&self) -> &'static str {
        "bgppeers"
    }
    fn resource_name(&self, name: &str) -> String {
        name.to_owned()
    }
    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        let peer: BgpPeer = stored(self.crd_kind(), name, value)?;
        peer_object(name, &peer).map_err(|r| r.into_error(self.crd_kind(), name))
    }
    fn modelled_spec_fields(&self) -> Option<&'static [&'static str]> {
        Some(&PEER_FIELDS_MODELLED)
    }
    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        let peer = peer_from(object).map_err(|r| r.into_error(self.crd_kind(), &object.name))?;
        Ok(Some((object.name.clone(), encode(&peer))))
    }
}

/// The resource of a peer. A peer with a password is refused: Calico's resource names a
/// Kubernetes Secret (`password.secretKeyRef`), and margay's literal password in an
/// annotation would be readable by every reader of BGPPeers.
fn peer_object(name: &str, p: &BgpPeer) -> Parsed<CrdObject> {
    if !p.password.is_empty() {
        return Err(refuse(
            "password",
            "a BGPPeer in Kubernetes cannot hold a literal password (Calico names a Secret, \
             which margay cannot read); give it in bgpd's configuration instead",
        ));
    }
    let mut spec = Map::new();
    let peer_ip = match p.port {
        0 => p.peer_address.to_string(),
        port => SocketAddr::new(p.peer_address, port).to_string(),
    };
    spec.insert("peerIP".into(), json!(peer_ip));
    spec.insert("asNumber".into(), json!(p.as_number));
    if !p.node.is_empty() {
        spec.insert("node".into(), json!(p.node));
    }
    if p.ttl_security_hops != 0 {
        spec.insert("ttlSecurity".into(), json!(p.ttl_security_hops));
    }
    if p.keepalive_time_s != 0 {
        spec.insert(
            "keepaliveTime".into(),
            json!(format!("{}s", p.keepalive_time_s)),
        );
    }
    if p.next_hop_mode != NextHopMode::Auto {
        spec.insert("nextHopMode".into(), calico_name(p.next_hop_mode));
    }
    if !p.filters.is_empty() {
        spec.insert("filters".into(), json!(p.filters));
    }
    if let Some(local) = p.local_as_number {
        spec.insert("localASNumber".into(), json!(local));
    }
    if p.num_allowed_local_as_numbers != 0 {
        spec.insert(
            "numAllowedLocalASNumbers".into(),
            json!(p.num_allowed_local_as_numbers),
        );
    }
    if let Some(t) = p.max_restart_time_s {
        spec.insert("maxRestartTime".into(), json!(format!("{t}s")));
    }
    if let Some(gw) = p.reachable_by {
        spec.insert("reachableBy".into(), json!(gw.to_string()));
    }
    let mut object = spec_object(name, spec);
    let notes = &mut object.annotations;
    if p.passive {
        notes.insert(PASSIVE.into(), "true".into());
    }
    if p.hold_time_s != 0 {
        notes.insert(HOLD_TIME.into(), p.hold_time_s.to_string());
    }
    if p.max_prefixes != 0 {
        notes.insert(MAX_PREFIXES.into(), p.max_prefixes.to_string());
    }
    if let Some(bfd) = &p.bfd {
        let text = serde_json::to_string(bfd).map_err(|e| refuse("bfd", e.to_string()))?;
        notes.insert(BFD.into(), text);
    }
    Ok(object)
}

fn peer_from(object: &CrdObject) -> Parsed<BgpPeer> {
    let spec = Fields::new("spec", &object.spec)?;
    peer_refusals(&spec)?;
    let peer_ip = spec.str("peerIP")?.ok_or_else(|| {
        refuse(
            spec.at("peerIP"),
            "required (margay peers with an address; it has no peerSelector)",
        )
    })?;
    let (address, port) = peer_ip_port(peer_ip).ok_or_else(|| {
        refuse(
            spec.at("peerIP"),
            format!("{peer_ip:?} is not an IP address, <IPv4>:<port> or [<IPv6>]:<port>"),
        )
    })?;
    // A missing AS is 0, which the model refuses by its name.
    let as_number = spec.as_number("asNumber")?.unwrap_or(0);
    let node = spec.str("node")?.unwrap_or("");
    let mut peer = BgpPeer::new(&object.name, node, address, as_number);
    peer.port = port;
    peer.ttl_security_hops = spec.uint("ttlSecurity", u8::MAX.into())?.unwrap_or(0) as u8;
    peer.keepalive_time_s = spec
        .duration_s("keepaliveTime", u16::MAX.into())?
        .unwrap_or(0) as u16;
    peer.next_hop_mode = next_hop_mode(&spec)?;
    peer.filters = filter_names(&spec)?;
    peer.local_as_number = spec.as_number("localASNumber")?;
    peer.num_allowed_local_as_numbers = spec
        .uint("numAllowedLocalASNumbers", u8::MAX.into())?
        .unwrap_or(0) as u8;
    peer.max_restart_time_s = spec
        .duration_s("maxRestartTime", u16::MAX.into())?
        .map(|t| t as u16);
    peer.reachable_by = match spec.str("reachableBy")? {
        None => None,
        Some(gw) => Some(gw.parse().map_err(|_| {
            refuse(
                spec.at("reachableBy"),
                format!("{gw:?} is not an IP address"),
            )
        })?),
    };
    peer.passive = annotation(object, PASSIVE)?.unwrap_or(false);
    peer.hold_time_s = annotation(object, HOLD_TIME)?.unwrap_or(0);
    peer.max_prefixes = annotation(object, MAX_PREFIXES)?.unwrap_or(0);
    peer.bfd = match object.annotations.get(BFD) {
        None => None,
        Some(text) => Some(serde_json::from_str::<BgpPeerBfd>(text).map_err(|e| {
            refuse(
                format!("metadata.annotations[{BFD}]"),
                format!("{text:?}: {e}"),
            )
        })?),
    };
    peer.check().map_err(|e| invalid(e, PEER_FIELDS))?;
    Ok(peer)
}

/// The Calico peer fields margay cannot follow and must not drop.
fn peer_refusals(spec: &Fields) -> Parsed<()> {
    if !selects_all(spec, "nodeSelector")? {
        return Err(refuse(
            spec.at("nodeSelector"),
            "margay scopes a peering to one node (spec.node) or to every node; it would \
             peer from every node",
        ));
    }
    for key in ["peerSelector", "localWorkloadSelector"] {
        spec.refuse_set(
            key,
            "margay peers with an address (spec.peerIP) only, not with selected nodes or \
             workloads",
        )?;
    }
    if let Some(password) = spec.obj("password")? {
        password.refuse_set(
            "secretKeyRef",
            "margay cannot read Kubernetes secrets: the session would go unauthenticated",
        )?;
    }
    Ok(())
}

/// Calico's `peerIP`: an address, `<IPv4>:<port>` or `[<IPv6>]:<port>` with a port of
/// 1-65535 (libcalico-go's `processIPPort`); port 0 when none is given.
fn peer_ip_port(text: &str) -> Option<(IpAddr, u16)> {
    if let Ok(address) = text.parse::<IpAddr>() {
        return Some((address, 0));
    }
    let socket: SocketAddr = text.parse().ok()?;
    (socket.port() != 0).then_some((socket.ip(), socket.port()))
}

/// `nextHopMode`, or the deprecated `keepOriginalNextHop: true` (= `Keep`); not both, as
/// Calico's CRD refuses.
fn next_hop_mode(spec: &Fields) -> Parsed<NextHopMode> {
    let keep = spec.bool("keepOriginalNextHop")?.unwrap_or(false);
    match (keep, spec.choice("nextHopMode")?) {
        (true, Some(_)) => Err(refuse(
            spec.at("keepOriginalNextHop"),
            "give nextHopMode or the deprecated keepOriginalNextHop, not both",
        )),
        (true, None) => Ok(NextHopMode::Keep),
        (false, mode) => Ok(mode.unwrap_or(NextHopMode::Auto)),
    }
}

fn filter_names(spec: &Fields) -> Parsed<Vec<String>> {
    let base = spec.at("filters");
    spec.list("filters")?
        .iter()
        .enumerate()
        .map(|(i, f)| {
            f.as_str()
                .map(str::to_owned)
                .ok_or_else(|| refuse(format!("{base}[{i}]"), "must be the name of a BGPFilter"))
        })
        .collect()
}

// ---- BGPFilter ----

/// `BgpFilter` ⇄ Calico's BGPFilter: the four rule lists, each rule's fields margay has.
pub struct BgpFilterCodec;

/// The spec fields of Calico's BGPFilter that margay reads and writes (a rewrite keeps the others).
const FILTER_FIELDS_MODELLED: [&str; 4] = ["exportV4", "importV4", "exportV6", "importV6"];

impl CrdCodec for BgpFilterCodec {
    fn kind(&self) -> Kind {
        BgpFilter::kind()
    }
    fn crd_kind(&self) -> &'static str {
        "BGPFilter"
    }
    fn plural(&self) -> &'static str {
        "bgpfilters"
    }
    fn resource_name(&self, name: &str) -> String {
        name.to_owned()
    }
    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        let filter: BgpFilter = stored(self.crd_kind(), name, value)?;
        let mut spec = Map::new();
        for (key, _, rules) in filter.lists() {
            if !rules.is_empty() {
                spec.insert(key.into(), rules.iter().map(rule_value).collect());
            }
        }
        Ok(spec_object(name, spec))
    }
    fn modelled_spec_fields(&self) -> Option<&'static [&'static str]> {
        Some(&FILTER_FIELDS_MODELLED)
    }
    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        let filter =
            filter_from(object).map_err(|r| r.into_error(self.crd_kind(), &object.name))?;
        Ok(Some((object.name.clone(), encode(&filter))))
    }
}

fn rule_value(r: &BgpFilterRule) -> Value {
    let mut v = Map::new();
    if let Some(cidr) = &r.cidr {
        v.insert("cidr".into(), json!(cidr.to_string()));
    }
    if let Some(op) = r.match_operator {
        v.insert("matchOperator".into(), calico_name(op));
    }
    let mut length = Map::new();
    if let Some(min) = r.prefix_length_min {
        length.insert("min".into(), json!(min));
    }
    if let Some(max) = r.prefix_length_max {
        length.insert("max".into(), json!(max));
    }
    if !length.is_empty() {
        v.insert("prefixLength".into(), Value::Object(length));
    }
    if let Some(source) = r.source {
        v.insert("source".into(), calico_name(source));
    }
    if let Some(name) = &r.interface {
        v.insert("interface".into(), json!(name));
    }
    v.insert("action".into(), calico_name(r.action));
    Value::Object(v)
}

fn filter_from(object: &CrdObject) -> Parsed<BgpFilter> {
    let spec = Fields::new("spec", &object.spec)?;
    let mut lists: [Vec<BgpFilterRule>; 4] = Default::default();
    for (rules, key) in lists
        .iter_mut()
        .zip(["exportV4", "importV4", "exportV6", "importV6"])
    {
        for item in spec.items(key)? {
            rules.push(filter_rule(&item)?);
        }
    }
    let [export_v4, import_v4, export_v6, import_v6] = lists;
    let filter = BgpFilter {
        name: object.name.clone(),
        export_v4,
        import_v4,
        export_v6,
        import_v6,
    };
    filter.check().map_err(|e| invalid(e, FILTER_FIELDS))?;
    Ok(filter)
}

fn filter_rule(item: &Fields) -> Parsed<BgpFilterRule> {
    for key in ["peerType", "communities", "asPathPrefix", "priority"] {
        item.refuse_set(
            key,
            "margay does not evaluate this match: the rule would match more routes",
        )?;
    }
    item.refuse_set(
        "operations",
        "margay does not apply route operations: accepted routes would go unchanged",
    )?;
    let action: FilterAction = item
        .choice("action")?
        .ok_or_else(|| refuse(item.at("action"), "required: Accept or Reject"))?;
    let mut rule = BgpFilterRule::new(action);
    rule.cidr = cidr_at(item, "cidr")?;
    rule.match_operator = item.choice("matchOperator")?;
    if let Some(length) = item.obj("prefixLength")? {
        rule.prefix_length_min = length.uint("min", u8::MAX.into())?.map(|v| v as u8);
        rule.prefix_length_max = length.uint("max", u8::MAX.into())?.map(|v| v as u8);
    }
    rule.source = item.choice("source")?;
    rule.interface = item.str("interface")?.map(str::to_owned);
    Ok(rule)
}

// ---- IPAMConfig ----

/// `IpamConfig` ⇄ Calico's IPAMConfig `default`. margay's block limit 0 (a node claims no
/// block of its own) is Calico's `autoAllocateBlocks: false`; margay's 20 is Calico's 0 (its
/// default limit); the empty-block grace is margay's own (an annotation).
pub struct IpamConfigCodec;

/// The spec fields of Calico's IPAMConfig that margay reads and writes (a rewrite keeps the others).
const IPAM_CONFIG_FIELDS_MODELLED: [&str; 3] =
    ["strictAffinity", "autoAllocateBlocks", "maxBlocksPerHost"];

impl CrdCodec for IpamConfigCodec {
    fn kind(&self) -> Kind {
        IpamConfig::kind()
    }
    fn crd_kind(&self) -> &'static str {
        "IPAMConfig"
    }
    fn plural(&self) -> &'static str {
        "ipamconfigs"
    }
    fn resource_name(&self, name: &str) -> String {
        name.to_owned()
    }
    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        singleton_name(self.crd_kind(), name)?;
        let config: IpamConfig = stored(self.crd_kind(), name, value)?;
        let mut spec = Map::new();
        spec.insert("strictAffinity".into(), json!(config.strict_affinity));
        let max = config.max_blocks_per_host;
        spec.insert("autoAllocateBlocks".into(), json!(max != 0));
        if max != 0 && max != CALICO_DEFAULT_MAX_BLOCKS {
            spec.insert("maxBlocksPerHost".into(), json!(max));
        }
        let mut object = spec_object(name, spec);
        if config.empty_block_grace_s != IpamConfig::default().empty_block_grace_s {
            object.annotations.insert(
                EMPTY_BLOCK_GRACE.into(),
                config.empty_block_grace_s.to_string(),
            );
        }
        Ok(object)
    }
    fn modelled_spec_fields(&self) -> Option<&'static [&'static str]> {
        Some(&IPAM_CONFIG_FIELDS_MODELLED)
    }
    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        if object.name != SINGLETON {
            return Ok(None);
        }
        let config =
            ipam_config_from(object).map_err(|r| r.into_error(self.crd_kind(), &object.name))?;
        Ok(Some((object.name.clone(), encode(&config))))
    }
}

fn ipam_config_from(object: &CrdObject) -> Parsed<IpamConfig> {
    let spec = Fields::new("spec", &object.spec)?;
    let d = IpamConfig::default();
    let auto = spec.bool("autoAllocateBlocks")?.unwrap_or(true);
    let limit = spec.uint("maxBlocksPerHost", u32::MAX.into())?;
    Ok(IpamConfig {
        strict_affinity: spec.bool("strictAffinity")?.unwrap_or(false),
        max_blocks_per_host: match (auto, limit) {
            (false, _) => 0,
            (true, None | Some(0)) => CALICO_DEFAULT_MAX_BLOCKS,
            (true, Some(n)) => n as u32,
        },
        empty_block_grace_s: annotation(object, EMPTY_BLOCK_GRACE)?
            .unwrap_or(d.empty_block_grace_s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FilterSource, MatchOperator};

    fn object(name: &str, spec: Value) -> CrdObject {
        CrdObject {
            name: name.into(),
            spec,
            ..Default::default()
        }
    }

    fn decoded<T: Resource>(codec: &dyn CrdCodec, object: &CrdObject) -> T {
        let (name, bytes) = codec.decode(object).unwrap().unwrap();
        assert_eq!(name, object.name);
        decode(&bytes).unwrap()
    }

    fn refusal(codec: &dyn CrdCodec, object: &CrdObject) -> String {
        codec.decode(object).unwrap_err().reason
    }

    /// margay → resource → margay gives the object back; the resource carries no Calico v3
    /// metadata and no labels, and only spec fields the codec says it models (a rewrite
    /// keeps every other field as it was stored: one written but not listed would stay
    /// when margay unsets it).
    fn round_trip<T: Resource + PartialEq + std::fmt::Debug>(
        codec: &dyn CrdCodec,
        name: &str,
        value: &T,
    ) -> CrdObject {
        let cr = codec.encode(name, &encode(value)).unwrap();
        assert_eq!(cr.name, codec.resource_name(name));
        assert!(cr.labels.is_empty());
        assert!(
            cr.annotations
                .keys()
                .all(|k| k.starts_with(crate::crd::MARGAY_ANNOTATIONS))
        );
        let modelled = codec.modelled_spec_fields().unwrap();
        for key in cr.spec.as_object().unwrap().keys() {
            assert!(
                modelled.contains(&key.as_str()),
                "{key} is written but not listed as modelled"
            );
        }
        assert_eq!(&decoded::<T>(codec, &cr), value);
        cr
    }

    #[test]
    fn codecs_cover_the_kinds_once() {
        let all = codecs();
        let kinds: Vec<_> = all.iter().map(|c| (c.kind().name, c.crd_kind())).collect();
        assert_eq!(
            kinds,
            [
                ("IPPool", "IPPool"),
                ("BGPConfiguration", "BGPConfiguration"),
                ("BGPPeer", "BGPPeer"),
                ("BGPFilter", "BGPFilter"),
                ("IPAMConfig", "IPAMConfig"),
            ]
        );
        let plurals: Vec<_> = all.iter().map(|c| c.plural()).collect();
        assert_eq!(
            plurals,
            [
                "ippools",
                "bgpconfigurations",
                "bgppeers",
                "bgpfilters",
                "ipamconfigs"
            ]
        );
        assert!(all.iter().all(|c| c.selector("x").is_none()));
    }

    #[test]
    fn pool_round_trips_in_calicos_fields() {
        let mut pool = IpPool::new("blue", "10.250.0.0/16".parse().unwrap());
        pool.block_size = 28;
        pool.vxlan_mode = EncapMode::CrossSubnet;
        pool.nat_outgoing = true;
        pool.disable_bgp_export = true;
        pool.node_selector = "rack == 'a'".into();
        pool.allowed_uses = vec![AllowedUse::Tunnel];
        pool.assignment_mode = AssignmentMode::Manual;
        let cr = round_trip(&IpPoolCodec, "blue", &pool);
        assert_eq!(
            cr.spec,
            json!({"cidr": "10.250.0.0/16", "blockSize": 28, "vxlanMode": "CrossSubnet",
                   "ipipMode": "Never", "natOutgoing": true, "disableBGPExport": true,
                   "nodeSelector": "rack == 'a'", "allowedUses": ["Tunnel"],
                   "assignmentMode": "Manual"})
        );
        assert!(cr.annotations.is_empty());
        let v6 = IpPool::new("v6", "fd00:10:244::/48".parse().unwrap());
        round_trip(&IpPoolCodec, "v6", &v6);
    }

    #[test]
    fn calico_pools_are_read_as_they_are() {
        let mut cr = object(
            "default-ipv4-ippool",
            json!({"cidr": "10.244.0.0/16", "blockSize": 26, "ipipMode": "Never",
                   "vxlanMode": "CrossSubnet", "natOutgoing": true, "nodeSelector": "all()",
                   "someFutureField": {"x": 1}}),
        );
        cr.annotations.insert(
            "projectcalico.org/metadata".into(),
            r#"{"labels":{"team":"net"}}"#.into(),
        );
        let pool: IpPool = decoded(&IpPoolCodec, &cr);
        let mut want = IpPool::new("default-ipv4-ippool", "10.244.0.0/16".parse().unwrap());
        want.vxlan_mode = EncapMode::CrossSubnet;
        want.nat_outgoing = true;
        want.node_selector = "all()".into();
        assert_eq!(pool, want);
        // Calico's omitted fields are its defaults, which are margay's.
        let v6: IpPool = decoded(&IpPoolCodec, &object("p6", json!({"cidr": "fd00::/48"})));
        assert_eq!(v6, IpPool::new("p6", "fd00::/48".parse().unwrap()));
    }

    #[test]
    fn pool_refusals_name_the_field() {
        let refused = |spec: Value| refusal(&IpPoolCodec, &object("p", spec));
        let e = refused(json!({"cidr": "10.0.0.0/16", "blockSize": 40}));
        assert!(e.starts_with("spec.blockSize: /40 is out of range"), "{e}");
        let e = refused(json!({"cidr": "10.0.0.1/16"}));
        assert!(
            e.starts_with("spec.cidr: 10.0.0.1/16 is not a network"),
            "{e}"
        );
        let e = refused(json!({"blockSize": 26}));
        assert_eq!(e, "spec.cidr: required");
        let e = refused(json!({"cidr": "10.0.0.0/16", "vxlanMode": "Sometimes"}));
        assert!(
            e.starts_with("spec.vxlanMode: unknown variant `Sometimes`"),
            "{e}"
        );
        let e = refused(json!({"cidr": "10.0.0.0/16", "vxlanMode": "Always",
                               "ipipMode": "Always"}));
        assert!(e.starts_with("spec.ipipMode: "), "{e}");
        let e = refused(json!({"cidr": "10.0.0.0/16", "allowedUses": ["LoadBalancer"]}));
        assert!(e.starts_with("spec.allowedUses[0]: LoadBalancer"), "{e}");
        let e = refused(json!({"cidr": "10.0.0.0/16", "namespaceSelector": "team == 'a'"}));
        assert!(e.starts_with("spec.namespaceSelector: "), "{e}");
        let e = refused(json!({"cidr": "10.0.0.0/16", "natOutgoing": "yes"}));
        assert_eq!(e, "spec.natOutgoing: must be true or false, not a string");
        let err = IpPoolCodec
            .decode(&object("Bad_Name", json!({"cidr": "10.0.0.0/16"})))
            .unwrap_err();
        assert_eq!((err.kind, err.name.as_str()), ("IPPool", "Bad_Name"));
        assert!(err.reason.starts_with("metadata.name: "), "{err}");
        assert!(
            err.to_string()
                .starts_with("IPPool Bad_Name: metadata.name: ")
        );
    }

    fn full_config() -> BgpConfiguration {
        BgpConfiguration {
            as_number: 4_200_000_001,
            node_to_node_mesh: false,
            listen_port: 1179,
            keepalive_time_s: 20,
            hold_time_s: 60,
            aggregate_pools_to_external: true,
            external_transit: true,
            program_external_routes: false,
            service_cluster_ips: vec!["10.96.0.0/12".parse().unwrap()],
            service_external_ips: vec!["192.0.2.0/24".parse().unwrap()],
            service_load_balancer_ips: vec!["198.51.100.0/24".parse().unwrap()],
            communities: vec![CommunityDef {
                name: "gold".into(),
                value: "64512:100".into(),
            }],
            prefix_advertisements: vec![PrefixAdvertisement {
                cidr: "10.244.0.0/16".parse().unwrap(),
                communities: vec!["gold".into(), "64512:1:2".into()],
            }],
        }
    }

    #[test]
    fn bgp_configuration_round_trips_with_margays_settings_as_annotations() {
        let cr = round_trip(&BgpConfigurationCodec, "default", &full_config());
        assert_eq!(cr.spec["asNumber"], json!(4_200_000_001u32));
        assert_eq!(cr.spec["nodeToNodeMeshEnabled"], json!(false));
        assert_eq!(
            cr.spec["serviceClusterIPs"],
            json!([{"cidr": "10.96.0.0/12"}])
        );
        assert_eq!(
            cr.spec["prefixAdvertisements"],
            json!([{"cidr": "10.244.0.0/16", "communities": ["gold", "64512:1:2"]}])
        );
        let notes: Vec<_> = cr.annotations.keys().map(String::as_str).collect();
        assert_eq!(
            notes,
            [
                AGGREGATE_POOLS,
                EXTERNAL_TRANSIT,
                HOLD_TIME,
                KEEPALIVE_TIME,
                PROGRAM_EXTERNAL_ROUTES
            ]
        );
        // The defaults need no annotation.
        let cr = round_trip(
            &BgpConfigurationCodec,
            "default",
            &BgpConfiguration::default(),
        );
        assert!(cr.annotations.is_empty());
        // Only the cluster-wide one is margay's.
        let e = BgpConfigurationCodec
            .encode("node.a", &encode(&BgpConfiguration::default()))
            .unwrap_err();
        assert!(e.reason.starts_with("metadata.name: "), "{e}");
    }

    #[test]
    fn calicos_default_bgp_configuration_is_margays_default() {
        for spec in [
            json!({"logSeverityScreen": "Info", "nodeToNodeMeshEnabled": true,
                   "asNumber": 64512}),
            json!({}),
            Value::Null,
            json!({"bindMode": "NodeIP", "ignoredInterfaces": ["eth9"], "listenPort": 0}),
        ] {
            let c: BgpConfiguration = decoded(&BgpConfigurationCodec, &object("default", spec));
            assert_eq!(c, BgpConfiguration::default());
        }
        let c: BgpConfiguration = decoded(
            &BgpConfigurationCodec,
            &object("default", json!({"asNumber": "1.10", "listenPort": 1179})),
        );
        assert_eq!((c.as_number, c.listen_port), (65546, 1179));
        // Per-node overrides are not margay's: absent.
        let node = object("node.worker-1", json!({"listenPort": 1790}));
        assert_eq!(BgpConfigurationCodec.decode(&node).unwrap(), None);
    }

    #[test]
    fn bgp_configuration_refusals_name_the_field() {
        let refused = |spec: Value| refusal(&BgpConfigurationCodec, &object("default", spec));
        let e = refused(json!({"asNumber": 23456}));
        assert!(e.starts_with("spec.asNumber: "), "{e}");
        let e = refused(json!({"serviceClusterIPs": [{"cidr": "10.96.0.0/12"},
                                                     {"cidr": "10.96.1.0/24"}]}));
        assert!(
            e.starts_with("spec.serviceClusterIPs[1]: 10.96.1.0/24 overlaps"),
            "{e}"
        );
        let e = refused(json!({"communities": [{"name": "a", "value": "1:2:3:4"}]}));
        assert!(e.starts_with("spec.communities[0].value: "), "{e}");
        let e = refused(json!({"prefixAdvertisements": [{"cidr": "10.0.0.0/8",
                                                         "communities": ["nope"]}]}));
        assert!(
            e.starts_with("spec.prefixAdvertisements[0].communities[0]: "),
            "{e}"
        );
        let e = refused(json!({"nodeMeshPassword": {"secretKeyRef": {"name": "s", "key": "k"}}}));
        assert!(e.starts_with("spec.nodeMeshPassword: "), "{e}");
        let mut cr = object("default", json!({}));
        cr.annotations.insert(HOLD_TIME.into(), "2".into());
        let e = refusal(&BgpConfigurationCodec, &cr);
        assert!(
            e.starts_with("metadata.annotations[margay.dev/hold-time-seconds]: "),
            "{e}"
        );
        cr.annotations.insert(HOLD_TIME.into(), "soon".into());
        let e = refusal(&BgpConfigurationCodec, &cr);
        assert!(e.starts_with("metadata.annotations[margay.dev/hold-time-seconds]: \"soon\""));
    }

    fn full_peer() -> BgpPeer {
        let mut p = BgpPeer::new("tor-a", "worker-1", "192.0.2.1".parse().unwrap(), 65001);
        p.port = 1179;
        p.passive = true;
        p.ttl_security_hops = 2;
        p.keepalive_time_s = 10;
        p.hold_time_s = 30;
        p.max_prefixes = 1000;
        p.bfd = Some(BgpPeerBfd {
            min_rx_ms: 300,
            min_tx_ms: 200,
            multiplier: 3,
        });
        p.filters = vec!["only-pods".into(), "deny-all".into()];
        p.next_hop_mode = NextHopMode::SelfNextHop;
        p.local_as_number = Some(65100);
        p.num_allowed_local_as_numbers = 1;
        p.max_restart_time_s = Some(300);
        p.reachable_by = Some("192.0.2.254".parse().unwrap());
        p
    }

    #[test]
    fn peer_round_trips_in_calicos_fields() {
        let cr = round_trip(&BgpPeerCodec, "tor-a", &full_peer());
        assert_eq!(
            cr.spec,
            json!({"peerIP": "192.0.2.1:1179", "asNumber": 65001, "node": "worker-1",
                   "ttlSecurity": 2, "keepaliveTime": "10s", "nextHopMode": "Self",
                   "filters": ["only-pods", "deny-all"], "localASNumber": 65100,
                   "numAllowedLocalASNumbers": 1, "maxRestartTime": "300s",
                   "reachableBy": "192.0.2.254"})
        );
        let notes: Vec<_> = cr.annotations.keys().map(String::as_str).collect();
        assert_eq!(notes, [BFD, HOLD_TIME, MAX_PREFIXES, PASSIVE]);
        let mut v6 = BgpPeer::new("v6", "", "2001:db8::1".parse().unwrap(), 65002);
        v6.port = 179;
        v6.next_hop_mode = NextHopMode::Keep;
        let cr = round_trip(&BgpPeerCodec, "v6", &v6);
        assert_eq!(cr.spec["peerIP"], json!("[2001:db8::1]:179"));
        let plain = BgpPeer::new("plain", "", "192.0.2.9".parse().unwrap(), 65003);
        let cr = round_trip(&BgpPeerCodec, "plain", &plain);
        assert_eq!(cr.spec, json!({"peerIP": "192.0.2.9", "asNumber": 65003}));
    }

    #[test]
    fn calico_peers_are_read_as_they_are() {
        // Calico takes a port in peerIP (`<IPv4>:<port>`, `[<IPv6>]:<port>`); margay keeps it.
        let p: BgpPeer = decoded(
            &BgpPeerCodec,
            &object(
                "rack1-tor",
                json!({"peerIP": "192.0.2.1:179", "asNumber": 64513, "node": "worker-1",
                       "keepOriginalNextHop": true, "maxRestartTime": "2m0s",
                       "keepaliveTime": "1m30s", "sourceAddress": "UseNodeIP",
                       "password": {}, "nodeSelector": ""}),
            ),
        );
        let mut want = BgpPeer::new("rack1-tor", "worker-1", "192.0.2.1".parse().unwrap(), 64513);
        want.port = 179;
        want.next_hop_mode = NextHopMode::Keep;
        want.max_restart_time_s = Some(120);
        want.keepalive_time_s = 90;
        assert_eq!(p, want);
        let p: BgpPeer = decoded(
            &BgpPeerCodec,
            &object(
                "global",
                json!({"peerIP": "[2001:db8::2]:1179", "asNumber": "1.1",
                       "nodeSelector": "all()", "ttlSecurity": 1}),
            ),
        );
        assert_eq!(p.peer_address, "2001:db8::2".parse::<IpAddr>().unwrap());
        assert_eq!((p.port, p.as_number, p.ttl_security_hops), (1179, 65537, 1));
        assert!(p.node.is_empty());
    }

    #[test]
    fn peer_refusals_name_the_field() {
        let refused = |spec: Value| refusal(&BgpPeerCodec, &object("p", spec));
        let e = refused(json!({"peerSelector": "rr == 'true'", "nodeSelector": "all()"}));
        assert!(e.starts_with("spec.peerSelector: "), "{e}");
        let e =
            refused(json!({"peerIP": "192.0.2.1", "asNumber": 1, "nodeSelector": "rack == 'a'"}));
        assert!(e.starts_with("spec.nodeSelector: "), "{e}");
        let e = refused(json!({"asNumber": 1}));
        assert!(e.starts_with("spec.peerIP: required"), "{e}");
        for bad in [
            "192.0.2.1:0",
            "192.0.2.1:99999",
            "[2001:db8::1]",
            "peer.example",
        ] {
            let e = refused(json!({"peerIP": bad, "asNumber": 1}));
            assert!(e.starts_with("spec.peerIP: "), "{bad}: {e}");
        }
        let e = refused(json!({"peerIP": "192.0.2.1"}));
        assert!(e.starts_with("spec.asNumber: "), "{e}");
        let e = refused(json!({"peerIP": "192.0.2.1", "asNumber": 1,
                               "password": {"secretKeyRef": {"name": "bgp", "key": "pw"}}}));
        assert!(e.starts_with("spec.password.secretKeyRef: "), "{e}");
        let e = refused(json!({"peerIP": "192.0.2.1", "asNumber": 1,
                               "keepOriginalNextHop": true, "nextHopMode": "Self"}));
        assert!(e.starts_with("spec.keepOriginalNextHop: "), "{e}");
        let e = refused(json!({"peerIP": "192.0.2.1", "asNumber": 1, "maxRestartTime": "2h"}));
        assert!(e.starts_with("spec.maxRestartTime: "), "{e}");
        let e = refused(json!({"peerIP": "192.0.2.1", "asNumber": 1, "keepaliveTime": "soon"}));
        assert!(
            e.starts_with("spec.keepaliveTime: \"soon\" is not a duration"),
            "{e}"
        );
        let e =
            refused(json!({"peerIP": "192.0.2.1", "asNumber": 1, "reachableBy": "2001:db8::1"}));
        assert!(e.starts_with("spec.reachableBy: "), "{e}");
        let e = refused(json!({"peerIP": "192.0.2.1", "asNumber": 1, "filters": ["Bad"]}));
        assert!(e.starts_with("spec.filters[0]: "), "{e}");
        let mut cr = object("p", json!({"peerIP": "192.0.2.1", "asNumber": 1}));
        cr.annotations.insert(
            BFD.into(),
            r#"{"min_rx_ms":1,"min_tx_ms":300,"multiplier":3}"#.into(),
        );
        let e = refusal(&BgpPeerCodec, &cr);
        assert!(
            e.starts_with("metadata.annotations[margay.dev/bfd].min_rx_ms: "),
            "{e}"
        );
        // A literal password is not written into the resource.
        let mut p = full_peer();
        p.password = "s3cret".into();
        let e = BgpPeerCodec.encode("tor-a", &encode(&p)).unwrap_err();
        assert!(e.reason.starts_with("password: "), "{e}");
    }

    fn full_filter() -> BgpFilter {
        let mut in_pool = BgpFilterRule::new(FilterAction::Accept);
        in_pool.cidr = Some("10.244.0.0/16".parse().unwrap());
        in_pool.match_operator = Some(MatchOperator::In);
        in_pool.prefix_length_min = Some(24);
        in_pool.prefix_length_max = Some(32);
        let mut learned = BgpFilterRule::new(FilterAction::Reject);
        learned.source = Some(FilterSource::RemotePeers);
        learned.interface = Some("eth*".into());
        let mut v6 = BgpFilterRule::new(FilterAction::Accept);
        v6.cidr = Some("fd00::/8".parse().unwrap());
        v6.match_operator = Some(MatchOperator::NotEqual);
        BgpFilter {
            name: "only-pods".into(),
            export_v4: vec![in_pool, learned],
            import_v4: vec![BgpFilterRule::new(FilterAction::Reject)],
            export_v6: vec![],
            import_v6: vec![v6],
        }
    }

    #[test]
    fn filter_round_trips_in_calicos_fields() {
        let cr = round_trip(&BgpFilterCodec, "only-pods", &full_filter());
        assert_eq!(
            cr.spec,
            json!({
                "exportV4": [
                    {"cidr": "10.244.0.0/16", "matchOperator": "In",
                     "prefixLength": {"min": 24, "max": 32}, "action": "Accept"},
                    {"source": "RemotePeers", "interface": "eth*", "action": "Reject"}
                ],
                "importV4": [{"action": "Reject"}],
                "importV6": [{"cidr": "fd00::/8", "matchOperator": "NotEqual",
                              "action": "Accept"}]
            })
        );
        round_trip(
            &BgpFilterCodec,
            "empty",
            &BgpFilter {
                name: "empty".into(),
                ..Default::default()
            },
        );
    }

    #[test]
    fn filter_refusals_name_the_rule_and_field() {
        let refused = |spec: Value| refusal(&BgpFilterCodec, &object("f", spec));
        let e = refused(json!({"exportV4": [{"action": "Accept"},
                                            {"cidr": "10.0.0.0/8", "action": "Reject"}]}));
        assert!(
            e.starts_with("spec.exportV4[1].matchOperator: required"),
            "{e}"
        );
        let e = refused(
            json!({"importV6": [{"cidr": "10.0.0.0/8", "matchOperator": "In",
                                             "action": "Accept"}]}),
        );
        assert!(e.starts_with("spec.importV6[0].cidr: "), "{e}");
        let e = refused(json!({"exportV4": [{"peerType": "eBGP", "action": "Reject"}]}));
        assert!(e.starts_with("spec.exportV4[0].peerType: "), "{e}");
        let e = refused(json!({"exportV4": [{"action": "Accept",
                                             "operations": [{"addCommunity": {"value": "1:2"}}]}]}));
        assert!(e.starts_with("spec.exportV4[0].operations: "), "{e}");
        let e = refused(json!({"exportV4": [{"action": "Maybe"}]}));
        assert!(
            e.starts_with("spec.exportV4[0].action: unknown variant `Maybe`"),
            "{e}"
        );
        let e = refused(
            json!({"exportV4": [{"cidr": "10.0.0.0/8", "matchOperator": "In",
                                             "prefixLength": {"min": 33}, "action": "Accept"}]}),
        );
        assert!(e.starts_with("spec.exportV4[0].prefixLength.min: "), "{e}");
        let e = refused(json!({"exportV4": {"action": "Accept"}}));
        assert_eq!(e, "spec.exportV4: must be a list, not a mapping");
        // Calico's newer fields left empty are no refusal.
        let f: BgpFilter = decoded(
            &BgpFilterCodec,
            &object(
                "f",
                json!({"exportV4": [{"action": "Accept", "asPathPrefix": [],
                                               "communities": {}}]}),
            ),
        );
        assert_eq!(f.export_v4, [BgpFilterRule::new(FilterAction::Accept)]);
    }

    #[test]
    fn ipam_config_maps_calicos_block_limits() {
        let cases = [
            (
                false,
                20,
                300,
                json!({"strictAffinity": false, "autoAllocateBlocks": true}),
            ),
            (
                true,
                4,
                300,
                json!({"strictAffinity": true, "autoAllocateBlocks": true,
                                 "maxBlocksPerHost": 4}),
            ),
            (
                true,
                0,
                0,
                json!({"strictAffinity": true, "autoAllocateBlocks": false}),
            ),
        ];
        for (strict, max, grace, spec) in cases {
            let config = IpamConfig {
                strict_affinity: strict,
                max_blocks_per_host: max,
                empty_block_grace_s: grace,
            };
            let cr = round_trip(&IpamConfigCodec, "default", &config);
            assert_eq!(cr.spec, spec);
            assert_eq!(cr.annotations.contains_key(EMPTY_BLOCK_GRACE), grace != 300);
        }
        // As Calico's clients write it, and Calico's explicit default limit.
        for spec in [
            json!({"strictAffinity": false, "autoAllocateBlocks": true,
                   "kubeVirtVMAddressPersistence": "Enabled", "ipCooldownSeconds": 30}),
            json!({"strictAffinity": false, "autoAllocateBlocks": true, "maxBlocksPerHost": 20}),
            json!({}),
        ] {
            let c: IpamConfig = decoded(&IpamConfigCodec, &object("default", spec));
            assert_eq!(c, IpamConfig::default());
        }
        let c: IpamConfig = decoded(
            &IpamConfigCodec,
            &object(
                "default",
                json!({"strictAffinity": true, "autoAllocateBlocks": false,
                                       "maxBlocksPerHost": 5}),
            ),
        );
        assert_eq!((c.strict_affinity, c.max_blocks_per_host), (true, 0));
        let e = refusal(
            &IpamConfigCodec,
            &object(
                "default",
                json!({"strictAffinity": true, "autoAllocateBlocks": true,
                                       "maxBlocksPerHost": -1}),
            ),
        );
        assert!(
            e.starts_with("spec.maxBlocksPerHost: -1 is not a whole number"),
            "{e}"
        );
        assert_eq!(
            IpamConfigCodec.decode(&object("other", json!({}))).unwrap(),
            None
        );
        assert!(
            IpamConfigCodec
                .encode("other", &encode(&IpamConfig::default()))
                .is_err()
        );
    }

    #[test]
    fn go_durations_round_to_seconds() {
        for (text, s) in [
            ("0", Some(0)),
            ("90s", Some(90)),
            ("1m30s", Some(90)),
            ("2m0s", Some(120)),
            ("1h0m0s", Some(3600)),
            ("1.5s", Some(2)),
            ("1500ms", Some(2)),
            ("400ms", Some(0)),
            ("+5s", Some(5)),
            ("-5s", None),
            ("5", None),
            ("", None),
            ("s", None),
            ("5d", None),
        ] {
            assert_eq!(go_duration_s(text), s, "{text:?}");
        }
    }

    #[test]
    fn undecodable_stored_bytes_are_a_codec_error() {
        let e = IpPoolCodec.encode("p", b"not json").unwrap_err();
        assert_eq!((e.kind, e.name.as_str()), ("IPPool", "p"));
        assert!(e.reason.contains("does not decode"), "{e}");
    }
}
