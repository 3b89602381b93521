//! natOutgoing with nftables: per family one table of routewriter's own (`table ip margay`,
//! `table ip6 margay`), each with two interval sets (`all-pools`: every pool of the family;
//! `masq-pools`: its pools with natOutgoing) and one rule in a postrouting NAT chain: a source
//! in `masq-pools` going to a destination outside `all-pools` is masqueraded, fully random
//! (Calico's `cali-nat-outgoing`). A pool change rewrites set elements, never the rule.
//!
//! Why this file is long: the reading, planning and running of both families' tables is one
//! mechanism, and its tests carry what nft lists for each family verbatim.
//!
//! One mechanism for both families: the same plan and the same reader, with the family's
//! names (`ip`/`ipv4_addr` or `ip6`/`ipv6_addr`) and address width as parameters. Two sibling
//! tables rather than one `inet` table, so that the IPv4 table nodes already have stays as it
//! is (a restart after an upgrade writes nothing), and so that a node without IPv6 never needs
//! IPv6 NAT: the `ip6` table exists only while an IPv6 pool is desired, and is deleted when the
//! last one goes. The `ip` table is there whenever NAT is on, as before.
//!
//! The `nft` binary does the work (`super::nft`): `nft -j list table` to read, `nft -f -`
//! batches (each one atomic) to write. Reading and planning are pure and tested without nft; nothing outside
//! routewriter's tables is ever touched.

use std::collections::BTreeMap;
use std::path::Path;

use ipnet::IpNet;
use net_types::IpFamily;
use serde_json::Value;

pub use super::nft::{Interval, NftError as NatError, merge};
use super::nft::{NftRunner, Tables, addr_type, elements, interval_of, set_intervals};

pub const ALL_SET: &str = "all-pools";
pub const MASQ_SET: &str = "masq-pools";
pub const CHAIN: &str = "nat-outgoing";
pub const RULE_COMMENT: &str = "margay nat-outgoing";

/// nft's names of a family: the table family (also the payload protocol of the rule's
/// matches) and the set element type.
pub fn nft_family(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

fn set_type(family: IpFamily) -> &'static str {
    addr_type(family)
}

/// What a family's table should hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NatDesired {
    pub all: Vec<Interval>,
    pub masq: Vec<Interval>,
}

/// The desired sets of one family from the pools of both (CIDR → natOutgoing).
pub fn desired_from_pools(pools: &BTreeMap<IpNet, bool>, family: IpFamily) -> NatDesired {
    let of_family = || {
        pools
            .iter()
            .filter(|(n, _)| IpFamily::of(n.addr()) == family)
    };
    let all = merge(of_family().map(|(n, _)| interval_of(n)).collect());
    let masq = merge(
        of_family()
            .filter(|(_, nat)| **nat)
            .map(|(n, _)| interval_of(n))
            .collect(),
    );
    NatDesired { all, masq }
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

/// Reads `nft -j list table <ip|ip6> <table>` output.
pub fn parse_actual(json: &str, family: IpFamily) -> Result<NatActual, String> {
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
            let typed = set.get("type").and_then(Value::as_str) == Some(set_type(family));
            let interval = set
                .get("flags")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x.as_str() == Some("interval")));
            let elems = set_intervals(set, family);
            match name {
                ALL_SET if typed && interval => {
                    sets_ok += 1;
                    a.all = elems;
                }
                MASQ_SET if typed && interval => {
                    sets_ok += 1;
                    a.masq = elems;
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
            if rule_is_ours(rule, family) {
                good_rules += 1;
            }
        }
    }
    a.shape_ok = sets == 2 && sets_ok == 2 && chains == 1 && chain_ok;
    a.rule_ok = rules == 1 && good_rules == 1;
    Ok(a)
}

fn rule_is_ours(rule: &Value, family: IpFamily) -> bool {
    if rule.get("comment").and_then(Value::as_str) != Some(RULE_COMMENT) {
        return false;
    }
    let Some(expr) = rule.get("expr").and_then(Value::as_array) else {
        return false;
    };
    let protocol = nft_family(family);
    let matches = |e: &Value, op: &str, field: &str, set: &str| {
        let Some(m) = e.get("match") else {
            return false;
        };
        m.get("op").and_then(Value::as_str) == Some(op)
            && m.pointer("/left/payload/protocol").and_then(Value::as_str) == Some(protocol)
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

fn set_def(name: &str, family: IpFamily, iv: &[Interval]) -> String {
    let mut s = format!("  set {name} {{ type {}; flags interval;", set_type(family));
    let e = elements(family, iv);
    if !e.is_empty() {
        s.push_str(&format!(" elements = {{ {} }};", e.join(", ")));
    }
    s.push_str(" }\n");
    s
}

fn rule_text(family: IpFamily) -> String {
    let p = nft_family(family);
    format!(
        "{p} saddr @{MASQ_SET} {p} daddr != @{ALL_SET} masquerade fully-random comment \"{RULE_COMMENT}\""
    )
}

/// The nft script that makes `actual` into `desired` for one family's table; `None` when they
/// already agree. `desired` `None`: the table should not exist.
pub fn plan(
    table: &str,
    family: IpFamily,
    desired: Option<&NatDesired>,
    actual: Option<&NatActual>,
) -> Option<String> {
    let fam = nft_family(family);
    let actual = actual.filter(|a| a.exists);
    let Some(desired) = desired else {
        return actual.map(|_| format!("delete table {fam} {table}\n"));
    };
    let full = |delete_first: bool| {
        let mut s = String::new();
        if delete_first {
            s.push_str(&format!("delete table {fam} {table}\n"));
        }
        s.push_str(&format!("table {fam} {table} {{\n"));
        s.push_str(&set_def(ALL_SET, family, &desired.all));
        s.push_str(&set_def(MASQ_SET, family, &desired.masq));
        s.push_str(&format!(
            "  chain {CHAIN} {{ type nat hook postrouting priority srcnat; policy accept;\n    {}\n  }}\n}}\n",
            rule_text(family)
        ));
        s
    };
    let Some(a) = actual else {
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
            s.push_str(&format!("flush set {fam} {table} {name}\n"));
            let e = elements(family, want);
            if !e.is_empty() {
                s.push_str(&format!(
                    "add element {fam} {table} {name} {{ {} }}\n",
                    e.join(", ")
                ));
            }
        }
    }
    if !a.rule_ok {
        s.push_str(&format!("flush chain {fam} {table} {CHAIN}\n"));
        s.push_str(&format!(
            "add rule {fam} {table} {CHAIN} {}\n",
            rule_text(family)
        ));
    }
    (!s.is_empty()).then_some(s)
}

/// Runs nft for natOutgoing's tables of one name.
pub struct Nft {
    pub runner: NftRunner,
    pub table: String,
}

impl Nft {
    pub fn new(binary: &Path, table: &str) -> Self {
        Nft {
            runner: NftRunner::new(binary),
            table: table.to_owned(),
        }
    }

    /// nft transactions run (each a write).
    pub fn writes(&self) -> u64 {
        self.runner.writes
    }

    /// A family's table as it is; `None` when it does not exist.
    pub fn read(&self, family: IpFamily) -> Result<Option<NatActual>, NatError> {
        match self.runner.list_table(nft_family(family), &self.table)? {
            None => Ok(None),
            Some(json) => parse_actual(&json, family)
                .map(Some)
                .map_err(NatError::Parse),
        }
    }

    /// Reads, plans and applies one family's table; true when something was written.
    /// `known`: the namespace's tables, when the caller listed them (one absent is not read).
    pub fn sync(
        &mut self,
        family: IpFamily,
        desired: Option<&NatDesired>,
        known: Option<&Tables>,
    ) -> Result<bool, NatError> {
        let absent = known.is_some_and(|t| !t.contains(nft_family(family), &self.table));
        let actual = if absent { None } else { self.read(family)? };
        match plan(&self.table, family, desired, actual.as_ref()) {
            None => Ok(false),
            Some(script) => {
                self.runner.apply(&script)?;
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::bits_of;
    use IpFamily::{V4, V6};
    use std::net::IpAddr;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn iv(a: &str, b: &str) -> Interval {
        (
            bits_of(a.parse::<IpAddr>().unwrap()),
            bits_of(b.parse::<IpAddr>().unwrap()),
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

    /// What nft 1.0.6 lists for the IPv6 table routewriter writes.
    const LISTED6: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
      {"table": {"family": "ip6", "name": "margay", "handle": 5}},
      {"set": {"family": "ip6", "name": "all-pools", "table": "margay", "type": "ipv6_addr", "handle": 1, "flags": ["interval"],
        "elem": [{"prefix": {"addr": "fd00:20::", "len": 48}}, {"prefix": {"addr": "fd00:30::", "len": 64}}]}},
      {"set": {"family": "ip6", "name": "masq-pools", "table": "margay", "type": "ipv6_addr", "handle": 2, "flags": ["interval"],
        "elem": [{"prefix": {"addr": "fd00:20::", "len": 48}}]}},
      {"chain": {"family": "ip6", "table": "margay", "name": "nat-outgoing", "handle": 3, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
      {"rule": {"family": "ip6", "table": "margay", "chain": "nat-outgoing", "handle": 4, "comment": "margay nat-outgoing",
        "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "saddr"}}, "right": "@masq-pools"}},
                 {"match": {"op": "!=", "left": {"payload": {"protocol": "ip6", "field": "daddr"}}, "right": "@all-pools"}},
                 {"masquerade": {"flags": "fully-random"}}]}}]}"#;

    /// Pools of both families: each table sees its own.
    fn pools() -> BTreeMap<IpNet, bool> {
        [
            (net("10.65.0.0/16"), true),
            (net("10.66.0.0/24"), false),
            (net("fd00:20::/48"), true),
            (net("fd00:30::/64"), false),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn what_nft_lists_is_what_we_want_so_nothing_is_written() {
        for (family, listed) in [(V4, LISTED), (V6, LISTED6)] {
            let a = parse_actual(listed, family).unwrap();
            assert!(a.exists && a.shape_ok && a.rule_ok, "{family:?}: {a:?}");
            let d = desired_from_pools(&pools(), family);
            assert_eq!(
                plan("margay", family, Some(&d), Some(&a)),
                None,
                "{family:?}"
            );
        }
    }

    #[test]
    fn each_family_takes_only_its_pools() {
        let d4 = desired_from_pools(&pools(), V4);
        let d6 = desired_from_pools(&pools(), V6);
        // Adjacent pools join into one interval.
        assert_eq!(d4.all, vec![iv("10.65.0.0", "10.66.0.255")]);
        assert_eq!(
            d6.masq,
            vec![iv("fd00:20::", "fd00:20:0:ffff:ffff:ffff:ffff:ffff")]
        );
        assert_eq!(d6.all.len(), 2);
        // A listing of the other family's table is not the shape this family writes.
        let a = parse_actual(LISTED, V6).unwrap();
        assert!(!a.shape_ok && !a.rule_ok, "{a:?}");
    }

    #[test]
    fn a_pool_change_touches_set_elements_only() {
        let a = parse_actual(LISTED, V4).unwrap();
        let mut p = pools();
        p.insert(net("10.66.0.0/24"), true);
        let s = plan("margay", V4, Some(&desired_from_pools(&p, V4)), Some(&a)).unwrap();
        assert_eq!(
            s,
            "flush set ip margay masq-pools\nadd element ip margay masq-pools { 10.65.0.0/16, 10.66.0.0/24 }\n"
        );
        let none = desired_from_pools(&BTreeMap::new(), V4);
        let s = plan("margay", V4, Some(&none), Some(&a)).unwrap();
        assert_eq!(
            s,
            "flush set ip margay all-pools\nflush set ip margay masq-pools\n"
        );
        let a = parse_actual(LISTED6, V6).unwrap();
        p.insert(net("fd00:30::/64"), true);
        let s = plan("margay", V6, Some(&desired_from_pools(&p, V6)), Some(&a)).unwrap();
        assert_eq!(
            s,
            "flush set ip6 margay masq-pools\nadd element ip6 margay masq-pools { fd00:20::/48, fd00:30::/64 }\n"
        );
    }

    #[test]
    fn a_missing_or_misshapen_table_is_written_whole() {
        let d = desired_from_pools(&pools(), V4);
        let s = plan("margay", V4, Some(&d), None).unwrap();
        assert!(s.starts_with("table ip margay {"), "{s}");
        assert!(s.contains("masquerade fully-random"));
        assert!(s.contains("set all-pools { type ipv4_addr; flags interval; elements = { 10.65.0.0/16, 10.66.0.0/24 }; }"));
        let broken = LISTED.replace("\"postrouting\"", "\"prerouting\"");
        let a = parse_actual(&broken, V4).unwrap();
        assert!(!a.shape_ok);
        assert!(
            plan("margay", V4, Some(&d), Some(&a))
                .unwrap()
                .starts_with("delete table ip margay\n")
        );
        let d6 = desired_from_pools(&pools(), V6);
        let s = plan("margay", V6, Some(&d6), None).unwrap();
        assert!(s.starts_with("table ip6 margay {"), "{s}");
        assert!(
            s.contains(
                "set masq-pools { type ipv6_addr; flags interval; elements = { fd00:20::/48 }; }"
            ),
            "{s}"
        );
        assert!(
            s.contains("ip6 saddr @masq-pools ip6 daddr != @all-pools masquerade fully-random"),
            "{s}"
        );
    }

    #[test]
    fn a_table_not_wanted_is_deleted_and_an_absent_one_left_absent() {
        let a = parse_actual(LISTED6, V6).unwrap();
        assert_eq!(
            plan("margay", V6, None, Some(&a)).as_deref(),
            Some("delete table ip6 margay\n")
        );
        assert_eq!(plan("margay", V6, None, None), None);
        let gone = NatActual::default();
        assert_eq!(plan("margay", V6, None, Some(&gone)), None);
    }

    #[test]
    fn a_changed_or_extra_rule_is_replaced() {
        for (family, listed) in [(V4, LISTED), (V6, LISTED6)] {
            let d = desired_from_pools(&pools(), family);
            let fam = nft_family(family);
            for broken in [
                listed.replace("fully-random", "random"),
                listed.replace("\"!=\"", "\"==\""),
                listed.replace("\"margay nat-outgoing\"", "\"hand made\""),
                listed.replace(
                    "}]}}]}",
                    "}]}}, {\"rule\": {\"family\": \"ip\", \"expr\": []}}]}",
                ),
            ] {
                let a = parse_actual(&broken, family).unwrap();
                assert!(a.shape_ok && !a.rule_ok, "{broken}");
                let s = plan("margay", family, Some(&d), Some(&a)).unwrap();
                assert!(
                    s.starts_with(&format!("flush chain {fam} margay nat-outgoing\nadd rule")),
                    "{s}"
                );
            }
        }
        // An IPv4 match in the IPv6 table is not ours.
        let a = parse_actual(
            &LISTED6.replace("\"ip6\", \"field\"", "\"ip\", \"field\""),
            V6,
        )
        .unwrap();
        assert!(!a.rule_ok);
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
        let a = parse_actual(json, V4).unwrap();
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
            elements(V4, &[iv("10.3.0.0", "10.3.0.9")]),
            vec!["10.3.0.0/29", "10.3.0.8/31"]
        );
        assert_eq!(
            elements(V4, &[iv("0.0.0.0", "255.255.255.255")]),
            vec!["0.0.0.0/0"]
        );
        assert_eq!(
            elements(V4, &[iv("10.1.0.0", "10.1.1.255")]),
            vec!["10.1.0.0/23"]
        );
        // The same for 128 bits, up to the whole space.
        assert_eq!(
            elements(V6, &[iv("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")]),
            vec!["::/0"]
        );
        assert_eq!(
            elements(
                V6,
                &[iv("fd00:20::", "fd00:21:ffff:ffff:ffff:ffff:ffff:ffff")]
            ),
            vec!["fd00:20::/31"]
        );
        assert_eq!(
            elements(V6, &[iv("fd00::", "fd00::2")]),
            vec!["fd00::/127", "fd00::2/128"]
        );
        let json = r#"{"nftables": [{"set": {"name": "all-pools", "type": "ipv6_addr", "flags": ["interval"], "elem": [
            {"prefix": {"addr": "fd00:20::", "len": 48}}, "fd00:40::1", {"range": ["fd00:50::", "fd00:50::9"]},
            {"prefix": {"addr": "10.0.0.0", "len": 8}}]}}]}"#;
        let a = parse_actual(json, V6).unwrap();
        assert_eq!(
            a.all,
            vec![
                iv("fd00:20::", "fd00:20:0:ffff:ffff:ffff:ffff:ffff"),
                iv("fd00:40::1", "fd00:40::1"),
                iv("fd00:50::", "fd00:50::9"),
            ],
            "an IPv4 element is not of this table"
        );
    }

    #[test]
    fn garbage_from_nft_is_an_error_not_a_panic() {
        for family in IpFamily::ALL {
            assert!(parse_actual("", family).is_err());
            assert!(parse_actual("{}", family).is_err());
            assert!(
                parse_actual(
                    r#"{"nftables": [{"set": 5}, {"rule": null}, {"chain": []}]}"#,
                    family
                )
                .is_ok()
            );
        }
    }
}
