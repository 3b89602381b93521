//! margay's IPAM objects (blocks, block affinities, handles) in Calico's
//! `crd.projectcalico.org/v1` shapes (`IPAMBlock`, `BlockAffinity`, `IPAMHandle`): the
//! [`CrdCodec`]s the Kubernetes datastore keeps them with, so that margay and Calico read and
//! write the same resources and a running Calico cluster's IPAM is adopted as it stands.
//!
//! Pure: no client, no I/O. Names, labels and fields follow Calico's `libcalico-go` (the
//! `names` package, `k8s/resources/ipam_*.go`, `model/block_affinity.go`). margay's fields
//! Calico has no place for travel as `margay.dev/` annotations; Calico's fields margay has no
//! place for are refused or documented where they are read.
//!
//! Why this file is long: three codecs with Calico's naming rules and every refusal of a
//! malformed block, and the tests that pin each rule.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Display;

use data_encoding::BASE32_NOPAD;
use datastore::contract::Kind;
use datastore::crd::{CodecError, CrdCodec, CrdObject};
use datastore::resource::{self, Resource};
use ipnet::IpNet;
use serde_json::{Map, Value, json};
use sha2::Digest;

use crate::block::{AffinityState, Block, BlockAffinity, Handle, Slot, cidr_key, cidr_of_key};

/// Annotation holding [`Block::pool`] (absent when it is empty).
pub const ANNOTATION_POOL: &str = "margay.dev/pool";
/// Annotation holding [`Block::emptied_at`] in unix seconds (absent when `None`).
pub const ANNOTATION_EMPTIED_AT: &str = "margay.dev/emptied-at";
/// Calico's affinity labels (v3.31+): it lists a node's affinities by the hash of its name.
pub const LABEL_HOSTNAME_HASH: &str = "projectcalico.org/hostname-hash";
pub const LABEL_AFFINITY_TYPE: &str = "projectcalico.org/affinity-type";
pub const LABEL_IP_VERSION: &str = "projectcalico.org/ip-version";
/// Slot attributes that carry the parts of a Calico allocation attribute margay has no field
/// for (KubeVirt's `alternateOwnerAttrs` as JSON text; the cool-down `releasedAt` as written),
/// so that a Calico allocation read and written back keeps them. They are not `secondary`.
pub const ATTR_ALTERNATE_OWNER: &str = "margay.dev/alternate-owner-attrs";
pub const ATTR_RELEASED_AT: &str = "margay.dev/released-at";

/// The largest block (in address bits) a codec writes or reads: Calico's pools allow 12 bits
/// (a /20 or /116); 16 (an allocation array of 65 536 entries, some 330 kB of `null`s) keeps
/// a block well within etcd's 1.5 MiB per object.
const MAX_BLOCK_BITS: u8 = 16;

/// Calico's affinity type for a node's own blocks, the only one margay has.
const AFFINITY_HOST: &str = "host";

/// The codec of [`Block`] as `IPAMBlock`.
pub struct BlockCodec;
/// The codec of [`BlockAffinity`] as `BlockAffinity`.
pub struct AffinityCodec;
/// The codec of [`Handle`] as `IPAMHandle`.
pub struct HandleCodec;

/// The three IPAM codecs, for the Kubernetes backend's registry.
pub fn codecs() -> Vec<Box<dyn CrdCodec>> {
    vec![
        Box::new(BlockCodec),
        Box::new(AffinityCodec),
        Box::new(HandleCodec),
    ]
}

/// Calico's resource name of a CIDR (`names.CIDRToName`): its text with `.`, `:` and `/`
/// turned to `-`, IPv6 compressed and lower-case (Rust's text equals Go's for every address
/// but IPv4-mapped ones, which no pool holds).
pub fn cidr_name(cidr: &IpNet) -> String {
    cidr.trunc().to_string().replace(['.', ':', '/'], "-")
}

/// Calico's `BlockAffinity` name: `<node>-<cidrname>`, and for names of 253 characters or
/// more the node cut to `252 - len(cidrname) - 13` characters, then `-<cidrname>-` and the
/// first 11 hex digits of SHA-256 of `<node>+<cidrname>` (252 characters in all).
pub fn affinity_name(node: &str, cidr: &IpNet) -> String {
    let cidrname = cidr_name(cidr);
    let name = format!("{node}-{cidrname}");
    if name.len() < 253 {
        return name;
    }
    let keep = floor_char_boundary(node, 252usize.saturating_sub(cidrname.len() + 13));
    let digest = sha2::Sha256::digest(format!("{node}+{cidrname}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{cidrname}-{}", &node[..keep], &hex[..11])
}

/// The largest char boundary of `s` at or below `at` (Go cuts bytes; node names are ASCII).
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Calico's `projectcalico.org/hostname-hash` of a node: SHA3-256 of its name in base32
/// (standard alphabet, unpadded): 52 characters, within a label value's 63.
pub fn hostname_hash(node: &str) -> String {
    BASE32_NOPAD.encode(&sha3::Sha3_256::digest(node.as_bytes()))
}

/// A refusal naming `kind`, the resource `name` and the field.
fn refuse(kind: &'static str, name: &str, field: impl Display, why: impl Display) -> CodecError {
    CodecError {
        kind,
        name: name.to_owned(),
        reason: format!("{field}: {why}"),
    }
}

/// margay's stored bytes of a `T`, or a refusal naming them.
fn margay<T: Resource>(name: &str, value: &[u8]) -> Result<T, CodecError> {
    resource::decode::<T>(value).map_err(|e| refuse(T::KIND, name, "margay value", e))
}

/// The refusal of a margay name that is not the one its value is kept under.
fn check_name(kind: &'static str, name: &str, expected: &str) -> Result<(), CodecError> {
    if name == expected {
        Ok(())
    } else {
        Err(refuse(
            kind,
            name,
            "name",
            format!("the value is named {expected:?}"),
        ))
    }
}

/// A resource's `spec` as a JSON object.
fn spec_of<'a>(
    kind: &'static str,
    object: &'a CrdObject,
) -> Result<&'a Map<String, Value>, CodecError> {
    object
        .spec
        .as_object()
        .ok_or_else(|| refuse(kind, &object.name, "spec", "not an object"))
}

/// An optional string field (`null` counts as absent).
fn opt_str<'a>(
    kind: &'static str,
    name: &str,
    spec: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, CodecError> {
    match spec.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(refuse(
            kind,
            name,
            format!("spec.{field}"),
            format!("not a string: {other}"),
        )),
    }
}

/// An optional boolean field, absent = false.
fn opt_bool(
    kind: &'static str,
    name: &str,
    spec: &Map<String, Value>,
    field: &str,
) -> Result<bool, CodecError> {
    match spec.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(refuse(
            kind,
            name,
            format!("spec.{field}"),
            format!("not a boolean: {other}"),
        )),
    }
}

/// A CIDR field, masked as Go's `ParseCIDR` does.
fn cidr_field(
    kind: &'static str,
    name: &str,
    spec: &Map<String, Value>,
) -> Result<IpNet, CodecError> {
    let text = opt_str(kind, name, spec, "cidr")?
        .ok_or_else(|| refuse(kind, name, "spec.cidr", "missing"))?;
    text.parse::<IpNet>()
        .map(|c| c.trunc())
        .map_err(|e| refuse(kind, name, "spec.cidr", format!("{text:?}: {e}")))
}

// ---------------------------------------------------------------------------------------------
// IPAMBlock

impl CrdCodec for BlockCodec {
    fn kind(&self) -> Kind {
        Block::kind()
    }

    fn crd_kind(&self) -> &'static str {
        "IPAMBlock"
    }

    fn plural(&self) -> &'static str {
        "ipamblocks"
    }

    /// `10.0.0.64-26` → `10-0-0-64-26`.
    fn resource_name(&self, name: &str) -> String {
        match cidr_of_key(name) {
            Some(cidr) => cidr_name(&cidr),
            None => name.replace(['.', ':', '/'], "-"),
        }
    }

    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        let block: Block = margay(name, value)?;
        check_name(Block::KIND, name, &cidr_key(&block.cidr))?;
        let mut annotations = BTreeMap::new();
        if !block.pool.is_empty() {
            annotations.insert(ANNOTATION_POOL.to_owned(), block.pool.clone());
        }
        if let Some(at) = block.emptied_at {
            annotations.insert(ANNOTATION_EMPTIED_AT.to_owned(), at.to_string());
        }
        Ok(CrdObject {
            name: cidr_name(&block.cidr),
            labels: BTreeMap::new(),
            annotations,
            spec: block_spec(name, &block)?,
        })
    }

    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        Ok(decode_block(object)?.map(|b| (cidr_key(&b.cidr), resource::encode(&b))))
    }
}

/// The number of addresses of a block, refusing blocks larger than [`MAX_BLOCK_BITS`].
fn block_size(cidr: &IpNet) -> Option<u32> {
    let bits = cidr.max_prefix_len() - cidr.prefix_len();
    (bits <= MAX_BLOCK_BITS).then(|| 1u32 << bits)
}

/// An `IPAMBlock` spec. Allocations with the same handle, node and attributes share one
/// attribute entry, as Calico's do; entries are numbered in ordinal order.
fn block_spec(name: &str, block: &Block) -> Result<Value, CodecError> {
    let kind = Block::KIND;
    let size = block_size(&block.cidr).ok_or_else(|| {
        refuse(
            kind,
            name,
            "cidr",
            format!("more than 2^{MAX_BLOCK_BITS} addresses"),
        )
    })?;
    if let Some(o) = block.slots.keys().chain(&block.free).find(|&&o| o >= size) {
        return Err(refuse(
            kind,
            name,
            "slots/free",
            format!("ordinal {o} outside a block of {size}"),
        ));
    }
    let mut allocations = vec![Value::Null; size as usize];
    let mut attributes = Vec::new();
    let mut shared: BTreeMap<(&str, &str, &BTreeMap<String, String>), usize> = BTreeMap::new();
    let mut seqs = Map::new();
    for (&ordinal, slot) in &block.slots {
        let key = (slot.handle.as_str(), slot.node.as_str(), &slot.attrs);
        let index = *shared.entry(key).or_insert_with(|| {
            attributes.push(attribute(slot));
            attributes.len() - 1
        });
        allocations[ordinal as usize] = json!(index);
        seqs.insert(ordinal.to_string(), json!(slot.seq));
    }
    let mut spec = json!({
        "cidr": block.cidr.trunc().to_string(),
        "allocations": allocations,
        "unallocated": block.free,
        "attributes": attributes,
        "sequenceNumber": block.seq,
        "sequenceNumberForAllocation": seqs,
        "deleted": false,
        "strictAffinity": false,
    });
    if let (Some(node), Some(obj)) = (&block.affinity, spec.as_object_mut()) {
        obj.insert("affinity".into(), json!(format!("host:{node}")));
    }
    Ok(spec)
}

/// A slot's allocation attribute: `secondary` is its attributes and `node`.
fn attribute(slot: &Slot) -> Value {
    let mut secondary: Map<String, Value> = slot
        .attrs
        .iter()
        .filter(|(k, _)| *k != ATTR_ALTERNATE_OWNER && *k != ATTR_RELEASED_AT)
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    secondary.insert("node".into(), json!(slot.node));
    let mut attr = Map::new();
    attr.insert("handle_id".into(), json!(slot.handle));
    attr.insert("secondary".into(), Value::Object(secondary));
    if let Some(Ok(alt @ Value::Object(_))) = slot
        .attrs
        .get(ATTR_ALTERNATE_OWNER)
        .map(|text| serde_json::from_str::<Value>(text))
    {
        attr.insert("alternateOwnerAttrs".into(), alt);
    }
    if let Some(at) = slot.attrs.get(ATTR_RELEASED_AT) {
        attr.insert("releasedAt".into(), json!(at));
    }
    Value::Object(attr)
}

/// A block from an `IPAMBlock`; `None` when it is marked deleted.
fn decode_block(object: &CrdObject) -> Result<Option<Block>, CodecError> {
    let (kind, name) = (Block::KIND, object.name.as_str());
    let spec = spec_of(kind, object)?;
    if opt_bool(kind, name, spec, "deleted")? {
        return Ok(None);
    }
    let cidr = cidr_field(kind, name, spec)?;
    let size = block_size(&cidr).ok_or_else(|| {
        refuse(
            kind,
            name,
            "spec.cidr",
            format!("more than 2^{MAX_BLOCK_BITS} addresses"),
        )
    })?;
    let affinity = match opt_str(kind, name, spec, "affinity")? {
        None => None,
        Some(a) => match a.split_once(':') {
            Some(("host", node)) if !node.is_empty() => Some(node.to_owned()),
            // A LoadBalancer block (Calico's virtual affinity): margay has no such blocks and
            // would lose the affinity on its first write, so it does not take the block.
            _ => {
                return Err(refuse(
                    kind,
                    name,
                    "spec.affinity",
                    format!("{a:?} is not host:<node>"),
                ));
            }
        },
    };
    let attributes = decode_attributes(name, spec)?;
    let slots = decode_slots(name, spec, size, &attributes)?;
    let free = decode_free(name, spec, size)?;
    let seq = match spec.get("sequenceNumber") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or_else(|| {
            refuse(
                kind,
                name,
                "spec.sequenceNumber",
                format!("not a sequence number: {v}"),
            )
        })?,
    };
    let pool = object
        .annotations
        .get(ANNOTATION_POOL)
        .cloned()
        .unwrap_or_default();
    let emptied_at = emptied_at(object, spec, slots.is_empty())?;
    Ok(Some(Block {
        cidr,
        pool,
        affinity,
        seq,
        slots,
        free,
        emptied_at,
    }))
}

/// One entry of `attributes`, as margay keeps it in a slot.
struct Attribute {
    handle: Option<String>,
    node: String,
    /// `secondary` (with `node`), and the reserved `margay.dev/` attributes.
    attrs: BTreeMap<String, String>,
}

fn string_map(
    name: &str,
    field: &str,
    value: &Value,
) -> Result<BTreeMap<String, String>, CodecError> {
    let bad = |why: String| refuse(Block::KIND, name, field, why);
    match value {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(bad(format!("{k:?} is not a string: {other}"))),
            })
            .collect(),
        other => Err(bad(format!("not an object: {other}"))),
    }
}

fn decode_attributes(name: &str, spec: &Map<String, Value>) -> Result<Vec<Attribute>, CodecError> {
    let kind = Block::KIND;
    let entries = match spec.get("attributes") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(refuse(
                kind,
                name,
                "spec.attributes",
                format!("not an array: {other}"),
            ));
        }
    };
    let mut out = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let field = |f: &str| format!("spec.attributes[{i}].{f}");
        let entry = entry
            .as_object()
            .ok_or_else(|| refuse(kind, name, format!("spec.attributes[{i}]"), "not an object"))?;
        let handle = match entry.get("handle_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(h)) => Some(h.clone()),
            Some(other) => {
                return Err(refuse(
                    kind,
                    name,
                    field("handle_id"),
                    format!("not a string: {other}"),
                ));
            }
        };
        let mut attrs = string_map(
            name,
            &field("secondary"),
            entry.get("secondary").unwrap_or(&Value::Null),
        )?;
        let node = attrs.get("node").cloned().unwrap_or_default();
        if let Some(alt) = entry.get("alternateOwnerAttrs").filter(|v| !v.is_null()) {
            let alt = string_map(name, &field("alternateOwnerAttrs"), alt)?;
            if !alt.is_empty() {
                let text = serde_json::to_string(&alt)
                    .map_err(|e| refuse(kind, name, field("alternateOwnerAttrs"), e))?;
                attrs.insert(ATTR_ALTERNATE_OWNER.into(), text);
            }
        }
        match entry.get("releasedAt") {
            None | Some(Value::Null) => {}
            Some(Value::String(at)) => {
                attrs.insert(ATTR_RELEASED_AT.into(), at.clone());
            }
            Some(other) => {
                return Err(refuse(
                    kind,
                    name,
                    field("releasedAt"),
                    format!("not a time: {other}"),
                ));
            }
        }
        out.push(Attribute {
            handle,
            node,
            attrs,
        });
    }
    Ok(out)
}

/// The allocated ordinals from `allocations`, with their sequence numbers (0 where Calico's
/// older blocks have none).
fn decode_slots(
    name: &str,
    spec: &Map<String, Value>,
    size: u32,
    attributes: &[Attribute],
) -> Result<BTreeMap<u32, Slot>, CodecError> {
    let kind = Block::KIND;
    let allocations = match spec.get("allocations") {
        Some(Value::Array(a)) => a,
        None | Some(Value::Null) => return Err(refuse(kind, name, "spec.allocations", "missing")),
        Some(other) => {
            return Err(refuse(
                kind,
                name,
                "spec.allocations",
                format!("not an array: {other}"),
            ));
        }
    };
    if allocations.len() != size as usize {
        return Err(refuse(
            kind,
            name,
            "spec.allocations",
            format!(
                "{} entries for a block of {size} addresses",
                allocations.len()
            ),
        ));
    }
    let seqs = match spec.get("sequenceNumberForAllocation") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => {
            return Err(refuse(
                kind,
                name,
                "spec.sequenceNumberForAllocation",
                format!("not an object: {other}"),
            ));
        }
    };
    let mut slots = BTreeMap::new();
    for (ordinal, entry) in (0..size).zip(allocations) {
        if entry.is_null() {
            continue;
        }
        let field = format!("spec.allocations[{ordinal}]");
        let attr = entry
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| attributes.get(i).map(|a| (i, a)));
        let Some((index, attr)) = attr else {
            let why = format!(
                "{entry} is not an index of the {} attributes",
                attributes.len()
            );
            return Err(refuse(kind, name, field, why));
        };
        let Some(handle) = &attr.handle else {
            let why = format!("allocated ordinal {ordinal} has no handle");
            return Err(refuse(
                kind,
                name,
                format!("spec.attributes[{index}].handle_id"),
                why,
            ));
        };
        let seq = match seqs.and_then(|m| m.get(&ordinal.to_string())) {
            None | Some(Value::Null) => 0,
            Some(v) => v.as_u64().ok_or_else(|| {
                let field = format!("spec.sequenceNumberForAllocation[{ordinal}]");
                refuse(kind, name, field, format!("not a sequence number: {v}"))
            })?,
        };
        let slot = Slot {
            handle: handle.clone(),
            node: attr.node.clone(),
            seq,
            attrs: attr.attrs.clone(),
        };
        slots.insert(ordinal, slot);
    }
    Ok(slots)
}

/// The free ordinals from `unallocated`, in order. Duplicates, ordinals also allocated and
/// free ordinals missing from it pass through: margay's `check` reports them, as Calico's
/// does (refusing the block would hide it and its allocations), and the allocator never
/// hands out one that is allocated (`Block::allocate`).
fn decode_free(
    name: &str,
    spec: &Map<String, Value>,
    size: u32,
) -> Result<VecDeque<u32>, CodecError> {
    let kind = Block::KIND;
    let entries = match spec.get("unallocated") {
        None | Some(Value::Null) => return Ok(VecDeque::new()),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(refuse(
                kind,
                name,
                "spec.unallocated",
                format!("not an array: {other}"),
            ));
        }
    };
    let mut free = VecDeque::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("spec.unallocated[{i}]");
        let ordinal = entry
            .as_u64()
            .and_then(|o| u32::try_from(o).ok())
            .filter(|&o| o < size)
            .ok_or_else(|| {
                refuse(
                    kind,
                    name,
                    &field,
                    format!("{entry} is not an ordinal of a block of {size}"),
                )
            })?;
        free.push_back(ordinal);
    }
    Ok(free)
}

/// [`Block::emptied_at`]: `None` while the block holds addresses; else margay's annotation,
/// else Calico's `affinityClaimTime`, else 0 (empty since long ago).
fn emptied_at(
    object: &CrdObject,
    spec: &Map<String, Value>,
    empty: bool,
) -> Result<Option<u64>, CodecError> {
    if !empty {
        return Ok(None);
    }
    if let Some(at) = object.annotations.get(ANNOTATION_EMPTIED_AT) {
        let field = format!("metadata.annotations[{ANNOTATION_EMPTIED_AT}]");
        return at
            .parse::<u64>()
            .map(Some)
            .map_err(|e| refuse(Block::KIND, &object.name, field, format!("{at:?}: {e}")));
    }
    let claimed = match spec.get("affinityClaimTime") {
        Some(Value::String(t)) => parse_rfc3339(t),
        _ => None,
    };
    Ok(Some(claimed.unwrap_or(0)))
}

/// Unix seconds of an RFC 3339 time (`2026-05-01T10:00:00Z`, `…05.1+02:00`); `None` for other
/// text or times before 1970.
fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let digits = |from: usize, n: usize| -> Option<i64> {
        let part = b.get(from..from + n)?;
        part.iter().try_fold(0i64, |acc, &c| {
            c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0'))
        })
    };
    let seps = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if seps.iter().any(|&(i, c)| b.get(i) != Some(&c))
        || !matches!(b.get(10), Some(b'T' | b't' | b' '))
    {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (hour, minute, second) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = b.get(19..)?;
    if rest.first() == Some(&b'.') {
        let n = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        rest = &rest[1 + n..];
    }
    let offset = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let num = |x: u8, y: u8| -> Option<i64> {
                (x.is_ascii_digit() && y.is_ascii_digit())
                    .then(|| i64::from(x - b'0') * 10 + i64::from(y - b'0'))
            };
            let secs = num(*h1, *h2)? * 3600 + num(*m1, *m2)? * 60;
            if *sign == b'+' { secs } else { -secs }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    u64::try_from(secs).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

// ---------------------------------------------------------------------------------------------
// BlockAffinity

impl AffinityCodec {
    /// margay's name of an affinity: `<node>/<cidr_key>`.
    fn margay_name(node: &str, cidr: &IpNet) -> String {
        format!("{node}/{}", cidr_key(cidr))
    }
}

fn state_text(state: AffinityState) -> &'static str {
    match state {
        AffinityState::Pending => "pending",
        AffinityState::Confirmed => "confirmed",
        AffinityState::PendingDeletion => "pendingDeletion",
    }
}

/// Go's `strconv.ParseBool`, with "" = false (Calico's reading of `deleted`).
fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "" | "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        _ => None,
    }
}

impl CrdCodec for AffinityCodec {
    fn kind(&self) -> Kind {
        BlockAffinity::kind()
    }

    fn crd_kind(&self) -> &'static str {
        "BlockAffinity"
    }

    fn plural(&self) -> &'static str {
        "blockaffinities"
    }

    /// `worker-2/10.0.0.64-26` → `worker-2-10-0-0-64-26` (shortened with a hash when long).
    fn resource_name(&self, name: &str) -> String {
        match name
            .rsplit_once('/')
            .and_then(|(node, key)| Some((node, cidr_of_key(key)?)))
        {
            Some((node, cidr)) => affinity_name(node, &cidr),
            None => name.replace(['.', ':', '/'], "-"),
        }
    }

    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        let aff: BlockAffinity = margay(name, value)?;
        check_name(
            BlockAffinity::KIND,
            name,
            &Self::margay_name(&aff.node, &aff.cidr),
        )?;
        let cidr = aff.cidr.trunc();
        let version = if cidr.addr().is_ipv4() { "4" } else { "6" };
        let labels = BTreeMap::from([
            (LABEL_HOSTNAME_HASH.to_owned(), hostname_hash(&aff.node)),
            (LABEL_AFFINITY_TYPE.to_owned(), AFFINITY_HOST.to_owned()),
            (LABEL_IP_VERSION.to_owned(), version.to_owned()),
        ]);
        Ok(CrdObject {
            name: affinity_name(&aff.node, &cidr),
            labels,
            annotations: BTreeMap::new(),
            spec: json!({
                "state": state_text(aff.state),
                "node": aff.node,
                "cidr": cidr.to_string(),
                "type": AFFINITY_HOST,
                "deleted": "false",
            }),
        })
    }

    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        let (kind, name) = (BlockAffinity::KIND, object.name.as_str());
        let spec = spec_of(kind, object)?;
        let deleted = match spec.get("deleted") {
            None | Some(Value::Null) => false,
            // `projectcalico.org/v3` CRDs (Calico v3.32+) have a boolean.
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => parse_go_bool(s).ok_or_else(|| {
                refuse(
                    kind,
                    name,
                    "spec.deleted",
                    format!("{s:?} is not a boolean"),
                )
            })?,
            Some(other) => {
                return Err(refuse(
                    kind,
                    name,
                    "spec.deleted",
                    format!("not a boolean: {other}"),
                ));
            }
        };
        if deleted {
            return Ok(None);
        }
        match opt_str(kind, name, spec, "type")? {
            None | Some("" | AFFINITY_HOST) => {}
            // LoadBalancer affinities: margay has none, and hiding them would lose them.
            Some(other) => {
                return Err(refuse(
                    kind,
                    name,
                    "spec.type",
                    format!("{other:?} is not host"),
                ));
            }
        }
        let state = match opt_str(kind, name, spec, "state")? {
            // Calico treats an affinity without a state (older data) as confirmed.
            None | Some("" | "confirmed") => AffinityState::Confirmed,
            Some("pending") => AffinityState::Pending,
            Some("pendingDeletion") => AffinityState::PendingDeletion,
            Some(other) => {
                return Err(refuse(
                    kind,
                    name,
                    "spec.state",
                    format!("unknown state {other:?}"),
                ));
            }
        };
        let node = opt_str(kind, name, spec, "node")?.unwrap_or_default();
        if node.is_empty() || node.contains('/') {
            return Err(refuse(
                kind,
                name,
                "spec.node",
                format!("{node:?} is not a node name"),
            ));
        }
        let cidr = cidr_field(kind, name, spec)?;
        let aff = BlockAffinity {
            node: node.to_owned(),
            cidr,
            state,
        };
        Ok(Some((
            Self::margay_name(node, &cidr),
            resource::encode(&aff),
        )))
    }

    /// No selector: a node's affinities are found by their names after decoding. Calico's
    /// hostname-hash label would narrow the list, but rows Calico wrote before v3.31 carry no
    /// labels until a Calico component of their node relabels them, and on a cluster margay
    /// adopted no such component may be left: a release or a GC that missed them would leave
    /// blocks affine to a node that is gone.
    fn selector(&self, _name_prefix: &str) -> Option<String> {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// IPAMHandle

impl CrdCodec for HandleCodec {
    fn kind(&self) -> Kind {
        Handle::kind()
    }

    fn crd_kind(&self) -> &'static str {
        "IPAMHandle"
    }

    fn plural(&self) -> &'static str {
        "ipamhandles"
    }

    /// The handle ID in lower case (the spec keeps it as it is).
    fn resource_name(&self, name: &str) -> String {
        name.to_lowercase()
    }

    fn encode(&self, name: &str, value: &[u8]) -> Result<CrdObject, CodecError> {
        let handle: Handle = margay(name, value)?;
        check_name(Handle::KIND, name, &handle.id)?;
        Ok(CrdObject {
            name: handle.id.to_lowercase(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            spec: json!({
                "handleID": handle.id,
                "block": handle.blocks,
                "deleted": false,
            }),
        })
    }

    fn decode(&self, object: &CrdObject) -> Result<Option<(String, Vec<u8>)>, CodecError> {
        let (kind, name) = (Handle::KIND, object.name.as_str());
        let spec = spec_of(kind, object)?;
        if opt_bool(kind, name, spec, "deleted")? {
            return Ok(None);
        }
        let id = opt_str(kind, name, spec, "handleID")?
            .filter(|id| !id.is_empty())
            .ok_or_else(|| refuse(kind, name, "spec.handleID", "missing"))?;
        let blocks = match spec.get("block") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(cidr, n)| {
                    let count =
                        n.as_u64()
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| {
                                refuse(
                                    kind,
                                    name,
                                    format!("spec.block[{cidr}]"),
                                    format!("not a count: {n}"),
                                )
                            })?;
                    Ok((cidr.clone(), count))
                })
                .collect::<Result<_, CodecError>>()?,
            Some(other) => {
                return Err(refuse(
                    kind,
                    name,
                    "spec.block",
                    format!("not an object: {other}"),
                ));
            }
        };
        let handle = Handle {
            id: id.to_owned(),
            blocks,
        };
        Ok(Some((handle.id.clone(), resource::encode(&handle))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// A block with two addresses of one pod on `node`, a tunnel address, two addresses
    /// borrowed by another node of which one is released again (the free list is then out of
    /// ordinal order).
    fn busy_block(cidr: &str, node: &str) -> Block {
        let mut b = Block::new(cidr.parse().unwrap(), "pool-a", Some(node), 100);
        let web = attrs(&[("node", node), ("namespace", "shop"), ("pod", "web-0")]);
        b.allocate(2, "k8s-pod-network.aaa", node, &web);
        let tunnel = attrs(&[("node", node), ("type", "ipipTunnelAddress")]);
        b.allocate(1, &format!("ipip-tunnel-addr-{node}"), node, &tunnel);
        let other = attrs(&[("node", "worker-9"), ("namespace", "shop"), ("pod", "db-0")]);
        b.allocate(2, "k8s-pod-network.bbb", "worker-9", &other);
        let third = b.address(3);
        b.release(third, None, None, 200);
        b
    }

    fn round_trip_block(b: &Block) -> CrdObject {
        let name = cidr_key(&b.cidr);
        let obj = BlockCodec.encode(&name, &resource::encode(b)).unwrap();
        let (back_name, bytes) = BlockCodec.decode(&obj).unwrap().unwrap();
        assert_eq!(back_name, name);
        assert_eq!(&resource::decode::<Block>(&bytes).unwrap(), b);
        obj
    }

    #[test]
    fn a_v4_block_round_trips_in_calicos_shape() {
        let b = busy_block("10.0.0.64/26", "worker-2");
        let obj = round_trip_block(&b);
        assert_eq!(obj.name, "10-0-0-64-26");
        assert_eq!(BlockCodec.resource_name("10.0.0.64-26"), "10-0-0-64-26");
        assert_eq!(obj.annotations[ANNOTATION_POOL], "pool-a");
        assert!(!obj.annotations.contains_key(ANNOTATION_EMPTIED_AT));
        let s = &obj.spec;
        assert_eq!(s["cidr"], "10.0.0.64/26");
        assert_eq!(s["affinity"], "host:worker-2");
        assert_eq!(s["allocations"].as_array().unwrap().len(), 64);
        assert_eq!(s["allocations"][0], 0);
        assert_eq!(
            s["allocations"][1], 0,
            "one handle, node and attributes: one entry"
        );
        assert_eq!(s["allocations"][2], 1);
        assert_eq!(s["allocations"][3], Value::Null, "released");
        assert_eq!(s["allocations"][4], 2, "borrowed by worker-9");
        assert_eq!(s["allocations"][5], Value::Null);
        assert_eq!(s["attributes"].as_array().unwrap().len(), 3);
        assert_eq!(
            s["attributes"][0],
            json!({"handle_id": "k8s-pod-network.aaa",
                   "secondary": {"node": "worker-2", "namespace": "shop", "pod": "web-0"}})
        );
        assert_eq!(s["attributes"][2]["secondary"]["node"], "worker-9");
        let unallocated: Vec<u64> = s["unallocated"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(unallocated.len(), 60);
        assert_eq!(unallocated[..2], [5, 6]);
        assert_eq!(
            unallocated.last(),
            Some(&3),
            "released last: the FIFO's tail"
        );
        assert_eq!(s["sequenceNumber"], 4);
        assert_eq!(
            s["sequenceNumberForAllocation"],
            json!({"0": 1, "1": 1, "2": 2, "4": 3})
        );
        assert_eq!(s["deleted"], false);
        assert_eq!(s["strictAffinity"], false);
        assert!(s.get("affinityClaimTime").is_none());
    }

    #[test]
    fn a_v6_block_round_trips_with_calicos_name() {
        let b = busy_block("fd00:10:244::/122", "worker-2");
        let obj = round_trip_block(&b);
        assert_eq!(obj.name, "fd00-10-244---122");
        assert_eq!(obj.spec["cidr"], "fd00:10:244::/122");
        assert_eq!(obj.spec["allocations"].as_array().unwrap().len(), 64);
        assert_eq!(
            BlockCodec.resource_name("fd00:10:244::-122"),
            "fd00-10-244---122"
        );
    }

    #[test]
    fn calico_names_of_ipv6_blocks() {
        for (cidr, name) in [
            ("fd00:10:244::/122", "fd00-10-244---122"),
            ("2001:db8::40/122", "2001-db8--40-122"),
            ("fd00:0:0:1::1c0/122", "fd00-0-0-1--1c0-122"),
            ("FD00:10:244:0:1:2:3:40/122", "fd00-10-244-0-1-2-3-40-122"),
        ] {
            assert_eq!(cidr_name(&cidr.parse().unwrap()), name, "{cidr}");
        }
    }

    #[test]
    fn empty_unaffine_and_unpooled_blocks_round_trip() {
        let b = Block::new("10.0.1.0/26".parse().unwrap(), "", None, 1234);
        let obj = round_trip_block(&b);
        assert!(obj.spec.get("affinity").is_none());
        assert_eq!(
            obj.annotations
                .get(ANNOTATION_EMPTIED_AT)
                .map(String::as_str),
            Some("1234")
        );
        assert!(!obj.annotations.contains_key(ANNOTATION_POOL));
        assert_eq!(obj.spec["attributes"], json!([]));
        assert_eq!(obj.spec["sequenceNumberForAllocation"], json!({}));
    }

    #[test]
    fn attributes_are_shared_only_when_handle_node_and_attributes_all_match() {
        let mut b = Block::new("10.0.0.0/29".parse().unwrap(), "p", Some("n1"), 0);
        let a = attrs(&[("pod", "p")]);
        b.allocate(2, "h", "n1", &a);
        b.allocate(1, "h", "n1", &a); // the same again, later: shares
        b.allocate(1, "h", "n2", &a); // another node
        b.allocate(1, "h", "n1", &attrs(&[("pod", "q")])); // other attributes
        b.allocate(1, "g", "n1", &a); // another handle
        let obj = BlockCodec
            .encode("10.0.0.0-29", &resource::encode(&b))
            .unwrap();
        assert_eq!(
            obj.spec["allocations"],
            json!([0, 0, 0, 1, 2, 3, null, null])
        );
        assert_eq!(
            obj.spec["attributes"],
            json!([
                {"handle_id": "h", "secondary": {"node": "n1", "pod": "p"}},
                {"handle_id": "h", "secondary": {"node": "n2", "pod": "p"}},
                {"handle_id": "h", "secondary": {"node": "n1", "pod": "q"}},
                {"handle_id": "g", "secondary": {"node": "n1", "pod": "p"}},
            ])
        );
        // Read back, every ordinal has its own slot again (with `node` among its attributes).
        let (_, bytes) = BlockCodec.decode(&obj).unwrap().unwrap();
        let back = resource::decode::<Block>(&bytes).unwrap();
        let owners: Vec<_> = back
            .slots
            .values()
            .map(|s| (s.handle.as_str(), s.node.as_str(), s.seq))
            .collect();
        assert_eq!(
            owners,
            [
                ("h", "n1", 1),
                ("h", "n1", 1),
                ("h", "n1", 2),
                ("h", "n2", 3),
                ("h", "n1", 4),
                ("g", "n1", 5)
            ]
        );
        assert_eq!(back.slots[&3].attrs, attrs(&[("node", "n2"), ("pod", "p")]));
    }

    #[test]
    fn a_slots_node_is_among_its_attributes_once_read() {
        // margay's CNI records `node` among the attributes; other callers may not.
        let mut b = Block::new("10.0.0.0/30".parse().unwrap(), "p", Some("n1"), 0);
        b.allocate(1, "h", "n1", &BTreeMap::new());
        let obj = BlockCodec
            .encode("10.0.0.0-30", &resource::encode(&b))
            .unwrap();
        assert_eq!(
            obj.spec["attributes"][0]["secondary"],
            json!({"node": "n1"})
        );
        let (_, bytes) = BlockCodec.decode(&obj).unwrap().unwrap();
        let back = resource::decode::<Block>(&bytes).unwrap();
        assert_eq!(back.slots[&0].node, "n1");
        assert_eq!(back.slots[&0].attrs, attrs(&[("node", "n1")]));
    }

    /// The reference's example of a Calico-written block, at its full 64 addresses, with
    /// ordinal 2's sequence number missing (older Calico) and a claim time.
    const CALICO_BLOCK: &str = r#"{
        "cidr": "10.244.7.64/26",
        "affinity": "host:worker-2",
        "affinityClaimTime": "2026-05-01T10:00:00Z",
        "allocations": [0, null, 1, null, null, null, null, null, null, null, null, null, null,
            null, null, null, null, null, null, null, null, null, null, null, null, null, null,
            null, null, null, null, null, null, null, null, null, null, null, null, null, null,
            null, null, null, null, null, null, null, null, null, null, null, null, null, null,
            null, null, null, null, null, null, null, null, null],
        "unallocated": [3, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
            22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42,
            43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63],
        "attributes": [
            {"handle_id": "ipip-tunnel-addr-worker-2",
             "secondary": {"node": "worker-2", "type": "ipipTunnelAddress"}},
            {"handle_id": "k8s-pod-network.0a1b2c",
             "secondary": {"namespace": "shop", "pod": "web-0", "node": "worker-2",
                           "timestamp": "2026-05-01 10:00:05.1 +0000 UTC"}}
        ],
        "sequenceNumber": 1777629600000000042,
        "sequenceNumberForAllocation": {"0": 1777629600000000001},
        "deleted": false,
        "strictAffinity": false
    }"#;

    fn calico_block(spec: Value) -> CrdObject {
        CrdObject {
            name: "10-244-7-64-26".into(),
            spec,
            ..Default::default()
        }
    }

    fn decode_calico(spec: Value) -> Result<Option<Block>, CodecError> {
        BlockCodec
            .decode(&calico_block(spec))
            .map(|o| o.map(|(_, bytes)| resource::decode::<Block>(&bytes).unwrap()))
    }

    #[test]
    fn a_calico_written_block_is_read_as_it_is() {
        let spec: Value = serde_json::from_str(CALICO_BLOCK).unwrap();
        let (name, bytes) = BlockCodec
            .decode(&calico_block(spec.clone()))
            .unwrap()
            .unwrap();
        assert_eq!(name, "10.244.7.64-26");
        let b = resource::decode::<Block>(&bytes).unwrap();
        assert_eq!(b.cidr, "10.244.7.64/26".parse::<IpNet>().unwrap());
        assert_eq!(b.affinity.as_deref(), Some("worker-2"));
        assert_eq!(b.pool, "", "the allocator resolves the pool from the CIDR");
        assert_eq!(b.seq, 1_777_629_600_000_000_042);
        assert_eq!(b.emptied_at, None);
        let tunnel = Slot {
            handle: "ipip-tunnel-addr-worker-2".into(),
            node: "worker-2".into(),
            seq: 1_777_629_600_000_000_001,
            attrs: attrs(&[("node", "worker-2"), ("type", "ipipTunnelAddress")]),
        };
        let pod = Slot {
            handle: "k8s-pod-network.0a1b2c".into(),
            node: "worker-2".into(),
            seq: 0,
            attrs: attrs(&[
                ("namespace", "shop"),
                ("pod", "web-0"),
                ("node", "worker-2"),
                ("timestamp", "2026-05-01 10:00:05.1 +0000 UTC"),
            ]),
        };
        assert_eq!(b.slots, BTreeMap::from([(0, tunnel), (2, pod)]));
        let mut free = vec![3, 1];
        free.extend(4..64);
        assert_eq!(Vec::from(b.free.clone()), free);

        // Written back, it is the same block but for what margay does not keep (the claim
        // time) and the sequence number it read as 0.
        let again = BlockCodec.encode(&name, &bytes).unwrap();
        assert_eq!(again.name, "10-244-7-64-26");
        let mut expected = spec;
        let obj = expected.as_object_mut().unwrap();
        obj.remove("affinityClaimTime");
        obj["sequenceNumberForAllocation"]["2"] = json!(0);
        assert_eq!(again.spec, expected);
    }

    #[test]
    fn an_empty_calico_block_was_emptied_when_it_was_claimed() {
        let mut spec: Value = serde_json::from_str(CALICO_BLOCK).unwrap();
        spec["allocations"] = Value::Array(vec![Value::Null; 64]);
        spec["unallocated"] = json!((0..64).collect::<Vec<u32>>());
        spec["attributes"] = json!([]);
        assert_eq!(
            decode_calico(spec.clone()).unwrap().unwrap().emptied_at,
            Some(1_777_629_600)
        );
        spec["affinityClaimTime"] = json!("not a time");
        assert_eq!(
            decode_calico(spec.clone()).unwrap().unwrap().emptied_at,
            Some(0)
        );
        spec.as_object_mut().unwrap().remove("affinityClaimTime");
        assert_eq!(
            decode_calico(spec.clone()).unwrap().unwrap().emptied_at,
            Some(0)
        );
        let mut obj = calico_block(spec);
        obj.annotations
            .insert(ANNOTATION_EMPTIED_AT.into(), "77".into());
        obj.annotations
            .insert(ANNOTATION_POOL.into(), "pool-a".into());
        let (_, bytes) = BlockCodec.decode(&obj).unwrap().unwrap();
        let b = resource::decode::<Block>(&bytes).unwrap();
        assert_eq!((b.emptied_at, b.pool.as_str()), (Some(77), "pool-a"));
        obj.annotations
            .insert(ANNOTATION_EMPTIED_AT.into(), "soon".into());
        let err = BlockCodec.decode(&obj).unwrap_err();
        assert!(err.reason.contains(ANNOTATION_EMPTIED_AT), "{err}");
    }

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_rfc3339("2026-05-01T10:00:00Z"), Some(1_777_629_600));
        assert_eq!(
            parse_rfc3339("2026-05-01T12:00:05.1+02:00"),
            Some(1_777_629_605)
        );
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Some(951_782_400));
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), None);
        assert_eq!(parse_rfc3339("2026-05-01 10:00:05.1 +0000 UTC"), None);
        assert_eq!(parse_rfc3339("2026-13-01T10:00:00Z"), None);
        assert_eq!(parse_rfc3339(""), None);
    }

    /// The refusal of a Calico block changed by `change`: it names `field`.
    fn refused(change: impl FnOnce(&mut Value), field: &str) {
        let mut spec: Value = serde_json::from_str(CALICO_BLOCK).unwrap();
        change(&mut spec);
        let err = decode_calico(spec).unwrap_err();
        assert_eq!(err.kind, "IPAMBlock");
        assert_eq!(err.name, "10-244-7-64-26");
        assert!(err.reason.starts_with(field), "{field}: {err}");
    }

    #[test]
    fn an_ordinal_both_allocated_and_unallocated_is_read_as_it_is_for_check_to_report() {
        let mut spec: Value = serde_json::from_str(CALICO_BLOCK).unwrap();
        spec["allocations"][1] = json!(0);
        let block = decode_calico(spec).unwrap().unwrap();
        assert!(
            block.slots.contains_key(&1) && block.free.contains(&1),
            "{block:?}"
        );
    }

    #[test]
    fn malformed_blocks_are_refused_naming_the_field() {
        refused(
            |s| s["allocations"].as_array_mut().unwrap().truncate(63),
            "spec.allocations:",
        );
        refused(|s| s["allocations"][2] = json!(2), "spec.allocations[2]:");
        refused(|s| s["allocations"][2] = json!(-1), "spec.allocations[2]:");
        refused(|s| s["unallocated"][5] = json!(64), "spec.unallocated[5]:");
        refused(|s| s["cidr"] = json!("10.244.7.64/33"), "spec.cidr:");
        refused(|s| s["cidr"] = json!("worker-2"), "spec.cidr:");
        refused(
            |s| {
                s.as_object_mut()
                    .unwrap()
                    .remove("cidr")
                    .map(drop)
                    .unwrap_or(())
            },
            "spec.cidr:",
        );
        refused(
            |s| {
                s["attributes"][1]
                    .as_object_mut()
                    .unwrap()
                    .remove("handle_id")
                    .map(drop)
                    .unwrap_or(())
            },
            "spec.attributes[1].handle_id:",
        );
        refused(|s| s["affinity"] = json!("virtual:lb"), "spec.affinity:");
        refused(|s| s["affinity"] = json!("worker-2"), "spec.affinity:");
        refused(
            |s| s["attributes"][0]["secondary"]["node"] = json!(7),
            "spec.attributes[0].secondary:",
        );
        refused(
            |s| s["sequenceNumber"] = json!("many"),
            "spec.sequenceNumber:",
        );
        refused(
            |s| s["sequenceNumberForAllocation"]["0"] = json!(-3),
            "spec.sequenceNumberForAllocation[0]:",
        );
        // An unreferenced attribute needs no handle (Calico leaves none, but tolerates it).
        let mut spec: Value = serde_json::from_str(CALICO_BLOCK).unwrap();
        spec["attributes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"secondary": {"node": "x"}}));
        assert!(decode_calico(spec).is_ok());
    }

    #[test]
    fn deleted_resources_stand_for_nothing() {
        let mut spec: Value = serde_json::from_str(CALICO_BLOCK).unwrap();
        spec["deleted"] = json!(true);
        assert_eq!(decode_calico(spec).unwrap(), None);
        let aff = affinity_object(
            json!({"state": "confirmed", "node": "n", "cidr": "10.0.0.0/26", "deleted": "true"}),
        );
        assert_eq!(AffinityCodec.decode(&aff).unwrap(), None);
        let handle = CrdObject {
            name: "h".into(),
            spec: json!({"handleID": "h", "block": {"10.0.0.0/26": 1}, "deleted": true}),
            ..Default::default()
        };
        assert_eq!(HandleCodec.decode(&handle).unwrap(), None);
    }

    #[test]
    fn margay_values_that_do_not_decode_are_refused() {
        for codec in codecs() {
            let err = codec.encode("x", b"not json").unwrap_err();
            assert!(err.reason.starts_with("margay value:"), "{err}");
            assert_eq!(err.kind, codec.kind().name);
        }
        let b = Block::new("10.0.0.0/26".parse().unwrap(), "p", None, 0);
        let err = BlockCodec
            .encode("10.0.0.64-26", &resource::encode(&b))
            .unwrap_err();
        assert!(err.reason.starts_with("name:"), "{err}");
    }

    #[test]
    fn damaged_margay_blocks_are_not_written() {
        let mut b = Block::new("10.0.0.0/30".parse().unwrap(), "p", None, 0);
        b.free.push_back(9);
        let err = BlockCodec
            .encode("10.0.0.0-30", &resource::encode(&b))
            .unwrap_err();
        assert!(err.reason.contains("ordinal 9"), "{err}");
    }

    #[test]
    fn calico_attribute_extras_survive_a_round_trip() {
        let mut spec: Value = serde_json::from_str(CALICO_BLOCK).unwrap();
        spec["attributes"][1]["alternateOwnerAttrs"] =
            json!({"pod": "virt-launcher-b", "namespace": "shop"});
        spec["attributes"][1]["releasedAt"] = json!("2026-05-01T10:05:00Z");
        let (name, bytes) = BlockCodec
            .decode(&calico_block(spec.clone()))
            .unwrap()
            .unwrap();
        let b = resource::decode::<Block>(&bytes).unwrap();
        assert_eq!(b.slots[&2].attrs[ATTR_RELEASED_AT], "2026-05-01T10:05:00Z");
        let again = BlockCodec.encode(&name, &bytes).unwrap();
        assert_eq!(again.spec["attributes"][1], spec["attributes"][1]);
    }

    fn affinity_object(spec: Value) -> CrdObject {
        CrdObject {
            name: "whatever".into(),
            spec,
            ..Default::default()
        }
    }

    #[test]
    fn affinities_round_trip_with_calicos_labels() {
        for (cidr, state, version) in [
            ("10.0.0.64/26", AffinityState::Pending, "4"),
            ("10.0.0.128/26", AffinityState::Confirmed, "4"),
            ("fd00:10:244::/122", AffinityState::PendingDeletion, "6"),
        ] {
            let aff = BlockAffinity {
                node: "worker-2".into(),
                cidr: cidr.parse().unwrap(),
                state,
            };
            let name = BlockAffinity::key_of(&aff.node, &aff.cidr)
                .strip_prefix(BlockAffinity::PREFIX)
                .unwrap()
                .to_owned();
            let obj = AffinityCodec
                .encode(&name, &resource::encode(&aff))
                .unwrap();
            assert_eq!(obj.name, AffinityCodec.resource_name(&name));
            assert_eq!(obj.name, format!("worker-2-{}", cidr_name(&aff.cidr)));
            assert_eq!(obj.spec["node"], "worker-2");
            assert_eq!(obj.spec["cidr"], cidr);
            assert_eq!(obj.spec["type"], "host");
            assert_eq!(obj.spec["deleted"], "false");
            assert_eq!(
                obj.labels[LABEL_HOSTNAME_HASH],
                "53WSO6MBY4ZPU6KG6FI4VASUYQ3HFBO7TQGX7PRHXADNUR67KKUA"
            );
            assert_eq!(obj.labels[LABEL_AFFINITY_TYPE], "host");
            assert_eq!(obj.labels[LABEL_IP_VERSION], version);
            let (back, bytes) = AffinityCodec.decode(&obj).unwrap().unwrap();
            assert_eq!(back, name);
            assert_eq!(resource::decode::<BlockAffinity>(&bytes).unwrap(), aff);
        }
        assert_eq!(
            AffinityCodec.resource_name("worker-2/10.0.0.64-26"),
            "worker-2-10-0-0-64-26"
        );
    }

    #[test]
    fn calico_written_affinities_are_read() {
        let read = |spec: Value| {
            AffinityCodec
                .decode(&affinity_object(spec))
                .map(|o| o.map(|(n, b)| (n, resource::decode::<BlockAffinity>(&b).unwrap().state)))
        };
        // Before v3.30 there is no type; very old rows have no state (Calico: confirmed).
        let old = json!({"node": "worker-2", "cidr": "10.244.7.64/26", "deleted": "false"});
        assert_eq!(
            read(old).unwrap(),
            Some(("worker-2/10.244.7.64-26".into(), AffinityState::Confirmed))
        );
        let v3 = json!({"state": "pending", "node": "n", "cidr": "10.0.0.0/26", "type": "host", "deleted": false});
        assert_eq!(
            read(v3).unwrap(),
            Some(("n/10.0.0.0-26".into(), AffinityState::Pending))
        );
        let refusals = [
            (
                json!({"state": "confirmed", "node": "lb", "cidr": "10.0.0.0/26", "type": "virtual", "deleted": "false"}),
                "spec.type:",
            ),
            (
                json!({"state": "claimed", "node": "n", "cidr": "10.0.0.0/26", "deleted": "false"}),
                "spec.state:",
            ),
            (
                json!({"state": "confirmed", "node": "n", "cidr": "10.0.0.0/26", "deleted": "maybe"}),
                "spec.deleted:",
            ),
            (
                json!({"state": "confirmed", "cidr": "10.0.0.0/26", "deleted": "false"}),
                "spec.node:",
            ),
            (
                json!({"state": "confirmed", "node": "n", "cidr": "ten", "deleted": "false"}),
                "spec.cidr:",
            ),
        ];
        for (spec, field) in refusals {
            let err = read(spec).unwrap_err();
            assert_eq!(err.kind, "BlockAffinity");
            assert!(err.reason.starts_with(field), "{field}: {err}");
        }
    }

    #[test]
    fn long_affinity_names_are_cut_and_hashed_as_calico_does() {
        let cidr: IpNet = "10.0.0.64/26".parse().unwrap();
        // 239 + 1 + 12 = 252 characters: kept whole.
        let node = format!("rack-7-{}", "a".repeat(232));
        assert_eq!(affinity_name(&node, &cidr), format!("{node}-10-0-0-64-26"));
        // 253: the node cut to 252 - 12 - 13 = 227 characters, then the CIDR and
        // sha256("<node>+10-0-0-64-26")[..11] (computed independently).
        let node = format!("rack-7-{}", "a".repeat(233));
        let name = affinity_name(&node, &cidr);
        assert_eq!(name, format!("{}-10-0-0-64-26-b6f42ad4149", &node[..227]));
        assert_eq!(name.len(), 252);
        assert_eq!(
            AffinityCodec.resource_name(&format!("{node}/10.0.0.64-26")),
            name
        );
    }

    #[test]
    fn hostname_hash_and_selector() {
        let expected = "53WSO6MBY4ZPU6KG6FI4VASUYQ3HFBO7TQGX7PRHXADNUR67KKUA";
        assert_eq!(hostname_hash("worker-2"), expected);
        assert_eq!(expected.len(), 52);
        // Listed by name, so that unlabelled rows (Calico before 3.31) are found too.
        assert_eq!(
            AffinityCodec.selector(&BlockAffinity::prefix_of("worker-2")),
            None
        );
        assert_eq!(BlockCodec.selector("10."), None);
    }

    #[test]
    fn handles_round_trip_under_lower_case_names() {
        let mut h = Handle {
            id: "K8s-Pod-Network.0A1B2C".into(),
            blocks: BTreeMap::new(),
        };
        h.add(&"10.244.7.64/26".parse().unwrap(), 2);
        h.add(&"fd00:10:244::/122".parse().unwrap(), 1);
        let obj = HandleCodec.encode(&h.id, &resource::encode(&h)).unwrap();
        assert_eq!(obj.name, "k8s-pod-network.0a1b2c");
        assert_eq!(HandleCodec.resource_name(&h.id), obj.name);
        assert_eq!(
            obj.spec,
            json!({"handleID": "K8s-Pod-Network.0A1B2C",
                   "block": {"10.244.7.64/26": 2, "fd00:10:244::/122": 1},
                   "deleted": false})
        );
        let (name, bytes) = HandleCodec.decode(&obj).unwrap().unwrap();
        assert_eq!(name, h.id);
        assert_eq!(resource::decode::<Handle>(&bytes).unwrap(), h);
        let bad = CrdObject {
            name: "h".into(),
            spec: json!({"handleID": "h", "block": {"10.0.0.0/26": -1}}),
            ..Default::default()
        };
        assert!(
            HandleCodec
                .decode(&bad)
                .unwrap_err()
                .reason
                .starts_with("spec.block[10.0.0.0/26]:")
        );
        let bad = CrdObject {
            name: "h".into(),
            spec: json!({"block": {}}),
            ..Default::default()
        };
        assert!(
            HandleCodec
                .decode(&bad)
                .unwrap_err()
                .reason
                .starts_with("spec.handleID:")
        );
    }

    #[test]
    fn the_three_codecs() {
        let kinds: Vec<_> = codecs()
            .iter()
            .map(|c| (c.kind().name, c.crd_kind(), c.plural()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("IPAMBlock", "IPAMBlock", "ipamblocks"),
                ("BlockAffinity", "BlockAffinity", "blockaffinities"),
                ("IPAMHandle", "IPAMHandle", "ipamhandles"),
            ]
        );
    }
}
