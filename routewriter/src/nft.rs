//! The `nft` binary as routewriter's tables use it (natOutgoing in `nat`, network policy in
//! `policy`): `nft -j list tables` to learn which exist, `nft -j list table` to read one,
//! `nft -f -` to run a script as one atomic transaction (all of it or none: a refused script
//! leaves the previous ruleset in force), and the interval-set elements both write and read
//! back. Every run of a script is counted.
//!
//! The binary rather than netlink: nft's own parser and its JSON listing are the stable
//! interface of nftables; the expressions' netlink encoding is not meant to be written by hand.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ipnet::IpNet;
use net_types::IpFamily;
use serde_json::Value;

use super::routes::{bits_of, host_mask};

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(
        "cannot run {nft}: {reason}; install nftables (Debian package `nftables`) or turn off what needs it (routewriter.nat, routewriter.policy)"
    )]
    NoNft { nft: String, reason: String },
    #[error("`nft {args}` failed: {stderr}")]
    Nft { args: String, stderr: String },
    #[error("cannot read nft's answer: {0}")]
    Parse(String),
}

/// Runs nft; counts the scripts it runs.
#[derive(Debug)]
pub struct NftRunner {
    pub binary: PathBuf,
    /// nft transactions run (each a write).
    pub writes: u64,
}

impl NftRunner {
    pub fn new(binary: &Path) -> Self {
        NftRunner {
            binary: binary.to_owned(),
            writes: 0,
        }
    }

    fn no_nft(&self, e: std::io::Error) -> NftError {
        NftError::NoNft {
            nft: self.binary.display().to_string(),
            reason: e.to_string(),
        }
    }

    /// `nft -j list ARGS`: its output, or what nft said when it refused.
    fn list(&self, args: &[&str]) -> Result<Result<String, String>, NftError> {
        let out = Command::new(&self.binary)
            .args(["-j", "list"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| self.no_nft(e))?;
        Ok(if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        })
    }

    /// `nft -j list tables`: every table of the namespace, by family and name. A full sync
    /// asks this once and lists only the tables that exist: a node without them (a fresh
    /// one) runs nft once to learn it, not once per table routewriter owns.
    pub fn tables(&self) -> Result<Tables, NftError> {
        match self.list(&["tables"])? {
            Ok(json) => Tables::parse(&json).map_err(NftError::Parse),
            Err(stderr) => Err(NftError::Nft {
                args: "-j list tables".into(),
                stderr,
            }),
        }
    }

    /// `nft -j list table FAMILY TABLE`; `None` when the table does not exist.
    pub fn list_table(&self, family: &str, table: &str) -> Result<Option<String>, NftError> {
        match self.list(&["table", family, table])? {
            Ok(json) => Ok(Some(json)),
            Err(stderr) if stderr.contains("No such file or directory") => Ok(None),
            Err(stderr) => Err(NftError::Nft {
                args: format!("-j list table {family} {table}"),
                stderr,
            }),
        }
    }

    /// Runs one script as one atomic transaction.
    pub fn apply(&mut self, script: &str) -> Result<(), NftError> {
        self.writes += 1;
        let mut child = Command::new(&self.binary)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.no_nft(e))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(script.as_bytes())
                .map_err(|e| self.no_nft(e))?;
        }
        let out = child.wait_with_output().map_err(|e| self.no_nft(e))?;
        if out.status.success() {
            Ok(())
        } else {
            // The script can be long (a policy table): the error names its first lines.
            let head: String = script.lines().take(40).collect::<Vec<_>>().join("\n");
            Err(NftError::Nft {
                args: format!("-f - <<'EOF'\n{head}\nEOF"),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }
}

/// The tables of a namespace, as `nft -j list tables` showed them at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tables(std::collections::BTreeSet<(String, String)>);

impl Tables {
    pub fn parse(json: &str) -> Result<Tables, String> {
        let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let items = v["nftables"]
            .as_array()
            .ok_or("no \"nftables\" list in nft's answer")?;
        let mut out = std::collections::BTreeSet::new();
        for t in items.iter().filter_map(|i| i.get("table")) {
            match (t["family"].as_str(), t["name"].as_str()) {
                (Some(f), Some(n)) => out.insert((f.to_owned(), n.to_owned())),
                _ => return Err(format!("a table without family or name: {t}")),
            };
        }
        Ok(Tables(out))
    }

    pub fn contains(&self, family: &str, name: &str) -> bool {
        self.0.contains(&(family.to_owned(), name.to_owned()))
    }
}

/// nft's set element type of a family's addresses.
pub fn addr_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    }
}

/// An inclusive range of addresses of one family, as integers (IPv4 in the low 32 bits).
pub type Interval = (u128, u128);

fn from_bits(family: IpFamily, bits: u128) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

pub fn interval_of(n: &IpNet) -> Interval {
    (bits_of(n.network()), bits_of(n.broadcast()))
}

/// Sorted, overlapping and adjacent intervals joined: one form for both sides of a compare.
pub fn merge(mut v: Vec<Interval>) -> Vec<Interval> {
    v.sort_unstable();
    let mut out: Vec<Interval> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Intervals as nft elements: aligned prefixes, written "address/len".
pub fn elements(family: IpFamily, iv: &[Interval]) -> Vec<String> {
    let width = family.bits();
    let mut out = Vec::new();
    for &(mut a, b) in iv {
        loop {
            // The largest aligned block starting at `a` that stays within `b`.
            let mut len = width;
            while len > 0 {
                let mask = host_mask(width, len - 1);
                if a & mask != 0 || a | mask > b {
                    break;
                }
                len -= 1;
            }
            let last = a | host_mask(width, len);
            out.push(format!("{}/{len}", from_bits(family, a)));
            match last.checked_add(1) {
                Some(next) if next <= b => a = next,
                _ => break,
            }
        }
    }
    out
}

/// One element of an interval set as `nft -j` lists it (an address, a prefix or a range).
pub fn element_interval(e: &Value, family: IpFamily) -> Option<Interval> {
    // Elements with options come wrapped: {"elem": {"val": ...}}.
    if let Some(inner) = e.get("elem").and_then(|x| x.get("val")) {
        return element_interval(inner, family);
    }
    let addr = |v: &Value| -> Option<IpAddr> {
        let a: IpAddr = v.as_str()?.parse().ok()?;
        (IpFamily::of(a) == family).then_some(a)
    };
    if e.is_string() {
        let a = bits_of(addr(e)?);
        return Some((a, a));
    }
    if let Some(p) = e.get("prefix") {
        let a = addr(p.get("addr")?)?;
        let len = u8::try_from(p.get("len")?.as_u64()?).ok()?;
        let net = IpNet::new(a, len).ok()?;
        return Some(interval_of(&net.trunc()));
    }
    if let Some(r) = e.get("range").and_then(Value::as_array) {
        return Some((bits_of(addr(r.first()?)?), bits_of(addr(r.get(1)?)?)));
    }
    None
}

/// The intervals of a set as `nft -j` lists it.
pub fn set_intervals(set: &Value, family: IpFamily) -> Vec<Interval> {
    merge(
        set.get("elem")
            .and_then(Value::as_array)
            .map(|e| {
                e.iter()
                    .filter_map(|e| element_interval(e, family))
                    .collect()
            })
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What nft 1.0.6 answers to `nft -j list tables`.
    #[test]
    fn tables_are_read_by_family_and_name() {
        let none = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}]}"#;
        assert_eq!(Tables::parse(none).unwrap(), Tables::default());
        let some = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
          {"table": {"family": "ip", "name": "margay", "handle": 1}},
          {"table": {"family": "inet", "name": "margay-policy", "handle": 2}}]}"#;
        let t = Tables::parse(some).unwrap();
        assert!(t.contains("ip", "margay"));
        assert!(t.contains("inet", "margay-policy"));
        assert!(
            !t.contains("ip6", "margay"),
            "another family's table is another table"
        );
        assert!(Tables::parse("{}").is_err());
        assert!(Tables::parse(r#"{"nftables": [{"table": {"name": "x"}}]}"#).is_err());
    }
}
