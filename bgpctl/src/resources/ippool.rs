//! IPPool ⇄ `IpPool`. The CIDR and block size are checked here too (bgpd checks them again),
//! so that a bad pool in a file stops the file before anything of it is applied.

use std::net::IpAddr;

use proto::v1 as pb;
use serde_json::{Value, json};

use super::fields::{FieldError, Result};
use super::{Document, Kind, document_value, parts, plain_metadata};

const MODES: &[&str] = &["Never", "Always", "CrossSubnet"];

pub struct PoolSpec {
    pub pool: pb::IpPool,
    /// Whether the document gave a block size (else bgpd's default for the family).
    pub block_size_given: bool,
}

pub fn from_document(doc: &Document) -> Result<PoolSpec> {
    let p = parts(doc, &[])?;
    plain_metadata(p.metadata, Kind::IpPool)?;
    let mut s = p.spec;
    validate_name(&doc.name)?;
    let cidr = s
        .str("cidr")?
        .ok_or_else(|| FieldError::new("spec.cidr", "required"))?;
    let (addr, prefix) = network("spec.cidr", &cidr)?;
    let (min, max, default) = if addr.is_ipv4() {
        (20, 32, 26)
    } else {
        (116, 128, 122)
    };
    let block_size = s.uint("blockSize", 128)?;
    let bs = block_size.unwrap_or(default) as u8;
    if !(min..=max).contains(&bs) {
        return Err(FieldError::new(
            "spec.blockSize",
            format!("/{bs} is out of range for this family: /{min} to /{max}"),
        ));
    }
    if bs < prefix {
        return Err(FieldError::new(
            "spec.blockSize",
            format!("blocks of /{bs} do not fit in {cidr}"),
        ));
    }
    let vxlan = mode(s.choice("vxlanMode", MODES)?);
    if let Some(m) = s.choice("ipipMode", MODES)?.filter(|m| *m != "Never") {
        return Err(FieldError::new(
            "spec.ipipMode",
            format!("{m}: not supported on this kernel (no ipip); use vxlanMode"),
        ));
    }
    let no_ipip = "deprecated and not supported on this kernel (no ipip); use ipipMode: Never";
    s.refuse("ipip", no_ipip, &[json!({"enabled": false})])?;
    s.refuse("nat-outgoing", "deprecated: use natOutgoing", &[])?;
    s.refuse(
        "awsSubnetID",
        "not supported (margay does not program AWS)",
        &[json!("")],
    )?;
    s.refuse("namespaceSelector", "not supported yet", &[json!("")])?;
    let mut allowed_uses = Vec::new();
    for (i, u) in s
        .list("allowedUses")?
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let path = format!("spec.allowedUses[{i}]");
        allowed_uses.push(match u.as_str() {
            Some("Workload") => pb::AllowedUse::Workload,
            Some("Tunnel") => pb::AllowedUse::Tunnel,
            Some("LoadBalancer") => {
                return Err(FieldError::new(
                    path,
                    "LoadBalancer: not supported (margay has no load-balancer IPAM)",
                ));
            }
            _ => {
                return Err(FieldError::new(
                    path,
                    format!("unknown value {u}: one of Workload, Tunnel"),
                ));
            }
        } as i32);
    }
    let manual = s.choice("assignmentMode", &["Automatic", "Manual"])? == Some("Manual");
    let pool = pb::IpPool {
        name: doc.name.clone(),
        cidr,
        block_size: u32::from(bs),
        vxlan_mode: vxlan as i32,
        ipip_mode: pb::EncapMode::Never as i32,
        nat_outgoing: s.bool("natOutgoing")?.unwrap_or(false),
        disabled: s.bool("disabled")?.unwrap_or(false),
        disable_bgp_export: s.bool("disableBGPExport")?.unwrap_or(false),
        node_selector: s.str("nodeSelector")?.unwrap_or_default(),
        allowed_uses,
        assignment_mode: if manual {
            pb::AssignmentMode::Manual
        } else {
            pb::AssignmentMode::Automatic
        } as i32,
        revision: p.revision,
    };
    s.finish()?;
    Ok(PoolSpec {
        pool,
        block_size_given: block_size.is_some(),
    })
}

/// What applying the document does to the stored pool, if there is one: an update keeps the
/// CIDR and block size (Calico does not let them change either).
pub fn update_of(spec: &PoolSpec, current: &pb::IpPool) -> Result<pb::IpPool> {
    if spec.pool.cidr != current.cidr {
        return Err(FieldError::new(
            "spec.cidr",
            format!(
                "the pool has {}; a pool's CIDR cannot change (delete it and create a new one)",
                current.cidr
            ),
        ));
    }
    if spec.block_size_given && spec.pool.block_size != current.block_size {
        return Err(FieldError::new(
            "spec.blockSize",
            format!(
                "the pool has /{}; a pool's block size cannot change",
                current.block_size
            ),
        ));
    }
    let mut p = spec.pool.clone();
    p.block_size = current.block_size;
    if p.revision == 0 {
        p.revision = current.revision;
    }
    Ok(p)
}

/// Refuses a pool whose CIDR overlaps another pool's (`others`: name and CIDR), as bgpd
/// would, so that the file stops before anything of it is applied.
pub fn check_overlap<'a>(
    pool: &pb::IpPool,
    others: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<()> {
    let (a, ap) = network("spec.cidr", &pool.cidr)?;
    for (name, cidr) in others {
        if name == pool.name {
            continue;
        }
        let Ok((b, bp)) = network("spec.cidr", cidr) else {
            continue;
        };
        let shorter = ap.min(bp);
        if a.is_ipv4() == b.is_ipv4() && masked(a, shorter) == masked(b, shorter) {
            return Err(FieldError::new(
                "spec.cidr",
                format!("{} overlaps the pool {name} ({cidr})", pool.cidr),
            ));
        }
    }
    Ok(())
}

/// The address with its bits past `prefix` cleared, as a number.
pub fn masked(a: IpAddr, prefix: u8) -> u128 {
    match a {
        IpAddr::V4(v) => {
            u128::from(u32::from(v)) & !(u128::from(u32::MAX) >> prefix) & u128::from(u32::MAX)
        }
        IpAddr::V6(v) => u128::from(v) & !u128::MAX.checked_shr(u32::from(prefix)).unwrap_or(0),
    }
}

fn mode(m: Option<&str>) -> pb::EncapMode {
    match m {
        Some("Always") => pb::EncapMode::Always,
        Some("CrossSubnet") => pb::EncapMode::CrossSubnet,
        _ => pb::EncapMode::Never,
    }
}

/// A network address with its prefix length; host bits must be zero.
pub fn network(path: &str, s: &str) -> Result<(IpAddr, u8)> {
    let bad = |why: String| FieldError::new(path, why);
    let (a, p) = s
        .split_once('/')
        .ok_or_else(|| bad(format!("{s:?} is not a CIDR (address/prefix length)")))?;
    let addr: IpAddr = a
        .parse()
        .map_err(|_| bad(format!("{a:?} is not an IP address")))?;
    let bits: u8 = if addr.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = p
        .parse()
        .ok()
        .filter(|p| *p <= bits)
        .ok_or_else(|| bad(format!("/{p} is not a prefix length (0-{bits})")))?;
    let host = match addr {
        IpAddr::V4(v) => u128::from(u32::from(v)) & (u128::from(u32::MAX) >> prefix),
        IpAddr::V6(v) => u128::from(v) & u128::MAX.checked_shr(u32::from(prefix)).unwrap_or(0),
    };
    if host != 0 {
        let net = match addr {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from(masked(addr, prefix) as u32)),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(masked(addr, prefix))),
        };
        return Err(bad(format!(
            "{s} is not a network address (host bits set): its network is {net}/{prefix}"
        )));
    }
    Ok((addr, prefix))
}

/// Names as Calico and bgpd accept them: lower-case letters, digits, '-' and '.'.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            "metadata.name",
            format!("{name:?} is not a valid name (lower-case letters, digits, '-' and '.')"),
        ))
    }
}

fn mode_name(m: i32) -> &'static str {
    crate::pool::mode_name(m)
}

pub fn to_document(p: &pb::IpPool) -> Value {
    let uses: Vec<&str> = if p.allowed_uses.is_empty() {
        vec!["Workload", "Tunnel"]
    } else {
        p.allowed_uses
            .iter()
            .map(|u| match pb::AllowedUse::try_from(*u) {
                Ok(pb::AllowedUse::Tunnel) => "Tunnel",
                _ => "Workload",
            })
            .collect()
    };
    let manual = p.assignment_mode == pb::AssignmentMode::Manual as i32;
    document_value(
        Kind::IpPool,
        &p.name,
        p.revision,
        json!({
            "cidr": p.cidr,
            "blockSize": p.block_size,
            "vxlanMode": mode_name(p.vxlan_mode),
            "ipipMode": mode_name(p.ipip_mode),
            "natOutgoing": p.nat_outgoing,
            "disabled": p.disabled,
            "disableBGPExport": p.disable_bgp_export,
            "nodeSelector": if p.node_selector.is_empty() { "all()" } else { p.node_selector.as_str() },
            "allowedUses": uses,
            "assignmentMode": if manual { "Manual" } else { "Automatic" },
        }),
    )
}
