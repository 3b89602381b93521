//! The policy table as `nft -j list table inet margay-policy` shows it, reduced to what the plan
//! compares (sans-IO): each set's type and elements, each map's elements, each chain's rules by
//! their comments, and whether the base chain hooks where it should.

use std::collections::BTreeMap;

use net_types::IpFamily;
use serde_json::Value;

use super::render::BASE_CHAIN;
use crate::nft::{Interval, set_intervals};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Actual {
    /// Set name → its family (`None`: not an interval set of addresses) and elements.
    pub sets: BTreeMap<String, (Option<IpFamily>, Vec<Interval>)>,
    /// Map name → whether it maps interface names to verdicts, and its elements (interface →
    /// the chain it jumps to; another verdict reads as "").
    pub maps: BTreeMap<String, (bool, BTreeMap<String, String>)>,
    /// Chain name → its rules' comments, in order ("" for a rule without one).
    pub chains: BTreeMap<String, Vec<String>>,
    /// The base chain is a filter chain on the forward hook at priority 0, policy accept.
    pub base_ok: bool,
}

fn str_of<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

fn set_family(set: &Value) -> Option<IpFamily> {
    let interval = set
        .get("flags")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|x| x.as_str() == Some("interval")));
    match (str_of(set, "type"), interval) {
        (Some("ipv4_addr"), true) => Some(IpFamily::V4),
        (Some("ipv6_addr"), true) => Some(IpFamily::V6),
        _ => None,
    }
}

fn map_elements(map: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in map
        .get("elem")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(pair) = e.as_array() else { continue };
        let (Some(k), Some(v)) = (pair.first().and_then(Value::as_str), pair.get(1)) else {
            continue;
        };
        let target = v
            .pointer("/jump/target")
            .and_then(Value::as_str)
            .unwrap_or("");
        out.insert(k.to_owned(), target.to_owned());
    }
    out
}

/// Reads nft's JSON listing of the table.
pub fn parse(json: &str) -> Result<Actual, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let items = v
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no \"nftables\" array")?;
    let mut a = Actual::default();
    for item in items {
        if let Some(set) = item.get("set") {
            let name = str_of(set, "name").unwrap_or("").to_owned();
            let family = set_family(set);
            let elems = family.map(|f| set_intervals(set, f)).unwrap_or_default();
            a.sets.insert(name, (family, elems));
        } else if let Some(map) = item.get("map") {
            let typed =
                str_of(map, "type") == Some("ifname") && str_of(map, "map") == Some("verdict");
            a.maps.insert(
                str_of(map, "name").unwrap_or("").to_owned(),
                (typed, map_elements(map)),
            );
        } else if let Some(chain) = item.get("chain") {
            let name = str_of(chain, "name").unwrap_or("");
            if name == BASE_CHAIN {
                a.base_ok = str_of(chain, "type") == Some("filter")
                    && str_of(chain, "hook") == Some("forward")
                    && chain.get("prio").and_then(Value::as_i64) == Some(0)
                    && str_of(chain, "policy") == Some("accept");
            }
            a.chains.entry(name.to_owned()).or_default();
        } else if let Some(rule) = item.get("rule") {
            let chain = str_of(rule, "chain").unwrap_or("").to_owned();
            let comment = str_of(rule, "comment").unwrap_or("").to_owned();
            a.chains.entry(chain).or_default().push(comment);
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What nft 1.0.6 lists for a small policy table (trimmed of metainfo and handles).
    pub const LISTING: &str = r#"{"nftables": [
      {"table": {"family": "inet", "name": "margay-policy", "handle": 7}},
      {"map": {"family": "inet", "name": "from-endpoint", "table": "margay-policy", "type": "ifname", "handle": 1, "map": "verdict"}},
      {"map": {"family": "inet", "name": "to-endpoint", "table": "margay-policy", "type": "ifname", "handle": 2, "map": "verdict",
        "elem": [["cali1", {"jump": {"target": "ingress-cali1"}}]]}},
      {"set": {"family": "inet", "name": "p-a-v4", "table": "margay-policy", "type": "ipv4_addr", "handle": 3, "flags": ["interval"],
        "elem": [{"prefix": {"addr": "10.0.0.0", "len": 24}}, "10.1.0.1"]}},
      {"set": {"family": "inet", "name": "p-a-v6", "table": "margay-policy", "type": "ipv6_addr", "handle": 4, "flags": ["interval"]}},
      {"chain": {"family": "inet", "table": "margay-policy", "name": "forward", "handle": 5, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
      {"chain": {"family": "inet", "table": "margay-policy", "name": "ingress-cali1", "handle": 6}},
      {"rule": {"family": "inet", "table": "margay-policy", "chain": "forward", "handle": 8, "comment": "margay: established and related", "expr": []}},
      {"rule": {"family": "inet", "table": "margay-policy", "chain": "ingress-cali1", "handle": 9, "expr": []}}
    ]}"#;

    #[test]
    fn a_listing_reads_into_sets_maps_and_chains() {
        let a = parse(LISTING).unwrap();
        assert!(a.base_ok);
        assert_eq!(
            a.sets["p-a-v4"],
            (
                Some(IpFamily::V4),
                vec![(0x0a00_0000, 0x0a00_00ff), (0x0a01_0001, 0x0a01_0001)]
            )
        );
        assert_eq!(a.sets["p-a-v6"], (Some(IpFamily::V6), vec![]));
        assert_eq!(a.maps["to-endpoint"].1["cali1"], "ingress-cali1");
        assert!(a.maps["from-endpoint"].0 && a.maps["from-endpoint"].1.is_empty());
        assert_eq!(a.chains["forward"], vec!["margay: established and related"]);
        assert_eq!(a.chains["ingress-cali1"], vec![""]);
        assert!(parse("{}").is_err());
    }
}
