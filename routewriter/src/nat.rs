//! natOutgoing with nftables: one table of routewriter's own (`table ip margay`), two interval
//! sets (`all-pools`: every pool; `masq-pools`: pools with natOutgoing) and one rule in a
//! postrouting NAT chain: a source in `masq-pools` going to a destination outside `all-pools`
//! is masqueraded, fully random (Calico's `cali-nat-outgoing`). A pool change rewrites set
//! elements, never the rule.
//!
//! The `nft` binary does the work: `nft -j list table` to read, `nft -f -` batches (each one
//! atomic) to write. Reading and planning are pure and tested without nft; nothing outside
//! routewriter's table is ever touched.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ipnet::Ipv4Net;
use serde_json::Value;

pub const ALL_SET: &str = "all-pools";
pub const MASQ_SET: &str = "masq-pools";
pub const CHAIN: &str = "nat-outgoing";
pub const RULE_COMMENT: &str = "margay nat-outgoing";

#[derive(Debug, thiserror::Error)]
pub enum NatError {
    #[error(
        "cannot run {nft}: {reason}; install nftables (Debian package `nftables`) or set routewriter.nat = false"
    )]
    NoNft { nft: String, reason: String },
    #[error("`nft {args}` failed: {stderr}")]
    Nft { args: String, stderr: String },
    #[error("cannot read nft's answer: {0}")]
    Parse(String),
}

/// An inclusive range of IPv4 addresses.
pub type Interval = (u32, u32);

/// What the table should hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NatDesired {
    pub all: Vec<Interval>,
    pub masq: Vec<Interval>,
}

/// The desired sets from the pools (CIDR → natOutgoing).
pub fn desired_from_pools(pools: &BTreeMap<Ipv4Net, bool>) -> NatDesired {
    let all = merge(pools.keys().map(interval_of).collect());
    let masq = merge(
        pools
            .iter()
            .filter(|(_, nat)| **nat)
            .map(|(n, _)| interval_of(n))
            .collect(),
    );
    NatDesired { all, masq }
}

fn interval_of(n: &Ipv4Net) -> Interval {
    (u32::from(n.network()), u32::from(n.broadcast()))
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

/// An interval as nft elements: aligned prefixes, written "a.b.c.d/len".
fn elements(iv: &[Interval]) -> Vec<String> {
    let mut out = Vec::new();
    for &(mut a, b) in iv {
        loop {
            // The largest aligned block starting at `a` that stays within `b`.
            let mut len = 32u8;
            while len > 0 {
                let size = 1u64 << (33 - len);
                let aligned = u64::from(a) % size == 0;
                if !aligned || u64::from(a) + size - 1 > u64::from(b) {
                    break;
                }
                len -= 1;
            }
            let size = 1u64 << (32 - len);
            out.push(format!("{}/{len}", Ipv4Addr::from(a)));
            let next = u64::from(a) + size;
            if next > u64::from(b) {
                break;
            }
            a = next as u32;
        }
    }
    out
}

/// What `nft -j list table` showed, reduced to what the plan compares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NatActual {
    pub exists: bool,
    /// Sets, chain and rule have the shape routewriter writes (elements aside).
    pub shape_ok: bool,
    pub rule_ok: bool,
    pub all: Vec<Interval>,
    pub masq: Vec<Interval>,
}

/// Reads `nft -j list table ip <table>` output.
pub fn parse_actual(json: &str) -> Result<NatActual, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let items = v
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no \"nftables\" array")?;
    let mut a = NatActual {
        exists: true,
        ..Default::default()
    };
    let mut sets_ok = 0;
    let mut chain_ok = false;
    let mut chains = 0;
    let mut rules = 0;
    let mut good_rules = 0;
    let mut sets = 0;
    for item in items {
        if let Some(set) = item.get("set") {
            sets += 1;
            let name = set.get("name").and_then(Value::as_str).unwrap_or("");
            let typed = set.get("type").and_then(Value::as_str) == Some("ipv4_addr");
            let interval = set
                .get("flags")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x.as_str() == Some("interval")));
            let elems = set
                .get("elem")
                .and_then(Value::as_array)
                .map(|e| e.iter().filter_map(element_interval).collect())
                .unwrap_or_default();
            match name {
                ALL_SET if typed && interval => {
                    sets_ok += 1;
                    a.all = merge(elems);
                }
                MASQ_SET if typed && interval => {
                    sets_ok += 1;
                    a.masq = merge(elems);
                }
                _ => {}
            }
        } else if let Some(chain) = item.get("chain") {
            chains += 1;
            chain_ok = chain.get("name").and_then(Value::as_str) == Some(CHAIN)
                && chain.get("type").and_then(Value::as_str) == Some("nat")
                && chain.get("hook").and_then(Value::as_str) == Some("postrouting")
                && chain.get("prio").and_then(Value::as_i64) == Some(100)
                && chain.get("policy").and_then(Value::as_str) == Some("accept");
        } else if let Some(rule) = item.get("rule") {
            rules += 1;
            if rule_is_ours(rule) {
                good_rules += 1;
            }
        }
    }
    a.shape_ok = sets == 2 && sets_ok == 2 && chains == 1 && chain_ok;
    a.rule_ok = rules == 1 && good_rules == 1;
    Ok(a)
}

fn element_interval(e: &Value) -> Option<Interval> {
    // Elements with options come wrapped: {"elem": {"val": ...}}.
    if let Some(inner) = e.get("elem").and_then(|x| x.get("val")) {
        return element_interval(inner);
    }
    if let Some(s) = e.as_str() {
        let a: Ipv4Addr = s.parse().ok()?;
        return Some((u32::from(a), u32::from(a)));
    }
    if let Some(p) = e.get("prefix") {
        let addr: Ipv4Addr = p.get("addr")?.as_str()?.parse().ok()?;
        let len = u8::try_from(p.get("len")?.as_u64()?).ok()?;
        let net = Ipv4Net::new(addr, len).ok()?;
        return Some(interval_of(&net.trunc()));
    }
    if let Some(r) = e.get("range").and_then(Value::as_array) {
        let a: Ipv4Addr = r.first()?.as_str()?.parse().ok()?;
        let b: Ipv4Addr = r.get(1)?.as_str()?.parse().ok()?;
        return Some((u32::from(a), u32::from(b)));
    }
    None
}

fn rule_is_ours(rule: &Value) -> bool {
    if rule.get("comment").and_then(Value::as_str) != Some(RULE_COMMENT) {
        return false;
    }
    let Some(expr) = rule.get("expr").and_then(Value::as_array) else {
        return false;
    };
    let matches = |e: &Value, op: &str, field: &str, set: &str| {
        let Some(m) = e.get("match") else {
            return false;
        };
        m.get("op").and_then(Value::as_str) == Some(op)
            && m.pointer("/left/payload/protocol").and_then(Value::as_str) == Some("ip")
            && m.pointer("/left/payload/field").and_then(Value::as_str) == Some(field)
            && m.get("right").and_then(Value::as_str) == Some(set)
    };
    let fully_random = |e: &Value| {
        let Some(flags) = e.get("masquerade").and_then(|m| m.get("flags")) else {
            return false;
        };
        flags.as_str() == Some("fully-random")
            || flags
                .as_array()
                .is_some_and(|f| f.len() == 1 && f[0].as_str() == Some("fully-random"))
    };
    expr.len() == 3
        && matches(&expr[0], "==", "saddr", &format!("@{MASQ_SET}"))
        && matches(&expr[1], "!=", "daddr", &format!("@{ALL_SET}"))
        && fully_random(&expr[2])
}

fn set_def(name: &str, iv: &[Interval]) -> String {
    let mut s = format!("  set {name} {{ type ipv4_addr; flags interval;");
    let e = elements(iv);
    if !e.is_empty() {
        s.push_str(&format!(" elements = {{ {} }};", e.join(", ")));
    }
    s.push_str(" }\n");
    s
}

fn rule_text() -> String {
    format!(
        "ip saddr @{MASQ_SET} ip daddr != @{ALL_SET} masquerade fully-random comment \"{RULE_COMMENT}\""
    )
}

/// The nft script that makes `actual` into `desired`; `None` when they already agree.
pub fn plan(table: &str, desired: &NatDesired, actual: Option<&NatActual>) -> Option<String> {
    let full = |delete_first: bool| {
        let mut s = String::new();
        if delete_first {
            s.push_str(&format!("delete table ip {table}\n"));
        }
        s.push_str(&format!("table ip {table} {{\n"));
        s.push_str(&set_def(ALL_SET, &desired.all));
        s.push_str(&set_def(MASQ_SET, &desired.masq));
        s.push_str(&format!(
            "  chain {CHAIN} {{ type nat hook postrouting priority srcnat; policy accept;\n    {}\n  }}\n}}\n",
            rule_text()
        ));
        s
    };
    let Some(a) = actual.filter(|a| a.exists) else {
        return Some(full(false));
    };
    if !a.shape_ok {
        return Some(full(true));
    }
    let mut s = String::new();
    for (name, want, have) in [
        (ALL_SET, &desired.all, &a.all),
        (MASQ_SET, &desired.masq, &a.masq),
    ] {
        if want != have {
            s.push_str(&format!("flush set ip {table} {name}\n"));
            let e = elements(want);
            if !e.is_empty() {
                s.push_str(&format!(
                    "add element ip {table} {name} {{ {} }}\n",
                    e.join(", ")
                ));
            }
        }
    }
    if !a.rule_ok {
        s.push_str(&format!("flush chain ip {table} {CHAIN}\n"));
        s.push_str(&format!("add rule ip {table} {CHAIN} {}\n", rule_text()));
    }
    (!s.is_empty()).then_some(s)
}

/// Runs nft for one table.
pub struct Nft {
    pub binary: PathBuf,
    pub table: String,
    /// nft transactions run (each a write).
    pub writes: u64,
}

impl Nft {
    pub fn new(binary: &Path, table: &str) -> Self {
        Nft {
            binary: binary.to_owned(),
            table: table.to_owned(),
            writes: 0,
        }
    }

    fn no_nft(&self, e: std::io::Error) -> NatError {
        NatError::NoNft {
            nft: self.binary.display().to_string(),
            reason: e.to_string(),
        }
    }

    /// The table as it is; `None` when it does not exist.
    pub fn read(&self) -> Result<Option<NatActual>, NatError> {
        let out = Command::new(&self.binary)
            .args(["-j", "list", "table", "ip", &self.table])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| self.no_nft(e))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            if stderr.contains("No such file or directory") {
                return Ok(None);
            }
            return Err(NatError::Nft {
                args: format!("-j list table ip {}", self.table),
                stderr: stderr.trim().to_owned(),
            });
        }
        parse_actual(&String::from_utf8_lossy(&out.stdout))
            .map(Some)
            .map_err(NatError::Parse)
    }

    /// Runs one script as one atomic transaction.
    pub fn apply(&mut self, script: &str) -> Result<(), NatError> {
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
            Err(NatError::Nft {
                args: format!("-f - <<'EOF'\n{script}EOF"),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }

    /// Reads, plans and applies; true when something was written.
    pub fn sync(&mut self, desired: &NatDesired) -> Result<bool, NatError> {
        let actual = self.read()?;
        match plan(&self.table, desired, actual.as_ref()) {
            None => Ok(false),
            Some(script) => {
                self.apply(&script)?;
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn iv(a: &str, b: &str) -> Interval {
        (
            u32::from(a.parse::<Ipv4Addr>().unwrap()),
            u32::from(b.parse::<Ipv4Addr>().unwrap()),
        )
    }

    const LISTED: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
      {"table": {"family": "ip", "name": "margay", "handle": 1}},
      {"set": {"family": "ip", "name": "all-pools", "table": "margay", "type": "ipv4_addr", "handle": 2, "flags": ["interval"],
        "elem": [{"prefix": {"addr": "10.65.0.0", "len": 16}}, {"prefix": {"addr": "10.66.0.0", "len": 24}}]}},
      {"set": {"family": "ip", "name": "masq-pools", "table": "margay", "type": "ipv4_addr", "handle": 3, "flags": ["interval"],
        "elem": [{"prefix": {"addr": "10.65.0.0", "len": 16}}]}},
      {"chain": {"family": "ip", "table": "margay", "name": "nat-outgoing", "handle": 1, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
      {"rule": {"family": "ip", "table": "margay", "chain": "nat-outgoing", "handle": 4, "comment": "margay nat-outgoing",
        "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@masq-pools"}},
                 {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@all-pools"}},
                 {"masquerade": {"flags": "fully-random"}}]}}]}"#;

    fn pools() -> BTreeMap<Ipv4Net, bool> {
        [(net("10.65.0.0/16"), true), (net("10.66.0.0/24"), false)]
            .into_iter()
            .collect()
    }

    #[test]
    fn what_nft_lists_is_what_we_want_so_nothing_is_written() {
        let a = parse_actual(LISTED).unwrap();
        assert!(a.exists && a.shape_ok && a.rule_ok, "{a:?}");
        assert_eq!(
            plan("margay", &desired_from_pools(&pools()), Some(&a)),
            None
        );
    }

    #[test]
    fn a_pool_change_touches_set_elements_only() {
        let a = parse_actual(LISTED).unwrap();
        let mut p = pools();
        p.insert(net("10.66.0.0/24"), true);
        let s = plan("margay", &desired_from_pools(&p), Some(&a)).unwrap();
        assert_eq!(
            s,
            "flush set ip margay masq-pools\nadd element ip margay masq-pools { 10.65.0.0/16, 10.66.0.0/24 }\n"
        );
        let s = plan("margay", &desired_from_pools(&BTreeMap::new()), Some(&a)).unwrap();
        assert_eq!(
            s,
            "flush set ip margay all-pools\nflush set ip margay masq-pools\n"
        );
    }

    #[test]
    fn a_missing_or_misshapen_table_is_written_whole() {
        let d = desired_from_pools(&pools());
        let s = plan("margay", &d, None).unwrap();
        assert!(s.starts_with("table ip margay {"), "{s}");
        assert!(s.contains("masquerade fully-random"));
        assert!(s.contains("set all-pools { type ipv4_addr; flags interval; elements = { 10.65.0.0/16, 10.66.0.0/24 }; }"));
        let broken = LISTED.replace("\"postrouting\"", "\"prerouting\"");
        let a = parse_actual(&broken).unwrap();
        assert!(!a.shape_ok);
        assert!(
            plan("margay", &d, Some(&a))
                .unwrap()
                .starts_with("delete table ip margay\n")
        );
    }

    #[test]
    fn a_changed_or_extra_rule_is_replaced() {
        let d = desired_from_pools(&pools());
        for broken in [
            LISTED.replace("fully-random", "random"),
            LISTED.replace("\"!=\"", "\"==\""),
            LISTED.replace("\"margay nat-outgoing\"", "\"hand made\""),
            LISTED.replace(
                "}]}}]}",
                "}]}}, {\"rule\": {\"family\": \"ip\", \"expr\": []}}]}",
            ),
        ] {
            let a = parse_actual(&broken).unwrap();
            assert!(a.shape_ok && !a.rule_ok, "{broken}");
            let s = plan("margay", &d, Some(&a)).unwrap();
            assert!(
                s.starts_with("flush chain ip margay nat-outgoing\nadd rule"),
                "{s}"
            );
        }
    }

    #[test]
    fn intervals_compare_in_one_form() {
        assert_eq!(
            merge(vec![
                iv("10.1.1.0", "10.1.1.255"),
                iv("10.1.0.0", "10.1.0.255"),
                iv("10.1.0.5", "10.1.0.9")
            ]),
            vec![iv("10.1.0.0", "10.1.1.255")]
        );
        // nft may list adjacent prefixes apart, single addresses bare, or ranges.
        let json = r#"{"nftables": [{"set": {"name": "all-pools", "type": "ipv4_addr", "flags": ["interval"], "elem": [
            {"prefix": {"addr": "10.1.0.0", "len": 24}}, {"prefix": {"addr": "10.1.1.0", "len": 24}}, "10.2.0.5",
            {"range": ["10.3.0.0", "10.3.0.9"]}, {"elem": {"val": "10.4.0.1", "comment": "x"}}]}}]}"#;
        let a = parse_actual(json).unwrap();
        assert_eq!(
            a.all,
            vec![
                iv("10.1.0.0", "10.1.1.255"),
                iv("10.2.0.5", "10.2.0.5"),
                iv("10.3.0.0", "10.3.0.9"),
                iv("10.4.0.1", "10.4.0.1")
            ]
        );
        assert_eq!(
            elements(&[iv("10.3.0.0", "10.3.0.9")]),
            vec!["10.3.0.0/29", "10.3.0.8/31"]
        );
        assert_eq!(
            elements(&[iv("0.0.0.0", "255.255.255.255")]),
            vec!["0.0.0.0/0"]
        );
        assert_eq!(
            elements(&[iv("10.1.0.0", "10.1.1.255")]),
            vec!["10.1.0.0/23"]
        );
    }

    #[test]
    fn garbage_from_nft_is_an_error_not_a_panic() {
        assert!(parse_actual("").is_err());
        assert!(parse_actual("{}").is_err());
        assert!(
            parse_actual(r#"{"nftables": [{"set": 5}, {"rule": null}, {"chain": []}]}"#).is_ok()
        );
    }
}
